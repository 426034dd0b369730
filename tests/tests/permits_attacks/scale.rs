//! Many permits under contention: 64 on every backend, `MAX_PERMITS` on
//! the embedded store. Never more than N bodies inside, never two on one
//! index, every caller served within a bound, nothing left behind.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{permit, with_lock, LockError, LockRuntime, MAX_PERMITS};
use lock_tests::spawn::{join_within, spawn_acquire};
use lock_tests::{on_every_backend, poll_until, unique, Kind, Occupancy};
use tokio::time::Instant;

use super::settled;

on_every_backend!(sixty_four_permits_under_contention_hold_at_most_64_each_on_its_own_index);

/// `tasks` callers spread over `runtimes`, each making one call for one
/// of `n` permits of `key`, all at once, holding it `hold`: every body is
/// on an index below `n` that no other body is on, at most `n` are inside
/// at once, and all end within `limit`. Returns the most inside at once.
async fn contend(
    runtimes: &[LockRuntime],
    key: &str,
    n: u32,
    tasks: usize,
    hold: Duration,
    limit: Duration,
) -> u64 {
    let occupancy = Arc::new(Occupancy::new());
    let in_use = Arc::new(Mutex::new(HashSet::new()));
    let start = Arc::new(tokio::sync::Barrier::new(tasks));
    let mut spawned = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let rt = runtimes[t % runtimes.len()].clone();
        let (occupancy, in_use, start) = (occupancy.clone(), in_use.clone(), start.clone());
        let request = rt.lock(key).permits(n).wait(limit);
        spawned.push(tokio::spawn(async move {
            start.wait().await;
            with_lock(request, async {
                let _inside = occupancy.enter();
                let mine = permit().unwrap();
                assert!(mine < n, "permit {mine} of {n}");
                assert!(in_use.lock().unwrap().insert(mine), "two on permit {mine}");
                tokio::time::sleep(hold).await;
                in_use.lock().unwrap().remove(&mine);
                Ok::<_, LockError>(())
            })
            .await
            .unwrap();
        }));
    }
    join_within(spawned, limit, "permit callers").await;
    let most = occupancy.max();
    assert!(most <= u64::from(n), "{most} bodies inside {n} permits");
    most
}

/// "At most N, each on a permit of its own", at N = 64: 80 callers on two
/// clients want one of 64 permits at once (16 of them must wait for all
/// 64); never more than 64 inside, never two on one index, every caller
/// served within two minutes, and nothing left held or waiting.
async fn sixty_four_permits_under_contention_hold_at_most_64_each_on_its_own_index(kind: Kind) {
    let (runtime, peer) = kind.two("pa-64").await;
    let runtimes = [runtime.clone(), peer.clone()];
    let hold = Duration::from_millis(300);
    let limit = Duration::from_secs(120);
    let most = contend(&runtimes, "wide", 64, 80, hold, limit).await;
    assert!(most > 1, "the permits were used one at a time");
    settled(&runtime, 0).await;
    settled(&peer, 0).await;
}

/// The same at `MAX_PERMITS` (1024) on the embedded store: 1040 callers,
/// 16 of them waiting for all 1024 permits at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_permits_under_contention_on_the_embedded_store_hold_at_most_n_each_on_its_own_index() {
    let runtime = Kind::Memory.runtime(&unique("pa-max")).await;
    let hold = Duration::from_millis(500);
    let limit = Duration::from_secs(120);
    let tasks = MAX_PERMITS as usize + 16;
    let most = contend(
        std::slice::from_ref(&runtime),
        "widest",
        MAX_PERMITS,
        tasks,
        hold,
        limit,
    )
    .await;
    assert!(most > 1, "the permits were used one at a time");
    settled(&runtime, 0).await;
}

/// `MAX_PERMITS` on Redis, where each wait for a permit is a waiting key
/// of its own (a subscription, a fair place): every permit held by another
/// client, four callers wait for all 1024 at once; four permits freed
/// (spread over the range) go one to each waiter, within a bound, and
/// then nothing of the waiters is left waiting, nor queued in any
/// permit's queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_permits_on_redis_freed_one_by_one_go_one_to_each_waiter_and_leave_no_place() {
    let (runtime, peer) = Kind::Redis.two("pa-max-redis").await;
    let n = MAX_PERMITS;
    let mut held = super::block_all(&peer, "all", n).await;
    let wait = Duration::from_secs(120);
    let waiters: Vec<_> = (0..4)
        .map(|_| spawn_acquire(runtime.lock("all").permits(n).wait(wait)))
        .collect();
    let all_waiting = 4 * n as usize;
    poll_until(
        "four waits for every permit",
        Duration::from_secs(90),
        async || runtime.stats().waiting == all_waiting,
    )
    .await;
    let started = Instant::now();
    let mut freed = Vec::new();
    for index in [1023, 700, 5, 0] {
        freed.push(index);
        held.remove(index as usize).release().await.unwrap();
    }
    let mut got = Vec::new();
    for waiter in waiters {
        let ended = tokio::time::timeout(Duration::from_secs(30), waiter).await;
        let guard = ended.expect("a waiter hung").unwrap().1.unwrap();
        got.push(guard.permit().unwrap());
        held.push(guard);
    }
    eprintln!(
        "four waiters of 1024 permits served in {:?}",
        started.elapsed()
    );
    got.sort_unstable();
    freed.sort_unstable();
    assert_eq!(got, freed, "the waiters' permits are not the freed ones");
    settled(&runtime, 4).await;
    super::no_place_left(&peer, "all", n).await;
    super::release_all(held).await;
}
