//! `ferrolock_acquisition`: an acquire that holds no thread while it waits (for Go, and for
//! event loops). Start it, then poll it, or be called back when it is done.

use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::ThreadId;

use ferrolock::ErrorKind;
use ferrolock::host::{self, Cancel};

use crate::ctext::{handle, out};
use crate::lock::ferrolock_lock;
use crate::manager::{Request, ferrolock_manager, request, rw_request, semaphore_request};
use crate::options::ferrolock_options;
use crate::status::{FERROLOCK_PENDING, Failure, call, ferrolock_error, guard};

/// Called once when an acquisition is done (acquired, failed or cancelled), on a library
/// thread: fetch the outcome with `ferrolock_acquisition_result`. Never called once
/// `ferrolock_acquisition_free` has returned. It may run before
/// `ferrolock_manager_acquire_start` has returned, but never before `*acquisition_out` was
/// written, so `userdata` may lead to that slot.
///
/// What it may call: any ferrolock function, the blocking ones included:
/// `ferrolock_acquisition_result` and `ferrolock_acquisition_free` on this acquisition (a
/// free from inside `done` does not wait for `done`), release, extend and free of any lock,
/// `ferrolock_manager_acquire` (waiting) and `ferrolock_manager_try_acquire` (unlike the
/// log callback). While it waits it holds one library thread of a pool; the renewals of the
/// process's locks go on.
pub type ferrolock_done_fn = Option<unsafe extern "C" fn(userdata: *mut c_void)>;

/// `ferrolock_manager_acquire_start`'s `owner` for "no owner" (not a reentrant re-entry).
pub const FERROLOCK_NO_OWNER: u64 = u64::MAX;
const _: () = assert!(FERROLOCK_NO_OWNER == host::NO_OWNER);

/// An acquire under way on the library's threads (`host::Manager::acquire_start`): its
/// outcome until taken, and the caller's `done` with the guarantees the header gives.
pub struct ferrolock_acquisition {
    state: Arc<State>,
    /// The process that started it: in a forked child its task and `done` are the parent's
    /// (a `done` running at the fork never finishes there), so the child never waits on,
    /// locks or frees its state.
    pid: u32,
}

impl ferrolock_acquisition {
    fn inherited(&self) -> bool {
        self.pid != host::pid()
    }

    fn inherited_error(&self) -> Failure {
        Failure::from(ferrolock::Error::new(
            ErrorKind::NotHeld,
            format!(
                "this acquisition belongs to process {}, which started it; a forked child \
                 cannot use its parent's acquisitions",
                self.pid
            ),
        ))
    }
}

struct State {
    /// What it acquires, as messages name it (`lock "key"`).
    what: String,
    outcome: Mutex<Outcome>,
    cancel: Cancel,
    done: DoneSlot,
}

enum Outcome {
    Waiting,
    Done(Result<host::Lock, Failure>),
    Taken,
}

impl State {
    /// The outcome, once: `None` while under way.
    fn take(&self) -> Option<Result<host::Lock, Failure>> {
        let mut outcome = self.outcome.lock().unwrap_or_else(|p| p.into_inner());
        match std::mem::replace(&mut *outcome, Outcome::Taken) {
            Outcome::Waiting => {
                *outcome = Outcome::Waiting;
                None
            }
            Outcome::Done(out) => Some(out),
            Outcome::Taken => Some(Err(Failure::invalid(format!(
                "{}: the acquisition's result was already taken",
                self.what
            )))),
        }
    }
}

/// The caller's `done`: called at most once, never after `disarm` has returned, and `disarm`
/// waits for a call already running (unless made from inside that call, which would wait for
/// itself). C glue: the host layer calls back once, but cannot know when C lets go.
struct DoneSlot {
    /// The callback until called or disarmed, and the thread running it now.
    state: Mutex<(Option<Done>, Option<ThreadId>)>,
    finished: Condvar,
}

type Done = Box<dyn FnOnce() + Send>;

impl DoneSlot {
    fn fire(&self) {
        let callback = {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let Some(callback) = s.0.take() else {
                return;
            };
            s.1 = Some(std::thread::current().id());
            callback
        };
        // A panic cannot come out of a C function pointer; this only keeps the slot sane.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(callback));
        self.state.lock().unwrap_or_else(|p| p.into_inner()).1 = None;
        self.finished.notify_all();
    }

    fn disarm(&self) {
        let me = std::thread::current().id();
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.0 = None;
        while s.1.is_some_and(|t| t != me) {
            s = self.finished.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }
}

struct UserData(*mut c_void);
// SAFETY: the caller promises (in the header) that `userdata` may be used from another
// thread; ferrolock never dereferences it.
unsafe impl Send for UserData {}

/// Starts acquiring `key` and returns at once with `*acquisition_out`. `opts` may be NULL (the
/// manager's defaults); `owner` is an owner id as in `ferrolock_manager_acquire_owned`, or
/// `FERROLOCK_NO_OWNER`; `done` may be NULL (poll instead), else it is called once with
/// `userdata` when the outcome is ready (see `ferrolock_done_fn`: `*acquisition_out` is
/// written before the acquire starts, so `done` always finds it). Bad arguments (a NULL
/// pointer, an empty key, bad options, a lease the watchdog cannot keep) fail here, before
/// anything starts, with `*acquisition_out` NULL.
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
    start(
        "ferrolock_manager_acquire_start",
        || checked(request(manager, key, opts, owner)),
        done,
        userdata,
        acquisition_out,
        err,
    )
}

/// `ferrolock_manager_acquire_start` of `side` (`FERROLOCK_RW_READ` or `FERROLOCK_RW_WRITE`)
/// of the read-write lock `key`: the outcome is as `ferrolock_manager_rw_acquire`'s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_manager_rw_acquire_start(
    manager: *const ferrolock_manager,
    key: *const c_char,
    side: c_int,
    opts: *const ferrolock_options,
    owner: u64,
    done: ferrolock_done_fn,
    userdata: *mut c_void,
    acquisition_out: *mut *mut ferrolock_acquisition,
    err: *mut *mut ferrolock_error,
) -> c_int {
    start(
        "ferrolock_manager_rw_acquire_start",
        || checked(rw_request(manager, key, side, opts, owner)),
        done,
        userdata,
        acquisition_out,
        err,
    )
}

/// `ferrolock_manager_acquire_start` of `count` permits of the semaphore `name`, a pool of
/// `permits`: the outcome is as `ferrolock_manager_semaphore_acquire`'s. NULL pointers fail
/// here; a value the semaphore refuses (`permits`, `count`, `name`, the nodes) is the outcome.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_manager_semaphore_acquire_start(
    manager: *const ferrolock_manager,
    name: *const c_char,
    permits: u32,
    count: u32,
    opts: *const ferrolock_options,
    done: ferrolock_done_fn,
    userdata: *mut c_void,
    acquisition_out: *mut *mut ferrolock_acquisition,
    err: *mut *mut ferrolock_error,
) -> c_int {
    start(
        "ferrolock_manager_semaphore_acquire_start",
        || semaphore_request(manager, name, permits, count, opts),
        done,
        userdata,
        acquisition_out,
        err,
    )
}

/// A lock request with what its acquire would refuse before sending anything refused now, as
/// the header promises ("bad arguments fail here").
fn checked(request: Result<Request, Failure>) -> Result<Request, Failure> {
    let r = request?;
    ferrolock::check_request(&r.key, &r.opts)?;
    Ok(r)
}

fn start(
    entry: &str,
    request: impl FnOnce() -> Result<Request, Failure>,
    done: ferrolock_done_fn,
    userdata: *mut c_void,
    acquisition_out: *mut *mut ferrolock_acquisition,
    err: *mut *mut ferrolock_error,
) -> c_int {
    call(entry, err, || {
        let slot = out(acquisition_out, "acquisition_out")?;
        // SAFETY: checked non-NULL above.
        unsafe { *slot = std::ptr::null_mut() };
        let r = request()?;
        let done = done.map(|f| {
            let userdata = UserData(userdata);
            Box::new(move || {
                let userdata = userdata;
                // SAFETY: the caller's function, called as its header documents.
                unsafe { f(userdata.0) }
            }) as Done
        });
        let state = Arc::new(State {
            what: format!("{} {}", host::noun(&r.opts), ferrolock::quoted_key(&r.key)),
            outcome: Mutex::new(Outcome::Waiting),
            cancel: Cancel::new(),
            done: DoneSlot {
                state: Mutex::new((done, None)),
                finished: Condvar::new(),
            },
        });
        let (finished, cancel) = (state.clone(), state.cancel.clone());
        // Written before the acquire starts: `done` may run (and read the slot, or free the
        // acquisition) before `acquire_start` has returned.
        // SAFETY: checked non-NULL above.
        unsafe {
            *slot = Box::into_raw(Box::new(ferrolock_acquisition {
                state,
                pid: host::pid(),
            }))
        };
        // `done` runs on a library thread that may block (the host's rule).
        r.manager
            .acquire_start(&r.key, r.owner, &r.opts, cancel, move |out| {
                *finished.outcome.lock().unwrap_or_else(|p| p.into_inner()) =
                    Outcome::Done(out.map_err(Failure::from));
                finished.done.fire();
            });
        Ok(())
    })
}

/// The outcome: `FERROLOCK_PENDING` while under way; otherwise, once, `FERROLOCK_OK` with
/// `*lock_out` set, or the acquire's error (`FERROLOCK_ERR_CANCELLED` after a cancel that came
/// first). A second call after the outcome was taken is `FERROLOCK_ERR_INVALID_ARGUMENT`,
/// naming the key. `*lock_out` is set to NULL first, whatever the outcome (as every call with
/// an out parameter does): never pass the address of a handle you still hold. In a forked
/// child, an acquisition inherited from the parent gives `FERROLOCK_ERR_NOT_HELD` (and its
/// cancel does nothing): it is the parent's.
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
        if acquisition.inherited() {
            return Err(acquisition.inherited_error());
        }
        match acquisition.state.take() {
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
/// called, and a `FERROLOCK_ERR_CANCELLED` outcome is ready only once nothing of the acquire
/// (key, hold count, queue entry) is left on any node that answered: another client may take
/// the key at once. A node that does not answer within the node timeout is undone in the
/// background once it does (`ferrolock_shutdown` waits for that). NULL is ignored.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_acquisition_cancel(acquisition: *const ferrolock_acquisition) {
    guard((), || {
        if let Some(a) = crate::ctext::optional(acquisition)
            && !a.inherited()
        {
            a.state.cancel.cancel();
        }
    })
}

/// Frees the acquisition: cancels it if under way, releases a lock it got that was not taken
/// with `ferrolock_acquisition_result`, and waits for a `done` call already running; `done` is
/// never called once this has returned (unless this is called from inside `done`). NULL is
/// ignored. In a forked child, an acquisition inherited from the parent is left alone: its
/// free returns at once, waits for nothing and releases nothing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_acquisition_free(acquisition: *mut ferrolock_acquisition) {
    guard((), || {
        if acquisition.is_null() {
            return;
        }
        // SAFETY: made by `ferrolock_manager_acquire_start`, freed once.
        let acquisition = unsafe { Box::from_raw(acquisition) };
        if acquisition.inherited() {
            // The parent's: its mutexes may be held for good here, and dropping it would
            // release a lock the parent holds. Leaked, as every inherited registry is.
            std::mem::forget(acquisition);
            return;
        }
        let state = &acquisition.state;
        state.cancel.cancel();
        state.done.disarm();
        // A lock granted and not taken: dropping it releases it in the background.
        drop(state.take());
    })
}
