//! A waiter for N permits can be given two at once (two releases, two
//! local passes or fair handoffs to its places); it keeps one, and the
//! other must go on to the next waiter at once, not sit with the waiter's
//! dropped wait until a lease or a claim runs out.

use std::time::Duration;

use lock_runtime::LockRuntime;
use lock_tests::spawn::{spawn_acquire, Timed};
use lock_tests::{on_every_backend, wait_until, Kind};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{all_free_at_once, block_all};

on_every_backend!(
    two_permits_freed_at_once_go_to_two_waiters_of_this_process,
    two_permits_freed_at_once_go_to_waiters_of_two_other_processes,
);

/// How long the second waiter may take after the releases: well under a
/// lease (30 s) and a fair claim (3 s), which is what a permit kept by a
/// dropped wait would cost.
const PROMPTLY: Duration = Duration::from_millis(2500);

/// Spawns a wait for one of the two permits of `key` on `runtime`, and
/// waits until `runtime` counts `waiting` waiting acquires (it waits for
/// both permits).
async fn waiter(runtime: &LockRuntime, key: &str, waiting: usize) -> JoinHandle<Timed> {
    let task = spawn_acquire(runtime.lock(key).permits(2).wait(Duration::from_secs(30)));
    wait_until("a wait for both permits", || {
        runtime.stats().waiting == waiting
    })
    .await;
    task
}

/// Both waiters end with a permit each, distinct, within [`PROMPTLY`] of
/// `freed`.
async fn both_served(first: JoinHandle<Timed>, second: JoinHandle<Timed>, freed: Instant) {
    let mut got = Vec::new();
    for task in [first, second] {
        let ended = tokio::time::timeout(Duration::from_secs(20), task).await;
        let (at, guard) = ended.expect("a waiter hung").unwrap();
        let guard = guard.expect("a waiter got no permit");
        let after = at - freed;
        assert!(
            after < PROMPTLY,
            "permit {:?} after {after:?}",
            guard.permit()
        );
        got.push(guard);
    }
    assert_ne!(got[0].permit(), got[1].permit());
    for guard in got {
        guard.release().await.unwrap();
    }
}

/// Lock cohorting: two tasks of a process hold both permits, two tasks of
/// the same process wait for them, the first in both permits' local queues
/// ahead of the second. Both permits are released at once, so both may
/// be passed to the first waiter; it keeps one, and the second waiter gets
/// the other promptly.
async fn two_permits_freed_at_once_go_to_two_waiters_of_this_process(kind: Kind) {
    let (runtime, peer) = kind.two("pa-pass").await;
    let held = block_all(&runtime, "p", 2).await;
    let first = waiter(&runtime, "p", 2).await;
    let second = waiter(&runtime, "p", 4).await;
    let freed = Instant::now();
    let mut held = held.into_iter();
    let (a, b) = (held.next().unwrap(), held.next().unwrap());
    let (a, b) = tokio::join!(a.release(), b.release());
    a.unwrap();
    b.unwrap();
    both_served(first, second, freed).await;
    all_free_at_once(&peer, "p", 2).await;
}

/// Fair handoffs across processes: a holder process frees both permits at
/// once, while a waiter of a second process stands first in both permits'
/// queues and a waiter of a third process second. Both permits may be
/// handed to the first waiter's places; it keeps one, and the third
/// process's waiter gets the other promptly (not after the handoff's
/// claim runs out).
async fn two_permits_freed_at_once_go_to_waiters_of_two_other_processes(kind: Kind) {
    let prefix = lock_tests::unique("pa-hand");
    let holder = kind.runtime(&prefix).await;
    let one = kind.peer(&holder, &prefix).await;
    let two = kind.peer(&holder, &prefix).await;
    let held = block_all(&holder, "h", 2).await;
    let local = |runtime: &LockRuntime| runtime.stats().waiting;
    let first = waiter(&one, "h", local(&one) + 2).await;
    let second = waiter(&two, "h", local(&two) + 2).await;
    let freed = Instant::now();
    let mut held = held.into_iter();
    let (a, b) = (held.next().unwrap(), held.next().unwrap());
    let (a, b) = tokio::join!(a.release(), b.release());
    a.unwrap();
    b.unwrap();
    both_served(first, second, freed).await;
    all_free_at_once(&holder, "h", 2).await;
}
