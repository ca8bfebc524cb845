//! Redisson 4.7.0's `RReadWriteLock` as it is on a real redis-server: the layout ferrolock's
//! read-write lock must share (issue 33), read from the keys a real Java client leaves, and the
//! messages it publishes. `common/redisson.rs` runs the Java client.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::redisson::{Redisson, redisson_classpath};
use common::*;
use ferrolock::__wire::rw::{rwlock_channel, rwlock_timeout_prefix};
use ferrolock_testbed::RedisServer;

/// Redisson's lease when no lease is given (its watchdog's `lockWatchdogTimeout`).
const WATCHDOG_LEASE_MS: i64 = 30_000;

fn hash(server: &RedisServer, key: &str) -> BTreeMap<String, String> {
    server.cmd(&["HGETALL", key])
}

fn keys(server: &RedisServer) -> Vec<String> {
    let mut keys: Vec<String> = server.cmd(&["KEYS", "*"]);
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
