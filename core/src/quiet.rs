//! Quiet releases (see DESIGN.md, "Waiter queue"): a worker in a loop on a key (one node)
//! releases without telling the first waiter while that waiter's barging bound lasts, and
//! usually takes the lock back one round trip later (a streak of hot sections instead of a
//! cross-process hand-off per section). When it does not come back (its loop ended, or it went
//! on to other work), the first waiter finds the lock free at its own re-check, when its bound
//! ends (`recheck()` in queue.lua), or sooner if the worker comes back late (its refused
//! attempt tells the waiter) or its manager flushes (below).
//!
//! No timer watches for the worker not coming back: a task waking once per grace during every
//! streak cost 8 % of the sections of 4 contending Python processes (its wake-ups land on the
//! other CPU, where the Redis servers run), to shorten a wait that the bound already caps.
//! A process about to exit cannot be waited for at all: `LockManager::flush_quiet_releases`
//! tells the waiters at once (the Python binding's `close()`, `release_all()` and its exit
//! hook call it).

use crate::manager::Shared;
use crate::wakeup::wake_if_free;

/// Tells the first waiter of every key whose last act by this manager was a quiet release.
pub(crate) async fn flush(shared: &Shared) {
    let left = shared.left_after_quiet_releases();
    futures::future::join_all(left.iter().map(|key| wake_if_free(shared, key))).await;
}
