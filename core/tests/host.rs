//! The host layer (`ferrolock::host`) driven the way a binding drives it: blocking calls
//! interrupted from another thread, completion-based calls, the end-of-scope decision, the
//! loss subscription, the exit protocol. Real servers; faults are real (a paused or killed
//! server, a key deleted behind the lock's back). Races run under a timeout.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use common::*;
use ferrolock::host::scope::{self, Body, ScopeEnd};
use ferrolock::host::{self, Cancel};
use ferrolock::{ErrorKind, LockOptions, ManagerOptions};
use ferrolock_testbed::{Cluster, Direction, Proxy, RedisServer};

fn host_manager(urls: &[String], opts: LockOptions) -> host::Manager {
    host::Manager::new(
        ManagerOptions::new()
            .nodes(urls.iter().cloned())
            .restart_guard(Duration::ZERO)
            .lock(opts),
    )
    .expect("manager")
}

/// Runs `f` on a thread of its own and fails the test if it has not returned by `limit` (a
/// regression fails instead of hanging the suite).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => {
            t.join().unwrap();
            out
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            std::panic::resume_unwind(t.join().unwrap_err())
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("did not finish within {limit:?}"),
    }
}

/// Polls `cond` every 10 ms until it holds; false if it never did within `limit`.
fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if cond() {
            return true;
        }
        std::thread::sleep(ms(10));
    }
    cond()
}

#[test]
fn a_cancel_from_another_thread_during_a_blocked_acquire_leaves_no_key() {
    let _serial = serial();
    within(Duration::from_secs(60), || {
        let cluster = Cluster::start(3);
        let [a, b, c] = &cluster.servers[..] else {
            unreachable!()
        };
        let key = unique_key("host-cancel-acquire");
        // b and c answer nothing: the attempt takes a, then waits for the others with a
        // partial grant in hand, until the cancel. Left alone it would win once they answer.
        let m = host_manager(
            &cluster.urls(),
            opts()
                .wait(None)
                .ttl(Duration::from_secs(60))
                .node_timeout(Duration::from_secs(5)),
        );
        b.pause();
        c.pause();
        let cancel = Cancel::new();
        let remote = cancel.clone();
        let (probe_key, a_url) = (key.clone(), a.url());
        let canceller = std::thread::spawn(move || {
            let mut conn = redis::Client::open(a_url)
                .unwrap()
                .get_connection()
                .unwrap();
            let taken = eventually(Duration::from_secs(20), || {
                redis::cmd("EXISTS")
                    .arg(&probe_key)
                    .query::<bool>(&mut conn)
                    .unwrap()
            });
            remote.cancel();
            taken
        });
        let out = m.acquire_blocking(&key, 1, m.defaults(), &cancel, None);
        let took_a = canceller.join().unwrap();
        assert!(
            took_a,
            "the attempt never took node a: the fault did not happen"
        );
        let err = out.expect_err("a cancelled acquire returned a lock");
        assert_eq!(err.kind(), ErrorKind::Cancelled, "{err:?}");
        b.resume();
        c.resume();
        // The undo reaches every node, b and c included once they answer again (their grant
        // runs first, then the undo, on one connection). Well within the ttl (60 s).
        for (name, server) in [("a", a), ("b", b), ("c", c)] {
            assert!(
                eventually(Duration::from_secs(15), || get(server, &key).is_none()),
                "the cancelled acquire left its key on node {name}"
            );
        }
    });
}

#[test]
fn a_cancelled_release_completes_exactly_once() {
    let _serial = serial();
    within(Duration::from_secs(60), || {
        let server = RedisServer::start();
        let key = unique_key("host-cancel-release");
        let o = opts()
            .reentrant(true)
            .ttl(Duration::from_secs(90))
            .node_timeout(Duration::from_secs(10));
        let m = host_manager(&[server.url()], o.clone());
        let never = Cancel::new();
        let outer = m.acquire_blocking(&key, 7, &o, &never, None).unwrap();
        let inner = m.acquire_blocking(&key, 7, &o, &never, None).unwrap();
        let field = outer.core().token().to_string();
        let count = |s: &RedisServer| s.cmd::<Option<i64>>(&["HGET", &key, &field]);
        assert_eq!(count(&server), Some(2));

        // The release goes out to a paused server; the cancel comes while it waits there, and
        // the server answers only after the cancel.
        server.pause();
        let cancel = Cancel::new();
        let remote = cancel.clone();
        let pid = server.pid();
        let unpauser = std::thread::spawn(move || {
            std::thread::sleep(ms(200));
            remote.cancel();
            std::thread::sleep(ms(200));
            // SAFETY: signals a child process of the test bed.
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        });
        let out = inner.release_blocking(&cancel, None);
        unpauser.join().unwrap();
        let err = out.expect_err("the release was not interrupted");
        assert_eq!(err.kind(), ErrorKind::Cancelled, "{err:?}");
        // Completed (the hold count went down) and only once (not to 0).
        assert!(
            eventually(Duration::from_secs(10), || count(&server) == Some(1)),
            "the cancelled release did not complete: count {:?}",
            count(&server)
        );
        std::thread::sleep(ms(300));
        assert_eq!(count(&server), Some(1), "the release was applied twice");
        assert_eq!(outer.release_blocking(&never, None), Ok(true));
        assert!(get(&server, &key).is_none() && count(&server).is_none());
    });
}

#[test]
fn a_completion_based_acquire_is_cancelled_without_a_key_and_delivers_its_lock() {
    within(Duration::from_secs(60), || {
        let server = RedisServer::start();
        let key = unique_key("host-call");
        let m = host_manager(&[server.url()], opts().wait(None));
        let never = Cancel::new();
        let holder = m
            .acquire_blocking(&key, 1, m.defaults(), &never, None)
            .unwrap();

        let waiting = m.acquire_call(&key, 2, m.defaults(), Cancel::new());
        std::thread::sleep(ms(100));
        assert!(!waiting.is_done(), "acquired a key someone holds");
        waiting.cancel();
        let err = waiting
            .wait()
            .unwrap()
            .expect_err("cancelled, yet acquired");
        assert_eq!(err.kind(), ErrorKind::Cancelled);
        assert_eq!(
            get(&server, &key).as_deref(),
            Some(holder.core().token()),
            "the holder's key was touched"
        );

        let (tx, rx) = mpsc::channel();
        m.acquire_start(&key, 3, m.defaults(), Cancel::new(), move |out| {
            let _ = tx.send(out);
        });
        assert_eq!(holder.release_blocking(&never, None), Ok(true));
        let lock = rx.recv().unwrap().expect("acquired after the release");
        assert_eq!(get(&server, &key).as_deref(), Some(lock.core().token()));
        assert_eq!(lock.release_blocking(&never, None), Ok(true));
        assert!(get(&server, &key).is_none());
    });
}

/// `Kind::Permits` through the host's entry points: holders up to the pool, the next one
/// refused, and the pool full again after the releases.
#[test]
fn permits_are_taken_through_the_host_up_to_the_pool() {
    within(Duration::from_secs(60), || {
        let server = RedisServer::start();
        let name = unique_key("host-permits");
        let m = host_manager(&[server.url()], opts().wait(Some(Duration::ZERO)));
        let never = Cancel::new();
        let two = host::Kind::Permits {
            permits: 3,
            count: 2,
        }
        .options(m.defaults().clone());
        let first = m
            .acquire_blocking(&name, 1, &two, &never, None)
            .expect("2 of 3 permits");
        assert_eq!(
            get(&server, &name).as_deref(),
            Some("1"),
            "counter after 2 of 3"
        );
        let err = m
            .acquire_blocking(&name, 2, &two, &never, None)
            .expect_err("2 more of 3 granted while 2 are held");
        assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err:?}");
        let one = host::Kind::Permits {
            permits: 3,
            count: 1,
        }
        .options(m.defaults().clone());
        let second = m
            .acquire_blocking(&name, 3, &one, &never, None)
            .expect("the last permit");
        assert_eq!(get(&server, &name).as_deref(), Some("0"));
        assert_eq!(first.release_blocking(&never, None), Ok(true));
        assert_eq!(second.release_blocking(&never, None), Ok(true));
        assert_eq!(
            get(&server, &name).as_deref(),
            Some("3"),
            "the pool after both released"
        );
    });
}

/// An acquire on a closed manager names what it was asked for: a semaphore's name as a
/// semaphore's (as every other semaphore error does), a lock's key as a lock's.
#[test]
fn an_acquire_on_a_closed_manager_names_a_semaphore_as_one() {
    within(Duration::from_secs(60), || {
        let server = RedisServer::start();
        let m = host_manager(&[server.url()], opts().wait(Some(Duration::ZERO)));
        m.close(Duration::from_secs(5));
        let never = Cancel::new();
        let permits = host::Kind::Permits {
            permits: 2,
            count: 1,
        }
        .options(m.defaults().clone());
        let err = m
            .acquire_blocking("sem:closed", 1, &permits, &never, None)
            .expect_err("granted by a closed manager");
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err:?}");
        assert_eq!(
            err.message(),
            "semaphore \"sem:closed\": this LockManager is closed"
        );
        let err = m
            .acquire_blocking("lock:closed", 1, m.defaults(), &never, None)
            .expect_err("granted by a closed manager");
        assert_eq!(
            err.message(),
            "lock \"lock:closed\": this LockManager is closed"
        );
    });
}

/// An acquire cancelled while it waits names what it was asked for, as its other errors do:
/// a semaphore's name as a semaphore's, a lock's key as a lock's; blocking or completion-based.
#[test]
fn a_cancelled_acquire_names_a_semaphore_as_one() {
    within(Duration::from_secs(60), || {
        let server = RedisServer::start();
        let m = host_manager(&[server.url()], opts());
        let never = Cancel::new();
        let permits = host::Kind::Permits {
            permits: 1,
            count: 1,
        }
        .options(m.defaults().clone());
        let held = m
            .acquire_blocking("sem:cancelled", 1, &permits, &never, None)
            .expect("the only permit");
        let lock = m
            .acquire_blocking("lock:cancelled", 1, m.defaults(), &never, None)
            .expect("the lock");
        for (key, kind, noun) in [
            ("sem:cancelled", &permits, "semaphore"),
            ("lock:cancelled", m.defaults(), "lock"),
        ] {
            // Fired once the waiter has had time to start waiting; fired earlier, it ends the
            // same way.
            let cancel = Cancel::new();
            let remote = cancel.clone();
            let canceller = std::thread::spawn(move || {
                std::thread::sleep(ms(300));
                remote.cancel();
            });
            let err = m
                .acquire_blocking(key, 2, kind, &cancel, None)
                .expect_err("granted beside the holder");
            canceller.join().unwrap();
            assert_eq!(err.kind(), ErrorKind::Cancelled, "{err:?}");
            assert!(
                err.message()
                    .starts_with(&format!("{noun} {key:?} not acquired")),
                "{err:?}"
            );
            let cancel = Cancel::new();
            let call = m.acquire_call(key, 3, kind, cancel.clone());
            cancel.cancel();
            let err = call
                .wait()
                .expect("one result")
                .expect_err("granted beside the holder");
            assert_eq!(err.kind(), ErrorKind::Cancelled, "{err:?}");
            assert!(
                err.message()
                    .starts_with(&format!("{noun} {key:?} not acquired")),
                "{err:?}"
            );
        }
        assert_eq!(held.release_blocking(&never, None), Ok(true));
        assert_eq!(lock.release_blocking(&never, None), Ok(true));
    });
}

/// A lock of `m` on a fresh key.
fn take(m: &host::Manager, name: &str) -> host::Lock {
    let lock = m.acquire_blocking(&unique_key(name), 1, m.defaults(), &Cancel::new(), None);
    lock.expect("acquire")
}

/// Waits for the lock's loss to be declared.
fn wait_lost(lock: &host::Lock) {
    let lost = lock.lost();
    let reason = ferrolock::runtime::block_on(async {
        tokio::time::timeout(Duration::from_secs(20), lost).await
    });
    assert!(
        matches!(reason, Ok(Some(_))),
        "the loss was never declared: {reason:?}"
    );
}

fn raises(end: &ScopeEnd, kind: ErrorKind, chain: bool) -> bool {
    matches!(end, ScopeEnd::Raise { error, chain: c } if error.kind() == kind && *c == chain)
}

#[test]
fn scope_end_held_lock_is_released_whatever_the_body_did() {
    let server = RedisServer::start();
    let m = host_manager(&[server.url()], opts());
    for body in [
        Body::Finished,
        Body::Failed,
        Body::Interrupted,
        Body::StoppedByLoss,
    ] {
        let lock = take(&m, "scope-held");
        assert_eq!(
            scope::end_blocking(&lock, body),
            ScopeEnd::Clean,
            "{body:?}"
        );
        assert!(get(&server, lock.key()).is_none(), "{body:?}: not released");
    }
}

#[test]
fn scope_end_released_elsewhere_adds_nothing() {
    let server = RedisServer::start();
    let m = host_manager(&[server.url()], opts());
    for body in [Body::Finished, Body::Failed] {
        let lock = take(&m, "scope-elsewhere");
        assert_eq!(lock.release_blocking(&Cancel::new(), None), Ok(true));
        assert_eq!(
            scope::end_blocking(&lock, body),
            ScopeEnd::Clean,
            "{body:?}"
        );
    }
}

#[test]
fn scope_end_lost_lock_reports_the_loss_unless_the_body_was_interrupted() {
    let server = RedisServer::start();
    // Watchdog on: deleting the key behind its back makes the next renewal declare it lost.
    let m = host_manager(
        &[server.url()],
        opts().watchdog(true).ttl(Duration::from_millis(900)),
    );
    let cases = [
        (Body::Finished, Some(false)),
        (Body::StoppedByLoss, Some(false)),
        (Body::Failed, Some(true)),
        (Body::Interrupted, None),
    ];
    for (body, chain) in cases {
        let lock = take(&m, "scope-lost");
        let _: i64 = server.cmd(&["DEL", lock.key()]);
        wait_lost(&lock);
        let end = scope::end_blocking(&lock, body);
        match chain {
            Some(chain) => assert!(
                raises(&end, ErrorKind::LockLost, chain),
                "{body:?}: {end:?}"
            ),
            None => assert_eq!(end, ScopeEnd::Clean, "{body:?}"),
        }
        if let ScopeEnd::Raise { error, .. } = end {
            assert!(error.message().contains("our token is gone"), "{error:?}");
        }
    }
}

/// `release_all` and `close` release a lock whose holder is still at work (another thread in a
/// Python block, a Node `withLock`): the holder is told it lost the lock, as for any loss,
/// and its block's end reports it, instead of going on unprotected and ending clean.
#[test]
fn release_all_and_close_tell_a_holder_still_at_work_that_its_lock_is_lost() {
    let server = RedisServer::start();
    for closing in [false, true] {
        let m = host_manager(&[server.url()], opts());
        let lock = take(&m, "released-by-manager");
        let (told_tx, told_rx) = mpsc::channel();
        lock.on_lost(move |reason| {
            let _ = told_tx.send(reason.clone());
        });
        if closing {
            m.close(Duration::from_secs(10));
        } else {
            assert_eq!(m.release_all(Duration::from_secs(10)), 1);
        }
        assert!(
            get(&server, lock.key()).is_none(),
            "closing={closing}: not released"
        );
        let reason = told_rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the holder was never told");
        assert!(
            matches!(reason, ferrolock::LossReason::ReleasedByManager { .. }),
            "closing={closing}: {reason:?}"
        );
        let end = scope::end_blocking(&lock, Body::Finished);
        assert!(
            raises(&end, ErrorKind::LockLost, false),
            "closing={closing}: {end:?}"
        );
        if let ScopeEnd::Raise { error, .. } = end {
            assert!(
                error.message().contains("its manager released it"),
                "{error:?}"
            );
        }
    }
    // A lock its holder released first is not reported lost.
    let m = host_manager(&[server.url()], opts());
    let lock = take(&m, "released-by-holder");
    assert_eq!(lock.release_blocking(&Cancel::new(), None), Ok(true));
    assert_eq!(m.release_all(Duration::from_secs(10)), 0);
    assert!(lock.loss_reason().is_none());
}

/// A second `close` while the first is still releasing (two threads, or a shutdown beside a
/// close) returns once the locks are released, as the first does: it returned as soon as the
/// closed flag was set, and its caller went on as if its locks were free.
#[test]
fn a_second_close_returns_only_once_the_first_has_released_the_locks() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let m = host_manager(
        &[proxy.url()],
        opts()
            .ttl(Duration::from_secs(60))
            .node_timeout(Duration::from_secs(5)),
    );
    let lock = take(&m, "closed-twice");
    let key = lock.key().to_string();
    // The release is held on its way to the server until the second close has been called.
    proxy.hold(Direction::Up);
    let first = {
        let m = m.clone();
        std::thread::spawn(move || m.close(Duration::from_secs(20)))
    };
    assert!(
        eventually(Duration::from_secs(20), || m.is_closed()),
        "the first close never set the closed flag"
    );
    let second = {
        let m = m.clone();
        std::thread::spawn(move || m.close(Duration::from_secs(20)))
    };
    std::thread::sleep(Duration::from_millis(300));
    let returned_while_held = second.is_finished();
    assert!(
        get(&server, &key).is_some(),
        "the release got through the hold"
    );
    proxy.release(Direction::Up);
    second.join().unwrap();
    assert!(
        !returned_while_held && get(&server, &key).is_none(),
        "the second close returned before the first had released the lock (returned while the \
         release was held: {returned_while_held})"
    );
    first.join().unwrap();
}

/// Two closes at once: each returns once the locks are released. The second saw the closed
/// flag set but read whose close was under way before the first had said so (it set the flag,
/// then its pid), and returned at once (13 of 1000 pairs here). Many pairs: the gap is short.
#[test]
fn two_closes_at_once_both_return_once_the_locks_are_released() {
    let server = RedisServer::start();
    let pairs = 1000;
    let early = Arc::new(AtomicUsize::new(0));
    for i in 0..pairs {
        let m = host_manager(
            &[server.url()],
            opts()
                .ttl(Duration::from_secs(60))
                .node_timeout(Duration::from_secs(5)),
        );
        let lock = take(&m, &format!("closed-at-once-{i}"));
        let key = lock.key().to_string();
        let gate = Arc::new(std::sync::Barrier::new(2));
        let closes: Vec<_> = (0..2)
            .map(|_| {
                let (m, gate, early, key) = (m.clone(), gate.clone(), early.clone(), key.clone());
                let mut redis = redis::Client::open(server.url())
                    .unwrap()
                    .get_connection()
                    .unwrap();
                std::thread::spawn(move || {
                    gate.wait();
                    m.close(Duration::from_secs(20));
                    let held: Option<String> =
                        redis::cmd("GET").arg(&key).query(&mut redis).unwrap();
                    if held.is_some() {
                        early.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for c in closes {
            c.join().unwrap();
        }
        drop(lock);
    }
    assert_eq!(
        early.load(Ordering::SeqCst),
        0,
        "closes of {pairs} pairs returned with the lock still held"
    );
}

#[test]
fn scope_end_lock_gone_at_release_raises_after_a_finished_body_and_logs_otherwise() {
    let server = RedisServer::start();
    // Watchdog off and a long ttl: nothing notices the key is gone before the release.
    let m = host_manager(&[server.url()], opts().ttl(Duration::from_secs(60)));
    for body in [Body::Finished, Body::Failed, Body::Interrupted] {
        let lock = take(&m, "scope-gone");
        let _: i64 = server.cmd(&["DEL", lock.key()]);
        let end = scope::end_blocking(&lock, body);
        let message = scope::gone_message("lock", lock.key());
        if body == Body::Finished {
            assert!(raises(&end, ErrorKind::LockLost, false), "{end:?}");
        } else {
            assert_eq!(end, ScopeEnd::Log(message), "{body:?}");
        }
    }
}

#[test]
fn scope_end_failed_release_raises_after_a_finished_body_and_logs_otherwise() {
    for body in [Body::Finished, Body::Failed] {
        let mut server = RedisServer::start();
        let m = host_manager(
            &[server.url()],
            opts().ttl(Duration::from_secs(60)).node_timeout(ms(300)),
        );
        let lock = take(&m, "scope-failed");
        server.kill();
        let end = scope::end_blocking(&lock, body);
        match body {
            Body::Finished => assert!(
                matches!(&end, ScopeEnd::Raise { error, chain: false } if error.kind() != ErrorKind::LockLost),
                "{end:?}"
            ),
            _ => assert!(
                matches!(&end, ScopeEnd::Log(m) if m.starts_with("while ending the scope after the body failed: ")),
                "{end:?}"
            ),
        }
    }
}

#[test]
fn a_freed_lock_is_never_called_back_and_free_waits_for_a_running_callback() {
    within(Duration::from_secs(60), || {
        let server = RedisServer::start();
        let m = host_manager(
            &[server.url()],
            opts().watchdog(true).ttl(Duration::from_millis(900)),
        );

        // Freed before the loss: never called.
        let lock = take(&m, "loss-after-free");
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        lock.on_lost(move |_| {
            c.fetch_add(1, Ordering::SeqCst);
        });
        let kept = lock.clone();
        lock.free();
        let _: i64 = server.cmd(&["DEL", kept.key()]);
        wait_lost(&kept);
        // The core hands the callback on when it declares the loss; give it time to run.
        std::thread::sleep(ms(500));
        assert_eq!(
            calls.load(Ordering::SeqCst),
            0,
            "called after free returned"
        );

        // Running when free is called: free returns only after it.
        let lock = take(&m, "loss-during-free");
        let (entered_tx, entered_rx) = mpsc::channel();
        let finished = Arc::new(AtomicUsize::new(0));
        let f = finished.clone();
        lock.on_lost(move |reason| {
            entered_tx.send(reason.to_string()).unwrap();
            std::thread::sleep(ms(300));
            f.store(1, Ordering::SeqCst);
        });
        let _: i64 = server.cmd(&["DEL", lock.key()]);
        let reason = entered_rx.recv().unwrap();
        assert!(reason.contains("our token is gone"), "{reason}");
        lock.free();
        assert_eq!(
            finished.load(Ordering::SeqCst),
            1,
            "free returned while the callback was running"
        );
    });
}

#[test]
fn a_loss_callback_is_not_started_after_release_returns() {
    within(Duration::from_secs(60), || {
        let server = RedisServer::start();
        let m = host_manager(
            &[server.url()],
            opts().watchdog(true).ttl(Duration::from_millis(900)),
        );
        let lock = take(&m, "loss-after-release");
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        lock.on_lost(move |_| {
            c.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(lock.release_blocking(&Cancel::new(), None), Ok(true));
        std::thread::sleep(ms(1500));
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    });
}

#[test]
fn one_shared_manager_per_connection_options() {
    let a = host::shared(&ManagerOptions::new().nodes(["redis://127.0.0.1:1"])).unwrap();
    let b = host::shared(
        &ManagerOptions::new()
            .nodes(["redis://127.0.0.1:1"])
            .lock(LockOptions::default().ttl(Duration::from_secs(3))),
    )
    .unwrap();
    let other = host::shared(&ManagerOptions::new().nodes(["redis://127.0.0.1:2"])).unwrap();
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
    a.close(ms(100));
    assert!(b.is_closed(), "the lock options made a second manager");
    assert!(!other.is_closed());
    let again = host::shared(&ManagerOptions::new().nodes(["redis://127.0.0.1:1"])).unwrap();
    assert!(
        !again.is_closed(),
        "a closed shared manager was handed out again"
    );
}

/// The exit protocol sets a process-wide flag: it runs in a child process of its own (this
/// test binary, re-run on `exit_protocol_child`).
const EXIT_CHILD: &str = "FERROLOCK_HOST_EXIT_CHILD";

#[test]
fn the_exit_protocol_keeps_its_time_bound_with_a_paused_majority() {
    let _serial = serial();
    let cluster = Cluster::start(3);
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "exit_protocol_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(EXIT_CHILD, cluster.nodes_env())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("exit-child-ok"),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn exit_protocol_child() {
    let Ok(nodes) = std::env::var(EXIT_CHILD) else {
        return; // only as the child of the test above
    };
    let urls: Vec<String> = ferrolock::split_nodes(&nodes);
    let servers: Vec<u32> = urls
        .iter()
        .map(|u| {
            let mut c = redis::Client::open(u.as_str())
                .unwrap()
                .get_connection()
                .unwrap();
            let info: String = redis::cmd("INFO").arg("server").query(&mut c).unwrap();
            info.lines()
                .find_map(|l| l.strip_prefix("process_id:"))
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        })
        .collect();
    // A node timeout far beyond the exit's limit: a release that waited for its nodes would
    // blow the bound.
    let node_timeout = Duration::from_secs(20);
    let m = host_manager(
        &urls,
        opts()
            .ttl(Duration::from_secs(180))
            .node_timeout(node_timeout),
    );
    let held = take(&m, "exit-held");
    for pid in &servers[1..] {
        // SAFETY: stops a test-bed server (resumed below).
        unsafe { libc::kill(*pid as i32, libc::SIGSTOP) };
        let stopped = eventually(Duration::from_secs(10), || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit(')')
                        .next()
                        .map(|r| r.trim_start().starts_with('T'))
                })
                .unwrap_or(false)
        });
        assert!(
            stopped,
            "server {pid} did not stop: the fault is not in place"
        );
    }
    let limit = Duration::from_secs(3);
    let start = Instant::now();
    let released = host::exit(limit);
    let took = start.elapsed();
    for pid in &servers[1..] {
        // SAFETY: as above.
        unsafe { libc::kill(*pid as i32, libc::SIGCONT) };
    }
    assert_eq!(released, 0, "released on a quorum with a paused majority");
    // A safety bound, not a speed one: far below the node timeout the release waits for.
    assert!(
        took < limit + Duration::from_secs(5),
        "exit took {took:?} with a limit of {limit:?}"
    );
    assert!(host::is_exiting());
    let after = m.acquire_blocking("exit-after", 1, m.defaults(), &Cancel::new(), None);
    assert_eq!(after.unwrap_err().kind(), ErrorKind::NotAcquired);
    drop(held);
    println!("exit-child-ok");
}

/// Rounds of the cancel races below: the old report-then-undo failed most of them.
const CANCEL_ROUNDS: usize = 20;

/// A connection of the test's own to each of `urls`.
fn connections(urls: &[String]) -> Vec<redis::Connection> {
    urls.iter()
        .map(|u| {
            redis::Client::open(u.as_str())
                .unwrap()
                .get_connection()
                .unwrap()
        })
        .collect()
}

/// On how many nodes the key's server queue has an entry.
fn queued(conns: &mut [redis::Connection], key: &str) -> usize {
    conns
        .iter_mut()
        .map(|c| {
            redis::cmd("ZCARD")
                .arg(ferrolock::queue_key(key))
                .query::<i64>(c)
                .unwrap()
        })
        .filter(|&n| n > 0)
        .count()
}

/// A waiter of another manager queued on every node is cancelled: once the cancel is
/// reported, it is in no server queue. The waiter is a completion-based call, or a blocking
/// one on a thread of its own.
fn cancel_a_queued_waiter(urls: &[String], blocking: bool) {
    let o = opts().wait(None).ttl(Duration::from_secs(60));
    let (holders, waiters) = (host_manager(urls, o.clone()), host_manager(urls, o.clone()));
    let mut conns = connections(urls);
    let never = Cancel::new();
    for round in 0..CANCEL_ROUNDS {
        let key = format!("{}:{round}", unique_key("host-cancel-queued"));
        let holder = holders
            .acquire_blocking(&key, host::NO_OWNER, &o, &never, None)
            .unwrap();
        let cancel = Cancel::new();
        type Outcome = Box<dyn FnOnce() -> ferrolock::Result<host::Lock>>;
        let outcome: Outcome = if blocking {
            let (m, k, o, c) = (waiters.clone(), key.clone(), o.clone(), cancel.clone());
            let t =
                std::thread::spawn(move || m.acquire_blocking(&k, host::NO_OWNER, &o, &c, None));
            Box::new(move || t.join().unwrap())
        } else {
            let call = waiters.acquire_call(&key, host::NO_OWNER, &o, cancel.clone());
            Box::new(move || call.wait().unwrap())
        };
        assert!(
            eventually(Duration::from_secs(20), || queued(&mut conns, &key)
                == urls.len()),
            "round {round}: the waiter never joined the server queues: the case did not happen"
        );
        cancel.cancel();
        let err = outcome().expect_err("cancelled, yet acquired");
        assert_eq!(err.kind(), ErrorKind::Cancelled, "{err:?}");
        assert_eq!(
            queued(&mut conns, &key),
            0,
            "round {round}: the cancel was reported while the waiter was still in a server queue"
        );
        assert_eq!(holder.release_blocking(&never, None), Ok(true));
    }
}

/// A waiter is cancelled just as the holder's release wakes it, its grant on its way: once
/// the cancel (or the grant) is reported and a grant released, another manager's try takes
/// the key at once.
fn cancel_a_waiter_as_it_is_granted(urls: &[String]) {
    let o = opts().wait(None).ttl(Duration::from_secs(60));
    let [holders, waiters, others] = std::array::from_fn(|_| host_manager(urls, o.clone()));
    let mut conns = connections(urls);
    let never = Cancel::new();
    let once = opts().wait(Some(Duration::ZERO));
    let mut cancelled = 0;
    for round in 0..CANCEL_ROUNDS {
        let key = format!("{}:{round}", unique_key("host-cancel-granted"));
        let holder = holders
            .acquire_blocking(&key, host::NO_OWNER, &o, &never, None)
            .unwrap();
        let waiting = waiters.acquire_call(&key, host::NO_OWNER, &o, Cancel::new());
        assert!(
            eventually(Duration::from_secs(20), || queued(&mut conns, &key)
                == urls.len()),
            "round {round}: the waiter never joined the server queues"
        );
        assert_eq!(holder.release_blocking(&never, None), Ok(true));
        waiting.cancel();
        match waiting.wait().unwrap() {
            Ok(lock) => assert_eq!(lock.release_blocking(&never, None), Ok(true)),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Cancelled, "{e:?}");
                cancelled += 1;
            }
        }
        let other = others.acquire_blocking(&key, host::NO_OWNER, &once, &never, None);
        let other = other.unwrap_or_else(|e| {
            panic!("round {round}: another manager's try right after the cancel failed: {e}")
        });
        assert_eq!(other.release_blocking(&never, None), Ok(true));
    }
    assert!(
        cancelled > 0,
        "no round was cancelled: the race never happened"
    );
}

#[test]
fn a_cancelled_completion_acquire_is_reported_once_it_left_the_server_queue() {
    within(Duration::from_secs(120), || {
        let server = RedisServer::start();
        cancel_a_queued_waiter(&[server.url()], false);
        let cluster = Cluster::start(3);
        cancel_a_queued_waiter(&cluster.urls(), false);
    });
}

#[test]
fn a_cancelled_blocking_acquire_returns_once_it_left_the_server_queue() {
    within(Duration::from_secs(120), || {
        let server = RedisServer::start();
        cancel_a_queued_waiter(&[server.url()], true);
        let cluster = Cluster::start(3);
        cancel_a_queued_waiter(&cluster.urls(), true);
    });
}

#[test]
fn a_completion_acquire_cancelled_as_it_is_granted_leaves_the_key_free_when_reported() {
    within(Duration::from_secs(120), || {
        let server = RedisServer::start();
        cancel_a_waiter_as_it_is_granted(&[server.url()]);
        let cluster = Cluster::start(3);
        cancel_a_waiter_as_it_is_granted(&cluster.urls());
    });
}

#[test]
fn a_cancelled_completion_acquire_with_paused_nodes_is_reported_once_it_left_the_others() {
    let _serial = serial();
    within(Duration::from_secs(60), || {
        let cluster = Cluster::start(3);
        let [a, b, c] = &cluster.servers[..] else {
            unreachable!()
        };
        let key = unique_key("host-cancel-paused");
        // b and c answer nothing: the attempt takes a, then waits for the others with a
        // partial grant in hand, until the cancel.
        let m = host_manager(
            &cluster.urls(),
            opts()
                .wait(None)
                .ttl(Duration::from_secs(60))
                .node_timeout(Duration::from_secs(2)),
        );
        b.pause();
        c.pause();
        let waiting = m.acquire_call(&key, host::NO_OWNER, m.defaults(), Cancel::new());
        let mut conn = redis::Client::open(a.url())
            .unwrap()
            .get_connection()
            .unwrap();
        let exists = |conn: &mut redis::Connection| {
            redis::cmd("EXISTS").arg(&key).query::<bool>(conn).unwrap()
        };
        assert!(
            eventually(Duration::from_secs(20), || exists(&mut conn)),
            "the attempt never took node a: the fault did not happen"
        );
        waiting.cancel();
        let err = waiting
            .wait()
            .unwrap()
            .expect_err("cancelled, yet acquired");
        assert_eq!(err.kind(), ErrorKind::Cancelled, "{err:?}");
        assert!(
            !exists(&mut conn),
            "the cancel was reported with the grant still on node a, which had answered"
        );
        // The paused nodes run the request once resumed, then its undo (one connection), in
        // the background.
        b.resume();
        c.resume();
        for (name, server) in [("b", b), ("c", c)] {
            assert!(
                eventually(Duration::from_secs(15), || get(server, &key).is_none()),
                "the cancelled acquire left its key on node {name}"
            );
        }
    });
}

/// The waiter-queue keys of `key` that exist on `server` (none once nothing of a waiter is
/// left there).
fn queue_keys(server: &RedisServer, key: &str) -> Vec<String> {
    [
        ferrolock::queue_key(key),
        ferrolock::queue_lease_key(key),
        ferrolock::queue_since_key(key),
    ]
    .into_iter()
    .filter(|k| server.cmd::<i64>(&["EXISTS", k]) == 1)
    .collect()
}

/// Closing a manager ends the acquires waiting on it (a blocking one and a completion-based
/// one) with a clear error, and leaves nothing of them on any node: no queue entry once
/// `close` has returned, no key once the holder has released.
#[test]
fn closing_a_manager_ends_its_waits_and_leaves_no_key_or_queue_entry() {
    let _serial = serial();
    within(Duration::from_secs(120), || {
        let cluster = Cluster::start(3);
        let key = unique_key("host-close-waits");
        let o = opts().wait(None).ttl(Duration::from_secs(60));
        let holder = host_manager(&cluster.urls(), o.clone());
        let held = holder
            .acquire_blocking(&key, host::NO_OWNER, &o, &Cancel::new(), None)
            .unwrap();
        let waiters = host_manager(&cluster.urls(), o.clone());
        let (tx, rx) = mpsc::channel();
        let (m, k, wo) = (waiters.clone(), key.clone(), o.clone());
        let blocked = std::thread::spawn(move || {
            let _ = tx.send(m.acquire_blocking(&k, host::NO_OWNER, &wo, &Cancel::new(), None));
        });
        let call = waiters.acquire_call(&key, host::NO_OWNER, &o, Cancel::new());
        // The fault: the waiters sit in the key's queue on every node.
        assert!(
            eventually(Duration::from_secs(30), || cluster
                .servers
                .iter()
                .all(|s| !queue_keys(s, &key).is_empty())),
            "the waiters never queued on every node"
        );
        waiters.close(Duration::from_secs(5));
        let ended = |r: &ferrolock::Result<host::Lock>| match r {
            Err(e) => e.kind() == ErrorKind::NotAcquired && e.to_string().contains("closed"),
            Ok(_) => false,
        };
        let first = rx.recv_timeout(Duration::from_secs(30));
        assert!(
            matches!(&first, Ok(r) if ended(r)),
            "the blocked acquire did not end with the close"
        );
        blocked.join().unwrap();
        let second = call.wait().expect("the call's result");
        assert!(ended(&second), "the completion-based acquire did not end");
        for s in &cluster.servers {
            assert_eq!(queue_keys(s, &key), Vec::<String>::new(), "queue left");
        }
        assert!(held.release_blocking(&Cancel::new(), None).unwrap());
        let other = host_manager(&cluster.urls(), opts().wait(Some(Duration::ZERO)));
        let again =
            other.acquire_blocking(&key, host::NO_OWNER, other.defaults(), &Cancel::new(), None);
        assert!(
            again.is_ok(),
            "a closed manager's waiter kept the key: {again:?}"
        );
        drop(again);
        other.close(Duration::from_secs(5));
        for s in &cluster.servers {
            assert_eq!(s.cmd::<i64>(&["EXISTS", &key]), 0);
            assert_eq!(queue_keys(s, &key), Vec::<String>::new(), "queue left");
        }
    });
}

/// Exit finds every lock of the process however its handles were freed (run as a child of
/// its own: exit is process-wide).
const EXIT_FREED_CHILD: &str = "FERROLOCK_HOST_EXIT_FREED_CHILD";

#[test]
fn exit_releases_locks_whose_manager_or_handle_was_freed() {
    let _serial = serial();
    let server = RedisServer::start();
    // Every byte to and from the node waits: a release started in the background is still
    // running when exit starts.
    let proxy = ferrolock_testbed::Proxy::start(server.port());
    proxy.set_delay(Duration::from_millis(500));
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "exit_freed_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            EXIT_FREED_CHILD,
            format!("{} {}", proxy.url(), server.url()),
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("exit-freed-ok"),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn exit_freed_child() {
    let Ok(urls) = std::env::var(EXIT_FREED_CHILD) else {
        return; // only as the child of the test above
    };
    let (via_proxy, direct) = urls.split_once(' ').unwrap();
    let o = opts()
        .watchdog(true)
        .ttl(Duration::from_secs(90))
        .node_timeout(Duration::from_secs(10));
    let urls = [via_proxy.to_string()];
    // A lock whose manager's every handle was dropped (Go's deferred Close ran first, a
    // collected Python or Node manager).
    let m = host_manager(&urls, o.clone());
    let kept = take(&m, "exit-freed-kept");
    drop(m);
    // A lock freed unreleased, then its manager: the release its drop starts is running.
    let m = host_manager(&urls, o);
    let dropped = take(&m, "exit-freed-dropped");
    let dropped_key = dropped.key().to_string();
    drop(dropped);
    drop(m);
    let released = host::exit(Duration::from_secs(30));
    assert_eq!(released, 1, "exit released {released} locks");
    assert_eq!(kept.core().status(), ferrolock::LockStatus::Released);
    let mut c = redis::Client::open(direct)
        .unwrap()
        .get_connection()
        .unwrap();
    for k in [kept.key(), &dropped_key] {
        let n: i64 = redis::cmd("EXISTS").arg(k).query(&mut c).unwrap();
        assert_eq!(n, 0, "{k} left on the node");
    }
    println!("exit-freed-ok");
}

/// A forked child that acquires on a manager it inherited releases that lock at its exit.
#[test]
fn a_forked_childs_exit_releases_what_it_took_on_an_inherited_manager() {
    let _serial = serial();
    let server = RedisServer::start();
    let key = unique_key("host-exit-fork");
    let m = host_manager(
        &[server.url()],
        opts().watchdog(true).ttl(Duration::from_secs(60)),
    );
    // The parent uses the manager first: the child inherits one with the parent's core.
    take(&m, "host-exit-fork-parent")
        .release_blocking(&Cancel::new(), None)
        .unwrap();
    // SAFETY: the child only acquires, runs the exit protocol, then `_exit`s.
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork failed");
    if child == 0 {
        let code =
            match m.acquire_blocking(&key, host::NO_OWNER, m.defaults(), &Cancel::new(), None) {
                Ok(lock) => {
                    let released = host::exit(Duration::from_secs(10));
                    drop(lock);
                    if released == 1 { 0 } else { 2 }
                }
                Err(_) => 3,
            };
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: our own child.
    unsafe { libc::waitpid(child, &mut status, 0) };
    assert!(libc::WIFEXITED(status));
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "the child's exit did not release its lock (2) or it could not acquire (3)"
    );
    assert_eq!(
        server.cmd::<i64>(&["EXISTS", &key]),
        0,
        "the child's key was left"
    );
}

/// A semaphore acquire cancelled while its script's reply is held back (a proxy holds every
/// reply; the script has run, shown by the counter it created) gives its permits back: the
/// cancel's cleanup, which the cancel waits for, returns the attempt's ids once the request
/// ends (the links are reset after the cancel), so the pool is full again when the Cancelled
/// result is out, not at the end of the lease (60 s).
#[test]
fn a_cancelled_semaphore_acquire_gives_its_permits_back() {
    within(Duration::from_secs(60), || {
        let server = RedisServer::start();
        let proxy = Proxy::start(server.port());
        let name = unique_key("host-permits-cancel");
        let m = host_manager(
            &[proxy.url()],
            opts()
                .wait(None)
                .ttl(Duration::from_secs(60))
                .node_timeout(Duration::from_secs(5)),
        );
        let never = Cancel::new();
        let one = host::Kind::Permits {
            permits: 1,
            count: 1,
        }
        .options(m.defaults().clone());
        // The script loaded before the replies are held (so it goes out as EVALSHA and runs,
        // rather than answering NOSCRIPT).
        let warm = m
            .acquire_blocking(&unique_key("host-permits-warm"), 1, &one, &never, None)
            .expect("a permit of another pool");
        assert_eq!(warm.release_blocking(&never, None), Ok(true));
        proxy.hold(Direction::Down);
        let cancel = Cancel::new();
        let out = std::thread::scope(|s| {
            s.spawn(|| {
                // The fault: the script ran (it created the counter), its reply is held.
                let ran = eventually(Duration::from_secs(30), || get(&server, &name).is_some());
                cancel.cancel();
                proxy.reset();
                ran
            });
            m.acquire_blocking(&name, 1, &one, &cancel, None)
        });
        let err = out.expect_err("a cancelled acquire returned a lock");
        assert_eq!(err.kind(), ErrorKind::Cancelled, "{err:?}");
        assert!(
            get(&server, &name).is_some(),
            "the acquire never ran on the server"
        );
        assert_eq!(get(&server, &name).as_deref(), Some("1"), "the pool");
        let timeout_key = format!("{{{name}}}:timeout");
        assert_eq!(
            server.cmd::<i64>(&["ZCARD", &timeout_key]),
            0,
            "permit ids left"
        );
    });
}
