//! The Lua scripts, kept as `.lua` files in `core/scripts/`, and their arguments (`args.rs`). `redis::Script` sends EVALSHA and, on NOSCRIPT (a
//! restarted node, SCRIPT FLUSH), loads the script and retries once.

use std::sync::LazyLock;

use redis::Script;

mod args;

pub use args::{
    Acquire, AcquireRead, AcquireWrite, Extend, KeyNames, Latch, Place, Release, ReleaseRead,
    ReleaseWrite, Renewal, Undo, writer_field,
};
pub(crate) use args::{
    AcquireReentrant, Dequeue, RaiseFence, ReleaseReentrant, SemaphoreAcquire, SemaphoreRelease,
};

const EXTEND_SRC: &str = include_str!("../../scripts/extend.lua");
const RAISE_FENCE_SRC: &str = include_str!("../../scripts/raise_fence.lua");
// The acquire scripts, the undo and the dequeue start with the waiter-queue functions of
// `queue.lua`; the counted locks' scripts (reentrant, read, write: grants, renewals,
// releases) and the undo with `holds.lua`, the set of an owner's live holds.
const RELEASE_SRC: &str = include_str!("../../scripts/release.lua");
const DEQUEUE_SRC: &str = concat!(
    include_str!("../../scripts/queue.lua"),
    include_str!("../../scripts/dequeue.lua")
);
const ACQUIRE_SRC: &str = concat!(
    include_str!("../../scripts/queue.lua"),
    include_str!("../../scripts/acquire.lua")
);
const ACQUIRE_REENTRANT_SRC: &str = concat!(
    include_str!("../../scripts/queue.lua"),
    include_str!("../../scripts/holds.lua"),
    include_str!("../../scripts/acquire_reentrant.lua")
);
const UNDO_SRC: &str = concat!(
    include_str!("../../scripts/queue.lua"),
    include_str!("../../scripts/holds.lua"),
    include_str!("../../scripts/undo.lua")
);
const RELEASE_REENTRANT_SRC: &str = concat!(
    include_str!("../../scripts/holds.lua"),
    include_str!("../../scripts/release_reentrant.lua")
);
// The read-write lock's scripts (issue 33), on Redisson's RReadWriteLock layout; a writer's
// renewal is `extend_reentrant.lua` on its ":write" field. Their arguments are typed in
// `args.rs` (tests: core/tests/rwlock_scripts.rs, core/tests/rwlock.rs).
pub const ACQUIRE_READ_SRC: &str = concat!(
    include_str!("../../scripts/queue.lua"),
    include_str!("../../scripts/holds.lua"),
    include_str!("../../scripts/acquire_read.lua")
);
pub const ACQUIRE_WRITE_SRC: &str = concat!(
    include_str!("../../scripts/queue.lua"),
    include_str!("../../scripts/holds.lua"),
    include_str!("../../scripts/acquire_write.lua")
);
pub const RELEASE_READ_SRC: &str = concat!(
    include_str!("../../scripts/holds.lua"),
    include_str!("../../scripts/release_read.lua")
);
pub const RELEASE_WRITE_SRC: &str = concat!(
    include_str!("../../scripts/holds.lua"),
    include_str!("../../scripts/release_write.lua")
);
pub const EXTEND_READ_SRC: &str = concat!(
    include_str!("../../scripts/holds.lua"),
    include_str!("../../scripts/extend_read.lua")
);
pub const EXTEND_WRITE_SRC: &str = EXTEND_REENTRANT_SRC;
const EXTEND_REENTRANT_SRC: &str = concat!(
    include_str!("../../scripts/holds.lua"),
    include_str!("../../scripts/extend_reentrant.lua")
);
// The semaphore's scripts (issue 33), on Redisson's RPermitExpirableSemaphore layout (tests:
// core/tests/semaphore_scripts.rs, core/tests/semaphore.rs).
const SEMAPHORE_ACQUIRE_SRC: &str = concat!(
    include_str!("../../scripts/queue.lua"),
    include_str!("../../scripts/semaphore_acquire.lua")
);
const SEMAPHORE_RELEASE_SRC: &str = include_str!("../../scripts/semaphore_release.lua");
const SEMAPHORE_EXTEND_SRC: &str = include_str!("../../scripts/semaphore_extend.lua");

static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_SRC));
static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(EXTEND_SRC));
static RAISE_FENCE: LazyLock<Script> = LazyLock::new(|| Script::new(RAISE_FENCE_SRC));
static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_SRC));
static ACQUIRE_REENTRANT: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_REENTRANT_SRC));
/// Undoes a fresh grant that missed the quorum and puts the waiter back in the queue.
static UNDO: LazyLock<Script> = LazyLock::new(|| Script::new(UNDO_SRC));
/// Takes a waiter that gave up out of the queue, and wakes the next one if the lock is free.
static DEQUEUE: LazyLock<Script> = LazyLock::new(|| Script::new(DEQUEUE_SRC));
static RELEASE_REENTRANT: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_REENTRANT_SRC));
static EXTEND_REENTRANT: LazyLock<Script> = LazyLock::new(|| Script::new(EXTEND_REENTRANT_SRC));
static ACQUIRE_READ: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_READ_SRC));
static ACQUIRE_WRITE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_WRITE_SRC));
static RELEASE_READ: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_READ_SRC));
static RELEASE_WRITE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_WRITE_SRC));
static EXTEND_READ: LazyLock<Script> = LazyLock::new(|| Script::new(EXTEND_READ_SRC));
static SEMAPHORE_ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(SEMAPHORE_ACQUIRE_SRC));
static SEMAPHORE_RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(SEMAPHORE_RELEASE_SRC));
static SEMAPHORE_EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(SEMAPHORE_EXTEND_SRC));

/// The source of every lock script, loaded on each new connection (the semaphore's load on
/// their first `NOSCRIPT`: DESIGN.md, "Every new connection loads").
pub(crate) fn sources() -> [&'static str; 14] {
    [
        DEQUEUE_SRC,
        RELEASE_SRC,
        EXTEND_SRC,
        RAISE_FENCE_SRC,
        ACQUIRE_SRC,
        ACQUIRE_REENTRANT_SRC,
        UNDO_SRC,
        RELEASE_REENTRANT_SRC,
        EXTEND_REENTRANT_SRC,
        ACQUIRE_READ_SRC,
        ACQUIRE_WRITE_SRC,
        RELEASE_READ_SRC,
        RELEASE_WRITE_SRC,
        EXTEND_READ_SRC,
    ]
}

/// The channel a release publishes on: `ferrolock:release:<key>`, its key carried as `tagged`
/// says, so that key and channel share a Cluster slot (sharded pub/sub checks a channel's slot
/// like a key's).
pub fn release_channel(key: &str) -> String {
    tagged("ferrolock:release:", key)
}

/// The channel on which one waiting process (waiter id `id`) hears that a plain lock on `key`
/// may be free: only the queue head's process is told (see DESIGN.md, "Waiter queue").
pub fn waiter_channel(key: &str, id: &str) -> String {
    format!("{}{id}", waiter_channel_prefix(key))
}

/// `waiter_channel(key, "")`: what the scripts append a waiter id to.
pub fn waiter_channel_prefix(key: &str) -> String {
    let mut prefix = release_channel(key);
    prefix.push(':');
    prefix
}

/// The channel a reentrant lock's last release publishes `"0"` on, byte for byte as Redisson
/// builds it (`prefixName`): `redisson_lock__channel:{<key>}`, or no braces when the key
/// contains `{` at all (then its slot is the key's only when that `{` starts a valid tag).
pub fn redisson_channel(key: &str) -> String {
    redisson_prefixed("redisson_lock__channel:", key)
}

/// `<prefix>{<key>}`, or `<prefix><key>` when the key contains `{` at all: Redisson's
/// `prefixName`, and the `{name}` of its read-write lock's names (`suffixName`).
fn redisson_prefixed(prefix: &str, key: &str) -> String {
    let mut s = String::with_capacity(prefix.len() + key.len() + 2);
    s.push_str(prefix);
    if key.contains('{') {
        s.push_str(key);
    } else {
        s.push('{');
        s.push_str(key);
        s.push('}');
    }
    s
}

/// Redisson's semaphore channel `redisson_sc:{name}`: a release publishes the number released.
pub fn semaphore_channel(name: &str) -> String {
    format!("redisson_sc:{{{name}}}")
}

/// Redisson's zset of a semaphore's permit ids scored by lease end: `{name}:timeout`.
pub fn semaphore_timeout_key(name: &str) -> String {
    format!("{{{name}}}:timeout")
}

/// The channel of a read-write lock, byte for byte as Redisson 4.7.0 builds it:
/// `redisson_rwlock:{<key>}` (no braces added when the key contains `{`). A read release that
/// frees the key publishes `0` there, a write release `1`.
pub fn rwlock_channel(key: &str) -> String {
    redisson_prefixed("redisson_rwlock:", key)
}

/// What every read hold key of `key` starts with: Redisson's `{name}` (`{<key>}`, or the key
/// itself when it contains `{`), the prefix `release_read.lua` scans for expired readers.
pub fn rwlock_prefix(key: &str) -> String {
    redisson_prefixed("", key)
}

/// The prefix of one reader's hold keys, `<rwlock_prefix>:<field>:rwlock_timeout`: its hold
/// `n` has the key `<this>:<n>`, whose TTL is that hold's lease.
pub fn rwlock_timeout_prefix(key: &str, field: &str) -> String {
    let mut s = rwlock_prefix(key);
    s.push(':');
    s.push_str(field);
    s.push_str(":rwlock_timeout");
    s
}

/// The waiter queue of `key` (a ZSET of waiter ids by arrival), in the key's hash slot.
pub fn queue_key(key: &str) -> String {
    tagged("ferrolock:queue:", key)
}

/// The lease ends of the waiters in `queue_key(key)` (a ZSET, server milliseconds).
pub fn queue_lease_key(key: &str) -> String {
    tagged("ferrolock:queue-lease:", key)
}

/// When each waiter in `queue_key(key)` joined it (a ZSET, server milliseconds): the barging
/// bound is measured from the head's join time.
pub fn queue_since_key(key: &str) -> String {
    tagged("ferrolock:queue-since:", key)
}

/// A request's latch: `ferrolock:latch:<key>:<id>` (braces as `braces` says), in the key's
/// slot, where a script that must not run twice keeps its reply for a re-send of the same call
/// (see `args::Latch`). It always has a PX: never a leaked lock (`ferrolock scan` skips every
/// `ferrolock:` name).
pub fn latch_key(key: &str, id: &str) -> String {
    Tagged::latch(key, id).to_name()
}

/// The mark of one hold of a counted lock (reentrant, read, write): set with its grant, renewed
/// with it, and taken by its release or undo, which takes a count only with it (the handles of
/// one owner share one field; see release_reentrant.lua).
pub fn hold_key(key: &str, id: &str) -> String {
    Tagged::hold(key, id).to_name()
}

/// The set of an owner's live holds of a reentrant or write lock (`holds.lua`), whose hash
/// field is `field`: `ferrolock:holds:<key>:<field>`, in the key's slot. The scripts derive it
/// from a hold's mark; the renewal names it too (see extend_reentrant.lua).
pub fn holds_key(key: &str, field: &str) -> String {
    Tagged::holds(key, field).to_name()
}

/// Where the fence counter for `key` lives.
pub fn fence_key(key: &str) -> String {
    tagged("ferrolock:fence:", key)
}

/// Whether a name derived from `key` (`<prefix><key><suffix>`, the prefix without braces)
/// needs braces around the key to hash to the key's Cluster slot.
///
/// Redis hashes only a key's tag when it has one: from its first `{` to the first `}` after
/// it, with at least one byte between. A key with a valid tag keeps it in the derived name
/// (no braces). A key without one is hashed whole, so the derived name wraps it in braces,
/// which works only when the key holds no `}` (it would end the tag early). Keys that have
/// neither are refused by `LockManager`'s key check (`has_slot_tag`), before any I/O.
fn braces(key: &str) -> bool {
    !has_tag(key)
}

/// Redis's hash-tag rule (`keyHashSlot`): the key has a non-empty `{...}`.
pub(crate) fn has_tag(key: &str) -> bool {
    // `str::find` with a char searches with memchr: this runs on every acquire.
    match key.find('{') {
        Some(open) => key[open + 1..].find('}').is_some_and(|len| len > 0),
        None => false,
    }
}

/// Whether names derived from `key` can share its Cluster slot: it has a valid hash tag, or
/// contains no `}` (then the derived names wrap it whole in braces).
pub(crate) fn has_slot_tag(key: &str) -> bool {
    !key.contains('}') || has_tag(key)
}

/// A name derived from a key (`<prefix><key><suffix>`, braces as `braces` says), written
/// straight into a command's buffer: the release sends three or four of them on every call,
/// and building each as a `String` first cost an allocation apiece.
#[derive(Clone, Copy)]
pub(crate) struct Tagged<'a> {
    prefix: &'static str,
    key: &'a str,
    suffix: &'static str,
    /// After the suffix: a latch's call id.
    id: &'a str,
}

impl<'a> Tagged<'a> {
    pub fn queue(key: &'a str) -> Self {
        Tagged {
            prefix: "ferrolock:queue:",
            key,
            suffix: "",
            id: "",
        }
    }
    pub fn queue_leases(key: &'a str) -> Self {
        Tagged {
            prefix: "ferrolock:queue-lease:",
            key,
            suffix: "",
            id: "",
        }
    }
    pub fn queue_since(key: &'a str) -> Self {
        Tagged {
            prefix: "ferrolock:queue-since:",
            key,
            suffix: "",
            id: "",
        }
    }
    /// `waiter_channel_prefix(key)`.
    pub fn waiter_channel_prefix(key: &'a str) -> Self {
        Tagged {
            prefix: "ferrolock:release:",
            key,
            suffix: ":",
            id: "",
        }
    }
    /// `latch_key(key, id)`.
    pub fn latch(key: &'a str, id: &'a str) -> Self {
        Tagged {
            prefix: "ferrolock:latch:",
            key,
            suffix: ":",
            id,
        }
    }
    /// `hold_key(key, id)`.
    pub fn hold(key: &'a str, id: &'a str) -> Self {
        Tagged {
            prefix: "ferrolock:hold:",
            key,
            suffix: ":",
            id,
        }
    }
    /// `holds_key(key, field)`.
    pub fn holds(key: &'a str, field: &'a str) -> Self {
        Tagged {
            prefix: "ferrolock:holds:",
            key,
            suffix: ":",
            id: field,
        }
    }
}

impl<'a> Tagged<'a> {
    /// The name in pieces: the one place that lays a derived name out.
    fn parts(&self) -> [&'a str; 6] {
        let (open, close) = if braces(self.key) {
            ("{", "}")
        } else {
            ("", "")
        };
        [self.prefix, open, self.key, close, self.suffix, self.id]
    }

    /// The length of the name.
    pub fn len(&self) -> usize {
        self.parts().iter().map(|p| p.len()).sum()
    }

    /// The name as a `String`.
    fn to_name(self) -> String {
        let mut s = String::with_capacity(self.len());
        for part in self.parts() {
            s.push_str(part);
        }
        s
    }
}

impl redis::ToRedisArgs for Tagged<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        use std::io::Write;
        let mut w = out.writer_for_next_arg();
        for part in self.parts() {
            // Writes into a Vec: cannot fail.
            let _ = w.write_all(part.as_bytes());
        }
    }
}

/// `<prefix><key>`, braces as `braces` says. Pushed by hand: `format!` costs several times as
/// much, on every acquire and release.
fn tagged(prefix: &'static str, key: &str) -> String {
    Tagged {
        prefix,
        key,
        suffix: "",
        id: "",
    }
    .to_name()
}

/// `name`, with room for `args` more arguments of `bytes` bytes in all: the hot paths' commands
/// are built without regrowing their buffers (two allocations instead of five to seven, per
/// node, on every acquire and release).
pub(crate) fn command(name: &'static str, args: usize, bytes: usize) -> redis::Cmd {
    let mut cmd = redis::Cmd::with_capacity(1 + args, name.len() + bytes);
    cmd.arg(name);
    cmd
}

/// `EVALSHA <sha> <number of keys>` of `script`; `args` keys and arguments of `bytes` bytes in
/// all follow. Built by hand for the hot paths: `ScriptInvocation` copies every key and
/// argument into a vector of its own first, and its future carries the rare reload path inline.
pub(crate) fn evalsha(script: &Script, keys: usize, args: usize, bytes: usize) -> redis::Cmd {
    let mut cmd = command("EVALSHA", 2 + args, 40 + 20 + bytes);
    cmd.arg(script.get_hash()).arg(keys);
    cmd
}

/// Sends `cmd` (from `evalsha(script, ..)`); on NOSCRIPT (a restarted node, SCRIPT FLUSH) loads
/// the script and sends it once more, as `ScriptInvocation::invoke_async` does.
pub(crate) async fn run_script<T: redis::FromRedisValue>(
    script: &Script,
    cmd: &redis::Cmd,
    conn: &mut crate::node_cluster::Conn,
) -> redis::RedisResult<T> {
    match cmd.query_async(conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            // Boxed: the reload is rare, and would otherwise size every caller's future.
            Box::pin(async move {
                script.load_async(conn).await?;
                cmd.query_async(conn).await
            })
            .await
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::ToRedisArgs;

    fn slot(name: &str) -> u16 {
        crate::node_cluster::key_slot(name)
    }

    fn arg(t: Tagged<'_>) -> String {
        String::from_utf8(t.to_redis_args().remove(0)).unwrap()
    }

    /// Every name ferrolock derives from `key`, by both writers.
    fn derived(key: &str) -> Vec<String> {
        let names = vec![
            release_channel(key),
            waiter_channel(key, "w1"),
            waiter_channel_prefix(key),
            queue_key(key),
            queue_lease_key(key),
            queue_since_key(key),
            fence_key(key),
            latch_key(key, "c1"),
            hold_key(key, "h1"),
            holds_key(key, "u:1:write"),
            arg(Tagged::latch(key, "c1")),
            arg(Tagged::queue(key)),
            arg(Tagged::queue_leases(key)),
            arg(Tagged::queue_since(key)),
            arg(Tagged::waiter_channel_prefix(key)),
        ];
        for t in [
            Tagged::queue(key),
            Tagged::queue_leases(key),
            Tagged::queue_since(key),
            Tagged::waiter_channel_prefix(key),
            Tagged::latch(key, "c1"),
        ] {
            assert_eq!(t.len(), arg(t).len(), "{key:?}");
        }
        names
    }

    #[test]
    fn the_slot_check_is_redis_cluster_s() {
        // The examples of the Redis Cluster specification and its CRC16 test vector.
        assert_eq!(slot("123456789"), 0x31C3 & 16383);
        assert_eq!(slot("{user1000}.following"), slot("user1000"));
        assert_ne!(slot("foo{}{bar}"), slot("bar"));
        assert_eq!(slot("foo{{bar}}zap"), slot("{bar"));
        assert_eq!(slot("foo{bar}{zap}"), slot("bar"));
    }

    #[test]
    fn derived_names_land_in_the_keys_slot() {
        for key in [
            "a",
            "orders:1",
            "{user42}:cart",
            "cart:{user42}",
            "a{b",
            "{",
            "{{",
            "{{bar}}",
            "x{y}z}",
            "ключ",
        ] {
            assert!(has_slot_tag(key), "{key:?}");
            for name in derived(key) {
                assert_eq!(slot(&name), slot(key), "{key:?} -> {name:?}");
            }
        }
    }

    #[test]
    fn keys_whose_slot_no_derived_name_can_share_are_refused() {
        // No valid tag (so hashed whole) and a `}` that would end any tag we add.
        for key in ["user}1", "}", "{}", "a{}", "a{}b}", "}{x", "foo{}{bar}"] {
            assert!(!has_slot_tag(key), "{key:?}");
        }
        // Today's bug: `user}1` would give `ferrolock:queue:{user}1}`, tag `user`.
        assert_ne!(slot("ferrolock:queue:{user}1}"), slot("user}1"));
    }

    #[test]
    fn names_are_laid_out_as_documented() {
        assert_eq!(release_channel("orders:1"), "ferrolock:release:{orders:1}");
        assert_eq!(
            release_channel("{user42}:cart"),
            "ferrolock:release:{user42}:cart"
        );
        assert_eq!(
            waiter_channel("orders:1", "w1"),
            "ferrolock:release:{orders:1}:w1"
        );
        assert_eq!(fence_key("a"), "ferrolock:fence:{a}");
        assert_eq!(latch_key("a", "c1"), "ferrolock:latch:{a}:c1");
        assert_eq!(latch_key("{u}:x", "c1"), "ferrolock:latch:{u}:x:c1");
        assert_eq!(queue_key("a"), "ferrolock:queue:{a}");
        assert_eq!(queue_lease_key("a"), "ferrolock:queue-lease:{a}");
        assert_eq!(queue_since_key("a"), "ferrolock:queue-since:{a}");
        // A `{` that starts no valid tag: wrapped (it used to be left bare, hashed whole).
        assert_eq!(queue_key("a{b"), "ferrolock:queue:{a{b}");
        assert_eq!(queue_key("{"), "ferrolock:queue:{{}");
        for key in ["a", "{user42}:cart", "a{b", "{"] {
            assert_eq!(arg(Tagged::queue(key)), queue_key(key));
            assert_eq!(arg(Tagged::queue_leases(key)), queue_lease_key(key));
            assert_eq!(arg(Tagged::queue_since(key)), queue_since_key(key));
            assert_eq!(
                arg(Tagged::waiter_channel_prefix(key)),
                waiter_channel_prefix(key)
            );
        }
    }

    #[test]
    fn redissons_channel_stays_as_redisson_builds_it() {
        assert_eq!(
            redisson_channel("orders:1"),
            "redisson_lock__channel:{orders:1}"
        );
        assert_eq!(
            redisson_channel("{user42}:cart"),
            "redisson_lock__channel:{user42}:cart"
        );
        // Redisson's `prefixName` adds no braces to any key containing `{`.
        assert_eq!(redisson_channel("a{b"), "redisson_lock__channel:a{b");
    }

    #[test]
    fn rwlock_names_stay_as_redisson_builds_them() {
        assert_eq!(rwlock_channel("orders:1"), "redisson_rwlock:{orders:1}");
        assert_eq!(
            rwlock_channel("{user42}:cart"),
            "redisson_rwlock:{user42}:cart"
        );
        assert_eq!(
            rwlock_timeout_prefix("orders:1", "u:7"),
            "{orders:1}:u:7:rwlock_timeout"
        );
        assert_eq!(
            rwlock_timeout_prefix("a{b", "u:7"),
            "a{b:u:7:rwlock_timeout"
        );
        assert_eq!(rwlock_prefix("{user42}:cart"), "{user42}:cart");
    }
}
