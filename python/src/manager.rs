//! `ferrolock._ferrolock._Manager`: the core `LockManager` plus the bookkeeping a Python
//! process needs (close, release at exit). `ferrolock.LockManager` wraps it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use ferrolock::{ErrorKind, Lock as CoreLock, LockManager, LockOptions, LockStatus};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::bridge;
use crate::errors::to_py;
use crate::lock::PyLock;
use crate::options::{LockArgs, key_str, lock_args, manager_args};

/// The locks a manager handed out, weakly, so `close()` and interpreter exit can release
/// those still held.
#[derive(Default)]
pub(crate) struct Handed {
    locks: Mutex<Vec<Weak<CoreLock>>>,
}

impl Handed {
    pub(crate) fn add(&self, lock: &Arc<CoreLock>) {
        let mut v = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        if v.len() >= 64 && v.len().is_power_of_two() {
            v.retain(|w| w.strong_count() > 0);
        }
        v.push(Arc::downgrade(lock));
    }

    /// The locks not released yet: held ones, and lost ones too, whose token may still stand
    /// on some nodes (a loss deletes nothing) until their ttl. A lost lock that was already
    /// released answers `NotHeld` to another release, without any I/O.
    fn unreleased(&self) -> Vec<Arc<CoreLock>> {
        let mut v = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        v.retain(|w| w.strong_count() > 0);
        v.iter()
            .filter_map(Weak::upgrade)
            .filter(|l| !matches!(l.status(), LockStatus::Released))
            .collect()
    }
}

#[pyclass(name = "_Manager", module = "ferrolock._ferrolock", frozen)]
pub struct PyManager {
    manager: Mutex<Option<LockManager>>,
    defaults: LockOptions,
    /// Default of the Python-only `interrupt` option.
    interrupt: bool,
    handed: Arc<Handed>,
    nodes: Vec<String>,
    quorum: usize,
    pid: u32,
}

/// Set at interpreter exit, before the last locks are released: from then on an acquire
/// that completes releases its lock at once instead of handing it to a thread that may never
/// run again (a daemon thread waiting for the lock that exit just released).
pub(crate) static CLOSING: AtomicBool = AtomicBool::new(false);
/// Wakes the acquires still waiting when `CLOSING` is set: they give up.
static CLOSING_NOW: tokio::sync::Notify = tokio::sync::Notify::const_new();
/// Blocking acquires in progress (counted until their thread is back from the wait, clean-up
/// included): exit lets them end before it releases what is held.
static BLOCKING_ACQUIRES: AtomicUsize = AtomicUsize::new(0);

/// At interpreter exit: every waiting acquire gives up (undoing what it had taken), and this
/// waits (at most `limit`) until the blocking ones are back, so that no grant lands after the
/// last release pass.
pub(crate) fn close_all(py: Python<'_>, limit: Duration) {
    CLOSING.store(true, Ordering::SeqCst);
    CLOSING_NOW.notify_waiters();
    bridge::wait_for_zero(py, &BLOCKING_ACQUIRES, limit);
}

/// Resolves once the interpreter is exiting.
async fn closing() {
    let notified = CLOSING_NOW.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    if !CLOSING.load(Ordering::SeqCst) {
        notified.await;
    }
}

struct BlockingAcquire;

impl BlockingAcquire {
    fn enter() -> BlockingAcquire {
        BLOCKING_ACQUIRES.fetch_add(1, Ordering::SeqCst);
        BlockingAcquire
    }
}

impl Drop for BlockingAcquire {
    fn drop(&mut self) {
        BLOCKING_ACQUIRES.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Acquires with an owner id: the reentrancy owner (the calling thread for sync code, the
/// current asyncio task for async code; see `ferrolock/_owner.py`). The core ignores it
/// unless `opts.reentrant`. The lock is registered with the manager (for `close()` and exit)
/// on the runtime, before any Python code runs.
pub(crate) async fn acquire_owned(
    manager: LockManager,
    handed: Arc<Handed>,
    key: String,
    opts: LockOptions,
    owner: u64,
) -> ferrolock::Result<Arc<CoreLock>> {
    let exiting = || {
        ferrolock::Error::new(
            ErrorKind::NotAcquired,
            format!("lock {key:?} not acquired: the interpreter is exiting"),
        )
    };
    let lock = tokio::select! {
        lock = manager.acquire_owned(&key, owner, &opts) => Arc::new(lock?),
        // Dropping the acquire undoes whatever it had taken.
        _ = closing() => return Err(exiting()),
    };
    handed.add(&lock);
    if CLOSING.load(Ordering::SeqCst) {
        let _ = lock.release().await;
        return Err(exiting());
    }
    Ok(lock)
}

impl PyManager {
    pub(crate) fn core(&self, py: Python<'_>) -> PyResult<LockManager> {
        let m = self.manager.lock().unwrap_or_else(|p| p.into_inner());
        m.clone()
            .ok_or_else(|| crate::errors::invalid(py, "this LockManager is closed", None))
    }

    pub(crate) fn args(
        &self,
        py: Python<'_>,
        key: &str,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<LockArgs> {
        lock_args(py, key, &self.defaults, self.interrupt, options)
    }

    /// Blocking acquire with the GIL released; Ctrl-C drops the attempt (the core releases
    /// whatever it had taken).
    pub(crate) fn acquire_blocking(
        &self,
        py: Python<'_>,
        key: &str,
        opts: LockOptions,
        owner: u64,
    ) -> PyResult<PyLock> {
        let manager = self.core(py)?;
        let fut = acquire_owned(manager, self.handed.clone(), key.to_string(), opts, owner);
        let in_progress = BlockingAcquire::enter();
        let waited = bridge::wait(py, fut);
        drop(in_progress);
        let core = waited?.map_err(|e| to_py(py, &e, Some(key)))?;
        Ok(PyLock::new(core, owner))
    }

    pub(crate) fn acquire_future<'py>(
        &self,
        py: Python<'py>,
        key: String,
        opts: LockOptions,
        owner: u64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let manager = self.core(py)?;
        let fut = acquire_owned(manager, self.handed.clone(), key.clone(), opts, owner);
        bridge::spawn(py, fut, true, move |py, out| match out {
            Ok(core) => Ok(Py::new(py, PyLock::new(core, owner))?.into_any()),
            Err(e) => Err(to_py(py, &e, Some(&key))),
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
        let defaults = args.options.lock.clone();
        let manager = LockManager::new(args.options).map_err(|e| to_py(py, &e, None))?;
        Ok(PyManager {
            nodes: manager.node_names(),
            quorum: manager.quorum(),
            manager: Mutex::new(Some(manager)),
            defaults,
            interrupt: args.interrupt,
            handed: Arc::default(),
            pid: std::process::id(),
        })
    }

    /// The node URLs, passwords redacted.
    #[getter]
    fn nodes(&self) -> Vec<String> {
        self.nodes.clone()
    }

    #[getter]
    fn quorum(&self) -> usize {
        self.quorum
    }

    #[getter]
    fn closed(&self) -> bool {
        self.manager
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    /// The manager's default lock options, as Python values (seconds as float).
    fn defaults<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let o = &self.defaults;
        let secs = |x: Duration| x.as_secs_f64();
        d.set_item("ttl", secs(o.ttl))?;
        d.set_item("wait", o.wait.map(secs))?;
        d.set_item("retry_delay", secs(o.retry_delay))?;
        d.set_item("node_timeout", secs(o.effective_node_timeout()))?;
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
        let key = key_str(py, key)?;
        let args = self.args(py, &key, options)?;
        self.acquire_blocking(py, &key, args.opts, owner)
    }

    /// Returns an `asyncio.Future` resolving to a `Lock`. Cancelling it abandons the attempt
    /// (whatever was taken is released).
    #[pyo3(signature = (key, options, owner))]
    fn acquire_async<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        options: Option<&Bound<'py, PyDict>>,
        owner: u64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let key = key_str(py, key)?;
        let args = self.args(py, &key, options)?;
        self.acquire_future(py, key, args.opts, owner)
    }

    /// Releases every lock from this manager that this process has not released, lost ones
    /// included (their token may still stand on some nodes), waiting at most `timeout`
    /// seconds. Returns how many were released on a quorum. Also tells at once the
    /// waiters of keys this manager released quietly a moment ago (a worker loop that just
    /// ended: see the core's `flush_quiet_releases`), as this runs before close and at exit.
    #[pyo3(signature = (timeout = 5.0))]
    fn release_all(&self, py: Python<'_>, timeout: f64) -> PyResult<usize> {
        if self.pid != std::process::id() {
            return Ok(0);
        }
        let Ok(manager) = self.core(py) else {
            return Ok(0);
        };
        let held = self.handed.unreleased();
        let limit = Duration::try_from_secs_f64(timeout).unwrap_or(Duration::from_secs(5));
        let done = bridge::wait_at_most(py, limit, async move {
            let all = held.iter().map(|l| l.release());
            let released = futures::future::join_all(all).await;
            manager.flush_quiet_releases().await;
            released
        })?;
        Ok(done
            .map(|results| results.iter().filter(|r| matches!(r, Ok(true))).count())
            .unwrap_or(0))
    }

    /// Releases the locks still held (see `release_all`) and drops the connections. Later
    /// acquires raise `InvalidArgument`. Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if self.closed() {
            return Ok(());
        }
        self.release_all(py, 5.0)?;
        let taken = self
            .manager
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        drop(taken);
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!(
            "<ferrolock.LockManager nodes={:?} quorum={}{}>",
            self.nodes,
            self.quorum,
            if self.closed() { " closed" } else { "" }
        )
    }
}
