#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! What only the etcd backend has (every shared behaviour runs on etcd from
//! the backend list): `etcdctl lock` on the same name, a cluster of three
//! that loses its leader, a whole cluster restarted from its data
//! directories, a client process stopped past its lease, a client whose
//! network stalls, and a compaction while a waiter watches.

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{with_lock, LockError, LockMode, LockRuntime};
use lock_testkit::etcd::etcdctl_binary;
use lock_testkit::signal::{self, Signal};
use lock_testkit::{EtcdCluster, LineChild};
use lock_tests::assert_token_above;
use lock_tests::cut_off::{a_stopped_holder_is_outlived, told_lost_before_the_other_enters};
use lock_tests::looked::until_contenders;
use lock_tests::{etcd, try_takes, unique, FaultProxy, Occupancy};
use tokio::time::Instant;

/// A runtime on these etcd endpoints with this prefix and default lease.
async fn runtime_on(endpoints: Vec<String>, prefix: &str, lease: Duration) -> LockRuntime {
    LockRuntime::builder()
        .etcd(endpoints)
        .key_prefix(prefix)
        .default_lease(lease)
        .build()
        .await
        .expect("build the lock runtime on etcd")
}

/// Two runtimes (two processes) on `cluster` under `prefix`, with this
/// default lease.
async fn two_on(
    cluster: &EtcdCluster,
    prefix: &str,
    lease: Duration,
) -> (LockRuntime, LockRuntime) {
    let a = runtime_on(cluster.endpoints(), prefix, lease).await;
    (a, runtime_on(cluster.endpoints(), prefix, lease).await)
}

/// The lock `k`: held by `runtime`, refused to a try of `peer`, and handed
/// to a waiter of `peer` at its release, with a larger token.
async fn excludes_and_hands_over(runtime: &LockRuntime, peer: &LockRuntime) {
    let held = runtime.lock("k").acquire().await.unwrap();
    assert!(!try_takes(peer.lock("k")).await);
    let waiter = {
        let peer = peer.clone();
        tokio::spawn(async move { peer.lock("k").acquire().await.map(|g| g.fence()) })
    };
    let first = held.fence();
    held.release().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was woken")
        .unwrap()
        .unwrap();
    assert!(second > first);
}

/// `etcdctl lock <name>` against `endpoint`: it prints its key once it
/// holds the lock, and gives it back on SIGTERM.
fn etcdctl_lock(endpoint: &str, name: &str) -> LineChild {
    let etcdctl = etcdctl_binary().unwrap_or_else(|e| panic!("{e:#}"));
    let mut command = Command::new(etcdctl);
    command
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoint, "lock", name]);
    LineChild::spawn(&mut command, "etcdctl lock").unwrap()
}

/// `etcdctl lock NAME` and a runtime with an empty prefix, whose key `NAME`
/// is that lock: each waits for the other, in the order of their keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_and_this_runtime_exclude_each_other_both_ways() {
    let endpoint = etcd().endpoint(0);
    let runtime = runtime_on(etcd().endpoints(), "", Duration::from_secs(5)).await;
    let name = unique("interop");

    // We hold: etcdctl queues behind us, and holds once we release.
    let guard = runtime.lock(name.as_str()).acquire().await.unwrap();
    let mut ctl = etcdctl_lock(&endpoint, &name);
    until_contenders(&runtime, &name, 2).await;
    assert!(
        ctl.next_line(Duration::from_millis(300)).await.is_err(),
        "etcdctl entered while we held the lock"
    );
    let ours = guard.fence();
    guard.release().await.unwrap();
    let key = ctl.next_line(Duration::from_secs(5)).await.unwrap();
    assert!(key.starts_with(&format!("{name}/")), "{key}");

    // etcdctl holds: we wait behind it, and hold once it lets go.
    assert!(!try_takes(runtime.lock(name.as_str())).await);
    let theirs = runtime
        .inspect(&name)
        .await
        .unwrap()
        .expect("etcdctl holds");
    assert!(!theirs.held_by_this_process);
    let their_fence = theirs.fence.expect("a create revision");
    assert!(their_fence > ours, "{their_fence} after {ours}");
    let waiter = {
        let runtime = runtime.clone();
        let name = name.clone();
        tokio::spawn(async move {
            let guard = runtime
                .lock(name)
                .wait(Duration::from_secs(10))
                .acquire()
                .await?;
            Ok::<_, LockError>((guard.fence(), Instant::now()))
        })
    };
    until_contenders(&runtime, &name, 2).await;
    assert!(
        !waiter.is_finished(),
        "we entered while etcdctl held the lock"
    );
    let let_go = Instant::now();
    signal::send(ctl.pid(), Signal::Term).unwrap();
    let (fence, entered) = waiter.await.unwrap().unwrap();
    assert!(fence > their_fence, "{fence} after {their_fence}");
    assert!(entered >= let_go);
    assert!(
        entered - let_go < Duration::from_secs(3),
        "{:?} after etcdctl let go",
        entered - let_go
    );
}

/// `etcdctl lock NAME` is a writer to our readers, both ways: it waits
/// until the last of our readers (of two runtimes) has left, and our
/// readers wait for it, refused while it holds and woken when it lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_and_our_readers_exclude_each_other_both_ways() {
    let endpoint = etcd().endpoint(0);
    let lease = Duration::from_secs(5);
    let runtime = runtime_on(etcd().endpoints(), "", lease).await;
    let peer = runtime_on(etcd().endpoints(), "", lease).await;
    let name = unique("interop-read");

    // Our readers hold: etcdctl queues behind both, and holds once the
    // last one leaves.
    let first = runtime.lock(name.as_str()).read().acquire().await.unwrap();
    let second = peer.lock(name.as_str()).read().acquire().await.unwrap();
    let mut ctl = etcdctl_lock(&endpoint, &name);
    until_contenders(&runtime, &name, 3).await;
    assert!(
        ctl.next_line(Duration::from_millis(300)).await.is_err(),
        "etcdctl entered while our readers held the lock"
    );
    let ours = first.fence().max(second.fence());
    first.release().await.unwrap();
    assert!(
        ctl.next_line(Duration::from_millis(300)).await.is_err(),
        "etcdctl entered beside our second reader"
    );
    second.release().await.unwrap();
    let key = ctl.next_line(Duration::from_secs(5)).await.unwrap();
    assert!(key.starts_with(&format!("{name}/")), "{key}");

    // etcdctl holds: our readers are refused, and wait behind it.
    assert!(!try_takes(runtime.lock(name.as_str()).read()).await);
    let theirs = runtime
        .inspect(&name)
        .await
        .unwrap()
        .expect("etcdctl holds");
    assert_eq!(theirs.mode, LockMode::Write);
    assert!(!theirs.held_by_this_process);
    let their_fence = theirs.fence.expect("a create revision");
    assert!(their_fence > ours, "{their_fence} after {ours}");
    let mut readers = Vec::new();
    for rt in [&runtime, &peer] {
        let (rt, name) = (rt.clone(), name.clone());
        readers.push(tokio::spawn(async move {
            let guard = rt
                .lock(name)
                .read()
                .wait(Duration::from_secs(10))
                .acquire()
                .await?;
            Ok::<_, LockError>((guard, Instant::now()))
        }));
    }
    until_contenders(&runtime, &name, 3).await;
    assert!(
        readers.iter().all(|r| !r.is_finished()),
        "a reader entered while etcdctl held the lock"
    );
    let let_go = Instant::now();
    signal::send(ctl.pid(), Signal::Term).unwrap();
    let mut guards = Vec::new();
    for reader in readers {
        let (guard, entered) = reader.await.unwrap().unwrap();
        assert_token_above(&guard, their_fence, "their hold");
        assert!(entered >= let_go);
        assert!(
            entered - let_go < Duration::from_secs(3),
            "{:?} after etcdctl let go",
            entered - let_go
        );
        guards.push(guard);
    }
    // Both inside at once: they share the key.
    let info = runtime.inspect(&name).await.unwrap().expect("read");
    assert_eq!((info.mode, info.readers.len()), (LockMode::Read, 2));
}

/// Two runtimes count under one lock on a cluster of three while its
/// leader is killed: never two holders, tokens only grow, and every waiter
/// gets its turn once a new leader is elected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_leader_of_three_keeps_one_holder_and_waiters_go_on() {
    let mut cluster = EtcdCluster::start(3);
    let prefix = unique("leader");
    let lease = Duration::from_secs(3);
    let (a, b) = two_on(&cluster, &prefix, lease).await;
    let occupancy = Arc::new(Occupancy::new());
    let fences = Arc::new(Mutex::new(Vec::new()));
    let counted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..4 {
        let runtime = if t % 2 == 0 { a.clone() } else { b.clone() };
        let (occupancy, fences, counted) = (occupancy.clone(), fences.clone(), counted.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..40 {
                let request = runtime.lock("k").wait(Duration::from_secs(30));
                let guard = request.acquire().await?;
                {
                    let _inside = occupancy.enter();
                    fences.lock().unwrap().push(guard.fence());
                    let value = counted.load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    counted.store(value + 1, Ordering::SeqCst);
                }
                // A release that fails during the election is left to the
                // lease; the next acquire waits for it.
                let _ = guard.release().await;
            }
            Ok::<_, LockError>(())
        }));
    }
    // Kill the leader once the lock has changed hands a few times.
    let started = Instant::now();
    while counted.load(Ordering::SeqCst) < 20 {
        assert!(started.elapsed() < Duration::from_secs(20), "no progress");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let leader = cluster.leader().expect("a leader");
    cluster.kill(leader);
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("the waiters went on after the election")
            .unwrap()
            .unwrap();
    }
    assert_eq!(occupancy.max(), 1, "two holders at once");
    assert_eq!(counted.load(Ordering::SeqCst), 160, "an update was lost");
    let fences = fences.lock().unwrap();
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "tokens went back: {fences:?}"
    );
}

/// A holder stays the holder when the whole cluster is restarted from its
/// data directories within the lease (etcd keeps leases on disk), no one
/// else enters meanwhile, and the next holder's token is larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_restarted_from_disk_keeps_its_holder_and_tokens_grow() {
    let mut cluster = EtcdCluster::start(1);
    let prefix = unique("restart");
    let lease = Duration::from_secs(4);
    let (a, b) = two_on(&cluster, &prefix, lease).await;
    let guard = a.lock("k").acquire().await.unwrap();
    let before = guard.fence();
    cluster.restart_all();
    // Two renewals after the restart, and the hold still stands.
    let renewed = a.stats().watchdog.round_trips;
    lock_tests::wait_until("two renewals after the restart", || {
        a.stats().watchdog.round_trips >= renewed + 2
    })
    .await;
    assert!(!guard.is_lost(), "the restart lost the hold");
    assert!(!try_takes(b.lock("k")).await);
    guard.release().await.unwrap();
    let next = b.lock("k").acquire().await.unwrap();
    assert!(next.fence() > before, "{} after {before}", next.fence());
}

/// A client process stopped (SIGSTOP) past its lease: the other process
/// enters only once etcd expired the stopped one's lease, with a larger
/// token, and the stopped one, resumed, is told its hold was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_stopped_past_its_lease_is_lost_and_the_other_enters_after_it() {
    let _turn = lock_tests::timing_turn().await;
    let prefix = unique("stopped");
    let url = format!("etcd://{}", etcd().endpoints().join(","));
    let holder = (lock_tests::contender_bin!(), url.as_str(), prefix.as_str());
    let other = runtime_on(etcd().endpoints(), &prefix, Duration::from_secs(1));
    // The stopped process's etcd lease: 2 s (1.5 leases, whole seconds)
    // from its last keep-alive, which may be up to a quarter TTL before the
    // stop; etcd revokes expired leases every 500 ms.
    a_stopped_holder_is_outlived(holder, other, Duration::from_millis(1000)).await;
}

/// A holder whose network to etcd stalls is told its hold is lost at its
/// client-side lease end, before etcd lets anyone else in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_network_loses_the_hold_before_anyone_else_enters() {
    let _turn = lock_tests::timing_turn().await;
    let port: u16 = etcd()
        .endpoint(0)
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let proxy = FaultProxy::start(port).await;
    let prefix = unique("stall");
    let lease = Duration::from_secs(1);
    let endpoint = format!("127.0.0.1:{}", proxy.port());
    let stalled = runtime_on(vec![endpoint], &prefix, lease).await;
    let other = runtime_on(etcd().endpoints(), &prefix, lease).await;
    let guard = stalled.lock("k").acquire().await.unwrap();
    let _next = told_lost_before_the_other_enters(&proxy, &guard, other).await;
}

/// A waiter keeps watching its predecessor across a compaction of the
/// store: the release still reaches it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_while_waiting_does_not_lose_the_release() {
    let prefix = unique("compact");
    let lease = Duration::from_secs(5);
    let holder = runtime_on(etcd().endpoints(), &prefix, lease).await;
    let waiter_rt = runtime_on(etcd().endpoints(), &prefix, lease).await;
    let guard = holder.lock("k").acquire().await.unwrap();
    let waiter = tokio::spawn(async move {
        with_lock(waiter_rt.lock("k").wait(Duration::from_secs(20)), async {
            Ok::<_, LockError>(Instant::now())
        })
        .await
    });
    until_contenders(&holder, "k", 2).await;
    let mut client = etcd_client::Client::connect(etcd().endpoints(), None)
        .await
        .unwrap();
    let mut revision = 0;
    for n in 0..50 {
        let put = client
            .put(format!("{prefix}filler/{n}"), "x", None)
            .await
            .unwrap();
        revision = put.header().unwrap().revision();
    }
    client
        .compact(
            revision,
            Some(etcd_client::CompactionOptions::new().with_physical()),
        )
        .await
        .unwrap();
    let released = Instant::now();
    guard.release().await.unwrap();
    let entered = waiter.await.unwrap().unwrap();
    assert!(
        entered - released < Duration::from_secs(1),
        "the waiter entered {:?} after the release",
        entered - released
    );
}

/// etcd with auth on: a runtime given the user and password locks as
/// usual, also as a user allowed only the key prefix; one without them is
/// refused at build, naming the cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_authenticates_to_etcd_and_without_credentials_is_refused() {
    let cluster = EtcdCluster::start(1);
    let endpoint = cluster.endpoint(0);
    let etcdctl = etcdctl_binary().unwrap_or_else(|e| panic!("{e:#}"));
    let ctl = |args: &[&str]| {
        let out = Command::new(&etcdctl)
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", endpoint.as_str()])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "etcdctl {args:?}: {out:?}");
    };
    ctl(&["user", "add", "root", "--new-user-password", "s3cret"]);
    // A user allowed only the runtime's key prefix (as an operator grants
    // it): every key the runtime reads or writes is in that range.
    ctl(&["role", "add", "locks"]);
    ctl(&[
        "role",
        "grant-permission",
        "locks",
        "--prefix=true",
        "readwrite",
        "lock:",
    ]);
    ctl(&["user", "add", "app", "--new-user-password", "app-pw"]);
    ctl(&["user", "grant-role", "app", "locks"]);
    ctl(&["auth", "enable"]);
    let as_user = |user, password| {
        let builder = LockRuntime::builder().etcd(cluster.endpoints());
        builder.etcd_auth(user, password).build()
    };
    let confined = as_user("app", "app-pw")
        .await
        .expect("a runtime whose user may use the lock prefix only");
    excludes_and_hands_over(&confined, &confined).await;
    let runtime = as_user("root", "s3cret")
        .await
        .expect("a runtime with the right credentials");
    let guard = runtime.lock("k").acquire().await.unwrap();
    assert!(guard.fence() > 0);
    guard.release().await.unwrap();
    let refused = LockRuntime::builder()
        .etcd(cluster.endpoints())
        .build()
        .await
        .expect_err("a runtime without credentials");
    let message = refused.to_string();
    assert!(message.contains("etcd"), "{message}");
    assert!(!message.contains("s3cret"), "{message}");
    let wrong = as_user("root", "wrong")
        .await
        .expect_err("a runtime with a wrong password");
    assert!(!wrong.to_string().contains("wrong"), "{wrong}");
}

/// With every member of the cluster down, a try-once ends within its try
/// timeout plus the response timeout, and a bounded wait soon after its
/// deadline: an outage is not a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_during_a_whole_cluster_outage_end_within_their_bounds() {
    let mut cluster = EtcdCluster::start(3);
    let timeout = Duration::from_millis(400);
    let runtime = LockRuntime::builder()
        .etcd(cluster.endpoints())
        .key_prefix(unique("outage"))
        .response_timeout(timeout)
        .connect_timeout(timeout)
        .build()
        .await
        .unwrap();
    let held = runtime.lock("a").acquire().await.unwrap();
    drop(held);
    for n in 0..cluster.size() {
        cluster.kill(n);
    }
    let mut worst = (Duration::ZERO, Duration::ZERO);
    for i in 0..6 {
        let begun = Instant::now();
        let tried = runtime.lock(format!("k{}", i % 2)).try_acquire().await;
        assert!(tried.is_err(), "{tried:?}");
        worst.0 = worst.0.max(begun.elapsed());
        let begun = Instant::now();
        let waited = runtime
            .lock("a")
            .wait(Duration::from_millis(250))
            .acquire()
            .await;
        assert!(waited.is_err());
        worst.1 = worst.1.max(begun.elapsed());
    }
    eprintln!(
        "worst try-once {:?}, worst 250 ms wait {:?}",
        worst.0, worst.1
    );
    assert!(worst.0 < Duration::from_millis(750), "{worst:?}");
    assert!(worst.1 < Duration::from_millis(1000), "{worst:?}");
}

/// etcd over TLS (`https://` endpoints): a runtime that trusts the private
/// CA and presents a client certificate locks and waits as usual; without
/// the CA the handshake is refused at build, and so is a mix of `https://`
/// and plain endpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_over_mutual_tls_locks_and_refuses_an_unknown_ca() {
    let pki = lock_tests::TestPki::new();
    let tls = lock_testkit::etcd::Tls {
        cert: pki.path("server.crt"),
        key: pki.path("server.key"),
        client_ca: Some(pki.path("ca.crt")),
    };
    let cluster = EtcdCluster::try_start_tls(1, tls).unwrap_or_else(|e| panic!("{e:#}"));
    let secure = || {
        LockRuntime::builder()
            .etcd(cluster.tls_endpoints())
            .tls_root_ca(pki.read("ca.crt"))
            .tls_client_cert(pki.read("client.crt"), pki.read("client.key"))
            .key_prefix("tls:")
    };
    let runtime = secure().build().await.expect("a runtime over mutual TLS");
    let peer = secure().build().await.unwrap();
    excludes_and_hands_over(&runtime, &peer).await;
    let unknown_ca = LockRuntime::builder()
        .etcd(cluster.tls_endpoints())
        .tls_client_cert(pki.read("client.crt"), pki.read("client.key"))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .await
        .expect_err("the system roots do not know the private CA");
    assert!(unknown_ca.to_string().contains("etcd"), "{unknown_ca}");
    let mut mixed = cluster.tls_endpoints();
    mixed.extend(cluster.endpoints());
    let refused = LockRuntime::builder()
        .etcd(mixed)
        .tls_root_ca(pki.read("ca.crt"))
        .build()
        .await
        .expect_err("https:// and plain endpoints mixed");
    assert!(refused.to_string().contains("https://"), "{refused}");
}
