//! What a failing run prints, and the history dump for study.

use std::fmt::Write as _;

use super::check::{Coverage, Violation};
use super::faults::Fault;
use super::history::{Event, History};
use super::permits::key_name;
use super::{ns, PER_CLASS, WINDOW};

/// Writes the whole merged history and the faults to `path`
/// (`LOCK_NEMESIS_DUMP=<path>`: `<path>.Plain`, `<path>.Fair`), for study.
pub(super) fn dump(history: &History, faults: &[Fault], coverage: &Coverage, path: &str) {
    let mut out = format!("{coverage:?}\n");
    for f in faults {
        let _ = writeln!(
            out,
            "{:>8.3} .. {:>8.3} fault: {}",
            history.secs(f.start),
            history.secs(f.end),
            f.what
        );
    }
    for e in &history.events {
        let _ = writeln!(
            out,
            "{:>8.3} {} {}",
            history.secs(e.t),
            key_name(e.key),
            e.text
        );
    }
    std::fs::write(path, out).expect("write LOCK_NEMESIS_DUMP");
}

/// The failure message: seed, counts by class, the first violations of
/// each class, the faults, and the history of the key around the first
/// violation of each class.
pub(super) fn report(
    history: &History,
    faults: &[Fault],
    violations: &[Violation],
    header: &str,
) -> String {
    let rel = |t: u64| history.secs(t);
    let mut out = String::new();
    let _ = writeln!(out, "{header}");
    let mut classes: Vec<(&str, usize)> = Vec::new();
    for v in violations {
        match classes.iter_mut().find(|(c, _)| *c == v.class) {
            Some((_, n)) => *n += 1,
            None => classes.push((v.class, 1)),
        }
    }
    let _ = writeln!(out, "by class: {classes:?}");
    for (class, _) in &classes {
        let of_class = violations.iter().filter(|v| v.class == *class);
        for v in of_class.take(PER_CLASS) {
            let _ = writeln!(out, "- {}: {}", v.class, v.detail);
        }
    }
    let _ = writeln!(out, "faults:");
    for f in faults {
        let _ = writeln!(
            out,
            "  {:>8.3} .. {:>8.3}  {}{}",
            rel(f.start),
            rel(f.end),
            f.what,
            if f.loses_data {
                " [loses lock data]"
            } else {
                ""
            }
        );
    }
    // The history around the first violation of each class.
    for (class, _) in &classes {
        let Some((key, at)) = violations
            .iter()
            .filter(|v| v.class == *class)
            .find_map(|v| v.at)
        else {
            continue;
        };
        let (from, to) = (at.saturating_sub(ns(WINDOW)), at + ns(WINDOW));
        let _ = writeln!(
            out,
            "history of key {} from {:.3} to {:.3} s ({}):",
            key_name(key),
            rel(from),
            rel(to),
            class
        );
        for f in faults.iter().filter(|f| f.start <= to && f.settled >= from) {
            let _ = writeln!(out, "  {:>8.3} fault: {}", rel(f.start), f.what);
        }
        let events: Vec<&Event> = history
            .events
            .iter()
            .filter(|e| e.key == key && e.t >= from && e.t <= to)
            .collect();
        for e in events.iter().take(200) {
            let _ = writeln!(out, "  {:>8.3} {}", rel(e.t), e.text);
        }
        if events.len() > 200 {
            let _ = writeln!(out, "  ... {} more", events.len() - 200);
        }
    }
    out
}
