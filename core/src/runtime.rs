//! One lazily created tokio runtime per process, for callers that block (the Python, C and
//! CLI surfaces). A forked child gets a fresh one: the parent's worker threads do not exist
//! in the child, so its runtime is leaked there, never dropped (dropping would try to join
//! threads that are gone).

use std::future::Future;
use std::sync::Once;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

use tokio::runtime::{Builder, Handle, Runtime};

static RUNTIME: AtomicPtr<Runtime> = AtomicPtr::new(std::ptr::null_mut());
static ATFORK: Once = Once::new();

/// This process's id, cached: `std::process::id()` is a system call, and the hot paths ask
/// for it several times per lock. Zero means "not read yet"; the fork child handler resets it.
static PID: AtomicU32 = AtomicU32::new(0);

extern "C" fn forget_runtime_in_child() {
    RUNTIME.store(std::ptr::null_mut(), Ordering::SeqCst);
    PID.store(0, Ordering::SeqCst);
}

fn register_atfork() {
    ATFORK.call_once(|| {
        // SAFETY: registers a handler that only stores into atomics, which is
        // async-signal-safe as a fork child handler must be.
        unsafe {
            libc::pthread_atfork(None, None, Some(forget_runtime_in_child));
        }
    });
}

/// The current process id, correct in a forked child.
pub(crate) fn pid() -> u32 {
    match PID.load(Ordering::Relaxed) {
        0 => {
            register_atfork();
            let pid = std::process::id();
            PID.store(pid, Ordering::Relaxed);
            pid
        }
        pid => pid,
    }
}

/// The process-wide runtime, created on first use (and again in a forked child).
pub fn runtime() -> &'static Runtime {
    register_atfork();
    let current = RUNTIME.load(Ordering::Acquire);
    if !current.is_null() {
        // SAFETY: a published runtime is never freed (see the module comment).
        return unsafe { &*current };
    }
    let fresh = Box::into_raw(Box::new(
        Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ferrolock")
            .enable_all()
            .build()
            .expect(
                "cannot start the ferrolock tokio runtime (out of threads or file descriptors?)",
            ),
    ));
    match RUNTIME.compare_exchange(
        std::ptr::null_mut(),
        fresh,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        // SAFETY: just published; never freed.
        Ok(_) => unsafe { &*fresh },
        Err(winner) => {
            // Another thread won the race; ours never ran a task.
            // SAFETY: `fresh` came from Box::into_raw above and was never shared.
            unsafe { Box::from_raw(fresh) }.shutdown_background();
            // SAFETY: published by the winner; never freed.
            unsafe { &*winner }
        }
    }
}

/// The handle to spawn on: the caller's runtime when there is one, else the process runtime.
pub fn handle() -> Handle {
    Handle::try_current().unwrap_or_else(|_| runtime().handle().clone())
}

/// Runs a future to completion from a thread that is not a runtime worker.
pub fn block_on<F: Future>(future: F) -> F::Output {
    runtime().block_on(future)
}

pub(crate) fn install_crypto_provider() {
    // Err only means a provider is already installed (by us or by the application).
    let _ = rustls::crypto::ring::default_provider().install_default();
}
