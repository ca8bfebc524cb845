//! The core's log events (`ferrolock::host::log`) handed to a JavaScript function. `log.js`
//! wraps it: the default (warnings as process warnings), the level names and the rule that a
//! replaced function is never called again. Each environment (the main thread, each worker)
//! registers a default; the process's records go to one of them until a `setLogger` call, and
//! back to them once every environment that made one has ended.

use ferrolock::host::log::{self, LogLevel, LogRecord};
use napi::bindgen_prelude::Function;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::{Env, Result, Status};
use napi_derive::napi;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::env::locked;
use crate::errors::{guard, invalid, to_napi};

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
/// record alone.
type Tsfn = ThreadsafeFunction<NativeLogRecord, (), NativeLogRecord, Status, false, true>;

/// At most this many records wait for one logger: queued for its thread, or handed to it and
/// not yet done with (an async logger's promise unsettled). A logger that fell behind (slow,
/// its thread's event loop blocked, its promises never settling) held every record in memory.
/// As Python's and Go's queues.
pub const BACKLOG: usize = 1000;

/// A logger's records not yet done with, and those dropped since it was last told. The newest
/// are dropped, not the oldest: the first records of a burst say how the trouble began (the
/// first lock lost), the count says how much followed, and the queue stays the platform's own
/// (a threadsafe function's, first in first out).
#[derive(Default)]
struct Backlog {
    pending: AtomicUsize,
    dropped: AtomicU64,
}

impl Backlog {
    /// Takes a place for one more record, or counts it dropped.
    fn admit(&self) -> bool {
        let took = self
            .pending
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < BACKLOG).then_some(n + 1)
            })
            .is_ok();
        if !took {
            self.dropped.fetch_add(1, Ordering::SeqCst);
        }
        took
    }

    /// Gives a record's place back; returns how many were dropped since the logger was last
    /// told (0: none), which the caller tells it now that it has room again.
    fn done(&self) -> u64 {
        let _ = self
            .pending
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        self.dropped.swap(0, Ordering::SeqCst)
    }

    fn send(&self, tsfn: &Tsfn, r: &LogRecord<'_>) {
        // NonBlocking: the logging thread is often a runtime worker; once the environment is
        // gone the call fails and the record is dropped.
        if self.admit()
            && tsfn.call(js_record(r), ThreadsafeFunctionCallMode::NonBlocking) != Status::Ok
        {
            self.pending.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Each JavaScript environment's default logger (process warnings on its own thread), the
/// main thread's first. The process's records go to the main thread's while it lives, else to
/// a live worker's: the default belongs to no environment in particular, so a worker that
/// loaded the addon first and exited does not take it along.
struct Default {
    env: usize,
    tsfn: Tsfn,
    backlog: Arc<Backlog>,
}
static DEFAULTS: Mutex<Vec<Default>> = Mutex::new(Vec::new());

/// A `setLogger` call: the function (None: off), its level and its number in the process.
struct Call {
    env: usize,
    number: u32,
    tsfn: Option<Arc<Tsfn>>,
    backlog: Arc<Backlog>,
    level: LogLevel,
}

/// What the core's sink is made of: the latest `setLogger` call of each environment still
/// alive, the last in effect, else the defaults' dispatcher. A worker's function goes with its
/// environment: the process's records were dropped for good once the worker that made the last
/// call had ended (its threadsafe function fails), the main thread's lost locks' warnings
/// included; the call made before it, by an environment still alive, takes over instead (none
/// left: the defaults). Held while the sink is replaced; never taken by a sink (`set_sink`
/// waits for the sinks running).
struct Sinks {
    calls: Vec<Call>,
    defaults_installed: bool,
}
static SINKS: Mutex<Sinks> = Mutex::new(Sinks {
    calls: Vec::new(),
    defaults_installed: false,
});

/// Numbers the `setLogger` calls of every environment.
static CALLS_MADE: AtomicU32 = AtomicU32::new(0);
/// The number of the call in effect (0: the defaults): a thread whose own call is not the one
/// in effect (`log.js`) sends its scope warnings through the core, to the logger in effect.
static IN_EFFECT: AtomicU32 = AtomicU32::new(0);

fn js_record(r: &LogRecord<'_>) -> NativeLogRecord {
    NativeLogRecord {
        level: r.level.name().to_string(),
        target: r.target.to_string(),
        message: r.message.to_string(),
    }
}

fn weak_tsfn(callback: Function<NativeLogRecord, ()>) -> Result<Tsfn> {
    callback
        .build_threadsafe_function()
        .callee_handled::<false>()
        .weak::<true>()
        .build()
}

/// Sends the core's events at `level` and above to `callback` on the JavaScript thread (of
/// the environment that set it), replacing the previous function or the defaults until this
/// environment's teardown; `null` stops delivery. Returns the call's number in the process
/// (see [`logger_generation`]).
#[napi(js_name = "setLogger")]
pub fn set_logger(
    env: &Env,
    callback: Option<Function<NativeLogRecord, ()>>,
    level: String,
) -> Result<u32> {
    guard("setLogger", || set_logger_unguarded(env, callback, level))
}

fn set_logger_unguarded(
    env: &Env,
    callback: Option<Function<NativeLogRecord, ()>>,
    level: String,
) -> Result<u32> {
    let level = LogLevel::parse(&level).map_err(|e| invalid(e.message()))?;
    let tsfn = callback.map(weak_tsfn).transpose()?.map(Arc::new);
    let id = env.raw() as usize;
    let mut sinks = locked(&SINKS);
    let first = !sinks.calls.iter().any(|c| c.env == id);
    let call = Call {
        env: id,
        number: CALLS_MADE.fetch_add(1, Ordering::SeqCst) + 1,
        tsfn,
        backlog: Arc::default(),
        level,
    };
    let number = call.number;
    install(Some(&call))?;
    sinks.calls.retain(|c| c.env != id);
    sinks.calls.push(call);
    drop(sinks);
    if first {
        env.add_env_cleanup_hook(id, forget_calls)?;
    }
    Ok(number)
}

/// At an environment's teardown: its call goes, and if it was in effect the latest call of an
/// environment still alive (else the defaults) takes over.
fn forget_calls(id: usize) {
    let mut sinks = locked(&SINKS);
    let in_effect = sinks.calls.last().is_some_and(|c| c.env == id);
    sinks.calls.retain(|c| c.env != id);
    if in_effect {
        // Only fails when another tracing subscriber owns the events, which a call that was
        // in effect rules out.
        let _ = install(sinks.calls.last());
        sinks.defaults_installed = sinks.calls.is_empty();
    }
}

/// Makes `call` (None: the defaults) the core's sink.
fn install(call: Option<&Call>) -> Result<()> {
    match call {
        Some(call) => {
            let backlog = call.backlog.clone();
            let sink: Option<log::LogSink> = call.tsfn.clone().map(|tsfn| {
                Box::new(move |r: &LogRecord<'_>| backlog.send(&tsfn, r)) as log::LogSink
            });
            log::set_sink(sink, call.level).map_err(to_napi)?;
            IN_EFFECT.store(call.number, Ordering::SeqCst);
        }
        None => {
            log::set_sink(Some(Box::new(to_default)), LogLevel::Warn).map_err(to_napi)?;
            IN_EFFECT.store(0, Ordering::SeqCst);
        }
    }
    Ok(())
}

/// Takes a place in the backlog of `setLogger` call `number` for a record this thread hands
/// its function directly (a scope's warning); false: the record is dropped (counted).
#[napi(js_name = "loggerAdmit")]
pub fn logger_admit(number: u32) -> Result<bool> {
    guard("loggerAdmit", || {
        Ok(with_call(number, |b| b.admit()).unwrap_or(true))
    })
}

/// The function of `setLogger` call `number` is done with a record (returned, threw, or its
/// promise settled): returns the records dropped since it was last told (0: none).
#[napi(js_name = "loggerDone")]
pub fn logger_done(number: u32) -> Result<f64> {
    guard("loggerDone", || {
        Ok(with_call(number, |b| b.done()).unwrap_or(0) as f64)
    })
}

fn with_call<T>(number: u32, f: impl FnOnce(&Backlog) -> T) -> Option<T> {
    let backlog = locked(&SINKS)
        .calls
        .iter()
        .find(|c| c.number == number)
        .map(|c| c.backlog.clone());
    backlog.map(|b| f(&b))
}

/// This environment's default logger is done with a record: as [`logger_done`].
#[napi(js_name = "defaultLoggerDone")]
pub fn default_logger_done(env: &Env) -> Result<f64> {
    guard("defaultLoggerDone", || {
        let id = env.raw() as usize;
        let backlog = locked(&DEFAULTS)
            .iter()
            .find(|d| d.env == id)
            .map(|d| d.backlog.clone());
        Ok(backlog.map_or(0, |b| b.done()) as f64)
    })
}

/// The number of the `setLogger` call in effect (0: none yet, the defaults).
#[napi(js_name = "loggerGeneration")]
pub fn logger_generation() -> Result<u32> {
    guard("loggerGeneration", || Ok(IN_EFFECT.load(Ordering::SeqCst)))
}

/// A warning of `log.js`'s own (a `withLock` scope's end) through the core's sink, for a
/// thread whose `setLogger` is not the one in effect: it reaches the logger another thread
/// set, at that logger's level (nothing after `setLogger(null)`).
#[napi(js_name = "logScopeWarning")]
pub fn log_scope_warning(message: String) -> Result<()> {
    guard("logScopeWarning", || {
        tracing::warn!(target: "ferrolock::scope", "{message}");
        Ok(())
    })
}

/// Registers this environment's default logger (`callback`, warnings and errors), removed at
/// its teardown. The first registration makes the defaults the process's sink, unless a
/// `setLogger` call is in effect.
#[napi(js_name = "setDefaultLogger")]
pub fn set_default_logger(
    env: &Env,
    callback: Function<NativeLogRecord, ()>,
    main_thread: bool,
) -> Result<()> {
    guard("setDefaultLogger", || {
        set_default_logger_unguarded(env, callback, main_thread)
    })
}

fn set_default_logger_unguarded(
    env: &Env,
    callback: Function<NativeLogRecord, ()>,
    main_thread: bool,
) -> Result<()> {
    let id = env.raw() as usize;
    let tsfn = weak_tsfn(callback)?;
    {
        let mut defaults = locked(&DEFAULTS);
        let entry = Default {
            env: id,
            tsfn,
            backlog: Arc::default(),
        };
        if main_thread {
            defaults.insert(0, entry);
        } else {
            defaults.push(entry);
        }
    }
    env.add_env_cleanup_hook(id, |id| locked(&DEFAULTS).retain(|d| d.env != id))?;
    let mut sinks = locked(&SINKS);
    if sinks.calls.is_empty() && !sinks.defaults_installed {
        install(None)?;
        sinks.defaults_installed = true;
    }
    Ok(())
}

fn to_default(r: &LogRecord<'_>) {
    if let Some(d) = locked(&DEFAULTS).first() {
        d.backlog.send(&d.tsfn, r);
    }
}
