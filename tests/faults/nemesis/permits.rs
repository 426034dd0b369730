//! The promises of permit calls (`permits = N`) beyond each permit's own.
//!
//! **Each permit is a key of its own (a slot).** Permit `i` of key `nk3`
//! is the lock `nk3#i` (permit 0: `nk3` itself), and the worker logs a
//! permit call under the permit it got (`nemesis_worker/permits.rs`). So
//! the history holds each permit as a key of its own, numbered [`slot`],
//! named [`key_name`], and `check`'s per-key promises cover each permit
//! as they cover a key: no two holders of one permit at once (with the same
//! fault excuses), a permit's tokens never going backwards, its counter
//! changed by its own holder only, its waiters served in time.
//!
//! A call that got no permit (it timed out, failed or was cut) is logged
//! under a permit drawn at random: it tried every permit and then waited
//! for all of them at once, so any permit that stayed free long enough
//! should have been its, and the waiting checks hold for whichever slot
//! it is under. Its wait may end later past its deadline than a one-key
//! wait ([`late_slack`]): a try-once tries the permits one after another.
//!
//! Checked here:
//! - the index: the permit the library told a call (`permit()`, a guard's
//!   `permit()`) is the slot it is logged under (for a guard, the key of
//!   the lock it holds), and below N;
//! - nesting: a permit call nested (at any depth) in a call holding a
//!   permit of the same key re-enters that permit (same slot, same token,
//!   no hold of its own), unless the outer hold was told lost first;
//! - at most N: no more than N outermost holds of a key's permits
//!   overlap (beyond [`SLACK`]), and for each count n in use no more than
//!   n on the permits below n (one process asks one permit fewer in mixed
//!   mode), unless two of them on one permit overlap as the faults excuse.
//!   Given the two checks above and per-permit exclusion this cannot fail;
//!   it is kept as a sanity check of the slots.

use std::collections::HashMap;
use std::time::Duration;

use super::check::{act_by, data_lost_between, describe, frozen_past, Coverage, Violation};
use super::faults::Fault;
use super::history::{Call, History};
use super::{ns, LATE_SLACK, PERMITS, SLACK};

/// Slot numbers: permit `i` of key `k` is slot `k + i * SLOTS` (permit 0
/// is the key's own number).
const SLOTS: usize = 1000;

/// The slot of an event line's key column: `<key>` or `<key>#<permit>`.
pub(super) fn slot_of(column: &str) -> Option<usize> {
    match column.split_once('#') {
        None => column.parse().ok(),
        Some((key, permit)) => Some(slot(key.parse().ok()?, permit.parse().ok()?)),
    }
}

/// The slot of permit `permit` of key `key`.
pub(super) fn slot(key: usize, permit: u32) -> usize {
    key + permit as usize * SLOTS
}

/// A slot's name, the name of its lock: `nk3` (a key, or permit 0 of a
/// permit key), `nk3#1`.
pub(super) fn key_name(slot: usize) -> String {
    match permit_of(slot) {
        0 => format!("nk{slot}"),
        permit => format!("nk{}#{permit}", base_key(slot)),
    }
}

/// The key a slot is a permit of (itself for a key).
fn base_key(slot: usize) -> usize {
    slot % SLOTS
}

/// The permit a slot is (0 for a key).
fn permit_of(slot: usize) -> u32 {
    (slot / SLOTS) as u32
}

/// The keys of the locks of key `key` of `permits` permits (0: not a
/// permit key): its own, or each permit's, as the faults ask the servers
/// about them.
pub(super) fn lock_keys(key: usize, permits: u32) -> Vec<String> {
    (0..permits.max(1))
        .map(|permit| key_name(slot(key, permit)))
        .collect()
}

/// How late past its deadline a bounded wait of `call` may end: a permit
/// call's try-once tries each permit in turn, each try as late as a
/// one-key wait's last ([`LATE_SLACK`]).
pub(super) fn late_slack(call: &Call) -> Duration {
    LATE_SLACK * call.permits.max(1)
}

/// Permits must be held side by side, or "at most N, one on each" went
/// untested beyond one holder at a time: a violation when no two permits
/// of a key were ever held at once.
pub(super) fn side_by_side(coverage: &Coverage, violations: &mut Vec<Violation>) {
    if coverage.permit_holds > 0 && coverage.permits_at_once < 2 {
        violations.push(Violation::plain(
            "permits never side by side",
            format!(
                "{} permit holds, never two of one key at once",
                coverage.permit_holds
            ),
        ));
    }
}

/// The run's line on its permit calls.
pub(super) fn print_coverage(coverage: &Coverage) {
    println!(
        "nemesis: {} permit holds (at most {} of one key at once; {} moments over a count, \
         {PERMITS} or n below n, that the faults excuse), {} nested permit calls re-entered their \
         caller's permit, {} permit calls timed out (their waits checked under a permit drawn \
         at random)",
        coverage.permit_holds,
        coverage.permits_at_once,
        coverage.permits_over_n_excused,
        coverage.permit_reentries,
        coverage.permit_timeouts
    );
}

/// Every check of this module, and the permit calls counted.
pub(super) fn check_permits(
    history: &History,
    faults: &[Fault],
    violations: &mut Vec<Violation>,
    coverage: &mut Coverage,
) {
    coverage.permit_timeouts = history
        .calls
        .iter()
        .filter(|c| c.permits > 0 && c.ended.as_ref().is_some_and(|e| e.1 == "timeout"))
        .count() as u64;
    violations.extend(wrong_indices(history));
    violations.extend(not_reentered(history, faults, coverage));
    violations.extend(more_than_n(history, faults, coverage));
}

/// A permit call that holds a permit was told the index of the slot it is
/// logged under, below its count, and a guard holds that permit's lock:
/// the calls that were not.
fn wrong_indices(history: &History) -> Vec<Violation> {
    let held = history
        .calls
        .iter()
        .filter(|c| c.permits > 0 && c.acquired.is_some());
    let wrong = held.filter(|call| {
        let permit = permit_of(call.key);
        let lock_matches = call.lock.as_ref().is_none_or(|l| *l == key_name(call.key));
        call.permit != Some(permit) || permit >= call.permits || !lock_matches
    });
    wrong
        .map(|call| Violation {
            class: "permit index wrong",
            detail: format!(
                "key {}: {} was told permit {} of {}{}",
                key_name(call.key),
                describe(history, call),
                call.permit.map_or("none".to_owned(), |p| p.to_string()),
                call.permits,
                call.lock
                    .as_ref()
                    .map_or(String::new(), |l| format!(", holding the lock {l}"))
            ),
            at: Some((call.key, call.acquired.unwrap_or(0))),
        })
        .collect()
}

/// A permit call nested (at any depth) in a call holding a permit of its
/// key re-enters that permit: the same slot and token, no hold of its own.
/// Unless the outer hold ended, or was told lost, before the nested call
/// got its permit (a lost hold is not re-entered). The calls that did not.
fn not_reentered(history: &History, faults: &[Fault], coverage: &mut Coverage) -> Vec<Violation> {
    let mut found = Vec::new();
    for call in history.calls.iter().filter(|c| c.permits > 0) {
        let Some(outer) = holder_around(history, faults, call) else {
            continue;
        };
        let reentered = call.key == outer.key && call.fence == outer.fence && !call.outer;
        coverage.permit_reentries += u64::from(reentered);
        if reentered {
            continue;
        }
        found.push(Violation {
            class: "permit not re-entered",
            detail: format!(
                "key {}: {} got {} inside {}, which held {}",
                key_name(call.key),
                describe(history, call),
                key_name(call.key),
                describe(history, outer),
                key_name(outer.key)
            ),
            at: Some((call.key, call.acquired.unwrap_or(0))),
        });
    }
    found
}

/// The innermost call around `call`, a permit call that got a permit,
/// holding a permit of `call`'s key when `call` got one, and not told it
/// was lost by then.
fn holder_around<'h>(history: &'h History, faults: &[Fault], call: &Call) -> Option<&'h Call> {
    let acquired = call.acquired?;
    let key = base_key(call.key);
    let outer = history.ancestors(call).into_iter().find(|a| {
        a.permits > 0 && base_key(a.key) == key && a.acquired.is_some_and(|t| t <= acquired)
    })?;
    let due = act_by(faults, call.proc, acquired + ns(SLACK));
    let gone = history.hold_end(outer) < acquired
        || history.told_lost(outer).is_some_and(|lost| lost <= due);
    (!gone).then_some(outer)
}

/// At most N outermost holds of a key's permits overlap, and for each
/// count n its calls give, at most n on the permits below n (calls giving
/// different counts share the low permits), unless two of the overlapping
/// holds on one permit overlap as the faults excuse (lock data lost
/// between their entries, or the earlier holder frozen when it should
/// have learnt its hold was gone): each entry that made more.
fn more_than_n(history: &History, faults: &[Fault], coverage: &mut Coverage) -> Vec<Violation> {
    let mut by_key: HashMap<usize, Vec<&Call>> = HashMap::new();
    for call in &history.calls {
        if call.permits > 0 && call.outer && call.acquired.is_some() {
            coverage.permit_holds += 1;
            by_key.entry(base_key(call.key)).or_default().push(call);
        }
    }
    let mut found = Vec::new();
    for (key, mut holds) in by_key {
        holds.sort_by_key(|c| (c.acquired, c.proc, c.id));
        let mut counts: Vec<u32> = holds.iter().map(|c| c.permits).collect();
        counts.sort_unstable();
        counts.dedup();
        let ends: Vec<u64> = holds.iter().map(|c| history.hold_end(c)).collect();
        for (j, &later) in holds.iter().enumerate() {
            let acquired = later.acquired.unwrap_or(0);
            let open: Vec<&Call> = (0..j)
                .filter(|&i| ends[i] > acquired + ns(SLACK))
                .map(|i| holds[i])
                .chain([later])
                .collect();
            coverage.permits_at_once = coverage.permits_at_once.max(open.len() as u64);
            // For each count n in use, at most n on the permits below n
            // (for the largest: at most that many at all).
            let below = |n: u32| -> Vec<&Call> {
                let under = open.iter().filter(|c| permit_of(c.key) < n);
                under.copied().collect()
            };
            let Some(n) = counts
                .iter()
                .copied()
                .find(|&n| below(n).len() > n as usize)
            else {
                continue;
            };
            let over = below(n);
            let excuse = excused(history, faults, &over);
            coverage.permits_over_n_excused += u64::from(excuse);
            if !excuse {
                found.push(too_many(history, key, n, &over));
            }
        }
    }
    found
}

/// The violation of `open`, more holds of key `key`'s permits below `n`
/// at once than `n`, the last of them entered last.
fn too_many(history: &History, key: usize, n: u32, open: &[&Call]) -> Violation {
    let last = open[open.len() - 1];
    let acquired = last.acquired.unwrap_or(0);
    let all: Vec<String> = open.iter().map(|c| describe(history, c)).collect();
    Violation {
        class: "more than N permit holders",
        detail: format!(
            "key {}: {} holds of its permits below {n} at once at {:.3} s: {}",
            key_name(key),
            open.len(),
            history.secs(acquired),
            all.join("; ")
        ),
        at: Some((last.key, acquired)),
    }
}

/// Whether two of `open` (in order of entry) hold one permit and overlap
/// as the faults excuse.
fn excused(history: &History, faults: &[Fault], open: &[&Call]) -> bool {
    open.iter().enumerate().any(|(j, later)| {
        let acquired = later.acquired.unwrap_or(0);
        open[..j].iter().any(|earlier| {
            earlier.key == later.key
                && (data_lost_between(faults, earlier, acquired)
                    || frozen_past(faults, earlier, history.hold_end(earlier), acquired))
        })
    })
}
