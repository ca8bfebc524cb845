//! A forked child (Python multiprocessing, gunicorn workers) gets managers that work, and
//! locks it inherited that are inert: never renewed, released, extended or signalled there.
//! Each child runs under a time limit, so a hang fails the test instead of stalling it.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use ferrolock::runtime::block_on;
use ferrolock::{__set_test_hook, ErrorKind, HookPoint, LockOptions, LockStatus};
use ferrolock_testbed::RedisServer;

/// Forks; the child runs `body` and exits 0 when it returns true (1 when false or panicking,
/// without running any destructor or atexit handler of the test process). Returns the
/// child's pid.
fn fork(body: impl FnOnce() -> bool) -> libc::pid_t {
    // SAFETY: the child only runs `body`, then `_exit`s.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).unwrap_or(false);
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    pid
}

/// Waits for a child up to `limit`: its exit code, or `None` if it hung (it is killed).
fn wait(pid: libc::pid_t, limit: Duration) -> Option<i32> {
    let start = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: plain waitpid on our own child.
        let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if done == pid {
            return Some(if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                -1
            });
        }
        if start.elapsed() > limit {
            // SAFETY: our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn watched(ttl: Duration) -> LockOptions {
    opts().watchdog(true).ttl(ttl)
}

#[test]
fn a_forked_child_cannot_use_renew_or_release_its_parents_lock() {
    let _serial = serial();
    let server = RedisServer::start();
    let (key, other) = (unique_key("fork-inert"), unique_key("fork-own"));
    let m = manager(&[server.url()], watched(Duration::from_secs(2)));
    let lock = block_on(m.acquire(&key)).unwrap();
    let lock_ref = &lock;
    let child = fork(move || {
        let lock = lock_ref;
        let refused = |r: ferrolock::Result<()>| {
            r.err().is_some_and(|e| {
                e.kind() == ErrorKind::NotHeld && e.to_string().contains("forked child")
            })
        };
        let inert = !lock.is_held()
            && lock.status() == LockStatus::Released
            && lock.validity() == Duration::ZERO
            && refused(lock.check())
            && refused(block_on(lock.extend()).map(|_| ()))
            && refused(block_on(lock.release()).map(|_| ()));
        // The manager itself works in the child, with a watchdog of its own.
        let own = block_on(m.acquire(&other)).is_ok_and(|l| {
            std::thread::sleep(Duration::from_millis(1500));
            l.is_held() && block_on(l.release()).unwrap_or(false)
        });
        // Dropping an inherited handle releases nothing (the parent checks its key below).
        // SAFETY: this process's copy of the parent's handle is never used again: the child
        // `_exit`s right after.
        drop(unsafe { std::ptr::read(lock) });
        inert && own
    });
    assert_eq!(
        wait(child, Duration::from_secs(30)),
        Some(0),
        "child failed or hung"
    );
    assert!(lock.is_held(), "{:?}", lock.status());
    assert_eq!(get(&server, &key).as_deref(), Some(lock.token()));
    assert!(block_on(lock.release()).unwrap());
}

#[test]
fn a_holder_that_exits_after_forking_leaves_its_key_to_expire() {
    let _serial = serial();
    let server = RedisServer::start();
    let url = server.url();
    let key = unique_key("fork-holder-exits");
    let mut fds = [0i32; 2];
    // SAFETY: a plain pipe, for the grandchild's pid.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let holder = fork(|| {
        let m = manager(std::slice::from_ref(&url), watched(Duration::from_secs(1)));
        let lock = block_on(m.acquire(&key)).expect("holder acquires");
        let grandchild = fork(|| {
            // A child that keeps using the manager (its watchdog runs) long after the holder
            // exited: it must not keep the holder's key alive.
            let other = format!("{key}:child");
            let l = block_on(m.acquire(&other)).expect("child acquires");
            std::thread::sleep(Duration::from_secs(6));
            drop(l);
            true
        });
        let pid = grandchild.to_ne_bytes();
        // SAFETY: writes 4 bytes from a live buffer.
        unsafe { libc::write(fds[1], pid.as_ptr().cast(), pid.len()) };
        std::mem::forget(lock);
        // SAFETY: the holder dies without releasing, as a crashed process would.
        unsafe { libc::_exit(0) }
    });
    assert_eq!(
        wait(holder, Duration::from_secs(30)),
        Some(0),
        "holder failed"
    );
    let mut buf = [0u8; 4];
    // SAFETY: reads 4 bytes into a live buffer.
    assert_eq!(unsafe { libc::read(fds[0], buf.as_mut_ptr().cast(), 4) }, 4);
    let grandchild = libc::pid_t::from_ne_bytes(buf);
    let exited = Instant::now();
    // The holder's ttl is 1 s: with nobody renewing it, the key is gone well within 3 s.
    let mut gone = false;
    while exited.elapsed() < Duration::from_secs(3) {
        if get(&server, &key).is_none() {
            gone = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: proves the grandchild was still running (so it had the chance to renew), then
    // stops it.
    let alive = unsafe { libc::kill(grandchild, 0) } == 0;
    unsafe { libc::kill(grandchild, libc::SIGKILL) };
    assert!(alive, "the child exited early: the test proves nothing");
    assert!(
        gone,
        "the forked child kept renewing its exited parent's key"
    );
}

#[test]
fn a_forked_childs_watchdog_is_woken_for_its_own_locks() {
    let _serial = serial();
    let server = RedisServer::start();
    let key = unique_key("fork-wake");
    let m = manager(&[server.url()], watched(Duration::from_secs(30)));
    // The parent's watchdog task is parked, waiting to be notified, at the fork.
    let parents = block_on(m.acquire(&format!("{key}:parent"))).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let m = &m;
    let child = fork(move || {
        let long = block_on(m.acquire(&format!("{key}:long"))).expect("acquire");
        // The child's watchdog task has started, scanned and gone to sleep.
        std::thread::sleep(Duration::from_millis(200));
        // Its first renewal is due before the watchdog's planned wake-up: it must be woken.
        let opts = watched(Duration::from_millis(900));
        let short = block_on(m.acquire_with(&format!("{key}:short"), &opts)).expect("acquire");
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(3) {
            if !short.is_held() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        block_on(short.release()).unwrap_or(false) && block_on(long.release()).unwrap_or(false)
    });
    assert_eq!(
        wait(child, Duration::from_secs(30)),
        Some(0),
        "the child's short lock was lost (its watchdog was not woken), or it hung"
    );
    assert!(block_on(parents.release()).unwrap());
}

#[test]
fn a_fork_while_the_watchdog_holds_its_registry_leaves_the_child_a_working_manager() {
    let _serial = serial();
    let server = RedisServer::start();
    let key = unique_key("fork-mid-scan");
    let m = manager(&[server.url()], watched(Duration::from_secs(3)));
    let parent = std::process::id();
    let scanning = Arc::new(AtomicBool::new(false));
    {
        let scanning = scanning.clone();
        __set_test_hook(Some(Arc::new(move |point, _| {
            if point == HookPoint::WatchdogScan
                && std::process::id() == parent
                && !scanning.swap(true, Ordering::SeqCst)
            {
                // Holds the registry while the test forks.
                std::thread::sleep(Duration::from_millis(1500));
            }
        })));
    }
    let lock = block_on(m.acquire(&format!("{key}:parent"))).unwrap();
    let start = Instant::now();
    while !scanning.load(Ordering::SeqCst) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the watchdog never scanned"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let child = fork(|| {
        block_on(m.acquire(&format!("{key}:child")))
            .is_ok_and(|l| block_on(l.release()).unwrap_or(false))
    });
    let result = wait(child, Duration::from_secs(30));
    __set_test_hook(None);
    assert_eq!(
        result,
        Some(0),
        "the child hung on the registry it inherited locked"
    );
    assert!(block_on(lock.release()).unwrap());
}

/// A scrape (`metrics::snapshot`) holds the process's metrics registry, and every acquire
/// looks its counts up there: a fork while another thread scraped left the child's copy
/// locked, and its first acquire hung for good (found by a review: a Prometheus handler on
/// one thread, workers forked from another). A child now counts from zero.
#[test]
fn a_fork_during_a_metrics_scrape_leaves_the_child_a_working_acquire() {
    let _serial = serial();
    let server = RedisServer::start();
    let key = unique_key("fork-mid-scrape");
    let m = manager(&[server.url()], opts());
    block_on(
        block_on(m.acquire(&format!("{key}:parent")))
            .unwrap()
            .release(),
    )
    .unwrap();
    let parent = std::process::id();
    let scraping = Arc::new(AtomicBool::new(false));
    {
        let scraping = scraping.clone();
        __set_test_hook(Some(Arc::new(move |point, _| {
            if point == HookPoint::MetricsSnapshot
                && std::process::id() == parent
                && !scraping.swap(true, Ordering::SeqCst)
            {
                // Holds the registry while the test forks.
                std::thread::sleep(Duration::from_millis(1500));
            }
        })));
    }
    let scraper = std::thread::spawn(ferrolock::metrics::snapshot);
    let start = Instant::now();
    while !scraping.load(Ordering::SeqCst) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the scrape never started"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let child = fork(|| {
        let fresh = ferrolock::metrics::snapshot().is_empty();
        fresh
            && block_on(m.acquire(&format!("{key}:child")))
                .is_ok_and(|l| block_on(l.release()).unwrap_or(false))
    });
    let result = wait(child, Duration::from_secs(30));
    __set_test_hook(None);
    let parents = scraper.join().unwrap();
    assert_eq!(
        result,
        Some(0),
        "the child hung on the metrics registry it inherited locked (or did not count from zero)"
    );
    assert!(!parents.is_empty(), "the parent's own counts are kept");
}
