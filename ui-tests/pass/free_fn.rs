//! A free `async fn` keeps its visibility, docs, attributes and inner attributes.
use lock_runtime::{distributed_lock, LockError};

/// Pays an order.
#[distributed_lock(key = "order:<id>")]
#[inline]
pub(crate) async fn pay(id: u64, mut amount: u64) -> Result<u64, LockError> {
    #![allow(clippy::needless_late_init)]
    amount += 1;
    Ok(id + amount)
}

#[allow(dead_code)]
#[distributed_lock(key = "static")]
async fn no_parameters() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "pair:<pair.0>:<pair.1>")]
pub async fn tuple_fields(pair: (u8, &str)) -> Result<usize, LockError> {
    Ok(pair.1.len() + usize::from(pair.0))
}

#[distributed_lock(key = "destructured")]
async fn destructured((a, b): (u8, u8), _: u8) -> Result<u8, LockError> {
    Ok(a + b)
}

fn main() {
    let _ = pay(1, 2);
    let _ = tuple_fields((1, "x"));
    let _ = destructured((1, 2), 3);
}
