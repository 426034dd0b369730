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
//! A contender's node is `<lock path>/_c_<uuid>-<name><sequence>`, created
//! ephemeral and sequential: Curator's protected mode, whose uuid lets a
//! create retried after a lost connection find the node it made. `<name>`
//! is the recipe's: `lock-` for an exclusive hold (`InterProcessMutex`),
//! `__WRIT__` and `__READ__` for write and read holds
//! (`InterProcessReadWriteLock`). The uuid is derived from our holder id
//! (`<process uuid>:<n>`: the process uuid with `n` mixed into its last
//! bits), so the holder id alone finds its node, whatever its name; the
//! node's data is the holder id and the session timeout (and, for a
//! downgraded hold's read node, the hold's token), for `inspect` from any
//! process.
//!
//! Order: by the text after the last of the three names (Curator's
//! `fixForSorting`), i.e. by sequence number: one parent, one sequence.
//! A write or exclusive node holds when it is first of all; a read node
//! holds when no write or exclusive node sorts before it (Curator's
//! `readLockPredicate`, which looks for `__WRIT__` only: Curator's
//! read-write lock and its mutex ignore each other's nodes on one path,
//! each sorting the other's last, so a Java service uses one recipe per
//! path; our own processes order all three names by sequence and exclude
//! in any mix).
//!
//! Owns names and order, as pure functions; sends nothing to ZooKeeper.

use crate::error::LockError;
use crate::mode::LockMode;

/// Where locks live when the runtime keeps the default (Redis-style)
/// prefix `lock:`, which is no ZooKeeper path.
pub(crate) const DEFAULT_ROOT: &str = "/locks/";

/// Curator's protected-mode prefix.
const PROTECTED: &str = "_c_";

/// Curator's lock node name (`InterProcessMutex`'s `LOCK_NAME`): our
/// exclusive holds.
const LOCK_NAME: &str = "lock-";

/// `InterProcessReadWriteLock`'s write node name: our write holds.
const WRITE_NAME: &str = "__WRIT__";

/// `InterProcessReadWriteLock`'s read node name: our read holds.
const READ_NAME: &str = "__READ__";

/// Every name a contender's node may have.
const NAMES: [&str; 3] = [LOCK_NAME, WRITE_NAME, READ_NAME];

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

/// `_c_<uuid>-`: what every node of `holder` starts with.
fn holder_prefix(holder: &str) -> String {
    format!("{PROTECTED}{}-", protected_id(holder))
}

/// The name a create is given for `holder` holding in `mode` (the server
/// appends the sequence): `_c_<uuid>-lock-`, `…-__WRIT__` or `…-__READ__`.
pub(crate) fn node_prefix(holder: &str, mode: LockMode) -> String {
    let name = match mode {
        LockMode::Read => READ_NAME,
        LockMode::Write => WRITE_NAME,
        _ => LOCK_NAME,
    };
    format!("{}{name}", holder_prefix(holder))
}

/// Whether the child `name` is a node of `holder`, of any mode (found by
/// its uuid after a create whose answer was lost, or at its release).
pub(crate) fn is_holders(name: &str, holder: &str) -> bool {
    name.strip_prefix(&holder_prefix(holder))
        .is_some_and(|rest| NAMES.iter().any(|n| rest.starts_with(n)))
}

/// The recipe name of a node and the text after it (its sequence): split
/// after the last of the names, as Curator's `fixForSorting` does.
fn split(name: &str) -> Option<(&'static str, &str)> {
    NAMES
        .iter()
        .filter_map(|n| name.rfind(n).map(|i| (i + n.len(), *n)))
        .max_by_key(|(end, _)| *end)
        .map(|(end, n)| (n, &name[end..]))
}

/// What children sort by: the text after the last recipe name, or the
/// whole name when there is none.
fn sort_key(name: &str) -> &str {
    split(name).map_or(name, |(_, key)| key)
}

/// Whether the contender node `name` is a read node (else it excludes
/// readers: a write or exclusive node).
pub(crate) fn reads(name: &str) -> bool {
    split(name).is_some_and(|(n, _)| n == READ_NAME)
}

/// The name of the read node that replaces the write or exclusive node
/// `name` at a downgrade: the same uuid and sequence (as Curator ≥ 5.5.0
/// makes it, CURATOR-621), so that it keeps the write node's place in
/// the queue, ahead of every writer queued meanwhile.
pub(crate) fn read_name(name: &str) -> Option<String> {
    let (recipe, sequence) = split(name)?;
    let start = name.len() - sequence.len() - recipe.len();
    Some(format!("{}{READ_NAME}{sequence}", &name[..start]))
}

/// The contenders among `children`, in lock order. Children that are no
/// contender's node (the lock path of a nested key: `a/b` lives under
/// `a`'s path) are left out; Curator sorts them after every sequence
/// number, so its order of the contenders is the same. (Equal sequences,
/// a Curator read node made at its downgrade beside its write node, are
/// ordered by name.)
pub(crate) fn sorted(mut children: Vec<String>) -> Vec<String> {
    children.retain(|c| {
        split(c).is_some_and(|(_, key)| !key.is_empty() && key.bytes().all(|b| b.is_ascii_digit()))
    });
    children.sort_by(|a, b| sort_key(a).cmp(sort_key(b)).then_with(|| a.cmp(b)));
    children
}

/// Where a contender node stands among the contenders.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Turn<'a> {
    /// Not among them.
    Gone,
    /// It holds the lock.
    Holds,
    /// It waits for this node, the one to watch: for a write or exclusive
    /// node the one just before it, for a read node the last write or
    /// exclusive node before it (Curator's reader watches the first: the
    /// rule of who holds, which decides interop, is the same, and the last
    /// wakes the reader once instead of once per writer ahead).
    Behind(&'a str),
}

/// The [`Turn`] of the node `ours` among the `sorted` contenders.
pub(crate) fn turn<'a>(sorted: &'a [String], ours: &str) -> Turn<'a> {
    let Some(i) = sorted.iter().position(|c| c == ours) else {
        return Turn::Gone;
    };
    let before = &sorted[..i];
    let blocker = if reads(ours) {
        before.iter().rev().find(|c| !reads(c))
    } else {
        before.last()
    };
    blocker.map_or(Turn::Holds, |c| Turn::Behind(c))
}

/// The contenders of `sorted` that hold the lock: the first if it is a
/// write or exclusive node, else the leading run of read nodes.
pub(crate) fn holders(sorted: &[String]) -> &[String] {
    match sorted.iter().take_while(|c| reads(c)).count() {
        0 => &sorted[..sorted.len().min(1)],
        readers => &sorted[..readers],
    }
}

/// `<lock path>/<child>`.
pub(crate) fn child(lock: &str, name: &str) -> String {
    format!("{lock}/{name}")
}

/// A node's data: `<holder id> <session timeout ms>`.
pub(crate) fn node_data(holder: &str, session_ms: u128) -> Vec<u8> {
    format!("{holder} {session_ms}").into_bytes()
}

/// The data of a downgraded hold's read node: `<holder id> <token>
/// <session timeout ms>`. The node's own czxid is not the hold's token (the
/// hold keeps its write node's), so the token is written down for
/// `inspect`. (A reader of the two-word form takes `<holder id> <token>`
/// for the holder id, and still reads the timeout right.)
pub(crate) fn downgraded_data(holder: &str, token: i64, session_ms: u128) -> Vec<u8> {
    format!("{holder} {token} {session_ms}").into_bytes()
}

/// What a node's data says: the holder id, the session timeout, and the
/// token of a downgraded hold's read node. A node of another client
/// (Curator's, say) holds its own bytes: `None`.
pub(crate) fn parse_data(data: &[u8]) -> Option<(String, u64, Option<u64>)> {
    let text = std::str::from_utf8(data).ok()?;
    let words: Vec<&str> = text.split(' ').collect();
    let (holder, token, ms) = match words[..] {
        [holder, ms] => (holder, None, ms),
        [holder, token, ms] => (holder, Some(token.parse().ok()?), ms),
        _ => return None,
    };
    Some((holder.to_owned(), ms.parse().ok()?, token))
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
        for mode in [LockMode::Exclusive, LockMode::Write, LockMode::Read] {
            let name = format!("{}0000000007", node_prefix(&a, mode));
            assert!(is_holders(&name, &a) && !is_holders(&name, &b), "{name}");
        }
    }

    #[test]
    fn each_mode_has_curators_node_name() {
        let holder = "67e55044-10b1-426f-9247-bb680e5fe0c8:3";
        let uuid = protected_id(holder);
        assert_eq!(
            node_prefix(holder, LockMode::Exclusive),
            format!("_c_{uuid}-lock-")
        );
        assert_eq!(
            node_prefix(holder, LockMode::Write),
            format!("_c_{uuid}-__WRIT__")
        );
        assert_eq!(
            node_prefix(holder, LockMode::Read),
            format!("_c_{uuid}-__READ__")
        );
        let write = format!("_c_{uuid}-__WRIT__0000000012");
        assert_eq!(
            read_name(&write).as_deref(),
            Some(format!("_c_{uuid}-__READ__0000000012").as_str())
        );
        let exclusive = format!("_c_{uuid}-lock-0000000013");
        assert_eq!(
            read_name(&exclusive).as_deref(),
            Some(format!("_c_{uuid}-__READ__0000000013").as_str())
        );
    }

    /// `r`, `w`, `x`: a read, write or exclusive node of sequence `n`.
    fn node(kind: char, n: u32) -> String {
        let name = match kind {
            'r' => READ_NAME,
            'w' => WRITE_NAME,
            _ => LOCK_NAME,
        };
        format!("_c_{n:08x}-0000-0000-0000-000000000000-{name}{n:010}")
    }

    #[test]
    fn readers_wait_for_writers_before_them_and_writers_for_anyone() {
        // Listed out of order, as the server lists them.
        let children = vec![
            node('r', 5),
            node('w', 3),
            node('r', 1),
            node('x', 4),
            node('r', 2),
        ];
        let sorted = sorted(children);
        assert_eq!(
            sorted,
            [
                node('r', 1),
                node('r', 2),
                node('w', 3),
                node('x', 4),
                node('r', 5)
            ]
        );
        assert_eq!(holders(&sorted), [node('r', 1), node('r', 2)]);
        assert_eq!(turn(&sorted, &node('r', 2)), Turn::Holds);
        let w3 = node('w', 3);
        let x4 = node('x', 4);
        // A writer waits for the node just before it, reader or not.
        assert_eq!(turn(&sorted, &w3), Turn::Behind(node('r', 2).as_str()));
        assert_eq!(turn(&sorted, &x4), Turn::Behind(w3.as_str()));
        // A reader waits for the last writer before it.
        assert_eq!(turn(&sorted, &node('r', 5)), Turn::Behind(x4.as_str()));
        assert_eq!(turn(&sorted, &node('r', 6)), Turn::Gone);
        let writer_first = vec![node('x', 7), node('r', 8)];
        assert_eq!(holders(&writer_first), [node('x', 7)]);
        assert!(holders(&[]).is_empty());
    }

    #[test]
    fn a_downgraded_nodes_data_carries_the_holds_token() {
        let holder = "67e55044-10b1-426f-9247-bb680e5fe0c8:3";
        assert_eq!(
            parse_data(&node_data(holder, 5000)),
            Some((holder.to_owned(), 5000, None))
        );
        assert_eq!(
            parse_data(&downgraded_data(holder, 77, 5000)),
            Some((holder.to_owned(), 5000, Some(77)))
        );
        // Curator's own data (the client's address by default).
        assert_eq!(parse_data(b"172.17.0.2"), None);
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
