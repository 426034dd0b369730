//! Redis unreachable: the server frozen (SIGSTOP) for longer than the lease,
//! and the runtime's connections killed by the server (`CLIENT KILL`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use lock_runtime::{with_lock, LockError, LockRuntime};
use lock_testkit::signal::{self, Signal};
use lock_tests::unique;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::{ms, numsub, own_server};

const LEASE: Duration = Duration::from_millis(600);
const TIMEOUTS: Duration = Duration::from_millis(300);
const WAIT: Duration = Duration::from_secs(1);

/// SIGSTOPs the server; SIGCONTs it when dropped (also on a failed assert).
struct Frozen(Option<u32>);

impl Frozen {
    fn stop(pid: u32) -> Frozen {
        signal::send(pid, Signal::Stop).unwrap();
        Frozen(Some(pid))
    }

    fn thaw(mut self) {
        if let Some(pid) = self.0.take() {
            signal::send(pid, Signal::Cont).unwrap();
        }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if let Some(pid) = self.0.take() {
            let _ = signal::send(pid, Signal::Cont);
        }
    }
}

/// A waiter with `WAIT` on `key`; returns when it started, ended, and how.
fn spawn_waiter(
    rt: &LockRuntime,
    key: &str,
) -> tokio::task::JoinHandle<(Instant, Instant, Result<u64, LockError>)> {
    let rt = rt.clone();
    let key = key.to_owned();
    tokio::spawn(async move {
        let start = Instant::now();
        let outcome = rt.lock(&key).wait(WAIT).acquire().await;
        let end = Instant::now();
        let outcome = match outcome {
            Ok(guard) => {
                let fence = guard.fence();
                drop(guard);
                Ok(fence)
            }
            Err(e) => Err(e),
        };
        (start, end, outcome)
    })
}

/// A holder in abort mode, locked before the freeze; returns when it ended
/// and how.
async fn spawn_holder(
    rt: &LockRuntime,
    key: &str,
) -> tokio::task::JoinHandle<(Instant, Result<(), LockError>)> {
    let (in_tx, entered) = oneshot::channel();
    let rt = rt.clone();
    let key = key.to_owned();
    let task = tokio::spawn(async move {
        let result = with_lock(rt.lock(&key).lease(LEASE), async move {
            let _ = in_tx.send(());
            std::future::pending::<()>().await;
            Ok::<_, LockError>(())
        })
        .await;
        (Instant::now(), result)
    });
    entered.await.expect("the holder entered its body");
    task
}

/// After SIGCONT the runtimes lock and release again (bounded retries);
/// returns how long after the thaw the first lock worked.
async fn recovers(thawed_at: Instant, key: &str, runtimes: [&LockRuntime; 2]) -> Duration {
    let [first, second] = runtimes;
    let mut attempts = 0;
    let mut recovered = None;
    while thawed_at.elapsed() < Duration::from_secs(5) && attempts < 50 {
        attempts += 1;
        match first
            .lock(key)
            .lease(LEASE)
            .wait(Duration::from_millis(500))
            .acquire()
            .await
        {
            Ok(guard) => {
                guard.release().await.expect("release after SIGCONT");
                recovered = Some(thawed_at.elapsed());
                break;
            }
            Err(e) => println!("SIGSTOP: attempt {attempts} after SIGCONT: {e}"),
        }
    }
    let recovered = recovered.expect("no lock within 5 s of SIGCONT");
    let guard = second
        .lock(unique("frozen-other"))
        .wait(Duration::from_secs(3))
        .acquire()
        .await
        .expect("the other runtime locks again after SIGCONT");
    guard.release().await.expect("release after SIGCONT");
    for rt in runtimes {
        let stats = rt.stats();
        assert_eq!(
            (stats.held, stats.waiting_keys, stats.watchdog.tracked),
            (0, 0, 0),
            "{stats:?}"
        );
    }
    println!(
        "SIGSTOP: after SIGCONT a lock was taken and released {} ms later ({attempts} attempt(s))",
        ms(recovered)
    );
    recovered
}

/// The server is frozen for 1.6 s (lease 600 ms, response timeout 300 ms):
/// the holder is told `Lost` within about one lease + response timeout of
/// the stop, and after SIGCONT the same runtimes acquire and release again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_server_tells_the_holder_lost_and_recovers_after_sigcont() {
    let (_turn, server, _, holder, peer) = own_server("frozen", TIMEOUTS).await;
    let key = unique("frozen-key");

    let held = spawn_holder(&holder, &key).await;
    // Let the watchdog renew once or twice.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let frozen = Frozen::stop(server.pid());
    let stopped_at = Instant::now();
    let (lost_at, result) = tokio::time::timeout(Duration::from_secs(5), held)
        .await
        .expect("the holder was not told within 5 s that Redis is gone")
        .expect("holder task");
    let lost_after = lost_at - stopped_at;
    match &result {
        Err(LockError::Lost { key: k }) => assert_eq!(k, &key),
        other => panic!("a holder cut off from Redis should get Err(Lost), got {other:?}"),
    }
    println!(
        "SIGSTOP: lease {} ms, response timeout {} ms: holder got Lost {} ms after the stop",
        ms(LEASE),
        ms(TIMEOUTS),
        ms(lost_after)
    );
    assert!(
        lost_after <= LEASE + TIMEOUTS + Duration::from_millis(300),
        "the holder learnt of the loss {lost_after:?} after the stop (lease {LEASE:?} + response timeout {TIMEOUTS:?})"
    );
    assert!(holder.stats().watchdog.lost >= 1);

    // Keep it frozen well past the lease, then thaw.
    tokio::time::sleep_until(stopped_at + Duration::from_millis(1600)).await;
    frozen.thaw();
    recovers(Instant::now(), &key, [&peer, &holder]).await;
}

/// While the server is frozen, a waiter already queued behind a holder and
/// one arriving during the freeze, each with a 1 s wait, end with
/// `Err(Timeout)` at their deadline (within 500 ms after it), and do not
/// hang; after SIGCONT the runtimes work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_server_times_out_waiters_at_their_deadline() {
    let (_turn, server, _, holder, peer) = own_server("frozen-wait", TIMEOUTS).await;
    let key = unique("frozen-wait-key");

    let held = spawn_holder(&holder, &key).await;
    let queued = spawn_waiter(&peer, &key);
    for _ in 0..200 {
        if peer.stats().waiting_keys == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        peer.stats().waiting_keys,
        1,
        "the first waiter never queued"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;

    let frozen = Frozen::stop(server.pid());
    let stopped_at = Instant::now();
    let arriving = spawn_waiter(&peer, &key);

    let mut wrong = Vec::new();
    for (name, task) in [("queued", queued), ("arriving", arriving)] {
        let (start, end, outcome) = tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap_or_else(|_| panic!("the {name} waiter hung"))
            .expect("waiter task");
        let took = end - start;
        println!(
            "SIGSTOP: {name} waiter (wait {} ms) ended after {} ms: {}",
            ms(WAIT),
            ms(took),
            match &outcome {
                Ok(fence) => format!("acquired?! fence {fence}"),
                Err(e) => e.to_string(),
            }
        );
        assert!(
            took <= WAIT + Duration::from_millis(500),
            "the {name} waiter took {took:?}, more than its wait + 500 ms"
        );
        match outcome {
            Err(LockError::Timeout { .. }) if took + Duration::from_millis(50) >= WAIT => {}
            other => wrong.push(format!("{name} waiter: {other:?} after {took:?}")),
        }
    }

    let _ = tokio::time::timeout(Duration::from_secs(5), held).await;
    tokio::time::sleep_until(stopped_at + Duration::from_millis(1600)).await;
    frozen.thaw();
    recovers(Instant::now(), &key, [&peer, &holder]).await;

    assert!(
        wrong.is_empty(),
        "a waiter should end with Err(Timeout) at its deadline while Redis is frozen: {wrong:?}"
    );
}

/// Kills every client connection but the test's own (`CLIENT KILL ID`): the
/// runtimes reconnect by themselves, the waiter's subscription comes back,
/// and the holder's release after the kill still wakes the waiter at once
/// (its lease is 10 s, so only the release message can explain a quick
/// hand-over); fresh acquires work on both runtimes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connections_reconnect_and_resubscribe() {
    let (_turn, server, _, holder, peer) = own_server("ckill", TIMEOUTS).await;
    let key = unique("ckill-key");
    let channel = format!("{}:released", holder.backend_key(&key));
    let mut con = server.connection().await;

    let request = holder.lock(&key).lease(Duration::from_secs(10));
    let guard = request.acquire().await.unwrap();
    let waiter = {
        let rt = peer.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let outcome = rt.lock(&key).wait(Duration::from_secs(20)).acquire().await;
            (Instant::now(), outcome)
        })
    };
    let mut queued = false;
    for _ in 0..200 {
        if peer.stats().waiting_keys == 1 && numsub(&mut con, &channel).await == 1 {
            queued = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(queued, "the waiter never subscribed");

    let me: i64 = redis::cmd("CLIENT")
        .arg("ID")
        .query_async(&mut con)
        .await
        .unwrap();
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut con)
        .await
        .unwrap();
    let ids: Vec<i64> = list
        .lines()
        .filter_map(|l| l.strip_prefix("id="))
        .filter_map(|l| l.split(' ').next())
        .filter_map(|id| id.parse().ok())
        .filter(|id| *id != me)
        .collect();
    let mut killed = 0;
    for id in &ids {
        let n: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("ID")
            .arg(id)
            .query_async(&mut con)
            .await
            .unwrap();
        killed += n;
    }
    let killed_at = Instant::now();
    assert!(
        killed >= 2,
        "expected the two runtimes' connections among {ids:?}, killed {killed}"
    );

    // The waiter's subscription is re-established on a new connection.
    let mut resubscribed = None;
    for _ in 0..500 {
        if numsub(&mut con, &channel).await == 1 {
            resubscribed = Some(killed_at.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let resubscribed = resubscribed.expect("the waiter's channel was not resubscribed within 5 s");
    let after: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(!waiter.is_finished(), "the waiter gave up on the kill");

    let released_at = Instant::now();
    guard
        .release()
        .await
        .expect("the holder releases after its connection was killed");
    let (acquired_at, outcome) = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was not woken within 5 s of the release (10 s lease)")
        .expect("waiter task");
    let next = outcome.expect("the waiter gets the lock");
    let handoff = acquired_at - released_at;
    println!(
        "CLIENT KILL: killed {killed} connections; waiter resubscribed {} ms later; \
         release after the kill woke it in {} µs; clients now: {}",
        ms(resubscribed),
        handoff.as_micros(),
        after.lines().count()
    );
    assert!(
        handoff < Duration::from_millis(500),
        "the waiter got the lock {handoff:?} after the release: its wake-up was lost"
    );
    next.release().await.unwrap();

    for rt in [&holder, &peer] {
        let request = rt.lock(unique("ckill-fresh")).wait(Duration::from_secs(2));
        let g = request
            .acquire()
            .await
            .expect("a fresh acquire after the kill");
        g.release().await.unwrap();
        let stats = rt.stats();
        assert_eq!(
            (stats.held, stats.waiting_keys, stats.watchdog.tracked),
            (0, 0, 0),
            "{stats:?}"
        );
    }
}
