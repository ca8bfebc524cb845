//! What the core reports besides results: its metrics as Prometheus text, and its `tracing`
//! log events handed to a C callback.

use std::ffi::{CString, c_char, c_int, c_void};

use ferrolock::host::log::{self, LogLevel, LogRecord};

use crate::status::{Failure, call, guard, to_cstring};

/// Log levels, most severe first: a callback set with `max_level` gets the events at that
/// level and the more severe ones.
pub const FERROLOCK_LOG_ERROR: c_int = 1;
pub const FERROLOCK_LOG_WARN: c_int = 2;
pub const FERROLOCK_LOG_INFO: c_int = 3;
pub const FERROLOCK_LOG_DEBUG: c_int = 4;
pub const FERROLOCK_LOG_TRACE: c_int = 5;

/// A log callback: `level` is a FERROLOCK_LOG_* constant, `message` a NUL-terminated string
/// valid only during the call.
///
/// What it may call: no ferrolock function (it may run on the library's runtime thread, or
/// inside a ferrolock call); see `ferrolock_set_log_callback`.
pub type ferrolock_log_fn =
    Option<unsafe extern "C" fn(userdata: *mut c_void, level: c_int, message: *const c_char)>;

/// The core's metrics (one registry per process: every manager's acquires, grants, failures
/// by error code, wait and hold times, renewals, losses by reason, hand-offs, labelled by key
/// prefix) as Prometheus text exposition, for a scrape handler to return as is. The caller
/// frees the string with `ferrolock_string_free`. NULL only if the library failed (a bug).
#[unsafe(no_mangle)]
pub extern "C" fn ferrolock_metrics_text() -> *mut c_char {
    guard(std::ptr::null_mut(), || {
        to_cstring(ferrolock::metrics::prometheus_text()).into_raw()
    })
}

/// `key` quoted as this library's messages show it: whole up to 128 bytes, past that by its
/// first 64 characters and its length (`"kkk…" (1048576 bytes)`), for a binding's own messages
/// to show a key as the library's do. The caller frees the string with
/// `ferrolock_string_free`. NULL for NULL or a key that is not UTF-8.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_quoted_key(key: *const c_char) -> *mut c_char {
    guard(std::ptr::null_mut(), || {
        crate::ctext::text(key, "key").map_or(std::ptr::null_mut(), |key| {
            to_cstring(ferrolock::quoted_key(&key)).into_raw()
        })
    })
}

/// Frees a string this library returned to be freed (`ferrolock_metrics_text`,
/// `ferrolock_quoted_key`). NULL is ignored.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_string_free(text: *mut c_char) {
    guard((), || {
        if !text.is_null() {
            // SAFETY: made by `CString::into_raw` here, freed once by the caller's contract.
            drop(unsafe { CString::from_raw(text) });
        }
    })
}

/// A C callback and its userdata, as the core's log sink.
struct Sink {
    callback: unsafe extern "C" fn(*mut c_void, c_int, *const c_char),
    userdata: *mut c_void,
}

// SAFETY: the caller's contract: the callback may be called on any thread with `userdata`.
unsafe impl Send for Sink {}
unsafe impl Sync for Sink {}

impl Sink {
    fn deliver(&self, r: &LogRecord<'_>) {
        let message = to_cstring(r.message.to_string());
        // SAFETY: the caller's contract for `ferrolock_set_log_callback`.
        unsafe { (self.callback)(self.userdata, c_int::from(r.level.rank()), message.as_ptr()) };
    }
}

/// Sends the core's log events at `max_level` (a FERROLOCK_LOG_* constant) and above to
/// `callback(userdata, level, message)`, replacing any callback set before; a NULL callback
/// turns logging off (the default: the library prints nothing). A panic caught at an entry
/// point (a ferrolock bug, returned as `FERROLOCK_ERR_PANIC`) is logged here at
/// `FERROLOCK_LOG_ERROR`, never printed.
///
/// The callback runs on the thread that logs, often one of the library's own: it must
/// return quickly (while it runs on the library's one runtime thread, no lock of the process
/// is renewed; FERROLOCK_WORKER_THREADS=2 for a callback that may block) and must not call
/// any ferrolock function (this one included). Once this
/// call has returned, the previous callback is never called again: calls already running
/// are waited for. Fails with FERROLOCK_ERR_INVALID_ARGUMENT for a level outside 1..5 given
/// with a callback (a NULL callback turns logging off whatever the level), and if another
/// `tracing` subscriber was already installed in this process.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_set_log_callback(
    callback: ferrolock_log_fn,
    userdata: *mut c_void,
    max_level: c_int,
    err: *mut *mut crate::status::ferrolock_error,
) -> c_int {
    call("ferrolock_set_log_callback", err, || {
        let Some(callback) = callback else {
            return log::set_sink(None, LogLevel::Error).map_err(Failure::from);
        };
        let level = LogLevel::from_rank(i64::from(max_level)).map_err(|_| {
            Failure::invalid(format!(
                "max_level={max_level}: expected FERROLOCK_LOG_ERROR (1) to FERROLOCK_LOG_TRACE (5)"
            ))
        })?;
        let sink = Sink { callback, userdata };
        log::set_sink(
            Some(Box::new(move |r: &LogRecord<'_>| sink.deliver(r))),
            level,
        )
        .map_err(Failure::from)
    })
}
