//! Quiet releases (see DESIGN.md, "Quiet streaks"): a worker in a loop on a key (one node)
//! releases without telling the first waiter while that waiter's barging bound lasts, and
//! usually takes the lock back one round trip later (a streak of hot sections instead of a
//! cross-process hand-off per section). When it does not come back (its loop ended, or it went
//! on to other work), the first waiter finds the lock free at its own re-check, when its bound
//! ends (`recheck()` in queue.lua), or sooner if the worker comes back late (its refused
//! attempt tells the waiter) or its manager flushes (below). No timer watches for the worker
//! not coming back (docs/decisions/, "No quiet-release watcher"). A process about to exit
//! cannot be waited for at all: `LockManager::flush_quiet_releases` tells the waiters at once
//! (the Python binding's `close()`, `release_all()` and its exit hook call it).

use super::contention::Memory;
use super::waiters::Waiters;

/// Tells the first waiter of every key whose last act by this manager was a quiet release.
pub(crate) async fn flush(waiters: &Waiters, memory: &Memory) {
    let left = memory.left_after_quiet_releases();
    futures::future::join_all(left.iter().map(|key| waiters.wake_if_free(key))).await;
}
