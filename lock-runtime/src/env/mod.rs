//! Configuration from the environment: [`init_from_env`], the variables it
//! reads, and the fail-closed rule for a missing backend.

mod duration;

use crate::builder::{Choice, LockRuntimeBuilder};
use crate::error::LockError;
use crate::runtime::LockRuntime;

/// Installs the global runtime from the environment, and returns it.
///
/// | variable | meaning |
/// |---|---|
/// | `LOCK_REDIS_URL`, else `REDIS_URL` | the Redis server (`redis://…` or `rediss://…`) |
/// | `LOCK_REDIS_CLUSTER` | a Redis Cluster instead: node URLs separated by commas (`redis://n1:7000,redis://n2:7000`) |
/// | `LOCK_REDLOCK_URLS`, else `REDLOCK_URLS` | Redlock: the independent masters' URLs, comma-separated (at least three; with `LOCK_FAIR=1` the build fails: Redlock has no fair mode) |
/// | `LOCK_ETCD_ENDPOINTS` | etcd (feature `etcd`): its members, `host:port` comma-separated; `LOCK_ETCD_USER` and `LOCK_ETCD_PASSWORD` for etcd's auth (both or neither) |
/// | `LOCK_ZOOKEEPER` | ZooKeeper (feature `zookeeper`): a connect string, `host:port,host:port[/chroot]`; `LOCK_ZOOKEEPER_USER` and `LOCK_ZOOKEEPER_PASSWORD` for the `digest` scheme (both or neither) |
/// | `LOCK_BACKEND` | `redis` (needs a URL), `sentinel`, `redlock` (needs the URLs), `etcd`, `zookeeper` or `memory` (the embedded backend, on purpose) |
/// | `LOCK_PREFIX` | prefix of every lock name (default `lock:`) |
/// | `LOCK_LEASE` | the default lease of a lock that sets none, as the attribute writes one (`10s`, `1m30s`; 10ms to 24h): [`default_lease`](LockRuntimeBuilder::default_lease), unset [`DEFAULT_LEASE`](crate::DEFAULT_LEASE) (30 s). On ZooKeeper it must fit the servers' `maxSessionTimeout`, or the start is refused naming this variable |
/// | `LOCK_WAIT` | the default wait of an acquire that sets none (`5s`; `0s` tries once, `forever` has no bound): [`default_wait`](LockRuntimeBuilder::default_wait), unset [`DEFAULT_WAIT`](crate::DEFAULT_WAIT) (30 s) |
/// | `LOCK_FAIR` | the default mode: `true`, `yes`, `on` or `1` fair, `false`, `no`, `off` or `0` plain (any case; another value is refused); unset, fair ([`DEFAULT_FAIR`](crate::DEFAULT_FAIR)) |
/// | `LOCK_CLIENT_NAME` | the name operators see beside this process's holds: [`client_name`](LockRuntimeBuilder::client_name) |
/// | `LOCK_COHORT`, `LOCK_COHORT_BUDGET_MS` | local handoffs in a row (`0`: none) and their time budget in ms: [`cohort`](LockRuntimeBuilder::cohort) (default 32 and 5) |
///
/// Redis Sentinel instead of one server (`LOCK_BACKEND` unset or `sentinel`;
/// no Redis URL set):
///
/// | variable | meaning |
/// |---|---|
/// | `REDIS_SENTINELS` | the sentinels: `host:port,host:port,…` (or `redis://…` URLs) |
/// | `REDIS_SENTINEL_SERVICE` | the service they monitor, e.g. `mymaster` |
/// | `REDIS_USERNAME`, `REDIS_PASSWORD`, `REDIS_DB` | how the primary is reached (optional) |
/// | `LOCK_SYNC_REPLICAS`, `LOCK_SYNC_TIMEOUT_MS` | `sync_replicas(n, ms)` (timeout default 100) |
///
/// **Once per process, and idempotent.** A second call returns the runtime
/// already installed (however it was installed) without reading the
/// environment again, so every `#[tokio::test]` of a test binary may call
/// it: the runtime runs on its own thread, so it serves every test's tokio
/// runtime alike. ([`LockRuntime::install`] instead refuses a second
/// runtime; a test that wants a runtime of its own builds one and uses
/// [`LockRuntime::lock`] or [`with_lock`](crate::with_lock), not the global.)
///
/// **It fails closed.** With no URL and no `LOCK_BACKEND=memory`, a release
/// build returns [`LockError::InvalidConfig`] naming `REDIS_URL`: a service
/// deployed with a missing or misspelt variable must not run with locks that
/// exclude only its own process while every call seems to succeed. A debug
/// build (`cargo run`, `cargo test`) uses the embedded backend then, so
/// examples and users' own tests need no setup, and says once that its locks
/// exclude only this process. An unknown `LOCK_*` variable (a typo such as
/// `LOCK_REDIS_UR`) is named with the known one it most likely means, also in
/// the fail-closed error. Both are said through `tracing` when a subscriber
/// takes warnings, else on stderr: no setup is needed to see them.
///
/// ```
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// # std::env::remove_var("LOCK_REDIS_URL"); std::env::remove_var("REDIS_URL");
/// # std::env::set_var("LOCK_BACKEND", "memory");
/// let runtime = lock_runtime::init_from_env().await?;
/// println!("locks on {}", runtime.describe());
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
pub async fn init_from_env() -> Result<LockRuntime, LockError> {
    if let Ok(installed) = LockRuntime::global() {
        return Ok(installed);
    }
    let names = std::env::vars_os().filter_map(|(name, _)| name.into_string().ok());
    let unknown = unknown_lock_variables(names);
    let read = |name: &str| std::env::var(name).ok();
    let builder = builder_from_env(read, cfg!(debug_assertions))
        .map_err(|e| naming_unknown_variables(e, &unknown))?;
    // Said where a user sees it with no tracing set up, once per process
    // (a failed call may be retried). Both mean "not the locks you think".
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        for (name, nearest) in &unknown {
            // One far from every known name is likely another program's
            // (a test harness's `LOCK_SOAK_SECS`): only a tracing warning.
            match nearest {
                Some(_) => tell(&unknown_variable(name, *nearest)),
                None => tracing::warn!("{}", unknown_variable(name, None)),
            }
        }
        let embedded = matches!(builder.choice, crate::builder::Choice::Memory);
        let asked = read("LOCK_BACKEND").is_some_and(|b| b.trim().eq_ignore_ascii_case("memory"));
        if embedded && !asked {
            tell(FALLBACK);
        }
    });
    let runtime = builder.build().await?;
    match runtime.clone().install() {
        Ok(()) => {}
        // Another caller installed one meanwhile: that one is the runtime.
        Err(LockError::AlreadyInstalled) => return LockRuntime::global(),
        Err(e) => return Err(e),
    }
    tracing::info!(backend = %runtime.describe(), "lock runtime installed");
    Ok(runtime)
}

/// The variables [`init_from_env`] reads.
const ENV_VARIABLES: [&str; 21] = [
    "LOCK_REDIS_URL",
    "LOCK_REDIS_CLUSTER",
    "LOCK_ZOOKEEPER",
    "LOCK_ZOOKEEPER_USER",
    "LOCK_ZOOKEEPER_PASSWORD",
    "LOCK_ETCD_ENDPOINTS",
    "LOCK_ETCD_USER",
    "LOCK_ETCD_PASSWORD",
    "LOCK_REDLOCK_URLS",
    "REDLOCK_URLS",
    "REDIS_URL",
    "LOCK_BACKEND",
    "LOCK_PREFIX",
    "LOCK_FAIR",
    "LOCK_LEASE",
    "LOCK_WAIT",
    "LOCK_COHORT",
    "LOCK_COHORT_BUDGET_MS",
    "LOCK_SYNC_REPLICAS",
    "LOCK_SYNC_TIMEOUT_MS",
    "LOCK_CLIENT_NAME",
];

/// The builder the environment asks for (`read` looks a variable up;
/// `debug_build` allows the embedded fallback). The rule of [`init_from_env`].
fn builder_from_env(
    read: impl Fn(&str) -> Option<String>,
    debug_build: bool,
) -> Result<LockRuntimeBuilder, LockError> {
    let set = |name: &str| read(name).filter(|v| !v.trim().is_empty());
    let mut builder = backend_from_env(&set, debug_build)?;
    if let Some(prefix) = read("LOCK_PREFIX") {
        builder = builder.key_prefix(prefix);
    }
    let cohort = cohort_from_env(set("LOCK_COHORT"), set("LOCK_COHORT_BUDGET_MS"))?;
    builder = builder.cohort(cohort.handoffs, cohort.budget);
    if let Some(fair) = crate::builder::fair_from_env(read("LOCK_FAIR").as_deref())? {
        builder = builder.fair(fair);
    }
    if let Some(lease) = set("LOCK_LEASE") {
        builder = builder.default_lease(duration::lease_from_env(&lease)?);
    }
    if let Some(wait) = set("LOCK_WAIT") {
        builder = builder.default_wait(duration::wait_from_env(&wait)?);
    }
    Ok(builder)
}

/// The values `LOCK_BACKEND` takes.
const BACKENDS: [&str; 6] = [
    "redis",
    "sentinel",
    "redlock",
    "etcd",
    "zookeeper",
    "memory",
];

/// `LOCK_BACKEND` names no backend: said before any other variable is
/// looked at, with the name meant when it is a common other spelling.
fn not_a_backend(other: &str) -> LockError {
    let meant = match other {
        "zk" | "zoo" | "zookeeper3" | "curator" => Some("zookeeper"),
        "etcd3" | "etcdv3" | "etcd-v3" => Some("etcd"),
        "mem" | "embedded" | "local" | "in-memory" | "inmemory" => Some("memory"),
        "cluster" | "redis-cluster" => Some("redis (with LOCK_REDIS_CLUSTER set)"),
        "valkey" | "keydb" => Some("redis"),
        _ => None,
    };
    let hint = meant.map_or(String::new(), |m| format!(" (did you mean {m}?)"));
    LockError::InvalidConfig(format!(
        "LOCK_BACKEND={other:?} is not a backend{hint}: use redis, sentinel, redlock, etcd, \
         zookeeper or memory"
    ))
}

/// The builder of the backend the environment names (`set` looks a
/// variable up, blank as unset), before the settings every backend shares.
fn backend_from_env(
    set: &impl Fn(&str) -> Option<String>,
    debug_build: bool,
) -> Result<LockRuntimeBuilder, LockError> {
    let url = set("LOCK_REDIS_URL").or_else(|| set("REDIS_URL"));
    let backend = set("LOCK_BACKEND").map(|b| b.trim().to_ascii_lowercase());
    if let Some(other) = backend.as_deref().filter(|b| !BACKENDS.contains(b)) {
        return Err(not_a_backend(other));
    }
    let cluster = set("LOCK_REDIS_CLUSTER");
    let redlock = set("LOCK_REDLOCK_URLS").or_else(|| set("REDLOCK_URLS"));
    let etcd = set("LOCK_ETCD_ENDPOINTS");
    let zookeeper = set("LOCK_ZOOKEEPER");
    Ok(match (backend.as_deref(), url) {
        (b, url) if zookeeper.is_some() || b == Some("zookeeper") => zookeeper_from_env(
            set,
            b,
            url.is_some() || cluster.is_some() || redlock.is_some() || etcd.is_some(),
        )?,
        (b, url) if etcd.is_some() || b == Some("etcd") => etcd_from_env(
            set,
            b,
            url.is_some() || cluster.is_some() || redlock.is_some(),
        )?,
        (b, url) if set("REDIS_SENTINELS").is_some() || b == Some("sentinel") => {
            sentinel_from_env(set, b, url.is_some())?
        }
        (None | Some("redis"), url) if cluster.is_some() => {
            cluster_from_env(url.is_some() || redlock.is_some(), cluster)?
        }
        (Some("memory"), _) if cluster.is_some() => {
            return Err(LockError::InvalidConfig(
                "LOCK_BACKEND=memory, but LOCK_REDIS_CLUSTER is set too: unset one of them"
                    .to_owned(),
            ))
        }
        (backend @ (None | Some("redlock" | "memory")), url)
            if redlock.is_some() || backend == Some("redlock") =>
        {
            redlock_from_env(backend, url.is_some(), redlock)?
        }
        (None | Some("redis"), Some(url)) => LockRuntime::builder().redis(url),
        (Some("memory"), None) => LockRuntime::builder().memory(),
        (Some("memory"), Some(_)) => {
            return Err(LockError::InvalidConfig(
                "LOCK_BACKEND=memory, but a Redis URL is set too (REDIS_URL or \
                 LOCK_REDIS_URL): unset one of them"
                    .to_owned(),
            ))
        }
        (Some("redis"), None) => {
            return Err(LockError::InvalidConfig(
                "LOCK_BACKEND=redis, but no Redis URL: set REDIS_URL (or LOCK_REDIS_URL) \
                 to redis://host:port"
                    .to_owned(),
            ))
        }
        (Some(other), _) => return Err(not_a_backend(other)),
        // Said by `init_from_env` (`FALLBACK`), on stderr if need be.
        (None, None) if debug_build => LockRuntime::builder().memory(),
        (None, None) => {
            return Err(LockError::InvalidConfig(
                "no lock backend configured: set REDIS_URL (or LOCK_REDIS_URL) to \
                 redis://host:port, or LOCK_BACKEND=memory to use the embedded backend \
                 on purpose (its locks exclude only tasks of this process)"
                    .to_owned(),
            ))
        }
    })
}

/// The Redis Cluster builder (`LOCK_REDIS_CLUSTER`, node URLs separated
/// by commas): refused beside a Redis URL or Redlock masters (`other`).
fn cluster_from_env(other: bool, cluster: Option<String>) -> Result<LockRuntimeBuilder, LockError> {
    if other {
        return Err(LockError::InvalidConfig(
            "LOCK_REDIS_CLUSTER and a Redis URL (REDIS_URL or LOCK_REDIS_URL) or \
             Redlock masters (REDLOCK_URLS) are both set: unset one of them"
                .to_owned(),
        ));
    }
    let nodes = cluster.unwrap_or_default();
    let nodes = nodes.split([',', ' ']).filter(|n| !n.trim().is_empty());
    Ok(LockRuntime::builder().redis_cluster(nodes.map(str::trim)))
}

/// The etcd builder (`LOCK_ETCD_ENDPOINTS`, comma separated; with
/// `LOCK_ETCD_USER` and `LOCK_ETCD_PASSWORD` for etcd's auth): refused
/// beside another backend's variables.
fn etcd_from_env(
    set: &impl Fn(&str) -> Option<String>,
    backend: Option<&str>,
    redis_too: bool,
) -> Result<LockRuntimeBuilder, LockError> {
    if redis_too || !matches!(backend, None | Some("etcd")) {
        return Err(LockError::InvalidConfig(
            "LOCK_ETCD_ENDPOINTS (or LOCK_BACKEND=etcd) is set together with another \
             backend's variables (a Redis URL, LOCK_REDIS_CLUSTER, REDLOCK_URLS or \
             LOCK_BACKEND): unset one of them"
                .to_owned(),
        ));
    }
    let Some(endpoints) = set("LOCK_ETCD_ENDPOINTS") else {
        return Err(LockError::InvalidConfig(
            "LOCK_BACKEND=etcd, but no endpoints: set LOCK_ETCD_ENDPOINTS to host:port[,host:port…]"
                .to_owned(),
        ));
    };
    let endpoints: Vec<String> = endpoints
        .split([',', ' '])
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(str::to_owned)
        .collect();
    let mut builder = LockRuntimeBuilder {
        choice: Choice::Etcd(endpoints),
        ..LockRuntimeBuilder::default()
    };
    match (set("LOCK_ETCD_USER"), set("LOCK_ETCD_PASSWORD")) {
        (Some(user), Some(password)) => builder.etcd_user = Some((user, password)),
        (None, None) => {}
        _ => {
            return Err(LockError::InvalidConfig(
                "set both LOCK_ETCD_USER and LOCK_ETCD_PASSWORD, or neither".to_owned(),
            ))
        }
    }
    Ok(builder)
}

/// The ZooKeeper builder (`LOCK_ZOOKEEPER`, a connect string; with
/// `LOCK_ZOOKEEPER_USER` and `LOCK_ZOOKEEPER_PASSWORD` for the `digest`
/// scheme): refused beside another backend's variables.
fn zookeeper_from_env(
    set: &impl Fn(&str) -> Option<String>,
    backend: Option<&str>,
    others_too: bool,
) -> Result<LockRuntimeBuilder, LockError> {
    if others_too || !matches!(backend, None | Some("zookeeper")) {
        return Err(LockError::InvalidConfig(
            "LOCK_ZOOKEEPER (or LOCK_BACKEND=zookeeper) is set together with another \
             backend's variables (a Redis URL, LOCK_REDIS_CLUSTER, REDLOCK_URLS, \
             LOCK_ETCD_ENDPOINTS or LOCK_BACKEND): unset one of them"
                .to_owned(),
        ));
    }
    let Some(connect) = set("LOCK_ZOOKEEPER") else {
        return Err(LockError::InvalidConfig(
            "LOCK_BACKEND=zookeeper, but no servers: set LOCK_ZOOKEEPER to \
             host:port[,host:port…][/chroot]"
                .to_owned(),
        ));
    };
    let mut builder = LockRuntimeBuilder {
        choice: Choice::Zookeeper(connect.trim().to_owned()),
        ..LockRuntimeBuilder::default()
    };
    match (set("LOCK_ZOOKEEPER_USER"), set("LOCK_ZOOKEEPER_PASSWORD")) {
        (Some(user), Some(password)) => builder.zookeeper_auth = Some((user, password)),
        (None, None) => {}
        _ => {
            return Err(LockError::InvalidConfig(
                "set both LOCK_ZOOKEEPER_USER and LOCK_ZOOKEEPER_PASSWORD, or neither".to_owned(),
            ))
        }
    }
    Ok(builder)
}

/// `LOCK_COHORT` (handoffs in a row) and `LOCK_COHORT_BUDGET_MS`; what is not
/// set keeps its default.
fn cohort_from_env(
    handoffs: Option<String>,
    budget_ms: Option<String>,
) -> Result<crate::Cohort, LockError> {
    let mut cohort = crate::DEFAULT_COHORT;
    let number = |name: &str, value: &str| {
        value.trim().parse::<u32>().map_err(|_| {
            LockError::InvalidConfig(format!(
                "{name}={value:?} is not a whole number (LOCK_COHORT: local handoffs in a \
                 row, 0 for none; LOCK_COHORT_BUDGET_MS: their time budget in ms)"
            ))
        })
    };
    if let Some(value) = handoffs {
        cohort.handoffs = number("LOCK_COHORT", &value)?;
    }
    if let Some(value) = budget_ms {
        cohort.budget =
            std::time::Duration::from_millis(number("LOCK_COHORT_BUDGET_MS", &value)?.into());
    }
    Ok(cohort)
}

/// The Redlock part of [`builder_from_env`]: `urls` is the comma-separated
/// list (`LOCK_REDLOCK_URLS` or `REDLOCK_URLS`), `backend` the
/// `LOCK_BACKEND` asked for (`None`, `redlock` or `memory`), `redis_url`
/// whether a single server's URL is set too.
fn redlock_from_env(
    backend: Option<&str>,
    redis_url: bool,
    urls: Option<String>,
) -> Result<LockRuntimeBuilder, LockError> {
    let Some(urls) = urls else {
        return Err(LockError::InvalidConfig(
            "LOCK_BACKEND=redlock, but no masters: set REDLOCK_URLS (or LOCK_REDLOCK_URLS) \
             to redis://host1:port,redis://host2:port,redis://host3:port"
                .to_owned(),
        ));
    };
    if backend == Some("memory") {
        return Err(LockError::InvalidConfig(
            "LOCK_BACKEND=memory, but Redlock masters are set too (REDLOCK_URLS or \
             LOCK_REDLOCK_URLS): unset one of them"
                .to_owned(),
        ));
    }
    if backend.is_none() && redis_url {
        return Err(LockError::InvalidConfig(
            "both a Redis URL (REDIS_URL or LOCK_REDIS_URL) and Redlock masters \
             (REDLOCK_URLS or LOCK_REDLOCK_URLS) are set: choose with LOCK_BACKEND=redis \
             or LOCK_BACKEND=redlock"
                .to_owned(),
        ));
    }
    let urls = urls.split(',').map(str::trim).filter(|u| !u.is_empty());
    Ok(LockRuntime::builder().redlock(urls.map(str::to_owned)))
}

/// The Sentinel part of [`builder_from_env`]: `REDIS_SENTINELS` and its
/// companions (`set` reads a variable that is set and not blank).
fn sentinel_from_env(
    set: &impl Fn(&str) -> Option<String>,
    backend: Option<&str>,
    has_url: bool,
) -> Result<LockRuntimeBuilder, LockError> {
    let invalid = |text: &str| Err(LockError::InvalidConfig(text.to_owned()));
    if !matches!(backend, None | Some("sentinel")) || has_url {
        return invalid(
            "REDIS_SENTINELS is set together with LOCK_BACKEND=redis/memory or a Redis URL \
             (REDIS_URL, LOCK_REDIS_URL): keep only the one you mean",
        );
    }
    let (Some(sentinels), Some(service)) = (set("REDIS_SENTINELS"), set("REDIS_SENTINEL_SERVICE"))
    else {
        return invalid(
            "Redis Sentinel needs REDIS_SENTINELS=host:port,host:port,… and \
             REDIS_SENTINEL_SERVICE=<the monitored service, e.g. mymaster>",
        );
    };
    let sentinels: Vec<String> = sentinels.split(',').map(|s| s.trim().to_owned()).collect();
    let mut builder = LockRuntime::builder().redis_sentinel(sentinels, service.trim());
    if let Some(password) = set("REDIS_PASSWORD") {
        builder = builder.sentinel_auth(set("REDIS_USERNAME"), password);
    }
    if let Some(db) = set("REDIS_DB") {
        let Ok(db) = db.trim().parse() else {
            return invalid("REDIS_DB is not a database number (0, 1, …)");
        };
        builder = builder.sentinel_db(db);
    }
    if let Some(replicas) = set("LOCK_SYNC_REPLICAS") {
        let timeout = set("LOCK_SYNC_TIMEOUT_MS").unwrap_or_else(|| "100".to_owned());
        let (Ok(replicas), Ok(ms)) = (replicas.trim().parse(), timeout.trim().parse()) else {
            return invalid("LOCK_SYNC_REPLICAS and LOCK_SYNC_TIMEOUT_MS take whole numbers");
        };
        builder = builder.sync_replicas(replicas, std::time::Duration::from_millis(ms));
    }
    Ok(builder)
}

/// What a debug build says when it falls back to the embedded backend.
const FALLBACK: &str = "no lock backend configured (REDIS_URL, LOCK_ETCD_ENDPOINTS, \
                        LOCK_ZOOKEEPER, ... are unset): using the embedded backend, whose locks \
                        exclude only tasks of this process (debug build only; a release build \
                        refuses to start unless LOCK_BACKEND=memory)";

/// Says `message` where the user sees it: through `tracing` when a
/// subscriber takes warnings from here, else on stderr. A library does not
/// print as a rule; these messages are the exception, since each means the
/// locks may not be what the user believes, and a service that set up no
/// tracing would otherwise never learn it.
fn tell(message: &str) {
    if tracing::enabled!(tracing::Level::WARN) {
        tracing::warn!("{message}");
    } else {
        eprintln!("lock-runtime: {message}");
    }
}

/// The words for an unknown `LOCK_*` variable and its likely meaning.
fn unknown_variable(name: &str, nearest: Option<&str>) -> String {
    match nearest {
        Some(known) => {
            format!("{name} is set, but lock-runtime does not read it: did you mean {known}?")
        }
        None => format!("{name} is set, but lock-runtime does not read it"),
    }
}

/// `error`, with the unknown `LOCK_*` variables named when it is a
/// configuration error: the fail-closed error of a release build whose
/// `LOCK_REDIS_UR` was meant as `LOCK_REDIS_URL` should say so.
fn naming_unknown_variables(
    error: LockError,
    unknown: &[(String, Option<&'static str>)],
) -> LockError {
    match error {
        LockError::InvalidConfig(message) if !unknown.is_empty() => {
            let named: Vec<String> = unknown
                .iter()
                .map(|(name, nearest)| unknown_variable(name, *nearest))
                .collect();
            LockError::InvalidConfig(format!("{message} (also: {})", named.join("; ")))
        }
        other => other,
    }
}

/// The `LOCK_*` names among `names` that [`init_from_env`] does not read,
/// each with the nearest known name when it looks like a typo of one.
fn unknown_lock_variables(
    names: impl Iterator<Item = String>,
) -> Vec<(String, Option<&'static str>)> {
    names
        .filter(|n| n.starts_with("LOCK_") && !ENV_VARIABLES.contains(&n.as_str()))
        .map(|name| {
            let nearest = ENV_VARIABLES
                .iter()
                .map(|known| (edit_distance(&name, known), *known))
                .min()
                .filter(|(distance, _)| *distance <= 3)
                .map(|(_, known)| known);
            (name, nearest)
        })
        .collect()
}

/// Levenshtein distance (both strings are short variable names).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests;
