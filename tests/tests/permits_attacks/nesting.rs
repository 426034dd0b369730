//! Calls on the same key inside a permit body (siblings of a `join!`,
//! `inherit`ed tasks, a guard's scope) and a wait for permits that the
//! waiting task holds itself: each re-enters or takes turns as a
//! single-key call does, never takes a second permit for one body, and
//! never hangs.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{fence, inherit, permit, with_lock, LockError, LockRuntime};
use lock_tests::{on_every_backend, unique, Kind, Occupancy};
use tokio::time::Instant;

on_every_backend!(
    siblings_and_inherited_tasks_in_a_permit_body_reenter_its_permit_in_turn,
    a_sibling_that_runs_out_of_wait_for_the_body_s_permit_names_the_key,
    a_wait_for_permits_that_guards_of_its_own_task_hold_ends_at_its_deadline_saying_so,
    a_plain_call_nested_in_a_permit_body_keeps_the_body_s_permit_and_its_token,
);

/// How many permits the key has.
const N: u32 = 3;

/// How many permits of `key` below `n` the backend records as held.
async fn held_permits(runtime: &LockRuntime, key: &str, n: u32) -> usize {
    let seen = runtime.inspect_permits(key, n).await.unwrap();
    seen.iter().filter(|info| info.is_some()).count()
}

/// "A nested call on the same key, at any depth, keeps its caller's index
/// and token", and re-entry is strict nesting: inside a permit body, two
/// `join!` arms each making five permit calls of the key, an `inherit`ed
/// task and a call in the scope of a guard of the same body all get the
/// body's permit and token; the arms are never inside at once (they take
/// turns, as single-key siblings do), all end within a bound, and the
/// backend records one permit held the whole time. A task spawned without
/// `inherit` is a stranger and gets another permit.
async fn siblings_and_inherited_tasks_in_a_permit_body_reenter_its_permit_in_turn(kind: Kind) {
    let runtime = kind.runtime(&unique("pa-sib")).await;
    let wait = Duration::from_secs(10);
    let inside = Arc::new(Occupancy::new());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let outer = runtime.lock("n").permits(N).wait(wait);
    let checked = with_lock(outer, async {
        let mine = (permit().unwrap(), fence().unwrap());
        let arm = || {
            let (runtime, inside, seen) = (runtime.clone(), inside.clone(), seen.clone());
            async move {
                for _ in 0..5 {
                    let request = runtime.lock("n").permits(N).wait(wait);
                    let got = with_lock(request, async {
                        let _in = inside.enter();
                        let held = held_permits(&runtime, "n", N).await;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        Ok::<_, LockError>((permit().unwrap(), fence().unwrap(), held))
                    });
                    let got = got.await?;
                    seen.lock().unwrap().push(got);
                }
                Ok::<_, LockError>(())
            }
        };
        let child = || tokio::spawn(inherit(arm()));
        let all = async { tokio::join!(arm(), arm(), child()) };
        let (one, two, three) = tokio::time::timeout(Duration::from_secs(60), all)
            .await
            .expect("sibling permit calls hung");
        one.unwrap();
        two.unwrap();
        three.unwrap().unwrap();
        let guard = runtime.lock("n").permits(N).acquire().await?;
        assert_eq!((guard.permit(), guard.fence()), (Some(mine.0), mine.1));
        let in_scope = guard.scope(async {
            let request = runtime.lock("n").permits(N).wait(wait);
            with_lock(request, async { Ok::<_, LockError>((permit(), fence())) }).await
        });
        assert_eq!(in_scope.await?, (Some(mine.0), Some(mine.1)));
        drop(guard);
        let stranger = tokio::spawn(with_lock(runtime.lock("n").permits(N), async {
            Ok::<_, LockError>(permit())
        }));
        let stranger = stranger.await.unwrap()?;
        assert!(stranger.is_some_and(|p| p != mine.0), "{stranger:?}");
        Ok::<_, LockError>(mine)
    })
    .await;
    let mine = checked.unwrap();
    assert_eq!(inside.max(), 1, "two siblings inside the permit at once");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 15);
    for &(p, token, held) in seen.iter() {
        assert_eq!((p, token), mine, "a sibling on another permit or token");
        assert_eq!(held, 1, "a body's siblings held {held} permits");
    }
}

/// "A `Timeout` names the key, not a permit", also for a call that waits
/// to re-enter its body's permit: a sibling whose wait runs out while the
/// other sibling is inside ends in `Timeout` naming the key (within its
/// wait plus slack), and a sibling's try finds nothing.
async fn a_sibling_that_runs_out_of_wait_for_the_body_s_permit_names_the_key(kind: Kind) {
    let runtime = kind.runtime(&unique("pa-sib-out")).await;
    // Permit 0 held by a guard of no body: the body's permit is `t#1` or `t#2`.
    let zero = runtime.lock("t").acquire().await.unwrap();
    let outer = runtime.lock("t").permits(N);
    let checked = with_lock(outer, async {
        let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let inside = with_lock(runtime.lock("t").permits(N), async {
            entered_tx.send(()).unwrap();
            let _ = done_rx.await;
            Ok::<_, LockError>(())
        });
        let beside = async {
            entered_rx.await.unwrap();
            let started = Instant::now();
            let wait = Duration::from_millis(300);
            let request = runtime.lock("t").permits(N).wait(wait);
            let waited = with_lock(request, async { Ok::<_, LockError>(()) }).await;
            let took = started.elapsed();
            let tried = runtime.lock("t").permits(N).try_acquire().await;
            done_tx.send(()).unwrap();
            (waited, took, tried.map(|g| g.map(|g| g.permit())))
        };
        let (inside, (waited, took, tried)) = tokio::join!(inside, beside);
        inside?;
        Ok::<_, LockError>((waited, took, tried))
    });
    let (waited, took, tried) = tokio::time::timeout(Duration::from_secs(20), checked)
        .await
        .expect("siblings hung")
        .unwrap();
    assert!(
        matches!(&waited, Err(LockError::Timeout { key, .. }) if key == "t"),
        "{waited:?}"
    );
    assert!(took < Duration::from_secs(3), "ran out after {took:?}");
    assert!(matches!(tried, Ok(None)), "{tried:?}");
    zero.release().await.unwrap();
}

/// A wait for permits that guards of the waiting task hold (every one of
/// them) cannot end by a release: it ends at its deadline (plus the try
/// timeout and slack), never hangs, with a `Timeout` naming the key that
/// says this process holds it; a try finds none, and says so too (as one
/// key's try-once does).
async fn a_wait_for_permits_that_guards_of_its_own_task_hold_ends_at_its_deadline_saying_so(
    kind: Kind,
) {
    let runtime = kind.runtime(&unique("pa-self")).await;
    let mut guards = Vec::new();
    for _ in 0..N {
        guards.push(runtime.lock("d").permits(N).acquire().await.unwrap());
    }
    let mut taken: Vec<u32> = guards.iter().map(|g| g.permit().unwrap()).collect();
    taken.sort_unstable();
    assert_eq!(taken, [0, 1, 2]);
    let tried = runtime.lock("d").permits(N).try_acquire().await.unwrap();
    assert!(
        tried.is_none(),
        "a fourth permit: {:?}",
        tried.map(|g| g.permit())
    );
    let once = runtime
        .lock("d")
        .permits(N)
        .wait(Duration::ZERO)
        .acquire()
        .await;
    match &once {
        Err(LockError::Timeout { key, cause, .. }) => {
            assert_eq!(key, "d");
            assert!(cause.held_by_this_process(), "a try-once: {once:?}");
        }
        other => panic!("a try-once: {:?}", other.as_ref().map(|g| g.permit())),
    }
    let wait = Duration::from_millis(800);
    let started = Instant::now();
    let request = runtime.lock("d").permits(N).wait(wait).acquire();
    let waited = tokio::time::timeout(Duration::from_secs(20), request)
        .await
        .expect("a wait for its own task's permits hung");
    let took = started.elapsed();
    match &waited {
        Err(LockError::Timeout { key, cause, .. }) => {
            assert_eq!(key, "d");
            assert!(cause.held_by_this_process(), "{waited:?}");
        }
        other => panic!("{:?}", other.as_ref().map(|g| g.permit())),
    }
    // The runtime's try timeout (2 s for these runtimes) and slack.
    assert!(took >= wait, "ended before its deadline: {took:?}");
    assert!(took < wait + Duration::from_secs(4), "took {took:?}");
    for guard in guards {
        guard.release().await.unwrap();
    }
}

/// "A nested call on the same key, at any depth, keeps its caller's index
/// and token", and "pass [the token] to the storage that permit guards
/// (the counter `permit()` names)": an ordinary call on the key nested in
/// a permit body (a `#[distributed_lock(key = ..)]` helper called from a
/// `permits = N` fn) sees the body's permit in `permit()`, so its
/// `fence()` must be that permit's token, and the body must hold one
/// permit, not two. Fails today: the nested call takes permit 0 (the key's
/// ordinary lock) beside the body's permit, and its `fence()` is permit
/// 0's token while `permit()` names the body's.
async fn a_plain_call_nested_in_a_permit_body_keeps_the_body_s_permit_and_its_token(kind: Kind) {
    let runtime = kind.runtime(&unique("pa-plain-in")).await;
    // Permit 0 held by a guard of no body while the body takes its permit,
    // so that the body's is 1 or 2; let go before the nested call.
    let zero = runtime.lock("o").acquire().await.unwrap();
    let (inside_tx, inside_rx) = tokio::sync::oneshot::channel();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let body = tokio::spawn({
        let runtime = runtime.clone();
        with_lock(runtime.clone().lock("o").permits(N), async move {
            let outer = (permit().unwrap(), fence().unwrap());
            inside_tx.send(()).unwrap();
            go_rx.await.unwrap();
            let request = runtime.lock("o").wait(Duration::from_secs(5));
            let nested = with_lock(request, async {
                let held = held_permits(&runtime, "o", N).await;
                Ok::<_, LockError>((permit(), fence(), held))
            });
            Ok::<_, LockError>((outer, nested.await))
        })
    });
    inside_rx.await.unwrap();
    zero.release().await.unwrap();
    go_tx.send(()).unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(20), body).await;
    let (outer, nested) = ended.expect("a nested call hung").unwrap().unwrap();
    let (nested_permit, nested_fence, held) = nested.expect("the nested call failed");
    assert_eq!(nested_permit, Some(outer.0));
    assert_eq!(
        nested_fence,
        Some(outer.1),
        "permit() names permit {} but fence() is another lock's token",
        outer.0
    );
    assert_eq!(held, 1, "one body holds {held} permits");
}
