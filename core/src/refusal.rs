//! Error replies that refuse a request for good, each mapped once from its reply's code
//! (`Refusal::of`, called by `Node::classify`) to the caller's error kind and a clean message:
//! the request's name and the values that clash, never the server's error code or a node's
//! URL, since the request, not a node, is at fault (every node would answer the same).

use std::fmt;

use crate::error::{Error, ErrorKind};

/// Why a node's script refused a request that can never be granted as asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// `RWLOCK_UPGRADE` (`acquire_write.lua`): the owner asks for the write lock while it
    /// holds the read lock. Two upgraders would wait for each other forever.
    Upgrade,
    /// `SEMAPHORE_SIZE` (`semaphore_acquire.lua`): the semaphore's stored pool size is not the
    /// one asked for.
    PoolSize { stored: u64, asked: u64 },
    /// `SEMAPHORE_COUNTER` (`semaphore_acquire.lua`): the semaphore's counter, set by another
    /// client, is no whole number Redis can count with, or makes a pool below zero; what the
    /// script says of it ("its counter holds ...").
    Counter(String),
    /// `WRONGTYPE`: the key holds a value of a kind no lock has. The acquire scripts (and the
    /// plain `SET NX`'s check) name it ("a list"); Redis's own WRONGTYPE does not (`None`).
    OtherKind(Option<String>),
}

impl Refusal {
    /// The refusal an error reply's `code` and `detail` stand for; `None` for any other error.
    pub(crate) fn of(code: &str, detail: &str) -> Option<Refusal> {
        match code {
            "RWLOCK_UPGRADE" => Some(Refusal::Upgrade),
            // "semaphore <name> has <stored> permits, asked for <asked>": the numbers are the
            // fourth-last and the last word (a name may hold spaces).
            "SEMAPHORE_SIZE" => {
                let mut words = detail.rsplit(' ');
                let asked = words.next()?.parse().ok()?;
                let stored = words.nth(3)?.parse().ok()?;
                Some(Refusal::PoolSize { stored, asked })
            }
            // "semaphore <name>: its counter holds ...": the last such phrase (a name may hold
            // it; the value after it, a number to Lua, cannot).
            "SEMAPHORE_COUNTER" => detail
                .rfind(": its counter holds ")
                .map(|at| Refusal::Counter(detail[at + 2..].to_string())),
            // "key <key> holds a <type>, not a lock" (`queue.lua`'s `foreign_type`).
            "WRONGTYPE" => Some(Refusal::OtherKind(
                detail
                    .rsplit_once(" holds ")
                    .and_then(|(_, t)| t.strip_suffix(", not a lock"))
                    .map(str::to_string),
            )),
            _ => None,
        }
    }

    /// The caller's error for the request `what` names (`lock "k"`, `semaphore "s"`).
    pub(crate) fn error(&self, what: &str) -> Error {
        let (kind, joint) = match self {
            // A request that can never be granted, whoever waits: the caller's to change.
            Refusal::Upgrade => (ErrorKind::InvalidArgument, ": "),
            Refusal::PoolSize { .. } => (ErrorKind::InvalidArgument, " "),
            // The key's data, not the request, is at fault.
            Refusal::OtherKind(_) | Refusal::Counter(_) => (ErrorKind::Redis, ": "),
        };
        Error::new(kind, format!("{what}{joint}{self}"))
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Upgrade => f.write_str(
                "a read->write upgrade is refused: this owner holds its read lock, and two \
                 upgraders would wait for each other forever; release the read lock first",
            ),
            Refusal::PoolSize { stored, asked } => {
                write!(f, "has {stored} permits, asked for {asked}")
            }
            Refusal::Counter(text) => f.write_str(text),
            Refusal::OtherKind(Some(kind)) => write!(f, "the key holds {kind}, not a lock"),
            Refusal::OtherKind(None) => {
                f.write_str("a key it uses holds a value of another kind (WRONGTYPE)")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The replies' texts as the scripts write them (`core/scripts/`).
    #[test]
    fn each_code_maps_to_its_refusal() {
        assert_eq!(
            Refusal::of("SEMAPHORE_SIZE", "semaphore a b has 4 permits, asked for 5"),
            Some(Refusal::PoolSize {
                stored: 4,
                asked: 5
            })
        );
        assert_eq!(
            Refusal::of("WRONGTYPE", "key a holds b holds a list, not a lock"),
            Some(Refusal::OtherKind(Some("a list".into())))
        );
        assert_eq!(
            Refusal::of(
                "WRONGTYPE",
                "Operation against a key holding the wrong kind of value"
            ),
            Some(Refusal::OtherKind(None))
        );
        assert_eq!(
            Refusal::of("RWLOCK_UPGRADE", "k: ..."),
            Some(Refusal::Upgrade)
        );
        assert_eq!(
            Refusal::of(
                "SEMAPHORE_COUNTER",
                "semaphore a: its counter holds b: its counter holds \"2.5\", not a whole number"
            ),
            Some(Refusal::Counter(
                "its counter holds \"2.5\", not a whole number".into()
            ))
        );
        assert_eq!(Refusal::of("SEMAPHORE_SIZE", "garbled"), None);
        assert_eq!(Refusal::of("SEMAPHORE_COUNTER", "garbled"), None);
        assert_eq!(
            Refusal::of("ERR", "semaphore s has 4 permits, asked for 5"),
            None
        );
        assert_eq!(
            Refusal::PoolSize {
                stored: 4,
                asked: 5
            }
            .error("semaphore \"s\"")
            .message(),
            "semaphore \"s\" has 4 permits, asked for 5"
        );
    }
}
