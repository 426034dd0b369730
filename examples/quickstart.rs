//! Quickstart: contention, reentrancy and the watchdog in a few lines.
//!
//! Runs on the embedded backend with no setup; set `REDIS_URL` (or
//! `LOCK_REDIS_URL`) to run the same code on Redis:
//!
//! ```text
//! cargo run --example quickstart
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example quickstart
//! ```

use std::time::{Duration, Instant};

use lock_runtime::{distributed_lock, fence, LockError};

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Lock(#[from] LockError),
}

/// Charges an order; only one caller per order at a time, anywhere.
#[distributed_lock(key = "order:<id>", lease = "5s")]
async fn pay(id: u64, who: &str, t0: Instant) -> Result<(), AppError> {
    println!(
        "  {:>4} ms  {who} holds order:{id} (fence {})",
        ms(t0),
        fence().unwrap_or(0)
    );
    check_fraud(id, who).await?; // same key, nested: re-enters, no deadlock
    tokio::time::sleep(Duration::from_millis(100)).await;
    println!("  {:>4} ms  {who} done", ms(t0));
    Ok(())
}

#[distributed_lock(key = "order:<id>")]
async fn check_fraud(id: u64, who: &str) -> Result<(), AppError> {
    println!(
        "            {who} re-entered order:{id} in check_fraud (same fence {})",
        fence().unwrap_or(0)
    );
    Ok(())
}

/// Runs three lease lengths long; the watchdog keeps renewing the lease.
#[distributed_lock(key = "report", lease = "300ms")]
async fn long_report() -> Result<(), AppError> {
    tokio::time::sleep(Duration::from_millis(1000)).await;
    Ok(())
}

/// A rival that waits at most 600 ms for the report lock.
#[distributed_lock(key = "report", wait = "600ms")]
async fn rival() -> Result<(), AppError> {
    Ok(())
}

fn ms(t0: Instant) -> u128 {
    t0.elapsed().as_millis()
}

#[tokio::main]
async fn main() -> Result<(), AppError> {
    let runtime = lock_runtime::init_from_env().await?;
    println!("locks on: {}", runtime.describe());

    println!("\n1. contention: three callers pay order 42 at once and take turns");
    let t0 = Instant::now();
    let (a, b, c) = tokio::join!(
        pay(42, "alice", t0),
        pay(42, "bob", t0),
        pay(42, "carol", t0)
    );
    a?;
    b?;
    c?;

    println!("\n2. watchdog: a 1 s job under a 300 ms lease keeps its lock");
    let t0 = Instant::now();
    let (report, ()) = tokio::join!(long_report(), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        match rival().await {
            Err(AppError::Lock(e @ LockError::Timeout { .. })) => {
                println!("  {:>4} ms  a rival gave up as it should: {e}", ms(t0));
            }
            other => {
                // The README's first command is checked by `scripts/test`:
                // a wrong outcome fails it.
                eprintln!("  {:>4} ms  unexpected: the rival got {other:?}", ms(t0));
                std::process::exit(1);
            }
        }
    });
    report?;
    println!(
        "  {:>4} ms  report finished, lease renewed {} times meanwhile",
        ms(t0),
        runtime.stats().watchdog.round_trips
    );

    // On the way out (after a server's graceful shutdown, say): give back
    // whatever is still held, so other processes need not wait for leases.
    let released = lock_runtime::shutdown().await?;
    println!("\nshut down; {released} locks were still held");
    Ok(())
}
