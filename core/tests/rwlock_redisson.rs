//! Redisson 4.7.0's `RReadWriteLock` as it is on a real redis-server: the layout ferrolock's
//! read-write lock must share (issue 33), read from the keys a real Java client leaves, and the
//! messages it publishes. `common/redisson.rs` runs the Java client.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::redisson::{Redisson, redisson_classpath};
use common::*;
use ferrolock::__wire::rw::{rwlock_channel, rwlock_timeout_prefix};
use ferrolock::{ErrorKind, LockStatus};
use ferrolock_testbed::RedisServer;

/// Redisson's lease when no lease is given (its watchdog's `lockWatchdogTimeout`).
const WATCHDOG_LEASE_MS: i64 = 30_000;

fn hash(server: &RedisServer, key: &str) -> BTreeMap<String, String> {
    server.cmd(&["HGETALL", key])
}

/// The keys of the layout. Redisson 4.7.0's unlocks also leave a request latch,
/// `redisson_unlock_latch:{name}:<id>`, that expires by itself a moment later (its guard
/// against running an unlock twice, like ours): not part of the layout, so left out here once
/// it is shown to carry a TTL (a latch without one would be a leak, and fails).
fn keys(server: &RedisServer) -> Vec<String> {
    let mut keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    keys.retain(|k| {
        if !k.starts_with("redisson_unlock_latch:") {
            return true;
        }
        let pttl: i64 = server.cmd(&["PTTL", k]);
        assert!(pttl != -1, "Redisson's unlock latch {k} has no TTL");
        false
    });
    keys.sort();
    keys
}

/// The library's names (`__wire::rw`), which these tests hold against Redisson's own keys.
fn timeout_key(name: &str, field: &str, n: u32) -> String {
    format!("{}:{n}", rwlock_timeout_prefix(name, field))
}

fn channel(name: &str) -> String {
    rwlock_channel(name)
}

/// Sends `command args` and waits for its reply, `<command>ed <key>` (args: the key, then the
/// lease for a lock).
async fn run(r: &mut Redisson, command: &str, args: &str) {
    r.send(&format!("{command} {args}")).await;
    let key = args.split(' ').next().unwrap_or_default();
    r.expect(&format!("{command}ed {key}"), Duration::from_secs(30))
        .await;
}

/// Read holds, their re-entry, a downgrade (read lock taken under the write lock), the unlocks
/// and what each publishes, on a plain name and on a name with a hash tag; a read→write upgrade
/// refused; and the read watchdog's renewal setting the hash's PTTL back to 30 s, whatever it
/// was (so it can shorten another reader's expiry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_rwlock_layout_on_a_real_server() {
    let classpath = redisson_classpath();
    let server = RedisServer::start();
    let mut r = Redisson::start(classpath, &server.url(), "single").await;
    // Every call runs on the client's main thread: one owner, "<client id>:<thread id>".
    for name in ["rw:plain", "rw{tag}x"] {
        let mut sub = server.client();
        let mut pubsub = sub.as_pubsub();
        pubsub.subscribe(channel(name)).unwrap();
        pubsub
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut next_message = || {
            let m = pubsub.get_message().expect("a message on the channel");
            assert_eq!(m.get_channel_name(), channel(name));
            String::from_utf8(m.get_payload_bytes().to_vec()).unwrap()
        };

        run(&mut r, "rlock", &format!("{name} -1")).await;
        let h = hash(&server, name);
        let field = h
            .keys()
            .find(|f| *f != "mode")
            .expect("a reader field")
            .clone();
        assert!(field.starts_with(&format!("{}:", r.id)), "{field}");
        assert_eq!(
            h,
            BTreeMap::from([("mode".into(), "read".into()), (field.clone(), "1".into())])
        );
        let t1 = timeout_key(name, &field, 1);
        assert_eq!(keys(&server), vec![name.to_string(), t1.clone()]);
        for k in [name, t1.as_str()] {
            let p = pttl(&server, k);
            assert!(0 < p && p <= WATCHDOG_LEASE_MS, "{k}: PTTL {p}");
        }
        assert_eq!(get(&server, &t1).as_deref(), Some("1"));

        // Re-entry: count 2, a second timeout key; one unlock takes the newest.
        run(&mut r, "rlock", &format!("{name} -1")).await;
        assert_eq!(hash(&server, name)[&field], "2");
        let t2 = timeout_key(name, &field, 2);
        assert_eq!(server.cmd::<i64>(&["EXISTS", &t2]), 1);
        run(&mut r, "runlock", name).await;
        assert_eq!(hash(&server, name)[&field], "1");
        assert_eq!(keys(&server), vec![name.to_string(), t1.clone()]);

        // Upgrade refused while reading.
        r.send(&format!("wtry {name}")).await;
        let reply = r
            .expect(&format!("wtry {name} "), Duration::from_secs(30))
            .await;
        assert!(reply.ends_with(" false"), "{reply}");

        // The last read unlock deletes the hash and publishes "0". (Its timeout key goes too.)
        run(&mut r, "runlock", name).await;
        assert_eq!(keys(&server), Vec::<String>::new());
        assert_eq!(next_message(), "0");

        // Write: "<field>:write", no timeout key.
        run(&mut r, "wlock", &format!("{name} -1")).await;
        let wfield = format!("{field}:write");
        assert_eq!(
            hash(&server, name),
            BTreeMap::from([
                ("mode".into(), "write".into()),
                (wfield.clone(), "1".into())
            ])
        );
        assert_eq!(keys(&server), vec![name.to_string()]);
        // Downgrade: a read hold under the write lock.
        run(&mut r, "rlock", &format!("{name} -1")).await;
        assert_eq!(
            hash(&server, name),
            BTreeMap::from([
                ("mode".into(), "write".into()),
                (wfield.clone(), "1".into()),
                (field.clone(), "1".into())
            ])
        );
        assert_eq!(keys(&server), vec![name.to_string(), t1.clone()]);
        // The write unlock with a read hold left: mode read, nothing published (the next
        // message is the read unlock's "0", not a "1").
        run(&mut r, "wunlock", name).await;
        assert_eq!(
            hash(&server, name),
            BTreeMap::from([("mode".into(), "read".into()), (field.clone(), "1".into())])
        );
        run(&mut r, "runlock", name).await;
        assert_eq!(next_message(), "0");
        // A write unlock that frees the key publishes "1" (wake every waiter).
        run(&mut r, "wlock", &format!("{name} -1")).await;
        run(&mut r, "wunlock", name).await;
        assert_eq!(next_message(), "1");
        assert_eq!(keys(&server), Vec::<String>::new());
    }

    // The read watchdog sets the hash's expiry to its lease whatever it was: raised to 100 s,
    // its next renewal (every 10 s) brings it back under 30 s.
    let name = "rw:renewal";
    run(&mut r, "rlock", &format!("{name} -1")).await;
    server.cmd::<()>(&["PEXPIRE", name, "100000"]);
    let bound = Instant::now() + Duration::from_secs(60);
    while pttl(&server, name) > WATCHDOG_LEASE_MS {
        assert!(
            Instant::now() < bound,
            "Redisson's read renewal never shortened the hash"
        );
        tokio::time::sleep(ms(200)).await;
    }
    run(&mut r, "runlock", name).await;
}

/// Waits for Redisson's read watchdog to renew `name`: its PTTL, raised to 100 s here, falls
/// back to at most 30 s only through a renewal (every 10 s).
async fn redisson_renewal(server: &RedisServer, name: &str) {
    server.cmd::<()>(&["PEXPIRE", name, "100000"]);
    let bound = Instant::now() + Duration::from_secs(60);
    while pttl(server, name) > WATCHDOG_LEASE_MS {
        assert!(Instant::now() < bound, "Redisson's read renewal never came");
        tokio::time::sleep(ms(20)).await;
    }
}

/// Issue 33's crashed Redisson reader: a ferrolock reader at the read cap beside a Redisson reader SIGKILLed right after one of
/// its renewals; a ferrolock writer then contends. Every write attempt that gets the key must
/// have started after our reader's validity ended: the writer is never granted while our
/// reader still believes it holds. (Our reader has no watchdog, so its belief is its
/// deadline; with a watchdog it would renew the hash itself and the writer would only wait.)
/// Then a read ttl of 90 s is refused: DESIGN.md "Read-write lock", Redisson's renewal sets
/// the hash to 30 s, so a longer read lease could end after the hash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redisson_reader_never_lets_a_writer_in_while_ours_reads() {
    let classpath = redisson_classpath();
    let server = RedisServer::start();
    let mut r = Redisson::start(classpath, &server.url(), "single").await;
    // A node timeout a loaded machine's replies fit in, within the lease's loss margin.
    let base = opts()
        .ttl(ferrolock::READ_LEASE_CAP)
        .node_timeout(Duration::from_secs(3));
    let m = manager(&[server.url()], base.clone());
    let name = "rw:killed-reader";

    run(&mut r, "rlock", &format!("{name} -1")).await;
    let ours = m.read_lock_with(name, &base).await.unwrap();
    // Two renewals after our grant, so the one the kill follows came a renewal period (10 s)
    // after it: the hash then outlives our deadline by that much, whatever the load.
    redisson_renewal(&server, name).await;
    redisson_renewal(&server, name).await;
    r.kill().await;
    let left = pttl(&server, name);
    assert!(
        0 < left && left <= WATCHDOG_LEASE_MS,
        "after the kill the hash's PTTL is Redisson's renewal, not ours: {left}"
    );
    assert_eq!(hash(&server, name).len(), 3, "mode and both readers");

    let now = base.clone().wait(Some(Duration::ZERO));
    let bound = Instant::now() + Duration::from_secs(120);
    let writer = loop {
        assert!(Instant::now() < bound, "the writer was never granted");
        let started = tokio::time::Instant::now();
        let believed = ours.status() == LockStatus::Held && started < ours.deadline();
        match m.write_lock_with(name, &now).await {
            Ok(w) => {
                assert!(
                    !believed,
                    "a writer was granted while our reader still held (its validity ends {:?} \
                     after the attempt began)",
                    ours.deadline() - started
                );
                break w;
            }
            Err(e) => assert_eq!(e.kind(), ErrorKind::NotAcquired, "{e}"),
        }
        tokio::time::sleep(ms(50)).await;
    };
    assert_eq!(hash(&server, name)["mode"], "write");
    assert!(writer.release().await.unwrap());

    // The lease that would outlive the hash is refused, naming it, before anything is written.
    let before = keys(&server);
    let long = base.clone().ttl(Duration::from_secs(90));
    let err = m.read_lock_with(name, &long).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains("90s"), "{err}");
    assert_eq!(keys(&server), before, "the refusal wrote");
}

/// A Redisson reader with a short lease beside a ferrolock reader that leaves first: once the
/// Redisson lease ends no hold is left, and a writer must get the key then, not when the hash's
/// expiry our reader's grant raised to its own ttl runs out (Redisson's own read unlock lowers
/// the hash to the longest hold key left, so between Redisson readers it goes with the last
/// live hold).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redisson_read_lease_ending_after_our_reader_left_frees_the_key() {
    let classpath = redisson_classpath();
    let server = RedisServer::start();
    let mut r = Redisson::start(classpath, &server.url(), "single").await;
    let base = opts()
        .ttl(ferrolock::READ_LEASE_CAP)
        .node_timeout(Duration::from_secs(3));
    let m = manager(&[server.url()], base.clone());
    let name = "rw:lease-ends";

    let ours = m.read_lock_with(name, &base).await.unwrap();
    run(&mut r, "rlock", &format!("{name} 3000")).await;
    let field = hash(&server, name)
        .keys()
        .find(|f| *f != "mode" && f.starts_with(&format!("{}:", r.id)))
        .expect("Redisson's reader field")
        .clone();
    let theirs = timeout_key(name, &field, 1);
    assert!(ours.release().await.unwrap());
    assert_eq!(
        hash(&server, name)["mode"],
        "read",
        "Redisson's reader holds"
    );

    // Redisson's lease ends: its hold key expires, and no hold is left.
    let bound = Instant::now() + Duration::from_secs(60);
    while server.cmd::<i64>(&["EXISTS", &theirs]) == 1 {
        assert!(Instant::now() < bound, "Redisson's hold key never expired");
        tokio::time::sleep(ms(50)).await;
    }
    let left = pttl(&server, name);
    // Well short of the 30 s the hash was raised to: a writer gets in within this wait
    // only if the key went with its last hold.
    let wait = base.clone().wait(Some(Duration::from_secs(10)));
    let w = m.write_lock_with(name, &wait).await.unwrap_or_else(|e| {
        panic!(
            "no hold is left, yet the key stays read-held (its PTTL was {left} ms when \
             Redisson's hold key expired): {e}"
        )
    });
    assert!(w.release().await.unwrap());
}
