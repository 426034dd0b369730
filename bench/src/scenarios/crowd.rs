//! S8 and S9: many workers, ours (as `LockRuntime::builder()` configures it
//! by default) against rslock.
//!
//! Both are contention runs of S3's worker (`contention.rs`) in other
//! [`Shape`]s: S8 puts 8 processes of 8 tasks on one key, more processes
//! than the machine has cores, so a release's message has many processes to
//! wake and the holder is often descheduled; S9 puts 64 tasks in 4
//! processes on 1,000 keys chosen by Zipf(1.1), a service with a few hot
//! keys and a long tail. Each repetition runs ours, then rslock. The figures
//! are S3's: throughput, waits, worker and process shares, exactness.

use anyhow::Result;
use serde_json::json;

use super::contention::{self, median, Run};
use super::{Ctx, Output};
use crate::config::Shape;
use crate::report::{Row, Target};
use crate::worker::Library;

/// Which of the two.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Crowd {
    /// 8 processes x 8 tasks, one key.
    S8,
    /// 4 processes x 16 tasks, Zipf-distributed keys.
    S9,
}

impl Crowd {
    fn shape(self, ctx: &Ctx) -> Shape {
        match self {
            Crowd::S8 => ctx.scale().s8,
            Crowd::S9 => ctx.scale().s9,
        }
    }

    fn names(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Crowd::S8 => ("S8", "S8 peer", "s8"),
            Crowd::S9 => ("S9", "S9 peer", "s9"),
        }
    }
}

/// Our rows (judged) or the peer's (reported).
fn rows(group: &'static str, runs: &[Run], peer: Option<&[Run]>) -> Vec<Row> {
    let ours = peer.is_some();
    let judged = |t: Target| if ours { t } else { Target::Info };
    let mut rate = Row::new(group, "acquisitions/s", median(runs, Run::rate));
    if let Some(peer) = peer {
        rate = rate
            .vs("rslock", median(peer, Run::rate))
            .target(Target::RatioAtLeast(1.0));
    }
    let mut rows = vec![
        rate,
        Row::new(
            group,
            "wait to acquire p50 (ms)",
            median(runs, Run::wait_p50_ms),
        ),
        Row::new(
            group,
            "wait to acquire p99 (ms)",
            median(runs, Run::wait_p99_ms),
        ),
        Row::new(
            group,
            "wait to acquire max (ms)",
            median(runs, Run::wait_max_ms),
        )
        .target(judged(Target::AtMost(100.0))),
        Row::new(group, "busiest / idlest worker", median(runs, Run::spread)),
        Row::new(
            group,
            "smallest process share (%)",
            median(runs, Run::min_process_pct),
        ),
        Row::new(
            group,
            "largest process share (%)",
            median(runs, Run::max_process_pct),
        ),
    ];
    rows.extend(super::handoff::tail_rows(
        group,
        runs,
        ours,
        judged(Target::Exactly(0.0)),
    ));
    rows
}

/// Runs S8 or S9.
pub async fn run(ctx: &Ctx, crowd: Crowd) -> Result<Output> {
    let shape = crowd.shape(ctx);
    let (group, peer_group, tag) = crowd.names();
    let (mut ours, mut peer) = (Vec::new(), Vec::new());
    for run in 0..ctx.runs() {
        ours.push(contention::contend(ctx, Library::OursDefault, shape, tag, run).await?);
        peer.push(contention::contend(ctx, Library::Rslock, shape, tag, run).await?);
    }
    let mut all = rows(group, &ours, Some(&peer));
    all.extend(rows(peer_group, &peer, None));
    let detail = json!({
        "processes": shape.processes,
        "tasks_per_process": shape.tasks,
        "keys": shape.keys.to_arg(),
        "seconds_per_run": shape.duration.as_secs_f64(),
        "ours": Library::OursDefault.name(),
        "ours_mode": Library::default_mode().name(),
        "ours_runs": ours.iter().map(Run::to_json).collect::<Vec<_>>(),
        "rslock_runs": peer.iter().map(Run::to_json).collect::<Vec<_>>(),
    });
    Ok(Output {
        rows: all,
        detail,
        ..Output::default()
    })
}
