//! Blocking callers (`ferrolock::runtime::block_on`, what the Python and C surfaces use): the
//! calling thread drives its requests on connections of its own. Real servers; serial where a
//! server is paused.

mod common;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::*;
use ferrolock::runtime::block_on;
use ferrolock_testbed::RedisServer;

fn info_field(server: &RedisServer, section: &str, field: &str) -> u64 {
    let info: String = server.cmd(&["INFO", section]);
    info.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.strip_prefix(':'))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0)
}

#[test]
fn threads_blocking_on_one_manager_exclude_each_other() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts().wait(None));
    let key = unique_key("blocking-exclusion");
    let counter = unique_key("blocking-counter");
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (m, key, counter, url) = (m.clone(), key.clone(), counter.clone(), server.url());
            std::thread::spawn(move || {
                let mut plain = redis::Client::open(url).unwrap().get_connection().unwrap();
                for _ in 0..50 {
                    let lock = block_on(m.acquire(&key)).expect("acquire");
                    // Not atomic on purpose: only the lock makes the count exact.
                    let n: Option<u64> = redis::cmd("GET").arg(&counter).query(&mut plain).unwrap();
                    std::thread::yield_now();
                    let _: () = redis::cmd("SET")
                        .arg(&counter)
                        .arg(n.unwrap_or(0) + 1)
                        .query(&mut plain)
                        .unwrap();
                    assert!(block_on(lock.release()).expect("release"), "lock lost");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a thread panicked");
    }
    assert_eq!(get(&server, &counter).as_deref(), Some("200"));
}

#[test]
fn each_blocking_thread_has_its_own_connection_closed_when_the_thread_ends() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts());
    let before = info_field(&server, "clients", "connected_clients");
    let threads = 6;
    let gate = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let (m, gate) = (m.clone(), gate.clone());
            std::thread::spawn(move || {
                let lock = block_on(m.acquire(&format!("own-conn:{i}"))).expect("acquire");
                assert!(block_on(lock.release()).expect("release"));
                gate.wait(); // connections counted while every thread is alive
                gate.wait();
            })
        })
        .collect();
    gate.wait();
    let during = info_field(&server, "clients", "connected_clients");
    assert_eq!(
        during,
        before + threads as u64,
        "one connection per blocking thread"
    );
    gate.wait();
    for h in handles {
        h.join().expect("a thread panicked");
    }
    // A thread's runtime and connections go with the thread.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = info_field(&server, "clients", "connected_clients");
        if now == before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "connections of ended threads still open: {now} (before: {before})"
        );
        std::thread::sleep(ms(20));
    }
    // And the manager still works from a new thread.
    let m2 = m.clone();
    std::thread::spawn(move || {
        let lock = block_on(m2.acquire("own-conn:again")).expect("acquire");
        assert!(block_on(lock.release()).expect("release"));
    })
    .join()
    .unwrap();
}

#[test]
fn an_acquire_dropped_mid_request_on_a_blocking_thread_is_undone_after_its_request() {
    let _serial = serial();
    let server = RedisServer::start();
    // The node timeout gives `written_to` (a read of /proc/net/tcp every millisecond) time
    // to see the request written before the acquire gives up, on a loaded machine too: with
    // 300 ms it once did not, and the acquire ended first.
    let node_timeout = ms(3_000);
    let m = manager(
        &[server.url()],
        opts()
            .ttl(Duration::from_secs(60))
            .node_timeout(node_timeout)
            .wait(Some(Duration::ZERO)),
    );
    let key = unique_key("blocking-dropped");
    // This thread's connection is open before the fault.
    let warm = block_on(m.acquire("blocking-warmup")).unwrap();
    block_on(warm.release()).unwrap();
    let sets_before = calls(&server, "set");

    server.pause();
    let started = Instant::now();
    // The SET is written (the paused node's socket holds it) and unanswered when the acquire
    // is dropped; its undo goes out on the same connection, after it, and block_on returns
    // once the undo gave up.
    let outcome = block_on(async {
        tokio::select! {
            got = m.acquire(&key) => Some(got),
            () = written_to(&server) => None,
        }
    });
    let took = started.elapsed();
    server.resume();

    assert!(
        outcome.is_none(),
        "the acquire should have been dropped once written: {outcome:?}"
    );
    assert!(
        took >= node_timeout,
        "block_on returned before the undo had its node timeout: {took:?}"
    );
    // The paused node then executes what it had received: the SET, then the undo.
    let deadline = Instant::now() + Duration::from_secs(5);
    while calls(&server, "set") == sets_before {
        assert!(
            Instant::now() < deadline,
            "the dropped acquire's SET never reached the node: the fault did not happen"
        );
        std::thread::sleep(ms(10));
    }
    std::thread::sleep(ms(50));
    assert_eq!(
        get(&server, &key),
        None,
        "the dropped acquire's grant was left behind"
    );
}

#[test]
fn idle_blocking_threads_close_their_connections_once_the_manager_and_its_locks_are_gone() {
    let server = RedisServer::start();
    let before = info_field(&server, "clients", "connected_clients");
    let m = manager(&[server.url()], opts());
    let threads = 20;
    let gate = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let (m, gate) = (m.clone(), gate.clone());
            std::thread::spawn(move || {
                let lock = block_on(m.acquire(&format!("freed-conn:{i}"))).expect("acquire");
                assert!(block_on(lock.release()).expect("release"));
                drop((lock, m));
                gate.wait(); // every thread has called in
                gate.wait(); // idle (well within the idle limit) until the test is done
            })
        })
        .collect();
    gate.wait();
    assert!(info_field(&server, "clients", "connected_clients") >= before + threads as u64);
    drop(m);
    // The threads live on without calling in again: their connections to the gone manager's
    // node still close.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = info_field(&server, "clients", "connected_clients");
        if now == before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "connections of a freed manager still open on idle threads: {now} (before: {before})"
        );
        std::thread::sleep(ms(50));
    }
    gate.wait();
    for h in handles {
        h.join().expect("a thread panicked");
    }
}
