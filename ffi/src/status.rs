//! Status codes, the error object handed to C, and the wrapper every entry runs in.

use std::ffi::{CString, c_char, c_int};

use ferrolock::ErrorKind;

/// The call succeeded.
pub const FERROLOCK_OK: c_int = 0;
/// Bad input: a NULL or non-UTF-8 argument, an empty key, a zero ttl, an unknown option, a
/// malformed URL. (`INVALID_ARGUMENT` in the core's error table.)
pub const FERROLOCK_ERR_INVALID_ARGUMENT: c_int = 1;
/// The lock is held by someone else and the wait ran out (or it was tried once).
pub const FERROLOCK_ERR_NOT_ACQUIRED: c_int = 2;
/// The lock is no longer held by this handle (released, expired, never held).
pub const FERROLOCK_ERR_NOT_HELD: c_int = 3;
/// The lock could not be kept (renewals failed, or the key was taken or deleted).
pub const FERROLOCK_ERR_LOCK_LOST: c_int = 4;
/// Too few nodes answered to form a quorum.
pub const FERROLOCK_ERR_QUORUM_UNREACHABLE: c_int = 5;
/// Redis answered with another error (ACL denial, OOM, ...). (`REDIS_ERROR` in the core.)
pub const FERROLOCK_ERR_REDIS: c_int = 6;
/// The call was cancelled through a `ferrolock_cancel` (or `ferrolock_acquisition_cancel`);
/// whatever it had taken was given back. (`CANCELLED` in the core's error table.)
pub const FERROLOCK_ERR_CANCELLED: c_int = 7;
/// A bug in ferrolock: a panic was caught at the boundary. The message says where.
pub const FERROLOCK_ERR_PANIC: c_int = 8;
/// Not a failure: `ferrolock_acquisition_result` on an acquisition still under way.
pub const FERROLOCK_PENDING: c_int = -1;

/// An error: its status code (one of `FERROLOCK_ERR_*`) and a message naming the key, the
/// node (password redacted) and the offending value. Owned by the caller: free it with
/// `ferrolock_error_free`.
#[repr(C)]
pub struct ferrolock_error {
    /// One of `FERROLOCK_ERR_*`.
    pub code: c_int,
    /// UTF-8, NUL-terminated, never NULL.
    pub message: *mut c_char,
}

/// A failure on its way to C.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    pub status: c_int,
    pub message: String,
}

impl Failure {
    pub fn new(status: c_int, message: impl Into<String>) -> Failure {
        Failure {
            status,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Failure {
        Failure::new(FERROLOCK_ERR_INVALID_ARGUMENT, message)
    }

    pub fn into_raw(self) -> *mut ferrolock_error {
        Box::into_raw(Box::new(ferrolock_error {
            code: self.status,
            message: to_cstring(self.message).into_raw(),
        }))
    }
}

impl From<ferrolock::Error> for Failure {
    fn from(e: ferrolock::Error) -> Failure {
        Failure::new(status_of(e.kind()), e.message())
    }
}

/// The one mapping from the core's error kinds to status codes.
pub(crate) fn status_of(kind: ErrorKind) -> c_int {
    match kind {
        ErrorKind::InvalidArgument => FERROLOCK_ERR_INVALID_ARGUMENT,
        ErrorKind::NotAcquired => FERROLOCK_ERR_NOT_ACQUIRED,
        ErrorKind::NotHeld => FERROLOCK_ERR_NOT_HELD,
        ErrorKind::LockLost => FERROLOCK_ERR_LOCK_LOST,
        ErrorKind::QuorumUnreachable => FERROLOCK_ERR_QUORUM_UNREACHABLE,
        ErrorKind::Redis => FERROLOCK_ERR_REDIS,
        ErrorKind::Cancelled => FERROLOCK_ERR_CANCELLED,
        // A kind added to the core after this binding was built: reported, not a crash. The
        // test `every_core_kind_has_its_own_status` fails until it gets its own code.
        _ => FERROLOCK_ERR_REDIS,
    }
}

/// A C string from Rust text; an interior NUL (never produced by ferrolock itself) is shown as
/// U+FFFD rather than cutting the message short.
pub(crate) fn to_cstring(text: String) -> CString {
    CString::new(text).unwrap_or_else(|e| {
        let cleaned = String::from_utf8_lossy(&e.into_vec()).replace('\0', "\u{FFFD}");
        CString::new(cleaned).unwrap_or_default()
    })
}

/// Runs one entry point: clears `*err`, catches a panic (logged, never printed: see
/// `ferrolock::host::panic_hook`), and turns a failure into its status (and, when `err` is not NULL, an
/// error object).
pub(crate) fn call(
    entry: &str,
    err: *mut *mut ferrolock_error,
    body: impl FnOnce() -> Result<(), Failure>,
) -> c_int {
    let _no_sigpipe = crate::sigpipe::NoSigpipe::enter();
    if !err.is_null() {
        // SAFETY: the caller passes NULL or a valid `ferrolock_error *` slot.
        unsafe { *err = std::ptr::null_mut() };
    }
    let failure = match ferrolock::host::panic_hook::catch(entry, body) {
        Ok(Ok(())) => return FERROLOCK_OK,
        Ok(Err(failure)) => failure,
        Err(message) => Failure::new(FERROLOCK_ERR_PANIC, message),
    };
    let status = failure.status;
    if !err.is_null() {
        // SAFETY: as above.
        unsafe { *err = failure.into_raw() };
    }
    status
}

/// Runs an entry point that cannot fail, returning `fallback` if it panics.
pub(crate) fn guard<T>(fallback: T, body: impl FnOnce() -> T) -> T {
    let _no_sigpipe = crate::sigpipe::NoSigpipe::enter();
    ferrolock::host::panic_hook::catch("", body).unwrap_or(fallback)
}

/// Frees an error. NULL is ignored.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_error_free(err: *mut ferrolock_error) {
    guard((), || {
        if err.is_null() {
            return;
        }
        // SAFETY: made by `Failure::into_raw`, freed once by the caller's contract.
        let err = unsafe { Box::from_raw(err) };
        if !err.message.is_null() {
            // SAFETY: made by `CString::into_raw` in `Failure::into_raw`.
            drop(unsafe { CString::from_raw(err.message) });
        }
    })
}

/// The stable name of a status code ("OK", "INVALID_ARGUMENT", "LOCK_LOST", "CANCELLED",
/// "PANIC", "PENDING", ...): the core's error codes. A static string; "UNKNOWN" for a number
/// that is no status.
#[unsafe(no_mangle)]
pub extern "C" fn ferrolock_status_name(status: c_int) -> *const c_char {
    let name: &'static [u8] = match status {
        FERROLOCK_OK => b"OK\0",
        FERROLOCK_ERR_INVALID_ARGUMENT => b"INVALID_ARGUMENT\0",
        FERROLOCK_ERR_NOT_ACQUIRED => b"NOT_ACQUIRED\0",
        FERROLOCK_ERR_NOT_HELD => b"NOT_HELD\0",
        FERROLOCK_ERR_LOCK_LOST => b"LOCK_LOST\0",
        FERROLOCK_ERR_QUORUM_UNREACHABLE => b"QUORUM_UNREACHABLE\0",
        FERROLOCK_ERR_REDIS => b"REDIS_ERROR\0",
        FERROLOCK_ERR_CANCELLED => b"CANCELLED\0",
        FERROLOCK_ERR_PANIC => b"PANIC\0",
        FERROLOCK_PENDING => b"PENDING\0",
        _ => b"UNKNOWN\0",
    };
    name.as_ptr().cast()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_core_kind_has_its_own_status() {
        for kind in ErrorKind::ALL {
            let status = status_of(kind);
            // The header's numbers are the core's error table's.
            assert_eq!(status as u32, kind.number(), "{kind:?}");
            // SAFETY: a static NUL-terminated string.
            let name = unsafe { std::ffi::CStr::from_ptr(ferrolock_status_name(status)) };
            assert_eq!(name.to_str().unwrap(), kind.code(), "{kind:?}");
        }
    }

    #[test]
    fn a_panic_becomes_a_status_and_a_message() {
        let mut err = std::ptr::null_mut();
        let status = call("test_entry", &mut err, || panic!("boom"));
        assert_eq!(status, FERROLOCK_ERR_PANIC);
        // SAFETY: filled by `call`.
        let msg = unsafe { std::ffi::CStr::from_ptr((*err).message) };
        assert!(msg.to_str().unwrap().contains("test_entry panicked: boom"));
        unsafe { ferrolock_error_free(err) };
    }
}
