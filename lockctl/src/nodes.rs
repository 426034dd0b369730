//! The servers that store the locks, for what a runtime does not do: `SCAN`
//! every one of them (`list`) and subscribe to a release channel on each
//! (`watch`). One server; each master of a Cluster (from `CLUSTER SLOTS`,
//! asked of the first seed node that answers); the current primary of a
//! Sentinel service (asked of the sentinels by redis-rs); every Redlock
//! master. Reading and freeing a lock goes through the runtime instead.

use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Client, ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo, Value};

use crate::connect::Target;
use crate::topology::{Sentinel, Topology};
use crate::Failure;

/// The slots of a Redis Cluster.
const SLOT_SIZE: u16 = 16384;

/// One server that stores locks.
pub(crate) struct Node {
    /// How it is named in messages: `host:port`, or its URL masked.
    pub(crate) name: String,
    pub(crate) client: Client,
}

/// Every server that stores the target's locks. A Cluster whose slots are
/// not all served is noted as a gap (`Target::unreachable`).
pub(crate) async fn storing(target: &Target) -> Result<Vec<Node>, Failure> {
    match &target.topology {
        Topology::Single(url) => Ok(vec![node(target, url)?]),
        Topology::Redlock(masters) => masters.iter().map(|url| node(target, url)).collect(),
        Topology::Cluster(seeds) => cluster_masters(target, seeds).await,
        Topology::Sentinel(sentinel) => Ok(vec![sentinel_primary(target, sentinel).await?]),
        // Not Redis: `etcd.rs` and `zookeeper.rs` read those.
        Topology::Etcd(_) | Topology::Zookeeper(_) => Err(Failure(format!(
            "{} has no Redis server to ask",
            target.topology.describe()
        ))),
    }
}

fn node(target: &Target, url: &str) -> Result<Node, Failure> {
    let client =
        Client::open(url).map_err(|e| target.failure(&format!("invalid Redis URL: {e}")))?;
    Ok(Node {
        name: crate::secret::mask(url),
        client,
    })
}

/// The masters of a Cluster, as the first seed that answers sees them.
async fn cluster_masters(target: &Target, seeds: &[String]) -> Result<Vec<Node>, Failure> {
    let mut last = None;
    for seed in seeds {
        let info = seed
            .as_str()
            .into_connection_info()
            .map_err(|e| target.failure(&format!("invalid Redis URL: {e}")))?;
        let answer = async {
            let mut con = target.connect(&Client::open(info.clone())?).await?;
            redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async::<Value>(&mut con)
                .await
        };
        match answer.await {
            Ok(slots) => return Ok(masters_of(target, &info, &slots)),
            Err(error) => last = Some(error),
        }
    }
    Err(match last {
        Some(error) => target.failure(&error),
        None => Failure("no cluster node given".to_owned()),
    })
}

/// The masters listed in a `CLUSTER SLOTS` reply, reached like `seed` (its
/// user, password and TLS), each once.
fn masters_of(target: &Target, seed: &redis::ConnectionInfo, slots: &Value) -> Vec<Node> {
    let int = |v: Option<&Value>| match v {
        Some(Value::Int(n)) => Some(*n),
        _ => None,
    };
    let text = |v: Option<&Value>| match v {
        Some(Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
        Some(Value::SimpleString(s)) => Some(s.clone()),
        _ => None,
    };
    let mut covered = 0;
    let mut masters: Vec<(String, u16)> = Vec::new();
    let Value::Array(ranges) = slots else {
        return Vec::new();
    };
    for range in ranges {
        let Value::Array(fields) = range else {
            continue;
        };
        let (Some(start), Some(end)) = (int(fields.first()), int(fields.get(1))) else {
            continue;
        };
        covered += end - start + 1;
        let Some(Value::Array(master)) = fields.get(2) else {
            continue;
        };
        let (Some(host), Some(port)) = (text(master.first()), int(master.get(1))) else {
            continue;
        };
        // An empty or unknown address means "the node you asked".
        let host = match host.as_str() {
            "" | "?" => seed_host(seed),
            _ => host,
        };
        let Ok(port) = u16::try_from(port) else {
            continue;
        };
        if !masters.contains(&(host.clone(), port)) {
            masters.push((host, port));
        }
    }
    if covered < i64::from(SLOT_SIZE) {
        target.unreachable(
            "cluster",
            &format!(
                "only {covered} of {SLOT_SIZE} slots have a master: the locks of the others \
                 cannot be listed"
            ),
        );
    }
    masters
        .into_iter()
        .filter_map(|(host, port)| {
            let addr = match seed.addr() {
                ConnectionAddr::TcpTls {
                    insecure,
                    tls_params,
                    ..
                } => ConnectionAddr::TcpTls {
                    host: host.clone(),
                    port,
                    insecure: *insecure,
                    tls_params: tls_params.clone(),
                },
                _ => ConnectionAddr::Tcp(host.clone(), port),
            };
            let client = Client::open(seed.clone().set_addr(addr)).ok()?;
            Some(Node {
                name: format!("{host}:{port}"),
                client,
            })
        })
        .collect()
}

fn seed_host(seed: &redis::ConnectionInfo) -> String {
    match seed.addr() {
        ConnectionAddr::Tcp(host, _) | ConnectionAddr::TcpTls { host, .. } => host.clone(),
        ConnectionAddr::Unix(path) => path.display().to_string(),
        _ => String::new(),
    }
}

/// The primary the sentinels name now (redis-rs asks them in turn).
async fn sentinel_primary(target: &Target, s: &Sentinel) -> Result<Node, Failure> {
    let sentinels: Vec<String> = s
        .sentinels
        .iter()
        .map(|a| match a.contains("://") {
            true => a.clone(),
            false => format!("redis://{a}"),
        })
        .collect();
    let mut auth = RedisConnectionInfo::default();
    if let Some(username) = &s.username {
        auth = auth.set_username(username);
    }
    if let Some(password) = &s.password {
        auth = auth.set_password(password);
    }
    if let Some(db) = s.db {
        auth = auth.set_db(db.into());
    }
    let primary = async {
        let mut client = SentinelClient::build(
            sentinels,
            s.service.clone(),
            Some(SentinelNodeConnectionInfo::default().set_redis_connection_info(auth)),
            SentinelServerType::Master,
        )?;
        client.async_get_client().await
    };
    let client = tokio::time::timeout(crate::connect::TIMEOUT, primary)
        .await
        .map_err(|_| target.failure(&"the sentinels did not name a primary in time"))?
        .map_err(|e| target.failure(&e))?;
    let name = match client.get_connection_info().addr() {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            format!("primary {host}:{port}")
        }
        other => format!("primary {other}"),
    };
    Ok(Node { name, client })
}
