//! The restart guard on a node that is a whole Redis Cluster, kept per slot range.
//!
//! A standalone node's guard holds back the whole node's vote after it restarted (it may have
//! forgotten locks it granted). In a cluster the same loss comes from a failover: a replica
//! promoted before it received the lock's write serves the slot without the key. So the guard
//! remembers the topology this process last saw, and when a slot's primary changes it asks
//! where the new one came from:
//! - it was not a primary then (one of the range's replicas, promoted; or a node this process
//!   never saw, which it cannot tell from one): a failover; the slots it took over are held
//!   back for the window from the moment it is seen;
//! - it was already a primary: a migration (MIGRATE moves keys with their ttl); not held back.
//!
//! And, as on a standalone node, a primary whose run_id changed restarted under us, and a
//! primary first seen with an uptime below the window may have restarted just before: their
//! ranges are held back too. So is a primary whose replication id (`master_replid`) changed
//! since it was last probed: Redis draws a new one whenever a node is promoted and takes its
//! primary's on a full resync, never on a slot migration. A fail-back (A fails over to its
//! replica A', resyncs from it as its replica, then takes its slots back) returns the same
//! node id and run_id, possibly without locks A granted before; only the replication id
//! tells. (It also changes when a primary without a replication backlog gets its first
//! replica, or frees its backlog after `repl-backlog-ttl` without replicas: the range is
//! then held back for nothing, the safe side.)
//!
//! Redis-rs follows failovers silently (it refreshes its slot map and sends again), so the
//! change is seen where it matters: after each acquire on a guarded cluster, a probe
//! (`CLUSTER MYID`, `INFO server`, `INFO replication`) goes to the primary now serving the key's
//! slot. Sent after
//! the reply, it cannot miss a failover that the request followed; it may see one that
//! happened just after, and then holds back a vote that would have counted (the safe side).
//! The cost is one round trip per acquire, only with the guard on. When a connection opens,
//! every primary of the topology is probed once (`probe_primaries`), so that one this process
//! saw but never used is known too: a fail-back to it is then caught like any other.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use redis::{RedisResult, Value};

use crate::node_cluster::SlotMap;
use crate::restart_guard::Hold;

/// What one process knows of a cluster for its restart guard.
#[derive(Debug, Default)]
pub(crate) struct SlotGuard {
    /// The topology last seen; `None` before the first connection.
    topology: Option<SlotMap>,
    /// Each primary's run_id and replication id when last probed, by node id.
    seen: HashMap<String, (String, String)>,
    /// Slot ranges whose votes do not count until their hold has lasted the window.
    held: Vec<(u16, u16, Hold)>,
}

/// Which primary answered a probe of one slot, since when it runs, and which replication
/// history its data comes from.
#[derive(Debug, Clone)]
pub(crate) struct Probe {
    pub node_id: String,
    pub run_id: String,
    pub uptime_s: u64,
    /// `master_replid`: new on every promotion, taken from the primary on a full resync.
    pub replid: String,
}

impl SlotGuard {
    /// Takes in a topology just read: every range whose primary changed since the last one
    /// seen to a node that was not a primary then is held back for the window from `now`. Returns the
    /// ranges newly held (for the log).
    pub fn observe(&mut self, new: SlotMap, now: Instant) -> Vec<(u16, u16)> {
        let mut newly = Vec::new();
        if let Some(old) = &self.topology {
            for range in &new.ranges {
                if old.ranges.iter().any(|r| r.primary == range.primary) {
                    continue;
                }
                for before in &old.ranges {
                    let (first, last) =
                        (range.first.max(before.first), range.last.min(before.last));
                    if first <= last {
                        newly.push((first, last));
                    }
                }
            }
        }
        for &(first, last) in &newly {
            self.hold(
                first,
                last,
                Hold {
                    seen: now,
                    up: Duration::ZERO,
                },
            );
        }
        self.topology = Some(new);
        newly
    }

    /// Whether the last topology seen has `node_id` serving `slot` (else the caller reads the
    /// topology again and `observe`s it).
    pub fn serves(&self, slot: u16, node_id: &str) -> bool {
        self.topology
            .as_ref()
            .and_then(|t| t.primary_of(slot))
            .is_some_and(|p| p == node_id)
    }

    /// Takes in a probe of `slot`, once the topology has been observed: a primary that still
    /// does not serve the slot in it (the map moved on again meanwhile) holds the slot back;
    /// a restart of the primary (its run_id changed, or first seen with an uptime below the
    /// window) or a change of its data's history since it was last probed (its replication
    /// id changed: promoted, or resynced in full, as in a fail-back) holds back its ranges.
    /// Returns the instant until which `slot` is held, if it is.
    pub fn probed(
        &mut self,
        slot: u16,
        probe: &Probe,
        now: Instant,
        window: Duration,
    ) -> Option<Instant> {
        let restarted = Hold {
            seen: now,
            up: Duration::ZERO,
        };
        if !self.serves(slot, &probe.node_id) {
            self.hold(slot, slot, restarted);
        }
        let hold = match self.seen.get(&probe.node_id) {
            Some((run_id, replid)) if *run_id == probe.run_id && *replid == probe.replid => None,
            Some(_) => Some(restarted),
            // As on a standalone node: INFO's uptime overstates the real one by up to 1 s.
            None => Some(Hold {
                seen: now,
                up: Duration::from_secs(probe.uptime_s.saturating_sub(1)),
            }),
        };
        self.seen.insert(
            probe.node_id.clone(),
            (probe.run_id.clone(), probe.replid.clone()),
        );
        if let Some(hold) = hold {
            let ranges: Vec<(u16, u16)> = self
                .topology
                .iter()
                .flat_map(|t| &t.ranges)
                .filter(|r| r.primary == probe.node_id)
                .map(|r| (r.first, r.last))
                .collect();
            for (first, last) in ranges {
                self.hold(first, last, hold);
            }
            self.hold(slot, slot, hold);
        }
        self.held_until(slot, now, window)
    }

    /// Until when `slot`'s votes are held back, if they are.
    pub fn held_until(&self, slot: u16, now: Instant, window: Duration) -> Option<Instant> {
        self.held
            .iter()
            .filter(|&&(first, last, _)| first <= slot && slot <= last)
            .map(|(_, _, hold)| hold.until(window))
            .filter(|&until| until > now)
            .max()
    }

    /// Kept until no window could hold it back: the window may grow (see `restart_guard.rs`).
    /// One per range: the latest start (a range that fails over again and again, or whose
    /// primary never shows as serving it, would otherwise pile up holds for weeks).
    fn hold(&mut self, first: u16, last: u16, hold: Hold) {
        let now = Instant::now();
        let same = |f: &u16, l: &u16| (*f, *l) == (first, last);
        if self
            .held
            .iter()
            .any(|(f, l, h)| same(f, l) && !h.started_before(&hold))
        {
            return;
        }
        self.held.retain(|(f, l, h)| !h.over(now) && !same(f, l));
        if !hold.over(now) {
            self.held.push((first, last, hold));
        }
    }
}

/// Asks the primary now serving `slot` who it is, since when it runs and its replication id
/// (one pipeline; two INFOs, since INFO takes one section before Redis 7.0).
pub(crate) async fn probe(conn: &mut ClusterConnection, slot: u16) -> RedisResult<Probe> {
    let mut pipe = redis::pipe();
    pipe.cmd("CLUSTER")
        .arg("MYID")
        .cmd("INFO")
        .arg("server")
        .cmd("INFO")
        .arg("replication");
    let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
    let replies = conn.route_pipeline(pipe, 0, 3, route).await?;
    let text = |v: Option<&Value>| -> RedisResult<String> {
        match v {
            // An error reply (an ACL denial) as itself, not as a reply of the wrong type.
            Some(Value::ServerError(e)) => Err(e.clone().into()),
            Some(v) => Ok(redis::from_redis_value_ref(v)?),
            None => Err(redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "short reply to the restart guard's probe",
            ))),
        }
    };
    let node_id = text(replies.first())?;
    let info = text(replies.get(1))? + &text(replies.get(2))?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
            .map(|v| v.trim().to_string())
    };
    Ok(Probe {
        node_id,
        run_id: field("run_id").unwrap_or_default(),
        uptime_s: field("uptime_in_seconds")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        replid: field("master_replid").unwrap_or_default(),
    })
}

/// Probes every primary of `topology` once, all at once: read when a connection opens, so a
/// primary this process saw but has not used yet is known by its run_id and replication id
/// from then on (a later fail-back to it is caught). Returns each answered probe with the
/// slot it was routed by; a probe that fails is left out (the one after an acquire asks).
pub(crate) async fn probe_primaries(
    conn: &ClusterConnection,
    topology: &SlotMap,
) -> Vec<(u16, Probe)> {
    let mut primaries: Vec<(&str, u16)> = Vec::new();
    for r in &topology.ranges {
        if !primaries.iter().any(|(id, _)| *id == r.primary) {
            primaries.push((&r.primary, r.first));
        }
    }
    let probes = primaries.into_iter().map(|(_, slot)| {
        let mut conn = conn.clone();
        async move { probe(&mut conn, slot).await.ok().map(|p| (slot, p)) }
    });
    futures::future::join_all(probes)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// Reads the topology from the primary now serving `slot` (it knows it serves it).
pub(crate) async fn read_topology(conn: &mut ClusterConnection, slot: u16) -> RedisResult<SlotMap> {
    SlotMap::read_from(
        conn,
        SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master)),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(ranges: &[(u16, u16, &str)]) -> SlotMap {
        SlotMap::of(ranges)
    }

    const W: Duration = Duration::from_secs(10);

    fn start() -> (SlotGuard, Instant) {
        let mut g = SlotGuard::default();
        let now = Instant::now();
        let first = map(&[(0, 8191, "a"), (8192, 16383, "b")]);
        assert!(g.observe(first, now).is_empty(), "nothing to compare with");
        (g, now)
    }

    #[test]
    fn a_replica_promoted_holds_back_only_the_slots_it_took_over() {
        let (mut g, now) = start();
        let after = map(&[(0, 8191, "a1"), (8192, 16383, "b")]);
        assert_eq!(g.observe(after, now), [(0, 8191)]);
        assert_eq!(g.held_until(0, now, W), Some(now + W));
        assert_eq!(g.held_until(8191, now, W), Some(now + W));
        assert_eq!(g.held_until(8192, now, W), None);
        assert_eq!(g.held_until(0, now + W, W), None, "only for the window");
        assert_eq!(
            g.held_until(0, now + W, W * 3),
            Some(now + W * 3),
            "a window grown since (a longer lease asked for) holds it back longer"
        );
    }

    #[test]
    fn a_migration_to_an_existing_primary_is_not_held_back() {
        let (mut g, now) = start();
        let after = map(&[
            (0, 99, "a"),
            (100, 199, "b"),
            (200, 8191, "a"),
            (8192, 16383, "b"),
        ]);
        assert!(g.observe(after, now).is_empty());
        assert_eq!(g.held_until(150, now, W), None);
    }

    #[test]
    fn a_primary_never_seen_counts_as_a_failover() {
        let (mut g, now) = start();
        let after = map(&[(0, 8191, "a"), (8192, 16383, "z")]);
        assert_eq!(g.observe(after, now), [(8192, 16383)]);
    }

    #[test]
    fn probes_hold_back_a_restarted_primary_and_a_young_one() {
        let (mut g, now) = start();
        let probe = |id: &str, run: &str, up: u64| Probe {
            node_id: id.into(),
            run_id: run.into(),
            uptime_s: up,
            replid: "h1".into(),
        };
        assert!(g.serves(5, "a") && !g.serves(5, "b"));
        // First seen, up for long: not held; up 4 s: held for the rest of the window.
        assert_eq!(g.probed(5, &probe("a", "r1", 3600), now, W), None);
        // Up for an hour: not held by a window of 10 s, held by one grown to two hours.
        let two_hours = Duration::from_secs(7200);
        assert_eq!(
            g.held_until(5, now, two_hours),
            Some(now + two_hours - Duration::from_secs(3599))
        );
        let young = g.probed(9000, &probe("b", "s1", 4), now, W);
        assert_eq!(young, Some(now + W - Duration::from_secs(3)));
        // The same run again: nothing new. A new run_id on `a`: its whole range held back.
        assert_eq!(g.probed(5, &probe("a", "r1", 3601), now, W), None);
        assert_eq!(g.probed(7, &probe("a", "r2", 0), now, W), Some(now + W));
        assert_eq!(g.held_until(8000, now, W), Some(now + W));
        // A node answering for a slot the topology gives to another: that slot held back.
        assert_eq!(
            g.probed(9, &probe("b", "s1", 9), now + W, W),
            Some(now + W + W)
        );
        assert_eq!(g.held_until(10, now + W, W), None);
        // Asked again and again, a range keeps one hold (the latest).
        for _ in 0..3 {
            g.probed(9, &probe("b", "s1", 9), now + W, W);
        }
        assert_eq!(g.held.iter().filter(|h| (h.0, h.1) == (9, 9)).count(), 1);
    }

    #[test]
    fn a_primary_whose_replication_id_changed_is_held_back() {
        let (mut g, now) = start();
        let probe = |replid: &str| Probe {
            node_id: "a".into(),
            run_id: "r1".into(),
            uptime_s: 3600,
            replid: replid.into(),
        };
        assert_eq!(g.probed(5, &probe("h1"), now, W), None);
        // Failed over and back: same node, same run, another history.
        assert_eq!(g.probed(5, &probe("h2"), now, W), Some(now + W));
        assert_eq!(g.held_until(8191, now, W), Some(now + W), "its whole range");
        assert_eq!(g.held_until(8192, now, W), None);
        assert_eq!(g.probed(5, &probe("h2"), now + W, W), None, "seen since");
    }
}
