//! One `redis-server` process that cannot outlive the process that started
//! it.
//!
//! The server runs under a small `sh` wrapper that prints the server's pid
//! and then blocks reading its stdin, whose other end only we hold. When we
//! exit — normally, by a panic, Ctrl-C or SIGKILL — the pipe closes, `read`
//! returns, and the wrapper kills the server. A frozen (SIGSTOPped) server
//! is sent SIGCONT after SIGKILL on every path, here and in the wrapper, so
//! that it dies at once and is reaped instead of lingering stopped.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::signal::{self, Signal};

/// A running `redis-server` and the wrapper that kills it when we exit;
/// killed on drop.
pub struct ServerProcess {
    pid: u32,
    wrapper: Child,
    _stdin: ChildStdin,
}

impl std::fmt::Debug for ServerProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerProcess")
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

/// `'arg'`, with any `'` inside escaped for `sh`.
fn shell_quote(arg: &str) -> String {
    format!("'{}'", arg.replace('\'', r"'\''"))
}

impl ServerProcess {
    /// Starts `binary` on 127.0.0.1:`port`, no persistence, with `extra`
    /// arguments after the defaults (a later argument wins). Returns at once,
    /// before the server answers.
    ///
    /// ```no_run
    /// use lock_testkit::process::ServerProcess;
    /// let binary = lock_testkit::binary::redis_server().unwrap();
    /// let server = ServerProcess::spawn(&binary, 6390, &["--maxclients", "64"]).unwrap();
    /// server.kill();
    /// ```
    pub fn spawn(binary: &str, port: u16, extra: &[&str]) -> Result<ServerProcess> {
        Self::spawn_in(binary, None, port, extra)
    }

    /// Like [`spawn`](Self::spawn), reading the configuration file `config`
    /// first (a sentinel needs one it can rewrite: `extra` then holds
    /// `--sentinel`).
    pub fn spawn_with_config(
        binary: &str,
        config: &str,
        port: u16,
        extra: &[&str],
    ) -> Result<ServerProcess> {
        Self::spawn_in(binary, Some(config), port, extra)
    }

    fn spawn_in(
        binary: &str,
        config: Option<&str>,
        port: u16,
        extra: &[&str],
    ) -> Result<ServerProcess> {
        let port = port.to_string();
        let defaults = [
            "--port",
            &port,
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
        let command: Vec<&str> = std::iter::once(&binary)
            .chain(config.as_ref())
            .chain(defaults.iter())
            .chain(extra)
            .copied()
            .collect();
        Self::spawn_wrapped(&command)
    }

    /// Starts any server program (`command`: the program and its arguments)
    /// under the same wrapper, so it dies with this process too (etcd, say).
    /// Returns at once, before the server answers.
    pub fn spawn_program(command: &[&str]) -> Result<ServerProcess> {
        Self::spawn_wrapped(command)
    }

    fn spawn_wrapped(command: &[&str]) -> Result<ServerProcess> {
        let command: Vec<String> = command.iter().map(|a| shell_quote(a)).collect();
        let script = format!(
            "{} >/dev/null 2>&1 & pid=$!; echo $pid; read _; \
             kill -9 $pid 2>/dev/null; kill -CONT $pid 2>/dev/null",
            command.join(" ")
        );
        let mut wrapper = Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("start sh for a server")?;
        let stdin = wrapper.stdin.take().context("wrapper stdin")?;
        let stdout = wrapper.stdout.take().context("wrapper stdout")?;
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .context("read the server pid")?;
        let pid = line
            .trim()
            .parse()
            .with_context(|| format!("server pid, got {line:?}"))?;
        Ok(ServerProcess {
            pid,
            wrapper,
            _stdin: stdin,
        })
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Alive and not a zombie (a killed server may stay a zombie for a while
    /// when nothing reaps orphans).
    pub fn is_running(&self) -> bool {
        is_running(self.pid)
    }

    /// SIGKILLs the server (then SIGCONT, in case it was frozen) and waits,
    /// at most 2 s, until it is gone.
    pub fn kill(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        // Either may fail: the server may be gone already.
        let _ = signal::send(self.pid, Signal::Kill);
        let _ = signal::send(self.pid, Signal::Cont);
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

/// Whether `pid` is alive and not a zombie, from `/proc/<pid>/stat`.
pub(crate) fn is_running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which may hold spaces or `)`.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Whether process `pid` itself listens on loopback `port`: a listening
/// socket on that port (from `/proc/net/tcp` and `tcp6`) among the
/// process's open files. A readiness probe that only asks "does something
/// answer on the port?" can be answered by another test's server that took
/// the port between our probe for a free one and our server's bind (ours
/// then exits, and the test would use a stranger's server).
///
/// ```
/// let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
/// let port = listener.local_addr().unwrap().port();
/// assert!(lock_testkit::process::listens_on(std::process::id(), port));
/// // A process that does not hold the socket (the parent, here) does not.
/// assert!(!lock_testkit::process::listens_on(std::os::unix::process::parent_id(), port));
/// drop(listener);
/// assert!(!lock_testkit::process::listens_on(std::process::id(), port));
/// ```
pub fn listens_on(pid: u32, port: u16) -> bool {
    let inodes = listening_inodes(port);
    if inodes.is_empty() {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|target| {
            target
                .to_str()
                .and_then(|t| t.strip_prefix("socket:["))
                .and_then(|t| t.strip_suffix(']'))
                .is_some_and(|inode| inodes.iter().any(|i| i == inode))
        })
    })
}

/// The socket inodes listening on `port`, IPv4 and IPv6.
fn listening_inodes(port: u16) -> Vec<String> {
    const LISTEN: &str = "0A";
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        // Columns: sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state), Some(inode)) =
                (fields.get(1), fields.get(3), fields.get(9))
            else {
                continue;
            };
            let local_port = local
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if *state == LISTEN && local_port == Some(port) {
                inodes.push((*inode).to_owned());
            }
        }
    }
    inodes
}
