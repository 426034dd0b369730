//! A Redis Sentinel deployment on loopback: one primary, its replicas and
//! three sentinels, for the failover tests.
//!
//! Every process is a [`RedisServer`] or a [`ServerProcess`], so it dies
//! with the test process. The start waits (bounded, by polling: these are
//! servers coming up, not events a client can await) until every replica
//! is linked and every sentinel knows the replicas and the two other
//! sentinels, so a failover can be voted on from the first moment. The
//! replicas link before the sentinels start, so the sentinels' first `INFO`
//! of the primary already lists them (they would otherwise learn of them
//! only at their next `INFO`, ten seconds later).
//!
//! ```no_run
//! # async fn demo() {
//! let mut set = lock_testkit::SentinelSet::start(2);
//! let sentinels = set.sentinel_urls(); // redis://127.0.0.1:<port>, three of them
//! set.kill_primary(); // SIGKILL; the sentinels promote a replica
//! let (new_primary, took) = set.wait_for_failover(std::time::Duration::from_secs(20)).await;
//! # drop((sentinels, new_primary, took)); }
//! ```

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::binary;
use crate::port::try_free_port;
use crate::process::{self, ServerProcess};
use crate::server::{data_dir, RedisServer};

/// The service name the sentinels monitor.
pub const SERVICE: &str = "mymaster";

/// How long a sentinel waits for a silent primary before it calls it down.
pub const DOWN_AFTER: Duration = Duration::from_millis(1000);

/// How long the start may take to reach a ready deployment.
const READY_LIMIT: Duration = Duration::from_secs(15);

/// Pause between two readiness polls.
const POLL: Duration = Duration::from_millis(25);

/// A primary, its replicas and three sentinels; all killed on drop.
pub struct SentinelSet {
    /// The data nodes; `[0]` was the primary at the start.
    nodes: Vec<RedisServer>,
    sentinels: Vec<(u16, ServerProcess)>,
    dir: PathBuf,
}

impl std::fmt::Debug for SentinelSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ports: Vec<u16> = self.sentinels.iter().map(|(p, _)| *p).collect();
        f.debug_struct("SentinelSet")
            .field("nodes", &self.nodes)
            .field("sentinel_ports", &ports)
            .finish()
    }
}

impl SentinelSet {
    /// [`try_start`](Self::try_start), panicking with the error (the way a
    /// test fails, install command included).
    pub fn start(replicas: usize) -> SentinelSet {
        Self::try_start(replicas).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Starts a primary with `replicas` replicas (diskless sync, no delay)
    /// and three sentinels monitoring it as [`SERVICE`] with quorum 2, and
    /// waits until all of them see each other.
    pub fn try_start(replicas: usize) -> Result<SentinelSet> {
        let binary = binary::redis_server()?;
        let dir = data_dir()?;
        let mut set = SentinelSet {
            nodes: Vec::new(),
            sentinels: Vec::new(),
            dir,
        };
        let primary = set.start_node(None)?;
        set.nodes.push(primary);
        for _ in 0..replicas {
            let replica = set.start_node(Some(set.nodes[0].port()))?;
            set.nodes.push(replica);
        }
        let deadline = Instant::now() + READY_LIMIT;
        set.wait_for_replicas(replicas, deadline)?;
        for n in 0..3 {
            let sentinel = set.start_sentinel(&binary, n, deadline)?;
            set.sentinels.push(sentinel);
        }
        set.wait_for_sentinels(replicas, deadline)?;
        Ok(set)
    }

    /// Starts a data node (a replica of `primary`, if given). Full syncs
    /// send and load the snapshot through the socket, and anything a node
    /// still writes goes to the set's directory, not the working directory.
    fn start_node(&self, primary: Option<u16>) -> Result<RedisServer> {
        let dir = self.dir.to_str().context("temp directory is not UTF-8")?;
        let file = format!("node-{}.rdb", self.nodes.len());
        let mut args = vec![
            "--dir",
            dir,
            "--dbfilename",
            &file,
            "--repl-diskless-sync",
            "yes",
            "--repl-diskless-sync-delay",
            "0",
            "--repl-diskless-load",
            "swapdb",
        ];
        let port = primary.map(|p| p.to_string());
        if let Some(port) = &port {
            args.extend(["--replicaof", "127.0.0.1", port]);
        }
        RedisServer::try_start_with(&args)
    }

    /// Writes sentinel `n`'s configuration and starts it on a free port.
    fn start_sentinel(
        &self,
        binary: &str,
        n: usize,
        deadline: Instant,
    ) -> Result<(u16, ServerProcess)> {
        let config = self.dir.join(format!("sentinel-{n}.conf"));
        let text = format!(
            "sentinel monitor {SERVICE} 127.0.0.1 {} 2\n\
             sentinel down-after-milliseconds {SERVICE} {}\n\
             sentinel failover-timeout {SERVICE} 3000\n\
             sentinel parallel-syncs {SERVICE} 1\n",
            self.nodes[0].port(),
            DOWN_AFTER.as_millis()
        );
        std::fs::write(&config, text).with_context(|| format!("write {}", config.display()))?;
        let config = config.to_str().context("temp directory is not UTF-8")?;
        for _attempt in 0..5 {
            let port = try_free_port()?;
            let process = ServerProcess::spawn_with_config(binary, config, port, &["--sentinel"])?;
            if poll(deadline, || {
                Ok(query::<String>(port, &redis::cmd("PING")).is_ok()
                    && process::listens_on(process.pid(), port))
            }) {
                return Ok((port, process));
            }
            // The port was taken in between: try another.
            process.kill();
        }
        bail!("redis-server --sentinel did not start (is {binary} working?)")
    }

    /// Until the primary reports `replicas` replicas online.
    fn wait_for_replicas(&self, replicas: usize, deadline: Instant) -> Result<()> {
        let primary = self.nodes[0].port();
        let linked = poll(deadline, || {
            let info: String = query(primary, redis::cmd("INFO").arg("replication"))?;
            let online = info.lines().filter(|l| l.contains("state=online")).count();
            Ok(online == replicas)
        });
        if !linked {
            bail!("the replicas did not link to the primary within {READY_LIMIT:?}");
        }
        Ok(())
    }

    /// Until every sentinel knows the replicas and the two other sentinels.
    fn wait_for_sentinels(&self, replicas: usize, deadline: Instant) -> Result<()> {
        for (port, _) in &self.sentinels {
            let ready = poll(deadline, || {
                let state = master_state(*port)?;
                Ok(state.field("num-slaves") == Some(replicas.to_string())
                    && state.field("num-other-sentinels") == Some("2".to_owned()))
            });
            if !ready {
                bail!(
                    "sentinel on port {port} did not see {replicas} replicas and 2 sentinels \
                     within {READY_LIMIT:?}"
                );
            }
        }
        Ok(())
    }

    /// The sentinels' URLs, `redis://127.0.0.1:<port>`.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|(port, _)| format!("redis://127.0.0.1:{port}"))
            .collect()
    }

    /// The node that was the primary at the start.
    pub fn first_primary(&self) -> &RedisServer {
        &self.nodes[0]
    }

    /// The nodes that were replicas at the start.
    pub fn replicas(&self) -> &[RedisServer] {
        &self.nodes[1..]
    }

    /// The data node listening on `address` (`127.0.0.1:<port>`).
    pub fn node(&self, address: &str) -> Option<&RedisServer> {
        let port: u16 = address.rsplit_once(':')?.1.parse().ok()?;
        self.nodes.iter().find(|n| n.port() == port)
    }

    /// SIGKILLs the node that was the primary at the start.
    pub fn kill_primary(&mut self) {
        self.nodes[0].kill();
    }

    /// Freezes (SIGSTOP) the node that was the primary at the start.
    pub fn freeze_primary(&self) {
        self.nodes[0].freeze();
    }

    /// The primary the sentinels name now (`127.0.0.1:<port>`): the first
    /// sentinel that answers.
    pub fn named_primary(&self) -> Option<String> {
        self.sentinels.iter().find_map(|(port, _)| {
            let mut ask = redis::cmd("SENTINEL");
            ask.arg("get-master-addr-by-name").arg(SERVICE);
            let (host, p): (String, u16) = query(*port, &ask).ok()?;
            Some(format!("{host}:{p}"))
        })
    }

    /// Waits until every sentinel names a primary other than the first one
    /// and that node answers `ROLE` as a master; returns its address and the
    /// time waited. Panics after `limit`.
    pub async fn wait_for_failover(&self, limit: Duration) -> (String, Duration) {
        let start = Instant::now();
        let first = format!("127.0.0.1:{}", self.nodes[0].port());
        while start.elapsed() < limit {
            let named: Vec<Option<String>> = self
                .sentinels
                .iter()
                .map(|(port, _)| {
                    let mut ask = redis::cmd("SENTINEL");
                    ask.arg("get-master-addr-by-name").arg(SERVICE);
                    query::<(String, u16)>(*port, &ask)
                        .ok()
                        .map(|(h, p)| format!("{h}:{p}"))
                })
                .collect();
            if let Some(Some(address)) = named.first() {
                let agreed = named.iter().all(|n| n.as_ref() == Some(address));
                if agreed && *address != first && self.is_master(address) {
                    return (address.clone(), start.elapsed());
                }
            }
            tokio::time::sleep(POLL).await;
        }
        panic!("no failover within {limit:?}: the sentinels still name {first} or disagree");
    }

    /// Whether the data node at `address` answers `ROLE` as a master.
    pub fn is_master(&self, address: &str) -> bool {
        let Some(node) = self.node(address) else {
            return false;
        };
        let role: Result<Vec<redis::Value>> = query(node.port(), &redis::cmd("ROLE"));
        matches!(role.as_deref(), Ok([redis::Value::BulkString(b), ..]) if b == b"master")
    }
}

impl Drop for SentinelSet {
    fn drop(&mut self) {
        // Sentinels first, so they do not start a failover while the data
        // nodes go.
        for (_, sentinel) in self.sentinels.drain(..) {
            sentinel.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `SENTINEL master <SERVICE>` of the sentinel on `port`.
fn master_state(port: u16) -> Result<MasterState> {
    let mut ask = redis::cmd("SENTINEL");
    ask.arg("master").arg(SERVICE);
    Ok(MasterState(query(port, &ask)?))
}

/// A sentinel's view of the primary: field, value, field, value, ...
struct MasterState(Vec<String>);

impl MasterState {
    fn field(&self, name: &str) -> Option<String> {
        self.0
            .chunks_exact(2)
            .find(|pair| pair[0] == name)
            .map(|pair| pair[1].clone())
    }
}

/// One command to the server on loopback `port`, on a fresh blocking
/// connection with short timeouts.
fn query<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> Result<T> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let mut con = client.get_connection_with_timeout(Duration::from_millis(500))?;
    con.set_read_timeout(Some(Duration::from_millis(500)))?;
    Ok(cmd.query(&mut con)?)
}

/// Calls `check` every [`POLL`] until it says true (`Ok(true)`: true) or the
/// deadline passes (false); an error from `check` counts as not yet.
fn poll(deadline: Instant, mut check: impl FnMut() -> Result<bool>) -> bool {
    loop {
        if matches!(check(), Ok(true)) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL);
    }
}
