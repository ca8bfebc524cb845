//! Reply polling for blocking callers (`core/src/spin.rs`): how often a thread blocked in
//! `ferrolock::runtime::block_on` goes to sleep per acquire + release, with polling on (the
//! default window) and off (`FERROLOCK_SPIN_US=0`), in the same run.
//!
//! The window is read once per process, so each measurement is a child process (the bench
//! binary re-run with the hidden first argument `__polling-worker`), with or without
//! `FERROLOCK_SPIN_US=0`; the two modes take turns. A child inherits the CPU mask of the
//! thread that spawns it, so the pinned pass pins it with the servers. Each child warms up,
//! then counts its thread's voluntary context switches (`getrusage(RUSAGE_THREAD)`) over
//! `pairs` blocking acquire + release pairs on one node.
//!
//! Each reply a thread sleeps for costs it a switch (two requests per pair; with polling off,
//! measured here, about one of them was already there when the thread looked); a thread that
//! polls sleeps only for replies that came after the window. This figure used to be a test
//! (core/tests/polling.rs) and failed in debug builds on a loaded machine, where replies are
//! late: it is a property of the machine, so it is reported here.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ferrolock::runtime::block_on;
use ferrolock::{LockManager, LockOptions, ManagerOptions};

use crate::report::{Align, Section, Table};
use crate::stats::Spread;
use crate::{BoxResult, Ctx};

pub const WORKER_ARG: &str = "__polling-worker";
const WARMUP_PAIRS: usize = 200;
const PAIRS: usize = 2_000;

/// This thread's voluntary context switches so far.
fn thread_sleeps() -> u64 {
    // SAFETY: getrusage only writes into the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_THREAD is Linux's per-thread flavour.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    if rc != 0 {
        return 0;
    }
    usage.ru_nvcsw as u64
}

/// Worker entry point: `__polling-worker <node url> <pairs>`; prints `<sleeps> <nanoseconds>`
/// for the measured pairs.
pub fn worker(args: &[String]) -> BoxResult<()> {
    let [url, pairs] = args else {
        return Err(format!("{WORKER_ARG}: expected 2 arguments, got {args:?}").into());
    };
    let pairs: usize = pairs.parse()?;
    let manager = LockManager::new(
        ManagerOptions::new()
            .nodes([url.clone()])
            .restart_guard(Duration::ZERO)
            .lock(LockOptions::default().watchdog(false)),
    )?;
    let key = format!("ferrolock-bench:polling:{}", std::process::id());
    let run = |n: usize| -> BoxResult<()> {
        for _ in 0..n {
            let lock = block_on(manager.acquire(&key))?;
            if !block_on(lock.release())? {
                return Err("a release found the lock gone".into());
            }
        }
        Ok(())
    };
    run(WARMUP_PAIRS)?;
    let sleeps = thread_sleeps();
    let started = Instant::now();
    run(pairs)?;
    let elapsed = started.elapsed();
    println!("{} {}", thread_sleeps() - sleeps, elapsed.as_nanos() as u64);
    Ok(())
}

/// One child's figures.
struct Sample {
    sleeps_per_pair: f64,
    us_per_pair: f64,
}

fn measure(url: &str, pairs: usize, polling: bool) -> BoxResult<Sample> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg(WORKER_ARG)
        .arg(url)
        .arg(pairs.to_string())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    if polling {
        cmd.env_remove("FERROLOCK_SPIN_US");
    } else {
        cmd.env("FERROLOCK_SPIN_US", "0");
    }
    let out = cmd.output()?;
    if !out.status.success() {
        return Err(format!("polling worker exited with {}", out.status).into());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<u64> = text
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("polling worker printed {text:?}: {e}"))?;
    let [sleeps, ns] = v[..] else {
        return Err(format!("polling worker printed {text:?}").into());
    };
    Ok(Sample {
        sleeps_per_pair: sleeps as f64 / pairs as f64,
        us_per_pair: ns as f64 / 1e3 / pairs as f64,
    })
}

pub fn run(ctx: &Ctx) -> BoxResult<Section> {
    let url = ctx.urls(1).pop().ok_or("no server")?;
    let pairs = ctx.ops.unwrap_or(PAIRS);
    let mut table = Table::new(&[
        ("pass", Align::Left),
        ("polling", Align::Left),
        ("runs × pairs", Align::Right),
        ("sleeps/pair median", Align::Right),
        ("min–max", Align::Right),
        ("µs/pair median", Align::Right),
        ("sleeps on/off", Align::Right),
        ("time on/off", Align::Right),
    ])
    .caption(
        "**Reply polling** — sleeps/pair: voluntary context switches of the calling thread per \
         blocking acquire + release (two requests; each reply the thread slept for is one \
         switch); on/off: the medians' ratio, polling on (default window, 100 µs) \
         over off (`FERROLOCK_SPIN_US=0`), measured in alternation in this run.",
    );
    for &placement in &ctx.placements {
        drop(ctx.enter(placement)?);
        eprintln!(
            "polling: {}: {} runs × {pairs} pairs, on and off",
            placement.label(),
            ctx.runs
        );
        let (mut on, mut off) = (Vec::new(), Vec::new());
        for i in 0..ctx.runs {
            // Alternate which mode goes first, so drift lands on both.
            for polling in if i % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            } {
                let s = measure(&url, pairs, polling)?;
                if polling {
                    on.push(s);
                } else {
                    off.push(s);
                }
            }
        }
        let median =
            |v: &[Sample], f: fn(&Sample) -> f64| Spread::of(&v.iter().map(f).collect::<Vec<_>>());
        let sleeps = |s: &Sample| s.sleeps_per_pair;
        let time = |s: &Sample| s.us_per_pair;
        let (on_s, off_s) = (median(&on, sleeps), median(&off, sleeps));
        let (on_t, off_t) = (median(&on, time), median(&off, time));
        for (label, s, t, ratios) in [
            (
                "on",
                on_s,
                on_t,
                Some((on_s.median / off_s.median, on_t.median / off_t.median)),
            ),
            ("off", off_s, off_t, None),
        ] {
            table.row(vec![
                placement.short().to_string(),
                label.to_string(),
                format!("{} × {pairs}", ctx.runs),
                format!("{:.2}", s.median),
                format!("{:.2}–{:.2}", s.min, s.max),
                format!("{:.1}", t.median),
                ratios.map_or(String::new(), |r| format!("{:.2}", r.0)),
                ratios.map_or(String::new(), |r| format!("{:.2}", r.1)),
            ]);
        }
    }
    Ok(Section {
        title: "Reply polling: sleeps per acquire + release".to_string(),
        intro: vec![format!(
            "A blocking caller (`ferrolock::runtime::block_on`, what the Python sync API uses) \
             acquires and releases a free key on one node, back to back: {WARMUP_PAIRS} warm-up \
             pairs, then {pairs} measured, in a child process of its own per run (the polling \
             window is read once per process). ttl 10 s, watchdog off, restart guard off."
        )],
        tables: vec![table],
        notes: vec![
            "A ratio well below 1 means replies were polled for instead of slept for; near 1, \
             they came after the window (a slow or loaded machine; a debug build): polling then \
             backs off by itself (8 late replies in a row: 64 requests without polling)."
                .to_string(),
        ],
    })
}
