//! The checker: the library's promises tested against the merged history.

use std::collections::HashMap;
use std::time::Duration;

use super::faults::Fault;
use super::history::{Call, History};
use super::{ns, FREE_BASE, LATE_SLACK, SLACK, TIMEOUT};

pub(super) struct Violation {
    pub(super) class: &'static str,
    pub(super) detail: String,
    /// The key and moment to show the history around.
    pub(super) at: Option<(usize, u64)>,
}

impl Violation {
    pub(super) fn plain(class: &'static str, detail: String) -> Violation {
        Violation {
            class,
            detail,
            at: None,
        }
    }
}

/// Until when a holder whose lock data was lost (restart) may go on after
/// the next holder acquired: one renewal period plus the response timeout
/// plus [`SLACK`] for a renewed lease; a fixed lease is lost when it runs
/// out (counted from its acquisition, which is later than the library
/// counts from: its request's send time).
///
/// A renewal needs the server: when another fault kept the holder from it
/// in that time (the server frozen or restarted again, the holder's own
/// proxy stalled, slowed, cut or refusing), nothing can tell the holder
/// before its lease runs out, so then the bound is its lease end (the
/// README's "lost at the client-side lease end").
pub(super) fn stale_bound(earlier: &Call, later_acquired: u64, faults: &[Fault]) -> u64 {
    let lease_end = earlier.acquired.unwrap_or(0) + ns(earlier.lease);
    if !earlier.renew {
        return later_acquired.max(lease_end) + ns(SLACK);
    }
    let renewal = later_acquired + ns(earlier.lease / 3 + TIMEOUT + SLACK);
    let cut_off = faults.iter().any(|f| {
        f.counted
            && f.start < renewal
            && f.end >= later_acquired
            && f.proxy.is_none_or(|p| p == earlier.proc)
            && !(f.loses_data && f.start < later_acquired)
    });
    if cut_off {
        renewal.max(lease_end + ns(SLACK))
    } else {
        renewal
    }
}

/// What the checks had to work with (written with `LOCK_NEMESIS_DUMP`): a
/// run whose faults never hit a holder proves little.
#[derive(Debug, Default)]
pub(super) struct Coverage {
    pub(super) outer_holds: u64,
    pub(super) holds_told_lost: u64,
    pub(super) overlaps_after_data_loss: u64,
    pub(super) nested_bodies: u64,
    pub(super) bounded_waits: u64,
    pub(super) timeouts_on_a_free_key_near_faults: u64,
}

pub(super) fn check(
    history: &History,
    faults: &[Fault],
    violations: &mut Vec<Violation>,
) -> Coverage {
    let mut coverage = Coverage::default();
    check_exclusion_and_fences(history, faults, violations, &mut coverage);
    check_nesting(history, violations, &mut coverage);
    check_waiters(history, faults, violations, &mut coverage);
    coverage
}

pub(super) fn describe(history: &History, call: &Call) -> String {
    format!(
        "p{} t{} call {} (fence {}, lease {} ms{}, acquired at {:.3} s, hold until {:.3} s{})",
        call.proc,
        call.task,
        call.id,
        call.fence,
        call.lease.as_millis(),
        if call.renew { "" } else { " fixed" },
        history.secs(call.acquired.unwrap_or(0)),
        history.secs(history.hold_end(call)),
        if call.lost.is_some() {
            ", told lost"
        } else {
            ""
        }
    )
}

/// Outermost holds of each key, across processes: no overlap (beyond
/// [`SLACK`]) unless lock data was lost in between, and growing fences.
pub(super) fn check_exclusion_and_fences(
    history: &History,
    faults: &[Fault],
    violations: &mut Vec<Violation>,
    coverage: &mut Coverage,
) {
    let mut by_key: HashMap<usize, Vec<&Call>> = HashMap::new();
    for call in &history.calls {
        if call.acquired.is_some() && call.outer {
            coverage.outer_holds += 1;
            coverage.holds_told_lost += u64::from(call.lost.is_some());
            by_key.entry(call.key).or_default().push(call);
        }
    }
    for (key, mut holds) in by_key {
        holds.sort_by_key(|c| (c.acquired, c.proc, c.id));
        let ends: Vec<u64> = holds.iter().map(|c| history.hold_end(c)).collect();
        for j in 0..holds.len() {
            let later = holds[j];
            let acquired = later.acquired.unwrap_or(0);
            if j > 0 && later.fence <= holds[j - 1].fence {
                violations.push(Violation {
                    class: "fence did not grow",
                    detail: format!(
                        "key {key}: {} came after {}",
                        describe(history, later),
                        describe(history, holds[j - 1])
                    ),
                    at: Some((key, acquired)),
                });
            }
            for i in 0..j {
                let earlier = holds[i];
                if ends[i] <= acquired + ns(SLACK) {
                    continue;
                }
                let data_lost = faults.iter().any(|f| {
                    f.loses_data && f.start < acquired && f.end > earlier.acquired.unwrap_or(0)
                });
                if data_lost {
                    coverage.overlaps_after_data_loss += 1;
                    if later.fence <= earlier.fence {
                        violations.push(Violation {
                            class: "fence not larger after data loss",
                            detail: format!(
                                "key {key}: {} overlaps {}",
                                describe(history, later),
                                describe(history, earlier)
                            ),
                            at: Some((key, acquired)),
                        });
                    }
                    let bound = stale_bound(earlier, acquired, faults);
                    if ends[i] > bound {
                        violations.push(Violation {
                            class: "stale holder not told after data loss",
                            detail: format!(
                                "key {key}: {} still held {} ms after {} acquired (bound {} ms)",
                                describe(history, earlier),
                                (ends[i] - acquired) / 1_000_000,
                                describe(history, later),
                                (bound - acquired) / 1_000_000
                            ),
                            at: Some((key, acquired)),
                        });
                    }
                    continue;
                }
                let class = if earlier.lost.is_some() {
                    "holder told lost too late"
                } else {
                    "two holders at once"
                };
                violations.push(Violation {
                    class,
                    detail: format!(
                        "key {key}: {} overlaps {} by {} ms",
                        describe(history, later),
                        describe(history, earlier),
                        (ends[i] - acquired) / 1_000_000
                    ),
                    at: Some((key, acquired)),
                });
            }
        }
    }
}

/// Inside one task (one tree of calls), bodies of one key that overlap are
/// ancestor and descendant: sibling `join!` arms take turns. Pairs of two
/// outermost holds are left to the exclusion check (tasks of one process
/// are checked there too, through their outermost holds).
pub(super) fn check_nesting(
    history: &History,
    violations: &mut Vec<Violation>,
    coverage: &mut Coverage,
) {
    let mut groups: HashMap<(usize, u32, usize), Vec<&Call>> = HashMap::new();
    for call in &history.calls {
        if call.body_enter.is_some() {
            coverage.nested_bodies += u64::from(!call.outer);
            groups
                .entry((call.proc, call.task, call.key))
                .or_default()
                .push(call);
        }
    }
    for ((proc, _, key), mut bodies) in groups {
        bodies.sort_by_key(|c| (c.body_enter, c.id));
        let exit = |c: &Call| c.body_exit.unwrap_or(history.ends[proc]);
        for j in 0..bodies.len() {
            let b = bodies[j];
            let b_enter = b.body_enter.unwrap_or(0);
            for a in &bodies[..j] {
                if exit(a) <= b_enter || (a.outer && b.outer) {
                    continue;
                }
                if history.is_ancestor(a, b) || history.is_ancestor(b, a) {
                    continue;
                }
                let b_acquired = b.acquired.unwrap_or(b_enter);
                if history
                    .told_lost(a)
                    .is_some_and(|lost| lost <= b_acquired + ns(SLACK))
                {
                    continue;
                }
                violations.push(Violation {
                    class: "siblings inside at once",
                    detail: format!(
                        "key {key}: body of p{proc} call {} entered at {:.3} s while call {} \
                         (not its ancestor) was inside since {:.3} s, until {:.3} s",
                        b.id,
                        history.secs(b_enter),
                        a.id,
                        history.secs(a.body_enter.unwrap_or(0)),
                        history.secs(exit(a))
                    ),
                    at: Some((key, b_enter)),
                });
            }
        }
    }
}

/// Bounded waits end in time, and do not time out on a key that was free.
pub(super) fn check_waiters(
    history: &History,
    faults: &[Fault],
    violations: &mut Vec<Violation>,
    coverage: &mut Coverage,
) {
    // Per key: (acquired, end, what may linger after the end: nothing after
    // a release, else the lease).
    let mut holds: HashMap<usize, Vec<(u64, u64, Duration)>> = HashMap::new();
    for call in &history.calls {
        if let (Some(acquired), true) = (call.acquired, call.outer) {
            let end = history.hold_end(call);
            let linger = if call.released == Some(end) {
                Duration::ZERO
            } else {
                call.lease
            };
            holds
                .entry(call.key)
                .or_default()
                .push((acquired, end, linger));
        }
    }
    for call in &history.calls {
        let Some(wait) = call.wait else { continue };
        let outcome = match (call.acquired, &call.ended) {
            (Some(t), _) => Some((t, "acquired")),
            (None, Some((t, kind))) if kind == "timeout" || kind == "error" => {
                Some((*t, kind.as_str()))
            }
            _ => None,
        };
        let Some((t, kind)) = outcome else { continue };
        coverage.bounded_waits += 1;
        let deadline = call.begin + ns(wait);
        if t > deadline + ns(LATE_SLACK) {
            violations.push(Violation {
                class: "waiter overslept",
                detail: format!(
                    "key {}: p{} call {} with wait {} ms ended ({kind}) {} ms after it began",
                    call.key,
                    call.proc,
                    call.id,
                    wait.as_millis(),
                    (t - call.begin) / 1_000_000
                ),
                at: Some((call.key, t)),
            });
        }
        if kind != "timeout" || wait.is_zero() {
            continue;
        }
        // Was the key observably free right before the timeout?
        let key_holds = holds.get(&call.key).map(Vec::as_slice).unwrap_or(&[]);
        let busy = key_holds.iter().any(|&(a, e, _)| a <= t && e >= t);
        if busy {
            continue;
        }
        let last = key_holds
            .iter()
            .filter(|&&(a, e, _)| a <= t && e <= t)
            .max_by_key(|&&(_, e, _)| e);
        let free_since = last.map_or(call.begin, |&(_, e, _)| e.max(call.begin));
        let bound = FREE_BASE + last.map_or(Duration::ZERO, |&(_, _, linger)| linger);
        if t - free_since <= ns(bound) {
            continue;
        }
        // Around faults the system may legitimately be unavailable (stalled,
        // frozen, restarting, reconnecting, or a snapshot's locks living
        // again), so a free key may not be reachable: no verdict there.
        if faults
            .iter()
            .any(|f| f.start <= t && f.settled >= free_since)
        {
            coverage.timeouts_on_a_free_key_near_faults += 1;
            continue;
        }
        violations.push(Violation {
            class: "timed out on a free key",
            detail: format!(
                "key {}: p{} call {} (wait {} ms) timed out at {:.3} s; the key was free since {:.3} s (bound {} ms)",
                call.key,
                call.proc,
                call.id,
                wait.as_millis(),
                history.secs(t),
                history.secs(free_since),
                bound.as_millis()
            ),
            at: Some((call.key, t)),
        });
    }
}
