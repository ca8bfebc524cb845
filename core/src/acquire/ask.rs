//! One node's request of an attempt: the plain `SET NX` or the kind's acquire script, and
//! what its answer counts as.

use std::sync::Arc;

use redis::Value;
use tokio::time::Instant;

use super::attempt::Req;
use super::kind::Kind;
use super::reply::{NO_HINT, Reply, parse_reply};
use crate::error::Result;
use crate::error::Shown;
use crate::node::NodeError;
use crate::queue::{QueueArgs, barge_bound_ms, quiet_grace_ms};
use crate::refusal::Refusal;
use crate::scripts::{Acquire, AcquireRead, AcquireReentrant, AcquireWrite, command};
use crate::shared::Shared;

pub(super) async fn ask(
    shared: Arc<Shared>,
    req: Arc<Req>,
    i: usize,
    deadline: Instant,
) -> Result<Option<i64>, NodeError> {
    let r = &*req;
    let opts = &r.opts;
    let timeout = opts.effective_node_timeout();
    let ttl_ms = opts.ttl_millis();
    let (key, token) = (r.key.as_str(), r.token.as_str());
    let n = shared.cluster.nodes.len();
    let node = &shared.cluster.nodes[i];
    if r.queue.is_some()
        && let Some(hook) = crate::hooks::off_thread(crate::hooks::Point::QueuedSending, key)
    {
        let _ = hook.await;
    }
    node.slot_guarded(key)?;
    let reply = node
        .run_bounded(deadline, timeout, true, move |mut conn| async move {
            if r.plain_set {
                // A `Value`, not a `String`: "OK" needs no allocation of its own.
                let reply: Value = command("SET", 5, key.len() + token.len() + 24)
                    .arg(key)
                    .arg(token)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl_ms)
                    .query_async(&mut conn)
                    .await?;
                if reply != Value::Nil {
                    return Ok(Ok(Value::Nil));
                }
                // Busy, our own grant (this SET ran already and was sent again after its
                // connection dropped: redis-rs re-sends on a cluster, `Node` on a server), or
                // taken by a key of a type no lock has, which would never be released (the
                // scripts check it themselves). One round trip, paid only by a busy first try.
                let replies: Vec<Value> = redis::pipe()
                    .ignore_errors()
                    .cmd("GET")
                    .arg(key)
                    .cmd("TYPE")
                    .arg(key)
                    .cmd("PTTL")
                    .arg(key)
                    .query_async(&mut conn)
                    .await?;
                let [holder, kind, pttl]: [Value; 3] = replies.try_into().map_err(|_| {
                    redis::RedisError::from((
                        redis::ErrorKind::Client,
                        "unexpected reply",
                        "GET, TYPE, PTTL did not answer three replies".to_string(),
                    ))
                })?;
                // GET fails with WRONGTYPE on a reentrant lock's hash: someone else's.
                if matches!(&holder, Value::BulkString(b) if b == token.as_bytes()) {
                    return Ok(Ok(Value::Nil));
                }
                let kind: String = redis::from_redis_value(kind)?;
                let pttl: i64 = redis::from_redis_value(pttl)?;
                if kind != "string" && kind != "hash" && kind != "none" {
                    return Ok(Err(Refusal::OtherKind(Some(format!("a {kind}")))));
                }
                if pttl == -1 && matches!(&holder, Value::BulkString(v) if is_counter(v)) {
                    return Ok(Err(Refusal::OtherKind(Some(
                        "a semaphore's permit counter".to_string(),
                    ))));
                }
                // Busy with no re-check hint (the waiter's queued re-check gets the PTTL),
                // unless the holder has no TTL at all (a leaked lock, for the error).
                return Ok(Ok(Value::Int(if pttl == -1 { -1 } else { NO_HINT })));
            }
            // Built in a block: only the invocation lives across the await.
            let inv = {
                let place = r.queue.as_ref().map(QueueArgs::place).unwrap_or_default();
                let bound_ms = barge_bound_ms(n);
                match Kind::of(opts) {
                    Kind::Read => AcquireRead {
                        key,
                        names: &r.names,
                        ttl_ms,
                        field: token,
                        place,
                        reentry: r.reentry,
                        bound_ms,
                        hold: &r.call,
                        keep_place: r.queue.as_ref().is_some_and(|q| q.keep),
                    }
                    .invocation(),
                    Kind::Write => AcquireWrite {
                        key,
                        names: &r.names,
                        ttl_ms,
                        field: token,
                        fence_mode: r.fence_mode,
                        place,
                        reentry: r.reentry,
                        bound_ms,
                        hold: &r.call,
                    }
                    .invocation(),
                    Kind::Reentrant => AcquireReentrant {
                        key,
                        names: &r.names,
                        ttl_ms,
                        field: token,
                        fence_mode: r.fence_mode,
                        place,
                        reentry: r.reentry,
                        bound_ms,
                        hold: &r.call,
                    }
                    .invocation(),
                    // Acquired by `semaphore.rs`, never through this path.
                    Kind::Permits => unreachable!("a semaphore is acquired by semaphore.rs"),
                    Kind::Plain => Acquire {
                        key,
                        names: &r.names,
                        token,
                        ttl_ms,
                        fence_mode: r.fence_mode,
                        place,
                        bound_ms,
                        wake_prefix: &r.wake_prefix,
                        grace_ms: if n == 1 { quiet_grace_ms() } else { 0 },
                        quiet: r.quiet,
                    }
                    .invocation(conn.sharded()),
                }
            };
            // Boxed: the queue path is off the uncontended hot path, and its future would
            // size every node's request.
            let value: Value = Box::pin(inv.invoke_async(&mut conn)).await?;
            Ok(Ok(value))
        })
        .await?
        .map_err(|r| NodeError::Refused(r.clone(), r.to_string()))?;
    // Parsed first: an error reply is the answer to report. The guard's check comes before
    // the answer counts; a grant it holds back is undone (`undo_now_mask`).
    let reply = parse_reply(reply)?;
    if node.guards_slots() {
        // Boxed: only a cluster with the restart guard on pays for its probe's future.
        Box::pin(node.confirm_primary(key, deadline, timeout)).await?;
    }
    match reply {
        // A fence-less grant is never fence 0: the answer is an error, and the grant undone.
        Reply::Granted(None) if r.fencing() => Err(NodeError::Redis(format!(
            "lock {key:?}: a fenced grant was answered without a fence",
            key = Shown(key)
        ))),
        Reply::Granted(counter) => Ok(Some(counter.unwrap_or(0))),
        Reply::Busy(hint) => {
            let mut hints = r.hints.lock().unwrap_or_else(|p| p.into_inner());
            hints.resize(n, None);
            hints[i] = Some(hint);
            Ok(None)
        }
    }
}

/// A semaphore's permit counter (Redisson's layout: a short decimal number with no TTL, never
/// deleted), as `queue.lua`'s `is_counter` tells it: a lock on its name would wait forever.
fn is_counter(value: &[u8]) -> bool {
    !value.is_empty() && value.len() <= 10 && value.iter().all(u8::is_ascii_digit)
}
