//! The semaphore's scripts (core/scripts/semaphore_*.lua) run on a real redis-server, one call
//! at a time as the handles will send them, on Redisson's RPermitExpirableSemaphore layout (what
//! `semaphore_redisson.rs` read from a Java client): re-sends that change nothing, a different
//! pool size refused naming both, and an expired holder reclaimed with the server's TIME.

mod common;

use std::time::Duration;

use ferrolock_testbed::RedisServer;

/// As `scripts/mod.rs` sends it: prepended with the waiter queue.
const ACQUIRE: &str = concat!(
    include_str!("../scripts/queue.lua"),
    include_str!("../scripts/semaphore_acquire.lua")
);
const RELEASE: &str = include_str!("../scripts/semaphore_release.lua");
const EXTEND: &str = include_str!("../scripts/semaphore_extend.lua");
const LATCH_PX: &str = "10000";

fn timeout_key(name: &str) -> String {
    format!("{{{name}}}:timeout")
}

fn channel(name: &str) -> String {
    format!("redisson_sc:{{{name}}}")
}

fn latch(name: &str, call: &str) -> String {
    format!("ferrolock:latch:{{{name}}}:{call}")
}

/// `count` distinct 16-byte ids for call `call`.
fn ids(call: &str, count: usize) -> Vec<Vec<u8>> {
    (0..count)
        .map(|i| {
            let mut id = [0u8; 16];
            let tag = format!("{call}/{i}");
            id[..tag.len().min(16)].copy_from_slice(&tag.as_bytes()[..tag.len().min(16)]);
            id.to_vec()
        })
        .collect()
}

fn acquire(
    server: &RedisServer,
    name: &str,
    call: &str,
    permits: u32,
    lease_ms: u64,
    ids: &[Vec<u8>],
) -> redis::RedisResult<(i64, i64)> {
    // A first try (no waiter id), as a fresh acquire sends it.
    acquire_queued(server, name, call, permits, lease_ms, ids, "", false)
}

/// An attempt of waiter `waiter` (queued for a minute; '' = a first try); `wake`: a refusal
/// may wake the queue head (an attempt no publish woke).
#[allow(clippy::too_many_arguments)]
fn acquire_queued(
    server: &RedisServer,
    name: &str,
    call: &str,
    permits: u32,
    lease_ms: u64,
    ids: &[Vec<u8>],
    waiter: &str,
    wake: bool,
) -> redis::RedisResult<(i64, i64)> {
    let mut c = server.client();
    let mut cmd = redis::cmd("EVAL");
    let queue = ferrolock::__wire::KeyNames::of(name);
    cmd.arg(ACQUIRE)
        .arg(6)
        .arg(name)
        .arg(timeout_key(name))
        .arg(&queue.queue)
        .arg(&queue.leases)
        .arg(&queue.since)
        .arg(latch(name, call))
        .arg(permits)
        .arg(ids.len())
        .arg(lease_ms)
        .arg(channel(name))
        .arg(LATCH_PX)
        .arg(waiter)
        .arg(if waiter.is_empty() { 0 } else { 60_000 })
        .arg(0)
        .arg("0")
        .arg(if wake { "1" } else { "0" });
    for id in ids {
        cmd.arg(id.as_slice());
    }
    cmd.query(&mut c)
}

fn release(server: &RedisServer, name: &str, call: &str, ids: &[Vec<u8>]) -> i64 {
    let mut c = server.client();
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(RELEASE)
        .arg(3)
        .arg(name)
        .arg(timeout_key(name))
        .arg(latch(name, call))
        .arg(channel(name))
        .arg(LATCH_PX)
        .arg("0");
    for id in ids {
        cmd.arg(id.as_slice());
    }
    cmd.query(&mut c).unwrap()
}

fn extend(server: &RedisServer, name: &str, lease_ms: u64, ids: &[Vec<u8>]) -> i64 {
    let mut c = server.client();
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(EXTEND).arg(1).arg(timeout_key(name)).arg(lease_ms);
    for id in ids {
        cmd.arg(id.as_slice());
    }
    cmd.query(&mut c).unwrap()
}

fn score(server: &RedisServer, name: &str, id: &[u8]) -> Option<i64> {
    let mut c = server.client();
    redis::cmd("ZSCORE")
        .arg(timeout_key(name))
        .arg(id)
        .query::<Option<f64>>(&mut c)
        .unwrap()
        .map(|s| s as i64)
}

/// Renewal extends only this holder's ids, never shortens, and answers 0 once they are lost
/// (expired on the server's clock, or reclaimed), without reviving them.
#[test]
fn renewal_extends_only_held_permits_and_reports_loss() {
    let server = RedisServer::start();
    let name = "sem:renew";
    let (a, b) = (ids("a", 1), ids("b", 1));
    acquire(&server, name, "a", 3, 60_000, &a).unwrap();
    let (_, b_expiry) = acquire(&server, name, "b", 3, 200, &b).unwrap();
    let a_before = score(&server, name, &a[0]).unwrap();
    assert_eq!(extend(&server, name, 600_000, &a), 1);
    assert!(score(&server, name, &a[0]).unwrap() > a_before);
    assert_eq!(
        score(&server, name, &b[0]),
        Some(b_expiry),
        "only this holder's ids"
    );
    let a_now = score(&server, name, &a[0]).unwrap();
    assert_eq!(extend(&server, name, 1_000, &a), 1);
    assert_eq!(score(&server, name, &a[0]), Some(a_now), "never shorter");
    loop {
        let t: (String, String) = server.cmd(&["TIME"]);
        let now = t.0.parse::<i64>().unwrap() * 1000 + t.1.parse::<i64>().unwrap() / 1000;
        if now > b_expiry {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        extend(&server, name, 60_000, &b),
        0,
        "an expired id is lost"
    );
    assert_eq!(
        score(&server, name, &b[0]),
        Some(b_expiry),
        "and not revived"
    );
}

fn available(server: &RedisServer, name: &str) -> i64 {
    server.cmd::<String>(&["GET", name]).parse().unwrap()
}

/// A re-sent acquire (same call id) takes nothing more; a re-sent release adds nothing more;
/// ids are 16 raw bytes in the zset, as Redisson writes them.
#[test]
fn resent_acquire_and_release_change_nothing() {
    let server = RedisServer::start();
    let name = "sem:resend";
    let a = ids("a", 2);
    assert_eq!(acquire(&server, name, "a", 3, 60_000, &a).unwrap().0, 1);
    assert_eq!(available(&server, name), 1);
    let again = acquire(&server, name, "a", 3, 60_000, &a).unwrap();
    assert_eq!(again.0, 1, "the re-send answers the first run's grant");
    assert_eq!(
        available(&server, name),
        1,
        "a re-sent acquire took permits twice"
    );
    let members: Vec<Vec<u8>> = server.cmd(&["ZRANGE", &timeout_key(name), "0", "-1"]);
    assert_eq!(members.len(), 2);
    assert!(members.iter().all(|m| m.len() == 16 && a.contains(m)));
    // A re-send that runs after its latch expired (a node that stalled longer than the latch
    // lives) finds its ids in the pool: the same grant, nothing taken twice (the counter has
    // no TTL: a second DECRBY would shrink the pool for good).
    let _: () = server.cmd(&["DEL", &latch(name, "a")]);
    let late = acquire(&server, name, "a", 3, 60_000, &a).unwrap();
    assert_eq!(late, again, "a late re-send answers the first run's grant");
    assert_eq!(
        available(&server, name),
        1,
        "a late re-send took permits twice"
    );

    assert_eq!(release(&server, name, "r", &a), 2);
    assert_eq!(available(&server, name), 3);
    assert_eq!(
        release(&server, name, "r", &a),
        2,
        "the re-send answers as the first"
    );
    assert_eq!(
        available(&server, name),
        3,
        "a re-sent release added permits twice"
    );
    // A new release of the same ids (a bug in the caller) adds nothing either.
    assert_eq!(release(&server, name, "r2", &a), 0);
    assert_eq!(available(&server, name), 3);
}

/// A release of more ids than Lua's `unpack` takes at once returns every one of them.
#[test]
fn a_release_of_thousands_of_ids_returns_them_all() {
    let server = RedisServer::start();
    let name = "sem:many";
    let a = ids("a", 9000);
    assert_eq!(
        acquire(&server, name, "a", 10_000, 60_000, &a).unwrap().0,
        1
    );
    assert_eq!(available(&server, name), 1000);
    assert_eq!(release(&server, name, "r", &a), 9000);
    assert_eq!(available(&server, name), 10_000);
}

/// A name that holds a plain lock (its token, not a counter) is held by someone else: refused
/// with no lease end to wait for (its release publishes nothing to semaphore waiters, which
/// re-check at their retry delay), and left as it is.
#[test]
fn a_name_held_as_a_plain_lock_is_refused_and_left_alone() {
    let server = RedisServer::start();
    let name = "sem:plain";
    let _: () = server.cmd(&[
        "SET",
        name,
        "0193b2c1d2e3-abcdef0123456789abcd",
        "PX",
        "60000",
    ]);
    let (granted, recheck) = acquire(&server, name, "a", 3, 60_000, &ids("a", 1)).unwrap();
    assert_eq!(granted, 0, "a semaphore took a name held as a lock");
    assert_eq!(recheck, -2, "the refusal says the name is held as a lock");
    let value: String = server.cmd(&["GET", name]);
    assert_eq!(value, "0193b2c1d2e3-abcdef0123456789abcd");
    let zset: i64 = server.cmd(&["EXISTS", &timeout_key(name)]);
    assert_eq!(zset, 0);
}

/// A pool size other than the stored one is refused with both numbers in the error.
#[test]
fn a_different_pool_size_is_refused_naming_both() {
    let server = RedisServer::start();
    let name = "sem:size";
    acquire(&server, name, "a", 3, 60_000, &ids("a", 1)).unwrap();
    let err = acquire(&server, name, "b", 5, 60_000, &ids("b", 1)).unwrap_err();
    let text = err.to_string();
    assert!(text.contains('3') && text.contains('5'), "{text}");
    assert_eq!(available(&server, name), 2, "the refused call took nothing");
}

/// An expired holder's permits come back in the next acquire, computed from the server's TIME;
/// a refusal answers the earliest lease end; the reclaim publishes the counter's new value (2
/// freed on a counter at 0: 2), as Redisson's does.
#[test]
fn expired_permits_are_reclaimed_by_the_next_acquire() {
    let server = RedisServer::start();
    let name = "sem:reclaim";
    let mut sub = server.client();
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe(channel(name)).unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let (granted, expiry) = acquire(&server, name, "a", 2, 200, &ids("a", 2)).unwrap();
    assert_eq!(granted, 1);
    let refused = acquire(&server, name, "b", 2, 60_000, &ids("b", 1)).unwrap();
    assert_eq!(
        refused,
        (0, expiry),
        "a refusal answers the earliest lease end"
    );
    // Wait on the server's clock, not ours.
    loop {
        let t: (String, String) = server.cmd(&["TIME"]);
        let now = t.0.parse::<i64>().unwrap() * 1000 + t.1.parse::<i64>().unwrap() / 1000;
        if now > expiry {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(available(&server, name), 0, "reclaim is lazy");
    assert_eq!(
        acquire(&server, name, "c", 2, 60_000, &ids("c", 1))
            .unwrap()
            .0,
        1
    );
    let m = pubsub.get_message().expect("the reclaim publishes");
    assert_eq!(
        String::from_utf8(m.get_payload_bytes().to_vec()).unwrap(),
        "2"
    );
    assert_eq!(available(&server, name), 1);
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Redisson and the scripts share one pool both ways: each side is refused while the other
/// holds every permit, and each side can take what the other released; Redisson releases an id
/// the scripts wrote (16 raw bytes it reads as hex).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_and_the_scripts_share_one_pool() {
    use common::redisson::{Redisson, redisson_classpath};
    let classpath = redisson_classpath();
    let server = RedisServer::start();
    let mut r = Redisson::start(classpath, &server.url(), "single").await;
    let name = "sem:shared";
    let reply = Duration::from_secs(30);
    r.send(&format!("ssetpermits {name} 2")).await;
    r.expect(&format!("ssetpermits {name} true"), reply).await;
    r.send(&format!("sacquire {name} 2 60000")).await;
    let java = r.expect(&format!("sacquire {name} "), reply).await;
    let java = java[format!("sacquire {name} ").len()..].to_string();
    assert_eq!(java.split(',').count(), 2, "{java}");
    let ours = ids("a", 1);
    let (granted, _) = acquire(&server, name, "a", 2, 60_000, &ours).unwrap();
    assert_eq!(granted, 0, "Redisson holds every permit");
    r.send(&format!("srelease {name} {java}")).await;
    r.expect(&format!("sreleased {name}"), reply).await;
    let ours = ids("b", 2);
    assert_eq!(acquire(&server, name, "b", 2, 60_000, &ours).unwrap().0, 1);
    r.send(&format!("sacquire {name} 1 60000")).await;
    r.expect(&format!("sacquire {name} none"), reply).await;
    // Redisson releases one of our ids: it reads the 16 raw bytes as the id it knows.
    r.send(&format!("srelease {name} {}", hex(&ours[0]))).await;
    r.expect(&format!("sreleased {name}"), reply).await;
    assert_eq!(available(&server, name), 1);
    r.send(&format!("sacquire {name} 1 60000")).await;
    let line = r.expect(&format!("sacquire {name} "), reply).await;
    assert!(!line.ends_with(" none"), "{line}");
    r.send("quit").await;
}

/// The turn rule counts each waiter ahead by the permits it asks for, read from its id
/// (`s<count>-...`): with 2 permits free, a waiter for 1 queued behind a head for 2 is refused
/// (before, rank r went in with count + r free, one for each waiter ahead, so it took one of
/// the two and the head waited on), and the head gets both. A refusal that may wake publishes
/// the counter's value, so a head asleep on a far re-check hears of the permits; one that a
/// publish woke (the head heard it too) publishes nothing.
#[test]
fn a_waiter_behind_a_head_for_more_permits_waits_for_it() {
    let server = RedisServer::start();
    let name = "sem:turns";
    let taken = ids("x", 2);
    assert_eq!(acquire(&server, name, "x", 2, 60_000, &taken).unwrap().0, 1);
    let (h, w) = ("s2-head", "s1-later");
    let refused = |call: &str, count: usize, waiter: &str, wake: bool| {
        acquire_queued(
            &server,
            name,
            call,
            2,
            60_000,
            &ids(call, count),
            waiter,
            wake,
        )
        .unwrap()
        .0
    };
    assert_eq!(refused("h1", 2, h, true), 0, "the pool is taken");
    assert_eq!(refused("w1", 1, w, true), 0, "the pool is taken");
    assert_eq!(release(&server, name, "x-release", &taken), 2);
    let mut sub = server.client();
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe(channel(name)).unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let payload = |m: redis::Msg| String::from_utf8(m.get_payload_bytes().to_vec()).unwrap();
    assert_eq!(
        refused("w2", 1, w, false),
        0,
        "the waiter for 1 took a permit ahead of the head for 2"
    );
    let _: i64 = server.cmd(&["PUBLISH", &channel(name), "mark"]);
    assert_eq!(
        payload(pubsub.get_message().unwrap()),
        "mark",
        "a refusal that a publish woke published"
    );
    assert_eq!(refused("w3", 1, w, true), 0);
    assert_eq!(
        payload(pubsub.get_message().expect("the refusal tells the head")),
        "2"
    );
    assert_eq!(refused("h2", 2, h, false), 1, "the head is refused");
    assert_eq!(available(&server, name), 0);
}
