//! Issue 29 item 1: a lock request whose connection drops after the node ran it, before its
//! reply came back, is sent again (by redis-rs on a cluster, by ferrolock on a standalone
//! node) and must not take effect twice. The node sits behind the test bed's proxy, which
//! holds every reply while the request goes through; once the request visibly ran on the
//! node (its effect on the key), and its caller has had no reply, every link is reset.
// A std mutex held across awaits on purpose: every test has its own runtime.
#![allow(clippy::await_holding_lock)]

mod common;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use ferrolock::__wire::{KeyNames, Latch, Place, Release, Undo, hold_key, waiter_channel_prefix};
use ferrolock::{
    ErrorKind, LockManager, LockOptions, queue_key, queue_lease_key, queue_since_key,
    redisson_channel,
};
use ferrolock_testbed::{ClusterOptions, Direction, Proxy, RedisCluster, RedisServer};

/// A failure bound, far above what a healthy run needs.
const HANG: Duration = Duration::from_secs(30);
/// Long enough that the test sees the request run and resets the link well before the
/// request's own deadline, however loaded the machine.
const NODE_TIMEOUT: Duration = Duration::from_secs(5);

/// One node behind a proxy: a standalone server, or a one-primary cluster that announces the
/// proxy's port (so the cluster client's every connection goes through it).
struct Bed {
    server: Option<RedisServer>,
    cluster: Option<RedisCluster>,
    proxy: Proxy,
    url: String,
}

impl Bed {
    fn standalone() -> Bed {
        let server = RedisServer::start();
        let proxy = Proxy::start(server.port());
        let url = proxy.url();
        Bed {
            server: Some(server),
            cluster: None,
            proxy,
            url,
        }
    }

    fn cluster() -> Bed {
        let cluster = RedisCluster::start_with(ClusterOptions {
            primaries: 1,
            ..ClusterOptions::default()
        });
        let proxy = Proxy::start(cluster.nodes[0].port());
        let port = proxy.port().to_string();
        cluster.nodes[0].cmd::<()>(&["CONFIG", "SET", "cluster-announce-port", &port]);
        let slots: redis::Value = cluster.nodes[0].cmd(&["CLUSTER", "SLOTS"]);
        assert!(
            format!("{slots:?}").contains(&format!("int({port})")),
            "the node does not announce the proxy's port: {slots:?}"
        );
        let url = format!("redis+cluster://127.0.0.1:{port}");
        Bed {
            server: None,
            cluster: Some(cluster),
            proxy,
            url,
        }
    }

    fn node(&self) -> &RedisServer {
        match (&self.server, &self.cluster) {
            (Some(s), _) => s,
            (None, Some(c)) => &c.nodes[0],
            (None, None) => unreachable!(),
        }
    }

    fn name(&self) -> &'static str {
        if self.cluster.is_some() {
            "one-primary cluster"
        } else {
            "standalone node"
        }
    }
}

fn lock_opts(reentrant: bool, fencing: bool) -> LockOptions {
    opts()
        .ttl(Duration::from_secs(60))
        .node_timeout(NODE_TIMEOUT)
        .wait(Some(Duration::ZERO))
        .reentrant(reentrant)
        .fencing(fencing)
}

/// Opens `m`'s connection (a reset closed it): the fault is for the request, not the
/// connection's handshake.
async fn warm(m: &LockManager) {
    let lock = m.try_acquire("warm-up").await.unwrap();
    assert!(lock.release().await.unwrap());
}

/// Runs `op` with its reply cut off: every reply is held, `op` is sent, and once `ran` shows
/// it took effect on `node` (with `op` still waiting: no reply came), every link is reset.
async fn cut_reply<T: Send + 'static>(
    bed: &Bed,
    what: &str,
    op: impl Future<Output = T> + Send + 'static,
    ran: impl Fn(&RedisServer) -> bool,
) -> T {
    bed.proxy.hold(Direction::Down);
    let task = tokio::spawn(op);
    let start = Instant::now();
    while !ran(bed.node()) {
        assert!(
            !task.is_finished(),
            "{}: {what} returned before it ran",
            bed.name()
        );
        assert!(
            start.elapsed() < HANG,
            "{}: {what} never ran on the node",
            bed.name()
        );
        tokio::time::sleep(ms(2)).await;
    }
    assert!(
        !task.is_finished(),
        "{}: {what} got a reply through a held link",
        bed.name()
    );
    bed.proxy.reset();
    task.await.unwrap()
}

fn count(node: &RedisServer, key: &str, field: &str) -> Option<String> {
    node.cmd(&["HGET", key, field])
}

fn exists(node: &RedisServer, key: &str) -> bool {
    node.cmd::<bool>(&["EXISTS", key])
}

/// Every key left on `node` is a fence counter (permanent by design) or a request latch
/// within its stated PX (twice the node timeout).
fn nothing_left(bed: &Bed) {
    let keys: Vec<String> = bed.node().cmd(&["KEYS", "*"]);
    for k in keys {
        if k.starts_with("ferrolock:fence:") {
            continue;
        }
        assert!(
            k.starts_with("ferrolock:latch:"),
            "{}: {k:?} left behind",
            bed.name()
        );
        let left: i64 = bed.node().cmd(&["PTTL", &k]);
        assert!(
            left > 0 && left <= 2 * NODE_TIMEOUT.as_millis() as i64,
            "{}: latch {k:?} has PTTL {left}",
            bed.name()
        );
    }
}

/// The plain lock: its grant (SET NX, or acquire.lua when fenced) and its release.
async fn plain_rounds(bed: &Bed, fencing: bool) {
    let o = lock_opts(false, fencing);
    let m = manager(std::slice::from_ref(&bed.url), o.clone());
    let rival = manager(std::slice::from_ref(&bed.url), o.clone());
    let key = format!("plain-{fencing}");
    let mut last_fence = 0;
    for _ in 0..2 {
        warm(&m).await;
        let (m2, k, o2) = (m.clone(), key.clone(), o.clone());
        let got = cut_reply(
            bed,
            "plain acquire",
            async move { m2.acquire_with(&k, &o2).await },
            |n| exists(n, &key),
        )
        .await;
        let lock = got.unwrap_or_else(|e| panic!("{}: plain acquire: {e}", bed.name()));
        assert_eq!(
            get(bed.node(), &key).as_deref(),
            Some(lock.token()),
            "{}",
            bed.name()
        );
        if fencing {
            let fence = lock.fence().expect("a fenced grant has a fence");
            assert!(
                fence > last_fence,
                "{}: fence {fence} after {last_fence}",
                bed.name()
            );
            last_fence = fence;
        }
        let err = rival.try_acquire(&key).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotAcquired, "{}: {err}", bed.name());
        warm(&m).await;
        let released = cut_reply(
            bed,
            "plain release",
            async move { lock.release().await },
            |n| !exists(n, &key),
        )
        .await;
        assert!(
            released.unwrap_or_else(|e| panic!("{}: plain release: {e}", bed.name())),
            "{}: a release that ran reported the lock lost",
            bed.name()
        );
    }
    // Fences go on increasing.
    let lock = m.acquire_with(&key, &o).await.unwrap();
    if fencing {
        assert!(lock.fence().unwrap() > last_fence, "{}", bed.name());
    }
    assert!(lock.release().await.unwrap());
}

/// The reentrant lock: a fresh grant, a re-entry, the nested release and the last one.
async fn reentrant_rounds(bed: &Bed, fencing: bool) {
    let o = lock_opts(true, fencing);
    let m = manager(std::slice::from_ref(&bed.url), o.clone());
    let rival = manager(std::slice::from_ref(&bed.url), o.clone());
    let key = format!("reentrant-{fencing}");
    let mut last_fence = 0;
    for _ in 0..2 {
        warm(&m).await;
        let (m2, k, o2) = (m.clone(), key.clone(), o.clone());
        let outer = cut_reply(
            bed,
            "reentrant fresh acquire",
            async move { m2.acquire_owned(&k, 1, &o2).await },
            |n| exists(n, &key),
        )
        .await
        .unwrap_or_else(|e| panic!("{}: reentrant acquire: {e}", bed.name()));
        let field = outer.token().to_string();
        assert_eq!(
            count(bed.node(), &key, &field).as_deref(),
            Some("1"),
            "{}",
            bed.name()
        );
        if fencing {
            let fence = outer.fence().expect("a fenced grant has a fence");
            assert!(
                fence > last_fence,
                "{}: fence {fence} after {last_fence}",
                bed.name()
            );
            last_fence = fence;
        }
        warm(&m).await;
        let (m2, k, o2) = (m.clone(), key.clone(), o.clone());
        let (k2, f) = (key.clone(), field.clone());
        let inner = cut_reply(
            bed,
            "re-entry",
            async move { m2.acquire_owned(&k, 1, &o2).await },
            move |n| count(n, &k2, &f).as_deref() == Some("2"),
        )
        .await
        .unwrap_or_else(|e| panic!("{}: re-entry: {e}", bed.name()));
        assert_eq!(
            count(bed.node(), &key, &field).as_deref(),
            Some("2"),
            "{}",
            bed.name()
        );
        assert_eq!(inner.fence(), outer.fence());
        warm(&m).await;
        let (k, f) = (key.clone(), field.clone());
        let released = cut_reply(
            bed,
            "nested release",
            async move { inner.release().await },
            move |n| count(n, &k, &f).as_deref() == Some("1"),
        )
        .await;
        assert!(
            released.unwrap_or_else(|e| panic!("{}: nested release: {e}", bed.name())),
            "{}",
            bed.name()
        );
        assert_eq!(
            count(bed.node(), &key, &field).as_deref(),
            Some("1"),
            "{}: the nested release was applied twice",
            bed.name()
        );
        let err = rival.try_acquire(&key).await.unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::NotAcquired,
            "{}: second holder",
            bed.name()
        );
        assert!(outer.is_held());
        warm(&m).await;
        let k = key.clone();
        let released = cut_reply(
            bed,
            "last release",
            async move { outer.release().await },
            move |n| !exists(n, &k),
        )
        .await;
        assert!(
            released.unwrap_or_else(|e| panic!("{}: last release: {e}", bed.name())),
            "{}",
            bed.name()
        );
        assert!(!exists(bed.node(), &key), "{}", bed.name());
    }
}

/// The undo of an attempt that missed its quorum: node 0 (behind the proxy) grants, nodes 1
/// and 2 (standalone, direct) refuse. The grant's reply must reach the client before the
/// replies are held, so requests are held first: once the undo reached the proxy, the
/// replies are held and the undo let through.
async fn undo_rounds(bed: &Bed, fencing: bool) {
    let others = [RedisServer::start(), RedisServer::start()];
    let mut urls = vec![bed.url.clone()];
    urls.extend(others.iter().map(RedisServer::url));
    let node0 = bed.node();
    for reentrant in [false, true] {
        let o = lock_opts(reentrant, fencing);
        let m = manager(&urls, o.clone());
        let key = format!("undo-{reentrant}-{fencing}");
        // Reentrant: the undo of a re-entry (a decrement) under an outer grant that is gone
        // on nodes 1 and 2. Plain: a grant refused by a rival on nodes 1 and 2.
        let outer = if reentrant {
            let outer = m.acquire_owned(&key, 7, &o).await.unwrap();
            granted_everywhere(&others, &key).await;
            for s in &others {
                s.cmd::<()>(&["DEL", &key]);
            }
            Some(outer)
        } else {
            for s in &others {
                s.cmd::<()>(&["SET", &key, "rival", "PX", "60000"]);
            }
            None
        };
        let field = outer.as_ref().map(|l| l.token().to_string());
        warm(&m).await;
        for s in &others {
            s.cmd::<()>(&["CLIENT", "PAUSE", "30000", "WRITE"]);
        }
        let (m2, k, o2) = (m.clone(), key.clone(), o.clone());
        let attempt = tokio::spawn(async move { m2.acquire_owned(&k, 7, &o2).await });
        let granted = |n: &RedisServer| match &field {
            Some(f) => count(n, &key, f).as_deref() == Some("2"),
            None => exists(n, &key),
        };
        let start = Instant::now();
        while !granted(node0) {
            assert!(
                start.elapsed() < HANG,
                "{}: node 0 never granted",
                bed.name()
            );
            tokio::time::sleep(ms(2)).await;
        }
        bed.proxy.hold(Direction::Up);
        let before = bed.proxy.chunks_read(Direction::Up);
        for s in &others {
            s.cmd::<()>(&["CLIENT", "UNPAUSE"]);
        }
        let start = Instant::now();
        while bed.proxy.chunks_read(Direction::Up) == before {
            assert!(start.elapsed() < HANG, "{}: no undo was sent", bed.name());
            tokio::time::sleep(ms(2)).await;
        }
        bed.proxy.hold(Direction::Down);
        let evals = calls(node0, "evalsha");
        bed.proxy.release(Direction::Up);
        let undone = |n: &RedisServer| match &field {
            Some(f) => count(n, &key, f).as_deref() == Some("1"),
            None => !exists(n, &key),
        };
        let start = Instant::now();
        while !undone(node0) {
            assert!(start.elapsed() < HANG, "{}: the undo never ran", bed.name());
            tokio::time::sleep(ms(2)).await;
        }
        // Replies have been held since before the undo ran: it got none. Reset, and wait
        // for the undo to be sent again.
        let ran = calls(node0, "evalsha");
        assert!(ran > evals, "{}", bed.name());
        bed.proxy.reset();
        let start = Instant::now();
        while calls(node0, "evalsha") == ran {
            assert!(
                start.elapsed() < HANG,
                "{}: the undo whose connection dropped was never sent again",
                bed.name()
            );
            tokio::time::sleep(ms(2)).await;
        }
        let err = tokio::time::timeout(HANG, attempt)
            .await
            .unwrap()
            .unwrap()
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotAcquired, "{}: {err}", bed.name());
        match (&outer, &field) {
            (Some(_), Some(f)) => assert_eq!(
                count(node0, &key, f).as_deref(),
                Some("1"),
                "{}: the undo of a re-entry was applied twice (fencing {fencing})",
                bed.name()
            ),
            _ => assert!(!exists(node0, &key), "{}", bed.name()),
        }
        if let Some(outer) = outer {
            // Gone on nodes 1 and 2: not ours on a quorum, which decides before node 0 has
            // answered (its release goes on in the background).
            let _ = outer.release().await;
        }
        for s in &others {
            s.cmd::<()>(&["DEL", &key]);
        }
        gone_everywhere(std::slice::from_ref(node0), &key).await;
    }
}

async fn all_rounds(bed: Bed) {
    for fencing in [false, true] {
        plain_rounds(&bed, fencing).await;
        reentrant_rounds(&bed, fencing).await;
        undo_rounds(&bed, fencing).await;
    }
    nothing_left(&bed);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_resent_after_its_connection_dropped_runs_once_on_a_standalone_node() {
    let _serial = serial();
    all_rounds(Bed::standalone()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_resent_after_its_connection_dropped_runs_once_on_a_cluster() {
    let _serial = serial();
    all_rounds(Bed::cluster()).await;
}

/// A read or write hold's fresh grant, re-entry and nested release, each with its reply cut
/// off and re-sent: each takes effect once (one count, one read hold key per hold).
async fn rw_rounds(bed: &Bed, write: bool) {
    // A read lease is at most 30 s; its loss margin (2 × node timeout) under a third of it.
    let o = lock_opts(false, write)
        .ttl(Duration::from_secs(30))
        .node_timeout(Duration::from_secs(4));
    let m = manager(std::slice::from_ref(&bed.url), o.clone());
    let key = format!("rw-{write}");
    let lock = move |m: LockManager, k: String, o: LockOptions| async move {
        if write {
            m.write_lock_owned(&k, 1, &o).await
        } else {
            m.read_lock_owned(&k, 1, &o).await
        }
    };
    let hold_keys = |n: &RedisServer, field: &str| -> Vec<String> {
        let prefix = ferrolock::__wire::rw::rwlock_timeout_prefix(&key, field);
        let mut keys: Vec<String> = n.cmd(&["KEYS", &format!("{prefix}:*")]);
        keys.sort();
        keys
    };
    let counted = |token: &str| {
        if write {
            format!("{token}:write")
        } else {
            token.to_string()
        }
    };
    warm(&m).await;
    let outer = cut_reply(
        bed,
        "fresh rw acquire",
        lock(m.clone(), key.clone(), o.clone()),
        |n| exists(n, &key),
    )
    .await
    .unwrap_or_else(|e| panic!("{}: fresh acquire (write {write}): {e}", bed.name()));
    let field = counted(outer.token());
    assert_eq!(count(bed.node(), &key, &field).as_deref(), Some("1"));
    if write {
        assert!(outer.fence().is_some());
    } else {
        assert_eq!(hold_keys(bed.node(), outer.token()).len(), 1);
    }
    warm(&m).await;
    let (k2, f) = (key.clone(), field.clone());
    let inner = cut_reply(
        bed,
        "rw re-entry",
        lock(m.clone(), key.clone(), o.clone()),
        move |n| count(n, &k2, &f).as_deref() == Some("2"),
    )
    .await
    .unwrap_or_else(|e| panic!("{}: re-entry (write {write}): {e}", bed.name()));
    assert_eq!(
        count(bed.node(), &key, &field).as_deref(),
        Some("2"),
        "re-entry applied twice (write {write})"
    );
    if !write {
        assert_eq!(hold_keys(bed.node(), outer.token()).len(), 2);
    }
    warm(&m).await;
    let (k2, f) = (key.clone(), field.clone());
    let released = cut_reply(
        bed,
        "rw nested release",
        async move { inner.release().await },
        move |n| count(n, &k2, &f).as_deref() == Some("1"),
    )
    .await;
    assert!(released.unwrap());
    assert_eq!(
        count(bed.node(), &key, &field).as_deref(),
        Some("1"),
        "the nested release was applied twice (write {write})"
    );
    assert!(outer.is_held());
    assert!(outer.release().await.unwrap());
    assert!(!exists(bed.node(), &key));
    assert_eq!(hold_keys(bed.node(), outer.token()), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_or_write_request_resent_after_its_connection_dropped_runs_once() {
    let _serial = serial();
    let bed = Bed::standalone();
    rw_rounds(&bed, false).await;
    rw_rounds(&bed, true).await;
    nothing_left(&bed);
}

/// The same on a one-primary cluster (redis-rs re-sends there): each read or write request
/// takes effect once, and the read hold keys share the hash's slot.
#[tokio::test(flavor = "multi_thread")]
async fn a_read_or_write_request_resent_after_its_connection_dropped_runs_once_on_a_cluster() {
    let _serial = serial();
    let bed = Bed::cluster();
    rw_rounds(&bed, false).await;
    rw_rounds(&bed, true).await;
    nothing_left(&bed);
}

/// `release.lua` as the core loads it: `Release::command` sends its EVALSHA.
const RELEASE_SRC: &str = include_str!("../scripts/release.lua");

/// The plain release run twice with the same KEYS and ARGV (`__wire::Release`, the layout
/// `lock.rs` sends), as a re-send after a dropped connection runs it: the second run answers
/// what the first did (1 released, 2 released with the queue head told, 3 released quietly),
/// so the caller marks the key loud or quiet either way, and it tells the head nothing more.
#[test]
fn a_plain_release_run_twice_answers_as_the_first_did() {
    let node = RedisServer::start();
    let _sha: String = node.cmd(&["SCRIPT", "LOAD", RELEASE_SRC]);
    // (what, contended, quiet bound ms, a waiter queued, the first run's reply)
    let cases = [
        ("no waiter", false, 0, false, 1),
        ("head told (not contended)", false, 0, true, 2),
        ("head told (contended)", true, 0, true, 2),
        ("released quietly", true, 60_000, true, 3),
    ];
    let mut wrong = Vec::new();
    for (i, (what, contended, bound, queued, want)) in cases.into_iter().enumerate() {
        let key = format!("release-twice:{i}");
        let token = format!("token-{i}");
        node.cmd::<()>(&["SET", &key, &token, "PX", "60000"]);
        if queued {
            let time: Vec<String> = node.cmd(&["TIME"]);
            let now =
                time[0].parse::<u64>().unwrap() * 1000 + time[1].parse::<u64>().unwrap() / 1000;
            node.cmd::<()>(&["ZADD", &queue_key(&key), "1", "w-head"]);
            node.cmd::<()>(&[
                "ZADD",
                &queue_lease_key(&key),
                &(now + 60_000).to_string(),
                "w-head",
            ]);
            node.cmd::<()>(&["ZADD", &queue_since_key(&key), &now.to_string(), "w-head"]);
        }
        let release = Release {
            key: &key,
            token: &token,
            contended,
            quiet_bound_ms: bound,
            latch_px_ms: 10_000,
        };
        let run = || -> i64 { release.command(false).query(&mut node.client()).unwrap() };
        let published = calls(&node, "publish");
        let first = run();
        assert_eq!(first, want, "{what}: the first run");
        assert!(!exists(&node, &key), "{what}: the first run left the key");
        let told = calls(&node, "publish") - published;
        let second = run();
        if second != first {
            wrong.push(format!(
                "{what}: the second run answered {second}, the first {first}"
            ));
        }
        assert_eq!(
            calls(&node, "publish") - published,
            told,
            "{what}: the second run told the head again"
        );
    }
    assert!(wrong.is_empty(), "a re-sent release: {wrong:#?}");
    // Another token, never released here: still "not ours".
    let other = Release {
        key: "release-twice:0",
        token: "someone-else",
        contended: false,
        quiet_bound_ms: 0,
        latch_px_ms: 10_000,
    };
    let reply: i64 = other.command(false).query(&mut node.client()).unwrap();
    assert_eq!(reply, 0, "a release that never ran answered as released");
}

/// An undo (`__wire::Undo`, the layout `acquire/undo.rs` sends) run twice with the same KEYS and
/// ARGV, as a re-send after a dropped connection runs it, with the waiter it put back in the
/// queue granted or gone in between: the second run answers as the first did and changes
/// nothing. Before, it put the waiter back again, where it held the queue's head for a lease
/// (and answered "not ours"; a reentrant undo's re-send did the same).
#[test]
fn an_undo_run_twice_answers_as_the_first_did_and_puts_no_waiter_back() {
    let node = RedisServer::start();
    for reentrant in [false, true] {
        let key = format!("undo-twice:{reentrant}");
        let names = KeyNames::of(&key);
        let token = "token-or-field";
        if reentrant {
            // A re-entry's undo: the outer grant's count stays. Each put its mark, and joined
            // the owner's live holds (`holds.lua`).
            node.cmd::<()>(&["HSET", &key, token, "2"]);
            node.cmd::<()>(&["PEXPIRE", &key, "60000"]);
            let holds = format!("ferrolock:holds:{{{key}}}:{token}");
            for hold in ["hold-0", "hold-1"] {
                node.cmd::<()>(&["SET", &hold_key(&key, hold), "1", "PX", "60000"]);
                node.cmd::<()>(&["SADD", &holds, hold]);
            }
            node.cmd::<()>(&["PEXPIRE", &holds, "60000"]);
        } else {
            node.cmd::<()>(&["SET", &key, token, "PX", "60000"]);
        }
        let channel = if reentrant {
            redisson_channel(&key)
        } else {
            waiter_channel_prefix(&key)
        };
        let undo = Undo {
            key: &key,
            names: &names,
            token,
            reentrant,
            channel: &channel,
            place: Place {
                id: "w-undone",
                score: "",
                lease_ms: 60_000,
            },
            bound_ms: 0,
            latch: Latch {
                id: "call-1",
                px_ms: 10_000,
            },
            hold: "hold-1",
        };
        let run = || -> i64 { undo.invocation(false).invoke(&mut node.client()).unwrap() };
        let queued = || -> Vec<String> { node.cmd(&["ZRANGE", &queue_key(&key), "0", "-1"]) };
        assert_eq!(run(), 1, "{key}: the first run");
        assert_eq!(queued(), ["w-undone"], "{key}: the first run's re-enqueue");
        // The waiter is granted (or leaves): its id goes out of the queue.
        for name in [
            queue_key(&key),
            queue_lease_key(&key),
            queue_since_key(&key),
        ] {
            node.cmd::<()>(&["ZREM", &name, "w-undone"]);
        }
        assert_eq!(run(), 1, "{key}: the second run answered otherwise");
        assert!(
            queued().is_empty(),
            "{key}: the second run put the waiter back"
        );
        if reentrant {
            assert_eq!(count(&node, &key, token).as_deref(), Some("1"), "{key}");
        } else {
            assert!(!exists(&node, &key), "{key}");
        }
    }
}

/// An extend to a shorter lease whose reply never comes, though it ran (or whose caller stops
/// waiting once it ran): the key keeps its longer expiry on the node, and the handle keeps its
/// validity, which the node's expiry covers (with the watchdog on and off). Before, the
/// extend set the node's ttl to the shorter lease, and the handle had to cut its validity
/// before sending it.
#[tokio::test(flavor = "multi_thread")]
async fn an_extend_with_no_answer_never_shortens_the_key() {
    let _serial = serial();
    for (watchdog, cancelled) in [(true, false), (false, false), (true, true), (false, true)] {
        let bed = Bed::standalone();
        // A node timeout that the test's look at the node fits in however slow the machine,
        // and that the shorter lease's loss margin (2 x node timeout under a third) still fits.
        let o = opts()
            .ttl(Duration::from_secs(60))
            .node_timeout(ms(1300))
            .watchdog(watchdog);
        let m = manager(std::slice::from_ref(&bed.url), o.clone());
        warm(&m).await;
        let key = unique_key("short-extend");
        let ours = Arc::new(m.acquire_with(&key, &o).await.unwrap());
        let before = ours.validity();
        let sent = calls(bed.node(), "evalsha");
        bed.proxy.hold(Direction::Down);
        let extend = tokio::spawn({
            let ours = ours.clone();
            async move { ours.extend_for(Duration::from_secs(8)).await }
        });
        let start = Instant::now();
        while calls(bed.node(), "evalsha") == sent {
            assert!(start.elapsed() < HANG, "the extend never ran on the node");
            tokio::time::sleep(ms(2)).await;
        }
        // From now on nothing reaches the node.
        bed.proxy.hold(Direction::Up);
        assert!(!extend.is_finished(), "an answer came through a held link");
        if cancelled {
            extend.abort();
            assert!(extend.await.unwrap_err().is_cancelled());
        } else {
            let err = extend.await.unwrap().unwrap_err();
            assert_eq!(err.kind(), ErrorKind::QuorumUnreachable, "{err}");
        }
        let left = pttl(bed.node(), &key);
        let validity = ours.validity();
        assert!(
            left > 50_000,
            "watchdog {watchdog}, cancelled {cancelled}: the extend shortened the key to {left} ms"
        );
        assert!(
            validity <= before && validity.as_millis() as i64 <= left,
            "watchdog {watchdog}, cancelled {cancelled}: validity {validity:?} (before \
             {before:?}), the node's expiry {left} ms"
        );
        bed.proxy.reset();
        assert!(ours.release().await.unwrap());
    }
}

/// Found by a review: an extend to a shorter lease from a blocking caller's thread is held
/// back in the network past its node timeout (no answer); another caller then extends to a
/// longer lease on the shared connection, confirmed; the first lands after it. Before, its
/// `PEXPIRE` cut the key to the short lease under a handle just told "60 s", and another
/// client took the key. Extends only raise the expiry now, so their order does not matter.
/// (The review's other case is the same script's: a watchdog renewal with the old, shorter
/// lease held back in the network, landing after the holder's thread extended to a longer one.
/// The test bed's proxy drops a held-back request when its client closes the link on the
/// renewal's timeout, which a real network does not, so that case is timing-bound here.)
#[test]
fn a_late_shorter_extend_never_cuts_a_longer_one() {
    use ferrolock::runtime::block_on;
    let _serial = serial();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    // Async calls (on the shared connection) run on `rt`; `block_on` is a blocking caller's,
    // on this thread's own connection (Python's sync API, C and Go use one per thread).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (short, long) = (Duration::from_secs(2), Duration::from_secs(60));
    let m = manager(&[proxy.url()], opts().ttl(long).node_timeout(ms(200)));
    let key = unique_key("late-short-extend");
    let lock = rt.block_on(m.acquire(&key)).unwrap();
    // This thread's connection, opened while the link is fast.
    block_on(lock.extend()).unwrap();
    let read = proxy.chunks_read(Direction::Up);
    proxy.set_delay_dir(Direction::Up, ms(1500));
    let sent = calls(&server, "evalsha");
    let first = block_on(lock.extend_for(short));
    assert!(first.is_err(), "answered through a 1.5 s delay: {first:?}");
    let start = Instant::now();
    while proxy.chunks_read(Direction::Up) == read {
        assert!(start.elapsed() < HANG);
        std::thread::sleep(ms(1));
    }
    proxy.set_delay_dir(Direction::Up, Duration::ZERO);
    let validity = rt.block_on(lock.extend_for(long)).unwrap();
    assert!(validity > short, "{validity:?}");
    // The fault happened: both extends ran, the short one last.
    let start = Instant::now();
    while calls(&server, "evalsha") < sent + 2 {
        assert!(start.elapsed() < HANG, "the late extend never ran");
        std::thread::sleep(ms(10));
    }
    std::thread::sleep(ms(100));
    let left = pttl(&server, &key);
    let rival = manager(&[server.url()], opts().wait(Some(Duration::ZERO)));
    let theirs = rt.block_on(rival.acquire(&key));
    assert!(
        left > 30_000 && theirs.is_err(),
        "the late short extend cut the key to {left} ms under a handle with {:?} left \
         (another client's acquire: {:?})",
        lock.validity(),
        theirs.map(|l| l.token().to_string())
    );
    assert!(rt.block_on(lock.release()).unwrap());
}

/// An extend that finds our token gone on a quorum reports the loss and marks the lock lost
/// at once (its status, `lost()` listeners), not at the next renewal.
#[tokio::test(flavor = "multi_thread")]
async fn an_extend_that_finds_the_token_gone_marks_the_lock_lost() {
    let _serial = serial();
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts().ttl(Duration::from_secs(60)));
    let key = unique_key("gone-extend");
    let lock = m.acquire(&key).await.unwrap();
    server.cmd::<()>(&["DEL", &key]);
    let err = lock.extend().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    assert!(
        matches!(lock.status(), ferrolock::LockStatus::Lost(_)),
        "{:?}",
        lock.status()
    );
    assert!(!lock.is_held());
}
