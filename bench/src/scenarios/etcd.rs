//! S12: S1 and S3 on etcd (one member, its data directory in memory),
//! beside Redis in the same run, against etcd's own round trip.
//!
//! S1 on etcd is two round trips (the acquire transaction, the release's
//! delete), so it is compared with two sequential `Get`s of one key on the
//! runtime's own channel (`LockRuntime::ping` on etcd), and with a plain
//! put and delete of one key (two raft writes: what any lock on etcd
//! costs at least, a read being cheaper than a write there). S3's contention runs
//! (eight workers in two processes on one key) alternate etcd and Redis
//! (the default builder on each), and etcd's wait p99 is compared with ten
//! etcd round trips. `etcdctl lock NAME true` per call is reported as the
//! peer's figure: it starts a process and a session per lock, so it shows
//! what the CLI costs, not what etcd's recipe could do.
//!
//! The data directory lives in memory (`/dev/shm`): every write here skips
//! the fsync a disk would make it wait for, and etcd on real disks is
//! slower by about one fsync per write.

use anyhow::{Context, Result};
use lock_runtime::LockRuntime;
use serde_json::json;

use super::baseline::{lock_unlock, runtime_pings, timed};
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
/// `etcdctl lock` calls timed per run.
const ETCDCTL_CALLS: usize = 10;

/// `etcdctl lock <name> true` (lock, run `true`, unlock, exit), `n` times.
async fn etcdctl_calls(endpoint: &str, name: &str, n: usize) -> Result<Samples> {
    let etcdctl = lock_testkit::etcd::etcdctl_binary()?;
    timed(n, || async {
        let status = tokio::process::Command::new(&etcdctl)
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", endpoint, "lock", name, "true"])
            .stdout(std::process::Stdio::null())
            .status()
            .await
            .context("run etcdctl lock")?;
        anyhow::ensure!(status.success(), "etcdctl lock failed: {status}");
        Ok(())
    })
    .await
}

/// A put and a delete of `key` (the two writes any lock on etcd makes),
/// `n` times.
async fn put_delete(client: &etcd_client::Client, key: &str, n: usize) -> Result<Samples> {
    timed(n, || async {
        let mut kv = client.kv_client();
        kv.put(key, "", None).await?;
        kv.delete(key, None).await?;
        anyhow::Ok(())
    })
    .await
}

/// Runs S12.
pub async fn run(ctx: &Ctx) -> Result<Output> {
    let etcd = ctx.etcd()?;
    let runtime = LockRuntime::builder()
        .etcd(etcd.endpoints())
        .key_prefix(PREFIX)
        .build()
        .await?;
    let client = etcd_client::Client::connect(etcd.endpoints(), None).await?;
    let blocks = ctx.scale().s1_ops.div_ceil(BLOCK).max(1);
    let (mut s1_p50, mut rtt2_p50, mut rtt_p50, mut ctl_p50) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut writes_p50 = Vec::new();
    let (mut etcd_runs, mut redis_runs) = (Vec::new(), Vec::new());
    for run in 0..ctx.runs() {
        let key = format!("s12:{run}");
        lock_unlock(&runtime, &key, WARMUP).await?;
        runtime_pings(&runtime, WARMUP, 2).await?;
        let plain_key = format!("{PREFIX}s12-plain:{run}");
        put_delete(&client, &plain_key, WARMUP).await?;
        let (mut locked, mut two, mut one) = (Vec::new(), Vec::new(), Vec::new());
        let mut writes = Vec::new();
        for _ in 0..blocks {
            locked.extend_from_slice(lock_unlock(&runtime, &key, BLOCK).await?.sorted());
            two.extend_from_slice(runtime_pings(&runtime, BLOCK, 2).await?.sorted());
            one.extend_from_slice(runtime_pings(&runtime, BLOCK, 1).await?.sorted());
            writes.extend_from_slice(put_delete(&client, &plain_key, BLOCK).await?.sorted());
        }
        writes_p50.push(Samples::new(writes).p50());
        s1_p50.push(Samples::new(locked).p50());
        rtt2_p50.push(Samples::new(two).p50());
        rtt_p50.push(Samples::new(one).p50());
        let name = format!("s12-etcdctl-{run}");
        ctl_p50.push(
            etcdctl_calls(&etcd.endpoint(0), &name, ETCDCTL_CALLS)
                .await?
                .p50(),
        );
        let shape = ctx.scale().s3;
        etcd_runs.push(contention::contend(ctx, Library::OursEtcd, shape, "s12", run).await?);
        redis_runs.push(contention::contend(ctx, Library::OursDefault, shape, "s12", run).await?);
    }
    let m = median;
    let (rate, spread) = (Run::rate, Run::spread);
    let (wait_p99, wait_max) = (Run::wait_p99_ms, Run::wait_max_ms);
    let med = |v: &[f64]| crate::stats::median(v.to_vec());
    let rtt_ms = med(&rtt_p50) / 1000.0;
    let rows = vec![
        Row::new("S12", "S1 lock+unlock p50 on etcd (us)", med(&s1_p50))
            .vs("2 etcd round trips", med(&rtt2_p50))
            .target(Target::RatioAtMost(1.3)),
        Row::new(
            "S12",
            "S1 lock+unlock p50 on etcd (us), vs writes",
            med(&s1_p50),
        )
        .vs("a put + a delete", med(&writes_p50))
        .target(Target::Info),
        Row::new("S12", "etcd round trip p50 (us)", med(&rtt_p50)).target(Target::Info),
        Row::new(
            "S12",
            "etcdctl lock NAME true, per call (us)",
            med(&ctl_p50),
        )
        .vs("our S1 on etcd", med(&s1_p50))
        .target(Target::Info),
        Row::new("S12", "S3 acquisitions/s on etcd", m(&etcd_runs, rate))
            .vs("Redis, default builder", m(&redis_runs, rate))
            .target(Target::Info),
        Row::new("S12", "S3 wait p99 on etcd (ms)", m(&etcd_runs, wait_p99))
            .vs("10 etcd round trips", 10.0 * rtt_ms)
            .target(Target::RatioAtMost(1.0)),
        Row::new("S12", "S3 wait max on etcd (ms)", m(&etcd_runs, wait_max))
            .vs("Redis, default builder", m(&redis_runs, wait_max))
            .target(Target::Info),
        Row::new("S12", "S3 busiest / idlest on etcd", m(&etcd_runs, spread))
            .vs("Redis, default builder", m(&redis_runs, spread))
            .target(Target::Info),
        Row::new(
            "S12",
            "S3 |counter - acq| + failures, etcd, worst",
            worst(&etcd_runs, |r| r.counter_error() + r.failures()),
        )
        .target(Target::Exactly(0.0)),
    ];
    let detail = json!({
        "members": 1,
        "data_dir": "in memory (/dev/shm)",
        "s1_p50_us": s1_p50,
        "two_round_trips_p50_us": rtt2_p50,
        "put_delete_p50_us": writes_p50,
        "round_trip_p50_us": rtt_p50,
        "etcdctl_lock_p50_us": ctl_p50,
        "s3_etcd": etcd_runs.iter().map(Run::to_json).collect::<Vec<_>>(),
        "s3_redis": redis_runs.iter().map(Run::to_json).collect::<Vec<_>>(),
    });
    Ok(Output {
        rows,
        detail,
        ..Output::default()
    })
}
