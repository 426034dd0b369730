//! `#[distributed_lock]` on real Redis: nested annotated calls re-enter,
//! methods, generics and trait impls lock by their key (also one read from names
//! bound by `ref` or inside patterns), strangers wait.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{distributed_lock, fence, LockError, LockRuntime};
use lock_tests::Occupancy;

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("insufficient funds")]
    Funds,
}

/// Installs the global runtime on the test Redis once per test binary.
async fn install() -> LockRuntime {
    lock_tests::install_global(&format!("attr-{}:", std::process::id())).await
}

/// True when a stranger (a fresh owner on another task) cannot take `key` now.
async fn held_by_someone(key: &str) -> bool {
    let key = key.to_owned();
    tokio::spawn(async move {
        lock_runtime::lock(key)
            .try_acquire()
            .await
            .map(|g| g.is_none())
    })
    .await
    .unwrap()
    .unwrap()
}

#[distributed_lock(key = "order:<id>", lease = "5s", wait = "2s")]
async fn pay(id: u64, amount: u64) -> Result<(u64, u64, u64), AppError> {
    assert!(held_by_someone(&format!("order:{id}")).await);
    let outer = fence().unwrap();
    let (middle, inner) = refund_if_needed(id).await?;
    if amount == 0 {
        return Err(AppError::Funds);
    }
    Ok((outer, middle, inner))
}

#[distributed_lock(key = "order:<id>", wait = "1s")]
async fn refund_if_needed(id: u64) -> Result<(u64, u64), AppError> {
    let middle = fence().unwrap();
    let inner = audit(id).await?;
    Ok((middle, inner))
}

#[distributed_lock(key = "order:<id>", wait = "1s")]
async fn audit(id: u64) -> Result<u64, LockError> {
    Ok(fence().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_annotated_calls_reenter_three_deep() {
    install().await;
    let (outer, middle, inner) = pay(1001, 10).await.unwrap();
    assert_eq!(outer, middle);
    assert_eq!(middle, inner);
    assert!(
        !held_by_someone("order:1001").await,
        "key still held after the call"
    );
    // An early `return Err(..)` from the body frees the key too.
    assert!(matches!(pay(1002, 0).await, Err(AppError::Funds)));
    assert!(!held_by_someone("order:1002").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_annotated_calls_exclude_each_other() {
    install().await;
    static OCCUPANCY: Occupancy = Occupancy::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);

    #[distributed_lock(key = "counter:<name>", wait = "20s")]
    async fn bump(name: &str) -> Result<(), LockError> {
        let _inside = OCCUPANCY.enter();
        let v = COUNTER.load(Ordering::SeqCst);
        tokio::task::yield_now().await;
        COUNTER.store(v + 1, Ordering::SeqCst);
        Ok(())
    }

    let tasks: Vec<_> = (0..8)
        .map(|_| {
            tokio::spawn(async {
                for _ in 0..25 {
                    bump("shared").await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(COUNTER.load(Ordering::SeqCst), 200);
    assert_eq!(OCCUPANCY.max(), 1);
}

struct Account {
    tenant: String,
    balance: u64,
}

impl Account {
    #[distributed_lock(key = "account:<self.tenant>", wait = "1s")]
    async fn read(&self) -> Result<u64, LockError> {
        assert!(held_by_someone(&format!("account:{}", self.tenant)).await);
        Ok(self.balance)
    }

    #[distributed_lock(key = "account:<self.tenant>", wait = "1s")]
    async fn deposit(&mut self, amount: u64) -> Result<u64, LockError> {
        // Re-enters through a `&self` method on the same key.
        let before = self.read().await?;
        self.balance = before + amount;
        Ok(self.balance)
    }

    #[distributed_lock(key = "account:<self.tenant>", wait = "1s")]
    async fn shared(self: Arc<Self>) -> Result<u64, LockError> {
        Ok(self.balance)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_lock_by_their_receiver_fields() {
    install().await;
    let mut account = Account {
        tenant: "acme".to_owned(),
        balance: 5,
    };
    assert_eq!(account.deposit(7).await.unwrap(), 12);
    assert_eq!(Arc::new(account).shared().await.unwrap(), 12);
    assert!(!held_by_someone("account:acme").await);
}

#[distributed_lock(key = "job:<name>", lease = "300ms")]
async fn run_job<T>(name: impl std::fmt::Display, work: T) -> anyhow::Result<u64>
where
    T: std::future::Future<Output = u64> + Send,
{
    Ok(work.await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generic_fn_with_short_lease_outlives_it_through_the_watchdog() {
    install().await;
    let waited = tokio::spawn(async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        held_by_someone("job:nightly").await
    });
    let value = run_job("nightly", async {
        tokio::time::sleep(Duration::from_millis(900)).await;
        3
    })
    .await
    .unwrap();
    assert_eq!(value, 3);
    assert!(waited.await.unwrap(), "the key was free while the job ran");
}

trait Ledger {
    async fn post(&self, entry: u64) -> Result<u64, AppError>;
}

struct Books {
    id: u32,
}

impl Ledger for Books {
    #[distributed_lock(key = "books:<self.id>", wait = "1s")]
    async fn post(&self, entry: u64) -> Result<u64, AppError> {
        assert!(held_by_someone(&format!("books:{}", self.id)).await);
        Ok(entry * 2)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trait_impl_method_locks() {
    install().await;
    assert_eq!(Books { id: 9 }.post(21).await.unwrap(), 42);
    assert!(!held_by_someone("books:9").await);
}

struct Transfer {
    from: String,
    to: String,
}

#[distributed_lock(key = "transfer:<from>:<to>:<amount>", wait = "300ms")]
async fn transfer(Transfer { from, to }: Transfer, ref amount: u64) -> Result<u64, AppError> {
    assert!(held_by_someone(&format!("transfer:{from}:{to}:{amount}")).await);
    Ok(*amount)
}

fn alice_to_bob() -> Transfer {
    Transfer {
        from: "alice".to_owned(),
        to: "bob".to_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_read_from_a_struct_pattern_and_a_ref_binding_is_the_lock_taken() {
    install().await;
    assert_eq!(transfer(alice_to_bob(), 5).await.unwrap(), 5);
    assert!(!held_by_someone("transfer:alice:bob:5").await);
    // A stranger holding that exact key keeps the call out.
    let guard = lock_runtime::lock("transfer:alice:bob:5")
        .acquire()
        .await
        .unwrap();
    let err = tokio::spawn(transfer(alice_to_bob(), 5))
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(err, AppError::Lock(LockError::Timeout { .. })),
        "{err:?}"
    );
    // Released and confirmed before the next call tries: no wait on a release message.
    guard.release().await.unwrap();
    assert_eq!(
        tokio::spawn(transfer(alice_to_bob(), 5))
            .await
            .unwrap()
            .unwrap(),
        5
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_key_gives_timeout_through_the_user_error() {
    install().await;
    let _guard = lock_runtime::lock("order:77").acquire().await.unwrap();
    let start = std::time::Instant::now();
    // `pay` waits 2 s at most.
    let err = tokio::spawn(pay(77, 1)).await.unwrap().unwrap_err();
    assert!(
        matches!(err, AppError::Lock(LockError::Timeout { .. })),
        "{err:?}"
    );
    let took = start.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_millis(2300),
        "{took:?}"
    );
}

#[distributed_lock(key = "catalog:<id>", mode = "read", wait = "5s")]
async fn read_catalog(id: u64, inside: Arc<tokio::sync::Barrier>) -> Result<u64, LockError> {
    // Every caller waits here for the others: readers share the key.
    inside.wait().await;
    Ok(fence().unwrap())
}

#[distributed_lock(key = "catalog:<id>", mode = "write", wait = "5s")]
async fn write_catalog(id: u64) -> Result<(u64, u64), LockError> {
    let mine = fence().unwrap();
    // A writer may read what it writes: the nested read re-enters.
    let read = read_catalog(id, Arc::new(tokio::sync::Barrier::new(1))).await?;
    Ok((mine, read))
}

#[distributed_lock(key = "catalog:<id>", mode = "read", wait = "5s")]
async fn read_then_write(id: u64) -> Result<(u64, u64), LockError> {
    write_catalog(id).await
}

/// `mode = "read"` fns share their key, a read inside a `mode = "write"`
/// fn re-enters it, and a write fn called from a read fn is refused at once
/// with `UpgradeRefused` (the runtime's check: the call is not visible to
/// the attribute of the outer fn).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attribute_modes_share_reenter_and_refuse_upgrades() {
    install().await;
    let inside = Arc::new(tokio::sync::Barrier::new(3));
    let readers: Vec<_> = (0..3)
        .map(|_| tokio::spawn(read_catalog(1, inside.clone())))
        .collect();
    for reader in readers {
        tokio::time::timeout(Duration::from_secs(10), reader)
            .await
            .expect("three readers were never inside together")
            .unwrap()
            .unwrap();
    }
    let (written, read) = write_catalog(1).await.unwrap();
    assert_eq!(read, written, "the nested read took its own hold");
    let started = std::time::Instant::now();
    let upgrade = read_then_write(1).await;
    assert!(
        matches!(&upgrade, Err(LockError::UpgradeRefused { key }) if key == "catalog:1"),
        "{upgrade:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the upgrade waited"
    );
}

/// A locked fn's future holds its body once, so nested locked fns add
/// their own size at each level: a read fn in a write fn in a read fn
/// takes about three times one read fn, not a power of it (it took
/// 238 KB, and a test thread's stack overflowed).
#[test]
fn nested_locked_fns_grow_by_their_own_size() {
    let one = std::mem::size_of_val(&read_catalog(1, Arc::new(tokio::sync::Barrier::new(1))));
    let three = std::mem::size_of_val(&read_then_write(1));
    assert!(
        three <= 4 * one,
        "{one} B for one locked fn, {three} B for three nested"
    );
}
