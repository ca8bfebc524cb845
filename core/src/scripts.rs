//! The Lua scripts, kept as `.lua` files. `redis::Script` sends EVALSHA and, on NOSCRIPT (a
//! restarted node, SCRIPT FLUSH), loads the script and retries once.

use std::sync::LazyLock;

use redis::Script;

pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/release.lua")));
pub(crate) static EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/extend.lua")));
pub(crate) static ACQUIRE_FENCED: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/acquire_fenced.lua")));
pub(crate) static RAISE_FENCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/raise_fence.lua")));

/// The channel a release publishes on: `ferrolock:release:{<key>}`, or without the extra
/// braces when the key already has a hash tag, so that key and channel share a slot (the
/// rule Redisson uses for its channel).
pub fn release_channel(key: &str) -> String {
    tagged("ferrolock:release:", key)
}

/// Where the fence counter for `key` lives.
pub fn fence_key(key: &str) -> String {
    tagged("ferrolock:fence:", key)
}

fn tagged(prefix: &str, key: &str) -> String {
    if key.contains('{') {
        format!("{prefix}{key}")
    } else {
        format!("{prefix}{{{key}}}")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn channel_keeps_the_keys_hash_slot() {
        assert_eq!(
            super::release_channel("orders:1"),
            "ferrolock:release:{orders:1}"
        );
        assert_eq!(
            super::release_channel("{user42}:cart"),
            "ferrolock:release:{user42}:cart"
        );
        assert_eq!(super::fence_key("a"), "ferrolock:fence:{a}");
    }
}
