//! A Rust caller's runtimes: a manager made in one runtime and used from another, after the
//! one it was made in shut down, or from no tokio runtime at all. Its background work
//! (renewals, a dropped lock's release) must go on.

mod common;

use std::time::Duration;

use common::*;
use ferrolock::{LockOptions, LockStatus};
use ferrolock_testbed::RedisServer;
use tokio::runtime::{Builder, Runtime};
use tokio::time::Instant;

fn multi_thread() -> Runtime {
    Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

fn current_thread() -> Runtime {
    Builder::new_current_thread().enable_all().build().unwrap()
}

fn watched(ttl: Duration) -> LockOptions {
    LockOptions::default().ttl(ttl)
}

/// Sleeps (outside any runtime) until `lock`'s deadline at its grant has passed, then checks
/// that it was renewed meanwhile: still held, its token still on the server.
fn assert_renewed_past_its_first_deadline(server: &RedisServer, lock: &ferrolock::Lock) {
    let first_deadline = lock.deadline();
    std::thread::sleep(first_deadline.saturating_duration_since(Instant::now()) + ms(300));
    assert_eq!(
        get(server, lock.key()).as_deref(),
        Some(lock.token()),
        "the key expired unrenewed (status {:?})",
        lock.status()
    );
    assert_eq!(lock.status(), LockStatus::Held);
    assert!(lock.deadline() > first_deadline);
}

#[test]
fn a_manager_made_in_a_runtime_that_shut_down_still_renews_its_locks() {
    let server = RedisServer::start();
    let made_in = multi_thread();
    let m = made_in.block_on(async {
        let m = manager(&[server.url()], watched(Duration::from_secs(1)));
        // Its connection and watchdog start here.
        let first = m.acquire("first").await.unwrap();
        assert!(first.release().await.unwrap());
        m
    });
    drop(made_in);
    let used_in = multi_thread();
    let lock = used_in.block_on(m.acquire("later")).unwrap();
    assert_renewed_past_its_first_deadline(&server, &lock);
    assert!(used_in.block_on(lock.release()).unwrap());
}

#[test]
fn a_lock_held_while_its_managers_runtime_shuts_down_is_still_renewed() {
    let server = RedisServer::start();
    // The watchdog task was spawned on it just now and may never have run: a runtime that
    // ends drops its tasks, polled or not.
    for (flavor, made_in) in [("multi", multi_thread()), ("current", current_thread())] {
        let key = format!("across-{flavor}");
        let (m, lock) = made_in.block_on(async {
            let m = manager(&[server.url()], watched(Duration::from_secs(1)));
            let lock = m.acquire(&key).await.unwrap();
            (m, lock)
        });
        drop(made_in);
        assert_renewed_past_its_first_deadline(&server, &lock);
        assert!(current_thread().block_on(lock.release()).unwrap());
        drop(m);
    }
}

#[test]
fn a_lock_dropped_after_its_runtime_shut_down_is_released() {
    let server = RedisServer::start();
    let rt = current_thread();
    let (m, lock) = rt.block_on(async {
        let m = manager(&[server.url()], watched(Duration::from_secs(20)));
        let lock = m.acquire("orphan").await.unwrap();
        (m, lock)
    });
    drop(rt);
    let deadline = lock.deadline();
    drop(lock);
    // Released in the background, well before the ttl would have freed the key.
    while get(&server, "orphan").is_some() {
        assert!(
            Instant::now() < deadline,
            "the dropped lock was never released: its key lived out its ttl"
        );
        std::thread::sleep(ms(20));
    }
    drop(m);
}

/// A caller on another executor (`futures::executor::block_on`, async-std, smol): every call
/// works, waiting included. Before, the first acquire panicked ("there is no reactor running,
/// must be called from the context of a Tokio 1.x runtime").
#[test]
fn a_manager_used_outside_any_tokio_runtime_works() {
    use futures::executor::block_on;
    let server = RedisServer::start();
    let m = manager(&[server.url()], watched(Duration::from_secs(2)));
    let lock = block_on(m.acquire("no-tokio")).unwrap();
    assert!(block_on(lock.extend()).unwrap() > Duration::ZERO);
    // A second acquire waits (timers, the waiters' wake-up) until its wait runs out.
    let opts = watched(Duration::from_secs(2)).wait(Some(ms(300)));
    let err = block_on(m.acquire_with("no-tokio", &opts)).unwrap_err();
    assert_eq!(err.kind(), ferrolock::ErrorKind::NotAcquired, "{err}");
    assert_renewed_past_its_first_deadline(&server, &lock);
    let lost = lock.lost();
    assert!(block_on(lock.release()).unwrap());
    assert_eq!(block_on(lost), None);
    assert_eq!(get(&server, "no-tokio"), None);
    let permit = block_on(m.semaphore("no-tokio-pool", 2)).unwrap();
    assert!(block_on(permit.release()).unwrap());
    let read = block_on(m.read_lock("no-tokio-rw")).unwrap();
    assert!(block_on(read.release()).unwrap());
}
