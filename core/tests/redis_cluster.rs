//! A node that is a whole Redis Cluster (`redis+cluster://`): locks on every primary's slots,
//! derived keys in the key's slot, renewal, wake-ups, and the refusal of a plain URL.
// Each test starts a cluster of its own; `serial` runs them one at a time (a std mutex held
// across awaits on purpose: every test has its own runtime, so it cannot deadlock).
#![allow(clippy::await_holding_lock)]

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use ferrolock::{ErrorKind, LockManager, LockOptions, ManagerOptions};
use ferrolock_testbed::{ClusterOptions, RedisCluster, RedisServer, key_slot, role};

fn owner<'a>(cluster: &'a RedisCluster, key: &str) -> &'a RedisServer {
    cluster.primary_for_key(key)
}

/// The node timeout of the waiters whose wake-up a test checks against a bound shorter than
/// half their `retry_delay`: the attempt a wake-up starts is what they wait on, and one that a
/// loaded machine made time out (the default 200 ms) would leave the waiter asleep until its
/// jittered `retry_delay`, past the bound, as if it was never woken.
const WOKEN_ATTEMPT: Duration = Duration::from_secs(5);

/// `manager`, with wake-ups over classic pub/sub (`sharded_pubsub` off).
fn classic_manager(urls: &[String], opts: LockOptions) -> LockManager {
    LockManager::new(
        ManagerOptions::new()
            .nodes(urls.iter().cloned())
            .restart_guard(Duration::ZERO)
            .sharded_pubsub(false)
            .lock(opts),
    )
    .expect("manager")
}

#[tokio::test]
async fn plain_locks_on_every_primary_exclude_fence_extend_and_release() {
    let _serial = serial();
    let cluster = RedisCluster::start();
    let url = cluster.url();
    let m1 = manager(std::slice::from_ref(&url), opts().fencing(true));
    // m2's first request is a single try (it connects first): a node timeout for a loaded
    // machine (and a ttl that allows it), as what is checked is that it is refused, not how
    // fast.
    let m2 = manager(
        std::slice::from_ref(&url),
        opts()
            .fencing(true)
            .ttl(Duration::from_secs(60))
            .node_timeout(Duration::from_secs(5)),
    );
    let keys = cluster.key_per_primary("orders");
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
    for key in cluster.key_per_primary("accounts") {
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

/// The watchdog's batch spans keys of all three primaries: each primary gets its own.
#[tokio::test]
async fn the_watchdog_renews_locks_on_every_primary() {
    let _serial = serial();
    let cluster = RedisCluster::start();
    // Long enough, with a node timeout set, that a saturated 2-CPU machine does not lose it.
    let ttl = Duration::from_secs(6);
    let m = manager(
        &[cluster.url()],
        LockOptions::default()
            .ttl(ttl)
            .node_timeout(Duration::from_millis(500)),
    );
    let keys = cluster.key_per_primary("renewed");
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

/// One field of a command's line in each primary's `INFO commandstats` (`calls`, or
/// `rejected_calls`: refused before running, such as a MOVED redirect).
fn calls(cluster: &RedisCluster, command: &str, field: &str) -> Vec<u64> {
    let line = format!("cmdstat_{command}:");
    cluster
        .primaries()
        .iter()
        .map(|p| {
            let info: String = p.cmd(&["INFO", "commandstats"]);
            let stats = info.lines().find_map(|l| l.strip_prefix(&line));
            stats
                .and_then(|s| {
                    s.split(',')
                        .find_map(|f| f.strip_prefix(&format!("{field}=")))
                })
                .map_or(0, |n| n.parse().unwrap())
        })
        .collect()
}

/// 10,000 locks over three primaries: each tick's renewals go to a primary as one routed
/// pipeline (a cluster refuses a pipeline over slots it does not serve; one command each was
/// 10,000 round trips a tick), and none goes alone. Each primary's own count of EVALSHA calls
/// matches what the client says it sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_locks_renew_with_one_pipeline_per_primary_per_tick() {
    let _serial = serial();
    let cluster = RedisCluster::start();
    let ttl = Duration::from_secs(6);
    let m = manager(&[cluster.url()], LockOptions::default().ttl(ttl));
    let keys: Vec<String> = (0..10_000).map(|i| format!("many:{i}")).collect();
    let mut locks = Vec::new();
    for chunk in keys.chunks(250) {
        let got = futures::future::join_all(chunk.iter().map(|k| m.acquire(k))).await;
        for (key, lock) in chunk.iter().zip(got) {
            locks.push(lock.unwrap_or_else(|e| panic!("{key}: {e}")));
        }
    }
    // Counted by the primaries rather than assumed from an EVALSHA count of zero here: on a
    // loaded machine the first renewals go out while later chunks are still acquiring.
    let sets = calls(&cluster, "set", "calls");
    assert_eq!(
        sets.iter().sum::<u64>(),
        keys.len() as u64,
        "each plain acquire is one SET NX, not a script: {sets:?}"
    );
    // Until the watchdog has sent two renewals per lock (the first ones are spread over the
    // acquisition; later ticks batch whatever is due within half a period).
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while m.__cluster_renewals()[2] < 2 * keys.len() as u64 {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            m.__cluster_renewals()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (key, lock) in keys.iter().zip(&locks) {
        assert!(lock.is_held(), "{key}: {:?}", lock.check());
    }
    // The locks per primary, as the primaries count them (they hold nothing else).
    let held: Vec<u64> = cluster
        .primaries()
        .iter()
        .map(|p| p.cmd(&["DBSIZE"]))
        .collect();
    assert_eq!(held.iter().sum::<u64>(), keys.len() as u64);
    assert!(held.iter().all(|&n| n > 2_000), "{held:?}");
    // Released: a release waits for its lock's renewal in flight, so nothing is sent after.
    for lock in &locks {
        assert!(lock.release().await.unwrap());
    }
    let [ticks, pipelines, piped, alone] = m.__cluster_renewals();
    assert_eq!(
        alone, 0,
        "renewals sent alone: {ticks} ticks, {pipelines} pipelines"
    );
    assert!(
        ticks >= 2 && pipelines >= ticks && pipelines <= 3 * ticks,
        "{pipelines} pipelines in {ticks} ticks"
    );
    let after = calls(&cluster, "evalsha", "calls");
    // A pipeline sent to the wrong primary is redirected whole by redis-rs, silently: each of
    // its entries is refused there first.
    let misrouted = calls(&cluster, "evalsha", "rejected_calls");
    assert_eq!(
        misrouted,
        [0, 0, 0],
        "renewals refused by a primary (MOVED)"
    );
    // Every EVALSHA a primary ran was a renewal or one of the 10,000 releases.
    assert_eq!(
        after.iter().sum::<u64>(),
        piped + alone + keys.len() as u64,
        "EVALSHA calls per primary: {after:?}, locks per primary: {held:?}"
    );
    for (ran, held) in after.iter().zip(&held) {
        assert!(
            ran > held,
            "each primary renewed its own keys: {after:?} {held:?}"
        );
    }
}

/// `key` on a node importing its slot, which answers for it only after ASKING.
fn get_importing(node: &RedisServer, key: &str) -> Option<String> {
    let mut conn = node.client();
    redis::cmd("ASKING").query::<()>(&mut conn).unwrap();
    redis::cmd("GET").arg(key).query(&mut conn).unwrap()
}

/// A slot moved by hand while its lock is held (issue 19's resharding case): CLUSTER SETSLOT
/// IMPORTING/MIGRATING, MIGRATE of the lock key alone, held in the migrating state for two
/// renewal periods while 200 other locks on the source keep renewing, then SETSLOT NODE. The
/// moved lock's renewal comes back ASK, then MOVED, from inside the source's pipeline, and is
/// sent alone (redis-rs follows the redirect); nothing is lost, and a competing manager is
/// refused throughout. A manager with the restart guard on, connected before the move, sees a
/// migration to an existing primary, not a failover: it is granted a key of the moved slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_whose_slot_is_migrated_by_hand_is_kept_and_never_granted_twice() {
    let _serial = serial();
    let cluster = RedisCluster::start();
    // Long enough, with a node timeout set, that a saturated 2-CPU machine does not lose it.
    let ttl = Duration::from_secs(6);
    let m = manager(
        &[cluster.url()],
        LockOptions::default()
            .ttl(ttl)
            .node_timeout(Duration::from_millis(500)),
    );
    let rival = manager(&[cluster.url()], opts().wait(Some(Duration::ZERO)));
    let guard_window = Duration::from_secs(2);
    // Its last try is one try, the first after the move (a redirect, the slot map read
    // again): a node timeout for a loaded machine (and a ttl that allows it), as what is
    // checked is that it is granted, not how fast.
    let guarded = ferrolock::LockManager::new(
        ferrolock::ManagerOptions::new()
            .nodes([cluster.url()])
            .restart_guard(guard_window)
            .lock(
                opts()
                    .wait(Some(Duration::ZERO))
                    .ttl(Duration::from_secs(60))
                    .node_timeout(Duration::from_secs(5)),
            ),
    )
    .unwrap();
    let key = "moving".to_string();
    let same_slot = "{moving}:guarded";
    // Connected, and the topology read, before the move. (Its answer does not matter: a
    // primary younger than the window is held back, as a restarted one.)
    if let Ok(l) = guarded.try_acquire(same_slot).await {
        assert!(l.release().await.unwrap());
    }
    let slot = key_slot(&key);
    let source = owner(&cluster, &key);
    let target = cluster
        .primaries()
        .iter()
        .find(|p| p.port() != source.port())
        .unwrap();
    // 200 other locks on the source, in other slots: they share its renewal pipeline.
    let others: Vec<String> = (0..)
        .map(|i| format!("stays:{i}"))
        .filter(|k| key_slot(k) != slot && owner(&cluster, k).port() == source.port())
        .take(200)
        .collect();
    let lock = m.acquire(&key).await.unwrap();
    let mut held = Vec::new();
    for k in &others {
        held.push(m.acquire(k).await.unwrap());
    }
    split_slot(source, target, &key);
    assert_eq!(
        get_importing(target, &key).as_deref(),
        Some(lock.token()),
        "MIGRATE moved it"
    );
    // A redirect of the moved lock's renewal shows as a renewal sent alone or as the
    // source's pipeline, failed whole, sent again halved (down to the moving slot).
    let redirected =
        |m: &ferrolock::LockManager| m.__cluster_renewals()[3] + m.__cluster_renewal_splits();
    let alone_before = redirected(&m);
    // Two renewal periods (ttl / 3 each) and more, in the migrating state.
    let check = |phase: &str| {
        let rival = &rival;
        let key = &key;
        let phase = phase.to_string();
        async move {
            let end = std::time::Instant::now() + ttl;
            let mut tries = 0;
            while std::time::Instant::now() < end {
                if let Ok(l) = rival.try_acquire(key).await {
                    panic!("{phase}: a second holder got {key:?} (token {})", l.token());
                }
                tries += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert!(tries > 0);
        }
    };
    check("migrating").await;
    assert!(lock.is_held(), "migrating: {:?}", lock.check());
    assert!(
        redirected(&m) > alone_before,
        "the moved lock's renewal was never redirected (ASK): {:?}",
        m.__cluster_renewals()
    );
    serve_slot_on(target, &key);
    finish_move(&cluster, &key, target);
    check("moved").await;
    // Settled: the map is read again after a redirect, so the moved lock now goes in the
    // target's pipeline, and nothing is sent alone any more.
    let settled = m.__cluster_renewals();
    check("moved, later").await;
    assert!(lock.is_held(), "moved: {:?}", lock.check());
    assert!(pttl(target, &key) > 0);
    assert_eq!(get(target, &key).as_deref(), Some(lock.token()));
    let left: i64 = source.cmd(&["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()]);
    assert_eq!(left, 0, "the source keeps nothing of the slot");
    for (k, l) in others.iter().zip(&held) {
        assert!(l.is_held(), "{k}: {:?}", l.check());
    }
    let now = m.__cluster_renewals();
    assert!(
        now[0] > settled[0],
        "no renewal tick after the move settled"
    );
    assert_eq!(
        now[3], settled[3],
        "still sent alone after the move: {settled:?} -> {now:?}"
    );
    assert!(lock.release().await.unwrap());
    assert_eq!(get(target, &key), None);
    // Every primary is older than the window by now: a refusal would be the move taken for
    // a failover.
    let l = guarded.try_acquire(same_slot).await.unwrap();
    assert_eq!(get(target, same_slot).as_deref(), Some(l.token()));
    assert!(l.release().await.unwrap());
}

/// With `sharded_pubsub` off: classic PUBLISH is broadcast to every node of a cluster, so the
/// waiter's subscription on the seed hears a release on any primary.
#[tokio::test]
async fn a_classic_waiter_is_woken_by_a_release_on_another_primary() {
    let _serial = serial();
    let cluster = RedisCluster::start();
    let url = cluster.url();
    // A key whose primary is not the seed (nodes[0]).
    let key = cluster
        .key_per_primary("woken")
        .into_iter()
        .find(|k| owner(&cluster, k).port() != cluster.nodes[0].port())
        .unwrap();
    let holder = classic_manager(
        std::slice::from_ref(&url),
        opts().ttl(Duration::from_secs(120)),
    );
    let waiting = classic_manager(
        std::slice::from_ref(&url),
        opts()
            .ttl(Duration::from_secs(120))
            .retry_delay(Duration::from_secs(60))
            .node_timeout(WOKEN_ATTEMPT),
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
    // Without a wake-up the next poll is 60 s away (at least 30 s with jitter), and the
    // holder's ttl 120 s.
    let (lock, _m) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was not woken by the release")
        .unwrap()
        .unwrap();
    assert_eq!(
        get(owner(&cluster, &key), &key).as_deref(),
        Some(lock.token())
    );
}

/// Polls `PUBSUB <sub> <args>` on `node` until `found` picks a value out of the reply;
/// panics after `within`.
async fn await_pubsub<T>(
    node: &RedisServer,
    args: &[&str],
    within: Duration,
    what: &str,
    found: impl Fn(&redis::Value) -> Option<T>,
) -> T {
    let deadline = std::time::Instant::now() + within;
    loop {
        let mut full = vec!["PUBSUB"];
        full.extend_from_slice(args);
        let reply: redis::Value = node.cmd(&full);
        if let Some(v) = found(&reply) {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not seen within {within:?} on port {} (last: {reply:?})",
            node.port()
        );
        tokio::time::sleep(ms(20)).await;
    }
}

/// `PUBSUB SHARDNUMSUB` / `NUMSUB` of one channel: its subscriber count.
fn count_of(reply: &redis::Value) -> i64 {
    match reply {
        redis::Value::Array(v) => match v.get(1) {
            Some(redis::Value::Int(n)) => *n,
            other => panic!("no count in {reply:?}: {other:?}"),
        },
        redis::Value::Map(m) => match m.first() {
            Some((_, redis::Value::Int(n))) => *n,
            _ => panic!("no count in {reply:?}"),
        },
        _ => panic!("not a NUMSUB reply: {reply:?}"),
    }
}

fn first_channel(reply: &redis::Value) -> Option<String> {
    match reply {
        redis::Value::Array(v) => v.first().and_then(|c| match c {
            redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
            _ => None,
        }),
        _ => None,
    }
}

/// The channel a waiter on `key` listens on, once it has subscribed on `node` (sharded):
/// its own waiter channel (plain), Redisson's channel (reentrant).
async fn await_shard_channel(node: &RedisServer, key: &str, reentrant: bool) -> String {
    let pattern = if reentrant {
        ferrolock::__wire::redisson_channel(key)
    } else {
        format!("{}*", ferrolock::__wire::waiter_channel_prefix(key))
    };
    await_pubsub(
        node,
        &["SHARDCHANNELS", &pattern],
        Duration::from_secs(30),
        &format!("a sharded subscription to {pattern}"),
        first_channel,
    )
    .await
}

/// Sharded pub/sub (issue 19): the waiter SSUBSCRIBEs its channel on the primary of its key's
/// slot (not the seed, and no classic subscription anywhere), and the release's SPUBLISH
/// there wakes it, far sooner than its 30 s `retry_delay` or the holder's 120 s ttl would.
/// Plain and reentrant (Redisson's channel, which Redisson in cluster mode SSUBSCRIBEs too).
#[tokio::test]
async fn a_waiter_is_woken_over_sharded_pubsub_on_its_keys_primary() {
    let _serial = serial();
    let cluster = RedisCluster::start();
    let url = cluster.url();
    for reentrant in [false, true] {
        let key = cluster
            .key_per_primary(&format!("sharded-{reentrant}"))
            .into_iter()
            .find(|k| owner(&cluster, k).port() != cluster.nodes[0].port())
            .unwrap();
        let primary = owner(&cluster, &key);
        let holder = manager(
            std::slice::from_ref(&url),
            opts().ttl(Duration::from_secs(120)).reentrant(reentrant),
        );
        let waiting = manager(
            std::slice::from_ref(&url),
            opts()
                .ttl(Duration::from_secs(120))
                .retry_delay(Duration::from_secs(30))
                .node_timeout(WOKEN_ATTEMPT)
                .reentrant(reentrant),
        );
        let held = holder.acquire(&key).await.unwrap();
        let k = key.clone();
        let waiter = tokio::spawn(async move { waiting.acquire(&k).await.map(|l| (l, waiting)) });
        let channel = await_shard_channel(primary, &key, reentrant).await;
        let shard: redis::Value = primary.cmd(&["PUBSUB", "SHARDNUMSUB", &channel]);
        assert_eq!(count_of(&shard), 1, "{channel}: {shard:?}");
        for node in cluster.primaries() {
            let classic: redis::Value = node.cmd(&["PUBSUB", "NUMSUB", &channel]);
            assert_eq!(
                count_of(&classic),
                0,
                "{channel}: a classic subscription on port {}",
                node.port()
            );
            if node.port() != primary.port() {
                let other: redis::Value = node.cmd(&["PUBSUB", "SHARDNUMSUB", &channel]);
                assert_eq!(count_of(&other), 0, "{channel} on port {}", node.port());
            }
        }
        let released = std::time::Instant::now();
        held.release().await.unwrap();
        // A failure bound: without a wake-up the next poll is at least 15 s away (30 s
        // jittered ±50 %), the holder's ttl 120 s.
        let (lock, _m) = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .unwrap_or_else(|_| panic!("reentrant {reentrant}: the waiter was not woken"))
            .unwrap()
            .unwrap();
        eprintln!(
            "reentrant {reentrant}: granted {:?} after the release",
            released.elapsed()
        );
        assert!(lock.is_held());
        lock.release().await.unwrap();
    }
}

/// A semaphore on a cluster with sharded pub/sub: its waiter SSUBSCRIBEs Redisson's channel
/// on the name's primary, so the release and the reclaim must SPUBLISH there (a classic
/// PUBLISH reaches no sharded subscriber: the waiter would sleep until its re-check, the
/// holder's lease end, 120 s away, or its 30 s `retry_delay`).
#[tokio::test]
async fn a_semaphore_waiter_is_woken_over_sharded_pubsub() {
    let _serial = serial();
    let cluster = RedisCluster::start();
    let url = cluster.url();
    let lease = opts().ttl(Duration::from_secs(120));
    let waiting_opts = lease
        .clone()
        .retry_delay(Duration::from_secs(30))
        .node_timeout(WOKEN_ATTEMPT)
        .wait(Some(Duration::from_secs(60)));
    let name = cluster
        .key_per_primary("sharded-semaphore")
        .into_iter()
        .find(|k| owner(&cluster, k).port() != cluster.nodes[0].port())
        .unwrap();
    let primary = owner(&cluster, &name);
    let channel = format!("redisson_sc:{{{name}}}");
    let holder = manager(std::slice::from_ref(&url), lease.clone());
    let waiting = Arc::new(manager(std::slice::from_ref(&url), waiting_opts.clone()));
    let held = holder.semaphore_with(&name, 1, 1, &lease).await.unwrap();
    let wait_for_permit = |m: Arc<LockManager>| {
        let (name, o) = (name.clone(), waiting_opts.clone());
        tokio::spawn(async move { m.semaphore_with(&name, 1, 1, &o).await })
    };
    let waiter = wait_for_permit(waiting.clone());
    await_pubsub(
        primary,
        &["SHARDCHANNELS", &channel],
        Duration::from_secs(30),
        &format!("a sharded subscription to {channel}"),
        first_channel,
    )
    .await;
    for node in cluster.primaries() {
        let classic: redis::Value = node.cmd(&["PUBSUB", "NUMSUB", &channel]);
        assert_eq!(
            count_of(&classic),
            0,
            "{channel}: classic on port {}",
            node.port()
        );
    }
    // Past the waiter's first refusal: queued, with its next re-check far away.
    await_one_queued(primary, &name).await;
    let released = std::time::Instant::now();
    assert!(held.release().await.unwrap());
    // A failure bound: without a wake-up the waiter's next look is 15 s away or more.
    let permit = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the semaphore waiter was not woken by the release")
        .unwrap()
        .unwrap();
    eprintln!("release: granted {:?} after it", released.elapsed());

    // A reclaim publishes too. The permit's holder "crashed": its lease is cut to its end by
    // hand, and a first try past the queued waiter's barging bound reclaims it, is refused (the
    // head's turn), and must wake the waiter.
    let waiter = wait_for_permit(waiting.clone());
    await_one_queued(primary, &name).await;
    tokio::time::sleep(ms(300)).await;
    let timeout_key = format!("{{{name}}}:timeout");
    let ids: Vec<Vec<u8>> = primary.cmd(&["ZRANGE", &timeout_key, "0", "-1"]);
    assert_eq!(ids.len(), 1);
    let cut: i64 = redis::cmd("ZADD")
        .arg(&timeout_key)
        .arg("XX")
        .arg("CH")
        .arg(1)
        .arg(ids[0].as_slice())
        .query(&mut primary.client())
        .unwrap();
    assert_eq!(cut, 1, "the lease was not cut");
    // One try of a new manager (it connects first): a node timeout for a loaded machine, as
    // what is checked is how it is answered (and that it wakes the waiter), not how fast.
    let slow = lease.clone().node_timeout(Duration::from_secs(5));
    let third = manager(std::slice::from_ref(&url), slow.clone());
    let first_try = slow.wait(Some(Duration::ZERO));
    let err = third
        .semaphore_with(&name, 1, 1, &first_try)
        .await
        .expect_err("a first try took the queued head's turn");
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    let reclaimed = std::time::Instant::now();
    let second = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the semaphore waiter was not woken by the reclaim")
        .unwrap()
        .unwrap();
    eprintln!("reclaim: granted {:?} after it", reclaimed.elapsed());
    assert!(
        !permit.release().await.unwrap(),
        "the reclaimed permit went back twice"
    );
    assert!(second.release().await.unwrap());
}

/// Starts moving `key`'s slot from its primary to another by hand: SETSLOT
/// IMPORTING/MIGRATING, MIGRATE of every key in the slot, and SETSLOT NODE on the target, which
/// then serves the slot (the source redirects to it with ASK). Returns (source, target);
/// `finish_move` ends it.
fn start_move<'a>(cluster: &'a RedisCluster, key: &str) -> (&'a RedisServer, &'a RedisServer) {
    let source = owner(cluster, key);
    let target = cluster
        .primaries()
        .iter()
        .find(|p| p.port() != source.port())
        .unwrap();
    mark_migrating(source, target, key);
    while migrate_one_key(source, target, key) {}
    serve_slot_on(target, key);
    (source, target)
}

/// SETSLOT NODE on the other primaries: the source gives the slot up (and drops its
/// sharded subscriptions to the slot's channels, telling their clients `sunsubscribe`).
fn finish_move(cluster: &RedisCluster, key: &str, target: &RedisServer) {
    let slot_arg = key_slot(key).to_string();
    let target_id = node_id(target);
    for node in cluster
        .primaries()
        .iter()
        .filter(|p| p.port() != target.port())
    {
        let ok: String = node.cmd(&["CLUSTER", "SETSLOT", &slot_arg, "NODE", &target_id]);
        assert_eq!(ok, "OK");
    }
}

fn node_id(node: &RedisServer) -> String {
    node.cmd(&["CLUSTER", "MYID"])
}

/// Splits `key`'s slot by hand: the slot marked migrating, then MIGRATE of `key` alone, so
/// that the slot's other keys stay on the source (a script naming both meets TRYAGAIN).
/// `move_rest_of_slot` ends it.
fn split_slot(source: &RedisServer, target: &RedisServer, key: &str) {
    mark_migrating(source, target, key);
    migrate(source, target, key);
}

/// Moves the rest of `key`'s split slot to `target`, key by key with `pause` after each, then
/// SETSLOT NODE on the target (`finish_move` tells the other primaries).
async fn move_rest_of_slot(source: &RedisServer, target: &RedisServer, key: &str, pause: Duration) {
    while migrate_one_key(source, target, key) {
        tokio::time::sleep(pause).await;
    }
    serve_slot_on(target, key);
}

/// SETSLOT IMPORTING on `target` and MIGRATING on `source` for `key`'s slot.
fn mark_migrating(source: &RedisServer, target: &RedisServer, key: &str) {
    let slot_arg = key_slot(key).to_string();
    let (source_id, target_id) = (node_id(source), node_id(target));
    let ok: String = target.cmd(&["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &source_id]);
    assert_eq!(ok, "OK");
    let ok: String = source.cmd(&["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &target_id]);
    assert_eq!(ok, "OK");
}

fn migrate(source: &RedisServer, target: &RedisServer, key: &str) {
    let port = target.port().to_string();
    let moved: String = source.cmd(&["MIGRATE", "127.0.0.1", &port, key, "0", "5000"]);
    assert_eq!(moved, "OK", "MIGRATE {key}");
}

/// Migrates one key of `key`'s slot still on `source`; false once none is left.
fn migrate_one_key(source: &RedisServer, target: &RedisServer, key: &str) -> bool {
    let slot_arg = key_slot(key).to_string();
    let keys: Vec<String> = source.cmd(&["CLUSTER", "GETKEYSINSLOT", &slot_arg, "1"]);
    let Some(k) = keys.first() else { return false };
    migrate(source, target, k);
    true
}

/// SETSLOT NODE on the target, which then serves `key`'s slot.
fn serve_slot_on(target: &RedisServer, key: &str) {
    let slot_arg = key_slot(key).to_string();
    let ok: String = target.cmd(&["CLUSTER", "SETSLOT", &slot_arg, "NODE", &node_id(target)]);
    assert_eq!(ok, "OK");
}

/// A slot moved while a waiter listens on its channel: Redis 7.0 sends the waiter
/// `sunsubscribe` from the old primary, and redis-rs forgets the channel. The waiter
/// subscribes again (on the new primary, as redis-rs routes it) and re-checks. Two releases:
/// one after the move, heard on the new subscription; one published on the new primary while
/// the waiter still listened on the old one (between the target's SETSLOT NODE and the
/// source's), which only the re-check after the resubscription can catch. Each wakes the
/// waiter long before its 30 s `retry_delay` (15 s at the least) or the 120 s ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_slot_moves_subscribes_again_and_is_woken() {
    let _serial = serial();
    let cluster = RedisCluster::start();
    let url = cluster.url();
    for in_gap in [false, true] {
        let key = format!("moving-waiter-{in_gap}");
        let holder = manager(
            std::slice::from_ref(&url),
            opts().ttl(Duration::from_secs(120)),
        );
        let waiting = manager(
            std::slice::from_ref(&url),
            opts()
                .ttl(Duration::from_secs(120))
                .retry_delay(Duration::from_secs(30))
                .node_timeout(WOKEN_ATTEMPT),
        );
        let held = holder.acquire(&key).await.unwrap();
        let k = key.clone();
        let waiter = tokio::spawn(async move { waiting.acquire(&k).await.map(|l| (l, waiting)) });
        let source = owner(&cluster, &key);
        let channel = await_shard_channel(source, &key, false).await;
        let (_, target) = start_move(&cluster, &key);
        let released = std::time::Instant::now();
        if in_gap {
            // Sent to the source (redis-rs's map), redirected with ASK: it runs, and
            // publishes, on the target, where the waiter is not subscribed yet (unless the
            // source has already learnt of the move from the target's gossip, which a
            // test cannot hold back: then this is the first case again).
            assert!(held.release().await.unwrap(), "the holder's release");
        }
        finish_move(&cluster, &key, target);
        assert_eq!(owner(&cluster, &key).port(), target.port());
        // The old primary dropped the subscription with the slot.
        let left: redis::Value = source.cmd(&["PUBSUB", "SHARDNUMSUB", &channel]);
        assert_eq!(count_of(&left), 0, "{channel} still on the old primary");
        if !in_gap {
            assert!(held.release().await.unwrap(), "the holder's release");
        }
        let (lock, _m) = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .unwrap_or_else(|_| {
                panic!("in gap {in_gap}: the waiter was not woken after its slot moved")
            })
            .unwrap()
            .unwrap();
        eprintln!(
            "in gap {in_gap}: granted {:?} after the release",
            released.elapsed()
        );
        assert_eq!(get(target, &key).as_deref(), Some(lock.token()));
        lock.release().await.unwrap();
    }
}

/// Redisson's channel stays as Redisson names it; for a key with a `{` that starts no hash
/// tag it is in another slot than the key, where the release's SPUBLISH would be refused.
/// Such a reentrant key is refused before any I/O; with `sharded_pubsub` off it works.
#[tokio::test]
async fn a_reentrant_key_whose_redisson_channel_is_in_another_slot_is_refused() {
    let _serial = serial();
    let cluster = RedisCluster::start();
    let url = cluster.url();
    let key = "orders{42";
    assert_ne!(
        key_slot(key),
        key_slot(&ferrolock::__wire::redisson_channel(key))
    );
    let m = manager(std::slice::from_ref(&url), opts().reentrant(true));
    let err = m.acquire(key).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let text = err.to_string();
    assert!(text.contains(key), "{text}");
    assert!(text.contains("redisson_lock__channel:orders{42"), "{text}");
    assert!(text.contains("sharded_pubsub"), "{text}");
    assert_eq!(
        owner(&cluster, key).cmd::<i64>(&["EXISTS", key]),
        0,
        "nothing was written"
    );
    // A plain lock on the key is fine (its channels carry the key's slot), and so is a
    // reentrant one with classic pub/sub.
    m.acquire_with(key, &opts())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let classic = classic_manager(std::slice::from_ref(&url), opts().reentrant(true));
    let lock = classic.acquire(key).await.unwrap();
    assert!(lock.release().await.unwrap());
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

/// Two seeds of one cluster given as two nodes are one cluster's vote counted twice: a
/// quorum of 2 of 2 (or 2 of 3) was then that cluster's say alone. The primaries' node ids
/// in the slot map tell when a connection opens, and the second gets no request, as a server
/// reached by two URLs (`basics::a_server_reached_by_two_urls_votes_once`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_seeds_of_one_cluster_given_as_two_nodes_vote_once() {
    let _serial = serial();
    let cluster = RedisCluster::start_with(ClusterOptions {
        acl_users: vec!["user locker on >s3cret ~* &* +@all".into()],
        ..ClusterOptions::default()
    });
    let seed = |i: usize| {
        format!(
            "redis+cluster://locker:s3cret@127.0.0.1:{}",
            cluster.nodes[i].port()
        )
    };
    let shown = |i: usize| {
        format!(
            "redis+cluster://locker:***@127.0.0.1:{}",
            cluster.nodes[i].port()
        )
    };
    let key = "one-cluster";
    let m = manager(&[seed(0), seed(1)], opts().wait(Some(Duration::ZERO)));
    let err = match m.acquire(key).await {
        Ok(lock) => panic!(
            "granted by one cluster's two votes (quorum {} of {:?}), token {}",
            m.quorum(),
            m.node_names(),
            lock.token()
        ),
        Err(e) => e,
    };
    // A misconfiguration, refused as a server named twice is: a Redis error naming both.
    assert_eq!(err.kind(), ErrorKind::Redis, "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&shown(0)) && text.contains(&shown(1)) && text.contains("same cluster"),
        "{text}"
    );
    assert!(!text.contains("s3cret"), "{text}");
    assert_eq!(get(owner(&cluster, key), key), None, "the grant was undone");

    // Beside an independent server: the cluster and that server are a quorum of 2 of 3; with
    // the server down, the cluster alone is none.
    let mut other = RedisServer::start();
    let m = manager(
        &[seed(0), seed(2), other.url()],
        opts().wait(Some(Duration::ZERO)),
    );
    let lock = m
        .acquire(key)
        .await
        .expect("the cluster and the server are a quorum");
    assert!(lock.release().await.unwrap());
    other.kill();
    assert!(!other.is_running());
    match m.acquire(key).await {
        Ok(lock) => panic!(
            "granted by one cluster's two votes of 3 nodes, token {}",
            lock.token()
        ),
        Err(e) => assert_eq!(e.kind(), ErrorKind::Redis, "{e}"),
    }
    assert_eq!(get(owner(&cluster, key), key), None, "the grant was undone");

    // The cluster once, and plain URLs to its primaries beside it: each plain one is refused
    // as a cluster node, so the cluster's vote is not counted again through them.
    let plain = |i: usize| {
        format!(
            "redis://locker:s3cret@127.0.0.1:{}",
            cluster.nodes[i].port()
        )
    };
    let m = manager(
        &[seed(0), plain(1), plain(2)],
        opts().wait(Some(Duration::ZERO)),
    );
    match m.acquire(key).await {
        Ok(lock) => panic!(
            "granted through a cluster's primaries, token {}",
            lock.token()
        ),
        Err(e) => assert!(e.to_string().contains("is a Redis Cluster node"), "{e}"),
    }
    assert_eq!(get(owner(&cluster, key), key), None, "the grant was undone");
}

/// Two seeds of one cluster whose connections are a failover of every primary apart: their
/// slot maps share no primary, and both votes counted (the first connection follows the
/// failovers without opening again, so it keeps its claim). The replicas in the maps tell:
/// each promoted replica is in both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_seeds_of_one_cluster_connected_a_failover_apart_vote_once() {
    let _serial = serial();
    let cluster = RedisCluster::start_with(ClusterOptions {
        replicas: 1,
        ..ClusterOptions::default()
    });
    // Redis 7 lists a replica in CLUSTER SLOTS once its replication offset has reached the
    // other nodes (gossip, seconds after its sync): before, a map has no replica to share.
    let replicas_listed = || {
        let slots: redis::Value = cluster.nodes[0].cmd(&["CLUSTER", "SLOTS"]);
        matches!(&slots, redis::Value::Array(ranges) if ranges.len() == 3
            && ranges.iter().all(|r| matches!(r, redis::Value::Array(f) if f.len() >= 4)))
    };
    let listed_by = std::time::Instant::now() + Duration::from_secs(60);
    while !replicas_listed() {
        assert!(
            std::time::Instant::now() < listed_by,
            "CLUSTER SLOTS never listed the replicas"
        );
        tokio::time::sleep(ms(100)).await;
    }
    // The second seed cannot connect until every primary has failed over.
    let late = ferrolock_testbed::Proxy::start(cluster.nodes[1].port());
    late.cut();
    let mut other = RedisServer::start();
    let urls = [
        format!("redis+cluster://127.0.0.1:{}", cluster.nodes[0].port()),
        format!("redis+cluster://127.0.0.1:{}", late.port()),
        other.url(),
    ];
    let m = manager(&urls, opts().wait(Some(Duration::ZERO)));
    let key = "failed-over";
    let lock = m
        .acquire(key)
        .await
        .expect("the first seed and the server are a quorum");
    assert!(lock.release().await.unwrap());
    let before: Vec<u16> = cluster.primaries().iter().map(|p| p.port()).collect();
    for port in &before {
        let primary = &cluster.nodes[cluster.index_of_port(*port)];
        let replica = cluster.replicas_of(primary)[0];
        cluster.failover(replica, None);
    }
    let now: Vec<u16> = cluster
        .current_primaries()
        .iter()
        .map(|p| p.port())
        .collect();
    assert!(
        now.iter().all(|p| !before.contains(p)),
        "every primary failed over: {before:?} then {now:?}"
    );
    late.heal();
    other.kill();
    assert!(!other.is_running());
    match m.acquire(key).await {
        Ok(lock) => panic!(
            "granted by one cluster's two votes of 3 nodes, token {}",
            lock.token()
        ),
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Redis, "{e}");
            assert!(e.to_string().contains("same cluster"), "{e}");
        }
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
    let keys = cluster.key_per_primary("partial");
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
    // m's one try connects first, through the extra seed: a node timeout for a loaded machine
    // (and a ttl that allows it), as what is checked is that it connects, not how fast.
    let m = manager(
        &[url],
        opts()
            .wait(Some(Duration::ZERO))
            .ttl(Duration::from_secs(60))
            .node_timeout(Duration::from_secs(5)),
    );
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

/// A cluster connect that takes longer than the node timeout (a CPU-starved host; here, a seed
/// 300 ms away each way) goes on past the attempt that started it, and a later attempt of the
/// same acquire joins it. Started afresh by each attempt, it never finished, and the acquire
/// ended `QuorumUnreachable` after three attempts however long it could wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_connect_slower_than_the_node_timeout_is_joined_by_the_next_attempt() {
    let _serial = serial();
    let (cluster, seed, m) = slow_seed();
    let started = tokio::time::Instant::now();
    let lock = m.acquire_with("joined", &joining_attempts()).await;
    check_joined(&cluster, &seed, started.elapsed(), lock).await;
}

/// The same on a blocking caller's thread (Python's `with`, C, Go), whose connect runs on the
/// thread's own runtime between its attempts.
#[test]
fn a_blocking_callers_slow_cluster_connect_is_joined_by_its_next_attempt() {
    let _serial = serial();
    let (cluster, seed, m) = slow_seed();
    let started = std::time::Instant::now();
    let lock = ferrolock::runtime::block_on(m.acquire_with("joined", &joining_attempts()));
    ferrolock::runtime::block_on(check_joined(&cluster, &seed, started.elapsed(), lock));
}

/// A request that joins a connect started by one with a shorter node timeout waits for it as
/// long as its own node timeout allows: the connect was cut at the starter's limit (10 of its
/// node timeouts, 2 s at the least), and the patient request failed after 2 s, where it had
/// connected on its own before connects were joined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_connect_joined_by_a_more_patient_request_goes_on_for_it() {
    let _serial = serial();
    let cluster = RedisCluster::start_with(ClusterOptions {
        primaries: 1,
        ..ClusterOptions::default()
    });
    let seed = ferrolock_testbed::Proxy::start(cluster.nodes[0].port());
    // Two round trips to the seed: longer than the short request's background limit (2 s).
    let delay = Duration::from_millis(600);
    seed.set_delay(delay);
    let m = manager(
        &[format!("redis+cluster://127.0.0.1:{}", seed.port())],
        opts()
            .ttl(Duration::from_secs(60))
            .node_timeout(Duration::from_secs(10)),
    );
    let started = tokio::time::Instant::now();
    let short = opts()
        .ttl(Duration::from_secs(60))
        .node_timeout(Duration::from_millis(200))
        .wait(Some(Duration::ZERO));
    let e = m
        .acquire_with("patient", &short)
        .await
        .expect_err("connected within 200 ms");
    // The connect's own timeout, or the request's deadline if that fires first (a loaded
    // host): either way no reply came in time.
    assert!(
        e.to_string().contains("timed out") || e.to_string().contains("no reply within"),
        "{e}"
    );
    let patient = opts()
        .ttl(Duration::from_secs(90))
        .node_timeout(Duration::from_secs(10))
        .wait(Some(Duration::ZERO));
    let lock = m
        .acquire_with("patient", &patient)
        .await
        .unwrap_or_else(|e| panic!("the patient request did not wait for the connect: {e}"));
    assert!(
        seed.chunks_read(ferrolock_testbed::Direction::Up) >= 2,
        "the connect did not go through the delayed seed"
    );
    assert!(
        started.elapsed() >= 4 * delay,
        "connected in {:?}, faster than two round trips to the seed",
        started.elapsed()
    );
    assert_eq!(
        get(&cluster.nodes[0], "patient").as_deref(),
        Some(lock.token())
    );
    assert!(lock.release().await.unwrap());
}

const SEED_DELAY: Duration = Duration::from_millis(300);

/// Less than the two round trips to the seed (handshake, slot map) a connect needs.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);

/// A one-primary cluster, a proxy to it that delays each way by `SEED_DELAY`, and a manager
/// seeded by the proxy alone. Each connection, handshake included, may take half the manager's
/// node timeout (5 s here), so the seed's own connection is never given up.
fn slow_seed() -> (RedisCluster, ferrolock_testbed::Proxy, LockManager) {
    let cluster = RedisCluster::start_with(ClusterOptions {
        primaries: 1,
        ..ClusterOptions::default()
    });
    let seed = ferrolock_testbed::Proxy::start(cluster.nodes[0].port());
    seed.set_delay(SEED_DELAY);
    let m = manager(
        &[format!("redis+cluster://127.0.0.1:{}", seed.port())],
        opts()
            .ttl(Duration::from_secs(60))
            .node_timeout(Duration::from_secs(10)),
    );
    (cluster, seed, m)
}

fn joining_attempts() -> LockOptions {
    opts()
        .ttl(Duration::from_secs(60))
        .node_timeout(ATTEMPT_TIMEOUT)
        .wait(Some(Duration::from_secs(60)))
}

async fn check_joined(
    cluster: &RedisCluster,
    seed: &ferrolock_testbed::Proxy,
    elapsed: Duration,
    lock: ferrolock::Result<ferrolock::Lock>,
) {
    let lock = lock.unwrap_or_else(|e| panic!("the acquire never joined the slow connect: {e}"));
    // The fault: the connect went through the delayed seed, and no one attempt could have
    // connected within its own node timeout.
    assert!(
        seed.chunks_read(ferrolock_testbed::Direction::Up) >= 2,
        "the connect did not go through the delayed seed"
    );
    assert!(
        elapsed >= 4 * SEED_DELAY && 4 * SEED_DELAY > ATTEMPT_TIMEOUT,
        "connected in {elapsed:?}, faster than two round trips to the seed"
    );
    assert_eq!(
        get(&cluster.nodes[0], "joined").as_deref(),
        Some(lock.token())
    );
    assert!(lock.release().await.unwrap());
}

/// `count` of `errorstat_<code>` in `INFO errorstats` on `node`.
fn error_count(node: &RedisServer, code: &str) -> u64 {
    let info: String = node.cmd(&["INFO", "errorstats"]);
    info.lines()
        .find_map(|l| l.trim().strip_prefix(&format!("errorstat_{code}:count=")))
        .map(|v| v.parse().unwrap())
        .unwrap_or(0)
}

/// PTTL of `key` on a node importing its slot (after ASKING): -2 once it is gone there.
fn pttl_importing(node: &RedisServer, key: &str) -> i64 {
    let mut conn = node.client();
    redis::cmd("ASKING").query::<()>(&mut conn).unwrap();
    redis::cmd("PTTL").arg(key).query(&mut conn).unwrap()
}

/// Issue 29 item 3: waiters across a slot migrated by hand (SETSLOT IMPORTING/MIGRATING, then
/// MIGRATE key by key with pauses, then SETSLOT NODE), all with a 30 s `retry_delay`. The
/// lock key moves first, so the slot is split: every script of the queue (its keys on the
/// source, the lock key on the target) meets TRYAGAIN or ASK. Meanwhile the first waiter
/// in the server queue is cancelled (its dequeue meets TRYAGAIN: its id stays at the head for
/// now), and the holder's lock expires (every other waiter's attempt meets TRYAGAIN). Each of
/// the four other waiters must be granted in turn within a wait budget well under 3 ×
/// retry_delay, with no migration error reaching it, and no id of ours may be left in the
/// queue. (Seen failing before: the waiters ended with `TryAgain`/`Ask` errors; the cancelled
/// waiter's id, dequeued once inside the window, held the head for its 90 s lease.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_across_a_slot_migration_are_granted_in_turn_and_orphan_no_queue_head() {
    let _serial = serial();
    let cluster = RedisCluster::start();
    let url = cluster.url();
    let key = "migrating-queue".to_string();
    let queue = ferrolock::__wire::KeyNames::of(&key).queue;
    let slot_arg = key_slot(&key).to_string();
    let source = owner(&cluster, &key);
    let target = cluster
        .primaries()
        .iter()
        .find(|p| p.port() != source.port())
        .unwrap();
    let retry_delay = Duration::from_secs(30);
    let wait = Duration::from_secs(40);
    // A node timeout for a loaded machine (CI's may be): three attempts in a row unanswered
    // within the default 200 ms end an acquire, and what is checked here is how the
    // migration is answered, not how fast (2 s: under a sixth of the holder's 15 s ttl).
    let slow = Duration::from_secs(2);
    let waiting = || {
        manager(
            std::slice::from_ref(&url),
            opts()
                .ttl(Duration::from_secs(60))
                .retry_delay(retry_delay)
                .wait(Some(wait))
                .node_timeout(slow),
        )
    };
    let queue = &queue;
    let queued = |n: i64| async move {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let len: i64 = source.cmd(&["ZCARD", queue]);
            if len >= n {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "{len} of {n} queued");
            tokio::time::sleep(ms(20)).await;
        }
    };
    // Expires (no watchdog) while the slot is split.
    let hold = Duration::from_secs(15);
    let holder = manager(
        std::slice::from_ref(&url),
        opts().ttl(hold).node_timeout(slow),
    );
    let held = holder.acquire(&key).await.unwrap();
    let quitter = {
        let (m, k) = (waiting(), key.clone());
        tokio::spawn(async move { m.acquire(&k).await.map(|l| (l, m)) })
    };
    queued(1).await;
    let first: Vec<String> = source.cmd(&["ZRANGE", queue, "0", "0"]);
    let busy = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let contenders: Vec<_> = (0..4)
        .map(|i| {
            let (m, k, busy) = (waiting(), key.clone(), busy.clone());
            tokio::spawn(async move {
                let l = m
                    .acquire(&k)
                    .await
                    .unwrap_or_else(|e| panic!("contender {i}: {e}"));
                assert!(!busy.swap(true, Ordering::SeqCst), "two holders at once");
                tokio::time::sleep(ms(200)).await;
                busy.store(false, Ordering::SeqCst);
                assert!(l.release().await.unwrap(), "contender {i}'s release");
            })
        })
        .collect();
    queued(5).await;
    assert!(
        pttl(source, &key) > 1000,
        "the holder's lock ran out before the migration started (machine too slow)"
    );

    // The split: the lock key on the target, the queue on the source.
    split_slot(source, target, &key);
    assert_eq!(get_importing(target, &key).as_deref(), Some(held.token()));
    // The first waiter gives up inside the window: its dequeue cannot land yet.
    let tryagain = error_count(source, "TRYAGAIN");
    quitter.abort();
    assert!(quitter.await.unwrap_err().is_cancelled());
    tokio::time::sleep(ms(500)).await;
    let head: Vec<String> = source.cmd(&["ZRANGE", queue, "0", "0"]);
    assert_eq!(
        head, first,
        "the cancelled waiter's dequeue landed mid-migration"
    );
    assert!(
        error_count(source, "TRYAGAIN") > tryagain,
        "its dequeue never met TRYAGAIN"
    );
    // The holder's lock expires on the target; the waiters' attempts meet TRYAGAIN.
    let deadline = std::time::Instant::now() + hold + Duration::from_secs(30);
    while pttl_importing(target, &key) != -2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the lock never expired"
        );
        tokio::time::sleep(ms(50)).await;
    }
    let tryagain = error_count(source, "TRYAGAIN") + error_count(source, "ASK");
    tokio::time::sleep(ms(1000)).await;
    assert!(
        error_count(source, "TRYAGAIN") + error_count(source, "ASK") > tryagain,
        "no attempt met the migrating slot"
    );
    // The rest of the slot, key by key, with pauses; then the target owns it, then the rest.
    move_rest_of_slot(source, target, &key, ms(300)).await;
    tokio::time::sleep(ms(500)).await;
    finish_move(&cluster, &key, target);
    assert_eq!(owner(&cluster, &key).port(), target.port());
    for (i, c) in contenders.into_iter().enumerate() {
        c.await
            .unwrap_or_else(|e| panic!("contender {i} failed: {e}"));
    }
    // Nothing of ours left in the queue, and nothing of the slot on the source.
    let left: Vec<String> = target.cmd(&["ZRANGE", queue, "0", "-1"]);
    assert!(left.is_empty(), "orphaned in the queue: {left:?}");
    let left: i64 = source.cmd(&["CLUSTER", "COUNTKEYSINSLOT", &slot_arg]);
    assert_eq!(left, 0);
    drop(held);
}

/// A semaphore whose slot is split by a migration (its counter moved, its leases not): every
/// attempt meets TRYAGAIN, past redis-rs's own retries. As for a lock, that never ends an
/// acquire with wait left (it tries again soon, not after its 30 s `retry_delay`), and a try
/// (`wait` 0) is `NotAcquired` naming the migration, not a Redis error. Once the slot has
/// moved, the waiting acquire is granted the free permit. (Seen failing before: both ended at
/// once with a Redis error, `slot migrating: TryAgain`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_acquire_waits_out_a_slot_migration() {
    let _serial = serial();
    let cluster = RedisCluster::start();
    let url = cluster.url();
    let name = "migrating-pool".to_string();
    let source = owner(&cluster, &name);
    let target = cluster
        .primaries()
        .iter()
        .find(|p| p.port() != source.port())
        .unwrap();
    let lease = opts().ttl(Duration::from_secs(60));
    let holder = manager(std::slice::from_ref(&url), lease.clone());
    let held = holder.semaphore_with(&name, 2, 1, &lease).await.unwrap();
    let timeouts = format!("{{{name}}}:timeout");
    assert_eq!(source.cmd::<i64>(&["ZCARD", &timeouts]), 1);

    // The split: the counter on the target, the leases on the source.
    split_slot(source, target, &name);

    let tryagain = error_count(source, "TRYAGAIN");
    // One try of a new manager (it connects first, then meets TRYAGAIN past redis-rs's
    // retries): a node timeout for a loaded machine, as what is checked is how it is
    // answered, not how fast.
    let slow = lease.clone().node_timeout(Duration::from_secs(5));
    let other = manager(std::slice::from_ref(&url), slow.clone());
    let err = other
        .semaphore_with(&name, 2, 1, &slow.wait(Some(Duration::ZERO)))
        .await
        .unwrap_err();
    assert!(
        error_count(source, "TRYAGAIN") > tryagain,
        "the try never met TRYAGAIN"
    );
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    assert!(err.message().contains("slot migrating"), "{err}");

    let waiting = lease
        .clone()
        .retry_delay(Duration::from_secs(30))
        .wait(Some(Duration::from_secs(60)));
    let waiter = {
        let (name, o) = (name.clone(), waiting.clone());
        tokio::spawn(async move {
            let got = other.semaphore_with(&name, 2, 1, &o).await;
            (got, other)
        })
    };
    // It meets the split for a while, and goes on waiting.
    let tryagain = error_count(source, "TRYAGAIN");
    tokio::time::sleep(ms(1500)).await;
    assert!(
        error_count(source, "TRYAGAIN") > tryagain,
        "the waiting acquire never met TRYAGAIN"
    );
    assert!(!waiter.is_finished(), "{:?}", waiter.await.unwrap().0.err());

    // The rest of the slot moves; then the target owns it everywhere.
    move_rest_of_slot(source, target, &name, Duration::ZERO).await;
    finish_move(&cluster, &name, target);
    let (got, _other) = waiter.await.unwrap();
    let permit = got.expect("the waiting acquire, once the slot moved");
    assert!(permit.release().await.unwrap());
    assert!(held.release().await.unwrap());
    assert_eq!(target.cmd::<i64>(&["GET", &name]), 2);
    assert_eq!(target.cmd::<i64>(&["ZCARD", &timeouts]), 0);
}

/// Locks of every kind (plain, reentrant, read, write) and a semaphore released while their
/// slot migrates: their keys are still on the source, each release's latch (not written yet)
/// would be on the target, so the source answers each script TRYAGAIN. Each release waits the
/// migration out within its validity, and lands once the slot has moved: it reports the
/// release, the keys are gone (the permit back in the pool), and another client is granted
/// each at once. (Seen failing before: each release ended at once with a Redis error, `slot
/// migrating: TryAgain`, and the keys stayed until their ttl.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_during_a_slot_migration_lands_once_the_slot_has_moved() {
    let _serial = serial();
    let cluster = RedisCluster::start();
    let url = cluster.url();
    // One slot: the semaphore's name is the lock keys' hash tag.
    let name = "migrating-release".to_string();
    let key = format!("{{{name}}}:lock");
    let keys = ["reentrant", "read", "write"].map(|k| format!("{{{name}}}:{k}"));
    let source = owner(&cluster, &key);
    assert_eq!(source.port(), owner(&cluster, &name).port());
    let target = cluster
        .primaries()
        .iter()
        .find(|p| p.port() != source.port())
        .unwrap();
    // A ttl far longer than the migration below takes on a loaded machine (a read lease is
    // capped at 30 s).
    let lease = opts().ttl(Duration::from_secs(30)).node_timeout(ms(500));
    let holder = manager(std::slice::from_ref(&url), lease.clone());
    let held = vec![
        ("lock", holder.acquire(&key).await.unwrap()),
        (
            "semaphore",
            holder.semaphore_with(&name, 1, 1, &lease).await.unwrap(),
        ),
        (
            "reentrant lock",
            holder
                .acquire_owned(&keys[0], 1, &lease.clone().reentrant(true))
                .await
                .unwrap(),
        ),
        ("read lock", holder.read_lock(&keys[1]).await.unwrap()),
        ("write lock", holder.write_lock(&keys[2]).await.unwrap()),
    ];

    mark_migrating(source, target, &key);
    let tryagain = error_count(source, "TRYAGAIN");
    let releases: Vec<_> = held
        .into_iter()
        .map(|(what, lock)| (what, tokio::spawn(async move { lock.release().await })))
        .collect();
    // The fault: each release met TRYAGAIN on the source.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while error_count(source, "TRYAGAIN") < tryagain + releases.len() as u64 {
        assert!(
            std::time::Instant::now() < deadline,
            "the releases never met TRYAGAIN"
        );
        tokio::time::sleep(ms(20)).await;
    }
    // The slot stays split past the releases' node timeout (and redis-rs's own retries).
    tokio::time::sleep(ms(1500)).await;

    // The slot moves (the keys with it), and the target owns it everywhere.
    move_rest_of_slot(source, target, &key, Duration::ZERO).await;
    finish_move(&cluster, &key, target);
    for (what, release) in releases {
        let released = tokio::time::timeout(Duration::from_secs(30), release)
            .await
            .unwrap_or_else(|_| panic!("the {what}'s release did not end once the slot had moved"))
            .unwrap();
        assert!(released.unwrap(), "the {what}'s release found it not ours");
    }
    for k in keys.iter().chain([&key]) {
        assert_eq!(target.cmd::<i64>(&["EXISTS", k]), 0, "{k}");
    }
    assert_eq!(target.cmd::<i64>(&["GET", &name]), 1);
    assert_eq!(
        target.cmd::<i64>(&["ZCARD", &format!("{{{name}}}:timeout")]),
        0
    );
    let once = opts()
        .wait(Some(Duration::ZERO))
        .ttl(Duration::from_secs(60))
        .node_timeout(Duration::from_secs(5));
    let other = manager(std::slice::from_ref(&url), once.clone());
    let next = other.try_acquire(&key).await.unwrap();
    assert!(next.release().await.unwrap());
    let next = other.semaphore_with(&name, 1, 1, &once).await.unwrap();
    assert!(next.release().await.unwrap());
    for k in &keys {
        let next = other.try_acquire(k).await.unwrap();
        assert!(next.release().await.unwrap());
    }
}

/// A read-write lock's names on a cluster: Redisson's read hold keys `{name}:<owner>:
/// rwlock_timeout:<n>` add no braces to a name that contains `{`, so a name with a `{` but no
/// valid hash tag (`a{b`, `a{}b`) would put them in another slot than the hash: both sides
/// refuse it with an error naming it, before any I/O, whatever the pub/sub; a name with a tag,
/// or none, keeps every hold key in the hash's slot.
#[tokio::test]
async fn rwlock_names_without_a_slot_for_their_hold_keys_are_refused_and_the_rest_share_one() {
    let _serial = serial();
    let cluster = RedisCluster::start();
    // Classic pub/sub: with sharded pub/sub, Redisson's channel of such a name is refused
    // first (`checks::check_redisson_channel`); the hold keys are refused either way.
    let m = classic_manager(&[cluster.url()], opts());
    for name in ["a{b", "a{}b", "x{"] {
        for write in [false, true] {
            let err = if write {
                m.write_lock(name).await.unwrap_err()
            } else {
                m.read_lock(name).await.unwrap_err()
            };
            assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{name}: {err}");
            assert!(err.to_string().contains(name), "{name}: {err}");
        }
    }
    for name in ["plain-rw", "{tag}rw", "a{tag}b{"] {
        let primary = owner(&cluster, name);
        let read = m.read_lock(name).await.unwrap();
        let holds: Vec<String> = primary.cmd(&["KEYS", "*rwlock_timeout*"]);
        assert!(!holds.is_empty(), "{name}: no read hold key");
        for hold in &holds {
            assert_eq!(key_slot(hold), key_slot(name), "{name}: {hold}");
        }
        read.release().await.unwrap();
        let write = m.write_lock(name).await.unwrap();
        assert_eq!(
            primary
                .cmd::<Option<String>>(&["HGET", name, "mode"])
                .as_deref(),
            Some("write"),
            "{name}"
        );
        write.release().await.unwrap();
        assert!(!primary.cmd::<bool>(&["EXISTS", name]), "{name}");
    }
}

/// One hung primary (SIGSTOPped: connections accepted, nothing answered, as behind a
/// black-holed link) must not cost the locks of the other primaries: they keep being renewed,
/// and a new manager still acquires their keys. The manager holds a lock on the hung primary
/// too: before, its renewal pipeline, never answered, cut the whole cluster's tick, and every
/// lock was lost with it (found by a review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_primary_leaves_the_other_primaries_locks_alone() {
    let _serial = serial();
    let cluster = RedisCluster::start_with(ClusterOptions {
        require_full_coverage: false,
        ..ClusterOptions::default()
    });
    let url = cluster.url();
    let keys = cluster.key_per_primary("hung");
    let hung = cluster.primary_for_key(&keys[2]);
    let healthy: Vec<&String> = keys
        .iter()
        .filter(|k| cluster.primary_for_key(k).port() != hung.port())
        .collect();
    // Renewed every 2 s, with the default 200 ms node timeout: a renewal that meets a slow
    // moment of a loaded machine is retried well before the lock's deadline.
    let ttl = Duration::from_secs(6);
    let m = manager(std::slice::from_ref(&url), LockOptions::default().ttl(ttl));
    let on_hung = m.acquire(&keys[2]).await.unwrap();
    let mut held = Vec::new();
    for k in &healthy {
        held.push(m.acquire(k).await.unwrap());
    }
    hung.pause();
    // Several renewal periods (ttl/3) and past the ttl itself.
    tokio::time::sleep(ttl * 2).await;
    for lock in &held {
        assert!(
            lock.is_held(),
            "{:?} was lost: {:?}",
            lock.key(),
            lock.status()
        );
    }
    // A new manager opens its connection now: the hung primary must not hold it up.
    let fresh = manager(
        std::slice::from_ref(&url),
        opts().wait(Some(Duration::from_secs(5))),
    );
    let k = (0..)
        .map(|i| format!("hung:fresh:{i}"))
        .find(|k| cluster.primary_for_key(k).port() == cluster.primary_for_key(healthy[0]).port())
        .unwrap();
    let lock = fresh
        .acquire(&k)
        .await
        .unwrap_or_else(|e| panic!("a healthy primary's key, with another primary hung: {e}"));
    assert!(lock.release().await.unwrap());
    // The fault happened: the hung primary's own lock could not be renewed.
    assert!(
        !on_hung.is_held(),
        "the lock on the hung primary was renewed"
    );
    hung.resume();
    drop(on_hung);
    for lock in held {
        assert!(lock.release().await.unwrap());
    }
}

/// A slot of read locks waiting out a migration (every read renewal there answered TRYAGAIN,
/// retried by redis-rs one renewal after another) must not cost a lock on another primary:
/// before, the cluster's whole renewal tick was cut at the node timeout, and a plain lock on
/// a third primary, in a slot nobody touched, was lost with the read locks (found by a
/// review). The defaults: ttl 10 s, node timeout 200 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migrating_slot_of_read_locks_costs_no_lock_on_another_primary() {
    let _serial = serial();
    let cluster = RedisCluster::start();
    let ttl = Duration::from_secs(10);
    let m = manager(&[cluster.url()], LockOptions::default());
    let tag = "{slow-slot}";
    let source = owner(&cluster, tag);
    let primaries = cluster.primaries();
    let target = primaries
        .iter()
        .find(|p| p.port() != source.port())
        .unwrap();
    let elsewhere = primaries
        .iter()
        .find(|p| p.port() != source.port() && p.port() != target.port())
        .unwrap();
    let far_key = (0..)
        .map(|i| format!("far:{i}"))
        .find(|k| owner(&cluster, k).port() == elsewhere.port())
        .unwrap();
    let far = m.acquire(&far_key).await.unwrap();
    let mut readers = Vec::new();
    for i in 0..10 {
        readers.push(m.read_lock(&format!("{tag}r{i}")).await.unwrap());
    }
    mark_migrating(source, target, tag);
    tokio::time::sleep(ttl + Duration::from_secs(2)).await;
    let far_status = far.status();
    let readers_held = readers.iter().filter(|r| r.is_held()).count();
    let slot = ferrolock_testbed::key_slot(tag).to_string();
    for node in [target, source] {
        let _: String = node.cmd(&["CLUSTER", "SETSLOT", &slot, "STABLE"]);
    }
    assert!(
        far.is_held(),
        "a lock on another primary was lost while a slot of read locks migrated ({readers_held} \
         of 10 read locks still held): {far_status:?}"
    );
}

/// The URL's only seed dies and its replica takes over: a waiter on a key of another shard,
/// in a manager connected before, still subscribes (through the primaries its manager last
/// saw, as its lock requests go) and is woken by the release long before its 30 s
/// `retry_delay` (15 s at the least) or the 120 s ttl. Before, the waiters' sharded
/// connection was seeded by the URL alone: it failed for as long as the seed was down, and
/// every waiter of the cluster slept until its timer (found by a review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_subscribes_and_is_woken_after_its_seed_died() {
    waiter_woken_after_its_seed_died(None).await;
}

/// As above with a node timeout of 5 s: its connect timeout (2.5 s), after which the waiters'
/// connection also tries the primaries last seen, is longer than the waiters' own bound on a
/// connect (2 s). Before, that bound cut every try before the fallback started, so the
/// waiters were never subscribed while the seed was down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_with_a_long_node_timeout_subscribes_after_its_seed_died() {
    waiter_woken_after_its_seed_died(Some(Duration::from_secs(5))).await;
}

async fn waiter_woken_after_its_seed_died(node_timeout: Option<Duration>) {
    let _serial = serial();
    let mut cluster = takeover_cluster();
    let url = cluster.url();
    let seed_port = cluster.nodes[0].port();
    let key = (0..)
        .map(|i| format!("dead-seed:{i}"))
        .find(|k| owner(&cluster, k).port() != seed_port)
        .unwrap();
    let primary_port = owner(&cluster, &key).port();
    let holder = manager(
        std::slice::from_ref(&url),
        opts().ttl(Duration::from_secs(120)),
    );
    let mut waiting_opts = opts()
        .ttl(Duration::from_secs(120))
        .retry_delay(Duration::from_secs(30));
    if let Some(t) = node_timeout {
        waiting_opts = waiting_opts.node_timeout(t);
    }
    let waiting = manager(std::slice::from_ref(&url), waiting_opts);
    // Both connect while the seed lives (tried until granted: a first try connects within
    // the node timeout, which a loaded machine can overrun).
    for m in [&holder, &waiting] {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let l = loop {
            match m.try_acquire(&key).await {
                Ok(l) => break l,
                Err(e) => assert!(
                    std::time::Instant::now() < deadline,
                    "never connected while the seed lived: {e}"
                ),
            }
            tokio::time::sleep(ms(100)).await;
        };
        assert!(l.release().await.unwrap());
    }
    let replica_port = cluster.replicas_of(&cluster.nodes[0])[0].port();
    cluster.nodes[0].kill();
    assert!(!cluster.nodes[0].is_running());
    let replica = cluster
        .nodes
        .iter()
        .find(|n| n.port() == replica_port)
        .unwrap();
    tokio::task::block_in_place(|| cluster.failover(replica, Some("TAKEOVER")));
    assert_eq!(role(replica), "master");

    let held = holder.acquire(&key).await.unwrap();
    let k = key.clone();
    let waiter = tokio::spawn(async move { waiting.acquire(&k).await.map(|l| (l, waiting)) });
    let primary = owner(&cluster, &key);
    assert_eq!(primary.port(), primary_port);
    await_shard_channel(primary, &key, false).await;
    let released = std::time::Instant::now();
    assert!(held.release().await.unwrap());
    let (lock, _m) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was not woken after its seed died")
        .unwrap()
        .unwrap();
    eprintln!("granted {:?} after the release", released.elapsed());
    assert_eq!(get(primary, &key).as_deref(), Some(lock.token()));
    assert!(lock.release().await.unwrap());
}

/// A primary dies (no replica takes over) while a manager waits on keys of two shards: the
/// waiters' connection cannot subscribe the dead shard's channel, and tries again and again.
/// A release on the live shard published while the connection was between two tries (nobody
/// subscribed) still wakes its waiter: every try that subscribes the live shard's channel
/// has its waiter re-check. Before, a try that failed for the dead shard confirmed nothing,
/// and that waiter slept until its 30 s `retry_delay` (15 s at the least; found by a review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_between_two_tries_to_subscribe_a_dead_shard_is_not_missed() {
    let _serial = serial();
    let mut cluster = RedisCluster::start_with(ClusterOptions {
        require_full_coverage: false,
        ..ClusterOptions::default()
    });
    let url = cluster.url();
    let seed_port = cluster.nodes[0].port();
    let keys = cluster.key_per_primary("dead-shard");
    let live_key = keys
        .iter()
        .find(|k| owner(&cluster, k).port() == seed_port)
        .unwrap()
        .clone();
    let dead_key = keys
        .iter()
        .find(|k| owner(&cluster, k).port() != seed_port)
        .unwrap()
        .clone();
    let dead = cluster
        .nodes
        .iter()
        .position(|n| n.port() == owner(&cluster, &dead_key).port())
        .unwrap();
    let holder = manager(
        std::slice::from_ref(&url),
        opts().ttl(Duration::from_secs(120)),
    );
    let waiting = manager(
        std::slice::from_ref(&url),
        opts()
            .ttl(Duration::from_secs(120))
            .retry_delay(Duration::from_secs(30)),
    );
    let held = holder.acquire(&live_key).await.unwrap();
    let _held_dead = holder.acquire(&dead_key).await.unwrap();
    let (w, k) = (waiting.clone(), dead_key.clone());
    let _dead_waiter = tokio::spawn(async move { w.acquire(&k).await });
    let (w, k) = (waiting.clone(), live_key.clone());
    let waiter = tokio::spawn(async move { w.acquire(&k).await });
    await_shard_channel(&cluster.nodes[dead], &dead_key, false).await;
    let channel = await_shard_channel(owner(&cluster, &live_key), &live_key, false).await;

    cluster.nodes[dead].kill();
    let live = owner(&cluster, &live_key);
    // Between two tries: nobody listens on the live shard's channel.
    let started = std::time::Instant::now();
    loop {
        let n: redis::Value = live.cmd(&["PUBSUB", "SHARDNUMSUB", &channel]);
        if count_of(&n) == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{channel} never left"
        );
        tokio::time::sleep(ms(1)).await;
    }
    assert!(held.release().await.unwrap());
    let lock = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the release between two tries was missed")
        .unwrap()
        .unwrap();
    assert_eq!(get(live, &live_key).as_deref(), Some(lock.token()));
}

/// The waiters' sharded connection pings each primary it listens on once a `LINGER` (1 s),
/// not each slot: 24 waiters on keys of 24 slots of one primary made 24 PINGs a second
/// there (found by a review). Counted on the primary (`INFO commandstats`) over 4 s of
/// waiting: a few, not dozens. A slower machine pings less, never more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiters_ping_each_primary_once_a_round_not_each_slot() {
    let _serial = serial();
    let cluster = RedisCluster::start();
    let url = cluster.url();
    let primary_port = owner(&cluster, "pings:0").port();
    let mut slots = std::collections::HashSet::new();
    let keys: Vec<String> = (0..)
        .map(|i| format!("pings:{i}"))
        .filter(|k| owner(&cluster, k).port() == primary_port)
        .filter(|k| slots.insert(primary_of_0(&cluster).cmd::<i64>(&["CLUSTER", "KEYSLOT", k])))
        .take(24)
        .collect();
    let long = opts()
        .ttl(Duration::from_secs(120))
        .retry_delay(Duration::from_secs(60));
    let holder = manager(std::slice::from_ref(&url), long.clone());
    let waiting = std::sync::Arc::new(manager(std::slice::from_ref(&url), long));
    let mut held = Vec::new();
    for k in &keys {
        held.push(holder.acquire(k).await.unwrap());
    }
    let mut waiters = Vec::new();
    for k in keys.clone() {
        let m = waiting.clone();
        waiters.push(tokio::spawn(async move { m.acquire(&k).await }));
    }
    let primary = owner(&cluster, &keys[0]);
    for k in &keys {
        await_shard_channel(primary, k, false).await;
    }
    let pings = || -> u64 {
        let stats: String = primary.cmd(&["INFO", "commandstats"]);
        stats
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_ping:calls="))
            .and_then(|r| r.split(',').next())
            .map_or(0, |n| n.parse().unwrap())
    };
    let before = pings();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let made = pings() - before;
    assert!(
        made <= 8,
        "{made} PINGs in 4 s on the primary of 24 waited-on slots: one per slot, not per primary"
    );
    for l in held {
        assert!(l.release().await.unwrap());
    }
    for w in waiters {
        let l = tokio::time::timeout(Duration::from_secs(30), w)
            .await
            .expect("a waiter was not woken")
            .unwrap()
            .unwrap();
        assert!(l.release().await.unwrap());
    }
}

fn primary_of_0(cluster: &RedisCluster) -> &RedisServer {
    owner(cluster, "pings:0")
}

/// A reentrant lock's renewal while its slot is split, the key and its hold marks moved and
/// the owner's set of live holds (`ferrolock:holds:…`) not yet: it makes no second set on the
/// target, whose MIGRATE of the set would then fail (BUSYKEY, `redis-cli --cluster reshard`
/// stops), and the set the holds are counted in ends on the target with both holds in it.
/// Before, the renewal ran on the target (ASK: its keys were all there) and its SADD made a
/// set of its own hold there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentrant_renewal_in_a_split_slot_makes_no_second_set_of_holds() {
    let _serial = serial();
    let cluster = RedisCluster::start();
    let o = opts()
        .reentrant(true)
        .ttl(Duration::from_secs(30))
        .node_timeout(Duration::from_secs(2));
    let m = manager(&[cluster.url()], o.clone());
    let key = "moving:holds";
    let outer = m.acquire_owned(key, 1, &o).await.unwrap();
    let inner = m.acquire_owned(key, 1, &o).await.unwrap();
    let source = owner(&cluster, key);
    let target = cluster
        .primaries()
        .iter()
        .find(|p| p.port() != source.port())
        .unwrap();
    let marks: Vec<String> = source.cmd(&["KEYS", "ferrolock:hold:*"]);
    let sets: Vec<String> = source.cmd(&["KEYS", "ferrolock:holds:*"]);
    assert_eq!((marks.len(), sets.len()), (2, 1), "{marks:?} {sets:?}");
    mark_migrating(source, target, key);
    migrate(source, target, key);
    for mark in &marks {
        migrate(source, target, mark);
    }
    // Refused (TRYAGAIN: the set is on the source) or renewed: either way, no set on the target.
    let _ = inner.extend().await;
    let mut conn = target.client();
    redis::cmd("ASKING").query::<()>(&mut conn).unwrap();
    let there: i64 = redis::cmd("EXISTS").arg(&sets[0]).query(&mut conn).unwrap();
    assert_eq!(there, 0, "the renewal made a second set on the target");
    migrate(source, target, &sets[0]);
    serve_slot_on(target, key);
    finish_move(&cluster, key, target);
    let members: Vec<String> = target.cmd(&["SMEMBERS", &sets[0]]);
    assert_eq!(members.len(), 2, "{members:?}");
    assert!(inner.release().await.unwrap());
    assert!(outer.release().await.unwrap());
    assert_eq!(target.cmd::<i64>(&["EXISTS", key]), 0);
    assert_eq!(
        target
            .cmd::<Vec<String>>(&["KEYS", "ferrolock:holds:*"])
            .len(),
        0
    );
}
