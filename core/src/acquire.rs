//! The acquire loop: one attempt on every node at once, then, while the lock is busy, a place
//! in the key's local queue with push wake-ups (see `wakeup.rs`) and in the key's server-side
//! waiter queue (see `scripts/queue.lua` and DESIGN.md, "Waiter queue").
//!
//! Cancel safety: an attempt runs inline, with an armed `Undo` from before its first request.
//! Its requests own what they use, so whatever is still in flight when the attempt stops (its
//! caller dropped it, or it won while slower nodes had not answered) goes on in a task
//! (`InFlight`): a request still waiting for its node's connection has not been sent, and
//! dropping it would leave that node without the key. A failed attempt is undone once every
//! node has answered, with exact knowledge of which nodes granted, before the caller hears of
//! it; a dropped one likewise, by that task. A won attempt becomes a `Lock` with no await in
//! between. A re-entry is undone only where it was granted: decrementing a hold count where
//! our increment never ran would take a count from the outer grant.
//! Dropping a waiting acquire drops its `Ticket`, which leaves the queue.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use crate::error::{Error, ErrorKind, Result};
use crate::lock::{Lock, release_everywhere};
use crate::manager::{LockManager, Shared, UNREACHABLE_ATTEMPTS, check_key, jitter, new_token};
use crate::node::{NodeError, node_error, timed_out};
use crate::options::LockOptions;
use crate::owner::{Holder, new_owner_id};
use crate::quorum::{Answer, FanOut, Tally, fan_out, yes_if};
use crate::scripts::{
    ACQUIRE, ACQUIRE_REENTRANT, RAISE_FENCE, UNDO, command, fence_key, queue_key, queue_lease_key,
    queue_since_key, redisson_channel, waiter_channel_prefix,
};
use crate::wakeup::{QueueArgs, Ticket, barge_bound_ms, quiet_grace_ms};

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

impl LockManager {
    /// The acquire loop behind `acquire_with` (`owner: None`) and `acquire_owned`.
    pub(crate) async fn acquire_inner(
        &self,
        key: &str,
        owner: Option<u64>,
        opts: &LockOptions,
    ) -> Result<Lock> {
        check_key(key)?;
        opts.validate()?;
        let shared = &self.shared;
        let n = shared.nodes.len();
        let started = Instant::now();
        let give_up_at = opts.wait.map(|w| started + w);
        let mut unreachable_streak = 0;
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
                    ticket = Some(shared.waiters.join(shared, key, &channel));
                }
            }
            let plan = self.plan(key, owner, opts, stale);
            // Only the head of the local queue carries our queue id; first attempts and
            // re-entries go straight to Redis without queueing.
            let head = ticket.as_ref().filter(|t| t.is_head());
            let queue = head.filter(|_| !plan.reentry).map(|t| t.queue_args(opts));
            let seen = head.map(Ticket::epoch);

            let req = Req::new(shared, key, plan.token, opts, plan.reentry, queue);
            let (outcome, req) = run_attempt(shared, req).await?;
            let first_looping = *first_looping.get_or_insert(outcome.looping);
            if outcome.won {
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
                    shared.mark_streak(key);
                }
                // The key and token move into the lock, unless requests still in flight
                // hold them.
                let (key, token) = match Arc::try_unwrap(req) {
                    Ok(r) => (r.key, r.token),
                    Err(r) => (r.key.clone(), r.token.clone()),
                };
                return Ok(Lock::new(
                    shared.clone(),
                    key,
                    token,
                    opts.clone(),
                    outcome.deadline,
                    outcome.started,
                    fence,
                    plan.holder,
                ));
            }
            // A failed attempt has been undone already.
            let tally = outcome.tally;
            let hint = wake_hint(&tally, &outcome.hints);
            let deadline = outcome.deadline;

            if let Some((i, e)) = tally.redis_error() {
                return Err(node_error(
                    ErrorKind::Redis,
                    &format!("lock {key:?}: acquire failed"),
                    &shared.nodes[i],
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
            if unreachable_streak >= UNREACHABLE_ATTEMPTS || (out_of_time && unreachable_streak > 0)
            {
                return Err(self.unreachable_error(key, &tally));
            }
            if plan.reentry && tally.no() > n - shared.quorum {
                // Our field is gone from too many nodes: the outer acquisition was lost.
                // Acquire afresh, at once, under a new owner id.
                stale = plan.holder.map(|h| h.owner_id);
                if !out_of_time {
                    continue;
                }
            }
            if out_of_time {
                return Err(self.not_acquired_error(key, opts, &tally, deadline));
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
                ticket = Some(shared.waiters.join(shared, key, &channel_of(key, opts)));
            }
            let Some(t) = ticket.as_mut() else {
                unreachable!("joined above")
            };
            let seen = match seen {
                Some(s) => s,
                None => {
                    let turn = tokio::select! {
                        turn = t.my_turn() => turn,
                        _ = until(give_up_at) => {
                            return Err(self.not_acquired_error(key, opts, &tally, deadline));
                        }
                    };
                    if turn.attempt_now {
                        continue;
                    }
                    turn.seen
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
                _ = t.woken_since(seen) => {}
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }

    fn plan(&self, key: &str, owner: Option<u64>, opts: &LockOptions, stale: Option<u64>) -> Plan {
        if !opts.reentrant {
            return Plan {
                token: new_token(),
                holder: None,
                reentry: false,
                fence: None,
            };
        }
        let owners = &self.shared.owners;
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
}

/// The key's release channel: the name of its local waiter queue.
fn channel_of(key: &str, opts: &LockOptions) -> String {
    crate::wakeup::queue_channel(key, opts.reentrant)
}

async fn until(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// When a re-check is first worth it: the time after which a quorum of nodes could grant,
/// from each node's answer (a grant: now; busy: the PTTL or queue lease it returned; no
/// answer, or a key without TTL: unknown).
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
    /// "1": our last release of this key was quiet (see release.lua).
    grace: &'static str,
    /// A manager that released the key a moment before (see `Contention::looping`).
    looping: bool,
    fence_mode: &'static str,
    /// Fence, queue, queue leases, queue join times, and the waiters' channel prefix (plain
    /// locks with a queue): empty for a plain SET.
    names: [String; 5],
    /// Filled (one slot per node) only when a node answers busy: a grant allocates nothing.
    hints: Mutex<Vec<Option<i64>>>,
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
        let fence_mode = match (fencing, shared.nodes.len()) {
            (false, _) => "",
            (true, 1) => "1",
            (true, _) => "0",
        };
        let seen = shared.contention(key);
        let plain_set = !opts.reentrant && !fencing && queue.is_none() && !seen.contended;
        let names = if plain_set {
            Default::default()
        } else {
            [
                fence_key(key),
                queue_key(key),
                queue_lease_key(key),
                queue_since_key(key),
                // Plain locks with a queue: where the script tells the next waiter that the
                // lock is free.
                if opts.reentrant {
                    String::new()
                } else {
                    waiter_channel_prefix(key)
                },
            ]
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
            grace: if seen.quiet { "1" } else { "0" },
            looping: seen.looping,
            fence_mode,
            names,
            hints: Mutex::new(Vec::new()),
        }
    }

    fn fencing(&self) -> bool {
        self.opts.fencing && !self.reentry
    }
}

/// The result of one attempt, as decided. A lost one has been undone already; a won one
/// belongs to the caller, who makes it a `Lock` at once (no await in between).
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
}

/// Releases what an attempt may hold, unless disarmed.
struct Undo {
    shared: Option<Arc<Shared>>,
    req: Arc<Req>,
    /// Where we may hold a grant; `None`: on every node (nothing is known yet).
    only: Option<Vec<bool>>,
}

impl Undo {
    fn disarm(&mut self) {
        self.shared = None;
    }

    /// Releases where `only` says we may hold the grant. With a place in the server queue
    /// (and still waiting), the same script puts our id back where the grant dequeued it.
    /// Stays armed until it has run: if the caller drops it part-way, `Drop` runs it again in
    /// the background (compare-and-delete and the re-enqueue are idempotent).
    async fn execute(&mut self) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        let all;
        let only = match &self.only {
            Some(only) => only.as_slice(),
            None => {
                all = vec![true; shared.nodes.len()];
                all.as_slice()
            }
        };
        if only.iter().any(|&m| m) {
            let r = &*self.req;
            match &r.queue {
                Some(q) if q.still_waiting() => {
                    undo_everywhere(&shared, &r.key, &r.token, &r.opts, only, q).await
                }
                _ => {
                    release_everywhere(&shared, &r.key, &r.token, &r.opts, Some(only)).await;
                }
            }
        }
        self.shared = None;
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            let (req, only) = (self.req.clone(), self.only.take());
            crate::runtime::spawn_cleanup(&shared.handle(), {
                let shared = shared.clone();
                async move {
                    // Armed only once running: a clean-up dropped before it ran (its runtime
                    // shutting down) does not start another.
                    let mut undo = Undo {
                        shared: Some(shared),
                        req,
                        only,
                    };
                    undo.execute().await;
                }
            });
        }
    }
}

/// An attempt's requests that may still be in flight, and the undo of what they may take.
/// Dropped with requests unanswered (the caller went away, or a won attempt returned while
/// slower nodes had not answered), it hands them to a task, which keeps them going (a request
/// still waiting for its node's connection has not been sent: dropping it would leave that
/// node without the key) and, if the undo is still armed, undoes exactly what they granted
/// once every node has answered.
struct InFlight<R>
where
    R: Future<Output = (usize, Result<Option<i64>, NodeError>)> + Send + 'static,
{
    shared: Arc<Shared>,
    requests: Option<FanOut<R>>,
    undo: Undo,
}

impl<R> Drop for InFlight<R>
where
    R: Future<Output = (usize, Result<Option<i64>, NodeError>)> + Send + 'static,
{
    fn drop(&mut self) {
        let Some(mut requests) = self.requests.take() else {
            return;
        };
        let armed = self.undo.shared.take().is_some();
        if !armed && requests.all_answered() {
            return;
        }
        let req = self.undo.req.clone();
        let shared = self.shared.clone();
        crate::runtime::spawn_cleanup(&self.shared.handle(), async move {
            while requests.next().await {}
            if armed {
                let only = undo_mask(&requests.tally(), req.reentry);
                let mut undo = Undo {
                    shared: Some(shared),
                    req,
                    only: Some(only),
                };
                undo.execute().await;
            }
        });
    }
}

/// Runs one attempt inline: no task and no channel on the hot path. Requests still in flight
/// once the outcome is decided go on in a task (see `InFlight`). A blocking caller with
/// several nodes still runs the attempt as a task on the manager's runtime, on the shared
/// connections, so that slower nodes do not hold its thread once the quorum has answered
/// (see DESIGN.md, "Blocking callers").
async fn run_attempt(shared: &Arc<Shared>, req: Req) -> Result<(Outcome, Arc<Req>)> {
    let req = Arc::new(req);
    let outcome = if shared.nodes.len() > 1 && crate::runtime::driving_locally() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        shared
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

enum Reply {
    Granted(i64),
    /// The re-check hint.
    Busy(i64),
}

/// Where to undo a fresh grant: wherever we may hold it (a yes, or an answer we never saw; a
/// node that said no holds nothing of ours). A re-entry only where it was granted.
fn undo_mask(tally: &Tally, reentry: bool) -> Vec<bool> {
    tally
        .answers
        .iter()
        .map(|ans| match ans {
            Answer::Yes(_) => true,
            Answer::No => false,
            _ => !reentry,
        })
        .collect()
}

/// Node `i`'s request of an attempt: owns what it uses, so it can outlive its caller. Gives
/// up when polled at or after `deadline` (its caller wakes it then).
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
    let n = shared.nodes.len();
    let reply = shared.nodes[i]
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
                // Busy with no re-check hint: the waiter's queued re-check gets the PTTL.
                return Ok(if reply == Value::Nil {
                    Value::Int(-1)
                } else {
                    Value::Nil
                });
            }
            let [fk, qk, lk, sk, wake_prefix] = &r.names;
            let (id, score, lease) = r.queue.as_ref().map_or(("", "", 0), |q| {
                (q.id.as_str(), q.score.as_str(), q.lease_ms)
            });
            let bound = barge_bound_ms(n);
            let inv = if opts.reentrant {
                let mut inv = ACQUIRE_REENTRANT.prepare_invoke();
                inv.key(key).key(fk).key(qk).key(lk).key(sk);
                inv.arg(ttl_ms).arg(token).arg(r.fence_mode);
                inv.arg(id).arg(score).arg(lease);
                inv.arg(if r.reentry { "1" } else { "0" }).arg(bound);
                inv
            } else {
                let mut inv = ACQUIRE.prepare_invoke();
                inv.key(key).key(fk).key(qk).key(lk).key(sk);
                inv.arg(token).arg(ttl_ms).arg(r.fence_mode);
                inv.arg(id)
                    .arg(score)
                    .arg(lease)
                    .arg(bound)
                    .arg(wake_prefix)
                    .arg(if n == 1 { quiet_grace_ms() } else { 0 })
                    .arg(r.grace);
                inv
            };
            // Boxed: the queue path is off the uncontended hot path, and its future would
            // size every node's request.
            let value: Value = Box::pin(inv.invoke_async(&mut conn)).await?;
            Ok(value)
        })
        .await?;
    match parse_reply(reply)? {
        Reply::Granted(counter) => Ok(Some(counter)),
        Reply::Busy(hint) => {
            let mut hints = r.hints.lock().unwrap_or_else(|p| p.into_inner());
            hints.resize(n, None);
            hints[i] = Some(hint);
            Ok(None)
        }
    }
}

/// One attempt on every node. Returns the outcome, or with `report` (run as a task), sends it
/// there: a won grant nobody claims is then undone once every node has answered.
async fn attempt(
    shared: Arc<Shared>,
    req: Arc<Req>,
    report: Option<tokio::sync::oneshot::Sender<Outcome>>,
) -> Option<Outcome> {
    let start = Instant::now();
    let opts = &req.opts;
    let deadline = start + opts.ttl - opts.drift();
    let timeout = opts.effective_node_timeout();
    let nodes = &shared.nodes;
    let (n, quorum) = (nodes.len(), shared.quorum);
    let (fencing, reentry) = (req.fencing(), req.reentry);
    // Armed before anything is sent: if this attempt is dropped part-way, whatever it may
    // have taken is released (see `InFlight`).
    let mut run = InFlight {
        shared: shared.clone(),
        requests: None,
        undo: Undo {
            shared: Some(shared.clone()),
            req: req.clone(),
            only: None,
        },
    };
    let tally = if n == 1 {
        // One node: no set of requests to build, and nothing left in flight once it answered.
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
        requests.until_decided().await;
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
        shared.mark_contended(&req.key);
    }
    let mut fence = None;
    if tally.won() && fencing {
        let seen = u64::try_from(tally.max_yes_value()).unwrap_or(0);
        if n == 1 {
            fence = Some(seen);
        } else {
            let next = seen + 1;
            let (key, token, fk) = (req.key.as_str(), req.token.as_str(), req.names[0].as_str());
            let hash = if opts.reentrant { "1" } else { "0" };
            let raise = fan_out(nodes, quorum, timeout, true, |_, node, deadline| {
                node.run_bounded(deadline, timeout, true, move |mut conn| async move {
                    let ok: i64 = RAISE_FENCE
                        .key(key)
                        .key(fk)
                        .arg(token)
                        .arg(next)
                        .arg(hash)
                        .invoke_async(&mut conn)
                        .await?;
                    Ok(yes_if(ok == 1))
                })
            });
            // Keep the slower nodes' acquire requests moving meanwhile. Boxed, like the undo
            // below: rare paths, kept out of the attempt future's own size.
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
            fence = raised.won().then_some(next);
        }
    }
    let won = tally.won() && Instant::now() < deadline && (fence.is_some() || !fencing);
    let take_hints = || std::mem::take(&mut *req.hints.lock().unwrap_or_else(|p| p.into_inner()));
    if won {
        let outcome = Outcome {
            won,
            looping: req.looping && !req.plain_set,
            tally,
            hints: take_hints(),
            started: start,
            deadline,
            fence,
        };
        let Some(report) = report else {
            // The caller makes it a `Lock` at once. Slower nodes' requests go on in a task
            // (`InFlight`'s drop).
            run.undo.disarm();
            return Some(outcome);
        };
        // A caller that is gone gets its grant undone, once every node has answered: where
        // the tally says, or (requests still in flight) where their final tally says.
        run.undo.only = Some(undo_mask(&outcome.tally, reentry));
        let claimed = report.send(outcome).is_ok();
        if claimed {
            run.undo.disarm();
        }
        if let Some(requests) = run.requests.as_mut() {
            while requests.next().await {}
            run.undo.only = Some(undo_mask(&requests.tally(), reentry));
        }
        Box::pin(run.undo.execute()).await;
        return None;
    }
    // Lost: wait for every answer, undo exactly what was granted, then report.
    let only = match run.requests.as_mut() {
        Some(requests) => {
            while requests.next().await {}
            undo_mask(&requests.tally(), reentry)
        }
        None => undo_mask(&tally, reentry),
    };
    run.undo.only = Some(only);
    Box::pin(run.undo.execute()).await;
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
    };
    match report {
        None => Some(outcome),
        Some(report) => {
            let _ = report.send(outcome);
            None
        }
    }
}

/// Releases a fresh grant where `only` says we may hold it and, in the same script, puts our
/// waiter id back in the server queue with its score.
async fn undo_everywhere(
    shared: &Shared,
    key: &str,
    token: &str,
    opts: &LockOptions,
    only: &[bool],
    queue: &QueueArgs,
) {
    let timeout = opts.effective_node_timeout();
    // Reentrant: Redisson's channel; plain: the prefix of the waiters' own channels.
    let channel = if opts.reentrant {
        redisson_channel(key)
    } else {
        waiter_channel_prefix(key)
    };
    let (fk, qk, lk, sk) = (
        fence_key(key),
        queue_key(key),
        queue_lease_key(key),
        queue_since_key(key),
    );
    let (channel, fk, qk, lk, sk) = (
        channel.as_str(),
        fk.as_str(),
        qk.as_str(),
        lk.as_str(),
        sk.as_str(),
    );
    let bound = barge_bound_ms(shared.nodes.len());
    let reentrant = if opts.reentrant { "1" } else { "0" };
    fan_out(
        &shared.nodes,
        shared.quorum,
        timeout,
        false,
        |i, node, deadline| {
            let wanted = only[i];
            async move {
                if !wanted {
                    return Ok(None);
                }
                node.run_bounded(deadline, timeout, false, move |mut conn| async move {
                    let freed: i64 = UNDO
                        .key(key)
                        .key(fk)
                        .key(qk)
                        .key(lk)
                        .key(sk)
                        .arg(token)
                        .arg(reentrant)
                        .arg(channel)
                        .arg(&queue.id)
                        .arg(&queue.score)
                        .arg(queue.lease_ms)
                        .arg(bound)
                        .invoke_async(&mut conn)
                        .await?;
                    Ok(yes_if(freed == 1))
                })
                .await
            }
        },
    )
    .await;
}

/// nil: granted; {counter}: granted with the fence counter; an integer: busy, with the ms
/// after which a re-check is worth it.
fn parse_reply(v: Value) -> Result<Reply, NodeError> {
    match v {
        Value::Nil => Ok(Reply::Granted(0)),
        Value::Array(items) => match items.as_slice() {
            [Value::Int(c)] => Ok(Reply::Granted(*c)),
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
