//! The business logic: paying an order under its lock. The handlers in
//! `routes.rs` only translate HTTP to these calls and back.

use std::time::Duration;

use lock_runtime::{distributed_lock, fence, hold_count, LockError};
use serde::Serialize;

use crate::store::{Order, Store, StoreError};

/// Why a payment did not go through.
#[derive(Debug, thiserror::Error)]
pub enum OrderError {
    /// The lock could not be taken or was lost (timeout, shutdown, …).
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The store refused the write (a stale fencing token) or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The order was paid before.
    #[error("order {0} is already paid")]
    AlreadyPaid(u64),
}

/// A payment that went through.
#[derive(Debug, Serialize)]
pub struct Payment {
    /// The order after the charge.
    pub order: Order,
    /// The fencing token the charge was written with.
    pub fence: u64,
    /// Holds of `order:<id>` the nested check ran inside (2: the payment's
    /// and its own, re-entered without a round trip).
    pub nested_holds: usize,
}

/// Charges `amount` to order `id` once: one payment per order at a time in
/// every process of the service, and a second payment finds it paid.
///
/// `work` stands for the payment provider's round trip: the time in which,
/// without the lock, a second payment would pass the "already paid?" check
/// too and charge the order twice.
#[distributed_lock(key = "order:<id>", lease = "10s", wait = "20s")]
pub async fn pay(
    store: &Store,
    id: u64,
    amount: u64,
    work: Duration,
) -> Result<Payment, OrderError> {
    // A locked fn on the same key, awaited inside this body: it re-enters.
    let nested_holds = ensure_unpaid(store, id).await?;
    tokio::time::sleep(work).await;
    // The token of this hold goes with the write; the store refuses it if a
    // later holder has written meanwhile (this one paused past its lease).
    let token = fence().ok_or(LockError::NotInstalled)?;
    let order = store.charge(id, amount, token).await?;
    Ok(Payment {
        order,
        fence: token,
        nested_holds,
    })
}

/// Fails with [`OrderError::AlreadyPaid`] when the order has a charge;
/// returns how many holds of the order's lock it runs inside.
#[distributed_lock(key = "order:<id>")]
async fn ensure_unpaid(store: &Store, id: u64) -> Result<usize, OrderError> {
    if store.get(id).await?.charges > 0 {
        return Err(OrderError::AlreadyPaid(id));
    }
    Ok(hold_count(&format!("order:{id}")))
}

/// A write by a holder that lost its lock without knowing (paused past its
/// lease, say) and comes back with its old token `fence`: the store
/// decides. No lock: that holder believes it still has one.
pub async fn late_write(
    store: &Store,
    id: u64,
    amount: u64,
    fence: u64,
) -> Result<Order, OrderError> {
    Ok(store.charge(id, amount, fence).await?)
}
