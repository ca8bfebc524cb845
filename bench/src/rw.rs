//! Issue 33: the read-write lock and the semaphore under contention, ferrolock against
//! Redisson 4.7.0 on the same redis-server.
//!
//! Read-mostly: 4 processes, 90 % of the sections on the read side; the same 4 processes on
//! ferrolock's exclusive lock; the same on Redisson's `RReadWriteLock`. Semaphore: 8 processes
//! on a pool of 4 permits, ferrolock's semaphore and Redisson's `RPermitExpirableSemaphore`.
//! Every section is a 1 ms sleep, so the 2 CPUs are not the limit: sections/s shows how many
//! holders overlap and how fast a hold passes on. ferrolock's processes are the contention
//! scenario's workers with another `Kind`; Redisson's are tests/redisson's `Bench` class, one
//! JVM each, logging the same records. The five configurations take turns in every round, so
//! load from other processes lands on all of them alike; the tables give the median round and
//! each ratio is the median of the rounds' own ratios.
//!
//! Each round also checks exclusion from the records: no writer's [granted, release called]
//! overlaps another hold, and no more than the permits hold at once.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::affinity::Placement;
use crate::clock::mono_ns;
use crate::contention::{Kind, Rec, Side, collect, spawn_workers};
use crate::report::{Align, Section, Table, thousands};
use crate::stats::percentile_sorted;
use crate::{BoxResult, Ctx};

/// The environment variable with the Java client's class path (as the interop tests use it).
pub const CLASSPATH_ENV: &str = "FERROLOCK_REDISSON_CP";
const READS: u32 = 90;
const RW_WORKERS: usize = 4;
const PERMITS: u32 = 4;
const SEMAPHORE_WORKERS: usize = 8;
/// Time ferrolock's workers get to start and connect (8 processes on a loaded machine).
const START_DELAY: Duration = Duration::from_millis(1_500);
/// Time from the last JVM saying "ready" to the common start.
const JAVA_START_DELAY: Duration = Duration::from_millis(300);
/// Issue 33's targets: read-mostly sections/s over the exclusive lock's, and over Redisson's.
const TARGET_OVER_EXCLUSIVE: f64 = 3.0;
const TARGET_OVER_REDISSON: f64 = 1.0;

struct Config {
    name: &'static str,
    redisson: bool,
    kind: Kind,
    workers: usize,
}

const CONFIGS: [Config; 5] = [
    Config {
        name: "ferrolock read-write lock",
        redisson: false,
        kind: Kind::ReadMostly { reads: READS },
        workers: RW_WORKERS,
    },
    Config {
        name: "ferrolock lock (exclusive)",
        redisson: false,
        kind: Kind::Exclusive,
        workers: RW_WORKERS,
    },
    Config {
        name: "Redisson RReadWriteLock",
        redisson: true,
        kind: Kind::ReadMostly { reads: READS },
        workers: RW_WORKERS,
    },
    Config {
        name: "ferrolock semaphore",
        redisson: false,
        kind: Kind::Semaphore { permits: PERMITS },
        workers: SEMAPHORE_WORKERS,
    },
    Config {
        name: "Redisson RPermitExpirableSemaphore",
        redisson: true,
        kind: Kind::Semaphore { permits: PERMITS },
        workers: SEMAPHORE_WORKERS,
    },
];
const RW: usize = 0;
const EXCLUSIVE: usize = 1;
const RW_REDISSON: usize = 2;
const SEMAPHORE: usize = 3;
const SEMAPHORE_REDISSON: usize = 4;

/// One configuration's round.
struct Round {
    per_sec: f64,
    wait_p50: u64,
    worst_wait: u64,
    /// The longest wait of a write (`None`: no writes in this kind).
    worst_write_wait: Option<u64>,
    /// Sections per process: fewest, most.
    per_proc: (usize, usize),
    /// Most holds at once (readers, or permit holders).
    most_at_once: usize,
    /// Moments at which a writer overlapped another hold, or more than the permits held.
    violations: usize,
}

fn measure(recs: &[Rec], c: &Config, duration: Duration) -> Round {
    let start = recs.iter().map(|r| r.t0).min().unwrap_or(0);
    let window_end = start + duration.as_nanos() as u64;
    let mut waits: Vec<u64> = recs.iter().map(|r| r.t1 - r.t0).collect();
    waits.sort_unstable();
    let mut per_proc = vec![0; c.workers];
    for r in recs {
        per_proc[r.worker] += 1;
    }
    // A sweep over grants and releases; a release first at equal times (it was sent first).
    let mut events: Vec<(u64, bool, Side)> = recs
        .iter()
        .flat_map(|r| [(r.t1, true, r.side), (r.t2, false, r.side)])
        .collect();
    events.sort_by_key(|&(t, grant, _)| (t, grant));
    let (mut holders, mut writers, mut most, mut violations) = (0usize, 0usize, 0, 0);
    let limit = match c.kind {
        Kind::Semaphore { permits } => permits as usize,
        Kind::Counter | Kind::Exclusive => 1,
        Kind::ReadMostly { .. } => usize::MAX,
    };
    for (_, grant, side) in events {
        let w = usize::from(side == Side::Write);
        if grant {
            holders += 1;
            writers += w;
            most = most.max(holders);
            if holders > limit || (writers > 0 && holders > 1) {
                violations += 1;
            }
        } else {
            holders -= 1;
            writers -= w;
        }
    }
    Round {
        per_sec: recs.iter().filter(|r| r.t1 <= window_end).count() as f64 / duration.as_secs_f64(),
        wait_p50: percentile_sorted(&waits, 0.5),
        worst_wait: waits.last().copied().unwrap_or(0),
        worst_write_wait: recs
            .iter()
            .filter(|r| r.side == Side::Write)
            .map(|r| r.t1 - r.t0)
            .max(),
        per_proc: (
            per_proc.iter().copied().min().unwrap_or(0),
            per_proc.iter().copied().max().unwrap_or(0),
        ),
        most_at_once: most,
        violations,
    }
}

/// Redisson's side: `workers` JVMs running tests/redisson's `Bench`, started together once
/// every one is connected (a JVM takes seconds to start on a loaded machine).
fn run_redisson(
    ctx: &Ctx,
    classpath: &str,
    url: &str,
    key: &str,
    c: &Config,
    dir: &Path,
) -> BoxResult<Vec<Rec>> {
    let mut children = Vec::new();
    let mut files = Vec::new();
    for w in 0..c.workers {
        let out: PathBuf = dir.join(format!("redisson-{w}.log"));
        let _ = std::fs::remove_file(&out);
        let child = Command::new("java")
            .args([
                "-XX:+UseSerialGC",
                "-Xmx256m",
                "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                "-cp",
                classpath,
                "ferrolock.interop.Bench",
                url,
                &c.kind.arg(),
                key,
            ])
            .arg(&out)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run java (Java 17+ on the PATH): {e}"))?;
        children.push(child);
        files.push(out);
    }
    for child in &mut children {
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().expect("piped"))
            .read_line(&mut line)
            .map_err(|e| format!("Redisson worker pid {}: {e}", child.id()))?;
        if line.trim() != "ready" {
            for c in &mut children {
                let _ = c.kill();
                let _ = c.wait();
            }
            return Err(format!("a Redisson worker said {line:?} instead of \"ready\"").into());
        }
    }
    let start = mono_ns() + JAVA_START_DELAY.as_nanos() as u64;
    let end = start + ctx.duration.as_nanos() as u64;
    for child in &mut children {
        let stdin = child.stdin.as_mut().expect("piped");
        writeln!(stdin, "{start} {end}")?;
        stdin.flush()?;
    }
    let deadline = Instant::now() + JAVA_START_DELAY + ctx.duration + Duration::from_secs(60);
    collect(&mut children, &files, deadline)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[(v.len() - 1) / 2]
}

fn ms(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1e6)
}

pub fn run(ctx: &Ctx) -> BoxResult<Section> {
    let classpath = std::env::var(CLASSPATH_ENV).map_err(|_| {
        format!(
            "{CLASSPATH_ENV} is not set: the Redisson side needs the class path of tests/redisson \
             (bench/run.sh --rw-only builds it with Maven and sets it)"
        )
    })?;
    // 4 to 8 processes on 2 CPUs: pinning them would measure the scheduler.
    drop(ctx.enter(Placement::Unpinned)?);
    let urls = ctx.urls(1);
    let dir = std::env::temp_dir().join(format!("ferrolock-bench-rw-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut rounds: Vec<Vec<Round>> = CONFIGS.iter().map(|_| Vec::new()).collect();
    let result = (|| {
        for round in 0..ctx.runs {
            for (i, c) in CONFIGS.iter().enumerate() {
                eprintln!(
                    "rw: round {}/{}: {}, {} processes for {:?}",
                    round + 1,
                    ctx.runs,
                    c.name,
                    c.workers,
                    ctx.duration
                );
                let key = format!("ferrolock-bench:rw:{round}:{i}");
                let recs = if c.redisson {
                    run_redisson(ctx, &classpath, &urls[0], &key, c, &dir)?
                } else {
                    spawn_workers(
                        ctx,
                        ctx.server(0),
                        &urls,
                        (&key, &format!("{key}:unused")),
                        START_DELAY,
                        &dir,
                        (c.kind, c.workers),
                    )?
                };
                rounds[i].push(measure(&recs, c, ctx.duration));
            }
        }
        BoxResult::Ok(())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result?;
    let section = section(ctx, &rounds);
    if let Some(path) = &ctx.summary {
        std::fs::write(path, summary(&rounds))?;
    }
    Ok(section)
}

/// The median of the rounds' own ratios `a / b` (each round's configurations ran side by side).
fn ratio(rounds: &[Vec<Round>], a: usize, b: usize) -> (f64, Vec<f64>) {
    let each: Vec<f64> = rounds[a]
        .iter()
        .zip(&rounds[b])
        .map(|(x, y)| x.per_sec / y.per_sec)
        .collect();
    (median(each.clone()), each)
}

fn verdict(value: f64, target: f64) -> &'static str {
    if value >= target { "met" } else { "**missed**" }
}

fn ratio_lines(rounds: &[Vec<Round>]) -> Vec<String> {
    let fmt = |each: &[f64]| {
        each.iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (over_lock, e1) = ratio(rounds, RW, EXCLUSIVE);
    let (over_redisson, e2) = ratio(rounds, RW, RW_REDISSON);
    let (sem, e3) = ratio(rounds, SEMAPHORE, SEMAPHORE_REDISSON);
    vec![
        format!(
            "Read-mostly, ferrolock read-write lock ÷ ferrolock lock: **{over_lock:.2}×** (target ≥ \
             {TARGET_OVER_EXCLUSIVE:.0}×: {}; rounds {})",
            verdict(over_lock, TARGET_OVER_EXCLUSIVE),
            fmt(&e1)
        ),
        format!(
            "Read-mostly, ferrolock read-write lock ÷ Redisson RReadWriteLock: **{over_redisson:.2}×** \
             (target ≥ {TARGET_OVER_REDISSON:.0}×: {}; rounds {})",
            verdict(over_redisson, TARGET_OVER_REDISSON),
            fmt(&e2)
        ),
        format!(
            "Semaphore, ferrolock ÷ Redisson RPermitExpirableSemaphore: **{sem:.2}×** (no target; \
             rounds {})",
            fmt(&e3)
        ),
    ]
}

fn worst_writer_wait(rounds: &[Round]) -> Option<u64> {
    rounds.iter().filter_map(|r| r.worst_write_wait).max()
}

fn section(ctx: &Ctx, rounds: &[Vec<Round>]) -> Section {
    let mut table = Table::new(&[
        ("implementation", Align::Left),
        ("procs", Align::Right),
        ("sections/s", Align::Right),
        ("rounds min–max", Align::Right),
        ("wait p50 ms", Align::Right),
        ("worst wait ms", Align::Right),
        ("worst writer wait ms", Align::Right),
        ("per proc min–max", Align::Right),
        ("most holds at once", Align::Right),
        ("exclusion", Align::Left),
    ])
    .caption(
        "**Read-mostly and semaphore** — sections/s: the median round's sections granted in the \
         window ÷ its length; wait p50: the median of the rounds' medians (acquire called → \
         granted); worst wait and worst writer wait: the longest over all rounds; per proc: \
         fewest and most sections of one process in one round; most holds at once: readers or \
         permit holders at one instant; exclusion: no writer's [granted, release called] overlaps \
         another hold and no more than the permits hold at once, in every round.",
    );
    for (c, r) in CONFIGS.iter().zip(rounds) {
        let per_sec: Vec<f64> = r.iter().map(|x| x.per_sec).collect();
        let lo = per_sec.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = per_sec.iter().copied().fold(0.0, f64::max);
        let violations: usize = r.iter().map(|x| x.violations).sum();
        table.row(vec![
            c.name.to_string(),
            c.workers.to_string(),
            thousands(median(per_sec.clone())),
            format!("{}–{}", thousands(lo), thousands(hi)),
            ms(median(r.iter().map(|x| x.wait_p50 as f64).collect()) as u64),
            ms(r.iter().map(|x| x.worst_wait).max().unwrap_or(0)),
            worst_writer_wait(r).map_or("–".into(), ms),
            format!(
                "{}–{}",
                r.iter().map(|x| x.per_proc.0).min().unwrap_or(0),
                r.iter().map(|x| x.per_proc.1).max().unwrap_or(0)
            ),
            r.iter()
                .map(|x| x.most_at_once)
                .max()
                .unwrap_or(0)
                .to_string(),
            if violations == 0 {
                "held".into()
            } else {
                format!("**VIOLATED** ({violations} times)")
            },
        ]);
    }
    Section {
        title: "Read-write lock and semaphore vs Redisson (issue 33)".to_string(),
        intro: vec![format!(
            "{} rounds; in each, five configurations take turns on one redis-server, {:.1} s each, \
             every critical section a 1 ms sleep (a blocking sleep in both languages), unpinned. \
             Read-mostly: {RW_WORKERS} processes, each section a read with probability {READS} % \
             and a write otherwise, on ferrolock's read-write lock, on ferrolock's exclusive lock \
             (every section exclusive: the baseline) and on Redisson 4.7.0's `RReadWriteLock` \
             (`lock()`, its watchdog). Semaphore: {SEMAPHORE_WORKERS} processes on a pool of \
             {PERMITS} permits, one permit each, ferrolock's semaphore (lease = ttl 10 s, renewed) \
             and Redisson's `RPermitExpirableSemaphore` (`acquire(10 s lease)`, its own waiting). \
             ferrolock's processes are the contention scenario's workers (default options, restart \
             guard off); Redisson's are one JVM each (tests/redisson's `Bench`, single-server \
             config), started and connected before the round's common start. Timestamps are \
             CLOCK_MONOTONIC in both (Java's `System.nanoTime`).",
            ctx.runs,
            ctx.duration.as_secs_f64()
        )],
        tables: vec![table],
        notes: vec![ratio_lines(rounds).join("; ") + "."],
    }
}

/// The lines bench/run.sh puts into bench/results/latest.md.
fn summary(rounds: &[Vec<Round>]) -> String {
    let line = |i: usize| {
        let r = &rounds[i];
        format!(
            "{}: {} sections/s, worst wait {} ms",
            CONFIGS[i].name,
            thousands(median(r.iter().map(|x| x.per_sec).collect())),
            ms(r.iter().map(|x| x.worst_wait).max().unwrap_or(0))
        )
    };
    let writer = |i: usize| worst_writer_wait(&rounds[i]).map_or("–".into(), ms);
    let exclusion = rounds.iter().flatten().all(|r| r.violations == 0);
    format!(
        "## Read-write lock and semaphore (summary)\n\n\
         Full tables: bench/results/rw-semaphore.md. {} rounds, sections of a 1 ms sleep, one \
         redis-server, unpinned.\n\n\
         - Read-mostly, 4 processes, 90 % reads: {}; {}; {}; worst writer wait {} ms \
         (ferrolock) and {} ms (Redisson).\n\
         - Semaphore, 4 permits, 8 processes: {}; {}.\n\
         - {}.\n\
         - Exclusion {} in every round.\n",
        rounds[0].len(),
        line(RW),
        line(EXCLUSIVE),
        line(RW_REDISSON),
        writer(RW),
        writer(RW_REDISSON),
        line(SEMAPHORE),
        line(SEMAPHORE_REDISSON),
        ratio_lines(rounds).join("; "),
        if exclusion { "held" } else { "**VIOLATED**" },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(worker: usize, t1: u64, t2: u64, side: Side) -> Rec {
        Rec {
            worker,
            t0: t1,
            t1,
            t2,
            t3: t2,
            released: true,
            attempts: 1,
            runq: 0,
            side,
        }
    }

    /// The exclusion check counts a writer beside a reader, and permit holders beyond the
    /// permits, and nothing for readers together or holds that only touch.
    #[test]
    fn the_sweep_counts_overlaps_that_break_exclusion() {
        let d = Duration::from_secs(1);
        let rw = &CONFIGS[RW];
        let readers = [rec(0, 0, 10, Side::Read), rec(1, 5, 15, Side::Read)];
        assert_eq!(measure(&readers, rw, d).violations, 0);
        assert_eq!(measure(&readers, rw, d).most_at_once, 2);
        let touching = [rec(0, 0, 10, Side::Write), rec(1, 10, 20, Side::Read)];
        assert_eq!(measure(&touching, rw, d).violations, 0);
        let overlapping = [rec(0, 0, 10, Side::Read), rec(1, 9, 20, Side::Write)];
        assert_eq!(measure(&overlapping, rw, d).violations, 1);
        let sem = &CONFIGS[SEMAPHORE];
        let five: Vec<Rec> = (0..5)
            .map(|w| rec(w, w as u64, 100, Side::Permit))
            .collect();
        assert_eq!(measure(&five[..4], sem, d).violations, 0);
        assert_eq!(measure(&five, sem, d).violations, 1);
    }
}
