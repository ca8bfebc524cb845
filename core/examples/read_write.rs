//! The read-write lock from Rust: readers share the key, a writer holds it alone.
//! Run with a Redis on FERROLOCK_NODES or redis://127.0.0.1:6379.

use std::time::Duration;

use ferrolock::{LockManager, LockOptions, ManagerOptions};

#[tokio::main]
async fn main() -> ferrolock::Result<()> {
    let manager = LockManager::new(
        ManagerOptions::new().lock(
            LockOptions::default()
                .ttl(Duration::from_secs(10)) // a read lease is at most 30 s
                .wait(Some(Duration::from_secs(5))),
        ),
    )?;
    // Two readers hold the key together.
    let a = manager.read_lock("catalog").await?;
    let b = manager.read_lock("catalog").await?;
    println!("two readers: {} {}", a.is_held(), b.is_held());
    a.release().await?;
    b.release().await?;
    // A writer holds it alone, with a fence token when asked for.
    let w = manager
        .write_lock_with("catalog", &LockOptions::default().fencing(true))
        .await?;
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_millis(100)) => println!("written, fence {:?}", w.fence()),
        reason = w.lost() => eprintln!("stopping early: {reason:?}"),
    }
    w.release().await?;
    Ok(())
}
