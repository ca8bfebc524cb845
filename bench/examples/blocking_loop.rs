//! `make bench`, the baseline of the C part (issue 16): blocking acquire + release of one key
//! in a loop over the core's blocking path (`ferrolock::host::Manager::acquire_blocking` and
//! `Lock::release_blocking`, what every binding's blocking call goes through), with the
//! options of bench/c/blocking_loop.c; run by bench/go in the same run, on the same servers.
//!
//!   cargo run --release -p ferrolock-bench --example blocking_loop -- NODES SECONDS KEY
//!
//! Prints one JSON line like the C program: ops, seconds, p50 and p99 in µs.

use std::time::{Duration, Instant};

use ferrolock::host::{Cancel, Manager};
use ferrolock::{LockOptions, ManagerOptions};

type BoxResult<T> = Result<T, Box<dyn std::error::Error>>;

/// The owner the C library's plain `ferrolock_manager_acquire` passes (`FERROLOCK_NO_OWNER`).
const NO_OWNER: u64 = u64::MAX;

fn once(m: &Manager, key: &str) -> BoxResult<f64> {
    let started = Instant::now();
    let never = Cancel::new();
    let lock = m.acquire_blocking(key, NO_OWNER, m.defaults(), &never, None)?;
    if !lock.release_blocking(&never, None)? {
        return Err("a release found the lock gone".into());
    }
    drop(lock);
    Ok(started.elapsed().as_secs_f64() * 1e6)
}

fn main() -> BoxResult<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [nodes, seconds, key] = &args[..] else {
        return Err("usage: blocking_loop NODES SECONDS KEY".into());
    };
    let seconds: f64 = seconds
        .parse()
        .ok()
        .filter(|s: &f64| s.is_finite() && *s > 0.0)
        .ok_or_else(|| format!("SECONDS {seconds:?}: must be a positive number"))?;
    let m = Manager::new(
        ManagerOptions::new()
            .nodes(nodes.split(','))
            // Fresh servers: the guard would hold back the votes of the first ttl.
            .restart_guard(Duration::ZERO)
            .lock(LockOptions::default().ttl(Duration::from_secs(10))),
    )?;
    for _ in 0..200 {
        once(&m, key)?;
    }
    let mut lat = Vec::with_capacity(1 << 16);
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(seconds);
    let mut now = started;
    while now < end {
        lat.push(once(&m, key)?);
        now = Instant::now();
    }
    lat.sort_by(f64::total_cmp);
    println!(
        "{{\"ops\":{},\"seconds\":{:.6},\"p50\":{:.1},\"p99\":{:.1}}}",
        lat.len(),
        (now - started).as_secs_f64(),
        lat[lat.len() / 2],
        lat[lat.len() * 99 / 100]
    );
    Ok(())
}
