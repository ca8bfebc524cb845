//! A node that is a whole Redis Cluster: its URL form, and the connection type every request
//! is sent on (a standalone server's or the cluster's routed one), so nothing outside the node
//! module cares which a node is.

use futures::FutureExt;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::error::{Error, Result};

/// A question any primary can answer (the topology, whether sharded pub/sub is known), sent to
/// every primary and answered by the first: a random one could be a primary that hangs, and the
/// question would wait for it (a renewal tick needing the slot map lost every lock that way).
const FIRST_PRIMARY_TO_ANSWER: RoutingInfo = RoutingInfo::MultiNode((
    MultipleNodeRoutingInfo::AllMasters,
    Some(ResponsePolicy::OneSucceeded),
));

/// A node's connection: a standalone server's multiplexed connection, or a cluster's, which
/// routes each command to the primary of its keys' slot (following MOVED and ASK itself).
#[derive(Clone)]
pub(crate) enum Conn {
    Server(MultiplexedConnection),
    Cluster(ClusterConnection, Pubsub, Arc<Seen>),
}

/// The slot map a cluster connection was opened on, and whether a later look found the
/// cluster's map changed since (see `Watch::suspect`).
#[derive(Default)]
pub(crate) struct Seen {
    map: SlotMap,
    /// To look with: a new connection (see `Watch::suspect`). `None`: never looked.
    client: Option<ClusterClient>,
    /// Seeded by the primaries of `map` that are not the URL's seeds, and after how long it
    /// is tried too (see `connect`).
    fallback: Option<(ClusterClient, Duration)>,
    /// The connection itself, to ask whether it still answers at all (`Watch::suspect`).
    conn: Option<ClusterConnection>,
    stale: AtomicBool,
    checking: AtomicBool,
}

impl Seen {
    /// The slot map the connection was opened on.
    pub fn map(&self) -> &SlotMap {
        &self.map
    }

    pub fn new(
        map: SlotMap,
        client: ClusterClient,
        fallback: Option<(ClusterClient, Duration)>,
        conn: ClusterConnection,
    ) -> Seen {
        Seen {
            map,
            client: Some(client),
            fallback,
            conn: Some(conn),
            ..Seen::default()
        }
    }
}

/// A new connection through `client` (the URL's seeds), or through `fallback`'s client (the
/// primaries a slot map named), tried too once `fallback`'s wait has passed: the first to
/// connect. The URL names one node as a rule, and when that node is a
/// primary that hangs, it could neither look at the slot map again nor reconnect through
/// it, and the manager never followed a failover away from it (found by a review). Not one
/// client seeded by both: redis-rs waits for every seed to connect (a hung one until its
/// connect timeout) before it reads the map, and connects to the hung one again after.
pub(crate) async fn connect(
    client: &ClusterClient,
    fallback: Option<&(ClusterClient, Duration)>,
) -> RedisResult<ClusterConnection> {
    let fallback = fallback.map(|(other, wait)| (other.get_async_connection(), *wait));
    first_to_connect(client.get_async_connection(), fallback).await
}

/// `first`, and `second`'s connection started once its wait has passed: the first to connect
/// (see `connect`).
pub(crate) async fn first_to_connect<T>(
    first: impl Future<Output = RedisResult<T>> + Send,
    second: Option<(impl Future<Output = RedisResult<T>> + Send, Duration)>,
) -> RedisResult<T> {
    let Some((other, wait)) = second else {
        return first.await;
    };
    // The second once the wait (the connect timeout) has passed: a seed that hangs has
    // failed the first by then.
    let second = async {
        tokio::time::sleep(wait).await;
        other.await
    };
    futures::future::select_ok([first.boxed(), second.boxed()])
        .await
        .map(|(conn, _)| conn)
}

/// The least time between two looks at one connection's slot map (`Watch::suspect`): a
/// primary that hangs makes every request of its slots time out, and each would ask.
const RECHECK: Duration = Duration::from_secs(1);

/// How a node's release wake-ups travel. The scripts publish as the connection they run on
/// says; the waiters subscribe to the same kind (`queue/waiters.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pubsub {
    /// PUBLISH / SUBSCRIBE: a standalone server, or a cluster with sharded pub/sub off or
    /// unsupported (before Redis 7.0).
    Classic,
    /// SPUBLISH / SSUBSCRIBE on the primary of the channel's slot.
    Sharded,
}

impl Conn {
    /// Whether the scripts sent on this connection publish with SPUBLISH.
    pub fn sharded(&self) -> bool {
        matches!(self, Conn::Cluster(_, Pubsub::Sharded, _))
    }

    /// Whether this cluster connection routes by a slot map found out of date: its node
    /// opens a new one for its next request.
    pub fn is_stale(&self) -> bool {
        matches!(self, Conn::Cluster(_, _, seen) if seen.stale.load(Ordering::Relaxed))
    }

    /// A cluster connection's look-out for a changed slot map (`Watch::suspect`); `None` for
    /// a standalone server's.
    pub fn watch(&self) -> Option<Watch> {
        match self {
            Conn::Cluster(_, _, seen) => Some(Watch { seen: seen.clone() }),
            Conn::Server(_) => None,
        }
    }
}

/// What a cluster connection was opened on.
pub(crate) struct Watch {
    seen: Arc<Seen>,
}

impl Watch {
    /// A request on this connection got no reply within `timeout`. That may be a primary
    /// that hangs (a frozen VM, a link dropping every packet) and has since been failed
    /// over: redis-rs reads the slot map again on a redirect or a dropped connection, and a
    /// hung primary sends neither, so the connection would send its slots to it for as long
    /// as it hangs, and a held lock there was lost (found by a review; a new connection
    /// followed the failover). So the map is read again, in the background and at most once
    /// a `RECHECK` per connection, and when a primary of the map the connection was opened
    /// on is no primary in it, the connection is marked stale: its node opens a new one. A
    /// primary that hangs without a failover leaves the primaries as they were, and its
    /// requests stay queued on the same connection, in order (see `Node::run`); so does a
    /// slot moved between primaries meanwhile (redis-rs follows it), unless the connection
    /// answers nothing at all: redis-rs follows a redirect by checking every node of its new
    /// map, a hung primary too, and holds every request back until that check ends, so a
    /// connection that does not answer the question the new one answered, within as long as
    /// the look may take (`answers`), is marked stale too.
    ///
    /// The map is read on a connection of its own: the one that timed out may be waiting
    /// for the hung primary itself (when redis-rs reads the topology from it, say), and a
    /// question asked on it waited too. The look runs on the current runtime (a blocking
    /// caller's runs while the caller waits in it).
    pub fn suspect(self, timeout: Duration) {
        let seen = self.seen;
        let Some(client) = seen.client.clone() else {
            return;
        };
        if seen.stale.load(Ordering::Relaxed) || seen.checking.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            seen.checking.store(false, Ordering::Release);
            return;
        };
        runtime.spawn(async move {
            let started = tokio::time::Instant::now();
            // Connecting leaves out a primary that hangs after the connect timeout (see
            // `node::cluster_builder`); then one question.
            let look = async {
                let mut conn = connect(&client, seen.fallback.as_ref()).await?;
                SlotMap::read(&mut conn).await
            };
            if let Ok(Ok(now)) = tokio::time::timeout(LOOK * timeout, look).await {
                if seen.map.lost_a_primary_in(&now) {
                    tracing::debug!("the cluster's slot map changed: reconnecting");
                    seen.stale.store(true, Ordering::Relaxed);
                } else if let Some(old) = &seen.conn
                    && !answers(old, LOOK * timeout).await
                {
                    // The cluster answers a new connection, and this one nothing: a redirect
                    // (a slot moved) has redis-rs read its map again and check every node of
                    // it, a hung primary too, with no reply timeout, and every request of the
                    // connection, to every primary, waits behind that check for as long as
                    // the primary hangs (found by a review).
                    tracing::debug!("the cluster connection answers nothing: reconnecting");
                    seen.stale.store(true, Ordering::Relaxed);
                }
            }
            tokio::time::sleep_until(started + RECHECK).await;
            seen.checking.store(false, Ordering::Release);
        });
    }
}

/// Whether `conn` answers at all within `timeout`: the slot map asked of every primary, the
/// first answer enough (one hung primary is not a connection that answers nothing; nor is an
/// error reply). As long as a whole look may take: a wedged connection never answers, and a
/// merely slow one is not to be replaced (a reconnection costs a loaded cluster more).
async fn answers(conn: &ClusterConnection, timeout: Duration) -> bool {
    tokio::time::timeout(timeout, SlotMap::read(&mut conn.clone()))
        .await
        .is_ok()
}

/// How many node timeouts a look at the slot map may take (`Watch::suspect`): a connection
/// to every node (one that hangs costs a connect timeout), then a question.
const LOOK: u32 = 3;

/// Sharded pub/sub when `wanted` and the cluster knows it: Redis answers `PUBSUB
/// SHARDNUMSUB` from 7.0 on, which is also how Redisson's shardedSubscriptionMode AUTO
/// decides. Any other answer (an unknown command, an ACL denial) keeps classic pub/sub.
pub(crate) async fn pubsub_kind(conn: &mut ClusterConnection, wanted: bool) -> Pubsub {
    if !wanted {
        return Pubsub::Classic;
    }
    let probe = conn
        .route_command(
            redis::cmd("PUBSUB").arg("SHARDNUMSUB").clone(),
            FIRST_PRIMARY_TO_ANSWER,
        )
        .await;
    match probe {
        Ok(Value::Array(_)) | Ok(Value::Map(_)) => Pubsub::Sharded,
        _ => Pubsub::Classic,
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Server(c) => c.req_packed_command(cmd),
            Conn::Cluster(c, ..) => c.req_packed_command(cmd),
        }
    }

    /// On a cluster, every command of the pipeline must be in one slot (redis-rs refuses
    /// others): callers with keys of several slots send them one by one.
    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Server(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c, ..) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Server(c) => c.get_db(),
            Conn::Cluster(c, ..) => c.get_db(),
        }
    }
}

/// Redis Cluster's `keyHashSlot`: CRC16-XMODEM of the hash tag (or of the whole key) mod
/// 16384.
pub(crate) fn key_slot(name: &str) -> u16 {
    let b = name.as_bytes();
    let hashed = match b.iter().position(|&c| c == b'{') {
        Some(open) => match b[open + 1..].iter().position(|&c| c == b'}') {
            Some(len) if len > 0 => &b[open + 1..open + 1 + len],
            _ => b,
        },
        None => b,
    };
    let mut crc: u16 = 0;
    for &byte in hashed {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc & 16383
}

/// Which primary served which slots when `CLUSTER SLOTS` was last read: what the watchdog
/// groups a tick's renewals by (one pipeline per primary). It may be stale: a pipeline sent to
/// a primary that no longer serves a key's slot gets MOVED (or ASK) for that entry, and the
/// caller renews that lock alone, as a routed command that redis-rs redirects.
///
/// It is also the restart guard's memory of a cluster (`cluster_guard.rs`): which nodes were
/// primaries, to tell a failover from a migration.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct SlotMap {
    /// Sorted by first slot.
    pub(crate) ranges: Vec<SlotRange>,
    /// Each primary's `host:port`, as the map gives it: seeds for a later connection, when
    /// the URL's own seeds hang or are gone (`Node::open_connection`).
    pub(crate) addrs: Vec<String>,
    /// Every node of the map, primaries and replicas, by node id (or `host:port`): what
    /// tells two nodes of one manager that are one cluster (`Node::claim_cluster`), also a
    /// failover apart (a promoted replica is in both maps).
    pub(crate) members: Vec<String>,
}

/// One range of `CLUSTER SLOTS`: its primary by node id (or `host:port` when no id is given).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SlotRange {
    pub first: u16,
    pub last: u16,
    pub primary: String,
}

impl SlotMap {
    /// Reads the map from the first primary to answer.
    pub async fn read(conn: &mut ClusterConnection) -> RedisResult<SlotMap> {
        SlotMap::read_routed(conn, FIRST_PRIMARY_TO_ANSWER).await
    }

    /// Reads the map from the node `route` picks.
    pub async fn read_from(
        conn: &mut ClusterConnection,
        route: SingleNodeRoutingInfo,
    ) -> RedisResult<SlotMap> {
        SlotMap::read_routed(conn, RoutingInfo::SingleNode(route)).await
    }

    async fn read_routed(
        conn: &mut ClusterConnection,
        routing: RoutingInfo,
    ) -> RedisResult<SlotMap> {
        let reply = conn
            .route_command(redis::cmd("CLUSTER").arg("SLOTS").clone(), routing)
            .await?;
        Ok(SlotMap::parse(&reply))
    }

    /// `CLUSTER SLOTS`: [[first, last, [host, port, id, ...], replicas...], ...]. Entries it
    /// cannot read are left out: their keys are renewed one by one.
    fn parse(reply: &Value) -> SlotMap {
        let text = |v: &Value| match v {
            Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
            Value::SimpleString(s) | Value::VerbatimString { text: s, .. } => Some(s.clone()),
            Value::Int(n) => Some(n.to_string()),
            _ => None,
        };
        let mut ranges = Vec::new();
        let mut addrs: Vec<String> = Vec::new();
        let mut members: Vec<String> = Vec::new();
        // The node id when given (Redis 4+), else host:port.
        let id_of = |node: &[Value]| {
            node.get(2).and_then(text).or_else(|| {
                let host = node.first().and_then(text)?;
                let port = node.get(1).and_then(text)?;
                Some(format!("{host}:{port}"))
            })
        };
        if let Value::Array(entries) = reply {
            for entry in entries {
                let Value::Array(fields) = entry else {
                    continue;
                };
                let (Some(Value::Int(first)), Some(Value::Int(last)), Some(Value::Array(primary))) =
                    (fields.first(), fields.get(1), fields.get(2))
                else {
                    continue;
                };
                // An endpoint Redis does not know is "" or "?".
                let addr = match (
                    primary.first().and_then(text),
                    primary.get(1).and_then(text),
                ) {
                    (Some(host), Some(port)) if !host.is_empty() && host != "?" => {
                        Some(match host.contains(':') {
                            true => format!("[{host}]:{port}"),
                            false => format!("{host}:{port}"),
                        })
                    }
                    _ => None,
                };
                if let Some(addr) = addr
                    && !addrs.contains(&addr)
                {
                    addrs.push(addr);
                }
                for node in &fields[2..] {
                    if let Value::Array(node) = node
                        && let Some(id) = id_of(node)
                        && !members.contains(&id)
                    {
                        members.push(id);
                    }
                }
                let primary = id_of(primary);
                if let (Ok(first), Ok(last), Some(primary)) =
                    (u16::try_from(*first), u16::try_from(*last), primary)
                {
                    ranges.push(SlotRange {
                        first,
                        last,
                        primary,
                    });
                }
            }
        }
        ranges.sort_by_key(|r| r.first);
        SlotMap {
            ranges,
            addrs,
            members,
        }
    }

    /// The range holding `slot`, as last read.
    pub fn range_of(&self, slot: u16) -> Option<&SlotRange> {
        let i = self
            .ranges
            .partition_point(|r| r.first <= slot)
            .checked_sub(1)?;
        let range = &self.ranges[i];
        (slot <= range.last).then_some(range)
    }

    /// Whether a primary of this map is none in `now` (a failover: its replica took its
    /// slots), or this map is unknown (empty) and `now` is not. Slots that moved between
    /// primaries do not count: redis-rs follows them (MOVED).
    pub fn lost_a_primary_in(&self, now: &SlotMap) -> bool {
        if now.ranges.is_empty() {
            return false;
        }
        self.ranges.is_empty()
            || self
                .ranges
                .iter()
                .any(|r| !now.ranges.iter().any(|n| n.primary == r.primary))
    }

    /// A map of `(first, last, primary)` ranges, for tests.
    #[cfg(test)]
    pub(crate) fn of(ranges: &[(u16, u16, &str)]) -> SlotMap {
        SlotMap {
            addrs: Vec::new(),
            members: Vec::new(),
            ranges: ranges
                .iter()
                .map(|&(first, last, primary)| SlotRange {
                    first,
                    last,
                    primary: primary.into(),
                })
                .collect(),
        }
    }

    /// The primary serving `slot`, as last read.
    pub fn primary_of(&self, slot: u16) -> Option<&str> {
        self.range_of(slot).map(|r| r.primary.as_str())
    }
}

/// Sends `pipeline` to the primary serving `slot` (every entry should be on it: entries that
/// are not answer MOVED or ASK, which the caller handles; redis-rs does not redirect a
/// pipeline whose errors are values).
pub(crate) async fn send_to_primary_of(
    conn: &mut ClusterConnection,
    pipeline: Pipeline,
    count: usize,
    slot: u16,
) -> RedisResult<Vec<Value>> {
    let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
    conn.route_pipeline(pipeline, 0, count, route).await
}

/// A parsed `redis+cluster://` or `rediss+cluster://` URL: the seeds as plain `redis://`
/// (`rediss://`) URLs carrying the same credentials, the URL's own host first.
#[derive(Debug)]
pub(crate) struct ClusterUrl {
    pub seeds: Vec<String>,
}

const FORM: &str = "expected redis+cluster://[user:password@]host:port[?seed=host:port&seed=...] or rediss+cluster://...";

impl ClusterUrl {
    /// `None` for a URL of another scheme. `display` is the URL without its password, the
    /// only form a message shows.
    pub fn parse(url: &str, display: &str) -> Result<Option<ClusterUrl>> {
        let (scheme, rest) = if let Some(rest) = url.strip_prefix("redis+cluster://") {
            ("redis", rest)
        } else if let Some(rest) = url.strip_prefix("rediss+cluster://") {
            ("rediss", rest)
        } else {
            return Ok(None);
        };
        let bad =
            |why: String| Error::invalid(format!("cluster node URL {display:?}: {why} ({FORM})"));
        let (main, query) = match rest.split_once('?') {
            Some((m, q)) => (m, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match main.split_once('/') {
            Some((a, p)) => (a, p),
            None => (main, ""),
        };
        // A cluster has database 0 only.
        if !path.is_empty() && path != "0" {
            return Err(bad(format!("a cluster has only database 0, not {path:?}")));
        }
        let (userinfo, host) = match authority.rfind('@') {
            Some(at) => (&authority[..=at], &authority[at + 1..]),
            None => ("", authority),
        };
        check_host_port(host).map_err(&bad)?;
        let mut seeds = vec![format!("{scheme}://{userinfo}{host}")];
        for pair in query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .filter(|p| !p.is_empty())
        {
            match pair.split_once('=') {
                Some(("seed", seed)) => {
                    check_host_port(seed)
                        .map_err(|why| bad(format!("seed {:?}: {why}", redact_seed(seed))))?;
                    seeds.push(format!("{scheme}://{userinfo}{seed}"));
                }
                _ => {
                    let name = pair.split('=').next().unwrap_or(pair);
                    return Err(bad(format!("unknown parameter {name:?}")));
                }
            }
        }
        Ok(Some(ClusterUrl { seeds }))
    }
}

/// A seed (or any URL parameter's value) as a message may show it: one written with
/// credentials loses them.
pub(crate) fn redact_seed(seed: &str) -> String {
    match seed.rfind('@') {
        Some(at) => format!("***{}", &seed[at..]),
        None => seed.to_string(),
    }
}

fn check_host_port(host_port: &str) -> std::result::Result<(), String> {
    if host_port.contains('@') || host_port.contains('/') {
        return Err("not host:port (credentials go in the main URL, before its host)".to_string());
    }
    let Some((host, port)) = host_port.rsplit_once(':') else {
        return Err(format!("{host_port:?} has no port"));
    };
    if host.is_empty() {
        return Err(format!("{host_port:?} has no host"));
    }
    if host_port.contains(',') {
        return Err(format!(
            "{host_port:?}: commas separate nodes; give more seeds as ?seed=host:port"
        ));
    }
    match port.parse::<u16>() {
        Ok(0) => Err(format!("{host_port:?}: port 0")),
        Ok(_) => Ok(()),
        Err(_) => Err(format!("bad port {port:?}")),
    }
}

/// The refusal of a plain URL that reached a cluster node: its other shards' keys would
/// answer MOVED, and even its own slots can move away under a lock. (A message: the node
/// module makes it a `NodeError`, so this module does not depend on it.)
pub(crate) fn refuse_cluster_server(display: &str) -> String {
    let cluster_form = display
        .strip_prefix("redis://")
        .map(|r| format!("redis+cluster://{r}"))
        .or_else(|| {
            display
                .strip_prefix("rediss://")
                .map(|r| format!("rediss+cluster://{r}"))
        })
        .unwrap_or_else(|| "redis+cluster://host:port".to_string());
    format!(
        "is a Redis Cluster node (INFO cluster: cluster_enabled:1); a plain URL cannot route keys \
         across its shards: use {cluster_form}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_parse_into_seeds_with_their_credentials() {
        let seeds = |u: &str| ClusterUrl::parse(u, u).unwrap().unwrap().seeds;
        assert_eq!(seeds("redis+cluster://h:7000"), ["redis://h:7000"]);
        assert_eq!(
            seeds("rediss+cluster://u:p@h:7000/0?seed=g:7001&seed=k:7002"),
            [
                "rediss://u:p@h:7000",
                "rediss://u:p@g:7001",
                "rediss://u:p@k:7002"
            ]
        );
        assert!(
            ClusterUrl::parse("redis://h:1", "redis://h:1")
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn key_slots_route_as_redis_rs_routes_them() {
        for key in [
            "",
            "a",
            "orders:1",
            "{user1000}.following",
            "foo{}{bar}",
            "x{y}z",
            "é",
        ] {
            assert_eq!(
                Route::new(key_slot(key), SlotAddr::Master),
                Route::with_key(key, SlotAddr::Master),
                "{key:?}"
            );
        }
    }

    #[test]
    fn only_a_primary_gone_from_the_map_is_a_lost_primary() {
        let map = SlotMap::of;
        let before = map(&[(0, 8191, "a"), (8192, 16383, "b")]);
        // A failover: a's replica took its slots.
        assert!(before.lost_a_primary_in(&map(&[(0, 8191, "a2"), (8192, 16383, "b")])));
        // Slots moved between the same primaries, or to a new one: redis-rs follows them.
        assert!(!before.lost_a_primary_in(&map(&[(0, 4095, "a"), (4096, 16383, "b")])));
        assert!(!before.lost_a_primary_in(&map(&[
            (0, 8191, "a"),
            (8192, 12000, "b"),
            (12001, 16383, "c")
        ])));
        assert!(!before.lost_a_primary_in(&before));
        // Nothing read now tells nothing; nothing read before, anything now does.
        assert!(!before.lost_a_primary_in(&SlotMap::default()));
        assert!(SlotMap::default().lost_a_primary_in(&before));
    }

    #[test]
    fn a_slot_map_finds_each_slots_primary_and_leaves_gaps_unknown() {
        let node = |host: &str, port: i64, id: &str| {
            Value::Array(vec![
                Value::BulkString(host.into()),
                Value::Int(port),
                Value::BulkString(id.into()),
            ])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![Value::Int(5461), Value::Int(10922), node("h", 2, "b")]),
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("h", 1, "a"),
                node("h", 4, "replica-of-a"),
            ]),
            Value::Array(vec![
                Value::Int(12000),
                Value::Int(16383),
                node("h", 3, "c"),
            ]),
            Value::SimpleString("not an entry".into()),
        ]);
        let map = SlotMap::parse(&reply);
        assert_eq!(map.primary_of(0), Some("a"));
        assert_eq!(map.primary_of(5460), Some("a"));
        assert_eq!(map.primary_of(5461), Some("b"));
        assert_eq!(map.primary_of(10922), Some("b"));
        assert_eq!(map.primary_of(10923), None, "a slot nobody serves");
        assert_eq!(map.primary_of(16383), Some("c"));
        assert_eq!(map.range_of(7).unwrap().last, 5460);
        // Each primary's address once, in reply order; no replica's.
        assert_eq!(map.addrs, ["h:2", "h:1", "h:3"]);
        // Every node, replicas too, once.
        assert_eq!(map.members, ["b", "a", "replica-of-a", "c"]);
        assert_eq!(SlotMap::parse(&Value::Nil).primary_of(7), None);
        // An IPv6 host in brackets; an endpoint Redis does not know ("", "?") left out.
        let map = SlotMap::parse(&Value::Array(vec![
            Value::Array(vec![Value::Int(0), Value::Int(1), node("::1", 7, "a")]),
            Value::Array(vec![Value::Int(2), Value::Int(3), node("?", 8, "b")]),
            Value::Array(vec![Value::Int(4), Value::Int(5), node("", 9, "c")]),
        ]));
        assert_eq!(map.addrs, ["[::1]:7"]);
        assert_eq!(map.primary_of(4), Some("c"));
    }

    #[test]
    fn bad_cluster_urls_name_the_bad_part() {
        for (url, part) in [
            ("redis+cluster://h:7000/3", "\"3\""),
            ("redis+cluster://h", "no port"),
            ("redis+cluster://h:70000", "bad port"),
            ("redis+cluster://h:7000?seed=g", "\"g\""),
            ("redis+cluster://h:7000?seed=g:1,k:2", "commas"),
            ("redis+cluster://h:7000?tls=1", "\"tls\""),
        ] {
            let err = ClusterUrl::parse(url, url).unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument);
            assert!(err.message().contains(part), "{url}: {err}");
            assert!(err.message().contains(url), "{url}: {err}");
        }
        // A seed written with credentials is refused without showing them.
        let url = "redis+cluster://h:7000?seed=:hunter2@g:7001";
        let err = ClusterUrl::parse(url, &crate::node::redact_url(url)).unwrap_err();
        assert!(err.message().contains("not host:port"), "{err}");
        assert!(!err.message().contains("hunter2"), "{err}");
    }
}
