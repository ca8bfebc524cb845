//! The local half of the waiter queue, and the push wake-ups that drive it.
//!
//! Design (see DESIGN.md, "Waiters"):
//! - A waiter whose first attempt failed joins its key's local queue, named by the key's
//!   release channel (`queue_channel`). The queue subscribes, on every node, to what tells it
//!   that the lock may be free: for a plain lock, this process's own waiter channel
//!   (`waiter_channel(key, id)`), on which the scripts tell only the head of the server queue;
//!   for a reentrant lock, Redisson's channel. A read-write lock's readers and writers queue
//!   apart (`Role`: each queue has its own server id) on one shared subscription, dropped
//!   when the last queue on it leaves. The first waiter subscribes over ONE pub/sub
//!   connection per node per manager, run by one task per node; the last one to leave
//!   unsubscribes (after `LINGER` when it left with the lock).
//! - Only the head of a local queue talks to Redis: it attempts when the channel's epoch moves
//!   on a node that counts (a message on it, or a (re)subscription confirmed), at the PTTL the
//!   busy reply returned, or after the jittered `retry_delay` (holders that do not publish). So
//!   waiters on one key in one manager make ONE attempt per wake-up between them, and the
//!   others sleep without timers until it is their turn.
//! - Epochs are per node. After a failed attempt only the nodes that did not grant it count:
//!   a node that granted was undone by the attempt itself, and its undo's publish (which may
//!   wake this very waiter) says nothing about the holder the attempt lost to. A node that had
//!   not answered when the attempt was decided counts once it refuses (`WakeSources`).
//! - The subscription is confirmed before the re-check: a new head waits for the epoch bump of
//!   the confirmation, and every resubscription after a reconnect bumps the epoch again. A
//!   release between a failed attempt and the subscription is therefore never missed.
//! - The head reads the epochs before each attempt, so a publish that lands while its attempt
//!   is in flight (on a node that did not grant it) makes it attempt once more instead of
//!   sleeping through it.
//! - When the head leaves with the lock, the next waiter becomes head and waits for the next
//!   wake-up (the lock is ours now: attempting would be wasted), or until that lock lapses
//!   (which publishes nothing). When the head leaves without it
//!   (cancelled, out of time, error), the next one attempts at once: the wake-up the leaver may
//!   have consumed is not lost.
//! - Dropping a waiting future drops its `Ticket`: it leaves the queue, hands the turn on, and
//!   the last one out unsubscribes and takes this process's entry out of the server queue,
//!   trying again where a migrating slot refused it, until the entry's lease ends.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use futures::future::BoxFuture;
use redis::aio::PubSubStream;
use tokio::sync::{mpsc, watch};

use crate::cluster::Cluster;
use crate::node::{NodeError, Pubsub};
use crate::options::LockOptions;
use crate::per_process::PerProcess;
use crate::scripts::{Dequeue, Place, release_channel, waiter_channel};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
pub(super) const OP_TIMEOUT: Duration = Duration::from_secs(2);
const MIN_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// A pub/sub connection with no channel to listen to is closed after this long.
pub(super) const IDLE_CLOSE: Duration = Duration::from_secs(30);
/// After its last waiter leaves with the lock, a key's queue stays subscribed this long (up
/// to twice as long), so a process that waits on the key again soon (a worker in a loop)
/// neither unsubscribes and resubscribes nor waits for a confirmation each time.
pub(super) const LINGER: Duration = Duration::from_secs(1);
/// A waiter's lease in the server queue is never shorter than this.
const MIN_LEASE: Duration = Duration::from_millis(250);

/// A test hook: given the key, returns a future the acquire awaits.
pub type Hook = Arc<dyn Fn(&str) -> BoxFuture<'static, ()> + Send + Sync>;

pub(crate) struct Waiters {
    pub(super) cluster: Arc<Cluster>,
    nodes: usize,
    /// The manager's default node timeout: what a dequeue waits for each node.
    node_timeout: Duration,
    state: PerProcess<Mutex<State>>,
    /// Test hook run between a failed first attempt and joining the queue (subscribing).
    pub hook: Mutex<Option<Hook>>,
    /// Test hooks inside an attempt (see acquire/); looked at only once `hooked` is set.
    attempt_hooks: Mutex<AttemptHooks>,
    hooked: AtomicBool,
}

/// Test hooks inside an attempt.
#[derive(Default)]
pub(crate) struct AttemptHooks {
    /// A lost attempt's answers are in; its undo and its report have not happened yet.
    pub lost: Option<Hook>,
    /// A won attempt run as a task has sent its outcome to its (blocking) caller.
    pub won_reported: Option<Hook>,
}

struct State {
    queues: HashMap<(String, Role), Arc<KeyQueue>>,
    /// The same queues, by what they are subscribed to: a read-write lock's readers and
    /// writers share its channel, so one subscription may drive several queues.
    by_subscription: HashMap<String, Vec<Arc<KeyQueue>>>,
    /// Per node: wakes its subscriber task to reconcile its subscriptions.
    signals: Vec<Option<mpsc::UnboundedSender<()>>>,
    next_ticket: u64,
}

/// Who waits in one local queue: every waiter on a lock's channel, or the readers or the
/// writers of a read-write lock. Readers and writers queue apart, as each carries its own
/// server waiter id, whose first letter tells the scripts which it is (`acquire_read.lua`:
/// a reader is not granted past a writer queued ahead of it).
/// A semaphore's waiters queue apart by the number of permits they ask for
/// (`Permits(count)`): `semaphore_acquire.lua` reads each waiter's count from its id, so that a
/// waiter is let in only when the permits free cover its own count and those of every waiter
/// ahead of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Role {
    Any,
    Reader,
    Writer,
    Permits(u32),
}

impl Role {
    /// What starts our server waiter id: `s<count>-` for a semaphore's (read by
    /// `semaphore_acquire.lua`; any other id counts as one permit).
    fn id_prefix(self) -> String {
        match self {
            Role::Any => String::new(),
            Role::Reader => "r".into(),
            Role::Writer => "w".into(),
            Role::Permits(count) => format!("s{count}-"),
        }
    }
}

/// The waiters of one channel (one key, one lock kind) and role in this manager.
pub(crate) struct KeyQueue {
    /// The process whose queue this is.
    pid: u32,
    key: String,
    /// The key's release channel: with the role, the local queue's name.
    channel: String,
    role: Role,
    /// What this process subscribes to for it: its own `waiter_channel` (plain locks), or
    /// Redisson's channel (reentrant locks).
    subscription: String,
    /// This process's waiter id in the server-side queue of the key.
    server_id: String,
    /// Shared with the attempts that carry our place (`QueueArgs`).
    flags: Arc<PlaceFlags>,
    /// Per node: moves on every message on the channel there and every confirmed
    /// (re)subscription there.
    epoch: watch::Sender<Epochs>,
    q: Mutex<Q>,
}

struct Q {
    /// Head first.
    waiters: VecDeque<(u64, watch::Sender<Option<Turn>>)>,
    /// Per node: subscription requested, neither confirmed nor failed yet.
    pending: Vec<bool>,
    /// The queue score with N nodes (our clock, µs): set at our first queued attempt and again
    /// after each grant, so that a process that just got the lock goes to the back.
    score: Option<String>,
    /// The server queue may still hold our id: take it out when the last waiter leaves.
    dirty: bool,
    /// When the lease our last queued attempt asked for ends: a dequeue refused by a
    /// migrating slot is tried again until then (after it, the id is pruned anyway).
    lease_end: Option<std::time::Instant>,
    /// No waiters, still subscribed until then (see `LINGER`).
    lingering_until: Option<std::time::Instant>,
}

/// The wake-up count of each node's pub/sub connection for one channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Epochs(Vec<u64>);

impl Epochs {
    /// Whether any node marked in `from` has moved since `seen`.
    fn moved_since(&self, seen: &Epochs, from: &[bool]) -> bool {
        self.0
            .iter()
            .zip(&seen.0)
            .zip(from)
            .any(|((now, then), &counts)| counts && now != then)
    }
}

/// The nodes whose wake-ups count for a waiting head. After a lost attempt, a node that
/// granted it does not: the attempt's own undo publishes there (Redisson's channel for a
/// reentrant key, heard by every waiter), which says nothing of the holder and, counted,
/// would start the next attempt at once, in a loop. A node that had not answered when the
/// attempt was decided is unknown: it starts to count when its late answer is in and is not
/// a grant (`late`, sent by the task that undoes late grants); a late grant's undo publishes,
/// so that node never counts.
pub(crate) struct WakeSources {
    now: Vec<bool>,
    late: Option<watch::Receiver<Vec<bool>>>,
}

impl WakeSources {
    /// Every node counts (a new head: no attempt of its own has seen the lock since).
    pub fn all(nodes: usize) -> Self {
        Self::fixed(vec![true; nodes])
    }

    pub fn fixed(now: Vec<bool>) -> Self {
        WakeSources { now, late: None }
    }

    /// Starts as `late`'s value, and follows it until its sender is gone.
    pub fn settling(late: watch::Receiver<Vec<bool>>) -> Self {
        let now = late.borrow().clone();
        WakeSources {
            now,
            late: Some(late),
        }
    }

    fn with<T>(&mut self, f: impl FnOnce(&[bool]) -> T) -> T {
        match self.late.as_mut() {
            Some(rx) => f(&rx.borrow_and_update()),
            None => f(&self.now),
        }
    }

    /// Resolves when the nodes that count may have changed; never once they are settled.
    async fn changed(&mut self) {
        let Some(rx) = self.late.as_mut() else {
            return std::future::pending().await;
        };
        if rx.changed().await.is_err() {
            // Every late answer is in: keep the last value.
            self.now = rx.borrow().clone();
            self.late = None;
        }
    }
}

/// The turn handed to a waiter that becomes the head of its local queue.
#[derive(Debug, Clone)]
pub(crate) struct Turn {
    /// Attempt at once (the previous head left without the lock), instead of waiting for the
    /// next wake-up.
    pub attempt_now: bool,
    /// The epochs when the turn was handed over: a wake-up is a later epoch on any node.
    pub seen: Epochs,
    /// When the lock the previous head got lapses unless released or renewed: a lock that
    /// lapses publishes nothing, so the new head re-checks then.
    pub lapses: Option<tokio::time::Instant>,
}

impl KeyQueue {
    fn q(&self) -> MutexGuard<'_, Q> {
        self.q.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A wake-up from `node`, or from every node (`None`: a local release, or the first
    /// subscription confirmed everywhere: a re-check is due whatever the last attempt saw).
    fn bump(&self, node: Option<usize>) {
        self.epoch.send_modify(|e| match node {
            Some(i) => {
                if let Some(n) = e.0.get_mut(i) {
                    *n = n.wrapping_add(1);
                }
            }
            None => e.0.iter_mut().for_each(|n| *n = n.wrapping_add(1)),
        });
    }

    fn epochs(&self) -> Epochs {
        self.epoch.borrow().clone()
    }
}

impl Waiters {
    pub fn new(cluster: Arc<Cluster>, node_timeout: Duration) -> Waiters {
        Waiters {
            nodes: cluster.nodes.len(),
            cluster,
            node_timeout,
            state: PerProcess::default(),
            hook: Mutex::new(None),
            attempt_hooks: Mutex::new(AttemptHooks::default()),
            hooked: AtomicBool::new(false),
        }
    }

    /// The attempt hook `which` picks, if a test set one.
    pub fn attempt_hook(&self, which: impl Fn(&AttemptHooks) -> &Option<Hook>) -> Option<Hook> {
        if !self.hooked.load(Ordering::Relaxed) {
            return None;
        }
        which(&self.attempt_hooks.lock().unwrap_or_else(|p| p.into_inner())).clone()
    }

    pub fn set_attempt_hooks(&self, change: impl FnOnce(&mut AttemptHooks)) {
        change(&mut self.attempt_hooks.lock().unwrap_or_else(|p| p.into_inner()));
        self.hooked.store(true, Ordering::SeqCst);
    }

    /// This process's queues: a forked child starts with none (the parent's tasks and
    /// connections lived on the parent's runtime, and their mutexes may be held for good).
    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .get_or_init(|| {
                Mutex::new(State {
                    queues: HashMap::new(),
                    by_subscription: HashMap::new(),
                    signals: (0..self.nodes).map(|_| None).collect(),
                    next_ticket: 0,
                })
            })
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Whether this manager has any local queue (waiting or lingering): cheap, so that an
    /// uncontended acquire builds no channel name.
    pub fn any(&self) -> bool {
        !self.state().queues.is_empty()
    }

    /// Whether the channel's queue is lingering (no waiters, still subscribed on every node):
    /// an acquire that may wait then joins before its first attempt, which then queues (and a
    /// plain lock's release will tell it, on its own channel).
    pub fn lingering(&self, channel: &str, role: Role) -> bool {
        let st = self.state();
        let Some(kq) = st.queues.get(&(channel.to_string(), role)) else {
            return false;
        };
        let q = kq.q();
        q.waiters.is_empty() && !q.pending.contains(&true)
    }

    /// Joins the local queue of `channel` and `role`. The first waiter subscribes the channel
    /// on every node (unless another role's queue has it already); its turn then comes with
    /// the confirmation (an epoch bump). On a lingering queue the subscription is already
    /// there: the turn says "attempt now" (a plain lock's waiter is told of releases only once
    /// its attempt has queued it).
    pub fn join(self: &Arc<Self>, key: &str, channel: &str, role: Role) -> Ticket {
        let mut st = self.state();
        let mut created = false;
        let kq = st
            .queues
            .entry((channel.to_string(), role))
            .or_insert_with(|| {
                created = true;
                let server_id = format!("{}{}", role.id_prefix(), crate::token::random_hex());
                // Plain locks: a channel of our own, told only when we are the queue head.
                let subscription = if channel == release_channel(key) {
                    waiter_channel(key, &server_id)
                } else {
                    channel.to_string()
                };
                Arc::new(KeyQueue {
                    pid: crate::runtime::pid(),
                    key: key.to_string(),
                    channel: channel.to_string(),
                    role,
                    subscription,
                    server_id,
                    flags: Arc::new(PlaceFlags {
                        waiting: AtomicBool::new(true),
                        stray: AtomicBool::new(false),
                        channel: channel.to_string(),
                    }),
                    epoch: watch::Sender::new(Epochs(vec![0; self.nodes])),
                    q: Mutex::new(Q {
                        waiters: VecDeque::new(),
                        pending: vec![true; self.nodes],
                        score: None,
                        dirty: false,
                        lease_end: None,
                        lingering_until: None,
                    }),
                })
            })
            .clone();
        if created {
            st.by_subscription
                .entry(kq.subscription.clone())
                .or_default()
                .push(kq.clone());
        }
        st.next_ticket += 1;
        let id = st.next_ticket;
        let (tx, rx) = watch::channel(None);
        {
            let mut q = kq.q();
            if q.waiters.is_empty() {
                let turn = if created {
                    Turn {
                        attempt_now: false,
                        seen: kq.epochs(),
                        lapses: None,
                    }
                } else {
                    // Lingering: subscribed already.
                    q.lingering_until = None;
                    kq.flags.waiting.store(true, Ordering::SeqCst);
                    Turn {
                        attempt_now: true,
                        seen: kq.epochs(),
                        lapses: None,
                    }
                };
                tx.send_replace(Some(turn));
            }
            q.waiters.push_back((id, tx));
        }
        // A new queue: the subscriber tasks look again. On a channel another role's queue
        // has subscribed already, they settle this one's confirmations at once
        // (`already_subscribed`).
        if created {
            for node in 0..self.nodes {
                if st.signals[node].as_ref().is_none_or(|s| s.is_closed()) {
                    let (tx, rx) = mpsc::unbounded_channel();
                    st.signals[node] = Some(tx);
                    self.cluster
                        .handle()
                        .spawn(subscriber(Arc::downgrade(self), node, rx));
                }
                if let Some(s) = &st.signals[node] {
                    let _ = s.send(());
                }
            }
        }
        Ticket {
            waiters: self.clone(),
            kq,
            id,
            turn: rx,
            granted: None,
            lapses: None,
            kept_place: false,
        }
    }

    fn leave(&self, ticket: &Ticket) -> bool {
        if ticket.kq.pid != crate::runtime::pid() {
            // A ticket inherited across fork: its queue is the parent's.
            return false;
        }
        let mut st = self.state();
        let kq = &ticket.kq;
        let mut q = kq.q();
        if let Some(pos) = q.waiters.iter().position(|(id, _)| *id == ticket.id) {
            q.waiters.remove(pos);
            if pos == 0
                && let Some((_, next)) = q.waiters.front()
            {
                // Readers share the key: the next one attempts at once whether or not the
                // one ahead got it.
                next.send_replace(Some(Turn {
                    attempt_now: ticket.granted.is_none() || kq.role == Role::Reader,
                    seen: kq.epochs(),
                    lapses: ticket.lapses,
                }));
            }
        }
        if let Some(everywhere) = ticket.granted {
            // Our entry was consumed by the grant: the next local waiter queues again, at the
            // back. With N nodes, nodes that did not grant may still hold it. A semaphore's
            // other waiters attempt beside the head, with the same id: one refused after this
            // grant queued it again, so it is gone only when nobody else here waits (taken for
            // gone, a waiter cancelled next left it first in line for a lease). A reader's grant
            // that kept the place keeps its score too: the readers behind attempt there.
            if !ticket.kept_place {
                q.score = None;
            }
            if everywhere && q.waiters.is_empty() {
                q.dirty = false;
            }
        }
        if !q.waiters.is_empty() {
            if ticket.granted.is_none() {
                // A waiter that leaves beside others without the grant (cancelled; a
                // semaphore's waiters attempt beside each other) may have had its last attempt
                // refused just after another's grant took our id out, and so queued it again;
                // that grant, taken here after this leave, would count it gone and linger,
                // leaving the id first in line for a lease (a try at a free pool was refused
                // meanwhile). The last one out takes it out instead.
                kq.flags.stray.store(true, Ordering::SeqCst);
            }
            return false;
        }
        // In this order, against `dequeue_if_abandoned`'s (stray, then waiting): one of the two
        // sees the other's flag, and takes the place out.
        kq.flags.waiting.store(false, Ordering::SeqCst);
        let cleanup = q.dirty || kq.flags.stray.load(Ordering::SeqCst);
        if ticket.granted.is_some() && !cleanup {
            // Left with the lock, nothing of ours in any server queue: stay subscribed a while
            // (the subscriber re-checks lingering queues every `LINGER`).
            q.lingering_until = Some(std::time::Instant::now() + LINGER);
            return false;
        }
        drop(q);
        let name = (kq.channel.clone(), kq.role);
        if st.queues.get(&name).is_some_and(|k| Arc::ptr_eq(k, kq)) {
            st.queues.remove(&name);
            // Unsubscribed only when the last queue on the channel is gone.
            if let Some(others) = st.by_subscription.get_mut(&kq.subscription) {
                others.retain(|k| !Arc::ptr_eq(k, kq));
                if others.is_empty() {
                    st.by_subscription.remove(&kq.subscription);
                }
            }
        }
        for s in st.signals.iter().flatten() {
            let _ = s.send(());
        }
        cleanup
    }

    /// This manager released a hold on the key of `channel`: its own waiters on the key (of
    /// every role) hear it here (the release only tells the server queue's head, and a waiter
    /// of ours that took over the turn locally from a waiter that got the lock is not queued
    /// on the server yet).
    pub fn released_locally(&self, channel: &str) {
        let kqs: Vec<Arc<KeyQueue>> = {
            let st = self.state();
            if st.queues.is_empty() {
                return;
            }
            // Every role's queue on the channel (a semaphore's, one per count asked for).
            st.queues
                .iter()
                .filter(|((c, _), _)| c == channel)
                .map(|(_, kq)| kq.clone())
                .collect()
        };
        for kq in kqs {
            if !kq.q().waiters.is_empty() {
                kq.bump(None);
            }
        }
    }

    /// The channels to be subscribed to: those with waiters or lingering. Drops the queues
    /// whose linger is over.
    pub(super) fn wanted(&self) -> HashSet<String> {
        let now = std::time::Instant::now();
        let mut st = self.state();
        let over = |kq: &Arc<KeyQueue>| {
            let q = kq.q();
            q.waiters.is_empty() && q.lingering_until.is_some_and(|until| until <= now)
        };
        st.queues.retain(|_, kq| !over(kq));
        st.by_subscription.retain(|_, kqs| {
            kqs.retain(|kq| !over(kq));
            !kqs.is_empty()
        });
        st.by_subscription.keys().cloned().collect()
    }

    /// A message on one of our subscriptions: the lock may be free (our own channel: `0`
    /// released, `q` the turn passed to us on a free lock, `?` a waiter ahead left; Redisson's
    /// channel: `0` released) on `node`. Every message wakes the head of the local queue,
    /// unless that node granted the head's last attempt.
    pub(super) fn wake(&self, node: usize, subscription: &str) {
        let kqs = self.state().by_subscription.get(subscription).cloned();
        for kq in kqs.into_iter().flatten() {
            kq.bump(Some(node));
        }
    }

    /// Subscribed on `node` on this connection (first time, or again after a reconnect).
    pub(super) fn subscribed(&self, node: usize, channels: &[String]) {
        self.settle(node, channels.iter().map(String::as_str), true);
    }

    /// Already subscribed on `node`: only a waiting confirmation is settled.
    pub(super) fn already_subscribed(&self, node: usize, channels: &[String]) {
        self.settle(node, channels.iter().map(String::as_str), false);
    }

    /// `node` could not confirm: its pending confirmations are settled as failed (the head
    /// re-checks, then relies on its timers for that node).
    fn node_failed(&self, node: usize) {
        let kqs: Vec<Arc<KeyQueue>> = self.state().queues.values().cloned().collect();
        for kq in kqs {
            let mut q = kq.q();
            if q.pending.get(node).copied().unwrap_or(false) {
                q.pending[node] = false;
                let done = !q.pending.contains(&true);
                drop(q);
                if done {
                    kq.bump(None);
                }
            }
        }
    }

    fn settle<'a>(&self, node: usize, channels: impl Iterator<Item = &'a str>, fresh: bool) {
        let kqs: Vec<Arc<KeyQueue>> = {
            let st = self.state();
            channels
                .filter_map(|c| st.by_subscription.get(c))
                .flatten()
                .cloned()
                .collect()
        };
        for kq in kqs {
            let mut q = kq.q();
            let was_pending = q.pending.get(node).copied().unwrap_or(false);
            if was_pending {
                q.pending[node] = false;
            }
            let done = !q.pending.contains(&true);
            drop(q);
            // First subscription: wake the head once every node has answered (every node's
            // epoch: no attempt has seen the lock with the subscription in place yet).
            // Resubscription after a reconnect: wake it at once, since publishes on this node
            // were lost meanwhile.
            if was_pending && done {
                kq.bump(None);
            } else if fresh && !was_pending {
                kq.bump(Some(node));
            }
        }
    }
}

/// A waiter's place in its key's local queue. Dropping it leaves the queue.
pub(crate) struct Ticket {
    waiters: Arc<Waiters>,
    kq: Arc<KeyQueue>,
    id: u64,
    turn: watch::Receiver<Option<Turn>>,
    /// Set when this waiter got the lock: `Some(true)` when the server queue no longer holds
    /// our id anywhere (every node granted, and the grant did not keep the place).
    granted: Option<bool>,
    /// When the lock it got lapses, unless released or renewed before.
    lapses: Option<tokio::time::Instant>,
    /// Its grant kept our place in the server queue for the readers behind it (`QueueArgs::keep`).
    kept_place: bool,
}

impl Ticket {
    pub fn is_head(&self) -> bool {
        self.turn.borrow().is_some()
    }

    /// Waits until this waiter is the head of its local queue.
    pub async fn my_turn(&mut self) -> Turn {
        loop {
            if let Some(turn) = self.turn.borrow_and_update().clone() {
                return turn;
            }
            if self.turn.changed().await.is_err() {
                // The queue was torn down (fork): act as a head that must re-check.
                return Turn {
                    attempt_now: true,
                    seen: self.epochs(),
                    lapses: None,
                };
            }
        }
    }

    /// Every node's epoch now: read before an attempt.
    pub fn epochs(&self) -> Epochs {
        self.kq.epochs()
    }

    /// Resolves once the epoch of a node that counts in `from` has moved past `seen`: a
    /// release was published there, or a subscription there was (re)confirmed. A node that
    /// starts to count while this waits (a late refusal) counts with every move since `seen`.
    pub async fn woken_since(&self, seen: &Epochs, from: &mut WakeSources) {
        let mut rx = self.kq.epoch.subscribe();
        loop {
            if from.with(|f| rx.borrow_and_update().moved_since(seen, f)) {
                return;
            }
            tokio::select! {
                changed = rx.changed() => if changed.is_err() { return },
                _ = from.changed() => {}
            }
        }
    }

    /// The server-queue arguments of a head's attempt: our id, the score ('' = arrival order
    /// by the node's clock, the right order with one node) and the lease.
    pub fn queue_args(&self, opts: &LockOptions, seen: &Epochs) -> QueueArgs {
        let mut q = self.kq.q();
        q.dirty = true;
        let lease = lease(opts);
        q.lease_end = Some(std::time::Instant::now() + lease);
        let score = if self.waiters.nodes == 1 {
            String::new()
        } else {
            q.score
                .get_or_insert_with(|| {
                    let now = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .unwrap_or_default();
                    now.as_micros().to_string()
                })
                .clone()
        };
        QueueArgs {
            id: self.kq.server_id.clone(),
            score,
            lease_ms: lease.as_millis() as u64,
            flags: Some(self.kq.flags.clone()),
            woken: Some(Woken {
                rx: self.kq.epoch.subscribe(),
                seen: seen.clone(),
            }),
            keep: self.kq.role == Role::Reader && q.waiters.len() > 1,
        }
    }

    /// This waiter got the lock, which lapses at `lapses` unless released or renewed.
    /// `kept_place`: the grant kept our place for the readers behind it (it stays queued, at
    /// its score).
    pub fn granted(
        &mut self,
        everywhere: bool,
        lapses: Option<tokio::time::Instant>,
        kept_place: bool,
    ) {
        self.granted = Some(everywhere);
        self.lapses = lapses;
        self.kept_place = kept_place;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.waiters.leave(self) {
            let waiters = self.waiters.clone();
            let (key, id) = (self.kq.key.clone(), self.kq.server_id.clone());
            let channel = self.kq.channel.clone();
            let lease_end = self.kq.q().lease_end;
            // Counted: a closed manager's waits are gone from every answering node when
            // `close` returns, and the exit protocol waits for it.
            let pending = crate::runtime::Pending::start();
            // A cancelled acquire reports once this is done (`runtime::collect_cleanup`).
            crate::runtime::started_cleanup(self.waiters.cluster.handle().spawn(async move {
                waiters
                    .dequeue_everywhere(&key, &id, &channel, lease_end)
                    .await;
                drop(pending);
            }));
        }
    }
}

/// What a local queue shares with the attempts that carry its place.
#[derive(Debug)]
pub(crate) struct PlaceFlags {
    /// Still has waiters: an undo puts our id back in the server queue only while it does.
    waiting: AtomicBool,
    /// An attempt of a waiter that left may have queued the id again after the others' grant
    /// took it out (see `dequeue_if_abandoned`): the last one out takes it out instead of
    /// lingering. Never cleared: a queue that leaves with it set is gone (a new one is made
    /// on the next join), and one set while lingering costs its next leave one dequeue.
    stray: AtomicBool,
    /// The local queue's channel (which says how a dequeue wakes the next waiter).
    channel: String,
}

/// What a queued attempt sends along.
#[derive(Debug, Clone, Default)]
pub(crate) struct QueueArgs {
    pub id: String,
    pub score: String,
    pub lease_ms: u64,
    /// The local queue's: whether anyone still waits for a place.
    pub flags: Option<Arc<PlaceFlags>>,
    /// The wake-ups of the local queue since the epochs read before the attempt.
    pub woken: Option<Woken>,
    /// A reader with other readers of this process waiting behind it: its grant keeps the
    /// place, where they attempt next (they share the key), instead of queueing again behind
    /// a writer that came after them.
    pub keep: bool,
}

/// A head's wake-ups during its own attempt. A node that refused the attempt and then
/// published a release makes the attempt worth sending again at once, rather than waiting
/// for a silent node's answer to decide it (see `acquire::attempt`).
#[derive(Debug, Clone)]
pub(crate) struct Woken {
    rx: watch::Receiver<Epochs>,
    seen: Epochs,
}

impl Woken {
    /// Whether a node marked in `from` has woken since the attempt was sent.
    pub fn moved_on(&self, from: &[bool]) -> bool {
        self.rx.borrow().moved_since(&self.seen, from)
    }

    /// Resolves at the next wake-up on any node (never, once the queue is gone).
    pub async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl QueueArgs {
    /// Our place, as the scripts take it.
    pub fn place(&self) -> Place<'_> {
        Place {
            id: &self.id,
            score: &self.score,
            lease_ms: self.lease_ms,
        }
    }

    pub fn still_waiting(&self) -> bool {
        self.flags
            .as_ref()
            .is_some_and(|f| f.waiting.load(Ordering::SeqCst))
    }
}

/// How long a queued waiter keeps its place without re-checking: long enough for the head to
/// re-check (at most 1.5 × retry_delay apart) twice, plus node timeouts.
pub(crate) fn lease(opts: &LockOptions) -> Duration {
    (opts.retry_delay * 3 + opts.effective_node_timeout() * 4).max(MIN_LEASE)
}

/// The key's release channel, which names its local waiter queue: Redisson's for reentrant
/// locks, `release_channel` for plain ones.
pub(crate) fn queue_channel(key: &str, reentrant: bool) -> String {
    if reentrant {
        crate::scripts::redisson_channel(key)
    } else {
        release_channel(key)
    }
}

impl Waiters {
    /// Once an attempt that carried `place` has its answers in (from the nodes that are not
    /// silent; a lost attempt's task, from those its caller waited for, the rest having been
    /// written before the ticket's dequeue but for a re-send): if nobody here waits for `key`
    /// any more, takes the place out again; if someone does, the last one out will (instead
    /// of lingering). The ticket's own dequeue is sent
    /// when the last waiter leaves, and an attempt still in flight then (a task not yet run,
    /// a request not yet written, a blocking caller's own connection) may run after it; its
    /// refusal queues the place again, where it would be the head and hold up first tries for
    /// a whole queue lease. Silent nodes are skipped, so a cancel is not held up by them (the
    /// lease ends an entry there). Someone who joins a kept queue meanwhile (the same id) and
    /// loses the place to this is queued again by its next attempt.
    pub(crate) async fn dequeue_if_abandoned(&self, key: &str, place: &QueueArgs) {
        let Some(flags) = &place.flags else {
            return;
        };
        flags.stray.store(true, Ordering::SeqCst);
        if flags.waiting.load(Ordering::SeqCst) {
            return;
        }
        let lease_end = std::time::Instant::now() + Duration::from_millis(place.lease_ms);
        self.dequeue_on(key, &place.id, &flags.channel, Some(lease_end), true)
            .await;
    }

    /// Takes our id out of the server queue on every node. We may have been the head: on a
    /// plain lock's channel, waiters that skip release publishes are told to re-check (`?`).
    /// A node whose slot was migrating (MOVED, ASK or TRYAGAIN past redis-rs's retries:
    /// nothing ran) is tried again, backing off, until `lease_end`: left there, our id would
    /// hold the head of a free lock for the rest of its lease, though this process is alive.
    /// (Sent twice, the script removes nothing more and at most tells the head twice.) `None`:
    /// one try. Other failures are not retried: the lease ends the entry anyway.
    async fn dequeue_everywhere(
        &self,
        key: &str,
        id: &str,
        channel: &str,
        lease_end: Option<std::time::Instant>,
    ) {
        self.dequeue_on(key, id, channel, lease_end, false).await
    }

    /// `dequeue_everywhere`, leaving out the nodes that are silent with `skip_silent`.
    async fn dequeue_on(
        &self,
        key: &str,
        id: &str,
        channel: &str,
        lease_end: Option<std::time::Instant>,
        skip_silent: bool,
    ) {
        // Plain locks: the next head hears of it on its own channel. A counted lock's waiters
        // all listen on its channel (Redisson's), and hear its unlock message there.
        let dequeue = Dequeue::new(key, id, channel);
        let dequeue = &dequeue;
        let nodes = self.cluster.nodes.iter();
        let nodes = nodes.filter(|node| !(skip_silent && node.is_silent()));
        futures::future::join_all(nodes.map(|node| async move {
            let mut backoff = MIN_BACKOFF;
            loop {
                let sent = node
                    .run(self.node_timeout, false, move |mut conn| async move {
                        dequeue
                            .invocation(conn.sharded())
                            .invoke_async::<()>(&mut conn)
                            .await
                    })
                    .await;
                let again = match &sent {
                    Err(e @ NodeError::Migrating(_)) => Some(e.detail()),
                    _ => None,
                };
                let (Some(why), Some(end)) = (again, lease_end) else {
                    return;
                };
                if std::time::Instant::now() + backoff >= end {
                    return;
                }
                tracing::debug!(node = %node.name(), "dequeue failed, trying again: {why}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }))
        .await;
    }

    /// Tells the first waiter of a plain lock's queue to re-check if the lock is free (after
    /// our quiet release, when we did not take it back: see `quiet.rs`).
    pub async fn wake_if_free(&self, key: &str) {
        self.dequeue_everywhere(key, "", &release_channel(key), None)
            .await;
    }
}

/// One per node per manager: owns the pub/sub connection, keeps its subscriptions equal to the
/// channels that have waiters, and turns messages into wake-ups. Ends with the manager.
async fn subscriber(weak: Weak<Waiters>, node: usize, mut signal: mpsc::UnboundedReceiver<()>) {
    let mut backoff = MIN_BACKOFF;
    loop {
        // Idle (no connection) until some channel has waiters.
        loop {
            let Some(waiters) = weak.upgrade() else {
                return;
            };
            if !waiters.wanted().is_empty() {
                break;
            }
            drop(waiters);
            if signal.recv().await.is_none() {
                return;
            }
        }
        let lost = match connect(&weak, node).await {
            None => return,
            Some(Ok(Session::Classic(pubsub))) => {
                backoff = MIN_BACKOFF;
                classic(&weak, node, &mut signal, pubsub).await
            }
            Some(Ok(Session::Sharded(conn, pushes))) => {
                backoff = MIN_BACKOFF;
                super::sharded::run(&weak, node, &mut signal, conn, pushes).await
            }
            Some(Err(why)) => {
                if let Some(s) = weak.upgrade() {
                    let n = &s.cluster.nodes[node];
                    tracing::debug!(node = %n.name(), "pub/sub connect failed: {}", n.scrub(&why));
                    s.node_failed(node);
                }
                if !pause(&mut signal, backoff).await {
                    return;
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        let Some(lost) = lost else {
            return;
        };
        if !lost {
            // Nobody has waited for a while: close the connection until somebody does.
            continue;
        }
        // Connection lost: whatever was published meanwhile is gone. Pending confirmations
        // settle as failed now, and the resubscription wakes every head to re-check.
        if let Some(s) = weak.upgrade() {
            tracing::debug!(node = %s.cluster.nodes[node].name(), "pub/sub connection lost; resubscribing");
            s.node_failed(node);
        }
        if !pause(&mut signal, backoff).await {
            return;
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// A node's pub/sub connection: a standalone server's (or a cluster seed's, for classic
/// PUBLISH, which a cluster broadcasts to every node), or a cluster's routed RESP3 connection
/// for sharded channels, whose messages come as push messages.
enum Session {
    Classic(redis::aio::PubSub),
    Sharded(
        redis::cluster_async::ClusterConnection,
        mpsc::UnboundedReceiver<redis::PushInfo>,
    ),
}

/// Opens the node's pub/sub connection; `None` when the manager is gone.
async fn connect(weak: &Weak<Waiters>, node: usize) -> Option<Result<Session, String>> {
    let waiters = weak.upgrade()?;
    let n = &waiters.cluster.nodes[node];
    if n.may_shard() {
        // The fallback through the primaries last seen starts after the connect timeout:
        // bounded by `CONNECT_TIMEOUT` alone, a node timeout of 4 s or more (a connect
        // timeout of 2 s or more) cut every try before it, and while the URL's seed was down
        // the waiters were never subscribed.
        let bound = CONNECT_TIMEOUT + n.pubsub_fallback_wait();
        match tokio::time::timeout(bound, n.sharded_pubsub()).await {
            Ok(Some(Ok((conn, Pubsub::Sharded, pushes)))) => {
                return Some(Ok(Session::Sharded(conn, pushes)));
            }
            // Before Redis 7.0: classic pub/sub, as the scripts publish then.
            Ok(Some(Ok((_, Pubsub::Classic, _)))) | Ok(None) => {}
            Ok(Some(Err(e))) => return Some(Err(e.to_string())),
            Err(_) => {
                return Some(Err(format!("no connection within {bound:?}")));
            }
        }
    }
    let client = n.client().clone();
    drop(waiters);
    Some(
        match tokio::time::timeout(CONNECT_TIMEOUT, client.get_async_pubsub()).await {
            Ok(Ok(p)) => Ok(Session::Classic(p)),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no connection within {CONNECT_TIMEOUT:?}")),
        },
    )
}

/// The channels one pub/sub connection (classic or sharded) has confirmed on its server.
#[derive(Default)]
pub(super) struct OnServer(HashSet<String>);

/// What a pub/sub connection changes next to match the waiters: channels to subscribe and to
/// unsubscribe, and whether the waiters want none at all (`idle`).
pub(super) struct Plan {
    pub(super) add: Vec<String>,
    pub(super) remove: Vec<String>,
    pub(super) idle: bool,
}

impl OnServer {
    /// The next change on `node`; the waiters of channels already on the server are told they
    /// are subscribed. `None`: the manager is gone.
    pub(super) fn plan(&self, weak: &Weak<Waiters>, node: usize) -> Option<Plan> {
        let waiters = weak.upgrade()?;
        let wanted = waiters.wanted();
        let kept: Vec<String> = wanted.intersection(&self.0).cloned().collect();
        waiters.already_subscribed(node, &kept);
        Some(Plan {
            add: wanted.difference(&self.0).cloned().collect(),
            remove: self.0.difference(&wanted).cloned().collect(),
            idle: wanted.is_empty(),
        })
    }

    pub(super) fn contains(&self, channel: &str) -> bool {
        self.0.contains(channel)
    }

    pub(super) fn channels(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }

    /// Unsubscribed (by us, or by the server when a slot moves).
    pub(super) fn removed(&mut self, channels: &[String]) {
        for c in channels {
            self.0.remove(c);
        }
    }

    /// Subscriptions confirmed: their waiters are told.
    pub(super) fn added(&mut self, weak: &Weak<Waiters>, node: usize, channels: &[String]) {
        self.0.extend(channels.iter().cloned());
        if let Some(s) = weak.upgrade() {
            s.subscribed(node, channels);
        }
    }
}

/// Runs a classic pub/sub connection until it is lost (`Some(true)`), idle for
/// `IDLE_CLOSE` (`Some(false)`), or the manager is gone (`None`).
async fn classic(
    weak: &Weak<Waiters>,
    node: usize,
    signal: &mut mpsc::UnboundedReceiver<()>,
    pubsub: redis::aio::PubSub,
) -> Option<bool> {
    let (mut sink, mut stream) = pubsub.split();
    let mut on_server = OnServer::default();
    loop {
        let Plan { add, remove, idle } = on_server.plan(weak, node)?;
        if !remove.is_empty() {
            if !op(sink.unsubscribe(remove.as_slice()), &mut stream, weak, node).await {
                return Some(true);
            }
            on_server.removed(&remove);
        }
        if !add.is_empty() {
            if !op(sink.subscribe(add.as_slice()), &mut stream, weak, node).await {
                return Some(true);
            }
            on_server.added(weak, node, &add);
        }
        if !add.is_empty() || !remove.is_empty() {
            continue;
        }
        tokio::select! {
            s = signal.recv() => { s?; }
            m = stream.next() => match m {
                Some(m) => deliver(weak, node, &m),
                None => return Some(true),
            },
            _ = tokio::time::sleep(IDLE_CLOSE), if idle => return Some(false),
            // Lingering queues end by themselves: look again now and then. And ping: a link
            // that went silent without closing (a half-open connection to a host that
            // vanished) would lose every release published meanwhile, for every key on the
            // node. One with no answer within `OP_TIMEOUT` is lost: the reconnection
            // resubscribes, and every waiter re-checks.
            _ = tokio::time::sleep(LINGER), if !idle => {
                let ping = async { sink.ping::<redis::Value>().await.map(|_| ()) };
                if !op(ping, &mut stream, weak, node).await {
                    return Some(true);
                }
            }
        }
    }
}

/// Runs a (un)subscribe or a ping, delivering messages that arrive meanwhile. False: the
/// connection is unusable.
async fn op(
    fut: impl std::future::Future<Output = redis::RedisResult<()>>,
    stream: &mut PubSubStream,
    weak: &Weak<Waiters>,
    node: usize,
) -> bool {
    tokio::pin!(fut);
    let timeout = tokio::time::sleep(OP_TIMEOUT);
    tokio::pin!(timeout);
    loop {
        tokio::select! {
            r = &mut fut => return r.is_ok(),
            m = stream.next() => match m {
                Some(m) => deliver(weak, node, &m),
                None => return false,
            },
            _ = &mut timeout => return false,
        }
    }
}

fn deliver(weak: &Weak<Waiters>, node: usize, msg: &redis::Msg) {
    if let Some(s) = weak.upgrade() {
        s.wake(node, msg.get_channel_name());
    }
}

/// Sleeps `d`; false when the manager is gone meanwhile.
async fn pause(signal: &mut mpsc::UnboundedReceiver<()>, d: Duration) -> bool {
    let sleep = tokio::time::sleep(d);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            _ = &mut sleep => return true,
            s = signal.recv() => if s.is_none() { return false },
        }
    }
}
