//! Panics are reported through the binding's logger, not printed: the library prints nothing
//! to stderr except through the log callback / logger, and Rust's default panic hook prints
//! the message and a backtrace hint before the binding turns the panic into an error (C's
//! `FERROLOCK_ERR_PANIC`, Python's `PanicException`).
//!
//! The hook is process-wide (per copy of `std`), so it takes only the panics that are the
//! library's and hands every other panic to the hook installed before it. Which are the
//! library's:
//! - [`install_for_module`] (Python's extension, Node's addon): all of them. Each is a
//!   `cdylib` with its own copy of `std`, whose hook no other code in the process reaches, so
//!   every panic it sees is raised by the module's code (ours, PyO3's, napi's). No per-call
//!   marker is needed, so no entry point can be forgotten.
//! - [`entered`] (C): a panic on a thread inside an entry point (marked by the call wrapper),
//!   or on one of the library's own runtime threads. The C library may also be linked
//!   statically next to other code, so it claims only what is surely its own.
//!
//! An application that installs its own hook later replaces ours, as Rust's hooks always do.

use std::cell::Cell;
use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};

thread_local! {
    /// How many entry points this thread is inside (a callback may call in again).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

static INSTALL: Once = Once::new();
/// Every panic the hook sees is the library's (`install_for_module`).
static ALL: AtomicBool = AtomicBool::new(false);

/// Routes every panic of this module to the log (see the module comment): for a binding
/// built as a module of its own, called from its init.
pub fn install_for_module() {
    ALL.store(true, Ordering::SeqCst);
    INSTALL.call_once(install);
}

/// Marks the calling thread as inside an entry point until the returned guard is dropped,
/// installing the hook on first use.
pub fn entered() -> Entered {
    INSTALL.call_once(install);
    DEPTH.with(|d| d.set(d.get() + 1));
    Entered
}

pub struct Entered;

impl Drop for Entered {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
    }
}

/// Runs one entry point of a binding (`entry` names it) inside [`entered`], turning a panic
/// into the message of the binding's PANIC error (C's `FERROLOCK_ERR_PANIC`, Node's error of
/// code `PANIC`): the panic itself was logged by the hook, never printed.
pub fn catch<T>(entry: &str, body: impl FnOnce() -> T) -> Result<T, String> {
    let entered = entered();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
    drop(entered);
    caught.map_err(|payload| panicked(entry, &*payload))
}

/// The message of the binding's PANIC error for a panic caught at `entry`.
pub fn panicked(entry: &str, payload: &(dyn std::any::Any + Send)) -> String {
    let text = crate::error::panic_text(payload);
    format!("ferrolock bug: {entry} panicked: {text} (please report it)")
}

fn ours() -> bool {
    ALL.load(Ordering::SeqCst)
        || DEPTH.try_with(|d| d.get() > 0).unwrap_or(false)
        || crate::runtime::is_library_thread()
}

/// Puts the routing hook in front of the hook in place now.
fn install() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if ours() {
            tracing::error!("ferrolock bug: {info} (please report it)");
        } else {
            previous(info);
        }
    }));
}

#[cfg(test)]
mod tests {
    use std::panic::catch_unwind;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use crate::host::log::{self, LogLevel, LogRecord};

    use super::*;

    static LOGGED: Mutex<Vec<String>> = Mutex::new(Vec::new());
    static PRINTED: AtomicUsize = AtomicUsize::new(0);
    const MARK: &str = "panic-hook-test";

    #[test]
    fn a_panic_in_an_entry_goes_to_the_log_sink_and_others_to_the_previous_hook() {
        log::set_sink(
            Some(Box::new(|r: &LogRecord<'_>| {
                LOGGED.lock().unwrap().push(r.message.to_string())
            })),
            LogLevel::Error,
        )
        .unwrap();
        // The "previous" hook (an application's, or the default that prints): counts ours.
        std::panic::set_hook(Box::new(|info| {
            if info.to_string().contains(MARK) {
                PRINTED.fetch_add(1, Ordering::SeqCst);
            }
        }));
        install();
        let logged = || {
            let logged = LOGGED.lock().unwrap();
            logged.iter().filter(|m| m.contains(MARK)).count()
        };

        let caught = catch_unwind(|| {
            let _entered = entered();
            panic!("{MARK} 1")
        });
        assert!(caught.is_err());
        assert_eq!(logged(), 1, "{:?}", LOGGED.lock().unwrap());
        assert_eq!(
            PRINTED.load(Ordering::SeqCst),
            0,
            "the previous hook ran too"
        );

        // Not the library's: the application's hook sees it, the log does not.
        let _ = std::thread::spawn(|| panic!("{MARK} 2")).join();
        assert_eq!(PRINTED.load(Ordering::SeqCst), 1);
        assert_eq!(logged(), 1);

        // A module of its own claims every panic, on any thread.
        ALL.store(true, Ordering::SeqCst);
        let _ = std::thread::spawn(|| panic!("{MARK} 3")).join();
        ALL.store(false, Ordering::SeqCst);
        assert_eq!(PRINTED.load(Ordering::SeqCst), 1);
        assert_eq!(logged(), 2);
    }
}
