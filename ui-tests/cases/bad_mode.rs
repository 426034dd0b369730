use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "cfg:<tenant>", mode = "reed")]
async fn config(tenant: u64) -> Result<u64, LockError> {
    Ok(tenant)
}

#[distributed_lock(key = "cfg:<tenant>", mode = "shared")]
async fn peek(tenant: u64) -> Result<u64, LockError> {
    Ok(tenant)
}

#[distributed_lock(key = "cfg:<tenant>", mode = "upgradable")]
async fn edit(tenant: u64) -> Result<u64, LockError> {
    Ok(tenant)
}

fn main() {}
