//! A permit acquire that goes away before it ends: cut at any poll, or
//! ended by `shutdown()`, it leaves no permit taken and no fair place.

use std::time::Duration;

use lock_runtime::{with_lock, LockError};
use lock_tests::looked::until_free;
use lock_tests::{on_every_backend, unique, wait_until, Kind};
use tokio::sync::oneshot;

use super::{
    all_free_at_once, block_all, cut_after, no_place_left, permit_keys, release_all, settled,
    Polled,
};

on_every_backend!(
    a_permit_acquire_cut_at_any_poll_takes_no_permit_and_keeps_no_place,
    shutdown_ends_a_wait_for_permits_and_a_permit_body_in_shut_down_and_leaves_nothing
        skip(memory = "the embedded store ends with its runtime: nobody is left to look"),
    shutdown_racing_the_tries_of_a_permit_acquire_leaves_nothing
        skip(memory = "the embedded store ends with its runtime: nobody is left to look"),
);

/// How many permits the cut acquires ask for.
const N: u32 = 3;

/// "A cancelled acquire's other waits end as a cancelled acquire's do":
/// a permit acquire dropped before its first poll, after its 1st, 2nd, ...
/// pending poll (a try's script in flight, between tries, registering its
/// N waits, asleep on all of them) takes nothing that stays. First with
/// every permit free (cut at every poll until one acquire finishes), then
/// with every permit held elsewhere (cut until it sleeps on all N): after
/// each cut the runtime counts nothing held or waiting, and no permit's
/// fair queue keeps a place; at the end, the holders let go and another
/// client takes all N permits at its first try (no ghost was handed one).
async fn a_permit_acquire_cut_at_any_poll_takes_no_permit_and_keeps_no_place(kind: Kind) {
    let (runtime, peer) = kind.two("pa-cut").await;
    let mut finished = false;
    for polls in 0..=200 {
        let acquire = runtime
            .lock("c")
            .permits(N)
            .wait(Duration::from_secs(10))
            .acquire();
        let patience = Duration::from_secs(5);
        if let Polled::Done(done) = cut_after(acquire, polls, patience, || false).await {
            let guard = done.unwrap();
            assert!(guard.permit().is_some_and(|p| p < N));
            guard.release().await.unwrap();
            finished = true;
            break;
        }
        for key in permit_keys("c", N) {
            until_free(&peer, &key).await;
        }
        settled(&runtime, 0).await;
    }
    assert!(finished, "no acquire of free permits finished in 200 polls");
    settled(&runtime, 0).await;
    all_free_at_once(&peer, "c", N).await;

    let blockers = block_all(&peer, "c", N).await;
    // (On the embedded store the blockers are this runtime's own holds.)
    let others = if kind == Kind::Memory { N as usize } else { 0 };
    let waits_for_all = || runtime.stats().waiting_keys == N as usize;
    let mut asleep = false;
    for polls in 0..=400 {
        let acquire = runtime
            .lock("c")
            .permits(N)
            .wait(Duration::from_secs(30))
            .acquire();
        let patience = Duration::from_millis(700);
        match cut_after(acquire, polls, patience, waits_for_all).await {
            Polled::Done(done) => panic!("every permit is held: {:?}", done.map(|g| g.permit())),
            Polled::Cut => {}
            Polled::Idle(false) => eprintln!(
                "{kind:?}: idle after {polls} polls, not waiting for all: {:?}",
                runtime.stats()
            ),
            Polled::Idle(true) => asleep = true,
        }
        settled(&runtime, others).await;
        no_place_left(&peer, "c", N).await;
        if asleep {
            eprintln!("{kind:?}: asleep on all {N} permits after {polls} polls");
            break;
        }
    }
    assert!(asleep, "no cut acquire ever slept on all {N} permits");
    release_all(blockers).await;
    all_free_at_once(&peer, "c", N).await;
}

/// "Shutdown ... exactly as for one key": `shutdown()` while a call waits
/// for all N permits (held by another client) and while another runs a
/// permit body ends both in `ShutDown` (bounded); the waiter's places are
/// gone from every permit's queue, the body's permit is free, and once the
/// holders let go every permit is free at once.
async fn shutdown_ends_a_wait_for_permits_and_a_permit_body_in_shut_down_and_leaves_nothing(
    kind: Kind,
) {
    let prefix = unique("pa-shut");
    let peer = kind.runtime(&prefix).await;
    let runtime = kind.runtime(&prefix).await;
    let blockers = block_all(&peer, "s", N).await;
    let waiting = tokio::spawn({
        let request = runtime.lock("s").permits(N).wait(Duration::from_secs(30));
        async move { request.acquire().await.map(|g| g.permit()) }
    });
    wait_until("a wait for every permit", || {
        runtime.stats().waiting_keys == N as usize
    })
    .await;
    let (inside_tx, inside_rx) = oneshot::channel();
    let body = tokio::spawn(with_lock(runtime.lock("b").permits(2), async move {
        inside_tx.send(lock_runtime::permit()).unwrap();
        tokio::time::sleep(Duration::from_secs(30)).await;
        Ok::<_, LockError>(())
    }));
    let inside = inside_rx.await.unwrap();
    assert!(inside.is_some_and(|p| p < 2), "{inside:?}");
    let _ = runtime.shutdown().await;
    let ended = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("a wait for permits outlived shutdown")
        .unwrap();
    assert!(matches!(ended, Err(LockError::ShutDown)), "{ended:?}");
    let ended = tokio::time::timeout(Duration::from_secs(5), body)
        .await
        .expect("a permit body outlived shutdown")
        .unwrap();
    assert!(matches!(ended, Err(LockError::ShutDown)), "{ended:?}");
    no_place_left(&peer, "s", N).await;
    all_free_at_once(&peer, "b", 2).await;
    release_all(blockers).await;
    all_free_at_once(&peer, "s", N).await;
}

/// `shutdown()` a few polls into a permit acquire of a key whose first
/// permits are held elsewhere (it is trying them one by one, or has just
/// taken the free one): the acquire ends, `ShutDown` or a guard that is
/// already lost, and the free permit is free again for another client.
async fn shutdown_racing_the_tries_of_a_permit_acquire_leaves_nothing(kind: Kind) {
    let prefix = unique("pa-shut-race");
    let peer = kind.runtime(&prefix).await;
    // Permits 0 and 1 held: only permit 2 is free.
    let blockers = block_all(&peer, "r", 2).await;
    for yields in 0..6 {
        let runtime = kind.runtime(&prefix).await;
        let acquire = tokio::spawn({
            let request = runtime.lock("r").permits(N).wait(Duration::from_secs(30));
            async move { request.acquire().await }
        });
        for _ in 0..yields {
            tokio::task::yield_now().await;
        }
        let _ = runtime.shutdown().await;
        let ended = tokio::time::timeout(Duration::from_secs(5), acquire)
            .await
            .expect("a permit acquire outlived shutdown")
            .unwrap();
        match ended {
            Err(LockError::ShutDown) => {}
            Ok(guard) => assert!(guard.is_lost(), "a live permit after shutdown"),
            Err(other) => panic!("{yields} yields: {other:?}"),
        }
        until_free(&peer, "r#2").await;
    }
    release_all(blockers).await;
    all_free_at_once(&peer, "r", N).await;
}
