//! What the core reports besides results: its metrics as Prometheus text, and its `tracing`
//! log events handed to a C callback.

use std::ffi::{CString, c_char, c_int, c_void};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Once, RwLock};

use tracing::field::{Field, Visit};
use tracing::subscriber::{Interest, Subscriber};
use tracing::{Event, Level, Metadata, span};

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

/// Frees a string this library returned to be freed (`ferrolock_metrics_text`). NULL is
/// ignored.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_string_free(text: *mut c_char) {
    guard((), || {
        if !text.is_null() {
            // SAFETY: made by `CString::into_raw` here, freed once by the caller's contract.
            drop(unsafe { CString::from_raw(text) });
        }
    })
}

struct Sink {
    callback: unsafe extern "C" fn(*mut c_void, c_int, *const c_char),
    userdata: *mut c_void,
}

// SAFETY: the caller's contract: the callback may be called on any thread with `userdata`.
unsafe impl Send for Sink {}
unsafe impl Sync for Sink {}

/// Read while a callback runs, written to replace it: a replacement waits for the calls in
/// progress, so none starts after it has returned.
static SINK: RwLock<Option<Sink>> = RwLock::new(None);
/// The most verbose level delivered (0: none), read before any formatting.
static MAX_LEVEL: AtomicI32 = AtomicI32::new(0);
static INSTALL: Once = Once::new();

/// Sends the core's log events at `max_level` (a FERROLOCK_LOG_* constant) and above to
/// `callback(userdata, level, message)`, replacing any callback set before; a NULL callback
/// turns logging off (the default: the library prints nothing).
///
/// The callback runs on the thread that logs, often one of the library's own: it must
/// return quickly and must not call any ferrolock function (this one included). Once this
/// call has returned, the previous callback is never called again: calls already running
/// are waited for. Fails with FERROLOCK_ERR_INVALID_ARGUMENT for a level outside 1..5, and
/// if another `tracing` subscriber was already installed in this process.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_set_log_callback(
    callback: ferrolock_log_fn,
    userdata: *mut c_void,
    max_level: c_int,
    err: *mut *mut crate::status::ferrolock_error,
) -> c_int {
    call("ferrolock_set_log_callback", err, || {
        let Some(callback) = callback else {
            MAX_LEVEL.store(0, Ordering::SeqCst);
            *SINK.write().unwrap_or_else(|p| p.into_inner()) = None;
            return Ok(());
        };
        if !(FERROLOCK_LOG_ERROR..=FERROLOCK_LOG_TRACE).contains(&max_level) {
            return Err(Failure::invalid(format!(
                "max_level={max_level}: expected FERROLOCK_LOG_ERROR (1) to FERROLOCK_LOG_TRACE (5)"
            )));
        }
        let mut installed = Ok(());
        INSTALL.call_once(|| {
            installed = tracing::subscriber::set_global_default(Bridge).map_err(|_| {
                Failure::invalid(
                    "another tracing subscriber is already installed in this process: \
                     ferrolock's events go to it",
                )
            });
        });
        installed?;
        *SINK.write().unwrap_or_else(|p| p.into_inner()) = Some(Sink { callback, userdata });
        MAX_LEVEL.store(max_level, Ordering::SeqCst);
        Ok(())
    })
}

fn rank(level: &Level) -> c_int {
    match *level {
        Level::ERROR => FERROLOCK_LOG_ERROR,
        Level::WARN => FERROLOCK_LOG_WARN,
        Level::INFO => FERROLOCK_LOG_INFO,
        Level::DEBUG => FERROLOCK_LOG_DEBUG,
        _ => FERROLOCK_LOG_TRACE,
    }
}

/// The message, then the other fields as ` name=value`.
#[derive(Default)]
struct Text {
    message: String,
    fields: String,
}

impl Visit for Text {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }
}

/// The process's `tracing` subscriber once a callback was set: events only, no spans.
struct Bridge;

impl Subscriber for Bridge {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        // The level can change at any time: ask `enabled` each time.
        Interest::sometimes()
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.target().starts_with("ferrolock")
            && rank(metadata.level()) <= MAX_LEVEL.load(Ordering::Relaxed)
    }

    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }

    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}

    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}

    fn event(&self, event: &Event<'_>) {
        let level = rank(event.metadata().level());
        let mut text = Text::default();
        event.record(&mut text);
        text.message.push_str(&text.fields);
        let message = to_cstring(text.message);
        let sink = SINK.read().unwrap_or_else(|p| p.into_inner());
        if let Some(sink) = sink.as_ref()
            && level <= MAX_LEVEL.load(Ordering::Relaxed)
        {
            // SAFETY: the caller's contract for `ferrolock_set_log_callback`.
            unsafe { (sink.callback)(sink.userdata, level, message.as_ptr()) };
        }
    }

    fn enter(&self, _: &span::Id) {}

    fn exit(&self, _: &span::Id) {}
}
