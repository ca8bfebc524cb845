//! Push wake-ups and the waiter queue: a waiter is woken by the release's publish (not by
//! polling), never misses a release between its failed attempt and its subscription or
//! during a reconnect, wakes at the holder's PTTL and within the retry bound when nothing is
//! published; 64 waiters in one process make one attempt per wake-up; a releasing process may
//! barge ahead of the queue head only while the head has waited less than the barging bound,
//! so a waiter is never starved; a worker in a loop releases quietly, and the waiter is told
//! once the loop stops; a crashed waiter's queue entry expires; a dropped waiter
//! unsubscribes and leaves the queue, also when its attempt reaches a node after the dequeue.
//! Serial: they measure (generous) bounds.

// Each #[tokio::test] runs its own runtime on its own thread, so holding the std mutex that
// serializes these tests across awaits blocks nothing but the test itself.
#![allow(clippy::await_holding_lock)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use ferrolock::{HookPoint, LockManager, LockOptions};
use ferrolock_testbed::{Cluster, Proxy, RedisServer};

const LONG: Duration = Duration::from_secs(60);
/// The core's barging bound on one node (`BARGE_BOUND_ONE_NODE` in wakeup.rs).
const BARGE_BOUND: Duration = Duration::from_millis(6);

/// The server's clock in ms, as the queue scripts read it.
fn server_ms(server: &RedisServer) -> u64 {
    let t: Vec<u64> = server.cmd(&["TIME"]);
    t[0] * 1000 + t[1] / 1000
}

/// Subscribers of a key's release channel: on Redisson's channel (reentrant locks) itself; for
/// a plain lock's `release_channel`, on the waiters' own channels (`<release channel>:<id>`).
async fn subscribers(server: &RedisServer, channel: &str) -> i64 {
    let channels: Vec<String> = if channel.starts_with("ferrolock:release:") {
        server.cmd(&["PUBSUB", "CHANNELS", &format!("{channel}:*")])
    } else {
        vec![channel.to_string()]
    };
    let mut args = vec!["PUBSUB", "NUMSUB"];
    args.extend(channels.iter().map(String::as_str));
    let counts: Vec<(String, i64)> = server.cmd(&args);
    counts.iter().map(|(_, n)| n).sum()
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out waiting until {what}"
        );
        tokio::time::sleep(ms(5)).await;
    }
}

async fn wait_for_subscribers(server: &RedisServer, channel: &str, n: i64) {
    let start = Instant::now();
    while subscribers(server, channel).await != n {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{channel}: never {n} subscribers"
        );
        tokio::time::sleep(ms(5)).await;
    }
}

/// Releases `held` while `waiter` still waits: the lock the waiter then gets, and how long
/// after the release it got it.
async fn release_to(
    held: ferrolock::Lock,
    waiter: tokio::task::JoinHandle<ferrolock::Result<ferrolock::Lock>>,
) -> (ferrolock::Lock, Duration) {
    assert!(
        !waiter.is_finished(),
        "the waiter got the lock before the release"
    );
    let released = Instant::now();
    held.release().await.unwrap();
    let lock = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("woken")
        .unwrap()
        .unwrap();
    (lock, released.elapsed())
}

/// A pub/sub connection subscribed to everything published on ferrolock's release channels.
async fn watch_releases(server: &RedisServer) -> redis::aio::PubSub {
    let mut watcher = redis::Client::open(server.url())
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    watcher.psubscribe("ferrolock:release:*").await.unwrap();
    watcher
}

/// Long ttl and long poll interval: anything quicker than the poll bound is a push wake-up.
fn slow_poll(retry: Duration) -> LockOptions {
    opts().ttl(LONG).retry_delay(retry)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_release_wakes_the_waiter_long_before_the_poll_bound() {
    let _serial = serial();
    for (nodes, reentrant) in [(1, false), (1, true), (3, false)] {
        let cluster = Cluster::start(nodes);
        let retry = LONG; // jittered: polls no sooner than 30 s apart
        let o = slow_poll(retry).reentrant(reentrant);
        let holder = manager(&cluster.urls(), o.clone());
        let waiter_m = manager(&cluster.urls(), o.clone());
        let key = "push";
        let channel = if reentrant {
            ferrolock::redisson_channel(key)
        } else {
            ferrolock::release_channel(key)
        };
        let held = holder.acquire(key).await.unwrap();
        let waiter = tokio::spawn(async move { waiter_m.acquire(key).await });
        for s in &cluster.servers {
            wait_for_subscribers(s, &channel, 1).await;
        }
        tokio::time::sleep(ms(50)).await; // past the post-subscription re-check
        let (lock, latency) = release_to(held, waiter).await;
        // A failure bound, not a speed assertion: a third of the shortest poll interval.
        assert!(
            latency < retry / 6,
            "{nodes} node(s), reentrant={reentrant}: took {latency:?}: the push path was not used"
        );
        eprintln!("{nodes} node(s), reentrant={reentrant}: release -> grant {latency:?}");
        lock.release().await.unwrap();
        // The waiter left: its subscription is gone.
        for s in &cluster.servers {
            wait_for_subscribers(s, &channel, 0).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_release_between_the_failed_attempt_and_the_subscription_is_not_missed() {
    let _serial = serial();
    let server = RedisServer::start();
    let o = slow_poll(LONG);
    let holder = manager(&[server.url()], o.clone());
    let waiter_m = manager(&[server.url()], o.clone());
    let held = Arc::new(tokio::sync::Mutex::new(Some(
        holder.acquire("race").await.unwrap(),
    )));
    let hook_ran = Arc::new(AtomicBool::new(false));
    let (h, ran) = (held.clone(), hook_ran.clone());
    // Exactly in the window: the waiter's first attempt has failed, it has not subscribed yet.
    waiter_m.__set_hook_before_subscribe(Some(Arc::new(move |_key: &str| {
        let (h, ran) = (h.clone(), ran.clone());
        Box::pin(async move {
            if let Some(lock) = h.lock().await.take() {
                assert!(lock.release().await.unwrap());
                ran.store(true, Ordering::SeqCst);
            }
        })
    })));
    let started = Instant::now();
    // Neither a publish (it happened before the subscription), nor the PTTL (60s), nor the
    // poll (30s or more) can wake it: only the re-check after the confirmed subscription.
    let lock = tokio::time::timeout(Duration::from_secs(10), waiter_m.acquire("race"))
        .await
        .expect("the release before the subscription was missed")
        .unwrap();
    assert!(hook_ran.load(Ordering::SeqCst), "the race was not forced");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(get(&server, "race").as_deref(), Some(lock.token()));
}

#[tokio::test(flavor = "multi_thread")]
async fn sixty_four_waiters_in_one_process_make_one_attempt_per_wake_up() {
    let _serial = serial();
    let server = RedisServer::start();
    let o = slow_poll(LONG);
    let holder = manager(&[server.url()], o.clone());
    let m = manager(&[server.url()], o.clone());
    let key = "herd";
    let held = holder.acquire(key).await.unwrap();
    // Warm: the connection is open (connect + script preload) and one attempt is counted.
    assert!(m.try_acquire(key).await.is_err());
    let base = m.round_trips()[0];
    let granted = Arc::new(AtomicUsize::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let mut waiters = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let (m, granted, inside) = (m.clone(), granted.clone(), inside.clone());
        waiters.spawn(async move {
            let lock = m.acquire(key).await.unwrap();
            assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
            granted.fetch_add(1, Ordering::SeqCst);
            inside.fetch_sub(1, Ordering::SeqCst);
            assert!(lock.release().await.unwrap());
        });
    }
    // Every waiter made its first attempt (64), the head re-checked once after the
    // subscription was confirmed (1, which queued it) and once when its barging bound
    // ended (1: a release within the bound may be quiet); then all is quiet: nobody polls.
    wait_for_subscribers(&server, &ferrolock::release_channel(key), 1).await;
    wait_until("64 first attempts and two re-checks", || {
        m.round_trips()[0] >= base + 66
    })
    .await;
    tokio::time::sleep(ms(300)).await;
    let before = m.round_trips()[0];
    assert_eq!(
        before,
        base + 64 + 2,
        "64 first attempts + 2 re-checks, then quiet"
    );
    held.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), waiters.join_all())
        .await
        .expect("all 64 waiters get the lock");
    assert_eq!(granted.load(Ordering::SeqCst), 64);
    let trips = m.round_trips()[0] - before;
    // 64 wake-ups (one publish per release): one attempt and one release per waiter, plus
    // at most a few for the queue cleanup. A herd would be 64 + 63 + ... attempts.
    eprintln!("64 waiters: {trips} round trips for 64 wake-ups");
    assert!(
        trips <= 64 * 2 + 4,
        "{trips} round trips: more than one attempt per wake-up"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_release_that_publishes_nothing_is_noticed_within_the_retry_bound() {
    let _serial = serial();
    let server = RedisServer::start();
    let retry = ms(300);
    let holder = manager(&[server.url()], slow_poll(retry));
    let waiter_m = manager(&[server.url()], slow_poll(retry));
    let held = holder.acquire("quiet").await.unwrap();
    let waiter = tokio::spawn(async move { waiter_m.acquire("quiet").await });
    wait_for_subscribers(&server, &ferrolock::release_channel("quiet"), 1).await;
    tokio::time::sleep(ms(100)).await;
    // A client that does not publish (redis-py's Lock releases with a plain compare-and-DEL).
    server.cmd::<i64>(&["DEL", "quiet"]);
    // The poll bound is 1.5 × retry_delay (450 ms) plus a round trip; the failure bound is
    // far from it and far below the PTTL (60 s), the other thing that could wake the waiter.
    let lock = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the quiet release was never noticed")
        .unwrap()
        .unwrap();
    assert_eq!(get(&server, "quiet").as_deref(), Some(lock.token()));
    drop(held);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_waiter_wakes_at_the_holders_pttl_when_the_lock_expires() {
    let _serial = serial();
    let server = RedisServer::start();
    // A holder that dies: its key simply expires, and nothing is published.
    let set_at = Instant::now();
    server.cmd::<()>(&["SET", "expiring", "crashed-holder", "PX", "800"]);
    let m = manager(&[server.url()], slow_poll(LONG));
    // Failure bound: the poll (30 s or more) is the only other wake-up.
    let lock = tokio::time::timeout(Duration::from_secs(10), m.acquire("expiring"))
        .await
        .expect("not woken at the PTTL")
        .unwrap();
    // The key was set after `set_at`, so the grant (after its expiry) is 800 ms after it at
    // least, however slow the machine (a little slack for the server's ms clock).
    let took = set_at.elapsed();
    assert!(took >= ms(795), "acquired before the expiry: {took:?}");
    assert_eq!(get(&server, "expiring").as_deref(), Some(lock.token()));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_pubsub_connection_is_resubscribed_and_the_waiter_re_checks() {
    let _serial = serial();
    let server = RedisServer::start();
    let o = slow_poll(LONG);
    let holder = manager(&[server.url()], o.clone());
    let waiter_m = manager(&[server.url()], o.clone());
    let channel = ferrolock::release_channel("reconnect");
    let held = holder.acquire("reconnect").await.unwrap();
    let waiter = tokio::spawn(async move { waiter_m.acquire("reconnect").await });
    wait_for_subscribers(&server, &channel, 1).await;
    // The subscription connection dies, and the release happens while nobody listens: its
    // publish is lost. Only the re-check after the resubscription can notice it.
    let killed: i64 = server.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    assert_eq!(killed, 1);
    assert_eq!(subscribers(&server, &channel).await, 0);
    held.release().await.unwrap();
    let lock = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the release during the reconnect was missed")
        .unwrap()
        .unwrap();
    assert_eq!(get(&server, "reconnect").as_deref(), Some(lock.token()));
}

/// The pub/sub connection of a waiting process, as the server sees it.
fn pubsub_clients(server: &RedisServer) -> Vec<String> {
    let list: String = server.cmd(&["CLIENT", "LIST", "TYPE", "pubsub"]);
    list.lines()
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .map(str::to_string)
        .collect()
}

/// A waiter's pub/sub link that goes silent without closing (every byte dropped, as on a
/// half-open connection to a host that vanished) is noticed by a ping with no answer and
/// replaced once the network is back: the new connection resubscribes, and the waiter
/// re-checks (`a_lost_pubsub_connection_is_resubscribed_and_the_waiter_re_checks`). Before,
/// nothing noticed it: every release published meanwhile was lost, and the old link stayed
/// (found by a review). Silent for 5 s: longer than the ping's period (1 s) and its timeout
/// (2 s) however slow the machine.
#[tokio::test(flavor = "multi_thread")]
async fn a_silent_pubsub_link_is_noticed_and_replaced() {
    let _serial = serial();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let o = slow_poll(LONG);
    let key = "silent-pubsub";
    let holder = manager(&[server.url()], o.clone());
    let waiter_m = manager(&[proxy.url()], o);
    let channel = ferrolock::release_channel(key);
    let _held = holder.acquire(key).await.unwrap();
    let waiter = tokio::spawn(async move { waiter_m.acquire(key).await });
    wait_for_subscribers(&server, &channel, 1).await;
    let before = pubsub_clients(&server);
    assert_eq!(before.len(), 1, "{before:?}");
    proxy.blackhole();
    tokio::time::sleep(Duration::from_secs(5)).await;
    proxy.heal();
    wait_until("a new pub/sub connection", || {
        let now = pubsub_clients(&server);
        !now.is_empty() && now != before
    })
    .await;
    wait_for_subscribers(&server, &channel, 1).await;
    waiter.abort();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_releasing_process_cannot_barge_ahead_of_a_waiter_queued_past_the_bound() {
    let _serial = serial();
    let server = RedisServer::start();
    let o = slow_poll(Duration::from_secs(5));
    let a = manager(&[server.url()], o.clone());
    let b = manager(&[server.url()], o.clone());
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    for round in 0..5 {
        let key = format!("barge:{round}");
        let held = a.acquire(&key).await.unwrap();
        let (b2, k2, order2) = (b.clone(), key.clone(), order.clone());
        let waiter = tokio::spawn(async move {
            let lock = b2.acquire(&k2).await.unwrap();
            order2.lock().unwrap().push(format!("b{round}"));
            tokio::time::sleep(ms(20)).await;
            lock.release().await.unwrap();
        });
        // B is queued on the server: the head has attempted with its queue id.
        wait_until("b is queued", || {
            server.cmd::<i64>(&["ZCARD", &ferrolock::queue_key(&key)]) == 1
        })
        .await;
        // B has now been queued for longer than the barging bound.
        tokio::time::sleep(BARGE_BOUND + ms(30)).await;
        // A releases and immediately wants the lock again: it goes behind B.
        held.release().await.unwrap();
        let again = a.acquire(&key).await.unwrap();
        order.lock().unwrap().push(format!("a{round}"));
        again.release().await.unwrap();
        waiter.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    let expected: Vec<String> = (0..5)
        .flat_map(|r| [format!("b{r}"), format!("a{r}")])
        .collect();
    assert_eq!(order, expected, "the releasing process barged in");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_free_lock_may_be_barged_only_while_the_head_has_waited_less_than_the_bound() {
    let _serial = serial();
    let server = RedisServer::start();
    let key = "bounded-barging";
    let (q, l) = (ferrolock::queue_key(key), ferrolock::queue_lease_key(key));
    let s = format!("ferrolock:queue-since:{{{key}}}");
    let m = manager(&[server.url()], slow_poll(LONG));
    // Past the uncontended fast path: m has met a busy lock on the key.
    let holder = manager(&[server.url()], slow_poll(LONG));
    let held = holder.acquire(key).await.unwrap();
    assert!(m.try_acquire(key).await.is_err());
    held.release().await.unwrap();
    // Another waiter heads the queue (lease 60s); the lock is free.
    let queue_head = |joined_ago: i64| {
        let now = server_ms(&server) as i64;
        server.cmd::<i64>(&["ZADD", &q, "1", "head"]);
        server.cmd::<i64>(&["ZADD", &l, &(now + 60_000).to_string(), "head"]);
        server.cmd::<i64>(&["ZADD", &s, &(now - joined_ago).to_string(), "head"]);
        for k in [&q, &l, &s] {
            server.cmd::<i64>(&["PEXPIRE", k, "60000"]);
        }
    };
    // Inside the bound however slow this machine is: the head "joins" a minute from now (the
    // bound is measured as now - join time, on the server's clock).
    queue_head(-60_000);
    let lock = m
        .try_acquire(key)
        .await
        .expect("not barged while the head was inside the bound");
    assert_eq!(get(&server, key).as_deref(), Some(lock.token()));
    lock.release().await.unwrap();
    // The head is still first in line: barging does not dequeue it.
    assert_eq!(server.cmd::<Option<i64>>(&["ZSCORE", &q, "head"]), Some(1));
    // Queued for longer than the bound: only the head may take the free lock.
    queue_head(BARGE_BOUND.as_millis() as i64 + 1);
    let err = m.try_acquire(key).await.unwrap_err();
    assert_eq!(err.kind(), ferrolock::ErrorKind::NotAcquired, "{err}");
    assert_eq!(get(&server, key), None);
}

#[tokio::test(flavor = "multi_thread")]
async fn waiters_are_not_starved_by_a_process_that_re_acquires_in_a_tight_loop() {
    let _serial = serial();
    let server = RedisServer::start();
    let key = "tight-loop";
    let o = slow_poll(Duration::from_secs(5));
    let greedy = manager(&[server.url()], o.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let inside = Arc::new(AtomicUsize::new(0));
    let (stop2, inside2) = (stop.clone(), inside.clone());
    // Releases and asks again at once, for ever: without a bound on barging it would win
    // every race it can (its attempt lands one round trip after its release, a waiter's
    // after a pub/sub delivery).
    let looping = tokio::spawn(async move {
        let mut sections = 0u64;
        while !stop2.load(Ordering::SeqCst) {
            let lock = greedy.acquire(key).await.unwrap();
            assert_eq!(inside2.fetch_add(1, Ordering::SeqCst), 0, "two holders");
            inside2.fetch_sub(1, Ordering::SeqCst);
            lock.release().await.unwrap();
            sections += 1;
        }
        sections
    });
    tokio::time::sleep(ms(50)).await;
    // Two waiting processes, so that one of them is often queued behind the other (and must
    // be told when its turn comes: it skips release publishes meanwhile).
    let mut waiters = tokio::task::JoinSet::new();
    for _ in 0..2 {
        let (m, inside) = (manager(&[server.url()], o.clone()), inside.clone());
        waiters.spawn(async move {
            let started = Instant::now();
            let mut waits = Vec::new();
            while started.elapsed() < Duration::from_secs(1) {
                let asked = Instant::now();
                let lock = m.acquire(key).await.unwrap();
                waits.push(asked.elapsed());
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                tokio::time::sleep(ms(1)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                lock.release().await.unwrap();
            }
            waits
        });
    }
    let all: Vec<Vec<Duration>> = waiters.join_all().await;
    stop.store(true, Ordering::SeqCst);
    let sections = looping.await.unwrap();
    for waits in &all {
        let worst = waits.iter().max().copied().unwrap_or_default();
        eprintln!(
            "{} grants to a waiter, {sections} to the looping process; worst wait {worst:?}",
            waits.len()
        );
        // A failure bound, not a speed assertion: a starved waiter waits until the loop stops
        // (only once both waiters are done) or until its own poll finds the lock free (2.5 s
        // at the soonest with retry_delay 5 s). The healthy worst wait, the barging bound plus
        // a hand-off per waiter ahead, is a property of the machine (`make bench` reports it).
        assert!(
            worst < Duration::from_secs(2),
            "a waiter waited {worst:?} while another process re-acquired in a loop"
        );
    }
    assert!(sections > 0, "the looping process never got the lock");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crashed_waiters_queue_entry_expires_with_its_lease() {
    let _serial = serial();
    let server = RedisServer::start();
    let key = "ghost";
    // A waiter that queued and then crashed: first in line, lease ending in 1.5s. The lock
    // itself is free.
    let t: Vec<u64> = server.cmd(&["TIME"]);
    let now_ms = t[0] * 1000 + t[1] / 1000;
    let (q, l) = (ferrolock::queue_key(key), ferrolock::queue_lease_key(key));
    server.cmd::<i64>(&["ZADD", &q, "1", "ghost-waiter"]);
    server.cmd::<i64>(&["ZADD", &l, &(now_ms + 1_500).to_string(), "ghost-waiter"]);
    server.cmd::<i64>(&["PEXPIRE", &q, "60000"]);
    server.cmd::<i64>(&["PEXPIRE", &l, "60000"]);
    let m = manager(&[server.url()], slow_poll(LONG));
    // A manager's first attempt on a key it never saw contended is a plain SET NX (the
    // uncontended fast path); once it has met a busy lock there, it respects the queue.
    let holder = manager(&[server.url()], slow_poll(LONG));
    let held = holder.acquire(key).await.unwrap();
    assert!(m.try_acquire(key).await.is_err());
    held.release().await.unwrap();
    let err = m.try_acquire(key).await.unwrap_err();
    assert_eq!(err.kind(), ferrolock::ErrorKind::NotAcquired, "{err}");
    let started = Instant::now();
    let lock = tokio::time::timeout(Duration::from_secs(10), m.acquire(key))
        .await
        .expect("a crashed waiter blocked the queue for good")
        .unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_eq!(get(&server, key).as_deref(), Some(lock.token()));
    assert_eq!(
        server.cmd::<Option<i64>>(&["ZSCORE", &q, "ghost-waiter"]),
        None,
        "pruned"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_waiter_unsubscribes_and_leaves_the_queue() {
    let _serial = serial();
    let server = RedisServer::start();
    let o = slow_poll(LONG);
    let holder = manager(&[server.url()], o.clone());
    let m: LockManager = manager(&[server.url()], o.clone());
    let _held = holder.acquire("dropped-waiter").await.unwrap();
    let channel = ferrolock::release_channel("dropped-waiter");
    let q = ferrolock::queue_key("dropped-waiter");
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let m = m.clone();
            tokio::spawn(async move { m.acquire("dropped-waiter").await })
        })
        .collect();
    wait_for_subscribers(&server, &channel, 1).await;
    wait_until("queued", || server.cmd::<i64>(&["ZCARD", &q]) == 1).await;
    // Dropping one waiter (the head, maybe) keeps the others queued and subscribed.
    let mut waiters = waiters.into_iter();
    let first = waiters.next().unwrap();
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    tokio::time::sleep(ms(200)).await;
    assert_eq!(subscribers(&server, &channel).await, 1);
    for w in waiters {
        w.abort();
        assert!(w.await.unwrap_err().is_cancelled());
    }
    wait_for_subscribers(&server, &channel, 0).await;
    wait_until("dequeued", || server.cmd::<i64>(&["EXISTS", &q]) == 0).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn waiting_again_soon_reuses_the_subscription_and_is_woken_by_the_release() {
    let _serial = serial();
    let server = RedisServer::start();
    let retry = LONG; // jittered: polls no sooner than 30 s apart
    let o = slow_poll(retry);
    let holder = manager(&[server.url()], o.clone());
    let waiter_m = manager(&[server.url()], o.clone());
    let channel = ferrolock::release_channel("again");

    // A first wait subscribes; the waiter leaves with the lock and releases it.
    let held = holder.acquire("again").await.unwrap();
    let w = waiter_m.clone();
    let waiter = tokio::spawn(async move { w.acquire("again").await });
    wait_for_subscribers(&server, &channel, 1).await;
    tokio::time::sleep(ms(50)).await;
    held.release().await.unwrap();
    let lock = waiter.await.unwrap().unwrap();
    lock.release().await.unwrap();
    let subscribes = calls(&server, "subscribe");
    assert_eq!(
        subscribers(&server, &channel).await,
        1,
        "the subscription should linger after a wait that ended with the lock"
    );

    // Waiting again at once: the first attempt already queues (only the queue head's
    // process hears a release), with no new subscription.
    let held = holder.acquire("again").await.unwrap();
    let w = waiter_m.clone();
    let waiter = tokio::spawn(async move { w.acquire("again").await });
    wait_until("the waiter is queued", || {
        server.cmd::<i64>(&["ZCARD", &ferrolock::queue_key("again")]) == 1
    })
    .await;
    tokio::time::sleep(ms(50)).await;
    let (lock, latency) = release_to(held, waiter).await;
    // A failure bound: a third of the shortest poll interval.
    assert!(
        latency < retry / 6,
        "took {latency:?}: the release did not wake the lingering waiter"
    );
    assert_eq!(get(&server, "again").as_deref(), Some(lock.token()));
    assert_eq!(
        calls(&server, "subscribe"),
        subscribes,
        "the second wait subscribed again instead of reusing the lingering subscription"
    );
    lock.release().await.unwrap();
    // The linger ends by itself.
    wait_for_subscribers(&server, &channel, 0).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_release_tells_only_the_queue_heads_process() {
    let _serial = serial();
    let server = RedisServer::start();
    let key = "targeted";
    let o = slow_poll(Duration::from_secs(10));
    let holder = manager(&[server.url()], o.clone());
    let held = holder.acquire(key).await.unwrap();
    // Two waiting processes: the first is the queue head, the second queued behind it.
    let mut waiters = Vec::new();
    for n in 1..=2 {
        let m = manager(&[server.url()], o.clone());
        waiters.push(tokio::spawn(async move { m.acquire(key).await }));
        wait_until("the waiter is queued", || {
            server.cmd::<i64>(&["ZCARD", &ferrolock::queue_key(key)]) == n
        })
        .await;
    }
    let queue: Vec<String> = server.cmd(&["ZRANGE", &ferrolock::queue_key(key), "0", "-1"]);
    let head_channel = ferrolock::waiter_channel(key, &queue[0]);

    // Everything published on any ferrolock channel from now on.
    let mut watcher = watch_releases(&server).await;
    let mut messages = watcher.on_message();

    held.release().await.unwrap();
    let first = tokio::time::timeout(
        Duration::from_secs(5),
        futures::StreamExt::next(&mut messages),
    )
    .await
    .expect("the release published nothing")
    .unwrap();
    assert_eq!(first.get_channel_name(), head_channel);
    assert_eq!(first.get_payload_bytes(), b"0");
    // Nothing for the second waiter: its process is not woken.
    let more = tokio::time::timeout(ms(200), futures::StreamExt::next(&mut messages)).await;
    assert!(
        more.is_err(),
        "a second message: {:?}",
        more.map(|m| m.map(|m| m.get_channel_name().to_string()))
    );
    drop(messages);

    // The head got the lock; after its release the second waiter is told in turn.
    for w in waiters {
        let lock = tokio::time::timeout(Duration::from_secs(5), w)
            .await
            .expect("a waiter was not woken")
            .unwrap()
            .unwrap();
        lock.release().await.unwrap();
    }
}

/// A loop on one node, set up for the quiet-streak tests: `h` has met contention on `key` and
/// holds a grant of a loop (it asked right after releasing); `w` waits, queued, past its first
/// attempts and its re-check at the end of its bound (so it sleeps until told: its own re-checks
/// are 5 s apart at the soonest), and stays within its barging bound for a minute (joined in the
/// future), so that h's releases may be quiet however slow this machine is.
struct QuietLoop {
    h: LockManager,
    w: LockManager,
    lock: ferrolock::Lock,
    waiter: tokio::task::JoinHandle<ferrolock::Lock>,
    /// w's queue id, and its entry in the join times.
    w_id: String,
    since_key: String,
    /// w's round trips once settled.
    settled: u64,
}

async fn quiet_loop(server: &RedisServer, key: &'static str) -> QuietLoop {
    let o = slow_poll(Duration::from_secs(10));
    let h = manager(&[server.url()], o.clone());
    let w = manager(&[server.url()], o.clone());
    let x = manager(&[server.url()], o.clone());
    let held = x.acquire(key).await.unwrap();
    assert!(h.try_acquire(key).await.is_err());
    held.release().await.unwrap();
    h.acquire(key).await.unwrap().release().await.unwrap();
    let lock = h.acquire(key).await.unwrap();

    let base = w.round_trips()[0];
    let waiter = tokio::spawn({
        let w = w.clone();
        async move { w.acquire(key).await.unwrap() }
    });
    wait_until("w queued and re-checked at the end of its bound", || {
        w.round_trips()[0] >= base + 3
    })
    .await;
    tokio::time::sleep(BARGE_BOUND * 5).await;
    let ids: Vec<String> = server.cmd(&["ZRANGE", &ferrolock::queue_key(key), "0", "-1"]);
    assert_eq!(ids.len(), 1, "{ids:?}");
    let since_key = format!("ferrolock:queue-since:{{{key}}}");
    let later = (server_ms(server) + 60_000).to_string();
    server.cmd::<i64>(&["ZADD", &since_key, "XX", &later, &ids[0]]);
    let settled = w.round_trips()[0];
    QuietLoop {
        h,
        w,
        lock,
        waiter,
        w_id: ids[0].clone(),
        since_key,
        settled,
    }
}

/// What was published, as (channel, message), until nothing more comes for 200 ms.
async fn drain(
    messages: &mut (impl futures::Stream<Item = redis::Msg> + Unpin),
) -> Vec<(String, String)> {
    let mut seen = Vec::new();
    while let Ok(Some(m)) = tokio::time::timeout(ms(200), futures::StreamExt::next(messages)).await
    {
        seen.push((
            m.get_channel_name().to_string(),
            String::from_utf8_lossy(m.get_payload_bytes()).to_string(),
        ));
    }
    seen
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_in_a_loop_releases_quietly_and_tells_the_waiter_when_it_flushes() {
    let _serial = serial();
    let server = RedisServer::start();
    // The last release of h's loop must be quiet (h asked again within the grace, 1 ms) for
    // the flush to have something to do; on a loaded machine it may not be: another round.
    for round in 0..5 {
        let key: &'static str = Box::leak(format!("quiet-streak:{round}").into_boxed_str());
        let QuietLoop {
            h,
            w,
            mut lock,
            mut waiter,
            w_id,
            settled,
            ..
        } = quiet_loop(&server, key).await;
        let w_channel = ferrolock::waiter_channel(key, &w_id);
        let mut watcher = watch_releases(&server).await;
        let mut messages = watcher.on_message();

        assert_eq!(
            w.round_trips()[0],
            settled,
            "w re-checked again: it was woken"
        );
        let short = slow_poll(Duration::from_secs(10)).wait(Some(Duration::from_secs(2)));
        let releases = 20;
        let mut lost = None;
        for i in 0..releases {
            lock.release().await.unwrap();
            match h.acquire_with(key, &short).await {
                Ok(l) => lock = l,
                Err(e) => {
                    lost = Some(format!("release {i} of the loop lost the lock to w: {e}"));
                    break;
                }
            }
        }
        if let Some(why) = lost {
            // A loud release (h asked again too late to count as a loop) woke w, which took
            // its turn.
            eprintln!("round {round}: {why}");
            let got = tokio::time::timeout(Duration::from_secs(3), waiter).await;
            got.expect("w neither had the lock nor got it")
                .unwrap()
                .release()
                .await
                .unwrap();
            continue;
        }
        lock.release().await.unwrap();
        // h's loop ended. Nothing tells w until h's manager flushes (its own re-checks are
        // seconds away): then w takes the lock at once.
        if let Ok(got) = tokio::time::timeout(ms(300), &mut waiter).await {
            // Only a loud last release (h asked again too late to count as a loop) tells w.
            got.unwrap().release().await.unwrap();
            let seen = drain(&mut messages).await;
            eprintln!("round {round}: w got the lock before any flush: {seen:?}");
            continue;
        }
        let stopped = Instant::now();
        h.flush_quiet_releases().await;
        let got = tokio::time::timeout(Duration::from_secs(3), waiter)
            .await
            .expect("w was not told after the flush")
            .unwrap();
        eprintln!("w got the lock {:?} after the flush", stopped.elapsed());
        got.release().await.unwrap();

        let seen = drain(&mut messages).await;
        let released = seen.iter().filter(|(_, p)| p == "0").count();
        assert!(
            released < releases / 2,
            "{released} of {} releases of a loop woke the waiter: {seen:?}",
            releases + 1
        );
        if seen
            .last()
            .is_some_and(|(c, p)| c == &w_channel && p == "0")
        {
            eprintln!("round {round}: the loop's last release was loud: {seen:?}");
            continue;
        }
        assert!(
            seen.iter().any(|(c, p)| c == &w_channel && p == "?"),
            "the looping manager never told the waiter that it left: {seen:?}"
        );
        return;
    }
    panic!("in 5 rounds the loop's last release was never quiet");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_looping_worker_back_too_late_tells_the_head_it_found_the_lock_free() {
    let _serial = serial();
    let server = RedisServer::start();
    // h must loop within the grace (1 ms) for its release to be quiet and its manager to stay
    // silent; on a loaded machine it may not, which proves nothing here: another round.
    for round in 0..10 {
        let key: &'static str = Box::leak(format!("quiet-late:{round}").into_boxed_str());
        let QuietLoop {
            h,
            lock,
            waiter,
            w_id,
            since_key,
            ..
        } = quiet_loop(&server, key).await;
        let w_channel = ferrolock::waiter_channel(key, &w_id);
        let mut watcher = watch_releases(&server).await;
        let mut messages = watcher.on_message();
        // w within its bound: h's release is quiet ...
        lock.release().await.unwrap();
        // ... and then w's bound is long over (as if h came back late): h's next attempt,
        // right away, is refused on a free lock.
        let long_ago = (server_ms(&server) - 60_000).to_string();
        server.cmd::<i64>(&["ZADD", &since_key, "XX", &long_ago, &w_id]);
        let err = h.try_acquire(key).await.unwrap_err();
        assert_eq!(err.kind(), ferrolock::ErrorKind::NotAcquired, "{err}");
        // Only that refused attempt can tell w now: its own re-checks are seconds away.
        let mut waiter = waiter;
        let got = match tokio::time::timeout(Duration::from_secs(3), &mut waiter).await {
            Ok(got) => got.unwrap(),
            Err(_) => {
                // On a loaded machine h may not act within the grace (1 ms) that makes its
                // release quiet and its next attempt the loop's late return; then nothing
                // tells w here (its re-check is a minute away): another round. A refused
                // attempt that never tells would fail every round.
                let seen = drain(&mut messages).await;
                eprintln!("round {round}: w was not told; h was too slow? {seen:?}");
                waiter.abort();
                continue;
            }
        };
        got.release().await.unwrap();
        let seen = drain(&mut messages).await;
        if seen
            .iter()
            .any(|(c, p)| c == &w_channel && (p == "?" || p == "0"))
        {
            // h's release was loud (its acquire came too late to count as a loop).
            eprintln!("round {round}: w was told by something else: {seen:?}");
            continue;
        }
        assert!(
            seen.iter().any(|(c, p)| c == &w_channel && p == "q"),
            "the refused attempt told nobody: {seen:?}"
        );
        return;
    }
    panic!("in 10 rounds h never looped within the grace");
}

/// The cancel-in-flight tests' set-up: `n` nodes, `key` held (`LONG`) by another manager,
/// and the waiters' manager, whose held requests are still sent when let go (their deadline
/// is the node timeout) and whose place left behind cannot lapse before a test looks (the
/// queue lease is 3 × retry + 4 × node timeout: 70 s).
struct HeldKey {
    cluster: Cluster,
    key: &'static str,
    held: ferrolock::Lock,
    _holder: LockManager,
    waiters: LockManager,
}

impl HeldKey {
    async fn start(n: usize, key: &'static str) -> HeldKey {
        let cluster = Cluster::start(n);
        let holder = manager(&cluster.urls(), opts().ttl(LONG));
        let held = holder.acquire(key).await.unwrap();
        let o = slow_poll(Duration::from_secs(10))
            .ttl(Duration::from_secs(200))
            .node_timeout(Duration::from_secs(10));
        let waiters = manager(&cluster.urls(), o);
        HeldKey {
            cluster,
            key,
            held,
            _holder: holder,
            waiters,
        }
    }

    /// A waiter of the waiters' manager, in a task (aborted to cancel it).
    fn waiter(&self) -> tokio::task::JoinHandle<ferrolock::Result<ferrolock::Lock>> {
        let (m, key) = (self.waiters.clone(), self.key);
        tokio::spawn(async move { m.acquire(key).await })
    }

    fn all_queued(&self, n: i64) -> bool {
        let queue = ferrolock::queue_key(self.key);
        self.cluster
            .servers
            .iter()
            .all(|s| s.cmd::<i64>(&["ZCARD", &queue]) == n)
    }

    fn script_calls(&self) -> Vec<u64> {
        let servers = self.cluster.servers.iter();
        servers
            .map(|s| calls(s, "evalsha") + calls(s, "eval"))
            .collect()
    }

    /// Whether every node has run a script since `before`.
    fn ran_since(&self, before: &[u64]) -> bool {
        self.script_calls()
            .iter()
            .zip(before)
            .all(|(now, b)| now > b)
    }

    /// Tells the queue head it may be free (as a release does): it attempts again.
    fn wake_the_head(&self) {
        let server = &self.cluster.servers[0];
        let head: Vec<String> = server.cmd(&["ZRANGE", &ferrolock::queue_key(self.key), "0", "0"]);
        let _: i64 = server.cmd(&[
            "PUBLISH",
            &ferrolock::waiter_channel(self.key, &head[0]),
            "0",
        ]);
    }
}

/// A waiter cancelled while its attempt's requests wait to be sent (held here by a test hook;
/// in life, a request not yet written, or a blocking caller's on its own connection): the
/// acquire's dequeue reaches every node first, then the requests run, are refused and queue
/// the place again. Nothing of the cancelled waiter may stay queued: it would be the head,
/// and hold up first tries past the barging bound for a whole queue lease.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_waiters_requests_sent_after_its_dequeue_leave_no_place() {
    let _serial = serial();
    let _hook = HookGuard;
    let t = HeldKey::start(3, "cancelled-in-flight").await;
    let waiter = t.waiter();
    wait_until("the waiter is queued on every node", || t.all_queued(1)).await;
    let (entered, go) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    ferrolock::__set_test_hook(Some(Arc::new({
        let (entered, go, key) = (entered.clone(), go.clone(), t.key);
        move |point, k| {
            if point == HookPoint::QueuedSending && k == key {
                entered.fetch_add(1, Ordering::SeqCst);
                hold_until(&go);
            }
        }
    })));
    t.wake_the_head();
    wait_until("the attempt's three requests are held", || {
        entered.load(Ordering::SeqCst) == 3
    })
    .await;
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    // The fault: the place is gone from every node before the requests are sent.
    wait_until("the cancelled waiter's place is taken out", || {
        t.all_queued(0)
    })
    .await;
    let before = t.script_calls();
    go.store(true, Ordering::SeqCst);
    wait_until("the held requests ran on every node", || {
        t.ran_since(&before)
    })
    .await;
    wait_until("nothing of the cancelled waiter is queued", || {
        t.all_queued(0)
    })
    .await;
    assert!(t.held.is_held());
    assert!(t.held.release().await.unwrap());
}

/// Two waiters of one manager share its place in the server queue. The first is cancelled
/// with its attempt unsent; the second, given the turn, is granted everywhere (two nodes: the
/// grant is decided only once both said yes, and takes the place out of both) and held just
/// before its acquire returns; then the first's attempt lands, is refused and queues the
/// place again. The second leaves with the lock, and would keep its queue subscribed without
/// a dequeue: the place the first put back must go with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_place_queued_again_after_a_neighbours_grant_goes_when_it_leaves() {
    let _serial = serial();
    let _hook = HookGuard;
    let t = HeldKey::start(2, "stray-after-grant").await;
    let first = t.waiter();
    wait_until("the first waiter is queued on every node", || {
        t.all_queued(1)
    })
    .await;
    let second = t.waiter();
    // Behind the first in the manager's own queue (nothing of it shows on the server).
    tokio::time::sleep(ms(300)).await;
    let flag = || Arc::new(AtomicBool::new(false));
    let (sending, go_send, answered, go_answer) =
        (Arc::new(AtomicUsize::new(0)), flag(), flag(), flag());
    ferrolock::__set_test_hook(Some(Arc::new({
        let (sending, go_send, answered, go_answer) = (
            sending.clone(),
            go_send.clone(),
            answered.clone(),
            go_answer.clone(),
        );
        let key = t.key;
        move |point, k| {
            if k != key {
                return;
            }
            match point {
                // The first attempt after the hook is set: the first waiter's two requests.
                HookPoint::QueuedSending if sending.fetch_add(1, Ordering::SeqCst) < 2 => {
                    hold_until(&go_send)
                }
                // The second waiter's grant, before its acquire returns.
                HookPoint::Answered
                    if !go_send.load(Ordering::SeqCst)
                        && !answered.swap(true, Ordering::SeqCst) =>
                {
                    hold_until(&go_answer)
                }
                _ => {}
            }
        }
    })));
    t.wake_the_head();
    wait_until("the first waiter's requests are held", || {
        sending.load(Ordering::SeqCst) == 2
    })
    .await;
    assert!(t.held.release().await.unwrap());
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    wait_until("the second waiter is granted, and held", || {
        answered.load(Ordering::SeqCst)
    })
    .await;
    assert!(t.all_queued(0), "the grant took the place out");
    let before = t.script_calls();
    go_send.store(true, Ordering::SeqCst);
    // The fault: refused (the second holds it), the first's attempt queues the place again.
    wait_until("the first waiter's attempt queued the place again", || {
        t.ran_since(&before) && t.all_queued(1)
    })
    .await;
    // Its task looks at the queue once the answers are in. (Should it look only after the
    // second has left, it takes the place out itself: a slow machine passes this another
    // way, never fails it wrongly.)
    tokio::time::sleep(ms(300)).await;
    go_answer.store(true, Ordering::SeqCst);
    let lock = second.await.unwrap().unwrap();
    wait_until("the place queued again is taken out", || t.all_queued(0)).await;
    assert!(lock.release().await.unwrap());
}

/// The head leaves (cancelled) a lock that was freed without a word: the next waiter is told
/// and gets it, for a plain lock (on its own channel) and a reentrant one (Redisson's unlock
/// message on Redisson's channel, where all its waiters listen). Before, a reentrant lock's
/// dequeue published nothing, and the next waiter slept until its timer (found by a review:
/// the head woken by a release and cancelled before its attempt landed).
#[tokio::test(flavor = "multi_thread")]
async fn the_next_waiter_is_told_when_the_head_leaves_a_free_lock() {
    let _serial = serial();
    for reentrant in [false, true] {
        let server = RedisServer::start();
        let key = if reentrant {
            "head-leaves-r"
        } else {
            "head-leaves"
        };
        let o = slow_poll(LONG).reentrant(reentrant);
        let holder = manager(&[server.url()], o.clone());
        let (a_m, b_m) = (
            manager(&[server.url()], o.clone()),
            manager(&[server.url()], o),
        );
        let _held = holder.acquire(key).await.unwrap();
        let q = ferrolock::queue_key(key);
        let a = tokio::spawn(async move { a_m.acquire(key).await });
        wait_until("A queued", || server.cmd::<i64>(&["ZCARD", &q]) == 1).await;
        let b = tokio::spawn(async move { b_m.acquire(key).await });
        wait_until("B queued", || server.cmd::<i64>(&["ZCARD", &q]) == 2).await;
        // Freed without a publish: nobody is told until the head leaves.
        server.cmd::<i64>(&["DEL", key]);
        a.abort();
        assert!(a.await.unwrap_err().is_cancelled());
        let got = tokio::time::timeout(Duration::from_secs(20), b).await;
        let lock = got
            .unwrap_or_else(|_| {
                panic!("reentrant {reentrant}: B was never told (its timer is {LONG:?})")
            })
            .unwrap()
            .unwrap();
        assert!(lock.release().await.unwrap());
    }
}

/// A waiter queued behind a crashed one whose lease has ended is told of the next release,
/// also by a holder that saw no contention lately (its first attempt was a plain `SET NX`, or
/// it held the lock for longer than the contention memory). Before, such a release sent the
/// short form of `release.lua`, which told the first waiter in the queue without dropping the
/// lapsed ones first: the crashed waiter heard it, and the live one slept on its timer (found
/// by a review). The waiter's own attempts, made while the lock is held, leave the lapsed
/// entry where it is.
#[tokio::test(flavor = "multi_thread")]
async fn a_release_wakes_the_live_waiter_behind_a_crashed_head_whose_lease_ended() {
    let _serial = serial();
    let server = RedisServer::start();
    let key = "crashed-head";
    let holder = manager(&[server.url()], slow_poll(LONG));
    let held = holder.acquire(key).await.unwrap();
    // A waiter that queued and then crashed: first in line, its lease over a second ago.
    let now_ms = server_ms(&server);
    let (q, l, s) = (
        ferrolock::queue_key(key),
        ferrolock::queue_lease_key(key),
        ferrolock::queue_since_key(key),
    );
    server.cmd::<i64>(&["ZADD", &q, "1", "crashed-waiter"]);
    server.cmd::<i64>(&["ZADD", &l, &(now_ms - 1_000).to_string(), "crashed-waiter"]);
    server.cmd::<i64>(&["ZADD", &s, &(now_ms - 60_000).to_string(), "crashed-waiter"]);
    for k in [&q, &l, &s] {
        server.cmd::<i64>(&["PEXPIRE", k, "60000"]);
    }
    let waiter_m = manager(&[server.url()], slow_poll(LONG));
    // Warm: the connection is open (connect + script preload).
    assert!(waiter_m.try_acquire(key).await.is_err());
    let base = waiter_m.round_trips()[0];
    let w = waiter_m.clone();
    let waiter = tokio::spawn(async move { w.acquire(key).await });
    wait_for_subscribers(&server, &ferrolock::release_channel(key), 1).await;
    // Its first attempt, the re-check once subscribed (which queues it) and the one when its
    // barging bound ends: after these it sleeps on its timer, and only a push can wake it.
    wait_until("the waiter's first attempt and two re-checks", || {
        waiter_m.round_trips()[0] >= base + 3
    })
    .await;
    tokio::time::sleep(ms(300)).await;
    assert_eq!(waiter_m.round_trips()[0], base + 3, "then quiet");
    assert_eq!(
        server.cmd::<i64>(&["ZCARD", &q]),
        2,
        "queued behind the crashed one"
    );
    assert_eq!(
        server.cmd::<Vec<String>>(&["ZRANGE", &q, "0", "0"]),
        ["crashed-waiter"],
        "the crashed waiter is still first in line"
    );
    assert!(!waiter.is_finished());
    let released = Instant::now();
    assert!(held.release().await.unwrap());
    // A failure bound: the waiter's timer is 30 s or more, the holder's PTTL 60 s.
    let lock = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the live waiter was not told of the release ({:?} ago): its timer is {LONG:?} \
                 ± 50 %",
                released.elapsed()
            )
        })
        .unwrap()
        .unwrap();
    assert_eq!(get(&server, key).as_deref(), Some(lock.token()));
    assert_eq!(
        server.cmd::<Option<i64>>(&["ZSCORE", &q, "crashed-waiter"]),
        None,
        "pruned"
    );
}

/// A process's waiter that takes the turn from a neighbour that got the lock re-checks when
/// that lock would expire: a lock that lapses (its holder stalled past its ttl, watchdog off)
/// publishes nothing, and a waiter in another process re-checks at the PTTL its busy answer
/// gave. Before, the new head knew only the PTTL of its own last answer (the previous
/// holder's) and slept on that or its timer, long after the lock had lapsed (found by a
/// review).
#[tokio::test(flavor = "multi_thread")]
async fn a_waiter_behind_a_neighbour_whose_lock_lapses_re_checks_at_its_expiry() {
    let _serial = serial();
    let server = RedisServer::start();
    let key = "neighbour-lapses";
    let o = slow_poll(LONG);
    let holder = manager(&[server.url()], o.clone());
    let m = manager(&[server.url()], o.clone());
    let held = holder.acquire(key).await.unwrap();
    let short = o.clone().ttl(ms(1_500));
    let first = {
        let m = m.clone();
        tokio::spawn(async move { m.acquire_with(key, &short).await })
    };
    wait_until("the first waiter is queued", || {
        server.cmd::<i64>(&["ZCARD", &ferrolock::queue_key(key)]) == 1
    })
    .await;
    let base = m.round_trips()[0];
    let second = {
        let m = m.clone();
        tokio::spawn(async move { m.acquire(key).await })
    };
    // Its first attempt (busy: the PTTL of the holder's 60 s ttl): then it waits its turn.
    wait_until("the second waiter's first attempt", || {
        m.round_trips()[0] > base
    })
    .await;
    tokio::time::sleep(ms(100)).await;
    assert!(!second.is_finished());
    let released = Instant::now();
    assert!(held.release().await.unwrap());
    // Kept, never released: it lapses at its ttl (1.5 s), and nothing is published.
    let lapsing = tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .expect("the first waiter was never told")
        .unwrap()
        .unwrap();
    // A failure bound: the second waiter's timer is 30 s or more, the holder's PTTL 60 s.
    let lock = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the second waiter did not re-check when its neighbour's lock lapsed (released \
                 to it {:?} ago, with a 1.5 s ttl; its timer is {LONG:?} ± 50 %)",
                released.elapsed()
            )
        })
        .unwrap()
        .unwrap();
    // The first lock was set after `released` (a little slack for the server's ms clock).
    let took = released.elapsed();
    assert!(
        took >= ms(1_495),
        "granted before the first lock lapsed: {took:?}"
    );
    assert_eq!(get(&server, key).as_deref(), Some(lock.token()));
    drop(lapsing);
}

/// A waiter whose node is held back by the restart guard (it restarted, or started, within
/// the window) re-checks when the guard lets the node vote again, a lock's waiter as a
/// semaphore's: nothing is published then, and its retry delay may be far longer than the
/// window. Before, its held-back attempts gave no re-check time, and it slept on its timer
/// (found by a review).
#[tokio::test(flavor = "multi_thread")]
async fn a_waiter_held_back_by_the_restart_guard_re_checks_when_the_window_ends() {
    let _serial = serial();
    for semaphore in [false, true] {
        let server = RedisServer::start();
        let window = Duration::from_secs(5);
        let m = LockManager::new(
            ferrolock::ManagerOptions::new()
                .nodes([server.url()])
                .restart_guard(window)
                .lock(slow_poll(LONG)),
        )
        .unwrap();
        // The fault: a fresh server, up for less than the window (read in whole seconds).
        let up = info_number(&server, "server", "uptime_in_seconds");
        assert!(
            up + 2 <= window.as_secs(),
            "the server has been up {up} s already"
        );
        let started = Instant::now();
        let key = "guarded-wait";
        let acquire = async {
            if semaphore {
                m.semaphore_with(key, 1, 1, &slow_poll(LONG)).await
            } else {
                m.acquire(key).await
            }
        };
        // A failure bound: the window ends within 6 s; the waiter's timer is 30 s or more.
        let lock = tokio::time::timeout(Duration::from_secs(20), acquire)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "semaphore {semaphore}: not acquired {:?} after the start, past the \
                     {window:?} window: its timer is {LONG:?} ± 50 %",
                    started.elapsed()
                )
            })
            .unwrap();
        assert!(lock.release().await.unwrap());
    }
}
