//! `ferrolock._ferrolock._Manager`: a `ferrolock::host::Manager` and the default of the
//! Python-only `interrupt` option. `ferrolock.LockManager` wraps it.

use std::cell::RefCell;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferrolock::host;
use ferrolock::{ErrorKind, LockOptions};
use pyo3::exceptions::PySystemExit;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::bridge;
use crate::errors::{invalid, to_py};
use crate::lock::PyLock;
use crate::options::{LockArgs, key_str, lock_args, manager_args};

#[pyclass(name = "_Manager", module = "ferrolock._ferrolock", frozen)]
pub struct PyManager {
    host: host::Manager,
    /// Default of the Python-only `interrupt` option.
    interrupt: bool,
}

/// The timeout of `close()` (and of the `with LockManager` exit).
const CLOSE_LIMIT: Duration = Duration::from_secs(5);

thread_local! {
    /// The host managers (`host::Manager::id`) this thread is inside a blocking acquire of,
    /// innermost last. Python runs signal handlers on the waiting thread, inside the acquire
    /// (`bridge::blocking`): a `close()` there must not wait for that very acquire.
    static ACQUIRING_ON: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
    /// The closes such a handler started on threads of their own, by manager: the acquire
    /// joins them before it raises (see `PyManager::close`).
    static CLOSING_UNDER: RefCell<Vec<(usize, JoinHandle<()>)>> = const { RefCell::new(Vec::new()) };
}

/// Marks the calling thread as inside a blocking acquire of manager `id` while it lives.
struct InAcquire(usize);

impl InAcquire {
    fn enter(id: usize) -> InAcquire {
        ACQUIRING_ON.with(|v| v.borrow_mut().push(id));
        InAcquire(id)
    }
}

impl Drop for InAcquire {
    fn drop(&mut self) {
        ACQUIRING_ON.with(|v| {
            let mut v = v.borrow_mut();
            if let Some(i) = v.iter().rposition(|&id| id == self.0) {
                v.remove(i);
            }
        });
    }
}

fn in_acquire_of(id: usize) -> bool {
    ACQUIRING_ON.with(|v| v.borrow().contains(&id))
}

/// Once the calling thread has left its last blocking acquire of manager `id` (or `extend()`
/// or `release()` of one of its locks): waits (GIL released) for the closes of it that a
/// signal handler started meanwhile, so that they have released what they release, and taken
/// back what the ended acquire had taken, before the call returns or raises (an acquire's
/// `NotAcquired`). Each close is bounded by `CLOSE_LIMIT`.
pub(crate) fn join_closes_under(py: Python<'_>, id: usize) {
    if in_acquire_of(id) || crate::lock::in_call_of(id) {
        return;
    }
    let mine: Vec<JoinHandle<()>> = CLOSING_UNDER.with(|v| {
        let mut v = v.borrow_mut();
        let (mine, rest) = v.drain(..).partition(|(m, _)| *m == id);
        *v = rest;
        mine.into_iter().map(|(_, h)| h).collect()
    });
    if !mine.is_empty() {
        bridge::detached(py, || {
            for h in mine {
                let _ = h.join();
            }
        });
    }
}

impl PyManager {
    /// `also`: as `lock_args`'s.
    pub(crate) fn args(
        &self,
        py: Python<'_>,
        key: &str,
        what: &'static str,
        options: Option<&Bound<'_, PyDict>>,
        also: &[&str],
    ) -> PyResult<LockArgs> {
        let (defaults, interrupt) = (self.host.defaults(), self.interrupt);
        lock_args(py, key, what, defaults, interrupt, options, also)
    }

    /// The host manager's identity: one for every `PyManager` around the same shared
    /// manager (each `redlock()` call makes one).
    pub(crate) fn id(&self) -> usize {
        self.host.id()
    }

    /// The servers and databases its nodes reach (`host::Manager::servers`).
    pub(crate) fn servers(&self) -> &str {
        self.host.servers()
    }

    /// Blocking acquire with the GIL released; Ctrl-C stops the wait (nothing is left
    /// behind) and raises `KeyboardInterrupt`. A `close()` of this manager by a signal handler
    /// meanwhile ends it with `NotAcquired`, raised once that close is done.
    pub(crate) fn acquire_blocking(
        &self,
        py: Python<'_>,
        key: &str,
        opts: LockOptions,
        owner: u64,
    ) -> PyResult<PyLock> {
        crate::log::sync_level(py);
        let m = &self.host;
        let inside = InAcquire::enter(m.id());
        let out = bridge::blocking(py, |cancel, check| {
            m.acquire_blocking(key, owner, &opts, cancel, check)
        });
        drop(inside);
        join_closes_under(py, m.id());
        match out? {
            Ok(lock) => {
                // A signal that came as the lock was granted has its handler run here, not at
                // the caller's next line: there its exception (Ctrl-C's) dropped the handle
                // the call returned, released in the background with the warning for a handle
                // collected while held. Raised here, once what it got is given back.
                if let Err(signalled) = py.check_signals() {
                    let cancel = host::Cancel::new();
                    let _ = bridge::detached(py, || lock.release_blocking(&cancel, None));
                    return Err(signalled);
                }
                Ok(PyLock::new(lock))
            }
            Err(e) => Err(quiet_at_exit(py, &e, key, || is_daemon_thread(py))),
        }
    }

    /// A coroutine resolving to a `Lock`. Cancelling its await stops the attempt, and the
    /// `CancelledError` comes once whatever it had taken is given back
    /// (`bridge::spawn_cancellable`).
    pub(crate) fn acquire_future<'py>(
        &self,
        py: Python<'py>,
        key: String,
        opts: LockOptions,
        owner: u64,
    ) -> PyResult<Bound<'py, PyAny>> {
        crate::log::sync_level(py);
        let m = self.host.clone();
        let k = key.clone();
        let start = move |cancel: host::Cancel| async move {
            m.acquire_cancellable(&k, owner, &opts, &cancel).await
        };
        // Asked here, on the loop's thread: the result is made on a library thread.
        let daemon = on_daemon_thread(py);
        bridge::spawn_cancellable(py, start, move |py, out| match out {
            Ok(lock) => Ok(Py::new(py, PyLock::new(lock))?.into_any()),
            Err(e) => Err(quiet_at_exit(py, &e, &key, || daemon)),
        })
    }
}

#[pymethods]
impl PyManager {
    #[new]
    #[pyo3(signature = (nodes = None, options = None))]
    fn new(
        py: Python<'_>,
        nodes: Option<&Bound<'_, PyAny>>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let args = manager_args(py, nodes, options)?;
        crate::log::sync_level(py);
        let host = host::Manager::new(args.options).map_err(|e| to_py(py, &e, None))?;
        Ok(PyManager {
            host,
            interrupt: args.interrupt,
        })
    }

    /// The manager `redlock()` uses for these connection options (`nodes`, `tls_ca`,
    /// `restart_guard`, `sharded_pubsub`): one per distinct setup, shared by every call (`host::shared`).
    #[staticmethod]
    #[pyo3(signature = (options = None))]
    fn shared(py: Python<'_>, options: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let args = manager_args(py, None, options)?;
        crate::log::sync_level(py);
        let host = host::shared(&args.options).map_err(|e| to_py(py, &e, None))?;
        Ok(PyManager {
            host,
            interrupt: true,
        })
    }

    /// How many shared managers this process holds (see `shared`).
    #[staticmethod]
    fn shared_count() -> usize {
        host::shared_count()
    }

    /// The node URLs, passwords redacted.
    #[getter]
    fn nodes(&self) -> Vec<String> {
        self.host.nodes().to_vec()
    }

    #[getter]
    fn quorum(&self) -> usize {
        self.host.quorum()
    }

    #[getter]
    fn closed(&self) -> bool {
        self.host.is_closed()
    }

    /// The manager's default lock options, as Python values (seconds as float).
    fn defaults<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let o = self.host.defaults();
        let secs = |x: Duration| x.as_secs_f64();
        d.set_item("ttl", secs(o.ttl))?;
        d.set_item("wait", o.wait.map(secs))?;
        d.set_item("retry_delay", secs(o.retry_delay))?;
        // None when derived from each lock's ttl: the value it has for the manager's ttl,
        // passed back, would pin it for every ttl (and refuse extends to shorter ones).
        d.set_item("node_timeout", o.node_timeout.map(secs))?;
        d.set_item("drift_factor", o.drift_factor)?;
        d.set_item("watchdog", o.watchdog)?;
        d.set_item("max_hold", o.max_hold.map(secs))?;
        d.set_item("max_extensions", o.max_extensions)?;
        d.set_item("reentrant", o.reentrant)?;
        d.set_item("fencing", o.fencing)?;
        d.set_item("interrupt", self.interrupt)?;
        Ok(d)
    }

    /// Blocking acquire. `owner` is the reentrancy owner id.
    #[pyo3(signature = (key, options, owner))]
    fn acquire(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        options: Option<&Bound<'_, PyDict>>,
        owner: u64,
    ) -> PyResult<PyLock> {
        let key = key_str(py, key, "lock key")?;
        let args = self.args(py, &key, "lock", options, &[])?;
        let (lock, reentrant) = (crate::context::Held::Lock, args.opts.reentrant);
        crate::context::refuse_waiting_for_itself(py, self, &key, lock, reentrant, owner)?;
        self.acquire_blocking(py, &key, args.opts, owner)
    }

    /// Returns a coroutine resolving to a `Lock` (see `acquire_future`).
    #[pyo3(signature = (key, options, owner))]
    fn acquire_async<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        options: Option<&Bound<'py, PyDict>>,
        owner: u64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let key = key_str(py, key, "lock key")?;
        let args = self.args(py, &key, "lock", options, &[])?;
        crate::context::refuse_awaiting_an_enclosing_block(
            py,
            self,
            &key,
            crate::context::Held::Lock,
        )?;
        self.acquire_future(py, key, args.opts, owner)
    }

    /// `host::Manager::release_all`, waiting at most `timeout` (seconds or a timedelta) with
    /// the GIL released.
    #[pyo3(signature = (timeout = None))]
    fn release_all(&self, py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
        let limit = match timeout {
            None => Duration::from_secs(5),
            Some(t) => {
                // Seconds or a timedelta, as every other duration (a bool is not one); an int
                // too large for a float is out of range like any other.
                let secs = if t.is_instance(crate::options::timedelta_type(py)?)? {
                    t.call_method0("total_seconds")?.extract::<f64>().ok()
                } else {
                    (!t.is_instance_of::<pyo3::types::PyBool>()
                        && (t.is_instance_of::<pyo3::types::PyInt>()
                            || t.is_instance_of::<pyo3::types::PyFloat>()))
                    .then(|| t.extract::<f64>().ok())
                    .flatten()
                };
                match secs.map(Duration::try_from_secs_f64) {
                    Some(Ok(limit)) if limit <= ferrolock::MAX_DURATION => limit,
                    // Negative, NaN, infinite, too long or not a number: named, not taken
                    // for some other limit.
                    _ => {
                        // As Python writes it (`nan`, `-1e+30`, `'x'`): the value passed.
                        let shown = t.repr().map(|r| r.to_string()).unwrap_or_default();
                        let ty = t
                            .get_type()
                            .name()
                            .map(|n| n.to_string())
                            .unwrap_or_default();
                        return Err(invalid(
                            py,
                            format!(
                                "release_all timeout={shown} ({ty}): expected seconds (or a datetime.timedelta) from 0 to {} (about 24.8 days)",
                                ferrolock::MAX_DURATION.as_secs_f64()
                            ),
                            None,
                        ));
                    }
                }
            }
        };
        Ok(bridge::detached(py, || self.host.release_all(limit)))
    }

    /// `host::Manager::close`: ends the waits on this manager (`NotAcquired`), releases the
    /// locks still held, then later acquires raise `InvalidArgument`. Idempotent.
    ///
    /// Called by a signal handler that runs inside a blocking acquire of this manager on the
    /// same thread (`bridge::blocking`), it returns once the manager is closed: the host's
    /// close waits for the acquires in progress, and that one cannot end before the handler
    /// returns (it waited out its whole limit, found by a review). So for one inside an
    /// `extend()` or `release()` of a lock of this manager: the close's release of that lock
    /// waits for that call. The close then runs on a thread of its own, which that call joins
    /// before it returns or raises.
    fn close(&self, py: Python<'_>) {
        let id = self.host.id();
        if !in_acquire_of(id) && !crate::lock::in_call_of(id) {
            bridge::detached(py, || self.host.close(CLOSE_LIMIT));
            return;
        }
        if self.host.is_closed() {
            // A close under way waits for this thread's acquire (or call): waiting for it (as a
            // second close does elsewhere) would wait out its whole limit.
            return;
        }
        let host = self.host.clone();
        let spawned = std::thread::Builder::new()
            .name("ferrolock-close".into())
            .spawn(move || host.close(CLOSE_LIMIT));
        let Ok(handle) = spawned else {
            // No thread to be had: close here, waiting out the limit as before.
            bridge::detached(py, || self.host.close(CLOSE_LIMIT));
            return;
        };
        CLOSING_UNDER.with(|v| v.borrow_mut().push((id, handle)));
        // The closed flag is its first step: from then on acquires are refused, and this
        // thread's own acquire (or call) ends as soon as the handler returns.
        bridge::detached(py, || {
            let until = Instant::now() + CLOSE_LIMIT;
            while !self.host.is_closed() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
        });
    }

    fn __repr__(&self) -> String {
        format!(
            "<ferrolock.LockManager nodes={:?} quorum={}{}>",
            self.host.nodes(),
            self.host.quorum(),
            if self.closed() { " closed" } else { "" }
        )
    }
}

/// An acquire's error as Python raises it. A daemon thread waiting at interpreter exit (only
/// the exit handler sets "exiting", once the other threads have joined), blocked or running an
/// event loop, ends quietly: SystemExit, which `threading` ignores (and which leaves the loop),
/// unwinds it (its `finally` blocks run), where a NotAcquired would print a traceback during
/// finalization, or be caught by a retry loop that spins until the process is gone.
fn quiet_at_exit(
    py: Python<'_>,
    e: &ferrolock::Error,
    key: &str,
    daemon: impl FnOnce() -> bool,
) -> PyErr {
    let err = to_py(py, e, Some(key));
    if e.kind() == ErrorKind::NotAcquired && host::is_exiting() && daemon() {
        let exit = PySystemExit::new_err(e.message().to_string());
        exit.set_cause(py, Some(err));
        return exit;
    }
    err
}

thread_local! {
    /// `is_daemon_thread` of this thread, asked once: a thread's daemon flag is fixed once it
    /// runs, and every awaited acquire asks it.
    static DAEMON: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

fn on_daemon_thread(py: Python<'_>) -> bool {
    DAEMON.with(|d| match d.get() {
        Some(daemon) => daemon,
        None => {
            let daemon = is_daemon_thread(py);
            d.set(Some(daemon));
            daemon
        }
    })
}

/// Whether the calling thread is a daemon thread `threading` started (not the main thread,
/// which runs the exit handlers and gets their `NotAcquired`, nor a thread started outside
/// Python, which `threading` calls a daemon too).
fn is_daemon_thread(py: Python<'_>) -> bool {
    let check = || -> PyResult<bool> {
        let threading = py.import("threading")?;
        let current = threading.call_method0("current_thread")?;
        let foreign = current.is_instance(&threading.getattr("_DummyThread")?)?;
        Ok(!foreign && current.getattr("daemon")?.extract::<bool>()?)
    };
    check().unwrap_or(false)
}
