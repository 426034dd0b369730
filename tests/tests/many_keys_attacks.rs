//! Many keys at once, pushed at its edges: a multi-key acquire cut at any
//! of its awaits, shut down while it waits or runs, failing inside another
//! multi-key call, nested beside siblings, inherited tasks and guard
//! scopes, mixed with single-key writers, losing a key under
//! `on_lost = continue / confirm`, taking a hundred keys, queued in fair
//! mode, and returning a set whose early keys had fixed leases. Each test
//! states the promise of `docs/guarantees.md` ("Many keys at once") it
//! checks; `many_keys.rs` holds the plain cases.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use lock_runtime::{fence, fences, inherit, with_lock, with_locks, LockError, LockRuntime, OnLost};
use lock_tests::looked::{free, taken_within, until_free, until_held};
use lock_tests::spawn::on_two_clients;
use lock_tests::{fair_runtime, on_every_backend, redis, unique, until_queued, Kind, Occupancy};
use tokio::sync::oneshot;
use tokio::time::Instant;

on_every_backend!(
    a_multi_key_acquire_cut_at_any_await_leaves_nothing_taken,
    shutdown_ends_a_multi_key_wait_and_body_in_shut_down_and_frees_every_key
        skip(memory = "the embedded store ends with its runtime: nobody is left to look"),
    an_acquired_set_never_holds_a_key_whose_fixed_lease_ran_out_while_a_later_key_was_awaited,
    a_nested_multi_key_call_that_fails_keeps_the_keys_it_reentered,
    siblings_inherited_tasks_and_guard_scopes_inside_a_set_end_or_are_refused_at_once,
    readers_writers_and_single_key_writers_exclude_per_key,
    on_lost_continue_and_confirm_apply_to_the_set,
    a_hundred_keys_run_out_of_wait_and_are_all_free_when_the_error_arrives,
    free_keys_are_all_taken_wherever_the_budget_runs_out_among_them,
);

/// Whether a task of no owner scope (a stranger) finds `key` free on
/// `runtime`: from inside a locked body, the body's own scope would
/// re-enter.
async fn free_for_a_stranger(runtime: &LockRuntime, key: &str) -> bool {
    let (runtime, key) = (runtime.clone(), key.to_owned());
    tokio::spawn(async move { free(&runtime, &key).await })
        .await
        .unwrap()
}

/// Nothing of `runtime` is left held (but `others` holds of its own) or
/// waiting (bounded: 5 s).
async fn settled(runtime: &LockRuntime, others: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stats = runtime.stats();
        if stats.held == others && stats.waiting == 0 && stats.waiting_keys == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "left behind: {stats:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Polls `fut` until it has been left pending `polls` times (or `patience`
/// passed), then drops it: a cancellation at its `polls`-th await.
/// `Some`: it finished first.
async fn cut_after<F: Future>(fut: F, polls: usize, patience: Duration) -> Option<F::Output> {
    let mut fut = pin!(fut);
    let mut pending = 0;
    let polled = poll_fn(|cx| match fut.as_mut().poll(cx) {
        Poll::Ready(out) => Poll::Ready(Some(out)),
        Poll::Pending => {
            pending += 1;
            if pending >= polls {
                Poll::Ready(None)
            } else {
                Poll::Pending
            }
        }
    });
    tokio::time::timeout(patience, polled).await.ok().flatten()
}

/// A multi-key acquire dropped after its 1st, 2nd, ... pending poll (its
/// first script in flight, between keys, waiting for the last key) takes
/// nothing that stays: every key is free for another client soon after,
/// and the runtime counts nothing held or waiting. Free keys first (cut
/// at every await until one acquire finishes), then with the last key
/// held elsewhere (which, freed, goes to no ghost of the cut calls).
async fn a_multi_key_acquire_cut_at_any_await_leaves_nothing_taken(kind: Kind) {
    let (runtime, peer) = kind.two("many-cut").await;
    let keys = ["x:1", "x:2", "x:3"];
    let mut finished = false;
    for polls in 1..=200 {
        let acquire = runtime
            .lock_many(keys)
            .wait(Duration::from_secs(10))
            .acquire();
        if let Some(done) = cut_after(acquire, polls, Duration::from_secs(5)).await {
            done.unwrap().release().await.unwrap();
            finished = true;
            break;
        }
        for key in keys {
            until_free(&peer, key).await;
        }
        settled(&runtime, 0).await;
    }
    assert!(
        finished,
        "no acquire of three free keys finished in 200 polls"
    );

    let blocker = peer.lock("x:3").acquire().await.unwrap();
    for polls in 1..=16 {
        let acquire = runtime
            .lock_many(keys)
            .wait(Duration::from_secs(30))
            .acquire();
        let done = cut_after(acquire, polls, Duration::from_millis(400)).await;
        assert!(done.is_none(), "x:3 is held elsewhere: {done:?}");
        for key in ["x:1", "x:2"] {
            until_free(&peer, key).await;
        }
        // (On the embedded store the blocker is this runtime's own hold.)
        settled(&runtime, usize::from(kind == Kind::Memory)).await;
    }
    blocker.release().await.unwrap();
    let next = peer.lock("x:3").wait(Duration::from_secs(5)).acquire();
    let next = taken_within(next, Duration::from_secs(2), "x:3 after the cut calls").await;
    next.release().await.unwrap();
    let all = runtime.lock_many(keys).try_acquire().await.unwrap();
    all.expect("every key free at the end")
        .release()
        .await
        .unwrap();
}

/// `shutdown()` while a multi-key call holds its first key and waits for
/// the second, and while another runs its body: both end in `ShutDown`
/// (bounded), and every key is free for another client, the awaited one
/// too once its holder lets go.
async fn shutdown_ends_a_multi_key_wait_and_body_in_shut_down_and_frees_every_key(kind: Kind) {
    let prefix = unique("many-shut");
    let peer = kind.runtime(&prefix).await;

    let runtime = kind.runtime(&prefix).await;
    let blocker = peer.lock("s:b").acquire().await.unwrap();
    let waiting = tokio::spawn({
        let runtime = runtime.clone();
        async move {
            let request = runtime
                .lock_many(["s:b", "s:a"])
                .wait(Duration::from_secs(30));
            request.acquire().await.map(drop)
        }
    });
    until_held(&peer, "s:a").await;
    let _ = runtime.shutdown().await;
    let ended = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("a multi-key wait outlived shutdown")
        .unwrap();
    assert!(matches!(ended, Err(LockError::ShutDown)), "{ended:?}");
    until_free(&peer, "s:a").await;
    blocker.release().await.unwrap();
    until_free(&peer, "s:b").await;

    let runtime = kind.runtime(&prefix).await;
    let (inside_tx, inside_rx) = oneshot::channel();
    let call = tokio::spawn(with_locks(runtime.lock_many(["s:d", "s:c"]), async move {
        inside_tx.send(()).unwrap();
        tokio::time::sleep(Duration::from_secs(30)).await;
        Ok::<_, LockError>(())
    }));
    inside_rx.await.unwrap();
    let _ = runtime.shutdown().await;
    let ended = tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .expect("a multi-key body outlived shutdown")
        .unwrap();
    assert!(matches!(ended, Err(LockError::ShutDown)), "{ended:?}");
    for key in ["s:c", "s:d"] {
        until_free(&peer, key).await;
    }
}

/// The entry gate, per key, "exactly as for one key": a single-key
/// acquire never hands out a hold that is lost. A set whose first key has
/// a fixed lease (no watchdog) shorter than the wait for its second key
/// must not come back with the first one run out (and taken meanwhile by
/// another client): it retakes it, or fails; it never returns a set that
/// does not hold every key.
async fn an_acquired_set_never_holds_a_key_whose_fixed_lease_ran_out_while_a_later_key_was_awaited(
    kind: Kind,
) {
    let (runtime, peer) = kind.two("many-gate").await;
    let lease = Duration::from_secs(2);
    let blocker = peer.lock("g:b").acquire().await.unwrap();
    let acquire = tokio::spawn({
        let runtime = runtime.clone();
        async move {
            let request = runtime
                .lock_many(["g:a", "g:b"])
                .lease(lease)
                .watchdog(false)
                .wait(Duration::from_secs(20));
            request.acquire().await
        }
    });
    until_held(&peer, "g:a").await;
    // Past g:a's lease (and the backend's own expiry): another client may
    // take it, as it may any lock whose lease ran out.
    tokio::time::sleep(lease + Duration::from_millis(1500)).await;
    let stranger = tokio::spawn({
        let peer = peer.clone();
        async move { peer.lock("g:a").try_acquire().await.unwrap() }
    })
    .await
    .unwrap();
    blocker.release().await.unwrap();
    if let Some(stranger) = stranger {
        // The set must not come while the stranger holds g:a: it gives
        // g:b back and waits for g:a anew.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(
            !acquire.is_finished(),
            "{kind:?}: the set came while another client held g:a: {:?}",
            acquire.await
        );
        assert!(
            free(&peer, "g:b").await,
            "{kind:?}: g:b kept while g:a is retaken"
        );
        stranger.release().await.unwrap();
    }
    let set = tokio::time::timeout(Duration::from_secs(15), acquire)
        .await
        .expect("the set never came")
        .unwrap();
    match set {
        Ok(set) => {
            let lost: Vec<&str> = set
                .guards()
                .iter()
                .filter(|g| g.is_lost())
                .map(|g| g.key())
                .collect();
            assert!(
                lost.is_empty(),
                "acquire() returned Ok with {lost:?} already lost"
            );
            for key in ["g:a", "g:b"] {
                assert!(
                    !free(&peer, key).await,
                    "{kind:?}: {key} free under the set"
                );
            }
        }
        Err(error) => {
            // Failing is allowed (all or none): nothing may stay taken.
            eprintln!("{kind:?}: the set failed: {error:?}");
            until_free(&peer, "g:a").await;
            until_free(&peer, "g:b").await;
        }
    }
}

/// A multi-key call nested in another, re-entering one of the outer keys
/// and taking a new one, that runs out of wait (or is cut) gives back only
/// what it took itself: the outer call's keys stay held (a stranger finds
/// them busy) with the outer tokens, and a nested subset's `fences()` are
/// the outer tokens of those keys.
async fn a_nested_multi_key_call_that_fails_keeps_the_keys_it_reentered(kind: Kind) {
    let (runtime, peer) = kind.two("many-nest-back").await;
    let blocker = peer.lock("k:e").acquire().await.unwrap();
    let outer = runtime.lock_many(["k:b", "k:d"]);
    with_locks(outer, async {
        let outer_tokens = fences();
        let inner = runtime
            .lock_many(["k:e", "k:b"])
            .wait(Duration::from_millis(300));
        let failed = with_locks(inner, async { Ok::<_, LockError>(()) }).await;
        assert!(
            matches!(&failed, Err(LockError::Timeout { key, .. }) if key == "k:e"),
            "{failed:?}"
        );
        let cut = runtime
            .lock_many(["k:b", "k:d", "k:e"])
            .wait(Duration::from_secs(30))
            .acquire();
        let cut = tokio::time::timeout(Duration::from_millis(300), cut).await;
        assert!(cut.is_err(), "k:e is held elsewhere: {cut:?}");
        // Given back by a dropped guard in the background: a moment.
        tokio::time::sleep(Duration::from_millis(200)).await;
        for key in ["k:b", "k:d"] {
            assert!(
                !free_for_a_stranger(&runtime, key).await,
                "{key} went with a failed nested call"
            );
            assert!(!free_for_a_stranger(&peer, key).await, "{key} (peer)");
        }
        let again = with_lock(runtime.lock("k:b"), async { Ok::<_, LockError>(fence()) });
        assert_eq!(again.await.unwrap(), Some(outer_tokens[0].1));
        let subset = with_locks(runtime.lock_many(["k:d"]), async {
            Ok::<_, LockError>(fences())
        });
        assert_eq!(subset.await.unwrap(), outer_tokens[1..].to_vec());
        Ok::<_, LockError>(())
    })
    .await
    .unwrap();
    blocker.release().await.unwrap();
    for key in ["k:b", "k:d", "k:e"] {
        until_free(&peer, key).await;
    }
}

/// Inside a call on `[j:b, j:d]`: two sibling multi-key calls naming
/// `[j:e, j:f]` and `[j:f, j:e]` (a `join!`) both end and never overlap;
/// siblings that each hold one key and then ask for the other's end, one
/// of them refused at once (`j:e` sorts before its `j:f`), never a hang;
/// an `inherit`ed task and a `ManyGuard::scope` re-enter, take keys past
/// every held one, and are refused keys before them.
async fn siblings_inherited_tasks_and_guard_scopes_inside_a_set_end_or_are_refused_at_once(
    kind: Kind,
) {
    let runtime = kind.runtime(&unique("many-sib")).await;
    let wait = Duration::from_secs(10);
    let inside: Arc<[Occupancy; 2]> = Arc::new(Default::default());
    let outer = runtime.lock_many(["j:b", "j:d"]);
    let checked = with_locks(outer, async {
        let outer_tokens = fences();
        let arm = |keys: [&'static str; 2]| {
            let (runtime, inside) = (runtime.clone(), inside.clone());
            async move {
                for _ in 0..5 {
                    with_locks(runtime.lock_many(keys).wait(wait), async {
                        let _e = inside[0].enter();
                        let _f = inside[1].enter();
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        Ok::<_, LockError>(())
                    })
                    .await?;
                }
                Ok::<_, LockError>(())
            }
        };
        let both = async { tokio::join!(arm(["j:e", "j:f"]), arm(["j:f", "j:e"])) };
        let (one, two) = tokio::time::timeout(Duration::from_secs(30), both)
            .await
            .expect("sibling multi-key calls hung");
        one.unwrap();
        two.unwrap();
        assert_eq!(inside[0].max(), 1, "two siblings inside j:e at once");

        let crossing = |mine: &'static str, theirs: &'static str| {
            let runtime = runtime.clone();
            with_locks(runtime.lock_many([mine]).wait(wait), async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                with_lock(runtime.lock(theirs).wait(wait), async {
                    Ok::<_, LockError>(())
                })
                .await
            })
        };
        let started = Instant::now();
        let both = async { tokio::join!(crossing("j:e", "j:f"), crossing("j:f", "j:e")) };
        let (forward, back) = tokio::time::timeout(Duration::from_secs(30), both)
            .await
            .expect("crossing siblings hung");
        assert!(forward.is_ok(), "{forward:?}");
        assert!(
            matches!(&back, Err(LockError::OrderRefused { key, held }) if key == "j:e" && held == "j:f"),
            "{back:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(5), "refused late");

        let child = tokio::spawn(inherit({
            let runtime = runtime.clone();
            async move {
                let reentered = with_lock(runtime.lock("j:d"), async { Ok::<_, LockError>(fence()) })
                    .await
                    .unwrap();
                let past = with_locks(runtime.lock_many(["j:g", "j:d"]), async {
                    Ok::<_, LockError>(())
                })
                .await;
                let back = with_lock(runtime.lock("j:c").wait(wait), async {
                    Ok::<_, LockError>(())
                })
                .await;
                (reentered, past, back)
            }
        }));
        let (reentered, past, back) = tokio::time::timeout(Duration::from_secs(10), child)
            .await
            .expect("an inherited task hung")
            .unwrap();
        assert_eq!(reentered, Some(outer_tokens[1].1));
        assert!(past.is_ok(), "{past:?}");
        assert!(
            matches!(&back, Err(LockError::OrderRefused { held, .. }) if held == "j:d"),
            "{back:?}"
        );

        let guard = runtime.lock_many(["j:i", "j:h"]).acquire().await?;
        let tokens: Vec<(String, u64)> = guard.fences().map(|(k, t)| (k.to_owned(), t)).collect();
        let scoped = guard.scope(async {
            let seen = fences();
            let reentered = with_lock(runtime.lock("j:h"), async { Ok::<_, LockError>(fence()) })
                .await
                .unwrap();
            let back = with_lock(runtime.lock("j:e").wait(wait), async {
                Ok::<_, LockError>(())
            })
            .await;
            let past = with_lock(runtime.lock("j:z"), async { Ok::<_, LockError>(()) }).await;
            (seen, reentered, back, past)
        });
        let (seen, reentered, back, past) = tokio::time::timeout(Duration::from_secs(10), scoped)
            .await
            .expect("a guard's scope hung");
        guard.release().await?;
        assert_eq!(seen, tokens);
        assert_eq!(reentered, Some(tokens[0].1));
        assert!(
            matches!(&back, Err(LockError::OrderRefused { held, .. }) if held == "j:i"),
            "{back:?}"
        );
        assert!(past.is_ok(), "{past:?}");
        Ok::<_, LockError>(())
    })
    .await;
    checked.unwrap();
}

/// Who is inside one key at once: readers, writers, and whether a writer
/// ever had company.
#[derive(Default)]
struct Inside {
    now: Mutex<(u32, u32)>,
    broken: AtomicBool,
}

impl Inside {
    fn enter(&self, write: bool) -> InsideToken<'_> {
        let mut now = self.now.lock().unwrap();
        if write {
            now.1 += 1;
        } else {
            now.0 += 1;
        }
        if now.1 > 1 || (now.1 == 1 && now.0 > 0) {
            self.broken.store(true, Ordering::SeqCst);
        }
        InsideToken(self, write)
    }
}

struct InsideToken<'a>(&'a Inside, bool);

impl Drop for InsideToken<'_> {
    fn drop(&mut self) {
        let mut now = self.0.now.lock().unwrap();
        if self.1 {
            now.1 -= 1;
        } else {
            now.0 -= 1;
        }
    }
}

/// Multi-key readers and writers of `[w:a, w:b]` on two clients, beside
/// single-key writers of `w:a` and of `w:b`: on each key a writer is
/// never inside with anyone (per key, whoever took it, in one call or
/// two).
async fn readers_writers_and_single_key_writers_exclude_per_key(kind: Kind) {
    let (runtime, peer) = kind.two("many-rw").await;
    let inside: Arc<[Inside; 2]> = Arc::new(Default::default());
    let calls = |task: usize, runtime: LockRuntime| {
        let inside = inside.clone();
        async move {
            for round in 0..6usize {
                call_on_w_keys(&runtime, &inside, (task + round) % 4).await;
            }
        }
    };
    let limit = (Duration::from_secs(90), "readers and writers");
    on_two_clients((&runtime, &peer), 6, calls, limit).await;
    for (key, inside) in ["w:a", "w:b"].iter().zip(inside.iter()) {
        assert!(
            !inside.broken.load(Ordering::SeqCst),
            "a writer of {key} had company"
        );
    }
}

/// One call of [`readers_writers_and_single_key_writers_exclude_per_key`],
/// by `which`: a multi-key read (0) or write (1) of `[w:b, w:a]`, or a
/// single-key write of `w:a` (2) or of `w:b` (3); each marks itself inside
/// the keys it holds for 3 ms.
async fn call_on_w_keys(runtime: &LockRuntime, inside: &[Inside; 2], which: usize) {
    let wait = Duration::from_secs(30);
    if which < 2 {
        let write = which == 1;
        let request = runtime.lock_many(["w:b", "w:a"]).wait(wait);
        let request = if write {
            request.write()
        } else {
            request.read()
        };
        with_locks(request, async {
            let _a = inside[0].enter(write);
            let _b = inside[1].enter(write);
            tokio::time::sleep(Duration::from_millis(3)).await;
            Ok::<_, LockError>(())
        })
        .await
        .unwrap();
    } else {
        let key = if which == 2 { "w:a" } else { "w:b" };
        with_lock(runtime.lock(key).write().wait(wait), async {
            let _w = inside[which - 2].enter(true);
            tokio::time::sleep(Duration::from_millis(3)).await;
            Ok::<_, LockError>(())
        })
        .await
        .unwrap();
    }
}

/// One key of a set deleted under a running body: `on_lost = continue`
/// lets the body finish and returns its result, `confirm` returns `Lost`
/// naming that key (the release finds it gone even if no renewal did);
/// either way the other key is free after the call.
async fn on_lost_continue_and_confirm_apply_to_the_set(kind: Kind) {
    let (runtime, peer) = kind.two("many-onlost").await;
    for (on_lost, keys) in [
        (OnLost::Continue, ["lc:a", "lc:b"]),
        (OnLost::Confirm, ["lf:a", "lf:b"]),
    ] {
        let (inside_tx, inside_rx) = oneshot::channel();
        let (forced_tx, forced_rx) = oneshot::channel::<()>();
        let request = runtime.lock_many(keys).on_lost(on_lost);
        let call = tokio::spawn(with_locks(request, async move {
            inside_tx.send(()).unwrap();
            let _ = forced_rx.await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok::<_, LockError>(7)
        }));
        inside_rx.await.unwrap();
        assert!(peer.force_unlock(keys[1]).await.unwrap());
        forced_tx.send(()).unwrap();
        let ended = tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .expect("the call never ended")
            .unwrap();
        match on_lost {
            OnLost::Continue => assert!(matches!(ended, Ok(7)), "continue: {ended:?}"),
            _ => assert!(
                matches!(&ended, Err(LockError::Lost { key }) if key == keys[1]),
                "confirm: {ended:?}"
            ),
        }
        for key in keys {
            until_free(&peer, key).await;
        }
    }
}

/// A hundred keys, the 76th held elsewhere: the wait runs out naming
/// it, and the 75 keys taken before it are free for another client when
/// the error arrives (the give-back waits for their releases' answers, at
/// most the try timeout); a try of them all finds none kept.
async fn a_hundred_keys_run_out_of_wait_and_are_all_free_when_the_error_arrives(kind: Kind) {
    let (runtime, peer) = kind.two("many-100").await;
    let keys: Vec<String> = (0..100).map(|i| format!("h:{i:03}")).collect();
    let busy = keys[75].clone();
    let blocker = peer.lock(&busy).acquire().await.unwrap();
    let started = Instant::now();
    let request = runtime
        .lock_many(keys.iter().rev().cloned())
        .wait(Duration::from_millis(500));
    let outcome = request.acquire().await;
    let took = started.elapsed();
    match outcome {
        Err(LockError::Timeout { ref key, .. }) if *key == busy => {}
        other => {
            panic!("expected a timeout on {busy} (the only key held), got {other:?} after {took:?}")
        }
    }
    let mut held = Vec::new();
    for key in &keys[..75] {
        if !free(&peer, key).await {
            held.push(key.clone());
        }
    }
    assert!(
        held.is_empty(),
        "{} keys still held when the error arrived after {took:?}: {:?}...",
        held.len(),
        &held[..held.len().min(5)]
    );
    let tried = runtime.lock_many(keys.clone()).try_acquire().await.unwrap();
    assert!(tried.is_none(), "{busy} is held: none may be taken");
    for key in [&keys[0], &keys[74], &keys[99]] {
        until_free(&peer, key).await;
    }
    blocker.release().await.unwrap();
}

/// A hundred free keys and a wait of 50 ms, which runs out while they
/// are taken: "a key reached after the deadline still gets its one try",
/// and a `Timeout` names "the key that was still held". No key is held by
/// anyone, so every set is taken (a try of them all too), a key reached
/// just before the deadline too (its wait the sliver left of the budget).
async fn free_keys_are_all_taken_wherever_the_budget_runs_out_among_them(kind: Kind) {
    let runtime = kind.runtime(&unique("many-budget")).await;
    for round in 0..3 {
        let keys: Vec<String> = (0..100).map(|i| format!("b{round}:{i:03}")).collect();
        let tried = runtime.lock_many(keys).try_acquire().await;
        let tried = tried.unwrap_or_else(|e| panic!("round {round}: a try of free keys: {e:?}"));
        tried
            .expect("free keys found busy")
            .release()
            .await
            .unwrap();
        let keys: Vec<String> = (0..100).map(|i| format!("w{round}:{i:03}")).collect();
        let first = keys[0].clone();
        let request = runtime.lock_many(keys).wait(Duration::from_millis(50));
        match request.acquire().await {
            Ok(set) => set.release().await.unwrap(),
            // (The first key's own attempt may be cut by the deadline, as a
            // single key's is: a round trip longer than the whole wait.)
            Err(LockError::Timeout { key, .. }) if key == first => {}
            Err(error) => panic!("round {round}: 100 free keys, a 50 ms budget: {error:?}"),
        }
    }
}

/// Fair mode on Redis: a multi-key waiter queued on its first key while
/// holding none, or on its second while holding the first, cancelled or
/// timed out, leaves no place in either queue and no local waiter; the
/// keys, freed, go to the next client at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_multi_key_waiters_that_give_up_leave_no_place_behind() {
    let prefix = unique("many-fair");
    let url = redis().url();
    let holder = fair_runtime(&url, &prefix).await;
    let waiter = fair_runtime(&url, &prefix).await;
    let third = fair_runtime(&url, &prefix).await;
    let mut con = redis().connection().await;
    for (blocked, keys) in [("f:b", ["f:a", "f:b"]), ("f:0", ["f:0", "f:1"])] {
        let hash = holder.backend_key(blocked);
        let blocker = holder.lock(blocked).acquire().await.unwrap();
        let waiting = tokio::spawn({
            let waiter = waiter.clone();
            async move {
                let request = waiter.lock_many(keys).wait(Duration::from_secs(30));
                request.acquire().await.map(drop)
            }
        });
        until_queued(&mut con, &hash, 1).await;
        waiting.abort();
        let _ = waiting.await;
        until_queued(&mut con, &hash, 0).await;
        let timed_out = waiter
            .lock_many(keys)
            .wait(Duration::from_millis(300))
            .acquire()
            .await;
        assert!(
            matches!(&timed_out, Err(LockError::Timeout { key, .. }) if key == blocked),
            "{timed_out:?}"
        );
        until_queued(&mut con, &hash, 0).await;
        settled(&waiter, 0).await;
        blocker.release().await.unwrap();
        let next = third.lock_many(keys).wait(Duration::from_secs(5)).acquire();
        let what = format!("{keys:?}");
        let next = taken_within(next, Duration::from_secs(1), &what).await;
        next.release().await.unwrap();
    }
}

/// Refusals fail at once: a key that the backend can never take (on
/// ZooKeeper, one that makes no path) is refused with `InvalidKey` before
/// any wait, as it is alone, also when it sorts after a key that is busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_a_key_that_makes_no_path_is_refused_before_any_wait() {
    let (runtime, peer) = Kind::Zookeeper.two("many-badpath").await;
    let bad = "v:b/../c";
    let started = Instant::now();
    let alone = runtime
        .lock(bad)
        .wait(Duration::from_secs(5))
        .acquire()
        .await;
    assert!(
        matches!(alone, Err(LockError::InvalidKey { .. })),
        "{alone:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    let blocker = peer.lock("v:a").acquire().await.unwrap();
    let started = Instant::now();
    let set = runtime
        .lock_many(["v:a", bad])
        .wait(Duration::from_secs(5))
        .acquire()
        .await;
    let took = started.elapsed();
    assert!(
        matches!(&set, Err(LockError::InvalidKey { key, .. }) if key == bad),
        "after {took:?}: {set:?}"
    );
    assert!(took < Duration::from_secs(1), "refused after {took:?}");
    blocker.release().await.unwrap();
}
