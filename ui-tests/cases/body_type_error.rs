use lock_runtime::{distributed_lock, LockError};

// A mistake in the body is reported by rustc at the mistake, as without the attribute.
#[distributed_lock(key = "order:<id>")]
async fn pay(id: u64) -> Result<u64, LockError> {
    let total: u64 = "not a number";
    Ok(id + total)
}

#[distributed_lock(key = "order:<id>")]
async fn wrong_ok_type(id: u64) -> Result<u64, LockError> {
    if id == 0 {
        return Ok("zero");
    }
    Ok(id)
}

fn main() {}
