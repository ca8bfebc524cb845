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

/// Runs a napi entry point (`entry`, as JavaScript names it) on the JavaScript thread: a panic
/// becomes an error of code PANIC (`ferrolock::host::panic_hook::catch`) instead of aborting
/// the process (napi-rs catches unwinds only where asked to, and then with no code of ours).
pub fn guard<T>(entry: &str, body: impl FnOnce() -> napi::Result<T>) -> napi::Result<T> {
    ferrolock::host::panic_hook::catch(entry, body).unwrap_or_else(|m| Err(coded(PANIC, &m)))
}

/// The code of a panic's error: not a kind of the core's table (a bug, not an outcome), the
/// name C's `ferrolock_status_name` gives `FERROLOCK_ERR_PANIC`.
pub const PANIC: &str = "PANIC";

pub fn invalid(message: impl AsRef<str>) -> napi::Error {
    coded(ErrorKind::InvalidArgument.code(), message.as_ref())
}

/// `key` as the core's messages quote it (Rust's `{:?}`, a long key by its start and length),
/// for `fromNative` to tell whether a message names the key already: JSON spells a control or
/// invisible character otherwise (`"k\u0001"`, where the core writes `"k\u{1}"`), and such a
/// key was named twice.
#[napi_derive::napi]
pub fn quote_key(key: String) -> napi::Result<String> {
    guard("quoteKey", || Ok(ferrolock::quoted_key(&key)))
}
