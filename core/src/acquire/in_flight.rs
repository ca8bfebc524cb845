//! An attempt's requests still in flight when it stops: handed to a task, and undone unless won.

use std::future::Future;
use std::sync::Arc;

use super::attempt::Req;
use super::late::{is_late, undo_late};
use super::undo::{undo_detached, undo_mask};
use crate::error::Result;
use crate::node::NodeError;
use crate::quorum::FanOut;
use crate::shared::Shared;

/// What becomes of an attempt's requests still in flight when it is dropped.
pub(super) enum Then {
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
pub(super) struct InFlight<R>
where
    R: Future<Output = (usize, Result<Option<i64>, NodeError>)> + Send + 'static,
{
    pub(super) shared: Arc<Shared>,
    pub(super) req: Arc<Req>,
    pub(super) requests: Option<FanOut<R>>,
    /// Where the grant may be held, when every node had answered before a last await (the
    /// fence raise) and `requests` is gone.
    pub(super) answered: Option<Vec<bool>>,
    pub(super) then: Then,
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
            // Whether a request may have gone out after the dequeue of a caller that went
            // away. (A won attempt's slower requests were polled before its ticket left, so
            // they are written first on the shared connection: no second dequeue for them.)
            let sent_late = undo && (requests.is_some() || answered.is_none());
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
                    let mut mask = undo_mask(&tally);
                    for (m, answer) in mask.iter_mut().zip(&tally.answers) {
                        *m &= !is_late(answer);
                    }
                    undo_late(&shared, &req, Some(requests), &tally);
                    mask
                }
                (Some(mut requests), _) => {
                    while requests.next().await {}
                    undo_mask(&requests.tally())
                }
                (None, Some(mask)) => mask,
                // One node, inline (never a re-entry: see `attempt`): nothing is known.
                (None, None) => vec![true; shared.cluster.nodes.len()],
            };
            if undo && mask.contains(&true) {
                undo_detached(&shared, &req, mask, true).finish().await;
            }
            // After the undo: a read or write lock's undo puts the place back while someone
            // here still waits, and may have seen them before they left.
            if let Some(place) = req.queue.as_ref().filter(|_| sent_late) {
                shared.waiters.dequeue_if_abandoned(&req.key, place).await;
            }
        });
    }
}
