//! The core logs with `tracing`. A binding whose users do not bring a `tracing` subscriber
//! hands their log function here instead: one subscriber for the process, which formats an
//! event once, as "message field=value ...", and passes it to the binding's sink (Python's
//! `logging`, Node's `setLogger`, C's log callback). Events above the level are not even
//! formatted, and the level can change at any time.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Once, RwLock};

use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::subscriber::{Interest, Subscriber};
use tracing::{Event, Level, Metadata, span};

use crate::error::{Error, Result};

/// Log levels, most severe first: a sink set at a level gets the events at that level and
/// the more severe ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
    Trace = 5,
}

impl LogLevel {
    pub const ALL: [LogLevel; 5] = [
        LogLevel::Error,
        LogLevel::Warn,
        LogLevel::Info,
        LogLevel::Debug,
        LogLevel::Trace,
    ];

    /// "error", "warn", "info", "debug" or "trace".
    pub fn name(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }

    /// 1 (error) to 5 (trace), the numbering C's FERROLOCK_LOG_* constants use.
    pub fn rank(self) -> u8 {
        self as u8
    }

    pub fn from_rank(rank: i64) -> Result<LogLevel> {
        LogLevel::ALL
            .into_iter()
            .find(|l| i64::from(l.rank()) == rank)
            .ok_or_else(|| {
                Error::invalid(format!("log level {rank}: expected 1 (error) to 5 (trace)"))
            })
    }

    pub fn parse(name: &str) -> Result<LogLevel> {
        LogLevel::ALL
            .into_iter()
            .find(|l| l.name() == name)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "log level {name:?}: expected \"error\", \"warn\", \"info\", \"debug\" or \"trace\""
                ))
            })
    }

    fn of(level: &Level) -> LogLevel {
        match *level {
            Level::ERROR => LogLevel::Error,
            Level::WARN => LogLevel::Warn,
            Level::INFO => LogLevel::Info,
            Level::DEBUG => LogLevel::Debug,
            _ => LogLevel::Trace,
        }
    }
}

/// One event: its level, where it comes from (a `ferrolock::...` module path) and its text.
#[derive(Debug)]
pub struct LogRecord<'a> {
    pub level: LogLevel,
    pub target: &'a str,
    pub message: &'a str,
}

/// Where records go. It runs on the thread that logs, often one of the runtime's workers: it
/// must return quickly and must not block on a lock the binding holds while calling into
/// ferrolock.
pub type LogSink = Box<dyn Fn(&LogRecord<'_>) + Send + Sync>;

/// Read while a sink runs, written to replace it: a replacement waits for the calls in
/// progress, so none starts after `set_sink` has returned (an event that arrives during the
/// replacement is dropped).
static SINK: RwLock<Option<LogSink>> = RwLock::new(None);
/// The most verbose rank delivered (0: none), read before anything is formatted.
static MAX_RANK: AtomicU8 = AtomicU8::new(0);
static INSTALL: Once = Once::new();
static INSTALLED: AtomicU8 = AtomicU8::new(0);

/// Sends the core's events at `level` and above to `sink`, replacing any sink set before
/// (once this returns, the previous one is never called again; calls already running are
/// waited for); `None` turns delivery off. The first call makes this module the process's
/// `tracing` subscriber; it fails if the process already has another one (the core's events
/// then go to it, which is what a Rust host wants).
pub fn set_sink(sink: Option<LogSink>, level: LogLevel) -> Result<()> {
    if sink.is_none() {
        // Nothing to install for "off", and no error if another subscriber owns the events.
        *SINK.write().unwrap_or_else(|p| p.into_inner()) = None;
        store_rank(0);
        return Ok(());
    }
    INSTALL.call_once(|| {
        if tracing::subscriber::set_global_default(Bridge).is_ok() {
            INSTALLED.store(1, Ordering::SeqCst);
        }
    });
    if INSTALLED.load(Ordering::SeqCst) == 0 {
        return Err(Error::invalid(
            "another tracing subscriber is already installed in this process: ferrolock's \
             events go to it",
        ));
    }
    let mut slot = SINK.write().unwrap_or_else(|p| p.into_inner());
    *slot = sink;
    drop(slot);
    store_rank(level.rank());
    Ok(())
}

/// Sets the level and, when it changed, has `tracing` ask each callsite again: events above
/// the level are then skipped at the callsite (one atomic load), not in `enabled` on every
/// hit. The core's hot path has debug events; a binding logging warnings only must not pay
/// for them.
fn store_rank(rank: u8) {
    if MAX_RANK.swap(rank, Ordering::SeqCst) != rank {
        tracing::callsite::rebuild_interest_cache();
    }
}

/// Whether a sink is set (a binding installs its default only where none is).
pub fn has_sink() -> bool {
    SINK.read().map(|s| s.is_some()).unwrap_or(true)
}

/// Changes the level of the sink in place (Python re-reads its logger's level).
pub fn set_level(level: LogLevel) {
    let has_sink = SINK.read().map(|s| s.is_some()).unwrap_or(false);
    if has_sink {
        store_rank(level.rank());
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

/// The process's `tracing` subscriber once a sink was set: the core's events only, no spans.
struct Bridge;

impl Subscriber for Bridge {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        // Asked again on every level change (`store_rank`).
        if self.enabled(metadata) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(match MAX_RANK.load(Ordering::Relaxed) {
            0 => LevelFilter::OFF,
            1 => LevelFilter::ERROR,
            2 => LevelFilter::WARN,
            3 => LevelFilter::INFO,
            4 => LevelFilter::DEBUG,
            _ => LevelFilter::TRACE,
        })
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.target().starts_with("ferrolock")
            && LogLevel::of(metadata.level()).rank() <= MAX_RANK.load(Ordering::Relaxed)
    }

    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }

    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}

    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}

    fn event(&self, event: &Event<'_>) {
        let level = LogLevel::of(event.metadata().level());
        let mut text = Text::default();
        event.record(&mut text);
        text.message.push_str(&text.fields);
        // try_read: an event that races a replacement is dropped rather than waited for, so
        // a runtime worker never blocks here (nor hangs in a forked child that inherited the
        // lock mid-replacement).
        let Ok(sink) = SINK.try_read() else {
            return;
        };
        if let Some(sink) = sink.as_ref()
            && level.rank() <= MAX_RANK.load(Ordering::Relaxed)
        {
            sink(&LogRecord {
                level,
                target: event.metadata().target(),
                message: &text.message,
            });
        }
    }

    fn enter(&self, _: &span::Id) {}

    fn exit(&self, _: &span::Id) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_by_name_and_rank_and_name_the_bad_value() {
        for l in LogLevel::ALL {
            assert_eq!(LogLevel::parse(l.name()).unwrap(), l);
            assert_eq!(LogLevel::from_rank(i64::from(l.rank())).unwrap(), l);
        }
        assert!(
            LogLevel::parse("WARNING")
                .unwrap_err()
                .message()
                .contains("\"WARNING\"")
        );
        assert!(LogLevel::from_rank(6).unwrap_err().message().contains("6"));
    }
}
