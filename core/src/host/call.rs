//! Completion-based calls: start a call on the process runtime and get its result through a
//! callback or a handle, so a caller (C, Go) can wait without pinning a thread, and the
//! thread's own connections, per waiting caller.

use std::future::Future;
use std::sync::{Arc, Condvar, Mutex};

use crate::error::Result;
use crate::host::cancel::{Cancel, until_cancelled};

/// Runs `fut` on the process runtime. `done` is called exactly once with its result, or with
/// `cancelled()` if `cancel` fired first. A cancelled future is dropped, and `done` is called
/// only once what its drop started has finished ([`until_cancelled`]): an acquire has given
/// back what it had taken (key, hold count, queue entry) on every node that answered, a
/// release has completed; an extend leaves the deadline. `done` runs on a
/// library thread that may block (the runtime's blocking pool, never a worker), so it may
/// take a binding's lock (Python's GIL) or hand the result on. A result that `done` drops
/// unused (a lock nobody will take) is released in the background.
pub fn start<T, F, D>(
    fut: F,
    cancel: Cancel,
    cancelled: impl FnOnce() -> crate::Error + Send + 'static,
    done: D,
) where
    T: Send + 'static,
    F: Future<Output = Result<T>> + Send + 'static,
    D: FnOnce(Result<T>) + Send + 'static,
{
    let rt = crate::runtime::runtime();
    let blocking = rt.handle().clone();
    let mut once = Once::<T, D>(Some(done), std::marker::PhantomData);
    rt.spawn(async move {
        let out = match until_cancelled(fut, &cancel).await {
            Some(out) => out,
            None => Err(cancelled()),
        };
        if let Some(done) = once.0.take() {
            drop(blocking.spawn_blocking(move || done(out)));
        }
    });
}

/// Calls `done` with an error, on the thread dropping the task, if the task ends without a
/// result (a panic in the call, or the runtime shutting down), so that a caller waiting for
/// it is never left waiting for ever.
struct Once<T, D: FnOnce(Result<T>)>(Option<D>, std::marker::PhantomData<fn(T)>);

impl<T, D: FnOnce(Result<T>)> Drop for Once<T, D> {
    fn drop(&mut self) {
        if let Some(done) = self.0.take() {
            done(Err(crate::Error::new(
                crate::ErrorKind::Redis,
                "ferrolock bug: the call ended without a result (a panic, or the runtime shut down)",
            )));
        }
    }
}

/// A call in progress, as a handle: wait for it (blocking, interruptible), look without
/// waiting, or cancel it. Dropping the handle does not cancel the call; its result, if
/// unclaimed, is dropped (a lock is then released in the background).
pub struct Call<T> {
    inner: Arc<Slot<T>>,
    cancel: Cancel,
}

struct Slot<T> {
    /// The result until taken, and whether the call has completed.
    result: Mutex<(Option<Result<T>>, bool)>,
    ready: Condvar,
}

impl<T> Slot<T> {
    fn get(&self) -> std::sync::MutexGuard<'_, (Option<Result<T>>, bool)> {
        self.result.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<T: Send + 'static> Call<T> {
    /// Starts `fut` (see [`start`]) and returns its handle.
    pub fn start<F>(
        fut: F,
        cancel: Cancel,
        cancelled: impl FnOnce() -> crate::Error + Send + 'static,
    ) -> Call<T>
    where
        F: Future<Output = Result<T>> + Send + 'static,
    {
        let inner = Arc::new(Slot {
            result: Mutex::new((None, false)),
            ready: Condvar::new(),
        });
        let slot = inner.clone();
        start(fut, cancel.clone(), cancelled, move |out| {
            *slot.get() = (Some(out), true);
            slot.ready.notify_all();
        });
        Call { inner, cancel }
    }

    /// Stops the call (see [`start`] for what a cancelled call leaves behind); its result
    /// becomes the cancellation error unless it had already completed.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Whether the call has completed (its result may have been taken since).
    pub fn is_done(&self) -> bool {
        self.inner.get().1
    }

    /// The result, if the call has completed and nobody took it yet.
    pub fn try_take(&self) -> Option<Result<T>> {
        self.inner.get().0.take()
    }

    /// Blocks the calling thread until the result is there, and takes it (`None` if another
    /// thread took it first).
    pub fn wait(&self) -> Option<Result<T>> {
        let mut r = self.inner.get();
        while !r.1 {
            r = self.inner.ready.wait(r).unwrap_or_else(|p| p.into_inner());
        }
        r.0.take()
    }
}
