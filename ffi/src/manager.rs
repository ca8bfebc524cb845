//! `ferrolock_manager`: a `ferrolock::host::Manager` (the nodes, the locks it handed out),
//! its blocking acquires and `release_all`, and the process-exit call.

use std::ffi::{c_char, c_int};
use std::time::Duration;

use ferrolock::LockOptions;
use ferrolock::host::{self, Cancel};

use crate::cancel::ferrolock_cancel;
use crate::ctext::{handle, optional, out, text};
use crate::lock::ferrolock_lock;
use crate::options::ferrolock_options;
use crate::status::{Failure, call, ferrolock_error, guard};

/// A manager: the nodes (one node, or N for Redlock) and the default options of its locks.
/// Thread-safe: one manager serves every thread.
pub struct ferrolock_manager {
    pub(crate) inner: host::Manager,
}

/// Makes a manager from `opts` (copied; not kept). The URLs and each option's value are
/// checked here; the lease as a whole (a ttl its node timeout's loss margin fits) at each
/// acquire, which may set its own ttl. No connection is opened until the first acquire, so a
/// node that is down now is no error.
///
/// Fork: a child forked (without exec) from a process using ferrolock may go on using the
/// managers it inherited (acquire, release_all, free): each builds its own connections in
/// the child, and the child's `ferrolock_shutdown` releases the locks the child took. A lock
/// inherited from the parent is the parent's: in the child it is never held
/// (`ferrolock_lock_is_held` false), `ferrolock_lock_release`, `_extend` and `_check` give
/// `FERROLOCK_ERR_NOT_HELD` ("... a forked child cannot use, extend or release its parent's
/// locks"), it is never renewed or signalled, and its free releases nothing. So is an
/// acquisition inherited under way: in the child it never completes, its result is
/// `FERROLOCK_ERR_NOT_HELD`, and its free returns at once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_manager_new(
    opts: *const ferrolock_options,
    manager_out: *mut *mut ferrolock_manager,
    err: *mut *mut ferrolock_error,
) -> c_int {
    call("ferrolock_manager_new", err, || {
        let slot = out(manager_out, "manager_out")?;
        // SAFETY: checked non-NULL above.
        unsafe { *slot = std::ptr::null_mut() };
        let opts = handle(opts, "opts")?;
        let inner = host::Manager::new(opts.manager_options())?;
        // SAFETY: checked non-NULL above.
        unsafe { *slot = Box::into_raw(Box::new(ferrolock_manager { inner })) };
        Ok(())
    })
}

/// Closes a manager, which stays allocated until `ferrolock_manager_free`. Unlike the free, it
/// may overlap any call on the manager, from any thread or callback: the acquires under way
/// on it (waiting, or in their first round of requests to nodes that do not answer) end at
/// once with `FERROLOCK_ERR_NOT_ACQUIRED` ("lock \"key\" not acquired: its manager was closed
/// while it waited"): a blocking one returns it, a pending `ferrolock_manager_acquire_start`
/// completes with it. Each gives back what it had taken and leaves the key's queue on every
/// node that answers before this returns (waiting at most 5 s; the rest goes on in the
/// background, a node that does not answer undone when it does; but a blocking acquire whose
/// only node is silent undoes its request on its own thread before it returns, up to the node
/// timeout, as after a cancel). Acquires started later
/// fail at once with `FERROLOCK_ERR_INVALID_ARGUMENT` naming the key ("this LockManager is
/// closed"; a later `ferrolock_manager_acquire_start`'s outcome). Locks it handed out stay
/// usable until released or freed, and `ferrolock_manager_release_all` still releases them.
/// A second close returns once the first is done. So a program with threads still calling
/// the manager closes it, joins them (their calls end promptly), then frees it: that free
/// waits for nothing. Fails only for a NULL `manager`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_manager_close(
    manager: *const ferrolock_manager,
    err: *mut *mut ferrolock_error,
) -> c_int {
    call("ferrolock_manager_close", err, || {
        handle(manager, "manager")?
            .inner
            .close_keeping_locks(host::CLOSE_LIMIT);
        Ok(())
    })
}

/// Frees a manager. NULL is ignored. Closes it first unless `ferrolock_manager_close` did
/// (then it returns at once): acquires still waiting on it end with
/// `FERROLOCK_ERR_NOT_ACQUIRED` ("its manager was closed"), as there, waiting at most 5 s.
/// Calls on the manager must not overlap the free, nor start after it: to end calls still
/// running on other threads, close the manager, join them, then free it. Locks it handed out
/// stay usable (renewed, releasable, their loss reported) until released or freed;
/// `ferrolock_shutdown` still releases those held. It does not release them: call
/// `ferrolock_manager_release_all` first for that.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_manager_free(manager: *mut ferrolock_manager) {
    guard((), || {
        if !manager.is_null() {
            // SAFETY: made by `ferrolock_manager_new`, freed once.
            let manager = unsafe { Box::from_raw(manager) };
            manager.inner.close_keeping_locks(host::CLOSE_LIMIT);
        }
    })
}

/// The checked arguments of an acquire.
pub(crate) struct Request {
    pub manager: host::Manager,
    pub key: String,
    pub opts: LockOptions,
    /// `host::NO_OWNER` (C's `FERROLOCK_NO_OWNER`) or the caller's id.
    pub owner: u64,
}

pub(crate) fn request(
    manager: *const ferrolock_manager,
    key: *const c_char,
    opts: *const ferrolock_options,
    owner: u64,
) -> Result<Request, Failure> {
    let manager = handle(manager, "manager")?;
    let key = text(key, "key")?;
    let defaults = manager.inner.defaults();
    let opts: LockOptions = match optional(opts) {
        Some(o) => o.lock_options(defaults)?,
        None => defaults.clone(),
    };
    Ok(Request {
        manager: manager.inner.clone(),
        key,
        opts,
        owner,
    })
}

/// `request` for what `kind` takes: the options carry it (`host::Kind::options`).
fn kind_request(
    kind: host::Kind,
    manager: *const ferrolock_manager,
    key: *const c_char,
    opts: *const ferrolock_options,
    owner: u64,
) -> Result<Request, Failure> {
    // A semaphore's key is its `name` parameter: an error names that.
    let what = if matches!(kind, host::Kind::Permits { .. }) {
        "name"
    } else {
        "key"
    };
    handle(manager, "manager")?;
    text(key, what)?;
    let r = request(manager, key, opts, owner)?;
    Ok(Request {
        opts: kind.options(r.opts),
        ..r
    })
}

/// `request` for a side of the read-write lock `key`.
pub(crate) fn rw_request(
    manager: *const ferrolock_manager,
    key: *const c_char,
    side: c_int,
    opts: *const ferrolock_options,
    owner: u64,
) -> Result<Request, Failure> {
    let kind = match side {
        FERROLOCK_RW_READ => host::Kind::Read,
        FERROLOCK_RW_WRITE => host::Kind::Write,
        _ => {
            return Err(Failure::invalid(format!(
                "side {side} is not FERROLOCK_RW_READ ({FERROLOCK_RW_READ}) or \
                 FERROLOCK_RW_WRITE ({FERROLOCK_RW_WRITE})"
            )));
        }
    };
    kind_request(kind, manager, key, opts, owner)
}

/// `request` for `count` permits of the semaphore `name`, a pool of `permits` (the core
/// names a bad value: permits 0, count above permits or 1000, a `{` or `}` in the name, N > 1
/// nodes).
pub(crate) fn semaphore_request(
    manager: *const ferrolock_manager,
    name: *const c_char,
    permits: u32,
    count: u32,
    opts: *const ferrolock_options,
) -> Result<Request, Failure> {
    kind_request(
        host::Kind::Permits { permits, count },
        manager,
        name,
        opts,
        host::NO_OWNER,
    )
}

/// `side` of a read-write lock: the read side (shared by any number of readers).
pub const FERROLOCK_RW_READ: c_int = 1;
/// `side` of a read-write lock: the write side (held alone).
pub const FERROLOCK_RW_WRITE: c_int = 2;

fn acquire_blocking(
    entry: &str,
    request: impl FnOnce() -> Result<Request, Failure>,
    cancel: *const ferrolock_cancel,
    lock_out: *mut *mut ferrolock_lock,
    err: *mut *mut ferrolock_error,
) -> c_int {
    call(entry, err, || {
        let slot = out(lock_out, "lock_out")?;
        // SAFETY: checked non-NULL above.
        unsafe { *slot = std::ptr::null_mut() };
        let r = request()?;
        let cancel = optional(cancel).map_or_else(Cancel::new, |c| c.inner.clone());
        let lock = r
            .manager
            .acquire_blocking(&r.key, r.owner, &r.opts, &cancel, None)?;
        // SAFETY: checked non-NULL above.
        unsafe { *slot = ferrolock_lock::into_raw(lock) };
        Ok(())
    })
}

/// Acquires `key`, waiting as the options' `wait` says (default: without limit, but a quorum
/// unreachable on three attempts in a row ends it: `FERROLOCK_ERR_QUORUM_UNREACHABLE`). `opts` may be
/// NULL (the manager's defaults); `cancel` may be NULL (not interruptible). On success
/// `*lock_out` is a lock to release and free. Interrupted through `cancel`: returns
/// `FERROLOCK_ERR_CANCELLED`, having given back whatever it had taken.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_manager_acquire(
    manager: *const ferrolock_manager,
    key: *const c_char,
    opts: *const ferrolock_options,
    cancel: *const ferrolock_cancel,
    lock_out: *mut *mut ferrolock_lock,
    err: *mut *mut ferrolock_error,
) -> c_int {
    acquire_blocking(
        "ferrolock_manager_acquire",
        || request(manager, key, opts, host::NO_OWNER),
        cancel,
        lock_out,
        err,
    )
}

/// Tries `key` once (`wait` = 0): `FERROLOCK_ERR_NOT_ACQUIRED` if it is held elsewhere.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_manager_try_acquire(
    manager: *const ferrolock_manager,
    key: *const c_char,
    opts: *const ferrolock_options,
    lock_out: *mut *mut ferrolock_lock,
    err: *mut *mut ferrolock_error,
) -> c_int {
    acquire_blocking(
        "ferrolock_manager_try_acquire",
        || {
            let mut r = request(manager, key, opts, host::NO_OWNER)?;
            r.opts.wait = Some(std::time::Duration::ZERO);
            Ok(r)
        },
        std::ptr::null(),
        lock_out,
        err,
    )
}

/// Acquires `key` for `owner`, an id of the caller's choosing (a thread, a request). With the
/// `reentrant` option on, the same owner re-enters: each handle is released on its own and
/// only the last release frees the key. Otherwise as `ferrolock_manager_acquire`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_manager_acquire_owned(
    manager: *const ferrolock_manager,
    key: *const c_char,
    owner: u64,
    opts: *const ferrolock_options,
    cancel: *const ferrolock_cancel,
    lock_out: *mut *mut ferrolock_lock,
    err: *mut *mut ferrolock_error,
) -> c_int {
    acquire_blocking(
        "ferrolock_manager_acquire_owned",
        || request(manager, key, opts, owner),
        cancel,
        lock_out,
        err,
    )
}

/// Takes `side` (`FERROLOCK_RW_READ` or `FERROLOCK_RW_WRITE`) of the read-write lock `key`
/// (Redisson's `RReadWriteLock` layout): any number of readers share it, a writer holds it
/// alone. On success `*lock_out` is the same lock handle as `ferrolock_manager_acquire`'s
/// (release, extend, loss signal, renewal); fence tokens go to writers only. A read `ttl`
/// above 30 s is `FERROLOCK_ERR_INVALID_ARGUMENT` naming it (Redisson's read renewal lease).
/// `owner` is as in `ferrolock_manager_acquire_owned` (`FERROLOCK_NO_OWNER`: each call its
/// own owner): an owner re-enters either side, may read under its own write lock
/// (downgrade), and asking the write side while it holds only the read side is refused (an
/// upgrade: two upgraders would wait for each other forever). Waits, and is cancelled,
/// as `ferrolock_manager_acquire`; with `wait` = 0 it tries once
/// (`FERROLOCK_ERR_NOT_ACQUIRED` if the other side, or another writer, holds the key).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_manager_rw_acquire(
    manager: *const ferrolock_manager,
    key: *const c_char,
    side: c_int,
    owner: u64,
    opts: *const ferrolock_options,
    cancel: *const ferrolock_cancel,
    lock_out: *mut *mut ferrolock_lock,
    err: *mut *mut ferrolock_error,
) -> c_int {
    acquire_blocking(
        "ferrolock_manager_rw_acquire",
        || rw_request(manager, key, side, opts, owner),
        cancel,
        lock_out,
        err,
    )
}

/// `ferrolock_manager_rw_acquire` of the read side, without an owner.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_manager_read_acquire(
    manager: *const ferrolock_manager,
    key: *const c_char,
    opts: *const ferrolock_options,
    cancel: *const ferrolock_cancel,
    lock_out: *mut *mut ferrolock_lock,
    err: *mut *mut ferrolock_error,
) -> c_int {
    acquire_blocking(
        "ferrolock_manager_read_acquire",
        || rw_request(manager, key, FERROLOCK_RW_READ, opts, host::NO_OWNER),
        cancel,
        lock_out,
        err,
    )
}

/// `ferrolock_manager_rw_acquire` of the write side, without an owner.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_manager_write_acquire(
    manager: *const ferrolock_manager,
    key: *const c_char,
    opts: *const ferrolock_options,
    cancel: *const ferrolock_cancel,
    lock_out: *mut *mut ferrolock_lock,
    err: *mut *mut ferrolock_error,
) -> c_int {
    acquire_blocking(
        "ferrolock_manager_write_acquire",
        || rw_request(manager, key, FERROLOCK_RW_WRITE, opts, host::NO_OWNER),
        cancel,
        lock_out,
        err,
    )
}

/// Tries `side` of the read-write lock `key` once (`wait` = 0), without an owner:
/// `FERROLOCK_ERR_NOT_ACQUIRED` if it is held on the other side or by another writer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_manager_rw_try_acquire(
    manager: *const ferrolock_manager,
    key: *const c_char,
    side: c_int,
    opts: *const ferrolock_options,
    lock_out: *mut *mut ferrolock_lock,
    err: *mut *mut ferrolock_error,
) -> c_int {
    acquire_blocking(
        "ferrolock_manager_rw_try_acquire",
        || {
            let mut r = rw_request(manager, key, side, opts, host::NO_OWNER)?;
            r.opts.wait = Some(std::time::Duration::ZERO);
            Ok(r)
        },
        std::ptr::null(),
        lock_out,
        err,
    )
}

/// `side` of `ferrolock_manager_first_try`: `count` permits of the semaphore `key`, a pool of
/// `permits`.
pub const FERROLOCK_SEMAPHORE: c_int = 3;

/// For a binding's fast path ahead of a wait of its own (Go's `Acquire` tries on the caller's
/// thread, then waits through `ferrolock_manager_acquire_start`): tries once as
/// `ferrolock_manager_try_acquire` (`side` 0), `ferrolock_manager_rw_try_acquire`
/// (`FERROLOCK_RW_READ`, `FERROLOCK_RW_WRITE`) or `ferrolock_manager_semaphore_try_acquire`
/// (`FERROLOCK_SEMAPHORE`, with `permits` and `count`; unused otherwise) do, except that a
/// refusal (`FERROLOCK_ERR_NOT_ACQUIRED`) or a quorum unreachable
/// (`FERROLOCK_ERR_QUORUM_UNREACHABLE`), after which the caller waits, is not counted in the
/// metrics as a failed acquire: the wait that follows is the acquire. A caller that gives up
/// after a refusal counts it with the try functions instead.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_manager_first_try(
    manager: *const ferrolock_manager,
    key: *const c_char,
    side: c_int,
    permits: u32,
    count: u32,
    opts: *const ferrolock_options,
    lock_out: *mut *mut ferrolock_lock,
    err: *mut *mut ferrolock_error,
) -> c_int {
    acquire_blocking(
        "ferrolock_manager_first_try",
        || {
            let mut r = match side {
                0 => request(manager, key, opts, host::NO_OWNER)?,
                FERROLOCK_SEMAPHORE => semaphore_request(manager, key, permits, count, opts)?,
                FERROLOCK_RW_READ | FERROLOCK_RW_WRITE => {
                    rw_request(manager, key, side, opts, host::NO_OWNER)?
                }
                _ => {
                    return Err(Failure::invalid(format!(
                        "side {side} is not 0 (a plain lock), FERROLOCK_RW_READ \
                         ({FERROLOCK_RW_READ}), FERROLOCK_RW_WRITE ({FERROLOCK_RW_WRITE}) or \
                         FERROLOCK_SEMAPHORE ({FERROLOCK_SEMAPHORE})"
                    )));
                }
            };
            r.opts = r.opts.first_try();
            Ok(r)
        },
        std::ptr::null(),
        lock_out,
        err,
    )
}

/// Takes `count` permits of the semaphore `name`, a pool of `permits` (Redisson's
/// `RPermitExpirableSemaphore` layout; the pool size is set by the first acquire, and a
/// different `permits` later is `FERROLOCK_ERR_INVALID_ARGUMENT` naming both). On success
/// `*lock_out` is a lock handle as `ferrolock_manager_acquire`'s: the permits are leased for
/// `ttl`, renewed by the watchdog, signalled when lost, and `ferrolock_lock_release` gives
/// back exactly the `count` taken. A holder that dies without releasing gives them back when
/// its lease ends. Refused with `FERROLOCK_ERR_INVALID_ARGUMENT`, naming the value: `permits`
/// or `count` 0, `count` above `permits` or above 1000, a `{` or `}` in `name`, a manager
/// with more than one node (K permits on each of N nodes do not bound the holders to K), fencing on.
/// Waits, and is cancelled, as `ferrolock_manager_acquire`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_manager_semaphore_acquire(
    manager: *const ferrolock_manager,
    name: *const c_char,
    permits: u32,
    count: u32,
    opts: *const ferrolock_options,
    cancel: *const ferrolock_cancel,
    lock_out: *mut *mut ferrolock_lock,
    err: *mut *mut ferrolock_error,
) -> c_int {
    acquire_blocking(
        "ferrolock_manager_semaphore_acquire",
        || semaphore_request(manager, name, permits, count, opts),
        cancel,
        lock_out,
        err,
    )
}

/// Tries `ferrolock_manager_semaphore_acquire` once (`wait` = 0):
/// `FERROLOCK_ERR_NOT_ACQUIRED` if fewer than `count` permits are free.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_manager_semaphore_try_acquire(
    manager: *const ferrolock_manager,
    name: *const c_char,
    permits: u32,
    count: u32,
    opts: *const ferrolock_options,
    lock_out: *mut *mut ferrolock_lock,
    err: *mut *mut ferrolock_error,
) -> c_int {
    acquire_blocking(
        "ferrolock_manager_semaphore_try_acquire",
        || {
            let mut r = semaphore_request(manager, name, permits, count, opts)?;
            r.opts.wait = Some(std::time::Duration::ZERO);
            Ok(r)
        },
        std::ptr::null(),
        lock_out,
        err,
    )
}

/// Releases every lock this manager handed out and that was not released (held, or lost but
/// perhaps still standing on some node), waiting at most `limit_ms` (the rest goes on in the
/// background); `*released_out` (may be NULL) gets how many were still held on a quorum. The
/// handles stay valid (and need `ferrolock_lock_free`); releasing one of them again gives
/// `*released_out` false, as after any loss. A lock still held is declared lost first ("its
/// manager released it"): its loss callback runs, as for any loss, so a holder still at work
/// is told. For a worker's shutdown, or before `ferrolock_manager_free`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_manager_release_all(
    manager: *const ferrolock_manager,
    limit_ms: u64,
    released_out: *mut usize,
    err: *mut *mut ferrolock_error,
) -> c_int {
    call("ferrolock_manager_release_all", err, || {
        let manager = handle(manager, "manager")?;
        let released = manager.inner.release_all(Duration::from_millis(limit_ms));
        if !released_out.is_null() {
            // SAFETY: non-NULL, the caller's `size_t`.
            unsafe { *released_out = released };
        }
        Ok(())
    })
}

/// The process-exit protocol, for `atexit` or the end of `main`: acquires still waiting give
/// up (`FERROLOCK_ERR_NOT_ACQUIRED`, "the process is exiting"), and every lock of every
/// manager not yet released is released, waiting at most `limit_ms` in all; what is not
/// released by then expires with its ttl. Returns how many were released in time. Acquires started afterwards fail at once.
/// Never blocks longer than `limit_ms` (plus a node timeout for a blocking acquire to return).
#[unsafe(no_mangle)]
pub extern "C" fn ferrolock_shutdown(limit_ms: u64) -> usize {
    guard(0, || host::exit(Duration::from_millis(limit_ms)))
}
