use lock_runtime::{distributed_lock, LockError};

/// A pattern written by a macro: what it binds is only known once it expands.
macro_rules! pair {
    ($a:ident, $b:ident) => {
        ($a, $b)
    };
}

#[distributed_lock(key = "pair:<a>")]
async fn pay(id: u64, pair!(a, b): (u64, u64)) -> Result<u64, LockError> {
    Ok(id + a + b)
}

fn main() {}
