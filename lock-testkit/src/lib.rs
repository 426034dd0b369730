//! The kit the integration tests (`lock-tests`) and the benchmark
//! (`lock-bench`) share, so both measure and break the same things the same
//! way.
//!
//! Both need a `redis-server` of their own: on a free loopback port, with
//! nothing on disk, gone when the process that started it ends, however it
//! ends. The fault tests also restart it (empty, or from a snapshot), freeze
//! it (SIGSTOP/SIGCONT) and kill it; both read its `INFO commandstats`, their
//! own resident memory and CPU time, and drive child processes by lines.
//!
//! ```no_run
//! let server = lock_testkit::RedisServer::start();
//! let url = server.url(); // redis://127.0.0.1:<port>
//! # drop(url);
//! ```
//!
//! Starting a server comes in two forms: `try_start…` returns the error, for
//! the benchmark; `start…` panics with it, which is how a test fails. A
//! missing `redis-server` is such an error, and it names the install command.
//! The fault controls (restart, snapshot, freeze) are for tests and panic.
//!
//! | module | what |
//! |---|---|
//! | [`server`] | [`RedisServer`]: start, kill, restart (empty or from a snapshot), freeze/thaw |
//! | [`cluster`] | [`RedisCluster`]: N masters joined on loopback; move a slot with its keys |
//! | [`etcd`] | [`EtcdCluster`]: one etcd member or three; kill, restart from the data dir, freeze |
//! | [`sentinel`] | [`SentinelSet`]: a primary, replicas and three sentinels; kill, wait for the failover |
//! | [`zookeeper`] | [`ZooKeeperServer`] (standalone) and [`ZooKeeperEnsemble`] (three): kill, restart from the data directory, freeze |
//! | [`process`] | one server process under the wrapper that kills it with us |
//! | [`binary`] | where `redis-server` is, or [`INSTALL_HINT`] |
//! | [`port`], [`signal`] | a free loopback port; SIGSTOP/SIGCONT/SIGKILL to a pid |
//! | [`commandstats`] | `INFO commandstats` parsed, and deltas between two readings |
//! | [`usage`] | this process's resident memory and CPU time |
//! | [`child`], [`pipes`] | child processes driven by lines (sync reader thread; async pipes) |
//!
//! Dependencies point down: `cluster` uses `server`; `sentinel` uses `server` and `process`; `server` uses `process`, `binary`, `port` and
//! `signal`; `zookeeper` uses `server` (its data directories), `process`,
//! `port` and `signal`; `process` uses `signal`; the rest use nothing of
//! this crate.

pub mod binary;
pub mod child;
pub mod cluster;
pub mod commandstats;
pub mod etcd;
pub mod pipes;
pub mod port;
pub mod process;
pub mod sentinel;
pub mod server;
pub mod signal;
pub mod usage;
pub mod zookeeper;

pub use binary::INSTALL_HINT;
pub use child::LineChild;
pub use cluster::RedisCluster;
pub use commandstats::{CommandStats, Delta};
pub use etcd::EtcdCluster;
pub use port::free_port;
pub use sentinel::SentinelSet;
pub use server::RedisServer;
pub use signal::Signal;
pub use zookeeper::{ZooKeeperEnsemble, ZooKeeperServer};
