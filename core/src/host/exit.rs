//! The process-exit protocol, bounded in time: waiting acquires give up, the blocking ones
//! are let back, then every manager's unreleased locks (held or lost) are released and its
//! quiet releases flushed, twice (an acquire that completed meanwhile is caught by the second
//! pass). What could not be released in time expires with its ttl.
//!
//! A binding calls [`exit`] from its exit hook (Python's `atexit`, Node's `process.on('exit')`,
//! C's `ferrolock_shutdown` or a destructor) on one thread, before it stops its own callbacks.

use std::time::{Duration, Instant};

use crate::error::Shown;
use crate::error::{Error, ErrorKind};
use crate::host::flag::Flag;
use crate::per_process::ProcessCount;

/// Set by [`exit`]: from then on an acquire gives up, and one that completes releases its
/// lock at once instead of handing it to a caller that may never run again (a daemon thread
/// waiting for the lock that exit just released). Inherited by a forked child on purpose: a
/// child forked during exit must not start new work either.
static EXITING: Flag = Flag::new();
/// Blocking acquires in progress, counted until their thread is back (clean-up included).
static BLOCKING_ACQUIRES: ProcessCount = ProcessCount::new();

pub fn is_exiting() -> bool {
    EXITING.is_set()
}

/// Resolves once the process is exiting.
pub(crate) async fn exiting() {
    EXITING.wait().await
}

/// Sleeps in steps of 1 ms on the calling thread until `done()` holds or `until` has passed.
pub(crate) fn wait_until(until: Instant, done: impl Fn() -> bool) {
    while !done() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// `what`: "lock", or "semaphore".
pub(crate) fn exiting_error(what: &str, key: &str) -> Error {
    Error::new(
        ErrorKind::NotAcquired,
        format!(
            "{what} {key:?} not acquired: the process is exiting",
            key = Shown(key)
        ),
    )
}

/// Counts a blocking acquire for as long as it lives (in the process it was counted in).
pub(crate) struct BlockingAcquire(u32);

impl BlockingAcquire {
    pub fn enter() -> BlockingAcquire {
        BlockingAcquire(BLOCKING_ACQUIRES.enter())
    }
}

impl Drop for BlockingAcquire {
    fn drop(&mut self) {
        BLOCKING_ACQUIRES.leave(self.0);
    }
}

/// Runs the exit protocol on the calling thread (not inside an async runtime) and returns
/// within `limit` (plus scheduling delays), however slow or paused the nodes are: a third for
/// the blocking acquires to come back, a third for each release pass. Returns how many locks
/// were released on a quorum. Idempotent; later calls find nothing left to release.
pub fn exit(limit: Duration) -> usize {
    EXITING.set();
    let share = limit / 3;
    wait_until(Instant::now() + share, || BLOCKING_ACQUIRES.is_zero());
    let mut released = 0;
    for _ in 0..2 {
        let managers = crate::host::manager::all();
        released += crate::host::manager::release_all_of(&managers, share, false);
    }
    released
}
