//! Benchmark harness for `lock-runtime`: each figure against its physical
//! limit (Redis round trips) and against a polling peer (rslock), measured
//! side by side in one run on a private `redis-server`.
//!
//! `cargo run --release -p lock-bench -- [s1 .. s16] [--quick]` runs the
//! scenarios of BENCHMARKS.md, prints one table, and writes
//! `target/bench/results.json` and the charts `target/bench/handoff.svg`,
//! `target/bench/waits.svg` (S3) and `target/bench/limits.svg` (S3, S8, S9
//! against their limit). The test in
//! `tests/quick.rs` runs the quick variant so the harness cannot rot.

pub mod charts;
pub mod config;
pub mod curator;
pub mod flash_sale;
pub mod handoff;
pub mod idle;
pub mod keys;
pub mod overlaps;
pub mod read_write;
pub mod report;
pub mod scenarios;
pub mod stats;
pub mod transfers;
pub mod worker;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use serde_json::{json, Map, Value};

pub use config::{Config, Scale, Scenario};
use report::Row;
use scenarios::{Ctx, Output};

/// What a benchmark run produced.
#[derive(Debug)]
pub struct Summary {
    /// Every row, in scenario order.
    pub rows: Vec<Row>,
    /// The printed table.
    pub table: String,
    /// Where the JSON results went.
    pub json_path: PathBuf,
    /// Where the charts went (`handoff.svg`, `waits.svg` when S3 ran;
    /// `limits.svg` when S3, S8 or S9 ran; `read_write.svg` when S14 ran).
    pub svg_paths: Vec<PathBuf>,
    /// Wall time of the whole run, seconds.
    pub seconds: f64,
}

/// Runs the configured scenarios, prints progress to stderr, writes the
/// results files, and returns the summary.
pub async fn run(config: Config) -> Result<Summary> {
    let started = Instant::now();
    let idle = idle::hold_shallow();
    let idle_states = match &idle {
        Ok(_) => {
            eprintln!("lock-bench: idle CPUs kept in their polling state (PM QoS 0 us)");
            "shallow (PM QoS 0 us held during the run)".to_owned()
        }
        Err(why) => {
            eprintln!(
                "lock-bench: idle CPUs may sleep deeply ({why}): wake-ups then cost tens of \
                 microseconds and the figures depend on how busy the machine is"
            );
            format!("as the machine has them ({why})")
        }
    };
    let ctx = Ctx::start(config.clone()).await?;
    let mut rows = Vec::new();
    let mut details = Map::new();
    let mut chart = None;
    let mut limits = Vec::new();
    let mut own_charts = Vec::new();
    let mut contention_done = false;
    for scenario in &config.scenarios {
        let name = format!("{scenario:?}").to_lowercase();
        let t = Instant::now();
        eprintln!("lock-bench: running {name} ...");
        let output: Output = match scenario {
            Scenario::S1 => scenarios::uncontended::run(&ctx).await,
            Scenario::S2 => scenarios::reentry::run(&ctx).await,
            Scenario::S3 | Scenario::S4 if contention_done => continue,
            Scenario::S3 | Scenario::S4 => {
                contention_done = true;
                let (s3, s4) = (config.wants(Scenario::S3), config.wants(Scenario::S4));
                scenarios::handoff::run(&ctx, s3, s4).await
            }
            Scenario::S5 => scenarios::many_keys::run(&ctx).await,
            Scenario::S6 => scenarios::watchdog::run(&ctx).await,
            Scenario::S7 => scenarios::memory::run(&ctx).await,
            Scenario::S8 => scenarios::crowd::run(&ctx, scenarios::crowd::Crowd::S8).await,
            Scenario::S9 => scenarios::crowd::run(&ctx, scenarios::crowd::Crowd::S9).await,
            Scenario::S10 => scenarios::retention::run(&ctx).await,
            Scenario::S11 => scenarios::cluster::run(&ctx).await,
            Scenario::S12 => scenarios::etcd::run(&ctx).await,
            Scenario::S13 => scenarios::zookeeper::run(&ctx).await,
            Scenario::S14 => scenarios::read_write::run(&ctx).await,
            Scenario::S15 => scenarios::transfers::run(&ctx).await,
            Scenario::S16 => scenarios::flash_sale::run(&ctx).await,
        }
        .with_context(|| format!("scenario {name}"))?;
        eprintln!(
            "lock-bench: {name} done in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        rows.extend(output.rows);
        limits.extend(output.limits);
        own_charts.extend(output.svgs);
        details.insert(name, output.detail);
        if let (Some(handoffs), Some(waits)) = (output.handoffs, output.waits) {
            chart = Some(charts::S3Charts {
                handoffs,
                waits,
                ping_p50: output.ping_p50,
            });
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let table = report::table(&rows);

    std::fs::create_dir_all(&config.out_dir)
        .with_context(|| format!("create {}", config.out_dir.display()))?;
    let mut svg_paths = match &chart {
        Some(c) => charts::write(&config.out_dir, c, config.quick)?,
        None => Vec::new(),
    };
    if !limits.is_empty() {
        svg_paths.push(charts::write_limits(
            &config.out_dir,
            &limits,
            config.quick,
        )?);
    }
    for (name, svg) in own_charts {
        let path = config.out_dir.join(name);
        std::fs::write(&path, svg).with_context(|| format!("write {}", path.display()))?;
        svg_paths.push(path);
    }
    let json_path = config.out_dir.join("results.json");
    let results = json!({
        "machine": {
            "cores": std::thread::available_parallelism().map_or(1, usize::from),
            "redis_version": ctx.lock_server.version(),
            "idle_states": idle_states,
        },
        "quick": config.quick,
        "runs": config.runs,
        "seconds": seconds,
        "rows": rows.iter().map(Row::to_json).collect::<Vec<_>>(),
        "scenarios": Value::Object(details),
    });
    std::fs::write(&json_path, serde_json::to_string_pretty(&results)?)
        .with_context(|| format!("write {}", json_path.display()))?;
    Ok(Summary {
        rows,
        table,
        json_path,
        svg_paths,
        seconds,
    })
}
