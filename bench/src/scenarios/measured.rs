//! One measured run of worker processes that keep their data on the lock
//! server (S15's transfers, S16's flash sale): the processes started, the
//! `ready` / `go` / `done` exchange, and what the lock server did meanwhile
//! (its commands and its CPU), with the bodies' own commands taken out so
//! that what is left is lock traffic.
//!
//! These workers end with the count lines of [`COUNTED`] (see
//! `worker::tasks::measured`), read here by [`workers::tally`].

use std::time::Duration;

use anyhow::Result;
use lock_testkit::Delta;

use super::{commands, contention, workers, Ctx};
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

    /// Takes the bodies' commands out of the counts (`(name, calls)`, as
    /// the records say the bodies sent them), then answers the lock
    /// commands (as S4 counts them) and the busy acquire attempts, both
    /// per one of `ops` operations.
    pub fn lock_traffic(&mut self, bodies: &[(&str, u64)], ops: usize) -> (f64, f64) {
        for &(name, calls) in bodies {
            if let Some(c) = self.delta.0.get_mut(name) {
                c.calls = c.calls.saturating_sub(calls);
            }
        }
        let ours = Library::OursDefault;
        let total = ops.max(1) as f64;
        let sent = commands::sent(ours, &self.delta, 0) as f64;
        let busy = commands::failed_attempts(ours, &self.delta, ops) as f64;
        (sent / total, busy / total)
    }
}
