//! A process that configures its lock runtime from the environment, as a
//! service would, with no `tracing` subscriber: for the tests of what a user
//! sees on stderr (the runtime is process-wide, so each case needs a process
//! of its own).
//!
//! Usage:
//!   init_from_env          `init_from_env()` twice, then takes one lock;
//!                          prints `installed <describe>` and `locked`
//!   init_from_env builder  `LockRuntime::builder().memory().build()` (the
//!                          builder's default mode reads `LOCK_FAIR`)
//! On an error: prints `error <message>` and exits with 1.

use std::process::ExitCode;
use std::time::Duration;

use lock_runtime::{LockError, LockRuntime};

async fn run(builder_only: bool) -> Result<(), LockError> {
    if builder_only {
        LockRuntime::builder().memory().build().await?;
        println!("built");
        return Ok(());
    }
    let runtime = lock_runtime::init_from_env().await?;
    // A second call finds the installed runtime and says nothing again.
    lock_runtime::init_from_env().await?;
    println!("installed {}", runtime.describe());
    let guard = runtime
        .lock("child")
        .wait(Duration::from_secs(5))
        .acquire()
        .await?;
    guard.release().await?;
    println!("locked");
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let builder_only = std::env::args().nth(1).as_deref() == Some("builder");
    match run(builder_only).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            println!("error {e}");
            ExitCode::FAILURE
        }
    }
}
