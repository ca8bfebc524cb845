//! `NativeManager`: the core `LockManager` plus the locks it handed out (for `close()` and
//! exit). `manager.js` wraps it with option conversion and the AsyncLocalStorage owner.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferrolock::{LockManager, LockOptions};
use napi::bindgen_prelude::PromiseRaw;
use napi::{Env, Result};
use napi_derive::napi;
use tokio::sync::watch;

use crate::errors::{cancelled, invalid, to_napi};
use crate::host::{self, Handed, on_core};
use crate::lock::NativeLock;
use crate::options::{OptionEntry, lock_options, manager_options};

/// How long `close()` waits for the releases of the locks still held.
const CLOSE_LIMIT: Duration = Duration::from_secs(5);

/// Aborts one acquire's wait (the caller's AbortSignal, forwarded by `manager.js`).
#[napi]
pub struct CancelToken {
    tx: watch::Sender<bool>,
}

#[napi]
impl CancelToken {
    #[napi(constructor)]
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        CancelToken {
            tx: watch::Sender::new(false),
        }
    }

    #[napi]
    pub fn cancel(&self) {
        self.tx.send_replace(true);
    }
}

#[napi]
pub struct NativeManager {
    manager: Mutex<Option<LockManager>>,
    handed: Arc<Handed>,
    defaults: LockOptions,
    shared: bool,
}

#[napi]
impl NativeManager {
    /// Opens no connection: those open on first use.
    #[napi(constructor)]
    pub fn new(entries: Vec<OptionEntry>) -> Result<Self> {
        let manager = host::new_manager(manager_options(&entries)?).map_err(to_napi)?;
        Ok(NativeManager {
            defaults: manager.defaults().clone(),
            handed: Handed::new(manager.clone()),
            manager: Mutex::new(Some(manager)),
            shared: false,
        })
    }

    /// The manager `withLock` shares with every call on the same connection options.
    #[napi(factory)]
    pub fn shared(entries: Vec<OptionEntry>) -> Result<Self> {
        let (manager, handed) =
            host::shared_manager(manager_options(&entries)?).map_err(to_napi)?;
        Ok(NativeManager {
            defaults: manager.defaults().clone(),
            handed,
            manager: Mutex::new(Some(manager)),
            shared: true,
        })
    }

    fn core(&self) -> Result<LockManager> {
        let m = self.manager.lock().unwrap_or_else(|p| p.into_inner());
        m.clone()
            .ok_or_else(|| invalid("this LockManager is closed"))
    }

    #[napi(getter)]
    pub fn nodes(&self) -> Vec<String> {
        self.core().map(|m| m.node_names()).unwrap_or_default()
    }

    #[napi(getter)]
    pub fn quorum(&self) -> u32 {
        self.core().map(|m| m.quorum() as u32).unwrap_or(0)
    }

    /// The core manager's client uuid: the same for every `NativeManager` sharing it.
    #[napi(getter)]
    pub fn client_id(&self) -> String {
        self.core().map(|m| m.client_id()).unwrap_or_default()
    }

    #[napi(getter)]
    pub fn closed(&self) -> bool {
        self.manager
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    /// Acquires `key` with the defaults plus `entries`. `owner` (reentrant locks) is the
    /// async context's owner id; `cancel` aborts the wait, undoing whatever was taken.
    #[napi]
    pub fn acquire<'env>(
        &self,
        env: &'env Env,
        key: String,
        entries: Vec<OptionEntry>,
        owner: Option<i64>,
        cancel: Option<&CancelToken>,
    ) -> Result<PromiseRaw<'env, NativeLock>> {
        let manager = self.core()?;
        if key.is_empty() {
            return Err(invalid("lock key must be a non-empty string, got \"\""));
        }
        let opts = if entries.is_empty() {
            self.defaults.clone()
        } else {
            lock_options(&key, &self.defaults, &entries)?
        };
        let handed = self.handed.clone();
        let env_locks = crate::env::locks_of(env)?;
        let mut cancel = cancel.map(|c| c.tx.subscribe());
        env.spawn_future(on_core(async move {
            let acquire = async {
                match owner {
                    Some(o) => manager.acquire_owned(&key, o as u64, &opts).await,
                    None => manager.acquire_with(&key, &opts).await,
                }
            };
            let lock = match cancel.as_mut() {
                // Dropping the acquire undoes whatever it had taken.
                Some(rx) => tokio::select! {
                    lock = acquire => lock,
                    _ = rx.wait_for(|c| *c) => return Err(cancelled(&key)),
                },
                None => acquire.await,
            };
            let lock = Arc::new(lock.map_err(to_napi)?);
            handed.add(&lock);
            if !env_locks.add(&lock) {
                let _ = lock.release().await;
                return Err(crate::errors::coded(
                    "NOT_ACQUIRED",
                    &format!("lock {key:?} not acquired: its JavaScript environment was torn down"),
                ));
            }
            Ok(NativeLock { inner: lock })
        }))
    }

    /// Releases the locks this manager handed out that are still held, then closes it. A
    /// shared manager (withLock's) stays open for other callers: only its use here ends.
    #[napi]
    pub fn close<'env>(&self, env: &'env Env) -> Result<PromiseRaw<'env, ()>> {
        let taken = self
            .manager
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let handed = self.handed.clone();
        let shared = self.shared;
        env.spawn_future(on_core(async move {
            if taken.is_some() && !shared {
                handed.release_all(CLOSE_LIMIT).await;
            }
            Ok(())
        }))
    }
}

/// At `process.on('exit')`: releases the locks of this environment (this thread) still held,
/// blocking at most `limitMs`.
#[napi]
pub fn release_all_sync(env: &Env, limit_ms: u32) -> Result<()> {
    crate::env::locks_of(env)?.release_all_blocking(Duration::from_millis(limit_ms.into()));
    Ok(())
}

/// A reentrancy owner id unique in the process (worker threads share the core's managers, so
/// a per-thread counter would let two workers re-enter each other's locks).
#[napi]
pub fn new_owner() -> i64 {
    static NEXT: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}
