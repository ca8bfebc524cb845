//! A cancel token, and the blocking wait every binding's blocking calls go through.
//!
//! The caller's thread drives its own I/O (`runtime::block_on`, DESIGN.md "Blocking
//! callers"); another thread interrupts it by firing the token. What an interrupted call
//! leaves behind is the core's drop behaviour, relied on here: a dropped acquire undoes what
//! it had taken, a dropped release is completed (once) by the core, a dropped extend never
//! moves the deadline.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use crate::error::{Error, ErrorKind};

/// Interrupts the calls it was given to. Cheap to clone (clones share the state); fired from
/// any thread, any number of times; once fired it stays fired (make a new one per call that
/// may be interrupted on its own).
#[derive(Clone, Default)]
pub struct Cancel(Arc<Inner>);

#[derive(Default)]
struct Inner {
    fired: AtomicBool,
    notify: Notify,
}

impl std::fmt::Debug for Cancel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Cancel({})",
            if self.is_cancelled() {
                "fired"
            } else {
                "armed"
            }
        )
    }
}

impl Cancel {
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Fires the token: every call waiting on it stops waiting.
    pub fn cancel(&self) {
        self.0.fired.store(true, Ordering::SeqCst);
        self.0.notify.notify_waiters();
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.fired.load(Ordering::SeqCst)
    }

    /// Resolves once the token is fired (at once if it already is).
    pub async fn cancelled(&self) {
        let notified = self.0.notify.notified();
        tokio::pin!(notified);
        // Registered before the flag is read, so a `cancel` in between is not missed.
        notified.as_mut().enable();
        if !self.is_cancelled() {
            notified.await;
        }
    }
}

/// The error a cancelled call returns (`ErrorKind::Cancelled`); `what` says what was
/// interrupted and what became of it.
pub(crate) fn cancelled(what: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Cancelled, format!("{what}: cancelled"))
}

/// How often a blocked thread runs its binding's check (see [`Check`]).
pub const CHECK_EVERY: Duration = Duration::from_millis(50);

/// A binding's look at its own interruptions, run on the blocked thread every
/// [`CHECK_EVERY`] while it waits, outside the runtime (it may take the binding's lock, such
/// as Python's GIL, to run signal handlers); it fires the call's [`Cancel`] to stop the wait.
pub type Check<'a> = Option<&'a mut dyn FnMut()>;

/// Runs `fut` on the calling thread (`runtime::block_on`) until it completes or `cancel`
/// fires. `None` once cancelled: the future was dropped, on this thread, and the clean-up its
/// drop started (an undo, the rest of a release) finished before this returns (each piece is
/// bounded by the node timeout).
///
/// # Panics
/// When called from async code (inside a tokio runtime).
pub fn block_on<F>(fut: F, cancel: &Cancel, mut check: Check<'_>) -> Option<F::Output>
where
    F: Future,
{
    let mut fut = Box::pin(fut);
    loop {
        if cancel.is_cancelled() {
            break;
        }
        let slice = check.is_some().then_some(CHECK_EVERY);
        let step = crate::runtime::block_on(async {
            tokio::select! {
                biased;
                out = fut.as_mut() => Step::Done(out),
                _ = cancel.cancelled() => Step::Cancelled,
                _ = sleep_or_never(slice) => Step::SliceOver,
            }
        });
        match step {
            Step::Done(out) => return Some(out),
            Step::Cancelled => break,
            Step::SliceOver => {
                if let Some(check) = check.as_mut() {
                    check();
                }
            }
        }
    }
    // Dropped inside `block_on`, so the clean-up it starts runs on this thread's connections,
    // where the call's requests went out, before the thread is handed back.
    crate::runtime::block_on(async move { drop(fut) });
    None
}

enum Step<T> {
    Done(T),
    Cancelled,
    SliceOver,
}

async fn sleep_or_never(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancel_from_another_thread_stops_a_blocked_wait() {
        let cancel = Cancel::new();
        let remote = cancel.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            remote.cancel();
        });
        let out = block_on(std::future::pending::<()>(), &cancel, None);
        assert!(out.is_none());
        assert!(cancel.is_cancelled());
        t.join().unwrap();
    }

    #[test]
    fn the_check_runs_while_waiting_and_may_cancel() {
        let cancel = Cancel::new();
        let mut looks = 0;
        let mut check = || {
            looks += 1;
            if looks == 2 {
                cancel.cancel();
            }
        };
        let out = block_on(
            std::future::pending::<()>(),
            &cancel.clone(),
            Some(&mut check),
        );
        assert!(out.is_none());
        assert_eq!(looks, 2);
    }

    #[test]
    fn a_finished_call_returns_its_output() {
        assert_eq!(block_on(async { 7 }, &Cancel::new(), None), Some(7));
    }
}
