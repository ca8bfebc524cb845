//! Fan a request out to every node at once and count the answers against the quorum.

use std::future::Future;

use futures::StreamExt;
use futures::stream::FuturesUnordered;

use crate::node::{Node, NodeError};

/// What each node said. `Pending` nodes had not answered when the outcome was decided.
#[derive(Debug, Clone)]
pub(crate) enum Answer {
    /// Yes, with the value the node returned (a fence counter; 0 when there is none).
    Yes(i64),
    No,
    Failed(NodeError),
    Pending,
}

#[derive(Debug)]
pub(crate) struct Tally {
    pub quorum: usize,
    pub answers: Vec<Answer>,
}

impl Tally {
    pub fn yes(&self) -> usize {
        self.answers
            .iter()
            .filter(|a| matches!(a, Answer::Yes(_)))
            .count()
    }
    pub fn no(&self) -> usize {
        self.answers
            .iter()
            .filter(|a| matches!(a, Answer::No))
            .count()
    }
    /// The largest value among the yes answers (the fence counters seen by the grant).
    pub fn max_yes_value(&self) -> i64 {
        self.answers
            .iter()
            .filter_map(|a| match a {
                Answer::Yes(v) => Some(*v),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }
    pub fn unreachable(&self) -> usize {
        self.answers
            .iter()
            .filter(|a| matches!(a, Answer::Failed(e) if e.is_unreachable()))
            .count()
    }
    pub fn won(&self) -> bool {
        self.yes() >= self.quorum
    }
    /// A majority could not be reached: the nodes that answered cannot form a quorum.
    pub fn quorum_unreachable(&self) -> bool {
        self.answers.len() - self.unreachable() < self.quorum
    }
    /// The first Redis-level error (ACL denial, OOM, ...) when such errors alone sank the quorum.
    pub fn redis_error(&self) -> Option<(usize, &NodeError)> {
        let failed = self
            .answers
            .iter()
            .filter(|a| matches!(a, Answer::Failed(_)))
            .count();
        if self.answers.len() - failed >= self.quorum {
            return None;
        }
        self.answers.iter().enumerate().find_map(|(i, a)| match a {
            Answer::Failed(e @ NodeError::Redis(_)) => Some((i, e)),
            _ => None,
        })
    }
    /// "redis://a:1 (connection refused); redis://b:2 (no reply within 200ms)"
    pub fn describe_failures(&self, nodes: &[Node]) -> String {
        let parts: Vec<String> = self
            .answers
            .iter()
            .zip(nodes)
            .filter_map(|(a, n)| match a {
                Answer::Failed(e) => Some(format!("{} ({})", n.name(), e.detail())),
                _ => None,
            })
            .collect();
        parts.join("; ")
    }
}

/// Maps a yes/no reply to the answer shape `fan_out` counts.
pub(crate) fn yes_if(ok: bool) -> Option<i64> {
    ok.then_some(0)
}

/// Sends `request` to every node concurrently (one round trip in all, not N). With
/// `stop_early`, returns as soon as the outcome is decided (a quorum said yes, or too many
/// said no); the unfinished requests are dropped, but what they already sent stays
/// ordered on each node's connection ahead of anything sent later.
pub(crate) async fn fan_out<'a, F, Fut>(
    nodes: &'a [Node],
    quorum: usize,
    stop_early: bool,
    request: F,
) -> Tally
where
    F: Fn(usize, &'a Node) -> Fut,
    Fut: Future<Output = Result<Option<i64>, NodeError>> + 'a,
{
    let n = nodes.len();
    let mut answers = vec![Answer::Pending; n];
    let mut in_flight: FuturesUnordered<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let fut = request(i, node);
            async move { (i, fut.await) }
        })
        .collect();
    let (mut yes, mut no) = (0, 0);
    while let Some((i, result)) = in_flight.next().await {
        answers[i] = match result {
            Ok(Some(v)) => {
                yes += 1;
                Answer::Yes(v)
            }
            Ok(None) => {
                no += 1;
                Answer::No
            }
            Err(e) => Answer::Failed(e),
        };
        // Stop at a decided outcome: a quorum said yes, or enough said no that it cannot. When
        // failures are involved, wait for every answer (each bounded by the node timeout), so
        // an unreachable majority is told apart from a busy lock.
        if stop_early && (yes >= quorum || no > n - quorum) {
            break;
        }
    }
    Tally { quorum, answers }
}
