//! The read-write lock's entry (issue 33; DESIGN.md, "Read-write lock"): a read or write
//! hold is acquired, renewed, undone and released by the lock's machinery, in its kind
//! (`acquire::Kind::Read` / `Write`); this module only marks the options with the side and
//! refuses what the side does not allow.

use std::sync::Arc;

use crate::error::Shown;
use crate::error::{Error, Result};
use crate::lock::Lock;
use crate::options::{LockOptions, RwSide};
use crate::shared::Shared;

pub(crate) async fn acquire(
    shared: &Arc<Shared>,
    key: &str,
    owner: Option<u64>,
    opts: &LockOptions,
    side: RwSide,
) -> Result<Lock> {
    let mut opts = opts.clone();
    opts.rw = Some(side);
    check_side(key, &opts)?;
    check_hold_keys(shared, key, side)?;
    crate::acquire::acquire(shared, key, owner, &opts).await
}

/// What a side refuses in its options alone. Part of `crate::check_request`, so that a
/// binding that refuses bad arguments where the request is made (Python's `read_lock()`, C's
/// acquire starts) refuses these there too, not at the acquire.
pub(crate) fn check_side(key: &str, opts: &LockOptions) -> Result<()> {
    if opts.rw == Some(RwSide::Read) && opts.fencing {
        // A fence orders exclusive holders; readers hold together, so a reader's fence
        // would order nothing.
        return Err(Error::invalid(format!(
            "read lock {key:?}: fencing is on, but fence tokens go to writers only; \
             turn fencing off for readers",
            key = Shown(key)
        )));
    }
    Ok(())
}

/// Redisson's read hold keys `{name}:<owner>:rwlock_timeout:<n>` add no braces to a name that
/// contains `{`: when that `{` starts no valid hash tag (`a{b`, `a{}b`), the name and its hold
/// keys hash whole, to different slots, and a cluster refuses the scripts that touch both. One
/// node has no slots, so such a name works there, as in Redisson.
fn check_hold_keys(shared: &Shared, key: &str, side: RwSide) -> Result<()> {
    let on_cluster = shared.cluster.nodes.iter().any(|n| n.is_cluster());
    if !on_cluster || !key.contains('{') || crate::scripts::has_tag(key) {
        return Ok(());
    }
    let kind = match side {
        RwSide::Read => "read lock",
        RwSide::Write => "write lock",
    };
    Err(Error::invalid(format!(
        "{kind} key {key:?} cannot be used on a Redis Cluster: it contains a '{{' that starts no \
         hash tag, so Redisson's read hold keys {:?} would hash to another slot than the key; \
         give the key a hash tag (a non-empty {{...}}) or drop the '{{'",
        crate::scripts::rwlock_timeout_prefix(key, "<owner>"),
        key = Shown(key)
    )))
}
