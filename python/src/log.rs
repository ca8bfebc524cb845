//! The core logs with `tracing` (bridged by `ferrolock::host::log`); Python users read the
//! `logging` logger "ferrolock". Events are queued where they happen (often a runtime worker, which must not take the GIL) and
//! handed to `logging` from a blocking-pool thread.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use ferrolock::host::log::{self, LogLevel, LogRecord};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::bridge::SHUTTING_DOWN;

static QUEUE: Mutex<VecDeque<(i32, String)>> = Mutex::new(VecDeque::new());
/// The process whose drain is scheduled or running (0: none). A pid, not a flag: a child
/// forked while its parent's drain ran (its thread not copied) would otherwise see a drain
/// that never ends, and hand `logging` nothing for good.
static DRAINING: AtomicU32 = AtomicU32::new(0);
/// Beyond this many undelivered records, new ones are dropped.
const CAPACITY: usize = 1000;
/// Records dropped since the drain last said so: a handler that blocks fills the queue, and
/// what it dropped left no trace, so the log read as complete (found by a review).
static DROPPED: AtomicU64 = AtomicU64::new(0);

fn python_level(level: LogLevel) -> i32 {
    match level {
        LogLevel::Error => 40,
        LogLevel::Warn => 30,
        LogLevel::Info => 20,
        LogLevel::Debug => 10,
        LogLevel::Trace => 5,
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
/// even formatted. Called when a manager is created and at each acquire: logging is often
/// configured after a module-level manager was made, and a level read only then kept the
/// records of its locks below WARNING from `logging` for good.
pub fn sync_level(py: Python<'_>) {
    let Ok(level) = logger(py).and_then(|l| l.call_method0("getEffectiveLevel")?.extract::<i32>())
    else {
        return;
    };
    log::set_level(match level {
        i32::MIN..=5 => LogLevel::Trace,
        6..=10 => LogLevel::Debug,
        11..=20 => LogLevel::Info,
        21..=30 => LogLevel::Warn,
        _ => LogLevel::Error,
    });
}

/// The core's sink: runs where the event happens (often a runtime worker, which must not
/// take the GIL), so it only queues the record for `drain`.
fn enqueue(r: &LogRecord<'_>) {
    // try_lock: never block a runtime worker, and never deadlock in a forked child that
    // inherited the mutex locked.
    if let Ok(mut q) = QUEUE.try_lock()
        && q.len() < CAPACITY
    {
        q.push_back((python_level(r.level), r.message.to_string()));
    } else {
        DROPPED.fetch_add(1, Ordering::Relaxed);
    }
    schedule_drain();
}

fn schedule_drain() {
    let me = ferrolock::host::pid();
    let mut seen = DRAINING.load(Ordering::Acquire);
    while seen != me {
        match DRAINING.compare_exchange(seen, me, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                ferrolock::runtime::handle().spawn_blocking(drain);
                return;
            }
            Err(now) => seen = now,
        }
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
                let dropped = DROPPED.swap(0, Ordering::Relaxed);
                if batch.is_empty() && dropped == 0 {
                    break;
                }
                for (level, message) in batch {
                    python_log(py, level, &message);
                }
                if dropped > 0 {
                    python_log(
                        py,
                        30,
                        &format!(
                            "{dropped} log records were dropped: the \"ferrolock\" logger's \
                             handlers did not keep up (at most {CAPACITY} wait to be handed to \
                             logging)"
                        ),
                    );
                }
            }
        });
    }
    DRAINING.store(0, Ordering::Release);
    let pending = QUEUE.try_lock().map(|q| !q.is_empty()).unwrap_or(false)
        || DROPPED.load(Ordering::Relaxed) > 0;
    if pending && !SHUTTING_DOWN.load(Ordering::Acquire) {
        schedule_drain();
    }
}

/// Hands the core's events to `logging`, at WARNING until `sync_level` reads the logger's
/// level; a host that installed a `tracing` subscriber of its own keeps the events.
pub fn install() {
    let _ = log::set_sink(Some(Box::new(enqueue)), LogLevel::Warn);
}
