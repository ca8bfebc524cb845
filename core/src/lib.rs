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

mod error;
mod lock;
mod manager;
mod node;
mod options;
mod quorum;
pub mod runtime;
mod scripts;
mod watchdog;

pub use error::{Error, ErrorKind, Result};
pub use lock::{Lock, LockStatus, LossReason};
pub use manager::LockManager;
pub use node::redact_url;
pub use options::{
    DEFAULT_NODE, LockOptions, MAX_DURATION, ManagerOptions, NODES_ENV, TLS_CA_ENV, parse_duration,
    split_nodes,
};
pub use scripts::{fence_key, release_channel};
