//! A wait that runs out while this same process holds the lock says so, and
//! says what to do: a `#[distributed_lock]` fn spawned from a locked body on
//! its key is pointed to `inherit`, a call waiting for a guard's hold to
//! `guard.scope`. (A timeout during an outage names the backend's failure:
//! `configuration.rs`; the plain `with_lock` spawn on every backend:
//! `reentry.rs`.) The attribute's fns use the global runtime: this binary
//! installs one on the test Redis.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use lock_runtime::{distributed_lock, inherit, LockError, LockRuntime};
use lock_tests::{acquire_elsewhere, on_every_backend, unique, Kind};

on_every_backend!(a_wait_for_a_guards_hold_in_this_process_times_out_pointing_to_scope);

/// Installs the global runtime on the test Redis once per test binary.
async fn install() -> LockRuntime {
    lock_tests::install_global(&unique("timeout-causes")).await
}

#[distributed_lock(key = "report:<day>", wait = "300ms")]
async fn build_report(day: u32) -> Result<u32, LockError> {
    Ok(day)
}

/// A nightly job that holds `report:<day>` and hands the report to a task
/// of its own, with or without `inherit`.
#[distributed_lock(key = "report:<day>", wait = "5s")]
async fn nightly(day: u32, inherited: bool) -> Result<Result<u32, LockError>, LockError> {
    let child = if inherited {
        tokio::spawn(inherit(build_report(day)))
    } else {
        tokio::spawn(build_report(day))
    };
    Ok(child.await.unwrap())
}

/// `tokio::spawn(locked_fn(..))` inside a locked body on the same key: the
/// task is another owner, so it waits for its parent and runs out. Its
/// timeout says that this same process holds the lock and points to
/// `inherit`, not a plain "timed out" that reads as another process's hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawned_locked_fn_on_its_parents_key_times_out_naming_this_process_and_inherit() {
    install().await;
    let child = nightly(1, false).await.unwrap();
    let Err(LockError::Timeout { key, cause, .. }) = &child else {
        panic!("expected the spawned call to time out: {child:?}");
    };
    assert_eq!(key, "report:1");
    assert!(cause.held_by_this_process(), "{child:?}");
    assert!(cause.backend_error().is_none(), "{child:?}");
    let text = child.unwrap_err().to_string();
    assert!(text.contains("this same process holds the lock"), "{text}");
    assert!(text.contains("lock_runtime::inherit(future)"), "{text}");
}

/// The fix the timeout points to works: spawned with `inherit`, the same
/// locked fn re-enters its parent's hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_locked_fn_spawned_with_inherit_reenters_its_parents_hold() {
    install().await;
    let child = nightly(2, true).await.unwrap();
    assert_eq!(child.unwrap(), 2);
}

/// A guard from `acquire()` holds the key; a call waiting for it on another
/// task runs out. The timeout says this process holds it and points to
/// `guard.scope`, the way to run a call that should re-enter that hold.
async fn a_wait_for_a_guards_hold_in_this_process_times_out_pointing_to_scope(kind: Kind) {
    let runtime = kind.runtime(&unique("guard-timeout")).await;
    let guard = runtime.lock("order:3").acquire().await.unwrap();
    let rt = runtime.clone();
    let waited = acquire_elsewhere(rt.lock("order:3").wait(Duration::from_millis(300)))
        .await
        .map(drop);
    let Err(LockError::Timeout { cause, .. }) = &waited else {
        panic!("expected a timeout: {waited:?}");
    };
    assert!(cause.held_by_this_process(), "{waited:?}");
    let text = waited.unwrap_err().to_string();
    assert!(text.contains("this same process holds the lock"), "{text}");
    assert!(text.contains("guard.scope(future)"), "{text}");
    guard.release().await.unwrap();
}
