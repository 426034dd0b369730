//! A permit that stops being its holder's: forced free under its body, or
//! run out (a fixed lease). Only that permit's call is told; the other
//! permits' holders keep theirs; the permit goes to the next holder with a
//! higher token.

use std::time::Duration;

use lock_runtime::{fence, permit, with_lock, LockError};
use lock_tests::spawn::spawn_acquire;
use lock_tests::{on_every_backend, Kind};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::{all_free_soon, permit_key};

on_every_backend!(
    a_permit_forced_free_under_its_body_ends_that_call_lost_and_no_other,
    a_waiter_for_permits_whose_holders_fixed_leases_run_out_gets_one_by_the_lease_end,
);

/// How many permits the key has.
const N: u32 = 3;

/// "Loss (`on_lost`) ... the permit lock's, exactly as for one key": three
/// bodies hold the three permits; permit 1 is deleted by another client.
/// That body's call ends in `Lost` (bounded), the two others keep running
/// on their permits (the backend still records them with their tokens)
/// and end `Ok`; another client then takes exactly the freed permit, with
/// a token above the lost holder's.
async fn a_permit_forced_free_under_its_body_ends_that_call_lost_and_no_other(kind: Kind) {
    let (runtime, peer) = kind.two("pa-lost").await;
    let lease = Duration::from_millis(900);
    let (inside_tx, mut inside_rx) = mpsc::unbounded_channel();
    let (finish_tx, finish_rx) = watch::channel(false);
    let mut calls = Vec::new();
    for _ in 0..N {
        let request = runtime.lock("l").permits(N).lease(lease);
        let (inside_tx, mut finish_rx) = (inside_tx.clone(), finish_rx.clone());
        calls.push(tokio::spawn(with_lock(request, async move {
            let mine = permit().unwrap();
            inside_tx.send((mine, fence().unwrap())).unwrap();
            finish_rx.wait_for(|&go| go).await.unwrap();
            Ok::<_, LockError>(mine)
        })));
    }
    let mut tokens = [0u64; N as usize];
    for _ in 0..N {
        let inside = tokio::time::timeout(Duration::from_secs(20), inside_rx.recv()).await;
        let (mine, token) = inside.expect("not every permit's body ran").unwrap();
        assert_eq!(tokens[mine as usize], 0, "two bodies on permit {mine}");
        tokens[mine as usize] = token;
    }
    assert!(peer.force_unlock("l#1").await.unwrap(), "permit 1 was free");
    let started = Instant::now();
    let mut lost = None;
    while lost.is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no body was told its permit was lost"
        );
        for call in calls.iter_mut().filter(|c| c.is_finished()) {
            lost = Some(call.await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    calls.retain(|c| !c.is_finished());
    let lost = lost.unwrap();
    assert!(matches!(&lost, Err(LockError::Lost { .. })), "{lost:?}");
    assert_eq!(calls.len(), 2, "another body ended with the lost one");
    for i in [0, 2] {
        let info = peer.inspect(&permit_key("l", i)).await.unwrap();
        let info = info.unwrap_or_else(|| panic!("permit {i} was freed with permit 1"));
        assert_eq!(
            info.fence,
            Some(tokens[i as usize]),
            "permit {i} changed hands"
        );
    }
    let next = spawn_acquire(peer.lock("l").permits(N).wait(Duration::ZERO));
    let next = next.await.unwrap().1.expect("the freed permit is free");
    assert_eq!(next.permit(), Some(1));
    assert!(
        next.fence() > tokens[1],
        "{} after {}",
        next.fence(),
        tokens[1]
    );
    next.release().await.unwrap();
    finish_tx.send(true).unwrap();
    let mut ended: Vec<u32> = Vec::new();
    for call in calls {
        ended.push(call.await.unwrap().expect("an undisturbed body failed"));
    }
    ended.sort_unstable();
    assert_eq!(ended, [0, 2]);
    all_free_soon(&peer, "l", N).await;
}

/// "Everything else is one key's", fixed leases included: every permit is
/// held with a fixed lease (no watchdog) by holders that never let go; a
/// waiter for all of them gets a permit once the first lease runs out (by
/// the lease plus a generous slack, long before its own wait ends), and
/// not before any lease ran out.
async fn a_waiter_for_permits_whose_holders_fixed_leases_run_out_gets_one_by_the_lease_end(
    kind: Kind,
) {
    let (runtime, peer) = kind.two("pa-fixed").await;
    let lease = Duration::from_secs(2);
    let mut holders = Vec::new();
    let taken_at = Instant::now();
    for _ in 0..N {
        let request = runtime.lock("x").permits(N).lease(lease).watchdog(false);
        let guard = spawn_acquire(request.wait(Duration::ZERO));
        holders.push(guard.await.unwrap().1.expect("a permit is free"));
    }
    let waiter = spawn_acquire(peer.lock("x").permits(N).wait(Duration::from_secs(30)));
    let (got_at, got) = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("the waiter hung past every lease")
        .unwrap();
    let got = got.expect("a permit after the leases ran out");
    let after = got_at - taken_at;
    assert!(got.permit().is_some_and(|p| p < N));
    assert!(
        after >= lease - Duration::from_millis(100),
        "after {after:?}"
    );
    assert!(after < lease + Duration::from_secs(5), "after {after:?}");
    let mine = got.permit().unwrap() as usize;
    assert!(holders
        .iter()
        .any(|h| h.permit() == Some(mine as u32) && h.is_lost()));
    got.release().await.unwrap();
    drop(holders);
}
