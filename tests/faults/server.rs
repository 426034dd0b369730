//! A `redis-server` the fault tests can kill and restart, empty, on the same
//! port (the shared harness picks a fresh port for every start).
//!
//! Like the harness it starts the server through a small shell wrapper that
//! reads its stdin: when the test process exits, however it exits, the pipe
//! closes and the wrapper kills the server.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

fn binary() -> String {
    if let Ok(path) = std::env::var("REDIS_SERVER_BIN") {
        return path;
    }
    for candidate in ["/usr/bin/redis-server", "/usr/local/bin/redis-server"] {
        if std::path::Path::new(candidate).exists() {
            return candidate.to_owned();
        }
    }
    "redis-server".to_owned()
}

struct Running {
    pid: u32,
    wrapper: Child,
    _stdin: ChildStdin,
}

impl Running {
    fn spawn(port: u16) -> Running {
        let args = [
            binary(),
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
        let quoted: Vec<String> = args
            .iter()
            .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
            .collect();
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
        Running {
            pid: line.trim().parse().expect("redis-server pid"),
            wrapper,
            _stdin: stdin,
        }
    }

    /// Alive and not a zombie (a killed server may stay a zombie for a
    /// while when nothing reaps orphans).
    fn is_running(&self) -> bool {
        match std::fs::read_to_string(format!("/proc/{}/stat", self.pid)) {
            Ok(stat) => stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
            Err(_) => false,
        }
    }

    fn kill(mut self) {
        signal(self.pid, "-KILL");
        signal(self.pid, "-CONT");
        let _ = self.wrapper.kill();
        let _ = self.wrapper.wait();
        // Wait (bounded) until the server is dead: its sockets are closed.
        for _ in 0..400 {
            if !self.is_running() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn signal(pid: u32, sig: &str) -> bool {
    Command::new("kill")
        .args([sig, &pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A restartable `redis-server` on a fixed loopback port.
pub struct FaultServer {
    port: u16,
    running: Option<Running>,
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
        panic!("redis-server did not start (is {} installed?)", binary());
    }

    async fn try_start(&mut self, limit: Duration) -> bool {
        let running = Running::spawn(self.port);
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
