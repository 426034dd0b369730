//! The promises of multi-key calls beyond each key's own: a call holds its
//! keys together (all or none), and a call nested in a multi-key body on a
//! key sorting before one the chain's multi-key calls hold (and not held
//! by them) is refused at once, and no other call is.
//!
//! Each key of a multi-key call is a record of its own in the history
//! (`many=` marks the call), so exclusion, data, tokens and waiting are
//! checked key by key in `check`, as for single-key calls.

use super::check::{act_by, describe, outcome, Coverage, Violation, REFUSAL};
use super::faults::Fault;
use super::history::{Call, History};
use super::ns;
use super::permits::key_name;

/// Both checks, and the multi-key calls counted.
pub(super) fn check_many(
    history: &History,
    faults: &[Fault],
    violations: &mut Vec<Violation>,
    coverage: &mut Coverage,
) {
    check_together(history, violations, coverage);
    check_order(history, faults, violations, coverage);
}

/// A multi-key call whose body ran held every key of it when the body
/// began: each key's record logged its entry (as a hold of its own, not a
/// re-entry), and the holds overlap (the latest entry came before the
/// earliest end).
fn check_together(history: &History, violations: &mut Vec<Violation>, coverage: &mut Coverage) {
    coverage.many_calls = history.groups.len() as u64;
    let mut groups: Vec<_> = history.groups.iter().collect();
    groups.sort_by_key(|(&(proc, id), _)| (proc, id));
    for (&(proc, id), members) in groups {
        let calls: Vec<&Call> = members.iter().map(|&i| &history.calls[i]).collect();
        let Some(body) = calls.iter().filter_map(|c| c.body_enter).min() else {
            continue;
        };
        coverage.many_entered += 1;
        let entered = calls
            .iter()
            .filter(|c| c.body_enter.is_some() && c.outer)
            .count();
        coverage.many_holds += entered as u64;
        let latest = calls.iter().filter_map(|c| c.acquired).max().unwrap_or(0);
        let earliest_end = calls.iter().map(|c| history.hold_end(c)).min().unwrap_or(0);
        if entered == calls.len() && calls.len() > 1 && latest <= earliest_end {
            continue;
        }
        let keys: Vec<String> = calls
            .iter()
            .map(|c| {
                if c.body_enter.is_some() {
                    format!("{}: {}", key_name(c.key), describe(history, c))
                } else {
                    format!("{}: not entered", key_name(c.key))
                }
            })
            .collect();
        violations.push(Violation {
            class: "multi-key body without all its keys",
            detail: format!(
                "p{proc} multi-key call {id} entered its body at {:.3} s holding {entered} of its \
                 {} keys together: {}",
                history.secs(body),
                calls.len(),
                keys.join("; ")
            ),
            at: Some((calls[0].key, body)),
        });
    }
}

/// The keys held around `call` by the multi-key calls of its chain.
fn held_around(history: &History, call: &Call) -> Vec<usize> {
    let mut keys: Vec<usize> = history
        .ancestors(call)
        .iter()
        .filter(|n| n.group != 0)
        .map(|n| n.key)
        .collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// A call nested in a multi-key call on a key none of the chain's
/// multi-key calls holds, but sorting before one they hold, ends at once
/// with `OrderRefused` (it never waits, never holds); a call on any other
/// key is never refused so.
fn check_order(
    history: &History,
    faults: &[Fault],
    violations: &mut Vec<Violation>,
    coverage: &mut Coverage,
) {
    let name = key_name;
    for call in history.calls.iter().filter(|c| c.parent != 0) {
        let held = held_around(history, call);
        let above = held
            .iter()
            .copied()
            .filter(|&k| name(k) > name(call.key))
            .max_by_key(|&k| name(k));
        let must = !held.contains(&call.key) && above.is_some();
        let refused = call.error.as_deref() == Some("order_refused");
        coverage.order_refused += u64::from(refused);
        let (t, how) = outcome(history, call);
        if !must {
            if refused {
                violations.push(Violation {
                    class: "order refused without cause",
                    detail: format!(
                        "key {}: p{} call {} was refused as out of order, though the \
                         multi-key calls around it hold {:?}",
                        key_name(call.key),
                        call.proc,
                        call.id,
                        held.iter().map(|&k| name(k)).collect::<Vec<_>>()
                    ),
                    at: Some((call.key, t)),
                });
            }
            continue;
        }
        let late = t > act_by(faults, call.proc, call.begin + ns(REFUSAL));
        // A call cancelled at once (its parent ended) had no time to be
        // refused: no verdict.
        let ended = how == "cancelled" || how == "panicked";
        if (refused || ended) && !late {
            continue;
        }
        violations.push(Violation {
            class: "order not refused at once",
            detail: format!(
                "key {}: p{} call {} ({}) asked inside a multi-key call holding {} and not \
                 {}; {} ms after it asked: {how}",
                key_name(call.key),
                call.proc,
                call.id,
                call.mode_word(),
                above.map(name).unwrap_or_default(),
                key_name(call.key),
                t.saturating_sub(call.begin) / 1_000_000
            ),
            at: Some((call.key, t)),
        });
    }
}
