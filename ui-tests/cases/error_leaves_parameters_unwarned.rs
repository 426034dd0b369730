// A mistake in the attribute is the one message: the parameters that only
// the key reads are not reported as unused on top of it.
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "order:<id>:<tenant>", lease = "30sec")]
async fn pay(id: u64, tenant: &str, mut attempts: u32) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
