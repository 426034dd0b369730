#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A separate OS process that competes for locks, for the cross-process tests.
//!
//! Usage:
//!   contender <redis-url> <prefix> count <key> <counter-key> <n>
//!       n times: lock <key>, GET <counter-key>, SET it to value + 1, unlock;
//!       prints `done` at the end.
//!   contender <redis-url> <prefix> hold <key> <lease-ms>
//!       takes <key> with that lease, prints `held <fence>`, and waits forever
//!       (the test kills it).

use std::time::Duration;

use lock_runtime::{with_lock, LockError, LockRuntime};
use redis::AsyncCommands;

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
    #[error("usage: contender <url> <prefix> (count <key> <counter> <n> | hold <key> <lease-ms>)")]
    Usage,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, prefix, mode, rest @ ..] = args.as_slice() else {
        return Err(Error::Usage);
    };
    let runtime = LockRuntime::builder()
        .redis(url.as_str())
        .key_prefix(prefix.as_str())
        .build()
        .await?;
    match (mode.as_str(), rest) {
        ("count", [key, counter, n]) => {
            let n: u64 = n.parse().map_err(|_| Error::Usage)?;
            let client = redis::Client::open(url.as_str())?;
            let con = client.get_multiplexed_async_connection().await?;
            for _ in 0..n {
                let mut con = con.clone();
                with_lock(runtime.lock(key.as_str()), async {
                    let value: u64 = con
                        .get::<_, Option<u64>>(counter.as_str())
                        .await?
                        .unwrap_or(0);
                    tokio::task::yield_now().await;
                    let () = con.set(counter.as_str(), value + 1).await?;
                    Ok::<_, Error>(())
                })
                .await?;
            }
            println!("done");
            Ok(())
        }
        ("hold", [key, lease_ms]) => {
            let lease: u64 = lease_ms.parse().map_err(|_| Error::Usage)?;
            let guard = runtime
                .lock(key.as_str())
                .lease(Duration::from_millis(lease))
                .acquire()
                .await?;
            println!("held {}", guard.fence());
            std::future::pending::<()>().await;
            Ok(())
        }
        _ => Err(Error::Usage),
    }
}
