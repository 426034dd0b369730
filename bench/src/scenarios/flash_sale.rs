//! S16: the design notes' flash sale, one hot stock split into N segments
//! behind the N permits of one lock (issue 39, item 4).
//!
//! 20,000 units (`--quick`: fewer) are split evenly over N segments, each
//! a counter on the lock server; 32 workers in 2 processes (`--worker
//! flashsale`) buy one unit at a time until every segment is empty, under
//! `with_lock(lock("stock").permits(N))`, each body on segment `permit()`
//! (the worker's module says how a worker whose segment is empty goes on,
//! and why the sale ends). Each repetition runs N = 1, 2, 4 and 8, and the
//! limit: the same body with no lock over 8 segments (it loses updates;
//! its exactness is not judged), starting with a different one each
//! repetition, so drift weighs on each alike. Every runtime is
//! `LockRuntime::builder()` as it comes (today fair + cohorting).
//!
//! Reported: units sold per second, the wait to take a permit (p50, p99,
//! max), misses (bodies that found their segment empty while others still
//! had units), lock commands and busy acquire attempts per sale, CPU per
//! sale, and the exactness checks: exactly the units on sale sold, no
//! count read or left below 0, no two bodies on one segment at once, every
//! body reading what the bodies before it on its segment left, no unit
//! left, every worker seeing the end. The goal: N = 8 sells at
//! least 4x as many units per second as N = 1.

use anyhow::Result;
use serde_json::{json, Value};

use super::measured::{cost_rows, Costs, Measured, COUNTED};
use super::{workers, Ctx, Output};
use crate::config::Shape;
use crate::flash_sale::{shares, SaleAnalysis, SaleRecord};
use crate::report::{finite, Row, Target};
use crate::stats::median_of;
use crate::worker::flash_sale::{empty_key, segment_key, Locking};

/// The goal: N = 8's units sold per second over N = 1's.
pub const GOAL_8_OVER_1: f64 = 4.0;

/// One contender: how bodies keep to their segment, over how many.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    /// Permits, or no lock.
    pub locking: Locking,
    /// Segments (and permits).
    pub segments: u32,
}

impl Variant {
    /// In report order: N = 1, 2, 4, 8, then the limit.
    pub const ALL: [Variant; 5] = [
        Variant::permits(1),
        Variant::permits(2),
        Variant::permits(4),
        Variant::permits(8),
        Variant::LIMIT,
    ];

    /// The limit: the body with no lock, over 8 segments.
    const LIMIT: Variant = Variant {
        locking: Locking::Unlocked,
        segments: 8,
    };

    /// `n` segments behind `n` permits.
    const fn permits(n: u32) -> Variant {
        Variant {
            locking: Locking::Permits,
            segments: n,
        }
    }

    /// Name in key prefixes and the results file (`permits-4`).
    pub fn name(self) -> String {
        format!("{}-{}", self.locking.name(), self.segments)
    }

    /// The scenario name of its rows.
    fn group(self) -> &'static str {
        match (self.locking, self.segments) {
            (Locking::Unlocked, _) => "S16 unlocked",
            (Locking::Permits, 1) => "S16 N=1",
            (Locking::Permits, 2) => "S16 N=2",
            (Locking::Permits, 4) => "S16 N=4",
            (Locking::Permits, _) => "S16 N=8",
        }
    }

    /// Whether it excludes: only then do the exactness checks apply.
    fn locks(self) -> bool {
        self.locking == Locking::Permits
    }
}

/// Figures of one run of one variant.
#[derive(Clone, Debug)]
pub struct SaleRun {
    /// What the records show.
    pub analysis: SaleAnalysis,
    /// Units on sale.
    pub units: u32,
    /// Workers in all processes.
    pub workers: u32,
    /// Units left on the segments at the end (their sum).
    pub left: i64,
    /// Segments whose count is below 0 at the end.
    pub below_zero_at_end: usize,
    /// What the run cost, and its timeouts and errors.
    pub costs: Costs,
}

impl SaleRun {
    /// Units sold per second.
    pub fn rate(&self) -> f64 {
        self.analysis.per_second
    }

    /// |units sold − units on sale|.
    pub fn sold_error(&self) -> f64 {
        (self.analysis.sold as f64 - f64::from(self.units)).abs()
    }

    /// Counts read below 0, and segments below 0 at the end.
    pub fn negative(&self) -> f64 {
        (self.analysis.negative + self.below_zero_at_end) as f64
    }

    /// Reads out of sequence (a lost update), and units left at the end.
    pub fn lost(&self) -> f64 {
        self.analysis.out_of_sequence as f64 + self.left.unsigned_abs() as f64
    }

    /// Workers that stopped before they saw the sale over.
    pub fn unfinished(&self) -> u64 {
        u64::from(self.workers).saturating_sub(self.analysis.finished_workers as u64)
    }

    /// Timeouts, errors, and workers that stopped before the end.
    pub fn failures(&self) -> f64 {
        (self.costs.timeouts + self.costs.errors + self.unfinished()) as f64
    }

    /// As JSON, for the results file.
    pub fn to_json(&self) -> Value {
        let a = &self.analysis;
        let mut fields = self.costs.to_json("sale", &a.waits);
        for (name, value) in [
            ("sold", json!(a.sold)),
            ("bodies", json!(a.bodies)),
            ("misses", json!(a.misses)),
            ("closing_bodies", json!(a.closing)),
            ("per_second", finite(a.per_second)),
            ("negative_reads", json!(a.negative)),
            ("below_zero_at_end", json!(self.below_zero_at_end)),
            ("out_of_sequence", json!(a.out_of_sequence)),
            ("overlaps", json!(a.overlaps)),
            ("occupancy", finite(a.occupancy)),
            ("first_empty", finite(a.first_empty)),
            ("left", json!(self.left)),
            ("unfinished_workers", json!(self.unfinished())),
        ] {
            fields.insert(name.to_owned(), value);
        }
        Value::Object(fields)
    }
}

/// Puts `shares` on the segments under `prefix`, and the segments that
/// start empty in the empty set (which starts otherwise empty).
async fn open_stock(ctx: &Ctx, prefix: &str, shares: &[i64]) -> Result<()> {
    let mut con = ctx.plain.clone();
    let counts: Vec<(String, i64)> = (0..)
        .zip(shares)
        .map(|(s, &n)| (segment_key(prefix, s), n))
        .collect();
    let mut setup = redis::pipe();
    setup.cmd("MSET").arg(&counts).ignore();
    setup.cmd("DEL").arg(empty_key(prefix)).ignore();
    for (s, _) in (0u32..).zip(shares).filter(|(_, &n)| n <= 0) {
        setup.cmd("SADD").arg(empty_key(prefix)).arg(s).ignore();
    }
    let () = setup.query_async(&mut con).await?;
    Ok(())
}

/// Every segment's count under `prefix`, in segment order (0 for none).
async fn counts_left(ctx: &Ctx, prefix: &str, segments: u32) -> Result<Vec<i64>> {
    let mut con = ctx.plain.clone();
    let keys: Vec<String> = (0..segments).map(|s| segment_key(prefix, s)).collect();
    let values: Vec<Option<i64>> = redis::cmd("MGET").arg(&keys).query_async(&mut con).await?;
    Ok(values.into_iter().map(Option::unwrap_or_default).collect())
}

/// One run of `variant` in `shape` selling `units`, its keys named apart by
/// `run`.
pub async fn sell(
    ctx: &Ctx,
    variant: Variant,
    (shape, units): (Shape, u32),
    run: usize,
) -> Result<SaleRun> {
    let prefix = format!("s16:{run}:{}:", variant.name());
    let shares = shares(units, variant.segments);
    open_stock(ctx, &prefix, &shares).await?;
    let processes: Vec<Vec<String>> = (0..shape.processes)
        .map(|p| {
            vec![
                "flashsale".to_owned(),
                variant.locking.name().to_owned(),
                ctx.lock_server.url(),
                prefix.clone(),
                shape.tasks.to_string(),
                (p * shape.tasks).to_string(),
                shape.duration.as_millis().to_string(),
                variant.segments.to_string(),
            ]
        })
        .collect();
    let mut measured = Measured::run(ctx, &processes, shape.duration).await?;
    let (records, counts) = workers::records(&measured.lines, &COUNTED, SaleRecord::parse)?;
    let analysis = SaleAnalysis::of(&records, &shares);
    // Every body GETs its count; a sale SETs it, and the sale of a last
    // unit SADDs the segment; a body that found none SCARDs the empty set.
    let (bodies, sold) = (analysis.bodies as u64, analysis.sold as u64);
    let body_commands = [
        ("get", bodies),
        ("set", sold),
        ("sadd", analysis.last_units as u64),
        ("scard", bodies - sold),
    ];
    let costs = measured.costs(&counts, &body_commands, analysis.sold);
    let left = counts_left(ctx, &prefix, variant.segments).await?;
    Ok(SaleRun {
        units,
        workers: shape.workers(),
        left: left.iter().sum(),
        below_zero_at_end: left.iter().filter(|&&n| n < 0).count(),
        costs,
        analysis,
    })
}

/// The rows of one variant.
fn variant_rows(variant: Variant, these: &[SaleRun], units: u32) -> Vec<Row> {
    let g = variant.group();
    let worst = |f: &dyn Fn(&SaleRun) -> f64| these.iter().map(f).fold(0.0, f64::max);
    let exact = |metric: String, f: &dyn Fn(&SaleRun) -> f64| {
        let row = Row::new(g, metric, worst(f));
        if variant.locks() {
            row.target(Target::Exactly(0.0))
        } else {
            row
        }
    };
    let mut rows = vec![Row::new(g, "units sold/s", median_of(these, SaleRun::rate))];
    rows.extend(cost_rows(g, "sale", these, |r| {
        (&r.analysis.waits, &r.costs)
    }));
    let misses = median_of(these, |r| r.analysis.misses as f64);
    rows.extend([
        Row::new(
            g,
            "misses per run (segment empty, units left elsewhere)",
            misses,
        ),
        Row::new(
            g,
            "first segment sold out (% of the selling time)",
            median_of(these, |r| 100.0 * r.analysis.first_empty),
        ),
        Row::new(
            g,
            "segments in a body (% of the selling time)",
            median_of(these, |r| 100.0 * r.analysis.occupancy),
        ),
        exact(
            format!("|units sold - {units}|, worst run"),
            &SaleRun::sold_error,
        ),
        exact(
            "counts read or left below 0, worst run".to_owned(),
            &SaleRun::negative,
        ),
        exact(
            "bodies on one segment at once, worst run".to_owned(),
            &|r| r.analysis.overlaps as f64,
        ),
        exact(
            "reads out of sequence (lost updates) + units left, worst run".to_owned(),
            &SaleRun::lost,
        ),
        exact(
            "timeouts + errors + workers stopped before the end, worst run".to_owned(),
            &SaleRun::failures,
        ),
    ]);
    rows
}

/// The rows that set the variants side by side: each N against N = 1 (the
/// goal on N = 8), and N = 8 and N = 1 against the limit.
fn summary_rows(rate: impl Fn(Variant) -> f64) -> Vec<Row> {
    let one = rate(Variant::permits(1));
    let mut rows: Vec<Row> = [2, 4, 8]
        .map(|n| {
            let row = Row::new(
                "S16",
                format!("permits = {n}: units sold/s"),
                rate(Variant::permits(n)),
            )
            .vs("permits = 1", one);
            if n == 8 {
                row.target(Target::RatioAtLeast(GOAL_8_OVER_1))
            } else {
                row
            }
        })
        .into();
    let limit = rate(Variant::LIMIT);
    for n in [8, 1] {
        rows.push(
            Row::new(
                "S16",
                format!("permits = {n}: units sold/s"),
                rate(Variant::permits(n)),
            )
            .vs("no lock, 8 segments (loses updates)", limit),
        );
    }
    rows
}

/// Runs S16.
pub async fn run(ctx: &Ctx) -> Result<Output> {
    let (shape, units) = (ctx.scale().s16, ctx.scale().s16_units);
    let n = Variant::ALL.len();
    let mut runs: Vec<Vec<SaleRun>> = vec![Vec::new(); n];
    for run in 0..ctx.runs() {
        // A different variant first in each repetition.
        for i in (0..n).map(|k| (k + run) % n) {
            runs[i].push(sell(ctx, Variant::ALL[i], (shape, units), run).await?);
        }
    }
    let of = |v: Variant| &runs[Variant::ALL.iter().position(|x| *x == v).unwrap_or(0)];
    let mut rows = summary_rows(|v| median_of(of(v), SaleRun::rate));
    let mut detail = serde_json::Map::new();
    detail.insert(
        "shape".to_owned(),
        json!({
            "processes": shape.processes, "tasks": shape.tasks,
            "bound_seconds": shape.duration.as_secs_f64(), "units": units,
        }),
    );
    for variant in Variant::ALL {
        let these = of(variant);
        rows.extend(variant_rows(variant, these, units));
        detail.insert(
            variant.name(),
            json!({ "runs": these.iter().map(SaleRun::to_json).collect::<Vec<_>>() }),
        );
    }
    Ok(Output {
        rows,
        detail: Value::Object(detail),
        ..Output::default()
    })
}
