//! Mutual exclusion: tasks, `join!` arms and OS processes never share a key.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use lock_runtime::{with_lock, LockError};
use lock_tests::{
    contender_bin, count_under_lock, on_every_backend, redis, unique, Kind, Occupancy,
};
use redis::AsyncCommands;

on_every_backend!(
    counter_under_lock_is_exact_with_many_tasks,
    join_of_two_top_level_calls_excludes
);

/// A non-atomic read-modify-write (load, yield, store) by 16 tasks × 50
/// rounds loses updates without the lock; under it the total is exact.
async fn counter_under_lock_is_exact_with_many_tasks(kind: Kind) {
    let prefix = unique("excl");
    let runtime = kind.runtime(&prefix).await;
    // Half the tasks use their own runtime, as separate processes would.
    let mut runtimes = Vec::new();
    for t in 0..16 {
        runtimes.push(if t % 2 == 0 {
            runtime.clone()
        } else {
            kind.peer(&runtime, &prefix).await
        });
    }
    let (count, most_inside) = count_under_lock(&runtimes, "counter", 16, 50).await;
    assert_eq!(count, 16 * 50);
    assert_eq!(most_inside, 1, "two holders were inside at once");
    assert_eq!(runtime.stats().held, 0);
}

/// Both arms of a `join!` are separate owners: they take turns.
async fn join_of_two_top_level_calls_excludes(kind: Kind) {
    let runtime = kind.runtime(&unique("join")).await;
    let occupancy = Occupancy::default();
    let body = || async {
        let _inside = occupancy.enter();
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok::<_, LockError>(())
    };
    let start = Instant::now();
    let (a, b) = tokio::join!(
        with_lock(runtime.lock("pair"), body()),
        with_lock(runtime.lock("pair"), body())
    );
    a.unwrap();
    b.unwrap();
    assert_eq!(occupancy.max(), 1);
    assert!(
        start.elapsed() >= Duration::from_millis(200),
        "the arms overlapped"
    );
}

/// Three OS processes each add 100 to a Redis counter with GET then SET under
/// the lock; the total is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_is_exact_across_three_processes() {
    let server = redis();
    let prefix = unique("procs");
    let counter_key = unique("procs-counter");
    let mut children = Vec::new();
    for _ in 0..3 {
        children.push(
            tokio::process::Command::new(contender_bin!())
                .args([
                    &server.url(),
                    &prefix,
                    "count",
                    "shared",
                    &counter_key,
                    "100",
                ])
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .expect("spawn contender"),
        );
    }
    for child in children {
        let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .expect("contender finished within 60 s")
            .expect("contender output");
        assert!(out.status.success(), "contender failed: {out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "done");
    }
    let mut con = server.connection().await;
    let total: u64 = con.get(&counter_key).await.unwrap();
    assert_eq!(total, 300);
}
