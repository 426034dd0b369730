//! Redis restarted empty (SIGKILL, then a new server on the same port) while
//! locks are held and waited for.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use lock_runtime::{with_lock, LockError, OnLost};
use lock_tests::unique;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::{ms, numsub, own_server};

const LEASE: Duration = Duration::from_millis(600);
const TIMEOUTS: Duration = Duration::from_millis(300);
const HOLD: Duration = Duration::from_millis(100);

/// Who was inside which key's body, and when.
#[derive(Debug, Clone)]
struct Span {
    who: String,
    key: String,
    start: Instant,
    end: Instant,
    fence: u64,
    lost: bool,
    /// What the release answered, when it was an error.
    release_error: Option<String>,
}

/// Two holders on one runtime (abort mode on `ka`, continue mode on `kc`),
/// two waiters per key on another runtime; the server is SIGKILLed and a new
/// empty one started on the same port. The abort holder returns `Err(Lost)`,
/// the continue holder returns its body's result and the watchdog counts two
/// losses; every waiter then acquires with a fence above the old holder's;
/// no two holders that kept their locks were ever inside one key together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_restart_loses_held_locks_and_waiters_take_over_with_higher_fences() {
    let (_turn, mut server, _, holders, waiters) = own_server("restart", TIMEOUTS).await;
    let ka = unique("restart-abort");
    let kc = unique("restart-continue");
    let lost_before = holders.stats().watchdog.lost;

    // The abort-mode holder: its body never ends by itself.
    let (a_in_tx, a_in) = oneshot::channel();
    let abort = {
        let rt = holders.clone();
        let key = ka.clone();
        tokio::spawn(async move {
            let result = with_lock(rt.lock(&key).lease(LEASE), async move {
                let _ = a_in_tx.send((Instant::now(), lock_runtime::fence().unwrap()));
                std::future::pending::<()>().await;
                Ok::<_, LockError>(())
            })
            .await;
            (Instant::now(), result)
        })
    };
    // The continue-mode holder: its body runs across the restart.
    let (c_in_tx, c_in) = oneshot::channel();
    let cont = {
        let rt = holders.clone();
        let key = kc.clone();
        tokio::spawn(async move {
            let result = with_lock(
                rt.lock(&key).lease(LEASE).on_lost(OnLost::Continue),
                async move {
                    let _ = c_in_tx.send((Instant::now(), lock_runtime::fence().unwrap()));
                    tokio::time::sleep(Duration::from_millis(2500)).await;
                    Ok::<_, LockError>(42)
                },
            )
            .await;
            (Instant::now(), result)
        })
    };
    let (a_start, a_fence) = a_in.await.expect("abort holder entered");
    let (c_start, c_fence) = c_in.await.expect("continue holder entered");

    // Two waiters per key on the other runtime.
    let mut waiting = Vec::new();
    for (key, n) in [(&ka, 0), (&ka, 1), (&kc, 0), (&kc, 1)] {
        let rt = waiters.clone();
        let key = key.clone();
        waiting.push(tokio::spawn(async move {
            let request = rt.lock(&key).lease(LEASE).wait(Duration::from_secs(15));
            let guard = request
                .acquire()
                .await
                .unwrap_or_else(|e| panic!("waiter {n} on {key}: {e}"));
            let start = Instant::now();
            let fence = guard.fence();
            tokio::time::sleep(HOLD).await;
            let end = Instant::now();
            let release_error = guard.release().await.err().map(|e| e.to_string());
            Span {
                who: format!("waiter {n}"),
                key,
                start,
                end,
                fence,
                lost: release_error.is_some(),
                release_error,
            }
        }));
    }
    let mut con = server.connection().await;
    let channels = [
        format!("{}:released", holders.backend_key(&ka)),
        format!("{}:released", holders.backend_key(&kc)),
    ];
    let mut subscribed = false;
    for _ in 0..200 {
        if waiters.stats().waiting_keys == 2
            && numsub(&mut con, &channels[0]).await == 1
            && numsub(&mut con, &channels[1]).await == 1
        {
            subscribed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(subscribed, "the waiters did not queue on both keys");
    drop(con);
    // Let the watchdog renew a couple of times first.
    tokio::time::sleep(Duration::from_millis(400)).await;

    let killed_at = Instant::now();
    server.kill();
    let kill_took = killed_at.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.restart().await;
    let restarted_at = Instant::now();
    let mut con = server.connection().await;
    let dbsize: i64 = redis::cmd("DBSIZE").query_async(&mut con).await.unwrap();

    let (a_end, a_result) = tokio::time::timeout(Duration::from_secs(5), abort)
        .await
        .expect("the abort holder was not stopped within 5 s of the restart")
        .expect("abort holder task");
    match &a_result {
        Err(LockError::Lost { key }) => assert_eq!(key, &ka),
        other => panic!("abort mode: expected Err(Lost), got {other:?}"),
    }
    let (c_end, c_result) = tokio::time::timeout(Duration::from_secs(5), cont)
        .await
        .expect("the continue holder's body did not finish")
        .expect("continue holder task");
    assert!(
        matches!(c_result, Ok(42)),
        "continue mode returns the body's result, got {c_result:?}"
    );
    let lost = holders.stats().watchdog.lost - lost_before;
    assert_eq!(
        lost, 2,
        "the watchdog should have found both holds lost, counted {lost}"
    );

    let mut spans = vec![
        Span {
            who: "abort holder".to_owned(),
            key: ka.clone(),
            start: a_start,
            end: a_end,
            fence: a_fence,
            lost: true,
            release_error: None,
        },
        Span {
            who: "continue holder".to_owned(),
            key: kc.clone(),
            start: c_start,
            end: c_end,
            fence: c_fence,
            lost: true,
            release_error: None,
        },
    ];
    for task in waiting {
        let span = tokio::time::timeout(Duration::from_secs(15), task)
            .await
            .expect("a waiter did not finish within 15 s of the restart")
            .expect("waiter task");
        spans.push(span);
    }

    println!(
        "empty restart: SIGKILL took {} ms, server down {} ms (DBSIZE after restart {dbsize}); abort holder got Lost {} ms \
         after the kill; continue holder finished {} ms after the kill with Ok(42), watchdog lost +{lost}",
        ms(kill_took),
        ms(restarted_at - killed_at),
        ms(a_end - killed_at),
        ms(c_end - killed_at),
    );
    for span in &spans[2..] {
        println!(
            "  {} on {}: acquired {} ms after the restart, fence {} (old holder's {})",
            span.who,
            if span.key == ka { "ka" } else { "kc" },
            span.start
                .saturating_duration_since(restarted_at)
                .as_millis(),
            span.fence,
            if span.key == ka { a_fence } else { c_fence },
        );
    }

    for span in &spans[2..] {
        let old = if span.key == ka { a_fence } else { c_fence };
        assert!(
            !span.lost,
            "{} on {} lost its lock (its release said {:?}): {span:?}",
            span.who, span.key, span.release_error
        );
        assert!(
            span.start >= killed_at,
            "{} got {} while the old holder still had it",
            span.who,
            span.key
        );
        assert!(
            span.fence > old,
            "{} on {}: fence {} not above the old holder's {old} (the fence must survive an empty restart)",
            span.who,
            span.key,
            span.fence
        );
    }
    // Occupancy: holders that kept their locks never overlap on a key.
    for (i, x) in spans.iter().enumerate() {
        for y in &spans[i + 1..] {
            if x.key == y.key && !x.lost && !y.lost {
                assert!(
                    x.end <= y.start || y.end <= x.start,
                    "two holders inside {} at once: {x:?} and {y:?}",
                    x.key
                );
                assert_ne!(x.fence, y.fence, "two holds with one fence: {x:?} {y:?}");
            }
        }
    }
    let across_loss = spans[2..]
        .iter()
        .filter(|s| s.key == kc && s.start < c_end)
        .count();
    println!("  waiters inside kc while the lost continue-mode body still ran: {across_loss}");

    for rt in [&holders, &waiters] {
        let stats = rt.stats();
        assert_eq!(
            (stats.held, stats.waiting_keys, stats.watchdog.tracked),
            (0, 0, 0),
            "{stats:?}"
        );
    }
    // Both runtimes work on the new server.
    let request = holders.lock(&ka).wait(Duration::from_secs(2));
    let guard = request
        .acquire()
        .await
        .expect("the holders' runtime acquires after the restart");
    guard.release().await.unwrap();
}
