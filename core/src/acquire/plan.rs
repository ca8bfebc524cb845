//! Who an attempt acquires as: a fresh token or owner field, or a re-entry of a live acquisition.

use super::kind::Kind;
use crate::options::LockOptions;
use crate::owner::{Holder, new_owner_id};
use crate::shared::Shared;
use crate::token::new_token;

/// Who this attempt acquires as.
pub(super) struct Plan {
    /// The value at the key (plain), or the hash field `"<client uuid>:<owner id>"`.
    pub(super) token: String,
    pub(super) holder: Option<Holder>,
    /// A re-entry of a live acquisition by the same owner: bypasses the queue, keeps the
    /// outer grant's fence, and never creates a new grant.
    pub(super) reentry: bool,
    pub(super) fence: Option<u64>,
}

pub(super) fn plan(
    shared: &Shared,
    key: &str,
    owner: Option<u64>,
    opts: &LockOptions,
    stale: Option<u64>,
) -> Plan {
    if !Kind::of(opts).counted() {
        return Plan {
            token: new_token(),
            holder: None,
            reentry: false,
            fence: None,
        };
    }
    let owners = &shared.owners;
    let rw = opts.rw.is_some();
    if let Some(o) = owner
        && let Some((owner_id, fence)) = owners.lookup(key, o, rw)
        && stale != Some(owner_id)
    {
        return Plan {
            token: owners.field(owner_id),
            holder: Some(Holder {
                owner,
                owner_id,
                rw,
            }),
            reentry: true,
            fence,
        };
    }
    let owner_id = new_owner_id();
    Plan {
        token: owners.field(owner_id),
        holder: Some(Holder {
            owner,
            owner_id,
            rw,
        }),
        reentry: false,
        fence: None,
    }
}

/// The key's release channel: the name of its local waiter queue.
pub(super) fn channel_of(key: &str, opts: &LockOptions) -> String {
    Kind::of(opts).queue_channel(key)
}
