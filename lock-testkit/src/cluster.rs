//! A private Redis Cluster on loopback ports: N masters, each a
//! [`RedisServer`] in cluster mode, with the 16384 slots split evenly, joined
//! with `CLUSTER MEET`; and the one fault a cluster adds, moving a slot (with
//! its keys) from one master to another while clients use it.
//!
//! No replicas and no `redis-cli --cluster`: `CLUSTER ADDSLOTSRANGE` and
//! `CLUSTER MEET` are all it takes, and the cluster is up in about a second.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use redis::Connection;

use crate::server::RedisServer;

/// Slots in a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// How long the nodes may take to agree that the cluster is up.
const UP_LIMIT: Duration = Duration::from_secs(20);

/// A Redis Cluster owned by this process; every node is killed on drop.
///
/// ```no_run
/// let cluster = lock_testkit::RedisCluster::start(3);
/// let urls = cluster.urls(); // redis://127.0.0.1:<port> of every master
/// let slot = cluster.slot_of("lock:{order:1}");
/// let from = cluster.owner_of(slot);
/// cluster.move_slot(slot, (from + 1) % 3);
/// # drop(urls);
/// ```
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    ids: Vec<String>,
}

impl std::fmt::Debug for RedisCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ports: Vec<u16> = self.nodes.iter().map(RedisServer::port).collect();
        f.debug_struct("RedisCluster")
            .field("ports", &ports)
            .finish()
    }
}

fn connect(node: &RedisServer) -> Result<Connection> {
    let client = redis::Client::open(node.url())?;
    let con = client.get_connection_with_timeout(Duration::from_secs(5))?;
    con.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(con)
}

impl RedisCluster {
    /// Starts `masters` nodes, gives each an even share of the slots, joins
    /// them, and waits (at most 20 s) until every node reports the cluster
    /// up and knows every other; an error naming the install command when
    /// `redis-server` is missing.
    pub fn try_start(masters: usize) -> Result<RedisCluster> {
        if masters == 0 {
            bail!("a cluster needs at least one master");
        }
        let nodes = (0..masters)
            .map(|_| RedisServer::try_start_cluster_node())
            .collect::<Result<Vec<_>>>()?;
        let mut ids = Vec::with_capacity(masters);
        let share = usize::from(SLOTS).div_ceil(masters);
        for (i, node) in nodes.iter().enumerate() {
            let mut con = connect(node)?;
            let first = i * share;
            let last = ((i + 1) * share).min(usize::from(SLOTS)) - 1;
            redis::cmd("CLUSTER")
                .arg("ADDSLOTSRANGE")
                .arg(first)
                .arg(last)
                .query::<()>(&mut con)
                .context("CLUSTER ADDSLOTSRANGE")?;
            ids.push(
                redis::cmd("CLUSTER")
                    .arg("MYID")
                    .query::<String>(&mut con)?,
            );
        }
        let mut first = connect(&nodes[0])?;
        for node in &nodes[1..] {
            redis::cmd("CLUSTER")
                .arg("MEET")
                .arg("127.0.0.1")
                .arg(node.port())
                .query::<()>(&mut first)
                .context("CLUSTER MEET")?;
        }
        let cluster = RedisCluster { nodes, ids };
        cluster.wait_until_up()?;
        Ok(cluster)
    }

    /// [`try_start`](Self::try_start), panicking with the error (how a test
    /// fails, install command included).
    pub fn start(masters: usize) -> RedisCluster {
        Self::try_start(masters).unwrap_or_else(|e| panic!("{e:#}"))
    }

    fn wait_until_up(&self) -> Result<()> {
        let begun = Instant::now();
        let known = format!("cluster_known_nodes:{}", self.nodes.len());
        loop {
            let mut up = true;
            for node in &self.nodes {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut connect(node)?)?;
                up &= info.contains("cluster_state:ok") && info.contains(&known);
            }
            if up {
                return Ok(());
            }
            if begun.elapsed() > UP_LIMIT {
                bail!("the test cluster did not come up within {UP_LIMIT:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `redis://127.0.0.1:<port>` of every master.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The master at `index`.
    pub fn node(&self, index: usize) -> &RedisServer {
        &self.nodes[index]
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`: its hash tag decides).
    pub fn slot_of(&self, key: &str) -> u16 {
        let slot = connect(&self.nodes[0]).and_then(|mut con| {
            Ok(redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(key)
                .query(&mut con)?)
        });
        slot.unwrap_or_else(|e| panic!("CLUSTER KEYSLOT: {e:#}"))
    }

    /// Index of the master that serves `slot` now.
    pub fn owner_of(&self, slot: u16) -> usize {
        let owner = || -> Result<usize> {
            let mut con = connect(&self.nodes[0])?;
            let ranges: Vec<redis::Value> = redis::cmd("CLUSTER").arg("SLOTS").query(&mut con)?;
            for range in ranges {
                let redis::Value::Array(parts) = range else {
                    continue;
                };
                let (Some(first), Some(last), Some(redis::Value::Array(master))) =
                    (parts.first(), parts.get(1), parts.get(2))
                else {
                    continue;
                };
                let first: u16 = redis::from_redis_value_ref(first)?;
                let last: u16 = redis::from_redis_value_ref(last)?;
                if (first..=last).contains(&slot) {
                    let port: u16 = redis::from_redis_value_ref(&master[1])?;
                    if let Some(i) = self.nodes.iter().position(|n| n.port() == port) {
                        return Ok(i);
                    }
                }
            }
            bail!("no master serves slot {slot}")
        };
        owner().unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Moves `slot` and its keys to master `to`, the way `redis-cli --cluster
    /// reshard` does: the target imports, the source migrates, the keys go
    /// over with `MIGRATE` (a client meanwhile gets `ASK` for keys already
    /// moved), then every node is told the new owner. The source then drops
    /// its clients' subscriptions to the slot's sharded channels. Panics on
    /// failure.
    pub fn move_slot(&self, slot: u16, to: usize) {
        let from = self.owner_of(slot);
        if from == to {
            return;
        }
        self.try_move_slot(slot, from, to)
            .unwrap_or_else(|e| panic!("move slot {slot}: {e:#}"));
    }

    fn try_move_slot(&self, slot: u16, from: usize, to: usize) -> Result<()> {
        let mut source = connect(&self.nodes[from])?;
        let mut target = connect(&self.nodes[to])?;
        let setslot = |con: &mut Connection, state: &str, id: &str| -> Result<()> {
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg(state)
                .arg(id)
                .query::<()>(con)
                .with_context(|| format!("CLUSTER SETSLOT {slot} {state}"))
        };
        setslot(&mut target, "IMPORTING", &self.ids[from])?;
        setslot(&mut source, "MIGRATING", &self.ids[to])?;
        for _batch in 0..10_000 {
            let keys: Vec<String> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(100)
                .query(&mut source)?;
            if keys.is_empty() {
                break;
            }
            redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(self.nodes[to].port())
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(&keys)
                .query::<()>(&mut source)
                .context("MIGRATE")?;
        }
        setslot(&mut target, "NODE", &self.ids[to])?;
        setslot(&mut source, "NODE", &self.ids[to])?;
        for (i, node) in self.nodes.iter().enumerate() {
            if i != from && i != to {
                setslot(&mut connect(node)?, "NODE", &self.ids[to])?;
            }
        }
        Ok(())
    }
}
