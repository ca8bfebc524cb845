//! One error type with a fixed set of kinds. Every binding maps `ErrorKind` once
//! (Python exception classes, JS `err.code`, C status codes), so adding a kind is a
//! deliberate, visible change everywhere.

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
}

impl ErrorKind {
    /// A stable, upper-snake-case name: the JS `err.code`, the C enum suffix, the CLI message tag.
    pub fn code(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "INVALID_ARGUMENT",
            ErrorKind::NotAcquired => "NOT_ACQUIRED",
            ErrorKind::NotHeld => "NOT_HELD",
            ErrorKind::LockLost => "LOCK_LOST",
            ErrorKind::QuorumUnreachable => "QUORUM_UNREACHABLE",
            ErrorKind::Redis => "REDIS_ERROR",
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
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
