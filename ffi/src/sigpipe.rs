//! SIGPIPE held off the threads that run ferrolock's code (see `NoSigpipe`).

/// SIGPIPE held off the calling thread for one entry. A request written to a connection
/// the server has closed (a restart, its idle `timeout`, CLIENT KILL) fails with EPIPE, and
/// the kernel also raises SIGPIPE on the writing thread, whose default action ends the
/// process: Python, Node and Rust programs ignore it, a C program does not. Linux has no
/// per-socket opt-out, and the writes are redis-rs's (`writev`, without MSG_NOSIGNAL), so
/// the signal is blocked while the entry runs and one it raised is taken back before the
/// caller's mask returns. Threads the library starts meanwhile (its runtime, its pools)
/// inherit the blocked mask and keep it: a SIGPIPE their writes raise stays pending there,
/// never delivered.
#[cfg(target_os = "linux")]
pub(crate) struct NoSigpipe {
    old: libc::sigset_t,
    /// Blocked already (a library thread, a nested entry, a caller that blocks it itself):
    /// nothing to undo, and a pending one is the thread's own business.
    blocked: bool,
}

#[cfg(target_os = "linux")]
impl NoSigpipe {
    pub(crate) fn enter() -> NoSigpipe {
        // SAFETY: sigset_t is plain data, filled by the calls before any read.
        unsafe {
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, &sigpipe_set(), &mut old);
            let blocked = libc::sigismember(&old, libc::SIGPIPE) == 1;
            NoSigpipe { old, blocked }
        }
    }
}

#[cfg(target_os = "linux")]
impl Drop for NoSigpipe {
    fn drop(&mut self) {
        if self.blocked {
            return;
        }
        // SAFETY: as above; a zero timeout never waits.
        unsafe {
            if sigpipe_pending() {
                let now = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                libc::sigtimedwait(&sigpipe_set(), std::ptr::null_mut(), &now);
            }
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut());
        }
    }
}

#[cfg(target_os = "linux")]
fn sigpipe_set() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set before sigaddset reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        set
    }
}

#[cfg(target_os = "linux")]
fn sigpipe_pending() -> bool {
    // SAFETY: sigpending fills the set before sigismember reads it.
    unsafe {
        let mut pending: libc::sigset_t = std::mem::zeroed();
        libc::sigpending(&mut pending) == 0 && libc::sigismember(&pending, libc::SIGPIPE) == 1
    }
}

/// Elsewhere a no-op: macOS has no `sigtimedwait` (its sockets take SO_NOSIGPIPE instead),
/// Windows no SIGPIPE.
#[cfg(not(target_os = "linux"))]
pub(crate) struct NoSigpipe;

#[cfg(not(target_os = "linux"))]
impl NoSigpipe {
    pub(crate) fn enter() -> NoSigpipe {
        NoSigpipe
    }
}
