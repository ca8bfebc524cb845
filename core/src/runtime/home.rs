//! Where a manager's background work (the watchdog, the waiters' subscriptions, a dropped
//! lock's release, clean-up) and its shared connections live.
//!
//! The runtime the manager was made in, while that runtime runs; otherwise the process
//! runtime. A runtime that shut down drops its tasks: a manager made in one `#[tokio::test]`
//! or an earlier runtime had no watchdog left, and a lock dropped after it was never
//! released. A current-thread runtime stays the home while it runs, though it runs its tasks
//! only inside its `block_on`: moved to the process runtime from the start, every request
//! crossed threads twice (sequential acquire + release on one node fell from about 20k to
//! 6-9k a second, 16 tasks from 38k to 19k); a caller that holds a lock between two
//! `block_on`s uses a multi-thread runtime (DESIGN.md, "Rust callers' runtimes").

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::runtime::Handle;

#[derive(Clone)]
pub(crate) struct Home(Option<Arc<Ambient>>);

struct Ambient {
    handle: Handle,
    /// Cleared once that runtime has dropped its tasks (it shut down).
    alive: Arc<AtomicBool>,
    /// Dropped with the last clone of the `Home`: ends the task that watches the runtime, so
    /// a runtime that makes many managers keeps no task per manager.
    _gone: tokio::sync::oneshot::Sender<()>,
}

/// Clears `alive` when the task holding it is dropped: at its runtime's shutdown (or once its
/// `Home` is gone, when nobody reads the flag any more).
struct Alive(Arc<AtomicBool>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Home {
    /// The caller's runtime (never a blocking caller's own, see `ambient`), else the process
    /// runtime.
    pub fn here() -> Home {
        let Some(handle) = super::ambient() else {
            return Home(None);
        };
        let alive = Arc::new(AtomicBool::new(true));
        let (gone, when_gone) = tokio::sync::oneshot::channel::<()>();
        let flag = Alive(alive.clone());
        handle.spawn(async move {
            let _flag = flag;
            let _ = when_gone.await;
        });
        Home(Some(Arc::new(Ambient {
            handle,
            alive,
            _gone: gone,
        })))
    }

    /// Says this home's runtime is shutting down, for a task of it that learns so first (one
    /// dropped unfinished): work started from then on goes to the process runtime, though the
    /// task that clears `alive` may not have been dropped yet (a connection opened there in
    /// between was never driven, and the restarted watchdog renewed over it in vain).
    pub fn runtime_gone(&self) {
        if let Some(a) = &self.0 {
            a.alive.store(false, Ordering::Release);
        }
    }

    /// Where to spawn background work now. The process runtime is looked up at each use, so
    /// a forked child uses its own.
    pub fn handle(&self) -> Handle {
        match &self.0 {
            Some(a) if a.alive.load(Ordering::Acquire) => a.handle.clone(),
            _ => super::runtime().handle().clone(),
        }
    }

    /// `work` polled inside this home's runtime context, so that what it spawns or registers
    /// (a connection's driver task, its socket) lives there and not on the caller's runtime.
    pub async fn within<F: Future>(&self, work: F) -> F::Output {
        let handle = self.handle();
        let mut work = std::pin::pin!(work);
        std::future::poll_fn(|cx| {
            let _inside = handle.enter();
            work.as_mut().poll(cx)
        })
        .await
    }

    /// `work`, polled inside this home's runtime whenever its caller polls it from no tokio
    /// runtime (another executor: `futures::executor::block_on`, smol): the core's timers and
    /// sockets need one, and tokio panicked without it ("there is no reactor running"). A
    /// caller on a tokio runtime polls it there, as before.
    pub async fn on_any_executor<F: Future>(&self, work: F) -> F::Output {
        let mut work = std::pin::pin!(work);
        std::future::poll_fn(|cx| {
            let handle;
            let _inside = match Handle::try_current() {
                Ok(_) => None,
                Err(_) => {
                    handle = self.handle();
                    Some(handle.enter())
                }
            };
            work.as_mut().poll(cx)
        })
        .await
    }
}
