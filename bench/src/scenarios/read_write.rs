//! S14: a read-heavy key. S3's shape (eight workers in two processes, one
//! key, the bodies' counter on the data server), with 90 % of the calls
//! reads and 10 % writes, each call's kind drawn from the task's seeded
//! generator (`worker::read_write`), so every contender sees the same
//! sequence of kinds per task.
//!
//! A read's body GETs the counter, yields and GETs it again (two values
//! that differ are a violation: a writer got in beside the reader); a
//! write's body is S3's GET and SET. Each repetition runs, one after the
//! other:
//!
//! - `rw-plain`: ours, `fair(false)`, `.read()` / `.write()`;
//! - `rw-default`: ours with `LockRuntime::builder()` as it comes,
//!   `.read()` / `.write()`: fair mode (the default). Before fair
//!   read-write locks were built on Redis (issue 28, step 5) a read or
//!   write request was served plain there: the workers say how their holds
//!   were served, and the row's metric carries it;
//! - `exclusive`: ours with the default builder, every call (read or
//!   write body) taking the exclusive lock: what a user without read-write
//!   locks has;
//! - `limit`: no distributed lock, one process with the eight tasks on two
//!   data connections (as S3's limit) and an in-process `tokio::sync::RwLock`,
//!   whose queue is FIFO and so writer-preferring. It is the most a
//!   read-write lock could give with this mix, and with writer preference.
//!
//! The goal is the read-write rows at least 4x the exclusive row's
//! acquisitions/s, with the writers' wait p99 bounded. The design
//! (`docs/design/read-write.md` §6) predicts about 3.5x for a
//! writer-preferring lock with this mix, and 4.7x as Amdahl's ceiling.

use anyhow::Result;
use redis::AsyncCommands;
use serde_json::{json, Value};

use super::{contention, workers, Ctx, Output};
use crate::config::Shape;
use crate::read_write::{RwAnalysis, RwRecord};
use crate::report::{Row, Target};
use crate::stats::{median_of, Samples};
use crate::worker;
use crate::worker::read_write::{cohort_tried, Contender};

/// The seed of every run's call kinds (each task mixes in its number).
const SEED: u64 = 14;
/// Writes per thousand calls.
const WRITE_PERMILLE: u64 = 100;
/// The goal: read-write acquisitions/s over exclusive ones.
pub const GOAL: f64 = 4.0;
/// How long each body pauses after its first command, µs:
/// `LOCK_BENCH_S14_PAUSE_US` (tuning: bodies that take a while, where
/// readers sharing pays off), else 0. Unset in the figures BENCHMARKS.md
/// reports unless they say otherwise.
fn pause_us() -> u64 {
    std::env::var("LOCK_BENCH_S14_PAUSE_US")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Figures of one run of one contender.
#[derive(Clone, Debug)]
pub struct RwRun {
    /// What the records show.
    pub analysis: RwAnalysis,
    /// The counter the writes incremented.
    pub counter: u64,
    /// Acquires that gave up after [`crate::worker::WAIT_LIMIT`].
    pub timeouts: u64,
    /// Other failures the workers reported.
    pub errors: u64,
    /// Holds passed between tasks of a process without a round trip.
    pub passed_locally: u64,
    /// Reads that joined a read hold of their process without a round trip.
    pub joined_locally: u64,
    /// CPU time of the worker processes during the run, µs.
    pub worker_cpu_us: u64,
    /// CPU time of the Redis servers (lock and data) during the run, µs.
    pub redis_cpu_us: f64,
    /// How the workers' holds were served (`fair`, `plain`, `local`; two
    /// joined by `+` if the processes disagreed).
    pub served: String,
}

impl RwRun {
    /// Calls per second.
    pub fn rate(&self) -> f64 {
        self.analysis.per_second
    }

    /// |counter − recorded writes| plus timeouts and errors.
    pub fn failures(&self) -> f64 {
        (self.counter.abs_diff(self.analysis.writes as u64) + self.timeouts + self.errors) as f64
    }

    /// Reads that joined a read hold of their process, % of the reads.
    pub fn joined_pct(&self) -> f64 {
        let reads = self.analysis.total.saturating_sub(self.analysis.writes);
        self.joined_locally as f64 * 100.0 / reads.max(1) as f64
    }

    /// Worker CPU per call, µs.
    pub fn worker_cpu_per_call(&self) -> f64 {
        self.worker_cpu_us as f64 / self.analysis.total.max(1) as f64
    }

    /// Redis CPU (both servers) per call, µs.
    pub fn redis_cpu_per_call(&self) -> f64 {
        self.redis_cpu_us / self.analysis.total.max(1) as f64
    }

    /// Torn reads plus writer overlaps.
    pub fn violations(&self) -> f64 {
        self.analysis.violations() as f64
    }

    /// As JSON, for the results file.
    pub fn to_json(&self) -> Value {
        let a = &self.analysis;
        let ms = |v: f64| crate::report::finite(v / 1e3);
        json!({
            "served": self.served,
            "acquisitions": a.total,
            "writes": a.writes,
            "per_second": a.per_second,
            "writer_wait_ms": {
                "p50": ms(a.writer_waits.p50()),
                "p99": ms(a.writer_waits.p99()),
                "max": ms(a.writer_waits.max()),
            },
            "reader_wait_ms": {
                "p50": ms(a.reader_waits.p50()),
                "p99": ms(a.reader_waits.p99()),
                "max": ms(a.reader_waits.max()),
            },
            "torn_reads": a.torn_reads,
            "writer_overlaps": a.writer_overlaps,
            "peak_readers": a.peak_readers,
            "mean_readers": crate::report::finite(a.mean_readers),
            "counter": self.counter,
            "timeouts": self.timeouts,
            "errors": self.errors,
            "passed_locally": self.passed_locally,
            "joined_locally": self.joined_locally,
            "worker_cpu_us": self.worker_cpu_us,
            "redis_cpu_us": self.redis_cpu_us,
        })
    }
}

/// One run of `contender` in `shape`, its keys named apart by `run`.
pub async fn contend(ctx: &Ctx, contender: Contender, shape: Shape, run: usize) -> Result<RwRun> {
    let prefix = format!("s14:{run}:{}:", contender.name());
    let (processes, tasks, connections) = workers::layout(shape, contender == Contender::Limit);
    let mut started = Vec::new();
    for p in 0..processes {
        let args = [
            "read-write".to_owned(),
            contender.name().to_owned(),
            ctx.lock_server.url(),
            ctx.data_server.url(),
            prefix.clone(),
            tasks.to_string(),
            (p * tasks).to_string(),
            shape.duration.as_millis().to_string(),
            connections.to_string(),
            SEED.to_string(),
            WRITE_PERMILLE.to_string(),
            pause_us().to_string(),
        ];
        started.push(worker::start(&ctx.config.worker_exe, &args)?);
    }
    workers::ready(&mut started).await?;
    let mut lock_info = ctx.plain.clone();
    let mut data = redis::Client::open(ctx.data_server.url())?
        .get_multiplexed_async_connection()
        .await?;
    let redis_cpu_before = contention::servers_cpu(&mut lock_info, &mut data).await?;
    workers::go(&mut started)?;
    let lines = workers::collect(&mut started, shape.duration).await?;
    let redis_cpu_after = contention::servers_cpu(&mut lock_info, &mut data).await?;
    drop(started);

    let (mut records, mut served) = (Vec::new(), Vec::new());
    let counted = ["timeouts", "errors", "passed", "joined", "cpu_us"];
    let counts = workers::tally(&lines, &counted, |line| {
        if let Some(record) = RwRecord::parse(line) {
            records.push(record?);
        } else if let Some(how) = line.strip_prefix("served ") {
            served.push(how.trim().to_owned());
        } else {
            return Ok(false);
        }
        Ok(true)
    })?;
    served.sort();
    served.dedup();
    let counter: Option<u64> = data.get(format!("{prefix}counter")).await?;
    Ok(RwRun {
        analysis: RwAnalysis::of(records),
        counter: counter.unwrap_or(0),
        timeouts: counts.get("timeouts"),
        errors: counts.get("errors"),
        passed_locally: counts.get("passed"),
        joined_locally: counts.get("joined"),
        worker_cpu_us: counts.get("cpu_us"),
        redis_cpu_us: (redis_cpu_after - redis_cpu_before).max(0.0) * 1e6,
        served: served.join("+"),
    })
}

/// The scenario name of `contender`'s rows.
fn group(contender: Contender) -> &'static str {
    match contender {
        Contender::ReadWritePlain => "S14 rw plain",
        Contender::ReadWriteDefault => "S14 rw default",
        Contender::Exclusive => "S14 exclusive",
        Contender::Limit => "S14 limit",
    }
}

/// How the runs' holds were served, in words for a metric.
fn served(runs: &[RwRun]) -> String {
    let mut all: Vec<&str> = runs.iter().map(|r| r.served.as_str()).collect();
    all.sort_unstable();
    all.dedup();
    all.join(", then ")
}

/// Runs S14.
pub async fn run(ctx: &Ctx) -> Result<Output> {
    let shape = ctx.scale().s14;
    let mut runs: Vec<Vec<RwRun>> = vec![Vec::new(); Contender::ALL.len()];
    for run in 0..ctx.runs() {
        for (i, contender) in Contender::ALL.into_iter().enumerate() {
            runs[i].push(contend(ctx, contender, shape, run).await?);
        }
    }
    let of = |c: Contender| {
        let i = Contender::ALL.iter().position(|x| *x == c).unwrap_or(0);
        &runs[i]
    };
    let exclusive = of(Contender::Exclusive);
    let limit = of(Contender::Limit);
    let worst = |runs: &[RwRun], f: fn(&RwRun) -> f64| runs.iter().map(f).fold(0.0, f64::max);
    let ms = |v: f64| v / 1e3;
    let mut variant = match pause_us() {
        0 => String::new(),
        us => format!(", bodies paused {us} us"),
    };
    if let Some(c) = cohort_tried() {
        variant.push_str(&format!(
            ", cohort {} / {} ms",
            c.handoffs,
            c.budget.as_millis()
        ));
    }
    // The goal first: each read-write row against the exclusive lock.
    let mut rows: Vec<Row> = [Contender::ReadWritePlain, Contender::ReadWriteDefault]
        .into_iter()
        .map(|c| {
            let what = match c {
                Contender::ReadWritePlain => "read-write, plain",
                _ => "read-write, default builder",
            };
            Row::new(
                "S14",
                format!(
                    "{what} (served {}): acquisitions/s, 90 % reads{variant}",
                    served(of(c))
                ),
                median_of(of(c), RwRun::rate),
            )
            .vs("exclusive lock", median_of(exclusive, RwRun::rate))
            .target(Target::RatioAtLeast(GOAL))
        })
        .collect();
    for contender in Contender::ALL {
        let these = of(contender);
        let g = group(contender);
        let rate = median_of(these, RwRun::rate);
        let rate_row = Row::new(
            g,
            format!(
                "acquisitions/s, 90 % reads{variant} (served {})",
                served(these)
            ),
            rate,
        );
        rows.push(match contender {
            Contender::Exclusive => rate_row,
            _ => rate_row.vs(
                "exclusive, default builder",
                median_of(exclusive, RwRun::rate),
            ),
        });
        if contender != Contender::Limit {
            rows.push(
                Row::new(g, "acquisitions/s vs the limit", rate)
                    .vs("limit", median_of(limit, RwRun::rate)),
            );
        }
        let wait = |q: fn(&RwAnalysis) -> f64| move |r: &RwRun| ms(q(&r.analysis));
        rows.push(Row::new(
            g,
            "writer wait p50 (ms)",
            median_of(these, wait(|a| a.writer_waits.p50())),
        ));
        let p99 = Row::new(
            g,
            "writer wait p99 (ms)",
            median_of(these, wait(|a| a.writer_waits.p99())),
        );
        rows.push(if contender == Contender::Exclusive {
            p99
        } else {
            p99.vs(
                "exclusive",
                median_of(exclusive, wait(|a| a.writer_waits.p99())),
            )
        });
        rows.push(Row::new(
            g,
            "writer wait max (ms)",
            median_of(these, wait(|a| a.writer_waits.max())),
        ));
        rows.push(Row::new(
            g,
            "reader wait p99 (ms)",
            median_of(these, wait(|a| a.reader_waits.p99())),
        ));
        rows.push(Row::new(
            g,
            format!(
                "readers at once while any read: mean (peak {})",
                median_of(these, |r| r.analysis.peak_readers as f64)
            ),
            median_of(these, |r| r.analysis.mean_readers),
        ));
        if matches!(
            contender,
            Contender::ReadWritePlain | Contender::ReadWriteDefault
        ) {
            rows.push(Row::new(
                g,
                "reads that joined a read hold of their process (%)",
                median_of(these, RwRun::joined_pct),
            ));
        }
        rows.push(
            Row::new(
                g,
                "worker CPU (us per call)",
                median_of(these, RwRun::worker_cpu_per_call),
            )
            .vs(
                "exclusive",
                median_of(exclusive, RwRun::worker_cpu_per_call),
            ),
        );
        rows.push(
            Row::new(
                g,
                "Redis CPU, both servers (us per call)",
                median_of(these, RwRun::redis_cpu_per_call),
            )
            .vs("exclusive", median_of(exclusive, RwRun::redis_cpu_per_call)),
        );
        rows.push(
            Row::new(
                g,
                "torn reads + writer overlaps, worst run",
                worst(these, RwRun::violations),
            )
            .target(Target::Exactly(0.0)),
        );
        rows.push(
            Row::new(
                g,
                "|counter - writes| + timeouts + errors, worst run",
                worst(these, RwRun::failures),
            )
            .target(Target::Exactly(0.0)),
        );
    }
    let mut detail = serde_json::Map::new();
    detail.insert(
        "shape".to_owned(),
        json!({
            "processes": shape.processes,
            "tasks": shape.tasks,
            "seconds": shape.duration.as_secs_f64(),
            "seed": SEED,
            "writes_per_mille": WRITE_PERMILLE,
            "body_pause_us": pause_us(),
            "cohort_tried": cohort_tried().map(|c| json!({
                "handoffs": c.handoffs,
                "budget_ms": c.budget.as_millis() as u64,
            })),
        }),
    );
    for contender in Contender::ALL {
        let these = of(contender);
        let ratios: Vec<Value> = these
            .iter()
            .zip(exclusive)
            .map(|(r, e)| crate::report::finite(r.rate() / e.rate()))
            .collect();
        detail.insert(
            contender.name().to_owned(),
            json!({
                "runs": these.iter().map(RwRun::to_json).collect::<Vec<_>>(),
                "rate_over_exclusive_per_run": ratios,
            }),
        );
    }
    let curves: Vec<(String, Samples)> = Contender::ALL
        .into_iter()
        .map(|c| {
            let these = of(c);
            let waits = these
                .iter()
                .flat_map(|r| r.analysis.writer_waits.sorted())
                .copied()
                .collect();
            (
                format!("{} ({})", c.name(), served(these)),
                Samples::new(waits),
            )
        })
        .collect();
    let chart = crate::charts::writer_waits(&curves, ctx.config.quick)?;
    Ok(Output {
        rows,
        detail: Value::Object(detail),
        svgs: vec![("read_write.svg", chart)],
        ..Output::default()
    })
}
