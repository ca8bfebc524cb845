//! One attempt on every node at once: its owned request (`Req`), its decided `Outcome`, and
//! the fence raise of a won grant.

use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio::time::Instant;

use super::ask::ask;
use super::claim::{Claim, ClaimState};
use super::in_flight::{InFlight, Then};
use super::kind::Kind;
use super::late::undo_late;
use super::undo::{undo_detached, undo_mask, undo_now_mask};
use crate::error::{Error, ErrorKind, Result};
use crate::node::{Node, NodeError, timed_out};
use crate::options::LockOptions;
use crate::queue::{QueueArgs, Woken};
use crate::quorum::{Answer, FanOut, Tally, fan_out, yes_if};
use crate::scripts::{KeyNames, RaiseFence, waiter_channel_prefix, writer_field};
use crate::shared::Shared;
use crate::token::random_hex;

/// What every node's request of one attempt needs, owned, so that requests still in flight
/// once the outcome is decided can be handed to a task (see `InFlight`).
pub(super) struct Req {
    pub(super) key: String,
    /// The value at the key (plain), or the hash field (reentrant).
    pub(super) token: String,
    pub(super) opts: LockOptions,
    pub(super) reentry: bool,
    pub(super) queue: Option<QueueArgs>,
    /// Nobody known to be waiting: a plain SET NX PX, the cheapest grant there is (and no
    /// queue or fence key names to build for it).
    pub(super) plain_set: bool,
    /// Our last release of this key was quiet (see release.lua).
    pub(super) quiet: bool,
    /// A manager that released the key a moment before (see `Contention::looping`).
    pub(super) looping: bool,
    pub(super) fence_mode: &'static str,
    /// Fence, queue, queue leases, queue join times: empty for a plain SET.
    pub(super) names: KeyNames,
    /// Plain locks with a queue: where the script tells the next waiter that the lock is free.
    pub(super) wake_prefix: String,
    /// Filled (one slot per node) only when a node answers busy: a grant allocates nothing.
    pub(super) hints: Mutex<Vec<Option<i64>>>,
    /// A counted grant's hold id (see `scripts::hold_key`), new to this attempt and the same
    /// on its re-sends; the lock keeps it for its release and renewals. Empty otherwise.
    pub(super) call: String,
    /// With several nodes: which nodes' requests of this attempt may still be sent (again).
    /// A won grant's release waits for it on each node (see `Sending`).
    pub(super) sending: Option<Arc<Sending>>,
}

/// Which nodes' acquire requests of one attempt may still go out: a request whose connection
/// dropped is sent again on a new connection (`Node::resend`), and so is every other request
/// that was in flight on the old one, in no set order. A release sent while a slower node's
/// acquire was still in flight there ran after it on the old connection, but its re-send
/// could run before the acquire's, which then found the key free and granted it afresh to a
/// lock already released: nobody released or renewed that grant, and it held the node for its
/// whole ttl (found by a review). So a won grant's release on a node goes out only once that
/// node's acquire has its answer (or was dropped: then it is never sent again), as a lost
/// attempt's undo does (`undo_late`).
pub(crate) struct Sending(watch::Sender<Vec<bool>>);

impl Sending {
    fn new(n: usize) -> Arc<Sending> {
        Arc::new(Sending(watch::Sender::new(vec![true; n])))
    }

    fn done(&self, i: usize) {
        self.0
            .send_if_modified(|v| std::mem::replace(&mut v[i], false));
    }

    /// Once node `i`'s acquire request can no longer be sent (again).
    pub(crate) async fn settled(&self, i: usize) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|v| !v.get(i).copied().unwrap_or(false)).await;
    }
}

/// Marks node `i`'s request done when its future ends, answered or dropped.
struct Settle(Option<Arc<Sending>>, usize);

impl Drop for Settle {
    fn drop(&mut self) {
        if let Some(s) = &self.0 {
            s.done(self.1);
        }
    }
}

impl Req {
    pub(super) fn new(
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
        let kind = Kind::of(opts);
        let plain_set = !kind.counted() && !fencing && queue.is_none() && !seen.contended;
        let (names, wake_prefix) = if plain_set {
            Default::default()
        } else if kind.counted() {
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
            call: if kind.counted() {
                random_hex()
            } else {
                String::new()
            },
            sending: (shared.cluster.nodes.len() > 1)
                .then(|| Sending::new(shared.cluster.nodes.len())),
        }
    }

    pub(super) fn fencing(&self) -> bool {
        self.opts.fencing && !self.reentry
    }
}

/// The result of one attempt, as decided. A lost one has been undone already on the nodes that
/// answered (the rest are undone in the background); a won one belongs to the caller, who
/// makes it a `Lock` at once (no await in between).
pub(super) struct Outcome {
    pub(super) won: bool,
    /// Sent through the waiter queue (not a plain `SET NX`) by a manager that released the key
    /// a moment before (see `Contention::looping`).
    pub(super) looping: bool,
    pub(super) tally: Tally,
    /// Per node: ms until a re-check is worth it, from a busy answer (-1: no TTL).
    pub(super) hints: Vec<Option<i64>>,
    pub(super) started: Instant,
    pub(super) deadline: Instant,
    pub(super) fence: Option<u64>,
    /// Why a grant on a quorum was not kept.
    pub(super) spoiled: Option<Spoiled>,
    /// A won grant sent to a blocking caller through a channel: undone unless claimed.
    pub(super) claim: Option<Claim>,
    /// A lost one with nodes that had not answered when it was decided: which nodes' wake-ups
    /// count, as their answers come in (see `undo_late`).
    pub(super) late: Option<watch::Receiver<Vec<bool>>>,
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

/// Runs one attempt inline: no task and no channel on the hot path. Requests still in flight
/// once the outcome is decided go on in a task (see `InFlight`). A blocking caller with
/// several nodes still runs the attempt as a task on the manager's runtime, on the shared
/// connections, so that slower nodes do not hold its thread once the quorum has answered
/// (see DESIGN.md, "Blocking callers"); a won outcome then carries a `Claim`.
pub(super) async fn run_attempt(shared: &Arc<Shared>, req: Req) -> Result<(Outcome, Arc<Req>)> {
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
    let mut outcome = outcome.ok_or_else(|| {
        Error::new(
            ErrorKind::Redis,
            "acquire task ended without an outcome (runtime shutting down?)",
        )
    })?;
    if outcome.won && Instant::now() >= crate::lock::grant_cutoff(&req.opts, outcome.deadline) {
        // A won outcome read only after its loss margin began (the blocking caller's thread
        // was held between two polls: a binding's check, a signal handler) is no grant, as
        // one heard then in the attempt is not: handed out, its validity had ended. Its
        // `Claim`, dropped unclaimed, gives it back.
        outcome.won = false;
        outcome.spoiled = Some(Spoiled::TooLate);
        outcome.claim = None;
        outcome.hints.resize(shared.cluster.nodes.len(), None);
    }
    Ok((outcome, req))
}

/// Waits until the attempt is decided, or lost unless a silent node says yes (see
/// `FanOut::lost_unless_silent_answer`), or until a node that refused it has since published
/// a release (a head's attempt only, which carries its queue's wake-ups). An attempt that
/// release raced (node 0 released and woke us, node 1 had not yet) is otherwise left to be
/// decided by the nodes still unanswered, and a paused one decides it only at its timeout.
/// Given up, it is lost like any other: undone where granted, and sent again at once, since
/// the refusing node's wake-up counts.
pub(super) async fn until_decided_or_refuser_woke<R>(
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

/// One attempt on every node. Returns the outcome, or with `report` (run as a task), sends it
/// there: a won grant nobody claims is then undone once every node has answered (`Claim`).
pub(super) async fn attempt(
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
    // One node, inline: a dropped request leaves nothing to hand on (one already handed to
    // its connection is still written), and its undo (a compare-and-delete) and a second
    // dequeue of its place (`InFlight`) may go to the node whether or not the request ran.
    // A re-entry goes through the owned fan-out, whose answer a task can still wait for: its
    // undo (a decrement gated on its mark) then goes out only once its request has an answer.
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
                    let settle = Settle(req.sending.clone(), i);
                    let ask = ask(shared.clone(), req.clone(), i, deadline);
                    async move {
                        let _settle = settle;
                        ask.await
                    }
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
    if let Some(hook) = crate::hooks::off_thread(crate::hooks::Point::Answered, &req.key) {
        // An await where there was none: dropped here, what was granted is undone by what
        // the answers say (not "nothing known", which never undoes a re-entry).
        if run.requests.is_none() {
            run.answered = Some(undo_mask(&tally));
        }
        let _ = hook.await;
    }
    let mut fence = None;
    let mut spoiled = None;
    if tally.won() && fencing {
        let seen = u64::try_from(tally.max_yes_value()).unwrap_or(0);
        if n == 1 {
            fence = Some(seen);
        } else {
            if run.requests.is_none() {
                run.answered = Some(undo_mask(&tally));
            }
            let next = seen + 1;
            // A writer's grant is its `:write` field.
            let writer = (Kind::of(opts) == Kind::Write).then(|| writer_field(&req.token));
            let raise = RaiseFence {
                key: &req.key,
                fence_key: &req.names.fence,
                token: writer.as_deref().unwrap_or(&req.token),
                fence: next,
                reentrant: Kind::of(opts).counted(),
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
    if tally.won()
        && spoiled.is_none()
        && Instant::now() >= crate::lock::grant_cutoff(opts, deadline)
    {
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
        let mask = undo_mask(&outcome.tally);
        // A receiver already gone drops the outcome here, and its `Claim` leaves the undo to
        // us below.
        let caller_gone = report.send(outcome).is_err();
        if let Some(hook) = shared.waiters.attempt_hook(|h| &h.won_reported) {
            hook(&req.key).await;
        }
        let mask = match run.requests.as_mut() {
            Some(requests) => {
                while requests.next().await {}
                undo_mask(&requests.tally())
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
        if caller_gone {
            requeued_after_cancel(&shared, &req).await;
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
    let now = undo_now_mask(&tally);
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
            if report.send(outcome).is_err() {
                requeued_after_cancel(&shared, &req).await;
            }
            None
        }
    }
}

/// A task's attempt whose caller went away (cancelled) while it ran: it may have reached a
/// node after the caller's ticket dequeued the place, and queued it again there.
async fn requeued_after_cancel(shared: &Shared, req: &Req) {
    if let Some(place) = &req.queue {
        shared.waiters.dequeue_if_abandoned(&req.key, place).await;
    }
}

/// Why a raise that did not reach a quorum failed: an error reply (an ACL denial, say) is the
/// cause when there is one; otherwise timeouts, or the grant was no longer ours there.
pub(super) fn raise_failure(shared: &Shared, raised: &Tally) -> Spoiled {
    let error = raised
        .answers
        .iter()
        .enumerate()
        .find_map(|(i, a)| match a {
            Answer::Failed(e @ (NodeError::Redis(_) | NodeError::Refused(..))) => {
                Some((i, e.clone()))
            }
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
