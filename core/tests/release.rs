//! Release: exactly once when its future is dropped, ordered after its grant's requests on
//! each node, back to its caller once a quorum has decided, and every node's answer
//! ("released", "not ours", an error reply, no answer) told apart. Serial: they pause nodes
//! and measure deadlines.

// Each #[tokio::test] runs its own runtime on its own thread, so holding the std mutex that
// serializes these tests across awaits blocks nothing but the test itself.
#![allow(clippy::await_holding_lock)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use ferrolock::runtime::block_on;
use ferrolock::{ErrorKind, LockOptions, queue_key};
use ferrolock_testbed::{Cluster, Direction, Proxy, RedisServer, ServerOptions};

fn ropts() -> LockOptions {
    opts()
        .reentrant(true)
        .ttl(Duration::from_secs(30))
        .node_timeout(ms(1_000))
        .wait(Some(Duration::ZERO))
}

fn count(server: &RedisServer, key: &str, field: &str) -> Option<String> {
    server.cmd(&["HGET", key, field])
}

/// Polls `cond` every 10 ms until it holds; panics with `what` after `limit`.
fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < end, "{what} (waited {limit:?})");
        std::thread::sleep(ms(10));
    }
}

/// The node answers late: it holds every command for 400 ms (sent on a connection of its own).
fn pause_clients(server: &RedisServer) {
    let ok: String = server.cmd(&["CLIENT", "PAUSE", "400", "ALL"]);
    assert_eq!(ok, "OK");
}

/// After a release dropped 120 ms in, once the pause is over: count 2 went to 1, not 0.
fn assert_applied_once(server: &RedisServer, key: &str, field: &str) {
    assert_eq!(
        count(server, key, field).as_deref(),
        Some("1"),
        "the dropped inner release was applied {} (count 2 should be 1)",
        if server.cmd::<i64>(&["EXISTS", key]) == 0 {
            "twice: the hash is gone"
        } else {
            "not once"
        }
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_reentrant_release_is_applied_exactly_once() {
    let _serial = serial();
    let server = RedisServer::start();
    let o = ropts();
    let m = manager(&[server.url()], o.clone());
    let other = manager(&[server.url()], o.clone());
    let key = unique_key("dropped-reentrant-async");
    let outer = m.acquire_owned(&key, 1, &o).await.unwrap();
    let inner = m.acquire_owned(&key, 1, &o).await.unwrap();
    let field = outer.token().to_string();
    assert_eq!(count(&server, &key, &field).as_deref(), Some("2"));

    pause_clients(&server);
    let cut = tokio::time::timeout(ms(120), inner.release()).await;
    assert!(
        cut.is_err(),
        "the release was answered within 120 ms: the node was not paused"
    );
    // The pause ends 400 ms after it began; the node then runs what it was sent.
    tokio::time::sleep(ms(600)).await;
    assert_applied_once(&server, &key, &field);
    let err = other
        .try_acquire(&key)
        .await
        .expect_err("another client took the held key");
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    assert!(outer.is_held());
    assert!(outer.release().await.unwrap());
    assert_eq!(server.cmd::<i64>(&["EXISTS", &key]), 0);
}

#[test]
fn a_dropped_reentrant_release_on_a_blocking_thread_is_applied_exactly_once() {
    let _serial = serial();
    let server = RedisServer::start();
    let o = ropts();
    let m = manager(&[server.url()], o.clone());
    let other = manager(&[server.url()], o.clone());
    let key = unique_key("dropped-reentrant-blocking");
    let outer = block_on(m.acquire_owned(&key, 1, &o)).unwrap();
    let inner = block_on(m.acquire_owned(&key, 1, &o)).unwrap();
    let field = outer.token().to_string();
    assert_eq!(count(&server, &key, &field).as_deref(), Some("2"));

    pause_clients(&server);
    // Interrupted inside block_on, as a Ctrl-C between wait slices does: the request already
    // written on this thread's connection finishes there before block_on returns.
    let cut = block_on(async { tokio::time::timeout(ms(120), inner.release()).await });
    assert!(
        cut.is_err(),
        "the release was answered within 120 ms: the node was not paused"
    );
    std::thread::sleep(ms(600));
    assert_applied_once(&server, &key, &field);
    let err = block_on(other.try_acquire(&key)).expect_err("another client took the held key");
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    assert!(outer.is_held());
    assert!(block_on(outer.release()).unwrap());
    assert_eq!(server.cmd::<i64>(&["EXISTS", &key]), 0);
}

#[test]
fn a_blocking_release_on_three_nodes_runs_after_a_slow_nodes_grant() {
    let _serial = serial();
    let cluster = Cluster::start(3);
    let slow = &cluster.servers[2];
    let proxy = Proxy::start(slow.port());
    let urls = vec![
        cluster.servers[0].url(),
        cluster.servers[1].url(),
        proxy.url(),
    ];
    // The grant's request opens the slow node's connection through the 300 ms delay (a
    // handshake of several round trips): a node timeout that a loaded machine cannot miss,
    // or the request gives up unsent and the fault does not happen (seen with 3 s under two
    // busy CPUs, 3 runs in 18; none in 30 with this one).
    let m = manager(
        &urls,
        opts()
            .ttl(Duration::from_secs(120))
            .node_timeout(ms(15_000))
            .wait(Some(Duration::ZERO)),
    );
    // Every connection to the slow node is open except the one the grant goes out on:
    // refused while the warm-up acquires, open for its release.
    proxy.cut();
    let warm = block_on(m.acquire("warm")).expect("a quorum of two grants");
    proxy.heal();
    assert!(block_on(warm.release()).unwrap());

    for round in ["fresh connection", "reconnect"] {
        if round == "reconnect" {
            // The slow node's shared connection breaks: the next grant must reconnect first.
            proxy.cut();
            let warm = block_on(m.acquire("warm")).expect("a quorum of two grants");
            let _ = block_on(warm.release());
            proxy.heal();
        }
        let key = unique_key(&format!("blocking-ordered-{}", round.replace(' ', "-")));
        let sets = calls(slow, "set");
        proxy.set_delay(ms(300));
        let lock = block_on(m.acquire(&key)).expect("a quorum of two grants");
        assert!(block_on(lock.release()).unwrap());
        wait_for(
            &format!("{round}: the slow node never got the grant's SET: the fault did not happen"),
            Duration::from_secs(30),
            || calls(slow, "set") > sets,
        );
        // The release went out after the SET on the same connection: it lands right after.
        wait_for(
            &format!("{round}: the slow node kept the key with no owner after its SET landed"),
            Duration::from_secs(5),
            || get(slow, &key).is_none(),
        );
        proxy.heal();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_release_returns_once_a_quorum_released_while_a_node_is_paused() {
    let _serial = serial();
    let cluster = Cluster::start(3);
    // Loss margin 2 x 20 s under a third of the ttl.
    let o = opts()
        .ttl(Duration::from_secs(300))
        .node_timeout(ms(20_000))
        .wait(Some(Duration::ZERO));
    let m = manager(&cluster.urls(), o);
    let key = unique_key("release-quorum-first");
    let lock = m.acquire(&key).await.unwrap();
    cluster.servers[2].pause();

    let started = Instant::now();
    let released = lock.release().await;
    let took = started.elapsed();
    // A deadline far from the 20 s node timeout the paused node would cost, not a speed claim.
    assert!(
        took < Duration::from_secs(10),
        "release waited for the paused node: {took:?}"
    );
    assert!(released.unwrap());
    assert_eq!(get(&cluster.servers[0], &key), None);
    assert_eq!(get(&cluster.servers[1], &key), None);

    // The paused node's request was sent before it stopped: once it runs again it deletes.
    cluster.servers[2].resume();
    let slow = &cluster.servers[2];
    wait_for(
        "the paused node's release never completed",
        Duration::from_secs(5),
        || get(slow, &key).is_none(),
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hand_off_between_two_tasks_of_one_manager_completes_while_a_node_is_paused() {
    let _serial = serial();
    let cluster = Cluster::start(3);
    // Long retry delay and ttl: the waiter attempts only when it is told.
    // A node timeout far above what the hand-off needs, so the bound below tells "waited for
    // the paused node" from "slow machine" (loss margin 2 x 20 s under a third of the ttl).
    let o = opts()
        .ttl(Duration::from_secs(300))
        .node_timeout(ms(20_000))
        .retry_delay(Duration::from_secs(10))
        // Its first queued attempt may wait a jittered retry delay (up to 15 s).
        .wait(Some(Duration::from_secs(60)));
    let m = manager(&cluster.urls(), o);
    let key = unique_key("hand-off-paused");
    let holder = m.acquire(&key).await.unwrap();
    let waiter = tokio::spawn({
        let (m, key) = (m.clone(), key.clone());
        async move { m.acquire(&key).await }
    });
    // Queued on every node's server queue (its confirmed subscription's re-check did that).
    let queue = queue_key(&key);
    let servers = &cluster.servers;
    tokio::task::block_in_place(|| {
        wait_for(
            "the waiter never queued on every node",
            Duration::from_secs(60),
            || {
                servers
                    .iter()
                    .all(|s| s.cmd::<i64>(&["ZCARD", &queue]) == 1)
            },
        )
    });
    cluster.servers[2].pause();

    let started = Instant::now();
    assert!(holder.release().await.unwrap());
    let next = tokio::time::timeout(Duration::from_secs(60), waiter)
        .await
        .expect("the waiter never got the lock")
        .unwrap()
        .expect("the waiter's acquire failed");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "the hand-off waited for the paused node: {took:?}"
    );
    assert!(next.is_held());
    assert!(next.release().await.unwrap());
    cluster.servers[2].resume();
}

/// The hand-off race behind a 2 s wait seen on a saturated machine: the holder's release
/// reaches node 0 (whose publish wakes the waiter) but not yet node 1, so the waiter's attempt
/// is granted by node 0, refused by node 1 and unanswered by the paused node 2. Undecided, it
/// used to wait out node 2's timeout; once node 1's release is published it must give up at
/// once and try again. The holder's requests to node 1 are held by a proxy (the waiter's go
/// straight there), so the race happens every time.
#[tokio::test(flavor = "multi_thread")]
async fn a_waiters_attempt_refused_by_a_node_that_then_releases_does_not_wait_for_a_paused_node() {
    let _serial = serial();
    let cluster = Cluster::start(3);
    let proxy = Proxy::start(cluster.servers[1].port());
    // A node timeout far above what the hand-off needs, so that the bound below tells
    // "waited for the paused node" from "slow machine" (the loss margin, 2 x node timeout,
    // must stay under a third of the ttl).
    let o = opts()
        .ttl(Duration::from_secs(300))
        .node_timeout(ms(20_000))
        .retry_delay(Duration::from_secs(10))
        // The waiter queues at its first attempt after joining: once its subscription is
        // confirmed, or else after a retry delay (jittered, up to 15 s), which a loaded
        // machine reached (the waiter gave up at a 20 s wait before it queued on every node).
        .wait(Some(Duration::from_secs(60)));
    let holder_urls = vec![
        cluster.servers[0].url(),
        proxy.url(),
        cluster.servers[2].url(),
    ];
    let holder_m = manager(&holder_urls, o.clone());
    let waiter_m = manager(&cluster.urls(), o);
    let key = unique_key("refused-then-released");
    let holder = holder_m.acquire(&key).await.unwrap();
    let holders_token = holder.token().to_string();
    let waiter = tokio::spawn({
        let (m, key) = (waiter_m.clone(), key.clone());
        async move { m.acquire(&key).await }
    });
    let queue = queue_key(&key);
    let servers = &cluster.servers;
    let end = Instant::now() + Duration::from_secs(60);
    while !tokio::task::block_in_place(|| {
        servers
            .iter()
            .all(|s| s.cmd::<i64>(&["ZCARD", &queue]) == 1)
    }) {
        if waiter.is_finished() {
            panic!("the waiter ended before it queued: {:?}", waiter.await);
        }
        assert!(
            Instant::now() < end,
            "the waiter never queued on every node"
        );
        tokio::time::sleep(ms(10)).await;
    }
    let scripts_on_1 = || -> u64 {
        let info: String = servers[1].cmd(&["INFO", "commandstats"]);
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
    };
    let before = tokio::task::block_in_place(scripts_on_1);
    cluster.servers[2].pause();
    proxy.hold(Direction::Up);
    let release = tokio::spawn(async move { holder.release().await });
    // The fault happened: node 0 granted the waiter (its release published there) while
    // node 1 still refused it (a script ran there; the holder's release is held).
    tokio::task::block_in_place(|| {
        wait_for(
            "the waiter's attempt never ran on nodes 0 and 1",
            Duration::from_secs(10),
            || {
                scripts_on_1() > before
                    && servers[0]
                        .cmd::<Option<String>>(&["GET", &key])
                        .is_some_and(|t| t != holders_token)
            },
        )
    });
    assert_eq!(
        servers[1].cmd::<i64>(&["EXISTS", &key]),
        1,
        "node 1 must still hold the holder's key"
    );
    let started = Instant::now();
    proxy.release(Direction::Up);
    let next = tokio::time::timeout(Duration::from_secs(60), waiter)
        .await
        .expect("the waiter never got the lock")
        .unwrap()
        .expect("the waiter's acquire failed");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "after node 1 released, the waiter still waited for the paused node: {took:?}"
    );
    assert!(next.is_held());
    // The holder's release may have timed out on node 1 (held longer than the node timeout on
    // a loaded machine); it was delivered all the same, which is what the waiter needed.
    let _ = release.await.unwrap();
    assert!(next.release().await.unwrap());
    cluster.servers[2].resume();
}

const SECRET: &str = "rel-s3cret";

/// A server whose user `locker` may take a lock (SET) but not run the release's script.
fn no_script_server() -> RedisServer {
    RedisServer::start_with(ServerOptions {
        acl_users: vec![format!(
            "user locker on >{SECRET} ~* &* +@all -eval -evalsha -script"
        )],
        ..Default::default()
    })
}

fn locker_url(server: &RedisServer) -> String {
    format!("redis://locker:{SECRET}@127.0.0.1:{}", server.port())
}

fn locker_name(server: &RedisServer) -> String {
    format!("redis://locker:***@127.0.0.1:{}", server.port())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_error_reply_is_a_redis_error_naming_the_node_and_its_reply() {
    let _serial = serial();
    let o = opts()
        .ttl(Duration::from_secs(30))
        .node_timeout(ms(1_000))
        .wait(Some(Duration::ZERO));

    // One node that refuses the release script.
    let denied = no_script_server();
    let m = manager(&[locker_url(&denied)], o.clone());
    let lock = m.acquire(&unique_key("nopermit-1")).await.unwrap();
    let err = lock
        .release()
        .await
        .expect_err("a NOPERM release is not a release");
    assert_eq!(err.kind(), ErrorKind::Redis, "{err}");
    let msg = err.message();
    assert!(
        msg.contains(&format!(
            "node {} answered with an error",
            locker_name(&denied)
        )),
        "{err}"
    );
    assert!(msg.to_uppercase().contains("NOPERM"), "{err}");
    assert!(!msg.contains("not ours") && !msg.contains(SECRET), "{err}");

    // Three nodes, two refuse: released on one, the error of the first refusing node named.
    let ok = RedisServer::start();
    let denied2 = no_script_server();
    let urls = vec![ok.url(), locker_url(&denied), locker_url(&denied2)];
    let m = manager(&urls, o.clone());
    let lock = m.acquire(&unique_key("nopermit-3")).await.unwrap();
    let err = lock
        .release()
        .await
        .expect_err("released on one node of three");
    assert_eq!(err.kind(), ErrorKind::Redis, "{err}");
    let msg = err.message();
    assert!(
        msg.contains(&format!(
            "node {} answered with an error",
            locker_name(&denied)
        )),
        "{err}"
    );
    assert!(msg.to_uppercase().contains("NOPERM"), "{err}");
    assert!(
        msg.contains(&format!("released on 1 of 3 nodes ({})", ok.url())),
        "{err}"
    );
    assert!(
        msg.contains(&format!("error on {}", locker_name(&denied2))),
        "{err}"
    );
    assert!(
        !msg.contains("no answer") && !msg.contains("not ours"),
        "{err}"
    );

    // One refusing node of three does not sink a quorum.
    let ok2 = RedisServer::start();
    let m = manager(&[ok.url(), ok2.url(), locker_url(&denied)], o);
    let lock = m.acquire(&unique_key("nopermit-minority")).await.unwrap();
    assert!(lock.release().await.unwrap());
}

/// An extend that error replies kept from a quorum (an ACL that denies the script, a node
/// turned read-only) fails as a Redis error naming the node and its reply, as an acquire and a
/// release do: the nodes answered, so "quorum unreachable" sent the caller looking for a
/// network fault. The validity stays as it was.
#[tokio::test(flavor = "multi_thread")]
async fn an_extend_refused_by_error_replies_is_a_redis_error_naming_the_node() {
    let _serial = serial();
    let o = opts()
        .ttl(Duration::from_secs(30))
        .node_timeout(ms(1_000))
        .wait(Some(Duration::ZERO));

    // Three nodes, two refuse the extend's script (the plain SET NX of the grant is allowed).
    let ok = RedisServer::start();
    let denied = no_script_server();
    let denied2 = no_script_server();
    let urls = vec![ok.url(), locker_url(&denied), locker_url(&denied2)];
    let m = manager(&urls, o.clone());
    let key = unique_key("nopermit-extend");
    let lock = m.acquire(&key).await.unwrap();
    let before = lock.deadline();
    let err = lock
        .extend()
        .await
        .expect_err("an extend refused on two nodes of three");
    assert_eq!(err.kind(), ErrorKind::Redis, "{err}");
    let msg = err.message();
    assert!(
        msg.contains(&format!(
            "node {} answered with an error",
            locker_name(&denied)
        )),
        "{err}"
    );
    assert!(msg.contains(&format!("{key:?}")), "{err}");
    assert!(msg.to_uppercase().contains("NOPERM"), "{err}");
    assert!(!msg.contains(SECRET), "{err}");
    assert!(
        lock.is_held() && lock.deadline() == before,
        "validity unchanged"
    );

    // One node, turned read-only under the lock.
    let mut master = RedisServer::start();
    master.kill();
    let node = RedisServer::start();
    let m = manager(&[node.url()], o);
    let key = unique_key("readonly-extend");
    let lock = m.acquire(&key).await.unwrap();
    let port = master.port().to_string();
    let _: String = node.cmd(&["REPLICAOF", "127.0.0.1", &port]);
    // A longer lease than the grant's: an extend to the same 30 s right after the grant may
    // find the key's PTTL still at 30000 (the same millisecond) and, having nothing to raise,
    // write nothing, which a read-only replica allows (1 run in 6 so).
    let err = lock
        .extend_for(Duration::from_secs(60))
        .await
        .expect_err("a READONLY extend is not an extend");
    let _: String = node.cmd(&["REPLICAOF", "NO", "ONE"]);
    assert_eq!(err.kind(), ErrorKind::Redis, "{err}");
    assert!(err.message().to_uppercase().contains("READONLY"), "{err}");
    assert!(
        err.message()
            .contains(&format!("node {} answered with an error", node.url())),
        "{err}"
    );
    assert!(lock.is_held(), "validity unchanged");
    assert!(lock.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_only_replica_is_a_redis_error_not_a_lost_lock() {
    let _serial = serial();
    // A master that is not there: the node turns read-only and keeps its data (no sync).
    let mut master = RedisServer::start();
    master.kill();
    let node = RedisServer::start();
    let m = manager(
        &[node.url()],
        opts()
            .ttl(Duration::from_secs(30))
            .wait(Some(Duration::ZERO)),
    );
    let lock = m.acquire(&unique_key("readonly")).await.unwrap();
    let port = master.port().to_string();
    let _: String = node.cmd(&["REPLICAOF", "127.0.0.1", &port]);
    let err = lock
        .release()
        .await
        .expect_err("a READONLY release is not a release");
    let _: String = node.cmd(&["REPLICAOF", "NO", "ONE"]);
    assert_eq!(err.kind(), ErrorKind::Redis, "{err}");
    assert!(err.message().to_uppercase().contains("READONLY"), "{err}");
    assert!(
        err.message()
            .contains(&format!("node {} answered with an error", node.url())),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn not_ours_and_no_answer_are_told_apart() {
    let _serial = serial();
    let cluster = Cluster::start(3);
    let [a, b, c] = [0, 1, 2].map(|i| cluster.servers[i].url());
    let o = opts()
        .ttl(Duration::from_secs(30))
        .node_timeout(ms(300))
        .wait(Some(Duration::ZERO));
    let m = manager(&cluster.urls(), o);

    // Released on one node, gone on one (not ours), one paused (no answer): no quorum either way.
    let key = unique_key("not-ours-no-answer");
    let lock = m.acquire(&key).await.unwrap();
    // Once, on a saturated machine, node 0's grant landed after the DEL below.
    granted_everywhere(&cluster.servers, &key).await;
    let _: i64 = cluster.servers[0].cmd(&["DEL", &key]);
    cluster.servers[1].pause();
    let err = lock
        .release()
        .await
        .expect_err("released on one node of three");
    cluster.servers[1].resume();
    assert_eq!(err.kind(), ErrorKind::QuorumUnreachable, "{err}");
    let msg = err.message();
    assert!(
        msg.contains(&format!("released on 1 of 3 nodes ({c})")),
        "{err}"
    );
    assert!(
        msg.contains(&format!("not ours (expired or taken) on {a}")),
        "{err}"
    );
    assert!(msg.contains(&format!("no answer from {b} (")), "{err}");
    assert!(!msg.contains("did not answer and"), "{err}");

    // Gone on two of three: not ours, the lock was lost.
    let key = unique_key("not-ours-majority");
    let lock = m.acquire(&key).await.unwrap();
    granted_everywhere(&cluster.servers, &key).await;
    for s in &cluster.servers[..2] {
        let _: i64 = s.cmd(&["DEL", &key]);
    }
    assert!(!lock.release().await.unwrap());
    // The release returns at a quorum (two "not ours"): node 2's delete may still be on its
    // way, so it is awaited.
    gone_everywhere(&cluster.servers[2..], &key).await;
}
