//! Renewal and loss: the watchdog keeps a long body's lock; a lock that
//! ends (deleted, expired, its holder killed, its renewals unanswered) is
//! told lost to its holder by its lease end at the latest, stops the body
//! (abort) or lets it finish (continue), and a stale holder's release
//! leaves the new holder alone.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use lock_runtime::{with_lock, LockError, OnLost};
use lock_testkit::pipes;
use lock_tests::looked::at_once;
use lock_tests::{
    behind_proxy, contender_bin, on_every_backend, redis, runtime_at, timing_turn, unique, Kind,
};
use tokio::sync::oneshot;
use tokio::time::Instant;

on_every_backend!(
    body_running_three_leases_stays_exclusive,
    deleted_lock_is_lost_and_abort_stops_the_body,
    deleted_lock_in_continue_mode_finishes_the_body,
    fixed_lease_without_watchdog_is_not_renewed,
    a_fixed_lease_handed_over_through_a_renewed_waiters_place_still_runs_out
        skip(redlock = "Redlock has no fair mode, so no handoff: a fair request is refused"),
    release_after_takeover_is_not_held,
    a_fixed_lease_holder_is_told_a_margin_before_its_lease_runs_out,
);

const LEASE: Duration = Duration::from_millis(300);

/// Scheduling slack allowed on top of every computed bound.
const SLACK: Duration = Duration::from_millis(150);

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

/// A body running about 3⅓ leases keeps its lock: the watchdog renews it, a
/// peer waiting 800 ms times out, the holder ends with `Ok`, and the lock is
/// free right after.
async fn body_running_three_leases_stays_exclusive(kind: Kind) {
    let (runtime, peer) = kind.two("long").await;
    let key = unique("long-key");
    let before = runtime.stats().watchdog;

    let (inside_tx, inside_rx) = oneshot::channel();
    let holder = {
        let runtime = runtime.clone();
        let key = key.clone();
        tokio::spawn(async move {
            with_lock(runtime.lock(key).lease(LEASE), async move {
                inside_tx.send(()).unwrap();
                // The behaviour under test: a body longer than three leases.
                tokio::time::sleep(Duration::from_millis(1000)).await;
                Ok::<_, LockError>("done")
            })
            .await
        })
    };
    inside_rx.await.expect("the holder entered its body");

    let asked = Instant::now();
    let outcome = peer
        .lock(&key)
        .lease(LEASE)
        .wait(Duration::from_millis(800))
        .acquire()
        .await;
    match outcome {
        Err(LockError::Timeout { .. }) => {}
        other => panic!("the peer got in while the body ran (lease not renewed?): {other:?}"),
    }
    assert!(
        asked.elapsed() >= Duration::from_millis(750),
        "the timeout came early: {:?}",
        asked.elapsed()
    );

    let result = holder.await.expect("holder task");
    assert!(
        matches!(result, Ok("done")),
        "the long body should end with its own result, got {result:?}"
    );

    // (The call returned before its release was answered: the peer gets
    // the key once it arrives, well within the lease it would otherwise
    // have to run out.)
    let next = peer
        .lock(&key)
        .lease(LEASE)
        .wait(LEASE / 2)
        .acquire()
        .await
        .expect("the lock is free as soon as the holder's release arrives");
    next.release().await.unwrap();

    let after = runtime.stats().watchdog;
    assert!(
        after.ticks >= before.ticks + 3 && after.round_trips >= before.round_trips + 3,
        "the watchdog should have renewed several times in ~1 s: before {before:?}, after {after:?}"
    );
    assert_eq!(after.lost, before.lost, "no renewal may have failed");
    assert_eq!(runtime.stats().held, 0);
}

/// A lock deleted under its holder is found lost by the next renewal; in
/// abort mode the body (which never ends) is dropped and the call returns
/// `Lost` within a second.
async fn deleted_lock_is_lost_and_abort_stops_the_body(kind: Kind) {
    let (runtime, peer) = kind.two("lost").await;
    let key = unique("lost-key");
    let before = runtime.stats().watchdog;

    let started = Instant::now();
    let result = tokio::time::timeout(
        Duration::from_secs(5),
        with_lock(runtime.lock(&key).lease(LEASE), async {
            let deleted = peer.force_unlock(&key).await?;
            assert!(deleted, "force_unlock found no lock to delete");
            std::future::pending::<()>().await;
            Ok::<_, LockError>(())
        }),
    )
    .await
    .expect("a lost lock must stop the body (still running after 5 s)");
    let took = started.elapsed();
    match &result {
        Err(LockError::Lost { key: lost }) => assert_eq!(lost, &key),
        other => panic!("expected Err(Lost), got {other:?}"),
    }
    assert!(
        took < Duration::from_secs(1),
        "the loss took {took:?} to stop the body"
    );
    assert!(runtime.stats().watchdog.lost > before.lost);
    assert_eq!(runtime.stats().held, 0);
}

/// In continue mode a lock deleted under its holder is detected (the
/// watchdog counts a loss) but the body runs to the end and its result is
/// returned.
async fn deleted_lock_in_continue_mode_finishes_the_body(kind: Kind) {
    let (runtime, peer) = kind.two("cont").await;
    let key = unique("cont-key");
    let before = runtime.stats().watchdog;

    let result = tokio::time::timeout(
        Duration::from_secs(5),
        with_lock(
            runtime.lock(&key).lease(LEASE).on_lost(OnLost::Continue),
            async {
                assert!(peer.force_unlock(&key).await?, "no lock to delete");
                // The behaviour under test: the body keeps running for three
                // leases after its lock is gone.
                tokio::time::sleep(LEASE * 3).await;
                Ok::<_, LockError>(42)
            },
        ),
    )
    .await
    .expect("the body ends after ~900 ms");
    assert!(
        matches!(result, Ok(42)),
        "continue mode returns the body's result, got {result:?}"
    );
    let after = runtime.stats().watchdog;
    assert!(
        after.lost > before.lost,
        "the loss should have been detected while the body ran: before {before:?}, after {after:?}"
    );
    assert_eq!(runtime.stats().held, 0);
}

/// A fair release hands the lock to the process's place in the queue,
/// which the first of its waiters made: here one with a renewed lease,
/// which then leaves, so that the next, with a fixed lease, takes the
/// handoff. Its lease is fixed all the same: nothing renews it, and a peer
/// gets the lock once it runs out, although the guard still lives. (On
/// etcd and ZooKeeper the place's key lives as long as the lease or
/// session the renewed waiter asked for: taken from the message, the hold
/// would never end.)
async fn a_fixed_lease_handed_over_through_a_renewed_waiters_place_still_runs_out(kind: Kind) {
    let (runtime, peer) = kind.two("handed-fixed").await;
    let key = unique("handed-fixed-key");
    let first = runtime.lock(&key).fair(true).acquire().await.unwrap();
    let wait = Duration::from_secs(20);
    let renewed = {
        let (peer, key) = (peer.clone(), key.clone());
        tokio::spawn(async move { peer.lock(&key).fair(true).wait(wait).acquire().await })
    };
    let waiting = |n: usize| {
        let peer = peer.clone();
        move || peer.stats().waiting == n
    };
    lock_tests::wait_until("the renewed waiter waits", waiting(1)).await;
    let fixed = {
        let (peer, key) = (peer.clone(), key.clone());
        let request = peer.lock(&key).fair(true).lease(LEASE).watchdog(false);
        tokio::spawn(async move { request.wait(wait).acquire().await })
    };
    lock_tests::wait_until("the fixed waiter waits too", waiting(2)).await;
    renewed.abort();
    lock_tests::wait_until("the renewed waiter left", waiting(1)).await;
    // The fixed hold's lease counts from its claim, sent after this.
    let released = Instant::now();
    first.release().await.unwrap();
    let handed = fixed
        .await
        .unwrap()
        .expect("the fixed waiter gets the lock");
    let third = runtime
        .lock(&key)
        .fair(true)
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("the handed fixed lease runs out and frees the lock");
    let after = released.elapsed();
    assert!(
        after >= LEASE - Duration::from_millis(5),
        "the peer got in {after:?} after the release, before the fixed lease could end"
    );
    assert!(third.fence() > handed.fence());
    let _ = tokio::time::timeout(Duration::from_secs(1), handed.lost()).await;
    assert!(
        handed.is_lost(),
        "the handed fixed hold does not know it ran out"
    );
    drop(handed);
    third.release().await.unwrap();
}

/// With the watchdog off the lease is fixed: a peer gets the lock once it
/// runs out, the first guard reports the loss, and its release fails.
async fn fixed_lease_without_watchdog_is_not_renewed(kind: Kind) {
    let (runtime, peer) = kind.two("fixed").await;
    let key = unique("fixed-key");

    let request = runtime.lock(&key).lease(LEASE).watchdog(false);
    // The lease counts from the acquire's send (no backend frees it
    // earlier), which is after this instant and before the acquire returns.
    let asked_at = Instant::now();
    let first = request.acquire().await.unwrap();
    let request = peer.lock(&key).wait(Duration::from_secs(2));
    let second = request
        .acquire()
        .await
        .expect("the fixed lease runs out and frees the lock");
    let waited = asked_at.elapsed();
    println!(
        "fixed lease ({kind:?}): peer acquired {} ms after the first acquire began",
        ms(waited)
    );
    assert!(
        waited >= LEASE - Duration::from_millis(5),
        "the peer got in {waited:?} after the first acquire began, before its lease ran out"
    );

    // The peer holds it now, so the first hold is over: the guard must say so
    // (the watchdog marks it at the end of its lease; allow it a moment).
    let _ = tokio::time::timeout(Duration::from_secs(1), first.lost()).await;
    assert!(
        first.is_lost(),
        "the first guard does not know its lease ran out"
    );
    match first.release().await {
        Err(LockError::Lost { .. } | LockError::NotHeld { .. }) => {}
        other => panic!("release of an expired fixed lease should fail, got {other:?}"),
    }

    // The failed release did not disturb the new holder.
    assert!(
        runtime.lock(&key).try_acquire().await.unwrap().is_none(),
        "the peer's hold was freed by the stale release"
    );
    second.release().await.unwrap();
}

/// The holder is told its hold is over a margin (`lease / 50 + 10 ms`, 70
/// ms of 3 s) before the lease runs out on the server, which counts it from
/// no earlier than the acquire's send: a timer that fires a little late on
/// a busy machine still tells it before anyone else can enter.
async fn a_fixed_lease_holder_is_told_a_margin_before_its_lease_runs_out(kind: Kind) {
    const FIXED: Duration = Duration::from_secs(3);
    const MARGIN: Duration = Duration::from_millis(70);
    let (runtime, _peer) = kind.two("margin").await;
    let asked_at = Instant::now();
    let request = runtime
        .lock(unique("margin-key"))
        .lease(FIXED)
        .watchdog(false);
    let guard = request.acquire().await.unwrap();
    let acquired = asked_at.elapsed();
    tokio::time::timeout(FIXED, guard.lost())
        .await
        .expect("a fixed lease is told lost by its end");
    let told = asked_at.elapsed();
    println!("{kind:?}: acquired after {acquired:?}, told lost after {told:?}");
    // Counted from the send (after `asked_at`, before `acquired`), less
    // the margin; half the margin allowed for a late timer here.
    assert!(
        told + MARGIN >= FIXED,
        "told {told:?} into a {FIXED:?} lease: too early"
    );
    assert!(
        told <= acquired + FIXED - MARGIN / 2,
        "told {told:?} into a {FIXED:?} lease acquired after {acquired:?}: no margin left \
         before the server frees the key"
    );
    let _ = guard.release().await;
}

/// A holder whose lock was deleted and taken by someone else gets `NotHeld`
/// from its release (or `Lost` when the taker was its own runtime, as on the
/// embedded backend: the fresh hold told the old one it was gone), and that
/// release leaves the new holder's lock alone.
async fn release_after_takeover_is_not_held(kind: Kind) {
    let (runtime, peer) = kind.two("takeover").await;
    let key = unique("takeover-key");
    let lease = Duration::from_secs(30);

    let first = runtime.lock(&key).lease(lease).acquire().await.unwrap();
    assert!(peer.force_unlock(&key).await.unwrap(), "no lock to delete");
    let second = at_once(peer.lock(&key).lease(lease), "the deleted lock is free").await;
    assert!(second.fence() > first.fence(), "fences must increase");

    match first.release().await {
        Err(LockError::NotHeld { key: k }) => assert_eq!(k, key),
        Err(LockError::Lost { key: k }) if kind == Kind::Memory => assert_eq!(k, key),
        other => panic!("release after a takeover should be NotHeld, got {other:?}"),
    }

    // A fresh owner still finds the lock taken by the second holder.
    assert!(
        runtime.lock(&key).try_acquire().await.unwrap().is_none(),
        "the stale release freed the new holder's lock"
    );
    assert!(!second.is_lost());
    second.release().await.unwrap();
    assert!(
        runtime.lock(&key).try_acquire().await.unwrap().is_some(),
        "the lock should be free after the second holder released it"
    );
}

/// A holder process killed with SIGKILL releases nothing; its lock frees when
/// the lease (1500 ms) runs out — not before, and not much after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_killed_frees_lock_after_about_one_lease() {
    const PROCESS_LEASE: Duration = Duration::from_millis(1500);
    let server = redis();
    let prefix = unique("killed");
    let key = unique("killed-key");
    let runtime = Kind::Redis.runtime(&prefix).await;

    let mut command = tokio::process::Command::new(contender_bin!());
    command.args([
        server.url().as_str(),
        prefix.as_str(),
        "hold",
        key.as_str(),
        &PROCESS_LEASE.as_millis().to_string(),
    ]);
    let (mut child, mut lines) = pipes::spawn(&mut command).expect("spawn contender");
    let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("the contender took the lock within 10 s")
        .expect("read contender stdout")
        .expect("the contender printed a line");
    let held_at = Instant::now();
    assert!(
        line.starts_with("held "),
        "unexpected contender output {line:?}"
    );

    // While it lives, the lock is its own.
    assert!(
        runtime.lock(&key).try_acquire().await.unwrap().is_none(),
        "the contender's lock was free"
    );

    let killed_at = Instant::now();
    child.kill().await.expect("SIGKILL the contender");

    let request = runtime.lock(&key).wait(Duration::from_secs(10));
    let guard = request
        .acquire()
        .await
        .expect("the lock freed after the lease");
    let acquired_at = Instant::now();
    let after_held = acquired_at - held_at;
    let after_kill = acquired_at - killed_at;
    println!(
        "killed holder (lease {} ms): acquired {} ms after the `held` line, {} ms after SIGKILL",
        ms(PROCESS_LEASE),
        ms(after_held),
        ms(after_kill)
    );
    assert!(
        after_held + Duration::from_millis(100) >= PROCESS_LEASE,
        "acquired {after_held:?} after the holder took it: before its lease ran out"
    );
    assert!(
        after_kill <= PROCESS_LEASE + Duration::from_millis(700),
        "acquired {after_kill:?} after the kill: the lease should have freed it sooner"
    );
    guard.release().await.unwrap();
}

/// Defect: a renewal stuck on a stalled connection delayed the lost check of
/// every other hold until it timed out, so a fixed-lease lock ran out, was
/// taken by another runtime, and its old holder still believed it held it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hold_is_told_lost_by_its_own_lease_end_while_a_renewal_hangs() {
    let _turn = timing_turn().await;
    let prefix = unique("stuck-renewal");
    let (proxy, stalled) = behind_proxy(&prefix).await;
    let other = runtime_at(&redis().url(), &prefix).await;

    let begun = Instant::now();
    let request = stalled.lock("a").lease(Duration::from_secs(3));
    let renewed = request.acquire().await.unwrap();
    let fixed = stalled
        .lock("b")
        .lease(Duration::from_millis(1500))
        .watchdog(false)
        .acquire()
        .await
        .unwrap();
    // The renewal of "a" falls due at 1 s and hangs on the stalled socket.
    tokio::time::sleep_until(begun + Duration::from_millis(900)).await;
    proxy.stall();

    let request = other.lock("b").wait(Duration::from_secs(5));
    let taken = request.acquire().await.unwrap();
    let taken_at = begun.elapsed();
    assert!(
        fixed.is_lost(),
        "another runtime took \"b\" at {taken_at:?} while its old holder was not told"
    );
    tokio::time::timeout(Duration::from_secs(1), fixed.lost())
        .await
        .unwrap();
    let lost_b = begun.elapsed();
    tokio::time::timeout(Duration::from_secs(5), renewed.lost())
        .await
        .expect("the renewed hold was never declared lost");
    let lost_a = begun.elapsed();
    eprintln!("fixed lease lost at {lost_b:?}, taken over at {taken_at:?}; renewed lease lost at {lost_a:?}");
    // Each by its own lease end, counted from before its acquire was sent.
    assert!(lost_b <= Duration::from_millis(1500) + SLACK, "{lost_b:?}");
    assert!(lost_a <= Duration::from_millis(3000) + SLACK, "{lost_a:?}");
    proxy.resume();
    drop(taken);
}
