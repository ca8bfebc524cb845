//! A blocking thread's own connections close once it has not called in for the idle limit
//! (`FERROLOCK_IDLE_CONNECTION_MS`, shortened here), although the thread lives on and its
//! manager is still open. Real servers.

mod common;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::*;
use ferrolock::runtime::block_on;
use ferrolock_testbed::{ClusterOptions, Proxy, RedisCluster, RedisServer};

/// The idle limit of this test binary, set once before either test starts the reaper.
fn short_idle_limit() {
    static SET: std::sync::Once = std::sync::Once::new();
    // SAFETY: set before anything in this test binary reads the environment.
    SET.call_once(|| unsafe { std::env::set_var("FERROLOCK_IDLE_CONNECTION_MS", "300") });
}

fn connected_clients(server: &RedisServer) -> u64 {
    let info: String = server.cmd(&["INFO", "clients"]);
    info.lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .map(|v| v.trim().parse().unwrap())
        .unwrap()
}

/// The connections of the library (not the test bed's own user) on `server`: id, last command.
fn library_clients(server: &RedisServer) -> Vec<(u64, String)> {
    let list: String = server.cmd(&["CLIENT", "LIST"]);
    list.lines()
        .filter(|l| l.contains(" user=default "))
        .map(|l| {
            let field = |name: &str| {
                l.split(' ')
                    .find_map(|f| f.strip_prefix(name))
                    .unwrap_or_default()
                    .to_string()
            };
            (field("id=").parse().unwrap(), field("cmd="))
        })
        .collect()
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
    short_idle_limit();
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

/// A blocking thread's cluster connect that outlived its request (a seed slower than the node
/// timeout) and finished later on the thread's runtime, while the thread was in another call:
/// once the reaper took that runtime (the thread idle), the connection was dead (its tasks
/// ended with the runtime), and the thread's next request of the manager was handed it and
/// failed, although the cluster answered at once.
#[test]
fn a_cluster_connect_finished_before_the_threads_runtime_was_reaped_is_not_used_after() {
    short_idle_limit();
    let _serial = serial();
    let cluster = RedisCluster::start_with(ClusterOptions {
        primaries: 1,
        ..ClusterOptions::default()
    });
    let node = &cluster.nodes[0];
    let seed = Proxy::start(node.port());
    // A connect needs two round trips to the seed: longer than the first try's node timeout.
    seed.set_delay(ms(300));
    let m = manager(
        &[format!("redis+cluster://127.0.0.1:{}", seed.port())],
        // Each connection, handshake included, may take half of it: the seed's is never
        // given up.
        opts()
            .ttl(Duration::from_secs(60))
            .node_timeout(Duration::from_secs(10)),
    );
    let before = connected_clients(node);
    let short = opts().node_timeout(ms(500)).wait(Some(Duration::ZERO));
    let e = block_on(m.acquire_with("reaped", &short)).expect_err("connected within 500 ms");
    // The connect's own timeout, or the request's deadline if that fires first (a loaded
    // host): either way no reply came in time.
    assert!(
        e.to_string().contains("timed out") || e.to_string().contains("no reply within"),
        "{e}"
    );
    // The thread is in another call while the connect goes on and finishes: the seed's
    // connection (the proxy's, through which the slot map was read) goes, and the primary's
    // own is open.
    block_on(async {
        let deadline = Instant::now() + Duration::from_secs(60);
        let seed_conn = loop {
            let seed_conn = library_clients(node)
                .into_iter()
                .find(|(_, cmd)| cmd == "ping" || cmd == "cluster|slots");
            if let Some((id, _)) = seed_conn {
                break id;
            }
            assert!(Instant::now() < deadline, "no connection through the seed");
            tokio::time::sleep(ms(20)).await;
        };
        loop {
            let clients = library_clients(node);
            if clients.iter().all(|(id, _)| *id != seed_conn)
                && clients.iter().any(|(id, _)| *id > seed_conn)
            {
                break;
            }
            assert!(Instant::now() < deadline, "the connect never finished");
            tokio::time::sleep(ms(20)).await;
        }
    });
    // Idle: the reaper takes the thread's runtime, and the connections go with it.
    wait_for_clients(node, before, "the idle thread's finished connect");
    seed.set_delay(Duration::ZERO);
    let patient = opts()
        .ttl(Duration::from_secs(60))
        .node_timeout(Duration::from_secs(5))
        .wait(Some(Duration::ZERO));
    let lock = block_on(m.acquire_with("reaped", &patient))
        .unwrap_or_else(|e| panic!("the next try used the reaped runtime's connection: {e}"));
    assert_eq!(
        node.cmd::<Option<String>>(&["GET", "reaped"]).as_deref(),
        Some(lock.token())
    );
    assert!(block_on(lock.release()).unwrap());
}
