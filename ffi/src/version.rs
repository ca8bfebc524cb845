//! The library's version, for programs that check at run time what they were linked against.

use std::ffi::c_char;

/// The library's version, "MAJOR.MINOR.PATCH" (the workspace's): a static string. Compare it
/// with FERROLOCK_VERSION_STRING to tell the header a program was compiled with from the
/// library it runs with.
#[unsafe(no_mangle)]
pub extern "C" fn ferrolock_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}
