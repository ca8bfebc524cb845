//! Lock tokens and waiter ids, from random bits never shared with a forked child.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A plain lock's token, per acquisition attempt: the attempt's wall-clock time in
/// milliseconds (12 hex digits), `-`, and 80 random bits (20 hex digits). The time is what
/// lets an operator's `ferrolock scan` tell how long a lock has been held (a renewed lock's
/// ttl stays short, so its ttl cannot tell); 80 random bits keep tokens distinct. The `-`
/// tells ferrolock's tokens from redis-py's and node-redlock's (32 hex digits).
pub(crate) fn new_token() -> String {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    // Written into a fixed buffer: this is on every acquire's path, where `format!` and a
    // growing String cost more than the rest of the token (seen under callgrind).
    let mut out = [b'-'; 33];
    for (i, b) in out[..12].iter_mut().enumerate() {
        *b = HEX[((ms >> (44 - 4 * i)) & 15) as usize];
    }
    for (i, b) in random_16()[..10].iter().enumerate() {
        out[13 + 2 * i] = HEX[(b >> 4) as usize];
        out[14 + 2 * i] = HEX[(b & 15) as usize];
    }
    // Only ASCII hex digits and '-' were written.
    String::from_utf8(out.to_vec()).unwrap_or_default()
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// When the attempt that made `token` started, if it is a ferrolock plain-lock token.
pub fn token_time(token: &str) -> Option<SystemTime> {
    let (time, random) = token.split_once('-')?;
    let hex = |p: &str, n: usize| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit());
    if !hex(time, 12) || !hex(random, 20) {
        return None;
    }
    let ms = u64::from_str_radix(time, 16).ok()?;
    UNIX_EPOCH.checked_add(Duration::from_millis(ms))
}

/// 128 random bits as 32 hex digits (waiter ids).
pub(crate) fn random_hex() -> String {
    let mut s = String::with_capacity(32);
    push_hex(&mut s, &random_16());
    s
}

fn push_hex(s: &mut String, bytes: &[u8]) {
    for b in bytes {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 15) as usize] as char);
    }
}

/// Random bytes from the OS, drawn 4 KiB at a time (one system call per 256 tokens instead of
/// one per token). The pool is tied to the process id, so a forked child never reuses bytes
/// its parent handed out: it refills from the OS first.
fn random_16() -> [u8; 16] {
    struct Pool {
        pid: u32,
        bytes: Box<[u8; 4096]>,
        used: usize,
    }
    static POOL: std::sync::Mutex<Option<Pool>> = std::sync::Mutex::new(None);
    let mut out = [0u8; 16];
    // try_lock: a pool locked by another thread (or inherited locked across fork from a
    // thread that no longer exists) is skipped, never waited for.
    let Ok(mut guard) = POOL.try_lock() else {
        getrandom::fill(&mut out).expect("the operating system's random source failed");
        return out;
    };
    let pid = crate::runtime::pid();
    let pool = guard.get_or_insert_with(|| Pool {
        pid: 0,
        bytes: Box::new([0; 4096]),
        used: 4096,
    });
    if pool.pid != pid || pool.used + 16 > pool.bytes.len() {
        getrandom::fill(&mut pool.bytes[..]).expect("the operating system's random source failed");
        pool.pid = pid;
        pool.used = 0;
    }
    out.copy_from_slice(&pool.bytes[pool.used..pool.used + 16]);
    // Never hand the same bytes out twice.
    pool.bytes[pool.used..pool.used + 16].fill(0);
    pool.used += 16;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forked_child_never_reuses_the_parents_random_bytes() {
        let _ = new_token(); // the pool now holds bytes the child inherits
        let mut fds = [0i32; 2];
        // SAFETY: plain pipe/fork/read/write/_exit; the child only draws a token and exits.
        unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            let pid = libc::fork();
            assert!(pid >= 0);
            if pid == 0 {
                let t = random_hex();
                libc::write(fds[1], t.as_ptr().cast(), t.len());
                libc::_exit(0);
            }
            let mine = random_hex();
            let mut buf = [0u8; 32];
            let n = libc::read(fds[0], buf.as_mut_ptr().cast(), 32);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
            assert_eq!(n, 32);
            assert_ne!(
                std::str::from_utf8(&buf).unwrap(),
                mine,
                "the child drew the parent's next token"
            );
        }
    }

    #[test]
    fn ids_are_128_bit_hex_and_distinct() {
        let a = random_hex();
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, random_hex());
    }

    #[test]
    fn a_token_carries_its_time_and_80_random_bits() {
        let before = SystemTime::now() - Duration::from_millis(1);
        let a = new_token();
        let after = SystemTime::now() + Duration::from_millis(1);
        assert_eq!(a.len(), 33, "{a}");
        let t = token_time(&a).expect("a ferrolock token");
        assert!(before <= t && t <= after, "{a}");
        assert_ne!(a, new_token());
        // redis-py / node-redlock tokens and other strings carry no time.
        for other in [
            &random_hex()[..],
            "",
            "-",
            "0123456789ab-xyz",
            "0123456789ab-0123456789abcdef012",
        ] {
            assert_eq!(token_time(other), None, "{other:?}");
        }
    }
}
