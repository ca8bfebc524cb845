//! The nodes one manager talks to, their quorum, and where its background work runs: what
//! the acquire loop, releases, the waiters and the watchdog share (each holds its own
//! settings besides).

use std::time::Duration;

use tokio::runtime::Handle;

use crate::node::Node;
use crate::restart_guard::GuardWindow;
use crate::runtime::Home;

pub(crate) struct Cluster {
    pub nodes: Vec<Node>,
    pub quorum: usize,
    /// The restart guard's window, one for every node (each holds a clone).
    guard_window: GuardWindow,
    home: Home,
}

impl Cluster {
    pub fn new(nodes: Vec<Node>, guard_window: GuardWindow, home: Home) -> Cluster {
        let quorum = nodes.len() / 2 + 1;
        Cluster {
            nodes,
            quorum,
            guard_window,
            home,
        }
    }

    /// Before a lease of `lease` is asked for: the default restart guard covers it (see
    /// `restart_guard.rs`).
    pub fn cover_lease(&self, lease: Duration) {
        self.guard_window.cover(lease);
    }

    pub fn home(&self) -> &Home {
        &self.home
    }

    /// Where background work (tasks that outlive a call) is spawned.
    pub fn handle(&self) -> Handle {
        self.home.handle()
    }

    /// A public call's work, which runs from any executor (see `Home::on_any_executor`).
    pub async fn on_any_executor<F: std::future::Future>(&self, work: F) -> F::Output {
        self.home.on_any_executor(work).await
    }
}
