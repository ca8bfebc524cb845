//! A real Redis Cluster on loopback: N primaries (and optionally replicas), each a
//! `RedisServer` with its own port, free bus port (+10000), directory and `nodes.conf`.

use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::{RedisServer, ServerOptions};

/// Forming a cluster and agreeing on its slots takes several gossip rounds; a loaded 2-core
/// machine can stretch them to many seconds.
const CLUSTER_READY_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Clone, Debug)]
pub struct ClusterOptions {
    pub primaries: usize,
    /// Replicas per primary.
    pub replicas: usize,
    /// At least 2000 ms, so CPU stalls on a small machine cause no spurious failovers.
    pub node_timeout_ms: u64,
    /// `cluster-require-full-coverage`: with `false`, the slots of live primaries keep
    /// serving while another primary is down.
    pub require_full_coverage: bool,
    /// Appended to every node's arguments.
    pub extra_args: Vec<String>,
    /// ACL file lines for every node, replicas included (see `ServerOptions::acl_users`).
    pub acl_users: Vec<String>,
}

impl Default for ClusterOptions {
    fn default() -> ClusterOptions {
        ClusterOptions {
            primaries: 3,
            replicas: 0,
            node_timeout_ms: 3000,
            require_full_coverage: true,
            extra_args: Vec::new(),
            acl_users: Vec::new(),
        }
    }
}

/// A running cluster; every node is killed (and its directory removed) on drop.
pub struct RedisCluster {
    /// Primaries first (in `--cluster create` order), then replicas.
    pub nodes: Vec<RedisServer>,
    opts: ClusterOptions,
}

impl RedisCluster {
    /// Three primaries, no replicas.
    pub fn start() -> RedisCluster {
        RedisCluster::start_with(ClusterOptions::default())
    }

    /// Three or more primaries are formed by `redis-cli --cluster create`; a single primary
    /// (no replicas) takes every slot with `CLUSTER ADDSLOTSRANGE`.
    pub fn start_with(opts: ClusterOptions) -> RedisCluster {
        assert!(
            opts.primaries >= 3 || (opts.primaries == 1 && opts.replicas == 0),
            "redis-cli --cluster create needs 3 primaries (or 1 primary, no replicas)"
        );
        let total = opts.primaries * (1 + opts.replicas);
        let mut args: Vec<String> = [
            "--cluster-enabled",
            "yes",
            // Relative: resolved against each node's own `--dir`.
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &opts.node_timeout_ms.to_string(),
            "--cluster-require-full-coverage",
            if opts.require_full_coverage {
                "yes"
            } else {
                "no"
            },
        ]
        .map(String::from)
        .to_vec();
        args.extend(opts.extra_args.iter().cloned());
        let nodes: Vec<RedisServer> = (0..total)
            .map(|_| {
                RedisServer::start_with(ServerOptions {
                    extra_args: args.clone(),
                    acl_users: opts.acl_users.clone(),
                    ..ServerOptions::default()
                })
            })
            .collect();
        if opts.primaries == 1 {
            let ok: String = nodes[0].cmd(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]);
            assert_eq!(ok, "OK");
            let cluster = RedisCluster { nodes, opts };
            cluster.wait_ready();
            return cluster;
        }
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port()));
        }
        create
            .arg("--cluster-replicas")
            .arg(opts.replicas.to_string())
            .arg("--cluster-yes");
        let out = create
            .output()
            .expect("run redis-cli --cluster create (apt-get install redis-tools)");
        let cluster = RedisCluster { nodes, opts };
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.wait_ready();
        cluster.wait_replicas_synced();
        cluster
    }

    /// Until every running replica not paused reports its link to its primary up and no sync in
    /// progress (a failover needs a replica that has the data).
    pub fn wait_replicas_synced(&self) {
        let deadline = Instant::now() + CLUSTER_READY_TIMEOUT;
        loop {
            let lagging: Vec<u16> = self
                .nodes
                .iter()
                .filter(|n| n.answers() && role(n) == "slave")
                .filter(|n| {
                    let info: String = n.cmd(&["INFO", "replication"]);
                    !info.lines().any(|l| l.trim() == "master_link_status:up")
                        || info
                            .lines()
                            .any(|l| l.trim() == "master_sync_in_progress:1")
                })
                .map(|n| n.port())
                .collect();
            if lagging.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "replicas {lagging:?} not in sync within {CLUSTER_READY_TIMEOUT:?}"
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// The running replicas not paused of `primary` (by `INFO replication`'s `master_port`).
    pub fn replicas_of(&self, primary: &RedisServer) -> Vec<&RedisServer> {
        let line = format!("master_port:{}", primary.port());
        self.nodes
            .iter()
            .filter(|n| n.answers() && n.port() != primary.port())
            .filter(|n| {
                let info: String = n.cmd(&["INFO", "replication"]);
                info.lines().any(|l| l.trim() == "role:slave")
                    && info.lines().any(|l| l.trim() == line)
            })
            .collect()
    }

    /// The primary serving `key`'s slot and its first running replica: the pair a failover
    /// test switches.
    pub fn primary_and_replica(&self, key: &str) -> (&RedisServer, &RedisServer) {
        let primary = self.primary_for_key(key);
        let replica = *self
            .replicas_of(primary)
            .first()
            .unwrap_or_else(|| panic!("the shard serving {key:?} has no running replica"));
        (primary, replica)
    }

    /// `CLUSTER FAILOVER [mode]` on `replica` (`None`: the graceful one; `FORCE`, `TAKEOVER`),
    /// then waits until it reports itself master (ROLE) and the cluster is ready again with
    /// every node agreeing that it serves its slots.
    pub fn failover(&self, replica: &RedisServer, mode: Option<&str>) {
        let mut args = vec!["CLUSTER", "FAILOVER"];
        args.extend(mode);
        let ok: String = replica.cmd(&args);
        assert_eq!(ok, "OK", "{args:?} on port {}", replica.port());
        let deadline = Instant::now() + CLUSTER_READY_TIMEOUT;
        while role(replica) != "master" {
            assert!(
                Instant::now() < deadline,
                "port {} not master within {CLUSTER_READY_TIMEOUT:?} after {args:?}",
                replica.port()
            );
            thread::sleep(Duration::from_millis(50));
        }
        self.wait_ready();
    }

    /// `redis-cli --cluster reshard`: moves `slots` slots (its lowest first) from primary
    /// `from` to primary `to`, keys included, `pipeline` keys per MIGRATE, then waits until
    /// every node agrees on the new owners. Returns redis-cli's output.
    pub fn reshard(
        &self,
        from: &RedisServer,
        to: &RedisServer,
        slots: usize,
        pipeline: usize,
    ) -> String {
        self.start_reshard(from, to, slots, pipeline).finish(self)
    }

    /// `reshard`, running: pause it (SIGSTOP) to hold a slot in the migrating state.
    pub fn start_reshard(
        &self,
        from: &RedisServer,
        to: &RedisServer,
        slots: usize,
        pipeline: usize,
    ) -> Reshard {
        let id = |n: &RedisServer| n.cmd::<String>(&["CLUSTER", "MYID"]);
        let child = Command::new("redis-cli")
            .arg("--cluster")
            .arg("reshard")
            .arg(format!("127.0.0.1:{}", from.port()))
            .args(["--cluster-from", &id(from)])
            .args(["--cluster-to", &id(to)])
            .args(["--cluster-slots", &slots.to_string()])
            .args(["--cluster-pipeline", &pipeline.to_string()])
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run redis-cli --cluster reshard");
        Reshard { child: Some(child) }
    }

    /// The slot ranges `node` serves, as the first running node sees them.
    pub fn slots_of(&self, node: &RedisServer) -> Vec<(u16, u16)> {
        let viewer = self
            .nodes
            .iter()
            .find(|n| n.answers())
            .expect("no running node");
        self.slot_owners(viewer)
            .into_iter()
            .filter(|o| o.2 == node.port() as i64)
            .map(|(s, e, _)| (s as u16, e as u16))
            .collect()
    }

    /// The running nodes not paused that are primaries now (`ROLE`), in `nodes` order.
    pub fn current_primaries(&self) -> Vec<&RedisServer> {
        self.nodes
            .iter()
            .filter(|n| n.answers() && role(n) == "master")
            .collect()
    }

    /// Until every running node not paused reports `cluster_state:ok`, all slots assigned, and the same
    /// slot owners as every other node.
    pub fn wait_ready(&self) {
        let deadline = Instant::now() + CLUSTER_READY_TIMEOUT;
        loop {
            let Err(last) = self.check_ready() else {
                return;
            };
            assert!(
                Instant::now() < deadline,
                "cluster not ready within {CLUSTER_READY_TIMEOUT:?}: {last}"
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    fn check_ready(&self) -> Result<(), String> {
        let mut views: Vec<Vec<(i64, i64, i64)>> = Vec::new();
        for n in self.nodes.iter().filter(|n| n.answers()) {
            let info: String = n.cmd(&["CLUSTER", "INFO"]);
            if !info.lines().any(|l| l.trim() == "cluster_state:ok") {
                return Err(format!("port {} is not cluster_state:ok", n.port()));
            }
            views.push(self.slot_owners(n));
        }
        if views.windows(2).any(|w| w[0] != w[1]) {
            return Err("nodes disagree on the slot owners".into());
        }
        Ok(())
    }

    /// (start, end, primary port) per slot range, as one node sees it.
    fn slot_owners(&self, node: &RedisServer) -> Vec<(i64, i64, i64)> {
        let slots: Vec<redis::Value> = node.cmd(&["CLUSTER", "SLOTS"]);
        let mut out: Vec<(i64, i64, i64)> = slots
            .iter()
            .filter_map(|range| {
                let redis::Value::Array(items) = range else {
                    return None;
                };
                let int = |v: &redis::Value| match v {
                    redis::Value::Int(i) => Some(*i),
                    _ => None,
                };
                let primary = match items.get(2)? {
                    redis::Value::Array(p) => int(p.get(1)?)?,
                    _ => return None,
                };
                Some((int(items.first()?)?, int(items.get(1)?)?, primary))
            })
            .collect();
        out.sort();
        out
    }

    /// `redis+cluster://127.0.0.1:<first primary's port>`: one seed is enough.
    pub fn url(&self) -> String {
        format!("redis+cluster://127.0.0.1:{}", self.nodes[0].port())
    }

    /// The node currently primary for `slot`, as the first running node sees it.
    pub fn primary_for_slot(&self, slot: u16) -> &RedisServer {
        let viewer = self
            .nodes
            .iter()
            .find(|n| n.answers())
            .expect("no running node");
        let owners = self.slot_owners(viewer);
        let port = owners
            .iter()
            .find(|(s, e, _)| (*s..=*e).contains(&(slot as i64)))
            .map(|o| o.2)
            .unwrap_or_else(|| panic!("slot {slot} has no owner"));
        self.nodes
            .iter()
            .find(|n| n.port() as i64 == port)
            .expect("owner is one of ours")
    }

    /// The primary serving `key`.
    pub fn primary_for_key(&self, key: &str) -> &RedisServer {
        self.primary_for_slot(key_slot(key))
    }

    /// One key per primary, `"{prefix}:{i}"` with the first `i` that lands there, in
    /// `primaries()` order.
    pub fn key_per_primary(&self, prefix: &str) -> Vec<String> {
        self.primaries()
            .iter()
            .map(|p| {
                (0..)
                    .map(|i| format!("{prefix}:{i}"))
                    .find(|k| self.primary_for_key(k).port() == p.port())
                    .expect("every primary serves some slot")
            })
            .collect()
    }

    /// The primaries, in `--cluster create` order (as created: after a failover, see
    /// `current_primaries`).
    pub fn primaries(&self) -> &[RedisServer] {
        &self.nodes[..self.opts.primaries]
    }

    /// Index in `nodes` of the node on `port`.
    pub fn index_of_port(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port() == port)
            .expect("a node of this cluster")
    }
}

/// A running `redis-cli --cluster reshard`; killed on drop if not finished.
pub struct Reshard {
    child: Option<Child>,
}

impl Reshard {
    /// SIGSTOP: the slot being moved stays in the migrating state until `resume`.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, sig: libc::c_int) {
        let child = self.child.as_ref().expect("running");
        // SAFETY: plain syscall on our own child, not reaped yet (so its pid is not reused).
        let sent = unsafe { libc::kill(child.id() as libc::pid_t, sig) } == 0;
        assert!(
            sent,
            "signal {sig} to redis-cli: {}",
            std::io::Error::last_os_error()
        );
    }

    /// Waits for redis-cli to exit (it must succeed), then for every node to agree on the
    /// new owners. Returns its output.
    pub fn finish(mut self, cluster: &RedisCluster) -> String {
        let out = self
            .child
            .take()
            .expect("running")
            .wait_with_output()
            .expect("wait for redis-cli");
        let text = format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "redis-cli --cluster reshard failed: {text}"
        );
        cluster.wait_ready();
        text
    }
}

impl Drop for Reshard {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: as in `signal`.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGCONT) };
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

trait Answers {
    /// Running and not paused: a node the cluster's waits can ask (a paused one would stall
    /// them; the other nodes go on without it).
    fn answers(&self) -> bool;
}

impl Answers for RedisServer {
    fn answers(&self) -> bool {
        self.is_running() && !self.is_paused()
    }
}

/// The first element of `ROLE`: `master`, `slave` or `sentinel`.
pub fn role(node: &RedisServer) -> String {
    let reply: Vec<redis::Value> = node.cmd(&["ROLE"]);
    match reply.first() {
        Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(redis::Value::SimpleString(s)) => s.clone(),
        other => panic!("ROLE on port {}: {other:?}", node.port()),
    }
}

/// Redis Cluster's `keyHashSlot`: CRC16-XMODEM of the hash tag (or of the whole key) mod 16384.
pub fn key_slot(key: &str) -> u16 {
    let b = key.as_bytes();
    let hashed = match b.iter().position(|&c| c == b'{') {
        Some(open) => match b[open + 1..].iter().position(|&c| c == b'}') {
            Some(len) if len > 0 => &b[open + 1..open + 1 + len],
            _ => b,
        },
        None => b,
    };
    let mut crc: u16 = 0;
    for &byte in hashed {
        crc ^= (byte as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}
