//! Private ZooKeeper servers on loopback ports: one standalone server
//! ([`ZooKeeperServer`]) and an ensemble of three ([`ZooKeeperEnsemble`]),
//! for the fault tests killed, restarted from their data directory (one
//! server, or the whole ensemble) and frozen.
//!
//! Each server is the Debian `zookeeper` package's JVM
//! (`ZooKeeperServerMain` standalone, `QuorumPeerMain` in an ensemble) with
//! a minimal `zoo.cfg` written into its own data directory. The tick is
//! short (200 ms) so that the server's session timeouts and elections are
//! test-sized, and the largest session timeout a client may ask for is
//! raised to a minute, so that the runtime's session timeout can follow its
//! default lease. A server counts as ready when `srvr` reports a `Mode:`:
//! `ruok` answers `imok` before the server serves anything.
//!
//! The data directory outlives a kill, so a restart comes back with the
//! nodes and the sessions that were there (a session whose client
//! reconnects within its timeout goes on; ephemeral nodes of one that does
//! not are deleted when the restarted server expires it).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::port::try_free_port;
use crate::process::{self, ServerProcess};
use crate::server::data_dir;
use crate::signal::{self, Signal};

/// How to get ZooKeeper and a JRE onto this machine.
pub const INSTALL_HINT: &str = "ZooKeeper not found: install it with `apt-get update && \
     apt-get install -y zookeeper default-jre-headless` (scripts/test does this for you)";

/// The server's tick: session timeouts are clamped to 2..20 ticks unless
/// the configuration says otherwise (ours raises the upper bound).
pub const TICK: Duration = Duration::from_millis(200);

/// The smallest session timeout the test servers grant (2 ticks).
pub const MIN_SESSION_TIMEOUT: Duration = Duration::from_millis(400);

/// The largest session timeout the test servers grant.
pub const MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(60);

/// The jar of the server, as the Debian package installs it (its manifest
/// names the jars it needs).
const SERVER_JAR: &str = "/usr/share/java/zookeeper.jar";

/// A logger for the server's slf4j, writing to its log file.
const LOGGER_JAR: &str = "/usr/share/java/slf4j-simple.jar";

/// How long a first start may take to serve (a JVM on two busy cores).
const READY_LIMIT: Duration = Duration::from_secs(40);

/// The `java` to run: `$JAVA_HOME/bin/java`, else the one on `PATH`; an
/// error naming the install command when it or the server's jar is missing.
pub fn java() -> Result<String> {
    if !Path::new(SERVER_JAR).exists() {
        bail!("{INSTALL_HINT}");
    }
    if let Ok(home) = std::env::var("JAVA_HOME") {
        let java = Path::new(&home).join("bin/java");
        if java.exists() {
            return Ok(java.to_string_lossy().into_owned());
        }
    }
    let on_path = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join("java").exists()))
        .unwrap_or(false);
    if !on_path {
        bail!("{INSTALL_HINT}");
    }
    Ok("java".to_owned())
}

/// One ZooKeeper server process: its configuration, data directory and
/// client port stay the same across restarts.
struct Node {
    java: String,
    main: &'static str,
    dir: PathBuf,
    port: u16,
    running: Option<ServerProcess>,
    /// Pid of the latest process, kept after a kill.
    pid: u32,
}

impl Node {
    /// Writes `zoo.cfg` (`lines` after the common settings) into a fresh
    /// data directory.
    fn new(java: &str, main: &'static str, port: u16, lines: &[String]) -> Result<Node> {
        let dir = data_dir()?;
        let mut config = format!(
            "tickTime={}\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
             admin.enableServer=false\n4lw.commands.whitelist=*\n\
             minSessionTimeout={}\nmaxSessionTimeout={}\n\
             preAllocSize=1024\n",
            TICK.as_millis(),
            dir.display(),
            MIN_SESSION_TIMEOUT.as_millis(),
            MAX_SESSION_TIMEOUT.as_millis(),
        );
        for line in lines {
            config.push_str(line);
            config.push('\n');
        }
        std::fs::write(dir.join("zoo.cfg"), config).context("write zoo.cfg")?;
        Ok(Node {
            java: java.to_owned(),
            main,
            dir,
            port,
            running: None,
            pid: 0,
        })
    }

    fn spawn(&self) -> Result<ServerProcess> {
        let config = self.dir.join("zoo.cfg");
        let config = config.to_str().context("data directory is not UTF-8")?;
        let classpath = format!("{SERVER_JAR}:{LOGGER_JAR}");
        let log = self.dir.join("server.log");
        let log = log.to_str().context("data directory is not UTF-8")?;
        // `sh` appends the JVM's output to its log and becomes the JVM
        // (`exec`: the same pid, which the wrapper kills).
        let command = [
            "sh",
            "-c",
            r#"log="$1"; shift; exec "$@" >>"$log" 2>&1"#,
            "sh",
            log,
            self.java.as_str(),
            // Small and quick to start: a test server holds a few nodes.
            "-Xmx128m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            // Elections on loopback: no reason to wait 5 s for a dead peer.
            "-Dzookeeper.cnxTimeout=1000",
            "-cp",
            &classpath,
            self.main,
            config,
        ];
        ServerProcess::spawn_program(&command)
    }

    /// Starts the process and waits until it serves; false (and nothing
    /// running) when it does not within `limit`, or dies first.
    fn boot(&mut self, limit: Duration) -> Result<bool> {
        let process = self.spawn()?;
        if wait_serving(self.port, process.pid(), limit) {
            self.pid = process.pid();
            self.running = Some(process);
            return Ok(true);
        }
        process.kill();
        Ok(false)
    }

    /// Starts the process without waiting (an ensemble member serves only
    /// once a quorum is up).
    fn launch(&mut self) -> Result<()> {
        let process = self.spawn()?;
        self.pid = process.pid();
        self.running = Some(process);
        Ok(())
    }

    fn kill(&mut self) {
        if let Some(running) = self.running.take() {
            running.kill();
        }
    }

    fn signal(&self, signal: Signal) {
        let Some(running) = &self.running else {
            panic!("the ZooKeeper server is not running");
        };
        if let Err(e) = signal::send(running.pid(), signal) {
            panic!("{e:#}");
        }
    }

    fn serving(&self) -> bool {
        mode(self.port).is_some() && process::listens_on(self.pid, self.port)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A standalone ZooKeeper server owned by this process; killed on drop,
/// its data directory removed.
///
/// ```no_run
/// # async fn demo() {
/// let mut server = lock_testkit::ZooKeeperServer::start();
/// let connect = server.connect_string(); // 127.0.0.1:<port>
/// server.freeze(); // SIGSTOP: connections open, no answers
/// server.thaw();
/// server.restart().await; // killed, started again from its data directory
/// # drop(connect);
/// # }
/// ```
pub struct ZooKeeperServer {
    node: Node,
}

impl std::fmt::Debug for ZooKeeperServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZooKeeperServer")
            .field("port", &self.node.port)
            .field("pid", &self.node.pid)
            .finish_non_exhaustive()
    }
}

impl ZooKeeperServer {
    /// Starts a standalone server on a free loopback port and waits (at
    /// most 40 s) until it serves; an error naming the install command when
    /// ZooKeeper or Java is missing.
    pub fn try_start() -> Result<ZooKeeperServer> {
        let java = java()?;
        for _attempt in 0..5 {
            let mut node = Node::new(
                &java,
                "org.apache.zookeeper.server.ZooKeeperServerMain",
                try_free_port()?,
                &[],
            )?;
            if node.boot(READY_LIMIT)? {
                return Ok(ZooKeeperServer { node });
            }
            // The port was taken between our probe and the server's bind
            // (or the JVM failed: its log says why).
            let log = std::fs::read_to_string(node.dir.join("server.log")).unwrap_or_default();
            show_log_tail(&log);
        }
        bail!("ZooKeeper did not start (is {SERVER_JAR} working with {java}?)")
    }

    /// [`try_start`](Self::try_start), panicking with the error (the way a
    /// test fails, install command included).
    pub fn start() -> ZooKeeperServer {
        Self::try_start().unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// The server shared by every test of this test binary: started on
    /// first use, stopped when the process ends.
    pub fn shared() -> &'static ZooKeeperServer {
        static SERVER: std::sync::OnceLock<ZooKeeperServer> = std::sync::OnceLock::new();
        SERVER.get_or_init(ZooKeeperServer::start)
    }

    /// `127.0.0.1:<port>`, what a client is given.
    pub fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.node.port)
    }

    /// The client port, the same after every restart.
    pub fn port(&self) -> u16 {
        self.node.port
    }

    /// The process id of the server (of the latest one, after a restart).
    pub fn pid(&self) -> u32 {
        self.node.pid
    }

    /// SIGKILLs the server: its data directory stays. A no-op when it is
    /// not running.
    pub fn kill(&mut self) {
        self.node.kill();
    }

    /// Kills the server and starts it again on the same port from its data
    /// directory (retrying while the port is being freed, for at most 40 s):
    /// the nodes and sessions it had are back. Panics on failure.
    pub async fn restart(&mut self) {
        self.node.kill();
        start_again(&mut self.node).await;
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing
    /// answers, and no session expires meanwhile (its clock is stopped with
    /// it; it expires them once thawed, if their clients stayed away).
    pub fn freeze(&self) {
        self.node.signal(Signal::Stop);
    }

    /// Thaws a frozen server (SIGCONT).
    pub fn thaw(&self) {
        self.node.signal(Signal::Cont);
    }
}

/// An ensemble of three ZooKeeper servers on loopback (a quorum is two),
/// each with its own client port; killed on drop.
///
/// ```no_run
/// # async fn demo() {
/// let mut ensemble = lock_testkit::ZooKeeperEnsemble::start();
/// let leader = ensemble.leader().unwrap();
/// ensemble.kill(leader); // the other two elect a new leader
/// ensemble.wait_for_leader();
/// ensemble.restart(leader).await;
/// # }
/// ```
pub struct ZooKeeperEnsemble {
    nodes: Vec<Node>,
}

impl std::fmt::Debug for ZooKeeperEnsemble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ports: Vec<u16> = self.nodes.iter().map(|n| n.port).collect();
        f.debug_struct("ZooKeeperEnsemble")
            .field("ports", &ports)
            .finish_non_exhaustive()
    }
}

impl ZooKeeperEnsemble {
    /// How many servers.
    pub const SIZE: usize = 3;

    /// Starts three servers and waits (at most 40 s) until all serve, one
    /// of them the leader.
    pub fn try_start() -> Result<ZooKeeperEnsemble> {
        let java = java()?;
        for _attempt in 0..3 {
            let ports: Vec<(u16, u16, u16)> = (0..Self::SIZE)
                .map(|_| Ok((try_free_port()?, try_free_port()?, try_free_port()?)))
                .collect::<Result<_>>()?;
            // Followers notice a dead leader after syncLimit ticks (2 s).
            let mut lines = vec!["initLimit=50".to_owned(), "syncLimit=10".to_owned()];
            for (i, (_, quorum, election)) in ports.iter().enumerate() {
                lines.push(format!("server.{}=127.0.0.1:{quorum}:{election}", i + 1));
            }
            let mut nodes = Vec::new();
            for (i, (client, _, _)) in ports.iter().enumerate() {
                let node = Node::new(
                    &java,
                    "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                    *client,
                    &lines,
                )?;
                std::fs::write(node.dir.join("myid"), format!("{}\n", i + 1))
                    .context("write myid")?;
                nodes.push(node);
            }
            for node in &mut nodes {
                node.launch()?;
            }
            let ensemble = ZooKeeperEnsemble { nodes };
            let begun = Instant::now();
            while begun.elapsed() < READY_LIMIT {
                if ensemble.nodes.iter().all(Node::serving) {
                    return Ok(ensemble);
                }
                if ensemble.nodes.iter().any(|n| !process::is_running(n.pid)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            // A port was taken meanwhile, or a JVM failed: try new ports.
        }
        bail!("the ZooKeeper ensemble did not start (is {SERVER_JAR} working with {java}?)")
    }

    /// [`try_start`](Self::try_start), panicking with the error.
    pub fn start() -> ZooKeeperEnsemble {
        Self::try_start().unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// `127.0.0.1:<p1>,127.0.0.1:<p2>,127.0.0.1:<p3>`.
    pub fn connect_string(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        hosts.join(",")
    }

    /// The client port of server `i` (0-based).
    pub fn port(&self, i: usize) -> u16 {
        self.nodes[i].port
    }

    /// How many servers ([`SIZE`](Self::SIZE)).
    pub fn size(&self) -> usize {
        self.nodes.len()
    }

    /// Which server leads now, if one does (as `srvr` reports it).
    pub fn leader(&self) -> Option<usize> {
        self.nodes
            .iter()
            .position(|n| n.running.is_some() && mode(n.port).as_deref() == Some("leader"))
    }

    /// Waits (at most 40 s) until a running server leads and every running
    /// one serves; the leader. Panics when none does by then.
    pub fn wait_for_leader(&self) -> usize {
        let begun = Instant::now();
        while begun.elapsed() < READY_LIMIT {
            let running = self.nodes.iter().filter(|n| n.running.is_some());
            if running.clone().all(Node::serving) {
                if let Some(leader) = self.leader() {
                    return leader;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("no ZooKeeper server leads after {READY_LIMIT:?}");
    }

    /// SIGKILLs server `i`; its data directory stays.
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// Kills server `i` and starts it again from its data directory; it
    /// rejoins the ensemble. Panics when it does not serve within 40 s.
    pub async fn restart(&mut self, i: usize) {
        self.nodes[i].kill();
        start_again(&mut self.nodes[i]).await;
    }

    /// Kills every server and starts them all again from their data
    /// directories (a power cut of the whole ensemble): the nodes and the
    /// sessions come back, each session's timeout counted anew. Waits (at
    /// most 40 s) until every server serves again, relaunching one whose
    /// process died meanwhile (its port was still being freed); panics
    /// when they do not serve by then.
    pub async fn restart_all(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
        let begun = Instant::now();
        // Bounded by `READY_LIMIT`. All are launched before any is waited
        // for: a member serves only once a quorum of them is up.
        while begun.elapsed() < READY_LIMIT {
            for node in &mut self.nodes {
                if node.running.is_none() || !process::is_running(node.pid) {
                    node.kill();
                    node.launch().unwrap_or_else(|e| panic!("{e:#}"));
                }
            }
            let probes: Vec<(u16, u32)> = self.nodes.iter().map(|n| (n.port, n.pid)).collect();
            let serving = tokio::task::spawn_blocking(move || {
                probes
                    .iter()
                    .all(|&(port, pid)| mode(port).is_some() && process::listens_on(pid, port))
            })
            .await
            .unwrap_or(false);
            if serving {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the ZooKeeper ensemble did not serve again within {READY_LIMIT:?} of a restart");
    }

    /// Freezes server `i` (SIGSTOP).
    pub fn freeze(&self, i: usize) {
        self.nodes[i].signal(Signal::Stop);
    }

    /// Thaws server `i` (SIGCONT).
    pub fn thaw(&self, i: usize) {
        self.nodes[i].signal(Signal::Cont);
    }

    /// The ephemeral nodes whose path starts with `prefix` (the contenders
    /// of the locks under it), as the leader's `dump` lists them; an error
    /// when no server leads or the leader does not answer.
    pub fn ephemerals(&self, prefix: &str) -> Result<Vec<String>> {
        let leader = self.leader().context("no ZooKeeper server leads")?;
        let dump = four_letter(self.nodes[leader].port, "dump")?;
        // A session's nodes are listed one a line, indented, under it.
        Ok(dump
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with(prefix))
            .map(str::to_owned)
            .collect())
    }
}

/// Starts `node` again on its port, retrying while the old process's port
/// is being freed; panics when it does not serve within 40 s.
async fn start_again(node: &mut Node) {
    let begun = Instant::now();
    while begun.elapsed() < READY_LIMIT {
        let process = match node.spawn() {
            Ok(process) => process,
            Err(e) => panic!("{e:#}"),
        };
        let (port, pid) = (node.port, process.pid());
        let left = READY_LIMIT.saturating_sub(begun.elapsed());
        let serving = tokio::task::spawn_blocking(move || wait_serving(port, pid, left))
            .await
            .unwrap_or(false);
        if serving {
            node.pid = pid;
            node.running = Some(process);
            return;
        }
        process.kill();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("ZooKeeper did not restart on port {}", node.port);
}

/// A start that failed leaves its reason in the log; keep the last lines on
/// stderr, where a failing test shows them.
fn show_log_tail(log: &str) {
    let tail: Vec<&str> = log.lines().rev().take(5).collect();
    for line in tail.into_iter().rev() {
        eprintln!("zookeeper: {line}");
    }
}

/// Polls `srvr` until the server serves on its own port (not another
/// test's server that took it first), its process `pid` dies, or `limit`
/// passes.
fn wait_serving(port: u16, pid: u32, limit: Duration) -> bool {
    let begun = Instant::now();
    while begun.elapsed() < limit {
        if mode(port).is_some() && process::listens_on(pid, port) {
            return true;
        }
        if !process::is_running(pid) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// The server's `Mode:` (`standalone`, `leader`, `follower`) as `srvr`
/// reports it; `None` when it does not answer or does not serve yet.
pub fn mode(port: u16) -> Option<String> {
    let reply = four_letter(port, "srvr").ok()?;
    reply
        .lines()
        .find_map(|l| l.strip_prefix("Mode: "))
        .map(|m| m.trim().to_owned())
}

/// Sends a four-letter command (whitelisted in our `zoo.cfg`) and returns
/// the whole reply (the server closes the connection after it).
pub fn four_letter(port: u16, command: &str) -> Result<String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    stream.set_read_timeout(Some(Duration::from_secs(1)))?;
    stream.set_write_timeout(Some(Duration::from_secs(1)))?;
    stream.write_all(command.as_bytes())?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply)?;
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use super::{mode, ZooKeeperEnsemble, ZooKeeperServer};

    #[tokio::test]
    async fn a_standalone_server_serves_again_after_a_restart_on_the_same_port() {
        let mut server = ZooKeeperServer::start();
        let port = server.port();
        assert_eq!(mode(port).as_deref(), Some("standalone"));
        server.restart().await;
        assert_eq!(server.port(), port);
        assert_eq!(mode(port).as_deref(), Some("standalone"));
    }

    #[tokio::test]
    async fn an_ensemble_elects_a_new_leader_when_its_leader_is_killed() {
        let mut ensemble = ZooKeeperEnsemble::start();
        let leader = ensemble.wait_for_leader();
        ensemble.kill(leader);
        let next = ensemble.wait_for_leader();
        assert_ne!(next, leader);
        ensemble.restart(leader).await;
        assert_eq!(mode(ensemble.port(leader)).as_deref(), Some("follower"));
    }

    #[tokio::test]
    async fn a_whole_ensemble_restarted_from_its_data_serves_again_on_its_ports() {
        let mut ensemble = ZooKeeperEnsemble::start();
        let ports: Vec<u16> = (0..ensemble.size()).map(|i| ensemble.port(i)).collect();
        ensemble.restart_all().await;
        ensemble.wait_for_leader();
        for (i, port) in ports.into_iter().enumerate() {
            assert_eq!(ensemble.port(i), port);
            assert!(mode(port).is_some_and(|m| m == "leader" || m == "follower"));
        }
        // Nobody made a node: the leader lists no ephemeral one.
        assert_eq!(ensemble.ephemerals("/").ok(), Some(Vec::new()));
    }
}
