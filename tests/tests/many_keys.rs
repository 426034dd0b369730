//! Many keys at once (`lock_many`, `with_locks`, `key = [...]`): every key
//! is held in the body and none after it, all or none is taken whatever
//! ends the wait, calls that name shared keys in any order never wait for
//! each other in a circle, nested calls re-enter or are refused (never
//! hang), one key lost is the call lost, and read holds share every key.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{fence, fences, with_lock, with_locks, LockError, LockRuntime};
use lock_tests::looked::{free, until_free, until_held};
use lock_tests::spawn::on_two_clients;
use lock_tests::{on_every_backend, unique, Kind, Occupancy};
use tokio::time::Instant;

on_every_backend!(
    every_key_is_held_in_the_body_and_none_after_it,
    a_wait_that_runs_out_on_a_later_key_leaves_none_taken,
    a_cancelled_acquire_leaves_none_taken,
    calls_naming_shared_keys_in_any_order_never_deadlock,
    nested_calls_reenter_held_keys_and_going_back_in_order_is_refused_at_once,
    one_key_lost_is_the_call_lost,
    read_holds_share_every_key_and_keep_writers_out,
);

/// In the body every key is held (another client finds each busy), the
/// keys and their tokens come sorted and each once, and `fence()` is the
/// first key's token; after the call every key is free.
async fn every_key_is_held_in_the_body_and_none_after_it(kind: Kind) {
    let (runtime, peer) = kind.two("many-held").await;
    let keys = ["acct:2", "acct:1", "acct:3", "acct:2"];
    let seen = with_locks(runtime.lock_many(keys), async {
        let other = peer.clone();
        let inside = tokio::spawn(async move {
            // (A task of its own: the body's scope would re-enter.)
            for key in ["acct:1", "acct:2", "acct:3"] {
                assert!(!free(&other, key).await, "{key} free inside the body");
            }
        });
        inside.await.unwrap();
        // `inspect` (what lockctl shows) names this process on each key.
        for key in ["acct:1", "acct:2", "acct:3"] {
            let info = peer.inspect(key).await.unwrap().expect("a holder");
            assert!(!info.holder.is_empty(), "{key}: {info:?}");
            let here = runtime.inspect(key).await.unwrap().expect("a holder");
            assert!(here.held_by_this_process, "{key}: {here:?}");
        }
        Ok::<_, LockError>((fences(), fence()))
    })
    .await
    .unwrap();
    let (tokens, first) = seen;
    let names: Vec<&str> = tokens.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["acct:1", "acct:2", "acct:3"]);
    assert!(tokens.iter().all(|(_, t)| *t > 0), "{tokens:?}");
    assert_eq!(first, Some(tokens[0].1));
    for key in ["acct:1", "acct:2", "acct:3"] {
        until_free(&peer, key).await;
    }
    // The same keys again: each token grew.
    let again = runtime.lock_many(keys).acquire().await.unwrap();
    for ((key, before), (same, after)) in tokens.iter().zip(again.fences()) {
        assert_eq!(key, same);
        assert!(after > *before, "{key}: {after} after {before}");
    }
    again.release().await.unwrap();
    assert!(matches!(
        runtime.lock_many(Vec::<String>::new()).acquire().await,
        Err(LockError::InvalidKey { .. })
    ));
}

/// Another client holds the last key: the wait runs out naming it, and
/// the keys taken before it are given back at once (free for that client
/// right after the error), not at their lease's end.
async fn a_wait_that_runs_out_on_a_later_key_leaves_none_taken(kind: Kind) {
    let (runtime, peer) = kind.two("many-timeout").await;
    let blocker = peer.lock("t:c").acquire().await.unwrap();
    let request = runtime
        .lock_many(["t:c", "t:a", "t:b"])
        .lease(Duration::from_secs(30))
        .wait(Duration::from_millis(300));
    match request.acquire().await {
        Err(LockError::Timeout { key, .. }) => assert_eq!(key, "t:c"),
        other => panic!("expected a timeout on t:c, got {other:?}"),
    }
    for key in ["t:a", "t:b"] {
        until_free(&peer, key).await;
    }
    let tried = runtime.lock_many(["t:a", "t:c"]).try_acquire().await;
    assert!(tried.unwrap().is_none(), "t:c is held: none may be taken");
    assert!(free(&peer, "t:a").await, "a failed try kept t:a");
    blocker.release().await.unwrap();
}

/// A multi-key acquire cancelled while it holds its first key and waits
/// for the second gives the first back at once, and takes nothing later
/// (the second, freed after, stays free).
async fn a_cancelled_acquire_leaves_none_taken(kind: Kind) {
    let (runtime, peer) = kind.two("many-cancel").await;
    let blocker = peer.lock("c:b").acquire().await.unwrap();
    let waiting = tokio::spawn({
        let runtime = runtime.clone();
        async move {
            let request = runtime
                .lock_many(["c:b", "c:a"])
                .wait(Duration::from_secs(30));
            request.acquire().await
        }
    });
    until_held(&peer, "c:a").await;
    waiting.abort();
    let _ = waiting.await;
    until_free(&peer, "c:a").await;
    blocker.release().await.unwrap();
    until_free(&peer, "c:b").await;
    // Nothing of the cancelled call took c:b once it was free.
    assert!(free(&peer, "c:b").await);
    assert!(free(&peer, "c:a").await);
}

/// Three keys, and calls from two clients that each need two of them,
/// naming them in every order (`[a, b]`, `[b, a]`, `[b, c]`, `[c, a]`, ...):
/// a circle of waits would hang them; taken in one order, every call ends.
/// Calls that share a key never run at once.
async fn calls_naming_shared_keys_in_any_order_never_deadlock(kind: Kind) {
    let (runtime, peer) = kind.two("many-order").await;
    let pairs = [
        ["o:a", "o:b"],
        ["o:b", "o:a"],
        ["o:b", "o:c"],
        ["o:c", "o:b"],
        ["o:c", "o:a"],
        ["o:a", "o:c"],
    ];
    let inside: Arc<[Occupancy; 3]> = Arc::new(Default::default());
    let calls = |task: usize, runtime: LockRuntime| {
        let inside = inside.clone();
        async move {
            for round in 0..8usize {
                let pair = pairs[(task + round) % pairs.len()];
                let request = runtime.lock_many(pair).wait(Duration::from_secs(30));
                with_locks(request, async {
                    let _held: Vec<_> = pair.iter().map(|k| inside[slot(k)].enter()).collect();
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    Ok::<_, LockError>(())
                })
                .await
                .unwrap();
            }
        }
    };
    let what = "calls naming shared keys in opposite orders";
    on_two_clients((&runtime, &peer), 6, calls, (Duration::from_secs(60), what)).await;
    for (i, occupancy) in inside.iter().enumerate() {
        assert_eq!(occupancy.max(), 1, "two calls inside key {i} at once");
    }
}

fn slot(key: &str) -> usize {
    match key {
        "o:a" => 0,
        "o:b" => 1,
        _ => 2,
    }
}

/// Inside a call on `[b, d]`: a nested call on `b` re-enters (its token),
/// on `e` (after both) or `[b, e]` is taken; on `a` or `c` (before `d`,
/// not held) it is refused at once, naming the key held after it.
async fn nested_calls_reenter_held_keys_and_going_back_in_order_is_refused_at_once(kind: Kind) {
    let runtime = kind.runtime(&unique("many-nest")).await;
    let outer = runtime.lock_many(["n:d", "n:b"]);
    with_locks(outer, async {
        let tokens = fences();
        let reentered = with_lock(runtime.lock("n:b"), async { Ok::<_, LockError>(fence()) });
        assert_eq!(reentered.await.unwrap(), Some(tokens[0].1));
        let after = with_lock(runtime.lock("n:e"), async { Ok::<_, LockError>(()) });
        after.await.unwrap();
        let both = with_locks(runtime.lock_many(["n:e", "n:b"]), async {
            Ok::<_, LockError>(())
        });
        both.await.unwrap();
        for key in ["n:a", "n:c"] {
            let started = Instant::now();
            let request = runtime.lock(key).wait(Duration::from_secs(30));
            match with_lock(request, async { Ok::<_, LockError>(()) }).await {
                Err(LockError::OrderRefused { key: asked, held }) => {
                    assert_eq!((asked.as_str(), held.as_str()), (key, "n:d"));
                }
                other => panic!("{key} inside [n:b, n:d]: {other:?}"),
            }
            assert!(started.elapsed() < Duration::from_secs(5), "refused late");
        }
        let back = runtime.lock_many(["n:e", "n:c"]).acquire().await;
        assert!(
            matches!(back, Err(LockError::OrderRefused { .. })),
            "{back:?}"
        );
        Ok::<_, LockError>(())
    })
    .await
    .unwrap();
}

/// One key of a running multi-key call deleted under it: the body stops
/// and the call ends in `Lost` naming that key.
async fn one_key_lost_is_the_call_lost(kind: Kind) {
    let (runtime, peer) = kind.two("many-lost").await;
    let request = runtime
        .lock_many(["l:a", "l:b"])
        .lease(Duration::from_secs(1));
    let call = tokio::spawn(with_locks(request, async {
        tokio::time::sleep(Duration::from_secs(30)).await;
        Ok::<_, LockError>(())
    }));
    until_held(&peer, "l:b").await;
    assert!(peer.force_unlock("l:b").await.unwrap());
    let ended = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("the call ran on without l:b")
        .unwrap();
    match ended {
        Err(LockError::Lost { key }) => assert_eq!(key, "l:b"),
        other => panic!("expected l:b lost, got {other:?}"),
    }
    until_free(&peer, "l:a").await;
}

/// Two clients hold read holds on the same keys at once; a writer of one
/// of the keys waits until both are done.
async fn read_holds_share_every_key_and_keep_writers_out(kind: Kind) {
    let (runtime, peer) = kind.two("many-read").await;
    let keys = ["r:a", "r:b"];
    let first = runtime.lock_many(keys).read().acquire().await.unwrap();
    let second = peer.lock_many(keys).read().wait(Duration::from_secs(10));
    let second = second.acquire().await.unwrap();
    let writer = peer.lock("r:b").write().try_acquire().await.unwrap();
    assert!(writer.is_none(), "a writer entered beside two readers");
    first.release().await.unwrap();
    second.release().await.unwrap();
    let writer = peer.lock_many(keys).write().wait(Duration::from_secs(10));
    writer.acquire().await.unwrap().release().await.unwrap();
}

/// The global `lock_many` needs an installed runtime, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_runtime_lock_many_says_so() {
    let request = lock_runtime::lock_many(["x", "y"]);
    assert!(matches!(
        request.acquire().await,
        Err(LockError::NotInstalled)
    ));
}
