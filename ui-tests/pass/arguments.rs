//! Every argument, in both forms where there are two.
use std::time::Duration;

use lock_runtime::{distributed_lock, LockError};

mod reexport {
    pub use lock_runtime as locks;
}

const LEASE: Duration = Duration::from_secs(10);

#[distributed_lock(
    key = "all:<id>",
    lease = "1m30s",
    wait = "250ms",
    watchdog = false,
    on_lost = "continue",
    fair = true,
    crate = "crate::reexport::locks"
)]
async fn all(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "expr:<id>", lease = LEASE, wait = Duration::ZERO, on_lost = "abort")]
async fn expressions(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "try-once", wait = "0s", watchdog = true, fair = false, crate = ::lock_runtime)]
async fn try_once() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "literal <<{braces}> and <id>")]
async fn escapes(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {
    let _ = (all(1), expressions(1), try_once(), escapes(1));
}
