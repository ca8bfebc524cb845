//! Reply polling for blocking callers (`spin.rs`): a thread in `runtime::block_on` polls for
//! its requests' replies; an async caller never does. What the policy does with each request
//! (poll, back off for a slow node, try again) is tested with the policy, in `spin.rs`, on
//! its own clock. How many sleeps polling saves per acquire + release depends on the machine,
//! so it is measured by `make bench` ("Reply polling"), not asserted here.

mod common;

use common::*;
use ferrolock::runtime::{__polled_requests, block_on};
use ferrolock_testbed::RedisServer;

fn pairs(m: &ferrolock::LockManager, key: &str, n: usize) {
    for _ in 0..n {
        let lock = block_on(m.acquire(key)).expect("acquire");
        assert!(block_on(lock.release()).expect("release"));
    }
}

#[test]
fn a_blocking_callers_requests_are_polled_for() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts());
    pairs(&m, "polling:blocking", 5); // connect and load the scripts
    let before = __polled_requests();
    pairs(&m, "polling:blocking", 20);
    let polled = __polled_requests() - before;
    // An uncontended acquire + release on one node is two requests; each is polled for.
    assert_eq!(polled, 40, "requests sent with polling on, for 20 pairs");
}

#[test]
fn an_async_callers_requests_are_never_polled_for() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts());
    // A runtime of the caller's own, on this thread: its threads are the caller's, not ours
    // to spin.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let before = __polled_requests();
    rt.block_on(async {
        for _ in 0..20 {
            let lock = m.acquire("polling:async").await.expect("acquire");
            assert!(lock.release().await.expect("release"));
        }
    });
    assert_eq!(__polled_requests(), before, "an async caller polled");
    // The same thread, blocking, does poll: the count above could move.
    pairs(&m, "polling:async", 1);
    assert!(__polled_requests() > before);
}
