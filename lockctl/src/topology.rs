//! Which servers hold the locks: one Redis server, a Redis Cluster, the
//! primary of a Sentinel service, Redlock's independent masters, an etcd
//! cluster or a ZooKeeper ensemble. Chosen by the flags, else by the
//! variables the runtime's `init_from_env` reads (`LOCK_REDIS_URL`/`REDIS_URL`,
//! `LOCK_REDIS_CLUSTER`, `LOCK_REDLOCK_URLS`/`REDLOCK_URLS`,
//! `REDIS_SENTINELS` with `REDIS_SENTINEL_SERVICE`, `LOCK_ETCD_ENDPOINTS`
//! with `LOCK_ETCD_USER`/`LOCK_ETCD_PASSWORD`, `LOCK_ZOOKEEPER` with
//! `LOCK_ZOOKEEPER_USER`/`LOCK_ZOOKEEPER_PASSWORD`, `LOCK_BACKEND`), with the
//! same meaning and the same conflicts, so an operator runs lockctl in the
//! service's environment and sees the service's locks. The runtime is then
//! built for that topology with `LockRuntime::builder()`, which follows
//! `MOVED`, failovers and quorums, and knows etcd's and ZooKeeper's lock
//! recipes, as the service's runtime does.

use lock_runtime::{LockRuntime, LockRuntimeBuilder};

use crate::secret;
use crate::Failure;

/// The servers flags given on the command line (each overrides the
/// environment; at most one may be given).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Flags<'a> {
    pub(crate) redis_url: Option<&'a str>,
    pub(crate) cluster: Option<&'a str>,
    pub(crate) redlock: Option<&'a str>,
    pub(crate) sentinels: Option<&'a str>,
    pub(crate) sentinel_service: Option<&'a str>,
    pub(crate) etcd: Option<&'a str>,
    pub(crate) zookeeper: Option<&'a str>,
}

/// Where the locks are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Topology {
    /// One Redis server.
    Single(String),
    /// A Redis Cluster, given some of its nodes.
    Cluster(Vec<String>),
    /// The primary that these sentinels name for a service.
    Sentinel(Sentinel),
    /// Independent masters, a majority of which holds each lock.
    Redlock(Vec<String>),
    /// An etcd cluster, given some of its members' endpoints.
    Etcd(Etcd),
    /// A ZooKeeper ensemble (or one server), given its connect string.
    Zookeeper(Zookeeper),
}

/// A user name and password (etcd's auth, ZooKeeper's `digest`); its
/// `Debug` masks the password.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Credentials {
    pub(crate) user: String,
    pub(crate) password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"***")
            .finish()
    }
}

/// An etcd cluster, as `LOCK_ETCD_ENDPOINTS` and its companions give it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Etcd {
    /// `host:port` or `http(s)://host:port`, one per member.
    pub(crate) endpoints: Vec<String>,
    pub(crate) auth: Option<Credentials>,
}

/// A ZooKeeper ensemble, as `LOCK_ZOOKEEPER` and its companions give it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Zookeeper {
    /// `host:port[,host:port…][/chroot]`.
    pub(crate) connect: String,
    pub(crate) auth: Option<Credentials>,
}

/// A Sentinel deployment, as `REDIS_SENTINELS` and its companions give it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Sentinel {
    pub(crate) sentinels: Vec<String>,
    pub(crate) service: String,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) db: Option<u16>,
}

impl std::fmt::Debug for Sentinel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sentinel")
            .field("sentinels", &self.sentinels)
            .field("service", &self.service)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish_non_exhaustive()
    }
}

/// What to say when nothing names a server.
const NO_SERVERS: &str = "no Redis URL: pass --redis-url or set REDIS_URL (a Cluster: \
    --cluster or LOCK_REDIS_CLUSTER; Redlock: --redlock or REDLOCK_URLS; Sentinel: \
    --sentinels and --sentinel-service, or REDIS_SENTINELS and REDIS_SENTINEL_SERVICE; \
    etcd: --etcd or LOCK_ETCD_ENDPOINTS; ZooKeeper: --zookeeper or LOCK_ZOOKEEPER)";

impl Topology {
    /// From the flags, else from the environment (`env` reads a variable).
    pub(crate) fn choose(
        flags: Flags<'_>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Topology, Failure> {
        let set = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let given = [
            flags.redis_url,
            flags.cluster,
            flags.redlock,
            flags.sentinels,
            flags.etcd,
            flags.zookeeper,
        ]
        .iter()
        .filter(|f| f.is_some())
        .count();
        if given > 1 {
            return Err(Failure(
                "give one of --redis-url, --cluster, --redlock, --sentinels, --etcd and \
                 --zookeeper"
                    .to_owned(),
            ));
        }
        if let Some(url) = flags.redis_url {
            return Ok(Topology::Single(url.trim().to_owned()));
        }
        if let Some(nodes) = flags.cluster {
            return Ok(Topology::Cluster(list(nodes)));
        }
        if let Some(masters) = flags.redlock {
            return Ok(Topology::Redlock(list(masters)));
        }
        if let Some(sentinels) = flags.sentinels {
            let service = flags
                .sentinel_service
                .map(str::to_owned)
                .or_else(|| set("REDIS_SENTINEL_SERVICE"));
            return sentinel(sentinels, service, &set);
        }
        if let Some(endpoints) = flags.etcd {
            return etcd(endpoints, &set);
        }
        if let Some(connect) = flags.zookeeper {
            return zookeeper(connect, &set);
        }
        let backend = set("LOCK_BACKEND").map(|b| b.trim().to_ascii_lowercase());
        let url = set("LOCK_REDIS_URL").or_else(|| set("REDIS_URL"));
        let cluster = set("LOCK_REDIS_CLUSTER");
        let redlock = set("LOCK_REDLOCK_URLS").or_else(|| set("REDLOCK_URLS"));
        let sentinels = set("REDIS_SENTINELS");
        let conflict = |text: &str| Err(Failure(format!("{text}: unset one of them")));
        let etcd_endpoints = set("LOCK_ETCD_ENDPOINTS");
        // The order and the conflicts of `init_from_env`: ZooKeeper, then
        // etcd, each refused beside another backend's variables rather
        // than read from one of them: the locks are in one place only.
        if backend.as_deref() == Some("zookeeper") || set("LOCK_ZOOKEEPER").is_some() {
            let others = url.is_some()
                || cluster.is_some()
                || redlock.is_some()
                || etcd_endpoints.is_some()
                || !matches!(backend.as_deref(), None | Some("zookeeper"));
            if others {
                return conflict(
                    "LOCK_ZOOKEEPER (or LOCK_BACKEND=zookeeper) and another backend's \
                     variables (a Redis URL, LOCK_REDIS_CLUSTER, REDLOCK_URLS, \
                     LOCK_ETCD_ENDPOINTS or LOCK_BACKEND) are both set",
                );
            }
            let Some(connect) = set("LOCK_ZOOKEEPER") else {
                return Err(Failure(
                    "LOCK_BACKEND=zookeeper, but LOCK_ZOOKEEPER is not set \
                     (host:port[,host:port…][/chroot])"
                        .to_owned(),
                ));
            };
            return zookeeper(&connect, &set);
        }
        if backend.as_deref() == Some("etcd") || etcd_endpoints.is_some() {
            let others = url.is_some()
                || cluster.is_some()
                || redlock.is_some()
                || !matches!(backend.as_deref(), None | Some("etcd"));
            if others {
                return conflict(
                    "LOCK_ETCD_ENDPOINTS (or LOCK_BACKEND=etcd) and another backend's \
                     variables (a Redis URL, LOCK_REDIS_CLUSTER, REDLOCK_URLS or \
                     LOCK_BACKEND) are both set",
                );
            }
            let Some(endpoints) = etcd_endpoints else {
                return Err(Failure(
                    "LOCK_BACKEND=etcd, but LOCK_ETCD_ENDPOINTS is not set \
                     (host:port[,host:port…])"
                        .to_owned(),
                ));
            };
            return etcd(&endpoints, &set);
        }
        match backend.as_deref() {
            Some("memory") => Err(Failure(
                "LOCK_BACKEND=memory: the embedded backend's locks live inside their own \
                 process, lockctl cannot see them"
                    .to_owned(),
            )),
            Some("sentinel") | None if sentinels.is_some() || backend.is_some() => {
                if url.is_some() {
                    return conflict("REDIS_SENTINELS and a Redis URL (REDIS_URL) are both set");
                }
                let Some(sentinels) = sentinels else {
                    return Err(Failure(
                        "LOCK_BACKEND=sentinel, but REDIS_SENTINELS is not set".to_owned(),
                    ));
                };
                sentinel(&sentinels, set("REDIS_SENTINEL_SERVICE"), &set)
            }
            None | Some("redis") if cluster.is_some() => {
                if url.is_some() || redlock.is_some() {
                    return conflict(
                        "LOCK_REDIS_CLUSTER and a Redis URL or Redlock masters are both set",
                    );
                }
                Ok(Topology::Cluster(list(&cluster.unwrap_or_default())))
            }
            Some("redlock") | None if redlock.is_some() || backend.is_some() => {
                let Some(masters) = redlock else {
                    return Err(Failure(
                        "LOCK_BACKEND=redlock, but REDLOCK_URLS (or LOCK_REDLOCK_URLS) is not set"
                            .to_owned(),
                    ));
                };
                if backend.is_none() && url.is_some() {
                    return Err(Failure(
                        "both a Redis URL (REDIS_URL) and Redlock masters (REDLOCK_URLS) are \
                         set: choose with LOCK_BACKEND=redis or LOCK_BACKEND=redlock"
                            .to_owned(),
                    ));
                }
                Ok(Topology::Redlock(list(&masters)))
            }
            None | Some("redis") => url
                .map(|u| Topology::Single(u.trim().to_owned()))
                .ok_or_else(|| Failure(NO_SERVERS.to_owned())),
            Some(other) => Err(Failure(format!(
                "LOCK_BACKEND={other:?} is not a backend lockctl knows: redis, redlock, \
                 sentinel, etcd or zookeeper"
            ))),
        }
    }

    /// Why this build cannot read these servers, if it cannot: etcd and
    /// ZooKeeper are cargo features of lockctl (off by default, as in the
    /// runtime), and saying so beats a connection error.
    pub(crate) fn unsupported(&self) -> Option<Failure> {
        let feature = match self {
            Topology::Etcd(_) if cfg!(not(feature = "etcd")) => "etcd",
            Topology::Zookeeper(_) if cfg!(not(feature = "zookeeper")) => "zookeeper",
            _ => return None,
        };
        Some(Failure(format!(
            "the locks are on {}, and this lockctl was built without its feature \
             `{feature}`: install it with `cargo install --path lockctl --features {feature}`",
            self.server_kind()
        )))
    }

    /// A runtime builder for these servers (no prefix or timeouts yet);
    /// [`unsupported`](Self::unsupported)'s refusal when this build has no
    /// such backend.
    pub(crate) fn builder(&self) -> Result<LockRuntimeBuilder, Failure> {
        if let Some(refused) = self.unsupported() {
            return Err(refused);
        }
        Ok(match self {
            Topology::Single(url) => LockRuntime::builder().redis(url.clone()),
            Topology::Cluster(nodes) => LockRuntime::builder().redis_cluster(nodes.clone()),
            Topology::Redlock(masters) => {
                // lockctl takes no lock: fair mode (which Redlock refuses)
                // changes nothing for it.
                LockRuntime::builder().redlock(masters.clone()).fair(false)
            }
            Topology::Sentinel(s) => {
                let mut builder =
                    LockRuntime::builder().redis_sentinel(s.sentinels.clone(), s.service.clone());
                if let Some(password) = &s.password {
                    builder = builder.sentinel_auth(s.username.clone(), password.clone());
                }
                if let Some(db) = s.db {
                    builder = builder.sentinel_db(db);
                }
                builder
            }
            #[cfg(feature = "etcd")]
            Topology::Etcd(e) => {
                let mut builder = LockRuntime::builder().etcd(e.endpoints.clone());
                if let Some(auth) = &e.auth {
                    builder = builder.etcd_auth(auth.user.clone(), auth.password.clone());
                }
                builder
            }
            #[cfg(feature = "zookeeper")]
            Topology::Zookeeper(z) => {
                let mut builder = LockRuntime::builder().zookeeper(z.connect.clone());
                if let Some(auth) = &z.auth {
                    builder = builder.zookeeper_auth(auth.user.clone(), auth.password.clone());
                }
                builder
            }
            // Refused by `unsupported` above.
            #[cfg(not(feature = "etcd"))]
            Topology::Etcd(_) => return Err(Failure("no etcd in this build".to_owned())),
            #[cfg(not(feature = "zookeeper"))]
            Topology::Zookeeper(_) => return Err(Failure("no ZooKeeper in this build".to_owned())),
        })
    }

    /// The kind of server, for messages: `Redis`, `etcd`, `ZooKeeper`.
    pub(crate) fn server_kind(&self) -> &'static str {
        match self {
            Topology::Etcd(_) => "etcd",
            Topology::Zookeeper(_) => "ZooKeeper",
            _ => "Redis",
        }
    }

    /// What it is, for messages: the servers, every password masked.
    pub(crate) fn describe(&self) -> String {
        let masked = |urls: &[String]| secret::mask(&urls.join(","));
        match self {
            Topology::Single(url) => secret::mask(url),
            Topology::Cluster(nodes) => format!("cluster nodes {}", masked(nodes)),
            Topology::Redlock(masters) => format!("Redlock masters {}", masked(masters)),
            Topology::Sentinel(s) => {
                format!("sentinels {} (service {})", masked(&s.sentinels), s.service)
            }
            Topology::Etcd(e) => format!("endpoints {}", masked(&e.endpoints)),
            Topology::Zookeeper(z) => format!("servers {}", secret::mask(&z.connect)),
        }
    }

    /// Every secret a message could quote.
    pub(crate) fn secrets(&self) -> Vec<String> {
        let (mut secrets, password) = match self {
            Topology::Single(url) => (secret::secrets_of([url.as_str()]), None),
            Topology::Cluster(urls) | Topology::Redlock(urls) => {
                (secret::secrets_of(urls.iter().map(String::as_str)), None)
            }
            Topology::Sentinel(s) => (
                secret::secrets_of(s.sentinels.iter().map(String::as_str)),
                s.password.clone(),
            ),
            Topology::Etcd(e) => (
                secret::secrets_of(e.endpoints.iter().map(String::as_str)),
                e.auth.as_ref().map(|a| a.password.clone()),
            ),
            Topology::Zookeeper(z) => (
                secret::secrets_of([z.connect.as_str()]),
                z.auth.as_ref().map(|a| a.password.clone()),
            ),
        };
        if let Some(password) = password {
            secrets.push(password);
            secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        }
        secrets
    }
}

/// A comma-separated list, trimmed, blanks dropped.
fn list(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// A user and password from two variables: both or neither.
fn credentials(
    set: &impl Fn(&str) -> Option<String>,
    user: &str,
    password: &str,
) -> Result<Option<Credentials>, Failure> {
    match (set(user), set(password)) {
        (Some(user), Some(password)) => Ok(Some(Credentials { user, password })),
        (None, None) => Ok(None),
        _ => Err(Failure(format!(
            "set both {user} and {password}, or neither"
        ))),
    }
}

/// An etcd topology: the endpoints (comma- or space-separated, as
/// `init_from_env` reads them), and `LOCK_ETCD_USER`/`LOCK_ETCD_PASSWORD`.
fn etcd(endpoints: &str, set: &impl Fn(&str) -> Option<String>) -> Result<Topology, Failure> {
    let endpoints: Vec<String> = endpoints
        .split([',', ' '])
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(str::to_owned)
        .collect();
    if endpoints.is_empty() {
        return Err(Failure(
            "no etcd endpoint: give host:port[,host:port…]".to_owned(),
        ));
    }
    Ok(Topology::Etcd(Etcd {
        endpoints,
        auth: credentials(set, "LOCK_ETCD_USER", "LOCK_ETCD_PASSWORD")?,
    }))
}

/// A ZooKeeper topology: the connect string, and
/// `LOCK_ZOOKEEPER_USER`/`LOCK_ZOOKEEPER_PASSWORD`.
fn zookeeper(connect: &str, set: &impl Fn(&str) -> Option<String>) -> Result<Topology, Failure> {
    Ok(Topology::Zookeeper(Zookeeper {
        connect: connect.trim().to_owned(),
        auth: credentials(set, "LOCK_ZOOKEEPER_USER", "LOCK_ZOOKEEPER_PASSWORD")?,
    }))
}

/// A Sentinel topology: the sentinels, the service, and how the primary is
/// reached (`REDIS_USERNAME`, `REDIS_PASSWORD`, `REDIS_DB`).
fn sentinel(
    sentinels: &str,
    service: Option<String>,
    set: &impl Fn(&str) -> Option<String>,
) -> Result<Topology, Failure> {
    let Some(service) = service else {
        return Err(Failure(
            "Redis Sentinel needs the monitored service: --sentinel-service or \
             REDIS_SENTINEL_SERVICE (e.g. mymaster)"
                .to_owned(),
        ));
    };
    let db = match set("REDIS_DB") {
        Some(db) => Some(
            db.trim()
                .parse()
                .map_err(|_| Failure("REDIS_DB is not a database number (0, 1, …)".to_owned()))?,
        ),
        None => None,
    };
    Ok(Topology::Sentinel(Sentinel {
        sentinels: list(sentinels),
        service: service.trim().to_owned(),
        username: set("REDIS_USERNAME"),
        password: set("REDIS_PASSWORD"),
        db,
    }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::{Flags, Topology};

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
    }

    fn choose(pairs: &[(&str, &str)]) -> Result<Topology, String> {
        Topology::choose(Flags::default(), env(pairs)).map_err(|f| f.0)
    }

    #[test]
    fn the_variables_of_init_from_env_choose_the_topology() {
        assert_eq!(
            choose(&[("REDIS_URL", "redis://h:1")]),
            Ok(Topology::Single("redis://h:1".to_owned()))
        );
        assert_eq!(
            choose(&[("LOCK_REDIS_CLUSTER", "redis://a:1, redis://b:2")]),
            Ok(Topology::Cluster(vec![
                "redis://a:1".to_owned(),
                "redis://b:2".to_owned()
            ]))
        );
        assert!(matches!(
            choose(&[("REDLOCK_URLS", "redis://a:1,redis://b:2,redis://c:3")]),
            Ok(Topology::Redlock(m)) if m.len() == 3
        ));
        let sentinel = choose(&[
            ("REDIS_SENTINELS", "s1:26379,s2:26379"),
            ("REDIS_SENTINEL_SERVICE", "mymaster"),
            ("REDIS_PASSWORD", "hunter2"),
        ])
        .unwrap();
        assert!(!format!("{sentinel:?}").contains("hunter2"));
        assert!(sentinel.secrets().contains(&"hunter2".to_owned()));
        assert!(choose(&[("LOCK_BACKEND", "memory")])
            .unwrap_err()
            .contains("cannot see"));
        let both = choose(&[
            ("REDIS_URL", "redis://h:1"),
            ("REDLOCK_URLS", "redis://a:1"),
        ]);
        assert!(both.unwrap_err().contains("LOCK_BACKEND=redlock"));
        assert!(choose(&[])
            .unwrap_err()
            .contains("pass --redis-url or set REDIS_URL"));
    }

    #[test]
    fn etcd_and_zookeeper_are_read_from_the_variables_of_init_from_env() {
        let etcd = choose(&[
            ("LOCK_ETCD_ENDPOINTS", "a:2379, b:2379"),
            ("LOCK_ETCD_USER", "app"),
            ("LOCK_ETCD_PASSWORD", "hunter2"),
            ("LOCK_PREFIX", "svc:"),
        ])
        .unwrap();
        let Topology::Etcd(e) = &etcd else {
            panic!("{etcd:?}")
        };
        assert_eq!(e.endpoints, ["a:2379", "b:2379"]);
        assert_eq!(e.auth.as_ref().unwrap().user, "app");
        assert!(!format!("{etcd:?}").contains("hunter2"));
        assert!(etcd.secrets().contains(&"hunter2".to_owned()));
        let zookeeper = choose(&[
            ("LOCK_BACKEND", "ZooKeeper"),
            ("LOCK_ZOOKEEPER", "z1:2181,z2:2181/app"),
            ("LOCK_ZOOKEEPER_USER", "app"),
            ("LOCK_ZOOKEEPER_PASSWORD", "s3cret"),
        ])
        .unwrap();
        assert!(matches!(&zookeeper, Topology::Zookeeper(z) if z.connect == "z1:2181,z2:2181/app"));
        assert!(!format!("{zookeeper:?}").contains("s3cret"));
        assert!(zookeeper.secrets().contains(&"s3cret".to_owned()));
        assert_eq!(zookeeper.describe(), "servers z1:2181,z2:2181/app");
    }

    #[test]
    fn etcd_and_zookeeper_beside_another_backend_are_refused_as_init_from_env_does() {
        // Not read from the Redis variable that is also set: the locks are
        // in one place only, and the runtime refuses the same mix.
        let both = choose(&[
            ("LOCK_ETCD_ENDPOINTS", "h:2379"),
            ("REDIS_URL", "redis://h:1"),
        ]);
        assert!(both.unwrap_err().contains("unset one of them"));
        let both = choose(&[
            ("LOCK_ZOOKEEPER", "h:2181"),
            ("LOCK_ETCD_ENDPOINTS", "h:2379"),
        ]);
        assert!(both.unwrap_err().contains("unset one of them"));
        let named = choose(&[("LOCK_BACKEND", "etcd"), ("LOCK_ZOOKEEPER", "h:2181")]);
        assert!(named.unwrap_err().contains("unset one of them"));
        let none = choose(&[("LOCK_BACKEND", "etcd")]).unwrap_err();
        assert!(none.contains("LOCK_ETCD_ENDPOINTS is not set"), "{none}");
        let none = choose(&[("LOCK_BACKEND", "zookeeper")]).unwrap_err();
        assert!(none.contains("LOCK_ZOOKEEPER is not set"), "{none}");
        let half = choose(&[("LOCK_ETCD_ENDPOINTS", "h:2379"), ("LOCK_ETCD_USER", "app")]);
        assert!(half.unwrap_err().contains("or neither"));
        let flags = Flags {
            etcd: Some("h:2379"),
            zookeeper: Some("h:2181"),
            ..Flags::default()
        };
        assert!(Topology::choose(flags, env(&[])).is_err());
    }

    #[test]
    fn a_flag_overrides_the_environment_and_two_flags_are_refused() {
        let flags = Flags {
            cluster: Some("redis://a:1"),
            ..Flags::default()
        };
        let chosen = Topology::choose(flags, env(&[("REDIS_URL", "redis://h:1")])).unwrap();
        assert_eq!(chosen, Topology::Cluster(vec!["redis://a:1".to_owned()]));
        let two = Flags {
            redis_url: Some("redis://h:1"),
            ..flags
        };
        assert!(Topology::choose(two, env(&[])).is_err());
    }
}
