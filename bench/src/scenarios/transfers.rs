//! S15: transfers between accounts, the multi-key lock against the ways a
//! user without it locks two keys (issue 38, item 4).
//!
//! 100 accounts start at 1,000 each on the lock server; 16 workers in 2
//! processes (`--worker transfers`) each move 1 between two distinct
//! accounts drawn from the task's seeded generator, over and over, for the
//! shape's time. The body reads both balances and writes both back (GET,
//! GET, SET, SET beside the locks: one Redis for the locks and the data).
//! Each repetition runs the three variants one after the other, starting
//! with a different one each repetition, so drift weighs on each alike:
//!
//! - `multi`: `with_locks(lock_many([from, to]))`;
//! - `global`: one lock `bank` around every transfer;
//! - `nested-sorted`: two nested `with_lock` calls, keys sorted by hand;
//! - `unlocked`: the body alone. It loses updates (its exactness is not
//!   judged): its rate is the ceiling the machine allows the body, against
//!   which the locked variants are also reported.
//!
//! Every runtime is `LockRuntime::builder()` as it comes (today fair +
//! cohorting). Reported: transfers/s, the wait to take the lock(s) (p50,
//! p99, max), lock commands per transfer, CPU per transfer, and the
//! exactness checks: the sum of the balances at the end (unchanged: no
//! update lost), each balance against what the records say, and no two
//! bodies on one account at once. The goals: `multi` at least 5x
//! `global`'s transfers/s, and at least as many as `nested-sorted`.

use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::measured::{cost_rows, Costs, Measured, COUNTED};
use super::{workers, Ctx, Output};
use crate::config::Shape;
use crate::report::{Row, Target};
use crate::stats::median_of;
use crate::transfers::{TransferAnalysis, TransferRecord};
use crate::worker::transfers::{balance_key, Variant};

/// Accounts.
pub const ACCOUNTS: u32 = 100;
/// Each account's balance at the start.
pub const START: i64 = 1000;
/// The seed of every run's pairs (each task mixes in its number).
const SEED: u64 = 15;
/// The goal: `multi`'s transfers/s over `global`'s.
pub const GOAL_OVER_GLOBAL: f64 = 5.0;
/// The goal: `multi`'s transfers/s over `nested-sorted`'s.
pub const GOAL_OVER_NESTED: f64 = 1.0;

/// Figures of one run of one variant.
#[derive(Clone, Debug)]
pub struct TransferRun {
    /// What the records show.
    pub analysis: TransferAnalysis,
    /// The sum of all balances at the end (`ACCOUNTS * START` if no
    /// update was lost).
    pub sum: i64,
    /// Accounts whose balance differs from what the records say.
    pub off_accounts: usize,
    /// What the run cost, and its timeouts and errors.
    pub costs: Costs,
}

impl TransferRun {
    /// Transfers per second.
    pub fn rate(&self) -> f64 {
        self.analysis.per_second
    }

    /// |sum of the balances − the sum at the start|.
    pub fn sum_error(&self) -> f64 {
        self.sum.abs_diff(i64::from(ACCOUNTS) * START) as f64
    }

    /// Balances off the records, overlapping bodies, timeouts and errors.
    pub fn failures(&self) -> f64 {
        let wrong = self.off_accounts + self.analysis.overlaps;
        (wrong as u64 + self.costs.timeouts + self.costs.errors) as f64
    }

    /// As JSON, for the results file.
    pub fn to_json(&self) -> Value {
        let a = &self.analysis;
        let mut fields = self.costs.to_json("transfer", &a.waits);
        for (name, value) in [
            ("transfers", json!(a.total)),
            ("per_second", crate::report::finite(a.per_second)),
            ("sum_of_balances", json!(self.sum)),
            ("off_accounts", json!(self.off_accounts)),
            ("overlaps", json!(a.overlaps)),
        ] {
            fields.insert(name.to_owned(), value);
        }
        Value::Object(fields)
    }
}

/// Sets every account of the run under `prefix` to [`START`].
async fn open_accounts(ctx: &Ctx, prefix: &str) -> Result<()> {
    let mut con = ctx.plain.clone();
    let pairs: Vec<(String, i64)> = (0..ACCOUNTS)
        .map(|n| (balance_key(prefix, n), START))
        .collect();
    let () = redis::cmd("MSET").arg(&pairs).query_async(&mut con).await?;
    Ok(())
}

/// Every account's balance under `prefix`, in account order.
async fn balances(ctx: &Ctx, prefix: &str) -> Result<Vec<i64>> {
    let mut con = ctx.plain.clone();
    let keys: Vec<String> = (0..ACCOUNTS).map(|n| balance_key(prefix, n)).collect();
    let values: Vec<Option<i64>> = redis::cmd("MGET").arg(&keys).query_async(&mut con).await?;
    values
        .into_iter()
        .enumerate()
        .map(|(n, v)| v.with_context(|| format!("account {n} has no balance")))
        .collect()
}

/// One run of `variant` in `shape`, its keys named apart by `run`.
pub async fn contend(ctx: &Ctx, variant: Variant, shape: Shape, run: usize) -> Result<TransferRun> {
    let prefix = format!("s15:{run}:{}:", variant.name());
    open_accounts(ctx, &prefix).await?;
    let processes: Vec<Vec<String>> = (0..shape.processes)
        .map(|p| {
            vec![
                "transfers".to_owned(),
                variant.name().to_owned(),
                ctx.lock_server.url(),
                prefix.clone(),
                shape.tasks.to_string(),
                (p * shape.tasks).to_string(),
                shape.duration.as_millis().to_string(),
                SEED.to_string(),
                ACCOUNTS.to_string(),
            ]
        })
        .collect();
    let mut measured = Measured::run(ctx, &processes, shape.duration).await?;

    let (records, counts) = workers::records(&measured.lines, &COUNTED, TransferRecord::parse)?;
    let analysis = TransferAnalysis::of(&records, START);
    // The bodies' two GETs and two SETs per recorded transfer, taken out
    // so that the rest is lock traffic (as S3 shared does).
    let bodies = 2 * analysis.total as u64;
    let body_commands = [("get", bodies), ("set", bodies)];
    let costs = measured.costs(&counts, &body_commands, analysis.total);
    let balances = balances(ctx, &prefix).await?;
    let off_accounts = (0..ACCOUNTS)
        .filter(|n| {
            let expected = analysis.expected.get(n).copied().unwrap_or(START);
            balances[*n as usize] != expected
        })
        .count();
    Ok(TransferRun {
        sum: balances.iter().sum(),
        off_accounts,
        costs,
        analysis,
    })
}

/// The scenario name of `variant`'s rows.
fn group(variant: Variant) -> &'static str {
    match variant {
        Variant::Multi => "S15 multi",
        Variant::Global => "S15 global",
        Variant::NestedSorted => "S15 nested-sorted",
        Variant::Unlocked => "S15 unlocked",
    }
}

/// The rows of one variant.
fn variant_rows(variant: Variant, these: &[TransferRun]) -> Vec<Row> {
    let g = group(variant);
    let worst = |f: fn(&TransferRun) -> f64| these.iter().map(f).fold(0.0, f64::max);
    let exact = |row: Row| {
        if variant.locks() {
            row.target(Target::Exactly(0.0))
        } else {
            row
        }
    };
    let rate = median_of(these, TransferRun::rate);
    let mut rows = vec![Row::new(g, "transfers/s, 100 accounts", rate)];
    rows.extend(cost_rows(g, "transfer", these, |r| {
        (&r.analysis.waits, &r.costs)
    }));
    rows.extend([
        exact(Row::new(
            g,
            "|sum of balances - 100,000|, worst run",
            worst(TransferRun::sum_error),
        )),
        exact(Row::new(
            g,
            "balances off the records + overlaps + timeouts + errors, worst run",
            worst(TransferRun::failures),
        )),
    ]);
    rows
}

/// Runs S15.
pub async fn run(ctx: &Ctx) -> Result<Output> {
    let shape = ctx.scale().s15;
    let n = Variant::ALL.len();
    let mut runs: Vec<Vec<TransferRun>> = vec![Vec::new(); n];
    for run in 0..ctx.runs() {
        // A different variant first in each repetition.
        for i in (0..n).map(|k| (k + run) % n) {
            runs[i].push(contend(ctx, Variant::ALL[i], shape, run).await?);
        }
    }
    let of = |v: Variant| &runs[Variant::ALL.iter().position(|x| *x == v).unwrap_or(0)];
    let rate = |v: Variant| median_of(of(v), TransferRun::rate);
    let multi = rate(Variant::Multi);
    let mut rows = vec![
        Row::new("S15", "multi-key lock: transfers/s", multi)
            .vs("one global lock", rate(Variant::Global))
            .target(Target::RatioAtLeast(GOAL_OVER_GLOBAL)),
        Row::new("S15", "multi-key lock: transfers/s", multi)
            .vs("two nested locks, sorted", rate(Variant::NestedSorted))
            .target(Target::RatioAtLeast(GOAL_OVER_NESTED)),
        // The ceiling: the body without any lock on this machine.
        Row::new("S15", "multi-key lock: transfers/s", multi)
            .vs("no lock (loses updates)", rate(Variant::Unlocked)),
        Row::new("S15", "one global lock: transfers/s", rate(Variant::Global))
            .vs("no lock (loses updates)", rate(Variant::Unlocked)),
    ];
    let mut detail = serde_json::Map::new();
    detail.insert(
        "shape".to_owned(),
        json!({
            "processes": shape.processes, "tasks": shape.tasks,
            "seconds": shape.duration.as_secs_f64(),
            "accounts": ACCOUNTS, "start_balance": START, "seed": SEED,
        }),
    );
    for variant in Variant::ALL {
        let these = of(variant);
        rows.extend(variant_rows(variant, these));
        let over_multi: Vec<Value> = these
            .iter()
            .zip(of(Variant::Multi))
            .map(|(r, m)| crate::report::finite(m.rate() / r.rate()))
            .collect();
        detail.insert(
            variant.name().to_owned(),
            json!({
                "runs": these.iter().map(TransferRun::to_json).collect::<Vec<_>>(),
                "multi_over_this_per_run": over_multi,
            }),
        );
    }
    Ok(Output {
        rows,
        detail: Value::Object(detail),
        ..Output::default()
    })
}
