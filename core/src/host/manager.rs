//! `host::Manager`: the core manager plus what a binding's process needs of it: the locks it
//! handed out (for `release_all`, `close` and exit), closing, and the reentrancy owner the
//! binding supplies with each acquire.
//!
//! Exit finds every lock of the process through the registry of managers, however the
//! binding freed its handles: a lock keeps its manager's entry alive (`host::Lock` holds a
//! `Manager`), a manager first used in a forked child registers there, and a lock dropped
//! unreleased is released by a counted task exit waits for (`runtime::Pending`).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::error::Shown;
use crate::error::{Error, Result};
use crate::host::call;
use crate::host::cancel::{self, Cancel, Check};
use crate::host::exit::{self, BlockingAcquire};
use crate::host::flag::Flag;
use crate::host::lock::Lock;
use crate::lock::{Lock as CoreLock, LockStatus};
use crate::manager::LockManager;
use crate::options::{LockOptions, ManagerOptions, Permits, RwSide};
use crate::per_process::{PerProcess, ProcessCount};

/// The owner of an acquire that nothing re-enters (C's `FERROLOCK_NO_OWNER`): each such
/// reentrant grant has a hold count of its own.
pub const NO_OWNER: u64 = u64::MAX;

/// What an acquire takes: the lock, a side of the read-write lock (DESIGN.md, "Read-write
/// lock"), or permits of a semaphore (DESIGN.md, "Semaphore"). It travels in the options
/// (`Kind::options`), the one way every binding gives it, so every way to call an acquire
/// (async, blocking, completion-based) takes every kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Lock,
    Read,
    Write,
    /// `count` permits of the semaphore named by the key, a pool of `permits`. Each acquire
    /// is a holder of its own: the owner is not used (a semaphore does not re-enter).
    Permits {
        permits: u32,
        count: u32,
    },
}

impl Kind {
    /// The kind `opts` carry (see [`Kind::options`]): what a lock acquired with them holds.
    pub fn of(opts: &LockOptions) -> Kind {
        match (opts.rw, opts.permits) {
            (_, Some(p)) => Kind::Permits {
                permits: p.permits,
                count: p.count,
            },
            (Some(RwSide::Read), None) => Kind::Read,
            (Some(RwSide::Write), None) => Kind::Write,
            (None, None) => Kind::Lock,
        }
    }

    /// `opts` for this kind.
    pub fn options(self, mut opts: LockOptions) -> LockOptions {
        opts.rw = match self {
            Kind::Read => Some(RwSide::Read),
            Kind::Write => Some(RwSide::Write),
            Kind::Lock | Kind::Permits { .. } => None,
        };
        opts.permits = match self {
            Kind::Permits { permits, count } => Some(Permits { permits, count }),
            _ => None,
        };
        opts
    }
}

/// How long a binding's `close` (C's `ferrolock_manager_free`, Go's `Close`, Python's and
/// Node's `close()`) waits for the waits it ends and the releases it makes; the rest goes on
/// in the background.
pub const CLOSE_LIMIT: Duration = Duration::from_secs(5);

/// A manager as a binding holds it. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Manager {
    inner: Arc<Inner>,
}

struct Inner {
    /// The core manager, `None` once closed. Per process: a forked child builds its own
    /// from `options` on first use (never touching the inherited mutex).
    core: PerProcess<Mutex<Option<LockManager>>>,
    options: ManagerOptions,
    /// Closed in some process: a child forked after the close starts closed too. Acquires
    /// waiting on the manager give up when it is set.
    closed: Flag,
    /// Acquires in progress on this manager (in this process), for `close` to wait for.
    acquiring: ProcessCount,
    /// The process whose `close` is under way (0: none), then `u32::MAX` once it is done: a
    /// second `close` in that process waits for the first (see `close_then`).
    closing: AtomicU32,
    /// The locks handed out in this process, weakly.
    handed: PerProcess<Mutex<Vec<Weak<CoreLock>>>>,
    nodes: Vec<String>,
    /// See [`Manager::servers`].
    servers: String,
    quorum: usize,
}

/// Every manager of this process, weakly, for the exit protocol.
fn registry() -> &'static PerProcess<Mutex<Vec<Weak<Inner>>>> {
    static ALL: OnceLock<PerProcess<Mutex<Vec<Weak<Inner>>>>> = OnceLock::new();
    ALL.get_or_init(PerProcess::default)
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Adds `inner` to this process's registry (once).
fn register(inner: &Arc<Inner>) {
    let me = Arc::downgrade(inner);
    let mut v = locked(registry().get_or_init(Mutex::default));
    if !v.iter().any(|w| Weak::ptr_eq(w, &me)) {
        v.push(me);
    }
}

/// The live managers of this process.
pub(crate) fn all() -> Vec<Manager> {
    let mut v = locked(registry().get_or_init(Mutex::default));
    v.retain(|w| w.strong_count() > 0);
    v.iter()
        .filter_map(Weak::upgrade)
        .map(|inner| Manager { inner })
        .collect()
}

/// Releases the unreleased locks of `managers` (closed ones included) and flushes the quiet
/// releases of those still open, all at once on the process runtime, then waits for the
/// process's background work (the slower nodes' parts of releases, undos, dequeues, the
/// releases of dropped handles), waiting at most `limit` in all; what is not done by then goes
/// on in the background. Returns how many were released on a quorum in time. With
/// `tell_holders`, a lock still held is first declared lost (`ReleasedByManager`), so that a
/// holder still at work (a Python block, a Node `withLock`, a Go `WithLock`) is told as for
/// any other loss instead of going on unprotected; exit does not (nothing runs after it).
pub(crate) fn release_all_of(managers: &[Manager], limit: Duration, tell_holders: bool) -> usize {
    let work: Vec<_> = managers
        .iter()
        .map(|m| (m.live_core(), m.unreleased()))
        .collect();
    let (tx, rx) = std::sync::mpsc::channel();
    // Counted as releases decide, so a limit reached while the slower nodes finish still
    // reports the releases that were done.
    let counted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = counted.clone();
    crate::runtime::runtime().spawn(async move {
        let all = work.into_iter().map(|(core, locks)| {
            let count = count.clone();
            async move {
                let releases = locks.iter().map(|l| async {
                    if tell_holders {
                        l.released_by_manager();
                    }
                    if matches!(l.release().await, Ok(true)) {
                        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                });
                futures::future::join_all(releases).await;
                if let Some(core) = core {
                    core.flush_quiet_releases().await;
                }
            }
        });
        futures::future::join_all(all).await;
        // A release returns at its quorum; the slower nodes' parts go on in the background:
        // wait for those too, so that nothing is left on a node (within `limit`).
        crate::runtime::settled().await;
        let _ = tx.send(());
    });
    let _ = rx.recv_timeout(limit);
    counted.load(std::sync::atomic::Ordering::SeqCst)
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("host::Manager")
            .field("nodes", &self.inner.nodes)
            .field("quorum", &self.inner.quorum)
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Manager {
    /// Validates the options and builds the manager (no connection is opened yet).
    pub fn new(options: ManagerOptions) -> Result<Manager> {
        let core = LockManager::new(options.clone())?;
        let nodes = core.node_names();
        let mut servers: Vec<String> = nodes
            .iter()
            .map(|n| crate::node::server_address(n).unwrap_or_else(|| n.clone()))
            .collect();
        servers.sort();
        let inner = Arc::new(Inner {
            servers: servers.join(","),
            nodes,
            quorum: core.quorum(),
            core: PerProcess::default(),
            options,
            closed: Flag::new(),
            acquiring: ProcessCount::new(),
            closing: AtomicU32::new(0),
            handed: PerProcess::default(),
        });
        inner.core.get_or_init(|| Mutex::new(Some(core)));
        register(&inner);
        Ok(Manager { inner })
    }

    /// The core manager, or `InvalidArgument` once closed.
    pub fn core(&self) -> Result<LockManager> {
        let inner = &self.inner;
        let slot = inner.core.get_or_init(|| {
            // A forked child: a manager of its own on the same options, registered in the
            // child, whose exit then finds the locks it hands out.
            let fresh = (!self.is_closed())
                .then(|| LockManager::new(inner.options.clone()).ok())
                .flatten();
            if fresh.is_some() {
                register(inner);
            }
            Mutex::new(fresh)
        });
        locked(slot)
            .clone()
            .ok_or_else(|| Error::invalid("this LockManager is closed"))
    }

    /// The core manager of this process if it has one and is open, without making one.
    fn live_core(&self) -> Option<LockManager> {
        self.inner.core.get().and_then(|slot| locked(slot).clone())
    }

    /// The same for this manager and every clone of it (a shared manager included), and
    /// for no other live manager: for a binding that keys state by manager.
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// The node URLs, passwords redacted.
    pub fn nodes(&self) -> &[String] {
        &self.inner.nodes
    }

    /// The servers and databases its nodes reach, sorted and comma-separated (`h:1/0,h:2/0`):
    /// equal for two managers whose node lists are written apart (`h:1` and `H:1/0`, other
    /// options aside), whose locks are then the same keys. For a binding that must tell
    /// whether a scope already holds a key through another manager.
    pub fn servers(&self) -> &str {
        &self.inner.servers
    }

    pub fn quorum(&self) -> usize {
        self.inner.quorum
    }

    /// The lock options locks of this manager default to.
    pub fn defaults(&self) -> &LockOptions {
        &self.inner.options.lock
    }

    pub fn options(&self) -> &ManagerOptions {
        &self.inner.options
    }

    pub fn is_closed(&self) -> bool {
        self.inner.closed.is_set()
    }

    /// Acquires `key` for `owner`, an opaque id the binding supplies (a thread, an asyncio
    /// task, an async context, an explicit id: it only matters with `opts.reentrant`, where
    /// the same owner re-enters; [`NO_OWNER`]: a grant of its own that nothing re-enters).
    /// What it takes is the options' [`Kind`] ([`Kind::options`]; the lock unless they say
    /// otherwise): a side of the read-write lock `key` (its owner always re-enters,
    /// `reentrant` or not) or permits of the semaphore `key`.
    /// Gives up once the process is exiting (see `exit`) or the manager is closed
    /// (`NotAcquired`; what it had taken is given back, see `close`). Dropping the future
    /// part-way releases whatever it had taken.
    pub async fn acquire(&self, key: &str, owner: u64, opts: &LockOptions) -> Result<Lock> {
        // Counted before the closed check, which `core` makes: `close` sets the flag, then
        // waits for the count, so an acquire either sees the flag or is waited for.
        let _acquiring = Acquiring::enter(&self.inner);
        // Named as what was asked for: a semaphore's errors say `semaphore "name"`.
        let what = noun(opts);
        let core = self.core().map_err(|_| {
            Error::invalid(format!(
                "{what} {key:?}: this LockManager is closed",
                key = Shown(key)
            ))
        })?;
        let owned = (owner != NO_OWNER).then_some(owner);
        let acquire = async {
            if let Some(p) = opts.permits {
                return crate::semaphore::acquire(&core.shared, key, p.permits, p.count, opts)
                    .await;
            }
            match opts.rw {
                None => match owned {
                    None => core.acquire_with(key, opts).await,
                    Some(owner) => core.acquire_owned(key, owner, opts).await,
                },
                // The read-write lock's own entry (it refuses what a side does not allow).
                Some(side) => crate::rwlock::acquire(&core.shared, key, owned, opts, side).await,
            }
        };
        // Once exiting, nothing is sent: an attempt started now would be undone in the
        // background, which the exiting process may not live to finish.
        if exit::is_exiting() {
            return Err(exit::exiting_error(what, key));
        }
        let lock = tokio::select! {
            biased;
            // Dropping the acquire undoes whatever it had taken.
            _ = exit::exiting() => return Err(exit::exiting_error(what, key)),
            _ = self.inner.closed.wait() => return Err(closed_error(what, key)),
            lock = acquire => Arc::new(lock?),
        };
        self.hand_out(&lock);
        if exit::is_exiting() || self.is_closed() {
            let _ = lock.release().await;
            return Err(match exit::is_exiting() {
                true => exit::exiting_error(what, key),
                false => closed_error(what, key),
            });
        }
        Ok(Lock::new(lock, owner, self.clone()))
    }

    /// [`acquire`](Manager::acquire) on the calling thread, which drives its own I/O.
    /// Interrupted by `cancel` (or by the binding's check firing it), it returns `Cancelled`
    /// and leaves no key behind: what the attempt had taken is undone before this returns.
    pub fn acquire_blocking(
        &self,
        key: &str,
        owner: u64,
        opts: &LockOptions,
        cancel: &Cancel,
        check: Check<'_>,
    ) -> Result<Lock> {
        let _counted = BlockingAcquire::enter();
        cancel::block_on(self.acquire(key, owner, opts), cancel, check)
            .unwrap_or_else(|| Err(acquire_cancelled(noun(opts), key)))
    }

    /// [`acquire`](Manager::acquire) until `cancel` fires, for a binding that awaits it (Node,
    /// Python asyncio). Cancelled, it returns `Cancelled` only once whatever the acquire had
    /// taken (key, hold count, queue entry) is given back on every node that answered (see
    /// `until_cancelled`); a grant that came first is returned.
    pub async fn acquire_cancellable(
        &self,
        key: &str,
        owner: u64,
        opts: &LockOptions,
        cancel: &Cancel,
    ) -> Result<Lock> {
        cancel::until_cancelled(self.acquire(key, owner, opts), cancel)
            .await
            .unwrap_or_else(|| Err(acquire_cancelled(noun(opts), key)))
    }

    /// Starts an acquire on the process runtime; `done` gets its result once, on a library
    /// thread that may block (see `call::start`). Cancelled, it gets `Cancelled` once no key
    /// or queue entry of it is left on any node that answered.
    pub fn acquire_start<D>(
        &self,
        key: &str,
        owner: u64,
        opts: &LockOptions,
        cancel: Cancel,
        done: D,
    ) where
        D: FnOnce(Result<Lock>) + Send + 'static,
    {
        let what = noun(opts);
        let (this, key, opts) = (self.clone(), key.to_string(), opts.clone());
        let k = key.clone();
        call::start(
            async move { this.acquire(&key, owner, &opts).await },
            cancel,
            move || acquire_cancelled(what, &k),
            done,
        );
    }

    /// [`acquire_start`](Manager::acquire_start) with a handle to wait on or poll.
    pub fn acquire_call(
        &self,
        key: &str,
        owner: u64,
        opts: &LockOptions,
        cancel: Cancel,
    ) -> call::Call<Lock> {
        let what = noun(opts);
        let (this, key, opts) = (self.clone(), key.to_string(), opts.clone());
        let k = key.clone();
        call::Call::start(
            async move { this.acquire(&key, owner, &opts).await },
            cancel,
            move || acquire_cancelled(what, &k),
        )
    }

    fn hand_out(&self, lock: &Arc<CoreLock>) {
        let mut v = locked(self.inner.handed.get_or_init(Mutex::default));
        if v.len() >= 64 && v.len().is_power_of_two() {
            v.retain(|w| w.strong_count() > 0);
        }
        v.push(Arc::downgrade(lock));
    }

    /// The locks handed out in this process and not released yet: held ones, and lost ones
    /// too, whose token may still stand on some nodes (a loss deletes nothing) until their
    /// ttl. A lost lock that was already released answers `NotHeld` to another release,
    /// without any I/O.
    fn unreleased(&self) -> Vec<Arc<CoreLock>> {
        let mut v = locked(self.inner.handed.get_or_init(Mutex::default));
        v.retain(|w| w.strong_count() > 0);
        v.iter()
            .filter_map(Weak::upgrade)
            .filter(|l| !matches!(l.status(), LockStatus::Released))
            .collect()
    }

    /// Releases every lock this manager handed out in this process and that was not released
    /// (held or lost), and tells at once the next waiter of a key it was looping on (its last
    /// release was quiet). A lock still held is declared lost first
    /// ([`LossReason::ReleasedByManager`](crate::LossReason::ReleasedByManager)): its holder, if
    /// still at work, is told as for any other loss. Waits at most `limit` (the rest goes on in
    /// the background); returns how many were still held on a quorum. Call it from a thread
    /// outside any runtime.
    pub fn release_all(&self, limit: Duration) -> usize {
        release_all_of(std::slice::from_ref(self), limit, true)
    }

    /// Closes: acquires waiting on this manager give up (`NotAcquired`, "its LockManager was
    /// closed"), each having given back what it had taken and left the key's queue on every
    /// node that answers; then [`release_all`](Manager::release_all). Later acquires fail
    /// with `InvalidArgument`, and the connections go once the last lock of the manager is
    /// gone. Waits at most `limit` in all (the rest goes on in the background). Idempotent.
    /// Call it from a thread outside any runtime. Python's and Node's `close()`.
    pub fn close(&self, limit: Duration) {
        self.close_then(limit, |this, left| {
            this.release_all(left);
        });
    }

    /// [`close`](Manager::close) that leaves the locks it handed out alone: they stay usable
    /// (renewed, releasable, their loss reported) until released or freed, and exit still
    /// releases them. C's `ferrolock_manager_free` and Go's `Close`, whose handles outlive
    /// the manager by design. Waits for the ended waits' undos and dequeues, at most `limit`.
    pub fn close_keeping_locks(&self, limit: Duration) {
        // No manager to release: only the process's background work is waited for.
        self.close_then(limit, |_, left| release_all_of(&[], left, false));
    }

    /// Sets the closed flag, waits for the acquires in progress to give up, runs `then` with
    /// what is left of `limit`, and drops the core manager. Idempotent.
    fn close_then<T>(&self, limit: Duration, then: impl FnOnce(&Manager, Duration) -> T) {
        let until = Instant::now() + limit;
        let pid = crate::runtime::pid();
        let closing = &self.inner.closing;
        // Claimed before the flag is set (unless a close was claimed already), so a second
        // close that sees the flag also sees the close under way: claimed after, a second
        // close in between returned at once (1 pair in 100 of two closes at once).
        let _ = closing.compare_exchange(0, pid, Ordering::AcqRel, Ordering::Acquire);
        if !self.inner.closed.set() {
            // Closed already. One under way in this process: returning now would tell this
            // caller its locks were released while they still are being (a second thread's
            // close, or a shutdown beside one), so it waits for that one, within its limit.
            // A child forked during a close has no one to wait for.
            exit::wait_until(until, || closing.load(Ordering::Acquire) != pid);
            return;
        }
        // Again: in a child forked after its parent's claim, the claim above failed.
        closing.store(pid, Ordering::Release);
        let _done = Closed(closing);
        // The waits see the flag and end; their undos and dequeues are counted background
        // work, which `then` waits for.
        exit::wait_until(until, || self.inner.acquiring.is_zero());
        then(self, until.saturating_duration_since(Instant::now()));
        let taken = locked(self.inner.core.get_or_init(Mutex::default)).take();
        drop(taken);
    }
}

/// Marks a manager's close as done when it ends, also by a panic (see `close_then`).
struct Closed<'a>(&'a AtomicU32);

impl Drop for Closed<'_> {
    fn drop(&mut self) {
        self.0.store(u32::MAX, Ordering::Release);
    }
}

/// Counts an acquire on a manager for as long as it runs (see `close`), in the process it
/// was counted in.
struct Acquiring<'a>(&'a Inner, u32);

impl Acquiring<'_> {
    fn enter(inner: &Inner) -> Acquiring<'_> {
        Acquiring(inner, inner.acquiring.enter())
    }
}

impl Drop for Acquiring<'_> {
    fn drop(&mut self) {
        self.0.acquiring.leave(self.1);
    }
}

/// What an acquire with `opts` takes, as its errors name it: "lock", or "semaphore".
pub fn noun(opts: &LockOptions) -> &'static str {
    match opts.permits {
        Some(_) => "semaphore",
        None => "lock",
    }
}

fn closed_error(what: &str, key: &str) -> Error {
    Error::new(
        crate::error::ErrorKind::NotAcquired,
        format!(
            "{what} {key:?} not acquired: its manager was closed while it waited (nothing was left behind)",
            key = Shown(key)
        ),
    )
}

/// `what`: "lock", or "semaphore" (see `noun`).
fn acquire_cancelled(what: &str, key: &str) -> Error {
    cancel::cancelled(format_args!(
        "{what} {key:?} not acquired (nothing was left behind)",
        key = Shown(key)
    ))
}
