//! A request re-sent after its connection dropped goes out on a new connection, and so does
//! every other request that was in flight on the old one. The order they ran in on the old
//! connection is not kept: a won Redlock grant's release, sent while a slower node's acquire
//! was still in flight there, can run again before that acquire's re-send, which then finds
//! the key free and grants it afresh, to a lock already released: nobody releases or renews
//! it, and it holds the node for its whole ttl.

// A std mutex held across awaits on purpose: every test has its own runtime.
#![allow(clippy::await_holding_lock)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use ferrolock::LockOptions;
use ferrolock_testbed::{Direction, Proxy, RedisServer};

const HANG: Duration = Duration::from_secs(30);

fn exists(node: &RedisServer, key: &str) -> bool {
    node.cmd::<bool>(&["EXISTS", key])
}

async fn until(what: &str, f: impl Fn() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < HANG, "{what}");
        tokio::time::sleep(ms(2)).await;
    }
}

/// Three nodes, node 0 behind a proxy. Node 0's acquire runs there but its reply is held:
/// nodes 1 and 2 make the quorum, and the caller releases at once. The release runs on node 0
/// after the acquire (one connection), its reply held too. Then the link drops: both requests
/// are sent again. Whatever the order of the re-sends, node 0 must end without the key.
async fn rounds(reentrant: bool) {
    let servers = [
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    ];
    let proxy = Proxy::start(servers[0].port());
    let urls = vec![proxy.url(), servers[1].url(), servers[2].url()];
    let o: LockOptions = opts()
        .ttl(Duration::from_secs(60))
        .node_timeout(Duration::from_secs(5))
        .wait(Some(Duration::ZERO))
        .reentrant(reentrant);
    let m = manager(&urls, o.clone());
    let mut orphans = 0;
    let rounds = 8;
    for round in 0..rounds {
        let key = format!("order-{reentrant}-{round}");
        // The connections are open, and node 0's answers every request, before the fault.
        let warm = m.acquire_with("warm-up", &o).await.unwrap();
        until("node 0 never granted the warm-up", || {
            exists(&servers[0], "warm-up")
        })
        .await;
        assert!(warm.release().await.unwrap());
        until("node 0 never released the warm-up", || {
            !exists(&servers[0], "warm-up")
        })
        .await;
        proxy.hold(Direction::Down);
        let lock = tokio::time::timeout(HANG, m.acquire_with(&key, &o))
            .await
            .expect("the acquire waited for node 0")
            .unwrap();
        until(
            &format!("round {round}: node 0 never ran the acquire"),
            || exists(&servers[0], &key),
        )
        .await;
        // Decided by nodes 1 and 2; node 0's release goes on in the background.
        assert!(lock.release().await.unwrap());
        // Time for a release to run on node 0 (before the fix it did, behind the acquire).
        tokio::time::sleep(ms(300)).await;
        proxy.reset();
        // Both requests are sent again, well within this; node 0 must end without the key.
        tokio::time::sleep(ms(1500)).await;
        if exists(&servers[0], &key) {
            orphans += 1;
            eprintln!(
                "round {round}: node 0 holds {key:?} after its release (pttl {})",
                pttl(&servers[0], &key)
            );
        }
    }
    assert_eq!(
        orphans, 0,
        "reentrant {reentrant}: in {orphans} of {rounds} rounds, a released lock's acquire \
         re-sent after its release granted the key again on node 0, held for its whole ttl"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_release_and_an_acquire_re_sent_together_leave_no_grant_plain() {
    let _s = serial();
    rounds(false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_release_and_an_acquire_re_sent_together_leave_no_grant_reentrant() {
    let _s = serial();
    rounds(true).await;
}

/// A semaphore's acquire and release, each with its reply cut off after it ran on the node
/// (standalone: `Node::resend` sends it again): the permits are taken once and given back once.
#[tokio::test(flavor = "multi_thread")]
async fn a_semaphore_request_resent_after_its_connection_dropped_runs_once() {
    let _s = serial();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let name = "sem-resend";
    let zset = format!("{{{name}}}:timeout");
    let o = opts()
        .ttl(Duration::from_secs(60))
        .node_timeout(Duration::from_secs(5))
        .wait(Some(Duration::ZERO));
    let m = manager(&[proxy.url()], o.clone());
    let held = |s: &RedisServer| s.cmd::<i64>(&["ZCARD", &zset]);
    let available = |s: &RedisServer| s.cmd::<Option<i64>>(&["GET", name]);
    for _ in 0..3 {
        let warm = m.semaphore_with(name, 5, 1, &o).await.unwrap();
        assert!(warm.release().await.unwrap());
        proxy.hold(Direction::Down);
        let task = tokio::spawn({
            let (m, o) = (m.clone(), o.clone());
            async move { m.semaphore_with(name, 5, 2, &o).await }
        });
        until("the acquire never ran", || held(&server) == 2).await;
        assert!(!task.is_finished());
        proxy.reset();
        let lock = task.await.unwrap().expect("a grant that ran is a grant");
        assert_eq!((available(&server), held(&server)), (Some(3), 2));
        let warm = m.semaphore_with(name, 5, 1, &o).await.unwrap();
        assert!(warm.release().await.unwrap());
        proxy.hold(Direction::Down);
        let task = tokio::spawn(async move { lock.release().await });
        until("the release never ran", || held(&server) == 0).await;
        assert!(!task.is_finished());
        proxy.reset();
        assert!(
            task.await.unwrap().unwrap(),
            "a release that ran reported none back"
        );
        assert_eq!((available(&server), held(&server)), (Some(5), 0));
    }
}
