//! Owner scopes: nesting re-enters, siblings take turns (strict nesting),
//! spawned tasks are strangers unless they inherit, and fencing tokens order
//! holders.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use lock_runtime::{fence, inherit, with_lock, LockError, LockRuntime};
use lock_testkit::RedisServer;
use lock_tests::{on_every_backend, unique, Kind, Occupancy};

on_every_backend!(
    sibling_calls_on_a_held_key_take_turns,
    an_inherited_child_and_its_parent_take_turns,
    reentrancy_three_deep_holds_one_lock,
    spawned_task_without_inherit_waits,
    spawned_task_with_inherit_reenters,
    fencing_tokens_increase_across_holders_and_match_in_nests,
    explicit_guard_outside_any_scope_is_not_reentrant,
);

/// Three nested locked calls on one key: no self-deadlock, one backend hold,
/// the same token all the way down, and the key free only after the outermost.
async fn reentrancy_three_deep_holds_one_lock(kind: Kind) {
    let prefix = unique("nest");
    let runtime = kind.runtime(&prefix).await;
    let peer = kind.peer(&runtime, &prefix).await;
    let rt = &runtime;
    let tokens = with_lock(rt.lock("k").wait(Duration::from_secs(1)), async {
        let outer = fence().unwrap();
        let (middle, inner) = with_lock(rt.lock("k").wait(Duration::from_secs(1)), async {
            let middle = fence().unwrap();
            let inner = with_lock(rt.lock("k").wait(Duration::from_secs(1)), async {
                assert_eq!(rt.stats().held, 1, "nested holds share one backend hold");
                Ok::<_, LockError>(fence().unwrap())
            })
            .await?;
            // The inner release did not free the key: a stranger still can't get it.
            let stranger = tokio::spawn({
                let peer = peer.clone();
                async move { peer.lock("k").try_acquire().await.map(|g| g.is_some()) }
            });
            assert!(!stranger.await.unwrap()?, "key freed by an inner release");
            Ok::<_, LockError>((middle, inner))
        })
        .await?;
        Ok::<_, LockError>((outer, middle, inner))
    })
    .await
    .unwrap();
    assert_eq!(tokens.0, tokens.1);
    assert_eq!(tokens.1, tokens.2);
    assert_eq!(runtime.stats().held, 0);
    let after = peer.lock("k").try_acquire().await.unwrap();
    assert!(after.is_some(), "key not free after the outermost release");
}

/// A task spawned from a locked body is another owner: it waits (and here
/// times out) instead of re-entering.
async fn spawned_task_without_inherit_waits(kind: Kind) {
    let runtime = kind.runtime(&unique("spawn")).await;
    let rt = runtime.clone();
    let outcome = with_lock(runtime.lock("job"), async move {
        let child = tokio::spawn(async move {
            rt.lock("job")
                .wait(Duration::from_millis(150))
                .acquire()
                .await
                .map(|_| ())
        });
        Ok::<_, LockError>(child.await.unwrap())
    })
    .await
    .unwrap();
    assert!(
        matches!(outcome, Err(LockError::Timeout { .. })),
        "a spawned task re-entered without inherit: {outcome:?}"
    );
}

/// With `inherit`, the spawned task shares the caller's owner scope and
/// re-enters at once, with the caller's token; the lock stays held until the
/// child is done even if the parent finishes first.
async fn spawned_task_with_inherit_reenters(kind: Kind) {
    let prefix = unique("inherit");
    let runtime = kind.runtime(&prefix).await;
    let peer = kind.peer(&runtime, &prefix).await;
    let rt = runtime.clone();
    let (release_child, child_may_finish) = tokio::sync::oneshot::channel::<()>();
    let (child_in, child_has_it) = tokio::sync::oneshot::channel::<()>();
    let (child, parent_token) = with_lock(runtime.lock("job"), async move {
        let child = tokio::spawn(inherit(async move {
            let guard = rt
                .lock("job")
                .wait(Duration::from_millis(500))
                .acquire()
                .await?;
            let token = guard.fence();
            let _ = child_in.send(());
            let _ = child_may_finish.await;
            guard.release().await?;
            Ok::<_, LockError>(token)
        }));
        // Finish only once the child holds the key too.
        child_has_it.await.expect("child acquired");
        Ok::<_, LockError>((child, fence().unwrap()))
    })
    .await
    .unwrap();
    // The parent is done; the child still holds the key.
    let stranger = peer.lock("job").try_acquire().await.unwrap();
    assert!(
        stranger.is_none(),
        "lock freed while the inheriting child held it"
    );
    release_child.send(()).unwrap();
    let child_token = child.await.unwrap().unwrap();
    assert_eq!(child_token, parent_token);
    let after = peer
        .lock("job")
        .wait(Duration::from_secs(1))
        .acquire()
        .await;
    assert!(after.is_ok(), "lock not freed after the child released");
}

/// Every new holder's token is greater than the last one; nested holds see
/// the outer token.
async fn fencing_tokens_increase_across_holders_and_match_in_nests(kind: Kind) {
    let prefix = unique("fence");
    let first = kind.runtime(&prefix).await;
    let second = kind.peer(&first, &prefix).await;
    let mut last = 0;
    for round in 0..10 {
        let rt = if round % 2 == 0 { &first } else { &second };
        let (outer, inner) = with_lock(rt.lock("ledger"), async {
            let outer = fence().unwrap();
            let inner = with_lock(rt.lock("ledger"), async {
                Ok::<_, LockError>(fence().unwrap())
            })
            .await?;
            Ok::<_, LockError>((outer, inner))
        })
        .await
        .unwrap();
        assert_eq!(outer, inner, "nested hold saw another token");
        assert!(outer > last, "token {outer} not above previous {last}");
        last = outer;
    }
    // Tokens are per key: another key has its own sequence, also increasing.
    let g = first.lock("other").acquire().await.unwrap();
    assert!(g.fence() > 0);
}

/// Outside any locked body each explicit acquire is its own owner, so a
/// second acquire of a held key waits like anybody else's.
async fn explicit_guard_outside_any_scope_is_not_reentrant(kind: Kind) {
    let runtime = kind.runtime(&unique("plain")).await;
    let _held = runtime.lock("k").acquire().await.unwrap();
    let again = runtime.lock("k").try_acquire().await.unwrap();
    assert!(again.is_none());
}

/// Both arms of a `join!` inside a locked body, each locked on the same key:
/// each re-enters (the parent holds the key), but never both at once; a
/// call nested in an arm re-enters below it.
async fn sibling_calls_on_a_held_key_take_turns(kind: Kind) {
    let runtime = kind.runtime(&unique("siblings")).await;
    let rt = &runtime;
    let inside = Occupancy::new();
    let arm = |name: &'static str| {
        let inside = &inside;
        with_lock(rt.lock("k").wait(Duration::from_secs(5)), async move {
            let _token = inside.enter();
            let outer = fence();
            tokio::time::sleep(Duration::from_millis(30)).await;
            // Nested below this arm: re-enters at once.
            let nested = with_lock(rt.lock("k").wait(Duration::ZERO), async {
                Ok::<_, LockError>(fence())
            })
            .await?;
            assert_eq!(nested, outer);
            tokio::time::sleep(Duration::from_millis(30)).await;
            Ok::<_, LockError>(name)
        })
    };
    let (a, b, token) = with_lock(rt.lock("k"), async {
        let (a, b) = tokio::join!(arm("a"), arm("b"));
        Ok::<_, LockError>((a?, b?, fence()))
    })
    .await
    .unwrap();
    assert_eq!((a, b), ("a", "b"));
    assert!(token.is_some());
    assert_eq!(inside.max(), 1, "two sibling bodies were inside at once");
    assert_eq!(runtime.stats().held, 0);
}

/// An `inherit`ed child that holds the key makes its parent's next locked
/// call on that key wait until the child is done (and not the other way
/// round: the child re-enters the parent's hold at once).
async fn an_inherited_child_and_its_parent_take_turns(kind: Kind) {
    let runtime = kind.runtime(&unique("inherit-turns")).await;
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let rt = runtime.clone();
    let log = order.clone();
    with_lock(runtime.lock("k"), async move {
        let child = tokio::spawn(inherit({
            let (rt, log) = (rt.clone(), log.clone());
            async move {
                with_lock(rt.lock("k").wait(Duration::ZERO), async {
                    log.lock().unwrap().push("child in");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    log.lock().unwrap().push("child out");
                    Ok::<_, LockError>(())
                })
                .await
            }
        }));
        // Let the child enter first.
        for _ in 0..200 {
            if !log.lock().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        with_lock(rt.lock("k").wait(Duration::from_secs(5)), async {
            log.lock().unwrap().push("parent in");
            Ok::<_, LockError>(())
        })
        .await?;
        child.await.unwrap()
    })
    .await
    .unwrap();
    assert_eq!(
        *order.lock().unwrap(),
        ["child in", "child out", "parent in"],
        "the parent's nested call entered while the child held the key"
    );
}

/// Siblings wait for each other in the process: the turns cost no Redis
/// command (a private server, so other tests' traffic does not count).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sibling_turns_send_no_redis_command() {
    let server = RedisServer::start();
    let runtime = LockRuntime::builder()
        .redis(server.url())
        .build()
        .await
        .unwrap();
    let rt = &runtime;
    let arm = || {
        with_lock(rt.lock("k"), async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok::<_, LockError>(())
        })
    };
    let mut con = server.connection().await;
    let before = commands(&mut con).await;
    with_lock(rt.lock("k"), async {
        let marks = commands(&mut con).await;
        let (a, b, c) = tokio::join!(arm(), arm(), arm());
        a?;
        b?;
        c?;
        let after = commands(&mut con).await;
        // The INFO calls themselves count one each.
        assert_eq!(after - marks, 1, "sibling turns sent Redis commands");
        Ok::<_, LockError>(())
    })
    .await
    .unwrap();
    assert!(commands(&mut con).await > before);
}

/// Commands the server has processed (`INFO stats`).
async fn commands(con: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(con)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}
