#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Test harness: a private `redis-server` per test binary, runtimes on both
//! backends, and small helpers the behaviour tests share.
//!
//! The server listens on a free loopback port, keeps no data on disk, and is
//! started through a tiny shell wrapper that reads its stdin: when the test
//! process exits — however it exits — the pipe closes and the wrapper kills
//! the server, so no `redis-server` outlives its tests. When `redis-server` is
//! not installed every test that needs it fails with the install command;
//! nothing is skipped.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use lock_runtime::{LockError, LockRuntime};

pub mod proxy;
pub use proxy::FaultProxy;

/// How to get `redis-server` onto this machine.
pub const INSTALL_HINT: &str =
    "redis-server not found: install it with `apt-get update && apt-get install -y redis-server` \
     (scripts/test does this for you)";

/// One `redis-server` process, started through a shell wrapper that kills it
/// when the test process's end of the wrapper's stdin closes.
pub struct ServerProcess {
    pid: u32,
    wrapper: Child,
    _stdin: ChildStdin,
}

impl ServerProcess {
    /// Starts `redis-server` on `port` (loopback, no persistence) with `extra`
    /// arguments; returns at once, before the server answers.
    pub fn spawn(port: u16, extra: &[&str]) -> ServerProcess {
        let binary = redis_server_binary();
        let mut args = vec![
            binary,
            "--port".to_owned(),
            port.to_string(),
            "--bind".to_owned(),
            "127.0.0.1".to_owned(),
            "--save".to_owned(),
            String::new(),
            "--appendonly".to_owned(),
            "no".to_owned(),
            "--daemonize".to_owned(),
            "no".to_owned(),
            "--loglevel".to_owned(),
            "warning".to_owned(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let quoted: Vec<String> = args
            .iter()
            .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
            .collect();
        // The wrapper starts the server, prints its pid, and kills it when
        // stdin closes (the test process is gone).
        let script = format!(
            "{} >/dev/null 2>&1 & pid=$!; echo $pid; read _; kill -9 $pid 2>/dev/null; kill -CONT $pid 2>/dev/null",
            quoted.join(" ")
        );
        let mut wrapper = Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start sh for redis-server");
        let stdin = wrapper.stdin.take().expect("wrapper stdin");
        let stdout = wrapper.stdout.take().expect("wrapper stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read redis-server pid");
        ServerProcess {
            pid: line.trim().parse().expect("redis-server pid"),
            wrapper,
            _stdin: stdin,
        }
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Alive and not a zombie (a killed server may stay a zombie for a while
    /// when nothing reaps orphans).
    pub fn is_running(&self) -> bool {
        match std::fs::read_to_string(format!("/proc/{}/stat", self.pid)) {
            Ok(stat) => stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
            Err(_) => false,
        }
    }

    /// SIGKILLs the server and waits (at most 2 s) until it is gone.
    pub fn kill(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        for signal in ["-KILL", "-CONT"] {
            let _ = Command::new("kill")
                .args([signal, &self.pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
        let _ = self.wrapper.kill();
        let _ = self.wrapper.wait();
        for _ in 0..400 {
            if !self.is_running() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if self.is_running() {
            self.stop();
        }
    }
}

/// A `redis-server` owned by the test process.
pub struct RedisServer {
    port: u16,
    process: ServerProcess,
}

fn redis_server_binary() -> String {
    if let Ok(path) = std::env::var("REDIS_SERVER_BIN") {
        return path;
    }
    for candidate in ["/usr/bin/redis-server", "/usr/local/bin/redis-server"] {
        if std::path::Path::new(candidate).exists() {
            return candidate.to_owned();
        }
    }
    match Command::new("redis-server").arg("--version").output() {
        Ok(out) if out.status.success() => "redis-server".to_owned(),
        _ => panic!("{INSTALL_HINT}"),
    }
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free loopback port");
    listener.local_addr().expect("local addr").port()
}

impl RedisServer {
    /// Starts a fresh server (no persistence) on a free loopback port and
    /// waits until it answers `PING` (at most 10 s).
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Like [`start`](Self::start), with extra `redis-server` arguments.
    pub fn start_with(extra: &[&str]) -> RedisServer {
        for _attempt in 0..5 {
            let port = free_port();
            let server = RedisServer {
                port,
                process: ServerProcess::spawn(port, extra),
            };
            if server.wait_ready(Duration::from_secs(10)) {
                return server;
            }
            // Port taken between our probe and the server's bind: try another.
        }
        panic!(
            "redis-server did not start (is {} working?)",
            redis_server_binary()
        );
    }

    fn wait_ready(&self, limit: Duration) -> bool {
        let start = Instant::now();
        let client = redis::Client::open(self.url()).expect("client");
        while start.elapsed() < limit {
            if let Ok(mut con) = client.get_connection() {
                // Any answer counts, NOAUTH included (password-protected servers).
                match redis::cmd("PING").query::<String>(&mut con) {
                    Ok(_) => return true,
                    Err(e) if e.code().is_some() => return true,
                    Err(_) => {}
                }
            }
            if !self.process.is_running() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id (for SIGSTOP/SIGKILL in fault tests).
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// A plain redis-rs client for the test's own commands.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("redis client")
    }

    /// A plain async connection for the test's own commands.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the test redis-server")
    }
}

/// The shared server of this test binary, started on first use.
pub fn redis() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
}

/// A name no other test of this run uses (for keys and prefixes).
pub fn unique(name: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Which backend a test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The shared test `redis-server`.
    Redis,
    /// The embedded backend.
    Memory,
}

impl Kind {
    /// A fresh runtime on this backend. Redis runtimes of one test share the
    /// server and the prefix, like processes sharing a Redis would.
    pub async fn runtime(self, prefix: &str) -> LockRuntime {
        self.try_runtime(prefix)
            .await
            .expect("build the lock runtime")
    }

    /// Like [`runtime`](Self::runtime), returning the error.
    pub async fn try_runtime(self, prefix: &str) -> Result<LockRuntime, LockError> {
        match self {
            Kind::Redis => {
                LockRuntime::builder()
                    .redis(redis().url())
                    .key_prefix(prefix)
                    .build()
                    .await
            }
            Kind::Memory => {
                LockRuntime::builder()
                    .memory()
                    .key_prefix(prefix)
                    .build()
                    .await
            }
        }
    }

    /// A second client of the same lock store: another runtime on the same
    /// Redis, or — the embedded store being per runtime — the same runtime.
    pub async fn peer(self, first: &LockRuntime, prefix: &str) -> LockRuntime {
        match self {
            Kind::Redis => self.runtime(prefix).await,
            Kind::Memory => first.clone(),
        }
    }
}

/// Declares one `#[tokio::test]` per backend for `async fn $name(kind: Kind)`.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),+ $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn redis() {
                    super::$name($crate::Kind::Redis).await;
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn memory() {
                    super::$name($crate::Kind::Memory).await;
                }
            }
        )+
    };
}

/// Counts how many bodies are inside a critical section at once, and the
/// most ever seen: two holders at once would show as a maximum above one.
#[derive(Debug, Default)]
pub struct Occupancy {
    now: AtomicU64,
    max: AtomicU64,
}

impl Occupancy {
    /// An empty counter (usable in a `static`).
    pub const fn new() -> Self {
        Occupancy {
            now: AtomicU64::new(0),
            max: AtomicU64::new(0),
        }
    }

    /// Marks entry; the returned token marks exit when dropped.
    pub fn enter(&self) -> OccupancyToken<'_> {
        let inside = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(inside, Ordering::SeqCst);
        OccupancyToken(self)
    }

    /// The most bodies ever inside at once.
    pub fn max(&self) -> u64 {
        self.max.load(Ordering::SeqCst)
    }
}

/// Leaves the critical section on drop.
pub struct OccupancyToken<'a>(&'a Occupancy);

impl Drop for OccupancyToken<'_> {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Path of the contender binary built with these tests (usable from
/// integration tests, where Cargo defines it).
#[macro_export]
macro_rules! contender_bin {
    () => {
        env!("CARGO_BIN_EXE_contender")
    };
}
