//! `ferrolock inspect KEY` and `ferrolock scan [PATTERN]`: what an operator asks first (who
//! holds this lock? which locks leaked without a ttl?). Read-only: neither writes anything,
//! and node URLs are shown with passwords redacted.

use std::time::Duration;

use ferrolock::{ManagerOptions, fence_key, queue_key, queue_lease_key, redact_url};
use redis::{Connection, Value};
use serde_json::{Value as Json, json};

use crate::exit;

#[derive(clap::Args)]
pub struct InspectArgs {
    /// Comma-separated node URLs [default: $FERROLOCK_NODES, else redis://127.0.0.1:6379]
    #[arg(long, value_name = "URLS")]
    nodes: Option<String>,
    /// Print JSON instead of text
    #[arg(long)]
    json: bool,
    /// The lock's key
    key: String,
}

#[derive(clap::Args)]
pub struct ScanArgs {
    /// Comma-separated node URLs [default: $FERROLOCK_NODES, else redis://127.0.0.1:6379]
    #[arg(long, value_name = "URLS")]
    nodes: Option<String>,
    /// Print JSON instead of text
    #[arg(long)]
    json: bool,
    /// Flag locks whose remaining ttl is longer than this (a lease that long holds its key at
    /// least that long) [default: 1h]
    #[arg(long, value_name = "DURATION", value_parser = ferrolock::parse_duration)]
    long: Option<Duration>,
    /// Keys to look at (Redis glob) [default: *]
    pattern: Option<String>,
}

const DEFAULT_LONG: Duration = Duration::from_secs(3600);
/// Keys asked for per SCAN step: never KEYS, which blocks the server.
const SCAN_COUNT: usize = 1000;

fn nodes(list: &Option<String>) -> Vec<String> {
    ManagerOptions::new()
        .nodes(
            list.as_deref()
                .map(ferrolock::split_nodes)
                .unwrap_or_default(),
        )
        .resolved_nodes()
}

fn connect(url: &str) -> Result<Connection, String> {
    let shown = redact_url(url);
    let client = redis::Client::open(url).map_err(|e| format!("bad node URL {shown:?}: {e}"))?;
    client
        .get_connection_with_timeout(Duration::from_secs(2))
        .map_err(|e| format!("node {shown}: {e}"))
}

fn report(json: bool, out: Json, text: String) -> u8 {
    if json {
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    } else {
        print!("{text}");
    }
    0
}

pub fn inspect(args: InspectArgs) -> u8 {
    if args.key.is_empty() {
        eprintln!("ferrolock: the lock key must not be empty");
        return exit::USAGE;
    }
    let mut out = Vec::new();
    let mut text = String::new();
    let mut failed = 0;
    for url in nodes(&args.nodes) {
        let shown = redact_url(&url);
        let node = match connect(&url).and_then(|mut c| describe(&mut c, &args.key)) {
            Ok(node) => node,
            Err(e) => {
                failed += 1;
                text.push_str(&format!("{shown}: error: {e}\n"));
                out.push(json!({ "node": shown, "error": e }));
                continue;
            }
        };
        text.push_str(&format!("{shown}:\n{}", node_text(&node)));
        let mut node = node;
        node["node"] = json!(shown);
        out.push(node);
    }
    report(
        args.json,
        json!({ "key": args.key, "nodes": out }),
        format!("lock {:?}\n{text}", args.key),
    );
    if failed > 0 { exit::UNAVAILABLE } else { 0 }
}

/// One node's view of a lock key, as JSON.
fn describe(c: &mut Connection, key: &str) -> Result<Json, String> {
    let q = |cmd: &mut redis::Cmd, c: &mut Connection| -> Result<Value, String> {
        cmd.query(c).map_err(|e| e.to_string())
    };
    let kind: String = redis::cmd("TYPE")
        .arg(key)
        .query(c)
        .map_err(|e| e.to_string())?;
    let pttl: i64 = redis::cmd("PTTL")
        .arg(key)
        .query(c)
        .map_err(|e| e.to_string())?;
    let holder = match kind.as_str() {
        "string" => json!({ "token": text_of(&q(redis::cmd("GET").arg(key), c)?) }),
        "hash" => {
            let fields = q(redis::cmd("HGETALL").arg(key), c)?;
            let mut owners = serde_json::Map::new();
            if let Value::Array(items) | Value::Set(items) = fields {
                for pair in items.chunks(2) {
                    if let [f, v] = pair {
                        owners.insert(text_of(f), json!(text_of(v)));
                    }
                }
            } else if let Value::Map(pairs) = fields {
                for (f, v) in pairs {
                    owners.insert(text_of(&f), json!(text_of(&v)));
                }
            }
            json!({ "owners": owners })
        }
        _ => Json::Null,
    };
    let fence = text_of(&q(redis::cmd("GET").arg(fence_key(key)), c)?);
    let waiters = q(
        redis::cmd("ZRANGE")
            .arg(queue_key(key))
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES"),
        c,
    )?;
    let leases = q(
        redis::cmd("ZRANGE")
            .arg(queue_lease_key(key))
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES"),
        c,
    )?;
    let lease_of = pairs(&leases);
    let queue: Vec<Json> = pairs(&waiters)
        .into_iter()
        .map(|(id, score)| {
            let lease = lease_of
                .iter()
                .find(|(w, _)| *w == id)
                .map(|(_, l)| l.clone());
            json!({ "waiter": id, "score": score, "lease_ends_ms": lease })
        })
        .collect();
    Ok(json!({
        "type": kind,
        "pttl_ms": pttl,
        "holder": holder,
        "fence": if fence.is_empty() { Json::Null } else { json!(fence) },
        "waiters": queue,
    }))
}

fn node_text(n: &Json) -> String {
    let mut s = String::new();
    let kind = n["type"].as_str().unwrap_or("?");
    if kind == "none" {
        s.push_str("  free (no such key)\n");
    } else {
        s.push_str(&format!("  type: {kind}\n"));
        match n["pttl_ms"].as_i64() {
            Some(-1) => s.push_str("  ttl: NONE (the key never expires: a leaked lock)\n"),
            Some(ms) => s.push_str(&format!("  ttl: {ms} ms\n")),
            None => {}
        }
        if let Some(t) = n["holder"]["token"].as_str() {
            s.push_str(&format!("  holder token: {t}\n"));
        }
        if let Some(owners) = n["holder"]["owners"].as_object() {
            for (field, count) in owners {
                s.push_str(&format!(
                    "  owner {field}: hold count {}\n",
                    count.as_str().unwrap_or("?")
                ));
            }
        }
    }
    if let Some(f) = n["fence"].as_str() {
        s.push_str(&format!("  fence counter: {f}\n"));
    }
    let waiters = n["waiters"].as_array().map_or(&[][..], |v| v.as_slice());
    if waiters.is_empty() {
        s.push_str("  waiters: none\n");
    } else {
        s.push_str(&format!(
            "  waiters ({}, first in line first):\n",
            waiters.len()
        ));
        for w in waiters {
            s.push_str(&format!("    {}\n", w["waiter"].as_str().unwrap_or("?")));
        }
    }
    s
}

fn text_of(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        Value::Double(d) => d.to_string(),
        _ => String::new(),
    }
}

fn pairs(v: &Value) -> Vec<(String, String)> {
    match v {
        Value::Array(items) => items
            .chunks(2)
            .filter_map(|p| match p {
                [a, b] => Some((text_of(a), text_of(b))),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

pub fn scan(args: ScanArgs) -> u8 {
    let pattern = args.pattern.clone().unwrap_or_else(|| "*".to_string());
    let long = args.long.unwrap_or(DEFAULT_LONG);
    let mut out = Vec::new();
    let mut text = String::new();
    let mut failed = 0;
    for url in nodes(&args.nodes) {
        let shown = redact_url(&url);
        match connect(&url).and_then(|mut c| scan_node(&mut c, &pattern)) {
            Ok(found) => {
                text.push_str(&format!("{shown}: {} lock(s)\n", found.len()));
                for lock in &found {
                    let flag = match lock.pttl_ms {
                        -1 => "  LEAKED: no ttl".to_string(),
                        ms if ms as u128 > long.as_millis() => {
                            format!("  LONG: ttl over {long:?}")
                        }
                        _ => String::new(),
                    };
                    text.push_str(&format!(
                        "  {:?}  {}  ttl {}{flag}\n",
                        lock.key,
                        lock.kind,
                        if lock.pttl_ms < 0 {
                            "none".to_string()
                        } else {
                            format!("{} ms", lock.pttl_ms)
                        }
                    ));
                    out.push(json!({
                        "node": shown,
                        "key": lock.key,
                        "kind": lock.kind,
                        "pttl_ms": lock.pttl_ms,
                        "leaked": lock.pttl_ms == -1,
                        "long": lock.pttl_ms as i128 > long.as_millis() as i128,
                    }));
                }
            }
            Err(e) => {
                failed += 1;
                text.push_str(&format!("{shown}: error: {e}\n"));
                out.push(json!({ "node": shown, "error": e }));
            }
        }
    }
    report(args.json, json!({ "pattern": pattern, "locks": out }), text);
    if failed > 0 { exit::UNAVAILABLE } else { 0 }
}

struct Found {
    key: String,
    kind: &'static str,
    pttl_ms: i64,
}

/// Keys that look like locks: a string holding a 32-hex-digit token (ferrolock, redis-py,
/// node-redlock), or a hash whose fields are `<uuid>:<thread id>` with counts (Redisson's RLock
/// layout, ferrolock's reentrant lock). ferrolock's own queue and fence keys are skipped.
fn scan_node(c: &mut Connection, pattern: &str) -> Result<Vec<Found>, String> {
    let mut found = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT)
            .query(c)
            .map_err(|e| e.to_string())?;
        for key in keys {
            if key.starts_with("ferrolock:") {
                continue;
            }
            let kind: String = redis::cmd("TYPE")
                .arg(&key)
                .query(c)
                .map_err(|e| e.to_string())?;
            let looks = match kind.as_str() {
                "string" => {
                    let v: Option<Vec<u8>> = redis::cmd("GET")
                        .arg(&key)
                        .query(c)
                        .map_err(|e| e.to_string())?;
                    v.is_some_and(|v| v.len() == 32 && v.iter().all(u8::is_ascii_hexdigit))
                        .then_some("plain (ferrolock, redis-py, node-redlock)")
                }
                "hash" => {
                    let fields: Vec<(String, String)> = redis::cmd("HGETALL")
                        .arg(&key)
                        .query(c)
                        .map_err(|e| e.to_string())?;
                    (!fields.is_empty()
                        && fields.iter().all(|(f, v)| {
                            v.parse::<i64>().is_ok()
                                && f.rsplit_once(':').is_some_and(|(uuid, id)| {
                                    uuid.len() >= 32 && id.parse::<i64>().is_ok()
                                })
                        }))
                    .then_some("reentrant (Redisson RLock layout)")
                }
                _ => None,
            };
            if let Some(kind) = looks {
                let pttl_ms: i64 = redis::cmd("PTTL")
                    .arg(&key)
                    .query(c)
                    .map_err(|e| e.to_string())?;
                found.push(Found { key, kind, pttl_ms });
            }
        }
        cursor = next;
        if cursor == 0 {
            return Ok(found);
        }
    }
}
