//! `NativeManager`: a `ferrolock::host::Manager` (its own, or the shared one of `withLock`).
//! `manager.js` wraps it with option conversion and the AsyncLocalStorage owner.

use std::sync::OnceLock;
use std::time::Duration;

use ferrolock::host::{self, Cancel, Kind};
use ferrolock::{ErrorKind, LockOptions};
use napi::bindgen_prelude::PromiseRaw;
use napi::{Env, Result};
use napi_derive::napi;

use crate::errors::{coded, guard, invalid, to_napi};
use crate::lock::NativeLock;
use crate::options::{OptionEntry, lock_options, manager_options};
use crate::rt::{blocking_on_core, in_core, promise_on_core};

/// How long `close()` waits for the releases of the locks still held.
const CLOSE_LIMIT: Duration = Duration::from_secs(5);

/// Aborts one acquire's wait (the caller's AbortSignal, forwarded by `manager.js`).
#[napi]
pub struct CancelToken {
    inner: Cancel,
}

#[napi]
impl CancelToken {
    #[napi(constructor)]
    #[allow(clippy::new_without_default)]
    pub fn new() -> Result<Self> {
        guard("CancelToken", || {
            Ok(CancelToken {
                inner: Cancel::new(),
            })
        })
    }

    #[napi]
    pub fn cancel(&self) -> Result<()> {
        guard("CancelToken.cancel", || {
            self.inner.cancel();
            Ok(())
        })
    }
}

/// A lock's options converted and checked once (`NativeManager::lock_options`).
#[napi]
pub struct NativeLockOptions {
    inner: LockOptions,
}

#[napi]
pub struct NativeManager {
    host: host::Manager,
    /// `withLock`'s: other callers share it, so `close()` only ends this handle's use.
    shared: bool,
    /// This handle was closed (a shared one stays open for the others).
    closed: std::sync::atomic::AtomicBool,
}

#[napi]
impl NativeManager {
    /// Opens no connection: those open on first use.
    #[napi(constructor)]
    pub fn new(entries: Vec<OptionEntry>) -> Result<Self> {
        guard("NativeManager", || {
            let options = manager_options(&entries)?;
            let host = in_core(|| host::Manager::new(options)).map_err(to_napi)?;
            Ok(NativeManager {
                host,
                shared: false,
                closed: Default::default(),
            })
        })
    }

    /// The manager `withLock` shares with every call on the same connection options
    /// (`host::shared`).
    #[napi(factory)]
    pub fn shared(entries: Vec<OptionEntry>) -> Result<Self> {
        guard("NativeManager.shared", || {
            let options = manager_options(&entries)?;
            let host = in_core(|| host::shared(&options)).map_err(to_napi)?;
            Ok(NativeManager {
                host,
                shared: true,
                closed: Default::default(),
            })
        })
    }

    fn open(&self) -> Result<&host::Manager> {
        if self.is_closed() {
            return Err(invalid("this LockManager is closed"));
        }
        Ok(&self.host)
    }

    #[napi(getter)]
    pub fn nodes(&self) -> Result<Vec<String>> {
        guard("NativeManager.nodes", || Ok(self.host.nodes().to_vec()))
    }

    #[napi(getter)]
    pub fn quorum(&self) -> Result<u32> {
        guard("NativeManager.quorum", || Ok(self.host.quorum() as u32))
    }

    /// The servers and databases its nodes reach, sorted (`host::Manager::servers`): equal for
    /// managers whose node lists are written apart, whose locks are then the same keys.
    #[napi(getter)]
    pub fn servers(&self) -> Result<String> {
        guard("NativeManager.servers", || {
            Ok(self.host.servers().to_string())
        })
    }

    /// The core manager's client uuid: the same for every `NativeManager` sharing it.
    #[napi(getter)]
    pub fn client_id(&self) -> Result<String> {
        guard("NativeManager.clientId", || {
            Ok(self.host.core().map(|m| m.client_id()).unwrap_or_default())
        })
    }

    #[napi(getter)]
    pub fn closed(&self) -> Result<bool> {
        guard("NativeManager.closed", || Ok(self.is_closed()))
    }

    /// This manager's defaults with `entries` on top, checked (errors name `key`), for any
    /// number of acquires: `withLock` converts a set of options once, not on every call.
    #[napi]
    pub fn lock_options(
        &self,
        key: String,
        entries: Vec<OptionEntry>,
    ) -> Result<NativeLockOptions> {
        guard("NativeManager.lockOptions", || {
            Ok(NativeLockOptions {
                inner: lock_options(&key, self.open()?.defaults(), &entries)?,
            })
        })
    }

    /// Acquires `key` with `options` (from `lockOptions`), else the defaults. `owner`
    /// (reentrant locks, read-write holds) is the async context's owner id; `cancel` aborts
    /// the wait, which rejects once whatever was taken is given back
    /// (`host::Manager::acquire_cancellable`). `kind`: `"read"` or `"write"` for a side
    /// of the read-write lock `key`, `"semaphore"` for `count` permits of the semaphore `key`,
    /// a pool of `permits` (both checked by the core), else the lock.
    #[napi]
    // The arguments are the JavaScript call's, one per value lib/manager.js passes.
    #[allow(clippy::too_many_arguments)]
    pub fn acquire<'env>(
        &self,
        env: &'env Env,
        key: String,
        options: Option<&NativeLockOptions>,
        owner: Option<i64>,
        cancel: Option<&CancelToken>,
        kind: Option<String>,
        permits: Option<u32>,
        count: Option<u32>,
    ) -> Result<PromiseRaw<'env, NativeLock>> {
        const ENTRY: &str = "NativeManager.acquire";
        guard(ENTRY, || {
            let manager = self.open()?.clone();
            if key.is_empty() {
                return Err(invalid("lock key must be a non-empty string, got \"\""));
            }
            let kind = match kind.as_deref() {
                None => Kind::Lock,
                Some("read") => Kind::Read,
                Some("write") => Kind::Write,
                Some("semaphore") => Kind::Permits {
                    permits: permits.unwrap_or(0),
                    count: count.unwrap_or(1),
                },
                Some(other) => {
                    return Err(invalid(format!(
                        "lock {key:?}: kind must be \"read\", \"write\" or \"semaphore\", got {other:?}"
                    )));
                }
            };
            let opts: LockOptions = kind.options(match options {
                Some(o) => o.inner.clone(),
                None => manager.defaults().clone(),
            });
            let env_locks = crate::env::locks_of(env)?;
            // Fired by the caller's signal, or by this environment's teardown: the acquire of a
            // worker thread that is gone leaves the line and takes nothing.
            let cancel = cancel.map(|c| c.inner.clone()).unwrap_or_default();
            let waiting = env_locks.waiting(&cancel);
            // No owner: a grant of its own (a read-write hold would re-enter owner 0's).
            let owner = owner.map_or(host::NO_OWNER, |o| o as u64);
            promise_on_core(env, ENTRY, move || async move {
                let _waiting = waiting;
                // Rejects (CANCELLED: an AbortError) once whatever it had taken is given back.
                let lock = manager
                    .acquire_cancellable(&key, owner, &opts, &cancel)
                    .await
                    .map_err(to_napi)?;
                if !env_locks.add(&lock) {
                    let _ = lock.release().await;
                    return Err(coded(
                        ErrorKind::NotAcquired.code(),
                        &format!(
                            "lock {key:?} not acquired: its JavaScript environment was torn down"
                        ),
                    ));
                }
                Ok(NativeLock {
                    inner: lock,
                    scope: OnceLock::new(),
                })
            })
        })
    }

    /// Ends the acquires waiting on this manager, releases the locks it handed out that are
    /// still held, then closes it (`host::Manager::close`). A shared manager (withLock's) stays open for other callers:
    /// only its use here ends.
    #[napi]
    pub fn close<'env>(&self, env: &'env Env) -> Result<PromiseRaw<'env, ()>> {
        const ENTRY: &str = "NativeManager.close";
        guard(ENTRY, || {
            let first = !self.closed.swap(true, std::sync::atomic::Ordering::SeqCst);
            let host = self.host.clone();
            let shared = self.shared;
            promise_on_core(env, ENTRY, move || async move {
                if first && !shared {
                    blocking_on_core(move || host.close(CLOSE_LIMIT)).await?;
                }
                Ok(())
            })
        })
    }
}

impl NativeManager {
    fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::SeqCst) || self.host.is_closed()
    }
}

/// At `process.on('exit')` on the main thread: the host layer's exit protocol (waiting
/// acquires give up; every lock of the process still held is released), blocking at most
/// `limitMs`. Returns how many were released on a quorum.
#[napi]
pub fn exit_sync(limit_ms: u32) -> Result<u32> {
    guard("exitSync", || {
        Ok(host::exit(Duration::from_millis(limit_ms.into())) as u32)
    })
}

/// At `process.on('exit')` in a worker thread: releases the locks of this environment (this
/// thread) still held, blocking at most `limitMs`; the rest of the process goes on.
#[napi]
pub fn release_env_sync(env: &Env, limit_ms: u32) -> Result<()> {
    guard("releaseEnvSync", || {
        crate::env::locks_of(env)?.release_all_blocking(Duration::from_millis(limit_ms.into()));
        Ok(())
    })
}

/// A reentrancy owner id unique in the process (worker threads share the core's managers, so
/// a per-thread counter would let two workers re-enter each other's locks).
#[napi]
pub fn new_owner() -> Result<i64> {
    static NEXT: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(1);
    guard("newOwner", || {
        Ok(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    })
}
