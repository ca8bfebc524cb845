#![allow(dead_code)]

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use ferrolock::{LockManager, LockOptions, ManagerOptions};
use ferrolock_testbed::RedisServer;

/// Tests that pause or kill servers or measure deadlines take this, so a loaded 2-core
/// machine runs them one at a time.
pub fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn manager(urls: &[String], opts: LockOptions) -> LockManager {
    // Test servers are freshly started: the restart guard is off except in its own tests.
    LockManager::new(
        ManagerOptions::new()
            .nodes(urls.iter().cloned())
            .restart_guard(Duration::ZERO)
            .lock(opts),
    )
    .expect("manager")
}

/// Defaults for tests: no watchdog unless the test is about it, generous node timeout.
pub fn opts() -> LockOptions {
    LockOptions::default().watchdog(false)
}

pub fn get(server: &RedisServer, key: &str) -> Option<String> {
    server.cmd(&["GET", key])
}

pub fn pttl(server: &RedisServer, key: &str) -> i64 {
    server.cmd(&["PTTL", key])
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn unique_key(name: &str) -> String {
    format!("test:{name}:{}", std::process::id())
}

/// `calls=` of one command in `INFO commandstats`.
pub fn calls(server: &RedisServer, command: &str) -> u64 {
    let info: String = server.cmd(&["INFO", "commandstats"]);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .map(|v| v.parse().unwrap())
        .unwrap_or(0)
}
