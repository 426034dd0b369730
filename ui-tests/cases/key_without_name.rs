use lock_runtime::{distributed_lock, LockError};

#[distributed_lock("order:<id>")]
async fn pay(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock("order:<id>", lease = "30s")]
async fn refund(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
