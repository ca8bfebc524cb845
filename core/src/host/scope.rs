//! The end of a lock's scope (`with`, `async with`, `withLock`, `WithLock`): one decision
//! from how the body ended and where the lock stands, one wording of each message, for every
//! binding.
//!
//! | lock at the end         | body finished        | body failed (an error)     | body interrupted (a signal, a cancellation not ours) |
//! |-------------------------|----------------------|----------------------------|------------------------------------------------------|
//! | lost                    | raise `LockLost`     | raise `LockLost`, caused by the body's error | the interruption goes through  |
//! | released now            | nothing              | the body's error goes through | the interruption goes through                     |
//! | gone at release (`false`) | raise `LockLost`   | log, the body's error goes through | log, the interruption goes through           |
//! | release failed          | raise that error     | log, the body's error goes through | log, the interruption goes through           |
//! | released elsewhere      | nothing              | the body's error goes through | the interruption goes through                     |
//!
//! A body stopped by the loss itself (the exception injected into a `with` block, the
//! cancellation of an `async with`'s task, a `withLock` callback's abort) counts as finished:
//! the scope raises the full `LockLost`, not caused by the binding's own interruption.
//! "Released elsewhere" is a release in the body (`lock.release()`) or a handle a forked child
//! inherited: there is nothing left to do.

use crate::error::Shown;
use crate::error::{Error, ErrorKind};
use crate::host::lock::Lock;
use crate::lock::LockStatus;

/// How the body of the scope ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// Returned normally.
    Finished,
    /// Raised an error (Python: an `Exception`; JavaScript: a rejection; Go: an `error`).
    Failed,
    /// Was interrupted by something that is not an error (Python: `KeyboardInterrupt`,
    /// `SystemExit`, a cancellation that is not ours): it must go through unchanged.
    Interrupted,
    /// Was stopped by the binding because the lock was lost (see the module doc).
    StoppedByLoss,
}

/// What the release at the end of the scope found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// Released on a quorum.
    Released,
    /// The lock was no longer held on a quorum (expired or taken).
    WasGone,
    /// The release failed (nodes unreachable, a Redis error).
    Failed(Error),
    /// Nothing to release: released in the body, or a forked child's inherited handle.
    Elsewhere,
}

/// What the binding does at the end of the scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScopeEnd {
    /// Nothing: the body's own outcome stands.
    Clean,
    /// Raise `error`; with `chain`, the body's error is its cause (Python's `__cause__`,
    /// JavaScript's `cause`, Go's wrapped error); without, no cause is shown.
    Raise { error: Error, chain: bool },
    /// Log `message` as a warning (the binding's logger); the body's outcome stands.
    Log(String),
}

/// The message of a lock found gone when the scope released it.
pub fn gone_message(what: &str, key: &str) -> String {
    format!(
        "{what} {key:?} lost: it was no longer held on a quorum when the scope ended (it expired, \
         as when the body outlives the ttl with the watchdog off, or a node lost it in a restart \
         or failover and another owner took it)",
        key = Shown(key)
    )
}

/// The decision table of the module doc. `lost` is the loss reason if the lock was lost
/// (before or during the release).
pub fn decide(
    what: &str,
    key: &str,
    body: Body,
    lost: Option<String>,
    release: Release,
) -> ScopeEnd {
    if let Some(reason) = lost {
        return match body {
            Body::Interrupted => ScopeEnd::Clean,
            Body::Failed => ScopeEnd::Raise {
                error: Error::new(ErrorKind::LockLost, reason),
                chain: true,
            },
            Body::Finished | Body::StoppedByLoss => ScopeEnd::Raise {
                error: Error::new(ErrorKind::LockLost, reason),
                chain: false,
            },
        };
    }
    let body_ok = matches!(body, Body::Finished | Body::StoppedByLoss);
    match release {
        Release::Released | Release::Elsewhere => ScopeEnd::Clean,
        Release::WasGone if body_ok => ScopeEnd::Raise {
            error: Error::new(ErrorKind::LockLost, gone_message(what, key)),
            chain: false,
        },
        Release::WasGone => ScopeEnd::Log(gone_message(what, key)),
        Release::Failed(error) if body_ok => ScopeEnd::Raise {
            error,
            chain: false,
        },
        Release::Failed(error) => ScopeEnd::Log(format!(
            "while ending the scope after the body failed: {}",
            error.message()
        )),
    }
}

/// Releases the scope's lock unless it was released elsewhere, then [`decide`]s. Cancelling
/// this future does not cancel the release: it completes in the background.
pub async fn end(lock: &Lock, body: Body) -> ScopeEnd {
    let release = if lock.inherited() || lock.core().status() == LockStatus::Released {
        Release::Elsewhere
    } else {
        match lock.release().await {
            Ok(true) => Release::Released,
            Ok(false) => Release::WasGone,
            // Released meanwhile by another call (the body's, on another thread).
            Err(e) if e.kind() == ErrorKind::NotHeld => Release::Elsewhere,
            Err(e) => Release::Failed(e),
        }
    };
    let lost = lock.loss_reason().map(|r| r.to_string());
    decide(lock.core().what(), lock.key(), body, lost, release)
}

/// [`end`] on the calling thread, which drives its own I/O. Not interruptible: the release
/// at the end of a scope always completes (each request is bounded by the node timeout).
pub fn end_blocking(lock: &Lock, body: Body) -> ScopeEnd {
    crate::runtime::block_on(end(lock, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lost() -> Option<String> {
        Some("lock \"k\" lost: gone".to_string())
    }

    fn failed() -> Release {
        Release::Failed(Error::new(ErrorKind::QuorumUnreachable, "no quorum"))
    }

    fn raise(kind: ErrorKind, chain: bool) -> impl Fn(&ScopeEnd) -> bool {
        move |end| matches!(end, ScopeEnd::Raise { error, chain: c } if error.kind() == kind && *c == chain)
    }

    #[test]
    fn lost_raises_unless_interrupted_and_chains_a_failed_body() {
        for release in [
            Release::Released,
            Release::WasGone,
            failed(),
            Release::Elsewhere,
        ] {
            let at = |body| decide("lock", "k", body, lost(), release.clone());
            assert!(raise(ErrorKind::LockLost, false)(&at(Body::Finished)));
            assert!(raise(ErrorKind::LockLost, false)(&at(Body::StoppedByLoss)));
            assert!(raise(ErrorKind::LockLost, true)(&at(Body::Failed)));
            assert_eq!(at(Body::Interrupted), ScopeEnd::Clean);
        }
    }

    #[test]
    fn a_clean_release_or_one_elsewhere_adds_nothing() {
        for body in [
            Body::Finished,
            Body::Failed,
            Body::Interrupted,
            Body::StoppedByLoss,
        ] {
            assert_eq!(
                decide("lock", "k", body, None, Release::Released),
                ScopeEnd::Clean
            );
            assert_eq!(
                decide("lock", "k", body, None, Release::Elsewhere),
                ScopeEnd::Clean
            );
        }
    }

    #[test]
    fn gone_at_release_raises_after_a_finished_body_and_logs_after_a_failed_one() {
        let gone = |body| decide("lock", "k", body, None, Release::WasGone);
        assert!(raise(ErrorKind::LockLost, false)(&gone(Body::Finished)));
        assert_eq!(gone(Body::Failed), ScopeEnd::Log(gone_message("lock", "k")));
        assert_eq!(
            gone(Body::Interrupted),
            ScopeEnd::Log(gone_message("lock", "k"))
        );
        assert!(
            gone_message("lock", "k").contains("no longer held on a quorum when the scope ended")
        );
    }

    #[test]
    fn a_failed_release_raises_after_a_finished_body_and_logs_after_a_failed_one() {
        let at = |body| decide("lock", "k", body, None, failed());
        assert!(raise(ErrorKind::QuorumUnreachable, false)(&at(
            Body::Finished
        )));
        assert_eq!(
            at(Body::Failed),
            ScopeEnd::Log("while ending the scope after the body failed: no quorum".into())
        );
        assert!(matches!(at(Body::Interrupted), ScopeEnd::Log(_)));
    }
}
