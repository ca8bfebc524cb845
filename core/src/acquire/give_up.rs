//! The errors an acquire ends with when it gives up.

use super::attempt::Spoiled;
use crate::error::Shown;
use crate::error::{Error, ErrorKind};
use crate::options::LockOptions;
use crate::quorum::Tally;
use crate::shared::Shared;

/// How long an acquire that gave up had tried, as its "not acquired …" says it (a lock's and a
/// semaphore's alike).
pub(crate) fn waited(wait: Option<std::time::Duration>) -> String {
    match wait {
        Some(w) if w.is_zero() => "on the first try (wait=0)".to_string(),
        Some(w) => format!("within wait={w:?}"),
        None => "before giving up".to_string(),
    }
}

pub(super) fn unreachable_error(shared: &Shared, key: &str, tally: &Tally) -> Error {
    Error::new(
        ErrorKind::QuorumUnreachable,
        format!(
            "lock {key:?}: quorum unreachable: {} of {} nodes did not answer (need {}): {}",
            tally.unreachable(),
            tally.answers.len(),
            tally.quorum,
            tally.describe_failures(&shared.cluster.nodes),
            key = Shown(key)
        ),
    )
}

pub(super) fn not_acquired_error(
    shared: &Shared,
    key: &str,
    opts: &LockOptions,
    tally: &Tally,
    spoiled: Option<&Spoiled>,
    no_ttl: usize,
) -> Error {
    let waited = waited(opts.wait);
    let why = match spoiled {
        Some(Spoiled::TooLate) => format!(
            "a quorum granted it but the acquire took too long: less than its loss margin \
             ({:?}, twice the node timeout) was left of the validity (ttl {:?} minus drift {:?}), \
             so it was released",
            crate::lock::loss_margin(opts, opts.ttl),
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
             that will never expire (leaked?); `ferrolock inspect` shows what holds it \
             (`ferrolock scan` lists only keys that look like locks)",
            tally.no(),
            tally.answers.len()
        ),
        // Nobody refused: the votes missing are failures (a restart guard holding a node's
        // vote back, a node not answering), which the tail names. "Held on 0 of 3" misled.
        None if tally.no() == 0 => format!(
            "granted on {} of {} nodes (need {})",
            tally.yes(),
            tally.answers.len(),
            tally.quorum
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
        format!(
            "lock {key:?} not acquired {waited}: {why}{tail}",
            key = Shown(key)
        ),
    )
}
