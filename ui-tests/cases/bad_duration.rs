use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "a", lease = "30sec")]
async fn unknown_unit() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "b", wait = "1.5s")]
async fn fraction() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "c", lease = "30s1m")]
async fn out_of_order() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
