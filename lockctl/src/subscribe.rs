//! The release messages of one lock, from every server that stores it: on
//! one server or a Sentinel primary its release channel; on a Cluster the
//! sharded channel (`SSUBSCRIBE`, which redis-rs sends to the node that owns
//! the lock's slot); on Redlock the channel on every master (each release
//! is then announced once per master). All as RESP3 pushes into one queue.

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Client, ProtocolVersion, PushInfo, PushKind, Value};
use tokio::sync::mpsc;

use crate::connect::{Target, TIMEOUT};
use crate::nodes;
use crate::topology::Topology;
use crate::Failure;

/// What arrives on the channel.
pub(crate) enum Heard {
    /// A release message, with its payload (`1`, `f` forced, `g …` handed
    /// over).
    Message(String),
    /// A connection was lost: releases may be missed from now on.
    Lost,
}

/// Subscriptions to one lock's release channel; dropped, they end.
pub(crate) struct Releases {
    pushes: mpsc::UnboundedReceiver<PushInfo>,
    _single: Vec<MultiplexedConnection>,
    _cluster: Option<ClusterConnection>,
}

impl Releases {
    /// The next message or loss; `None` when every connection is gone.
    pub(crate) async fn next(&mut self) -> Option<Heard> {
        // Bounded: each turn consumes one push; subscription confirmations
        // and other pushes are skipped.
        loop {
            let push = self.pushes.recv().await?;
            match push.kind {
                PushKind::Message | PushKind::SMessage => {
                    let payload = match push.data.get(1) {
                        Some(Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).into(),
                        _ => String::new(),
                    };
                    return Some(Heard::Message(payload));
                }
                PushKind::Disconnection => return Some(Heard::Lost),
                _ => {}
            }
        }
    }
}

/// Subscribes to `channel` on every server that stores the target's locks.
/// A Redlock master that does not answer is noted as a gap; on the other
/// topologies a failure ends the command.
pub(crate) async fn subscribe(target: &Target, channel: &str) -> Result<Releases, Failure> {
    let (tx, pushes) = mpsc::unbounded_channel();
    let mut releases = Releases {
        pushes,
        _single: Vec::new(),
        _cluster: None,
    };
    if let Topology::Cluster(seeds) = &target.topology {
        let subscribed = async {
            let client = redis::cluster::ClusterClientBuilder::new(seeds.clone())
                .use_protocol(ProtocolVersion::RESP3)
                .connection_timeout(TIMEOUT)
                .response_timeout(TIMEOUT)
                .push_sender(tx)
                .build()?;
            let mut con = client.get_async_connection().await?;
            con.ssubscribe(channel).await?;
            Ok::<_, redis::RedisError>(con)
        };
        releases._cluster = Some(subscribed.await.map_err(|e| target.failure(&e))?);
        return Ok(releases);
    }
    let redlock = matches!(target.topology, Topology::Redlock(_));
    for node in nodes::storing(target).await? {
        let info = node.client.get_connection_info().clone();
        let resp3 = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let subscribed = async {
            let client = Client::open(info.set_redis_settings(resp3))?;
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(TIMEOUT))
                .set_response_timeout(Some(TIMEOUT))
                .set_push_sender(tx.clone());
            let mut con = client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            con.subscribe(channel).await?;
            Ok::<_, redis::RedisError>(con)
        };
        match subscribed.await {
            Ok(con) => releases._single.push(con),
            Err(error) if redlock => target.unreachable(&node.name, &error),
            Err(error) => return Err(target.failure(&error)),
        }
    }
    Ok(releases)
}
