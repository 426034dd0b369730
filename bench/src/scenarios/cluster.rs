//! S11: S1 and S3 on a 3-master Redis Cluster, beside the single server in
//! the same run.
//!
//! Uncontended lock + unlock is timed in interleaved blocks on a runtime
//! connected to the single server and on one connected to the cluster
//! (each key's lock lives on one master, so the round trips are the same
//! two; the cluster client adds its routing). The contention runs are S3's
//! (eight workers in two processes on one key), alternating the single
//! server and the cluster, so the two are compared under the same load.

use anyhow::Result;
use lock_runtime::LockRuntime;
use serde_json::json;

use super::baseline::lock_unlock;
use super::contention;
use super::figures::{median, worst, Run};
use super::{Ctx, Output, PREFIX};
use crate::report::{Row, Target};
use crate::stats::Samples;
use crate::worker::Library;

/// Operations per kind in one block.
const BLOCK: usize = 100;
/// Unmeasured operations per kind before each run.
const WARMUP: usize = 50;

/// Runs S11.
pub async fn run(ctx: &Ctx) -> Result<Output> {
    let cluster = LockRuntime::builder()
        .redis_cluster(ctx.cluster()?.urls())
        .key_prefix(PREFIX)
        .build()
        .await?;
    let blocks = ctx.scale().s1_ops.div_ceil(BLOCK).max(1);
    let (mut single_p50, mut cluster_p50) = (Vec::new(), Vec::new());
    let (mut single_runs, mut cluster_runs) = (Vec::new(), Vec::new());
    for run in 0..ctx.runs() {
        let key = format!("s11:{run}");
        lock_unlock(&ctx.runtime, &key, WARMUP).await?;
        lock_unlock(&cluster, &key, WARMUP).await?;
        let (mut single, mut clustered) = (Vec::new(), Vec::new());
        for _ in 0..blocks {
            single.extend_from_slice(lock_unlock(&ctx.runtime, &key, BLOCK).await?.sorted());
            clustered.extend_from_slice(lock_unlock(&cluster, &key, BLOCK).await?.sorted());
        }
        single_p50.push(Samples::new(single).p50());
        cluster_p50.push(Samples::new(clustered).p50());
        let shape = ctx.scale().s3;
        single_runs.push(contention::contend(ctx, Library::Ours, shape, "s11", run).await?);
        cluster_runs.push(contention::contend(ctx, Library::OursCluster, shape, "s11", run).await?);
    }
    let m = median;
    let (rate, spread) = (Run::rate, Run::spread);
    let (wait_p99, wait_max) = (Run::wait_p99_ms, Run::wait_max_ms);
    let (single, clustered) = (&single_runs, &cluster_runs);
    let single_s1 = crate::stats::median(single_p50.clone());
    let rows = vec![
        Row::new(
            "S11",
            "S1 lock+unlock p50 on a cluster (us)",
            crate::stats::median(cluster_p50.clone()),
        )
        .vs("single server", single_s1)
        .target(Target::RatioAtMost(1.25)),
        Row::new("S11", "S3 acquisitions/s on a cluster", m(clustered, rate))
            .vs("single server", m(single, rate)),
        Row::new(
            "S11",
            "S3 wait p99 on a cluster (ms)",
            m(clustered, wait_p99),
        )
        .vs("single server", m(single, wait_p99)),
        Row::new(
            "S11",
            "S3 wait max on a cluster (ms)",
            m(clustered, wait_max),
        )
        .vs("single server", m(single, wait_max)),
        Row::new(
            "S11",
            "S3 busiest / idlest on a cluster",
            m(clustered, spread),
        )
        .vs("single server", m(single, spread)),
        Row::new(
            "S11",
            "S3 |counter - acq| + failures, cluster, worst",
            worst(clustered, |r| r.counter_error() + r.failures()),
        )
        .target(Target::Exactly(0.0)),
    ];
    let detail = json!({
        "masters": 3,
        "s1_p50_us": { "single": single_p50, "cluster": cluster_p50 },
        "s3_single": single.iter().map(Run::to_json).collect::<Vec<_>>(),
        "s3_cluster": clustered.iter().map(Run::to_json).collect::<Vec<_>>(),
    });
    Ok(Output {
        rows,
        detail,
        ..Output::default()
    })
}
