//! A flag set once and awaited: the process is exiting, a manager was closed. Whatever waits
//! on it (an acquire) gives up when it is set.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

#[derive(Default)]
pub(crate) struct Flag {
    set: AtomicBool,
    changed: Notify,
}

impl Flag {
    pub const fn new() -> Flag {
        Flag {
            set: AtomicBool::new(false),
            changed: Notify::const_new(),
        }
    }

    /// Sets the flag and wakes its waiters; false if it was set already.
    pub fn set(&self) -> bool {
        let first = !self.set.swap(true, Ordering::SeqCst);
        self.changed.notify_waiters();
        first
    }

    pub fn is_set(&self) -> bool {
        self.set.load(Ordering::SeqCst)
    }

    /// Resolves once the flag is set.
    pub async fn wait(&self) {
        let notified = self.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if !self.is_set() {
            notified.await;
        }
    }
}
