//! A `redis-server` the fault tests can kill and restart, empty, on the same
//! port (the shared harness picks a fresh port for every start).
//!
//! The process itself is the harness's `ServerProcess` (a shell wrapper kills
//! the server when the test process exits, however it exits).

use std::net::TcpListener;
use std::time::Duration;

use lock_tests::ServerProcess;
use tokio::time::Instant;

/// A restartable `redis-server` on a fixed loopback port.
pub struct FaultServer {
    port: u16,
    running: Option<ServerProcess>,
}

impl FaultServer {
    /// Starts a server (no persistence) on a free port.
    pub async fn start() -> FaultServer {
        for _attempt in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("probe a free loopback port")
                .port();
            let mut server = FaultServer {
                port,
                running: None,
            };
            if server.try_start(Duration::from_secs(10)).await {
                return server;
            }
        }
        panic!("{}", lock_tests::INSTALL_HINT);
    }

    async fn try_start(&mut self, limit: Duration) -> bool {
        let running = ServerProcess::spawn(self.port, &[]);
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
    /// is still being freed, for at most 10 s).
    pub async fn restart(&mut self) {
        self.kill();
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
    }
}
