//! A body that is one expression on one line, under `#![deny(warnings)]`: the expansion
//! puts the body's block inside its own, and that block must not read as redundant braces
//! (`unused_braces`) in the user's code.
#![deny(warnings)]

use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "order:<id>")]
async fn pay(id: u64) -> Result<u64, LockError> { Ok(id) }

#[distributed_lock(key = "orders")]
async fn count() -> Result<u64, LockError> { Ok(1) }

fn main() {
    let _ = (pay(1), count());
}
