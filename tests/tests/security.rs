//! Security: TLS, ACL users, secrets kept out of messages, and intruders that
//! cannot release or renew a lock they do not hold.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use lock_runtime::{with_lock, LockError, LockRuntime};
use lock_testkit::{free_port, RedisServer};
use lock_tests::{redis, unique};
use redis::AsyncCommands;

/// A throw-away CA and a server certificate for 127.0.0.1/localhost, made
/// with the `openssl` command line.
struct TestPki {
    dir: PathBuf,
}

impl TestPki {
    fn new() -> TestPki {
        let dir = std::env::temp_dir().join(unique("lock-tls"));
        std::fs::create_dir_all(&dir).unwrap();
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .output()
                .expect("openssl not found: install it with `apt-get install -y openssl`");
            assert!(out.status.success(), "openssl {args:?}: {out:?}");
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca = vec!["req", "-x509"];
        ca.extend(ec);
        ca.extend([
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=lock-test-ca",
        ]);
        run(&ca);
        let mut csr = vec!["req"];
        csr.extend(ec);
        csr.extend([
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ]);
        run(&csr);
        std::fs::write(
            dir.join("ext.cnf"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        run(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ]);
        TestPki { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }

    fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(Path::new(&self.path(name))).unwrap()
    }
}

impl Drop for TestPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Locks work over `rediss://` against a TLS-only listener, trusting a
/// private CA; without that CA the handshake is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_connection_locks_and_rejects_an_unknown_ca() {
    let pki = TestPki::new();
    let tls_port = free_port().to_string();
    let (cert, key, ca) = (
        pki.path("server.crt"),
        pki.path("server.key"),
        pki.path("ca.crt"),
    );
    let server = RedisServer::start_with(&[
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
    ]);
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
    let server = RedisServer::start_with(&[
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
    ]);
    let err = LockRuntime::builder()
        .redis(&url)
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap_err();
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
    let a = LockRuntime::builder()
        .redis(&url)
        .key_prefix(prefix)
        .build()
        .await
        .unwrap();
    let b = LockRuntime::builder()
        .redis(&url)
        .key_prefix(prefix)
        .build()
        .await
        .unwrap();
    let held = a.lock("k").acquire().await.unwrap();
    let info = b.inspect("k").await.unwrap().expect("held");
    assert_eq!(info.fence, Some(held.fence()));
    let waiter = tokio::spawn(async move {
        b.lock("k")
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .map(|g| g.fence())
    });
    tokio::task::yield_now().await;
    let first = held.fence();
    held.release().await.unwrap();
    let second = waiter.await.unwrap().unwrap();
    assert!(second > first);

    // Fair mode runs with the extra commands the README lists: a queued
    // waiter is handed the lock by the release.
    let held = a.lock("f").fair(true).acquire().await.unwrap();
    let c = LockRuntime::builder()
        .redis(&url)
        .key_prefix(prefix)
        .fair(true)
        .build()
        .await
        .unwrap();
    let waiter = tokio::spawn(async move {
        c.lock("f")
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .map(|g| g.fence())
    });
    let queue = format!("{}:queue", a.backend_key("f"));
    let mut queued = 0;
    for _ in 0..400 {
        queued = redis::cmd("LLEN")
            .arg(&queue)
            .query_async(&mut admin)
            .await
            .unwrap();
        if queued == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(queued, 1, "the fair waiter did not queue");
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
    // A user outside its key pattern is refused by Redis, not silently ignored.
    let outside = LockRuntime::builder()
        .redis(&url)
        .key_prefix("other:")
        .build()
        .await
        .unwrap();
    let err = outside.lock("k").acquire().await.unwrap_err();
    assert!(matches!(err, LockError::Backend(_)), "{err:?}");
}

/// A client that knows the key but not the holder id cannot release or renew
/// the lock through the scripts, nor take it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn intruder_cannot_release_or_renew_a_lock_it_does_not_hold() {
    let server = redis();
    let runtime = LockRuntime::builder()
        .redis(server.url())
        .key_prefix(unique("intr"))
        .build()
        .await
        .unwrap();
    let guard = runtime
        .lock("vault")
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    let hash = runtime.backend_key("vault");
    let mut intruder = server.connection().await;
    let mut holders: Vec<String> = intruder.hkeys(&hash).await.unwrap();
    // Beside the holder, the hash keeps the hold's fencing token.
    holders.retain(|field| field != "fence");
    assert_eq!(holders.len(), 1);
    let (process, n) = holders[0].rsplit_once(':').unwrap();
    assert_eq!(
        process.len(),
        32,
        "holder ids carry a 128-bit random process id"
    );
    assert!(n.parse::<u64>().is_ok());

    let release = redis::Script::new(include_str!("../../lock-runtime/src/scripts/release.lua"));
    let renew = redis::Script::new(include_str!("../../lock-runtime/src/scripts/renew.lua"));
    let acquire = redis::Script::new(include_str!("../../lock-runtime/src/scripts/acquire.lua"));
    for guess in [
        "intruder",
        "0:1",
        &format!("{process}:{}", n.parse::<u64>().unwrap() + 1),
    ] {
        let released: i64 = release
            .key(&hash)
            .arg(guess)
            .arg(format!("{hash}:released"))
            .invoke_async(&mut intruder)
            .await
            .unwrap();
        assert_eq!(released, -1, "release by {guess} was accepted");
        let renewed: i64 = renew
            .key(&hash)
            .arg(guess)
            .arg(60_000)
            .invoke_async(&mut intruder)
            .await
            .unwrap();
        assert_eq!(renewed, 0, "renewal by {guess} was accepted");
        let reply: Vec<i64> = acquire
            .key(&hash)
            .key(format!("{hash}:fence"))
            .arg(guess)
            .arg(60_000)
            .arg(60_000)
            .invoke_async(&mut intruder)
            .await
            .unwrap();
        assert_eq!(reply[0], 0, "acquire by {guess} was granted");
    }
    // The intruder's renewal did not stretch the lease beyond ours.
    let ttl: i64 = intruder.pttl(&hash).await.unwrap();
    assert!(ttl <= 5_000, "lease stretched to {ttl} ms");
    assert!(!guard.is_lost());
    guard.release().await.unwrap();
}

/// Keys with braces, newlines, colons and non-ASCII text are distinct locks
/// that never touch each other's fence counters or channels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awkward_keys_are_distinct_locks() {
    let server = redis();
    let runtime = LockRuntime::builder()
        .redis(server.url())
        .key_prefix(unique("odd"))
        .build()
        .await
        .unwrap();
    let keys = [
        "x".to_owned(),
        "x}:fence".to_owned(),
        "x}:released".to_owned(),
        "}x".to_owned(),
        "{x}".to_owned(),
        "line\nbreak".to_owned(),
        "ключ:🔒".to_owned(),
        "k".repeat(lock_runtime::MAX_KEY_LEN),
    ];
    let mut guards = Vec::new();
    for key in &keys {
        let guard = runtime
            .lock(key.as_str())
            .wait(Duration::ZERO)
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("{key:?}: {e}"));
        guards.push(guard);
    }
    for key in &keys {
        assert!(runtime
            .lock(key.as_str())
            .try_acquire()
            .await
            .unwrap()
            .is_none());
    }
    for guard in guards {
        guard.release().await.unwrap();
    }
    assert_eq!(runtime.stats().held, 0);
}
