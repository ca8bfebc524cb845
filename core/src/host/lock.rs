//! `host::Lock`: a held lock as a binding hands it to its caller: the core lock, the
//! reentrancy owner the binding supplied, and the loss subscriptions (see `loss`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
use crate::host::cancel::{self, Cancel, Check};
use crate::host::loss::Gate;
use crate::host::manager::Manager;
use crate::lock::{Lock as CoreLock, LockStatus, LossReason};

thread_local! {
    /// This thread is in [`Lock::free_collected`]: its loss callbacks run here, at once.
    static COLLECTING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A lock a binding hands out. Cheap to clone (clones share the lock and its subscriptions).
/// Dropping the last handle without a release releases it in the background (the core's
/// rule); [`Lock::free`] also waits for a loss callback already running.
#[derive(Clone)]
pub struct Lock {
    core: Arc<CoreLock>,
    owner: u64,
    gate: Arc<Gate>,
    /// The process the lock was handed out in. In a forked child the handle is inert and the
    /// gate (whose mutex a parent's thread may have held at the fork) is never touched.
    pid: u32,
    /// The manager that handed it out: keeps it in the exit registry (which finds this lock
    /// through it) however the binding freed its own handles to the manager.
    manager: Manager,
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("host::Lock")
            .field("lock", &self.core)
            .field("owner", &self.owner)
            .finish()
    }
}

impl Lock {
    pub(crate) fn new(core: Arc<CoreLock>, owner: u64, manager: Manager) -> Lock {
        Lock {
            core,
            owner,
            gate: Arc::default(),
            pid: crate::runtime::pid(),
            manager,
        }
    }

    /// The core lock: key, token, fence, validity, status, `check`, `lost()`.
    pub fn core(&self) -> &Arc<CoreLock> {
        &self.core
    }

    pub fn key(&self) -> &str {
        self.core.key()
    }

    /// What messages call its key: `lock`, or `semaphore` for a semaphore's permits.
    pub fn what(&self) -> &'static str {
        self.core.what()
    }

    /// [`Manager::id`] of the manager that handed it out.
    pub fn manager_id(&self) -> usize {
        self.manager.id()
    }

    /// The reentrancy owner the binding supplied to the acquire.
    pub fn owner(&self) -> u64 {
        self.owner
    }

    /// Whether this handle was made in another process (a forked child's copy).
    pub fn inherited(&self) -> bool {
        self.pid != crate::runtime::pid()
    }

    /// Why the lock was lost, if it was.
    pub fn loss_reason(&self) -> Option<LossReason> {
        match self.core.status() {
            LockStatus::Lost(reason) => Some(reason),
            _ => None,
        }
    }

    /// Calls `callback(reason)` if the lock is lost: at most once, on a library thread that
    /// may block (the runtime's blocking pool), never started after this handle's
    /// [`release`](Lock::release) or [`free`](Lock::free) has returned (nor after the lock
    /// was released by another handle of the same grant). Never called for a handle a forked
    /// child inherited. The callback must reach the binding's scope state only weakly (see
    /// the `loss` module).
    pub fn on_lost<F>(&self, callback: F)
    where
        F: FnOnce(&LossReason) + Send + 'static,
    {
        if self.inherited() {
            return;
        }
        let gate = self.gate.clone();
        self.core.on_lost(move |reason| {
            if COLLECTING.get() {
                // Declared by `free_collected`, which frees the handle next (closing the
                // gate): started later, the callback would never run.
                return gate.run(callback, reason);
            }
            let reason = reason.clone();
            // Off the thread that declared the loss (a runtime worker, or a caller reading
            // the status): the callback may block.
            drop(crate::runtime::runtime().spawn_blocking(move || gate.run(callback, &reason)));
        });
    }

    /// Resolves with the reason once the lock is lost, or `None` once it is released: the
    /// awaitable form of [`on_lost`](Lock::on_lost).
    pub fn lost(&self) -> impl Future<Output = Option<LossReason>> + Send + 'static + use<> {
        self.core.lost()
    }

    /// Releases on every node (see `ferrolock::Lock::release`); from its return no loss
    /// callback of this lock starts.
    pub async fn release(&self) -> Result<bool> {
        let out = self.core.release().await;
        self.close_gate(false);
        out
    }

    /// [`release`](Lock::release) on the calling thread. Interrupted by `cancel` (or by the
    /// binding's check firing it), it returns `Cancelled` and the release still completes,
    /// once, before this returns (bounded by the node timeout).
    pub fn release_blocking(&self, cancel: &Cancel, check: Check<'_>) -> Result<bool> {
        let out = cancel::block_on(self.core.release(), cancel, check);
        self.close_gate(false);
        out.unwrap_or_else(|| {
            Err(cancel::cancelled(format_args!(
                "{} {:?}: waiting for the release (it completed anyway)",
                self.core.what(),
                self.key()
            )))
        })
    }

    /// Extends to `ttl` (the lease in force when `None`): see `ferrolock::Lock::extend_for`.
    pub async fn extend(&self, ttl: Option<Duration>) -> Result<Duration> {
        let ttl = ttl.unwrap_or_else(|| self.core.ttl());
        self.core.extend_for(ttl).await
    }

    /// [`extend`](Lock::extend) on the calling thread. Interrupted by `cancel`, it returns
    /// `Cancelled` and the deadline is the one before the call (nodes that applied the
    /// extension keep the key longer, which costs no safety).
    pub fn extend_blocking(
        &self,
        ttl: Option<Duration>,
        cancel: &Cancel,
        check: Check<'_>,
    ) -> Result<Duration> {
        cancel::block_on(self.extend(ttl), cancel, check).unwrap_or_else(|| {
            Err(cancel::cancelled(format_args!(
                "{} {:?}: extend (the validity is unchanged)",
                self.core.what(),
                self.key()
            )))
        })
    }

    /// Releases in the background, without waiting (a result nobody will take: a cancelled
    /// asyncio future, a closed event loop, a coroutine being closed).
    pub fn abandon(&self) {
        if self.inherited() || matches!(self.core.status(), LockStatus::Released) {
            return;
        }
        let this = self.clone();
        crate::runtime::runtime().spawn(async move {
            let _ = this.release().await;
        });
    }

    /// No loss callback of this handle starts from now on, and one already running has
    /// returned when this returns (unless it runs on this thread). For a binding whose release
    /// promises that (C's `ferrolock_lock_release`); one that may hold what a callback waits
    /// for (Python's GIL) relies on `release` alone.
    pub fn quiesce(&self) {
        self.close_gate(true);
    }

    /// For a binding whose garbage collector took this handle (a finalizer; Python's last
    /// reference going): if the lock is held, no release has begun and no other handle of it
    /// is left, declares it lost (`LossReason::Collected`, which logs the warning) before it
    /// is released. Nothing in the caller's program marks when a collection happens (in Node
    /// and Go it follows the handle's last use, not the end of the work the lock guards; in
    /// Python, `m.acquire(key)` whose result is not kept goes at once), so the release that
    /// follows may come while that work still runs: the warning names the key and says what to
    /// keep, and whatever that work still watches (Node's `signal`, Go's `Lost()`, an
    /// `on_lost` callback) is told, as for any loss. Call it before the handle goes.
    pub fn collected(&self) {
        self.collected_from(None);
    }

    /// [`collected`](Lock::collected) for a handle held by a scope function of the binding's
    /// (`scope`: Node's "withLock") whose body went to the collector with it: the warning says
    /// that body waits on something that can never complete, rather than advise a scope.
    pub fn collected_in_scope(&self, scope: &str) {
        self.collected_from(Some(scope.to_string()));
    }

    fn collected_from(&self, scope: Option<String>) {
        if self.inherited() || Arc::strong_count(&self.core) > 1 || !self.core.unreleased_and_held()
        {
            return;
        }
        self.core.collected_while_held(scope);
    }

    /// [`collected`](Lock::collected), then [`free`](Lock::free), for a finalizer that frees
    /// the handle at once (C's `ferrolock_lock_free_collected`, Go's): the loss callbacks run
    /// on this thread before the handle goes, since the free stops those not yet started.
    /// Only here: Python's callbacks need the GIL its collector holds, and wait on the
    /// block they tell (a context's callback sleeps until its block runs).
    pub fn free_collected(&self) {
        COLLECTING.set(true);
        self.collected();
        COLLECTING.set(false);
        self.free();
    }

    /// Frees this handle: no loss callback starts from now on, and one already running has
    /// returned when this returns (unless it runs on this thread: a callback freeing its own
    /// lock). A lock still held is released in the background once its last handle is gone:
    /// the caller drops this one once this has returned, since the callback it waited for may
    /// still have used it (C's callback releasing its own lock through the handle).
    /// Call it without holding anything the callbacks wait for (Python's GIL).
    pub fn free(&self) {
        self.close_gate(true);
    }

    fn close_gate(&self, wait: bool) {
        if !self.inherited() {
            self.gate.close(wait);
        }
    }
}
