//! The lock's contract on healthy nodes: wire format, exclusion, release, extend, bad input.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use ferrolock::{ErrorKind, LockManager, LockOptions, ManagerOptions};
use ferrolock_testbed::{Cluster, RedisServer};

#[tokio::test]
async fn single_node_wire_format_is_set_nx_px_with_the_token() {
    let server = RedisServer::start();
    let ttl = Duration::from_secs(10);
    let m = manager(&[server.url()], opts().ttl(ttl));
    // Bounds from when the acquire was called, not from how fast this machine is: the key was
    // set after `called`, and the validity counts from the attempt's start, less the drift
    // (10 s × 0.01 + 2 ms).
    let called = Instant::now();
    let lock = m.acquire("orders:1001").await.unwrap();
    let validity = lock.validity();
    let pttl = pttl(&server, "orders:1001");
    let since_called = called.elapsed();
    assert_eq!(get(&server, "orders:1001").as_deref(), Some(lock.token()));
    // The attempt's time and 80 random bits (see token.rs).
    assert_eq!(lock.token().len(), 33);
    assert!(
        ferrolock::token_time(lock.token()).is_some(),
        "{}",
        lock.token()
    );
    let at_least = (ttl - since_called).as_millis() as i64 - 1;
    assert!((at_least..=10_000).contains(&pttl), "PTTL {pttl}");
    assert!(
        validity <= ms(9_898) && validity + since_called >= ms(9_898),
        "{validity:?}, {since_called:?} after the call"
    );
    assert!(
        lock.release().await.unwrap(),
        "release should report it held the lock"
    );
    assert_eq!(get(&server, "orders:1001"), None);
    assert!(!lock.is_held());
    let again = lock.release().await.unwrap_err();
    assert_eq!(again.kind(), ErrorKind::NotHeld);
}

#[tokio::test]
async fn every_acquisition_gets_a_fresh_token() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts());
    let a = m.acquire("k").await.unwrap();
    let token_a = a.token().to_string();
    a.release().await.unwrap();
    let b = m.acquire("k").await.unwrap();
    assert_ne!(token_a, b.token());
}

#[tokio::test]
async fn try_acquire_on_a_held_key_is_not_acquired_and_names_the_key() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts());
    let _held = m.acquire("busy").await.unwrap();
    let err = m.try_acquire("busy").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired);
    assert!(err.message().contains("\"busy\""), "{err}");
}

/// A bad ttl given to one acquire, semaphore or extend is refused naming the key, as every
/// other error of a lock does (the README's promise): "ttl 10ms is too short" alone left a
/// caller with many keys to guess which call was wrong.
#[tokio::test]
async fn a_bad_ttl_of_one_acquire_or_extend_names_the_key() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts());
    let short = opts().ttl(ms(10));
    let err = m.acquire_with("short-acquire", &short).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().contains("\"short-acquire\""), "{err}");
    let err = m
        .semaphore_with("short-permit", 2, 1, &short)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().contains("\"short-permit\""), "{err}");
    let lock = m.acquire("short-extend").await.unwrap();
    let err = lock.extend_for(ms(10)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().contains("\"short-extend\""), "{err}");
    let err = lock.extend_for(Duration::ZERO).await.unwrap_err();
    assert!(err.message().contains("\"short-extend\""), "{err}");
    assert!(lock.is_held(), "a refused extend leaves the lock held");
    lock.release().await.unwrap();
}
#[tokio::test]
async fn wait_budget_is_respected_then_not_acquired() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts());
    let _held = m.acquire("busy").await.unwrap();
    let started = Instant::now();
    let err = m
        .acquire_with("busy", &opts().wait(Some(ms(300))).retry_delay(ms(50)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired);
    let waited = started.elapsed();
    assert!(waited >= ms(300), "gave up early after {waited:?}");
    // A failure bound, not a speed claim: a waiter that ignored its budget would wait for
    // the holder's ttl (10 s), and get the lock.
    assert!(waited < ms(8_000), "overran its budget: {waited:?}");
}

#[tokio::test]
async fn a_waiter_gets_the_lock_after_release() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts().retry_delay(ms(20)));
    let held = m.acquire("handoff").await.unwrap();
    let m2 = m.clone();
    let waiter = tokio::spawn(async move { m2.acquire("handoff").await });
    tokio::time::sleep(ms(100)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter must block while the lock is held"
    );
    held.release().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(get(&server, "handoff").as_deref(), Some(got.token()));
}

#[tokio::test]
async fn extend_resets_the_ttl_and_moves_the_deadline() {
    let server = RedisServer::start();
    let ttl = ms(2_000);
    let m = manager(&[server.url()], opts().ttl(ttl));
    let lock = m.acquire("ext").await.unwrap();
    tokio::time::sleep(ms(600)).await;
    let before = lock.deadline();
    // Bounds from when extend was called (the node reset the ttl after that), so that a slow
    // machine cannot fail them: only a ttl that was not reset can.
    let called = Instant::now();
    let validity = lock.extend().await.unwrap();
    let left = pttl(&server, "ext");
    let since = called.elapsed();
    assert!(
        validity + since > ttl - ms(50),
        "{validity:?}, {since:?} after the call"
    );
    assert!(lock.deadline() > before + ms(500));
    assert!(
        left >= (ttl - since).as_millis() as i64 - 1,
        "PTTL {left}, {since:?}"
    );
    let called = Instant::now();
    let longer = lock.extend_for(Duration::from_secs(30)).await.unwrap();
    let left = pttl(&server, "ext");
    let since = called.elapsed();
    assert!(
        longer + since > ms(29_650),
        "{longer:?}, {since:?} after the call"
    );
    assert!(
        left >= (Duration::from_secs(30) - since).as_millis() as i64 - 1,
        "PTTL {left}"
    );
}

#[tokio::test]
async fn max_extensions_caps_manual_extends() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts().max_extensions(Some(2)));
    let lock = m.acquire("cap").await.unwrap();
    lock.extend().await.unwrap();
    lock.extend().await.unwrap();
    let err = lock.extend().await.unwrap_err();
    // The caller's cap, not a loss: the lock is still held.
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().contains("max_extensions=2"), "{err}");
    assert_eq!(lock.status(), ferrolock::LockStatus::Held);
    assert!(get(&server, "cap").is_some());
    assert!(lock.release().await.unwrap());
}

#[tokio::test]
async fn dropping_a_held_lock_releases_it() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts());
    drop(m.acquire("dropped").await.unwrap());
    let start = Instant::now();
    while get(&server, "dropped").is_some() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "dropped lock was never released"
        );
        tokio::time::sleep(ms(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn release_tells_the_queued_waiter_on_its_own_channel() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts().retry_delay(Duration::from_secs(10)));
    let mut sub = server.client();
    let mut pubsub = sub.as_pubsub();
    // Waiters listen on channels of their own: `ferrolock:release:{pub}:<waiter id>`.
    pubsub.psubscribe("ferrolock:release:{pub}:*").unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();

    // A waiter in another manager queues; the release then tells it on the channel.
    let lock = m.acquire("pub").await.unwrap();
    let other = manager(&[server.url()], opts().retry_delay(Duration::from_secs(10)));
    let waiter = tokio::spawn(async move { other.acquire("pub").await });
    let start = std::time::Instant::now();
    while server.cmd::<i64>(&["EXISTS", "ferrolock:queue:{pub}"]) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the waiter never queued"
        );
        tokio::time::sleep(ms(5)).await;
    }
    let queued: Vec<String> = server.cmd(&["ZRANGE", "ferrolock:queue:{pub}", "0", "0"]);
    lock.release().await.unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let msg = pubsub.get_message().expect("a release message");
    assert_eq!(
        msg.get_channel_name(),
        format!("ferrolock:release:{{pub}}:{}", queued[0]),
        "the release tells the queued waiter on its own channel"
    );
    assert_eq!(msg.get_payload_bytes(), b"0");
    let got = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(got.is_held());
}

#[tokio::test]
async fn two_managers_contending_never_both_hold_the_lock() {
    let cluster = Cluster::start(3);
    let counter_node = &cluster.servers[0];
    counter_node.cmd::<()>(&["SET", "counter", "0"]);
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    let counter_url = counter_node.url();
    for _ in 0..2 {
        // Separate managers: separate connections and client state, like two processes.
        let m = manager(&cluster.urls(), opts().retry_delay(ms(5)));
        for _ in 0..2 {
            let (m, inside, overlaps, url) = (
                m.clone(),
                inside.clone(),
                overlaps.clone(),
                counter_url.clone(),
            );
            workers.push(tokio::spawn(async move {
                let client = redis::Client::open(url).unwrap();
                let mut c = client.get_multiplexed_async_connection().await.unwrap();
                for _ in 0..25 {
                    let lock = m.acquire("contended").await.unwrap();
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    // Read, pause, write: loses updates unless the lock excludes.
                    let v: i64 = redis::cmd("GET")
                        .arg("counter")
                        .query_async(&mut c)
                        .await
                        .unwrap();
                    tokio::time::sleep(ms(1)).await;
                    let _: () = redis::cmd("SET")
                        .arg("counter")
                        .arg(v + 1)
                        .query_async(&mut c)
                        .await
                        .unwrap();
                    inside.fetch_sub(1, Ordering::SeqCst);
                    assert!(lock.release().await.unwrap());
                }
            }));
        }
    }
    for w in workers {
        w.await.unwrap();
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    assert_eq!(counter_node.cmd::<i64>(&["GET", "counter"]), 100);
}

#[tokio::test]
async fn release_by_a_non_owner_never_deletes_the_new_holders_key() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts().ttl(ms(200)));
    // Connected first: a 200 ms ttl is less than connecting may take on a loaded machine.
    m.acquire_with("warmup", &opts())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let stale = m.acquire("owner").await.unwrap();
    tokio::time::sleep(ms(300)).await;
    assert_eq!(
        get(&server, "owner"),
        None,
        "the first lock should have expired"
    );
    let fresh = m
        .acquire_with("owner", &opts().ttl(Duration::from_secs(10)))
        .await
        .unwrap();
    assert!(
        !stale.release().await.unwrap(),
        "a stale release must report it no longer held the lock"
    );
    assert_eq!(get(&server, "owner").as_deref(), Some(fresh.token()));
}

#[tokio::test]
async fn bad_input_is_rejected_with_the_bad_value_named() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts());
    let empty = m.acquire("").await.unwrap_err();
    assert_eq!(empty.kind(), ErrorKind::InvalidArgument);
    assert!(empty.message().contains("empty"), "{empty}");
    for (o, needle) in [
        (opts().ttl(Duration::ZERO), "ttl"),
        (
            opts().ttl(Duration::from_secs(60 * 60 * 24 * 365)),
            "too long",
        ),
        (opts().wait(Some(Duration::MAX)), "wait"),
        (opts().retry_delay(Duration::ZERO), "retry_delay"),
        (opts().drift_factor(-1.0), "drift_factor"),
    ] {
        let err = m.acquire_with("k", &o).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{o:?}");
        assert!(err.message().contains(needle), "{err}");
    }
    for url in ["http://127.0.0.1:1", "redis://[::1", "redis://h:notaport"] {
        let err = LockManager::new(ManagerOptions::new().nodes([url])).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{url}");
        assert!(err.message().contains(url), "{err}");
    }
    let dup =
        LockManager::new(ManagerOptions::new().nodes(["redis://u:pw@h:1", "redis://u:pw@h:1"]))
            .unwrap_err();
    assert!(
        dup.message().contains("listed twice") && !dup.message().contains("pw@"),
        "{dup}"
    );
    // One server spelled two ways is one vote, not two (a quorum of 2 of 2 would then be
    // one server's say).
    for other in [
        "redis://h:1/",
        "redis://h:1/0",
        "REDIS://H:1",
        "redis://h:01",
        "redis://u:pw@h:1",
        "redis://h:1/3",
    ] {
        let err =
            LockManager::new(ManagerOptions::new().nodes(["redis://h:1", other])).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{other}");
        assert!(
            err.message().contains("same server (h:1)") && !err.message().contains("pw@"),
            "{other}: {err}"
        );
    }
    for (a, b) in [
        ("redis://localhost:6379", "redis://127.0.0.1:6379"),
        ("redis://127.0.0.1:6379", "redis://[::1]:6379/0"),
    ] {
        let err = LockManager::new(ManagerOptions::new().nodes([a, b])).unwrap_err();
        assert!(
            err.message().contains("same server (localhost:6379)"),
            "{a} {b}: {err}"
        );
        assert_eq!(ferrolock::server_address(a), ferrolock::server_address(b));
    }
    assert!(LockManager::new(ManagerOptions::new().nodes(["redis://h:1", "redis://h:2"])).is_ok());
    assert!(
        LockManager::new(
            ManagerOptions::new().nodes(["redis://127.0.0.1:1", "redis://127.0.0.2:1"])
        )
        .is_ok()
    );
    // A URL read from a file keeps its newline: trimmed, as in a comma-separated list.
    assert!(
        LockManager::new(ManagerOptions::new().nodes(["redis://h:1\n", " redis://h:2 "])).is_ok()
    );
    let err = LockManager::new(ManagerOptions::new().nodes([""])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    let err =
        LockManager::new(ManagerOptions::new().lock(LockOptions::default().ttl(Duration::ZERO)))
            .unwrap_err();
    assert!(err.message().contains("ttl"), "{err}");
}

/// Two URLs that reach one server without looking alike (`127.1` is 127.0.0.1 to the
/// resolver): the server's run_id tells them apart when a connection opens, and the second
/// gets no request. With the third node down, the aliased server alone is no quorum: before,
/// its two votes were granted as one of 2 of 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_reached_by_two_urls_votes_once() {
    let mut cluster = Cluster::start(2);
    let port = cluster.servers[0].port();
    let alias = format!("redis://127.1:{port}");
    let urls = [
        cluster.servers[0].url(),
        alias.clone(),
        cluster.servers[1].url(),
    ];
    let m = manager(&urls, opts().wait(Some(Duration::ZERO)));
    let lock = m
        .acquire("alias")
        .await
        .expect("the two distinct servers are a quorum");
    assert!(lock.release().await.unwrap());
    // Found out once, the alias is not dialled again for every request (each dial is a
    // connection, a handshake, an INFO and an error logged).
    let connections = |s: &RedisServer| info_number(s, "stats", "total_connections_received");
    let before = connections(&cluster.servers[0]);
    for _ in 0..20 {
        let lock = m.acquire("alias").await.unwrap();
        assert!(lock.release().await.unwrap());
    }
    let dialled = connections(&cluster.servers[0]) - before;
    assert!(
        dialled < 5,
        "{dialled} new connections for 20 acquires and releases"
    );
    cluster.servers[1].kill();
    let err = m.acquire("alias").await.unwrap_err();
    // The alias's refusal is the error shown (a misconfiguration, not an outage).
    assert_eq!(err.kind(), ErrorKind::Redis, "{err}");
    assert!(
        err.message().contains(&alias) && err.message().contains("is the same server as node"),
        "{err}"
    );
    assert_eq!(
        get(&cluster.servers[0], "alias"),
        None,
        "the grant was undone"
    );
}

/// An explicitly empty node list is a mistake, refused as the bindings refuse `nodes: []`; an
/// omitted one keeps the FERROLOCK_NODES → local node fallback (issue 29 item 4).
#[test]
fn an_explicitly_empty_node_list_is_refused() {
    let err = LockManager::new(ManagerOptions::new().nodes(Vec::<String>::new())).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().contains("no node URL given"), "{err}");
    // Left out: FERROLOCK_NODES (set by the test below for a moment) or the local node.
    assert!(LockManager::new(ManagerOptions::new()).is_ok());
}

#[tokio::test]
async fn nodes_come_from_ferrolock_nodes_when_not_given() {
    let cluster = Cluster::start(3);
    // SAFETY: this test binary reads FERROLOCK_NODES only here.
    unsafe { std::env::set_var("FERROLOCK_NODES", cluster.nodes_env()) };
    let m = LockManager::new(
        ManagerOptions::new()
            .restart_guard(Duration::ZERO)
            .lock(opts()),
    )
    .unwrap();
    unsafe { std::env::remove_var("FERROLOCK_NODES") };
    assert_eq!(m.node_names(), cluster.urls());
    assert_eq!(m.quorum(), 2);
    let lock = m.acquire("env").await.unwrap();
    // Acquire returns once a quorum (2) granted; the third node may lag.
    let holders = cluster
        .servers
        .iter()
        .filter(|s| get(s, "env").as_deref() == Some(lock.token()))
        .count();
    assert!(holders >= 2, "granted on {holders} nodes");
}

#[tokio::test]
async fn release_after_a_script_flush_reloads_its_script_and_deletes() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts());
    let lock = m.acquire("flushed").await.unwrap();
    // As after a restart without the scripts: the release meets NOSCRIPT, loads, resends.
    let _: () = server.cmd(&["SCRIPT", "FLUSH"]);
    assert!(lock.release().await.unwrap());
    assert_eq!(get(&server, "flushed"), None);
}

/// The README's Rust example is `core/examples/first_lock.rs` (which `make test` builds and runs: `examples.rs`) less
/// that file's opening doc comment: an edit to one of them alone left the README's copy
/// unbuilt, free to stop compiling.
#[test]
fn the_readmes_rust_example_is_the_example_make_test_builds() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let section = &readme[readme
        .find("## First example: Rust")
        .expect("the README has no \"First example: Rust\"")..];
    let block = section
        .split("```rust\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("no rust block in the README's \"First example: Rust\"");
    let example = std::fs::read_to_string(format!("{root}/core/examples/first_lock.rs")).unwrap();
    let body: String = example
        .lines()
        .skip_while(|l| l.starts_with("//!"))
        .skip_while(|l| l.is_empty())
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        block, body,
        "README.md's Rust example differs from core/examples/first_lock.rs"
    );
}
