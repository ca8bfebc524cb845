//! Who holds a reentrant lock: the manager's client uuid and, per (key, owner, kind), the random
//! owner id of the outermost acquisition that is still live.
//!
//! The hash field of a reentrant lock is `"<client uuid>:<owner id>"` (Redisson's layout). The
//! caller names the owner (a thread, an asyncio task, an explicit handle: a `u64` of its
//! choosing); the core maps it to a random 63-bit owner id chosen at the owner's outermost
//! acquisition and reused by its re-entries while any handle of that acquisition is live. So
//! the field is unique per acquisition, like a token: a stale handle from an earlier
//! acquisition by the same owner can never decrement a later acquisition's count.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::per_process::PerProcess;

/// The reentrancy side of a held lock: whose it is and which acquisition it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Holder {
    /// The caller's owner identity (`None`: a one-off owner, never re-entered).
    pub owner: Option<u64>,
    /// The random id in the hash field.
    pub owner_id: u64,
    /// A read-write lock's hold (read or write), not a reentrant lock's: an owner's
    /// acquisitions of the two kinds on one key are apart, so that neither re-enters the
    /// other (a reentrant "re-entry" of a read hold was an exclusive lock beside other
    /// readers, and its release deleted their holds: found by a review).
    pub rw: bool,
}

/// The reentrant acquisitions of one manager, per process: a forked child starts afresh
/// (a new client uuid, nothing held), so it neither shares its parent's uuid nor re-enters
/// its parent's locks.
#[derive(Default)]
pub(crate) struct Owners {
    state: PerProcess<Mutex<State>>,
}

struct State {
    client_id: String,
    /// By (key, owner, read-write kind).
    held: HashMap<(String, u64, bool), Held>,
}

struct Held {
    owner_id: u64,
    /// Handles of this acquisition not yet released.
    live: usize,
    fence: Option<u64>,
}

impl Owners {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .get_or_init(|| {
                Mutex::new(State {
                    client_id: new_uuid(),
                    held: HashMap::new(),
                })
            })
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// This manager's client uuid in this process (36-char canonical form).
    pub fn client_id(&self) -> String {
        self.state().client_id.clone()
    }

    /// The hash field for `owner_id` in this process.
    pub fn field(&self, owner_id: u64) -> String {
        format!("{}:{owner_id}", self.state().client_id)
    }

    /// The live acquisition of `key` by `owner`, of a read-write lock (`rw`) or a reentrant
    /// one: its owner id and fence.
    pub fn lookup(&self, key: &str, owner: u64, rw: bool) -> Option<(u64, Option<u64>)> {
        let s = self.state();
        s.held
            .get(&(key.to_string(), owner, rw))
            .filter(|h| h.live > 0)
            .map(|h| (h.owner_id, h.fence))
    }

    /// A handle of `holder`'s acquisition was granted (the outermost grant or a re-entry). A
    /// new owner id replaces an earlier acquisition (one that was lost): that one's handles
    /// no longer count.
    pub fn granted(&self, key: &str, holder: Holder, fence: Option<u64>) {
        let Some(owner) = holder.owner else { return };
        let mut s = self.state();
        let entry = s
            .held
            .entry((key.to_string(), owner, holder.rw))
            .or_insert(Held {
                owner_id: holder.owner_id,
                live: 0,
                fence,
            });
        if entry.owner_id != holder.owner_id {
            *entry = Held {
                owner_id: holder.owner_id,
                live: 0,
                fence,
            };
        }
        entry.live += 1;
    }

    /// A handle was released (or dropped): at zero live handles the owner's next acquire is an
    /// outermost one again, with a new owner id.
    pub fn released(&self, key: &str, holder: Holder) {
        let Some(owner) = holder.owner else { return };
        let mut s = self.state();
        let k = (key.to_string(), owner, holder.rw);
        if let Some(h) = s.held.get_mut(&k)
            && h.owner_id == holder.owner_id
        {
            h.live = h.live.saturating_sub(1);
            if h.live == 0 {
                s.held.remove(&k);
            }
        }
    }
}

/// A random 63-bit owner id (Redisson's thread ids are positive Java longs), from the OS CSPRNG.
pub(crate) fn new_owner_id() -> u64 {
    getrandom::u64().expect("the operating system's random source failed") >> 1
}

/// A version 4 UUID in its canonical 36-char form, from the OS CSPRNG (never a userspace
/// generator whose state a fork would duplicate).
pub(crate) fn new_uuid() -> String {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).expect("the operating system's random source failed");
    b[6] = (b[6] & 0x0f) | 0x40; // version 4
    b[8] = (b[8] & 0x3f) | 0x80; // RFC 4122 variant
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_canonical_v4() {
        let u = new_uuid();
        assert_eq!(u.len(), 36);
        let parts: Vec<&str> = u.split('-').collect();
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(parts[2].starts_with('4'), "{u}");
        assert!("89ab".contains(&parts[3][..1]), "{u}");
        assert_ne!(u, new_uuid());
    }

    #[test]
    fn owner_ids_fit_63_bits() {
        for _ in 0..100 {
            assert!(new_owner_id() < 1 << 63);
        }
    }

    #[test]
    fn registry_reuses_the_owner_id_while_a_handle_lives() {
        let o = Owners::default();
        let h = Holder {
            owner: Some(7),
            owner_id: 42,
            rw: false,
        };
        assert_eq!(o.lookup("k", 7, false), None);
        o.granted("k", h, Some(3));
        o.granted("k", h, Some(3));
        assert_eq!(o.lookup("k", 7, false), Some((42, Some(3))));
        assert_eq!(o.lookup("k", 8, false), None, "another owner");
        assert_eq!(o.lookup("k", 7, true), None, "a read-write lock's");
        o.released("k", h);
        assert_eq!(o.lookup("k", 7, false), Some((42, Some(3))));
        // A stale handle of an earlier acquisition does not count.
        o.released(
            "k",
            Holder {
                owner: Some(7),
                owner_id: 1,
                rw: false,
            },
        );
        assert_eq!(o.lookup("k", 7, false), Some((42, Some(3))));
        o.released("k", h);
        assert_eq!(o.lookup("k", 7, false), None);
        assert!(o.field(42).ends_with(":42"));
        assert_eq!(o.field(42).len(), 36 + 3);
    }
}
