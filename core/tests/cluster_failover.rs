//! Issue 19 on real local clusters: a graceful failover under a held lock, the ACL a cluster
//! user needs, Redlock over three independent clusters, and `redis-cli --cluster reshard`
//! under a held lock. Every test starts its own cluster(s) and runs alone (`serial`).
// A std mutex held across awaits on purpose: every test has its own runtime.
#![allow(clippy::await_holding_lock)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use ferrolock::{ErrorKind, LockManager, LockOptions};
use ferrolock_testbed::{ClusterOptions, RedisCluster, RedisServer, role};

/// A competitor that tries `key` every 50 ms (each try a fresh attempt, never waiting) until
/// stopped, and panics if it is ever granted. Returns how many tries were refused as busy
/// (`NotAcquired`), and the other errors it met (a cluster mid-failover may answer with one).
struct Rival {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(u64, Vec<String>)>,
}

impl Rival {
    fn start(m: LockManager, key: &str, phase: &str) -> Rival {
        let stop = Arc::new(AtomicBool::new(false));
        let (key, phase, flag) = (key.to_string(), phase.to_string(), stop.clone());
        let task = tokio::spawn(async move {
            let (mut busy, mut errors) = (0, Vec::new());
            while !flag.load(Ordering::Relaxed) {
                match m.try_acquire(&key).await {
                    Ok(l) => panic!("{phase}: a second holder got {key:?} (token {})", l.token()),
                    Err(e) if e.kind() == ErrorKind::NotAcquired => busy += 1,
                    Err(e) => errors.push(e.to_string()),
                }
                tokio::time::sleep(ms(50)).await;
            }
            (busy, errors)
        });
        Rival { stop, task }
    }

    async fn stop(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("the rival panicked")
    }
}

/// A manager that never waits: one attempt per try.
fn rival_manager(url: &str) -> LockManager {
    manager(&[url.to_string()], opts().wait(Some(Duration::ZERO)))
}

fn with_replicas() -> RedisCluster {
    RedisCluster::start_with(ClusterOptions {
        replicas: 1,
        ..ClusterOptions::default()
    })
}

/// `calls=` of EVALSHA on `node` (a replica applies a script's effects, never runs EVALSHA).
fn evalshas(node: &RedisServer) -> u64 {
    calls(node, "evalsha")
}

/// Issue 19: a graceful `CLUSTER FAILOVER`, run on a replica of the lock's shard. The lock
/// (written before, so the replica has it once the failover has synced) stays held: the
/// watchdog renews it on the new primary (EVALSHA runs there, the key's ttl stays up) for
/// several ttls after the switch, and a competing manager, connected before the failover, and
/// a fresh one connected after it are refused throughout; once released, the rival gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_failover_keeps_the_lock_renewed_on_the_new_primary() {
    let _serial = serial();
    let cluster = with_replicas();
    let url = cluster.url();
    let ttl = Duration::from_secs(3);
    let m = manager(std::slice::from_ref(&url), LockOptions::default().ttl(ttl));
    let key = "failover:held".to_string();
    let old = cluster.primary_for_key(&key);
    let new = *cluster
        .replicas_of(old)
        .first()
        .expect("the lock's shard has a replica");
    let lock = m.acquire(&key).await.unwrap();
    assert_eq!(get(old, &key).as_deref(), Some(lock.token()));
    let before = Rival::start(rival_manager(&url), &key, "before and during the failover");
    tokio::time::sleep(ttl).await;
    let new_port = new.port();
    let renewed_on_new = evalshas(new);
    tokio::task::block_in_place(|| cluster.failover(new, None));
    let switched = Instant::now();
    // The fault happened: the replica is the slot's primary, the old primary its replica.
    assert_eq!(role(new), "master");
    assert_eq!(role(old), "slave");
    assert_eq!(cluster.primary_for_key(&key).port(), new_port);
    let after = Rival::start(
        rival_manager(&url),
        &key,
        "after the failover (fresh manager)",
    );
    // Several ttls on the new primary: without renewals there the key would be gone.
    while switched.elapsed() < ttl * 3 {
        assert!(
            lock.is_held(),
            "lost after the failover: {:?}",
            lock.check()
        );
        tokio::time::sleep(ms(100)).await;
    }
    assert!(lock.is_held(), "{:?}", lock.check());
    assert_eq!(get(new, &key).as_deref(), Some(lock.token()));
    assert!(pttl(new, &key) > 0);
    assert!(
        evalshas(new) > renewed_on_new,
        "the new primary ran no renewal (EVALSHA calls {renewed_on_new} before the failover, {} after)",
        evalshas(new)
    );
    let (busy_before, errors_before) = before.stop().await;
    let (busy_after, errors_after) = after.stop().await;
    assert!(busy_after > 0, "never refused as busy: {errors_after:?}");
    assert!(busy_before > 0, "never refused as busy: {errors_before:?}");
    assert!(lock.release().await.unwrap());
    assert_eq!(get(new, &key), None);
    let next = rival_manager(&url).try_acquire(&key).await.unwrap();
    assert_eq!(get(new, &key).as_deref(), Some(next.token()));
    next.release().await.unwrap();
    eprintln!(
        "rivals refused {busy_before} + {busy_after} times; other errors: {errors_before:?} {errors_after:?}; renewals [ticks, pipelines, piped, alone]: {:?}",
        m.__cluster_renewals()
    );
}
