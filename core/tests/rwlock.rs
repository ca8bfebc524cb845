//! The read-write lock through the Rust API (`read_lock*` / `write_lock*`), against real
//! redis-servers: exclusion checked over recorded hold intervals, re-entry, downgrade, the
//! upgrade refused, the read lease cap, writer ordering, a write release letting every
//! waiting reader in, watchdog renewal, and the loss signal.

// Each #[tokio::test] runs its own runtime on its own thread, so holding the std mutex that
// serializes these tests across awaits blocks nothing but the test itself.
#![allow(clippy::await_holding_lock)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::holds::Holds;
use common::*;
use ferrolock::__wire::KeyNames;
use ferrolock::{ErrorKind, LockManager, LockStatus};
use ferrolock_testbed::RedisServer;

fn hash(server: &RedisServer, key: &str) -> BTreeMap<String, String> {
    server.cmd(&["HGETALL", key])
}

/// Waiters in the key's server queue.
fn queued(server: &RedisServer, key: &str) -> i64 {
    server.cmd(&["ZCARD", &KeyNames::of(key).queue])
}

/// Polls `cond` until it holds (a precondition of the next step, not a timing check); fails
/// after `bound`, which only a broken lock reaches.
/// Scripts node 0 ran so far (EVAL and EVALSHA calls, INFO commandstats).
fn script_calls(server: &RedisServer) -> u64 {
    let info: String = server.cmd(&["INFO", "commandstats"]);
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Opens `m`'s connection, so that a test's next try is one round trip.
async fn warm_up(m: &LockManager) {
    let lock = m.try_acquire("rw:warm-up").await.unwrap();
    assert!(lock.release().await.unwrap());
}

async fn until(what: &str, bound: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + bound;
    while !cond() {
        assert!(Instant::now() < end, "never: {what}");
        tokio::time::sleep(ms(10)).await;
    }
}

/// Readers and writers at random, in tasks of two managers: no writer's recorded hold
/// overlaps any other hold, and readers did overlap (so a lock that excluded readers fails).
/// Each interval is recorded inside the real hold (after the grant, before the release), so
/// an overlap seen is a real one.
#[tokio::test]
async fn readers_overlap_and_no_writer_overlaps_anyone() {
    let _s = serial();
    let server = RedisServer::start();
    let key = "rw:mix";
    let managers = [
        Arc::new(manager(&[server.url()], opts())),
        Arc::new(manager(&[server.url()], opts())),
    ];
    // A reader takes 1 of TASKS, a writer all: a writer beside anyone is too many.
    const TASKS: u32 = 8;
    let holds = Holds::default();
    let mut tasks = Vec::new();
    for t in 0..TASKS as u64 {
        let m = managers[(t % 2) as usize].clone();
        let holds = holds.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..12u64 {
                let r = getrandom::u64().unwrap();
                // One in four a writer; the first rounds of half the tasks are readers, so
                // readers meet.
                let write = r.is_multiple_of(4) && !(i < 3 && t.is_multiple_of(2));
                let lock = if write {
                    m.write_lock(key).await.unwrap()
                } else {
                    m.read_lock(key).await.unwrap()
                };
                let weight = if write { TASKS } else { 1 };
                holds.hold(&lock, weight, ms(5 + (r >> 8) % 20)).await;
                assert!(lock.release().await.unwrap());
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(holds.all().len(), 96);
    let peak = holds.check(TASKS);
    assert!(peak.most_together > 1, "no two readers ever held together");
    assert!(
        holds.all().iter().any(|h| h.weight == TASKS),
        "no writer ran"
    );
    assert_eq!(server.cmd::<i64>(&["EXISTS", key]), 0);
}

/// Re-entry by one owner (one field, counted), a read under one's own write lock (the
/// downgrade), and a write under one's own read lock refused with an error naming the key.
#[tokio::test]
async fn reentry_downgrade_and_upgrade_refused() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts());
    let key = "rw:owner";
    let r1 = m.read_lock_owned(key, 1, &opts()).await.unwrap();
    let r2 = m.read_lock_owned(key, 1, &opts()).await.unwrap();
    assert_eq!(r1.token(), r2.token());
    let field = r1.token().to_string();
    assert_eq!(
        hash(&server, key),
        BTreeMap::from([("mode".into(), "read".into()), (field.clone(), "2".into())])
    );
    let err = m.write_lock_owned(key, 1, &opts()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert_eq!(
        err.message(),
        "lock \"rw:owner\": a read->write upgrade is refused: this owner holds its read lock, \
         and two upgraders would wait for each other forever; release the read lock first",
        "{err}"
    );
    // Another owner's reader shares the key.
    let other = m.read_lock_owned(key, 2, &opts()).await.unwrap();
    assert!(r2.release().await.unwrap());
    assert!(r1.release().await.unwrap());
    assert!(other.release().await.unwrap());
    assert_eq!(server.cmd::<i64>(&["EXISTS", key]), 0);

    // Downgrade: the write lock, then the read lock by the same owner; the write release
    // leaves the key read-held.
    let w = m.write_lock_owned(key, 3, &opts()).await.unwrap();
    let w2 = m.write_lock_owned(key, 3, &opts()).await.unwrap();
    let field = w.token().to_string();
    let r = m.read_lock_owned(key, 3, &opts()).await.unwrap();
    assert_eq!(
        hash(&server, key),
        BTreeMap::from([
            ("mode".into(), "write".into()),
            (format!("{field}:write"), "2".into()),
            (field.clone(), "1".into()),
        ])
    );
    let busy = m
        .read_lock_with(key, &opts().wait(Some(Duration::ZERO)))
        .await
        .unwrap_err();
    assert_eq!(busy.kind(), ErrorKind::NotAcquired);
    assert!(w2.release().await.unwrap());
    assert!(w.release().await.unwrap());
    assert_eq!(
        hash(&server, key),
        BTreeMap::from([("mode".into(), "read".into()), (field, "1".into())])
    );
    // Now a reader of another owner gets in, a writer does not.
    let other = m
        .read_lock_with(key, &opts().wait(Some(Duration::ZERO)))
        .await
        .unwrap();
    let busy = m
        .write_lock_with(key, &opts().wait(Some(Duration::ZERO)))
        .await
        .unwrap_err();
    assert_eq!(busy.kind(), ErrorKind::NotAcquired);
    assert!(r.release().await.unwrap());
    assert!(other.release().await.unwrap());
    assert_eq!(server.cmd::<i64>(&["EXISTS", key]), 0);
}

/// An owner's read or write hold and its reentrant lock on the same key are apart, and the
/// owner asking for the other kind is refused at once (it would wait for itself, and, queued
/// as a writer is, hold up every new reader meanwhile), as a read->write upgrade is. Before,
/// the reentrant acquire was planned as a re-entry of the read hold (the owner table knew the
/// key and owner, not the kind) and granted: an exclusive lock beside another owner's reader,
/// whose release deleted the whole hash with that reader's hold in it, letting a writer in
/// beside a live reader (found by a review; Python's `with m.read_lock(k): with m.lock(k,
/// reentrant=True)` reached it).
#[tokio::test]
async fn an_owners_read_write_and_reentrant_holds_of_one_key_never_re_enter_each_other() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts());
    let other = manager(&[server.url()], opts());
    let now = || opts().wait(Some(Duration::ZERO));
    // A wait: without the refusal, the acquire would wait it out and fail as NotAcquired.
    let waits = || opts().wait(Some(Duration::from_secs(2)));
    let key = "rw:kinds";
    let refused = |r: ferrolock::Result<ferrolock::Lock>, what: &str| {
        let err = r.map(|l| l.token().to_string()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{what}: {err}");
        assert!(
            err.message().contains("would wait for itself"),
            "{what}: {err}"
        );
    };
    for downgraded in [false, true] {
        let write = if downgraded {
            Some(m.write_lock_owned(key, 9, &now()).await.unwrap())
        } else {
            None
        };
        let read = m.read_lock_owned(key, 9, &now()).await.unwrap();
        refused(
            m.acquire_owned(key, 9, &waits().reentrant(true)).await,
            &format!("downgraded={downgraded}: a reentrant lock over the owner's read lock"),
        );
        if let Some(w) = write {
            assert!(w.release().await.unwrap());
        }
        // Nothing of the refused acquire holds up another reader.
        let reader2 = other.read_lock_with(key, &now()).await.unwrap();
        assert!(read.release().await.unwrap());
        // The other owner's read hold is intact, and excludes a writer.
        assert_eq!(
            hash(&server, key).get(reader2.token()).map(String::as_str),
            Some("1")
        );
        let writer = other.write_lock_with(key, &now()).await;
        assert_eq!(
            writer.map(|_| ()).map_err(|e| e.kind()),
            Err(ErrorKind::NotAcquired)
        );
        assert!(reader2.release().await.unwrap());
        assert_eq!(server.cmd::<i64>(&["EXISTS", key]), 0);
    }
    // The other way round: a read or write acquire under the owner's reentrant lock.
    let reentrant = m
        .acquire_owned(key, 9, &now().reentrant(true))
        .await
        .unwrap();
    refused(
        m.read_lock_owned(key, 9, &waits()).await,
        "a read lock over the owner's reentrant lock",
    );
    refused(
        m.write_lock_owned(key, 9, &waits()).await,
        "a write lock over the owner's reentrant lock",
    );
    // Another owner is not refused: it waits as for any holder (here: not at all).
    let busy = other.read_lock_owned(key, 9, &now()).await;
    assert_eq!(
        busy.map(|_| ()).map_err(|e| e.kind()),
        Err(ErrorKind::NotAcquired)
    );
    assert!(reentrant.release().await.unwrap());
    // Released, the owner takes the other kind.
    let read = m.read_lock_owned(key, 9, &now()).await.unwrap();
    assert!(read.release().await.unwrap());
    assert_eq!(server.cmd::<i64>(&["EXISTS", key]), 0);
}

/// A read ttl above Redisson's 30 s read lease is refused, naming it; fencing is for
/// writers, whose grants carry increasing fences.
#[tokio::test]
async fn read_lease_cap_and_fences_for_writers() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts());
    let key = "rw:cap";
    let err = m
        .read_lock_with(key, &opts().ttl(Duration::from_secs(31)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("31s"), "{err}");
    let ok = m
        .read_lock_with(key, &opts().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let err = ok.extend_for(Duration::from_secs(45)).await.unwrap_err();
    assert!(err.to_string().contains("45s"), "{err}");
    assert!(ok.release().await.unwrap());
    let err = m
        .read_lock_with(key, &opts().fencing(true))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);

    let w1 = m.write_lock_with(key, &opts().fencing(true)).await.unwrap();
    let f1 = w1.fence().expect("a writer's fence");
    assert!(w1.release().await.unwrap());
    let w2 = m.write_lock_with(key, &opts().fencing(true)).await.unwrap();
    assert!(w2.fence().expect("a writer's fence") > f1);
    assert!(w2.release().await.unwrap());
}

/// A writer that queued while a reader held is granted before a reader that arrived after
/// it: an order, seen through a grant counter, not a time.
#[tokio::test]
async fn a_queued_writer_goes_before_later_readers() {
    let server = RedisServer::start();
    let key = "rw:order";
    let (ma, mw, mb) = (
        manager(&[server.url()], opts()),
        Arc::new(manager(&[server.url()], opts())),
        Arc::new(manager(&[server.url()], opts())),
    );
    let a = ma.read_lock(key).await.unwrap();
    let order = Arc::new(AtomicUsize::new(0));
    let writer = tokio::spawn({
        let (mw, order) = (mw.clone(), order.clone());
        async move {
            let w = mw.write_lock(key).await.unwrap();
            let n = order.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(ms(50)).await;
            assert!(w.release().await.unwrap());
            n
        }
    });
    until("the writer is queued", Duration::from_secs(30), || {
        queued(&server, key) == 1
    })
    .await;
    // Past the barging bound (server clock), no reader goes ahead of the queued writer.
    tokio::time::sleep(ms(50)).await;
    let reader = tokio::spawn({
        let (mb, order) = (mb.clone(), order.clone());
        async move {
            let b = mb.read_lock(key).await.unwrap();
            let n = order.fetch_add(1, Ordering::SeqCst);
            assert!(b.release().await.unwrap());
            n
        }
    });
    until(
        "the later reader is queued",
        Duration::from_secs(30),
        || queued(&server, key) == 2,
    )
    .await;
    assert!(a.release().await.unwrap());
    let (w, b) = (writer.await.unwrap(), reader.await.unwrap());
    assert_eq!((w, b), (0, 1), "the later reader went before the writer");
}

/// A reader queued behind a writer, on a key other readers hold, is told when that writer
/// leaves the queue without the lock (cancelled here; a wait that ran out leaves the same
/// way): the key is open to it at once. Its own re-checks are far away (its retry delay and
/// the hash's PTTL, its busy hint, both 120 s), so only a wake-up brings it in within the
/// bound. Before, the writer's dequeue told the waiters only of a free key, and the reader
/// waited for its re-check, or for the end of its wait.
#[tokio::test]
async fn a_reader_queued_behind_a_writer_that_left_is_woken_while_readers_hold() {
    let server = RedisServer::start();
    let key = "rw:writer-left";
    let slow = opts().retry_delay(Duration::from_secs(120));
    let m1 = manager(&[server.url()], opts());
    let (mw, mr) = (
        Arc::new(manager(&[server.url()], slow.clone())),
        Arc::new(manager(&[server.url()], slow.clone())),
    );
    let a = m1
        .read_lock_with(key, &opts().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let _: i64 = server.cmd(&["PEXPIRE", key, "120000"]);
    let writer = tokio::spawn({
        let mw = mw.clone();
        async move { mw.write_lock(key).await }
    });
    until("the writer is queued", Duration::from_secs(30), || {
        queued(&server, key) == 1
    })
    .await;
    // Past the barging bound (server clock): the reader waits for the queued writer.
    tokio::time::sleep(ms(50)).await;
    let reader = tokio::spawn({
        let mr = mr.clone();
        async move { mr.read_lock(key).await }
    });
    until(
        "the reader is queued behind the writer",
        Duration::from_secs(30),
        || queued(&server, key) == 2,
    )
    .await;
    assert!(!reader.is_finished(), "the reader went ahead of the writer");
    writer.abort();
    assert!(writer.await.unwrap_err().is_cancelled());
    let b = tokio::time::timeout(Duration::from_secs(60), reader)
        .await
        .expect("the reader was not woken when the writer ahead of it left")
        .unwrap()
        .unwrap();
    assert!(a.is_held() && b.is_held());
    assert!(b.release().await.unwrap());
    assert!(a.release().await.unwrap());
}

/// A write release lets every waiting reader in at once (not one per release): four readers
/// of two managers, queued behind a writer, all hold together afterwards. A long retry
/// delay: only the wake-ups can bring them in.
#[tokio::test]
async fn a_write_release_lets_every_waiting_reader_in() {
    let server = RedisServer::start();
    let key = "rw:front";
    let slow = opts().retry_delay(Duration::from_secs(60));
    let mw = manager(&[server.url()], slow.clone());
    let ms_ = [
        Arc::new(manager(&[server.url()], slow.clone())),
        Arc::new(manager(&[server.url()], slow.clone())),
    ];
    let w = mw.write_lock(key).await.unwrap();
    let holding = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(4));
    let mut readers = Vec::new();
    for i in 0..4 {
        let m = ms_[i % 2].clone();
        let (holding, barrier) = (holding.clone(), barrier.clone());
        readers.push(tokio::spawn(async move {
            let r = m.read_lock(key).await.unwrap();
            holding.fetch_add(1, Ordering::SeqCst);
            // Everyone holds at once, or this never returns.
            barrier.wait().await;
            assert!(r.is_held());
            assert!(r.release().await.unwrap());
        }));
    }
    // Every reader has failed its first attempt: the processes' queues are on the server
    // (one id per manager's reader queue).
    until(
        "both managers' readers are queued",
        Duration::from_secs(30),
        || queued(&server, key) == 2,
    )
    .await;
    assert_eq!(holding.load(Ordering::SeqCst), 0);
    assert!(w.release().await.unwrap());
    tokio::time::timeout(Duration::from_secs(30), async {
        for r in readers {
            r.await.unwrap();
        }
    })
    .await
    .expect("the readers did not all get in on the write release's wake-up");
    assert_eq!(holding.load(Ordering::SeqCst), 4);
}

/// Two readers of one manager, queued before a writer of another, all behind a write hold:
/// its release lets both readers in together, ahead of the writer. The first reader's grant
/// took the manager's place out of the queue, so the second, attempting next (readers share
/// the key), queued again behind the writer and waited for that writer's whole hold. The
/// grant now keeps the place while more readers of the manager wait (found by a review). Its
/// own re-checks are far: its retry delay (240 s, ± 50 %) and its busy hint, the PTTL of the
/// hash (30 s, the longest read ttl), past the failure bound.
#[tokio::test]
async fn readers_of_one_manager_queued_before_a_writer_get_in_together() {
    let _s = serial();
    for nodes in [1, 3] {
        let cluster = ferrolock_testbed::Cluster::start(nodes);
        let urls = cluster.urls();
        let server = &cluster.servers[0];
        let key = "rw:readers-before-writer";
        let queue = KeyNames::of(key).queue;
        let line = || server.cmd::<Vec<String>>(&["ZRANGE", &queue, "0", "-1"]);
        let slow = opts()
            .ttl(Duration::from_secs(30))
            .retry_delay(Duration::from_secs(240));
        let holder_m = manager(&urls, slow.clone());
        let w = holder_m.write_lock(key).await.unwrap();
        let readers_m = manager(&urls, slow.clone());
        let read = || {
            let m = readers_m.clone();
            tokio::spawn(async move { m.read_lock(key).await })
        };
        let first = read();
        until("the readers are queued", Duration::from_secs(30), || {
            line().len() == 1
        })
        .await;
        let calls = script_calls(server);
        let second = read();
        // The second reader's first try, refused: it waits in the manager's reader queue.
        until("the second reader tried", Duration::from_secs(30), || {
            script_calls(server) > calls
        })
        .await;
        let writer_m = manager(&urls, slow.clone());
        let writer = {
            let m = writer_m.clone();
            tokio::spawn(async move { m.write_lock(key).await })
        };
        until(
            "the writer is queued behind the readers",
            Duration::from_secs(30),
            || line().len() == 2,
        )
        .await;
        assert!(line()[0].starts_with('r'), "{:?}", line());
        assert!(w.release().await.unwrap());
        let mut held = Vec::new();
        for (what, r) in [("first", first), ("second", second)] {
            held.push(
                tokio::time::timeout(Duration::from_secs(20), r)
                    .await
                    .unwrap_or_else(|_| {
                        panic!(
                            "{nodes} node(s): the {what} reader did not get in beside the \
                             other (queue {:?}, hash {:?})",
                            line(),
                            hash(server, key)
                        )
                    })
                    .unwrap()
                    .unwrap(),
            );
        }
        assert!(
            !writer.is_finished(),
            "the writer went in beside the readers"
        );
        for r in held {
            assert!(r.release().await.unwrap());
        }
        let w2 = tokio::time::timeout(Duration::from_secs(60), writer)
            .await
            .expect("the writer was not let in after the readers")
            .unwrap()
            .unwrap();
        assert!(w2.release().await.unwrap());
        until("the queue is empty", Duration::from_secs(30), || {
            line().is_empty()
        })
        .await;
    }
}

/// The watchdog renews a read and a write hold (in the same batches as locks) past three
/// ttls: their keys are still there, with time left.
#[tokio::test]
async fn the_watchdog_renews_read_and_write_holds() {
    let _s = serial();
    let server = RedisServer::start();
    let watched = opts().watchdog(true).ttl(ms(2_000));
    let m = manager(&[server.url()], watched.clone());
    let (rk, wk) = ("rw:renew:r", "rw:renew:w");
    let r = m.read_lock(rk).await.unwrap();
    let w = m.write_lock(wk).await.unwrap();
    let plain = m.acquire("rw:renew:plain").await.unwrap();
    tokio::time::sleep(ms(2_000 * 3 + 500)).await;
    for (lock, key) in [(&r, rk), (&w, wk)] {
        assert_eq!(lock.status(), LockStatus::Held, "{key}");
        assert!(pttl(&server, key) > 0, "{key} expired");
    }
    let hold_key = format!(
        "{}:1",
        ferrolock::__wire::rw::rwlock_timeout_prefix(rk, r.token())
    );
    assert!(pttl(&server, &hold_key) > 0, "the read hold key expired");
    assert!(r.release().await.unwrap());
    assert!(w.release().await.unwrap());
    assert!(plain.release().await.unwrap());
}

/// A read or write hold whose key is deleted behind its back is signalled lost before its
/// validity ends.
#[tokio::test]
async fn a_lost_read_or_write_hold_is_signalled() {
    let _s = serial();
    let server = RedisServer::start();
    let watched = opts().watchdog(true).ttl(Duration::from_secs(3));
    let m = manager(&[server.url()], watched);
    for (write, key) in [(false, "rw:lost:r"), (true, "rw:lost:w")] {
        let lock: ferrolock::Lock = if write {
            m.write_lock(key).await.unwrap()
        } else {
            m.read_lock(key).await.unwrap()
        };
        let deadline = lock.deadline();
        let lost = lock.lost();
        assert_eq!(
            server.cmd::<i64>(&["DEL", key]),
            1,
            "the fault: {key} deleted"
        );
        let reason = tokio::time::timeout_at(deadline, lost)
            .await
            .unwrap_or_else(|_| panic!("{key}: no loss signal before the deadline"));
        assert!(reason.is_some(), "{key}");
        assert!(matches!(lock.status(), LockStatus::Lost(_)), "{key}");
    }
}

/// Three nodes (Redlock): readers of two managers share a key on a quorum, a writer is
/// refused while they hold and granted after, and refuses readers while it holds; with one
/// node killed (proven gone) the two left still make the quorum.
#[tokio::test]
async fn three_nodes_readers_share_and_a_writer_excludes() {
    let _s = serial();
    let mut servers = [
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    ];
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let (m1, m2) = (manager(&urls, opts()), manager(&urls, opts()));
    let now = opts().wait(Some(Duration::ZERO));
    let key = "rw:redlock";
    for round in 0..2 {
        let a = m1.read_lock(key).await.unwrap();
        let b = m2.read_lock_with(key, &now).await.unwrap();
        let busy = m2.write_lock_with(key, &now).await.unwrap_err();
        assert_eq!(busy.kind(), ErrorKind::NotAcquired, "round {round}");
        assert!(a.release().await.unwrap());
        assert!(b.release().await.unwrap());
        let w = m2.write_lock_with(key, &now).await.unwrap();
        let busy = m1.read_lock_with(key, &now).await.unwrap_err();
        assert_eq!(busy.kind(), ErrorKind::NotAcquired, "round {round}");
        assert!(w.release().await.unwrap());
        if round == 0 {
            servers[0].kill();
            assert!(!servers[0].is_running(), "the fault: node 0 is gone");
        }
    }
}

/// A read or write grant that missed its quorum is undone where it was granted: node 0
/// grants, nodes 1 and 2 are write-held by others; afterwards node 0 holds nothing of ours
/// (no hash, no read hold key).
#[tokio::test]
async fn a_grant_short_of_a_quorum_is_undone() {
    let servers = [
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    ];
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let key = "rw:undo";
    let (m1, m2) = (manager(&urls[1..2], opts()), manager(&urls[2..3], opts()));
    let (h1, h2) = (
        m1.write_lock(key).await.unwrap(),
        m2.write_lock(key).await.unwrap(),
    );
    let m = manager(&urls, opts());
    let now = opts().wait(Some(Duration::ZERO));
    for write in [false, true] {
        // The fault this test needs is a grant on node 0, shown by node 0 running scripts
        // (INFO commandstats): the grant, then its undo. Under load the other two nodes'
        // refusals can decide the attempt before its request is written to node 0 (then
        // nothing ran there and nothing is to undo): such a round is tried again, and the test
        // fails if no round reached node 0.
        let mut granted_on_node_0 = false;
        for _ in 0..20 {
            let before = script_calls(&servers[0]);
            let err = if write {
                m.write_lock_with(key, &now).await.unwrap_err()
            } else {
                m.read_lock_with(key, &now).await.unwrap_err()
            };
            assert_eq!(err.kind(), ErrorKind::NotAcquired, "write {write}");
            if script_calls(&servers[0]) == before {
                continue;
            }
            until("node 0's grant undone", Duration::from_secs(30), || {
                script_calls(&servers[0]) >= before + 2
                    && servers[0].cmd::<i64>(&["EXISTS", key]) == 0
            })
            .await;
            let left: Vec<String> = servers[0].cmd(&["KEYS", "*rwlock_timeout*"]);
            assert_eq!(left, Vec::<String>::new(), "write {write}");
            granted_on_node_0 = true;
            break;
        }
        assert!(
            granted_on_node_0,
            "write {write}: no attempt ever reached node 0"
        );
    }
    assert!(h1.release().await.unwrap());
    assert!(h2.release().await.unwrap());
}

/// A queued waiter whose grant fell short of a quorum keeps its place in the server queue
/// where it was granted: node 0 grants (which dequeues the waiter there), nodes 1 and 2 are
/// write-held by others and queue it; the undo on node 0 puts its waiter id back, so the
/// three nodes agree on who waits (the Redlock split-queue livelock otherwise).
#[tokio::test]
async fn a_waiter_whose_grant_missed_the_quorum_keeps_its_queue_place() {
    let servers = [
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    ];
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    for write in [false, true] {
        let key = if write {
            "rw:requeue:w"
        } else {
            "rw:requeue:r"
        };
        let (m1, m2) = (manager(&urls[1..2], opts()), manager(&urls[2..3], opts()));
        let (h1, h2) = (
            m1.write_lock(key).await.unwrap(),
            m2.write_lock(key).await.unwrap(),
        );
        let m = Arc::new(manager(&urls, opts().wait(None)));
        let before = script_calls(&servers[0]);
        let waiter = {
            let m = m.clone();
            tokio::spawn(async move {
                if write {
                    m.write_lock(key).await
                } else {
                    m.read_lock(key).await
                }
            })
        };
        // Queued on nodes 1 and 2 (the fault: they refuse), and node 0 granted and undid
        // queued attempts (its scripts ran: the first try, then queued attempts and undos).
        until("queued on nodes 1 and 2", Duration::from_secs(30), || {
            queued(&servers[1], key) == 1 && queued(&servers[2], key) == 1
        })
        .await;
        until(
            "node 0 kept the waiter's place after an undo",
            Duration::from_secs(30),
            || {
                script_calls(&servers[0]) >= before + 4
                    && servers[0].cmd::<i64>(&["EXISTS", key]) == 0
                    && queued(&servers[0], key) == 1
            },
        )
        .await;
        assert!(
            !waiter.is_finished(),
            "write {write}: granted without a quorum"
        );
        waiter.abort();
        assert!(h1.release().await.unwrap());
        assert!(h2.release().await.unwrap());
    }
}

/// A read and a write hold on a node that is killed (SIGKILL, proven by the process being
/// gone) are both signalled lost before their validity ends.
#[tokio::test]
async fn holds_on_a_killed_node_are_signalled_lost() {
    let _s = serial();
    let mut server = RedisServer::start();
    let watched = opts().watchdog(true).ttl(Duration::from_secs(3));
    let m = manager(&[server.url()], watched);
    let r = m.read_lock("rw:kill:r").await.unwrap();
    let w = m.write_lock("rw:kill:w").await.unwrap();
    let deadline = r.deadline().min(w.deadline());
    let (lost_r, lost_w) = (r.lost(), w.lost());
    server.kill();
    assert!(!server.is_running(), "the fault: the node is gone");
    let (a, b) = tokio::time::timeout_at(deadline, async { tokio::join!(lost_r, lost_w) })
        .await
        .expect("no loss signal before the deadline");
    assert!(a.is_some() && b.is_some());
    assert!(matches!(r.status(), LockStatus::Lost(_)));
    assert!(matches!(w.status(), LockStatus::Lost(_)));
}

/// Redisson 4.7.0's `RReadWriteLock` and the Rust API on one key: each side blocked while the
/// other writes, readers shared, and each side's release waking the other's waiter (ours with
/// a 60 s retry delay, so only the wake-up explains its grant before the test's bound).
#[tokio::test]
async fn redisson_and_the_rust_api_exclude_share_and_wake_each_other() {
    let classpath = common::redisson::redisson_classpath();
    let s = RedisServer::start();
    let mut r = common::redisson::Redisson::start(classpath, &s.url(), "single").await;
    let slow = opts().retry_delay(Duration::from_secs(60));
    let m = Arc::new(manager(&[s.url()], slow.clone()));
    let now = slow.clone().wait(Some(Duration::ZERO));
    let key = "rw:interop:api";
    let try_ = async |r: &mut common::redisson::Redisson, cmd: &str| {
        r.send(&format!("{cmd} {key}")).await;
        let reply = r
            .expect(&format!("{cmd} {key} "), Duration::from_secs(30))
            .await;
        reply.ends_with(" true")
    };
    // Our write held: Redisson can neither read nor write; our release wakes its reader.
    let w = m.write_lock(key).await.unwrap();
    assert!(!try_(&mut r, "rtry").await);
    assert!(!try_(&mut r, "wtry").await);
    r.send(&format!("rlock {key} -1")).await;
    until(
        "Redisson's reader subscribed",
        Duration::from_secs(30),
        || {
            let n: Vec<redis::Value> = s.cmd(&[
                "PUBSUB",
                "NUMSUB",
                &ferrolock::__wire::rw::rwlock_channel(key),
            ]);
            matches!(n.get(1), Some(redis::Value::Int(n)) if *n > 0)
        },
    )
    .await;
    assert!(r.lines.is_empty(), "Redisson read while we wrote");
    assert!(w.release().await.unwrap());
    r.expect(&format!("rlocked {key}"), Duration::from_secs(20))
        .await;
    // Readers share: ours joins Redisson's; our writer is refused.
    let ours = m.read_lock_with(key, &now).await.unwrap();
    let busy = m.write_lock_with(key, &now).await.unwrap_err();
    assert_eq!(busy.kind(), ErrorKind::NotAcquired);
    r.send(&format!("runlock {key}")).await;
    r.expect(&format!("runlocked {key}"), Duration::from_secs(30))
        .await;
    assert!(ours.release().await.unwrap());
    // Redisson's write held: our reader waits, and Redisson's unlock ("1") wakes it.
    assert!(try_(&mut r, "wtry").await);
    let reader = tokio::spawn({
        let m = m.clone();
        async move { m.read_lock(key).await.unwrap() }
    });
    until("our reader is queued", Duration::from_secs(30), || {
        queued(&s, key) == 1
    })
    .await;
    assert!(!reader.is_finished(), "we read while Redisson wrote");
    r.send(&format!("wunlock {key}")).await;
    r.expect(&format!("wunlocked {key}"), Duration::from_secs(30))
        .await;
    let ours = tokio::time::timeout(Duration::from_secs(20), reader)
        .await
        .expect("Redisson's write unlock did not wake our reader")
        .unwrap();
    assert!(!try_(&mut r, "wtry").await, "Redisson wrote while we read");
    assert!(ours.release().await.unwrap());
}

/// N = 3: a reader whose hold key expired on two nodes (it missed its renewals there), while
/// another reader's field keeps the hash alive on every node, is not renewed there: those
/// nodes answer "not renewed" (`extend_read.lua` 0), so its extend fails as lost instead of
/// counting them as a quorum of yeses; nothing of its hold is re-created, and the other
/// reader is still renewed.
#[tokio::test(flavor = "multi_thread")]
async fn a_reader_whose_hold_keys_expired_on_a_quorum_is_not_extended() {
    let _s = serial();
    let servers = [
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    ];
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let (m1, m2) = (manager(&urls, opts()), manager(&urls, opts()));
    let key = "rw:lapsed-reader";
    let a = m1.read_lock(key).await.unwrap();
    let b = m2.read_lock(key).await.unwrap();
    let hold = format!(
        "{}:1",
        ferrolock::__wire::rw::rwlock_timeout_prefix(key, a.token())
    );
    for s in &servers[..2] {
        assert_eq!(s.cmd::<i64>(&["DEL", &hold]), 1, "a's hold key on a node");
    }
    let extended = a.extend().await;
    let err = match extended {
        Ok(v) => panic!("a read hold lapsed on 2 of 3 nodes was extended (validity {v:?})"),
        Err(e) => e,
    };
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    for s in &servers[..2] {
        assert_eq!(
            s.cmd::<i64>(&["EXISTS", &hold]),
            0,
            "a's hold key re-created"
        );
    }
    assert!(b.extend().await.is_ok(), "the other reader was not renewed");
    assert!(b.release().await.unwrap());
}

/// One owner's read holds share numbered hold keys: a renewal of a hold well within its
/// validity is not refused because a shorter hold of the same owner lapsed and left a gap in
/// their numbers (before, `extend_read.lua` answered "not renewed" for any gap, and the live
/// hold was declared lost: found by a review). Its own mark decides.
#[tokio::test(flavor = "multi_thread")]
async fn a_live_read_hold_is_renewed_after_a_shorter_hold_of_its_owner_lapsed() {
    let _s = serial();
    let server = RedisServer::start();
    let o = opts().watchdog(false).wait(Some(Duration::ZERO));
    let m = manager(&[server.url()], o.clone());
    let key = "rw:sibling-lapsed";
    // The short hold's one try is not the manager's first request (which connects): on a
    // loaded machine that could eat the short ttl's validity (a grant heard too late).
    warm_up(&m).await;
    let short = m
        .read_lock_owned(key, 9, &o.clone().ttl(Duration::from_secs(1)))
        .await
        .unwrap();
    let long = m
        .read_lock_owned(key, 9, &o.clone().ttl(Duration::from_secs(20)))
        .await
        .unwrap();
    let first = format!(
        "{}:1",
        ferrolock::__wire::rw::rwlock_timeout_prefix(key, long.token())
    );
    until(
        "the short hold's key lapsed",
        Duration::from_secs(10),
        || server.cmd::<i64>(&["EXISTS", &first]) == 0,
    )
    .await;
    assert!(!short.is_held());
    let extended = long.extend().await;
    assert!(
        extended.is_ok(),
        "a read hold within its validity was not renewed: {:?}; status {:?}",
        extended.err(),
        long.status()
    );
    assert!(long.release().await.unwrap());
    assert_eq!(
        server.cmd::<i64>(&["EXISTS", key]),
        0,
        "the key outlived its holds"
    );
}

/// The release of an owner's outer read hold, after its shorter inner hold lapsed (its key
/// and mark expired, its count left in the hash), frees the key when no hold is left: before,
/// it dropped the hold key numbered after the count (the lapsed one's, already gone) and kept
/// its own, so the key stayed read-held, with nobody holding it, until that key's ttl ran out
/// (a writer waited up to a read ttl for nothing).
#[tokio::test(flavor = "multi_thread")]
async fn a_release_after_an_inner_read_hold_lapsed_frees_the_key() {
    let _s = serial();
    let server = RedisServer::start();
    let o = opts().watchdog(false).wait(Some(Duration::ZERO));
    let m = manager(&[server.url()], o.clone());
    let key = "rw:inner-lapsed";
    let long = m
        .read_lock_owned(key, 9, &o.clone().ttl(Duration::from_secs(20)))
        .await
        .unwrap();
    let short = m
        .read_lock_owned(key, 9, &o.clone().ttl(Duration::from_millis(1000)))
        .await
        .unwrap();
    let prefix = ferrolock::__wire::rw::rwlock_timeout_prefix(key, long.token());
    until(
        "the short hold's key lapsed",
        Duration::from_secs(10),
        || server.cmd::<i64>(&["EXISTS", &format!("{prefix}:2")]) == 0,
    )
    .await;
    assert!(!short.is_held());
    assert_eq!(
        server.cmd::<i64>(&["EXISTS", &format!("{prefix}:1")]),
        1,
        "the long hold's key"
    );
    assert!(long.release().await.unwrap());
    assert_eq!(
        server.cmd::<i64>(&["EXISTS", key]),
        0,
        "the key outlived its holds: {:?}",
        hash(&server, key)
    );
    let w = m.write_lock(key).await.expect("a writer on the freed key");
    assert!(w.release().await.unwrap());
}

/// The release of a read or write hold whose lease ran out (its mark expired) while another
/// hold of its owner keeps the owner's field says it was no longer held (`Ok(false)`, as for
/// any lock whose lease ran out), and leaves the live hold alone. Before, the scripts answered
/// "one hold fewer" for it, and the release said `Ok(true)`: released in time.
#[tokio::test(flavor = "multi_thread")]
async fn the_release_of_a_lapsed_hold_beside_a_live_one_says_it_was_not_held() {
    let _s = serial();
    let server = RedisServer::start();
    let o = opts().watchdog(false).wait(Some(Duration::ZERO));
    let m = manager(&[server.url()], o.clone());
    for write in [false, true] {
        let key = if write { "rw:lapsed-w" } else { "rw:lapsed-r" };
        let take = |ttl: Duration| {
            let o = o.clone().ttl(ttl);
            let m = &m;
            async move {
                if write {
                    m.write_lock_owned(key, 5, &o).await.unwrap()
                } else {
                    m.read_lock_owned(key, 5, &o).await.unwrap()
                }
            }
        };
        let long = take(Duration::from_secs(20)).await;
        let short = take(Duration::from_millis(1000)).await;
        let marks = |s: &RedisServer| s.cmd::<Vec<String>>(&["KEYS", "ferrolock:hold:*"]).len();
        assert_eq!(marks(&server), 2, "write {write}: a mark per hold");
        until(
            "the short hold's mark lapsed",
            Duration::from_secs(10),
            || marks(&server) == 1,
        )
        .await;
        assert!(!short.is_held());
        assert!(
            !short.release().await.unwrap(),
            "write {write}: a hold whose lease ran out was released in time"
        );
        assert!(long.is_held());
        assert!(long.release().await.unwrap(), "write {write}");
    }
}

/// A write release that leaves only a read hold of its owner that lapsed (a downgrade whose
/// read lease ran out: its field stays, its hold key is gone) frees the key, as a read
/// release that finds no live reader does. Before, it handed the key to that reader (`mode`
/// `read`), and the key stayed read-held, with nobody holding it, for the rest of the write
/// lease (writers waited for nothing).
#[tokio::test(flavor = "multi_thread")]
async fn a_write_release_beside_only_a_lapsed_read_hold_frees_the_key() {
    let _s = serial();
    let server = RedisServer::start();
    let o = opts().watchdog(false).wait(Some(Duration::ZERO));
    let m = manager(&[server.url()], o.clone());
    let key = "rw:downgrade-lapsed";
    let w = m
        .write_lock_owned(key, 4, &o.clone().ttl(Duration::from_secs(20)))
        .await
        .unwrap();
    let r = m
        .read_lock_owned(key, 4, &o.clone().ttl(Duration::from_millis(1000)))
        .await
        .unwrap();
    let hold = format!(
        "{}:1",
        ferrolock::__wire::rw::rwlock_timeout_prefix(key, r.token())
    );
    until(
        "the read hold's key lapsed",
        Duration::from_secs(10),
        || server.cmd::<i64>(&["EXISTS", &hold]) == 0,
    )
    .await;
    assert!(!r.is_held());
    assert_eq!(
        hash(&server, key).get("mode").map(String::as_str),
        Some("write")
    );
    assert!(w.release().await.unwrap());
    assert_eq!(
        server.cmd::<i64>(&["EXISTS", key]),
        0,
        "the key outlived its holds: {:?}",
        hash(&server, key)
    );
    let other = m.write_lock(key).await.expect("a writer on the freed key");
    assert!(other.release().await.unwrap());
}

/// A write release that hands the key to its owner's shorter read hold (a downgrade) leaves
/// the key to that hold's lease: once it lapses (watchdog off), no hold is left and another
/// owner's writer gets the key. Before, the hash kept the write hold's expiry, and the key
/// stayed read-held with nobody holding it for the rest of the write's ttl (as Redisson's
/// read unlock would not leave it: it lowers the hash to the longest hold key left).
#[tokio::test(flavor = "multi_thread")]
async fn a_write_release_handing_the_key_to_a_shorter_read_hold_leaves_it_to_that_lease() {
    let _s = serial();
    let server = RedisServer::start();
    let o = opts().watchdog(false).wait(Some(Duration::ZERO));
    let m = manager(&[server.url()], o.clone());
    let key = "rw:downgrade-shorter";
    let w = m
        .write_lock_owned(key, 4, &o.clone().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let r = m
        .read_lock_owned(key, 4, &o.clone().ttl(Duration::from_millis(2000)))
        .await
        .unwrap();
    let hold = format!(
        "{}:1",
        ferrolock::__wire::rw::rwlock_timeout_prefix(key, r.token())
    );
    assert!(w.release().await.unwrap());
    assert_eq!(
        hash(&server, key).get("mode").map(String::as_str),
        Some("read")
    );
    until(
        "the read hold's key lapsed",
        Duration::from_secs(20),
        || server.cmd::<i64>(&["EXISTS", &hold]) == 0,
    )
    .await;
    let left = pttl(&server, key);
    let other = m
        .write_lock_with(key, &o.clone().wait(Some(Duration::from_secs(10))))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "no hold is left, yet the key stays read-held (its PTTL was {left} ms when \
                 the read hold lapsed): {e}"
            )
        });
    assert!(other.release().await.unwrap());
    drop(r);
}

/// The release of an owner's last live write hold, after a shorter write re-entry of it lapsed
/// (watchdog off: its mark expired, its count left in the hash), frees the key. Before, the
/// lapsed hold's count kept the key write-held, with nobody holding it, for the released
/// hold's ttl, and every reader and writer waited that long.
#[tokio::test(flavor = "multi_thread")]
async fn the_last_write_release_after_a_lapsed_write_re_entry_frees_the_key() {
    let _s = serial();
    let server = RedisServer::start();
    let o = opts().watchdog(false).wait(Some(Duration::ZERO));
    let m = manager(&[server.url()], o.clone());
    let key = "rw:write-lapsed-then-last";
    let long = m
        .write_lock_owned(key, 6, &o.clone().ttl(Duration::from_secs(20)))
        .await
        .unwrap();
    let short = m
        .write_lock_owned(key, 6, &o.clone().ttl(Duration::from_millis(1000)))
        .await
        .unwrap();
    let marks = |s: &RedisServer| s.cmd::<Vec<String>>(&["KEYS", "ferrolock:hold:*"]).len();
    until(
        "the short hold's mark lapsed",
        Duration::from_secs(10),
        || marks(&server) == 1,
    )
    .await;
    assert!(!short.release().await.unwrap());
    assert!(long.release().await.unwrap());
    assert_eq!(
        server.cmd::<i64>(&["EXISTS", key]),
        0,
        "the key outlived its holds: {:?}",
        hash(&server, key)
    );
    let r = m.read_lock(key).await.expect("a reader on the freed key");
    assert!(r.release().await.unwrap());
}

/// The release of a downgrade's read hold, after the write hold it was taken under lapsed (its
/// lease ran out unrenewed: its mark expired, its count left in the hash), frees the key: no
/// hold is left. Before, the key stayed write-held, with nobody holding it, for the read
/// hold's ttl (every reader and writer waited that long).
#[tokio::test(flavor = "multi_thread")]
async fn a_read_release_after_the_write_hold_it_downgraded_lapsed_frees_the_key() {
    let _s = serial();
    let server = RedisServer::start();
    let o = opts().watchdog(false).wait(Some(Duration::ZERO));
    let m = manager(&[server.url()], o.clone());
    let key = "rw:downgraded-write-lapsed";
    let w = m
        .write_lock_owned(key, 8, &o.clone().ttl(Duration::from_millis(1000)))
        .await
        .unwrap();
    let r = m
        .read_lock_owned(key, 8, &o.clone().ttl(Duration::from_secs(20)))
        .await
        .unwrap();
    let marks = |s: &RedisServer| s.cmd::<Vec<String>>(&["KEYS", "ferrolock:hold:*"]).len();
    until(
        "the write hold's mark lapsed",
        Duration::from_secs(10),
        || marks(&server) == 1,
    )
    .await;
    assert!(!w.release().await.unwrap());
    assert!(r.release().await.unwrap());
    assert_eq!(
        server.cmd::<i64>(&["EXISTS", key]),
        0,
        "the key outlived its holds: {:?}",
        hash(&server, key)
    );
    let other = m.write_lock(key).await.expect("a writer on the freed key");
    assert!(other.release().await.unwrap());
}

/// The release of a write hold whose lease ran out, while the read hold its owner took under
/// it (a downgrade) lives on, hands the key to that read hold: another owner's reader is
/// granted beside it. Before, the lapsed write count kept the key write-held for as long as
/// the read hold lived (for ever with its watchdog on), and every other reader waited.
#[tokio::test(flavor = "multi_thread")]
async fn a_lapsed_write_holds_release_hands_the_key_to_its_owners_live_read_hold() {
    let _s = serial();
    let server = RedisServer::start();
    let o = opts().watchdog(false).wait(Some(Duration::ZERO));
    let m = manager(&[server.url()], o.clone());
    let key = "rw:lapsed-write-live-read";
    let w = m
        .write_lock_owned(key, 11, &o.clone().ttl(Duration::from_millis(1000)))
        .await
        .unwrap();
    let r = m
        .read_lock_owned(key, 11, &o.clone().ttl(Duration::from_secs(20)))
        .await
        .unwrap();
    let marks = |s: &RedisServer| s.cmd::<Vec<String>>(&["KEYS", "ferrolock:hold:*"]).len();
    until(
        "the write hold's mark lapsed",
        Duration::from_secs(10),
        || marks(&server) == 1,
    )
    .await;
    assert!(!w.release().await.unwrap());
    assert_eq!(
        hash(&server, key).get("mode").map(String::as_str),
        Some("read"),
        "the lapsed write count kept the key: {:?}",
        hash(&server, key)
    );
    let other = m
        .read_lock(key)
        .await
        .expect("another owner's reader beside the live read hold");
    assert!(r.is_held());
    assert!(other.release().await.unwrap());
    assert!(r.release().await.unwrap());
    assert_eq!(server.cmd::<i64>(&["EXISTS", key]), 0);
}

/// The release of a read re-entry whose lease ran out after its owner's outer read hold was
/// released (watchdog off, a shorter ttl than the outer hold's) frees the key: no hold is left.
/// Before, it answered "not held" and took nothing, and its count, with the hold key the outer
/// release had raised to its own lease, kept the key read-held with nobody holding it for the
/// rest of that lease: every writer waited that long.
#[tokio::test(flavor = "multi_thread")]
async fn the_release_of_a_read_re_entry_that_lapsed_after_the_outer_release_frees_the_key() {
    let _s = serial();
    let server = RedisServer::start();
    let o = opts().watchdog(false).wait(Some(Duration::ZERO));
    let m = manager(&[server.url()], o.clone());
    let key = "rw:read-outer-released-then-lapsed";
    let long = m
        .read_lock_owned(key, 6, &o.clone().ttl(Duration::from_secs(20)))
        .await
        .unwrap();
    let short = m
        .read_lock_owned(key, 6, &o.clone().ttl(Duration::from_millis(1000)))
        .await
        .unwrap();
    assert!(long.release().await.unwrap());
    let marks = |s: &RedisServer| s.cmd::<Vec<String>>(&["KEYS", "ferrolock:hold:*"]).len();
    until(
        "the short hold's mark lapsed",
        Duration::from_secs(10),
        || marks(&server) == 0,
    )
    .await;
    assert!(
        !short.release().await.unwrap(),
        "a read hold whose lease ran out was released in time"
    );
    assert_eq!(
        server.cmd::<Vec<String>>(&["KEYS", "*"]),
        Vec::<String>::new(),
        "the key outlived its holds: {:?}",
        hash(&server, key)
    );
    let w = m.write_lock(key).await.expect("a writer on the freed key");
    assert!(w.release().await.unwrap());
}

/// Readers get no fence, a downgrade's read hold included: it outlives the write hold it was
/// taken under, beside other readers, so the writer's fence would order nothing. And an owner
/// that holds the read lock, asking a fenced write, hears that the upgrade is refused.
#[tokio::test]
async fn a_downgrades_read_hold_carries_no_fence() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts());
    let key = "rw:downgrade-fence";
    let w = m
        .write_lock_owned(key, 4, &opts().fencing(true))
        .await
        .unwrap();
    assert!(w.fence().is_some());
    let r = m.read_lock_owned(key, 4, &opts()).await.unwrap();
    assert_eq!(r.fence(), None, "a read hold carried the writer's fence");
    assert!(w.release().await.unwrap());
    let err = m
        .write_lock_owned(key, 4, &opts().fencing(true))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("upgrade"), "{err}");
    assert!(r.release().await.unwrap());
    let r = m.read_lock_owned(key, 5, &opts()).await.unwrap();
    let err = m
        .write_lock_owned(key, 5, &opts().fencing(true))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("upgrade"), "{err}");
    assert!(r.release().await.unwrap());
    // A fenced write re-entry of a write hold taken without fencing keeps that hold's (no)
    // fence: refused, and the outer hold is left as it was.
    let w = m.write_lock_owned(key, 6, &opts()).await.unwrap();
    match m.write_lock_owned(key, 6, &opts().fencing(true)).await {
        Ok(inner) => panic!("a fenced write carried fence {:?}", inner.fence()),
        Err(e) => assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}"),
    }
    assert!(w.is_held());
    let rival = manager(&[server.url()], opts());
    let busy = rival
        .write_lock_with(key, &opts().wait(Some(Duration::ZERO)))
        .await;
    assert!(busy.is_err(), "a second writer got the key");
    assert!(w.release().await.unwrap());
    assert_eq!(server.cmd::<i64>(&["EXISTS", key]), 0);
}

/// Readers that crash (their handles forgotten, never released) while another reader keeps
/// the key read-held leave nothing behind once their leases end: the next read release takes
/// their fields out of the hash (their hold keys are gone: no hold is left behind them), and
/// their sets of live holds expire with their last hold. Before, each crashed reader's field
/// stayed in the hash as long as read traffic kept the key alive: one more per crash, without
/// bound, each read by every later release.
#[tokio::test(flavor = "multi_thread")]
async fn crashed_readers_leave_no_field_behind_under_a_live_reader() {
    let _s = serial();
    let server = RedisServer::start();
    let o = opts().watchdog(false);
    let m = manager(&[server.url()], o.clone());
    let key = "rw:crashed-readers";
    let long = m
        .read_lock_owned(key, 1, &o.clone().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    for owner in 100..103 {
        let crashed = m
            .read_lock_owned(key, owner, &o.clone().ttl(Duration::from_millis(1000)))
            .await
            .unwrap();
        let field = crashed.token().to_string();
        let hold = format!(
            "{}:1",
            ferrolock::__wire::rw::rwlock_timeout_prefix(key, &field)
        );
        std::mem::forget(crashed);
        until(
            "the crashed reader's lease ended",
            Duration::from_secs(10),
            || server.cmd::<i64>(&["EXISTS", &hold]) == 0,
        )
        .await;
        let holds = format!("ferrolock:holds:{{{key}}}:{field}");
        until(
            "its set of live holds expired",
            Duration::from_secs(10),
            || server.cmd::<i64>(&["EXISTS", &holds]) == 0,
        )
        .await;
        let passing = m
            .read_lock_owned(key, 50, &o.clone().ttl(Duration::from_secs(5)))
            .await
            .unwrap();
        passing.release().await.unwrap();
    }
    let fields: Vec<String> = hash(&server, key).into_keys().collect();
    let mut expected = vec!["mode".to_string(), long.token().to_string()];
    expected.sort();
    assert_eq!(fields, expected, "crashed readers' fields left in the hash");
    assert!(long.release().await.unwrap());
    assert_eq!(server.cmd::<i64>(&["EXISTS", key]), 0);
}
