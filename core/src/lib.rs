//! ferrolock: distributed locks over Redis.
//!
//! One algorithm, a quorum over N >= 1 independent nodes: N = 1 is the single-instance lock,
//! N > 1 is Redlock. See the README for the guarantees and their assumptions.
//!
//! ```no_run
//! # async fn demo() -> ferrolock::Result<()> {
//! use ferrolock::{LockManager, ManagerOptions};
//! let manager = LockManager::new(ManagerOptions::new().nodes(["redis://127.0.0.1:6379"]))?;
//! let lock = manager.acquire("orders:1001").await?;
//! // ... critical section, valid for lock.validity() ...
//! lock.release().await?;
//! # Ok(()) }
//! ```
//!
//! A reentrant lock (Redisson's RLock layout) is re-entered by the same owner, an id of the
//! caller's choosing (a thread, a task, a request):
//!
//! ```no_run
//! # async fn demo(manager: ferrolock::LockManager) -> ferrolock::Result<()> {
//! use ferrolock::LockOptions;
//! let opts = LockOptions::default().reentrant(true);
//! let outer = manager.acquire_owned("orders:1001", 7, &opts).await?;
//! let inner = manager.acquire_owned("orders:1001", 7, &opts).await?; // hold count 2
//! inner.release().await?;
//! outer.release().await?; // count 0: deleted, waiters woken
//! # Ok(()) }
//! ```
//!
//! Waiters are woken by the release's publish, at the holder's remaining TTL, or after
//! `retry_delay` at the latest, and queue on the server so a releasing process cannot barge
//! back in ahead of them (DESIGN.md, "Waiters" and "Waiter queue").

mod acquire;
mod cluster;
mod cluster_guard;
mod error;
mod hooks;
pub mod host;
mod lock;
mod manager;
pub mod metrics;
mod node;
mod node_cluster;
mod options;
mod owner;
mod per_process;
mod queue;
mod quorum;
mod refusal;
mod restart_guard;
pub mod runtime;
mod rwlock;
mod scripts;
mod semaphore;
mod server_ids;
mod shared;
mod throttle;
mod token;
mod watchdog;

pub use acquire::check_request;
pub use error::{Error, ErrorKind, Result, quoted_key};
#[doc(hidden)]
pub use hooks::{__set_test_hook, Point as HookPoint};
pub use lock::{Lock, LockStatus, LossReason, READ_LEASE_CAP};
pub use manager::LockManager;
pub use node::{redact_url, server_address};

/// The seeds of a `redis+cluster://` (`rediss+cluster://`) URL as plain `redis://`
/// (`rediss://`) URLs with the same credentials, the URL's own host first; `None` for a URL of
/// another form. For tools that talk to each primary themselves (`ferrolock scan`).
pub fn cluster_seeds(url: &str) -> Result<Option<Vec<String>>> {
    Ok(node_cluster::ClusterUrl::parse(url, &redact_url(url))?.map(|c| c.seeds))
}

/// The Redis Cluster hash slot of `key` (CRC16 of its hash tag, or of the whole key, mod
/// 16384), as the server and the routed connection compute it: for tools that find a key's
/// primary themselves (`ferrolock inspect`).
pub fn cluster_key_slot(key: &str) -> u16 {
    node_cluster::key_slot(key)
}
pub use options::{
    DEFAULT_NODE, LockOptions, MAX_DURATION, ManagerOptions, NODES_ENV, OPTIONS, OptionSpec,
    Scope as OptionScope, TLS_CA_ENV, Type as OptionType, Value as OptionValue, parse_duration,
    spec as option_spec, split_nodes,
};
pub use scripts::{
    fence_key, latch_key, queue_key, queue_lease_key, queue_since_key, redisson_channel,
    release_channel, rwlock_timeout_prefix, semaphore_timeout_key, waiter_channel,
};
pub use token::token_time;

/// What the core sends on the wire, for the benchmark's hand-written mirror of it
/// (`bench/src/uncontended.rs`): the same argument structs the core builds its requests with.
#[doc(hidden)]
pub mod __wire {
    pub use crate::queue::{barge_bound_ms, quiet_grace_ms};
    pub use crate::scripts::{
        Acquire, KeyNames, Latch, Place, Release, Undo, hold_key, latch_key, redisson_channel,
        waiter_channel_prefix,
    };
    /// The read-write lock's scripts and names, for their tests.
    pub mod rw {
        pub use crate::scripts::{
            ACQUIRE_READ_SRC, ACQUIRE_WRITE_SRC, AcquireRead, AcquireWrite, EXTEND_READ_SRC,
            EXTEND_WRITE_SRC, Extend, Latch, RELEASE_READ_SRC, RELEASE_WRITE_SRC, ReleaseRead,
            ReleaseWrite, Renewal, rwlock_channel, rwlock_prefix, rwlock_timeout_prefix,
            writer_field,
        };
    }
}
