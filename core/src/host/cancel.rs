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
/// drop started (an undo, leaving the server queue, the rest of a release) finished before
/// this returns (each piece is bounded by the node timeout).
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
    crate::runtime::block_on(drop_cancelled(fut));
    None
}

/// Runs `fut` (on the current runtime) until it completes or `cancel` fires, whichever comes
/// first. `None` once cancelled, and only once the clean-up its drop started has finished
/// (see [`drop_cancelled`]): the caller may report the cancel at once, and another client
/// finds nothing of it left on any node that answered.
pub async fn until_cancelled<F: Future>(fut: F, cancel: &Cancel) -> Option<F::Output> {
    let mut fut = Box::pin(fut);
    tokio::select! {
        biased;
        out = fut.as_mut() => return Some(out),
        _ = cancel.cancelled() => {}
    }
    drop_cancelled(fut).await;
    None
}

/// Drops a cancelled call's future and waits for the clean-up its drop started: an acquire's
/// undo on every node that answered and its leaving the server queue (each bounded by the node
/// timeout), the rest of a release. What waits for a silent node's answer goes on in the
/// background (the exit protocol waits for it): a cancel is not held up by a paused node.
async fn drop_cancelled<F>(fut: F) {
    for task in crate::runtime::collect_cleanup(move || drop(fut)) {
        let _ = task.await;
    }
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
