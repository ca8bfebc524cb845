//! `make bench`: ferrolock against hand-written floors, the watchdog's cost and contention
//! between processes (the Python peers are measured by bench/python/bench_peers.py).
//!
//! The bench starts its own redis-servers (through the test bed, with no persistence), runs
//! every selected scenario (the uncontended one in every placement: pinned to one CPU,
//! unpinned), prints one markdown document and writes it to `bench/results/latest.md`.
//!
//! Adding a scenario: a module with `pub fn run(ctx: &Ctx) -> BoxResult<Section>`, and a line
//! in `SCENARIOS`. `Ctx` hands out the servers and the placement.

mod affinity;
mod clock;
mod cluster;
mod contention;
mod machine;
mod polling;
mod report;
mod rw;
mod stats;
mod uncontended;
mod watchdog;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use ferrolock_testbed::Cluster;

use crate::affinity::Placement;
use crate::report::{Report, Section};

pub type BoxResult<T> = Result<T, Box<dyn std::error::Error>>;

/// A benchmark scenario: one section of the report.
struct Scenario {
    name: &'static str,
    what: &'static str,
    /// Node counts measured unless `--nodes` says otherwise.
    nodes: &'static [usize],
    run: fn(&Ctx) -> BoxResult<Section>,
}

/// Every scenario, in the order they run and appear in the results.
const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "uncontended",
        what: "acquire+release of a free key, ferrolock vs the two-round-trip redis-rs floor",
        nodes: &[1, 5],
        run: uncontended::run,
    },
    Scenario {
        name: "polling",
        what: "sleeps per blocking acquire+release with reply polling on vs off (FERROLOCK_SPIN_US=0)",
        nodes: &[1],
        run: polling::run,
    },
    Scenario {
        name: "watchdog",
        what: "CPU and round trips of the watchdog renewing 10,000 held locks (issue 4)",
        nodes: &[1, 3],
        run: watchdog::run,
    },
    Scenario {
        name: "contention",
        what: "4 processes on one key: sections/s, waits, hand-off latency, exclusion (issue 5); \
               with 3 nodes also one paused (issue 13)",
        nodes: &[1, 3, 5],
        run: contention::run,
    },
    Scenario {
        name: "cluster",
        what: "a 3-primary Redis Cluster beside one redis-server: uncontended and 4 processes on one key (issue 19)",
        nodes: &[1],
        run: cluster::run,
    },
    Scenario {
        name: "rw",
        what: "read-mostly read-write lock vs the exclusive lock and Redisson's RReadWriteLock; \
               semaphore vs Redisson's RPermitExpirableSemaphore (issue 33; needs FERROLOCK_REDISSON_CP, \
               so not in the default list: bench/run.sh --rw-only)",
        nodes: &[1],
        run: rw::run,
    },
];

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Pass {
    Pinned,
    Split,
    Unpinned,
}

/// ferrolock's Rust benchmarks: uncontended vs hand-written floors, the watchdog's cost,
/// contention between processes; prints markdown and writes it to bench/results/latest.md.
#[derive(Parser, Debug)]
#[command(name = "ferrolock-bench")]
struct Args {
    /// Scenarios to run (comma separated); `list` prints them.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "uncontended,polling,watchdog,contention,cluster"
    )]
    scenario: Vec<String>,
    /// Placements: `pinned` (client and servers on one CPU), `split` (client on --cpu, servers
    /// on another CPU), `unpinned` (the scheduler decides).
    #[arg(long, value_delimiter = ',', default_values = ["pinned", "unpinned"])]
    pass: Vec<Pass>,
    /// The CPU of the pinned pass.
    #[arg(long, default_value_t = 0)]
    cpu: usize,
    /// Node counts (comma separated); default per scenario: uncontended 1,5, polling 1,
    /// watchdog 1,3, contention 1,3,5 (3 also with one node paused).
    #[arg(long, value_delimiter = ',')]
    nodes: Vec<usize>,
    /// Timed runs per implementation and configuration (uncontended; polling: per mode).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Operations per run (default: per scenario and node count).
    #[arg(long)]
    ops: Option<usize>,
    /// Leave out the diagnostic rows (e.g. floor+pub) that explain where time goes.
    #[arg(long)]
    no_diagnostics: bool,
    /// Measure only these implementations (comma separated names as in the tables, e.g.
    /// `ferrolock`), for profiling one of them; the baselines a ratio needs may then be missing.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Held locks in the watchdog scenario.
    #[arg(long, default_value_t = 10_000)]
    locks: usize,
    /// Worker processes in the contention scenario.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Seconds each contention configuration runs.
    #[arg(long, default_value_t = 3.0)]
    duration: f64,
    /// Where to write the markdown (default bench/results/latest.md); `-` writes nothing.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Where the rw scenario writes its summary for bench/results/latest.md.
    #[arg(long)]
    summary: Option<PathBuf>,
}

/// What a scenario gets: the servers, the placements to measure, the sizes.
pub struct Ctx {
    pub placements: Vec<Placement>,
    /// `--nodes`; empty: each scenario's own.
    nodes: Vec<usize>,
    pub runs: usize,
    pub ops: Option<usize>,
    pub diagnostics: bool,
    /// When not empty, the only implementations to measure.
    pub only: Vec<String>,
    pub locks: usize,
    pub workers: usize,
    pub duration: Duration,
    /// `--summary`: the rw scenario's lines for bench/results/latest.md.
    pub summary: Option<PathBuf>,
    servers: Cluster,
}

impl Ctx {
    /// The node counts to measure: `--nodes`, else the scenario's `default`.
    pub fn node_counts(&self, default: &[usize]) -> Vec<usize> {
        if self.nodes.is_empty() {
            default.to_vec()
        } else {
            self.nodes.clone()
        }
    }

    /// URLs of the first `n` servers.
    pub fn urls(&self, n: usize) -> Vec<String> {
        self.servers.urls().into_iter().take(n).collect()
    }

    /// Whether the implementation called `name` is to be measured.
    pub fn wants(&self, name: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o == name)
    }

    /// Server `i` (0-based), e.g. to pause it.
    pub fn server(&self, i: usize) -> &ferrolock_testbed::RedisServer {
        &self.servers.servers[i]
    }

    pub fn server_pids(&self) -> Vec<u32> {
        self.servers.servers.iter().map(|s| s.pid()).collect()
    }

    /// Moves the calling thread and every server to `placement`, then builds the
    /// current-thread runtime the scenario runs on (on this thread, so pinned means pinned).
    pub fn enter(&self, placement: Placement) -> BoxResult<tokio::runtime::Runtime> {
        placement.apply(&self.server_pids()).map_err(|e| {
            format!(
                "cannot set CPU affinity for the {} pass: {e}",
                placement.label()
            )
        })?;
        Ok(tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?)
    }
}

fn main() {
    if let Err(e) = real_main() {
        eprintln!("ferrolock-bench: {e}");
        std::process::exit(1);
    }
}

fn real_main() -> BoxResult<()> {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(contention::WORKER_ARG) {
        return contention::worker(&argv[2..]);
    }
    if argv.get(1).map(String::as_str) == Some(polling::WORKER_ARG) {
        return polling::worker(&argv[2..]);
    }
    let args = Args::parse();
    if args.scenario.iter().any(|s| s == "list") {
        for s in SCENARIOS {
            println!("{:12} {}", s.name, s.what);
        }
        return Ok(());
    }
    let mut selected = Vec::new();
    for name in &args.scenario {
        let found = SCENARIOS.iter().find(|s| s.name == name);
        selected.push(
            found.ok_or_else(|| {
                format!("unknown scenario {name:?}; `--scenario list` shows them")
            })?,
        );
    }
    if args.runs == 0
        || args.ops == Some(0)
        || args.nodes.contains(&0)
        || args.locks == 0
        || args.workers < 2
    {
        return Err("--runs, --ops, --nodes and --locks must be at least 1, --workers 2".into());
    }
    if !(args.duration.is_finite() && args.duration > 0.0 && args.duration <= 600.0) {
        return Err("--duration must be a number of seconds in (0, 600]".into());
    }
    let initial = affinity::initial();
    if !initial.contains(args.cpu) {
        return Err(format!("--cpu {} is not in this process's CPU mask", args.cpu).into());
    }
    let other_cpu = initial.cpus().into_iter().find(|&c| c != args.cpu);
    let mut placements = Vec::new();
    for p in &args.pass {
        placements.push(match p {
            Pass::Pinned => Placement::Pinned(args.cpu),
            Pass::Split => Placement::Split(
                args.cpu,
                other_cpu.ok_or("--pass split needs a second CPU in this process's mask")?,
            ),
            Pass::Unpinned => Placement::Unpinned,
        });
    }

    let started = Instant::now();
    let mut facts = machine::facts();
    let cpu_start = machine::CpuTimes::now();
    let own_start = machine::process_ticks("self");
    let max_nodes = selected
        .iter()
        .flat_map(|s| {
            if args.nodes.is_empty() {
                s.nodes.to_vec()
            } else {
                args.nodes.clone()
            }
        })
        .max()
        .unwrap_or(1);
    eprintln!("ferrolock-bench: starting {max_nodes} redis-server(s)");
    let ctx = Ctx {
        placements,
        nodes: args.nodes.clone(),
        runs: args.runs,
        ops: args.ops,
        diagnostics: !args.no_diagnostics,
        only: args.only.clone(),
        locks: args.locks,
        workers: args.workers,
        duration: Duration::from_secs_f64(args.duration),
        summary: args.summary.clone(),
        servers: Cluster::start(max_nodes),
    };
    let mut sections = Vec::new();
    for s in selected {
        sections.push((s.run)(&ctx).map_err(|e| format!("scenario {}: {e}", s.name))?);
    }
    // Back to where we started before the servers go.
    Placement::Unpinned.apply(&ctx.server_pids())?;
    let own_ticks = machine::process_ticks("self").saturating_sub(own_start)
        + ctx
            .server_pids()
            .iter()
            .map(|p| machine::process_ticks(&p.to_string()))
            .sum::<u64>();
    let cpu_end = machine::CpuTimes::now();
    drop(ctx);
    facts.push((
        "interference".into(),
        machine::interference(cpu_start, cpu_end, own_ticks),
    ));

    if initial.count() < 2 {
        facts.push((
            "note".into(),
            "the process may use only one CPU, so pinned and unpinned coincide".into(),
        ));
    }
    facts.push(("load average at end".into(), machine::load_average()));
    facts.push((
        "bench wall time".into(),
        format!("{:.0} s", started.elapsed().as_secs_f64()),
    ));
    let own_command = format!(
        "`cargo run --release -p ferrolock-bench --{}`",
        std::env::args()
            .skip(1)
            .map(|a| format!(" {a}"))
            .collect::<String>()
    );
    // bench/run.sh passes its own command line, and how it ran this binary.
    facts.push((
        "command".into(),
        match std::env::var("FERROLOCK_BENCH_COMMAND") {
            Ok(c) if !c.is_empty() => format!("`{c}` (Rust part: {own_command})"),
            _ => own_command,
        },
    ));
    let report = Report {
        title: "ferrolock benchmarks".into(),
        facts,
        sections,
    };
    let text = report.render();
    print!("{text}");
    let out = args.out.unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("results")
            .join("latest.md")
    });
    if out.as_os_str() != "-" {
        if let Some(dir) = out.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&out, &text).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
        eprintln!("ferrolock-bench: wrote {}", out.display());
    }
    Ok(())
}
