//! Permits beside other calls on the same key: other counts, readers of
//! the key (permit 0 is the key's ordinary lock), and multi-key calls
//! around a permit call or inside a permit body (the order rule of
//! `OrderRefused` is one key's).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{fence, fences, permit, with_lock, with_locks, LockError};
use lock_tests::spawn::{acquire_elsewhere, join_within};
use lock_tests::{on_every_backend, unique, Kind};
use tokio::time::Instant;

use super::{all_free_at_once, all_free_soon};

on_every_backend!(
    calls_giving_different_counts_never_share_an_index_and_stay_below_their_count,
    readers_of_a_key_exclude_its_permit_zero_and_only_it,
    permit_calls_inside_multi_key_calls_follow_the_order_rule_of_one_key,
    a_permit_call_inside_a_read_body_of_its_key_is_refused_at_once_as_an_upgrade,
);

/// "Calls that give different counts share the low permits: for every n
/// in use, at most n calls hold permits below n": tasks of two clients
/// giving 1, 2, 3 or 5 permits for one key, at once and in turns; every
/// body's permit is below its count, and no two bodies are on one index
/// at any time (so at most n are below n), within a bound.
async fn calls_giving_different_counts_never_share_an_index_and_stay_below_their_count(kind: Kind) {
    let (runtime, peer) = kind.two("pa-counts").await;
    let in_use: Arc<Mutex<HashMap<u32, u32>>> = Arc::default();
    let mut tasks = Vec::new();
    for t in 0..8u32 {
        let rt = if t % 2 == 0 { &runtime } else { &peer }.clone();
        let in_use = in_use.clone();
        let count = [1, 2, 3, 5][(t % 4) as usize];
        tasks.push(tokio::spawn(async move {
            for _ in 0..4 {
                let request = rt.lock("mix").permits(count).wait(Duration::from_secs(60));
                with_lock(request, async {
                    let mine = permit().unwrap();
                    assert!(mine < count, "permit {mine} of {count}");
                    let other = in_use.lock().unwrap().insert(mine, count);
                    assert!(
                        other.is_none(),
                        "permit {mine}: counts {count} and {other:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(15)).await;
                    in_use.lock().unwrap().remove(&mine);
                    Ok::<_, LockError>(())
                })
                .await
                .unwrap();
            }
        }));
    }
    join_within(tasks, Duration::from_secs(120), "callers of mixed counts").await;
    for n in [1, 2, 3, 5] {
        super::settled(&runtime, 0).await;
        all_free_soon(&peer, "mix", n).await;
    }
}

/// "An ordinary lock of the key is permit 0": a reader of the key shares
/// nothing with permits but permit 0. With a reader on the key, another
/// client's permit call takes permit 1 and then finds none; with permit 0
/// held by a permit call, a reader finds the key busy; with only permit 1
/// held, a reader gets in.
async fn readers_of_a_key_exclude_its_permit_zero_and_only_it(kind: Kind) {
    let (runtime, peer) = kind.two("pa-read").await;
    let reader = peer.lock("r").read().acquire().await.unwrap();
    let first = acquire_elsewhere(runtime.lock("r").permits(2).wait(Duration::ZERO));
    let first = first.await.expect("permit 1 is free beside a reader");
    assert_eq!(first.permit(), Some(1));
    let none = acquire_elsewhere(runtime.lock("r").permits(2).wait(Duration::ZERO)).await;
    assert!(
        matches!(none, Err(LockError::Timeout { .. })),
        "permit 0 is read-held: {:?}",
        none.map(|g| g.permit())
    );
    reader.release().await.unwrap();
    let zero = acquire_elsewhere(runtime.lock("r").permits(2).wait(Duration::from_secs(5)));
    let zero = zero.await.expect("permit 0 after the reader");
    assert_eq!(zero.permit(), Some(0));
    let read = acquire_elsewhere(peer.lock("r").read().wait(Duration::ZERO)).await;
    assert!(read.is_err(), "a reader beside the holder of permit 0");
    zero.release().await.unwrap();
    let read = acquire_elsewhere(peer.lock("r").read().wait(Duration::from_secs(5))).await;
    let read = read.expect("a reader beside permit 1 only");
    read.release().await.unwrap();
    first.release().await.unwrap();
    all_free_at_once(&peer, "r", 2).await;
}

/// A permit call inside a multi-key call is ruled as a single-key call of
/// its key is: inside `[a, m]`, permits of `m` re-enter `m` (permit 0, the
/// set's token), permits of `z` (past the set) are taken, and permits of
/// `b` are refused at once (`OrderRefused`, naming `b` and `m`); inside a
/// permit body, a multi-key call ends as it would in a single-key body,
/// and a permit call on the body's key inside it ends as the single-key
/// call on its key does there (both refused, or both re-entered), naming
/// the key the caller asked for.
async fn permit_calls_inside_multi_key_calls_follow_the_order_rule_of_one_key(kind: Kind) {
    let runtime = kind.runtime(&unique("pa-order")).await;
    let set = runtime.lock_many(["a", "m"]);
    let checked = with_locks(set, async {
        let m_token = fences()[1].1;
        let inside = with_lock(runtime.lock("m").permits(3), async {
            Ok::<_, LockError>((permit(), fence()))
        });
        assert_eq!(inside.await?, (Some(0), Some(m_token)));
        let past = with_lock(runtime.lock("z").permits(3), async {
            Ok::<_, LockError>(permit())
        });
        assert!(past.await?.is_some_and(|p| p < 3));
        let started = Instant::now();
        let request = runtime.lock("b").permits(3).wait(Duration::from_secs(10));
        let back = with_lock(request, async { Ok::<_, LockError>(()) }).await;
        assert!(
            matches!(&back, Err(LockError::OrderRefused { key, held }) if key == "b" && held == "m"),
            "{back:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(2), "refused late");
        Ok::<_, LockError>(())
    });
    checked.await.unwrap();

    // Permit 0 of `pp` held by a guard of no body: the permit body gets 1 or 2.
    let zero = runtime.lock("pp").acquire().await.unwrap();
    let (token, single) = under_a_set_in_a_body(&runtime, "p", None).await;
    let (permit_token, permits) = under_a_set_in_a_body(&runtime, "pp", Some(3)).await;
    zero.release().await.unwrap();
    match (single, permits) {
        (Ok(single), Ok(permits)) => {
            assert_eq!(single, token);
            assert_eq!(permits, permit_token, "the permit was not re-entered");
        }
        (Err(LockError::OrderRefused { .. }), Err(LockError::OrderRefused { key, held })) => {
            assert_eq!((key.as_str(), held.as_str()), ("pp", "s"));
        }
        (single, permits) => panic!("one key: {single:?}; permits: {permits:?}"),
    }
}

/// Upgrades are refused "as for one key": a permit call on a key inside a
/// read body of that key (whose hold is permit 0's lock, read) is refused
/// at once with `UpgradeRefused` naming the key, as the single-key write
/// is, never left waiting for itself.
async fn a_permit_call_inside_a_read_body_of_its_key_is_refused_at_once_as_an_upgrade(kind: Kind) {
    let runtime = kind.runtime(&unique("pa-upgrade")).await;
    let wait = Duration::from_secs(10);
    let checked = with_lock(runtime.lock("u").read(), async {
        let started = Instant::now();
        let single = with_lock(runtime.lock("u").wait(wait), async {
            Ok::<_, LockError>(())
        });
        let single = single.await;
        let permits = with_lock(runtime.lock("u").permits(2).wait(wait), async {
            Ok::<_, LockError>(())
        });
        let permits = permits.await;
        Ok::<_, LockError>((single, permits, started.elapsed()))
    });
    let (single, permits, took) = tokio::time::timeout(Duration::from_secs(30), checked)
        .await
        .expect("a write asked inside a read hung")
        .unwrap();
    assert!(
        matches!(&single, Err(LockError::UpgradeRefused { key }) if key == "u"),
        "one key: {single:?}"
    );
    assert!(
        matches!(&permits, Err(LockError::UpgradeRefused { key }) if key == "u"),
        "permits: {permits:?}"
    );
    assert!(took < Duration::from_secs(3), "refused after {took:?}");
}

/// A call on `key` (with `permits`, or an ordinary lock) whose body makes a
/// multi-key call on `[q, s]` that makes the same call on `key` again: the
/// outer body's token, and how the innermost call ended (its token).
async fn under_a_set_in_a_body(
    runtime: &lock_runtime::LockRuntime,
    key: &str,
    permits: Option<u32>,
) -> (Option<u64>, Result<Option<u64>, LockError>) {
    let request = || {
        let request = runtime.lock(key).wait(Duration::from_secs(5));
        match permits {
            Some(n) => request.permits(n),
            None => request,
        }
    };
    let body = async {
        let set = runtime.lock_many(["q", "s"]).wait(Duration::from_secs(5));
        with_locks(set, async {
            let inner = with_lock(request(), async { Ok::<_, LockError>(fence()) });
            let inner = tokio::time::timeout(Duration::from_secs(10), inner).await;
            Ok::<_, LockError>(inner.expect("a call on the body's key hung in a set"))
        })
        .await
    };
    let ended = with_lock(request(), async {
        Ok::<_, LockError>((fence(), body.await?))
    });
    ended.await.unwrap()
}
