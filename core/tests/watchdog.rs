//! The watchdog keeps held locks alive, batches renewals, and tells the holder before the
//! deadline when it cannot. Serial: these pause servers and measure deadlines.

// Each #[tokio::test] runs its own runtime on its own thread, so holding the std mutex that
// serializes these tests across awaits blocks nothing but the test itself.
#![allow(clippy::await_holding_lock)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use ferrolock::{ErrorKind, LockStatus, LossReason};
use ferrolock_testbed::{Cluster, RedisServer};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread")]
async fn renewals_keep_a_three_second_lock_for_ten_seconds() {
    let _serial = serial();
    let server = RedisServer::start();
    // The node timeout is what a loaded machine must beat on every renewal: 400 ms, not the
    // default 200 (its loss margin, 800 ms, stays within one renewal period, 1 s).
    let m = manager(
        &[server.url()],
        opts()
            .watchdog(true)
            .ttl(Duration::from_secs(3))
            .node_timeout(ms(400)),
    );
    let lock = m.acquire("kept").await.unwrap();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(ms(250)).await;
        assert!(
            lock.is_held(),
            "lost after {:?}: {:?}",
            start.elapsed(),
            lock.status()
        );
        assert_eq!(
            get(&server, "kept").as_deref(),
            Some(lock.token()),
            "key gone after {:?}",
            start.elapsed()
        );
    }
    assert!(lock.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_holder_cut_off_from_the_majority_hears_before_its_deadline() {
    let _serial = serial();
    let cluster = Cluster::start(3);
    let m = watched(&cluster);
    let lock = m.acquire("cut-off").await.unwrap();
    let lost = lock.lost();
    cluster.servers[1].pause();
    cluster.servers[2].pause();
    let paused_at = Instant::now();
    // The last deadline a renewal could have set before the pause took hold.
    let reason = tokio::time::timeout(Duration::from_secs(10), lost)
        .await
        .expect("no lost signal")
        .expect("lost, not released");
    let heard_at = Instant::now();
    let deadline = lock.deadline();
    cluster.servers[1].resume();
    cluster.servers[2].resume();
    assert!(
        heard_at < deadline,
        "lost signal came {:?} after the deadline",
        heard_at - deadline
    );
    assert!(heard_at > paused_at, "signal before the fault");
    assert!(
        matches!(reason, LossReason::QuorumUnreachable { .. }),
        "{reason}"
    );
    assert!(matches!(lock.status(), LockStatus::Lost(_)));
    let err = lock.check().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockLost);
    assert!(err.message().contains("cut-off"), "{err}");
}

/// A manager whose locks the watchdog renews, with a loss signal due two node timeouts before
/// the deadline: 1 s of slack for a loaded machine's watchdog, less than one renewal period
/// (ttl/3).
fn watched(cluster: &Cluster) -> ferrolock::LockManager {
    manager(
        &cluster.urls(),
        opts()
            .watchdog(true)
            .ttl(Duration::from_secs(4))
            .node_timeout(ms(500)),
    )
}

/// A quorum lost to one dead node and one that forgot our token (a restart without
/// persistence): the loss names both, not only the dead one.
#[tokio::test(flavor = "multi_thread")]
async fn a_loss_names_the_node_that_forgot_the_token_beside_the_dead_one() {
    let _serial = serial();
    let mut cluster = Cluster::start(3);
    let m = watched(&cluster);
    let lock = m.acquire("forgotten").await.unwrap();
    let lost = lock.lost();
    cluster.servers[0].kill();
    let forgot: i64 = cluster.servers[1].cmd(&["DEL", "forgotten"]);
    assert_eq!(forgot, 1, "the key was there to forget");
    let reason = tokio::time::timeout(Duration::from_secs(10), lost)
        .await
        .expect("no lost signal")
        .expect("lost, not released");
    let text = reason.to_string();
    assert!(
        matches!(reason, LossReason::QuorumUnreachable { .. }),
        "{text}"
    );
    assert!(
        text.contains(&cluster.servers[0].url())
            && text.contains(&format!(
                "our token is gone (deleted, expired, or taken) on {}",
                cluster.servers[1].url()
            )),
        "{text}"
    );
}

/// The default restart guard widens to the longest ttl asked for; nodes up for less than it
/// then get no new grant, but a held lock's renewals still reach them (a renewal finds our
/// token or does nothing). Held back too, every lock on young nodes was lost as soon as one
/// acquire asked for a longer ttl.
#[tokio::test(flavor = "multi_thread")]
async fn a_widened_restart_guard_holds_back_grants_not_renewals() {
    let _serial = serial();
    let cluster = Cluster::start(3);
    let ttl = Duration::from_secs(2);
    // Up for more than the manager's ttl (uptime reads up to 1 s high), so that its grants
    // go through before the window widens.
    let uptime = |s: &RedisServer| info_number(s, "server", "uptime_in_seconds");
    while cluster
        .servers
        .iter()
        .any(|s| uptime(s) <= ttl.as_secs() + 1)
    {
        tokio::time::sleep(ms(200)).await;
    }
    let m = ferrolock::LockManager::new(
        ferrolock::ManagerOptions::new()
            .nodes(cluster.urls())
            .lock(opts().watchdog(true).ttl(ttl).wait(Some(Duration::ZERO))),
    )
    .unwrap();
    let held = m.acquire("young-held").await.unwrap();
    let long = m
        .acquire_with(
            "young-long",
            &opts()
                .ttl(Duration::from_secs(3600))
                .wait(Some(Duration::ZERO)),
        )
        .await
        .expect_err("nodes up for seconds may not grant an hour's lease");
    assert!(
        long.message().contains("restart guard's window of 3600s"),
        "the window did not widen: {long}"
    );
    // Three ttls: every renewal in them went to nodes the guard now holds back for grants.
    tokio::time::sleep(ttl * 3).await;
    assert!(held.is_held(), "{:?}", held.check());
    // On a quorum at least (a node still connecting when the window widened got no grant).
    let renewed = cluster
        .servers
        .iter()
        .filter(|s| {
            get(s, "young-held").as_deref() == Some(held.token()) && pttl(s, "young-held") > 0
        })
        .count();
    assert!(renewed >= 2, "held on {renewed} of 3 nodes");
    assert!(held.release().await.unwrap());
}

/// A semaphore's renewals wait for the restart guard, a lock's do not; renewed in the same
/// tick, each kind goes in a pipeline of its own. In one pipeline, a semaphore held back made
/// the lock renewed beside it miss its renewals too, and both were lost. One node (a semaphore
/// lives on one), restarted with its data, and a guard set: the node is held back for longer
/// than a ttl while every key is still there.
#[tokio::test(flavor = "multi_thread")]
async fn a_held_back_semaphore_does_not_hold_back_the_lock_renewed_beside_it() {
    let _serial = serial();
    let mut server = RedisServer::start_with(ferrolock_testbed::ServerOptions {
        persistence: true,
        ..Default::default()
    });
    let (ttl, window) = (Duration::from_secs(4), Duration::from_secs(8));
    // Up for longer than the window, so that it grants at first.
    let lock = opts().watchdog(true).ttl(ttl).wait(Some(Duration::ZERO));
    let m = guarded_manager_once_up(&server, server.url(), window, lock).await;
    // Taken together, so that their renewals fall due in the same ticks.
    let (held, permit) = tokio::join!(m.acquire("beside-held"), m.semaphore("beside-sem", 2));
    let (held, permit) = (held.unwrap(), permit.unwrap());
    server.cmd::<()>(&["SAVE"]);
    tokio::task::block_in_place(|| server.restart());
    assert_eq!(get(&server, "beside-held").as_deref(), Some(held.token()));
    // The fault happened: the restarted node held the semaphore's renewals back until it was
    // lost, with its keys still there.
    let reason = tokio::time::timeout(ttl * 2, permit.lost())
        .await
        .expect("the held-back semaphore is lost within two ttls")
        .expect("a loss reason");
    tokio::time::sleep(ttl).await;
    assert!(
        held.is_held(),
        "lost beside the semaphore ({reason}): {:?}",
        held.check()
    );
    assert!(held.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_key_is_lost_with_the_reason() {
    let _serial = serial();
    let server = RedisServer::start();
    // The next renewal (a period, ttl/3, away) finds the key gone: 2 s before the deadline.
    let m = manager(&[server.url()], opts().watchdog(true).ttl(ms(3_000)));
    let lock = m.acquire("deleted").await.unwrap();
    server.cmd::<()>(&["DEL", "deleted"]);
    let reason = tokio::time::timeout(Duration::from_secs(10), lock.lost())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(
            reason,
            LossReason::TokenGone {
                missing_on: 1,
                nodes: 1,
                ..
            }
        ),
        "{reason}"
    );
    assert!(Instant::now() < lock.deadline());
    assert_eq!(
        get(&server, "deleted"),
        None,
        "the watchdog must not re-create a deleted key"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_overwritten_key_is_lost_and_the_new_owner_is_untouched() {
    let _serial = serial();
    let cluster = Cluster::start(3);
    let m = manager(
        &cluster.urls(),
        opts().watchdog(true).ttl(Duration::from_secs(3)),
    );
    let lock = m.acquire("stolen").await.unwrap();
    for s in &cluster.servers[..2] {
        s.cmd::<()>(&["SET", "stolen", "thief", "PX", "60000"]);
    }
    let reason = tokio::time::timeout(Duration::from_secs(5), lock.lost())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(
            reason,
            LossReason::TokenGone {
                missing_on: 2,
                nodes: 3,
                ..
            }
        ),
        "{reason}"
    );
    for s in &cluster.servers[..2] {
        assert_eq!(get(s, "stolen").as_deref(), Some("thief"));
        assert!(
            pttl(s, "stolen") > 55_000,
            "the watchdog touched the new owner's ttl"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn max_hold_ends_the_hold() {
    let _serial = serial();
    let server = RedisServer::start();
    // Renewals every 800 ms, each with 350 ms to answer (the loss margin, 700 ms, within a
    // period), so that a loaded machine does not lose the lock for QuorumUnreachable first.
    let ttl = ms(2_400);
    let m = manager(
        &[server.url()],
        opts()
            .watchdog(true)
            .ttl(ttl)
            .node_timeout(ms(350))
            .max_hold(Some(ms(4_000))),
    );
    // max_hold counts from the start of the acquire.
    let start = Instant::now();
    let lock = m.acquire("bounded").await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(10), lock.lost())
        .await
        .unwrap()
        .unwrap();
    let held = start.elapsed();
    assert!(matches!(reason, LossReason::MaxHold { .. }), "{reason}");
    assert!(held >= ms(4_000), "ended early: {held:?}");
    assert!(held > ttl, "the watchdog did renew past one ttl");
    // No renewal after max_hold: the key expires within one ttl of the last renewal (one
    // still in flight at the signal included); renewals would keep it for good.
    tokio::time::sleep(ttl + ms(1_000)).await;
    assert_eq!(get(&server, "bounded"), None, "renewed after max_hold");
}

/// An extend never promises validity past `max_hold`, when the lock is declared lost whatever
/// its lease (an extend of 5 s on a lock with a max_hold of 0.5 s said 4.9 s were left).
#[tokio::test(flavor = "multi_thread")]
async fn an_extend_promises_no_validity_past_max_hold() {
    let _serial = serial();
    let server = RedisServer::start();
    let max_hold = ms(1_500);
    let m = manager(
        &[server.url()],
        opts()
            .watchdog(false)
            .ttl(ms(1_000))
            .max_hold(Some(max_hold)),
    );
    let lock = m.acquire("capped").await.unwrap();
    let validity = lock.extend_for(Duration::from_secs(5)).await.unwrap();
    assert!(
        validity <= max_hold,
        "extend said {validity:?} were left on a lock lost at max_hold={max_hold:?}"
    );
    let reason = tokio::time::timeout(Duration::from_secs(30), lock.lost())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(reason, LossReason::MaxHold { .. }), "{reason}");
}

/// The getters say what `max_hold` leaves, as an extend does: `validity()` counts no time past
/// it (it said the whole lease, 60 s, on a lock lost at 1.5 s), and once it is reached the
/// lock reads as lost for it, whoever looks first (the watchdog, or a getter).
#[tokio::test(flavor = "multi_thread")]
async fn the_getters_count_no_validity_past_max_hold() {
    let _serial = serial();
    let server = RedisServer::start();
    let max_hold = ms(1_500);
    for watchdog in [true, false] {
        let m = manager(
            &[server.url()],
            opts()
                .watchdog(watchdog)
                .ttl(Duration::from_secs(60))
                .node_timeout(Duration::from_secs(1))
                .max_hold(Some(max_hold)),
        );
        let key = format!("capped-getters-{watchdog}");
        let lock = m.acquire(&key).await.unwrap();
        let granted = Instant::now();
        assert!(lock.is_held());
        let validity = lock.validity();
        assert!(
            validity <= max_hold,
            "validity() said {validity:?} were left on a lock lost at max_hold={max_hold:?}"
        );
        // Past max_hold (counted from the acquire's start, before `granted`).
        tokio::time::sleep_until(granted + max_hold).await;
        assert!(!lock.is_held(), "held past max_hold");
        assert_eq!(lock.validity(), Duration::ZERO);
        assert!(
            matches!(lock.status(), LockStatus::Lost(LossReason::MaxHold { .. })),
            "{:?}",
            lock.status()
        );
        let e = lock.check().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::LockLost, "{e}");
        assert!(e.message().contains("max_hold=1.5s reached"), "{e}");
        // The key itself stays until its lease ends: nobody else takes it meanwhile.
        assert_eq!(get(&server, &key).as_deref(), Some(lock.token()));
        let _ = lock.release().await;
        assert_eq!(
            get(&server, &key),
            None,
            "a lost lock's token is released all the same"
        );
    }
}

/// With the watchdog off, max_hold still tells the holder; its words must not speak of a
/// watchdog that never ran (they said "the watchdog stopped renewing").
#[tokio::test(flavor = "multi_thread")]
async fn max_hold_with_the_watchdog_off_says_no_watchdog_stopped() {
    let _serial = serial();
    let server = RedisServer::start();
    let m = manager(
        &[server.url()],
        opts()
            .watchdog(false)
            .ttl(Duration::from_secs(60))
            .node_timeout(Duration::from_secs(5))
            .max_hold(Some(ms(1_000))),
    );
    let lock = m.acquire("bounded-off").await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(30), lock.lost())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(reason, LossReason::MaxHold { .. }), "{reason}");
    let said = reason.to_string();
    assert!(
        said.starts_with("lock \"bounded-off\" lost: max_hold=1s reached")
            && !said.contains("watchdog"),
        "{said}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn watchdog_off_tells_the_holder_before_the_ttl_runs_out() {
    let _serial = serial();
    let server = RedisServer::start();
    // Told two node timeouts (800 ms) before the deadline: slack for a loaded machine.
    let m = manager(
        &[server.url()],
        opts().watchdog(false).ttl(ms(3_000)).node_timeout(ms(400)),
    );
    let lock = m.acquire("unrenewed").await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(10), lock.lost())
        .await
        .unwrap()
        .unwrap();
    assert!(Instant::now() < lock.deadline());
    assert!(matches!(reason, LossReason::Expiring { .. }), "{reason}");
}

/// A watchdog-off lock nobody waits on is not handed to the watchdog: its status works the
/// `Expiring` loss out from the deadline, at the same moment the watchdog would have signalled
/// it (two node timeouts before the deadline), and a `lost()` asked for later still hears it.
/// (`watchdog_off_tells_the_holder_before_the_ttl_runs_out` covers a `lost()` asked for early.)
#[tokio::test(flavor = "multi_thread")]
async fn watchdog_off_status_reports_expiring_without_a_listener() {
    let _serial = serial();
    let server = RedisServer::start();
    let opts = opts().watchdog(false).ttl(ms(600));
    let m = manager(&[server.url()], opts.clone());
    let lock = m.acquire("unwatched").await.unwrap();
    let lose_at = lock.deadline() - opts.effective_node_timeout() * 2;
    tokio::time::sleep_until(lose_at).await;
    let status = lock.status();
    assert!(
        matches!(status, LockStatus::Lost(LossReason::Expiring { .. })),
        "{status:?}"
    );
    assert!(!lock.is_held());
    assert_eq!(lock.check().unwrap_err().kind(), ErrorKind::LockLost);
    assert_eq!(lock.validity(), Duration::ZERO);
    let reason = lock.lost().await.expect("lost, not released");
    assert!(matches!(reason, LossReason::Expiring { .. }), "{reason}");
    // Released all the same, and still reported as lost.
    lock.release().await.unwrap();
    assert!(matches!(lock.status(), LockStatus::Lost(_)));
}

#[tokio::test(flavor = "multi_thread")]
async fn release_resolves_lost_with_none() {
    let server = RedisServer::start();
    let m = manager(&[server.url()], opts().watchdog(true));
    let lock = m.acquire("released").await.unwrap();
    let lost = tokio::spawn(lock.lost());
    lock.release().await.unwrap();
    assert_eq!(lost.await.unwrap(), None);
    assert_eq!(lock.check().unwrap_err().kind(), ErrorKind::NotHeld);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_locks_are_renewed_in_batches_not_one_by_one() {
    let _serial = serial();
    let cluster = Cluster::start(3);
    // 1,000 locks, not the 10,000 of `make bench`'s watchdog row: whether a debug build on a
    // loaded machine renews 10,000 in time is a figure of the machine (it did not, under two
    // CPU hogs). Node timeout 900 ms (not 200; its loss margin stays within the 2 s period).
    let m = manager(
        &cluster.urls(),
        opts()
            .watchdog(true)
            .ttl(Duration::from_secs(6))
            .node_timeout(ms(900)),
    );
    let mut tasks = tokio::task::JoinSet::new();
    for chunk in 0..10 {
        let m = m.clone();
        tasks.spawn(async move {
            let mut locks = Vec::with_capacity(100);
            for i in 0..100 {
                locks.push(m.acquire(&format!("many:{chunk}:{i}")).await.unwrap());
            }
            locks
        });
    }
    let locks: Vec<_> = tasks.join_all().await.into_iter().flatten().collect();
    assert_eq!(locks.len(), 1_000);
    tokio::time::sleep(Duration::from_secs(3)).await; // the first renewals align the batch
    let before = m.round_trips();
    let window = Duration::from_secs(6); // three periods of ttl/3
    tokio::time::sleep(window).await;
    let after = m.round_trips();
    for (node, (b, a)) in before.iter().zip(&after).enumerate() {
        let trips = a - b;
        // Batched, not one by one: 1,000 renewals one by one would be 3,000 round trips in
        // the window. Three ticks when every lock joined one batch; when acquiring the 1,000
        // took long (a loaded machine), their renewals fall due at several times, a tick each,
        // so the bound is a count far below one per renewal, not the healthy figure (`make
        // bench` reports round trips per tick: 1).
        assert!(
            (1..=60).contains(&trips),
            "node {node}: {trips} round trips in {window:?}"
        );
    }
    for s in &cluster.servers {
        let ttl: i64 = pttl(s, "many:9:99");
        assert!(
            ttl > 1_500,
            "last lock not renewed: PTTL {ttl}, {:?}",
            locks[999].status()
        );
        let ttl: i64 = pttl(s, "many:0:0");
        assert!(
            ttl > 1_500,
            "first lock not renewed: PTTL {ttl}, {:?}",
            locks[0].status()
        );
    }
    assert!(locks.iter().all(|l| l.is_held()));
    drop(Arc::new(locks));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_held_lock_is_renewed_every_third_of_its_ttl_not_more_often() {
    let _serial = serial();
    let server = RedisServer::start();
    // ttl 4 s: its third (1.33 s) is longer than the watchdog's idle wake-up (1 s), which
    // used to renew any lock due within half a period, so every second here.
    let ttl = Duration::from_secs(4);
    let m = manager(
        &[server.url()],
        opts().watchdog(true).ttl(ttl).node_timeout(ms(400)),
    );
    let lock = m.acquire("counted").await.unwrap();
    // The plain acquire is a SET NX; every script call from here on is a renewal.
    let scripts = || calls(&server, "evalsha") + calls(&server, "eval");
    let before = tokio::task::block_in_place(scripts);
    tokio::time::sleep(ttl * 4).await;
    let renewals = tokio::task::block_in_place(scripts) - before;
    assert!(lock.is_held(), "{:?}", lock.status());
    // A count, not a speed: a slow machine renews later, never more often. At least one per
    // ttl, or the lock would have expired.
    assert!(
        (4..=12).contains(&renewals),
        "{renewals} renewals of one lock in 4 ttl (3 per ttl expected)"
    );
    assert!(lock.release().await.unwrap());
}

/// A renewal that fails (its node paused past the node timeout) is tried again after its retry
/// pause, within the validity left, and the retry keeps the lock. The failed renewal asked the
/// watchdog to wake for the retry while it still counted as in flight, which left the retry
/// out of the wake-up: with a ttl under the watchdog's idle wake-up (1 s) beside its loss
/// margin, nothing woke the watchdog before the loss deadline, and a lock whose node was back
/// well in time was declared lost without a single retry.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_renewal_is_retried_before_the_loss_deadline() {
    let _serial = serial();
    let server = RedisServer::start();
    let key = unique_key("retried-renewal");
    let counts = || {
        ferrolock::metrics::snapshot()
            .get(ferrolock::metrics::prefix_of(&key))
            .map_or((0, 0), |p| (p.renewals, p.renewal_failures))
    };
    // ttl 1.5 s, default node timeout 150 ms: the first renewal at 500 ms, a retry 150 ms after
    // a failure, the loss deadline (deadline - 2 × node timeout) at about 1.18 s: room for
    // two retries after the first renewal times out.
    let m = manager(&[server.url()], opts().watchdog(true).ttl(ms(1500)));
    let lock = m.acquire(&key).await.unwrap();
    tokio::task::block_in_place(|| server.pause());
    // Resumed once the first renewal has failed (a deadline bounds the wait, not a speed).
    while counts().1 == 0 {
        assert!(
            Instant::now() < lock.deadline(),
            "no failed renewal before the deadline: {:?}",
            lock.status()
        );
        tokio::time::sleep(ms(5)).await;
    }
    tokio::task::block_in_place(|| server.resume());
    assert_eq!(counts().0, 0, "renewed while the node was paused?");
    // The node answers again long before the loss deadline: a retry renews the lock.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        assert_eq!(
            lock.status(),
            LockStatus::Held,
            "lost after {:?} renewals and {:?} failures",
            counts().0,
            counts().1
        );
        tokio::time::sleep(ms(50)).await;
    }
    assert!(counts().0 >= 1, "held without a renewal?");
    assert!(lock.release().await.unwrap());
}

/// One paused node of three must not cost a lock its renewals while the other two answer at
/// once, whatever else is renewed in the same batch. A lock with a short node timeout joined
/// the batch of a lock with a long one, and the batch waited for the paused node for the long
/// node timeout: past the short lock's loss deadline.
#[tokio::test(flavor = "multi_thread")]
async fn a_paused_node_does_not_lose_a_short_lock_renewed_beside_a_long_one() {
    let _serial = serial();
    let cluster = Cluster::start(3);
    let m = manager(&cluster.urls(), opts().watchdog(true));
    // Renewed every second (or from 500 ms, joining a batch), declared lost about 2.5 s after
    // a confirmation: about 1.5 s for each renewal to be confirmed (a node timeout of 200 ms,
    // not less: a loaded machine's healthy node must answer within it) by two nodes of three.
    let short = m
        .acquire_with(
            "short",
            &opts().watchdog(true).ttl(ms(3000)).node_timeout(ms(200)),
        )
        .await
        .unwrap();
    // Its renewals may wait 3 s for a node; it joins the short lock's batches from 4 s on.
    let long = m
        .acquire_with(
            "long",
            &opts()
                .watchdog(true)
                .ttl(Duration::from_secs(24))
                .node_timeout(ms(3000)),
        )
        .await
        .unwrap();
    tokio::task::block_in_place(|| cluster.servers[2].pause());
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(12) {
        tokio::time::sleep(ms(50)).await;
        assert_eq!(
            short.status(),
            LockStatus::Held,
            "the short lock was lost {:?} after the pause, two nodes of three up",
            start.elapsed()
        );
    }
    assert_eq!(long.status(), LockStatus::Held);
    tokio::task::block_in_place(|| cluster.servers[2].resume());
    assert!(short.release().await.unwrap());
    assert!(long.release().await.unwrap());
}
