//! The core's metrics count what a scripted sequence of operations did, per key prefix, and
//! read as Prometheus text.

mod common;

use std::time::Duration;

use common::*;
use ferrolock::metrics::{prometheus_text, snapshot};
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
