//! Records of the transfer runs (S15), and what they show.
//!
//! Each transfer is recorded by the worker as the two accounts it moved 1
//! between (`from` → `to`) and three system-clock timestamps (µs: asked,
//! body started, body ended). All processes run on one machine, so the
//! bodies of every worker can be put in one order. From them:
//!
//! - **waits** = body start − request (for a multi-key or a nested call,
//!   the time to take both keys);
//! - **overlaps**: transfers whose body overlaps another body on one of
//!   its accounts, which exclusion must never let happen;
//! - **expected balances**: each account's starting balance, less one per
//!   transfer from it, plus one per transfer to it. A balance on the
//!   server that differs from it is a lost (or doubled) update; the sum of
//!   all balances is the check, the per-account one is stricter.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};

use crate::overlaps::{overlapping, Body};
use crate::stats::Samples;

/// One transfer, as a worker reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransferRecord {
    /// Worker (task) number, unique across processes.
    pub worker: u32,
    /// The account debited.
    pub from: u32,
    /// The account credited.
    pub to: u32,
    /// When it asked for the lock(s).
    pub requested: u64,
    /// When its body started.
    pub acquired: u64,
    /// When its body ended.
    pub released: u64,
}

impl TransferRecord {
    /// `tx <worker> <from> <to> <requested> <acquired> <released>`.
    pub fn to_line(&self) -> String {
        format!(
            "tx {} {} {} {} {} {}",
            self.worker, self.from, self.to, self.requested, self.acquired, self.released
        )
    }

    /// Parses [`to_line`](Self::to_line)'s format; `None` for other lines.
    pub fn parse(line: &str) -> Option<Result<TransferRecord>> {
        let rest = line.strip_prefix("tx ")?;
        let parse = || -> Result<TransferRecord> {
            let f: Vec<&str> = rest.split_whitespace().collect();
            let [worker, from, to, requested, acquired, released] = f[..] else {
                bail!("bad record {line:?}");
            };
            let number = |s: &str| s.parse::<u64>().with_context(|| format!("bad {line:?}"));
            let small = |s: &str| -> Result<u32> { Ok(u32::try_from(number(s)?)?) };
            Ok(TransferRecord {
                worker: small(worker)?,
                from: small(from)?,
                to: small(to)?,
                requested: number(requested)?,
                acquired: number(acquired)?,
                released: number(released)?,
            })
        };
        Some(parse())
    }
}

/// What the records of one transfer run show.
#[derive(Clone, Debug, Default)]
pub struct TransferAnalysis {
    /// Transfers recorded.
    pub total: usize,
    /// Transfers per second over the span of the run.
    pub per_second: f64,
    /// Waits to take the lock(s), µs.
    pub waits: Samples,
    /// Transfers whose body overlapped another body on one of its accounts.
    pub overlaps: usize,
    /// Each account's balance as the records say it must be, from
    /// `start` each (accounts no transfer touched are absent).
    pub expected: BTreeMap<u32, i64>,
}

impl TransferAnalysis {
    /// Analyses the records of all workers of one run, the accounts
    /// having started at `start` each.
    pub fn of(records: &[TransferRecord], start: i64) -> Self {
        let span_us = match (
            records.iter().map(|r| r.requested).min(),
            records.iter().map(|r| r.released).max(),
        ) {
            (Some(a), Some(b)) if b > a => (b - a) as f64,
            _ => f64::NAN,
        };
        let waits = records
            .iter()
            .map(|r| r.acquired.saturating_sub(r.requested) as f64)
            .collect();
        let mut expected = BTreeMap::new();
        for r in records {
            *expected.entry(r.from).or_insert(start) -= 1;
            *expected.entry(r.to).or_insert(start) += 1;
        }
        TransferAnalysis {
            total: records.len(),
            per_second: records.len() as f64 / (span_us / 1e6),
            waits: Samples::new(waits),
            overlaps: overlaps(records),
            expected,
        }
    }
}

/// Transfers whose body overlaps another body on one of its accounts,
/// each counted once.
fn overlaps(records: &[TransferRecord]) -> usize {
    let bodies = records.iter().enumerate().flat_map(|(i, r)| {
        [r.from, r.to].map(|on| Body {
            on,
            start: r.acquired,
            end: r.released,
            record: i,
        })
    });
    overlapping(records.len(), bodies)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn tx(from: u32, to: u32, acquired: u64, released: u64) -> TransferRecord {
        TransferRecord {
            worker: 1,
            from,
            to,
            requested: acquired.saturating_sub(5),
            acquired,
            released,
        }
    }

    #[test]
    fn lines_round_trip() {
        let r = tx(3, 7, 20, 30);
        assert_eq!(TransferRecord::parse(&r.to_line()).unwrap().unwrap(), r);
        assert!(TransferRecord::parse("done").is_none());
        assert!(TransferRecord::parse("tx 1 2 3").unwrap().is_err());
    }

    #[test]
    fn bodies_on_one_account_may_not_overlap_and_others_may() {
        // 1→2 and 3→4 at once: different accounts. 2→3 after both.
        let clean = [tx(1, 2, 10, 20), tx(3, 4, 12, 22), tx(2, 3, 22, 30)];
        let a = TransferAnalysis::of(&clean, 1000);
        assert_eq!((a.total, a.overlaps), (3, 0));
        assert_eq!(a.expected[&1], 999);
        assert_eq!(a.expected[&2], 1000);
        assert_eq!(a.expected[&4], 1001);
        assert_eq!(a.expected.values().sum::<i64>(), 4000);
        // 5→6 inside 6→1: both counted; 7→8 alone is not.
        let bad = [tx(6, 1, 0, 100), tx(5, 6, 40, 50), tx(7, 8, 40, 50)];
        assert_eq!(TransferAnalysis::of(&bad, 0).overlaps, 2);
    }
}
