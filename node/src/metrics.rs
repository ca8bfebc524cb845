//! The core's metrics (`ferrolock::metrics`, one registry per process, shared by every
//! worker thread) as a plain JavaScript object and as Prometheus text.

use std::collections::HashMap;

use ferrolock::metrics::{self, HistogramSnapshot, PrefixSnapshot};
use napi_derive::napi;

use crate::errors::guard;

/// A histogram of durations in seconds: `le` are the buckets' upper bounds (the last is
/// Infinity), `cumulative` the count of observations at or under each.
#[napi(object)]
pub struct HistogramMetrics {
    pub le: Vec<f64>,
    pub cumulative: Vec<f64>,
    pub count: f64,
    pub sum: f64,
}

/// The counts of one key prefix.
#[napi(object)]
pub struct PrefixMetrics {
    pub attempts: f64,
    pub grants: f64,
    pub handoffs: f64,
    pub renewals: f64,
    pub renewal_failures: f64,
    /// Failed acquires by error code.
    pub failures: HashMap<String, f64>,
    /// Losses by reason.
    pub losses: HashMap<String, f64>,
    pub wait: HistogramMetrics,
    pub hold: HistogramMetrics,
}

fn histogram(h: &HistogramSnapshot) -> HistogramMetrics {
    let mut le: Vec<f64> = metrics::BUCKETS.to_vec();
    le.push(f64::INFINITY);
    HistogramMetrics {
        le,
        cumulative: h.cumulative.iter().map(|&c| c as f64).collect(),
        count: h.count as f64,
        sum: h.sum,
    }
}

fn counts(m: &std::collections::BTreeMap<String, u64>) -> HashMap<String, f64> {
    m.iter().map(|(k, &v)| (k.clone(), v as f64)).collect()
}

fn prefix(p: &PrefixSnapshot) -> PrefixMetrics {
    PrefixMetrics {
        attempts: p.attempts as f64,
        grants: p.grants as f64,
        handoffs: p.handoffs as f64,
        renewals: p.renewals as f64,
        renewal_failures: p.renewal_failures as f64,
        failures: counts(&p.failures),
        losses: counts(&p.losses),
        wait: histogram(&p.wait),
        hold: histogram(&p.hold),
    }
}

/// One key prefix and its counts.
#[napi(object)]
pub struct PrefixEntry {
    pub prefix: String,
    pub counts: PrefixMetrics,
}

/// Everything counted so far in this process, one entry per key prefix. A list, not an
/// object: napi sets an object's properties by assignment, so a prefix `__proto__` (a key
/// `__proto__:1`) set the object's prototype instead of a property; `index.js` defines them.
#[napi]
pub fn metrics() -> napi::Result<Vec<PrefixEntry>> {
    guard("metrics", || {
        Ok(metrics::snapshot()
            .iter()
            .map(|(k, p)| PrefixEntry {
                prefix: k.clone(),
                counts: prefix(p),
            })
            .collect())
    })
}

/// The same in Prometheus's text exposition format (`ferrolock_*`).
#[napi]
pub fn prometheus_text() -> napi::Result<String> {
    guard("prometheusText", || Ok(metrics::prometheus_text()))
}
