//! `ferrolock_options`: options set by name through the core's options table, so the ABI stays
//! the same as options are added. Durations are milliseconds.

use std::ffi::{c_char, c_double, c_int};
use std::time::Duration;

use ferrolock::{LockOptions, ManagerOptions, OptionScope, OptionType, OptionValue};

use crate::ctext::{echoed, handle, text};
use crate::status::{Failure, call, ferrolock_error, guard};

/// A duration meaning "none": for `wait`, wait without limit (but a quorum unreachable on three
/// attempts in a row still ends it, `FERROLOCK_ERR_QUORUM_UNREACHABLE`); for `max_hold`,
/// `node_timeout`, `restart_guard`, the default.
pub const FERROLOCK_WAIT_FOREVER: u64 = u64::MAX;
/// `wait` = 0: try once.
pub const FERROLOCK_TRY_ONCE: u64 = 0;

/// Options for a manager (every option) or for one acquire (lock options only: it starts from
/// the manager's defaults and changes what was set here). Not to be set from two threads at
/// once; once set, it may be read by many calls at once.
pub struct ferrolock_options {
    /// Every successful set, in order, replayed over a manager's defaults for an acquire.
    sets: Vec<(String, OptionValue, String)>,
    /// The same sets applied to the core's defaults: what a new manager gets.
    manager: ManagerOptions,
}

impl ferrolock_options {
    pub(crate) fn manager_options(&self) -> ManagerOptions {
        self.manager.clone()
    }

    /// `defaults` with this object's lock options applied; a manager option is refused.
    pub(crate) fn lock_options(&self, defaults: &LockOptions) -> Result<LockOptions, Failure> {
        let mut over = ManagerOptions::new().lock(defaults.clone());
        for (name, value, written) in &self.sets {
            if ferrolock::option_spec(name).is_some_and(|s| s.scope == OptionScope::Manager) {
                return Err(Failure::invalid(format!(
                    "option {name:?} belongs to the manager (ferrolock_manager_new), not to an acquire"
                )));
            }
            over.set(name, value.clone(), written)?;
        }
        over.lock.validate()?;
        Ok(over.lock)
    }

    fn set(
        &mut self,
        name: *const c_char,
        value: OptionValue,
        written: String,
    ) -> Result<(), Failure> {
        let given = setter_of(&value);
        self.set_through(name, value, written, given)
    }

    /// `set` by the entry `given` (`ferrolock_options_set_<given>`), which `value` alone does
    /// not tell for a "none" passed as `FERROLOCK_WAIT_FOREVER`.
    fn set_through(
        &mut self,
        name: *const c_char,
        value: OptionValue,
        written: String,
        given: &'static str,
    ) -> Result<(), Failure> {
        let name = text(name, "option name")?;
        if let Some(spec) =
            ferrolock::option_spec(&name).filter(|s| !matches!(s.scope, OptionScope::Binding(_)))
        {
            let wanted = setter_for(spec.kind);
            if given != "none" && given != wanted {
                // The core would say "drift_factor=1ms: expected a number": true, but the C
                // caller's mistake is the setter.
                return Err(Failure::invalid(format!(
                    "{name}={written}: {name} is set with ferrolock_options_set_{wanted}, not ferrolock_options_set_{given}"
                )));
            }
        }
        // Unknown, the name is only echoed in the refusal.
        let named = match ferrolock::option_spec(&name) {
            Some(_) => name.clone(),
            None => echoed(&name),
        };
        self.manager.set(&named, value.clone(), &written)?;
        self.sets.push((name, value, written));
        Ok(())
    }
}

/// The `ferrolock_options_set_*` entry that passes `value`.
fn setter_of(value: &OptionValue) -> &'static str {
    match value {
        OptionValue::Duration(_) => "ms",
        OptionValue::Bool(_) => "bool",
        OptionValue::Count(_) => "count",
        OptionValue::Number(_) => "number",
        OptionValue::Text(_) | OptionValue::List(_) => "str",
        _ => "none",
    }
}

/// The `ferrolock_options_set_*` entry for an option of type `kind`.
fn setter_for(kind: OptionType) -> &'static str {
    match kind {
        OptionType::Duration | OptionType::OptionalDuration { .. } => "ms",
        OptionType::Bool => "bool",
        OptionType::OptionalCount => "count",
        OptionType::Fraction => "number",
        _ => "str",
    }
}

/// New options, every one at its default. Never NULL (aborts only if out of memory).
#[unsafe(no_mangle)]
pub extern "C" fn ferrolock_options_new() -> *mut ferrolock_options {
    guard(std::ptr::null_mut(), || {
        Box::into_raw(Box::new(ferrolock_options {
            sets: Vec::new(),
            manager: ManagerOptions::new(),
        }))
    })
}

/// Frees options. NULL is ignored. Managers and locks made with them keep their own copy.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_options_free(opts: *mut ferrolock_options) {
    guard((), || {
        if !opts.is_null() {
            // SAFETY: made by `ferrolock_options_new`, freed once.
            drop(unsafe { Box::from_raw(opts) });
        }
    })
}

fn with_options(
    entry: &str,
    opts: *mut ferrolock_options,
    err: *mut *mut ferrolock_error,
    body: impl FnOnce(&mut ferrolock_options) -> Result<(), Failure>,
) -> c_int {
    call(entry, err, || {
        handle(opts, "opts")?;
        // SAFETY: non-NULL, a live `ferrolock_options` not shared with another thread.
        body(unsafe { &mut *opts })
    })
}

/// Sets a duration option (`ttl`, `wait`, `retry_delay`, `node_timeout`, `max_hold`,
/// `restart_guard`) in milliseconds. `FERROLOCK_WAIT_FOREVER` is "none" (for `wait`: no limit),
/// for these options only (`ferrolock_options_set_none` for the others).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_options_set_ms(
    opts: *mut ferrolock_options,
    name: *const c_char,
    ms: u64,
    err: *mut *mut ferrolock_error,
) -> c_int {
    with_options("ferrolock_options_set_ms", opts, err, |o| {
        if ms == FERROLOCK_WAIT_FOREVER {
            // A "none" for a duration: to `nodes` it would be a silent reset to the default.
            o.set_through(
                name,
                OptionValue::None,
                "FERROLOCK_WAIT_FOREVER".into(),
                "ms",
            )
        } else {
            o.set(
                name,
                OptionValue::Duration(Duration::from_millis(ms)),
                format!("{ms}ms"),
            )
        }
    })
}

/// Sets an on/off option (`watchdog`, `reentrant`, `fencing`, `sharded_pubsub`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_options_set_bool(
    opts: *mut ferrolock_options,
    name: *const c_char,
    value: bool,
    err: *mut *mut ferrolock_error,
) -> c_int {
    with_options("ferrolock_options_set_bool", opts, err, |o| {
        o.set(name, OptionValue::Bool(value), value.to_string())
    })
}

/// Sets a count option (`max_extensions`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_options_set_count(
    opts: *mut ferrolock_options,
    name: *const c_char,
    value: u64,
    err: *mut *mut ferrolock_error,
) -> c_int {
    with_options("ferrolock_options_set_count", opts, err, |o| {
        o.set(name, OptionValue::Count(value), value.to_string())
    })
}

/// Sets a number option (`drift_factor`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_options_set_number(
    opts: *mut ferrolock_options,
    name: *const c_char,
    value: c_double,
    err: *mut *mut ferrolock_error,
) -> c_int {
    with_options("ferrolock_options_set_number", opts, err, |o| {
        // `{:?}`: 1e300 as written, not as 301 digits.
        o.set(name, OptionValue::Number(value), format!("{value:?}"))
    })
}

/// Sets a text option (`nodes`: comma-separated URLs; `tls_ca`: a file path). The string is
/// copied.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_options_set_str(
    opts: *mut ferrolock_options,
    name: *const c_char,
    value: *const c_char,
    err: *mut *mut ferrolock_error,
) -> c_int {
    with_options("ferrolock_options_set_str", opts, err, |o| {
        let value = text(value, "option value")?;
        let written = format!("{:?}", echoed(&value));
        o.set(name, OptionValue::Text(value), written)
    })
}

/// Sets an option to "none": the default for `nodes` (FERROLOCK_NODES, else the local node),
/// `tls_ca`, `node_timeout` and `restart_guard`; no limit for `wait`, `max_hold` and
/// `max_extensions`. An option without a "none" (`ttl`, `retry_delay`, `drift_factor`, the
/// on/off ones) refuses it, naming the option: set its default value instead.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ferrolock_options_set_none(
    opts: *mut ferrolock_options,
    name: *const c_char,
    err: *mut *mut ferrolock_error,
) -> c_int {
    with_options("ferrolock_options_set_none", opts, err, |o| {
        o.set(name, OptionValue::None, "none".into())
    })
}
