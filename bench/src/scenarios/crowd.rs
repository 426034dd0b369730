//! S8 and S9: many workers, ours (as `LockRuntime::builder()` configures it
//! by default) against rslock.
//!
//! Both are contention runs of S3's worker (`contention.rs`) in other
//! [`Shape`]s: S8 puts 8 processes of 8 tasks on one key, more processes
//! than the machine has cores, so a release's message has many processes to
//! wake and the holder is often descheduled; S9 puts 64 tasks in 4
//! processes on 1,000 keys chosen by Zipf(1.1), a service with a few hot
//! keys and a long tail. Each repetition runs ours, then rslock, each after
//! a half of the limit (the body alone, no lock: [`super::limit`]); S8
//! then does the same
//! once more with the data on the lock server ("S8 shared"). The figures
//! are S3's: throughput, waits, worker and process shares, exactness, and
//! each contender as a fraction of the limit (ours, the default mode, is
//! judged against issue 27's goal in S8; S9's keys let bodies of different
//! keys overlap, which its limit allows too). S8's rows also break each
//! contender's time per acquisition down (one key: body and handoffs).

use anyhow::Result;
use serde_json::json;

use super::contention::{self, Placement};
use super::figures::{median, median_row, Run};
use super::{limit, Ctx, LimitGroup, Output};
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
    fn shape(self, ctx: &Ctx, placement: Placement) -> Shape {
        match (self, placement) {
            (Crowd::S8, Placement::TwoServers) => ctx.scale().s8,
            (Crowd::S8, Placement::Shared) => ctx.scale().s8_shared,
            (Crowd::S9, _) => ctx.scale().s9,
        }
    }

    /// The groups of the rows and the keys' tag, on `placement`.
    fn names(self, placement: Placement) -> Names {
        let (ours, peer, limit, tag) = match (self, placement) {
            (Crowd::S8, Placement::TwoServers) => ("S8", "S8 peer", "S8 limit", "s8"),
            (Crowd::S8, Placement::Shared) => {
                ("S8 shared", "S8 shared peer", "S8 shared limit", "s8shared")
            }
            (Crowd::S9, Placement::TwoServers) => ("S9", "S9 peer", "S9 limit", "s9"),
            (Crowd::S9, Placement::Shared) => {
                ("S9 shared", "S9 shared peer", "S9 shared limit", "s9shared")
            }
        };
        Names {
            ours,
            peer,
            limit,
            tag,
        }
    }

    /// Where its runs put the data: S8 on both placements, S9 apart only.
    fn placements(self) -> &'static [Placement] {
        match self {
            Crowd::S8 => &[Placement::TwoServers, Placement::Shared],
            Crowd::S9 => &[Placement::TwoServers],
        }
    }

    /// Whether a run's time breaks down along one key's order of holds.
    fn one_key(self) -> bool {
        self == Crowd::S8
    }
}

/// Row groups of one placement.
struct Names {
    ours: &'static str,
    peer: &'static str,
    limit: &'static str,
    tag: &'static str,
}

/// The runs of one placement.
#[derive(Default)]
struct Side {
    ours: Vec<Run>,
    peer: Vec<Run>,
    limit: Vec<Run>,
}

/// Our rows (judged) or the peer's (reported).
fn rows(group: &'static str, runs: &[Run], peer: Option<&[Run]>) -> Vec<Row> {
    let ours = peer.is_some();
    let judged = |t: Target| if ours { t } else { Target::Info };
    let mut rate = median_row(group, "acquisitions/s", runs, Run::rate);
    if let Some(peer) = peer {
        rate = rate
            .vs("rslock", median(peer, Run::rate))
            .target(Target::RatioAtLeast(1.0));
    }
    let mut rows = vec![
        rate,
        median_row(group, "wait to acquire p50 (ms)", runs, Run::wait_p50_ms),
        median_row(group, "wait to acquire p99 (ms)", runs, Run::wait_p99_ms),
        median_row(group, "wait to acquire max (ms)", runs, Run::wait_max_ms)
            .target(judged(Target::AtMost(100.0))),
        median_row(group, "busiest / idlest worker", runs, Run::spread),
        median_row(
            group,
            "smallest process share (%)",
            runs,
            Run::min_process_pct,
        ),
        median_row(
            group,
            "largest process share (%)",
            runs,
            Run::max_process_pct,
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

/// The rows of one placement: ours (judged) and rslock against each other
/// and against the limit, and the limit's own.
fn side_rows(crowd: Crowd, names: &Names, side: &Side) -> Vec<Row> {
    let (ours, peer, lim) = (&side.ours[..], &side.peer[..], &side.limit[..]);
    let goal = match crowd {
        Crowd::S8 => Target::RatioAtLeast(limit::GOAL),
        Crowd::S9 => Target::Info,
    };
    let mut all = rows(names.ours, ours, Some(peer));
    all.push(limit::vs_limit(names.ours, ours, lim, goal));
    if crowd.one_key() {
        all.extend(limit::breakdown_rows(names.ours, ours, lim));
    }
    all.extend(rows(names.peer, peer, None));
    all.push(limit::vs_limit(names.peer, peer, lim, Target::Info));
    if crowd.one_key() {
        all.extend(limit::breakdown_rows(names.peer, peer, lim));
    }
    all.extend(limit::limit_rows(names.limit, lim));
    if crowd.one_key() {
        all.extend(limit::breakdown_rows(names.limit, lim, lim));
    }
    all
}

/// The limit chart's bars of one placement (ours as the default mode).
fn side_limits(names: &Names, side: &Side) -> LimitGroup {
    limit::group(
        names.ours,
        vec![
            limit::bar(Library::default_mode(), &side.ours, &side.limit),
            limit::bar(Library::Rslock, &side.peer, &side.limit),
        ],
    )
}

/// Runs S8 or S9.
pub async fn run(ctx: &Ctx, crowd: Crowd) -> Result<Output> {
    let shape = crowd.shape(ctx, Placement::TwoServers);
    let placements = crowd.placements();
    let mut sides: Vec<Side> = placements.iter().map(|_| Side::default()).collect();
    for run in 0..ctx.runs() {
        for (&placement, side) in placements.iter().zip(&mut sides) {
            let (tag, shape) = (crowd.names(placement).tag, crowd.shape(ctx, placement));
            let contend =
                |library| contention::contend_on(ctx, library, shape, placement, tag, run);
            let slice = |i| contention::limit_slice(ctx, (shape, placement), tag, run, (i, 2));
            let mut limit = vec![slice(0).await?];
            side.ours.push(contend(Library::OursDefault).await?);
            limit.push(slice(1).await?);
            side.peer.push(contend(Library::Rslock).await?);
            side.limit.push(Run::pool(limit)?);
        }
    }
    let (mut all, mut limits) = (Vec::new(), Vec::new());
    let mut detail = json!({
        "processes": shape.processes,
        "tasks_per_process": shape.tasks,
        "keys": shape.keys.to_arg(),
        "seconds_per_run": shape.duration.as_secs_f64(),
        "shared_seconds_per_run": crowd.shape(ctx, Placement::Shared).duration.as_secs_f64(),
        "ours": Library::OursDefault.name(),
        "ours_mode": Library::default_mode().name(),
    });
    for (&placement, side) in placements.iter().zip(&sides) {
        let names = crowd.names(placement);
        all.extend(side_rows(crowd, &names, side));
        limits.push(side_limits(&names, side));
        let runs = |runs: &[Run]| runs.iter().map(Run::to_json).collect::<Vec<_>>();
        let key = |what: &str| match placement {
            Placement::TwoServers => what.to_owned(),
            Placement::Shared => format!("shared_{what}"),
        };
        detail[key("ours_runs")] = json!(runs(&side.ours));
        detail[key("rslock_runs")] = json!(runs(&side.peer));
        detail[key("limit_runs")] = json!(runs(&side.limit));
    }
    Ok(Output {
        rows: all,
        detail,
        limits,
        ..Output::default()
    })
}
