//! `host::Manager`: the core manager plus what a binding's process needs of it: the locks it
//! handed out (for `release_all`, `close` and exit), closing, and the reentrancy owner the
//! binding supplies with each acquire.

use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::host::call;
use crate::host::cancel::{self, Cancel, Check};
use crate::host::exit::{self, BlockingAcquire};
use crate::host::lock::Lock;
use crate::lock::{Lock as CoreLock, LockStatus};
use crate::manager::LockManager;
use crate::options::{LockOptions, ManagerOptions};
use crate::per_process::PerProcess;

/// The owner of an acquire that nothing re-enters (C's `FERROLOCK_NO_OWNER`): each such
/// reentrant grant has a hold count of its own.
pub const NO_OWNER: u64 = u64::MAX;

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
    /// Closed in some process: a child forked after the close starts closed too.
    closed: std::sync::atomic::AtomicBool,
    /// The locks handed out in this process, weakly.
    handed: PerProcess<Mutex<Vec<Weak<CoreLock>>>>,
    nodes: Vec<String>,
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

/// The live managers of this process.
pub(crate) fn all() -> Vec<Manager> {
    let mut v = locked(registry().get_or_init(Mutex::default));
    v.retain(|w| w.strong_count() > 0);
    v.iter()
        .filter_map(Weak::upgrade)
        .map(|inner| Manager { inner })
        .collect()
}

/// Releases the unreleased locks of `managers` and flushes their quiet releases, all at once
/// on the process runtime, then waits for what finishes in the background (the slower nodes of
/// releases, the undo on a silent node of a lost or cancelled acquire, of any manager), at
/// most `limit` in all; what is not done by then goes on in the background. Returns how many
/// were released on a quorum in time.
pub(crate) fn release_all_of(managers: &[Manager], limit: Duration) -> usize {
    let work: Vec<_> = managers
        .iter()
        .filter_map(|m| m.core().ok().map(|core| (core, m.unreleased())))
        .collect();
    if work.is_empty() && !crate::lock::finishing() {
        return 0;
    }
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
                    if matches!(l.release().await, Ok(true)) {
                        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                });
                futures::future::join_all(releases).await;
                core.flush_quiet_releases().await;
            }
        });
        futures::future::join_all(all).await;
        // A release returns at its quorum; the slower nodes' parts go on in the background:
        // wait for those too, so that nothing is left on a node (within `limit`).
        crate::lock::background_releases().await;
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
        let inner = Arc::new(Inner {
            nodes: core.node_names(),
            quorum: core.quorum(),
            core: PerProcess::default(),
            options,
            closed: Default::default(),
            handed: PerProcess::default(),
        });
        inner.core.get_or_init(|| Mutex::new(Some(core)));
        locked(registry().get_or_init(Mutex::default)).push(Arc::downgrade(&inner));
        Ok(Manager { inner })
    }

    /// The core manager, or `InvalidArgument` once closed.
    pub fn core(&self) -> Result<LockManager> {
        let inner = &self.inner;
        let slot = inner.core.get_or_init(|| {
            // A forked child: a manager of its own on the same options.
            let fresh = (!self.is_closed())
                .then(|| LockManager::new(inner.options.clone()).ok())
                .flatten();
            Mutex::new(fresh)
        });
        locked(slot)
            .clone()
            .ok_or_else(|| Error::invalid("this LockManager is closed"))
    }

    /// The node URLs, passwords redacted.
    pub fn nodes(&self) -> &[String] {
        &self.inner.nodes
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
        self.inner.closed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Acquires `key` for `owner`, an opaque id the binding supplies (a thread, an asyncio
    /// task, an async context, an explicit id: it only matters with `opts.reentrant`, where
    /// the same owner re-enters; [`NO_OWNER`]: a grant of its own that nothing re-enters). Gives up once the process is exiting (see `exit`). Dropping
    /// the future part-way releases whatever it had taken.
    pub async fn acquire(&self, key: &str, owner: u64, opts: &LockOptions) -> Result<Lock> {
        let core = self.core()?;
        let acquire = async {
            if owner == NO_OWNER {
                core.acquire_with(key, opts).await
            } else {
                core.acquire_owned(key, owner, opts).await
            }
        };
        // Once exiting, nothing is sent: an attempt started now would be undone in the
        // background, which the exiting process may not live to finish.
        if exit::is_exiting() {
            return Err(exit::exiting_error(key));
        }
        let lock = tokio::select! {
            biased;
            // Dropping the acquire undoes whatever it had taken.
            _ = exit::exiting() => return Err(exit::exiting_error(key)),
            lock = acquire => Arc::new(lock?),
        };
        self.hand_out(&lock);
        if exit::is_exiting() {
            let _ = lock.release().await;
            return Err(exit::exiting_error(key));
        }
        Ok(Lock::new(lock, owner))
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
            .unwrap_or_else(|| Err(acquire_cancelled(key)))
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
            .unwrap_or_else(|| Err(acquire_cancelled(key)))
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
        let (this, key, opts) = (self.clone(), key.to_string(), opts.clone());
        let k = key.clone();
        call::start(
            async move { this.acquire(&key, owner, &opts).await },
            cancel,
            move || acquire_cancelled(&k),
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
        let (this, key, opts) = (self.clone(), key.to_string(), opts.clone());
        let k = key.clone();
        call::Call::start(
            async move { this.acquire(&key, owner, &opts).await },
            cancel,
            move || acquire_cancelled(&k),
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
    /// release was quiet). Waits at most `limit` (the rest goes on in the background); returns
    /// how many were still held on a quorum. Call it from a thread outside any runtime.
    pub fn release_all(&self, limit: Duration) -> usize {
        release_all_of(std::slice::from_ref(self), limit)
    }

    /// [`release_all`](Manager::release_all), then closes: later acquires fail with
    /// `InvalidArgument`, and the connections go once the last lock of the manager is gone.
    /// Idempotent.
    pub fn close(&self, limit: Duration) {
        if self.is_closed() {
            return;
        }
        self.release_all(limit);
        self.inner
            .closed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let taken = locked(self.inner.core.get_or_init(Mutex::default)).take();
        drop(taken);
    }
}

fn acquire_cancelled(key: &str) -> Error {
    cancel::cancelled(format_args!(
        "lock {key:?} not acquired (nothing was left behind)"
    ))
}
