//! Read-write locks (`mode = "read"` / `"write"`): readers share a key
//! across processes, a writer excludes readers and writers, exclusive and
//! write are one lock, reads re-enter the holds of their call chain, an
//! upgrade is refused at once, a waiting writer is not starved by readers
//! of its process, and tokens order readers against writers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_runtime::{fence, with_lock, LockError, LockMode, LockRequest, LockRuntime};
use lock_tests::{on_every_backend, poll_until, try_takes, unique, wait_until, Kind};
use tokio::sync::Barrier;
use tokio::task::JoinHandle;

on_every_backend!(
    readers_share_a_key_across_runtimes,
    a_writer_excludes_readers_and_other_writers,
    exclusive_and_write_are_one_lock,
    a_readers_release_wakes_the_writer_it_kept_out,
    reads_reenter_the_read_or_write_hold_of_their_call_chain,
    a_write_inside_a_read_hold_is_refused_at_once,
    a_write_inside_a_read_branch_beside_a_reading_sibling_is_refused,
    a_waiting_writer_holds_back_new_readers_of_its_process,
    readers_queued_behind_a_writer_enter_together,
    inspect_shows_the_readers_and_the_writer,
    tokens_order_readers_against_writers,
    a_dead_readers_share_ends_with_its_lease_while_other_readers_renew,
    a_reader_leaving_other_readers_frees_nothing,
    a_downgraded_hold_keeps_its_token_and_writers_out_and_lets_readers_in,
    a_writer_waiting_through_a_downgrade_enters_only_after_the_read,
    releasing_the_write_under_a_nested_read_downgrades,
    a_dropped_write_guard_and_its_nested_read_leave_the_key_free,
    local_readers_share_one_backend_hold,
    joins_stop_at_the_cohort_limits,
    a_read_racing_the_last_readers_release_is_inside_a_backend_hold,
    a_downgrade_racing_the_nested_reads_release_frees_the_key_without_an_error,
    a_read_nested_in_a_joined_read_keeps_the_shared_hold_until_the_last_frame,
);

// The same race on a fair hold (Redis: `fair.lua`'s downgrade).
on_every_backend!(
    a_fair_downgrade_racing_the_nested_reads_release_frees_the_key_without_an_error skip(
        redlock = "Redlock has no fair mode"
    ),
);

// Shutdown ends every hold, joined reads too (on the embedded store the
// store lives in the runtime that shuts down: nobody is left to look).
on_every_backend!(
    shutdown_ends_joined_reads_and_frees_the_key skip(
        memory = "the embedded store ends with its runtime"
    ),
);

// Where a dropped guard's downgrade is sent in the background, ordered
// before the release behind it: the embedded store, etcd and ZooKeeper.
// The Redis family (Redlock too) keeps such a hold a write hold until its
// read frames end (more exclusive), so that no release can overtake the
// downgrade.
on_every_backend!(
    dropping_the_write_under_a_nested_read_downgrades_in_the_background skip(
        redis = "a background downgrade stays a write hold on Redis (by design, for now)",
        cluster = "a background downgrade stays a write hold on Redis (by design, for now)",
        sentinel = "a background downgrade stays a write hold on Redis (by design, for now)",
        redlock = "a background downgrade stays a write hold on Redis (by design, for now)",
    ),
);

// Fair mode's writer preference and reader runs, across processes. Redlock
// has no fair mode (a design limit: it refuses `fair(true)`).
on_every_backend!(
    a_queued_writer_of_another_process_holds_back_new_readers skip(
        redlock = "Redlock has no fair mode"
    ),
    readers_of_several_processes_queued_behind_a_writer_enter_together skip(
        redlock = "Redlock has no fair mode"
    ),
    a_writer_behind_a_reader_that_gave_up_waiting_enters_as_a_writer skip(
        redlock = "Redlock has no fair mode"
    ),
    a_place_never_serves_two_modes skip(
        memory = "the embedded store queues no places (one process)",
        redlock = "Redlock has no fair mode"
    ),
);

const WAIT: Duration = Duration::from_secs(10);

/// Four readers, two per runtime, are inside the key at once: each waits
/// inside for all four (a barrier that could never open if a reader
/// excluded another).
async fn readers_share_a_key_across_runtimes(kind: Kind) {
    let (first, second) = kind.two("rw-share").await;
    let requests = (0..4).map(|n| if n % 2 == 0 { &first } else { &second }.lock("k").read());
    all_inside_together(meet_inside(requests.collect())).await;
}

/// Spawns a `with_lock` per request whose body waits inside for all the
/// others (a barrier that could never open if one excluded another).
fn meet_inside(requests: Vec<LockRequest>) -> Vec<JoinHandle<Result<(), LockError>>> {
    let inside = Arc::new(Barrier::new(requests.len()));
    let spawn = |request: LockRequest| {
        let inside = inside.clone();
        tokio::spawn(with_lock(request.wait(WAIT), async move {
            inside.wait().await;
            Ok::<_, LockError>(())
        }))
    };
    requests.into_iter().map(spawn).collect()
}

/// Awaits the calls of [`meet_inside`]: each must have met the others.
async fn all_inside_together(calls: Vec<JoinHandle<Result<(), LockError>>>) {
    for call in calls {
        tokio::time::timeout(WAIT, call)
            .await
            .expect("the readers were never inside together")
            .unwrap()
            .unwrap();
    }
}

/// Sixteen tasks on two runtimes, every fourth call a write: a writer's
/// non-atomic increment loses nothing, no writer is ever beside anyone, and
/// no reader sees the counter change under it.
async fn a_writer_excludes_readers_and_other_writers(kind: Kind) {
    let (first, second) = kind.two("rw-exclude").await;
    let counter = Arc::new(AtomicU64::new(0));
    // (readers inside) + 1000 × (writers inside)
    let inside = Arc::new(AtomicU64::new(0));
    let writes = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..16u64 {
        let rt = if t % 2 == 0 { &first } else { &second }.clone();
        let (counter, inside, writes) = (counter.clone(), inside.clone(), writes.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..20u64 {
                let write = (t + round) % 4 == 0;
                let request = rt.lock("k").wait(WAIT);
                let request = if write {
                    request.write()
                } else {
                    request.read()
                };
                with_lock(request, async {
                    if write {
                        let before = inside.fetch_add(1000, Ordering::SeqCst);
                        assert_eq!(before, 0, "a writer entered beside another holder");
                        let value = counter.load(Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        counter.store(value + 1, Ordering::SeqCst);
                        writes.fetch_add(1, Ordering::SeqCst);
                        inside.fetch_sub(1000, Ordering::SeqCst);
                    } else {
                        let before = inside.fetch_add(1, Ordering::SeqCst);
                        assert!(before < 1000, "a reader entered beside a writer");
                        let value = counter.load(Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        assert_eq!(
                            counter.load(Ordering::SeqCst),
                            value,
                            "changed under a reader"
                        );
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                    Ok::<_, LockError>(())
                })
                .await
                .unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(
        counter.load(Ordering::SeqCst),
        writes.load(Ordering::SeqCst)
    );
    assert_eq!(writes.load(Ordering::SeqCst), 80);
}

/// An exclusive hold keeps out writers and readers, and a write hold keeps
/// out exclusive holds and readers: the default mode and write are one lock.
async fn exclusive_and_write_are_one_lock(kind: Kind) {
    let (first, second) = kind.two("rw-one-lock").await;
    let exclusive = first.lock("k").acquire().await.unwrap();
    assert_eq!(exclusive.mode(), LockMode::Exclusive);
    assert!(!try_takes(second.lock("k").write()).await);
    assert!(!try_takes(second.lock("k").read()).await);
    exclusive.release().await.unwrap();

    let write = first.lock("k").write().acquire().await.unwrap();
    assert_eq!(write.mode(), LockMode::Write);
    assert!(!try_takes(second.lock("k")).await);
    assert!(!try_takes(second.lock("k").read()).await);
    write.release().await.unwrap();

    let read = first.lock("k").read().acquire().await.unwrap();
    assert_eq!(read.mode(), LockMode::Read);
    assert!(!try_takes(second.lock("k")).await);
    let shared = second.lock("k").read().try_acquire().await.unwrap();
    assert!(shared.is_some(), "a second reader was refused");
    drop(shared);
    read.release().await.unwrap();
}

/// A writer kept out by a reader enters when the reader leaves, woken by
/// the release, long before the reader's lease (30 s) would have ended.
async fn a_readers_release_wakes_the_writer_it_kept_out(kind: Kind) {
    let (first, second) = kind.two("rw-wake").await;
    let reader = first.lock("k").read().acquire().await.unwrap();
    let writer = tokio::spawn(async move {
        let started = Instant::now();
        let guard = second.lock("k").write().wait(WAIT).acquire().await?;
        let waited = started.elapsed();
        guard.release().await?;
        Ok::<_, LockError>(waited)
    });
    let runtime = first.clone();
    let waiting = || runtime.stats().waiting > 0;
    if kind == Kind::Memory {
        wait_until("the writer waits", waiting).await;
    } else {
        // (A peer runtime's waiter is not counted here: give it a moment to
        // find the key busy.)
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let held_for = Instant::now();
    reader.release().await.unwrap();
    let waited = writer.await.unwrap().unwrap();
    assert!(
        held_for.elapsed() < Duration::from_secs(5),
        "the writer waited for the reader's lease, not its release ({waited:?})"
    );
}

/// Read inside read and read inside write re-enter (no wait, the same
/// token); a write inside write re-enters too.
async fn reads_reenter_the_read_or_write_hold_of_their_call_chain(kind: Kind) {
    let runtime = kind.runtime(&lock_tests::unique("rw-reenter")).await;
    let rt = &runtime;
    let quick = Duration::from_millis(500);
    with_lock(rt.lock("k").read(), async {
        let outer = fence().unwrap();
        let inner = with_lock(rt.lock("k").read().wait(quick), async {
            Ok::<_, LockError>(fence().unwrap())
        })
        .await?;
        assert_eq!(inner, outer);
        assert_eq!(rt.stats().held, 1, "a nested read took a second hold");
        Ok::<_, LockError>(())
    })
    .await
    .unwrap();
    with_lock(rt.lock("k").write(), async {
        let outer = fence().unwrap();
        let read = with_lock(rt.lock("k").read().wait(quick), async {
            let again = with_lock(rt.lock("k").write().wait(quick), async {
                Ok::<_, LockError>(fence().unwrap())
            })
            .await?;
            Ok::<_, LockError>((fence().unwrap(), again))
        })
        .await?;
        assert_eq!(read, (outer, outer));
        Ok::<_, LockError>(())
    })
    .await
    .unwrap();
}

/// A write (or exclusive) lock asked inside a read hold of the same key is
/// an upgrade: refused at once with `UpgradeRefused`, never a wait; the
/// read hold is unharmed.
async fn a_write_inside_a_read_hold_is_refused_at_once(kind: Kind) {
    let runtime = kind.runtime(&lock_tests::unique("rw-upgrade")).await;
    let rt = &runtime;
    with_lock(rt.lock("k").read(), async {
        for request in [rt.lock("k").write(), rt.lock("k")] {
            let started = Instant::now();
            let upgrade = with_lock(request.wait(WAIT), async { Ok::<_, LockError>(()) }).await;
            assert!(
                matches!(&upgrade, Err(LockError::UpgradeRefused { key }) if key == "k"),
                "{upgrade:?}"
            );
            assert!(started.elapsed() < Duration::from_secs(1), "it waited");
        }
        assert!(fence().is_some());
        let read = rt.lock("k").read().try_acquire().await?;
        assert!(read.is_some(), "the read hold was harmed");
        Ok::<_, LockError>(())
    })
    .await
    .unwrap();
}

/// Inside a write hold, a write nested in one branch's read while another
/// branch reads the same hold is an upgrade beside a reader: refused at
/// once (it must not enter beside the other branch's read, and waiting for
/// it could deadlock two branches doing the same). With no other branch
/// inside, write → read → write re-enters.
async fn a_write_inside_a_read_branch_beside_a_reading_sibling_is_refused(kind: Kind) {
    let runtime = kind
        .runtime(&lock_tests::unique("rw-sibling-upgrade"))
        .await;
    let rt = &runtime;
    let outer = rt.lock("k").write().acquire().await.unwrap();
    let (a_inside, a_in) = tokio::sync::oneshot::channel::<()>();
    let (b_done, b_out) = tokio::sync::oneshot::channel::<()>();
    let a = with_lock(rt.lock("k").read(), async move {
        a_inside.send(()).unwrap();
        let _ = b_out.await;
        Ok::<_, LockError>(())
    });
    let b = with_lock(rt.lock("k").read(), async move {
        a_in.await.unwrap();
        let started = Instant::now();
        let nested = with_lock(rt.lock("k").write().wait(WAIT), async {
            Ok::<_, LockError>(())
        })
        .await;
        b_done.send(()).unwrap();
        Ok::<_, LockError>((nested, started.elapsed()))
    });
    let (a, b) = outer.scope(async { tokio::join!(a, b) }).await;
    a.unwrap();
    let (nested, took) = b.unwrap();
    assert!(
        matches!(&nested, Err(LockError::UpgradeRefused { key }) if key == "k"),
        "{nested:?}"
    );
    assert!(took < Duration::from_secs(1), "it waited {took:?}");
    // Alone: write → read → write re-enters.
    let alone = outer
        .scope(with_lock(rt.lock("k").read(), async {
            with_lock(rt.lock("k").write().wait(WAIT), async {
                Ok::<_, LockError>(fence())
            })
            .await
        }))
        .await;
    assert_eq!(alone.unwrap(), Some(outer.fence()));
    outer.release().await.unwrap();
}

/// Once a writer of this process waits for the key, new readers of the
/// process wait behind it (a try-once read is refused), so a stream of
/// readers cannot starve it; a read nested in a hold still re-enters.
async fn a_waiting_writer_holds_back_new_readers_of_its_process(kind: Kind) {
    let runtime = kind.runtime(&lock_tests::unique("rw-prefer")).await;
    let first_reader = runtime.lock("k").read().acquire().await.unwrap();
    let rt = runtime.clone();
    let writer = tokio::spawn(async move {
        let guard = rt.lock("k").write().wait(WAIT).acquire().await?;
        let token = guard.fence();
        guard.release().await?;
        Ok::<_, LockError>(token)
    });
    wait_until("the writer waits", || runtime.stats().waiting == 1).await;
    let late = runtime.lock("k").read().try_acquire().await.unwrap();
    assert!(late.is_none(), "a reader passed the waiting writer");
    let rt = runtime.clone();
    let waiting_reader = tokio::spawn(async move {
        let guard = rt.lock("k").read().wait(WAIT).acquire().await?;
        Ok::<_, LockError>(guard.fence())
    });
    wait_until("the reader waits", || runtime.stats().waiting == 2).await;
    // Nested in the first reader's hold: re-enters, writer or not.
    let nested = first_reader
        .scope(runtime.lock("k").read().try_acquire())
        .await
        .unwrap();
    assert!(nested.is_some(), "a nested read waited for the writer");
    drop(nested);
    first_reader.release().await.unwrap();
    let written = writer.await.unwrap().unwrap();
    let read = waiting_reader.await.unwrap().unwrap();
    assert!(
        read > written,
        "the reader went before the writer ahead of it"
    );
}

/// Readers that queued behind a writer all enter once it leaves: each
/// waits inside for the others.
async fn readers_queued_behind_a_writer_enter_together(kind: Kind) {
    let runtime = kind.runtime(&lock_tests::unique("rw-batch")).await;
    let writer = runtime.lock("k").write().acquire().await.unwrap();
    let readers = meet_inside((0..3).map(|_| runtime.lock("k").read()).collect());
    wait_until("three readers wait", || runtime.stats().waiting == 3).await;
    writer.release().await.unwrap();
    all_inside_together(readers).await;
}

/// Fair mode prefers writers across processes: once a writer of another
/// process is queued, a new reader is refused (try once) or queues behind
/// it, though the key is only read-held; the writer enters when the reader
/// inside leaves, before the reader that came after it.
async fn a_queued_writer_of_another_process_holds_back_new_readers(kind: Kind) {
    let prefix = lock_tests::unique("rw-fair-prefer");
    let first = kind.runtime(&prefix).await;
    let second = kind.peer(&first, &prefix).await;
    // The late readers are of a third process: one of the first would join
    // its read hold, within the cohort limits (see `local_readers_share_…`).
    let third = kind.peer(&first, &prefix).await;
    let reader = first.lock("k").read().fair(true).acquire().await.unwrap();
    let rt = second.clone();
    let writer = tokio::spawn(async move {
        let guard = rt.lock("k").write().fair(true).wait(WAIT).acquire().await?;
        let token = guard.fence();
        guard.release().await?;
        Ok::<_, LockError>(token)
    });
    // Waiting: its first attempt found the key busy and queued it.
    wait_until("the writer waits", || second.stats().waiting == 1).await;
    let late = third.lock("k").read().fair(true).try_acquire().await;
    assert!(late.unwrap().is_none(), "a reader passed the queued writer");
    let rt = third.clone();
    let waiting_reader = tokio::spawn(async move {
        let guard = rt.lock("k").read().fair(true).wait(WAIT).acquire().await?;
        Ok::<_, LockError>(guard.fence())
    });
    let all = [first.clone(), second.clone(), third.clone()];
    wait_until("the late reader waits", || waiting(kind, &all) == 2).await;
    reader.release().await.unwrap();
    let written = writer.await.unwrap().unwrap();
    let read = waiting_reader.await.unwrap().unwrap();
    assert!(read > written, "the late reader went before the writer");
}

/// Fair mode: readers of three processes queued behind a writer all enter
/// once it leaves (each waits inside for the others).
async fn readers_of_several_processes_queued_behind_a_writer_enter_together(kind: Kind) {
    let prefix = lock_tests::unique("rw-fair-run");
    let first = kind.runtime(&prefix).await;
    let mut runtimes = vec![first.clone()];
    for _ in 0..2 {
        runtimes.push(kind.peer(&first, &prefix).await);
    }
    let writer = first.lock("k").write().fair(true).acquire().await.unwrap();
    let requests = runtimes.iter().map(|rt| rt.lock("k").read().fair(true));
    let readers = meet_inside(requests.collect());
    wait_until("three readers wait", || waiting(kind, &runtimes) == 3).await;
    writer.release().await.unwrap();
    all_inside_together(readers).await;
}

/// Fair mode: a release lets in a reader whose executor is stalled, and
/// the reader is cancelled before it runs again; a writer of its process
/// waits behind it. The writer enters as a writer: readers stay out and
/// `inspect` says write (the hold the queue handed the reader's place is a
/// read hold, which must not serve a writer).
async fn a_writer_behind_a_reader_that_gave_up_waiting_enters_as_a_writer(kind: Kind) {
    let (first, second) = kind.two("rw-fair-switch").await;
    let held = first.lock("k").write().fair(true).acquire().await.unwrap();
    // The reader waits on an executor of its own, with one thread.
    let stalled = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let rt = second.clone();
    let reader = stalled.spawn(async move {
        let _guard = rt.lock("k").read().fair(true).wait(WAIT).acquire().await;
    });
    wait_until("the reader waits", || second.stats().waiting == 1).await;
    let rt = second.clone();
    let writer =
        tokio::spawn(async move { rt.lock("k").write().fair(true).wait(WAIT).acquire().await });
    let both = [first.clone(), second.clone()];
    wait_until("the writer waits", || waiting(kind, &both) == 2).await;
    // Stall the reader's executor: its one thread blocks until let go.
    let (blocking, blocked) = std::sync::mpsc::channel::<()>();
    let (let_go, gate) = std::sync::mpsc::channel::<()>();
    stalled.spawn(async move {
        blocking.send(()).unwrap();
        let _ = gate.recv();
    });
    blocked.recv_timeout(WAIT).expect("the executor stalls");
    held.release().await.unwrap();
    // The key leaves the writer (to the reader's place where the queue
    // hands it over).
    let mut freed = false;
    for _ in 0..200 {
        let info = first.inspect("k").await.unwrap();
        if info.is_none_or(|info| info.mode == LockMode::Read) {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(freed, "the release did not free the key");
    reader.abort();
    let_go.send(()).unwrap();
    let writer = tokio::time::timeout(WAIT, writer)
        .await
        .expect("the writer did not enter")
        .unwrap()
        .unwrap();
    assert_eq!(writer.mode(), LockMode::Write);
    let info = first.inspect("k").await.unwrap().expect("held");
    assert_eq!(info.mode, LockMode::Write, "{info:?}");
    let late = first.lock("k").read().fair(true).try_acquire().await;
    assert!(
        late.unwrap().is_none(),
        "a reader entered beside the writer"
    );
    writer.release().await.unwrap();
    stalled.shutdown_background();
}

/// Fair mode: a process's place in a key's queue serves one mode. Its
/// writer queues it and is cancelled; the reader of the process behind it,
/// first now, does not wait under the writer's place (on etcd a writer's key
/// once became a reader in place there, and a handoff computed from it as a
/// writer's let a writer of the process enter beside readers of others): it
/// queues a place of its own, a new holder id, and enters with that one.
async fn a_place_never_serves_two_modes(kind: Kind) {
    let (first, second) = kind.two("rw-place-mode").await;
    let held = first.lock("k").write().fair(true).acquire().await.unwrap();
    let rt = second.clone();
    let writer =
        tokio::spawn(async move { rt.lock("k").write().fair(true).wait(WAIT).acquire().await });
    let writers_place = queued_alone(&first, None).await;
    let rt = second.clone();
    let reader =
        tokio::spawn(async move { rt.lock("k").read().fair(true).wait(WAIT).acquire().await });
    wait_until("the reader waits behind the writer", || {
        second.stats().waiting == 2
    })
    .await;
    writer.abort();
    assert!(writer.await.unwrap_err().is_cancelled());
    let readers_place = queued_alone(&first, Some(&writers_place)).await;
    held.release().await.unwrap();
    let reader = tokio::time::timeout(WAIT, reader)
        .await
        .expect("the reader did not enter")
        .unwrap()
        .unwrap();
    let info = first.inspect("k").await.unwrap().expect("held");
    assert_eq!(info.mode, LockMode::Read, "{info:?}");
    let holders: Vec<&str> = info.readers.iter().map(|r| r.holder.as_str()).collect();
    assert_eq!(holders, [readers_place.as_str()], "{info:?}");
    let late = first.lock("k").write().fair(true).try_acquire().await;
    assert!(
        late.unwrap().is_none(),
        "a writer entered beside the reader"
    );
    reader.release().await.unwrap();
}

/// Waits (bounded) until one holder id is queued for `k`, other than
/// `not` (a place given back may stay queued a moment), and returns it.
async fn queued_alone(runtime: &lock_runtime::LockRuntime, not: Option<&str>) -> String {
    let mut last = None;
    for _ in 0..500 {
        let queue = runtime.inspect("k").await.unwrap().map(|i| i.queue);
        if let Some([one]) = queue.as_deref() {
            if not != Some(one.as_str()) {
                return one.clone();
            }
        }
        last = queue;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never one place queued other than {not:?}: the queue is {last:?}");
}

/// A read of another task of the process joins the read hold there is: no
/// round trip, one backend hold, the hold's token; the hold outlives the
/// task that took it while a joined task reads, and goes with the last.
async fn local_readers_share_one_backend_hold(kind: Kind) {
    let prefix = lock_tests::unique("rw-join");
    let runtime = kind.runtime(&prefix).await;
    let peer = kind.peer(&runtime, &prefix).await;
    let first = runtime.lock("k").read().acquire().await.unwrap();
    let joined = runtime.stats().joined_locally;
    let second = runtime.lock("k").read().acquire().await.unwrap();
    assert_eq!(runtime.stats().joined_locally, joined + 1);
    assert_eq!(runtime.stats().held, 1, "one backend hold");
    let token = first.fence();
    assert_eq!(second.fence(), token);
    let info = runtime.inspect("k").await.unwrap().expect("held");
    assert_eq!(info.readers.len(), 1, "{info:?}");
    first.release().await.unwrap();
    assert!(!second.is_lost());
    let writer = peer.lock("k").write().try_acquire().await.unwrap();
    assert!(
        writer.is_none(),
        "a writer entered beside the joined reader"
    );
    second.release().await.unwrap();
    let writer = peer.lock("k").write().wait(WAIT).acquire().await.unwrap();
    assert!(writer.fence() > token);
}

/// Joins count against the cohort limits: past them a read takes a backend
/// hold of its own (so a stream of local readers cannot keep a writer of
/// another process out longer than a run of handoffs would).
async fn joins_stop_at_the_cohort_limits(kind: Kind) {
    let prefix = lock_tests::unique("rw-join-limit");
    let builder = kind.builder(&prefix).cohort(2, Duration::from_secs(60));
    let runtime = builder.build().await.unwrap();
    let mut readers = Vec::new();
    for _ in 0..4 {
        readers.push(runtime.lock("k").read().acquire().await.unwrap());
    }
    assert_eq!(runtime.stats().joined_locally, 2);
    assert_eq!(
        runtime.stats().held,
        2,
        "the fourth read took a hold of its own"
    );
    for reader in readers {
        reader.release().await.unwrap();
    }
    assert_eq!(runtime.stats().held, 0);
}

/// The acquires waiting in these runtimes of one store (on the embedded
/// store, peers are one runtime: counted once).
fn waiting(kind: Kind, runtimes: &[lock_runtime::LockRuntime]) -> usize {
    match kind {
        Kind::Memory => runtimes[0].stats().waiting,
        _ => runtimes.iter().map(|rt| rt.stats().waiting).sum(),
    }
}

/// `inspect` says read and lists every reader (with its own token and
/// lease), or says write with no readers.
async fn inspect_shows_the_readers_and_the_writer(kind: Kind) {
    let (first, second) = kind.two("rw-inspect").await;
    let a = first.lock("k").read().acquire().await.unwrap();
    let b = second.lock("k").read().acquire().await.unwrap();
    let info = first.inspect("k").await.unwrap().expect("held");
    assert_eq!(info.mode, LockMode::Read);
    let mut tokens: Vec<Option<u64>> = info.readers.iter().map(|r| r.fence).collect();
    tokens.sort();
    let mut expected = vec![Some(a.fence()), Some(b.fence())];
    expected.sort();
    // (On the embedded store the peers are one runtime: the second read
    // joined the first's hold.)
    expected.dedup();
    assert_eq!(tokens, expected, "{info:?}");
    assert!(info.readers.iter().all(|r| r.remaining_lease.is_some()));
    drop((a, b));
    let w = first.lock("k").write().wait(WAIT).acquire().await.unwrap();
    let info = first.inspect("k").await.unwrap().expect("held");
    assert_eq!(info.mode, LockMode::Write);
    assert!(info.readers.is_empty());
    assert_eq!(info.fence, Some(w.fence()));
}

/// A reader's token exceeds every earlier writer's; a writer's exceeds
/// every earlier holder's, readers included.
async fn tokens_order_readers_against_writers(kind: Kind) {
    let (first, second) = kind.two("rw-tokens").await;
    let w1 = first.lock("k").write().acquire().await.unwrap();
    let w1_token = w1.fence();
    w1.release().await.unwrap();
    let r1 = first.lock("k").read().wait(WAIT).acquire().await.unwrap();
    let r2 = second.lock("k").read().wait(WAIT).acquire().await.unwrap();
    assert!(r1.fence() > w1_token && r2.fence() > w1_token);
    let readers_max = r1.fence().max(r2.fence());
    drop((r1, r2));
    let w2 = second.lock("k").write().wait(WAIT).acquire().await.unwrap();
    assert!(w2.fence() > readers_max, "{} <= {readers_max}", w2.fence());
}

/// A reader that stops renewing (a fixed lease: a crashed reader's ends
/// the same way) loses its share when its lease passes, while a reader
/// renewed by the watchdog keeps its own: the key stays read-held by the
/// live reader alone, the dead one's release disturbs nothing, and a writer
/// stays out until the live reader leaves.
async fn a_dead_readers_share_ends_with_its_lease_while_other_readers_renew(kind: Kind) {
    let (first, second) = kind.two("rw-dead-reader").await;
    // (Long enough that the live reader's renewals, a third of it apart,
    // keep up on a loaded machine.)
    let lease = Duration::from_millis(1000);
    let reading = |rt: &LockRuntime| rt.lock("k").read().lease(lease);
    let dead = reading(&first).watchdog(false).acquire().await.unwrap();
    let live = reading(&second).acquire().await.unwrap();
    tokio::time::timeout(WAIT, dead.lost())
        .await
        .expect("the fixed lease never ran out");
    // The server counts the lease from a moment after the client does:
    // poll (bounded) until the backend, too, lists one reader.
    let mut info = None;
    let one_reader = async || {
        info = first.inspect("k").await.unwrap();
        info.as_ref().is_none_or(|i| i.readers.len() == 1)
    };
    poll_until(
        "the dead reader is no longer listed",
        Duration::from_secs(2),
        one_reader,
    )
    .await;
    let info = info.expect("the live reader's hold went too");
    assert_eq!(info.mode, LockMode::Read);
    assert_eq!(
        info.readers.len(),
        1,
        "the dead reader is still listed: {info:?}"
    );
    assert_eq!(info.readers[0].fence, Some(live.fence()), "{info:?}");
    assert!(dead.release().await.is_err(), "a dead share was released");
    // Three of its leases later the live reader still holds, renewed.
    tokio::time::sleep(lease * 3).await;
    assert!(!live.is_lost(), "the live reader lost its share");
    assert!(!try_takes(first.lock("k").write()).await);
    live.release().await.unwrap();
    let writer = first.lock("k").write().try_acquire().await.unwrap();
    assert!(writer.is_some(), "the key stayed taken after its readers");
}

/// A reader that leaves while another reads on frees nothing: a waiting
/// writer stays out, and the key's lease (what a writer learns it must
/// wait) shrinks to the end of the remaining reader's; the last reader's
/// release lets the writer in at once, long before the first reader's
/// lease (30 s) would have ended.
async fn a_reader_leaving_other_readers_frees_nothing(kind: Kind) {
    let (first, second) = kind.two("rw-leave").await;
    let short = Duration::from_secs(2);
    let long = Duration::from_secs(30);
    let long_reader = first.lock("k").read().lease(long).acquire().await.unwrap();
    let short_reader = second
        .lock("k")
        .read()
        .lease(short)
        .acquire()
        .await
        .unwrap();
    let rt = second.clone();
    let writer = tokio::spawn(async move {
        let guard = rt.lock("k").write().wait(WAIT).acquire().await?;
        let entered = Instant::now();
        guard.release().await?;
        Ok::<_, LockError>(entered)
    });
    wait_until("the writer waits", || second.stats().waiting == 1).await;
    long_reader.release().await.unwrap();
    let info = first
        .inspect("k")
        .await
        .unwrap()
        .expect("a reader reads on");
    assert_eq!(info.mode, LockMode::Read);
    assert_eq!(info.readers.len(), 1, "{info:?}");
    assert_eq!(info.fence, Some(short_reader.fence()), "{info:?}");
    let name = first.backend_key("k");
    if let Some(mut con) = kind.connection_storing(&name).await {
        let pttl: i64 = redis::AsyncCommands::pttl(&mut con, &name).await.unwrap();
        assert!(
            0 < pttl && pttl <= 2_000,
            "the key's lease was not cut to the remaining reader's: {pttl} ms"
        );
    }
    // (A span of time in which nothing may happen.)
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!writer.is_finished(), "the writer entered beside a reader");
    let released = Instant::now();
    short_reader.release().await.unwrap();
    let entered = writer.await.unwrap().unwrap();
    assert!(
        entered - released < Duration::from_secs(1),
        "the writer was not woken by the last reader's release"
    );
}

/// `downgrade` turns a write hold into a read hold: same token, readers of
/// other runtimes enter, writers do not.
async fn a_downgraded_hold_keeps_its_token_and_writers_out_and_lets_readers_in(kind: Kind) {
    let (first, second) = kind.two("rw-downgrade").await;
    let write = first.lock("k").write().acquire().await.unwrap();
    let token = write.fence();
    let read = write.downgrade().await.unwrap();
    assert_eq!((read.mode(), read.fence()), (LockMode::Read, token));
    assert!(!read.is_lost());
    assert!(!try_takes(second.lock("k").write()).await);
    assert!(!try_takes(second.lock("k")).await);
    let other = second.lock("k").read().try_acquire().await.unwrap();
    assert!(
        other.is_some(),
        "a reader was kept out of a downgraded hold"
    );
    let info = first.inspect("k").await.unwrap().expect("held");
    assert_eq!(info.mode, LockMode::Read);
    assert!(
        info.readers.iter().any(|r| r.fence == Some(token)),
        "the downgraded hold shows another token: {info:?}"
    );
    drop(other);
    read.release().await.unwrap();
    let next = second.lock("k").write().wait(WAIT).acquire().await.unwrap();
    assert!(next.fence() > token);
}

/// A writer that waits while a hold is downgraded does not slip in during
/// the downgrade: it enters once the read hold is released.
async fn a_writer_waiting_through_a_downgrade_enters_only_after_the_read(kind: Kind) {
    let runtime = kind.runtime(&lock_tests::unique("rw-downgrade-wait")).await;
    let write = runtime.lock("k").write().acquire().await.unwrap();
    let token = write.fence();
    let entered = Arc::new(AtomicU64::new(0));
    let (rt, seen) = (runtime.clone(), entered.clone());
    let writer = tokio::spawn(async move {
        let guard = rt.lock("k").write().wait(WAIT).acquire().await?;
        seen.store(guard.fence(), Ordering::SeqCst);
        guard.release().await
    });
    wait_until("the writer waits", || runtime.stats().waiting == 1).await;
    let read = write.downgrade().await.unwrap();
    // (A writer let in would have taken the key by now: give it the time a
    // wake-up and one attempt take, many times over.)
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        entered.load(Ordering::SeqCst),
        0,
        "a writer entered a read hold"
    );
    read.release().await.unwrap();
    tokio::time::timeout(WAIT, writer)
        .await
        .expect("the writer never entered")
        .unwrap()
        .unwrap();
    assert!(entered.load(Ordering::SeqCst) > token);
}

/// Redisson's order: a read taken inside the write hold, then the write
/// released, leaves a read hold with the write's token.
async fn releasing_the_write_under_a_nested_read_downgrades(kind: Kind) {
    let (first, second) = kind.two("rw-redisson").await;
    let write = first.lock("k").write().acquire().await.unwrap();
    let read = write.scope(first.lock("k").read().acquire()).await.unwrap();
    assert_eq!(read.fence(), write.fence());
    write.release().await.unwrap();
    assert!(!read.is_lost());
    assert!(!try_takes(second.lock("k").write()).await);
    assert!(try_takes(second.lock("k").read()).await);
    read.release().await.unwrap();
    assert!(try_takes(second.lock("k").write()).await);
}

/// A write guard dropped while a read nested in it lives, and the read
/// dropped right after, leave nothing behind: the key is free at once for
/// a writer of another runtime (not held by a read hold left over for its
/// lease). Where the backend downgrades in the background (the embedded
/// store, etcd, ZooKeeper), the read's release goes out behind that downgrade;
/// elsewhere the hold stays a write hold until the read ends.
async fn a_dropped_write_guard_and_its_nested_read_leave_the_key_free(kind: Kind) {
    let (first, second) = kind.two("rw-drop-downgrade").await;
    let quick = Duration::from_secs(5);
    // Many times over: the release never overtakes the downgrade.
    for round in 0..10 {
        let write = first.lock("k").write().wait(quick).acquire().await.unwrap();
        let read = write.scope(first.lock("k").read().acquire()).await.unwrap();
        drop(write);
        drop(read);
        let next = second.lock("k").write().wait(quick).acquire().await;
        let next = next.unwrap_or_else(|e| panic!("round {round}: the key stayed held: {e}"));
        next.release().await.unwrap();
    }
}

/// A write guard dropped under a nested read (nobody awaits its release)
/// downgrades in the background: a reader of another runtime enters, a
/// writer does not until the read is released.
async fn dropping_the_write_under_a_nested_read_downgrades_in_the_background(kind: Kind) {
    let (first, second) = kind.two("rw-drop-readers-enter").await;
    let write = first.lock("k").write().acquire().await.unwrap();
    let token = write.fence();
    let read = write.scope(first.lock("k").read().acquire()).await.unwrap();
    drop(write);
    let other = second.lock("k").read().wait(WAIT).acquire().await.unwrap();
    assert!(!read.is_lost());
    assert_eq!(read.fence(), token);
    assert!(!try_takes(second.lock("k").write()).await);
    drop(other);
    read.release().await.unwrap();
    let next = second.lock("k").write().wait(WAIT).acquire().await.unwrap();
    assert!(next.fence() > token);
}

/// A read that races the release of the process's last read frame either
/// joins the hold before the release (which then frees nothing) or takes a
/// backend hold of its own: either way it is inside a hold the store has.
/// A join decided on a hold whose release is out would read beside a
/// writer of another process (the peer's try-once write must fail while
/// the read is held). Thirty races, each on two tasks.
async fn a_read_racing_the_last_readers_release_is_inside_a_backend_hold(kind: Kind) {
    let (first, second) = kind.two("rw-join-race").await;
    let joined = first.stats().joined_locally;
    for round in 0..30 {
        let guard = first.lock("k").read().acquire().await.unwrap();
        let releasing = tokio::spawn(guard.release());
        let rt = first.clone();
        let reading = tokio::spawn(async move { rt.lock("k").read().wait(WAIT).acquire().await });
        let reader = reading.await.unwrap().unwrap();
        releasing.await.unwrap().unwrap();
        assert!(!reader.is_lost(), "round {round}: the read's hold is lost");
        let writer = second.lock("k").write().try_acquire().await.unwrap();
        assert!(
            writer.is_none(),
            "round {round}: a writer entered beside a read that raced the last release \
             (joined so far: {})",
            first.stats().joined_locally - joined
        );
        let info = first.inspect("k").await.unwrap().expect("read-held");
        assert_eq!(info.mode, LockMode::Read, "round {round}: {info:?}");
        reader.release().await.unwrap();
    }
    assert_eq!(first.stats().held, 0);
}

/// Shutdown with a read hold that other tasks joined: every guard on it
/// reports the hold lost (the joined ones too: no body may go on reading
/// after the backend hold went back), and a writer of another process gets
/// the key.
async fn shutdown_ends_joined_reads_and_frees_the_key(kind: Kind) {
    let prefix = unique("rw-join-shutdown");
    // (Joins count from the hold's reply, 5 ms by default: three reads
    // spawned one after another on a loaded machine took longer, and the
    // third went to the backend. The window is not what this test checks.)
    let builder = kind.builder(&prefix).cohort(32, Duration::from_secs(5));
    let first = builder.build().await.unwrap();
    let second = kind.peer(&first, &prefix).await;
    let joined = first.stats().joined_locally;
    let readers: Vec<_> = {
        let mut readers = Vec::new();
        for _ in 0..3 {
            let rt = first.clone();
            let reader = tokio::spawn(async move { rt.lock("k").read().acquire().await });
            readers.push(reader.await.unwrap().unwrap());
        }
        readers
    };
    assert_eq!(first.stats().joined_locally, joined + 2, "two reads joined");
    assert_eq!(first.stats().held, 1);
    let token = readers[0].fence();
    first.shutdown().await.unwrap();
    for (i, reader) in readers.iter().enumerate() {
        assert!(
            reader.is_lost(),
            "reader {i} still counts its hold after shutdown"
        );
    }
    let late = first.lock("k").read().try_acquire().await;
    assert!(
        matches!(late, Err(LockError::ShutDown)),
        "a read after shutdown: {:?}",
        late.map(|g| g.map(|g| g.fence()))
    );
    let writer = second.lock("k").write().wait(WAIT).acquire().await.unwrap();
    assert!(writer.fence() > token);
    writer.release().await.unwrap();
    drop(readers);
}

/// The release of a write guard (an awaited downgrade: a read is nested in
/// it) and the release of that read, moved to another task, race: whichever
/// goes first, both succeed, no guard reports a loss, and the key is free
/// for a writer of another process at once (not after a lease). Twenty
/// races.
async fn a_downgrade_racing_the_nested_reads_release_frees_the_key_without_an_error(kind: Kind) {
    downgrade_races_release(kind, false).await;
}

/// [`a_downgrade_racing_the_nested_reads_release_frees_the_key_without_an_error`]
/// in fair mode.
async fn a_fair_downgrade_racing_the_nested_reads_release_frees_the_key_without_an_error(
    kind: Kind,
) {
    downgrade_races_release(kind, true).await;
}

async fn downgrade_races_release(kind: Kind, fair: bool) {
    let (first, second) = kind.two("rw-downgrade-race").await;
    for round in 0..20 {
        let write = first.lock("k").write().fair(fair).acquire().await.unwrap();
        let read = write
            .scope(first.lock("k").read().fair(fair).acquire())
            .await
            .unwrap();
        let token = write.fence();
        let (write_done, read_done) =
            tokio::join!(tokio::spawn(write.release()), tokio::spawn(read.release()));
        write_done
            .unwrap()
            .unwrap_or_else(|e| panic!("round {round}: the write's release: {e:?}"));
        read_done
            .unwrap()
            .unwrap_or_else(|e| panic!("round {round}: the read's release: {e:?}"));
        assert_eq!(first.stats().held, 0, "round {round}");
        let next = second
            .lock("k")
            .write()
            .fair(fair)
            .wait(WAIT)
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("round {round}: the key was left held: {e:?}"));
        assert!(next.fence() > token, "round {round}");
        next.release().await.unwrap();
    }
}

/// A read nested in a read that joined another task's hold re-enters that
/// one shared hold; frames of the two tasks go in any order, and the
/// backend hold stands (a writer of another process stays out) until the
/// last of them.
async fn a_read_nested_in_a_joined_read_keeps_the_shared_hold_until_the_last_frame(kind: Kind) {
    let (first, second) = kind.two("rw-join-nested").await;
    let owner = first.lock("k").read().acquire().await.unwrap();
    let joined_before = first.stats().joined_locally;
    let rt = first.clone();
    let joined = tokio::spawn(async move { rt.lock("k").read().acquire().await })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.stats().joined_locally, joined_before + 1);
    let nested = joined
        .scope(first.lock("k").read().acquire())
        .await
        .unwrap();
    assert_eq!(nested.fence(), owner.fence());
    assert_eq!(first.stats().held, 1, "one backend hold");
    let writer_kept_out = || async {
        second
            .lock("k")
            .write()
            .try_acquire()
            .await
            .unwrap()
            .is_none()
    };
    owner.release().await.unwrap();
    assert!(
        writer_kept_out().await,
        "the owner's release freed the shared hold"
    );
    joined.release().await.unwrap();
    assert!(!nested.is_lost());
    assert!(
        writer_kept_out().await,
        "the joined read's release freed the hold its nested read is in"
    );
    nested.release().await.unwrap();
    assert_eq!(first.stats().held, 0);
    let writer = second.lock("k").write().wait(WAIT).acquire().await.unwrap();
    writer.release().await.unwrap();
}
