//! The Lua scripts, kept as `.lua` files. `redis::Script` sends EVALSHA and, on NOSCRIPT (a
//! restarted node, SCRIPT FLUSH), loads the script and retries once.

use std::sync::LazyLock;

use redis::Script;

const EXTEND_SRC: &str = include_str!("../scripts/extend.lua");
const RAISE_FENCE_SRC: &str = include_str!("../scripts/raise_fence.lua");
// The acquire scripts, the undo and the dequeue start with the waiter-queue functions of
// `queue.lua`.
const RELEASE_SRC: &str = include_str!("../scripts/release.lua");
const DEQUEUE_SRC: &str = concat!(
    include_str!("../scripts/queue.lua"),
    include_str!("../scripts/dequeue.lua")
);
const ACQUIRE_SRC: &str = concat!(
    include_str!("../scripts/queue.lua"),
    include_str!("../scripts/acquire.lua")
);
const ACQUIRE_REENTRANT_SRC: &str = concat!(
    include_str!("../scripts/queue.lua"),
    include_str!("../scripts/acquire_reentrant.lua")
);
const UNDO_SRC: &str = concat!(
    include_str!("../scripts/queue.lua"),
    include_str!("../scripts/undo.lua")
);
const RELEASE_REENTRANT_SRC: &str = include_str!("../scripts/release_reentrant.lua");
const EXTEND_REENTRANT_SRC: &str = include_str!("../scripts/extend_reentrant.lua");

pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_SRC));
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(EXTEND_SRC));
pub(crate) static RAISE_FENCE: LazyLock<Script> = LazyLock::new(|| Script::new(RAISE_FENCE_SRC));
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_SRC));
pub(crate) static ACQUIRE_REENTRANT: LazyLock<Script> =
    LazyLock::new(|| Script::new(ACQUIRE_REENTRANT_SRC));
/// Undoes a fresh grant that missed the quorum and puts the waiter back in the queue.
pub(crate) static UNDO: LazyLock<Script> = LazyLock::new(|| Script::new(UNDO_SRC));
/// Takes a waiter that gave up out of the queue, and wakes the next one if the lock is free.
pub(crate) static DEQUEUE: LazyLock<Script> = LazyLock::new(|| Script::new(DEQUEUE_SRC));
pub(crate) static RELEASE_REENTRANT: LazyLock<Script> =
    LazyLock::new(|| Script::new(RELEASE_REENTRANT_SRC));
pub(crate) static EXTEND_REENTRANT: LazyLock<Script> =
    LazyLock::new(|| Script::new(EXTEND_REENTRANT_SRC));

/// The source of every script, loaded on each new connection.
pub(crate) fn sources() -> [&'static str; 9] {
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
    ]
}

/// The channel a release publishes on: `ferrolock:release:{<key>}`, or without the extra
/// braces when the key already has a hash tag, so that key and channel share a slot (the
/// rule Redisson uses for its channel).
pub fn release_channel(key: &str) -> String {
    tagged("ferrolock:release:", key)
}

/// The channel on which one waiting process (waiter id `id`) hears that a plain lock on `key`
/// may be free: only the queue head's process is told (see DESIGN.md, "Waiter queue").
pub fn waiter_channel(key: &str, id: &str) -> String {
    format!("{}{id}", waiter_channel_prefix(key))
}

/// `waiter_channel(key, "")`: what the scripts append a waiter id to.
pub(crate) fn waiter_channel_prefix(key: &str) -> String {
    let mut prefix = release_channel(key);
    prefix.push(':');
    prefix
}

/// The channel a reentrant lock's last release publishes `"0"` on: Redisson's
/// `redisson_lock__channel:{<key>}` (no extra braces when the key has a hash tag).
pub fn redisson_channel(key: &str) -> String {
    tagged("redisson_lock__channel:", key)
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

/// The three waiter-queue key names of one key, built in one allocation (the release sends
/// them on every call).
pub(crate) struct QueueKeys {
    names: String,
    /// End of the queue name, end of the lease name (the join-time name runs to the end).
    ends: [usize; 2],
}

impl QueueKeys {
    pub fn new(key: &str) -> QueueKeys {
        let mut names = String::with_capacity(3 * (key.len() + 24));
        let tagged = key.as_bytes().contains(&b'{');
        let mut push = |prefix: &str| {
            names.push_str(prefix);
            if tagged {
                names.push_str(key);
            } else {
                names.push('{');
                names.push_str(key);
                names.push('}');
            }
            names.len()
        };
        let queue = push("ferrolock:queue:");
        let leases = push("ferrolock:queue-lease:");
        push("ferrolock:queue-since:");
        QueueKeys {
            names,
            ends: [queue, leases],
        }
    }
    pub fn queue(&self) -> &str {
        &self.names[..self.ends[0]]
    }
    pub fn leases(&self) -> &str {
        &self.names[self.ends[0]..self.ends[1]]
    }
    pub fn since(&self) -> &str {
        &self.names[self.ends[1]..]
    }
}

/// Where the fence counter for `key` lives.
pub fn fence_key(key: &str) -> String {
    tagged("ferrolock:fence:", key)
}

fn tagged(prefix: &str, key: &str) -> String {
    // Pushed by hand: `format!` costs several times as much, on every acquire and release.
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

/// `EVALSHA <sha> <number of keys>` of `script`; keys and arguments follow. Built by hand for
/// the hot paths: `ScriptInvocation` copies every key and argument into a vector of its own
/// first, and its future carries the rare reload path inline.
pub(crate) fn evalsha(script: &Script, keys: usize) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(keys);
    cmd
}

/// Sends `cmd` (from `evalsha(script, ..)`); on NOSCRIPT (a restarted node, SCRIPT FLUSH) loads
/// the script and sends it once more, as `ScriptInvocation::invoke_async` does.
pub(crate) async fn run_script<T: redis::FromRedisValue>(
    script: &Script,
    cmd: &redis::Cmd,
    conn: &mut redis::aio::MultiplexedConnection,
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
    #[test]
    fn channel_keeps_the_keys_hash_slot() {
        assert_eq!(
            super::release_channel("orders:1"),
            "ferrolock:release:{orders:1}"
        );
        assert_eq!(
            super::release_channel("{user42}:cart"),
            "ferrolock:release:{user42}:cart"
        );
        assert_eq!(super::fence_key("a"), "ferrolock:fence:{a}");
        assert_eq!(
            super::redisson_channel("orders:1"),
            "redisson_lock__channel:{orders:1}"
        );
        assert_eq!(
            super::redisson_channel("{user42}:cart"),
            "redisson_lock__channel:{user42}:cart"
        );
        assert_eq!(super::queue_key("a"), "ferrolock:queue:{a}");
        for key in ["a", "{user42}:cart"] {
            let q = super::QueueKeys::new(key);
            assert_eq!(q.queue(), super::queue_key(key));
            assert_eq!(q.leases(), super::queue_lease_key(key));
            assert_eq!(q.since(), super::queue_since_key(key));
        }
        assert_eq!(super::queue_lease_key("a"), "ferrolock:queue-lease:{a}");
        assert_eq!(super::queue_since_key("a"), "ferrolock:queue-since:{a}");
    }
}
