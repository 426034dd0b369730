//! S4: Redis commands per acquisition under S3's contention.
//!
//! From the lock server's `INFO commandstats` deltas over a contention run:
//! every command a client sent, plus each PUBLISH (our release script issues
//! it inside Redis, but it is a message on the wire to every subscriber),
//! minus the harness's own PINGs. What a library's scripts run *inside* Redis
//! is left out: that is server work, not traffic (see `lock_testkit::commandstats`).

use lock_testkit::commandstats::commands_in_script;
use lock_testkit::Delta;

use super::contention::Run;
use crate::report::{Row, Target};
use crate::stats::median_of;
use crate::worker::Library;

/// Our scripts: the commands they run inside Redis (not sent by a client).
fn our_script_commands() -> Vec<String> {
    [
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
    let inside = match library {
        Library::Ours | Library::OursFair | Library::OursCluster => our_script_commands(),
        Library::Rslock => rslock_script_commands(),
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
    match library {
        Library::Ours | Library::OursFair | Library::OursCluster => delta.get("pttl"),
        Library::Rslock => delta.get("set").saturating_sub(acquisitions as u64),
    }
}

/// The S4 rows from the runs of the three libraries.
pub fn rows(ours: &[Run], fair: &[Run], peer: &[Run]) -> Vec<Row> {
    let cmds = |r: &Run| r.commands_per_acquisition;
    let failed = |r: &Run| r.failed_attempts;
    vec![
        Row::new("S4", "commands per acquisition", median_of(ours, cmds))
            .target(Target::AtMost(4.0)),
        Row::new(
            "S4",
            "of which failed acquire attempts",
            median_of(ours, failed),
        ),
        Row::new("S4 fair", "commands per acquisition", median_of(fair, cmds))
            .target(Target::AtMost(4.0)),
        Row::new(
            "S4 fair",
            "of which failed (queueing) attempts",
            median_of(fair, failed),
        ),
        Row::new(
            "S4 peer",
            "rslock commands per acquisition",
            median_of(peer, cmds),
        ),
        Row::new(
            "S4 peer",
            "rslock failed acquire attempts",
            median_of(peer, failed),
        ),
        Row::new(
            "S4 vs peer",
            "commands ours / rslock",
            median_of(ours, cmds),
        )
        .vs("rslock", median_of(peer, cmds)),
    ]
}
