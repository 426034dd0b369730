use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "order:<id>")]
fn pay(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {
    // The fn is still emitted, so this call does not add a "cannot find function" error.
    let _ = pay(1);
}
