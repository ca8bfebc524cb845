//! Uncontended acquire + release, ferrolock against the two-round-trip floor.
//!
//! The floor is what a careful hand-written client pays for a safe lock with redis-rs: one
//! `SET key token NX PX ttl` and one `EVALSHA` of a compare-and-delete script, on a
//! multiplexed async connection; for N nodes both requests go to every node at once
//! (`join_all`) and wait for every reply. Nothing the lock needs can be cheaper than two
//! round trips, so core/floor is the core's overhead.
//!
//! A third, diagnostic implementation ("floor+scripts") sends by hand what the core sends on
//! the wire: its acquire script (waiter queue check, fencing hook, SET) instead of `SET NX`, and
//! its release script (compare-and-delete, and a PUBLISH when waiters are queued). It splits the
//! core's extra time into protocol cost (floor+scripts / floor) and client-side overhead
//! (ferrolock / floor+scripts).

use std::time::{Duration, Instant};

use ferrolock::__wire::{
    Acquire, KeyNames, Place, Release, barge_bound_ms, quiet_grace_ms, waiter_channel_prefix,
};
use ferrolock::{LockManager, LockOptions, ManagerOptions};
use futures::future::join_all;
use redis::Value;
use redis::aio::MultiplexedConnection;

use crate::report::{Align, Section, Table, thousands};
use crate::stats::{Run, Series, Spread, paired_time_ratios};
use crate::{BoxResult, Ctx};

/// The floor's release: compare-and-delete, nothing else.
const FLOOR_RELEASE: &str =
    "if redis.call('GET',KEYS[1])==ARGV[1] then return redis.call('DEL',KEYS[1]) end return 0";
/// The core's scripts, read from its source so that the diagnostic stays in step.
const CORE_RELEASE: &str = include_str!("../../core/scripts/release.lua");
const CORE_ACQUIRE: &str = concat!(
    include_str!("../../core/scripts/queue.lua"),
    include_str!("../../core/scripts/acquire.lua")
);
const TTL: Duration = Duration::from_secs(10);
/// The core's target: at most this much slower than the floor.
const TARGET: f64 = 1.10;
pub(crate) const WARMUP_OPS: usize = 300;
/// Each run is interleaved with the other implementations' in this many chunks.
const CHUNKS: usize = 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Impl {
    Floor,
    FloorScripts,
    Core,
}

impl Impl {
    fn name(self) -> &'static str {
        match self {
            Impl::Floor => "floor",
            Impl::FloorScripts => "floor+scripts",
            Impl::Core => "ferrolock",
        }
    }
}

/// A hand-written client: its own connections, one per node.
pub(crate) struct Floor {
    conns: Vec<MultiplexedConnection>,
    key: String,
    /// `Some`: acquire with the core's acquire script (SHA, then its extra keys) instead of
    /// `SET NX PX`, and release with the core's release script.
    core_wire: Option<CoreWire>,
    release_sha: String,
    counter: u64,
    seed: u64,
}

/// What the core sends on a first try through its acquire script, built with the core's own
/// argument structs (`ferrolock::__wire`), sent on the floor's connections. The scripts are
/// loaded there from the same sources, so their SHAs are the core's.
struct CoreWire {
    /// The acquire script's KEYS[2..5]: fence counter, queue, queue leases, join times.
    names: KeyNames,
    /// The waiters' own channels' prefix.
    wake_prefix: String,
    nodes: usize,
}

async fn load(conns: &mut [MultiplexedConnection], script: &str) -> BoxResult<String> {
    let mut sha = String::new();
    for c in conns {
        sha = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(script)
            .query_async(c)
            .await?;
    }
    Ok(sha)
}

impl Floor {
    async fn connect(urls: &[String], key: String, wire: Impl) -> BoxResult<Floor> {
        let mut conns = Vec::new();
        for url in urls {
            conns.push(
                redis::Client::open(url.as_str())?
                    .get_multiplexed_async_connection()
                    .await?,
            );
        }
        let (release_sha, core_wire) = if wire == Impl::FloorScripts {
            load(&mut conns, CORE_ACQUIRE).await?;
            let wire = CoreWire {
                names: KeyNames::of(&key),
                wake_prefix: waiter_channel_prefix(&key),
                nodes: conns.len(),
            };
            (load(&mut conns, CORE_RELEASE).await?, Some(wire))
        } else {
            (load(&mut conns, FLOOR_RELEASE).await?, None)
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let seed = (std::process::id() as u64).rotate_left(40) ^ now.as_nanos() as u64;
        Ok(Floor {
            conns,
            key,
            core_wire,
            release_sha,
            counter: 0,
            seed,
        })
    }

    /// One acquire + release.
    async fn pair(&mut self) -> BoxResult<()> {
        self.counter += 1;
        // 32 hex digits, about as long as the core's token (33 characters), from a counter: a
        // unique token at no cost (the core draws from the OS CSPRNG).
        let token = format!("{:016x}{:016x}", self.seed, self.counter);
        let ttl_ms = TTL.as_millis() as u64;
        let (acquire, release) = match &self.core_wire {
            None => {
                let mut acquire = redis::cmd("SET");
                acquire
                    .arg(&self.key)
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl_ms);
                let mut release = redis::cmd("EVALSHA");
                release
                    .arg(&self.release_sha)
                    .arg(1)
                    .arg(&self.key)
                    .arg(&token);
                (acquire, release)
            }
            // A first try that goes through the queue script (not queued itself: no waiter
            // id), and a release that has seen contention (every queue key).
            Some(w) => {
                let acquire = Acquire {
                    key: &self.key,
                    names: &w.names,
                    token: &token,
                    ttl_ms,
                    fence_mode: "",
                    place: Place::default(),
                    bound_ms: barge_bound_ms(w.nodes),
                    wake_prefix: &w.wake_prefix,
                    grace_ms: if w.nodes == 1 { quiet_grace_ms() } else { 0 },
                    quiet: false,
                }
                // Standalone servers: classic PUBLISH.
                .command(false);
                let release = Release {
                    key: &self.key,
                    token: &token,
                    contended: true,
                    quiet_bound_ms: 0,
                    // The core's: twice the default node timeout, min(200 ms, ttl/10).
                    latch_px_ms: 2 * (ttl_ms / 10).min(200),
                }
                .command(false);
                (acquire, release)
            }
        };
        // SET NX answers OK or nil; the core's acquire script answers nil on a grant.
        let granted = |v: &Value| (*v == Value::Nil) == self.core_wire.is_some();
        if let [conn] = self.conns.as_mut_slice() {
            let reply: Value = acquire.query_async(conn).await?;
            let deleted: i64 = release.query_async(conn).await?;
            return check(granted(&reply), deleted == 1, &self.key);
        }
        let replies: Vec<redis::RedisResult<Value>> =
            join_all(self.conns.iter_mut().map(|c| acquire.query_async(c))).await;
        let all_granted = replies
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?
            .iter()
            .all(granted);
        let deleted: Vec<redis::RedisResult<i64>> =
            join_all(self.conns.iter_mut().map(|c| release.query_async(c))).await;
        let all_deleted = deleted
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?
            .iter()
            .all(|&d| d == 1);
        check(all_granted, all_deleted, &self.key)
    }

    /// The key must be gone from every node after a run.
    async fn assert_clean(&mut self) -> BoxResult<()> {
        for c in &mut self.conns {
            let n: i64 = redis::cmd("EXISTS").arg(&self.key).query_async(c).await?;
            if n != 0 {
                return Err(format!("key {:?} left behind on a node", self.key).into());
            }
        }
        Ok(())
    }
}

fn check(granted: bool, deleted: bool, key: &str) -> BoxResult<()> {
    match (granted, deleted) {
        (true, true) => Ok(()),
        (false, _) => Err(format!("floor: the acquire of free key {key:?} was refused").into()),
        (true, false) => Err(format!("floor: compare-and-delete on {key:?} found no lock").into()),
    }
}

pub(crate) struct Core {
    manager: LockManager,
    opts: LockOptions,
    key: String,
}

impl Core {
    pub(crate) fn new(urls: &[String], key: String) -> BoxResult<Core> {
        let opts = LockOptions::default().ttl(TTL).watchdog(false);
        let manager = LockManager::new(
            ManagerOptions::new()
                .nodes(urls.to_vec())
                // The bench's servers were started seconds ago: without this a 5-node
                // manager would not count their votes for a ttl (the Redlock restart rule).
                .restart_guard(Duration::ZERO)
                .lock(opts.clone()),
        )?;
        Ok(Core { manager, opts, key })
    }

    async fn pair(&mut self) -> BoxResult<()> {
        let lock = self.manager.acquire_with(&self.key, &self.opts).await?;
        if !lock.release().await? {
            return Err(format!("ferrolock: release of {:?} found the lock gone", self.key).into());
        }
        Ok(())
    }
}

pub(crate) enum Subject {
    Floor(Floor),
    Core(Core),
}

impl Subject {
    async fn pair(&mut self) -> BoxResult<()> {
        match self {
            Subject::Floor(f) => f.pair().await,
            Subject::Core(c) => c.pair().await,
        }
    }

    /// Times `ops` pairs, adding them to `run`.
    pub(crate) async fn measure(&mut self, ops: usize, run: &mut Run) -> BoxResult<()> {
        run.latencies_ns.reserve(ops);
        let start = Instant::now();
        for _ in 0..ops {
            let t = Instant::now();
            self.pair().await?;
            run.latencies_ns.push(t.elapsed().as_nanos() as u64);
        }
        run.elapsed += start.elapsed();
        Ok(())
    }
}

/// The results of one (placement, node count) configuration.
struct Config {
    pass: &'static str,
    nodes: usize,
    ops: usize,
    series: Vec<(Impl, Series)>,
    notes: Vec<String>,
}

impl Config {
    fn get(&self, which: Impl) -> Option<&Series> {
        self.series
            .iter()
            .find(|(i, _)| *i == which)
            .map(|(_, s)| s)
    }
}

/// The series of every implementation, and notes on diagnostics that had to be left out.
type Measured = (Vec<(Impl, Series)>, Vec<String>);

async fn measure_config(
    urls: &[String],
    impls: &[Impl],
    runs: usize,
    ops: usize,
) -> BoxResult<Measured> {
    let mut subjects = Vec::new();
    let mut notes = Vec::new();
    for (i, &which) in impls.iter().enumerate() {
        // One key per implementation, all of the same length.
        let key = format!("ferrolock-bench:uncontended:{i}");
        let warmed = async {
            let mut subject = match which {
                Impl::Floor | Impl::FloorScripts => {
                    Subject::Floor(Floor::connect(urls, key, which).await?)
                }
                Impl::Core => Subject::Core(Core::new(urls, key)?),
            };
            subject.measure(WARMUP_OPS, &mut Run::default()).await?;
            BoxResult::Ok(subject)
        };
        match warmed.await {
            Ok(subject) => subjects.push((which, subject, Series::default())),
            // The diagnostic mirrors the core's wire format, which may move ahead of it.
            Err(e) if which == Impl::FloorScripts => notes.push(format!(
                "floor+scripts left out on {} node(s): {e} (did the core's acquire script or its \
                 arguments change? update `CoreWire` in bench/src/uncontended.rs)",
                urls.len()
            )),
            Err(e) => return Err(format!("{}: {e}", which.name()).into()),
        }
    }
    take_turns(&mut subjects, runs, ops).await?;
    for (_, s, _) in &mut subjects {
        if let Subject::Floor(f) = s {
            f.assert_clean().await?;
        }
    }
    let series = subjects
        .into_iter()
        .map(|(w, _, series)| (w, series))
        .collect();
    Ok((series, notes))
}

/// Runs `runs` timed runs of `ops` pairs for every subject, in turns: A B C, then C B A, ...
/// in chunks of a few milliseconds, so that a drift of the machine, or the scheduler moving a
/// server to the other CPU, lands on every subject alike. Each run joins its subject's series.
pub(crate) async fn take_turns<W>(
    subjects: &mut [(W, Subject, Series)],
    runs: usize,
    ops: usize,
) -> BoxResult<()> {
    let chunk = ops.div_ceil(CHUNKS);
    let mut turn = 0;
    for _ in 0..runs {
        let mut runs_now = vec![Run::default(); subjects.len()];
        let mut done = 0;
        while done < ops {
            let n = chunk.min(ops - done);
            let order: Vec<usize> = if turn % 2 == 0 {
                (0..subjects.len()).collect()
            } else {
                (0..subjects.len()).rev().collect()
            };
            turn += 1;
            for i in order {
                subjects[i].1.measure(n, &mut runs_now[i]).await?;
            }
            done += n;
        }
        for ((_, _, series), run) in subjects.iter_mut().zip(runs_now) {
            series.runs.push(run);
        }
    }
    Ok(())
}

pub fn run(ctx: &Ctx) -> BoxResult<Section> {
    let impls: Vec<Impl> = [Impl::Floor, Impl::FloorScripts, Impl::Core]
        .into_iter()
        .filter(|&i| ctx.diagnostics || i != Impl::FloorScripts)
        .filter(|i| ctx.wants(i.name()))
        .collect();
    if impls.is_empty() {
        return Err("no implementation selected (names: floor, floor+scripts, ferrolock)".into());
    }
    let mut configs = Vec::new();
    for &placement in &ctx.placements {
        let runtime = ctx.enter(placement)?;
        for n in ctx.node_counts(&[1, 5]) {
            let urls = ctx.urls(n);
            let ops = ctx.ops.unwrap_or(if n == 1 { 8000 } else { 4000 });
            eprintln!(
                "uncontended: {} nodes={n}: {} runs x {ops} ops of {}",
                placement.short(),
                ctx.runs,
                impls
                    .iter()
                    .map(|i| i.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            let (series, notes) = runtime.block_on(measure_config(&urls, &impls, ctx.runs, ops))?;
            configs.push(Config {
                pass: placement.short(),
                nodes: n,
                ops,
                series,
                notes,
            });
        }
    }
    Ok(section(ctx, &configs))
}

fn us(x: f64) -> String {
    format!("{x:.1}")
}

fn ratio(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.3}")
    } else {
        "-".to_string()
    }
}

fn section(ctx: &Ctx, configs: &[Config]) -> Section {
    let mut summary = Table::new(&[
        ("pass", Align::Left),
        ("nodes", Align::Right),
        ("floor ops/s", Align::Right),
        ("ferrolock ops/s", Align::Right),
        ("core/floor time", Align::Right),
        ("paired min–max", Align::Right),
        ("p50 ratio", Align::Right),
        ("p99 ratio", Align::Right),
        ("≤ 1.10?", Align::Left),
    ])
    .caption("**Summary** — core/floor is a time ratio (> 1 = ferrolock slower): the median over runs of floor ops/s ÷ ferrolock ops/s, each run paired with the floor run next to it.");
    let mut detail = Table::new(&[
        ("pass", Align::Left),
        ("nodes", Align::Right),
        ("impl", Align::Left),
        ("runs × ops", Align::Right),
        ("ops/s min", Align::Right),
        ("ops/s median", Align::Right),
        ("ops/s max", Align::Right),
        ("p50 µs", Align::Right),
        ("p99 µs", Align::Right),
    ])
    .caption("**Detail** — latency of one acquire+release pair, pooled over all runs.");
    let mut breakdown = Vec::new();
    let mut left_out = Vec::new();
    for c in configs {
        for (which, s) in &c.series {
            let t = s.throughput();
            detail.row(vec![
                c.pass.to_string(),
                c.nodes.to_string(),
                which.name().to_string(),
                format!("{} × {}", s.runs.len(), c.ops),
                thousands(t.min),
                thousands(t.median),
                thousands(t.max),
                us(s.latency_us(0.50)),
                us(s.latency_us(0.99)),
            ]);
        }
        let (Some(floor), Some(core)) = (c.get(Impl::Floor), c.get(Impl::Core)) else {
            continue;
        };
        let paired = Spread::of(&paired_time_ratios(core, floor));
        let verdict = if paired.median <= TARGET {
            "yes"
        } else {
            "**no**"
        };
        summary.row(vec![
            c.pass.to_string(),
            c.nodes.to_string(),
            thousands(floor.throughput().median),
            thousands(core.throughput().median),
            ratio(paired.median),
            format!("{}–{}", ratio(paired.min), ratio(paired.max)),
            ratio(core.latency_us(0.50) / floor.latency_us(0.50)),
            ratio(core.latency_us(0.99) / floor.latency_us(0.99)),
            verdict.to_string(),
        ]);
        if let Some(wire) = c.get(Impl::FloorScripts) {
            let protocol = Spread::of(&paired_time_ratios(wire, floor)).median;
            let client = Spread::of(&paired_time_ratios(core, wire)).median;
            breakdown.push(format!(
                "- {} {} node(s): the core's scripts cost {:+.1} % over `SET NX` + compare-and-delete \
                 (floor+scripts / floor); the core's client side adds {:+.1} % (ferrolock / floor+scripts).",
                c.pass,
                c.nodes,
                (protocol - 1.0) * 100.0,
                (client - 1.0) * 100.0
            ));
        }
        left_out.extend(c.notes.iter().cloned());
    }
    let mut notes = Vec::new();
    if !breakdown.is_empty() {
        notes.push(format!(
            "Where the time goes (medians of paired time ratios):\n\n{}",
            breakdown.join("\n")
        ));
    }
    Section {
        title: "Uncontended acquire + release".to_string(),
        intro: vec![
            format!(
                "One client task acquires and releases a free key, back to back; {} runs per implementation \
                 after {WARMUP_OPS} warm-up pairs. The implementations take turns in chunks of 1/{CHUNKS} of a run, \
                 in alternating order (A B C, C B A, ...), so drift and CPU migrations land on all of them alike. \
                 ttl {}s, watchdog off, restart guard off (the servers are seconds old), \
                 a current-thread tokio runtime on one thread.",
                ctx.runs,
                TTL.as_secs()
            ),
            "- **floor**: redis-rs by hand on a multiplexed async connection per node: `SET key token NX PX ttl`, \
             then `EVALSHA` of `if redis.call('GET',KEYS[1])==ARGV[1] then return redis.call('DEL',KEYS[1]) end return 0`; \
             with 5 nodes each request goes to all 5 at once (`join_all`) and waits for all 5 replies. Two round trips: \
             nothing safe can be cheaper.\n\
             - **floor+scripts** (diagnostic): the floor sending what the core sends: its acquire script \
             (waiter-queue check, fencing hook, then SET) instead of `SET NX`, and its release script, which also \
             wakes queued waiters. floor+scripts / floor is the cost of the protocol, ferrolock / floor+scripts \
             that of the client code.\n\
             - **ferrolock**: `LockManager::acquire_with` + `Lock::release` (the core waits for a quorum, 3 of 5, \
             on acquire and for every node on release).\n\
             - **pinned**: the client thread and every thread of every redis-server on one CPU; **split**: the \
             client on one CPU, the servers on another; **unpinned**: the scheduler places them, and may move them \
             mid-run (on 2 vCPUs a cross-CPU loopback round trip costs several times a same-CPU one)."
                .to_string(),
        ],
        tables: vec![summary, detail],
        notes,
    }
}
