//! Requests refused before anything is sent: a bad key (empty, or no name derived from it
//! could share its Cluster slot), bad options, a lease the watchdog cannot keep.

use super::kind::Kind;
use crate::error::Shown;
use crate::error::{Error, Result};
use crate::shared::Shared;

/// What an acquire of `key` with `opts` refuses before it sends anything (the key, the
/// options, the lease), for a binding that starts an acquire and promises its caller that bad
/// arguments fail at the start. (A key the sharded pub/sub of a cluster cannot serve is found
/// by the acquire itself: that takes the nodes.)
pub fn check_request(key: &str, opts: &crate::LockOptions) -> Result<()> {
    if let Some(p) = opts.permits {
        return crate::semaphore::check_request(key, p.permits, p.count, opts);
    }
    check_key(key)?;
    opts.validate().map_err(|e| e.about("lock", key))?;
    crate::rwlock::check_side(key, opts)?;
    crate::lock::check_lease(opts, || format!("for lock {key:?}", key = Shown(key)))
}

pub(crate) fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::invalid("lock key must not be empty"));
    }
    // The queue, fence and channel names must hash to the key's Cluster slot (every script
    // touches one slot); for this key no name can (see `scripts::has_slot_tag`).
    if !crate::scripts::has_slot_tag(key) {
        return Err(Error::invalid(format!(
            "lock key {key:?} has no hash tag and contains '}}', so no name derived from it can \
             share its Redis Cluster slot: give it a hash tag (a non-empty {{...}}) or drop the '}}'",
            key = Shown(key)
        )));
    }
    Ok(())
}

/// A reentrant or read-write lock's release publishes on Redisson's channel, which keeps Redisson's own
/// name byte for byte: for a key with a `{` that starts no valid hash tag it is in another
/// slot than the key. On a cluster with sharded pub/sub the release script's SPUBLISH runs
/// on the key's primary, while the channel's subscribers listen on its own slot's primary
/// (and Redis refuses the script's access when that is another node, after the DEL).
pub(super) fn check_redisson_channel(shared: &Shared, key: &str, kind: Kind) -> Result<()> {
    // Without a `{`, Redisson's channel wraps the key in braces: always the key's slot.
    if !key.contains('{') || !shared.cluster.nodes.iter().any(|n| n.may_shard()) {
        return Ok(());
    }
    let channel = kind.undo_channel(key);
    let (slot, channel_slot) = (
        crate::node_cluster::key_slot(key),
        crate::node_cluster::key_slot(&channel),
    );
    if slot == channel_slot {
        return Ok(());
    }
    Err(Error::invalid(format!(
        "{} key {key:?} cannot be used on a Redis Cluster with sharded pub/sub: \
         Redisson's release channel {channel:?} hashes to slot {channel_slot}, not the key's slot \
         {slot} (a `{{` that starts no hash tag); give the key a hash tag (a non-empty {{...}}), \
         or set sharded_pubsub off",
        kind.name(),
        key = Shown(key)
    )))
}
