//! Records of the flash-sale runs (S16), and what they show.
//!
//! The stock is split into segments, one per permit. Every body a worker
//! runs is recorded as the segment it looked at, the count it read there,
//! whether it saw the sale over, and three system-clock timestamps (µs:
//! asked, body started, body ended). A body that read a count above 0 sold
//! one unit (it wrote the count less one); a body that read 0 is a *miss*
//! (its segment was empty), or the worker's last body, which found every
//! segment empty and stopped it. From them:
//!
//! - **sold**: the sales, to be exactly the units put on sale;
//! - **waits** = body start − request (the time to take a permit);
//! - **overlaps**: bodies on one segment at once, which the permits must
//!   never let happen (a permit's holder is the only one on its segment);
//! - **out of sequence**: on each segment, in the order the bodies ran,
//!   every body must read what the bodies before it left (the segment's
//!   share, then one less per sale, then 0). A body that reads anything
//!   else saw a lost update, or a count the holder before it had not
//!   written yet;
//! - **negative**: bodies that read a count below 0.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{bail, Context, Result};

use crate::overlaps::{overlapping, Body};
use crate::stats::Samples;

/// The count of each of `segments` segments when `units` are split over
/// them: the same for all, the first ones one more when it does not divide.
pub fn shares(units: u32, segments: u32) -> Vec<i64> {
    let segments = segments.max(1);
    (0..segments)
        .map(|s| i64::from(units / segments + u32::from(s < units % segments)))
        .collect()
}

/// One body, as a worker reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SaleRecord {
    /// Worker (task) number, unique across processes.
    pub worker: u32,
    /// The segment it looked at (its permit).
    pub segment: u32,
    /// The count it read there: above 0, it sold one unit.
    pub count: i64,
    /// Whether it found every segment empty (the worker's last body).
    pub sold_out: bool,
    /// When it asked for a permit.
    pub requested: u64,
    /// When its body started.
    pub acquired: u64,
    /// When its body ended.
    pub released: u64,
}

impl SaleRecord {
    /// Whether this body sold a unit.
    pub fn sold(&self) -> bool {
        self.count > 0
    }

    /// `sale <worker> <segment> <count> <sold-out 0|1> <requested> <acquired> <released>`.
    pub fn to_line(&self) -> String {
        format!(
            "sale {} {} {} {} {} {} {}",
            self.worker,
            self.segment,
            self.count,
            u8::from(self.sold_out),
            self.requested,
            self.acquired,
            self.released
        )
    }

    /// Parses [`to_line`](Self::to_line)'s format; `None` for other lines.
    pub fn parse(line: &str) -> Option<Result<SaleRecord>> {
        let fields = numbers(line, "sale")?;
        Some(
            fields.and_then(|[worker, segment, count, over, asked, start, end]| {
                Ok(SaleRecord {
                    worker: u32::try_from(worker)?,
                    segment: u32::try_from(segment)?,
                    count,
                    sold_out: over == 1,
                    requested: u64::try_from(asked)?,
                    acquired: u64::try_from(start)?,
                    released: u64::try_from(end)?,
                })
            }),
        )
    }
}

/// The `N` numbers of `line` if it is a record tagged `tag` (`None` for a
/// line of another kind); an error names the line when it has another
/// count of fields or one is not a whole number.
fn numbers<const N: usize>(line: &str, tag: &str) -> Option<Result<[i64; N]>> {
    let rest = line.strip_prefix(tag)?.strip_prefix(' ')?;
    let read = || -> Result<[i64; N]> {
        let fields: Vec<i64> = rest
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .with_context(|| format!("bad record {line:?}"))?;
        match <[i64; N]>::try_from(fields) {
            Ok(fields) => Ok(fields),
            Err(_) => bail!("bad record {line:?}: {N} fields expected"),
        }
    };
    Some(read())
}

/// What the records of one flash-sale run show.
#[derive(Clone, Debug, Default)]
pub struct SaleAnalysis {
    /// Bodies recorded.
    pub bodies: usize,
    /// Units sold (bodies that read a count above 0).
    pub sold: usize,
    /// Sales of a segment's last unit (each also marks it empty).
    pub last_units: usize,
    /// Units sold per second over the span of the run.
    pub per_second: f64,
    /// Waits to take a permit, µs.
    pub waits: Samples,
    /// Bodies that found their segment empty while the sale went on.
    pub misses: usize,
    /// Bodies that found every segment empty (one per worker that finished).
    pub closing: usize,
    /// Workers that saw the sale over.
    pub finished_workers: usize,
    /// Bodies that read a count below 0.
    pub negative: usize,
    /// Bodies that read another count than the bodies before them on their
    /// segment left (see the module docs).
    pub out_of_sequence: usize,
    /// Bodies that ran at the same time as another on their segment.
    pub overlaps: usize,
    /// The share of the time from the first request to the last sale that
    /// the segments spent in a body, over all segments: 1 when every
    /// segment always had a body on it (the rest is handoffs and idle
    /// permits).
    pub occupancy: f64,
    /// When the first segment sold its last unit, as a share of the time
    /// from the first request to the last sale (misses start then).
    pub first_empty: f64,
}

impl SaleAnalysis {
    /// Analyses the records of all workers of one run, the segments having
    /// started at `shares`.
    pub fn of(records: &[SaleRecord], shares: &[i64]) -> Self {
        let span_us = match (
            records.iter().map(|r| r.requested).min(),
            records.iter().map(|r| r.released).max(),
        ) {
            (Some(a), Some(b)) if b > a => (b - a) as f64,
            _ => f64::NAN,
        };
        let sold = records.iter().filter(|r| r.sold()).count();
        let waits = records
            .iter()
            .map(|r| r.acquired.saturating_sub(r.requested) as f64)
            .collect();
        let closing: Vec<&SaleRecord> = records.iter().filter(|r| r.sold_out).collect();
        let finished: BTreeSet<u32> = closing.iter().map(|r| r.worker).collect();
        let bodies = records.iter().enumerate().map(|(i, r)| Body {
            on: r.segment,
            start: r.acquired,
            end: r.released,
            record: i,
        });
        SaleAnalysis {
            bodies: records.len(),
            sold,
            last_units: records.iter().filter(|r| r.count == 1).count(),
            per_second: sold as f64 / (span_us / 1e6),
            waits: Samples::new(waits),
            misses: records.iter().filter(|r| !r.sold() && !r.sold_out).count(),
            closing: closing.len(),
            finished_workers: finished.len(),
            negative: records.iter().filter(|r| r.count < 0).count(),
            out_of_sequence: out_of_sequence(records, shares),
            overlaps: overlapping(records.len(), bodies),
            occupancy: occupancy(records, shares.len()),
            first_empty: first_empty(records),
        }
    }
}

/// The first request, and the end of the last sale (`None` without sales).
fn selling_time(records: &[SaleRecord]) -> Option<(u64, u64)> {
    let start = records.iter().map(|r| r.requested).min()?;
    let end = records
        .iter()
        .filter(|r| r.sold())
        .map(|r| r.released)
        .max()?;
    Some((start, end)).filter(|(a, b)| b > a)
}

/// The time `segments` segments spent in the bodies that ran before the
/// last sale ended, over `segments` times the selling time.
fn occupancy(records: &[SaleRecord], segments: usize) -> f64 {
    let Some((start, end)) = selling_time(records) else {
        return f64::NAN;
    };
    let in_bodies: u64 = records
        .iter()
        .filter(|r| r.released <= end)
        .map(|r| r.released.saturating_sub(r.acquired))
        .sum();
    in_bodies as f64 / ((end - start) as f64 * segments.max(1) as f64)
}

/// When the first segment sold its last unit, as a share of the selling
/// time.
fn first_empty(records: &[SaleRecord]) -> f64 {
    let Some((start, end)) = selling_time(records) else {
        return f64::NAN;
    };
    let last_units = records.iter().filter(|r| r.count == 1);
    match last_units.map(|r| r.released).min() {
        Some(first) => first.saturating_sub(start) as f64 / (end - start) as f64,
        None => f64::NAN,
    }
}

/// Bodies that read another count than the bodies before them on their
/// segment left: per segment, in order of start, the first must read the
/// segment's share and each later one what the one before wrote (its count
/// less one after a sale, unchanged after a miss). Each wrong read is
/// counted once, and the next body is judged against what it read, so
/// one lost update counts once, not once per later body.
fn out_of_sequence(records: &[SaleRecord], shares: &[i64]) -> usize {
    let mut by_segment: BTreeMap<u32, Vec<(u64, i64)>> = BTreeMap::new();
    for r in records {
        let bodies = by_segment.entry(r.segment).or_default();
        bodies.push((r.acquired, r.count));
    }
    let mut wrong = 0;
    for (segment, bodies) in &mut by_segment {
        bodies.sort_unstable();
        let mut left = shares.get(*segment as usize).copied().unwrap_or(0);
        for &(_, count) in bodies.iter() {
            if count != left {
                wrong += 1;
            }
            left = if count > 0 { count - 1 } else { count };
        }
    }
    wrong
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn body(worker: u32, segment: u32, count: i64, acquired: u64) -> SaleRecord {
        SaleRecord {
            worker,
            segment,
            count,
            sold_out: false,
            requested: acquired.saturating_sub(5),
            acquired,
            released: acquired + 10,
        }
    }

    #[test]
    fn a_record_of_its_tag_is_read_and_other_lines_are_left() -> Result<()> {
        assert_eq!(
            numbers::<3>("tx 1 -2 3", "tx").transpose()?,
            Some([1, -2, 3])
        );
        assert!(numbers::<3>("txn 1 2 3", "tx").is_none());
        assert!(numbers::<3>("done", "tx").is_none());
        assert!(numbers::<3>("tx 1 2", "tx").is_some_and(|r| r.is_err()));
        assert!(numbers::<2>("tx 1 x", "tx").is_some_and(|r| r.is_err()));
        Ok(())
    }

    #[test]
    fn shares_split_the_units_and_sum_to_them() {
        assert_eq!(shares(20_000, 8), [2500; 8]);
        assert_eq!(shares(10, 4), [3, 3, 2, 2]);
        assert_eq!(shares(2, 4), [1, 1, 0, 0]);
        assert_eq!(shares(7, 1), [7]);
    }

    #[test]
    fn lines_round_trip() {
        let mut r = body(4, 2, 17, 100);
        r.sold_out = true;
        assert_eq!(SaleRecord::parse(&r.to_line()).unwrap().unwrap(), r);
        assert!(SaleRecord::parse("done").is_none());
        assert!(SaleRecord::parse("sale 1 2 3").unwrap().is_err());
    }

    #[test]
    fn a_clean_sale_reads_each_count_once_down_to_zero() {
        // Segment 0: 2 units, a miss, then the worker's closing body;
        // segment 1: 1 unit.
        let mut closing = body(2, 0, 0, 100);
        closing.sold_out = true;
        let records = [
            body(1, 0, 2, 0),
            body(2, 1, 1, 5),
            body(2, 0, 1, 20),
            body(1, 0, 0, 40),
            closing,
        ];
        let a = SaleAnalysis::of(&records, &[2, 1]);
        assert_eq!((a.sold, a.last_units, a.misses, a.closing), (3, 2, 1, 1));
        assert_eq!((a.out_of_sequence, a.overlaps, a.negative), (0, 0, 0));
        assert_eq!((a.bodies, a.finished_workers), (5, 1));
        // Selling from 0 - 5 = 0 (saturating) to 30 (the last sale's end):
        // three sales of 10 us on two segments; segment 1 empty at 15.
        assert_eq!(a.occupancy, 30.0 / (30.0 * 2.0));
        assert_eq!(a.first_empty, 15.0 / 30.0);
    }

    #[test]
    fn a_lost_update_shows_as_a_read_out_of_sequence_and_an_overlap() {
        // Two bodies read 3 at once and both write 2: the next reads 2
        // where 1 was due, then the sequence goes on from what it read.
        let records = [
            body(1, 0, 3, 0),
            body(2, 0, 3, 3),
            body(1, 0, 2, 20),
            body(2, 0, 1, 40),
            body(1, 0, -1, 60),
        ];
        let a = SaleAnalysis::of(&records, &[3]);
        assert_eq!(a.out_of_sequence, 2, "the second 3, and the -1");
        assert_eq!((a.overlaps, a.negative, a.sold), (2, 1, 4));
    }
}
