use async_trait::async_trait;
use lock_runtime::{distributed_lock, LockError};

#[async_trait]
trait Store {
    async fn load(&self, id: u64) -> Result<u64, LockError>;
}

struct Memory;

// Wrong place: the attribute goes on the method, whichever order is tried on the impl.
#[distributed_lock(key = "load:<id>")]
#[async_trait]
impl Store for Memory {
    async fn load(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

struct Other;

#[async_trait]
#[distributed_lock(key = "load:<id>")]
impl Store for Other {
    async fn load(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

fn main() {}
