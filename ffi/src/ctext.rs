//! Reading C strings and out-parameters without trusting them.

use std::ffi::{CStr, c_char};

use crate::status::Failure;

/// A copied string argument: NULL and non-UTF-8 are refused with the argument's name.
pub(crate) fn text(ptr: *const c_char, what: &str) -> Result<String, Failure> {
    if ptr.is_null() {
        return Err(Failure::invalid(format!("{what} must not be NULL")));
    }
    // SAFETY: non-NULL; the caller's contract is a NUL-terminated string alive for the call.
    let bytes = unsafe { CStr::from_ptr(ptr) }.to_bytes();
    match std::str::from_utf8(bytes) {
        Ok(s) => Ok(s.to_string()),
        Err(e) => Err(Failure::invalid(format!(
            "{what} is not valid UTF-8 (bad byte at offset {}): {}",
            e.valid_up_to(),
            // Quoted as the library's messages quote a key: a long one (Redis takes keys up to
            // 512 MB) by its start and its length, not repeated whole.
            ferrolock::quoted_key(&shown(&String::from_utf8_lossy(bytes)))
        ))),
    }
}

/// Caller text a message echoes (an option's name or value): a node URL's credentials
/// redacted, as they are in every message about nodes, wherever it was given (another
/// option's value, the name with the value swapped). Text that cannot be a URL is shown as is.
pub(crate) fn echoed(text: &str) -> String {
    if text.contains('@') || text.contains("://") {
        shown(text)
    } else {
        text.to_string()
    }
}

/// A string as a message may echo it: as node URLs (an option value may be a list of nodes),
/// with their credentials redacted; other text has none to lose (a key with an `@` loses what
/// is before it, the safe side).
fn shown(text: &str) -> String {
    ferrolock::split_nodes(text)
        .iter()
        .map(|u| ferrolock::redact_url(u))
        .collect::<Vec<_>>()
        .join(",")
}

/// A required handle argument.
pub(crate) fn handle<'a, T>(ptr: *const T, what: &str) -> Result<&'a T, Failure> {
    if ptr.is_null() {
        return Err(Failure::invalid(format!("{what} must not be NULL")));
    }
    // SAFETY: non-NULL; the caller's contract is a live handle from this library.
    Ok(unsafe { &*ptr })
}

/// An optional handle argument (NULL means "none").
pub(crate) fn optional<'a, T>(ptr: *const T) -> Option<&'a T> {
    // SAFETY: as `handle`, when non-NULL.
    (!ptr.is_null()).then(|| unsafe { &*ptr })
}

/// A required out-parameter, checked before any work is done.
pub(crate) fn out<T>(ptr: *mut T, what: &str) -> Result<*mut T, Failure> {
    if ptr.is_null() {
        return Err(Failure::invalid(format!("{what} must not be NULL")));
    }
    Ok(ptr)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_bad_byte_in_a_node_list_is_named_without_its_password() {
        let value = b"redis://:sekrit@127.0.0.1:1/0\xff,redis://u:pw2@h:2\0";
        let err = super::text(value.as_ptr().cast(), "option value").unwrap_err();
        let message = format!("{err:?}");
        assert!(message.contains("bad byte at offset 29"), "{message}");
        assert!(message.contains("127.0.0.1:1"), "{message}");
        assert!(
            !message.contains("sekrit") && !message.contains("pw2"),
            "{message}"
        );
    }
}
