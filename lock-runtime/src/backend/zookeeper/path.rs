//! The recipe's names, as Curator writes them: the lock path, the
//! contender nodes in it, and their order.
//!
//! The lock path is the prefix followed by the key, as it is (`/locks/` +
//! `order:1` = `/locks/order:1`): the path a Java service gives
//! `InterProcessMutex` for the same lock. A key with `/` in it nests
//! (`a/b` is `/locks/a/b`). A key that would not make a ZooKeeper path
//! (an empty, `.` or `..` segment, a trailing `/`, or a character
//! ZooKeeper refuses: control, private-use, beyond U+FFFF) is refused with [`LockError::InvalidKey`] before any
//! round trip, never mapped to another name: a mapped name would be a
//! different lock for the Java side.
//!
//! A contender's node is `<lock path>/_c_<uuid>-lock-<sequence>`, created
//! ephemeral and sequential: Curator's protected mode, whose uuid lets a
//! create retried after a lost connection find the node it made. The uuid
//! is derived from our holder id (`<process uuid>:<n>`: the process uuid
//! with `n` mixed into its last bits), so the holder id alone finds its
//! node; the node's data is the holder id and the session timeout, for
//! `inspect` from any process.
//!
//! Order: by the text after the last `lock-` (Curator's
//! `StandardLockInternalsDriver.fixForSorting`), i.e. by sequence number.

use crate::error::LockError;

/// Where locks live when the runtime keeps the default (Redis-style)
/// prefix `lock:`, which is no ZooKeeper path.
pub(crate) const DEFAULT_ROOT: &str = "/locks/";

/// Curator's protected-mode prefix.
const PROTECTED: &str = "_c_";

/// Curator's lock node name (`InterProcessMutex`'s `LOCK_NAME`).
const LOCK_NAME: &str = "lock-";

/// The lock path of `key` under the runtime's `prefix` (the default prefix
/// becomes [`DEFAULT_ROOT`]).
pub(crate) fn lock_path(prefix: &str, key: &str) -> String {
    let prefix = if prefix == crate::names::layout::DEFAULT_PREFIX {
        DEFAULT_ROOT
    } else {
        prefix
    };
    format!("{prefix}{key}")
}

/// Why ZooKeeper would refuse `path` (its `PathUtils.validatePath`), if it
/// would.
pub(crate) fn invalid(path: &str) -> Option<&'static str> {
    let Some(rest) = path.strip_prefix('/') else {
        return Some("a ZooKeeper lock path starts with `/` (set a key prefix such as `/locks/`)");
    };
    if rest.is_empty() || rest.ends_with('/') {
        return Some("a ZooKeeper path may not end with `/`");
    }
    for segment in rest.split('/') {
        match segment {
            "" => return Some("a ZooKeeper path may not hold `//` (an empty segment)"),
            "." | ".." => return Some("a ZooKeeper path may not hold a `.` or `..` segment"),
            _ => {}
        }
    }
    let refused = |c: char| matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' | '\u{e000}'..='\u{f8ff}' | '\u{fff0}'..='\u{ffff}');
    if path.chars().any(refused) {
        return Some("ZooKeeper refuses control and private-use characters in a path");
    }
    // Java sees these as surrogate pairs, which its check refuses.
    path.chars()
        .any(|c| u32::from(c) > 0xffff)
        .then_some("ZooKeeper refuses characters beyond U+FFFF (emoji, for one) in a path")
}

/// [`invalid`] of the key's lock path, as the error the caller gets.
pub(crate) fn check_key(key: &str, path: &str) -> Result<(), LockError> {
    match invalid(path) {
        Some(reason) => Err(LockError::invalid_key(key, reason)),
        None => Ok(()),
    }
}

/// The protected-mode uuid of `holder`: the process uuid of a
/// `<uuid>:<n>` holder id with `n` xor-ed into its low bits (distinct for
/// every `n` of a process; a plain uuid, as Curator parses it). Any other
/// holder id is hashed.
pub(crate) fn protected_id(holder: &str) -> String {
    let parsed = holder.rsplit_once(':').and_then(|(process, n)| {
        let process = uuid::Uuid::parse_str(process).ok()?;
        let n: u64 = n.parse().ok()?;
        Some(process.as_u128() ^ u128::from(n))
    });
    let bits = parsed.unwrap_or_else(|| {
        use std::hash::{Hash, Hasher};
        let half = |salt: u8| {
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            (salt, holder).hash(&mut hasher);
            hasher.finish()
        };
        (u128::from(half(1)) << 64) | u128::from(half(2))
    });
    uuid::Uuid::from_u128(bits).hyphenated().to_string()
}

/// The name a create is given for `holder` (the server appends the
/// sequence): `_c_<uuid>-lock-`.
pub(crate) fn node_prefix(holder: &str) -> String {
    format!("{PROTECTED}{}-{LOCK_NAME}", protected_id(holder))
}

/// Whether the child `name` is `holder`'s node (found by its uuid after a
/// create whose answer was lost).
pub(crate) fn is_holders(name: &str, holder: &str) -> bool {
    name.starts_with(&node_prefix(holder))
}

/// What children sort by: the text after the last `lock-`, or the whole
/// name when there is none.
fn sort_key(name: &str) -> &str {
    match name.rfind(LOCK_NAME) {
        Some(i) => &name[i + LOCK_NAME.len()..],
        None => name,
    }
}

/// The contenders among `children`, in lock order: the first holds.
/// Children that are no contender's node (the lock path of a nested key:
/// `a/b` lives under `a`'s path) are left out; Curator sorts them after
/// every sequence number, so its order of the contenders is the same.
pub(crate) fn sorted(mut children: Vec<String>) -> Vec<String> {
    children.retain(|c| {
        c.contains(LOCK_NAME) && {
            let key = sort_key(c);
            !key.is_empty() && key.bytes().all(|b| b.is_ascii_digit())
        }
    });
    children.sort_by(|a, b| sort_key(a).cmp(sort_key(b)));
    children
}

/// `<lock path>/<child>`.
pub(crate) fn child(lock: &str, name: &str) -> String {
    format!("{lock}/{name}")
}

/// A node's data: `<holder id> <session timeout ms>`.
pub(crate) fn node_data(holder: &str, session_ms: u128) -> Vec<u8> {
    format!("{holder} {session_ms}").into_bytes()
}

/// The holder id and session timeout of a node's data (a node another
/// client made, Curator's say, holds its own bytes: `None`).
pub(crate) fn parse_data(data: &[u8]) -> Option<(String, u64)> {
    let text = std::str::from_utf8(data).ok()?;
    let (holder, ms) = text.rsplit_once(' ')?;
    Some((holder.to_owned(), ms.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_the_path_after_the_prefix_as_curator_is_given_it() {
        assert_eq!(lock_path("lock:", "k"), "/locks/k");
        assert_eq!(lock_path("/svc/", "order:1"), "/svc/order:1");
        assert!(invalid("/locks/order:1").is_none());
        assert!(invalid("/locks/a/b").is_none());
        for bad in [
            "/locks/a//b",
            "/locks/a/",
            "/locks/..",
            "/locks/a\u{1}",
            "locks/a",
        ] {
            assert!(invalid(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn a_holder_finds_its_node_by_a_plain_uuid_distinct_per_holder() {
        let process = "67e55044-10b1-426f-9247-bb680e5fe0c8";
        let (a, b) = (format!("{process}:1"), format!("{process}:2"));
        assert_ne!(protected_id(&a), protected_id(&b));
        assert!(uuid::Uuid::parse_str(&protected_id(&a)).is_ok());
        assert_eq!(protected_id(&a).len(), 36);
        let name = format!("{}0000000007", node_prefix(&a));
        assert!(is_holders(&name, &a) && !is_holders(&name, &b));
    }

    #[test]
    fn children_sort_by_sequence_whatever_their_uuid() {
        let children = vec![
            "_c_ffffffff-0000-0000-0000-000000000000-lock-0000000002".to_owned(),
            "_c_00000000-0000-0000-0000-000000000000-lock-0000000003".to_owned(),
            "_c_88888888-0000-0000-0000-000000000000-lock-0000000001".to_owned(),
        ];
        let last: Vec<char> = sorted(children)
            .iter()
            .filter_map(|c| c.chars().last())
            .collect();
        assert_eq!(last, ['1', '2', '3']);
        // A nested key's lock path is no contender.
        let nested = vec!["b".to_owned(), "_c_x-lock-0000000004".to_owned()];
        assert_eq!(sorted(nested), ["_c_x-lock-0000000004"]);
    }
}
