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

/// A name derived from a key (`<prefix>{<key>}<suffix>`, braces as in `tagged`), written
/// straight into a command's buffer: the release sends three or four of them on every call,
/// and building each as a `String` first cost an allocation apiece.
#[derive(Clone, Copy)]
pub(crate) struct Tagged<'a> {
    prefix: &'static str,
    key: &'a str,
    suffix: &'static str,
}

impl<'a> Tagged<'a> {
    pub fn queue(key: &'a str) -> Self {
        Tagged {
            prefix: "ferrolock:queue:",
            key,
            suffix: "",
        }
    }
    pub fn queue_leases(key: &'a str) -> Self {
        Tagged {
            prefix: "ferrolock:queue-lease:",
            key,
            suffix: "",
        }
    }
    pub fn queue_since(key: &'a str) -> Self {
        Tagged {
            prefix: "ferrolock:queue-since:",
            key,
            suffix: "",
        }
    }
    /// `waiter_channel_prefix(key)`.
    pub fn waiter_channel_prefix(key: &'a str) -> Self {
        Tagged {
            prefix: "ferrolock:release:",
            key,
            suffix: ":",
        }
    }
}

impl Tagged<'_> {
    /// The length of the name.
    pub fn len(&self) -> usize {
        let braces = if self.key.as_bytes().contains(&b'{') {
            0
        } else {
            2
        };
        self.prefix.len() + self.key.len() + braces + self.suffix.len()
    }
}

impl redis::ToRedisArgs for Tagged<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        use std::io::Write;
        let mut w = out.writer_for_next_arg();
        // Writes into a Vec: cannot fail.
        let _ = w.write_all(self.prefix.as_bytes());
        if self.key.as_bytes().contains(&b'{') {
            let _ = w.write_all(self.key.as_bytes());
        } else {
            let _ = w.write_all(b"{");
            let _ = w.write_all(self.key.as_bytes());
            let _ = w.write_all(b"}");
        }
        let _ = w.write_all(self.suffix.as_bytes());
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
            use redis::ToRedisArgs;
            let arg =
                |t: super::Tagged<'_>| String::from_utf8(t.to_redis_args().remove(0)).unwrap();
            assert_eq!(arg(super::Tagged::queue(key)), super::queue_key(key));
            assert_eq!(
                arg(super::Tagged::queue_leases(key)),
                super::queue_lease_key(key)
            );
            assert_eq!(
                arg(super::Tagged::queue_since(key)),
                super::queue_since_key(key)
            );
            assert_eq!(
                arg(super::Tagged::waiter_channel_prefix(key)),
                super::waiter_channel_prefix(key)
            );
        }
        assert_eq!(super::queue_lease_key("a"), "ferrolock:queue-lease:{a}");
        assert_eq!(super::queue_since_key("a"), "ferrolock:queue-since:{a}");
    }
}
