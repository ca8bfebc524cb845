//! `NativeLock`: a held lock as JavaScript sees it. `lock.js` wraps it (signal, dispose).

use std::sync::Arc;

use ferrolock::{Lock, LockStatus};
use napi::bindgen_prelude::PromiseRaw;
use napi::{Env, Result};
use napi_derive::napi;

use crate::errors::{invalid, to_napi};
use crate::host::{Outcome, end_of_scope, on_core};

#[napi]
pub struct NativeLock {
    pub(crate) inner: Arc<Lock>,
}

/// How a `withLock` body's end came out: `code` is empty when all went well.
#[napi(object)]
pub struct ScopeEnd {
    pub code: String,
    pub message: String,
}

#[napi]
impl NativeLock {
    #[napi(getter)]
    pub fn key(&self) -> String {
        self.inner.key().to_string()
    }

    #[napi(getter)]
    pub fn token(&self) -> String {
        self.inner.token().to_string()
    }

    /// A number: fences are counters that stay far below 2^53.
    #[napi(getter)]
    pub fn fence(&self) -> Option<f64> {
        self.inner.fence().map(|f| f as f64)
    }

    /// Milliseconds left before the validity ends (0 once released or lost).
    #[napi(getter)]
    pub fn validity(&self) -> f64 {
        self.inner.validity().as_millis() as f64
    }

    /// "held", "released" or "lost".
    #[napi(getter)]
    pub fn status(&self) -> &'static str {
        match self.inner.status() {
            LockStatus::Held => "held",
            LockStatus::Released => "released",
            _ => "lost",
        }
    }

    /// Throws `LockLost` / `NotHeld` unless the lock is held.
    #[napi]
    pub fn check(&self) -> Result<()> {
        self.inner.check().map_err(to_napi)
    }

    /// Resolves to the new validity in ms. `ttl` (ms, optional) sets a new lease.
    #[napi]
    pub fn extend<'env>(&self, env: &'env Env, ttl: Option<u32>) -> Result<PromiseRaw<'env, f64>> {
        let lock = self.inner.clone();
        if ttl == Some(0) {
            return Err(invalid(format!(
                "lock {:?}: extend(ttl = 0): must be greater than zero",
                lock.key()
            )));
        }
        env.spawn_future(on_core(async move {
            let validity = match ttl {
                Some(ms) => {
                    lock.extend_for(std::time::Duration::from_millis(ms.into()))
                        .await
                }
                None => lock.extend().await,
            };
            validity.map(|v| v.as_millis() as f64).map_err(to_napi)
        }))
    }

    /// Resolves to true once a quorum released, false if the token was already gone.
    #[napi]
    pub fn release<'env>(&self, env: &'env Env) -> Result<PromiseRaw<'env, bool>> {
        let lock = self.inner.clone();
        env.spawn_future(on_core(
            async move { lock.release().await.map_err(to_napi) },
        ))
    }

    /// Resolves with the loss message once the lock is lost, or with null once it is
    /// released. A pending promise keeps the event loop alive (napi's deferred holds a
    /// threadsafe function), so `lock.js` asks for it only when someone wants the signal, and
    /// every path that ends a lock releases it.
    #[napi]
    pub fn lost<'env>(&self, env: &'env Env) -> Result<PromiseRaw<'env, Option<String>>> {
        let lost = self.inner.lost();
        env.spawn_future(on_core(
            async move { Ok(lost.await.map(|r| r.to_string())) },
        ))
    }

    /// The end of a `withLock` body (the decision is the host layer's: `host::end_of_scope`).
    #[napi]
    pub fn end_scope<'env>(&self, env: &'env Env) -> Result<PromiseRaw<'env, ScopeEnd>> {
        let lock = self.inner.clone();
        env.spawn_future(on_core(async move {
            Ok(match end_of_scope(lock).await {
                Outcome::Done => ScopeEnd {
                    code: String::new(),
                    message: String::new(),
                },
                Outcome::Lost(message) => ScopeEnd {
                    code: ferrolock::ErrorKind::LockLost.code().to_string(),
                    message,
                },
                Outcome::ReleaseFailed(e) => ScopeEnd {
                    code: e.kind().code().to_string(),
                    message: e.message().to_string(),
                },
            })
        }))
    }
}
