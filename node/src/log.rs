//! The core's log events (`ferrolock::host::log`) handed to a JavaScript function. `log.js`
//! wraps it: the default (warnings as process warnings), the level names and the rule that a
//! replaced function is never called again.

use ferrolock::host::log::{self, LogLevel, LogRecord};
use napi::bindgen_prelude::Function;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::{Result, Status};
use napi_derive::napi;

use crate::errors::{invalid, to_napi};

/// One record as JavaScript receives it.
#[napi(object)]
pub struct NativeLogRecord {
    /// "error", "warn", "info", "debug" or "trace".
    pub level: String,
    /// The core module that logged (`ferrolock::lock`, ...).
    pub target: String,
    pub message: String,
}

/// Weak: a logger never keeps the process alive. Not callee-handled: the function gets the
/// record alone, and a record is dropped rather than queued without bound (see `call`).
type Tsfn = ThreadsafeFunction<NativeLogRecord, (), NativeLogRecord, Status, false, true>;

/// Sends the core's events at `level` and above to `callback` on the JavaScript thread (of
/// the environment that set it), replacing the previous function; `null` stops delivery.
/// With `if_unset`, only where no function is set yet in the process (the default a new
/// environment installs must not replace another thread's logger). Returns whether it set.
#[napi(js_name = "setLogger")]
pub fn set_logger(
    callback: Option<Function<NativeLogRecord, ()>>,
    level: String,
    if_unset: bool,
) -> Result<bool> {
    let level = LogLevel::parse(&level).map_err(|e| invalid(e.message()))?;
    if if_unset && log::has_sink() {
        return Ok(false);
    }
    let Some(callback) = callback else {
        return log::set_sink(None, level).map(|_| true).map_err(to_napi);
    };
    let tsfn: Tsfn = callback
        .build_threadsafe_function()
        .callee_handled::<false>()
        .weak::<true>()
        .build()?;
    log::set_sink(
        Some(Box::new(move |r: &LogRecord<'_>| {
            // NonBlocking: the logging thread is often a runtime worker; once the
            // environment is gone the call fails and the record is dropped.
            let _ = tsfn.call(
                NativeLogRecord {
                    level: r.level.name().to_string(),
                    target: r.target.to_string(),
                    message: r.message.to_string(),
                },
                ThreadsafeFunctionCallMode::NonBlocking,
            );
        })),
        level,
    )
    .map(|_| true)
    .map_err(to_napi)
}
