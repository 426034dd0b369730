//! The command line: what `lockctl --help` shows.

use std::time::Duration;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::duration::parse_duration;
use crate::topology::Flags;

/// Inspect and operate lock-runtime's locks in Redis (one server, a
/// Cluster, Sentinel or Redlock), etcd or ZooKeeper.
///
/// The servers come from the flags, else from the variables the runtime's
/// `init_from_env` reads: LOCK_REDIS_URL or REDIS_URL; LOCK_REDIS_CLUSTER;
/// LOCK_REDLOCK_URLS or REDLOCK_URLS; REDIS_SENTINELS with
/// REDIS_SENTINEL_SERVICE (and REDIS_USERNAME, REDIS_PASSWORD, REDIS_DB);
/// LOCK_ETCD_ENDPOINTS (and LOCK_ETCD_USER, LOCK_ETCD_PASSWORD);
/// LOCK_ZOOKEEPER (and LOCK_ZOOKEEPER_USER, LOCK_ZOOKEEPER_PASSWORD);
/// LOCK_BACKEND to choose; LOCK_PREFIX. etcd and ZooKeeper need the cargo
/// features `etcd` and `zookeeper`.
#[derive(Debug, Parser)]
#[command(
    name = "lockctl",
    version,
    after_help = "Exit codes:\n  0  found, or done\n  1  not found (a free key, no locks) or \
                  refused (a \"no\" at the question)\n  2  usage or connection error\n  3  \
                  partial answer: a server did not answer (named on stderr), what was printed \
                  may be incomplete"
)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) servers: Servers,
    /// The key prefix of the locks (default: $LOCK_PREFIX, else `lock:`,
    /// as the runtime's).
    #[arg(long, global = true, value_name = "PREFIX")]
    pub(crate) prefix: Option<String>,
    /// Print JSON instead of text (one object; `watch`: one per line).
    #[arg(long, global = true)]
    pub(crate) json: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Where the locks are (at most one of these; none: the environment).
#[derive(Debug, Args)]
pub(crate) struct Servers {
    /// One Redis server (default: $LOCK_REDIS_URL, else $REDIS_URL).
    #[arg(long, global = true, value_name = "URL")]
    pub(crate) redis_url: Option<String>,
    /// A Redis Cluster: some of its nodes, comma-separated (default:
    /// $LOCK_REDIS_CLUSTER). Every master is listed; `show` and `release`
    /// follow MOVED.
    #[arg(long, global = true, value_name = "URLS")]
    pub(crate) cluster: Option<String>,
    /// Redlock: every master, comma-separated (default: $LOCK_REDLOCK_URLS,
    /// else $REDLOCK_URLS). Shows the quorum view and each master's.
    #[arg(long, global = true, value_name = "URLS")]
    pub(crate) redlock: Option<String>,
    /// Redis Sentinel: the sentinels, comma-separated `host:port` (default:
    /// $REDIS_SENTINELS); the locks are on the primary they name now.
    #[arg(long, global = true, value_name = "ADDRS")]
    pub(crate) sentinels: Option<String>,
    /// The service the sentinels monitor (default: $REDIS_SENTINEL_SERVICE).
    #[arg(long, global = true, value_name = "NAME")]
    pub(crate) sentinel_service: Option<String>,
    /// etcd: some of its members, comma-separated `host:port` (default:
    /// $LOCK_ETCD_ENDPOINTS; user and password from $LOCK_ETCD_USER and
    /// $LOCK_ETCD_PASSWORD).
    #[arg(long, global = true, value_name = "ENDPOINTS")]
    pub(crate) etcd: Option<String>,
    /// ZooKeeper: its connect string, `host:port[,host:port…][/chroot]`
    /// (default: $LOCK_ZOOKEEPER; user and password from
    /// $LOCK_ZOOKEEPER_USER and $LOCK_ZOOKEEPER_PASSWORD).
    #[arg(long, global = true, value_name = "SERVERS")]
    pub(crate) zookeeper: Option<String>,
}

/// The command line as clap sees it: the derived one, with the version
/// line naming lock-runtime and the backends built in (`version.rs`).
pub(crate) fn command() -> clap::Command {
    Cli::command().version(crate::version::line())
}

/// The parsed command line (exits with clap's message and code 2 on a
/// usage error, and prints `--help` and `--version`).
pub(crate) fn parse() -> Cli {
    let matches = command().get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

impl Servers {
    /// The flags as the topology reads them.
    pub(crate) fn flags(&self) -> Flags<'_> {
        Flags {
            redis_url: self.redis_url.as_deref(),
            cluster: self.cluster.as_deref(),
            redlock: self.redlock.as_deref(),
            sentinels: self.sentinels.as_deref(),
            sentinel_service: self.sentinel_service.as_deref(),
            etcd: self.etcd.as_deref(),
            zookeeper: self.zookeeper.as_deref(),
        }
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Lists the locks held now, with holder, token and lease left.
    List {
        /// Show at most this many locks.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
    },
    /// Shows one lock: holder, holds, lease left, fencing token, fair queue.
    Show {
        /// The lock's key, as the application names it (`order:42`).
        key: String,
    },
    /// Prints acquisitions and releases of one lock as they happen, until
    /// ctrl-c, `--for` or `--count`.
    Watch {
        /// The lock's key.
        key: String,
        /// Stop after this long (`30s`, `500ms`, `5m`).
        #[arg(long = "for", value_name = "DURATION", value_parser = parse_duration)]
        duration: Option<Duration>,
        /// Stop after this many acquisitions and releases.
        #[arg(long)]
        count: Option<u64>,
        /// How often to look for new holders (releases are seen at once;
        /// on etcd and ZooKeeper every change is).
        #[arg(long, default_value = "100ms", value_parser = parse_duration)]
        interval: Duration,
    },
    /// Prints the shell's completion script (bash, zsh, fish, elvish,
    /// powershell): `lockctl completions bash >
    /// ~/.local/share/bash-completion/completions/lockctl`.
    Completions {
        /// The shell to complete in.
        shell: clap_complete::Shell,
    },
    /// Frees a lock whoever holds it (the holder learns at its next
    /// renewal that it lost it).
    Release {
        /// The lock's key.
        key: String,
        /// Required: says that you mean to take the lock from its holder.
        #[arg(long)]
        force: bool,
        /// Do not ask for confirmation on stdin (with `--force`).
        #[arg(long)]
        yes: bool,
    },
}
