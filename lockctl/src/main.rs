//! `lockctl`: answers "who holds order:42, since when, with which token, how
//! many wait?" and frees a stuck lock, without redis-cli and without knowing
//! the data layout. It reads and changes locks through lock-runtime itself
//! (`inspect`, `force_unlock`, and `lock_runtime::layout` for the names), so
//! what it shows is what the runtime records.
//!
//! Exit codes, for scripts: 0 found (or done), 1 not found or refused, 2 a
//! usage or connection error.

mod cli;
mod connect;
mod duration;
mod list;
mod release;
mod report;
mod show;
mod watch;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command};
use connect::Target;

/// How a command ended, as the process's exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Found, or done (0).
    Found,
    /// Not found, or refused (1).
    NotFound,
}

/// A failure to report on stderr with exit code 2: bad usage, a bad URL, an
/// unreachable server. The message never holds a password.
#[derive(Debug)]
pub(crate) struct Failure(pub(crate) String);

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return fail(&Failure(format!("cannot start: {error}"))),
    };
    match runtime.block_on(run(cli)) {
        Ok(Outcome::Found) => ExitCode::SUCCESS,
        Ok(Outcome::NotFound) => ExitCode::from(1),
        Err(failure) => fail(&failure),
    }
}

fn fail(failure: &Failure) -> ExitCode {
    eprintln!("lockctl: error: {}", failure.0);
    ExitCode::from(2)
}

async fn run(cli: Cli) -> Result<Outcome, Failure> {
    let target = Target::from_args(cli.redis_url.as_deref(), cli.prefix.as_deref())?;
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
    }
}
