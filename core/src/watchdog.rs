//! One task per manager keeps every held lock alive. Renewals of all locks due in a tick go
//! to each node as one pipeline per node timeout (one round trip per node per tick, however
//! many locks of one node timeout; a
//! cluster node gets one per primary), and a
//! lock whose renewal cannot reach a quorum before its deadline is declared lost, before that
//! deadline, so its holder hears of it while it can still act.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::FutureExt;
use redis::Value;
use redis::cluster_async::ClusterConnection;
use tokio::sync::{Notify, OwnedMutexGuard};
use tokio::time::Instant;

use crate::acquire::Kind;
use crate::cluster::Cluster;
use crate::node::{Conn, Node, NodeError};
use crate::node_cluster::{SlotMap, key_slot, send_to_primary_of};
use crate::options::LockOptions;
use crate::per_process::PerProcess;
use crate::quorum::{Answer, Tally};
use crate::scripts::Extend;

/// Longest sleep when nothing is due, so a dropped manager's task notices and ends.
const IDLE: Duration = Duration::from_secs(1);
/// Time allowed per renewal in a batch, on top of the node timeout.
const PER_RENEWAL: Duration = Duration::from_micros(50);
/// How much longer than its parts' own deadline a cluster's renewal tick may run before it is
/// cut whole (its connection, or the map read, being what is slow then).
const CLUSTER_SLACK: Duration = Duration::from_millis(100);

/// What the watchdog keeps alive: a held lock (`lock.rs`), which decides for itself when it
/// is due, lost or renewed; the watchdog batches the renewals and runs the clock.
pub(crate) trait Watched: Send + Sync {
    /// What it needs now: it may declare itself lost (`Next::Forget`). `batch`: a batch goes
    /// out in this tick, which it may join ahead of its time (`Next::Joinable`).
    fn inspect(&self, now: Instant, batch: bool) -> Next;
    /// When it next needs looking at.
    fn due(&self) -> Instant;
    /// Starts this tick's renewal: the guard that keeps its extend and release out, and the
    /// lease to renew for. `Err`: one of those is in flight; sit this tick out and look again
    /// at the instant given.
    fn begin_renewal(&self) -> Result<(OwnedMutexGuard<()>, LockOptions), Instant>;
    fn key(&self) -> &str;
    fn token(&self) -> &str;
    /// A counted lock's hold id (its mark is renewed with it); empty otherwise.
    fn hold(&self) -> &str;
    /// Takes the renewal's answers (`nodes` to describe failures); returns when it needs
    /// looking at again, if sooner than planned.
    fn settle(
        &self,
        lease: &LockOptions,
        tally: &Tally,
        start: Instant,
        nodes: &[Node],
    ) -> Option<Instant>;
}

/// What one lock needs now (`Watched::inspect`).
pub(crate) enum Next {
    Forget,
    /// Renew in this tick; declare it lost at this instant if no renewal has confirmed.
    RenewNow(Instant),
    /// Not due yet, but close enough to join a batch that goes out in this tick; else look
    /// again at this instant.
    Joinable(Instant),
    At(Instant),
}

/// The watchdog of one manager. Its registry, wake-up and task belong to one process: a
/// forked child starts its own, empty (its parent's locks are not its to renew).
pub(crate) struct Watchdog {
    core: Arc<Core>,
}

/// What the watchdog's task holds (weakly: it ends with the manager).
struct Core {
    cluster: Arc<Cluster>,
    local: PerProcess<Local>,
    cluster_renewals: ClusterRenewals,
}

#[derive(Default)]
struct Local {
    next_id: AtomicU64,
    registry: Mutex<Registry>,
    wake: Arc<Notify>,
    /// Per cluster node (by index): the slot map its renewals are grouped by.
    slot_maps: Mutex<HashMap<usize, Arc<SlotMap>>>,
}

#[derive(Default)]
struct Registry {
    locks: HashMap<u64, Weak<dyn Watched>>,
    /// The task runs (in this process).
    running: bool,
    /// When the task next wakes by itself: never later than the earliest loss deadline of a
    /// registered lock. A change that needs it sooner wakes it (`reschedule`); one that does
    /// not costs nothing, so 10,000 acquires or extends do not mean 10,000 scans.
    wakes_at: Option<Instant>,
}

impl Core {
    fn local(&self) -> &Local {
        self.local.get_or_init(Local::default)
    }
}

impl Watchdog {
    pub fn new(cluster: Arc<Cluster>) -> Watchdog {
        Watchdog {
            core: Arc::new(Core {
                cluster,
                local: PerProcess::default(),
                cluster_renewals: ClusterRenewals::default(),
            }),
        }
    }

    /// Starts watching a held lock, starting the task when none runs in this process. Locks
    /// with the watchdog off are watched once someone waits on their `lost()` (or when they
    /// have a `max_hold`): they are never renewed, but that waiter hears that they are about
    /// to expire. Unwatched, their `Expiring` loss is applied when their status is read
    /// (`LockInner::current`).
    pub fn watch<L: Watched + 'static>(&self, lock: &Arc<L>) {
        let local = self.core.local();
        let id = local.next_id.fetch_add(1, Ordering::Relaxed);
        let event = lock.due();
        let weak: Weak<L> = Arc::downgrade(lock);
        let start = {
            let mut reg = local.registry.lock().unwrap_or_else(|p| p.into_inner());
            reg.locks.insert(id, weak);
            !std::mem::replace(&mut reg.running, true)
        };
        if start {
            let core = Arc::downgrade(&self.core);
            self.core.cluster.handle().spawn(supervised(core));
        } else {
            self.reschedule(event);
        }
    }

    /// What the watchdog sent to clusters (tests).
    pub fn cluster_renewals(&self) -> &ClusterRenewals {
        &self.core.cluster_renewals
    }

    /// A registered lock needs looking at by `at`: wakes the task if it planned to sleep
    /// longer.
    pub fn reschedule(&self, at: Instant) {
        self.core.reschedule(at);
    }
}

impl Core {
    fn reschedule(&self, at: Instant) {
        let local = self.local();
        let wake = {
            let mut reg = local.registry.lock().unwrap_or_else(|p| p.into_inner());
            let sooner = reg.running && reg.wakes_at.is_none_or(|planned| at < planned);
            if sooner {
                reg.wakes_at = Some(at);
            }
            sooner
        };
        if wake {
            local.wake.notify_one();
        }
    }
}

/// `run`, started again if it panics (a bug: every lock's renewal and loss signal hangs on
/// it, and its registry still says it runs). The next start is 10 ms later, doubling to 1 s
/// while it keeps panicking, so that a panic on every scan logs without spinning; one that
/// ran for a second starts the count again.
fn supervised(weak: Weak<Core>) -> impl std::future::Future<Output = ()> + Send + 'static {
    // Made with the future, not at its first poll: a runtime that shuts down before it ever
    // ran the task drops it unpolled, and the watchdog was then never started again (a lock
    // taken just before its runtime ended expired unrenewed, still `Held`).
    let dropped = Dropped(Some(weak.clone()));
    supervise(weak, dropped)
}

async fn supervise(weak: Weak<Core>, mut dropped: Dropped) {
    use futures::FutureExt;
    let mut pause = SUPERVISED_RESTART;
    loop {
        let started = Instant::now();
        let Err(payload) = std::panic::AssertUnwindSafe(run(weak.clone()))
            .catch_unwind()
            .await
        else {
            dropped.0 = None;
            return;
        };
        if started.elapsed() >= SUPERVISED_RESTART_MAX {
            pause = SUPERVISED_RESTART;
        }
        tracing::error!(
            "ferrolock bug: the watchdog's task panicked ({}); it starts again in {pause:?} \
             (please report it)",
            crate::error::panic_text(&*payload)
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(SUPERVISED_RESTART_MAX);
    }
}

/// Dropped before it returned, the task was dropped by its runtime's shutdown (the manager's
/// home, `runtime::Home`, is the runtime the manager was made in): it starts again on the
/// process runtime, which never shuts down, while its manager lives. Its registry still says
/// it runs, so nothing else would start it, and its locks expired unrenewed and untold.
struct Dropped(Option<Weak<Core>>);

impl Drop for Dropped {
    fn drop(&mut self) {
        if let Some(weak) = self.0.take() {
            let Some(core) = weak.upgrade() else { return };
            core.cluster.home().runtime_gone();
            drop(core);
            crate::runtime::runtime().spawn(supervised(weak));
        }
    }
}

const SUPERVISED_RESTART: Duration = Duration::from_millis(10);
const SUPERVISED_RESTART_MAX: Duration = Duration::from_secs(1);

async fn run(weak: Weak<Core>) {
    loop {
        let Some(core) = weak.upgrade() else { return };
        let local = core.local();
        let now = Instant::now();
        let mut due: Vec<Arc<dyn Watched>> = Vec::new();
        let mut joinable: Vec<Arc<dyn Watched>> = Vec::new();
        let mut wake_at = now + IDLE;
        // Looked at with the registry let go: a lock found lost runs its holder's `on_lost`
        // callbacks here, and one that listens to another lock (`on_lost`, `lost()`) may
        // register that one, which takes the registry. Held, the task hung on it for good,
        // and no lock of the manager was renewed or told of its loss again (found by a
        // review). While the scan runs nothing is planned, so a lock registered or
        // rescheduled meanwhile wakes the task again at once.
        let locks: Vec<(u64, Arc<dyn Watched>)> = {
            let mut reg = local.registry.lock().unwrap_or_else(|p| p.into_inner());
            crate::hooks::run(crate::hooks::Point::WatchdogScan, "");
            let mut locks = Vec::with_capacity(reg.locks.len());
            reg.locks
                .retain(|&id, weak_lock| match weak_lock.upgrade() {
                    Some(lock) => {
                        locks.push((id, lock));
                        true
                    }
                    None => false,
                });
            reg.wakes_at = None;
            locks
        };
        let mut forget = Vec::new();
        for (id, lock) in locks {
            match lock.inspect(now, false) {
                Next::Forget => forget.push(id),
                Next::RenewNow(lose_at) => {
                    // Renewed beside this loop; the loss deadline still bounds the sleep.
                    wake_at = wake_at.min(lose_at);
                    due.push(lock);
                }
                Next::Joinable(t) => {
                    wake_at = wake_at.min(t);
                    joinable.push(lock);
                }
                Next::At(t) => wake_at = wake_at.min(t),
            }
        }
        // Only a lock that is due makes a batch: an idle wake-up renews nothing early,
        // so a lock alone is renewed every ttl/3, never more often.
        if !due.is_empty() {
            for lock in joinable {
                if let Next::RenewNow(lose_at) = lock.inspect(now, true) {
                    wake_at = wake_at.min(lose_at);
                    due.push(lock);
                }
            }
        }
        {
            let mut reg = local.registry.lock().unwrap_or_else(|p| p.into_inner());
            for id in &forget {
                reg.locks.remove(id);
            }
            if reg.locks.is_empty() {
                reg.running = false;
                reg.wakes_at = None;
                return;
            }
            // A time asked for during the scan has woken the task already (see above).
            reg.wakes_at = Some(reg.wakes_at.map_or(wake_at, |t| t.min(wake_at)));
        }
        if !due.is_empty() {
            // Renewal runs beside the loop, so a slow batch never delays a loss signal.
            tokio::spawn(renew(core.clone(), due));
        }
        let wake = local.wake.clone();
        drop(core); // a sleeping watchdog must not keep its manager alive
        tokio::select! {
            _ = tokio::time::sleep_until(wake_at) => {}
            _ = wake.notified() => {}
        }
    }
}

/// One lock of a batch: the guard that keeps its extend and release out (until the lock is
/// settled), and the lease it is renewed for.
struct Renewal {
    lock: Arc<dyn Watched>,
    op: Mutex<Option<OwnedMutexGuard<()>>>,
    lease: LockOptions,
}

/// Renews `due` with one pipeline per node, kind and node timeout, all nodes at once, then
/// settles each lock.
async fn renew(core: Arc<Core>, due: Vec<Arc<dyn Watched>>) {
    let core = &*core;
    // A lock whose extend or release is in flight sits this tick out (release waits for a
    // renewal in flight, never the other way round); it is looked at again shortly, and
    // before its loss deadline in any case.
    let batch: Vec<Renewal> = due
        .into_iter()
        .filter_map(|lock| match lock.begin_renewal() {
            Ok((op, lease)) => Some(Renewal {
                lock,
                op: Mutex::new(Some(op)),
                lease,
            }),
            Err(next) => {
                core.reschedule(next);
                None
            }
        })
        .collect();
    // A lock's renewal is never held back by the restart guard, a semaphore's is (see
    // `Kind::renewal_waits_for_the_guard`): each kind goes in a batch of its own, so a held-back
    // semaphore never holds back the locks renewed in the same tick. So does each node
    // timeout: a batch waits for a hung node (a cluster's primary) as long as its longest, and
    // a lock with a shorter one was held past its loss deadline.
    let mut batches: Vec<(bool, Duration, Vec<Renewal>)> = Vec::new();
    for r in batch {
        let voting = Kind::of(&r.lease).renewal_waits_for_the_guard();
        let timeout = r.lease.effective_node_timeout();
        match batches
            .iter_mut()
            .find(|(v, t, _)| (*v, *t) == (voting, timeout))
        {
            Some((_, _, batch)) => batch.push(r),
            None => batches.push((voting, timeout, vec![r])),
        }
    }
    futures::future::join_all(
        batches
            .into_iter()
            .map(|(voting, _, batch)| renew_batch(core, batch, voting)),
    )
    .await;
}

/// Renews one batch (`voting`: its renewals wait for the restart guard).
async fn renew_batch(core: &Core, batch: Vec<Renewal>, voting: bool) {
    if batch.is_empty() {
        return;
    }
    // A pipeline of many renewals takes longer than one request; allow for it.
    let timeout = batch
        .iter()
        .map(|r| r.lease.effective_node_timeout())
        .max()
        .unwrap_or(Duration::from_millis(200))
        + PER_RENEWAL * batch.len() as u32;
    let start = Instant::now();
    let mut answers: futures::stream::FuturesUnordered<_> = core
        .cluster
        .nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let batch = &batch;
            // A cluster bounds each primary's part by `timeout` itself (`renew_on_cluster`),
            // so that one slow primary fails only its own locks: the whole is cut later.
            let limit = if node.is_cluster() {
                timeout + CLUSTER_SLACK
            } else {
                timeout
            };
            // From the tick's start, as the whole's limit is: a slow connection leaves the
            // parts less time, never more than the whole.
            let deadline = start + timeout;
            node.run(limit, voting, move |mut conn| async move {
                if let Conn::Cluster(cluster, ..) = &conn {
                    let replies = renew_on_cluster(core, i, cluster, batch, deadline).await;
                    // Some primary did not answer in time: one that hangs may have failed over.
                    if let (Ok(replies), Some(watch)) = (&replies, conn.watch())
                        && replies.contains(&Value::Nil)
                    {
                        watch.suspect(timeout);
                    }
                    return replies;
                }
                let mut pipe = redis::pipe();
                pipe.ignore_errors();
                for r in batch {
                    extend(r).add_to(&mut pipe);
                }
                let mut replies: Vec<Value> = pipe.query_async(&mut conn).await?;
                if replies.iter().any(is_noscript) {
                    // A restarted node forgot the scripts: load them once and send the batch again.
                    let renewals = batch.iter().map(|r| Kind::of(&r.lease).renewal());
                    Extend::load(&mut conn, renewals).await?;
                    replies = pipe.query_async(&mut conn).await?;
                }
                Ok(replies)
            })
            .map(move |replies| (i, replies))
        })
        .collect();
    let n = core.cluster.nodes.len();
    let mut per_node: Vec<Option<Result<Vec<Value>, NodeError>>> = vec![None; n];
    let mut settled = vec![false; batch.len()];
    // Each lock is settled as soon as its outcome is decided, as an extend is: the batch's
    // timeout is its longest lock's node timeout, and waiting it out for a hung node kept a
    // lock with a shorter one from its confirmation past its loss deadline, though a quorum
    // had answered at once.
    while let Some((node, replies)) = futures::StreamExt::next(&mut answers).await {
        per_node[node] = Some(replies);
        let every_node = answers.is_empty();
        for (i, r) in batch.iter().enumerate() {
            if settled[i] {
                continue;
            }
            let answers = per_node
                .iter()
                .map(|replies| match replies {
                    None => Answer::Pending,
                    Some(Err(e)) => Answer::Failed(e.clone()),
                    Some(Ok(replies)) => match replies.get(i) {
                        Some(Value::Int(1)) => Answer::Yes(0),
                        Some(Value::Int(_)) => Answer::No,
                        // A cluster's entry whose primary did not answer in time.
                        Some(Value::Nil) => Answer::Failed(NodeError::Unreachable(format!(
                            "no reply within {timeout:?}"
                        ))),
                        Some(other) => Answer::Failed(NodeError::Redis(format!(
                            "unexpected renewal reply {other:?}"
                        ))),
                        None => Answer::Failed(NodeError::Redis("short pipeline reply".into())),
                    },
                })
                .collect();
            let tally = Tally {
                quorum: core.cluster.quorum,
                answers,
            };
            if !every_node && !tally.won() && tally.no() <= n - tally.quorum {
                continue;
            }
            settled[i] = true;
            if let Some(next) = r.lock.settle(&r.lease, &tally, start, &core.cluster.nodes) {
                core.reschedule(next);
            }
            // Its extend and release may go out now: on each node they follow this renewal.
            drop(r.op.lock().unwrap_or_else(|p| p.into_inner()).take());
        }
    }
}

/// A cluster's renewals: one routed pipeline per primary, grouped by the slot map last read
/// (a cluster refuses a pipeline whose keys span slots it does not serve). An entry that
/// comes back as an error (MOVED or ASK while a slot moves, TRYAGAIN, NOSCRIPT on a new
/// primary), every entry of a slot the map does not know, and every entry of a one-slot
/// pipeline that failed whole, is renewed alone, as a routed command that redis-rs redirects
/// and retries; a pipeline of several slots that failed whole is sent again as two halves. A
/// redirect also drops the map, so the next tick regroups on a fresh one. A failed renewal's
/// reply is its error text, which `settle` reports as the failure. Every part ends by
/// `deadline` on its own: an entry whose primary (or redirected renewal) has not answered by
/// then is left `Nil`, no reply, and the other primaries' answers stand. Before, the tick was
/// cut whole, and one hung primary (or one slot of read locks waiting out a migration) lost
/// every lock of the manager on the cluster (found by a review).
async fn renew_on_cluster(
    core: &Core,
    node: usize,
    conn: &ClusterConnection,
    batch: &[Renewal],
    deadline: Instant,
) -> redis::RedisResult<Vec<Value>> {
    let counts = &core.cluster_renewals;
    counts.ticks.fetch_add(1, Ordering::Relaxed);
    let map = slot_map(core, node, conn).await;
    let mut groups: HashMap<&str, Vec<usize>> = HashMap::new();
    let mut alone = Vec::new();
    for (i, r) in batch.iter().enumerate() {
        match map
            .as_ref()
            .and_then(|m| m.primary_of(key_slot(r.lock.key())))
        {
            Some(primary) => groups.entry(primary).or_default().push(i),
            None => alone.push(i),
        }
    }
    let mut round: Vec<Vec<usize>> = groups.into_values().collect();
    let mut replies = vec![Value::Nil; batch.len()];
    let mut moved = false;
    while !round.is_empty() {
        let sent = round.drain(..).map(|entries| {
            let mut conn = conn.clone();
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for &i in &entries {
                extend(&batch[i]).add_to(&mut pipe);
            }
            counts.pipelines.fetch_add(1, Ordering::Relaxed);
            counts
                .piped
                .fetch_add(entries.len() as u64, Ordering::Relaxed);
            let slot = key_slot(batch[entries[0]].lock.key());
            async move {
                let n = entries.len();
                let replies =
                    tokio::time::timeout_at(deadline, send_to_primary_of(&mut conn, pipe, n, slot))
                        .await;
                (entries, replies)
            }
        });
        for (entries, answer) in futures::future::join_all(sent).await {
            let Ok(answer) = answer else {
                // Out of time: its entries stay `Nil` (no reply), the others' stand.
                continue;
            };
            match answer {
                Ok(values) if values.len() == entries.len() => {
                    for (i, value) in entries.into_iter().zip(values) {
                        match value {
                            Value::Int(_) => replies[i] = value,
                            Value::ServerError(e) => {
                                moved |= matches!(e.code(), "MOVED" | "ASK");
                                alone.push(i);
                            }
                            _ => alone.push(i),
                        }
                    }
                }
                _ => {
                    // Failed whole: redis-rs sends a pipeline whole where its first redirect
                    // points, so one slot that is migrating (some keys answer ASK, the others
                    // not) or has moved fails all of it. Halves, at a slot boundary, are sent
                    // again, until a failing pipeline is one slot: its entries go alone. A
                    // reshard that crosses thousands of locks on the source then costs a few
                    // pipelines more, not thousands of requests.
                    moved = true;
                    let mut entries = entries;
                    // In slot order, so that a half is a run of whole slots.
                    entries.sort_by_cached_key(|&i| key_slot(batch[i].lock.key()));
                    let slot = |i: usize| key_slot(batch[entries[i]].lock.key());
                    let first = slot(0);
                    if first == slot(entries.len() - 1) {
                        alone.extend(entries);
                        continue;
                    }
                    // Before the middle entry's slot; after the first slot when that is the
                    // middle one (both halves non-empty, neither splitting a slot).
                    let middle = slot(entries.len() / 2);
                    let at = entries.partition_point(|&i| {
                        let s = key_slot(batch[i].lock.key());
                        if middle == first {
                            s <= first
                        } else {
                            s < middle
                        }
                    });
                    let second_half = entries.split_off(at);
                    let first_half = entries;
                    counts.split.fetch_add(1, Ordering::Relaxed);
                    round.push(first_half);
                    round.push(second_half);
                }
            }
        }
    }
    if moved {
        *core
            .local()
            .slot_maps
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = HashMap::new();
    }
    counts
        .alone
        .fetch_add(alone.len() as u64, Ordering::Relaxed);
    // One slot's renewals one after another, the slots at once: redis-rs follows an ASK by
    // sending ASKING, then the command, as two requests on the target's shared connection,
    // so concurrent redirects of a migrating slot's keys take each other's ASKING and bounce
    // (MOVED, ASK, ...) until their retries run out; 101 of them overran the renewal timeout.
    let mut by_slot: HashMap<u16, Vec<usize>> = HashMap::new();
    for i in alone {
        by_slot
            .entry(key_slot(batch[i].lock.key()))
            .or_default()
            .push(i);
    }
    let each = by_slot.into_values().map(|entries| {
        // Renewals publish nothing: the pub/sub kind does not matter here.
        let mut conn = crate::node::Conn::Cluster(
            conn.clone(),
            crate::node_cluster::Pubsub::Classic,
            Default::default(),
        );
        async move {
            let mut out = Vec::with_capacity(entries.len());
            for i in entries {
                let renewal = extend(&batch[i]).invocation();
                let value =
                    match tokio::time::timeout_at(deadline, renewal.invoke_async::<i64>(&mut conn))
                        .await
                    {
                        Ok(Ok(n)) => Value::Int(n),
                        Ok(Err(e)) => Value::SimpleString(e.to_string()),
                        // Out of time: this one and the slot's rest stay `Nil` (no reply).
                        Err(_) => break,
                    };
                out.push((i, value));
            }
            out
        }
    });
    for (i, value) in futures::future::join_all(each).await.into_iter().flatten() {
        replies[i] = value;
    }
    Ok(replies)
}

/// Node `node`'s slot map: the one cached, else read now (`None` if that fails: every lock is
/// then renewed alone, which needs no map).
async fn slot_map(core: &Core, node: usize, conn: &ClusterConnection) -> Option<Arc<SlotMap>> {
    let cached = core
        .local()
        .slot_maps
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&node)
        .cloned();
    if cached.is_some() {
        return cached;
    }
    let map = Arc::new(SlotMap::read(&mut conn.clone()).await.ok()?);
    core.local()
        .slot_maps
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(node, map.clone());
    Some(map)
}

/// A lock's renewal. Plain: compare-and-raise on the value. Reentrant: Redisson's renewal,
/// compare-field-and-pexpire.
fn extend(r: &Renewal) -> Extend<'_> {
    Extend {
        key: r.lock.key(),
        token: r.lock.token(),
        ttl_ms: r.lease.ttl_millis(),
        renewal: Kind::of(&r.lease).renewal(),
        hold: r.lock.hold(),
    }
}

/// What the watchdog sent to clusters, for tests: ticks (batches sent to a cluster node),
/// pipelines and the renewals in them, and renewals sent alone.
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct ClusterRenewals {
    pub ticks: AtomicU64,
    pub pipelines: AtomicU64,
    pub piped: AtomicU64,
    pub alone: AtomicU64,
    /// Pipelines that failed whole and were sent again as two halves.
    pub split: AtomicU64,
}

fn is_noscript(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if e.code() == "NOSCRIPT")
}
