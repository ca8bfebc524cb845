//! The options table: every option's name, scope, type, unit, default, range and a one-line
//! doc, in one place. Bindings take their option names from it (in their own case: Python
//! snake_case, JavaScript camelCase, the CLI kebab-case), convert their own units (Python
//! seconds, Node and C milliseconds) and set values through `set`, whose errors quote the value
//! as the user wrote it. The README's configuration table is checked against it by a test.

use std::time::Duration;

use super::{LockOptions, MAX_DURATION, ManagerOptions};
use crate::error::{Error, Result};

/// Where an option applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Scope {
    /// How the manager reaches its nodes: set once per manager.
    Manager,
    /// A lock's behaviour: a manager default that each acquire may override.
    Lock,
    /// One binding only (Python's `interrupt`): listed so that every name is in one table.
    Binding(&'static str),
}

/// The type of an option's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Type {
    /// A duration greater than zero, at most `MAX_DURATION`.
    Duration,
    /// A duration, or none (`nothing` says what none means); `zero_ok`: 0 is a value.
    OptionalDuration {
        zero_ok: bool,
    },
    Bool,
    /// A non-negative integer, or none.
    OptionalCount,
    /// A number in [0, 1).
    Fraction,
    /// Node URLs.
    Urls,
    /// A file path, or none.
    OptionalPath,
}

/// One row of the table.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct OptionSpec {
    /// snake_case, as in Python and the core.
    pub name: &'static str,
    pub scope: Scope,
    pub kind: Type,
    /// The unit of a duration ("" for other types): each binding converts its own.
    pub unit: &'static str,
    /// The default, in words (as the README's table shows it).
    pub default: &'static str,
    /// The accepted values, in words.
    pub range: &'static str,
    pub doc: &'static str,
}

impl OptionSpec {
    /// The name in camelCase (JavaScript).
    pub fn camel_case(&self) -> String {
        let mut out = String::with_capacity(self.name.len());
        let mut upper = false;
        for c in self.name.chars() {
            if c == '_' {
                upper = true;
            } else if upper {
                out.extend(c.to_uppercase());
                upper = false;
            } else {
                out.push(c);
            }
        }
        out
    }

    /// The name in kebab-case (command-line flags).
    pub fn kebab_case(&self) -> String {
        self.name.replace('_', "-")
    }
}

const DURATION_RANGE: &str = "> 0, at most 2^31-1 ms";
const MILLIS_RANGE: &str = "1 ms to 2^31-1 ms";

/// Every option, in the order of the README's configuration table.
pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: "nodes",
        scope: Scope::Manager,
        kind: Type::Urls,
        unit: "",
        default: "`FERROLOCK_NODES` or `redis://127.0.0.1:6379`",
        range: "distinct `redis://`, `rediss://`, `unix://` or `redis+cluster://` URLs",
        doc: "comma-separated URLs: `redis://[user:pass@]host[:port][/db][?protocol=…]` (port 6379 when left out), `rediss://…` (TLS), `unix:///path[?db=…&user=…&pass=…]`, `redis+cluster://[user:pass@]host:port[?seed=host:port…]` (a whole Redis Cluster as one node; `rediss+cluster://` with TLS); a new URL starts where a scheme does, so a comma in a password needs no escaping; any other URL parameter, one given twice, or a fragment (`#…`), is refused, and so is one server named twice (`h:1` and `H:1/0` count as one, as do `localhost`, `127.0.0.1` and `[::1]`: Redlock needs independent nodes); two standalone URLs the resolver takes to one server (an alias) are told apart by its `run_id` when they connect, and the second gets no request; so do two `redis+cluster://` URLs whose seeds belong to one cluster (told apart by its nodes' ids when they connect: name a cluster once, its other seeds as `?seed=`)",
    },
    OptionSpec {
        name: "ttl",
        scope: Scope::Lock,
        kind: Type::Duration,
        unit: "duration",
        default: "10 s",
        range: DURATION_RANGE,
        doc: "the lease on each node; the watchdog renews it every ttl/3; at least 100 ms",
    },
    OptionSpec {
        name: "wait",
        scope: Scope::Lock,
        kind: Type::OptionalDuration { zero_ok: true },
        unit: "duration",
        default: "block until acquired",
        range: "none, 0, or at most 2^31-1 ms",
        doc: "`0` = try once; a duration = give up after it; with a quorum unreachable on three attempts in a row, it ends sooner (`QUORUM_UNREACHABLE`)",
    },
    OptionSpec {
        name: "retry_delay",
        scope: Scope::Lock,
        kind: Type::Duration,
        unit: "duration",
        default: "100 ms, jittered ±50 %",
        range: MILLIS_RANGE,
        doc: "between attempts (at least 1 ms)",
    },
    OptionSpec {
        name: "node_timeout",
        scope: Scope::Lock,
        kind: Type::OptionalDuration { zero_ok: false },
        unit: "duration",
        default: "min(200 ms, ttl/10)",
        range: MILLIS_RANGE,
        doc: "per node, per request (at least 1 ms); an acquire whose loss margin (2 × node timeout) is not \
              under ttl/3 is refused, as `extend(ttl)` is (the default always fits)",
    },
    OptionSpec {
        name: "drift_factor",
        scope: Scope::Lock,
        kind: Type::Fraction,
        unit: "",
        default: "0.01",
        range: "[0, 1)",
        doc: "drift = ttl × factor + 2 ms; an acquire whose validity (ttl - drift) cannot outlast the \
              watchdog's first renewal and the loss margin (drift + 3 × node timeout under 2·ttl/3) is \
              refused (the default always fits)",
    },
    OptionSpec {
        name: "watchdog",
        scope: Scope::Lock,
        kind: Type::Bool,
        unit: "",
        default: "on",
        range: "on or off",
        doc: "off = the ttl bounds the hold",
    },
    OptionSpec {
        name: "max_hold",
        scope: Scope::Lock,
        kind: Type::OptionalDuration { zero_ok: false },
        unit: "duration",
        default: "none",
        range: DURATION_RANGE,
        doc: "the watchdog stops renewing and signals loss after this (at least 1 ms); the validity an extend returns, and the lock's `validity`, never reach past it (its `deadline`, when another may take the key, stays the lease's)",
    },
    OptionSpec {
        name: "max_extensions",
        scope: Scope::Lock,
        kind: Type::OptionalCount,
        unit: "",
        default: "none",
        range: "0 to 2^32-1",
        doc: "cap on manual extends: one past it is refused as an invalid argument, the lock still held",
    },
    OptionSpec {
        name: "reentrant",
        scope: Scope::Lock,
        kind: Type::Bool,
        unit: "",
        default: "off",
        range: "on or off",
        doc: "Redisson-compatible hash lock",
    },
    OptionSpec {
        name: "fencing",
        scope: Scope::Lock,
        kind: Type::Bool,
        unit: "",
        default: "off",
        range: "on or off",
        doc: "each grant carries a fence token",
    },
    OptionSpec {
        name: "restart_guard",
        scope: Scope::Manager,
        kind: Type::OptionalDuration { zero_ok: true },
        unit: "duration",
        default: "the longest lease asked for when N >= 3, off when N < 3",
        range: "0 (off) to 2^31-1 ms",
        doc: "window after a node's (re)start in which its vote does not count; 0 = off, else at least 1 ms; by default the manager's ttl, widened to any longer ttl an acquire, extend or `withLock` of this manager asks for (set it when other processes use longer ttls on the same keys)",
    },
    OptionSpec {
        name: "tls_ca",
        scope: Scope::Manager,
        kind: Type::OptionalPath,
        unit: "",
        default: "`FERROLOCK_TLS_CA` or system roots",
        range: "a readable PEM file",
        doc: "CA file for `rediss://`",
    },
    OptionSpec {
        name: "sharded_pubsub",
        scope: Scope::Manager,
        kind: Type::Bool,
        unit: "",
        default: "on",
        range: "on or off",
        doc: "on a Redis Cluster 7.0+, wake-ups use sharded pub/sub (as Redisson's `shardedSubscriptionMode` AUTO); off = classic pub/sub (for Redisson clients with it OFF)",
    },
    OptionSpec {
        name: "interrupt",
        scope: Scope::Binding("python"),
        kind: Type::Bool,
        unit: "",
        default: "on",
        range: "on or off",
        doc: "Python only: a loss raises `LockLost` inside the `with` body (off: the body finishes, the exit raises)",
    },
];

/// The row of `name` (snake_case), if there is one.
pub fn spec(name: &str) -> Option<&'static OptionSpec> {
    OPTIONS.iter().find(|o| o.name == name)
}

/// A value for `set`, already in the core's units; `None` is "none" / "default".
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Value {
    None,
    Duration(Duration),
    Bool(bool),
    Count(u64),
    Number(f64),
    Text(String),
    List(Vec<String>),
}

impl ManagerOptions {
    /// Sets the option `name` (snake_case) to `value`. `written` is the value as the user
    /// wrote it (`"0"`, `"-5"`, `"10 s"`): every error reads `name=written: why`, the form every
    /// binding uses for the values it refuses itself. A binding-only option
    /// (`Scope::Binding`) is refused here: the binding handles it.
    pub fn set(&mut self, name: &str, value: Value, written: &str) -> Result<()> {
        let Some(spec) = spec(name) else {
            let known: Vec<&str> = OPTIONS
                .iter()
                .filter(|o| !matches!(o.scope, Scope::Binding(_)))
                .map(|o| o.name)
                .collect();
            return Err(Error::invalid(format!(
                "unknown option {name:?} (known: {})",
                known.join(", ")
            )));
        };
        let bad = |why: &str| Error::invalid(format!("{name}={written}: {why}"));
        let duration = |v: &Value, zero_ok: bool| -> Result<Option<Duration>> {
            match v {
                Value::None => Ok(None),
                Value::Duration(d) if d.is_zero() && !zero_ok => {
                    Err(bad("must be greater than zero"))
                }
                Value::Duration(d) if *d > MAX_DURATION => Err(bad(&format!(
                    "too long: the maximum is {}ms (about 24.8 days)",
                    MAX_DURATION.as_millis()
                ))),
                Value::Duration(d) => Ok(Some(*d)),
                _ => Err(bad("expected a duration")),
            }
        };
        let flag = |v: &Value| match v {
            Value::Bool(b) => Ok(*b),
            _ => Err(bad("expected true or false")),
        };
        let lock: &mut LockOptions = &mut self.lock;
        match (spec.name, &spec.kind) {
            ("ttl", _) => match duration(&value, false)? {
                Some(d) => lock.ttl = d,
                None => return Err(bad("must be a duration (it has no \"none\")")),
            },
            ("retry_delay", _) => match duration(&value, false)? {
                Some(d) => lock.retry_delay = d,
                None => return Err(bad("must be a duration (it has no \"none\")")),
            },
            ("wait", _) => lock.wait = duration(&value, true)?,
            ("node_timeout", _) => lock.node_timeout = duration(&value, false)?,
            ("max_hold", _) => lock.max_hold = duration(&value, false)?,
            ("restart_guard", _) => self.restart_guard = duration(&value, true)?,
            ("sharded_pubsub", _) => self.sharded_pubsub = flag(&value)?,
            ("drift_factor", _) => match value {
                Value::Number(f) if f.is_finite() && (0.0..1.0).contains(&f) => {
                    lock.drift_factor = f
                }
                _ => return Err(bad("expected a number in [0, 1)")),
            },
            ("watchdog", _) => lock.watchdog = flag(&value)?,
            ("reentrant", _) => lock.reentrant = flag(&value)?,
            ("fencing", _) => lock.fencing = flag(&value)?,
            ("max_extensions", _) => {
                lock.max_extensions = match value {
                    Value::None => None,
                    Value::Count(n) => {
                        Some(u32::try_from(n).map_err(|_| bad("too large (at most 4294967295)"))?)
                    }
                    _ => return Err(bad("expected a non-negative integer")),
                }
            }
            ("nodes", _) => {
                // Left out (None) means FERROLOCK_NODES, else the local node; written out
                // empty (`nodes: []`, Go's `Nodes()`, `--nodes ""`), it is a mistake.
                let empty = super::NO_NODE_GIVEN;
                self.nodes = match value {
                    Value::None => None,
                    Value::Text(list) if list.trim().is_empty() => return Err(bad(empty)),
                    Value::Text(list) => Some(super::split_nodes(&list)),
                    Value::List(list) if list.is_empty() => return Err(bad(empty)),
                    Value::List(list) => Some(list),
                    _ => return Err(bad("expected node URLs")),
                }
            }
            ("tls_ca", _) => {
                self.tls_ca = match value {
                    Value::None => None,
                    Value::Text(path) if !path.is_empty() => Some(path.into()),
                    _ => return Err(bad("expected a file path")),
                }
            }
            (other, _) => {
                return Err(Error::invalid(format!(
                    "option {other:?} is handled by a binding, not by the core"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_in_each_case() {
        let s = spec("retry_delay").unwrap();
        assert_eq!(s.camel_case(), "retryDelay");
        assert_eq!(s.kebab_case(), "retry-delay");
        assert_eq!(spec("ttl").unwrap().camel_case(), "ttl");
    }

    #[test]
    fn every_core_option_can_be_set_by_name() {
        let mut o = ManagerOptions::new();
        o.set("ttl", Value::Duration(Duration::from_secs(3)), "3s")
            .unwrap();
        o.set("wait", Value::Duration(Duration::ZERO), "0").unwrap();
        o.set(
            "retry_delay",
            Value::Duration(Duration::from_millis(5)),
            "5ms",
        )
        .unwrap();
        o.set("node_timeout", Value::None, "None").unwrap();
        o.set("drift_factor", Value::Number(0.02), "0.02").unwrap();
        o.set("watchdog", Value::Bool(false), "false").unwrap();
        o.set("max_hold", Value::Duration(Duration::from_secs(9)), "9s")
            .unwrap();
        o.set("max_extensions", Value::Count(4), "4").unwrap();
        o.set("reentrant", Value::Bool(true), "true").unwrap();
        o.set("fencing", Value::Bool(true), "true").unwrap();
        o.set("restart_guard", Value::Duration(Duration::ZERO), "0")
            .unwrap();
        o.set("nodes", Value::Text("redis://a:1, redis://b:2".into()), "…")
            .unwrap();
        o.set("tls_ca", Value::Text("/ca.pem".into()), "/ca.pem")
            .unwrap();
        assert!(o.sharded_pubsub);
        o.set("sharded_pubsub", Value::Bool(false), "false")
            .unwrap();
        assert!(!o.sharded_pubsub);
        let l = &o.lock;
        assert_eq!(l.ttl, Duration::from_secs(3));
        assert_eq!(l.wait, Some(Duration::ZERO));
        assert_eq!(l.retry_delay, Duration::from_millis(5));
        assert_eq!(l.drift_factor, 0.02);
        assert!(!l.watchdog && l.reentrant && l.fencing);
        assert_eq!(l.max_hold, Some(Duration::from_secs(9)));
        assert_eq!(l.max_extensions, Some(4));
        assert_eq!(o.restart_guard, Some(Duration::ZERO));
        assert_eq!(o.nodes.unwrap(), ["redis://a:1", "redis://b:2"]);
        assert_eq!(o.tls_ca.as_deref(), Some(std::path::Path::new("/ca.pem")));
    }

    #[test]
    fn an_explicitly_empty_node_list_is_refused_and_none_is_the_default() {
        let mut o = ManagerOptions::default();
        for (value, written) in [
            (Value::List(Vec::new()), "[]"),
            (Value::Text(String::new()), "\"\""),
            (Value::Text(" ".into()), "\" \""),
        ] {
            let err = o.set("nodes", value, written).unwrap_err();
            assert!(
                err.message()
                    .starts_with(&format!("nodes={written}: no node URL")),
                "{err}"
            );
        }
        o.set("nodes", Value::None, "null").unwrap();
        assert!(
            o.nodes.is_none(),
            "None leaves the FERROLOCK_NODES fallback"
        );
    }

    #[test]
    fn errors_quote_the_value_as_written() {
        let mut o = ManagerOptions::new();
        let e = o
            .set("ttl", Value::Duration(Duration::ZERO), "0.0")
            .unwrap_err();
        assert_eq!(e.to_string(), "ttl=0.0: must be greater than zero");
        let e = o
            .set("max_extensions", Value::Count(1 << 40), "1099511627776")
            .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("max_extensions=1099511627776: too large"),
            "{e}"
        );
        let e = o
            .set("drift_factor", Value::Number(1.5), "1.5")
            .unwrap_err();
        assert!(e.to_string().contains("drift_factor=1.5"), "{e}");
        let e = o
            .set("watchdog", Value::Text("yes".into()), "'yes'")
            .unwrap_err();
        assert!(e.to_string().contains("watchdog='yes'"), "{e}");
        let e = o.set("tll", Value::None, "1").unwrap_err();
        assert!(e.to_string().contains("unknown option \"tll\""), "{e}");
        let e = o.set("interrupt", Value::Bool(true), "True").unwrap_err();
        assert!(e.to_string().contains("binding"), "{e}");
        let e = o
            .set(
                "wait",
                Value::Duration(MAX_DURATION + Duration::from_millis(1)),
                "30d",
            )
            .unwrap_err();
        assert!(e.to_string().contains("wait=30d: too long"), "{e}");
    }

    /// The README's configuration table is this table: same options, order, defaults, docs.
    #[test]
    fn the_readme_configuration_table_matches() {
        let readme = include_str!("../../../README.md");
        let start = readme
            .find("| option | default | meaning |")
            .expect("README has a configuration table");
        let rows: Vec<(String, String, String)> = readme[start..]
            .lines()
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                let cells: Vec<&str> = l.trim_matches('|').split(" | ").map(str::trim).collect();
                (
                    cells[0].trim_matches('`').to_string(),
                    cells[1].to_string(),
                    cells[2].to_string(),
                )
            })
            .collect();
        let table: Vec<(String, String, String)> = OPTIONS
            .iter()
            .map(|o| (o.name.to_string(), o.default.to_string(), o.doc.to_string()))
            .collect();
        assert_eq!(
            rows, table,
            "README's configuration table differs from OPTIONS"
        );
    }

    /// The Python stubs declare exactly the table's options (core and Python-only).
    #[test]
    fn the_python_stubs_declare_every_option() {
        let stub = include_str!("../../../python/python/ferrolock/__init__.pyi");
        let mut declared: Vec<&str> = Vec::new();
        for class in ["_LockOptions", "_ConnectionOptions", "_RedlockOptions"] {
            let at = stub
                .find(&format!("class {class}("))
                .unwrap_or_else(|| panic!("no {class} in the stubs"));
            for line in stub[at..].lines().skip(1) {
                let Some(field) = line.strip_prefix("    ") else {
                    break;
                };
                let Some((name, _)) = field.split_once(':') else {
                    break;
                };
                declared.push(name.trim());
            }
        }
        declared.sort_unstable();
        let mut names: Vec<&str> = OPTIONS
            .iter()
            .filter(|o| {
                matches!(
                    o.scope,
                    Scope::Manager | Scope::Lock | Scope::Binding("python")
                )
            })
            .map(|o| o.name)
            .collect();
        names.sort_unstable();
        assert_eq!(
            declared, names,
            "the stubs' option names differ from OPTIONS"
        );
    }
}
