//! `lockctl` on every topology the runtime supports, configured from the
//! variables the runtime's `init_from_env` reads: a Redis Cluster (every
//! master listed, `show` and `release` following `MOVED` from one seed
//! node), Sentinel (the current primary) and Redlock (the quorum view and
//! each master's), against the servers lock-testkit starts. A server that
//! does not answer makes a partial answer, exit 3, never 0. With the
//! features `etcd` and `zookeeper`, etcd and ZooKeeper too (`queued_stores`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{code, held, run_env, stderr, stdout, taken, Watching};
use common::{force_release, this_process, until_published};
use common::{FOUND, PARTIAL};
use lock_runtime::{layout, LockRuntime};
use lock_testkit::{RedisCluster, RedisServer};
use lock_tests::{cluster, redlock, sentinel, unique, Kind};
use serde_json::Value;

/// The keys `list --json` printed.
fn listed(output: &std::process::Output) -> Vec<String> {
    let value: Value = serde_json::from_str(&stdout(output)).unwrap();
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["key"].as_str().unwrap().to_owned())
        .collect()
}

/// A key under `prefix` whose lock lives on each master of `cluster`, in
/// master order.
fn one_key_per_master(cluster: &RedisCluster, prefix: &str, masters: usize) -> Vec<String> {
    let mut keys: Vec<Option<String>> = vec![None; masters];
    for n in 0..1000 {
        let key = format!("job:{n}");
        let owner = cluster.owner_of(cluster.slot_of(&layout::lock_name(prefix, &key)));
        keys[owner].get_or_insert(key);
        if keys.iter().all(Option::is_some) {
            break;
        }
    }
    keys.into_iter()
        .map(|k| k.expect("a key per master"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_list_covers_every_master_and_show_and_release_follow_moved() {
    let prefix = unique("ctl-cluster");
    let holder = Kind::Cluster.runtime(&prefix).await;
    let keys = one_key_per_master(cluster(), &prefix, 3);
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(holder.lock(key).acquire().await.unwrap());
    }
    // Only the first node is given: the others are learnt from it.
    let seed = cluster().node(0).url();
    let env = [
        ("LOCK_REDIS_CLUSTER", seed.as_str()),
        ("LOCK_PREFIX", prefix.as_str()),
    ];

    let list = run_env(&["list", "--json"], &env, "").await;
    assert_eq!(code(&list), FOUND, "{}", stderr(&list));
    let mut expected = keys.clone();
    expected.sort();
    assert_eq!(listed(&list), expected);

    // Node 0 answers MOVED for a key of master 2; the runtime follows it.
    let far = &keys[2];
    let info = holder.inspect(far).await.unwrap().unwrap();
    until_published(&holder, &info.holder).await;
    let show = run_env(&["show", far], &env, "").await;
    assert_eq!(code(&show), FOUND, "{}", stderr(&show));
    let out = stdout(&show);
    assert!(
        out.contains(&format!("  holder      {}\n", info.holder)),
        "{out}"
    );
    assert!(out.contains(&this_process()), "{out}");

    force_release(&holder, &keys[1], &env).await;
    for (n, guard) in guards.into_iter().enumerate() {
        if n != 1 {
            guard.release().await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_with_a_master_not_answering_is_a_partial_answer_naming_it() {
    let cluster = RedisCluster::start(3);
    let prefix = unique("ctl-cluster-down");
    let holder = LockRuntime::builder()
        .redis_cluster(cluster.urls())
        .key_prefix(prefix.clone())
        .build()
        .await
        .unwrap();
    let keys = one_key_per_master(&cluster, &prefix, 3);
    let guard = holder.lock(&keys[0]).acquire().await.unwrap();
    cluster.node(2).freeze();
    let seed = cluster.node(0).url();
    let env = [
        ("LOCK_REDIS_CLUSTER", seed.as_str()),
        ("LOCK_PREFIX", prefix.as_str()),
    ];
    let list = run_env(&["list", "--json"], &env, "").await;
    cluster.node(2).thaw();
    assert_eq!(code(&list), PARTIAL, "{}", stderr(&list));
    assert!(
        stderr(&list).contains(&format!(":{}", cluster.node(2).port())),
        "{}",
        stderr(&list)
    );
    // Nothing invented. (What the healthy masters hold may be missing too:
    // a Cluster runtime built while a master is frozen times out on every
    // key, a limit of the runtime's Cluster connection, not of lockctl;
    // each such key is named on stderr.)
    let shown = listed(&list);
    assert!(shown.iter().all(|k| k == &keys[0]), "{shown:?}");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_watch_hears_the_release_on_the_node_that_owns_the_key() {
    let prefix = unique("ctl-cluster-watch");
    let holder = Kind::Cluster.runtime(&prefix).await;
    let keys = one_key_per_master(cluster(), &prefix, 3);
    let guard = holder.lock(&keys[2]).acquire().await.unwrap();
    let seed = cluster().node(0).url();
    let env = [
        ("LOCK_REDIS_CLUSTER", seed.as_str()),
        ("LOCK_PREFIX", prefix.as_str()),
    ];
    // A long interval: the release is printed because it was heard.
    let args = ["watch", &keys[2], "--count", "1", "--interval", "60s"];
    let mut watching = Watching::start(&args, &env);
    watching.next_with(&[": held by "]).await;
    watching.release_seen(guard, &keys[2], "").await;
    watching.exits_with(FOUND).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_list_show_and_release_work_on_the_current_primary() {
    let prefix = unique("ctl-sentinel");
    let holder = Kind::Sentinel.runtime(&prefix).await;
    let guard = holder.lock("order:1").acquire().await.unwrap();
    let info = holder.inspect("order:1").await.unwrap().unwrap();
    let sentinels = sentinel().sentinel_urls().join(",");
    let env = [
        ("REDIS_SENTINELS", sentinels.as_str()),
        ("REDIS_SENTINEL_SERVICE", lock_testkit::sentinel::SERVICE),
        ("LOCK_PREFIX", prefix.as_str()),
    ];

    let list = run_env(&["list", "--json"], &env, "").await;
    assert_eq!(code(&list), FOUND, "{}", stderr(&list));
    assert_eq!(listed(&list), ["order:1"]);
    until_published(&holder, &info.holder).await;
    let show = run_env(&["show", "order:1"], &env, "").await;
    assert_eq!(code(&show), FOUND, "{}", stderr(&show));
    assert!(stdout(&show).contains(&info.holder), "{}", stdout(&show));
    assert!(stdout(&show).contains(&this_process()), "{}", stdout(&show));
    force_release(&holder, "order:1", &env).await;
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_show_gives_the_quorum_view_and_every_masters_record() {
    let prefix = unique("ctl-redlock");
    let holder = Kind::Redlock.runtime(&prefix).await;
    let guard = held(&holder, "order:9", 30).await;
    let info = holder.inspect("order:9").await.unwrap().unwrap();
    let masters: Vec<String> = redlock().iter().map(RedisServer::url).collect();
    let masters = masters.join(",");
    let env = [
        ("REDLOCK_URLS", masters.as_str()),
        ("LOCK_PREFIX", prefix.as_str()),
    ];

    until_published(&holder, &info.holder).await;
    let show = run_env(&["show", "order:9"], &env, "").await;
    assert_eq!(code(&show), FOUND, "{}", stderr(&show));
    let out = stdout(&show);
    assert!(out.starts_with("order:9: held\n"), "{out}");
    assert!(out.contains(&this_process()), "{out}");
    assert!(
        out.contains("  quorum      held on 3 of 3 masters (2 needed)"),
        "{out}"
    );
    for master in redlock() {
        assert!(
            out.contains(&format!(
                "127.0.0.1:{}  held by {}",
                master.port(),
                info.holder
            )),
            "{out}"
        );
    }
    let json = run_env(&["show", "order:9", "--json"], &env, "").await;
    let value: Value = serde_json::from_str(&stdout(&json)).unwrap();
    assert_eq!(value["holder"], info.holder.as_str());
    let each = value["masters"].as_array().unwrap();
    assert_eq!(each.len(), 3);
    assert!(each.iter().all(|m| m["held"] == true), "{value}");
    assert_eq!(
        (&value["masters_holding"], &value["quorum"]),
        (&3.into(), &2.into())
    );

    let list = run_env(&["list", "--json"], &env, "").await;
    assert_eq!(code(&list), FOUND, "{}", stderr(&list));
    let value: Value = serde_json::from_str(&stdout(&list)).unwrap();
    assert_eq!(value[0]["key"], "order:9");
    assert_eq!(value[0]["masters_holding"], 3);

    force_release(&holder, "order:9", &env).await;
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_with_a_master_down_answers_with_the_quorum_and_exits_partial() {
    let mut fleet: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = fleet.iter().map(RedisServer::url).collect();
    let prefix = unique("ctl-redlock-down");
    let holder = LockRuntime::builder()
        .redlock(urls.clone())
        .fair(false)
        .key_prefix(prefix.clone())
        .build()
        .await
        .unwrap();
    let guard = holder.lock("order:5").acquire().await.unwrap();
    let down = fleet[2].port();
    fleet[2].kill();
    let masters = urls.join(",");
    let env = [
        ("REDLOCK_URLS", masters.as_str()),
        ("LOCK_PREFIX", prefix.as_str()),
    ];

    let show = run_env(&["show", "order:5"], &env, "").await;
    assert_eq!(code(&show), PARTIAL, "{}", stderr(&show));
    let out = stdout(&show);
    assert!(out.starts_with("order:5: held\n"), "{out}");
    assert!(out.contains("held on 2 of 3 masters (2 needed)"), "{out}");
    assert!(
        out.contains(&format!("127.0.0.1:{down}  unreachable")),
        "{out}"
    );
    assert!(
        stderr(&show).contains(&format!("{down}")),
        "{}",
        stderr(&show)
    );

    let list = run_env(&["list", "--json"], &env, "").await;
    assert_eq!(code(&list), PARTIAL, "{}", stderr(&list));
    assert_eq!(listed(&list), ["order:5"]);
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_watch_prints_one_release_though_every_master_announces_it() {
    let prefix = unique("ctl-redlock-watch");
    let holder = Kind::Redlock.runtime(&prefix).await;
    let (first, first_holder) = taken(&holder, "k").await;
    let masters: Vec<String> = redlock().iter().map(RedisServer::url).collect();
    let masters = masters.join(",");
    let env = [
        ("REDLOCK_URLS", masters.as_str()),
        ("LOCK_PREFIX", prefix.as_str()),
    ];
    let args = ["watch", "k", "--count", "2", "--for", "20s"];
    let mut watching = Watching::start(&args, &env);
    watching
        .next_with(&[&format!("k: held by {first_holder}")])
        .await;
    watching.release_seen(first, "k", &first_holder).await;
    // Three masters announced that release: the next line is the next
    // holder, not a release "by a holder not seen".
    let (second, second_holder) = taken(&holder, "k").await;
    // (Not its token: `watch` shows the token of the master whose
    // announcement came first, and a Redlock token is the majority's.)
    watching
        .next_with(&[&format!("k: acquired by {second_holder}")])
        .await;
    watching.exits_with(FOUND).await;
    second.release().await.unwrap();
}

/// etcd and ZooKeeper (lockctl's features `etcd` and `zookeeper`): the same
/// commands, read from `LOCK_ETCD_ENDPOINTS` and `LOCK_ZOOKEEPER`, on the
/// servers lock-testkit starts. Each behaviour is written once and run on
/// both stores.
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
mod queued_stores {
    use std::time::Duration;

    use super::common::{code, run_env, stderr, stdout, taken, Watching};
    use super::common::{ERROR, FOUND, RUN_LIMIT};
    use super::listed;
    use lock_runtime::LockRuntime;
    use lock_tests::{unique, Kind};
    use serde_json::Value;

    /// A store whose recipe queues every contender under the lock's name.
    #[derive(Clone, Copy, Debug)]
    pub(super) enum Store {
        #[cfg(feature = "etcd")]
        Etcd,
        #[cfg(feature = "zookeeper")]
        Zookeeper,
    }

    impl Store {
        fn kind(self) -> Kind {
            match self {
                #[cfg(feature = "etcd")]
                Store::Etcd => Kind::Etcd,
                #[cfg(feature = "zookeeper")]
                Store::Zookeeper => Kind::Zookeeper,
            }
        }

        /// The variables of `init_from_env` that name the test's servers
        /// and the prefix of its runtimes (on ZooKeeper a path:
        /// `Kind::builder` makes `/<prefix>/` of it).
        fn env(self, prefix: &str) -> Vec<(&'static str, String)> {
            match self {
                #[cfg(feature = "etcd")]
                Store::Etcd => vec![
                    (
                        "LOCK_ETCD_ENDPOINTS",
                        lock_tests::etcd().endpoints().join(","),
                    ),
                    ("LOCK_PREFIX", prefix.to_owned()),
                ],
                #[cfg(feature = "zookeeper")]
                Store::Zookeeper => vec![
                    ("LOCK_ZOOKEEPER", lock_tests::zookeeper().connect_string()),
                    ("LOCK_PREFIX", format!("/{prefix}/")),
                ],
            }
        }

        /// The variables naming a server that is not there (a port just
        /// freed), with credentials that must not be printed.
        fn dead_env(self, port: u16) -> Vec<(&'static str, String)> {
            let address = format!("127.0.0.1:{port}");
            match self {
                #[cfg(feature = "etcd")]
                Store::Etcd => vec![
                    ("LOCK_ETCD_ENDPOINTS", address),
                    ("LOCK_ETCD_USER", "app".to_owned()),
                    ("LOCK_ETCD_PASSWORD", "hunter2-etcd".to_owned()),
                ],
                #[cfg(feature = "zookeeper")]
                Store::Zookeeper => vec![
                    ("LOCK_ZOOKEEPER", address),
                    ("LOCK_ZOOKEEPER_USER", "app".to_owned()),
                    ("LOCK_ZOOKEEPER_PASSWORD", "hunter2-zk".to_owned()),
                ],
            }
        }

        /// How lockctl names these servers in an error.
        fn named(self) -> &'static str {
            match self {
                #[cfg(feature = "etcd")]
                Store::Etcd => "cannot reach etcd",
                #[cfg(feature = "zookeeper")]
                Store::Zookeeper => "cannot reach ZooKeeper",
            }
        }
    }

    fn pairs<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
        env.iter().map(|(k, v)| (*k, v.as_str())).collect()
    }

    /// Waits until `runtime` sees `want` contenders queued behind the
    /// holder of `key` (a waiter's place is put by a task of its own: no
    /// event says when it landed; at most 200 looks in 10 s).
    async fn until_queued(runtime: &LockRuntime, key: &str, want: usize) {
        for _ in 0..200 {
            let info = runtime.inspect(key).await.unwrap();
            if info.is_some_and(|i| i.queue.len() == want) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{want} waiters were not queued for {key} within 10 s");
    }

    /// A lock held by readers only is listed by its name (a reader's key
    /// is `<name>/read/<holder>` on etcd).
    #[cfg(feature = "etcd")]
    pub(super) async fn list_names_a_lock_held_by_readers_only(store: Store) {
        let prefix = unique("ctl-readers");
        let runtime = store.kind().runtime(&prefix).await;
        let read = runtime.lock("cfg:7").read().acquire().await.unwrap();
        let env = store.env(&prefix);
        let list = run_env(&["list", "--json"], &pairs(&env), "").await;
        assert_eq!(code(&list), FOUND, "{}", stderr(&list));
        assert_eq!(listed(&list), ["cfg:7"]);
        read.release().await.unwrap();
    }

    pub(super) async fn list_and_show_name_holder_and_waiter_and_release_hands_it_on(store: Store) {
        let prefix = unique("ctl-queued");
        let holder = store.kind().runtime(&prefix).await;
        let waiter = store.kind().runtime(&prefix).await;
        let guard = holder.lock("order:1").acquire().await.unwrap();
        // A key with a `/`: etcd escapes it in the name, ZooKeeper nests it.
        let nested = holder.lock("batch/7").acquire().await.unwrap();
        let waiting = tokio::spawn({
            let waiter = waiter.clone();
            async move {
                waiter
                    .lock("order:1")
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await
            }
        });
        until_queued(&holder, "order:1", 1).await;
        let info = holder.inspect("order:1").await.unwrap().unwrap();
        let queued = info.queue[0].clone();
        let env = store.env(&prefix);
        let env = pairs(&env);

        let list = run_env(&["list", "--json"], &env, "").await;
        assert_eq!(code(&list), FOUND, "{}", stderr(&list));
        assert_eq!(listed(&list), ["batch/7", "order:1"]);
        let value: Value = serde_json::from_str(&stdout(&list)).unwrap();
        assert_eq!(value[1]["holder"], info.holder.as_str());
        assert_eq!(value[1]["queue"], serde_json::json!([queued]));
        assert_eq!(value[1]["fence"], guard.fence());

        let show = run_env(&["show", "order:1"], &env, "").await;
        assert_eq!(code(&show), FOUND, "{}", stderr(&show));
        let out = stdout(&show);
        assert!(out.starts_with("order:1: held\n"), "{out}");
        assert!(
            out.contains(&format!("  holder      {}\n", info.holder)),
            "{out}"
        );
        assert!(
            out.contains(&format!("  fence       {}\n", guard.fence())),
            "{out}"
        );
        assert!(
            out.contains(&format!("  queue       1 waiting\n    1. {queued}")),
            "{out}"
        );

        let release = run_env(&["release", "order:1", "--force", "--yes"], &env, "").await;
        assert_eq!(code(&release), FOUND, "{}", stderr(&release));
        let out = stdout(&release);
        assert!(
            out.contains(&format!("order:1: released (was held by {}", info.holder)),
            "{out}"
        );
        // The waiter was next in the queue: it holds the lock now.
        let handed = tokio::time::timeout(RUN_LIMIT, waiting)
            .await
            .expect("the waiter took the lock in time")
            .unwrap()
            .unwrap();
        let now = holder.inspect("order:1").await.unwrap().unwrap();
        assert_eq!(now.holder, queued);
        assert!(handed.fence() > guard.fence());
        let show = run_env(&["show", "order:1", "--json"], &env, "").await;
        let value: Value = serde_json::from_str(&stdout(&show)).unwrap();
        assert_eq!(value["holder"], queued.as_str());
        handed.release().await.unwrap();
        nested.release().await.unwrap();
        drop(guard);
    }

    pub(super) async fn watch_hears_a_release_and_the_next_holder(store: Store) {
        let prefix = unique("ctl-queued-watch");
        let holder = store.kind().runtime(&prefix).await;
        let (first, first_holder) = taken(&holder, "k").await;
        let env = store.env(&prefix);
        let env = pairs(&env);
        // A long interval: what is printed was heard from the watch.
        let args = ["watch", "k", "--count", "2", "--interval", "60s"];
        let mut watching = Watching::start(&args, &env);
        let fence = first.fence();
        watching
            .next_with(&[&format!("k: held by {first_holder} (fence {fence}")])
            .await;
        watching.release_seen(first, "k", &first_holder).await;
        let (second, second_holder) = taken(&holder, "k").await;
        let fence = second.fence();
        watching
            .next_with(&[&format!("k: acquired by {second_holder} (fence {fence})")])
            .await;
        watching.exits_with(FOUND).await;
        second.release().await.unwrap();
    }

    pub(super) async fn a_dead_server_is_an_error_naming_it_without_the_password(store: Store) {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let env = store.dead_env(port);
        let env = pairs(&env);
        for args in [
            &["show", "k"][..],
            &["list"],
            &["release", "k", "--force", "--yes"],
        ] {
            let output = run_env(args, &env, "").await;
            let err = stderr(&output);
            assert_eq!(code(&output), ERROR, "{args:?}: {err}");
            assert!(err.contains(store.named()), "{args:?}: {err}");
            assert!(
                err.contains(&format!("127.0.0.1:{port}")),
                "{args:?}: {err}"
            );
            assert!(!err.contains("hunter2"), "{args:?}: {err}");
            assert!(stdout(&output).is_empty(), "{args:?}: {}", stdout(&output));
        }
    }
}

/// The behaviours of `queued_stores` named, each a test on `$store` in the
/// module `$tests` (behind the store's feature; the module's name keeps the
/// `etcd_` and `zookeeper_` prefixes by which CI picks these tests).
macro_rules! on_queued_store {
    ($tests:ident, $feature:literal, $store:ident: $($behaviour:ident),+ $(,)?) => {
        #[cfg(feature = $feature)]
        mod $tests {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    use super::queued_stores::{$behaviour, Store};
                    $behaviour(Store::$store).await;
                }
            )+
        }
    };
}

on_queued_store!(etcd_store, "etcd", Etcd:
    list_and_show_name_holder_and_waiter_and_release_hands_it_on,
    list_names_a_lock_held_by_readers_only,
    watch_hears_a_release_and_the_next_holder,
    a_dead_server_is_an_error_naming_it_without_the_password,
);

on_queued_store!(zookeeper_store, "zookeeper", Zookeeper:
    list_and_show_name_holder_and_waiter_and_release_hands_it_on,
    watch_hears_a_release_and_the_next_holder,
    a_dead_server_is_an_error_naming_it_without_the_password,
);
