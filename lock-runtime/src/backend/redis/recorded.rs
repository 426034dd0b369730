//! What `inspect.lua` found of a lock, read into a [`Recorded`].
//!
//! The script returns the hash as it stands, and the server's clock: a
//! reader whose lease end has passed is gone, though the scripts drop its
//! fields only at their next call on the key, so it is left out here, and
//! each reader's remaining lease is its end less that clock (one clock, the
//! server's, for every lease end it compares).

use std::collections::HashMap;
use std::time::Duration;

use crate::backend::{Recorded, RecordedReader};
use crate::mode::LockMode;

/// The lock recorded by the hash `fields` (names and values, flat), its
/// `pttl`, the fair `queue`, at the server time `now` (ms); `None` when no
/// hold is left.
///
/// A write hold is its holder field (with its hold count) and `fence`. A
/// read hold (`mode` = `r`) lists its live readers (holder field, `x:`
/// lease end, `f:` token, see `read.lua`) and is described by the one whose
/// lease ends last, the one a writer waits for (as the embedded store
/// describes it).
pub(super) fn decode(
    fields: &[String],
    pttl: i64,
    queue: Vec<String>,
    now: i64,
) -> Option<Recorded> {
    let hash: HashMap<&str, &str> = fields
        .chunks_exact(2)
        .map(|pair| (pair[0].as_str(), pair[1].as_str()))
        .collect();
    if hash.get("mode") != Some(&"r") {
        return write_hold(&hash, pttl, queue);
    }
    let number = |name: &str| hash.get(name).and_then(|v| v.parse::<u64>().ok());
    // (lease end, holds, reader) of every reader whose lease is ahead.
    let mut live: Vec<(i64, u64, RecordedReader)> = hash
        .iter()
        .filter_map(|(name, value)| {
            let holder = name.strip_prefix("x:")?;
            let ends = value.parse::<i64>().ok().filter(|&ends| ends > now)?;
            let reader = RecordedReader {
                holder: holder.to_owned(),
                remaining: Some(Duration::from_millis(u64::try_from(ends - now).ok()?)),
                fence: number(&format!("f:{holder}")),
            };
            Some((ends, number(holder)?, reader))
        })
        .collect();
    // In a stable order (the hash's is not), the latest lease end first.
    live.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.2.holder.cmp(&b.2.holder)));
    let (_, holds, last) = live.first()?.clone();
    Some(Recorded {
        holder: last.holder,
        holds,
        remaining: last.remaining,
        fence: last.fence,
        queue,
        mode: LockMode::Read,
        readers: live.into_iter().map(|(.., reader)| reader).collect(),
    })
}

/// A write (or exclusive) hold: its one holder field and `fence`.
fn write_hold(hash: &HashMap<&str, &str>, pttl: i64, queue: Vec<String>) -> Option<Recorded> {
    let (holder, holds) = hash.iter().find(|(name, _)| **name != "fence")?;
    Some(Recorded {
        holder: (*holder).to_owned(),
        holds: holds.parse().unwrap_or(0),
        remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
        fence: hash.get("fence").and_then(|v| v.parse().ok()),
        queue,
        mode: LockMode::Write,
        readers: Vec::new(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, &str)]) -> Vec<String> {
        pairs
            .iter()
            .flat_map(|(n, v)| [(*n).to_owned(), (*v).to_owned()])
            .collect()
    }

    #[test]
    fn a_write_hold_is_its_holder_and_token() {
        let hash = fields(&[("p:1", "2"), ("fence", "17")]);
        let recorded = decode(&hash, 900, vec!["q:1".to_owned()], 5).unwrap();
        assert_eq!(recorded.holder, "p:1");
        assert_eq!(recorded.holds, 2);
        assert_eq!(recorded.fence, Some(17));
        assert_eq!(recorded.remaining, Some(Duration::from_millis(900)));
        assert_eq!(recorded.mode, LockMode::Write);
        assert!(recorded.readers.is_empty());
        assert_eq!(recorded.queue, ["q:1"]);
        assert_eq!(decode(&[], -2, Vec::new(), 5), None);
    }

    #[test]
    fn a_read_hold_lists_its_live_readers_and_is_described_by_the_last_to_end() {
        let hash = fields(&[
            ("mode", "r"),
            ("a:1", "1"),
            ("x:a:1", "1500"),
            ("f:a:1", "10"),
            ("b:1", "3"),
            ("x:b:1", "4000"),
            ("f:b:1", "11"),
            // Its lease end has passed: gone, though its fields are left.
            ("c:1", "1"),
            ("x:c:1", "1000"),
            ("f:c:1", "12"),
        ]);
        let recorded = decode(&hash, 3000, Vec::new(), 1000).unwrap();
        assert_eq!(recorded.mode, LockMode::Read);
        assert_eq!((recorded.holder.as_str(), recorded.holds), ("b:1", 3));
        assert_eq!(recorded.fence, Some(11));
        assert_eq!(recorded.remaining, Some(Duration::from_millis(3000)));
        let readers: Vec<(&str, Option<Duration>, Option<u64>)> = recorded
            .readers
            .iter()
            .map(|r| (r.holder.as_str(), r.remaining, r.fence))
            .collect();
        assert_eq!(
            readers,
            [
                ("b:1", Some(Duration::from_millis(3000)), Some(11)),
                ("a:1", Some(Duration::from_millis(500)), Some(10)),
            ]
        );
    }

    #[test]
    fn a_read_hold_whose_readers_all_ended_is_free() {
        let hash = fields(&[
            ("mode", "r"),
            ("a:1", "1"),
            ("x:a:1", "999"),
            ("f:a:1", "1"),
        ]);
        assert_eq!(decode(&hash, 1, Vec::new(), 1000), None);
        assert_eq!(decode(&fields(&[("mode", "r")]), 1, Vec::new(), 1000), None);
    }
}
