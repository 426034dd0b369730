//! Finding the primary of a Sentinel service: `SENTINEL
//! get-master-addr-by-name` on each sentinel in turn, then `ROLE` on the
//! address it names, so that a sentinel whose view is stale (the failover
//! it has not heard of yet, or a primary that died a moment ago) does not
//! send us to a replica or a dead node.
//!
//! Every step is bounded by the connect and response timeouts. URLs are
//! parsed here once and shown only as `host:port`: they may hold passwords.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionInfo, IntoConnectionInfo, Value};

use crate::backend::ConnectSettings;
use crate::error::{BackendError, LockError};

/// How the data nodes (primary and replicas) are reached: credentials and
/// database, the same on every node of the service.
#[derive(Clone, Default)]
pub(crate) struct NodeAuth {
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) db: u16,
}

impl NodeAuth {
    /// `redis://[user:password@]host:port/db` for the node at `address`
    /// (`host:port`), userinfo percent-encoded.
    pub(crate) fn url(&self, address: &str) -> String {
        let userinfo = match (&self.username, &self.password) {
            (user, Some(password)) => format!(
                "{}:{}@",
                encode(user.as_deref().unwrap_or("")),
                encode(password)
            ),
            (Some(user), None) => format!("{}@", encode(user)),
            (None, None) => String::new(),
        };
        format!("redis://{userinfo}{address}/{}", self.db)
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// One sentinel: where it is (`host:port`, for messages) and how to reach it.
#[derive(Clone)]
pub(crate) struct Sentinel {
    pub(crate) endpoint: String,
    pub(super) info: ConnectionInfo,
}

/// Parses the sentinel addresses: `redis://[user:password@]host:port` or
/// a bare `host:port`. Never echoes one (it may hold a password).
pub(crate) fn parse_sentinels(urls: &[String]) -> Result<Vec<Sentinel>, LockError> {
    if urls.is_empty() {
        return Err(LockError::InvalidConfig(
            "redis_sentinel needs at least one sentinel address (host:port)".to_owned(),
        ));
    }
    urls.iter()
        .enumerate()
        .map(|(n, url)| {
            let url = url.trim();
            let url = if url.contains("://") {
                url.to_owned()
            } else {
                format!("redis://{url}")
            };
            let invalid = || {
                LockError::InvalidConfig(format!(
                    "sentinel address #{} is not redis://[user:password@]host:port or \
                     host:port (it is not shown: it may hold a password)",
                    n + 1
                ))
            };
            if !url.starts_with("redis://") {
                return Err(invalid());
            }
            let info = url.into_connection_info().map_err(|_| invalid())?;
            Ok(Sentinel {
                endpoint: info.addr().to_string(),
                info,
            })
        })
        .collect()
}

/// The connection settings of every connection made here: the timeouts.
pub(super) fn config(settings: &ConnectSettings) -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_connection_timeout(Some(settings.connect_timeout))
        .set_response_timeout(Some(settings.response_timeout))
}

/// A connection to `info` made with `config`, bounded by the connect and
/// response timeouts.
pub(super) async fn open(
    info: ConnectionInfo,
    settings: &ConnectSettings,
    config: AsyncConnectionConfig,
) -> Result<MultiplexedConnection, String> {
    let client = redis::Client::open(info).map_err(|e| e.to_string())?;
    let bound = settings
        .connect_timeout
        .saturating_add(settings.response_timeout);
    match tokio::time::timeout(
        bound,
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
    {
        Ok(Ok(con)) => Ok(con),
        // (The parser's own words, `Unexpected '72'`, would not say it.)
        Ok(Err(e)) if e.kind() == redis::ErrorKind::Parse => Err(format!(
            "it did not answer as Redis: is that the Sentinel's (or Redis's) port, and, \
             for a TLS port, a rediss:// URL? ({e})"
        )),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {bound:?}")),
    }
}

/// One command on a fresh connection, bounded by the timeouts.
async fn ask<T: redis::FromRedisValue>(
    info: ConnectionInfo,
    settings: &ConnectSettings,
    cmd: &redis::Cmd,
) -> Result<T, String> {
    let mut con = open(info, settings, config(settings)).await?;
    let bound: Duration = settings.response_timeout;
    match tokio::time::timeout(bound, cmd.query_async(&mut con)).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {bound:?}")),
    }
}

/// The address (`host:port`) of the service's primary: the first that a
/// sentinel names and that answers `ROLE` as a master. The error lists what
/// each sentinel said.
pub(crate) async fn primary(
    sentinels: &[Sentinel],
    service: &str,
    auth: &NodeAuth,
    settings: &ConnectSettings,
) -> Result<String, BackendError> {
    let mut problems = Vec::with_capacity(sentinels.len());
    let mut known = false;
    let mut query = redis::cmd("SENTINEL");
    query.arg("get-master-addr-by-name").arg(service);
    for sentinel in sentinels {
        let named: Option<(String, u16)> = match ask(sentinel.info.clone(), settings, &query).await
        {
            Ok(named) => named,
            Err(e) => {
                problems.push(format!("sentinel {}: {e}", sentinel.endpoint));
                continue;
            }
        };
        let Some((host, port)) = named else {
            problems.push(format!(
                "sentinel {} does not monitor `{service}`",
                sentinel.endpoint
            ));
            continue;
        };
        known = true;
        let address = format!("{host}:{port}");
        match is_master(&address, auth, settings).await {
            Ok(true) => return Ok(address),
            Ok(false) => problems.push(format!(
                "sentinel {} names {address}, which is not a primary (ROLE)",
                sentinel.endpoint
            )),
            Err(e) => problems.push(format!(
                "sentinel {} names {address}, which does not answer: {e}",
                sentinel.endpoint
            )),
        }
    }
    let hint = if known {
        "a failover may be under way"
    } else {
        "check the service name and the sentinel addresses"
    };
    Err(BackendError::msg(format!(
        "no primary found for Redis Sentinel service `{service}` ({hint}): {}",
        problems.join("; ")
    )))
}

/// Whether the node at `address` says `ROLE` master.
pub(super) async fn is_master(
    address: &str,
    auth: &NodeAuth,
    settings: &ConnectSettings,
) -> Result<bool, String> {
    let info = auth
        .url(address)
        .into_connection_info()
        .map_err(|_| "not a usable address".to_owned())?;
    let role: Vec<Value> = ask(info, settings, &redis::cmd("ROLE")).await?;
    Ok(match role.first() {
        Some(Value::BulkString(bytes)) => bytes.as_slice() == b"master",
        Some(Value::SimpleString(text)) => text == "master",
        _ => false,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn node_urls_encode_credentials_and_carry_the_database() {
        let auth = NodeAuth {
            username: Some("app".to_owned()),
            password: Some("p@ss:w/rd".to_owned()),
            db: 3,
        };
        let url = auth.url("10.0.0.5:6380");
        assert_eq!(url, "redis://app:p%40ss%3Aw%2Frd@10.0.0.5:6380/3");
        let info = url.into_connection_info().unwrap();
        assert_eq!(info.redis_settings().password(), Some("p@ss:w/rd"));
        assert_eq!(info.redis_settings().db(), 3);
        assert_eq!(NodeAuth::default().url("h:1"), "redis://h:1/0");
    }

    #[test]
    fn sentinel_addresses_are_checked_without_being_echoed() {
        let parsed = parse_sentinels(&["h1:26379".to_owned(), "redis://h2:26380".to_owned()]);
        let endpoints: Vec<String> = parsed.unwrap().into_iter().map(|s| s.endpoint).collect();
        assert_eq!(endpoints, ["h1:26379", "h2:26380"]);
        let bad = ["http://:secret@h:1".to_owned()];
        let text = parse_sentinels(&bad).err().unwrap().to_string();
        assert!(text.contains("sentinel address #1"), "{text}");
        assert!(!text.contains("secret"), "{text}");
        assert!(parse_sentinels(&[]).is_err());
    }
}
