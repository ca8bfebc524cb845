//! `ferrolock_cancel`: interrupts blocking calls from another thread.

use crate::status::guard;
use ferrolock::host::Cancel;

/// A cancellation token: pass it to blocking calls, trigger it from any thread. One-shot: once
/// triggered, every call given it returns `FERROLOCK_ERR_CANCELLED` (at once, if it starts
/// after the trigger).
pub struct ferrolock_cancel {
    pub(crate) inner: Cancel,
}

/// A new, untriggered token.
#[unsafe(no_mangle)]
pub extern "C" fn ferrolock_cancel_new() -> *mut ferrolock_cancel {
    guard(std::ptr::null_mut(), || {
        Box::into_raw(Box::new(ferrolock_cancel {
            inner: Cancel::new(),
        }))
    })
}

/// Triggers the token: calls waiting with it return `FERROLOCK_ERR_CANCELLED`, having given
/// back whatever they had taken. Thread-safe; NULL is ignored.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_cancel_trigger(cancel: *const ferrolock_cancel) {
    guard((), || {
        if let Some(c) = crate::ctext::optional(cancel) {
            c.inner.cancel();
        }
    })
}

/// Whether the token was triggered. False for NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_cancel_is_triggered(cancel: *const ferrolock_cancel) -> bool {
    guard(false, || {
        crate::ctext::optional(cancel).is_some_and(|c| c.inner.is_cancelled())
    })
}

/// Frees the token. NULL is ignored. Only once no call is using it (after they returned).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_cancel_free(cancel: *mut ferrolock_cancel) {
    guard((), || {
        if !cancel.is_null() {
            // SAFETY: made by `ferrolock_cancel_new`, freed once.
            drop(unsafe { Box::from_raw(cancel) });
        }
    })
}
