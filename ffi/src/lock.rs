//! `ferrolock_lock`: a held lock, its accessors, extend, release and the loss callback.

use std::ffi::{CString, c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ferrolock::LockStatus;
use ferrolock::host::{self, Cancel};

use crate::cancel::ferrolock_cancel;
use crate::ctext::{handle, optional};
use crate::status::{FERROLOCK_ERR_LOCK_LOST, Failure, call, ferrolock_error, guard, to_cstring};

/// Called once if a lock is lost: `userdata` as registered, and the reason (code
/// `FERROLOCK_ERR_LOCK_LOST`; valid only during the call, not to be freed).
///
/// What it may call: any ferrolock function, the blocking ones included:
/// `ferrolock_lock_release`, `ferrolock_lock_extend` and `ferrolock_lock_free` of this very
/// lock (from inside its own callback they do not wait for the callback), other locks'
/// calls (a release or free waits for the other lock's running callback, unless that one
/// waits, through releases or frees of its own, for this thread: two callbacks that release
/// each other's locks do not wait for each other for ever), `ferrolock_manager_acquire` (waiting) and
/// `ferrolock_manager_try_acquire` (unlike the log callback). It runs on one library thread of a pool, not the runtime's: the
/// renewals of the other locks go on while it waits.
pub type ferrolock_lost_fn =
    Option<unsafe extern "C" fn(userdata: *mut c_void, reason: *const ferrolock_error)>;

/// `ferrolock_lock_extend`'s `ttl_ms` for "the lease in force".
pub const FERROLOCK_SAME_TTL: u64 = 0;

/// A held lock. Thread-safe, except that `ferrolock_lock_free` must be the last call on it.
pub struct ferrolock_lock {
    /// The host layer's lock: its loss subscription gives the callback's guarantees.
    lock: host::Lock,
    key: CString,
    token: CString,
    has_callback: AtomicBool,
}

impl ferrolock_lock {
    pub(crate) fn into_raw(lock: host::Lock) -> *mut ferrolock_lock {
        Box::into_raw(Box::new(ferrolock_lock {
            key: to_cstring(lock.key().to_string()),
            token: to_cstring(lock.core().token().to_string()),
            lock,
            has_callback: AtomicBool::new(false),
        }))
    }
}

/// A pointer `Send` may carry to the library thread that runs the callback: the caller
/// promises (in the header) that `userdata` may be used from another thread.
struct UserData(*mut c_void);
// SAFETY: see above; ferrolock never dereferences it.
unsafe impl Send for UserData {}

/// The key (valid until the lock is freed). NULL for NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_lock_key(lock: *const ferrolock_lock) -> *const c_char {
    guard(std::ptr::null(), || {
        optional(lock).map_or(std::ptr::null(), |l| l.key.as_ptr())
    })
}

/// The token (valid until the lock is freed): a plain lock's value stored at the key, unique
/// to this acquisition; a reentrant or read-write lock's hash field (`<client uuid>:<owner
/// id>`), shared by one owner's re-entries; a semaphore's permit id. NULL for NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_lock_token(lock: *const ferrolock_lock) -> *const c_char {
    guard(std::ptr::null(), || {
        optional(lock).map_or(std::ptr::null(), |l| l.token.as_ptr())
    })
}

/// The fence token of this grant (the `fencing` option): strictly greater than every earlier
/// grant's of the key. `FERROLOCK_ERR_INVALID_ARGUMENT` when fencing is off.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_lock_fence(
    lock: *const ferrolock_lock,
    fence_out: *mut u64,
    err: *mut *mut ferrolock_error,
) -> c_int {
    call("ferrolock_lock_fence", err, || {
        let lock = handle(lock, "lock")?;
        let slot = crate::ctext::out(fence_out, "fence_out")?;
        let fence = lock.lock.core().fence().ok_or_else(|| {
            Failure::invalid(format!(
                "lock {} has no fence token: acquire it with the fencing option on",
                ferrolock::quoted_key(lock.lock.key())
            ))
        })?;
        // SAFETY: checked non-NULL above.
        unsafe { *slot = fence };
        Ok(())
    })
}

/// Milliseconds left before the validity ends; 0 once released, lost or expired, and for NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_lock_validity_ms(lock: *const ferrolock_lock) -> u64 {
    guard(0, || {
        optional(lock).map_or(0, |l| l.lock.core().validity().as_millis() as u64)
    })
}

/// Held, and the validity has not ended. False for NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_lock_is_held(lock: *const ferrolock_lock) -> bool {
    guard(false, || {
        optional(lock).is_some_and(|l| l.lock.core().is_held())
    })
}

/// Lost: renewals failed, or the key was taken or deleted. False for NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_lock_is_lost(lock: *const ferrolock_lock) -> bool {
    guard(false, || {
        optional(lock).is_some_and(|l| matches!(l.lock.core().status(), LockStatus::Lost(_)))
    })
}

/// `FERROLOCK_OK` while held; `FERROLOCK_ERR_LOCK_LOST` (with the reason) once lost,
/// `FERROLOCK_ERR_NOT_HELD` once released or expired.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_lock_check(
    lock: *const ferrolock_lock,
    err: *mut *mut ferrolock_error,
) -> c_int {
    call("ferrolock_lock_check", err, || {
        Ok(handle(lock, "lock")?.lock.core().check()?)
    })
}

/// Sets `callback` to be told if the lock is lost. Guarantees: it runs on a library thread
/// (never the caller's, except in `ferrolock_lock_free_collected`), at most once, and never after `ferrolock_lock_release` or
/// `ferrolock_lock_free` of this lock has returned: those wait for a call already running
/// (unless made from inside the callback itself). It may call back in (see
/// `ferrolock_lost_fn`); while it runs, `ferrolock_lock_release` and `ferrolock_lock_free` of
/// this lock on other threads wait for it, so keep it short or hand the news on.
/// `userdata` is passed back as is and must be usable from another thread. Called at once (on
/// a library thread) if the lock is already lost. One callback per lock.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_lock_on_lost(
    lock: *const ferrolock_lock,
    callback: ferrolock_lost_fn,
    userdata: *mut c_void,
    err: *mut *mut ferrolock_error,
) -> c_int {
    call("ferrolock_lock_on_lost", err, || {
        let lock = handle(lock, "lock")?;
        let Some(callback) = callback else {
            return Err(Failure::invalid("callback must not be NULL"));
        };
        if lock.has_callback.swap(true, Ordering::SeqCst) {
            return Err(Failure::invalid(format!(
                "lock {} already has a lost callback",
                ferrolock::quoted_key(lock.lock.key())
            )));
        }
        let userdata = UserData(userdata);
        lock.lock.on_lost(move |reason| {
            let userdata = userdata;
            let message = to_cstring(reason.to_string());
            let reason = ferrolock_error {
                code: FERROLOCK_ERR_LOCK_LOST,
                message: message.as_ptr().cast_mut(),
            };
            // SAFETY: the caller's function, called as its header documents.
            unsafe { callback(userdata.0, &reason) };
        });
        Ok(())
    })
}

/// Renews the lock on a quorum for `ttl_ms` (`FERROLOCK_SAME_TTL`: the lease in force), and
/// puts the new validity in `*validity_ms_out` (may be NULL). No node's expiry is shortened:
/// a shorter ttl takes effect there as the longer one runs down. On failure the validity is
/// unchanged. `cancel` may be NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_lock_extend(
    lock: *const ferrolock_lock,
    ttl_ms: u64,
    cancel: *const ferrolock_cancel,
    validity_ms_out: *mut u64,
    err: *mut *mut ferrolock_error,
) -> c_int {
    call("ferrolock_lock_extend", err, || {
        let lock = handle(lock, "lock")?;
        let max = ferrolock::MAX_DURATION.as_millis();
        if u128::from(ttl_ms) > max {
            // Named as passed: the core's message would give it in seconds.
            return Err(Failure::invalid(format!(
                "{} {}: ttl_ms {ttl_ms} is too long: the maximum is {max} (about 24.8 days)",
                lock.lock.what(),
                ferrolock::quoted_key(lock.lock.key())
            )));
        }
        let cancel = optional(cancel).map_or_else(Cancel::new, |c| c.inner.clone());
        let ttl = (ttl_ms != FERROLOCK_SAME_TTL).then(|| Duration::from_millis(ttl_ms));
        let validity = lock.lock.extend_blocking(ttl, &cancel, None)?;
        if !validity_ms_out.is_null() {
            // SAFETY: non-NULL, the caller's `uint64_t`.
            unsafe { *validity_ms_out = validity.as_millis() as u64 };
        }
        Ok(())
    })
}

/// Releases the lock on every node (compare-and-delete: never someone else's). The loss
/// callback is disarmed first. `*released_out` (may be NULL) says whether a quorum still held
/// our token (false: it had expired or been taken, which is `FERROLOCK_OK` all the same).
/// Releasing twice gives `FERROLOCK_ERR_NOT_HELD`; no quorum of nodes answering,
/// `FERROLOCK_ERR_QUORUM_UNREACHABLE` (those keep the key until its ttl). The handle still
/// needs `ferrolock_lock_free`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_lock_release(
    lock: *const ferrolock_lock,
    released_out: *mut bool,
    err: *mut *mut ferrolock_error,
) -> c_int {
    call("ferrolock_lock_release", err, || {
        let lock = handle(lock, "lock")?;
        lock.lock.quiesce();
        // Not cancellable: a release runs to its end.
        let released = lock.lock.release_blocking(&Cancel::new(), None)?;
        if !released_out.is_null() {
            // SAFETY: non-NULL, the caller's `bool`.
            unsafe { *released_out = released };
        }
        Ok(())
    })
}

/// Ends a scope that held `lock` (Go's `WithLock`; a C caller's own "with" helper): releases
/// it unless it was released already (in the body), then applies the end-of-scope rule every
/// binding shares (DESIGN.md, "Host layer", `scope.rs`). `body_failed`: the body ended with
/// an error (or a panic). `FERROLOCK_OK`: the body's own outcome stands (after a warning to
/// the log callback, for a lock gone at release or a failed release after a failed body).
/// Otherwise the error to report instead: `FERROLOCK_ERR_LOCK_LOST` for a lock lost, or found
/// gone at the release after a body that succeeded, or the release's own error; with
/// `*caused_by_body_out` (may be NULL) true when it is to be reported together with the body's
/// error (a loss while the body failed). The loss callback is disarmed first. The handle still
/// needs `ferrolock_lock_free`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_lock_end_scope(
    lock: *const ferrolock_lock,
    body_failed: bool,
    caused_by_body_out: *mut bool,
    err: *mut *mut ferrolock_error,
) -> c_int {
    call("ferrolock_lock_end_scope", err, || {
        let lock = handle(lock, "lock")?;
        lock.lock.quiesce();
        let body = if body_failed {
            host::scope::Body::Failed
        } else {
            host::scope::Body::Finished
        };
        let (error, chain) = match host::scope::end_blocking(&lock.lock, body) {
            host::scope::ScopeEnd::Clean => return Ok(()),
            host::scope::ScopeEnd::Log(message) => {
                tracing::warn!(target: "ferrolock", "{message}");
                return Ok(());
            }
            host::scope::ScopeEnd::Raise { error, chain } => (error, chain),
        };
        if !caused_by_body_out.is_null() {
            // SAFETY: non-NULL, the caller's `bool`.
            unsafe { *caused_by_body_out = chain };
        }
        Err(error.into())
    })
}

/// Frees the handle. A lock not released is released in the background. The loss callback
/// is never called once this has returned; it waits for a call already running, which may
/// still release or extend the lock through this handle (not free it: this is its free). NULL
/// is ignored.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_lock_free(lock: *mut ferrolock_lock) {
    // SAFETY: the caller's promise, passed on.
    unsafe { free_lock(lock, false) }
}

/// `ferrolock_lock_free` for a binding's garbage collector (a finalizer, such as Go's): a lock
/// still held, with no release begun, is released in the background and a warning naming its
/// key goes to the log callback, since the collection may come before the work the lock
/// guards has ended. Its loss callback, if set, is called first, on this thread, with that
/// warning as the reason (`FERROLOCK_ERR_LOCK_LOST`): whatever still watches the lock's loss
/// is told that the work is no longer guarded. That callback may release or extend the lock
/// through this handle, not free it (this is its free). NULL is ignored.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_lock_free_collected(lock: *mut ferrolock_lock) {
    // SAFETY: the caller's promise, passed on.
    unsafe { free_lock(lock, true) }
}

/// # Safety
/// `lock` is NULL or made by `ferrolock_lock::into_raw`, freed once, with no call on it in
/// flight.
unsafe fn free_lock(lock: *mut ferrolock_lock, collected: bool) {
    guard((), || {
        if lock.is_null() {
            return;
        }
        // SAFETY: see this function's contract.
        let lock = unsafe { Box::from_raw(lock) };
        // The handle's memory goes only once these have returned: the loss callback they run
        // or wait for may still use it (release or extend its own lock).
        if collected {
            lock.lock.free_collected();
        } else {
            lock.lock.free();
        }
        drop(lock);
    })
}
