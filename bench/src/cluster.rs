//! `--scenario cluster` (issue 19): the core on a 3-primary Redis Cluster (one
//! `redis+cluster://` node) beside the core on one standalone redis-server, in the same run on
//! the same machine: uncontended acquire + release, taking turns as `uncontended` does, and 4
//! processes contending for one key as `contention` does. A cluster adds only the routing of
//! each command to its key's primary: the target is a cluster latency within 1.1× the
//! single server's.

use ferrolock_testbed::RedisCluster;
use ferrolock_testbed::RedisServer;

use crate::affinity::Placement;
use crate::contention;
use crate::report::{Align, Section, Table, thousands};
use crate::stats::{Run, Series, Spread, paired_time_ratios};
use crate::uncontended::{Core, Subject, WARMUP_OPS, take_turns};
use crate::{BoxResult, Ctx};

/// Cluster p50 latency ÷ single-server p50 latency, at most.
const TARGET: f64 = 1.10;
const OPS: usize = 8000;

struct Measured {
    pass: &'static str,
    single: Series,
    cluster: Series,
}

async fn measure(
    single: &[String],
    cluster: &[String],
    runs: usize,
    ops: usize,
) -> BoxResult<(Series, Series)> {
    let mut subjects = Vec::new();
    for (name, urls) in [("single", single), ("cluster", cluster)] {
        // One key per subject, of the same length.
        let mut subject = Subject::Core(Core::new(
            urls,
            format!("ferrolock-bench:cluster:{name:>7}"),
        )?);
        subject.measure(WARMUP_OPS, &mut Run::default()).await?;
        subjects.push((name, subject, Series::default()));
    }
    take_turns(&mut subjects, runs, ops).await?;
    let mut series = subjects.into_iter().map(|(_, _, s)| s);
    let single = series.next().ok_or("no single-server series")?;
    let cluster = series.next().ok_or("no cluster series")?;
    Ok((single, cluster))
}

pub fn run(ctx: &Ctx) -> BoxResult<Section> {
    eprintln!("cluster: starting a 3-primary Redis Cluster");
    let cluster = RedisCluster::start();
    let cluster_urls = vec![cluster.url()];
    let single_urls = ctx.urls(1);
    let mut pids = ctx.server_pids();
    pids.extend(cluster.nodes.iter().map(RedisServer::pid));
    let ops = ctx.ops.unwrap_or(OPS);
    let mut measured = Vec::new();
    for &placement in &ctx.placements {
        let runtime = ctx.enter(placement)?;
        // `enter` placed the bench's own servers; the cluster's go along.
        placement.apply(&pids)?;
        eprintln!(
            "cluster: uncontended {}: {} runs x {ops} ops, single server and cluster",
            placement.short(),
            ctx.runs
        );
        let (single, cluster) =
            runtime.block_on(measure(&single_urls, &cluster_urls, ctx.runs, ops))?;
        measured.push(Measured {
            pass: placement.short(),
            single,
            cluster,
        });
    }
    // Several processes on 2 CPUs: unpinned, as the contention scenario runs.
    Placement::Unpinned.apply(&pids)?;
    let counter = RedisServer::start();
    let dir = std::env::temp_dir().join(format!("ferrolock-bench-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let contended = (|| {
        let mut outcomes = Vec::new();
        for (label, urls) in [
            ("1 (single server)", &single_urls),
            ("cluster (3 primaries)", &cluster_urls),
        ] {
            eprintln!(
                "cluster: contended on {label}: {} worker processes for {:?}",
                ctx.workers, ctx.duration
            );
            outcomes.push(contention::run_labelled(ctx, &counter, urls, label, &dir)?);
        }
        BoxResult::Ok(outcomes)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(section(
        ctx,
        &measured,
        &contention::section(&contended?),
        ops,
    ))
}

fn section(ctx: &Ctx, measured: &[Measured], contended: &Section, ops: usize) -> Section {
    let mut table = Table::new(&[
        ("pass", Align::Left),
        ("single ops/s", Align::Right),
        ("cluster ops/s", Align::Right),
        ("single p50 µs", Align::Right),
        ("cluster p50 µs", Align::Right),
        ("p50 ratio", Align::Right),
        ("p99 ratio", Align::Right),
        ("time ratio (paired min–max)", Align::Right),
        ("≤ 1.10?", Align::Left),
    ])
    .caption(
        "**Uncontended** — one task acquires and releases a free key, ferrolock on a single redis-server \
         and ferrolock on a 3-primary cluster taking turns; ratios are cluster ÷ single (> 1 = the cluster is slower); \
         the time ratio is the median over runs of single ops/s ÷ cluster ops/s, each run paired with its neighbour.",
    );
    let mut verdicts = Vec::new();
    for m in measured {
        let p50 = m.cluster.latency_us(0.50) / m.single.latency_us(0.50);
        let paired = Spread::of(&paired_time_ratios(&m.cluster, &m.single));
        let met = p50 <= TARGET;
        table.row(vec![
            m.pass.to_string(),
            thousands(m.single.throughput().median),
            thousands(m.cluster.throughput().median),
            format!("{:.1}", m.single.latency_us(0.50)),
            format!("{:.1}", m.cluster.latency_us(0.50)),
            format!("{p50:.3}"),
            format!(
                "{:.3}",
                m.cluster.latency_us(0.99) / m.single.latency_us(0.99)
            ),
            format!("{:.3} ({:.3}–{:.3})", paired.median, paired.min, paired.max),
            if met { "yes" } else { "**no**" }.to_string(),
        ]);
        verdicts.push(format!(
            "{} {p50:.3}× ({})",
            m.pass,
            if met { "met" } else { "**missed**" }
        ));
    }
    let mut tables = vec![table];
    tables.extend(contended.tables.iter().cloned());
    let mut notes = vec![format!(
        "Target (issue 19): cluster uncontended p50 latency ≤ {TARGET:.1}× the single server's: {}.",
        verdicts.join(", ")
    )];
    notes.extend(contended.notes.iter().cloned());
    Section {
        title: "Redis Cluster beside a single server (issue 19)".to_string(),
        intro: vec![format!(
            "A 3-primary Redis Cluster started by the test bed (no replicas), one `redis+cluster://` \
             node, and a standalone redis-server, in the same run. Uncontended: {} runs of {ops} pairs each after \
             {WARMUP_OPS} warm-up pairs, in turns of 1/20 of a run; ttl 10 s, watchdog off, restart guard off, a \
             current-thread runtime; pinned: the client and every server (the cluster's too) on one CPU. Contended: \
             {} processes on one key for {:?}, unpinned, as in the contention scenario.",
            ctx.runs, ctx.workers, ctx.duration,
        )],
        tables,
        notes,
    }
}
