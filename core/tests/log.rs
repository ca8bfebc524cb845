//! `host::log`: the core's events reach a binding's sink at its level, a replaced sink is
//! never called again, a loss is logged before the holder hears of it, and a warning repeated
//! for every release while a node is down is throttled. One test: the
//! sink is per process, and this file is a process of its own.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use ferrolock::host::log::{self, LogLevel, LogRecord};
use ferrolock_testbed::RedisServer;

type Seen = Arc<Mutex<Vec<(LogLevel, String, String)>>>;

fn sink(seen: &Seen) -> log::LogSink {
    let seen = seen.clone();
    Box::new(move |r: &LogRecord<'_>| {
        seen.lock()
            .unwrap()
            .push((r.level, r.target.to_string(), r.message.to_string()));
    })
}

/// Takes `key`, deletes it behind the holder's back, and returns once the holder knows.
async fn lose(m: &ferrolock::LockManager, server: &RedisServer, key: &str) {
    let lock = m.acquire(key).await.unwrap();
    let _: i64 = server.cmd(&["DEL", key]);
    let reason = tokio::time::timeout(Duration::from_secs(60), lock.lost())
        .await
        .expect("the watchdog noticed the deleted key");
    assert!(reason.is_some(), "lost, not released");
}

fn mentioning(seen: &Seen, key: &str) -> Vec<(LogLevel, String, String)> {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|(_, _, m)| m.contains(key))
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_loss_is_logged_at_its_level_to_the_current_sink_only() {
    let server = RedisServer::start();
    let m = manager(
        &[server.url()],
        opts().watchdog(true).ttl(Duration::from_millis(1500)),
    );

    // At warn: the loss is a warning naming the key, from a ferrolock module, delivered
    // before `lost()` resolved (the sink runs where the core logs, before it signals).
    let warn: Seen = Arc::default();
    log::set_sink(Some(sink(&warn)), LogLevel::Warn).unwrap();
    let key = unique_key("log-warn");
    lose(&m, &server, &key).await;
    let got = mentioning(&warn, &key);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, LogLevel::Warn);
    assert!(got[0].1.starts_with("ferrolock"), "{got:?}");

    // At error: the same kind of event is filtered out.
    let errors: Seen = Arc::default();
    log::set_sink(Some(sink(&errors)), LogLevel::Error).unwrap();
    let key = unique_key("log-error");
    lose(&m, &server, &key).await;
    assert!(
        mentioning(&errors, &key).is_empty(),
        "{:?}",
        errors.lock().unwrap()
    );

    // Replaced, then off: neither the replaced sink nor any other sees the next loss.
    log::set_sink(None, LogLevel::Warn).unwrap();
    let key = unique_key("log-off");
    lose(&m, &server, &key).await;
    assert!(mentioning(&warn, &key).is_empty());
    assert!(mentioning(&errors, &key).is_empty());

    // Debug shows more (a release that found the key gone); the level can change in place.
    log::set_sink(Some(sink(&warn)), LogLevel::Warn).unwrap();
    log::set_level(LogLevel::Debug);
    let plain = manager(&[server.url()], opts());
    let key = unique_key("log-debug");
    let lock = plain.acquire(&key).await.unwrap();
    let _: i64 = server.cmd(&["DEL", &key]);
    assert!(!lock.release().await.unwrap(), "the key was gone");
    let got = mentioning(&warn, &key);
    assert!(
        got.iter()
            .any(|(l, _, msg)| *l == LogLevel::Debug && msg.contains("no longer ours")),
        "{got:?}"
    );

    // A node of three paused: every release finishes in the background, but says so at most
    // once per 10 s per manager, and the next one says how many it left out.
    let warn: Seen = Arc::default();
    log::set_sink(Some(sink(&warn)), LogLevel::Warn).unwrap();
    let servers = [RedisServer::start(), RedisServer::start()];
    let urls = [server.url(), servers[0].url(), servers[1].url()];
    let three = manager(&urls, opts());
    servers[1].pause();
    let key = unique_key("log-throttled");
    let started = std::time::Instant::now();
    for _ in 0..20 {
        let lock = three.acquire(&key).await.unwrap();
        assert!(lock.release().await.unwrap());
    }
    let background = || {
        mentioning(&warn, &key)
            .into_iter()
            .filter(|(_, _, msg)| msg.contains("finished in the background"))
            .count()
    };
    // The fault happened: the first release's background part timed out on the paused node.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while background() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no release was logged"
        );
        tokio::time::sleep(ms(50)).await;
    }
    tokio::time::sleep(ms(1000)).await;
    // However slow this machine: at most one per 10 s begun while the releases ran.
    let most = 1 + started.elapsed().as_secs() / 10;
    assert!(
        background() as u64 <= most,
        "{} warnings in {:?}: {:?}",
        background(),
        started.elapsed(),
        mentioning(&warn, &key)
    );
    servers[1].resume();
    // Ten seconds later, the next one counts the ones left out.
    tokio::time::sleep(Duration::from_secs(10)).await;
    servers[1].pause();
    let lock = three.acquire(&key).await.unwrap();
    assert!(lock.release().await.unwrap());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !mentioning(&warn, &key)
        .iter()
        .any(|(_, _, msg)| msg.contains("more like it since the last one logged"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            mentioning(&warn, &key)
        );
        tokio::time::sleep(ms(50)).await;
    }
    servers[1].resume();
    log::set_sink(None, LogLevel::Warn).unwrap();
}
