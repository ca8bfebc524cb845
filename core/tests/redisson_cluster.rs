//! ferrolock's reentrant lock against a real Redisson 4.7.0 client (Java, cluster mode) on a real
//! 3-primary Redis Cluster: each excludes the other on one key, and each one's release wakes
//! the other's waiter over pub/sub, sharded (both sides' default) and classic.
//!
//! The Java client: `common/redisson.rs`.
// Each test starts a cluster of its own; `serial` runs them one at a time (a std mutex held
// across awaits on purpose: every test has its own runtime, so it cannot deadlock).
#![allow(clippy::await_holding_lock)]

mod common;

use std::time::{Duration, Instant};

use common::redisson::{Redisson, redisson_classpath};
use common::*;
use ferrolock::{ErrorKind, LockManager, LockOptions, ManagerOptions};
use ferrolock_testbed::{RedisCluster, RedisServer};

/// A fast grant must come within this of the release. Without a wake-up, a ferrolock waiter
/// polls after `retry_delay` (30 s, jittered to 15 s at the least) and a Redisson waiter after
/// the lock's remaining ttl (at least 40 s here): only the pub/sub message explains a grant
/// within 10 s.
const WOKEN_WITHIN: Duration = Duration::from_secs(10);

/// The node the Java client learns the cluster from.
fn seed(cluster: &RedisCluster) -> String {
    format!("redis://127.0.0.1:{}", cluster.nodes[0].port())
}

fn reentrant_manager(cluster: &RedisCluster, sharded: bool, opts: LockOptions) -> LockManager {
    LockManager::new(
        ManagerOptions::new()
            .nodes([cluster.url()])
            .restart_guard(Duration::ZERO)
            .sharded_pubsub(sharded)
            .lock(opts.reentrant(true)),
    )
    .expect("manager")
}

/// The key's hash fields (`"<client id>:<owner>"`) on its primary.
fn fields(cluster: &RedisCluster, key: &str) -> Vec<String> {
    cluster.primary_for_key(key).cmd(&["HKEYS", key])
}

/// Subscribers of `channel` over all primaries: `PUBSUB SHARDNUMSUB` (sharded) or `NUMSUB`.
fn subscribers(cluster: &RedisCluster, channel: &str, sharded: bool) -> i64 {
    let sub = if sharded { "SHARDNUMSUB" } else { "NUMSUB" };
    cluster
        .primaries()
        .iter()
        .map(|node: &RedisServer| {
            let reply: Vec<redis::Value> = node.cmd(&["PUBSUB", sub, channel]);
            match reply.get(1) {
                Some(redis::Value::Int(n)) => *n,
                other => panic!("PUBSUB {sub} {channel}: {other:?}"),
            }
        })
        .sum()
}

/// Until a waiter has subscribed to Redisson's channel for `key`, then a while longer: a
/// waiter re-checks the lock once its subscription is confirmed, and a release before that
/// re-check would be caught by it, not by the wake-up this file tests.
async fn await_subscribed(cluster: &RedisCluster, key: &str, sharded: bool, who: &str) {
    let channel = ferrolock::__wire::redisson_channel(key);
    let deadline = Instant::now() + Duration::from_secs(30);
    while subscribers(cluster, &channel, sharded) == 0 {
        assert!(
            Instant::now() < deadline,
            "{who} never subscribed to {channel} (sharded {sharded})"
        );
        tokio::time::sleep(ms(20)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
}

/// A reentrant ferrolock lock held: Redisson's tryLock fails, also after an inner release (hold
/// count 2 -> 1); released: it succeeds. A Redisson RLock held twice (re-entered): ferrolock's
/// try-acquire is refused (NotAcquired), also after one unlock; unlocked: it succeeds. On a key
/// of every primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ferrolock_and_redisson_exclude_each_other_on_every_primary() {
    let _serial = serial();
    let classpath = redisson_classpath();
    let cluster = RedisCluster::start();
    let mut redisson = Redisson::start(classpath, &seed(&cluster), "sharded").await;
    // Every request is one try, the first one of a new manager (it connects first): a node
    // timeout for a loaded machine (and a ttl that allows it), as what is checked is how the
    // tries are answered, not how fast.
    let m = reentrant_manager(
        &cluster,
        true,
        opts()
            .wait(Some(Duration::ZERO))
            .ttl(Duration::from_secs(60))
            .node_timeout(Duration::from_secs(5)),
    );
    let count = |key: &str, field: &str| -> Option<i64> {
        cluster.primary_for_key(key).cmd(&["HGET", key, field])
    };
    for key in cluster.key_per_primary("interop") {
        let outer = m.acquire_owned(&key, 1, m.defaults()).await.unwrap();
        let inner = m.acquire_owned(&key, 1, m.defaults()).await.unwrap();
        let ours = outer.token().to_string();
        assert_eq!(fields(&cluster, &key), std::slice::from_ref(&ours));
        assert_eq!(count(&key, &ours), Some(2));
        assert!(
            !redisson.try_lock(&key).await,
            "{key}: Redisson got a lock ferrolock holds"
        );
        assert!(inner.release().await.unwrap());
        assert_eq!(count(&key, &ours), Some(1));
        assert!(
            !redisson.try_lock(&key).await,
            "{key}: Redisson got a lock ferrolock still holds once"
        );
        assert!(outer.release().await.unwrap());
        assert!(redisson.try_lock(&key).await, "{key}: free, yet refused");
        assert!(redisson.try_lock(&key).await, "{key}: Redisson's re-entry");
        let theirs = fields(&cluster, &key);
        assert_eq!(theirs.len(), 1, "{key}: {theirs:?}");
        assert!(
            theirs[0].starts_with(&format!("{}:", redisson.id)),
            "{key}: {theirs:?} is not Redisson's {}",
            redisson.id
        );
        assert_eq!(count(&key, &theirs[0]), Some(2));
        let err = m.try_acquire(&key).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotAcquired, "{key}: {err}");
        redisson.unlock(&key).await;
        assert_eq!(count(&key, &theirs[0]), Some(1));
        let err = m.try_acquire(&key).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotAcquired, "{key}: {err}");
        assert_eq!(fields(&cluster, &key), theirs, "{key}: untouched");
        redisson.unlock(&key).await;
        let next = m.try_acquire(&key).await.unwrap();
        assert!(next.release().await.unwrap());
    }
}

/// Two keys, on primaries other than the seed (a sharded message is heard only on the key's
/// own primary); two, so that one waiter's subscription (which lingers) is not taken for the
/// other's.
fn woken_keys(cluster: &RedisCluster, prefix: &str) -> Vec<String> {
    cluster
        .key_per_primary(prefix)
        .into_iter()
        .filter(|k| cluster.primary_for_key(k).port() != cluster.nodes[0].port())
        .collect()
}

/// A ferrolock waiter (`retry_delay` 30 s) on a lock Redisson holds (lease 120 s), then
/// Redisson's unlock: how soon the waiter is granted, or None if not within `WOKEN_WITHIN`.
/// `sharded`: ferrolock's `sharded_pubsub`.
async fn ferrolock_waiter_after_redissons_unlock(
    cluster: &RedisCluster,
    redisson: &mut Redisson,
    key: &str,
    sharded: bool,
) -> Option<Duration> {
    redisson.send(&format!("lock {key} 120000")).await;
    redisson
        .expect(&format!("locked {key}"), Duration::from_secs(30))
        .await;
    let waiting = reentrant_manager(
        cluster,
        sharded,
        opts()
            .ttl(Duration::from_secs(60))
            .retry_delay(Duration::from_secs(30)),
    );
    let k = key.to_string();
    let mut waiter = tokio::spawn(async move { waiting.acquire(&k).await.map(|l| (l, waiting)) });
    await_subscribed(cluster, key, sharded, "the ferrolock waiter").await;
    assert!(
        !waiter.is_finished(),
        "granted while Redisson held the lock"
    );
    let unlocked = Instant::now();
    redisson.unlock(key).await;
    let Ok(granted) = tokio::time::timeout(WOKEN_WITHIN, &mut waiter).await else {
        waiter.abort();
        return None;
    };
    let took = unlocked.elapsed();
    let (lock, _waiting) = granted.unwrap().unwrap();
    assert_eq!(fields(cluster, key), [lock.token().to_string()]);
    assert!(lock.release().await.unwrap());
    Some(took)
}

/// A Redisson `lock()` waiter on a lock ferrolock holds (ttl 60 s, watchdog on), then
/// ferrolock's release: how soon Redisson is granted, or None if not within `WOKEN_WITHIN`
/// (Redisson is then still waiting). `sharded`: ferrolock's `sharded_pubsub`;
/// `redisson_sharded`: the Java client's mode.
async fn redisson_waiter_after_ferrolocks_release(
    cluster: &RedisCluster,
    redisson: &mut Redisson,
    key: &str,
    sharded: bool,
    redisson_sharded: bool,
) -> Option<Duration> {
    let holder = reentrant_manager(
        cluster,
        sharded,
        LockOptions::default().ttl(Duration::from_secs(60)),
    );
    let held = holder.acquire(key).await.unwrap();
    redisson.send(&format!("lock {key} -1")).await;
    await_subscribed(cluster, key, redisson_sharded, "the Redisson waiter").await;
    assert!(
        redisson.lines.is_empty(),
        "Redisson answered while ferrolock held the lock"
    );
    let remaining = pttl(cluster.primary_for_key(key), key);
    assert!(
        remaining > 40_000,
        "the watchdog keeps it long: {remaining} ms"
    );
    let released = Instant::now();
    assert!(held.release().await.unwrap());
    let line = tokio::time::timeout(WOKEN_WITHIN, redisson.lines.recv()).await;
    let took = released.elapsed();
    match line {
        Err(_) => return None,
        Ok(Some(l)) if l == format!("locked {key}") => {}
        Ok(other) => panic!(
            "the Java client: {other:?}; its stderr:\n{}",
            redisson.stderr.lock().unwrap()
        ),
    }
    let redissons = fields(cluster, key);
    assert!(
        redissons.len() == 1 && redissons[0].starts_with(&format!("{}:", redisson.id)),
        "{redissons:?}"
    );
    redisson.unlock(key).await;
    Some(took)
}

/// Both directions, with both clients on sharded pub/sub (ferrolock's `sharded_pubsub` on,
/// Redisson's shardedSubscriptionMode AUTO: both defaults).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_wake_the_other_clients_waiter_over_sharded_pubsub() {
    let _serial = serial();
    let classpath = redisson_classpath();
    let cluster = RedisCluster::start();
    let mut redisson = Redisson::start(classpath, &seed(&cluster), "sharded").await;
    let keys = woken_keys(&cluster, "sharded");
    let took = ferrolock_waiter_after_redissons_unlock(&cluster, &mut redisson, &keys[0], true)
        .await
        .expect("the ferrolock waiter was not woken by Redisson's unlock");
    eprintln!("ferrolock granted {took:?} after Redisson's unlock");
    let took =
        redisson_waiter_after_ferrolocks_release(&cluster, &mut redisson, &keys[1], true, true)
            .await
            .expect("the Redisson waiter was not woken by ferrolock's release");
    eprintln!("Redisson granted {took:?} after ferrolock's release");
}

/// Both directions over classic pub/sub: ferrolock's `sharded_pubsub` off, Redisson's
/// shardedSubscriptionMode OFF.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_wake_the_other_clients_waiter_over_classic_pubsub() {
    let _serial = serial();
    let classpath = redisson_classpath();
    let cluster = RedisCluster::start();
    let mut redisson = Redisson::start(classpath, &seed(&cluster), "classic").await;
    let keys = woken_keys(&cluster, "classic");
    let took = ferrolock_waiter_after_redissons_unlock(&cluster, &mut redisson, &keys[0], false)
        .await
        .expect("the ferrolock waiter was not woken by Redisson's unlock");
    eprintln!("ferrolock granted {took:?} after Redisson's unlock");
    let took =
        redisson_waiter_after_ferrolocks_release(&cluster, &mut redisson, &keys[1], false, false)
            .await
            .expect("the Redisson waiter was not woken by ferrolock's release");
    eprintln!("Redisson granted {took:?} after ferrolock's release");
}
