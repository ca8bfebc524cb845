//! The Node.js binding of ferrolock. It converts values, maps errors and awaits; every piece
//! of lock logic is the core's host layer (`ferrolock::host`). I/O runs on the core's
//! runtime, never on the JavaScript thread nor on napi's runtime.

pub mod env;
pub mod errors;
pub mod lock;
pub mod log;
pub mod manager;
pub mod metrics;
pub mod options;
pub mod rt;
