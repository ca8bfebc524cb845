//! Issue 5: several processes contending for one key.
//!
//! The bench spawns `--workers` (4) copies of itself as worker processes (the hidden first
//! argument `__contention-worker`). Each one builds its own `LockManager` with the core's
//! default waiting (push wake-ups, the waiter queue, the retry delay as a fallback), and from a
//! common start instant loops for `--duration`: acquire the key, run a tiny critical section (a
//! non-atomic GET + SET increment of a counter on a separate redis-server), release. Every
//! section logs four CLOCK_MONOTONIC timestamps (system-wide on Linux, so they compare across
//! processes): acquire called, granted, section done (release called), release returned.
//!
//! With 3 nodes the scenario also runs with one node paused (SIGSTOP for the whole run,
//! SIGCONT after it; issue 13): a quorum is still up, so the lock should keep most of the
//! healthy throughput; the row sits beside the healthy one.
//!
//! From the merged logs: sections/s, fairness between processes, the wait of each acquire, the
//! hand-off latency from one process's release to the next grant in another process, and two
//! exclusion checks (no two [granted, section done] intervals overlap; the counter is exact).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ferrolock::{LockManager, ManagerOptions};
use ferrolock_testbed::RedisServer;

use crate::affinity::Placement;
use crate::clock::mono_ns;
use crate::report::{Align, Section, Table, thousands};
use crate::stats::percentile_sorted;
use crate::{BoxResult, Ctx};

pub const WORKER_ARG: &str = "__contention-worker";
/// The critical section of the read-write lock and semaphore scenarios (bench/src/rw.rs): long
/// enough that the 2 CPUs are not the limit, so the figures show how many holders overlap.
const SLEEP_SECTION: Duration = Duration::from_millis(1);

/// What the workers hold and do in their critical section.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The lock, around a non-atomic GET + SET of a counter (issue 5).
    Counter,
    /// The lock, around a 1 ms sleep.
    Exclusive,
    /// The read-write lock, `reads` % of the sections on its read side, around a 1 ms sleep.
    ReadMostly { reads: u32 },
    /// One permit of a semaphore of `permits`, around a 1 ms sleep.
    Semaphore { permits: u32 },
}

impl Kind {
    /// The worker argument, also what the Java worker (tests/redisson, `Bench`) takes for the
    /// read-write lock and the semaphore.
    pub(crate) fn arg(self) -> String {
        match self {
            Kind::Counter => "counter".into(),
            Kind::Exclusive => "lock".into(),
            Kind::ReadMostly { reads } => format!("rw:{reads}"),
            Kind::Semaphore { permits } => format!("sem:{permits}"),
        }
    }

    fn parse(arg: &str) -> BoxResult<Kind> {
        let number = |v: &str| {
            v.parse::<u32>()
                .map_err(|e| format!("{WORKER_ARG}: bad kind {arg:?}: {e}"))
        };
        Ok(match arg.split_once(':') {
            None if arg == "counter" => Kind::Counter,
            None if arg == "lock" => Kind::Exclusive,
            Some(("rw", v)) => Kind::ReadMostly { reads: number(v)? },
            Some(("sem", v)) => Kind::Semaphore {
                permits: number(v)?,
            },
            _ => return Err(format!("{WORKER_ARG}: unknown kind {arg:?}").into()),
        })
    }
}

/// What a section held (the last column of a worker's log).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    Exclusive = 0,
    Read = 1,
    Write = 2,
    Permit = 3,
}

impl Side {
    fn parse(v: u64) -> Option<Side> {
        [Side::Exclusive, Side::Read, Side::Write, Side::Permit]
            .into_iter()
            .find(|s| *s as u64 == v)
    }
}

/// A small per-process generator for the read/write mix (no crate for one coin flip).
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}
/// Time the workers get to start and connect before the common start instant.
const START_DELAY: Duration = Duration::from_millis(700);
/// The same with a node paused: a worker's warm-up waits for that node's timeouts.
const START_DELAY_PAUSED: Duration = Duration::from_millis(2_000);
/// The node count that is also measured with one node paused.
const PAUSED_ROW_NODES: usize = 3;
/// Issue 5: 10x better than python-redis-lock's 0.14 s.
const TARGET_WORST_WAIT: Duration = Duration::from_millis(14);

/// One critical section, as logged by a worker: nanoseconds on CLOCK_MONOTONIC.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rec {
    pub(crate) worker: usize,
    /// acquire called
    pub(crate) t0: u64,
    /// granted
    pub(crate) t1: u64,
    /// section done, release called
    pub(crate) t2: u64,
    /// release returned
    pub(crate) t3: u64,
    /// the release found the lock still ours
    pub(crate) released: bool,
    /// Requests the acquire sent, per node (the manager's round-trip counters): attempts.
    pub(crate) attempts: u64,
    /// Time this worker spent runnable but not running (waiting for a CPU) from just before
    /// the acquire to just after the release, from /proc/thread-self/schedstat.
    pub(crate) runq: u64,
    pub(crate) side: Side,
}

/// Nanoseconds the calling thread has waited on a run queue so far (0 when unknown).
fn run_delay_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// Worker entry point: `__contention-worker <nodes,csv> <counter url> <key> <counter key>
/// <start ns> <end ns> <out file> <kind>`.
pub fn worker(args: &[String]) -> BoxResult<()> {
    let [nodes, counter_url, key, counter_key, start, end, out, kind] = args else {
        return Err(format!("{WORKER_ARG}: expected 8 arguments, got {args:?}").into());
    };
    let kind = Kind::parse(kind)?;
    let mut coin = XorShift(0x9e37_79b9_7f4a_7c15 ^ u64::from(std::process::id()));
    let nodes: Vec<String> = nodes.split(',').map(str::to_string).collect();
    let start: u64 = start.parse()?;
    let end: u64 = end.parse()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let recs = runtime.block_on(async {
        let manager = LockManager::new(
            ManagerOptions::new()
                .nodes(nodes)
                .restart_guard(Duration::ZERO),
        )?;
        let mut counter = redis::Client::open(counter_url.as_str())?
            .get_multiplexed_async_connection()
            .await?;
        // Connect to every node (and load the scripts) before the start.
        let warm_key = format!("{key}:warmup:{}", std::process::id());
        let warm = match kind {
            Kind::Semaphore { permits } => manager.semaphore(&warm_key, permits).await?,
            _ => manager.acquire(&warm_key).await?,
        };
        warm.release().await?;
        let now = mono_ns();
        if start > now {
            tokio::time::sleep(Duration::from_nanos(start - now)).await;
        }
        let n = manager.node_names().len() as u64;
        let mut recs: Vec<[u64; 8]> = Vec::with_capacity(16_384);
        while mono_ns() < end {
            let q0 = run_delay_ns();
            let rt0: u64 = manager.round_trips().iter().sum();
            let side = match kind {
                Kind::Counter | Kind::Exclusive => Side::Exclusive,
                Kind::ReadMostly { reads } if coin.below(100) < u64::from(reads) => Side::Read,
                Kind::ReadMostly { .. } => Side::Write,
                Kind::Semaphore { .. } => Side::Permit,
            };
            let t0 = mono_ns();
            let lock = match (kind, side) {
                (Kind::Semaphore { permits }, _) => manager.semaphore(key, permits).await?,
                (_, Side::Read) => manager.read_lock(key).await?,
                (_, Side::Write) => manager.write_lock(key).await?,
                _ => manager.acquire(key).await?,
            };
            let t1 = mono_ns();
            let rt1: u64 = manager.round_trips().iter().sum();
            if kind == Kind::Counter {
                let v: Option<i64> = redis::cmd("GET")
                    .arg(counter_key)
                    .query_async(&mut counter)
                    .await?;
                let () = redis::cmd("SET")
                    .arg(counter_key)
                    .arg(v.unwrap_or(0) + 1)
                    .query_async(&mut counter)
                    .await?;
            } else {
                // A blocking sleep, as the Java worker's Thread.sleep (tokio's timer rounds
                // up to its next millisecond tick); the manager runs on its own runtime.
                std::thread::sleep(SLEEP_SECTION);
            }
            let t2 = mono_ns();
            let released = lock.release().await?;
            let t3 = mono_ns();
            let q1 = run_delay_ns();
            recs.push([
                t0,
                t1,
                t2,
                t3,
                released as u64,
                (rt1 - rt0).div_ceil(n),
                q1.saturating_sub(q0),
                side as u64,
            ]);
        }
        BoxResult::Ok(recs)
    })?;
    let text: String = recs
        .iter()
        .map(|r| {
            let cells: Vec<String> = r.iter().map(u64::to_string).collect();
            cells.join(" ") + "\n"
        })
        .collect();
    std::fs::write(out, text)?;
    Ok(())
}

/// A worker's log: ours, or the Java worker's (tests/redisson, `Bench`) in the same format.
fn read_recs(path: &Path, worker: usize) -> BoxResult<Vec<Rec>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("worker {worker}: cannot read {}: {e}", path.display()))?;
    let mut out = Vec::new();
    for line in text.lines() {
        let v: Vec<u64> = line
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        let (&[t0, t1, t2, t3, released, attempts, runq, _], Some(side)) =
            (&v[..], v.get(7).copied().and_then(Side::parse))
        else {
            return Err(format!("worker {worker}: bad line {line:?}").into());
        };
        out.push(Rec {
            worker,
            t0,
            t1,
            t2,
            t3,
            released: released == 1,
            attempts,
            runq,
            side,
        });
    }
    Ok(out)
}

/// Waits for a child, killing it (by its own pid) if it overstays.
fn wait_child(child: &mut Child, deadline: Instant) -> BoxResult<()> {
    loop {
        if let Some(status) = child.try_wait()? {
            return if status.success() {
                Ok(())
            } else {
                Err(format!("worker pid {} exited with {status}", child.id()).into())
            };
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("worker pid {} did not finish in time; killed", child.id()).into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(crate) struct Outcome {
    /// The row's name instead of its node count (e.g. a cluster's).
    label: Option<String>,
    nodes: usize,
    /// Nodes paused (SIGSTOP) for the whole run.
    paused: usize,
    workers: usize,
    duration: Duration,
    recs: Vec<Rec>,
    counter: i64,
}

/// One configuration: `n` nodes, the last one paused for the whole run when `paused`.
fn run_config(
    ctx: &Ctx,
    counter: &RedisServer,
    n: usize,
    paused: bool,
    dir: &Path,
) -> BoxResult<Outcome> {
    let urls = ctx.urls(n);
    let name = if paused {
        format!("{n}-paused")
    } else {
        n.to_string()
    };
    let key = format!("ferrolock-bench:contention:{name}");
    let counter_key = format!("ferrolock-bench:counter:{name}");
    let _: i64 = counter.cmd(&["DEL", &counter_key]);
    let start_delay = if paused {
        START_DELAY_PAUSED
    } else {
        START_DELAY
    };
    let stopped = if paused {
        let node = ctx.server(n - 1);
        node.pause();
        Some(node)
    } else {
        None
    };
    let outcome = run_workers(ctx, counter, &urls, &key, &counter_key, start_delay, dir);
    if let Some(node) = stopped {
        node.resume();
    }
    let (recs, count) = outcome?;
    Ok(Outcome {
        label: None,
        nodes: n,
        paused: usize::from(paused),
        workers: ctx.workers,
        duration: ctx.duration,
        recs,
        counter: count,
    })
}

/// One contended configuration on `urls` (e.g. a cluster's one URL), its row named `label`;
/// the workers count a critical section on `counter`.
pub(crate) fn run_labelled(
    ctx: &Ctx,
    counter: &RedisServer,
    urls: &[String],
    label: &str,
    dir: &Path,
) -> BoxResult<Outcome> {
    let key = format!("ferrolock-bench:contention:{label}");
    let counter_key = format!("ferrolock-bench:counter:{label}");
    let _: i64 = counter.cmd(&["DEL", &counter_key]);
    let (recs, counter) = run_workers(ctx, counter, urls, &key, &counter_key, START_DELAY, dir)?;
    Ok(Outcome {
        label: Some(label.to_string()),
        nodes: urls.len(),
        paused: 0,
        workers: ctx.workers,
        duration: ctx.duration,
        recs,
        counter,
    })
}

/// Spawns the workers, waits for them and merges their logs; the counter's final value.
fn run_workers(
    ctx: &Ctx,
    counter: &RedisServer,
    urls: &[String],
    key: &str,
    counter_key: &str,
    start_delay: Duration,
    dir: &Path,
) -> BoxResult<(Vec<Rec>, i64)> {
    let (kind, workers) = (Kind::Counter, ctx.workers);
    let recs = spawn_workers(
        ctx,
        counter,
        urls,
        (key, counter_key),
        start_delay,
        dir,
        (kind, workers),
    )?;
    let got: Option<String> = counter.cmd(&["GET", counter_key]);
    Ok((recs, got.and_then(|v| v.parse().ok()).unwrap_or(0)))
}

/// `workers` worker processes holding `keys.0` as `kind` for `ctx.duration` from `start_delay`
/// on (the counter key `keys.1` is used by `Kind::Counter` only); their merged logs.
pub(crate) fn spawn_workers(
    ctx: &Ctx,
    counter: &RedisServer,
    urls: &[String],
    (key, counter_key): (&str, &str),
    start_delay: Duration,
    dir: &Path,
    (kind, workers): (Kind, usize),
) -> BoxResult<Vec<Rec>> {
    let n = urls.len();
    let exe = std::env::current_exe()?;
    let start = mono_ns() + start_delay.as_nanos() as u64;
    let end = start + ctx.duration.as_nanos() as u64;
    let mut children = Vec::new();
    let mut files = Vec::new();
    for w in 0..workers {
        let out: PathBuf = dir.join(format!("worker-{n}-{}-{w}.log", key.len()));
        let _ = std::fs::remove_file(&out);
        let child = Command::new(&exe)
            .arg(WORKER_ARG)
            .arg(urls.join(","))
            .arg(counter.url())
            .arg(key)
            .arg(counter_key)
            .arg(start.to_string())
            .arg(end.to_string())
            .arg(&out)
            .arg(kind.arg())
            .stdin(Stdio::null())
            .spawn()?;
        children.push(child);
        files.push(out);
    }
    let deadline = Instant::now() + start_delay + ctx.duration + Duration::from_secs(60);
    collect(&mut children, &files, deadline)
}

/// Waits for the workers (killing those still running at `deadline`) and merges their logs
/// `files` (worker i's in `files[i]`), in grant order.
pub(crate) fn collect(
    children: &mut [Child],
    files: &[PathBuf],
    deadline: Instant,
) -> BoxResult<Vec<Rec>> {
    let mut failures = Vec::new();
    for c in children.iter_mut() {
        if let Err(e) = wait_child(c, deadline) {
            failures.push(e.to_string());
        }
    }
    if !failures.is_empty() {
        return Err(failures.join("; ").into());
    }
    let mut recs = Vec::new();
    for (w, f) in files.iter().enumerate() {
        recs.extend(read_recs(f, w)?);
        let _ = std::fs::remove_file(f);
    }
    recs.sort_by_key(|r| r.t1);
    Ok(recs)
}

pub fn run(ctx: &Ctx) -> BoxResult<Section> {
    // Several processes on 2 CPUs: pinning them all to one CPU would measure the scheduler.
    drop(ctx.enter(Placement::Unpinned)?);
    let counter = RedisServer::start();
    let dir = std::env::temp_dir().join(format!("ferrolock-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut outcomes = Vec::new();
    let result = (|| {
        for n in ctx.node_counts(&[1, 3, 5]) {
            // The paused row right after the healthy one with as many nodes.
            let modes: &[bool] = if n == PAUSED_ROW_NODES {
                &[false, true]
            } else {
                &[false]
            };
            for &paused in modes {
                eprintln!(
                    "contention: nodes={n}{}: {} worker processes for {:?}",
                    if paused { " (one paused)" } else { "" },
                    ctx.workers,
                    ctx.duration
                );
                outcomes.push(run_config(ctx, &counter, n, paused, &dir)?);
            }
        }
        BoxResult::Ok(())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result?;
    Ok(section(&outcomes))
}

impl Outcome {
    /// The row's node column: `3`, or `3, 1 paused`.
    fn nodes_label(&self) -> String {
        if let Some(label) = &self.label {
            label.clone()
        } else if self.paused == 0 {
            self.nodes.to_string()
        } else {
            format!("{}, {} paused", self.nodes, self.paused)
        }
    }
}

fn ms(ns: u64) -> String {
    format!("{:.2}", ns as f64 / 1e6)
}

fn us_signed(ns: i64) -> String {
    format!("{:.0}", ns as f64 / 1e3)
}

struct Summary {
    sections: usize,
    per_sec: f64,
    per_worker: Vec<usize>,
    waits: Vec<u64>,
    /// release called -> next grant, hand-offs to another process only
    handoff_from_call: Vec<u64>,
    /// release returned -> next grant (may be negative: the grant can land first)
    handoff_from_done: Vec<i64>,
    handoffs_other: usize,
    handoffs_total: usize,
    overlaps: usize,
    lost_releases: usize,
    /// Sorted durations of the critical sections (granted -> release called).
    held: Vec<u64>,
    worst: Option<WorstWait>,
    /// Mean requests per node per acquire.
    attempts: f64,
    /// Share of the workers' loop time spent waiting for a CPU.
    runq_share: f64,
}

/// Where the longest wait went.
struct WorstWait {
    wait: u64,
    worker: usize,
    /// Grants to each process while it waited.
    grants: Vec<usize>,
    /// Time of the wait during which some process held the lock.
    held: u64,
    longest_section: u64,
    /// The longest time between one holder calling release and the next grant.
    longest_gap: u64,
    /// Requests per node the waiter's acquire sent.
    pub(crate) attempts: u64,
    /// The waiter's time on a run queue over its acquire..release.
    pub(crate) runq: u64,
}

fn worst_wait(recs: &[Rec], workers: usize) -> Option<WorstWait> {
    let w = recs.iter().max_by_key(|r| r.t1 - r.t0)?;
    let (from, to) = (w.t0, w.t1);
    let mut grants = vec![0; workers];
    let mut held = 0;
    let mut longest_section = 0;
    let mut longest_gap = 0;
    let overlap = |a: u64, b: u64| b.min(to).saturating_sub(a.max(from));
    for (i, r) in recs.iter().enumerate() {
        if r.t1 > from && r.t1 < to {
            grants[r.worker] += 1;
        }
        let o = overlap(r.t1, r.t2);
        if o > 0 {
            held += o;
            longest_section = longest_section.max(r.t2 - r.t1);
        }
        if let Some(next) = recs.get(i + 1)
            && overlap(r.t2, next.t1) > 0
        {
            longest_gap = longest_gap.max(next.t1.saturating_sub(r.t2));
        }
    }
    Some(WorstWait {
        wait: to - from,
        worker: w.worker,
        grants,
        held,
        longest_section,
        longest_gap,
        attempts: w.attempts,
        runq: w.runq,
    })
}

fn summarize(o: &Outcome) -> Summary {
    let start = o.recs.iter().map(|r| r.t0).min().unwrap_or(0);
    // Sections granted within the window (the first acquire marks its start).
    let window_end = start + o.duration.as_nanos() as u64;
    let in_window = o.recs.iter().filter(|r| r.t1 <= window_end).count();
    let mut per_worker = vec![0; o.workers];
    for r in &o.recs {
        per_worker[r.worker] += 1;
    }
    let mut waits: Vec<u64> = o.recs.iter().map(|r| r.t1 - r.t0).collect();
    waits.sort_unstable();
    let mut from_call = Vec::new();
    let mut from_done = Vec::new();
    let mut overlaps = 0;
    let mut other = 0;
    for pair in o.recs.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.t1 < a.t2 {
            overlaps += 1;
        }
        if a.worker != b.worker {
            other += 1;
            from_call.push(b.t1.saturating_sub(a.t2));
            from_done.push(b.t1 as i64 - a.t3 as i64);
        }
    }
    from_call.sort_unstable();
    from_done.sort_unstable();
    Summary {
        sections: o.recs.len(),
        per_sec: in_window as f64 / o.duration.as_secs_f64(),
        per_worker,
        waits,
        handoff_from_call: from_call,
        handoff_from_done: from_done,
        handoffs_other: other,
        handoffs_total: o.recs.len().saturating_sub(1),
        overlaps,
        lost_releases: o.recs.iter().filter(|r| !r.released).count(),
        held: {
            let mut h: Vec<u64> = o.recs.iter().map(|r| r.t2 - r.t1).collect();
            h.sort_unstable();
            h
        },
        worst: worst_wait(&o.recs, o.workers),
        attempts: o.recs.iter().map(|r| r.attempts).sum::<u64>() as f64
            / o.recs.len().max(1) as f64,
        runq_share: o.recs.iter().map(|r| r.runq).sum::<u64>() as f64
            / o.recs.iter().map(|r| r.t3 - r.t0).sum::<u64>().max(1) as f64,
    }
}

pub(crate) fn section(outcomes: &[Outcome]) -> Section {
    let mut main = Table::new(&[
        ("nodes", Align::Right),
        ("procs", Align::Right),
        ("sections/s", Align::Right),
        ("per proc min–max", Align::Right),
        ("wait p50 ms", Align::Right),
        ("wait p99 ms", Align::Right),
        ("wait max ms", Align::Right),
        ("requests/acquire", Align::Right),
        ("waiting for CPU", Align::Right),
        ("exclusion", Align::Left),
    ])
    .caption(
        "**Contention** — sections/s: critical sections granted in the window ÷ its length; \
         per proc: sections per process over the whole run; wait: acquire called → granted; \
         requests/acquire: requests per node an acquire sent (1 = granted at the first attempt); \
         waiting for CPU: share of the workers' time runnable but not running (schedstat run delay); \
         exclusion: no two [granted, release called] intervals overlap and the non-atomic counter \
         equals the number of sections.",
    );
    let mut handoff = Table::new(&[
        ("nodes", Align::Right),
        ("RTT µs", Align::Right),
        ("to another proc", Align::Right),
        ("release call→grant p50 µs", Align::Right),
        ("p99 µs", Align::Right),
        ("max µs", Align::Right),
        ("p50 in RTTs", Align::Right),
        ("release returned→grant p50 µs", Align::Right),
    ])
    .caption(
        "**Hand-off** — consecutive sections by different processes: from the holder calling release \
         to the next grant in another process (includes the release's own round trip), and from the \
         release returning in the holder (negative: the grant reached the waiter first). RTT: a round \
         trip under the same load, measured inside the workers: median critical section (GET + SET, \
         two round trips) ÷ 2.",
    );
    let mut verdicts = Vec::new();
    let mut breakdown = Vec::new();
    for o in outcomes {
        let s = summarize(o);
        let exact = o.counter == s.sections as i64;
        let exclusion = if s.overlaps == 0 && exact {
            format!("held ({} = counter)", thousands(o.counter as f64))
        } else {
            format!(
                "**VIOLATED**: {} overlaps, counter {} vs {} sections",
                s.overlaps, o.counter, s.sections
            )
        };
        let min = s.per_worker.iter().min().copied().unwrap_or(0);
        let max = s.per_worker.iter().max().copied().unwrap_or(0);
        let worst = s.waits.last().copied().unwrap_or(0);
        let rtt_us = percentile_sorted(&s.held, 0.5) as f64 / 2e3;
        main.row(vec![
            o.nodes_label(),
            o.workers.to_string(),
            thousands(s.per_sec),
            format!("{}–{}", thousands(min as f64), thousands(max as f64)),
            ms(percentile_sorted(&s.waits, 0.5)),
            ms(percentile_sorted(&s.waits, 0.99)),
            ms(worst),
            format!("{:.2}", s.attempts),
            format!("{:.0} %", 100.0 * s.runq_share),
            exclusion,
        ]);
        let p50 = percentile_sorted(&s.handoff_from_call, 0.5);
        let done_p50 = if s.handoff_from_done.is_empty() {
            0
        } else {
            s.handoff_from_done[(s.handoff_from_done.len() - 1) / 2]
        };
        handoff.row(vec![
            o.nodes_label(),
            format!("{rtt_us:.0}"),
            format!(
                "{:.0} %",
                100.0 * s.handoffs_other as f64 / s.handoffs_total.max(1) as f64
            ),
            format!("{:.0}", p50 as f64 / 1e3),
            format!(
                "{:.0}",
                percentile_sorted(&s.handoff_from_call, 0.99) as f64 / 1e3
            ),
            format!(
                "{:.0}",
                s.handoff_from_call.last().copied().unwrap_or(0) as f64 / 1e3
            ),
            format!("{:.1}", p50 as f64 / 1e3 / rtt_us),
            us_signed(done_p50),
        ]);
        let mut v = format!(
            "{} node(s): worst wait {} ms ({}); release→grant p50 {:.0} µs = {:.1} RTTs",
            o.nodes_label(),
            ms(worst),
            if Duration::from_nanos(worst) <= TARGET_WORST_WAIT {
                "met"
            } else {
                "**missed**"
            },
            p50 as f64 / 1e3,
            p50 as f64 / 1e3 / rtt_us
        );
        if s.lost_releases > 0 {
            v.push_str(&format!(
                "; {} releases found the lock already gone",
                s.lost_releases
            ));
        }
        verdicts.push(v);
        if let Some(w) = &s.worst {
            let grants: Vec<String> = w
                .grants
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != w.worker)
                .map(|(i, g)| format!("p{i} {g}"))
                .collect();
            breakdown.push(format!(
                "- {} node(s): the longest wait, {} ms (process p{}), saw {} grants to the others ({}); \
                 the lock was held during {} ms of it (longest critical section in it {} ms; sections \
                 overall p50 {:.0} µs, p99 {:.0} µs, max {} ms) and between holders during {} ms \
                 (longest release→grant gap {} ms). Its acquire sent {} request(s) per node, and the \
                 process waited {} ms for a CPU between calling acquire and release returning.",
                o.nodes_label(),
                ms(w.wait),
                w.worker,
                w.grants.iter().sum::<usize>(),
                grants.join(", "),
                ms(w.held),
                ms(w.longest_section),
                percentile_sorted(&s.held, 0.5) as f64 / 1e3,
                percentile_sorted(&s.held, 0.99) as f64 / 1e3,
                ms(s.held.last().copied().unwrap_or(0)),
                ms(w.wait - w.held.min(w.wait)),
                ms(w.longest_gap),
                w.attempts,
                ms(w.runq),
            ));
        }
    }
    let d = outcomes.first().map_or(Duration::ZERO, |o| o.duration);
    Section {
        title: "Contention: processes on one key (issue 5)".to_string(),
        intro: vec![format!(
            "{} worker processes (the bench binary re-run with a hidden subcommand), each with its own \
             `LockManager` (default options: ttl 10 s, watchdog on, retry delay 100 ms; restart guard off) \
             on a current-thread runtime, loop for {:.1} s from a common start: `acquire` (block until \
             granted), GET + SET of a counter on a separate redis-server (the critical section, two round \
             trips), `release`. Timestamps are CLOCK_MONOTONIC, compared across processes. Unpinned: \
             the workers, the servers and the bench share the 2 CPUs. \"3, 1 paused\": the last of the 3 \
             nodes is SIGSTOPped before the workers start and resumed after they end (issue 13: a \
             quorum is up, so most of the healthy 3-node throughput is the goal).",
            outcomes.first().map_or(0, |o| o.workers),
            d.as_secs_f64()
        )],
        tables: vec![main, handoff],
        notes: vec![
            format!(
                "Targets (issue 5): worst wait ≤ {} ms (10x python-redis-lock's 0.14 s); release-to-grant a \
                 few round trips. {}.",
                TARGET_WORST_WAIT.as_millis(),
                verdicts.join("; ")
            ),
            format!(
                "Where the worst wait went (a critical section is two round trips to the counter server: \
                 a long one means its holder was descheduled or the counter server was):\n\n{}",
                breakdown.join("\n")
            ),
        ],
    }
}
