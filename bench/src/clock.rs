//! Clocks the scenarios share: CLOCK_MONOTONIC in nanoseconds (system-wide on Linux, so the
//! worker processes of the contention scenario can compare their timestamps), and the CPU
//! time of this process.

use std::time::Duration;

/// CLOCK_MONOTONIC in nanoseconds: the same clock in every process of the machine.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only into `ts`, which outlives the call.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// User + system CPU time of this process (every thread), from getrusage.
pub fn process_cpu() -> Duration {
    // SAFETY: all-zero is a valid rusage; getrusage only writes into it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: the pointer is to a live rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Clock ticks per second of /proc/PID/stat's utime and stime.
pub fn clock_ticks_per_sec() -> u64 {
    // SAFETY: sysconf has no side effects.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as u64 } else { 100 }
}
