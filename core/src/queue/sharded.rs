//! Sharded pub/sub wake-ups on a Redis Cluster (7.0+): the waiters' channels carry their key's
//! hash tag, so each is SSUBSCRIBEd on the primary of the key's slot, through redis-rs's routed
//! RESP3 cluster connection (its messages come as push messages), and the scripts SPUBLISH
//! there. A message then reaches that shard only, where classic PUBLISH crosses the whole
//! cluster bus.
//!
//! When a node loses a slot (a migration, a failover), Redis 7.0 tells its sharded subscribers
//! `sunsubscribe` for the slot's channels and redis-rs forgets them. A channel that still has
//! waiters is subscribed again (redis-rs routes it to the slot's new primary), and that
//! confirmation, like any resubscription, wakes the head to re-check: a release published
//! while nobody listened is not missed.
//!
//! A primary that hangs says nothing: no `sunsubscribe`, no dropped connection. So the primary
//! of each slot we listen in is pinged, as the classic connection is, and one that does not
//! answer ends the connection: the next one reads the slot map afresh, and follows a failover.

use std::collections::{HashMap, HashSet};
use std::sync::Weak;

use futures::future::join_all;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{PushInfo, PushKind, RedisResult, Value};
use tokio::sync::mpsc;

use crate::node_cluster::key_slot;

use super::waiters::{IDLE_CLOSE, LINGER, OP_TIMEOUT, OnServer, Plan, Waiters};

/// Runs a sharded pub/sub connection until it is lost (`Some(true)`), idle for `IDLE_CLOSE`
/// (`Some(false)`), or the manager is gone (`None`).
pub(super) async fn run(
    weak: &Weak<Waiters>,
    node: usize,
    signal: &mut mpsc::UnboundedReceiver<()>,
    conn: ClusterConnection,
    mut pushes: mpsc::UnboundedReceiver<PushInfo>,
) -> Option<bool> {
    let mut shard = Shard {
        weak,
        node,
        on_server: OnServer::default(),
        ours: HashMap::new(),
    };
    // When to ping next: a deadline kept across the loop's turns, not a timer started afresh
    // at each (every push and every signal starts a turn, so a connection told something
    // more often than once a `LINGER` never pinged, and stayed on a primary that hung).
    let mut ping_at = tokio::time::Instant::now() + LINGER;
    loop {
        let Plan { add, remove, idle } = shard.on_server.plan(weak, node)?;
        if !remove.is_empty() {
            if !shard.change(&conn, &mut pushes, &remove, false).await.1 {
                return Some(true);
            }
            shard.on_server.removed(&remove);
        }
        if !add.is_empty() {
            let (done, all) = shard.change(&conn, &mut pushes, &add, true).await;
            // Confirmed also when another channel failed (its shard down) and the connection
            // starts over: a release published on a live shard between two tries, while
            // nobody listened, would otherwise tell its waiter nothing (found by a review).
            shard.on_server.added(weak, node, &done);
            if !all {
                return Some(true);
            }
        }
        if !add.is_empty() || !remove.is_empty() {
            continue;
        }
        tokio::select! {
            s = signal.recv() => { s?; }
            p = pushes.recv() => match p {
                Some(p) => if !shard.push(p) { return Some(true) },
                None => return Some(true),
            },
            _ = tokio::time::sleep(IDLE_CLOSE), if idle => return Some(false),
            // Lingering queues end by themselves: look again now and then. And ping: a
            // primary that hangs and is failed over keeps our subscriptions for as long as it
            // hangs, while its replica publishes every release to nobody (found by a review).
            _ = tokio::time::sleep_until(ping_at), if !idle => {
                if !shard.ping(&conn, &mut pushes).await {
                    return Some(true);
                }
                ping_at = tokio::time::Instant::now() + LINGER;
            }
        }
    }
}

struct Shard<'a> {
    weak: &'a Weak<Waiters>,
    node: usize,
    /// The channels we asked for and saw confirmed.
    on_server: OnServer,
    /// Confirmations of our own (un)subscribes still to come as pushes, by (channel,
    /// subscribed): a push that is not one of them came from the server (a lost slot) or from
    /// redis-rs (its resubscription after a reconnect).
    ours: HashMap<(String, bool), u32>,
}

impl Shard<'_> {
    /// SSUBSCRIBEs (`subscribe`) or SUNSUBSCRIBEs `channels`, one command each (redis-rs
    /// routes a command by its first channel, and the channels are in different slots),
    /// handling the pushes that arrive meanwhile. Returns the channels done, and whether all
    /// were (false: the connection is unusable).
    async fn change(
        &mut self,
        conn: &ClusterConnection,
        pushes: &mut mpsc::UnboundedReceiver<PushInfo>,
        channels: &[String],
        subscribe: bool,
    ) -> (Vec<String>, bool) {
        for c in channels {
            *self.ours.entry((c.clone(), subscribe)).or_default() += 1;
        }
        let done = std::sync::Mutex::new(Vec::new());
        let each = join_all(channels.iter().map(|c| {
            let mut conn = conn.clone();
            let done = &done;
            async move {
                let result = if subscribe {
                    conn.ssubscribe(c).await
                } else {
                    conn.sunsubscribe(c).await
                };
                if result.is_ok() {
                    done.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(c.clone());
                }
                result
            }
        }));
        let all = self.all_within(pushes, each, "sharded (un)subscribe").await;
        (done.into_inner().unwrap_or_else(|p| p.into_inner()), all)
    }

    /// PINGs the primary of each slot we listen in (as redis-rs routes it), handling the
    /// pushes that arrive meanwhile. False: one did not answer, or the connection is unusable.
    async fn ping(
        &mut self,
        conn: &ClusterConnection,
        pushes: &mut mpsc::UnboundedReceiver<PushInfo>,
    ) -> bool {
        let mut slots: HashSet<u16> = self.on_server.channels().map(key_slot).collect();
        // One slot per primary, as the command connection's slot map places them: waiters on
        // many keys made a PING per slot, every second, on the same few primaries (found by a
        // review). A map out of date (slots moved since it was read) may leave a primary
        // unpinged until the command connection reads the map again.
        let seen = self
            .weak
            .upgrade()
            .and_then(|w| w.cluster.nodes[self.node].seen());
        if let Some(seen) = seen {
            let mut primaries = HashSet::new();
            slots.retain(|&s| {
                seen.map()
                    .primary_of(s)
                    .is_none_or(|p| primaries.insert(p.to_owned()))
            });
        }
        let each = join_all(slots.into_iter().map(|slot| {
            let mut conn = conn.clone();
            let to = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
            async move {
                conn.route_command(redis::cmd("PING"), RoutingInfo::SingleNode(to))
                    .await
                    .map(drop)
            }
        }));
        self.all_within(pushes, each, "sharded pub/sub ping").await
    }

    /// Waits for `each` within `OP_TIMEOUT`, handling the pushes that arrive meanwhile.
    /// False: one of them failed or did not end in time, or the connection is unusable.
    async fn all_within(
        &mut self,
        pushes: &mut mpsc::UnboundedReceiver<PushInfo>,
        each: impl Future<Output = Vec<RedisResult<()>>>,
        what: &str,
    ) -> bool {
        tokio::pin!(each);
        let timeout = tokio::time::sleep(OP_TIMEOUT);
        tokio::pin!(timeout);
        loop {
            tokio::select! {
                results = &mut each => {
                    let failed = results.into_iter().find_map(|r| r.err());
                    if let (Some(e), Some(s)) = (&failed, self.weak.upgrade()) {
                        let n = &s.cluster.nodes[self.node];
                        tracing::debug!(node = %n.name(), "{what} failed: {}", n.scrub(&e.to_string()));
                    }
                    return failed.is_none();
                }
                p = pushes.recv() => match p {
                    Some(p) => if !self.push(p) { return false },
                    None => return false,
                },
                _ = &mut timeout => {
                    if let Some(s) = self.weak.upgrade() {
                        let n = &s.cluster.nodes[self.node];
                        tracing::debug!(node = %n.name(), "{what}: no answer within {OP_TIMEOUT:?}");
                    }
                    return false;
                }
            }
        }
    }

    /// One push message. False: the connection was lost.
    fn push(&mut self, p: PushInfo) -> bool {
        let channel = || match p.data.first() {
            Some(Value::BulkString(b)) => String::from_utf8(b.clone()).ok(),
            _ => None,
        };
        match p.kind {
            PushKind::SMessage => {
                if let (Some(c), Some(s)) = (channel(), self.weak.upgrade()) {
                    s.wake(self.node, &c);
                }
            }
            PushKind::SSubscribe | PushKind::SUnsubscribe => {
                let subscribed = p.kind == PushKind::SSubscribe;
                let Some(c) = channel() else {
                    return true;
                };
                let key = (c, subscribed);
                if let Some(n) = self.ours.get_mut(&key) {
                    *n -= 1;
                    if *n == 0 {
                        self.ours.remove(&key);
                    }
                    return true;
                }
                let (c, _) = key;
                if !self.on_server.contains(&c) {
                    return true;
                }
                let Some(s) = self.weak.upgrade() else {
                    return true;
                };
                if subscribed {
                    // redis-rs subscribed it again after a reconnect: publishes in between
                    // were lost, so the head re-checks.
                    s.subscribed(self.node, std::slice::from_ref(&c));
                } else {
                    // The node lost the channel's slot: subscribe again (the next reconcile),
                    // whose confirmation wakes the head to re-check.
                    let n = &s.cluster.nodes[self.node];
                    tracing::debug!(node = %n.name(), channel = %c, "shard channel unsubscribed by the server (its slot moved); subscribing again");
                    self.on_server.removed(std::slice::from_ref(&c));
                }
            }
            // A node's connection closed: redis-rs reconnects it, but what was published
            // meanwhile is gone; start over on a new connection.
            PushKind::Disconnection => return false,
            _ => {}
        }
        true
    }
}
