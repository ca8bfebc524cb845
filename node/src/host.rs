//! STAND-IN FOR THE CORE'S HOST LAYER (`ferrolock::host`, branch h/host, not merged yet).
//!
//! Everything here is what the host layer will provide to every binding; the rest of this
//! crate only converts values, maps errors and awaits. When `ferrolock::host` lands, each item
//! becomes one call into it and this file goes away:
//! - `shared_manager`: one manager per distinct connection options (what `withLock` uses);
//! - `Handed` / `release_all` / `release_locks_blocking`: the locks handed out, released by
//!   `close()`, at exit and at a worker's teardown within a time bound;
//! - `end_of_scope`: the decision at the end of a `withLock` body.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use ferrolock::{Lock, LockManager, LockStatus, ManagerOptions};

/// Runs `fut` on the core's runtime (never napi's, which is torn down and rebuilt around
/// environment teardown and would take connections and the watchdog with it).
pub async fn on_core<T, F>(fut: F) -> napi::Result<T>
where
    T: Send + 'static,
    F: Future<Output = napi::Result<T>> + Send + 'static,
{
    ferrolock::runtime::runtime()
        .handle()
        .spawn(fut)
        .await
        .map_err(|e| crate::errors::coded("REDIS_ERROR", &format!("ferrolock task failed: {e}")))?
}

/// Builds a manager inside the core's runtime, so its background work (watchdog, waiters)
/// is spawned there.
pub fn new_manager(opts: ManagerOptions) -> ferrolock::Result<LockManager> {
    let _in_core = ferrolock::runtime::runtime().enter();
    LockManager::new(opts)
}

/// The manager shared by every `withLock` with the same connection options (the lock
/// options are per acquire, so they are not part of the identity).
pub fn shared_manager(opts: ManagerOptions) -> ferrolock::Result<(LockManager, Arc<Handed>)> {
    type Registry = Mutex<HashMap<String, (LockManager, Arc<Handed>)>>;
    static SHARED: OnceLock<Registry> = OnceLock::new();
    let id = format!(
        "{:?}|{:?}|{:?}",
        opts.resolved_nodes(),
        opts.resolved_tls_ca(),
        opts.restart_guard
    );
    let mut map = SHARED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(found) = map.get(&id) {
        return Ok(found.clone());
    }
    let manager = new_manager(opts)?;
    let made = (manager.clone(), Handed::new(manager));
    map.insert(id, made.clone());
    Ok(made)
}

/// The locks a manager handed out, weakly, so `close()` and exit can release those not
/// released yet (lost ones too: their token may still stand on some nodes).
pub struct Handed {
    manager: LockManager,
    locks: Mutex<Vec<Weak<Lock>>>,
}

impl Handed {
    pub fn new(manager: LockManager) -> Arc<Handed> {
        Arc::new(Handed {
            manager,
            locks: Mutex::new(Vec::new()),
        })
    }

    pub fn add(&self, lock: &Arc<Lock>) {
        let mut v = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        if v.len() >= 64 && v.len().is_power_of_two() {
            v.retain(|w| w.strong_count() > 0);
        }
        v.push(Arc::downgrade(lock));
    }

    fn unreleased(&self) -> Vec<Arc<Lock>> {
        let mut v = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        v.retain(|w| w.strong_count() > 0);
        v.iter()
            .filter_map(Weak::upgrade)
            .filter(|l| !matches!(l.status(), LockStatus::Released))
            .collect()
    }

    /// Releases every lock not released yet and flushes the quiet releases, at most `limit`
    /// in all.
    pub async fn release_all(&self, limit: Duration) {
        let locks = self.unreleased();
        let manager = self.manager.clone();
        let all = async move {
            release_each(locks).await;
            manager.flush_quiet_releases().await;
        };
        let _ = tokio::time::timeout(limit, all).await;
    }
}

async fn release_each(locks: Vec<Arc<Lock>>) {
    let mut tasks = Vec::with_capacity(locks.len());
    for l in locks {
        tasks.push(tokio::spawn(async move {
            let _ = l.release().await;
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// At exit or an environment's teardown (synchronous): releases `locks`, waiting at most
/// `limit`.
pub fn release_locks_blocking(locks: Vec<Arc<Lock>>, limit: Duration) {
    if locks.is_empty() {
        return;
    }
    ferrolock::runtime::runtime().block_on(async move {
        let _ = tokio::time::timeout(limit, release_each(locks)).await;
    });
}

/// What the end of a `withLock` body decided.
pub enum Outcome {
    /// Released as planned (or already released by the body itself).
    Done,
    /// The lock was lost while the body ran: `withLock` rejects with this `LockLost` message.
    Lost(String),
    /// The release failed (the nodes that did not answer keep the key until its ttl).
    ReleaseFailed(ferrolock::Error),
}

/// The end-of-scope decision: the lock held, lost, or released elsewhere → release, report
/// the loss, or nothing. A lost lock is released too (its token may still stand on some
/// nodes). The body's own outcome is the caller's to combine: a loss outranks the body's
/// result and its error (the error is attached as the cause).
pub async fn end_of_scope(lock: Arc<Lock>) -> Outcome {
    let lost = match lock.status() {
        LockStatus::Released => return Outcome::Done,
        LockStatus::Lost(reason) => Some(reason.to_string()),
        _ => match lock.check() {
            Err(e) if e.kind() == ferrolock::ErrorKind::LockLost => Some(e.message().to_string()),
            _ => None,
        },
    };
    let released = lock.release().await;
    if let Some(why) = lost {
        return Outcome::Lost(why);
    }
    match released {
        Ok(true) => Outcome::Done,
        Ok(false) => Outcome::Lost(format!(
            "lock {:?} lost: it was no longer held on a quorum when withLock's callback ended (expired or taken: did the callback outlive the ttl with the watchdog off?)",
            lock.key()
        )),
        Err(e) if e.kind() == ferrolock::ErrorKind::NotHeld => Outcome::Done,
        Err(e) => Outcome::ReleaseFailed(e),
    }
}
