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
//!
//! Every repetition also runs the limit (the body alone, no lock:
//! [`super::limit`]) in slices, one before each contender, and then all of
//! it once more
//! with the data on the lock server ("S3 shared": one Redis for both, as
//! most deployments run). Each contender is reported as a fraction of the
//! limit of its placement, with the breakdown of its time per acquisition;
//! the default mode's fraction is judged against issue 27's goal.

use anyhow::Result;
use serde_json::{json, Map, Value};

use super::baseline::{plain_ping_p50, runtime_ping_p50};
use super::contention::{self, Placement};
use super::figures::{median, median_row, worst, Figure, Run};
use super::{commands, limit, Ctx, Curves, LimitGroup, Output};
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
    /// Its group in the shared-server rows.
    shared: &'static str,
    targets: Targets,
}

/// Our modes, in the order they run and are reported.
const MODES: [Mode; 4] = [
    Mode {
        library: Library::Ours,
        s3: "S3",
        s4: "S4",
        shared: "S3 shared",
        targets: Targets::Before,
    },
    Mode {
        library: Library::OursFair,
        s3: "S3 fair",
        s4: "S4 fair",
        shared: "S3 shared fair",
        targets: Targets::Before,
    },
    Mode {
        library: Library::OursCohort,
        s3: "S3 cohort",
        s4: "S4 cohort",
        shared: "S3 shared cohort",
        targets: Targets::Cohort,
    },
    Mode {
        library: Library::OursFairCohort,
        s3: "S3 fair+cohort",
        s4: "S4 fair+cohort",
        shared: "S3 shared fair+cohort",
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
        median_row(group, "handoff p50 (us)", runs, Run::handoff_p50)
            .vs("1 PING, runtime conn", ping.runtime)
            .target(judged(Target::RatioAtMost(3.0), Target::Info)),
        median_row(group, "handoff p99 (us)", runs, Run::handoff_p99)
            .vs("1 PING, runtime conn", ping.runtime),
        median_row(
            group,
            "handoff p50 vs PING p50 under load (us)",
            runs,
            Run::handoff_p50,
        )
        .vs("PING during run", median(runs, |r| r.loaded_ping)),
        median_row(group, "acquisitions/s", runs, Run::rate)
            .vs("rslock", median(peer, Run::rate))
            .target(judged(Target::Info, Target::RatioAtLeast(2.0))),
        median_row(group, "wait to acquire p99 (ms)", runs, Run::wait_p99_ms)
            .target(Target::AtMost(5.0)),
        median_row(group, "wait to acquire max (ms)", runs, Run::wait_max_ms)
            .target(Target::AtMost(50.0)),
        median_row(group, "busiest / idlest worker", runs, Run::spread)
            .target(judged(Target::AtMost(2.0), Target::AtMost(1.5))),
        median_row(
            group,
            "smallest process share (%)",
            runs,
            Run::min_process_pct,
        )
        .target(judged(Target::Info, Target::AtLeast(40.0))),
        median_row(
            group,
            "acquisitions handed to a waiter (%)",
            runs,
            Run::handed_pct,
        ),
        median_row(
            group,
            "acquisitions barging past a waiter (%)",
            runs,
            Run::barged_pct,
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
        rows.push(median_row(
            group,
            "acquisitions passed locally (%)",
            runs,
            Run::passed_pct,
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

/// The runs of one placement: each of our modes (in [`MODES`] order),
/// rslock, and the limit.
#[derive(Default)]
struct Side {
    ours: Vec<Vec<Run>>,
    peer: Vec<Run>,
    limit: Vec<Run>,
}

impl Side {
    fn new() -> Side {
        Side {
            ours: MODES.iter().map(|_| Vec::new()).collect(),
            ..Side::default()
        }
    }

    /// Our modes, then rslock, each after a slice of the limit, for
    /// repetition `run` (`between` runs before rslock: the two-server side
    /// measures the plain connection's idle PING there).
    async fn repeat(
        &mut self,
        ctx: &Ctx,
        placement: Placement,
        run: usize,
        between: impl std::future::Future<Output = Result<()>>,
    ) -> Result<()> {
        let (shape, tag) = match placement {
            Placement::TwoServers => (ctx.scale().s3, "s3"),
            Placement::Shared => (ctx.scale().s3_shared, "s3shared"),
        };
        let contend = |library| contention::contend_on(ctx, library, shape, placement, tag, run);
        let slices = MODES.len() as u32 + 1;
        let slice = |i| contention::limit_slice(ctx, (shape, placement), tag, run, (i, slices));
        let mut limit = Vec::new();
        for (i, (mode, runs)) in MODES.iter().zip(&mut self.ours).enumerate() {
            limit.push(slice(i).await?);
            runs.push(contend(mode.library).await?);
        }
        between.await?;
        limit.push(slice(MODES.len()).await?);
        self.peer.push(contend(Library::Rslock).await?);
        self.limit.push(Run::pool(limit)?);
        Ok(())
    }

    /// Every contender's bar on the limit chart.
    fn limits(&self, scenario: &'static str) -> LimitGroup {
        let mut bars: Vec<_> = MODES
            .iter()
            .zip(&self.ours)
            .map(|(mode, runs)| limit::bar(mode.library, runs, &self.limit))
            .collect();
        bars.push(limit::bar(Library::Rslock, &self.peer, &self.limit));
        limit::group(scenario, bars)
    }

    /// The results file's runs of each contender.
    fn to_json(&self) -> Map<String, Value> {
        let mut detail = Map::new();
        let libraries = MODES
            .iter()
            .map(|m| m.library)
            .chain([Library::Rslock, Library::Serial]);
        let runs = self.ours.iter().chain([&self.peer, &self.limit]);
        for (library, runs) in libraries.zip(runs) {
            let runs = runs.iter().map(Run::to_json).collect::<Vec<_>>();
            detail.insert(library.name().replace('-', "_"), Value::from(runs));
        }
        detail
    }
}

/// The index in [`MODES`] of the mode `LockRuntime::builder()` gives.
fn default_index() -> Option<usize> {
    let default = Library::default_mode();
    MODES.iter().position(|m| m.library == default)
}

/// The rows of S3 against its limit (two servers): each mode's fraction
/// and breakdown, the default's goal, the limit's own rows, rslock's.
fn limit_rows(side: &Side) -> Vec<Row> {
    let mut rows = Vec::new();
    for (mode, runs) in MODES.iter().zip(&side.ours) {
        rows.push(limit::vs_limit(mode.s3, runs, &side.limit, Target::Info));
        rows.extend(limit::breakdown_rows(mode.s3, runs, &side.limit));
    }
    rows.extend(limit::goal_row(
        "S3 default",
        &side.ours,
        default_index(),
        &side.limit,
    ));
    rows.extend(limit::limit_rows("S3 limit", &side.limit));
    rows.extend(limit::breakdown_rows("S3 limit", &side.limit, &side.limit));
    rows.push(limit::vs_limit(
        "S3 peer",
        &side.peer,
        &side.limit,
        Target::Info,
    ));
    rows.extend(limit::breakdown_rows("S3 peer", &side.peer, &side.limit));
    rows
}

/// The shared-server rows: per mode the rate against rslock's and the
/// limit's, the waits (S3's targets), shares, exactness and breakdown; the
/// default's two goals (issue 27: ≥ 1.3x rslock, ≥ 0.85x the limit);
/// the limit's rows and rslock's.
fn shared_rows(side: &Side) -> Vec<Row> {
    let (peer, lim) = (&side.peer, &side.limit);
    let mut rows = Vec::new();
    for (mode, runs) in MODES.iter().zip(&side.ours) {
        let g = mode.shared;
        rows.extend([
            median_row(g, "acquisitions/s", runs, Run::rate).vs("rslock", median(peer, Run::rate)),
            limit::vs_limit(g, runs, lim, Target::Info),
            median_row(g, "wait to acquire p99 (ms)", runs, Run::wait_p99_ms)
                .target(Target::AtMost(5.0)),
            median_row(g, "wait to acquire max (ms)", runs, Run::wait_max_ms)
                .target(Target::AtMost(50.0)),
            median_row(g, "busiest / idlest worker", runs, Run::spread),
            median_row(g, "smallest process share (%)", runs, Run::min_process_pct),
        ]);
        rows.extend(tail_rows(
            g,
            runs,
            mode.targets == Targets::Cohort,
            Target::Exactly(0.0),
        ));
        rows.extend(limit::breakdown_rows(g, runs, lim));
    }
    if let Some(i) = default_index() {
        let name = MODES[i].library.name();
        rows.push(
            Row::new(
                "S3 shared default",
                format!("default ({name}) acquisitions/s vs rslock"),
                median(&side.ours[i], Run::rate),
            )
            .vs("rslock", median(peer, Run::rate))
            .target(Target::RatioAtLeast(1.3)),
        );
    }
    rows.extend(limit::goal_row(
        "S3 shared default",
        &side.ours,
        default_index(),
        lim,
    ));
    rows.extend(limit::limit_rows("S3 shared limit", lim));
    rows.extend(limit::breakdown_rows("S3 shared limit", lim, lim));
    let g = "S3 shared peer";
    rows.extend([
        median_row(g, "rslock acquisitions/s", peer, Run::rate),
        limit::vs_limit(g, peer, lim, Target::Info),
        median_row(g, "rslock wait p99 (ms)", peer, Run::wait_p99_ms),
        median_row(g, "rslock wait max (ms)", peer, Run::wait_max_ms),
        Row::new(
            g,
            "rslock |counter - acq|, worst run",
            worst(peer, Run::counter_error),
        ),
    ]);
    rows.extend(limit::breakdown_rows(g, peer, lim));
    rows
}

/// S3's rows of the peer (rslock): its figures over its runs, then ours
/// (plain mode, `plain`) against it.
fn peer_rows(peer: &[Run], plain: &[Run], ping: &Pings) -> Vec<Row> {
    let medians: [(&str, Figure); 7] = [
        ("rslock wait p99 (ms)", Run::wait_p99_ms),
        ("rslock wait max (ms)", Run::wait_max_ms),
        ("rslock busiest / idlest worker", Run::spread),
        ("rslock smallest process share (%)", Run::min_process_pct),
        ("rslock acquisitions/s", Run::rate),
        ("rslock handed to a waiter (%)", Run::handed_pct),
        ("rslock barging past a waiter (%)", Run::barged_pct),
    ];
    let against: [(&str, Figure); 2] = [
        ("handoff p50 ours / rslock", Run::handoff_p50),
        ("wait p99 ours / rslock", Run::wait_p99_ms),
    ];
    let handoff = median(peer, Run::handoff_p50);
    let mut rows = vec![Row::new("S3 peer", "rslock handoff p50 (us)", handoff)
        .vs("1 PING, plain conn", ping.plain)];
    for (metric, figure) in medians {
        rows.push(Row::new("S3 peer", metric, median(peer, figure)));
    }
    let counter = worst(peer, Run::counter_error);
    rows.push(Row::new(
        "S3 peer",
        "rslock |counter - acq|, worst run",
        counter,
    ));
    for (metric, figure) in against {
        rows.push(
            Row::new("S3 vs peer", metric, median(plain, figure))
                .vs("rslock", median(peer, figure)),
        );
    }
    rows
}

/// Runs S3 and S4 (the same runs), keeping the rows asked for.
pub async fn run(ctx: &Ctx, show_s3: bool, show_s4: bool) -> Result<Output> {
    let shape = ctx.scale().s3;
    let (mut two, mut shared) = (Side::new(), Side::new());
    // The idle round trip is measured right before every run (it moves with
    // the machine's state), and its median taken like every other figure.
    let (mut pings, mut plain_pings) = (Vec::new(), Vec::new());
    for run in 0..ctx.runs() {
        pings.push(runtime_ping_p50(&ctx.runtime, ctx.scale().pings).await?);
        let plain_ping = async {
            plain_pings.push(plain_ping_p50(&ctx.plain, ctx.scale().pings).await?);
            anyhow::Ok(())
        };
        two.repeat(ctx, Placement::TwoServers, run, plain_ping)
            .await?;
        shared
            .repeat(ctx, Placement::Shared, run, async { Ok(()) })
            .await?;
    }
    let ping = Pings {
        runtime: crate::stats::median(pings.clone()),
        plain: crate::stats::median(plain_pings.clone()),
    };
    let (ours, peer) = (&two.ours, &two.peer);
    let plain = &ours[0];

    let mut rows = Vec::new();
    if show_s3 {
        for (mode, runs) in MODES.iter().zip(ours) {
            rows.extend(s3_rows(mode.s3, runs, peer, &ping, mode.targets));
        }
        rows.extend(default_row(ours, peer, &ping));
        rows.extend(limit_rows(&two));
        rows.extend(shared_rows(&shared));
        rows.extend(peer_rows(peer, plain, &ping));
    }
    if show_s4 {
        for (mode, runs) in MODES.iter().zip(ours) {
            rows.extend(s4_rows(mode, runs, mode.targets));
        }
        rows.extend(commands::peer_rows(plain, peer));
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
            .zip(ours)
            .map(|(mode, runs)| (mode.library, pool(runs, pick)))
            .chain([(Library::Rslock, pool(peer, pick))])
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
            "shared_seconds_per_run".to_owned(),
            json!(ctx.scale().s3_shared.duration.as_secs_f64()),
        ),
        (
            "default_mode".to_owned(),
            json!(Library::default_mode().name()),
        ),
        ("ping_p50_us_runtime_conn".to_owned(), json!(pings)),
        ("ping_p50_us_plain_conn".to_owned(), json!(plain_pings)),
    ]);
    detail.extend(two.to_json());
    detail.insert("shared".to_owned(), Value::Object(shared.to_json()));
    let detail = Value::Object(detail);
    Ok(Output {
        rows,
        detail,
        handoffs: Some(curves(|a| &a.handoffs)),
        waits: Some(curves(|a| &a.waits)),
        ping_p50: Some(ping.runtime),
        limits: vec![two.limits("S3"), shared.limits("S3 shared")],
        svgs: Vec::new(),
    })
}
