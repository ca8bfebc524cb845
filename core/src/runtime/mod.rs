//! The runtimes ferrolock runs on when its caller has none (the Python, C and CLI surfaces).
//!
//! - One lazily created multi-thread runtime per process runs the background work: the
//!   watchdog, the waiters' pub/sub connections, asyncio-facing tasks, multi-node attempts.
//!   It has one worker thread unless `FERROLOCK_WORKER_THREADS` asks for more: a second
//!   worker is woken to steal nearly every task the first one schedules (a request handed to
//!   a connection's task, its reply handed back), which doubled the context switches of a
//!   5-node acquire + release and cost 11-28 % of its throughput, and nothing this library
//!   runs on a worker blocks (user callbacks run on the blocking pool; a C log callback must
//!   return quickly, as its header says). See DESIGN.md, "Blocking callers".
//! - A thread that blocks on a lock operation ([`block_on`]) drives it on a current-thread
//!   runtime of its own, with connections of its own (one per node, opened on first use): the
//!   calling thread writes the request, waits in `epoll_wait` and reads the reply itself, as a
//!   synchronous client does, instead of handing each request to a worker thread and waking
//!   the caller back (see DESIGN.md, "Blocking callers", and docs/decisions/).
//!
//! A forked child gets fresh runtimes: the parent's worker threads do not exist in the child,
//! so the inherited runtimes are leaked there, never dropped (dropping would try to join
//! threads that are gone, or close the parent's epoll registrations).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::rc::Rc;
use std::sync::Once;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

use tokio::runtime::{Builder, Handle, Runtime};
use tokio::task::JoinHandle;

/// Reply polling for blocking callers: only `block_on` drives it, and only a request's
/// `Awaiting` feeds it.
mod spin;

#[doc(hidden)]
pub use spin::__polled_requests;
pub(crate) use spin::Awaiting;

/// Background work counted until it ends (`spawn_cleanup`'s, and the tasks a dropped lock or
/// waiter starts), for `close` and exit to wait for.
mod pending;

pub(crate) use pending::{Pending, settled};

static RUNTIME: AtomicPtr<Runtime> = AtomicPtr::new(std::ptr::null_mut());
static ATFORK: Once = Once::new();

/// This process's id, cached: `std::process::id()` is a system call, and the hot paths ask
/// for it several times per lock. Zero means "not read yet"; the fork child handler resets it.
static PID: AtomicU32 = AtomicU32::new(0);

extern "C" fn forget_runtime_in_child() {
    RUNTIME.store(std::ptr::null_mut(), Ordering::SeqCst);
    PID.store(0, Ordering::SeqCst);
}

fn register_atfork() {
    ATFORK.call_once(|| {
        // SAFETY: registers a handler that only stores into atomics, which is
        // async-signal-safe as a fork child handler must be.
        unsafe {
            libc::pthread_atfork(None, None, Some(forget_runtime_in_child));
        }
    });
}

/// The current process id, correct in a forked child.
pub(crate) fn pid() -> u32 {
    match PID.load(Ordering::Relaxed) {
        0 => {
            register_atfork();
            let pid = std::process::id();
            PID.store(pid, Ordering::Relaxed);
            pid
        }
        pid => pid,
    }
}

/// The process-wide runtime, created on first use (and again in a forked child).
pub fn runtime() -> &'static Runtime {
    register_atfork();
    let current = RUNTIME.load(Ordering::Acquire);
    if !current.is_null() {
        // SAFETY: a published runtime is never freed (see the module comment).
        return unsafe { &*current };
    }
    let workers = parse_workers(std::env::var("FERROLOCK_WORKER_THREADS").ok());
    let fresh = Box::into_raw(Box::new(
        Builder::new_multi_thread()
            .worker_threads(*workers.as_ref().unwrap_or(&1))
            .thread_name("ferrolock")
            .enable_all()
            .build()
            .expect(
                "cannot start the ferrolock tokio runtime (out of threads or file descriptors?)",
            ),
    ));
    match RUNTIME.compare_exchange(
        std::ptr::null_mut(),
        fresh,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        Ok(_) => {
            if let Err(why) = workers {
                // Only now: a log sink may itself need the runtime (Python's drains on it),
                // and would otherwise build another one while this one is being built.
                tracing::warn!("{why}");
            }
            // SAFETY: just published; never freed.
            unsafe { &*fresh }
        }
        Err(winner) => {
            // Another thread won the race; ours never ran a task.
            // SAFETY: `fresh` came from Box::into_raw above and was never shared.
            unsafe { Box::from_raw(fresh) }.shutdown_background();
            // SAFETY: published by the winner; never freed.
            unsafe { &*winner }
        }
    }
}

/// `FERROLOCK_WORKER_THREADS` is capped at this: more workers than CPUs only wake each other.
const MAX_WORKERS: usize = 64;

/// The process runtime's worker threads, from `FERROLOCK_WORKER_THREADS` (unset: 1, see the
/// module comment); `Err` says why a value is refused (one worker then).
fn parse_workers(value: Option<String>) -> Result<usize, String> {
    let Some(value) = value else {
        return Ok(1);
    };
    match value.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_WORKERS).contains(&n) => Ok(n),
        _ => Err(format!(
            "FERROLOCK_WORKER_THREADS={value:?} is not a whole number from 1 to {MAX_WORKERS}; \
             running one worker thread"
        )),
    }
}

/// The handle to spawn background work on: the caller's runtime when there is one, else the
/// process runtime (never a blocking caller's own runtime: that one only runs while its
/// thread is inside [`block_on`]).
pub fn handle() -> Handle {
    ambient().unwrap_or_else(|| runtime().handle().clone())
}

/// The runtime the caller is running in, unless it is a blocking caller's own runtime.
pub(crate) fn ambient() -> Option<Handle> {
    if driving_locally() {
        return None;
    }
    Handle::try_current().ok()
}

/// A blocking caller's runtime, and the process it was made in.
struct Caller {
    rt: Rc<Runtime>,
    pid: u32,
}

impl Drop for Caller {
    fn drop(&mut self) {
        if self.pid != pid() {
            // Inherited across fork: its epoll instance is shared with the parent's.
            std::mem::forget(self.rt.clone());
        }
    }
}

thread_local! {
    static CALLER: RefCell<Option<Caller>> = const { RefCell::new(None) };
    /// How deep this thread is in [`block_on`]: non-zero while it drives its own runtime.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// Clean-up spawned on this thread's runtime (undo, a release finishing after its caller
    /// left), finished before [`block_on`] returns.
    static CLEANUP: RefCell<Vec<JoinHandle<()>>> = const { RefCell::new(Vec::new()) };
}

/// Whether this thread is inside [`block_on`], so that requests use its own connections.
pub(crate) fn driving_locally() -> bool {
    DEPTH.try_with(|d| d.get() > 0).unwrap_or(false)
}

fn caller_runtime() -> Rc<Runtime> {
    CALLER.with(|c| {
        let mut c = c.borrow_mut();
        if let Some(caller) = c.as_ref().filter(|caller| caller.pid == pid()) {
            return caller.rt.clone();
        }
        let rt =
            Rc::new(Builder::new_current_thread().enable_all().build().expect(
                "cannot start a ferrolock runtime for this thread (out of file descriptors?)",
            ));
        // Replacing an inherited runtime leaks it (see `Caller::drop`), and whatever was
        // spawned on it.
        CLEANUP.with(|pending| std::mem::forget(std::mem::take(&mut *pending.borrow_mut())));
        *c = Some(Caller {
            rt: rt.clone(),
            pid: pid(),
        });
        rt
    })
}

/// Leaves the depth as it was, also when the future panics.
struct Depth;

impl Depth {
    fn enter() -> Depth {
        DEPTH.with(|d| d.set(d.get() + 1));
        Depth
    }
}

impl Drop for Depth {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
    }
}

/// Runs a future to completion on the calling thread, which must not be inside an async
/// runtime. The thread drives the future's I/O itself (see the module comment), then finishes
/// any clean-up the future left behind before returning.
///
/// # Panics
/// When called from async code (inside a tokio runtime): await the future instead.
pub fn block_on<F: Future>(future: F) -> F::Output {
    assert!(
        Handle::try_current().is_err(),
        "ferrolock::runtime::block_on called from async code: await the future instead"
    );
    let rt = caller_runtime();
    let _depth = Depth::enter();
    let out = rt.block_on(spin::polling(future));
    finish_cleanup(&rt);
    out
}

/// Runs the clean-up spawned on this thread's runtime to its end (each piece is bounded by
/// the node timeout).
fn finish_cleanup(rt: &Runtime) {
    loop {
        let pending = CLEANUP.with(|c| std::mem::take(&mut *c.borrow_mut()));
        if pending.is_empty() {
            return;
        }
        rt.block_on(spin::polling(async {
            for task in pending {
                let _ = task.await;
            }
        }));
    }
}

/// Starts work that must finish even though its caller is gone (undoing a partial grant,
/// completing a release): on `handle` normally; on a blocking caller's thread, on that
/// thread's own runtime, because it must use the connections the caller's requests went out
/// on (a request and its undo on one connection execute in that order), and before the
/// caller's thread is handed back (nothing else would drive it). Counted until it ends
/// (`Pending`).
pub(crate) fn spawn_cleanup<F>(handle: &Handle, work: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let pending = Pending::start();
    let work = async move {
        work.await;
        drop(pending);
    };
    if driving_locally() {
        let task = tokio::spawn(work);
        CLEANUP.with(|c| c.borrow_mut().push(task));
        return;
    }
    let own = Handle::try_current().is_err()
        && CALLER
            .try_with(|c| {
                c.borrow()
                    .as_ref()
                    .is_some_and(|caller| caller.pid == pid())
            })
            .unwrap_or(false);
    if own {
        // Dropped outside `block_on` (an interrupted blocking wait) by a thread that drove it.
        block_on(work);
    } else {
        drop(handle.spawn(work));
    }
}

pub(crate) fn install_crypto_provider() {
    // Err only means a provider is already installed (by us or by the application).
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    use super::parse_workers;

    #[test]
    fn worker_threads_default_to_one_and_refuse_what_is_not_1_to_64() {
        assert_eq!(parse_workers(None), Ok(1));
        assert_eq!(parse_workers(Some(" 3 ".into())), Ok(3));
        assert_eq!(parse_workers(Some("64".into())), Ok(64));
        for bad in ["0", "65", "-1", "two", "", "1.5"] {
            let why = parse_workers(Some(bad.into())).unwrap_err();
            assert!(why.contains(&format!("{bad:?}")), "{why}");
        }
    }

    #[test]
    fn the_process_runtime_has_the_workers_asked_for() {
        let asked = parse_workers(std::env::var("FERROLOCK_WORKER_THREADS").ok()).unwrap_or(1);
        assert_eq!(super::runtime().metrics().num_workers(), asked);
    }
}
