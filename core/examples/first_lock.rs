//! The README's Rust example. Run with a redis-server on localhost (or FERROLOCK_NODES):
//! `cargo run -p ferrolock --example first_lock`

use std::time::Duration;

use ferrolock::{LockManager, LockOptions, ManagerOptions};

#[tokio::main]
async fn main() -> ferrolock::Result<()> {
    // nodes: FERROLOCK_NODES or redis://127.0.0.1:6379 (or `.nodes([...])`; an empty list is refused)
    let manager = LockManager::new(
        ManagerOptions::new().lock(
            LockOptions::default()
                .ttl(Duration::from_secs(10))
                .wait(Some(Duration::from_secs(5))),
        ),
    )?;
    let lock = manager.acquire("orders:1001").await?;
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_millis(100)) => println!("work done under the lock"),
        reason = lock.lost() => eprintln!("stopping early: {reason:?}"),
    }
    lock.release().await?;
    Ok(())
}
