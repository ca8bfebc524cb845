//! Redisson 4.7.0's `RPermitExpirableSemaphore` as it is on a real redis-server: the layout
//! ferrolock's semaphore scripts must share (issue 33), read from the keys a real Java client
//! leaves and the messages it publishes. `common/redisson.rs` runs the Java client.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::redisson::{Redisson, redisson_classpath};
use ferrolock_testbed::RedisServer;

const REPLY: Duration = Duration::from_secs(30);

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn keys(server: &RedisServer) -> Vec<String> {
    let mut keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    keys.sort();
    keys
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The zset `{name}:timeout`: (permit id as hex of its raw bytes, its length, score).
fn timeouts(server: &RedisServer, name: &str) -> Vec<(String, usize, i64)> {
    let raw: Vec<(Vec<u8>, i64)> = server.cmd(&[
        "ZRANGE",
        &format!("{{{name}}}:timeout"),
        "0",
        "-1",
        "WITHSCORES",
    ]);
    raw.into_iter()
        .map(|(m, s)| (hex(&m), m.len(), s))
        .collect()
}

async fn ask(r: &mut Redisson, command: &str, reply: &str) -> String {
    r.send(command).await;
    let line = r.expect(reply, REPLY).await;
    line[reply.len()..].to_string()
}

/// trySetPermits sets the counter `name` once (Redisson keeps no other key for the pool size)
/// and publishes it; tryAcquire(count, lease) takes
/// `count` ids, each 16 raw bytes in `{name}:timeout` scored by the client's now + lease;
/// release publishes the number of permits it released on `redisson_sc:{name}`; an expired lease stays in
/// the zset and publishes nothing until the next acquire reclaims it, which publishes the
/// counter's new value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_permit_expirable_semaphore_layout_on_a_real_server() {
    let classpath = redisson_classpath();
    let server = RedisServer::start();
    let mut r = Redisson::start(classpath, &server.url(), "single").await;
    let name = "sem:a";
    let mut sub = server.client();
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe(format!("redisson_sc:{{{name}}}")).unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();

    // permits: stored once, as the counter itself.
    assert_eq!(
        ask(
            &mut r,
            &format!("ssetpermits {name} 3"),
            &format!("ssetpermits {name} ")
        )
        .await,
        "true"
    );
    let after_set = keys(&server);
    // trySetPermits publishes the pool size (a refused one publishes nothing: the next message
    // is the release's).
    let m = pubsub.get_message().expect("trySetPermits publishes");
    assert_eq!(
        String::from_utf8(m.get_payload_bytes().to_vec()).unwrap(),
        "3"
    );
    let counter: Option<String> = server.cmd(&["GET", name]);
    assert_eq!(
        ask(
            &mut r,
            &format!("ssetpermits {name} 5"),
            &format!("ssetpermits {name} ")
        )
        .await,
        "false"
    );
    assert_eq!(
        keys(&server),
        after_set,
        "a refused trySetPermits writes nothing"
    );
    eprintln!("after trySetPermits(3): keys {after_set:?}, counter {counter:?}");
    assert_eq!(counter.as_deref(), Some("3"));

    // Acquire 2 with a 60 s lease: ids are hex of 16 raw bytes, scored by the client's clock.
    let before = now_ms();
    let ids = ask(
        &mut r,
        &format!("sacquire {name} 2 60000"),
        &format!("sacquire {name} "),
    )
    .await;
    let after = now_ms();
    let ids: Vec<String> = ids.split(',').map(str::to_string).collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    let t = timeouts(&server, name);
    eprintln!(
        "after tryAcquire(2, 60 s): keys {:?}, zset {t:?}",
        keys(&server)
    );
    assert_eq!(t.len(), 2);
    for (id, len, score) in &t {
        assert_eq!(*len, 16, "permit ids are 16 raw bytes");
        assert!(ids.contains(id), "{id} not in {ids:?}");
        assert!(
            before + 60_000 <= *score && *score <= after + 60_000,
            "score {score}"
        );
    }
    assert_eq!(server.cmd::<String>(&["GET", name]), "1");
    assert_eq!(
        server.cmd::<i64>(&["PTTL", name]),
        -1,
        "the counter has no TTL"
    );

    // Release one: what is published is the number of permits released (1), not the counter's
    // new value (2), whatever the issue and REDISSON.md say.
    ask(
        &mut r,
        &format!("srelease {name} {}", ids[0]),
        &format!("sreleased {name}"),
    )
    .await;
    let m = pubsub.get_message().expect("a release publishes");
    assert_eq!(
        String::from_utf8(m.get_payload_bytes().to_vec()).unwrap(),
        "1"
    );
    assert_eq!(server.cmd::<String>(&["GET", name]), "2");
    assert_eq!(timeouts(&server, name).len(), 1);

    // A lease that ends publishes nothing and stays in the zset until the next acquire.
    let short = ask(
        &mut r,
        &format!("sacquire {name} 1 1"),
        &format!("sacquire {name} "),
    )
    .await;
    assert_eq!(server.cmd::<String>(&["GET", name]), "1");
    let expires = timeouts(&server, name)
        .into_iter()
        .find(|(id, _, _)| *id == short)
        .expect("the short lease's id")
        .2;
    while now_ms() <= expires + 1 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        server.cmd::<String>(&["GET", name]),
        "1",
        "no reclaim without a script"
    );
    assert_eq!(timeouts(&server, name).len(), 2);
    // The next acquire reclaims it first: 1 + 1 reclaimed = 2 available, both taken.
    let two = ask(
        &mut r,
        &format!("sacquire {name} 2 60000"),
        &format!("sacquire {name} "),
    )
    .await;
    assert_eq!(two.split(',').count(), 2, "{two}");
    assert_eq!(server.cmd::<String>(&["GET", name]), "0");
    let t = timeouts(&server, name);
    assert!(
        t.iter().all(|(id, _, _)| *id != short),
        "the expired id is gone: {t:?}"
    );
    assert_eq!(t.len(), 3);
    assert_eq!(
        ask(
            &mut r,
            &format!("sacquire {name} 1 60000"),
            &format!("sacquire {name} ")
        )
        .await,
        "none"
    );
    // The lease's end published nothing, but the reclaim did: the counter's new value (1 + 1
    // reclaimed = 2), before the acquire took both.
    let m = pubsub.get_message().expect("the reclaim publishes");
    assert_eq!(
        String::from_utf8(m.get_payload_bytes().to_vec()).unwrap(),
        "2"
    );
    // Then one of the two released: the number released (1), not the counter (also 1 here, so
    // the earlier release, 1 released with the counter at 2, is the one that tells them apart).
    let (first, _) = two.split_once(',').unwrap();
    ask(
        &mut r,
        &format!("srelease {name} {first}"),
        &format!("sreleased {name}"),
    )
    .await;
    let m = pubsub.get_message().expect("a release publishes");
    assert_eq!(
        String::from_utf8(m.get_payload_bytes().to_vec()).unwrap(),
        "1"
    );
    r.send("quit").await;
}

/// A name with a hash tag (`jobs{1}`), which Redisson's clients take: Redisson adds no braces
/// to it (`suffixName`), so its permit ids are in `jobs{1}:timeout`, in the counter's slot,
/// never in `{jobs{1}}:timeout`, where ferrolock's scripts would keep theirs. ferrolock
/// refuses the name before any request, and says where Redisson keeps the ids: it said
/// "Redisson's timeout zset `{name}:timeout` would not share the counter's Redis Cluster
/// slot", which is not Redisson's zset for this name, nor in another slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_with_a_hash_tag_is_refused_naming_redissons_own_zset() {
    let classpath = redisson_classpath();
    let server = RedisServer::start();
    let mut r = Redisson::start(classpath, &server.url(), "single").await;
    let name = "jobs{1}";
    ask(
        &mut r,
        &format!("ssetpermits {name} 3"),
        &format!("ssetpermits {name} "),
    )
    .await;
    let ids = ask(
        &mut r,
        &format!("sacquire {name} 1 60000"),
        &format!("sacquire {name} "),
    )
    .await;
    assert_ne!(ids, "none");
    assert_eq!(server.cmd::<i64>(&["ZCARD", "jobs{1}:timeout"]), 1);
    assert_eq!(server.cmd::<i64>(&["EXISTS", "{jobs{1}}:timeout"]), 0);
    let before = keys(&server);

    let m = common::manager(&[server.url()], common::opts());
    let e = m.semaphore(name, 3).await.unwrap_err();
    assert_eq!(e.kind(), ferrolock::ErrorKind::InvalidArgument, "{e}");
    assert!(
        e.message().contains("\"jobs{1}\"") && e.message().contains("`jobs{1}:timeout`"),
        "the refusal names the zset Redisson keeps: {e}"
    );
    assert!(
        !e.message()
            .contains("Redisson's timeout zset `{name}:timeout`"),
        "{e}"
    );
    assert_eq!(keys(&server), before, "the refusal wrote");
    r.send("quit").await;
}
