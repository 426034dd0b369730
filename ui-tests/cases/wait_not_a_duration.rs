use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "order:<id>", wait = 5)]
async fn pay(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "order:<id>", wait = true)]
async fn refund(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

const WAIT: u64 = 5;

#[distributed_lock(key = "order:<id>", wait = WAIT)]
async fn ship(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
