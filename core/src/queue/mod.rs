//! The waiter protocol, client side (see DESIGN.md, "Waiters", "Waiter queue" and "Quiet
//! streaks"; the server side is `queue.lua`, prepended to the scripts that touch the queue):
//!
//! - `waiters`: the local queue of each key and the pub/sub wake-ups that drive its head;
//! - `sharded`: those wake-ups over sharded pub/sub on a Redis Cluster;
//! - the barging bound and the quiet grace (below), which the scripts apply;
//! - `quiet`: the flush of quiet releases a worker did not take back;
//! - `contention`: what a manager remembers of other contenders on each key, which picks a
//!   first attempt's form (plain `SET NX PX`, or through the queue) and a release's (quiet or
//!   not).
//!
//! It works on the manager's `Cluster` (nodes, runtime handle) and its own settings; it
//! knows nothing of locks or of the manager.

use std::time::Duration;

mod contention;
mod quiet;
mod sharded;
mod waiters;

pub(crate) use contention::Memory;
pub(crate) use quiet::flush;
pub(crate) use waiters::{
    Hook, QueueArgs, Role, Ticket, Waiters, WakeSources, Woken, queue_channel,
};

/// Bounded barging (see DESIGN.md, "Waiter queue"): while the head of the server queue has
/// been queued for less than this (server clock), a free lock goes to whoever asks first
/// (usually the process that just released it, one round trip after its release), which saves
/// the cross-process hand-off (publish, pub/sub delivery, wake-up, attempt); past it, only the
/// head may take it. A waiter therefore waits at most about this long (plus `QUIET_GRACE` on
/// one node) plus one section and one hand-off per waiter ahead of it. One node: a longer
/// bound, for a streak of many hot sections per hand-off. N nodes: shorter, as hand-offs cost
/// more there (and releases are never quiet). Measured hand-off times: bench/results.
const BARGE_BOUND_ONE_NODE: Duration = Duration::from_millis(6);
const BARGE_BOUND: Duration = Duration::from_millis(4);

/// Quiet streaks: a release does not tell the first waiter while its barging bound lasts,
/// and the releasing process may take the lock back for this long after the bound (if its
/// last act on the key was such a quiet release): its next attempt arrives a round trip or
/// more after the release, and must not find the lock promised to a head nobody told. The
/// head re-checks by itself once its bound has passed. Counted on the server's whole-ms
/// clock: a quiet release leaves at least one whole tick of the bound, so the real grace is
/// between this and twice this. Also how soon after its release a manager must ask again to
/// count as a worker in a loop (`Contention::looping`).
pub(crate) const QUIET_GRACE: Duration = Duration::from_millis(1);

/// `QUIET_GRACE` in ms, as the scripts take it.
pub fn quiet_grace_ms() -> u64 {
    QUIET_GRACE.as_millis() as u64
}

/// The barging bound in ms, as the scripts take it, for a manager of `nodes` nodes.
pub fn barge_bound_ms(nodes: usize) -> u64 {
    let bound = if nodes == 1 {
        BARGE_BOUND_ONE_NODE
    } else {
        BARGE_BOUND
    };
    bound.as_millis() as u64
}
