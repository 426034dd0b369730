//! Bodies that ran at the same time on one thing that exclusion must keep
//! to one body at a time: an account (S15), a stock segment (S16).
//!
//! The workers' records carry system-clock timestamps (µs) taken in
//! processes of one machine, so the bodies of every worker can be put in
//! one order. A record may touch several things (a transfer touches two
//! accounts); the caller lists one [`Body`] per thing touched, and a
//! record counts once however many of its things overlap.

use std::collections::BTreeMap;

/// One record's body on one thing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Body {
    /// The thing touched (an account, a segment).
    pub on: u32,
    /// When the body started, µs.
    pub start: u64,
    /// When it ended, µs.
    pub end: u64,
    /// The record it belongs to: an index below the record count.
    pub record: usize,
}

/// Records (of `records` in all) whose body overlaps another body on one of
/// the things it touched, each counted once. Per thing, the bodies are put
/// in order of start; a body overlaps when it starts before the latest end
/// among the bodies before it (and that one overlaps it too).
pub fn overlapping(records: usize, bodies: impl IntoIterator<Item = Body>) -> usize {
    let mut by_thing: BTreeMap<u32, Vec<(u64, u64, usize)>> = BTreeMap::new();
    for b in bodies {
        by_thing
            .entry(b.on)
            .or_default()
            .push((b.start, b.end, b.record));
    }
    let mut bad = vec![false; records];
    for bodies in by_thing.values_mut() {
        bodies.sort_unstable();
        let mut latest: Option<(u64, usize)> = None;
        for &(start, end, i) in bodies.iter() {
            if let Some((latest_end, j)) = latest {
                if latest_end > start {
                    mark(&mut bad, i);
                    mark(&mut bad, j);
                }
            }
            if latest.is_none_or(|(e, _)| end > e) {
                latest = Some((end, i));
            }
        }
    }
    bad.iter().filter(|&&b| b).count()
}

/// Marks record `i` as overlapping (an index out of range is ignored: the
/// caller's count bounds the answer).
fn mark(bad: &mut [bool], i: usize) {
    if let Some(slot) = bad.get_mut(i) {
        *slot = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(on: u32, start: u64, end: u64, record: usize) -> Body {
        Body {
            on,
            start,
            end,
            record,
        }
    }

    #[test]
    fn bodies_overlap_only_on_the_same_thing_and_count_once_per_record() {
        // Records 0 and 1 meet on thing 7; record 2 runs beside them on 8.
        let bodies = [body(7, 0, 10, 0), body(7, 5, 15, 1), body(8, 0, 20, 2)];
        assert_eq!(overlapping(3, bodies), 2);
        // One after the other on one thing (an end equal to the next start).
        let apart = [body(7, 0, 10, 0), body(7, 10, 20, 1)];
        assert_eq!(overlapping(2, apart), 0);
        // A record overlapping on two things still counts once; a short body
        // inside a long one is caught even after a later, shorter one.
        let twice = [
            body(1, 0, 100, 0),
            body(2, 0, 100, 0),
            body(1, 10, 20, 1),
            body(2, 30, 40, 1),
            body(1, 50, 60, 2),
        ];
        assert_eq!(overlapping(3, twice), 3);
    }
}
