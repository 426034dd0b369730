//! The names a lock has in the backend: the lock itself, its fence counter,
//! its release channel and its fair queue. A leaf: it imports nothing of
//! this crate, and everything that names a lock asks it.

/// Backend names of one lock.
///
/// The user's key goes inside a `{hash tag}`: `<prefix>{<key>}`, with
/// `:fence`, `:released`, `:queue` and `:queued` appended for the fence
/// counter, the release channel and the fair mode's queue and queue entries.
/// - No collisions: a lock name always ends in `}` and the other two never do,
///   and the prefix may not contain braces, so every name maps back to exactly
///   one key and role.
/// - One cluster slot: Redis hashes the text between the first `{` and the
///   next `}`, which lies inside the common start `<prefix>{<key>}` of all
///   three names. Only a key starting with `}` would make that text empty (and
///   Redis then hashes whole names, splitting the lock across slots), so a key
///   starting with `}` or with the escape `\` gets one `\` in front:
///   `}x` → `{\}x}`, `\x` → `{\\x}`. That keeps the mapping one-to-one.
pub(crate) struct LockNames;

impl LockNames {
    /// The hash of `key` under `prefix`.
    pub(crate) fn lock_key(prefix: &str, key: &str) -> String {
        let mut name = String::with_capacity(prefix.len() + key.len() + 2);
        name.push_str(prefix);
        name.push('{');
        if key.starts_with(['}', '\\']) {
            name.push('\\');
        }
        name.push_str(key);
        name.push('}');
        name
    }

    /// The fence counter of the lock named `lock_key`.
    pub(crate) fn fence(lock_key: &str) -> String {
        format!("{lock_key}:fence")
    }

    /// The release channel of the lock named `lock_key`.
    pub(crate) fn channel(lock_key: &str) -> String {
        format!("{lock_key}:released")
    }

    /// The lock named by a release channel (inverse of [`channel`](Self::channel)).
    pub(crate) fn hash_of_channel(channel: &str) -> &str {
        channel.strip_suffix(":released").unwrap_or(channel)
    }

    /// The fair mode's queue (a list of holder ids) of the lock named `lock_key`.
    pub(crate) fn queue(lock_key: &str) -> String {
        format!("{lock_key}:queue")
    }

    /// The fair mode's queue entries (holder id -> expiry and lease).
    pub(crate) fn queued(lock_key: &str) -> String {
        format!("{lock_key}:queued")
    }

    /// The identity a runtime of `prefix` in the process `process` publishes
    /// (`<prefix>client:<process-uuid>`, see `who.rs`). No braces: no lock's
    /// name, counter, channel or queue.
    pub(crate) fn identity(prefix: &str, process: &str) -> String {
        format!("{prefix}client:{process}")
    }

    /// Redlock: the boot marker each master keeps for the runtimes of
    /// `prefix` (`<prefix>redlock:boot`, a hash without a TTL; see
    /// `scripts/redlock_boot.lua`). It has no braces, so it is no lock's
    /// name, nor any lock's counter, channel or queue.
    pub(crate) fn redlock_boot(prefix: &str) -> String {
        format!("{prefix}redlock:boot")
    }
}

/// The Redis names of a lock, for tools that read the data layout from
/// outside a runtime (`lockctl list` and `watch`): what the runtime itself
/// writes, so the layout is spelled in one place. Applications do not need
/// it: [`LockRuntime::inspect`](crate::LockRuntime::inspect) and
/// [`force_unlock`](crate::LockRuntime::force_unlock) read and change locks.
///
/// ```
/// use lock_runtime::layout;
/// let name = layout::lock_name(layout::DEFAULT_PREFIX, "order:42");
/// assert_eq!(name, "lock:{order:42}");
/// assert_eq!(layout::key_of(layout::DEFAULT_PREFIX, &name).as_deref(), Some("order:42"));
/// assert_eq!(layout::release_channel(&name), "lock:{order:42}:released");
/// assert_eq!(layout::scan_pattern("lock:"), "lock:{*}");
/// ```
pub mod layout {
    use super::LockNames;

    /// The key prefix of a runtime built without
    /// [`key_prefix`](crate::LockRuntimeBuilder::key_prefix) or `LOCK_PREFIX`.
    pub const DEFAULT_PREFIX: &str = "lock:";

    /// The name of the lock hash of `key` under `prefix`: `<prefix>{<key>}`.
    pub fn lock_name(prefix: &str, key: &str) -> String {
        LockNames::lock_key(prefix, key)
    }

    /// The key a lock hash named `name` belongs to under `prefix`; `None`
    /// for any other name (a fence counter, a channel, a queue, another
    /// prefix's lock).
    pub fn key_of(prefix: &str, name: &str) -> Option<String> {
        let inner = name
            .strip_prefix(prefix)?
            .strip_prefix('{')?
            .strip_suffix('}')?;
        // A key starting with `}` or `\` was written with one `\` in front.
        Some(inner.strip_prefix('\\').unwrap_or(inner).to_owned())
    }

    /// Redlock: the boot marker every master keeps for the runtimes of
    /// `prefix`, a hash without a TTL: `since` (the master's clock in ms
    /// when a runtime first found this master's data set), `until` (no new
    /// lock on this master before this time: it lost its data, `docs/deploying.md`,
    /// "Redlock") and `lease` (the longest TTL in ms it gave a hold). Delete
    /// it on a master restored from an older backup, and that master takes
    /// no new lock for one lease.
    ///
    /// ```
    /// use lock_runtime::layout;
    /// assert_eq!(layout::redlock_boot_marker("lock:"), "lock:redlock:boot");
    /// assert_eq!(layout::key_of("lock:", "lock:redlock:boot"), None);
    /// ```
    pub fn redlock_boot_marker(prefix: &str) -> String {
        LockNames::redlock_boot(prefix)
    }

    /// The identity a runtime of `prefix` in the process `process` (the
    /// uuid of its holder ids, `<process>:<n>`) publishes while it lives:
    /// `<prefix>client:<process>`, a string key with a TTL (30 s, refreshed
    /// every 10 s): see [`LockRuntime::client_of`](crate::LockRuntime::client_of).
    ///
    /// ```
    /// use lock_runtime::layout;
    /// let name = layout::client_identity("lock:", "b36c7569");
    /// assert_eq!(name, "lock:client:b36c7569");
    /// assert!(layout::is_client_identity("lock:", &name));
    /// assert_eq!(layout::key_of("lock:", &name), None);
    /// ```
    pub fn client_identity(prefix: &str, process: &str) -> String {
        LockNames::identity(prefix, process)
    }

    /// Whether `name` is a runtime's identity under `prefix` (for a tool
    /// or test that looks at every name under a prefix).
    pub fn is_client_identity(prefix: &str, name: &str) -> bool {
        name.strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix("client:"))
            .is_some_and(|process| !process.contains(['{', '}']))
    }

    /// The channel on which releases of the lock named `name` are announced.
    pub fn release_channel(name: &str) -> String {
        LockNames::channel(name)
    }

    /// A `SCAN MATCH` pattern for every name under `prefix` that may be a
    /// lock hash (glob characters of the prefix escaped); keep those for which
    /// [`key_of`] says which key they belong to.
    pub fn scan_pattern(prefix: &str) -> String {
        let mut pattern = String::with_capacity(prefix.len() + 3);
        for c in prefix.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                pattern.push('\\');
            }
            pattern.push(c);
        }
        pattern.push_str("{*}");
        pattern
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::{layout, LockNames};

    #[test]
    fn every_lock_name_maps_back_to_its_key_and_no_other_name_does() {
        for key in ["a", "}", "}x", "\\}x", "\\x", "x{y}z", "{", "a:fence", "a}"] {
            let name = layout::lock_name("p:", key);
            assert_eq!(layout::key_of("p:", &name).as_deref(), Some(key), "{name}");
            for other in [
                LockNames::fence(&name),
                LockNames::channel(&name),
                LockNames::queue(&name),
                LockNames::queued(&name),
            ] {
                assert_eq!(layout::key_of("p:", &other), None, "{other}");
            }
            assert_eq!(layout::key_of("q:", &name), None);
        }
        assert_eq!(layout::scan_pattern("a*[b]?\\:"), "a\\*\\[b\\]\\?\\\\:{*}");
    }

    #[test]
    fn the_default_prefix_is_the_builders() {
        assert_eq!(crate::LockRuntime::builder().prefix, layout::DEFAULT_PREFIX);
    }

    #[test]
    fn names_share_a_nonempty_hash_tag_and_never_collide() {
        let keys = [
            "a", "a}:fence", "}", "}x", "\\}x", "\\x", "x{y}z", "{", "a:fence", "\n",
        ];
        let mut names = std::collections::HashSet::new();
        for key in keys {
            let lock_key = LockNames::lock_key("lock:", key);
            let fence = LockNames::fence(&lock_key);
            let channel = LockNames::channel(&lock_key);
            assert_eq!(LockNames::hash_of_channel(&channel), lock_key);
            let queue = LockNames::queue(&lock_key);
            let queued = LockNames::queued(&lock_key);
            for name in [&lock_key, &fence, &channel, &queue, &queued] {
                assert!(names.insert(name.clone()), "{name} named twice");
                let open = name.find('{').unwrap();
                let close = open + 1 + name[open + 1..].find('}').unwrap();
                assert!(close > open + 1, "empty hash tag in {name}");
                assert_eq!(
                    &name[..=close],
                    &lock_key[..=close],
                    "{name}: other slot than {lock_key}"
                );
            }
        }
    }
}
