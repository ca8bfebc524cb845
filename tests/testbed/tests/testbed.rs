//! The test bed's own tests, against real redis-server processes.

use std::collections::BTreeSet;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use ferrolock_testbed::{Cluster, Direction, Proxy, RedisServer, ServerOptions, TlsFiles};

/// Tests that pause or kill servers or measure time run one at a time (DESIGN.md, Tests), so that
/// parallel starts on a 2-core machine cannot stretch their timings.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn connect(url: &str, timeout: Duration) -> redis::RedisResult<redis::Connection> {
    let con = redis::Client::open(url)?.get_connection_with_timeout(timeout)?;
    con.set_read_timeout(Some(timeout))?;
    Ok(con)
}

fn ping(con: &mut redis::Connection) -> redis::RedisResult<String> {
    redis::cmd("PING").query(con)
}

#[test]
fn start_answers_ping_and_drop_reaps_the_process() {
    let server = RedisServer::start();
    let (pid, dir) = (server.pid(), server.dir().to_path_buf());
    assert!(server.is_running());
    assert_eq!(server.url(), format!("redis://127.0.0.1:{}", server.port()));
    assert_eq!(server.cmd::<String>(&["PING"]), "PONG");
    let info: String = server.cmd(&["INFO", "server"]);
    assert!(info.contains(&format!("process_id:{pid}")), "{info}");
    // The dump must never land in the working directory (BUILD-NOTES, Test bed pitfalls).
    let save: Vec<String> = server.cmd(&["CONFIG", "GET", "save"]);
    assert_eq!(save, ["save", ""]);
    let server_dir: Vec<String> = server.cmd(&["CONFIG", "GET", "dir"]);
    assert_eq!(
        std::fs::canonicalize(&server_dir[1]).unwrap(),
        std::fs::canonicalize(&dir).unwrap()
    );
    drop(server);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "pid {pid} survived drop"
    );
    assert!(!dir.exists(), "temp dir {} survived drop", dir.display());
}

#[test]
fn kill_leaves_the_port_refusing_connections() {
    let _serial = serial();
    let mut server = RedisServer::start();
    server.kill();
    assert!(!server.is_running());
    let err = TcpStream::connect(("127.0.0.1", server.port())).expect_err("port still accepts");
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
    let err = connect(&server.url(), Duration::from_secs(2))
        .err()
        .expect("redis client still connects");
    assert!(err.is_connection_refusal(), "{err}");
}

#[test]
fn pause_makes_ping_time_out_and_resume_answers_again() {
    let _serial = serial();
    let server = RedisServer::start();
    let mut con = connect(&server.url(), Duration::from_millis(300)).unwrap();
    server.pause();
    assert!(server.is_running(), "a paused server still exists");
    let err = ping(&mut con).expect_err("paused server answered");
    assert!(err.is_timeout(), "{err}");
    server.resume();
    let mut con = connect(&server.url(), Duration::from_secs(5)).unwrap();
    assert_eq!(ping(&mut con).unwrap(), "PONG");
}

#[test]
fn restart_without_persistence_loses_keys() {
    let _serial = serial();
    let mut server = RedisServer::start();
    let (port, pid) = (server.port(), server.pid());
    let _: () = server.cmd(&["SET", "lock:a", "token"]);
    // A SAVE writes dump.rdb into the server's dir: only its absence from the start arguments may
    // keep the key from coming back.
    let _: () = server.cmd(&["SAVE"]);
    server.restart();
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), pid);
    assert_eq!(server.cmd::<Option<String>>(&["GET", "lock:a"]), None);
    // restart also works from the killed state.
    server.kill();
    server.restart();
    assert_eq!(server.cmd::<String>(&["PING"]), "PONG");
}

#[test]
fn restart_with_persistence_keeps_saved_keys() {
    let _serial = serial();
    let mut server = RedisServer::start_with(ServerOptions {
        persistence: true,
        ..Default::default()
    });
    let _: () = server.cmd(&["SET", "lock:a", "token"]);
    let _: () = server.cmd(&["SAVE"]);
    assert!(server.dir().join("dump.rdb").exists());
    server.restart();
    assert_eq!(
        server.cmd::<Option<String>>(&["GET", "lock:a"]).as_deref(),
        Some("token")
    );
}

#[test]
fn restart_waits_for_its_port_to_be_free_again() {
    let _serial = serial();
    let mut server = RedisServer::start();
    let port = server.port();
    server.kill();
    // Another redis on the port answers PING too: restart must tell it apart from its own server.
    let scratch = tempfile::tempdir().unwrap();
    let mut squatter = std::process::Command::new(ferrolock_testbed::redis_server_path())
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(scratch.path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let squatter_pid = squatter.id();
    let url = format!("redis://127.0.0.1:{port}");
    while connect(&url, Duration::from_secs(1))
        .and_then(|mut c| ping(&mut c))
        .is_err()
    {
        thread::sleep(Duration::from_millis(20));
    }
    let release = thread::spawn(move || {
        thread::sleep(Duration::from_millis(500));
        squatter.kill().unwrap();
        squatter.wait().unwrap();
    });
    server.restart();
    release.join().unwrap();
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), squatter_pid);
    let info: String = server.cmd(&["INFO", "server"]);
    assert!(
        info.contains(&format!("process_id:{}", server.pid())),
        "{info}"
    );
    assert!(
        server.log().contains("Address already in use"),
        "the squatter was never hit"
    );
}

#[test]
fn parallel_starts_get_distinct_working_servers() {
    let servers: Vec<RedisServer> = (0..6)
        .map(|_| thread::spawn(RedisServer::start))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    let ports: BTreeSet<u16> = servers.iter().map(RedisServer::port).collect();
    assert_eq!(ports.len(), servers.len());
    for server in &servers {
        let _: () = server.cmd(&["SET", "owner", &server.port().to_string()]);
    }
    for server in &servers {
        assert_eq!(
            server.cmd::<String>(&["GET", "owner"]),
            server.port().to_string()
        );
    }
}

#[test]
fn cluster_lists_every_node() {
    let cluster = Cluster::start(3);
    let urls = cluster.urls();
    assert_eq!(urls.len(), 3);
    assert_eq!(cluster.nodes_env(), urls.join(","));
    assert_eq!(urls.iter().collect::<BTreeSet<_>>().len(), 3);
    for url in &urls {
        assert_eq!(
            ping(&mut connect(url, Duration::from_secs(5)).unwrap()).unwrap(),
            "PONG"
        );
    }
}

#[test]
fn acl_user_is_confined_to_lock_keys() {
    let server = RedisServer::start_with(ServerOptions {
        acl_users: vec![
            "user locker on >pw ~lock:* &* +@all".into(),
            // Even with `default` locked out, the test bed's own assertions must still work.
            "user default off".into(),
        ],
        ..Default::default()
    });
    let url = format!("redis://locker:pw@127.0.0.1:{}", server.port());
    let mut con = connect(&url, Duration::from_secs(5)).unwrap();
    let () = redis::cmd("SET")
        .arg("lock:x")
        .arg("1")
        .query(&mut con)
        .unwrap();
    let err = redis::cmd("SET")
        .arg("other:x")
        .arg("1")
        .query::<()>(&mut con)
        .expect_err("other:x allowed");
    assert_eq!(err.code(), Some("NOPERM"), "{err}");
    let err = connect(&server.url(), Duration::from_secs(5))
        .and_then(|mut c| ping(&mut c))
        .expect_err("default on");
    assert!(
        err.to_string().contains("NOAUTH") || err.to_string().contains("WRONGPASS"),
        "{err}"
    );
    let _: () = server.cmd(&["SET", "other:x", "1"]);
    assert_eq!(server.cmd::<String>(&["GET", "lock:x"]), "1");
}

#[tokio::test(flavor = "current_thread")]
async fn tls_server_accepts_a_client_that_trusts_the_ca() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tls = TlsFiles::generate();
    let server = RedisServer::start_with(ServerOptions {
        tls: Some(tls.clone()),
        ..Default::default()
    });
    assert_eq!(
        server.url(),
        format!("rediss://127.0.0.1:{}", server.port())
    );
    let certs = |root_cert| redis::TlsCertificates {
        client_tls: None,
        root_cert,
    };
    let ca = std::fs::read(&tls.ca_cert).unwrap();
    let client = redis::Client::build_with_tls(server.url(), certs(Some(ca))).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let () = redis::cmd("SET")
        .arg("lock:tls")
        .arg("1")
        .query_async(&mut con)
        .await
        .unwrap();
    // The assertion client reaches the same data over the plain port.
    assert_eq!(server.cmd::<String>(&["GET", "lock:tls"]), "1");

    // Without our CA the certificate must not verify, or the test proves nothing about it.
    let untrusting = redis::Client::build_with_tls(server.url(), certs(None)).unwrap();
    assert!(
        untrusting.get_multiplexed_async_connection().await.is_err(),
        "unknown CA trusted"
    );
    // Plain RESP on the TLS port gets no answer.
    let plain = format!("redis://127.0.0.1:{}", server.port());
    assert!(
        connect(&plain, Duration::from_secs(1))
            .and_then(|mut c| ping(&mut c))
            .is_err()
    );
}

#[test]
fn proxy_forwards_delays_blackholes_cuts_and_heals() {
    let _serial = serial();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    assert_eq!(proxy.url(), format!("redis://127.0.0.1:{}", proxy.port()));
    let mut con = connect(&proxy.url(), Duration::from_secs(5)).unwrap();
    assert_eq!(ping(&mut con).unwrap(), "PONG");

    // Each direction is delayed, so a round trip takes at least twice the delay.
    proxy.set_delay(Duration::from_millis(200));
    let started = Instant::now();
    assert_eq!(ping(&mut con).unwrap(), "PONG");
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "round trip took {:?}",
        started.elapsed()
    );
    proxy.heal();

    proxy.blackhole();
    con.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    assert!(
        ping(&mut con)
            .expect_err("blackholed PING answered")
            .is_timeout()
    );
    // New links are accepted (the TCP handshake completes) but stay silent too.
    let mut fresh = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    fresh
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    fresh.write_all(b"PING\r\n").unwrap();
    let err = fresh
        .read(&mut [0u8; 16])
        .expect_err("blackholed link answered");
    assert!(
        matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "{err}"
    );
    proxy.heal();
    assert_eq!(
        ping(&mut connect(&proxy.url(), Duration::from_secs(5)).unwrap()).unwrap(),
        "PONG"
    );

    let mut con = connect(&proxy.url(), Duration::from_secs(5)).unwrap();
    assert_eq!(ping(&mut con).unwrap(), "PONG");
    proxy.cut();
    // Unlike a blackhole, a cut link fails at once with a closed connection, not a timeout.
    let err = ping(&mut con).expect_err("cut link answered");
    assert!(!err.is_timeout(), "{err}");
    let mut raw = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    match raw.read(&mut [0u8; 16]) {
        Ok(0) => {}
        Err(e) if e.kind() != ErrorKind::WouldBlock && e.kind() != ErrorKind::TimedOut => {}
        other => panic!("a new link through a cut proxy stayed open: {other:?}"),
    }
    proxy.heal();
    assert_eq!(
        ping(&mut connect(&proxy.url(), Duration::from_secs(5)).unwrap()).unwrap(),
        "PONG"
    );
}

#[test]
fn proxy_delays_one_direction_and_holds_replies_until_released() {
    let _serial = serial();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let mut con = connect(&proxy.url(), Duration::from_secs(10)).unwrap();
    assert_eq!(ping(&mut con).unwrap(), "PONG");

    proxy.set_delay_dir(Direction::Up, Duration::from_millis(300));
    let started = Instant::now();
    assert_eq!(ping(&mut con).unwrap(), "PONG");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "round trip took {:?}",
        started.elapsed()
    );
    proxy.set_delay_dir(Direction::Up, Duration::ZERO);

    // A held reply: the request is applied on the server, the client hears nothing until release.
    proxy.hold(Direction::Down);
    con.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let err = redis::cmd("SET")
        .arg("held")
        .arg("1")
        .query::<String>(&mut con)
        .expect_err("a held reply arrived");
    assert!(err.is_timeout(), "{err}");
    assert_eq!(server.cmd::<String>(&["GET", "held"]), "1");
    let mut raw = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    raw.write_all(b"PING\r\n").unwrap();
    proxy.release(Direction::Down);
    // The held bytes come through in order and intact once released.
    let mut buf = [0u8; 7];
    raw.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"+PONG\r\n");
}

#[test]
fn a_cluster_forms_routes_keys_to_their_primaries_and_loses_a_killed_one() {
    use ferrolock_testbed::{RedisCluster, key_slot};
    let mut cluster = RedisCluster::start();
    assert!(cluster.url().starts_with("redis+cluster://127.0.0.1:"));
    // "a" (slot 15495) and "b" (slot 3300) live on different primaries.
    let (pa, pb) = (
        cluster.primary_for_key("a").port(),
        cluster.primary_for_key("b").port(),
    );
    assert_ne!(pa, pb);
    assert_eq!(key_slot("{b}x"), key_slot("b"));
    let owner = cluster.primary_for_key("a");
    let _: () = owner.cmd(&["SET", "a", "1"]);
    let slot: i64 = owner.cmd(&["CLUSTER", "KEYSLOT", "a"]);
    assert_eq!(slot, key_slot("a") as i64);
    let i = cluster.index_of_port(pa);
    cluster.nodes[i].kill();
    assert!(!cluster.nodes[i].is_running());
}
