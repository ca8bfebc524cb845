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

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::Value;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::{Error, ErrorKind, Result};
use crate::lock::Lock;
use crate::node::{Node, NodeError, latch_px_ms, node_error, timed_out};
use crate::options::LockOptions;
use crate::owner::{Holder, new_owner_id};
use crate::queue::{QueueArgs, Ticket, WakeSources, Woken, barge_bound_ms, quiet_grace_ms};
use crate::quorum::{Answer, FanOut, Tally, fan_out, yes_if};
use crate::scripts::{
    Acquire, AcquireReentrant, KeyNames, Latch, RaiseFence, Undo, command, redisson_channel,
    waiter_channel_prefix,
};
use crate::shared::Shared;
use crate::token::{new_token, random_hex};

/// After this many attempts in a row that found a majority of nodes unreachable, acquire
/// gives up with `QuorumUnreachable` instead of waiting out its budget: a dead cluster should
/// answer in well under a second, not block forever.
const UNREACHABLE_ATTEMPTS: u32 = 3;

/// After an attempt that met a migrating slot (MOVED, ASK or TRYAGAIN past redis-rs's own
/// retries: nothing ran), the next one comes this soon, doubled each time in a row up to
/// `MIGRATING_RETRY_MAX`: the window closes by itself, usually well within a retry delay.
const MIGRATING_RETRY: Duration = Duration::from_millis(50);
const MIGRATING_RETRY_MAX: Duration = Duration::from_secs(1);

/// Who this attempt acquires as.
struct Plan {
    /// The value at the key (plain), or the hash field `"<client uuid>:<owner id>"`.
    token: String,
    holder: Option<Holder>,
    /// A re-entry of a live acquisition by the same owner: bypasses the queue, keeps the
    /// outer grant's fence, and never creates a new grant.
    reentry: bool,
    fence: Option<u64>,
}

/// The acquire loop behind `LockManager::acquire_with` (`owner: None`) and `acquire_owned`.
pub(crate) async fn acquire(
    shared: &Arc<Shared>,
    key: &str,
    owner: Option<u64>,
    opts: &LockOptions,
) -> Result<Lock> {
    check_key(key)?;
    if opts.reentrant {
        check_redisson_channel(shared, key)?;
    }
    opts.validate()?;
    crate::lock::check_lease(opts, || format!("for lock {key:?}"))?;
    let stats = crate::metrics::stats(key);
    let started = Instant::now();
    let result = acquire_loop(shared, key, owner, opts, &stats).await;
    match &result {
        Ok(_) => {
            stats.grants.fetch_add(1, Ordering::Relaxed);
            stats.wait.observe(started.elapsed());
        }
        Err(e) => stats.failed(e.kind().code()),
    }
    result
}

async fn acquire_loop(
    shared: &Arc<Shared>,
    key: &str,
    owner: Option<u64>,
    opts: &LockOptions,
    stats: &Arc<crate::metrics::Stats>,
) -> Result<Lock> {
    let n = shared.cluster.nodes.len();
    let started = Instant::now();
    let give_up_at = opts.wait.map(|w| started + w);
    let mut unreachable_streak = 0;
    let mut migrating_streak = 0;
    let mut ticket: Option<Ticket> = None;
    // An owner id whose re-entry found our field gone: that acquisition was lost.
    let mut stale: Option<u64> = None;
    // Whether the first attempt found us looping on the key (see `Contention::looping`).
    let mut first_looping: Option<bool> = None;
    loop {
        // Waited on this key a moment ago (its queue still lingers, subscribed): join before
        // the first attempt, so that it queues and a release tells us.
        if ticket.is_none() && opts.wait != Some(Duration::ZERO) && shared.waiters.any() {
            let channel = channel_of(key, opts);
            if shared.waiters.lingering(&channel) {
                ticket = Some(shared.waiters.join(key, &channel));
            }
        }
        let plan = plan(shared, key, owner, opts, stale);
        // Only the head of the local queue carries our queue id; first attempts and
        // re-entries go straight to Redis without queueing.
        let head = ticket.as_ref().filter(|t| t.is_head());
        let seen = head.map(Ticket::epochs);
        let queue = head
            .zip(seen.as_ref())
            .filter(|_| !plan.reentry)
            .map(|(t, seen)| t.queue_args(opts, seen));

        let req = Req::new(shared, key, plan.token, opts, plan.reentry, queue);
        stats.attempts.fetch_add(1, Ordering::Relaxed);
        let (mut outcome, req) = run_attempt(shared, req).await?;
        let first_looping = *first_looping.get_or_insert(outcome.looping);
        if outcome.won {
            if let Some(claim) = outcome.claim.take() {
                claim.claim();
            }
            let fence = if plan.reentry {
                plan.fence
            } else {
                outcome.fence
            };
            if let Some(t) = ticket.as_mut() {
                t.granted(outcome.tally.yes() == n);
            }
            if let Some(h) = plan.holder {
                shared.owners.granted(key, h, fence);
            }
            if first_looping && n == 1 && !opts.reentrant {
                // A worker in a loop on this key: its release may be quiet (release.lua).
                shared.contention.mark_streak(key);
            }
            // The key and token move into the lock, unless requests still in flight
            // hold them.
            let (key, token) = match Arc::try_unwrap(req) {
                Ok(r) => (r.key, r.token),
                Err(r) => (r.key.clone(), r.token.clone()),
            };
            if ticket.is_some() {
                // Granted after waiting for a release.
                stats.handoffs.fetch_add(1, Ordering::Relaxed);
            }
            return Ok(Lock::new(
                shared.clone(),
                key,
                token,
                opts.clone(),
                outcome.deadline,
                outcome.started,
                fence,
                plan.holder,
                stats.clone(),
            ));
        }
        // A failed attempt has been undone already (in the background where a node had not
        // answered).
        let tally = outcome.tally;
        let spoiled = outcome.spoiled;
        // A grant given back because its fence could not be raised: its busy hints say
        // "now", which would retry at once, in a loop, for as long as the cause lasts.
        let mut hint = match spoiled {
            Some(Spoiled::FenceFailed(_)) => None,
            _ => wake_hint(&tally, &outcome.hints),
        };
        // A migrating slot never ends the acquire (`redis_error` passes it): soon again.
        if tally.migrating() {
            let soon =
                (MIGRATING_RETRY * 2u32.pow(migrating_streak.min(5))).min(MIGRATING_RETRY_MAX);
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
                &format!("lock {key:?}: fence raise failed"),
                &shared.cluster.nodes[*i],
                e,
            ));
        }
        if let Some((i, e)) = tally.redis_error() {
            return Err(node_error(
                ErrorKind::Redis,
                &format!("lock {key:?}: acquire failed"),
                &shared.cluster.nodes[i],
                e,
            ));
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
            ticket = Some(shared.waiters.join(key, &channel_of(key, opts)));
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

fn plan(
    shared: &Shared,
    key: &str,
    owner: Option<u64>,
    opts: &LockOptions,
    stale: Option<u64>,
) -> Plan {
    if !opts.reentrant {
        return Plan {
            token: new_token(),
            holder: None,
            reentry: false,
            fence: None,
        };
    }
    let owners = &shared.owners;
    if let Some(o) = owner
        && let Some((owner_id, fence)) = owners.lookup(key, o)
        && stale != Some(owner_id)
    {
        return Plan {
            token: owners.field(owner_id),
            holder: Some(Holder { owner, owner_id }),
            reentry: true,
            fence,
        };
    }
    let owner_id = new_owner_id();
    Plan {
        token: owners.field(owner_id),
        holder: Some(Holder { owner, owner_id }),
        reentry: false,
        fence: None,
    }
}

/// The key's release channel: the name of its local waiter queue.
fn channel_of(key: &str, opts: &LockOptions) -> String {
    crate::queue::queue_channel(key, opts.reentrant)
}

async fn until(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

fn unreachable_error(shared: &Shared, key: &str, tally: &Tally) -> Error {
    Error::new(
        ErrorKind::QuorumUnreachable,
        format!(
            "lock {key:?}: quorum unreachable: {} of {} nodes did not answer (need {}): {}",
            tally.unreachable(),
            tally.answers.len(),
            tally.quorum,
            tally.describe_failures(&shared.cluster.nodes)
        ),
    )
}

fn not_acquired_error(
    shared: &Shared,
    key: &str,
    opts: &LockOptions,
    tally: &Tally,
    spoiled: Option<&Spoiled>,
    no_ttl: usize,
) -> Error {
    let waited = match opts.wait {
        Some(w) if w.is_zero() => "on the first try (wait=0)".to_string(),
        Some(w) => format!("within wait={w:?}"),
        None => "before giving up".to_string(),
    };
    let why = match spoiled {
        Some(Spoiled::TooLate) => format!(
            "a quorum granted it but the acquire took longer than the validity (ttl {:?} minus drift {:?}), so it was released",
            opts.ttl,
            opts.drift()
        ),
        Some(Spoiled::FenceFailed(detail)) => format!(
            "a quorum granted it but its fencing token could not be raised on a quorum ({detail}), so it was released"
        ),
        Some(Spoiled::FenceError(i, e)) => format!(
            "a quorum granted it but raising its fencing token failed on {}: {}, so it was released",
            shared.cluster.nodes[*i].name(),
            e.detail()
        ),
        None if no_ttl > 0 => format!(
            "held by another owner on {} of {} nodes, with no TTL on {no_ttl} of them: a lock \
             that will never expire (leaked?); `ferrolock scan` lists such keys",
            tally.no(),
            tally.answers.len()
        ),
        None => format!(
            "held by another owner (or promised to an earlier waiter in the queue) on {} of {} nodes",
            tally.no(),
            tally.answers.len()
        ),
    };
    let failures = tally.describe_failures(&shared.cluster.nodes);
    let tail = if failures.is_empty() {
        String::new()
    } else {
        format!("; failed: {failures}")
    };
    Error::new(
        ErrorKind::NotAcquired,
        format!("lock {key:?} not acquired {waited}: {why}{tail}"),
    )
}

pub(crate) fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::invalid("lock key must not be empty"));
    }
    // The queue, fence and channel names must hash to the key's Cluster slot (every script
    // touches one slot); for this key no name can (see `scripts::has_slot_tag`).
    if !crate::scripts::has_slot_tag(key) {
        return Err(Error::invalid(format!(
            "lock key {key:?} has no hash tag and contains '}}', so no name derived from it can \
             share its Redis Cluster slot: give it a hash tag (a non-empty {{...}}) or drop the '}}'"
        )));
    }
    Ok(())
}

/// A reentrant lock's release publishes on Redisson's channel, which keeps Redisson's own
/// name byte for byte: for a key with a `{` that starts no valid hash tag it is in another
/// slot than the key. On a cluster with sharded pub/sub the release script's SPUBLISH runs
/// on the key's primary, while the channel's subscribers listen on its own slot's primary
/// (and Redis refuses the script's access when that is another node, after the DEL).
fn check_redisson_channel(shared: &Shared, key: &str) -> Result<()> {
    // Without a `{`, Redisson's channel wraps the key in braces: always the key's slot.
    if !key.contains('{') || !shared.cluster.nodes.iter().any(|n| n.may_shard()) {
        return Ok(());
    }
    let channel = crate::scripts::redisson_channel(key);
    let (slot, channel_slot) = (
        crate::node_cluster::key_slot(key),
        crate::node_cluster::key_slot(&channel),
    );
    if slot == channel_slot {
        return Ok(());
    }
    Err(Error::invalid(format!(
        "reentrant lock key {key:?} cannot be used on a Redis Cluster with sharded pub/sub: \
         Redisson's release channel {channel:?} hashes to slot {channel_slot}, not the key's slot \
         {slot} (a `{{` that starts no hash tag); give the key a hash tag (a non-empty {{...}}), \
         or set sharded_pubsub off"
    )))
}

/// `base` ± 50 %, so contenders that failed together do not retry together.
pub(crate) fn jitter(base: Duration) -> Duration {
    let r = getrandom::u64().unwrap_or(0);
    let fraction = (r >> 11) as f64 / (1u64 << 53) as f64; // uniform in [0, 1)
    base.mul_f64(0.5 + fraction)
}

/// When a re-check is first worth it: the time after which a quorum of nodes could grant,
/// from each node's answer (a grant: now; busy: the PTTL or queue lease it returned; no
/// answer, or a key without TTL: unknown).
/// A busy answer with no re-check hint (a failed plain SET NX on a key with a TTL).
const NO_HINT: i64 = -3;

/// How many nodes answered busy for a holder with no TTL (a leaked lock).
fn without_ttl(hints: &[Option<i64>]) -> usize {
    hints.iter().filter(|h| **h == Some(-1)).count()
}

fn wake_hint(tally: &Tally, hints: &[Option<i64>]) -> Option<Duration> {
    let mut at: Vec<u64> = tally
        .answers
        .iter()
        .zip(hints)
        .map(|(a, h)| match a {
            Answer::Yes(_) => 0,
            Answer::No => h.filter(|&h| h >= 0).map_or(u64::MAX, |h| h as u64),
            _ => u64::MAX,
        })
        .collect();
    at.sort_unstable();
    let ms = *at.get(tally.quorum.checked_sub(1)?)?;
    (ms != u64::MAX).then(|| Duration::from_millis(ms + 1))
}

/// What every node's request of one attempt needs, owned, so that requests still in flight
/// once the outcome is decided can be handed to a task (see `InFlight`).
struct Req {
    key: String,
    /// The value at the key (plain), or the hash field (reentrant).
    token: String,
    opts: LockOptions,
    reentry: bool,
    queue: Option<QueueArgs>,
    /// Nobody known to be waiting: a plain SET NX PX, the cheapest grant there is (and no
    /// queue or fence key names to build for it).
    plain_set: bool,
    /// Our last release of this key was quiet (see release.lua).
    quiet: bool,
    /// A manager that released the key a moment before (see `Contention::looping`).
    looping: bool,
    fence_mode: &'static str,
    /// Fence, queue, queue leases, queue join times: empty for a plain SET.
    names: KeyNames,
    /// Plain locks with a queue: where the script tells the next waiter that the lock is free.
    wake_prefix: String,
    /// Filled (one slot per node) only when a node answers busy: a grant allocates nothing.
    hints: Mutex<Vec<Option<i64>>>,
    /// A re-entry's call id, for its latch (see `scripts::Latch`); empty otherwise.
    call: String,
}

impl Req {
    fn new(
        shared: &Shared,
        key: &str,
        token: String,
        opts: &LockOptions,
        reentry: bool,
        queue: Option<QueueArgs>,
    ) -> Req {
        let fencing = opts.fencing && !reentry;
        // One node: INCR in the acquire script is the order. N nodes: read the counters of the
        // granting quorum, take max + 1, and raise a quorum's counters to it while they still
        // hold our grant. Any later grant's quorum shares a node with that raise quorum, and
        // that node grants again only after our grant is gone there, so it reads a counter >=
        // our fence. (The max over *different* quorums alone would not be monotonic.)
        let fence_mode = match (fencing, shared.cluster.nodes.len()) {
            (false, _) => "",
            (true, 1) => "1",
            (true, _) => "0",
        };
        let seen = shared.contention.contention(key);
        let plain_set = !opts.reentrant && !fencing && queue.is_none() && !seen.contended;
        let (names, wake_prefix) = if plain_set {
            Default::default()
        } else if opts.reentrant {
            (KeyNames::of(key), String::new())
        } else {
            (KeyNames::of(key), waiter_channel_prefix(key))
        };
        Req {
            key: key.to_string(),
            token,
            opts: opts.clone(),
            reentry,
            queue,
            plain_set,
            // Our last release of this key was quiet (N = 1): we may take it back within the
            // grace.
            quiet: seen.quiet,
            looping: seen.looping,
            fence_mode,
            names,
            wake_prefix,
            hints: Mutex::new(Vec::new()),
            call: if reentry { random_hex() } else { String::new() },
        }
    }

    fn fencing(&self) -> bool {
        self.opts.fencing && !self.reentry
    }
}

/// The result of one attempt, as decided. A lost one has been undone already on the nodes that
/// answered (the rest are undone in the background); a won one belongs to the caller, who
/// makes it a `Lock` at once (no await in between).
struct Outcome {
    won: bool,
    /// Sent through the waiter queue (not a plain `SET NX`) by a manager that released the key
    /// a moment before (see `Contention::looping`).
    looping: bool,
    tally: Tally,
    /// Per node: ms until a re-check is worth it, from a busy answer (-1: no TTL).
    hints: Vec<Option<i64>>,
    started: Instant,
    deadline: Instant,
    fence: Option<u64>,
    /// Why a grant on a quorum was not kept.
    spoiled: Option<Spoiled>,
    /// A won grant sent to a blocking caller through a channel: undone unless claimed.
    claim: Option<Claim>,
    /// A lost one with nodes that had not answered when it was decided: which nodes' wake-ups
    /// count, as their answers come in (see `undo_late`).
    late: Option<watch::Receiver<Vec<bool>>>,
}

/// Why a quorum's grant was given back.
pub(crate) enum Spoiled {
    /// Confirmed only after its validity had ended.
    TooLate,
    /// The fence could not be raised on a quorum: node `i` answered the raise with an error.
    FenceError(usize, NodeError),
    /// The fence could not be raised on a quorum (timeouts, or the grant was no longer ours
    /// there): the failures, described.
    FenceFailed(String),
}

/// A won attempt's grant on its way to a blocking caller (see `run_attempt`). The attempt's
/// task keeps driving the slower nodes' requests after it sent the outcome; whichever of the
/// task and this guard finishes second undoes the grant, unless the caller claimed it. So a
/// grant whose receiver is dropped before it was read (Ctrl-C between wait slices, the
/// exit-time close) is released, once every node has answered.
struct Claim {
    shared: Arc<Shared>,
    req: Arc<Req>,
    state: Arc<Mutex<ClaimState>>,
}

#[derive(Default)]
struct ClaimState {
    claimed: bool,
    /// The guard was dropped unclaimed before the task knew every node's answer: the task
    /// undoes.
    abandoned: bool,
    /// Set by the task once every node has answered: where the grant may be held.
    mask: Option<Vec<bool>>,
}

impl Claim {
    /// The caller turns the grant into a `Lock`.
    fn claim(self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).claimed = true;
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.claimed {
            return;
        }
        match st.mask.take() {
            None => st.abandoned = true,
            Some(mask) => {
                drop(st);
                let (shared, req) = (self.shared.clone(), self.req.clone());
                crate::runtime::spawn_cleanup(&self.shared.cluster.handle(), async move {
                    undo_detached(&shared, &req, mask, false).finish().await;
                });
            }
        }
    }
}

/// Requests that must each run exactly once: driven by their caller, and handed to a task
/// if the caller is dropped first (a request not yet written goes out from the task; one
/// written is not sent again). An undo of a re-entry decrements a hold count: sending it
/// twice would take a count from the outer grant.
struct Detached<R>
where
    R: Future<Output = (usize, Result<Option<i64>, NodeError>)> + Send + 'static,
{
    shared: Arc<Shared>,
    requests: Option<FanOut<R>>,
}

/// The undo of what `req` may hold on the nodes marked in `mask` (see `undo_one`).
fn undo_detached(
    shared: &Arc<Shared>,
    req: &Arc<Req>,
    mask: Vec<bool>,
    requeue: bool,
) -> Detached<impl Future<Output = (usize, Result<Option<i64>, NodeError>)> + Send + 'static> {
    let timeout = req.opts.effective_node_timeout();
    let requests = FanOut::start_owned(
        shared.cluster.nodes.len(),
        shared.cluster.quorum,
        timeout,
        {
            let (shared, req) = (shared.clone(), req.clone());
            move |i, deadline| {
                let (shared, req, wanted) = (shared.clone(), req.clone(), mask[i]);
                async move {
                    if !wanted {
                        return Ok(None);
                    }
                    undo_one(&shared, &req, i, deadline, requeue).await
                }
            }
        },
    );
    Detached {
        shared: shared.clone(),
        requests: Some(requests),
    }
}

impl<R> Detached<R>
where
    R: Future<Output = (usize, Result<Option<i64>, NodeError>)> + Send + 'static,
{
    async fn finish(mut self) {
        if let Some(requests) = self.requests.as_mut() {
            while requests.next().await {}
        }
        self.requests = None;
    }
}

impl<R> Drop for Detached<R>
where
    R: Future<Output = (usize, Result<Option<i64>, NodeError>)> + Send + 'static,
{
    fn drop(&mut self) {
        if let Some(mut requests) = self.requests.take()
            && !requests.all_answered()
        {
            crate::runtime::spawn_cleanup(&self.shared.cluster.handle(), async move {
                while requests.next().await {}
            });
        }
    }
}

/// Node `i`'s undo of what `req` may hold there (`undo.lua`): compare-and-delete, or one
/// decrement of our hold count (reentrant); with `requeue`, while this manager still waits for
/// the key, the same script puts our waiter id back in the server queue where the grant
/// dequeued it. Without it, compare-and-delete only: a re-enqueue arriving late (after this
/// process's next grant) would leave a stale head in the queue.
async fn undo_one(
    shared: &Shared,
    req: &Req,
    i: usize,
    deadline: Instant,
    requeue: bool,
) -> Result<Option<i64>, NodeError> {
    let (key, token, opts) = (req.key.as_str(), req.token.as_str(), &req.opts);
    let timeout = opts.effective_node_timeout();
    // Reentrant: Redisson's channel; plain: the prefix of the waiters' own channels.
    let channel = if opts.reentrant {
        redisson_channel(key)
    } else {
        waiter_channel_prefix(key)
    };
    let names = KeyNames::of(key);
    let queue = req.queue.as_ref().filter(|q| requeue && q.still_waiting());
    // Drawn once for this undo, so that every re-send of it carries the same id.
    let call = if opts.reentrant {
        random_hex()
    } else {
        String::new()
    };
    let undo = Undo {
        key,
        names: &names,
        token,
        reentrant: opts.reentrant,
        channel: &channel,
        place: queue.map(QueueArgs::place).unwrap_or_default(),
        bound_ms: barge_bound_ms(shared.cluster.nodes.len()),
        latch: Latch {
            id: &call,
            px_ms: latch_px_ms(timeout),
        },
    };
    let undo = &undo;
    shared.cluster.nodes[i]
        .run_bounded(deadline, timeout, false, move |mut conn| async move {
            let freed: i64 = undo
                .invocation(conn.sharded())
                .invoke_async(&mut conn)
                .await?;
            Ok(yes_if(freed == 1))
        })
        .await
}

/// What becomes of an attempt's requests still in flight when it is dropped.
enum Then {
    /// Dropped before its outcome was known (or while raising the fence): undo exactly what
    /// was granted, where the answer is in (a silent node's once it is: `undo_late`).
    UndoAll,
    /// Won, and the grant is the caller's: only keep the slower nodes' requests going.
    Drive,
}

/// An attempt's requests that may still be in flight. Dropped with requests unanswered (the
/// caller went away, or a won attempt returned while slower nodes had not answered), it hands
/// them to a task, which keeps them going (a request still waiting for its node's connection
/// has not been sent: dropping it would leave that node without the key) and, with
/// `Then::UndoAll`, undoes exactly what they granted (see `Then::UndoAll`).
struct InFlight<R>
where
    R: Future<Output = (usize, Result<Option<i64>, NodeError>)> + Send + 'static,
{
    shared: Arc<Shared>,
    req: Arc<Req>,
    requests: Option<FanOut<R>>,
    /// Where the grant may be held, when every node had answered before a last await (the
    /// fence raise) and `requests` is gone.
    answered: Option<Vec<bool>>,
    then: Then,
}

impl<R> Drop for InFlight<R>
where
    R: Future<Output = (usize, Result<Option<i64>, NodeError>)> + Send + 'static,
{
    fn drop(&mut self) {
        let undo = matches!(self.then, Then::UndoAll);
        let requests = self.requests.take();
        if !undo && requests.as_ref().is_none_or(|r| r.all_answered()) {
            return;
        }
        let (shared, req) = (self.shared.clone(), self.req.clone());
        let answered = self.answered.take();
        // The exit protocol waits for it (`runtime::settled`): an acquire the exit gave up
        // is undone before the process ends.
        let finishing = crate::runtime::Pending::start();
        crate::runtime::spawn_cleanup(&self.shared.cluster.handle(), async move {
            let _finishing = finishing;
            let mask = match (requests, answered) {
                (Some(mut requests), _) if undo => {
                    // Every node but the silent ones answers first (each within the node
                    // timeout) and is undone here; a cancelled acquire reports once this is
                    // done. A silent node is undone in the background once it answers
                    // (`undo_late`), without holding the cancel up.
                    let silent = |i: usize| shared.cluster.nodes[i].is_silent();
                    while !requests.all_answered() && !requests.only_pending(silent) {
                        requests.next().await;
                    }
                    let tally = requests.tally();
                    let mut mask = undo_mask(&tally, req.reentry);
                    for (m, answer) in mask.iter_mut().zip(&tally.answers) {
                        *m &= !is_late(answer);
                    }
                    undo_late(&shared, &req, Some(requests), &tally);
                    mask
                }
                (Some(mut requests), _) => {
                    while requests.next().await {}
                    undo_mask(&requests.tally(), req.reentry)
                }
                (None, Some(mask)) => mask,
                // One node, inline (never a re-entry: see `attempt`): nothing is known.
                (None, None) => vec![!req.reentry; shared.cluster.nodes.len()],
            };
            if undo && mask.contains(&true) {
                undo_detached(&shared, &req, mask, true).finish().await;
            }
        });
    }
}

/// Undoes, in the background and each exactly once, what the nodes that had not answered a
/// lost attempt when it was decided may hold: each once its reply is in (a grant), or at once
/// if it timed out or failed (unknown: a fresh grant only; a re-entry is undone only where
/// it was granted). Compare-and-delete only, on the connection the request went out on.
/// Returns, when some node had not answered, which nodes' wake-ups count for the waiter as
/// their answers come in: a node that answers with anything but a grant (or an undo) starts
/// to count (see `WakeSources`).
fn undo_late<R>(
    shared: &Arc<Shared>,
    req: &Arc<Req>,
    requests: Option<FanOut<R>>,
    tally: &Tally,
) -> Option<watch::Receiver<Vec<bool>>>
where
    R: Future<Output = (usize, Result<Option<i64>, NodeError>)> + Send + 'static,
{
    let late: Vec<bool> = tally.answers.iter().map(is_late).collect();
    if !late.contains(&true) {
        return None;
    }
    let answers = tally.answers.clone();
    let (wakes, rx) = watch::channel(answers.iter().map(wakes_us).collect::<Vec<bool>>());
    let (shared, req) = (shared.clone(), req.clone());
    // The exit protocol waits for it (`runtime::settled`).
    let finishing = crate::runtime::Pending::start();
    crate::runtime::spawn_cleanup(&shared.cluster.handle(), async move {
        let _finishing = finishing;
        let n = shared.cluster.nodes.len();
        let mut started = vec![false; n];
        let mut undos = futures::stream::FuturesUnordered::new();
        let mut requests = requests;
        loop {
            let answers = match &requests {
                Some(r) => r.tally().answers,
                None => answers.clone(),
            };
            for i in 0..n {
                if !late[i] || started[i] {
                    continue;
                }
                let answer = answers.get(i).unwrap_or(&Answer::Pending);
                let undo = match answer {
                    Answer::Pending => continue,
                    Answer::Yes(_) => true,
                    Answer::No | Answer::Failed(NodeError::Guarded(_)) => false,
                    Answer::Failed(_) => !req.reentry,
                };
                started[i] = true;
                if !undo {
                    // A refusal (or a failure with nothing to undo): its wake-ups are the
                    // holder's.
                    wakes.send_if_modified(|w| !std::mem::replace(&mut w[i], true));
                }
                if undo {
                    let (shared, req) = (shared.clone(), req.clone());
                    let deadline = Instant::now() + req.opts.effective_node_timeout();
                    // Its own timer: nothing else wakes it at the deadline.
                    undos.push(async move {
                        let undo = undo_one(&shared, &req, i, deadline, false);
                        tokio::time::timeout_at(deadline, undo).await
                    });
                }
            }
            let more = requests.as_ref().is_some_and(|r| !r.all_answered());
            if !more {
                break;
            }
            let Some(r) = requests.as_mut() else { break };
            tokio::select! {
                _ = r.next() => {}
                Some(_) = futures::StreamExt::next(&mut undos), if !undos.is_empty() => {}
            }
        }
        while futures::StreamExt::next(&mut undos).await.is_some() {}
    });
    Some(rx)
}

/// Whether a wake-up from a node counts after a lost attempt, from its answer when the attempt
/// was decided (see `WakeSources`): not where it granted, or was held back (its grant is
/// undone too, with the same publish), and not yet where it has not answered.
fn wakes_us(answer: &Answer) -> bool {
    match answer {
        Answer::No => true,
        Answer::Failed(e) => !matches!(e, NodeError::HeldBack(_)),
        Answer::Yes(_) | Answer::Pending => false,
    }
}

/// A node whose answer a lost attempt did not wait for, or never got: pending, or failed
/// without a reply (timed out, connection lost).
fn is_late(answer: &Answer) -> bool {
    matches!(
        answer,
        Answer::Pending | Answer::Failed(NodeError::Unreachable(_))
    )
}

/// Runs one attempt inline: no task and no channel on the hot path. Requests still in flight
/// once the outcome is decided go on in a task (see `InFlight`). A blocking caller with
/// several nodes still runs the attempt as a task on the manager's runtime, on the shared
/// connections, so that slower nodes do not hold its thread once the quorum has answered
/// (see DESIGN.md, "Blocking callers"); a won outcome then carries a `Claim`.
async fn run_attempt(shared: &Arc<Shared>, req: Req) -> Result<(Outcome, Arc<Req>)> {
    let req = Arc::new(req);
    let outcome = if shared.cluster.nodes.len() > 1 && crate::runtime::driving_locally() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        shared
            .cluster
            .handle()
            .spawn(attempt(shared.clone(), req.clone(), Some(tx)));
        rx.await.ok()
    } else {
        attempt(shared.clone(), req.clone(), None).await
    };
    let outcome = outcome.ok_or_else(|| {
        Error::new(
            ErrorKind::Redis,
            "acquire task ended without an outcome (runtime shutting down?)",
        )
    })?;
    Ok((outcome, req))
}

/// Waits until the attempt is decided, or lost unless a silent node says yes (see
/// `FanOut::lost_unless_silent_answer`), or until a node that refused it has since published
/// a release (a head's attempt only, which carries its queue's wake-ups). An attempt that
/// release raced (node 0 released and woke us, node 1 had not yet) is otherwise left to be
/// decided by the nodes still unanswered, and a paused one decides it only at its timeout.
/// Given up, it is lost like any other: undone where granted, and sent again at once, since
/// the refusing node's wake-up counts.
async fn until_decided_or_refuser_woke<R>(
    requests: &mut FanOut<R>,
    mut woken: Option<Woken>,
    nodes: &[Node],
) where
    R: Future<Output = (usize, std::result::Result<Option<i64>, NodeError>)>,
{
    let silent = |i: usize| nodes[i].is_silent();
    while !requests.decided()
        && !requests.lost_unless_silent_answer(silent)
        && !woken
            .as_ref()
            .is_some_and(|w| w.moved_on(&requests.refused()))
    {
        let more = match woken.as_mut() {
            None => requests.next().await,
            Some(w) => tokio::select! {
                more = requests.next() => more,
                _ = w.changed() => true,
            },
        };
        if !more {
            return;
        }
    }
}

enum Reply {
    /// With the fence counter when the script sent one.
    Granted(Option<i64>),
    /// The re-check hint.
    Busy(i64),
}

/// Where to undo a fresh grant once every node has answered: wherever we may hold it (a yes,
/// or an answer we never saw; a node that said no holds nothing of ours). A re-entry only
/// where it was granted.
fn undo_mask(tally: &Tally, reentry: bool) -> Vec<bool> {
    tally
        .answers
        .iter()
        .map(|ans| match ans {
            Answer::Yes(_) => true,
            Answer::No | Answer::Failed(NodeError::Guarded(_)) => false,
            _ => !reentry,
        })
        .collect()
}

/// Where a lost attempt is undone before its caller hears of it: the nodes that answered and
/// may hold our grant (a yes; an error reply, for a fresh grant). The others are `is_late`,
/// or held back by the guard (nothing sent), or met a migrating slot (nothing ran).
fn undo_now_mask(tally: &Tally, reentry: bool) -> Vec<bool> {
    tally
        .answers
        .iter()
        .map(|ans| match ans {
            Answer::Yes(_) => true,
            Answer::Failed(NodeError::Redis(_) | NodeError::HeldBack(_)) => !reentry,
            _ => false,
        })
        .collect()
}

async fn ask(
    shared: Arc<Shared>,
    req: Arc<Req>,
    i: usize,
    deadline: Instant,
) -> Result<Option<i64>, NodeError> {
    let r = &*req;
    let opts = &r.opts;
    let timeout = opts.effective_node_timeout();
    let ttl_ms = opts.ttl_millis();
    let (key, token) = (r.key.as_str(), r.token.as_str());
    let n = shared.cluster.nodes.len();
    let node = &shared.cluster.nodes[i];
    node.slot_guarded(key)?;
    let reply = node
        .run_bounded(deadline, timeout, true, move |mut conn| async move {
            if r.plain_set {
                // A `Value`, not a `String`: "OK" needs no allocation of its own.
                let reply: Value = command("SET", 5, key.len() + token.len() + 24)
                    .arg(key)
                    .arg(token)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl_ms)
                    .query_async(&mut conn)
                    .await?;
                if reply != Value::Nil {
                    return Ok(Value::Nil);
                }
                // Busy, our own grant (this SET ran already and was sent again after its
                // connection dropped: redis-rs re-sends on a cluster, `Node` on a server), or
                // taken by a key of a type no lock has, which would never be released (the
                // scripts check it themselves). One round trip, paid only by a busy first try.
                let replies: Vec<Value> = redis::pipe()
                    .ignore_errors()
                    .cmd("GET")
                    .arg(key)
                    .cmd("TYPE")
                    .arg(key)
                    .cmd("PTTL")
                    .arg(key)
                    .query_async(&mut conn)
                    .await?;
                let [holder, kind, pttl]: [Value; 3] = replies.try_into().map_err(|_| {
                    redis::RedisError::from((
                        redis::ErrorKind::Client,
                        "unexpected reply",
                        "GET, TYPE, PTTL did not answer three replies".to_string(),
                    ))
                })?;
                // GET fails with WRONGTYPE on a reentrant lock's hash: someone else's.
                if matches!(&holder, Value::BulkString(b) if b == token.as_bytes()) {
                    return Ok(Value::Nil);
                }
                let kind: String = redis::from_redis_value(kind)?;
                let pttl: i64 = redis::from_redis_value(pttl)?;
                if kind != "string" && kind != "hash" && kind != "none" {
                    return Err(redis::RedisError::from((
                        redis::ErrorKind::Client,
                        "WRONGTYPE",
                        format!("key {key} holds a {kind}, not a lock"),
                    )));
                }
                // Busy with no re-check hint (the waiter's queued re-check gets the PTTL),
                // unless the holder has no TTL at all (a leaked lock, for the error).
                return Ok(Value::Int(if pttl == -1 { -1 } else { NO_HINT }));
            }
            // Built in a block: only the invocation lives across the await.
            let inv = {
                let place = r.queue.as_ref().map(QueueArgs::place).unwrap_or_default();
                let bound_ms = barge_bound_ms(n);
                if opts.reentrant {
                    AcquireReentrant {
                        key,
                        names: &r.names,
                        ttl_ms,
                        field: token,
                        fence_mode: r.fence_mode,
                        place,
                        reentry: r.reentry,
                        bound_ms,
                        latch: Latch {
                            id: &r.call,
                            px_ms: latch_px_ms(timeout),
                        },
                    }
                    .invocation()
                } else {
                    Acquire {
                        key,
                        names: &r.names,
                        token,
                        ttl_ms,
                        fence_mode: r.fence_mode,
                        place,
                        bound_ms,
                        wake_prefix: &r.wake_prefix,
                        grace_ms: if n == 1 { quiet_grace_ms() } else { 0 },
                        quiet: r.quiet,
                    }
                    .invocation(conn.sharded())
                }
            };
            // Boxed: the queue path is off the uncontended hot path, and its future would
            // size every node's request.
            let value: Value = Box::pin(inv.invoke_async(&mut conn)).await?;
            Ok(value)
        })
        .await?;
    // Parsed first: an error reply is the answer to report. The guard's check comes before
    // the answer counts; a grant it holds back is undone (`undo_now_mask`).
    let reply = parse_reply(reply)?;
    if node.guards_slots() {
        // Boxed: only a cluster with the restart guard on pays for its probe's future.
        Box::pin(node.confirm_primary(key, deadline, timeout)).await?;
    }
    match reply {
        // A fence-less grant is never fence 0: the answer is an error, and the grant undone.
        Reply::Granted(None) if r.fencing() => Err(NodeError::Redis(format!(
            "lock {key:?}: a fenced grant was answered without a fence"
        ))),
        Reply::Granted(counter) => Ok(Some(counter.unwrap_or(0))),
        Reply::Busy(hint) => {
            let mut hints = r.hints.lock().unwrap_or_else(|p| p.into_inner());
            hints.resize(n, None);
            hints[i] = Some(hint);
            Ok(None)
        }
    }
}

/// One attempt on every node. Returns the outcome, or with `report` (run as a task), sends it
/// there: a won grant nobody claims is then undone once every node has answered (`Claim`).
async fn attempt(
    shared: Arc<Shared>,
    req: Arc<Req>,
    report: Option<tokio::sync::oneshot::Sender<Outcome>>,
) -> Option<Outcome> {
    let start = Instant::now();
    let opts = &req.opts;
    let deadline = start + opts.ttl - opts.drift();
    let timeout = opts.effective_node_timeout();
    let nodes = &shared.cluster.nodes;
    let (n, quorum) = (nodes.len(), shared.cluster.quorum);
    let (fencing, reentry) = (req.fencing(), req.reentry);
    // Armed before anything is sent: if this attempt is dropped part-way, whatever it may
    // have taken is released (see `InFlight`).
    let mut run = InFlight {
        shared: shared.clone(),
        req: req.clone(),
        requests: None,
        answered: None,
        then: Then::UndoAll,
    };
    // One node, inline: a dropped request leaves nothing to hand on, and its undo (a
    // compare-and-delete) may go to the node whether or not the request ran. A re-entry's
    // undo is a decrement, sent only where the re-entry is known to have run: its request
    // goes through the owned fan-out, whose answer a task can still wait for.
    let tally = if n == 1 && !reentry {
        let deadline = Instant::now() + timeout;
        let ask = ask(shared.clone(), req.clone(), 0, deadline);
        let answer = match tokio::time::timeout_at(deadline, ask).await {
            Err(_) => Answer::Failed(timed_out(timeout)),
            Ok(Ok(Some(v))) => Answer::Yes(v),
            Ok(Ok(None)) => Answer::No,
            Ok(Err(e)) => Answer::Failed(e),
        };
        Tally {
            quorum,
            answers: vec![answer],
        }
    } else {
        let requests =
            run.requests
                .insert(FanOut::start_owned(n, quorum, timeout, |i, deadline| {
                    ask(shared.clone(), req.clone(), i, deadline)
                }));
        let woken = req.queue.as_ref().and_then(|q| q.woken.clone());
        until_decided_or_refuser_woke(requests, woken, &shared.cluster.nodes).await;
        // Every node answered (the usual case): the answers move out, and nothing is left in
        // flight to hand on.
        match run.requests.take_if(|r| r.all_answered()) {
            Some(done) => done.into_tally(),
            None => match &run.requests {
                Some(requests) => requests.tally(),
                None => unreachable!("inserted above"),
            },
        }
    };
    if !tally.won() {
        shared.contention.mark_contended(&req.key);
    }
    crate::hooks::run(crate::hooks::Point::Answered, &req.key);
    let mut fence = None;
    let mut spoiled = None;
    if tally.won() && fencing {
        let seen = u64::try_from(tally.max_yes_value()).unwrap_or(0);
        if n == 1 {
            fence = Some(seen);
        } else {
            if run.requests.is_none() {
                run.answered = Some(undo_mask(&tally, reentry));
            }
            let next = seen + 1;
            let raise = RaiseFence {
                key: &req.key,
                fence_key: &req.names.fence,
                token: &req.token,
                fence: next,
                reentrant: opts.reentrant,
            };
            let raise = &raise;
            let raise = fan_out(nodes, quorum, timeout, true, |_, node, deadline| {
                node.run_bounded(deadline, timeout, true, move |mut conn| async move {
                    let ok: i64 = raise.invocation().invoke_async(&mut conn).await?;
                    Ok(yes_if(ok == 1))
                })
            });
            // Keep the slower nodes' acquire requests moving meanwhile. Boxed: a rare path,
            // kept out of the attempt future's own size.
            let mut raise = Box::pin(raise);
            let raised = match run.requests.as_mut() {
                Some(requests) => loop {
                    tokio::select! {
                        raised = &mut raise => break raised,
                        more = requests.next() => if !more {
                            break raise.await;
                        },
                    }
                },
                None => raise.await,
            };
            if raised.won() {
                fence = Some(next);
            } else {
                spoiled = Some(raise_failure(&shared, &raised));
            }
        }
    }
    if tally.won() && spoiled.is_none() && Instant::now() >= deadline {
        spoiled = Some(Spoiled::TooLate);
    }
    let won = tally.won() && spoiled.is_none();
    let take_hints = || std::mem::take(&mut *req.hints.lock().unwrap_or_else(|p| p.into_inner()));
    if won {
        let mut outcome = Outcome {
            won,
            looping: req.looping && !req.plain_set,
            tally,
            hints: take_hints(),
            started: start,
            deadline,
            fence,
            spoiled,
            claim: None,
            late: None,
        };
        run.then = Then::Drive;
        let Some(report) = report else {
            // The caller makes it a `Lock` at once. Slower nodes' requests go on in a task
            // (`InFlight`'s drop).
            return Some(outcome);
        };
        let state = Arc::new(Mutex::new(ClaimState::default()));
        outcome.claim = Some(Claim {
            shared: shared.clone(),
            req: req.clone(),
            state: state.clone(),
        });
        let mask = undo_mask(&outcome.tally, reentry);
        // A receiver already gone drops the outcome here, and its `Claim` leaves the undo to
        // us below.
        let _ = report.send(outcome);
        if let Some(hook) = shared.waiters.attempt_hook(|h| &h.won_reported) {
            hook(&req.key).await;
        }
        let mask = match run.requests.as_mut() {
            Some(requests) => {
                while requests.next().await {}
                undo_mask(&requests.tally(), reentry)
            }
            None => mask,
        };
        let abandoned = {
            let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
            if !st.abandoned && !st.claimed {
                st.mask = Some(mask.clone());
            }
            st.abandoned
        };
        if abandoned {
            Box::pin(undo_detached(&shared, &req, mask, false).finish()).await;
        }
        return None;
    }
    // Lost. The nodes that have not answered (or timed out) are undone in the background, each
    // once its reply is in; the nodes that answered are undone now, before the caller hears of
    // it, so that its next attempt cannot meet its own stale grant.
    run.then = Then::Drive;
    let late = undo_late(&shared, &req, run.requests.take(), &tally);
    if let Some(hook) = shared.waiters.attempt_hook(|h| &h.lost) {
        hook(&req.key).await;
    }
    let now = undo_now_mask(&tally, reentry);
    if now.contains(&true) {
        Box::pin(undo_detached(&shared, &req, now, true).finish()).await;
    }
    let mut hints = take_hints();
    hints.resize(n, None); // one per node, for `wake_hint`
    let outcome = Outcome {
        won,
        looping: req.looping && !req.plain_set,
        tally,
        hints,
        started: start,
        deadline,
        fence,
        spoiled,
        claim: None,
        late,
    };
    match report {
        None => Some(outcome),
        Some(report) => {
            let _ = report.send(outcome);
            None
        }
    }
}

/// Why a raise that did not reach a quorum failed: an error reply (an ACL denial, say) is the
/// cause when there is one; otherwise timeouts, or the grant was no longer ours there.
fn raise_failure(shared: &Shared, raised: &Tally) -> Spoiled {
    let error = raised
        .answers
        .iter()
        .enumerate()
        .find_map(|(i, a)| match a {
            Answer::Failed(e @ NodeError::Redis(_)) => Some((i, e.clone())),
            _ => None,
        });
    if let Some((i, e)) = error {
        return Spoiled::FenceError(i, e);
    }
    let gone = raised.no();
    let failures = raised.describe_failures(&shared.cluster.nodes);
    let mut why = format!(
        "raised on {} of {} nodes",
        raised.yes(),
        raised.answers.len()
    );
    if gone > 0 {
        why.push_str(&format!(", our grant was gone on {gone}"));
    }
    if !failures.is_empty() {
        why.push_str(&format!(", failed: {failures}"));
    }
    Spoiled::FenceFailed(why)
}

/// nil: granted; {counter}: granted with the fence counter; an integer: busy, with the ms
/// after which a re-check is worth it.
fn parse_reply(v: Value) -> Result<Reply, NodeError> {
    match v {
        Value::Nil => Ok(Reply::Granted(None)),
        Value::Array(items) => match items.as_slice() {
            [Value::Int(c)] => Ok(Reply::Granted(Some(*c))),
            _ => Err(NodeError::Redis(format!(
                "unexpected acquire reply {items:?}"
            ))),
        },
        Value::Int(h) => Ok(Reply::Busy(h)),
        other => Err(NodeError::Redis(format!(
            "unexpected acquire reply {other:?}"
        ))),
    }
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
