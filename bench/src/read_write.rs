//! Records of the read-write runs (S14), and what they show.
//!
//! Each call is recorded by the worker as its kind (read or write), three
//! system-clock timestamps (µs: asked, body started, body ended) and, for
//! a read, whether its two GETs of the counter disagreed (a torn read). All
//! processes run on one machine, so the holds of every worker can be put
//! in one order. From it:
//!
//! - **waits** = body start − request, apart for writers and readers;
//! - **writer overlaps** = writes whose body overlaps another body, a
//!   read's or a write's: a writer let in beside someone, which a
//!   read-write lock must never do (readers overlapping each other are the
//!   point);
//! - **readers at once**: the most read bodies running at one moment, and
//!   the read bodies' summed time over the time when at least one ran (1.0
//!   when reads never share, up to the number of workers).

use anyhow::{bail, Context, Result};

use crate::stats::Samples;

/// A call's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// GET, yield, GET: shares the key with other readers.
    Read,
    /// GET and SET: excludes everyone.
    Write,
}

/// One call, as a worker reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RwRecord {
    /// Worker (task) number, unique across processes.
    pub worker: u32,
    /// Read or write.
    pub kind: Kind,
    /// When it asked for the lock.
    pub requested: u64,
    /// When its body started.
    pub acquired: u64,
    /// When its body ended.
    pub released: u64,
    /// A read whose two GETs saw different values.
    pub torn: bool,
}

impl RwRecord {
    /// `rw <worker> <r|w> <requested> <acquired> <released> <0|1>`.
    pub fn to_line(&self) -> String {
        let kind = match self.kind {
            Kind::Read => "r",
            Kind::Write => "w",
        };
        format!(
            "rw {} {kind} {} {} {} {}",
            self.worker,
            self.requested,
            self.acquired,
            self.released,
            u8::from(self.torn)
        )
    }

    /// Parses [`to_line`](Self::to_line)'s format; `None` for other lines.
    pub fn parse(line: &str) -> Option<Result<RwRecord>> {
        let rest = line.strip_prefix("rw ")?;
        let parse = || -> Result<RwRecord> {
            let f: Vec<&str> = rest.split_whitespace().collect();
            let [worker, kind, requested, acquired, released, torn] = f[..] else {
                bail!("bad record {line:?}");
            };
            let number = |s: &str| s.parse::<u64>().with_context(|| format!("bad {line:?}"));
            Ok(RwRecord {
                worker: u32::try_from(number(worker)?)?,
                kind: match kind {
                    "r" => Kind::Read,
                    "w" => Kind::Write,
                    _ => bail!("bad kind in {line:?}"),
                },
                requested: number(requested)?,
                acquired: number(acquired)?,
                released: number(released)?,
                torn: number(torn)? != 0,
            })
        };
        Some(parse())
    }
}

/// What the records of one read-write run show.
#[derive(Clone, Debug, Default)]
pub struct RwAnalysis {
    /// Calls (reads and writes).
    pub total: usize,
    /// Writes among them.
    pub writes: usize,
    /// Calls per second over the span of the run.
    pub per_second: f64,
    /// Writers' waits to acquire, µs.
    pub writer_waits: Samples,
    /// Readers' waits to acquire, µs.
    pub reader_waits: Samples,
    /// Reads whose two GETs disagreed.
    pub torn_reads: usize,
    /// Writes whose body overlapped another body.
    pub writer_overlaps: usize,
    /// The most read bodies running at one moment.
    pub peak_readers: usize,
    /// Read bodies' summed time over the time when at least one ran.
    pub mean_readers: f64,
}

impl RwAnalysis {
    /// Analyses the records of all workers of one run.
    pub fn of(mut records: Vec<RwRecord>) -> Self {
        let span_us = match (
            records.iter().map(|r| r.requested).min(),
            records.iter().map(|r| r.released).max(),
        ) {
            (Some(a), Some(b)) if b > a => (b - a) as f64,
            _ => f64::NAN,
        };
        let wait = |r: &RwRecord| r.acquired.saturating_sub(r.requested) as f64;
        let of_kind = |kind| records.iter().filter(move |r: &&RwRecord| r.kind == kind);
        let writer_waits = Samples::new(of_kind(Kind::Write).map(wait).collect());
        let reader_waits = Samples::new(of_kind(Kind::Read).map(wait).collect());
        let writes = of_kind(Kind::Write).count();
        let torn_reads = records.iter().filter(|r| r.torn).count();
        records.sort_by_key(|r| (r.acquired, r.released));
        let (peak_readers, mean_readers) = readers_at_once(&records);
        RwAnalysis {
            total: records.len(),
            writes,
            per_second: records.len() as f64 / (span_us / 1e6),
            writer_waits,
            reader_waits,
            torn_reads,
            writer_overlaps: writer_overlaps(&records),
            peak_readers,
            mean_readers,
        }
    }

    /// Torn reads and writer overlaps: what a read-write lock must never
    /// let happen.
    pub fn violations(&self) -> usize {
        self.torn_reads + self.writer_overlaps
    }
}

/// Writes (in `sorted`, ordered by body start) whose body overlaps any
/// other body. A body `[a, b)` overlaps an earlier-starting one when the
/// latest end among those is after `a`, and a later-starting one when the
/// next start is before `b`.
fn writer_overlaps(sorted: &[RwRecord]) -> usize {
    let mut latest_end = 0;
    let mut overlaps = 0;
    for (i, r) in sorted.iter().enumerate() {
        let before = latest_end > r.acquired;
        let after = sorted.get(i + 1).is_some_and(|n| n.acquired < r.released);
        if r.kind == Kind::Write && (before || after) {
            overlaps += 1;
        }
        latest_end = latest_end.max(r.released);
    }
    overlaps
}

/// The most read bodies at one moment, and the read bodies' summed time
/// over the time when at least one ran.
fn readers_at_once(records: &[RwRecord]) -> (usize, f64) {
    let mut events: Vec<(u64, i64)> = records
        .iter()
        .filter(|r| r.kind == Kind::Read)
        .flat_map(|r| [(r.acquired, 1), (r.released, -1)])
        .collect();
    // Ends before starts at one instant: touching bodies do not share.
    events.sort_unstable();
    let (mut now, mut peak, mut busy, mut summed) = (0i64, 0i64, 0u64, 0u64);
    let mut since = 0;
    for (t, step) in events {
        if now > 0 {
            busy += t - since;
            summed += (t - since) * now.unsigned_abs();
        }
        since = t;
        now += step;
        peak = peak.max(now);
    }
    let mean = if busy > 0 {
        summed as f64 / busy as f64
    } else {
        f64::NAN
    };
    (usize::try_from(peak).unwrap_or(0), mean)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn rec(kind: Kind, acquired: u64, released: u64) -> RwRecord {
        RwRecord {
            worker: 1,
            kind,
            requested: acquired.saturating_sub(5),
            acquired,
            released,
            torn: false,
        }
    }

    #[test]
    fn lines_round_trip() {
        let r = RwRecord {
            torn: true,
            ..rec(Kind::Read, 20, 30)
        };
        assert_eq!(RwRecord::parse(&r.to_line()).unwrap().unwrap(), r);
        let w = rec(Kind::Write, 7, 9);
        assert_eq!(RwRecord::parse(&w.to_line()).unwrap().unwrap(), w);
        assert!(RwRecord::parse("done").is_none());
        assert!(RwRecord::parse("rw 1 x 1 2 3 0").unwrap().is_err());
    }

    #[test]
    fn readers_may_overlap_and_writers_may_not() {
        use Kind::{Read, Write};
        // Two readers share [10, 20) and [15, 25); a writer follows alone;
        // another writer starts inside a read, which starts inside a write.
        let clean = [rec(Read, 10, 20), rec(Read, 15, 25), rec(Write, 25, 30)];
        let a = RwAnalysis::of(clean.to_vec());
        assert_eq!((a.writer_overlaps, a.violations()), (0, 0));
        assert_eq!(a.peak_readers, 2);
        // Reads ran 20 µs in all over the 15 µs when one ran.
        assert!((a.mean_readers - 20.0 / 15.0).abs() < 1e-9);
        assert_eq!((a.total, a.writes), (3, 1));
        let bad = [rec(Write, 0, 10), rec(Read, 5, 12), rec(Write, 40, 50)];
        let b = RwAnalysis::of(bad.to_vec());
        assert_eq!(b.writer_overlaps, 1);
        let inside = [rec(Read, 0, 100), rec(Write, 40, 50)];
        assert_eq!(RwAnalysis::of(inside.to_vec()).writer_overlaps, 1);
        let torn = RwRecord {
            torn: true,
            ..rec(Read, 60, 70)
        };
        assert_eq!(RwAnalysis::of(vec![torn]).violations(), 1);
    }
}
