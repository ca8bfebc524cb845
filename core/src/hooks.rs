//! Test-only hooks at points where a race decides the outcome, so that a test can hold a
//! thread there and make the race happen every time. Off (one relaxed atomic load) unless a
//! test sets one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Where a hook runs.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Point {
    /// `Lock::on_lost`, after the state was read and before the callback is registered.
    OnLostRegistering,
    /// The watchdog's scan, while it holds its registry (a fork now leaves it held).
    WatchdogScan,
    /// A metrics snapshot (a scrape), while it holds the process's metrics registry (a fork
    /// now leaves it held).
    MetricsSnapshot,
    /// `Lock::extend_for`, holding the lock's operation guard (a renewal due now is skipped).
    Extending,
    /// `Lock::extend_for`, once a quorum confirmed and before the new validity is checked (a
    /// stalled client: the only way a confirmation comes late when the node timeout fits).
    Extended,
    /// An acquire attempt, once its nodes answered and before its validity is checked (a
    /// stalled client: the only way a grant comes late when the node timeout fits the ttl).
    Answered,
    /// A semaphore attempt's task, before its script is sent (an acquire cancelled now leaves
    /// the attempt to reach the node after its queue place was taken out).
    SemaphoreSending,
    /// A queued acquire attempt's request to one node, before it is sent (as above, for the
    /// lock kinds).
    QueuedSending,
    /// A semaphore grant on a Redis Cluster, before the restart guard's check of its primary
    /// (an acquire cancelled now has a grant and no `Lock` yet).
    SemaphoreConfirming,
}

/// Called with the point and the lock's key (empty where there is none).
type Hook = Arc<dyn Fn(Point, &str) + Send + Sync>;

static SET: AtomicBool = AtomicBool::new(false);
static HOOK: Mutex<Option<Hook>> = Mutex::new(None);

/// Test hook: `hook` runs at every `Point` until replaced (`None` removes it).
#[doc(hidden)]
pub fn __set_test_hook(hook: Option<Hook>) {
    let mut h = HOOK.lock().unwrap_or_else(|p| p.into_inner());
    SET.store(hook.is_some(), Ordering::SeqCst);
    *h = hook;
}

pub(crate) fn run(point: Point, key: &str) {
    if !SET.load(Ordering::Relaxed) {
        return;
    }
    let hook = HOOK.lock().unwrap_or_else(|p| p.into_inner()).clone();
    if let Some(hook) = hook {
        hook(point, key);
    }
}

/// `run` on the runtime's blocking pool, for the caller to await (`None` without a hook): a
/// hook that holds its caller then holds only that task, not a runtime thread (with one
/// worker, the whole runtime; with several, whatever waits in that worker's own slot).
pub(crate) fn off_thread(point: Point, key: &str) -> Option<tokio::task::JoinHandle<()>> {
    if !SET.load(Ordering::Relaxed) {
        return None;
    }
    let key = key.to_string();
    Some(tokio::task::spawn_blocking(move || run(point, &key)))
}
