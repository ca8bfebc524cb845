//! Quiet releases (see DESIGN.md, "Waiter queue"): a worker in a loop on a key (one node)
//! releases without telling the first waiter while that waiter's barging bound lasts, and
//! usually takes the lock back one round trip later (a streak of hot sections instead of a
//! cross-process hand-off per section). When it does not come back (its loop ended, or it went
//! on to other work), this watcher tells the first waiter once `QUIET_GRACE` has passed, so
//! the lock does not stay free until that waiter's own re-check at the end of its bound.
//!
//! One watcher task per manager, started on the first grant of a streak. It sleeps until the
//! oldest quiet release's grace ends, so a streak costs it one wake-up per grace, not one per
//! release, and keeps its manager alive until then. A process about to exit cannot wait for
//! it: `LockManager::flush_quiet_releases` does the checks at once (the Python binding's
//! `close()` and its exit hook call it).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::manager::Shared;
use crate::wakeup::{QUIET_GRACE, wake_if_free};

/// How often an idle watcher looks whether its manager is gone.
const IDLE_CHECK: std::time::Duration = std::time::Duration::from_secs(5);

#[derive(Default)]
pub(crate) struct QuietWatch {
    /// Quiet releases not checked yet, oldest first: the key and when it was released.
    pending: Mutex<VecDeque<(String, Instant)>>,
    more: Arc<Notify>,
    /// The process whose runtime runs the watcher (0: none yet); a forked child starts its own.
    running_in: AtomicU32,
}

impl QuietWatch {
    /// Starts the watcher in this process if it does not run yet (cheap when it does).
    pub fn ensure_running(&self, shared: &Arc<Shared>) {
        let pid = crate::runtime::pid();
        if self.running_in.swap(pid, Ordering::AcqRel) != pid {
            self.lock().clear();
            shared.handle().spawn(watcher(Arc::downgrade(shared)));
        }
    }

    /// Our release of `key` at `at` was quiet: check after the grace that we came back.
    pub fn released(&self, key: &str, at: Instant) {
        let mut pending = self.lock();
        let was_empty = pending.is_empty();
        pending.push_back((key.to_string(), at));
        drop(pending);
        if was_empty {
            self.more.notify_one();
        }
    }

    /// Checks every pending quiet release now (see `LockManager::flush_quiet_releases`).
    pub async fn flush(&self, shared: &Shared) {
        let all: Vec<(String, Instant)> = self.lock().drain(..).collect();
        let left = all
            .iter()
            .filter(|(key, at)| shared.left_after_quiet_release(key, *at));
        futures::future::join_all(left.map(|(key, _)| wake_if_free(shared, key))).await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(String, Instant)>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

async fn watcher(weak: Weak<Shared>) {
    loop {
        let next = {
            let Some(shared) = weak.upgrade() else { return };
            let next = shared.quiet.lock().front().map(|(_, at)| *at + QUIET_GRACE);
            match next {
                Some(due) => due,
                None => {
                    // Not holding the manager while idle: the timeout notices a dropped one.
                    let more = shared.quiet.more.clone();
                    drop(shared);
                    let _ = tokio::time::timeout(IDLE_CHECK, more.notified()).await;
                    continue;
                }
            }
        };
        // Holding the manager until its pending releases are checked: one dropped right after
        // its loop still tells the waiter (a grace later).
        let Some(shared) = weak.upgrade() else { return };
        tokio::time::sleep_until(next).await;
        let now = Instant::now();
        let due: Vec<(String, Instant)> = {
            let mut pending = shared.quiet.lock();
            let n = pending
                .iter()
                .take_while(|(_, at)| *at + QUIET_GRACE <= now)
                .count();
            pending.drain(..n).collect()
        };
        for (key, at) in due {
            if shared.left_after_quiet_release(&key, at) {
                let shared = shared.clone();
                shared
                    .handle()
                    .spawn(async move { wake_if_free(&shared, &key).await });
            }
        }
    }
}
