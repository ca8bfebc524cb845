//! Summaries of repeated runs: throughput per run, latencies pooled over runs.

use std::time::Duration;

/// One timed run of `ops` operations.
#[derive(Clone, Debug, Default)]
pub struct Run {
    pub elapsed: Duration,
    /// Latency of each operation, in nanoseconds.
    pub latencies_ns: Vec<u64>,
}

impl Run {
    pub fn ops_per_sec(&self) -> f64 {
        self.latencies_ns.len() as f64 / self.elapsed.as_secs_f64()
    }
}

/// All runs of one implementation in one configuration.
#[derive(Clone, Debug, Default)]
pub struct Series {
    pub runs: Vec<Run>,
}

impl Series {
    pub fn ops_per_sec(&self) -> Vec<f64> {
        self.runs.iter().map(Run::ops_per_sec).collect()
    }

    /// min, median, max of ops/s over the runs.
    pub fn throughput(&self) -> Spread {
        Spread::of(&self.ops_per_sec())
    }

    /// Percentile `p` (0..=1, nearest rank) of every latency of every run, in microseconds.
    pub fn latency_us(&self, p: f64) -> f64 {
        let mut all: Vec<u64> = self
            .runs
            .iter()
            .flat_map(|r| r.latencies_ns.iter().copied())
            .collect();
        all.sort_unstable();
        percentile_sorted(&all, p) as f64 / 1000.0
    }
}

/// Nearest-rank percentile of a sorted slice; 0 for an empty one.
pub fn percentile_sorted(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[derive(Clone, Copy, Debug)]
pub struct Spread {
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(values: &[f64]) -> Spread {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Spread {
                min: f64::NAN,
                median: f64::NAN,
                max: f64::NAN,
            };
        }
        v.sort_by(f64::total_cmp);
        let mid = v.len() / 2;
        let median = if v.len() % 2 == 1 {
            v[mid]
        } else {
            (v[mid - 1] + v[mid]) / 2.0
        };
        Spread {
            min: v[0],
            median,
            max: v[v.len() - 1],
        }
    }
}

/// Time ratio `subject / baseline` of runs paired by index (run i of each was measured next
/// to the other, so drift between pairs cancels): > 1 means the subject is slower.
pub fn paired_time_ratios(subject: &Series, baseline: &Series) -> Vec<f64> {
    subject
        .runs
        .iter()
        .zip(&baseline.runs)
        .map(|(s, b)| b.ops_per_sec() / s.ops_per_sec())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile_sorted(&v, 0.5), 50);
        assert_eq!(percentile_sorted(&v, 0.99), 99);
        assert_eq!(percentile_sorted(&v, 1.0), 100);
        assert_eq!(percentile_sorted(&[7], 0.99), 7);
        assert_eq!(percentile_sorted(&[], 0.5), 0);
    }

    #[test]
    fn spread_takes_the_middle() {
        let s = Spread::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.min, s.median, s.max), (1.0, 2.0, 3.0));
        assert_eq!(Spread::of(&[1.0, 2.0, 3.0, 4.0]).median, 2.5);
    }

    #[test]
    fn ratio_above_one_means_slower() {
        let run = |ms: u64| Run {
            elapsed: Duration::from_millis(ms),
            latencies_ns: vec![0; 100],
        };
        let slow = Series {
            runs: vec![run(110)],
        };
        let fast = Series {
            runs: vec![run(100)],
        };
        let r = paired_time_ratios(&slow, &fast)[0];
        assert!((r - 1.1).abs() < 1e-9, "{r}");
    }
}
