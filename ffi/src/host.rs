//! WHERE THE C ABI MEETS THE CORE'S HOST LAYER (`ferrolock::host`, issue 14, item 1).
//!
//! Cancel tokens and blocking calls are the host layer's (`host::Cancel`, `host::block_on`).
//! Still here until this crate moves onto `host::Manager` / `host::Lock` (whose
//! `acquire_start`, `on_lost` and `free` give the same guarantees): the completion-based
//! acquire that holds no thread while it waits, and a callback slot with the loss callback's
//! guarantees (at most once, on a library thread, never after disarm has returned, disarm waits
//! for a running call). The rest of this crate reaches these only through this module. No lock
//! logic is here: interrupting an acquire is dropping the core's future, which gives back
//! whatever it had taken (`LockManager::acquire_with`).

use std::future::Future;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::ThreadId;

use ferrolock::{Lock, LockManager, LockOptions};

use crate::status::{FERROLOCK_ERR_CANCELLED, Failure};

/// The core's cancel token (`ferrolock::host::Cancel`).
pub(crate) use ferrolock::host::Cancel;

fn cancelled(what: &str) -> Failure {
    Failure::new(
        FERROLOCK_ERR_CANCELLED,
        format!("{what} cancelled: nothing was kept (whatever had been taken was given back)"),
    )
}

/// `work` raced against `cancel`, the cancel checked first: a call cancelled before it starts
/// sends nothing. Dropping `work` part-way is the core's undo (an acquire gives back what it
/// took, a release completes in the background).
async fn cancellable<T>(
    what: &str,
    cancel: &Cancel,
    work: impl Future<Output = Result<T, Failure>>,
) -> Result<T, Failure> {
    tokio::select! {
        biased;
        _ = cancel.cancelled() => Err(cancelled(what)),
        out = work => out,
    }
}

/// Runs `work` on the calling thread through the host layer's blocking call (the thread drives
/// its own requests), interruptible through `cancel` from another thread; the clean-up a
/// dropped future left (an undo on this thread's connections) is finished before it returns.
pub(crate) fn blocking<T>(
    what: &str,
    cancel: Option<&Cancel>,
    work: impl Future<Output = Result<T, Failure>>,
) -> Result<T, Failure> {
    let never = Cancel::new();
    let cancel = cancel.unwrap_or(&never);
    if cancel.is_cancelled() {
        return Err(cancelled(what));
    }
    ferrolock::host::block_on(work, cancel, None).unwrap_or_else(|| Err(cancelled(what)))
}

/// What an acquire asks for.
pub(crate) struct AcquireRequest {
    pub manager: LockManager,
    pub key: String,
    pub opts: LockOptions,
    pub owner: Option<u64>,
}

impl AcquireRequest {
    pub async fn run(&self) -> Result<Lock, Failure> {
        let out = match self.owner {
            Some(owner) => {
                self.manager
                    .acquire_owned(&self.key, owner, &self.opts)
                    .await
            }
            None => self.manager.acquire_with(&self.key, &self.opts).await,
        };
        out.map_err(Failure::from)
    }
}

/// Where a completion-based acquire stands.
enum Outcome {
    Waiting,
    Done(Result<Lock, Failure>),
    Taken,
}

/// A completion-based acquire: runs as a task on the process runtime (no thread waits for
/// it), stores its outcome, then calls `done` (once, on a library thread).
pub(crate) struct Pending {
    outcome: Mutex<Outcome>,
    pub cancel: Cancel,
    done: CallbackSlot<()>,
}

impl Pending {
    pub fn start(
        request: AcquireRequest,
        done: Option<Box<dyn FnOnce(()) + Send>>,
    ) -> Arc<Pending> {
        let pending = Arc::new(Pending {
            outcome: Mutex::new(Outcome::Waiting),
            cancel: Cancel::new(),
            done: CallbackSlot::new(done),
        });
        let task = Completes(pending.clone());
        ferrolock::runtime::runtime().spawn(async move {
            let out = cancellable("acquire", &task.0.cancel, request.run()).await;
            task.complete(out);
        });
        pending
    }

    /// The outcome, once: `None` while under way.
    pub fn take(&self) -> Option<Result<Lock, Failure>> {
        let mut outcome = self.outcome.lock().unwrap_or_else(|p| p.into_inner());
        match std::mem::replace(&mut *outcome, Outcome::Taken) {
            Outcome::Waiting => {
                *outcome = Outcome::Waiting;
                None
            }
            Outcome::Done(out) => Some(out),
            Outcome::Taken => Some(Err(Failure::invalid(
                "the acquisition's result was already taken",
            ))),
        }
    }

    /// The caller lets go: the acquire is cancelled, `done` is never called after this returns,
    /// and a lock granted meanwhile is released (the core releases a dropped `Lock`).
    pub fn abandon(&self) {
        self.cancel.cancel();
        self.done.disarm();
        drop(self.take());
    }
}

/// Completes a `Pending` exactly once: with the acquire's outcome, or, if the task panicked or
/// was dropped (the runtime shutting down), with an error, so that a caller waiting for `done`
/// is never left waiting forever.
struct Completes(Arc<Pending>);

impl Completes {
    fn complete(&self, out: Result<Lock, Failure>) {
        *self.0.outcome.lock().unwrap_or_else(|p| p.into_inner()) = Outcome::Done(out);
        // The caller's callback may block (or call back in): not on a runtime worker.
        let pending = self.0.clone();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            drop(handle.spawn_blocking(move || pending.done.fire(())));
        } else {
            pending.done.fire(());
        }
    }
}

impl Drop for Completes {
    fn drop(&mut self) {
        let waiting = matches!(
            *self.0.outcome.lock().unwrap_or_else(|p| p.into_inner()),
            Outcome::Waiting
        );
        if waiting {
            self.complete(Err(Failure::new(
                crate::status::FERROLOCK_ERR_PANIC,
                "ferrolock bug: the acquire task ended without an outcome (a panic, or the runtime shut down)",
            )));
        }
    }
}

/// A callback with the guarantees of the loss callback: called at most once, never after
/// `disarm` has returned, and `disarm` waits for a call already running (unless it is made from
/// inside that call, which would otherwise wait for itself).
pub(crate) struct CallbackSlot<A> {
    state: Mutex<SlotState<A>>,
    finished: Condvar,
}

struct SlotState<A> {
    callback: Option<Box<dyn FnOnce(A) + Send>>,
    running_on: Option<ThreadId>,
}

impl<A> CallbackSlot<A> {
    pub fn new(callback: Option<Box<dyn FnOnce(A) + Send>>) -> CallbackSlot<A> {
        CallbackSlot {
            state: Mutex::new(SlotState {
                callback,
                running_on: None,
            }),
            finished: Condvar::new(),
        }
    }

    pub fn fire(&self, arg: A) {
        let callback = {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let Some(callback) = s.callback.take() else {
                return;
            };
            s.running_on = Some(std::thread::current().id());
            callback
        };
        // A panic cannot come out of a C function pointer; this only keeps the slot sane.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| callback(arg)));
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .running_on = None;
        self.finished.notify_all();
    }

    pub fn disarm(&self) {
        let me = std::thread::current().id();
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.callback = None;
        while s.running_on.is_some_and(|t| t != me) {
            s = self.finished.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Attaches `callback` to the loss of `lock` with the slot's guarantees; the returned slot is
/// disarmed by release and free. The core calls its own callback on whatever thread declares
/// the loss (possibly the caller's, for a lock already lost): the caller's runs on a runtime
/// thread of its own, where it may block without delaying the watchdog.
pub(crate) fn on_lost(
    lock: &Lock,
    callback: Box<dyn FnOnce(Failure) + Send>,
) -> Arc<CallbackSlot<Failure>> {
    let slot = Arc::new(CallbackSlot::new(Some(callback)));
    let fired = slot.clone();
    lock.on_lost(move |reason| {
        let failure = Failure::new(crate::status::FERROLOCK_ERR_LOCK_LOST, reason.to_string());
        drop(ferrolock::runtime::runtime().spawn_blocking(move || fired.fire(failure)));
    });
    slot
}
