//! `ferrolock.metrics()` and `ferrolock.prometheus_text()`: the core's one registry per
//! process (`ferrolock::metrics`), read as plain Python values. Nothing is counted here.

use ferrolock::metrics::{self, BUCKETS, HistogramSnapshot};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// `{"buckets": [(upper bound in seconds, cumulative count), ..., (inf, count)], "count",
/// "sum"}`: the shape of a Prometheus histogram.
fn histogram<'py>(py: Python<'py>, h: &HistogramSnapshot) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let bounds = BUCKETS.iter().copied().chain([f64::INFINITY]);
    let buckets: Vec<(f64, u64)> = bounds.zip(h.cumulative.iter().copied()).collect();
    d.set_item("buckets", buckets)?;
    d.set_item("count", h.count)?;
    d.set_item("sum", h.sum)?;
    Ok(d)
}

/// Every key prefix's counts so far: `{prefix: {"attempts", "grants", "handoffs",
/// "renewals", "renewal_failures", "failures": {code: n}, "losses": {reason: n}, "wait",
/// "hold"}}`, the histograms in seconds.
#[pyfunction(name = "metrics")]
pub fn snapshot(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let snap = py.detach(metrics::snapshot);
    let out = PyDict::new(py);
    for (prefix, p) in &snap {
        let d = PyDict::new(py);
        d.set_item("attempts", p.attempts)?;
        d.set_item("grants", p.grants)?;
        d.set_item("handoffs", p.handoffs)?;
        d.set_item("renewals", p.renewals)?;
        d.set_item("renewal_failures", p.renewal_failures)?;
        d.set_item("failures", p.failures.clone())?;
        d.set_item("losses", p.losses.clone())?;
        d.set_item("wait", histogram(py, &p.wait)?)?;
        d.set_item("hold", histogram(py, &p.hold)?)?;
        out.set_item(prefix, d)?;
    }
    Ok(out)
}

/// The same counts in Prometheus's text exposition format (`ferrolock_*`, labelled `prefix`).
#[pyfunction]
pub fn prometheus_text(py: Python<'_>) -> String {
    py.detach(metrics::prometheus_text)
}
