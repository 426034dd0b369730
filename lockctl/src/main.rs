//! `lockctl`: answers "who holds order:42, since when, with which token, how
//! many wait?" and frees a stuck lock, without redis-cli, etcdctl or zkCli
//! and without knowing the data layout, on every backend the runtime
//! supports across processes (one Redis server, a Cluster, Sentinel,
//! Redlock; etcd and ZooKeeper with the features `etcd` and `zookeeper`).
//! It reads and changes locks through lock-runtime itself (`inspect`,
//! `force_unlock`, `backend_key` and `lock_runtime::layout` for the names),
//! so what it shows is what the runtime records.
//!
//! Exit codes, for scripts (also in `--help` and the README): 0 found or
//! done; 1 not found or refused; 2 a usage or connection error; 3 a partial
//! answer (a server did not answer: what was printed may be incomplete).

mod cli;
mod completions;
mod connect;
mod duration;
#[cfg(feature = "etcd")]
mod etcd;
mod heard;
mod keys;
mod list;
mod masters;
mod nodes;
mod output;
mod release;
mod report;
mod secret;
mod show;
mod subscribe;
mod topology;
mod version;
mod watch;
#[cfg(feature = "zookeeper")]
mod zookeeper;

use std::process::ExitCode;

use cli::{Cli, Command};
use connect::Target;

/// Exit code: found, or done.
const EXIT_FOUND: u8 = 0;
/// Exit code: not found (a free key, no locks), or refused (a "no").
const EXIT_NOT_FOUND: u8 = 1;
/// Exit code: bad usage, a bad URL, an unreachable server (clap's usage
/// errors exit 2 too).
pub(crate) const EXIT_ERROR: u8 = 2;
/// Exit code: a partial answer (a server, or part of the key space, did not
/// answer).
const EXIT_PARTIAL: u8 = 3;

/// How a command ended, as the process's exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Found, or done.
    Found,
    /// Not found, or refused.
    NotFound,
    /// Some server did not answer: what was printed may be incomplete
    /// (never reported as success).
    Partial,
}

/// A failure to report on stderr with exit code 2: bad usage, a bad URL, an
/// unreachable server. The message never holds a password.
#[derive(Debug)]
pub(crate) struct Failure(pub(crate) String);

fn main() -> ExitCode {
    let cli = cli::parse();
    // Needs no server: answered before any is looked for.
    if let Command::Completions { shell } = cli.command {
        return match completions::write(shell, &mut std::io::stdout().lock()) {
            Ok(()) => ExitCode::from(EXIT_FOUND),
            Err(failure) => fail(&failure),
        };
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return fail(&Failure(format!("cannot start: {error}"))),
    };
    ExitCode::from(match runtime.block_on(run(cli)) {
        Ok(Outcome::Found) => EXIT_FOUND,
        Ok(Outcome::NotFound) => EXIT_NOT_FOUND,
        Ok(Outcome::Partial) => EXIT_PARTIAL,
        Err(failure) => return fail(&failure),
    })
}

fn fail(failure: &Failure) -> ExitCode {
    eprintln!("lockctl: error: {}", failure.0);
    ExitCode::from(EXIT_ERROR)
}

async fn run(cli: Cli) -> Result<Outcome, Failure> {
    let target = Target::from_args(cli.servers.flags(), cli.prefix.as_deref())?;
    let json = cli.json;
    match cli.command {
        Command::List { limit } => list::run(&target, limit, json).await,
        Command::Show { key } => show::run(&target, &key, json).await,
        Command::Watch {
            key,
            duration,
            count,
            interval,
        } => {
            let limits = watch::Limits {
                duration,
                count,
                interval,
            };
            watch::run(&target, &key, limits, json).await
        }
        Command::Release { key, force, yes } => release::run(&target, &key, force, yes, json).await,
        // Answered by `main`, before any server is looked for.
        Command::Completions { .. } => Ok(Outcome::Found),
    }
}
