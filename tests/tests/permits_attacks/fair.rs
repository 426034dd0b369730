//! Fair mode with permits: a waiter stands in every permit's queue, so a
//! process whose tasks keep taking the permits does not starve a waiter of
//! another process.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{with_lock, LockError};
use lock_tests::spawn::{join_within, spawn_acquire};
use lock_tests::{on_every_backend, poll_until, wait_until, Kind};
use tokio::time::Instant;

on_every_backend!(
    a_waiter_of_another_process_gets_a_permit_while_one_process_keeps_taking_them
        skip(
            redlock = "Redlock has no fair mode: a plain waiter has no place to keep",
            memory = "the embedded store is one process: there is no other to starve"
        ),
);

/// "In fair mode a waiter stands in every permit's queue ... across
/// processes, waiters are served close to arrival order": sixteen tasks
/// of one process take the two permits of a key over and over (each call
/// short; ten or more of them always waiting, so a permit is never left
/// free); a waiter of another process, arriving then, gets a permit within
/// its bounded wait (10 s), after a few of the busy process's bodies at
/// most (a waiter that only tried now and then would never find one free).
async fn a_waiter_of_another_process_gets_a_permit_while_one_process_keeps_taking_them(kind: Kind) {
    let (busy, other) = kind.two("pa-fair").await;
    let stop = Arc::new(AtomicBool::new(false));
    let entered = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (busy, stop, entered) = (busy.clone(), stop.clone(), entered.clone());
        tasks.push(tokio::spawn(async move {
            // (Bounded: the test stops it long before.)
            for _ in 0..5000 {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let request = busy.lock("f").permits(2).wait(Duration::from_secs(60));
                with_lock(request, async {
                    entered.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    Ok::<_, LockError>(())
                })
                .await
                .unwrap();
            }
        }));
    }
    poll_until(
        "the busy process holds both permits, ten of its tasks waiting",
        Duration::from_secs(10),
        async || {
            let seen = other.inspect_permits("f", 2).await.unwrap();
            seen.iter().all(Option::is_some) && busy.stats().waiting >= 2 * 10
        },
    )
    .await;
    let started = Instant::now();
    let waiter = spawn_acquire(other.lock("f").permits(2).wait(Duration::from_secs(10)));
    wait_until("the other process waits for both permits", || {
        other.stats().waiting == 2 || waiter.is_finished()
    })
    .await;
    let before = entered.load(Ordering::SeqCst);
    let waited = tokio::time::timeout(Duration::from_secs(30), waiter).await;
    let (got_at, got) = waited.expect("the waiter outlived its wait").unwrap();
    let overtaken = entered.load(Ordering::SeqCst) - before;
    let got = got.unwrap_or_else(|e| panic!("starved for {:?}: {e}", started.elapsed()));
    eprintln!(
        "{kind:?}: the other process's waiter got permit {:?} after {:?}, {overtaken} bodies of the busy one",
        got.permit(),
        got_at - started
    );
    // Arrival order: the busy process's place in each permit's queue is
    // ahead of the waiter's, then behind it; a few bodies at most.
    assert!(
        overtaken <= 12,
        "{overtaken} bodies of the busy process went first"
    );
    got.release().await.unwrap();
    stop.store(true, Ordering::SeqCst);
    join_within(tasks, Duration::from_secs(60), "the busy process's callers").await;
}
