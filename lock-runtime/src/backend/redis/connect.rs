//! Connecting to Redis: the URL (checked without ever echoing it), TLS, the
//! connection manager with RESP3 pushes routed to the waiters, and the
//! waiters' way to the subscription task and the releaser.

use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{IntoConnectionInfo, ProtocolVersion, PushInfo, PushKind, RedisError, Value};
use tokio::sync::mpsc;

use super::conn::Con;
use super::heard::Heard;
use super::scripts::{load_scripts, Scripts};
use super::tasks::{releaser, send, subscriptions, SubscriptionCommand};
use super::{ms, RedisBackend};
use crate::backend::releases::ReleaseQueue;
use crate::backend::{ConnectSettings, Wakeups, Watched, Watches};
use crate::error::{BackendError, LockError};
use crate::names::LockNames;

/// Makes the client, with TLS settings when the URL asks for TLS.
fn client_for(
    info: redis::ConnectionInfo,
    settings: &ConnectSettings,
) -> Result<redis::Client, LockError> {
    let tls = url_is_tls(&info);
    if !tls {
        return redis::Client::open(info)
            .map_err(|_| LockError::InvalidConfig("invalid Redis URL".to_owned()));
    }
    tls_client(info, settings)
}

fn url_is_tls(info: &redis::ConnectionInfo) -> bool {
    matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. })
}

#[cfg(feature = "tls")]
fn tls_client(
    info: redis::ConnectionInfo,
    settings: &ConnectSettings,
) -> Result<redis::Client, LockError> {
    // rustls needs a process-wide crypto provider; another part of the
    // program may have installed one already, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    if settings.tls_root_ca.is_none() && settings.tls_client.is_none() {
        return redis::Client::open(info)
            .map_err(|_| LockError::InvalidConfig("invalid Redis URL".to_owned()));
    }
    redis::Client::build_with_tls(info, certificates(settings)).map_err(|e| {
        LockError::InvalidConfig(format!(
            "unusable TLS certificates (PEM expected): {}",
            e.detail().unwrap_or("could not parse them")
        ))
    })
}

#[cfg(not(feature = "tls"))]
fn tls_client(
    _info: redis::ConnectionInfo,
    _settings: &ConnectSettings,
) -> Result<redis::Client, LockError> {
    Err(LockError::InvalidConfig(
        "rediss:// (TLS) needs the `tls` feature of lock-runtime: \
         lock-runtime = { version = \"…\", features = [\"tls\"] }"
            .to_owned(),
    ))
}

/// Checks the URL's shape without echoing it (it may hold a password).
fn parse_url(url: &str) -> Result<redis::ConnectionInfo, LockError> {
    let shape = "expected redis://[user[:password]@]host[:port][/db] or rediss://… \
                 (the URL is not shown: it may hold a password)";
    if let Some(problem) = unsupported_url(url) {
        return Err(LockError::InvalidConfig(problem.to_owned()));
    }
    if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
        return Err(LockError::InvalidConfig(format!(
            "invalid Redis URL: {shape}"
        )));
    }
    let info = url
        .into_connection_info()
        .map_err(|_| LockError::InvalidConfig(format!("invalid Redis URL: {shape}")))?;
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    Ok(info.set_redis_settings(settings))
}

/// What is wrong with a URL of a kind this version cannot use, in words a
/// user can act on (never echoing the URL, which may hold a password).
fn unsupported_url(url: &str) -> Option<&'static str> {
    let url = url.trim();
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    let scheme = scheme.to_ascii_lowercase();
    if scheme.contains("sentinel") {
        return Some(
            "invalid Redis URL: a redis+sentinel:// URL is not taken by .redis(url); Redis \
             Sentinel is configured with LockRuntimeBuilder::redis_sentinel(sentinels, \
             service), or with init_from_env's REDIS_SENTINELS=host:port,host:port and \
             REDIS_SENTINEL_SERVICE=<service> (REDIS_PASSWORD for the data nodes)",
        );
    }
    if scheme.contains("cluster") {
        return Some(
            "invalid Redis URL: a Redis Cluster is given as its nodes' redis://host:port URLs \
             to LockRuntimeBuilder::redis_cluster, or in LOCK_REDIS_CLUSTER \
             (redis://n1:7000,redis://n2:7000)",
        );
    }
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    if rest.contains(',') || url.split_whitespace().nth(1).is_some() {
        return Some(
            "invalid Redis URL: .redis(url) takes one server, not a list. A Redis Cluster's \
             nodes go to LockRuntimeBuilder::redis_cluster or LOCK_REDIS_CLUSTER; \
             independent Redlock masters to LockRuntimeBuilder::redlock or REDLOCK_URLS; \
             sentinels to LockRuntimeBuilder::redis_sentinel or REDIS_SENTINELS (with \
             REDIS_SENTINEL_SERVICE); each as comma-separated redis://host:port URLs",
        );
    }
    if scheme == "rediss" && !cfg!(feature = "tls") {
        return Some(
            "rediss:// (TLS) needs the `tls` feature of lock-runtime: \
             lock-runtime = { version = \"…\", features = [\"tls\"] }",
        );
    }
    None
}

/// Connects to one server, loads the scripts and starts the subscription
/// and release tasks. Must run on the runtime's worker thread (the tasks are
/// spawned there). Releases and handoffs are told to `wakeups`; the waiters
/// reach the subscription task and the releaser through the returned
/// [`Watches`].
pub(crate) async fn connect(
    url: &str,
    settings: &ConnectSettings,
    wakeups: Weak<dyn Wakeups>,
) -> Result<(RedisBackend, Arc<dyn Watches>), LockError> {
    let info = parse_url(url)?;
    let endpoint = info.addr().to_string();
    let client = client_for(info, settings)?;
    let (sub_tx, sub_rx) = mpsc::unbounded_channel();
    let heard = Arc::new(Heard::default());
    let pushes = push_handler(wakeups, heard.clone(), sub_tx.downgrade());
    let config = ConnectionManagerConfig::new()
        .set_push_sender(pushes)
        .set_automatic_resubscription()
        .set_connection_timeout(Some(settings.connect_timeout))
        .set_response_timeout(Some(settings.response_timeout))
        .set_number_of_retries(3)
        .set_max_delay(Duration::from_secs(1));
    let connecting = ConnectionManager::new_with_config(client.clone(), config);
    let con = match within_connect_timeout(settings, &endpoint, connecting).await {
        Ok(con) => con,
        Err(e) => return Err(not_redis(&client, settings, &endpoint).await.unwrap_or(e)),
    };
    refuse_a_cluster_node(&mut con.clone(), &endpoint).await?;
    let con = Con::Single(con);
    let subscriptions = (sub_tx, sub_rx, heard);
    start((con.clone(), con), endpoint, settings, subscriptions).await
}

/// A Cluster node given as one server accepts the connection and the
/// scripts, then answers every lock's script with `MOVED`: ask it (`INFO
/// cluster`, one round trip at start) and refuse it, naming the setting for a
/// Cluster. A server that does not let us ask (an ACL user without `info`)
/// is taken at its word.
async fn refuse_a_cluster_node(
    con: &mut ConnectionManager,
    endpoint: &str,
) -> Result<(), LockError> {
    let info: Result<String, RedisError> = redis::cmd("INFO").arg("cluster").query_async(con).await;
    match info {
        Ok(text) if text.lines().any(|line| line.trim() == "cluster_enabled:1") => {
            Err(LockError::InvalidConfig(format!(
                "the server at {endpoint} is a Redis Cluster node (cluster_enabled:1), given \
                 as a single server: give the cluster's nodes to \
                 LockRuntimeBuilder::redis_cluster, or set \
                 LOCK_REDIS_CLUSTER=redis://{endpoint},… instead of REDIS_URL"
            )))
        }
        _ => Ok(()),
    }
}

/// [`connect`] for a Redis Cluster, given some of its nodes (the client
/// learns the rest, and the slots, from them).
pub(crate) async fn connect_cluster(
    urls: &[String],
    settings: &ConnectSettings,
    wakeups: Weak<dyn Wakeups>,
) -> Result<(RedisBackend, Arc<dyn Watches>), LockError> {
    if urls.is_empty() {
        return Err(LockError::InvalidConfig(
            "redis_cluster needs the URL of at least one cluster node".to_owned(),
        ));
    }
    let infos = urls
        .iter()
        .map(|url| parse_url(url))
        .collect::<Result<Vec<_>, _>>()?;
    let nodes: Vec<String> = infos.iter().map(|info| info.addr().to_string()).collect();
    let endpoint = format!("cluster nodes {}", nodes.join(", "));
    let (sub_tx, sub_rx) = mpsc::unbounded_channel();
    let heard = Arc::new(Heard::default());
    // Two connections: one for commands, one for the sharded subscriptions
    // (with the pushes). A node that gives a slot away sends its
    // subscribers an SUNSUBSCRIBE of its own accord, which redis-rs 1.8
    // takes as the reply of the oldest command in flight on that
    // connection, shifting every later reply by one
    // (`tests/tests/cluster.rs`). On a connection that carries only
    // subscribe commands, no script ever gets a wrong reply; a subscribe
    // that does is caught by waiting for the channel's own confirmation
    // (`heard.rs`).
    let client = |infos: Vec<redis::ConnectionInfo>, pushes| {
        let mut builder = redis::cluster::ClusterClientBuilder::new(infos)
            .use_protocol(ProtocolVersion::RESP3)
            .connection_timeout(settings.connect_timeout)
            .response_timeout(settings.response_timeout)
            .retries(3)
            .max_retry_wait(1000);
        if let Some(pushes) = pushes {
            builder = builder.push_sender(pushes);
        }
        cluster_tls(builder, settings)?.build().map_err(|e| {
            LockError::InvalidConfig(format!(
                "invalid Redis Cluster configuration: {}",
                e.detail().unwrap_or("the node URLs do not agree")
            ))
        })
    };
    let commands = client(infos.clone(), None)?;
    let pushes = push_handler(wakeups, heard.clone(), sub_tx.downgrade());
    let listening = client(infos, Some(pushes))?;
    let con =
        match within_connect_timeout(settings, &endpoint, commands.get_async_connection()).await {
            Ok(con) => con,
            Err(e) => {
                return Err(a_node_not_redis(&infos_of(urls), settings)
                    .await
                    .unwrap_or(e))
            }
        };
    let listen =
        within_connect_timeout(settings, &endpoint, listening.get_async_connection()).await?;
    let cons = (Con::Cluster(con), Con::Cluster(listen));
    start(cons, endpoint, settings, (sub_tx, sub_rx, heard)).await
}

#[cfg(feature = "tls")]
fn cluster_tls(
    builder: redis::cluster::ClusterClientBuilder,
    settings: &ConnectSettings,
) -> Result<redis::cluster::ClusterClientBuilder, LockError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    if settings.tls_root_ca.is_none() && settings.tls_client.is_none() {
        return Ok(builder);
    }
    Ok(builder.certs(certificates(settings)))
}

/// The configured private CA and client certificate, for redis-rs.
#[cfg(feature = "tls")]
fn certificates(settings: &ConnectSettings) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: settings
            .tls_client
            .clone()
            .map(|(client_cert, client_key)| redis::ClientTlsConfig {
                client_cert,
                client_key,
            }),
        root_cert: settings.tls_root_ca.clone(),
    }
}

#[cfg(not(feature = "tls"))]
fn cluster_tls(
    builder: redis::cluster::ClusterClientBuilder,
    _settings: &ConnectSettings,
) -> Result<redis::cluster::ClusterClientBuilder, LockError> {
    Ok(builder)
}

/// Awaits a connection attempt, bounded by twice the connect timeout.
async fn within_connect_timeout<C>(
    settings: &ConnectSettings,
    endpoint: &str,
    connecting: impl std::future::Future<Output = Result<C, RedisError>>,
) -> Result<C, LockError> {
    let limit = settings.connect_timeout.saturating_mul(2);
    match tokio::time::timeout(limit, connecting).await {
        Ok(Ok(con)) => Ok(con),
        Ok(Err(e)) if e.kind() == redis::ErrorKind::Parse => Err(not_redis_error(endpoint, e)),
        Ok(Err(e)) => {
            Err(BackendError::new(format!("cannot connect to Redis at {endpoint}"), e).into())
        }
        Err(_) => Err(BackendError::msg(format!(
            "cannot connect to Redis at {endpoint}: no answer within {limit:?}"
        ))
        .into()),
    }
}

/// Why connecting failed, when the reason is that the server does not speak
/// Redis: the connection manager retries a garbled answer until the connect
/// timeout, which would then be all the user hears. One plain attempt
/// (bounded by the connect timeout) tells; only on the failure path.
async fn not_redis(
    client: &redis::Client,
    settings: &ConnectSettings,
    endpoint: &str,
) -> Option<LockError> {
    let attempt = client.get_multiplexed_async_connection();
    match tokio::time::timeout(settings.connect_timeout, attempt).await {
        Ok(Err(e)) if e.kind() == redis::ErrorKind::Parse => Some(not_redis_error(endpoint, e)),
        _ => None,
    }
}

/// The cluster client reports a node that does not speak Redis as a failed
/// cluster connection, with the parser's words: ask each node on its own.
async fn a_node_not_redis(
    nodes: &[(redis::ConnectionInfo, String)],
    settings: &ConnectSettings,
) -> Option<LockError> {
    for (info, endpoint) in nodes {
        let Ok(client) = redis::Client::open(info.clone()) else {
            continue;
        };
        if let Some(error) = not_redis(&client, settings, endpoint).await {
            return Some(error);
        }
    }
    None
}

/// Each node URL's connection info and address (the URLs parsed already).
fn infos_of(urls: &[String]) -> Vec<(redis::ConnectionInfo, String)> {
    urls.iter()
        .filter_map(|url| parse_url(url).ok())
        .map(|info| {
            let endpoint = info.addr().to_string();
            (info, endpoint)
        })
        .collect()
}

/// Something answered, but not in Redis's protocol: another service's port
/// (HTTP, a database) or a TLS port dialled without TLS. The parser's own
/// words (`Unexpected '84'`) would not say that.
fn not_redis_error(endpoint: &str, e: RedisError) -> LockError {
    BackendError::new(
        format!(
            "the server at {endpoint} did not answer as Redis: is that the Redis port \
             (and, for a TLS port, a rediss:// URL)?"
        ),
        e,
    )
    .into()
}

/// Loads the scripts over `con` and starts the backend's tasks; the
/// subscriptions go over `listen` (the same connection on a single server).
async fn start(
    (con, listen): (Con, Con),
    endpoint: String,
    settings: &ConnectSettings,
    (sub_tx, sub_rx, heard): (
        mpsc::UnboundedSender<SubscriptionCommand>,
        mpsc::UnboundedReceiver<SubscriptionCommand>,
        Arc<Heard>,
    ),
) -> Result<(RedisBackend, Arc<dyn Watches>), LockError> {
    let endpoint: Arc<str> = endpoint.into();
    let scripts = Arc::new(Scripts::new(con.is_cluster()));
    load_scripts(&mut con.clone(), &scripts)
        .await
        .map_err(|e| {
            BackendError::new(
                format!("cannot load lock scripts into Redis at {endpoint}"),
                e,
            )
        })?;

    let (releases, release_jobs) = ReleaseQueue::new();
    let window: Arc<str> = ms(settings.fence_window).into();
    tokio::spawn(subscriptions(listen, heard, sub_rx, sub_tx.downgrade()));
    tokio::spawn(releaser(
        con.clone(),
        scripts.clone(),
        window.clone(),
        release_jobs,
        releases.pending().clone(),
    ));

    let watches = Arc::new(RedisWatches {
        subscriptions: sub_tx,
        releases: releases.clone(),
    });
    let backend = RedisBackend {
        con,
        scripts,
        releases,
        endpoint,
        window,
        reserve: settings.fence_reserve.to_string().into(),
    };
    Ok((backend, watches))
}

/// The waiters' way to the subscription task and the releaser.
#[derive(Debug)]
struct RedisWatches {
    subscriptions: mpsc::UnboundedSender<SubscriptionCommand>,
    releases: ReleaseQueue,
}

impl Watches for RedisWatches {
    fn watch(&self, lock: &str, watched: Arc<dyn Watched>) {
        let command = SubscriptionCommand::Subscribe(LockNames::channel(lock), watched);
        if let Err(mpsc::error::SendError(SubscriptionCommand::Subscribe(_, watched))) =
            self.subscriptions.send(command)
        {
            // The runtime is stopping: waiters fall back to the lease.
            watched.set_ready();
        }
    }

    fn unwatch(&self, lock: &str) {
        let channel = LockNames::channel(lock);
        let _ = self
            .subscriptions
            .send(SubscriptionCommand::Unsubscribe(channel));
    }

    fn give_back_place(&self, lock: String, holder: String) {
        self.releases.send(lock, holder, true);
    }
}

/// Routes RESP3 pushes: a release message wakes one waiter of its key, a
/// handoff message ("g <holder> <fence>", fair mode) is delivered to the
/// process it names; a lost connection wakes everyone. Every (un)subscribe
/// confirmation is noted in `heard`, by its channel. On a cluster, a node
/// that gives a slot away unsubscribes its clients from the slot's sharded
/// channels: the subscription task is asked to subscribe again (at the
/// slot's new node) if the channel is still wanted.
fn push_handler(
    wakeups: Weak<dyn Wakeups>,
    heard: Arc<Heard>,
    subscriptions: mpsc::WeakUnboundedSender<SubscriptionCommand>,
) -> impl Fn(PushInfo) -> Result<(), ()> + Send + Sync {
    move |push: PushInfo| {
        let Some(wakeups) = wakeups.upgrade() else {
            return Err(());
        };
        match push.kind {
            PushKind::Subscribe | PushKind::SSubscribe | PushKind::Unsubscribe => {
                if let Some(channel) = text(push.data.first()) {
                    heard.heard(channel, push.kind != PushKind::Unsubscribe);
                }
            }
            PushKind::SUnsubscribe => {
                if let Some(channel) = text(push.data.first()) {
                    heard.heard(channel, false);
                    send(
                        &subscriptions,
                        SubscriptionCommand::Resubscribe(channel.to_owned()),
                    );
                }
            }
            PushKind::Message | PushKind::SMessage => {
                if let Some(channel) = text(push.data.first()) {
                    let lock = LockNames::hash_of_channel(channel);
                    match text(push.data.get(1)).and_then(parse_handoff) {
                        Some((holder, fence, upto)) => {
                            wakeups.handed_over(lock, holder, fence, upto)
                        }
                        None => wakeups.released(lock),
                    }
                }
            }
            PushKind::Disconnection => {
                wakeups.connection_lost();
                send(
                    &subscriptions,
                    SubscriptionCommand::ResubscribeAll { again: true },
                );
            }
            _ => {}
        }
        Ok(())
    }
}

/// The text of a bulk string in a push.
fn text(value: Option<&Value>) -> Option<&str> {
    match value {
        Some(Value::BulkString(bytes)) => std::str::from_utf8(bytes).ok(),
        _ => None,
    }
}

/// Parses a fair-mode handoff message: `g <holder id> <fence> <upto>` (the
/// last token reserved with it; absent from an earlier version's message).
fn parse_handoff(message: &str) -> Option<(&str, u64, u64)> {
    let mut words = message.strip_prefix("g ")?.split(' ');
    let holder = words.next()?;
    let fence: u64 = words.next()?.parse().ok()?;
    let upto = words
        .next()
        .and_then(|u| u.parse::<u64>().ok())
        .map_or(fence, |u| u.max(fence));
    Some((holder, fence, upto))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::parse_url;

    fn error(url: &str) -> String {
        parse_url(url).unwrap_err().to_string()
    }

    #[test]
    fn urls_of_other_deployments_point_to_the_variables_that_configure_them() {
        for url in [
            "redis+sentinel://:secret@s1:26379,s2:26379/mymaster",
            "redis-sentinel://s1:26379",
            "sentinel://s1:26379",
        ] {
            let text = error(url);
            assert!(!text.contains("not supported"), "{url}: {text}");
            assert!(
                text.contains("redis_sentinel") && text.contains("REDIS_SENTINELS"),
                "{url}: {text}"
            );
            assert!(!text.contains("secret"), "{text}");
        }
        for url in ["redis+cluster://n1:7000", "redis-cluster://n1:7000,n2:7001"] {
            assert!(error(url).contains("redis_cluster"), "{url}");
        }
        for url in [
            "redis://:secret@n1:7000,n2:7001",
            "redis://n1:6379 redis://n2:6379",
        ] {
            let text = error(url);
            for pointer in ["LOCK_REDIS_CLUSTER", "REDLOCK_URLS", "REDIS_SENTINELS"] {
                assert!(text.contains(pointer), "{url}: {text}");
            }
            assert!(!text.contains("secret"), "{text}");
        }
        assert!(error("http://localhost").contains("expected redis://"));
        assert!(parse_url("redis://127.0.0.1:6379/2").is_ok());
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn a_tls_url_without_the_tls_feature_names_the_feature() {
        let text = error("rediss://:secret@cache.example:6380");
        assert!(text.contains("the `tls` feature"), "{text}");
        assert!(!text.contains("secret"), "{text}");
    }
}
