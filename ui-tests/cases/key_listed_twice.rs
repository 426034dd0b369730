use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = ["account:<from>", "account:<to>", "account:<from>"])]
async fn transfer(from: u64, to: u64) -> Result<u64, LockError> {
    Ok(from + to)
}

// The same text, written with `format!`'s escape once and without it once.
#[distributed_lock(key = ["set{:<id>", "set{{:<id>"])]
async fn escaped(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {}
