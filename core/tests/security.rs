//! `rediss://` with a CA file and ACL credentials from the URL, against a real TLS
//! redis-server; passwords never reach errors or `Debug` output.

mod common;

/// A TLS handshake in a debug build on a loaded machine can outlast the default 200 ms.
const TLS_NODE_TIMEOUT: Duration = Duration::from_secs(2);
/// Long enough for that node timeout (its loss margin, 2 × node timeout, under ttl/3).
const TLS_TTL: Duration = Duration::from_secs(30);

use std::time::Duration;

use common::*;
use ferrolock::{ErrorKind, LockManager, ManagerOptions, OptionValue as Value};
use ferrolock_testbed::{RedisServer, ServerOptions, TlsFiles};

const SECRET: &str = "s3cr3t-Pa55";

/// A user that may only touch lock keys and their channels, and run what the lock needs.
fn locker_acl() -> String {
    format!(
        "user locker on >{SECRET} ~lock:* ~ferrolock:* &ferrolock:release:* &redisson_lock__channel:* \
         -@all +set +get +del +exists +pexpire +pttl +type +eval +evalsha +script|load +publish +ping +hello +info +subscribe +unsubscribe"
    )
}

fn tls_acl_server() -> (RedisServer, TlsFiles) {
    let tls = TlsFiles::generate();
    let server = RedisServer::start_with(ServerOptions {
        tls: Some(tls.clone()),
        acl_users: vec![locker_acl()],
        ..Default::default()
    });
    (server, tls)
}

fn locker_url(server: &RedisServer) -> String {
    format!("rediss://locker:{SECRET}@127.0.0.1:{}", server.port())
}

#[tokio::test]
async fn tls_with_a_ca_file_and_an_acl_user_restricted_to_lock_keys() {
    let (server, tls) = tls_acl_server();
    let m = LockManager::new(
        ManagerOptions::new()
            .nodes([locker_url(&server)])
            .tls_ca(&tls.ca_cert)
            .lock(
                opts()
                    .node_timeout(TLS_NODE_TIMEOUT)
                    .ttl(TLS_TTL)
                    .wait(Some(Duration::ZERO)),
            ),
    )
    .unwrap();
    let lock = m.acquire("lock:tls").await.unwrap();
    assert_eq!(get(&server, "lock:tls").as_deref(), Some(lock.token()));
    lock.extend().await.unwrap();
    assert!(lock.release().await.unwrap());
    assert_eq!(get(&server, "lock:tls"), None);

    // The ACL forbids this key: a Redis error naming the node, never the password.
    let err = m.acquire("other:tls").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Redis, "{err}");
    assert!(
        err.message().contains("NOPERM") || err.message().to_lowercase().contains("permission"),
        "{err}"
    );
    assert!(
        err.message()
            .contains(&format!("rediss://locker:***@127.0.0.1:{}", server.port())),
        "{err}"
    );
    assert!(!err.message().contains(SECRET), "password leaked: {err}");
    assert!(!format!("{err:?}").contains(SECRET));
    assert!(
        !format!("{m:?}").contains(SECRET),
        "password in Debug: {m:?}"
    );
    assert!(format!("{m:?}").contains("locker:***@"));
}

#[tokio::test]
async fn the_ca_file_can_come_from_the_environment() {
    let (server, tls) = tls_acl_server();
    // SAFETY: the only test in this binary that touches FERROLOCK_TLS_CA.
    unsafe { std::env::set_var("FERROLOCK_TLS_CA", &tls.ca_cert) };
    let m = LockManager::new(
        ManagerOptions::new()
            .nodes([locker_url(&server)])
            .lock(opts().node_timeout(TLS_NODE_TIMEOUT).ttl(TLS_TTL)),
    );
    unsafe { std::env::remove_var("FERROLOCK_TLS_CA") };
    let lock = m.unwrap().acquire("lock:env-ca").await.unwrap();
    assert!(lock.release().await.unwrap());
}

#[tokio::test]
async fn an_untrusted_certificate_is_an_unreachable_node_named_without_its_password() {
    let (server, _tls) = tls_acl_server();
    let other_ca = TlsFiles::generate();
    let m = LockManager::new(
        ManagerOptions::new()
            .nodes([locker_url(&server)])
            .tls_ca(&other_ca.ca_cert)
            .lock(
                opts()
                    .node_timeout(TLS_NODE_TIMEOUT)
                    .ttl(TLS_TTL)
                    .wait(Some(Duration::ZERO)),
            ),
    )
    .unwrap();
    let err = m.acquire("lock:x").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::QuorumUnreachable, "{err}");
    assert!(err.message().contains("locker:***@"), "{err}");
    assert!(!err.message().contains(SECRET), "{err}");
}

#[tokio::test]
async fn a_wrong_password_is_an_error_without_the_password() {
    let (server, tls) = tls_acl_server();
    let url = format!("rediss://locker:wrong-{SECRET}@127.0.0.1:{}", server.port());
    let m = LockManager::new(
        ManagerOptions::new()
            .nodes([url])
            .tls_ca(&tls.ca_cert)
            .lock(
                opts()
                    .node_timeout(TLS_NODE_TIMEOUT)
                    .ttl(TLS_TTL)
                    .wait(Some(Duration::ZERO)),
            ),
    )
    .unwrap();
    let err = m.acquire("lock:x").await.unwrap_err();
    assert!(!err.message().contains(SECRET), "{err}");
    assert!(err.message().contains("locker:***@"), "{err}");
}

/// A comma in a password, in a comma-separated node list (FERROLOCK_NODES, `--nodes`, C's and
/// Node's string form): the list was cut there, and the password's first half was quoted as a
/// malformed URL of its own. Now a URL starts only where a scheme does.
#[tokio::test]
async fn a_comma_in_a_password_in_a_node_list_is_neither_a_cut_nor_shown() {
    let server = RedisServer::start_with(ServerOptions {
        acl_users: vec!["user locker on >s3cr3t,PW ~* &* +@all".into()],
        ..Default::default()
    });
    let list =
        |pw: &str, port: u16| format!("redis://locker:{pw}@127.0.0.1:{port}, redis://127.0.0.1:1");
    let manager = |list: String| {
        let mut o = ManagerOptions::new().lock(opts().wait(Some(Duration::ZERO)));
        o.set("nodes", Value::Text(list.clone()), &list)?;
        LockManager::new(o)
    };
    // The right password: one node of two answers, as the list says (a quorum of 2 fails).
    let err = manager(list("s3cr3t,PW", server.port()))
        .unwrap()
        .acquire("lock:comma")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::QuorumUnreachable, "{err}");
    assert!(err.message().contains("1 of 2 nodes"), "{err}");
    assert!(
        !err.message().contains("s3cr3t") && !err.message().contains("PW"),
        "{err}"
    );
    let one = manager(format!(
        "redis://locker:s3cr3t,PW@127.0.0.1:{}",
        server.port()
    ))
    .unwrap();
    let lock = one.acquire("lock:comma").await.unwrap();
    assert!(lock.release().await.unwrap());
    // A wrong one, and one whose comma follows a port-like number: never shown in part.
    for pw in ["wr0ng,PW", "6379,s3cr3tPW", "wr0ng,,PW", "wr0ng, ,PW"] {
        let shown = match manager(list(pw, server.port())) {
            Err(e) => e.to_string(),
            Ok(m) => m.acquire("lock:comma").await.unwrap_err().to_string(),
        };
        assert!(
            !shown.contains("wr0ng") && !shown.contains("s3cr3t") && !shown.contains("PW"),
            "{shown}"
        );
    }
}

#[tokio::test]
async fn a_missing_ca_file_is_an_invalid_argument_naming_it() {
    let err = LockManager::new(
        ManagerOptions::new()
            .nodes(["rediss://127.0.0.1:1"])
            .tls_ca("/nonexistent/ca.pem"),
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().contains("/nonexistent/ca.pem"), "{err}");
    // Given here, so not said to come from the environment.
    assert!(!err.message().contains("FERROLOCK_TLS_CA"), "{err}");
    // Read only for TLS nodes: plain ones never need it.
    LockManager::new(
        ManagerOptions::new()
            .nodes(["redis://127.0.0.1:1"])
            .tls_ca("/nonexistent/ca.pem"),
    )
    .expect("a CA file is not read for plain nodes");
    // TLS however the scheme is written: the CA file is for it.
    for url in [
        "REDISS://127.0.0.1:1",
        "rediss+cluster://127.0.0.1:1",
        "valkeys://127.0.0.1:1",
    ] {
        let err = LockManager::new(
            ManagerOptions::new()
                .nodes([url])
                .tls_ca("/nonexistent/ca.pem"),
        )
        .unwrap_err();
        assert!(
            err.message().contains("cannot read tls_ca file"),
            "{url}: {err}"
        );
    }
    // Read and checked once, at build: a file with no certificate is named as the CA's fault,
    // not as every TLS node's at its first connection.
    let junk = std::env::temp_dir().join(format!("ferrolock-junk-ca-{}.pem", std::process::id()));
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let err = LockManager::new(
        ManagerOptions::new()
            .nodes(["rediss://127.0.0.1:1"])
            .tls_ca(&junk),
    )
    .unwrap_err();
    std::fs::remove_file(&junk).unwrap();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().contains("holds no certificate"), "{err}");
}

/// A node URL given where the CA file goes (the two options swapped, or a list pasted into
/// the wrong field) is named without its password, as everywhere else a URL is shown.
#[tokio::test]
async fn a_node_url_given_as_the_ca_file_is_refused_without_its_password() {
    let err = LockManager::new(
        ManagerOptions::new()
            .nodes(["rediss://127.0.0.1:1"])
            .tls_ca("rediss://:s3cr3t-pw@127.0.0.1:6380"),
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().contains("cannot read tls_ca file"), "{err}");
    assert!(!err.message().contains("s3cr3t-pw"), "{err}");
    assert!(err.message().contains("127.0.0.1:6380"), "{err}");
}

#[test]
fn a_bad_node_list_from_the_environment_names_the_variable() {
    // SAFETY: the only test in this binary that touches FERROLOCK_NODES.
    unsafe { std::env::set_var("FERROLOCK_NODES", "http://127.0.0.1:6379") };
    let err = LockManager::new(ManagerOptions::new()).unwrap_err();
    unsafe { std::env::remove_var("FERROLOCK_NODES") };
    assert_eq!(err.kind(), ferrolock::ErrorKind::InvalidArgument, "{err}");
    assert!(
        err.message().contains("FERROLOCK_NODES")
            && err.message().contains("http://127.0.0.1:6379"),
        "{err}"
    );
}

#[tokio::test]
async fn a_server_that_is_not_redis_is_named_as_such() {
    // A plain TCP server answering HTTP junk to whatever it is sent.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                use std::io::{Read, Write};
                let mut buf = [0u8; 1024];
                while let Ok(n) = conn.read(&mut buf) {
                    if n == 0
                        || conn
                            .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                            .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    let url = format!("redis://{addr}");
    let m = LockManager::new(
        ManagerOptions::new()
            .nodes([url.clone()])
            .lock(opts().wait(Some(Duration::ZERO))),
    )
    .unwrap();
    let err = m.acquire("not-redis").await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("not a Redis server") && text.contains(&addr.to_string()),
        "{err}"
    );
}

/// What a semaphore user needs besides its names' patterns (docs/semaphore.md states it word
/// for word): Redisson's channel, the waiter queue's keys, and the scripts' commands.
const SEMAPHORE_USER_RULES: &str = "~ferrolock:* &redisson_sc:* -@all +get +set +exists \
     +type +pexpire +pttl +info +evalsha +script|load +publish +subscribe +unsubscribe +incrby \
     +decrby +zadd +zrem +zrange +zrangebyscore +zremrangebyscore +zrank +zscore +zcard +time";

/// The same for a read-write lock user (docs/read-write-lock.md).
const RWLOCK_USER_RULES: &str = "~ferrolock:* &redisson_rwlock:* -@all +get +set +del +exists \
     +type +pexpire +pttl +info +evalsha +script|load +publish +subscribe +unsubscribe +hget \
     +hset +hdel +hincrby +hexists +hkeys +hlen +sadd +srem +smembers +incr +zadd +zrem \
     +zrange +zrangebyscore +zremrangebyscore +zrank +zscore +time";

/// `text` holds `rules`, whatever the line breaks.
fn states(doc: &str, rules: &str) -> bool {
    let path = format!("{}/../docs/{doc}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .contains(rules)
}

fn user_manager(server: &RedisServer, user: &str) -> LockManager {
    LockManager::new(
        ManagerOptions::new()
            .nodes([format!(
                "redis://{user}:{SECRET}@127.0.0.1:{}",
                server.port()
            )])
            .restart_guard(Duration::ZERO)
            .lock(
                opts()
                    .ttl(Duration::from_secs(60))
                    .retry_delay(Duration::from_secs(30))
                    .wait(Some(Duration::from_secs(60))),
            ),
    )
    .unwrap()
}

/// A user with only the documented ACL for semaphores or read-write locks takes, extends and
/// releases them, and its waiter is woken by the release (its own re-check is 15 s away or
/// more); a name outside its patterns is refused, so the ACL is in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_and_read_write_lock_users_with_the_documented_acl() {
    assert!(
        states("semaphore.md", SEMAPHORE_USER_RULES),
        "docs/semaphore.md's ACL differs"
    );
    assert!(
        states("read-write-lock.md", RWLOCK_USER_RULES),
        "docs/read-write-lock.md's ACL differs"
    );
    let server = RedisServer::start_with(ServerOptions {
        acl_users: vec![
            format!("user sem on >{SECRET} ~jobs:* ~{{jobs:*}}* {SEMAPHORE_USER_RULES}"),
            format!("user rw on >{SECRET} ~catalog:* ~{{catalog:*}}* {RWLOCK_USER_RULES}"),
        ],
        ..Default::default()
    });
    let lease = opts().ttl(Duration::from_secs(60));
    let woken_within = Duration::from_secs(10);

    let sem = std::sync::Arc::new(user_manager(&server, "sem"));
    let held = sem.semaphore_with("jobs:enc", 1, 1, &lease).await.unwrap();
    let m = sem.clone();
    let waiter = tokio::spawn(async move {
        let o = opts()
            .ttl(Duration::from_secs(60))
            .retry_delay(Duration::from_secs(30));
        m.semaphore_with("jobs:enc", 1, 1, &o.wait(Some(Duration::from_secs(60))))
            .await
    });
    await_one_queued(&server, "jobs:enc").await;
    held.extend().await.unwrap();
    assert!(held.release().await.unwrap());
    let next = tokio::time::timeout(woken_within, waiter)
        .await
        .expect("the semaphore waiter was not woken")
        .unwrap()
        .unwrap();
    assert!(next.release().await.unwrap());
    let err = sem.semaphore("other", 1).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Redis, "{err}");
    assert!(err.message().to_lowercase().contains("noperm"), "{err}");

    // A read lease is capped at 30 s (Redisson's read renewal).
    let read_lease = opts().ttl(Duration::from_secs(30));
    let rw = std::sync::Arc::new(user_manager(&server, "rw"));
    let other_reader = user_manager(&server, "rw");
    let r1 = rw.read_lock_with("catalog:x", &read_lease).await.unwrap();
    let r2 = other_reader
        .read_lock_with("catalog:x", &read_lease)
        .await
        .unwrap();
    let m = rw.clone();
    let writer = tokio::spawn(async move {
        let o = opts()
            .ttl(Duration::from_secs(60))
            .retry_delay(Duration::from_secs(30));
        m.write_lock_with("catalog:x", &o.wait(Some(Duration::from_secs(60))))
            .await
    });
    await_one_queued(&server, "catalog:x").await;
    r1.extend().await.unwrap();
    assert!(r1.release().await.unwrap());
    assert!(r2.release().await.unwrap());
    let w = tokio::time::timeout(woken_within, writer)
        .await
        .expect("the writer was not woken")
        .unwrap()
        .unwrap();
    w.extend().await.unwrap();
    assert!(w.release().await.unwrap());
    let err = rw.read_lock_with("other", &read_lease).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Redis, "{err}");
    assert!(err.message().to_lowercase().contains("noperm"), "{err}");
}

/// What a lock user needs besides its keys' patterns: docs/reentrancy-and-waiters.md's list
/// ("Redis permissions") and DESIGN.md's, for plain, reentrant and fenced locks and their
/// waiters.
const LOCK_USER_RULES: &str = "~ferrolock:* &ferrolock:release:* &redisson_lock__channel:* -@all \
     +get +set +del +exists +type +pexpire +pttl +info +eval +evalsha +script|load +publish \
     +subscribe +unsubscribe +hexists +hincrby +sadd +srem +smembers +zadd +zrem +zrange +zrangebyscore \
     +zremrangebyscore +zscore +time +incr";

/// The ids of the connections subscribed to a channel.
fn subscribers(server: &RedisServer) -> Vec<String> {
    let list: String = server.cmd(&["CLIENT", "LIST"]);
    list.lines()
        .filter(|l| {
            l.split_whitespace()
                .any(|f| f.starts_with("sub=") && f != "sub=0")
        })
        .filter_map(|l| l.split_whitespace().find_map(|f| f.strip_prefix("id=")))
        .map(str::to_string)
        .collect()
}

/// PINGs the server got, refused by the ACL or not.
fn pings(server: &RedisServer) -> u64 {
    let info: String = server.cmd(&["INFO", "commandstats"]);
    let Some(stats) = info.lines().find_map(|l| l.strip_prefix("cmdstat_ping:")) else {
        return 0;
    };
    stats
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| *k == "calls" || *k == "rejected_calls")
        .map(|(_, v)| v.parse::<u64>().unwrap())
        .sum()
}

/// A waiter of a user with only the documented ACL (no `ping`) keeps its pub/sub connection
/// while it waits, and is woken by the release: the ping that checks a quiet link every second
/// is refused (NOPERM), and that reply is an answer, so the link counts as alive (taken for a
/// dead link, it would be dropped and opened again after every second of quiet).
#[tokio::test]
async fn a_waiter_with_the_documented_lock_acl_keeps_its_pubsub_connection() {
    let server = RedisServer::start_with(ServerOptions {
        acl_users: vec![format!(
            "user locker on >{SECRET} ~wait:* {LOCK_USER_RULES}"
        )],
        ..Default::default()
    });
    let holder = user_manager(&server, "locker");
    let held = holder.acquire("wait:k").await.unwrap();
    let m = user_manager(&server, "locker");
    let waiter = tokio::spawn(async move { m.acquire("wait:k").await });
    await_one_queued(&server, "wait:k").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while subscribers(&server).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "nobody subscribed within 30 s"
        );
        tokio::time::sleep(ms(20)).await;
    }
    let subscribed = subscribers(&server);
    // Three pings after the subscription (one per second of quiet); a failure bound of 60 s.
    let first = pings(&server);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while pings(&server) < first + 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "fewer than 3 pings in 60 s"
        );
        tokio::time::sleep(ms(50)).await;
    }
    assert_eq!(
        subscribers(&server),
        subscribed,
        "the waiter's pub/sub connection was replaced"
    );
    assert!(held.release().await.unwrap());
    let next = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was not woken")
        .unwrap()
        .unwrap();
    assert!(next.release().await.unwrap());
}

/// docs/reentrancy-and-waiters.md's "Redis permissions" as ACL rules: every command it names in
/// code spans (`+name`) and its channel patterns, after `-@all`. The key patterns are the
/// caller's (the section says "on the lock names and `ferrolock:*` keys").
fn documented_lock_user_rules() -> String {
    let path = format!(
        "{}/../docs/reentrancy-and-waiters.md",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let section = text
        .split("## Redis permissions")
        .nth(1)
        .unwrap_or_else(|| panic!("{path} has no \"Redis permissions\" section"));
    let section = section.split("\n## ").next().unwrap();
    let mut rules = vec!["-@all".to_string()];
    for span in section.split('`').skip(1).step_by(2) {
        for word in span.split_whitespace() {
            if word.starts_with('&') {
                rules.push(word.to_string());
            } else if word.chars().all(|c| c.is_ascii_lowercase() || c == '|') {
                rules.push(format!("+{word}"));
            }
        }
    }
    rules.join(" ")
}

/// A user with only the documented ACL for locks takes plain, fenced and reentrant locks
/// (nested holds with different ttls, extended and released), and a reentrant waiter is woken
/// by the last release. Before, the list lacked the owner's set of live holds' commands
/// (`ferrolock:holds:{key}:<field>`: `sadd srem smembers`), and every reentrant acquire was
/// refused ("The user executing the script can't run this command").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_user_with_the_documented_acl_takes_reentrant_and_fenced_locks() {
    let rules = documented_lock_user_rules();
    let server = RedisServer::start_with(ServerOptions {
        acl_users: vec![format!(
            "user locker on >{SECRET} ~doc:* ~ferrolock:* {rules}"
        )],
        ..Default::default()
    });
    let m = std::sync::Arc::new(user_manager(&server, "locker"));
    let plain = m.acquire("doc:plain").await.unwrap();
    plain.extend().await.unwrap();
    assert!(plain.release().await.unwrap());
    let fenced = m.acquire_with("doc:fenced", &opts().fencing(true)).await;
    let fenced = fenced.unwrap();
    assert!(fenced.fence().is_some());
    assert!(fenced.release().await.unwrap());

    let reentrant = opts().reentrant(true).ttl(Duration::from_secs(60));
    let outer = m.acquire_owned("doc:r", 1, &reentrant).await;
    let outer = outer.unwrap_or_else(|e| panic!("{e} (rules: {rules})"));
    let inner = m
        .acquire_owned("doc:r", 1, &reentrant.clone().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    inner.extend().await.unwrap();
    let other = m.clone();
    let waiter = tokio::spawn(async move {
        let o = opts()
            .reentrant(true)
            .fencing(true)
            .ttl(Duration::from_secs(60))
            .retry_delay(Duration::from_secs(30));
        other.acquire_owned("doc:r", 2, &o).await
    });
    await_one_queued(&server, "doc:r").await;
    assert!(inner.release().await.unwrap());
    outer.extend().await.unwrap();
    assert!(outer.release().await.unwrap());
    let next = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the reentrant waiter was not woken")
        .unwrap()
        .unwrap();
    assert!(next.fence().is_some());
    assert!(next.release().await.unwrap());
    assert!(!server.cmd::<bool>(&["EXISTS", "doc:r"]));
}
