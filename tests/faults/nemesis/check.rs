//! The checker: the library's promises tested against the merged history.

use std::collections::HashMap;
use std::time::Duration;

use super::faults::Fault;
use super::history::{Call, History};
use super::many::check_many;
use super::permits::{check_permits, key_name, late_slack};
use super::{ns, Backend, FREE_BASE, LATE_SLACK, RESUME, SLACK, STUCK, TIMEOUT};

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

/// When a process that should act at `due` (notice a loss, say) does so
/// at the latest: `due`, or, when it was frozen then (stopped, or its
/// executor blocked), [`RESUME`] after that freeze ended (and after every
/// freeze that follows before then): a process that cannot run cannot act,
/// in either sense, until it runs again.
pub(super) fn act_by(faults: &[Fault], proc: usize, due: u64) -> u64 {
    let mut freezes: Vec<&Fault> = faults
        .iter()
        .filter(|f| f.frozen && f.proxy == Some(proc))
        .collect();
    freezes.sort_by_key(|f| f.start);
    let mut by = due;
    for f in freezes {
        if f.start <= by && f.end + ns(RESUME) > by {
            by = f.end + ns(RESUME);
        }
    }
    by
}

/// How long `proc` was frozen within `from..to`, in ns (overlapping
/// freezes counted once).
fn frozen_within(faults: &[Fault], proc: usize, from: u64, to: u64) -> u64 {
    let spans: Vec<(u64, u64)> = faults
        .iter()
        .filter(|f| f.frozen && f.proxy == Some(proc))
        .map(|f| (f.start.max(from), f.end.min(to)))
        .filter(|(a, b)| a < b)
        .collect();
    union_length(spans)
}

/// The length of the union of `spans` (ns).
fn union_length(mut spans: Vec<(u64, u64)>) -> u64 {
    spans.sort_unstable();
    let (mut total, mut reach) = (0, 0);
    for (a, b) in spans {
        let a = a.max(reach);
        if b > a {
            total += b - a;
            reach = b;
        }
    }
    total
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
/// README's "lost at the client-side lease end"). A holder frozen at that
/// moment acts on it once it runs again ([`act_by`]).
pub(super) fn stale_bound(earlier: &Call, later_acquired: u64, faults: &[Fault]) -> u64 {
    let lease_end = earlier.acquired.unwrap_or(0) + ns(earlier.lease);
    let bound = if !earlier.renew {
        later_acquired.max(lease_end) + ns(SLACK)
    } else {
        let renewal = later_acquired + ns(earlier.lease / 3 + TIMEOUT + SLACK);
        let cut_off = faults.iter().any(|f| {
            f.counted
                && !f.frozen
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
    };
    act_by(faults, earlier.proc, bound)
}

/// What the checks had to work with (written with `LOCK_NEMESIS_DUMP`): a
/// run whose faults never hit a holder proves little.
#[derive(Debug, Default)]
pub(super) struct Coverage {
    pub(super) outer_holds: u64,
    pub(super) holds_told_lost: u64,
    pub(super) overlaps_after_data_loss: u64,
    /// Overlaps with a holder that was stopped or whose executor was
    /// blocked, and that stopped acting once it ran again.
    pub(super) overlaps_after_a_freeze: u64,
    /// Holds of a fixed lease told lost after the next holder entered, but
    /// no later than their own executor ran a timer for the lease's end.
    pub(super) tells_late_with_their_executor: u64,
    /// Entries whose poll began long (over 50 ms) before they were logged:
    /// the process was stopped or its thread blocked in between.
    pub(super) entries_across_a_freeze: u64,
    pub(super) nested_bodies: u64,
    pub(super) bounded_waits: u64,
    pub(super) timeouts_on_a_free_key_near_faults: u64,
    /// Outermost read holds, and write or exclusive ones.
    pub(super) read_holds: u64,
    pub(super) write_holds: u64,
    /// Pairs of read holds of two processes that overlapped: readers
    /// shared the key.
    pub(super) readers_side_by_side: u64,
    /// Bodies that read their key's counter twice (and writers that
    /// wrote it), and of them, those that saw it change beside a holder
    /// the faults excuse.
    pub(super) data_checks: u64,
    pub(super) data_changes_excused: u64,
    /// Writes asked inside a read hold of their key, refused.
    pub(super) upgrades_refused: u64,
    /// Calls cut by a timeout around their acquire or body, and calls
    /// cancelled (dropped before they ended).
    pub(super) cut_calls: u64,
    pub(super) cancelled: u64,
    /// `try_acquire()` calls, and guards dropped instead of released.
    pub(super) tries: u64,
    pub(super) guards_dropped: u64,
    /// Outermost holds open when a shutdown of their runtime was called.
    pub(super) holds_at_a_shutdown: u64,
    /// Write holds whose record in the backend was read inside the body.
    pub(super) write_holds_inspected: u64,
    /// Multi-key calls; those whose body ran, and the holds of their keys
    /// then (`many`).
    pub(super) many_calls: u64,
    pub(super) many_entered: u64,
    pub(super) many_holds: u64,
    /// Calls nested in a multi-key call refused as out of order.
    pub(super) order_refused: u64,
    /// Outermost holds of permits, nested permit calls that re-entered
    /// their caller's permit, the most permit holds of one key seen at
    /// once, moments more than N overlapped as the faults excuse, and
    /// permit calls that timed out (`permits`).
    pub(super) permit_holds: u64,
    pub(super) permit_reentries: u64,
    pub(super) permits_at_once: u64,
    pub(super) permits_over_n_excused: u64,
    pub(super) permit_timeouts: u64,
}

pub(super) fn check(
    history: &History,
    faults: &[Fault],
    backend: Backend,
    violations: &mut Vec<Violation>,
) -> Coverage {
    let mut coverage = Coverage::default();
    for call in &history.calls {
        coverage.cut_calls += u64::from(call.cut);
        coverage.tries += u64::from(call.tried);
        coverage.guards_dropped += u64::from(call.dropped);
        coverage.cancelled += u64::from(call.ended.as_ref().is_some_and(|e| e.1 == "cancelled"));
    }
    let outer = Outer {
        history,
        faults,
        by_key: outer_holds(history, &mut coverage),
    };
    check_fences(&outer, violations);
    check_exclusion(&outer, violations, &mut coverage);
    check_data(&outer, violations, &mut coverage);
    check_nesting(history, faults, violations, &mut coverage);
    check_upgrades(history, faults, violations, &mut coverage);
    check_many(history, faults, violations, &mut coverage);
    check_permits(history, faults, violations, &mut coverage);
    check_recorded(history, violations, &mut coverage);
    check_waiters(history, faults, backend, violations, &mut coverage);
    coverage
}

/// When and how `call`'s acquire ended: `acquired`, the end's kind with
/// its error (`error upgrade_refused`), or `nothing` by the end of its
/// process's log.
pub(super) fn outcome(history: &History, call: &Call) -> (u64, String) {
    match (call.acquired, &call.ended) {
        (Some(t), _) => (t, "acquired".to_owned()),
        (None, Some((t, kind))) => (
            *t,
            match &call.error {
                Some(what) => format!("{kind} {what}"),
                None => kind.clone(),
            },
        ),
        (None, None) => (history.ends[call.proc], "nothing".to_owned()),
    }
}

/// A hold, for a report: process, task, call, token, lease, when it was
/// asked for, entered and left, and whether it was told lost.
pub(super) fn describe(history: &History, call: &Call) -> String {
    let acquired = call.acquired.unwrap_or(0);
    let entered = call.entered_from();
    let entry = if acquired.saturating_sub(entered) > 1_000_000 {
        format!(
            "entered between {:.3} and {:.3} s",
            history.secs(entered),
            history.secs(acquired)
        )
    } else {
        format!("entered at {:.3} s", history.secs(acquired))
    };
    let many = if call.group == 0 {
        String::new()
    } else {
        format!(", a key of multi-key call {}", call.group)
    };
    format!(
        "p{} t{} call {} ({} hold{many}, token {}, lease {} ms{}, asked at {:.3} s, {entry}, \
         held until {:.3} s{})",
        call.proc,
        call.task,
        call.id,
        call.mode_word(),
        call.fence,
        call.lease.as_millis(),
        if call.renew { "" } else { " fixed" },
        history.secs(call.begin),
        history.secs(history.hold_end(call)),
        if call.lost.is_some() {
            ", told lost"
        } else {
            ""
        }
    )
}

/// The faults within a second of `from..to`, for a report: what happened
/// around a violation.
pub(super) fn faults_around(history: &History, faults: &[Fault], from: u64, to: u64) -> String {
    let (from, to) = (from.saturating_sub(1_000_000_000), to + 1_000_000_000);
    let mut near: Vec<&Fault> = faults
        .iter()
        .filter(|f| f.start <= to && f.end >= from && (f.counted || f.loses_data || f.frozen))
        .collect();
    near.sort_by_key(|f| f.start);
    if near.is_empty() {
        return "no fault within a second".to_owned();
    }
    let listed: Vec<String> = near
        .iter()
        .map(|f| {
            format!(
                "{:.3}-{:.3} s {}",
                history.secs(f.start),
                history.secs(f.end),
                f.what
            )
        })
        .collect();
    format!("faults around: {}", listed.join("; "))
}

/// Outermost holds of each key (a hold of its own, not a re-entry), in
/// the order their entries were logged.
fn outer_holds<'h>(history: &'h History, coverage: &mut Coverage) -> HashMap<usize, Vec<&'h Call>> {
    let mut by_key: HashMap<usize, Vec<&Call>> = HashMap::new();
    for call in &history.calls {
        if call.acquired.is_some() && call.outer {
            coverage.outer_holds += 1;
            coverage.holds_told_lost += u64::from(call.lost.is_some());
            coverage.holds_at_a_shutdown += u64::from(history.open_at_shutdown(call));
            if call.writes() {
                coverage.write_holds += 1;
            } else {
                coverage.read_holds += 1;
            }
            let acquired = call.acquired.unwrap_or(0);
            coverage.entries_across_a_freeze +=
                u64::from(acquired.saturating_sub(call.entered_from()) > 50_000_000);
            by_key.entry(call.key).or_default().push(call);
        }
    }
    for holds in by_key.values_mut() {
        holds.sort_by_key(|c| (c.acquired, c.proc, c.id));
    }
    by_key
}

/// The outermost holds of each key (`outer_holds`), with what the checks
/// of them read beside: the history they come from and the faults.
struct Outer<'a> {
    history: &'a History,
    faults: &'a [Fault],
    by_key: HashMap<usize, Vec<&'a Call>>,
}

/// Fencing tokens never go backwards: every write (or exclusive) hold of
/// a key enters with a token larger than that of every hold that surely
/// entered before it (its `acquired` line is older than the poll that
/// handed the later hold over), and every read hold with a token larger
/// than that of every write hold that surely entered before it (tokens
/// order nothing among readers), whatever faults came between — also
/// after data loss, a stop or a stall.
fn check_fences(outer: &Outer<'_>, violations: &mut Vec<Violation>) {
    let (history, faults, by_key) = (outer.history, outer.faults, &outer.by_key);
    for (&key, holds) in by_key {
        let name = key_name(key);
        // The largest token entered up to each position (in logged order),
        // of any hold and of write holds.
        let mut largest: Vec<&Call> = Vec::with_capacity(holds.len());
        let mut largest_write: Vec<Option<&Call>> = Vec::with_capacity(holds.len());
        for &hold in holds {
            let top = match largest.last() {
                Some(&top) if top.fence >= hold.fence => top,
                _ => hold,
            };
            largest.push(top);
            let top_write = match largest_write.last().copied().flatten() {
                Some(top) if top.fence >= hold.fence || !hold.writes() => Some(top),
                _ => Some(hold).filter(|h| h.writes()),
            };
            largest_write.push(top_write);
        }
        for &later in holds {
            let from = later.entered_from();
            let before = holds.partition_point(|c| c.acquired.unwrap_or(0) < from);
            let Some(i) = before.checked_sub(1) else {
                continue;
            };
            let top = if later.writes() {
                largest[i]
            } else {
                match largest_write[i] {
                    Some(top) => top,
                    None => continue,
                }
            };
            if top.fence < later.fence {
                continue;
            }
            let acquired = later.acquired.unwrap_or(0);
            violations.push(Violation {
                class: "fence went backwards",
                detail: format!(
                    "key {name}: {} entered with token {} after {} had entered with token {}; \
                     {}",
                    describe(history, later),
                    later.fence,
                    describe(history, top),
                    top.fence,
                    faults_around(history, faults, top.acquired.unwrap_or(0), acquired)
                ),
                at: Some((key, acquired)),
            });
        }
    }
}

/// Outermost holds of each key, across processes: no overlap (beyond
/// [`SLACK`]) of a write (or exclusive) hold with any other (two read
/// holds may overlap) unless lock data was lost in between (then the later token is
/// larger, and the earlier holder is told within [`stale_bound`]), or the
/// earlier holder could not run (stopped, its executor blocked) when it
/// should have learnt its hold was gone, and stopped acting within
/// [`RESUME`] of running again.
fn check_exclusion(outer: &Outer<'_>, violations: &mut Vec<Violation>, coverage: &mut Coverage) {
    let (history, faults, by_key) = (outer.history, outer.faults, &outer.by_key);
    for (&key, holds) in by_key {
        let name = key_name(key);
        let ends: Vec<u64> = holds.iter().map(|c| history.hold_end(c)).collect();
        for j in 0..holds.len() {
            let later = holds[j];
            let acquired = later.acquired.unwrap_or(0);
            for i in 0..j {
                let earlier = holds[i];
                if ends[i] <= acquired + ns(SLACK) {
                    continue;
                }
                if !earlier.writes() && !later.writes() {
                    coverage.readers_side_by_side += u64::from(earlier.proc != later.proc);
                    continue;
                }
                let around =
                    || faults_around(history, faults, earlier.acquired.unwrap_or(0), ends[i]);
                if data_lost_between(faults, earlier, acquired) {
                    coverage.overlaps_after_data_loss += 1;
                    if later.fence <= earlier.fence {
                        violations.push(Violation {
                            class: "fence not larger after data loss",
                            detail: format!(
                                "key {name}: {} overlaps {}; {}",
                                describe(history, later),
                                describe(history, earlier),
                                around()
                            ),
                            at: Some((key, acquired)),
                        });
                    }
                    let bound = stale_bound(earlier, acquired, faults);
                    if ends[i] > bound {
                        violations.push(Violation {
                            class: "stale holder not told after data loss",
                            detail: format!(
                                "key {name}: {} still held {} ms after {} entered (bound {} ms); {}",
                                describe(history, earlier),
                                (ends[i] - acquired) / 1_000_000,
                                describe(history, later),
                                (bound - acquired) / 1_000_000,
                                around()
                            ),
                            at: Some((key, acquired)),
                        });
                    }
                    continue;
                }
                if frozen_past(faults, earlier, ends[i], acquired) {
                    coverage.overlaps_after_a_freeze += 1;
                    continue;
                }
                // A later holder with a smaller token entered on a stale
                // hold: that is the fault, however late the earlier one
                // was told.
                let told = earlier.lost.is_some() && later.fence > earlier.fence;
                if told && told_as_its_executor_ran(earlier, ends[i], acquired) {
                    coverage.tells_late_with_their_executor += 1;
                    continue;
                }
                let class = if told {
                    "holder told lost too late"
                } else {
                    "two holders at once"
                };
                let both = ends[i].min(ends[j]).saturating_sub(acquired);
                // A late tell of a fixed lease: how late its executor ran a
                // plain timer for the lease's latest end, for the reader.
                let timer = match (earlier.lost, earlier.timer_late()) {
                    (Some(lost), Some(late)) => format!(
                        " (told lost {} ms after the latest end of its lease; a timer of its \
                         executor for that moment fired {} ms late)",
                        lost.saturating_sub(earlier.polled.unwrap_or(0) + ns(earlier.lease))
                            / 1_000_000,
                        late / 1_000_000
                    ),
                    _ => String::new(),
                };
                violations.push(Violation {
                    class,
                    detail: format!(
                        "key {name}: {}{timer} and {} both held it, for {} ms from {:.3} s; {}",
                        describe(history, earlier),
                        describe(history, later),
                        both / 1_000_000,
                        history.secs(acquired),
                        around()
                    ),
                    at: Some((key, acquired)),
                });
            }
        }
    }
}

/// Whether `earlier`, a hold of a fixed lease that ended at `end` with its
/// tell (its lease ran out), was told no later after `later_acquired` than
/// [`SLACK`] plus how late its own executor ran a plain timer for the
/// lease's latest end ([`Call::timer_late`]): the library tells at the
/// lease's end, on time when the process runs then (within 2 ms in the
/// runs measured), and a process just back from a freeze, or starved for
/// less than the worker reports, runs that tell as late as everything else
/// that fell due (a tell 6 ms after the next entry was seen once in 14
/// runs). [`SLACK`] itself stays small: two holders for a few ms is a
/// defect's size too.
fn told_as_its_executor_ran(earlier: &Call, end: u64, later_acquired: u64) -> bool {
    let Some(late) = earlier.timer_late() else {
        return false;
    };
    earlier.lost == Some(end) && end <= later_acquired + ns(SLACK) + late
}

/// Whether lock data was lost (a restart) between `earlier`'s entry and an
/// entry at `later_acquired`: then the two holds may overlap for a while
/// ([`stale_bound`]).
pub(super) fn data_lost_between(faults: &[Fault], earlier: &Call, later_acquired: u64) -> bool {
    faults
        .iter()
        .any(|f| f.loses_data && f.start < later_acquired && f.end > earlier.acquired.unwrap_or(0))
}

/// Whether `earlier`, held until `earlier_end`, overlapped an entry at
/// `later_acquired` only because its process could not run (stopped, its
/// executor blocked) when it should have learnt its hold was gone, and it
/// stopped within [`RESUME`] of running again.
pub(super) fn frozen_past(
    faults: &[Fault],
    earlier: &Call,
    earlier_end: u64,
    later_acquired: u64,
) -> bool {
    earlier_end <= act_by(faults, earlier.proc, later_acquired + ns(SLACK))
}

/// The data: a body that saw its key's counter change between its start
/// and its end (`data` event: a reader's two reads differ, or a writer's)
/// had a writer beside it. That is a violation unless the change came from
/// a writer whose overlap with it the faults excuse (as
/// [`check_exclusion`] does: data lost between their entries, or the
/// earlier one frozen); an overlap the exclusion check reports shows here
/// too, seen through the data. A change with no writer inside the body at
/// all is a violation as well (a write the log does not show).
fn check_data(outer: &Outer<'_>, violations: &mut Vec<Violation>, coverage: &mut Coverage) {
    let (history, faults, by_key) = (outer.history, outer.faults, &outer.by_key);
    for (&key, holds) in by_key {
        let name = key_name(key);
        for &call in holds {
            let Some(data) = call.data else { continue };
            coverage.data_checks += 1;
            if data.seen == data.then {
                continue;
            }
            let from = call.body_enter.unwrap_or(0);
            // Writers that wrote, or may have, inside this body.
            let writers: Vec<&Call> = holds
                .iter()
                .copied()
                .filter(|w| !std::ptr::eq(*w, call) && w.writes())
                .filter_map(|w| {
                    let wrote = w.data?;
                    (w.body_enter.unwrap_or(0) < data.t && wrote.t > from).then_some(w)
                })
                .collect();
            let excused = writers.iter().any(|w| {
                let (earlier, later) =
                    if (w.acquired, w.proc, w.id) < (call.acquired, call.proc, call.id) {
                        (*w, call)
                    } else {
                        (call, *w)
                    };
                let later_acquired = later.acquired.unwrap_or(0);
                data_lost_between(faults, earlier, later_acquired)
                    || frozen_past(faults, earlier, history.hold_end(earlier), later_acquired)
            });
            if excused {
                coverage.data_changes_excused += 1;
                continue;
            }
            let beside: Vec<String> = writers.iter().map(|w| describe(history, w)).collect();
            violations.push(Violation {
                class: "data changed under a holder",
                detail: format!(
                    "key {name}: {} found the counter at {} when its body began and at {} when \
                     it ended; writers inside: {}; {}",
                    describe(history, call),
                    data.seen,
                    data.then,
                    if beside.is_empty() {
                        "none logged".to_owned()
                    } else {
                        beside.join(", ")
                    },
                    faults_around(history, faults, from, data.t)
                ),
                at: Some((key, from)),
            });
        }
    }
}

/// Inside one task (one tree of calls), bodies of one key that overlap are
/// ancestor and descendant, or both readers: sibling `join!` arms take
/// turns unless both read. Pairs of two
/// outermost holds are left to the exclusion check (tasks of one process
/// are checked there too, through their outermost holds).
pub(super) fn check_nesting(
    history: &History,
    faults: &[Fault],
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
        let name = key_name(key);
        bodies.sort_by_key(|c| (c.body_enter, c.id));
        let exit = |c: &Call| c.body_exit.unwrap_or(history.ends[proc]);
        for j in 0..bodies.len() {
            let b = bodies[j];
            let b_enter = b.body_enter.unwrap_or(0);
            for a in &bodies[..j] {
                if exit(a) <= b_enter || (a.outer && b.outer) || !(a.writes() || b.writes()) {
                    continue;
                }
                if history.is_ancestor(a, b) || history.is_ancestor(b, a) {
                    continue;
                }
                let b_acquired = b.acquired.unwrap_or(b_enter);
                if history
                    .told_lost(a)
                    .is_some_and(|lost| lost <= act_by(faults, proc, b_acquired + ns(SLACK)))
                {
                    continue;
                }
                // Told apart for the report: a write beside a read of the
                // same hold, or two writers.
                let class = if a.writes() && b.writes() {
                    "siblings inside at once"
                } else {
                    "a writer beside a sibling's reader"
                };
                violations.push(Violation {
                    class,
                    detail: format!(
                        "key {name}: body of p{proc} call {} ({}) entered at {:.3} s while call \
                         {} ({}, not its ancestor) was inside since {:.3} s, until {:.3} s",
                        b.id,
                        b.mode_word(),
                        history.secs(b_enter),
                        a.id,
                        a.mode_word(),
                        history.secs(a.body_enter.unwrap_or(0)),
                        history.secs(exit(a))
                    ),
                    at: Some((key, b_enter)),
                });
            }
        }
    }
}

/// A write (or exclusive) hold is recorded in the backend as a write hold
/// while its body runs: a backend that records it as a read (its token
/// among the readers') lets readers of other processes in beside it, with
/// or without one coming in this run.
pub(super) fn check_recorded(
    history: &History,
    violations: &mut Vec<Violation>,
    coverage: &mut Coverage,
) {
    for call in history.calls.iter().filter(|c| c.outer && c.writes()) {
        coverage.write_holds_inspected += u64::from(call.recorded);
        let Some(t) = call.recorded_as_reader else {
            continue;
        };
        if t >= history.hold_end(call) {
            continue;
        }
        violations.push(Violation {
            class: "write hold recorded as a read",
            detail: format!(
                "key {}: {} was recorded by the backend as a reader's (its token among the \
                 readers') at {:.3} s, inside its body: readers of other processes may enter \
                 beside it",
                key_name(call.key),
                describe(history, call),
                history.secs(t)
            ),
            at: Some((call.key, t)),
        });
    }
}

/// How long a refusal at once may take (an upgrade here, a key out of
/// order in `many.rs`): it neither waits nor goes to the backend, so only
/// scheduling delays it, plus the time its process was frozen (through
/// [`act_by`]).
pub(super) const REFUSAL: Duration = Duration::from_millis(200);

/// A write (or exclusive) call nested inside read holds of its key and in
/// no write hold of it (an upgrade) is refused at once with
/// `UpgradeRefused`: it never holds, never waits. Calls under a hold told
/// lost are left out (a lost hold is not re-entered).
pub(super) fn check_upgrades(
    history: &History,
    faults: &[Fault],
    violations: &mut Vec<Violation>,
    coverage: &mut Coverage,
) {
    for call in history.calls.iter().filter(|c| c.writes()) {
        let mut readers = 0;
        let mut writer = false;
        let mut lost = false;
        for n in history.ancestors(call) {
            if n.key == call.key && n.acquired.is_some() {
                readers += u64::from(!n.writes());
                writer |= n.writes();
                lost |= n.lost.is_some();
            }
        }
        if readers == 0 || writer || lost {
            continue;
        }
        let (t, how) = outcome(history, call);
        let late = t.saturating_sub(call.begin)
            > ns(REFUSAL) + frozen_within(faults, call.proc, call.begin, t);
        let refused = how == "error upgrade_refused";
        coverage.upgrades_refused += u64::from(refused);
        // A call cancelled at once (its parent ended) had no time to be
        // refused, nor had one that its runtime's shutdown ended: no
        // verdict.
        let ended = how == "cancelled" || how == "panicked" || how == "error shut_down";
        if (refused || ended) && !late {
            continue;
        }
        violations.push(Violation {
            class: "upgrade not refused at once",
            detail: format!(
                "key {}: p{} call {} asked a {} hold inside {readers} read hold(s) of its key; \
                 {} ms after it asked: {how}",
                key_name(call.key),
                call.proc,
                call.id,
                call.mode_word(),
                t.saturating_sub(call.begin) / 1_000_000
            ),
            at: Some((call.key, t)),
        });
    }
}

/// How long after `end`, the end of a hold that did not end in a release,
/// its lock may still be in the store. Redis: its lease (a lost hold's
/// lock ran out, or runs out within a lease). etcd: a lost hold's key
/// stays on its runtime's etcd lease, kept alive, until its guard goes (the
/// delete goes out then: the call's last event), and from then on at most
/// until that lease runs out ([`Backend::linger`]). ZooKeeper alike: a
/// lost hold's node stays on its session, kept alive, until the delete,
/// and at most until the session expires.
fn linger(backend: Backend, call: &Call, end: u64) -> Duration {
    match backend {
        Backend::Redis => call.lease,
        Backend::Etcd | Backend::ZooKeeper => {
            let gone = [
                call.released,
                call.lost,
                call.body_exit,
                call.ended.as_ref().map(|e| e.0),
            ]
            .into_iter()
            .flatten()
            .fold(end, u64::max);
            Duration::from_nanos(gone - end) + backend.linger(call.lease, call.renew)
        }
    }
}

/// When a key of a multi-key call may have been held from: the call's
/// start, unless the key was never taken (the key its wait timed out on,
/// or one sorting after that key: never tried).
fn multi_key_hold(history: &History, call: &Call) -> Option<u64> {
    let timed_out =
        |c: &Call| c.acquired.is_none() && c.ended.as_ref().is_some_and(|e| e.1 == "timeout");
    if timed_out(call) {
        return None;
    }
    let name = |c: &Call| key_name(c.key);
    let untried = history
        .group_mates(call)
        .any(|m| timed_out(m) && name(m) < name(call));
    (!untried || call.acquired.is_some()).then_some(call.begin)
}

/// Bounded waits end in time, and do not time out on a key that was free.
pub(super) fn check_waiters(
    history: &History,
    faults: &[Fault],
    backend: Backend,
    violations: &mut Vec<Violation>,
    coverage: &mut Coverage,
) {
    // Per key: (acquired, end, what may linger after the end: nothing after
    // a release or a shutdown that confirmed its releases, else see
    // `linger`).
    let mut holds: HashMap<usize, Vec<(u64, u64, Duration)>> = HashMap::new();
    for call in &history.calls {
        // A key of a multi-key call may be held from the call's start
        // (taken before a later key was waited for) until the call gave
        // it back, whether or not the body ran: no key of its is free then.
        let acquired = match call.group {
            0 => call.acquired.filter(|_| call.outer),
            _ => multi_key_hold(history, call),
        };
        if let Some(acquired) = acquired {
            let end = history.hold_end(call);
            let confirmed = history.ended_by_shutdown(call).is_some_and(|s| s.confirmed);
            let linger = if call.released == Some(end) || confirmed {
                Duration::ZERO
            } else {
                linger(backend, call, end)
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
        // A process that could not run (stopped, executor blocked) returns
        // late by as long.
        let frozen = frozen_within(faults, call.proc, call.begin, t);
        // A multi-key call's keys each get a last try, and a failed one
        // gives back what it took, waiting for the answers up to the try
        // bound (250 ms).
        let slack = match call.group {
            0 => ns(late_slack(call)),
            _ => {
                let keys = history.group_mates(call).count() as u64 + 1;
                keys * ns(LATE_SLACK) + ns(Duration::from_millis(250))
            }
        };
        if t > deadline + slack + frozen {
            violations.push(Violation {
                class: "waiter overslept",
                detail: format!(
                    "key {}: p{} call {} with wait {} ms ended ({kind}) {} ms after it began",
                    key_name(call.key),
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
        // A key that stays free and out of reach for longer than [`STUCK`]
        // outside the faults' windows (each until it settled) is stuck:
        // something the faults left behind does not run out. Counted over
        // the key's whole free stretch (since its last hold ended and its
        // lock stopped lingering), not only this wait: waiters come and go
        // while a key stays stuck.
        let key_free = last.map_or(history.start, |&(_, e, linger)| e + ns(linger));
        let windows: Vec<(u64, u64)> = faults
            .iter()
            .filter(|f| f.start <= t && f.settled >= key_free)
            .map(|f| (f.start.max(key_free), f.settled.min(t)))
            .collect();
        let healthy = t
            .saturating_sub(key_free)
            .saturating_sub(union_length(windows));
        if healthy > ns(STUCK) {
            violations.push(Violation {
                class: "free key stuck",
                detail: format!(
                    "key {}: p{} call {} (wait {} ms) timed out at {:.3} s; no hold of the key \
                     was open (nor its lock lingering) since {:.3} s, {} ms of it away from any \
                     fault's window; {}",
                    key_name(call.key),
                    call.proc,
                    call.id,
                    wait.as_millis(),
                    history.secs(t),
                    history.secs(key_free),
                    healthy / 1_000_000,
                    faults_around(history, faults, t.saturating_sub(ns(STUCK)), t)
                ),
                at: Some((call.key, t)),
            });
            continue;
        }
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
                key_name(call.key),
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
