//! The `with` half of `ferrolock.LockContext` (the `async with` half is Python, in
//! `ferrolock/__init__.py`).
//!
//! `__exit__` is implemented here, in Rust, on purpose: a lock-lost exception injected into the
//! entering thread (`PyThreadState_SetAsyncExc`) fires at the next bytecode boundary, and a
//! Python-level `__exit__` has one at its very first instruction, where the injection would
//! abort the release. A C-level `__exit__` clears a pending injection before any bytecode
//! runs, under the GIL, so the watchdog's callback (which also holds the GIL) cannot race it.

use std::os::raw::c_long;
use std::sync::{Arc, Mutex, MutexGuard};

use ferrolock::{ErrorKind, LockOptions, LockStatus};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::bridge;
use crate::errors::{injected_class, make, to_py};
use crate::lock::PyLock;
use crate::manager::PyManager;
use crate::options::key_str;

#[derive(Default)]
struct State {
    lock: Option<Py<PyLock>>,
    entered: bool,
    /// Bumped on every enter and exit, so a late loss signal of an earlier use is ignored.
    generation: u64,
    /// `PyThread_get_thread_ident()` of the thread that entered.
    thread: u64,
    in_body: bool,
    /// An exception is pending in (or was raised into) the entering thread.
    injected: bool,
    lost: Option<String>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Called with the GIL held, from a blocking-pool thread, when the watchdog declares
    /// the lock lost.
    fn on_lost(&self, py: Python<'_>, generation: u64, reason: String, interrupt: bool) {
        // (The core logs the loss itself, as a warning on the "ferrolock" logger.)
        let mut st = self.state();
        if st.generation != generation {
            return;
        }
        st.lost = Some(reason);
        if st.in_body
            && interrupt
            && !st.injected
            && let Ok(cls) = injected_class(py)
        {
            // SAFETY: called with the GIL held; `cls` is a live exception class.
            let n =
                unsafe { pyo3::ffi::PyThreadState_SetAsyncExc(st.thread as c_long, cls.as_ptr()) };
            st.injected = n == 1;
        }
    }
}

/// Base class of `ferrolock.LockContext`: `with manager.lock(key) as lock:`.
#[pyclass(
    name = "_LockContextBase",
    module = "ferrolock._ferrolock",
    subclass,
    frozen
)]
pub struct PyLockContext {
    manager: Py<PyManager>,
    key: String,
    opts: LockOptions,
    interrupt: bool,
    shared: Arc<Shared>,
}

fn thread_ident() -> u64 {
    // SAFETY: no preconditions.
    unsafe { pyo3::ffi::PyThread_get_thread_ident() as u64 }
}

impl PyLockContext {
    fn in_use(&self, py: Python<'_>) -> PyErr {
        crate::errors::invalid(
            py,
            format!(
                "lock {:?}: this context is already entered; it can be reused after it exits, but not nested or shared between threads (call manager.lock() again, or use reentrant=True)",
                self.key
            ),
            Some(&self.key),
        )
    }
}

#[pymethods]
impl PyLockContext {
    #[new]
    #[pyo3(signature = (manager, key, options = None))]
    fn new(
        py: Python<'_>,
        manager: Bound<'_, PyManager>,
        key: &Bound<'_, PyAny>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let key = key_str(py, key)?;
        let args = manager.get().args(py, &key, options)?;
        Ok(PyLockContext {
            manager: manager.unbind(),
            key,
            opts: args.opts,
            interrupt: args.interrupt,
            shared: Arc::default(),
        })
    }

    #[getter]
    fn key(&self) -> &str {
        &self.key
    }

    /// Whether a lock lost inside the block interrupts the body (see the README).
    #[getter]
    fn interrupt(&self) -> bool {
        self.interrupt
    }

    /// The held lock while inside the block, else None.
    #[getter]
    fn lock(&self, py: Python<'_>) -> Option<Py<PyLock>> {
        self.shared.state().lock.as_ref().map(|l| l.clone_ref(py))
    }

    fn __enter__(&self, py: Python<'_>) -> PyResult<Py<PyLock>> {
        {
            let mut st = self.shared.state();
            if st.entered {
                return Err(self.in_use(py));
            }
            st.entered = true;
        }
        let owner = crate::lock::current_thread_owner(py);
        let acquired = owner.and_then(|owner| {
            self.manager
                .get()
                .acquire_blocking(py, &self.key, self.opts.clone(), owner)
        });
        let lock = match acquired {
            Ok(l) => Py::new(py, l)?,
            Err(e) => {
                self.shared.state().entered = false;
                return Err(e);
            }
        };
        let generation = {
            let mut st = self.shared.state();
            st.generation += 1;
            st.lock = Some(lock.clone_ref(py));
            st.thread = thread_ident();
            st.in_body = true;
            st.injected = false;
            st.lost = None;
            st.generation
        };
        // Weakly: the core lock keeps this callback, out of sight of Python's garbage
        // collector, and `shared` holds the lock; a strong reference would keep a context
        // dropped inside its block (an ExitStack never closed) and its lock renewed for ever.
        let (shared, interrupt) = (Arc::downgrade(&self.shared), self.interrupt);
        lock.get().lock.on_lost(move |reason| {
            let reason = reason.to_string();
            // Never wait for the GIL where the loss is declared (a runtime worker).
            bridge::with_gil_later(move |py| {
                if let Some(shared) = shared.upgrade() {
                    shared.on_lost(py, generation, reason, interrupt);
                }
            });
        });
        Ok(lock)
    }

    #[pyo3(signature = (_exc_type = None, exc = None, _tb = None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: Option<&Bound<'_, PyAny>>,
        exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        // First, before anything can run bytecode: leave the body and revoke an injection
        // that has not fired yet.
        let (lock, lost) = {
            let mut st = self.shared.state();
            if st.injected {
                // SAFETY: GIL held; NULL clears the thread's pending async exception.
                unsafe {
                    pyo3::ffi::PyThreadState_SetAsyncExc(st.thread as c_long, std::ptr::null_mut())
                };
            }
            st.in_body = false;
            st.entered = false;
            st.generation += 1;
            st.injected = false;
            (st.lock.take(), st.lost.take())
        };
        let Some(lock) = lock else {
            return Ok(false);
        };
        let lock = lock.bind(py).get();
        let exc = exc.filter(|e| !e.is_none());
        let injected = match exc {
            Some(e) => e.is_instance(&injected_class(py)?)?,
            None => false,
        };
        let lost = lost.or_else(|| match lock.lock.status() {
            LockStatus::Lost(r) => Some(r.to_string()),
            _ => None,
        });

        // Released in the body (lock.release()) is fine: nothing left to do.
        let released_already = matches!(lock.lock.status(), LockStatus::Released);
        let released = if lock.in_owner_process() && !released_already {
            let core = lock.lock.clone();
            Some(bridge::wait(py, async move { core.release().await })?)
        } else {
            None
        };

        let is_exception =
            |e: &Bound<'_, PyAny>| e.is_instance_of::<pyo3::exceptions::PyException>();
        if let Some(reason) = lost {
            // KeyboardInterrupt, SystemExit, ... go through; anything else (including the
            // injected placeholder) becomes the full LockLost.
            if let Some(e) = exc
                && !injected
                && !is_exception(e)
            {
                return Ok(false);
            }
            let err = make(py, ErrorKind::LockLost, &reason, Some(&self.key));
            let cause = exc
                .filter(|_| !injected)
                .map(|e| PyErr::from_value(e.clone()));
            err.set_cause(py, cause);
            return Err(err);
        }
        match released {
            None | Some(Ok(true)) => Ok(false),
            Some(Ok(false)) => {
                let msg = format!(
                    "lock {:?} lost: it was no longer held on a quorum when the block exited (expired or taken: did the body outlive the ttl with the watchdog off?)",
                    self.key
                );
                if exc.is_some() {
                    crate::log::python_log(py, 30, &msg);
                    return Ok(false);
                }
                Err(make(py, ErrorKind::LockLost, &msg, Some(&self.key)))
            }
            Some(Err(e)) => {
                if exc.is_some() {
                    crate::log::python_log(
                        py,
                        30,
                        &format!(
                            "while leaving the block after an exception: {}",
                            e.message()
                        ),
                    );
                    return Ok(false);
                }
                Err(to_py(py, &e, Some(&self.key)))
            }
        }
    }

    /// An `asyncio.Future` acquiring this context's lock for `owner` (used by `__aenter__`).
    fn _acquire_async<'py>(&self, py: Python<'py>, owner: u64) -> PyResult<Bound<'py, PyAny>> {
        self.manager
            .get()
            .acquire_future(py, self.key.clone(), self.opts.clone(), owner)
    }

    fn __repr__(&self) -> String {
        format!("<ferrolock.LockContext key={:?}>", self.key)
    }
}
