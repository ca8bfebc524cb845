#![allow(dead_code)]

pub mod holds;
pub mod redisson;

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use ferrolock::{LockManager, LockOptions, ManagerOptions};
use ferrolock_testbed::{ClusterOptions, RedisCluster, RedisServer};

/// Tests that pause or kill servers or measure deadlines take this, so a loaded 2-core
/// machine runs them one at a time.
pub fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Clears the process-wide test hook when the test ends, also on a failure.
pub struct HookGuard;
impl Drop for HookGuard {
    fn drop(&mut self) {
        ferrolock::__set_test_hook(None);
    }
}

/// Holds a test hook's caller until `go` is set, at most 60 s.
pub fn hold_until(go: &std::sync::atomic::AtomicBool) {
    let end = std::time::Instant::now() + Duration::from_secs(60);
    while !go.load(std::sync::atomic::Ordering::SeqCst) && std::time::Instant::now() < end {
        std::thread::sleep(ms(1));
    }
}

pub fn manager(urls: &[String], opts: LockOptions) -> LockManager {
    // Test servers are freshly started: the restart guard is off except in its own tests.
    LockManager::new(
        ManagerOptions::new()
            .nodes(urls.iter().cloned())
            .restart_guard(Duration::ZERO)
            .lock(opts),
    )
    .expect("manager")
}

/// Defaults for tests: no watchdog unless the test is about it, generous node timeout.
pub fn opts() -> LockOptions {
    LockOptions::default().watchdog(false)
}

pub fn get(server: &RedisServer, key: &str) -> Option<String> {
    server.cmd(&["GET", key])
}

pub fn pttl(server: &RedisServer, key: &str) -> i64 {
    server.cmd(&["PTTL", key])
}

/// A number `INFO <section>` gives (`uptime_in_seconds` of `server`, say).
pub fn info_number(server: &RedisServer, section: &str, field: &str) -> u64 {
    let info: String = server.cmd(&["INFO", section]);
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("INFO {section} has no number {field}"))
}

/// Waits until `server` has been up for longer than `window` (uptime reads up to 1 s high), so
/// that a restart guard of `window` lets its votes through; then the manager on `url` with that
/// guard and `lock` as its defaults.
pub async fn guarded_manager_once_up(
    server: &RedisServer,
    url: String,
    window: Duration,
    lock: LockOptions,
) -> LockManager {
    while info_number(server, "server", "uptime_in_seconds") <= window.as_secs() + 1 {
        tokio::time::sleep(ms(200)).await;
    }
    LockManager::new(
        ManagerOptions::new()
            .nodes([url])
            .restart_guard(window)
            .lock(lock),
    )
    .unwrap()
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn unique_key(name: &str) -> String {
    format!("test:{name}:{}", std::process::id())
}

/// `calls=` of one command in `INFO commandstats`.
pub fn calls(server: &RedisServer, command: &str) -> u64 {
    let info: String = server.cmd(&["INFO", "commandstats"]);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .map(|v| v.parse().unwrap())
        .unwrap_or(0)
}

/// Bytes the kernel holds for `server` that it has not read yet, over its established
/// connections (/proc/net/tcp{,6}): with the server paused, proof that a request was written
/// to it, whatever the speed of the machine.
pub fn unread_bytes(server: &RedisServer) -> u64 {
    let port = format!(":{:04X}", server.port());
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|text| {
            text.lines()
                .skip(1)
                .filter_map(|line| {
                    let f: Vec<&str> = line.split_whitespace().collect();
                    // local address, remote address, state (01: established), tx:rx queues
                    let (local, state, queues) = (f.get(1)?, f.get(3)?, f.get(4)?);
                    if !local.ends_with(&port) || *state != "01" {
                        return None;
                    }
                    u64::from_str_radix(queues.split(':').nth(1)?, 16).ok()
                })
                .collect::<Vec<_>>()
        })
        .sum()
}

/// Waits until a request has been written to the paused `server` (see `unread_bytes`); the
/// bound is a failure bound.
pub async fn written_to(server: &RedisServer) {
    let start = std::time::Instant::now();
    while unread_bytes(server) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "nothing was ever written to the paused node at {}",
            server.url()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Waits until `key` is gone from every one of `servers`. An attempt that fails is undone at
/// once where it was answered, and where the answer comes after the caller heard the outcome
/// (the grant decided at a quorum), when that answer arrives: a test that reads every node
/// right after the failure can find a late grant not yet undone.
#[allow(dead_code)]
pub async fn gone_everywhere(servers: &[RedisServer], key: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<u16> = servers
            .iter()
            .filter(|s| s.cmd::<bool>(&["EXISTS", key]))
            .map(|s| s.port())
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{key} was left behind on the nodes at ports {left:?}"
        );
        tokio::time::sleep(ms(10)).await;
    }
}

/// Waits until `key` exists on every one of `servers`. An acquire returns at a quorum, so the
/// other nodes' grants may still be on their way: a test that then changes a node's copy must
/// first see it there (one that did not saw its DEL overtaken by the late grant).
#[allow(dead_code)]
pub async fn granted_everywhere(servers: &[RedisServer], key: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !servers.iter().all(|s| s.cmd::<bool>(&["EXISTS", key])) {
        assert!(
            std::time::Instant::now() < deadline,
            "the grant of {key} never reached every node"
        );
        tokio::time::sleep(ms(10)).await;
    }
}

/// Until exactly one waiter is queued on `name` on `server` (its slot's primary on a cluster);
/// a failure bound of 30 s.
pub async fn await_one_queued(server: &RedisServer, name: &str) {
    let queue = format!("ferrolock:queue:{{{name}}}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while server.cmd::<i64>(&["ZCARD", &queue]) != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "nobody queued on {name} within 30 s"
        );
        tokio::time::sleep(ms(20)).await;
    }
}

/// A cluster whose replicas can take over at once (`CLUSTER FAILOVER TAKEOVER`), however long
/// they were cut off (`cluster-replica-validity-factor 0`), and that serves the slots it still
/// covers while a primary is down: one replica per primary.
pub fn takeover_cluster() -> RedisCluster {
    RedisCluster::start_with(ClusterOptions {
        replicas: 1,
        require_full_coverage: false,
        extra_args: ["--cluster-replica-validity-factor", "0"]
            .map(String::from)
            .to_vec(),
        ..ClusterOptions::default()
    })
}
