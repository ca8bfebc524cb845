//! A node that is a whole Redis Cluster (`redis+cluster://`): locks on every primary's slots,
//! derived keys in the key's slot, renewal, wake-ups, and the refusal of a plain URL.
// Each test starts a cluster of its own; `serial` runs them one at a time (a std mutex held
// across awaits on purpose: every test has its own runtime, so it cannot deadlock).
#![allow(clippy::await_holding_lock)]

mod common;

use std::time::Duration;

use common::*;
use ferrolock::{ErrorKind, LockOptions};
use ferrolock_testbed::{ClusterOptions, RedisCluster, RedisServer, key_slot};

/// One key per primary, in `cluster.primaries()` order.
fn key_per_primary(cluster: &RedisCluster, prefix: &str) -> Vec<String> {
    cluster
        .primaries()
        .iter()
        .map(|p| {
            (0..)
                .map(|i| format!("{prefix}:{i}"))
                .find(|k| cluster.primary_for_key(k).port() == p.port())
                .unwrap()
        })
        .collect()
}

fn owner<'a>(cluster: &'a RedisCluster, key: &str) -> &'a RedisServer {
    cluster.primary_for_key(key)
}

#[tokio::test]
async fn plain_locks_on_every_primary_exclude_fence_extend_and_release() {
    let _serial = serial();
    let cluster = RedisCluster::start();
    let url = cluster.url();
    let m1 = manager(std::slice::from_ref(&url), opts().fencing(true));
    let m2 = manager(std::slice::from_ref(&url), opts().fencing(true));
    let keys = key_per_primary(&cluster, "orders");
    let slots: std::collections::BTreeSet<u16> = keys.iter().map(|k| key_slot(k)).collect();
    assert_eq!(slots.len(), 3, "{keys:?}");
    for key in &keys {
        let primary = owner(&cluster, key);
        let lock = m1
            .acquire(key)
            .await
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(get(primary, key).as_deref(), Some(lock.token()), "{key}");
        let fence = lock.fence().expect("fencing on");
        // The fence counter carries the key as its hash tag: same slot, same primary.
        let fence_key = format!("ferrolock:fence:{{{key}}}");
        assert_eq!(key_slot(&fence_key), key_slot(key));
        assert_eq!(primary.cmd::<u64>(&["GET", &fence_key]), fence);
        let err = m2.try_acquire(key).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotAcquired, "{key}: {err}");
        lock.extend_for(Duration::from_secs(60)).await.unwrap();
        assert!(pttl(primary, key) > 30_000, "{key}");
        assert!(lock.release().await.unwrap());
        assert_eq!(get(primary, key), None);
        let next = m2.acquire(key).await.unwrap();
        assert_eq!(next.fence(), Some(fence + 1), "{key}");
        next.release().await.unwrap();
    }
}

#[tokio::test]
async fn reentrant_locks_on_every_primary_count_holds_in_redissons_hash() {
    let _serial = serial();
    let cluster = RedisCluster::start();
    let m = manager(&[cluster.url()], opts());
    let ropts = opts().reentrant(true);
    for key in key_per_primary(&cluster, "accounts") {
        let primary = owner(&cluster, &key);
        let outer = m.acquire_owned(&key, 1, &ropts).await.unwrap();
        let inner = m.acquire_owned(&key, 1, &ropts).await.unwrap();
        let field = outer.token().to_string();
        assert_eq!(
            primary.cmd::<Option<i64>>(&["HGET", &key, &field]),
            Some(2),
            "{key}"
        );
        let other = m
            .acquire_owned(&key, 2, &ropts.clone().wait(Some(Duration::ZERO)))
            .await
            .unwrap_err();
        assert_eq!(other.kind(), ErrorKind::NotAcquired, "{key}: {other}");
        inner.release().await.unwrap();
        assert_eq!(primary.cmd::<Option<i64>>(&["HGET", &key, &field]), Some(1));
        outer.release().await.unwrap();
        assert!(!primary.cmd::<bool>(&["EXISTS", &key]));
    }
}

/// The watchdog's batch spans keys of all three primaries; a cluster refuses one pipeline
/// across slots, so each renewal is routed on its own.
#[tokio::test]
async fn the_watchdog_renews_locks_on_every_primary() {
    let _serial = serial();
    let cluster = RedisCluster::start();
    let ttl = Duration::from_millis(1500);
    let m = manager(&[cluster.url()], LockOptions::default().ttl(ttl));
    let keys = key_per_primary(&cluster, "renewed");
    let mut locks = Vec::new();
    for key in &keys {
        locks.push(m.acquire(key).await.unwrap());
    }
    // Three TTLs: without renewal every key would have expired.
    tokio::time::sleep(ttl * 3).await;
    for (key, lock) in keys.iter().zip(&locks) {
        assert!(lock.is_held(), "{key}: {:?}", lock.check());
        assert_eq!(
            get(owner(&cluster, key), key).as_deref(),
            Some(lock.token())
        );
    }
    for lock in locks {
        lock.release().await.unwrap();
    }
}

/// Classic PUBLISH is broadcast to every node of a cluster, so the waiter's subscription on
/// the seed hears a release on any primary.
#[tokio::test]
async fn a_waiter_is_woken_by_a_release_on_another_primary() {
    let _serial = serial();
    let cluster = RedisCluster::start();
    let url = cluster.url();
    // A key whose primary is not the seed (nodes[0]).
    let key = key_per_primary(&cluster, "woken")
        .into_iter()
        .find(|k| owner(&cluster, k).port() != cluster.nodes[0].port())
        .unwrap();
    let holder = manager(std::slice::from_ref(&url), opts());
    let waiting = manager(
        std::slice::from_ref(&url),
        opts()
            .ttl(Duration::from_secs(120))
            .retry_delay(Duration::from_secs(60)),
    );
    let held = holder.acquire(&key).await.unwrap();
    let k = key.clone();
    let waiter = tokio::spawn(async move { waiting.acquire(&k).await.map(|l| (l, waiting)) });
    // The waiter listens on its own channel (subscribed through the seed) before the release.
    // Without a subscription it would fall back to polling, which this test must not pass on.
    let seed = &cluster.nodes[0];
    let pattern = format!("{}*", ferrolock::__wire::waiter_channel_prefix(&key));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let channels: Vec<String> = seed.cmd(&["PUBSUB", "CHANNELS", &pattern]);
        if !channels.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the waiter never subscribed to {pattern} on the seed"
        );
        tokio::time::sleep(ms(20)).await;
    }
    held.release().await.unwrap();
    // Without a wake-up the next poll is 60 s away (up to 90 s with jitter).
    let (lock, _m) = tokio::time::timeout(Duration::from_secs(45), waiter)
        .await
        .expect("the waiter was not woken by the release")
        .unwrap()
        .unwrap();
    assert_eq!(
        get(owner(&cluster, &key), &key).as_deref(),
        Some(lock.token())
    );
}

#[tokio::test]
async fn a_plain_url_to_a_cluster_node_is_refused_for_every_key() {
    let _serial = serial();
    let cluster = RedisCluster::start();
    let node = &cluster.nodes[0];
    let m = manager(&[node.url()], opts().wait(Some(Duration::ZERO)));
    // One key in this node's own slots (a plain client would get it), one elsewhere.
    let own = (0..)
        .map(|i| format!("own:{i}"))
        .find(|k| owner(&cluster, k).port() == node.port())
        .unwrap();
    let other = (0..)
        .map(|i| format!("other:{i}"))
        .find(|k| owner(&cluster, k).port() != node.port())
        .unwrap();
    for key in [&own, &other] {
        let err = m.try_acquire(key).await.unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(&format!("redis+cluster://127.0.0.1:{}", node.port())),
            "{key}: {text}"
        );
        assert_eq!(get(owner(&cluster, key), key), None, "{key} was written");
    }
}

#[tokio::test]
async fn with_a_primary_down_its_keys_fail_naming_the_cluster_and_others_still_lock() {
    let _serial = serial();
    let mut cluster = RedisCluster::start_with(ClusterOptions {
        require_full_coverage: false,
        ..ClusterOptions::default()
    });
    let url = cluster.url();
    let keys = key_per_primary(&cluster, "partial");
    // Not the seed: the manager still reads the topology from it.
    let (dead_key, dead_port) = keys
        .iter()
        .map(|k| (k.clone(), owner(&cluster, k).port()))
        .find(|(_, p)| *p != cluster.nodes[0].port())
        .unwrap();
    let m = manager(
        std::slice::from_ref(&url),
        opts().node_timeout(ms(500)).wait(Some(Duration::ZERO)),
    );
    // Connected (topology read) before the fault.
    m.acquire(&keys[0]).await.unwrap().release().await.unwrap();
    let i = cluster.index_of_port(dead_port);
    cluster.nodes[i].kill();
    assert!(!cluster.nodes[i].is_running());
    let err = m.try_acquire(&dead_key).await.unwrap_err();
    // The node (the cluster's URL) and the shard (its dead primary's address) are named.
    assert!(err.to_string().contains(&url), "{err}");
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{dead_port}")),
        "{err}"
    );
    for key in keys.iter().filter(|k| **k != dead_key) {
        let lock = m
            .acquire(key)
            .await
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(
            get(owner(&cluster, key), key).as_deref(),
            Some(lock.token())
        );
        lock.release().await.unwrap();
    }
}

/// `?seed=` is used when the URL's own host does not answer.
#[tokio::test]
async fn an_extra_seed_is_used_when_the_first_is_down() {
    let _serial = serial();
    // Without full coverage, so the live shards keep answering however slow this machine is.
    let mut cluster = RedisCluster::start_with(ClusterOptions {
        require_full_coverage: false,
        ..ClusterOptions::default()
    });
    let (dead, live) = (cluster.nodes[0].port(), cluster.nodes[1].port());
    cluster.nodes[0].kill();
    assert!(!cluster.nodes[0].is_running());
    let url = format!("redis+cluster://127.0.0.1:{dead}?seed=127.0.0.1:{live}");
    let only_seed = format!("redis+cluster://127.0.0.1:{dead}");
    let m = manager(&[url], opts().wait(Some(Duration::ZERO)));
    let without = manager(&[only_seed], opts().wait(Some(Duration::ZERO)));
    let key = (0..)
        .map(|i| format!("seeded:{i}"))
        .find(|k| owner(&cluster, k).port() == live)
        .unwrap();
    let lock = m
        .acquire(&key)
        .await
        .unwrap_or_else(|e| panic!("{key}: {e}"));
    assert_eq!(
        get(owner(&cluster, &key), &key).as_deref(),
        Some(lock.token())
    );
    lock.release().await.unwrap();
    let err = without.try_acquire(&key).await.unwrap_err();
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{dead}")),
        "{err}"
    );
}
