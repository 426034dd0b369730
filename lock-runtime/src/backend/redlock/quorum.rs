//! The Redlock arithmetic, apart from any I/O: the quorum, the clock-drift
//! allowance, whether an acquisition is still valid, and how the masters'
//! answers combine into one answer (held, busy and for how long, renewed or
//! lost).

use std::time::Duration;

use crate::backend::{Recorded, RecordedReader};
use crate::mode::LockMode;

/// The fixed part of the clock-drift allowance: covers the resolution of
/// the masters' expiry timers (Redis checks TTLs to the millisecond) and a
/// little scheduling jitter.
pub(crate) const DRIFT_BASE: Duration = Duration::from_millis(2);

/// The proportional part of the clock-drift allowance, as a divisor of the
/// lease: 1 %, a bound on how much faster than ours a master's clock may
/// run over one lease (real quartz drift is far smaller; this is the figure
/// of the Redlock description).
pub(crate) const DRIFT_DIVISOR: u32 = 100;

/// How many masters make a majority of `masters`.
pub(crate) fn quorum(masters: usize) -> usize {
    masters / 2 + 1
}

/// The clock-drift allowance of a lease: `lease / 100 + 2 ms`. Each master
/// is given the lease plus this, and an acquisition that took longer than
/// the lease minus this counts as failed, so the hold's client-side end
/// (the send time of the acquire or renewal plus the lease) comes before
/// any majority master lets the key go.
pub(crate) fn drift(lease: Duration) -> Duration {
    (lease / DRIFT_DIVISOR).saturating_add(DRIFT_BASE)
}

/// The TTL each master is given for a hold of `lease`.
pub(crate) fn padded(lease: Duration) -> Duration {
    lease.saturating_add(drift(lease))
}

/// How long a master that lost its data takes no new hold, when the longest
/// TTL any master of the fleet gave a hold is `longest` (itself a padded
/// lease): `longest` padded once more. A hold on the lost data ends, by its
/// holder's clock, at most one lease after its last good renewal or acquire,
/// which was sent before the data was lost; the quarantine starts when a
/// runtime finds the data gone, no earlier, and the padding covers the
/// master's clock running up to 1 % fast over it. `Duration::ZERO` (nothing
/// recorded anywhere: a fleet nobody has locked on) needs none.
pub(crate) fn quarantine(longest: Duration) -> Duration {
    if longest.is_zero() {
        Duration::ZERO
    } else {
        padded(longest)
    }
}

/// What is left of a hold of `lease` whose acquisition took `elapsed`, once
/// the drift allowance is taken off: `None` when nothing is (too slow: the
/// acquisition failed even if a majority said yes).
pub(crate) fn validity(lease: Duration, elapsed: Duration) -> Option<Duration> {
    lease
        .checked_sub(elapsed)
        .and_then(|left| left.checked_sub(drift(lease)))
        .filter(|left| !left.is_zero())
}

/// How long a waiter should sleep after a failed attempt (absent a release
/// message): until enough of the busy masters' holds run out for a majority
/// to be free. The `held` masters that said yes to us are free again once
/// our partial holds are undone; of the `busy` masters' remaining leases the
/// `quorum - held` shortest must run out. `None` when that is unknown (a
/// lease without expiry among them, or too few busy masters known).
pub(crate) fn busy_ttl(quorum: usize, held: usize, busy: &[Option<Duration>]) -> Option<Duration> {
    let needed = quorum.saturating_sub(held);
    if needed == 0 {
        return Some(Duration::ZERO);
    }
    let mut known: Vec<Duration> = busy.iter().copied().collect::<Option<Vec<_>>>()?;
    known.sort_unstable();
    known.get(needed - 1).copied()
}

/// One lock's renewal over every master: renewed when a majority said yes,
/// lost when more than a minority said no (a majority can no longer hold
/// it), unknown otherwise (too many masters did not answer).
pub(crate) fn renewal(masters: usize, yes: usize, no: usize) -> Option<bool> {
    let quorum = quorum(masters);
    if yes >= quorum {
        Some(true)
    } else if no > masters - quorum {
        Some(false)
    } else {
        None
    }
}

/// One holder's share of a lock as one master records it: a write hold's
/// holder, or one reader of a read hold.
struct Share<'a> {
    holder: &'a str,
    holds: u64,
    remaining: Option<Duration>,
    fence: Option<u64>,
    write: bool,
}

/// Every share one master's record lists.
fn shares(record: &Recorded) -> Vec<Share<'_>> {
    if record.mode.is_read() {
        return record
            .readers
            .iter()
            .map(|reader| Share {
                holder: &reader.holder,
                // (A record counts the holds of the reader it is described
                // by only.)
                holds: if reader.holder == record.holder {
                    record.holds
                } else {
                    1
                },
                remaining: reader.remaining,
                fence: reader.fence,
                write: false,
            })
            .collect();
    }
    vec![Share {
        holder: &record.holder,
        holds: record.holds,
        remaining: record.remaining,
        fence: record.fence,
        write: true,
    }]
}

/// What one holder's `same` shares (one per master, at least `quorum`)
/// say together: the most holds, how long a majority still has it (the
/// `quorum`-th longest remaining lease; a lease without expiry outlasts
/// every other), and its token.
fn combined(same: &[&Share<'_>], quorum: usize) -> (u64, Option<Duration>, Option<u64>) {
    let mut remaining: Vec<Duration> = same
        .iter()
        .map(|s| s.remaining.unwrap_or(Duration::MAX))
        .collect();
    remaining.sort_unstable_by(|a, b| b.cmp(a));
    let remaining = remaining
        .get(quorum.saturating_sub(1))
        .copied()
        .filter(|r| *r != Duration::MAX);
    let fences: Vec<u64> = same.iter().filter_map(|s| s.fence).collect();
    (
        same.iter().map(|s| s.holds).max().unwrap_or(0),
        remaining,
        majority_fence(&fences, quorum),
    )
}

/// The hold that a majority of `records` (one per master that answered;
/// `None`: free there) names, if any.
///
/// A write hold: its holder recorded as the write holder on a majority;
/// its remaining lease is how long a majority still has it, its token the
/// one a majority records (an acquire returns once a majority records it;
/// a master it reached late may show its own token until the write-back
/// lands there), else the largest recorded.
///
/// Else a read hold: every reader recorded on a majority, in either mode
/// (a downgrade is best effort per master: one still recording the write
/// hold it came from keeps writers out as well), each with its lease and
/// token worked out as a writer's; the hold is described by the reader
/// whose lease a majority keeps longest, the one a writer waits for.
pub(super) fn majority_record(records: &[Option<Recorded>], quorum: usize) -> Option<Recorded> {
    let all: Vec<Vec<Share<'_>>> = records.iter().flatten().map(shares).collect();
    let of = |holder: &str, write_only: bool| -> Vec<&Share<'_>> {
        all.iter()
            .filter_map(|master| {
                master
                    .iter()
                    .find(|s| s.holder == holder && (s.write || !write_only))
            })
            .collect()
    };
    let mut holders: Vec<&str> = all.iter().flatten().map(|s| s.holder).collect();
    holders.sort_unstable();
    holders.dedup();
    if let Some(writer) = holders.iter().find(|h| of(h, true).len() >= quorum) {
        let (holds, remaining, fence) = combined(&of(writer, true), quorum);
        return Some(Recorded {
            holder: (*writer).to_owned(),
            holds,
            remaining,
            fence,
            queue: Vec::new(),
            mode: LockMode::Write,
            readers: Vec::new(),
        });
    }
    // (remaining, holds, reader) of every reader a majority records.
    let mut readers: Vec<(Option<Duration>, u64, RecordedReader)> = holders
        .iter()
        .filter_map(|holder| {
            let same = of(holder, false);
            if same.len() < quorum {
                return None;
            }
            let (holds, remaining, fence) = combined(&same, quorum);
            let reader = RecordedReader {
                holder: (*holder).to_owned(),
                remaining,
                fence,
            };
            Some((remaining, holds, reader))
        })
        .collect();
    // The longest lease first (no expiry: longest of all), then by holder.
    let key = |r: &Option<Duration>| r.unwrap_or(Duration::MAX);
    readers.sort_by(|a, b| {
        key(&b.0)
            .cmp(&key(&a.0))
            .then_with(|| a.2.holder.cmp(&b.2.holder))
    });
    let (remaining, holds, last) = readers.first()?.clone();
    Some(Recorded {
        holder: last.holder,
        holds,
        remaining,
        fence: last.fence,
        queue: Vec::new(),
        mode: LockMode::Read,
        readers: readers.into_iter().map(|(.., reader)| reader).collect(),
    })
}

/// Whether what [`majority_record`] makes of `records` can no longer
/// change with the answers of the `open` masters still out: every holder
/// seen (in either mode, and as a writer) is recorded on a majority
/// already or cannot reach one, and the open masters are too few to make a
/// majority for a holder not seen at all. (Not merely "some holder has a
/// majority": a reader whose acquire returned on a bare majority may show
/// on only one master that answered so far, its vote to another still on
/// the way there.)
pub(super) fn record_settled(records: &[Option<Recorded>], quorum: usize, open: usize) -> bool {
    let all: Vec<Vec<Share<'_>>> = records.iter().flatten().map(shares).collect();
    let decided = |count: usize| count >= quorum || count + open < quorum;
    let count = |holder: &str, write_only: bool| {
        all.iter()
            .filter(|master| {
                master
                    .iter()
                    .any(|s| s.holder == holder && (s.write || !write_only))
            })
            .count()
    };
    open < quorum
        && all
            .iter()
            .flatten()
            .all(|s| decided(count(s.holder, false)) && decided(count(s.holder, true)))
}

/// The token that `quorum` of `fences` agree on, else the largest.
fn majority_fence(fences: &[u64], quorum: usize) -> Option<u64> {
    fences
        .iter()
        .find(|f| fences.iter().filter(|g| g == f).count() >= quorum)
        .or_else(|| fences.iter().max())
        .copied()
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn a_majority_is_more_than_half() {
        assert_eq!(
            [1, 2, 3, 4, 5, 6, 7].map(quorum),
            [1, 2, 2, 3, 3, 4, 4],
            "N/2+1"
        );
    }

    #[test]
    fn validity_is_the_lease_less_the_time_taken_and_the_drift() {
        // 1 s lease: drift 10 ms + 2 ms.
        assert_eq!(drift(MS(1000)), MS(12));
        assert_eq!(padded(MS(1000)), MS(1012));
        assert_eq!(validity(MS(1000), MS(100)), Some(MS(888)));
        assert_eq!(validity(MS(1000), MS(988)), None, "nothing left");
        assert_eq!(validity(MS(1000), MS(987)), Some(MS(1)));
        assert_eq!(validity(MS(1000), Duration::MAX), None);
        // Durations near MAX saturate instead of panicking.
        assert_eq!(padded(Duration::MAX), Duration::MAX);
        assert!(validity(Duration::MAX, MS(5)).is_some());
    }

    #[test]
    fn a_master_that_lost_its_data_sits_out_the_longest_lease_and_its_drift() {
        // The longest TTL given was 1 s: 1 s, 10 ms drift and 2 ms more.
        assert_eq!(quarantine(MS(1000)), MS(1012));
        assert!(quarantine(padded(MS(800))) > padded(MS(800)));
        assert_eq!(quarantine(Duration::ZERO), Duration::ZERO, "never used");
        assert_eq!(quarantine(Duration::MAX), Duration::MAX);
    }

    #[test]
    fn a_waiter_sleeps_until_enough_busy_masters_free_up() {
        let busy = [Some(MS(300)), Some(MS(100)), Some(MS(200))];
        // 5 masters, quorum 3; 2 said yes to us (undone): one more must free.
        assert_eq!(busy_ttl(3, 2, &busy), Some(MS(100)));
        // None said yes: the three shortest, so the longest of these three.
        assert_eq!(busy_ttl(3, 0, &busy), Some(MS(300)));
        assert_eq!(busy_ttl(3, 0, &busy[..2]), None, "too few known");
        assert_eq!(busy_ttl(3, 1, &[Some(MS(1)), None]), None, "no expiry");
        assert_eq!(busy_ttl(3, 3, &[]), Some(Duration::ZERO));
    }

    #[test]
    fn a_renewal_is_lost_once_a_majority_is_out_of_reach() {
        assert_eq!(renewal(5, 3, 2), Some(true));
        assert_eq!(renewal(5, 3, 0), Some(true));
        assert_eq!(renewal(5, 2, 2), None, "one unknown could still decide");
        assert_eq!(renewal(5, 2, 3), Some(false));
        assert_eq!(renewal(5, 0, 0), None, "nobody answered");
        assert_eq!(renewal(4, 2, 2), Some(false), "4 masters need 3");
    }

    fn record(holder: &str, remaining_ms: u64, fence: u64) -> Option<Recorded> {
        Some(Recorded {
            holder: holder.to_owned(),
            holds: 1,
            remaining: Some(Duration::from_millis(remaining_ms)),
            fence: Some(fence),
            queue: Vec::new(),
            mode: LockMode::Write,
            readers: Vec::new(),
        })
    }

    #[test]
    fn inspect_reports_the_holder_of_a_majority() {
        let records = [
            record("a", 900, 10),
            record("a", 500, 30),
            None,
            record("b", 800, 5),
            record("a", 700, 20),
        ];
        let found = majority_record(&records, 3).expect("a holds a majority");
        assert_eq!(found.holder, "a");
        // Three masters hold it: a majority has it until the third longest runs out.
        assert_eq!(found.remaining, Some(Duration::from_millis(500)));
        assert_eq!(found.fence, Some(30), "no majority agrees: the largest");
        let mut agreed = records.clone();
        for r in agreed.iter_mut().flatten() {
            r.fence = Some(
                if r.holder == "a" && r.remaining != Some(Duration::from_millis(900)) {
                    25
                } else {
                    40
                },
            );
        }
        let found = majority_record(&agreed, 2).expect("a holds");
        assert_eq!(found.fence, Some(25), "what a majority records");
        assert_eq!(majority_record(&records[..4], 3), None, "only two say a");
    }

    /// A read hold as one master records it: `(holder, remaining ms,
    /// token)` per reader, described by the first.
    fn readers(list: &[(&str, u64, u64)]) -> Option<Recorded> {
        let readers: Vec<RecordedReader> = list
            .iter()
            .map(|(holder, ms, fence)| RecordedReader {
                holder: (*holder).to_owned(),
                remaining: Some(Duration::from_millis(*ms)),
                fence: Some(*fence),
            })
            .collect();
        let first = readers.first().expect("a reader").clone();
        Some(Recorded {
            holder: first.holder,
            holds: 2,
            remaining: first.remaining,
            fence: first.fence,
            queue: Vec::new(),
            mode: LockMode::Read,
            readers,
        })
    }

    #[test]
    fn inspect_reports_the_readers_a_majority_records_in_either_mode() {
        // Three masters: `a` downgraded on two of them (the third still
        // records its write hold), `b` read on two, `c` on one only.
        let records = [
            readers(&[("a", 900, 10), ("b", 400, 12)]),
            readers(&[("b", 500, 12), ("a", 800, 10), ("c", 950, 13)]),
            record("a", 700, 10),
        ];
        let found = majority_record(&records, 2).expect("read-held");
        assert_eq!(found.mode, LockMode::Read);
        let listed: Vec<(&str, Option<Duration>, Option<u64>)> = found
            .readers
            .iter()
            .map(|r| (r.holder.as_str(), r.remaining, r.fence))
            .collect();
        assert_eq!(
            listed,
            [
                ("a", Some(MS(800)), Some(10)),
                ("b", Some(MS(400)), Some(12))
            ],
            "c has no majority; a majority keeps a 800 ms and b 400 ms"
        );
        assert_eq!((found.holder.as_str(), found.holds), ("a", 2));
        assert_eq!((found.remaining, found.fence), (Some(MS(800)), Some(10)));
        // A write hold a majority still records is reported as such.
        let pending = [records[2].clone(), record("a", 600, 10), records[0].clone()];
        let found = majority_record(&pending, 2).expect("write-held");
        assert_eq!((found.mode, found.holder.as_str()), (LockMode::Write, "a"));
        assert!(found.readers.is_empty());
        assert_eq!(
            majority_record(&[readers(&[("c", 1, 1)]), None, None], 2),
            None
        );
    }

    #[test]
    fn inspect_waits_for_a_master_that_could_still_show_a_reader_a_majority() {
        // `b` holds a bare majority of three, but of the two masters that
        // answered one had not run its vote yet: the third decides.
        let seen = [
            readers(&[("a", 900, 10), ("b", 900, 12)]),
            readers(&[("a", 900, 10)]),
        ];
        assert!(!record_settled(&seen, 2, 1));
        assert!(record_settled(&seen, 2, 0), "all answered");
        let both = [seen[0].clone(), seen[0].clone()];
        assert!(record_settled(&both, 2, 1), "both readers have two");
        assert!(record_settled(
            &[record("a", 1, 1), record("a", 1, 1)],
            2,
            1
        ));
        assert!(
            !record_settled(&[record("a", 1, 1), None], 2, 1),
            "a may have two"
        );
        assert!(record_settled(&[None, None], 2, 1), "free on a majority");
        assert!(
            !record_settled(&[None, None], 3, 3),
            "three out could make one"
        );
    }
}
