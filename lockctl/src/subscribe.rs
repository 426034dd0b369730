//! The release messages of one lock, from every server that stores it: on
//! one server or a Sentinel primary its release channel; on a Cluster the
//! sharded channel (`SSUBSCRIBE`, which redis-rs sends to the node that owns
//! the lock's slot); on Redlock the channel on every master (each release
//! is then announced once per master). All as RESP3 pushes into one queue.
//! etcd and ZooKeeper send no release message: there a watch on the lock's
//! contenders (`etcd.rs`, `zookeeper.rs`) says that something changed.

use lock_runtime::{layout, LockRuntime};
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Client, ProtocolVersion, PushInfo, PushKind, Value};
use tokio::sync::mpsc;

use crate::connect::{Target, TIMEOUT};
use crate::heard::{Heard, Stop};
use crate::nodes;
use crate::topology::Topology;
use crate::Failure;

/// Subscriptions to one lock's release channel, or a watch of its
/// contenders; dropped, they end.
pub(crate) struct Releases {
    pushes: mpsc::UnboundedReceiver<PushInfo>,
    /// etcd, ZooKeeper: what the watch heard.
    heard: Option<(mpsc::UnboundedReceiver<Heard>, Stop)>,
    _single: Vec<MultiplexedConnection>,
    _cluster: Option<ClusterConnection>,
}

impl Releases {
    /// The next message or loss; `None` when every connection is gone.
    pub(crate) async fn next(&mut self) -> Option<Heard> {
        if let Some((heard, _)) = &mut self.heard {
            return heard.recv().await;
        }
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

/// Subscribes to the release channel of `key` on every server that stores
/// the target's locks (etcd, ZooKeeper: watches its contenders). A Redlock
/// master that does not answer is noted as a gap; on the other topologies a
/// failure ends the command.
pub(crate) async fn subscribe(
    target: &Target,
    runtime: &LockRuntime,
    key: &str,
) -> Result<Releases, Failure> {
    let (tx, pushes) = mpsc::unbounded_channel();
    let mut releases = Releases {
        pushes,
        heard: None,
        _single: Vec::new(),
        _cluster: None,
    };
    #[cfg(any(feature = "etcd", feature = "zookeeper"))]
    {
        let (told, heard) = mpsc::unbounded_channel();
        let stop = match &target.topology {
            #[cfg(feature = "etcd")]
            Topology::Etcd(etcd) => {
                Some(crate::etcd::watch(target, etcd, runtime, key, told).await?)
            }
            #[cfg(feature = "zookeeper")]
            Topology::Zookeeper(zk) => {
                Some(crate::zookeeper::watch(target, zk, runtime, key, told).await?)
            }
            _ => None,
        };
        if let Some(stop) = stop {
            releases.heard = Some((heard, stop));
            return Ok(releases);
        }
    }
    let channel = layout::release_channel(&runtime.backend_key(key));
    let channel = channel.as_str();
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
