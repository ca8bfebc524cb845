//! Fan a request out to every node at once and count the answers against the quorum.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::FutureExt;

use std::time::Duration;

use tokio::time::{Instant, Sleep};

use crate::node::{Node, NodeError, timed_out};

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
    /// A migrating slot's redirect is not one: it passes (see `migrating`).
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
            Answer::Failed(e @ (NodeError::Redis(_) | NodeError::Refused(..))) => Some((i, e)),
            _ => None,
        })
    }
    /// The first node that answered a release (or any request) with an error reply.
    pub fn first_error_reply(&self) -> Option<(usize, &NodeError)> {
        self.answers.iter().enumerate().find_map(|(i, a)| match a {
            Answer::Failed(e) if e.is_reply() => Some((i, e)),
            _ => None,
        })
    }
    /// Whether a node's slot was migrating (nothing ran there): worth trying again soon.
    pub fn migrating(&self) -> bool {
        self.answers
            .iter()
            .any(|a| matches!(a, Answer::Failed(NodeError::Migrating(_))))
    }

    /// A release's answers, each kind kept apart: "released on 1 of 4 nodes (redis://a); not
    /// ours (expired or taken) on redis://b; error on redis://c: NOPERM ...; no answer from
    /// redis://d (no reply within 2s)". Kinds no node gave are left out.
    pub fn describe_release(&self, nodes: &[Node]) -> String {
        let names = |pick: &dyn Fn(&Answer) -> Option<String>| -> Vec<String> {
            self.answers
                .iter()
                .zip(nodes)
                .filter_map(|(a, n)| pick(a).map(|d| format!("{}{d}", n.name())))
                .collect()
        };
        let released = names(&|a| matches!(a, Answer::Yes(_)).then(String::new));
        let mut parts = vec![format!(
            "released on {} of {} nodes{}",
            released.len(),
            self.answers.len(),
            if released.is_empty() {
                String::new()
            } else {
                format!(" ({})", released.join(", "))
            }
        )];
        // Nodes with nothing more to say share a label; an error or a failure is one part
        // per node, each with its own label, as its text may hold any punctuation.
        let mut add = |label: &str, list: Vec<String>, each: bool| {
            if each {
                parts.extend(list.iter().map(|d| format!("{label} {d}")));
            } else if !list.is_empty() {
                parts.push(format!("{label} {}", list.join(", ")));
            }
        };
        add(
            "not ours (expired or taken) on",
            names(&|a| matches!(a, Answer::No).then(String::new)),
            false,
        );
        add(
            "error on",
            names(&|a| match a {
                Answer::Failed(e) if e.is_reply() => Some(format!(": {}", e.detail())),
                _ => None,
            }),
            true,
        );
        add(
            "no answer from",
            names(&|a| match a {
                Answer::Failed(
                    e
                    @ (NodeError::Unreachable(_) | NodeError::Guarded(_) | NodeError::HeldBack(_)),
                ) => Some(format!(" ({})", e.detail())),
                _ => None,
            }),
            true,
        );
        add(
            "no answer yet (finishing in the background) from",
            names(&|a| matches!(a, Answer::Pending).then(String::new)),
            false,
        );
        parts.join("; ")
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

    /// A renewal's or an extend's failures, and the nodes where our token is gone (a node
    /// that restarted without persistence, say): both kinds kept the quorum from forming.
    pub fn describe_renewal_failures(&self, nodes: &[Node]) -> String {
        let gone: Vec<&str> = self
            .answers
            .iter()
            .zip(nodes)
            .filter(|(a, _)| matches!(a, Answer::No))
            .map(|(_, n)| n.name())
            .collect();
        let failures = self.describe_failures(nodes);
        match gone.is_empty() {
            true => failures,
            false => format!(
                "{failures}; our token is gone (deleted, expired, or taken) on {}",
                gone.join(", ")
            ),
        }
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
///
/// `request(i, node, deadline)` must give up once polled at or after `deadline` (now +
/// `timeout`), as `Node::run_bounded` does: the fan-out wakes it then.
pub(crate) async fn fan_out<'a, F, Fut>(
    nodes: &'a [Node],
    quorum: usize,
    timeout: Duration,
    stop_early: bool,
    request: F,
) -> Tally
where
    F: Fn(usize, &'a Node, Instant) -> Fut,
    Fut: Future<Output = Result<Option<i64>, NodeError>> + 'a,
{
    if let [node] = nodes {
        // One node: no set of futures to build and poll.
        let deadline = Instant::now() + timeout;
        let answer = match tokio::time::timeout_at(deadline, request(0, node, deadline)).await {
            Err(_) => Answer::Failed(timed_out(timeout)),
            Ok(Ok(Some(v))) => Answer::Yes(v),
            Ok(Ok(None)) => Answer::No,
            Ok(Err(e)) => Answer::Failed(e),
        };
        return Tally {
            quorum,
            answers: vec![answer],
        };
    }
    let mut requests = FanOut::start(nodes, quorum, timeout, request);
    if stop_early {
        requests.until_decided().await;
    } else {
        while requests.next().await {}
    }
    requests.into_tally()
}

/// A fan-out whose answers can be taken in two steps: until the outcome is decided, then the
/// rest. Used by acquire attempts, which report as soon as the outcome is decided but keep
/// driving the slower nodes (a request still waiting for its node's connection has not been
/// sent yet: dropping it would leave that node without the key, or unable to be undone).
///
/// The requests live in one pinned slice and every unfinished one is polled on each wake, as
/// `join_all` does for small sets. Not a `FuturesUnordered`: that one wakes its own task
/// whenever it has polled every future in the set once (futures-rs #2333), which with a
/// handful of nodes is on nearly every poll, and costs the runtime an extra turn (an extra
/// `epoll_wait`) per request. A node count is small; polling the few unfinished requests
/// that were not woken is cheaper than that turn.
pub(crate) struct FanOut<R> {
    /// When every request still unanswered gives up (polled then, it fails).
    deadline: Instant,
    /// Wakes the fan-out at the deadline: one timer for every node's request.
    timer: Option<Pin<Box<Sleep>>>,
    answers: Vec<Answer>,
    quorum: usize,
    yes: usize,
    no: usize,
    /// `None` once that request has answered.
    in_flight: Pin<Box<[Option<R>]>>,
    /// Requests that have not answered yet.
    left: usize,
}

impl FanOut<()> {
    #[allow(clippy::new_ret_no_self)]
    pub(crate) fn start<'a, F, Fut>(
        nodes: &'a [Node],
        quorum: usize,
        timeout: Duration,
        request: F,
    ) -> FanOut<impl Future<Output = (usize, Result<Option<i64>, NodeError>)> + 'a>
    where
        F: Fn(usize, &'a Node, Instant) -> Fut,
        Fut: Future<Output = Result<Option<i64>, NodeError>> + 'a,
    {
        let deadline = Instant::now() + timeout;
        let in_flight: Box<[_]> = nodes
            .iter()
            .enumerate()
            .map(|(i, node)| Some(request(i, node, deadline).map(tag(i))))
            .collect();
        FanOut {
            deadline,
            timer: None,
            answers: vec![Answer::Pending; nodes.len()],
            quorum,
            yes: 0,
            no: 0,
            in_flight: Box::into_pin(in_flight),
            left: nodes.len(),
        }
    }
}

impl FanOut<()> {
    /// As `start`, for requests that own what they use (`request(i)` asks node `i` of
    /// `nodes`), so that the unfinished ones can be handed to a task.
    pub(crate) fn start_owned<F, Fut>(
        nodes: usize,
        quorum: usize,
        timeout: Duration,
        request: F,
    ) -> FanOut<impl Future<Output = (usize, Result<Option<i64>, NodeError>)> + Send + 'static>
    where
        F: Fn(usize, Instant) -> Fut,
        Fut: Future<Output = Result<Option<i64>, NodeError>> + Send + 'static,
    {
        let deadline = Instant::now() + timeout;
        let in_flight: Box<[_]> = (0..nodes)
            .map(|i| Some(request(i, deadline).map(tag(i))))
            .collect();
        FanOut {
            deadline,
            timer: None,
            answers: vec![Answer::Pending; nodes],
            quorum,
            yes: 0,
            no: 0,
            in_flight: Box::into_pin(in_flight),
            left: nodes,
        }
    }
}

impl<R> FanOut<R>
where
    R: Future<Output = (usize, Result<Option<i64>, NodeError>)>,
{
    /// Stop at a decided outcome: a quorum said yes, or enough said no that it cannot. When
    /// failures are involved, wait for every answer (each bounded by the node timeout), so an
    /// unreachable majority is told apart from a busy lock.
    pub(crate) fn decided(&self) -> bool {
        let n = self.answers.len();
        self.yes >= self.quorum || self.no > n - self.quorum
    }

    /// Lost unless a silent node (`Node::is_silent`, asked through `silent(i)`) answers yes in
    /// time: a node refused, every node that is not silent has answered without a quorum of
    /// yes, and the nodes neither silent nor failed could have formed one (so the loss is
    /// contention; an unreachable majority still waits for every answer, to be reported as
    /// such). The nodes that are not silent are waited for, though their answers cannot win
    /// it: a grant among them is then undone before the caller hears, so that its next attempt
    /// does not meet it. A silent node's late answer is dealt with as any unanswered node's.
    pub(crate) fn lost_unless_silent_answer(&self, silent: impl Fn(usize) -> bool) -> bool {
        if self.no == 0 {
            return false;
        }
        let (mut quiet, mut loud, mut failed) = (0, 0, 0);
        for (i, answer) in self.answers.iter().enumerate() {
            match answer {
                Answer::Pending if silent(i) => quiet += 1,
                Answer::Pending => loud += 1,
                Answer::Failed(_) => failed += 1,
                Answer::Yes(_) | Answer::No => {}
            }
        }
        quiet > 0
            && loud == 0
            && self.yes < self.quorum
            && self.answers.len() - quiet - failed >= self.quorum
    }

    /// Whether every node that has not answered yet is one of `these`.
    pub(crate) fn only_pending(&self, these: impl Fn(usize) -> bool) -> bool {
        self.answers
            .iter()
            .enumerate()
            .all(|(i, a)| !matches!(a, Answer::Pending) || these(i))
    }

    pub(crate) fn all_answered(&self) -> bool {
        self.left == 0
    }

    /// Per node: whether it has refused (answered no).
    pub(crate) fn refused(&self) -> Vec<bool> {
        self.answers
            .iter()
            .map(|a| matches!(a, Answer::No))
            .collect()
    }

    pub(crate) async fn until_decided(&mut self) {
        while !self.decided() && self.next().await {}
    }

    /// Takes one or more answers (all that are in); false when every node has answered.
    pub(crate) async fn next(&mut self) -> bool {
        if self.left == 0 {
            return false;
        }
        std::future::poll_fn(|cx| self.poll_answers(cx)).await;
        true
    }

    /// Polls every unfinished request; ready once at least one has answered.
    fn poll_answers(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        // First, so that at the deadline the requests polled below see it has passed.
        let deadline = self.deadline;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        let _ = timer.as_mut().poll(cx);
        let mut answered = false;
        for mut slot in iter_pin_mut(self.in_flight.as_mut()) {
            let Some(request) = slot.as_mut().as_pin_mut() else {
                continue;
            };
            let Poll::Ready((i, result)) = request.poll(cx) else {
                continue;
            };
            // Dropped in place: pinned memory is never moved.
            slot.set(None);
            self.left -= 1;
            answered = true;
            self.answers[i] = match result {
                Ok(Some(v)) => {
                    self.yes += 1;
                    Answer::Yes(v)
                }
                Ok(None) => {
                    self.no += 1;
                    Answer::No
                }
                Err(e) => Answer::Failed(e),
            };
        }
        if answered {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    pub(crate) fn tally(&self) -> Tally {
        Tally {
            quorum: self.quorum,
            answers: self.answers.clone(),
        }
    }

    /// The answers, moved out (no copy).
    pub(crate) fn into_tally(mut self) -> Tally {
        Tally {
            quorum: self.quorum,
            answers: std::mem::take(&mut self.answers),
        }
    }
}

/// Labels a node's answer with its index. A combinator, not `async move { (i, fut.await) }`:
/// an async block keeps the moved-in future and the awaited one as two fields, which doubled
/// the size of every request (and so of every fan-out's allocation).
fn tag<T>(i: usize) -> impl FnOnce(T) -> (usize, T) {
    move |answer| (i, answer)
}

/// The elements of a pinned slice, each pinned.
fn iter_pin_mut<T>(slice: Pin<&mut [T]>) -> impl Iterator<Item = Pin<&mut T>> {
    // SAFETY: the elements of a pinned slice are pinned as well; each is only handed out
    // pinned, and nothing is moved out of the slice.
    unsafe { slice.get_unchecked_mut() }
        .iter_mut()
        .map(|t| unsafe { Pin::new_unchecked(t) })
}
