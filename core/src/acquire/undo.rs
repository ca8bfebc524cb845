//! Undoing a grant exactly once per node (`undo.lua`): where, and the requests that do it.

use std::future::Future;
use std::sync::Arc;

use tokio::time::Instant;

use super::attempt::Req;
use super::kind::Kind;
use crate::error::Result;
use crate::node::{NodeError, latch_px_ms};
use crate::queue::{QueueArgs, barge_bound_ms};
use crate::quorum::{Answer, FanOut, Tally, yes_if};
use crate::scripts::{KeyNames, Latch, ReleaseRead, ReleaseWrite, Undo};
use crate::shared::Shared;
use crate::token::random_hex;

/// Requests that must each run exactly once: driven by their caller, and handed to a task
/// if the caller is dropped first (a request not yet written goes out from the task; one
/// written is not sent again). An undo of a re-entry decrements a hold count: sending it
/// twice would take a count from the outer grant.
pub(super) struct Detached<R>
where
    R: Future<Output = (usize, Result<Option<i64>, NodeError>)> + Send + 'static,
{
    pub(super) shared: Arc<Shared>,
    pub(super) requests: Option<FanOut<R>>,
}

/// The undo of what `req` may hold on the nodes marked in `mask` (see `undo_one`).
pub(super) fn undo_detached(
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
    pub(super) async fn finish(mut self) {
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
pub(super) async fn undo_one(
    shared: &Shared,
    req: &Req,
    i: usize,
    deadline: Instant,
    requeue: bool,
) -> Result<Option<i64>, NodeError> {
    let (key, token, opts) = (req.key.as_str(), req.token.as_str(), &req.opts);
    let timeout = opts.effective_node_timeout();
    let kind = Kind::of(opts);
    let channel = kind.undo_channel(key);
    let names = KeyNames::of(key);
    let queue = req.queue.as_ref().filter(|q| requeue && q.still_waiting());
    // Drawn once for this undo, so that every re-send of it carries the same id.
    let call = random_hex();
    let latch = Latch {
        id: &call,
        px_ms: latch_px_ms(timeout),
    };
    let undo = Undo {
        key,
        names: &names,
        token,
        reentrant: kind.counted(),
        channel: &channel,
        place: queue.map(QueueArgs::place).unwrap_or_default(),
        bound_ms: barge_bound_ms(shared.cluster.nodes.len()),
        latch,
        hold: &req.call,
    };
    if matches!(kind, Kind::Read | Kind::Write) {
        // A read or write grant is undone by its release (one hold fewer, under its latch).
        // While we still wait, `undo.lua` then puts our waiter id back where the grant
        // dequeued it (with a token that matches no hash, it only re-enqueues), so the nodes
        // agree on who waits (the Redlock split-queue livelock otherwise).
        // A latch of its own: the release's would make it answer as run already.
        let requeue_call = random_hex();
        let requeue = queue.is_some().then_some(Undo {
            token: "",
            reentrant: false,
            channel: "",
            latch: Latch {
                id: &requeue_call,
                ..latch
            },
            ..undo
        });
        return undo_rw(shared, kind, &undo, requeue.as_ref(), i, deadline, timeout).await;
    }
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

/// Node `i`'s undo of a read or write grant: its release, then `requeue` (our queue place).
async fn undo_rw(
    shared: &Shared,
    kind: Kind,
    undo: &Undo<'_>,
    requeue: Option<&Undo<'_>>,
    i: usize,
    deadline: Instant,
    timeout: std::time::Duration,
) -> Result<Option<i64>, NodeError> {
    let (key, field, latch, hold) = (undo.key, undo.token, undo.latch, undo.hold);
    shared.cluster.nodes[i]
        .run_bounded(deadline, timeout, false, move |mut conn| async move {
            let sharded = conn.sharded();
            let inv = if kind == Kind::Read {
                ReleaseRead {
                    key,
                    field,
                    latch,
                    hold,
                }
                .invocation(sharded)
            } else {
                ReleaseWrite {
                    key,
                    field,
                    latch,
                    hold,
                }
                .invocation(sharded)
            };
            let left: Option<i64> = inv.invoke_async(&mut conn).await?;
            if let Some(requeue) = requeue {
                let _: i64 = requeue.invocation(sharded).invoke_async(&mut conn).await?;
            }
            Ok(yes_if(left.is_some()))
        })
        .await
}

/// Where to undo a grant once every node has answered: wherever we may hold it (a yes, or an
/// answer we never saw; a node that said no holds nothing of ours). A re-entry too: its undo
/// takes a count only with the mark the re-entry left, so where it never ran it takes nothing.
pub(super) fn undo_mask(tally: &Tally) -> Vec<bool> {
    // A reply the restart guard held back was read first: undone too (a refusal in it left
    // nothing, and an undo then takes nothing).
    tally
        .answers
        .iter()
        .map(|ans| !matches!(ans, Answer::No | Answer::Failed(NodeError::Guarded(_))))
        .collect()
}

/// Where a lost attempt is undone before its caller hears of it: the nodes that answered and
/// may hold our grant (a yes; a grant the restart guard held back; an error reply or a
/// migrating slot's redirect: a redirect after redis-rs re-sent a request whose first send ran
/// leaves that grant, and undoing one that never was is harmless: a compare-and-delete, or a
/// re-entry's decrement gated on its mark). The others are `is_late`, or guarded (nothing sent).
pub(super) fn undo_now_mask(tally: &Tally) -> Vec<bool> {
    tally
        .answers
        .iter()
        .map(|ans| {
            matches!(
                ans,
                Answer::Yes(_)
                    | Answer::Failed(
                        NodeError::HeldBack(_)
                            | NodeError::Redis(_)
                            | NodeError::Refused(..)
                            | NodeError::Migrating(_),
                    )
            )
        })
        .collect()
}
