//! The semaphore's acquire (issue 33; DESIGN.md, "Semaphore"): `count` permits of a pool of
//! `permits` on Redisson's RPermitExpirableSemaphore layout, on one node. The hold is a `Lock`
//! of kind `Permits` (its token is its permit ids in hex), so it is renewed by the watchdog's
//! batches, signals a loss and is released by the lock's machinery; only the acquire loop is
//! the semaphore's own: its script answers the earliest lease end instead of a busy hint.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::Shown;
use crate::error::{Error, ErrorKind, Result};
use crate::lock::Lock;
use crate::node::{NodeError, latch_px_ms, node_error};
use crate::options::{LockOptions, Permits};
use crate::queue::{QueueArgs, Role, Ticket, WakeSources, barge_bound_ms};
use crate::scripts::{Latch, Place, SemaphoreAcquire, SemaphoreRelease, semaphore_channel};
use crate::shared::Shared;
use crate::token::random_hex;

/// What one attempt answered.
enum Answer {
    Granted,
    /// Refused; the earliest lease end held, in server milliseconds (-1: none; `HELD_AS_LOCK`).
    Refused(i64),
    /// Granted, but answered after the validity it would have had (a stalled client): not a
    /// grant, and the permits went back, as a lock's late grant is undone.
    TooLate,
}

/// The script's re-check time when the name holds a lock's token, not a pool.
const HELD_AS_LOCK: i64 = -2;

pub(crate) async fn acquire(
    shared: &Arc<Shared>,
    name: &str,
    permits: u32,
    count: u32,
    opts: &LockOptions,
) -> Result<Lock> {
    check(shared, name, permits, count, opts)?;
    shared.cluster.cover_lease(opts.ttl);
    let mut opts = opts.clone();
    opts.permits = Some(Permits { permits, count });
    let stats = crate::metrics::stats(name, crate::acquire::Kind::Permits.metric_label());
    let counting = stats.counting();
    let result = acquire_loop(shared, name, &opts, &stats).await;
    counting.ended(&result, opts.first_try);
    result
}

/// The most permits one holder may take at once: each is a 32-character id in the acquire
/// and release calls and in the token, which `ferrolock run` hands its job in an environment
/// variable (Linux caps one at 128 KiB). The pool itself may be as large as a `u32`.
pub const MAX_COUNT: u32 = 1000;

fn check(shared: &Shared, name: &str, permits: u32, count: u32, opts: &LockOptions) -> Result<()> {
    let n = shared.cluster.nodes.len();
    if n > 1 {
        // DESIGN.md, "Semaphore": K permits on each of N nodes do not bound the holders to K
        // (N = 3, K = 2: quorums {1,2}, {2,3}, {1,3} hold at once).
        return Err(Error::invalid(format!(
            "semaphore {name:?}: the manager has {n} nodes, but a semaphore lives on one node \
             (or one Redis Cluster): with a quorum over independent nodes, K permits per node \
             do not bound the holders to K (3 nodes, 2 permits: 3 holders on nodes {{1,2}}, \
             {{2,3}}, {{1,3}})",
            name = Shown(name)
        )));
    }
    check_request(name, permits, count, opts)
}

/// What a semaphore acquire refuses before it sends anything, whatever its nodes
/// (`crate::check_request` for a `Permits` kind).
pub(crate) fn check_request(
    name: &str,
    permits: u32,
    count: u32,
    opts: &LockOptions,
) -> Result<()> {
    if name.is_empty() {
        return Err(Error::invalid("semaphore name must not be empty"));
    }
    // The scripts keep the permit ids in `{name}:timeout` (and publish on `redisson_sc:{name}`),
    // Redisson's names for a name without braces. A `}` alone: Redisson's names are the same,
    // but their tag (`user` for `user}1`) is not the counter's slot (hashed whole). A `{`:
    // Redisson adds no braces (`suffixName`: `jobs{1}:timeout`), so a Redisson holder's ids
    // would be where ours are not (the error once said Redisson's zset was `{name}:timeout`).
    if name.contains('{') {
        return Err(Error::invalid(format!(
            "semaphore name {name:?} contains '{{': Redisson keeps such a name's permit ids \
             in `{name}:timeout`, not in `{{name}}:timeout` where ferrolock keeps them (neither \
             would see the other's holders)",
            name = Shown(name)
        )));
    }
    if name.contains('}') {
        return Err(Error::invalid(format!(
            "semaphore name {name:?} contains '}}': Redisson's timeout zset \
             `{{name}}:timeout` would not share the counter's Redis Cluster slot",
            name = Shown(name)
        )));
    }
    if permits == 0 || count == 0 || count > permits {
        return Err(Error::invalid(format!(
            "semaphore {name:?}: count {count} of permits {permits}: both must be at least 1 \
             and count at most permits",
            name = Shown(name)
        )));
    }
    if count > MAX_COUNT {
        return Err(Error::invalid(format!(
            "semaphore {name:?}: count {count} is above {MAX_COUNT}, the most one holder may \
             take: each permit held is an id in the server's script call and in the lock's \
             token",
            name = Shown(name)
        )));
    }
    if opts.fencing {
        return Err(Error::invalid(format!(
            "semaphore {name:?}: fencing is on, but permit holders hold together, so a fence \
             would order nothing; turn fencing off",
            name = Shown(name)
        )));
    }
    opts.validate().map_err(|e| e.about("semaphore", name))?;
    // The hold is renewed by the watchdog like a lock's: a lease it cannot keep is refused
    // alike (before, such a grant came back already lost).
    crate::lock::check_lease(opts, || {
        format!("for semaphore {name:?}", name = Shown(name))
    })
}

async fn acquire_loop(
    shared: &Arc<Shared>,
    name: &str,
    opts: &LockOptions,
    stats: &Arc<crate::metrics::Stats>,
) -> Result<Lock> {
    let give_up_at = opts.wait.map(|w| Instant::now() + w);
    let channel = semaphore_channel(name);
    // Joined at the first refusal: subscribed to `redisson_sc:{name}`, whose publishes (a
    // release, a reclaim) move its epoch.
    let mut ticket: Option<Ticket> = None;
    let mut migrating_streak = 0;
    // Attempts in a row the node did not answer: as a lock's acquire, one whose wait is
    // unbounded gives up after `UNREACHABLE_ATTEMPTS` of them (before, it retried for ever).
    let mut unreachable_streak = 0;
    // Whether the next attempt may wake the queue head (a refusal on permits free for it):
    // not when a publish woke us, which woke the head too (each refusal would otherwise wake
    // every waiter again, our own process included, for as long as the head does not come).
    let mut may_wake = true;
    loop {
        let seen = ticket.as_ref().map(Ticket::epochs);
        stats.attempts.fetch_add(1, Ordering::Relaxed);
        let ids: String = (0..opts.permits.map_or(1, |p| p.count))
            .map(|_| random_hex())
            .collect();
        let started = Instant::now();
        // Queued once joined: our place in the server queue, where waiters take turns.
        let place = ticket
            .as_ref()
            .zip(seen.as_ref())
            .map(|(t, seen)| t.queue_args(opts, seen));
        // `failed`: the node's error when the attempt got no answer it could use; a wait that
        // ends so names the node and why, as a lock's does, instead of calling the pool taken.
        let deadline = started + opts.ttl - opts.drift();
        let answer = attempt(shared, name, &ids, place.as_ref(), may_wake, opts, deadline).await;
        may_wake = true;
        let soon = crate::acquire::migrating_retry(migrating_streak);
        migrating_streak = match answer {
            Err(NodeError::Migrating(_)) => migrating_streak + 1,
            _ => 0,
        };
        let (hint, failed, held_as_lock, too_late) = match answer {
            Ok(Answer::Granted) => {
                if let Some(t) = ticket.as_mut() {
                    t.granted(true, None, false);
                    stats.handoffs.fetch_add(1, Ordering::Relaxed);
                }
                return Ok(Lock::new(
                    shared.clone(),
                    name.to_string(),
                    ids,
                    String::new(),
                    opts.clone(),
                    deadline,
                    started,
                    None,
                    None,
                    stats.clone(),
                    None,
                ));
            }
            Ok(Answer::Refused(earliest)) => (
                lease_end_in(shared, opts, earliest).await,
                None,
                earliest == HELD_AS_LOCK,
                false,
            ),
            // At once again: the pool had room.
            Ok(Answer::TooLate) => (Some(Duration::ZERO), None, false, true),
            Err(NodeError::Refused(r, _)) => {
                return Err(r.error(&format!("semaphore {name:?}", name = Shown(name))));
            }
            // A migrating slot (nothing ran) never ends the acquire: soon again, as a
            // lock's does.
            Err(e @ NodeError::Migrating(_)) => (Some(soon), Some(e), false, false),
            Err(e) if e.is_reply() => {
                return Err(node_error(
                    ErrorKind::Redis,
                    &format!("semaphore {name:?}", name = Shown(name)),
                    &shared.cluster.nodes[0],
                    &e,
                ));
            }
            // Held back by the restart guard: its window's end publishes nothing.
            Err(e @ NodeError::Guarded(_)) => (
                Some(shared.cluster.nodes[0].guard_left(name).unwrap_or_default()),
                Some(e),
                false,
                false,
            ),
            Err(e) => (None, Some(e), false, false),
        };
        unreachable_streak = match &failed {
            Some(e) if e.is_unreachable() => unreachable_streak + 1,
            _ => 0,
        };
        let now = Instant::now();
        let out_of_time = give_up_at.is_some_and(|end| now >= end);
        if out_of_time || unreachable_streak >= crate::acquire::UNREACHABLE_ATTEMPTS {
            // Worded as a lock's give-up is. Given up on the unanswered attempts before the
            // wait ended, it says so (it said "within wait=600s" a second after the call).
            let waited = if out_of_time || opts.wait.is_none_or(|w| w.is_zero()) {
                crate::acquire::give_up::waited(opts.wait)
            } else {
                format!(
                    "after {} attempts in a row",
                    crate::acquire::UNREACHABLE_ATTEMPTS
                )
            };
            let what = format!(
                "semaphore {name:?}: {} permit(s) not acquired {waited}",
                opts.permits.map_or(1, |p| p.count),
                name = Shown(name)
            );
            let node = shared.cluster.nodes[0].name();
            return Err(match &failed {
                Some(e) if e.is_unreachable() => Error::new(
                    ErrorKind::QuorumUnreachable,
                    format!("{what}: node {node} did not answer ({})", e.detail()),
                ),
                // Held back by the restart guard, or a migrating slot: the node is there, its
                // answer did not count (worded as a lock's "failed: node (why)").
                Some(e) => Error::new(
                    ErrorKind::NotAcquired,
                    format!("{what}: failed: {node} ({})", e.detail()),
                ),
                None if too_late => Error::new(
                    ErrorKind::NotAcquired,
                    format!(
                        "{what}: granted, but the acquire took too long: less than its loss \
                         margin ({:?}, twice the node timeout) was left of the validity (ttl \
                         {:?} minus drift {:?}), so the permits were given back",
                        crate::lock::loss_margin(opts, opts.ttl),
                        opts.ttl,
                        opts.drift()
                    ),
                ),
                None if held_as_lock => Error::new(
                    ErrorKind::NotAcquired,
                    format!("{what}: the name is held as a lock, not a semaphore"),
                ),
                // The script's refusal does not say whether the permits were held or free
                // but promised to a queued waiter: both, as a lock's refusal words it.
                None => Error::new(
                    ErrorKind::NotAcquired,
                    format!(
                        "{what}: the pool is taken (or its free permits are promised to \
                         earlier waiters in the queue)"
                    ),
                ),
            });
        }
        if ticket.is_none() {
            // Joined after a refusal: an attempt right away sees a release published
            // before the subscription was confirmed (its confirmation moves the epoch).
            // Queued apart by count: the script reads each waiter's count from its id.
            let count = opts.permits.map_or(1, |p| p.count);
            ticket = Some(shared.waiters.join(name, &channel, Role::Permits(count)));
            continue;
        }
        // Re-check at the earliest lease end the script answered (a lease that ends
        // publishes nothing), and at the latest after the retry delay (jittered, as a lock
        // waiter's): our place in the server queue lasts a few retry delays
        // (`queue::lease`) unless an attempt renews it. Asleep until a lease end a ttl away,
        // a waiter lost its place after about a second, and a first try or a later waiter
        // took the permits ahead of it (found by a review). A publish on the channel wakes
        // us first.
        let pause = crate::acquire::jitter(opts.retry_delay);
        let mut at = now + hint.map_or(pause, |h| h.min(pause));
        if let Some(end) = give_up_at {
            at = at.min(end);
        }
        let (Some(t), Some(seen)) = (ticket.as_ref(), seen.as_ref()) else {
            continue;
        };
        let mut from = WakeSources::all(1);
        tokio::select! {
            _ = t.woken_since(seen, &mut from) => may_wake = false,
            _ = tokio::time::sleep_until(at) => {}
        }
    }
}

/// One attempt. Its script runs in a task of its own, so that an acquire dropped while it is
/// in flight (cancelled, closed, exited) leaves it to finish and gives back what it granted
/// (`GiveBack`) instead of leaving the permits taken until their lease ends.
async fn attempt(
    shared: &Arc<Shared>,
    name: &str,
    ids: &str,
    place: Option<&QueueArgs>,
    may_wake: bool,
    opts: &LockOptions,
    deadline: Instant,
) -> std::result::Result<Answer, NodeError> {
    let Permits { permits, count } = opts.permits.unwrap_or(Permits {
        permits: 1,
        count: 1,
    });
    let timeout = opts.effective_node_timeout();
    let lease_ms = opts.ttl_millis();
    let (waiter, queue_lease_ms) = place.map_or((String::new(), 0), |q| (q.id.clone(), q.lease_ms));
    let bound_ms = barge_bound_ms(1);
    // On a cluster with the restart guard on, a slot that failed over or whose primary
    // restarted within the window gets no request, as a lock's key does (`acquire/ask.rs`).
    let node = &shared.cluster.nodes[0];
    node.slot_guarded(name)?;
    let request = {
        let (shared, name, ids) = (shared.clone(), name.to_string(), ids.to_string());
        // One call id for every re-send of this attempt: the latch keeps a grant's reply.
        let call = random_hex();
        shared.cluster.handle().spawn(async move {
            if let Some(hook) =
                crate::hooks::off_thread(crate::hooks::Point::SemaphoreSending, &name)
            {
                let _ = hook.await;
            }
            let (name, ids, call) = (name.as_str(), ids.as_str(), call.as_str());
            let waiter = waiter.as_str();
            shared.cluster.nodes[0]
                .run(timeout, true, move |mut conn| async move {
                    let acquire = SemaphoreAcquire {
                        name,
                        permits,
                        count,
                        lease_ms,
                        ids,
                        latch: Latch {
                            id: call,
                            px_ms: latch_px_ms(timeout),
                        },
                        place: Place {
                            id: waiter,
                            score: "",
                            lease_ms: queue_lease_ms,
                        },
                        bound_ms,
                        wake: may_wake,
                    };
                    acquire
                        .invocation(conn.sharded())
                        .invoke_async(&mut conn)
                        .await
                })
                .await
        })
    };
    let mut pending = GiveBack {
        shared: shared.clone(),
        name: name.to_string(),
        ids: ids.to_string(),
        place,
        timeout,
        request: Some(request),
        unclaimed: false,
    };
    let reply = match pending.request.as_mut() {
        Some(request) => request.await,
        None => return Err(NodeError::Unreachable("no attempt was sent".into())),
    };
    pending.request = None;
    let reply = reply
        .map_err(|e| NodeError::Unreachable(format!("the attempt's task ended: {e}")))
        .and_then(|r| r);
    if let Err(e) = &reply
        && !matches!(e, NodeError::Refused(..))
    {
        // No answer (a timeout, or the re-sends ran out), or an error reply, which may be a
        // re-send's after the first send ran: the script may have taken these ids' permits.
        // The next attempt draws new ids, so these go back now instead of staying taken
        // until their lease ends (a give-back of ids never taken returns nothing).
        pending.give_back();
    }
    let (granted, at) = reply?;
    // Until the caller has it, a grant dropped (a cancel during the primary check below) goes
    // back: no `Lock` exists yet to release or renew it (found by a review).
    pending.unclaimed = granted == 1;
    if granted == 1 && node.guards_slots() {
        // A grant counts only once the primary that made it is known not to be one that has
        // just taken the slot over (it may have lost the pool's writes): held back, it goes
        // back at once. A refusal took nothing, so it needs no probe.
        if let Some(hook) = crate::hooks::off_thread(crate::hooks::Point::SemaphoreConfirming, name)
        {
            let _ = hook.await;
        }
        let deadline = Instant::now() + timeout;
        if let Err(e) = Box::pin(node.confirm_primary(name, deadline, timeout)).await {
            pending.unclaimed = false;
            pending.give_back();
            return Err(e);
        }
    }
    if granted == 1 && Instant::now() >= crate::lock::grant_cutoff(opts, deadline) {
        pending.unclaimed = false;
        pending.give_back_now().await;
        return Ok(Answer::TooLate);
    }
    pending.unclaimed = false;
    Ok(if granted == 1 {
        Answer::Granted
    } else {
        Answer::Refused(at)
    })
}

/// An attempt's script still in flight when the acquire is dropped: a task waits for it and
/// then returns the attempt's ids with `semaphore_release.lua`, which is safe whether the
/// acquire granted them, refused, or never ran (it returns only ids in the zset, and a re-send
/// finds them gone). Counted in `runtime::settled`, and collected by a cancelled host acquire,
/// which reports once the permits are back. The attempt's queue place goes with its `Ticket`,
/// and again here once the attempt answered (`Waiters::dequeue_if_abandoned`).
struct GiveBack<'a> {
    shared: Arc<Shared>,
    name: String,
    ids: String,
    /// The queue place the attempt carried (cloned only for a task that needs it).
    place: Option<&'a QueueArgs>,
    timeout: Duration,
    request: Option<JoinHandle<std::result::Result<(i64, i64), NodeError>>>,
    /// A grant answered and not yet handed to the caller: dropped now, its ids go back.
    unclaimed: bool,
}

impl GiveBack<'_> {
    /// Returns the attempt's ids now, its request having ended with no answer.
    fn give_back(&self) {
        self.spawn_release(None);
    }

    /// Returns the ids of a grant that came too late before its caller hears of it (as a
    /// lock's late grant is undone first), so its next attempt cannot meet them. Dropped
    /// part-way (a cancelled acquire), it sends them again in a task the cancel collects
    /// (`give_back`): a second return of the same ids finds them gone and takes nothing.
    async fn give_back_now(&self) {
        struct Unfinished<'a, 'b>(&'a GiveBack<'b>, bool);
        impl Drop for Unfinished<'_, '_> {
            fn drop(&mut self) {
                if !self.1 {
                    self.0.give_back();
                }
            }
        }
        let mut unfinished = Unfinished(self, false);
        return_ids(&self.shared, &self.name, &self.ids, self.timeout).await;
        unfinished.1 = true;
    }

    /// A task that waits for `request` (if any) and then returns the attempt's ids.
    fn spawn_release(
        &self,
        request: Option<JoinHandle<std::result::Result<(i64, i64), NodeError>>>,
    ) {
        let (shared, name, ids) = (self.shared.clone(), self.name.clone(), self.ids.clone());
        let place = request.as_ref().and(self.place).cloned();
        let timeout = self.timeout;
        let pending = crate::runtime::Pending::start();
        crate::runtime::started_cleanup(self.shared.cluster.handle().spawn(async move {
            let _pending = pending;
            if let Some(request) = request {
                let reply = request.await;
                if let Some(place) = &place {
                    shared.waiters.dequeue_if_abandoned(&name, place).await;
                }
                // Refused or failed before it ran: nothing was taken (a failure after it ran
                // is covered by the release below, which returns only ids still held).
                if let Ok(Ok((0, _))) = reply {
                    return;
                }
            }
            return_ids(&shared, &name, &ids, timeout).await;
        }));
    }
}

/// `semaphore_release.lua` for `ids`: returns only those still held, so it is safe whether
/// they were granted, refused or never ran.
async fn return_ids(shared: &Shared, name: &str, ids: &str, timeout: Duration) {
    let call = random_hex();
    let call = call.as_str();
    // Not a vote, as no release is: a node the restart guard holds back (it may have
    // restarted after granting these ids, with its data) still gets it, instead of
    // keeping the permits taken until their lease ends.
    let _ = shared.cluster.nodes[0]
        .run(timeout, false, move |mut conn| async move {
            let release = SemaphoreRelease {
                name,
                ids,
                latch: Latch {
                    id: call,
                    px_ms: latch_px_ms(timeout),
                },
            };
            release
                .invocation(conn.sharded())
                .invoke_async::<i64>(&mut conn)
                .await
        })
        .await;
}

impl Drop for GiveBack<'_> {
    fn drop(&mut self) {
        if let Some(request) = self.request.take() {
            self.spawn_release(Some(request));
        } else if self.unclaimed {
            self.give_back();
        }
    }
}

/// How long until the earliest lease end `earliest` (server milliseconds), by the server's
/// TIME; None when no lease is held (-1), the name holds a lock (`HELD_AS_LOCK`) or TIME
/// failed.
async fn lease_end_in(shared: &Shared, opts: &LockOptions, earliest: i64) -> Option<Duration> {
    if earliest < 0 {
        return None;
    }
    let (secs, micros): (i64, i64) = shared.cluster.nodes[0]
        .run(
            opts.effective_node_timeout(),
            false,
            |mut conn| async move { redis::cmd("TIME").query_async(&mut conn).await },
        )
        .await
        .ok()?;
    let now_ms = secs * 1000 + micros / 1000;
    // One millisecond past it: the script reclaims ids whose score is at most its now.
    Some(Duration::from_millis((earliest - now_ms).max(0) as u64 + 1))
}
