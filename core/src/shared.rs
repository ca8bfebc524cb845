//! What a manager's clones, its locks and its background work share.

use std::sync::Arc;
use std::time::Duration;

use crate::cluster::Cluster;
use crate::options::LockOptions;
use crate::owner::Owners;
use crate::queue::{Memory, Waiters};
use crate::throttle::Throttle;
use crate::watchdog::Watchdog;

pub(crate) struct Shared {
    pub cluster: Arc<Cluster>,
    pub defaults: LockOptions,
    pub watchdog: Watchdog,
    /// The client uuid and the live reentrant acquisitions, per owner.
    pub owners: Owners,
    /// Waiters, their local queues and the pub/sub connections that wake them.
    pub waiters: Arc<Waiters>,
    /// Keys on which this manager recently saw waiters or a busy lock.
    pub contention: Memory,
    /// "Release finished in the background" warnings (one per release while a node is down).
    pub background_releases: Throttle,
}

/// At most one "finished in the background" warning per this, per manager.
const BACKGROUND_WARNING_EVERY: Duration = Duration::from_secs(10);

impl Shared {
    pub fn new(cluster: Cluster, defaults: LockOptions) -> Shared {
        let cluster = Arc::new(cluster);
        let node_timeout = defaults.effective_node_timeout();
        Shared {
            watchdog: Watchdog::new(cluster.clone()),
            waiters: Arc::new(Waiters::new(cluster.clone(), node_timeout)),
            cluster,
            defaults,
            owners: Owners::default(),
            contention: Memory::default(),
            background_releases: Throttle::new(BACKGROUND_WARNING_EVERY),
        }
    }
}
