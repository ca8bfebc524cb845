//! The acquire loop: one attempt on every node at once, then, while the lock is busy, a place
//! in the key's local queue with push wake-ups (see `wakeup.rs`) and in the key's server-side
//! waiter queue (see `scripts/queue.lua` and DESIGN.md, "Waiter queue").
//!
//! Cancel safety: each attempt runs in a task of its own. It reports its `Outcome` as soon as
//! the quorum outcome is decided, and keeps driving the slower nodes' requests to completion
//! (a request still waiting for its node's connection has not been sent: dropping it would
//! leave that node without the key). A failed attempt is undone by that task once every node
//! has answered, with exact knowledge of which nodes granted, before the caller hears of it; a
//! won attempt carries an `Undo` that releases it unless it became a `Lock` (so dropping the
//! acquire future loses nothing). A re-entry is undone only where it was granted: decrementing
//! a hold count where our increment never ran would take a count from the outer grant.
//! Dropping a waiting acquire drops its `Ticket`, which leaves the queue.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use crate::error::{Error, ErrorKind, Result};
use crate::lock::{Lock, release_everywhere};
use crate::manager::{LockManager, Shared, UNREACHABLE_ATTEMPTS, check_key, jitter, new_token};
use crate::node::{NodeError, node_error};
use crate::options::LockOptions;
use crate::owner::{Holder, new_owner_id};
use crate::quorum::{Answer, FanOut, Tally, fan_out, yes_if};
use crate::scripts::{
    ACQUIRE, ACQUIRE_REENTRANT, RAISE_FENCE, UNDO, fence_key, queue_key, queue_lease_key,
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

            let attempt = Attempt {
                key: key.to_string(),
                token: plan.token.clone(),
                opts: opts.clone(),
                reentry: plan.reentry,
                queue,
            };
            let mut outcome = run_attempt(shared.clone(), attempt).await?;
            let first_looping = *first_looping.get_or_insert(outcome.looping);
            if outcome.won {
                outcome.undo.disarm();
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
                return Ok(Lock::new(
                    shared.clone(),
                    key.to_string(),
                    plan.token,
                    opts.clone(),
                    outcome.deadline,
                    outcome.started,
                    fence,
                    plan.holder,
                ));
            }
            // A failed attempt has been undone by its task already.
            let tally = std::mem::replace(
                &mut outcome.tally,
                Tally {
                    quorum: 0,
                    answers: Vec::new(),
                },
            );
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

struct Attempt {
    key: String,
    token: String,
    opts: LockOptions,
    reentry: bool,
    queue: Option<QueueArgs>,
}

/// The result of one attempt, as decided. A won attempt's `Undo` releases it when dropped
/// unless disarmed (it became a `Lock`); a lost one has been undone already.
struct Outcome {
    won: bool,
    /// Sent through the waiter queue (not a plain `SET NX`) by a manager that released the key
    /// a moment before (see `Contention::looping`).
    looping: bool,
    tally: Tally,
    /// Per node: ms until a re-check is worth it, from a busy answer (-1: no TTL).
    hints: Vec<Option<i64>>,
    /// Every node answered that our queued id is behind another waiter's.
    started: Instant,
    deadline: Instant,
    fence: Option<u64>,
    undo: Undo,
}

struct Undo {
    shared: Option<Arc<Shared>>,
    key: String,
    token: String,
    opts: LockOptions,
    only: Vec<bool>,
    /// The attempt's place in the server queue, restored where the attempt took it.
    queue: Option<QueueArgs>,
}

impl Undo {
    fn disarm(&mut self) {
        self.shared = None;
    }

    /// Releases where `only` says we may hold the grant. With a place in the server queue
    /// (and still waiting), the same script puts our id back where the grant dequeued it.
    async fn execute(mut self) {
        let Some(shared) = self.shared.take() else {
            return;
        };
        if !self.only.iter().any(|&m| m) {
            return;
        }
        match &self.queue {
            Some(q) if q.still_waiting() => {
                undo_everywhere(&shared, &self.key, &self.token, &self.opts, &self.only, q).await
            }
            _ => {
                release_everywhere(
                    &shared,
                    &self.key,
                    &self.token,
                    &self.opts,
                    Some(&self.only),
                )
                .await;
            }
        }
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            let undo = Undo {
                shared: Some(shared.clone()),
                key: std::mem::take(&mut self.key),
                token: std::mem::take(&mut self.token),
                opts: self.opts.clone(),
                only: std::mem::take(&mut self.only),
                queue: self.queue.take(),
            };
            crate::runtime::spawn_cleanup(&shared.handle(), undo.execute());
        }
    }
}

/// Runs one attempt in a task of its own (see the module comment): dropping the caller never
/// loses track of a grant.
async fn run_attempt(shared: Arc<Shared>, a: Attempt) -> Result<Outcome> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    if shared.nodes.len() == 1 {
        // One node: no slower node to keep driving once the answer is in, so the attempt runs
        // inline (no task spawn on the hot path). If this future is dropped mid-request, the
        // attempt's armed undo releases whatever the request may have taken.
        attempt(shared, a, tx).await;
    } else {
        shared.handle().spawn(attempt(shared.clone(), a, tx));
    }
    rx.await.map_err(|_| {
        Error::new(
            ErrorKind::Redis,
            "acquire task ended without an outcome (runtime shutting down?)",
        )
    })
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

async fn attempt(shared: Arc<Shared>, a: Attempt, report: tokio::sync::oneshot::Sender<Outcome>) {
    let start = Instant::now();
    let opts = &a.opts;
    let deadline = start + opts.ttl - opts.drift();
    let timeout = opts.effective_node_timeout();
    let ttl_ms = opts.ttl_millis();
    let nodes = &shared.nodes;
    let quorum = shared.quorum;
    let (key, token) = (a.key.as_str(), a.token.as_str());
    let fencing = opts.fencing && !a.reentry;
    // One node: INCR in the acquire script is the order. N nodes: read the counters of the
    // granting quorum, take max + 1, and raise a quorum's counters to it while they still hold
    // our grant. Any later grant's quorum shares a node with that raise quorum, and that node
    // grants again only after our grant is gone there, so it reads a counter >= our fence.
    // (The max over *different* quorums alone would not be monotonic.)
    let fence_mode = match (fencing, nodes.len()) {
        (false, _) => "",
        (true, 1) => "1",
        (true, _) => "0",
    };
    // Nobody known to be waiting: a plain SET NX PX, the cheapest grant there is (and no
    // queue or fence key names to build for it).
    let seen = shared.contention(key);
    let plain_set = !opts.reentrant && !fencing && a.queue.is_none() && !seen.contended;
    // Our last release of this key was quiet (N = 1): we may take it back within the grace.
    let grace = if seen.quiet { "1" } else { "0" };
    let looping = seen.looping;
    let (fk, qk, lk, sk) = if plain_set {
        Default::default()
    } else {
        (
            fence_key(key),
            queue_key(key),
            queue_lease_key(key),
            queue_since_key(key),
        )
    };
    let (fk, qk, lk, sk) = (fk.as_str(), qk.as_str(), lk.as_str(), sk.as_str());
    let bound = barge_bound_ms(shared.nodes.len());
    let q = a.queue.clone().unwrap_or_default();
    let (id, score, lease) = (q.id.as_str(), q.score.as_str(), q.lease_ms);
    let (reentrant, reentry) = (opts.reentrant, a.reentry);
    // Filled (one slot per node) only when a node answers busy: a grant allocates neither.
    let n = nodes.len();
    let hints = Mutex::new(Vec::new());
    let hints_ref = &hints;
    // Plain locks with a queue: where the script tells the next waiter that the lock is free.
    let wake_prefix = if reentrant || plain_set {
        String::new()
    } else {
        waiter_channel_prefix(key)
    };
    let wake_prefix = wake_prefix.as_str();
    // Armed before anything is sent: if this attempt is dropped part-way (it runs inline on one
    // node), whatever it may have taken is released.
    let pending = Undo {
        shared: Some(shared.clone()),
        key: a.key.clone(),
        token: a.token.clone(),
        opts: a.opts.clone(),
        only: vec![true; nodes.len()],
        queue: a.queue.clone(),
    };
    let mut requests = FanOut::start(nodes, quorum, |i, node| async move {
        let reply = node
            .run(timeout, true, move |mut conn| async move {
                if plain_set {
                    let ok: Option<String> = redis::cmd("SET")
                        .arg(key)
                        .arg(token)
                        .arg("NX")
                        .arg("PX")
                        .arg(ttl_ms)
                        .query_async(&mut conn)
                        .await?;
                    // Busy with no re-check hint: the waiter's queued re-check gets the PTTL.
                    return Ok(if ok.is_some() {
                        Value::Nil
                    } else {
                        Value::Int(-1)
                    });
                }
                let inv = if reentrant {
                    let mut inv = ACQUIRE_REENTRANT.prepare_invoke();
                    inv.key(key).key(fk).key(qk).key(lk).key(sk);
                    inv.arg(ttl_ms).arg(token).arg(fence_mode);
                    inv.arg(id).arg(score).arg(lease);
                    inv.arg(if reentry { "1" } else { "0" }).arg(bound);
                    inv
                } else {
                    let mut inv = ACQUIRE.prepare_invoke();
                    inv.key(key).key(fk).key(qk).key(lk).key(sk);
                    inv.arg(token).arg(ttl_ms).arg(fence_mode);
                    inv.arg(id)
                        .arg(score)
                        .arg(lease)
                        .arg(bound)
                        .arg(wake_prefix)
                        .arg(if n == 1 { quiet_grace_ms() } else { 0 })
                        .arg(grace);
                    inv
                };
                let value: Value = inv.invoke_async(&mut conn).await?;
                Ok(value)
            })
            .await?;
        match parse_reply(reply)? {
            Reply::Granted(counter) => Ok(Some(counter)),
            Reply::Busy(hint) => {
                let mut hints = hints_ref.lock().unwrap_or_else(|p| p.into_inner());
                hints.resize(n, None);
                hints[i] = Some(hint);
                Ok(None)
            }
        }
    });
    requests.until_decided().await;
    let tally = requests.tally();
    if !tally.won() {
        shared.mark_contended(key);
    }
    let mut fence = None;
    if tally.won() && fencing {
        let seen = u64::try_from(tally.max_yes_value()).unwrap_or(0);
        if nodes.len() == 1 {
            fence = Some(seen);
        } else {
            let next = seen + 1;
            let hash = if reentrant { "1" } else { "0" };
            let raise = fan_out(nodes, quorum, true, |_, node| {
                node.run(timeout, true, move |mut conn| async move {
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
            // Keep the slower nodes' acquire requests moving meanwhile.
            let mut raise = Box::pin(raise);
            let raised = loop {
                tokio::select! {
                    raised = &mut raise => break raised,
                    more = requests.next() => if !more {
                        break raise.await;
                    },
                }
            };
            fence = raised.won().then_some(next);
        }
    }
    let won = tally.won() && Instant::now() < deadline && (fence.is_some() || !fencing);
    let mut hints_now = std::mem::take(&mut *hints.lock().unwrap_or_else(|p| p.into_inner()));
    let mut undo = pending;
    undo.only = undo_mask(&tally, reentry);
    if won {
        let outcome = Outcome {
            won,
            looping: looping && !plain_set,
            tally,
            hints: hints_now,
            started: start,
            deadline,
            fence,
            undo,
        };
        // A caller that is gone gets its grant undone, once every node has answered.
        let unclaimed = report.send(outcome).err();
        while requests.next().await {}
        if let Some(mut outcome) = unclaimed {
            let mut undo = std::mem::replace(&mut outcome.undo, empty_undo(&a));
            undo.only = undo_mask(&requests.tally(), reentry);
            Box::pin(undo.execute()).await;
        }
        return;
    }
    // Lost: wait for every answer, undo exactly what was granted, then report.
    while requests.next().await {}
    undo.only = undo_mask(&requests.tally(), reentry);
    // Boxed, like the fence raise: rare paths, kept out of the attempt future's own size, which
    // every acquire pays to set up (and on N nodes, to spawn).
    Box::pin(undo.execute()).await;
    hints_now.resize(n, None); // one per node, for `wake_hint`
    let _ = report.send(Outcome {
        won,
        looping: looping && !plain_set,
        tally,
        hints: hints_now,
        started: start,
        deadline,
        fence,
        undo: empty_undo(&a),
    });
}

/// A disarmed undo.
fn empty_undo(a: &Attempt) -> Undo {
    Undo {
        shared: None,
        key: String::new(),
        token: String::new(),
        opts: a.opts.clone(),
        only: Vec::new(),
        queue: None,
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
    fan_out(&shared.nodes, shared.quorum, false, |i, node| {
        let wanted = only[i];
        async move {
            if !wanted {
                return Ok(None);
            }
            node.run(timeout, false, move |mut conn| async move {
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
    })
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
