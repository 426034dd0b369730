use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "order:<order_id>")]
async fn pay(id: u64, amount: u64) -> Result<u64, LockError> {
    Ok(id + amount)
}

#[distributed_lock(key = "order:<ide>")]
async fn refund(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "tenant:<self.tenant>")]
async fn no_receiver() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
