//! A private `redis-server` for one benchmark process.
//!
//! The numbers only mean something against a server nobody else uses, with
//! nothing written to disk, so the harness starts its own on a free loopback
//! port. It runs under a small `sh` wrapper that blocks reading its stdin and
//! kills the server when that pipe closes: however the harness ends (normal
//! exit, panic, Ctrl-C, SIGKILL), its server goes with it.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// How to get `redis-server` when it is missing.
const INSTALL_HINT: &str = "redis-server not found: install it with \
     `apt-get update && apt-get install -y redis-server`, or point REDIS_SERVER_BIN at it";

/// A running private server; killed on drop.
pub struct RedisServer {
    port: u16,
    pid: u32,
    wrapper: Child,
    _stdin: ChildStdin,
}

impl std::fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisServer")
            .field("port", &self.port)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

fn binary() -> Result<String> {
    if let Ok(path) = std::env::var("REDIS_SERVER_BIN") {
        return Ok(path);
    }
    for candidate in ["/usr/bin/redis-server", "/usr/local/bin/redis-server"] {
        if std::path::Path::new(candidate).exists() {
            return Ok(candidate.to_owned());
        }
    }
    match Command::new("redis-server").arg("--version").output() {
        Ok(out) if out.status.success() => Ok("redis-server".to_owned()),
        _ => bail!("{INSTALL_HINT}"),
    }
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("bind a free loopback port")?;
    Ok(listener.local_addr()?.port())
}

fn shell_quote(arg: &str) -> String {
    format!("'{}'", arg.replace('\'', r"'\''"))
}

impl RedisServer {
    /// Starts a server with no persistence on a free loopback port and waits
    /// (at most 10 s) until it answers `PING`.
    pub fn start() -> Result<RedisServer> {
        let binary = binary()?;
        for _attempt in 0..5 {
            let port = free_port()?;
            let port_arg = port.to_string();
            let args = [
                binary.as_str(),
                "--port",
                &port_arg,
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--loglevel",
                "warning",
            ];
            let command: Vec<String> = args.iter().map(|a| shell_quote(a)).collect();
            // Start the server, print its pid, wait for stdin to close, kill it.
            let script = format!(
                "{} >/dev/null 2>&1 & pid=$!; echo $pid; read _; kill -9 $pid 2>/dev/null",
                command.join(" ")
            );
            let mut wrapper = Command::new("sh")
                .arg("-c")
                .arg(script)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .context("start sh for redis-server")?;
            let stdin = wrapper.stdin.take().context("wrapper stdin")?;
            let stdout = wrapper.stdout.take().context("wrapper stdout")?;
            let mut line = String::new();
            BufReader::new(stdout)
                .read_line(&mut line)
                .context("read the redis-server pid")?;
            let pid: u32 = line
                .trim()
                .parse()
                .with_context(|| format!("redis-server pid, got {line:?}"))?;
            let server = RedisServer {
                port,
                pid,
                wrapper,
                _stdin: stdin,
            };
            if server.wait_ready(Duration::from_secs(10)) {
                return Ok(server);
            }
            // The port was taken between our probe and the server's bind.
        }
        bail!("redis-server did not start (is {binary} working?)")
    }

    fn wait_ready(&self, limit: Duration) -> bool {
        let start = Instant::now();
        let Ok(client) = redis::Client::open(self.url()) else {
            return false;
        };
        while start.elapsed() < limit {
            if let Ok(mut con) = client.get_connection() {
                if redis::cmd("PING").query::<String>(&mut con).is_ok() {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's version string, e.g. `7.0.15`.
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
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-9", &self.pid.to_string()])
            .status();
        let _ = self.wrapper.kill();
        let _ = self.wrapper.wait();
    }
}
