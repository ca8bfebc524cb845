//! The contention memory: what one manager saw lately of other contenders on each key. It
//! decides whether a first attempt is a plain `SET NX PX` or goes through the waiter queue,
//! and whether a release may be quiet (`quiet.rs`).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::QUIET_GRACE;
use crate::per_process::PerProcess;

/// Keys on which this manager recently saw waiters or a busy lock (see `Memory::contention`).
#[derive(Default)]
pub(crate) struct Memory {
    seen: PerProcess<Mutex<HashMap<String, Seen>>>,
}

/// What this manager knows of other contenders on a key.
#[derive(Clone, Copy)]
struct Seen {
    /// When it last saw contention (a busy answer, a release that found waiters).
    at: Instant,
    /// When its last release of the key was quiet (see `Contention::quiet`).
    quiet: Option<Instant>,
    /// When it last released the key.
    released: Option<Instant>,
    /// When it last sent an attempt on the key.
    attempted: Option<Instant>,
    /// Its current grant on the key was asked for right after its previous release (a worker
    /// in a loop): the release of this grant may be quiet.
    streak: bool,
}

/// `Memory::contention`'s answer for one key.
pub(crate) struct Contention {
    /// Contention was seen lately: a first attempt goes through the server's waiter queue.
    pub contended: bool,
    /// Our last release of the key, less than `QUIET_GRACE` ago, was quiet: we may take the
    /// lock back during the grace after the head's barging bound.
    pub quiet: bool,
    /// We released the key less than `QUIET_GRACE` ago: a worker in a loop, likely to take the
    /// lock back right after each release, so its next release may be quiet. One that
    /// acquires once (or seldom) releases loudly: nobody waits for a head's own re-check
    /// because a releaser that never came back let the bound run.
    pub looping: bool,
}

/// How long a sign of contention on a key (a busy answer, a release that found waiters)
/// keeps this manager's first attempts on that key going through the waiter queue.
const CONTENTION_MEMORY: Duration = Duration::from_secs(2);

impl Memory {
    /// Remembers that `key` has, or had a moment ago, other contenders.
    pub fn mark_contended(&self, key: &str) {
        self.update(key, |s| s.quiet = None);
    }

    /// Remembers that our release of `key` left waiters queued without telling the first one
    /// (its barging bound had not ended): our next attempt may take the lock back within the
    /// grace that follows the bound (see DESIGN.md, "Waiter queue").
    pub fn mark_quiet_release(&self, key: &str) {
        let now = Instant::now();
        self.update(key, |s| {
            s.quiet = Some(now);
            s.released = Some(now);
        });
    }

    /// Remembers that our release of `key` found waiters queued and told the first one.
    pub fn mark_loud_release(&self, key: &str) {
        let now = Instant::now();
        self.update(key, |s| {
            s.quiet = None;
            s.released = Some(now);
        });
    }

    /// The keys whose last act by this manager was a quiet release: no attempt and no other
    /// release since (see `quiet.rs`).
    pub fn left_after_quiet_releases(&self) -> Vec<String> {
        let seen = self.seen();
        seen.iter()
            .filter(|(_, s)| {
                s.quiet
                    .is_some_and(|at| s.released == s.quiet && s.attempted.is_none_or(|t| t < at))
            })
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// Remembers that our grant on `key` is part of a loop (see `Seen::streak`).
    pub fn mark_streak(&self, key: &str) {
        self.update(key, |s| s.streak = true);
    }

    fn update(&self, key: &str, change: impl FnOnce(&mut Seen)) {
        let mut seen = self.seen();
        let now = Instant::now();
        if seen.len() >= 4096 {
            seen.retain(|_, s| now.duration_since(s.at) < CONTENTION_MEMORY);
        }
        let s = match seen.get_mut(key) {
            Some(s) => s,
            None => seen.entry(key.to_string()).or_insert(Seen {
                at: now,
                quiet: None,
                released: None,
                attempted: None,
                streak: false,
            }),
        };
        s.at = now;
        change(s);
    }

    /// Whether a first attempt on `key` should respect the server's waiter queue, and more
    /// (see `Contention`). When this manager saw no contention on the key lately, the first
    /// attempt is a plain `SET NX PX` (the cheapest possible grant); a process that just
    /// released into a queue of waiters, or that waits itself, always goes through the queue,
    /// so it cannot barge ahead of them beyond the barging bound.
    pub fn contention(&self, key: &str) -> Contention {
        let mut seen = self.seen();
        let recent = |t: Option<Instant>| t.is_some_and(|t| t.elapsed() < QUIET_GRACE);
        match seen.get_mut(key) {
            Some(s) => {
                s.attempted = Some(Instant::now());
                Contention {
                    contended: s.at.elapsed() < CONTENTION_MEMORY,
                    quiet: recent(s.quiet),
                    looping: recent(s.released),
                }
            }
            None => Contention {
                contended: false,
                quiet: false,
                looping: false,
            },
        }
    }

    /// For a release of `key`: whether contention was seen lately, and whether the grant
    /// released is part of a loop (`Seen::streak`, forgotten here: the next grant says anew).
    /// Notes the release's time for `Contention::looping` (moved to its end when it found
    /// waiters: `mark_quiet_release`, `mark_loud_release`).
    pub fn release_view(&self, key: &str) -> (bool, bool) {
        let mut seen = self.seen();
        match seen.get_mut(key) {
            Some(s) => {
                s.released = Some(Instant::now());
                (
                    s.at.elapsed() < CONTENTION_MEMORY,
                    std::mem::take(&mut s.streak),
                )
            }
            None => (false, false),
        }
    }

    /// This process's memory of contention (a forked child starts with none).
    fn seen(&self) -> MutexGuard<'_, HashMap<String, Seen>> {
        self.seen
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}
