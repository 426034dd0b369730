//! The flash-sale worker (S16): the tasks of one process buy one unit at a
//! time until the stock is sold out, the stock split into segments, one
//! segment per permit of one lock.
//!
//! The stock lives on the lock server, beside the locks: segment `s`'s
//! count at `<prefix>seg:<s>`, and the set `<prefix>empty` of the
//! segments found empty. Under `with_lock(lock("stock").permits(n))` the
//! body reads the count of segment `permit()` and, when it is above 0,
//! writes it back one less (GET then SET, as users write it: a lost update
//! would show, where a DECR would hide it); the body that sells a
//! segment's last unit adds the segment to the empty set. When the
//! segment is empty the body is a *miss*: it reads the size of the empty
//! set, and when every segment is in it the sale is over and the worker
//! stops; otherwise the worker asks again, and is given whichever permit
//! comes free.
//!
//! **Only the holder of permit `s` touches segment `s`**: its count and
//! its entry in the empty set. A body never looks at another segment; a
//! worker whose segment is empty goes back for another permit.
//!
//! **The sale ends, with every unit sold and no count below 0.** (1) A
//! segment's count only changes in a sale, by one, from a count above 0
//! read by its permit's holder, the only body on the segment: the count
//! goes down by one per sale and never below 0, so at most the stock is
//! sold. (2) A segment reaches 0 only in the sale of its last unit, which
//! adds it to the empty set before its permit is released (the parent puts
//! segments that start with nothing in the set itself); entries are never
//! removed. So the set is full once the body of the last unit sold has
//! ended, and not before. (3) A worker stops at its first body that finds
//! its segment empty and the set full: a body that starts after the last
//! sale's body ended finds exactly that (every segment is empty, whichever
//! permit it holds), so each worker starts at most one body after it.
//! (4) Before it, every body either sells a unit (at most the stock) or
//! misses, and a permit whose segment still has units is not left idle:
//! 32 workers wait for n ≤ 8 permits, so a released permit is handed or
//! passed to a waiter, whose body sells from it. How many misses happen
//! meanwhile depends on which permits the runtime hands out (the run
//! reports them); the run's time limit bounds them: a worker that reaches
//! it stops without having seen the end, which the parent counts as a
//! failure.
//!
//! The limit ([`Locking::Unlocked`]) runs the same body without any lock,
//! each call on the next segment of a counter of the process: it loses
//! updates (its counts may even rise again after a segment was marked
//! empty, and it may sell more units than there are); only its rate means
//! anything.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use lock_runtime::{permit, with_lock, LockRuntime};
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;
use tokio::time::Instant;

use super::contend::WAIT_LIMIT;
use super::tasks::{self, now_us};
use super::OnLockServer;
use crate::flash_sale::SaleRecord;

/// Upper bound on bodies per task, whatever the stock.
const MAX_PER_TASK: usize = 1_000_000;
/// The lock whose permits guard the segments.
pub const STOCK: &str = "stock";

/// How a body is kept to its segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Locking {
    /// `with_lock(runtime.lock("stock").permits(n), body)`: segment
    /// `permit()`.
    Permits,
    /// The body alone, each call on the next segment of a counter of the
    /// process: the limit (it loses updates).
    Unlocked,
}

impl Locking {
    /// Both, in report order.
    pub const ALL: [Locking; 2] = [Locking::Permits, Locking::Unlocked];

    /// Name on the command line and in the results file.
    pub fn name(self) -> &'static str {
        match self {
            Locking::Permits => "permits",
            Locking::Unlocked => "unlocked",
        }
    }
}

/// The count key of segment `s` under `prefix`.
pub fn segment_key(prefix: &str, s: u32) -> String {
    format!("{prefix}seg:{s}")
}

/// The key of the set of empty segments under `prefix`.
pub fn empty_key(prefix: &str) -> String {
    format!("{prefix}empty")
}

/// `flashsale` arguments.
pub struct Args {
    /// How bodies keep to their segment.
    locking: Locking,
    /// Server, prefix, tasks and duration.
    run: OnLockServer,
    /// Segments, and permits.
    segments: u32,
}

impl Args {
    /// Parses `<locking> <lock-url> <prefix> <tasks> <first-id> <millis> <segments>`.
    pub(super) fn parse(args: &[String]) -> Result<Self> {
        let [locking, lock_url, prefix, tasks, first_id, millis, segments] = args else {
            bail!("usage: --worker flashsale <permits|unlocked> <lock-url> <prefix> <tasks> <first-id> <millis> <segments>");
        };
        let locking = tasks::named(Locking::ALL, Locking::name, "locking", locking)?;
        let segments: u32 = super::parse("segments", segments)?;
        if segments == 0 {
            bail!("segments must be at least 1");
        }
        Ok(Args {
            locking,
            run: OnLockServer::parse([lock_url, prefix, tasks, first_id, millis])?,
            segments,
        })
    }
}

/// What one task did.
type TaskResult = tasks::TaskResult<SaleRecord>;

/// The stock's keys: each segment's count and the set of empty segments.
struct Stock {
    /// Each segment's count key, in segment order.
    segments: Vec<String>,
    /// The key of the set of empty segments.
    empty: String,
}

impl Stock {
    /// The stock of `segments` segments under `prefix`.
    fn under(prefix: &str, segments: u32) -> Self {
        Stock {
            segments: (0..segments).map(|s| segment_key(prefix, s)).collect(),
            empty: empty_key(prefix),
        }
    }
}

/// What a task needs for a call: how it locks, the runtime, the stock, its
/// data connection and, for the limit, the process's segment counter.
#[derive(Clone)]
struct Seller {
    /// How bodies keep to their segment.
    locking: Locking,
    /// The process's runtime.
    runtime: LockRuntime,
    /// Where the units are.
    stock: Arc<Stock>,
    /// The task's data connection (to the lock server).
    data: MultiplexedConnection,
    /// The limit's next segment, shared by the process's tasks.
    next: Arc<AtomicU32>,
}

/// Runs the worker: its runtime and data connection, one warm-up call on a
/// stock of its own, then the tasks' calls from `go` until each has seen
/// the sale over (or the run's bound), their records and counts printed.
pub(super) async fn run(args: Args) -> Result<()> {
    let (data, runtime) =
        tasks::on_lock_server(&args.run.lock_url, &args.run.prefix, args.run.tasks).await?;
    let next = Arc::new(AtomicU32::new(args.run.first_id));
    // Warm up (connections, script cache) on a stock of this process's own
    // (one unit per segment), which the parent never counts.
    let warm_prefix = format!("{}warmup:{}:", args.run.prefix, args.run.first_id);
    let warm = Stock::under(&warm_prefix, args.segments);
    let mut con = data[0].clone();
    for key in &warm.segments {
        let () = con.set(key, 1).await?;
    }
    let warm_seller = Seller {
        locking: args.locking,
        runtime: runtime.clone(),
        stock: Arc::new(warm),
        data: data[0].clone(),
        next: next.clone(),
    };
    let lock = format!("warmup:{}", args.run.first_id);
    warm_seller.once(&lock, args.segments, 0).await?;

    let stock = Arc::new(Stock::under(&args.run.prefix, args.segments));
    let line = SaleRecord::to_line;
    tasks::measured(runtime.clone(), args.run.duration, line, |end, running| {
        for id in args.run.first_id..args.run.first_id + args.run.tasks {
            let seller = Seller {
                locking: args.locking,
                runtime: runtime.clone(),
                stock: stock.clone(),
                data: tasks::connection_of(&data, id - args.run.first_id, args.run.tasks),
                next: next.clone(),
            };
            running.spawn(seller.until_sold_out(id, end));
        }
    })
    .await
}

impl Seller {
    /// Task `id`'s calls until one finds the sale over, or `end`.
    async fn until_sold_out(self, id: u32, end: Instant) -> Result<TaskResult> {
        let segments = self.stock.segments.len() as u32;
        let mut result = TaskResult::default();
        for _ in 0..MAX_PER_TASK {
            if Instant::now() >= end {
                break;
            }
            let outcome = self.once(STOCK, segments, id).await;
            let over = outcome.as_ref().is_ok_and(|r| r.sold_out);
            result.note(id, outcome, false, |record| record)?;
            if over {
                break;
            }
        }
        Ok(result)
    }

    /// One call of `worker` on `lock`'s `segments` permits (the limit: on
    /// the next segment, no lock).
    async fn once(&self, lock: &str, segments: u32, worker: u32) -> Result<SaleRecord> {
        let requested = now_us();
        let body = match self.locking {
            Locking::Permits => {
                let request = self.runtime.lock(lock).permits(segments).wait(WAIT_LIMIT);
                with_lock(request, async {
                    let segment = permit().context("a permit call without its permit")?;
                    self.body(segment).await
                })
                .await?
            }
            Locking::Unlocked => {
                let segment = self.next.fetch_add(1, Ordering::Relaxed) % segments;
                self.body(segment).await?
            }
        };
        Ok(SaleRecord {
            worker,
            requested,
            ..body
        })
    }

    /// The body on `segment`: sells one unit if it has any (GET, SET, and
    /// SADD to the empty set for its last unit), else reads how many
    /// segments are empty (SCARD). Its record, but for the worker and the
    /// time of the request, which are the caller's.
    async fn body(&self, segment: u32) -> Result<SaleRecord> {
        let mut data = self.data.clone();
        let acquired = now_us();
        let key = self
            .stock
            .segments
            .get(segment as usize)
            .with_context(|| format!("no segment {segment}"))?;
        let count: Option<i64> = data.get(key).await?;
        let count = count.with_context(|| format!("no count at {key}"))?;
        let sold_out = if count > 0 {
            let () = data.set(key, count - 1).await?;
            if count == 1 {
                let _: u32 = data.sadd(&self.stock.empty, segment).await?;
            }
            false
        } else {
            let empty: usize = data.scard(&self.stock.empty).await?;
            empty >= self.stock.segments.len()
        };
        Ok(SaleRecord {
            worker: 0,
            segment,
            count,
            sold_out,
            requested: acquired,
            acquired,
            released: now_us(),
        })
    }
}
