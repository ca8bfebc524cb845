//! A won grant on its way to a blocking caller through a channel, undone if nobody claims it.

use std::sync::{Arc, Mutex};

use super::attempt::Req;
use super::undo::undo_detached;
use crate::shared::Shared;

/// A won attempt's grant on its way to a blocking caller (see `run_attempt`). The attempt's
/// task keeps driving the slower nodes' requests after it sent the outcome; whichever of the
/// task and this guard finishes second undoes the grant, unless the caller claimed it. So a
/// grant whose receiver is dropped before it was read (Ctrl-C between wait slices, the
/// exit-time close) is released, once every node has answered.
pub(super) struct Claim {
    pub(super) shared: Arc<Shared>,
    pub(super) req: Arc<Req>,
    pub(super) state: Arc<Mutex<ClaimState>>,
}

#[derive(Default)]
pub(super) struct ClaimState {
    pub(super) claimed: bool,
    /// The guard was dropped unclaimed before the task knew every node's answer: the task
    /// undoes.
    pub(super) abandoned: bool,
    /// Set by the task once every node has answered: where the grant may be held.
    pub(super) mask: Option<Vec<bool>>,
}

impl Claim {
    /// The caller turns the grant into a `Lock`.
    pub(super) fn claim(self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).claimed = true;
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.claimed {
            return;
        }
        match st.mask.take() {
            None => st.abandoned = true,
            Some(mask) => {
                drop(st);
                let (shared, req) = (self.shared.clone(), self.req.clone());
                crate::runtime::spawn_cleanup(&self.shared.cluster.handle(), async move {
                    undo_detached(&shared, &req, mask, false).finish().await;
                });
            }
        }
    }
}
