//! The Node.js binding of ferrolock. It converts values, maps errors and awaits; every piece
//! of lock logic is the core's host layer (`ferrolock::host`). I/O runs on the core's
//! runtime, never on the JavaScript thread nor on napi's runtime.

pub mod completions;
pub mod env;
pub mod errors;
pub mod lock;
pub mod log;
pub mod manager;
pub mod metrics;
pub mod options;
pub mod rt;

/// At load (before any call): the library's panics go to the logger, not stderr
/// (`ferrolock::host::panic_hook`).
#[napi_derive::module_init]
fn init() {
    ferrolock::host::panic_hook::install_for_module();
}
