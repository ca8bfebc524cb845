//! `LockManager`: the nodes, the quorum, and the acquire loop. One node is the
//! single-instance lock; N nodes are Redlock. It is one algorithm.

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::time::Instant;

use crate::acquire::Spoiled;
use crate::error::{Error, ErrorKind, Result};
use crate::lock::Lock;
use crate::node::Node;
use crate::options::{LockOptions, ManagerOptions};
use crate::owner::Owners;
use crate::per_process::PerProcess;
use crate::quorum::Tally;
use crate::wakeup::{QUIET_GRACE, Waiters};
use crate::watchdog::Watchdog;

/// After this many attempts in a row that found a majority of nodes unreachable, acquire
/// gives up with `QuorumUnreachable` instead of waiting out its budget: a dead cluster should
/// answer in well under a second, not block forever.
pub(crate) const UNREACHABLE_ATTEMPTS: u32 = 3;

pub(crate) struct Shared {
    pub nodes: Vec<Node>,
    pub quorum: usize,
    pub defaults: LockOptions,
    pub watchdog: Watchdog,
    /// The client uuid and the live reentrant acquisitions, per owner.
    pub owners: Owners,
    /// Waiters, their local queues and the pub/sub connections that wake them.
    pub waiters: Waiters,
    /// Keys on which this manager recently saw waiters or a busy lock (see `contended`).
    contention: PerProcess<std::sync::Mutex<std::collections::HashMap<String, Seen>>>,
    /// `None`: the process runtime, looked up at each use so a forked child uses its own.
    handle: Option<Handle>,
}

/// What this manager knows of other contenders on a key.
#[derive(Clone, Copy)]
struct Seen {
    /// When it last saw contention (a busy answer, a release that found waiters).
    at: Instant,
    /// When its last release of the key was quiet (see `Contention::quiet`).
    quiet: Option<Instant>,
    /// When it last released the key.
    released: Option<Instant>,
    /// When it last sent an attempt on the key.
    attempted: Option<Instant>,
    /// Its current grant on the key was asked for right after its previous release (a worker
    /// in a loop): the release of this grant may be quiet.
    streak: bool,
}

/// `Shared::contention`'s answer for one key.
pub(crate) struct Contention {
    /// Contention was seen lately: a first attempt goes through the server's waiter queue.
    pub contended: bool,
    /// Our last release of the key, less than `QUIET_GRACE` ago, was quiet: we may take the
    /// lock back during the grace after the head's barging bound.
    pub quiet: bool,
    /// We released the key less than `QUIET_GRACE` ago: a worker in a loop, likely to take the
    /// lock back right after each release, so its next release may be quiet. One that
    /// acquires once (or seldom) releases loudly: nobody waits for a head's own re-check
    /// because a releaser that never came back let the bound run.
    pub looping: bool,
}

/// How long a sign of contention on a key (a busy answer, a release that found waiters)
/// keeps this manager's first attempts on that key going through the waiter queue.
const CONTENTION_MEMORY: Duration = Duration::from_secs(2);

impl Shared {
    /// Remembers that `key` has, or had a moment ago, other contenders.
    pub fn mark_contended(&self, key: &str) {
        self.update(key, |s| s.quiet = None);
    }

    /// Remembers that our release of `key` left waiters queued without telling the first one
    /// (its barging bound had not ended): our next attempt may take the lock back within the
    /// grace that follows the bound (see DESIGN.md, "Waiter queue").
    pub fn mark_quiet_release(&self, key: &str) {
        let now = Instant::now();
        self.update(key, |s| {
            s.quiet = Some(now);
            s.released = Some(now);
        });
    }

    /// Remembers that our release of `key` found waiters queued and told the first one.
    pub fn mark_loud_release(&self, key: &str) {
        let now = Instant::now();
        self.update(key, |s| {
            s.quiet = None;
            s.released = Some(now);
        });
    }

    /// The keys whose last act by this manager was a quiet release: no attempt and no other
    /// release since (see `quiet.rs`).
    pub fn left_after_quiet_releases(&self) -> Vec<String> {
        let seen = self.seen();
        seen.iter()
            .filter(|(_, s)| {
                s.quiet
                    .is_some_and(|at| s.released == s.quiet && s.attempted.is_none_or(|t| t < at))
            })
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// Remembers that our grant on `key` is part of a loop (see `Seen::streak`).
    pub fn mark_streak(&self, key: &str) {
        self.update(key, |s| s.streak = true);
    }

    fn update(&self, key: &str, change: impl FnOnce(&mut Seen)) {
        let mut seen = self.seen();
        let now = Instant::now();
        if seen.len() >= 4096 {
            seen.retain(|_, s| now.duration_since(s.at) < CONTENTION_MEMORY);
        }
        let s = match seen.get_mut(key) {
            Some(s) => s,
            None => seen.entry(key.to_string()).or_insert(Seen {
                at: now,
                quiet: None,
                released: None,
                attempted: None,
                streak: false,
            }),
        };
        s.at = now;
        change(s);
    }

    /// Whether a first attempt on `key` should respect the server's waiter queue, and more
    /// (see `Contention`). When this manager saw no contention on the key lately, the first
    /// attempt is a plain `SET NX PX` (the cheapest possible grant); a process that just
    /// released into a queue of waiters, or that waits itself, always goes through the queue,
    /// so it cannot barge ahead of them beyond the barging bound.
    pub fn contention(&self, key: &str) -> Contention {
        let mut seen = self.seen();
        let recent = |t: Option<Instant>| t.is_some_and(|t| t.elapsed() < QUIET_GRACE);
        match seen.get_mut(key) {
            Some(s) => {
                s.attempted = Some(Instant::now());
                Contention {
                    contended: s.at.elapsed() < CONTENTION_MEMORY,
                    quiet: recent(s.quiet),
                    looping: recent(s.released),
                }
            }
            None => Contention {
                contended: false,
                quiet: false,
                looping: false,
            },
        }
    }

    /// For a release of `key`: whether contention was seen lately, and whether the grant
    /// released is part of a loop (`Seen::streak`, forgotten here: the next grant says anew).
    /// Notes the release's time for `Contention::looping` (moved to its end when it found
    /// waiters: `mark_quiet_release`, `mark_loud_release`).
    pub fn release_view(&self, key: &str) -> (bool, bool) {
        let mut seen = self.seen();
        match seen.get_mut(key) {
            Some(s) => {
                s.released = Some(Instant::now());
                (
                    s.at.elapsed() < CONTENTION_MEMORY,
                    std::mem::take(&mut s.streak),
                )
            }
            None => (false, false),
        }
    }

    /// This process's memory of contention (a forked child starts with none).
    fn seen(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Seen>> {
        self.contention
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub fn handle(&self) -> Handle {
        match &self.handle {
            Some(h) => h.clone(),
            None => crate::runtime::runtime().handle().clone(),
        }
    }
}

/// Hands out locks on a fixed set of nodes. Cheap to clone; clones share connections.
#[derive(Clone)]
pub struct LockManager {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for LockManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockManager")
            .field("nodes", &self.node_names())
            .field("quorum", &self.shared.quorum)
            .finish()
    }
}

impl LockManager {
    /// Validates the options and URLs; opens no connection (those open on first use, so a
    /// node that is down now does not stop the manager from being built).
    pub fn new(options: ManagerOptions) -> Result<LockManager> {
        options.lock.validate()?;
        let urls = options.resolved_nodes();
        let shown: Vec<String> = urls.iter().map(|u| crate::node::redact_url(u)).collect();
        if urls.iter().any(|u| u.trim().is_empty()) {
            return Err(Error::invalid(format!(
                "empty node URL in node list {shown:?}"
            )));
        }
        // The same node twice would count its vote twice (or, refusing, make a quorum
        // impossible): Redlock needs independent nodes.
        for (i, u) in urls.iter().enumerate() {
            if urls[..i].contains(u) {
                return Err(Error::invalid(format!(
                    "node {:?} is listed twice in {shown:?}: Redlock needs distinct nodes",
                    crate::node::redact_url(u)
                )));
            }
        }
        let tls_ca = options.resolved_tls_ca();
        let guard = match options.restart_guard {
            Some(g) if g > crate::options::MAX_DURATION => {
                return Err(Error::invalid(format!("restart_guard {g:?} is too long")));
            }
            Some(g) => g,
            // A node that restarts with no persistence forgets its locks; with fewer than 3
            // nodes there is no spare to outvote it anyway.
            None if urls.len() >= 3 => options.lock.ttl,
            None => Duration::ZERO,
        };
        let nodes = urls
            .iter()
            .map(|u| Node::open(u, tls_ca.as_deref(), guard))
            .collect::<Result<Vec<_>>>()?;
        let quorum = nodes.len() / 2 + 1;
        let node_count = nodes.len();
        Ok(LockManager {
            shared: Arc::new(Shared {
                nodes,
                quorum,
                defaults: options.lock,
                watchdog: Watchdog::default(),
                owners: Owners::default(),
                waiters: Waiters::new(node_count),
                contention: Default::default(),
                handle: crate::runtime::ambient(),
            }),
        })
    }

    /// A manager on `FERROLOCK_NODES` (or the default node) with default options.
    pub fn from_env() -> Result<LockManager> {
        Self::new(ManagerOptions::default())
    }

    /// The nodes, with passwords redacted.
    pub fn node_names(&self) -> Vec<String> {
        self.shared
            .nodes
            .iter()
            .map(|n| n.name().to_string())
            .collect()
    }

    pub fn quorum(&self) -> usize {
        self.shared.quorum
    }

    /// Requests sent to each node so far (a pipeline counts once): round trips, counted in
    /// the client.
    pub fn round_trips(&self) -> Vec<u64> {
        self.shared.nodes.iter().map(Node::round_trips).collect()
    }

    /// The default options of locks from this manager.
    pub fn defaults(&self) -> &LockOptions {
        &self.shared.defaults
    }

    /// Acquires `key` with the manager's default options.
    pub async fn acquire(&self, key: &str) -> Result<Lock> {
        self.acquire_with(key, &self.shared.defaults.clone()).await
    }

    /// Tells now the first waiter of every key this manager released quietly and did not take
    /// back (a worker in a loop on a key, one node: see DESIGN.md, "Quiet streaks"). Call it
    /// when such a loop ends, and before dropping a manager or exiting right after one: the
    /// Python binding's `close()`, `release_all()` and exit hook do. Without it that waiter
    /// takes over at its own re-check, when its barging bound ends (6 ms at most).
    pub async fn flush_quiet_releases(&self) {
        crate::quiet::flush(&self.shared).await;
    }

    /// Tries once (`wait` = 0).
    pub async fn try_acquire(&self, key: &str) -> Result<Lock> {
        let opts = self.shared.defaults.clone().wait(Some(Duration::ZERO));
        self.acquire_with(key, &opts).await
    }

    /// Acquires `key`, retrying until `wait` is spent: at once when a release is published,
    /// at the holder's remaining TTL, or after a jittered `retry_delay` (holders that do not
    /// publish). Waiters queue (see DESIGN.md, "Waiters" and "Waiter queue").
    ///
    /// With `reentrant` on, each call is its own owner (a fresh owner id): the lock has
    /// Redisson's layout but is never re-entered. Use `acquire_owned` to re-enter.
    ///
    /// Dropping the returned future part-way releases whatever it had taken.
    pub async fn acquire_with(&self, key: &str, opts: &LockOptions) -> Result<Lock> {
        self.acquire_inner(key, None, opts).await
    }

    /// Acquires `key` for `owner`, an identity of the caller's choosing (a thread id, an
    /// asyncio task id, an explicit handle). With `opts.reentrant`, an owner that already
    /// holds `key` through this manager re-enters: the hold count goes up, the key's expiry
    /// becomes at least `opts.ttl` (never shorter: its other handles count on it; on a
    /// quorum), and the new handle keeps the outer grant's token (the hash field) and fence.
    /// Each handle is released on its own; only the last release frees the key. An
    /// owner's next outermost acquisition gets a new random owner id, so the hash field is
    /// unique per acquisition. Without `reentrant`, `owner` is ignored.
    pub async fn acquire_owned(&self, key: &str, owner: u64, opts: &LockOptions) -> Result<Lock> {
        self.acquire_inner(key, Some(owner), opts).await
    }

    /// This manager's client uuid in this process: the first half of a reentrant lock's hash
    /// field (`"<client uuid>:<owner id>"`). A forked child gets a new one.
    pub fn client_id(&self) -> String {
        self.shared.owners.client_id()
    }

    /// Test hook: runs between a failed first attempt and the waiter's subscription.
    #[doc(hidden)]
    pub fn __set_hook_before_subscribe(&self, hook: Option<crate::wakeup::Hook>) {
        *self
            .shared
            .waiters
            .hook
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = hook;
    }

    pub(crate) fn unreachable_error(&self, key: &str, tally: &Tally) -> Error {
        Error::new(
            ErrorKind::QuorumUnreachable,
            format!(
                "lock {key:?}: quorum unreachable: {} of {} nodes did not answer (need {}): {}",
                tally.unreachable(),
                tally.answers.len(),
                tally.quorum,
                tally.describe_failures(&self.shared.nodes)
            ),
        )
    }

    pub(crate) fn not_acquired_error(
        &self,
        key: &str,
        opts: &LockOptions,
        tally: &Tally,
        spoiled: Option<&Spoiled>,
    ) -> Error {
        let waited = match opts.wait {
            Some(w) if w.is_zero() => "on the first try (wait=0)".to_string(),
            Some(w) => format!("within wait={w:?}"),
            None => "before giving up".to_string(),
        };
        let why = match spoiled {
            Some(Spoiled::TooLate) => format!(
                "a quorum granted it but the acquire took longer than the validity (ttl {:?} minus drift {:?}), so it was released",
                opts.ttl,
                opts.drift()
            ),
            Some(Spoiled::FenceFailed(detail)) => format!(
                "a quorum granted it but its fencing token could not be raised on a quorum ({detail}), so it was released"
            ),
            Some(Spoiled::FenceError(i, e)) => format!(
                "a quorum granted it but raising its fencing token failed on {}: {}, so it was released",
                self.shared.nodes[*i].name(),
                e.detail()
            ),
            None => format!(
                "held by another owner (or promised to an earlier waiter in the queue) on {} of {} nodes",
                tally.no(),
                tally.answers.len()
            ),
        };
        let failures = tally.describe_failures(&self.shared.nodes);
        let tail = if failures.is_empty() {
            String::new()
        } else {
            format!("; failed: {failures}")
        };
        Error::new(
            ErrorKind::NotAcquired,
            format!("lock {key:?} not acquired {waited}: {why}{tail}"),
        )
    }
}

pub(crate) fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::invalid("lock key must not be empty"));
    }
    // The queue, fence and channel names must hash to the key's Cluster slot (every script
    // touches one slot); for this key no name can (see `scripts::has_slot_tag`).
    if !crate::scripts::has_slot_tag(key) {
        return Err(Error::invalid(format!(
            "lock key {key:?} has no hash tag and contains '}}', so no name derived from it can \
             share its Redis Cluster slot: give it a hash tag (a non-empty {{...}}) or drop the '}}'"
        )));
    }
    Ok(())
}

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

/// `base` ± 50 %, so contenders that failed together do not retry together.
pub(crate) fn jitter(base: Duration) -> Duration {
    let r = getrandom::u64().unwrap_or(0);
    let fraction = (r >> 11) as f64 / (1u64 << 53) as f64; // uniform in [0, 1)
    base.mul_f64(0.5 + fraction)
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

    #[test]
    fn jitter_stays_within_half_either_side() {
        for _ in 0..1000 {
            let j = jitter(Duration::from_millis(100));
            assert!(
                j >= Duration::from_millis(50) && j < Duration::from_millis(150),
                "{j:?}"
            );
        }
    }
}
