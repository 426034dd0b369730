use lock_runtime::{distributed_lock, LockError};

trait Store {
    #[distributed_lock(key = "load:<id>")]
    async fn load(&self, id: u64) -> Result<u64, LockError>;
}

fn main() {}
