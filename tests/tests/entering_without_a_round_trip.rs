#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Entering without a round trip: a fair handoff taken from its message and
//! a hold passed between tasks of one process (cohorting) skip the server.
//! Each may be entered only if, at the moment the task enters, the hold is
//! not lost, its client-side validity is ahead, and no connection was lost
//! since the server last confirmed it. Between the moment such a hold
//! reached the process and the moment a task enters it, the executor can
//! stall, the process can be stopped, the server can restart empty: these
//! tests put each of those in between, with real servers.

use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use lock_runtime::{with_lock, LockError, LockGuard, LockMode, LockRuntime};
use lock_testkit::RedisServer;
use lock_tests::spawn::Timed;
use lock_tests::stored::{clear_queue, kill_clients, queue_ghost};
use lock_tests::{
    builder_at, poll_until, runtime_at, spawn_acquire, unique, until_listed, wait_until,
    StallableExecutor,
};

use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A server of the test's own and three fair runtimes on it with the
/// default cohorting and a 10 s lease (processes A, B and C), with the
/// backend name of the key `k` and a plain connection to the server.
struct Scene {
    server: RedisServer,
    a: LockRuntime,
    b: LockRuntime,
    c: LockRuntime,
    prefix: String,
    hash: String,
    con: MultiplexedConnection,
}

impl Scene {
    /// Starts the server and the three runtimes, under a prefix made from
    /// `name`.
    async fn start(name: &str) -> Scene {
        let server = RedisServer::start();
        let prefix = unique(name);
        let fair = || async {
            builder_at(&server.url(), &prefix)
                .fair(true)
                .default_lease(LEASE)
                .build()
                .await
                .expect("build the lock runtime")
        };
        let (a, b, c) = (fair().await, fair().await, fair().await);
        let hash = a.backend_key("k");
        let con = server.connection().await;
        Scene {
            server,
            a,
            b,
            c,
            prefix,
            hash,
            con,
        }
    }
}

/// The lease of the scene's runtimes.
const LEASE: Duration = Duration::from_secs(10);

/// How long a test waits for a step that should come at once (a place
/// queued, a key taken from a fresh server, an executor stalled).
const PATIENCE: Duration = Duration::from_secs(10);

/// The lease that a frozen server outlasts; the wait of a call that must
/// find a key busy.
const SHORT: Duration = Duration::from_secs(1);

/// The wait of a waiter that the test, not its deadline, ends.
const LONG: Duration = Duration::from_secs(30);

/// Waits until `runtime` noticed that a connection of its went.
async fn until_connection_lost(runtime: &LockRuntime) {
    wait_until("the runtime saw its connection go", || {
        runtime.stats().connections_lost > 0
    })
    .await;
}

/// Restarts `server` empty, waits until `seen` noticed its connection go,
/// and has `taker` (another process) take `k` from the fresh server.
async fn restart_and_take(
    server: &mut RedisServer,
    seen: &LockRuntime,
    taker: &LockRuntime,
) -> LockGuard {
    server.restart().await;
    until_connection_lost(seen).await;
    taker.lock("k").wait(PATIENCE).acquire().await.unwrap()
}

/// A fair handoff is only good in the connection epoch it arrived in.
/// Process B's waiter is queued; B's executor stalls; A releases, and Redis
/// hands the key to B's place (B's runtime thread records the message);
/// Redis restarts empty, and C takes the key from the fresh server. When
/// B's executor comes back, its waiter must not enter on the recorded
/// handoff: it asks the server, waits for C, and gets a larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_handoff_from_before_a_server_restart_is_not_entered() {
    handoff_from_before_a_restart_is_not_entered(LockMode::Exclusive, LockMode::Exclusive).await;
}

/// A fair *read* handoff is only good in the connection epoch it arrived
/// in, as a write handoff is: B's reader is queued behind A's write; B's
/// executor stalls; A's release hands B's place a read hold; Redis restarts
/// empty and C takes the key (a write). When B's executor runs again, its
/// reader must not enter on the recorded handoff beside C's write: it
/// queues on the fresh server and enters after C, with a larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_read_handoff_from_before_a_server_restart_is_not_entered() {
    handoff_from_before_a_restart_is_not_entered(LockMode::Write, LockMode::Read).await;
}

/// The handoff tests' body: A holds `k` in mode `held`, B waits for it in
/// mode `waits` on an executor that stalls once B is queued; A's release
/// hands the key to B's place, Redis restarts empty and C takes the key.
/// B's waiter, run again, must queue behind C and enter with a larger
/// token, never on the handoff recorded before the restart.
async fn handoff_from_before_a_restart_is_not_entered(held: LockMode, waits: LockMode) {
    let Scene {
        mut server,
        a,
        b,
        c,
        hash,
        mut con,
        ..
    } = Scene::start("entry-handoff").await;
    let held = a.lock("k").mode(held).acquire().await.unwrap();
    let executor = StallableExecutor::start();
    let (entered_tx, mut entered_rx) = oneshot::channel();
    let waiter = {
        let b = b.clone();
        executor.handle().spawn(async move {
            let got = b.lock("k").mode(waits).wait(LONG).acquire().await;
            let _ = entered_tx.send(got.as_ref().map(|g| g.fence()).ok());
            got.map(|g| (g.fence(), g.is_lost()))
        })
    };
    until_listed(&mut con, &hash, 1, PATIENCE).await;
    let resume = executor.stall();
    // The release hands the key to B's place; one more round trip on our
    // own connection, and the message has been written to B's socket.
    held.release().await.unwrap();
    let _: () = redis::cmd("PING").query_async(&mut con).await.unwrap();
    let other = restart_and_take(&mut server, &b, &c).await;
    let token = other.fence();
    resume.send(()).unwrap();
    // B's waiter runs again: it must queue behind C on the fresh server.
    let mut con = server.connection().await;
    tokio::select! {
        entered = &mut entered_rx => panic!(
            "B's waiter ({waits:?}) entered on a handoff from before the restart while C \
             holds the key (B's token {:?}, C's {token})",
            entered.ok().flatten()
        ),
        () = until_listed(&mut con, &hash, 1, PATIENCE) => {}
    }
    other.release().await.unwrap();
    let (fence, lost) = waiter.await.unwrap().unwrap();
    assert!(fence > token, "tokens went back: {fence} after {token}");
    assert!(!lost, "entered a lost hold");
    drop(executor);
}

/// A hold passed to a local waiter (cohorting) is entered only if it is
/// still good when that waiter runs. The waiter's executor stalls right
/// after the hold was passed to it; meanwhile the server stops answering
/// past the lease (as if this process had been stopped), the hold is lost,
/// and another process takes the key. When the executor comes back the
/// waiter must not enter (neither `acquire()` nor a locked body's first
/// step): it waits for the other process and gets a larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passed_hold_lost_before_its_waiter_runs_is_not_entered() {
    let server = RedisServer::start();
    let prefix = unique("entry-passed");
    let plain = || {
        builder_at(&server.url(), &prefix)
            .default_lease(SHORT)
            .fair(false)
    };
    let a = plain().cohort(8, LONG).build().await.unwrap();
    let b = plain().build().await.unwrap();
    let executor = StallableExecutor::start();
    let (release_tx, release_rx) = oneshot::channel::<()>();
    let (entered_tx, mut entered_rx) = oneshot::channel();
    let (stall_tx, stall_rx) = std_mpsc::channel::<std_mpsc::Receiver<()>>();
    let (stalled_tx, stalled_rx) = std_mpsc::channel();
    // The first task holds the key, and when told, releases it (the hold
    // passes to the second task, which waits) and blocks the executor
    // before the second task can run.
    let first = {
        let a = a.clone();
        executor.handle().spawn(async move {
            let guard = a.lock("k").acquire().await.unwrap();
            let _ = release_rx.await;
            guard.release().await.unwrap();
            let resume = stall_rx.recv().unwrap();
            stalled_tx.send(()).unwrap();
            let _ = resume.recv_timeout(LONG);
        })
    };
    let second = {
        let a = a.clone();
        executor.handle().spawn(async move {
            let called = with_lock(a.lock("k").wait(LONG), async {
                let _ = entered_tx.send(lock_runtime::fence());
                Ok::<_, LockError>(lock_runtime::fence())
            });
            called.await
        })
    };
    wait_until("the second task waits", || a.stats().waiting_keys == 1).await;
    let (resume_tx, resume_rx) = std_mpsc::channel();
    stall_tx.send(resume_rx).unwrap();
    release_tx.send(()).unwrap();
    tokio::task::block_in_place(|| stalled_rx.recv_timeout(PATIENCE))
        .expect("the executor stalled");
    assert_eq!(a.stats().passed_locally, 1, "the hold was not passed");
    // The server stops answering past the lease: the hold is lost.
    server.freeze();
    wait_until("the passed hold is found lost", || {
        a.stats().watchdog.lost > 0
    })
    .await;
    server.thaw();
    let other = b.lock("k").wait(PATIENCE).acquire().await.unwrap();
    let token = other.fence();
    resume_tx.send(()).unwrap();
    // The second task runs again: it must wait for the other process.
    let waited = tokio::time::timeout(Duration::from_millis(500), &mut entered_rx).await;
    if let Ok(entered) = waited {
        panic!(
            "a locked body entered on a lost passed hold while another process holds the \
             key (its token {:?}, the other's {token})",
            entered.ok().flatten()
        );
    }
    other.release().await.unwrap();
    let fence = second.await.unwrap().unwrap().unwrap();
    assert!(fence > token, "tokens went back: {fence} after {token}");
    first.await.unwrap();
    drop(executor);
}

/// A re-entry is a hold entered without a round trip too: after a lost
/// connection, a nested call waits until a renewal confirms the outer hold
/// (or finds it lost) before it enters. The server restarts empty under a
/// running body (`on_lost = continue`, so the body goes on), another process
/// takes the key from the fresh server, and then the body calls a nested
/// locked call on the key: the nested body must not run beside the other
/// process's hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentry_after_a_lost_connection_waits_for_the_hold_to_be_confirmed() {
    let Scene {
        mut server, a, c, ..
    } = Scene::start("entry-reentry").await;
    let (held_tx, held_rx) = oneshot::channel::<()>();
    let (nest_tx, nest_rx) = oneshot::channel::<()>();
    let outer = {
        let a = a.clone();
        tokio::spawn(async move {
            let request = a.lock("k").on_lost(lock_runtime::OnLost::Continue);
            with_lock(request, async {
                held_tx.send(()).unwrap();
                let _ = nest_rx.await;
                let nested = a.lock("k").wait(SHORT);
                let entered =
                    with_lock(nested, async { Ok::<_, LockError>(lock_runtime::fence()) });
                Ok::<_, LockError>(entered.await)
            })
            .await
        })
    };
    held_rx.await.unwrap();
    let other = restart_and_take(&mut server, &a, &c).await;
    nest_tx.send(()).unwrap();
    let nested = outer.await.unwrap();
    let token = other.fence();
    other.release().await.unwrap();
    match nested {
        Ok(Ok(fence)) => panic!(
            "the nested body ran on the restarted server's key held by another process \
             (its token {fence:?}, the other's {token})"
        ),
        // The nested call found the outer hold lost, and then the key busy.
        Ok(Err(LockError::Timeout { .. } | LockError::Lost { .. }))
        | Err(LockError::Lost { .. }) => {}
        other => panic!("unexpected outcome: {other:?}"),
    }
}

/// A read joins another local task's read hold only if the server confirmed
/// that hold since the last lost connection. Process A holds a read; the
/// server restarts empty and C takes the key for a write; A's next reader
/// must not join the hold A had (unconfirmed since, or found lost: it would
/// read beside C's write): it asks the server, and finds the key busy.
/// (`held.rs` checks the join's rule itself, hold by hold.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_after_a_lost_connection_does_not_join_an_unconfirmed_read_hold() {
    let Scene {
        mut server,
        c,
        prefix,
        ..
    } = Scene::start("entry-join").await;
    // Joins allowed for a minute: only the lost connection may stop one.
    let a = builder_at(&server.url(), &prefix)
        .default_lease(LEASE)
        .cohort(32, Duration::from_secs(60))
        .build()
        .await
        .unwrap();
    let first = a.lock("k").read().acquire().await.unwrap();
    let other = restart_and_take(&mut server, &a, &c).await;
    let second = a.lock("k").read().wait(SHORT).acquire().await;
    let token = other.fence();
    other.release().await.unwrap();
    match second {
        Ok(guard) => panic!(
            "a read entered beside another process's write (its token {}, the writer's \
             {token}; joined locally: {})",
            guard.fence(),
            a.stats().joined_locally
        ),
        Err(LockError::Timeout { .. }) => {}
        Err(other) => panic!("unexpected outcome: {other:?}"),
    }
    assert_eq!(a.stats().joined_locally, 0);
    drop(first);
}

/// A fixed-lease hold (`watchdog(false)`) is never renewed, so no renewal can
/// confirm it after a lost connection: it is re-entered on its lease alone,
/// at once (it must not wait for a confirmation that never comes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentry_into_a_fixed_lease_hold_after_a_lost_connection_does_not_hang() {
    let server = RedisServer::start();
    let prefix = unique("hostile-fixed-reentry");
    let a = runtime_at(&server.url(), &prefix).await;
    let mut con = server.connection().await;
    let fixed = || a.lock("k").watchdog(false).lease(Duration::from_secs(20));
    let guard = fixed().acquire().await.unwrap();
    kill_clients(&mut con, &["normal", "pubsub"]).await;
    until_connection_lost(&a).await;
    // The hold is still in Redis (nothing restarted): only the connection went.
    assert!(con.exists::<_, bool>(a.backend_key("k")).await.unwrap());
    let started = Instant::now();
    let nested = guard
        .scope(fixed().wait(Duration::from_secs(3)).acquire())
        .await;
    let took = started.elapsed();
    eprintln!(
        "nested re-entry: {:?} after {took:?}",
        nested.as_ref().map(|g| g.fence())
    );
    assert!(nested.is_ok(), "{nested:?} after {took:?}");
    drop(nested);
    guard.release().await.unwrap();
}

/// A locked body is not polled again once its hold's client-side lease end
/// has passed, also when the body never waits for long (a timer at the
/// lease end fires late: tokio rounds up to the next millisecond and fires
/// timers only when its driver turns; the loss is checked before each poll).
#[tokio::test(flavor = "current_thread")]
async fn a_locked_body_is_not_polled_past_its_client_side_lease_end() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let prefix = unique("hostile-polled-past-lease");
    let a = lock_tests::Kind::Redis.runtime(&prefix).await;
    let lease = Duration::from_millis(20);
    let worst = AtomicU64::new(0);
    let mut most_past = 0u64;
    for _ in 0..20 {
        let mut polls_past = 0u64;
        let request = a.lock("k").watchdog(false).lease(lease);
        let outcome = lock_runtime::with_lock(request, async {
            // valid_until = sent_at + lease <= start + lease.
            let start = Instant::now();
            loop {
                tokio::task::yield_now().await;
                let now = Instant::now();
                if now >= start + lease {
                    polls_past += 1;
                    let past = (now - (start + lease)).as_micros() as u64;
                    worst.fetch_max(past, Ordering::Relaxed);
                }
                if now >= start + lease * 10 {
                    return Ok::<_, lock_runtime::LockError>(());
                }
            }
        })
        .await;
        assert!(
            matches!(outcome, Err(lock_runtime::LockError::Lost { .. })),
            "{outcome:?}"
        );
        most_past = most_past.max(polls_past);
    }
    let worst = worst.load(Ordering::Relaxed);
    eprintln!(
        "most polls past the client-side lease end in one hold: {most_past}, worst {worst} us"
    );
    // The check comes before each poll: a poll that began before the lease
    // end may read the clock after it (the thread can be descheduled in
    // between), but no poll begins after it. (Without the check: thousands.)
    assert!(
        most_past <= 1,
        "{most_past} polls past the lease end, worst {worst} us"
    );
}

/// Fair mode's writer preference reads every queue entry a writer may have
/// left: a live writer entry of an earlier version (`<expiry>:<lease>`, no
/// reserve, no mode) keeps a new reader out of a read-held key, a writer
/// entry that ran out does not, and a live writer queued behind one that
/// ran out still does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_reader_does_not_pass_a_live_writer_entry_of_any_form() {
    let mut s = Scene::start("hostile-rw-ghosts").await;
    let held = s.a.lock("k").read().acquire().await.unwrap();
    let try_read = || async { s.b.lock("k").read().try_acquire().await.unwrap() };

    queue_ghost(&mut s.con, &s.hash, "old-writer", "{expiry}:3000", 20_000).await;
    assert!(
        try_read().await.is_none(),
        "a reader passed a queued writer's entry of an earlier version"
    );
    clear_queue(&mut s.con, &s.hash).await;

    queue_ghost(&mut s.con, &s.hash, "dead-writer", "{expiry}:3000:0", -1000).await;
    let beside = try_read()
        .await
        .expect("a writer entry that ran out kept a reader out");
    assert_eq!(s.b.stats().joined_locally, 0);
    beside.release().await.unwrap();

    queue_ghost(&mut s.con, &s.hash, "dead-writer", "{expiry}:3000:0", -1000).await;
    queue_ghost(
        &mut s.con,
        &s.hash,
        "live-writer",
        "{expiry}:3000:0",
        20_000,
    )
    .await;
    assert!(
        try_read().await.is_none(),
        "a reader passed a live writer queued behind a dead one"
    );
    // Not queued by a try: the queue is the ghosts only.
    let queued: Vec<String> = s
        .con
        .lrange(format!("{}:queue", s.hash), 0, -1)
        .await
        .unwrap();
    assert!(
        queued.iter().all(|id| id.ends_with("-writer")),
        "{queued:?}"
    );
    clear_queue(&mut s.con, &s.hash).await;
    held.release().await.unwrap();
}

/// A reader queued behind a writer whose process went quiet (its entry
/// runs out, nobody releases anything) comes in beside the readers inside
/// once the entry has run out: its place's refresh tells it to try
/// (`refresh.lua`), rather than the reader sleeping until the readers
/// inside leave. The reader inside stays inside all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_queued_behind_a_writer_that_went_quiet_enters_beside_the_readers_inside() {
    let mut s = Scene::start("hostile-rw-quiet-writer").await;
    let held = s.a.lock("k").read().acquire().await.unwrap();
    queue_ghost(&mut s.con, &s.hash, "quiet-writer", "{expiry}:3000:0", 600).await;
    let started = Instant::now();
    let reader = spawn_acquire(s.b.lock("k").read().wait(Duration::from_secs(8)));
    // Queued behind the writer's entry (the key is only read-held).
    until_listed(&mut s.con, &s.hash, 2, PATIENCE).await;
    let (_, reader) = tokio::time::timeout(Duration::from_secs(9), reader)
        .await
        .expect("the reader never came in")
        .unwrap();
    let reader =
        reader.expect("the reader waited until its deadline behind a writer entry that ran out");
    let took = started.elapsed();
    eprintln!("the reader came in after {took:?}");
    assert!(!held.is_lost());
    assert_readers_inside(&s.a, 2).await;
    // Well before the reader inside would have left (its lease is 10 s).
    assert!(took < Duration::from_secs(5), "took {took:?}");
    reader.release().await.unwrap();
    held.release().await.unwrap();
}

/// Checks that `k` is read-held by `readers` readers, as `runtime` sees it.
async fn assert_readers_inside(runtime: &LockRuntime, readers: usize) {
    let info = runtime.inspect("k").await.unwrap().expect("read-held");
    assert_eq!(info.readers.len(), readers, "{info:?}");
}

/// Waits for the spawned acquire `task` to get its hold (bounded:
/// [`PATIENCE`]), and returns how long after `since` it did, with the hold.
async fn entered_after(
    task: JoinHandle<Timed>,
    since: Instant,
    who: &str,
) -> (Duration, LockGuard) {
    let (entered, guard) = tokio::time::timeout(PATIENCE, task)
        .await
        .unwrap_or_else(|_| panic!("{who} never entered"))
        .unwrap();
    let guard = guard.unwrap_or_else(|e| panic!("{who}: {e:?}"));
    (entered.into_std().duration_since(since), guard)
}

/// A read hold handed to a process's place whose only waiter is cancelled
/// before it runs again goes on at once: the place is given back, and the
/// writer of another process queued behind it enters well before the
/// handoff's claim (3 s) would have run out. B's reader waits on an
/// executor that stalls; A's release hands B's place a read hold; the
/// reader is cancelled; when B's executor runs again, C's writer enters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_handoff_to_a_cancelled_reader_goes_on_to_the_writer_behind_at_once() {
    let mut s = Scene::start("hostile-rw-cancelled-reader").await;
    let held = s.a.lock("k").write().acquire().await.unwrap();
    let executor = StallableExecutor::start();
    let reader = {
        let b = s.b.clone();
        executor.handle().spawn(async move {
            let got = b.lock("k").read().wait(LONG).acquire().await;
            got.map(|g| g.fence())
        })
    };
    until_listed(&mut s.con, &s.hash, 1, PATIENCE).await;
    let writer = spawn_acquire(s.c.lock("k").write().wait(PATIENCE));
    until_listed(&mut s.con, &s.hash, 2, PATIENCE).await;
    let resume = executor.stall();
    held.release().await.unwrap();
    // The key goes to B's place as a read hold (C's writer stays queued).
    let read_held = async || {
        let info = s.a.inspect("k").await.unwrap();
        info.is_some_and(|info| info.mode == LockMode::Read)
    };
    let what = "the release hands B's place a read hold";
    poll_until(what, Duration::from_secs(2), read_held).await;
    reader.abort();
    let resumed = Instant::now();
    resume.send(()).unwrap();
    let (took, guard) = entered_after(writer, resumed, "C's writer").await;
    eprintln!("C's writer entered {took:?} after B's executor ran again");
    assert!(
        took < Duration::from_millis(1500),
        "the read hold handed to a cancelled reader sat unused for {took:?}"
    );
    let info = s.a.inspect("k").await.unwrap().expect("held");
    assert_eq!(info.mode, LockMode::Write, "{info:?}");
    assert!(info.readers.is_empty(), "{info:?}");
    guard.release().await.unwrap();
    drop(executor);
}

/// Fair mode: a writer queued between the readers inside and a reader of
/// another process gives up (its wait is cancelled, its place given back);
/// the reader behind it comes in beside the readers inside at once, not at
/// its place's next refresh (most of a second later: a reader that could
/// read would sit asleep behind an entry that is gone). `fair.lua`: a place
/// given back lets in the readers it leaves first in line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_queued_behind_a_writer_that_gives_up_comes_in_at_once() {
    let mut s = Scene::start("hostile-rw-writer-gives-up").await;
    let held = s.a.lock("k").read().acquire().await.unwrap();
    let writer = spawn_acquire(s.b.lock("k").write().wait(LONG));
    until_listed(&mut s.con, &s.hash, 1, PATIENCE).await;
    let reader = spawn_acquire(s.c.lock("k").read().wait(PATIENCE));
    until_listed(&mut s.con, &s.hash, 2, PATIENCE).await;
    // Once C's place has settled (its first refresh rewrote its entry: no
    // attempt of C's is left in flight that could find the writer gone by
    // itself), B's writer gives up: only what that does can let C in.
    let place: String = s.con.lindex(format!("{}:queue", s.hash), 1).await.unwrap();
    let entries = format!("{}:queued", s.hash);
    let first: String = s.con.hget(&entries, &place).await.unwrap();
    let refreshed = async || s.con.hget::<_, _, String>(&entries, &place).await.unwrap() != first;
    poll_until("C's place is refreshed", Duration::from_secs(3), refreshed).await;
    let gave_up = Instant::now();
    writer.abort();
    let (took, guard) = entered_after(reader, gave_up, "the reader").await;
    eprintln!("the reader came in {took:?} after the writer ahead of it gave up");
    assert!(
        took < Duration::from_millis(300),
        "the reader sat behind a writer that had given up for {took:?}"
    );
    assert!(!held.is_lost());
    assert_readers_inside(&s.a, 2).await;
    guard.release().await.unwrap();
    held.release().await.unwrap();
}

/// Fair mode, cancellation at every step of a reader's wait: a reader of
/// process B waits behind A's write and is cancelled after 0, 0.25, 0.5 …
/// 10 ms (before, during and after its attempts; its place queued or
/// not, its script answered or not). Whatever it left behind, A's release
/// is followed at once by C's writer (not by a handoff claim of 3 s sitting
/// on a place nobody waits on), and nothing is left queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_cancelled_at_any_step_leaves_nothing_that_holds_up_a_writer() {
    let mut s = Scene::start("hostile-rw-cancel-steps").await;
    let mut slowest = Duration::ZERO;
    for step in 0..40u64 {
        let held = s.a.lock("k").write().acquire().await.unwrap();
        let after = Duration::from_micros(step * 250);
        let read = s.b.lock("k").read().wait(PATIENCE).acquire();
        if let Ok(got) = tokio::time::timeout(after, read).await {
            panic!("step {step}: B's read entered beside A's write: {got:?}");
        }
        held.release().await.unwrap();
        let started = Instant::now();
        let writer = s.c.lock("k").write().wait(PATIENCE).acquire().await;
        let writer = writer.unwrap_or_else(|e| panic!("step {step}: {e:?}"));
        let took = started.elapsed();
        slowest = slowest.max(took);
        assert!(
            took < Duration::from_millis(1000),
            "step {step}: C's writer waited {took:?} after A's release"
        );
        writer.release().await.unwrap();
    }
    eprintln!("slowest writer after a cancelled reader: {slowest:?}");
    // Places of cancelled readers must not stay queued.
    until_listed(&mut s.con, &s.hash, 0, SHORT).await;
}
