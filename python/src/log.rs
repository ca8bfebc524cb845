//! The core logs with `tracing`; Python users read the `logging` logger "ferrolock". Events
//! are queued where they happen (often a runtime worker, which must not take the GIL) and
//! handed to `logging` from a blocking-pool thread.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::subscriber::{Interest, Subscriber};
use tracing::{Event, Level, Metadata, span};

use crate::bridge::SHUTTING_DOWN;

/// 1 = error ... 5 = trace; events above it are not even formatted.
static MAX_RANK: AtomicU8 = AtomicU8::new(2);
static QUEUE: Mutex<VecDeque<(i32, String)>> = Mutex::new(VecDeque::new());
static DRAINING: AtomicBool = AtomicBool::new(false);
/// Beyond this many undelivered records, new ones are dropped.
const CAPACITY: usize = 1000;

fn rank(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 1,
        Level::WARN => 2,
        Level::INFO => 3,
        Level::DEBUG => 4,
        _ => 5,
    }
}

fn python_level(level: &Level) -> i32 {
    match *level {
        Level::ERROR => 40,
        Level::WARN => 30,
        Level::INFO => 20,
        Level::DEBUG => 10,
        _ => 5,
    }
}

fn logger(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static LOGGER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    LOGGER
        .get_or_try_init(py, || {
            Ok(py
                .import("logging")?
                .call_method1("getLogger", ("ferrolock",))?
                .unbind())
        })
        .map(|l| l.bind(py))
}

/// Logs `message` at a `logging` level (30 = WARNING). Never raises.
pub fn python_log(py: Python<'_>, level: i32, message: &str) {
    if let Ok(l) = logger(py) {
        let _ = l.call_method1("log", (level, "%s", message));
    }
}

/// Reads the effective level of the "ferrolock" logger, so events it would drop are not
/// even formatted. Called when a manager is created.
pub fn sync_level(py: Python<'_>) {
    let Ok(level) = logger(py).and_then(|l| l.call_method0("getEffectiveLevel")?.extract::<i32>())
    else {
        return;
    };
    let r = match level {
        i32::MIN..=5 => 5,
        6..=10 => 4,
        11..=20 => 3,
        21..=30 => 2,
        _ => 1,
    };
    MAX_RANK.store(r, Ordering::Relaxed);
}

struct Message(String);

impl Visit for Message {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.insert_str(0, value);
        } else {
            let _ = write!(self.0, " {}={value}", field.name());
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0.insert_str(0, &format!("{value:?}"));
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}

struct Bridge;

impl Subscriber for Bridge {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        Interest::sometimes()
    }
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        rank(metadata.level()) <= MAX_RANK.load(Ordering::Relaxed)
    }
    fn max_level_hint(&self) -> Option<LevelFilter> {
        None
    }
    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }
    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut m = Message(String::new());
        event.record(&mut m);
        // try_lock: never block a runtime worker, and never deadlock in a forked child that
        // inherited the mutex locked.
        if let Ok(mut q) = QUEUE.try_lock() {
            if q.len() >= CAPACITY {
                return;
            }
            q.push_back((python_level(event.metadata().level()), m.0));
        } else {
            return;
        }
        schedule_drain();
    }
    fn enter(&self, _: &span::Id) {}
    fn exit(&self, _: &span::Id) {}
}

fn schedule_drain() {
    if !DRAINING.swap(true, Ordering::AcqRel) {
        ferrolock::runtime::handle().spawn_blocking(drain);
    }
}

fn drain() {
    if !SHUTTING_DOWN.load(Ordering::Acquire) {
        crate::bridge::attach_if_alive(|py| {
            loop {
                let batch: Vec<(i32, String)> = match QUEUE.lock() {
                    Ok(mut q) => q.drain(..).collect(),
                    Err(_) => break,
                };
                if batch.is_empty() {
                    break;
                }
                for (level, message) in batch {
                    python_log(py, level, &message);
                }
            }
        });
    }
    DRAINING.store(false, Ordering::Release);
    let pending = QUEUE.try_lock().map(|q| !q.is_empty()).unwrap_or(false);
    if pending && !SHUTTING_DOWN.load(Ordering::Acquire) {
        schedule_drain();
    }
}

/// Installs the bridge as the process's tracing subscriber, unless the host already set one.
pub fn install() {
    let _ = tracing::subscriber::set_global_default(Bridge);
}
