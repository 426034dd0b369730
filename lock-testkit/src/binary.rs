//! Where the `redis-server` executable is, or how to install it; and where
//! any server binary is looked for first (`installed`).
//!
//! A machine without it must not pass for a machine where every test
//! passed: nothing is skipped, every start fails with the install command.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Result};

/// How to get `redis-server` onto this machine.
pub const INSTALL_HINT: &str =
    "redis-server not found: install it with `apt-get update && apt-get install -y redis-server` \
     (scripts/test does this for you), or point REDIS_SERVER_BIN at it";

/// The `redis-server` to run: `$REDIS_SERVER_BIN`, else the usual install
/// places, else whatever `PATH` finds; an error naming the install command
/// when there is none.
///
/// ```no_run
/// let path = lock_testkit::binary::redis_server().unwrap();
/// # drop(path);
/// ```
pub fn redis_server() -> Result<String> {
    if let Some(path) = installed("REDIS_SERVER_BIN", "redis-server") {
        return Ok(path);
    }
    match Command::new("redis-server").arg("--version").output() {
        Ok(out) if out.status.success() => Ok("redis-server".to_owned()),
        _ => bail!("{INSTALL_HINT}"),
    }
}

/// The server binary `name` as a test runs it: `$var` when set, else
/// `name` where packages install it (`/usr/bin`, `/usr/local/bin`).
pub fn installed(var: &str, name: &str) -> Option<String> {
    if let Ok(path) = std::env::var(var) {
        return Some(path);
    }
    ["/usr/bin", "/usr/local/bin"]
        .iter()
        .map(|dir| format!("{dir}/{name}"))
        .find(|candidate| Path::new(candidate).exists())
}
