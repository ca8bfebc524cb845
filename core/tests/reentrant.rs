//! The reentrant lock: Redisson's RLock layout byte for byte, re-entry and release order,
//! exclusion between owners, interoperation with Redisson's own scripts, the watchdog's
//! hash renewal, fencing, Redlock re-entry, and a forked child's new client uuid.

// Each #[tokio::test] runs its own runtime on its own thread, so holding the std mutex that
// serializes these tests across awaits blocks nothing but the test itself.
#![allow(clippy::await_holding_lock)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use ferrolock::{ErrorKind, LockManager, LockOptions, LockStatus, LossReason, ManagerOptions};
use ferrolock_testbed::{Cluster, RedisServer};

fn ropts() -> LockOptions {
    opts().reentrant(true)
}

fn hash(server: &RedisServer, key: &str) -> BTreeMap<String, String> {
    server.cmd(&["HGETALL", key])
}

/// Redisson's `RedissonLock.tryLockInnerAsync`, as a Java client sends it.
/// KEYS[1] lock name; ARGV[1] lease ms, ARGV[2] `"<uuid>:<threadId>"`.
const REDISSON_LOCK: &str = "if ((redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; return redis.call('pttl', KEYS[1]);";

/// Redisson's `RedissonLock.unlockInnerAsync`. KEYS[1] lock name, KEYS[2] channel;
/// ARGV[1] unlock message (0), ARGV[2] lease ms, ARGV[3] lock name of the thread.
const REDISSON_UNLOCK: &str = "if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then return nil; end; local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1); if (counter > 0) then redis.call('pexpire', KEYS[1], ARGV[2]); return 0; else redis.call('del', KEYS[1]); redis.call('publish', KEYS[2], ARGV[1]); return 1; end; return nil;";

#[tokio::test]
async fn reentry_to_depth_three_counts_up_and_only_the_last_release_frees_the_key() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], ropts());
    let key = "depth";
    let outer = m.acquire_owned(key, 1, &ropts()).await.unwrap();
    let middle = m.acquire_owned(key, 1, &ropts()).await.unwrap();
    let inner = m.acquire_owned(key, 1, &ropts()).await.unwrap();
    assert_eq!(middle.token(), outer.token(), "re-entry keeps the field");
    assert_eq!(inner.token(), outer.token());
    let field = outer.token().to_string();
    assert_eq!(
        hash(&server, key),
        BTreeMap::from([(field.clone(), "3".into())])
    );
    // extend is Redisson's renewal too: compare-field-and-pexpire, count untouched.
    assert!(middle.extend_for(Duration::from_secs(40)).await.unwrap() > Duration::from_secs(39));
    assert!(pttl(&server, key) > 39_000);
    assert_eq!(hash(&server, key)[&field], "3");

    // Out of order: the middle handle first, then the outer one; the key stays held.
    assert!(middle.release().await.unwrap());
    assert_eq!(hash(&server, key)[&field], "2");
    assert!(outer.release().await.unwrap());
    assert_eq!(hash(&server, key)[&field], "1");
    assert!(inner.is_held());
    assert_eq!(outer.status(), LockStatus::Released);
    // Another owner is still kept out by the last hold.
    let err = m
        .acquire_owned(key, 2, &ropts().wait(Some(Duration::ZERO)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    assert!(inner.release().await.unwrap());
    assert_eq!(
        server.cmd::<i64>(&["EXISTS", key]),
        0,
        "the last release frees it"
    );
    // Releasing a handle twice is refused and does not touch anything.
    assert_eq!(
        middle.release().await.unwrap_err().kind(),
        ErrorKind::NotHeld
    );

    // The owner's next outermost acquisition is a new acquisition: a new owner id.
    let again = m.acquire_owned(key, 1, &ropts()).await.unwrap();
    assert_ne!(again.token(), field);
}

#[tokio::test]
async fn a_second_owner_waits_while_the_count_is_above_zero_and_gets_it_after() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], ropts());
    let key = "owners";
    let a1 = m.acquire_owned(key, 1, &ropts()).await.unwrap();
    let a2 = m.acquire_owned(key, 1, &ropts()).await.unwrap();
    for owner in [2, 3] {
        let err = m
            .acquire_owned(key, owner, &ropts().wait(Some(ms(200))))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    }
    // Another manager (another client uuid) with the same owner number is another owner.
    let other = manager(&[server.url()], ropts());
    assert_ne!(other.client_id(), m.client_id());
    let err = other
        .acquire_owned(key, 1, &ropts().wait(Some(Duration::ZERO)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired);

    let m2 = m.clone();
    let waiter = tokio::spawn(async move { m2.acquire_owned(key, 2, &ropts()).await });
    tokio::time::sleep(ms(200)).await;
    a1.release().await.unwrap();
    tokio::time::sleep(ms(200)).await;
    assert!(
        !waiter.is_finished(),
        "count 1 > 0: owner 2 must still wait"
    );
    assert_eq!(hash(&server, key)[a2.token()], "1");
    a2.release().await.unwrap();
    let b = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("owner 2 gets the lock after the last release")
        .unwrap()
        .unwrap();
    assert_ne!(b.token(), a2.token());
    assert_eq!(
        hash(&server, key),
        BTreeMap::from([(b.token().into(), "1".into())])
    );
}

#[tokio::test]
async fn hash_field_count_pttl_and_channel_message_match_redisson_byte_for_byte() {
    let server = RedisServer::start();
    let ttl = Duration::from_secs(30);
    let m = manager(&[server.url()], ropts().ttl(ttl));
    for (key, channel) in [
        ("orders:7", "redisson_lock__channel:{orders:7}"),
        ("{user42}:cart", "redisson_lock__channel:{user42}:cart"),
    ] {
        assert_eq!(ferrolock::redisson_channel(key), channel);
        let outer = m.acquire_owned(key, 77, &ropts().ttl(ttl)).await.unwrap();
        assert_eq!(server.cmd::<String>(&["TYPE", key]), "hash");
        let fields = hash(&server, key);
        assert_eq!(fields.len(), 1, "{fields:?}");
        let (field, count) = fields.into_iter().next().unwrap();
        assert_eq!(count, "1");
        assert_eq!(field, outer.token());
        // "<client uuid, canonical 36 chars>:<owner id, decimal>"
        let (uuid, owner_id) = field.split_at(36);
        assert_eq!(uuid, m.client_id());
        let groups: Vec<usize> = uuid.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12], "{uuid}");
        assert!(
            uuid.chars()
                .all(|c| c == '-' || c.is_ascii_digit() || ('a'..='f').contains(&c)),
            "{uuid}"
        );
        let owner_id = owner_id.strip_prefix(':').expect("':' after the uuid");
        let id: u64 = owner_id.parse().expect("a decimal owner id");
        assert_eq!(owner_id, id.to_string(), "no padding or sign");
        assert!(id < 1 << 63, "fits a Java long");
        let pttl = pttl(&server, key);
        assert!((29_000..=30_000).contains(&pttl), "PTTL {pttl}");

        server.cmd::<()>(&["PEXPIRE", key, "20000"]);
        let inner = m.acquire_owned(key, 77, &ropts().ttl(ttl)).await.unwrap();
        assert_eq!(hash(&server, key)[&field], "2");
        let pttl = common::pttl(&server, key);
        assert!(pttl > 29_000, "re-entry resets the ttl: PTTL {pttl}");

        let mut sub = server.client();
        let mut pubsub = sub.as_pubsub();
        pubsub.subscribe(channel).unwrap();
        pubsub.set_read_timeout(Some(ms(300))).unwrap();
        assert!(inner.release().await.unwrap());
        assert_eq!(hash(&server, key)[&field], "1");
        assert!(
            pubsub.get_message().is_err(),
            "nothing is published while the count is above 0"
        );
        pubsub
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        assert!(outer.release().await.unwrap());
        let msg = pubsub.get_message().expect("the unlock message");
        assert_eq!(msg.get_channel_name(), channel);
        assert_eq!(msg.get_payload_bytes(), b"0");
        assert_eq!(server.cmd::<i64>(&["EXISTS", key]), 0);
    }
}

#[tokio::test]
async fn a_java_redisson_lock_and_ferrolock_exclude_and_wake_each_other() {
    let _serial = serial();
    let server = RedisServer::start();
    let key = "shared:rlock";
    let channel = "redisson_lock__channel:{shared:rlock}";
    // A Java thread's lock name: "<connection manager uuid>:<thread id>".
    let java = "8d5c9d53-3e2b-4f3b-9d1a-3c1f4a6d2b11:1";
    let lock = |s: &RedisServer| -> Option<i64> {
        s.cmd(&["EVAL", REDISSON_LOCK, "1", key, "30000", java])
    };
    let unlock = |s: &RedisServer| -> Option<i64> {
        s.cmd(&[
            "EVAL",
            REDISSON_UNLOCK,
            "2",
            key,
            channel,
            "0",
            "30000",
            java,
        ])
    };
    assert_eq!(lock(&server), None, "Redisson: nil = acquired");
    assert_eq!(lock(&server), None, "Redisson re-enters");

    // retry_delay 20s: only the unlock message (or the 30s PTTL) can wake the waiter early.
    let slow = ropts().retry_delay(Duration::from_secs(20));
    let m = manager(&[server.url()], slow.clone());
    let err = m
        .acquire_owned(key, 1, &slow.clone().wait(Some(Duration::ZERO)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired);
    let m2 = m.clone();
    let waiter = tokio::spawn(async move { m2.acquire_owned(key, 1, &slow).await });
    wait_for_subscribers(&server, channel, 1).await;
    assert_eq!(unlock(&server), Some(0), "count 2 -> 1");
    tokio::time::sleep(ms(100)).await;
    assert!(!waiter.is_finished());
    let released_at = Instant::now();
    assert_eq!(
        unlock(&server),
        Some(1),
        "count 1 -> 0: deleted and published"
    );
    let ours = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("woken by Redisson's unlock message")
        .unwrap()
        .unwrap();
    assert!(released_at.elapsed() < Duration::from_secs(5));

    // And the other way round: Redisson sees our hash and gets our PTTL.
    let busy = lock(&server).expect("busy: Redisson gets the PTTL");
    assert!(busy > 0 && busy <= 10_000, "PTTL {busy}");
    assert_eq!(unlock(&server), None, "Redisson cannot unlock our field");
    assert_eq!(hash(&server, key)[ours.token()], "1");
    let mut sub = server.client();
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe(channel).unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    ours.release().await.unwrap();
    assert_eq!(pubsub.get_message().unwrap().get_payload_bytes(), b"0");
    assert_eq!(lock(&server), None, "Redisson gets it after our release");
}

async fn wait_for_subscribers(server: &RedisServer, channel: &str, n: i64) {
    let start = Instant::now();
    loop {
        let counts: Vec<(String, i64)> = server.cmd(&["PUBSUB", "NUMSUB", channel]);
        if counts[0].1 == n {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{channel}: {} subscribers, expected {n}",
            counts[0].1
        );
        tokio::time::sleep(ms(5)).await;
    }
}

#[tokio::test]
async fn a_release_by_another_owner_never_touches_the_count() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], ropts());
    let key = "foreign-release";
    let held = m.acquire_owned(key, 1, &ropts()).await.unwrap();
    let _again = m.acquire_owned(key, 1, &ropts()).await.unwrap();
    // Another owner of this client, and a Redisson thread, run the unlock script.
    let channel = ferrolock::redisson_channel(key);
    for field in [
        format!("{}:12345", m.client_id()),
        "8d5c9d53-3e2b-4f3b-9d1a-3c1f4a6d2b11:1".to_string(),
    ] {
        let r: Option<i64> = server.cmd(&[
            "EVAL",
            REDISSON_UNLOCK,
            "2",
            key,
            &channel,
            "0",
            "30000",
            &field,
        ]);
        assert_eq!(r, None);
    }
    assert_eq!(
        hash(&server, key),
        BTreeMap::from([(held.token().into(), "2".into())])
    );
}

#[tokio::test]
async fn a_stale_handle_of_an_expired_acquisition_cannot_touch_the_next_one() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], ropts());
    let key = "stale-owner";
    // Connected first: a 200 ms ttl is less than connecting may take on a loaded machine.
    m.acquire_owned("warmup", 1, &ropts())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let stale = m
        .acquire_owned(key, 1, &ropts().ttl(ms(200)))
        .await
        .unwrap();
    tokio::time::sleep(ms(350)).await;
    assert_eq!(server.cmd::<i64>(&["EXISTS", key]), 0, "expired");
    // The stale handle is still live in the registry: the owner's acquire first tries to
    // re-enter, finds its field gone, and acquires afresh under a new owner id.
    let fresh = m
        .acquire_owned(key, 1, &ropts().ttl(Duration::from_secs(10)))
        .await
        .unwrap();
    assert_ne!(fresh.token(), stale.token());
    assert!(!stale.release().await.unwrap(), "the stale field is gone");
    assert_eq!(
        hash(&server, key),
        BTreeMap::from([(fresh.token().into(), "1".into())])
    );
    // Re-entry now joins the fresh acquisition.
    let inner = m.acquire_owned(key, 1, &ropts()).await.unwrap();
    assert_eq!(inner.token(), fresh.token());
    assert_eq!(hash(&server, key)[fresh.token()], "2");
}

#[tokio::test]
async fn plain_acquire_with_reentrant_on_is_a_new_owner_every_call() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], ropts());
    let first = m.acquire_with("one-off", &ropts()).await.unwrap();
    let err = m
        .acquire_with("one-off", &ropts().wait(Some(Duration::ZERO)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    assert_eq!(server.cmd::<String>(&["TYPE", "one-off"]), "hash");
    first.release().await.unwrap();
}

#[tokio::test]
async fn reentry_keeps_the_outer_fence_and_the_next_acquisition_gets_a_higher_one() {
    let server = RedisServer::start();
    let o = ropts().fencing(true);
    let m = manager(&[server.url()], o.clone());
    let outer = m.acquire_owned("fenced-r", 5, &o).await.unwrap();
    let f = outer.fence().expect("a fence");
    let inner = m.acquire_owned("fenced-r", 5, &o).await.unwrap();
    assert_eq!(inner.fence(), Some(f), "re-entry keeps its token");
    inner.release().await.unwrap();
    outer.release().await.unwrap();
    let next = m.acquire_owned("fenced-r", 5, &o).await.unwrap();
    assert_eq!(next.fence(), Some(f + 1));
    // On three nodes too (the fence goes through a quorum's counters).
    let cluster = Cluster::start(3);
    let m3 = manager(&cluster.urls(), o.clone());
    let a = m3.acquire_owned("fenced-r", 5, &o).await.unwrap();
    let b = m3.acquire_owned("fenced-r", 5, &o).await.unwrap();
    assert!(a.fence().is_some());
    assert_eq!(b.fence(), a.fence());
}

#[tokio::test]
async fn re_entry_on_three_nodes_needs_a_quorum_of_them() {
    let cluster = Cluster::start(3);
    let m = manager(&cluster.urls(), ropts());
    let key = "redlock-r";
    let outer = m.acquire_owned(key, 9, &ropts()).await.unwrap();
    let inner = m.acquire_owned(key, 9, &ropts()).await.unwrap();
    // Acquire returns once a quorum granted; the third node may lag by a moment.
    let start = std::time::Instant::now();
    while cluster
        .servers
        .iter()
        .any(|s| hash(s, key).get(outer.token()).map(String::as_str) != Some("2"))
    {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the re-entry never reached every node"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    inner.release().await.unwrap();
    // The outer grant is lost on two nodes (deleted behind our back): a re-entry cannot make
    // a quorum, so the owner acquires afresh, on the two free nodes, under a new field.
    for s in &cluster.servers[1..] {
        s.cmd::<i64>(&["DEL", key]);
    }
    let fresh = m.acquire_owned(key, 9, &ropts()).await.unwrap();
    assert_ne!(fresh.token(), outer.token());
    // Node 0 keeps the outer hold once at the end. The inner release returned at a quorum,
    // and the failed re-entry's undo may finish after the fresh grant, so node 0 can still be
    // settling (it read 2 once with both CPUs saturated); what must hold is where it settles.
    let start = std::time::Instant::now();
    while hash(&cluster.servers[0], key)
        .get(outer.token())
        .map(String::as_str)
        != Some("1")
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "node 0 never settled at one hold: {:?}",
            hash(&cluster.servers[0], key)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(hash(&cluster.servers[0], key).len(), 1);
    for s in &cluster.servers[1..] {
        assert_eq!(
            hash(s, key),
            BTreeMap::from([(fresh.token().into(), "1".into())])
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_watchdog_renews_a_reentrant_lock_and_reports_a_stolen_field() {
    let _serial = serial();
    let server = RedisServer::start();
    // Renewals every 666 ms, each with 300 ms to answer (not the default 200 ms; the loss
    // margin, 600 ms, within a period): a loaded machine must not lose them for being slow.
    let ttl = Duration::from_secs(2);
    let o = ropts().watchdog(true).ttl(ttl).node_timeout(ms(300));
    let m = manager(&[server.url()], o.clone());
    let a = m.acquire_owned("dog-r", 1, &o).await.unwrap();
    let b = m.acquire_owned("dog-r", 1, &o).await.unwrap();
    let plain = m
        .acquire_with(
            "dog-plain",
            &opts().watchdog(true).ttl(ttl).node_timeout(ms(300)),
        )
        .await
        .unwrap();
    // More than two ttls: only renewals (one pipeline carrying both kinds) keep them.
    tokio::time::sleep(ttl * 2 + ms(500)).await;
    assert!(a.is_held() && b.is_held() && plain.is_held());
    assert_eq!(hash(&server, "dog-r")[a.token()], "2");
    assert!(pttl(&server, "dog-r") > 300);
    assert!(pttl(&server, "dog-plain") > 300);
    // Someone replaces our field: renewal (compare-field-and-pexpire) fails and says so.
    server.cmd::<i64>(&["DEL", "dog-r"]);
    server.cmd::<i64>(&["HSET", "dog-r", "someone-else:1", "1"]);
    let reason = tokio::time::timeout(Duration::from_secs(10), a.lost())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(reason, LossReason::TokenGone { .. }), "{reason:?}");
    assert_eq!(
        hash(&server, "dog-r"),
        BTreeMap::from([("someone-else:1".into(), "1".into())]),
        "a failed renewal never touches another owner's hash"
    );
}

/// fork(2) from a test thread: the child gets a new client uuid and cannot re-enter the
/// parent's lock with the same owner.
#[test]
fn a_forked_child_gets_a_new_client_uuid_and_does_not_re_enter_the_parents_lock() {
    let server = RedisServer::start();
    // Built outside any runtime: it runs on the process runtime, which a child replaces.
    let m = LockManager::new(
        ManagerOptions::new()
            .nodes([server.url()])
            .restart_guard(Duration::ZERO)
            .lock(ropts()),
    )
    .unwrap();
    let held = ferrolock::runtime::block_on(m.acquire_owned("forked", 1, &ropts())).unwrap();
    let parent_uuid = m.client_id();
    let mut fds = [0; 2];
    // SAFETY: plain pipe(2) into a local array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child only uses this manager (its own runtime, connections and uuid) and
    // leaves with _exit, never returning into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let uuid = m.client_id();
        let r = ferrolock::runtime::block_on(m.acquire_owned(
            "forked",
            1,
            &ropts().wait(Some(Duration::ZERO)),
        ));
        let report = format!(
            "{uuid} {}",
            match r {
                Ok(_) => "ACQUIRED".to_string(),
                Err(e) => e.kind().code().to_string(),
            }
        );
        // SAFETY: writes our own buffer to our own pipe, then exits without unwinding.
        unsafe {
            libc::write(fds[1], report.as_ptr().cast(), report.len());
            libc::_exit(0);
        }
    }
    // SAFETY: closing our copy of the write end, reading into a local buffer.
    unsafe { libc::close(fds[1]) };
    let mut buf = vec![0u8; 256];
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut status = 0;
    loop {
        // SAFETY: waitpid on our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break;
        }
        if Instant::now() > deadline {
            // SAFETY: kill our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the forked child hung");
        }
        std::thread::sleep(ms(10));
    }
    // SAFETY: read(2) into a buffer of the given length.
    let n = unsafe { libc::read(fds[0], buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n > 0, "no report from the child");
    let report = String::from_utf8_lossy(&buf[..n as usize]).to_string();
    let (child_uuid, outcome) = report.split_once(' ').unwrap();
    assert_eq!(child_uuid.len(), 36);
    assert_ne!(
        child_uuid, parent_uuid,
        "the child must not share the parent's uuid"
    );
    assert_eq!(
        outcome, "NOT_ACQUIRED",
        "the child must not re-enter the parent's lock"
    );
    assert_eq!(hash(&server, "forked")[held.token()], "1");
    assert_eq!(m.client_id(), parent_uuid);
    assert!(ferrolock::runtime::block_on(held.release()).unwrap());
}

/// The release of a re-entry whose lease ran out (watchdog off, a shorter ttl than the outer
/// hold's) says it was not held, as a lapsed plain lock's does: its mark is gone, and the
/// owner's count is the live outer hold's. It said "released" (the script answered "still
/// held" for a hold that was not there), as read and write holds did.
#[tokio::test(flavor = "multi_thread")]
async fn the_release_of_a_lapsed_reentry_beside_a_live_hold_says_it_was_not_held() {
    let _s = serial();
    let server = RedisServer::start();
    let o = ropts().watchdog(false).wait(Some(Duration::ZERO));
    let m = manager(&[server.url()], o.clone());
    let key = "re:lapsed-inner";
    let outer = m
        .acquire_owned(key, 3, &o.clone().ttl(Duration::from_secs(20)))
        .await
        .unwrap();
    let inner = m
        .acquire_owned(key, 3, &o.clone().ttl(Duration::from_millis(1000)))
        .await
        .unwrap();
    let marks = || {
        server
            .cmd::<Vec<String>>(&["KEYS", "ferrolock:hold:*"])
            .len()
    };
    assert_eq!(marks(), 2, "a mark per hold");
    let end = Instant::now() + Duration::from_secs(10);
    while marks() != 1 {
        assert!(Instant::now() < end, "the inner hold's mark never lapsed");
        tokio::time::sleep(ms(20)).await;
    }
    assert!(!inner.is_held());
    assert!(
        !inner.release().await.unwrap(),
        "a re-entry whose lease ran out was released in time"
    );
    assert!(outer.is_held());
    assert_eq!(hash(&server, key).len(), 1, "the owner's field stays");
    assert!(outer.release().await.unwrap());
}

/// The release of an owner's last live hold, after a shorter re-entry of it lapsed (watchdog
/// off: its mark expired, its count left in the hash), frees the key: no hold is left. Before,
/// the lapsed hold's count kept the key held, with nobody holding it, for the released hold's
/// ttl (every other owner waited that long).
#[tokio::test(flavor = "multi_thread")]
async fn the_last_release_after_a_lapsed_reentry_frees_the_key() {
    let _s = serial();
    let server = RedisServer::start();
    let o = ropts().watchdog(false).wait(Some(Duration::ZERO));
    let m = manager(&[server.url()], o.clone());
    let key = "re:lapsed-then-last";
    let outer = m
        .acquire_owned(key, 3, &o.clone().ttl(Duration::from_secs(20)))
        .await
        .unwrap();
    let inner = m
        .acquire_owned(key, 3, &o.clone().ttl(Duration::from_millis(1000)))
        .await
        .unwrap();
    let marks = || {
        server
            .cmd::<Vec<String>>(&["KEYS", "ferrolock:hold:*"])
            .len()
    };
    let end = Instant::now() + Duration::from_secs(10);
    while marks() != 1 {
        assert!(Instant::now() < end, "the inner hold's mark never lapsed");
        tokio::time::sleep(ms(20)).await;
    }
    assert!(!inner.release().await.unwrap());
    assert!(outer.release().await.unwrap());
    assert_eq!(
        server.cmd::<i64>(&["EXISTS", key]),
        0,
        "the key outlived its holds: {:?}",
        hash(&server, key)
    );
    let other = m
        .acquire(key)
        .await
        .expect("another owner on the freed key");
    assert!(other.release().await.unwrap());
}

/// The release of a re-entry whose lease ran out after the owner's outer hold was released
/// (watchdog off, a shorter ttl than the outer hold's) frees the key: no hold is left. Before,
/// it answered "not held" and took nothing, and its count kept the key held, with nobody
/// holding it, for the rest of the outer hold's ttl (every other owner waited that long).
#[tokio::test(flavor = "multi_thread")]
async fn the_release_of_a_reentry_that_lapsed_after_the_outer_release_frees_the_key() {
    let _s = serial();
    let server = RedisServer::start();
    let o = ropts().watchdog(false).wait(Some(Duration::ZERO));
    let m = manager(&[server.url()], o.clone());
    let key = "re:outer-released-then-lapsed";
    let outer = m
        .acquire_owned(key, 3, &o.clone().ttl(Duration::from_secs(20)))
        .await
        .unwrap();
    let inner = m
        .acquire_owned(key, 3, &o.clone().ttl(Duration::from_millis(1000)))
        .await
        .unwrap();
    assert!(outer.release().await.unwrap());
    let marks = || {
        server
            .cmd::<Vec<String>>(&["KEYS", "ferrolock:hold:*"])
            .len()
    };
    let end = Instant::now() + Duration::from_secs(10);
    while marks() != 0 {
        assert!(Instant::now() < end, "the inner hold's mark never lapsed");
        tokio::time::sleep(ms(20)).await;
    }
    assert!(
        !inner.release().await.unwrap(),
        "a re-entry whose lease ran out was released in time"
    );
    assert_eq!(
        server.cmd::<i64>(&["EXISTS", key]),
        0,
        "the key outlived its holds: {:?}",
        hash(&server, key)
    );
    assert_eq!(
        server.cmd::<Vec<String>>(&["KEYS", "ferrolock:holds:*"]),
        Vec::<String>::new()
    );
    let other = m
        .acquire(key)
        .await
        .expect("another owner on the freed key");
    assert!(other.release().await.unwrap());
}

#[tokio::test]
async fn a_fenced_re_entry_of_an_unfenced_acquisition_is_refused_not_granted_without_a_fence() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], ropts());
    let key = "fence-on-reentry";
    let outer = m.acquire_owned(key, 3, &ropts()).await.unwrap();
    assert_eq!(outer.fence(), None);
    // A re-entry keeps the outer grant's fence, which has none: refused at once, never a
    // grant without the fence that was asked for.
    let fenced = ropts().fencing(true);
    match m.acquire_owned(key, 3, &fenced).await {
        Ok(inner) => panic!(
            "a grant asked with fencing on carried fence {:?}",
            inner.fence()
        ),
        Err(e) => assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}"),
    }
    assert_eq!(
        hash(&server, key).get(outer.token()).map(String::as_str),
        Some("1")
    );
    assert!(outer.release().await.unwrap());
    assert!(hash(&server, key).is_empty());
}
