//! Configuration and errors: what a user can get wrong (URLs, passwords,
//! keys, leases, durations at their extremes, TLS roots, ACL users) is
//! refused with a clear error that never shows a secret; defaults are
//! bounded; and a runtime whose server is gone answers with errors, never
//! a panic or a hang.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use lock_runtime::{with_lock, LockError, LockRuntime, LockRuntimeBuilder};
use lock_testkit::{free_port, RedisServer};
use lock_tests::{impatient, impatient_runtime, redis, unique, until_queued};

// ---------------------------------------------------------------------------
// Refused before anything runs
// ---------------------------------------------------------------------------

/// How `build()` fails for `builder`, given half a second to connect.
async fn refused(builder: LockRuntimeBuilder) -> LockError {
    builder
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap_err()
}

#[tokio::test]
async fn malformed_url_is_invalid_config_without_echoing_it() {
    for url in [
        "http://user:hunter2@127.0.0.1:6379",
        "redis://user:hunter2@[::1",
        "hunter2",
    ] {
        let err = LockRuntime::builder().redis(url).build().await.unwrap_err();
        assert!(matches!(err, LockError::InvalidConfig(_)), "{url}: {err:?}");
        let shown = format!("{err} {err:?}");
        assert!(
            shown.contains("redis://"),
            "message should show the expected shape: {shown}"
        );
        assert!(!shown.contains("hunter2"), "secret leaked: {shown}");
    }
}

#[tokio::test]
async fn unreachable_redis_fails_fast_and_names_the_address_not_the_password() {
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let start = Instant::now();
    let err =
        refused(LockRuntime::builder().redis(format!("redis://app:hunter2@127.0.0.1:{port}")))
            .await;
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "took {:?}",
        start.elapsed()
    );
    assert!(matches!(err, LockError::Backend(_)), "{err:?}");
    let shown = format!("{err} {err:?}");
    assert!(shown.contains(&format!("127.0.0.1:{port}")), "{shown}");
    assert!(!shown.contains("hunter2"), "secret leaked: {shown}");
}

#[tokio::test]
async fn wrong_password_is_a_backend_error_without_the_password() {
    let server = RedisServer::start_with(&["--requirepass", "right-one"]);
    let err = LockRuntime::builder()
        .redis(format!("redis://:hunter2@127.0.0.1:{}", server.port()))
        .build()
        .await
        .unwrap_err();
    let shown = format!("{err} {err:?}");
    assert!(matches!(err, LockError::Backend(_)), "{shown}");
    assert!(!shown.contains("hunter2"), "secret leaked: {shown}");
}

#[tokio::test]
async fn runtime_debug_and_describe_hide_credentials() {
    let builder = LockRuntime::builder().redis("redis://app:hunter2@127.0.0.1:6379");
    assert!(!format!("{builder:?}").contains("hunter2"));
    let runtime = LockRuntime::builder()
        .redis(redis().url())
        .build()
        .await
        .unwrap();
    assert_eq!(
        runtime.describe(),
        format!("redis at 127.0.0.1:{}", redis().port())
    );
}

#[tokio::test]
async fn bad_keys_and_leases_are_refused_before_any_round_trip() {
    let runtime = LockRuntime::builder()
        .redis(redis().url())
        .key_prefix(unique("bad"))
        .build()
        .await
        .unwrap();
    let empty = runtime.lock("").acquire().await.unwrap_err();
    assert!(matches!(empty, LockError::InvalidKey { .. }), "{empty}");
    let long = runtime.lock("x".repeat(5000)).acquire().await.unwrap_err();
    assert!(matches!(long, LockError::InvalidKey { .. }), "{long}");
    assert!(long.to_string().len() < 300, "the error repeats a huge key");
    let request = runtime.lock("k").lease(Duration::from_millis(1));
    let lease = request.acquire().await.unwrap_err();
    assert!(matches!(lease, LockError::InvalidConfig(_)), "{lease}");
    let prefix = LockRuntime::builder()
        .memory()
        .key_prefix("a{b")
        .build()
        .await
        .unwrap_err();
    assert!(matches!(prefix, LockError::InvalidConfig(_)), "{prefix}");
}

/// Every duration setter takes 0, 1 ns, `MAX` and values around its
/// documented limits without a panic: the result is a runtime, a hold, or
/// `InvalidConfig`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_duration_input_panics() {
    let nanos = Duration::from_nanos;
    let extremes = [
        Duration::ZERO,
        nanos(1),
        Duration::from_millis(1) - nanos(1),
        Duration::from_millis(1),
        lock_runtime::MIN_LEASE - nanos(1),
        lock_runtime::MIN_LEASE,
        lock_runtime::MAX_LEASE,
        lock_runtime::MAX_LEASE + nanos(1),
        Duration::from_secs(3600),
        Duration::from_secs(3600) + nanos(1),
        Duration::MAX - nanos(1),
        Duration::MAX,
    ];
    let url = redis().url();
    let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
    for d in extremes {
        let builders = [
            (
                "connect_timeout",
                LockRuntime::builder().redis(&url).connect_timeout(d),
            ),
            (
                "response_timeout",
                LockRuntime::builder().redis(&url).response_timeout(d),
            ),
            (
                "try_timeout",
                LockRuntime::builder().redis(&url).try_timeout(d),
            ),
            (
                "default_lease",
                LockRuntime::builder().memory().default_lease(d),
            ),
            (
                "default_wait",
                LockRuntime::builder().memory().default_wait(Some(d)),
            ),
        ];
        for (setter, builder) in builders {
            let outcome = match builder.build().await {
                Ok(runtime) => {
                    // A runtime that started must still answer: with a lock,
                    // or (timeouts of a millisecond) with an error.
                    let guard = runtime
                        .lock(unique("k"))
                        .wait(Duration::from_millis(500))
                        .acquire()
                        .await;
                    if d >= Duration::from_millis(100) || !setter.ends_with("timeout") {
                        assert!(guard.is_ok(), "{setter}({d:?}): {guard:?}");
                    }
                    "ok"
                }
                Err(LockError::InvalidConfig(message)) => {
                    assert!(message.contains(setter), "{setter}({d:?}): {message}");
                    "invalid"
                }
                // A timeout of a few milliseconds may run out while the
                // runtime connects or loads its scripts (a busy machine):
                // an error, not a panic.
                Err(LockError::Backend(_))
                    if d < Duration::from_millis(100) && setter.ends_with("timeout") =>
                {
                    "backend error"
                }
                Err(other) => panic!("{setter}({d:?}): {other:?}"),
            };
            *outcomes.entry(format!("{setter} {outcome}")).or_default() += 1;
        }
        let runtime = LockRuntime::builder().memory().build().await.unwrap();
        for (what, request) in [
            ("lease", runtime.lock("r").lease(d)),
            ("wait", runtime.lock("r").wait(d)),
        ] {
            match request.acquire().await {
                Ok(guard) => guard.release().await.unwrap(),
                Err(LockError::InvalidConfig(message)) => {
                    assert!(message.contains(what), "{what}({d:?}): {message}")
                }
                Err(other) => panic!("{what}({d:?}): {other:?}"),
            }
        }
    }
    eprintln!("duration extremes: {outcomes:?}");
}

/// `wait(Duration::MAX)` means forever, not an overflow.
#[tokio::test]
async fn enormous_wait_is_a_wait_forever() {
    let runtime = LockRuntime::builder().memory().build().await.unwrap();
    let request = runtime.lock("k").wait(Duration::MAX);
    let guard = request.acquire().await.unwrap();
    guard.release().await.unwrap();
    let guard = runtime
        .lock("k")
        .lease(Duration::from_secs(24 * 3600))
        .wait(Duration::MAX)
        .acquire()
        .await
        .unwrap();
    assert!(!guard.is_lost());
}

/// `LockRuntime::builder()` bounds waits by default ([`DEFAULT_WAIT`]): a
/// request that sets none gives up with an error instead of hanging. (The
/// 30 s default itself is checked in the runtime's unit tests.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_wait_is_bounded_and_configurable() {
    assert_eq!(lock_runtime::DEFAULT_WAIT, Duration::from_secs(30));
    let runtime = LockRuntime::builder()
        .memory()
        .default_wait(Some(Duration::from_millis(200)))
        .build()
        .await
        .unwrap();
    let _guard = runtime.lock("k").acquire().await.unwrap();
    let rt = runtime.clone();
    let err = tokio::spawn(async move { rt.lock("k").acquire().await.map(drop) })
        .await
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
}

// ---------------------------------------------------------------------------
// TLS and ACL users
// ---------------------------------------------------------------------------

/// Locks work over `rediss://` against a TLS-only listener, trusting a
/// private CA; without that CA the handshake is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_connection_locks_and_rejects_an_unknown_ca() {
    let pki = lock_tests::TestPki::new();
    let tls_port = free_port().to_string();
    let (cert, key, ca) = (
        pki.path("server.crt"),
        pki.path("server.key"),
        pki.path("ca.crt"),
    );
    let tls_only = [
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca,
        "--tls-auth-clients",
        "no",
    ];
    let server = RedisServer::start_with(&tls_only);
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let runtime = LockRuntime::builder()
        .redis(&url)
        .tls_root_ca(pki.read("ca.crt"))
        .key_prefix(unique("tls"))
        .build()
        .await
        .unwrap();
    let peer = LockRuntime::builder()
        .redis(&url)
        .tls_root_ca(pki.read("ca.crt"))
        .key_prefix(runtime_prefix(&runtime))
        .build()
        .await
        .unwrap();
    let guard = runtime.lock("tls-key").acquire().await.unwrap();
    assert!(peer.lock("tls-key").try_acquire().await.unwrap().is_none());
    guard.release().await.unwrap();
    let value = with_lock(peer.lock("tls-key"), async { Ok::<_, LockError>(7) }).await;
    assert_eq!(value.unwrap(), 7);
    drop(server);

    // The system roots do not know the test CA: refused, with a clear error.
    let server = RedisServer::start_with(&tls_only);
    let err = refused(LockRuntime::builder().redis(&url)).await;
    assert!(matches!(err, LockError::Backend(_)), "{err:?}");
    drop(server);
}

fn runtime_prefix(runtime: &LockRuntime) -> String {
    let name = runtime.backend_key("x");
    name.trim_end_matches("{x}").to_owned()
}

/// An ACL user limited to the lock keys and channels and to the commands the
/// README lists, with a password, can lock, wait and be woken; its password
/// never shows in errors or Debug.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_user_with_password_can_lock_and_wait() {
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    let prefix = "acl:";
    let () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "locker",
            "on",
            ">s3cret-pw",
            "resetkeys",
            "~acl:*",
            "resetchannels",
            "&acl:*",
            "-@all",
            "+evalsha",
            "+eval",
            "+script|load",
            "+ping",
            "+hello",
            "+subscribe",
            "+unsubscribe",
            "+client",
            "+exists",
            "+time",
            "+get",
            "+set",
            "+hset",
            "+hexists",
            "+hincrby",
            "+hget",
            "+pexpire",
            "+pttl",
            "+del",
            "+publish",
            // fair mode
            "+lindex",
            "+lpop",
            "+rpush",
            "+lrem",
            "+hdel",
            // inspect
            "+hgetall",
            "+lrange",
        ])
        .query_async(&mut admin)
        .await
        .unwrap();
    let url = format!("redis://locker:s3cret-pw@127.0.0.1:{}", server.port());
    // Runtimes of the ACL user under a key prefix.
    let locker = |prefix: &str| LockRuntime::builder().redis(&url).key_prefix(prefix);
    let (a, b) = (locker(prefix).build().await, locker(prefix).build().await);
    let (a, b) = (a.unwrap(), b.unwrap());
    let held = a.lock("k").acquire().await.unwrap();
    let info = b.inspect("k").await.unwrap().expect("held");
    assert_eq!(info.fence, Some(held.fence()));
    let request = b.lock("k").wait(Duration::from_secs(5));
    let waiter = tokio::spawn(async move { request.acquire().await.map(|g| g.fence()) });
    tokio::task::yield_now().await;
    let first = held.fence();
    held.release().await.unwrap();
    let second = waiter.await.unwrap().unwrap();
    assert!(second > first);

    // Read-write locks (plain on Redis) need no command beyond the list:
    // readers share, a downgrade and the releases go through.
    let r1 = a.lock("rw").read().acquire().await.unwrap();
    let r2 = b.lock("rw").read().acquire().await.unwrap();
    assert_eq!(
        b.inspect("rw").await.unwrap().expect("held").readers.len(),
        2
    );
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let w = a.lock("rw").write().acquire().await.unwrap();
    w.downgrade().await.unwrap().release().await.unwrap();

    // Fair mode runs with the extra commands the README lists: a queued
    // waiter is handed the lock by the release.
    let held = a.lock("f").fair(true).acquire().await.unwrap();
    let c = locker(prefix).fair(true).build().await.unwrap();
    let request = c.lock("f").wait(Duration::from_secs(5));
    let waiter = tokio::spawn(async move { request.acquire().await.map(|g| g.fence()) });
    // The fair waiter queues (as the admin sees it).
    until_queued(&mut admin, &a.backend_key("f"), 1).await;
    let first = held.fence();
    held.release().await.unwrap();
    let second = waiter.await.unwrap().unwrap();
    assert!(second > first);

    // Wrong password: a backend error that does not repeat it.
    let bad = format!("redis://locker:wrong-pw@127.0.0.1:{}", server.port());
    let err = LockRuntime::builder()
        .redis(&bad)
        .build()
        .await
        .unwrap_err();
    let shown = format!("{err} {err:?}");
    assert!(matches!(err, LockError::Backend(_)), "{shown}");
    assert!(
        !shown.contains("wrong-pw") && !shown.contains("s3cret-pw"),
        "{shown}"
    );
    // A user outside its key pattern is refused by Redis, not silently
    // ignored, and at once (`refusals_fail_at_once.rs` on every backend).
    let outside = locker("other:").build().await.unwrap();
    let err = outside.lock("k").acquire().await.unwrap_err();
    assert!(
        matches!(&err, LockError::PermissionDenied { key, .. } if key == "k"),
        "{err:?}"
    );
}

// ---------------------------------------------------------------------------
// A server gone for good
// ---------------------------------------------------------------------------

/// A runtime whose Redis is gone for good keeps answering with errors (never
/// a panic, never a hang): bounded waits end in `Timeout` at their deadline,
/// single tries and releases report the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_after_redis_is_gone_for_good_returns_errors() {
    let server = RedisServer::start();
    let runtime = impatient_runtime(&server.url()).await;
    let guard = runtime.lock("k").acquire().await.unwrap();
    drop(server);

    let start = Instant::now();
    let once = runtime.lock("other").wait(Duration::ZERO).acquire().await;
    assert!(matches!(once, Err(LockError::Backend(_))), "{once:?}");
    let request = runtime.lock("other").wait(Duration::from_millis(500));
    let bounded = request.acquire().await;
    assert!(
        matches!(bounded, Err(LockError::Timeout { .. })),
        "{bounded:?}"
    );
    assert!(runtime.ping().await.is_err());
    assert!(runtime.force_unlock("k").await.is_err());
    let released = guard.release().await;
    assert!(
        matches!(
            released,
            Err(LockError::Backend(_) | LockError::Lost { .. })
        ),
        "{released:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(runtime.stats().held, 0);
}

// ---------------------------------------------------------------------------
// Said where a user sees it, with no tracing set up
// ---------------------------------------------------------------------------

/// Runs `tests/src/bin/init_from_env.rs` (`args`) with exactly `vars` in its
/// environment and no tracing subscriber, as a service that set none up;
/// returns whether it succeeded, its stdout and its stderr.
async fn configured_process(args: &[&str], vars: &[(&str, &str)]) -> (bool, String, String) {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_init_from_env"));
    command.args(args).env_clear().envs(vars.iter().copied());
    let out = tokio::time::timeout(Duration::from_secs(30), command.output())
        .await
        .expect("the configured process ends within 30 s")
        .expect("the configured process runs");
    let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
    (out.status.success(), text(out.stdout), text(out.stderr))
}

#[tokio::test]
async fn a_debug_build_without_a_backend_says_on_stderr_once_that_it_locks_only_in_process() {
    let (ok, out, err) = configured_process(&[], &[]).await;
    assert!(ok && out.contains("locked"), "{out}{err}");
    assert_eq!(
        err.matches("using the embedded backend").count(),
        1,
        "said once, on stderr: {err}"
    );
    assert!(err.contains("exclude only tasks of this process"), "{err}");
    // Asked for on purpose, it is not a surprise: nothing is said.
    let (ok, out, err) = configured_process(&[], &[("LOCK_BACKEND", "memory")]).await;
    assert!(ok && out.contains("locked"), "{out}{err}");
    assert!(!err.contains("embedded backend"), "{err}");
}

#[tokio::test]
async fn an_unknown_lock_variable_is_named_on_stderr_with_its_likely_meaning() {
    let vars = [
        ("LOCK_REDIS_UR", "redis://127.0.0.1:1"),
        ("LOCK_PERFIX", "x:"),
    ];
    let (ok, out, err) = configured_process(&[], &vars).await;
    assert!(ok, "{out}{err}");
    assert!(
        err.contains(
            "LOCK_REDIS_UR is set, but lock-runtime does not read it: did you mean LOCK_REDIS_URL?"
        ),
        "{err}"
    );
    assert!(err.contains("did you mean LOCK_PREFIX?"), "{err}");
    assert!(err.contains("using the embedded backend"), "{err}");
    // One that looks like no known name is another program's: not said.
    let vars = [("LOCK_BACKEND", "memory"), ("LOCK_SOAK_SECS", "60")];
    let (ok, out, err) = configured_process(&[], &vars).await;
    assert!(ok, "{out}{err}");
    assert!(!err.contains("LOCK_SOAK_SECS"), "{err}");
}

#[tokio::test]
async fn lock_fair_that_is_neither_yes_nor_no_is_refused_by_the_builder_and_init_from_env() {
    for args in [&[][..], &["builder"][..]] {
        let vars = [("LOCK_BACKEND", "memory"), ("LOCK_FAIR", "maybe")];
        let (ok, out, err) = configured_process(args, &vars).await;
        assert!(!ok, "{args:?}: {out}{err}");
        assert!(out.contains("error invalid lock configuration"), "{out}");
        assert!(out.contains("LOCK_FAIR=\"maybe\""), "{out}");
        let vars = [("LOCK_BACKEND", "memory"), ("LOCK_FAIR", "Off")];
        let (ok, out, err) = configured_process(args, &vars).await;
        assert!(ok, "{args:?}: {out}{err}");
    }
}

// ---------------------------------------------------------------------------
// A server that is not what the configuration says
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_cluster_node_given_as_one_server_is_refused_at_start_naming_lock_redis_cluster() {
    let node = lock_tests::cluster().urls()[0].clone();
    let err = LockRuntime::builder()
        .redis(node)
        .build()
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, LockError::InvalidConfig(_)), "{err:?}");
    assert!(text.contains("Redis Cluster node"), "{text}");
    assert!(text.contains("LOCK_REDIS_CLUSTER"), "{text}");
    assert!(text.contains("redis_cluster"), "{text}");
}

#[tokio::test]
async fn a_port_that_does_not_speak_redis_is_named_as_such() {
    let (port, http) = not_redis().await;
    let err =
        refused(LockRuntime::builder().redis(format!("redis://:hunter2@127.0.0.1:{port}"))).await;
    http.abort();
    let text = format!("{err} {err:?}");
    assert!(matches!(err, LockError::Backend(_)), "{err:?}");
    assert!(
        text.contains(&format!(
            "the server at 127.0.0.1:{port} did not answer as Redis"
        )),
        "{text}"
    );
    assert!(!text.contains("hunter2"), "{text}");
}

/// The same for a Cluster node and a sentinel that are not Redis: the error
/// says so, naming the address, instead of the parser's `Unexpected '72'`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_node_or_sentinel_that_does_not_speak_redis_is_named_as_such() {
    let (port, http) = not_redis().await;
    let cluster =
        refused(LockRuntime::builder().redis_cluster(vec![format!("redis://127.0.0.1:{port}")]))
            .await;
    let sentinel = refused(
        LockRuntime::builder()
            .redis_sentinel(vec![format!("redis://127.0.0.1:{port}")], "mymaster"),
    )
    .await;
    http.abort();
    let text = format!("{cluster} {cluster:?}");
    assert!(
        text.contains(&format!(
            "the server at 127.0.0.1:{port} did not answer as Redis"
        )),
        "{text}"
    );
    let text = format!("{sentinel} {sentinel:?}");
    assert!(
        text.contains(&format!(
            "sentinel 127.0.0.1:{port}: it did not answer as Redis"
        )),
        "{text}"
    );
}

/// A port that answers like an HTTP server (whatever it is sent, then it
/// closes the connection), for as long as the task runs.
async fn not_redis() -> (u16, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let http = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        for _ in 0..100 {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let mut request = [0u8; 1024];
            let _ = socket.read(&mut request).await;
            let answer = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
            let _ = socket.write_all(answer).await;
        }
    });
    (port, http)
}

// ---------------------------------------------------------------------------
// Failures that name their cause
// ---------------------------------------------------------------------------

/// With the server gone, a bounded wait ends at its deadline as a timeout
/// that says the backend failed meanwhile, with its last error and when:
/// an outage must not read as a lock somebody holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_runs_out_during_an_outage_names_the_backend_failure_not_contention() {
    let server = RedisServer::start();
    let runtime = impatient_runtime(&server.url()).await;
    runtime.ping().await.unwrap();
    drop(server);
    an_outage_ends_a_wait_in_a_timeout_naming(runtime, "acquire failed on Redis at").await;
}

/// A bounded wait on `runtime`, whose servers are stopped: it ends by its
/// deadline in a timeout that names the backend's failure (`named` in its
/// last error), when it came, and no holder of this process.
async fn an_outage_ends_a_wait_in_a_timeout_naming(runtime: LockRuntime, named: &str) {
    let started = std::time::Instant::now();
    let err = runtime
        .lock("order:71")
        .wait(Duration::from_millis(1500))
        .acquire()
        .await
        .unwrap_err();
    let text = err.to_string();
    println!("{text}");
    let LockError::Timeout { cause, .. } = &err else {
        panic!("expected a timeout at the deadline: {err:?}");
    };
    let last = cause
        .backend_error()
        .expect("the backend's failure is named");
    assert!(last.contains(named), "not naming {named}: {last}");
    assert!(
        text.contains("the lock backend failed during the wait"),
        "{text}"
    );
    assert!(text.contains("ms into it"), "{text}");
    assert!(!cause.held_by_this_process(), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// The same on etcd and ZooKeeper, their only server stopped: the timeout
/// names the address the backend failed at.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_outage_ends_a_wait_in_a_timeout_naming_the_endpoints() {
    let mut cluster = lock_testkit::etcd::EtcdCluster::start(1);
    let runtime = impatient(LockRuntime::builder().etcd(cluster.endpoints())).await;
    cluster.kill(0);
    let at = cluster.endpoints().join(",");
    an_outage_ends_a_wait_in_a_timeout_naming(runtime, &at).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zookeeper_outage_ends_a_wait_in_a_timeout_naming_the_servers() {
    let mut server = lock_testkit::zookeeper::ZooKeeperServer::start();
    let runtime = impatient(LockRuntime::builder().zookeeper(server.connect_string())).await;
    let at = server.connect_string();
    server.kill();
    an_outage_ends_a_wait_in_a_timeout_naming(runtime, &at).await;
}
