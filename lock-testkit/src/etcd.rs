//! etcd members on loopback ports: one alone, or a cluster of three, each
//! a real `etcd` process (Debian `etcd-server`) that dies with the test
//! process, with its data directory in memory.
//!
//! Started with a 10 ms heartbeat and a 100 ms election timeout: a cluster
//! elects a leader in well under a second, and the server's minimum lease
//! TTL drops to one second. A member keeps its ports and data directory
//! across [`EtcdCluster::kill`] and [`EtcdCluster::restart`], as a machine
//! rebooting would.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use crate::binary::installed;
use crate::port::try_free_port;
use crate::process::{self, ServerProcess};
use crate::signal::{self, Signal};

/// How to get etcd onto this machine.
pub const ETCD_INSTALL_HINT: &str =
    "etcd not found: install it with `apt-get update && apt-get install -y etcd-server \
     etcd-client` (scripts/test does this for you), or point ETCD_BIN at it";

/// How long a member may take to answer `/health` after a start.
const READY_LIMIT: Duration = Duration::from_secs(20);

/// The `etcd` to run: `$ETCD_BIN`, else the usual install places; an error
/// naming the install command when there is none.
pub fn etcd_binary() -> Result<String> {
    installed("ETCD_BIN", "etcd").ok_or_else(|| anyhow!("{ETCD_INSTALL_HINT}"))
}

/// The `etcdctl` to run (`$ETCDCTL_BIN`, else the usual install places).
pub fn etcdctl_binary() -> Result<String> {
    installed("ETCDCTL_BIN", "etcdctl").ok_or_else(|| anyhow!("{ETCD_INSTALL_HINT}"))
}

/// One member: its name, ports, data directory and process.
struct Member {
    name: String,
    client_port: u16,
    /// A second client listener that speaks TLS (see [`EtcdCluster::try_start_tls`]).
    tls_port: u16,
    peer_port: u16,
    dir: PathBuf,
    running: Option<ServerProcess>,
    pid: u32,
}

/// etcd members forming one cluster (one member, or three).
pub struct EtcdCluster {
    binary: String,
    token: String,
    members: Vec<Member>,
    /// Server certificate and key files (PEM), and the CA that client
    /// certificates must chain to (mutual TLS), when members listen for TLS
    /// clients too.
    tls: Option<Tls>,
}

/// The TLS files of a cluster's client listeners.
#[derive(Clone, Debug)]
pub struct Tls {
    /// The server certificate (PEM file), for 127.0.0.1.
    pub cert: String,
    /// Its private key (PEM file).
    pub key: String,
    /// A CA (PEM file) that client certificates must chain to; `None`: no
    /// client certificate is asked for.
    pub client_ca: Option<String>,
}

impl std::fmt::Debug for EtcdCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdCluster")
            .field("endpoints", &self.endpoints())
            .finish_non_exhaustive()
    }
}

impl EtcdCluster {
    /// Starts `size` members forming a new cluster and waits until every
    /// one answers healthy (a leader is elected); the error names the
    /// install command when etcd is missing.
    pub fn try_start(size: usize) -> Result<EtcdCluster> {
        Self::try_start_with(size, None)
    }

    /// [`try_start`](Self::try_start) with members that also listen for TLS
    /// clients, on the ports of [`tls_endpoints`](Self::tls_endpoints)
    /// (plain clients, the health checks among them, keep theirs).
    pub fn try_start_tls(size: usize, tls: Tls) -> Result<EtcdCluster> {
        Self::try_start_with(size, Some(tls))
    }

    fn try_start_with(size: usize, tls: Option<Tls>) -> Result<EtcdCluster> {
        let binary = etcd_binary()?;
        let mut tries = 0;
        loop {
            tries += 1;
            match Self::try_start_once(&binary, size, tls.clone()) {
                Ok(cluster) => return Ok(cluster),
                // A port we picked was taken before the member bound it
                // (another test's server): new ports.
                Err(error) if tries < 3 => {
                    eprintln!("etcd cluster start failed ({error:#}); again on new ports");
                }
                Err(error) => return Err(error),
            }
        }
    }

    fn try_start_once(binary: &str, size: usize, tls: Option<Tls>) -> Result<EtcdCluster> {
        let binary = binary.to_owned();
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let token = format!("lock-testkit-{}-{n}", std::process::id());
        let mut members = Vec::with_capacity(size);
        for n in 0..size {
            members.push(Member {
                name: format!("m{n}"),
                client_port: try_free_port()?,
                tls_port: try_free_port()?,
                peer_port: try_free_port()?,
                dir: crate::server::data_dir()?,
                running: None,
                pid: 0,
            });
        }
        let mut cluster = EtcdCluster {
            binary,
            token,
            members,
            tls,
        };
        for n in 0..size {
            cluster.spawn(n, true)?;
        }
        for n in 0..size {
            cluster.wait_healthy(n)?;
        }
        Ok(cluster)
    }

    /// [`try_start`](Self::try_start), panicking with the error (how a test
    /// fails, install command included).
    pub fn start(size: usize) -> EtcdCluster {
        Self::try_start(size).unwrap_or_else(|e| panic!("{e:#}"))
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&mut self, n: usize, new: bool) -> Result<()> {
        let initial = self.initial_cluster();
        let member = &self.members[n];
        let mut client = format!("http://127.0.0.1:{}", member.client_port);
        if self.tls.is_some() {
            client.push_str(&format!(",https://127.0.0.1:{}", member.tls_port));
        }
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        let dir = member.dir.join("data");
        let dir = dir.to_string_lossy().into_owned();
        let state = if new { "new" } else { "existing" };
        let mut command = vec![
            self.binary.as_str(),
            "--name",
            &member.name,
            "--data-dir",
            &dir,
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
            "--initial-cluster",
            &initial,
            "--initial-cluster-token",
            &self.token,
            "--initial-cluster-state",
            state,
            "--heartbeat-interval",
            "10",
            "--election-timeout",
            "100",
            "--logger",
            "zap",
            "--log-level",
            "error",
        ];
        if let Some(tls) = &self.tls {
            command.extend(["--cert-file", &tls.cert, "--key-file", &tls.key]);
            if let Some(ca) = &tls.client_ca {
                command.extend(["--client-cert-auth", "--trusted-ca-file", ca]);
            }
        }
        let process = ServerProcess::spawn_program(&command)
            .with_context(|| format!("start etcd member {}", member.name))?;
        let member = &mut self.members[n];
        member.pid = process.pid();
        member.running = Some(process);
        Ok(())
    }

    /// Waits (at most 20 s) until member `n` answers `/health` with true.
    fn wait_healthy(&self, n: usize) -> Result<()> {
        let started = Instant::now();
        let port = self.members[n].client_port;
        while started.elapsed() < READY_LIMIT {
            if health(port) && process::listens_on(self.members[n].pid, port) {
                return Ok(());
            }
            if !self.members[n]
                .running
                .as_ref()
                .is_some_and(ServerProcess::is_running)
            {
                bail!("etcd member {} exited at start", self.members[n].name);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!(
            "etcd member {} not healthy within {READY_LIMIT:?}",
            self.members[n].name
        )
    }

    /// The members' client endpoints, `127.0.0.1:port`.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// The members' TLS client endpoints, `https://127.0.0.1:port` (a
    /// cluster started with [`try_start_tls`](Self::try_start_tls)).
    pub fn tls_endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("https://127.0.0.1:{}", m.tls_port))
            .collect()
    }

    /// Member `n`'s client endpoint.
    pub fn endpoint(&self, n: usize) -> String {
        format!("127.0.0.1:{}", self.members[n].client_port)
    }

    /// How many members.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// The index of the member that leads now (asked of every running
    /// member with `etcdctl endpoint status`), if one answers.
    pub fn leader(&self) -> Option<usize> {
        let etcdctl = etcdctl_binary().ok()?;
        for member in self.members.iter().filter(|m| m.running.is_some()) {
            let out = Command::new(&etcdctl)
                .env("ETCDCTL_API", "3")
                .args([
                    "--endpoints",
                    &format!("127.0.0.1:{}", member.client_port),
                    "--command-timeout",
                    "1s",
                    "endpoint",
                    "status",
                    "-w",
                    "fields",
                ])
                .output()
                .ok()?;
            let text = String::from_utf8_lossy(&out.stdout);
            let field = |name: &str| {
                text.lines()
                    .find(|l| l.starts_with(&format!("\"{name}\"")))
                    .and_then(|l| l.split(':').nth(1))
                    .map(|v| v.trim().to_owned())
            };
            let (Some(id), Some(leader)) = (field("MemberID"), field("Leader")) else {
                continue;
            };
            if id == leader {
                return self.members.iter().position(|m| std::ptr::eq(m, member));
            }
            // Ask the leader's own endpoint too: the loop reaches it.
        }
        None
    }

    /// SIGKILLs member `n` (its data directory stays).
    pub fn kill(&mut self, n: usize) {
        if let Some(process) = self.members[n].running.take() {
            process.kill();
        }
    }

    /// Starts member `n` again from its data directory, and waits until it
    /// is healthy.
    pub fn restart(&mut self, n: usize) {
        self.kill(n);
        self.spawn(n, false).unwrap_or_else(|e| panic!("{e:#}"));
        self.wait_healthy(n).unwrap_or_else(|e| panic!("{e:#}"));
    }

    /// Kills every member and starts them all again from their data
    /// directories (a whole-cluster power cut); waits until all are healthy.
    pub fn restart_all(&mut self) {
        for n in 0..self.members.len() {
            self.kill(n);
        }
        for n in 0..self.members.len() {
            self.spawn(n, false).unwrap_or_else(|e| panic!("{e:#}"));
        }
        for n in 0..self.members.len() {
            self.wait_healthy(n).unwrap_or_else(|e| panic!("{e:#}"));
        }
    }

    /// SIGSTOPs member `n`: its connections stay open, nothing answers.
    pub fn freeze(&self, n: usize) {
        signal::send(self.members[n].pid, Signal::Stop)
            .unwrap_or_else(|e| panic!("SIGSTOP etcd: {e:#}"));
    }

    /// SIGCONTs member `n`.
    pub fn thaw(&self, n: usize) {
        signal::send(self.members[n].pid, Signal::Cont)
            .unwrap_or_else(|e| panic!("SIGCONT etcd: {e:#}"));
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for member in &mut self.members {
            if let Some(process) = member.running.take() {
                process.kill();
            }
            let _ = std::fs::remove_dir_all(&member.dir);
        }
    }
}

/// Whether the member on `port` answers `/health` with `"health":"true"`.
fn health(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let request = format!("GET /health HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.contains("\"health\":\"true\"")
}
