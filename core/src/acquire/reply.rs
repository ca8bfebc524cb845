//! The acquire scripts' answers, and when a busy answer says a re-check is worth it.

use std::time::Duration;

use redis::Value;

use crate::error::Result;
use crate::node::NodeError;
use crate::quorum::{Answer, Tally};

/// When a re-check is first worth it: the time after which a quorum of nodes could grant,
/// from each node's answer (a grant: now; busy: the PTTL or queue lease it returned; held
/// back by the restart guard: when its window ends; no answer, or a key without TTL:
/// unknown).
/// A busy answer with no re-check hint (a failed plain SET NX on a key with a TTL).
pub(super) const NO_HINT: i64 = -3;

/// How many nodes answered busy for a holder with no TTL (a leaked lock).
pub(super) fn without_ttl(hints: &[Option<i64>]) -> usize {
    hints.iter().filter(|h| **h == Some(-1)).count()
}

/// `guard_left(i)`: how long the restart guard still holds back node `i`'s vote.
pub(super) fn wake_hint(
    tally: &Tally,
    hints: &[Option<i64>],
    guard_left: impl Fn(usize) -> Option<Duration>,
) -> Option<Duration> {
    let mut at: Vec<u64> = tally
        .answers
        .iter()
        .zip(hints)
        .enumerate()
        .map(|(i, (a, h))| match a {
            Answer::Yes(_) => 0,
            Answer::No => h.filter(|&h| h >= 0).map_or(u64::MAX, |h| h as u64),
            // Held back by the restart guard (the request was not sent): it may grant once its
            // window ends, which nothing publishes.
            Answer::Failed(NodeError::Guarded(_)) => {
                guard_left(i).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            }
            _ => u64::MAX,
        })
        .collect();
    at.sort_unstable();
    let ms = *at.get(tally.quorum.checked_sub(1)?)?;
    (ms != u64::MAX).then(|| Duration::from_millis(ms + 1))
}

pub(super) enum Reply {
    /// With the fence counter when the script sent one.
    Granted(Option<i64>),
    /// The re-check hint.
    Busy(i64),
}

/// nil: granted; {counter}: granted with the fence counter; an integer: busy, with the ms
/// after which a re-check is worth it.
pub(super) fn parse_reply(v: Value) -> Result<Reply, NodeError> {
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
