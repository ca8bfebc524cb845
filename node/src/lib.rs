//! The Node.js binding of ferrolock. It converts values, maps errors and awaits; every piece
//! of lock logic is the core's (and, until `ferrolock::host` lands, `host.rs`'s). I/O runs on
//! the core's runtime, never on the JavaScript thread nor on napi's runtime.

pub mod env;
pub mod errors;
pub mod host;
pub mod lock;
pub mod manager;
pub mod options;
