//! State that belongs to one process: a forked child gets a fresh copy on first use and never
//! touches the one it inherited.
//!
//! Why not a pid check inside a `Mutex`: `fork()` copies memory, not threads. A mutex that a
//! runtime thread held at the moment of the fork (the watchdog registry during a scan, a
//! waiter queue, a connection slot) stays locked in the child forever, and the child hangs on
//! its first lock operation. A `pthread_atfork` child handler cannot repair that (it must be
//! async-signal-safe and cannot reach each manager's mutexes, or tokio's). So the check comes
//! first, on an atomic, and the inherited state is never locked, read or dropped in the child:
//! it is leaked (dropping it would run destructors against the parent's runtime and threads).

use std::sync::atomic::{AtomicPtr, Ordering};

use crate::runtime::pid;

struct Slot<T> {
    pid: u32,
    value: T,
}

pub(crate) struct PerProcess<T> {
    current: AtomicPtr<Slot<T>>,
}

impl<T> Default for PerProcess<T> {
    fn default() -> Self {
        PerProcess {
            current: AtomicPtr::new(std::ptr::null_mut()),
        }
    }
}

impl<T> PerProcess<T> {
    /// Empty, for a `static`.
    pub(crate) const fn new() -> Self {
        PerProcess {
            current: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// This process's value, made with `init` on first use in this process.
    pub fn get_or_init(&self, init: impl FnOnce() -> T) -> &T {
        let me = pid();
        let mut seen = self.current.load(Ordering::Acquire);
        // SAFETY (all derefs below): a published slot is freed only by `drop`, which needs
        // `&mut self`; a slot replaced after a fork is leaked, never freed.
        if !seen.is_null() && unsafe { (*seen).pid } == me {
            return unsafe { &(*seen).value };
        }
        let fresh = Box::into_raw(Box::new(Slot {
            pid: me,
            value: init(),
        }));
        loop {
            match self
                .current
                .compare_exchange(seen, fresh, Ordering::AcqRel, Ordering::Acquire)
            {
                // The inherited slot (if any) is leaked on purpose: see the module comment.
                Ok(_) => return unsafe { &(*fresh).value },
                Err(winner) if !winner.is_null() && unsafe { (*winner).pid } == me => {
                    // Another thread of this process got there first; ours was never shared.
                    drop(unsafe { Box::from_raw(fresh) });
                    return unsafe { &(*winner).value };
                }
                Err(other) => seen = other,
            }
        }
    }

    /// This process's value, if it made one.
    pub fn get(&self) -> Option<&T> {
        let p = self.current.load(Ordering::Acquire);
        // SAFETY: as in `get_or_init`.
        (!p.is_null() && unsafe { (*p).pid } == pid()).then(|| unsafe { &(*p).value })
    }
}

impl<T> Drop for PerProcess<T> {
    fn drop(&mut self) {
        let p = *self.current.get_mut();
        // SAFETY: `&mut self`: nobody else can reach the slot. A slot of another process
        // (inherited) is leaked.
        if !p.is_null() && unsafe { (*p).pid } == pid() {
            drop(unsafe { Box::from_raw(p) });
        }
    }
}

// SAFETY: it hands out `&T` to any thread and drops `T` on whichever thread drops it.
unsafe impl<T: Send + Sync> Sync for PerProcess<T> {}
unsafe impl<T: Send> Send for PerProcess<T> {}

/// A count of work in progress in this process (acquires running, for `close` and exit to
/// wait for). A forked child starts from zero: the threads doing the parent's work were not
/// copied, so that work never ends in the child, and a child waiting for it would wait for
/// its whole limit.
pub struct ProcessCount(PerProcess<std::sync::atomic::AtomicUsize>);

impl Default for ProcessCount {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcessCount {
    pub const fn new() -> Self {
        ProcessCount(PerProcess::new())
    }

    fn count(&self) -> &std::sync::atomic::AtomicUsize {
        self.0.get_or_init(Default::default)
    }

    /// Counts one in; returns the process it was counted in, for [`leave`](Self::leave).
    pub fn enter(&self) -> u32 {
        self.count().fetch_add(1, Ordering::SeqCst);
        pid()
    }

    /// Counts one out, if it was counted in this process.
    pub fn leave(&self, counted_in: u32) {
        if counted_in == pid() {
            self.count().fetch_sub(1, Ordering::SeqCst);
        }
    }

    pub fn is_zero(&self) -> bool {
        self.get() == 0
    }

    /// How many are counted in this process.
    pub fn get(&self) -> usize {
        self.count().load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_value_per_process() {
        let p: PerProcess<std::sync::Mutex<u32>> = PerProcess::default();
        assert!(p.get().is_none());
        *p.get_or_init(|| std::sync::Mutex::new(1)).lock().unwrap() += 1;
        assert_eq!(
            *p.get_or_init(|| std::sync::Mutex::new(100)).lock().unwrap(),
            2
        );
        assert!(p.get().is_some());
    }

    #[test]
    fn a_forked_child_never_locks_the_mutex_it_inherited() {
        let p: PerProcess<std::sync::Mutex<u32>> = PerProcess::default();
        let parent = p.get_or_init(|| std::sync::Mutex::new(7));
        let _held = parent.lock().unwrap(); // held across the fork, as a runtime thread might
        // SAFETY: the child only uses `p`, then `_exit`s with the result.
        unsafe {
            let child = libc::fork();
            assert!(child >= 0);
            if child == 0 {
                let ok = p.get().is_none()
                    && p.get_or_init(|| std::sync::Mutex::new(0))
                        .try_lock()
                        .map(|v| *v == 0)
                        .unwrap_or(false);
                libc::_exit(if ok { 0 } else { 1 });
            }
            let mut status = 0;
            libc::waitpid(child, &mut status, 0);
            assert!(libc::WIFEXITED(status));
            assert_eq!(
                libc::WEXITSTATUS(status),
                0,
                "the child used the inherited value"
            );
        }
    }
}
