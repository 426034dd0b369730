//! `permits = N`: a literal or a `u32` constant, on free fns and methods, with the other
//! options and an explicit exclusive mode; the body reads its permit. Nothing left to warn
//! about.
#![deny(warnings)]

use lock_runtime::{distributed_lock, permit, LockError};

const SEGMENTS: u32 = 4;

#[distributed_lock(key = "stock:<sku>", permits = 8)]
async fn buy(sku: u64) -> Result<Option<u32>, LockError> {
    let _ = sku;
    Ok(permit())
}

#[distributed_lock(key = "stock:<sku>", permits = SEGMENTS, lease = "5s", wait = "1s", mode = "exclusive")]
async fn restock(sku: u64) -> Result<u32, LockError> {
    let _ = sku;
    permit().ok_or(LockError::NotInstalled)
}

struct Exports {
    tenant: String,
}

impl Exports {
    #[distributed_lock(key = "export:<self.tenant>", permits = 2, fair = true)]
    async fn run(&self) -> Result<(), LockError> {
        Ok(())
    }
}

fn main() {
    let exports = Exports { tenant: "t".to_owned() };
    drop((buy(1), restock(1), exports.run()));
}
