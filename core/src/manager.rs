//! `LockManager`: the public entry point, on a fixed set of nodes. One node is the
//! single-instance lock; N nodes are Redlock. It is one algorithm.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::lock::Lock;
use crate::node::Node;
use crate::options::{LockOptions, ManagerOptions, RwSide};
use crate::queue::Hook;
use crate::restart_guard::GuardWindow;
use crate::server_ids::ServerIds;
use crate::shared::Shared;

/// Hands out locks on a fixed set of nodes. Cheap to clone; clones share connections.
#[derive(Clone)]
pub struct LockManager {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for LockManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockManager")
            .field("nodes", &self.node_names())
            .field("quorum", &self.shared.cluster.quorum)
            .finish()
    }
}

impl LockManager {
    /// Validates the options and URLs; opens no connection (those open on first use, so a
    /// node that is down now does not stop the manager from being built).
    pub fn new(options: ManagerOptions) -> Result<LockManager> {
        options.lock.validate()?;
        if options.nodes.as_ref().is_some_and(Vec::is_empty) {
            return Err(Error::invalid(format!(
                "nodes=[]: {}",
                crate::options::NO_NODE_GIVEN
            )));
        }
        if let Some(g) = options
            .restart_guard
            .filter(|g| *g > crate::options::MAX_DURATION)
        {
            return Err(Error::invalid(format!(
                "restart_guard {g:?} is too long: the maximum is {}ms (about 24.8 days)",
                crate::options::MAX_DURATION.as_millis()
            )));
        }
        // 0 is off; a window under a millisecond is off in all but name (Go refused it as
        // below the library's unit, Python and the CLI took it).
        if let Some(g) = options
            .restart_guard
            .filter(|g| !g.is_zero() && *g < Duration::from_millis(1))
        {
            return Err(Error::invalid(format!(
                "restart_guard {g:?} is too short: the minimum is 1ms (0 turns it off)"
            )));
        }
        let (urls, from) = options.nodes_in_force()?;
        let root_cert = read_root_cert(&options, &urls)?;
        let home = crate::runtime::Home::here();
        let (nodes, guard) =
            open_nodes(&options, &urls, root_cert.as_deref(), &home).map_err(|e| match from {
                // The caller wrote no URL: say where the bad one came from.
                Some(var) => Error::new(e.kind(), format!("{var}: {}", e.message())),
                None => e,
            })?;
        Ok(LockManager {
            shared: Arc::new(Shared::new(Cluster::new(nodes, guard, home), options.lock)),
        })
    }

    /// A manager on `FERROLOCK_NODES` (or the default node) with default options.
    pub fn from_env() -> Result<LockManager> {
        Self::new(ManagerOptions::default())
    }

    /// The nodes, with passwords redacted.
    pub fn node_names(&self) -> Vec<String> {
        self.shared
            .cluster
            .nodes
            .iter()
            .map(|n| n.name().to_string())
            .collect()
    }

    pub fn quorum(&self) -> usize {
        self.shared.cluster.quorum
    }

    /// Requests sent to each node so far (a pipeline counts once): round trips, counted in
    /// the client.
    pub fn round_trips(&self) -> Vec<u64> {
        self.shared
            .cluster
            .nodes
            .iter()
            .map(Node::round_trips)
            .collect()
    }

    /// The default options of locks from this manager.
    pub fn defaults(&self) -> &LockOptions {
        &self.shared.defaults
    }

    /// Acquires `key` with the manager's default options.
    pub async fn acquire(&self, key: &str) -> Result<Lock> {
        self.acquire_with(key, &self.shared.defaults.clone()).await
    }

    /// Tells now the first waiter of every key this manager released quietly and did not take
    /// back (a worker in a loop on a key, one node: see DESIGN.md, "Quiet streaks"). Call it
    /// when such a loop ends, and before dropping a manager or exiting right after one: the
    /// Python binding's `close()`, `release_all()` and exit hook do. Without it that waiter
    /// takes over at its own re-check, when its barging bound ends (`BARGE_BOUND_ONE_NODE`
    /// at most).
    pub async fn flush_quiet_releases(&self) {
        self.shared
            .cluster
            .on_any_executor(crate::queue::flush(
                &self.shared.waiters,
                &self.shared.contention,
            ))
            .await;
    }

    /// Tries once (`wait` = 0).
    pub async fn try_acquire(&self, key: &str) -> Result<Lock> {
        let opts = self.shared.defaults.clone().wait(Some(Duration::ZERO));
        self.acquire_with(key, &opts).await
    }

    /// Acquires `key`, retrying until `wait` is spent: at once when a release is published,
    /// at the holder's remaining TTL, or after a jittered `retry_delay` (holders that do not
    /// publish). Waiters queue (see DESIGN.md, "Waiters" and "Waiter queue").
    ///
    /// With `reentrant` on, each call is its own owner (a fresh owner id): the lock has
    /// Redisson's layout but is never re-entered. Use `acquire_owned` to re-enter.
    ///
    /// Dropping the returned future part-way releases whatever it had taken.
    pub async fn acquire_with(&self, key: &str, opts: &LockOptions) -> Result<Lock> {
        self.run(crate::acquire::acquire(&self.shared, key, None, opts))
            .await
    }

    /// Acquires `key` for `owner`, an identity of the caller's choosing (a thread id, an
    /// asyncio task id, an explicit handle). With `opts.reentrant`, an owner that already
    /// holds `key` through this manager re-enters: the hold count goes up, the key's expiry
    /// becomes at least `opts.ttl` (never shorter: its other handles count on it; on a
    /// quorum), and the new handle keeps the outer grant's token (the hash field) and fence.
    /// Each handle is released on its own; only the last release frees the key. An
    /// owner's next outermost acquisition gets a new random owner id, so the hash field is
    /// unique per acquisition. Without `reentrant`, `owner` is ignored.
    pub async fn acquire_owned(&self, key: &str, owner: u64, opts: &LockOptions) -> Result<Lock> {
        self.run(crate::acquire::acquire(
            &self.shared,
            key,
            Some(owner),
            opts,
        ))
        .await
    }

    /// Takes the read side of the read-write lock `key` (Redisson's `RReadWriteLock` layout,
    /// see DESIGN.md, "Read-write lock") with the manager's default options: any number of
    /// readers, or one writer. A reader that queued after a waiting writer goes after it.
    /// The ttl is at most `READ_LEASE_CAP` (30 s); readers get no fence.
    pub async fn read_lock(&self, key: &str) -> Result<Lock> {
        self.read_lock_with(key, &self.shared.defaults.clone())
            .await
    }

    /// `read_lock` with `opts`; each call is its own owner (see `read_lock_owned`).
    pub async fn read_lock_with(&self, key: &str, opts: &LockOptions) -> Result<Lock> {
        self.run(crate::rwlock::acquire(
            &self.shared,
            key,
            None,
            opts,
            RwSide::Read,
        ))
        .await
    }

    /// `read_lock` for `owner`: an owner that holds `key`'s read or write lock through this
    /// manager re-enters (a read under its own write lock is a downgrade).
    pub async fn read_lock_owned(&self, key: &str, owner: u64, opts: &LockOptions) -> Result<Lock> {
        self.run(crate::rwlock::acquire(
            &self.shared,
            key,
            Some(owner),
            opts,
            RwSide::Read,
        ))
        .await
    }

    /// Takes the write side of the read-write lock `key` with the manager's default options:
    /// granted on a key with no reader and no other writer. With `fencing`, every grant
    /// carries a fence token.
    pub async fn write_lock(&self, key: &str) -> Result<Lock> {
        self.write_lock_with(key, &self.shared.defaults.clone())
            .await
    }

    /// `write_lock` with `opts`; each call is its own owner (see `write_lock_owned`).
    pub async fn write_lock_with(&self, key: &str, opts: &LockOptions) -> Result<Lock> {
        self.run(crate::rwlock::acquire(
            &self.shared,
            key,
            None,
            opts,
            RwSide::Write,
        ))
        .await
    }

    /// `write_lock` for `owner`: an owner that holds `key`'s write lock re-enters; one that
    /// holds only its read lock is refused (an upgrade: two upgraders would wait for each
    /// other forever).
    pub async fn write_lock_owned(
        &self,
        key: &str,
        owner: u64,
        opts: &LockOptions,
    ) -> Result<Lock> {
        self.run(crate::rwlock::acquire(
            &self.shared,
            key,
            Some(owner),
            opts,
            RwSide::Write,
        ))
        .await
    }

    /// Takes one permit of the semaphore `name`, a pool of `permits` (Redisson's
    /// `RPermitExpirableSemaphore` layout, see DESIGN.md, "Semaphore"), with the manager's
    /// default options: the lease is the ttl, renewed by the watchdog while held and returned
    /// to the pool when it ends (a crashed holder) or on release. The first acquire on a name
    /// sets its pool size; a different stored size is refused naming both. Refused on a
    /// manager with more than one node, and for a name containing `{` or `}`.
    pub async fn semaphore(&self, name: &str, permits: u32) -> Result<Lock> {
        self.semaphore_with(name, permits, 1, &self.shared.defaults.clone())
            .await
    }

    /// `semaphore` taking `count` permits at once (1 ≤ count ≤ permits) with `opts` (ttl =
    /// lease, wait, retry delay: the re-check when no lease end is known).
    pub async fn semaphore_with(
        &self,
        name: &str,
        permits: u32,
        count: u32,
        opts: &LockOptions,
    ) -> Result<Lock> {
        self.run(crate::semaphore::acquire(
            &self.shared,
            name,
            permits,
            count,
            opts,
        ))
        .await
    }

    /// A call's work, from whatever executor polls it (see `Home::on_any_executor`).
    async fn run<T>(&self, work: impl Future<Output = T>) -> T {
        self.shared.cluster.on_any_executor(work).await
    }

    /// This manager's client uuid in this process: the first half of a reentrant lock's hash
    /// field (`"<client uuid>:<owner id>"`). A forked child gets a new one.
    pub fn client_id(&self) -> String {
        self.shared.owners.client_id()
    }

    /// What the watchdog sent to cluster nodes: (ticks, pipelines, renewals in pipelines,
    /// renewals sent alone). For tests of the per-primary batching.
    #[doc(hidden)]
    pub fn __cluster_renewals(&self) -> [u64; 4] {
        let c = self.shared.watchdog.cluster_renewals();
        [&c.ticks, &c.pipelines, &c.piped, &c.alone].map(|n| n.load(Ordering::Relaxed))
    }

    /// Test hook: cluster renewal pipelines that failed whole and were sent again halved.
    #[doc(hidden)]
    pub fn __cluster_renewal_splits(&self) -> u64 {
        let c = self.shared.watchdog.cluster_renewals();
        c.split.load(Ordering::Relaxed)
    }

    /// Test hook: runs between a failed first attempt and the waiter's subscription.
    #[doc(hidden)]
    pub fn __set_hook_before_subscribe(&self, hook: Option<Hook>) {
        *self
            .shared
            .waiters
            .hook
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = hook;
    }

    /// Test hook: runs in a lost attempt once its answers are in, before its undo and its
    /// report (the attempt is still in flight for its caller).
    #[doc(hidden)]
    pub fn __set_hook_lost_attempt(&self, hook: Option<Hook>) {
        self.shared.waiters.set_attempt_hooks(|h| h.lost = hook);
    }

    /// Test hook: runs in a won attempt that a blocking caller with several nodes runs as a
    /// task, once it has sent its outcome to the caller (who may not have read it yet).
    #[doc(hidden)]
    pub fn __set_hook_won_reported(&self, hook: Option<Hook>) {
        self.shared
            .waiters
            .set_attempt_hooks(|h| h.won_reported = hook);
    }
}

/// The CA file of the TLS nodes, read and checked once for all of them (a file with no
/// certificate would fail every TLS connection later, named as a node's fault); its errors
/// name where the path came from (`FERROLOCK_TLS_CA` when the caller gave none).
fn read_root_cert(options: &ManagerOptions, urls: &[String]) -> Result<Option<Vec<u8>>> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let Some((path, from)) = options.tls_ca_in_force() else {
        return Ok(None);
    };
    if !urls.iter().any(|u| crate::node::is_tls_url(u)) {
        return Ok(None);
    }
    let source = from.map(|var| format!("{var}: ")).unwrap_or_default();
    // A node URL given here by mistake (the options swapped) is shown as URLs always are:
    // without its password. Only then: a real path may hold an `@`.
    let shown = path.display().to_string();
    let shown = if shown.contains("://") {
        crate::node::redact_url(&shown)
    } else {
        shown
    };
    let bad = |why: String| Error::invalid(format!("{source}tls_ca file {shown}: {why}"));
    let pem = std::fs::read(&path)
        .map_err(|e| Error::invalid(format!("{source}cannot read tls_ca file {shown}: {e}")))?;
    let mut certs = 0;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        cert.map_err(|e| bad(format!("not a PEM certificate file: {e}")))?;
        certs += 1;
    }
    if certs == 0 {
        return Err(bad(
            "holds no certificate (expected PEM: -----BEGIN CERTIFICATE-----)".to_string(),
        ));
    }
    Ok(Some(pem))
}

/// Checks the node list (no empty URL, no node twice) and opens each node (no connection yet).
fn open_nodes(
    options: &ManagerOptions,
    urls: &[String],
    root_cert: Option<&[u8]>,
    home: &crate::runtime::Home,
) -> Result<(Vec<Node>, GuardWindow)> {
    let shown: Vec<String> = urls.iter().map(|u| crate::node::redact_url(u)).collect();
    if urls.iter().any(|u| u.trim().is_empty()) {
        return Err(Error::invalid(format!(
            "empty node URL in node list {shown:?}"
        )));
    }
    // The same node twice would count its vote twice (or, refusing, make a quorum
    // impossible): Redlock needs independent nodes.
    for (i, u) in urls.iter().enumerate() {
        if urls[..i].contains(u) {
            return Err(Error::invalid(format!(
                "node {:?} is listed twice in {shown:?}: Redlock needs distinct nodes",
                crate::node::redact_url(u)
            )));
        }
    }
    let guard = match options.restart_guard {
        Some(g) => GuardWindow::Fixed(g),
        // A node that restarts with no persistence forgets its locks; with fewer than 3
        // nodes there is no spare to outvote it anyway.
        None if urls.len() >= 3 => GuardWindow::longest_lease(options.lock.ttl),
        None => GuardWindow::Fixed(Duration::ZERO),
    };
    // A cluster's primaries connect each within half the default node timeout, so one that
    // hangs is left out while the others still connect in time (see `cluster_builder`).
    let connect_timeout = (options.lock.effective_node_timeout() / 2).max(Duration::from_millis(1));
    let server_ids = ServerIds::default();
    let nodes = urls
        .iter()
        .map(|u| {
            Node::open(
                u,
                root_cert,
                guard.clone(),
                server_ids.clone(),
                options.sharded_pubsub,
                connect_timeout,
                home.clone(),
            )
        })
        .collect::<Result<Vec<Node>>>()?;
    server_ids.set_several_clusters(nodes.iter().filter(|n| n.is_cluster()).count() > 1);
    // Spelled apart, one server all the same (see `Node::server`).
    for (i, node) in nodes.iter().enumerate() {
        let server = node.server();
        if let Some(first) = nodes[..i].iter().find(|n| n.server() == server) {
            return Err(Error::invalid(format!(
                "nodes {:?} and {:?} are the same server ({server}) in {shown:?}: Redlock needs distinct nodes",
                first.name(),
                node.name()
            )));
        }
    }
    Ok((nodes, guard))
}
