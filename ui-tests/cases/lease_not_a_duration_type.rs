use lock_runtime::{distributed_lock, LockError};

const LEASE_SECS: u64 = 30;

#[distributed_lock(key = "order:<id>", lease = LEASE_SECS)]
async fn pay(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
