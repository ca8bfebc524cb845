//! The core's metrics count what a scripted sequence of operations did, per key prefix, and
//! read as Prometheus text.

mod common;

use std::time::Duration;

use common::*;
use ferrolock::metrics::{prometheus_text, snapshot, snapshot_by_kind};
use ferrolock::{ErrorKind, LossReason};
use ferrolock_testbed::RedisServer;

#[tokio::test(flavor = "multi_thread")]
async fn a_scripted_sequence_is_counted_per_prefix() {
    let server = RedisServer::start();
    let prefix = format!("metrics-seq-{}", std::process::id());
    let key = |i: u32| format!("{prefix}:{i}");
    let m = manager(&[server.url()], opts().ttl(Duration::from_secs(3)));
    for i in 0..3 {
        let lock = m.acquire(&key(i)).await.unwrap();
        assert!(lock.release().await.unwrap());
    }
    // One refused try: a failure with its code, and its attempt.
    let held = m.acquire(&key(7)).await.unwrap();
    let err = m.try_acquire(&key(7)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired);
    held.release().await.unwrap();
    // One loss: the watchdog's renewal finds the key gone.
    let watched = m
        .acquire_with(&key(8), &opts().watchdog(true).ttl(Duration::from_secs(3)))
        .await
        .unwrap();
    server.cmd::<i64>(&["DEL", &key(8)]);
    let reason = tokio::time::timeout(Duration::from_secs(10), watched.lost())
        .await
        .expect("loss signalled")
        .expect("lost");
    assert!(matches!(reason, LossReason::TokenGone { .. }), "{reason}");

    let snap = snapshot();
    let p = &snap[&prefix];
    assert_eq!(p.grants, 5, "{p:?}");
    assert_eq!(p.attempts, 6, "{p:?}");
    assert_eq!(p.failures.get("NOT_ACQUIRED"), Some(&1), "{p:?}");
    assert_eq!(p.losses.get("token_gone"), Some(&1), "{p:?}");
    assert!(p.renewal_failures >= 1, "{p:?}");
    assert_eq!(p.wait.count, 5);
    assert_eq!(p.hold.count, 4, "four releases: {p:?}");
    let text = prometheus_text();
    assert!(
        text.contains(&format!(
            "ferrolock_grants_total{{prefix=\"{prefix}\"}} 5\n"
        )),
        "{text}"
    );
    assert!(text.contains(&format!(
        "ferrolock_losses_total{{prefix=\"{prefix}\",reason=\"token_gone\"}} 1\n"
    )));
}

/// A lock, a read, a write and a semaphore grant are each counted under their own kind, and a
/// read hold lost is a read loss; the lock's series keep their label set of before (no
/// `kind`), the others carry `kind`.
#[tokio::test(flavor = "multi_thread")]
async fn grants_and_losses_are_counted_per_kind() {
    let server = RedisServer::start();
    let prefix = format!("metrics-kind-{}", std::process::id());
    let key = |s: &str| format!("{prefix}:{s}");
    let m = manager(&[server.url()], opts().ttl(Duration::from_secs(3)));
    m.acquire(&key("l")).await.unwrap().release().await.unwrap();
    m.read_lock(&key("r"))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    m.write_lock(&key("w"))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    m.semaphore(&key("s"), 2)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // One read hold lost: the watchdog's renewal finds the hash gone.
    let watched = m
        .read_lock_with(
            &key("lost"),
            &opts().watchdog(true).ttl(Duration::from_secs(3)),
        )
        .await
        .unwrap();
    let deadline = watched.deadline();
    assert_eq!(
        server.cmd::<i64>(&["DEL", &key("lost")]),
        1,
        "the fault: the hash deleted"
    );
    let reason = tokio::time::timeout_at(deadline, watched.lost())
        .await
        .expect("loss signalled before the deadline")
        .expect("lost");
    assert!(matches!(reason, LossReason::TokenGone { .. }), "{reason}");

    let by_kind = snapshot_by_kind();
    let of = |kind: &str| &by_kind[&(prefix.clone(), kind.to_string())];
    assert_eq!(of("lock").grants, 1, "{by_kind:?}");
    assert_eq!(of("read").grants, 2, "{by_kind:?}");
    assert_eq!(of("write").grants, 1, "{by_kind:?}");
    assert_eq!(of("semaphore").grants, 1, "{by_kind:?}");
    assert_eq!(of("read").wait.count, 2, "a wait observed per grant");
    assert_eq!(of("read").losses.get("token_gone"), Some(&1), "{by_kind:?}");
    assert_eq!(of("lock").losses.get("token_gone"), None, "{by_kind:?}");
    assert_eq!(
        snapshot()[&prefix].grants,
        5,
        "the prefix totals every kind"
    );
    let text = prometheus_text();
    for line in [
        format!("ferrolock_grants_total{{prefix=\"{prefix}\"}} 1\n"),
        format!("ferrolock_grants_total{{prefix=\"{prefix}\",kind=\"read\"}} 2\n"),
        format!("ferrolock_grants_total{{prefix=\"{prefix}\",kind=\"write\"}} 1\n"),
        format!("ferrolock_grants_total{{prefix=\"{prefix}\",kind=\"semaphore\"}} 1\n"),
        format!(
            "ferrolock_losses_total{{prefix=\"{prefix}\",kind=\"read\",reason=\"token_gone\"}} 1\n"
        ),
        format!("ferrolock_wait_seconds_count{{prefix=\"{prefix}\",kind=\"write\"}} 1\n"),
    ] {
        assert!(text.contains(&line), "{line:?} not in\n{text}");
    }
}

/// An acquire given up by its caller while it waits (a Rust future dropped by a timeout, a
/// Go context's deadline, a Node `AbortSignal`, `asyncio.wait_for`) is a failed acquire: it
/// counts once under `CANCELLED`, a lock's and a semaphore's alike. Before, it counted its
/// attempts and nothing else, so a service whose every acquire timed out through its
/// caller's deadline showed no failure at all.
#[tokio::test(flavor = "multi_thread")]
async fn an_acquire_cancelled_while_it_waits_counts_as_a_failure() {
    let server = RedisServer::start();
    let prefix = format!("metrics-cancel-{}", std::process::id());
    let key = |s: &str| format!("{prefix}:{s}");
    let m = manager(&[server.url()], opts().ttl(Duration::from_secs(30)));
    let held = m.acquire(&key("l")).await.unwrap();
    let permit = m.semaphore(&key("s"), 1).await.unwrap();
    let waiting = opts()
        .ttl(Duration::from_secs(30))
        .wait(Some(Duration::from_secs(600)));
    // Each waits until it has queued on the server (the holder's key stays taken), then is
    // dropped by its caller.
    let (lk, sk) = (key("l"), key("s"));
    let lock_wait = m.acquire_with(&lk, &waiting);
    let cancel = async {
        await_one_queued(&server, &key("l")).await;
    };
    tokio::select! {
        r = lock_wait => panic!("the lock is held, yet: {r:?}"),
        _ = cancel => {}
    }
    let sem_wait = m.semaphore_with(&sk, 1, 1, &waiting);
    tokio::select! {
        r = sem_wait => panic!("the permit is held, yet: {r:?}"),
        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
    }
    let by_kind = snapshot_by_kind();
    let of = |kind: &str| by_kind[&(prefix.clone(), kind.to_string())].clone();
    for kind in ["lock", "semaphore"] {
        let p = of(kind);
        assert_eq!(p.grants, 1, "{kind}: {p:?}");
        assert_eq!(
            p.failures.get("CANCELLED"),
            Some(&1),
            "{kind}: the dropped acquire is a failure: {p:?}"
        );
        assert_eq!(p.failures.values().sum::<u64>(), 1, "{kind}: {p:?}");
    }
    held.release().await.unwrap();
    permit.release().await.unwrap();
    // Ended either way: a grant or a failure is counted, never both.
    let p = &snapshot()[&prefix];
    assert_eq!(p.failures.get("CANCELLED"), Some(&2), "{p:?}");
    assert_eq!(p.grants, 2, "{p:?}");
}

/// A hand-off is a grant to a waiter woken by a release: once a key's queue has served a
/// waiter it lingers a moment, subscribed, and the next acquires of the key join it before
/// their first attempt. One of them that finds the key free and takes it at once waited for
/// nobody, and is no hand-off.
#[tokio::test(flavor = "multi_thread")]
async fn an_uncontended_grant_after_a_wait_is_no_hand_off() {
    let server = RedisServer::start();
    let prefix = format!("metrics-handoff-{}", std::process::id());
    let key = format!("{prefix}:k");
    let m = manager(&[server.url()], opts().ttl(Duration::from_secs(30)));
    let waiting = opts()
        .ttl(Duration::from_secs(30))
        .wait(Some(Duration::from_secs(60)));
    let held = m.acquire(&key).await.unwrap();
    let waiter = {
        let (m, key, waiting) = (m.clone(), key.clone(), waiting.clone());
        tokio::spawn(async move { m.acquire_with(&key, &waiting).await })
    };
    await_one_queued(&server, &key).await;
    held.release().await.unwrap();
    let got = waiter.await.unwrap().expect("the waiter's grant");
    got.release().await.unwrap();
    let handoffs = || snapshot()[&prefix].handoffs;
    assert_eq!(handoffs(), 1, "{:?}", snapshot()[&prefix]);
    // The key is free: each of these is granted at its first attempt, waiting for no one.
    for _ in 0..3 {
        let lock = m.acquire_with(&key, &waiting).await.unwrap();
        lock.release().await.unwrap();
    }
    let p = &snapshot()[&prefix];
    assert_eq!(p.grants, 5, "{p:?}");
    assert_eq!(
        p.handoffs, 1,
        "only the waiter's grant was a hand-off: {p:?}"
    );
}
