//! What a Rust caller needs of the public types: handles shared across tasks and threads
//! (`Arc<Lock>`, a manager in a static), futures given to `tokio::spawn`, errors boxed into
//! `Box<dyn Error + Send + Sync>` and `anyhow`. A type that loses one of these stops this
//! file compiling.

use std::time::Duration;

use ferrolock::{
    Error, ErrorKind, Lock, LockManager, LockOptions, LockStatus, LossReason, ManagerOptions,
};

fn send_sync<T: Send + Sync + 'static>() {}
fn send<T: Send>(_: &T) {}
fn error<T: std::error::Error + Send + Sync + 'static>() {}

#[test]
fn handles_options_and_errors_are_send_and_sync() {
    send_sync::<LockManager>();
    send_sync::<Lock>();
    send_sync::<LockOptions>();
    send_sync::<ManagerOptions>();
    send_sync::<LockStatus>();
    send_sync::<LossReason>();
    send_sync::<ErrorKind>();
    error::<Error>();
}

/// Never polled: only their types are looked at.
#[test]
fn every_call_returns_a_future_that_can_be_spawned() {
    #[allow(clippy::unused_async)]
    async fn check(m: LockManager, lock: Lock) {
        let opts = LockOptions::default();
        send(&m.acquire("k"));
        send(&m.try_acquire("k"));
        send(&m.acquire_with("k", &opts));
        send(&m.acquire_owned("k", 1, &opts));
        send(&m.read_lock("k"));
        send(&m.read_lock_with("k", &opts));
        send(&m.read_lock_owned("k", 1, &opts));
        send(&m.write_lock("k"));
        send(&m.write_lock_with("k", &opts));
        send(&m.write_lock_owned("k", 1, &opts));
        send(&m.semaphore("s", 2));
        send(&m.semaphore_with("s", 2, 1, &opts));
        send(&m.flush_quiet_releases());
        send(&lock.extend());
        send(&lock.extend_for(Duration::from_secs(1)));
        send(&lock.release());
        let lost = lock.lost();
        send(&lost);
        fn is_static<T: 'static>(_: &T) {}
        is_static(&lost);
    }
    let _ = check;
}

/// `lost()` owns what it needs, as its doc says: kept (in a struct, sent to another task)
/// after its `Lock` is dropped or released. Its return type captured the `&self` borrow
/// (edition 2024's rule for `impl Trait`), so this did not compile: "`lock` does not live
/// long enough", "cannot move out of `lock` because it is borrowed".
#[test]
fn the_lost_future_outlives_its_lock() {
    fn watch(lock: Lock) -> impl Future<Output = Option<LossReason>> + Send + 'static {
        let lost = lock.lost();
        drop(lock);
        lost
    }
    let _ = watch;
    // The bindings' handle, the same.
    fn watch_host(lock: ferrolock::host::Lock) -> impl Future<Output = Option<LossReason>> + Send {
        let lost = lock.lost();
        drop(lock);
        lost
    }
    let _ = watch_host;
}
