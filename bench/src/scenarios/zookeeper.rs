//! S13: S1, S3/S4 and S5 on ZooKeeper (one standalone server of
//! lock-testkit), beside Redis in the same run, against ZooKeeper's own
//! round trip, with Apache Curator's `InterProcessMutex` (the lock the JVM
//! services around ZooKeeper take) as the peer.
//!
//! - **S1**: an uncontended lock + unlock is two round trips on ZooKeeper
//!   (the create of our node, pipelined with the listing of its siblings;
//!   then the delete), so it is compared with two sequential `exists` on
//!   the runtime's own session (`LockRuntime::ping` on ZooKeeper), and with
//!   a create + delete of an ephemeral node on a plain `zookeeper-client`
//!   (the two writes any lock on ZooKeeper makes). Curator's acquire +
//!   release is compared with two `checkExists` on its own client, in a JVM
//!   warmed up first (its recipe sends three requests one after the other:
//!   create, list, delete).
//! - **S3/S4**: eight workers in two processes on one key (S3's worker and
//!   body), ours, then Curator's Java loop, then Redis with the default
//!   builder, once per run. Wait p99 is compared with ten ZooKeeper round
//!   trips, as S12 does on etcd; S4 is the requests the server received
//!   per acquisition (`mntr`'s `zk_packets_received`, session pings of the
//!   few idle clients included).
//! - **S5**: 64 tasks over 10,000 keys for S5's time, against the recipe's
//!   requests sent with no library around them (create + list pipelined,
//!   the lock path made on `NoNode`, delete: what our backend sends) on one
//!   plain client at the same concurrency, and against Curator with 64
//!   threads.
//!
//! The server is lock-testkit's: a JVM with a small heap and the C1
//! compiler only (quick to start), a 200 ms tick, the data directory in
//! memory (`/dev/shm`, so a write's fsync costs nothing). A production
//! server writes its log to a disk and waits for its fsync on every write.

use anyhow::{Context, Result};
use lock_runtime::LockRuntime;
use serde_json::json;
use tokio::time::Instant;
use zookeeper_client::{Acls, Client, CreateMode};

use super::baseline::{lock_unlock, runtime_pings, timed};
use super::contention::{self, requests_received};
use super::figures::{median, worst, Run};
use super::many_keys::{self, KEYS, TASKS};
use super::{zookeeper_keys, Ctx, Output};
use crate::curator;
use crate::report::{Row, Target};
use crate::stats::{median_of, Samples};
use crate::worker::Library;

/// Operations per kind in one block.
const BLOCK: usize = 100;
/// Unmeasured operations per kind before each run.
const WARMUP: usize = 50;
/// Unmeasured Curator pairs before its S1 (the JIT compiles the hot paths).
const CURATOR_WARMUP: usize = 200;
/// The key prefix of this scenario's runtime (a ZooKeeper path).
const PREFIX: &str = "/bench/";

/// The figures of one run's S1 and S5 (µs, and operations per second).
#[derive(Default)]
struct Uncontended {
    lock_p50: f64,
    lock_p99: f64,
    rtt2_p50: f64,
    rtt2_p99: f64,
    rtt_p50: f64,
    writes_p50: f64,
    curator_p50: f64,
    curator_p99: f64,
    curator_rtt2_p50: f64,
    acquire_p50: f64,
    release_p50: f64,
    requests: f64,
    curator_requests: f64,
    s5_ours: f64,
    s5_raw: f64,
    s5_raw_busy: u64,
    s5_curator: f64,
    s5_curator_errors: u64,
}

impl Uncontended {
    fn to_json(&self) -> serde_json::Value {
        json!({
            "s1_p50_us": self.lock_p50, "s1_p99_us": self.lock_p99,
            "two_exists_p50_us": self.rtt2_p50, "two_exists_p99_us": self.rtt2_p99,
            "exists_p50_us": self.rtt_p50, "create_delete_p50_us": self.writes_p50,
            "curator_s1_p50_us": self.curator_p50, "curator_s1_p99_us": self.curator_p99,
            "curator_two_exists_p50_us": self.curator_rtt2_p50,
            "acquire_p50_us": self.acquire_p50, "release_p50_us": self.release_p50,
            "requests_per_lock_unlock": self.requests,
            "curator_requests_per_acquire_release": self.curator_requests,
            "s5_ours_ops_per_s": self.s5_ours, "s5_raw_ops_per_s": self.s5_raw,
            "s5_raw_busy": self.s5_raw_busy, "s5_curator_ops_per_s": self.s5_curator,
            "s5_curator_errors": self.s5_curator_errors,
        })
    }
}

/// `acquire()` and `release()` of `key` timed apart, `n` times each (where
/// S1's time goes).
async fn acquire_release(runtime: &LockRuntime, key: &str, n: usize) -> Result<(f64, f64)> {
    let (mut acquires, mut releases) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let start = Instant::now();
        let guard = runtime.lock(key).acquire().await?;
        let acquired = Instant::now();
        guard.release().await?;
        acquires.push(super::us(acquired - start));
        releases.push(super::us(acquired.elapsed()));
    }
    Ok((Samples::new(acquires).p50(), Samples::new(releases).p50()))
}

/// A create and a delete of the ephemeral node `path` (the two writes any
/// lock on ZooKeeper makes), `n` times.
async fn create_delete(client: &Client, path: &str, n: usize) -> Result<Samples> {
    let ephemeral = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
    timed(n, || async {
        client.create(path, &[], &ephemeral).await?;
        client.delete(path, None).await?;
        anyhow::Ok(())
    })
    .await
}

/// S1 of one run: ours, the round trips, the writes and Curator's (in its
/// own process, started and warmed up first) in interleaved blocks.
async fn s1(ctx: &Ctx, runtime: &LockRuntime, plain: &Client, run: usize) -> Result<Uncontended> {
    let blocks = ctx.scale().s13_ops.div_ceil(BLOCK).max(1);
    let key = format!("s13:{run}");
    let plain_path = format!("/s13-plain:{run}");
    let connect = ctx.zookeeper()?.connect_string();
    let curator_path = format!("{PREFIX}s13-curator:{run}");
    let out = &ctx.config.out_dir;
    let mut curator =
        curator::Uncontended::start(out, &connect, &curator_path, CURATOR_WARMUP, BLOCK).await?;
    lock_unlock(runtime, &key, WARMUP).await?;
    runtime_pings(runtime, WARMUP, 2).await?;
    create_delete(plain, &plain_path, WARMUP).await?;
    let (mut locked, mut two, mut one, mut writes) = (vec![], vec![], vec![], vec![]);
    let (mut peer, mut peer_two) = (vec![], vec![]);
    // Requests the server received during our blocks and Curator's (the
    // idle clients' session pings included: a few per second).
    let zookeeper = ctx.zookeeper()?;
    let (mut requests, mut curator_requests) = (0, 0);
    for _ in 0..blocks {
        let before = requests_received(zookeeper).await?;
        locked.extend_from_slice(lock_unlock(runtime, &key, BLOCK).await?.sorted());
        requests += requests_received(zookeeper).await?.saturating_sub(before);
        two.extend_from_slice(runtime_pings(runtime, BLOCK, 2).await?.sorted());
        one.extend_from_slice(runtime_pings(runtime, BLOCK, 1).await?.sorted());
        writes.extend_from_slice(create_delete(plain, &plain_path, BLOCK).await?.sorted());
        let before = requests_received(zookeeper).await?;
        let (pairs, exists2) = curator.block().await?;
        // Less the block's `checkExists`, two per sample.
        let received = requests_received(zookeeper).await?.saturating_sub(before);
        curator_requests += received.saturating_sub(2 * exists2.len() as u64);
        peer.extend(pairs);
        peer_two.extend(exists2);
    }
    drop(curator);
    let (locked, two) = (Samples::new(locked), Samples::new(two));
    let (acquire_p50, release_p50) = acquire_release(runtime, &key, BLOCK).await?;
    let peer = Samples::new(peer);
    Ok(Uncontended {
        lock_p50: locked.p50(),
        lock_p99: locked.p99(),
        rtt2_p50: two.p50(),
        rtt2_p99: two.p99(),
        rtt_p50: Samples::new(one).p50(),
        writes_p50: Samples::new(writes).p50(),
        curator_p50: peer.p50(),
        curator_p99: peer.p99(),
        curator_rtt2_p50: Samples::new(peer_two).p50(),
        acquire_p50,
        release_p50,
        requests: requests as f64 / (blocks * BLOCK) as f64,
        curator_requests: curator_requests as f64 / (blocks * BLOCK) as f64,
        ..Uncontended::default()
    })
}

/// S5 of one run (ours, the raw requests, Curator), into `figures`.
async fn s5(
    ctx: &Ctx,
    (runtime, plain): (&LockRuntime, &Client),
    run: usize,
    figures: &mut Uncontended,
) -> Result<()> {
    let duration = ctx.scale().s5_duration;
    let ours = many_keys::lock_ops_per_second(runtime, &format!("s13-s5:{run}"), duration).await?;
    let raw_paths = format!("{PREFIX}s13-raw:{run}");
    let (raw, raw_busy) = zookeeper_keys::raw(plain, &raw_paths, duration).await?;
    let connect = ctx.zookeeper()?.connect_string();
    let prefix = format!("{PREFIX}s13-curator-s5:{run}:");
    let out = &ctx.config.out_dir;
    let (curator, errors) = curator::many(out, &connect, &prefix, (TASKS, KEYS), duration).await?;
    figures.s5_ours = ours;
    (figures.s5_raw, figures.s5_raw_busy) = (raw, raw_busy);
    (figures.s5_curator, figures.s5_curator_errors) = (curator, errors);
    Ok(())
}

/// Runs S13.
pub async fn run(ctx: &Ctx) -> Result<Output> {
    let connect = ctx.zookeeper()?.connect_string();
    let runtime = LockRuntime::builder()
        .zookeeper(connect.as_str())
        .key_prefix(PREFIX)
        .build()
        .await?;
    let plain = Client::connect(&connect)
        .await
        .context("connect a plain zookeeper-client")?;
    let shape = ctx.scale().s13;
    let (mut figures, mut ours, mut peer, mut redis) = (vec![], vec![], vec![], vec![]);
    for run in 0..ctx.runs() {
        let mut uncontended = s1(ctx, &runtime, &plain, run).await?;
        s5(ctx, (&runtime, &plain), run, &mut uncontended).await?;
        figures.push(uncontended);
        ours.push(contention::contend(ctx, Library::OursZooKeeper, shape, "s13", run).await?);
        peer.push(contention::contend(ctx, Library::Curator, shape, "s13", run).await?);
        redis.push(contention::contend(ctx, Library::OursDefault, shape, "s13", run).await?);
    }
    let f = |field: fn(&Uncontended) -> f64| median_of(&figures, field);
    let rtt_ms = f(|u| u.rtt_p50) / 1000.0;
    let mut rows = vec![
        Row::new(
            "S13",
            "S1 lock+unlock p50 on ZooKeeper (us)",
            f(|u| u.lock_p50),
        )
        .vs("2 exists, runtime session", f(|u| u.rtt2_p50))
        .target(Target::RatioAtMost(1.3)),
        Row::new(
            "S13",
            "S1 lock+unlock p99 on ZooKeeper (us)",
            f(|u| u.lock_p99),
        )
        .vs("2 exists, p99", f(|u| u.rtt2_p99)),
        Row::new("S13", "S1 on ZooKeeper (us), vs writes", f(|u| u.lock_p50))
            .vs("a create + a delete", f(|u| u.writes_p50)),
        Row::new("S13", "ZooKeeper round trip p50 (us)", f(|u| u.rtt_p50)),
        Row::new("S13", "S1 requests per lock+unlock", f(|u| u.requests))
            .vs("Curator", f(|u| u.curator_requests)),
        Row::new("S13", "S1 ours / Curator, p50", f(|u| u.lock_p50))
            .vs("Curator", f(|u| u.curator_p50))
            .target(Target::RatioAtMost(1.0)),
        Row::new("S13 peer", "Curator S1 p50 (us)", f(|u| u.curator_p50))
            .vs("2 checkExists, its client", f(|u| u.curator_rtt2_p50)),
        Row::new("S13 peer", "Curator S1 p99 (us)", f(|u| u.curator_p99)),
    ];
    rows.extend(s3_rows(&ours, &peer, &redis, rtt_ms));
    rows.extend([
        Row::new(
            "S13",
            "S5 lock ops/s on ZooKeeper, 64 x 10k",
            f(|u| u.s5_ours),
        )
        .vs("the recipe's requests, plain client", f(|u| u.s5_raw))
        .target(Target::RatioAtLeast(0.6)),
        Row::new(
            "S13",
            "S5 ours / Curator, 64 tasks x 10k keys",
            f(|u| u.s5_ours),
        )
        .vs("Curator, 64 threads", f(|u| u.s5_curator)),
    ]);
    let detail = json!({
        "server": "standalone, lock-testkit (C1 JIT, -Xmx128m, tick 200 ms, data in /dev/shm)",
        "runs": figures.iter().map(Uncontended::to_json).collect::<Vec<_>>(),
        "s3_zookeeper": ours.iter().map(Run::to_json).collect::<Vec<_>>(),
        "s3_curator": peer.iter().map(Run::to_json).collect::<Vec<_>>(),
        "s3_redis": redis.iter().map(Run::to_json).collect::<Vec<_>>(),
    });
    Ok(Output {
        rows,
        detail,
        ..Output::default()
    })
}

/// The S3 and S4 rows: ours on ZooKeeper against its round trip, Curator
/// and Redis.
fn s3_rows(ours: &[Run], peer: &[Run], redis: &[Run], rtt_ms: f64) -> Vec<Row> {
    let m = median;
    let (rate, spread) = (Run::rate, Run::spread);
    let (wait_p99, wait_max) = (Run::wait_p99_ms, Run::wait_max_ms);
    let requests = |r: &Run| r.commands_per_acquisition;
    let failures = |r: &Run| r.counter_error() + r.failures();
    vec![
        Row::new("S13", "S3 acquisitions/s on ZooKeeper", m(ours, rate))
            .vs("Curator", m(peer, rate)),
        Row::new(
            "S13",
            "S3 acquisitions/s on ZooKeeper, vs Redis",
            m(ours, rate),
        )
        .vs("Redis, default builder", m(redis, rate)),
        Row::new(
            "S13",
            "S3 handoff p50 on ZooKeeper (us)",
            m(ours, Run::handoff_p50),
        )
        .vs("Curator", m(peer, Run::handoff_p50)),
        Row::new("S13", "S3 wait p99 on ZooKeeper (ms)", m(ours, wait_p99))
            .vs("10 ZooKeeper round trips", 10.0 * rtt_ms)
            .target(Target::RatioAtMost(1.0)),
        Row::new("S13", "S3 wait p99 ours / Curator (ms)", m(ours, wait_p99))
            .vs("Curator", m(peer, wait_p99)),
        Row::new("S13", "S3 wait max on ZooKeeper (ms)", m(ours, wait_max))
            .vs("Curator", m(peer, wait_max)),
        Row::new("S13", "S3 busiest / idlest on ZooKeeper", m(ours, spread))
            .vs("Curator", m(peer, spread)),
        Row::new(
            "S13",
            "S3 |counter - acq| + failures, ZooKeeper, worst",
            worst(ours, failures),
        )
        .target(Target::Exactly(0.0)),
        Row::new(
            "S13 peer",
            "S3 |counter - acq| + failures, Curator, worst",
            worst(peer, failures),
        ),
        Row::new(
            "S13",
            "S4 requests per acquisition on ZooKeeper",
            m(ours, requests),
        )
        .vs("Curator", m(peer, requests)),
    ]
}
