#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The backend called directly, on a ZooKeeper server of the test kit.

use std::time::Duration;

use super::{connect, ZookeeperBackend, ZookeeperConfig};
use crate::backend::{Acquire, Ask, ConnectSettings, Queue};
use crate::mode::LockMode;

async fn backend(server: &lock_testkit::zookeeper::ZooKeeperServer) -> ZookeeperBackend {
    let settings = ConnectSettings::for_tests();
    let config = ZookeeperConfig {
        connect: server.connect_string(),
        auth: None,
        prefix: "/zk-backend-tests/".to_owned(),
        default_lease: Duration::from_secs(3),
    };
    connect(config, &settings, crate::backend::news::nobody())
        .await
        .unwrap()
        .0
}

/// A process's place serves its waiters in turn: an answer that holds for
/// a fixed lease (its waiter gone before it came), then the next waiter's
/// answer on the same node for a renewed lease. The fixed lease's end no
/// longer stands: the node outlives it, as the renewed hold counts on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_answer_on_a_node_replaces_an_earlier_fixed_lease_end() {
    let server = lock_testkit::zookeeper::ZooKeeperServer::start();
    let backend = backend(&server).await;
    let lock = "/zk-backend-tests/fixed-then-renewed";
    // One lease length, so one session: the node serves both answers.
    let lease = Duration::from_secs(1);
    let join = Queue::Join(lease);
    let first = backend.acquire(Ask::of(
        lock,
        "place",
        (lease, false),
        join,
        LockMode::Exclusive,
    ));
    let Acquire::Held { fence, .. } = first.await.unwrap() else {
        panic!("a free lock is not held");
    };
    let renewed = (lease, true);
    let next = backend.acquire(Ask::of(lock, "place", renewed, join, LockMode::Exclusive));
    let Acquire::Held { fence: again, .. } = next.await.unwrap() else {
        panic!("the place's own node is not held");
    };
    assert_eq!(again, fence, "the same node");
    tokio::time::sleep(lease * 2).await;
    let place = backend
        .inner
        .place(lock, "place")
        .expect("the place is kept");
    let children = backend
        .inner
        .list(&place.session.client(), lock)
        .await
        .unwrap();
    assert!(
        children.contains(&place.name),
        "the renewed hold's node was deleted at the fixed lease's end: {children:?}"
    );
}

/// A fixed lease still ends on the server when no later answer replaced
/// it: its node is deleted (what the test above keeps from happening).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_lease_alone_ends_on_the_server() {
    let server = lock_testkit::zookeeper::ZooKeeperServer::start();
    let backend = backend(&server).await;
    let lock = "/zk-backend-tests/fixed-alone";
    let fixed = Duration::from_millis(300);
    let once = backend.acquire(Ask::of(
        lock,
        "one",
        (fixed, false),
        Queue::No,
        LockMode::Exclusive,
    ));
    assert!(matches!(once.await.unwrap(), Acquire::Held { .. }));
    let place = backend.inner.place(lock, "one").expect("held");
    let client = place.session.client();
    for _ in 0..100 {
        if !backend
            .inner
            .list(&client, lock)
            .await
            .unwrap()
            .contains(&place.name)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("a fixed lease's node stood 5 s past its 300 ms lease");
}
