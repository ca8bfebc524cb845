//! The loss subscription every binding attaches to: a callback run on a library thread,
//! at most once, never started after the lock's release or free has returned; a free waits
//! for a callback already running.
//!
//! The core's `Lock::on_lost` runs its callbacks where the loss is declared (a runtime worker
//! running the watchdog) and drops them uncalled once the lock is released; but a callback
//! taken out of the list just before the release can still be running, or not yet started,
//! when the release returns. The gate closes that gap: each callback is started on the
//! runtime's blocking pool (a binding's callback may wait for its own lock, such as Python's
//! GIL: a worker must not) and runs only while the gate is open; closing it stops callbacks
//! not yet started and, for a free, waits for the ones running.
//!
//! Callbacks live inside the core, out of sight of a binding's garbage collector: a callback
//! must reach the binding's scope state (a `with` block's, an `async with`'s, a `withLock`
//! callback's) only weakly. Held strongly, an abandoned scope (its event loop closed, its
//! task dropped, its context never exited) would keep its lock, and so the lock's renewal,
//! alive for ever.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread::ThreadId;
use std::time::Duration;

use crate::lock::LossReason;

#[derive(Default)]
pub(crate) struct Gate {
    state: Mutex<GateState>,
    idle: Condvar,
}

#[derive(Default)]
struct GateState {
    closed: bool,
    /// The threads running a callback now.
    running: Vec<ThreadId>,
}

impl Gate {
    fn state(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `callback(reason)` on the calling thread unless the gate is closed.
    pub fn run(&self, callback: impl FnOnce(&LossReason), reason: &LossReason) {
        let me = std::thread::current().id();
        {
            let mut s = self.state();
            if s.closed {
                return;
            }
            s.running.push(me);
        }
        /// Leaves the running list also when the callback panics.
        struct Leave<'a>(&'a Gate, ThreadId);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                let mut s = self.0.state();
                if let Some(i) = s.running.iter().position(|t| *t == self.1) {
                    s.running.swap_remove(i);
                }
                drop(s);
                self.0.idle.notify_all();
            }
        }
        let _leave = Leave(self, me);
        callback(reason);
    }

    /// Stops every callback not started yet. With `wait`, also waits for those running,
    /// except one running on this very thread (a callback that frees its own lock) or on a
    /// thread that waits, through closes of its own, for this one: two callbacks that
    /// release each other's locks (C lets a callback release or free any lock) would
    /// otherwise wait for each other for ever. The waits of every closing thread are kept in
    /// one wait-for graph (`WAITS`), re-read every 10 ms for the closes that start meanwhile.
    pub fn close(&self, wait: bool) {
        let me = std::thread::current().id();
        let mut s = self.state();
        s.closed = true;
        if !wait {
            return;
        }
        loop {
            let others: Vec<ThreadId> = s.running.iter().filter(|t| **t != me).copied().collect();
            // Registered and checked under one lock: of two closes that wait for each
            // other, the second to get here sees the first's wait.
            let blocked = {
                let mut graph = waits();
                graph.retain(|(t, _)| *t != me);
                graph.push((me, others.clone()));
                others.iter().any(|t| !waits_for(&graph, *t, me))
            };
            if !blocked {
                break;
            }
            s = self
                .idle
                .wait_timeout(s, Duration::from_millis(10))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        drop(s);
        waits().retain(|(t, _)| *t != me);
    }
}

/// For each thread waiting in a `Gate::close`, the threads whose callbacks it waits for.
static WAITS: Mutex<Vec<(ThreadId, Vec<ThreadId>)>> = Mutex::new(Vec::new());

fn waits() -> MutexGuard<'static, Vec<(ThreadId, Vec<ThreadId>)>> {
    WAITS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether `from` waits, directly or through other closing threads, for `to`.
fn waits_for(graph: &[(ThreadId, Vec<ThreadId>)], from: ThreadId, to: ThreadId) -> bool {
    let mut seen = vec![from];
    let mut next = vec![from];
    while let Some(t) = next.pop() {
        let Some((_, on)) = graph.iter().find(|(w, _)| *w == t) else {
            continue;
        };
        for &u in on {
            if u == to {
                return true;
            }
            if !seen.contains(&u) {
                seen.push(u);
                next.push(u);
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn reason() -> LossReason {
        LossReason::RenewalTooSlow {
            what: "lock",
            key: "k".into(),
        }
    }

    #[test]
    fn a_closed_gate_runs_nothing() {
        let gate = Gate::default();
        gate.close(false);
        let calls = AtomicUsize::new(0);
        gate.run(
            |_| {
                calls.fetch_add(1, Ordering::SeqCst);
            },
            &reason(),
        );
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_waiting_close_returns_only_after_the_running_callback() {
        let gate = Arc::new(Gate::default());
        let (entered_tx, entered_rx) = std::sync::mpsc::channel();
        let done = Arc::new(AtomicUsize::new(0));
        let t = {
            let (gate, done) = (gate.clone(), done.clone());
            std::thread::spawn(move || {
                gate.run(
                    |_| {
                        entered_tx.send(()).unwrap();
                        std::thread::sleep(Duration::from_millis(50));
                        done.store(1, Ordering::SeqCst);
                    },
                    &reason(),
                )
            })
        };
        entered_rx.recv().unwrap();
        gate.close(true);
        assert_eq!(
            done.load(Ordering::SeqCst),
            1,
            "close returned while the callback ran"
        );
        t.join().unwrap();
    }

    #[test]
    fn two_callbacks_closing_each_others_gate_both_return() {
        let gates = [Arc::new(Gate::default()), Arc::new(Gate::default())];
        let both_in = Arc::new(std::sync::Barrier::new(2));
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        for i in 0..2 {
            let (mine, other) = (gates[i].clone(), gates[1 - i].clone());
            let (both_in, done_tx) = (both_in.clone(), done_tx.clone());
            std::thread::spawn(move || {
                mine.run(
                    |_| {
                        both_in.wait();
                        other.close(true);
                    },
                    &reason(),
                );
                done_tx.send(i).unwrap();
            });
        }
        for _ in 0..2 {
            done_rx
                .recv_timeout(Duration::from_secs(20))
                .expect("the two callbacks waited for each other");
        }
    }

    #[test]
    fn a_close_waits_for_a_callback_that_waits_for_a_third_one() {
        // A's callback waits in a close for B's slow callback: a close of A's gate from
        // here still waits for A's callback (no cycle through this thread).
        let (a, b) = (Arc::new(Gate::default()), Arc::new(Gate::default()));
        let (b_in_tx, b_in_rx) = std::sync::mpsc::channel();
        let (a_in_tx, a_in_rx) = std::sync::mpsc::channel();
        let a_done = Arc::new(AtomicUsize::new(0));
        let tb = {
            let b = b.clone();
            std::thread::spawn(move || {
                b.run(
                    |_| {
                        b_in_tx.send(()).unwrap();
                        std::thread::sleep(Duration::from_millis(300));
                    },
                    &reason(),
                )
            })
        };
        b_in_rx.recv().unwrap();
        let ta = {
            let (a, b, a_done) = (a.clone(), b.clone(), a_done.clone());
            std::thread::spawn(move || {
                a.run(
                    |_| {
                        a_in_tx.send(()).unwrap();
                        b.close(true);
                        a_done.store(1, Ordering::SeqCst);
                    },
                    &reason(),
                )
            })
        };
        a_in_rx.recv().unwrap();
        std::thread::sleep(Duration::from_millis(50)); // A is waiting in b.close by now
        a.close(true);
        assert_eq!(
            a_done.load(Ordering::SeqCst),
            1,
            "close returned while a callback that waited for another still ran"
        );
        ta.join().unwrap();
        tb.join().unwrap();
    }

    #[test]
    fn a_callback_may_close_its_own_gate() {
        let gate = Gate::default();
        gate.run(|_| gate.close(true), &reason());
    }
}
