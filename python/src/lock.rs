//! `ferrolock.Lock`: a held lock. Every method is a conversion around the core's `Lock`.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

use ferrolock::host;
use ferrolock::{Lock as CoreLock, LockStatus};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;

use crate::bridge;
use crate::errors::{invalid, to_py};

/// A lock held on a quorum of nodes. Dropping the last reference while it is held releases it
/// in the background, with a warning (keep the handle until you release it); `release()`
/// releases it now.
#[pyclass(name = "Lock", module = "ferrolock", frozen)]
pub struct PyLock {
    /// The owner it carries is the thread or asyncio task that acquired it (see
    /// `ferrolock._owner`). A forked child's copy is inert (the host and the core see to it).
    pub(crate) lock: host::Lock,
}

thread_local! {
    /// The locks (their core's address) this thread is inside a blocking `extend()` or
    /// `release()` of, with the call's name and the lock's manager (`PyManager::id`). Python
    /// runs signal handlers on the waiting thread, inside the call (`bridge::blocking`); the
    /// call holds the lock's operation mutex, so a second one from such a handler waited for
    /// it for ever (found by a review: a SIGTERM handler releasing its lock during a slow
    /// extend), and a `close()` of its manager for its whole limit (see `PyManager::close`).
    static IN_CALL: RefCell<Vec<(usize, &'static str, usize)>> = const { RefCell::new(Vec::new()) };
}

/// Whether the calling thread is inside a blocking `extend()` or `release()` of a lock of
/// manager `id`.
pub(crate) fn in_call_of(manager: usize) -> bool {
    IN_CALL.with(|v| v.borrow().iter().any(|(_, _, m)| *m == manager))
}

/// Marks the calling thread as inside blocking call `call` of a lock while it lives.
struct InCall(usize);

impl InCall {
    /// Refused while this thread is inside another blocking call of the same lock.
    fn enter(py: Python<'_>, lock: &PyLock, call: &'static str) -> PyResult<InCall> {
        refuse_inside_call(py, &lock.lock, call)?;
        let id = Arc::as_ptr(lock.lock.core()) as usize;
        let manager = lock.lock.manager_id();
        IN_CALL.with(|v| v.borrow_mut().push((id, call, manager)));
        Ok(InCall(id))
    }
}

/// Refuses `call` of `lock` while this thread is inside a blocking `extend()` or `release()`
/// of it (see `IN_CALL`): it would wait for that call for ever.
pub(crate) fn refuse_inside_call(py: Python<'_>, lock: &host::Lock, call: &str) -> PyResult<()> {
    let id = Arc::as_ptr(lock.core()) as usize;
    let outer = IN_CALL.with(|v| {
        let v = v.borrow();
        v.iter().find(|(l, _, _)| *l == id).map(|(_, c, _)| *c)
    });
    let Some(outer) = outer else {
        return Ok(());
    };
    let (what, key) = (lock.what(), lock.key());
    Err(invalid(
        py,
        format!(
            "{what} {shown}: {call}() was called inside this thread's {outer}() of it (by a signal \
             handler run while it waited), which cannot go on before the handler returns: it \
             would wait for it for ever; raise from the handler to end that call (as Ctrl-C \
             does), or call {call}() once it has returned",
            shown = ferrolock::quoted_key(key)
        ),
        Some(key),
    ))
}

impl Drop for InCall {
    fn drop(&mut self) {
        IN_CALL.with(|v| {
            let mut v = v.borrow_mut();
            if let Some(i) = v.iter().rposition(|(l, _, _)| *l == self.0) {
                v.remove(i);
            }
        });
    }
}

/// Whether the calling thread, or its running asyncio task, is `owner`.
pub(crate) fn is_current_owner(py: Python<'_>, owner: u64) -> PyResult<bool> {
    static IS_CURRENT: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    IS_CURRENT
        .import(py, "ferrolock._owner", "is_current")?
        .call1((owner,))?
        .extract()
}

pub(crate) fn current_thread_owner(py: Python<'_>) -> PyResult<u64> {
    static THREAD_OWNER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    THREAD_OWNER
        .import(py, "ferrolock._owner", "thread_owner")?
        .call0()?
        .extract()
}

/// The last Python reference went, and the handle with it (CPython frees at once: the result
/// of `m.acquire(key)` not kept is gone on the same line): a lock still held is released in
/// the background, and the warning says so, as Node's and Go's collectors do.
impl Drop for PyLock {
    fn drop(&mut self) {
        self.lock.collected();
    }
}

impl PyLock {
    pub(crate) fn new(lock: host::Lock) -> PyLock {
        PyLock { lock }
    }

    fn core(&self) -> &CoreLock {
        self.lock.core()
    }

    fn key_str(&self) -> &str {
        self.lock.key()
    }

    fn ttl_arg(&self, py: Python<'_>, ttl: Option<&Bound<'_, PyAny>>) -> PyResult<Duration> {
        match ttl {
            None => Ok(self.core().ttl()),
            Some(v) if v.is_none() => Ok(self.core().ttl()),
            Some(v) => {
                let d = PyDict::new(py);
                d.set_item("ttl", v)?;
                let args = crate::options::lock_args(
                    py,
                    self.key_str(),
                    self.lock.what(),
                    self.core().options(),
                    true,
                    Some(&d),
                    &[],
                )?;
                Ok(args.opts.ttl)
            }
        }
    }
}

#[pymethods]
impl PyLock {
    /// The lock's key.
    #[getter]
    fn key(&self) -> &str {
        self.key_str()
    }

    /// The value stored at the key on each node, unique to this acquisition (for a
    /// reentrant lock, the hash field `<client uuid>:<owner>`).
    #[getter]
    fn token(&self) -> &str {
        self.core().token()
    }

    /// The fencing token of this grant (`fencing=True`), else `None`. Strictly greater than
    /// that of every earlier grant of the key: pass it to the storage you protect.
    #[getter]
    fn fence(&self) -> Option<u64> {
        self.core().fence()
    }

    /// Seconds of validity left (monotonic clock); 0.0 once released, lost or expired.
    #[getter]
    fn validity(&self) -> f64 {
        self.core().validity().as_secs_f64()
    }

    /// `time.monotonic()` value at which the validity ends.
    #[getter]
    fn deadline(&self, py: Python<'_>) -> PyResult<f64> {
        let now: f64 = py.import("time")?.call_method0("monotonic")?.extract()?;
        let (deadline, instant) = (self.core().deadline(), tokio::time::Instant::now());
        Ok(if deadline >= instant {
            now + (deadline - instant).as_secs_f64()
        } else {
            now - (instant - deadline).as_secs_f64()
        })
    }

    /// The lease on each node, in seconds.
    #[getter]
    fn ttl(&self) -> f64 {
        self.core().ttl().as_secs_f64()
    }

    /// `"held"`, `"released"` or `"lost"`.
    #[getter]
    fn status(&self) -> &'static str {
        match self.core().status() {
            LockStatus::Held => "held",
            LockStatus::Released => "released",
            LockStatus::Lost(_) => "lost",
            _ => "unknown",
        }
    }

    /// True once the watchdog declared the lock lost (renewal failed on a quorum, or
    /// `max_hold` reached). Raised as `LockLost` inside `with` blocks; this is for polling.
    #[getter]
    fn lost(&self) -> bool {
        self.lock.loss_reason().is_some()
    }

    /// Why the lock was lost, or None.
    #[getter]
    fn loss_reason(&self) -> Option<String> {
        self.lock.loss_reason().map(|r| r.to_string())
    }

    /// The id of the thread or asyncio task that acquired the lock (see `owned()`).
    #[getter]
    fn owner(&self) -> u64 {
        self.lock.owner()
    }

    /// True while this handle holds the lock and its validity has not ended. No I/O.
    fn locked(&self) -> bool {
        self.core().is_held()
    }

    /// `locked()`, and the caller is the thread (sync code) or asyncio task (async code)
    /// that acquired it. Code in a task runs on a thread too: a lock its sync `with` took is
    /// the thread's, not the task's.
    fn owned(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.locked() && is_current_owner(py, self.lock.owner())?)
    }

    /// Returns None while held; raises `LockLost` (with the reason) once lost or past its
    /// validity, `NotHeld` once released.
    fn check(&self, py: Python<'_>) -> PyResult<()> {
        self.core()
            .check()
            .map_err(|e| to_py(py, &e, Some(self.key_str())))
    }

    /// Renews the lease on every node still holding it (`ttl` seconds from now, when given, is
    /// the new lease) and returns the new validity in seconds. No node's expiry is shortened: a
    /// shorter ttl takes effect there as the longer one runs down. Raises `LockLost`, `NotHeld`
    /// or `QuorumUnreachable`, or `InvalidArgument` past `max_extensions` (the lock still
    /// held). On failure the validity is unchanged.
    #[pyo3(signature = (ttl = None))]
    fn extend(&self, py: Python<'_>, ttl: Option<&Bound<'_, PyAny>>) -> PyResult<f64> {
        let ttl = self.ttl_arg(py, ttl)?;
        let inside = InCall::enter(py, self, "extend")?;
        let lock = &self.lock;
        let out = bridge::blocking(py, |cancel, check| {
            lock.extend_blocking(Some(ttl), cancel, check)
        });
        drop(inside);
        crate::manager::join_closes_under(py, lock.manager_id());
        out?.map(|d| d.as_secs_f64())
            .map_err(|e| to_py(py, &e, Some(self.key_str())))
    }

    /// Releases on every node. Returns True when a quorum still held it, False when it had
    /// already expired or been taken. Raises `NotHeld` if already released, and
    /// `QuorumUnreachable` when no quorum of nodes answered (those keep the key until its ttl).
    fn release(&self, py: Python<'_>) -> PyResult<bool> {
        let inside = InCall::enter(py, self, "release")?;
        let lock = &self.lock;
        let out = bridge::blocking(py, |cancel, check| lock.release_blocking(cancel, check));
        drop(inside);
        crate::manager::join_closes_under(py, lock.manager_id());
        out?.map_err(|e| to_py(py, &e, Some(self.key_str())))
    }

    /// `await lock.extend_async(ttl=None)`: as `extend()`. A bad `ttl` is raised by the await,
    /// as every error of an async method is.
    #[pyo3(signature = (ttl = None))]
    fn extend_async<'py>(
        &self,
        py: Python<'py>,
        ttl: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ttl = match self.ttl_arg(py, ttl) {
            Ok(ttl) => ttl,
            Err(e) => return bridge::failed(py, e),
        };
        let lock = self.lock.clone();
        let key = self.key_str().to_string();
        bridge::spawn_coroutine(
            py,
            async move { lock.extend(Some(ttl)).await },
            true,
            move |py, out| match out {
                Ok(d) => Ok(d.as_secs_f64().into_pyobject(py)?.into_any().unbind()),
                Err(e) => Err(to_py(py, &e, Some(&key))),
            },
        )
    }

    /// `await lock.release_async()`: as `release()`. Cancelling the await does not cancel
    /// the release: it completes in the background.
    fn release_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let lock = self.lock.clone();
        let key = self.key_str().to_string();
        bridge::spawn_coroutine(
            py,
            async move { lock.release().await },
            false,
            move |py, out| match out {
                Ok(b) => Ok(pyo3::types::PyBool::new(py, b)
                    .to_owned()
                    .into_any()
                    .unbind()),
                Err(e) => Err(to_py(py, &e, Some(&key))),
            },
        )
    }

    /// `await lock.wait_lost()`: resolves with the reason once the lock is lost, or None once
    /// it is released. In a forked child, a handle inherited from the parent never resolves:
    /// the lock is the parent's, and the child is not told of it.
    fn wait_lost<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let lost = self.lock.lost();
        bridge::spawn_coroutine(py, lost, true, move |py, out| {
            Ok(out
                .map(|r| r.to_string())
                .into_pyobject(py)?
                .into_any()
                .unbind())
        })
    }

    /// Calls `callback(reason)` if the lock is lost, with the GIL, from a background thread
    /// (`host::Lock::on_lost`): it must be quick and thread-safe (`async with` hands the news
    /// to its loop with `call_soon_threadsafe`). The host keeps the callback where Python's
    /// garbage collector cannot see it: it must reach whatever holds this lock (a block's
    /// state, its task) only weakly, or an abandoned holder is never collected and its lock
    /// is renewed for ever.
    fn _notify_lost(&self, callback: &Bound<'_, PyAny>) {
        let callback = callback.clone().unbind();
        self.lock.on_lost(move |reason| {
            let reason = reason.to_string();
            bridge::attach_if_alive(move |py| {
                let callback = callback.bind(py);
                if let Err(e) = callback.call1((reason,)) {
                    e.write_unraisable(py, Some(callback));
                }
            });
        });
    }

    /// Releases in the background without waiting.
    fn _abandon(&self) {
        self.lock.abandon();
    }

    /// `with manager.acquire(...) as lock:` releases on exit, ending as every scope does
    /// (`host::scope`: a loss raises `LockLost`, and a failed release never hides the body's
    /// own exception), but the body is not interrupted on loss: `manager.lock()` does that.
    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (_exc_type = None, exc = None, _tb = None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: Option<&Bound<'_, PyAny>>,
        exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        refuse_inside_call(py, &self.lock, "__exit__")?;
        let exc = exc.filter(|e| !e.is_none());
        let body = exc.map_or(host::scope::Body::Finished, crate::context::body_of);
        let lock = self.lock.clone();
        let end = bridge::detached(py, || host::scope::end_blocking(&lock, body));
        crate::context::scope_end(py, end, exc, self.key_str())
    }

    fn __repr__(&self) -> String {
        let fence = match self.core().fence() {
            Some(f) => format!(" fence={f}"),
            None => String::new(),
        };
        // Its kind, as its context's repr names it: a read, write or semaphore hold read as a
        // lock's. A plain lock's is the type's own name.
        let kind = host::Kind::of(self.core().options());
        let (word, pool) = crate::context::described(kind);
        let word = match kind {
            host::Kind::Lock => String::new(),
            _ => format!("{word} "),
        };
        format!(
            "<ferrolock.Lock {word}key={:?}{pool} status={} validity={:.3}s{fence}>",
            self.key_str(),
            self.status(),
            self.validity()
        )
    }
}
