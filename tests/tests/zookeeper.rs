#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! What only the ZooKeeper backend has (every shared behaviour runs on a
//! standalone server from the backend list): Apache Curator's
//! `InterProcessMutex` on the same path, an ensemble of three that loses
//! its leader, a create applied after its attempt failed (a frozen leader),
//! a server restarted from its data directory, a client process stopped
//! past its session timeout, a network stalled (also under a hold taken
//! through a place queued for a shorter lease), and what a ZooKeeper path
//! refuses.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use lock_runtime::{LockError, LockGuard, LockRuntime};
use lock_testkit::signal::{self, Signal};
use lock_testkit::{LineChild, ZooKeeperEnsemble, ZooKeeperServer};
use lock_tests::{unique, zookeeper, FaultProxy};
use tokio::time::Instant;

/// A runtime on `connect` with the lock path prefix `/<prefix>/` and this
/// default lease.
async fn runtime_on(connect: &str, prefix: &str, lease: Duration) -> LockRuntime {
    LockRuntime::builder()
        .zookeeper(connect)
        .key_prefix(format!("/{prefix}/"))
        .default_lease(lease)
        .build()
        .await
        .expect("build the lock runtime on ZooKeeper")
}

/// The Curator jar, whose manifest names the rest (framework, client,
/// ZooKeeper, Guava, slf4j).
const CURATOR: &str = "/usr/share/java/curator-recipes.jar";

/// `tests/interop/CuratorHolder.java`, compiled once per test binary into
/// a directory of its own.
fn curator_classes() -> PathBuf {
    static CLASSES: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    CLASSES
        .get_or_init(|| {
            assert!(
                std::path::Path::new(CURATOR).exists(),
                "Curator not found: apt-get install -y libcurator-recipes-java \
                 libcurator-framework-java libcurator-client-java default-jdk-headless \
                 (scripts/test does this for you)"
            );
            let out = std::env::temp_dir().join(format!("curator-holder-{}", std::process::id()));
            std::fs::create_dir_all(&out).unwrap();
            let source =
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("interop/CuratorHolder.java");
            let status = Command::new("javac")
                .arg("-d")
                .arg(&out)
                .args(["-cp", CURATOR])
                .arg(&source)
                .status()
                .expect("run javac (apt-get install -y default-jdk-headless)");
            assert!(status.success(), "javac CuratorHolder.java failed");
            out
        })
        .clone()
}

/// A Java process holding Curator's `InterProcessMutex` on `path`, driven
/// by lines (see `CuratorHolder.java`); ready when it returns.
async fn curator(connect: &str, path: &str) -> LineChild {
    let classes = curator_classes();
    let classpath = format!(
        "{}:{CURATOR}:/usr/share/java/slf4j-nop.jar",
        classes.display()
    );
    let mut command = Command::new("java");
    command.args(["-cp", &classpath, "CuratorHolder", connect, path]);
    let mut child = LineChild::spawn(&mut command, "CuratorHolder").unwrap();
    child
        .expect("ready", Duration::from_secs(30))
        .await
        .unwrap();
    child
}

/// Polls (bounded: 5 s) until `key` has `want` contenders, the holder
/// included.
async fn until_contenders(runtime: &LockRuntime, key: &str, want: usize) {
    for _ in 0..500 {
        let info = runtime.inspect(key).await.unwrap();
        if info.map_or(0, |i| 1 + i.queue.len()) == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "{key} never had {want} contenders: {:?}",
        runtime.inspect(key).await
    );
}

/// Curator's `InterProcessMutex` and this runtime on the same path exclude
/// each other both ways, each queues behind the other, and Curator sees our
/// node as a contender in its own order (behind it, ahead of nobody).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_and_this_runtime_exclude_each_other_on_one_path() {
    let prefix = unique("interop");
    let connect = zookeeper().connect_string();
    let ours = runtime_on(&connect, &prefix, Duration::from_secs(5)).await;
    let mut java = curator(&connect, &format!("/{prefix}/k")).await;
    let line = Duration::from_secs(10);

    // We hold: Curator's try fails, its acquire queues behind us.
    let guard = ours.lock("k").acquire().await.unwrap();
    java.send("try").unwrap();
    java.expect("busy", line).await.unwrap();
    java.send("acquire").unwrap();
    until_contenders(&ours, "k", 2).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(300), java.next_line(line))
            .await
            .is_err(),
        "Curator entered while we hold"
    );
    guard.release().await.unwrap();
    java.expect("held", line).await.unwrap();

    // Curator holds: ours fails to try, then queues behind it.
    assert!(ours.lock("k").try_acquire().await.unwrap().is_none());
    let waiter = {
        let ours = ours.clone();
        tokio::spawn(async move { ours.lock("k").wait(Duration::from_secs(20)).acquire().await })
    };
    until_contenders(&ours, "k", 2).await;
    java.send("nodes").unwrap();
    let nodes = java.next_line(line).await.unwrap();
    let nodes: Vec<&str> = nodes.strip_prefix("nodes ").unwrap().split(',').collect();
    let info = ours.inspect("k").await.unwrap().unwrap();
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    // Curator's own node first (it holds), ours second, in its order.
    assert_eq!(info.holder, nodes[0], "{info:?} {nodes:?}");
    assert!(
        nodes[1].starts_with("_c_") && nodes[1].contains("-lock-"),
        "{nodes:?}"
    );
    assert!(!waiter.is_finished(), "we entered while Curator holds");
    java.send("release").unwrap();
    java.expect("released", line).await.unwrap();
    let guard = waiter.await.unwrap().unwrap();
    java.send("try").unwrap();
    java.expect("busy", line).await.unwrap();
    guard.release().await.unwrap();
    java.send("try").unwrap();
    java.expect("held", line).await.unwrap();
    java.send("release").unwrap();
    java.expect("released", line).await.unwrap();
    java.send("exit").unwrap();
}

/// An ensemble of three loses its leader while one runtime holds and
/// another waits: the hold survives (its session moves to a follower, the
/// new leader keeps it), nobody else enters meanwhile, and the waiter gets
/// the lock once it is released, with a larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ensemble_that_loses_its_leader_keeps_one_holder_and_serves_the_waiter() {
    let _turn = lock_tests::timing_turn().await;
    let mut ensemble = ZooKeeperEnsemble::start();
    let prefix = unique("leader");
    let lease = Duration::from_secs(6);
    let a = runtime_on(&ensemble.connect_string(), &prefix, lease).await;
    let b = runtime_on(&ensemble.connect_string(), &prefix, lease).await;
    let guard = a.lock("k").acquire().await.unwrap();
    let before = guard.fence();
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.lock("k").wait(Duration::from_secs(60)).acquire().await })
    };
    until_contenders(&a, "k", 2).await;

    let leader = ensemble.wait_for_leader();
    ensemble.kill(leader);
    let next = tokio::task::spawn_blocking(move || {
        let next = ensemble.wait_for_leader();
        (ensemble, next)
    });
    let (mut ensemble, next) = next.await.unwrap();
    assert_ne!(next, leader);
    // Two renewals after the election, and the hold still stands.
    let renewed = a.stats().watchdog.round_trips;
    lock_tests::wait_until("two renewals after the election", || {
        a.stats().watchdog.round_trips >= renewed + 2
    })
    .await;
    assert!(!guard.is_lost(), "the election lost the hold");
    assert!(
        !waiter.is_finished(),
        "the waiter entered beside the holder"
    );
    guard.release().await.unwrap();
    let taken = waiter.await.unwrap().unwrap();
    assert!(taken.fence() > before, "{} after {before}", taken.fence());
    taken.release().await.unwrap();
    ensemble.restart(leader).await;
}

/// An attempt whose create a follower holds for a frozen leader fails
/// without an answer; the create is applied once the leader runs again, on
/// the attempt's session, which lives on. The runtime gives that attempt's
/// node back all the same (it looks for it on the session the create went
/// out on, whose requests ZooKeeper answers in order), so the next process
/// takes the lock at once, not once the first process's session ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_applied_after_its_attempt_failed_leaves_no_node_behind() {
    let _turn = lock_tests::timing_turn().await;
    let ensemble = ZooKeeperEnsemble::start();
    let prefix = unique("late-create");
    let lease = Duration::from_secs(5);
    // Bounded: a leader that changed during the set-up (a JVM paused past
    // the followers' patience on a busy machine) means set up again.
    let mut set_up = None;
    for _ in 0..3 {
        let leader = ensemble.wait_for_leader();
        let follower = (0..ensemble.size()).find(|&i| i != leader).unwrap();
        // Through the follower only, with a short response timeout. The
        // lock's lease (its session's timeout) outlasts the freeze, so the
        // session survives it, and differs from the default lease (the
        // session the runtime reads on).
        let a = LockRuntime::builder()
            .zookeeper(format!("127.0.0.1:{}", ensemble.port(follower)))
            .key_prefix(format!("/{prefix}/"))
            .default_lease(Duration::from_secs(10))
            .response_timeout(Duration::from_millis(100))
            .build()
            .await
            .unwrap();
        // The lease's session opens with its first lock, and the lock's
        // path is made then (both are writes of the leader's: they must be
        // done before the freeze).
        let warm = a.lock("k").lease(lease).acquire().await.unwrap();
        warm.release().await.unwrap();
        if ensemble.wait_for_leader() == leader {
            set_up = Some((a, leader));
            break;
        }
    }
    let (a, leader) = set_up.expect("the ensemble kept changing its leader");
    ensemble.freeze(leader);
    let attempt = a.lock("k").lease(lease).try_acquire().await;
    // The fault lasts a second more (shorter than the followers' patience
    // with a silent leader, 2 s: no election): the attempt's give-back
    // runs meanwhile, while its create still waits.
    tokio::time::sleep(Duration::from_secs(1)).await;
    ensemble.thaw(leader);
    assert!(
        !matches!(attempt, Ok(Some(_))),
        "acquired while the leader was frozen"
    );
    let b = runtime_on(&ensemble.connect_string(), &prefix, Duration::from_secs(5)).await;
    let taken = b.lock("k").wait(Duration::from_secs(5)).acquire().await;
    assert!(
        taken.is_ok(),
        "the lock stayed blocked by the node of an attempt that failed: {:?}",
        a.inspect("k").await
    );
    taken.unwrap().release().await.unwrap();
}

/// A standalone server killed and started again from its data directory
/// within the session timeout: the holder's session and node come back, the
/// hold is not lost, and tokens keep growing (zxids are on disk).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restarted_from_its_data_keeps_the_hold_and_its_tokens_grow() {
    let _turn = lock_tests::timing_turn().await;
    let mut server = ZooKeeperServer::start();
    let prefix = unique("restart");
    let lease = Duration::from_secs(10);
    let a = runtime_on(&server.connect_string(), &prefix, lease).await;
    let b = runtime_on(&server.connect_string(), &prefix, lease).await;
    let guard = a.lock("k").acquire().await.unwrap();
    let before = guard.fence();
    server.restart().await;
    let renewed = a.stats().watchdog.round_trips;
    lock_tests::wait_until("two renewals after the restart", || {
        a.stats().watchdog.round_trips >= renewed + 2
    })
    .await;
    assert!(!guard.is_lost(), "the restart lost the hold");
    assert!(b.lock("k").try_acquire().await.unwrap().is_none());
    guard.release().await.unwrap();
    let next = b.lock("k").acquire().await.unwrap();
    assert!(next.fence() > before, "{} after {before}", next.fence());
    next.release().await.unwrap();
}

/// A client process stopped (SIGSTOP) past its session timeout: ZooKeeper
/// expires the session once it heard nothing from it for the timeout (here
/// the 1 s lease), deletes its node, and only then the other process
/// enters, with a larger token. The stopped one counted on its hold only
/// until its last renewal's send time plus the lease, which is no later, so
/// it had stopped counting before anyone entered; resumed, it is told the
/// hold was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_stopped_past_its_session_timeout_is_lost_and_the_other_enters_after_it() {
    let _turn = lock_tests::timing_turn().await;
    let prefix = unique("stopped");
    let url = format!("zookeeper://{}", zookeeper().connect_string());
    let mut command = Command::new(lock_tests::contender_bin!());
    command.args([url.as_str(), &format!("/{prefix}/"), "hold", "k", "1000"]);
    let mut child = LineChild::spawn(&mut command, "contender").unwrap();
    let held = child.next_line(Duration::from_secs(10)).await.unwrap();
    let theirs: u64 = held.strip_prefix("held ").unwrap().parse().unwrap();
    signal::send(child.pid(), Signal::Stop).unwrap();
    let stopped = Instant::now();
    let other = runtime_on(
        &zookeeper().connect_string(),
        &prefix,
        Duration::from_secs(1),
    )
    .await;
    let guard = other
        .lock("k")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let waited = stopped.elapsed();
    println!("entered {waited:?} after the holder stopped");
    // The session's last contact may be up to a third of the timeout (its
    // ping interval) before the stop.
    assert!(
        waited >= Duration::from_millis(600),
        "entered {waited:?} after the stop: within the stopped holder's session"
    );
    assert!(guard.fence() > theirs, "{} after {theirs}", guard.fence());
    signal::send(child.pid(), Signal::Cont).unwrap();
    let told = child.next_line(Duration::from_secs(10)).await.unwrap();
    assert_eq!(told, "lost");
    guard.release().await.unwrap();
}

/// Keys are paths: awkward ones are distinct locks, `/` nests, and what a
/// ZooKeeper path refuses is refused before any round trip, as is a lease
/// longer than the longest session the server grants (its
/// `maxSessionTimeout`, 60 s on the test servers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_paths_and_what_zookeeper_refuses_is_refused_at_once() {
    let runtime = runtime_on(
        &zookeeper().connect_string(),
        &unique("paths"),
        Duration::from_secs(5),
    )
    .await;
    let keys = ["x", "x}:fence", "}x", "{x}", "ключ:ü", "a/b", "a/b/c"];
    let mut guards = Vec::new();
    for key in keys {
        guards.push(
            runtime
                .lock(key)
                .wait(Duration::ZERO)
                .acquire()
                .await
                .unwrap(),
        );
    }
    for key in keys {
        assert!(
            runtime.lock(key).try_acquire().await.unwrap().is_none(),
            "{key}"
        );
    }
    for guard in guards {
        guard.release().await.unwrap();
    }
    for bad in ["line\nbreak", "ключ:🔒", "a//b", "a/", "..", "a/./b"] {
        let refused = runtime.lock(bad).try_acquire().await;
        assert!(
            matches!(refused, Err(LockError::InvalidKey { .. })),
            "{bad:?}: {refused:?}"
        );
    }
    let long = runtime
        .lock("k")
        .lease(Duration::from_secs(61))
        .try_acquire()
        .await;
    match long {
        Err(LockError::InvalidConfig(why)) => {
            assert!(why.contains("61s") && why.contains("60s"), "{why}");
        }
        other => panic!("a 61 s lease was not refused: {other:?}"),
    }
    // The default prefix of a runtime is no path; on ZooKeeper it is `/locks/`.
    let default = LockRuntime::builder()
        .zookeeper(zookeeper().connect_string())
        .build()
        .await
        .unwrap();
    assert_eq!(default.backend_key("k"), "/locks/k");
    let refused = LockRuntime::builder()
        .zookeeper(zookeeper().connect_string())
        .key_prefix("locks:")
        .build()
        .await;
    assert!(
        matches!(refused, Err(LockError::InvalidConfig(_))),
        "{refused:?}"
    );
}

/// A holder whose network to ZooKeeper stalls (the connection open, nothing
/// passing) is told its hold is lost at its client-side lease end, before
/// the server expires its session and lets anyone else in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_network_loses_the_hold_before_anyone_else_enters() {
    let _turn = lock_tests::timing_turn().await;
    let proxy = FaultProxy::start(zookeeper().port()).await;
    let prefix = unique("stall");
    let lease = Duration::from_secs(1);
    let through = format!("127.0.0.1:{}", proxy.port());
    let stalled = runtime_on(&through, &prefix, lease).await;
    let other = runtime_on(&zookeeper().connect_string(), &prefix, lease).await;
    let guard = stalled.lock("k").acquire().await.unwrap();
    let next = told_lost_before_the_other_enters(&proxy, &guard, other).await;
    next.release().await.unwrap();
}

/// Stalls `proxy` (the way of `guard`'s holder to ZooKeeper) while `other`
/// waits for the lock `k`: the holder must be told its hold is lost before
/// `other` enters, with a larger token. Resumes the proxy; `other`'s guard.
async fn told_lost_before_the_other_enters(
    proxy: &FaultProxy,
    guard: &LockGuard,
    other: LockRuntime,
) -> LockGuard {
    proxy.stall();
    let waiter = tokio::spawn(async move {
        let guard = other
            .lock("k")
            .wait(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        (guard, Instant::now())
    });
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the stalled holder was told it lost the lock");
    let lost_at = Instant::now();
    let (next, entered) = waiter.await.unwrap();
    assert!(
        lost_at <= entered,
        "the other entered {:?} before the holder was told",
        lost_at - entered
    );
    assert!(next.fence() > guard.fence());
    proxy.resume();
    next
}

/// A process's queued place is shared by its waiters on the key, whatever
/// their leases, and its node lives on the session of the lease that
/// queued it. A waiter of a long lease that takes the lock through a place
/// a short lease's waiter queued does not hold it on the short lease's
/// session (which a stall longer than the short lease would end, and the
/// node with it, while the holder counts on the long one): stalled, the
/// holder is told its hold is lost before anyone else enters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_place_queued_for_a_short_lease_holds_no_longer_lease_past_its_session() {
    let _turn = lock_tests::timing_turn().await;
    let proxy = FaultProxy::start(zookeeper().port()).await;
    let prefix = unique("place-lease");
    let (short, long) = (Duration::from_millis(800), Duration::from_secs(3));
    let through = format!("127.0.0.1:{}", proxy.port());
    let waiting = runtime_on(&through, &prefix, long).await;
    let other = runtime_on(&zookeeper().connect_string(), &prefix, long).await;
    let held = other.lock("k").acquire().await.unwrap();
    // The short lease's waiter queues the process's place, and gives up;
    // the long lease's waiter, queued meanwhile, goes on with that place.
    let short_waiter = {
        let waiting = waiting.clone();
        tokio::spawn(async move {
            let request = waiting.lock("k").lease(short);
            request.wait(Duration::from_secs(1)).acquire().await
        })
    };
    until_contenders(&other, "k", 2).await;
    let long_waiter = {
        let waiting = waiting.clone();
        tokio::spawn(async move {
            let request = waiting.lock("k").lease(long);
            request.wait(Duration::from_secs(10)).acquire().await
        })
    };
    assert!(
        short_waiter.await.unwrap().is_err(),
        "the short waiter entered"
    );
    held.release().await.unwrap();
    let guard = long_waiter.await.unwrap().unwrap();
    let next = told_lost_before_the_other_enters(&proxy, &guard, other).await;
    next.release().await.unwrap();
}

/// A nested key's lock path lives under its parent key's path (`a/b` under
/// `a`): neither is taken for a contender of the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_key_is_no_contender_of_its_parent_key() {
    let runtime = runtime_on(
        &zookeeper().connect_string(),
        &unique("nested"),
        Duration::from_secs(5),
    )
    .await;
    let child = runtime.lock("a/b").acquire().await.unwrap();
    assert!(runtime.inspect("a").await.unwrap().is_none());
    assert!(!runtime.force_unlock("a").await.unwrap());
    let parent = runtime
        .lock("a")
        .try_acquire()
        .await
        .unwrap()
        .expect("a is free");
    assert_eq!(runtime.inspect("a").await.unwrap().unwrap().queue.len(), 0);
    parent.release().await.unwrap();
    child.release().await.unwrap();
}

/// With `zookeeper_auth` the session authenticates with the `digest`
/// scheme (`addauth digest user:password`) and locks as usual; a server
/// that is not there fails `build()`, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_auth_locks_as_usual_and_an_absent_server_fails_the_build() {
    let runtime = LockRuntime::builder()
        .zookeeper(zookeeper().connect_string())
        .zookeeper_auth("app", "secret")
        .key_prefix(format!("/{}/", unique("auth")))
        .build()
        .await
        .unwrap();
    let guard = runtime.lock("k").acquire().await.unwrap();
    assert!(runtime.lock("k").try_acquire().await.unwrap().is_none());
    guard.release().await.unwrap();

    let port = lock_testkit::free_port();
    let absent = LockRuntime::builder()
        .zookeeper(format!("127.0.0.1:{port}"))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await;
    match absent {
        Err(LockError::Backend(e)) => assert!(e.to_string().contains(&port.to_string()), "{e}"),
        other => panic!("built without a server: {other:?}"),
    }
}
