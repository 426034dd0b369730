#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! One process of the nemesis test (`tests/faults/nemesis.rs`): random
//! locked calls on a few keys, and a log line for everything that happens to
//! each of them, stamped with the system-wide monotonic clock so the test can
//! merge the logs of all processes and check them against each other.
//!
//! ```text
//! Usage:
//!   nemesis_worker <url> <prefix> <seed> <secs> <tasks> <timeout-ms> <key>[,<key>...] <data-dir> <executor>
//!       where `<url>` is a Redis URL, `etcd://host:port[,host:port...]`
//!       (the etcd backend, one endpoint per member) or
//!       `zookeeper://host:port[,host:port...]` (the ZooKeeper backend, its
//!       connect string; `<prefix>` is a path then), each key is
//!       `<name>:fair` or `<name>:plain` (an exclusive lock, in the mode this
//!       process asks for it with; processes may differ; on etcd and
//!       ZooKeeper every lock is fair whatever it asks) or `<name>:rw-plain`
//!       or `<name>:rw-fair` (a read-write lock: each call asks a read hold
//!       (70 %), a write hold or an exclusive one, which is the same lock)
//!       or `<name>:mix-plain` or `<name>:mix-fair` (the same with a quarter
//!       of the calls readers) or `<name>:permits<N>-plain` or
//!       `<name>:permits<N>-fair` (every call exclusive, asking one of `<N>`
//!       permits: `permits.rs`),
//!       `<data-dir>` holds one file per key, `<name>`, with the key's
//!       shared counter (created when missing; a permit key has one per
//!       permit, `<name>#<i>` for permit `i > 0`), and `<executor>` is
//!       `current` (the tasks run on a `current_thread` tokio runtime: one
//!       blocked poll stops them all) or `multi` (two worker threads).
//!
//! The data: every outermost hold reads its key's counter (a permit
//! call's: its permit's) when its body begins and again when it ends; a
//! write or exclusive hold then writes the counter plus one. A reader
//! beside a writer, or two writers at once, see the counter change under
//! them (`data` event).
//!
//! It builds a lock runtime (connect and response timeouts of
//! `<timeout-ms>`), prints `ready <id>` (`<id>`: the process part of its
//! holder ids, so the test can tell whose a fair handoff is), waits for a
//! `go` line on stdin, runs `<tasks>` tasks for `<secs>` seconds, then prints
//! `stats held=<n> waiting=<n> tracked=<n>`, drops the runtime and prints
//! `done <t>`. It exits when its stdin closes (the test is gone).
//!
//! Orders on stdin after `go`:
//!   stall <n> <ms> sleep|spin   block one thread of the executor (the only
//!       one of a `current` executor) inside a poll, in `std::thread::sleep`
//!       or a busy loop (that yields the core), for `<ms>` or until
//!       `unstall <n>`; then print
//!       `stall <n> <from> <to> <how>` (CLOCK_MONOTONIC ns: when it was
//!       blocked)
//!   unstall <n>   ends stall `<n>` now (also when it has not begun yet,
//!       and an `arm <n>` whose call has not stalled yet does not stall)
//!   arm <n> <ms> <key>   one more top-level call on key `<key>` (random
//!       options, task `<tasks>`), made once `inspect` finds the key free
//!       (or after a second): unless its first poll ends it, it blocks the
//!       executor thread right after that poll (its acquire went out, to be
//!       answered on the lock runtime's own thread), in
//!       `std::thread::sleep`, for `<ms>` or until `unstall <n>`: it prints
//!       `stalled_after_send <n> <t> <key>` when it begins and
//!       `stall <n> <from> <to> sleep` when it ends; the test restarts the
//!       server meanwhile, and the call then finds an answer from before
//!   burst <n> <tasks> <ms> <key> <readers>   `<tasks>` more tasks
//!       (numbered from `<tasks>` + 1) make top-level calls on key `<key>`
//!       for `<ms>`, each cut by a 0-60 ms timeout around its acquire or its
//!       body, on a read-write key `<readers>` % of them reads (many
//!       waiters of one process on one key, given up at random points);
//!       prints `burst <n> <t> <key> <tasks>` as it begins
//!   shutdown <n>  `shutdown()` of the lock runtime (while the tasks go on),
//!       then `shutdown <n> <from> <to> ok|err` (when it was called and
//!       returned); a new runtime is built (tried until it starts) and
//!       announced with `runtime <id>`; the tasks' next calls use it (a call
//!       keeps the runtime it began on, its nested calls too)
//!
//! `starved <from> <to>`: the process got no CPU from `<from>` to `<to>`
//! (a thread of it that wakes every 10 ms did not run for over 100 ms: an
//! overloaded machine, or SIGSTOP).
//!
//! Its own stalls: now and then a task blocks its thread for 100-500 ms
//! right after a locked call, often after one whose release passed the hold
//! to another task (CPU-bound work after a locked section): it prints
//! `blocking <t> passed=0|1` before and `stall 0 <from> <to> <how>` after.
//!
//! Event lines: `ev <t> <task> <call> <parent> <key> <kind> [<name>=<value>...]`
//! where `<t>` is CLOCK_MONOTONIC in ns, `<call>` a process-unique call id,
//! `<parent>` the enclosing call (0 for a task's top-level call), `<key>` the
//! key's index (a permit call's: `<key>#<permit>`, the permit it got, or
//! one drawn at random when it got none; its `begin` line comes once that
//! is known, with its own time: `permits.rs`), and `<kind>` one of:
//!   begin     the request goes out; `api=with|guard|try wait=<ms>|forever
//!             bound=<ms> lease=<ms> renew=0|1 fair=0|1 lost=abort|continue
//!             mode=exclusive|read|write cut=acquire:<ms>|body:<ms>|-
//!             end=release|drop|cut:<ms>` (`cut`: a timeout around the
//!             acquire (a `with_lock`: the whole call) or the body; `end`: a
//!             guard released, dropped, or its release cut by a timeout;
//!             `try`: `try_acquire()`, `wait=0`); a multi-key call (one
//!             top-level call in six, `many.rs`) logs one call per key, each
//!             `begin` adding `many=<id> keys=<k>,<k>` (`<id>`: its first
//!             key's call id; `api=with` is `with_locks`; never on a
//!             permit key); a permit call adds `permits=<N>`
//!   acquired  `fence=<n> outer=0|1 polled=<t>` (outer: a hold of its own
//!             in the backend, not a re-entry of an enclosing call's hold; polled:
//!             when the poll began in which the library handed the hold over,
//!             the earliest moment the entry can have happened — the line
//!             itself may be late when the process was stopped in between;
//!             a multi-key call's keys before its last: `polled` is when
//!             the call began, `lease_from=<t>` the poll that entered; a
//!             permit call: `permit=<i>|none permits=<N>`, the index the
//!             library said (`permit()` in a `with_lock` body, a guard's
//!             `permit()`), and a guard's `lock=<key>`, the key of the lock
//!             it holds)
//!   body_enter, body_exit `how=done|dropped`
//!   recorded  `mode=read|write|free own=writer|reader|-`: for half of
//!             the outermost write (or exclusive) holds, right after
//!             `body_enter`, what `inspect` says of the key (of a permit
//!             call's permit's lock): whether the hold's token is the
//!             recorded writer's or a reader's
//!   data      `seen=<n> then=<n> wrote=<n>|-`: an outermost hold's counter
//!             when its body began and when it ended (and what a writer
//!             wrote then); logged right after, before `released`, and
//!             only by a holder not told its hold was lost
//!   lost      the holder was told its lock is gone; for an outermost hold
//!             of a fixed lease, `lease_timer=<t>` when a plain timer of the
//!             executor for `polled` + the lease (the latest its client-side
//!             lease can end) fired before
//!   released  the holder stops acting; its release goes out right after
//!             (`dropped=1`: the guard is dropped, released in the background)
//!   timeout   `waited=<ms>` (a `try_acquire()` that found the lock held:
//!             `waited=0 busy=1`); error `what=<text>` (`what=upgrade_refused`
//!             for a write asked inside a read hold, `what=order_refused`
//!             for a key asked inside a multi-key call out of its order,
//!             `what=shut_down` after the runtime's shutdown; a multi-key
//!             call's key that was not the one its wait timed out on:
//!             `what=other_key`); cancelled; panicked
//!   late_lost the release found the lock gone (information only)
//! ```

// (The crate root: its modules are found beside it, not under its name.)
#[path = "nemesis_worker/many.rs"]
mod many;
#[path = "nemesis_worker/permits.rs"]
mod permits;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use lock_runtime::{fence, permit, with_lock, LockError, LockGuard, LockMode, LockRuntime, OnLost};
use tokio::time::Instant;

/// A top-level call still running after this is cancelled (and logged so).
const OP_LIMIT: Duration = Duration::from_secs(8);

/// Deepest nesting of locked calls inside locked bodies.
const MAX_DEPTH: u32 = 2;

/// Payload of the panics this worker raises on purpose (kept off stderr).
const PANIC_PAYLOAD: &str = "nemesis: a panic inside a locked body, on purpose";

/// CLOCK_MONOTONIC in nanoseconds: the same clock in every process.
fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Xorshift64 (reproducible choices from the seed).
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        // Spread neighbouring seeds apart.
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        rng.next();
        rng
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// `true` with `percent` % probability.
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }

    /// An independent generator for a concurrent branch.
    fn fork(&mut self) -> Rng {
        Rng::new(self.next())
    }
}

struct Key {
    name: String,
    fair: bool,
    /// The share of read holds its calls ask, in %: 0 for an exclusive
    /// lock (every call exclusive); a read-write lock's other calls ask a
    /// write hold (two in three) or an exclusive one (the same lock).
    readers: u64,
    /// Its count of permits (`permits<N>-…`: every call on it asks one of
    /// N permits, `permits.rs`); 0 for an ordinary lock.
    permits: u32,
    /// The key's shared counters (in `<data-dir>/<name>`), one per permit
    /// for a permit key (`<name>#<i>` for permit `i > 0`).
    data: Vec<std::fs::File>,
}

impl Key {
    /// `<name>:<kind>` from the command line, its counter file in `dir`.
    fn parse(arg: &str, dir: &std::path::Path) -> Key {
        let (name, kind) = arg.rsplit_once(':').expect("key:kind");
        let (readers, fair, permits) = if let Some((permits, fair)) = permits::kind(kind) {
            (0, fair, permits)
        } else {
            match kind {
                "plain" => (0, false, 0),
                "fair" => (0, true, 0),
                "rw-plain" => (70, false, 0),
                "rw-fair" => (70, true, 0),
                "mix-plain" => (25, false, 0),
                "mix-fair" => (25, true, 0),
                other => {
                    panic!(
                        "key kind {other:?}: plain, fair, rw-plain, rw-fair, mix-plain, mix-fair, \
                         permits<N>-plain or permits<N>-fair"
                    )
                }
            }
        };
        let data = (0..permits.max(1))
            .map(|permit| {
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(dir.join(permits::permit_key(name, permit)))
                    .expect("open the key's counter file")
            })
            .collect();
        Key {
            name: name.to_owned(),
            fair,
            readers,
            permits,
            data,
        }
    }

    /// The counter of `permit` (0 for an ordinary key; 0 before the
    /// first write). One `pread` of 8 bytes from offset 0: it sees a
    /// `pwrite` of the same bytes whole or not at all.
    fn read(&self, permit: u32) -> u64 {
        use std::os::unix::fs::FileExt;
        let mut bytes = [0u8; 8];
        match self.data[permit as usize].read_exact_at(&mut bytes, 0) {
            Ok(()) => u64::from_le_bytes(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => 0,
            Err(e) => panic!("read the counter of {}: {e}", self.name),
        }
    }

    fn write(&self, permit: u32, value: u64) {
        use std::os::unix::fs::FileExt;
        self.data[permit as usize]
            .write_all_at(&value.to_le_bytes(), 0)
            .unwrap_or_else(|e| panic!("write the counter of {}: {e}", self.name));
    }
}

/// What every task shares.
struct Ctx {
    /// The lock runtime new top-level calls use: replaced by a new one
    /// after a `shutdown` order.
    runtime: tokio::sync::watch::Sender<LockRuntime>,
    keys: Vec<Key>,
    next_call: AtomicU64,
    /// Holds passed between tasks by the runtimes shut down so far.
    passed_before: AtomicU64,
}

impl Ctx {
    /// The current lock runtime.
    fn runtime(&self) -> LockRuntime {
        self.runtime.borrow().clone()
    }

    /// The runtime for a new top-level call: once one that is shut down has
    /// been replaced (until `end`: calls on it then fail at once).
    async fn runtime_for_a_call(&self, end: Instant) -> LockRuntime {
        let mut changes = self.runtime.subscribe();
        // Bounded by `end`.
        loop {
            let runtime = changes.borrow_and_update().clone();
            if !runtime.is_shut_down() || Instant::now() >= end {
                return runtime;
            }
            let _ = tokio::time::timeout_at(end, changes.changed()).await;
        }
    }
}

/// The data of an outermost hold: the counter as its body found it.
struct Data {
    key: usize,
    /// The permit held (its counter is read), 0 for an ordinary key.
    permit: u32,
    seen: u64,
}

impl Data {
    /// Reads the counter (of `permit`) at the body's start, for an
    /// outermost hold; none for a permit the key does not have (the
    /// checker reports that permit).
    fn begin(ctx: &Ctx, key: usize, permit: u32, outer: bool) -> Option<Data> {
        let known = (permit as usize) < ctx.keys[key].data.len();
        (outer && known).then(|| Data {
            key,
            permit,
            seen: ctx.keys[key].read(permit),
        })
    }

    /// At the body's end (only when its holder was not told the hold was
    /// lost: a holder that knows stops touching the resource): reads the
    /// counter again, a writer writes it plus one, and logs both.
    /// Synchronous, so no cancellation splits it. A holder whose runtime was
    /// shut down (which tells every hold it is lost) logs `lost` instead.
    fn end(self, cx: &Cx, rec: &Rec, mode: LockMode) {
        if cx.runtime.is_shut_down() {
            rec.emit("lost", "shutdown=1");
            return;
        }
        let key = &cx.ctx.keys[self.key];
        let then = key.read(self.permit);
        let wrote = if mode == LockMode::Read {
            "-".to_owned()
        } else {
            key.write(self.permit, then + 1);
            (then + 1).to_string()
        };
        rec.emit(
            "data",
            &format!("seen={} then={then} wrote={wrote}", self.seen),
        );
    }
}

/// An enclosing hold: calls nested inside it re-enter it.
#[derive(Clone)]
struct Frame {
    key: usize,
    /// The permit it holds, 0 for an ordinary key (each permit's tokens
    /// are a sequence of their own).
    permit: u32,
    fence: u64,
}

/// The mode's word in the log.
fn mode_word(mode: LockMode) -> &'static str {
    match mode {
        LockMode::Read => "read",
        LockMode::Write => "write",
        _ => "exclusive",
    }
}

/// Where a call runs: its task, its parent call, the holds around it.
#[derive(Clone)]
struct Cx {
    ctx: Arc<Ctx>,
    /// The lock runtime of the top-level call (its nested calls use it too).
    runtime: LockRuntime,
    task: u32,
    parent: u64,
    frames: Vec<Frame>,
    /// Whether a release of this task's calls passed its hold on.
    passes: Arc<Passes>,
    /// The stall of the armed call (its nested calls have none).
    arm: Option<Arm>,
    /// A call of a burst: cut short at a random point, and on a read-write
    /// key reading as often as the burst says (%).
    burst: Option<u64>,
}

impl Cx {
    /// Where a top-level call of `task` runs, on `runtime`: no parent, no
    /// holds around it, neither armed nor part of a burst.
    fn top_level(ctx: &Arc<Ctx>, runtime: LockRuntime, task: u32, passes: Arc<Passes>) -> Cx {
        Cx {
            ctx: ctx.clone(),
            runtime,
            task,
            parent: 0,
            frames: Vec::new(),
            passes,
            arm: None,
            burst: None,
        }
    }
}

/// Whether a release passed its hold to another task of the process (lock
/// cohorting): it did when it ended in the poll it began in (a release to
/// Redis waits for the server) and the process's count of passes grew
/// meanwhile.
#[derive(Default)]
struct Passes {
    /// The count right before the release.
    before: AtomicU64,
    /// When the poll began in which the release began.
    poll: AtomicU64,
    passed: std::sync::atomic::AtomicBool,
}

impl Passes {
    /// Right before a release, in the poll that began at `poll`.
    fn before(&self, runtime: &LockRuntime, poll: u64) {
        self.before
            .store(runtime.stats().passed_locally, Ordering::Relaxed);
        self.poll.store(poll, Ordering::Relaxed);
    }

    /// Right after it, in the poll that began at `poll`.
    fn after(&self, runtime: &LockRuntime, poll: u64) {
        if poll == self.poll.load(Ordering::Relaxed)
            && runtime.stats().passed_locally > self.before.load(Ordering::Relaxed)
        {
            self.passed.store(true, Ordering::Relaxed);
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Asking,
    Holding,
    Done,
}

/// The log of one call. Dropped before it reached a final event, it logs
/// `panicked` (unwinding) or `cancelled` (its future was dropped).
struct Rec {
    task: u32,
    id: u64,
    parent: u64,
    key: usize,
    phase: Mutex<Phase>,
    /// A fixed lease's hold: when a plain timer of the executor, set for
    /// the latest its client-side lease can end, fired (0: not yet).
    lease_timer: Arc<AtomicU64>,
    /// A permit call's: its lines go under the permit it got, its `begin`
    /// held back until that is known (`permits.rs`).
    slot: Option<permits::Slot>,
}

impl Rec {
    /// The record of call `id` on `key`, asking (a permit call's when
    /// `slot` is given).
    fn new(cx: &Cx, id: u64, key: usize, slot: Option<permits::Slot>) -> Rec {
        Rec {
            task: cx.task,
            id,
            parent: cx.parent,
            key,
            phase: Mutex::new(Phase::Asking),
            lease_timer: Arc::new(AtomicU64::new(0)),
            slot,
        }
    }

    fn emit(&self, kind: &str, extra: &str) {
        let now = now_ns();
        if let Some(slot) = &self.slot {
            if kind == "begin" {
                return slot.hold_back(now, extra);
            }
            if let Some((t, fields)) = slot.take_begin() {
                self.print(t, "begin", &fields);
            }
        }
        let timer = self.lease_timer.load(Ordering::Relaxed);
        let timer = if kind == "lost" && timer != 0 {
            format!(" lease_timer={timer}")
        } else {
            String::new()
        };
        self.print(now, kind, &format!("{extra}{timer}"));
    }

    /// An event line at `t`; a permit call's key column is `<key>#<permit>`.
    fn print(&self, t: u64, kind: &str, extra: &str) {
        let (task, id, parent, key) = (self.task, self.id, self.parent, self.key);
        match &self.slot {
            None => println!("ev {t} {task} {id} {parent} {key} {kind} {extra}"),
            Some(slot) => {
                let permit = slot.permit();
                println!("ev {t} {task} {id} {parent} {key}#{permit} {kind} {extra}");
            }
        }
    }

    /// A permit call holds a permit of `key`: `said`, the index the library
    /// says, and `lock`, a guard's lock's key (`permits::Slot::got`).
    fn got_permit(&self, cx: &Cx, key: usize, said: Option<u32>, lock: Option<&str>) {
        if let Some(slot) = &self.slot {
            slot.got(&cx.ctx.keys[key].name, said, lock);
        }
    }

    /// The permit its lines go under: 0 for an ordinary key.
    fn permit(&self) -> u32 {
        self.slot.as_ref().map_or(0, permits::Slot::permit)
    }

    /// For a hold of a fixed `lease` handed over in the poll that began at
    /// `polled`: a timer of this executor for `polled + lease`, the latest
    /// the hold's client-side lease can end (it counts from the acquire's
    /// send). Its `lost` says when the timer fired, if before: a tell late
    /// past a timer that was late too was late through the process's
    /// scheduling, not the library's.
    fn time_lease_end(&self, polled: u64, lease: Duration) {
        let fired = self.lease_timer.clone();
        let left = (polled + lease.as_nanos() as u64).saturating_sub(now_ns());
        let due = Instant::now() + Duration::from_nanos(left);
        tokio::spawn(async move {
            tokio::time::sleep_until(due).await;
            fired.store(now_ns(), Ordering::Relaxed);
        });
    }

    /// Logs a hold of `key` entered with `token` in the poll that began at
    /// `polled` (`acquired`, then `body_enter`), and times its lease's end
    /// when it is `fixed`; whether it is the outermost hold of `key` in `cx`.
    fn entered(
        &self,
        cx: &Cx,
        key: usize,
        token: u64,
        polled: u64,
        fixed: Option<Duration>,
    ) -> bool {
        let outer = outer(&cx.frames, (key, self.permit()), token);
        self.set(Phase::Holding);
        let said = self.slot.as_ref().map(permits::Slot::said);
        self.emit(
            "acquired",
            &format!(
                "fence={token} outer={} polled={polled}{}",
                u8::from(outer),
                said.unwrap_or_default()
            ),
        );
        self.emit("body_enter", "");
        if let (Some(lease), true) = (fixed, outer) {
            self.time_lease_end(polled, lease);
        }
        outer
    }

    fn set(&self, phase: Phase) {
        *self.phase.lock().unwrap_or_else(|e| e.into_inner()) = phase;
    }

    fn finish(&self, kind: &str, extra: &str) {
        self.set(Phase::Done);
        self.emit(kind, extra);
    }
}

impl Drop for Rec {
    fn drop(&mut self) {
        let phase = *self.phase.lock().unwrap_or_else(|e| e.into_inner());
        if phase != Phase::Done {
            let kind = if std::thread::panicking() {
                "panicked"
            } else {
                "cancelled"
            };
            self.emit(kind, "");
        }
    }
}

/// Logs `body_exit` when the body ends, however it ends.
struct BodyExit {
    rec: Arc<Rec>,
    done: bool,
}

impl Drop for BodyExit {
    fn drop(&mut self) {
        let how = if self.done { "done" } else { "dropped" };
        self.rec.emit("body_exit", &format!("how={how}"));
    }
}

/// A future that notes when each of its polls begins: the poll in which an
/// acquire hands the hold over began at most that long before the entry.
/// (Stamped right after the entry instead, a stop of the whole process in
/// between would make an entry from before the stop look like one after.)
///
/// It is also where an `arm` order fires: the armed call, if its first poll
/// did not end it (its acquire script went out, to be answered on the lock
/// runtime's own thread, or it waits), blocks the executor thread right
/// after that poll.
struct Stamped<F> {
    inner: Pin<Box<F>>,
    polled: Arc<AtomicU64>,
    /// The stall of an armed call, until its first poll.
    arm: Option<Arm>,
}

impl<F: Future> Stamped<F> {
    fn new(inner: F, polled: Arc<AtomicU64>) -> Stamped<F> {
        Stamped {
            inner: Box::pin(inner),
            polled,
            arm: None,
        }
    }

    /// The call's stall after its first poll, if it is the armed one.
    fn armed(mut self, arm: Option<Arm>) -> Stamped<F> {
        self.arm = arm;
        self
    }
}

impl<F: Future> Future for Stamped<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.polled.store(now_ns(), Ordering::Relaxed);
        let polled = self.inner.as_mut().poll(cx);
        if let Some(arm) = self.arm.take() {
            if polled.is_pending() && UNSTALLED.load(Ordering::Acquire) < arm.id {
                println!("stalled_after_send {} {} {}", arm.id, now_ns(), arm.key);
                block(arm.id, arm.max, false);
            }
        }
        polled
    }
}

/// Errors of a locked body.
#[derive(Debug)]
enum BodyError {
    Lock(LockError),
    /// The body returned an error of its own (on purpose).
    User,
}

impl From<LockError> for BodyError {
    fn from(e: LockError) -> Self {
        BodyError::Lock(e)
    }
}

/// How a call takes its lock.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Api {
    /// `with_lock(request, body)`.
    With,
    /// `acquire()`, a body, then the guard released or dropped.
    Guard,
    /// `try_acquire()` (one try, `wait = 0`), then as a guard.
    Try,
}

/// A timeout that cancels part of a call at a random point: 0-60 ms,
/// about as long as an acquire's round trips and a short body.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// Around the acquire (of a `with_lock`: around the whole call, so it
    /// cuts the acquire or the body, whichever runs then).
    Acquire(Duration),
    /// Around the body (which ends early; its hold is given back as usual).
    Body(Duration),
}

/// How a guard's hold is given back.
#[derive(Clone, Copy, PartialEq, Eq)]
enum End {
    /// `release().await`.
    Release,
    /// The guard dropped (released in the background).
    Drop,
    /// `release()` cut by a timeout.
    CutRelease(Duration),
}

/// The random options of one call.
#[derive(Clone, Copy)]
struct Plan {
    api: Api,
    lease: Duration,
    renew: bool,
    /// `None`: `wait_forever()`, bounded by a tokio timeout of `bound`.
    wait: Option<Duration>,
    bound: Duration,
    on_lost: OnLost,
    /// Read, write or exclusive on a read-write key (reads as the key's
    /// share says); exclusive on another.
    mode: LockMode,
    cut: Option<Cut>,
    /// A guard's end (`Guard` and `Try` calls).
    end: End,
}

impl Plan {
    /// Random options; `sibling`: a `join!` arm, always a `with_lock` (a
    /// guard is not a call of its own: it belongs to the scope it is taken
    /// in, which both arms share, so two guards there re-enter each other);
    /// `readers`: the key's share of read holds, in %.
    fn random(rng: &mut Rng, nested: bool, sibling: bool, readers: u64) -> Plan {
        let api = match rng.below(100) {
            _ if sibling => Api::With,
            0..=19 => Api::Guard,
            20..=29 => Api::Try,
            _ => Api::With,
        };
        // A few distinct leases, so that waiters often ask for the holder's
        // lease and lock cohorting passes holds between tasks.
        const LEASES: [u64; 2] = [800, 3000];
        let lease = Duration::from_millis(LEASES[rng.below(2) as usize]);
        let renew = !rng.chance(20);
        let wait = match rng.below(100) {
            _ if api == Api::Try => Some(Duration::ZERO),
            0..=19 => Some(Duration::ZERO),
            20..=49 => Some(rng.millis(50, 300)),
            50..=79 => Some(rng.millis(1000, 3000)),
            _ => None,
        };
        let bound = if nested {
            rng.millis(1000, 3000)
        } else {
            rng.millis(2000, 5000)
        };
        let on_lost = if rng.chance(30) {
            OnLost::Continue
        } else {
            OnLost::Abort
        };
        // Writes ask `write` twice as often as `exclusive`: one lock.
        let pick = rng.below(100);
        let mode = if readers == 0 {
            LockMode::Exclusive
        } else if pick < readers {
            LockMode::Read
        } else if pick < readers + (100 - readers) * 2 / 3 {
            LockMode::Write
        } else {
            LockMode::Exclusive
        };
        // Two calls in five are cut short at a random point.
        let cut = match rng.below(100) {
            0..=19 => Some(Cut::Acquire(rng.millis(0, 60))),
            20..=39 => Some(Cut::Body(rng.millis(0, 60))),
            _ => None,
        };
        let end = match rng.below(100) {
            0..=44 => End::Drop,
            45..=54 => End::CutRelease(rng.millis(0, 60)),
            _ => End::Release,
        };
        Plan {
            api,
            lease,
            renew,
            wait,
            bound,
            on_lost,
            mode,
            cut,
            end,
        }
    }

    /// The timeout around the acquire (of a `with_lock`: the whole call):
    /// the bound of a wait forever, or a cut, whichever is shorter.
    fn acquire_limit(&self) -> Option<Duration> {
        let cut = match self.cut {
            Some(Cut::Acquire(d)) => Some(d),
            _ => None,
        };
        let bound = self.wait.is_none().then_some(self.bound);
        bound.into_iter().chain(cut).min()
    }

    /// The timeout around the body, if it is cut.
    fn body_limit(&self) -> Option<Duration> {
        match self.cut {
            Some(Cut::Body(d)) => Some(d),
            _ => None,
        }
    }

    fn describe(&self, fair: bool) -> String {
        let api = match self.api {
            Api::With => "with",
            Api::Guard => "guard",
            Api::Try => "try",
        };
        let cut = match self.cut {
            Some(Cut::Acquire(d)) => format!("acquire:{}", d.as_millis()),
            Some(Cut::Body(d)) => format!("body:{}", d.as_millis()),
            None => "-".to_owned(),
        };
        let end = match self.end {
            End::Release => "release".to_owned(),
            End::Drop => "drop".to_owned(),
            End::CutRelease(d) => format!("cut:{}", d.as_millis()),
        };
        format!(
            "api={api} wait={} bound={} lease={} renew={} fair={} lost={} mode={} cut={cut} \
             end={end}",
            self.wait
                .map_or("forever".to_owned(), |w| w.as_millis().to_string()),
            self.bound.as_millis(),
            self.lease.as_millis(),
            u8::from(self.renew),
            u8::from(fair),
            if self.on_lost == OnLost::Abort {
                "abort"
            } else {
                "continue"
            },
            mode_word(self.mode),
        )
    }
}

/// Runs `fut`, cut short after `limit` when there is one.
async fn within(limit: Option<Duration>, fut: impl Future<Output = ()>) {
    match limit {
        Some(limit) => {
            let _ = tokio::time::timeout(limit, fut).await;
        }
        None => fut.await,
    }
}

type Boxed = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// One locked call on `key` with random options, logged from `begin` to its
/// final event; nested calls inside its body when it is a `with_lock`.
fn call(cx: Cx, rng: Rng, key: usize, depth: u32) -> Boxed {
    call_as(cx, rng, key, depth, false)
}

/// [`call`], always a `with_lock` when `sibling` (a `join!` arm).
fn call_as(cx: Cx, mut rng: Rng, key: usize, depth: u32, sibling: bool) -> Boxed {
    Box::pin(async move {
        let ctx = cx.ctx.clone();
        let spec = &ctx.keys[key];
        let readers = match cx.burst {
            Some(share) if spec.readers > 0 => share,
            _ => spec.readers,
        };
        let mut plan = Plan::random(&mut rng, depth > 0, sibling, readers);
        if cx.burst.is_some() && plan.cut.is_none() {
            // A burst's calls are all cut short.
            plan.cut = Some(if rng.chance(50) {
                Cut::Acquire(rng.millis(0, 60))
            } else {
                Cut::Body(rng.millis(0, 60))
            });
        }
        let slot = (spec.permits > 0).then(|| permits::Slot::new(spec.permits, &mut rng));
        let id = ctx.next_call.fetch_add(1, Ordering::Relaxed);
        let rec = Arc::new(Rec::new(&cx, id, key, slot));
        let mut request = cx
            .runtime
            .lock(spec.name.as_str())
            .lease(plan.lease)
            .watchdog(plan.renew)
            .fair(spec.fair)
            .mode(plan.mode)
            .on_lost(plan.on_lost);
        request = match plan.wait {
            Some(wait) => request.wait(wait),
            None => request.wait_forever(),
        };
        request = permits::asking(request, spec);
        let permits = match spec.permits {
            0 => String::new(),
            n => format!(" permits={n}"),
        };
        rec.emit("begin", &format!("{}{permits}", plan.describe(spec.fair)));
        let polled = Arc::new(AtomicU64::new(0));
        let arm = if depth == 0 { cx.arm } else { None };
        match plan.api {
            Api::With => {
                let body = locked_body(
                    cx.clone(),
                    rng.fork(),
                    key,
                    depth,
                    (rec.clone(), polled.clone()),
                    &plan,
                );
                // The body's first poll runs inside the poll of `with_lock`
                // that acquired: it reads when that poll began.
                let locked = Stamped::new(with_lock(request, body), polled.clone()).armed(arm);
                let outcome = match plan.acquire_limit() {
                    Some(limit) => match tokio::time::timeout(limit, locked).await {
                        Ok(outcome) => outcome,
                        Err(_) => return, // `rec` logs `cancelled`
                    },
                    None => locked.await,
                };
                // (The release ran after the body's last step.)
                cx.passes.after(&cx.runtime, polled.load(Ordering::Relaxed));
                match outcome {
                    Ok(()) | Err(BodyError::User) => {}
                    Err(BodyError::Lock(LockError::Lost { .. })) => {
                        if *rec.phase.lock().unwrap() == Phase::Done {
                            rec.emit("late_lost", "");
                        } else {
                            rec.finish("lost", "");
                        }
                    }
                    Err(BodyError::Lock(e)) => finish_error(&rec, &e),
                }
            }
            Api::Guard | Api::Try => {
                guarded(cx, rng, (key, arm), (rec, polled), &plan, request).await;
            }
        }
    })
}

/// Logs the final event of a request that did not get the lock.
fn finish_error(rec: &Rec, error: &LockError) {
    if *rec.phase.lock().unwrap() == Phase::Done {
        rec.emit("late_error", &format!("what={}", one_word(error)));
        return;
    }
    match error {
        LockError::Timeout { waited, .. } => {
            rec.finish("timeout", &format!("waited={}", waited.as_millis()));
        }
        LockError::UpgradeRefused { .. } => rec.finish("error", "what=upgrade_refused"),
        LockError::OrderRefused { .. } => rec.finish("error", "what=order_refused"),
        LockError::ShutDown => rec.finish("error", "what=shut_down"),
        other => rec.finish("error", &format!("what={}", one_word(other))),
    }
}

/// An error as one token for the log.
fn one_word(error: &LockError) -> String {
    error
        .to_string()
        .chars()
        .map(|c| if c.is_whitespace() { '_' } else { c })
        .take(120)
        .collect()
}

/// Whether a hold with `fence` on `key` (on its permit, 0 for an ordinary
/// key) is not one of the enclosing holds.
fn outer(frames: &[Frame], (key, permit): (usize, u32), fence: u64) -> bool {
    !frames
        .iter()
        .any(|f| f.key == key && f.permit == permit && f.fence == fence)
}

/// The body of a `with_lock` call: logs the hold, runs random steps, logs
/// the release. With `OnLost::Continue` it watches a re-entered guard's
/// `lost()` beside the steps, since the library does not stop the body then.
fn locked_body(
    cx: Cx,
    mut rng: Rng,
    key: usize,
    depth: u32,
    (rec, polled): (Arc<Rec>, Arc<AtomicU64>),
    plan: &Plan,
) -> impl Future<Output = Result<(), BodyError>> + Send + 'static {
    let watch = plan.on_lost == OnLost::Continue;
    let fixed = (!plan.renew).then_some(plan.lease);
    let mode = plan.mode;
    let cut = plan.body_limit();
    let user_error = rng.chance(5);
    async move {
        let entered = polled.load(Ordering::Relaxed);
        let token = fence().expect("a locked body has a fence");
        rec.got_permit(&cx, key, permit(), None);
        let outer = rec.entered(&cx, key, token, entered, fixed);
        let data = Data::begin(&cx.ctx, key, rec.permit(), outer);
        let mut exit = BodyExit {
            rec: rec.clone(),
            done: false,
        };
        // (After `exit`: a body cut during it still logs its exit.)
        if outer && mode != LockMode::Read && rng.chance(50) {
            recorded(&cx, &rec, key, token).await;
        }
        let mut inner = cx.clone();
        inner.parent = rec.id;
        let frame = Frame {
            key,
            permit: rec.permit(),
            fence: token,
        };
        inner.frames.push(frame.clone());
        let probe = if watch {
            probe(&cx, &rec, frame, mode).await
        } else {
            None
        };
        let steps = within(cut, steps(inner, rng.fork(), key, depth));
        // Told the hold was lost (the probe found it so, or it came).
        let told = match &probe {
            Some(guard) => {
                let mut steps = std::pin::pin!(steps);
                // Until the steps end; the loss, if it comes, is reported
                // once and the steps go on (`OnLost::Continue`).
                let told = tokio::select! {
                    () = &mut steps => false,
                    () = guard.lost() => true,
                };
                if told {
                    rec.emit("lost", "");
                    steps.await;
                }
                told
            }
            None => {
                steps.await;
                watch
            }
        };
        drop(probe);
        if let (Some(data), false) = (data, told) {
            data.end(&cx, &rec, mode);
        }
        exit.done = true;
        drop(exit);
        rec.finish("released", "");
        cx.passes
            .before(&cx.runtime, polled.load(Ordering::Relaxed));
        if user_error {
            Err(BodyError::User)
        } else {
            Ok(())
        }
    }
}

/// With `OnLost::Continue`: a re-entry of the body's own hold, `frame`
/// (a permit call's: of its permit), whose `lost()` the body watches
/// beside its steps; `None`, logged `lost probe=1`, when the hold is lost
/// already (a lost hold is never re-entered; a fresh hold the probe took
/// is released).
async fn probe(cx: &Cx, rec: &Rec, frame: Frame, mode: LockMode) -> Option<LockGuard> {
    let spec = &cx.ctx.keys[frame.key];
    let request = cx
        .runtime
        .lock(spec.name.as_str())
        .fair(spec.fair)
        .mode(mode)
        .wait(Duration::ZERO);
    let probe = permits::asking(request, spec).acquire().await;
    match probe {
        Ok(guard)
            if guard.fence() == frame.fence && guard.permit().unwrap_or(0) == frame.permit =>
        {
            Some(guard)
        }
        _ => {
            rec.emit("lost", "probe=1");
            None
        }
    }
}

/// Random steps inside a locked body on `key`.
async fn steps(cx: Cx, mut rng: Rng, key: usize, depth: u32) {
    let n = rng.below(4);
    let keys = cx.ctx.keys.len();
    for _ in 0..n {
        let pick = rng.below(100);
        let nest = depth < MAX_DEPTH;
        match pick {
            0..=44 => hold(&mut rng).await,
            45..=59 if nest => {
                // Re-entry, sometimes cancelled part-way.
                let nested = call(cx.clone(), rng.fork(), key, depth + 1);
                if rng.chance(20) {
                    let budget = rng.millis(5, 500);
                    let _ = tokio::time::timeout(budget, nested).await;
                } else {
                    nested.await;
                }
            }
            60..=71 if nest => {
                // Siblings: they must take turns.
                let a = call_as(cx.clone(), rng.fork(), key, depth + 1, true);
                let b = call_as(cx.clone(), rng.fork(), key, depth + 1, true);
                tokio::join!(a, b);
            }
            72..=81 if nest && keys > 1 => {
                let other = (key + 1 + rng.below(keys as u64 - 1) as usize) % keys;
                call(cx.clone(), rng.fork(), other, depth + 1).await;
            }
            82..=83 => std::panic::panic_any(PANIC_PAYLOAD),
            _ => tokio::task::yield_now().await,
        }
    }
}

/// For a write (or exclusive) hold in its body: what the backend records of
/// its key (`inspect`), logged as `recorded mode=read|write|free
/// own=writer|reader|-`: whether the hold's token is the recorded writer's,
/// or one of the readers' (a write hold recorded as a read: readers of
/// other processes may enter beside it).
async fn recorded(cx: &Cx, rec: &Rec, key: usize, token: u64) {
    // (A permit call's record is its permit's lock's.)
    let name = permits::permit_key(&cx.ctx.keys[key].name, rec.permit());
    let asked = tokio::time::timeout(Duration::from_millis(500), cx.runtime.inspect(&name));
    let Ok(Ok(info)) = asked.await else { return };
    let (mode, own) = match info {
        None => ("free", "-"),
        Some(info) => {
            let read = info.mode == LockMode::Read;
            let as_reader = info.readers.iter().any(|r| r.fence == Some(token))
                || (read && info.fence == Some(token));
            let own = if as_reader {
                "reader"
            } else if !read && info.fence == Some(token) {
                "writer"
            } else {
                "-"
            };
            (if read { "read" } else { "write" }, own)
        }
    };
    rec.emit("recorded", &format!("mode={mode} own={own}"));
}

/// A short stretch of work inside a lock.
async fn hold(rng: &mut Rng) {
    let d = match rng.below(100) {
        0..=74 => rng.millis(0, 50),
        75..=91 => rng.millis(50, 500),
        _ => rng.millis(500, 2000),
    };
    tokio::time::sleep(d).await;
}

/// A guard call (`acquire()` or `try_acquire()`): acquire, work while
/// watching `lost()`, release or drop the guard; the acquire, the work and
/// the release as the plan cuts them.
async fn guarded(
    cx: Cx,
    mut rng: Rng,
    (key, arm): (usize, Option<Arm>),
    (rec, polled): (Arc<Rec>, Arc<AtomicU64>),
    plan: &Plan,
    request: lock_runtime::LockRequest,
) {
    let api = plan.api;
    let acquire = async move {
        match api {
            Api::Try => request.try_acquire().await,
            Api::Guard | Api::With => request.acquire().await.map(Some),
        }
    };
    let acquire = Stamped::new(acquire, polled.clone()).armed(arm);
    let outcome = match plan.acquire_limit() {
        Some(limit) => match tokio::time::timeout(limit, acquire).await {
            Ok(outcome) => outcome,
            Err(_) => return, // `rec` logs `cancelled`
        },
        None => acquire.await,
    };
    let guard = match outcome {
        Ok(Some(guard)) => guard,
        Ok(None) => return rec.finish("timeout", "waited=0 busy=1"),
        Err(e) => return finish_error(&rec, &e),
    };
    let polled = polled.load(Ordering::Relaxed);
    let token = guard.fence();
    rec.got_permit(&cx, key, guard.permit(), Some(guard.key()));
    let fixed = (!plan.renew).then_some(plan.lease);
    let outer = rec.entered(&cx, key, token, polled, fixed);
    let data = Data::begin(&cx.ctx, key, rec.permit(), outer);
    let mut exit = BodyExit {
        rec: rec.clone(),
        done: false,
    };
    // (After `exit`: a call cut during it still logs its body's exit.)
    if outer && plan.mode != LockMode::Read && rng.chance(50) {
        recorded(&cx, &rec, key, token).await;
    }
    let keep_going = plan.on_lost == OnLost::Continue;
    let rounds = 1 + rng.below(2);
    let mut told = false;
    let work = async {
        for _ in 0..rounds {
            let work = hold(&mut rng);
            tokio::pin!(work);
            tokio::select! {
                () = &mut work => {}
                () = guard.lost(), if !told => {
                    told = true;
                    rec.emit("lost", "");
                    if keep_going {
                        work.await;
                    } else {
                        break;
                    }
                }
            }
        }
    };
    within(plan.body_limit(), work).await;
    if let (Some(data), false) = (data, told) {
        data.end(&cx, &rec, plan.mode);
    }
    exit.done = true;
    drop(exit);
    cx.passes.before(&cx.runtime, 0);
    let cut = match plan.end {
        End::Drop => {
            rec.finish("released", "dropped=1");
            drop(guard);
            cx.passes.after(&cx.runtime, 0);
            return;
        }
        End::Release => None,
        End::CutRelease(limit) => Some(limit),
    };
    rec.finish("released", "");
    let mut release = std::pin::pin!(guard.release());
    let first = std::future::poll_fn(|task| Poll::Ready(release.as_mut().poll(task))).await;
    let released = match first {
        Poll::Ready(released) => {
            cx.passes.after(&cx.runtime, 0);
            released
        }
        Poll::Pending => match cut {
            Some(limit) => match tokio::time::timeout(limit, release).await {
                Ok(released) => released,
                Err(_) => return,
            },
            None => release.await,
        },
    };
    match released {
        Ok(()) => {}
        Err(LockError::Lost { .. } | LockError::NotHeld { .. }) => rec.emit("late_lost", ""),
        Err(e) => rec.emit("late_error", &format!("what={}", one_word(&e))),
    }
}

/// One task: top-level calls on random keys until `end`, each in its own
/// tokio task (a panic ends only that call), some cancelled at random.
async fn task(ctx: Arc<Ctx>, index: u32, mut rng: Rng, end: Instant) {
    let mut count = 0u64;
    // Bounded by time, and by count as a second guard.
    while Instant::now() < end && count < 1_000_000 {
        count += 1;
        let passes = Arc::new(Passes::default());
        let runtime = ctx.runtime_for_a_call(end).await;
        let cx = Cx::top_level(&ctx, runtime, index, passes.clone());
        let key = rng.below(ctx.keys.len() as u64) as usize;
        // One call in six takes two keys at once.
        let op = if many::ordinary_keys(&ctx).len() > 1 && rng.chance(17) {
            many::many_call(cx, rng.fork())
        } else {
            call(cx, rng.fork(), key, 0)
        };
        let budget = if rng.chance(25) {
            rng.millis(20, 2000)
        } else {
            OP_LIMIT
        };
        let by_select = rng.chance(50);
        let mut work = rng.fork();
        let handle = tokio::spawn(async move {
            if by_select {
                tokio::select! {
                    () = op => {}
                    () = tokio::time::sleep(budget) => {}
                }
            } else {
                let _ = tokio::time::timeout(budget, op).await;
            }
            // Now and then CPU-bound work right after the locked call, in
            // the same poll: when the call's release passed the hold to a
            // task of this process, that task is not polled before the work
            // is done (it was woken from this thread), the hold waiting for
            // it meanwhile.
            let passed = passes.passed.load(Ordering::Relaxed);
            if (passed && work.chance(30)) || work.below(1000) < 3 {
                let d = work.millis(100, 500);
                println!("blocking {} passed={}", now_ns(), u8::from(passed));
                block(0, d, work.chance(33));
            }
        });
        // A panic inside a body ends up here as a JoinError; its calls
        // logged `panicked` while unwinding.
        let _ = handle.await;
        if rng.chance(50) {
            tokio::time::sleep(rng.millis(0, 30)).await;
        }
    }
}

/// A stall the test ordered: block an executor thread for at most `max`,
/// sleeping or spinning.
struct Stall {
    id: u64,
    max: Duration,
    spin: bool,
}

/// The highest stall id the test ended with `unstall` (stall ids grow).
static UNSTALLED: AtomicU64 = AtomicU64::new(0);

/// A stall armed by the test (`arm`): a top-level call on `key`, made once
/// the key looks free, stalls right after its first poll, unless that poll
/// ended it.
#[derive(Clone, Copy)]
struct Arm {
    id: u64,
    max: Duration,
    key: usize,
}

/// How long an armed call waits for its key to look free (no holder, no
/// queue): an acquire sent then is likely answered with the lock.
const ARM_FREE_WAIT: Duration = Duration::from_secs(1);

/// A burst the test ordered: `tasks` more tasks of top-level calls on `key`
/// for `length`, every call cut short at a random point.
struct Burst {
    id: u64,
    tasks: u32,
    length: Duration,
    key: usize,
    /// The share of reads its calls ask on a read-write key, in %.
    readers: u64,
}

/// Runs the test's `burst` orders, one after the other: the burst's tasks
/// (numbered from `first_task`) make calls on its key, each cut by a 0-60
/// ms timeout around its acquire or its body, until the burst's end.
async fn burster(ctx: Arc<Ctx>, mut orders: Orders<Burst>, first_task: u32, mut rng: Rng) {
    // Until the run's end (bounded: each burst ends by itself).
    while let Some(burst) = orders.next().await {
        println!(
            "burst {} {} {} {}",
            burst.id,
            now_ns(),
            burst.key,
            burst.tasks
        );
        let end = (Instant::now() + burst.length).min(orders.end);
        let tasks: Vec<_> = (0..burst.tasks)
            .map(|i| {
                let (ctx, mut rng) = (ctx.clone(), rng.fork());
                tokio::spawn(async move {
                    // Bounded by `end`, and by count.
                    for _ in 0..100_000 {
                        if Instant::now() >= end {
                            break;
                        }
                        let runtime = ctx.runtime_for_a_call(end).await;
                        let passes = Arc::new(Passes::default());
                        let cx = Cx {
                            burst: Some(burst.readers),
                            ..Cx::top_level(&ctx, runtime, first_task + i, passes)
                        };
                        let call = call(cx, rng.fork(), burst.key, 0);
                        let _ = tokio::spawn(tokio::time::timeout(OP_LIMIT, call)).await;
                    }
                })
            })
            .collect();
        for task in tasks {
            let _ = task.await;
        }
    }
}

/// The test's orders of one kind (bursts, arms), taken until the run's
/// `end`.
struct Orders<T> {
    queue: tokio::sync::mpsc::UnboundedReceiver<T>,
    end: Instant,
}

impl<T> Orders<T> {
    /// The next order, until the run's end (`None` after it, also when
    /// orders are still queued: a backlog of bursts must not outlive the run).
    async fn next(&mut self) -> Option<T> {
        if Instant::now() >= self.end {
            return None;
        }
        tokio::time::timeout_at(self.end, self.queue.recv())
            .await
            .ok()
            .flatten()
    }
}

/// Runs the test's `arm` orders: for each, once its key looks free to
/// `inspect` (or after [`ARM_FREE_WAIT`]), one top-level call on it with
/// random options, as task `task`, armed to stall after its first poll.
async fn armer(ctx: Arc<Ctx>, mut orders: Orders<Arm>, task: u32, mut rng: Rng) {
    // Until the run's end (bounded: each call by `OP_LIMIT`).
    while let Some(arm) = orders.next().await {
        let runtime = ctx.runtime();
        let key = &ctx.keys[arm.key];
        let free_by = Instant::now() + ARM_FREE_WAIT;
        // Bounded by `free_by`, and by count.
        for _ in 0..1000 {
            let free = permits::looks_free(&runtime, key).await;
            if free || Instant::now() >= free_by || UNSTALLED.load(Ordering::Acquire) >= arm.id {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let cx = Cx {
            arm: Some(arm),
            ..Cx::top_level(&ctx, runtime, task, Arc::new(Passes::default()))
        };
        let call = call(cx, rng.fork(), arm.key, 0);
        // Its own tokio task, as every top-level call (a panic ends only
        // it), and bounded like them.
        let _ = tokio::spawn(tokio::time::timeout(OP_LIMIT, call)).await;
    }
}

/// Runs the test's stalls, one after the other, each inside a poll of this
/// task: the thread that polls it is blocked meanwhile, as by a service's
/// CPU-bound or blocking code (with a `current` executor, every task is).
async fn staller(mut orders: tokio::sync::mpsc::UnboundedReceiver<Stall>) {
    while let Some(stall) = orders.recv().await {
        block(stall.id, stall.max, stall.spin);
    }
}

/// Blocks this thread for at most `max` (stall `id` may end sooner, at its
/// `unstall`; stall 0 is the worker's own), sleeping or spinning; then
/// reports the stall.
fn block(id: u64, max: Duration, spin: bool) {
    let from = now_ns();
    let until = std::time::Instant::now() + max;
    // Bounded by `until`.
    while (id == 0 || UNSTALLED.load(Ordering::Acquire) < id) && std::time::Instant::now() < until {
        if spin {
            // Busy, but yielding the core: the machine is shared, and a
            // spinning thread that starves the others tests the scheduler.
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let to = now_ns();
    let how = if spin { "spin" } else { "sleep" };
    println!("stall {id} {from} {to} {how}");
}

/// Reads the test's orders from stdin (after `go`) until it closes, then
/// exits: the test is gone. Each kind goes to its own task.
fn read_orders(
    stalls: tokio::sync::mpsc::UnboundedSender<Stall>,
    arms: tokio::sync::mpsc::UnboundedSender<Arm>,
    bursts: tokio::sync::mpsc::UnboundedSender<Burst>,
    shutdowns: tokio::sync::mpsc::UnboundedSender<u64>,
) -> ! {
    let mut line = String::new();
    loop {
        line.clear();
        match std::io::stdin().read_line(&mut line) {
            Ok(0) | Err(_) => std::process::exit(3),
            Ok(_) => {}
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["stall", id, ms, how] => {
                let stall = Stall {
                    id: id.parse().expect("stall id"),
                    max: Duration::from_millis(ms.parse().expect("stall ms")),
                    spin: *how == "spin",
                };
                let _ = stalls.send(stall);
            }
            ["unstall", id] => {
                UNSTALLED.fetch_max(id.parse().expect("stall id"), Ordering::AcqRel);
            }
            ["arm", id, ms, key] => {
                let arm = Arm {
                    id: id.parse().expect("stall id"),
                    max: Duration::from_millis(ms.parse().expect("stall ms")),
                    key: key.parse().expect("key index"),
                };
                let _ = arms.send(arm);
            }
            ["burst", id, tasks, ms, key, readers] => {
                let burst = Burst {
                    id: id.parse().expect("burst id"),
                    tasks: tasks.parse().expect("burst tasks"),
                    length: Duration::from_millis(ms.parse().expect("burst ms")),
                    key: key.parse().expect("key index"),
                    readers: readers.parse().expect("burst readers"),
                };
                let _ = bursts.send(burst);
            }
            ["shutdown", id] => {
                let _ = shutdowns.send(id.parse().expect("shutdown id"));
            }
            _ => panic!("unknown order {line:?}"),
        }
    }
}

/// How long the process may go without CPU before it says so.
const STARVED: Duration = Duration::from_millis(100);

/// Watches for stretches in which this process got no CPU (an overloaded
/// machine, or SIGSTOP): a thread that wakes every 10 ms prints `starved
/// <from> <to>` when it woke much later. Its code could not run meanwhile,
/// which the test's timing bounds take into account.
fn watch_starvation() {
    let mut last = now_ns();
    // Bounded by the process's life (it ends with `main`).
    loop {
        std::thread::sleep(Duration::from_millis(10));
        let now = now_ns();
        if now.saturating_sub(last) > STARVED.as_nanos() as u64 + 10_000_000 {
            println!("starved {last} {now}");
        }
        last = now;
    }
}

/// The lock runtime on `url`, built and pinged, and the process part of its
/// holder ids. A busy machine may keep a server from answering within the
/// short timeouts at start (a JVM ZooKeeper opens its first sessions
/// slowly): the start is tried again for up to [`START_LIMIT`] (the test's
/// faults begin once every worker is ready; a runtime built again after a
/// shutdown may meet one of them).
async fn start_runtime(url: &str, prefix: &str, timeout: Duration) -> (LockRuntime, String) {
    let mut last = None;
    let limit = Instant::now() + START_LIMIT;
    // Bounded by `limit`, and by count.
    for _attempt in 0..1000 {
        if Instant::now() >= limit {
            break;
        }
        let builder = match url.strip_prefix("etcd://") {
            // The default lease is the longest the calls ask for: the lease
            // the id probe's key is on then runs out as soon as theirs.
            Some(endpoints) => LockRuntime::builder()
                .etcd(endpoints.split(','))
                .default_lease(Duration::from_secs(3)),
            None => match url.strip_prefix("zookeeper://") {
                // The same default lease, so that the session the runtime
                // opens at start is the long locks' own.
                Some(connect) => LockRuntime::builder()
                    .zookeeper(connect)
                    .default_lease(Duration::from_secs(3)),
                None => LockRuntime::builder().redis(url),
            },
        };
        let built = builder
            .key_prefix(prefix)
            .connect_timeout(timeout)
            .response_timeout(timeout)
            // Lock cohorting with a budget longer than the bodies, so that
            // holds are passed between tasks often while the faults strike.
            .cohort(8, Duration::from_secs(2))
            .build()
            .await;
        let error = match built {
            Ok(runtime) => match holder_prefix(&runtime).await {
                Ok(id) => return (runtime, id),
                Err(error) => error,
            },
            Err(error) => error.to_string(),
        };
        last = Some(error);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("build the lock runtime and learn its holder ids through the proxy: {last:?}");
}

/// How long a lock runtime's start is tried.
const START_LIMIT: Duration = Duration::from_secs(30);

/// Runs the test's `shutdown` orders: `shutdown()` of the current runtime
/// while the tasks go on (their holds are told lost, their acquires fail),
/// reported with when it was called and returned, then a new runtime (its
/// holder ids announced) for the tasks' next calls.
async fn shutdowner(
    ctx: Arc<Ctx>,
    mut orders: tokio::sync::mpsc::UnboundedReceiver<u64>,
    (url, prefix, timeout): (String, String, Duration),
) {
    while let Some(id) = orders.recv().await {
        let old = ctx.runtime();
        let from = now_ns();
        let result = old.shutdown().await;
        let to = now_ns();
        let how = if result.is_ok() { "ok" } else { "err" };
        println!("shutdown {id} {from} {to} {how}");
        ctx.passed_before
            .fetch_add(old.stats().passed_locally, Ordering::Relaxed);
        let (runtime, holder) = start_runtime(&url, &prefix, timeout).await;
        ctx.runtime.send_replace(runtime);
        println!("runtime {holder}");
    }
}

/// The process part of this runtime's holder ids (`<process-uuid>:<n>`),
/// read back from a lock it takes for the purpose (after a ping through
/// the proxy).
async fn holder_prefix(runtime: &LockRuntime) -> Result<String, String> {
    const PROBE: &str = "nemesis-worker-id";
    runtime.ping().await.map_err(|e| format!("ping: {e}"))?;
    let guard = runtime
        .lock(PROBE)
        .fair(false)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .map_err(|e| format!("take the id probe lock: {e}"))?;
    let info = runtime
        .inspect(PROBE)
        .await
        .map_err(|e| format!("inspect the id probe lock: {e}"))?
        .ok_or("the id probe lock is not held")?;
    guard
        .release()
        .await
        .map_err(|e| format!("release the id probe lock: {e}"))?;
    let (id, _) = info.holder.rsplit_once(':').expect("holder id <uuid>:<n>");
    Ok(id.to_owned())
}

fn main() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if info.payload().downcast_ref::<&str>() != Some(&PANIC_PAYLOAD) {
            default_hook(info);
        }
    }));
    let args: Vec<String> = std::env::args().skip(1).collect();
    trace_to_file();
    let executor = match args.last().map(String::as_str) {
        Some("current") => tokio::runtime::Builder::new_current_thread(),
        Some("multi") => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(2);
            builder
        }
        other => panic!("the last argument is the executor, current or multi: {other:?}"),
    }
    .enable_all()
    .build()
    .expect("build the executor");
    executor.block_on(run(args));
}

/// With `LOCK_NEMESIS_TRACE=<dir>`, the lock runtime's debug events (and
/// its backends' clients') go to `<dir>/p<N>-<pid>.log`, stamped with
/// the same monotonic clock as the events the test reads, so a failed
/// run's violation can be read beside what each process's runtime did.
fn trace_to_file() {
    let Some(dir) = std::env::var_os("LOCK_NEMESIS_TRACE") else {
        return;
    };
    let process = std::env::var("LOCK_NEMESIS_PROCESS").unwrap_or_else(|_| "worker".to_owned());
    let name = format!("{process}-{}.log", std::process::id());
    let file = std::fs::File::create(std::path::Path::new(&dir).join(name))
        .expect("create the trace file in LOCK_NEMESIS_TRACE");
    tracing_subscriber::fmt()
        .with_writer(std::sync::Mutex::new(file))
        .with_max_level(tracing::Level::DEBUG)
        .with_timer(MonotonicTimer)
        .with_ansi(false)
        .init();
}

/// Trace timestamps on the clock of the event lines (CLOCK_MONOTONIC,
/// seconds).
struct MonotonicTimer;

impl tracing_subscriber::fmt::time::FormatTime for MonotonicTimer {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        let ns = now_ns();
        write!(
            w,
            "{}.{:06}",
            ns / 1_000_000_000,
            (ns % 1_000_000_000) / 1000
        )
    }
}

async fn run(args: Vec<String>) {
    let [url, prefix, seed, secs, tasks, timeout_ms, keys, data_dir, _executor] = args.as_slice()
    else {
        panic!(
            "usage: nemesis_worker <url> <prefix> <seed> <secs> <tasks> <timeout-ms> \
             <key:fair|plain|rw-plain|rw-fair|mix-plain|mix-fair|permits<N>-plain|\
             permits<N>-fair,...> <data-dir> <current|multi>"
        );
    };
    let seed: u64 = seed.parse().expect("seed");
    let secs: u64 = secs.parse().expect("secs");
    let tasks: u32 = tasks.parse().expect("tasks");
    let timeout = Duration::from_millis(timeout_ms.parse().expect("timeout-ms"));
    let data_dir = std::path::Path::new(data_dir);
    let keys: Vec<Key> = keys.split(',').map(|k| Key::parse(k, data_dir)).collect();
    let (runtime, id) = start_runtime(url, prefix, timeout).await;
    println!("ready {id}");

    // Wait for `go`; afterwards, take the test's orders, and exit as soon as
    // stdin closes (the test died).
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let (stall_tx, stall_rx) = tokio::sync::mpsc::unbounded_channel();
    let (arm_tx, arm_rx) = tokio::sync::mpsc::unbounded_channel();
    let (burst_tx, burst_rx) = tokio::sync::mpsc::unbounded_channel();
    let (shutdown_tx, shutdown_rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        let _ = go_tx.send(());
        read_orders(stall_tx, arm_tx, burst_tx, shutdown_tx)
    });
    let _ = go_rx.await;
    let stalls = tokio::spawn(staller(stall_rx));
    std::thread::spawn(watch_starvation);

    let ctx = Arc::new(Ctx {
        runtime: tokio::sync::watch::Sender::new(runtime),
        keys,
        next_call: AtomicU64::new(1),
        passed_before: AtomicU64::new(0),
    });
    let shutdowns = tokio::spawn(shutdowner(
        ctx.clone(),
        shutdown_rx,
        (url.clone(), prefix.clone(), timeout),
    ));
    let end = Instant::now() + Duration::from_secs(secs);
    let mut rng = Rng::new(seed);
    let handles: Vec<_> = (0..tasks)
        .map(|i| tokio::spawn(task(ctx.clone(), i, rng.fork(), end)))
        .collect();
    let arm_orders = Orders { queue: arm_rx, end };
    let burst_orders = Orders {
        queue: burst_rx,
        end,
    };
    let arms = tokio::spawn(armer(ctx.clone(), arm_orders, tasks, rng.fork()));
    let bursts = tokio::spawn(burster(ctx.clone(), burst_orders, tasks + 1, rng.fork()));
    for handle in handles.into_iter().chain([arms, bursts]) {
        handle.await.expect("a worker task failed outside a call");
    }
    // Stalls and shutdowns ordered after this are not run (the test orders
    // none so late).
    stalls.abort();
    shutdowns.abort();
    let runtime = ctx.runtime();
    let passed_before = ctx.passed_before.load(Ordering::Relaxed);
    drop(ctx);
    // Background releases and the watchdog settle (bounded; no event to
    // await for these counters).
    let settle = Instant::now();
    for _ in 0..300 {
        if settle.elapsed() >= Duration::from_secs(3) {
            break;
        }
        let stats = runtime.stats();
        if stats.held == 0 && stats.waiting_keys == 0 && stats.watchdog.tracked == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stats = runtime.stats();
    println!("cohort passed={}", passed_before + stats.passed_locally);
    println!(
        "stats held={} waiting={} tracked={}",
        stats.held, stats.waiting_keys, stats.watchdog.tracked
    );
    drop(runtime);
    println!("done {}", now_ns());
}
