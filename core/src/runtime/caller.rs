//! A blocking caller thread's own runtime and connections (see `block_on`), and the reaper
//! that closes them while the thread does not call in: once it has been idle for the idle
//! limit, or at once when one of its connections belongs to a node that is gone (its manager
//! freed and the last lock it handed out released or freed). A thread's connections are
//! driven only by the thread itself, so an idle thread (a Go runtime thread back in its pool,
//! a C worker that stopped locking) would otherwise keep them until it ends. Dropping its
//! runtime ends their tasks and closes the sockets; the thread makes a new one when it calls
//! in again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use tokio::runtime::{Builder, Runtime};

use crate::node::ThreadConnections;
use crate::per_process::PerProcess;

/// How long a thread's connections outlive its last call (`FERROLOCK_IDLE_CONNECTION_MS`).
const IDLE_DEFAULT: Duration = Duration::from_secs(60);

/// One blocking caller thread's state, shared with the reaper.
pub(crate) struct Caller {
    pid: u32,
    state: Mutex<State>,
}

#[derive(Default)]
pub(crate) struct State {
    rt: Option<Arc<Runtime>>,
    pub(crate) conns: ThreadConnections,
    /// How many `block_on`s of this thread are running (nested ones count too).
    busy: u32,
    last: Option<Instant>,
}

impl Drop for Caller {
    fn drop(&mut self) {
        if self.pid != super::pid() {
            // Inherited across fork: its runtime's epoll instance and its connections are
            // shared with the parent's.
            let state = std::mem::take(self.state.get_mut().unwrap_or_else(|p| p.into_inner()));
            std::mem::forget(state);
        }
    }
}

impl Caller {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

thread_local! {
    static CALLER: std::cell::RefCell<Option<Arc<Caller>>> = const { std::cell::RefCell::new(None) };
}

/// This thread's caller state in this process, made (and shown to the reaper) on first use.
fn this_thread() -> Arc<Caller> {
    CALLER.with(|c| {
        let mut c = c.borrow_mut();
        if let Some(caller) = c.as_ref().filter(|caller| caller.pid == super::pid()) {
            return caller.clone();
        }
        // Replacing an inherited one leaks it (see `Caller::drop`), and what was spawned on it.
        super::forget_inherited_cleanup();
        let caller = Arc::new(Caller {
            pid: super::pid(),
            state: Mutex::new(State::default()),
        });
        reaper().add(&caller);
        *c = Some(caller.clone());
        caller
    })
}

/// Whether this thread has a runtime of its own in this process (it called `block_on`).
pub(crate) fn has_runtime() -> bool {
    CALLER
        .try_with(|c| {
            c.borrow()
                .as_ref()
                .is_some_and(|caller| caller.pid == super::pid() && caller.lock().rt.is_some())
        })
        .unwrap_or(false)
}

/// This thread's runtime, made if the reaper took it (or it never had one), and marked busy
/// (the reaper leaves it alone) until the returned guard is dropped.
pub(crate) fn enter() -> (Arc<Runtime>, Busy) {
    let caller = this_thread();
    let mut state = caller.lock();
    state.busy += 1;
    let rt = state
        .rt
        .get_or_insert_with(|| {
            Arc::new(Builder::new_current_thread().enable_all().build().expect(
                "cannot start a ferrolock runtime for this thread (out of file descriptors?)",
            ))
        })
        .clone();
    drop(state);
    (rt, Busy(caller))
}

/// Marks the thread's runtime in use (see `enter`).
pub(crate) struct Busy(Arc<Caller>);

impl Drop for Busy {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.busy -= 1;
        state.last = Some(Instant::now());
    }
}

/// Runs `f` on this thread's connections (it is inside `block_on`, so the reaper leaves them
/// alone); `None` when the thread has no caller state (or is ending).
pub(crate) fn with_connections<R>(f: impl FnOnce(&mut ThreadConnections) -> R) -> Option<R> {
    let caller = CALLER
        .try_with(|c| c.borrow().clone())
        .ok()
        .flatten()
        .filter(|caller| caller.pid == super::pid())?;
    let mut state = caller.lock();
    Some(f(&mut state.conns))
}

/// Asks the reaper to look now: a node went away (see `Node`'s drop).
pub(crate) fn node_gone() {
    if let Some(reaper) = REAPER.get() {
        reaper.wake.notify_one();
    }
}

/// The idle limit `FERROLOCK_IDLE_CONNECTION_MS` asks for (milliseconds; unset: the default).
fn idle_limit(value: Option<String>) -> Duration {
    let Some(value) = value else {
        return IDLE_DEFAULT;
    };
    match value.trim().parse::<u64>() {
        Ok(ms) if ms > 0 => Duration::from_millis(ms),
        _ => {
            tracing::warn!(
                "FERROLOCK_IDLE_CONNECTION_MS={value:?} is not a whole number of milliseconds \
                 above 0; closing idle connections after {IDLE_DEFAULT:?}"
            );
            IDLE_DEFAULT
        }
    }
}

struct Reaper {
    callers: Mutex<Vec<Weak<Caller>>>,
    wake: Condvar,
    started: AtomicBool,
}

static REAPER: PerProcess<Reaper> = PerProcess::new();

/// This process's reaper, its thread started on first use (a forked child starts its own).
fn reaper() -> &'static Reaper {
    let reaper = REAPER.get_or_init(|| Reaper {
        callers: Mutex::new(Vec::new()),
        wake: Condvar::new(),
        started: AtomicBool::new(false),
    });
    if !reaper.started.swap(true, Ordering::AcqRel) {
        let limit = idle_limit(std::env::var("FERROLOCK_IDLE_CONNECTION_MS").ok());
        // Looks a few times per limit, so a connection closes at most a quarter late.
        let every = (limit / 4).clamp(Duration::from_millis(10), Duration::from_secs(5));
        // Without the thread, connections close when their threads end, as before.
        let _ = std::thread::Builder::new()
            .name("ferrolock-idle".into())
            .spawn(move || reaper.run(limit, every));
    }
    reaper
}

impl Reaper {
    fn add(&self, caller: &Arc<Caller>) {
        let mut callers = self.callers.lock().unwrap_or_else(|p| p.into_inner());
        callers.retain(|c| c.strong_count() > 0);
        callers.push(Arc::downgrade(caller));
    }

    fn run(&self, limit: Duration, every: Duration) -> ! {
        loop {
            let callers: Vec<Arc<Caller>> = {
                let guard = self.callers.lock().unwrap_or_else(|p| p.into_inner());
                let (mut guard, _) = self
                    .wake
                    .wait_timeout(guard, every)
                    .unwrap_or_else(|p| p.into_inner());
                guard.retain(|c| c.strong_count() > 0);
                guard.iter().filter_map(Weak::upgrade).collect()
            };
            for caller in callers {
                let taken = {
                    let mut state = caller.lock();
                    let idle = state.last.is_some_and(|last| last.elapsed() >= limit);
                    if state.busy == 0 && (idle || state.conns.has_gone_nodes()) {
                        Some((std::mem::take(&mut state.conns), state.rt.take()))
                    } else {
                        None
                    }
                };
                // Outside the lock: dropping the runtime ends its connections' tasks.
                drop(taken);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idle_limit_is_whole_milliseconds_above_zero_else_the_default() {
        assert_eq!(idle_limit(None), IDLE_DEFAULT);
        assert_eq!(idle_limit(Some(" 250 ".into())), Duration::from_millis(250));
        for bad in ["0", "-1", "1.5", "soon", ""] {
            assert_eq!(idle_limit(Some(bad.into())), IDLE_DEFAULT, "{bad}");
        }
    }
}
