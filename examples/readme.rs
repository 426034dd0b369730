//! The README's first example, word for word, so that it keeps compiling
//! and running (`cargo run --example readme`).

use lock_runtime::{distributed_lock, fence, LockError};

#[distributed_lock(key = "order:<id>", lease = "30s", wait = "5s")]
async fn pay(id: u64, amount: u64) -> Result<u64, LockError> {
    check_fraud(id).await?; // the same key, nested: re-enters, no deadlock
    let token = fence().ok_or(LockError::NotInstalled)?; // larger for every new holder
    println!("charging {amount} to order {id}; storage may refuse tokens below {token}");
    Ok(token)
}

#[distributed_lock(key = "order:<id>")]
async fn check_fraud(id: u64) -> Result<(), LockError> {
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    lock_runtime::init_from_env().await?; // REDIS_URL=redis://host:6379, or embedded
    pay(42, 100).await?;
    lock_runtime::shutdown().await?; // gives back every lock still held
    Ok(())
}
