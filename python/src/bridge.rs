//! Waiting on core futures from Python, in both worlds, on ferrolock's own process runtime
//! (reset in a forked child; pyo3-async-runtimes' global runtime could not be).
//!
//! - Blocking: the calling thread runs the host layer's blocking call with the GIL released
//!   and runs Python's signal handlers every `host::CHECK_EVERY`, so Ctrl-C interrupts any
//!   wait promptly (through the call's `host::Cancel`). The thread does the I/O itself, on
//!   connections of its own (one per node), as redis-py does.
//! - asyncio: the future runs as a task on the runtime; its result is handed to the event
//!   loop with `call_soon_threadsafe` from a blocking-pool thread (once the interpreter is
//!   exiting, the loop polls for it: `spawn_polled`). A runtime worker never waits for the
//!   GIL. A cancelled acquire raises `CancelledError` once it has given back what it took
//!   (`spawn_cancellable`).

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferrolock::host::{Cancel, Check, ProcessCount};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyWeakrefReference;
use tokio::task::AbortHandle;

use crate::lock::PyLock;

/// Set at interpreter exit (by `shutdown`): from then on no background thread attaches to
/// the interpreter, and a thread coming back from a wait parks instead of re-taking the GIL.
/// (During finalization CPython ends any thread that takes the GIL with `pthread_exit`, whose
/// forced unwind through Rust frames aborts the process.)
pub static SHUTTING_DOWN: AtomicBool = AtomicBool::new(false);
/// Background threads attached to (or about to attach to) the interpreter, per process: a
/// child forked while a parent's thread was counted (not copied: it never leaves) counts
/// zero, so its exit does not wait for it (found by a review: 2 s at every such child's exit).
static IN_FLIGHT: ProcessCount = ProcessCount::new();
/// The thread that ran `shutdown` (the main thread, at exit): it may still wait afterwards.
static SHUTDOWN_THREAD: AtomicU64 = AtomicU64::new(0);

fn thread_ident() -> u64 {
    // SAFETY: no preconditions.
    unsafe { pyo3::ffi::PyThread_get_thread_ident() as u64 }
}

/// Runs `f` with the GIL from a thread that is not a Python thread, unless the interpreter is
/// exiting. `shutdown` waits for every such call in progress before finalization starts.
pub fn attach_if_alive<F>(f: F)
where
    F: for<'py> FnOnce(Python<'py>),
{
    let counted_in = IN_FLIGHT.enter();
    if !SHUTTING_DOWN.load(Ordering::SeqCst) {
        // SAFETY: reads this thread's GIL-state slot; callable without the GIL.
        let fresh = unsafe { pyo3::ffi::PyGILState_GetThisThreadState() }.is_null();
        Python::try_attach(|py| {
            if fresh {
                KEPT_STATE.with(KeptState::keep);
            }
            f(py)
        });
    }
    IN_FLIGHT.leave(counted_in);
}

/// A library thread keeps the Python thread state its first attach made, until the thread
/// ends. Attaching from a thread without one (`PyGILState_Ensure`) creates a thread state
/// and the matching release deletes it, each under the runtime's thread-list lock, which is
/// taken without the GIL; CPython 3.11's `os.fork()` takes that lock in the child before it
/// resets it, so a child forked while a library thread held it (once per asyncio result, log
/// record or loss callback) hung for ever inside `os.fork()` (found by a review: about one
/// fork in 600 beside two tasks acquiring in a loop). Kept, the lock is taken once when a
/// library thread first attaches and once when it ends.
struct KeptState(std::cell::Cell<bool>);

thread_local! {
    static KEPT_STATE: KeptState = const { KeptState(std::cell::Cell::new(false)) };
}

impl KeptState {
    /// Called attached, by an attach that made this thread's state (a library thread, never
    /// a Python thread, whose state Python deletes itself): one more `PyGILState_Ensure`, so
    /// the attach's own release leaves the thread state in place.
    fn keep(&self) {
        if !self.0.replace(true) {
            // SAFETY: the thread is attached (inside `try_attach`); this only raises the
            // thread state's GIL-state count, undone in `drop`.
            unsafe { pyo3::ffi::PyGILState_Ensure() };
        }
    }
}

impl Drop for KeptState {
    /// The thread ends: deletes its thread state, unless the interpreter is exiting (then it
    /// is finalization's to delete, and the thread must not attach).
    fn drop(&mut self) {
        if !self.0.get() || SHUTTING_DOWN.load(Ordering::SeqCst) {
            return;
        }
        let counted_in = IN_FLIGHT.enter();
        if !SHUTTING_DOWN.load(Ordering::SeqCst) {
            // SAFETY: the kept `PyGILState_Ensure` is still counted: attach with it, undo this
            // attach without releasing the GIL, then undo the kept one, which deletes the
            // thread state and releases the GIL.
            unsafe {
                pyo3::ffi::PyGILState_Ensure();
                pyo3::ffi::PyGILState_Release(pyo3::ffi::PyGILState_STATE::PyGILState_LOCKED);
                pyo3::ffi::PyGILState_Release(pyo3::ffi::PyGILState_STATE::PyGILState_UNLOCKED);
            }
        }
        IN_FLIGHT.leave(counted_in);
    }
}

/// Background threads of this process attached to (or about to attach to) the interpreter.
pub fn background_calls() -> usize {
    IN_FLIGHT.get()
}

/// At exit, after the held locks were released: stops background threads from entering
/// Python and waits (at most `limit`) for those inside to leave.
pub fn shutdown(py: Python<'_>, limit: Duration) {
    SHUTDOWN_THREAD.store(thread_ident(), Ordering::SeqCst);
    SHUTTING_DOWN.store(true, Ordering::SeqCst);
    wait_for_zero(py, &IN_FLIGHT, limit);
}

/// Waits, without the GIL and at most `limit`, until `count` is zero (threads leaving a
/// region that exit must not overlap).
fn wait_for_zero(py: Python<'_>, count: &ProcessCount, limit: Duration) {
    py.detach(|| {
        let deadline = std::time::Instant::now() + limit;
        while count.get() > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}

/// Called without the GIL by a thread about to re-take it: once the interpreter is exiting,
/// any thread but the exiting one parks for good (the process is about to end).
fn park_if_exiting() {
    if SHUTTING_DOWN.load(Ordering::SeqCst)
        && SHUTDOWN_THREAD.load(Ordering::SeqCst) != thread_ident()
    {
        loop {
            std::thread::park();
        }
    }
}

/// Runs `f` with the GIL on a blocking-pool thread of the process runtime: the way back into
/// Python from a runtime task or callback (a worker must never wait for the GIL). Skipped once
/// the interpreter is exiting. Callable from any thread.
pub fn with_gil_later<F>(f: F)
where
    F: for<'py> FnOnce(Python<'py>) + Send + 'static,
{
    drop(ferrolock::runtime::handle().spawn_blocking(move || attach_if_alive(f)));
}

/// Runs a blocking host call (`host::Manager::acquire_blocking`, `host::Lock::release_blocking`,
/// ...) with the GIL released. Every `host::CHECK_EVERY` the waiting thread runs Python's
/// signal handlers; one that raises (`KeyboardInterrupt`) fires the call's cancel token, and
/// its exception is returned instead of the call's `Cancelled` (the host has then undone the
/// acquire, or completed the release).
pub fn blocking<T, C>(py: Python<'_>, call: C) -> PyResult<ferrolock::Result<T>>
where
    T: Send,
    C: FnOnce(&Cancel, Check<'_>) -> ferrolock::Result<T> + Send,
{
    let cancel = Cancel::new();
    let mut raised: Option<PyErr> = None;
    let out = py.detach(|| {
        let mut check = || {
            park_if_exiting();
            if let Some(Err(e)) = Python::try_attach(|py| py.check_signals()) {
                raised = Some(e);
                cancel.cancel();
            }
        };
        let out = call(&cancel, Some(&mut check));
        park_if_exiting();
        out
    });
    match raised {
        Some(interrupted) => Err(interrupted),
        None => Ok(out),
    }
}

/// Runs `f` with the GIL released, for a call that cannot be interrupted (a scope's end, a
/// `release_all`); like [`blocking`], a thread coming back once the interpreter is exiting
/// parks instead of re-taking the GIL.
pub fn detached<T: Send>(py: Python<'_>, f: impl FnOnce() -> T + Send) -> T {
    py.detach(|| {
        let out = f();
        park_if_exiting();
        out
    })
}

/// Wraps an `asyncio.Future` in a coroutine (`ferrolock._aio.wrap`), so public `async`
/// methods return what `async def` methods return.
pub fn coroutine<'py>(py: Python<'py>, future: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    static WRAP: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    WRAP.import(py, "ferrolock._aio", "wrap")?.call1((future,))
}

/// A coroutine that raises `error` once awaited (`ferrolock._aio.fail`): a public `async`
/// method's bad argument, raised where an `async def` method raises it.
pub fn failed<'py>(py: Python<'py>, error: PyErr) -> PyResult<Bound<'py, PyAny>> {
    static FAIL: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    FAIL.import(py, "ferrolock._aio", "fail")?
        .call1((error.into_value(py),))
}

fn get_running_loop(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    static GET_RUNNING_LOOP: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    GET_RUNNING_LOOP
        .import(py, "asyncio", "get_running_loop")?
        .call0()
}

/// Turns a core future into an `asyncio.Future` of the running loop. `convert` builds the
/// Python result (or exception) with the GIL held, off the runtime's workers. With
/// `abort_on_cancel`, cancelling the asyncio future drops the core future (an extend then
/// leaves the deadline; an acquire uses `spawn_cancellable` instead); without, the core future
/// runs to completion regardless.
pub fn spawn<'py, F, T, C>(
    py: Python<'py>,
    fut: F,
    abort_on_cancel: bool,
    convert: C,
) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
    C: for<'a> FnOnce(Python<'a>, T) -> PyResult<Py<PyAny>> + Send + 'static,
{
    let event_loop = get_running_loop(py)?;
    let afut = event_loop.call_method0("create_future")?;
    if SHUTTING_DOWN.load(Ordering::SeqCst) {
        return spawn_polled(event_loop, afut, fut, abort_on_cancel, convert);
    }
    // The future weakly: held strongly from here, it held the task awaiting it, so a task of a
    // closed loop was never collected (an `async with` suspended in it kept its lock renewed
    // for ever, an acquire kept its place in the server queue). Its loop holds it until closed.
    static KEEP: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    KEEP.import(py, "ferrolock._aio", "keep")?
        .call1((&event_loop, &afut))?;
    let fut_ref = PyWeakrefReference::new(&afut)?.unbind();
    let loop_ref = event_loop.unbind();
    let task = ferrolock::runtime::handle().spawn(async move {
        let out = fut.await;
        deliver(loop_ref, fut_ref, out, convert);
    });
    if abort_on_cancel {
        afut.call_method1(
            "add_done_callback",
            (AbortOnCancel {
                task: task.abort_handle(),
            },),
        )?;
    }
    Ok(afut)
}

/// A finished call's result, made into its Python value (or exception) by its `convert`.
type Ready = Box<dyn for<'a> FnOnce(Python<'a>) -> PyResult<Py<PyAny>> + Send>;

/// [`spawn`] for a call started once the interpreter is exiting (an `atexit` handler run after
/// ferrolock's, which `asyncio.run`s): no library thread may enter Python any more, so the
/// result cannot be handed to the loop from one. It waited there for ever, and the process
/// with it (found by a review: an awaited acquire, a timeout around it included, where the
/// blocking one is refused at once). The loop's own thread polls for it instead (`Poll`).
fn spawn_polled<'py, F, T, C>(
    event_loop: Bound<'py, PyAny>,
    afut: Bound<'py, PyAny>,
    fut: F,
    abort_on_cancel: bool,
    convert: C,
) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
    C: for<'a> FnOnce(Python<'a>, T) -> PyResult<Py<PyAny>> + Send + 'static,
{
    let slot: Arc<Mutex<Option<Ready>>> = Arc::default();
    let filled = slot.clone();
    let task = ferrolock::runtime::handle().spawn(async move {
        let out = fut.await;
        let ready: Ready = Box::new(move |py| convert(py, out));
        *filled.lock().unwrap_or_else(|p| p.into_inner()) = Some(ready);
    });
    let poll = Poll {
        slot,
        task: task.abort_handle(),
        abort_on_cancel,
        event_loop: event_loop.clone().unbind(),
        afut: afut.clone().unbind(),
    };
    event_loop.call_method1("call_soon", (poll,))?;
    Ok(afut)
}

/// Called on the event loop until the result of a call started at exit is in (see
/// `spawn_polled`): settles the asyncio future with it, as `deliver` does. A cancelled future
/// that aborts its call (`abort_on_cancel`) stops the polling.
#[pyclass(frozen, module = "ferrolock._ferrolock")]
struct Poll {
    slot: Arc<Mutex<Option<Ready>>>,
    task: AbortHandle,
    abort_on_cancel: bool,
    event_loop: Py<PyAny>,
    afut: Py<PyAny>,
}

/// How often the loop polls for a result at exit.
const POLL_EVERY: f64 = 0.002;

#[pymethods]
impl Poll {
    fn __call__(slf: &Bound<'_, Self>, py: Python<'_>) -> PyResult<()> {
        let this = slf.get();
        let ready = this.slot.lock().unwrap_or_else(|p| p.into_inner()).take();
        let afut = this.afut.bind(py);
        if let Some(ready) = ready {
            let (ok, value) = match ready(py) {
                Ok(v) => (true, v),
                Err(e) => (false, e.into_value(py).into_any()),
            };
            return settle(afut, ok, value.bind(py));
        }
        if this.abort_on_cancel && afut.call_method0("cancelled")?.is_truthy()? {
            this.task.abort();
            return Ok(());
        }
        this.event_loop
            .bind(py)
            .call_method1("call_later", (POLL_EVERY, slf))?;
        Ok(())
    }
}

/// As [`spawn`], wrapped in a coroutine (see [`coroutine`]). Called with no event loop
/// running (`asyncio.run(lock.release_async())`, `loop.run_until_complete(...)`), the work
/// starts when the coroutine first runs, in its loop (`ferrolock._aio.later`): a coroutine
/// may be made before its loop runs, and the future needs that loop.
pub fn spawn_coroutine<'py, F, T, C>(
    py: Python<'py>,
    fut: F,
    abort_on_cancel: bool,
    convert: C,
) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
    C: for<'a> FnOnce(Python<'a>, T) -> PyResult<Py<PyAny>> + Send + 'static,
{
    static LATER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    match get_running_loop(py) {
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyRuntimeError>(py) => {
            let start: StartFn =
                Box::new(move |py| Ok(spawn(py, fut, abort_on_cancel, convert)?.unbind()));
            let deferred = Deferred {
                start: std::sync::Mutex::new(Some(start)),
            };
            LATER
                .import(py, "ferrolock._aio", "later")?
                .call1((deferred,))
        }
        _ => {
            let future = spawn(py, fut, abort_on_cancel, convert)?;
            coroutine(py, future)
        }
    }
}

type StartFn = Box<dyn for<'a> FnOnce(Python<'a>) -> PyResult<Py<PyAny>> + Send>;

/// The start of a call whose coroutine was made with no event loop running: called once, by
/// `ferrolock._aio.later`, inside the loop that runs it.
#[pyclass(frozen, module = "ferrolock._ferrolock")]
struct Deferred {
    start: std::sync::Mutex<Option<StartFn>>,
}

#[pymethods]
impl Deferred {
    fn __call__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let start = self.start.lock().unwrap_or_else(|p| p.into_inner()).take();
        match start {
            Some(start) => start(py),
            None => Err(pyo3::exceptions::PyRuntimeError::new_err(
                "cannot reuse already awaited coroutine",
            )),
        }
    }
}

/// As [`spawn_coroutine`], for a call that cancelling stops (an acquire): `start` builds the
/// future from the call's `Cancel`, and must stop, giving back what it took, once that fires
/// (`host::Manager::acquire_cancellable`). Cancelling the await fires it, and `CancelledError`
/// is raised only once the future has ended, a lock it got first released
/// (`ferrolock._aio.until_undone`): nothing of the call is left on a node that answered.
pub fn spawn_cancellable<'py, F, T, C>(
    py: Python<'py>,
    start: impl FnOnce(Cancel) -> F,
    convert: C,
) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
    C: for<'a> FnOnce(Python<'a>, T) -> PyResult<Py<PyAny>> + Send + 'static,
{
    static UNTIL_UNDONE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let cancel = Cancel::new();
    let future = spawn(py, start(cancel.clone()), false, convert)?;
    UNTIL_UNDONE
        .import(py, "ferrolock._aio", "until_undone")?
        .call1((future, FireCancel { cancel }))
}

/// Hands a finished result to the event loop. Runs on the blocking pool because attaching to
/// the interpreter may wait for the GIL.
fn deliver<T, C>(event_loop: Py<PyAny>, afut: Py<PyWeakrefReference>, out: T, convert: C)
where
    T: Send + 'static,
    C: for<'a> FnOnce(Python<'a>, T) -> PyResult<Py<PyAny>> + Send + 'static,
{
    with_gil_later(move |py| {
        let (ok, value) = match convert(py, out) {
            Ok(v) => (true, v),
            Err(e) => (false, e.into_value(py).into_any()),
        };
        let Some(afut) = afut.bind(py).upgrade() else {
            // Collected with the task awaiting it (its loop closed): nobody will take the lock.
            abandon(value.bind(py));
            return;
        };
        let Ok(settle) = settle_fn(py) else {
            return;
        };
        let scheduled = event_loop
            .bind(py)
            .call_method1("call_soon_threadsafe", (settle, &afut, ok, value.bind(py)));
        if scheduled.is_err() {
            // The loop is closed: nobody will take the lock, so let it go now.
            abandon(value.bind(py));
        }
    });
}

fn abandon(value: &Bound<'_, PyAny>) {
    if let Ok(lock) = value.cast::<PyLock>() {
        lock.get().lock.abandon();
    }
}

fn settle_fn(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    static SETTLE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    SETTLE
        .get_or_try_init(py, || {
            Ok(pyo3::wrap_pyfunction!(settle, py)?.into_any().unbind())
        })
        .map(|f| f.bind(py).clone())
}

/// On the event loop: completes the asyncio future, unless it was cancelled meanwhile, in
/// which case a lock that arrived anyway is released in the background.
#[pyfunction]
fn settle(afut: &Bound<'_, PyAny>, ok: bool, value: &Bound<'_, PyAny>) -> PyResult<()> {
    if afut.call_method0("done")?.is_truthy()? {
        abandon(value);
        return Ok(());
    }
    if ok {
        afut.call_method1("set_result", (value,))?;
    } else {
        afut.call_method1("set_exception", (value,))?;
    }
    Ok(())
}

/// Done-callback of an asyncio future: aborts the runtime task when the future was cancelled.
#[pyclass(frozen, module = "ferrolock._ferrolock")]
struct AbortOnCancel {
    task: AbortHandle,
}

#[pymethods]
impl AbortOnCancel {
    fn __call__(&self, afut: &Bound<'_, PyAny>) -> PyResult<()> {
        if afut.call_method0("cancelled")?.is_truthy()? {
            self.task.abort();
        }
        Ok(())
    }
}

/// Fires a call's `Cancel` when called (`ferrolock._aio.until_undone`, on a cancelled await).
#[pyclass(frozen, module = "ferrolock._ferrolock")]
struct FireCancel {
    cancel: Cancel,
}

#[pymethods]
impl FireCancel {
    fn __call__(&self) {
        self.cancel.cancel();
    }
}
