//! Fence tokens strictly increase across grants, also when successive grants are made by
//! different quorums; and the restart guard keeps an amnesiac node from granting twice.

// Each #[tokio::test] runs its own runtime on its own thread, so holding the std mutex that
// serializes these tests across awaits blocks nothing but the test itself.
#![allow(clippy::await_holding_lock)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use ferrolock::{ErrorKind, LockManager, ManagerOptions};
use ferrolock_testbed::{Cluster, RedisServer};

#[tokio::test(flavor = "multi_thread")]
async fn single_node_fences_increase_by_one_per_grant() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts().fencing(true));
    let a = m.acquire("f1").await.unwrap();
    let fa = a.fence().expect("fencing on: a fence");
    a.release().await.unwrap();
    let b = m.acquire("f1").await.unwrap();
    assert_eq!(b.fence(), Some(fa + 1));
    assert_eq!(server.cmd::<u64>(&["GET", "ferrolock:fence:{f1}"]), fa + 1);
    let plain = manager(&[server.url()], opts())
        .acquire("f2")
        .await
        .unwrap();
    assert_eq!(plain.fence(), None, "fencing off: no fence");
}

#[tokio::test(flavor = "multi_thread")]
async fn fences_strictly_increase_over_1000_grants_on_differing_quorums() {
    let _serial = serial();
    let cluster = Cluster::start(5);
    let key = "fenced";
    let managers: Vec<LockManager> = (0..4)
        .map(|_| {
            // Node timeout 2 s, not the default 200 ms: a loaded machine answers late, and a
            // release that hears from too few nodes is an error (ttl 30 s: its loss margin
            // must be under ttl/3).
            let o = opts()
                .ttl(Duration::from_secs(30))
                .fencing(true)
                .retry_delay(ms(2))
                .node_timeout(ms(2_000));
            manager(&cluster.urls(), o)
        })
        .collect();
    // A grant records its fence while it holds the lock: the order of this list is the order
    // of the grants.
    let fences = Arc::new(Mutex::new(Vec::<u64>::new()));
    // Foreign keys on two nodes force every grant of a phase onto the other three; each phase
    // moves them, so consecutive phases grant on different quorums that overlap in one node.
    let blocked_per_phase = [[0, 1], [3, 4], [1, 2], [4, 0], [2, 3]];
    for phase in 0..10 {
        let blocked = blocked_per_phase[phase % blocked_per_phase.len()];
        for (i, s) in cluster.servers.iter().enumerate() {
            if blocked.contains(&i) {
                s.cmd::<()>(&["SET", key, "blocker"]);
            } else {
                s.cmd::<i64>(&["DEL", key]);
            }
        }
        let mut workers = tokio::task::JoinSet::new();
        for m in &managers {
            let (m, fences) = (m.clone(), fences.clone());
            workers.spawn(async move {
                for _ in 0..25 {
                    let lock = m.acquire(key).await.unwrap();
                    fences.lock().unwrap().push(lock.fence().expect("a fence"));
                    lock.release().await.unwrap();
                }
            });
        }
        workers.join_all().await;
        // The fault was in place: the blocked nodes never saw a grant this phase.
        for &b in &blocked {
            assert_eq!(get(&cluster.servers[b], key).as_deref(), Some("blocker"));
        }
    }
    let fences = fences.lock().unwrap();
    assert_eq!(fences.len(), 1000);
    for pair in fences.windows(2) {
        assert!(
            pair[1] > pair[0],
            "fence went from {} to {}",
            pair[0],
            pair[1]
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn restart_guard_keeps_an_amnesiac_node_from_granting_a_second_holder() {
    let _serial = serial();
    let mut cluster = Cluster::start(3);
    let ttl = Duration::from_secs(10);
    let holder = manager(&cluster.urls(), opts().ttl(ttl));
    let first = holder.acquire("amnesia").await.unwrap();
    // Acquire returns once a quorum granted; wait until the third grant has landed too, or it
    // could land after the DEL below.
    let start = std::time::Instant::now();
    while cluster
        .servers
        .iter()
        .any(|s| get(s, "amnesia").as_deref() != Some(first.token()))
    {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the grant never reached every node"
        );
        tokio::time::sleep(ms(5)).await;
    }
    // Node 2 never saw the grant (say it was cut off); node 1 is killed and restarted at once
    // with no persistence, and forgets it. A second client can now form a quorum of the
    // amnesiac node and node 2.
    cluster.servers[2].cmd::<i64>(&["DEL", "amnesia"]);
    cluster.servers[1].restart();
    assert_eq!(
        get(&cluster.servers[1], "amnesia"),
        None,
        "the restart did not lose the key"
    );

    // Negative control: without the guard a second client gets the lock while the first holds it.
    let unguarded = manager(&cluster.urls(), opts().ttl(ttl).wait(Some(Duration::ZERO)));
    let second = unguarded
        .acquire("amnesia")
        .await
        .expect("without the guard the amnesiac node grants");
    assert!(first.is_held());
    second.release().await.unwrap();

    // With the guard (the default for 3 nodes: the ttl), a client that never saw the node
    // before reads its uptime and does not count its vote.
    let guarded = LockManager::new(
        ManagerOptions::new()
            .nodes(cluster.urls())
            .lock(opts().ttl(ttl).wait(Some(ms(500)))),
    )
    .unwrap();
    let err = guarded
        .acquire("amnesia")
        .await
        .expect_err("the guard must refuse a second holder");
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    assert!(err.message().contains("restart guard"), "{err}");
    assert!(first.is_held());
}

#[tokio::test(flavor = "multi_thread")]
async fn restart_guard_lets_the_node_vote_again_after_the_window() {
    let _serial = serial();
    let cluster = Cluster::start(3);
    // Fresh servers: uptime a second or two at most, so with a 5 s window the first acquire
    // gets no quorum however slowly they started.
    let m = LockManager::new(
        ManagerOptions::new()
            .nodes(cluster.urls())
            .restart_guard(Duration::from_secs(5))
            .lock(opts().wait(Some(Duration::ZERO))),
    )
    .unwrap();
    let err = m.acquire("fresh").await.unwrap_err();
    assert!(err.message().contains("restart guard"), "{err}");
    // Then the nodes vote again: asked until they do (uptime is read in whole seconds, so the
    // window ends up to a second late), with a failure bound far past the window.
    let start = std::time::Instant::now();
    let lock = loop {
        match m.acquire("fresh").await {
            Ok(lock) => break lock,
            Err(e) => {
                assert!(e.message().contains("restart guard"), "{e}");
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "the nodes never voted again: {e}"
                );
                tokio::time::sleep(ms(200)).await;
            }
        }
    };
    assert!(lock.release().await.unwrap());
}
