//! Issue 4: what the watchdog costs for many held locks.
//!
//! One manager holds `--locks` (10,000) locks on distinct keys with the watchdog on and a short
//! ttl, so it renews all of them every ttl/3. Over a window of several renewal ticks we take:
//! - the bench process's CPU time (getrusage, every thread), minus an idle baseline measured
//!   first over the same kind of window with no locks held;
//! - the manager's own round-trip counters (`LockManager::round_trips`, one per request or
//!   pipeline per node), which must grow by one per node per tick whatever the number of locks;
//! - on each node, `INFO commandstats` EVALSHA calls (the renewal is a compare-and-raise
//!   script), which count renewals independently of the client, and the redis-servers' CPU
//!   (/proc/PID/stat) as the server-side price.
//!
//! The window starts and ends half a renewal period after a tick, so no batch straddles it.

use std::time::{Duration, Instant};

use ferrolock::{Lock, LockManager, LockOptions, ManagerOptions};
use futures::{StreamExt, TryStreamExt};
use redis::aio::MultiplexedConnection;

use crate::affinity::Placement;
use crate::clock::{clock_ticks_per_sec, process_cpu};
use crate::report::{Align, Section, Table, thousands};
use crate::{BoxResult, Ctx, machine};

/// Renewal period = ttl/3 = 1 s.
const TTL: Duration = Duration::from_secs(3);
/// Renewal ticks in the measured window.
const WINDOW_TICKS: u32 = 4;
/// After the last acquire: time for locks acquired at different moments to fall into one batch.
const SETTLE_TICKS: u32 = 2;
const BASELINE: Duration = Duration::from_secs(2);
/// Acquires in flight while the locks are being taken.
const ACQUIRE_CONCURRENCY: usize = 128;

struct Measured {
    nodes: usize,
    locks: usize,
    acquire_secs: f64,
    window: Duration,
    /// Per node: the manager's round trips in the window.
    round_trips: Vec<u64>,
    /// Per node: EVALSHA calls (renewals) in the window, from INFO commandstats.
    evalsha: Vec<u64>,
    cpu: Duration,
    /// Sum over the nodes of their CPU time in the window.
    server_cpu: Duration,
    held_after: usize,
}

impl Measured {
    /// Renewal rounds in the window: renewals on node 0 / locks.
    fn ticks(&self) -> f64 {
        self.evalsha.first().copied().unwrap_or(0) as f64 / self.locks as f64
    }
}

async fn evalsha_calls(conns: &mut [MultiplexedConnection]) -> BoxResult<Vec<u64>> {
    let mut out = Vec::new();
    for c in conns {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(c)
            .await?;
        let calls = info
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        out.push(calls);
    }
    Ok(out)
}

fn servers_cpu(pids: &[u32]) -> Duration {
    let ticks: u64 = pids
        .iter()
        .map(|p| machine::process_ticks(&p.to_string()))
        .sum();
    Duration::from_secs_f64(ticks as f64 / clock_ticks_per_sec() as f64)
}

async fn measure(urls: &[String], pids: &[u32], locks: usize) -> BoxResult<Measured> {
    let opts = LockOptions::default().ttl(TTL).watchdog(true);
    let manager = LockManager::new(
        ManagerOptions::new()
            .nodes(urls.to_vec())
            .restart_guard(Duration::ZERO)
            .lock(opts.clone()),
    )?;
    let mut info = Vec::new();
    for url in urls {
        info.push(
            redis::Client::open(url.as_str())?
                .get_multiplexed_async_connection()
                .await?,
        );
    }
    let n = urls.len();
    let started = Instant::now();
    let held: Vec<Lock> = futures::stream::iter(0..locks)
        .map(|i| {
            let (manager, opts) = (&manager, &opts);
            async move {
                manager
                    .acquire_with(&format!("ferrolock-bench:watchdog:{n}:{i}"), opts)
                    .await
            }
        })
        .buffer_unordered(ACQUIRE_CONCURRENCY)
        .try_collect()
        .await?;
    let acquire_secs = started.elapsed().as_secs_f64();
    let period = TTL / 3;
    tokio::time::sleep(period * SETTLE_TICKS).await;

    // Align on a tick: wait until the round-trip counters move, then half a period more.
    let before = manager.round_trips();
    let give_up = Instant::now() + period * 3;
    while manager.round_trips() == before {
        if Instant::now() > give_up {
            return Err(format!("{n} node(s): no renewal tick within {:?}", period * 3).into());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    tokio::time::sleep(period / 2).await;

    let rt0 = manager.round_trips();
    let ev0 = evalsha_calls(&mut info).await?;
    let srv0 = servers_cpu(pids);
    let cpu0 = process_cpu();
    let t0 = Instant::now();
    tokio::time::sleep(period * WINDOW_TICKS).await;
    let cpu1 = process_cpu();
    let window = t0.elapsed();
    let srv1 = servers_cpu(pids);
    let ev1 = evalsha_calls(&mut info).await?;
    let rt1 = manager.round_trips();

    let held_after = held.iter().filter(|l| l.is_held()).count();
    futures::stream::iter(held)
        .map(|l| async move { l.release().await })
        .buffer_unordered(ACQUIRE_CONCURRENCY)
        .try_collect::<Vec<bool>>()
        .await?;
    // The INFO calls of this window went over our own connections, not the manager's.
    Ok(Measured {
        nodes: n,
        locks,
        acquire_secs,
        window,
        round_trips: rt1.iter().zip(&rt0).map(|(a, b)| a - b).collect(),
        evalsha: ev1
            .iter()
            .zip(&ev0)
            .map(|(a, b)| a.saturating_sub(*b))
            .collect(),
        cpu: cpu1.saturating_sub(cpu0),
        server_cpu: srv1.saturating_sub(srv0),
        held_after,
    })
}

pub fn run(ctx: &Ctx) -> BoxResult<Section> {
    // CPU time does not depend much on placement; one pass, where the scheduler decides.
    let runtime = ctx.enter(Placement::Unpinned)?;
    let locks = ctx.locks;
    eprintln!(
        "watchdog: idle baseline {:?}, then {locks} locks, ttl {:?}",
        BASELINE, TTL
    );
    let c0 = process_cpu();
    let t0 = Instant::now();
    runtime.block_on(async { tokio::time::sleep(BASELINE).await });
    let idle_per_sec = process_cpu().saturating_sub(c0).as_secs_f64() / t0.elapsed().as_secs_f64();

    let mut results = Vec::new();
    for n in ctx.node_counts(&[1, 3]) {
        eprintln!("watchdog: nodes={n}: {locks} locks, {WINDOW_TICKS} ticks measured");
        let pids: Vec<u32> = ctx.server_pids().into_iter().take(n).collect();
        results.push(runtime.block_on(measure(&ctx.urls(n), &pids, locks))?);
    }
    Ok(section(&results, idle_per_sec))
}

fn section(results: &[Measured], idle_per_sec: f64) -> Section {
    let mut table = Table::new(&[
        ("nodes", Align::Right),
        ("locks", Align::Right),
        ("held after", Align::Right),
        ("ticks", Align::Right),
        ("renewals/lock/ttl", Align::Right),
        ("renewals/s", Align::Right),
        ("round trips/tick/node", Align::Right),
        ("client CPU ms/tick", Align::Right),
        ("client CPU µs/renewal", Align::Right),
        ("client CPU %", Align::Right),
        ("servers CPU ms/tick", Align::Right),
    ])
    .caption(
        "**Watchdog** — renewals/lock/ttl: renewals of one lock per ttl (3 as documented: every \
         ttl/3); renewals/s: locks renewed per second (each renewal is one compare-and-raise on \
         every node); round trips/tick/node: the manager's own counters over the renewal rounds seen \
         by the servers (min–max over nodes); client CPU: the bench process minus its idle baseline; \
         servers CPU: all nodes together (/proc, 10 ms resolution).",
    );
    let mut notes = Vec::new();
    let mut verdicts = Vec::new();
    let mut bullets = Vec::new();
    for m in results {
        let ticks = m.ticks();
        let secs = m.window.as_secs_f64();
        let cpu_ms = (m.cpu.as_secs_f64() - idle_per_sec * secs).max(0.0) * 1e3;
        let per_tick = |x: f64| if ticks > 0.0 { x / ticks } else { f64::NAN };
        let rts: Vec<f64> = m.round_trips.iter().map(|&r| per_tick(r as f64)).collect();
        let rt_min = rts.iter().copied().fold(f64::INFINITY, f64::min);
        let rt_max = rts.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let renewals = m.evalsha.first().copied().unwrap_or(0) as f64;
        table.row(vec![
            m.nodes.to_string(),
            thousands(m.locks as f64),
            thousands(m.held_after as f64),
            format!("{ticks:.2}"),
            format!("{:.2}", ticks / (secs / TTL.as_secs_f64())),
            thousands(renewals / secs),
            if (rt_max - rt_min).abs() < 0.005 {
                format!("{rt_min:.2}")
            } else {
                format!("{rt_min:.2}–{rt_max:.2}")
            },
            format!("{:.1}", per_tick(cpu_ms)),
            format!("{:.2}", cpu_ms * 1e3 / renewals.max(1.0)),
            format!("{:.1}", cpu_ms / 10.0 / secs),
            format!("{:.0}", per_tick(m.server_cpu.as_secs_f64() * 1e3)),
        ]);
        let uneven = m.evalsha.iter().any(|&e| e != m.evalsha[0]);
        if uneven {
            bullets.push(format!(
                "- {} node(s): EVALSHA calls differ between nodes in the window: {:?}.",
                m.nodes, m.evalsha
            ));
        }
        bullets.push(format!(
            "- {} node(s): {} locks acquired in {:.2} s ({} in flight at a time); window {:.2} s.",
            m.nodes,
            thousands(m.locks as f64),
            m.acquire_secs,
            ACQUIRE_CONCURRENCY,
            secs
        ));
        let one_rt = rt_max <= 1.0 + 1e-9 && ticks >= 1.0;
        verdicts.push(format!(
            "{} node(s): {}",
            m.nodes,
            if one_rt && m.held_after == m.locks {
                "one round trip per node per tick, every lock still held: **met**".to_string()
            } else {
                format!(
                    "**missed** ({rt_max:.2} round trips/tick/node, {} of {} held)",
                    m.held_after, m.locks
                )
            }
        ));
    }
    notes.push(format!(
        "Target (issue 4): 10,000 held locks cost one round trip per node per tick. {}.",
        verdicts.join("; ")
    ));
    bullets.push(format!(
        "- idle baseline of the bench process: {:.2} ms CPU per second.",
        idle_per_sec * 1e3
    ));
    notes.push(bullets.join("\n"));
    Section {
        title: "Watchdog cost (issue 4)".to_string(),
        intro: vec![format!(
            "One `LockManager` on a current-thread tokio runtime holds {} locks on distinct keys, ttl {} s \
             (renewed every {} ms), restart guard off. After {SETTLE_TICKS} periods to let every lock join one \
             batch, the window runs {WINDOW_TICKS} periods, from half a period after a tick; the bench thread \
             only sleeps in it, so its CPU time is the watchdog's. Unpinned.",
            thousands(results.first().map_or(0, |m| m.locks) as f64),
            TTL.as_secs(),
            (TTL / 3).as_millis()
        )],
        tables: vec![table],
        notes,
    }
}
