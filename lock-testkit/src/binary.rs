//! Where the `redis-server` executable is, or how to install it.
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
    if let Ok(path) = std::env::var("REDIS_SERVER_BIN") {
        return Ok(path);
    }
    for candidate in ["/usr/bin/redis-server", "/usr/local/bin/redis-server"] {
        if Path::new(candidate).exists() {
            return Ok(candidate.to_owned());
        }
    }
    match Command::new("redis-server").arg("--version").output() {
        Ok(out) if out.status.success() => Ok("redis-server".to_owned()),
        _ => bail!("{INSTALL_HINT}"),
    }
}
