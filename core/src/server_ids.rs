//! Which of a manager's nodes answers as which server, by `run_id`: two URLs that reach one
//! server (a DNS alias and its address, `127.1` and `127.0.0.1`, `[::ffff:127.0.0.1]`) would
//! count its vote twice, and a single restart would then lose a quorum's keys. The URLs are
//! compared when the manager is built (`Node::server`); what they cannot tell apart without a
//! DNS lookup, the server tells when a connection opens (`INFO server`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::per_process::PerProcess;

/// Shared by a manager's nodes (clones share the map); per process, as every lock a runtime
/// thread may hold at a fork (see `per_process.rs`).
#[derive(Clone, Default)]
pub(crate) struct ServerIds(Arc<PerProcess<Mutex<HashMap<String, String>>>>);

impl ServerIds {
    /// Records that `node` (its redacted URL) answered with `run_id`; Err naming the node that
    /// answered with it first.
    pub fn claim(&self, run_id: &str, node: &str) -> Result<(), String> {
        let map = self.0.get_or_init(Mutex::default);
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
}
