//! The locks of each JavaScript environment (the main thread, each worker thread). A worker's
//! teardown releases its own locks (so the process's watchdog does not renew them for a
//! thread that is gone), and `process.on('exit')` in one environment releases only that
//! environment's locks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use ferrolock::{Lock, LockStatus};
use napi::{Env, Result};

/// How long a worker's teardown may block releasing its locks.
const TEARDOWN_LIMIT: Duration = Duration::from_secs(1);

#[derive(Default)]
pub struct EnvLocks {
    locks: Mutex<Vec<Weak<Lock>>>,
    /// The environment is gone: a grant that lands now is released at once.
    closed: std::sync::atomic::AtomicBool,
}

impl EnvLocks {
    /// Records a granted lock; false when the environment is already torn down.
    pub fn add(&self, lock: &Arc<Lock>) -> bool {
        let mut v = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return false;
        }
        if v.len() >= 64 && v.len().is_power_of_two() {
            v.retain(|w| w.strong_count() > 0);
        }
        v.push(Arc::downgrade(lock));
        true
    }

    fn unreleased(&self) -> Vec<Arc<Lock>> {
        let v = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        v.iter()
            .filter_map(Weak::upgrade)
            .filter(|l| !matches!(l.status(), LockStatus::Released))
            .collect()
    }

    /// Releases every lock of this environment, blocking at most `limit`.
    pub fn release_all_blocking(&self, limit: Duration) {
        crate::host::release_locks_blocking(self.unreleased(), limit);
    }
}

fn registry() -> &'static Mutex<HashMap<usize, Arc<EnvLocks>>> {
    static ENVS: OnceLock<Mutex<HashMap<usize, Arc<EnvLocks>>>> = OnceLock::new();
    ENVS.get_or_init(Default::default)
}

/// This environment's locks, registering its teardown hook on first use.
pub fn locks_of(env: &Env) -> Result<Arc<EnvLocks>> {
    let id = env.raw() as usize;
    let mut map = registry().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(found) = map.get(&id) {
        return Ok(found.clone());
    }
    let made = Arc::new(EnvLocks::default());
    map.insert(id, made.clone());
    drop(map);
    env.add_env_cleanup_hook(id, |id| {
        let gone = registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        if let Some(locks) = gone {
            locks
                .closed
                .store(true, std::sync::atomic::Ordering::SeqCst);
            locks.release_all_blocking(TEARDOWN_LIMIT);
        }
    })?;
    Ok(made)
}
