//! Strict crate lint settings: `#![forbid]` turns any lint allowance in the expansion into an
//! error (E0453), and `unused_qualifications` reads every path the user's code seems to
//! contain; the generated code needs no allowance and its paths are the macro's own, also
//! with `crate = "crate::…"` and a `Duration` in scope.
#![forbid(unused, unreachable_code, warnings, unused_qualifications)]
#![forbid(clippy::all, clippy::pedantic, clippy::needless_update, clippy::needless_return)]

use std::time::Duration;

use lock_runtime::LockError;

mod reexport {
    pub use lock_runtime as locks;
}

use crate::reexport::locks::distributed_lock;

const LEASE: Duration = Duration::from_secs(10);

#[distributed_lock(key = "order:<id>", crate = "crate::reexport::locks")]
async fn key_only(id: u64) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(
    key = "all:<id>:<_tag>",
    lease = LEASE,
    wait = Duration::from_millis(250),
    watchdog = false,
    on_lost = "continue",
    fair = true,
    crate = "crate::reexport::locks"
)]
async fn every_option(id: u64, _tag: &str, _: u8, (a, _b): (u8, u8)) -> Result<u8, LockError> {
    Ok(a)
}

#[distributed_lock(key = "literal", lease = "1m30s", wait = "250ms", crate = crate::reexport::locks)]
async fn literal_durations() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "diverges")]
async fn diverges() -> Result<(), LockError> {
    return Err(LockError::NotInstalled);
}

#[distributed_lock(key = "never")]
async fn never(n: u8) -> Result<std::convert::Infallible, LockError> {
    loop {
        if n > 0 {
            return Err(LockError::NotInstalled);
        }
    }
}

fn main() {
    let _ = (key_only(1), every_option(1, "t", 0, (1, 2)), literal_durations());
    let _ = (diverges(), never(1));
}
