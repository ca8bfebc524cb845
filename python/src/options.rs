//! Keyword options from Python into the core's options table (`ferrolock::OPTIONS`). Each
//! value is converted by the type the table declares for its option (durations from float
//! seconds or `datetime.timedelta`, strict bools and counts) and set through
//! `ManagerOptions::set`, which checks ranges and words its errors `name=value: why` with the
//! value as Python shows it (`repr`). A value of the wrong Python type is refused here, in the
//! same words. Every refusal is an `InvalidArgument` (a ValueError and a TypeError) naming the
//! option, the value and, for a lock, the key.

use std::time::Duration;

use ferrolock::host;
use ferrolock::{LockOptions, MAX_DURATION, ManagerOptions, OPTIONS, OptionScope, OptionType};
use ferrolock::{OptionSpec, OptionValue as Value, option_spec};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyMemoryView, PyString, PyTuple,
    PyType,
};

use crate::errors::invalid;

/// This binding's own options (the table's `Scope::Binding("python")` rows).
const BINDING: OptionScope = OptionScope::Binding("python");

fn names(keep: impl Fn(OptionScope) -> bool) -> Vec<&'static str> {
    OPTIONS
        .iter()
        .filter(|o| keep(o.scope))
        .map(|o| o.name)
        .collect()
}

/// Options of one lock, accepted by `LockManager(...)` (as defaults), `redlock()`,
/// `manager.lock()` and `manager.acquire()`.
pub fn lock_options() -> Vec<&'static str> {
    names(|s| s == OptionScope::Lock || s == BINDING)
}

/// Options of the connection, accepted by `LockManager(...)` and `redlock()` only.
pub fn manager_options() -> Vec<&'static str> {
    names(|s| s == OptionScope::Manager)
}

/// Where the option was given, for messages: a lock's key, or the manager.
#[derive(Clone, Copy)]
struct Ctx<'a> {
    key: Option<&'a str>,
    /// What the key names, as the core's errors say it: "lock", or "semaphore".
    what: &'static str,
}

impl Ctx<'_> {
    fn prefix(&self) -> String {
        match self.key {
            Some(k) => format!("{} {}: ", self.what, ferrolock::quoted_key(k)),
            None => "LockManager: ".to_string(),
        }
    }

    fn invalid(&self, py: Python<'_>, message: impl std::fmt::Display) -> PyErr {
        invalid(py, format!("{}{message}", self.prefix()), self.key)
    }
}

/// The value as Python shows it: what the user wrote, as close as can be known; a node URL
/// given to another option by mistake without its password, as `nodes` shows one.
fn written(value: &Bound<'_, PyAny>) -> String {
    let redacted = match value.cast::<PyString>().map(|s| s.to_str()) {
        Ok(Ok(text)) if text.contains("://") => {
            Some(PyString::new(value.py(), &ferrolock::redact_url(text)))
        }
        _ => None,
    };
    redacted
        .as_ref()
        .map_or(value, |r| r.as_any())
        .repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "<unprintable>".to_string())
}

/// `nodes` as a message may show it: each URL's credentials redacted; a number or `None` as
/// written, anything else by its type alone (bytes, a dict: its repr could hold a password).
fn written_nodes(py: Python<'_>, value: &Bound<'_, PyAny>) -> String {
    let url = |item: &Bound<'_, PyAny>| match item.cast::<PyString>().map(|s| s.to_str()) {
        Ok(Ok(text)) => {
            let shown: Vec<String> = ferrolock::split_nodes(text)
                .iter()
                .map(|u| ferrolock::redact_url(u))
                .collect();
            written(PyString::new(py, &shown.join(",")).as_any())
        }
        Ok(Err(_)) => "<str that is not valid UTF-8>".to_string(),
        Err(_)
            if item.is_none()
                || item.is_instance_of::<PyInt>()
                || item.is_instance_of::<PyFloat>() =>
        {
            written(item)
        }
        Err(_) => format!("<{}>", type_name(item)),
    };
    if value.is_instance_of::<PyString>() {
        return url(value);
    }
    let (open, close) = match value.is_instance_of::<PyTuple>() {
        true => ("(", ")"),
        false => ("[", "]"),
    };
    let plain = value.is_instance_of::<PyList>() || value.is_instance_of::<PyTuple>();
    // Another sequence (a deque, a UserList) as its type around a list: `deque([...])`.
    let other = !plain
        && !is_text(value)
        && !value.is_instance_of::<PyMemoryView>()
        && is_sequence(py, value).unwrap_or(false);
    match value.try_iter() {
        Ok(items) if plain || other => {
            let shown: Vec<String> = items.map(|i| i.map_or("?".into(), |i| url(&i))).collect();
            let listed = format!("{open}{}{close}", shown.join(", "));
            match other {
                true => format!("{}({listed})", type_name(value)),
                false => listed,
            }
        }
        _ => url(value),
    }
}

fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_string())
}

/// A value of the wrong Python type (or one no core type can hold), in the core's wording.
fn bad(py: Python<'_>, ctx: Ctx<'_>, name: &str, value: &Bound<'_, PyAny>, why: &str) -> PyErr {
    let ty = type_name(value);
    let shown = match name {
        "nodes" => written_nodes(py, value),
        _ => written(value),
    };
    ctx.invalid(py, format!("{name}={shown} ({ty}): {why}"))
}

pub(crate) fn timedelta_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static TIMEDELTA: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    TIMEDELTA.import(py, "datetime", "timedelta")
}

fn is_text(v: &Bound<'_, PyAny>) -> bool {
    v.is_instance_of::<PyString>()
        || v.is_instance_of::<PyBytes>()
        || v.is_instance_of::<PyByteArray>()
}

/// Seconds as int/float (not bool, not str) or a `datetime.timedelta`, into a `Duration`.
/// Zero and the upper bound are left to the core; a negative or NaN value has no `Duration`.
fn duration(py: Python<'_>, ctx: Ctx<'_>, name: &str, v: &Bound<'_, PyAny>) -> PyResult<Duration> {
    let expected = "expected a number of seconds or a datetime.timedelta";
    if v.is_instance_of::<PyBool>() || is_text(v) {
        return Err(bad(py, ctx, name, v, expected));
    }
    let secs: f64 = if v.is_instance(timedelta_type(py)?)? {
        v.call_method0("total_seconds")?.extract()?
    } else {
        match v.extract::<f64>() {
            Ok(f) => f,
            // An int too large for a float: past the bound either way, on its own side of 0.
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(py) => {
                if v.lt(0)? {
                    f64::NEG_INFINITY
                } else {
                    f64::INFINITY
                }
            }
            Err(_) => return Err(bad(py, ctx, name, v, expected)),
        }
    };
    if secs.is_nan() {
        return Err(bad(py, ctx, name, v, &format!("not a number; {expected}")));
    }
    if secs < 0.0 {
        return Err(bad(py, ctx, name, v, "must not be negative"));
    }
    // Anything past the bound is refused by the core as "too long"; one past it is enough.
    // Under a nanosecond: not the zero it would round to (the core would say "got 0").
    if secs > 0.0 && secs < 1e-9 {
        return Err(bad(
            py,
            ctx,
            name,
            v,
            "shorter than a nanosecond, the smallest duration",
        ));
    }
    Ok(if secs > MAX_DURATION.as_secs_f64() {
        MAX_DURATION + Duration::from_millis(1)
    } else {
        Duration::from_secs_f64(secs)
    })
}

fn boolean(py: Python<'_>, ctx: Ctx<'_>, name: &str, v: &Bound<'_, PyAny>) -> PyResult<bool> {
    if !v.is_instance_of::<PyBool>() {
        return Err(bad(py, ctx, name, v, "expected True or False"));
    }
    v.extract()
}

/// Whether `v` is a `collections.abc.Sequence` (registered ones included: a deque).
fn is_sequence(py: Python<'_>, v: &Bound<'_, PyAny>) -> PyResult<bool> {
    static SEQUENCE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    v.is_instance(SEQUENCE.import(py, "collections.abc", "Sequence")?)
}

fn node_urls(py: Python<'_>, ctx: Ctx<'_>, v: &Bound<'_, PyAny>) -> PyResult<Value> {
    let why = "expected a list (or any sequence) of node URLs (redis://, rediss://, unix://, redis+cluster://, ...) or one comma-separated string";
    let not_text = "bytes are not text: pass the node URLs as str (decode them), a list of them or one comma-separated string";
    // An empty list written out is a mistake (the core refuses it too); leaving `nodes` out
    // is how the default nodes are asked for.
    let empty =
        "no node URL given (leave nodes out to use FERROLOCK_NODES or redis://127.0.0.1:6379)";
    let not_utf8 = "a node URL that is not valid UTF-8 (a lone surrogate)";
    if let Ok(s) = v.cast::<PyString>() {
        let Ok(s) = s.to_str() else {
            return Err(bad(py, ctx, "nodes", v, not_utf8));
        };
        if s.split(',').all(|n| n.trim().is_empty()) {
            return Err(bad(py, ctx, "nodes", v, empty));
        }
        return Ok(Value::Text(s.to_string()));
    }
    // Bytes are a sequence too (of ints), and a URL written as bytes is no URL: said so.
    if v.is_instance_of::<PyBytes>()
        || v.is_instance_of::<PyByteArray>()
        || v.is_instance_of::<PyMemoryView>()
    {
        return Err(bad(py, ctx, "nodes", v, not_text));
    }
    // Any sequence, as the stub declares (`Sequence[str]`): a list, a tuple, a deque, a
    // UserList... A set or a dict (no order, or no URLs) is not one.
    if !(v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>() || is_sequence(py, v)?) {
        return Err(bad(py, ctx, "nodes", v, why));
    }
    let mut out = Vec::new();
    for item in v.try_iter()? {
        match item?
            .cast::<PyString>()
            .map(|s| s.to_str().map(str::to_string))
        {
            Ok(Ok(s)) => out.push(s),
            Ok(Err(_)) => return Err(bad(py, ctx, "nodes", v, not_utf8)),
            Err(_) => return Err(bad(py, ctx, "nodes", v, why)),
        }
    }
    if out.is_empty() {
        return Err(bad(py, ctx, "nodes", v, empty));
    }
    Ok(Value::List(out))
}

/// The Python value of option `kind` as the core's value; `None` is the option's "none".
fn convert(
    py: Python<'_>,
    ctx: Ctx<'_>,
    name: &str,
    kind: OptionType,
    v: &Bound<'_, PyAny>,
) -> PyResult<Value> {
    if v.is_none() && !matches!(kind, OptionType::Bool | OptionType::Urls) {
        return Ok(Value::None);
    }
    // `wait=math.inf` blocks, as `None` does (and as Node's `wait: Infinity`): a user who
    // writes "wait forever" as a number means exactly that. Only a float infinity: an int
    // past the bound stays "too long", as does infinity for any other option.
    if name == "wait" && v.is_instance_of::<PyFloat>() && v.extract::<f64>()? == f64::INFINITY {
        return Ok(Value::None);
    }
    Ok(match kind {
        OptionType::Duration | OptionType::OptionalDuration { .. } => {
            Value::Duration(duration(py, ctx, name, v)?)
        }
        OptionType::Bool => Value::Bool(boolean(py, ctx, name, v)?),
        OptionType::OptionalCount => {
            if v.is_instance_of::<PyBool>() || !v.is_instance_of::<PyInt>() {
                return Err(bad(
                    py,
                    ctx,
                    name,
                    v,
                    "expected a whole number >= 0 or None",
                ));
            }
            match v.extract::<u64>() {
                Ok(n) => Value::Count(n),
                Err(_) if v.lt(0)? => return Err(bad(py, ctx, name, v, "must not be negative")),
                // Past u64: the core refuses anything past its own bound as too large.
                Err(_) => Value::Count(u64::MAX),
            }
        }
        OptionType::Fraction => {
            if v.is_instance_of::<PyBool>() || is_text(v) {
                return Err(bad(py, ctx, name, v, "expected a number in [0, 1)"));
            }
            Value::Number(
                v.extract()
                    .map_err(|_| bad(py, ctx, name, v, "expected a number in [0, 1)"))?,
            )
        }
        OptionType::Urls => node_urls(py, ctx, v)?,
        OptionType::OptionalPath => {
            let why = "expected a path (str or os.PathLike) or None";
            let path = py
                .import("os")?
                .call_method1("fspath", (v,))
                .map_err(|_| bad(py, ctx, name, v, why))?;
            Value::Text(path.extract().map_err(|_| bad(py, ctx, name, v, why))?)
        }
        _ => {
            return Err(bad(
                py,
                ctx,
                name,
                v,
                "this option's type is not supported in Python",
            ));
        }
    })
}

/// Sets one option through the core's table; the Python-only `interrupt` is returned instead.
fn set(
    py: Python<'_>,
    ctx: Ctx<'_>,
    opts: &mut ManagerOptions,
    interrupt: &mut Option<bool>,
    spec: &OptionSpec,
    v: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let name = spec.name;
    if spec.scope == BINDING {
        *interrupt = Some(boolean(py, ctx, name, v)?);
        return Ok(());
    }
    let value = convert(py, ctx, name, spec.kind, v)?;
    let shown = match spec.kind {
        OptionType::Urls => written_nodes(py, v),
        _ => written(v),
    };
    opts.set(name, value, &shown)
        .map_err(|e| ctx.invalid(py, e.message()))
}

fn unknown(py: Python<'_>, ctx: Ctx<'_>, name: &str, allowed: &[&str]) -> PyErr {
    ctx.invalid(
        py,
        format!(
            "unexpected option {:?}; valid options: {}",
            // A node URL passed as a keyword's name (`**{url: 1}`): shown as URLs are.
            match name.contains("://") {
                true => ferrolock::redact_url(name),
                false => name.to_string(),
            },
            allowed.join(", ")
        ),
    )
}

/// Per-lock options laid over the manager's defaults.
pub struct LockArgs {
    pub opts: LockOptions,
    pub interrupt: bool,
}

/// `what` names the key in errors, as the core does: "lock", or "semaphore". `also`: the
/// other names the call takes (a semaphore's `permits`, `redlock()`'s connection options),
/// listed with the lock options when an unknown one is refused.
pub fn lock_args(
    py: Python<'_>,
    key: &str,
    what: &'static str,
    defaults: &LockOptions,
    default_interrupt: bool,
    options: Option<&Bound<'_, PyDict>>,
    also: &[&str],
) -> PyResult<LockArgs> {
    let ctx = Ctx {
        key: Some(key),
        what,
    };
    let mut opts = ManagerOptions::new().lock(defaults.clone());
    let mut interrupt = None;
    if let Some(d) = options {
        for (k, v) in d.iter() {
            let name: String = k.extract()?;
            match option_spec(&name) {
                // Asked of a semaphore, it would promise the owner's nested block re-enters
                // its hold, where it takes permits of its own (a manager's default is every
                // lock's: not asked of this one). `ferrolock run` refuses the pair alike.
                Some(spec)
                    if what == "semaphore"
                        && spec.name == "reentrant"
                        && boolean(py, ctx, spec.name, &v)? =>
                {
                    return Err(ctx.invalid(
                        py,
                        "reentrant=True: a semaphore never re-enters (each `with` is a holder \
                         of its own, taking permits of its own, also inside its owner's block \
                         of it); leave reentrant out",
                    ));
                }
                Some(spec) if spec.scope == OptionScope::Lock || spec.scope == BINDING => {
                    set(py, ctx, &mut opts, &mut interrupt, spec, &v)?
                }
                Some(spec) if spec.scope == OptionScope::Manager => {
                    return Err(ctx.invalid(
                        py,
                        format!("{name} is an option of the LockManager (its connections), not of one lock: pass it to LockManager(...) or redlock(...)"),
                    ));
                }
                _ => {
                    let mut allowed = also.to_vec();
                    allowed.extend(lock_options());
                    return Err(unknown(py, ctx, &name, &allowed));
                }
            }
        }
    }
    opts.lock
        .validate()
        .map_err(|e| ctx.invalid(py, e.message()))?;
    Ok(LockArgs {
        opts: opts.lock,
        interrupt: interrupt.unwrap_or(default_interrupt),
    })
}

pub struct ManagerArgs {
    pub options: ManagerOptions,
    pub interrupt: bool,
}

pub fn manager_args(
    py: Python<'_>,
    nodes: Option<&Bound<'_, PyAny>>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<ManagerArgs> {
    let ctx = Ctx {
        key: None,
        what: "lock",
    };
    let mut mo = ManagerOptions::new();
    let mut interrupt = None;
    let positional = nodes.filter(|n| !n.is_none());
    if let Some(n) = positional {
        mo.set("nodes", node_urls(py, ctx, n)?, &written_nodes(py, n))
            .map_err(|e| ctx.invalid(py, e.message()))?;
    }
    if let Some(d) = options {
        for (k, v) in d.iter() {
            let name: String = k.extract()?;
            let Some(spec) = option_spec(&name).filter(|s| {
                matches!(s.scope, OptionScope::Manager | OptionScope::Lock) || s.scope == BINDING
            }) else {
                let mut all = manager_options();
                all.extend(lock_options());
                return Err(unknown(py, ctx, &name, &all));
            };
            if spec.name == "nodes" {
                if positional.is_some() {
                    return Err(ctx.invalid(py, "nodes given twice"));
                }
                // `nodes=None` is the default (FERROLOCK_NODES, else the local node).
                if v.is_none() {
                    continue;
                }
            }
            set(py, ctx, &mut mo, &mut interrupt, spec, &v)?;
        }
    }
    mo.lock
        .validate()
        .map_err(|e| ctx.invalid(py, e.message()))?;
    Ok(ManagerArgs {
        options: mo,
        interrupt: interrupt.unwrap_or(true),
    })
}

/// The kind a `LockContext` takes: "lock", "read", "write" or "semaphore" (which alone takes
/// `permits`, the pool size, and `count`, how many of them this holder takes; default 1).
/// Only their Python types are checked here: the core's semaphore entry refuses a value
/// out of range (0, count > permits or 1000), naming it.
pub fn lock_kind(
    py: Python<'_>,
    key: &str,
    kind: &str,
    permits: Option<&Bound<'_, PyAny>>,
    count: Option<&Bound<'_, PyAny>>,
) -> PyResult<host::Kind> {
    let ctx = Ctx {
        key: Some(key),
        what: if kind == "semaphore" {
            "semaphore"
        } else {
            "lock"
        },
    };
    let (permits, count) = (
        permits.filter(|v| !v.is_none()),
        count.filter(|v| !v.is_none()),
    );
    if kind != "semaphore"
        && let Some((name, v)) = [("permits", permits), ("count", count)]
            .into_iter()
            .find_map(|(n, v)| v.map(|v| (n, v)))
    {
        return Err(bad(
            py,
            ctx,
            name,
            v,
            "only a semaphore takes permits and count",
        ));
    }
    match kind {
        "lock" => Ok(host::Kind::Lock),
        "read" => Ok(host::Kind::Read),
        "write" => Ok(host::Kind::Write),
        "semaphore" => {
            let Some(p) = permits else {
                return Err(ctx.invalid(
                    py,
                    "a semaphore needs permits=N, the size of its pool of permits",
                ));
            };
            Ok(host::Kind::Permits {
                permits: permit_count(py, ctx, "permits", p)?,
                count: count.map_or(Ok(1), |c| permit_count(py, ctx, "count", c))?,
            })
        }
        _ => Err(invalid(
            py,
            format!("lock kind must be 'lock', 'read', 'write' or 'semaphore', got {kind:?}"),
            None,
        )),
    }
}

/// A number of permits: an `int` (not a bool), 0 up to 2**32-1; 0 is refused by the core.
fn permit_count(py: Python<'_>, ctx: Ctx<'_>, name: &str, v: &Bound<'_, PyAny>) -> PyResult<u32> {
    if v.is_instance_of::<PyBool>() || !v.is_instance_of::<PyInt>() {
        return Err(bad(py, ctx, name, v, "expected a whole number >= 1"));
    }
    v.extract::<u32>().map_err(|_| {
        let why = match v.lt(0) {
            Ok(true) => "must be at least 1",
            _ => "too large (at most 4294967295)",
        };
        bad(py, ctx, name, v, why)
    })
}

/// A key must be a non-empty `str` (the core refuses the empty one with its own message).
/// `what` names it: "lock key", or "semaphore name" (as Node does).
pub fn key_str(py: Python<'_>, key: &Bound<'_, PyAny>, what: &str) -> PyResult<String> {
    match key.cast::<PyString>() {
        Ok(s) => match s.to_str() {
            Ok("") => Err(invalid(
                py,
                format!("{what} must not be empty, got ''"),
                Some(""),
            )),
            Ok(text) => Ok(text.to_string()),
            // A lone surrogate: no UTF-8 holds it, so it could only be sent altered (and two
            // keys would then name one lock).
            Err(_) => {
                // A long one as the core shows a key (its start, its lone surrogates as
                // U+FFFD, and the length it would have), not repeated whole; a short one as
                // Python writes it, its surrogate escaped.
                let long = ferrolock::quoted_key(&s.to_string_lossy());
                let shown = if long.ends_with('"') {
                    key.repr().map(|r| r.to_string()).unwrap_or_default()
                } else {
                    long
                };
                Err(invalid(
                    py,
                    format!(
                        "{what} {shown} is not valid Unicode (it holds a lone surrogate, which \
                         UTF-8 cannot carry)"
                    ),
                    None,
                ))
            }
        },
        Err(_) => {
            let shown = key.repr().map(|r| r.to_string()).unwrap_or_default();
            let ty = key
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default();
            Err(invalid(
                py,
                format!("{what} must be a non-empty str, got {shown} ({ty})"),
                None,
            ))
        }
    }
}
