//! What the contention and the read-write workers share around their
//! tasks: the data connections and which task uses which, how each call's
//! outcome is noted ([`TaskResult`]), and the lines the tasks' results come
//! to for the parent (records, then `timeouts`, `errors`, and later
//! `cpu_us`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use lock_runtime::{LockError, LockRuntime};
use redis::aio::MultiplexedConnection;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// The one of `all` whose name is `name`, else an error naming the `what`.
pub(super) fn named<T: Copy>(
    all: impl IntoIterator<Item = T>,
    name_of: fn(T) -> &'static str,
    what: &str,
    name: &str,
) -> Result<T> {
    all.into_iter()
        .find(|t| name_of(*t) == name)
        .ok_or_else(|| anyhow::anyhow!("unknown {what} {name:?}"))
}

/// What one task did.
pub(super) struct TaskResult<R> {
    pub(super) records: Vec<R>,
    pub(super) timeouts: usize,
    pub(super) errors: usize,
}

impl<R> Default for TaskResult<R> {
    fn default() -> Self {
        TaskResult {
            records: Vec::new(),
            timeouts: 0,
            errors: 0,
        }
    }
}

impl<R> TaskResult<R> {
    /// Notes the `outcome` of one call of `worker`: its record, made by
    /// `record` from what the body returned, unless `warmup`; else a
    /// timeout, or an error (printed). Every error of a warm-up call is
    /// the run's failure.
    pub(super) fn note<T>(
        &mut self,
        worker: u32,
        outcome: Result<T>,
        warmup: bool,
        record: impl FnOnce(T) -> R,
    ) -> Result<()> {
        match outcome {
            Ok(done) if !warmup => self.records.push(record(done)),
            Ok(_) => {}
            Err(e) if warmup => return Err(e),
            Err(e) => match e.downcast_ref::<LockError>() {
                Some(LockError::Timeout { .. }) => self.timeouts += 1,
                _ => {
                    eprintln!("lock-bench worker {worker}: {e:#}");
                    self.errors += 1;
                }
            },
        }
        Ok(())
    }
}

/// The process's data connections to `url`: `connections` of them (one
/// per process of the shape: one, but for the limit, whose one process
/// stands for all of them), at least one and at most one per task.
pub(super) async fn data_connections(
    url: &str,
    connections: u32,
    tasks: u32,
) -> Result<Vec<MultiplexedConnection>> {
    let mut data = Vec::new();
    for _ in 0..connections.clamp(1, tasks.max(1)) {
        data.push(
            redis::Client::open(url)?
                .get_multiplexed_async_connection()
                .await?,
        );
    }
    Ok(data)
}

/// What a worker whose data lives on the lock server at `url` starts with:
/// one data connection for the process's tasks (as the contention workers
/// have), and its runtime, the builder as it comes with the run's key
/// `prefix`.
pub(super) async fn on_lock_server(
    url: &str,
    prefix: &str,
    tasks: u32,
) -> Result<(Vec<MultiplexedConnection>, LockRuntime)> {
    let data = data_connections(url, 1, tasks).await?;
    let runtime = LockRuntime::builder()
        .redis(url)
        .key_prefix(prefix)
        .build()
        .await?;
    Ok((data, runtime))
}

/// The data connection of the `nth` of `tasks` tasks: they are spread
/// over the connections in order, as they are over the processes.
pub(super) fn connection_of(
    data: &[MultiplexedConnection],
    nth: u32,
    tasks: u32,
) -> MultiplexedConnection {
    let index = nth as usize * data.len() / tasks.max(1) as usize;
    data[index.min(data.len() - 1)].clone()
}

/// Waits for every task; their records as lines (by `line`), then the
/// `timeouts` and `errors` lines.
pub(super) async fn lines_of<R: 'static>(
    mut tasks: JoinSet<Result<TaskResult<R>>>,
    line: fn(&R) -> String,
) -> Result<Vec<String>> {
    let mut lines = Vec::new();
    let (mut timeouts, mut errors) = (0, 0);
    while let Some(done) = tasks.join_next().await {
        let result = done??;
        timeouts += result.timeouts;
        errors += result.errors;
        lines.extend(result.records.iter().map(line));
    }
    lines.push(format!("timeouts {timeouts}"));
    lines.push(format!("errors {errors}"));
    Ok(lines)
}

/// The measured part of a worker whose setup and warm-up are done: says
/// `ready`, waits for `go`, runs the tasks `spawn` starts (given when the
/// run must end, `duration` from `go`), and prints their records (by
/// `line`), the `timeouts`, `errors`, `passed` (holds `runtime` passed
/// between tasks without a round trip) and `cpu_us` lines, and `done`.
/// The runtime is shut down before `done` goes out, so the last releases
/// are on the server when the parent reads its counters.
pub(super) async fn measured<R: 'static>(
    runtime: LockRuntime,
    duration: Duration,
    line: fn(&R) -> String,
    spawn: impl FnOnce(Instant, &mut JoinSet<Result<TaskResult<R>>>),
) -> Result<()> {
    super::emit(["ready".to_owned()])?;
    super::wait_for_go().await?;
    let passed_before = runtime.stats().passed_locally;
    let cpu_before = cpu_seconds();
    let mut running = JoinSet::new();
    spawn(Instant::now() + duration, &mut running);
    let mut lines = lines_of(running, line).await?;
    let passed = runtime.stats().passed_locally.saturating_sub(passed_before);
    lines.push(format!("passed {passed}"));
    lines.push(cpu_line(cpu_before));
    lines.push("done".to_owned());
    runtime.shutdown().await?;
    super::emit(lines)
}

/// CPU time of this process so far (all threads, user + system), seconds;
/// 0 where `/proc` cannot be read (the figure is a report, not a check).
pub(super) fn cpu_seconds() -> f64 {
    lock_testkit::usage::cpu_seconds().unwrap_or(0.0)
}

/// The `cpu_us` line: the process's CPU time since `before` (from
/// [`cpu_seconds`]), µs.
pub(super) fn cpu_line(before: f64) -> String {
    let cpu_us = (cpu_seconds() - before).max(0.0) * 1e6;
    format!("cpu_us {cpu_us:.0}")
}

/// Microseconds since the Unix epoch on the system clock. Unlike `Instant`,
/// it is comparable between processes of one machine, which is what the
/// cross-process handoff measurement needs.
pub(super) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
