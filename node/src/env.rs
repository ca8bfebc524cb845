//! The locks of each JavaScript environment (the main thread, each worker thread). The host
//! layer's registries are per process; a worker thread is a Node notion, so this keeps, per
//! environment, the locks it was handed and its acquires still waiting. A worker's teardown
//! cancels its waits and releases its own locks (so the process's watchdog does not renew
//! them, nor a waiter keep its place in line, for a thread that is gone), and its exit hook
//! releases only its own; the main thread's exit runs the host layer's exit protocol.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use ferrolock::host::Cancel;
use ferrolock::{Lock as CoreLock, LockStatus};
use napi::{Env, Result};

/// How long a worker's teardown may block releasing its locks.
const TEARDOWN_LIMIT: Duration = Duration::from_secs(1);

#[derive(Default)]
pub struct EnvLocks {
    /// Weakly: a lock the program dropped unreleased is released in the background by the
    /// core (its last handle gone), not kept alive, and renewed, by this list.
    locks: Mutex<Vec<Weak<CoreLock>>>,
    /// The environment is gone: a grant that lands now is released at once.
    closed: AtomicBool,
    /// The cancel tokens of this environment's acquires still running, by a number of their
    /// own, fired at its teardown.
    waiting: Mutex<HashMap<u64, Cancel>>,
    next: AtomicU64,
}

/// An acquire registered with [`EnvLocks::waiting`]; dropping it (the acquire ended)
/// deregisters it.
pub struct Waiting {
    env: Arc<EnvLocks>,
    id: u64,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        locked(&self.env.waiting).remove(&self.id);
    }
}

/// A poisoned mutex still guards plain data: a panic elsewhere must not stop every later call.
pub(crate) fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl EnvLocks {
    /// Records a granted lock; false when the environment is already torn down.
    pub fn add(&self, lock: &ferrolock::host::Lock) -> bool {
        let mut v = locked(&self.locks);
        if self.closed.load(Ordering::SeqCst) {
            return false;
        }
        if v.len() >= 64 && v.len().is_power_of_two() {
            v.retain(|w| w.strong_count() > 0);
        }
        v.push(Arc::downgrade(lock.core()));
        true
    }

    /// Registers an acquire's cancel token, fired at this environment's teardown (at once if
    /// it is torn down already), until the returned guard drops.
    pub fn waiting(self: &Arc<Self>, cancel: &Cancel) -> Waiting {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut waiting = locked(&self.waiting);
        if self.closed.load(Ordering::SeqCst) {
            cancel.cancel();
        } else {
            waiting.insert(id, cancel.clone());
        }
        Waiting {
            env: self.clone(),
            id,
        }
    }

    /// The environment is gone: grants that land from now on are released at once, and the
    /// acquires still waiting give up.
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        for (_, cancel) in locked(&self.waiting).drain() {
            cancel.cancel();
        }
    }

    fn unreleased(&self) -> Vec<Arc<CoreLock>> {
        locked(&self.locks)
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|l| !matches!(l.status(), LockStatus::Released))
            .collect()
    }

    /// Releases every lock of this environment on the core's runtime, blocking the calling
    /// (JavaScript) thread at most `limit`; what is not done by then goes on in the
    /// background.
    pub fn release_all_blocking(&self, limit: Duration) {
        let locks = self.unreleased();
        if locks.is_empty() {
            return;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let rt = ferrolock::runtime::runtime();
        rt.spawn(async move {
            let tasks: Vec<_> = locks
                .into_iter()
                .map(|l| tokio::spawn(async move { l.release().await }))
                .collect();
            for t in tasks {
                let _ = t.await;
            }
            let _ = tx.send(());
        });
        let _ = rx.recv_timeout(limit);
    }
}

fn registry() -> &'static Mutex<HashMap<usize, Arc<EnvLocks>>> {
    static ENVS: OnceLock<Mutex<HashMap<usize, Arc<EnvLocks>>>> = OnceLock::new();
    ENVS.get_or_init(Default::default)
}

/// This environment's locks, registering its teardown hook on first use.
pub fn locks_of(env: &Env) -> Result<Arc<EnvLocks>> {
    let id = env.raw() as usize;
    let mut map = locked(registry());
    if let Some(found) = map.get(&id) {
        return Ok(found.clone());
    }
    let made = Arc::new(EnvLocks::default());
    map.insert(id, made.clone());
    drop(map);
    env.add_env_cleanup_hook(id, |id| {
        let gone = locked(registry()).remove(&id);
        if let Some(locks) = gone {
            locks.close();
            locks.release_all_blocking(TEARDOWN_LIMIT);
        }
    })?;
    Ok(made)
}
