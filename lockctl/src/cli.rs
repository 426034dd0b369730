//! The command line: what `lockctl --help` shows.

use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::duration::parse_duration;

/// Inspect and operate lock-runtime's locks in Redis.
///
/// Exit codes: 0 found (or done), 1 not found or refused, 2 usage or
/// connection error.
#[derive(Debug, Parser)]
#[command(name = "lockctl", version)]
pub(crate) struct Cli {
    /// The Redis server (default: $LOCK_REDIS_URL, else $REDIS_URL).
    #[arg(long, global = true, value_name = "URL")]
    pub(crate) redis_url: Option<String>,
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
        /// How often to look for new holders (releases are seen at once).
        #[arg(long, default_value = "100ms", value_parser = parse_duration)]
        interval: Duration,
    },
    /// Frees a lock whoever holds it (the holder learns at its next
    /// renewal that it lost it).
    Release {
        /// The lock's key.
        key: String,
        /// Required: says that you mean to take the lock from its holder.
        #[arg(long)]
        force: bool,
        /// Do not ask for confirmation on stdin.
        #[arg(long)]
        yes: bool,
    },
}
