//! `LockManager`: the nodes, the quorum, and the acquire loop. One node is the
//! single-instance lock; N nodes are Redlock. It is one algorithm.

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::time::Instant;

use crate::error::{Error, ErrorKind, Result};
use crate::lock::{Lock, release_everywhere};
use crate::node::{Node, node_error};
use crate::options::{LockOptions, ManagerOptions};
use crate::quorum::{Answer, Tally, fan_out, yes_if};
use crate::scripts::{ACQUIRE_FENCED, RAISE_FENCE, fence_key};
use crate::watchdog::Watchdog;

/// After this many attempts in a row that found a majority of nodes unreachable, acquire
/// gives up with `QuorumUnreachable` instead of waiting out its budget: a dead cluster should
/// answer in well under a second, not block forever.
const UNREACHABLE_ATTEMPTS: u32 = 3;

pub(crate) struct Shared {
    pub nodes: Vec<Node>,
    pub quorum: usize,
    pub defaults: LockOptions,
    pub watchdog: Watchdog,
    /// `None`: the process runtime, looked up at each use so a forked child uses its own.
    handle: Option<Handle>,
}

impl Shared {
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
    shared: Arc<Shared>,
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
        Ok(LockManager {
            shared: Arc::new(Shared {
                nodes,
                quorum,
                defaults: options.lock,
                watchdog: Watchdog::default(),
                handle: Handle::try_current().ok(),
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

    /// Tries once (`wait` = 0).
    pub async fn try_acquire(&self, key: &str) -> Result<Lock> {
        let opts = self.shared.defaults.clone().wait(Some(Duration::ZERO));
        self.acquire_with(key, &opts).await
    }

    /// Acquires `key`, retrying after a jittered `retry_delay` until `wait` is spent.
    ///
    /// Dropping the returned future part-way releases whatever it had taken.
    pub async fn acquire_with(&self, key: &str, opts: &LockOptions) -> Result<Lock> {
        check_key(key)?;
        opts.validate()?;
        let started = Instant::now();
        let give_up_at = opts.wait.map(|w| started + w);
        let mut unreachable_streak = 0;
        loop {
            let token = new_token();
            let mut pending = PendingGrant {
                shared: Some(self.shared.clone()),
                key,
                token: &token,
                opts,
            };
            let started_attempt = Instant::now();
            let (tally, deadline, fence) = self.attempt(key, &token, opts).await;
            if tally.won() && Instant::now() < deadline && (fence.is_some() || !opts.fencing) {
                pending.shared = None;
                return Ok(Lock::new(
                    self.shared.clone(),
                    key.to_string(),
                    token.clone(),
                    opts.clone(),
                    deadline,
                    started_attempt,
                    fence,
                ));
            }
            // Release wherever we may hold it (a yes, or an answer we never saw); a node that
            // said no holds nothing of ours.
            let maybe_ours: Vec<bool> = tally
                .answers
                .iter()
                .map(|a| !matches!(a, Answer::No))
                .collect();
            if maybe_ours.iter().any(|&m| m) {
                release_everywhere(&self.shared, key, &token, opts, Some(&maybe_ours)).await;
            }
            pending.shared = None;

            if let Some((i, e)) = tally.redis_error() {
                return Err(node_error(
                    ErrorKind::Redis,
                    &format!("lock {key:?}: acquire failed"),
                    &self.shared.nodes[i],
                    e,
                ));
            }
            unreachable_streak = if tally.quorum_unreachable() {
                unreachable_streak + 1
            } else {
                0
            };
            let now = Instant::now();
            let out_of_time = give_up_at.is_some_and(|end| now >= end);
            if unreachable_streak >= UNREACHABLE_ATTEMPTS || (out_of_time && unreachable_streak > 0)
            {
                return Err(self.unreachable_error(key, &tally));
            }
            if out_of_time {
                return Err(self.not_acquired_error(key, opts, &tally, deadline));
            }
            let mut pause = jitter(opts.retry_delay);
            if let Some(end) = give_up_at {
                pause = pause.min(end - now);
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// One round: `SET key token NX PX ttl` on every node at once. Returns the tally, the
    /// validity deadline (start + ttl - drift, on the monotonic clock) and, with fencing, the
    /// fence (`None` when it could not be made durable on a quorum).
    async fn attempt(
        &self,
        key: &str,
        token: &str,
        opts: &LockOptions,
    ) -> (Tally, Instant, Option<u64>) {
        let start = Instant::now();
        let deadline = start + opts.ttl - opts.drift();
        let timeout = opts.effective_node_timeout();
        let ttl_ms = opts.ttl_millis();
        let nodes = &self.shared.nodes;
        let quorum = self.shared.quorum;
        if !opts.fencing {
            let tally = fan_out(nodes, quorum, true, |_, node| {
                node.run(timeout, true, move |mut conn| async move {
                    let reply: Option<String> = redis::cmd("SET")
                        .arg(key)
                        .arg(token)
                        .arg("NX")
                        .arg("PX")
                        .arg(ttl_ms)
                        .query_async(&mut conn)
                        .await?;
                    Ok(yes_if(reply.is_some()))
                })
            })
            .await;
            return (tally, deadline, None);
        }
        // Fencing. One node: INCR in the acquire script is the order. N nodes: read the
        // counters of the granting quorum, take max + 1, and raise a quorum's counters to it
        // while they still hold our token. Any later grant's quorum shares a node with that
        // raise quorum, and that node grants again only after our key is gone there, so it
        // reads a counter >= our fence. (The max over *different* quorums alone would not be
        // monotonic.)
        let fence_key = fence_key(key);
        let fence_key = fence_key.as_str();
        let incr = if nodes.len() == 1 { "1" } else { "0" };
        let tally = fan_out(nodes, quorum, true, |_, node| {
            node.run(timeout, true, move |mut conn| async move {
                let counter: i64 = ACQUIRE_FENCED
                    .key(key)
                    .key(fence_key)
                    .arg(token)
                    .arg(ttl_ms)
                    .arg(incr)
                    .invoke_async(&mut conn)
                    .await?;
                Ok((counter >= 0).then_some(counter))
            })
        })
        .await;
        if !tally.won() {
            return (tally, deadline, None);
        }
        let seen = u64::try_from(tally.max_yes_value()).unwrap_or(0);
        if nodes.len() == 1 {
            return (tally, deadline, Some(seen));
        }
        let fence = seen + 1;
        let raised = fan_out(nodes, quorum, true, |_, node| {
            node.run(timeout, true, move |mut conn| async move {
                let ok: i64 = RAISE_FENCE
                    .key(key)
                    .key(fence_key)
                    .arg(token)
                    .arg(fence)
                    .invoke_async(&mut conn)
                    .await?;
                Ok(yes_if(ok == 1))
            })
        })
        .await;
        (tally, deadline, raised.won().then_some(fence))
    }

    fn unreachable_error(&self, key: &str, tally: &Tally) -> Error {
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

    fn not_acquired_error(
        &self,
        key: &str,
        opts: &LockOptions,
        tally: &Tally,
        deadline: Instant,
    ) -> Error {
        let waited = match opts.wait {
            Some(w) if w.is_zero() => "on the first try (wait=0)".to_string(),
            Some(w) => format!("within wait={w:?}"),
            None => "before giving up".to_string(),
        };
        let why = if tally.won() {
            format!(
                "a quorum granted it but the acquire took longer than the validity (ttl {:?} minus drift {:?}), so it was released",
                opts.ttl,
                opts.drift()
            )
        } else {
            let _ = deadline;
            format!(
                "held by another owner on {} of {} nodes",
                tally.no(),
                tally.answers.len()
            )
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

/// Undoes a partial grant when the acquire future is dropped between sending its SETs and
/// either handing out the lock or finishing the release of a failed attempt.
struct PendingGrant<'a> {
    shared: Option<Arc<Shared>>,
    key: &'a str,
    token: &'a str,
    opts: &'a LockOptions,
}

impl Drop for PendingGrant<'_> {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            let (key, token, opts) = (
                self.key.to_string(),
                self.token.to_string(),
                self.opts.clone(),
            );
            shared.handle().spawn(async move {
                release_everywhere(&shared, &key, &token, &opts, None).await;
            });
        }
    }
}

pub(crate) fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::invalid("lock key must not be empty"));
    }
    Ok(())
}

/// 128 bits from the operating system's CSPRNG, per acquisition attempt. Not a userspace
/// generator: its state would be duplicated by fork and hand two processes the same token.
pub(crate) fn new_token() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the operating system's random source failed");
    let mut s = String::with_capacity(32);
    for b in bytes {
        s.push(char::from_digit((b >> 4) as u32, 16).unwrap_or('0'));
        s.push(char::from_digit((b & 15) as u32, 16).unwrap_or('0'));
    }
    s
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
