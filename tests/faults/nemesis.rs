//! Nemesis: three processes take random locks through fault proxies while
//! the test breaks the network, the server and the processes themselves at
//! random, then a checker reads every process's event log and tests the
//! library's promises against the merged history, Jepsen style.
//!
//! Each worker process (`nemesis_worker`) reaches Redis through its own
//! [`FaultProxy`](lock_tests::FaultProxy), so a fault can hit one process's
//! view of the network (stall, slow, cut, refuse, cut at the next SUBSCRIBE
//! or EVALSHA) or all of them (SIGSTOP of the server, restart empty, restart
//! from an older snapshot). The same run goes on an etcd cluster of three
//! ([`Backend::Etcd`]): each worker reaches every member through a proxy of
//! its own, and the server faults are the cluster's (a member frozen, a
//! member — the leader most often — killed and restarted from its data
//! directory, the whole cluster restarted from disk, the leader or the
//! cluster killed right after a key was handed to a blocked worker); none
//! of them loses data. And it goes on a ZooKeeper ensemble of three
//! ([`Backend::ZooKeeper`]) with the same faults, which there also expire
//! sessions: a stall or a stop longer than a session's timeout (a lock's
//! lease) ends the session and every node of it, a frozen leader's
//! followers may elect another, a killed one's always do. The processes
//! themselves stall too, as services do:
//! - some run their tasks on a `current_thread` executor (one blocked poll
//!   stops every task), the others on two threads;
//! - beside the other faults, every 0.3-2.5 s one worker's executor thread is
//!   blocked for 50-1000 ms (`std::thread::sleep` or a busy loop), and the
//!   workers block their own thread now and then right after a locked call,
//!   often after one whose release passed the hold to another task, which
//!   then waits for the thread (CPU-bound work after a locked section);
//! - a worker is stopped (SIGSTOP) past its lease, and when one is busy
//!   right after such a local handoff, past both leases then;
//! - a restart (empty or from a snapshot) is timed to land between a release
//!   and the next holder's entry: the worker heading the key's fair queue (or
//!   waiting for it in plain mode) is blocked, the key is handed (released)
//!   to it, the server restarts, another worker takes the key on the new
//!   server, and only then does the blocked one run again;
//! - a restart is timed inside a stall that began right after an acquire
//!   went out: a `current_thread` worker makes a call on a key that looks
//!   free and blocks its executor right after the call's first poll (the
//!   acquire script is answered on its lock runtime's own thread
//!   meanwhile); once the server records the hold, the server restarts
//!   (Redis empty; an etcd cluster or a ZooKeeper ensemble, which lose
//!   nothing, has its leader or every member killed and started again),
//!   another worker takes the key on the new server, and only then does
//!   the stalled call run on and claim the answer from before the restart;
//! - a worker's lock runtime is shut down (`shutdown()`) while its tasks
//!   run; the worker builds a new one for its next calls (every hold of
//!   the process ends when the shutdown returns).
//!
//! The calls themselves are cut at random points, as callers do: two in
//! five run under a 0-60 ms timeout around the acquire (a `with_lock`: the
//! whole call) or around the body, a quarter of the top-level calls under
//! a budget of 20 ms to 2 s; they take their lock by `with_lock`,
//! `acquire()` or `try_acquire()` (`wait = 0` also elsewhere), and a
//! guard is released, dropped, or its release cut short. Every 1-4 s two
//! or three workers add a burst of 3-8 tasks on one key for up to 3 s, every
//! call of it cut short (a process's waiters of both modes giving up around
//! its place in the key's queue, the other processes' readers around).
//! One top-level call in six takes two of the keys at once (`lock_many`,
//! a random pair, never the permit key, a read pair only when both are
//! read-write keys) by
//! `with_locks`, `acquire()` or `try_acquire()`, cut as the others; its
//! body nests calls that re-enter its keys, take a key sorting past both,
//! or ask one sorting before them (refused). Each key of it is logged as a
//! hold of its own, so every per-key promise below covers it.
//!
//! Keys are plain or fair, and in one test one process takes a key plain
//! while the others take it fair. A run has four keys ([`KeyKind`]):
//! `nk0` is an exclusive lock, `nk1` a read-write lock whose calls ask a
//! read hold (70 %), a write hold or an exclusive one (the same lock as a
//! write), `nk2` the same with a quarter readers, `nk3` a key of
//! [`PERMITS`] permits (`permits(3)`: up to three holders at once, each on
//! a permit of its own, the lock `nk3#i`, permit 0 being `nk3` itself),
//! each plain, fair or mixed as the test's mode says (in mixed mode one
//! process asks two permits of `nk3`: calls giving different counts share
//! the low permits). Calls on `nk3` meet
//! every fault, cut and burst the others do; nested ones re-enter their
//! caller's permit, and a wait for a permit waits for all three at once
//! and drops the others (a cancellation at every wait that succeeds).
//! The checker sees each permit as a key of its own (a slot, `nk3#i`): a
//! permit call is logged under the permit it got (its `begin` line with
//! it, stamped with its own time), a call that got none under one drawn at
//! random (sound for the waiting checks: it waited for every permit), so
//! every per-key promise below holds permit by permit (`permits`).
//! Every outermost hold's body reads its key's counter (a file shared by
//! the processes, out of the faults' reach; one per permit of `nk3`) when
//! it begins and when it ends, and a write or exclusive hold then writes
//! it plus one: a reader beside a writer, or two writers at once, see it
//! change.
//! Everything is chosen from one seed
//! (`LOCK_NEMESIS_SEED`, else the clock; printed), which replays the same
//! choices — though not the same timing — and every event of every process
//! carries `CLOCK_MONOTONIC`, the clock this process stamps the faults with.
//! A worker also says when its executor was blocked and when it got no CPU
//! at all (an overloaded machine): a process that cannot run cannot act, so
//! the timing bounds allow for that (its "frozen" stretches), and nothing
//! else.
//!
//! What is checked, and the bounds (named constants below):
//! - exclusion: outermost holds of one key never overlap by more than
//!   [`SLACK`] when either is a write (or exclusive) hold (read holds may
//!   overlap each other), unless a data-losing fault came between the two
//!   acquisitions
//!   (then the later token must be larger and the earlier holder must be
//!   told (`lost`) or be done within [`stale_bound`] of the later
//!   acquisition), or the earlier holder was frozen when it should have
//!   learnt its hold was gone (then it must stop within [`RESUME`] of running
//!   again);
//! - fencing: a write (or exclusive) hold never enters with a token at or
//!   below one that a hold of the same key surely entered with before (its
//!   entry was logged before the poll that handed the later hold over
//!   began), a read hold never at or below an earlier write hold's (tokens
//!   order nothing among readers), whatever the faults: no data loss, stop
//!   or stall excuses a token going backwards;
//! - data: a body whose key's counter changed between its start and its
//!   end had a writer beside it whose overlap the faults excuse as above
//!   (else the change is a violation, also when no writer logged a write
//!   inside it);
//! - nesting: inside one task, bodies of one key that overlap are ancestor
//!   and descendant, or both read (sibling `join!` arms take turns unless
//!   both read), unless the earlier one's hold was reported lost before
//!   the later one got it; a write or exclusive call inside read holds of
//!   its key and no write hold (an upgrade) ends at once with
//!   `UpgradeRefused`;
//! - waiting: no bounded wait ends later than its deadline + [`LATE_SLACK`]
//!   (+ the time its process was frozen), and none times out on a key that
//!   was observably free for longer than [`FREE_BASE`] (+ how long its
//!   last holder's lock may linger when that hold did not end in a release:
//!   [`Backend::linger`]) before its deadline (not checked near faults),
//!   nor on a key that stayed free and out of reach for longer than
//!   [`STUCK`] in all outside the faults' windows (checked whatever the
//!   faults: something they left behind that never runs out);
//! - multi-key calls: a body ran holding every key of its call together
//!   (each key's hold entered, the holds overlapping), and a call nested
//!   in one on a key sorting before a key the chain's multi-key calls hold
//!   (and not held by them) ends at once with `OrderRefused`, no other
//!   call so; a multi-key call's key counts as held (not free, for the
//!   waiters) from the call's start, since it may be taken before the
//!   later key is waited for;
//! - permits: a permit call was told (`permit()`, a guard's `permit()`)
//!   the permit whose slot it is under, below N, and a guard holds that
//!   permit's lock; a permit call nested (at any depth) in one holding a
//!   permit of its key re-enters that permit (same token, no hold of its
//!   own) unless the outer hold was told lost first; no more than N
//!   outermost holds of the key overlap, nor more than n on the permits
//!   below n for each count n in use, but as the faults excuse on one
//!   permit (implied by the rest: a sanity check of the slots); a bounded
//!   wait for a permit may end N times [`LATE_SLACK`] past its deadline (a
//!   try-once tries the permits in turn);
//! - records: a write (or exclusive) hold whose record the worker reads
//!   inside its body (`inspect`, half of them) is recorded as a write
//!   hold, its token not among the readers' (a write hold recorded as a
//!   read lets readers of other processes in beside it);
//! - leftovers: after the run no lock hash, queue or channel is left in
//!   Redis (no key under the run's prefix in etcd, no contender node under
//!   it in ZooKeeper) and every worker's runtime reports nothing held,
//!   waiting or tracked;
//! - what was tested: on Redis some hold was passed between tasks (lock
//!   cohorting), read holds of two processes overlapped (readers shared a
//!   key), and two permits of the key were held at once.
//!
//! The promises are the same on every backend; only the time a lock may
//! outlive its holder differs ([`Backend`]: etcd ends a lease in whole
//! seconds, and a renewed lock's etcd lease is 1.5 lock leases; ZooKeeper
//! ends a session a little after its timeout). On etcd and ZooKeeper every
//! lock is fair (a process's plain requests queue too) and no hold is
//! passed between tasks (lock cohorting is off there).
//!
//! A violation names the key, both holders (process, task, call, token,
//! lease, when each asked, entered and stopped) and the faults around it;
//! the failure message adds the history of the key around the first
//! violation of each class.
//!
//! | module | what |
//! |---|---|
//! | `workers` | the worker processes, and their logs as they come in |
//! | `store` | the servers (Redis, etcd members or ZooKeeper servers), each worker's proxies, the leftovers |
//! | `faults` | the faults, from the seed (and the executor stalls and bursts of calls beside them) |
//! | `members` | the faults of an etcd cluster or a ZooKeeper ensemble |
//! | `history` | the merged event logs, as calls |
//! | `check` | the promises, checked against the history |
//! | `many` | the promises of multi-key calls (all keys together, order refusals) |
//! | `report` | a failing run's message, and the history dump |
//! | `checker_tests` | the checker on made-up histories |
//! | `many_tests` | the multi-key checks on made-up histories |
//! | `permits` | the permits as keys of their own (slots), and the promises of permit calls |
//! | `permits_tests` | the permit checks on made-up histories |
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod check;
mod checker_tests;
mod faults;
mod history;
mod many;
mod many_tests;
mod members;
mod permits;
mod permits_tests;
mod releases;
mod report;
mod store;
mod workers;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::{serial, XorShift};
use check::{check, Violation};
use faults::{
    burst_calls, drive_faults, place_firings, stall_executors, Fault, Stage, TimedRestarts,
};
use history::History;
use report::{dump, report};
use store::{Link, Store};
use workers::{spawn_worker, Control, Executor};

/// Worker processes, each behind its own proxies.
const PROCESSES: usize = 3;
/// Members of the etcd cluster (the ZooKeeper ensemble has as many).
const MEMBERS: usize = 3;
/// Tasks per worker.
const TASKS: usize = 8;
/// The workers' connect and response timeouts.
const TIMEOUT: Duration = Duration::from_millis(400);
/// Longest lease a worker asks for, in ms (`nemesis_worker`'s `Plan::random`).
const MAX_LEASE_MS: u64 = 3000;
/// Scheduling slack for "before": a holder told `lost` at most this long
/// after the next holder's acquisition still counts as told first.
const SLACK: Duration = Duration::from_millis(5);
/// A process that was stopped or whose executor was blocked acts on what it
/// missed (a lost hold, a timer) at most this long after it runs again: its
/// lock runtime's overdue timers fire, its tasks are polled in turn.
const RESUME: Duration = Duration::from_millis(500);
/// A bounded wait may end this long after its deadline: its last try may
/// take the try-once bound plus the response timeout.
const LATE_SLACK: Duration = Duration::from_millis(750);
/// A waiter may time out on a key that was free (no hold open in any
/// process) for at most this long before its deadline: a release message
/// wakes the waiters at once. When the last hold did not end in a release
/// (told lost, cancelled, panicked), its lease is added: its lock may still
/// be in Redis until it expires.
const FREE_BASE: Duration = Duration::from_secs(1);
/// A free key that waiters time out on may stay out of reach this long in
/// all outside the faults' windows (each from its start until it settled);
/// longer, it is stuck.
const STUCK: Duration = Duration::from_secs(5);
/// After a fault ends, how long the system may still be catching up
/// (reconnecting, re-subscribing): no free-key check in that time.
const RECOVERY: Duration = Duration::from_secs(1);
/// After a fault that cuts connections, a release that was in flight may be
/// gone, its lock living on until its lease runs out; after a restart from
/// a snapshot, locks the snapshot held live again for up to their lease:
/// the recovery is that much longer.
const LINGER_RECOVERY: Duration = Duration::from_millis(MAX_LEASE_MS + 1000);
/// How long the workers may take to finish after the faults end (the last
/// fault ends up to 1 s before the run does, their last call is cut at 8 s,
/// their stats settle within 3 s).
const WORKER_GRACE: Duration = Duration::from_secs(20);
/// How long leftover locks and queue places may take to run out after the
/// workers are gone: a lease plus a queue place's life (3 s) and 2 s.
const LEFTOVER_LIMIT: Duration = Duration::from_millis(MAX_LEASE_MS + 3000 + 2000);
/// etcd revokes the leases that ran out in a sweep this often: a key may
/// outlive its lease by as long.
const ETCD_REVOKE_SWEEP: Duration = Duration::from_millis(500);
/// ZooKeeper's leader expires a session in the first sweep (every tick)
/// after its deadline, which it rounds up to a whole tick, and the
/// session's close is a write the ensemble agrees on: its nodes may outlive
/// the timeout by this much (two ticks and the write).
const ZOOKEEPER_EXPIRY: Duration = Duration::from_millis(2 * 200 + 100);
/// The session timeout the runtime asks ZooKeeper for, for locks of
/// `lease`: the lease and a quarter more, at least 500 ms
/// (`backend/zookeeper/sessions.rs`: `asked`).
fn zookeeper_session(lease: Duration) -> Duration {
    (lease + lease / 4).max(Duration::from_millis(500))
}
/// Events shown around the first violation of each class.
const WINDOW: Duration = Duration::from_secs(1);
/// Violations listed per class.
const PER_CLASS: usize = 10;

/// `CLOCK_MONOTONIC` in ns, the clock of every event of every process.
fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Spreads small, neighbouring seeds apart (xorshift's first values from
/// a small seed are small too).
fn splitmix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn ns(d: Duration) -> u64 {
    d.as_nanos() as u64
}

/// `LOCK_NEMESIS_SEED`, else the clock.
fn seed() -> u64 {
    std::env::var("LOCK_NEMESIS_SEED")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| XorShift::from_clock().state())
}

/// `LOCK_NEMESIS_SECS`, else 30 s per test on Redis (about 33 s with
/// start-up and the leftover check; the three tests take about 100 s) and
/// 25 s on etcd and ZooKeeper (about 35 s with the cluster's start and the
/// leftovers; up to 50 s with three JVMs starting on a busy machine).
fn secs(backend: Backend) -> u64 {
    std::env::var("LOCK_NEMESIS_SECS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(match backend {
            Backend::Redis => 30,
            Backend::Etcd | Backend::ZooKeeper => 25,
        })
}

/// The backend the workers lock on, and the bounds that differ by backend
/// (the checker's promises are the same).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    /// One Redis server.
    Redis,
    /// An etcd cluster of [`MEMBERS`] members.
    Etcd,
    /// A ZooKeeper ensemble of [`MEMBERS`] servers.
    ZooKeeper,
}

impl Backend {
    /// How long a lock nobody deletes may stay in the store after its
    /// holder last kept it (its acquisition or renewal). Redis: its lease.
    /// etcd: until its etcd lease runs out and the next sweep revokes it
    /// ([`ETCD_REVOKE_SWEEP`]); a renewed hold's key is on its runtime's
    /// lease for that lock lease, whose TTL is 1.5 lock leases rounded up
    /// to whole seconds (`backend/etcd/lease.rs`), a fixed hold's on a
    /// lease of its own of the lock lease rounded up. ZooKeeper: until the
    /// session the node is on expires, its timeout ([`zookeeper_session`])
    /// after it last heard from the holder's process, and
    /// [`ZOOKEEPER_EXPIRY`].
    fn linger(self, lease: Duration, renew: bool) -> Duration {
        match self {
            Backend::Redis => lease,
            Backend::Etcd => {
                let ttl = if renew { lease + lease / 2 } else { lease };
                let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
                Duration::from_secs(secs.max(1)) + ETCD_REVOKE_SWEEP
            }
            Backend::ZooKeeper => zookeeper_session(lease) + ZOOKEEPER_EXPIRY,
        }
    }

    /// After a fault that can leave a lock behind (a cut that lost a
    /// release in flight, a stopped process, a restart), how long the
    /// system may still be catching up: [`LINGER_RECOVERY`] on Redis; on a
    /// cluster the longest lock's linger and a second (a new ZooKeeper
    /// leader counts every session's timeout anew from its election).
    fn linger_recovery(self) -> Duration {
        match self {
            Backend::Redis => LINGER_RECOVERY,
            Backend::Etcd | Backend::ZooKeeper => {
                self.linger(Duration::from_millis(MAX_LEASE_MS), true) + Duration::from_secs(1)
            }
        }
    }

    /// How long what is left of the run may take to run out after the
    /// workers are gone: [`LEFTOVER_LIMIT`] on Redis; on a cluster (where a
    /// queue place is a key on a lease, or a node on a session, like a
    /// lock) the longest linger and 2 s.
    fn leftover_limit(self) -> Duration {
        match self {
            Backend::Redis => LEFTOVER_LIMIT,
            Backend::Etcd | Backend::ZooKeeper => {
                self.linger(Duration::from_millis(MAX_LEASE_MS), true) + Duration::from_secs(2)
            }
        }
    }

    /// Whether the workers' runtimes pass holds between their tasks (lock
    /// cohorting): not on etcd nor on ZooKeeper, which can reserve no block
    /// of tokens.
    fn passes_locally(self) -> bool {
        self == Backend::Redis
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Every key in plain mode.
    Plain,
    /// Keys in fair mode (a third key, when there is one, stays plain: the
    /// modes live side by side, one per key).
    Fair,
    /// On every key one process is plain and the others are fair.
    Mixed,
}

/// One test per run of the list below: [`run`] on its backend and in its
/// mode, in the binary's turn (each line names the promise it keeps).
macro_rules! nemesis_runs {
    ($($(#[doc = $doc:literal])* $name:ident: $backend:expr, $mode:expr;)*) => {$(
        $(#[doc = $doc])*
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let _turn = serial().await;
            run($backend, $mode).await;
        }
    )*};
}

nemesis_runs! {
    /// Plain mode: random faults, random calls, every promise checked.
    nemesis_plain_mode_keeps_every_promise: Backend::Redis, Mode::Plain;

    /// Fair mode: the same, with the keys queued fairly.
    nemesis_fair_mode_keeps_every_promise: Backend::Redis, Mode::Fair;

    /// Both modes on one key, one plain process beside fair ones: exclusion,
    /// fencing and nesting hold all the same.
    nemesis_plain_and_fair_processes_on_one_key_keep_every_promise: Backend::Redis, Mode::Mixed;

    /// On an etcd cluster of three, whose members are frozen, killed (the
    /// leader most often) and restarted from disk beside the network and
    /// process faults: the same promises. Every lock is fair on etcd, so the
    /// processes' plain and fair requests (mixed, as in the test above) queue
    /// alike; holds are never passed between tasks there. etcd applies one
    /// process's calls in any order, and a call the client gave up on may be
    /// applied late: the "free key stuck" rule catches a late put that stood
    /// again after its key's delete (`backend/etcd/tomb.rs`).
    nemesis_on_etcd_keeps_every_promise: Backend::Etcd, Mode::Mixed;

    /// On a ZooKeeper ensemble of three, whose servers are frozen, killed (the
    /// leader most often) and restarted from disk, and whose sessions expire
    /// (a worker's network stalled or the worker stopped past a lease, which
    /// is its session's timeout): the same promises. Every lock is fair there
    /// too, and holds are not passed between tasks.
    nemesis_on_zookeeper_keeps_every_promise: Backend::ZooKeeper, Mode::Mixed;
}

/// What lock a key is. Every process takes a key as the same kind (in
/// fair or plain mode, which may differ by process).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeyKind {
    /// Every call exclusive: the mutex.
    Exclusive,
    /// Each call a read hold (70 %), a write hold or an exclusive one (the
    /// same lock as a write), drawn by the worker from its seed.
    ReadWrite,
    /// The same with a quarter of the calls readers: readers mostly meet
    /// writers.
    WriteMostly,
    /// Every call asks one of [`PERMITS`] permits (`permits(N)`): up to N
    /// holders at once, one per permit.
    Permits,
}

/// The permits of a [`KeyKind::Permits`] key: enough for several holders
/// at once, few enough that the 24 tasks often find them all taken.
const PERMITS: u32 = 3;

/// How one process takes one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct KeySpec {
    kind: KeyKind,
    fair: bool,
    /// The permits a [`KeyKind::Permits`] key's calls ask (0 for the other
    /// kinds): [`PERMITS`], or one fewer for one process in mixed mode
    /// ([`permits_asked`]).
    permits: u32,
}

impl KeySpec {
    /// Its count of permits: 0 but for a permit key.
    fn permits(self) -> u32 {
        self.permits
    }

    /// The worker's word for it (`nk0:<word>`).
    fn word(self) -> String {
        let mode = if self.fair { "fair" } else { "plain" };
        match self.kind {
            KeyKind::Exclusive => mode.to_owned(),
            KeyKind::ReadWrite => format!("rw-{mode}"),
            KeyKind::WriteMostly => format!("mix-{mode}"),
            KeyKind::Permits => format!("permits{}-{mode}", self.permits),
        }
    }
}

/// The keys' kinds: `nk0` exclusive, `nk1` read-write (mostly readers),
/// `nk2` read-write with a quarter readers, `nk3` of [`PERMITS`] permits,
/// so that every run checks exclusive locks, readers sharing a key,
/// readers and writers of several processes taking turns on one, and
/// several holders of one key, each on a permit of its own.
fn key_kinds() -> Vec<KeyKind> {
    vec![
        KeyKind::Exclusive,
        KeyKind::ReadWrite,
        KeyKind::WriteMostly,
        KeyKind::Permits,
    ]
}

/// How each process takes each key: `[process][key]`, fair or plain as
/// the test's [`Mode`] says ([`key_modes`]), whatever the key's kind, and
/// with how many permits ([`permits_asked`]).
fn key_specs(mode: Mode, kinds: &[KeyKind], rng: &mut XorShift) -> Vec<Vec<KeySpec>> {
    key_modes(mode, kinds.len(), rng)
        .into_iter()
        .enumerate()
        .map(|(p, fair)| {
            kinds
                .iter()
                .zip(fair)
                .map(|(&kind, fair)| KeySpec {
                    kind,
                    fair,
                    permits: permits_asked(mode, kind, p),
                })
                .collect()
        })
        .collect()
}

/// The permits process `p` asks on a key of `kind`: [`PERMITS`] on a
/// permit key, but in mixed mode (the etcd and ZooKeeper runs' too)
/// process 0 asks one fewer, so that calls giving different counts share
/// the low permits (docs/guarantees.md: at most n of them below n, for
/// each n in use).
fn permits_asked(mode: Mode, kind: KeyKind, p: usize) -> u32 {
    match kind {
        KeyKind::Permits if mode == Mode::Mixed && p == 0 => PERMITS - 1,
        KeyKind::Permits => PERMITS,
        KeyKind::Exclusive | KeyKind::ReadWrite | KeyKind::WriteMostly => 0,
    }
}

/// Which keys each process takes in fair mode: `[process][key]`.
fn key_modes(mode: Mode, key_count: usize, rng: &mut XorShift) -> Vec<Vec<bool>> {
    let plain_process: Vec<u64> = (0..key_count)
        .map(|_| rng.below(PROCESSES as u64))
        .collect();
    (0..PROCESSES)
        .map(|p| {
            (0..key_count)
                .map(|i| match mode {
                    Mode::Plain => false,
                    Mode::Fair => !(key_count >= 3 && i == 2),
                    Mode::Mixed => plain_process[i] != p as u64,
                })
                .collect()
        })
        .collect()
}

/// Each worker's executor: `current_thread` or two threads, at random, at
/// least one `current_thread` (where one blocked poll stops every task).
fn executors(rng: &mut XorShift) -> Vec<Executor> {
    let mut executors: Vec<Executor> = (0..PROCESSES)
        .map(|_| {
            if rng.below(2) == 0 {
                Executor::Current
            } else {
                Executor::Multi
            }
        })
        .collect();
    if !executors.contains(&Executor::Current) {
        executors[rng.below(PROCESSES as u64) as usize] = Executor::Current;
    }
    executors
}

async fn run(backend: Backend, mode: Mode) {
    let seed = seed();
    let secs = secs(backend);
    let mut rng = XorShift::new(splitmix(seed));
    let kinds = key_kinds();
    let key_count = kinds.len();
    let specs = key_specs(mode, &kinds, &mut rng);
    let executors = executors(&mut rng);
    let stall_rng = XorShift::new(splitmix(seed ^ 0x5354_414c_4c53));
    let prefix = lock_tests::unique("nemesis");
    // ZooKeeper's keys are paths: the locks are nodes under this one.
    let prefix = match backend {
        Backend::ZooKeeper => format!("/{prefix}/"),
        Backend::Redis | Backend::Etcd => format!("{prefix}:"),
    };

    // The keys' shared counters, one file each: the bodies' data. In
    // memory (tmpfs) where there is one: a write to a disk file may wait
    // for the machine's writeback, which would stall a worker's executor
    // beside the faults the test means.
    let shm = std::path::Path::new("/dev/shm");
    let data_dir = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
    .join(lock_tests::unique("nemesis-data"));
    std::fs::create_dir_all(&data_dir).expect("create the nemesis data directory");

    let mut store = Store::start(backend);
    let mut links = Vec::new();
    for _ in 0..PROCESSES {
        links.push(Link::start(&store, backend).await);
    }
    let clock_base = (std::time::Instant::now(), now_ns());

    let changed = Arc::new(Notify::new());
    let mut workers = Vec::new();
    for (i, link) in links.iter().enumerate() {
        let keys: Vec<(String, KeySpec)> = (0..key_count)
            .map(|k| (format!("nk{k}"), specs[i][k]))
            .collect();
        let worker = spawn_worker(
            i,
            &link.url(),
            &prefix,
            seed.wrapping_add(i as u64),
            secs,
            &keys,
            &data_dir,
            executors[i],
            changed.clone(),
        )
        .await;
        workers.push(worker);
    }
    let controls: Vec<Arc<Control>> = workers.iter().map(|w| w.control.clone()).collect();
    for control in &controls {
        control.go().await;
    }
    let run_start = now_ns();

    let stalls = tokio::spawn(stall_executors(controls.clone(), stall_rng, secs));
    let burst_rng = XorShift::new(splitmix(seed ^ 0x4255_5253_5453));
    let bursts = tokio::spawn(burst_calls(controls.clone(), burst_rng, secs));
    let inspector = store.inspector(&prefix).await;
    let mut stage = Stage {
        backend,
        store: &mut store,
        links: &links,
        workers: &controls,
        changed: &changed,
        prefix: &prefix,
        timed: TimedRestarts::default(),
        inspector,
    };
    let mut faults = drive_faults(&mut stage, &mut rng, secs).await;
    let timed = stage.timed;
    stalls.await.expect("the executor stalls");
    bursts.await.expect("the bursts of calls");

    // Heal everything (each fault heals itself; this is belt and braces).
    for link in &links {
        link.resume();
        link.slow(None);
        link.refuse(false);
    }
    for control in &controls {
        control.stop(false).await;
    }

    let mut violations = Vec::new();
    let hard_limit = Instant::now() + WORKER_GRACE;
    let mut outputs = Vec::new();
    let mut ends = Vec::new();
    for (i, mut worker) in workers.into_iter().enumerate() {
        let status = tokio::time::timeout_at(hard_limit, worker.child.wait()).await;
        let killed_at = now_ns();
        match status {
            Ok(Ok(status)) if status.success() => {}
            Ok(status) => violations.push(Violation::plain(
                "worker failed",
                format!("worker {i} exited with {status:?}"),
            )),
            Err(_) => {
                let _ = worker.child.kill().await;
                violations.push(Violation::plain(
                    "worker hung",
                    format!(
                        "worker {i} did not finish within {} s after the run",
                        WORKER_GRACE.as_secs()
                    ),
                ));
            }
        }
        worker.control.close().await;
        let lines = worker.lines.await.expect("worker output");
        let end = lines
            .iter()
            .rev()
            .find_map(|l| l.strip_prefix("done ").and_then(|t| t.parse().ok()))
            .unwrap_or(killed_at);
        ends.push(end);
        // The executor stalls it reports are faults too, and so are the
        // stretches in which it got no CPU.
        faults.extend(lines.iter().filter_map(|l| {
            Fault::stall(i, executors[i], l)
                .or_else(|| Fault::starved(i, l))
                .or_else(|| Fault::shutdown(i, backend, l))
        }));
        outputs.push(lines);
    }
    for (i, link) in links.iter().enumerate() {
        let fired: Vec<u64> = link
            .dropped_at_command_times()
            .into_iter()
            .map(|t| clock_base.1 + ns(t.saturating_duration_since(clock_base.0)))
            .collect();
        place_firings(&mut faults, i, &fired);
    }
    drop(links);

    store
        .leftovers(&prefix, backend.leftover_limit(), &mut violations)
        .await;

    let _ = std::fs::remove_dir_all(&data_dir);

    let history = History::parse(&outputs, &ends, run_start, &mut violations);
    let coverage = check(&history, &faults, backend, &mut violations);

    let label = match backend {
        Backend::Redis => format!("{mode:?}"),
        Backend::Etcd | Backend::ZooKeeper => format!("{backend:?}"),
    };
    if let Ok(path) = std::env::var("LOCK_NEMESIS_DUMP") {
        dump(&history, &faults, &coverage, &format!("{path}.{label}"));
    }
    let ops = history.calls.len();
    // The promises must hold with lock cohorting at work, not beside it.
    if backend.passes_locally() && history.passed_locally == 0 && !outputs.is_empty() {
        violations.push(Violation::plain(
            "no local handoffs",
            "no worker passed a hold between its tasks: cohorting went untested".to_owned(),
        ));
    }
    // Read holds must share the key, or "readers may overlap" went
    // untested (and readers would be served as writers).
    if coverage.read_holds > 0 && coverage.readers_side_by_side == 0 {
        violations.push(Violation::plain(
            "readers never shared",
            format!(
                "{} read holds, none beside a read hold of another process",
                coverage.read_holds
            ),
        ));
    }
    permits::side_by_side(&coverage, &mut violations);
    println!(
        "nemesis on {backend:?}: seed {seed}, {ops} ops, {} faults, {} holds passed locally, \
         {} read holds ({} beside another process's reader), {} write holds, {} data checks, \
         {} upgrades refused, {} violations",
        faults.iter().filter(|f| f.counted).count(),
        history.passed_locally,
        coverage.read_holds,
        coverage.readers_side_by_side,
        coverage.write_holds,
        coverage.data_checks,
        coverage.upgrades_refused,
        violations.len()
    );
    println!(
        "nemesis: {} calls cut by a timeout ({} cancelled), {} tries, {} guards dropped, {} \
         shutdowns ({} holds open at one), {} write holds' records read inside their body",
        coverage.cut_calls,
        coverage.cancelled,
        coverage.tries,
        coverage.guards_dropped,
        history.shutdowns.len(),
        coverage.holds_at_a_shutdown,
        coverage.write_holds_inspected
    );
    println!(
        "nemesis: {} multi-key calls ({} entered their body, {} key holds), {} nested calls \
         refused as out of their order",
        coverage.many_calls, coverage.many_entered, coverage.many_holds, coverage.order_refused
    );
    permits::print_coverage(&coverage);
    match backend {
        Backend::Redis => println!(
            "nemesis: {} restarts timed at a release (of {} tries), {} with the key taken on \
             the new server before the blocked worker ran again",
            timed.restarts, timed.tries, timed.taken_meanwhile
        ),
        Backend::Etcd | Backend::ZooKeeper => println!(
            "nemesis: {} kills of the leader or the cluster timed at a handoff to a blocked \
             worker (of {} tries)",
            timed.restarts, timed.tries
        ),
    }
    println!(
        "nemesis: {} restarts inside a stall right after an acquire went out (of {} tries), {} \
         with the key taken on the new server before the stalled worker ran again",
        timed.send_restarts, timed.send_tries, timed.send_taken
    );
    if !violations.is_empty() {
        faults.sort_by_key(|f| f.start);
        let setup: Vec<String> = (0..PROCESSES)
            .map(|p| {
                let keys: Vec<String> = (0..key_count)
                    .map(|k| format!("nk{k}:{}", specs[p][k].word()))
                    .collect();
                format!("p{p} {:?} executor, {}", executors[p], keys.join(","))
            })
            .collect();
        let header = format!(
            "nemesis on {backend:?} ({mode:?} mode; {}) found {} violations; replay with \
             LOCK_NEMESIS_SEED={seed} LOCK_NEMESIS_SECS={secs} (times below: seconds since \
             the run began, at CLOCK_MONOTONIC {:.6} s, the clock of LOCK_NEMESIS_TRACE's \
             files)",
            setup.join("; "),
            violations.len(),
            run_start as f64 / 1e9,
        );
        let report = report(&history, &faults, &violations, &header);
        panic!("{report}");
    }
}
