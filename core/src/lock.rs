//! A held lock: its token, its validity deadline on the monotonic clock, and the calls that
//! extend and release it on a quorum.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{OwnedMutexGuard, watch};
use tokio::time::Instant;

use crate::acquire::Kind;
use crate::error::Shown;
use crate::error::{Error, ErrorKind, Result};
use crate::node::NodeError;
use crate::node::{Node, latch_px_ms};
use crate::options::LockOptions;
use crate::owner::Holder;
use crate::queue::barge_bound_ms;
use crate::quorum::{Answer, FanOut, Tally, fan_out, yes_if};
use crate::scripts::{
    Extend, Latch, Release, ReleaseRead, ReleaseReentrant, ReleaseWrite, SemaphoreRelease,
    redisson_channel,
};
use crate::shared::Shared;
use crate::token::random_hex;
use crate::watchdog::{Next, Watched};

/// Where a lock stands.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockStatus {
    Held,
    Released,
    /// The lock can no longer be guaranteed; the reason says why. Signalled before the
    /// validity deadline whenever the process keeps running.
    Lost(LossReason),
}

/// Why a held lock was lost. `what` is what its messages call the key: `lock`, or
/// `semaphore` for a semaphore's permits.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// Our token is gone from a majority of nodes: the key was deleted, expired, or another
    /// owner now holds it.
    TokenGone {
        what: &'static str,
        key: String,
        missing_on: usize,
        nodes: usize,
    },
    /// Renewals could not reach a quorum before the validity would end.
    QuorumUnreachable {
        what: &'static str,
        key: String,
        detail: String,
    },
    /// A quorum confirmed, but too late to count: after the validity it would set had ended,
    /// or with less than its loss margin (two node timeouts) of it left.
    RenewalTooSlow { what: &'static str, key: String },
    /// `max_hold` was reached: the watchdog (if on) stops renewing, and the holder is told, with
    /// the watchdog off too.
    MaxHold {
        what: &'static str,
        key: String,
        max_hold: std::time::Duration,
    },
    /// The watchdog is off for this lock and its ttl is about to run out.
    Expiring {
        what: &'static str,
        key: String,
        ttl: std::time::Duration,
    },
    /// Its manager's `release_all` or `close` released it while its holder had not: the
    /// holder's work is no longer protected, and is told so like any other loss.
    ReleasedByManager { what: &'static str, key: String },
    /// Its last handle was garbage-collected (Python, Node, Go) while it was held: it is
    /// released, and whoever still watches for its loss (a Node `signal`, Go's `Lost()`, an
    /// `on_lost` callback) is told, since the work it guarded may still be running. `scope`:
    /// the binding's scope function (Node's `withLock`) the lock was held for, whose body was
    /// then collected with it, still waiting.
    Collected {
        what: &'static str,
        key: String,
        scope: Option<String>,
    },
}

impl LossReason {
    /// A stable snake_case name of the reason (the metrics' `reason` label).
    pub fn code(&self) -> &'static str {
        match self {
            LossReason::TokenGone { .. } => "token_gone",
            LossReason::QuorumUnreachable { .. } => "quorum_unreachable",
            LossReason::RenewalTooSlow { .. } => "renewal_too_slow",
            LossReason::MaxHold { .. } => "max_hold",
            LossReason::Expiring { .. } => "expiring",
            LossReason::ReleasedByManager { .. } => "released_by_manager",
            LossReason::Collected { .. } => "collected",
        }
    }
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LossReason::TokenGone {
                what,
                key,
                missing_on,
                nodes,
            } => write!(
                f,
                "{what} {key:?} lost: our token is gone on {missing_on} of {nodes} nodes (deleted, expired, or taken by another owner)",
                key = Shown(key)
            ),
            LossReason::QuorumUnreachable { what, key, detail } => {
                write!(
                    f,
                    "{what} {key:?} lost: renewal could not reach a quorum in time to keep it: {detail}",
                    key = Shown(key)
                )
            }
            LossReason::RenewalTooSlow { what, key } => {
                write!(
                    f,
                    "{what} {key:?} lost: renewal confirmed too late, after the validity had ended or \
                     with less than its loss margin (two node timeouts) of it left",
                    key = Shown(key)
                )
            }
            LossReason::Expiring { what, key, ttl } => {
                write!(
                    f,
                    "{what} {key:?} lost: its ttl of {ttl:?} is running out and the watchdog is off",
                    key = Shown(key)
                )
            }
            LossReason::MaxHold {
                what,
                key,
                max_hold,
            } => {
                write!(
                    f,
                    "{what} {key:?} lost: max_hold={max_hold:?} reached, the longest it may be held (it is not renewed past it)",
                    key = Shown(key)
                )
            }
            LossReason::ReleasedByManager { what, key } => {
                write!(
                    f,
                    "{what} {key:?} lost: its manager released it (closing, or releasing all its locks) while it was still held",
                    key = Shown(key)
                )
            }
            LossReason::Collected {
                what,
                key,
                scope: None,
            } => write!(
                f,
                "{what} {key:?} is released because its handle was garbage-collected while the \
                 {what} was held: the work it guards may still be running without it; keep a \
                 reference to the {what} until you release it, or hold it for a scope (Python's \
                 with, Node's withLock, Go's WithLock)",
                key = Shown(key)
            ),
            // The advice above would send the reader to the scope they already used: its body
            // went to the collector too, which only happens while it waits on something nothing
            // can complete any more.
            LossReason::Collected {
                what,
                key,
                scope: Some(scope),
            } => write!(
                f,
                "{what} {key:?} is released because its handle was garbage-collected while the \
                 {what} was held by {scope}, with its callback: the callback was waiting on \
                 something nothing references any more (a promise whose resolve and reject \
                 are gone), so it can never settle and {scope} would never have ended; keep a \
                 reference to whatever is to settle what the callback awaits"
            ),
        }
    }
}

/// What a renewal (or extend) confirmed by a quorum did to the lock.
pub(crate) enum Renewed {
    /// The new validity, from now.
    Until(Duration),
    /// Confirmed after the validity it would have given had ended, or inside its loss margin.
    TooLate,
    /// The lock was lost or released while the request was out: left as it is.
    NotHeld,
}

pub(crate) struct State {
    pub status: LockStatus,
    pub deadline: Instant,
    /// The lease renewals ask for: the acquire's ttl until an `extend_for` sets another.
    pub ttl: Duration,
    pub extensions: u32,
    /// When the watchdog renews next.
    pub next_renewal: Instant,
    /// What the last failed renewal saw, reported if the lock is then lost.
    pub last_failure: Option<LossReason>,
    /// Release has run (a lost lock keeps its `Lost` status, and is still released once).
    pub released: bool,
    /// Its manager releases it for its holder (`released_by_manager`): the holder's own
    /// release then finds it gone (`Ok(false)`), as after any loss, rather than an error.
    pub by_manager: bool,
    /// A watchdog renewal is in flight.
    pub renewing: bool,
    /// After a failed renewal: when to try again (no early slack for retries).
    pub retry_at: Option<Instant>,
    /// The status channel, made by the first `lost()`: a lock nobody listens to pays for none.
    status_tx: Option<watch::Sender<LockStatus>>,
    /// Registered with the watchdog. A lock it has nothing to renew (watchdog off, no
    /// `max_hold`) is registered only once someone waits on `lost()`; until then its
    /// `Expiring` loss is worked out from the deadline whenever its status is read.
    watched: bool,
}

type LossCallback = Box<dyn FnOnce(&LossReason) + Send>;

pub(crate) struct LockInner {
    pub shared: Arc<Shared>,
    pub key: String,
    pub token: String,
    /// A counted lock's hold id (see `scripts::hold_key`): its release takes a count only
    /// where its grant put its mark. Empty for a plain lock or a semaphore.
    pub hold: String,
    pub opts: LockOptions,
    pub fence: Option<u64>,
    pub acquired_at: Instant,
    /// Reentrant locks: the owner and the owner id in the hash field.
    pub holder: Option<Holder>,
    /// The metrics of the key's prefix (`metrics.rs`), looked up once, at the grant.
    pub stats: Arc<crate::metrics::Stats>,
    /// Only the process that acquired the lock may release it: a forked child inherits the
    /// handle but not the right to drop the parent's lock.
    pid: u32,
    state: Mutex<State>,
    /// Called once if the lock is lost, dropped uncalled once it is released.
    on_lost: Mutex<Vec<LossCallback>>,
    /// Serializes extend, renewal and release, so a release never races a renewal in flight.
    pub op: Arc<tokio::sync::Mutex<()>>,
    /// With several nodes: the grant's acquire requests that may still be sent again; the
    /// release on a node waits for that node's (see `acquire::Sending`).
    sending: Option<Arc<crate::acquire::Sending>>,
}

impl LockInner {
    /// What its messages call its key (see `LossReason`).
    pub fn what(&self) -> &'static str {
        Kind::of(&self.opts).noun()
    }

    pub fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves a held lock to `status` and wakes everyone waiting on it. A lock that is already
    /// released or lost stays as it is.
    pub fn finish(&self, status: LockStatus) -> bool {
        self.finish_locked(self.state(), status)
    }

    fn finish_locked(&self, mut s: MutexGuard<'_, State>, status: LockStatus) -> bool {
        if s.status != LockStatus::Held {
            return false;
        }
        // Counted before the status shows: whoever sees the lock lost sees the loss counted.
        if let LockStatus::Lost(reason) = &status {
            self.stats.lost(reason.code());
        }
        s.status = status.clone();
        let tx = s.status_tx.clone();
        drop(s);
        if let LockStatus::Lost(reason) = &status {
            tracing::warn!("{reason}");
        }
        // After the status is set, so a callback registered from now on sees it instead.
        let callbacks =
            std::mem::take(&mut *self.on_lost.lock().unwrap_or_else(|p| p.into_inner()));
        if let LockStatus::Lost(reason) = &status {
            for callback in callbacks {
                // A callback that panics must not take the others, or the thread declaring
                // the loss, with it: usually the watchdog, which renews and tells every other
                // lock of the process.
                let called =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| callback(reason)));
                if let Err(payload) = called {
                    tracing::error!(
                        "{} {:?}: an on_lost callback panicked: {}",
                        self.what(),
                        self.key,
                        crate::error::panic_text(&*payload)
                    );
                }
            }
        }
        if let Some(tx) = tx {
            tx.send_replace(status);
        }
        true
    }

    /// The state, after declaring a lock the watchdog does not renew `Expiring` once its loss
    /// margin before the deadline is reached: what the watchdog would have done by then, done
    /// by whoever looks first (the watchdog itself, for a lock registered with it).
    pub fn current(&self) -> MutexGuard<'_, State> {
        let s = self.state();
        if self.opts.watchdog || s.status != LockStatus::Held || Instant::now() < self.lose_at(&s) {
            return s;
        }
        let reason = s
            .last_failure
            .clone()
            .unwrap_or_else(|| LossReason::Expiring {
                what: self.what(),
                key: self.key.clone(),
                ttl: s.ttl,
            });
        self.finish_locked(s, LockStatus::Lost(reason));
        self.state()
    }

    /// When the lock is declared lost unless a renewal has moved its deadline.
    pub fn lose_at(&self, s: &State) -> Instant {
        s.deadline
            .checked_sub(loss_margin(&self.opts, s.ttl))
            .unwrap_or(s.deadline)
    }

    /// The end of what a hold whose validity ends at `deadline` may count on: the lock is
    /// declared lost at `max_hold` whatever its lease.
    pub fn usable_until(&self, deadline: Instant) -> Instant {
        match self.opts.max_hold {
            Some(max_hold) => deadline.min(self.acquired_at + max_hold),
            None => deadline,
        }
    }

    /// The options in force: the acquire's, with the ttl of the last `extend_for` (its node
    /// timeout and drift follow from it).
    pub fn lease(&self, s: &State) -> LockOptions {
        self.opts.clone().ttl(s.ttl)
    }

    /// A renewal (or extend) for `ttl` confirmed by a quorum at `start`. The watchdog renews
    /// with `ttl` from now on, and is woken if it must look at this lock sooner than planned.
    pub fn renewed(&self, start: Instant, ttl: Duration, drift: Duration) -> Renewed {
        let deadline = start + ttl - drift;
        let now = Instant::now();
        // Heard inside the loss margin of the validity it would set, it is too late, as such a
        // grant is (`grant_cutoff`): kept, the lock was declared lost at the same moment, and
        // an extend said `Ok` with that validity.
        let cutoff = deadline
            .checked_sub(loss_margin(&self.opts, ttl))
            .unwrap_or(deadline);
        if now >= cutoff {
            return Renewed::TooLate;
        }
        let mut s = self.state();
        // Lost (or released) while the request was out: a confirmation does not bring it
        // back, and the caller of an extend must hear of the loss, not of a validity.
        if s.status != LockStatus::Held {
            return Renewed::NotHeld;
        }
        s.deadline = deadline;
        s.ttl = ttl;
        s.next_renewal = start + ttl / 3;
        s.last_failure = None;
        s.retry_at = None;
        if s.watched {
            let next = self.next_event(&s);
            drop(s);
            self.shared.watchdog.reschedule(next);
        }
        Renewed::Until(deadline - now)
    }

    /// Has the watchdog, if it renews this lock, renew it as soon as it can.
    fn renew_now(&self) {
        let mut s = self.state();
        s.retry_at = Some(Instant::now());
        if s.watched {
            let next = self.next_event(&s);
            drop(s);
            self.shared.watchdog.reschedule(next);
        }
    }

    /// When the watchdog must look at this lock next: its renewal (or retry) time when it is
    /// renewed, and never later than the moment it is to be declared lost.
    pub fn next_event(&self, s: &State) -> Instant {
        let mut at = self.lose_at(s);
        // A renewal in flight settles by itself (and reschedules then).
        if self.opts.watchdog && !s.renewing {
            at = at.min(s.retry_at.unwrap_or(s.next_renewal));
        }
        if let Some(max_hold) = self.opts.max_hold {
            at = at.min(self.acquired_at + max_hold);
        }
        at
    }

    /// Whether this handle was made in another process (a forked child's copy of its
    /// parent's lock): such a handle is inert, never renewed, released, extended or
    /// signalled, and its mutexes are never touched (the parent's threads may have held them
    /// at the fork).
    pub fn inherited(&self) -> bool {
        self.pid != crate::runtime::pid()
    }
}

/// How long before the deadline a lock is declared lost if no renewal has confirmed: time
/// for one more renewal to be sent and answered, twice, so the signal lands before the
/// deadline even when the watchdog is busy with a batch at that moment.
pub(crate) fn loss_margin(opts: &LockOptions, ttl: Duration) -> Duration {
    opts.clone().ttl(ttl).effective_node_timeout() * 2
}

/// The last moment a grant whose validity ends at `deadline` may be heard and still count:
/// one heard later would be declared lost as soon as it was handed out (its loss margin
/// reached), so it is treated as too late, given back, and tried again within the wait.
pub(crate) fn grant_cutoff(opts: &LockOptions, deadline: Instant) -> Instant {
    deadline
        .checked_sub(loss_margin(opts, opts.ttl))
        .unwrap_or(deadline)
}

/// The longest read lease: Redisson's read renewal lease (`lockWatchdogTimeout`'s default).
pub const READ_LEASE_CAP: Duration = Duration::from_secs(30);

/// Refuses a read lease above `READ_LEASE_CAP`, and a lease (at acquire and `extend_for`) that
/// leaves the watchdog no room to renew before it declares the lock lost: the loss margin must
/// be under ttl/3, the renewal period, and drift + margin + a renewal's node timeout under
/// 2·ttl/3. The default node timeout (at most ttl/10) and drift_factor (0.01) always fit.
/// `what` completes "ttl … is too short".
pub(crate) fn check_lease(opts: &LockOptions, what: impl FnOnce() -> String) -> Result<()> {
    let ttl = opts.ttl;
    if Kind::of(opts) == Kind::Read && ttl > READ_LEASE_CAP {
        // See DESIGN.md, "Read-write lock": Redisson's read renewal sets the hash to 30 s
        // whatever it was, so only a lease within it is sure to outlive our validity.
        return Err(Error::invalid(format!(
            "ttl {ttl:?} is too long {}: a read lease is capped at {READ_LEASE_CAP:?} \
             (Redisson's read renewal sets the key's expiry to 30 s, which could end a longer \
             read hold before its validity); use a ttl of at most 30 s",
            what()
        )));
    }
    let margin = loss_margin(opts, ttl);
    let timeout = opts.effective_node_timeout();
    if margin >= ttl / 3 {
        return Err(Error::invalid(format!(
            "ttl {ttl:?} is too short {}: its loss margin (2 × node timeout {timeout:?} = \
             {margin:?}) must be under a third of it, or the watchdog could not renew it before \
             declaring it lost; use a longer ttl or a shorter node timeout",
            what()
        )));
    }
    // The watchdog renews a third of the ttl in, and that renewal (up to a node timeout) must
    // be confirmed before the loss margin of the validity (ttl - drift) begins. A large
    // drift_factor (above about 0.6 by default) broke every renewed lock before its first
    // renewal.
    let drift = opts.drift();
    if drift + margin + timeout >= ttl * 2 / 3 {
        return Err(Error::invalid(format!(
            "drift_factor {} leaves the ttl {ttl:?} too short {}: the validity (ttl - drift \
             {drift:?}) must outlast the watchdog's first renewal (at a third of the ttl, up to \
             the node timeout {timeout:?}) and then the loss margin {margin:?}; use a smaller \
             drift_factor (the default is 0.01)",
            opts.drift_factor,
            what()
        )));
    }
    Ok(())
}

/// Why an extend cannot go on: the lock was lost (the reason) or released.
fn not_held(s: &State, what: &str, key: &str) -> Option<Error> {
    match &s.status {
        LockStatus::Held => None,
        LockStatus::Lost(reason) => Some(Error::new(
            ErrorKind::LockLost,
            format!("cannot extend: {reason}"),
        )),
        _ => Some(Error::new(
            ErrorKind::NotHeld,
            format!(
                "{what} {key:?} cannot be extended: it was released",
                key = Shown(key)
            ),
        )),
    }
}

/// The error every call on an inherited handle returns (see `LockInner::inherited`).
fn inherited_error(what: &str, key: &str, pid: u32) -> Error {
    Error::new(
        ErrorKind::NotHeld,
        format!(
            "{what} {key:?} belongs to process {pid}, which acquired it; a forked child cannot \
             use, extend or release its parent's locks",
            key = Shown(key)
        ),
    )
}

/// A lock held on a quorum of nodes. Dropping it without `release` releases it in the
/// background.
pub struct Lock {
    inner: Arc<LockInner>,
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("key", &self.inner.key)
            .field("status", &self.status())
            .field("validity", &self.validity())
            .field("fence", &self.inner.fence)
            .finish()
    }
}

impl Lock {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        shared: Arc<Shared>,
        key: String,
        token: String,
        hold: String,
        opts: LockOptions,
        deadline: Instant,
        acquired_at: Instant,
        fence: Option<u64>,
        holder: Option<Holder>,
        stats: Arc<crate::metrics::Stats>,
        sending: Option<Arc<crate::acquire::Sending>>,
    ) -> Lock {
        let next_renewal = acquired_at + opts.ttl / 3;
        let ttl = opts.ttl;
        let inner = Arc::new(LockInner {
            shared,
            key,
            token,
            hold,
            opts,
            fence,
            acquired_at,
            holder,
            stats,
            pid: crate::runtime::pid(),
            state: Mutex::new(State {
                status: LockStatus::Held,
                deadline,
                ttl,
                extensions: 0,
                next_renewal,
                last_failure: None,
                released: false,
                by_manager: false,
                renewing: false,
                retry_at: None,
                status_tx: None,
                watched: false,
            }),
            on_lost: Mutex::new(Vec::new()),
            op: Arc::new(tokio::sync::Mutex::new(())),
            sending,
        });
        // A lock with nothing to renew or to cut short is registered by `lost()` if ever.
        if inner.opts.watchdog || inner.opts.max_hold.is_some() {
            inner.state().watched = true;
            inner.shared.watchdog.watch(&inner);
        }
        Lock { inner }
    }

    /// The state, with an `Expiring` loss the watchdog has not been asked to signal applied;
    /// `None` for a handle inherited from the parent process (never locked in the child).
    fn state(&self) -> Option<MutexGuard<'_, State>> {
        (!self.inner.inherited()).then(|| self.inner.current())
    }

    pub fn key(&self) -> &str {
        &self.inner.key
    }

    /// What its messages call its key: `lock`, or `semaphore` for a semaphore's permits.
    pub(crate) fn what(&self) -> &'static str {
        self.inner.what()
    }

    /// Held, and no release begun (by this handle or another of the same grant): what its
    /// drop would release. False for an inherited handle.
    pub(crate) fn unreleased_and_held(&self) -> bool {
        self.state()
            .is_some_and(|s| !s.released && matches!(s.status, LockStatus::Held))
    }

    /// The value stored at the key, unique to this acquisition: the attempt's time in ms (12 hex
    /// digits), `-`, and 80 random bits (20 hex digits; see `token.rs`). For a
    /// reentrant lock, the hash field `"<client uuid>:<owner id>"`, shared by the handles of
    /// one outermost acquisition and its re-entries.
    pub fn token(&self) -> &str {
        &self.inner.token
    }

    /// The fence token of this grant, when fencing is on: strictly greater than the fence of
    /// every earlier grant of this key.
    pub fn fence(&self) -> Option<u64> {
        self.inner.fence
    }

    pub fn options(&self) -> &LockOptions {
        &self.inner.opts
    }

    /// Tells the holder the lock is lost because its manager is releasing it on the holder's
    /// behalf (`host::Manager::release_all` and `close`; the release follows). A lock no longer
    /// held is left as it is.
    pub(crate) fn released_by_manager(&self) {
        self.released_for_holder(true, |what, key| LossReason::ReleasedByManager {
            what,
            key,
        });
    }

    /// Tells whoever still watches for the loss that the lock is released because its last
    /// handle was garbage-collected (`host::Lock::collected`; the drop's release follows).
    pub(crate) fn collected_while_held(&self, scope: Option<String>) {
        self.released_for_holder(false, |what, key| LossReason::Collected {
            what,
            key,
            scope,
        });
    }

    fn released_for_holder(
        &self,
        by_manager: bool,
        reason: impl FnOnce(&'static str, String) -> LossReason,
    ) {
        if !self.inner.inherited() {
            let mut s = self.inner.state();
            // One its holder is releasing (or released) is left to that release: its status
            // is set once the release is out, and a second release of it is an error.
            if s.released {
                return;
            }
            s.by_manager = by_manager;
            let reason = reason(self.inner.what(), self.inner.key.clone());
            self.inner.finish_locked(s, LockStatus::Lost(reason));
        }
    }

    /// Where the lock stands. A handle a forked child inherited from its parent reads as
    /// `Released`: the child never held it (see `check` for the reason in words).
    pub fn status(&self) -> LockStatus {
        match self.state() {
            Some(s) => s.status.clone(),
            None => LockStatus::Released,
        }
    }

    /// The instant (monotonic clock) after which the lock may be held by someone else (for an
    /// inherited handle: when it was acquired, as it guarantees the child nothing).
    pub fn deadline(&self) -> Instant {
        match self.state() {
            Some(s) => s.deadline,
            None => self.inner.acquired_at,
        }
    }

    /// The lease renewals and `extend` ask for: the acquire's ttl, or the last `extend_for`'s.
    pub fn ttl(&self) -> Duration {
        match self.state() {
            Some(s) => s.ttl,
            None => self.inner.opts.ttl,
        }
    }

    /// Time left before the deadline, or before `max_hold` is reached if sooner (as an
    /// extend's validity; it said the whole lease on a lock lost at max_hold); zero once it
    /// has passed or the lock is released/lost.
    pub fn validity(&self) -> Duration {
        match self.state() {
            Some(s) if s.status == LockStatus::Held => self
                .inner
                .usable_until(s.deadline)
                .saturating_duration_since(Instant::now()),
            _ => Duration::ZERO,
        }
    }

    /// Held, and the deadline has not passed.
    pub fn is_held(&self) -> bool {
        self.state()
            .is_some_and(|s| s.status == LockStatus::Held && Instant::now() < s.deadline)
    }

    /// `Ok` while held; `LockLost` (with the reason) once lost or past the deadline, `NotHeld`
    /// once released, or in a forked child (the lock is its parent's).
    pub fn check(&self) -> Result<()> {
        let key = &self.inner.key;
        let Some(s) = self.state() else {
            return Err(inherited_error(self.inner.what(), key, self.inner.pid));
        };
        match &s.status {
            LockStatus::Lost(reason) => Err(Error::new(ErrorKind::LockLost, reason.to_string())),
            LockStatus::Released => Err(Error::new(
                ErrorKind::NotHeld,
                format!(
                    "{} {key:?} was released",
                    self.inner.what(),
                    key = Shown(key)
                ),
            )),
            LockStatus::Held if Instant::now() >= s.deadline => Err(Error::new(
                ErrorKind::LockLost,
                format!(
                    "{} {key:?} lost: its validity ended (ttl {:?}, watchdog off or not renewed)",
                    self.inner.what(),
                    s.ttl,
                    key = Shown(key)
                ),
            )),
            LockStatus::Held => Ok(()),
        }
    }

    /// Resolves with the reason once the lock is lost (before its deadline, when the process
    /// keeps running), or with `None` once it is released. Owns what it needs: it can be
    /// spawned, and outlives the `Lock`.
    /// An inherited handle's future never resolves: the child is never told of its parent's
    /// lock.
    pub fn lost(&self) -> impl Future<Output = Option<LossReason>> + Send + 'static + use<> {
        let inherited = self.inner.inherited();
        let (mut rx, register) = {
            if inherited {
                // A channel of its own, never sent on: the parent's state is not touched.
                let (tx, rx) = watch::channel(LockStatus::Held);
                std::mem::forget(tx);
                (rx, false)
            } else {
                let mut s = self.inner.current();
                let rx = match &s.status_tx {
                    Some(tx) => tx.subscribe(),
                    None => {
                        let tx = watch::Sender::new(s.status.clone());
                        let rx = tx.subscribe();
                        s.status_tx = Some(tx);
                        rx
                    }
                };
                (rx, listening(&mut s))
            }
        };
        if register {
            // Someone waits to hear of the loss: the watchdog signals it on time.
            self.inner.shared.watchdog.watch(&self.inner);
        }
        async move {
            loop {
                match &*rx.borrow_and_update() {
                    LockStatus::Lost(reason) => return Some(reason.clone()),
                    LockStatus::Released => return None,
                    LockStatus::Held => {}
                }
                if rx.changed().await.is_err() {
                    return None;
                }
            }
        }
    }

    /// Calls `callback` once with the reason if the lock is lost (at once if it already is),
    /// never if it is released first (nor for a handle a forked child inherited). It runs on
    /// whatever thread declares the loss (usually a runtime worker running the watchdog), so
    /// it must be quick and must not block: hand the news on. A callback that panics is
    /// logged; the other callbacks still run, and the watchdog goes on. Cheaper than spawning
    /// a task to await [`Lock::lost`] for every lock.
    pub fn on_lost<F>(&self, callback: F)
    where
        F: FnOnce(&LossReason) + Send + 'static,
    {
        if self.inner.inherited() {
            return;
        }
        // Lock order: the state, then the callback list (`finish_locked` takes the list only
        // after it has let go of the state). The state is read and the callback registered
        // under one hold of the state, so a loss declared meanwhile (an `Expiring` one found
        // by `current`) either came first, and is seen here, or comes after, and finds the
        // callback in the list.
        let mut s = self.inner.current();
        crate::hooks::run(crate::hooks::Point::OnLostRegistering, &self.inner.key);
        let register = match &s.status {
            LockStatus::Held => {
                self.inner
                    .on_lost
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(Box::new(callback));
                listening(&mut s)
            }
            LockStatus::Lost(reason) => {
                let reason = reason.clone();
                drop(s);
                callback(&reason);
                return;
            }
            LockStatus::Released => return,
        };
        drop(s);
        if register {
            // Someone listens for the loss: the watchdog signals it on time.
            self.inner.shared.watchdog.watch(&self.inner);
        }
    }

    /// Renews the key on every node that still holds our token to at least the lease in force
    /// (`ttl()`) from now. Succeeds only when a quorum confirms within the new
    /// validity, and returns it. On failure nothing is deleted and nothing expired is
    /// re-created; a token gone from a quorum, or a confirmation after the new validity, marks
    /// the lock lost; with no answer the deadline stays.
    pub async fn extend(&self) -> Result<Duration> {
        self.extend_for(self.ttl()).await
    }

    /// An extend's answer that the lock is lost for `reason`; or, if it left `Held` while the
    /// extend was out (lost for another reason, or released), that.
    fn lose(&self, reason: LossReason) -> Error {
        if !self.inner.finish(LockStatus::Lost(reason.clone())) {
            return self.left_held();
        }
        let (what, key) = (self.inner.what(), &self.inner.key);
        Error::new(
            ErrorKind::LockLost,
            format!("{what} {key:?} not extended: {reason}", key = Shown(key)),
        )
    }

    /// Why an extend failed on a lock that is no longer `Held`.
    fn left_held(&self) -> Error {
        let (what, key) = (self.inner.what(), &self.inner.key);
        let s = self.inner.current();
        // Never `None`: a lock that left `Held` does not come back to it.
        not_held(&s, what, key).unwrap_or_else(|| {
            Error::new(
                ErrorKind::NotHeld,
                format!("{what} {key:?} not extended", key = Shown(key)),
            )
        })
    }

    /// As `extend`, with a lease of `ttl` from now on: the watchdog renews with it, and the
    /// node timeout and loss margin follow from it, and so does the validity returned. No
    /// node's expiry is ever shortened, for any kind: a shorter `ttl` takes effect there as
    /// the longer expiry runs down (an extend that ran late, on another connection, must not
    /// cut a lease a later one set; and a reentrant key's other handles count on it).
    pub async fn extend_for(&self, ttl: Duration) -> Result<Duration> {
        let cluster = &self.inner.shared.cluster;
        cluster.on_any_executor(self.extend_for_here(ttl)).await
    }

    async fn extend_for_here(&self, ttl: Duration) -> Result<Duration> {
        let (what, key) = (self.inner.what(), &self.inner.key);
        if self.inner.inherited() {
            return Err(inherited_error(self.inner.what(), key, self.inner.pid));
        }
        let opts = self.inner.opts.clone().ttl(ttl);
        opts.validate().map_err(|e| e.about(what, key))?;
        // The lease the lock was granted with (or last extended to) was accepted as it is.
        if ttl != self.ttl() {
            check_lease(&opts, || {
                format!("to extend {what} {key:?} to", key = Shown(key))
            })?;
        }
        let _op = self.inner.op.lock().await;
        crate::hooks::run(crate::hooks::Point::Extending, key);
        {
            let s = self.inner.current();
            if let Some(refused) = not_held(&s, what, key) {
                return Err(refused);
            }
            if Instant::now() >= s.deadline {
                return Err(Error::new(
                    ErrorKind::NotHeld,
                    format!(
                        "{what} {key:?} cannot be extended: its validity has already ended",
                        key = Shown(key)
                    ),
                ));
            }
            if let Some(max) = self.inner.opts.max_extensions
                && s.extensions >= max
            {
                // The caller's own cap, not a loss: the lock is still held (NotHeld would tell
                // a caller that treats it as "lost" to drop work it still holds safely).
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "{what} {key:?} cannot be extended: max_extensions={max} reached (it is \
                         still held until its validity ends or it is released)",
                        key = Shown(key)
                    ),
                ));
            }
        }
        self.inner.shared.cluster.cover_lease(opts.ttl);
        let start = Instant::now();
        let tally = extend_everywhere(
            &self.inner.shared,
            key,
            &self.inner.token,
            &self.inner.hold,
            &opts,
        )
        .await;
        if tally.won() {
            crate::hooks::run(crate::hooks::Point::Extended, key);
            return match self.inner.renewed(start, opts.ttl, opts.drift()) {
                Renewed::Until(validity) => {
                    self.inner.state().extensions += 1;
                    // A validity past `max_hold` promised time it does not have (an extend of
                    // 5 s said 4.9 s were left on a lock lost 0.5 s later, found by a review).
                    let now = Instant::now();
                    Ok(self
                        .inner
                        .usable_until(now + validity)
                        .saturating_duration_since(now))
                }
                Renewed::NotHeld => Err(self.left_held()),
                // Confirmed, but only after the new validity, or inside its loss margin: it has
                // ended, or is declared lost as it is handed out. (An old lease that
                // was longer may still stand on the nodes, which never shorten; the handle does
                // not count on it: lost, the safe side.)
                Renewed::TooLate => Err(self.lose(LossReason::RenewalTooSlow {
                    what,
                    key: key.clone(),
                })),
            };
        }
        let nodes = &self.inner.shared.cluster.nodes;
        let n = tally.answers.len();
        if tally.no() > n - tally.quorum {
            // No retry can succeed: the lock is lost now, not at the next renewal.
            let reason = LossReason::TokenGone {
                what,
                key: key.clone(),
                missing_on: tally.no(),
                nodes: n,
            };
            return Err(self.lose(reason));
        }
        // Unknown: the extend may have run where no answer came, which only raised the key's
        // expiry there: the validity stays. The watchdog renews now that the lock is free (a
        // renewal it tried while the extend held the lock was put off by a whole retry pause).
        drop(_op);
        self.inner.renew_now();
        let failures = tally.describe_renewal_failures(nodes);
        // Nodes that answered with an error reply (an ACL denial, READONLY) are reachable: a
        // Redis error naming the first, as an acquire and a release report it.
        if let Some((i, e)) = tally.redis_error() {
            return Err(Error::new(
                ErrorKind::Redis,
                format!(
                    "{what} {key:?} not extended, validity unchanged: node {} answered with an error: {}; {failures}",
                    nodes[i].name(),
                    e.detail(),
                    key = Shown(key)
                ),
            ));
        }
        Err(Error::new(
            ErrorKind::QuorumUnreachable,
            format!(
                "{what} {key:?} not extended, validity unchanged: quorum unreachable: {failures}",
                key = Shown(key)
            ),
        ))
    }

    /// Compare-and-delete on every node (reentrant: Redisson's unlock, a decrement of the
    /// hold count). `Ok(true)` once a quorum released; `Ok(false)` once our token is gone
    /// (expired or taken) on more than N − quorum nodes; otherwise a `Redis` error naming the
    /// first node that answered with an error and its reply, else `QuorumUnreachable` naming
    /// the nodes that did not answer. Returns, and wakes this manager's waiters, as soon as
    /// one of the first two is decided; the slower nodes' requests finish in the background.
    /// Waits for a renewal in flight. Each node is sent the release once: a release whose
    /// future is dropped still completes, in the background, with the requests already sent.
    pub async fn release(&self) -> Result<bool> {
        let cluster = &self.inner.shared.cluster;
        cluster.on_any_executor(self.release_here()).await
    }

    async fn release_here(&self) -> Result<bool> {
        if self.inner.inherited() {
            return Err(inherited_error(
                self.inner.what(),
                &self.inner.key,
                self.inner.pid,
            ));
        }
        let inner = &self.inner;
        if inner.shared.cluster.nodes.len() > 1 && crate::runtime::driving_locally() {
            // A blocking caller's multi-node grant went out on the shared connections (its
            // attempt runs as a task there, and a slow node's request may still be in flight):
            // its release goes out there too, so on each node it runs after the grant. The
            // task finishes the release even if this caller goes away.
            let (tx, rx) = tokio::sync::oneshot::channel();
            let task = inner.clone();
            inner.shared.cluster.handle().spawn(async move {
                let _ = tx.send(task.release().await);
            });
            return rx.await.unwrap_or_else(|_| {
                Err(Error::new(
                    ErrorKind::Redis,
                    "release task ended without an outcome (runtime shutting down?)",
                ))
            });
        }
        // Runs inline (no task spawn on the hot path); if this future is dropped part-way,
        // the guard finishes the release in the background.
        let mut unfinished = FinishRelease(Some(inner.clone()));
        let result = inner.release().await;
        unfinished.0 = None;
        result
    }
}

/// Someone now listens for the loss of a held lock: true when it must be registered with the
/// watchdog (after the state is unlocked), which a lock with nothing to renew is not until then.
fn listening(s: &mut State) -> bool {
    let register = !s.watched && s.status == LockStatus::Held;
    s.watched |= register;
    register
}

/// Completes a release whose caller went away (a cancelled `release().await`): redis-py
/// #3847 leaked locks forever that way. Before anything was sent, it runs the release in a
/// task. After: requests that own what they use were handed on to a task by `Releasing`;
/// only the inline one-node plain or semaphore release is sent again, which is harmless
/// because its compare-and-delete (a semaphore's removal of its own ids) is idempotent (a
/// reentrant release is a decrement, and is never sent twice).
struct FinishRelease(Option<Arc<LockInner>>);

impl Drop for FinishRelease {
    fn drop(&mut self) {
        if let Some(inner) = self.0.take() {
            let released = inner.state().released;
            if released && !inner.releases_inline() {
                return;
            }
            let handle = inner.shared.cluster.handle();
            crate::runtime::spawn_cleanup(&handle, async move {
                if released {
                    release_everywhere(
                        &inner.shared,
                        &inner.key,
                        &inner.token,
                        &inner.hold,
                        &inner.opts,
                        None,
                        inner.sending.as_deref(),
                    )
                    .await;
                } else {
                    let _ = inner.release().await;
                }
            });
        }
    }
}

/// A release's requests, which own what they use. Dropped with requests unanswered (the
/// outcome was decided before every node answered, or the caller went away), it hands them
/// to a task on the runtime they were sent from (a blocking caller's: `spawn_cleanup`), which
/// drives them to their end on the connections they went out on, and wakes this manager's
/// waiters if the release had not yet.
///
/// The exit protocol waits for these (`spawn_cleanup` counts them): a process that exits right
/// after a quorum released would otherwise leave its key on the slower nodes until the ttl.
struct Releasing<R>
where
    R: Future<Output = (usize, std::result::Result<Option<i64>, NodeError>)> + Send + 'static,
{
    inner: Arc<LockInner>,
    requests: Option<FanOut<R>>,
    woke: bool,
}

impl<R> Drop for Releasing<R>
where
    R: Future<Output = (usize, std::result::Result<Option<i64>, NodeError>)> + Send + 'static,
{
    fn drop(&mut self) {
        let Some(mut requests) = self.requests.take() else {
            return;
        };
        let (inner, woke) = (self.inner.clone(), self.woke);
        crate::runtime::spawn_cleanup(&inner.shared.cluster.handle(), {
            let inner = inner.clone();
            async move {
                while requests.next().await {}
                if !woke {
                    inner
                        .shared
                        .waiters
                        .released_locally(&Kind::of(&inner.opts).queue_channel(&inner.key));
                }
                let tally = requests.into_tally();
                let failed = tally.answers.iter().any(|a| matches!(a, Answer::Failed(_)));
                let shared = &inner.shared;
                if let Some(left_out) = failed
                    .then(|| shared.background_releases.admit(std::time::Instant::now()))
                    .flatten()
                {
                    tracing::warn!(
                        "{} {:?}: release finished in the background: {}{}",
                        inner.what(),
                        inner.key,
                        tally.describe_release(&shared.cluster.nodes),
                        shared.background_releases.left_out_note(left_out)
                    );
                }
            }
        });
    }
}

impl LockInner {
    /// The one-node plain (or semaphore) release runs inline with borrowed data (the
    /// benchmarked path: no task, no allocation for a fan-out), and is sent again if dropped
    /// (see `FinishRelease`).
    fn releases_inline(&self) -> bool {
        self.shared.cluster.nodes.len() == 1 && !Kind::of(&self.opts).counted()
    }

    async fn release(self: &Arc<Self>) -> Result<bool> {
        let key = &self.key;
        let _op = self.op.lock().await;
        let until = {
            let mut s = self.current();
            if s.released && s.by_manager {
                // Its holder's release after the manager's: not an error, the lock was lost
                // (as after any loss, whose release finds the token gone).
                return Ok(false);
            }
            if s.released {
                return Err(Error::new(
                    ErrorKind::NotHeld,
                    format!(
                        "{} {key:?} was already released",
                        self.what(),
                        key = Shown(key)
                    ),
                ));
            }
            s.released = true;
            s.deadline
        };
        self.stats.hold.observe(self.acquired_at.elapsed());
        if let Some(holder) = self.holder {
            self.shared.owners.released(key, holder);
        }
        // A lost lock stays `Lost` (its reason is what its holder needs to see); its token
        // may still sit on some nodes, so it is released all the same.
        self.finish(LockStatus::Released);
        let shared = &self.shared;
        if self.releases_inline() {
            let tally = release_everywhere(
                shared,
                key,
                &self.token,
                &self.hold,
                &self.opts,
                None,
                self.sending.as_deref(),
            )
            .await;
            let tally = self.release_past_migration(tally, until).await;
            return self.release_result(&tally);
        }
        // From here until every node has answered, `Releasing` owns the requests: no await
        // between marking the lock released and creating them (see `FinishRelease`).
        let how = How::new(shared, key, &self.opts);
        let requests = FanOut::start_owned(
            shared.cluster.nodes.len(),
            shared.cluster.quorum,
            how.timeout,
            |i, deadline| release_owned(self.clone(), i, deadline, how),
        );
        let mut run = Releasing {
            inner: self.clone(),
            requests: Some(requests),
            woke: false,
        };
        if let Some(requests) = run.requests.as_mut() {
            requests.until_decided().await;
        }
        shared
            .waiters
            .released_locally(&Kind::of(&self.opts).queue_channel(key));
        run.woke = true;
        let tally = match run.requests.take_if(|r| r.all_answered()) {
            Some(done) => done.into_tally(),
            // Decided before every node answered: the rest goes on in a task (`Releasing`).
            None => match &run.requests {
                Some(requests) => requests.tally(),
                None => unreachable!("taken only when all answered"),
            },
        };
        drop(run);
        let tally = self.release_past_migration(tally, until).await;
        self.release_result(&tally)
    }

    /// A release that met a migrating slot (nothing ran there: the key and the latch not
    /// written yet, or a read lock's hold-key prefix, on different sides answer TRYAGAIN, or
    /// the redirects outlasted redis-rs's retries) is sent again to those nodes, backing off as
    /// an acquire does, until it lands or the lock's validity (`until`) ends. Before, it failed
    /// with a Redis error at once and left the key to its ttl, keeping out every waiter
    /// meanwhile (found by a review). Every release is safe to run twice: a compare-and-delete,
    /// a ZREM of the holder's ids, a decrement taken only with its hold's mark.
    async fn release_past_migration(&self, mut tally: Tally, until: Instant) -> Tally {
        let n = tally.answers.len();
        let mut streak = 0;
        while !tally.won() && tally.no() <= n - tally.quorum && tally.migrating() {
            let pause = crate::acquire::migrating_retry(streak);
            if Instant::now() + pause >= until {
                break;
            }
            tokio::time::sleep(pause).await;
            streak += 1;
            let again: Vec<bool> = tally
                .answers
                .iter()
                .map(|a| matches!(a, Answer::Failed(NodeError::Migrating(_))))
                .collect();
            let retried = release_everywhere(
                &self.shared,
                &self.key,
                &self.token,
                &self.hold,
                &self.opts,
                Some(&again),
                self.sending.as_deref(),
            )
            .await;
            for (i, answer) in retried.answers.into_iter().enumerate() {
                if again[i] {
                    tally.answers[i] = answer;
                }
            }
        }
        tally
    }

    /// The outcome of a release, from what each node said (see `Lock::release`).
    fn release_result(&self, tally: &Tally) -> Result<bool> {
        let (what, key, nodes) = (self.what(), &self.key, &self.shared.cluster.nodes);
        let n = tally.answers.len();
        if tally.won() {
            if tally.yes() < n {
                tracing::info!(
                    "{what} {key:?} released: {}",
                    tally.describe_release(nodes),
                    key = Shown(key)
                );
            }
            return Ok(true);
        }
        let described = tally.describe_release(nodes);
        if tally.no() > n - tally.quorum {
            tracing::debug!(
                "{what} {key:?} was no longer ours: {described}",
                key = Shown(key)
            );
            return Ok(false);
        }
        if let Some((i, e)) = tally.first_error_reply() {
            return Err(Error::new(
                ErrorKind::Redis,
                format!(
                    "{what} {key:?} not released on a quorum: node {} answered with an error: {}; {described}",
                    nodes[i].name(),
                    e.detail(),
                    key = Shown(key)
                ),
            ));
        }
        Err(Error::new(
            ErrorKind::QuorumUnreachable,
            format!(
                "{what} {key:?} not released on a quorum (the nodes that did not answer keep it until its ttl): {described}",
                key = Shown(key)
            ),
        ))
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        // Never in a forked child: the lock is the parent's (and its state is not touched).
        if !self.inner.inherited() && !self.inner.state().released {
            let inner = self.inner.clone();
            // Counted, so that closing and exit wait for it (not `spawn_cleanup`: a drop
            // never blocks, not even on a blocking caller's thread).
            let pending = crate::runtime::Pending::start();
            self.inner.shared.cluster.handle().spawn(async move {
                let _ = inner.release().await;
                drop(pending);
            });
        }
    }
}

/// How one release request is sent, worked out once per release.
#[derive(Clone, Copy)]
struct How {
    kind: Kind,
    ttl_ms: u64,
    timeout: Duration,
    /// Plain: contention seen lately (the release may be quiet).
    contended: bool,
    /// Plain, one node, a worker in a loop: the head's barging bound within which the
    /// release is quiet; 0: never quiet.
    quiet_bound: u64,
    /// How long the release's latch lives (see `scripts::Latch`).
    latch_px: u64,
}

impl How {
    fn new(shared: &Shared, key: &str, opts: &LockOptions) -> How {
        let kind = Kind::of(opts);
        // Plain: the queue whose first waiter is told, on its own channel, once the waiters
        // whose lease ended are dropped (see release.lua).
        // A worker in a loop on the key (one node) releases quietly while the first waiter is
        // within its barging bound: bound 0 means never quiet.
        let (contended, streak) = if kind.counted() {
            (false, false)
        } else {
            shared.contention.release_view(key)
        };
        let quiet_bound = if streak && shared.cluster.nodes.len() == 1 {
            barge_bound_ms(1)
        } else {
            0
        };
        let timeout = opts.effective_node_timeout();
        How {
            kind,
            ttl_ms: opts.ttl_millis(),
            timeout,
            contended,
            quiet_bound,
            latch_px: latch_px_ms(timeout),
        }
    }
}

/// Compare-and-delete on every node (or on those marked in `only`), waiting for each up to
/// the node timeout.
pub(crate) async fn release_everywhere(
    shared: &Shared,
    key: &str,
    token: &str,
    hold: &str,
    opts: &LockOptions,
    only: Option<&[bool]>,
    sending: Option<&crate::acquire::Sending>,
) -> Tally {
    let how = How::new(shared, key, opts);
    // Reentrant: Redisson's channel (only its unlock publishes there).
    let redisson = if how.kind == Kind::Reentrant {
        redisson_channel(key)
    } else {
        String::new()
    };
    let redisson = redisson.as_str();
    let tally = fan_out(
        &shared.cluster.nodes,
        shared.cluster.quorum,
        how.timeout,
        false,
        |i, _, deadline| {
            let wanted = only.is_none_or(|m| m[i]);
            async move {
                if !wanted {
                    return Ok(None);
                }
                release_on(
                    shared, i, key, token, hold, how, redisson, deadline, sending,
                )
                .await
            }
        },
    )
    .await;
    shared
        .waiters
        .released_locally(&how.kind.queue_channel(key));
    tally
}

/// Node `i`'s release request, owning what it uses, so that it can be handed to a task.
async fn release_owned(
    inner: Arc<LockInner>,
    i: usize,
    deadline: Instant,
    how: How,
) -> std::result::Result<Option<i64>, NodeError> {
    let redisson = if how.kind == Kind::Reentrant {
        redisson_channel(&inner.key)
    } else {
        String::new()
    };
    let (shared, key, token) = (&inner.shared, &inner.key, &inner.token);
    let sending = inner.sending.as_deref();
    release_on(
        shared,
        i,
        key,
        token,
        &inner.hold,
        how,
        &redisson,
        deadline,
        sending,
    )
    .await
}

/// Node `i`'s release: Some = released, None = not ours (expired or taken).
#[allow(clippy::too_many_arguments)]
async fn release_on(
    shared: &Shared,
    i: usize,
    key: &str,
    token: &str,
    hold: &str,
    how: How,
    redisson: &str,
    deadline: Instant,
    sending: Option<&crate::acquire::Sending>,
) -> std::result::Result<Option<i64>, NodeError> {
    if let Some(sending) = sending {
        // After this node's acquire can no longer be sent again: a re-send that ran after this
        // release would grant the key afresh to a lock already released (see `Sending`).
        sending.settled(i).await;
    }
    // A reentrant release's call id, drawn once so that every re-send carries it (a plain
    // release's latch is named by its token, unique per grant).
    let call = if how.kind.counted() || how.kind == Kind::Permits {
        random_hex()
    } else {
        String::new()
    };
    let call = call.as_str();
    shared.cluster.nodes[i]
        .run_bounded(deadline, how.timeout, false, move |mut conn| async move {
            let latch = Latch {
                id: call,
                px_ms: how.latch_px,
            };
            let sharded = conn.sharded();
            let rw = match how.kind {
                Kind::Read => Some(
                    ReleaseRead {
                        key,
                        field: token,
                        latch,
                        hold,
                    }
                    .invocation(sharded),
                ),
                Kind::Write => Some(
                    ReleaseWrite {
                        key,
                        field: token,
                        latch,
                        hold,
                    }
                    .invocation(sharded),
                ),
                _ => None,
            };
            if how.kind == Kind::Permits {
                // How many of this holder's permits went back: 0 = every one was reclaimed.
                let release = SemaphoreRelease {
                    name: key,
                    ids: token,
                    latch,
                };
                let back: i64 =
                    Box::pin(release.invocation(sharded).invoke_async(&mut conn)).await?;
                return Ok(yes_if(back > 0));
            }
            if let Some(rw) = rw {
                // nil = not ours, 0 = one hold fewer, 1 = freed.
                let left: Option<i64> = Box::pin(rw.invoke_async(&mut conn)).await?;
                return Ok(yes_if(left.is_some()));
            }
            if how.kind == Kind::Reentrant {
                // Redisson's unlock: nil = not ours, 0 = count decremented, 1 = freed.
                // Boxed, so the plain release's future does not carry this one's size.
                let unlock = ReleaseReentrant {
                    key,
                    field: token,
                    ttl_ms: how.ttl_ms,
                    channel: redisson,
                    latch,
                    hold,
                };
                let left: Option<i64> =
                    Box::pin(unlock.invocation(conn.sharded()).invoke_async(&mut conn)).await?;
                return Ok(yes_if(left.is_some()));
            }
            let cmd = release_command(key, token, how, conn.sharded());
            let deleted: i64 = Release::send(&cmd, &mut conn).await?;
            if deleted == 3 && shared.cluster.nodes.len() == 1 {
                // Waiters, but the first was not told: we may take it back at once.
                shared.contention.mark_quiet_release(key);
            } else if deleted >= 2 {
                // Someone waits: our next acquire of this key queues too.
                shared.contention.mark_loud_release(key);
            }
            Ok(yes_if(deleted >= 1))
        })
        .await
}

/// The plain release (see release.lua). Built outside the request's future, so that its
/// temporaries do not take room in it.
fn release_command(key: &str, token: &str, how: How, sharded: bool) -> redis::Cmd {
    Release {
        key,
        token,
        contended: how.contended,
        quiet_bound_ms: how.quiet_bound,
        latch_px_ms: how.latch_px,
    }
    .command(sharded)
}

pub(crate) async fn extend_everywhere(
    shared: &Shared,
    key: &str,
    token: &str,
    hold: &str,
    opts: &LockOptions,
) -> Tally {
    let timeout = opts.effective_node_timeout();
    let ttl_ms = opts.ttl_millis();
    let extend = Extend {
        key,
        token,
        ttl_ms,
        renewal: Kind::of(opts).renewal(),
        hold,
    };
    let extend = &extend;
    let voting = Kind::of(opts).renewal_waits_for_the_guard();
    fan_out(
        &shared.cluster.nodes,
        shared.cluster.quorum,
        timeout,
        true,
        |_, node, deadline| {
            node.run_bounded(deadline, timeout, voting, move |mut conn| async move {
                let extended: i64 = extend.invocation().invoke_async(&mut conn).await?;
                Ok(yes_if(extended == 1))
            })
        },
    )
    .await
}

/// How long after a failed (or skipped) renewal to try again: within what is left of the
/// validity.
fn retry_pause(lease: &LockOptions) -> Duration {
    (lease.ttl / 10).max(lease.effective_node_timeout() / 2)
}

impl Watched for LockInner {
    /// Declared lost, renewed in this tick, or looked at later.
    fn inspect(&self, now: Instant, batch: bool) -> Next {
        let lock = self;
        let mut s = lock.state();
        if s.status != LockStatus::Held {
            return Next::Forget;
        }
        let key = &lock.key;
        if let Some(max_hold) = lock.opts.max_hold {
            let end = lock.acquired_at + max_hold;
            if now >= end {
                drop(s);
                lock.finish(LockStatus::Lost(LossReason::MaxHold {
                    what: lock.what(),
                    key: key.clone(),
                    max_hold,
                }));
                return Next::Forget;
            }
        }
        let lose_at = lock.lose_at(&s);
        if now >= lose_at {
            let reason = s.last_failure.clone().unwrap_or_else(|| {
                if lock.opts.watchdog {
                    LossReason::RenewalTooSlow {
                        what: lock.what(),
                        key: key.clone(),
                    }
                } else {
                    LossReason::Expiring {
                        what: lock.what(),
                        key: key.clone(),
                        ttl: s.ttl,
                    }
                }
            });
            drop(s);
            lock.finish(LockStatus::Lost(reason));
            return Next::Forget;
        }
        if lock.opts.watchdog && !s.renewing {
            // A tick that renews a due lock renews every lock due within the next half period
            // as well: locks acquired at different moments end up in one batch after their
            // first renewal, so a tick is one pipeline per node. Early only to join a batch
            // another lock made due, so renewals stay ttl/3 apart otherwise; retries after a
            // failure have no such slack.
            let due_at = s.retry_at.unwrap_or(s.next_renewal);
            if now >= due_at {
                s.renewing = true;
                return Next::RenewNow(lose_at);
            }
            let joins_from = s
                .next_renewal
                .checked_sub(s.ttl / 6)
                .unwrap_or(s.next_renewal);
            if s.retry_at.is_none() && now >= joins_from {
                if batch {
                    s.renewing = true;
                    return Next::RenewNow(lose_at);
                }
                return Next::Joinable(lock.next_event(&s));
            }
        }
        Next::At(lock.next_event(&s))
    }

    fn due(&self) -> Instant {
        let s = self.state();
        self.next_event(&s)
    }

    fn begin_renewal(&self) -> std::result::Result<(OwnedMutexGuard<()>, LockOptions), Instant> {
        match self.op.clone().try_lock_owned() {
            Ok(op) => Ok((op, self.lease(&self.state()))),
            Err(_) => {
                let mut s = self.state();
                s.renewing = false;
                s.retry_at = Some(Instant::now() + retry_pause(&self.lease(&s)));
                Err(self.next_event(&s))
            }
        }
    }

    fn key(&self) -> &str {
        &self.key
    }

    fn token(&self) -> &str {
        &self.token
    }

    fn hold(&self) -> &str {
        &self.hold
    }

    fn settle(
        &self,
        lease: &LockOptions,
        tally: &Tally,
        start: Instant,
        nodes: &[Node],
    ) -> Option<Instant> {
        self.settle_renewal(lease, tally, start, nodes);
        // The renewal's next event (the next renewal, or a failed one's retry) only now that
        // it no longer counts as in flight: `next_event` leaves a renewal in flight out, so
        // asked from `settle_renewal` it said only the loss deadline, and with a ttl under
        // the idle wake-up beside its loss margin, a failed renewal was never retried (the
        // lock was declared lost at that deadline) and a renewed one was renewed next only
        // there (found by a review).
        let mut s = self.state();
        s.renewing = false;
        (s.status == LockStatus::Held).then(|| self.next_event(&s))
    }
}

impl LockInner {
    fn settle_renewal(&self, lease: &LockOptions, tally: &Tally, start: Instant, nodes: &[Node]) {
        let lock = self;
        if tally.won() {
            match lock.renewed(start, lease.ttl, lease.drift()) {
                Renewed::Until(_) => {
                    lock.stats.renewals.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                // Released or lost meanwhile: nothing left to renew or to report.
                Renewed::NotHeld => return,
                Renewed::TooLate => {}
            }
        }
        lock.stats.renewal_failures.fetch_add(1, Ordering::Relaxed);
        let key = lock.key.clone();
        let n = tally.answers.len();
        if tally.no() > n - tally.quorum {
            // Our token is gone from too many nodes for any retry to succeed.
            lock.finish(LockStatus::Lost(LossReason::TokenGone {
                what: lock.what(),
                key,
                missing_on: tally.no(),
                nodes: n,
            }));
            return;
        }
        let failure = if tally.won() {
            LossReason::RenewalTooSlow {
                what: lock.what(),
                key,
            }
        } else {
            LossReason::QuorumUnreachable {
                what: lock.what(),
                key,
                detail: tally.describe_renewal_failures(nodes),
            }
        };
        // Transient: retry soon, within what is left of the validity.
        let mut s = lock.state();
        s.last_failure = Some(failure);
        s.retry_at = Some(Instant::now() + retry_pause(lease));
    }
}
