//! Owner scopes: nesting re-enters, spawned tasks are strangers unless they
//! inherit, and fencing tokens order holders.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use lock_runtime::{fence, inherit, with_lock, LockError};
use lock_tests::{on_both_backends, unique, Kind};

on_both_backends!(
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
