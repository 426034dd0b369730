//! The attribute written inside `macro_rules!`, with its arguments passed in as fragments
//! (which reach the attribute wrapped in invisible groups), and parameters named by the macro
//! or by its caller.
#![deny(warnings)]

use std::time::Duration;

use lock_runtime::{distributed_lock, LockError};

const LEASE: Duration = Duration::from_secs(10);

/// Every argument as a `literal` fragment; the parameter is written in the macro.
macro_rules! literals {
    ($name:ident, $key:literal, $lease:literal, $wait:literal, $renew:literal, $lost:literal, $fair:literal) => {
        #[distributed_lock(key = $key, lease = $lease, wait = $wait, watchdog = $renew, on_lost = $lost, fair = $fair)]
        async fn $name(id: u64) -> Result<u64, LockError> {
            Ok(id)
        }
    };
}

literals!(from_literals, "order:<id>", "30s", "1s", false, "continue", true);

/// Every argument as an `expr` fragment; the parameters come from the caller.
macro_rules! expressions {
    ($name:ident($($param:ident: $ty:ty),*), $key:expr, $lease:expr, $wait:expr, $renew:expr, $krate:path) => {
        #[distributed_lock(key = $key, lease = $lease, wait = $wait, watchdog = $renew, crate = $krate)]
        async fn $name($($param: $ty),*) -> Result<u64, LockError> {
            Ok(0 $(+ $param)*)
        }
    };
}

expressions!(from_exprs(id: u64, n: u64), "order:<id>:<n>", "30s", LEASE, true, lock_runtime);
expressions!(from_exprs_typed(id: u64), "order:<id>", LEASE, Duration::from_millis(5), false, ::lock_runtime);

/// The key written in the macro, the parameter it names passed in by the caller: the
/// placeholder resolves to the parameter, whatever context each comes from.
macro_rules! by_caller_parameter {
    ($name:ident, $param:ident) => {
        #[distributed_lock(key = "user:<user>", lease = LEASE)]
        async fn $name($param: u64, _x: u8) -> Result<u64, LockError> {
            Ok($param)
        }
    };
}

by_caller_parameter!(from_caller, user);

/// Names bound inside patterns, written by the macro (`inner`, `by_ref`) or by its caller
/// (`outer`), read by a key passed in by the caller or written in the macro.
macro_rules! patterns {
    ($name:ident, $key:expr, $outer:ident) => {
        #[distributed_lock(key = $key)]
        async fn $name((inner, $outer): (u64, u64), ref by_ref: u64) -> Result<u64, LockError> {
            Ok(inner + $outer + by_ref)
        }
    };
    ($name:ident, $outer:ident) => {
        #[distributed_lock(key = "pair:<inner>:<outer>:<by_ref>")]
        async fn $name((inner, $outer): (u64, u64), ref by_ref: u64) -> Result<u64, LockError> {
            Ok(inner + $outer + by_ref)
        }
    };
}

patterns!(from_patterns, "pair:<inner>:<outer>:<by_ref>", outer);
patterns!(from_patterns_in_macro, outer);

/// `$crate` in the `crate` argument, and a key fragment naming a parameter the macro writes.
#[macro_export]
macro_rules! exported {
    ($name:ident, $key:expr) => {
        #[distributed_lock(key = $key, crate = $crate::locks)]
        async fn $name(account: &str, _unused: u8) -> Result<usize, LockError> {
            Ok(account.len())
        }
    };
}

mod locks {
    pub use lock_runtime::*;
}

exported!(from_exported, "account:<account>");

fn main() {
    let _ = (from_literals(1), from_exprs(1, 2), from_exprs_typed(1), from_exported("a", 0));
    let _ = from_caller(1, 0);
    let _ = (from_patterns((1, 2), 3), from_patterns_in_macro((1, 2), 3));
}
