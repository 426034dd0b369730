//! The transfer worker (S15): a few tasks of one process moving money
//! between accounts, two accounts a transfer, under one of three ways of
//! locking them.
//!
//! Each task draws every transfer's pair of distinct accounts (and its
//! direction) from its own generator, seeded from the run's seed and the
//! task's number ([`crate::keys::Rng`]), so every variant of a run sees the
//! same sequence of transfers per task. The body reads both balances and
//! writes both back, one moved from the first to the second (GET, GET,
//! SET, SET on the lock server, beside the locks, as an application that
//! keeps its data in the Redis of its locks does). Without exclusion two
//! transfers on one account lose an update, and the sum of the balances
//! moves.
//!
//! The variants ([`Variant`]): one multi-key call on both accounts
//! (`with_locks(lock_many([from, to]))`), one lock for the whole bank
//! around every transfer, two nested single-key calls with the keys
//! sorted by hand (what a user without multi-key locks writes), and the
//! body with no lock at all: the ceiling of this machine, which loses
//! updates.

use anyhow::{bail, Context, Result};
use lock_runtime::{with_lock, with_locks, LockRuntime};
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;
use tokio::time::Instant;

use super::contend::WAIT_LIMIT;
use super::tasks::{self, now_us};
use super::OnLockServer;
use crate::keys::Rng;
use crate::transfers::TransferRecord;

/// Upper bound on transfers per task, whatever the duration.
const MAX_PER_TASK: usize = 1_000_000;
/// The one lock of [`Variant::Global`].
const BANK: &str = "bank";

/// How a transfer locks its two accounts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// `with_locks(runtime.lock_many([from, to]), body)`.
    Multi,
    /// `with_lock(runtime.lock("bank"), body)`: every transfer in turn.
    Global,
    /// `with_lock(first, with_lock(second, body))`, the two account keys
    /// sorted by hand (byte order, as `lock_many` sorts them).
    NestedSorted,
    /// The body alone, no lock: what the machine does without exclusion
    /// (it loses updates; only its rate means anything).
    Unlocked,
}

impl Variant {
    /// In report order.
    pub const ALL: [Variant; 4] = [
        Variant::Multi,
        Variant::Global,
        Variant::NestedSorted,
        Variant::Unlocked,
    ];

    /// Name on the command line and in the results file.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Multi => "multi",
            Variant::Global => "global",
            Variant::NestedSorted => "nested-sorted",
            Variant::Unlocked => "unlocked",
        }
    }

    /// Whether it excludes (every variant but [`Variant::Unlocked`]): only
    /// then do the exactness checks apply.
    pub fn locks(self) -> bool {
        self != Variant::Unlocked
    }
}

/// The lock name of account `n`.
pub fn account_lock(n: u32) -> String {
    format!("account:{n}")
}

/// The balance key of account `n` under `prefix` (beside the lock keys,
/// never one of them).
pub fn balance_key(prefix: &str, n: u32) -> String {
    format!("{prefix}balance:{n}")
}

/// The generator of task `id`'s transfers in a run seeded `seed`.
fn pairs(seed: u64, id: u32) -> Rng {
    Rng::new(seed.rotate_left(32) ^ u64::from(id))
}

/// The next transfer's two distinct accounts of `accounts` (at least 2),
/// debited one first.
fn next_pair(rng: &mut Rng, accounts: u32) -> (u32, u32) {
    let n = u64::from(accounts.max(2));
    let from = rng.next_u64() % n;
    let mut to = rng.next_u64() % (n - 1);
    if to >= from {
        to += 1;
    }
    (from as u32, to as u32)
}

/// `transfers` arguments.
pub struct Args {
    variant: Variant,
    run: OnLockServer,
    seed: u64,
    accounts: u32,
}

impl Args {
    pub(super) fn parse(args: &[String]) -> Result<Self> {
        let [variant, lock_url, prefix, tasks, first_id, millis, seed, accounts] = args else {
            bail!("usage: --worker transfers <variant> <lock-url> <prefix> <tasks> <first-id> <millis> <seed> <accounts>");
        };
        let Some(variant) = Variant::ALL.into_iter().find(|v| v.name() == variant) else {
            bail!("unknown variant {variant:?}");
        };
        Ok(Args {
            variant,
            run: OnLockServer::parse([lock_url, prefix, tasks, first_id, millis])?,
            seed: super::parse("seed", seed)?,
            accounts: super::parse("accounts", accounts)?,
        })
    }
}

/// What one task did.
type TaskResult = tasks::TaskResult<TransferRecord>;

/// One account as a transfer names it: its number, lock and balance key.
#[derive(Clone)]
struct Account {
    n: u32,
    lock: String,
    balance: String,
}

pub(super) async fn run(args: Args) -> Result<()> {
    let (data, runtime) =
        tasks::on_lock_server(&args.run.lock_url, &args.run.prefix, args.run.tasks).await?;
    // Warm up (connections, script cache) before the measured part, on
    // two accounts of this process's own, which the parent never counts.
    let warm = |side: &str| Account {
        n: u32::MAX,
        lock: format!("warmup:{}:{side}", args.run.first_id),
        balance: format!(
            "{}warmup:{}:{side}:balance",
            args.run.prefix, args.run.first_id
        ),
    };
    let mut con = data[0].clone();
    for side in ["a", "b"] {
        let () = con.set(&warm(side).balance, 0).await?;
    }
    let mut scratch = TaskResult::default();
    let warm_pair = (&warm("a"), &warm("b"));
    once(
        &runtime,
        args.variant,
        warm_pair,
        &data[0],
        0,
        &mut scratch,
        true,
    )
    .await?;

    let accounts: Vec<Account> = (0..args.accounts)
        .map(|n| Account {
            n,
            lock: account_lock(n),
            balance: balance_key(&args.run.prefix, n),
        })
        .collect();
    let accounts = std::sync::Arc::new(accounts);
    let (variant, seed, n) = (args.variant, args.seed, args.accounts);
    let line = TransferRecord::to_line;
    tasks::measured(runtime.clone(), args.run.duration, line, |end, running| {
        for id in args.run.first_id..args.run.first_id + args.run.tasks {
            let (runtime, accounts) = (runtime.clone(), accounts.clone());
            let data = tasks::connection_of(&data, id - args.run.first_id, args.run.tasks);
            let mut rng = pairs(seed, id);
            running.spawn(async move {
                let mut result = TaskResult::default();
                for _ in 0..MAX_PER_TASK {
                    if Instant::now() >= end {
                        break;
                    }
                    let (from, to) = next_pair(&mut rng, n);
                    let pair = (&accounts[from as usize], &accounts[to as usize]);
                    once(&runtime, variant, pair, &data, id, &mut result, false).await?;
                }
                anyhow::Ok(result)
            });
        }
    })
    .await
}

/// The body: moves 1 from `from` to `to`: `(acquired, released)`.
async fn body(data: &MultiplexedConnection, from: &str, to: &str) -> Result<(u64, u64)> {
    let mut data = data.clone();
    let acquired = now_us();
    let a: Option<i64> = data.get(from).await?;
    let b: Option<i64> = data.get(to).await?;
    let (a, b) = (
        a.with_context(|| format!("no balance {from}"))?,
        b.with_context(|| format!("no balance {to}"))?,
    );
    let () = data.set(from, a - 1).await?;
    let () = data.set(to, b + 1).await?;
    Ok((acquired, now_us()))
}

/// One transfer from `from` to `to` as `variant` locks them, by `worker`;
/// recorded unless `warmup` (which also turns every error into a failure).
async fn once(
    runtime: &LockRuntime,
    variant: Variant,
    (from, to): (&Account, &Account),
    data: &MultiplexedConnection,
    worker: u32,
    result: &mut TaskResult,
    warmup: bool,
) -> Result<()> {
    let requested = now_us();
    let work = body(data, &from.balance, &to.balance);
    let outcome = match variant {
        Variant::Multi => {
            let both = runtime.lock_many([from.lock.as_str(), to.lock.as_str()]);
            with_locks(both.wait(WAIT_LIMIT), work).await
        }
        Variant::Global => with_lock(runtime.lock(BANK).wait(WAIT_LIMIT), work).await,
        Variant::NestedSorted => {
            let (first, second) = if from.lock <= to.lock {
                (&from.lock, &to.lock)
            } else {
                (&to.lock, &from.lock)
            };
            let inner = with_lock(runtime.lock(second.as_str()).wait(WAIT_LIMIT), work);
            with_lock(runtime.lock(first.as_str()).wait(WAIT_LIMIT), inner).await
        }
        Variant::Unlocked => work.await,
    };
    result.note(worker, outcome, warmup, |(acquired, released)| {
        TransferRecord {
            worker,
            from: from.n,
            to: to.n,
            requested,
            acquired,
            released,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_distinct_accounts_in_range_and_repeatable() {
        let mut rng = pairs(15, 3);
        let drawn: Vec<(u32, u32)> = (0..10_000).map(|_| next_pair(&mut rng, 100)).collect();
        assert!(drawn.iter().all(|&(a, b)| a != b && a < 100 && b < 100));
        let mut again = pairs(15, 3);
        assert!(drawn.iter().all(|&p| p == next_pair(&mut again, 100)));
        // Both directions, and every account, come up.
        assert!(drawn.iter().any(|&(a, b)| a < b) && drawn.iter().any(|&(a, b)| a > b));
        assert!((0..100).all(|n| drawn.iter().any(|&(a, b)| a == n || b == n)));
    }
}
