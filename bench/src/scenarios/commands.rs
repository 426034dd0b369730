//! S4: Redis commands per acquisition under S3's contention.
//!
//! From the lock server's `INFO commandstats` deltas over a contention run:
//! every command a client sent, plus each PUBLISH (our release script issues
//! it inside Redis, but it is a message on the wire to every subscriber),
//! minus the harness's own PINGs. What a library's scripts run *inside* Redis
//! is left out: that is server work, not traffic (see `lock_testkit::commandstats`).

use lock_testkit::commandstats::commands_in_script;
use lock_testkit::Delta;

use super::figures::{median, median_row, Run};
use crate::report::{Row, Target};
use crate::worker::Library;

/// Our scripts: the commands they run inside Redis (not sent by a client).
fn our_script_commands() -> Vec<String> {
    [
        include_str!("../../../lock-runtime/src/scripts/redlock_boot_check.lua"),
        include_str!("../../../lock-runtime/src/scripts/acquire.lua"),
        include_str!("../../../lock-runtime/src/scripts/release.lua"),
        include_str!("../../../lock-runtime/src/scripts/renew.lua"),
        include_str!("../../../lock-runtime/src/scripts/force_unlock.lua"),
        include_str!("../../../lock-runtime/src/scripts/fair.lua"),
    ]
    .iter()
    .flat_map(|s| commands_in_script(s))
    .collect()
}

/// rslock's unlock script runs GET and DEL inside Redis (its extend script,
/// unused here, would add a SET; rslock sends its own SET NX directly).
fn rslock_script_commands() -> Vec<String> {
    vec!["get".to_owned(), "del".to_owned()]
}

/// Commands `library`'s clients sent in `delta` (plus PUBLISHes), without
/// the `harness_pings` the parent sent meanwhile.
pub fn sent(library: Library, delta: &Delta, harness_pings: u64) -> u64 {
    let inside = if library.is_ours() {
        our_script_commands()
    } else {
        rslock_script_commands()
    };
    let publishes = if inside.iter().any(|c| c == "publish") {
        delta.get("publish")
    } else {
        0
    };
    (delta.sent(&inside) + publishes).saturating_sub(harness_pings)
}

/// Acquire attempts that found the lock taken: our acquire scripts call
/// PTTL only then (in fair mode such an attempt also queues the process);
/// rslock sends one SET NX per attempt.
pub fn failed_attempts(library: Library, delta: &Delta, acquisitions: usize) -> u64 {
    if library.is_ours() {
        delta.get("pttl")
    } else {
        delta.get("set").saturating_sub(acquisitions as u64)
    }
}

/// The S4 rows of one of our modes: commands per acquisition against
/// `target`, and how many of them were failed attempts (`failed` names
/// them: in fair mode they queue the process).
pub fn rows(group: &'static str, runs: &[Run], target: Target, failed: &str) -> Vec<Row> {
    vec![
        median_row(group, "commands per acquisition", runs, cmds).target(target),
        Row::new(group, failed, median(runs, failed_per)),
    ]
}

/// The S4 rows of the peer, and ours (plain, cohorting off) against it.
pub fn peer_rows(ours: &[Run], peer: &[Run]) -> Vec<Row> {
    vec![
        median_row("S4 peer", "rslock commands per acquisition", peer, cmds),
        median_row(
            "S4 peer",
            "rslock failed acquire attempts",
            peer,
            failed_per,
        ),
        median_row("S4 vs peer", "commands ours / rslock", ours, cmds)
            .vs("rslock", median(peer, cmds)),
    ]
}

fn cmds(r: &Run) -> f64 {
    r.commands_per_acquisition
}

fn failed_per(r: &Run) -> f64 {
    r.failed_attempts
}
