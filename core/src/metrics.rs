//! Metrics kept by the core, one registry per process (what a scraper of this process sees; a
//! forked child counts from zero):
//! counters and histograms for acquire attempts, grants, failures by error code, wait time,
//! hold time, renewals, renewal failures, losses by reason and hand-offs, labelled by key
//! prefix and kind (`lock`, `read`, `write`, `semaphore`). Read as a snapshot ([`snapshot`],
//! each prefix's totals over its kinds; [`snapshot_by_kind`]) or as Prometheus text
//! ([`prometheus_text`]); the core runs no HTTP server.
//!
//! In the text, a lock's series carry only `prefix` (the label set they had before the other
//! kinds existed, so existing queries and scrapes read the same), the other kinds' series add
//! `kind="read"`, `"write"` or `"semaphore"`; Prometheus reads a missing label as empty, so
//! `kind=""` selects locks and `sum by (prefix)` still totals every kind.
//!
//! The label is the part of the key before its last `:` (`orders:1001` → `orders`; a key
//! without `:` is its own prefix), so keys with ids do not explode the label set;
//! [`set_prefix_separator`] changes the separator. The label set is bounded: past
//! [`MAX_PREFIXES`] labels, a new prefix is counted under [`OVERFLOW_PREFIX`] (`_other`), so
//! keys that are ids without a `:` (`job-0`, `job-1`, ...) cannot grow it without bound. A
//! lock looks its label up once, at its
//! grant; every later count goes to atomics it holds.

use crate::per_process::PerProcess;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Upper bounds of the histogram buckets, in seconds (the last bucket is +Inf).
pub const BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0,
];

/// A histogram of durations.
#[derive(Default)]
pub(crate) struct Histogram {
    counts: [AtomicU64; BUCKETS.len() + 1],
    sum_ns: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = BUCKETS
            .iter()
            .position(|&b| s <= b)
            .unwrap_or(BUCKETS.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    fn read(&self) -> HistogramSnapshot {
        let mut cumulative = Vec::with_capacity(self.counts.len());
        let mut total = 0;
        for c in &self.counts {
            total += c.load(Ordering::Relaxed);
            cumulative.push(total);
        }
        HistogramSnapshot {
            cumulative,
            count: total,
            sum: Duration::from_nanos(self.sum_ns.load(Ordering::Relaxed)).as_secs_f64(),
        }
    }
}

/// A histogram as read: cumulative counts per bucket of [`BUCKETS`] then +Inf, the count and
/// the sum of observations in seconds.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct HistogramSnapshot {
    pub cumulative: Vec<u64>,
    pub count: u64,
    pub sum: f64,
}

/// The counts of one key prefix and kind.
#[derive(Default)]
pub(crate) struct Stats {
    pub attempts: AtomicU64,
    pub grants: AtomicU64,
    pub handoffs: AtomicU64,
    pub renewals: AtomicU64,
    pub renewal_failures: AtomicU64,
    pub wait: Histogram,
    pub hold: Histogram,
    /// By error code / loss reason: rare, so a map under a mutex.
    failures: Mutex<BTreeMap<&'static str, u64>>,
    losses: Mutex<BTreeMap<&'static str, u64>>,
}

impl Stats {
    /// Counts an acquire's outcome, whatever its kind: a grant and how long it waited, or the
    /// failure's error code.
    pub fn acquired<T>(&self, waited: std::time::Duration, result: &crate::error::Result<T>) {
        match result {
            Ok(_) => {
                self.grants.fetch_add(1, Ordering::Relaxed);
                self.wait.observe(waited);
            }
            Err(e) => self.failed(e.kind().code()),
        }
    }

    /// Starts counting an acquire: its outcome is counted once, by [`Counting::ended`], or as
    /// a `CANCELLED` failure if its future is dropped before it ends.
    pub fn counting(self: &Arc<Self>) -> Counting {
        Counting {
            stats: self.clone(),
            started: std::time::Instant::now(),
            ended: false,
        }
    }

    pub fn failed(&self, code: &'static str) {
        *self
            .failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(code)
            .or_default() += 1;
    }

    pub fn lost(&self, reason: &'static str) {
        *self
            .losses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(reason)
            .or_default() += 1;
    }
}

/// An acquire under way (see [`Stats::counting`]). A dropped acquire is one its caller gave
/// up (a Rust future dropped by a timeout, a Go context's deadline, a Node `AbortSignal`,
/// `asyncio.wait_for`, a manager closed under it): counted only where it ended, it showed
/// its attempts and nothing else, so a service whose acquires all ran out of their caller's
/// time showed no failure at all (found by a review).
pub(crate) struct Counting {
    stats: Arc<Stats>,
    started: std::time::Instant,
    ended: bool,
}

impl Counting {
    /// Counts the acquire's outcome, except what a binding's first try
    /// (`LockOptions::first_try`) goes on to wait after (a refusal, a quorum unreachable): the
    /// wait that follows it is the acquire, counted then.
    pub fn ended<T>(mut self, result: &crate::error::Result<T>, first_try: bool) {
        use crate::error::ErrorKind::{NotAcquired, QuorumUnreachable};
        self.ended = true;
        let waits_after =
            matches!(result, Err(e) if matches!(e.kind(), NotAcquired | QuorumUnreachable));
        if first_try && waits_after {
            return;
        }
        self.stats.acquired(self.started.elapsed(), result);
    }
}

impl Drop for Counting {
    fn drop(&mut self) {
        if !self.ended {
            self.stats.failed(crate::error::ErrorKind::Cancelled.code());
        }
    }
}

/// One prefix's counts, as read.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct PrefixSnapshot {
    pub attempts: u64,
    pub grants: u64,
    pub handoffs: u64,
    pub renewals: u64,
    pub renewal_failures: u64,
    /// Failed acquires by error code (`NOT_ACQUIRED`, `QUORUM_UNREACHABLE`, ...; one given up
    /// by its caller while it waited: `CANCELLED`).
    pub failures: BTreeMap<String, u64>,
    /// Losses by reason (`LossReason::code`: `token_gone`, `quorum_unreachable`,
    /// `renewal_too_slow`, `max_hold`, `expiring`, `released_by_manager`, `collected`).
    pub losses: BTreeMap<String, u64>,
    /// From the first attempt to the grant.
    pub wait: HistogramSnapshot,
    /// From the grant to the release.
    pub hold: HistogramSnapshot,
}

/// Every prefix's counts (totals over its kinds), by prefix.
pub type Snapshot = BTreeMap<String, PrefixSnapshot>;

/// Every prefix's counts per kind, by (prefix, kind).
pub type KindSnapshot = BTreeMap<(String, String), PrefixSnapshot>;

/// The `kind` label of a lock (plain or reentrant); the others are `read`, `write` and
/// `semaphore`.
pub const LOCK_KIND: &str = "lock";

/// The most labels one process keeps: keys whose prefix is an id (`job-0`, `job-1`, ...
/// without a `:`) must not grow the registry, or the scrape, without bound.
pub const MAX_PREFIXES: usize = 1000;
/// The label of every prefix first seen once `MAX_PREFIXES` are kept.
pub const OVERFLOW_PREFIX: &str = "_other";

/// Keyed by (prefix, kind label).
type Registry = BTreeMap<(String, &'static str), Arc<Stats>>;

/// Per process: a scrape thread may hold it when another thread forks, and a child that
/// inherited it locked would hang on its first acquire (found by a review). A child counts
/// from zero, as a process of its own.
static REGISTRY: PerProcess<Mutex<Registry>> = PerProcess::new();

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY
        .get_or_init(|| Mutex::new(BTreeMap::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}
/// The separator's char code; 0: none (the whole key is the label).
static SEPARATOR: AtomicU32 = AtomicU32::new(':' as u32);

/// Labels keys by the part before the last `separator` (`None`: by the whole key, for a
/// small, fixed set of keys).
pub fn set_prefix_separator(separator: Option<char>) {
    SEPARATOR.store(separator.map_or(0, |c| c as u32), Ordering::Relaxed);
}

/// The label of `key`.
pub fn prefix_of(key: &str) -> &str {
    match char::from_u32(SEPARATOR.load(Ordering::Relaxed)).filter(|&c| c != '\0') {
        Some(sep) => key.rsplit_once(sep).map_or(key, |(head, _)| head),
        None => key,
    }
}

/// The counts of `key`'s prefix in `kind` (`acquire::Kind::metric_label`), made on first use.
pub(crate) fn stats(key: &str, kind: &'static str) -> Arc<Stats> {
    let prefix = prefix_of(key);
    let mut reg = registry();
    counts_of(&mut reg, prefix, kind)
}

/// The counts of `prefix` in `kind` in `reg`, made on first use; past the cap (on distinct
/// prefixes; a prefix has at most four kinds), a new prefix shares the overflow label.
fn counts_of(reg: &mut Registry, prefix: &str, kind: &'static str) -> Arc<Stats> {
    if let Some(s) = reg.get(&(prefix.to_string(), kind)) {
        return s.clone();
    }
    let known = reg
        .range((prefix.to_string(), "")..)
        .next()
        .map(|((p, _), _)| p.as_str())
        == Some(prefix);
    // Keys are sorted, so a prefix's kinds are neighbours.
    let prefixes = || {
        let mut last = None;
        reg.keys()
            .filter(|(p, _)| last.replace(p) != Some(p))
            .count()
    };
    let prefix = if !known && prefixes() >= MAX_PREFIXES {
        OVERFLOW_PREFIX
    } else {
        prefix
    };
    reg.entry((prefix.to_string(), kind)).or_default().clone()
}

/// Everything counted so far in this process, each prefix's kinds added up.
pub fn snapshot() -> Snapshot {
    let mut out = Snapshot::new();
    for ((prefix, _), p) in snapshot_by_kind() {
        match out.get_mut(&prefix) {
            Some(total) => total.add(&p),
            None => {
                out.insert(prefix, p);
            }
        }
    }
    out
}

impl PrefixSnapshot {
    fn add(&mut self, o: &PrefixSnapshot) {
        self.attempts += o.attempts;
        self.grants += o.grants;
        self.handoffs += o.handoffs;
        self.renewals += o.renewals;
        self.renewal_failures += o.renewal_failures;
        for (k, v) in &o.failures {
            *self.failures.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &o.losses {
            *self.losses.entry(k.clone()).or_default() += v;
        }
        self.wait.add(&o.wait);
        self.hold.add(&o.hold);
    }
}

impl HistogramSnapshot {
    fn add(&mut self, o: &HistogramSnapshot) {
        for (c, d) in self.cumulative.iter_mut().zip(&o.cumulative) {
            *c += d;
        }
        self.count += o.count;
        self.sum += o.sum;
    }
}

/// Everything counted so far in this process, by (prefix, kind).
pub fn snapshot_by_kind() -> KindSnapshot {
    let reg = registry();
    crate::hooks::run(crate::hooks::Point::MetricsSnapshot, "");
    reg.iter()
        .map(|((prefix, kind), s)| {
            let map = |m: &Mutex<BTreeMap<&'static str, u64>>| {
                m.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .map(|(k, v)| (k.to_string(), *v))
                    .collect()
            };
            let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
            (
                (prefix.clone(), kind.to_string()),
                PrefixSnapshot {
                    attempts: load(&s.attempts),
                    grants: load(&s.grants),
                    handoffs: load(&s.handoffs),
                    renewals: load(&s.renewals),
                    renewal_failures: load(&s.renewal_failures),
                    failures: map(&s.failures),
                    losses: map(&s.losses),
                    wait: s.wait.read(),
                    hold: s.hold.read(),
                },
            )
        })
        .collect()
}

/// A counter's name, help and reading.
type Counter = (&'static str, &'static str, fn(&PrefixSnapshot) -> u64);
/// A histogram's name, help and reading.
type Histo = (
    &'static str,
    &'static str,
    fn(&PrefixSnapshot) -> &HistogramSnapshot,
);

/// The snapshot in Prometheus's text exposition format (version 0.0.4): `ferrolock_*`
/// counters (`_total`) and histograms (`_seconds`), labelled `prefix` and, but for locks,
/// `kind`.
pub fn prometheus_text() -> String {
    let snap = snapshot_by_kind();
    let mut out = String::new();
    let counter = |out: &mut String, name: &str, help: &str, rows: &[(String, u64)]| {
        out.push_str(&format!(
            "# HELP ferrolock_{name} {help}\n# TYPE ferrolock_{name} counter\n"
        ));
        for (labels, v) in rows {
            out.push_str(&format!("ferrolock_{name}{{{labels}}} {v}\n"));
        }
    };
    let label = |(prefix, kind): &(String, String)| match kind.as_str() {
        LOCK_KIND => format!("prefix=\"{}\"", escape(prefix)),
        _ => format!("prefix=\"{}\",kind=\"{kind}\"", escape(prefix)),
    };
    let simple: [Counter; 5] = [
        (
            "acquire_attempts_total",
            "Acquire attempts sent to the nodes.",
            |p| p.attempts,
        ),
        (
            "grants_total",
            "Holds granted (re-entries included).",
            |p| p.grants,
        ),
        (
            "handoffs_total",
            "Grants to a waiter woken by a release.",
            |p| p.handoffs,
        ),
        (
            "renewals_total",
            "Watchdog renewals confirmed by a quorum.",
            |p| p.renewals,
        ),
        (
            "renewal_failures_total",
            "Watchdog renewals that did not confirm.",
            |p| p.renewal_failures,
        ),
    ];
    for (name, help, get) in simple {
        let rows: Vec<(String, u64)> = snap.iter().map(|(k, p)| (label(k), get(p))).collect();
        counter(&mut out, name, help, &rows);
    }
    let rows: Vec<(String, u64)> = snap
        .iter()
        .flat_map(|(k, p)| {
            p.failures
                .iter()
                .map(move |(code, v)| (format!("{},code=\"{code}\"", label(k)), *v))
        })
        .collect();
    counter(
        &mut out,
        "acquire_failures_total",
        "Acquires that failed, by error code.",
        &rows,
    );
    let rows: Vec<(String, u64)> = snap
        .iter()
        .flat_map(|(k, p)| {
            p.losses
                .iter()
                .map(move |(reason, v)| (format!("{},reason=\"{reason}\"", label(k)), *v))
        })
        .collect();
    counter(&mut out, "losses_total", "Holds lost, by reason.", &rows);
    let histograms: [Histo; 2] = [
        (
            "wait_seconds",
            "From an acquire's first attempt to its grant.",
            |p| &p.wait,
        ),
        ("hold_seconds", "From a grant to its release.", |p| &p.hold),
    ];
    for (name, help, get) in histograms {
        out.push_str(&format!(
            "# HELP ferrolock_{name} {help}\n# TYPE ferrolock_{name} histogram\n"
        ));
        for (k, p) in &snap {
            let h = get(p);
            for (i, c) in h.cumulative.iter().enumerate() {
                let le = BUCKETS.get(i).map_or("+Inf".to_string(), |b| b.to_string());
                out.push_str(&format!(
                    "ferrolock_{name}_bucket{{{},le=\"{le}\"}} {c}\n",
                    label(k)
                ));
            }
            out.push_str(&format!("ferrolock_{name}_sum{{{}}} {}\n", label(k), h.sum));
            out.push_str(&format!(
                "ferrolock_{name}_count{{{}}} {}\n",
                label(k),
                h.count
            ));
        }
    }
    out
}

/// A label value, escaped as the text format requires.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_labelled_by_their_prefix() {
        assert_eq!(prefix_of("orders:1001"), "orders");
        assert_eq!(prefix_of("a:b:c"), "a:b");
        assert_eq!(prefix_of("plain"), "plain");
    }

    #[test]
    fn the_label_set_is_bounded_by_an_overflow_label() {
        // A registry of its own: the process's one is shared with the other tests.
        let mut reg = BTreeMap::new();
        // Keys without the separator (`job-0`, `job-1`, ...) are each their own prefix.
        for i in 0..MAX_PREFIXES + 10 {
            counts_of(&mut reg, prefix_of(&format!("job-{i}")), LOCK_KIND);
        }
        assert_eq!(
            reg.len(),
            MAX_PREFIXES + 1,
            "the cap and the overflow label"
        );
        let late = counts_of(&mut reg, "job-late", LOCK_KIND);
        assert!(Arc::ptr_eq(
            &late,
            &reg[&(OVERFLOW_PREFIX.to_string(), LOCK_KIND)]
        ));
        assert!(!reg.contains_key(&("job-late".to_string(), LOCK_KIND)));
        // A prefix kept before the cap keeps its own label, in another kind too.
        assert!(!Arc::ptr_eq(
            &counts_of(&mut reg, "job-0", LOCK_KIND),
            &late
        ));
        counts_of(&mut reg, "job-0", "read");
        assert!(reg.contains_key(&("job-0".to_string(), "read")));
    }

    #[test]
    fn counts_and_histograms_show_in_the_text() {
        let s = stats("metrics-unit:1", LOCK_KIND);
        s.attempts.fetch_add(3, Ordering::Relaxed);
        s.grants.fetch_add(2, Ordering::Relaxed);
        s.failed("NOT_ACQUIRED");
        s.lost("token_gone");
        s.wait.observe(Duration::from_millis(3));
        s.hold.observe(Duration::from_secs(60));
        let snap = snapshot();
        let p = &snap["metrics-unit"];
        assert_eq!((p.attempts, p.grants), (3, 2));
        assert_eq!(p.failures["NOT_ACQUIRED"], 1);
        assert_eq!(p.wait.count, 1);
        assert_eq!(p.wait.cumulative[2], 0, "3 ms is not <= 2.5 ms");
        assert_eq!(p.wait.cumulative[3], 1, "3 ms is <= 5 ms");
        assert_eq!(*p.hold.cumulative.last().unwrap(), 1);
        assert_eq!(p.hold.cumulative[BUCKETS.len() - 1], 0, "60 s is past 30 s");
        let text = prometheus_text();
        assert!(
            text.contains("ferrolock_grants_total{prefix=\"metrics-unit\"} 2\n"),
            "{text}"
        );
        assert!(text.contains(
            "ferrolock_acquire_failures_total{prefix=\"metrics-unit\",code=\"NOT_ACQUIRED\"} 1\n"
        ));
        assert!(
            text.contains(
                "ferrolock_wait_seconds_bucket{prefix=\"metrics-unit\",le=\"0.005\"} 1\n"
            )
        );
        assert!(text.contains("ferrolock_hold_seconds_count{prefix=\"metrics-unit\"} 1\n"));
    }
}
