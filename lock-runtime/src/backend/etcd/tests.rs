#![allow(clippy::unwrap_used, clippy::panic)]

use std::time::Duration;

use super::acquire::acquire_txn;
use super::{connect, lock_name, node, tomb, EtcdBackend, EtcdConfig};
use crate::backend::{Ask, ConnectSettings, Holding};

const LEASE: Duration = Duration::from_secs(3);

async fn backend(cluster: &lock_testkit::etcd::EtcdCluster) -> EtcdBackend {
    let settings = ConnectSettings::for_tests();
    let config = EtcdConfig {
        endpoints: cluster.endpoints(),
        user: None,
        prefix: "lock:".to_owned(),
        default_lease: LEASE,
    };
    connect(config, &settings, crate::backend::news::nobody())
        .await
        .unwrap()
        .0
}

/// A write hold of `lock` for holder `h` on a renewed lease of [`LEASE`],
/// as an attempt that may queue asks it: what the attempt answered.
async fn write_hold(backend: &EtcdBackend, lock: &str) -> crate::backend::Acquire {
    let join = crate::backend::Queue::Join(LEASE);
    let write = crate::mode::LockMode::Write;
    let ask = Ask::of(lock, "h", (LEASE, true), join, write);
    backend.acquire(ask).await.unwrap()
}

/// What etcd holds under `key` now.
async fn stands(backend: &EtcdBackend, key: &str) -> bool {
    let mut kv = backend.inner.client.kv_client();
    !kv.get(key, None).await.unwrap().kvs().is_empty()
}

/// A put that went out unanswered, given up (its key deleted), and then
/// applied by etcd after the delete (etcd applies one process's calls
/// in any order) writes nothing: the key stays gone, not left on a
/// lease this runtime keeps alive, where it would block the lock for
/// good. Both for a waiting attempt and for a try-once one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_applied_after_the_delete_of_its_key_writes_nothing() {
    let cluster = lock_testkit::etcd::EtcdCluster::start(1);
    let backend = backend(&cluster).await;
    let lease = backend.inner.leases.ahead(LEASE).await.unwrap().id;
    for (holder, joins) in [("waiting", true), ("trying", false)] {
        let lock = format!("late-put-{holder}");
        let key = node(&lock, holder);
        // The attempt's put goes out; its answer never comes.
        drop(backend.inner.unanswered.put_out(&key, lease));
        // Given up: its key is deleted (the put has not arrived yet) ...
        backend
            .release(Holding::of(&lock, holder, true))
            .await
            .unwrap();
        // ... and then the put arrives.
        let mut kv = backend.inner.client.kv_client();
        let late = kv
            .txn(acquire_txn(&lock, holder, lease, joins, false))
            .await
            .unwrap();
        assert!(!late.succeeded(), "{holder}: the late put was applied");
        assert!(!stands(&backend, &key).await, "{holder}: {key} stands");
        assert!(backend.inspect(&lock).await.unwrap().is_none());
        // The lock itself is free for everyone else.
        let other = acquire_txn(&lock, "another", lease, joins, false);
        assert!(kv.txn(other).await.unwrap().succeeded());
        backend
            .release(Holding::of(&lock, "another", true))
            .await
            .unwrap();
    }
}

/// A put that was answered leaves no tombstone behind when its key is
/// deleted (tombstones are for unanswered puts only: one key per lock
/// call would pile up on the runtime's lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answered_put_leaves_no_tombstone() {
    let cluster = lock_testkit::etcd::EtcdCluster::start(1);
    let backend = backend(&cluster).await;
    let lock = "answered";
    let acquired = write_hold(&backend, lock).await;
    assert!(matches!(acquired, crate::backend::Acquire::Held { .. }));
    backend.release(Holding::of(lock, "h", true)).await.unwrap();
    assert!(!stands(&backend, &node(lock, "h")).await);
    assert!(!stands(&backend, &tomb::key(lock, "h")).await);
}

/// When the lease an unanswered put named is gone, the put can write
/// nothing any more (etcd refuses a put on a lease it does not know):
/// the delete goes through without a tombstone, and the key is no
/// longer counted as unanswered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_whose_tombstone_lease_is_gone_still_deletes() {
    let cluster = lock_testkit::etcd::EtcdCluster::start(1);
    let backend = backend(&cluster).await;
    let mut leases = backend.inner.client.lease_client();
    let gone = leases.grant(5, None).await.unwrap().id();
    leases.revoke(gone).await.unwrap();
    let (lock, holder) = ("gone-lease", "h");
    let key = node(lock, holder);
    let mut kv = backend.inner.client.kv_client();
    kv.put(key.as_str(), "", None).await.unwrap();
    drop(backend.inner.unanswered.put_out(&key, gone));
    backend
        .release(Holding::of(lock, holder, true))
        .await
        .unwrap();
    assert!(!stands(&backend, &key).await);
    assert_eq!(backend.inner.unanswered.lease_of(&key), None);
    let late = kv.txn(acquire_txn(lock, holder, gone, true, false)).await;
    assert!(late.is_err(), "a put on a revoked lease was applied");
    assert!(!stands(&backend, &key).await);
}

/// The key `key` as etcd holds it now: (create revision, value).
async fn key_of(backend: &EtcdBackend, key: &str) -> Option<(i64, Vec<u8>)> {
    let mut kv = backend.inner.client.kv_client();
    let got = kv.get(key, None).await.unwrap();
    got.kvs()
        .first()
        .map(|kv| (kv.create_revision(), kv.value().to_vec()))
}

/// A holder id serves one mode: an attempt of the other mode with a
/// holder id whose key stands is refused and changes nothing (a
/// writer's key is not made a reader, a reader's key is not deleted),
/// and the key then holds in its own mode with its own token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_id_never_serves_two_modes() {
    use super::readers::read_node;
    use crate::backend::{Acquire, Queue};
    use crate::mode::LockMode;
    let cluster = lock_testkit::etcd::EtcdCluster::start(1);
    let backend = backend(&cluster).await;
    let (join, renewed) = (Queue::Join(LEASE), (LEASE, true));
    let busy = Acquire::Busy { ttl: None };
    for (lock, mode, other) in [
        ("writer-place", LockMode::Write, LockMode::Read),
        ("reader-place", LockMode::Read, LockMode::Write),
    ] {
        let held = backend.acquire(Ask::of(lock, "w", renewed, join, LockMode::Write));
        assert!(matches!(held.await.unwrap(), Acquire::Held { .. }));
        let place = backend.acquire(Ask::of(lock, "p", renewed, join, mode));
        assert_eq!(place.await.unwrap(), busy, "{lock}");
        let key = match mode {
            LockMode::Read => read_node(lock, "p"),
            _ => node(lock, "p"),
        };
        let before = key_of(&backend, &key).await.unwrap();
        let refused = backend
            .acquire(Ask::of(lock, "p", renewed, join, other))
            .await;
        assert!(refused.is_err(), "{lock}: {refused:?}");
        assert_eq!(key_of(&backend, &key).await, Some(before.clone()), "{lock}");
        let other_key = match mode {
            LockMode::Read => node(lock, "p"),
            _ => read_node(lock, "p"),
        };
        assert_eq!(key_of(&backend, &other_key).await, None, "{lock}");
        backend.release(Holding::of(lock, "w", true)).await.unwrap();
        let token = u64::try_from(before.0).unwrap();
        let held = backend
            .acquire(Ask::of(lock, "p", renewed, join, mode))
            .await
            .unwrap();
        assert!(
            matches!(held, Acquire::Held { fence, .. } if fence == token),
            "{lock}: {held:?}"
        );
        backend.release(Holding::of(lock, "p", true)).await.unwrap();
    }
}

/// A write hold is renewed only while its key is a writer: a key made
/// a reader under it (by anything but its own downgrade, which turns
/// the hold read first) lets readers in, so the hold is reported lost.
/// A read hold stands on its key either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_hold_whose_key_turned_reader_is_not_renewed() {
    use super::downgrade::downgrade_txn;
    use crate::backend::Acquire;
    use crate::held::{HeldLock, Hold};
    use crate::mode::LockMode;
    let cluster = lock_testkit::etcd::EtcdCluster::start(1);
    let backend = backend(&cluster).await;
    let lock = "turned";
    let held = write_hold(&backend, lock).await;
    let Acquire::Held { fence, .. } = held else {
        panic!("not held: {held:?}");
    };
    let hold = |mode| {
        HeldLock::new(Hold {
            key: lock.to_owned(),
            lock_key: lock.to_owned(),
            holder: "h".to_owned(),
            owner: 0,
            fence,
            upto: fence,
            since: tokio::time::Instant::now(),
            epoch: 0,
            lease: LEASE,
            renew: true,
            fair: true,
            mode,
        })
    };
    let (write, read) = (hold(LockMode::Write), hold(LockMode::Read));
    let both = [write.clone(), read.clone()];
    let renewed = backend.renew_many(&both).await.unwrap();
    assert_eq!(renewed, [Some(true), Some(true)]);
    let turned = backend.inner.txn(downgrade_txn(lock, "h", fence)).await;
    assert!(turned.unwrap().succeeded());
    let renewed = backend.renew_many(&both).await.unwrap();
    assert_eq!(renewed, [Some(false), Some(true)], "write, read");
    backend.release(Holding::of(lock, "h", true)).await.unwrap();
}

#[test]
fn no_lock_name_is_inside_another_locks_directory() {
    assert_eq!(lock_name("", "order:42"), "order:42");
    assert_eq!(lock_name("lock:", "a/b"), "lock:a%2Fb");
    assert_eq!(lock_name("", "100%/x"), "100%25%2Fx");
    let (a, nested) = (lock_name("p/", "a"), lock_name("p/", "a/b"));
    assert!(!nested.starts_with(&format!("{a}/")), "{nested} under {a}/");
    assert_ne!(lock_name("", "a%2Fb"), lock_name("", "a/b"));
}
