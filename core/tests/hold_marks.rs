//! The handles of one owner of a counted lock (reentrant, read, write) share one hash field:
//! each hold's release must take back only the count that hold added, on the nodes where it
//! added it, once. Each grant puts a mark (`ferrolock:hold:{key}:<hold id>`) that lives as long
//! as the hold, and a release or undo takes a count only with it. Without it, a re-entry's
//! release took the outer hold's count on the nodes the re-entry had missed, and a re-sent
//! release that ran after its latch had expired took a second count: either way the outer
//! handle still said held while another owner got the key. Found by a review, each shown here
//! with two holders before the fix.

// A std mutex held across awaits on purpose: every test has its own runtime.
#![allow(clippy::await_holding_lock)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use ferrolock::__wire::rw::rwlock_timeout_prefix;
use ferrolock::{ErrorKind, Lock, LockManager, LockOptions, LockStatus};
use ferrolock_testbed::{Direction, Proxy, RedisServer};

fn hash(server: &RedisServer, key: &str) -> BTreeMap<String, String> {
    server.cmd(&["HGETALL", key])
}

fn o() -> LockOptions {
    opts()
        .ttl(Duration::from_secs(30))
        .wait(Some(Duration::ZERO))
        .watchdog(false)
}

#[derive(Clone, Copy, Debug)]
enum Counted {
    Read,
    Write,
    Reentrant,
}

async fn take(m: &LockManager, kind: Counted, key: &str, owner: u64) -> ferrolock::Result<Lock> {
    take_with(m, kind, key, owner, &o()).await
}

async fn take_with(
    m: &LockManager,
    kind: Counted,
    key: &str,
    owner: u64,
    o: &LockOptions,
) -> ferrolock::Result<Lock> {
    match kind {
        Counted::Read => m.read_lock_owned(key, owner, o).await,
        Counted::Write => m.write_lock_owned(key, owner, o).await,
        Counted::Reentrant => {
            m.acquire_owned(key, owner, &o.clone().reentrant(true))
                .await
        }
    }
}

/// The count of the owner's field on each node (the one number per node in the hash besides
/// `mode`).
fn counts(servers: &[RedisServer], key: &str) -> Vec<u32> {
    servers
        .iter()
        .map(|s| {
            hash(s, key)
                .into_iter()
                .filter(|(f, _)| f != "mode")
                .map(|(_, n)| n.parse::<u32>().unwrap())
                .sum()
        })
        .collect()
}

/// Three nodes, each behind a proxy, and a manager through the proxies holding an outer hold of
/// `kind` on `key` on all three.
struct Three {
    servers: [RedisServer; 3],
    proxies: Vec<Proxy>,
    m: LockManager,
}

impl Three {
    async fn with_outer(kind: Counted, key: &str) -> (Three, Lock) {
        Three::with_outer_using(kind, key, o()).await
    }

    async fn with_outer_using(kind: Counted, key: &str, o: LockOptions) -> (Three, Lock) {
        let servers = [
            RedisServer::start(),
            RedisServer::start(),
            RedisServer::start(),
        ];
        let proxies: Vec<Proxy> = servers.iter().map(|s| Proxy::start(s.port())).collect();
        let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
        let m = manager(&urls, o.clone());
        let outer = take_with(&m, kind, key, 9, &o).await.unwrap();
        settle(&servers, key, [1, 1, 1]).await;
        (
            Three {
                servers,
                proxies,
                m,
            },
            outer,
        )
    }

    /// A re-entry granted while node `cut` is cut off.
    async fn re_enter_without(&self, kind: Counted, key: &str, cut: usize) -> Lock {
        self.proxies[cut].cut();
        let inner = take(&self.m, kind, key, 9).await.unwrap();
        // Well past the node timeout: nothing of this re-entry still goes to that node.
        tokio::time::sleep(ms(1000)).await;
        self.proxies[cut].heal();
        inner
    }
}

/// Two re-entries held at once, each granted while a different node was cut off, then
/// released: the outer hold stays on every node, and another owner's write lock is refused.
/// Before, each release took a count everywhere, deleting the outer hold on two nodes of three.
#[tokio::test(flavor = "multi_thread")]
async fn a_re_entrys_release_takes_nothing_where_the_re_entry_was_not_granted() {
    let _serial = serial();
    for kind in [Counted::Read, Counted::Write, Counted::Reentrant] {
        let key = format!("marks:re-entry:{kind:?}");
        let (bed, outer) = Three::with_outer(kind, &key).await;
        let servers = &bed.servers;
        let direct: Vec<String> = servers.iter().map(RedisServer::url).collect();
        let other = manager(&direct, o());
        let inner1 = bed.re_enter_without(kind, &key, 2).await;
        let inner2 = bed.re_enter_without(kind, &key, 1).await;
        // The faults happened: each re-entry missed one node.
        assert_eq!(counts(servers, &key), [3, 2, 2], "{kind:?}");
        assert!(inner1.release().await.unwrap(), "{kind:?}");
        assert!(inner2.release().await.unwrap(), "{kind:?}");
        // A release returns at its quorum; the last node's part may still be on its way.
        settle(servers, &key, [1, 1, 1]).await;
        let rival = other.write_lock_with(&key, &o()).await;
        assert_eq!(
            rival.as_ref().map(Lock::token).map_err(|e| e.kind()),
            Err(ErrorKind::NotAcquired),
            "{kind:?}: another writer got the key beside the outer handle ({:?})",
            outer.status()
        );
        assert!(outer.release().await.unwrap(), "{kind:?}");
        settle(servers, &key, [0, 0, 0]).await;
    }
}

/// A re-entry granted while node 0 was cut off, extended while node 2 is: only node 1 holds
/// its count, so the extend misses its quorum. Before, node 0 answered "renewed" for it on the
/// outer hold's count (the owner's field), and the re-entry's validity went on while its
/// count stood on one node of three: the outer released, node 0 was free, and a node 2 that
/// lost its key made a quorum for another owner.
#[tokio::test(flavor = "multi_thread")]
async fn a_re_entry_is_renewed_only_where_it_has_its_count() {
    let _serial = serial();
    for kind in [Counted::Read, Counted::Write, Counted::Reentrant] {
        let key = format!("marks:renewal:{kind:?}");
        let (bed, outer) = Three::with_outer(kind, &key).await;
        let (servers, proxies) = (&bed.servers, &bed.proxies);
        let inner = bed.re_enter_without(kind, &key, 0).await;
        // The fault happened: the re-entry missed node 0.
        assert_eq!(counts(servers, &key), [1, 2, 2], "{kind:?}");
        proxies[2].cut();
        let extended = inner.extend().await;
        assert!(
            extended.is_err(),
            "{kind:?}: extended on one node of its own and one of the outer's: {extended:?}"
        );
        proxies[2].heal();
        drop(inner);
        assert!(outer.release().await.unwrap(), "{kind:?}");
    }
}

/// Waits until the counts are `want` (a node's part of a release may come after the quorum's),
/// or fails with the counts last seen once that can no longer be the reason.
async fn settle(servers: &[RedisServer], key: &str, want: [u32; 3]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = counts(servers, key);
        if seen == want {
            return;
        }
        if Instant::now() >= deadline {
            // Which holds' marks each node still has: a release that never ran there, or a
            // count added after its undo.
            let marks: Vec<Vec<String>> = servers
                .iter()
                .map(|s| s.cmd(&["KEYS", "ferrolock:hold:*"]))
                .collect();
            panic!("{key}: counts {seen:?}, not {want:?}; hold marks by node: {marks:?}");
        }
        tokio::time::sleep(ms(20)).await;
    }
}

/// A nested write release that ran, lost its reply, and was sent again on a new connection,
/// where it ran only after its latch had expired (the server held writes back, as a manual
/// failover does): the second run takes nothing. Before, it took the outer hold's count, and a
/// second writer got the key.
#[tokio::test(flavor = "multi_thread")]
async fn a_release_re_sent_after_its_latch_expired_takes_nothing_twice() {
    let _serial = serial();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    // The latch lives twice the node timeout (6 s); the server holds writes back for longer.
    let oo = o().node_timeout(ms(3000));
    let m = manager(&[proxy.url()], oo.clone());
    let other = manager(&[server.url()], oo.clone());
    let key = "marks:late-re-send";
    let outer = m.write_lock_owned(key, 9, &oo).await.unwrap();
    let inner = m.write_lock_owned(key, 9, &oo).await.unwrap();
    let field = format!("{}:write", outer.token());
    let count = || server.cmd::<Option<String>>(&["HGET", key, &field]);
    assert_eq!(count().as_deref(), Some("2"));
    let sent = calls(&server, "evalsha");
    proxy.hold(Direction::Down);
    let release = tokio::spawn(async move { inner.release().await });
    let deadline = Instant::now() + Duration::from_secs(10);
    while count().as_deref() != Some("1") {
        assert!(Instant::now() < deadline, "the nested release never ran");
        tokio::time::sleep(ms(2)).await;
    }
    server.cmd::<()>(&["CLIENT", "PAUSE", "8000", "WRITE"]);
    proxy.reset();
    let _ = release.await.unwrap();
    // The fault happened: the release ran twice (the re-send once the pause was over).
    let deadline = Instant::now() + Duration::from_secs(30);
    while calls(&server, "evalsha") < sent + 2 {
        assert!(
            Instant::now() < deadline,
            "the release was never sent again"
        );
        tokio::time::sleep(ms(50)).await;
    }
    assert_eq!(
        count().as_deref(),
        Some("1"),
        "the re-send took a second count"
    );
    let rival = other.write_lock_with(key, &oo).await;
    assert_eq!(
        rival.as_ref().map(Lock::token).map_err(|e| e.kind()),
        Err(ErrorKind::NotAcquired),
        "a second writer got the key beside the outer one"
    );
    assert_eq!(outer.status(), LockStatus::Held);
    assert!(outer.release().await.unwrap());
}

/// An inner read re-entry with a short ttl, renewed by the watchdog: the hold keys every handle
/// of the owner shares are never shortened by it. Before, its renewal cut the outer's hold key
/// to the inner's ttl; once the inner was released that key lapsed, another reader's release
/// took the outer for a crashed reader and freed the key, and a writer got it beside the outer.
#[tokio::test(flavor = "multi_thread")]
async fn a_short_read_re_entry_never_shortens_the_outer_hold() {
    let _serial = serial();
    let server = RedisServer::start();
    let urls = [server.url()];
    let m = manager(&urls, o());
    let m2 = manager(&urls, o());
    let key = "marks:short-inner";
    let outer = m
        .read_lock_owned(key, 9, &o().watchdog(true))
        .await
        .unwrap();
    let other_reader = m2.read_lock_with(key, &o()).await.unwrap();
    let short = Duration::from_secs(1);
    let inner = m
        .read_lock_owned(key, 9, &o().watchdog(true).ttl(short))
        .await
        .unwrap();
    let renewals = calls(&server, "evalsha");
    tokio::time::sleep(short).await;
    // The fault happened: the inner handle was renewed (every ttl/3).
    assert!(
        calls(&server, "evalsha") > renewals,
        "the inner was never renewed"
    );
    let outer_key = format!("{}:1", rwlock_timeout_prefix(key, outer.token()));
    let left = pttl(&server, &outer_key);
    assert!(left > 20_000, "the outer's hold key was cut to {left} ms");
    inner.release().await.unwrap();
    tokio::time::sleep(short * 2).await;
    assert!(other_reader.release().await.unwrap());
    let writer = m2.write_lock_with(key, &o()).await;
    assert_eq!(
        writer.as_ref().map(Lock::token).map_err(|e| e.kind()),
        Err(ErrorKind::NotAcquired),
        "a writer got the key beside the outer reader ({:?})",
        outer.status()
    );
    assert!(outer.release().await.unwrap());
}

/// The hold keys are numbered: a release drops the last one, which may be another handle's.
/// The ones left live at least as long as it did. Before, an inner hold of 1 s released before
/// one of 30 s left the 1 s key, and the outer and the 30 s handle were lost a second later.
#[tokio::test(flavor = "multi_thread")]
async fn a_read_release_keeps_the_longest_hold_key() {
    let _serial = serial();
    let server = RedisServer::start();
    let m = manager(&[server.url()], o());
    let key = "marks:numbered";
    let outer = m.read_lock_owned(key, 9, &o()).await.unwrap();
    let brief = m
        .read_lock_owned(key, 9, &o().ttl(Duration::from_secs(1)))
        .await
        .unwrap();
    let long = m.read_lock_owned(key, 9, &o()).await.unwrap();
    let prefix = rwlock_timeout_prefix(key, outer.token());
    // The fault's setup: the brief hold's key is the second, the long one's the third.
    assert!(pttl(&server, &format!("{prefix}:2")) <= 1_000);
    brief.release().await.unwrap();
    assert_eq!(pttl(&server, &format!("{prefix}:3")), -2);
    let left = pttl(&server, &format!("{prefix}:2"));
    assert!(left > 20_000, "the hold keys left lapse in {left} ms");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    outer.extend().await.expect("the outer hold lapsed");
    assert!(long.release().await.unwrap());
    assert!(outer.release().await.unwrap());
}

/// A re-entry granted on one node of three, whose requests ran on the other two but whose
/// replies never came back there (unknown outcomes): it fails, and its count is taken back
/// on all three, because an undo takes a count only with the mark the re-entry left. Before
/// the marks, a re-entry was never undone where its outcome was unknown (taking a count that
/// was never added would have freed the outer hold), so the count stayed one too high there
/// and the key outlived the owner's last release by a ttl.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_re_entry_is_undone_where_its_outcome_is_unknown() {
    let _serial = serial();
    // A node timeout a loaded machine meets: the outer's release after the links' reset
    // reconnects first, and a release that missed its node timeout there would leave its
    // count to the ttl (a background release, correct, but not what this test looks at).
    let slow = o().node_timeout(Duration::from_secs(1));
    for kind in [Counted::Read, Counted::Write, Counted::Reentrant] {
        let key = format!("marks:unknown-re-entry:{kind:?}");
        let (bed, outer) = Three::with_outer_using(kind, &key, slow.clone()).await;
        let (servers, proxies) = (&bed.servers, &bed.proxies);
        let sent: Vec<u64> = servers.iter().map(|s| calls(s, "evalsha")).collect();
        proxies[1].hold(Direction::Down);
        proxies[2].hold(Direction::Down);
        let inner = take_with(&bed.m, kind, &key, 9, &slow).await;
        assert!(inner.is_err(), "{kind:?}: granted on one node of three");
        // The fault happened: the re-entry ran on the two nodes whose replies were held.
        for i in [1, 2] {
            assert!(
                calls(&servers[i], "evalsha") > sent[i],
                "{kind:?}: node {i}"
            );
        }
        settle(servers, &key, [1, 1, 1]).await;
        proxies[1].reset();
        proxies[2].reset();
        assert_eq!(outer.status(), LockStatus::Held, "{kind:?}");
        assert!(outer.release().await.unwrap(), "{kind:?}");
        settle(servers, &key, [0, 0, 0]).await;
    }
}

/// The `ferrolock:holds:*` sets on `server`.
fn hold_sets(server: &RedisServer) -> Vec<String> {
    server.cmd(&["KEYS", "ferrolock:holds:*"])
}

/// An owner's set of live holds (`holds.lua`) is gone after its last release, in every order
/// and for every counted kind, after a downgrade's releases in either order, and after
/// an undo; it is renewed with its holds, and outlives a lost hold by no more than its ttl.
#[tokio::test(flavor = "multi_thread")]
async fn the_set_of_live_holds_is_left_behind_by_no_release_undo_or_loss() {
    let _serial = serial();
    let server = RedisServer::start();
    let m = manager(&[server.url()], o());
    for kind in [Counted::Read, Counted::Write, Counted::Reentrant] {
        for outer_first in [true, false] {
            let key = format!("sets:{kind:?}:{outer_first}");
            let outer = take(&m, kind, &key, 4).await.unwrap();
            let inner = take(&m, kind, &key, 4).await.unwrap();
            assert_eq!(hold_sets(&server).len(), 1, "{key}");
            let (a, b) = if outer_first {
                (outer, inner)
            } else {
                (inner, outer)
            };
            assert!(a.release().await.unwrap(), "{key}");
            assert_eq!(hold_sets(&server).len(), 1, "{key}");
            assert!(b.release().await.unwrap(), "{key}");
            assert_eq!(hold_sets(&server), Vec::<String>::new(), "{key}");
            assert_eq!(server.cmd::<i64>(&["EXISTS", &key]), 0, "{key}");
        }
    }
    for write_first in [true, false] {
        let key = format!("sets:downgrade:{write_first}");
        let w = m.write_lock_owned(&key, 5, &o()).await.unwrap();
        let r = m.read_lock_owned(&key, 5, &o()).await.unwrap();
        let (a, b) = if write_first { (w, r) } else { (r, w) };
        assert!(a.release().await.unwrap(), "{key}");
        assert!(b.release().await.unwrap(), "{key}");
        assert_eq!(hold_sets(&server), Vec::<String>::new(), "{key}");
        assert_eq!(server.cmd::<i64>(&["EXISTS", &key]), 0, "{key}");
    }
    // Renewed with its holds: the set's expiry goes up with two renewals, never past the ttl.
    let short = opts()
        .ttl(Duration::from_secs(6))
        .node_timeout(Duration::from_millis(900))
        .wait(Some(Duration::ZERO))
        .watchdog(true)
        .reentrant(true);
    let m = manager(&[server.url()], short.clone());
    let key = "sets:renewed";
    let outer = m.acquire_owned(key, 6, &short).await.unwrap();
    let sets = hold_sets(&server);
    assert_eq!(sets.len(), 1);
    let (mut last, mut raised) = (pttl(&server, &sets[0]), 0);
    let end = Instant::now() + Duration::from_secs(60);
    while raised < 2 {
        assert!(Instant::now() < end, "the set was not renewed");
        tokio::time::sleep(ms(50)).await;
        let left = pttl(&server, &sets[0]);
        assert!(left > 0 && left <= 6000, "{left}");
        raised += usize::from(left > last);
        last = left;
    }
    assert!(outer.is_held());
    // Lost (an operator's DEL): the release finds nothing, the set ends with the hold's ttl.
    server.cmd::<()>(&["DEL", key]);
    let lost = Instant::now();
    let _ = outer.release().await;
    while !hold_sets(&server).is_empty() {
        assert!(
            lost.elapsed() < Duration::from_secs(10),
            "the set outlived its hold"
        );
        tokio::time::sleep(ms(50)).await;
    }
}

/// An undone grant (missed its quorum) leaves no set of live holds where it was granted.
#[tokio::test(flavor = "multi_thread")]
async fn an_undone_grant_leaves_no_set_of_live_holds() {
    let _serial = serial();
    let servers = [
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    ];
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let m = manager(&urls, o());
    let other = manager(&urls[1..], o());
    for kind in [Counted::Write, Counted::Reentrant] {
        let key = format!("sets:undo:{kind:?}");
        let sadd = calls(&servers[0], "sadd");
        let theirs = take(&other, kind, &key, 1).await.unwrap();
        let err = take(&m, kind, &key, 2).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
        // The fault happened: node 0 granted (its grant joined a set), and was undone (in the
        // background when its answer came after the two refusals).
        let end = Instant::now() + Duration::from_secs(10);
        while calls(&servers[0], "sadd") == sadd
            || !hold_sets(&servers[0]).is_empty()
            || server_exists(&servers[0], &key) == 1
        {
            assert!(
                Instant::now() < end,
                "{kind:?}: granted {}, sets {:?}, key {}",
                calls(&servers[0], "sadd") > sadd,
                hold_sets(&servers[0]),
                server_exists(&servers[0], &key)
            );
            tokio::time::sleep(ms(20)).await;
        }
        assert!(theirs.release().await.unwrap());
        for s in &servers {
            assert_eq!(hold_sets(s), Vec::<String>::new(), "{kind:?}");
        }
    }
}

fn server_exists(server: &RedisServer, key: &str) -> i64 {
    server.cmd(&["EXISTS", key])
}
