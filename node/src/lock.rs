//! `NativeLock`: a held lock as JavaScript sees it, over `ferrolock::host::Lock`. `lock.js`
//! wraps it (signal, dispose).

use ferrolock::host::{self, scope::Body, scope::ScopeEnd};
use ferrolock::{LockStatus, host::Lock};
use napi::bindgen_prelude::{ObjectFinalize, PromiseRaw};
use napi::{Env, Result};
use napi_derive::napi;
use std::sync::OnceLock;

use crate::errors::{guard, invalid, to_napi};
use crate::rt::promise_on_core;

#[napi(custom_finalize)]
pub struct NativeLock {
    pub(crate) inner: Lock,
    /// The scope function (`withLock`, ...) holding it, once `enterScope` was called.
    pub(crate) scope: OnceLock<String>,
}

/// Runs only when the garbage collector takes the JavaScript object (a `NativeLock` dropped
/// on the Rust side, such as a grant that lands after its environment was torn down, does
/// not come here): a lock still held is released with its handle, and the warning says so.
impl ObjectFinalize for NativeLock {
    fn finalize(self, _env: Env) -> Result<()> {
        // The panic hook has reported a panic by then; it must not unwind into V8's collector.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match self.scope.get() {
            Some(scope) => self.inner.collected_in_scope(scope),
            None => self.inner.collected(),
        }));
        Ok(())
    }
}

/// What the end of a `withLock` body decided (`host::scope`) when it is not simply "the
/// body's outcome stands" (null): `action` is "raise" (reject with the error of `code`; with `chain`, the
/// body's error is its cause) or "log" (warn with `message`; the body's outcome stands).
#[napi(object)]
pub struct ScopeOutcome {
    pub action: String,
    pub code: String,
    pub message: String,
    pub chain: bool,
}

#[napi]
impl NativeLock {
    #[napi(getter)]
    pub fn key(&self) -> Result<String> {
        guard("NativeLock.key", || Ok(self.inner.key().to_string()))
    }

    #[napi(getter)]
    pub fn token(&self) -> Result<String> {
        guard("NativeLock.token", || {
            Ok(self.inner.core().token().to_string())
        })
    }

    /// A number: fences are counters that stay far below 2^53.
    #[napi(getter)]
    pub fn fence(&self) -> Result<Option<f64>> {
        guard("NativeLock.fence", || {
            Ok(self.inner.core().fence().map(|f| f as f64))
        })
    }

    /// Milliseconds left before the validity ends (0 once released or lost).
    #[napi(getter)]
    pub fn validity(&self) -> Result<f64> {
        guard("NativeLock.validity", || {
            Ok(self.inner.core().validity().as_millis() as f64)
        })
    }

    /// "held", "released" or "lost".
    #[napi(getter)]
    pub fn status(&self) -> Result<&'static str> {
        guard("NativeLock.status", || {
            Ok(match self.inner.core().status() {
                LockStatus::Held => "held",
                LockStatus::Released => "released",
                _ => "lost",
            })
        })
    }

    /// The loss message once the lock is lost, else null: read by `lock.js` with the status,
    /// so the signal is aborted by the time the status says lost.
    #[napi(getter)]
    pub fn loss_reason(&self) -> Result<Option<String>> {
        guard("NativeLock.lossReason", || {
            Ok(self.inner.loss_reason().map(|r| r.to_string()))
        })
    }

    /// Marks the lock as held by the scope function `name` (`withLock`, ...), for the warning
    /// given if the collector takes it: with the scope's callback, which can then never settle.
    #[napi]
    pub fn enter_scope(&self, name: String) -> Result<()> {
        guard("NativeLock.enterScope", || {
            let _ = self.scope.set(name);
            Ok(())
        })
    }

    /// Throws `LockLost` / `NotHeld` unless the lock is held.
    #[napi]
    pub fn check(&self) -> Result<()> {
        guard("NativeLock.check", || {
            self.inner.core().check().map_err(to_napi)
        })
    }

    /// Resolves to the new validity in ms. `ttl` (ms, optional) sets a new lease.
    #[napi]
    pub fn extend<'env>(&self, env: &'env Env, ttl: Option<u32>) -> Result<PromiseRaw<'env, f64>> {
        const ENTRY: &str = "NativeLock.extend";
        guard(ENTRY, || {
            let lock = self.inner.clone();
            if ttl == Some(0) {
                // No key: `lock.js` names it, as a lock's or a semaphore's.
                return Err(invalid("extend(ttl = 0): must be greater than zero"));
            }
            let ttl = ttl.map(|ms| std::time::Duration::from_millis(ms.into()));
            promise_on_core(env, ENTRY, move || async move {
                let validity = lock.extend(ttl).await;
                validity.map(|v| v.as_millis() as f64).map_err(to_napi)
            })
        })
    }

    /// Resolves to true once a quorum released, false if the token was already gone.
    #[napi]
    pub fn release<'env>(&self, env: &'env Env) -> Result<PromiseRaw<'env, bool>> {
        const ENTRY: &str = "NativeLock.release";
        guard(ENTRY, || {
            let lock = self.inner.clone();
            promise_on_core(env, ENTRY, move || async move {
                lock.release().await.map_err(to_napi)
            })
        })
    }

    /// Resolves with the loss message once the lock is lost, or with null once it is
    /// released (`host::Lock::lost`). A pending promise keeps the event loop alive (napi's
    /// deferred holds a threadsafe function), so `lock.js` asks for it only when someone
    /// wants the signal, and every path that ends a lock releases it.
    #[napi]
    pub fn lost<'env>(&self, env: &'env Env) -> Result<PromiseRaw<'env, Option<String>>> {
        const ENTRY: &str = "NativeLock.lost";
        guard(ENTRY, || {
            let lost = self.inner.lost();
            promise_on_core(env, ENTRY, move || async move {
                Ok(lost.await.map(|r| r.to_string()))
            })
        })
    }

    /// The end of a `withLock` body: `failed` when the callback threw or rejected,
    /// `stopped_by_loss` when what it threw is this lock's own loss (`lock.signal`'s reason).
    /// The release and the decision are the host layer's (`host::scope::end`). Resolves to
    /// null when the body's outcome stands as it is (the common case, no object to build).
    #[napi]
    pub fn end_scope<'env>(
        &self,
        env: &'env Env,
        failed: bool,
        stopped_by_loss: bool,
    ) -> Result<PromiseRaw<'env, Option<ScopeOutcome>>> {
        const ENTRY: &str = "NativeLock.endScope";
        guard(ENTRY, || {
            self.end_scope_unguarded(env, ENTRY, failed, stopped_by_loss)
        })
    }
}

impl NativeLock {
    fn end_scope_unguarded<'env>(
        &self,
        env: &'env Env,
        entry: &'static str,
        failed: bool,
        stopped_by_loss: bool,
    ) -> Result<PromiseRaw<'env, Option<ScopeOutcome>>> {
        let lock = self.inner.clone();
        let body = match (failed, stopped_by_loss) {
            (_, true) => Body::StoppedByLoss,
            (true, false) => Body::Failed,
            (false, false) => Body::Finished,
        };
        promise_on_core(env, entry, move || async move {
            Ok(match host::scope::end(&lock, body).await {
                ScopeEnd::Clean => None,
                ScopeEnd::Raise { error, chain } => Some(ScopeOutcome {
                    action: "raise".into(),
                    code: error.kind().code().to_string(),
                    message: error.message().to_string(),
                    chain,
                }),
                ScopeEnd::Log(message) => Some(ScopeOutcome {
                    action: "log".into(),
                    code: String::new(),
                    message,
                    chain: false,
                }),
            })
        })
    }
}
