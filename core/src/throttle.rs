//! A warning that a partial fault repeats once per lock: while one node of three is paused, every
//! release finishes in the background and says so, which a busy service turned into dozens of
//! lines a second. It is logged once per interval, with the number left out since.

use std::sync::Mutex;
use std::time::{Duration, Instant};

pub(crate) struct Throttle {
    every: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    last: Option<Instant>,
    left_out: u64,
}

impl Throttle {
    pub const fn new(every: Duration) -> Throttle {
        // Spelled out: `Default` is not const.
        Throttle {
            every,
            state: Mutex::new(State {
                last: None,
                left_out: 0,
            }),
        }
    }

    /// What to add to a message logged after `n` were left out ("" when none were).
    pub fn left_out_note(&self, n: u64) -> String {
        if n == 0 {
            String::new()
        } else {
            format!(
                " (and {n} more like it since the last one logged, at most one per {:?})",
                self.every
            )
        }
    }

    /// `Some(n)`: log this one, and say that `n` were left out since the last one logged.
    /// `None`: leave it out (counted).
    pub fn admit(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match s.last {
            Some(last) if now.saturating_duration_since(last) < self.every => {
                s.left_out += 1;
                None
            }
            _ => {
                s.last = Some(now);
                Some(std::mem::take(&mut s.left_out))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_per_interval_then_the_count_left_out() {
        let t = Throttle::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(t.admit(t0), Some(0));
        for s in 1..=9 {
            assert_eq!(t.admit(t0 + Duration::from_secs(s)), None);
        }
        assert_eq!(t.admit(t0 + Duration::from_secs(10)), Some(9));
        assert_eq!(t.admit(t0 + Duration::from_secs(11)), None);
        assert_eq!(t.admit(t0 + Duration::from_secs(30)), Some(1));
        assert_eq!(t.left_out_note(0), "");
        assert!(t.left_out_note(9).contains("9 more"));
    }
}
