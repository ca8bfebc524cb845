//! Panics caught at the boundary are reported through the log callback, not printed: the
//! library prints nothing to stderr (the header's promise), and Rust's default panic hook
//! would print the message and a backtrace before `call` turns the panic into
//! `FERROLOCK_ERR_PANIC`.
//!
//! The hook is process-wide, so ours only takes the panics that are the library's (on a thread
//! inside an entry point, or on one of the library's own threads) and hands every other panic
//! to the hook that was installed before it. An application that installs its own hook later
//! replaces ours, as Rust's hooks always do.

use std::cell::Cell;
use std::sync::Once;

thread_local! {
    /// How many entry points this thread is inside (a callback may call in again).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

static INSTALL: Once = Once::new();

/// Marks the calling thread as inside an entry point until the returned guard is dropped,
/// installing the hook on first use.
pub(crate) fn entered() -> Entered {
    INSTALL.call_once(install);
    DEPTH.with(|d| d.set(d.get() + 1));
    Entered
}

pub(crate) struct Entered;

impl Drop for Entered {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
    }
}

fn ours() -> bool {
    DEPTH.try_with(|d| d.get() > 0).unwrap_or(false) || ferrolock::runtime::is_library_thread()
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
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use ferrolock::host::log::{self, LogLevel, LogRecord};

    use super::*;
    use crate::status::{FERROLOCK_ERR_PANIC, call};

    static LOGGED: Mutex<Vec<String>> = Mutex::new(Vec::new());
    static PRINTED: AtomicUsize = AtomicUsize::new(0);
    const MARK: &str = "panic-hook-test";

    #[test]
    fn a_panic_in_an_entry_goes_to_the_log_callback_and_others_to_the_previous_hook() {
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

        let status = call("test_entry", std::ptr::null_mut(), || panic!("{MARK} 1"));
        assert_eq!(status, FERROLOCK_ERR_PANIC);
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
    }
}
