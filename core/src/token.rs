//! Lock tokens and waiter ids: 128 random bits each, never shared with a forked child.

/// 128 bits from the operating system's CSPRNG, per acquisition attempt. Not a userspace
/// generator: its state would be duplicated by fork and hand two processes the same token.
pub(crate) fn new_token() -> String {
    let bytes = random_16();
    let mut s = String::with_capacity(32);
    for b in bytes {
        s.push(char::from_digit((b >> 4) as u32, 16).unwrap_or('0'));
        s.push(char::from_digit((b & 15) as u32, 16).unwrap_or('0'));
    }
    s
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
                let t = new_token();
                libc::write(fds[1], t.as_ptr().cast(), t.len());
                libc::_exit(0);
            }
            let mine = new_token();
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
    fn tokens_are_128_bit_hex_and_distinct() {
        let a = new_token();
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, new_token());
    }
}
