//! Keyword options from Python into the core's option structs. Only conversion happens here:
//! durations from float seconds or `datetime.timedelta`, strict bools and counts. Every
//! refusal is an `InvalidArgument` naming the option, the value and (for a lock) the key.
//! Range rules that need no Python knowledge (ttl >= 1ms, drift < ttl, ...) stay in the core.

use std::path::PathBuf;
use std::time::Duration;

use ferrolock::{LockOptions, MAX_DURATION, ManagerOptions, split_nodes};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyDict, PyList, PyString, PyTuple, PyType};

use crate::errors::invalid;

/// Options of one lock, accepted by `LockManager(...)` (as defaults), `redlock()`,
/// `manager.lock()` and `manager.acquire()`.
pub const LOCK_OPTIONS: &[&str] = &[
    "ttl",
    "wait",
    "retry_delay",
    "node_timeout",
    "drift_factor",
    "watchdog",
    "max_hold",
    "max_extensions",
    "reentrant",
    "fencing",
    "interrupt",
];
/// Options of the connection, accepted by `LockManager(...)` and `redlock()` only.
pub const MANAGER_OPTIONS: &[&str] = &["nodes", "tls_ca", "restart_guard"];

/// Where the option was given, for messages: a lock's key, or the manager.
#[derive(Clone, Copy)]
pub struct Ctx<'a> {
    pub key: Option<&'a str>,
}

impl Ctx<'_> {
    fn prefix(&self) -> String {
        match self.key {
            Some(k) => format!("lock {k:?}: "),
            None => "LockManager: ".to_string(),
        }
    }
}

fn bad(py: Python<'_>, ctx: Ctx<'_>, name: &str, value: &Bound<'_, PyAny>, why: &str) -> PyErr {
    let shown = value
        .repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "<unprintable>".to_string());
    let ty = value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_string());
    invalid(
        py,
        format!("{}invalid {name}={shown} ({ty}): {why}", ctx.prefix()),
        ctx.key,
    )
}

fn timedelta_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static TIMEDELTA: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    TIMEDELTA.import(py, "datetime", "timedelta")
}

fn is_text(v: &Bound<'_, PyAny>) -> bool {
    v.is_instance_of::<PyString>()
        || v.is_instance_of::<PyBytes>()
        || v.is_instance_of::<PyByteArray>()
}

#[derive(Clone, Copy, PartialEq)]
enum Zero {
    Refuse,
    Allow,
}

/// Seconds as int/float (not bool, not str) or a `datetime.timedelta`.
fn duration(
    py: Python<'_>,
    ctx: Ctx<'_>,
    name: &str,
    v: &Bound<'_, PyAny>,
    zero: Zero,
) -> PyResult<Duration> {
    let kind = if zero == Zero::Refuse {
        "a positive number of seconds or a datetime.timedelta"
    } else {
        "a number of seconds (>= 0) or a datetime.timedelta"
    };
    if v.is_instance_of::<PyBool>() || is_text(v) {
        return Err(bad(py, ctx, name, v, &format!("expected {kind}")));
    }
    let secs: f64 = if v.is_instance(timedelta_type(py)?)? {
        v.call_method0("total_seconds")?.extract()?
    } else {
        match v.extract::<f64>() {
            Ok(f) => f,
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(py) => f64::INFINITY,
            Err(_) => return Err(bad(py, ctx, name, v, &format!("expected {kind}"))),
        }
    };
    if secs.is_nan() {
        return Err(bad(
            py,
            ctx,
            name,
            v,
            &format!("not a number; expected {kind}"),
        ));
    }
    if secs < 0.0 {
        return Err(bad(
            py,
            ctx,
            name,
            v,
            &format!("must not be negative; expected {kind}"),
        ));
    }
    if secs == 0.0 && zero == Zero::Refuse {
        return Err(bad(
            py,
            ctx,
            name,
            v,
            &format!("must be greater than zero; expected {kind}"),
        ));
    }
    if secs > MAX_DURATION.as_secs_f64() {
        return Err(bad(
            py,
            ctx,
            name,
            v,
            &format!(
                "too long: the maximum is {} seconds (about 24.8 days)",
                MAX_DURATION.as_secs_f64()
            ),
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn optional_duration(
    py: Python<'_>,
    ctx: Ctx<'_>,
    name: &str,
    v: &Bound<'_, PyAny>,
    zero: Zero,
) -> PyResult<Option<Duration>> {
    if v.is_none() {
        return Ok(None);
    }
    duration(py, ctx, name, v, zero).map(Some)
}

pub fn boolean(py: Python<'_>, ctx: Ctx<'_>, name: &str, v: &Bound<'_, PyAny>) -> PyResult<bool> {
    if !v.is_instance_of::<PyBool>() {
        return Err(bad(py, ctx, name, v, "expected True or False"));
    }
    v.extract()
}

fn count(py: Python<'_>, ctx: Ctx<'_>, name: &str, v: &Bound<'_, PyAny>) -> PyResult<Option<u32>> {
    if v.is_none() {
        return Ok(None);
    }
    if v.is_instance_of::<PyBool>() || !v.is_instance_of::<pyo3::types::PyInt>() {
        return Err(bad(
            py,
            ctx,
            name,
            v,
            "expected a whole number >= 0 or None",
        ));
    }
    match v.extract::<i64>() {
        Ok(n) if n < 0 => Err(bad(py, ctx, name, v, "must not be negative")),
        Ok(n) if n > i64::from(u32::MAX) => {
            Err(bad(py, ctx, name, v, "too large (at most 4294967295)"))
        }
        Ok(n) => Ok(Some(n as u32)),
        Err(_) => Err(bad(py, ctx, name, v, "too large (at most 4294967295)")),
    }
}

fn fraction(py: Python<'_>, ctx: Ctx<'_>, name: &str, v: &Bound<'_, PyAny>) -> PyResult<f64> {
    if v.is_instance_of::<PyBool>() || is_text(v) {
        return Err(bad(py, ctx, name, v, "expected a number in [0, 1)"));
    }
    let f: f64 = v
        .extract()
        .map_err(|_| bad(py, ctx, name, v, "expected a number in [0, 1)"))?;
    if !f.is_finite() || !(0.0..1.0).contains(&f) {
        return Err(bad(py, ctx, name, v, "expected a number in [0, 1)"));
    }
    Ok(f)
}

/// Applies one per-lock option. `interrupt` is Python-only and returned separately.
fn set_lock_option(
    py: Python<'_>,
    ctx: Ctx<'_>,
    opts: &mut LockOptions,
    interrupt: &mut Option<bool>,
    name: &str,
    v: &Bound<'_, PyAny>,
) -> PyResult<()> {
    match name {
        "ttl" => opts.ttl = duration(py, ctx, name, v, Zero::Refuse)?,
        "wait" => opts.wait = optional_duration(py, ctx, name, v, Zero::Allow)?,
        "retry_delay" => opts.retry_delay = duration(py, ctx, name, v, Zero::Refuse)?,
        "node_timeout" => opts.node_timeout = optional_duration(py, ctx, name, v, Zero::Refuse)?,
        "drift_factor" => opts.drift_factor = fraction(py, ctx, name, v)?,
        "watchdog" => opts.watchdog = boolean(py, ctx, name, v)?,
        "max_hold" => opts.max_hold = optional_duration(py, ctx, name, v, Zero::Refuse)?,
        "max_extensions" => opts.max_extensions = count(py, ctx, name, v)?,
        "reentrant" => opts.reentrant = boolean(py, ctx, name, v)?,
        "fencing" => opts.fencing = boolean(py, ctx, name, v)?,
        "interrupt" => *interrupt = Some(boolean(py, ctx, name, v)?),
        _ => unreachable!("checked by the caller"),
    }
    Ok(())
}

fn unknown(py: Python<'_>, ctx: Ctx<'_>, name: &str, allowed: &[&str]) -> PyErr {
    invalid(
        py,
        format!(
            "{}unexpected option {name:?}; valid options: {}",
            ctx.prefix(),
            allowed.join(", ")
        ),
        ctx.key,
    )
}

/// Per-lock options laid over the manager's defaults.
pub struct LockArgs {
    pub opts: LockOptions,
    pub interrupt: bool,
}

pub fn lock_args(
    py: Python<'_>,
    key: &str,
    defaults: &LockOptions,
    default_interrupt: bool,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<LockArgs> {
    let ctx = Ctx { key: Some(key) };
    let mut opts = defaults.clone();
    let mut interrupt = None;
    if let Some(d) = options {
        for (k, v) in d.iter() {
            let name: String = k.extract()?;
            if LOCK_OPTIONS.contains(&name.as_str()) {
                set_lock_option(py, ctx, &mut opts, &mut interrupt, &name, &v)?;
            } else if MANAGER_OPTIONS.contains(&name.as_str()) {
                return Err(invalid(
                    py,
                    format!(
                        "{}{name} is an option of the LockManager (its connections), not of one lock: pass it to LockManager(...) or redlock(...)",
                        ctx.prefix()
                    ),
                    ctx.key,
                ));
            } else {
                return Err(unknown(py, ctx, &name, LOCK_OPTIONS));
            }
        }
    }
    opts.validate()
        .map_err(|e| invalid(py, format!("{}{}", ctx.prefix(), e.message()), ctx.key))?;
    Ok(LockArgs {
        opts,
        interrupt: interrupt.unwrap_or(default_interrupt),
    })
}

pub struct ManagerArgs {
    pub options: ManagerOptions,
    pub interrupt: bool,
}

fn nodes_list(py: Python<'_>, v: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    let ctx = Ctx { key: None };
    let why =
        "expected a list of node URLs (redis://, rediss://, unix://) or one comma-separated string";
    if let Ok(s) = v.cast::<PyString>() {
        let nodes = split_nodes(s.to_str()?);
        if nodes.iter().all(|n| n.is_empty()) {
            return Err(bad(py, ctx, "nodes", v, "no node URL given"));
        }
        return Ok(nodes);
    }
    if !(v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>()) {
        return Err(bad(py, ctx, "nodes", v, why));
    }
    let mut out = Vec::new();
    for item in v.try_iter()? {
        let item = item?;
        match item.cast::<PyString>() {
            Ok(s) => out.push(s.to_str()?.to_string()),
            Err(_) => return Err(bad(py, ctx, "nodes", v, why)),
        }
    }
    if out.is_empty() {
        return Err(bad(
            py,
            ctx,
            "nodes",
            v,
            "no node URL given (leave nodes out to use FERROLOCK_NODES or redis://127.0.0.1:6379)",
        ));
    }
    Ok(out)
}

pub fn manager_args(
    py: Python<'_>,
    nodes: Option<&Bound<'_, PyAny>>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<ManagerArgs> {
    let ctx = Ctx { key: None };
    let mut mo = ManagerOptions::new();
    let mut interrupt = None;
    if let Some(n) = nodes.filter(|n| !n.is_none()) {
        mo.nodes = nodes_list(py, n)?;
    }
    if let Some(d) = options {
        for (k, v) in d.iter() {
            let name: String = k.extract()?;
            match name.as_str() {
                "nodes" => {
                    if nodes.is_some_and(|n| !n.is_none()) {
                        return Err(invalid(py, "LockManager: nodes given twice", None));
                    }
                    if !v.is_none() {
                        mo.nodes = nodes_list(py, &v)?;
                    }
                }
                "tls_ca" => {
                    if !v.is_none() {
                        let path =
                            py.import("os")?
                                .call_method1("fspath", (&v,))
                                .map_err(|_| {
                                    bad(
                                        py,
                                        ctx,
                                        "tls_ca",
                                        &v,
                                        "expected a path (str or os.PathLike) or None",
                                    )
                                })?;
                        let path: String = path
                            .extract()
                            .map_err(|_| bad(py, ctx, "tls_ca", &v, "expected a str path"))?;
                        mo.tls_ca = Some(PathBuf::from(path));
                    }
                }
                "restart_guard" => {
                    mo.restart_guard =
                        optional_duration(py, ctx, "restart_guard", &v, Zero::Allow)?;
                }
                n if LOCK_OPTIONS.contains(&n) => {
                    set_lock_option(py, ctx, &mut mo.lock, &mut interrupt, n, &v)?;
                }
                _ => {
                    let mut all: Vec<&str> = MANAGER_OPTIONS.to_vec();
                    all.extend_from_slice(LOCK_OPTIONS);
                    return Err(unknown(py, ctx, &name, &all));
                }
            }
        }
    }
    mo.lock
        .validate()
        .map_err(|e| invalid(py, format!("{}{}", ctx.prefix(), e.message()), None))?;
    Ok(ManagerArgs {
        options: mo,
        interrupt: interrupt.unwrap_or(true),
    })
}

/// A key must be a non-empty `str` (the core refuses the empty one with its own message).
pub fn key_str(py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<String> {
    match key.cast::<PyString>() {
        Ok(s) if s.to_str()?.is_empty() => {
            Err(invalid(py, "lock key must not be empty, got ''", Some("")))
        }
        Ok(s) => Ok(s.to_str()?.to_string()),
        Err(_) => {
            let shown = key.repr().map(|r| r.to_string()).unwrap_or_default();
            let ty = key
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default();
            Err(invalid(
                py,
                format!("lock key must be a non-empty str, got {shown} ({ty})"),
                None,
            ))
        }
    }
}
