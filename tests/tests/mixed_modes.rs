#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Fair and plain mode on one key. Fair processes hand the key straight to
//! the next queued process, so it is never free for a plain process's
//! attempt: a plain waiter that sees such a handoff queues in the key's fair
//! queue too, and gets its turns. (A plain caller that finds the key free
//! takes it at once, past any fair waiter: that is what plain mode is.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{with_lock, LockError, LockRuntime};
use lock_tests::{redis, unique, Occupancy};
use tokio::time::Instant;

async fn runtime(prefix: &str, fair: bool) -> LockRuntime {
    LockRuntime::builder()
        .redis(redis().url())
        .key_prefix(prefix)
        .fair(fair)
        .build()
        .await
        .expect("build the lock runtime")
}

/// Two fair processes and one plain process, two tasks each, take one key
/// in a loop for two seconds (each body a short await). The plain process
/// gets a fair share of the bodies (before, it got almost none: 0-4 against
/// ~1,700 each), and nobody overlaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_process_on_a_key_fair_processes_use_gets_its_turns() {
    let prefix = unique("mixed");
    let runtimes = [
        runtime(&prefix, true).await,
        runtime(&prefix, true).await,
        runtime(&prefix, false).await,
    ];
    let occupancy = Arc::new(Occupancy::new());
    let counts: Arc<[AtomicU64; 3]> = Arc::new(Default::default());
    let end = Instant::now() + Duration::from_secs(2);
    let mut tasks = Vec::new();
    for (i, runtime) in runtimes.iter().enumerate() {
        for _ in 0..2 {
            let (runtime, occupancy, counts) = (runtime.clone(), occupancy.clone(), counts.clone());
            tasks.push(tokio::spawn(async move {
                while Instant::now() < end {
                    let request = runtime.lock("k").wait(Duration::from_secs(10));
                    with_lock(request, async {
                        let _inside = occupancy.enter();
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        counts[i].fetch_add(1, Ordering::Relaxed);
                        Ok::<_, LockError>(())
                    })
                    .await
                    .unwrap();
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let counts: Vec<u64> = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    assert_eq!(occupancy.max(), 1, "two holders at once");
    let fair_mean = (counts[0] + counts[1]) / 2;
    assert!(
        counts[2] * 4 >= fair_mean,
        "the plain process hardly got the key: {counts:?} (fair, fair, plain)"
    );
}
