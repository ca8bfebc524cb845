//! `ferrolock_acquisition`: an acquire that holds no thread while it waits (for Go, and for
//! event loops). Start it, then poll it, or be called back when it is done.

use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

use crate::ctext::{handle, out};
use crate::host::Pending;
use crate::lock::ferrolock_lock;
use crate::manager::{ferrolock_manager, request};
use crate::options::ferrolock_options;
use crate::status::{FERROLOCK_PENDING, Failure, call, ferrolock_error, guard};

/// Called once when an acquisition is done (acquired, failed or cancelled), on a library
/// thread: fetch the outcome with `ferrolock_acquisition_result`. Never called once
/// `ferrolock_acquisition_free` has returned.
pub type ferrolock_done_fn = Option<unsafe extern "C" fn(userdata: *mut c_void)>;

/// `ferrolock_manager_acquire_start`'s `owner` for "no owner" (not a reentrant re-entry).
pub const FERROLOCK_NO_OWNER: u64 = u64::MAX;

/// An acquire under way on the library's threads.
pub struct ferrolock_acquisition {
    pending: Arc<Pending>,
}

struct UserData(*mut c_void);
// SAFETY: the caller promises (in the header) that `userdata` may be used from another
// thread; ferrolock never dereferences it.
unsafe impl Send for UserData {}

/// Starts acquiring `key` and returns at once with `*acquisition_out`. `opts` may be NULL (the
/// manager's defaults); `owner` is an owner id as in `ferrolock_manager_acquire_owned`, or
/// `FERROLOCK_NO_OWNER`; `done` may be NULL (poll instead), else it is called once with
/// `userdata` when the outcome is ready. Bad arguments fail here, before anything starts.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_manager_acquire_start(
    manager: *const ferrolock_manager,
    key: *const c_char,
    opts: *const ferrolock_options,
    owner: u64,
    done: ferrolock_done_fn,
    userdata: *mut c_void,
    acquisition_out: *mut *mut ferrolock_acquisition,
    err: *mut *mut ferrolock_error,
) -> c_int {
    call("ferrolock_manager_acquire_start", err, || {
        let slot = out(acquisition_out, "acquisition_out")?;
        // SAFETY: checked non-NULL above.
        unsafe { *slot = std::ptr::null_mut() };
        let owner = (owner != crate::FERROLOCK_NO_OWNER).then_some(owner);
        let request = request(manager, key, opts, owner)?;
        let done = done.map(|f| {
            let userdata = UserData(userdata);
            Box::new(move |()| {
                let userdata = userdata;
                // SAFETY: the caller's function, called as its header documents.
                unsafe { f(userdata.0) }
            }) as Box<dyn FnOnce(()) + Send>
        });
        let pending = Pending::start(request, done);
        // SAFETY: checked non-NULL above.
        unsafe { *slot = Box::into_raw(Box::new(ferrolock_acquisition { pending })) };
        Ok(())
    })
}

/// The outcome: `FERROLOCK_PENDING` while under way; otherwise, once, `FERROLOCK_OK` with
/// `*lock_out` set, or the acquire's error (`FERROLOCK_ERR_CANCELLED` after a cancel that came
/// first). A second call after the outcome was taken is `FERROLOCK_ERR_INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_acquisition_result(
    acquisition: *const ferrolock_acquisition,
    lock_out: *mut *mut ferrolock_lock,
    err: *mut *mut ferrolock_error,
) -> c_int {
    let mut pending = false;
    let status = call("ferrolock_acquisition_result", err, || {
        let slot = out(lock_out, "lock_out")?;
        // SAFETY: checked non-NULL above.
        unsafe { *slot = std::ptr::null_mut() };
        let acquisition = handle(acquisition, "acquisition")?;
        match acquisition.pending.take() {
            None => {
                pending = true;
                Ok(())
            }
            Some(Ok(lock)) => {
                // SAFETY: checked non-NULL above.
                unsafe { *slot = ferrolock_lock::into_raw(lock) };
                Ok(())
            }
            Some(Err(failure)) => Err::<(), Failure>(failure),
        }
    });
    if pending { FERROLOCK_PENDING } else { status }
}

/// Cancels the acquire (thread-safe): it gives back whatever it had taken, and its outcome
/// becomes `FERROLOCK_ERR_CANCELLED` unless it had already been decided. `done` is still
/// called. NULL is ignored.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_acquisition_cancel(acquisition: *const ferrolock_acquisition) {
    guard((), || {
        if let Some(a) = crate::ctext::optional(acquisition) {
            a.pending.cancel.cancel();
        }
    })
}

/// Frees the acquisition: cancels it if under way, releases a lock it got that was not taken
/// with `ferrolock_acquisition_result`, and waits for a `done` call already running; `done` is
/// never called once this has returned (unless this is called from inside `done`). NULL is
/// ignored.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_acquisition_free(acquisition: *mut ferrolock_acquisition) {
    guard((), || {
        if acquisition.is_null() {
            return;
        }
        // SAFETY: made by `ferrolock_manager_acquire_start`, freed once.
        let acquisition = unsafe { Box::from_raw(acquisition) };
        acquisition.pending.abandon();
    })
}
