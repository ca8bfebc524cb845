//! The restart guard's window, and a hold it places on a node (or a cluster's slots).
//!
//! A node that restarted without persistence forgot the locks it granted; until the longest
//! of them would have expired, its vote could grant one again. The window is how long that
//! is. Set (`restart_guard`), it is what it says. By default (3 nodes or more) it is the
//! longest lease this manager has asked any node for: its own ttl, or a longer one given to
//! an acquire, an extend or a `withLock`. A default of the manager's ttl alone held a
//! restarted node back 10 s where locks of 30 s stood on it, and a second holder got one of
//! them 10 s after the restart (a `withLock` with `ttl` 30 s, on the shared manager).
//!
//! So a hold keeps when it began, not when it ends, and is kept even when the window of the
//! moment has passed: the window may still grow, and a node held back for 10 s (or found up
//! for 12 s) is then held back for 30 s.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Shared by a manager's nodes (clones share the longest lease).
#[derive(Clone, Debug)]
pub(crate) enum GuardWindow {
    /// `restart_guard` given (zero is off).
    Fixed(Duration),
    /// The longest lease asked for so far, in milliseconds.
    Longest(Arc<AtomicU64>),
}

impl GuardWindow {
    /// The default window: `ttl` to begin with, then the longest lease `cover`ed.
    pub fn longest_lease(ttl: Duration) -> GuardWindow {
        GuardWindow::Longest(Arc::new(AtomicU64::new(millis(ttl))))
    }

    pub fn get(&self) -> Duration {
        match self {
            GuardWindow::Fixed(d) => *d,
            GuardWindow::Longest(ms) => Duration::from_millis(ms.load(Ordering::Relaxed)),
        }
    }

    pub fn is_off(&self) -> bool {
        matches!(self, GuardWindow::Fixed(d) if d.is_zero())
    }

    /// Called before a lease of `lease` is asked for, so that every vote for it is judged with
    /// a window at least that long.
    pub fn cover(&self, lease: Duration) {
        if let GuardWindow::Longest(ms) = self {
            ms.fetch_max(millis(lease), Ordering::Relaxed);
        }
    }
}

/// Rounded up: a window a fraction of a millisecond short would let one vote through.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// A restart (or failover) seen at `seen`, of a server that had then been up for `up`
/// (zero when the restart happened under us): held back until `up` reaches the window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hold {
    pub seen: Instant,
    pub up: Duration,
}

impl Hold {
    pub fn until(&self, window: Duration) -> Instant {
        self.seen + window.saturating_sub(self.up)
    }

    /// Whether the server of this hold started before that of `other`.
    pub fn started_before(&self, other: &Hold) -> bool {
        self.until(LONGEST) < other.until(LONGEST)
    }

    /// Whether no window, however it grows, holds it back after `now`: it can be forgotten.
    pub fn over(&self, now: Instant) -> bool {
        self.until(LONGEST) <= now
    }
}

/// The longest window there can be (`restart_guard` and every ttl are at most this long).
const LONGEST: Duration = crate::options::MAX_DURATION;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_window_grows_to_the_longest_lease_and_never_shrinks() {
        let w = GuardWindow::longest_lease(Duration::from_secs(10));
        let shared = w.clone();
        assert_eq!(w.get(), Duration::from_secs(10));
        shared.cover(Duration::from_secs(30));
        assert_eq!(w.get(), Duration::from_secs(30), "clones share it");
        w.cover(Duration::from_secs(5));
        assert_eq!(w.get(), Duration::from_secs(30));
        w.cover(Duration::from_micros(30_000_001));
        assert_eq!(w.get(), Duration::from_millis(30_001), "rounded up");
        let fixed = GuardWindow::Fixed(Duration::from_secs(2));
        fixed.cover(Duration::from_secs(30));
        assert_eq!(
            fixed.get(),
            Duration::from_secs(2),
            "a window given is kept"
        );
        assert!(GuardWindow::Fixed(Duration::ZERO).is_off());
        assert!(!fixed.is_off() && !w.is_off());
    }

    #[test]
    fn a_hold_ends_when_the_servers_uptime_reaches_the_window() {
        let now = Instant::now();
        let young = Hold {
            seen: now,
            up: Duration::from_secs(4),
        };
        assert_eq!(
            young.until(Duration::from_secs(10)),
            now + Duration::from_secs(6)
        );
        assert_eq!(
            young.until(Duration::from_secs(30)),
            now + Duration::from_secs(26)
        );
        assert_eq!(young.until(Duration::from_secs(3)), now);
        let older = Hold {
            seen: now,
            up: Duration::from_secs(60),
        };
        assert!(older.started_before(&young) && !young.started_before(&older));
        assert!(!older.over(now), "a window may still grow past 60 s");
        let ancient = Hold {
            seen: now,
            up: crate::options::MAX_DURATION,
        };
        assert!(ancient.over(now), "no window is that long");
    }
}
