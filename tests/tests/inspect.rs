//! Asking about a lock: `inspect`, `is_locked`, `hold_count`, on both
//! backends (and the fair queue on Redis).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use lock_runtime::{with_lock, LockError};
use lock_tests::{on_every_backend, unique, Kind};

on_every_backend!(
    inspect_reports_holder_lease_and_token_and_nothing_once_free,
    hold_count_follows_nesting_and_stays_local,
);

/// A held lock shows its holder, one backend hold, the lease left and the
/// holder's token, to any client; a free one shows nothing.
async fn inspect_reports_holder_lease_and_token_and_nothing_once_free(kind: Kind) {
    let prefix = unique("inspect");
    let holder = kind.runtime(&prefix).await;
    let other = kind.peer(&holder, &prefix).await;
    assert!(other.inspect("order:1").await.unwrap().is_none());
    assert!(!other.is_locked("order:1").await.unwrap());

    let lease = Duration::from_secs(20);
    let guard = holder.lock("order:1").lease(lease).acquire().await.unwrap();
    let info = other.inspect("order:1").await.unwrap().expect("held");
    assert_eq!(info.key, "order:1");
    assert!(info.held_by_this_process, "{info:?}");
    assert_eq!(info.holds, 1);
    assert_eq!(info.fence, Some(guard.fence()));
    let left = info.remaining_lease.expect("a lease");
    assert!(
        left <= lease && left > lease - Duration::from_secs(5),
        "{left:?}"
    );
    assert!(info.queue.is_empty());
    assert!(other.is_locked("order:1").await.unwrap());

    guard.release().await.unwrap();
    assert!(other.inspect("order:1").await.unwrap().is_none());
    assert!(matches!(
        other.inspect("").await,
        Err(LockError::InvalidKey { .. })
    ));
}

/// Nested holds are counted in the process: the backend records one hold,
/// `hold_count` says how deep the running code is.
async fn hold_count_follows_nesting_and_stays_local(kind: Kind) {
    let runtime = kind.runtime(&unique("holds")).await;
    assert_eq!(runtime.hold_count("k"), 0);
    let rt = runtime.clone();
    let (outer, inner, recorded) = with_lock(runtime.lock("k"), async {
        let outer = rt.hold_count("k");
        let (inner, recorded) = with_lock(rt.lock("k"), async {
            let info = rt.inspect("k").await?.expect("held");
            Ok::<_, LockError>((rt.hold_count("k"), info.holds))
        })
        .await?;
        Ok::<_, LockError>((outer, inner, recorded))
    })
    .await
    .unwrap();
    assert_eq!((outer, inner, recorded), (1, 2, 1));
    assert_eq!(runtime.hold_count("k"), 0, "outside every locked body");
    // A guard outside any scope is not "around" the caller...
    let guard = runtime.lock("k").acquire().await.unwrap();
    assert_eq!(runtime.hold_count("k"), 0);
    // ...until the code runs inside its scope.
    let rt = runtime.clone();
    assert_eq!(guard.scope(async move { rt.hold_count("k") }).await, 1);
}

/// Fair mode: a waiting process's place shows in the queue, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_the_fair_queue() {
    let prefix = unique("inspectq");
    let holder = Kind::Redis.runtime(&prefix).await;
    let waiter = Kind::Redis.runtime(&prefix).await;
    let guard = holder.lock("k").fair(true).acquire().await.unwrap();
    let request = waiter.lock("k").fair(true).wait(Duration::from_secs(10));
    let waiting = tokio::spawn(async move { request.acquire().await });
    let mut queue = Vec::new();
    for _ in 0..500 {
        queue = holder.inspect("k").await.unwrap().expect("held").queue;
        if !queue.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(queue.len(), 1, "the waiting process's place: {queue:?}");
    let handed_over = guard.fence();
    guard.release().await.unwrap();
    let next = waiting.await.unwrap().unwrap();
    assert!(next.fence() > handed_over);
    let after = holder
        .inspect("k")
        .await
        .unwrap()
        .expect("held by the waiter");
    assert_eq!(after.fence, Some(next.fence()));
    assert!(after.queue.is_empty(), "{after:?}");
    next.release().await.unwrap();
}
