//! Acquisition records of the contention scenario, and what they show.
//!
//! Each acquisition is recorded by the worker as its key's number and three
//! system-clock timestamps (µs): when it asked, when its body started (lock
//! acquired), when its body ended (release about to be sent). All processes
//! run on one machine, so the timestamps share a clock and the holds of all
//! workers on one key can be put in one order. From each key's order:
//!
//! - **handoff** = next body start − previous body end, counted only when the
//!   next holder was already waiting at that moment (otherwise the lock was
//!   simply idle). It covers the release reaching Redis, the wake-up reaching
//!   the waiter and the waiter's acquire: about 2 round trips at the limit.
//! - **wait** = body start − request, for every acquisition.
//! - **overlaps** = next body start < previous body end: two holders at once,
//!   which must never happen.
//! - **barged** = the next holder asked only after the release although
//!   another worker was already waiting then: the lock went to a newcomer
//!   (typically the releaser re-grabbing it) instead of a waiter.

use std::collections::BTreeMap;

use anyhow::{Context, Result};

use crate::stats::Samples;

/// One acquisition, as a worker reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// Worker (task) number, unique across processes.
    pub worker: u32,
    /// The key's number (0 when there is one key).
    pub key: u32,
    /// When it asked for the lock.
    pub requested: u64,
    /// When its body started.
    pub acquired: u64,
    /// When its body ended.
    pub released: u64,
}

impl Record {
    /// `rec <worker> <key> <requested> <acquired> <released>`.
    pub fn to_line(&self) -> String {
        format!(
            "rec {} {} {} {} {}",
            self.worker, self.key, self.requested, self.acquired, self.released
        )
    }

    /// Parses [`to_line`](Self::to_line)'s format; `None` for other lines.
    pub fn parse(line: &str) -> Option<Result<Record>> {
        let rest = line.strip_prefix("rec ")?;
        let parse = || -> Result<Record> {
            let f: Vec<u64> = rest
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .with_context(|| format!("bad record {line:?}"))?;
            let [worker, key, requested, acquired, released] = f[..] else {
                anyhow::bail!("bad record {line:?}");
            };
            Ok(Record {
                worker: u32::try_from(worker)?,
                key: u32::try_from(key)?,
                requested,
                acquired,
                released,
            })
        };
        Some(parse())
    }
}

/// What the records of one contention run show.
#[derive(Clone, Debug, Default)]
pub struct Analysis {
    /// Acquisitions.
    pub total: usize,
    /// Handoff latencies, µs.
    pub handoffs: Samples,
    /// Waits to acquire, µs.
    pub waits: Samples,
    /// Acquisitions per worker.
    pub per_worker: BTreeMap<u32, usize>,
    /// Acquisitions per key number.
    pub per_key: BTreeMap<u32, usize>,
    /// Holds that overlapped the previous one of their key.
    pub overlaps: usize,
    /// Holds taken past a worker that was already waiting for their key.
    pub barged: usize,
    /// Acquisitions per second over the span of the run.
    pub per_second: f64,
}

impl Analysis {
    /// Analyses the records of all workers of one run; `workers` lists every
    /// worker that took part (one with no acquisition has a share of 0).
    pub fn of(records: Vec<Record>, workers: impl IntoIterator<Item = u32>) -> Self {
        let mut per_worker: BTreeMap<u32, usize> = workers.into_iter().map(|w| (w, 0)).collect();
        for r in &records {
            *per_worker.entry(r.worker).or_default() += 1;
        }
        let waits = records
            .iter()
            .map(|r| r.acquired.saturating_sub(r.requested) as f64)
            .collect();
        let span_us = match (
            records.iter().map(|r| r.requested).min(),
            records.iter().map(|r| r.released).max(),
        ) {
            (Some(a), Some(b)) if b > a => (b - a) as f64,
            _ => f64::NAN,
        };
        let total = records.len();
        let mut by_key: BTreeMap<u32, Vec<Record>> = BTreeMap::new();
        for r in records {
            by_key.entry(r.key).or_default().push(r);
        }
        let (mut handoffs, mut overlaps, mut barged) = (Vec::new(), 0, 0);
        let mut per_key = BTreeMap::new();
        for (key, mut holds) in by_key {
            holds.sort_by_key(|r| (r.acquired, r.released));
            per_key.insert(key, holds.len());
            for pair in holds.windows(2) {
                let (prev, next) = (pair[0], pair[1]);
                if next.acquired < prev.released {
                    overlaps += 1;
                } else if next.requested <= prev.released {
                    handoffs.push((next.acquired - prev.released) as f64);
                }
            }
            barged += count_barged(&holds);
        }
        Analysis {
            total,
            handoffs: Samples::new(handoffs),
            waits: Samples::new(waits),
            per_worker,
            per_key,
            overlaps,
            barged,
            per_second: total as f64 / (span_us / 1e6),
        }
    }

    /// The analyses of runs made one after the other, as one: counts and
    /// samples together, acquisitions/s over the sum of their spans (the
    /// time between them left out).
    pub fn pool(parts: &[Analysis]) -> Analysis {
        let mut pooled = Analysis::default();
        let (mut handoffs, mut waits, mut seconds) = (Vec::new(), Vec::new(), 0.0);
        for a in parts {
            pooled.total += a.total;
            handoffs.extend_from_slice(a.handoffs.sorted());
            waits.extend_from_slice(a.waits.sorted());
            for (w, n) in &a.per_worker {
                *pooled.per_worker.entry(*w).or_default() += n;
            }
            for (k, n) in &a.per_key {
                *pooled.per_key.entry(*k).or_default() += n;
            }
            pooled.overlaps += a.overlaps;
            pooled.barged += a.barged;
            seconds += a.total as f64 / a.per_second;
        }
        pooled.handoffs = Samples::new(handoffs);
        pooled.waits = Samples::new(waits);
        pooled.per_second = pooled.total as f64 / seconds;
        pooled
    }

    /// Share of acquisitions that were handoffs to a waiting worker (the
    /// first hold of each key follows nobody).
    pub fn handoff_share(&self) -> f64 {
        let followers = self.total.saturating_sub(self.per_key.len()).max(1);
        self.handoffs.len() as f64 / followers as f64
    }

    /// Largest share over smallest share (infinite when a worker got none).
    pub fn share_spread(&self) -> f64 {
        let max = self.per_worker.values().copied().max().unwrap_or(0);
        let min = self.per_worker.values().copied().min().unwrap_or(0);
        if min == 0 {
            f64::INFINITY
        } else {
            max as f64 / min as f64
        }
    }

    /// Each process's share of the acquisitions, %, in process order, when
    /// workers are numbered `process * tasks + task`.
    pub fn process_shares(&self, tasks: u32) -> Vec<f64> {
        let mut per_process: BTreeMap<u32, usize> = BTreeMap::new();
        for (worker, n) in &self.per_worker {
            *per_process.entry(worker / tasks.max(1)).or_default() += n;
        }
        let total = self.total.max(1) as f64;
        per_process
            .values()
            .map(|&n| n as f64 * 100.0 / total)
            .collect()
    }
}

/// Consecutive holds of one key (sorted by start) where the next holder
/// asked after the release while some other worker was waiting at that
/// moment.
fn count_barged(records: &[Record]) -> usize {
    // Waiting intervals [requested, acquired), swept against the release
    // times, which ascend because holds do not overlap.
    let mut events: Vec<(u64, i64)> = records
        .iter()
        .flat_map(|r| [(r.requested, 1), (r.acquired, -1)])
        .collect();
    events.sort_unstable();
    let (mut next_event, mut waiting, mut barged) = (0, 0i64, 0);
    for pair in records.windows(2) {
        let (prev, next) = (pair[0], pair[1]);
        let t = prev.released;
        while next_event < events.len() && events[next_event].0 <= t {
            waiting += events[next_event].1;
            next_event += 1;
        }
        if next.requested > t && waiting > 0 {
            barged += 1;
        }
    }
    barged
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn rec(worker: u32, requested: u64, acquired: u64, released: u64) -> Record {
        on(0, worker, requested, acquired, released)
    }

    fn on(key: u32, worker: u32, requested: u64, acquired: u64, released: u64) -> Record {
        Record {
            worker,
            key,
            requested,
            acquired,
            released,
        }
    }

    #[test]
    fn lines_round_trip() {
        let r = rec(3, 10, 20, 30);
        assert_eq!(Record::parse(&r.to_line()).unwrap().unwrap(), r);
        assert!(Record::parse("done").is_none());
        assert!(Record::parse("rec 1 2").unwrap().is_err());
        assert_eq!(
            Record::parse(&on(4, 1, 2, 3, 5).to_line())
                .unwrap()
                .unwrap()
                .key,
            4
        );
    }

    #[test]
    fn handoffs_waits_and_overlaps() {
        let a = Analysis::of(
            vec![
                rec(1, 0, 10, 20),
                rec(2, 5, 25, 40),     // waited since 5: handoff 5
                rec(1, 100, 100, 110), // lock idle before: no handoff
                rec(2, 105, 108, 120), // overlaps the previous hold
            ],
            [1, 2, 3],
        );
        assert_eq!(a.total, 4);
        assert_eq!(a.handoffs.sorted(), [5.0]);
        assert_eq!(a.overlaps, 1);
        assert_eq!(a.waits.max(), 20.0);
        assert!(a.share_spread().is_infinite()); // worker 3 got none
        assert_eq!(a.barged, 0);
    }

    #[test]
    fn pooled_runs_leave_the_time_between_them_out() {
        // 2 acquisitions in 20 µs, then (long after) 2 in 20 µs.
        let a = Analysis::of(vec![rec(0, 0, 0, 10), rec(1, 0, 10, 20)], 0..2);
        let b = Analysis::of(
            vec![rec(0, 1000, 1000, 1010), rec(1, 1000, 1010, 1020)],
            0..2,
        );
        let pooled = Analysis::pool(&[a, b]);
        assert_eq!(pooled.total, 4);
        assert_eq!(pooled.per_second, 4.0 / 40e-6);
        assert_eq!(
            pooled.per_worker.values().copied().collect::<Vec<_>>(),
            [2, 2]
        );
        assert_eq!(pooled.waits.len(), 4);
    }

    #[test]
    fn barging_is_counted() {
        let a = Analysis::of(
            vec![
                rec(1, 0, 0, 10),
                rec(2, 5, 30, 40),  // waited from 5 ...
                rec(1, 12, 12, 20), // ... but 1 re-grabbed at 12
            ],
            [1, 2],
        );
        assert_eq!(a.barged, 1);
        assert_eq!(a.handoffs.len(), 1); // 20 -> 30
    }

    #[test]
    fn keys_are_ordered_apart_and_processes_summed() {
        let a = Analysis::of(
            vec![
                on(0, 0, 0, 0, 10),
                on(1, 1, 0, 5, 15),  // another key: no overlap
                on(0, 2, 3, 12, 20), // waited for key 0: handoff 2
                on(1, 3, 20, 20, 30),
            ],
            0..4,
        );
        assert_eq!(a.overlaps, 0);
        assert_eq!(a.handoffs.sorted(), [2.0]);
        assert_eq!(a.per_key.values().copied().collect::<Vec<_>>(), [2, 2]);
        assert_eq!(a.handoff_share(), 0.5);
        assert_eq!(a.process_shares(2), [50.0, 50.0]);
        assert_eq!(a.process_shares(1), [25.0; 4]);
    }
}
