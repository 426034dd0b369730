//! Read holds on etcd (read-write locks, `docs/design/read-write.md` §4):
//! which keys of a lock's directory are readers, and which writer a reader
//! waits for.
//!
//! A reader's key is `<lock>/read/<holder>`, inside the directory, so a
//! writer (ours, or `etcdctl lock`, which waits for every older key of the
//! directory) waits for it as for any key. A write key `<lock>/<holder>`
//! whose value is `r` is a reader too: a downgraded hold (its name and
//! create revision kept, so it still stands before the writers queued
//! after it). Everything else is a writer: our write and exclusive keys,
//! and `etcdctl`'s `<lock>/<lease id>`.
//!
//! A reader holds when no writer was created before it; it waits for the
//! *last* writer before it (etcd's `recipes/rwmutex.go` rule). A value
//! only ever turns from writer to `r` (a downgrade), never back: a reader
//! that entered because a key before it was `r` is never overtaken by that
//! key becoming a writer. No attempt changes a key's mode (`modes.rs`).
//!
//! Writers are read from the two ranges of the directory outside `read/`:
//! `[<lock>/, <lock>/read/)` and `[<lock>/read0, <lock>0)` (`read0` and
//! `<lock>0` end the prefixes `read/` and `<lock>/`). Keys valued `r` in
//! them are skipped on the client; pages of [`PAGE`] keys keep one read
//! small, and more pages are read only when a page is all `r`.
//!
//! Owns the reading of a directory's writers and readers; puts and deletes
//! no key.

use etcd_client::{Compare, CompareOp, GetOptions, GetResponse, SortOrder, SortTarget, TxnOp};

use super::Inner;
use crate::error::BackendError;

/// The value that makes a write key a reader.
pub(super) const READER: &[u8] = b"r";

/// Keys per page of a writer range.
const PAGE: i64 = 16;

/// Pages read at most when looking for a writer behind downgraded keys
/// (over a thousand downgraded holds of one lock: then the reader counts
/// as waiting behind the oldest key seen, which is safe and never happens).
const PAGES_MAX: usize = 64;

/// The key of `holder`'s read hold of `lock`: `<lock>/read/<holder>`.
/// (Holder ids, `<uuid>:<n>`, never start with `read/`.)
pub(super) fn read_node(lock: &str, holder: &str) -> String {
    format!("{lock}/read/{holder}")
}

/// The two ranges of the writers' (non-read) keys of `lock`, as (start,
/// end) pairs.
fn writer_ranges(lock: &str) -> [(String, String); 2] {
    [
        (format!("{lock}/"), format!("{lock}/read/")),
        (format!("{lock}/read0"), format!("{lock}0")),
    ]
}

/// Whether `key` (a key of `lock`'s directory) with `value` is a reader.
pub(super) fn is_reader(lock: &str, key: &[u8], value: &[u8]) -> bool {
    value == READER || key.starts_with(format!("{lock}/read/").as_bytes())
}

/// Reads of the first [`PAGE`] keys of each writer range, oldest first.
pub(super) fn first_writers(lock: &str) -> [TxnOp; 2] {
    writer_ranges(lock).map(|(start, end)| {
        let page = GetOptions::new()
            .with_range(end)
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(PAGE);
        TxnOp::get(start, Some(page))
    })
}

/// Reads of the last [`PAGE`] keys of each writer range created at or
/// before `upto`, newest first.
pub(super) fn last_writers(lock: &str, upto: i64) -> [TxnOp; 2] {
    writer_ranges(lock).map(|(start, end)| {
        let page = GetOptions::new()
            .with_range(end)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_max_create_revision(upto)
            .with_limit(PAGE);
        TxnOp::get(start, Some(page))
    })
}

/// The compares "no writer key exists" (a try-once read that finds none
/// puts its key at once).
pub(super) fn no_writers(lock: &str) -> [Compare; 2] {
    writer_ranges(lock)
        .map(|(start, end)| Compare::create_revision(start, CompareOp::Equal, 0).with_range(end))
}

/// The compares "no writer key was created after revision `read_at`" (so
/// that a read finding only readers at `read_at` still holds).
pub(super) fn no_writers_since(lock: &str, read_at: i64) -> [Compare; 2] {
    writer_ranges(lock).map(|(start, end)| {
        Compare::create_revision(start, CompareOp::Less, read_at.saturating_add(1)).with_range(end)
    })
}

/// From the [`first_writers`] pages: whether a writer created before
/// `mine` keeps a reader created at `mine` out; `None` when the pages
/// cannot tell (a page of older keys all `r`, with more beyond it).
pub(super) fn blocked(lock: &str, pages: &[GetResponse], mine: i64) -> Option<bool> {
    let mut known = true;
    for page in pages {
        let older: Vec<_> = page
            .kvs()
            .iter()
            .take_while(|kv| kv.create_revision() < mine)
            .collect();
        if older
            .iter()
            .any(|kv| !is_reader(lock, kv.key(), kv.value()))
        {
            return Some(true);
        }
        if older.len() == page.kvs().len() && page.more() {
            known = false;
        }
    }
    known.then_some(false)
}

/// What the [`last_writers`] pages show.
pub(super) enum Scan {
    /// This writer (key, create revision, mod revision) is the last one.
    Writer(Vec<u8>, i64, i64),
    /// No writer at all.
    None,
    /// Only readers in these pages; more keys created at or before this
    /// revision remain to be read.
    Below(i64),
}

/// The last writer in the [`last_writers`] pages.
pub(super) fn last_writer(lock: &str, pages: &[GetResponse]) -> Scan {
    let writer = pages
        .iter()
        .filter_map(|page| {
            page.kvs()
                .iter()
                .find(|kv| !is_reader(lock, kv.key(), kv.value()))
        })
        .max_by_key(|kv| kv.create_revision());
    if let Some(kv) = writer {
        return Scan::Writer(kv.key().to_vec(), kv.create_revision(), kv.mod_revision());
    }
    // Only readers: read on below the oldest key of a page that had more.
    pages
        .iter()
        .filter(|page| page.more())
        .filter_map(|page| page.kvs().last().map(|kv| kv.create_revision() - 1))
        .max()
        .map_or(Scan::None, Scan::Below)
}

/// The last writer of `lock` created at or before `upto`, reading page
/// after page back past readers: (key, create revision, mod revision).
pub(super) async fn last_writer_upto(
    inner: &Inner,
    lock: &str,
    mut upto: i64,
) -> Result<Option<(Vec<u8>, i64, i64)>, BackendError> {
    for _ in 0..PAGES_MAX {
        let txn = etcd_client::Txn::new().and_then(last_writers(lock, upto).to_vec());
        let answer = inner.txn(txn).await?;
        match last_writer(lock, &super::txn::gets(&answer)) {
            Scan::Writer(key, created, modded) => return Ok(Some((key, created, modded))),
            Scan::None => return Ok(None),
            Scan::Below(below) if below < upto => upto = below,
            Scan::Below(_) => break,
        }
    }
    Err(BackendError::msg(format!(
        "etcd: more than {} downgraded keys in {lock}",
        PAGE * i64::try_from(PAGES_MAX).unwrap_or(i64::MAX)
    )))
}

/// Whether a writer created before `mine` keeps a reader created at `mine`
/// out, from the [`first_writers`] pages, reading on if they cannot tell.
pub(super) async fn is_blocked(
    inner: &Inner,
    lock: &str,
    pages: &[GetResponse],
    mine: i64,
) -> Result<bool, BackendError> {
    match blocked(lock, pages, mine) {
        Some(known) => Ok(known),
        None => Ok(last_writer_upto(inner, lock, mine - 1).await?.is_some()),
    }
}

#[cfg(test)]
mod tests {
    use super::{is_reader, read_node, writer_ranges};

    /// The two writer ranges hold every key of the directory except the
    /// readers' (`read/`), and nothing outside the directory.
    #[test]
    fn the_writer_ranges_are_the_directory_without_read() {
        let lock = "lock:cfg";
        let inside = |key: &str| {
            writer_ranges(lock)
                .iter()
                .any(|(start, end)| key >= start.as_str() && key < end.as_str())
        };
        for writer in [
            "lock:cfg/0f3e2a1c-uuid:7",
            "lock:cfg/694d7b4a2c1e0f11",
            "lock:cfg/rea",
            "lock:cfg/read",
            "lock:cfg/reads/x",
            "lock:cfg/z",
        ] {
            assert!(inside(writer), "{writer} is not a writer");
        }
        for other in [
            read_node(lock, "0f3e2a1c-uuid:7").as_str(),
            "lock:cfg/read/",
            "lock:cfg",
            "lock:cfg0",
            "lock:cfg%gone/x",
            "lock:cfg%2Fb/x",
        ] {
            assert!(!inside(other), "{other} is read as a writer");
        }
    }

    #[test]
    fn a_reader_is_a_read_key_or_a_write_key_valued_r() {
        let lock = "l";
        assert!(is_reader(lock, read_node(lock, "h").as_bytes(), b""));
        assert!(is_reader(lock, b"l/h", b"r"));
        assert!(!is_reader(lock, b"l/h", b""));
        assert!(!is_reader(lock, b"l/694d7b4a2c1e0f11", b""));
    }
}
