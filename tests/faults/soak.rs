//! Mutual-exclusion soak: four processes, 32 tasks each, 16 keys.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use lock_testkit::RedisServer;
use lock_tests::unique;
use redis::AsyncCommands;
use tokio::time::Instant;

use crate::{ms, serial};

const PROCESSES: usize = 4;
const TASKS: usize = 32;
const KEYS: usize = 16;

/// Seconds to run: 5 by default, `LOCK_SOAK_SECS` for a long run.
fn soak_secs() -> u64 {
    std::env::var("LOCK_SOAK_SECS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(5)
}

/// 4 processes × 32 tasks lock random keys among 16 for `LOCK_SOAK_SECS`
/// (5 s by default). In each body an `INCR` occupancy counter must read 1
/// and a non-atomic GET/SET counter is bumped: no process ever sees two
/// holders, every per-key counter equals the sum the processes counted, and
/// every occupancy counter is back at 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_keep_sixteen_counters_exact() {
    let _turn = serial().await;
    let secs = soak_secs();
    let server = RedisServer::start();
    let prefix = unique("soak");
    let mut con = server.connection().await;

    let begun = Instant::now();
    let (tasks, keys, duration) = (TASKS.to_string(), KEYS.to_string(), secs.to_string());
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            tokio::process::Command::new(lock_tests::contender_bin!())
                .args([&server.url(), &prefix, "soak", &tasks, &keys, &duration])
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .expect("spawn contender")
        })
        .collect();
    let mut counted = vec![0u64; KEYS];
    let mut per_process = Vec::new();
    for child in children {
        let out = tokio::time::timeout(Duration::from_secs(secs + 60), child.wait_with_output())
            .await
            .expect("a soak contender did not finish within its time + 60 s")
            .expect("contender output");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "contender failed: {out:?}");
        let mut total = 0;
        let mut violations = None;
        for line in stdout.lines() {
            let words: Vec<&str> = line.split(' ').collect();
            match words.as_slice() {
                ["key", i, n] => {
                    let n: u64 = n.parse().unwrap();
                    counted[i.parse::<usize>().unwrap()] += n;
                    total += n;
                }
                ["violations", n] => violations = Some(n.parse::<u64>().unwrap()),
                ["done"] => {}
                _ => panic!("unexpected soak output {line:?}"),
            }
        }
        assert_eq!(
            violations,
            Some(0),
            "two holders inside one key at once: {stdout}"
        );
        per_process.push(total);
    }
    let took = begun.elapsed();

    let mut stored = Vec::new();
    for i in 0..KEYS {
        let count: Option<u64> = con.get(format!("{prefix}count:soak-{i}")).await.unwrap();
        let inside: Option<i64> = con.get(format!("{prefix}occ:soak-{i}")).await.unwrap();
        assert_eq!(
            inside.unwrap_or(0),
            0,
            "occupancy of soak-{i} left at {inside:?}"
        );
        stored.push(count.unwrap_or(0));
    }
    let total: u64 = counted.iter().sum();
    println!(
        "soak: {PROCESSES} processes x {TASKS} tasks on {KEYS} keys for {secs} s ({} ms with start-up): \
         {total} locked increments ({:.0}/s), per process {per_process:?}, per key {counted:?}, 0 violations",
        ms(took),
        total as f64 / secs as f64
    );
    assert_eq!(stored, counted, "a counter lost or gained updates");
    assert!(total > 0, "nothing was counted");
}
