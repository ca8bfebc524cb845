//! One task per manager keeps every held lock alive. Renewals of all locks due in a tick go
//! to each node as one pipeline (one round trip per node per tick, however many locks), and a
//! lock whose renewal cannot reach a quorum before its deadline is declared lost, before that
//! deadline, so its holder hears of it while it can still act.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::Value;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::lock::{LockInner, LockStatus, LossReason};
use crate::manager::Shared;
use crate::node::NodeError;
use crate::options::LockOptions;
use crate::per_process::PerProcess;
use crate::quorum::{Answer, Tally};
use crate::scripts::{EXTEND, EXTEND_REENTRANT};

/// Longest sleep when nothing is due, so a dropped manager's task notices and ends.
const IDLE: Duration = Duration::from_secs(1);
/// Time allowed per renewal in a batch, on top of the node timeout.
const PER_RENEWAL: Duration = Duration::from_micros(50);

/// The watchdog of one manager. Its registry, wake-up and task belong to one process: a
/// forked child starts its own, empty (its parent's locks are not its to renew).
#[derive(Default)]
pub(crate) struct Watchdog {
    local: PerProcess<Local>,
}

#[derive(Default)]
struct Local {
    next_id: AtomicU64,
    registry: Mutex<Registry>,
    wake: Arc<Notify>,
}

#[derive(Default)]
struct Registry {
    locks: HashMap<u64, Weak<LockInner>>,
    /// The task runs (in this process).
    running: bool,
    /// When the task next wakes by itself: never later than the earliest loss deadline of a
    /// registered lock. A change that needs it sooner wakes it (`reschedule`); one that does
    /// not costs nothing, so 10,000 acquires or extends do not mean 10,000 scans.
    wakes_at: Option<Instant>,
}

impl Watchdog {
    fn local(&self) -> &Local {
        self.local.get_or_init(Local::default)
    }

    /// Starts watching a held lock, starting the task when none runs in this process. Locks
    /// with the watchdog off are watched once someone waits on their `lost()` (or when they
    /// have a `max_hold`): they are never renewed, but that waiter hears that they are about
    /// to expire. Unwatched, their `Expiring` loss is applied when their status is read
    /// (`LockInner::current`).
    pub fn watch(&self, lock: &Arc<LockInner>) {
        let local = self.local();
        let id = local.next_id.fetch_add(1, Ordering::Relaxed);
        let event = {
            let s = lock.state();
            lock.next_event(&s)
        };
        let start = {
            let mut reg = local.registry.lock().unwrap_or_else(|p| p.into_inner());
            reg.locks.insert(id, Arc::downgrade(lock));
            !std::mem::replace(&mut reg.running, true)
        };
        if start {
            let shared = Arc::downgrade(&lock.shared);
            lock.shared.handle().spawn(run(shared));
        } else {
            self.reschedule(event);
        }
    }

    /// A registered lock needs looking at by `at`: wakes the task if it planned to sleep
    /// longer.
    pub fn reschedule(&self, at: Instant) {
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

async fn run(weak: Weak<Shared>) {
    loop {
        let Some(shared) = weak.upgrade() else { return };
        let local = shared.watchdog.local();
        let now = Instant::now();
        let mut due: Vec<Arc<LockInner>> = Vec::new();
        let mut wake_at = now + IDLE;
        {
            let mut reg = local.registry.lock().unwrap_or_else(|p| p.into_inner());
            crate::hooks::run(crate::hooks::Point::WatchdogScan, "");
            reg.locks.retain(|_, weak_lock| {
                let Some(lock) = weak_lock.upgrade() else {
                    return false;
                };
                match inspect(&lock, now) {
                    Next::Forget => false,
                    Next::RenewNow(lose_at) => {
                        // Renewed beside this loop; the loss deadline still bounds the sleep.
                        wake_at = wake_at.min(lose_at);
                        due.push(lock);
                        true
                    }
                    Next::At(t) => {
                        wake_at = wake_at.min(t);
                        true
                    }
                }
            });
            if reg.locks.is_empty() {
                reg.running = false;
                reg.wakes_at = None;
                return;
            }
            reg.wakes_at = Some(wake_at);
        }
        if !due.is_empty() {
            // Renewal runs beside the loop, so a slow batch never delays a loss signal.
            tokio::spawn(renew(shared.clone(), due));
        }
        let wake = local.wake.clone();
        drop(shared); // a sleeping watchdog must not keep its manager alive
        tokio::select! {
            _ = tokio::time::sleep_until(wake_at) => {}
            _ = wake.notified() => {}
        }
    }
}

enum Next {
    Forget,
    /// Renew in this tick; declare it lost at this instant if no renewal has confirmed.
    RenewNow(Instant),
    At(Instant),
}

/// Decides what one lock needs now: declared lost, renewed in this tick, or looked at later.
fn inspect(lock: &LockInner, now: Instant) -> Next {
    let mut s = lock.state();
    if s.status != LockStatus::Held {
        return Next::Forget;
    }
    let key = &lock.key;
    if let Some(max_hold) = lock.opts.max_hold {
        let end = lock.acquired_at + max_hold;
        if now >= end {
            drop(s);
            lock.finish(LockStatus::Lost(LossReason::MaxHold {
                key: key.clone(),
                max_hold,
            }));
            return Next::Forget;
        }
    }
    let lose_at = lock.lose_at(&s);
    if now >= lose_at {
        let reason = s.last_failure.clone().unwrap_or_else(|| {
            if lock.opts.watchdog {
                LossReason::RenewalTooSlow { key: key.clone() }
            } else {
                LossReason::Expiring {
                    key: key.clone(),
                    ttl: s.ttl,
                }
            }
        });
        drop(s);
        lock.finish(LockStatus::Lost(reason));
        return Next::Forget;
    }
    if lock.opts.watchdog && !s.renewing {
        // The task wakes at the first lock's renewal time and then renews every lock due
        // within the next half period as well: locks acquired at different moments end up in
        // one batch after their first renewal, so a tick is one pipeline per node. Retries
        // after a failure have no such slack.
        let due_from = match s.retry_at {
            Some(t) => t,
            None => s
                .next_renewal
                .checked_sub(s.ttl / 6)
                .unwrap_or(s.next_renewal),
        };
        if now >= due_from {
            s.renewing = true;
            return Next::RenewNow(lose_at);
        }
    }
    Next::At(lock.next_event(&s))
}

/// One lock of a batch: the guard that keeps its extend and release out, and the lease it is
/// renewed for.
struct Renewal {
    lock: Arc<LockInner>,
    _op: tokio::sync::OwnedMutexGuard<()>,
    lease: LockOptions,
}

/// Renews `due` with one pipeline per node, all nodes at once, then settles each lock.
async fn renew(shared: Arc<Shared>, due: Vec<Arc<LockInner>>) {
    let shared = &*shared;
    // A lock whose extend or release is in flight sits this tick out (release waits for a
    // renewal in flight, never the other way round); it is looked at again shortly, and
    // before its loss deadline in any case.
    let batch: Vec<Renewal> = due
        .into_iter()
        .filter_map(|lock| match lock.op.clone().try_lock_owned() {
            Ok(op) => {
                let lease = lock.lease(&lock.state());
                Some(Renewal {
                    lock,
                    _op: op,
                    lease,
                })
            }
            Err(_) => {
                let next = {
                    let mut s = lock.state();
                    s.renewing = false;
                    s.retry_at = Some(Instant::now() + retry_pause(&lock.lease(&s)));
                    lock.next_event(&s)
                };
                shared.watchdog.reschedule(next);
                None
            }
        })
        .collect();
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
    let per_node: Vec<Result<Vec<Value>, NodeError>> =
        futures::future::join_all(shared.nodes.iter().map(|node| {
            let batch = &batch;
            node.run(timeout, true, move |mut conn| async move {
                let mut pipe = redis::pipe();
                pipe.ignore_errors();
                for r in batch {
                    // Plain: compare-and-pexpire on the value. Reentrant: Redisson's renewal,
                    // compare-field-and-pexpire.
                    let script = if r.lock.opts.reentrant {
                        &*EXTEND_REENTRANT
                    } else {
                        &*EXTEND
                    };
                    pipe.cmd("EVALSHA")
                        .arg(script.get_hash())
                        .arg(1)
                        .arg(&r.lock.key)
                        .arg(&r.lock.token)
                        .arg(r.lease.ttl_millis());
                }
                let mut replies: Vec<Value> = pipe.query_async(&mut conn).await?;
                if replies.iter().any(is_noscript) {
                    // A restarted node forgot the scripts: load them once and send the batch again.
                    let _: String = EXTEND.load_async(&mut conn).await?;
                    if batch.iter().any(|r| r.lock.opts.reentrant) {
                        let _: String = EXTEND_REENTRANT.load_async(&mut conn).await?;
                    }
                    replies = pipe.query_async(&mut conn).await?;
                }
                Ok(replies)
            })
        }))
        .await;
    for (i, r) in batch.iter().enumerate() {
        let answers = per_node
            .iter()
            .map(|replies| match replies {
                Err(e) => Answer::Failed(e.clone()),
                Ok(replies) => match replies.get(i) {
                    Some(Value::Int(1)) => Answer::Yes(0),
                    Some(Value::Int(_)) => Answer::No,
                    Some(other) => Answer::Failed(NodeError::Redis(format!(
                        "unexpected renewal reply {other:?}"
                    ))),
                    None => Answer::Failed(NodeError::Redis("short pipeline reply".into())),
                },
            })
            .collect();
        let tally = Tally {
            quorum: shared.quorum,
            answers,
        };
        settle(shared, &r.lock, &r.lease, &tally, start);
        r.lock.state().renewing = false;
    }
}

/// How long after a failed (or skipped) renewal to try again: within what is left of the
/// validity.
fn retry_pause(lease: &LockOptions) -> Duration {
    (lease.ttl / 10).max(lease.effective_node_timeout() / 2)
}

fn settle(shared: &Shared, lock: &LockInner, lease: &LockOptions, tally: &Tally, start: Instant) {
    if tally.won() && lock.renewed(start, lease.ttl, lease.drift()).is_some() {
        lock.stats.renewals.fetch_add(1, Ordering::Relaxed);
        return;
    }
    lock.stats.renewal_failures.fetch_add(1, Ordering::Relaxed);
    let key = lock.key.clone();
    let n = tally.answers.len();
    if tally.no() > n - tally.quorum {
        // Our token is gone from too many nodes for any retry to succeed.
        lock.finish(LockStatus::Lost(LossReason::TokenGone {
            key,
            missing_on: tally.no(),
            nodes: n,
        }));
        return;
    }
    let failure = if tally.won() {
        LossReason::RenewalTooSlow { key }
    } else {
        LossReason::QuorumUnreachable {
            key,
            detail: tally.describe_failures(&shared.nodes),
        }
    };
    // Transient: retry soon, within what is left of the validity.
    let next = {
        let mut s = lock.state();
        s.last_failure = Some(failure);
        s.retry_at = Some(Instant::now() + retry_pause(lease));
        lock.next_event(&s)
    };
    shared.watchdog.reschedule(next);
}

fn is_noscript(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if e.code() == "NOSCRIPT")
}
