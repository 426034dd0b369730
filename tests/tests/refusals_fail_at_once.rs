//! A lock the backend refuses for good — the user the runtime connects as
//! has no permission on the lock's name — fails at once with
//! `LockError::PermissionDenied` naming the key and the permission problem,
//! whatever the wait: retrying would only turn it into a `Timeout` after
//! the whole wait (30 s by default), which reads as contention.
//!
//! Each backend is set up to refuse the way an operator's mistake would:
//! Redis (one server, Cluster, Sentinel's primary, Redlock's masters) an
//! ACL user whose key patterns leave out the runtime's prefix (`NOPERM`);
//! etcd with auth enabled and a user whose role covers only part of the
//! prefix (a cluster of the test's own: auth is for every client);
//! ZooKeeper an ACL on the lock's path that lets anyone read it, nobody
//! create under it (`NoAuth`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use lock_runtime::{LockError, LockRuntime, LockRuntimeBuilder};
use lock_testkit::{EtcdCluster, RedisServer};
use lock_tests::{
    cluster, on_every_backend, redis, redlock, sentinel, unique, zookeeper, zookeeper3, Kind,
};
use zookeeper_client::{Acls, Client, CreateMode};

on_every_backend!(
    a_refused_lock_fails_at_once_naming_the_key_and_the_permission
        skip(memory = "the embedded store has no permissions to refuse"),
);

/// The key every runtime here is refused.
const KEY: &str = "refused";

/// A waiting acquire (30 s), a try-once and a locked call of a key the
/// backend refuses all end within 2 s with `PermissionDenied`, whose text
/// names the key and says it is a permission, and whose source the
/// backend marked as a refusal; nothing is left held.
async fn a_refused_lock_fails_at_once_naming_the_key_and_the_permission(kind: Kind) {
    let refusing = Refusing::set_up(kind).await;
    let runtime = refusing.runtime.clone();

    let started = Instant::now();
    let waited = runtime
        .lock(KEY)
        .wait(Duration::from_secs(30))
        .acquire()
        .await;
    let took = started.elapsed();
    eprintln!("{kind:?}: {took:?}: {waited:?}");
    assert_refused(waited.map(drop), took);

    let started = Instant::now();
    let tried = runtime.lock(KEY).try_acquire().await;
    assert_refused(tried.map(drop), started.elapsed());

    let started = Instant::now();
    let called = lock_runtime::with_lock(runtime.lock(KEY).wait(Duration::from_secs(30)), async {
        Ok::<_, LockError>(())
    })
    .await;
    assert_refused(called, started.elapsed());
    assert_eq!(runtime.stats().held, 0);
    drop(refusing);
}

/// `outcome` is the refusal of [`KEY`], in time.
fn assert_refused(outcome: Result<(), LockError>, took: Duration) {
    let error = match outcome {
        Err(error @ LockError::PermissionDenied { .. }) => error,
        other => panic!("a refused lock ended with {other:?} after {took:?}"),
    };
    assert!(took < Duration::from_secs(2), "refused after {took:?}");
    let message = error.to_string();
    assert!(message.contains(&format!("`{KEY}`")), "{message}");
    assert!(message.contains("permission"), "{message}");
    let LockError::PermissionDenied { key, source } = &error else {
        unreachable!()
    };
    assert_eq!(key, KEY);
    assert!(source.is_permission_denied(), "{source}");
}

/// A runtime that the backend refuses [`KEY`], and what must live as long
/// as it (an etcd cluster of the test's own).
struct Refusing {
    runtime: LockRuntime,
    _etcd: Option<EtcdCluster>,
}

impl Refusing {
    async fn set_up(kind: Kind) -> Refusing {
        let prefix = unique("refusal");
        // (ZooKeeper's is a path: `/<prefix>/`.)
        let names = format!("{prefix}:");
        let mut etcd = None;
        let builder = match kind {
            Kind::Memory => unreachable!("skipped"),
            Kind::Redis => {
                let user = acl_user(&[redis()]).await;
                LockRuntime::builder().redis(with_user(&redis().url(), &user))
            }
            Kind::Cluster => {
                let nodes: Vec<&RedisServer> = (0..3).map(|n| cluster().node(n)).collect();
                let user = acl_user(&nodes).await;
                let urls = cluster().urls();
                LockRuntime::builder().redis_cluster(urls.iter().map(|u| with_user(u, &user)))
            }
            Kind::Sentinel => {
                let user = acl_user(&[sentinel().first_primary()]).await;
                LockRuntime::builder()
                    .redis_sentinel(sentinel().sentinel_urls(), lock_testkit::sentinel::SERVICE)
                    .sentinel_auth(Some(user), PASSWORD)
            }
            Kind::Redlock => {
                let fleet: Vec<&RedisServer> = redlock().iter().collect();
                let user = acl_user(&fleet).await;
                let urls = fleet.iter().map(|m| with_user(&m.url(), &user));
                LockRuntime::builder().redlock(urls).fair(false)
            }
            Kind::Etcd | Kind::Etcd3 => {
                let cluster = EtcdCluster::start(if kind == Kind::Etcd { 1 } else { 3 });
                let builder = etcd_with_auth(&cluster, &names).await;
                etcd = Some(cluster);
                builder
            }
            Kind::Zookeeper | Kind::Zookeeper3 => {
                let connect = match kind {
                    Kind::Zookeeper => zookeeper().connect_string(),
                    _ => zookeeper3().connect_string(),
                };
                read_only_lock_path(&connect, &prefix).await;
                LockRuntime::builder()
                    .zookeeper(connect)
                    .key_prefix(format!("/{prefix}/"))
            }
        };
        let builder = match kind {
            Kind::Zookeeper | Kind::Zookeeper3 => builder,
            _ => builder.key_prefix(names),
        };
        Refusing {
            runtime: builder.build().await.expect("build the refused runtime"),
            _etcd: etcd,
        }
    }
}

const PASSWORD: &str = "refusal-pw";

/// A Redis ACL user on each of `servers` that may run every command and
/// use every channel, but only keys under `allowed:`: not the runtime's
/// prefix. Its name.
async fn acl_user(servers: &[&RedisServer]) -> String {
    let user = unique("refused-user");
    for server in servers {
        let mut admin = server.connection().await;
        let () = redis::cmd("ACL")
            .arg(&["SETUSER", &user, "on"])
            .arg(format!(">{PASSWORD}"))
            .arg(&["resetkeys", "~allowed:*", "resetchannels", "&*", "+@all"])
            .query_async(&mut admin)
            .await
            .unwrap();
    }
    user
}

/// `redis://user:password@host:port` from `redis://host:port`.
fn with_user(url: &str, user: &str) -> String {
    url.replacen("redis://", &format!("redis://{user}:{PASSWORD}@"), 1)
}

/// Enables etcd's auth on `cluster` with a user whose role covers the
/// runtime's ping key (`<prefix>%…`, so that it starts) and not the
/// locks' names; a builder of a runtime of that user.
async fn etcd_with_auth(cluster: &EtcdCluster, prefix: &str) -> LockRuntimeBuilder {
    let mut admin = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .unwrap();
    admin.user_add("root", "root-pw", None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.role_add("locker").await.unwrap();
    let ping = etcd_client::Permission::read_write(format!("{prefix}%")).with_prefix();
    admin.role_grant_permission("locker", ping).await.unwrap();
    admin.user_add("locker", PASSWORD, None).await.unwrap();
    admin.user_grant_role("locker", "locker").await.unwrap();
    admin.auth_enable().await.unwrap();
    LockRuntime::builder()
        .etcd(cluster.endpoints())
        .etcd_auth("locker", PASSWORD)
        .key_prefix(prefix)
}

/// Makes the lock path of [`KEY`] under `/<prefix>/` readable by anyone
/// and writable by nobody: its contenders' nodes cannot be created.
async fn read_only_lock_path(connect: &str, prefix: &str) {
    let admin = Client::connect(connect).await.unwrap();
    let open = CreateMode::Persistent.with_acls(Acls::anyone_all());
    admin
        .create(&format!("/{prefix}"), &[], &open)
        .await
        .unwrap();
    let read_only = CreateMode::Persistent.with_acls(Acls::anyone_read());
    admin
        .create(&format!("/{prefix}/{KEY}"), &[], &read_only)
        .await
        .unwrap();
}
