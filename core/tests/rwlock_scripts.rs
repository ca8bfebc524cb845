//! The read-write lock's scripts (core/scripts/*_read.lua, *_write.lua) run on a real
//! redis-server, one call at a time as the handles will send them: Redisson's RReadWriteLock
//! layout (byte for byte what `rwlock_redisson.rs` read from a Java client), exclusion,
//! re-entry, downgrade, upgrade refused, a waiting writer served before readers that queued
//! after it, a write release that lets every reader at the front in, re-sends that change
//! nothing, a renewal that never shortens the hash, and a Java Redisson client excluded by and
//! woken by them.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::redisson::{Redisson, redisson_classpath};
use common::*;
use ferrolock::__wire::rw::*;
use ferrolock::__wire::{KeyNames, Place, hold_key};
use ferrolock_testbed::RedisServer;
use redis::Value;

const TTL: u64 = 60_000;
const LATCH_PX: u64 = 10_000;

/// One call's arguments to an acquire: the waiter id ('r…' a reader, 'w…' a writer, '' not
/// queued), re-entry, the barging bound, and the call id its latch is named by.
struct Call<'a> {
    id: &'a str,
    reentry: bool,
    bound_ms: u64,
    call: &'a str,
}

impl Call<'_> {
    fn first(call: &str) -> Call<'_> {
        Call {
            id: "",
            reentry: false,
            bound_ms: 0,
            call,
        }
    }
}

/// Runs a script through the library's typed arguments (`__wire::rw`): the layout the
/// manager sends.
fn run(s: &RedisServer, inv: redis::ScriptInvocation<'_>) -> redis::RedisResult<Value> {
    inv.invoke(&mut s.client())
}

fn latch(call: &str) -> Latch<'_> {
    Latch {
        id: call,
        px_ms: LATCH_PX,
    }
}

fn place(id: &str) -> Place<'_> {
    Place {
        id,
        score: "",
        lease_ms: 30_000,
    }
}

fn read(s: &RedisServer, key: &str, field: &str, c: &Call) -> Value {
    let names = KeyNames::of(key);
    let inv = AcquireRead {
        key,
        names: &names,
        ttl_ms: TTL,
        field,
        place: place(c.id),
        reentry: c.reentry,
        bound_ms: c.bound_ms,
        hold: c.call,
        keep_place: false,
    }
    .invocation();
    run(s, inv).unwrap()
}

fn write_attempt(s: &RedisServer, key: &str, field: &str, c: &Call) -> redis::RedisResult<Value> {
    let names = KeyNames::of(key);
    let inv = AcquireWrite {
        key,
        names: &names,
        ttl_ms: TTL,
        field,
        fence_mode: "",
        place: place(c.id),
        reentry: c.reentry,
        bound_ms: c.bound_ms,
        hold: c.call,
    }
    .invocation();
    run(s, inv)
}

fn write(s: &RedisServer, key: &str, field: &str, c: &Call) -> Value {
    write_attempt(s, key, field, c).unwrap()
}

/// The release of the hold granted by acquire call `hold` (its mark), as release call `call`.
fn release_read(s: &RedisServer, key: &str, field: &str, call: &str, hold: &str) -> Value {
    let inv = ReleaseRead {
        key,
        field,
        latch: latch(call),
        hold,
    }
    .invocation(false);
    run(s, inv).unwrap()
}

fn release_write(s: &RedisServer, key: &str, field: &str, call: &str, hold: &str) -> Value {
    let inv = ReleaseWrite {
        key,
        field,
        latch: latch(call),
        hold,
    }
    .invocation(false);
    run(s, inv).unwrap()
}

/// The renewal of the hold granted by acquire call `hold` (its mark).
fn extend_read(s: &RedisServer, key: &str, field: &str, hold: &str, ttl: &str) -> Value {
    let inv = Extend {
        key,
        token: field,
        ttl_ms: ttl.parse().unwrap(),
        renewal: Renewal::Read,
        hold,
    }
    .invocation();
    run(s, inv).unwrap()
}

fn granted(v: &Value) -> bool {
    *v == Value::Nil
}

fn hash(s: &RedisServer, key: &str) -> BTreeMap<String, String> {
    s.cmd(&["HGETALL", key])
}

/// The keys of the lock itself (the hash and the read holds' keys), without ferrolock's latch
/// and queue keys.
fn lock_keys(s: &RedisServer) -> Vec<String> {
    let mut keys: Vec<String> = s.cmd(&["KEYS", "*"]);
    keys.retain(|k| !k.starts_with("ferrolock:"));
    keys.sort();
    keys
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[test]
fn layout_exclusion_reentry_downgrade_and_upgrade_refused() {
    let s = RedisServer::start();
    for key in ["rw:plain", "rw{tag}x"] {
        let (a, b) = ("uuid-a:1", "uuid-b:2");
        // Two readers share it; the layout is Redisson's.
        assert!(granted(&read(&s, key, a, &Call::first("c1"))));
        assert!(granted(&read(&s, key, b, &Call::first("c2"))));
        assert_eq!(hash(&s, key), map(&[("mode", "read"), (a, "1"), (b, "1")]));
        let (ta, tb) = (
            format!("{}:1", rwlock_timeout_prefix(key, a)),
            format!("{}:1", rwlock_timeout_prefix(key, b)),
        );
        let mut want = vec![key.to_string(), ta.clone(), tb.clone()];
        want.sort();
        assert_eq!(lock_keys(&s), want);
        let p = pttl(&s, key);
        assert!(0 < p && p <= 60_000, "{key}: PTTL {p}");
        assert_eq!(get(&s, &ta).as_deref(), Some("1"));
        let p = pttl(&s, &ta);
        assert!(0 < p && p <= 60_000, "{ta}: PTTL {p}");
        // A writer is refused while they read: busy, with the hash's PTTL.
        let w = write(&s, key, "uuid-c:3", &Call::first("c3"));
        assert!(matches!(w, Value::Int(p) if p > 0), "{w:?}");
        // Re-entry: count 2, a second hold key.
        let re = Call {
            reentry: true,
            ..Call::first("c4")
        };
        assert!(granted(&read(&s, key, a, &re)));
        assert_eq!(hash(&s, key)[a], "2");
        assert_eq!(
            s.cmd::<i64>(&["EXISTS", &format!("{}:2", rwlock_timeout_prefix(key, a))]),
            1
        );
        // Upgrade refused with an error naming it.
        let up = upgrade_error(&s, key, a);
        assert!(up.contains("RWLOCK_UPGRADE") && up.contains(key), "{up}");
        // Releases: b's last hold, then a's two.
        assert_eq!(release_read(&s, key, b, "r1", "c2"), Value::Int(0));
        assert_eq!(release_read(&s, key, a, "r2", "c4"), Value::Int(0));
        assert_eq!(release_read(&s, key, a, "r3", "c1"), Value::Int(1));
        assert_eq!(lock_keys(&s), Vec::<String>::new());

        // A writer: "<field>:write"; readers and other writers refused; downgrade allowed.
        assert!(granted(&write(&s, key, a, &Call::first("c5"))));
        assert_eq!(
            hash(&s, key),
            map(&[("mode", "write"), (&format!("{a}:write"), "1")])
        );
        assert!(!granted(&read(&s, key, b, &Call::first("c6"))));
        assert!(!granted(&write(&s, key, b, &Call::first("c7"))));
        let down = Call {
            reentry: true,
            ..Call::first("c8")
        };
        assert!(granted(&read(&s, key, a, &down)));
        assert_eq!(
            hash(&s, key),
            map(&[("mode", "write"), (&format!("{a}:write"), "1"), (a, "1")])
        );
        // The write release hands the hash to the read hold left.
        assert_eq!(release_write(&s, key, a, "r4", "c5"), Value::Int(1));
        assert_eq!(hash(&s, key), map(&[("mode", "read"), (a, "1")]));
        assert!(granted(&read(&s, key, b, &Call::first("c9"))));
        assert_eq!(release_read(&s, key, a, "r5", "c8"), Value::Int(0));
        assert_eq!(release_read(&s, key, b, "r6", "c9"), Value::Int(1));
        assert_eq!(lock_keys(&s), Vec::<String>::new());
    }
}

/// The error reply of a write acquire by an owner that holds its read lock.
fn upgrade_error(s: &RedisServer, key: &str, field: &str) -> String {
    match write_attempt(s, key, field, &Call::first("up")) {
        Err(e) => e.to_string(),
        Ok(v) => panic!("an upgrade was answered {v:?}"),
    }
}

/// A re-sent call (the same call id, as a re-send after a dropped connection carries) changes
/// nothing: a read acquire adds no second hold, a release removes one hold, not two.
#[test]
fn a_resent_read_acquire_or_release_changes_nothing() {
    let s = RedisServer::start();
    let (key, a) = ("rw:resend", "uuid-a:1");
    assert!(granted(&read(&s, key, a, &Call::first("g1"))));
    let again = Call {
        reentry: true,
        ..Call::first("g2")
    };
    for _ in 0..2 {
        assert!(granted(&read(&s, key, a, &again)));
    }
    assert_eq!(hash(&s, key)[a], "2", "a re-sent re-entry added a hold");
    assert_eq!(
        s.cmd::<i64>(&["EXISTS", &format!("{}:3", rwlock_timeout_prefix(key, a))]),
        0
    );
    // The first grant sent again: still one hold from it.
    assert!(granted(&read(&s, key, a, &Call::first("g1"))));
    assert_eq!(hash(&s, key)[a], "2");
    for _ in 0..2 {
        assert_eq!(release_read(&s, key, a, "x1", "g2"), Value::Int(0));
    }
    assert_eq!(
        hash(&s, key)[a],
        "1",
        "a re-sent release removed a second hold"
    );
    for _ in 0..2 {
        assert_eq!(release_read(&s, key, a, "x2", "g1"), Value::Int(1));
    }
    assert_eq!(lock_keys(&s), Vec::<String>::new());
    // A write re-entry and release, each sent twice.
    assert!(granted(&write(&s, key, a, &Call::first("w1"))));
    assert!(granted(&write(&s, key, a, &Call::first("w1"))));
    let again = Call {
        reentry: true,
        ..Call::first("w2")
    };
    for _ in 0..2 {
        assert!(granted(&write(&s, key, a, &again)));
    }
    assert_eq!(hash(&s, key)[&format!("{a}:write")], "2");
    for _ in 0..2 {
        assert_eq!(release_write(&s, key, a, "y1", "w2"), Value::Int(0));
    }
    assert_eq!(hash(&s, key)[&format!("{a}:write")], "1");
    assert_eq!(release_write(&s, key, a, "y2", "w1"), Value::Int(1));
    assert_eq!(lock_keys(&s), Vec::<String>::new());
}

/// Readers hold; a writer queues; readers that come after it (queued or not) are refused past
/// the barging bound (0 here) until the writer has had its turn; the writer's release lets
/// every reader at the front of the queue in, not only the head, and publishes "1".
#[test]
fn a_queued_writer_goes_before_later_readers_and_its_release_lets_the_front_readers_in() {
    let s = RedisServer::start();
    let key = "rw:order";
    let queued = |id: &'static str, call: &'static str| Call {
        id,
        reentry: false,
        bound_ms: 0,
        call,
    };
    assert!(granted(&read(&s, key, "r0", &Call::first("a0"))));
    // The writer waits behind the reader, queued.
    assert!(!granted(&write(&s, key, "W", &queued("w-W", "a1"))));
    // Later readers: a first try (not queued) and two queued ones, all refused.
    assert!(!granted(&read(&s, key, "r1", &Call::first("a2"))));
    assert!(!granted(&read(&s, key, "r2", &queued("r-2", "a3"))));
    assert!(!granted(&read(&s, key, "r3", &queued("r-3", "a4"))));
    // Within a barging bound a newcomer may still pass (the stated bound).
    let barging = Call {
        bound_ms: 60_000,
        ..Call::first("a5")
    };
    assert!(granted(&read(&s, key, "r4", &barging)));
    assert_eq!(release_read(&s, key, "r4", "b0", "a5"), Value::Int(0));
    assert_eq!(release_read(&s, key, "r0", "b1", "a0"), Value::Int(1));
    // Free: the queued readers behind the writer still wait for it.
    assert!(!granted(&read(&s, key, "r2", &queued("r-2", "a6"))));
    assert!(granted(&write(&s, key, "W", &queued("w-W", "a7"))));
    assert!(!granted(&read(&s, key, "r3", &queued("r-3", "a8"))));

    let mut sub = s.client();
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe(rwlock_channel(key)).unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    assert_eq!(release_write(&s, key, "W", "b2", "a7"), Value::Int(1));
    let m = pubsub.get_message().expect("the write release's message");
    assert_eq!(m.get_payload_bytes(), b"1");
    // Both queued readers are at the front now: both get in, the second without waiting for
    // the first.
    assert!(granted(&read(&s, key, "r3", &queued("r-3", "a9"))));
    assert!(granted(&read(&s, key, "r2", &queued("r-2", "a10"))));
    assert_eq!(
        hash(&s, key),
        map(&[("mode", "read"), ("r2", "1"), ("r3", "1")])
    );
}

/// A reader's renewal raises its own hold keys and the hash, never lowers them; a release that finds every
/// other reader's hold keys expired (crashed readers) frees the key, as Redisson's does.
#[test]
fn read_renewal_never_shortens_and_expired_readers_do_not_hold_the_key() {
    let s = RedisServer::start();
    let (key, a, b) = ("rw:renew", "uuid-a:1", "uuid-b:2");
    assert!(granted(&read(&s, key, a, &Call::first("a"))));
    assert!(granted(&read(&s, key, b, &Call::first("b"))));
    s.cmd::<()>(&["PEXPIRE", key, "100000"]);
    assert_eq!(extend_read(&s, key, a, "a", "20000"), Value::Int(1));
    assert!(pttl(&s, key) > 20_000, "the renewal shortened the hash");
    s.cmd::<()>(&["PEXPIRE", key, "5000"]);
    assert_eq!(extend_read(&s, key, a, "a", "20000"), Value::Int(1));
    let p = pttl(&s, key);
    assert!(
        p > 5_000 && p <= 20_000,
        "the renewal did not raise the hash: PTTL {p}"
    );
    // Our hold keys too (every handle of one owner shares them): granted for 60 s, kept; a
    // shorter one raised.
    let ours = format!("{}:1", rwlock_timeout_prefix(key, a));
    let p = pttl(&s, &ours);
    assert!(p > 20_000, "the renewal shortened our hold key: PTTL {p}");
    s.cmd::<()>(&["PEXPIRE", &ours, "5000"]);
    assert_eq!(extend_read(&s, key, a, "a", "20000"), Value::Int(1));
    let p = pttl(&s, &ours);
    assert!(p > 5_000 && p <= 20_000, "our hold key: PTTL {p}");
    assert_eq!(
        extend_read(&s, key, "uuid-z:9", "a", "20000"),
        Value::Int(0)
    );
    // A hold with no mark here (another handle's count is the field's): not renewed.
    assert_eq!(
        extend_read(&s, key, a, "never-granted", "20000"),
        Value::Int(0)
    );
    // b crashes: its hold key expires (deleted here), its field stays.
    s.cmd::<()>(&["DEL", &format!("{}:1", rwlock_timeout_prefix(key, b))]);
    assert_eq!(release_read(&s, key, a, "r", "a"), Value::Int(1));
    assert_eq!(lock_keys(&s), Vec::<String>::new());
}

/// A reentrant lock's hash (Redisson's RLock layout: the owner's field `<uuid>:<id>` = count,
/// no `mode` field) is someone else's: a read acquire is refused with the hash's PTTL, as a
/// write acquire is (first tries, queued waiters and re-entries alike), and the hash keeps its
/// fields and its expiry. A read hold written into it would make the next read release take
/// the owner's field for a crashed reader's and delete the whole lock.
#[test]
fn a_reentrant_locks_hash_is_busy_for_readers_and_writers() {
    let s = RedisServer::start();
    for key in ["rw:rlock", "rw{tag}rlock"] {
        let owner = "redisson-uuid:7";
        s.cmd::<()>(&["HSET", key, owner, "1"]);
        s.cmd::<()>(&["PEXPIRE", key, "30000"]);
        let want = map(&[(owner, "1")]);
        let busy = |what: &str, v: &Value| {
            assert!(
                matches!(v, Value::Int(p) if 0 < *p && *p <= 30_000),
                "{key}: {what} on a reentrant lock's hash was answered {v:?}, not its PTTL"
            );
            assert_eq!(
                hash(&s, key),
                want,
                "{key}: {what} changed the owner's hash"
            );
            let p = pttl(&s, key);
            assert!(
                0 < p && p <= 30_000,
                "{key}: {what} moved its expiry: PTTL {p}"
            );
            assert_eq!(lock_keys(&s), vec![key.to_string()], "{key}: {what}");
        };
        let (a, b) = ("uuid-a:1", "uuid-b:2");
        busy("a read", &read(&s, key, a, &Call::first("c1")));
        let queued = Call {
            id: "r-a",
            ..Call::first("c2")
        };
        busy("a queued read", &read(&s, key, a, &queued));
        let reentry = Call {
            reentry: true,
            ..Call::first("c3")
        };
        busy("a read re-entry", &read(&s, key, a, &reentry));
        busy("a write", &write(&s, key, b, &Call::first("c4")));
        let queued = Call {
            id: "w-b",
            ..Call::first("c5")
        };
        busy("a queued write", &write(&s, key, b, &queued));
        // Nothing of ours to release there, and the owner's lock stays.
        assert_eq!(release_read(&s, key, a, "x1", "c1"), Value::Nil);
        assert_eq!(hash(&s, key), want, "{key}");
        s.cmd::<()>(&["DEL", key]);
    }
}

/// A read hold whose hold key has expired on this node (its holder missed its renewals here)
/// while another reader's field keeps the hash alive is not renewed: the renewal answers 0,
/// re-creates no hold key and raises nothing, so with N nodes this node counts as a no.
/// Sent twice, it answers the same. The other reader is renewed as before.
#[test]
fn a_read_renewal_whose_hold_key_expired_answers_not_renewed() {
    let s = RedisServer::start();
    let (key, a, b) = ("rw:lapsed", "uuid-a:1", "uuid-b:2");
    assert!(granted(&read(&s, key, a, &Call::first("a"))));
    assert!(granted(&read(&s, key, b, &Call::first("b"))));
    let hold_a = format!("{}:1", rwlock_timeout_prefix(key, a));
    // a's hold key expires (b keeps the hash and a's field).
    s.cmd::<()>(&["PEXPIRE", &hold_a, "1"]);
    let start = Instant::now();
    while s.cmd::<i64>(&["EXISTS", &hold_a]) == 1 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{hold_a} never expired"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    s.cmd::<()>(&["PEXPIRE", key, "5000"]);
    for run in ["first", "second"] {
        assert_eq!(
            extend_read(&s, key, a, "a", "20000"),
            Value::Int(0),
            "the {run} renewal of a read hold whose hold key expired"
        );
        assert_eq!(s.cmd::<i64>(&["EXISTS", &hold_a]), 0, "{run}: re-created");
        let p = pttl(&s, key);
        assert!(
            p <= 5_000,
            "{run}: a lapsed reader's renewal raised the hash: PTTL {p}"
        );
    }
    assert_eq!(extend_read(&s, key, b, "b", "20000"), Value::Int(1));
    assert!(pttl(&s, key) > 5_000, "b's renewal did not raise the hash");
    // A re-entered reader (two holds) whose second hold lapsed (its key and its mark gone):
    // the first hold, whose mark is there, is renewed (the gap its sibling left says nothing
    // of it: a review found a live hold declared lost that way), the gap is left as it is;
    // the lapsed hold is not renewed.
    assert!(granted(&read(
        &s,
        key,
        b,
        &Call {
            reentry: true,
            ..Call::first("b2")
        }
    )));
    let (hold_b1, hold_b2) = (
        format!("{}:1", rwlock_timeout_prefix(key, b)),
        format!("{}:2", rwlock_timeout_prefix(key, b)),
    );
    s.cmd::<()>(&["DEL", &hold_b2, &hold_key(key, "b2")]);
    s.cmd::<()>(&["PEXPIRE", &hold_b1, "4000"]);
    assert_eq!(extend_read(&s, key, b, "b2", "20000"), Value::Int(0));
    assert!(pttl(&s, &hold_b1) <= 4_000, "the lapsed hold raised a key");
    assert_eq!(extend_read(&s, key, b, "b", "20000"), Value::Int(1));
    assert_eq!(s.cmd::<i64>(&["EXISTS", &hold_b2]), 0, "the gap was filled");
    assert!(
        pttl(&s, &hold_b1) > 4_000,
        "the live hold's key was not renewed"
    );
}

/// A Java Redisson client and these scripts on one key: each excluded while the other holds,
/// readers shared; each one's release wakes the other's waiter (Redisson's waiter waits on the
/// channel, and otherwise for the hash's 60 s PTTL: only the message explains a prompt grant).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_and_the_scripts_exclude_share_and_wake_each_other() {
    let classpath = redisson_classpath();
    let s = RedisServer::start();
    let mut r = Redisson::start(classpath, &s.url(), "single").await;
    let key = "rw:interop";
    let try_ = async |r: &mut Redisson, cmd: &str| {
        r.send(&format!("{cmd} {key}")).await;
        let reply = r
            .expect(&format!("{cmd} {key} "), Duration::from_secs(30))
            .await;
        reply.ends_with(" true")
    };
    // Our write held: Redisson can neither read nor write.
    assert!(granted(&write(&s, key, "fl:1", &Call::first("w"))));
    assert!(!try_(&mut r, "rtry").await);
    assert!(!try_(&mut r, "wtry").await);
    // Redisson's reader waits (watchdog lease); our write release wakes it.
    r.send(&format!("rlock {key} -1")).await;
    wait_for_subscriber(&s, &rwlock_channel(key)).await;
    assert!(r.lines.is_empty(), "Redisson read while we wrote");
    assert_eq!(release_write(&s, key, "fl:1", "rw", "w"), Value::Int(1));
    r.expect(&format!("rlocked {key}"), Duration::from_secs(20))
        .await;
    // Readers share: ours joins Redisson's; a writer of ours is refused.
    assert!(granted(&read(&s, key, "fl:2", &Call::first("r"))));
    assert!(!granted(&write(&s, key, "fl:3", &Call::first("w3"))));
    r.send(&format!("runlock {key}")).await;
    r.expect(&format!("runlocked {key}"), Duration::from_secs(30))
        .await;
    // Our read held (ttl 60 s): Redisson's writer waits; our release wakes it.
    r.send(&format!("wlock {key} -1")).await;
    wait_for_subscriber(&s, &rwlock_channel(key)).await;
    assert!(r.lines.is_empty(), "Redisson wrote while we read");
    assert_eq!(release_read(&s, key, "fl:2", "rr", "r"), Value::Int(1));
    r.expect(&format!("wlocked {key}"), Duration::from_secs(20))
        .await;
    // Redisson's write held: we can neither read nor write; its unlock publishes "1".
    assert!(!granted(&read(&s, key, "fl:4", &Call::first("r4"))));
    assert!(!granted(&write(&s, key, "fl:4", &Call::first("w4"))));
    let mut sub = s.client();
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe(rwlock_channel(key)).unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    r.send(&format!("wunlock {key}")).await;
    r.expect(&format!("wunlocked {key}"), Duration::from_secs(30))
        .await;
    assert_eq!(pubsub.get_message().unwrap().get_payload_bytes(), b"1");
    assert!(granted(&write(&s, key, "fl:4", &Call::first("w5"))));
}

/// Until someone listens on `channel`, then a moment more (Redisson re-checks the lock once
/// subscribed; a release before that re-check would be caught by it, not by the message).
async fn wait_for_subscriber(s: &RedisServer, channel: &str) {
    let bound = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let reply: Vec<Value> = s.cmd(&["PUBSUB", "NUMSUB", channel]);
        if matches!(reply.get(1), Some(Value::Int(n)) if *n > 0) {
            break;
        }
        assert!(
            std::time::Instant::now() < bound,
            "nobody subscribed to {channel}"
        );
        tokio::time::sleep(ms(20)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
}
