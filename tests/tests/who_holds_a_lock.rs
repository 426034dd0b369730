//! Which process holds a lock, for an operator: a runtime on a server
//! backend (the Redis family, etcd, ZooKeeper) publishes who it is (host, pid, the name from the builder or
//! `LOCK_CLIENT_NAME`, when it started) in a small key whose TTL its
//! watchdog refreshes, so the identity is there while the process lives and
//! gone soon after it dies. `lockctl show`/`list` print it
//! (`lockctl/tests/cli.rs`, and on every topology `lockctl/tests/topologies.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant, SystemTime};

use lock_runtime::{layout, ClientInfo, LockRuntime};
use lock_testkit::pipes;
use lock_tests::{contender_bin, on_every_backend, redis, unique, Kind};

on_every_backend!(another_client_sees_the_holders_name_and_pid);

/// The identity of `holder`, once published: the watchdog publishes it at
/// its first tick, right after the build, and no event says when it landed,
/// so this looks (at most 100 times in 5 s).
async fn published(runtime: &LockRuntime, holder: &str) -> ClientInfo {
    for _ in 0..100 {
        if let Some(info) = runtime.client_of(holder).await.unwrap() {
            return info;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the identity of {holder} was not published within 5 s");
}

/// The identity key's remaining TTL in ms (`PTTL`: -2 gone, -1 none).
async fn ttl_ms(key: &str) -> i64 {
    let mut con = redis().connection().await;
    redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut con)
        .await
        .unwrap()
}

/// A runtime publishes its host, pid, name and start time under
/// `<prefix>client:<process>`, with a TTL of at most 30 s that its watchdog
/// refreshes (every 10 s): the TTL goes up again while the process lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_publishes_host_pid_name_and_start_with_a_ttl_its_watchdog_refreshes() {
    let prefix = unique("who");
    let before = SystemTime::now();
    let runtime = Kind::Redis
        .builder(&prefix)
        .client_name("invoice-worker")
        .build()
        .await
        .unwrap();
    let built = SystemTime::now();
    let guard = runtime.lock("invoice:1").acquire().await.unwrap();
    let holder = runtime.inspect("invoice:1").await.unwrap().unwrap().holder;

    let info = published(&runtime, &holder).await;
    assert_eq!(info.pid, std::process::id());
    assert_eq!(info.name.as_deref(), Some("invoice-worker"));
    assert!(!info.host.is_empty());
    // Milliseconds are kept: the start lies between before and after the build.
    let slack = Duration::from_millis(1);
    assert!(
        info.started + slack >= before && info.started <= built + slack,
        "{info:?}"
    );

    let process = holder.split(':').next().unwrap();
    let key = layout::client_identity(&prefix, process);
    let first = ttl_ms(&key).await;
    assert!(first > 0 && first <= 30_000, "TTL {first} ms");
    // A refresh sets the TTL back to 30 s: it goes up between two readings.
    // The next one is at most 10 s away; look for it for 20 s.
    let start = Instant::now();
    let mut last = first;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = ttl_ms(&key).await;
        assert!(now > 0, "the identity expired while its process lives");
        if now > last {
            break;
        }
        last = now;
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the TTL was not refreshed within 20 s ({first} ms, then {now} ms)"
        );
    }
    guard.release().await.unwrap();
}

/// A process whose builder names nothing is named by `LOCK_CLIENT_NAME`
/// (here the contender binary, a process of its own, holds the lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_client_name_names_a_process_whose_builder_gives_no_name() {
    let prefix = unique("who-env");
    let url = redis().url();
    let mut command = tokio::process::Command::new(contender_bin!());
    command
        .args([url.as_str(), prefix.as_str(), "hold", "job", "30000"])
        .env("LOCK_CLIENT_NAME", "nightly-export");
    let (child, mut lines) = pipes::spawn(&mut command).expect("spawn contender");
    let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("the contender took the lock within 10 s")
        .unwrap()
        .expect("the contender printed a line");
    assert!(line.starts_with("held "), "{line}");

    let runtime = Kind::Redis.runtime(&prefix).await;
    let holder = runtime.inspect("job").await.unwrap().unwrap().holder;
    let info = published(&runtime, &holder).await;
    assert_eq!(info.name.as_deref(), Some("nightly-export"));
    assert_eq!(Some(info.pid), child.id());
    drop(child);
}

/// Another client of the lock store finds the holder's host, pid and name
/// from the holder id `inspect` shows, on every server backend (etcd: a
/// key on the runtime's lease; ZooKeeper: an ephemeral node); the embedded
/// backend has nobody to tell and publishes nothing.
async fn another_client_sees_the_holders_name_and_pid(kind: Kind) {
    let prefix = unique("who-every");
    let runtime = kind
        .builder(&prefix)
        .client_name("billing")
        .build()
        .await
        .unwrap();
    // (Publishing nothing: it shares this process's uuid, so its own
    // identity, without a name, would replace the holder's.)
    let peer = match kind {
        Kind::Memory => runtime.clone(),
        _ => kind
            .builder(&prefix)
            .publish_identity(false)
            .build()
            .await
            .unwrap(),
    };
    let guard = runtime.lock("invoice:2").acquire().await.unwrap();
    let holder = peer.inspect("invoice:2").await.unwrap().unwrap().holder;
    if kind == Kind::Memory {
        assert_eq!(peer.client_of(&holder).await.unwrap(), None);
    } else {
        let info = published(&peer, &holder).await;
        assert_eq!(info.name.as_deref(), Some("billing"));
        assert_eq!(info.pid, std::process::id());
    }
    guard.release().await.unwrap();
}
