//! `inspect` and `scan` on a `redis+cluster://` node: a cluster's keys live on its primaries,
//! each holding some slot ranges, so the operator tools ask each primary (scan) or the one
//! that owns the key's slot (inspect), read-only as on a standalone server.

use std::time::Duration;

use ferrolock::redact_url;
use redis::{Connection, ConnectionLike, Value};

/// One server to ask: how it is shown, its URL (with the credentials the user gave), the
/// slot ranges it serves (empty for a standalone server), and a cluster primary's address as
/// `CLUSTER SLOTS` gave it (`None` for a standalone server).
pub struct Target {
    pub shown: String,
    pub url: String,
    pub slots: Vec<(u16, u16)>,
    pub primary: Option<String>,
}

/// The servers behind one node URL: the server itself, or every primary of a cluster, from
/// the first seed that answers `CLUSTER SLOTS`.
pub fn targets(url: &str) -> Result<Vec<Target>, String> {
    let Some(seeds) = ferrolock::cluster_seeds(url).map_err(|e| e.message().to_string())? else {
        return Ok(vec![Target {
            shown: redact_url(url),
            url: url.to_string(),
            slots: Vec::new(),
            primary: None,
        }]);
    };
    let shown = redact_url(url);
    let mut errors = Vec::new();
    for seed in &seeds {
        match primaries(seed) {
            Ok(found) => {
                return Ok(found
                    .into_iter()
                    .map(|(addr, slots)| Target {
                        shown: format!("{shown} primary {addr}"),
                        url: with_addr(seed, &addr),
                        slots,
                        primary: Some(addr),
                    })
                    .collect());
            }
            Err(e) => errors.push(format!("seed {}: {e}", redact_url(seed))),
        }
    }
    Err(format!(
        "cluster {shown}: no seed answered ({})",
        errors.join("; ")
    ))
}

pub fn serves(t: &Target, slot: u16) -> bool {
    t.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
}

/// The CA file `connect` trusts for TLS nodes (`--tls-ca`, else `FERROLOCK_TLS_CA`), set once
/// the node list was checked; none: the system's roots.
static TLS_CA: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();

static TLS_CA_PEM: std::sync::OnceLock<Result<Vec<u8>, String>> = std::sync::OnceLock::new();

pub fn use_tls_ca(path: Option<std::path::PathBuf>) {
    let _ = TLS_CA.set(path);
}

pub fn connect(url: &str) -> Result<Connection, String> {
    use redis::IntoConnectionInfo;
    let shown = redact_url(url);
    let bad = |e: redis::RedisError| format!("bad node URL {shown:?}: {e}");
    let info = url.into_connection_info().map_err(bad)?;
    let ca = TLS_CA.get().and_then(Option::as_ref);
    let client = match (info.addr(), ca) {
        (redis::ConnectionAddr::TcpTls { .. }, Some(path)) => {
            // Read once for every node a scan visits, and only if some node is a TLS one.
            let pem = TLS_CA_PEM
                .get_or_init(|| {
                    std::fs::read(path)
                        .map_err(|e| format!("cannot read tls_ca file {}: {e}", path.display()))
                })
                .clone()?;
            let certs = redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem),
            };
            redis::Client::build_with_tls(info, certs)
        }
        _ => redis::Client::open(info),
    }
    .map_err(bad)?;
    let c = client
        .get_connection_with_timeout(REPLY_TIMEOUT)
        .map_err(|e| format!("node {shown}: {}", reply_error(e)))?;
    // Every later command too: a node that stops answering is reported, not waited for.
    c.set_read_timeout(Some(REPLY_TIMEOUT))
        .and_then(|_| c.set_write_timeout(Some(REPLY_TIMEOUT)))
        .map_err(|e| format!("node {shown}: {}", reply_error(e)))?;
    Ok(c)
}

/// A connection to one server (a cluster primary, or a standalone server) that follows a
/// migrating slot's `ASK`: while a slot is resharded, a key already moved is answered `ASK
/// <slot> <host:port>` by its old primary, and the command is sent again to the new one after
/// `ASKING` (as a cluster client does). Before, `inspect` of a lock mid-reshard failed with the
/// raw redirect ("error: Ask: 1006 127.0.0.1:7001").
pub struct Server {
    conn: Connection,
    /// The URL `conn` was opened with: its scheme and credentials reach the ASK's target.
    url: String,
    /// The last ASK's target, kept for the next key that moved.
    asked: Option<(String, Connection)>,
    /// Whether a MOVED is asked again with ASKING (`listed_keys`).
    asking_on_moved: bool,
}

impl Server {
    pub fn connect(url: &str) -> Result<Server, String> {
        Ok(Server {
            conn: connect(url)?,
            url: url.to_string(),
            asked: None,
            asking_on_moved: false,
        })
    }

    /// For the keys SCAN listed on this server: one in a slot the server imports is answered
    /// MOVED, to the slot's old owner, unless ASKING comes first (before, that failed the node
    /// and hid the lock everywhere). Not for a key named by the user (`inspect`): one that has
    /// not moved yet is on the old owner, and the ASKING read here called it free.
    pub fn listed_keys(mut self) -> Server {
        self.asking_on_moved = true;
        self
    }

    fn asked(&mut self, addr: &str, cmd: &[u8]) -> redis::RedisResult<Value> {
        if self.asked.as_ref().is_none_or(|(a, _)| a != addr) {
            let url = with_addr(&self.url, addr);
            let c = connect(&url)
                .map_err(|e| redis::RedisError::from((redis::ErrorKind::Io, "ASK redirect", e)))?;
            self.asked = Some((addr.to_string(), c));
        }
        let (_, c) = self.asked.as_mut().expect("set above");
        redis::cmd("ASKING").query::<()>(c)?;
        c.req_packed_command(cmd)
    }
}

impl redis::ConnectionLike for Server {
    fn req_packed_command(&mut self, cmd: &[u8]) -> redis::RedisResult<Value> {
        let reply = self.conn.req_packed_command(cmd)?;
        // An error reply comes as a value (`query` makes it an error).
        if let Value::ServerError(e) = &reply
            && e.code() == "ASK"
            && let Some(addr) = e.details().and_then(|d| d.split_ascii_whitespace().nth(1))
        {
            let addr = addr.to_string();
            return self.asked(&addr, cmd);
        }
        // On a node that imports nothing ASKING changes nothing, and the MOVED stands
        // (`unless_moved`).
        if self.asking_on_moved
            && let Value::ServerError(e) = &reply
            && e.code() == "MOVED"
        {
            redis::cmd("ASKING").query::<()>(&mut self.conn)?;
            return self.conn.req_packed_command(cmd);
        }
        Ok(reply)
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> redis::RedisResult<Vec<Value>> {
        self.conn.req_packed_commands(cmd, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }

    fn check_connection(&mut self) -> bool {
        self.conn.check_connection()
    }

    fn is_open(&self) -> bool {
        self.conn.is_open()
    }
}

/// How long `inspect` and `scan` wait for a node's reply.
const REPLY_TIMEOUT: Duration = Duration::from_secs(2);

/// A command's error as the user reads it: a timeout is "no reply", as `run` says it (the
/// socket's own words are "Resource temporarily unavailable").
pub fn reply_error(e: redis::RedisError) -> String {
    if e.is_timeout() {
        format!("no reply within {}s", REPLY_TIMEOUT.as_secs())
    } else if let (Some("MOVED"), Some((addr, slot))) = (e.code(), e.redirect_node()) {
        // Only a plain URL to a cluster node meets one (`redis+cluster://` asks the key's own
        // primary); the raw "Moved: 11113 host:port" told neither what nor what to do.
        format!(
            "slot {slot} is served by {addr}, not this node (a redis:// URL reads its node's \
             slots only; give the cluster as redis+cluster://)"
        )
    } else {
        e.to_string()
    }
}

/// A primary's `host:port` and the slot ranges it serves.
type Primary = (String, Vec<(u16, u16)>);

/// Each primary, in the order `CLUSTER SLOTS` lists them.
fn primaries(seed: &str) -> Result<Vec<Primary>, String> {
    let mut c = connect(seed)?;
    let slots: Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut c)
        .map_err(reply_error)?;
    let mut out: Vec<Primary> = Vec::new();
    let Value::Array(ranges) = slots else {
        return Err("CLUSTER SLOTS: not an array".into());
    };
    for range in ranges {
        let Value::Array(parts) = range else { continue };
        let (Some(start), Some(end), Some(Value::Array(primary))) =
            (int(parts.first()), int(parts.get(1)), parts.get(2))
        else {
            continue;
        };
        let (Some(host), Some(port)) = (text(primary.first()), int(primary.get(1))) else {
            continue;
        };
        // An empty host means "the address you reached me on" (cluster-preferred-endpoint-type).
        let host = if host.is_empty() {
            seed_host(seed)
        } else {
            host
        };
        let addr = format!("{host}:{port}");
        let range = (start as u16, end as u16);
        match out.iter_mut().find(|(a, _)| *a == addr) {
            Some((_, r)) => r.push(range),
            None => out.push((addr, vec![range])),
        }
    }
    if out.is_empty() {
        return Err("CLUSTER SLOTS lists no primary (slots not assigned yet?)".into());
    }
    Ok(out)
}

fn int(v: Option<&Value>) -> Option<i64> {
    match v? {
        Value::Int(i) => Some(*i),
        _ => None,
    }
}

fn text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// `scheme://[userinfo@]` of a seed URL, then `addr`.
fn with_addr(seed: &str, addr: &str) -> String {
    let (scheme, rest) = seed.split_once("://").unwrap_or(("redis", seed));
    match rest.rfind('@') {
        Some(at) => format!("{scheme}://{}@{addr}", &rest[..at]),
        None => format!("{scheme}://{addr}"),
    }
}

fn seed_host(seed: &str) -> String {
    let rest = seed.split_once("://").map_or(seed, |(_, r)| r);
    let host_port = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    host_port
        .rsplit_once(':')
        .map_or(host_port, |(h, _)| h)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_primary_url_keeps_the_seeds_scheme_and_credentials() {
        assert_eq!(
            with_addr("redis://h:1", "10.0.0.2:7001"),
            "redis://10.0.0.2:7001"
        );
        assert_eq!(
            with_addr("rediss://u:p@w@h:1", "10.0.0.2:7001"),
            "rediss://u:p@w@10.0.0.2:7001"
        );
        assert_eq!(seed_host("redis://u:p@h.example:7000"), "h.example");
    }
}
