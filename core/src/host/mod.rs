//! The host layer: everything a binding (Python, Node, C/Go) needs beyond converting its
//! values, so that each binding holds no lock logic, only conversion, its error mapping and
//! its way of waiting.
//!
//! - [`Manager`]: the core manager plus the locks it handed out (`release_all`, `close`),
//!   acquires taking the binding's reentrancy owner as an opaque `u64`; [`shared`]: one
//!   manager per distinct connection options (Python's `redlock()`, Node's `withLock`).
//! - Three ways to call: `async` (a binding with an event loop of its own drives the future,
//!   or spawns it on `ferrolock::runtime::handle()`); blocking on the caller's thread,
//!   interruptible from any thread by a [`Cancel`] and by the binding's own [`Check`]
//!   (`Manager::acquire_blocking`, `Lock::release_blocking`, `Lock::extend_blocking`); and
//!   completion-based, on the process runtime, with a callback or a [`Call`] handle
//!   (`Manager::acquire_start`, `Manager::acquire_call`, [`start`] for any other call).
//! - [`Lock`]: a handed-out lock, its loss subscription (`on_lost`: a callback on a library
//!   thread; `lost`: an awaitable), `free` (waits for a running callback), `abandon`.
//! - [`scope`]: the end of a `with` / `withLock` scope, one decision table for every binding.
//! - [`exit()`]: the process-exit protocol, bounded in time.
//! - [`log`]: the core's `tracing` events handed to a binding's log function;
//!   [`panic_hook`]: the library's panics sent there too, never printed.
//!
//! Fork: every registry here is per process (`PerProcess`): a forked child makes its own
//! managers, hands out its own locks, and never touches what it inherited (an inherited
//! `Lock` is inert: never signalled, released or extended).

mod call;
mod cancel;
mod exit;
mod flag;
mod lock;
pub mod log;
mod loss;
mod manager;
pub mod panic_hook;
pub mod scope;
mod shared;

/// A count per process, for a binding's own "in progress" counts (see `pid`).
pub use crate::per_process::ProcessCount;
pub use call::{Call, start};
pub use cancel::{CHECK_EVERY, Cancel, Check, block_on, until_cancelled};
pub use exit::{exit, is_exiting};
pub use lock::Lock;
pub use manager::{CLOSE_LIMIT, Kind, Manager, NO_OWNER, noun};
pub use shared::{shared, shared_count};

/// The current process id, correct in a forked child: a binding's handles record it, so that
/// a child can tell what it inherited and leave it alone (see the module's "Fork").
pub fn pid() -> u32 {
    crate::runtime::pid()
}
