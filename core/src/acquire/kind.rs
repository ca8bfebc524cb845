//! What a kind of hold tells the machinery every kind shares (plan, attempt, undo, late undo):
//! how its holder is named, which channel its release publishes on, and whether a hold is
//! counted per owner. Every kind's acquire script answers in one shape (`reply::parse_reply`:
//! nil or `{fence}` granted, an integer busy with its re-check hint), and its undo is
//! `undo.lua` in the kind's mode; renewal is the watchdog's `Extend` in the same mode.

use crate::options::{LockOptions, RwSide};
use crate::queue::Role;
use crate::scripts::{
    Renewal, redisson_channel, rwlock_channel, semaphore_channel, waiter_channel_prefix,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A token at a string key: `SET NX` or `acquire.lua`, undone by compare-and-delete.
    Plain,
    /// Redisson's `RLock` hash: a field per owner holding its hold count.
    Reentrant,
    /// Redisson's `RReadWriteLock` hash, a reader's field and one hold key per hold.
    Read,
    /// The same hash, the writer's field `"<field>:write"`.
    Write,
    /// Redisson's `RPermitExpirableSemaphore`: the holder's permit ids in `{name}:timeout`
    /// (acquired by `semaphore.rs`, released and renewed here).
    Permits,
}

impl Kind {
    pub fn of(opts: &LockOptions) -> Kind {
        if opts.permits.is_some() {
            return Kind::Permits;
        }
        match opts.rw {
            Some(RwSide::Read) => Kind::Read,
            Some(RwSide::Write) => Kind::Write,
            None if opts.reentrant => Kind::Reentrant,
            None => Kind::Plain,
        }
    }

    /// The metrics' `kind` label: a reentrant lock is a lock (one kind per public handle).
    pub fn metric_label(self) -> &'static str {
        match self {
            Kind::Plain | Kind::Reentrant => crate::metrics::LOCK_KIND,
            Kind::Read => "read",
            Kind::Write => "write",
            Kind::Permits => "semaphore",
        }
    }

    /// What messages call the key: a semaphore's name is not a lock's.
    pub fn noun(self) -> &'static str {
        match self {
            Kind::Permits => "semaphore",
            _ => "lock",
        }
    }

    /// Held per owner with a hold count: an owner re-enters, and a decrement (acquire's undo,
    /// a release) runs once under a latch (see `scripts::Latch`).
    pub fn counted(self) -> bool {
        !matches!(self, Kind::Plain | Kind::Permits)
    }

    /// Where an undo publishes a release: Redisson's channel, or the prefix of the plain
    /// lock's waiters' own channels.
    pub fn undo_channel(self, key: &str) -> String {
        match self {
            Kind::Plain => waiter_channel_prefix(key),
            Kind::Reentrant => redisson_channel(key),
            Kind::Read | Kind::Write => rwlock_channel(key),
            Kind::Permits => semaphore_channel(key),
        }
    }

    /// The release channel that names the key's local waiter queue.
    pub fn queue_channel(self, key: &str) -> String {
        match self {
            Kind::Read | Kind::Write => rwlock_channel(key),
            Kind::Permits => semaphore_channel(key),
            _ => crate::queue::queue_channel(key, self.counted()),
        }
    }

    /// Who waits in the kind's local queue on that channel: a read-write lock's readers and
    /// writers queue apart, each with a server id the scripts tell apart.
    pub fn queue_role(self) -> Role {
        match self {
            Kind::Read => Role::Reader,
            Kind::Write => Role::Writer,
            _ => Role::Any,
        }
    }

    /// What errors call it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Plain => "lock",
            Kind::Reentrant => "reentrant lock",
            Kind::Read => "read lock",
            Kind::Write => "write lock",
            Kind::Permits => "semaphore",
        }
    }

    /// How a hold of this kind is renewed.
    /// Whether its renewals wait out the restart guard, as grants do. A lock's renewal finds
    /// our token or does nothing (it grants nothing a restarted node forgot), so it is sent
    /// to a guarded node too: held back, every lock on a young node was lost as soon as a
    /// longer ttl widened the default window. A semaphore's holders are told instead (see
    /// DESIGN.md, "Semaphore": a restart cannot tell which permits it forgot).
    pub fn renewal_waits_for_the_guard(self) -> bool {
        matches!(self, Kind::Permits)
    }

    pub fn renewal(self) -> Renewal {
        match self {
            Kind::Plain => Renewal::Plain,
            Kind::Reentrant => Renewal::Field,
            Kind::Read => Renewal::Read,
            Kind::Write => Renewal::Writer,
            Kind::Permits => Renewal::Permits,
        }
    }
}
