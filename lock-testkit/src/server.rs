//! A private `redis-server` on a loopback port: started, and for the fault
//! tests killed, restarted (empty or from a snapshot), frozen and thawed.
//!
//! Figures and faults mean something only against a server nobody else
//! uses, so every test binary and every benchmark run starts its own. The
//! port stays the same across restarts, as clients reconnecting to "the same
//! Redis" expect; the first start picks a free one and retries with another
//! when someone took it in between.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::binary;
use crate::port::try_free_port;
use crate::process::{self, ServerProcess};
use crate::signal::{self, Signal};

/// File name of the snapshot inside a server's data directory.
const DUMP: &str = "dump.rdb";

/// How long a first start may take to answer `PING`.
const READY_LIMIT: Duration = Duration::from_secs(10);

/// A `redis-server` owned by this process; killed on drop, its data
/// directory (if any) removed.
///
/// ```no_run
/// # async fn demo() {
/// let mut server = lock_testkit::RedisServer::start_with_snapshots();
/// server.snapshot().await; // SAVE
/// server.freeze(); // SIGSTOP: connections open, no answers
/// server.thaw();
/// server.restart_from_snapshot().await; // back to what SAVE wrote
/// server.restart().await; // empty
/// # }
/// ```
pub struct RedisServer {
    binary: String,
    port: u16,
    extra: Vec<String>,
    running: Option<ServerProcess>,
    /// Pid of the latest process, kept after a kill.
    pid: u32,
    /// Data directory of [`start_with_snapshots`](Self::start_with_snapshots).
    dir: Option<PathBuf>,
}

impl std::fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisServer")
            .field("port", &self.port)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

impl RedisServer {
    /// Starts a server with no persistence on a free loopback port and waits
    /// (at most 10 s) until it answers `PING`; an error naming the install
    /// command when `redis-server` is missing.
    ///
    /// ```no_run
    /// let server = lock_testkit::RedisServer::try_start()?;
    /// # anyhow::Ok(())
    /// ```
    pub fn try_start() -> Result<RedisServer> {
        Self::try_start_with(&[])
    }

    /// Like [`try_start`](Self::try_start), with extra `redis-server`
    /// arguments (`--requirepass`, `--tls-port`, ...), kept for restarts.
    pub fn try_start_with(extra: &[&str]) -> Result<RedisServer> {
        Self::try_start_in(extra, None)
    }

    /// [`try_start`](Self::try_start), panicking with the error (the way a
    /// test fails, install command included).
    ///
    /// ```no_run
    /// let url = lock_testkit::RedisServer::start().url();
    /// ```
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// The server shared by every test of this test binary: started (with
    /// [`start`](Self::start)) on first use, stopped when the process ends.
    ///
    /// ```no_run
    /// let url = lock_testkit::RedisServer::shared().url();
    /// ```
    pub fn shared() -> &'static RedisServer {
        static SERVER: std::sync::OnceLock<RedisServer> = std::sync::OnceLock::new();
        SERVER.get_or_init(RedisServer::start)
    }

    /// [`try_start_with`](Self::try_start_with), panicking with the error.
    pub fn start_with(extra: &[&str]) -> RedisServer {
        Self::try_start_with(extra).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Starts a server with a private data directory, so that
    /// [`snapshot`](Self::snapshot) and
    /// [`restart_from_snapshot`](Self::restart_from_snapshot) work. It saves
    /// only when told to. Panics on failure.
    pub fn start_with_snapshots() -> RedisServer {
        let started = data_dir().and_then(|dir| Self::try_start_in(&[], Some(dir)));
        started.unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Starts a server with cluster mode on (its node file in a private
    /// data directory) and no slots yet: a node for
    /// [`RedisCluster`](crate::RedisCluster) to join.
    pub fn try_start_cluster_node() -> Result<RedisServer> {
        let extra = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "2000",
        ];
        Self::try_start_in(&extra, Some(data_dir()?))
    }

    fn try_start_in(extra: &[&str], dir: Option<PathBuf>) -> Result<RedisServer> {
        let binary = binary::redis_server()?;
        for _attempt in 0..5 {
            let mut server = RedisServer {
                binary: binary.clone(),
                port: try_free_port()?,
                extra: extra.iter().map(|s| (*s).to_owned()).collect(),
                running: None,
                pid: 0,
                dir: dir.clone(),
            };
            if server.boot(READY_LIMIT)? {
                return Ok(server);
            }
            // The port was taken between our probe and the server's bind.
            // Dropping `server` must not remove the directory the next
            // attempt uses.
            server.dir = None;
        }
        if let Some(dir) = dir {
            let _ = std::fs::remove_dir_all(dir);
        }
        bail!("redis-server did not start (is {binary} working?)")
    }

    /// Starts the process on `self.port` and waits until it answers; false
    /// (and nothing running) when it does not within `limit`.
    fn boot(&mut self, limit: Duration) -> Result<bool> {
        let process = self.spawn()?;
        if wait_ready(&self.url(), process.pid(), limit) {
            self.pid = process.pid();
            self.running = Some(process);
            return Ok(true);
        }
        process.kill();
        Ok(false)
    }

    /// [`boot`](Self::boot) for async callers: the wait runs on a blocking
    /// thread, so the caller's runtime goes on serving its tasks.
    async fn boot_async(&mut self, limit: Duration) -> Result<bool> {
        let process = self.spawn()?;
        let (url, pid) = (self.url(), process.pid());
        let ready = tokio::task::spawn_blocking(move || wait_ready(&url, pid, limit))
            .await
            .context("wait for redis-server")?;
        if ready {
            self.pid = pid;
            self.running = Some(process);
            return Ok(true);
        }
        process.kill();
        Ok(false)
    }

    fn spawn(&self) -> Result<ServerProcess> {
        let dir = match &self.dir {
            Some(dir) => Some(dir.to_str().context("data directory is not UTF-8")?),
            None => None,
        };
        let mut args: Vec<&str> = match dir {
            Some(dir) => vec!["--dir", dir, "--dbfilename", DUMP],
            None => Vec::new(),
        };
        args.extend(self.extra.iter().map(String::as_str));
        ServerProcess::spawn(&self.binary, self.port, &args)
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port it listens on, the same after every restart.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The process id of the server (of the latest one, after a restart).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// A plain redis-rs client for the caller's own commands.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).unwrap_or_else(|e| panic!("redis client: {e}"))
    }

    /// A plain async connection for the caller's own commands; panics when
    /// the server does not accept it.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("connect to the test redis-server: {e}"))
    }

    /// The server's version string, e.g. `7.0.15`, or `unknown`.
    pub fn version(&self) -> String {
        let query = || -> Result<String> {
            let mut con = redis::Client::open(self.url())?.get_connection()?;
            let info: String = redis::cmd("INFO").arg("server").query(&mut con)?;
            Ok(info
                .lines()
                .find_map(|l| l.strip_prefix("redis_version:"))
                .unwrap_or("unknown")
                .trim()
                .to_owned())
        };
        query().unwrap_or_else(|_| "unknown".to_owned())
    }

    /// SIGKILLs the server: no shutdown, nothing saved. A no-op when it is
    /// not running.
    pub fn kill(&mut self) {
        if let Some(running) = self.running.take() {
            running.kill();
        }
    }

    /// Kills the server and starts a new, empty one on the same port
    /// (retrying while the port is being freed, for at most 10 s). A
    /// snapshot taken before is deleted, not loaded. Panics on failure.
    pub async fn restart(&mut self) {
        self.kill();
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_file(dir.join(DUMP));
        }
        self.start_again().await;
    }

    /// Writes a snapshot of the data now (`SAVE`); a later
    /// [`restart_from_snapshot`](Self::restart_from_snapshot) comes back with
    /// exactly this data. Needs [`start_with_snapshots`](Self::start_with_snapshots).
    pub async fn snapshot(&self) {
        assert!(self.dir.is_some(), "snapshot needs start_with_snapshots()");
        let mut con = self.connection().await;
        con.set_response_timeout(Duration::from_secs(10));
        let saved: redis::RedisResult<()> = redis::cmd("SAVE").query_async(&mut con).await;
        if let Err(e) = saved {
            panic!("SAVE a snapshot: {e}");
        }
    }

    /// SIGKILLs the server and starts it again on the same port from the
    /// last [`snapshot`](Self::snapshot): everything written since is gone,
    /// and what the snapshot held (with its remaining TTLs) is back.
    pub async fn restart_from_snapshot(&mut self) {
        let Some(dir) = &self.dir else {
            panic!("restart_from_snapshot needs start_with_snapshots()");
        };
        assert!(dir.join(DUMP).exists(), "no snapshot was taken");
        self.kill();
        self.start_again().await;
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers,
    /// and its clock goes on (keys expire meanwhile, seen once it thaws).
    pub fn freeze(&self) {
        self.signal(Signal::Stop);
    }

    /// Thaws a frozen server (SIGCONT).
    pub fn thaw(&self) {
        self.signal(Signal::Cont);
    }

    fn signal(&self, signal: Signal) {
        let Some(running) = &self.running else {
            panic!("the server is not running");
        };
        if let Err(e) = signal::send(running.pid(), signal) {
            panic!("{e:#}");
        }
    }

    async fn start_again(&mut self) {
        let begun = Instant::now();
        while begun.elapsed() < Duration::from_secs(10) {
            match self.boot_async(Duration::from_secs(5)).await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => panic!("{e:#}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("redis-server did not restart on port {}", self.port);
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        if let Some(dir) = self.dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Polls `PING` until the server answers (an error reply such as `NOAUTH`
/// counts: it is up; `LOADING` does not: it is still reading its snapshot)
/// and the port is its own (not another test's server that took the port
/// first), its process `pid` dies, or `limit` passes.
fn wait_ready(url: &str, pid: u32, limit: Duration) -> bool {
    let Ok(client) = redis::Client::open(url) else {
        return false;
    };
    let Some(port) = url.rsplit(':').next().and_then(|p| p.parse::<u16>().ok()) else {
        return false;
    };
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Ok(mut con) = client.get_connection() {
            let up = match redis::cmd("PING").query::<String>(&mut con) {
                Ok(_) => true,
                Err(e) => e.code().is_some_and(|code| code != "LOADING"),
            };
            if up && process::listens_on(pid, port) {
                return true;
            }
        }
        if !process::is_running(pid) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// The start of every data directory's name; the pid of the process that
/// made it follows.
const DATA_DIR_PREFIX: &str = "lock-testkit-redis-";

/// Removes the data directories of processes that are gone. A server a
/// test binary keeps for its whole life (a `static`) is never dropped, so
/// its directory outlives the binary; in memory (`/dev/shm`), an etcd
/// member's 64 MB write-ahead log and database would pile up run after
/// run until the machine ran out of memory. Each process sweeps once, when
/// it makes its first directory.
fn sweep_dead(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(DATA_DIR_PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A fresh data directory, in memory when possible: `SAVE` ends with an
/// fsync, which on a busy disk can stall the server for longer than a fault
/// would.
pub(crate) fn data_dir() -> Result<PathBuf> {
    static N: AtomicU64 = AtomicU64::new(0);
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| sweep_dead(&base));
    let dir = base.join(format!(
        "{DATA_DIR_PREFIX}{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    // A directory of that name is a dead process's (ours has this pid, and
    // the counter is fresh): a killed test run leaves its files behind, and
    // a cluster node would read the stale `nodes.conf` (slots "already
    // busy").
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    Ok(dir)
}
