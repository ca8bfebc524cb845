//! A node that is a whole Redis Cluster: its URL form, and the connection type every request
//! is sent on (a standalone server's or the cluster's routed one), so nothing outside the node
//! module cares which a node is.

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::error::{Error, Result};

/// A node's connection: a standalone server's multiplexed connection, or a cluster's, which
/// routes each command to the primary of its keys' slot (following MOVED and ASK itself).
#[derive(Clone)]
pub(crate) enum Conn {
    Server(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(_))
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Server(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    /// On a cluster, every command of the pipeline must be in one slot (redis-rs refuses
    /// others): callers with keys of several slots send them one by one.
    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Server(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Server(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// A parsed `redis+cluster://` or `rediss+cluster://` URL: the seeds as plain `redis://`
/// (`rediss://`) URLs carrying the same credentials, the URL's own host first.
#[derive(Debug)]
pub(crate) struct ClusterUrl {
    pub seeds: Vec<String>,
}

const FORM: &str = "expected redis+cluster://[user:password@]host:port[?seed=host:port&seed=...] or rediss+cluster://...";

impl ClusterUrl {
    /// `None` for a URL of another scheme. `display` is the URL without its password, the
    /// only form a message shows.
    pub fn parse(url: &str, display: &str) -> Result<Option<ClusterUrl>> {
        let (scheme, rest) = if let Some(rest) = url.strip_prefix("redis+cluster://") {
            ("redis", rest)
        } else if let Some(rest) = url.strip_prefix("rediss+cluster://") {
            ("rediss", rest)
        } else {
            return Ok(None);
        };
        let bad =
            |why: String| Error::invalid(format!("cluster node URL {display:?}: {why} ({FORM})"));
        let (main, query) = match rest.split_once('?') {
            Some((m, q)) => (m, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match main.split_once('/') {
            Some((a, p)) => (a, p),
            None => (main, ""),
        };
        // A cluster has database 0 only.
        if !path.is_empty() && path != "0" {
            return Err(bad(format!("a cluster has only database 0, not {path:?}")));
        }
        let (userinfo, host) = match authority.rfind('@') {
            Some(at) => (&authority[..=at], &authority[at + 1..]),
            None => ("", authority),
        };
        check_host_port(host).map_err(&bad)?;
        let mut seeds = vec![format!("{scheme}://{userinfo}{host}")];
        for pair in query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .filter(|p| !p.is_empty())
        {
            match pair.split_once('=') {
                Some(("seed", seed)) => {
                    check_host_port(seed).map_err(|why| bad(format!("seed {seed:?}: {why}")))?;
                    seeds.push(format!("{scheme}://{userinfo}{seed}"));
                }
                _ => {
                    let name = pair.split('=').next().unwrap_or(pair);
                    return Err(bad(format!("unknown parameter {name:?}")));
                }
            }
        }
        Ok(Some(ClusterUrl { seeds }))
    }
}

fn check_host_port(host_port: &str) -> std::result::Result<(), String> {
    let Some((host, port)) = host_port.rsplit_once(':') else {
        return Err(format!("{host_port:?} has no port"));
    };
    if host.is_empty() {
        return Err(format!("{host_port:?} has no host"));
    }
    if host_port.contains(',') {
        return Err(format!(
            "{host_port:?}: commas separate nodes; give more seeds as ?seed=host:port"
        ));
    }
    port.parse::<u16>()
        .map(|_| ())
        .map_err(|_| format!("bad port {port:?}"))
}

/// The refusal of a plain URL that reached a cluster node: its other shards' keys would
/// answer MOVED, and even its own slots can move away under a lock. (A message: the node
/// module makes it a `NodeError`, so this module does not depend on it.)
pub(crate) fn refuse_cluster_server(display: &str) -> String {
    let cluster_form = display
        .strip_prefix("redis://")
        .map(|r| format!("redis+cluster://{r}"))
        .or_else(|| {
            display
                .strip_prefix("rediss://")
                .map(|r| format!("rediss+cluster://{r}"))
        })
        .unwrap_or_else(|| "redis+cluster://host:port".to_string());
    format!(
        "is a Redis Cluster node (INFO cluster: cluster_enabled:1); a plain URL cannot route keys \
         across its shards: use {cluster_form}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_parse_into_seeds_with_their_credentials() {
        let seeds = |u: &str| ClusterUrl::parse(u, u).unwrap().unwrap().seeds;
        assert_eq!(seeds("redis+cluster://h:7000"), ["redis://h:7000"]);
        assert_eq!(
            seeds("rediss+cluster://u:p@h:7000/0?seed=g:7001&seed=k:7002"),
            [
                "rediss://u:p@h:7000",
                "rediss://u:p@g:7001",
                "rediss://u:p@k:7002"
            ]
        );
        assert!(
            ClusterUrl::parse("redis://h:1", "redis://h:1")
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn bad_cluster_urls_name_the_bad_part() {
        for (url, part) in [
            ("redis+cluster://h:7000/3", "\"3\""),
            ("redis+cluster://h", "no port"),
            ("redis+cluster://h:70000", "bad port"),
            ("redis+cluster://h:7000?seed=g", "\"g\""),
            ("redis+cluster://h:7000?seed=g:1,k:2", "commas"),
            ("redis+cluster://h:7000?tls=1", "\"tls\""),
        ] {
            let err = ClusterUrl::parse(url, url).unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument);
            assert!(err.message().contains(part), "{url}: {err}");
            assert!(err.message().contains(url), "{url}: {err}");
        }
    }
}
