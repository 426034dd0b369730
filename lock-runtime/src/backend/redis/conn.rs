//! The one connection of a Redis backend: to a single server, or to a Redis
//! Cluster. Everything above this file sends commands and pipelines the same
//! way; the differences of a cluster stay here:
//!
//! - **Release channels are sharded** (`SSUBSCRIBE`, and the scripts publish
//!   with `SPUBLISH`): a message goes only to the node that owns the
//!   channel's slot, which is the lock's own slot, since every name of a lock
//!   shares its hash tag. Plain `PUBLISH` would be broadcast over the
//!   cluster bus to every node.
//! - **A pipeline stays in one slot** (the cluster client refuses others):
//!   [`Con::slot_groups`] splits a batch by slot, and the groups are sent
//!   concurrently, each as one pipeline.

use std::collections::HashMap;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

/// A connection to one server or to a cluster (cheap to clone: both are
/// handles to a multiplexed connection task).
#[derive(Clone)]
pub(crate) enum Con {
    /// One server (a redis-rs `ConnectionManager`: reconnects by itself).
    Single(ConnectionManager),
    /// A Redis Cluster (routes by key, follows `MOVED`/`ASK`, re-subscribes
    /// after reconnects and slot moves).
    Cluster(ClusterConnection),
}

impl Con {
    /// Whether this is a cluster connection (the scripts then publish with
    /// `SPUBLISH`).
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Con::Cluster(_))
    }

    /// Subscribes to a lock's release channel (sharded on a cluster).
    pub(crate) async fn subscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Con::Single(c) => c.subscribe(channel).await,
            Con::Cluster(c) => c.ssubscribe(channel).await,
        }
    }

    /// Unsubscribes from a lock's release channel.
    pub(crate) async fn unsubscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Con::Single(c) => c.unsubscribe(channel).await,
            Con::Cluster(c) => c.sunsubscribe(channel).await,
        }
    }

    /// Splits a batch of commands on these lock names into groups that may
    /// share a pipeline: one group on a single server; one per slot on a
    /// cluster. Each group lists indexes into `locks`, in order.
    pub(crate) fn slot_groups<'a>(&self, locks: impl Iterator<Item = &'a str>) -> Vec<Vec<usize>> {
        match self {
            Con::Single(_) => vec![locks.enumerate().map(|(i, _)| i).collect()],
            Con::Cluster(_) => {
                let mut groups: Vec<Vec<usize>> = Vec::new();
                let mut by_slot: HashMap<Slot, usize> = HashMap::new();
                for (i, lock) in locks.enumerate() {
                    let group = *by_slot.entry(Slot::for_key(lock)).or_insert_with(|| {
                        groups.push(Vec::new());
                        groups.len() - 1
                    });
                    groups[group].push(i);
                }
                groups
            }
        }
    }

    /// Sends one command per lock of `locks` (made by `command`) as
    /// pipelines that each stay in one slot, all at once, and returns the
    /// replies in the order of `locks` (`Err` for a command the server
    /// refused). A pipeline that fails as a whole fails each of its
    /// commands; when every pipeline failed, that error is the answer.
    pub(crate) async fn pipelined<L, T>(
        &self,
        locks: &[L],
        command: impl Fn(&L) -> Cmd,
    ) -> RedisResult<Vec<RedisResult<T>>>
    where
        L: OnLock,
        T: redis::FromRedisValue,
    {
        let groups = self.slot_groups(locks.iter().map(OnLock::lock_key));
        let sends = groups.iter().map(|group| {
            let mut pipe = redis::pipe();
            for &i in group {
                pipe.add_command(command(&locks[i]));
            }
            let mut con = self.clone();
            async move {
                let replies: RedisResult<Vec<RedisResult<T>>> =
                    pipe.ignore_errors().query_async(&mut con).await;
                replies
            }
        });
        let outcomes = futures_util::future::join_all(sends).await;
        if let Some(Err(error)) = outcomes.iter().find(|o| o.is_err()) {
            if outcomes.iter().all(Result::is_err) {
                return Err(error.clone());
            }
        }
        let mut replies: Vec<Option<RedisResult<T>>> = locks.iter().map(|_| None).collect();
        for (group, outcome) in groups.iter().zip(outcomes) {
            match outcome {
                Ok(values) => {
                    for (&i, value) in group.iter().zip(values) {
                        replies[i] = Some(value);
                    }
                }
                Err(error) => {
                    for &i in group {
                        replies[i] = Some(Err(error.clone()));
                    }
                }
            }
        }
        Ok(replies
            .into_iter()
            .map(|reply| {
                reply.unwrap_or_else(|| {
                    Err(redis::RedisError::from((
                        redis::ErrorKind::Io,
                        "a pipeline answered fewer replies than it had commands",
                    )))
                })
            })
            .collect())
    }
}

/// A command's subject: the lock (by its backend name) it acts on, which
/// decides its slot.
pub(crate) trait OnLock {
    /// The lock's backend name.
    fn lock_key(&self) -> &str;
}

impl OnLock for std::sync::Arc<crate::held::HeldLock> {
    fn lock_key(&self) -> &str {
        &self.lock_key
    }
}

/// A group of fair places of one slot (`Backend::refresh_places`).
impl OnLock for Vec<&crate::backend::PlaceRefresh> {
    fn lock_key(&self) -> &str {
        self.first().map_or("", |p| p.lock_key.as_str())
    }
}

impl OnLock for crate::backend::releases::ReleaseJob {
    fn lock_key(&self) -> &str {
        &self.0
    }
}

impl ConnectionLike for Con {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Con::Single(c) => c.req_packed_command(cmd),
            Con::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Con::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Con::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Con::Single(c) => c.get_db(),
            Con::Cluster(c) => c.get_db(),
        }
    }
}
