use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = ["account:<from>", to, 42])]
async fn transfer(from: u64, to: u64) -> Result<u64, LockError> {
    Ok(from + to)
}

#[distributed_lock(key = ("account:<from>", "account:<to>"))]
async fn tuple(from: u64, to: u64) -> Result<u64, LockError> {
    Ok(from + to)
}

fn main() {}
