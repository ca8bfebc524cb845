//! The watchdog outlives a panic: in a holder's `on_lost` callback (user code it runs), or in
//! its own scan (a bug). Either used to end its task for good, with its registry still saying
//! it ran: no lock of the process was renewed or told of its loss again (the peers' "renewal
//! thread that dies without telling the holder").
// The test hook is process-wide: `serial` runs these one at a time (a std mutex held across
// awaits on purpose: every test has its own runtime, so it cannot deadlock).
#![allow(clippy::await_holding_lock)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use ferrolock::{__set_test_hook, HookPoint, LockOptions};
use ferrolock_testbed::RedisServer;

fn watched(ttl: Duration) -> LockOptions {
    opts().watchdog(true).ttl(ttl)
}

/// Checks for `span` that `key` stays on the server (its ttl is a fraction of `span`, so only
/// renewals keep it there) and that the lock is still held.
async fn stays_renewed(server: &RedisServer, lock: &ferrolock::Lock, key: &str, span: Duration) {
    let end = Instant::now() + span;
    while Instant::now() < end {
        assert!(pttl(server, key) > 0, "{key} expired: not renewed");
        assert!(lock.is_held(), "{key} is no longer held");
        tokio::time::sleep(ms(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_on_lost_callback_leaves_the_other_callbacks_and_locks_alone() {
    let _serial = serial();
    let server = RedisServer::start();
    // Renewed every second, lost only after a stall of about 1.5 s: a loaded machine keeps it.
    let ttl = Duration::from_secs(3);
    let m = manager(&[server.url()], watched(ttl));
    let (short, long) = (unique_key("panics-short"), unique_key("panics-long"));
    let kept = m.acquire(&long).await.unwrap();
    // Lost at its max_hold, by the watchdog, which then runs its callbacks.
    let capped = m
        .acquire_with(&short, &watched(ttl).max_hold(Some(ms(300))))
        .await
        .unwrap();
    let told = Arc::new(AtomicBool::new(false));
    capped.on_lost(|_| panic!("a holder's callback panics"));
    {
        let told = told.clone();
        capped.on_lost(move |_| told.store(true, Ordering::SeqCst));
    }
    tokio::time::timeout(Duration::from_secs(30), capped.lost())
        .await
        .expect("the capped lock was never lost");
    assert!(told.load(Ordering::SeqCst), "the second callback never ran");
    stays_renewed(&server, &kept, &long, ttl * 3).await;
    assert!(kept.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_starts_again_after_a_panic_in_its_scan() {
    let _serial = serial();
    let server = RedisServer::start();
    // Renewed every second, lost only after a stall of about 1.5 s: a loaded machine keeps it.
    let ttl = Duration::from_secs(3);
    let m = manager(&[server.url()], watched(ttl));
    let (key, later) = (unique_key("scan-panics"), unique_key("scan-panics-later"));
    let kept = m.acquire(&key).await.unwrap();
    let panicked = Arc::new(AtomicBool::new(false));
    {
        let panicked = panicked.clone();
        __set_test_hook(Some(Arc::new(move |point, _| {
            if point == HookPoint::WatchdogScan && !panicked.swap(true, Ordering::SeqCst) {
                panic!("the watchdog's scan panics");
            }
        })));
    }
    let start = Instant::now();
    while !panicked.load(Ordering::SeqCst) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the watchdog never scanned"
        );
        tokio::time::sleep(ms(5)).await;
    }
    __set_test_hook(None);
    // Both the lock it held and one taken after the panic are renewed.
    let after = m.acquire(&later).await.unwrap();
    stays_renewed(&server, &kept, &key, ttl * 3).await;
    stays_renewed(&server, &after, &later, ttl * 2).await;
    assert!(kept.release().await.unwrap());
    assert!(after.release().await.unwrap());
}

/// An `on_lost` callback that starts listening for the loss of another lock (`on_lost` or
/// `lost()` on a lock the watchdog did not watch yet: watchdog off, no max_hold) registers
/// that lock with the watchdog. The watchdog ran its callbacks while it held its registry,
/// which that registration takes: its task hung for good, and no lock of the manager was
/// renewed or told of its loss again. A plain test: the manager's background work runs on the
/// process runtime, so that a hung watchdog does not stop this test's own clock.
#[test]
fn an_on_lost_callback_that_listens_to_another_lock_leaves_the_watchdog_running() {
    let _serial = serial();
    let server = RedisServer::start();
    // Renewed every second, lost only after a stall of about 1.5 s: a loaded machine keeps it.
    let ttl = Duration::from_secs(3);
    let m = manager(&[server.url()], watched(ttl));
    let (long, short, other) = (
        unique_key("listens-long"),
        unique_key("listens-short"),
        unique_key("listens-other"),
    );
    use ferrolock::runtime::block_on;
    let kept = block_on(m.acquire(&long)).unwrap();
    // Not watched: nothing to renew, and nobody listens to it yet.
    let unwatched =
        Arc::new(block_on(m.acquire_with(&other, &opts().ttl(Duration::from_secs(30)))).unwrap());
    // Lost at its max_hold, by the watchdog, which then runs its callbacks.
    let capped = block_on(m.acquire_with(&short, &watched(ttl).max_hold(Some(ms(300))))).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let unwatched = unwatched.clone();
        capped.on_lost(move |_| {
            let _ = tx.send(());
            // "Hand the news on": its own loss too, when it comes.
            unwatched.on_lost(|_| {});
        });
    }
    rx.recv_timeout(Duration::from_secs(30))
        .expect("the capped lock's callback never ran");
    let end = Instant::now() + ttl * 3;
    while Instant::now() < end {
        assert!(pttl(&server, &long) > 0, "{long} expired: not renewed");
        assert!(kept.is_held(), "{long} is no longer held");
        std::thread::sleep(ms(50));
    }
    assert!(block_on(kept.release()).unwrap());
    assert!(block_on(unwatched.release()).unwrap());
}
