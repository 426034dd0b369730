use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "cfg:<tenant>", read)]
async fn config(tenant: u64) -> Result<u64, LockError> {
    Ok(tenant)
}

#[distributed_lock(key = "cfg:<tenant>", write, lease = "10s")]
async fn set_config(tenant: u64) -> Result<u64, LockError> {
    Ok(tenant)
}

#[distributed_lock(shared, key = "cfg:<tenant>")]
async fn peek(tenant: u64) -> Result<u64, LockError> {
    Ok(tenant)
}

#[distributed_lock(key = "cfg:<tenant>", exclusive = true)]
async fn reset(tenant: u64) -> Result<u64, LockError> {
    Ok(tenant)
}

#[distributed_lock(key = "cfg:<tenant>", access = "read")]
async fn list(tenant: u64) -> Result<u64, LockError> {
    Ok(tenant)
}

#[distributed_lock(key = "cfg:<tenant>", kind = "write")]
async fn update(tenant: u64) -> Result<u64, LockError> {
    Ok(tenant)
}

#[distributed_lock(key = "cfg:<tenant>", lock_mode = "read")]
async fn show(tenant: u64) -> Result<u64, LockError> {
    Ok(tenant)
}

fn main() {}
