//! The storage the locks protect: orders and their charges. It checks
//! fencing tokens itself, as a database would with a conditional write: a
//! charge carrying a token lower than the highest one it accepted for the
//! order is refused, so a holder that lost its lock (paused, partitioned)
//! cannot write over the work of the one that replaced it.
//!
//! In Redis when the service runs on Redis (so every process of the service
//! sees the same orders), in the process otherwise. The "already paid?"
//! check before a charge is a separate read on purpose: only the lock keeps
//! two payments of one order from both passing it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;

/// One order as stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Order {
    /// Order id.
    pub id: u64,
    /// How many charges were written (more than 1: double-charged).
    pub charges: u64,
    /// Sum of the amounts charged.
    pub total: u64,
    /// The highest fencing token a write carried (0: none yet).
    pub fence: u64,
}

/// Why a write was refused.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The writer's token is older than one the store already accepted.
    #[error("stale fencing token {given}: the store already accepted {seen}")]
    Stale {
        /// The token of the refused write.
        given: u64,
        /// The highest token accepted before.
        seen: u64,
    },
    /// Redis failed.
    #[error("store: {0}")]
    Redis(#[from] redis::RedisError),
}

/// Checks the token and records one charge, atomically (KEYS[1]: the
/// order's hash; ARGV: token, amount; returns {1, token} or {0, highest}; tokens stay
/// strings on the way out, since Lua would print a large number as `1.7e+15`).
const CHARGE: &str = r"
local seen = redis.call('HGET', KEYS[1], 'fence') or '0'
if tonumber(ARGV[1]) < tonumber(seen) then return {0, seen} end
redis.call('HSET', KEYS[1], 'fence', ARGV[1])
redis.call('HINCRBY', KEYS[1], 'charges', 1)
redis.call('HINCRBY', KEYS[1], 'total', ARGV[2])
return {1, ARGV[1]}
";

/// The order store.
#[derive(Clone)]
pub enum Store {
    /// Orders in Redis hashes `<namespace><id>`, shared by every process.
    Redis {
        /// The connection.
        con: redis::aio::MultiplexedConnection,
        /// Prefix of the order hashes.
        namespace: String,
    },
    /// Orders in this process.
    Memory(Arc<Mutex<HashMap<u64, Order>>>),
}

impl Store {
    /// A store in Redis at `url`, under `namespace`.
    pub async fn redis(url: &str, namespace: String) -> Result<Store, StoreError> {
        let con = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        Ok(Store::Redis { con, namespace })
    }

    /// A store in this process.
    pub fn memory() -> Store {
        Store::Memory(Arc::default())
    }

    /// The order `id` (all zero when never charged).
    pub async fn get(&self, id: u64) -> Result<Order, StoreError> {
        match self {
            Store::Redis { con, namespace } => {
                let mut con = con.clone();
                let (charges, total, fence): (Option<u64>, Option<u64>, Option<u64>) =
                    redis::cmd("HMGET")
                        .arg(format!("{namespace}{id}"))
                        .arg(&["charges", "total", "fence"][..])
                        .query_async(&mut con)
                        .await?;
                Ok(Order {
                    id,
                    charges: charges.unwrap_or(0),
                    total: total.unwrap_or(0),
                    fence: fence.unwrap_or(0),
                })
            }
            Store::Memory(orders) => Ok(orders
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&id)
                .copied()
                .unwrap_or(Order {
                    id,
                    ..Order::default()
                })),
        }
    }

    /// Charges `amount` to order `id` with fencing token `fence`; refused
    /// when an earlier write carried a higher token.
    pub async fn charge(&self, id: u64, amount: u64, fence: u64) -> Result<Order, StoreError> {
        match self {
            Store::Redis { con, namespace } => {
                let mut con = con.clone();
                let (ok, seen): (u8, u64) = redis::Script::new(CHARGE)
                    .key(format!("{namespace}{id}"))
                    .arg(fence)
                    .arg(amount)
                    .invoke_async(&mut con)
                    .await?;
                if ok == 0 {
                    return Err(StoreError::Stale { given: fence, seen });
                }
                self.get(id).await
            }
            Store::Memory(orders) => {
                let mut orders = orders.lock().unwrap_or_else(PoisonError::into_inner);
                let order = orders.entry(id).or_insert(Order {
                    id,
                    ..Order::default()
                });
                if fence < order.fence {
                    return Err(StoreError::Stale {
                        given: fence,
                        seen: order.fence,
                    });
                }
                order.fence = fence;
                order.charges += 1;
                order.total += amount;
                Ok(*order)
            }
        }
    }
}
