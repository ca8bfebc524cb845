//! Each script's KEYS and ARGV, as typed structs: the only code that lays them out. Each
//! struct's fields are in the order of the script's header comment (`core/scripts/*.lua`).
//! They borrow what they send, so building one allocates nothing of its own.

use crate::node_cluster::Conn;
use redis::{Cmd, Pipeline, RedisResult, ScriptInvocation};

use super::{
    ACQUIRE, ACQUIRE_READ, ACQUIRE_REENTRANT, ACQUIRE_WRITE, DEQUEUE, EXTEND, EXTEND_READ,
    EXTEND_REENTRANT, RAISE_FENCE, RELEASE, RELEASE_READ, RELEASE_REENTRANT, RELEASE_WRITE,
    SEMAPHORE_ACQUIRE, SEMAPHORE_EXTEND, SEMAPHORE_RELEASE, Tagged, UNDO, evalsha, fence_key,
    queue_key, queue_lease_key, queue_since_key, run_script,
};

/// The names the queue-aware scripts derive from the lock key: KEYS[2..5] of the acquire
/// scripts, the undo and the dequeue.
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct KeyNames {
    pub fence: String,
    pub queue: String,
    pub leases: String,
    pub since: String,
}

impl KeyNames {
    pub fn of(key: &str) -> KeyNames {
        KeyNames {
            fence: fence_key(key),
            queue: queue_key(key),
            leases: queue_lease_key(key),
            since: queue_since_key(key),
        }
    }

    fn add_to(&self, inv: &mut ScriptInvocation<'_>) {
        inv.key(&self.fence)
            .key(&self.queue)
            .key(&self.leases)
            .key(&self.since);
    }
}

/// A waiter's place in the server queue, as an attempt or an undo sends it: its id, its score
/// ('' = arrival order by the node's clock) and its lease. All empty: not queued.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Place<'a> {
    pub id: &'a str,
    pub score: &'a str,
    pub lease_ms: u64,
}

/// `acquire.lua` (plain lock).
#[doc(hidden)]
#[derive(Debug)]
pub struct Acquire<'a> {
    pub key: &'a str,
    pub names: &'a KeyNames,
    pub token: &'a str,
    pub ttl_ms: u64,
    /// '' no fence, '1' INCR (one node), '0' read the counter (N nodes).
    pub fence_mode: &'a str,
    pub place: Place<'a>,
    pub bound_ms: u64,
    /// The prefix of the waiters' own channels ('' = none).
    pub wake_prefix: &'a str,
    /// The grace after the bound (0 with N nodes, whose releases are never quiet).
    pub grace_ms: u64,
    /// The caller's last act on the key was a quiet release.
    pub quiet: bool,
}

impl Acquire<'_> {
    /// `sharded`: the node is a Redis Cluster with sharded pub/sub (its wake-ups SPUBLISH).
    pub(crate) fn invocation(&self, sharded: bool) -> ScriptInvocation<'static> {
        let mut inv = ACQUIRE.prepare_invoke();
        inv.key(self.key);
        self.names.add_to(&mut inv);
        inv.arg(self.token).arg(self.ttl_ms).arg(self.fence_mode);
        inv.arg(self.place.id)
            .arg(self.place.score)
            .arg(self.place.lease_ms);
        inv.arg(self.bound_ms)
            .arg(self.wake_prefix)
            .arg(self.grace_ms)
            .arg(flag(self.quiet))
            .arg(flag(sharded));
        inv
    }

    /// The same as one `EVALSHA` command, for a caller with connections of its own (the
    /// benchmark's mirror of the wire): the script must be loaded there.
    pub fn command(&self, sharded: bool) -> Cmd {
        let mut cmd = evalsha(&ACQUIRE, 5, 16, 0);
        let n = self.names;
        cmd.arg(self.key)
            .arg(&n.fence)
            .arg(&n.queue)
            .arg(&n.leases)
            .arg(&n.since);
        cmd.arg(self.token).arg(self.ttl_ms).arg(self.fence_mode);
        cmd.arg(self.place.id)
            .arg(self.place.score)
            .arg(self.place.lease_ms);
        cmd.arg(self.bound_ms)
            .arg(self.wake_prefix)
            .arg(self.grace_ms)
            .arg(flag(self.quiet))
            .arg(flag(sharded));
        cmd
    }
}

/// `acquire_reentrant.lua`.
pub(crate) struct AcquireReentrant<'a> {
    pub key: &'a str,
    pub names: &'a KeyNames,
    pub ttl_ms: u64,
    /// The hash field `"<client uuid>:<owner id>"`.
    pub field: &'a str,
    pub fence_mode: &'a str,
    pub place: Place<'a>,
    /// A re-entry only: never a new grant.
    pub reentry: bool,
    pub bound_ms: u64,
    /// This hold's id, new to this call (see `hold_key`).
    pub hold: &'a str,
}

impl AcquireReentrant<'_> {
    pub fn invocation(&self) -> ScriptInvocation<'static> {
        let mut inv = ACQUIRE_REENTRANT.prepare_invoke();
        inv.key(self.key);
        self.names.add_to(&mut inv);
        inv.key(super::hold_key(self.key, self.hold));
        inv.arg(self.ttl_ms).arg(self.field).arg(self.fence_mode);
        inv.arg(self.place.id)
            .arg(self.place.score)
            .arg(self.place.lease_ms);
        inv.arg(flag(self.reentry)).arg(self.bound_ms);
        inv
    }
}

/// What makes a request that is not idempotent by itself (a decrement, an increment) safe to
/// run twice: the script keeps its reply in `ferrolock:latch:{key}:<id>` for `px_ms`, and a
/// re-send of the same call (the same id: redis-rs re-sends the same bytes on a cluster, and
/// `Node` the same command on a standalone node) finds it there instead of running again.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct Latch<'a> {
    /// Unique per call, the same on every re-send of it.
    pub id: &'a str,
    pub px_ms: u64,
}

impl Latch<'_> {
    fn name(&self, key: &str) -> String {
        super::latch_key(key, self.id)
    }
}

/// `raise_fence.lua`.
pub(crate) struct RaiseFence<'a> {
    pub key: &'a str,
    pub fence_key: &'a str,
    /// The token (plain) or the hash field (reentrant).
    pub token: &'a str,
    pub fence: u64,
    pub reentrant: bool,
}

impl RaiseFence<'_> {
    pub fn invocation(&self) -> ScriptInvocation<'static> {
        let mut inv = RAISE_FENCE.prepare_invoke();
        inv.key(self.key).key(self.fence_key);
        inv.arg(self.token)
            .arg(self.fence)
            .arg(flag(self.reentrant));
        inv
    }
}

/// `undo.lua`.
#[doc(hidden)]
pub struct Undo<'a> {
    pub key: &'a str,
    pub names: &'a KeyNames,
    pub token: &'a str,
    pub reentrant: bool,
    /// Redisson's channel (reentrant) or the prefix of the waiters' own channels (plain).
    pub channel: &'a str,
    /// Where to put our waiter id back; an empty id: compare-and-delete only.
    pub place: Place<'a>,
    pub bound_ms: u64,
    /// Its latch: a re-send answers as the first run and changes nothing (no second decrement,
    /// no second re-enqueue).
    pub latch: Latch<'a>,
    /// Reentrant: the attempt's hold id (see `hold_key`): the count is taken only with it.
    pub hold: &'a str,
}

impl Undo<'_> {
    pub fn invocation(&self, sharded: bool) -> ScriptInvocation<'static> {
        let mut inv = UNDO.prepare_invoke();
        inv.key(self.key);
        self.names.add_to(&mut inv);
        inv.key(self.latch.name(self.key));
        inv.arg(self.token)
            .arg(flag(self.reentrant))
            .arg(self.channel);
        inv.arg(self.place.id)
            .arg(self.place.score)
            .arg(self.place.lease_ms)
            .arg(self.bound_ms)
            .arg(flag(sharded))
            .arg(self.latch.px_ms);
        if self.reentrant {
            inv.key(super::hold_key(self.key, self.hold));
        }
        inv
    }
}

/// `dequeue.lua`: owns its names, as it goes to a task.
pub(crate) struct Dequeue<'a> {
    pub key: &'a str,
    pub names: KeyNames,
    pub id: &'a str,
    /// The prefix of the waiters' own channels; '' (a counted lock): see `broadcast`.
    pub wake_prefix: String,
    /// A counted lock's channel, where all its waiters listen ('' for a plain lock).
    pub broadcast: &'a str,
}

impl<'a> Dequeue<'a> {
    /// Takes waiter `id` out of `key`'s queue, whose release channel is `channel`; if the lock
    /// is free, the next head is told: a plain lock's on its own channel, a counted lock's on
    /// `channel`, where they all listen.
    pub fn new(key: &'a str, id: &'a str, channel: &'a str) -> Dequeue<'a> {
        let plain = channel == super::release_channel(key);
        Dequeue {
            key,
            names: KeyNames::of(key),
            id,
            wake_prefix: if plain {
                super::waiter_channel_prefix(key)
            } else {
                String::new()
            },
            broadcast: if plain { "" } else { channel },
        }
    }

    pub fn invocation(&self, sharded: bool) -> ScriptInvocation<'static> {
        let mut inv = DEQUEUE.prepare_invoke();
        inv.key(self.key);
        self.names.add_to(&mut inv);
        inv.arg(self.id)
            .arg(&self.wake_prefix)
            .arg(flag(sharded))
            .arg(self.broadcast);
        inv
    }
}

/// `release.lua` (plain lock). Its names are written straight into the command (`Tagged`):
/// the release is on the hot path.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct Release<'a> {
    pub key: &'a str,
    pub token: &'a str,
    /// Contention seen lately: the release may be quiet (`quiet_bound_ms`).
    pub contended: bool,
    /// With `contended`: the head's barging bound within which the release is quiet; 0:
    /// never quiet.
    pub quiet_bound_ms: u64,
    /// How long the release's latch (`ferrolock:latch:{key}:<token>`) lives: a re-send of a
    /// release that ran finds it, where the key alone would say "not ours".
    pub latch_px_ms: u64,
}

impl Release<'_> {
    /// Sends `cmd` (from `command`), loading the script on NOSCRIPT.
    pub(crate) async fn send(cmd: &Cmd, conn: &mut Conn) -> RedisResult<i64> {
        run_script(&RELEASE, cmd, conn).await
    }

    /// Sized up front: built without regrowing its buffers. `sharded`: SPUBLISH (a Redis
    /// Cluster with sharded pub/sub).
    pub fn command(&self, sharded: bool) -> Cmd {
        let (key, token) = (self.key, self.token);
        let (queue, prefix) = (Tagged::queue(key), Tagged::waiter_channel_prefix(key));
        let (leases, since) = (Tagged::queue_leases(key), Tagged::queue_since(key));
        let latch = Tagged::latch(key, token);
        // Every queue key, contended or not: the script drops the waiters whose lease ended
        // before it tells the first one. A holder that saw no contention lately (its first
        // attempt a plain SET NX, or its hold longer than the contention memory) told a
        // crashed head, and the live waiter behind it slept on its timer.
        let names = queue.len() + prefix.len() + latch.len() + leases.len() + since.len() + 40;
        let mut cmd = evalsha(&RELEASE, 5, 10, key.len() + names + token.len() + 21);
        cmd.arg(key).arg(queue).arg(leases).arg(since).arg(latch);
        cmd.arg(token)
            .arg(prefix)
            .arg(flag(sharded))
            .arg(self.latch_px_ms)
            .arg(if self.contended {
                self.quiet_bound_ms
            } else {
                0
            });
        cmd
    }
}

/// `release_reentrant.lua` (Redisson's unlock).
pub(crate) struct ReleaseReentrant<'a> {
    pub key: &'a str,
    pub field: &'a str,
    pub ttl_ms: u64,
    /// Redisson's channel.
    pub channel: &'a str,
    /// Its reply, kept for a re-send.
    pub latch: Latch<'a>,
    /// The hold's id (see `hold_key`): its decrement runs once, and only where it was granted.
    pub hold: &'a str,
}

impl ReleaseReentrant<'_> {
    pub fn invocation(&self, sharded: bool) -> ScriptInvocation<'static> {
        let mut inv = RELEASE_REENTRANT.prepare_invoke();
        inv.key(self.key)
            .key(self.latch.name(self.key))
            .key(super::hold_key(self.key, self.hold))
            .arg(self.field)
            .arg(self.ttl_ms)
            .arg(self.channel)
            .arg(flag(sharded))
            .arg(self.latch.px_ms);
        inv
    }
}

/// How a hold is renewed (the watchdog's batch and `extend`).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// `extend.lua`: compare-and-raise on the token (the expiry never drops).
    Plain,
    /// `extend_reentrant.lua` (Redisson's renewal) on the owner's field.
    Field,
    /// `extend_reentrant.lua` on the writer's field `"<field>:write"`.
    Writer,
    /// `extend_read.lua`: the reader's hold keys, the hash only upward.
    Read,
    /// `semaphore_extend.lua`: the holder's permit ids (the token, hex) in `{name}:timeout`.
    Permits,
}

/// A renewal (`Renewal` says which script).
#[doc(hidden)]
pub struct Extend<'a> {
    pub key: &'a str,
    /// The token (plain) or the owner's hash field.
    pub token: &'a str,
    pub ttl_ms: u64,
    pub renewal: Renewal,
    /// A counted hold's id (see `hold_key`): its mark is renewed with it. Empty otherwise.
    pub hold: &'a str,
}

impl Extend<'_> {
    fn script(&self) -> &'static redis::Script {
        match self.renewal {
            Renewal::Plain => &EXTEND,
            Renewal::Field | Renewal::Writer => &EXTEND_REENTRANT,
            Renewal::Read => &EXTEND_READ,
            Renewal::Permits => &SEMAPHORE_EXTEND,
        }
    }

    /// KEYS and ARGV after the script: (keys, args).
    fn parts(&self) -> (Vec<String>, Vec<Vec<u8>>) {
        let (key, token) = (self.key.to_string(), self.token.to_string());
        let ttl = self.ttl_ms.to_string();
        let hold = || super::hold_key(self.key, self.hold);
        let (keys, args) = match self.renewal {
            Renewal::Plain => (vec![key], vec![token, ttl]),
            Renewal::Field => {
                let holds = super::holds_key(self.key, self.token);
                (vec![key, hold(), holds], vec![token, ttl])
            }
            Renewal::Writer => {
                let field = writer_field(self.token);
                let holds = super::holds_key(self.key, &field);
                (vec![key, hold(), holds], vec![field, ttl])
            }
            Renewal::Read => (
                vec![
                    key,
                    super::rwlock_timeout_prefix(self.key, self.token),
                    hold(),
                    super::holds_key(self.key, self.token),
                ],
                vec![token, ttl],
            ),
            Renewal::Permits => {
                let mut args = vec![ttl.into_bytes()];
                args.extend(permit_ids(self.token));
                return (vec![super::semaphore_timeout_key(self.key)], args);
            }
        };
        (keys, args.into_iter().map(String::into_bytes).collect())
    }

    pub fn invocation(&self) -> ScriptInvocation<'static> {
        let mut inv = self.script().prepare_invoke();
        let (keys, args) = self.parts();
        for k in keys {
            inv.key(k);
        }
        for a in args {
            inv.arg(a);
        }
        inv
    }

    /// Loads the renewal scripts `renewals` use: a restarted node forgot them, and a
    /// pipeline of `add_to` cannot load them itself.
    pub(crate) async fn load(
        conn: &mut Conn,
        renewals: impl Iterator<Item = Renewal>,
    ) -> RedisResult<()> {
        let (mut field, mut read, mut permits) = (false, false, false);
        for r in renewals {
            field |= matches!(r, Renewal::Field | Renewal::Writer);
            read |= r == Renewal::Read;
            permits |= r == Renewal::Permits;
        }
        let _: String = EXTEND.load_async(conn).await?;
        if field {
            let _: String = EXTEND_REENTRANT.load_async(conn).await?;
        }
        if read {
            let _: String = EXTEND_READ.load_async(conn).await?;
        }
        if permits {
            let _: String = SEMAPHORE_EXTEND.load_async(conn).await?;
        }
        Ok(())
    }

    /// As one `EVALSHA` of a pipeline (the watchdog's batch; its caller loads the script
    /// on NOSCRIPT).
    pub(crate) fn add_to(&self, pipe: &mut Pipeline) {
        let (keys, args) = self.parts();
        pipe.cmd("EVALSHA")
            .arg(self.script().get_hash())
            .arg(keys.len())
            .arg(keys)
            .arg(args);
    }
}

/// `acquire_read.lua`: a read hold, granted past no writer queued ahead of it.
#[doc(hidden)]
#[derive(Debug)]
pub struct AcquireRead<'a> {
    pub key: &'a str,
    pub names: &'a KeyNames,
    pub ttl_ms: u64,
    /// The reader's field `"<client uuid>:<owner id>"`.
    pub field: &'a str,
    /// Our waiter id starts with `r` (`queue::Role::Reader`).
    pub place: Place<'a>,
    /// A re-entry only (our read or write hold is live): never a fresh grant.
    pub reentry: bool,
    pub bound_ms: u64,
    /// This hold's id, new to this call (see `hold_key`): every grant adds a hold, and a
    /// re-send finds its mark.
    pub hold: &'a str,
    /// A grant keeps our place in the queue: this process has more readers waiting.
    pub keep_place: bool,
}

impl AcquireRead<'_> {
    pub fn invocation(&self) -> ScriptInvocation<'static> {
        let mut inv = ACQUIRE_READ.prepare_invoke();
        inv.key(self.key);
        self.names.add_to(&mut inv);
        inv.key(super::rwlock_timeout_prefix(self.key, self.field))
            .key(super::hold_key(self.key, self.hold));
        // ARGV[3] is the fence mode's place: readers get no fence.
        inv.arg(self.ttl_ms).arg(self.field).arg("");
        inv.arg(self.place.id)
            .arg(self.place.score)
            .arg(self.place.lease_ms);
        inv.arg(flag(self.reentry))
            .arg(self.bound_ms)
            .arg(flag(self.keep_place));
        inv
    }
}

/// `acquire_write.lua`: the write hold, on the key free (or our own, a re-entry); refused with
/// `RWLOCK_UPGRADE` while this owner reads.
#[doc(hidden)]
#[derive(Debug)]
pub struct AcquireWrite<'a> {
    pub key: &'a str,
    pub names: &'a KeyNames,
    pub ttl_ms: u64,
    /// The owner's field `"<client uuid>:<owner id>"`; the writer's is `"<field>:write"`.
    pub field: &'a str,
    pub fence_mode: &'a str,
    /// Our waiter id starts with `w` (`queue::Role::Writer`).
    pub place: Place<'a>,
    pub reentry: bool,
    pub bound_ms: u64,
    /// This hold's id, new to this call (see `hold_key`).
    pub hold: &'a str,
}

impl AcquireWrite<'_> {
    pub fn invocation(&self) -> ScriptInvocation<'static> {
        let mut inv = ACQUIRE_WRITE.prepare_invoke();
        inv.key(self.key);
        self.names.add_to(&mut inv);
        inv.key(super::hold_key(self.key, self.hold));
        inv.arg(self.ttl_ms)
            .arg(writer_field(self.field))
            .arg(self.fence_mode);
        inv.arg(self.place.id)
            .arg(self.place.score)
            .arg(self.place.lease_ms);
        // ARGV[9] unused.
        inv.arg(flag(self.reentry))
            .arg(self.bound_ms)
            .arg("")
            .arg(self.field);
        inv
    }
}

/// `release_read.lua`: one read hold fewer; the last one out frees the key and publishes `0`.
#[doc(hidden)]
#[derive(Debug)]
pub struct ReleaseRead<'a> {
    pub key: &'a str,
    pub field: &'a str,
    pub latch: Latch<'a>,
    /// The hold's id (see `hold_key`).
    pub hold: &'a str,
}

impl ReleaseRead<'_> {
    pub fn invocation(&self, sharded: bool) -> ScriptInvocation<'static> {
        let mut inv = RELEASE_READ.prepare_invoke();
        inv.key(self.key)
            .key(self.latch.name(self.key))
            .key(super::rwlock_timeout_prefix(self.key, self.field))
            .key(super::rwlock_prefix(self.key))
            .key(super::hold_key(self.key, self.hold));
        inv.arg(self.field)
            .arg("")
            .arg(super::rwlock_channel(self.key))
            .arg(flag(sharded))
            .arg(self.latch.px_ms);
        inv
    }
}

/// `release_write.lua`: one write hold fewer; the last one publishes `1` (every waiter looks).
#[doc(hidden)]
#[derive(Debug)]
pub struct ReleaseWrite<'a> {
    pub key: &'a str,
    /// The owner's field; the script gets the writer's, `"<field>:write"`.
    pub field: &'a str,
    pub latch: Latch<'a>,
    /// The hold's id (see `hold_key`).
    pub hold: &'a str,
}

impl ReleaseWrite<'_> {
    pub fn invocation(&self, sharded: bool) -> ScriptInvocation<'static> {
        let mut inv = RELEASE_WRITE.prepare_invoke();
        inv.key(self.key)
            .key(self.latch.name(self.key))
            .key(super::hold_key(self.key, self.hold))
            .key(super::rwlock_prefix(self.key));
        inv.arg(writer_field(self.field))
            .arg("")
            .arg(super::rwlock_channel(self.key))
            .arg(flag(sharded))
            .arg(self.latch.px_ms);
        inv
    }
}

/// A semaphore holder's permit ids: its token is their 16 raw bytes each, in hex (a token is
/// text everywhere else; Redisson's ids are raw bytes).
pub(crate) fn permit_ids(token: &str) -> Vec<Vec<u8>> {
    token
        .as_bytes()
        .chunks(32)
        .map(|id| {
            id.chunks(2)
                .map(|b| {
                    u8::from_str_radix(std::str::from_utf8(b).unwrap_or("00"), 16).unwrap_or(0)
                })
                .collect()
        })
        .collect()
}

/// `semaphore_acquire.lua`: `count` permits of a pool of `permits` with a lease.
pub(crate) struct SemaphoreAcquire<'a> {
    pub name: &'a str,
    pub permits: u32,
    pub count: u32,
    pub lease_ms: u64,
    /// The fresh ids, 16 raw bytes each, in hex (the handle's token).
    pub ids: &'a str,
    /// A grant takes permits: it runs once.
    pub latch: Latch<'a>,
    /// The waiter's queue place (its score unused: one node, arrival order); an empty id: a
    /// first try, not queued.
    pub place: Place<'a>,
    pub bound_ms: u64,
    /// A refusal on permits free for the queue head publishes them (the head may be asleep):
    /// off for an attempt that a publish woke, which woke the head too.
    pub wake: bool,
}

impl SemaphoreAcquire<'_> {
    /// `sharded`: the node is a Redis Cluster with sharded pub/sub (a reclaim SPUBLISHes).
    pub fn invocation(&self, sharded: bool) -> ScriptInvocation<'static> {
        let mut inv = SEMAPHORE_ACQUIRE.prepare_invoke();
        inv.key(self.name)
            .key(super::semaphore_timeout_key(self.name))
            .key(queue_key(self.name))
            .key(queue_lease_key(self.name))
            .key(queue_since_key(self.name))
            .key(self.latch.name(self.name));
        inv.arg(self.permits)
            .arg(self.count)
            .arg(self.lease_ms)
            .arg(super::semaphore_channel(self.name))
            .arg(self.latch.px_ms)
            .arg(self.place.id)
            .arg(self.place.lease_ms)
            .arg(self.bound_ms)
            .arg(flag(sharded))
            .arg(flag(self.wake));
        for id in permit_ids(self.ids) {
            inv.arg(id);
        }
        inv
    }
}

/// `semaphore_release.lua`: this holder's ids back to the pool, once.
pub(crate) struct SemaphoreRelease<'a> {
    pub name: &'a str,
    pub ids: &'a str,
    pub latch: Latch<'a>,
}

impl SemaphoreRelease<'_> {
    /// `sharded`: the node is a Redis Cluster with sharded pub/sub (the release SPUBLISHes).
    pub fn invocation(&self, sharded: bool) -> ScriptInvocation<'static> {
        let mut inv = SEMAPHORE_RELEASE.prepare_invoke();
        inv.key(self.name)
            .key(super::semaphore_timeout_key(self.name))
            .key(self.latch.name(self.name));
        inv.arg(super::semaphore_channel(self.name))
            .arg(self.latch.px_ms)
            .arg(flag(sharded));
        for id in permit_ids(self.ids) {
            inv.arg(id);
        }
        inv
    }
}

/// The writer's field of an owner: Redisson's `"<field>:write"`.
pub fn writer_field(field: &str) -> String {
    format!("{field}:write")
}

fn flag(on: bool) -> &'static str {
    if on { "1" } else { "0" }
}
