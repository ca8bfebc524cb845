//! The one place where core errors cross into JavaScript. A napi error carries a fixed
//! `Status`, not a code of ours, so the core's stable code travels in front of the message,
//! split off by `fromNative` in `errors.js`, which picks the `LockError` subclass by it.

use ferrolock::{Error, ErrorKind};

/// Separates the code from the message (a character no message contains).
const SEP: char = '\u{1f}';

pub fn to_napi(err: Error) -> napi::Error {
    coded(err.kind().code(), err.message())
}

pub fn coded(code: &str, message: &str) -> napi::Error {
    napi::Error::new(
        napi::Status::GenericFailure,
        format!("{code}{SEP}{message}"),
    )
}

pub fn invalid(message: impl AsRef<str>) -> napi::Error {
    coded(ErrorKind::InvalidArgument.code(), message.as_ref())
}
