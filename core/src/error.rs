//! One error type with a fixed set of kinds: the error table every binding derives from.
//! Each kind has a stable string code (Python's `.code`, JavaScript's `err.code`, the suffix
//! of C's `FERROLOCK_ERR_*`, but `FERROLOCK_ERR_REDIS` for `REDIS_ERROR`) and a stable number (C's status value, Go's error values).
//! Adding a kind is a deliberate, visible change everywhere; a kind's code and number never
//! change once released, and a retired number is never reused.

use std::fmt;

/// What went wrong, independent of the message text. Stable across releases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Bad input from the caller: empty key, zero TTL, malformed URL, ...
    InvalidArgument,
    /// The lock is held by someone else and the wait budget ran out (or `wait` was 0).
    NotAcquired,
    /// The operation needs a held lock, but this handle no longer holds it
    /// (released, expired, or never held on a quorum).
    NotHeld,
    /// A held lock could not be kept: the watchdog or an extend failed to reach a
    /// quorum within the validity, or the key was deleted or taken behind our back.
    LockLost,
    /// Too few nodes answered to form a quorum.
    QuorumUnreachable,
    /// Redis answered with an error that is none of the above (ACL denial, OOM, ...).
    Redis,
    /// The caller cancelled the call (a `host::Cancel` fired, or the binding's own way of
    /// interrupting: a signal, an asyncio cancellation, an AbortSignal, a Go context). An
    /// acquire cancelled this way left no key behind; a release still completed; an extend
    /// left the old deadline. Bindings map it to their own cancellation: Python's
    /// `KeyboardInterrupt` (a blocking call interrupted by a signal) or
    /// `asyncio.CancelledError`, JavaScript's `AbortError`, Go's `ctx.Err()`.
    Cancelled,
}

impl ErrorKind {
    /// Every kind, in the order of their numbers.
    pub const ALL: [ErrorKind; 7] = [
        ErrorKind::InvalidArgument,
        ErrorKind::NotAcquired,
        ErrorKind::NotHeld,
        ErrorKind::LockLost,
        ErrorKind::QuorumUnreachable,
        ErrorKind::Redis,
        ErrorKind::Cancelled,
    ];

    /// A stable number, never 0 (left for C's `FERROLOCK_OK`) and never reused: C's status
    /// values and Go's error values derive from it.
    pub fn number(self) -> u32 {
        match self {
            ErrorKind::InvalidArgument => 1,
            ErrorKind::NotAcquired => 2,
            ErrorKind::NotHeld => 3,
            ErrorKind::LockLost => 4,
            ErrorKind::QuorumUnreachable => 5,
            ErrorKind::Redis => 6,
            ErrorKind::Cancelled => 7,
        }
    }

    /// The kind with this number, if any.
    pub fn from_number(number: u32) -> Option<ErrorKind> {
        ErrorKind::ALL.into_iter().find(|k| k.number() == number)
    }

    /// The kind with this code, if any.
    pub fn from_code(code: &str) -> Option<ErrorKind> {
        ErrorKind::ALL.into_iter().find(|k| k.code() == code)
    }
}

impl ErrorKind {
    /// A stable, upper-snake-case name: the JS `err.code`, the C enum suffix (but
    /// `FERROLOCK_ERR_REDIS`), the CLI message tag.
    pub fn code(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "INVALID_ARGUMENT",
            ErrorKind::NotAcquired => "NOT_ACQUIRED",
            ErrorKind::NotHeld => "NOT_HELD",
            ErrorKind::LockLost => "LOCK_LOST",
            ErrorKind::QuorumUnreachable => "QUORUM_UNREACHABLE",
            ErrorKind::Redis => "REDIS_ERROR",
            ErrorKind::Cancelled => "CANCELLED",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// The error every public call returns. The message names the key, the node (its URL with
/// the password redacted) and the offending value where there is one.
///
/// The cause (a node's error reply, an I/O error such as "Connection refused") is part of
/// the message, scrubbed of passwords; `std::error::Error::source` is `None`. So the error
/// stays `Clone` and `Eq`, and reads the same in every binding, which gets only the message.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Error({}: {})", self.kind, self.message)
    }
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
        }
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidArgument, message)
    }

    /// This error as one of `what` (`"lock"`, `"semaphore"`) `key`: for checks that know
    /// nothing of the key (`LockOptions::validate`) run on one call's options.
    pub(crate) fn about(self, what: &str, key: &str) -> Self {
        Error::new(
            self.kind,
            format!("{what} {key:?}: {}", self.message, key = Shown(key)),
        )
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A key as messages show it (`{key:?}` with `key = Shown(key)`): quoted, as `Debug` quotes
/// it, and past `SHOWN_WHOLE` bytes only its start and its length. Redis takes keys up to
/// 512 MB: every error and loss reason of a 1 MiB key repeated the megabyte.
pub(crate) struct Shown<'a>(pub &'a str);

/// The longest key shown whole; a longer one is shown by its first `SHOWN_START` characters.
const SHOWN_WHOLE: usize = 128;
const SHOWN_START: usize = 64;

impl Shown<'_> {
    /// The key's start, when it is too long to show whole.
    fn start(&self) -> Option<&str> {
        let key = self.0;
        (key.len() > SHOWN_WHOLE).then(|| {
            let end = key
                .char_indices()
                .nth(SHOWN_START)
                .map_or(key.len(), |(at, _)| at);
            &key[..end]
        })
    }
}

impl fmt::Debug for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.start() {
            Some(start) => write!(f, "\"{}…\" ({} bytes)", start.escape_debug(), self.0.len()),
            None => write!(f, "{:?}", self.0),
        }
    }
}

/// `key` as the core's messages quote it (`Shown`), for a binding that tells whether a message
/// names the key already.
pub fn quoted_key(key: &str) -> String {
    format!("{:?}", Shown(key))
}

/// Unquoted (`{name}` in a message).
impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.start() {
            Some(start) => write!(f, "{start}… ({} bytes)", self.0.len()),
            None => f.write_str(self.0),
        }
    }
}

/// What a caught panic said (its payload's text), for the log line or error that reports it.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_numbers_are_unique_and_round_trip() {
        for (i, kind) in ErrorKind::ALL.into_iter().enumerate() {
            assert_eq!(
                kind.number() as usize,
                i + 1,
                "{kind}: numbers follow ALL's order"
            );
            assert_eq!(ErrorKind::from_number(kind.number()), Some(kind));
            assert_eq!(ErrorKind::from_code(kind.code()), Some(kind));
        }
        assert_eq!(ErrorKind::from_number(0), None);
        assert_eq!(ErrorKind::Cancelled.code(), "CANCELLED");
    }
}
