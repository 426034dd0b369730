//! `async fn` in trait impls (native async fn in traits), including a trait that requires
//! `Send` futures: the locked body stays `Send` when the original was.
use std::future::Future;

use lock_runtime::{distributed_lock, LockError};

trait Store {
    async fn load(&self, id: u64) -> Result<u64, LockError>;
}

trait SendStore: Sync {
    fn save(&self, id: u64) -> impl Future<Output = Result<(), LockError>> + Send;
}

struct Memory;

impl Store for Memory {
    #[distributed_lock(key = "load:<id>")]
    async fn load(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

impl SendStore for Memory {
    #[distributed_lock(key = "save:<id>")]
    async fn save(&self, id: u64) -> Result<(), LockError> {
        let _ = id;
        Ok(())
    }
}

fn require_send<F: Future + Send>(future: F) -> F {
    future
}

fn main() {
    let _ = Memory.load(1);
    let _ = require_send(Memory.save(1));
}
