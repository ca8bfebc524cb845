//! The undo of nodes a lost attempt did not wait for, each once its answer is in.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;

use super::attempt::Req;
use super::undo::undo_one;
use crate::error::Result;
use crate::node::NodeError;
use crate::quorum::{Answer, FanOut, Tally};
use crate::shared::Shared;

/// Undoes, in the background and each exactly once, what the nodes that had not answered a
/// lost attempt when it was decided may hold: each once its reply is in (a grant), or at once
/// if it timed out or failed (unknown). Compare-and-delete (or a re-entry's decrement gated on
/// its mark), on the connection the request went out on.
/// Returns, when some node had not answered, which nodes' wake-ups count for the waiter as
/// their answers come in: a node that answers with anything but a grant (or an undo) starts
/// to count (see `WakeSources`).
pub(super) fn undo_late<R>(
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
                    // Unknown: undone all the same (a re-entry's undo takes a count only with
                    // its mark, so where it never ran it takes nothing).
                    Answer::Failed(_) => true,
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
pub(super) fn wakes_us(answer: &Answer) -> bool {
    match answer {
        Answer::No => true,
        Answer::Failed(e) => !matches!(e, NodeError::HeldBack(_)),
        Answer::Yes(_) | Answer::Pending => false,
    }
}

/// A node whose answer a lost attempt did not wait for, or never got: pending, or failed
/// without a reply (timed out, connection lost).
pub(super) fn is_late(answer: &Answer) -> bool {
    matches!(
        answer,
        Answer::Pending | Answer::Failed(NodeError::Unreachable(_))
    )
}
