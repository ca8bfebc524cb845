//! Reply polling for blocking callers (`spin.rs`): a thread in `runtime::block_on` polls for a
//! local server's reply instead of sleeping. (When it stops polling, for a slow node, is
//! tested with the policy, in `spin.rs`.)

mod common;

use common::*;
use ferrolock::runtime::block_on;
use ferrolock_testbed::RedisServer;

/// This thread's voluntary context switches: how often it went to sleep.
fn thread_sleeps() -> i64 {
    // SAFETY: getrusage only writes into the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_THREAD is Linux's per-thread flavour.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    assert_eq!(rc, 0, "getrusage failed");
    usage.ru_nvcsw
}

fn pairs(m: &ferrolock::LockManager, key: &str, n: usize) {
    for _ in 0..n {
        let lock = block_on(m.acquire(key)).expect("acquire");
        assert!(block_on(lock.release()).expect("release"));
    }
}

#[test]
fn a_blocking_caller_polls_for_a_local_reply_instead_of_sleeping() {
    let _serial = serial();
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts());
    pairs(&m, "polling:local", 20); // connect and warm up

    // Each pair is two requests: a thread that sleeps for its replies switches out at least
    // twice per pair; one that polls, only for a reply that came late. A busy machine makes
    // replies late (and polling back off for a while), so a round may be run again.
    let n = 300;
    let mut rounds = Vec::new();
    for _ in 0..3 {
        let before = thread_sleeps();
        pairs(&m, "polling:local", n);
        let after = thread_sleeps();
        rounds.push(after - before);
        if after - before < n as i64 / 2 {
            return;
        }
    }
    panic!(
        "sleeps per round of {n} acquire+release pairs ({} requests): {rounds:?}; replies were \
         not polled for",
        2 * n
    );
}
