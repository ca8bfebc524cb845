//! A blocking thread's own connections close once it has not called in for the idle limit
//! (`FERROLOCK_IDLE_CONNECTION_MS`, shortened here), although the thread lives on and its
//! manager is still open. Real servers.

mod common;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::*;
use ferrolock::runtime::block_on;
use ferrolock_testbed::RedisServer;

fn connected_clients(server: &RedisServer) -> u64 {
    let info: String = server.cmd(&["INFO", "clients"]);
    info.lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .map(|v| v.trim().parse().unwrap())
        .unwrap()
}

/// Polls until the server counts `want` clients; the deadline only bounds a failing run.
fn wait_for_clients(server: &RedisServer, want: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = connected_clients(server);
        if now == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {now} clients (want {want})"
        );
        std::thread::sleep(ms(50));
    }
}

#[test]
fn idle_blocking_threads_close_their_connections_after_the_idle_limit() {
    // SAFETY: set before anything in this test binary reads the environment or starts a thread.
    unsafe { std::env::set_var("FERROLOCK_IDLE_CONNECTION_MS", "300") };
    let server = RedisServer::start();
    let before = connected_clients(&server);
    let m = manager(&[server.url()], opts());
    let threads = 20;
    let gate = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let (m, gate) = (m.clone(), gate.clone());
            std::thread::spawn(move || {
                let lock = block_on(m.acquire(&format!("idle-conn:{i}"))).expect("acquire");
                assert!(block_on(lock.release()).expect("release"));
                gate.wait(); // every thread has called in
                gate.wait(); // idle until the test is done counting
            })
        })
        .collect();
    gate.wait();
    assert!(
        connected_clients(&server) >= before + threads as u64,
        "one connection per blocking thread"
    );
    // The threads live on, idle, and the manager stays open: their connections still close.
    wait_for_clients(&server, before, "idle threads");
    gate.wait();
    for h in handles {
        h.join().expect("a thread panicked");
    }
    // A thread that calls in again opens a new connection and works.
    let lock = std::thread::spawn(move || {
        let lock = block_on(m.acquire("idle-conn:again")).expect("acquire");
        assert!(block_on(lock.release()).expect("release"));
    });
    lock.join().unwrap();
}
