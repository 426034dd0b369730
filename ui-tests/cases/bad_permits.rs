use lock_runtime::{distributed_lock, LockError};

const NONE: u32 = 0;

#[distributed_lock(key = "stock:<sku>", permits = 0)]
async fn zero(sku: u64) -> Result<u64, LockError> {
    Ok(sku)
}

#[distributed_lock(key = "stock:<sku>", permits = -2)]
async fn negative(sku: u64) -> Result<u64, LockError> {
    Ok(sku)
}

#[distributed_lock(key = "stock:<sku>", permits = 2.5)]
async fn fraction(sku: u64) -> Result<u64, LockError> {
    Ok(sku)
}

#[distributed_lock(key = "stock:<sku>", permits = "4")]
async fn quoted(sku: u64) -> Result<u64, LockError> {
    Ok(sku)
}

#[distributed_lock(key = "stock:<sku>", permits = 5000)]
async fn too_many(sku: u64) -> Result<u64, LockError> {
    Ok(sku)
}

#[distributed_lock(key = "stock:<sku>", permits = 4, mode = "read")]
async fn read(sku: u64) -> Result<u64, LockError> {
    Ok(sku)
}

#[distributed_lock(key = ["stock:<a>", "stock:<b>"], permits = 4)]
async fn two_keys(a: u64, b: u64) -> Result<u64, LockError> {
    Ok(a + b)
}

#[distributed_lock(key = "stock:<sku>", permits = NONE)]
async fn zero_constant(sku: u64) -> Result<u64, LockError> {
    Ok(sku)
}

#[distributed_lock(key = "stock:<sku>", permits = n)]
async fn not_constant(sku: u64, n: u32) -> Result<u64, LockError> {
    Ok(sku + u64::from(n))
}

fn main() {}
