//! The Python binding of ferrolock, built by maturin into `ferrolock._ferrolock`.
//!
//! No lock logic lives here: options are converted (`options`), core errors mapped once
//! (`errors`), futures driven from blocking or asyncio callers (`bridge`). The public Python
//! API is assembled in `python/ferrolock/__init__.py`.

mod bridge;
mod context;
mod errors;
mod lock;
mod log;
mod manager;
mod options;

use pyo3::prelude::*;

/// Called at interpreter exit, before the held locks are released: waiting acquires give up,
/// and those that complete from now on release at once.
#[pyfunction]
fn _closing(py: Python<'_>) {
    manager::close_all(py, std::time::Duration::from_secs(2));
}

/// Called at interpreter exit, after held locks were released: from then on no background
/// thread attaches to the interpreter; waits briefly for those attached to leave.
#[pyfunction]
fn _shutdown(py: Python<'_>) {
    bridge::shutdown(py, std::time::Duration::from_secs(2));
}

/// Re-reads the level of the "ferrolock" logger (done at each LockManager creation).
#[pyfunction]
fn _sync_log_level(py: Python<'_>) {
    log::sync_level(py);
}

#[pymodule]
fn _ferrolock(m: &Bound<'_, PyModule>) -> PyResult<()> {
    log::install();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("LOCK_OPTIONS", options::LOCK_OPTIONS.to_vec())?;
    m.add("MANAGER_OPTIONS", options::MANAGER_OPTIONS.to_vec())?;
    m.add_class::<manager::PyManager>()?;
    m.add_class::<lock::PyLock>()?;
    m.add_class::<context::PyLockContext>()?;
    m.add_function(wrap_pyfunction!(_shutdown, m)?)?;
    m.add_function(wrap_pyfunction!(_closing, m)?)?;
    m.add_function(wrap_pyfunction!(_sync_log_level, m)?)?;
    Ok(())
}
