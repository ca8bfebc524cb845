//! Options and their defaults: the table in `table.rs` (`OPTIONS`), identical in every binding.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};

mod table;
pub use table::{OPTIONS, OptionSpec, Scope, Type, Value, spec};

/// Environment variable holding comma-separated node URLs.
pub const NODES_ENV: &str = "FERROLOCK_NODES";
/// Environment variable holding a CA file for `rediss://` nodes.
pub const TLS_CA_ENV: &str = "FERROLOCK_TLS_CA";
/// Used when neither the options nor `FERROLOCK_NODES` name a node.
pub const DEFAULT_NODE: &str = "redis://127.0.0.1:6379";

/// The longest duration accepted anywhere (ttl, wait, max_hold, ...): 2^31-1 ms, about 24.8
/// days. It is the largest delay a JavaScript timer can hold, so every binding agrees on one
/// bound and no duration can wrap around in a 32-bit timer, in `PX`, or in `Instant + d`.
pub const MAX_DURATION: Duration = Duration::from_millis(i32::MAX as u64);

/// The shortest ttl: one the watchdog can renew over a network. A shorter one is most often a
/// number of seconds passed where milliseconds are expected (Node's `ttl: 10`).
pub const MIN_TTL: Duration = Duration::from_millis(100);

/// Per-lock options. Every field has the default of `OPTIONS` (`table.rs`); the manager's copy is the
/// default for each lock, and each acquire may override it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LockOptions {
    /// Lease on each node. The watchdog renews at ttl/3. Default 10 s.
    pub ttl: Duration,
    /// `None` blocks until acquired; `Some(ZERO)` tries once; otherwise the budget.
    pub wait: Option<Duration>,
    /// Mean pause between attempts, jittered by ±50 %. Default 100 ms.
    pub retry_delay: Duration,
    /// Per node, per request. `None` means min(200 ms, ttl/10).
    pub node_timeout: Option<Duration>,
    /// drift = ttl × drift_factor + 2 ms. Default 0.01.
    pub drift_factor: f64,
    /// Renew the lock while held. Default on.
    pub watchdog: bool,
    /// The watchdog stops renewing (and signals loss) after this long. Default none.
    pub max_hold: Option<Duration>,
    /// Cap on manual extends. Default none.
    pub max_extensions: Option<u32>,
    /// Redisson-compatible hash lock (Redisson's RLock layout). It re-enters only through
    /// `LockManager::acquire_owned` by the same owner; `acquire`/`acquire_with` are a new owner
    /// on every call. Default off.
    pub reentrant: bool,
    /// Every grant carries a fence token. Default off.
    pub fencing: bool,
    /// A side of a read-write lock, set by `LockManager::read_lock*` / `write_lock*`.
    pub(crate) rw: Option<RwSide>,
    /// A semaphore's pool size and this holder's count, set by `LockManager::semaphore*`.
    pub(crate) permits: Option<Permits>,
    /// A binding's first try ahead of its own wait (`LockOptions::first_try`).
    pub(crate) first_try: bool,
}

/// A semaphore hold: `count` permits of a pool of `permits`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Permits {
    pub permits: u32,
    pub count: u32,
}

/// Which side of a read-write lock a hold is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RwSide {
    Read,
    Write,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: Duration::from_secs(10),
            wait: None,
            retry_delay: Duration::from_millis(100),
            node_timeout: None,
            drift_factor: 0.01,
            watchdog: true,
            max_hold: None,
            max_extensions: None,
            reentrant: false,
            fencing: false,
            rw: None,
            permits: None,
            first_try: false,
        }
    }
}

impl LockOptions {
    /// A binding's single try ahead of a wait of its own (Go's uncontended fast path, on the
    /// caller's thread, before its completion-based wait): `wait` 0, and a refusal
    /// (`NotAcquired`) or a quorum unreachable, after which the binding waits, is not counted
    /// as a failed acquire in the metrics, since the wait that follows is the acquire (its
    /// attempt is counted; its grant or other failure is too).
    #[doc(hidden)]
    pub fn first_try(mut self) -> Self {
        self.wait = Some(Duration::ZERO);
        self.first_try = true;
        self
    }
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }
    pub fn wait(mut self, wait: Option<Duration>) -> Self {
        self.wait = wait;
        self
    }
    pub fn retry_delay(mut self, d: Duration) -> Self {
        self.retry_delay = d;
        self
    }
    pub fn node_timeout(mut self, d: Duration) -> Self {
        self.node_timeout = Some(d);
        self
    }
    pub fn drift_factor(mut self, f: f64) -> Self {
        self.drift_factor = f;
        self
    }
    pub fn watchdog(mut self, on: bool) -> Self {
        self.watchdog = on;
        self
    }
    pub fn max_hold(mut self, d: Option<Duration>) -> Self {
        self.max_hold = d;
        self
    }
    pub fn max_extensions(mut self, n: Option<u32>) -> Self {
        self.max_extensions = n;
        self
    }
    pub fn reentrant(mut self, on: bool) -> Self {
        self.reentrant = on;
        self
    }
    pub fn fencing(mut self, on: bool) -> Self {
        self.fencing = on;
        self
    }

    /// The per-node timeout in force: the explicit one, or min(200 ms, ttl/10).
    pub fn effective_node_timeout(&self) -> Duration {
        self.node_timeout
            .unwrap_or_else(|| (self.ttl / 10).min(Duration::from_millis(200)))
            .max(Duration::from_millis(1))
    }

    /// ttl × drift_factor + 2 ms: clock drift between nodes plus a margin for the
    /// granularity of Redis expiry.
    pub fn drift(&self) -> Duration {
        self.ttl.mul_f64(self.drift_factor) + Duration::from_millis(2)
    }

    pub fn ttl_millis(&self) -> u64 {
        self.ttl.as_millis() as u64
    }

    /// Rejects every value that would make the lock meaningless or overflow somewhere.
    pub fn validate(&self) -> Result<()> {
        check_duration("ttl", self.ttl)?;
        if self.ttl < MIN_TTL {
            return Err(Error::invalid(format!(
                "ttl {:?} is too short: the minimum is {MIN_TTL:?} (the watchdog renews every \
                 ttl/3, and each node must answer within a node timeout of a fraction of that)",
                self.ttl
            )));
        }
        if let Some(w) = self.wait
            && w > MAX_DURATION
        {
            return Err(too_long("wait", w));
        }
        check_duration("retry_delay", self.retry_delay)?;
        check_at_least_a_millisecond("retry_delay", self.retry_delay)?;
        if let Some(t) = self.node_timeout {
            check_duration("node_timeout", t)?;
            check_at_least_a_millisecond("node_timeout", t)?;
        }
        if !self.drift_factor.is_finite() || !(0.0..1.0).contains(&self.drift_factor) {
            return Err(Error::invalid(format!(
                "drift_factor must be a number in [0, 1), got {}",
                self.drift_factor
            )));
        }
        if self.drift() >= self.ttl {
            return Err(Error::invalid(format!(
                "ttl {:?} leaves no validity after the clock-drift allowance of {:?} (ttl × drift_factor + 2ms): use a longer ttl",
                self.ttl,
                self.drift()
            )));
        }
        if let Some(h) = self.max_hold {
            check_duration("max_hold", h)?;
            // Below a millisecond the lock is lost as soon as it is granted (Go refused it).
            check_at_least_a_millisecond("max_hold", h)?;
        }
        Ok(())
    }
}

fn too_long(name: &str, d: Duration) -> Error {
    Error::invalid(format!(
        "{name} {d:?} is too long: the maximum is {}ms (about 24.8 days)",
        MAX_DURATION.as_millis()
    ))
}

/// A retry delay under a millisecond retries in a busy loop against the servers (thousands of
/// commands a second per waiter); a node timeout under one gives up before any reply. Node and
/// Go take whole milliseconds; Python's seconds and the CLI's units could say less.
fn check_at_least_a_millisecond(name: &str, d: Duration) -> Result<()> {
    if d < Duration::from_millis(1) {
        return Err(Error::invalid(format!(
            "{name} {d:?} is too short: the minimum is 1ms"
        )));
    }
    Ok(())
}

fn check_duration(name: &str, d: Duration) -> Result<()> {
    if d.is_zero() {
        return Err(Error::invalid(format!(
            "{name} must be greater than zero, got 0"
        )));
    }
    if d > MAX_DURATION {
        return Err(too_long(name, d));
    }
    Ok(())
}

/// Options of a manager: where the nodes are and how to reach them, plus the default options
/// of every lock it hands out.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ManagerOptions {
    /// Node URLs (`redis://`, `rediss://`, `unix://`). `None` (left out) means
    /// `FERROLOCK_NODES`, else `redis://127.0.0.1:6379`; an empty list is refused by
    /// `LockManager::new` (written out empty, it is a mistake, as in every binding).
    pub nodes: Option<Vec<String>>,
    /// CA file for `rediss://` nodes. `None` means `FERROLOCK_TLS_CA`, else the system roots.
    pub tls_ca: Option<PathBuf>,
    /// Window after a node's (re)start in which its vote does not count. `None` means the
    /// default: with 3 or more nodes, the longest lease this manager has asked for (its ttl,
    /// widened before any acquire or extend asks for a longer one); off otherwise.
    /// `Some(ZERO)` is off.
    pub restart_guard: Option<Duration>,
    /// On a Redis Cluster that knows sharded pub/sub (7.0+), release wake-ups use it
    /// (SPUBLISH/SSUBSCRIBE), as Redisson's shardedSubscriptionMode AUTO does; off: classic
    /// PUBLISH/SUBSCRIBE, for Redisson clients with that mode OFF. No effect on other nodes.
    pub sharded_pubsub: bool,
    /// Defaults for every lock.
    pub lock: LockOptions,
}

impl Default for ManagerOptions {
    fn default() -> Self {
        ManagerOptions {
            nodes: None,
            tls_ca: None,
            restart_guard: None,
            sharded_pubsub: true,
            lock: LockOptions::default(),
        }
    }
}

impl ManagerOptions {
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets the node list (an empty one is refused by `LockManager::new`); not calling it
    /// leaves the `FERROLOCK_NODES` → local node fallback.
    pub fn nodes<S: Into<String>>(mut self, nodes: impl IntoIterator<Item = S>) -> Self {
        self.nodes = Some(nodes.into_iter().map(Into::into).collect());
        self
    }
    pub fn tls_ca(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls_ca = Some(path.into());
        self
    }
    pub fn restart_guard(mut self, d: Duration) -> Self {
        self.restart_guard = Some(d);
        self
    }
    pub fn sharded_pubsub(mut self, on: bool) -> Self {
        self.sharded_pubsub = on;
        self
    }
    pub fn lock(mut self, lock: LockOptions) -> Self {
        self.lock = lock;
        self
    }

    /// The node list in force: the explicit one (empty if written out empty), else
    /// `FERROLOCK_NODES` when it is set, else the default. `FERROLOCK_NODES` set but blank,
    /// or not UTF-8, is refused by name: never the default node in its place
    /// (`FERROLOCK_NODES=$REDIS_URL` with `REDIS_URL` unset would lock there, apart from
    /// every peer that locks on the real servers).
    pub fn resolved_nodes(&self) -> Result<Vec<String>> {
        self.nodes_in_force().map(|(urls, _)| urls)
    }

    /// [`Self::resolved_nodes`], with the variable they came from when the caller wrote none,
    /// for messages about them.
    pub(crate) fn nodes_in_force(&self) -> Result<(Vec<String>, Option<&'static str>)> {
        if let Some(nodes) = &self.nodes {
            // Trimmed, as a comma-separated list's are: a URL read from a file or a secret
            // often ends in a newline (which the control-character check would refuse), and
            // the shared managers are keyed by this list.
            return Ok((nodes.iter().map(|u| u.trim().to_string()).collect(), None));
        }
        let why = match std::env::var(NODES_ENV) {
            Ok(v) if v.trim().is_empty() => format!(
                "set but empty: give the node URLs there, or unset it to use {DEFAULT_NODE}"
            ),
            Ok(v) => return Ok((split_nodes(&v), Some(NODES_ENV))),
            Err(std::env::VarError::NotUnicode(_)) => {
                "not valid UTF-8: node URLs are text".to_string()
            }
            Err(std::env::VarError::NotPresent) => {
                return Ok((vec![DEFAULT_NODE.to_string()], None));
            }
        };
        Err(Error::invalid(format!("{NODES_ENV}: {why}")))
    }

    pub fn resolved_tls_ca(&self) -> Option<PathBuf> {
        self.tls_ca_in_force().map(|(path, _)| path)
    }

    /// [`Self::resolved_tls_ca`], with the variable it came from when the caller gave none.
    pub(crate) fn tls_ca_in_force(&self) -> Option<(PathBuf, Option<&'static str>)> {
        if let Some(path) = &self.tls_ca {
            return Some((path.clone(), None));
        }
        std::env::var_os(TLS_CA_ENV)
            .filter(|v| !v.is_empty())
            .map(|v| (PathBuf::from(v), Some(TLS_CA_ENV)))
    }
}

/// Why an explicitly empty node list is refused (after `nodes=<as written>: `).
pub(crate) const NO_NODE_GIVEN: &str =
    "no node URL given (leave nodes out to use FERROLOCK_NODES or redis://127.0.0.1:6379)";

/// Splits a comma-separated node list, trimming blanks around each URL. A comma (or a run of
/// them) cuts the list only where what follows starts a URL (`redis://`, `unix:/...`) or
/// nothing does: a comma in a password is part of it, kept as written, not a cut that would
/// show a piece of the password as a malformed URL of its own. Empty entries (`a,,b`, a
/// trailing comma) stay entries, for the parser to refuse by name.
pub fn split_nodes(list: &str) -> Vec<String> {
    let pieces: Vec<&str> = list.split(',').collect();
    let mut urls: Vec<String> = Vec::new();
    let mut current = Some(pieces[0].to_string());
    let mut i = 1;
    while i < pieces.len() {
        // pieces[i..next] are blank (a run of commas); pieces[next], if there is one, is not.
        let next = (i..pieces.len())
            .find(|&j| !pieces[j].trim().is_empty())
            .unwrap_or(pieces.len());
        let url = current.get_or_insert_with(String::new);
        let cut = next == pieces.len()
            || url.trim().is_empty()
            || starts_with_scheme(pieces[next].trim_start());
        if cut {
            urls.push(url.trim().to_string());
            urls.extend((i..next).map(|_| String::new()));
            current = pieces.get(next).map(|p| p.to_string());
        } else {
            for piece in &pieces[i..=next] {
                url.push(',');
                url.push_str(piece);
            }
        }
        i = next + 1;
    }
    urls.extend(current.map(|url| url.trim().to_string()));
    urls
}

/// A URL's `scheme:` and then `/` at the start (`redis://`, `unix:/path`), the scheme as RFC
/// 3986 spells it.
fn starts_with_scheme(s: &str) -> bool {
    let Some((scheme, rest)) = s.split_once(':') else {
        return false;
    };
    let mut chars = scheme.chars();
    rest.starts_with('/')
        && chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// Parses `500ms`, `10s`, `1.5s`, `2m`, `1h`. A bare number is refused: `--ttl 10` could mean
/// seconds or milliseconds depending on which peer the user came from.
pub fn parse_duration(text: &str) -> Result<Duration> {
    let s = text.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let bad = |why: &str| Error::invalid(format!("invalid duration {text:?}: {why}"));
    if num.is_empty() && s.starts_with('-') {
        return Err(bad("must not be negative"));
    }
    if num.is_empty() {
        return Err(bad(
            "expected a number followed by a unit, such as 500ms, 10s or 2m",
        ));
    }
    let value: f64 = num.parse().map_err(|_| bad("not a number"))?;
    let scale = match unit.trim() {
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "" => return Err(bad("missing unit (ms, s, m or h)")),
        // `1e3ms`: the number is the trouble, not its unit.
        u if u.starts_with(['e', 'E'])
            && u[1..].starts_with(|c: char| "+-0123456789".contains(c)) =>
        {
            return Err(bad("no exponents: write the number out, such as 1000ms"));
        }
        u => return Err(bad(&format!("unknown unit {u:?} (use ms, s, m or h)"))),
    };
    let secs = value * scale;
    if !secs.is_finite() || secs > MAX_DURATION.as_secs_f64() {
        // Named as written: a value past f64's range or Duration's has no faithful echo.
        return Err(bad(&format!(
            "too long: the maximum is {}ms (about 24.8 days)",
            MAX_DURATION.as_millis()
        )));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_comma_in_a_password_does_not_split_the_list() {
        assert_eq!(
            super::split_nodes("redis://u:pa,ss@h:1 , rediss+cluster://h:2,unix:///s"),
            ["redis://u:pa,ss@h:1", "rediss+cluster://h:2", "unix:///s"]
        );
        // A run of commas, or a blank, in a password is kept as written.
        assert_eq!(
            super::split_nodes("redis://u:pa,,ss@h:1,redis://u:p, s@h:2"),
            ["redis://u:pa,,ss@h:1", "redis://u:p, s@h:2"]
        );
        // redis-rs's `unix:/path` starts a URL too.
        assert_eq!(
            super::split_nodes("unix:/a.sock,unix:/b.sock"),
            ["unix:/a.sock", "unix:/b.sock"]
        );
        // Empty entries stay entries (refused by the parser, naming them), not glued on.
        assert_eq!(
            super::split_nodes("redis://h:1,,redis://h:2,"),
            ["redis://h:1", "", "redis://h:2", ""]
        );
        assert_eq!(super::split_nodes(""), [""]);
    }

    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
    }

    #[test]
    fn durations_reject_garbage_and_name_it() {
        for bad in ["10", "", "ms", "-1s", "1x", "1e400s", "999999999h"] {
            let err = parse_duration(bad).unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument, "{bad}");
            assert!(err.message().contains(&format!("{bad:?}")), "{err}");
        }
        let err = parse_duration("1x").unwrap_err();
        assert!(err.message().contains("unknown unit \"x\""), "{err}");
        let err = parse_duration("1e3ms").unwrap_err();
        assert!(err.message().contains("no exponents"), "{err}");
        let err = parse_duration("-1s").unwrap_err();
        assert!(err.message().contains("must not be negative"), "{err}");
    }

    #[test]
    fn a_retry_delay_or_node_timeout_under_a_millisecond_is_refused() {
        // A retry delay of 1 µs made a waiter send thousands of commands a second.
        for (o, name) in [
            (
                LockOptions::default().retry_delay(Duration::from_micros(999)),
                "retry_delay",
            ),
            (
                LockOptions::default().node_timeout(Duration::from_nanos(1)),
                "node_timeout",
            ),
        ] {
            let err = o.validate().unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument);
            assert!(
                err.message().starts_with(name) && err.message().contains("the minimum is 1ms"),
                "{err}"
            );
        }
        LockOptions::default()
            .retry_delay(Duration::from_millis(1))
            .node_timeout(Duration::from_millis(1))
            .validate()
            .unwrap();
    }

    #[test]
    fn zero_and_overflowing_durations_are_rejected() {
        let zero = LockOptions::default()
            .ttl(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert!(zero.message().contains("ttl"), "{zero}");
        let huge = LockOptions::default()
            .ttl(Duration::from_secs(u64::MAX / 4))
            .validate()
            .unwrap_err();
        assert!(huge.message().contains("too long"), "{huge}");
        let wait = LockOptions::default()
            .wait(Some(Duration::MAX))
            .validate()
            .unwrap_err();
        assert!(wait.message().contains("wait"), "{wait}");
        let sub_ms = LockOptions::default()
            .ttl(Duration::from_micros(500))
            .validate()
            .unwrap_err();
        assert!(sub_ms.message().contains("100ms"), "{sub_ms}");
        let nan = LockOptions::default()
            .drift_factor(f64::NAN)
            .validate()
            .unwrap_err();
        assert!(nan.message().contains("drift_factor"), "{nan}");
        assert!(LockOptions::default().validate().is_ok());
        assert!(LockOptions::default().ttl(MAX_DURATION).validate().is_ok());
    }

    #[test]
    fn default_node_timeout_is_min_of_200ms_and_a_tenth_of_ttl() {
        assert_eq!(
            LockOptions::default().effective_node_timeout(),
            Duration::from_millis(200)
        );
        let short = LockOptions::default().ttl(Duration::from_secs(1));
        assert_eq!(short.effective_node_timeout(), Duration::from_millis(100));
    }
}
