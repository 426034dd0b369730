//! S3: contended handoff, our four modes against rslock.
//!
//! Runs the contention runs (`contention.rs`: eight workers in two processes,
//! one key, a GET + SET body on the data server) of each of our modes —
//! plain and fair, each with lock cohorting off and on — and of rslock, one
//! after the other in every repetition, with the idle PING measured before;
//! then reads handoff latency, waits, worker and process shares, barging,
//! exclusion and the counter from the workers' records
//! ([`crate::handoff`]). S4's rows come from the same runs. The modes
//! without cohorting keep the targets they had; the cohort modes are judged
//! against issue 14's, and one row says how many of those the mode that
//! `LockRuntime::builder()` gives by default meets.

use anyhow::Result;
use serde_json::{json, Map, Value};

use super::baseline::{plain_ping_p50, runtime_ping_p50};
use super::contention::{self, median, worst, Run};
use super::{commands, Ctx, Curves, Output};
use crate::handoff::Analysis;
use crate::report::{Row, Target};
use crate::stats::Samples;
use crate::worker::Library;

/// Which targets a mode's rows are judged against.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Targets {
    /// The targets the modes without cohorting had before issue 14.
    Before,
    /// Issue 14's targets for the cohort modes.
    Cohort,
}

/// One of our modes as S3 and S4 show it.
struct Mode {
    library: Library,
    s3: &'static str,
    s4: &'static str,
    targets: Targets,
}

/// Our modes, in the order they run and are reported.
const MODES: [Mode; 4] = [
    Mode {
        library: Library::Ours,
        s3: "S3",
        s4: "S4",
        targets: Targets::Before,
    },
    Mode {
        library: Library::OursFair,
        s3: "S3 fair",
        s4: "S4 fair",
        targets: Targets::Before,
    },
    Mode {
        library: Library::OursCohort,
        s3: "S3 cohort",
        s4: "S4 cohort",
        targets: Targets::Cohort,
    },
    Mode {
        library: Library::OursFairCohort,
        s3: "S3 fair+cohort",
        s4: "S4 fair+cohort",
        targets: Targets::Cohort,
    },
];

/// The idle PING p50s S3's handoffs are compared with, µs.
struct Pings {
    runtime: f64,
    plain: f64,
}

/// The S3 rows of one of our modes.
fn s3_rows(group: &'static str, runs: &[Run], peer: &[Run], ping: &Pings, t: Targets) -> Vec<Row> {
    let judged = |before: Target, cohort: Target| match t {
        Targets::Before => before,
        Targets::Cohort => cohort,
    };
    let mut rows = vec![
        Row::new(group, "handoff p50 (us)", median(runs, Run::handoff_p50))
            .vs("1 PING, runtime conn", ping.runtime)
            .target(judged(Target::RatioAtMost(3.0), Target::Info)),
        Row::new(group, "handoff p99 (us)", median(runs, Run::handoff_p99))
            .vs("1 PING, runtime conn", ping.runtime),
        Row::new(
            group,
            "handoff p50 vs PING p50 under load (us)",
            median(runs, Run::handoff_p50),
        )
        .vs("PING during run", median(runs, |r| r.loaded_ping)),
        Row::new(group, "acquisitions/s", median(runs, Run::rate))
            .vs("rslock", median(peer, Run::rate))
            .target(judged(Target::Info, Target::RatioAtLeast(2.0))),
        Row::new(
            group,
            "wait to acquire p99 (ms)",
            median(runs, Run::wait_p99_ms),
        )
        .target(Target::AtMost(5.0)),
        Row::new(
            group,
            "wait to acquire max (ms)",
            median(runs, Run::wait_max_ms),
        )
        .target(Target::AtMost(50.0)),
        Row::new(group, "busiest / idlest worker", median(runs, Run::spread))
            .target(judged(Target::AtMost(2.0), Target::AtMost(1.5))),
        Row::new(
            group,
            "smallest process share (%)",
            median(runs, Run::min_process_pct),
        )
        .target(judged(Target::Info, Target::AtLeast(40.0))),
        Row::new(
            group,
            "acquisitions handed to a waiter (%)",
            median(runs, Run::handed_pct),
        ),
        Row::new(
            group,
            "acquisitions barging past a waiter (%)",
            median(runs, Run::barged_pct),
        ),
    ];
    rows.extend(tail_rows(
        group,
        runs,
        t == Targets::Cohort,
        Target::Exactly(0.0),
    ));
    rows
}

/// The last rows of a contention run: the share passed locally (lock
/// cohorting, when `passed`) and the exactness checks, worst run, judged
/// against `exact` (`Target::Info` for a peer, which is only reported).
pub(crate) fn tail_rows(
    group: &'static str,
    runs: &[Run],
    passed: bool,
    exact: Target,
) -> Vec<Row> {
    let mut rows = Vec::new();
    if passed {
        rows.push(Row::new(
            group,
            "acquisitions passed locally (%)",
            median(runs, Run::passed_pct),
        ));
    }
    rows.extend([
        Row::new(
            group,
            "|counter - acquisitions|, worst run",
            worst(runs, Run::counter_error),
        )
        .target(exact),
        Row::new(
            group,
            "overlaps+timeouts+errors, worst run",
            worst(runs, Run::failures),
        )
        .target(exact),
    ]);
    rows
}

/// The S4 rows of one of our modes.
fn s4_rows(mode: &Mode, runs: &[Run], t: Targets) -> Vec<Row> {
    let target = match t {
        Targets::Before => Target::AtMost(4.0),
        Targets::Cohort => Target::AtMost(1.5),
    };
    let failed = if mode.library == Library::Ours || mode.library == Library::OursCohort {
        "of which failed acquire attempts"
    } else {
        "of which failed (queueing) attempts"
    };
    commands::rows(mode.s4, runs, target, failed)
}

/// How many of issue 14's targets (S3 and S4) the mode that
/// `LockRuntime::builder()` gives by default meets, as one row.
fn default_row(runs: &[Vec<Run>], peer: &[Run], ping: &Pings) -> Option<Row> {
    let default = Library::default_mode();
    let i = MODES.iter().position(|m| m.library == default)?;
    let mode = &MODES[i];
    let judged: Vec<Row> = s3_rows(mode.s3, &runs[i], peer, ping, Targets::Cohort)
        .into_iter()
        .chain(s4_rows(mode, &runs[i], Targets::Cohort))
        .filter(|r| r.met().is_some() && r.target != Target::Exactly(0.0))
        .collect();
    let met = judged.iter().filter(|r| r.met() == Some(true)).count();
    Some(
        Row::new(
            "S3 default",
            format!("issue-14 targets met by the default ({})", default.name()),
            met as f64,
        )
        .vs("targets", judged.len() as f64)
        .target(Target::RatioAtLeast(1.0)),
    )
}

/// Runs S3 and S4 (the same runs), keeping the rows asked for.
pub async fn run(ctx: &Ctx, show_s3: bool, show_s4: bool) -> Result<Output> {
    let shape = ctx.scale().s3;
    let mut ours: Vec<Vec<Run>> = MODES.iter().map(|_| Vec::new()).collect();
    let mut peer = Vec::new();
    // The idle round trip is measured right before every run (it moves with
    // the machine's state), and its median taken like every other figure.
    let (mut pings, mut plain_pings) = (Vec::new(), Vec::new());
    for run in 0..ctx.runs() {
        pings.push(runtime_ping_p50(&ctx.runtime, ctx.scale().pings).await?);
        for (mode, runs) in MODES.iter().zip(&mut ours) {
            runs.push(contention::contend(ctx, mode.library, shape, "s3", run).await?);
        }
        plain_pings.push(plain_ping_p50(&ctx.plain, ctx.scale().pings).await?);
        peer.push(contention::contend(ctx, Library::Rslock, shape, "s3", run).await?);
    }
    let ping = Pings {
        runtime: crate::stats::median(pings.clone()),
        plain: crate::stats::median(plain_pings.clone()),
    };
    let plain = &ours[0];

    let mut rows = Vec::new();
    if show_s3 {
        for (mode, runs) in MODES.iter().zip(&ours) {
            rows.extend(s3_rows(mode.s3, runs, &peer, &ping, mode.targets));
        }
        rows.extend(default_row(&ours, &peer, &ping));
        rows.extend([
            Row::new(
                "S3 peer",
                "rslock handoff p50 (us)",
                median(&peer, Run::handoff_p50),
            )
            .vs("1 PING, plain conn", ping.plain),
            Row::new(
                "S3 peer",
                "rslock wait p99 (ms)",
                median(&peer, Run::wait_p99_ms),
            ),
            Row::new(
                "S3 peer",
                "rslock wait max (ms)",
                median(&peer, Run::wait_max_ms),
            ),
            Row::new(
                "S3 peer",
                "rslock busiest / idlest worker",
                median(&peer, Run::spread),
            ),
            Row::new(
                "S3 peer",
                "rslock smallest process share (%)",
                median(&peer, Run::min_process_pct),
            ),
            Row::new("S3 peer", "rslock acquisitions/s", median(&peer, Run::rate)),
            Row::new(
                "S3 peer",
                "rslock handed to a waiter (%)",
                median(&peer, Run::handed_pct),
            ),
            Row::new(
                "S3 peer",
                "rslock barging past a waiter (%)",
                median(&peer, Run::barged_pct),
            ),
            Row::new(
                "S3 peer",
                "rslock |counter - acq|, worst run",
                worst(&peer, Run::counter_error),
            ),
            Row::new(
                "S3 vs peer",
                "handoff p50 ours / rslock",
                median(plain, Run::handoff_p50),
            )
            .vs("rslock", median(&peer, Run::handoff_p50)),
            Row::new(
                "S3 vs peer",
                "wait p99 ours / rslock",
                median(plain, Run::wait_p99_ms),
            )
            .vs("rslock", median(&peer, Run::wait_p99_ms)),
        ]);
    }
    if show_s4 {
        for (mode, runs) in MODES.iter().zip(&ours) {
            rows.extend(s4_rows(mode, runs, mode.targets));
        }
        rows.extend(commands::peer_rows(plain, &peer));
    }
    let pool = |runs: &[Run], pick: fn(&Analysis) -> &Samples| {
        Samples::new(
            runs.iter()
                .flat_map(|r| pick(&r.analysis).sorted().iter().copied())
                .collect(),
        )
    };
    let curves = |pick: fn(&Analysis) -> &Samples| -> Curves {
        MODES
            .iter()
            .zip(&ours)
            .map(|(mode, runs)| (mode.library, pool(runs, pick)))
            .chain([(Library::Rslock, pool(&peer, pick))])
            .collect()
    };
    let mut detail = Map::new();
    detail.extend([
        ("processes".to_owned(), json!(shape.processes)),
        ("tasks_per_process".to_owned(), json!(shape.tasks)),
        (
            "seconds_per_run".to_owned(),
            json!(shape.duration.as_secs_f64()),
        ),
        (
            "default_mode".to_owned(),
            json!(Library::default_mode().name()),
        ),
        ("ping_p50_us_runtime_conn".to_owned(), json!(pings)),
        ("ping_p50_us_plain_conn".to_owned(), json!(plain_pings)),
    ]);
    let libraries = MODES.iter().map(|m| m.library).chain([Library::Rslock]);
    for (library, runs) in libraries.zip(ours.iter().chain([&peer])) {
        let runs = runs.iter().map(Run::to_json).collect::<Vec<_>>();
        detail.insert(library.name().replace('-', "_"), Value::from(runs));
    }
    let detail = Value::Object(detail);
    Ok(Output {
        rows,
        detail,
        handoffs: Some(curves(|a| &a.handoffs)),
        waits: Some(curves(|a| &a.waits)),
        ping_p50: Some(ping.runtime),
    })
}
