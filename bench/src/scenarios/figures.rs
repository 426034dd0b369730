//! The figures of one contention run ([`Run`], and where a one-key run's
//! time went: [`Breakdown`]), and their medians and worst cases over runs,
//! so that every scenario reads them alike. `contention.rs` makes the runs;
//! S3, S4, S8, S9 and the scenarios on other backends read them here.

use anyhow::{bail, Result};
use lock_testkit::Delta;
use serde_json::{json, Value};

use crate::config::Shape;
use crate::handoff::{Analysis, Record};
use crate::report::{commands_json, Row};
use crate::stats::median_of;

/// Figures of one run of one library.
pub struct Run {
    /// Who contended for what.
    pub shape: Shape,
    /// What the records show.
    pub analysis: Analysis,
    /// PING p50 measured by the parent while the workers ran (µs).
    pub loaded_ping: f64,
    /// The counters the bodies incremented, summed over the keys.
    pub counter: u64,
    /// Sum over the keys of |counter − acquisitions of the key|.
    pub counter_error: u64,
    /// Acquires that gave up.
    pub timeouts: u64,
    /// Other failures the workers reported.
    pub errors: u64,
    /// Holds passed between tasks of a process without a round trip.
    pub passed_locally: u64,
    /// CPU time of the worker processes during the run, µs (0 when the
    /// worker does not report it: Curator's).
    pub worker_cpu_us: u64,
    /// Context switches of the worker processes' threads during the run.
    pub switches: u64,
    /// CPU time of the Redis servers (lock and data) during the run, µs.
    pub redis_cpu_us: f64,
    /// Lock server commands between `go` and `done`.
    pub delta: Delta,
    /// Commands sent by clients, plus PUBLISHes, per acquisition (on
    /// ZooKeeper: requests the server received, session pings included).
    pub commands_per_acquisition: f64,
    /// Acquire attempts that found the lock taken, per acquisition.
    pub failed_attempts: f64,
    /// Where the time between the first and the last body went, from the
    /// records (meaningful for one key).
    pub breakdown: Breakdown,
}

/// Where a one-key run's time went, µs per acquisition, from the records:
/// every hold is a body, and between two consecutive holds of the key the
/// gap is a handoff within a process or across processes (the next holder
/// was already waiting when the previous body ended) or idle time (nobody
/// was waiting). Over one key, body + handoffs + idle is the run's span
/// divided by its acquisitions (the first wait aside).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Breakdown {
    /// Mean body time (GET + SET under the lock).
    pub body: f64,
    /// Gaps handed to a waiter of the same process, per acquisition.
    pub local: f64,
    /// Gaps handed to a waiter of another process, per acquisition.
    pub cross: f64,
    /// Gaps with nobody waiting, per acquisition.
    pub idle: f64,
    /// Handoffs within a process, share of the acquisitions.
    pub local_share: f64,
    /// Handoffs across processes, share of the acquisitions.
    pub cross_share: f64,
    /// Mean gap of a handoff within a process, µs.
    pub local_mean: f64,
    /// Mean gap of a handoff across processes, µs.
    pub cross_mean: f64,
}

impl Breakdown {
    /// The breakdown of runs made one after the other, as one (each
    /// weighted by its acquisitions).
    pub fn pool(parts: &[(Breakdown, usize)]) -> Breakdown {
        let n = parts.iter().map(|(_, n)| *n).sum::<usize>().max(1) as f64;
        let per_acq =
            |f: fn(&Breakdown) -> f64| parts.iter().map(|(b, k)| f(b) * *k as f64).sum::<f64>() / n;
        let (local, cross) = (per_acq(|b| b.local), per_acq(|b| b.cross));
        let (local_share, cross_share) = (per_acq(|b| b.local_share), per_acq(|b| b.cross_share));
        let mean = |sum: f64, share: f64| if share > 0.0 { sum / share } else { 0.0 };
        Breakdown {
            body: per_acq(|b| b.body),
            local,
            cross,
            idle: per_acq(|b| b.idle),
            local_share,
            cross_share,
            local_mean: mean(local, local_share),
            cross_mean: mean(cross, cross_share),
        }
    }

    /// The breakdown of `records`, workers numbered `process * tasks + task`.
    pub fn of(records: &[Record], tasks: u32) -> Breakdown {
        let mut by_key: std::collections::BTreeMap<u32, Vec<&Record>> = Default::default();
        for r in records {
            by_key.entry(r.key).or_default().push(r);
        }
        let (mut body, mut local, mut cross, mut idle) = (0u64, 0u64, 0u64, 0u64);
        let (mut n_local, mut n_cross) = (0u64, 0u64);
        for holds in by_key.values_mut() {
            holds.sort_by_key(|r| (r.acquired, r.released));
            body += holds
                .iter()
                .map(|r| r.released.saturating_sub(r.acquired))
                .sum::<u64>();
            for pair in holds.windows(2) {
                let (prev, next) = (pair[0], pair[1]);
                let gap = next.acquired.saturating_sub(prev.released);
                if next.requested > prev.released {
                    idle += gap;
                } else if prev.worker / tasks.max(1) == next.worker / tasks.max(1) {
                    local += gap;
                    n_local += 1;
                } else {
                    cross += gap;
                    n_cross += 1;
                }
            }
        }
        let n = records.len().max(1) as f64;
        let mean = |sum: u64, count: u64| sum as f64 / count.max(1) as f64;
        Breakdown {
            body: body as f64 / n,
            local: local as f64 / n,
            cross: cross as f64 / n,
            idle: idle as f64 / n,
            local_share: n_local as f64 / n,
            cross_share: n_cross as f64 / n,
            local_mean: mean(local, n_local),
            cross_mean: mean(cross, n_cross),
        }
    }
}

impl Run {
    /// How far the counters are from the numbers of acquisitions.
    pub fn counter_error(&self) -> f64 {
        self.counter_error as f64
    }

    /// Overlapping holds, timeouts and errors.
    pub fn failures(&self) -> f64 {
        (self.analysis.overlaps as u64 + self.timeouts + self.errors) as f64
    }

    /// Acquisitions per second.
    pub fn rate(&self) -> f64 {
        self.analysis.per_second
    }

    /// Handoff p50, µs.
    pub fn handoff_p50(&self) -> f64 {
        self.analysis.handoffs.p50()
    }

    /// Handoff p99, µs.
    pub fn handoff_p99(&self) -> f64 {
        self.analysis.handoffs.p99()
    }

    /// Wait to acquire p50, ms.
    pub fn wait_p50_ms(&self) -> f64 {
        self.analysis.waits.p50() / 1e3
    }

    /// Wait to acquire p99, ms.
    pub fn wait_p99_ms(&self) -> f64 {
        self.analysis.waits.p99() / 1e3
    }

    /// Longest wait to acquire, ms.
    pub fn wait_max_ms(&self) -> f64 {
        self.analysis.waits.max() / 1e3
    }

    /// Busiest worker's acquisitions over the idlest's.
    pub fn spread(&self) -> f64 {
        self.analysis.share_spread()
    }

    /// Acquisitions handed to a worker that was waiting, %.
    pub fn handed_pct(&self) -> f64 {
        self.analysis.handoff_share() * 100.0
    }

    /// Acquisitions that went past a waiting worker, %.
    pub fn barged_pct(&self) -> f64 {
        self.analysis.barged as f64 * 100.0 / self.analysis.total.max(1) as f64
    }

    /// Acquisitions passed locally (lock cohorting), %.
    pub fn passed_pct(&self) -> f64 {
        self.passed_locally as f64 * 100.0 / self.analysis.total.max(1) as f64
    }

    /// Each process's share of the acquisitions, %.
    pub fn process_shares(&self) -> Vec<f64> {
        self.analysis.process_shares(self.shape.tasks)
    }

    /// The smallest process's share, %.
    pub fn min_process_pct(&self) -> f64 {
        self.process_shares().into_iter().fold(f64::NAN, f64::min)
    }

    /// The largest process's share, %.
    pub fn max_process_pct(&self) -> f64 {
        self.process_shares().into_iter().fold(f64::NAN, f64::max)
    }

    /// Time per acquisition, µs (the inverse of the rate).
    pub fn per_acquisition_us(&self) -> f64 {
        1e6 / self.rate()
    }

    /// Worker CPU per acquisition, µs.
    pub fn worker_cpu_per_acquisition(&self) -> f64 {
        self.worker_cpu_us as f64 / self.analysis.total.max(1) as f64
    }

    /// Worker context switches per acquisition.
    pub fn switches_per_acquisition(&self) -> f64 {
        self.switches as f64 / self.analysis.total.max(1) as f64
    }

    /// Redis CPU (both servers) per acquisition, µs.
    pub fn redis_cpu_per_acquisition(&self) -> f64 {
        self.redis_cpu_us / self.analysis.total.max(1) as f64
    }

    /// As JSON, for the results file.
    pub fn to_json(&self) -> Value {
        let a = &self.analysis;
        let b = &self.breakdown;
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
            "passed_locally": self.passed_locally,
            "worker_cpu_us": self.worker_cpu_us,
            "worker_context_switches": self.switches,
            "redis_cpu_us": self.redis_cpu_us,
            "per_worker": a.per_worker.values().collect::<Vec<_>>(),
            "per_process_pct": self.process_shares(),
            "keys_taken": a.per_key.len(),
            "overlaps": a.overlaps,
            "counter": self.counter,
            "counter_error": self.counter_error,
            "timeouts": self.timeouts,
            "errors": self.errors,
            "commands_per_acquisition": self.commands_per_acquisition,
            "failed_attempts_per_acquisition": self.failed_attempts,
            "executed_per_acquisition": self.delta.executed() as f64 / a.total as f64,
            "commands": commands_json(&self.delta),
            "us_per_acquisition": {
                "body": b.body,
                "handoff_within_process": b.local,
                "handoff_across_processes": b.cross,
                "idle": b.idle,
            },
            "handoffs_within_process_share": b.local_share,
            "handoffs_across_processes_share": b.cross_share,
            "handoff_within_process_mean_us": b.local_mean,
            "handoff_across_processes_mean_us": b.cross_mean,
        })
    }
}

impl Run {
    /// Runs of one library made one after the other (the limit's slices,
    /// one before each contender of a repetition), as one run over their
    /// summed time: counts and CPU summed, acquisitions/s over the sum of
    /// their spans, per-acquisition figures weighted by acquisitions.
    pub fn pool(parts: Vec<Run>) -> Result<Run> {
        let Some(first) = parts.first() else {
            bail!("no run to pool");
        };
        let mut shape = first.shape;
        shape.duration = parts.iter().map(|r| r.shape.duration).sum();
        let analysis =
            Analysis::pool(&parts.iter().map(|r| r.analysis.clone()).collect::<Vec<_>>());
        let total = analysis.total.max(1) as f64;
        let weighted = |f: fn(&Run) -> f64| {
            parts
                .iter()
                .map(|r| f(r) * r.analysis.total as f64)
                .sum::<f64>()
                / total
        };
        let mut delta = Delta::default();
        for r in &parts {
            for (name, c) in &r.delta.0 {
                let sum = delta.0.entry(name.clone()).or_default();
                sum.calls += c.calls;
                sum.usec += c.usec;
            }
        }
        let sum = |f: fn(&Run) -> u64| parts.iter().map(f).sum::<u64>();
        Ok(Run {
            shape,
            loaded_ping: crate::stats::median(parts.iter().map(|r| r.loaded_ping)),
            counter: sum(|r| r.counter),
            counter_error: sum(|r| r.counter_error),
            timeouts: sum(|r| r.timeouts),
            errors: sum(|r| r.errors),
            passed_locally: sum(|r| r.passed_locally),
            worker_cpu_us: sum(|r| r.worker_cpu_us),
            switches: sum(|r| r.switches),
            redis_cpu_us: parts.iter().map(|r| r.redis_cpu_us).sum(),
            commands_per_acquisition: weighted(|r| r.commands_per_acquisition),
            failed_attempts: weighted(|r| r.failed_attempts),
            breakdown: Breakdown::pool(
                &parts
                    .iter()
                    .map(|r| (r.breakdown, r.analysis.total))
                    .collect::<Vec<_>>(),
            ),
            delta,
            analysis,
        })
    }
}

/// One figure of a run (`Run::rate`, `Run::wait_p99_ms`, ...), as the rows
/// read it from each run.
pub type Figure = fn(&Run) -> f64;

/// Median over the runs of one figure.
pub fn median(runs: &[Run], figure: Figure) -> f64 {
    median_of(runs, figure)
}

/// The row `metric` of `group`: `runs`' median `figure` (add `.vs` and
/// `.target` to judge it).
pub fn median_row(group: &'static str, metric: &str, runs: &[Run], figure: Figure) -> Row {
    Row::new(group, metric, median(runs, figure))
}

/// The worst (largest) run of one figure, for exactness checks.
pub fn worst(runs: &[Run], figure: Figure) -> f64 {
    runs.iter().map(figure).fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(worker: u32, requested: u64, acquired: u64, released: u64) -> Record {
        Record {
            worker,
            key: 0,
            requested,
            acquired,
            released,
        }
    }

    #[test]
    fn breakdown_splits_gaps_into_local_cross_and_idle() {
        // Two processes of two tasks: workers 0, 1 | 2, 3.
        let records = [
            rec(0, 0, 0, 10),
            rec(1, 5, 12, 22),  // waiting: within process 0, gap 2
            rec(2, 5, 30, 40),  // waiting: across processes, gap 8
            rec(3, 50, 50, 60), // asked after the release: idle, gap 10
        ];
        let b = Breakdown::of(&records, 2);
        assert_eq!(b.body, 10.0);
        assert_eq!((b.local, b.cross, b.idle), (0.5, 2.0, 2.5));
        assert_eq!((b.local_share, b.cross_share), (0.25, 0.25));
        assert_eq!((b.local_mean, b.cross_mean), (2.0, 8.0));
        // Over one key the parts add up to the span per acquisition.
        let span = 60.0 / 4.0;
        assert_eq!(b.body + b.local + b.cross + b.idle, span);
        let pooled = Breakdown::pool(&[(b, 4), (Breakdown::default(), 4)]);
        assert_eq!((pooled.body, pooled.cross_mean), (5.0, 8.0));
    }
}
