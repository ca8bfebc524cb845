//! Which of a manager's nodes answers as which server, by `run_id`: two URLs that reach one
//! server (a DNS alias and its address, `127.1` and `127.0.0.1`, `[::ffff:127.0.0.1]`) would
//! count its vote twice, and a single restart would then lose a quorum's keys. The URLs are
//! compared when the manager is built (`Node::server`); what they cannot tell apart without a
//! DNS lookup, the server tells when a connection opens (`INFO server`).
//!
//! A `redis+cluster://` node is a whole cluster, which has no run_id of its own: it is known
//! by its nodes' ids, primaries and replicas (`CLUSTER SLOTS`, read on every connection). Two
//! seeds of one cluster given as two nodes share them, and would count that cluster's vote
//! twice.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::per_process::PerProcess;

/// Shared by a manager's nodes (clones share the map); per process, as every lock a runtime
/// thread may hold at a fork (see `per_process.rs`).
#[derive(Clone, Default)]
pub(crate) struct ServerIds {
    claims: Arc<PerProcess<Mutex<HashMap<String, String>>>>,
    /// The manager has more than one cluster node: a cluster connection that could not read
    /// its slot map cannot be told apart from the others, and must not vote. Set once the
    /// nodes are open (`LockManager::new`).
    several_clusters: Arc<AtomicBool>,
}

/// A cluster node's id as a claim: apart from the run_ids of standalone servers.
fn cluster_claim(node_id: &str) -> String {
    format!("cluster node {node_id}")
}

impl ServerIds {
    pub fn set_several_clusters(&self, several: bool) {
        self.several_clusters.store(several, Ordering::Relaxed);
    }

    /// Whether the manager has more than one cluster node (see `claim_cluster`).
    pub fn several_clusters(&self) -> bool {
        self.several_clusters.load(Ordering::Relaxed)
    }

    /// Records that the cluster node `node` has the nodes `node_ids`; Err naming the node that
    /// claimed one of them first, and that id. One shared id is enough: two looks at one
    /// cluster a failover apart share the replica promoted (its old primary, back as a
    /// replica, too), and the other shards' nodes.
    pub fn claim_cluster(&self, node_ids: &[String], node: &str) -> Result<(), (String, String)> {
        let map = self.claims.get_or_init(Mutex::default);
        let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
        for id in node_ids {
            if let Some(first) = map.get(&cluster_claim(id))
                && first != node
            {
                return Err((first.clone(), id.clone()));
            }
        }
        // Nodes it no longer has (removed from the cluster) may be another node's now.
        map.retain(|_, claimed_by| claimed_by != node);
        for id in node_ids {
            map.insert(cluster_claim(id), node.to_string());
        }
        Ok(())
    }

    /// Records that `node` (its redacted URL) answered with `run_id`; Err naming the node that
    /// answered with it first.
    pub fn claim(&self, run_id: &str, node: &str) -> Result<(), String> {
        let map = self.claims.get_or_init(Mutex::default);
        let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
        match map.get(run_id) {
            Some(first) if first != node => Err(first.clone()),
            Some(_) => Ok(()),
            None => {
                // Its server restarted, or its URL now reaches another: the old run_id is no
                // longer its own, and another node may reach that server alone now.
                map.retain(|_, claimed_by| claimed_by != node);
                map.insert(run_id.to_string(), node.to_string());
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_run_id_belongs_to_the_first_node_that_answered_with_it() {
        let ids = super::ServerIds::default();
        let shared = ids.clone();
        assert_eq!(ids.claim("r1", "redis://a:1"), Ok(()));
        assert_eq!(ids.claim("r1", "redis://a:1"), Ok(()), "a reconnection");
        assert_eq!(ids.claim("r2", "redis://b:1"), Ok(()));
        assert_eq!(shared.claim("r1", "redis://c:1"), Err("redis://a:1".into()));
        // A restart gives the node a new run_id: still its own; and the old one is free.
        assert_eq!(ids.claim("r3", "redis://a:1"), Ok(()));
        assert_eq!(ids.claim("r1", "redis://c:1"), Ok(()));
    }

    #[test]
    fn a_cluster_belongs_to_the_first_node_that_saw_one_of_its_nodes() {
        let ids = super::ServerIds::default();
        let v = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (a, b, c) = (
            "redis+cluster://h:1",
            "redis+cluster://h:2",
            "redis+cluster://k:1",
        );
        assert_eq!(ids.claim_cluster(&v(&["p1", "p2"]), a), Ok(()));
        assert_eq!(
            ids.claim_cluster(&v(&["p1", "p2"]), a),
            Ok(()),
            "a reconnection"
        );
        assert_eq!(ids.claim_cluster(&v(&["q1"]), c), Ok(()), "another cluster");
        // Seen a failover apart: p2 replaced by p3, p1 still shared.
        assert_eq!(
            ids.claim_cluster(&v(&["p1", "p3"]), b),
            Err((a.to_string(), "p1".to_string()))
        );
        // A run_id is no node id.
        assert_eq!(ids.claim("p1", "redis://s:1"), Ok(()));
        // `a`'s cluster now has other primaries: the old ones are free.
        assert_eq!(ids.claim_cluster(&v(&["x1"]), a), Ok(()));
        assert_eq!(ids.claim_cluster(&v(&["p1", "p3"]), b), Ok(()));
    }
}
