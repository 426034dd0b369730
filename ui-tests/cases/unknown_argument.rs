use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "order:<id>", laese = "30s")]
async fn pay(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "order:<id>", timeout = "5s")]
async fn refund(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "order:<id>", colour = "red")]
async fn ship(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
