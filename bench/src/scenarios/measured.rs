//! One measured run of worker processes that keep their data on the lock
//! server (S15's transfers, S16's flash sale): the processes started, the
//! `ready` / `go` / `done` exchange, and what the lock server did meanwhile
//! (its commands and its CPU), with the bodies' own commands taken out so
//! that what is left is lock traffic.
//!
//! These workers end with the count lines of [`COUNTED`] (see
//! `worker::tasks::measured`), read here by [`workers::tally`]. What a run
//! cost ([`Costs`]) is reported alike for each scenario ([`cost_rows`]),
//! per operation of its own (a transfer, a sale).

use std::time::Duration;

use anyhow::Result;
use lock_testkit::Delta;
use serde_json::{json, Map, Value};

use super::workers::Counts;
use super::{commands, contention, workers, Ctx};
use crate::report::{finite, Row};
use crate::stats::{median_of, Samples};
use crate::worker::{self, Library};

/// The count lines these workers print after their records.
pub const COUNTED: [&str; 4] = ["timeouts", "errors", "passed", "cpu_us"];

/// What a measured run gave.
pub struct Measured {
    /// Every worker's lines up to its `done`.
    pub lines: Vec<String>,
    /// The lock server's commands during the run.
    pub delta: Delta,
    /// The lock server's CPU time during the run, µs.
    pub redis_cpu_us: f64,
}

impl Measured {
    /// Starts one worker process per entry of `processes` (its arguments
    /// after `--worker`), lets them run for `duration` (they stop by
    /// themselves; the parent waits a margin longer), and reads the lock
    /// server's counters around the run.
    pub async fn run(ctx: &Ctx, processes: &[Vec<String>], duration: Duration) -> Result<Self> {
        let mut started = Vec::new();
        for args in processes {
            started.push(worker::start(&ctx.config.worker_exe, args)?);
        }
        workers::ready(&mut started).await?;
        let mut info = ctx.plain.clone();
        let cpu_before = contention::redis_cpu(&mut info).await?;
        let stats_before = contention::command_stats(&mut info).await?;
        workers::go(&mut started)?;
        let lines = workers::collect(&mut started, duration).await?;
        let delta = contention::command_stats(&mut info)
            .await?
            .since(&stats_before);
        let cpu_after = contention::redis_cpu(&mut info).await?;
        drop(started);
        Ok(Measured {
            lines,
            delta,
            redis_cpu_us: (cpu_after - cpu_before).max(0.0) * 1e6,
        })
    }

    /// What the run cost, from the workers' `counts` and the server's
    /// counters, per one of `ops` operations: the bodies' commands
    /// (`(name, calls)`, as the records say the bodies sent them) are taken
    /// out of the counters first, so that the rest is lock traffic.
    pub fn costs(&mut self, counts: &Counts, bodies: &[(&str, u64)], ops: usize) -> Costs {
        for &(name, calls) in bodies {
            if let Some(c) = self.delta.0.get_mut(name) {
                c.calls = c.calls.saturating_sub(calls);
            }
        }
        let ours = Library::OursDefault;
        let total = ops.max(1) as f64;
        let sent = commands::sent(ours, &self.delta, 0) as f64;
        let busy = commands::failed_attempts(ours, &self.delta, ops) as f64;
        Costs {
            ops,
            timeouts: counts.get("timeouts"),
            errors: counts.get("errors"),
            passed_locally: counts.get("passed"),
            lock_commands: sent / total,
            busy_attempts: busy / total,
            worker_cpu_us: counts.get("cpu_us"),
            redis_cpu_us: self.redis_cpu_us,
        }
    }
}

/// What one run cost, and what went wrong in it, from the workers' count
/// lines and the lock server's counters.
#[derive(Clone, Debug, Default)]
pub struct Costs {
    /// Operations the figures below are per (transfers, sales).
    pub ops: usize,
    /// Calls that gave up after [`crate::worker::WAIT_LIMIT`].
    pub timeouts: u64,
    /// Other failures the workers reported.
    pub errors: u64,
    /// Holds passed between tasks of a process without a round trip.
    pub passed_locally: u64,
    /// Commands sent to the server for the locks (as S4 counts them, the
    /// bodies' commands taken out), per operation.
    pub lock_commands: f64,
    /// Acquire attempts that found a key taken (our scripts' PTTL calls),
    /// per operation.
    pub busy_attempts: f64,
    /// CPU time of the worker processes during the run, µs.
    pub worker_cpu_us: u64,
    /// CPU time of the Redis server during the run, µs.
    pub redis_cpu_us: f64,
}

impl Costs {
    /// Per operation, of a count over the run.
    pub fn per_op(&self, count: f64) -> f64 {
        count / self.ops.max(1) as f64
    }

    /// The figures as JSON fields, the per-operation ones named after `op`,
    /// beside the run's `waits` (µs, given in ms).
    pub fn to_json(&self, op: &str, waits: &Samples) -> Map<String, Value> {
        let ms = |v: f64| finite(v / 1e3);
        let mut fields = Map::new();
        let waits =
            json!({ "p50": ms(waits.p50()), "p99": ms(waits.p99()), "max": ms(waits.max()) });
        fields.insert("wait_ms".to_owned(), waits);
        for (name, value) in [
            ("timeouts", json!(self.timeouts)),
            ("errors", json!(self.errors)),
            ("passed_locally", json!(self.passed_locally)),
            ("worker_cpu_us", json!(self.worker_cpu_us)),
            ("redis_cpu_us", json!(self.redis_cpu_us)),
        ] {
            fields.insert(name.to_owned(), value);
        }
        let lock_commands = finite(self.lock_commands);
        fields.insert(format!("lock_commands_per_{op}"), lock_commands);
        fields.insert(
            format!("busy_attempts_per_{op}"),
            finite(self.busy_attempts),
        );
        fields
    }
}

/// The rows of a group's costs over its runs (medians): the wait (p50,
/// p99, max, from each run's `waits`, µs), then lock commands, busy
/// attempts, local passes and CPU per `op` (`transfer`, `sale`).
pub fn cost_rows<T>(
    group: &'static str,
    op: &str,
    runs: &[T],
    of: impl Fn(&T) -> (&Samples, &Costs),
) -> Vec<Row> {
    let ms = |q: fn(&Samples) -> f64| median_of(runs, |r| q(of(r).0) / 1e3);
    let median = |f: fn(&Costs) -> f64| median_of(runs, |r| f(of(r).1));
    vec![
        Row::new(group, "wait p50 (ms)", ms(Samples::p50)),
        Row::new(group, "wait p99 (ms)", ms(Samples::p99)),
        Row::new(group, "wait max (ms)", ms(Samples::max)),
        Row::new(
            group,
            format!("lock commands per {op}"),
            median(|c| c.lock_commands),
        ),
        Row::new(
            group,
            format!("busy acquire attempts per {op}"),
            median(|c| c.busy_attempts),
        ),
        Row::new(
            group,
            format!("holds passed within the process per {op}"),
            median(|c| c.per_op(c.passed_locally as f64)),
        ),
        Row::new(
            group,
            format!("worker CPU (us per {op})"),
            median(|c| c.per_op(c.worker_cpu_us as f64)),
        ),
        Row::new(
            group,
            format!("Redis CPU (us per {op})"),
            median(|c| c.per_op(c.redis_cpu_us)),
        ),
    ]
}
