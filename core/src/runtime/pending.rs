//! Work that must finish although its caller went away (an undo, a dequeue, a release that
//! returned at its quorum or whose handle was dropped), counted per process until it ends, so
//! that closing a manager and the exit protocol can wait for it: without the count, a process
//! that exits (or a caller told "nothing was left behind") right after such work was started
//! leaves a key or a queue entry on a node until it expires.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

use crate::per_process::PerProcess;

#[derive(Default)]
struct Count {
    running: AtomicUsize,
    ended: Notify,
}

/// Per process: a forked child does not inherit its parent's tasks, nor their count.
fn count() -> &'static Count {
    static COUNT: OnceLock<PerProcess<Count>> = OnceLock::new();
    COUNT
        .get_or_init(PerProcess::default)
        .get_or_init(Count::default)
}

/// Counts one piece of background work for as long as it lives: make it where the work is
/// decided (before the task is spawned, so a waiter never misses it) and move it into the task.
pub(crate) struct Pending(());

impl Pending {
    pub fn start() -> Pending {
        count().running.fetch_add(1, Ordering::SeqCst);
        Pending(())
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let c = count();
        c.running.fetch_sub(1, Ordering::SeqCst);
        c.ended.notify_waiters();
    }
}

/// Resolves once no counted work of this process is running (each piece is bounded by the
/// node timeout; callers bound the wait by their own limit).
pub(crate) async fn settled() {
    let c = count();
    loop {
        let ended = c.ended.notified();
        tokio::pin!(ended);
        ended.as_mut().enable();
        if c.running.load(Ordering::SeqCst) == 0 {
            return;
        }
        ended.await;
    }
}
