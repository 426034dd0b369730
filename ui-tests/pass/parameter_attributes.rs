//! A parameter's `cfg` and lint attributes apply to the binding the body uses, as on a
//! native `async fn`: no "unused variable" for an allowed one, no E0425 for one configured
//! away, and an `#[expect]` fulfilled by the body not using the parameter.
#![deny(warnings)]

use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "order:<id>")]
async fn allowed(id: u64, #[allow(unused_variables)] p: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "order:<id>")]
async fn expected(id: u64, #[expect(unused_variables)] p: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "order:<id>")]
async fn configured(
    id: u64,
    #[cfg(any())] extra: u64,
    #[cfg(all())] kept: u64,
    #[cfg(any())] (a, b): (u8, u8),
    #[cfg(any())] _: u8,
) -> Result<u64, LockError> {
    Ok(id + kept)
}

#[distributed_lock(key = "order:<ID>")]
#[allow(non_snake_case)]
async fn named_oddly(ID: u64, #[allow(non_snake_case)] Amount: u64) -> Result<u64, LockError> {
    Ok(Amount)
}

#[distributed_lock(key = "pair")]
async fn destructured(
    #[allow(unused_variables)] (a, b): (u8, u8),
    #[cfg_attr(all(), expect(unused_variables))] c: u8,
) -> Result<u8, LockError> {
    Ok(a)
}

fn main() {
    let _ = (allowed(1, 2), expected(1, 2), configured(1, 2), named_oddly(1, 2));
    let _ = destructured((1, 2), 3);
}
