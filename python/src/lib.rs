//! The Python binding of ferrolock, built by maturin into `ferrolock._ferrolock`.
//!
//! No lock logic lives here: it is in the core's host layer (`ferrolock::host`). Options are
//! converted and set through the core's options table (`options`), core errors mapped once
//! (`errors`), the core's metrics read (`metrics`), host calls waited for from blocking or
//! asyncio callers (`bridge`), and the `with` state kept (`context`: the GIL's way of
//! interrupting a thread). The public Python API is assembled in
//! `python/ferrolock/__init__.py`.

mod bridge;
mod context;
mod errors;
mod lock;
mod log;
mod manager;
mod metrics;
mod options;

use pyo3::prelude::*;

/// How long exit may spend releasing what is still held (`host::exit`).
const EXIT_LIMIT: std::time::Duration = std::time::Duration::from_secs(6);

/// The `atexit` hook: runs the host's exit protocol with the GIL released (waiting acquires
/// give up, what is still held is released, bounded in time), then stops background threads
/// from attaching to the finalizing interpreter and waits briefly for those attached.
#[pyfunction]
fn _exit(py: Python<'_>) -> usize {
    let released = py.detach(|| ferrolock::host::exit(EXIT_LIMIT));
    bridge::shutdown(py, std::time::Duration::from_secs(2));
    released
}

/// Re-reads the level of the "ferrolock" logger (done at each LockManager creation).
#[pyfunction]
fn _sync_log_level(py: Python<'_>) {
    log::sync_level(py);
}

/// Panics inside the entry point, for the test that a panic reaches the "ferrolock" logger
/// and not stderr (nothing else in the library panics on purpose). Not part of the API.
#[pyfunction]
fn _panic_for_test() {
    panic!("_panic_for_test was called");
}

/// The library's threads now in (or entering) Python in this process: what the exit waits
/// for. For the fork test (a child must not count its parent's). Not part of the API.
#[pyfunction]
fn _background_calls_for_test() -> usize {
    bridge::background_calls()
}

/// Refuses a subinterpreter. The extension's state is per process, and its threads come back
/// into Python through the GIL-state API, which attaches them to the main interpreter: in a
/// subinterpreter a loss callback, an asyncio result or a log record would run that
/// interpreter's objects under the main one's thread state (a `with` block's loss was raised
/// into the main interpreter's code), and a process whose subinterpreter was still alive at
/// exit hung there. PyO3 checks the interpreter only for a module it builds itself, not for
/// this multi-phase one, so the init checks: the main interpreter's id is 0.
fn refuse_subinterpreter() -> PyResult<()> {
    // SAFETY: module init runs attached to the importing interpreter.
    let id = unsafe { pyo3::ffi::PyInterpreterState_GetID(pyo3::ffi::PyInterpreterState_Get()) };
    if id == 0 {
        return Ok(());
    }
    Err(pyo3::exceptions::PyImportError::new_err(format!(
        "ferrolock cannot be imported in a subinterpreter (this is interpreter {id}): its runtime, \
         registries and background threads belong to the main interpreter; use it from the main \
         interpreter, or from a process of its own"
    )))
}

#[pymodule]
fn _ferrolock(m: &Bound<'_, PyModule>) -> PyResult<()> {
    refuse_subinterpreter()?;
    log::install();
    ferrolock::host::panic_hook::install_for_module();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // The core's error table: (code, number) of every kind, for the check that each Python
    // exception class's `.code` is the core's.
    let codes: Vec<(&str, u32)> = ferrolock::ErrorKind::ALL
        .iter()
        .map(|k| (k.code(), k.number()))
        .collect();
    m.add("ERROR_CODES", codes)?;
    m.add("LOCK_OPTIONS", options::lock_options())?;
    m.add("MANAGER_OPTIONS", options::manager_options())?;
    m.add_class::<manager::PyManager>()?;
    m.add_class::<lock::PyLock>()?;
    m.add_class::<context::PyLockContext>()?;
    m.add_function(wrap_pyfunction!(metrics::snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::prometheus_text, m)?)?;
    m.add_function(wrap_pyfunction!(context::_injected_loss, m)?)?;
    m.add_function(wrap_pyfunction!(_exit, m)?)?;
    m.add_function(wrap_pyfunction!(_sync_log_level, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_for_test, m)?)?;
    m.add_function(wrap_pyfunction!(_background_calls_for_test, m)?)?;
    Ok(())
}
