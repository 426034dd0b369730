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
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::LockNames;

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
