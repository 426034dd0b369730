use lock_runtime::{distributed_lock, LockError, LockMode};

#[distributed_lock(key = "cfg:<tenant>", mode = read)]
async fn config(tenant: u64) -> Result<u64, LockError> {
    Ok(tenant)
}

#[distributed_lock(key = "cfg:<tenant>", mode = LockMode::Write)]
async fn set_config(tenant: u64) -> Result<u64, LockError> {
    Ok(tenant)
}

fn main() {
    let _ = LockMode::Read;
}
