//! The acquire loop: one attempt on every node at once, then, while the lock is busy, a place
//! in the key's local queue with push wake-ups (see `queue/waiters.rs`) and in the key's server-side
//! waiter queue (see `scripts/queue.lua` and DESIGN.md, "Waiter queue").
//!
//! Cancel safety: an attempt runs inline, armed (`InFlight`) from before its first request.
//! Its requests own what they use, so whatever is still in flight when the attempt stops (its
//! caller dropped it, or it won while slower nodes had not answered) goes on in a task: a
//! request still waiting for its node's connection has not been sent, and dropping it would
//! leave that node without the key. A dropped attempt is undone by that task, with exact
//! knowledge of which nodes granted: the nodes that answer (all but the silent ones) first, a
//! silent one in the background once its answer is in (`undo_late`); a cancelled caller
//! reports once the first part is done (`host::until_cancelled`). A failed attempt reports once
//! its outcome is decided: the nodes that answered are undone before the caller hears of it,
//! the others in the background once each has answered or timed out (`undo_late`). A won
//! attempt becomes a `Lock` with no await in between; one that went to a blocking caller
//! through a channel carries a `Claim`, undone if the caller is gone before it read it. Every
//! undo runs exactly once (`Detached`): a re-entry is undone with a decrement, only where it
//! was granted, and never twice (either would take a count from the outer grant).
//! Dropping a waiting acquire drops its `Ticket`, which leaves the queue.

mod ask;
mod attempt;
mod checks;
mod claim;
pub(crate) mod give_up;
mod in_flight;
mod kind;
mod late;
mod plan;
mod reply;
mod undo;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::Shown;
use crate::error::{ErrorKind, Result};
use crate::lock::Lock;
use crate::node::{NodeError, node_error};
use crate::options::LockOptions;
use crate::queue::{Ticket, WakeSources};
use crate::shared::Shared;
pub(crate) use attempt::Sending;
use attempt::{Req, Spoiled, run_attempt};
use checks::check_redisson_channel;
pub use checks::check_request;
use give_up::{not_acquired_error, unreachable_error};
pub(crate) use kind::Kind;
use late::wakes_us;
use plan::{channel_of, plan};
use reply::{wake_hint, without_ttl};

/// After this many attempts in a row that found a majority of nodes unreachable, acquire
/// gives up with `QuorumUnreachable` instead of waiting out its budget: a dead cluster should
/// answer in well under a second, not block forever.
pub(crate) const UNREACHABLE_ATTEMPTS: u32 = 3;

/// After an attempt that met a migrating slot (MOVED, ASK or TRYAGAIN past redis-rs's own
/// retries: nothing ran), the next one comes this soon, doubled each time in a row up to
/// `MIGRATING_RETRY_MAX`: the window closes by itself, usually well within a retry delay.
const MIGRATING_RETRY: Duration = Duration::from_millis(50);

const MIGRATING_RETRY_MAX: Duration = Duration::from_secs(1);

/// When to try again after `streak` attempts in a row met a migrating slot (a lock's and a
/// semaphore's alike).
pub(crate) fn migrating_retry(streak: u32) -> Duration {
    (MIGRATING_RETRY * 2u32.pow(streak.min(5))).min(MIGRATING_RETRY_MAX)
}

/// The acquire loop behind `LockManager::acquire_with` (`owner: None`) and `acquire_owned`.
pub(crate) async fn acquire(
    shared: &Arc<Shared>,
    key: &str,
    owner: Option<u64>,
    opts: &LockOptions,
) -> Result<Lock> {
    check_request(key, opts)?;
    shared.cluster.cover_lease(opts.ttl);
    let kind = Kind::of(opts);
    if kind.counted() {
        check_redisson_channel(shared, key, kind)?;
        refuse_the_other_kind_of_own_hold(shared, key, owner, kind)?;
    }
    let stats = crate::metrics::stats(key, kind.metric_label());
    let counting = stats.counting();
    let result = acquire_loop(shared, key, owner, opts, &stats).await;
    counting.ended(&result, opts.first_try);
    result
}

/// An owner's read-write hold and its reentrant lock on one key never re-enter each other
/// (`owner.rs`): each finds the key held by someone else, which is the owner itself, so it
/// would wait for itself (for ever with the watchdog on), and meanwhile, queued as a writer
/// is, hold up every new reader of the key (found by a review). Refused at once instead, as a
/// read->write upgrade is.
fn refuse_the_other_kind_of_own_hold(
    shared: &Shared,
    key: &str,
    owner: Option<u64>,
    kind: Kind,
) -> Result<()> {
    let rw = matches!(kind, Kind::Read | Kind::Write);
    let Some(o) = owner else { return Ok(()) };
    if shared.owners.lookup(key, o, !rw).is_none() {
        return Ok(());
    }
    let (held, asked) = if rw {
        ("a reentrant lock", "a read or write lock")
    } else {
        ("a read or write lock", "a reentrant lock")
    };
    Err(crate::error::Error::invalid(format!(
        "lock {key:?}: this owner holds {held} of this key, so {asked} of it would wait for \
         itself; release the one it holds first",
        key = Shown(key)
    )))
}

/// A fenced re-entry of an acquisition taken without fencing: it would keep that grant's
/// (no) fence.
fn fenceless_reentry(key: &str) -> crate::error::Error {
    crate::error::Error::invalid(format!(
        "lock {key:?}: fencing is on, but this owner holds the lock from an acquire without \
         fencing, and a re-entry keeps the outer grant's fence; take the outermost acquire \
         with fencing on",
        key = Shown(key)
    ))
}

async fn acquire_loop(
    shared: &Arc<Shared>,
    key: &str,
    owner: Option<u64>,
    opts: &LockOptions,
    stats: &Arc<crate::metrics::Stats>,
) -> Result<Lock> {
    let n = shared.cluster.nodes.len();
    let kind = Kind::of(opts);
    let started = Instant::now();
    let give_up_at = opts.wait.map(|w| started + w);
    let mut unreachable_streak = 0;
    let mut migrating_streak = 0;
    let mut ticket: Option<Ticket> = None;
    // An owner id whose re-entry found our field gone: that acquisition was lost.
    let mut stale: Option<u64> = None;
    // Whether the first attempt found us looping on the key (see `Contention::looping`).
    let mut first_looping: Option<bool> = None;
    // Whether an attempt was refused and we waited for a wake-up: a grant is a hand-off only
    // then. A lingering queue is joined before the first attempt, so a ticket alone made
    // every uncontended grant of a key that had a waiter a moment ago a hand-off (found by a
    // review).
    let mut waited = false;
    loop {
        // Waited on this key a moment ago (its queue still lingers, subscribed): join before
        // the first attempt, so that it queues and a release tells us.
        if ticket.is_none() && opts.wait != Some(Duration::ZERO) && shared.waiters.any() {
            let channel = channel_of(key, opts);
            let role = Kind::of(opts).queue_role();
            if shared.waiters.lingering(&channel, role) {
                ticket = Some(shared.waiters.join(key, &channel, role));
            }
        }
        let plan = plan(shared, key, owner, opts, stale);
        // (A write re-entry is checked once granted: over the owner's read hold, the node
        // refuses it as an upgrade, which says more.)
        if plan.reentry && opts.fencing && plan.fence.is_none() && kind == Kind::Reentrant {
            // A re-entry keeps the outer grant's fence, and that grant took none: granted, it
            // carried no fence though fencing was asked for (found by a review).
            return Err(fenceless_reentry(key));
        }
        // Only the head of the local queue carries our queue id; first attempts and
        // re-entries go straight to Redis without queueing.
        let head = ticket.as_ref().filter(|t| t.is_head());
        let seen = head.map(Ticket::epochs);
        let queue = head
            .zip(seen.as_ref())
            .filter(|_| !plan.reentry)
            .map(|(t, seen)| t.queue_args(opts, seen));
        // A reader's grant that keeps the place for the readers behind it leaves it queued.
        let keeps_place = queue.as_ref().is_some_and(|q| q.keep);

        let req = Req::new(shared, key, plan.token, opts, plan.reentry, queue);
        stats.attempts.fetch_add(1, Ordering::Relaxed);
        let (mut outcome, req) = run_attempt(shared, req).await?;
        let first_looping = *first_looping.get_or_insert(outcome.looping);
        if outcome.won {
            if let Some(claim) = outcome.claim.take() {
                claim.claim();
            }
            let fence = if kind == Kind::Read {
                // Readers get no fence, a downgrade's read hold under its owner's write hold
                // included (it outlives the write, beside other readers).
                None
            } else if plan.reentry {
                plan.fence
            } else {
                outcome.fence
            };
            if let Some(t) = ticket.as_mut() {
                t.granted(
                    outcome.tally.yes() == n && !keeps_place,
                    Some(outcome.started + opts.ttl),
                    keeps_place,
                );
            }
            if let Some(h) = plan.holder {
                shared.owners.granted(key, h, fence);
            }
            if first_looping && n == 1 && !Kind::of(opts).counted() {
                // A worker in a loop on this key: its release may be quiet (release.lua).
                shared.contention.mark_streak(key);
            }
            // The key and token move into the lock, unless requests still in flight
            // hold them.
            let (key, token, hold, sending) = match Arc::try_unwrap(req) {
                Ok(r) => (r.key, r.token, r.call, r.sending),
                Err(r) => (
                    r.key.clone(),
                    r.token.clone(),
                    r.call.clone(),
                    r.sending.clone(),
                ),
            };
            if waited {
                // Granted after waiting for a release.
                stats.handoffs.fetch_add(1, Ordering::Relaxed);
            }
            let lock = Lock::new(
                shared.clone(),
                key,
                token,
                hold,
                opts.clone(),
                outcome.deadline,
                outcome.started,
                fence,
                plan.holder,
                stats.clone(),
                sending,
            );
            if opts.fencing && fence.is_none() {
                // A write re-entry of a write hold taken without fencing: it keeps that
                // grant's (no) fence. Given back (its own hold only) rather than handed out
                // without the fence asked for.
                let _ = lock.release().await;
                return Err(fenceless_reentry(lock.key()));
            }
            return Ok(lock);
        }
        // A failed attempt has been undone already (in the background where a node had not
        // answered).
        let tally = outcome.tally;
        let spoiled = outcome.spoiled;
        // A grant given back because its fence could not be raised: its busy hints say
        // "now", which would retry at once, in a loop, for as long as the cause lasts.
        let mut hint = match spoiled {
            Some(Spoiled::FenceFailed(_)) => None,
            _ => wake_hint(&tally, &outcome.hints, |i| {
                shared.cluster.nodes[i].guard_left(key)
            }),
        };
        // A migrating slot never ends the acquire (`redis_error` passes it): soon again.
        if tally.migrating() {
            let soon = migrating_retry(migrating_streak);
            migrating_streak += 1;
            hint = Some(hint.map_or(soon, |h| h.min(soon)));
        } else {
            migrating_streak = 0;
        }
        let no_ttl = without_ttl(&outcome.hints);
        // After the attempt, only wake-ups from nodes that did not grant it count (see
        // `WakeSources`).
        let not_granted = match outcome.late {
            Some(late) => WakeSources::settling(late),
            None => WakeSources::fixed(tally.answers.iter().map(wakes_us).collect()),
        };

        if let Some(Spoiled::FenceError(i, e)) = &spoiled {
            return Err(node_error(
                ErrorKind::Redis,
                &format!("lock {key:?}: fence raise failed", key = Shown(key)),
                &shared.cluster.nodes[*i],
                e,
            ));
        }
        if let Some((i, e)) = tally.redis_error() {
            return Err(match e {
                NodeError::Refused(r, _) => r.error(&format!("lock {key:?}", key = Shown(key))),
                _ => node_error(
                    ErrorKind::Redis,
                    &format!("lock {key:?}: acquire failed", key = Shown(key)),
                    &shared.cluster.nodes[i],
                    e,
                ),
            });
        }
        unreachable_streak = if tally.quorum_unreachable() {
            unreachable_streak + 1
        } else {
            0
        };
        let now = Instant::now();
        let out_of_time = give_up_at.is_some_and(|end| now >= end);
        if unreachable_streak >= UNREACHABLE_ATTEMPTS || (out_of_time && unreachable_streak > 0) {
            return Err(unreachable_error(shared, key, &tally));
        }
        if plan.reentry && tally.no() > n - shared.cluster.quorum {
            // Our field is gone from too many nodes: the outer acquisition was lost.
            // Acquire afresh, at once, under a new owner id.
            stale = plan.holder.map(|h| h.owner_id);
            if !out_of_time {
                continue;
            }
        }
        if out_of_time {
            return Err(not_acquired_error(
                shared,
                key,
                opts,
                &tally,
                spoiled.as_ref(),
                no_ttl,
            ));
        }

        // Wait for a wake-up. The first time: join the key's local queue, which subscribes
        // the release channel; the turn of a new head comes with the confirmation.
        waited = true;
        if ticket.is_none() {
            let hook = shared
                .waiters
                .hook
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            if let Some(hook) = hook {
                hook(key).await;
            }
            // The release channel is named only here: a first try on a free key never needs it.
            ticket = Some(shared.waiters.join(
                key,
                &channel_of(key, opts),
                Kind::of(opts).queue_role(),
            ));
        }
        let Some(t) = ticket.as_mut() else {
            unreachable!("joined above")
        };
        let (seen, mut from) = match seen {
            Some(s) => (s, not_granted),
            None => {
                let turn = tokio::select! {
                    turn = t.my_turn() => turn,
                    _ = until(give_up_at) => {
                        return Err(not_acquired_error(shared, key, opts, &tally, spoiled.as_ref(), no_ttl));
                    }
                };
                if turn.attempt_now {
                    continue;
                }
                if let Some(lapses) = turn.lapses {
                    // The lock is ours (the previous head's): our last busy answer's hint was
                    // another holder's. Ours publishes nothing if it lapses; a waiter in another
                    // process re-checks then, at the PTTL its busy answer gave.
                    hint = Some(lapses.saturating_duration_since(Instant::now()));
                }
                // A new head (or a new queue, whose subscription is confirmed on every
                // node at once): no attempt of its own has seen the lock since.
                (turn.seen, WakeSources::all(n))
            }
        };
        let mut pause = jitter(opts.retry_delay);
        if let Some(h) = hint {
            pause = pause.min(h);
        }
        if let Some(end) = give_up_at {
            pause = pause.min(end.saturating_duration_since(Instant::now()));
        }
        tokio::select! {
            _ = t.woken_since(&seen, &mut from) => {}
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

pub(super) async fn until(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// `base` ± 50 %, so contenders that failed together do not retry together.
pub(crate) fn jitter(base: Duration) -> Duration {
    let r = getrandom::u64().unwrap_or(0);
    let fraction = (r >> 11) as f64 / (1u64 << 53) as f64; // uniform in [0, 1)
    base.mul_f64(0.5 + fraction)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_half_either_side() {
        for _ in 0..1000 {
            let j = jitter(Duration::from_millis(100));
            assert!(
                j >= Duration::from_millis(50) && j < Duration::from_millis(150),
                "{j:?}"
            );
        }
    }
}
