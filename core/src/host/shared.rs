//! One manager per distinct connection options, shared by every call that gives the same
//! ones: Python's `redlock()` and Node's `withLock`. A loop of such calls
//! opens its connections once.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::error::Result;
use crate::host::manager::Manager;
use crate::options::ManagerOptions;
use crate::per_process::PerProcess;

/// What tells two connection setups apart: the nodes and TLS CA as resolved (the
/// environment read at this call), the restart guard and the cluster pub/sub kind.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    nodes: Vec<String>,
    tls_ca: Option<PathBuf>,
    restart_guard: Option<Duration>,
    sharded_pubsub: bool,
}

/// Per process: a forked child makes its own managers (and never locks the parent's map).
fn managers() -> &'static Mutex<HashMap<Key, Manager>> {
    static SHARED: OnceLock<PerProcess<Mutex<HashMap<Key, Manager>>>> = OnceLock::new();
    SHARED
        .get_or_init(PerProcess::default)
        .get_or_init(Mutex::default)
}

/// The shared manager for the connection options of `options` (nodes, tls_ca,
/// restart_guard, sharded_pubsub; its lock options are ignored: the manager has the default ones, and each
/// lock gives its own). Made on first use, and again after it was closed.
pub fn shared(options: &ManagerOptions) -> Result<Manager> {
    let key = Key {
        nodes: options.resolved_nodes()?,
        tls_ca: options.resolved_tls_ca(),
        restart_guard: options.restart_guard,
        sharded_pubsub: options.sharded_pubsub,
    };
    let mut map = managers().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(m) = map.get(&key).filter(|m| !m.is_closed()) {
        return Ok(m.clone());
    }
    // Left out as the caller left them out, so the manager names FERROLOCK_NODES or
    // FERROLOCK_TLS_CA in what it refuses (it resolves them again, to the same values).
    let mut conn = ManagerOptions::new();
    conn.nodes = options.nodes.clone();
    conn.tls_ca = options.tls_ca.clone();
    conn.restart_guard = key.restart_guard;
    conn.sharded_pubsub = key.sharded_pubsub;
    let m = Manager::new(conn)?;
    map.insert(key, m.clone());
    Ok(m)
}

/// How many shared managers this process has made and not replaced.
pub fn shared_count() -> usize {
    managers().lock().unwrap_or_else(|p| p.into_inner()).len()
}
