//! A panic in the caller's code while it holds a lock: the `Lock` is dropped as the stack
//! unwinds, which releases it in the background (its documented drop), so the watchdog stops
//! renewing it and the key is free long before its ttl.

mod common;

use std::time::Duration;

use common::*;
use ferrolock::LockOptions;
use ferrolock_testbed::RedisServer;
use tokio::time::Instant;

/// Waits for `key` to go, failing at `deadline` (the lock's own: the ttl would have freed it).
async fn released_before(server: &RedisServer, key: &str, deadline: Instant) {
    while get(server, key).is_some() {
        assert!(
            Instant::now() < deadline,
            "{key}: the panicking holder's lock was never released (renewed or left to its ttl)"
        );
        tokio::time::sleep(ms(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_that_panics_holding_a_lock_releases_it() {
    let server = RedisServer::start();
    let m = manager(
        &[server.url()],
        LockOptions::default().ttl(Duration::from_secs(20)),
    );
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn({
        let m = m.clone();
        async move {
            let lock = m.acquire("task-panics").await.unwrap();
            tx.send((lock.deadline(), lock.lost())).ok();
            if lock.is_held() {
                panic!("the caller's bug, while holding");
            }
        }
    });
    let (deadline, lost) = rx.await.unwrap();
    assert!(task.await.unwrap_err().is_panic());
    released_before(&server, "task-panics", deadline).await;
    // Released, not lost: whoever watched it hears so.
    assert_eq!(lost.await, None);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_blocking_thread_that_panics_holding_a_lock_releases_it() {
    let server = RedisServer::start();
    let m = manager(
        &[server.url()],
        LockOptions::default().ttl(Duration::from_secs(20)),
    );
    let holder = std::thread::spawn({
        let m = m.clone();
        move || {
            let lock = ferrolock::runtime::block_on(m.acquire("thread-panics")).unwrap();
            if lock.is_held() {
                panic!("the caller's bug, while holding");
            }
        }
    });
    let started = Instant::now();
    assert!(holder.join().is_err());
    released_before(&server, "thread-panics", started + Duration::from_secs(20)).await;
}
