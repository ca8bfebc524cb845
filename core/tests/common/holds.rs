//! Hold intervals recorded by the exclusion tests (the read-write lock's, the semaphore's),
//! and the one checker over them (`Holds::check`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferrolock::Lock;

/// One recorded hold, taking `weight` of the capacity (a semaphore holder its count; a reader
/// 1 and a writer the whole capacity).
#[derive(Clone, Copy, Debug)]
pub struct Hold {
    pub weight: u32,
    pub from: Instant,
    pub to: Instant,
}

/// The holds of a test's tasks; clones share them.
#[derive(Clone, Default)]
pub struct Holds(Arc<Mutex<Vec<Hold>>>);

/// What `Holds::check` saw.
#[derive(Debug)]
pub struct Peak {
    /// The most holds live at one instant.
    pub most_together: usize,
    /// The whole capacity was held by several holds together.
    pub full_shared: bool,
}

impl Holds {
    /// Keeps `lock` for `d` and records that interval with its `weight`. The interval lies
    /// inside the real hold (after the grant; the lock still held at its end, before the
    /// release), so an overlap seen is a real one.
    pub async fn hold(&self, lock: &Lock, weight: u32, d: Duration) {
        let from = Instant::now();
        tokio::time::sleep(d).await;
        let to = Instant::now();
        assert!(lock.is_held(), "lost while held");
        self.0.lock().unwrap().push(Hold { weight, from, to });
    }

    pub fn all(&self) -> Vec<Hold> {
        self.0.lock().unwrap().clone()
    }

    /// Asserts that at no instant the live holds' weights add up to more than `capacity`.
    pub fn check(&self, capacity: u32) -> Peak {
        let holds = self.all();
        let mut peak = Peak {
            most_together: 0,
            full_shared: false,
        };
        // The sum is highest just after some hold starts, so each start is checked (two holds
        // overlap exactly when both are live at the later one's start).
        for a in &holds {
            let at = a.from;
            let live: Vec<&Hold> = holds.iter().filter(|b| b.from <= at && at < b.to).collect();
            let total: u32 = live.iter().map(|b| b.weight).sum();
            assert!(
                total <= capacity,
                "{total} of {capacity} held at once: {live:?}"
            );
            peak.most_together = peak.most_together.max(live.len());
            peak.full_shared |= total == capacity && live.len() > 1;
        }
        peak
    }
}
