use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "pair:<a>")]
async fn pay((a, b): (u64, u64)) -> Result<u64, LockError> {
    Ok(a + b)
}

fn main() {}
