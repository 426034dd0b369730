use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "order:<id>", fair = "yes")]
async fn pay(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "order:<id>", fair = 1)]
async fn refund(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
