//! The physical limit every ratio is taken against: round trips.
//!
//! A round trip is measured as a `PING` on the same kind of connection the
//! library under test uses: [`LockRuntime::ping`] goes over the runtime's own
//! connection (the path of its lock scripts), and a plain redis-rs
//! multiplexed connection is what rslock and the raw-script baseline use.

use std::future::Future;

use anyhow::Result;
use lock_runtime::{with_lock, LockError, LockRuntime};
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use super::us;
use crate::stats::Samples;

/// Times `n` sequential calls of `op` (µs each).
pub async fn timed<F, Fut>(n: usize, mut op: F) -> Result<Samples>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        op().await?;
        samples.push(us(start.elapsed()));
    }
    Ok(Samples::new(samples))
}

/// Lock + unlock of `key` on `runtime`, `n` times, each call timed (the
/// uncontended figure of every backend's scenario).
pub async fn lock_unlock(runtime: &LockRuntime, key: &str, n: usize) -> Result<Samples> {
    timed(n, || async {
        with_lock(runtime.lock(key), async { Ok::<_, LockError>(()) }).await?;
        anyhow::Ok(())
    })
    .await
}

/// `pings` sequential PINGs per sample, on the runtime's connection.
pub async fn runtime_pings(runtime: &LockRuntime, n: usize, pings: usize) -> Result<Samples> {
    timed(n, || async {
        for _ in 0..pings {
            runtime.ping().await?;
        }
        Ok(())
    })
    .await
}

/// `pings` sequential PINGs per sample, on a plain multiplexed connection.
pub async fn plain_pings(con: &MultiplexedConnection, n: usize, pings: usize) -> Result<Samples> {
    timed(n, || {
        let mut con = con.clone();
        async move {
            for _ in 0..pings {
                let _: String = redis::cmd("PING").query_async(&mut con).await?;
            }
            Ok(())
        }
    })
    .await
}

/// Unmeasured PINGs before a PING baseline (connection and caches warm).
const WARMUP: usize = 50;

/// p50 of single PINGs on the runtime's connection, after a warm-up.
pub async fn runtime_ping_p50(runtime: &LockRuntime, n: usize) -> Result<f64> {
    runtime_pings(runtime, WARMUP, 1).await?;
    Ok(runtime_pings(runtime, n, 1).await?.p50())
}

/// p50 of single PINGs on a plain multiplexed connection, after a warm-up.
pub async fn plain_ping_p50(con: &MultiplexedConnection, n: usize) -> Result<f64> {
    plain_pings(con, WARMUP, 1).await?;
    Ok(plain_pings(con, n, 1).await?.p50())
}
