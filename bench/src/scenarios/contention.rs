//! One contention run: eight workers in two processes take one key in turn.
//!
//! The parent re-executes this binary twice with `--worker contend`, waits for
//! both to be `ready`, reads the lock server's `INFO commandstats`, says `go`,
//! PINGs alongside while they run, and collects their records and counters.
//! S3 (`handoff.rs`) and S4 (`commands.rs`) are two readings of the same
//! runs.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use lock_testkit::{CommandStats, Delta};
use redis::AsyncCommands;
use serde_json::{json, Value};

use super::{commands, Ctx};
use crate::handoff::{Analysis, Record};
use crate::report::commands_json;
use crate::stats::Samples;
use crate::worker::{self, Library};

/// Worker processes per run.
pub const PROCESSES: u32 = 2;
/// Tasks per worker process.
pub const TASKS: u32 = 4;
/// Most lines a worker may print (bounds the parent's reading).
const MAX_LINES: usize = 5_000_000;

/// Figures of one run of one library.
pub struct Run {
    /// What the records show.
    pub analysis: Analysis,
    /// PING p50 measured by the parent while the workers ran (µs).
    pub loaded_ping: f64,
    /// The counter the bodies incremented.
    pub counter: u64,
    /// Acquires that gave up.
    pub timeouts: u64,
    /// Other failures the workers reported.
    pub errors: u64,
    /// Lock server commands between `go` and `done`.
    pub delta: Delta,
    /// Commands sent by clients, plus PUBLISHes, per acquisition.
    pub commands_per_acquisition: f64,
    /// Acquire attempts that found the lock taken, per acquisition.
    pub failed_attempts: f64,
}

impl Run {
    /// How far the counter is from the number of acquisitions.
    pub fn counter_error(&self) -> f64 {
        (self.counter as f64 - self.analysis.total as f64).abs()
    }

    /// Overlapping holds, timeouts and errors.
    pub fn failures(&self) -> f64 {
        (self.analysis.overlaps as u64 + self.timeouts + self.errors) as f64
    }

    /// As JSON, for the results file.
    pub fn to_json(&self) -> Value {
        let a = &self.analysis;
        json!({
            "acquisitions": a.total,
            "ping_p50_us_during_run": self.loaded_ping,
            "per_second": a.per_second,
            "handoffs": a.handoffs.len(),
            "handoff_p50_us": a.handoffs.p50(),
            "handoff_p99_us": a.handoffs.p99(),
            "wait_p50_us": a.waits.p50(),
            "wait_p99_us": a.waits.p99(),
            "wait_max_us": a.waits.max(),
            "barged": a.barged,
            "per_worker": a.per_worker.values().collect::<Vec<_>>(),
            "overlaps": a.overlaps,
            "counter": self.counter,
            "timeouts": self.timeouts,
            "errors": self.errors,
            "commands_per_acquisition": self.commands_per_acquisition,
            "failed_attempts_per_acquisition": self.failed_attempts,
            "executed_per_acquisition": self.delta.executed() as f64 / a.total as f64,
            "commands": commands_json(&self.delta),
        })
    }
}

/// PINGs (one per 5 ms) for `duration` on the connection type `library`
/// uses: the round trip as the loaded machine gives it during the run.
fn pings_during(
    ctx: &Ctx,
    library: Library,
    duration: Duration,
) -> impl std::future::Future<Output = Result<Samples>> + Send + 'static {
    let runtime = ctx.runtime.clone();
    let mut plain = ctx.plain.clone();
    async move {
        let end = tokio::time::Instant::now() + duration;
        let mut samples = Vec::new();
        while tokio::time::Instant::now() < end && samples.len() < 100_000 {
            let start = tokio::time::Instant::now();
            match library {
                Library::Ours | Library::OursFair | Library::OursCluster => {
                    runtime.ping().await?;
                }
                Library::Rslock => {
                    let _: String = redis::cmd("PING").query_async(&mut plain).await?;
                }
            }
            samples.push(super::us(start.elapsed()));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(Samples::new(samples))
    }
}

/// One contention run of `library`.
pub async fn contend(ctx: &Ctx, library: Library, run: usize) -> Result<Run> {
    let duration = ctx.scale().s3_duration;
    let prefix = format!("s3:{run}:{}:", library.name());
    let lock_url = match library {
        Library::OursCluster => ctx.cluster()?.urls().join(","),
        _ => ctx.lock_server.url(),
    };
    let mut workers = Vec::new();
    for p in 0..PROCESSES {
        let args = [
            "contend".to_owned(),
            library.name().to_owned(),
            lock_url.clone(),
            ctx.data_server.url(),
            prefix.clone(),
            TASKS.to_string(),
            (p * TASKS).to_string(),
            duration.as_millis().to_string(),
        ];
        workers.push(worker::start(&ctx.config.worker_exe, &args)?);
    }
    for w in &mut workers {
        w.expect("ready", Duration::from_secs(60)).await?;
    }
    let mut info = ctx.plain.clone();
    let before = CommandStats::read(&mut info).await?;
    for w in &mut workers {
        w.send("go")?;
    }
    let pinger = tokio::spawn(pings_during(ctx, library, duration));
    let mut lines = Vec::new();
    for w in &mut workers {
        let limit = duration + crate::worker::WAIT_LIMIT + Duration::from_secs(30);
        lines.extend(w.collect_until_done(limit, MAX_LINES).await?);
    }
    let delta = CommandStats::read(&mut info).await?.since(&before);
    drop(workers);
    let loaded_pings = pinger.await??;

    let (mut records, mut timeouts, mut errors) = (Vec::new(), 0, 0);
    for line in &lines {
        if let Some(record) = Record::parse(line) {
            records.push(record?);
        } else if let Some(n) = line.strip_prefix("timeouts ") {
            timeouts += n.trim().parse::<u64>().context("timeouts line")?;
        } else if let Some(n) = line.strip_prefix("errors ") {
            errors += n.trim().parse::<u64>().context("errors line")?;
        } else {
            bail!("unexpected worker line {line:?}");
        }
    }
    let mut data = redis::Client::open(ctx.data_server.url())?
        .get_multiplexed_async_connection()
        .await?;
    let counter: Option<u64> = data
        .get(format!("{prefix}{}", crate::worker::COUNTER))
        .await?;
    let analysis = Analysis::of(records, 0..PROCESSES * TASKS);
    let commands = commands::sent(library, &delta, loaded_pings.len() as u64);
    Ok(Run {
        loaded_ping: loaded_pings.p50(),
        commands_per_acquisition: commands as f64 / analysis.total as f64,
        failed_attempts: commands::failed_attempts(library, &delta, analysis.total) as f64
            / analysis.total as f64,
        analysis,
        counter: counter.unwrap_or(0),
        timeouts,
        errors,
        delta,
    })
}
