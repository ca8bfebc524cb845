//! The semaphore through the Rust API (`LockManager::semaphore*`), against real redis-servers:
//! holders never exceed the permits (a checker over recorded hold intervals), count > 1, the
//! refusals (N > 1, a brace of either kind in the name, bad counts, a different pool size), a crashed
//! holder's permits coming back after its lease, watchdog renewal and the loss signal, a
//! release waking a waiter, an attempt left with no answer giving its permits back, and a
//! cancelled waiter's attempt in flight leaving no queue place.

// Each #[tokio::test] runs its own runtime on its own thread, so holding the std mutex that
// serializes these tests across awaits blocks nothing but the test itself.
#![allow(clippy::await_holding_lock)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::holds::Holds;
use common::*;
use ferrolock::host::{Cancel, until_cancelled};
use ferrolock::{ErrorKind, HookPoint, LockStatus};
use ferrolock_testbed::{Direction, Proxy, RedisServer};

fn timeout_key(name: &str) -> String {
    format!("{{{name}}}:timeout")
}

fn available(server: &RedisServer, name: &str) -> i64 {
    server
        .cmd::<Option<i64>>(&["GET", name])
        .expect("the counter")
}

fn held_ids(server: &RedisServer, name: &str) -> i64 {
    server.cmd(&["ZCARD", &timeout_key(name)])
}

/// Tasks of two managers take 1..=K permits of K at random: at no instant do the recorded
/// holds add up to more than K, and K was reached by two holders or more together (so a
/// semaphore that serialized everyone, or one that over-granted, fails). Each interval is
/// recorded inside the real hold.
#[tokio::test]
async fn holders_never_exceed_the_permits() {
    let _s = serial();
    let server = RedisServer::start();
    const K: u32 = 3;
    let name = "sem:mix";
    let managers = [
        Arc::new(manager(&[server.url()], opts())),
        Arc::new(manager(&[server.url()], opts())),
    ];
    let holds = Holds::default();
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let m = managers[(t % 2) as usize].clone();
        let holds = holds.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let r = getrandom::u64().unwrap();
                // Mostly single permits, so that several holders meet.
                let count = if r.is_multiple_of(4) {
                    1 + (r >> 4) as u32 % K
                } else {
                    1
                };
                let lock = m.semaphore_with(name, K, count, &opts()).await.unwrap();
                holds.hold(&lock, count, ms(5 + (r >> 8) % 20)).await;
                assert!(lock.release().await.unwrap());
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(holds.all().len(), 80);
    assert!(
        holds.check(K).full_shared,
        "the {K} permits were never all held by several holders"
    );
    assert_eq!(available(&server, name), K as i64);
    assert_eq!(held_ids(&server, name), 0);
}

/// A holder of 2 of 3 permits leaves 1: a second 2 is refused, a 1 granted; each release
/// returns exactly what it took, once.
#[tokio::test]
async fn a_count_above_one_takes_and_returns_that_many() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts());
    let name = "sem:count";
    let two = m.semaphore_with(name, 3, 2, &opts()).await.unwrap();
    assert_eq!((available(&server, name), held_ids(&server, name)), (1, 2));
    let refused = m
        .semaphore_with(name, 3, 2, &opts().wait(Some(Duration::ZERO)))
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::NotAcquired, "{refused}");
    // Worded as a lock's try is.
    assert_eq!(
        refused.message(),
        "semaphore \"sem:count\": 2 permit(s) not acquired on the first try (wait=0): the pool is \
         taken (or its free permits are promised to earlier waiters in the queue)"
    );
    let one = m.semaphore(name, 3).await.unwrap();
    assert_eq!(available(&server, name), 0);
    assert!(two.release().await.unwrap());
    assert_eq!(available(&server, name), 2);
    let again = two.release().await.unwrap_err();
    assert_eq!(again.kind(), ErrorKind::NotHeld, "{again}");
    assert_eq!(
        available(&server, name),
        2,
        "a second release returned permits"
    );
    assert!(one.release().await.unwrap());
    assert_eq!((available(&server, name), held_ids(&server, name)), (3, 0));
}

/// A counter gone while holders' ids stay (an operator's `DEL`, an eviction under an
/// `allkeys-*` policy): the pool is rebuilt from what the ids do not hold. The first acquire
/// used to set a full pool beside them (holders above the permits), and a release before it
/// made a counter of its own count only, after which every acquire was refused for a pool
/// size that was never asked for.
#[tokio::test]
async fn a_counter_gone_beside_live_holders_is_rebuilt_from_them() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts());
    let name = "sem:counter-gone";
    let try_now = opts().wait(Some(Duration::ZERO));
    let two = m.semaphore_with(name, 3, 2, &opts()).await.unwrap();
    server.cmd::<i64>(&["DEL", name]);
    assert_eq!(held_ids(&server, name), 2, "the holder's ids stayed");
    let refused = m.semaphore_with(name, 3, 2, &try_now).await;
    assert!(
        refused.is_err(),
        "2 permits granted while 2 of 3 were held: {refused:?}"
    );
    let one = m.semaphore_with(name, 3, 1, &try_now).await.unwrap();
    assert_eq!((available(&server, name), held_ids(&server, name)), (0, 3));
    assert!(two.release().await.unwrap());
    assert!(one.release().await.unwrap());
    assert_eq!((available(&server, name), held_ids(&server, name)), (3, 0));

    // The counter gone, then a release before any acquire.
    let two = m.semaphore_with(name, 3, 2, &opts()).await.unwrap();
    let one = m.semaphore_with(name, 3, 1, &try_now).await.unwrap();
    server.cmd::<i64>(&["DEL", name]);
    assert!(one.release().await.unwrap());
    let again = m
        .semaphore_with(name, 3, 1, &try_now)
        .await
        .expect("the released permit, in a pool of 3 with 2 held");
    assert!(again.release().await.unwrap());
    assert!(two.release().await.unwrap());
    assert_eq!((available(&server, name), held_ids(&server, name)), (3, 0));
}

/// Bad input is refused before any request, naming what is wrong; a different stored pool
/// size is the script's refusal, naming both sizes.
#[tokio::test]
async fn bad_input_and_a_different_pool_size_are_refused() {
    let (a, b) = (RedisServer::start(), RedisServer::start());
    let two = manager(&[a.url(), b.url()], opts());
    let e = two.semaphore("sem:two", 2).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.message().contains("2 nodes"), "{e}");
    assert_eq!(a.cmd::<i64>(&["EXISTS", "sem:two"]), 0);

    let m = manager(&[a.url()], opts());
    let e = m.semaphore("sem:{brace}", 2).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.message().contains("\"sem:{brace}\""), "{e}");
    for (permits, count) in [(2, 3), (2, 0), (0, 0)] {
        let e = m
            .semaphore_with("sem:bad", permits, count, &opts())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert!(
            e.message()
                .contains(&format!("count {count} of permits {permits}")),
            "{e}"
        );
    }
    let e = m
        .semaphore_with("sem:bad", 5000, 1001, &opts())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.message().contains("count 1001 is above 1000"), "{e}");
    // A lease the watchdog cannot keep (loss margin 2 × 500 ms, not under ttl/3) is refused as
    // a lock's is; granted, it came back already lost. `check_request` refuses it up front.
    let short = opts()
        .ttl(Duration::from_secs(1))
        .node_timeout(Duration::from_millis(500));
    let e = m.semaphore_with("sem:bad", 2, 1, &short).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(
        e.message().contains("too short for semaphore \"sem:bad\""),
        "{e}"
    );
    let as_request = ferrolock::host::Kind::Permits {
        permits: 2,
        count: 3,
    }
    .options(short.clone());
    let e = ferrolock::check_request("sem:bad", &as_request).unwrap_err();
    assert!(e.message().contains("count 3 of permits 2"), "{e}");
    assert_eq!(a.cmd::<i64>(&["EXISTS", "sem:bad"]), 0);
    let most = m
        .semaphore_with("sem:most", 5000, 1000, &opts())
        .await
        .unwrap();
    assert_eq!(available(&a, "sem:most"), 4000);
    assert!(most.release().await.unwrap());
    assert_eq!(available(&a, "sem:most"), 5000);
    let held = m.semaphore("sem:size", 3).await.unwrap();
    let e = m.semaphore("sem:size", 5).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    // Both sizes, without the server's error code or the node's URL.
    assert_eq!(
        e.message(),
        "semaphore \"sem:size\" has 3 permits, asked for 5",
        "{e}"
    );
    assert!(held.release().await.unwrap());
}

/// A name with a `}` (and so no valid hash tag of its own) is refused before any request, as
/// one with a `{` is: Redisson's `{name}:timeout` would hash by the tag its braces make
/// (`user` for `user}1`), not as the counter does (whole), a CROSSSLOT error on a cluster.
/// `check_request` (a binding's up-front check) refuses it too.
#[tokio::test]
async fn a_name_with_a_closing_brace_is_refused() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts());
    for name in ["user}1", "sem:}", "}"] {
        let e = m.semaphore(name, 2).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert_eq!(
            e.message(),
            format!(
                "semaphore name {name:?} contains '}}': Redisson's timeout zset \
                 `{{name}}:timeout` would not share the counter's Redis Cluster slot"
            ),
            "{e}"
        );
        let as_request = ferrolock::host::Kind::Permits {
            permits: 2,
            count: 1,
        }
        .options(opts());
        let e = ferrolock::check_request(name, &as_request).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert!(
            e.message().contains(&format!("{name:?} contains '}}'")),
            "{e}"
        );
        assert_eq!(server.cmd::<i64>(&["EXISTS", name, &timeout_key(name)]), 0);
    }
}

/// A name whose counter key holds another kind of value is a Redis error saying so (not an
/// invalid argument: the key's data, not the request, is at fault), without the node's URL.
#[tokio::test]
async fn a_key_of_another_kind_is_refused_saying_so() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts());
    let _: i64 = server.cmd(&["HSET", "sem:typed", "f", "v"]);
    let e = m.semaphore("sem:typed", 2).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Redis, "{e}");
    assert_eq!(
        e.message(),
        "semaphore \"sem:typed\": a key it uses holds a value of another kind (WRONGTYPE)",
        "{e}"
    );
}

/// A wait that ends with the node unreachable names the node (its password hidden), as a
/// lock's does, instead of calling the pool taken.
#[tokio::test]
async fn a_dead_node_is_named_not_called_a_taken_pool() {
    let mut server = RedisServer::start();
    let url = format!("redis://:hunter2@127.0.0.1:{}", server.port());
    server.kill();
    assert!(!server.is_running());
    let m = manager(&[url], opts());
    for wait in [Duration::ZERO, ms(300)] {
        let e = m
            .semaphore_with("sem:dead", 2, 1, &opts().wait(Some(wait)))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::QuorumUnreachable, "{e}");
        let shown = format!("redis://:***@127.0.0.1:{} did not answer", server.port());
        assert!(e.message().contains(&shown), "{e}");
        assert!(!e.message().contains("hunter2"), "{e}");
    }
}

/// Without a wait (block until acquired), an acquire whose node does not answer ends after
/// three attempts in a row with `QuorumUnreachable` naming the node, as a lock's does (the
/// README's "acquire fails fast"; C's and Go's "waits as the lock's acquire"). Before, it
/// retried for ever. The bound is a failure bound: three attempts on a dead port take well
/// under a second.
#[tokio::test]
async fn an_unbounded_wait_on_a_dead_node_fails_fast_as_a_locks_does() {
    let mut server = RedisServer::start();
    let url = format!("redis://:hunter2@127.0.0.1:{}", server.port());
    server.kill();
    assert!(!server.is_running());
    let m = manager(&[url], opts());
    assert_eq!(opts().wait, None, "the wait is unbounded");
    let lock = tokio::time::timeout(
        Duration::from_secs(60),
        m.acquire_with("lock:dead", &opts()),
    )
    .await
    .expect("the lock's acquire waited for ever")
    .unwrap_err();
    assert_eq!(lock.kind(), ErrorKind::QuorumUnreachable, "{lock}");
    let e = tokio::time::timeout(
        Duration::from_secs(60),
        m.semaphore_with("sem:dead-unbounded", 2, 1, &opts()),
    )
    .await
    .expect("the semaphore's acquire on a dead node waited for ever")
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::QuorumUnreachable, "{e}");
    let shown = format!("redis://:***@127.0.0.1:{} did not answer", server.port());
    assert!(e.message().contains(&shown), "{e}");
    assert!(!e.message().contains("hunter2"), "{e}");
}

/// An acquire given a long wait that the node does not answer ends after three attempts in a
/// row, long before its wait: the error must not claim that the whole wait went by (it said
/// "not acquired within wait=600s" about a second after the call).
#[tokio::test]
async fn an_unanswered_acquire_given_up_before_its_wait_does_not_claim_the_wait() {
    let mut server = RedisServer::start();
    let url = server.url();
    server.kill();
    let m = manager(&[url], opts());
    let e = tokio::time::timeout(
        Duration::from_secs(60),
        m.semaphore_with(
            "sem:dead-long-wait",
            2,
            1,
            &opts().wait(Some(Duration::from_secs(600))),
        ),
    )
    .await
    .expect("the acquire on a dead node waited out its wait")
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::QuorumUnreachable, "{e}");
    assert!(!e.message().contains("within wait="), "{e}");
    assert!(e.message().contains("after 3 attempts in a row"), "{e}");
}

/// A name held as a plain lock is held by someone else: a semaphore waits for it, never
/// takes it over (the lock's holder would lose it unheard).
#[tokio::test]
async fn a_name_held_as_a_plain_lock_is_not_taken_over() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts());
    let name = "sem:was-a-lock";
    let lock = m
        .acquire_with(name, &opts().ttl(Duration::from_secs(60)))
        .await
        .unwrap();
    let e = m
        .semaphore_with(name, 2, 1, &opts().wait(Some(ms(300))))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotAcquired, "{e}");
    assert!(
        e.to_string().contains("held as a lock") && !e.to_string().contains("pool is taken"),
        "{e}"
    );
    assert_eq!(get(&server, name).as_deref(), Some(lock.token()));
    assert!(lock.is_held());
    // A waiter gets the name once the lock is released, long before the lock's 60 s ttl
    // (its release publishes nothing semaphore waiters hear: they re-check at the retry delay).
    let waiter = tokio::spawn({
        let m = m.clone();
        async move {
            m.semaphore_with(name, 2, 1, &opts().wait(Some(Duration::from_secs(30))))
                .await
        }
    });
    tokio::time::sleep(ms(200)).await;
    assert!(lock.release().await.unwrap(), "the lock was taken over");
    let permit = waiter.await.unwrap().unwrap();
    assert_eq!(available(&server, name), 1);
    assert!(permit.release().await.unwrap());
}

/// A holder that never releases (its handle forgotten, as a crashed process's) keeps its
/// permit until its lease ends, then the pool has it again.
#[tokio::test]
async fn a_crashed_holders_permits_come_back_after_its_lease() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts());
    let name = "sem:crash";
    let lease = ms(1_500);
    let lock = m
        .semaphore_with(name, 1, 1, &opts().ttl(lease))
        .await
        .unwrap();
    std::mem::forget(lock);
    assert_eq!((available(&server, name), held_ids(&server, name)), (0, 1));
    let e = m
        .semaphore_with(name, 1, 1, &opts().wait(Some(Duration::ZERO)))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotAcquired, "the permit was free: {e}");
    let next = m
        .semaphore_with(name, 1, 1, &opts().wait(Some(Duration::from_secs(30))))
        .await
        .expect("the crashed holder's permit never came back");
    assert_eq!(held_ids(&server, name), 1);
    assert!(next.release().await.unwrap());
    assert_eq!(available(&server, name), 1);
}

/// The watchdog keeps a holder's permits past three leases; a permit removed behind its back
/// is signalled lost before the hold's validity ends.
#[tokio::test]
async fn the_watchdog_renews_permits_and_signals_a_loss() {
    let _s = serial();
    let server = RedisServer::start();
    let watched = opts().watchdog(true).ttl(ms(1_500));
    let m = manager(&[server.url()], watched.clone());
    let name = "sem:renew";
    let lock = m.semaphore_with(name, 2, 2, &watched).await.unwrap();
    tokio::time::sleep(ms(1_500 * 3 + 500)).await;
    assert_eq!(lock.status(), LockStatus::Held);
    let e = m
        .semaphore_with(name, 2, 1, &opts().wait(Some(Duration::ZERO)))
        .await
        .unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::NotAcquired,
        "a permit was reclaimed: {e}"
    );
    assert_eq!(held_ids(&server, name), 2);

    let deadline = lock.deadline();
    let lost = lock.lost();
    assert_eq!(
        server.cmd::<i64>(&["DEL", &timeout_key(name)]),
        1,
        "the fault: the permit ids deleted"
    );
    let reason = tokio::time::timeout_at(deadline, lost)
        .await
        .expect("no loss signal before the deadline");
    // Its messages name the semaphore, as its acquire's do (they said `lock "sem:renew"`).
    let said = reason.expect("a loss reason").to_string();
    assert!(
        said.starts_with(&format!("semaphore {name:?} lost")),
        "{said}"
    );
    assert!(matches!(lock.status(), LockStatus::Lost(_)));
    let e = lock.extend_for(ms(1_500)).await.unwrap_err();
    assert!(
        e.to_string().contains(&format!("semaphore {name:?} lost"))
            && !e.to_string().contains("lock"),
        "{e}"
    );
}

/// A released permit handle's errors name the semaphore, not a lock.
#[tokio::test]
async fn a_released_permits_errors_name_the_semaphore() {
    let _s = serial();
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts());
    let name = "sem:words";
    let lock = m.semaphore_with(name, 1, 1, &opts()).await.unwrap();
    assert!(lock.release().await.unwrap());
    let again = lock.release().await.unwrap_err();
    assert_eq!(
        again.to_string(),
        format!("semaphore {name:?} was already released")
    );
    let extend = lock.extend_for(ms(60_000)).await.unwrap_err();
    assert_eq!(
        extend.to_string(),
        format!("semaphore {name:?} cannot be extended: it was released")
    );
    let check = lock.check().unwrap_err();
    assert_eq!(
        check.to_string(),
        format!("semaphore {name:?} was released")
    );
}

/// A waiter whose re-checks are far away (at the holder's lease end and its retry delay, both
/// 120 s) is granted after a release within 60 s: only the publish on `redisson_sc:{name}` can
/// explain that (the bound is the re-check time, not a speed).
#[tokio::test]
async fn a_release_wakes_a_waiter() {
    let server = RedisServer::start();
    let m = Arc::new(manager(&[server.url()], opts()));
    let name = "sem:wake";
    let long = Duration::from_secs(120);
    let holder = m
        .semaphore_with(name, 1, 1, &opts().ttl(long))
        .await
        .unwrap();
    let waiter = {
        let m = m.clone();
        tokio::spawn(async move {
            let o = opts().retry_delay(long);
            m.semaphore_with(name, 1, 1, &o).await
        })
    };
    let channel = format!("redisson_sc:{{{name}}}");
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let subs: (String, i64) = server.cmd(&["PUBSUB", "NUMSUB", &channel]);
        if subs.1 > 0 {
            break;
        }
        assert!(Instant::now() < end, "the waiter never subscribed");
        tokio::time::sleep(ms(10)).await;
    }
    assert!(!waiter.is_finished(), "granted while the permit was held");
    assert!(holder.release().await.unwrap());
    let lock = tokio::time::timeout(Duration::from_secs(60), waiter)
        .await
        .expect("not woken by the release: granted only at a re-check")
        .unwrap()
        .unwrap();
    assert!(lock.release().await.unwrap());
}

/// Redisson 4.7.0 and the Rust API share one pool: a ferrolock waiter (its re-checks 60 s and
/// 120 s away) is granted within 30 s of Redisson's release, so Redisson's publish woke it;
/// Redisson is refused while ferrolock holds every permit, and takes one after its release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_and_the_rust_api_share_one_pool_and_wake_each_other() {
    use common::redisson::{Redisson, redisson_classpath};
    let classpath = redisson_classpath();
    let server = RedisServer::start();
    let mut r = Redisson::start(classpath, &server.url(), "single").await;
    let m = Arc::new(manager(&[server.url()], opts()));
    let name = "sem:interop";
    let reply = Duration::from_secs(30);
    r.send(&format!("ssetpermits {name} 2")).await;
    r.expect(&format!("ssetpermits {name} true"), reply).await;
    r.send(&format!("sacquire {name} 2 60000")).await;
    let java = r.expect(&format!("sacquire {name} "), reply).await;
    let java = java[format!("sacquire {name} ").len()..].to_string();
    let e = m
        .semaphore_with(name, 2, 1, &opts().wait(Some(Duration::ZERO)))
        .await
        .unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::NotAcquired,
        "Redisson holds every permit: {e}"
    );
    let waiter = {
        let m = m.clone();
        tokio::spawn(async move {
            let o = opts().retry_delay(Duration::from_secs(120));
            m.semaphore_with(name, 2, 2, &o).await
        })
    };
    let channel = format!("redisson_sc:{{{name}}}");
    let end = Instant::now() + reply;
    while server
        .cmd::<(String, i64)>(&["PUBSUB", "NUMSUB", &channel])
        .1
        == 0
    {
        assert!(Instant::now() < end, "the waiter never subscribed");
        tokio::time::sleep(ms(10)).await;
    }
    assert!(
        !waiter.is_finished(),
        "granted while Redisson held every permit"
    );
    r.send(&format!("srelease {name} {java}")).await;
    r.expect(&format!("sreleased {name}"), reply).await;
    let ours = tokio::time::timeout(reply, waiter)
        .await
        .expect("not woken by Redisson's release: granted only at a re-check")
        .unwrap()
        .unwrap();
    r.send(&format!("sacquire {name} 1 60000")).await;
    r.expect(&format!("sacquire {name} none"), reply).await;
    assert!(ours.release().await.unwrap());
    r.send(&format!("sacquire {name} 1 60000")).await;
    let line = r.expect(&format!("sacquire {name} "), reply).await;
    assert!(!line.ends_with(" none"), "{line}");
    r.send("quit").await;
}

/// Waiters of three managers queued in a known order on a pool of 1 are granted in that
/// order, and a first try that arrives while they wait (past the barging bound) does not take
/// the permit ahead of them. The permit is freed silently (no publish, as a lease that ends),
/// so only the queue can refuse the first try; then one publish starts the chain of releases.
#[tokio::test]
async fn waiters_are_granted_in_queue_order_and_a_first_try_waits_its_turn() {
    let server = RedisServer::start();
    let name = "sem:fair";
    let long = Duration::from_secs(120);
    let queue = ferrolock::__wire::KeyNames::of(name).queue;
    let queued = || server.cmd::<i64>(&["ZCARD", &queue]);
    let holder_m = manager(&[server.url()], opts());
    let holder = holder_m
        .semaphore_with(name, 1, 1, &opts().ttl(long))
        .await
        .unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..3 {
        let m = manager(&[server.url()], opts());
        let order = order.clone();
        waiters.push(tokio::spawn(async move {
            let lock = m
                .semaphore_with(name, 1, 1, &opts().retry_delay(long))
                .await
                .unwrap();
            order.lock().unwrap().push(i);
            assert!(lock.release().await.unwrap());
        }));
        let end = Instant::now() + Duration::from_secs(30);
        while queued() < i + 1 {
            assert!(Instant::now() < end, "waiter {i} never queued");
            tokio::time::sleep(ms(10)).await;
        }
    }
    // Freed behind everyone's back: no publish, so no waiter re-checks.
    let _: i64 = server.cmd(&["DEL", &timeout_key(name)]);
    let _: String = server.cmd(&["SET", name, "1"]);
    std::mem::forget(holder);
    let barger = manager(&[server.url()], opts());
    let err = barger
        .semaphore_with(name, 1, 1, &opts().wait(Some(Duration::ZERO)))
        .await
        .expect_err("a first try took the permit ahead of three queued waiters");
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    // The permit is free, promised to the waiters: the error says so, as a lock's does (it
    // said only "the pool is taken", while `ferrolock inspect` showed 1 of 1 free).
    assert!(
        err.message()
            .contains("promised to earlier waiters in the queue"),
        "{err}"
    );
    let _: i64 = server.cmd(&["PUBLISH", &format!("redisson_sc:{{{name}}}"), "1"]);
    for w in waiters {
        tokio::time::timeout(Duration::from_secs(60), w)
            .await
            .expect("a waiter was never granted")
            .unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
    assert_eq!(available(&server, name), 1);
    drop(holder_m);
}

/// The server's clock in milliseconds (queue leases are scored with it).
fn server_ms(server: &RedisServer) -> i64 {
    let (secs, micros): (i64, i64) = server.cmd(&["TIME"]);
    secs * 1000 + micros / 1000
}

/// A waiter whose earliest lease end is far away (the holder's lease: 120 s) keeps its place
/// in the server queue while it waits: it re-checks within its place's lease (3 × its retry
/// delay + 4 × its node timeout), so a first try well past that lease still waits its turn.
/// Before, it slept until the lease end, its place lapsed, and the first try took the permit
/// ahead of it. Retry delay 2 s: a place lasts 6.8 s, re-checks come at most 3 s apart.
#[tokio::test]
async fn a_waiter_keeps_its_queue_place_while_the_earliest_lease_end_is_far_away() {
    let server = RedisServer::start();
    let name = "sem:keep-place";
    let leases = ferrolock::__wire::KeyNames::of(name).leases;
    let place = || -> Option<i64> {
        let held: Vec<(String, i64)> = server.cmd(&["ZRANGE", &leases, "0", "-1", "WITHSCORES"]);
        held.first().map(|(_, end)| *end)
    };
    let holder_m = manager(&[server.url()], opts());
    let holder = holder_m
        .semaphore_with(name, 1, 1, &opts().ttl(Duration::from_secs(120)))
        .await
        .unwrap();
    let o = opts().retry_delay(Duration::from_secs(2));
    let m = manager(&[server.url()], o.clone());
    let waiter = tokio::spawn({
        let m = m.clone();
        async move { m.semaphore_with(name, 1, 1, &o).await }
    });
    let end = Instant::now() + Duration::from_secs(30);
    let first_lease_end = loop {
        if let Some(lease_end) = place() {
            break lease_end;
        }
        assert!(Instant::now() < end, "the waiter never queued");
        tokio::time::sleep(ms(10)).await;
    };
    // 3 s past the lease of the place as first queued, by the server's clock.
    while server_ms(&server) < first_lease_end + 3_000 {
        tokio::time::sleep(ms(50)).await;
    }
    assert!(!waiter.is_finished(), "granted while the permit was held");
    let now = server_ms(&server);
    assert!(
        place().is_some_and(|lease_end| lease_end > now),
        "the waiter's queue place lapsed while it waited (its lease end {:?}, now {now})",
        place()
    );
    // Freed behind everyone's back, in one step (no publish): only the queue can refuse a
    // first try.
    let _: () = server.cmd(&[
        "EVAL",
        "redis.call('DEL', KEYS[2]); redis.call('SET', KEYS[1], '1')",
        "2",
        name,
        &timeout_key(name),
    ]);
    std::mem::forget(holder);
    let barger = manager(&[server.url()], opts());
    let err = barger
        .semaphore_with(name, 1, 1, &opts().wait(Some(Duration::ZERO)))
        .await
        .expect_err("a first try took the permit ahead of the queued waiter");
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    let _: i64 = server.cmd(&["PUBLISH", &format!("redisson_sc:{{{name}}}"), "1"]);
    let lock = tokio::time::timeout(Duration::from_secs(60), waiter)
        .await
        .expect("the waiter was never granted")
        .unwrap()
        .unwrap();
    assert!(lock.release().await.unwrap());
    assert_eq!(available(&server, name), 1);
    drop(holder_m);
}

/// When the waiter at the head of the queue leaves (cancelled here; a wait that ran out leaves
/// the same way) while permits are free, the next waiter is told, as it would be told by a
/// release: it may have been refused for the head's turn, and its own re-checks are far away
/// (its retry delay, 240 s; the holder's lease end, 120 s). The permit is freed with no
/// publish (behind everyone's back), so only the head's leaving can wake it. Before, the
/// dequeue woke the waiters only when the name's key was gone, which a semaphore's counter is
/// not while it is in use (only an operator's `DEL` or an eviction takes it), and the next
/// waiter slept on with a permit free.
#[tokio::test]
async fn the_next_waiter_is_told_when_the_head_leaves_with_permits_free() {
    let server = RedisServer::start();
    let name = "sem:head-left";
    let queue = ferrolock::__wire::KeyNames::of(name).queue;
    let queued = || server.cmd::<i64>(&["ZCARD", &queue]);
    let holder_m = manager(&[server.url()], opts());
    let holder = holder_m
        .semaphore_with(name, 1, 1, &opts().ttl(Duration::from_secs(120)))
        .await
        .unwrap();
    let slow = opts().retry_delay(Duration::from_secs(240));
    let mut waiters = Vec::new();
    for i in 0..2 {
        let m = manager(&[server.url()], slow.clone());
        let o = slow.clone();
        waiters.push(tokio::spawn(async move {
            m.semaphore_with(name, 1, 1, &o).await
        }));
        let end = Instant::now() + Duration::from_secs(30);
        while queued() < i + 1 {
            assert!(Instant::now() < end, "waiter {i} never queued");
            tokio::time::sleep(ms(10)).await;
        }
    }
    let (head, next) = (waiters.remove(0), waiters.remove(0));
    // Freed behind everyone's back, in one step (no publish): no waiter re-checks.
    let _: () = server.cmd(&[
        "EVAL",
        "redis.call('DEL', KEYS[2]); redis.call('SET', KEYS[1], '1')",
        "2",
        name,
        &timeout_key(name),
    ]);
    std::mem::forget(holder);
    assert!(!next.is_finished(), "granted while the permit was held");
    head.abort();
    assert!(head.await.unwrap_err().is_cancelled());
    let lock = tokio::time::timeout(Duration::from_secs(60), next)
        .await
        .expect("the next waiter was not told that the head left with a permit free")
        .unwrap()
        .unwrap();
    assert!(lock.release().await.unwrap());
    assert_eq!(available(&server, name), 1);
    drop(holder_m);
}

/// A release of k permits wakes up to k waiters: three queued waiters of one permit each (in
/// three managers, their own re-checks 120 s away) are all granted after one release of 3,
/// and hold together (so no waiter needed a later release or a re-check of its own).
#[tokio::test]
async fn a_release_of_k_permits_wakes_k_waiters() {
    let server = RedisServer::start();
    let name = "sem:wake-k";
    let long = Duration::from_secs(120);
    let queue = ferrolock::__wire::KeyNames::of(name).queue;
    let holder_m = manager(&[server.url()], opts());
    let holder = holder_m
        .semaphore_with(name, 3, 3, &opts().ttl(long))
        .await
        .unwrap();
    let mut waiters = Vec::new();
    for i in 0..3 {
        let m = manager(&[server.url()], opts());
        waiters.push(tokio::spawn(async move {
            let lock = m
                .semaphore_with(name, 3, 1, &opts().retry_delay(long).ttl(long))
                .await
                .unwrap();
            (m, lock)
        }));
        let end = Instant::now() + Duration::from_secs(30);
        while server.cmd::<i64>(&["ZCARD", &queue]) < i + 1 {
            assert!(Instant::now() < end, "waiter {i} never queued");
            tokio::time::sleep(ms(10)).await;
        }
    }
    assert!(holder.release().await.unwrap());
    let mut held = Vec::new();
    for w in waiters {
        held.push(
            tokio::time::timeout(Duration::from_secs(60), w)
                .await
                .expect("not woken by the release: granted only at a re-check")
                .unwrap(),
        );
    }
    assert_eq!(
        available(&server, name),
        0,
        "the three waiters hold together"
    );
    for (_m, lock) in held {
        assert!(lock.release().await.unwrap());
    }
    assert_eq!(available(&server, name), 3);
}

/// Two waiters of one manager share its place in the queue, so the grant of the first takes
/// it out: the second, refused after it behind another manager's waiter, queues again at the
/// back. When that other waiter then takes a permit and one is still free, the second must be
/// told. Three permits freed at once for three waiters of one: before, the second slept on its
/// own re-check (its retry delay, 240 s here, ± 50 %) with a permit free (found by a review). The
/// other manager's replies are held while the first two attempt, to force that order.
#[tokio::test]
async fn a_grant_that_leaves_permits_free_tells_the_waiter_queued_again_behind_it() {
    let _s = serial();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let name = "sem:grant-leaves-free";
    let long = Duration::from_secs(240);
    let slow = opts().retry_delay(long).ttl(long);
    let queue = ferrolock::__wire::KeyNames::of(name).queue;
    let queued = || server.cmd::<Vec<String>>(&["ZRANGE", &queue, "0", "-1"]);
    let await_queued = |n: usize| {
        let queued = &queued;
        async move {
            let end = Instant::now() + Duration::from_secs(30);
            while queued().len() < n {
                assert!(Instant::now() < end, "never {n} queued: {:?}", queued());
                tokio::time::sleep(ms(10)).await;
            }
        }
    };
    let holder_m = manager(&[server.url()], opts());
    let holder = holder_m.semaphore_with(name, 3, 3, &slow).await.unwrap();
    let spawn = |m: &ferrolock::LockManager| {
        let (m, o) = (m.clone(), slow.clone());
        tokio::spawn(async move { m.semaphore_with(name, 3, 1, &o).await })
    };
    // The other manager's waiter queues first; then two of one manager, which share a place.
    let other_m = manager(&[proxy.url()], opts());
    let other = spawn(&other_m);
    await_queued(1).await;
    let pair_m = manager(&[server.url()], opts());
    let first = spawn(&pair_m);
    await_queued(2).await;
    let second = spawn(&pair_m);
    // The second's first try (refused) and its queued attempt: the pair's place stays one.
    let calls = script_calls(&server);
    let end = Instant::now() + Duration::from_secs(30);
    while script_calls(&server) < calls + 2 {
        assert!(
            Instant::now() < end,
            "the second waiter never attempted twice"
        );
        tokio::time::sleep(ms(10)).await;
    }
    let other_id = queued()[0].clone();
    proxy.hold(Direction::Down);
    assert!(holder.release().await.unwrap());
    // One of the pair is granted (its place goes), and the other is refused behind the other
    // manager's waiter, which has not heard of the release yet (or, told by that grant,
    // granted next: it is second in line with two permits free).
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let granted = [first.is_finished(), second.is_finished()];
        let split = granted.contains(&true) && queued().len() == 2;
        if split || granted == [true, true] {
            break;
        }
        assert!(
            Instant::now() < end,
            "the pair never split: {:?}, available {}",
            queued(),
            available(&server, name)
        );
        tokio::time::sleep(ms(5)).await;
    }
    assert_eq!(queued()[0], other_id, "the other manager's waiter is first");
    proxy.release(Direction::Down);
    let mut held = Vec::new();
    for (what, w) in [("other", other), ("first", first), ("second", second)] {
        held.push(
            tokio::time::timeout(Duration::from_secs(60), w)
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "{what}: not granted with a permit free (available {}, queued {:?})",
                        available(&server, name),
                        queued()
                    )
                })
                .unwrap()
                .unwrap(),
        );
    }
    assert_eq!(available(&server, name), 0);
    for lock in held {
        assert!(lock.release().await.unwrap());
    }
    drop((other_m, pair_m, holder_m));
}

/// Script calls a server has run (`EVALSHA` and `EVAL`).
fn script_calls(server: &RedisServer) -> u64 {
    calls(server, "evalsha") + calls(server, "eval")
}

/// An attempt that ran on the node but whose reply never came (every reply held past the node
/// timeout) may have taken its permits; the next attempt draws new ids, so the unanswered one
/// gives its ids back at once instead of leaving them taken until their lease ends. Here the
/// first attempt takes the whole pool: kept, no later attempt could be granted before the
/// 60 s lease ends, far past the wait.
#[tokio::test]
async fn an_attempt_left_with_no_answer_gives_its_permits_back() {
    let _s = serial();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let name = "sem:unanswered";
    // A node timeout of a second: three unanswered attempts in a row end the acquire
    // (`UNREACHABLE_ATTEMPTS`), so the link must be released before the third times out;
    // this leaves the test two seconds of margin on a slow machine.
    let o = opts()
        .ttl(Duration::from_secs(60))
        .node_timeout(Duration::from_secs(1))
        .wait(Some(Duration::from_secs(20)));
    let m = manager(&[proxy.url()], o.clone());
    // The connection is open before the fault: the fault is for the attempt.
    let warm = m.semaphore_with(name, 2, 2, &o).await.unwrap();
    assert!(warm.release().await.unwrap());
    let before = script_calls(&server);
    proxy.hold(Direction::Down);
    let task = tokio::spawn({
        let (m, o) = (m.clone(), o.clone());
        async move { m.semaphore_with(name, 2, 2, &o).await }
    });
    let start = Instant::now();
    while held_ids(&server, name) < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the attempt never ran"
        );
        tokio::time::sleep(ms(2)).await;
    }
    // Past the first attempt's node timeout: its give-back and a second attempt reach the
    // server (requests still go up; only replies are held).
    while script_calls(&server) < before + 3 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no attempt after the unanswered one"
        );
        tokio::time::sleep(ms(5)).await;
    }
    assert!(!task.is_finished(), "an answer came through a held link");
    proxy.release(Direction::Down);
    let lock = task
        .await
        .unwrap()
        .expect("the pool stayed taken by the unanswered attempt's ids");
    // Only the granted attempt's ids are held (a give-back still on its way settles first).
    let settle = Instant::now();
    while held_ids(&server, name) != 2 {
        assert!(
            settle.elapsed() < Duration::from_secs(30),
            "{} ids held, not the 2 granted",
            held_ids(&server, name)
        );
        tokio::time::sleep(ms(5)).await;
    }
    assert!(lock.release().await.unwrap());
    assert_eq!((available(&server, name), held_ids(&server, name)), (2, 0));
}

/// A give-back is not a vote: it reaches a node the restart guard holds back, as every
/// release does. The attempt ran on the node, the node restarted with its data before the
/// reply came, and the re-send found it restarted (held back for the guard's window): the
/// attempt's give-back must return its permit at once. Sent as a vote, it was refused, and
/// the permit stayed taken for its whole lease (120 s here, far past the test).
#[tokio::test(flavor = "multi_thread")]
async fn a_give_back_reaches_a_node_the_restart_guard_holds_back() {
    let _s = serial();
    let mut server = RedisServer::start_with(ferrolock_testbed::ServerOptions {
        persistence: true,
        ..Default::default()
    });
    let proxy = Proxy::start(server.port());
    let name = "sem:held-back";
    let window = Duration::from_secs(8);
    // The attempt waits for its reply across the restart: a long node timeout, and a lease
    // the watchdog could keep with it (above 6 node timeouts).
    let o = opts()
        .ttl(Duration::from_secs(120))
        .node_timeout(Duration::from_secs(15))
        .wait(Some(Duration::ZERO));
    // Up for longer than the window, so that it grants at first.
    let m = guarded_manager_once_up(&server, proxy.url(), window, o).await;
    // The connection (and the run_id the guard compares) is there before the fault.
    let warm = m.semaphore(name, 2).await.unwrap();
    assert!(warm.release().await.unwrap());
    proxy.hold(Direction::Down);
    let task = tokio::spawn({
        let m = m.clone();
        async move { m.semaphore(name, 2).await }
    });
    let start = Instant::now();
    while held_ids(&server, name) < 1 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the attempt never ran"
        );
        tokio::time::sleep(ms(2)).await;
    }
    server.cmd::<()>(&["SAVE"]);
    // The held reply keeps the client's link open across the restart; the reset then drops
    // it, and the attempt's re-send finds another run_id.
    tokio::task::block_in_place(|| server.restart());
    assert_eq!((available(&server, name), held_ids(&server, name)), (1, 1));
    proxy.reset();
    let e = task.await.unwrap().unwrap_err();
    // The fault happened: the restarted node was held back when the attempt was re-sent.
    assert!(e.message().contains("restart guard"), "{e}");
    let settle = Instant::now();
    while (available(&server, name), held_ids(&server, name)) != (2, 0) {
        assert!(
            settle.elapsed() < Duration::from_secs(30),
            "the unanswered attempt's permit stayed taken: {} available, {} ids held ({e})",
            available(&server, name),
            held_ids(&server, name)
        );
        tokio::time::sleep(ms(10)).await;
    }
}

/// A waiter cancelled while an attempt of its is on its way to the node: the acquire's queue
/// place is taken out at once, then the attempt arrives, is refused and queues the place
/// again. Nothing of the cancelled waiter may stay in the queue (it would be its head, and
/// hold up every first try past the barging bound, for a whole queue lease). The attempt is
/// held before it sends, so the dequeue is first every time.
#[tokio::test]
async fn a_cancelled_waiters_attempt_in_flight_leaves_no_queue_place() {
    let _s = serial();
    let _hook = HookGuard;
    let server = RedisServer::start();
    let name = "sem:cancel-in-flight";
    let queue = ferrolock::__wire::KeyNames::of(name).queue;
    let queued = || server.cmd::<i64>(&["ZCARD", &queue]);
    let holder_m = manager(&[server.url()], opts());
    let holder = holder_m
        .semaphore_with(name, 1, 1, &opts().ttl(Duration::from_secs(120)))
        .await
        .unwrap();
    // Re-checks when woken or after its retry delay (10 s; the holder's lease ends in 120 s):
    // a queue lease of 38 s (3 × retry + 4 × node timeout), so a place left behind cannot pass
    // the check below by expiring.
    // (A ttl of 30 s: a 2 s node timeout's loss margin must be under a third of it.)
    let o = opts()
        .retry_delay(Duration::from_secs(10))
        .node_timeout(Duration::from_secs(2))
        .ttl(Duration::from_secs(30));
    let m = manager(&[server.url()], o.clone());
    let task = tokio::spawn({
        let m = m.clone();
        async move { m.semaphore_with(name, 1, 1, &o).await }
    });
    let end = Instant::now() + Duration::from_secs(30);
    while queued() < 1 {
        assert!(Instant::now() < end, "the waiter never queued");
        tokio::time::sleep(ms(10)).await;
    }
    let (entered, go) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    ferrolock::__set_test_hook(Some(Arc::new({
        let (entered, go) = (entered.clone(), go.clone());
        move |point, key| {
            if point != HookPoint::SemaphoreSending
                || key != name
                || entered.swap(true, Ordering::SeqCst)
            {
                return;
            }
            // Holds the attempt (on the blocking pool) until the test lets it go.
            hold_until(&go);
        }
    })));
    // A publish on the pool's channel: the waiter attempts again, and is held there.
    let _: i64 = server.cmd(&["PUBLISH", &format!("redisson_sc:{{{name}}}"), "1"]);
    while !entered.load(Ordering::SeqCst) {
        assert!(Instant::now() < end, "the waiter never attempted again");
        tokio::time::sleep(ms(5)).await;
    }
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    // The fault: the place is gone from the node before the attempt is sent.
    while queued() != 0 {
        assert!(
            Instant::now() < end,
            "the cancelled waiter's place was never taken out"
        );
        tokio::time::sleep(ms(5)).await;
    }
    let before = script_calls(&server);
    go.store(true, Ordering::SeqCst);
    // The held attempt runs (refused: the holder has the pool), then nothing of it is left.
    let end = Instant::now() + Duration::from_secs(20);
    while script_calls(&server) == before {
        assert!(Instant::now() < end, "the held attempt never ran");
        tokio::time::sleep(ms(5)).await;
    }
    while queued() != 0 {
        assert!(
            Instant::now() < end,
            "the cancelled waiter's attempt left its place in the queue"
        );
        tokio::time::sleep(ms(5)).await;
    }
    assert_eq!(available(&server, name), 0, "the holder's permit");
    assert!(holder.release().await.unwrap());
    assert_eq!(available(&server, name), 1);
}

/// Holds the next attempt on `name` for `stall` before it is sent (a stalled client), once for
/// each time the flag it returns is set (it starts set, and reads false once the stall ran).
fn stall_next_attempt(name: &'static str, stall: Duration) -> Arc<AtomicBool> {
    let stalls = Arc::new(AtomicBool::new(true));
    ferrolock::__set_test_hook(Some(Arc::new({
        let stalls = stalls.clone();
        move |point, key| {
            if point == HookPoint::SemaphoreSending
                && key == name
                && stalls.swap(false, Ordering::SeqCst)
            {
                std::thread::sleep(stall);
            }
        }
    })));
    stalls
}

/// A grant answered after the validity it would have had (a stalled client: the attempt held
/// past the whole ttl before it is sent) is not a grant: its permits go back, and the acquire
/// tries again within its wait (or says why it gave up). Before, it came back as a grant with
/// no validity left, and its loss was signalled only after the deadline. Found by a review.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_answered_after_its_validity_is_given_back() {
    let _s = serial();
    let _hook = HookGuard;
    let server = RedisServer::start();
    let name = "sem:too-late";
    let ttl = Duration::from_secs(1);
    let m = manager(&[server.url()], opts().ttl(ttl));
    let stalls = stall_next_attempt(name, Duration::from_millis(1300));
    // No wait: the one attempt was too late, and the error says so.
    let err = m
        .semaphore_with(name, 2, 1, &opts().ttl(ttl).wait(Some(Duration::ZERO)))
        .await
        .map(|l| format!("granted, validity {:?}", l.validity()))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    assert!(
        err.to_string().contains("the acquire took too long"),
        "{err}"
    );
    // The fault happened (the stall) and its permit went back.
    assert!(!stalls.load(Ordering::SeqCst));
    assert_eq!(available(&server, name), 2);
    // With a wait: the next attempt (not stalled) is the grant.
    stalls.store(true, Ordering::SeqCst);
    let lock = m
        .semaphore_with(
            name,
            2,
            1,
            &opts().ttl(ttl).wait(Some(Duration::from_secs(10))),
        )
        .await
        .unwrap();
    assert!(!stalls.load(Ordering::SeqCst));
    assert!(lock.validity() > Duration::ZERO);
    assert_eq!(
        available(&server, name),
        1,
        "only the grant's permit is taken"
    );
    assert!(lock.release().await.unwrap());
}

/// A cancel that lands while a too-late grant's permits are on their way back is reported only
/// once they are back (a cancelled call reports once its clean-up is done). Before, the
/// give-back ran in a task the cancel did not collect, and `Cancelled` came while the node
/// still held the permit. Found by a review.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_during_a_too_late_give_back_reports_once_the_permits_are_back() {
    let _s = serial();
    let _hook = HookGuard;
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let name = "sem:too-late-cancel";
    // Node timeout 200 ms: the give-back's 70 ms each way leaves room on a slow machine.
    let ttl = Duration::from_secs(2);
    let m = manager(&[proxy.url()], opts().ttl(ttl));
    // Warm: connection open and scripts loaded while the link is fast.
    let warm = m
        .semaphore_with(name, 1, 1, &opts().ttl(ttl))
        .await
        .unwrap();
    assert!(warm.release().await.unwrap());
    assert_eq!(available(&server, name), 1);

    let stalls = stall_next_attempt(name, Duration::from_millis(2200));
    // Requests take 70 ms to reach the node (within the 200 ms node timeout): the give-back
    // is in flight for 70 ms after the too-late grant's reply came back.
    proxy.set_delay_dir(Direction::Up, ms(70));
    let sent = calls(&server, "evalsha");
    let cancel = Cancel::new();
    let acquire = tokio::spawn({
        let (m, cancel) = (m.clone(), cancel.clone());
        async move {
            until_cancelled(
                m.semaphore_with(
                    name,
                    1,
                    1,
                    &opts().ttl(ttl).wait(Some(Duration::from_secs(10))),
                ),
                &cancel,
            )
            .await
            .map(|r| r.map(|l| format!("{:?}", l.validity())))
        }
    });
    // The too-late grant ran on the node; its reply (not delayed) is back within a few ms,
    // and the give-back is then on its way for 70 ms: cancel in that window.
    let start = Instant::now();
    while calls(&server, "evalsha") == sent {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the attempt never ran"
        );
        tokio::time::sleep(ms(1)).await;
    }
    assert_eq!(
        available(&server, name),
        0,
        "the too-late grant took the permit"
    );
    tokio::time::sleep(ms(25)).await;
    cancel.cancel();
    let out = acquire.await.unwrap();
    assert!(
        !stalls.load(Ordering::SeqCst),
        "the attempt was never stalled"
    );
    assert!(out.is_none(), "not cancelled: {out:?}");
    // Reported cancelled: per DESIGN.md the clean-up (the give-back) is done by now.
    let left = available(&server, name);
    proxy.set_delay_dir(Direction::Up, Duration::ZERO);
    assert_eq!(
        left, 1,
        "the cancel was reported while the too-late grant's permit was still taken (the \
         give-back task is not collected by the cancel)"
    );
}

/// A semaphore acquire cancelled while its grant waits for the restart guard's primary check
/// (a Redis Cluster, `restart_guard` on) gives its permits back: no `Lock` exists yet to
/// release or renew them. Before, the attempt had already dropped its request, so its drop
/// returned nothing and the permits stayed taken for their whole lease (found by a review).
/// A hook holds the attempt at that check until the cancel has landed.
#[tokio::test(flavor = "multi_thread")]
async fn an_acquire_cancelled_during_the_primary_check_gives_its_permits_back() {
    let _serial = serial();
    let _hook = HookGuard;
    let cluster = ferrolock_testbed::RedisCluster::start_with(ferrolock_testbed::ClusterOptions {
        primaries: 1,
        ..Default::default()
    });
    let node = &cluster.nodes[0];
    let o = opts()
        .ttl(Duration::from_secs(60))
        .wait(Some(Duration::ZERO));
    let m = guarded_manager_once_up(node, cluster.url(), Duration::from_secs(1), o.clone()).await;
    let name = "sem-cancel-primary-check";
    let zset = timeout_key(name);
    let (reached, go) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    {
        let (reached, go) = (reached.clone(), go.clone());
        ferrolock::__set_test_hook(Some(Arc::new(move |point, _| {
            if point == HookPoint::SemaphoreConfirming && !reached.swap(true, Ordering::SeqCst) {
                hold_until(&go);
            }
        })));
    }
    let cancel = Cancel::new();
    let acquire = {
        let (m, o, cancel) = (m.clone(), o.clone(), cancel.clone());
        tokio::spawn(
            async move { until_cancelled(m.semaphore_with(name, 1, 1, &o), &cancel).await },
        )
    };
    let start = Instant::now();
    while !reached.load(Ordering::SeqCst) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no grant reached the primary check"
        );
        tokio::time::sleep(ms(5)).await;
    }
    assert_eq!(
        node.cmd::<i64>(&["ZCARD", &zset]),
        1,
        "the grant is on the node"
    );
    cancel.cancel();
    let outcome = acquire.await.unwrap();
    go.store(true, Ordering::SeqCst);
    assert!(
        outcome.is_none(),
        "the acquire finished before it was cancelled: {:?}",
        outcome.map(|r| r.map(|l| l.is_held()))
    );
    // A cancelled acquire reports once what it took is back.
    assert_eq!(
        node.cmd::<i64>(&["ZCARD", &zset]),
        0,
        "the cancelled acquire's grant was never given back (lease 60 s)"
    );
    let again = m.semaphore_with(name, 1, 1, &o).await.unwrap();
    assert!(again.release().await.unwrap());
}

/// Two waiters of one manager share its place in the queue and are both woken by the release
/// of the only permit: the first to land is granted (which takes the place out), the other is
/// refused (which queues the place again). Cancelled then, that waiter takes the place with
/// it. Before, the grant had marked the place gone, so the cancel left it first in line for a
/// whole queue lease, and every other manager's acquire waited for it with the permit free
/// (found by a review).
#[tokio::test]
async fn a_waiter_cancelled_after_its_neighbours_grant_leaves_no_queue_place() {
    let _s = serial();
    let server = RedisServer::start();
    let name = "sem:neighbour-granted";
    let queue = ferrolock::__wire::KeyNames::of(name).queue;
    let queued = || server.cmd::<i64>(&["ZCARD", &queue]);
    let long = Duration::from_secs(60);
    let holder_m = manager(&[server.url()], opts());
    let holder = holder_m
        .semaphore_with(name, 1, 1, &opts().ttl(long))
        .await
        .unwrap();
    let m = manager(&[server.url()], opts());
    let o = opts().retry_delay(long).ttl(long);
    let mut waiters: Vec<_> = (0..2)
        .map(|_| {
            let (m, o) = (m.clone(), o.clone());
            tokio::spawn(async move { m.semaphore_with(name, 1, 1, &o).await })
        })
        .collect();
    let end = Instant::now() + Duration::from_secs(30);
    while queued() != 1 {
        assert!(Instant::now() < end, "the waiters never queued");
        tokio::time::sleep(ms(10)).await;
    }
    tokio::time::sleep(ms(300)).await;
    assert!(waiters.iter().all(|w| !w.is_finished()));
    assert!(holder.release().await.unwrap());
    let end = Instant::now() + Duration::from_secs(30);
    let granted = loop {
        if let Some(i) = waiters.iter().position(|w| w.is_finished()) {
            break waiters.remove(i).await.unwrap().unwrap();
        }
        assert!(Instant::now() < end, "neither waiter was granted");
        tokio::time::sleep(ms(10)).await;
    };
    let refused = waiters.remove(0);
    // The fault: the other's refusal, after the grant, queued the place again.
    let end = Instant::now() + Duration::from_secs(30);
    while queued() != 1 {
        assert!(
            Instant::now() < end,
            "the other waiter's refusal never queued the place"
        );
        tokio::time::sleep(ms(10)).await;
    }
    assert!(!refused.is_finished());
    refused.abort();
    assert!(refused.await.unwrap_err().is_cancelled());
    let end = Instant::now() + Duration::from_secs(10);
    while queued() != 0 {
        assert!(
            Instant::now() < end,
            "the cancelled waiter's queue place is still there ({} queued)",
            queued()
        );
        tokio::time::sleep(ms(10)).await;
    }
    assert!(granted.release().await.unwrap());
    let other = manager(&[server.url()], opts());
    let lock = other
        .semaphore_with(name, 1, 1, &opts().wait(Some(Duration::ZERO)))
        .await
        .expect("a free permit with nobody waiting");
    assert!(lock.release().await.unwrap());
}

/// A waiter for 2 permits queued first is not passed by a waiter for 1 queued after it: once
/// both permits are free, the head takes them, and the later waiter waits for their release.
/// The permits are freed silently (no publish, as a lease that ends); the head's own re-check
/// is 120 s away, the later waiter's 200 ms: the later waiter's refusal ("not your turn",
/// with permits free for the head) tells the head. Before, the turn rule let rank r in with
/// `count + r` permits free (one for each waiter ahead), so the later waiter took one of the
/// two and the head, which needs both, waited on (a stream of such waiters starved it). Leases
/// of 120 s: none lapses during the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_single_permit_waiter_does_not_pass_a_two_permit_head() {
    later_waiter_for_fewer_waits_behind_the_head(false).await;
}

/// The same, both waiters in one manager: before, they shared one place in the line (a
/// process's waiters on a name had one server id), so the waiter for 1 took its turn as the
/// head's and passed it. Now a process's waiters queue apart by count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_single_permit_waiter_of_the_same_manager_does_not_pass_a_two_permit_head() {
    later_waiter_for_fewer_waits_behind_the_head(true).await;
}

async fn later_waiter_for_fewer_waits_behind_the_head(same_manager: bool) {
    let server = RedisServer::start();
    let name = "sem:starve";
    let long = Duration::from_secs(120);
    let queue = ferrolock::__wire::KeyNames::of(name).queue;
    let queued = || server.cmd::<i64>(&["ZCARD", &queue]);
    let holder_m = manager(&[server.url()], opts());
    let holder = holder_m
        .semaphore_with(name, 2, 2, &opts().ttl(long))
        .await
        .unwrap();
    let mh = manager(&[server.url()], opts());
    let mw = if same_manager {
        mh.clone()
    } else {
        manager(&[server.url()], opts())
    };
    let w_done = Arc::new(AtomicBool::new(false));
    let h = tokio::spawn(async move {
        mh.semaphore_with(name, 2, 2, &opts().ttl(long).retry_delay(long))
            .await
            .unwrap()
    });
    let end = Instant::now() + Duration::from_secs(30);
    while queued() < 1 {
        assert!(Instant::now() < end, "the 2-permit waiter never queued");
        tokio::time::sleep(ms(10)).await;
    }
    let w = tokio::spawn({
        let w_done = w_done.clone();
        async move {
            let lock = mw
                .semaphore_with(name, 2, 1, &opts().ttl(long).retry_delay(ms(200)))
                .await
                .unwrap();
            w_done.store(true, Ordering::SeqCst);
            lock
        }
    });
    while queued() < 2 {
        assert!(
            Instant::now() < end,
            "the 1-permit waiter never took a place of its own in the line, behind the head"
        );
        tokio::time::sleep(ms(10)).await;
    }
    // Freed behind everyone's back, in one step (no publish).
    let _: () = server.cmd(&[
        "EVAL",
        "redis.call('DEL', KEYS[2]); redis.call('SET', KEYS[1], '2')",
        "2",
        name,
        &timeout_key(name),
    ]);
    std::mem::forget(holder);
    let head = tokio::time::timeout(Duration::from_secs(60), h).await;
    assert!(
        head.is_ok(),
        "the 2-permit head still waits, both permits free or taken by the 1-permit waiter \
         queued after it (which holds one: {})",
        w_done.load(Ordering::SeqCst)
    );
    let head = head.unwrap().unwrap();
    assert!(!w_done.load(Ordering::SeqCst), "both waiters hold permits");
    assert_eq!(available(&server, name), 0);
    assert!(head.release().await.unwrap());
    let later = tokio::time::timeout(Duration::from_secs(60), w)
        .await
        .expect("the 1-permit waiter was never granted after the head's release")
        .unwrap();
    assert!(later.release().await.unwrap());
    assert_eq!(available(&server, name), 2);
    drop(holder_m);
}

/// A counter another client set to what Redis's INCRBY/DECRBY cannot take ('2e0', ' 2' and
/// '2.5' are numbers to Lua, not to Redis; one of 25 digits is out of range) or below zero
/// with nobody holding a permit is refused naming the semaphore and the value, not with Redis's
/// bare "value is not an integer" (or a raw `SEMAPHORE_SIZE` reply) and the node's URL. A
/// holder's release still gives its permits back, leaving such a counter alone.
#[tokio::test]
async fn a_counter_set_to_no_whole_number_or_below_zero_is_named() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts());
    let name = "sem:counter";
    let long = "9".repeat(25);
    for value in ["2e0", " 2", "2.5", "0x2", "02", "+2", long.as_str()] {
        let _: () = server.cmd(&["SET", name, value]);
        let e = m.semaphore(name, 2).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Redis, "{e}");
        assert_eq!(
            e.message(),
            format!(
                "semaphore \"{name}\": its counter holds {value:?}, not a whole number of free \
                 permits"
            ),
            "{e}"
        );
        assert_eq!(get(&server, name).as_deref(), Some(value), "changed");
    }
    let _: () = server.cmd(&["SET", name, "-1"]);
    let e = m.semaphore(name, 2).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Redis, "{e}");
    assert_eq!(
        e.message(),
        format!(
            "semaphore \"{name}\": its counter holds \"-1\" with 0 permits held, a pool below zero"
        ),
        "{e}"
    );
    let _: () = server.cmd(&["DEL", name]);
    let held = m.semaphore(name, 2).await.unwrap();
    for value in ["2.5", "abc"] {
        let _: () = server.cmd(&["SET", name, "1"]);
        let again = m.semaphore(name, 2).await.unwrap();
        let _: () = server.cmd(&["SET", name, value]);
        assert!(again.release().await.unwrap(), "{value:?}");
        assert_eq!(get(&server, name).as_deref(), Some(value), "changed");
    }
    let _: () = server.cmd(&["SET", name, "1"]);
    assert!(held.release().await.unwrap());
    assert_eq!(available(&server, name), 2);
    assert_eq!(held_ids(&server, name), 0);
}
