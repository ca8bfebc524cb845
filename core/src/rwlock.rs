//! The read-write lock's entry (issue 33; DESIGN.md, "Read-write lock"): a read or write
//! hold is acquired, renewed, undone and released by the lock's machinery, in its kind
//! (`acquire::Kind::Read` / `Write`); this module only marks the options with the side and
//! refuses what the side does not allow.

use std::sync::Arc;

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
    if side == RwSide::Read && opts.fencing {
        // A fence orders exclusive holders; readers hold together, so a reader's fence
        // would order nothing.
        return Err(Error::invalid(format!(
            "read lock {key:?}: fencing is on, but fence tokens go to writers only; \
             turn fencing off for readers"
        )));
    }
    let mut opts = opts.clone();
    opts.rw = Some(side);
    crate::acquire::acquire(shared, key, owner, &opts).await
}
