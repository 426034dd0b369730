use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = [], lease = "10s")]
async fn transfer(from: u64, to: u64) -> Result<u64, LockError> {
    Ok(from + to)
}

fn main() {}
