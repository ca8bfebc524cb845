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
//! - The blocking pool's threads carry the process runtime's context, yet what runs there is
//!   synchronous: a binding's loss or completion callback, which may call back in, blocking.
//!   [`block_on`] is allowed there (tokio's own `block_on` is too: only a thread running
//!   async tasks is refused); the workers mark themselves at their first park, which comes
//!   before the runtime is handed out, so before any task can run on them.
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
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, Once};

use tokio::runtime::{Builder, Handle, Runtime};
use tokio::task::JoinHandle;

/// Reply polling for blocking callers: only `block_on` drives it, and only a request's
/// `Awaiting` feeds it.
mod spin;

pub(crate) use spin::Awaiting;
#[doc(hidden)]
pub use spin::{__polled_requests, AwaitedCalls};

/// Calls handed in from outside the runtime (Node's promises), polled in one task.
mod batch;

pub use batch::CallBatch;

/// Blocking callers' own runtimes and connections, and their closing while idle.
pub(crate) mod caller;

/// Background work counted until it ends (`spawn_cleanup`'s, and the tasks a dropped lock or
/// waiter starts), for `close` and exit to wait for.
mod pending;

pub(crate) use pending::{Pending, settled};

/// Where a manager's background work and shared connections live.
mod home;

pub(crate) use home::Home;

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
    let worker_count = *workers.as_ref().unwrap_or(&1);
    let started = Arc::new(WorkersStarted::default());
    let parked = started.clone();
    let built = Builder::new_multi_thread()
        .worker_threads(worker_count)
        .thread_name("ferrolock")
        .on_thread_start(|| LIBRARY_THREAD.with(|t| t.set(true)))
        // Only workers park (the blocking pool's threads wait otherwise): the first park
        // marks the thread as a worker.
        .on_thread_park(move || parked.mark_worker())
        .enable_all()
        .build()
        .expect("cannot start the ferrolock tokio runtime (out of threads or file descriptors?)");
    // A worker unmarked yet would be taken for a blocking-pool thread (tokio runs its workers
    // on that pool, so neither the thread's name nor its start tells them apart). Nothing can
    // be queued before the runtime is handed out, so each worker parks, and marks itself,
    // before any task reaches it.
    started.wait_for(worker_count);
    let fresh = Box::into_raw(Box::new(built));
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

/// How many of a new runtime's workers have marked themselves (see [`runtime`]).
#[derive(Default)]
struct WorkersStarted {
    count: Mutex<usize>,
    changed: Condvar,
}

impl WorkersStarted {
    /// Called on every park of a worker: marks the thread on the first.
    fn mark_worker(&self) {
        if WORKER_THREAD.with(|w| w.replace(true)) {
            return;
        }
        *self.count.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        self.changed.notify_all();
    }

    fn wait_for(&self, workers: usize) {
        let mut count = self.count.lock().unwrap_or_else(|p| p.into_inner());
        while *count < workers {
            count = self.changed.wait(count).unwrap_or_else(|p| p.into_inner());
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

thread_local! {
    /// How deep this thread is in [`block_on`]: non-zero while it drives its own runtime.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// Set on every thread of the process runtime (workers and blocking pool). Tokio gives
    /// the blocking pool's threads the runtime's context (`Handle::try_current` succeeds
    /// there) although what they run is plain synchronous code, a binding's callback, which
    /// may block on a lock operation.
    static LIBRARY_THREAD: Cell<bool> = const { Cell::new(false) };
    /// Set on the process runtime's workers, before any task can run on them.
    static WORKER_THREAD: Cell<bool> = const { Cell::new(false) };
    /// Clean-up spawned on this thread's runtime (undo, a release finishing after its caller
    /// left), finished before [`block_on`] returns.
    static CLEANUP: RefCell<Vec<JoinHandle<()>>> = const { RefCell::new(Vec::new()) };
    /// While a cancelled call's future is dropped on this thread (`collect_cleanup`): the
    /// clean-up its drop started on a runtime's workers, which the call waits for before it
    /// reports the cancel.
    static COLLECTING: RefCell<Option<Vec<JoinHandle<()>>>> = const { RefCell::new(None) };
}

/// Runs `drop_it` (the drop of a cancelled call's future) and returns the clean-up tasks it
/// started on a runtime's workers (`spawn_cleanup`, a waiter leaving the server queue).
/// Clean-up started on a blocking caller's own runtime is not among them: [`block_on`]
/// finishes that itself.
pub(crate) fn collect_cleanup(drop_it: impl FnOnce()) -> Vec<JoinHandle<()>> {
    /// Puts back the collector of an enclosing call, also when the drop panics.
    struct Restore(Option<Vec<JoinHandle<()>>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0.take();
            let _ = COLLECTING.try_with(|c| *c.borrow_mut() = outer);
        }
    }
    let restore = Restore(COLLECTING.with(|c| c.replace(Some(Vec::new()))));
    drop_it();
    let tasks = COLLECTING.with(|c| c.borrow_mut().take());
    drop(restore);
    tasks.unwrap_or_default()
}

/// Hands a clean-up task just spawned on a runtime's workers to the cancelled call dropping
/// its future on this thread, if any (see [`collect_cleanup`]); otherwise it runs on alone.
pub(crate) fn started_cleanup(task: JoinHandle<()>) {
    let _ = COLLECTING.try_with(|c| {
        if let Some(tasks) = c.borrow_mut().as_mut() {
            tasks.push(task);
        }
    });
}

/// Whether this thread is inside [`block_on`], so that requests use its own connections.
pub(crate) fn driving_locally() -> bool {
    DEPTH.try_with(|d| d.get() > 0).unwrap_or(false)
}

/// Whether this thread is one of the process runtime's (a worker or a blocking-pool thread):
/// a binding that keeps the library silent routes what happens there (a panic) to its log.
pub fn is_library_thread() -> bool {
    LIBRARY_THREAD.try_with(Cell::get).unwrap_or(false)
}

/// Whether this thread runs async code, where [`block_on`] must not be called: inside
/// [`block_on`], or in a runtime's context, except on the process runtime's blocking pool
/// (its threads carry the context, but run the callbacks, synchronous code that may block).
pub(crate) fn in_async_code() -> bool {
    let pool = is_library_thread() && !WORKER_THREAD.try_with(Cell::get).unwrap_or(false);
    driving_locally() || (Handle::try_current().is_ok() && !pool)
}

/// Forgets the clean-up spawned on an inherited runtime, which is leaked with it (see
/// `caller::Caller`'s drop).
fn forget_inherited_cleanup() {
    CLEANUP.with(|pending| std::mem::forget(std::mem::take(&mut *pending.borrow_mut())));
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

/// Runs a future to completion on the calling thread, which must not run async code (see
/// [`in_async_code`]; the callbacks the host runs on the process runtime's blocking pool may
/// call it). The thread drives the future's I/O itself (see the module comment), then
/// finishes any clean-up the future left behind before returning.
///
/// # Panics
/// When called from async code (inside a tokio runtime): await the future instead.
pub fn block_on<F: Future>(future: F) -> F::Output {
    assert!(
        !in_async_code(),
        "ferrolock::runtime::block_on called from async code: await the future instead"
    );
    let (rt, _busy) = caller::enter();
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
    let own = !in_async_code() && caller::has_runtime();
    if own {
        // Dropped outside `block_on` (an interrupted blocking wait) by a thread that drove it.
        block_on(work);
    } else {
        started_cleanup(handle.spawn(work));
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
    fn the_blocking_pool_may_block_on_and_a_worker_may_not() {
        let rt = super::runtime();
        let on_pool = rt
            .block_on(rt.spawn_blocking(|| (super::in_async_code(), super::block_on(async { 7 }))))
            .unwrap();
        assert_eq!(on_pool, (false, 7));
        let on_worker = rt.block_on(rt.spawn(async { super::in_async_code() }));
        assert!(on_worker.unwrap());
        assert!(!super::in_async_code(), "a plain thread");
    }

    #[test]
    fn the_process_runtime_has_the_workers_asked_for() {
        let asked = parse_workers(std::env::var("FERROLOCK_WORKER_THREADS").ok()).unwrap_or(1);
        assert_eq!(super::runtime().metrics().num_workers(), asked);
    }
}
