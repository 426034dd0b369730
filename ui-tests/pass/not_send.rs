//! A body holding an `Rc` across an await compiles, and the future is usable where a
//! non-`Send` future is (a `LocalSet`), like the original `async fn`.
use std::rc::Rc;

use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "local:<id>")]
async fn local(id: u64) -> Result<usize, LockError> {
    let shared = Rc::new(id);
    tokio::task::yield_now().await;
    Ok(Rc::strong_count(&shared))
}

fn main() {
    let set = tokio::task::LocalSet::new();
    let _ = set.spawn_local(local(1));
}
