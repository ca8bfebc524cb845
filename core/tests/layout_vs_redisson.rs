//! The key layouts byte-compared (issue 33): each state is brought about once by a real
//! Redisson 4.7.0 client (`common/redisson.rs`) on one name and once by ferrolock on another
//! name of the same server; the raw server state (key names and types, values, hash fields,
//! zset members and scores, which keys carry a TTL) and what each side publishes must then be
//! the same byte for byte, once the name, the owners (hash fields) and the permit ids are
//! replaced by placeholders, whose own format is checked. The differences ferrolock makes on
//! purpose are named below (`OWN_KEYS`, and the steps that expect a different message), as
//! DESIGN.md's "Wire format" section says.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::redisson::{Redisson, redisson_classpath};
use common::*;
use ferrolock::{Lock, LockManager, LockOptions};
use ferrolock_testbed::RedisServer;

/// Both sides' lease: Redisson's explicit lease (no watchdog), ferrolock's ttl (its read cap).
const LEASE_MS: i64 = 30_000;
const REPLY: Duration = Duration::from_secs(30);
/// A lease left to end, for the reclaim.
const SHORT_LEASE_MS: i64 = 3_000;

/// Keys ferrolock writes beside the layout, on purpose (prefix, why). Each must carry a TTL,
/// except the fence counter, which must outlive every holder to keep fences increasing.
const OWN_KEYS: &[(&str, &str)] = &[
    // Re-send guards (`scripts::latch_key`): a script that must not run twice keeps its reply
    // there for a re-send after a dropped connection. Redisson's unlocks keep their own.
    ("ferrolock:latch:", "re-send latch"),
    // A counted lock's hold marks (`scripts::hold_key`): what a hold's release takes its count
    // with, living as long as the hold.
    ("ferrolock:hold:", "hold mark"),
    // The set of an owner's live holds (`holds.lua`): what tells a count whose hold lapsed.
    ("ferrolock:holds:", "live holds"),
    ("redisson_unlock_latch:", "Redisson's re-send latch"),
    // The waiter queue (DESIGN.md, "Waiter queue"): only ferrolock waiters queue.
    ("ferrolock:queue", "waiter queue"),
    // Fences go to ferrolock writers that ask for them; Redisson has no fences.
    ("ferrolock:fence:", "fence counter"),
];

/// A key's content, its bytes escaped (`escape_ascii`, which is one-to-one) after the
/// placeholders went in.
#[derive(Debug, PartialEq, Eq)]
enum Content {
    String(String),
    Hash(BTreeMap<String, String>),
    /// (member, score), sorted.
    Zset(Vec<(String, String)>),
}

#[derive(Debug, PartialEq, Eq)]
struct Entry {
    content: Content,
    /// PTTL > 0 (always at most the lease); false: no TTL.
    ttl: bool,
}

/// What a permit id stands for: its placeholder and the window (epoch ms, both ends
/// included) in which its hold was granted, so its score must be its lease after it.
struct Permit {
    raw: Vec<u8>,
    placeholder: String,
    granted: (i64, i64),
    lease_ms: i64,
}

/// One side's name and what it learnt of its owners and permit ids.
struct Side {
    who: &'static str,
    name: String,
    owners: Vec<Vec<u8>>,
    permits: Vec<Permit>,
    /// Keys of `OWN_KEYS` seen, by their prefix.
    own_seen: Vec<&'static str>,
}

impl Side {
    fn new(who: &'static str, name: String) -> Side {
        Side {
            who,
            name,
            owners: Vec::new(),
            permits: Vec::new(),
            own_seen: Vec::new(),
        }
    }

    /// Replaces the owners, then the name, by placeholders, and escapes the bytes.
    fn normalise(&self, bytes: &[u8]) -> String {
        let mut out = bytes.to_vec();
        for (i, owner) in self.owners.iter().enumerate() {
            out = replace(&out, owner, format!("<owner {}>", i + 1).as_bytes());
        }
        out = replace(&out, self.name.as_bytes(), b"<name>");
        out.escape_ascii().to_string()
    }

    /// A hold of permit ids (hex, as Redisson shows them and as ferrolock's token holds them)
    /// granted between `granted.0` and `granted.1` with a lease of `lease_ms`.
    fn learn_permits(&mut self, hex: &str, granted: (i64, i64), lease_ms: i64) {
        // Each id of one hold stands for the same placeholder: the order of ids within a hold
        // is random on both sides.
        let holds = 1 + self
            .permits
            .iter()
            .map(|p| &p.placeholder)
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        assert_eq!(hex.len() % 32, 0, "{}: permit ids {hex}", self.who);
        for id in hex.as_bytes().chunks(32) {
            let raw: Vec<u8> = id
                .chunks(2)
                .map(|b| u8::from_str_radix(std::str::from_utf8(b).unwrap(), 16).unwrap())
                .collect();
            self.permits.push(Permit {
                raw,
                placeholder: format!("<permit of hold {holds}>"),
                granted,
                lease_ms,
            });
        }
    }

    /// The state of this side's keys: every key whose name holds the name, its owners and
    /// permit ids replaced (each checked: an owner is `<client uuid>:<number>`, as Redisson's
    /// `<uuid>:<thread id>`; a permit id is 16 raw bytes scored by its grant + the lease).
    fn snapshot(&mut self, conn: &mut redis::Connection) -> BTreeMap<String, Entry> {
        let keys: Vec<Vec<u8>> = query(conn, &["KEYS", "*"]);
        let name = self.name.clone().into_bytes();
        // Owners first, from the hash at the name: the hold keys' names hold them too.
        let kind: String = query(conn, &["TYPE", &self.name]);
        if kind == "hash" {
            let fields: Vec<(Vec<u8>, Vec<u8>)> = query(conn, &["HGETALL", &self.name]);
            for (f, _) in &fields {
                self.learn_owner(f);
            }
        }
        let mut state = BTreeMap::new();
        for key in keys.iter().filter(|k| contains(k, &name)) {
            let k = String::from_utf8_lossy(key).to_string();
            let pttl: i64 = query(conn, &["PTTL", &k]);
            if let Some((prefix, why)) =
                OWN_KEYS.iter().find(|(p, _)| key.starts_with(p.as_bytes()))
            {
                // -2: a latch that expired since KEYS (they live a moment), which had a TTL.
                if *prefix != "ferrolock:fence:" {
                    assert!(pttl != -1, "{}: the {why} {k} has no TTL", self.who);
                }
                if !self.own_seen.contains(prefix) {
                    self.own_seen.push(prefix);
                }
                continue;
            }
            assert!(pttl != -2, "{k} went while it was read");
            assert!(pttl <= LEASE_MS, "{}: {k} has PTTL {pttl}", self.who);
            let kind: String = query(conn, &["TYPE", &k]);
            let content = match kind.as_str() {
                "string" => Content::String(self.normalise(&query::<Vec<u8>>(conn, &["GET", &k]))),
                "hash" => {
                    let fields: Vec<(Vec<u8>, Vec<u8>)> = query(conn, &["HGETALL", &k]);
                    Content::Hash(
                        fields
                            .iter()
                            .map(|(f, v)| (self.normalise(f), self.normalise(v)))
                            .collect(),
                    )
                }
                "zset" => {
                    let members: Vec<(Vec<u8>, i64)> =
                        query(conn, &["ZRANGE", &k, "0", "-1", "WITHSCORES"]);
                    let mut zset: Vec<(String, String)> =
                        members.iter().map(|(m, s)| self.permit(m, *s)).collect();
                    zset.sort();
                    Content::Zset(zset)
                }
                other => panic!("{}: {k} is a {other}", self.who),
            };
            state.insert(
                self.normalise(key),
                Entry {
                    content,
                    ttl: pttl > 0,
                },
            );
        }
        state
    }

    fn learn_owner(&mut self, field: &[u8]) {
        if field == b"mode" {
            return;
        }
        let owner = field.strip_suffix(b":write").unwrap_or(field);
        if self.owners.iter().any(|o| o == owner) {
            return;
        }
        let text = std::str::from_utf8(owner).unwrap_or_default();
        let (uuid, number) = text.split_once(':').unwrap_or_default();
        assert!(
            uuid.len() == 36
                && uuid.split('-').map(str::len).eq([8, 4, 4, 4, 12])
                && uuid.chars().all(|c| c == '-' || c.is_ascii_hexdigit())
                && !number.is_empty()
                && number.bytes().all(|b| b.is_ascii_digit()),
            "{}: the hash field {:?} is not <client uuid>:<number>",
            self.who,
            field.escape_ascii().to_string()
        );
        self.owners.push(owner.to_vec());
    }

    fn permit(&self, member: &[u8], score: i64) -> (String, String) {
        assert_eq!(
            member.len(),
            16,
            "{}: permit id {} is not 16 raw bytes",
            self.who,
            member.escape_ascii()
        );
        let p = self
            .permits
            .iter()
            .find(|p| p.raw == member)
            .unwrap_or_else(|| {
                panic!(
                    "{}: permit id {} is no hold's",
                    self.who,
                    member.escape_ascii()
                )
            });
        let (from, to) = (p.granted.0 + p.lease_ms, p.granted.1 + p.lease_ms);
        assert!(
            from <= score && score <= to,
            "{}: {} scored {score}, not its grant + the lease ({from}..={to})",
            self.who,
            p.placeholder
        );
        (
            p.placeholder.clone(),
            format!("<grant + lease of {}>", p.placeholder),
        )
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn replace(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

fn query<T: redis::FromRedisValue>(conn: &mut redis::Connection, args: &[&str]) -> T {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(conn).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Every message published on the server (PSUBSCRIBE *), read up to a marker this publishes
/// after the steps: a subscriber gets its messages in publishing order, so everything the
/// steps published is read, however slow the machine.
struct Messages {
    conn: redis::Connection,
    markers: u64,
}

const MARKER: &str = "layout-vs-redisson:marker";

impl Messages {
    fn start(server: &RedisServer) -> Messages {
        let mut conn = server.client();
        conn.set_read_timeout(Some(REPLY)).unwrap();
        redis::cmd("PSUBSCRIBE").arg("*").exec(&mut conn).unwrap();
        Messages { conn, markers: 0 }
    }

    /// (channel, payload) of each message since the last call, normalised, per side.
    fn take(&mut self, server: &RedisServer, sides: [&Side; 2]) -> [Vec<(String, String)>; 2] {
        self.markers += 1;
        let marker = self.markers.to_string();
        server.cmd::<i64>(&["PUBLISH", MARKER, &marker]);
        let mut out = [Vec::new(), Vec::new()];
        loop {
            let msg = self.conn.recv_response().expect("a message");
            let parts: Vec<Vec<u8>> = redis::from_redis_value(msg).expect("a message");
            let kind = String::from_utf8_lossy(&parts[0]).to_string();
            if kind == "psubscribe" {
                continue;
            }
            assert_eq!(kind, "pmessage", "{parts:?}");
            let (channel, payload) = (&parts[2], &parts[3]);
            if channel == MARKER.as_bytes() {
                if payload == marker.as_bytes() {
                    return out;
                }
                continue;
            }
            let i = sides
                .iter()
                .position(|s| contains(channel, s.name.as_bytes()))
                .unwrap_or_else(|| {
                    panic!("a message on {} is neither side's", channel.escape_ascii())
                });
            out[i].push((sides[i].normalise(channel), sides[i].normalise(payload)));
        }
    }
}

/// The comparison of one state.
struct Bed {
    server: RedisServer,
    conn: redis::Connection,
    messages: Messages,
    /// Every side's name so far: each key on the server must hold one (nothing is left out
    /// of the comparison by the name filter).
    names: Vec<String>,
}

impl Bed {
    /// Compares both sides' keys and the messages published since the last check, which must
    /// be `messages` on Redisson's side (`ours`: ferrolock's, where it differs on purpose).
    fn check(
        &mut self,
        step: &str,
        r: &mut Side,
        f: &mut Side,
        messages: &[(&str, &str)],
        ours: Option<&[(&str, &str)]>,
    ) {
        let [rm, fm] = self.messages.take(&self.server, [r, f]);
        for name in [&r.name, &f.name] {
            if !self.names.contains(name) {
                self.names.push(name.clone());
            }
        }
        let keys: Vec<Vec<u8>> = query(&mut self.conn, &["KEYS", "*"]);
        for k in keys {
            assert!(
                self.names.iter().any(|n| contains(&k, n.as_bytes())),
                "{step}: {} is no side's",
                k.escape_ascii()
            );
        }
        let (rs, fs) = (r.snapshot(&mut self.conn), f.snapshot(&mut self.conn));
        eprintln!("{step}: {rs:?}; published {rm:?}");
        assert_eq!(
            fs, rs,
            "{step}: the keys (left ferrolock's, right Redisson's)"
        );
        let expect = |m: &[(&str, &str)]| -> Vec<(String, String)> {
            m.iter()
                .map(|(c, p)| (c.to_string(), p.to_string()))
                .collect()
        };
        assert_eq!(rm, expect(messages), "{step}: what Redisson published");
        assert_eq!(
            fm,
            expect(ours.unwrap_or(messages)),
            "{step}: what ferrolock published"
        );
    }
}

/// Runs `command args` on Redisson and waits for its reply `<command>ed <key>`.
async fn run(r: &mut Redisson, command: &str, args: &str) {
    r.send(&format!("{command} {args}")).await;
    let key = args.split(' ').next().unwrap_or_default();
    r.expect(&format!("{command}ed {key}"), REPLY).await;
}

fn rw_opts() -> LockOptions {
    opts().ttl(Duration::from_millis(LEASE_MS as u64))
}

async fn read(m: &LockManager, name: &str, owner: u64) -> Lock {
    m.read_lock_owned(name, owner, &rw_opts())
        .await
        .expect("read lock")
}

async fn write(m: &LockManager, name: &str, owner: u64, fencing: bool) -> Lock {
    m.write_lock_owned(name, owner, &rw_opts().fencing(fencing))
        .await
        .expect("write lock")
}

async fn release(lock: Lock) {
    assert!(lock.release().await.expect("release"), "released");
}

const NOTHING: &[(&str, &str)] = &[];
const READ_FREED: &[(&str, &str)] = &[("redisson_rwlock:{<name>}", "0")];
const WRITE_FREED: &[(&str, &str)] = &[("redisson_rwlock:{<name>}", "1")];

/// The read-write lock's states, on a plain name and on a name with a hash tag (no braces
/// added to its names): one read hold; one owner's read hold twice; two readers; one write
/// hold; a write hold and the same owner's read hold under it (a downgrade), and each
/// release between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rwlock_states_are_redissons_byte_for_byte() {
    let classpath = redisson_classpath();
    let server = RedisServer::start();
    let mut r1 = Redisson::start(classpath, &server.url(), "single").await;
    let mut r2 = Redisson::start(classpath, &server.url(), "single").await;
    let m = manager(&[server.url()], rw_opts());
    let mut bed = Bed {
        conn: server.client(),
        messages: Messages::start(&server),
        server,
        names: Vec::new(),
    };
    for (rname, fname) in [("rw:by-redisson", "rw:by-ferrolock"), ("rw{r}x", "rw{f}x")] {
        let tagged = rname.contains('{');
        // Both channels' names follow the name's braces rule.
        let channel = |m: &'static [(&'static str, &'static str)]| -> Vec<(&str, &str)> {
            m.iter()
                .map(|(c, p)| (if tagged { "redisson_rwlock:<name>" } else { *c }, *p))
                .collect()
        };
        let (read_freed, write_freed) = (channel(READ_FREED), channel(WRITE_FREED));
        let lease = LEASE_MS.to_string();

        // One read hold, then its release.
        let (mut rs, mut fs) = (
            Side::new("Redisson", format!("{rname}:1")),
            Side::new("ferrolock", format!("{fname}:1")),
        );
        run(&mut r1, "rlock", &format!("{} {lease}", rs.name)).await;
        let h = read(&m, &fs.name, 1).await;
        bed.check("one read hold", &mut rs, &mut fs, NOTHING, None);
        run(&mut r1, "runlock", &rs.name).await;
        release(h).await;
        bed.check("its release", &mut rs, &mut fs, &read_freed, None);

        // One owner's read hold twice (re-entry), then one release at a time.
        let (mut rs, mut fs) = (
            Side::new("Redisson", format!("{rname}:2")),
            Side::new("ferrolock", format!("{fname}:2")),
        );
        run(&mut r1, "rlock", &format!("{} {lease}", rs.name)).await;
        let h1 = read(&m, &fs.name, 1).await;
        run(&mut r1, "rlock", &format!("{} {lease}", rs.name)).await;
        let h2 = read(&m, &fs.name, 1).await;
        bed.check(
            "one owner's read hold twice",
            &mut rs,
            &mut fs,
            NOTHING,
            None,
        );
        run(&mut r1, "runlock", &rs.name).await;
        release(h2).await;
        bed.check("one of them released", &mut rs, &mut fs, NOTHING, None);
        run(&mut r1, "runlock", &rs.name).await;
        release(h1).await;
        bed.check("both released", &mut rs, &mut fs, &read_freed, None);

        // Two readers, then the first one's release, then the second's.
        let (mut rs, mut fs) = (
            Side::new("Redisson", format!("{rname}:3")),
            Side::new("ferrolock", format!("{fname}:3")),
        );
        run(&mut r1, "rlock", &format!("{} {lease}", rs.name)).await;
        let h1 = read(&m, &fs.name, 1).await;
        // Seen before the second reader: each side's first owner is <owner 1>.
        bed.check("the first reader", &mut rs, &mut fs, NOTHING, None);
        run(&mut r2, "rlock", &format!("{} {lease}", rs.name)).await;
        let h2 = read(&m, &fs.name, 2).await;
        bed.check("two readers", &mut rs, &mut fs, NOTHING, None);
        run(&mut r1, "runlock", &rs.name).await;
        release(h1).await;
        bed.check("the first reader released", &mut rs, &mut fs, NOTHING, None);
        run(&mut r2, "runlock", &rs.name).await;
        release(h2).await;
        bed.check(
            "the second reader released",
            &mut rs,
            &mut fs,
            &read_freed,
            None,
        );

        // One write hold, then its release.
        let (mut rs, mut fs) = (
            Side::new("Redisson", format!("{rname}:4")),
            Side::new("ferrolock", format!("{fname}:4")),
        );
        run(&mut r1, "wlock", &format!("{} {lease}", rs.name)).await;
        let h = write(&m, &fs.name, 1, false).await;
        bed.check("one write hold", &mut rs, &mut fs, NOTHING, None);
        run(&mut r1, "wunlock", &rs.name).await;
        release(h).await;
        bed.check("its release", &mut rs, &mut fs, &write_freed, None);

        // A write hold and a read hold under it by the same owner (a downgrade); the write
        // release, then the read release.
        let (mut rs, mut fs) = (
            Side::new("Redisson", format!("{rname}:5")),
            Side::new("ferrolock", format!("{fname}:5")),
        );
        run(&mut r1, "wlock", &format!("{} {lease}", rs.name)).await;
        let w = write(&m, &fs.name, 1, false).await;
        run(&mut r1, "rlock", &format!("{} {lease}", rs.name)).await;
        let h = read(&m, &fs.name, 1).await;
        bed.check(
            "a write hold and its owner's read hold",
            &mut rs,
            &mut fs,
            NOTHING,
            None,
        );
        run(&mut r1, "wunlock", &rs.name).await;
        release(w).await;
        // On purpose: ferrolock's write release that leaves read holds publishes "1", so
        // waiting readers (Redisson's too) re-check at once; Redisson's publishes nothing and
        // its waiting readers wait for their next poll (DESIGN.md, "Read-write lock").
        bed.check(
            "the write hold released, the read hold left",
            &mut rs,
            &mut fs,
            NOTHING,
            Some(&write_freed),
        );
        run(&mut r1, "runlock", &rs.name).await;
        release(h).await;
        bed.check(
            "the read hold released",
            &mut rs,
            &mut fs,
            &read_freed,
            None,
        );

        // A writer waiting behind a reader, then the reader's release, which lets it in. On
        // purpose: a waiting ferrolock writer is queued in `ferrolock:queue:{name}` and its
        // lease and join-time zsets (with TTLs), so no reader that comes after it passes it;
        // Redisson's waiters keep nothing on the server.
        let (mut rs, mut fs) = (
            Side::new("Redisson", format!("{rname}:7")),
            Side::new("ferrolock", format!("{fname}:7")),
        );
        run(&mut r1, "rlock", &format!("{} {lease}", rs.name)).await;
        let h = read(&m, &fs.name, 1).await;
        r2.send(&format!("wlock {} {lease}", rs.name)).await;
        let waiter = {
            let (m, name) = (m.clone(), fs.name.clone());
            tokio::spawn(async move { write(&m, &name, 2, false).await })
        };
        let queue = ferrolock::queue_key(&fs.name);
        let bound = std::time::Instant::now() + REPLY;
        while !bed.server.cmd::<bool>(&["EXISTS", &queue]) {
            assert!(std::time::Instant::now() < bound, "our writer never queued");
            tokio::time::sleep(ms(10)).await;
        }
        bed.check(
            "a writer waiting behind a reader",
            &mut rs,
            &mut fs,
            NOTHING,
            None,
        );
        assert!(
            fs.own_seen.contains(&"ferrolock:queue"),
            "{:?}",
            fs.own_seen
        );
        run(&mut r1, "runlock", &rs.name).await;
        release(h).await;
        r2.expect(&format!("wlocked {}", rs.name), REPLY).await;
        let w = waiter.await.unwrap();
        bed.check(
            "the reader released, the writer in",
            &mut rs,
            &mut fs,
            &read_freed,
            None,
        );
        run(&mut r2, "wunlock", &rs.name).await;
        release(w).await;
        bed.check("its release", &mut rs, &mut fs, &write_freed, None);

        // On purpose: a ferrolock writer that asks for fences also keeps the fence counter
        // `ferrolock:fence:{name}` (no TTL: fences must keep increasing); the hash is the same.
        let (mut rs, mut fs) = (
            Side::new("Redisson", format!("{rname}:6")),
            Side::new("ferrolock", format!("{fname}:6")),
        );
        run(&mut r1, "wlock", &format!("{} {lease}", rs.name)).await;
        let h = write(&m, &fs.name, 1, true).await;
        assert!(h.fence().is_some(), "a fence");
        bed.check("a fenced write hold", &mut rs, &mut fs, NOTHING, None);
        assert!(
            fs.own_seen.contains(&"ferrolock:fence:"),
            "{:?}",
            fs.own_seen
        );
        run(&mut r1, "wunlock", &rs.name).await;
        release(h).await;
        bed.check("its release", &mut rs, &mut fs, &write_freed, None);
    }
    r1.send("quit").await;
    r2.send("quit").await;
}

/// The semaphore's states: a pool of 3 permits with 1, then 2 more taken (each with its own
/// lease), then each hold's release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_states_are_redissons_byte_for_byte() {
    let classpath = redisson_classpath();
    let server = RedisServer::start();
    let mut r = Redisson::start(classpath, &server.url(), "single").await;
    let m = manager(&[server.url()], rw_opts());
    let mut bed = Bed {
        conn: server.client(),
        messages: Messages::start(&server),
        server,
        names: Vec::new(),
    };
    let (mut rs, mut fs) = (
        Side::new("Redisson", "sem:by-redisson".into()),
        Side::new("ferrolock", "sem:by-ferrolock".into()),
    );
    // The pool: Redisson sets it with trySetPermits, which publishes it; ferrolock's first
    // acquire sets it (on purpose: its pool size is an argument of every acquire, so it needs
    // no call of its own), publishing nothing. The states after it are compared.
    r.send(&format!("ssetpermits {} 3", rs.name)).await;
    assert_eq!(
        r.expect(&format!("ssetpermits {} ", rs.name), REPLY).await,
        format!("ssetpermits {} true", rs.name)
    );
    let [rm, _] = bed.messages.take(&bed.server, [&rs, &fs]);
    assert_eq!(rm, [("redisson_sc:{<name>}".to_string(), "3".to_string())]);

    let (ids1, h1) = acquire(&mut r, &m, &mut rs, &mut fs, 1, LEASE_MS).await;
    bed.check("1 of 3 permits taken", &mut rs, &mut fs, NOTHING, None);
    let (ids2, h2) = acquire(&mut r, &m, &mut rs, &mut fs, 2, LEASE_MS).await;
    bed.check(
        "1, then 2 of 3 permits taken",
        &mut rs,
        &mut fs,
        NOTHING,
        None,
    );

    r.send(&format!("srelease {} {ids2}", rs.name)).await;
    r.expect(&format!("sreleased {}", rs.name), REPLY).await;
    release(h2).await;
    bed.check(
        "the hold of 2 released",
        &mut rs,
        &mut fs,
        &[("redisson_sc:{<name>}", "2")],
        None,
    );
    r.send(&format!("srelease {} {ids1}", rs.name)).await;
    r.expect(&format!("sreleased {}", rs.name), REPLY).await;
    release(h1).await;
    bed.check(
        "the hold of 1 released",
        &mut rs,
        &mut fs,
        &[("redisson_sc:{<name>}", "1")],
        None,
    );

    // A lease that ends (a crashed holder: nothing renews it) stays in the zset, published by
    // nobody, until the next acquire reclaims it. Beside a hold that stays, so that the
    // counter after the reclaim (2), what it freed (1) and the pool (3) differ. The short lease
    // still leaves time for the grant's reply on a loaded machine.
    let (ids1, h1) = acquire(&mut r, &m, &mut rs, &mut fs, 1, LEASE_MS).await;
    let (_, expired) = acquire(&mut r, &m, &mut rs, &mut fs, 1, SHORT_LEASE_MS).await;
    let ends = rs
        .permits
        .iter()
        .chain(&fs.permits)
        .filter(|p| p.lease_ms == SHORT_LEASE_MS)
        .map(|p| p.granted.1 + p.lease_ms)
        .max()
        .unwrap();
    // Past its end on this host's clock, which both sides' reclaims use (ferrolock's through
    // the server's TIME, on this host too).
    while now_ms() <= ends {
        tokio::time::sleep(ms(20)).await;
    }
    bed.check("a lease ended", &mut rs, &mut fs, NOTHING, None);
    // The reclaim publishes the counter's new value (Redisson 4.7.0's scripts: `incrby`, then
    // publish the value when above 0), so up to that many waiters wake.
    let (ids2, h2) = acquire(&mut r, &m, &mut rs, &mut fs, 1, LEASE_MS).await;
    bed.check(
        "the next acquire reclaimed it",
        &mut rs,
        &mut fs,
        &[("redisson_sc:{<name>}", "2")],
        None,
    );
    for (ids, h) in [(ids1, h1), (ids2, h2)] {
        r.send(&format!("srelease {} {ids}", rs.name)).await;
        r.expect(&format!("sreleased {}", rs.name), REPLY).await;
        release(h).await;
    }
    bed.check(
        "both holds released",
        &mut rs,
        &mut fs,
        &[("redisson_sc:{<name>}", "1"), ("redisson_sc:{<name>}", "1")],
        None,
    );
    drop(expired);
    r.send("quit").await;
}

/// Takes `count` permits on each side; returns Redisson's ids (as it shows them) and ours.
async fn acquire(
    r: &mut Redisson,
    m: &LockManager,
    rs: &mut Side,
    fs: &mut Side,
    count: u32,
    lease_ms: i64,
) -> (String, Lock) {
    let before = now_ms();
    r.send(&format!("sacquire {} {count} {lease_ms}", rs.name))
        .await;
    let line = r.expect(&format!("sacquire {} ", rs.name), REPLY).await;
    let after = now_ms();
    let ids = line.rsplit(' ').next().unwrap().to_string();
    assert_ne!(ids, "none", "Redisson's acquire of {count}");
    rs.learn_permits(&ids.replace(',', ""), (before, after), lease_ms);
    let before = now_ms();
    let opts = rw_opts().ttl(Duration::from_millis(lease_ms as u64));
    let hold = m
        .semaphore_with(&fs.name, 3, count, &opts)
        .await
        .expect("semaphore");
    fs.learn_permits(hold.token(), (before, now_ms()), lease_ms);
    (ids, hold)
}
