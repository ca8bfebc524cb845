//! `ferrolock inspect KEY` and `ferrolock scan [PATTERN]`: what an operator asks first (who
//! holds this lock? which locks leaked without a ttl?), on servers or on a cluster's primaries
//! (`cluster.rs`). Read-only: neither writes anything, and node URLs are shown with passwords
//! redacted.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use ferrolock::{
    LockManager, ManagerOptions, fence_key, queue_key, queue_lease_key, quoted_key, redact_url,
    rwlock_timeout_prefix, semaphore_timeout_key,
};
use redis::Value;
use serde_json::{Value as Json, json};

use crate::cluster::{self, Server, Target, reply_error};
use crate::exit;

#[derive(clap::Args)]
pub struct InspectArgs {
    /// Comma-separated node URLs [default: $FERROLOCK_NODES, else redis://127.0.0.1:6379]
    #[arg(long, value_name = "URLS")]
    nodes: Option<String>,
    /// Print JSON instead of text
    #[arg(long)]
    json: bool,
    /// CA file (PEM) for rediss:// nodes [default: $FERROLOCK_TLS_CA, else the system's roots]
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<std::path::PathBuf>,
    /// The lock's key
    // Not `String`: clap's own refusal of a name that is not UTF-8 named neither the argument
    // nor its value.
    key: std::ffi::OsString,
}

#[derive(clap::Args)]
pub struct ScanArgs {
    /// Comma-separated node URLs [default: $FERROLOCK_NODES, else redis://127.0.0.1:6379]
    #[arg(long, value_name = "URLS")]
    nodes: Option<String>,
    /// Print JSON instead of text
    #[arg(long)]
    json: bool,
    /// CA file (PEM) for rediss:// nodes [default: $FERROLOCK_TLS_CA, else the system's roots]
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<std::path::PathBuf>,
    /// Flag locks held longer than this: ferrolock's plain locks from the grant time in their
    /// token; other layouts, which record none, when their remaining ttl is longer [default: 1h]
    // Hyphen values reach the parser, so `--long -1h` is named as a bad duration rather than
    // reported as an unknown flag `-1` (as `run`'s durations).
    #[arg(long, value_name = "DURATION", value_parser = ferrolock::parse_duration, allow_hyphen_values = true)]
    long: Option<Duration>,
    /// Keys to look at (Redis glob) [default: *]
    // Bytes, as Redis matches them: a pattern of a name that is not UTF-8 finds it.
    pattern: Option<std::ffi::OsString>,
}

const DEFAULT_LONG: Duration = Duration::from_secs(3600);
/// Keys asked for per SCAN step: never KEYS, which blocks the server.
const SCAN_COUNT: usize = 1000;

/// The node list, checked by the rules `run` applies (a malformed, empty or repeated URL is
/// bad usage, exit 64, not an unreachable node, and so is a CA file that cannot serve its TLS
/// nodes); building the manager opens no connection. The CA file in force is then the one
/// `connect` trusts for rediss:// nodes.
fn nodes(list: &Option<String>, tls_ca: &Option<std::path::PathBuf>) -> Result<Vec<String>, u8> {
    let mut options = ManagerOptions::new();
    options.nodes = list.as_deref().map(ferrolock::split_nodes);
    options.tls_ca = tls_ca.clone();
    match LockManager::new(options.clone()).and_then(|_| options.resolved_nodes()) {
        Ok(urls) => {
            cluster::use_tls_ca(options.resolved_tls_ca());
            Ok(urls)
        }
        Err(e) => {
            errln!("ferrolock: {e} [{}]", e.kind().code());
            Err(exit::USAGE)
        }
    }
}

/// Prints the result on stdout; `Err` with the exit code when it cannot be written. A reader
/// that went away (`ferrolock scan | head -1`) ends us quietly, as SIGPIPE ends other tools
/// (we ignore SIGPIPE, so the write fails instead).
fn report(json: bool, out: Json, text: String) -> Result<(), u8> {
    use std::io::Write as _;
    let text = if json {
        format!(
            "{}\n",
            serde_json::to_string_pretty(&out).unwrap_or_default()
        )
    } else {
        text
    };
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(exit::BROKEN_PIPE),
        Err(e) => {
            errln!("ferrolock: cannot write the output: {e}");
            Err(exit::IOERR)
        }
    }
}

pub fn inspect(args: InspectArgs) -> u8 {
    let key = match crate::key_text(&args.key) {
        Ok(key) => key,
        Err(e) => {
            errln!("ferrolock: {e}");
            return exit::USAGE;
        }
    };
    if key.is_empty() {
        errln!("ferrolock: the lock key must not be empty");
        return exit::USAGE;
    }
    let urls = match nodes(&args.nodes, &args.tls_ca) {
        Ok(urls) => urls,
        Err(code) => return code,
    };
    let mut out = Vec::new();
    let mut text = String::new();
    let mut failed = 0;
    for node in servers(urls) {
        let (shown, node) = match node {
            Node::SameCluster(shown, first) => {
                text.push_str(&same_cluster(&shown, &first));
                continue;
            }
            Node::Failed(shown, e) => (shown, Err(e)),
            Node::Servers(shown, targets) => match owner_of(targets, key) {
                Ok(t) => (
                    t.shown,
                    Server::connect(&t.url).and_then(|mut c| describe(&mut c, key)),
                ),
                Err(e) => (shown, Err(e)),
            },
        };
        let node = match node {
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
    let title = format!("{} {}\n{text}", noun(&out), quoted_key(key));
    if let Err(code) = report(args.json, json!({ "key": key, "nodes": out }), title) {
        return code;
    }
    if failed > 0 { exit::UNAVAILABLE } else { 0 }
}

/// The kind of a key of a type no lock has (a list, a set, a zset, a stream).
const NOT_A_LOCK: &str = "not a lock";

/// What the key is, for `inspect`'s title, from the layouts the nodes found there: a
/// semaphore (or a number that may be one) or a read-write lock is not called a lock.
fn noun(nodes: &[Json]) -> &'static str {
    let kinds: Vec<&str> = nodes
        .iter()
        .filter_map(|n| n["holder"]["kind"].as_str())
        .collect();
    [
        "semaphore",
        "semaphore or counter",
        "read-write",
        NOT_A_LOCK,
    ]
    .into_iter()
    .find(|k| kinds.contains(k))
    .map_or("lock", |k| match k {
        "read-write" => "read-write lock",
        k => k,
    })
}

/// The server that holds `key` among the servers behind one node URL: the server itself, or
/// the cluster primary that serves the key's slot.
fn owner_of(mut targets: Vec<Target>, key: &str) -> Result<Target, String> {
    if targets.len() == 1 && targets[0].slots.is_empty() {
        return Ok(targets.remove(0));
    }
    let slot = ferrolock::cluster_key_slot(key);
    let i = targets
        .iter()
        .position(|t| cluster::serves(t, slot))
        .ok_or_else(|| format!("no primary serves slot {slot} of {}", quoted_key(key)))?;
    Ok(targets.swap_remove(i))
}

/// One node's view of a lock key, as JSON.
fn describe(c: &mut Server, key: &str) -> Result<Json, String> {
    let q = |cmd: &mut redis::Cmd, c: &mut Server| -> Result<Value, String> {
        cmd.query(c).map_err(reply_error)
    };
    let kind: String = redis::cmd("TYPE").arg(key).query(c).map_err(reply_error)?;
    let pttl: i64 = redis::cmd("PTTL").arg(key).query(c).map_err(reply_error)?;
    let holder = match kind.as_str() {
        "string" => match string_value(c, key.as_bytes())? {
            (start, Some(len)) => json!({
                "token": String::from_utf8_lossy(&start),
                "token_bytes": len,
                "held_ms": null,
            }),
            (value, None) => {
                let token = String::from_utf8_lossy(&value).into_owned();
                // Below zero too: Redisson's addPermits(-n) shrinks a pool under its holders
                // (it was shown as a plain lock whose token was "-1").
                match token.parse::<i64>() {
                    Ok(available) => semaphore(c, key, available)?,
                    Err(_) => json!({ "token": token, "held_ms": held_ms(&token) }),
                }
            }
        },
        "hash" => {
            let fields = hash_fields(c, key.as_bytes())?;
            if is_read_write(&fields) {
                read_write(fields, c, key)?
            } else if is_reentrant(&fields) {
                let owners: serde_json::Map<String, Json> = fields
                    .iter()
                    .map(|(f, v)| {
                        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
                        (text(f), json!(text(v)))
                    })
                    .collect();
                json!({ "owners": owners })
            } else {
                // A settings hash that never expires is no leaked lock: laid out as none, it
                // is not one, as a list is not (and `scan` does not list it).
                json!({ "kind": NOT_A_LOCK })
            }
        }
        // A list, a set, ...: what an acquire refuses ("the key holds a list, not a lock"),
        // not a lock of any layout, leaked or not.
        "none" => Json::Null,
        _ => json!({ "kind": NOT_A_LOCK }),
    };
    // ferrolock keeps a fence counter and a queue only for a key its derived names share a
    // slot with (the core refuses `job}3`): another client's lock under such a key has none,
    // and asking for them in another slot failed the node on a Redis Cluster (MOVED).
    let (fence, waiters, leases) = if has_slot_tag(key) {
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
        (fence, waiters, leases)
    } else {
        (String::new(), Value::Nil, Value::Nil)
    };
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

/// Whether names derived from `key` (its fence counter, its queue) share its Redis Cluster
/// slot, the core's rule for the keys it locks: it contains no `}`, or has a hash tag.
fn has_slot_tag(key: &str) -> bool {
    let tag = key
        .find('{')
        .is_some_and(|open| key[open + 1..].find('}').is_some_and(|len| len > 0));
    !key.contains('}') || tag
}

/// A hash's fields and values, as bytes.
type Fields = Vec<(Vec<u8>, Vec<u8>)>;

/// The longest name or value of a lock's key read whole: a token (ferrolock's has 33 bytes,
/// redis-py's 32), a count, a hash's `<uuid>:<owner id>`. A longer value is no lock's, and is
/// not read whole (a 100 MB string under a name that looks like a lock was, by GET).
const VALUE_MAX: u64 = 128;

/// The most fields of a hash read as a lock's (a reentrant lock's owners, a read-write lock's
/// readers).
const FIELDS_MAX: u64 = 1024;

/// The string at `key`: its value, or, when longer than a lock's, its first `VALUE_MAX`
/// bytes and its length.
fn string_value(c: &mut Server, key: &[u8]) -> Result<(Vec<u8>, Option<u64>), String> {
    let len: u64 = redis::cmd("STRLEN")
        .arg(key)
        .query(c)
        .map_err(reply_error)?;
    if len <= VALUE_MAX {
        let value: Option<Vec<u8>> = redis::cmd("GET").arg(key).query(c).map_err(reply_error)?;
        return Ok((value.unwrap_or_default(), None));
    }
    let start: Vec<u8> = redis::cmd("GETRANGE")
        .arg(key)
        .arg(0)
        .arg(VALUE_MAX - 1)
        .query(c)
        .map_err(reply_error)?;
    Ok((start, Some(len)))
}

/// The fields of the hash at `key`, as bytes; none when it is laid out as no lock, found from
/// its size and its names before any value is read (a hash of user data can be large).
fn hash_fields(c: &mut Server, key: &[u8]) -> Result<Fields, String> {
    let count: u64 = redis::cmd("HLEN").arg(key).query(c).map_err(reply_error)?;
    if count > FIELDS_MAX {
        return Ok(Vec::new());
    }
    let names: Vec<Vec<u8>> = redis::cmd("HKEYS").arg(key).query(c).map_err(reply_error)?;
    let named = names.iter().any(|f| f == b"mode") || names.iter().all(|f| is_owner_field(f));
    if !named || names.iter().any(|f| f.len() as u64 > VALUE_MAX) {
        return Ok(Vec::new());
    }
    for name in &names {
        let len: u64 = redis::cmd("HSTRLEN")
            .arg(key)
            .arg(name)
            .query(c)
            .map_err(reply_error)?;
        if len > VALUE_MAX {
            return Ok(Vec::new());
        }
    }
    redis::cmd("HGETALL").arg(key).query(c).map_err(reply_error)
}

/// Whether a hash is laid out as a read-write lock (Redisson's RReadWriteLock): `mode` `read`
/// or `write`, beside hold counts. Not any hash with a `mode` field: a user's settings hash
/// without a ttl was listed as a leaked read-write lock.
fn is_read_write(fields: &Fields) -> bool {
    let mode = fields
        .iter()
        .find(|(f, _)| f == b"mode")
        .is_some_and(|(_, v)| v == b"read" || v == b"write");
    mode && fields
        .iter()
        .filter(|(f, _)| f != b"mode")
        .all(|(_, v)| utf8(v).is_some_and(|v| v.parse::<i64>().is_ok()))
}

/// Whether a hash is laid out as a reentrant lock (Redisson's RLock, ferrolock's): every field
/// `<uuid>:<owner id>`, every value a hold count.
fn is_reentrant(fields: &Fields) -> bool {
    !fields.is_empty()
        && fields
            .iter()
            .all(|(f, v)| utf8(v).is_some_and(|v| v.parse::<i64>().is_ok()) && is_owner_field(f))
}

/// A reentrant lock's field: `<uuid>:<owner id>`.
fn is_owner_field(f: &[u8]) -> bool {
    utf8(f)
        .and_then(|f| f.rsplit_once(':'))
        .is_some_and(|(uuid, id)| uuid.len() >= 32 && id.parse::<i64>().is_ok())
}

/// A read-write lock (Redisson's RReadWriteLock hash): its mode, the writer (field
/// `<owner>:write`) and each reader (field `<owner>`) with its holds, each hold's remaining
/// lease being the PTTL of its own key `{name}:<owner>:rwlock_timeout:<n>`.
fn read_write(fields: Fields, c: &mut Server, key: &str) -> Result<Json, String> {
    // As bytes: an owner field that is not UTF-8 (a client's binary id) failed the node.
    // `{name}:` of the hold keys, to which a reader's field is appended as the bytes it is.
    let timeout_prefix = rwlock_timeout_prefix(key, "");
    let hold_prefix = timeout_prefix
        .strip_suffix(":rwlock_timeout")
        .unwrap_or(&timeout_prefix);
    let mut mode = Json::Null;
    let mut writer = Json::Null;
    let mut readers = Vec::new();
    for (raw, value) in fields {
        let field = String::from_utf8_lossy(&raw);
        let value = String::from_utf8_lossy(&value);
        if field == "mode" {
            mode = json!(value);
        } else if let Some(owner) = field.strip_suffix(":write") {
            writer = json!({ "owner": owner, "holds": value.parse::<u64>().ok() });
        } else {
            let holds = value.parse::<u64>().unwrap_or(0);
            let mut leases = Vec::new();
            for n in 1..=holds {
                let mut hold = hold_prefix.as_bytes().to_vec();
                hold.extend_from_slice(&raw);
                hold.extend_from_slice(format!(":rwlock_timeout:{n}").as_bytes());
                let pttl: i64 = redis::cmd("PTTL").arg(hold).query(c).map_err(reply_error)?;
                // -2: the hold's key is gone, its lease ran out (its count stays in the hash
                // until a script of the lock cleans it): no lease left, not 2 ms before one.
                leases.push(if pttl == -2 { Json::Null } else { json!(pttl) });
            }
            readers.push(json!({ "owner": field, "holds": holds, "leases_ms": leases }));
        }
    }
    Ok(json!({ "kind": "read-write", "mode": mode, "writer": writer, "readers": readers }))
}

/// A number at `key`: a semaphore's counter (Redisson's RPermitExpirableSemaphore) when its
/// zset of permit ids (`permit_ids_key`) exists; without it (no holder: Redis drops an empty
/// zset) a semaphore with no holders cannot be told from any other counter, and says so.
/// Leases are measured with the server's TIME, as the semaphore's scripts do.
fn semaphore(c: &mut Server, key: &str, available: i64) -> Result<Json, String> {
    let ids: Vec<(Vec<u8>, f64)> = unless_moved(
        redis::cmd("ZRANGE")
            .arg(permit_ids_key(key))
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query(c),
    )?
    .unwrap_or_default();
    if ids.is_empty() {
        return Ok(json!({
            "kind": "semaphore or counter",
            "available": available,
            "lapsed": 0,
            "permits": [],
        }));
    }
    let now_ms = server_ms(c)?;
    // A permit whose lease ran out (its holder died unreleased) stays in the zset until the
    // next acquire gives it back (`semaphore_acquire.lua`: expiry <= now): no lease left, and
    // one of the permits that acquire finds, so counted as available.
    let lapsed = ids.iter().filter(|(_, e)| *e as i64 <= now_ms).count() as u64;
    let permits: Vec<Json> = ids
        .iter()
        .map(|(id, expiry)| {
            let left = *expiry as i64 - now_ms;
            json!({
                "id": id.iter().map(|b| format!("{b:02x}")).collect::<String>(),
                "lease_ms": if left > 0 { json!(left) } else { Json::Null },
            })
        })
        .collect();
    Ok(json!({
        "kind": "semaphore",
        "available": available.saturating_add(lapsed as i64),
        "lapsed": lapsed,
        "permits": permits,
    }))
}

/// The zset of permit ids of a semaphore named `key`, named as Redisson names it
/// (`suffixName`: `{name}:timeout`, or `name:timeout` when the name has a `{`). The core
/// refuses names with braces, but Redisson's clients take them: `jobs{1}`'s ids are in
/// `jobs{1}:timeout` (read as `{jobs{1}}:timeout`, its holders were shown as none).
fn permit_ids_key(key: &str) -> String {
    if key.contains('{') {
        format!("{key}:timeout")
    } else {
        semaphore_timeout_key(key)
    }
}

/// A read of the permit ids' zset; `None` when a Redis Cluster primary answers MOVED: for a
/// name with a `{` that starts no hash tag, or a `}` alone, the zset is in another slot than
/// the number, where Redisson holds no permit (its scripts, which name both keys, fail with
/// CROSSSLOT there), while one server keeps both.
fn unless_moved<T>(read: redis::RedisResult<T>) -> Result<Option<T>, String> {
    match read {
        Err(e) if e.code() == Some("MOVED") => Ok(None),
        read => read.map(Some).map_err(reply_error),
    }
}

/// The server's clock (TIME) in epoch ms.
fn server_ms(c: &mut Server) -> Result<i64, String> {
    let (s, us): (i64, i64) = redis::cmd("TIME").query(c).map_err(reply_error)?;
    Ok(s * 1000 + us / 1000)
}

fn node_text(n: &Json) -> String {
    let mut s = String::new();
    let kind = n["type"].as_str().unwrap_or("?");
    if kind == "none" {
        s.push_str("  free (no such key)\n");
    } else {
        s.push_str(&format!("  type: {kind}\n"));
        let layout = n["holder"]["kind"].as_str();
        if let Some(layout) = layout {
            s.push_str(&format!("  kind: {layout}\n"));
        }
        match n["pttl_ms"].as_i64() {
            // A semaphore's counter has no TTL by design.
            Some(-1) if layout.is_some_and(|l| l.starts_with("semaphore")) => {
                s.push_str("  ttl: none (a semaphore counter never expires)\n")
            }
            Some(-1) if layout == Some(NOT_A_LOCK) => s.push_str("  ttl: none\n"),
            Some(-1) => s.push_str("  ttl: NONE (the key never expires: a leaked lock)\n"),
            Some(ms) => s.push_str(&format!("  ttl: {ms} ms\n")),
            None => {}
        }
        if let Some(t) = n["holder"]["token"].as_str() {
            // A value longer than a lock's: its start, read alone, and its length.
            let more = n["holder"]["token_bytes"]
                .as_u64()
                .map(|len| format!("… ({len} bytes)"))
                .unwrap_or_default();
            s.push_str(&format!("  holder token: {}{more}\n", printable(t)));
        }
        if let Some(ms) = n["holder"]["held_ms"].as_u64() {
            s.push_str(&format!("  held for: {}\n", held_text(ms)));
        }
        if let Some(mode) = n["holder"]["mode"].as_str() {
            s.push_str(&format!("  mode: {}\n", printable(mode)));
        }
        if let Some(owner) = n["holder"]["writer"]["owner"].as_str() {
            s.push_str(&format!(
                "  writer {}: hold count {}\n",
                printable(owner),
                n["holder"]["writer"]["holds"]
            ));
        }
        for r in n["holder"]["readers"].as_array().into_iter().flatten() {
            let leases: Vec<String> = r["leases_ms"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|ms| match ms.as_i64() {
                    // -1: the hold's key has no expiry (set by hand), as Redis's PTTL says.
                    Some(-1) => "none (no expiry)".to_string(),
                    Some(ms) => format!("{ms} ms"),
                    None => "lapsed".to_string(),
                })
                .collect();
            s.push_str(&format!(
                "  reader {}: hold count {}, leases {}\n",
                printable(r["owner"].as_str().unwrap_or("?")),
                r["holds"],
                leases.join(", ")
            ));
        }
        if let Some(available) = n["holder"]["available"].as_i64() {
            match n["holder"]["lapsed"].as_u64() {
                Some(lapsed) if lapsed > 0 => s.push_str(&format!(
                    "  permits available: {available} ({lapsed} of them lapsed, back at the next acquire)\n"
                )),
                _ => s.push_str(&format!("  permits available: {available}\n")),
            }
            let permits = n["holder"]["permits"].as_array().map_or(&[][..], |v| v);
            if permits.is_empty() {
                s.push_str("  permit holders: none\n");
            }
            for p in permits {
                let lease = p["lease_ms"]
                    .as_i64()
                    .map_or("lapsed".to_string(), |ms| format!("{ms} ms"));
                s.push_str(&format!(
                    "  permit {}: lease {lease}\n",
                    p["id"].as_str().unwrap_or("?"),
                ));
            }
        }
        if let Some(owners) = n["holder"]["owners"].as_object() {
            for (field, count) in owners {
                s.push_str(&format!(
                    "  owner {}: hold count {}\n",
                    printable(field),
                    printable(count.as_str().unwrap_or("?"))
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
            s.push_str(&format!(
                "    {}\n",
                printable(w["waiter"].as_str().unwrap_or("?"))
            ));
        }
    }
    s
}

/// A value read from Redis as `inspect`'s text shows it: what Rust escapes in a quoted string
/// (control characters, a bidi override: `\n`, `\u{1b}`, `\u{202e}`) escaped as it does, and
/// so backslashes, so that a token or an owner field holding a newline cannot print a line of
/// its own, an escape sequence reach the terminal, nor an override show other text than is
/// stored. Quotes stay: nothing here is quoted. A ferrolock, Redisson or redis-py value has
/// none of these, and shows as `FERROLOCK_TOKEN` is.
fn printable(s: &str) -> String {
    s.chars()
        .map(|c| {
            let quote = c == '"' || c == '\'';
            if c == '\\' || (!quote && c.escape_debug().len() > 1) {
                c.escape_debug().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
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

/// Bytes read from Redis as text, if they are UTF-8 (every lock's names and values are).
fn utf8(b: &[u8]) -> Option<&str> {
    std::str::from_utf8(b).ok()
}

/// A ZRANGE WITHSCORES reply as (member, score) pairs.
fn pairs(v: &Value) -> Vec<(String, String)> {
    match v {
        // RESP3 (a node URL with `?protocol=resp3`) answers with a [member, score] pair per
        // member: read as one flat list, two waiters showed as one with an empty id.
        Value::Array(items)
            if items
                .iter()
                .all(|i| matches!(i, Value::Array(p) if p.len() == 2)) =>
        {
            items
                .iter()
                .filter_map(|i| match i {
                    Value::Array(p) => Some((text_of(&p[0]), text_of(&p[1]))),
                    _ => None,
                })
                .collect()
        }
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

/// The servers behind one node URL.
enum Node {
    /// The server itself, or a cluster's primaries (the URL shown, them).
    Servers(String, Vec<Target>),
    /// A node URL that could not be read (shown, why).
    Failed(String, String),
    /// A cluster URL whose primaries another URL listed (shown, that URL shown).
    SameCluster(String, String),
}

/// The servers behind each node URL. A second seed of one cluster given as another node
/// showed every lock again (the core refuses such a node's vote): it is named as the same
/// cluster as the URL that listed its primaries.
fn servers(urls: Vec<String>) -> Vec<Node> {
    // A cluster's primaries, each with the URL that listed it.
    let mut listed: Vec<(String, String)> = Vec::new();
    let mut nodes = Vec::new();
    for url in urls {
        let shown = redact_url(&url);
        let targets = match cluster::targets(&url) {
            Ok(ts) => ts,
            Err(e) => {
                nodes.push(Node::Failed(shown, e));
                continue;
            }
        };
        let first = targets.iter().find_map(|t| {
            let addr = t.primary.as_ref()?;
            listed
                .iter()
                .find(|(a, _)| a == addr)
                .map(|(_, by)| by.clone())
        });
        if let Some(first) = first {
            nodes.push(Node::SameCluster(shown, first));
            continue;
        }
        for t in &targets {
            if let Some(addr) = &t.primary {
                listed.push((addr.clone(), shown.clone()));
            }
        }
        nodes.push(Node::Servers(shown, targets));
    }
    nodes
}

/// The line that names a node URL as the same cluster as an earlier one.
fn same_cluster(shown: &str, first: &str) -> String {
    format!("{shown}: the same cluster as {first} (shown there)\n")
}

/// What `scan` does with each server behind its node URLs.
enum Scanned {
    Ask(Target),
    /// A node URL that could not be read (shown, why).
    Failed(String, String),
    /// A cluster URL whose primaries another URL listed (shown, that URL shown).
    SameCluster(String, String),
}

pub fn scan(args: ScanArgs) -> u8 {
    use std::os::unix::ffi::OsStrExt as _;
    let pattern = args
        .pattern
        .as_deref()
        .map_or(&b"*"[..], |p| p.as_bytes())
        .to_vec();
    let long = args.long.unwrap_or(DEFAULT_LONG);
    let urls = match nodes(&args.nodes, &args.tls_ca) {
        Ok(urls) => urls,
        Err(code) => return code,
    };
    let mut out = Vec::new();
    let mut text = String::new();
    let mut failed = 0;
    let servers = servers(urls).into_iter().flat_map(|node| match node {
        Node::Servers(_, targets) => targets.into_iter().map(Scanned::Ask).collect(),
        Node::Failed(shown, e) => vec![Scanned::Failed(shown, e)],
        Node::SameCluster(shown, first) => vec![Scanned::SameCluster(shown, first)],
    });
    for server in servers {
        let (shown, found) = match server {
            Scanned::SameCluster(shown, first) => {
                text.push_str(&same_cluster(&shown, &first));
                continue;
            }
            Scanned::Ask(t) => (
                t.shown,
                Server::connect(&t.url)
                    .map(Server::listed_keys)
                    .and_then(|mut c| scan_node(&mut c, &pattern)),
            ),
            Scanned::Failed(shown, e) => (shown, Err(e)),
        };
        match found {
            Ok(found) => {
                // A semaphore holds permits, not a lock: counted apart.
                let semaphores = found
                    .iter()
                    .filter(|f| f.kind.starts_with("semaphore"))
                    .count();
                text.push_str(&format!(
                    "{shown}: {} lock(s), {semaphores} semaphore(s)\n",
                    found.len() - semaphores
                ));
                for lock in &found {
                    let long_ms = long.as_millis();
                    let is_long = match lock.held_ms {
                        Some(held) => u128::from(held) > long_ms,
                        None => lock.leaks && lock.pttl_ms > 0 && lock.pttl_ms as u128 > long_ms,
                    };
                    // In the unit of the "held" beside it: as Debug, `--long 2h` read "7200s".
                    let over = held_text(long_ms as u64);
                    let flag = match (lock.pttl_ms, lock.held_ms) {
                        (-1, _) if lock.leaks => "  LEAKED: no ttl".to_string(),
                        (_, Some(_)) if is_long => format!("  LONG: held over {over}"),
                        _ if is_long => format!("  LONG: ttl over {over}"),
                        _ => String::new(),
                    };
                    let held = lock
                        .held_ms
                        .map(|ms| format!("  held {}", held_text(ms)))
                        .unwrap_or_default();
                    text.push_str(&format!(
                        "  {}  {}  ttl {}{held}{flag}\n",
                        quoted_key(&lock.key),
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
                        "held_ms": lock.held_ms,
                        "leaked": lock.leaks && lock.pttl_ms == -1,
                        "long": is_long,
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
    let pattern_text = String::from_utf8_lossy(&pattern);
    if let Err(code) = report(
        args.json,
        json!({ "pattern": pattern_text, "locks": out }),
        text,
    ) {
        return code;
    }
    if failed > 0 { exit::UNAVAILABLE } else { 0 }
}

struct Found {
    key: String,
    kind: &'static str,
    pttl_ms: i64,
    /// Since the grant, for ferrolock's plain locks (their token carries the grant's time).
    held_ms: Option<u64>,
    /// Whether a missing TTL means a leak: not for a semaphore's counter (none by design).
    leaks: bool,
}

/// How long ago the attempt that made `token` started, if it is a ferrolock token (a clock
/// behind the holder's counts as 0).
fn held_ms(token: &str) -> Option<u64> {
    let since = ferrolock::token_time(token)?;
    Some(
        SystemTime::now()
            .duration_since(since)
            .map_or(0, |d| d.as_millis() as u64),
    )
}

fn held_text(ms: u64) -> String {
    match ms / 1000 {
        s if s >= 3600 => format!("{}h{:02}m", s / 3600, s / 60 % 60),
        s if s >= 60 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{:.1}s", ms as f64 / 1000.0),
    }
}

/// Keys that look like locks: a string holding a ferrolock token (time-random) or a
/// 32-hex-digit token (redis-py, node-redlock), or a hash whose fields are `<uuid>:<thread id>` with counts (Redisson's RLock
/// layout, ferrolock's reentrant lock), a read-write lock's hash (`mode` `read` or `write` beside hold
/// counts: Redisson's RReadWriteLock layout), or a number whose `{name}:timeout` zset of permit ids exists (a
/// semaphore's counter with holders; without holders one cannot be told from any other counter,
/// so it is not listed). ferrolock's own names (`is_core_key`: queues, fence counters, request
/// latches) and the read holds' own keys (`…:rwlock_timeout:<n>`, parts of their lock) are
/// skipped.
const READ_WRITE: &str = "read-write (Redisson RReadWriteLock layout)";

/// The names the core derives from a lock's key (`core/src/scripts`): its queue, the queue's
/// leases and times, its fence counter, a request's latch, a hold's key, an owner's set of live
/// holds. Not every name under `ferrolock:`: the core takes any key, and a lock named
/// `ferrolock:nightly` (leaked or not) was never listed.
fn is_core_key(key: &str) -> bool {
    [
        "ferrolock:queue:",
        "ferrolock:queue-lease:",
        "ferrolock:queue-since:",
        "ferrolock:fence:",
        "ferrolock:latch:",
        "ferrolock:hold:",
        "ferrolock:holds:",
    ]
    .iter()
    .any(|prefix| key.starts_with(prefix))
}

/// A read hold's own key `{name}:<owner>:rwlock_timeout:<n>`: its TTL is the hold's lease,
/// shown by `inspect` under its lock, never a lock of its own.
fn is_read_hold_key(key: &str) -> bool {
    key.rsplit_once(":rwlock_timeout:")
        .is_some_and(|(_, n)| n.parse::<u64>().is_ok())
}

fn scan_node(c: &mut Server, pattern: &[u8]) -> Result<Vec<Found>, String> {
    let mut found = Vec::new();
    let mut listed = HashSet::new();
    let mut cursor: u64 = 0;
    loop {
        cursor = scan_page(c, pattern, cursor, &mut found, &mut listed)?;
        if cursor == 0 {
            return Ok(found);
        }
    }
}

/// One SCAN step from `cursor`: appends the lock-like keys it lists to `found`, and returns
/// the next cursor (0: done). SCAN may return a key again (the table shrank between two steps
/// as keys were deleted or expired, and its buckets merged ones already walked): `listed`, the
/// names already in `found`, keeps each lock listed once.
fn scan_page(
    c: &mut Server,
    pattern: &[u8],
    cursor: u64,
    found: &mut Vec<Found>,
    listed: &mut HashSet<Vec<u8>>,
) -> Result<u64, String> {
    // Names and values as bytes: a database holds binary ones too (a compressed or
    // pickled value, a binary hash field), and one that is not UTF-8 is no lock; read as
    // text, the first of them failed the whole node.
    let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
        .arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(SCAN_COUNT)
        .query(c)
        .map_err(reply_error)?;
    for raw in keys {
        let key = String::from_utf8_lossy(&raw).into_owned();
        if is_core_key(&key) || is_read_hold_key(&key) || listed.contains(&raw) {
            continue;
        }
        let kind: String = redis::cmd("TYPE").arg(&raw).query(c).map_err(reply_error)?;
        let mut held = None;
        let looks = match kind.as_str() {
            // Longer than any lock's: no lock.
            "string" => match string_value(c, &raw)? {
                (_, Some(_)) => None,
                (v, None) => {
                    let v = String::from_utf8(v).unwrap_or_default();
                    held = held_ms(&v);
                    if v.parse::<i64>().is_ok() {
                        let holders: u64 =
                            unless_moved(redis::cmd("ZCARD").arg(permit_ids_key(&key)).query(c))?
                                .unwrap_or(0);
                        (holders > 0)
                            .then_some("semaphore (Redisson RPermitExpirableSemaphore layout)")
                    } else if held.is_some() {
                        Some("plain (ferrolock)")
                    } else {
                        (v.len() == 32 && v.bytes().all(|b| b.is_ascii_hexdigit()))
                            .then_some("plain (redis-py, node-redlock)")
                    }
                }
            },
            "hash" => {
                let fields = hash_fields(c, &raw)?;
                if is_read_write(&fields) {
                    Some(READ_WRITE)
                } else {
                    is_reentrant(&fields).then_some("reentrant (Redisson RLock layout)")
                }
            }
            _ => None,
        };
        if let Some(kind) = looks {
            let pttl_ms: i64 = redis::cmd("PTTL").arg(&raw).query(c).map_err(reply_error)?;
            listed.insert(raw);
            found.push(Found {
                key,
                kind,
                pttl_ms,
                held_ms: held,
                leaks: !kind.starts_with("semaphore"),
            });
        }
    }
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrolock_testbed::{RedisServer, ServerOptions};

    /// SCAN returns a key again when the table it walks shrinks between two steps (keys
    /// deleted or expired mid-scan): `scan` listed such a lock twice.
    #[test]
    fn a_key_scan_returns_twice_is_listed_once() {
        let server = RedisServer::start_with(ServerOptions {
            extra_args: vec!["--enable-debug-command".into(), "yes".into()],
            ..ServerOptions::default()
        });
        let mut admin = server.client();
        let token = "0123456789abcdef0123456789abcdef";
        let mut pipe = redis::pipe();
        for i in 0..20_000 {
            pipe.cmd("SET").arg(format!("lk:{i}")).arg(token).ignore();
        }
        pipe.query::<()>(&mut admin).unwrap();
        let mut c = Server::connect(&server.url()).unwrap().listed_keys();
        let mut found = Vec::new();
        let mut listed = HashSet::new();
        let cursor = scan_page(&mut c, b"lk:*", 0, &mut found, &mut listed).unwrap();
        assert!(cursor != 0 && !found.is_empty());
        // Keep what the first step listed and a thousand keys more; delete the rest, so
        // that the table shrinks to a size whose buckets each hold some already walked.
        let first: HashSet<String> = found.iter().map(|f| f.key.clone()).collect();
        let kept: Vec<String> = (0..20_000)
            .map(|i| format!("lk:{i}"))
            .filter(|k| !first.contains(k))
            .take(1000)
            .collect();
        let mut pipe = redis::pipe();
        for i in 0..20_000 {
            let k = format!("lk:{i}");
            if !first.contains(&k) && !kept.contains(&k) {
                pipe.cmd("DEL").arg(k).ignore();
            }
        }
        pipe.query::<()>(&mut admin).unwrap();
        let end = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let stats: String = redis::cmd("DEBUG")
                .arg("HTSTATS")
                .arg(0)
                .query(&mut admin)
                .unwrap();
            if !stats.contains("Rehashing") && !stats.contains("table size: 32768") {
                break;
            }
            assert!(std::time::Instant::now() < end, "never shrank: {stats}");
            std::thread::sleep(Duration::from_millis(20));
        }
        // The fault: SCAN itself now returns keys the first step returned.
        let mut raw = Vec::new();
        let mut next = cursor;
        while next != 0 {
            let (n, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(next)
                .arg("MATCH")
                .arg("lk:*")
                .arg("COUNT")
                .arg(SCAN_COUNT)
                .query(&mut admin)
                .unwrap();
            raw.extend(keys);
            next = n;
        }
        assert!(
            raw.iter().any(|k| first.contains(k)),
            "SCAN returned no key twice"
        );

        let mut next = cursor;
        while next != 0 {
            next = scan_page(&mut c, b"lk:*", next, &mut found, &mut listed).unwrap();
        }
        let mut keys: Vec<&str> = found.iter().map(|f| f.key.as_str()).collect();
        keys.sort_unstable();
        let listed = keys.len();
        keys.dedup();
        assert_eq!(listed, keys.len(), "a key listed twice");
        assert_eq!(listed, first.len() + kept.len());
    }
}
