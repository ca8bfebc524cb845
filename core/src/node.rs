//! One Redis node: its URL (kept only in redacted form for messages), a lazily opened
//! multiplexed connection shared by every task, and per-request timeouts.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use redis::aio::MultiplexedConnection;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::{AsyncConnectionConfig, Client, IntoConnectionInfo};

use crate::cluster_guard::SlotGuard;
use crate::node_cluster::{
    ClusterUrl, Seen, SlotMap, key_slot, pubsub_kind, refuse_cluster_server,
};
pub(crate) use crate::node_cluster::{Conn, Pubsub};

use crate::error::{Error, ErrorKind, Result};
use crate::per_process::PerProcess;
use crate::refusal::Refusal;
use crate::restart_guard::{GuardWindow, Hold};
use crate::runtime::Awaiting;
use crate::runtime::caller;
use crate::server_ids::ServerIds;

/// Why one node did not answer a request usefully.
#[derive(Debug, Clone)]
pub(crate) enum NodeError {
    /// Could not connect, connection dropped, or no reply within the node timeout.
    Unreachable(String),
    /// The node answered with an error (ACL, OOM, ...).
    Redis(String),
    /// The node's script refused the request for good (`refusal.rs`); with the reply's text.
    Refused(Refusal, String),
    /// A cluster's slot is migrating: MOVED, ASK or TRYAGAIN still came back after redis-rs's
    /// own redirects and retries; or the server is loading its dataset (LOADING), or the
    /// cluster is down (CLUSTERDOWN, a failed primary not yet replaced). Nothing ran,
    /// and the window closes by itself: an acquire tries again soon, a release until its
    /// lock's validity ends, a dequeue until it lands (see `queue/waiters.rs`).
    Migrating(String),
    /// The node (re)started less than the restart guard ago: its vote does not count yet (the
    /// request was not sent).
    Guarded(String),
    /// A cluster answered, but from a primary that the restart guard holds back (the slot
    /// failed over, or its primary restarted, see `cluster_guard.rs`), or whose identity it
    /// could not confirm: the answer does not count, and a grant it made is undone.
    HeldBack(String),
}

impl NodeError {
    pub(crate) fn is_unreachable(&self) -> bool {
        matches!(self, NodeError::Unreachable(_))
    }
    /// The node answered with an error reply (a migration's redirect included).
    pub(crate) fn is_reply(&self) -> bool {
        matches!(
            self,
            NodeError::Redis(_) | NodeError::Refused(..) | NodeError::Migrating(_)
        )
    }
    pub(crate) fn detail(&self) -> &str {
        match self {
            NodeError::Unreachable(s)
            | NodeError::Redis(s)
            | NodeError::Refused(_, s)
            | NodeError::Migrating(s)
            | NodeError::Guarded(s)
            | NodeError::HeldBack(s) => s,
        }
    }
}

pub(crate) struct Node {
    /// A standalone server: the client for every connection. A cluster: the seed's client,
    /// only for the waiters' classic pub/sub connection (classic PUBLISH reaches every node).
    client: Client,
    /// Set for a `redis+cluster://` node: commands go through its routed connection.
    cluster: Option<ClusterClient>,
    /// A cluster's waiters' sharded pub/sub client settings: its own client per connection,
    /// since a cluster client's push sender is fixed when it is built.
    pubsub: Option<ClusterPubsub>,
    /// The `sharded_pubsub` option: a cluster that knows sharded pub/sub uses it.
    sharded_wanted: bool,
    /// The URL with any password replaced by `***`: the only form that reaches a message.
    display: String,
    /// Kept so it can be scrubbed from driver error texts.
    password: Option<String>,
    /// The shared connection and the restart guard's memory, per process (see `PerProcess`).
    local: PerProcess<NodeLocal>,
    /// Identifies this node in the blocking callers' per-thread connections; once this is
    /// gone (see the drop) the reaper closes them, also on threads that never call in again.
    alive: Arc<()>,
    /// Requests written to this node (a pipeline counts once): the round trips.
    round_trips: AtomicU64,
    /// Its last request ended at the node timeout, and no reply has come since (paused,
    /// black-holed, or slower than the timeout): see `is_silent`.
    silent: AtomicBool,
    /// The restart guard's window (shared by the manager's nodes).
    guard_window: GuardWindow,
    /// Which node answers as which server (shared by the manager's nodes).
    server_ids: ServerIds,
    /// The runtime the shared connection's driver runs on: the manager's background work
    /// renews over it while no caller drives its own runtime.
    home: crate::runtime::Home,
}

/// What one process knows of a node: a forked child opens its own connection (the parent's
/// driver task lived on the parent's runtime) and never locks the parent's mutexes.
#[derive(Default)]
struct NodeLocal {
    conn: Mutex<Option<Slot>>,
    /// The shared connection's turns while it is being opened: first come, first written.
    connecting: tokio::sync::Mutex<()>,
    /// Requests on the shared connection that hold or wait for a turn: while there are any,
    /// a new request takes a turn too instead of writing at once (see `connection`).
    opening: AtomicUsize,
    guard: Mutex<Guard>,
    /// Found to be another node's server (`server_ids.rs`): until when no connection is
    /// tried, and why. Each try costs a connection, its handshake and an INFO, and would log.
    alias: Mutex<Option<(Instant, String)>>,
    /// A cluster's restart guard, per slot range.
    slots: Mutex<SlotGuard>,
    /// A cluster's primaries (`host:port`) as the last connection's slot map named them:
    /// seeds for the next connection beside the URL's (see `cluster_client`).
    known: Mutex<Vec<String>>,
    /// A cluster connect that outlived the request that started it (see `cluster_connect`).
    connect: Mutex<Option<Background>>,
}

/// A cluster connect going on in the background; stopped when its node goes. With until
/// when it may go on: a request that joins it with a longer node timeout pushes that later
/// (see `Background::join`).
struct Background(
    tokio::task::JoinHandle<redis::RedisResult<redis::cluster_async::ClusterConnection>>,
    Arc<Mutex<Instant>>,
);

impl Background {
    /// Lets the connect go on for as long as a request with `timeout` may have it go on.
    /// Cut at the limit of the request that started it, a connect that a request with a
    /// longer node timeout had joined failed that request early, although it would have
    /// connected within its own (found by a review).
    fn join(&self, timeout: Duration) {
        let mut until = self.1.lock().unwrap_or_else(|p| p.into_inner());
        *until = (*until).max(Instant::now() + background_limit(timeout));
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A request's hold on a background cluster connect: put back home for the next request
/// unless it finished (see `Node::cluster_connect`).
struct Joined<'a> {
    home: Home<'a>,
    task: Option<Background>,
}

impl Drop for Joined<'_> {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            self.home.put(task);
        }
    }
}

/// Where a node's background cluster connect waits between requests: the process's shared
/// connection's, or a blocking caller thread's (on that thread's runtime).
#[derive(Clone, Copy)]
enum Home<'a> {
    Shared(&'a Mutex<Option<Background>>),
    Thread(&'a Node),
}

/// A blocking caller thread's background cluster connect, kept beside its connections in
/// its `runtime::caller` state: the task runs on the thread's runtime, so it goes when the
/// reaper takes that runtime (the thread idle, or the node gone). Kept elsewhere, a connect
/// that had finished outlived its runtime, and the next request was handed a connection
/// whose tasks had ended with it (every request failed: "Unable to send command").
struct ThreadConnect {
    node: Weak<()>,
    task: Background,
}

impl Home<'_> {
    fn take(self) -> Option<Background> {
        match self {
            Home::Shared(slot) => slot.lock().unwrap_or_else(|p| p.into_inner()).take(),
            Home::Thread(node) => caller::with_connections(|t| {
                t.1.retain(|c| c.node.strong_count() > 0);
                let i =
                    t.1.iter()
                        .position(|c| std::ptr::eq(c.node.as_ptr(), Arc::as_ptr(&node.alive)))?;
                Some(t.1.swap_remove(i).task)
            })
            .flatten(),
        }
    }

    fn put(self, task: Background) {
        match self {
            Home::Shared(slot) => *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(task),
            Home::Thread(node) => {
                let connect = ThreadConnect {
                    node: Arc::downgrade(&node.alive),
                    task,
                };
                // With no caller state (the thread ending) the task goes now.
                caller::with_connections(|t| t.1.push(connect));
            }
        }
    }
}

/// How long a background cluster connect may go on, in node timeouts (at least
/// `BACKGROUND_CONNECT_MIN`): redis-rs bounds each connection, but not a slot map's reply
/// from a seed that hangs once connected.
const BACKGROUND_CONNECT_TIMEOUTS: u32 = 10;
const BACKGROUND_CONNECT_MIN: Duration = Duration::from_secs(2);

fn background_limit(timeout: Duration) -> Duration {
    (timeout * BACKGROUND_CONNECT_TIMEOUTS).max(BACKGROUND_CONNECT_MIN)
}

#[derive(Default)]
struct Guard {
    /// The run_id seen on the last connection: a different one means the node restarted.
    run_id: Option<String>,
    /// Votes from this node do not count until this hold has lasted the window.
    hold: Option<Hold>,
}

struct Slot {
    conn: Conn,
    generation: u64,
}

impl Drop for Node {
    fn drop(&mut self) {
        // Blocking threads' connections to this node go now, not when each calls in again
        // (the reaper must see `alive` gone, so it goes first).
        self.alive = Arc::new(());
        caller::node_gone();
    }
}

impl Node {
    pub(crate) fn open(
        url: &str,
        root_cert: Option<&[u8]>,
        guard_window: GuardWindow,
        server_ids: ServerIds,
        sharded_wanted: bool,
        connect_timeout: Duration,
        home: crate::runtime::Home,
    ) -> Result<Node> {
        let display = redact_url(url);
        check_control_characters(url, &display)?;
        check_userinfo(url, &display)?;
        check_fragment(url, &display)?;
        let cluster_url = ClusterUrl::parse(url, &display)?;
        let url = match &cluster_url {
            Some(c) => c.seeds[0].as_str(),
            None => {
                check_query(url, &display)?;
                url
            }
        };
        let info = url.into_connection_info().map_err(|e| {
            // A list's comma cuts only before a scheme (`split_nodes`): say so when one stayed.
            let comma = if url.contains(',') {
                "; in a list, each URL starts with its scheme"
            } else if url
                .split_once("://")
                .is_some_and(|(_, rest)| rest.contains("://"))
            {
                // `redis://a:1;redis://b:1`, `redis://a:1 redis://b:1`: two URLs run together.
                "; node URLs are separated by commas"
            } else {
                ""
            };
            let why = bad_part(url)
                .unwrap_or_else(|| e.detail().unwrap_or("cannot parse").to_string());
            Error::invalid(format!(
                "malformed node URL {display:?}: {why} (expected redis://[user:password@]host[:port][/db], rediss://..., unix:///path or redis+cluster://host:port{comma})"
            ))
        })?;
        check_parsed(&info, &display)?;
        let password = info.redis_settings().password().map(str::to_string);
        let tls = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
        let root_cert = root_cert.filter(|_| tls).map(<[u8]>::to_vec);
        let certs = || redis::TlsCertificates {
            client_tls: None,
            root_cert: root_cert.clone(),
        };
        let unusable = |e: redis::RedisError| {
            Error::invalid(format!(
                "cannot use node URL {display:?}: {}",
                scrub(&e.to_string(), password.as_deref())
            ))
        };
        if tls {
            crate::runtime::install_crypto_provider();
        }
        let client = if tls {
            Client::build_with_tls(info, certs())
        } else {
            Client::open(info)
        }
        .map_err(unusable)?;
        let cluster = match &cluster_url {
            None => None,
            Some(c) => {
                let mut builder = cluster_builder(&c.seeds, connect_timeout);
                if tls {
                    builder = builder.certs(certs());
                }
                Some(builder.build().map_err(unusable)?)
            }
        };
        let pubsub = cluster_url.map(|c| ClusterPubsub {
            seeds: c.seeds,
            certs: tls.then(certs),
            connect_timeout,
        });
        Ok(Node {
            client,
            cluster,
            pubsub,
            sharded_wanted,
            display,
            password,
            local: PerProcess::default(),
            alive: Arc::new(()),
            round_trips: AtomicU64::new(0),
            silent: AtomicBool::new(false),
            guard_window,
            server_ids,
            home,
        })
    }

    pub(crate) fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    /// The Redlock "delayed restart" rule, checked when a connection is (re)established: a
    /// node whose uptime is below the window, or whose run_id changed under us, may have
    /// forgotten locks it granted, so it does not vote until the window has passed.
    async fn check_restart(
        &self,
        conn: &mut MultiplexedConnection,
        timeout: Duration,
    ) -> Result<(), NodeError> {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        // Every standalone connection asks both: `server` for the run_id (the restart guard's,
        // and `server_ids.rs`'s), `cluster` because a cluster node reached by a plain URL
        // answers MOVED for other shards' keys, and even its own slots can move under it.
        let mut cmd = redis::cmd("INFO");
        cmd.arg("server").arg("cluster");
        let info: String = tokio::time::timeout(timeout, cmd.query_async(conn))
            .await
            .map_err(|_| {
                NodeError::Unreachable(format!(
                    "INFO server: no reply within {:?}",
                    to_the_ms(timeout)
                ))
            })?
            .map_err(|e| self.classify(&e))?;
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
                .map(|v| v.trim().to_string())
        };
        if field("cluster_enabled").as_deref() == Some("1") {
            return Err(NodeError::Redis(refuse_cluster_server(&self.display)));
        }
        if let Some(run_id) = field("run_id")
            && let Err(first) = self.server_ids.claim(&run_id, &self.display)
        {
            return Err(self.refuse_alias(format!(
                "is the same server as node {first:?} (run_id {run_id}): its vote would count \
                 twice; Redlock needs distinct nodes, so it gets no request"
            )));
        }
        if self.guard_window.is_off() {
            return Ok(());
        }
        let uptime = field("uptime_in_seconds")
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        let run_id = field("run_id");
        let now = Instant::now();
        let mut g = self.local().guard.lock().unwrap_or_else(|p| p.into_inner());
        let restarted_under_us = g.run_id.is_some() && run_id.is_some() && g.run_id != run_id;
        // Redis reports the difference of two truncated wall-clock seconds, which reads 1 as
        // soon as the clock ticks over: it overstates the real uptime by up to 1 s. One second
        // less is never more than the node has been up (the fault suite's K4 timing test).
        let hold = Hold {
            seen: now,
            up: if restarted_under_us {
                Duration::ZERO
            } else {
                Duration::from_secs(uptime.saturating_sub(1))
            },
        };
        // Kept whatever the window is now: it may grow (a longer lease asked for later), and a
        // node up for less than the new window must not vote then. The latest start wins.
        if g.hold.is_none_or(|h| h.started_before(&hold)) {
            g.hold = Some(hold);
        }
        let wait = hold.until(self.guard_window.get()) - now;
        if !wait.is_zero() {
            tracing::warn!(
                node = %self.display,
                uptime_s = uptime,
                restarted_under_us,
                "restart guard: this node's vote does not count for {wait:?} (it may have lost locks it granted before a restart)"
            );
        }
        g.run_id = run_id;
        Ok(())
    }

    /// Refuses this node's connection for `why` (it is another node's server, or cluster),
    /// and every new one for `ALIAS_RECHECK`.
    fn refuse_alias(&self, why: String) -> NodeError {
        tracing::error!(node = %self.display, "{why}");
        let mut alias = self.local().alias.lock().unwrap_or_else(|p| p.into_inner());
        *alias = Some((Instant::now() + ALIAS_RECHECK, why.clone()));
        NodeError::Redis(why)
    }

    /// Claims the nodes of the slot map a cluster connection opened on (`server_ids.rs`):
    /// Err when another node of this manager is the same cluster.
    fn claim_cluster(&self, seen: &SlotMap) -> Result<(), NodeError> {
        if seen.members.is_empty() && self.server_ids.several_clusters() {
            return Err(NodeError::Redis(
                "CLUSTER SLOTS named no primary: it cannot be told apart from this manager's \
                 other clusters (one cluster's vote must not count twice), so it gets no request"
                    .to_string(),
            ));
        }
        match self.server_ids.claim_cluster(&seen.members, &self.display) {
            Ok(()) => Ok(()),
            Err((first, shared)) => Err(self.refuse_alias(format!(
                "is the same cluster as node {first:?} (both have node {shared}): its vote \
                 would count twice; Redlock needs distinct nodes (name a cluster once, its \
                 other seeds as ?seed=host:port), so it gets no request"
            ))),
        }
    }

    /// Why this node gets no connection, while it is known to be another node's server.
    fn known_alias(&self) -> Option<String> {
        let alias = self.local().alias.lock().unwrap_or_else(|p| p.into_inner());
        match &*alias {
            Some((until, why)) if Instant::now() < *until => Some(why.clone()),
            _ => None,
        }
    }

    /// Loads every script on a new connection (one pipeline). Without it the first EVALSHA on
    /// a node meets NOSCRIPT and must load and retry, and a quorum request that has already
    /// been decided by the other nodes drops that retry: the node would never get the key.
    /// Best effort: on failure the scripts still load on NOSCRIPT.
    /// On a cluster each SCRIPT LOAD is its own command, which redis-rs sends to every
    /// primary (a pipeline goes to one node).
    async fn preload_scripts(&self, conn: &mut Conn, timeout: Duration) {
        let failed = match conn {
            Conn::Server(conn) => {
                let mut pipe = redis::pipe();
                for source in crate::scripts::sources() {
                    pipe.cmd("SCRIPT").arg("LOAD").arg(source).ignore();
                }
                self.round_trips.fetch_add(1, Ordering::Relaxed);
                match tokio::time::timeout(timeout, pipe.query_async::<()>(conn)).await {
                    Ok(Err(e)) => Some(e),
                    _ => None,
                }
            }
            Conn::Cluster(conn, ..) => {
                let loads = crate::scripts::sources().map(|source| {
                    let mut conn = conn.clone();
                    self.round_trips.fetch_add(1, Ordering::Relaxed);
                    async move {
                        redis::cmd("SCRIPT")
                            .arg("LOAD")
                            .arg(source)
                            .query_async::<()>(&mut conn)
                            .await
                    }
                });
                match tokio::time::timeout(timeout, futures::future::join_all(loads)).await {
                    Ok(results) => results.into_iter().find_map(|r| r.err()),
                    Err(_) => None,
                }
            }
        };
        if let Some(e) = failed {
            tracing::debug!(node = %self.display, "SCRIPT LOAD failed: {}", self.scrub(&e.to_string()));
        }
    }

    /// On a cluster with the restart guard on: Err while the guard holds back the votes of
    /// `key`'s slot (see `cluster_guard.rs`). A standalone node's guard is `guarded`.
    pub(crate) fn slot_guarded(&self, key: &str) -> Result<(), NodeError> {
        if !self.guards_slots() {
            return Ok(());
        }
        let slot = key_slot(key);
        let now = Instant::now();
        let slots = self.local().slots.lock().unwrap_or_else(|p| p.into_inner());
        match slots.held_until(slot, now, self.guard_window.get()) {
            Some(until) => Err(NodeError::Guarded(format!(
                "slot {slot} failed over or its primary restarted recently: restart guard holds its vote for another {:?}",
                to_the_ms(until - now)
            ))),
            None => Ok(()),
        }
    }

    /// Whether this node is a cluster with the restart guard on (see `cluster_guard.rs`).
    pub(crate) fn guards_slots(&self) -> bool {
        self.is_cluster() && !self.guard_window.is_off()
    }

    /// On a cluster with the restart guard on, after a vote about `key` was answered: asks the
    /// primary now serving its slot who it is, and Err (`HeldBack`) when the slot has failed
    /// over or its primary restarted since this process last looked (see `cluster_guard.rs`),
    /// or when it cannot tell.
    pub(crate) async fn confirm_primary(
        &self,
        key: &str,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<(), NodeError> {
        if !self.guards_slots() {
            return Ok(());
        }
        let slot = key_slot(key);
        let unconfirmed = |e: NodeError| {
            NodeError::HeldBack(format!(
                "the restart guard could not tell which primary serves slot {slot}: {}",
                e.detail()
            ))
        };
        let probe = self
            .run_bounded(deadline, timeout, false, move |conn| async move {
                match conn {
                    Conn::Cluster(mut c, ..) => {
                        match crate::cluster_guard::probe(&mut c, slot).await {
                            // An ACL denial (or a command the server lacks): no later attempt
                            // is answered otherwise. Held back, each attempt's grant was undone
                            // and a waiting acquire waited out its whole wait to end "not
                            // acquired" (found by a review).
                            Err(e) if is_denial(&e) => Ok(Err(format!(
                                "{} {}",
                                e.code().unwrap_or_default(),
                                e.detail().unwrap_or_default()
                            ))),
                            other => other.map(Ok),
                        }
                    }
                    Conn::Server(_) => Err(not_a_cluster()),
                }
            })
            .await
            .map_err(unconfirmed)?
            .map_err(|denied| {
                NodeError::Redis(format!(
                    "the restart guard's probe of slot {slot}'s primary was refused: {}",
                    self.scrub(&denied)
                ))
            })?;
        let known = {
            let slots = self.local().slots.lock().unwrap_or_else(|p| p.into_inner());
            slots.serves(slot, &probe.node_id)
        };
        if !known {
            let topology = self
                .run_bounded(deadline, timeout, false, move |conn| async move {
                    match conn {
                        Conn::Cluster(mut c, ..) => {
                            crate::cluster_guard::read_topology(&mut c, slot).await
                        }
                        Conn::Server(_) => Err(not_a_cluster()),
                    }
                })
                .await
                .map_err(unconfirmed)?;
            self.observe_topology(topology);
        }
        let now = Instant::now();
        let held = {
            let mut slots = self.local().slots.lock().unwrap_or_else(|p| p.into_inner());
            slots.probed(slot, &probe, now, self.guard_window.get())
        };
        match held {
            Some(until) => Err(NodeError::HeldBack(format!(
                "slot {slot} is now served by node {} after a failover or a restart: restart guard holds its vote for another {:?}",
                probe.node_id,
                to_the_ms(until - now)
            ))),
            None => Ok(()),
        }
    }

    /// Takes in a cluster's topology just read (see `SlotGuard::observe`).
    fn observe_topology(&self, topology: SlotMap) {
        let newly = {
            let mut slots = self.local().slots.lock().unwrap_or_else(|p| p.into_inner());
            slots.observe(topology, Instant::now())
        };
        for (first, last) in newly {
            tracing::warn!(
                node = %self.display,
                "restart guard: slots {first}-{last} failed over to a former replica; their votes do not count for {:?} (the new primary may have lost locks)",
                self.guard_window.get()
            );
        }
    }

    /// Takes in the probes of every primary made when a connection opened (see
    /// `cluster_guard::probe_primaries`).
    fn observe_probes(&self, probes: &[(u16, crate::cluster_guard::Probe)]) {
        let now = Instant::now();
        let mut slots = self.local().slots.lock().unwrap_or_else(|p| p.into_inner());
        for (slot, probe) in probes {
            slots.probed(*slot, probe, now, self.guard_window.get());
        }
    }

    /// How long the restart guard still holds back this node's vote on `key` (its own window,
    /// or on a cluster that of `key`'s slot); None when it counts now. Nothing is published
    /// when a window ends: a waiter held back re-checks then.
    pub(crate) fn guard_left(&self, key: &str) -> Option<Duration> {
        let now = Instant::now();
        let window = self.guard_window.get();
        let own = self.guard_until();
        let slot = self.guards_slots().then(|| {
            let slots = self.local().slots.lock().unwrap_or_else(|p| p.into_inner());
            slots.held_until(key_slot(key), now, window)
        });
        own.into_iter()
            .chain(slot.flatten())
            .max()
            .filter(|&until| until > now)
            .map(|until| until - now)
    }

    /// Err while the restart guard holds this node's vote back.
    fn guarded(&self) -> Result<(), NodeError> {
        match self.guard_until() {
            Some(until) if Instant::now() < until => Err(NodeError::Guarded(format!(
                "started or restarted within the restart guard's window of {:?} (the longest \
                 ttl asked for, unless restart_guard is set): its vote counts in {:?}",
                to_the_ms(self.guard_window.get()),
                to_the_ms(until - Instant::now())
            ))),
            _ => Ok(()),
        }
    }

    /// When the restart guard's hold on this node's own vote ends, if it has one.
    fn guard_until(&self) -> Option<Instant> {
        let g = self.local().guard.lock().unwrap_or_else(|p| p.into_inner());
        g.hold.map(|h| h.until(self.guard_window.get()))
    }

    pub(crate) fn name(&self) -> &str {
        &self.display
    }

    /// The server this node's URL reaches, as its parsed address (`host:port` with the host in
    /// lower case, or a socket path): two URLs spelled apart (`/0`, a trailing `/`, `07701`,
    /// `REDIS://`, a user name) may still name one server, whose vote must not count twice.
    /// A cluster is named by its first seed. The loopback's spellings (`localhost`,
    /// `127.0.0.1`, `[::1]`) are one; other names that resolve to one address count as
    /// distinct (telling they are one would take a DNS lookup at construction).
    pub(crate) fn server(&self) -> String {
        address(self.client.get_connection_info().addr())
    }

    /// The node's client, for connections other than the shared command connection (the
    /// waiters' pub/sub connection). Open them on the manager's runtime.
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// Whether this node is a whole Redis Cluster (`redis+cluster://`).
    pub(crate) fn is_cluster(&self) -> bool {
        self.cluster.is_some()
    }

    /// Whether this node may use sharded pub/sub: a cluster, with the `sharded_pubsub`
    /// option on (whether the cluster knows it is asked on each connection).
    pub(crate) fn may_shard(&self) -> bool {
        self.is_cluster() && self.sharded_wanted
    }

    /// How long `sharded_pubsub` waits on the URL's seeds before it tries the primaries last
    /// seen beside them (the connect timeout; zero for a standalone node): a bound on the
    /// whole connect must leave the fallback its own time after it.
    pub(crate) fn pubsub_fallback_wait(&self) -> Duration {
        self.pubsub
            .as_ref()
            .map_or(Duration::ZERO, |s| s.connect_timeout)
    }

    /// A cluster's connection for the waiters' sharded subscriptions (RESP3: their messages
    /// come as push messages, on the receiver returned with it), and whether the cluster knows
    /// sharded pub/sub. redis-rs routes each SSUBSCRIBE to the primary of its channel's slot
    /// and subscribes again after a reconnect. `None` for a standalone server. Open it on the
    /// manager's runtime.
    ///
    /// Through the URL's seeds and, once the connect timeout has passed, the primaries of the
    /// last slot map read too, as the command connection (`node_cluster::connect`): the URL
    /// names one node as a rule, and with that node dead or hung the waiters of every shard
    /// were never subscribed again, and slept until their timers (found by a review). Each
    /// client has its own push channel, so the one that loses the race tells nothing.
    ///
    /// Never the command connection: redis-rs 1.8 takes a `sunsubscribe` push the server sends
    /// by itself (a lost slot) for the reply to the request in flight on that node, which on
    /// the command connection would hand a lock request the wrong reply.
    pub(crate) async fn sharded_pubsub(&self) -> Option<redis::RedisResult<ShardedPubsub>> {
        let settings = self.pubsub.as_ref()?;
        let open = |seeds: &[String]| {
            let (pushes, received) = tokio::sync::mpsc::unbounded_channel();
            let mut builder = cluster_builder(seeds, settings.connect_timeout)
                .use_protocol(redis::ProtocolVersion::RESP3)
                .push_sender(pushes);
            if let Some(certs) = &settings.certs {
                builder = builder.certs(certs.clone());
            }
            async move {
                let conn = builder.build()?.get_async_connection().await?;
                Ok::<_, redis::RedisError>((conn, received))
            }
        };
        let others = self.fallback_seeds(&self.known_primaries());
        let fallback = (!others.is_empty()).then(|| (open(&others), settings.connect_timeout));
        let connect = async {
            let (mut conn, pushes) =
                crate::node_cluster::first_to_connect(open(&settings.seeds), fallback).await?;
            let kind = pubsub_kind(&mut conn, self.sharded_wanted).await;
            Ok((conn, kind, pushes))
        };
        Some(connect.await)
    }

    /// The primaries (`host:port`) of the last slot map read, for `fallback_seeds`.
    fn known_primaries(&self) -> Vec<String> {
        self.local()
            .known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The `known` primaries (`host:port`, from a slot map) that are not the URL's seeds, as
    /// seeds with the URL's credentials (see `node_cluster::connect`). Empty for a standalone
    /// node.
    fn fallback_seeds(&self, known: &[String]) -> Vec<String> {
        let mut seeds: Vec<String> = Vec::new();
        let Some(settings) = self.pubsub.as_ref() else {
            return seeds;
        };
        let Some(base) = settings.seeds.first() else {
            return seeds;
        };
        // The seeds are `scheme://[userinfo@]host:port` (`ClusterUrl::parse`).
        let cut = match base.rfind('@') {
            Some(at) => at + 1,
            None => match base.find("://") {
                Some(scheme) => scheme + 3,
                None => return seeds,
            },
        };
        for addr in known {
            let seed = format!("{}{addr}", &base[..cut]);
            if !settings.seeds.contains(&seed) && !seeds.contains(&seed) {
                seeds.push(seed);
            }
        }
        seeds
    }

    /// A cluster client seeded by `fallback_seeds(known)`, and the connect timeout after
    /// which it is tried beside the URL's (see `node_cluster::connect`). `None` when there is
    /// none (or for a standalone node).
    fn cluster_client(&self, known: &[String]) -> Option<(ClusterClient, Duration)> {
        let settings = self.pubsub.as_ref()?;
        let seeds = self.fallback_seeds(known);
        if seeds.is_empty() {
            return None;
        }
        let mut builder = cluster_builder(&seeds, settings.connect_timeout);
        if let Some(certs) = &settings.certs {
            builder = builder.certs(certs.clone());
        }
        Some((builder.build().ok()?, settings.connect_timeout))
    }

    /// `text` with this node's password replaced by `***`.
    pub(crate) fn scrub(&self, text: &str) -> String {
        scrub(text, self.password.as_deref())
    }

    /// The connection to send on, opening it when there is none (or it belongs to a parent
    /// process): this thread's own when it is a blocking caller driving its own runtime (see
    /// `runtime`), else the shared one, with a `Turn`.
    ///
    /// Requests on a node's shared connection are written in the order they were first
    /// polled, also while it is being opened: a release must reach a node after the request
    /// of its grant that was still waiting for the connection (the grant was decided by the
    /// other nodes). So a request that finds one waiting takes a turn behind it (`open_now`
    /// sends it here), and the turns pass on, first come first served, only once the request
    /// holding one has been handed to the connection.
    pub(crate) async fn connection(
        &self,
        timeout: Duration,
    ) -> Result<(Conn, u64, Option<Turn<'_>>), NodeError> {
        if crate::runtime::driving_locally() {
            let (conn, generation) = self.thread_connection(timeout).await?;
            return Ok((conn, generation, None));
        }
        let local = self.local();
        local.opening.fetch_add(1, Ordering::AcqRel);
        let waiting = Waiting(&local.opening);
        let guard = tokio::time::timeout(timeout, local.connecting.lock())
            .await
            .map_err(|_| NodeError::Unreachable(format!("connect timed out after {timeout:?}")))?;
        let turn = Turn {
            _guard: guard,
            _waiting: waiting,
        };
        if let Some((conn, generation)) = self.current() {
            return Ok((conn, generation, Some(turn)));
        }
        let conn = self.home.within(self.open_connection(timeout)).await?;
        let mut slot = self.local().conn.lock().unwrap_or_else(|p| p.into_inner());
        let generation = next_generation();
        *slot = Some(Slot {
            conn: conn.clone(),
            generation,
        });
        Ok((conn, generation, Some(turn)))
    }

    /// A new connection on the current runtime, checked by the restart guard and with every
    /// script loaded.
    ///
    /// A cluster's connection reads the topology from a seed and connects to every primary;
    /// with the restart guard on, the topology is kept for the guard per slot range (see
    /// `cluster_guard.rs`).
    async fn open_connection(&self, timeout: Duration) -> Result<Conn, NodeError> {
        if let Some(why) = self.known_alias() {
            return Err(NodeError::Redis(why));
        }
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        let mut conn = match &self.cluster {
            Some(cluster) => {
                let mut conn = self.cluster_connect(cluster, timeout).await?;
                // Asked on every new connection: a cluster upgraded to 7.0 switches over
                // with its next connection (its waiters follow at their next one).
                let kind =
                    tokio::time::timeout(timeout, pubsub_kind(&mut conn, self.sharded_wanted))
                        .await
                        .unwrap_or(Pubsub::Classic);
                // The topology this connection routes by, to tell later whether it changed
                // (`Watch::suspect`); with the restart guard on, also the one to
                // compare later ones with (and, on a reconnection, the one seen before).
                self.round_trips.fetch_add(1, Ordering::Relaxed);
                // Needed also beside another cluster node, to tell whether both are one
                // cluster (`claim_cluster`).
                let needed = self.guards_slots() || self.server_ids.several_clusters();
                let seen = match tokio::time::timeout(timeout, SlotMap::read(&mut conn)).await {
                    Ok(Ok(topology)) => topology,
                    Ok(Err(e)) if needed => return Err(self.classify(&e)),
                    Err(_) if needed => {
                        return Err(NodeError::Unreachable(format!(
                            "CLUSTER SLOTS: no reply within {:?}",
                            to_the_ms(timeout)
                        )));
                    }
                    // Unknown: the first look after a request times out finds it changed.
                    _ => SlotMap::default(),
                };
                self.claim_cluster(&seen)?;
                if self.guards_slots() {
                    let probes = tokio::time::timeout(
                        timeout,
                        crate::cluster_guard::probe_primaries(&conn, &seen),
                    )
                    .await
                    .unwrap_or_default();
                    self.round_trips
                        .fetch_add(probes.len() as u64, Ordering::Relaxed);
                    self.observe_topology(seen.clone());
                    self.observe_probes(&probes);
                }
                {
                    if !seen.addrs.is_empty() {
                        *self.local().known.lock().unwrap_or_else(|p| p.into_inner()) =
                            seen.addrs.clone();
                    }
                    let fallback = self.cluster_client(&seen.addrs);
                    let seen = Seen::new(seen, cluster.clone(), fallback, conn.clone());
                    Conn::Cluster(conn, kind, Arc::new(seen))
                }
            }
            None => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(None);
                let mut conn = self
                    .client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    // redis-rs says only "timed out": say of what, as for a request.
                    .map_err(|e| match e.is_timeout() {
                        true => timed_out(timeout),
                        false => self.classify(&e),
                    })?;
                self.check_restart(&mut conn, timeout).await?;
                Conn::Server(conn)
            }
        };
        self.preload_scripts(&mut conn, timeout).await;
        Ok(conn)
    }

    /// A new cluster connection, within `timeout`: the slot map read from a seed, and a
    /// connection to every primary.
    ///
    /// The connect goes on in the background past `timeout`, and the next request joins it.
    /// Started afresh by each request, a connect that took longer than one node timeout (a
    /// CPU-starved host: a new manager's first request, or the first after a failover) never
    /// finished, and three such requests in a row ended an acquire with `QuorumUnreachable`
    /// however long it could wait. A blocking caller's connect runs on its own runtime, kept
    /// per thread, and goes on only while the thread is in a call (its next attempt, say).
    async fn cluster_connect(
        &self,
        cluster: &ClusterClient,
        timeout: Duration,
    ) -> Result<redis::cluster_async::ClusterConnection, NodeError> {
        let home = match crate::runtime::driving_locally() {
            true => Home::Thread(self),
            false => Home::Shared(&self.local().connect),
        };
        let fallback = || self.cluster_client(&self.known_primaries());
        let task = match home.take() {
            // Finished with an error while no request waited: old news, so try again.
            Some(task) if !task.0.is_finished() => {
                task.join(timeout);
                task
            }
            Some(mut task) => match (&mut task.0).await {
                Ok(Ok(conn)) => return Ok(conn),
                _ => self.start_cluster_connect(cluster, fallback(), timeout),
            },
            None => self.start_cluster_connect(cluster, fallback(), timeout),
        };
        // Back home if this request ends first: timed out, or dropped (a fan-out at its
        // deadline, a decided quorum, a cancel).
        let mut joined = Joined {
            home,
            task: Some(task),
        };
        let Some(task) = joined.task.as_mut() else {
            unreachable!("set above")
        };
        let connected = tokio::time::timeout(timeout, &mut task.0)
            .await
            .map_err(|_| {
                NodeError::Unreachable(format!("cluster connect timed out after {timeout:?}"))
            })?;
        joined.task = None;
        match connected {
            Ok(connected) => connected.map_err(|e| self.classify(&e)),
            Err(e) => Err(NodeError::Unreachable(format!(
                "cluster connect failed: {e}"
            ))),
        }
    }

    fn start_cluster_connect(
        &self,
        cluster: &ClusterClient,
        fallback: Option<(ClusterClient, Duration)>,
        timeout: Duration,
    ) -> Background {
        let cluster = cluster.clone();
        let started = Instant::now();
        let until = Arc::new(Mutex::new(started + background_limit(timeout)));
        let limit = until.clone();
        let task = tokio::spawn(async move {
            let connect = crate::node_cluster::connect(&cluster, fallback.as_ref());
            tokio::pin!(connect);
            loop {
                let at = *limit.lock().unwrap_or_else(|p| p.into_inner());
                match tokio::time::timeout_at(at, &mut connect).await {
                    Ok(connected) => return connected,
                    // Pushed later meanwhile by a request that joined it.
                    Err(_) if *limit.lock().unwrap_or_else(|p| p.into_inner()) > at => {}
                    Err(_) => {
                        return Err(redis::RedisError::from((
                            redis::ErrorKind::Io,
                            "cluster connect timed out",
                            format!("after {:?}", to_the_ms(at - started)),
                        )));
                    }
                }
            }
        });
        Background(task, until)
    }

    /// The connection `connection` would return without waiting, if there is one.
    fn open_now(&self) -> Option<(Conn, u64)> {
        if crate::runtime::driving_locally() {
            caller::with_connections(|t| t.find(self)).flatten()
        } else if self.local().opening.load(Ordering::Acquire) > 0 {
            // A request is waiting for its turn: this one goes behind it (see `connection`).
            None
        } else {
            self.current()
        }
    }

    fn current(&self) -> Option<(Conn, u64)> {
        let mut slot = self.local().conn.lock().unwrap_or_else(|p| p.into_inner());
        // A cluster's topology changed under it (`Watch::suspect`): a new one.
        if slot.as_ref().is_some_and(|s| s.conn.is_stale()) {
            *slot = None;
        }
        slot.as_ref().map(|s| (s.conn.clone(), s.generation))
    }

    /// What the current cluster connection knows of the cluster (its slot map): `None` with
    /// no connection open, or for a standalone server.
    pub(crate) fn seen(&self) -> Option<Arc<Seen>> {
        match self.current()? {
            (Conn::Cluster(_, _, seen), _) => Some(seen),
            _ => None,
        }
    }

    fn local(&self) -> &NodeLocal {
        self.local.get_or_init(NodeLocal::default)
    }

    /// This thread's connection to this node, opened on this thread's runtime (its driver
    /// task runs only while the thread is in `runtime::block_on`, which is the only time the
    /// thread sends on it).
    async fn thread_connection(&self, timeout: Duration) -> Result<(Conn, u64), NodeError> {
        if let Some(c) = caller::with_connections(|t| t.find(self)).flatten() {
            return Ok(c);
        }
        let conn = self.open_connection(timeout).await?;
        let generation = next_generation();
        caller::with_connections(|t| {
            t.0.push(ThreadConnection {
                node: Arc::downgrade(&self.alive),
                conn: conn.clone(),
                pid: crate::runtime::pid(),
                generation,
            })
        });
        Ok((conn, generation))
    }

    /// Forgets a broken connection so the next request reconnects. Only the generation that
    /// failed is dropped, so a late failure cannot discard a fresh connection.
    fn invalidate(&self, generation: u64) {
        let mut slot = self.local().conn.lock().unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_some_and(|s| s.generation == generation) {
            *slot = None;
        }
        drop(slot);
        caller::with_connections(|t| t.0.retain(|c| c.generation != generation));
    }

    /// Runs one request with the node timeout. A request that times out stays queued on the
    /// connection, so anything sent after it on this node (a release) executes after it.
    /// `voting`: the answer counts toward a quorum, so a node under its restart guard is not
    /// asked (releases are sent regardless).
    pub(crate) async fn run<T, F, Fut>(
        &self,
        timeout: Duration,
        voting: bool,
        f: F,
    ) -> Result<T, NodeError>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        self.run_until(Instant::now() + timeout, timeout, voting, f, 0)
            .await
    }

    /// `run`, with the deadline given. A failure at or after the deadline means the node said
    /// nothing in time (its reply, or its connection's handshake): it is silent (`is_silent`).
    /// `sent`: how many times the request went out already (see `resend`).
    async fn run_until<T, F, Fut>(
        &self,
        deadline: Instant,
        timeout: Duration,
        voting: bool,
        f: F,
        mut sent: u32,
    ) -> Result<T, NodeError>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let result: Result<T, NodeError> = async {
            loop {
                let (conn, generation, turn) = match self.open_now() {
                    Some((conn, generation)) => (conn, generation, None),
                    // Boxed: opening a connection is rare, and its future is several KB, which
                    // every request future would otherwise carry (and a fan-out allocate, once
                    // per node). A re-send's is bounded by the request's deadline.
                    None if sent > 0 => {
                        tokio::time::timeout_at(deadline, Box::pin(self.connection(timeout)))
                            .await
                            .map_err(|_| timed_out(timeout))??
                    }
                    None => Box::pin(self.connection(timeout)).await?,
                };
                let _awaiting = self.begin_request(voting, sent)?;
                let watch = conn.watch();
                let reply = tokio::time::timeout_at(deadline, f(conn));
                let mut reply = std::pin::pin!(reply);
                let mut first = None;
                if let Some(turn) = turn {
                    // The first poll hands the request to the connection's writer
                    // (unconstrained: a spent task budget would defer that); only then does
                    // the next turn begin.
                    first = Some(
                        tokio::task::unconstrained(std::future::poll_fn(|cx| {
                            Poll::Ready(reply.as_mut().poll(cx))
                        }))
                        .await,
                    );
                    drop(turn);
                }
                let done = match first {
                    Some(Poll::Ready(done)) => done,
                    _ => reply.await,
                };
                let Ok(reply) = done else {
                    if let Some(w) = watch {
                        w.suspect(timeout);
                    }
                    return Err(timed_out(timeout));
                };
                if self.resend(&reply, generation, deadline, &mut sent) {
                    continue;
                }
                return self.settle(reply, generation);
            }
        }
        .await;
        if result.is_err() && Instant::now() >= deadline {
            self.silent.store(true, Ordering::Relaxed);
        }
        result
    }

    /// Whether to send a request again, on a new connection, because its standalone
    /// connection dropped before the reply came (a network reset, `CLIENT KILL`, a restart):
    /// it may have run, and every lock request is safe to run twice (see DESIGN.md, "Wire
    /// format"), while giving up would report a node that is up as unreachable. At most
    /// `RESENDS` times, before the deadline. A cluster's connection re-sends by itself
    /// (redis-rs's retries).
    fn resend<T>(
        &self,
        reply: &redis::RedisResult<T>,
        generation: u64,
        deadline: Instant,
        sent: &mut u32,
    ) -> bool {
        let dropped = matches!(reply, Err(e) if e.is_connection_dropped());
        if !dropped || self.is_cluster() || *sent >= RESENDS || Instant::now() >= deadline {
            return false;
        }
        self.invalidate(generation);
        *sent += 1;
        tracing::debug!(node = %self.display, "connection dropped before the reply: sending the request again");
        true
    }

    /// `run`, for a request whose caller wakes it at `deadline` (see `quorum::FanOut`, which
    /// has one timer for all its nodes' requests): on a connection already open it has no
    /// timer of its own, and gives up when polled at or after the deadline. A timer each cost
    /// every request a registration in the runtime's timer wheel, measurably. A request that
    /// must open its connection first runs as `run` does (connecting has timeouts of its own,
    /// and is not cut short by the request's).
    pub(crate) async fn run_bounded<T, F, Fut>(
        &self,
        deadline: Instant,
        timeout: Duration,
        voting: bool,
        f: F,
    ) -> Result<T, NodeError>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let Some((conn, generation)) = self.open_now() else {
            return Box::pin(self.run_until(deadline, timeout, voting, f, 0)).await;
        };
        let awaiting = self.begin_request(voting, 0)?;
        let watch = conn.watch();
        let reply = f(conn);
        let mut reply = std::pin::pin!(reply);
        let reply = std::future::poll_fn(|cx| match reply.as_mut().poll(cx) {
            Poll::Ready(r) => Poll::Ready(Some(r)),
            Poll::Pending if Instant::now() >= deadline => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        })
        .await;
        drop(awaiting);
        let mut sent = 0;
        match reply {
            None => {
                if let Some(w) = watch {
                    w.suspect(timeout);
                }
                Err(self.timed_out(timeout))
            }
            Some(reply) if self.resend(&reply, generation, deadline, &mut sent) => {
                Box::pin(self.run_until(deadline, timeout, voting, f, sent)).await
            }
            Some(reply) => self.settle(reply, generation),
        }
    }

    /// A request of ours ran out its node timeout: the node is silent until it replies.
    fn timed_out(&self, timeout: Duration) -> NodeError {
        self.silent.store(true, Ordering::Relaxed);
        timed_out(timeout)
    }

    /// Whether this node's last request got no reply within the node timeout, and nothing has
    /// come from it since. An acquire attempt that a refusal has already lost unless such a node
    /// says yes gives up without waiting for it (`FanOut::lost_unless_silent_answer`): a node
    /// answering after the timeout never counts anyway.
    pub(crate) fn is_silent(&self) -> bool {
        self.silent.load(Ordering::Relaxed)
    }

    /// Before a request is sent: a voting request is refused while the restart guard holds;
    /// every request counts as a round trip; a blocking caller may poll for its reply (see
    /// `runtime/spin.rs`) until the returned guard is dropped.
    /// A re-send (`sent` > 0) that finds the guard on (the node restarted: the drop was its
    /// restart) is an unknown outcome, not `Guarded`, which would say it was never sent.
    fn begin_request(&self, voting: bool, sent: u32) -> Result<Awaiting, NodeError> {
        if voting && let Err(e) = self.guarded() {
            return Err(match sent {
                0 => e,
                _ => NodeError::Unreachable(format!(
                    "connection dropped before the reply, and the node {}",
                    e.detail()
                )),
            });
        }
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        Ok(Awaiting::start())
    }

    /// A reply as a request's result; forgets the connection if it broke.
    fn settle<T>(&self, reply: redis::RedisResult<T>, generation: u64) -> Result<T, NodeError> {
        self.silent.store(false, Ordering::Relaxed);
        reply.map_err(|e| {
            if e.is_unrecoverable_error() || e.is_io_error() || e.is_connection_dropped() {
                self.invalidate(generation);
            }
            self.classify(&e)
        })
    }

    /// A cluster none of whose nodes the client can reach (`ClusterConnectionNotFound`) did not
    /// answer, like a server that refuses connections.
    fn classify(&self, e: &redis::RedisError) -> NodeError {
        let text = scrub(&e.to_string(), self.password.as_deref());
        // A reply that is not RESP at all (an HTTP server, say, at a wrong port): its dump
        // helps nobody.
        if e.kind() == redis::ErrorKind::Parse && text.contains("Parse error at") {
            return NodeError::Redis(
                "not a Redis server: its reply is not the Redis protocol (RESP)".into(),
            );
        }
        if e.is_io_error()
            || e.is_connection_refusal()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.kind() == redis::ErrorKind::ClusterConnectionNotFound
        {
            NodeError::Unreachable(text)
        } else if matches!(
            e.kind(),
            redis::ErrorKind::Server(
                redis::ServerErrorKind::Moved
                    | redis::ServerErrorKind::Ask
                    | redis::ServerErrorKind::TryAgain
            )
        ) {
            NodeError::Migrating(format!("slot migrating: {text}"))
        } else if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading) {
            // A server loading its dataset (just restarted, a replica's full sync, DEBUG
            // RELOAD) ran nothing and answers within seconds: waited out as a migrating slot
            // is. As a Redis error it ended every acquire on one node at once, whatever its
            // wait, and failed a release, leaving the key to its ttl.
            NodeError::Migrating(format!("loading its dataset: {text}"))
        } else if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ClusterDown) {
            // A cluster down (a primary failed and not yet replaced, under the default
            // `cluster-require-full-coverage yes`, every key of every shard) ran nothing and
            // heals when a replica takes over: waited out as a migrating slot is. As a Redis
            // error it ended every waiting acquire at once, and failed a release, leaving the
            // key to its ttl (found by a review).
            NodeError::Migrating(format!("cluster down: {text}"))
        } else if let Some(r) = e
            .code()
            .and_then(|code| Refusal::of(code, e.detail().unwrap_or_default()))
        {
            NodeError::Refused(r, text)
        } else {
            NodeError::Redis(text)
        }
    }
}

/// An error reply that no retry changes: an ACL denial (NOPERM), or a generic error (an
/// unknown or disabled command).
fn is_denial(e: &redis::RedisError) -> bool {
    matches!(
        e.kind(),
        redis::ErrorKind::Server(
            redis::ServerErrorKind::NoPerm | redis::ServerErrorKind::ResponseError
        )
    )
}

/// How many times a request whose standalone connection dropped before its reply is sent
/// again (see `Node::resend`); redis-rs re-sends a cluster's up to its `retries`.
const RESENDS: u32 = 2;

/// How long a request's latch lives (see `scripts::Latch`), for a request with node timeout
/// `timeout`: every send of a request, re-sends included (ours and redis-rs's), goes out
/// before its deadline, one node timeout after it was first sent; the latch lives twice that.
pub(crate) fn latch_px_ms(timeout: Duration) -> u64 {
    2 * timeout.as_millis().max(1) as u64
}

/// The cluster client's settings: primaries only (reading from replicas is never enabled),
/// and redis-rs's retries on TRYAGAIN, CLUSTERDOWN, MASTERDOWN and LOADING shortened from
/// its default (about 1.28 s before the first) to waits of 10-50 ms, so they fit within a
/// node timeout of 200 ms; the node timeout still bounds every request. The same retries
/// re-send a request whose connection dropped, which may have run: every lock request is
/// safe to run twice (see `Node::resend`, which does it for a standalone server).
/// `connect_timeout` bounds each primary's connection (and its first PING): a primary that
/// accepts connections but answers nothing (paused, or behind a black-holed link) is left out
/// in time for the others to connect within a node timeout. redis-rs's default, 1 s, made a
/// new connection wait for it, so one hung primary failed every key of the cluster.
fn cluster_builder(seeds: &[String], connect_timeout: Duration) -> ClusterClientBuilder {
    ClusterClientBuilder::new(seeds.iter().map(String::as_str))
        .connection_timeout(connect_timeout)
        .retries(3)
        .min_retry_wait(10)
        .max_retry_wait(50)
        .retry_wait_formula(10, 2)
}

/// A waiters' sharded pub/sub connection, the kind of pub/sub its cluster knows, and its push
/// messages (see `Node::sharded_pubsub`).
pub(crate) type ShardedPubsub = (
    redis::cluster_async::ClusterConnection,
    Pubsub,
    tokio::sync::mpsc::UnboundedReceiver<redis::PushInfo>,
);

/// What a cluster node's sharded pub/sub connections are built from.
struct ClusterPubsub {
    seeds: Vec<String>,
    certs: Option<redis::TlsCertificates>,
    connect_timeout: Duration,
}

/// A request's turn on a shared connection being opened (see `Node::connection`).
pub(crate) struct Turn<'a> {
    _guard: tokio::sync::MutexGuard<'a, ()>,
    _waiting: Waiting<'a>,
}

/// Counts a request in `Node::opening` until it has been written (or given up).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A request that got no reply within the node timeout, to the millisecond: a renewal batch's
/// timeout carries 50 µs per renewal on top ("200.05ms" read as a typo).
pub(crate) fn timed_out(timeout: Duration) -> NodeError {
    NodeError::Unreachable(format!("no reply within {:?}", to_the_ms(timeout)))
}

/// A duration as a message shows it: cut to the millisecond ("9.998s", not "9.99800618s"),
/// down, so that "no reply within" it stays true; one under a millisecond as it is.
pub(crate) fn to_the_ms(d: Duration) -> Duration {
    if d < Duration::from_millis(1) {
        return d;
    }
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Connection generations, unique in the process, so a failure invalidates only the
/// connection it happened on.
fn next_generation() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A blocking caller's own connection to one node.
struct ThreadConnection {
    node: Weak<()>,
    conn: Conn,
    pid: u32,
    generation: u64,
}

/// A blocking caller thread's connections, and its cluster connects going on in the
/// background, kept in its `runtime::caller` state.
#[derive(Default)]
pub(crate) struct ThreadConnections(Vec<ThreadConnection>, Vec<ThreadConnect>);

impl ThreadConnections {
    /// Whether one of them belongs to a node that is gone (its manager and locks all freed).
    pub(crate) fn has_gone_nodes(&self) -> bool {
        self.0.iter().any(|c| c.node.strong_count() == 0)
            || self.1.iter().any(|c| c.node.strong_count() == 0)
    }

    /// This thread's connection to `node`; drops those of nodes (managers) that are gone.
    fn find(&mut self, node: &Node) -> Option<(Conn, u64)> {
        let pid = crate::runtime::pid();
        if self.0.iter().any(|c| c.pid != pid) {
            // Inherited across fork: they belong to the parent's runtime.
            for c in std::mem::take(&mut self.0) {
                if c.pid == pid {
                    self.0.push(c);
                } else {
                    std::mem::forget(c);
                }
            }
        }
        // A cluster's topology changed under it (`Watch::suspect`): a new one.
        self.0
            .retain(|c| c.node.strong_count() > 0 && !c.conn.is_stale());
        self.0
            .iter()
            .find(|c| std::ptr::eq(c.node.as_ptr(), Arc::as_ptr(&node.alive)))
            .map(|c| (c.conn.clone(), c.generation))
    }
}

/// Builds the error for a request that failed on one node, naming it.
pub(crate) fn node_error(kind: ErrorKind, what: &str, node: &Node, err: &NodeError) -> Error {
    Error::new(
        kind,
        format!("{what}: node {} {}", node.name(), err.detail()),
    )
}

fn scrub(text: &str, password: Option<&str>) -> String {
    match password {
        Some(p) if !p.is_empty() => text.replace(p, "***"),
        _ => text.to_string(),
    }
}

/// `redis://user:secret@host:6379/0` becomes `redis://user:***@host:6379/0`. Works on the raw
/// text so that even a URL that fails to parse is shown without its password: a TCP URL's
/// userinfo ends at its last `@` (a password may hold an unescaped `/`, `?` or `#`), a query
/// parameter whose name holds `pass` (a unix socket's `?pass=`) loses its value and all that
/// follows it, and one whose value holds an `@` (a seed written with credentials) loses what
/// comes before it.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        // Not a URL we can parse, but a mistyped scheme (`redis:/u:pw@h`, `u:pw@h:1`) still
        // carries a password: everything before the last `@` may be one. redis-rs's own
        // `unix:/path?pass=...` has a password in its query: redacted first, since the
        // password may hold an `@` itself; what is left before a last `@` goes after.
        let shown = match url.find(['?', '#']) {
            Some(q) => format!("{}{}", &url[..q], redact_query(&url[q..])),
            None => url.to_string(),
        };
        return match shown.rfind('@') {
            Some(at) => format!("***{}", &shown[at..]),
            None => shown,
        };
    };
    let rest_start = scheme_end + 3;
    let rest = &url[rest_start..];
    let (userinfo, after) = match credentials_end(&url[..scheme_end], rest) {
        Some(at) => (Some(&rest[..at]), &rest[at..]),
        None => (None, rest),
    };
    let (main, query) = match after.find(['?', '#']) {
        Some(q) => after.split_at(q),
        None => (after, ""),
    };
    let userinfo = match userinfo {
        None => String::new(),
        Some(userinfo) => match userinfo.find(':') {
            Some(colon) => format!("{}:***", &userinfo[..colon]),
            None => "***".to_string(),
        },
    };
    format!(
        "{}{userinfo}{main}{}",
        &url[..rest_start],
        redact_query(query)
    )
}

/// A unix socket URL's scheme (`unix`, `redis+unix`), in any case.
fn is_unix(scheme: &str) -> bool {
    scheme.to_ascii_lowercase().contains("unix")
}

/// Where the credentials of a URL end (the `@` after them), given its scheme and what follows
/// `://`. A TCP URL's end at its last `@`, wherever it is: an unescaped `?`, `#` or `/` in a
/// password would otherwise end them early and show the rest (no valid TCP URL has an `@`
/// after its host). A unix URL's path may hold an `@` (its password is a `pass` parameter):
/// only what comes before the path's first `/` can be credentials.
fn credentials_end(scheme: &str, rest: &str) -> Option<usize> {
    match is_unix(scheme) {
        false => rest.rfind('@'),
        true => rest[..rest.find('/').unwrap_or(rest.len())].rfind('@'),
    }
}

/// What is wrong with a URL redis-rs could not parse (it only says it cannot): no scheme or
/// one it does not know, a wildcard host, an IPv6 zone, a port that is not a number or too
/// large, a database that is not a number.
fn bad_part(url: &str) -> Option<String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Some("no scheme".into());
    };
    const SCHEMES: [&str; 7] = [
        "redis",
        "rediss",
        "unix",
        "redis+unix",
        "valkey",
        "valkeys",
        "valkey+unix",
    ];
    if !SCHEMES.iter().any(|s| scheme.eq_ignore_ascii_case(s)) {
        return Some(format!("unsupported scheme {scheme:?}"));
    }
    if scheme.to_ascii_lowercase().ends_with("unix") {
        let db = rest
            .split_once('?')
            .into_iter()
            .flat_map(|(_, query)| query.split('&'))
            .find_map(|pair| pair.strip_prefix("db="))?;
        return db
            .parse::<i64>()
            .is_err()
            .then(|| format!("database {db:?} is not a number"));
    }
    let rest = &rest[credentials_end(scheme, rest).map_or(0, |at| at + 1)..];
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    let host = match authority.rfind(']') {
        Some(at) => &authority[..=at],
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    if host.contains('%') {
        return Some(format!(
            "host {host:?}: an IPv6 zone (%25...) is not supported"
        ));
    }
    let ip = host.trim_start_matches('[').trim_end_matches(']');
    if ip
        .parse::<std::net::IpAddr>()
        .is_ok_and(|a| a.is_unspecified())
    {
        return Some(format!(
            "host {host:?} is a wildcard address (listen on it, connect to 127.0.0.1 or [::1])"
        ));
    }
    // An IPv6 host's colons are inside its brackets.
    let after_host = authority
        .rfind(']')
        .map_or(authority, |at| &authority[at + 1..]);
    if let Some((_, port)) = after_host.rsplit_once(':') {
        match port.parse::<u64>() {
            Ok(n) if n > u64::from(u16::MAX) => {
                return Some(format!("port {n} is out of range (1 to 65535)"));
            }
            Err(_) if !port.is_empty() => return Some(format!("port {port:?} is not a number")),
            _ => {}
        }
    }
    let path = rest[end..].strip_prefix('/')?;
    let db = &path[..path.find(['?', '#']).unwrap_or(path.len())];
    (!db.is_empty() && db.parse::<i64>().is_err())
        .then(|| format!("database {db:?} is not a number"))
}

/// Whether a node URL asks for TLS (`rediss://`, `rediss+cluster://`, redis-rs's
/// `valkeys://`, in any case): the nodes a CA file is for.
pub(crate) fn is_tls_url(url: &str) -> bool {
    let scheme = url.split_once("://").map_or("", |(s, _)| s);
    ["rediss", "rediss+cluster", "valkeys"]
        .iter()
        .any(|tls| scheme.eq_ignore_ascii_case(tls))
}

/// A control character (a NUL from a C string's neighbour, a newline from a file read whole):
/// redis-rs reads `/0\0` as database 0, and a password with one goes to the server as is.
fn check_control_characters(url: &str, display: &str) -> Result<()> {
    match url.char_indices().find(|(_, c)| c.is_control()) {
        // Shown redacted, with the character escaped: it may be in the password.
        Some((at, c)) => Err(Error::invalid(format!(
            "malformed node URL {display:?}: a control character ({c:?}) at byte {at}"
        ))),
        None => Ok(()),
    }
}

/// How long a node found to be another node's server gets no connection: its URL may name
/// another server later (a DNS alias moved), so it is asked again then.
const ALIAS_RECHECK: Duration = Duration::from_secs(10);

/// A fragment: redis-rs keeps an unknown one as part of the node's name (a unix socket's
/// path or password cut short at it), and reads `#insecure` as "do not verify the server's
/// certificate", which ferrolock never does. A `#` that is meant is written `%23`.
fn check_fragment(url: &str, display: &str) -> Result<()> {
    if !url.contains('#') {
        return Ok(());
    }
    // Shown up to the `#`: what follows may be the rest of a password.
    let shown = format!("{}#...", display.split('#').next().unwrap_or_default());
    let why = if url.ends_with("#insecure") {
        "#insecure: ferrolock always verifies a TLS server (give its CA with tls_ca)"
    } else {
        "a fragment ('#...') has no place in a node URL (a '#' in a password or a path is written %23)"
    };
    Err(Error::invalid(format!(
        "malformed node URL {shown:?}: {why}"
    )))
}

/// What redis-rs parses but would only fail on at the first request: a database below 0 or
/// above any server's, and port 0.
fn check_parsed(info: &redis::ConnectionInfo, display: &str) -> Result<()> {
    let bad = |why: String| {
        Err(Error::invalid(format!(
            "malformed node URL {display:?}: {why}"
        )))
    };
    let db = info.redis_settings().db();
    if db < 0 {
        return bad(format!("database {db}: must be 0 or more"));
    }
    // Redis numbers its databases below its `databases` setting, an int: a larger index is
    // refused here rather than by every connection (`SELECT` then says "out of range").
    if db > i64::from(i32::MAX) {
        return bad(format!(
            "database {db}: above any Redis server's (they are numbered from 0 below the \
             server's `databases` setting, 16 by default)"
        ));
    }
    if let redis::ConnectionAddr::Tcp(_, 0) | redis::ConnectionAddr::TcpTls { port: 0, .. } =
        info.addr()
    {
        return bad("port 0: give the server's port (6379 when left out)".to_string());
    }
    Ok(())
}

fn address(addr: &redis::ConnectionAddr) -> String {
    match addr {
        redis::ConnectionAddr::Tcp(host, port)
        | redis::ConnectionAddr::TcpTls { host, port, .. } => {
            let host = host.to_ascii_lowercase();
            // The loopback's usual spellings reach one server: `localhost` resolves to one of
            // them (a nested `ferrolock run` written the other way would wait for itself).
            let host = match host.as_str() {
                "127.0.0.1" | "::1" | "[::1]" => "localhost",
                other => other,
            };
            format!("{host}:{port}")
        }
        redis::ConnectionAddr::Unix(path) => path.display().to_string(),
        other => format!("{other:?}"),
    }
}

/// The server and database a standalone node URL reaches (`host:port/db`, the server named
/// as a manager compares its nodes: see `Node::server`): for a caller that must tell whether
/// two node lists written apart (`h:1` and `H:1/0`) name the same keys. `None` for a URL that
/// does not parse as one (a cluster URL included).
pub fn server_address(url: &str) -> Option<String> {
    let info = url.into_connection_info().ok()?;
    Some(format!(
        "{}/{}",
        address(info.addr()),
        info.redis_settings().db()
    ))
}

/// Refuses a TCP URL whose credentials hold a character that ends them in a URL (`/`, `?`,
/// `#`), before any parser reads a piece of the password as a host, a database or a
/// parameter and names it in its message; and a unix URL with credentials before its path.
fn check_userinfo(url: &str, display: &str) -> Result<()> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok(());
    };
    match credentials_end(scheme, rest) {
        // redis-rs reads a socket's credentials from `?user=` and `?pass=` only.
        Some(_) if is_unix(scheme) => Err(Error::invalid(format!(
            "malformed node URL {display:?}: a unix:// URL takes its user and password as \
             ?user=...&pass=..., not before its path"
        ))),
        Some(at) if rest[..at].contains(['/', '?', '#']) => Err(Error::invalid(format!(
            "malformed node URL {display:?}: the part before its last '@' holds '/', '?' or \
             '#': write them as %2F, %3F and %23 in a user or password (a cluster seed takes \
             no credentials: they go before the main host)"
        ))),
        _ => Ok(()),
    }
}

/// A URL's `?...#...` tail with any secret in its parameters replaced by `***`.
fn redact_query(query: &str) -> String {
    let (params, fragment) = match query.find('#') {
        Some(f) => query.split_at(f),
        None => (query, ""),
    };
    let Some(params) = params.strip_prefix('?') else {
        return query.to_string();
    };
    // Everything after a password parameter may be more of it (an unescaped `&` or `#`).
    let mut secret = false;
    let params: Vec<String> = params
        .split('&')
        .map(|pair| match pair.split_once('=') {
            _ if secret => "***".to_string(),
            Some((name, _)) if name.to_ascii_lowercase().contains("pass") => {
                secret = true;
                format!("{name}=***")
            }
            Some((name, value)) => {
                format!("{name}={}", crate::node_cluster::redact_seed(value))
            }
            None => pair.to_string(),
        })
        .collect();
    let fragment = if secret && !fragment.is_empty() {
        "#***"
    } else {
        fragment
    };
    format!("?{}{fragment}", params.join("&"))
}

/// The query parameters redis-rs reads from a standalone node URL (any other would be
/// ignored, as `?password=` or `?db=` on a `redis://` URL would be): a TCP URL takes only
/// `protocol`; a unix socket URL also `db`, `user` and `pass`.
fn check_query(url: &str, display: &str) -> Result<()> {
    let Some((_, query)) = url.split_once('?') else {
        return Ok(());
    };
    let query = query.split('#').next().unwrap_or_default();
    // The scheme ends at the first `:`: redis-rs takes `unix:/path` as well as `unix:///path`.
    let unix = url
        .split_once(':')
        .is_some_and(|(scheme, _)| is_unix(scheme));
    let known: &[&str] = if unix {
        &["db", "user", "pass", "protocol"]
    } else {
        &["protocol"]
    };
    let mut after_password = false;
    let mut seen: Vec<&str> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let name = pair.split('=').next().unwrap_or(pair);
        if after_password && !known.contains(&name) {
            // Perhaps the rest of a password that holds an unescaped `&`: not to be shown.
            return Err(Error::invalid(format!(
                "malformed node URL {display:?}: an unknown parameter after pass= (a \
                 password that holds '&', '#' or '=' must write them as %26, %23 and %3D)"
            )));
        }
        after_password |= name == "pass";
        if name == "protocol" {
            let value = pair.split_once('=').map_or("", |(_, v)| v);
            if !matches!(value, "2" | "3" | "resp2" | "resp3") {
                // After pass=, the value may be more of a password (an unescaped `&`).
                let shown = match after_password {
                    true => "***".to_string(),
                    false => format!("{value:?}"),
                };
                return Err(Error::invalid(format!(
                    "malformed node URL {display:?}: protocol={shown}: expected resp2 or resp3"
                )));
            }
        }
        if !known.contains(&name) {
            return Err(Error::invalid(format!(
                "malformed node URL {display:?}: unknown parameter {name:?} ({})",
                if unix {
                    "a unix:// URL takes db, user, pass and protocol"
                } else {
                    "a redis:// URL takes only protocol: the password goes in \
                     redis://[user:password@]host:port and the database in /db"
                }
            )));
        }
        // `?db=1&db=2`: redis-rs would read one of them and drop the other without a word.
        if seen.contains(&name) {
            return Err(Error::invalid(format!(
                "malformed node URL {display:?}: parameter {name:?} is given more than once \
                 (only one of them would be used)"
            )));
        }
        seen.push(name);
    }
    Ok(())
}

/// A slot probe on a standalone connection: cannot happen (`guards_slots` holds only for a
/// cluster's node), but an error holds the vote back where a panic would end the caller.
fn not_a_cluster() -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Client,
        "slot probe on a standalone connection",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node as a manager opens it, for the URL checks (no connection is made here).
    fn open(url: &str) -> Result<Node> {
        Node::open(
            url,
            None,
            GuardWindow::Fixed(Duration::ZERO),
            ServerIds::default(),
            true,
            Duration::from_millis(100),
            crate::runtime::Home::here(),
        )
    }

    #[test]
    fn a_timeout_is_named_to_the_millisecond() {
        let shown = |d: Duration| match timed_out(d) {
            NodeError::Unreachable(text) => text,
            other => panic!("{other:?}"),
        };
        // A renewal batch of one: the node timeout plus 50 µs.
        assert_eq!(
            shown(Duration::from_micros(200_050)),
            "no reply within 200ms"
        );
        assert_eq!(
            shown(Duration::from_micros(205_000)),
            "no reply within 205ms"
        );
        // Down, never up: no reply came within 100ms either.
        assert_eq!(
            shown(Duration::from_micros(100_500)),
            "no reply within 100ms"
        );
        assert_eq!(shown(Duration::from_secs(2)), "no reply within 2s");
        assert_eq!(shown(Duration::from_micros(300)), "no reply within 300µs");
    }

    #[test]
    fn passwords_are_redacted_from_urls() {
        assert_eq!(redact_url("redis://u:pw@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact_url("rediss://:pw@h:1"), "rediss://:***@h:1");
        assert_eq!(redact_url("redis://pw@h:1"), "redis://***@h:1");
        assert_eq!(redact_url("redis://h:1"), "redis://h:1");
        assert_eq!(redact_url("redis://u:p@ss@h"), "redis://u:***@h");
        assert_eq!(redact_url("garbage"), "garbage");
        // A mistyped scheme is no reason to show a password.
        assert_eq!(redact_url("redis:/u:s3cret@h:1"), "***@h:1");
        assert_eq!(redact_url("u:s3cret@h:1"), "***@h:1");
        assert_eq!(redact_url("redis//:p@ss@h"), "***@h");
        // redis-rs's `unix:/path` form carries its password in the query.
        assert_eq!(
            redact_url("unix:/tmp/r.sock?db=1&pass=s3cret"),
            "unix:/tmp/r.sock?db=1&pass=***"
        );
        assert_eq!(
            redact_url("unix:/tmp/r.sock?db=1&pass=s3cr@tTail&user=x"),
            "unix:/tmp/r.sock?db=1&pass=***&***"
        );
        assert_eq!(redact_url("u:p?w@h:1"), "***@h:1");
        // A password with an unescaped `/` ends at the last `@` all the same.
        assert_eq!(redact_url("redis://:s3c/ret@h:1/0"), "redis://:***@h:1/0");
        assert_eq!(
            redact_url("unix:///tmp/r.sock?db=1&pass=s3cret#x"),
            "unix:///tmp/r.sock?db=1&pass=***#***"
        );
        assert_eq!(redact_url("unix:///tmp/a@b.sock"), "unix:///tmp/a@b.sock");
        for url in [
            "unix://u:pw@/tmp/r.sock",
            "unix://u:p#w@/tmp/r.sock",
            "unix://u:p?w@/tmp/r.sock",
        ] {
            assert_eq!(redact_url(url), "unix://u:***@/tmp/r.sock", "{url}");
        }
        assert_eq!(redact_url("UNIX:///tmp/a@b.sock"), "UNIX:///tmp/a@b.sock");
        // An `@` after the host (never valid) ends the credentials all the same.
        assert_eq!(
            redact_url("redis+cluster://h:1?seed=u:s3cret@h:2&seed=h:3"),
            "redis+cluster://h:***@h:2&seed=h:3"
        );
        for (url, shown) in [
            ("redis://u:s3c#ret@h:1", "redis://u:***@h:1"),
            ("redis://u:s3c?ret@h:1", "redis://u:***@h:1"),
            ("rediss://:s3c?x=ret@h:1/0", "rediss://:***@h:1/0"),
            (
                "redis+cluster://u:s3c/ret@h:1?seed=h:2",
                "redis+cluster://u:***@h:1?seed=h:2",
            ),
            (
                "unix:///tmp/r.sock?pass=s3c&ret=1&db=2",
                "unix:///tmp/r.sock?pass=***&***&***",
            ),
            (
                "unix:///tmp/r.sock?pass=s3c#ret",
                "unix:///tmp/r.sock?pass=***#***",
            ),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn unknown_query_parameters_are_refused_without_the_password() {
        for (url, name) in [
            ("redis://127.0.0.1:6379?password=hunter2", "password"),
            ("redis://127.0.0.1:6379/?db=2", "db"),
            ("unix:///tmp/r.sock?passwd=hunter2&pass=hunter2", "passwd"),
            // Given twice: one of them would be dropped without a word.
            ("unix:///tmp/r.sock?db=1&db=2", "db"),
            ("unix:///tmp/r.sock?pass=hunter2&pass=hunter2", "pass"),
            (
                "redis://127.0.0.1:6379?protocol=resp3&protocol=resp2",
                "protocol",
            ),
        ] {
            let Err(err) = open(url) else {
                panic!("{url} accepted")
            };
            assert_eq!(err.kind(), ErrorKind::InvalidArgument);
            assert!(!err.message().contains("hunter2"), "{err}");
            assert!(err.message().contains(&format!("{name:?}")), "{err}");
        }
        for url in [
            "redis://127.0.0.1:6379?protocol=resp2",
            "redis://127.0.0.1:6379?protocol=3",
            "unix:///tmp/r.sock?db=1&user=u&pass=p",
            "unix:/tmp/r.sock?db=1&pass=p",
        ] {
            assert!(open(url).is_ok(), "{url}");
        }
        // A protocol redis-rs does not know is named as such, not as "9".
        for url in [
            "redis://u:hunter2@127.0.0.1:6379?protocol=9",
            "redis://127.0.0.1:6379?protocol=resp9",
            "redis://127.0.0.1:6379?protocol",
        ] {
            let Err(err) = open(url) else {
                panic!("{url} accepted")
            };
            assert_eq!(err.kind(), ErrorKind::InvalidArgument);
            assert!(
                err.message().contains("protocol=")
                    && err.message().contains("expected resp2 or resp3"),
                "{err}"
            );
            assert!(!err.message().contains("hunter2"), "{err}");
        }
    }

    #[test]
    fn malformed_urls_are_invalid_arguments_naming_the_url_without_password() {
        for url in [
            "http://u:hunter2@h:1",
            "redis://u:hunter2@[bad",
            "nonsense",
            "",
            "redis://:hunter2/x@127.0.0.1:1",
            "redis://u:hunter2#x@127.0.0.1:1",
            "redis://u:hunter2?x@127.0.0.1:1",
            "rediss://u:x?hunter2=1@127.0.0.1:1",
            "redis+cluster://u:x/hunter2@127.0.0.1:1",
            "redis+cluster://u:x?hunter2@127.0.0.1:1",
            "unix:///tmp/r.sock?pass=x&hunter2=1",
            "unix:///tmp/r.sock?pass=x&hunter2",
            "unix://u:hun#ter2@/tmp/r.sock",
            "unix://u:hunter2@/tmp/r.sock",
            "redis:/u:hunter2@127.0.0.1:1",
            "u:hunter2@127.0.0.1:1",
            "redis//u:hunter2@127.0.0.1:1",
        ] {
            let Err(err) = open(url) else {
                panic!("{url} accepted")
            };
            assert_eq!(err.kind(), ErrorKind::InvalidArgument);
            assert!(!err.message().contains("hunter2"), "{err}");
            assert!(err.message().contains(&redact_url(url)), "{err}");
        }
    }

    #[test]
    fn what_redis_rs_parses_but_cannot_use_is_refused_at_once() {
        for (url, why) in [
            ("redis://u:hunter2@127.0.0.1:1#frag", "a fragment"),
            ("rediss://127.0.0.1:1/0#hunter2", "a fragment"),
            ("rediss://127.0.0.1:1#insecure", "always verifies"),
            ("unix:///tmp/r.sock?pass=hunter2#x", "a fragment"),
            ("redis+cluster://127.0.0.1:7000#x", "a fragment"),
            ("redis+cluster://127.0.0.1:7000?seed=127.0.0.1:0", "port 0"),
            ("redis://127.0.0.1:1/-1", "database -1: must be 0 or more"),
            (
                "redis://127.0.0.1:1/999999999999",
                "database 999999999999: above any",
            ),
            ("redis://127.0.0.1:0", "port 0"),
            (
                "redis://u:hunter2@localhost:99999",
                "port 99999 is out of range",
            ),
            ("redis://localhost:99999/0", "port 99999 is out of range"),
            (
                "redis://:hunter2@host:notaport",
                "port \"notaport\" is not a number",
            ),
            ("redis://[::1]:6x79", "port \"6x79\" is not a number"),
            (
                "redis://:hunter2@127.0.0.1/abc",
                "database \"abc\" is not a number",
            ),
            ("http://x", "redis+cluster://host:port"),
            ("http://x", "unsupported scheme \"http\""),
            ("localhost:6379", "no scheme"),
            ("redis://0.0.0.0:6379", "\"0.0.0.0\" is a wildcard address"),
            (
                "redis://:hunter2@[::]:6379",
                "\"[::]\" is a wildcard address",
            ),
            ("redis://[fe80::1%25eth0]:6379", "an IPv6 zone"),
            (
                "unix:///tmp/r.sock?pass=hunter2&db=abc",
                "database \"abc\" is not a number",
            ),
            // Two URLs run together (a list written with ';' or ' '): the list's separator said.
            (
                "redis://127.0.0.1:6379;redis://127.0.0.1:6380",
                "node URLs are separated by commas",
            ),
            (
                "redis://:hunter2@127.0.0.1:6379 redis://127.0.0.1:6380",
                "node URLs are separated by commas",
            ),
            ("redis://h:1/0\0", "a control character"),
            ("redis://:hun\u{1}ter2@h:1", "a control character"),
        ] {
            let Err(err) = open(url) else {
                panic!("{url} accepted")
            };
            assert_eq!(err.kind(), ErrorKind::InvalidArgument);
            assert!(err.message().contains(why), "{url}: {err}");
            assert!(
                !err.message().contains("hunter2") && !err.message().contains("frag\""),
                "{err}"
            );
        }
        // The port may be left out, as in every Redis client: 6379.
        let node = open("redis://127.0.0.1").unwrap();
        assert_eq!(node.server(), "localhost:6379");
    }
}
