//! A `redis-server` the fault tests can kill and restart, empty, on the same
//! port (the shared harness picks a fresh port for every start); freeze and
//! thaw (SIGSTOP/SIGCONT); and, when started with a data directory, snapshot
//! (`SAVE`) and later restart from that older snapshot, as a server that
//! crashed and came back from its last dump would.
//!
//! The process itself is the harness's `ServerProcess` (a shell wrapper kills
//! the server when the test process exits, however it exits).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use lock_tests::ServerProcess;
use tokio::time::Instant;

/// A restartable `redis-server` on a fixed loopback port.
pub struct FaultServer {
    port: u16,
    running: Option<ServerProcess>,
    /// Data directory of a server started with
    /// [`start_with_snapshots`](Self::start_with_snapshots); removed on drop.
    dir: Option<PathBuf>,
}

/// File name of the snapshot inside the data directory.
const DUMP: &str = "dump.rdb";

impl FaultServer {
    /// Starts a server (no persistence) on a free port.
    pub async fn start() -> FaultServer {
        Self::start_in(None).await
    }

    /// Starts a server on a free port with a private data directory, so that
    /// [`snapshot`](Self::snapshot) and
    /// [`restart_from_snapshot`](Self::restart_from_snapshot) work. It saves
    /// only when told to.
    pub async fn start_with_snapshots() -> FaultServer {
        // In memory when possible: `SAVE` ends with an fsync, which on a
        // busy disk can stall the server for longer than a fault would.
        let shm = std::path::Path::new("/dev/shm");
        let base = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(lock_tests::unique("lock-faults-redis"));
        std::fs::create_dir_all(&dir).expect("create the redis data directory");
        Self::start_in(Some(dir)).await
    }

    async fn start_in(dir: Option<PathBuf>) -> FaultServer {
        for _attempt in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("probe a free loopback port")
                .port();
            let mut server = FaultServer {
                port,
                running: None,
                dir: dir.clone(),
            };
            if server.try_start(Duration::from_secs(10)).await {
                return server;
            }
            // Dropping `server` would remove the shared directory.
            server.dir = None;
        }
        panic!("{}", lock_tests::INSTALL_HINT);
    }

    async fn try_start(&mut self, limit: Duration) -> bool {
        let dir = self
            .dir
            .as_ref()
            .map(|d| d.to_str().expect("utf-8 temp dir").to_owned());
        let extra: Vec<&str> = match &dir {
            Some(dir) => vec!["--dir", dir, "--dbfilename", DUMP],
            None => Vec::new(),
        };
        let running = ServerProcess::spawn(self.port, &extra);
        let begun = Instant::now();
        let client = redis::Client::open(self.url()).expect("client");
        while begun.elapsed() < limit {
            let ping = tokio::time::timeout(Duration::from_millis(500), async {
                let mut con = client.get_multiplexed_async_connection().await?;
                redis::cmd("PING").query_async::<String>(&mut con).await
            })
            .await;
            if matches!(ping, Ok(Ok(_))) {
                self.running = Some(running);
                return true;
            }
            if !running.is_running() {
                running.kill();
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        running.kill();
        false
    }

    /// SIGKILLs the server (no shutdown, nothing saved).
    pub fn kill(&mut self) {
        if let Some(running) = self.running.take() {
            running.kill();
        }
    }

    /// Starts a new, empty server on the same port (retrying while the port
    /// is still being freed, for at most 10 s). A snapshot taken before is
    /// deleted, not loaded.
    pub async fn restart(&mut self) {
        self.kill();
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_file(dir.join(DUMP));
        }
        self.start_again().await;
    }

    /// Writes a snapshot of the data now (`SAVE`); a later
    /// [`restart_from_snapshot`](Self::restart_from_snapshot) comes back
    /// with exactly this data. Needs [`start_with_snapshots`](Self::start_with_snapshots).
    pub async fn snapshot(&self) {
        assert!(self.dir.is_some(), "snapshot needs start_with_snapshots()");
        let mut con = self.connection().await;
        con.set_response_timeout(Duration::from_secs(10));
        let () = redis::cmd("SAVE")
            .query_async(&mut con)
            .await
            .expect("SAVE a snapshot");
    }

    /// SIGKILLs the server and starts it again on the same port from the
    /// last [`snapshot`](Self::snapshot): everything written since is gone,
    /// and what the snapshot held (with its remaining TTLs) is back.
    pub async fn restart_from_snapshot(&mut self) {
        let dir = self
            .dir
            .as_ref()
            .expect("restart_from_snapshot needs start_with_snapshots()");
        assert!(dir.join(DUMP).exists(), "no snapshot was taken");
        self.kill();
        self.start_again().await;
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers,
    /// and its clock goes on (keys expire meanwhile, seen once it thaws).
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Thaws a frozen server (SIGCONT).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let running = self.running.as_ref().expect("the server is not running");
        let status = Command::new("kill")
            .args([signal, &running.pid().to_string()])
            .stderr(Stdio::null())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} failed");
    }

    async fn start_again(&mut self) {
        let begun = Instant::now();
        while begun.elapsed() < Duration::from_secs(10) {
            if self.try_start(Duration::from_secs(5)).await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("redis-server did not restart on port {}", self.port);
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A plain async connection for the test's own commands.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .expect("client")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the fault redis-server")
    }
}

impl Drop for FaultServer {
    fn drop(&mut self) {
        self.kill();
        if let Some(dir) = self.dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
