//! Options from JavaScript into the core's option structs. `options.js` checks the JavaScript
//! types (integer milliseconds, booleans) and hands over entries already in the core's
//! units; this sets them by name through the core's table, whose errors quote the value as
//! the user wrote it.

use std::time::Duration;

use ferrolock::{LockOptions, ManagerOptions, OPTIONS, OptionScope, OptionType, OptionValue};
use napi_derive::napi;

use crate::errors::{guard, invalid, to_napi};

/// One row of the core's options table, as `options.js` needs it.
#[napi(object)]
pub struct OptionRow {
    /// camelCase, the JavaScript name.
    pub name: String,
    /// snake_case, the core's name.
    pub core: String,
    /// "manager", "lock" or "binding".
    pub scope: String,
    /// "duration", "optionalDuration", "optionalDurationOrZero", "bool", "optionalCount",
    /// "fraction", "urls", "optionalPath".
    pub kind: String,
    pub default: String,
    pub doc: String,
}

/// `text` with whatever may be a password hidden, as the core's messages show node URLs: for
/// the binding's own messages that quote a value which may be one.
#[napi]
pub fn redact_url(text: String) -> napi::Result<String> {
    guard("redactUrl", || Ok(ferrolock::redact_url(&text)))
}

#[napi]
pub fn option_table() -> napi::Result<Vec<OptionRow>> {
    guard("optionTable", || {
        Ok(OPTIONS
            .iter()
            .filter(|o| !matches!(o.scope, OptionScope::Binding(_)))
            .map(|o| OptionRow {
                name: o.camel_case(),
                core: o.name.to_string(),
                scope: match o.scope {
                    OptionScope::Manager => "manager",
                    OptionScope::Lock => "lock",
                    _ => "binding",
                }
                .to_string(),
                kind: match o.kind {
                    OptionType::Duration => "duration",
                    OptionType::OptionalDuration { zero_ok: true } => "optionalDurationOrZero",
                    OptionType::OptionalDuration { zero_ok: false } => "optionalDuration",
                    OptionType::Bool => "bool",
                    OptionType::OptionalCount => "optionalCount",
                    OptionType::Fraction => "fraction",
                    OptionType::Urls => "urls",
                    OptionType::OptionalPath => "optionalPath",
                    _ => "unknown",
                }
                .to_string(),
                default: o.default.to_string(),
                doc: o.doc.to_string(),
            })
            .collect())
    })
}

/// An option value, converted by `options.js`: exactly one of the value fields is set, or
/// none of them for "none" (wait: Infinity, maxHold: null, ...).
#[napi(object)]
pub struct OptionEntry {
    /// snake_case.
    pub name: String,
    /// The value as the user wrote it, for messages.
    pub written: String,
    pub ms: Option<u32>,
    pub flag: Option<bool>,
    pub count: Option<u32>,
    pub number: Option<f64>,
    pub text: Option<String>,
    pub list: Option<Vec<String>>,
}

fn value(e: &OptionEntry) -> OptionValue {
    if let Some(ms) = e.ms {
        OptionValue::Duration(Duration::from_millis(ms.into()))
    } else if let Some(b) = e.flag {
        OptionValue::Bool(b)
    } else if let Some(n) = e.count {
        OptionValue::Count(n.into())
    } else if let Some(f) = e.number {
        OptionValue::Number(f)
    } else if let Some(t) = &e.text {
        OptionValue::Text(t.clone())
    } else if let Some(l) = &e.list {
        OptionValue::List(l.clone())
    } else {
        OptionValue::None
    }
}

/// The core's messages name the option in snake_case; JavaScript users wrote camelCase.
fn set(opts: &mut ManagerOptions, e: &OptionEntry) -> napi::Result<()> {
    opts.set(&e.name, value(e), &e.written).map_err(|err| {
        let spec = ferrolock::option_spec(&e.name);
        match spec {
            Some(s) if s.camel_case() != s.name => {
                let msg = err.message().replace(s.name, &s.camel_case());
                to_napi(ferrolock::Error::new(err.kind(), msg))
            }
            _ => to_napi(err),
        }
    })
}

pub fn manager_options(entries: &[OptionEntry]) -> napi::Result<ManagerOptions> {
    let mut opts = ManagerOptions::new();
    for e in entries {
        set(&mut opts, e)?;
    }
    Ok(opts)
}

/// A lock's options: the manager's defaults with `entries` on top (lock options only).
pub fn lock_options(
    key: &str,
    defaults: &LockOptions,
    entries: &[OptionEntry],
) -> napi::Result<LockOptions> {
    let mut opts = ManagerOptions::new().lock(defaults.clone());
    for e in entries {
        if let Some(s) = ferrolock::option_spec(&e.name)
            && s.scope == OptionScope::Manager
        {
            return Err(invalid(format!(
                "lock {key:?}: {} is a LockManager option (how to reach the nodes), not one of a single acquire",
                s.camel_case()
            )));
        }
        set(&mut opts, e)?;
    }
    opts.lock.validate().map_err(to_napi)?;
    Ok(opts.lock)
}
