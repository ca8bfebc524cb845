//! A flag set once and awaited: the process is exiting, a manager was closed. Whatever waits
//! on it (an acquire) gives up when it is set.
//!
//! The waiters are per process (`PerProcess`): every acquire registers one, on the runtime's
//! threads, so a fork may copy the list of waiters locked; a forked child that used that list
//! hung for ever in its first acquire (found by a review). The child gets a list of its own
//! (its parent's waiters are not its own) and keeps the flag's value.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

use crate::per_process::PerProcess;

#[derive(Default)]
pub(crate) struct Flag {
    set: AtomicBool,
    changed: PerProcess<Notify>,
}

impl Flag {
    pub const fn new() -> Flag {
        Flag {
            set: AtomicBool::new(false),
            changed: PerProcess::new(),
        }
    }

    /// This process's waiters.
    fn changed(&self) -> &Notify {
        self.changed.get_or_init(Notify::new)
    }

    /// Sets the flag and wakes its waiters; false if it was set already.
    pub fn set(&self) -> bool {
        let first = !self.set.swap(true, Ordering::SeqCst);
        self.changed().notify_waiters();
        first
    }

    pub fn is_set(&self) -> bool {
        self.set.load(Ordering::SeqCst)
    }

    /// Resolves once the flag is set.
    pub async fn wait(&self) {
        let notified = self.changed().notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if !self.is_set() {
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::{Context, Poll, Waker};
    use std::time::{Duration, Instant};

    use super::*;

    /// Registers a waiter on `flag` (one poll) and drops it: each step locks the flag's list
    /// of waiters.
    fn touch(flag: &Flag) -> bool {
        let mut wait = Box::pin(flag.wait());
        matches!(
            wait.as_mut().poll(&mut Context::from_waker(Waker::noop())),
            Poll::Ready(())
        )
    }

    /// The exit flag and every manager's closed flag are awaited by every acquire, on the
    /// runtime's threads, so a fork finds their list of waiters locked now and then. A child
    /// that inherited it locked hung for ever in its first acquire (found by a review: a
    /// Python child forked beside two tasks acquiring in a loop, about one fork in 400). Each
    /// process waits on a list of its own.
    #[test]
    fn a_forked_child_never_waits_on_the_list_it_inherited() {
        let flag: &'static Flag = Box::leak(Box::new(Flag::new()));
        static STOP: AtomicBool = AtomicBool::new(false);
        let busy: Vec<_> = (0..2)
            .map(|_| {
                std::thread::spawn(move || {
                    while !STOP.load(Ordering::Relaxed) {
                        touch(flag);
                    }
                })
            })
            .collect();
        let mut hung = 0;
        for _ in 0..40 {
            // SAFETY: the child only polls and sets `flag`, then `_exit`s.
            unsafe {
                let child = libc::fork();
                assert!(child >= 0);
                if child == 0 {
                    let before = touch(flag);
                    flag.set();
                    let after = touch(flag);
                    libc::_exit(if !before && after { 0 } else { 1 });
                }
                // A child that is not stuck exits at once; one stuck never does.
                let deadline = Instant::now() + Duration::from_secs(20);
                let mut status = 0;
                loop {
                    if libc::waitpid(child, &mut status, libc::WNOHANG) == child {
                        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
                        break;
                    }
                    if Instant::now() > deadline {
                        libc::kill(child, libc::SIGKILL);
                        libc::waitpid(child, &mut status, 0);
                        hung += 1;
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            if hung > 0 {
                break;
            }
        }
        STOP.store(true, Ordering::Relaxed);
        for t in busy {
            t.join().unwrap();
        }
        assert_eq!(
            hung, 0,
            "a forked child hung on the flag's inherited list of waiters"
        );
    }
}
