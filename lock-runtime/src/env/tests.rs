#![allow(clippy::unwrap_used)]

use super::*;
use std::time::Duration;

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: std::collections::HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    move |name| map.get(name).cloned()
}

fn backend(builder: &LockRuntimeBuilder) -> &'static str {
    match builder.choice {
        Choice::Memory => "memory",
        Choice::Redis(_) => "redis",
        Choice::RedisCluster(_) => "cluster",
        Choice::Redlock(_) => "redlock",
        Choice::Sentinel(..) => "sentinel",
        Choice::Etcd(_) => "etcd",
        Choice::Zookeeper(_) => "zookeeper",
    }
}

fn error(result: Result<LockRuntimeBuilder, LockError>) -> String {
    match result {
        Err(LockError::InvalidConfig(message)) => message,
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
}

#[test]
fn a_release_build_with_no_backend_configured_fails_closed() {
    let message = error(builder_from_env(env(&[]), false));
    assert!(message.contains("REDIS_URL"), "{message}");
    assert!(message.contains("LOCK_BACKEND=memory"), "{message}");
    // Empty values count as unset.
    let message = error(builder_from_env(env(&[("REDIS_URL", " ")]), false));
    assert!(message.contains("REDIS_URL"), "{message}");
}

#[test]
fn the_embedded_backend_is_used_when_asked_or_in_debug_builds() {
    let asked = builder_from_env(env(&[("LOCK_BACKEND", "memory")]), false).unwrap();
    assert_eq!(backend(&asked), "memory");
    let debug = builder_from_env(env(&[]), true).unwrap();
    assert_eq!(backend(&debug), "memory");
}

#[test]
fn a_url_selects_redis_and_conflicts_are_errors() {
    for (debug, pairs) in [
        (false, &[("REDIS_URL", "redis://h:1")][..]),
        (false, &[("LOCK_REDIS_URL", "redis://h:1")][..]),
        (
            true,
            &[("LOCK_BACKEND", "Redis"), ("REDIS_URL", "redis://h:1")][..],
        ),
    ] {
        assert_eq!(
            backend(&builder_from_env(env(pairs), debug).unwrap()),
            "redis"
        );
    }
    let both = &[("LOCK_BACKEND", "memory"), ("REDIS_URL", "redis://h:1")];
    assert!(error(builder_from_env(env(both), true)).contains("unset one"));
    let no_url = error(builder_from_env(env(&[("LOCK_BACKEND", "redis")]), true));
    assert!(no_url.contains("REDIS_URL"), "{no_url}");
    let typo = error(builder_from_env(env(&[("LOCK_BACKEND", "memroy")]), true));
    assert!(typo.contains("zookeeper or memory"), "{typo}");
}

#[test]
fn lock_zookeeper_selects_zookeeper_alone_with_both_auth_variables_or_none() {
    let connect = "zk1:2181,zk2:2181/app";
    let builder = builder_from_env(env(&[("LOCK_ZOOKEEPER", connect)]), false).unwrap();
    assert!(matches!(&builder.choice, Choice::Zookeeper(c) if c == connect));
    assert!(builder.zookeeper_auth.is_none());
    let auth = [
        ("LOCK_ZOOKEEPER", connect),
        ("LOCK_ZOOKEEPER_USER", "app"),
        ("LOCK_ZOOKEEPER_PASSWORD", "secret"),
    ];
    let builder = builder_from_env(env(&auth), false).unwrap();
    assert_eq!(
        builder.zookeeper_auth,
        Some(("app".to_owned(), "secret".to_owned()))
    );
    let half = [("LOCK_ZOOKEEPER", connect), ("LOCK_ZOOKEEPER_USER", "app")];
    assert!(error(builder_from_env(env(&half), false)).contains("or neither"));
    let both = [("LOCK_ZOOKEEPER", connect), ("REDIS_URL", "redis://h:1")];
    assert!(error(builder_from_env(env(&both), false)).contains("unset one"));
    let etcd_too = [("LOCK_ZOOKEEPER", connect), ("LOCK_BACKEND", "etcd")];
    assert!(error(builder_from_env(env(&etcd_too), false)).contains("unset one"));
    let none = error(builder_from_env(
        env(&[("LOCK_BACKEND", "zookeeper")]),
        false,
    ));
    assert!(none.contains("LOCK_ZOOKEEPER"), "{none}");
}

#[test]
fn lock_redis_cluster_selects_a_cluster_of_the_listed_nodes() {
    let nodes = "redis://n1:7000, redis://n2:7000,redis://n3:7000";
    let builder = builder_from_env(env(&[("LOCK_REDIS_CLUSTER", nodes)]), false).unwrap();
    match &builder.choice {
        Choice::RedisCluster(urls) => assert_eq!(
            urls,
            &["redis://n1:7000", "redis://n2:7000", "redis://n3:7000"]
        ),
        _ => panic!("expected a cluster, got {}", backend(&builder)),
    }
    let both = env(&[("LOCK_REDIS_CLUSTER", nodes), ("REDIS_URL", "redis://x:1")]);
    assert!(error(builder_from_env(both, false)).contains("both set"));
    let memory = env(&[("LOCK_REDIS_CLUSTER", nodes), ("LOCK_BACKEND", "memory")]);
    assert!(error(builder_from_env(memory, true)).contains("LOCK_REDIS_CLUSTER"));
}

#[test]
fn redlock_urls_select_redlock_and_conflicts_are_errors() {
    let three = "redis://a:1, redis://b:2,redis://c:3";
    for pairs in [
        &[("REDLOCK_URLS", three)][..],
        &[("LOCK_REDLOCK_URLS", three)][..],
        &[("LOCK_BACKEND", "redlock"), ("REDLOCK_URLS", three)][..],
        &[
            ("LOCK_BACKEND", "redlock"),
            ("REDLOCK_URLS", three),
            ("REDIS_URL", "redis://h:1"),
        ][..],
    ] {
        let builder = builder_from_env(env(pairs), false).unwrap();
        match &builder.choice {
            Choice::Redlock(urls) => {
                assert_eq!(urls, &["redis://a:1", "redis://b:2", "redis://c:3"]);
            }
            _ => panic!("{pairs:?} should select redlock"),
        }
    }
    // LOCK_BACKEND=redis picks the single server even with masters set.
    let pairs = [
        ("LOCK_BACKEND", "redis"),
        ("REDLOCK_URLS", three),
        ("REDIS_URL", "redis://h:1"),
    ];
    assert_eq!(
        backend(&builder_from_env(env(&pairs), false).unwrap()),
        "redis"
    );
    let both = [("REDLOCK_URLS", three), ("REDIS_URL", "redis://h:1")];
    assert!(error(builder_from_env(env(&both), false)).contains("choose with LOCK_BACKEND"));
    let none = error(builder_from_env(env(&[("LOCK_BACKEND", "redlock")]), true));
    assert!(none.contains("REDLOCK_URLS"), "{none}");
    let memory = [("LOCK_BACKEND", "memory"), ("REDLOCK_URLS", three)];
    assert!(error(builder_from_env(env(&memory), true)).contains("unset one"));
}

#[tokio::test]
async fn redlock_refuses_fewer_than_three_masters_and_fair_mode() {
    let two = LockRuntime::builder()
        .redlock(["redis://a:1", "redis://b:2"])
        .fair(false)
        .build()
        .await;
    assert!(matches!(&two, Err(LockError::InvalidConfig(m)) if m.contains("at least 3")));
    let fair = LockRuntime::builder()
        .redlock(["redis://a:1", "redis://b:2", "redis://c:3"])
        .fair(true)
        .build()
        .await;
    assert!(matches!(&fair, Err(LockError::InvalidConfig(m)) if m.contains("fair mode")));
}

#[test]
fn redis_sentinels_select_the_sentinel_backend() {
    let pairs = [
        ("REDIS_SENTINELS", "s1:26379, s2:26379"),
        ("REDIS_SENTINEL_SERVICE", "mymaster"),
        ("REDIS_PASSWORD", "secret"),
        ("REDIS_DB", "2"),
        ("LOCK_SYNC_REPLICAS", "1"),
    ];
    let builder = builder_from_env(env(&pairs), false).unwrap();
    match &builder.choice {
        Choice::Sentinel(sentinels, service) => {
            assert_eq!(sentinels, &["s1:26379", "s2:26379"]);
            assert_eq!(service, "mymaster");
        }
        _ => panic!("expected the sentinel backend"),
    }
    assert_eq!(builder.node_auth.password.as_deref(), Some("secret"));
    assert_eq!(builder.node_auth.db, 2);
    assert_eq!(
        builder.sync_replicas,
        Some((1, std::time::Duration::from_millis(100)))
    );
    assert!(!format!("{builder:?}").contains("secret"));
    let no_service = error(builder_from_env(env(&pairs[..1]), false));
    assert!(
        no_service.contains("REDIS_SENTINEL_SERVICE"),
        "{no_service}"
    );
    let both = [pairs[0], pairs[1], ("REDIS_URL", "redis://h:1")];
    assert!(error(builder_from_env(env(&both), false)).contains("keep only"));
    let asked = error(builder_from_env(
        env(&[("LOCK_BACKEND", "sentinel")]),
        false,
    ));
    assert!(asked.contains("REDIS_SENTINELS"), "{asked}");
}

#[test]
fn prefix_and_fair_mode_come_from_the_environment() {
    let pairs = [
        ("LOCK_BACKEND", "memory"),
        ("LOCK_PREFIX", "billing:"),
        ("LOCK_FAIR", "1"),
    ];
    let builder = builder_from_env(env(&pairs), false).unwrap();
    assert_eq!(builder.prefix, "billing:");
    assert_eq!(builder.fair, Some(true));
    let unset = builder_from_env(env(&[("LOCK_BACKEND", "memory")]), false).unwrap();
    assert_eq!(unset.fair, None, "the default applies");
    let plain = [("LOCK_BACKEND", "memory"), ("LOCK_FAIR", "0")];
    assert_eq!(
        builder_from_env(env(&plain), false).unwrap().fair,
        Some(false)
    );
}

#[test]
fn cohort_limits_come_from_the_environment_and_bad_numbers_are_named() {
    let memory = ("LOCK_BACKEND", "memory");
    let default = builder_from_env(env(&[memory]), false).unwrap();
    assert_eq!(default.cohort, crate::DEFAULT_COHORT);
    let pairs = [memory, ("LOCK_COHORT", "0")];
    assert!(!builder_from_env(env(&pairs), false).unwrap().cohort.is_on());
    let pairs = [
        memory,
        ("LOCK_COHORT", "3"),
        ("LOCK_COHORT_BUDGET_MS", "40"),
    ];
    let set = builder_from_env(env(&pairs), false).unwrap().cohort;
    assert_eq!((set.handoffs, set.budget.as_millis()), (3, 40));
    let pairs = [memory, ("LOCK_COHORT", "many")];
    let error = builder_from_env(env(&pairs), false)
        .unwrap_err()
        .to_string();
    assert!(error.contains("LOCK_COHORT=\"many\""), "{error}");
}

#[test]
fn unknown_lock_variables_get_the_nearest_known_name() {
    let names = [
        "LOCK_REDIS_UR",
        "LOCK_PREFIX",
        "PATH",
        "LOCK_BAKEND",
        "LOCK_SOMETHING_ELSE",
    ];
    let found = unknown_lock_variables(names.iter().map(|n| (*n).to_owned()));
    assert_eq!(
        found,
        [
            ("LOCK_REDIS_UR".to_owned(), Some("LOCK_REDIS_URL")),
            ("LOCK_BAKEND".to_owned(), Some("LOCK_BACKEND")),
            ("LOCK_SOMETHING_ELSE".to_owned(), None),
        ]
    );
}

#[test]
fn lock_fair_takes_the_usual_yes_and_no_spellings_and_refuses_others() {
    let memory = ("LOCK_BACKEND", "memory");
    let mode = |value: &str| builder_from_env(env(&[memory, ("LOCK_FAIR", value)]), false);
    for yes in ["1", "true", "TRUE", "Yes", "on", " On "] {
        assert_eq!(mode(yes).unwrap().fair, Some(true), "{yes}");
    }
    for no in ["0", "false", "False", "NO", "off", "oFF"] {
        assert_eq!(mode(no).unwrap().fair, Some(false), "{no}");
    }
    assert_eq!(mode(" ").unwrap().fair, None, "blank: the default");
    for other in ["2", "fair", "plain", "nope", "y"] {
        let message = error(mode(other));
        assert!(message.contains("LOCK_FAIR"), "{message}");
        assert!(message.contains("false, no, off or 0"), "{message}");
    }
}

#[test]
fn the_fail_closed_error_names_an_unknown_lock_variable_and_its_likely_meaning() {
    let pairs = [("LOCK_REDIS_UR", "redis://h:1")];
    let unknown = unknown_lock_variables(pairs.iter().map(|(n, _)| (*n).to_owned()));
    let failed = builder_from_env(env(&pairs), false);
    let message = error(failed.map_err(|e| naming_unknown_variables(e, &unknown)));
    assert!(message.contains("no lock backend configured"), "{message}");
    assert!(
        message.contains(
            "LOCK_REDIS_UR is set, but lock-runtime does not read it: did you mean LOCK_REDIS_URL?"
        ),
        "{message}"
    );
}

/// The rustdoc of `init_from_env` (the doc comments of `mod.rs`) and
/// `docs/configuration.md` name every variable it reads, and they and
/// the README say the same default for `LOCK_FAIR` as the code.
#[test]
fn the_docs_name_every_variable_read_and_the_same_lock_fair_default() {
    let rustdoc: String = include_str!("mod.rs")
        .split("pub async fn init_from_env")
        .next()
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("///"))
        .collect::<Vec<_>>()
        .join("\n");
    let configuration = include_str!("../../../docs/configuration.md");
    let readme = include_str!("../../../README.md");
    for name in ENV_VARIABLES {
        let quoted = format!("`{name}`");
        assert!(
            rustdoc.contains(&quoted),
            "init_from_env's rustdoc lacks {name}"
        );
        assert!(
            configuration.contains(&quoted),
            "docs/configuration.md lacks {name}"
        );
    }
    let default = if crate::DEFAULT_FAIR { "fair" } else { "plain" };
    assert!(rustdoc.contains(&format!("unset, {default}")), "{rustdoc}");
    assert!(configuration.contains(&format!("Unset: {default}")));
    assert!(readme.contains(&format!("locks are {default} unless")));
    // What a debug build says on stderr is quoted as it is said.
    assert!(configuration.contains(FALLBACK), "docs/configuration.md");
}

#[tokio::test]
async fn the_embedded_backend_says_it_excludes_only_this_process() {
    let runtime = LockRuntime::builder().memory().build().await.unwrap();
    assert!(
        runtime.describe().contains("only tasks of this process"),
        "{}",
        runtime.describe()
    );
}

#[test]
fn a_backend_name_that_is_not_one_is_named_before_any_conflict() {
    for (name, meant) in [
        ("zk", Some("zookeeper")),
        ("etcd3", Some("etcd")),
        ("rdis", None),
    ] {
        // Beside the variable of the backend meant: still the name's error,
        // not a conflict of backend variables.
        let pairs = [("LOCK_BACKEND", name), ("LOCK_ZOOKEEPER", "h:2181")];
        let message = error(builder_from_env(env(&pairs), false));
        assert!(
            message.contains(&format!("LOCK_BACKEND={name:?} is not a backend")),
            "{message}"
        );
        assert!(!message.contains("unset one of them"), "{message}");
        if let Some(meant) = meant {
            assert!(
                message.contains(&format!("did you mean {meant}?")),
                "{message}"
            );
        }
    }
}

#[test]
fn endpoints_that_are_not_host_port_are_refused_at_build() {
    let etcd = builder_from_env(env(&[("LOCK_ETCD_ENDPOINTS", "127.0.0.1:2379x")]), false);
    let message = match etcd.unwrap().check() {
        Err(LockError::InvalidConfig(message)) => message,
        other => panic!("expected InvalidConfig, got {other:?}"),
    };
    assert!(
        message.contains("\"127.0.0.1:2379x\"") && message.contains("port"),
        "{message}"
    );
    let zookeeper = builder_from_env(env(&[("LOCK_ZOOKEEPER", "zk://h:2181")]), false);
    let message = match zookeeper.unwrap().check() {
        Err(LockError::InvalidConfig(message)) => message,
        other => panic!("expected InvalidConfig, got {other:?}"),
    };
    assert!(message.contains("no scheme (zk://)"), "{message}");
}

#[test]
fn the_default_lease_and_wait_come_from_lock_lease_and_lock_wait() {
    let memory = ("LOCK_BACKEND", "memory");
    let unset = builder_from_env(env(&[memory]), false).unwrap();
    assert_eq!(unset.default_lease, crate::DEFAULT_LEASE);
    assert_eq!(unset.default_wait, Some(crate::DEFAULT_WAIT));
    let pairs = [memory, ("LOCK_LEASE", "10s"), ("LOCK_WAIT", "1m30s")];
    let set = builder_from_env(env(&pairs), false).unwrap();
    assert_eq!(set.default_lease, Duration::from_secs(10));
    assert_eq!(set.default_wait, Some(Duration::from_secs(90)));
    let forever = [memory, ("LOCK_WAIT", "forever"), ("LOCK_LEASE", " ")];
    let forever = builder_from_env(env(&forever), false).unwrap();
    assert_eq!(forever.default_wait, None);
    assert_eq!(
        forever.default_lease,
        crate::DEFAULT_LEASE,
        "blank is unset"
    );
}

#[test]
fn a_lease_or_wait_that_is_no_duration_is_refused_naming_its_variable() {
    let memory = ("LOCK_BACKEND", "memory");
    for (name, value, why) in [
        ("LOCK_LEASE", "30", "has no unit"),
        ("LOCK_LEASE", "1ms", "out of range"),
        ("LOCK_WAIT", "5 seconds", "a number before it"),
        ("LOCK_WAIT", "never", "or forever"),
    ] {
        let said = error(builder_from_env(env(&[memory, (name, value)]), false));
        assert!(said.contains(&format!("{name}={value:?}")), "{said}");
        assert!(said.contains(why), "{said}");
    }
}

/// A ZooKeeper whose `maxSessionTimeout` (60 s on the test server) is under
/// the default lease refuses the runtime at start, saying that the default
/// lease is at fault and which variable sets it; a default it can serve
/// starts.
#[cfg(feature = "zookeeper")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_refuses_at_start_a_default_lease_longer_than_its_sessions_naming_lock_lease() {
    let server = lock_testkit::zookeeper::ZooKeeperServer::shared();
    let connect = server.connect_string();
    let pairs = [("LOCK_ZOOKEEPER", connect.as_str()), ("LOCK_LEASE", "2m")];
    let builder = builder_from_env(env(&pairs), false).unwrap();
    let said = match builder.build().await {
        Err(LockError::InvalidConfig(message)) => message,
        other => panic!("expected InvalidConfig, got {:?}", other.map(|_| ())),
    };
    for part in ["the default lease of 120s", "LOCK_LEASE", "at most 60s"] {
        assert!(said.contains(part), "{part:?} not in: {said}");
    }
    let pairs = [("LOCK_ZOOKEEPER", connect.as_str()), ("LOCK_LEASE", "59s")];
    let runtime = builder_from_env(env(&pairs), false).unwrap().build().await;
    let runtime = runtime.unwrap_or_else(|e| panic!("a default that fits: {e}"));
    // A lock's own lease is known only at its first acquire: refused then,
    // naming its key.
    let long = runtime.lock("order:7").lease(Duration::from_secs(61));
    let said = match long.try_acquire().await {
        Err(LockError::InvalidConfig(message)) => message,
        other => panic!("expected InvalidConfig, got {:?}", other.map(|_| ())),
    };
    assert!(
        said.contains("the lease of key \"order:7\" of 61s"),
        "{said}"
    );
    assert!(!said.contains("LOCK_LEASE"), "not the default: {said}");
    runtime.shutdown().await.unwrap();
}
