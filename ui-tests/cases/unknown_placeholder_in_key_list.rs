use lock_runtime::{distributed_lock, LockError};

// Each key is checked as a single key is, and each mistake is reported at its own key.
#[distributed_lock(key = ["account:<form>", "account:<to>", "audit:{to}", "account:<from.id"])]
async fn transfer(from: u64, to: u64) -> Result<u64, LockError> {
    Ok(from + to)
}

fn main() {}
