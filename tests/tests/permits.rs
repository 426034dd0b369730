//! Permits (`permits = N`, `LockRequest::permits`): at most N calls hold a
//! key at once, across processes, each with a permit index of its own; a
//! waiter gets whichever permit is freed first; a nested call re-enters its
//! permit; each permit's token grows for each new holder; calls giving
//! different N share the low permits; a cancelled wait leaves nothing
//! behind; bad counts are refused before any wait, at run time and in the
//! attribute.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{distributed_lock, fence, permit, with_lock, LockError, LockGuard, LockRuntime};
use lock_tests::looked::{at_once, until_free};
use lock_tests::spawn::{join_within, spawn_acquire};
use lock_tests::{install_global, on_every_backend, unique, wait_until, Kind, Occupancy};

on_every_backend!(
    at_most_n_calls_hold_at_once_each_with_a_permit_of_its_own,
    a_process_passes_permits_between_its_own_tasks,
    with_every_permit_held_a_try_fails_and_a_waiter_gets_the_one_freed,
    a_nested_call_reenters_the_permit_its_caller_holds,
    each_permits_token_grows_for_each_new_holder,
    calls_giving_different_counts_share_the_low_permits,
    a_cancelled_wait_for_a_permit_leaves_every_permit_free,
);

/// Takes `n` permits of `key` on `runtime`, each at its first try.
async fn every_permit(runtime: &LockRuntime, key: &str, n: u32) -> Vec<LockGuard> {
    let mut guards = Vec::new();
    for _ in 0..n {
        let request = runtime.lock(key).permits(n);
        guards.push(at_once(request, "a permit is still free").await);
    }
    guards
}

/// Eight tasks in two clients, three permits: never more than three bodies
/// inside, never two on one permit, more than one inside at a time (the
/// permits are used side by side, not one after another), and each client
/// gets its share.
async fn at_most_n_calls_hold_at_once_each_with_a_permit_of_its_own(kind: Kind) {
    let (runtime, peer) = kind.two("permits-most").await;
    let occupancy = Arc::new(Occupancy::new());
    let in_use = Arc::new(Mutex::new(HashSet::new()));
    let holds = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for t in 0..8 {
        let rt = if t % 2 == 0 { &runtime } else { &peer }.clone();
        let (occupancy, in_use, holds) = (occupancy.clone(), in_use.clone(), holds.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..6 {
                let request = rt.lock("stock").permits(3).wait(Duration::from_secs(30));
                with_lock(request, async {
                    let _inside = occupancy.enter();
                    let mine = permit().expect("a permit in the body");
                    assert!(mine < 3, "permit {mine} of 3");
                    assert!(in_use.lock().unwrap().insert(mine), "two on permit {mine}");
                    holds.lock().unwrap().push(t % 2);
                    // The body's work, long enough for others to be inside too.
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    in_use.lock().unwrap().remove(&mine);
                    Ok::<_, LockError>(())
                })
                .await
                .unwrap();
            }
        }));
    }
    join_within(tasks, Duration::from_secs(120), "permit holders").await;
    let most = occupancy.max();
    assert!((2..=3).contains(&most), "{most} bodies inside at once");
    let holds = holds.lock().unwrap().clone();
    assert_eq!(holds.len(), 48);
    // (Plain mode lets the clients race: shares vary more.)
    let least = if std::env::var("LOCK_FAIR").is_ok_and(|v| v == "0") {
        24
    } else {
        6
    };
    for client in 0..2 {
        let share = holds.iter().filter(|&&c| c == client).count();
        assert!(
            share * least >= holds.len(),
            "client {client} got {share} of 48"
        );
    }
}

/// Short bodies of four tasks of one process on two permits: where the
/// backend passes holds between a process's tasks without a round trip
/// (Redis, Cluster, Sentinel: README, "lock cohorting"), permits are
/// passed so too; elsewhere nothing is.
async fn a_process_passes_permits_between_its_own_tasks(kind: Kind) {
    let runtime = kind.runtime(&unique("permits-pass")).await;
    let in_use = Arc::new(Mutex::new(HashSet::new()));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (rt, in_use) = (runtime.clone(), in_use.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let request = rt.lock("hot").permits(2).wait(Duration::from_secs(30));
                with_lock(request, async {
                    let mine = permit().expect("a permit in the body");
                    assert!(in_use.lock().unwrap().insert(mine), "two on permit {mine}");
                    tokio::task::yield_now().await;
                    in_use.lock().unwrap().remove(&mine);
                    Ok::<_, LockError>(())
                })
                .await
                .unwrap();
            }
        }));
    }
    join_within(tasks, Duration::from_secs(60), "permit holders").await;
    let passed = runtime.stats().passed_locally;
    if matches!(kind, Kind::Redis | Kind::Cluster | Kind::Sentinel) {
        assert!(passed > 0, "no permit passed between the process's tasks");
    } else {
        assert_eq!(passed, 0, "{kind:?} passes nothing");
    }
}

/// With every permit held, another client's try finds none; a waiter gets
/// the permit that is released, whichever it is, and holds it as the lock
/// of `key#i`.
async fn with_every_permit_held_a_try_fails_and_a_waiter_gets_the_one_freed(kind: Kind) {
    let (runtime, peer) = kind.two("permits-full").await;
    let mut guards = every_permit(&runtime, "pool", 3).await;
    let mut taken: Vec<u32> = guards.iter().map(|g| g.permit().unwrap()).collect();
    taken.sort_unstable();
    assert_eq!(taken, [0, 1, 2]);
    // Another client sees a holder on each permit, under the permit's key.
    let seen = peer.inspect_permits("pool", 3).await.unwrap();
    for (i, info) in seen.iter().enumerate() {
        let info = info
            .as_ref()
            .unwrap_or_else(|| panic!("permit {i} shows no holder"));
        let key = if i == 0 {
            "pool".to_owned()
        } else {
            format!("pool#{i}")
        };
        assert_eq!(info.key, key);
    }
    let tried = peer.lock("pool").permits(3).try_acquire().await.unwrap();
    assert!(
        tried.is_none(),
        "a fourth holder got {:?}",
        tried.map(|g| g.permit())
    );
    let before = peer.stats().waiting_keys;
    let waiter = spawn_acquire(peer.lock("pool").permits(3).wait(Duration::from_secs(20)));
    // Released once the waiter waits for every permit (not while it tries).
    wait_until("a wait for each permit", || {
        peer.stats().waiting_keys == before + 3
    })
    .await;
    let freed = guards.iter().position(|g| g.permit() == Some(1)).unwrap();
    guards.swap_remove(freed).release().await.unwrap();
    let (_, got) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was not woken by the freed permit")
        .unwrap();
    let got = got.unwrap();
    assert_eq!(got.permit(), Some(1));
    assert_eq!(got.key(), "pool#1");
    got.release().await.unwrap();
}

/// A call nested in a permit call's body, on the same key, re-enters the
/// caller's permit (same index, same token) instead of taking another,
/// however many times it is made (each starts its tries elsewhere);
/// meanwhile another permit stays free for another client.
async fn a_nested_call_reenters_the_permit_its_caller_holds(kind: Kind) {
    let (runtime, peer) = kind.two("permits-nest").await;
    with_lock(runtime.lock("seat").permits(3), async {
        let (outer, outer_token) = (permit().unwrap(), fence().unwrap());
        for _ in 0..4 {
            let inner = with_lock(runtime.lock("seat").permits(3), async {
                Ok::<_, LockError>((permit().unwrap(), fence().unwrap()))
            })
            .await?;
            assert_eq!(inner, (outer, outer_token));
        }
        let other = tokio::spawn(peer.lock("seat").permits(3).try_acquire());
        let other = other.await.unwrap()?.expect("the other permit is free");
        assert_ne!(other.permit(), Some(outer));
        other.release().await
    })
    .await
    .unwrap();
}

/// Each permit is fenced on its own: a new holder of a permit gets a token
/// above its previous holder's.
async fn each_permits_token_grows_for_each_new_holder(kind: Kind) {
    let (runtime, peer) = kind.two("permits-fence").await;
    let first = every_permit(&runtime, "slot", 2).await;
    let mut before = [0u64; 2];
    for guard in &first {
        before[guard.permit().unwrap() as usize] = guard.fence();
    }
    for guard in first {
        guard.release().await.unwrap();
    }
    until_free(&peer, "slot").await;
    until_free(&peer, "slot#1").await;
    for guard in every_permit(&peer, "slot", 2).await {
        let i = guard.permit().unwrap() as usize;
        assert!(
            guard.fence() > before[i],
            "permit {i}: {} after {}",
            guard.fence(),
            before[i]
        );
        guard.release().await.unwrap();
    }
}

/// Permit 0 is the key's ordinary lock, and a call with `permits = n`
/// takes one of the permits below n: with the ordinary lock held, a
/// one-permit call finds none and a two-permit call gets permit 1; with
/// permits 0 and 1 held, a three-permit call gets permit 2.
async fn calls_giving_different_counts_share_the_low_permits(kind: Kind) {
    let (runtime, peer) = kind.two("permits-mixed").await;
    let plain = at_once(runtime.lock("job"), "the key is free").await;
    assert_eq!(plain.permit(), None);
    let one = peer.lock("job").permits(1).try_acquire().await.unwrap();
    assert!(one.is_none(), "permit 0 is the ordinary lock, held");
    let second = at_once(peer.lock("job").permits(2), "permit 1 is free").await;
    assert_eq!(second.permit(), Some(1));
    let none = peer.lock("job").permits(2).try_acquire().await.unwrap();
    assert!(none.is_none(), "both permits below 2 are held");
    let third = at_once(peer.lock("job").permits(3), "permit 2 is free").await;
    assert_eq!(third.permit(), Some(2));
    for guard in [plain, second, third] {
        guard.release().await.unwrap();
    }
}

/// A wait for a permit, cancelled while every permit is held, takes none
/// and keeps no place: once the holders let go, another client takes every
/// permit.
async fn a_cancelled_wait_for_a_permit_leaves_every_permit_free(kind: Kind) {
    let (runtime, peer) = kind.two("permits-cancel").await;
    let held = every_permit(&runtime, "lane", 2).await;
    let waiting = peer
        .lock("lane")
        .permits(2)
        .wait(Duration::from_secs(30))
        .acquire();
    let cancelled = tokio::time::timeout(Duration::from_millis(300), waiting).await;
    assert!(
        cancelled.is_err(),
        "a permit was free: {:?}",
        cancelled.map(|g| g.map(|g| g.permit()))
    );
    for guard in held {
        guard.release().await.unwrap();
    }
    until_free(&peer, "lane").await;
    until_free(&peer, "lane#1").await;
    let again = every_permit(&runtime, "lane", 2).await;
    assert_eq!(again.len(), 2);
    for guard in again {
        guard.release().await.unwrap();
    }
}

/// Zero permits, more than `MAX_PERMITS`, and permits with a read or write
/// mode are refused at once, before any wait, naming what to change.
#[tokio::test]
async fn bad_permit_requests_are_refused_before_any_wait() {
    let runtime = Kind::Memory.runtime(&unique("permits-bad")).await;
    let _held = runtime.lock("k").acquire().await.unwrap();
    let too_many = lock_runtime::MAX_PERMITS + 1;
    for (request, says) in [
        (runtime.lock("k").permits(0), "out of range"),
        (runtime.lock("k").permits(too_many), "out of range"),
        (runtime.lock("k").permits(2).read(), "exclusive locks only"),
        (runtime.lock("k").permits(2).write(), "exclusive locks only"),
    ] {
        let refused = request.wait(Duration::from_secs(30)).acquire().await;
        match refused {
            Err(LockError::InvalidConfig(why)) => assert!(why.contains(says), "{why}"),
            other => panic!("not refused: {:?}", other.map(|g| g.permit())),
        }
    }
}

/// How many counters the stock of an item is split into, in the tests of
/// the attribute.
const SEGMENTS: u32 = 2;

/// Sells one unit of `sku` from the counter this call's permit names.
#[distributed_lock(key = "sku:<sku>", permits = SEGMENTS, wait = "10s")]
async fn sell(sku: u32, sold: Arc<Mutex<Vec<u32>>>) -> Result<u32, LockError> {
    let segment = permit().ok_or(LockError::NotInstalled)?;
    sold.lock().unwrap().push(segment);
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok(segment)
}

/// The same, with the count written as a literal.
#[distributed_lock(key = "sku:<sku>", permits = 2)]
async fn sell_literal(sku: u32) -> Result<Option<u32>, LockError> {
    Ok(permit())
}

/// `#[distributed_lock(permits = …)]` with a constant or a literal: the
/// body learns its permit, and two calls at once hold different ones.
#[tokio::test]
async fn the_attribute_takes_a_count_of_permits_and_the_body_learns_its_permit() {
    install_global(&unique("permits-attr")).await;
    let sold = Arc::new(Mutex::new(Vec::new()));
    let (a, b) = tokio::join!(sell(7, sold.clone()), sell(7, sold.clone()));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert!(a < SEGMENTS && b < SEGMENTS);
    assert_ne!(a, b, "two calls at once on one segment");
    let seen = sell_literal(8).await.unwrap();
    assert!(seen.is_some_and(|p| p < 2), "{seen:?}");
    assert_eq!(permit(), None);
}
