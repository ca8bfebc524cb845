//! The one place where core errors become Python exceptions. The classes live in
//! `ferrolock/_errors.py` (so `InvalidArgument` can subclass `ValueError` and `TypeError` as
//! well as `LockError`); this module only picks the class by `ErrorKind`.

use ferrolock::{Error, ErrorKind};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

fn module(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    ERRORS
        .get_or_try_init(py, || Ok(py.import("ferrolock._errors")?.unbind()))
        .map(|m| m.bind(py))
}

/// The Python class name of each kind. A kind added to the core later maps to the base
/// class until it gets its own, rather than crashing.
fn class_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::InvalidArgument => "InvalidArgument",
        ErrorKind::NotAcquired => "NotAcquired",
        ErrorKind::NotHeld => "NotHeld",
        ErrorKind::LockLost => "LockLost",
        ErrorKind::QuorumUnreachable => "QuorumUnreachable",
        ErrorKind::Redis => "RedisError",
        _ => "LockError",
    }
}

/// Builds the exception for `kind`, carrying the message and the key (`.key`). A cancelled
/// call is Python's own cancellation: the blocking calls raise the signal handler's exception
/// themselves (`bridge::blocking`) and asyncio raises `CancelledError`; a `Cancelled` that
/// gets here anyway becomes a `KeyboardInterrupt` (`CANCELLED_AS` in `_errors.py`).
pub fn make(py: Python<'_>, kind: ErrorKind, message: &str, key: Option<&str>) -> PyErr {
    if kind == ErrorKind::Cancelled {
        return pyo3::exceptions::PyKeyboardInterrupt::new_err(message.to_string());
    }
    let built = module(py)
        .and_then(|m| m.getattr(class_name(kind)))
        .and_then(|cls| cls.call1((message, key)));
    match built {
        Ok(instance) => PyErr::from_value(instance),
        Err(e) => e,
    }
}

/// A core error as a Python exception.
pub fn to_py(py: Python<'_>, err: &Error, key: Option<&str>) -> PyErr {
    make(py, err.kind(), err.message(), key)
}

pub fn invalid(py: Python<'_>, message: impl AsRef<str>, key: Option<&str>) -> PyErr {
    make(py, ErrorKind::InvalidArgument, message.as_ref(), key)
}

/// The class injected into a thread whose lock was lost (the C API injects a class, not an
/// instance); `__exit__` replaces it with a full `LockLost`.
pub fn injected_class(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    module(py)?.getattr("_InjectedLockLost")
}
