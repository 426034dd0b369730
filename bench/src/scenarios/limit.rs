//! The limit of a contention scenario, and every contender against it.
//!
//! A lock can do no better than run its key's bodies back to back. The
//! limit run ([`Library::Serial`]) measures exactly that: the scenario's
//! worker tasks, its body (GET + SET on the data server), its key choice
//! and its data connections (one per process of the shape), for as long as
//! one contender runs, in the same repetition (in slices, one before each
//! contender: [`super::contention::limit_slice`]), with no lock: each key's
//! bodies take turns on an in-process FIFO token, whose handoff is a task
//! wake-up. Its
//! acquisitions/s are the most any lock could give there; each contender's
//! are reported as a fraction of it, and where a contender falls short the
//! breakdown rows say where its time per acquisition went (from the
//! records: [`Breakdown`](super::figures::Breakdown)).

use super::figures::{median, median_row, worst, Figure, Run};
use super::{LimitBar, LimitGroup};
use crate::report::{Row, Target};
use crate::stats;
use crate::worker::Library;

/// The limit's rows: its rate, and the checks that its tokens excluded
/// (the counter and overlaps, worst run).
pub fn limit_rows(group: &'static str, limit: &[Run]) -> Vec<Row> {
    vec![
        median_row(
            group,
            "no lock, bodies one at a time per key: acquisitions/s",
            limit,
            Run::rate,
        ),
        Row::new(
            group,
            "|counter - acquisitions|, worst run",
            worst(limit, Run::counter_error),
        )
        .target(Target::Exactly(0.0)),
        Row::new(
            group,
            "overlaps+timeouts+errors, worst run",
            worst(limit, Run::failures),
        )
        .target(Target::Exactly(0.0)),
    ]
}

/// `runs`' acquisitions/s against the limit's (medians over the
/// repetitions), judged against `target` (a ratio).
pub fn vs_limit(group: &'static str, runs: &[Run], limit: &[Run], target: Target) -> Row {
    median_row(group, "acquisitions/s vs the limit", runs, Run::rate)
        .vs("limit", median(limit, Run::rate))
        .target(target)
}

/// Issue 27's goal for the default mode: at least this fraction of the
/// limit.
pub const GOAL: f64 = 0.85;

/// The goal row: the default mode's runs (`ours[default]`, when the default
/// is one of the modes that ran) against the limit, judged against
/// [`GOAL`].
pub fn goal_row(
    group: &'static str,
    ours: &[Vec<Run>],
    default: Option<usize>,
    limit: &[Run],
) -> Option<Row> {
    let runs = ours.get(default?)?;
    let name = Library::default_mode().name();
    let metric = format!("default ({name}) acquisitions/s vs the limit");
    // The limit's own bodies (the same GET and SET) much slower than ours
    // mean the limit ran in its slow regime (see BENCHMARKS.md): a
    // fraction of it would flatter us, so the row is then not judged.
    let body = |r: &Run| r.breakdown.body;
    let slower = stats::median_of(limit, body) / stats::median_of(runs, body);
    let (metric, target) = if slower > SLOW_REGIME {
        (
            format!(
                "{metric} (not judged: the limit's bodies took {slower:.1}x ours, its slow regime)"
            ),
            Target::Info,
        )
    } else {
        (metric, Target::RatioAtLeast(GOAL))
    };
    Some(
        Row::new(group, metric, median(runs, Run::rate))
            .vs("limit", median(limit, Run::rate))
            .target(target),
    )
}

/// How much slower than a contender's the limit's bodies may be before its
/// run counts as the slow regime (in the fast one they are as fast as or
/// faster than any contender's: nothing else runs beside them).
const SLOW_REGIME: f64 = 1.5;

/// Where `runs`' time per acquisition went (one key: body, handoffs within
/// and across processes, idle), and what it cost the machine (the worker
/// processes' CPU and context switches, the Redis servers' CPU), against
/// the limit's where the limit has the same figure.
pub fn breakdown_rows(group: &'static str, runs: &[Run], limit: &[Run]) -> Vec<Row> {
    let alone = |metric: &str, figure: Figure| Row::new(group, metric, median(runs, figure));
    let against =
        |metric: &str, figure: Figure| alone(metric, figure).vs("limit", median(limit, figure));
    vec![
        against("time per acquisition (us)", Run::per_acquisition_us),
        against("- body GET+SET (us per acq.)", |r| r.breakdown.body),
        // Both terms from the same records: unlike the fraction of the
        // limit, it does not move with the limit run's own regime (its
        // bodies were 5-6x slower in some runs on a quiet machine).
        against(
            "bodies' share of the time (body / time per acq.)",
            bodies_share,
        ),
        alone("- handoffs within a process (us per acq.)", |r| {
            r.breakdown.local
        }),
        alone("- handoffs across processes (us per acq.)", |r| {
            r.breakdown.cross
        }),
        alone("- lock free, nobody waiting (us per acq.)", |r| {
            r.breakdown.idle
        }),
        alone("handoffs across processes (% of acq.)", |r| {
            r.breakdown.cross_share * 100.0
        }),
        alone("handoff across processes, mean (us)", |r| {
            r.breakdown.cross_mean
        }),
        against("worker CPU (us per acq.)", Run::worker_cpu_per_acquisition),
        against(
            "worker context switches per acq.",
            Run::switches_per_acquisition,
        ),
        against(
            "Redis CPU, both servers (us per acq.)",
            Run::redis_cpu_per_acquisition,
        ),
    ]
}

/// The share of a run's time its key spent in a body: the mean body over
/// the time per acquisition (one key; 1.0 is bodies back to back).
fn bodies_share(run: &Run) -> f64 {
    run.breakdown.body / run.per_acquisition_us()
}

/// Each repetition's acquisitions/s over the limit's in the same
/// repetition.
pub fn fractions(runs: &[Run], limit: &[Run]) -> Vec<f64> {
    runs.iter()
        .zip(limit)
        .map(|(r, l)| r.rate() / l.rate())
        .collect()
}

/// A contender's bar on the limit chart: the ratio of the medians (as its
/// row), and the repetitions' own fractions.
pub fn bar(library: Library, runs: &[Run], limit: &[Run]) -> LimitBar {
    LimitBar {
        library,
        fraction: median(runs, Run::rate) / median(limit, Run::rate),
        runs: fractions(runs, limit),
    }
}

/// A scenario's bars.
pub fn group(scenario: &'static str, bars: Vec<LimitBar>) -> LimitGroup {
    LimitGroup { scenario, bars }
}
