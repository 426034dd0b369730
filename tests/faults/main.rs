//! Fault injection against real `redis-server`s the tests start and control:
//! a crashed holder, Redis restarted empty, Redis frozen or its connections
//! killed, a thundering herd, a cancellation storm and a mutual-exclusion
//! soak across processes.
//!
//! Every case bounds its loops in count and time and prints what it measured
//! (`cargo test -p lock-tests --test faults -- --nocapture` shows the
//! figures). The cases take turns (one lock for the whole binary): several
//! measure timing, and the machine has few cores.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cancel_storm;
mod crash;
mod herd;
mod nemesis;
mod restart;
mod soak;
mod unreachable;

use std::time::Duration;

use lock_runtime::LockRuntime;
use lock_testkit::pipes::{self, Lines};
use lock_testkit::{CommandStats, RedisServer};
use lock_tests::unique;
use tokio::process::Child;

/// One case at a time: timing bounds stay meaningful on a 2-core machine.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Takes this binary's turn lock for the duration of one case.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    SERIAL.lock().await
}

/// A Redis runtime with short connect and response timeouts, so faults are
/// noticed within a few hundred milliseconds.
pub async fn quick_runtime(url: &str, prefix: &str, timeouts: Duration) -> LockRuntime {
    LockRuntime::builder()
        .redis(url)
        .key_prefix(prefix)
        .connect_timeout(timeouts)
        .response_timeout(timeouts)
        .build()
        .await
        .expect("build the lock runtime")
}

/// Where a fault case starts: its turn (see [`serial`]), a server of its
/// own (its faults reach no other case), a new prefix named after `name`,
/// and two runtimes ("processes": say a holder and a peer) made by
/// [`quick_runtime`] with `timeouts` on that server and prefix.
pub async fn own_server(name: &str, timeouts: Duration) -> OwnServer {
    let turn = serial().await;
    let server = RedisServer::start();
    let prefix = unique(name);
    let one = quick_runtime(&server.url(), &prefix, timeouts).await;
    let two = quick_runtime(&server.url(), &prefix, timeouts).await;
    (turn, server, prefix, one, two)
}

/// What [`own_server`] gives: the turn, the server, the prefix, two runtimes.
pub type OwnServer = (
    tokio::sync::MutexGuard<'static, ()>,
    RedisServer,
    String,
    LockRuntime,
    LockRuntime,
);

/// Milliseconds, for the printed figures.
pub fn ms(d: Duration) -> u128 {
    d.as_millis()
}

/// A contender process with piped stdin/stdout; killed when dropped.
pub fn spawn_contender(args: &[&str]) -> (Child, Lines) {
    spawn_contender_env(args, &[])
}

/// [`spawn_contender`] with extra environment variables (`LOCK_FAIR=1`).
pub fn spawn_contender_env(args: &[&str], env: &[(&str, &str)]) -> (Child, Lines) {
    let mut command = tokio::process::Command::new(lock_tests::contender_bin!());
    command.args(args).envs(env.iter().copied());
    pipes::spawn(&mut command).expect("spawn contender")
}

/// The next line of a contender, within `limit`.
pub async fn next_line(lines: &mut Lines, limit: Duration) -> String {
    tokio::time::timeout(limit, lines.next_line())
        .await
        .unwrap_or_else(|_| panic!("no line from the contender within {limit:?}"))
        .expect("read contender stdout")
        .expect("the contender closed its stdout early")
}

/// Xorshift64: reproducible randomness without a dependency.
pub struct XorShift(u64);

impl XorShift {
    /// Seeded from the clock (printed, so a failing run can be replayed).
    pub fn from_clock() -> XorShift {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        XorShift::new(nanos)
    }

    /// A generator from `seed` (0 is mapped to 1).
    pub fn new(seed: u64) -> XorShift {
        XorShift(seed.max(1))
    }

    /// The seed-visible state.
    pub fn state(&self) -> u64 {
        self.0
    }

    /// Next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// `PUBSUB NUMSUB channel`.
pub async fn numsub(con: &mut redis::aio::MultiplexedConnection, channel: &str) -> i64 {
    let reply: Vec<redis::Value> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(con)
        .await
        .expect("PUBSUB NUMSUB");
    match reply.get(1) {
        Some(redis::Value::Int(n)) => *n,
        other => panic!("unexpected PUBSUB NUMSUB reply {other:?}"),
    }
}

/// `PUBSUB CHANNELS pattern`.
pub async fn channels(con: &mut redis::aio::MultiplexedConnection, pattern: &str) -> Vec<String> {
    redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg(pattern)
        .query_async(con)
        .await
        .expect("PUBSUB CHANNELS")
}

/// `KEYS pattern`, sorted (test servers are small).
pub async fn keys(con: &mut redis::aio::MultiplexedConnection, pattern: &str) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(pattern)
        .query_async(con)
        .await
        .expect("KEYS");
    keys.sort();
    keys
}

/// Script calls (`EVALSHA` + `EVAL`) the server has run so far.
pub async fn script_calls(con: &mut redis::aio::MultiplexedConnection) -> u64 {
    let stats = CommandStats::read(con).await.expect("INFO commandstats");
    stats.calls("evalsha") + stats.calls("eval")
}
