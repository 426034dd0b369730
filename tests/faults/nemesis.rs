//! Nemesis: three processes take random locks through fault proxies while
//! the test breaks the network and the server at random, then a checker
//! reads every process's event log and tests the library's promises against
//! the merged history, Jepsen style.
//!
//! Each worker process (`nemesis_worker`) reaches Redis through its own
//! [`FaultProxy`], so a fault can hit one process's view of the network
//! (stall, slow, cut, refuse, cut at the next SUBSCRIBE or EVALSHA) or all of
//! them (SIGSTOP, restart empty, restart from an older snapshot). Everything
//! is chosen from one seed (`LOCK_NEMESIS_SEED`, else the clock; printed),
//! which replays the same choices — though not the same timing — and every
//! event of every process carries `CLOCK_MONOTONIC`, the clock this process
//! stamps the faults with.
//!
//! What is checked, and the bounds (named constants below):
//! - exclusion: outermost holds of one key never overlap by more than
//!   [`SLACK`], unless a data-losing fault came between the two acquisitions;
//!   then the later fence must be larger and the earlier holder must be told
//!   (`lost`) or be done within [`stale_bound`] of the later acquisition;
//! - nesting: inside one task, bodies of one key that overlap are ancestor
//!   and descendant (sibling `join!` arms take turns), unless the earlier
//!   one's hold was reported lost before the later one got it;
//! - fencing: tokens of successive outermost holds of a key only grow;
//! - waiting: no bounded wait ends later than its deadline + [`LATE_SLACK`],
//!   and none times out on a key that was observably free for longer than
//!   [`FREE_BASE`] (+ the lease of its last holder when that hold did not
//!   end in a release) before its deadline (not checked near faults);
//! - leftovers: after the run no lock hash, queue or channel is left in
//!   Redis and every worker's runtime reports nothing held, waiting or
//!   tracked.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_testkit::{pipes, RedisServer};
use lock_tests::FaultProxy;
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, ChildStdin};
use tokio::time::Instant;

use crate::{channels, keys, serial, XorShift};

/// Worker processes, each behind its own proxy.
const PROCESSES: usize = 3;
/// Tasks per worker.
const TASKS: usize = 8;
/// The workers' connect and response timeouts.
const TIMEOUT: Duration = Duration::from_millis(400);
/// Longest lease a worker asks for, in ms (`nemesis_worker`'s `Plan::random`).
const MAX_LEASE_MS: u64 = 3000;
/// Scheduling slack for "before": a holder told `lost` at most this long
/// after the next holder's acquisition still counts as told first.
const SLACK: Duration = Duration::from_millis(5);
/// A bounded wait may end this long after its deadline: its last try may
/// take the try-once bound plus the response timeout.
const LATE_SLACK: Duration = Duration::from_millis(750);
/// A waiter may time out on a key that was free (no hold open in any
/// process) for at most this long before its deadline: a release message
/// wakes the waiters at once. When the last hold did not end in a release
/// (told lost, cancelled, panicked), its lease is added: its lock may still
/// be in Redis until it expires.
const FREE_BASE: Duration = Duration::from_secs(1);
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

/// `LOCK_NEMESIS_SECS`, else 22 s per mode (about 30 s with start-up and
/// the leftover check).
fn secs() -> u64 {
    std::env::var("LOCK_NEMESIS_SECS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(22)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Every key in plain mode.
    Plain,
    /// Keys in fair mode (a third key, when there is one, stays plain: the
    /// modes live side by side, one per key).
    Fair,
}

/// Plain mode: random faults, random calls, every promise checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nemesis_plain_mode_keeps_every_promise() {
    let _turn = serial().await;
    run(Mode::Plain).await;
}

/// Fair mode: the same, with the keys queued fairly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nemesis_fair_mode_keeps_every_promise() {
    let _turn = serial().await;
    run(Mode::Fair).await;
}

// ---------------------------------------------------------------------------
// The run: workers, proxies, faults.
// ---------------------------------------------------------------------------

/// One fault the test injected.
#[derive(Clone, Debug)]
struct Fault {
    start: u64,
    end: u64,
    what: String,
    /// Can lose lock data (restart empty, restart from a snapshot).
    loses_data: bool,
    /// The system may be unavailable until then.
    settled: u64,
    /// The proxy (so the process) a fault hits; `None`: the server.
    proxy: Option<usize>,
    /// A drop-at-command fault: armed at `start`; once it fired, its window
    /// is the firing (see `place_firings`).
    armed: bool,
    /// A fault (not a snapshot taken for a later restore).
    counted: bool,
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: tokio::task::JoinHandle<Vec<String>>,
    live: Arc<Live>,
}

/// A worker's log as it comes in: the outermost holds open right now, so
/// the nemesis can aim a fault at a process that holds a lock (a fault that
/// hits a process holding nothing tests little).
#[derive(Default)]
struct Live {
    holding: Mutex<HashSet<u64>>,
}

impl Live {
    fn see(&self, line: &str) {
        let words: Vec<&str> = line.split(' ').collect();
        let (Some(&"ev"), Some(call), Some(kind)) = (words.first(), words.get(3), words.get(6))
        else {
            return;
        };
        let Ok(call) = call.parse::<u64>() else {
            return;
        };
        let mut holding = self.holding.lock().expect("live holds");
        match *kind {
            "acquired" if words.contains(&"outer=1") => {
                holding.insert(call);
            }
            "released" | "lost" | "cancelled" | "panicked" | "body_exit" => {
                holding.remove(&call);
            }
            _ => {}
        }
    }

    fn holds(&self) -> bool {
        !self.holding.lock().expect("live holds").is_empty()
    }
}

async fn run(mode: Mode) {
    let seed = seed();
    let secs = secs();
    let mut rng = XorShift::new(splitmix(seed));
    let key_count = 1 + rng.below(3) as usize;
    let key_list: Vec<String> = (0..key_count)
        .map(|i| {
            let fair = mode == Mode::Fair && !(key_count == 3 && i == 2);
            format!("nk{i}:{}", if fair { "fair" } else { "plain" })
        })
        .collect();
    let prefix = lock_tests::unique("nemesis");
    let prefix = format!("{prefix}:");

    let mut server = RedisServer::start_with_snapshots();
    let port: u16 = server
        .url()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("server port");
    let mut proxies = Vec::new();
    for _ in 0..PROCESSES {
        proxies.push(FaultProxy::start(port).await);
    }
    let clock_base = (std::time::Instant::now(), now_ns());

    let mut workers = Vec::new();
    for (i, proxy) in proxies.iter().enumerate() {
        workers.push(
            spawn_worker(
                &proxy.url(),
                &prefix,
                seed.wrapping_add(i as u64),
                secs,
                &key_list.join(","),
            )
            .await,
        );
    }
    for worker in &mut workers {
        worker
            .stdin
            .write_all(b"go\n")
            .await
            .expect("start a worker");
        worker.stdin.flush().await.expect("start a worker");
    }
    let run_start = now_ns();

    let live: Vec<Arc<Live>> = workers.iter().map(|w| w.live.clone()).collect();
    let faults = drive_faults(&mut server, &proxies, &live, &mut rng, secs).await;

    // Heal everything (each fault heals itself; this is belt and braces).
    for proxy in &proxies {
        proxy.resume();
        proxy.slow(None);
        proxy.refuse(false);
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
        drop(worker.stdin);
        let lines = worker.lines.await.expect("worker output");
        let end = lines
            .iter()
            .rev()
            .find_map(|l| l.strip_prefix("done ").and_then(|t| t.parse().ok()))
            .unwrap_or(killed_at);
        ends.push(end);
        outputs.push(lines);
    }
    let mut faults = faults;
    for (i, proxy) in proxies.iter().enumerate() {
        let fired: Vec<u64> = proxy
            .dropped_at_command_times()
            .into_iter()
            .map(|t| clock_base.1 + ns(t.saturating_duration_since(clock_base.0)))
            .collect();
        place_firings(&mut faults, i, &fired);
    }
    drop(proxies);

    leftovers(&server, &prefix, &mut violations).await;

    let history = History::parse(&outputs, &ends, run_start, &mut violations);
    let coverage = check(&history, &faults, &mut violations);

    if let Ok(path) = std::env::var("LOCK_NEMESIS_DUMP") {
        dump(&history, &faults, &coverage, &format!("{path}.{mode:?}"));
    }
    let ops = history.calls.len();
    // The promises must hold with lock cohorting at work, not beside it.
    if history.passed_locally == 0 && !outputs.is_empty() {
        violations.push(Violation::plain(
            "no local handoffs",
            "no worker passed a hold between its tasks: cohorting went untested".to_owned(),
        ));
    }
    println!(
        "nemesis: seed {seed}, {ops} ops, {} faults, {} holds passed locally, {} violations",
        faults.iter().filter(|f| f.counted).count(),
        history.passed_locally,
        violations.len()
    );
    if !violations.is_empty() {
        faults.sort_by_key(|f| f.start);
        let header = format!(
            "nemesis ({mode:?} mode, keys {}) found {} violations; replay with \
             LOCK_NEMESIS_SEED={seed} (times below: seconds since the run began)",
            key_list.join(","),
            violations.len()
        );
        let report = report(&history, &faults, &violations, &header);
        panic!("{report}");
    }
}

async fn spawn_worker(url: &str, prefix: &str, seed: u64, secs: u64, keys: &str) -> Worker {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_nemesis_worker"));
    command.args([
        url,
        prefix,
        &seed.to_string(),
        &secs.to_string(),
        &TASKS.to_string(),
        &TIMEOUT.as_millis().to_string(),
        keys,
    ]);
    let (mut child, mut lines) = pipes::spawn(&mut command).expect("spawn nemesis_worker");
    let stdin = child.stdin.take().expect("worker stdin");
    let ready = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("a worker did not get ready within 20 s")
        .expect("read worker stdout");
    assert_eq!(ready.as_deref(), Some("ready"), "worker start-up");
    let live = Arc::new(Live::default());
    let seen = live.clone();
    let lines = tokio::spawn(async move {
        let mut all = Vec::new();
        while let Ok(Some(line)) = lines.next_line().await {
            seen.see(&line);
            all.push(line);
        }
        all
    });
    Worker {
        child,
        stdin,
        lines,
        live,
    }
}

fn millis(rng: &mut XorShift, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(lo + rng.below(hi - lo + 1))
}

/// Injects one fault at a time at random moments until 4 s before the end
/// of the run, each healed before the next, a proxy fault mostly at a
/// process that holds a lock at that moment; takes a snapshot every 2-4 s
/// for the restarts from a snapshot.
async fn drive_faults(
    server: &mut RedisServer,
    proxies: &[FaultProxy],
    live: &[Arc<Live>],
    rng: &mut XorShift,
    secs: u64,
) -> Vec<Fault> {
    // The longest fault lasts 3 s: all are over 1 s before the run ends.
    let stop_at = Instant::now() + Duration::from_secs(secs).saturating_sub(Duration::from_secs(4));
    let mut faults = Vec::new();
    let mut snapshot: Option<u64> = None;
    let mut next_snapshot = Instant::now() + millis(rng, 300, 1500);
    // Bounded by time (`stop_at`) and by count.
    for _ in 0..10_000 {
        let gap = millis(rng, 200, 1500);
        tokio::time::sleep_until((Instant::now() + gap).min(stop_at)).await;
        if Instant::now() >= stop_at {
            break;
        }
        if Instant::now() >= next_snapshot {
            // `SAVE` blocks the server while it writes (briefly: the data
            // directory is in memory); it gets a window like a fault's, but
            // is not counted as one.
            let start = now_ns();
            server.snapshot().await;
            let end = now_ns();
            snapshot = Some(start);
            next_snapshot = Instant::now() + millis(rng, 2000, 4000);
            faults.push(Fault {
                start,
                end,
                what: "snapshot (SAVE)".to_owned(),
                loses_data: false,
                settled: end + ns(RECOVERY),
                proxy: None,
                armed: false,
                counted: false,
            });
        }
        // Mostly at a process that holds a lock now.
        let holders: Vec<usize> = (0..PROCESSES).filter(|&i| live[i].holds()).collect();
        let p = if !holders.is_empty() && rng.below(100) < 70 {
            holders[rng.below(holders.len() as u64) as usize]
        } else {
            rng.below(PROCESSES as u64) as usize
        };
        let proxy = &proxies[p];
        let start = now_ns();
        let mut fault = Fault {
            start,
            end: start,
            what: String::new(),
            loses_data: false,
            settled: start,
            proxy: None,
            armed: false,
            counted: true,
        };
        let mut recovery = RECOVERY;
        let pick = rng.below(100);
        if pick < 70 {
            fault.proxy = Some(p);
        }
        match pick {
            0..=19 => {
                let d = millis(rng, 200, 3000);
                proxy.stall();
                tokio::time::sleep(d).await;
                proxy.resume();
                fault.what = format!("stall proxy {p} for {} ms", d.as_millis());
            }
            20..=31 => {
                let delay = millis(rng, 20, 250);
                let d = millis(rng, 500, 3000);
                proxy.slow(Some(delay));
                tokio::time::sleep(d).await;
                proxy.slow(None);
                fault.what = format!(
                    "slow proxy {p} by {} ms for {} ms",
                    delay.as_millis(),
                    d.as_millis()
                );
            }
            32..=43 => {
                proxy.drop_connections();
                fault.what = format!("drop connections of proxy {p}");
                recovery = LINGER_RECOVERY;
            }
            44..=57 => {
                let command = if rng.below(2) == 0 {
                    "SUBSCRIBE"
                } else {
                    "EVALSHA"
                };
                proxy.drop_at_command(command);
                fault.what = format!("drop proxy {p} at its next {command}");
                fault.armed = true;
                // No window until it fires (see `place_firings`).
                faults.push(fault);
                continue;
            }
            58..=69 => {
                let d = millis(rng, 300, 3000);
                proxy.refuse(true);
                let cut = rng.below(2) == 0;
                if cut {
                    proxy.drop_connections();
                    recovery = LINGER_RECOVERY;
                }
                tokio::time::sleep(d).await;
                proxy.refuse(false);
                fault.what = format!(
                    "refuse proxy {p} for {} ms{}",
                    d.as_millis(),
                    if cut { ", connections dropped" } else { "" }
                );
            }
            70..=81 => {
                let d = millis(rng, 200, 2000);
                server.freeze();
                tokio::time::sleep(d).await;
                server.thaw();
                fault.what = format!("SIGSTOP the server for {} ms", d.as_millis());
            }
            pick => {
                let old_enough = snapshot.filter(|&t| start.saturating_sub(t) >= 1_000_000_000);
                match old_enough {
                    Some(taken) if pick >= 90 => {
                        server.restart_from_snapshot().await;
                        fault.what = format!(
                            "restart the server from a snapshot taken {} ms before",
                            (start - taken) / 1_000_000
                        );
                        recovery = LINGER_RECOVERY;
                    }
                    _ => {
                        server.restart().await;
                        snapshot = None;
                        fault.what = "restart the server empty".to_owned();
                    }
                }
                fault.loses_data = true;
                next_snapshot = next_snapshot.min(Instant::now() + millis(rng, 500, 1500));
            }
        }
        fault.end = now_ns();
        fault.settled = fault.end + ns(recovery);
        faults.push(fault);
    }
    faults
}

/// Gives each armed drop-at-command fault of proxy `p` the moment it fired
/// (the latest arming before each firing).
fn place_firings(faults: &mut [Fault], p: usize, fired: &[u64]) {
    for &t in fired {
        if let Some(fault) = faults
            .iter_mut()
            .rev()
            .find(|f| f.armed && f.proxy == Some(p) && f.start <= t)
        {
            fault.what.push_str(" (fired)");
            fault.start = t;
            fault.end = t;
            fault.settled = t + ns(LINGER_RECOVERY);
        }
    }
}

/// Waits (bounded) until no lock hash, queue or subscribed channel of the
/// run is left in Redis; what is still there at the limit is a violation.
async fn leftovers(server: &RedisServer, prefix: &str, violations: &mut Vec<Violation>) {
    let mut con = server.connection().await;
    let limit = Instant::now() + LEFTOVER_LIMIT;
    // Bounded by `limit` (and a count): leases and queue places run out on
    // their own.
    for _ in 0..1000 {
        let left: Vec<String> = keys(&mut con, &format!("{prefix}*"))
            .await
            .into_iter()
            .filter(|k| k.ends_with('}') || k.ends_with(":queue") || k.ends_with(":queued"))
            .collect();
        let subscribed = channels(&mut con, &format!("{prefix}*")).await;
        if left.is_empty() && subscribed.is_empty() {
            return;
        }
        if Instant::now() >= limit {
            if !left.is_empty() {
                violations.push(Violation::plain(
                    "leftover keys",
                    format!(
                        "{left:?} still in Redis {} s after the workers exited",
                        LEFTOVER_LIMIT.as_secs()
                    ),
                ));
            }
            if !subscribed.is_empty() {
                violations.push(Violation::plain(
                    "leftover channels",
                    format!("{subscribed:?} still subscribed after the workers exited"),
                ));
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------
// The history: every call of every process, from the event logs.
// ---------------------------------------------------------------------------

/// One locked call, as its process logged it.
#[derive(Debug, Default)]
struct Call {
    proc: usize,
    task: u32,
    id: u64,
    parent: u64,
    key: usize,
    begin: u64,
    /// `None`: wait forever.
    wait: Option<Duration>,
    lease: Duration,
    renew: bool,
    acquired: Option<u64>,
    fence: u64,
    outer: bool,
    body_enter: Option<u64>,
    body_exit: Option<u64>,
    lost: Option<u64>,
    released: Option<u64>,
    /// The first of timeout, error, cancelled, panicked.
    ended: Option<(u64, String)>,
}

/// One event line, kept for the report.
struct Event {
    t: u64,
    key: usize,
    text: String,
}

struct History {
    /// Holds the workers passed between their tasks (lock cohorting).
    passed_locally: u64,
    calls: Vec<Call>,
    by_id: HashMap<(usize, u64), usize>,
    events: Vec<Event>,
    /// When each process ended (its `done`, or when it was killed).
    ends: Vec<u64>,
    /// When the run began (times in messages count from there).
    start: u64,
}

impl History {
    fn parse(
        outputs: &[Vec<String>],
        ends: &[u64],
        start: u64,
        violations: &mut Vec<Violation>,
    ) -> History {
        let mut history = History {
            passed_locally: 0,
            calls: Vec::new(),
            by_id: HashMap::new(),
            events: Vec::new(),
            ends: ends.to_vec(),
            start,
        };
        for (proc, lines) in outputs.iter().enumerate() {
            let mut stats_seen = false;
            for line in lines {
                if let Some(stats) = line.strip_prefix("stats ") {
                    stats_seen = true;
                    if stats != "held=0 waiting=0 tracked=0" {
                        violations.push(Violation::plain(
                            "stats not zero",
                            format!("worker {proc} ended with {stats}"),
                        ));
                    }
                    continue;
                }
                if line.starts_with("done ") {
                    continue;
                }
                if let Some(passed) = line.strip_prefix("cohort passed=") {
                    history.passed_locally += passed.parse::<u64>().unwrap_or(0);
                    continue;
                }
                let Some(rest) = line.strip_prefix("ev ") else {
                    violations.push(Violation::plain(
                        "worker output",
                        format!("worker {proc} printed {line:?}"),
                    ));
                    continue;
                };
                history.event(proc, rest);
            }
            if !stats_seen {
                violations.push(Violation::plain(
                    "stats not zero",
                    format!("worker {proc} never printed its stats"),
                ));
            }
        }
        history.events.sort_by_key(|e| e.t);
        history
    }

    fn event(&mut self, proc: usize, rest: &str) {
        let words: Vec<&str> = rest.split(' ').filter(|w| !w.is_empty()).collect();
        let [t, task, id, parent, key, kind, fields @ ..] = words.as_slice() else {
            panic!("bad event line {rest:?}");
        };
        let t: u64 = t.parse().expect("event time");
        let id: u64 = id.parse().expect("call id");
        let key: usize = key.parse().expect("key index");
        let field = |name: &str| -> Option<&str> {
            fields
                .iter()
                .find_map(|f| f.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
        };
        let index = *self.by_id.entry((proc, id)).or_insert_with(|| {
            self.calls.push(Call {
                proc,
                task: task.parse().expect("task"),
                id,
                parent: parent.parse().expect("parent"),
                key,
                ..Call::default()
            });
            self.calls.len() - 1
        });
        let call = &mut self.calls[index];
        match *kind {
            "begin" => {
                call.begin = t;
                call.wait = match field("wait") {
                    Some("forever") | None => None,
                    Some(ms) => Some(Duration::from_millis(ms.parse().expect("wait ms"))),
                };
                call.lease =
                    Duration::from_millis(field("lease").and_then(|v| v.parse().ok()).unwrap_or(0));
                call.renew = field("renew") == Some("1");
            }
            "acquired" => {
                call.acquired = Some(t);
                call.fence = field("fence").and_then(|v| v.parse().ok()).unwrap_or(0);
                call.outer = field("outer") == Some("1");
            }
            "body_enter" => call.body_enter = Some(t),
            "body_exit" => call.body_exit = Some(t),
            "lost" => {
                call.lost.get_or_insert(t);
            }
            "released" => {
                call.released.get_or_insert(t);
            }
            "timeout" | "error" | "cancelled" | "panicked" if call.ended.is_none() => {
                call.ended = Some((t, (*kind).to_owned()));
            }
            _ => {} // late_lost, late_error: for the report only
        }
        self.events.push(Event {
            t,
            key,
            text: format!("p{proc} t{task} c{id}<{parent} {kind} {}", fields.join(" ")),
        });
    }

    /// Seconds since the run began.
    fn secs(&self, t: u64) -> f64 {
        (t as i64 - self.start as i64) as f64 / 1e9
    }

    fn parent_of(&self, call: &Call) -> Option<&Call> {
        if call.parent == 0 {
            return None;
        }
        self.by_id
            .get(&(call.proc, call.parent))
            .map(|&i| &self.calls[i])
    }

    /// Whether `a` is an ancestor of `b` (same process, up b's parents).
    fn is_ancestor(&self, a: &Call, b: &Call) -> bool {
        let mut node = self.parent_of(b);
        // Bounded by the nesting depth; the count guards against a cycle.
        for _ in 0..64 {
            match node {
                Some(n) if n.id == a.id => return true,
                Some(n) => node = self.parent_of(n),
                None => return false,
            }
        }
        false
    }

    /// The end of a call's hold: its first of released, lost, body exit,
    /// timeout/error/cancelled/panicked after the acquisition, else the end
    /// of its process.
    fn hold_end(&self, call: &Call) -> u64 {
        let acquired = call.acquired.unwrap_or(call.begin);
        [
            call.released,
            call.lost,
            call.body_exit,
            call.ended.as_ref().map(|e| e.0),
        ]
        .into_iter()
        .flatten()
        .filter(|&t| t >= acquired)
        .min()
        .unwrap_or(self.ends[call.proc])
    }

    /// When the holder learnt that this call's hold was lost: its own `lost`
    /// or that of an enclosing call whose hold it re-entered.
    fn told_lost(&self, call: &Call) -> Option<u64> {
        let mut told = call.lost;
        let mut node = self.parent_of(call);
        for _ in 0..64 {
            let Some(n) = node else { break };
            if n.key == call.key && n.fence == call.fence {
                told = match (told, n.lost) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            node = self.parent_of(n);
        }
        told
    }
}

// ---------------------------------------------------------------------------
// The checker.
// ---------------------------------------------------------------------------

struct Violation {
    class: &'static str,
    detail: String,
    /// The key and moment to show the history around.
    at: Option<(usize, u64)>,
}

impl Violation {
    fn plain(class: &'static str, detail: String) -> Violation {
        Violation {
            class,
            detail,
            at: None,
        }
    }
}

/// Until when a holder whose lock data was lost (restart) may go on after
/// the next holder acquired: one renewal period plus the response timeout
/// plus [`SLACK`] for a renewed lease; a fixed lease is lost when it runs
/// out (counted from its acquisition, which is later than the library
/// counts from: its request's send time).
///
/// A renewal needs the server: when another fault kept the holder from it
/// in that time (the server frozen or restarted again, the holder's own
/// proxy stalled, slowed, cut or refusing), nothing can tell the holder
/// before its lease runs out, so then the bound is its lease end (the
/// README's "lost at the client-side lease end").
fn stale_bound(earlier: &Call, later_acquired: u64, faults: &[Fault]) -> u64 {
    let lease_end = earlier.acquired.unwrap_or(0) + ns(earlier.lease);
    if !earlier.renew {
        return later_acquired.max(lease_end) + ns(SLACK);
    }
    let renewal = later_acquired + ns(earlier.lease / 3 + TIMEOUT + SLACK);
    let cut_off = faults.iter().any(|f| {
        f.counted
            && f.start < renewal
            && f.end >= later_acquired
            && f.proxy.is_none_or(|p| p == earlier.proc)
            && !(f.loses_data && f.start < later_acquired)
    });
    if cut_off {
        renewal.max(lease_end + ns(SLACK))
    } else {
        renewal
    }
}

/// What the checks had to work with (written with `LOCK_NEMESIS_DUMP`): a
/// run whose faults never hit a holder proves little.
#[derive(Debug, Default)]
struct Coverage {
    outer_holds: u64,
    holds_told_lost: u64,
    overlaps_after_data_loss: u64,
    nested_bodies: u64,
    bounded_waits: u64,
    timeouts_on_a_free_key_near_faults: u64,
}

fn check(history: &History, faults: &[Fault], violations: &mut Vec<Violation>) -> Coverage {
    let mut coverage = Coverage::default();
    check_exclusion_and_fences(history, faults, violations, &mut coverage);
    check_nesting(history, violations, &mut coverage);
    check_waiters(history, faults, violations, &mut coverage);
    coverage
}

fn describe(history: &History, call: &Call) -> String {
    format!(
        "p{} t{} call {} (fence {}, lease {} ms{}, acquired at {:.3} s, hold until {:.3} s{})",
        call.proc,
        call.task,
        call.id,
        call.fence,
        call.lease.as_millis(),
        if call.renew { "" } else { " fixed" },
        history.secs(call.acquired.unwrap_or(0)),
        history.secs(history.hold_end(call)),
        if call.lost.is_some() {
            ", told lost"
        } else {
            ""
        }
    )
}

/// Outermost holds of each key, across processes: no overlap (beyond
/// [`SLACK`]) unless lock data was lost in between, and growing fences.
fn check_exclusion_and_fences(
    history: &History,
    faults: &[Fault],
    violations: &mut Vec<Violation>,
    coverage: &mut Coverage,
) {
    let mut by_key: HashMap<usize, Vec<&Call>> = HashMap::new();
    for call in &history.calls {
        if call.acquired.is_some() && call.outer {
            coverage.outer_holds += 1;
            coverage.holds_told_lost += u64::from(call.lost.is_some());
            by_key.entry(call.key).or_default().push(call);
        }
    }
    for (key, mut holds) in by_key {
        holds.sort_by_key(|c| (c.acquired, c.proc, c.id));
        let ends: Vec<u64> = holds.iter().map(|c| history.hold_end(c)).collect();
        for j in 0..holds.len() {
            let later = holds[j];
            let acquired = later.acquired.unwrap_or(0);
            if j > 0 && later.fence <= holds[j - 1].fence {
                violations.push(Violation {
                    class: "fence did not grow",
                    detail: format!(
                        "key {key}: {} came after {}",
                        describe(history, later),
                        describe(history, holds[j - 1])
                    ),
                    at: Some((key, acquired)),
                });
            }
            for i in 0..j {
                let earlier = holds[i];
                if ends[i] <= acquired + ns(SLACK) {
                    continue;
                }
                let data_lost = faults.iter().any(|f| {
                    f.loses_data && f.start < acquired && f.end > earlier.acquired.unwrap_or(0)
                });
                if data_lost {
                    coverage.overlaps_after_data_loss += 1;
                    if later.fence <= earlier.fence {
                        violations.push(Violation {
                            class: "fence not larger after data loss",
                            detail: format!(
                                "key {key}: {} overlaps {}",
                                describe(history, later),
                                describe(history, earlier)
                            ),
                            at: Some((key, acquired)),
                        });
                    }
                    let bound = stale_bound(earlier, acquired, faults);
                    if ends[i] > bound {
                        violations.push(Violation {
                            class: "stale holder not told after data loss",
                            detail: format!(
                                "key {key}: {} still held {} ms after {} acquired (bound {} ms)",
                                describe(history, earlier),
                                (ends[i] - acquired) / 1_000_000,
                                describe(history, later),
                                (bound - acquired) / 1_000_000
                            ),
                            at: Some((key, acquired)),
                        });
                    }
                    continue;
                }
                let class = if earlier.lost.is_some() {
                    "holder told lost too late"
                } else {
                    "two holders at once"
                };
                violations.push(Violation {
                    class,
                    detail: format!(
                        "key {key}: {} overlaps {} by {} ms",
                        describe(history, later),
                        describe(history, earlier),
                        (ends[i] - acquired) / 1_000_000
                    ),
                    at: Some((key, acquired)),
                });
            }
        }
    }
}

/// Inside one task (one tree of calls), bodies of one key that overlap are
/// ancestor and descendant: sibling `join!` arms take turns. Pairs of two
/// outermost holds are left to the exclusion check (tasks of one process
/// are checked there too, through their outermost holds).
fn check_nesting(history: &History, violations: &mut Vec<Violation>, coverage: &mut Coverage) {
    let mut groups: HashMap<(usize, u32, usize), Vec<&Call>> = HashMap::new();
    for call in &history.calls {
        if call.body_enter.is_some() {
            coverage.nested_bodies += u64::from(!call.outer);
            groups
                .entry((call.proc, call.task, call.key))
                .or_default()
                .push(call);
        }
    }
    for ((proc, _, key), mut bodies) in groups {
        bodies.sort_by_key(|c| (c.body_enter, c.id));
        let exit = |c: &Call| c.body_exit.unwrap_or(history.ends[proc]);
        for j in 0..bodies.len() {
            let b = bodies[j];
            let b_enter = b.body_enter.unwrap_or(0);
            for a in &bodies[..j] {
                if exit(a) <= b_enter || (a.outer && b.outer) {
                    continue;
                }
                if history.is_ancestor(a, b) || history.is_ancestor(b, a) {
                    continue;
                }
                let b_acquired = b.acquired.unwrap_or(b_enter);
                if history
                    .told_lost(a)
                    .is_some_and(|lost| lost <= b_acquired + ns(SLACK))
                {
                    continue;
                }
                violations.push(Violation {
                    class: "siblings inside at once",
                    detail: format!(
                        "key {key}: body of p{proc} call {} entered at {:.3} s while call {} \
                         (not its ancestor) was inside since {:.3} s, until {:.3} s",
                        b.id,
                        history.secs(b_enter),
                        a.id,
                        history.secs(a.body_enter.unwrap_or(0)),
                        history.secs(exit(a))
                    ),
                    at: Some((key, b_enter)),
                });
            }
        }
    }
}

/// Bounded waits end in time, and do not time out on a key that was free.
fn check_waiters(
    history: &History,
    faults: &[Fault],
    violations: &mut Vec<Violation>,
    coverage: &mut Coverage,
) {
    // Per key: (acquired, end, what may linger after the end: nothing after
    // a release, else the lease).
    let mut holds: HashMap<usize, Vec<(u64, u64, Duration)>> = HashMap::new();
    for call in &history.calls {
        if let (Some(acquired), true) = (call.acquired, call.outer) {
            let end = history.hold_end(call);
            let linger = if call.released == Some(end) {
                Duration::ZERO
            } else {
                call.lease
            };
            holds
                .entry(call.key)
                .or_default()
                .push((acquired, end, linger));
        }
    }
    for call in &history.calls {
        let Some(wait) = call.wait else { continue };
        let outcome = match (call.acquired, &call.ended) {
            (Some(t), _) => Some((t, "acquired")),
            (None, Some((t, kind))) if kind == "timeout" || kind == "error" => {
                Some((*t, kind.as_str()))
            }
            _ => None,
        };
        let Some((t, kind)) = outcome else { continue };
        coverage.bounded_waits += 1;
        let deadline = call.begin + ns(wait);
        if t > deadline + ns(LATE_SLACK) {
            violations.push(Violation {
                class: "waiter overslept",
                detail: format!(
                    "key {}: p{} call {} with wait {} ms ended ({kind}) {} ms after it began",
                    call.key,
                    call.proc,
                    call.id,
                    wait.as_millis(),
                    (t - call.begin) / 1_000_000
                ),
                at: Some((call.key, t)),
            });
        }
        if kind != "timeout" || wait.is_zero() {
            continue;
        }
        // Was the key observably free right before the timeout?
        let key_holds = holds.get(&call.key).map(Vec::as_slice).unwrap_or(&[]);
        let busy = key_holds.iter().any(|&(a, e, _)| a <= t && e >= t);
        if busy {
            continue;
        }
        let last = key_holds
            .iter()
            .filter(|&&(a, e, _)| a <= t && e <= t)
            .max_by_key(|&&(_, e, _)| e);
        let free_since = last.map_or(call.begin, |&(_, e, _)| e.max(call.begin));
        let bound = FREE_BASE + last.map_or(Duration::ZERO, |&(_, _, linger)| linger);
        if t - free_since <= ns(bound) {
            continue;
        }
        // Around faults the system may legitimately be unavailable (stalled,
        // frozen, restarting, reconnecting, or a snapshot's locks living
        // again), so a free key may not be reachable: no verdict there.
        if faults
            .iter()
            .any(|f| f.start <= t && f.settled >= free_since)
        {
            coverage.timeouts_on_a_free_key_near_faults += 1;
            continue;
        }
        violations.push(Violation {
            class: "timed out on a free key",
            detail: format!(
                "key {}: p{} call {} (wait {} ms) timed out at {:.3} s; the key was free since {:.3} s (bound {} ms)",
                call.key,
                call.proc,
                call.id,
                wait.as_millis(),
                history.secs(t),
                history.secs(free_since),
                bound.as_millis()
            ),
            at: Some((call.key, t)),
        });
    }
}

/// Writes the whole merged history and the faults to `path`
/// (`LOCK_NEMESIS_DUMP=<path>`: `<path>.Plain`, `<path>.Fair`), for study.
fn dump(history: &History, faults: &[Fault], coverage: &Coverage, path: &str) {
    let mut out = format!("{coverage:?}\n");
    for f in faults {
        let _ = writeln!(
            out,
            "{:>8.3} .. {:>8.3} fault: {}",
            history.secs(f.start),
            history.secs(f.end),
            f.what
        );
    }
    for e in &history.events {
        let _ = writeln!(out, "{:>8.3} k{} {}", history.secs(e.t), e.key, e.text);
    }
    std::fs::write(path, out).expect("write LOCK_NEMESIS_DUMP");
}

/// The failure message: seed, counts by class, the first violations of
/// each class, the faults, and the history of the key around the first
/// violation of each class.
fn report(history: &History, faults: &[Fault], violations: &[Violation], header: &str) -> String {
    let rel = |t: u64| history.secs(t);
    let mut out = String::new();
    let _ = writeln!(out, "{header}");
    let mut classes: Vec<(&str, usize)> = Vec::new();
    for v in violations {
        match classes.iter_mut().find(|(c, _)| *c == v.class) {
            Some((_, n)) => *n += 1,
            None => classes.push((v.class, 1)),
        }
    }
    let _ = writeln!(out, "by class: {classes:?}");
    for (class, _) in &classes {
        let of_class = violations.iter().filter(|v| v.class == *class);
        for v in of_class.take(PER_CLASS) {
            let _ = writeln!(out, "- {}: {}", v.class, v.detail);
        }
    }
    let _ = writeln!(out, "faults:");
    for f in faults {
        let _ = writeln!(
            out,
            "  {:>8.3} .. {:>8.3}  {}{}",
            rel(f.start),
            rel(f.end),
            f.what,
            if f.loses_data {
                " [loses lock data]"
            } else {
                ""
            }
        );
    }
    // The history around the first violation of each class.
    for (class, _) in &classes {
        let Some((key, at)) = violations
            .iter()
            .filter(|v| v.class == *class)
            .find_map(|v| v.at)
        else {
            continue;
        };
        let (from, to) = (at.saturating_sub(ns(WINDOW)), at + ns(WINDOW));
        let _ = writeln!(
            out,
            "history of key {key} from {:.3} to {:.3} s ({}):",
            rel(from),
            rel(to),
            class
        );
        for f in faults.iter().filter(|f| f.start <= to && f.settled >= from) {
            let _ = writeln!(out, "  {:>8.3} fault: {}", rel(f.start), f.what);
        }
        let events: Vec<&Event> = history
            .events
            .iter()
            .filter(|e| e.key == key && e.t >= from && e.t <= to)
            .collect();
        for e in events.iter().take(200) {
            let _ = writeln!(out, "  {:>8.3} {}", rel(e.t), e.text);
        }
        if events.len() > 200 {
            let _ = writeln!(out, "  ... {} more", events.len() - 200);
        }
    }
    out
}

// ---------------------------------------------------------------------------
// The checker on made-up histories: it must see what it claims to see.
// ---------------------------------------------------------------------------

/// An event line at `ms` milliseconds.
fn ev(ms: u64, task: u32, call: u64, parent: u64, kind: &str, fields: &str) -> String {
    format!(
        "ev {} {task} {call} {parent} 0 {kind} {fields}",
        ms * 1_000_000
    )
}

/// A renewed 3 s hold of key 0 by `call` from `from` to `to` ms, ended by `end`.
fn hold(call: u64, fence: u64, from: u64, to: u64, end: &str) -> Vec<String> {
    vec![
        ev(
            from.saturating_sub(1),
            0,
            call,
            0,
            "begin",
            "api=with wait=5000 bound=0 lease=3000 renew=1 fair=0 lost=abort",
        ),
        ev(
            from,
            0,
            call,
            0,
            "acquired",
            &format!("fence={fence} outer=1"),
        ),
        ev(from, 0, call, 0, "body_enter", ""),
        ev(to, 0, call, 0, end, ""),
    ]
}

/// The violation classes the checker finds in these per-process logs.
fn verdict(processes: Vec<Vec<String>>, faults: &[Fault]) -> Vec<&'static str> {
    let outputs: Vec<Vec<String>> = processes
        .into_iter()
        .map(|mut lines| {
            lines.push("stats held=0 waiting=0 tracked=0".to_owned());
            lines
        })
        .collect();
    let ends = vec![60_000_000_000; outputs.len()];
    let mut violations = Vec::new();
    let history = History::parse(&outputs, &ends, 0, &mut violations);
    let _ = check(&history, faults, &mut violations);
    let mut classes: Vec<&str> = violations.iter().map(|v| v.class).collect();
    classes.sort_unstable();
    classes
}

fn restart_at(ms: u64) -> Fault {
    Fault {
        start: ms * 1_000_000,
        end: ms * 1_000_000 + 1_000_000,
        what: "restart".to_owned(),
        loses_data: true,
        settled: ms * 1_000_000 + ns(RECOVERY),
        proxy: None,
        armed: false,
        counted: true,
    }
}

#[test]
fn checker_sees_two_holders_at_once() {
    let found = verdict(
        vec![
            hold(1, 10, 100, 300, "released"),
            hold(1, 11, 200, 400, "released"),
        ],
        &[],
    );
    assert_eq!(found, ["two holders at once"]);
}

#[test]
fn checker_accepts_a_holder_told_lost_before_the_next_one_acquires() {
    let told_in_time = verdict(
        vec![
            hold(1, 10, 100, 204, "lost"),
            hold(1, 11, 200, 400, "released"),
        ],
        &[],
    );
    assert!(told_in_time.is_empty(), "{told_in_time:?}");
    let told_late = verdict(
        vec![
            hold(1, 10, 100, 210, "lost"),
            hold(1, 11, 200, 400, "released"),
        ],
        &[],
    );
    assert_eq!(told_late, ["holder told lost too late"]);
}

#[test]
fn checker_excuses_data_loss_only_with_a_larger_fence_and_a_prompt_loss() {
    // Bound: lease / 3 + response timeout + slack = 1405 ms after 200 ms.
    let excused = verdict(
        vec![
            hold(1, 10, 100, 1600, "lost"),
            hold(1, 11, 200, 400, "released"),
        ],
        &[restart_at(150)],
    );
    assert!(excused.is_empty(), "{excused:?}");
    let stale = verdict(
        vec![
            hold(1, 10, 100, 1700, "lost"),
            hold(1, 11, 200, 400, "released"),
        ],
        &[restart_at(150)],
    );
    assert_eq!(stale, ["stale holder not told after data loss"]);
    // The server frozen before the holder's next renewal: only its lease
    // end (100 + 3000 ms) can tell it.
    let freeze = Fault {
        what: "freeze".to_owned(),
        loses_data: false,
        ..restart_at(1000)
    };
    let frozen = |told: u64| {
        verdict(
            vec![
                hold(1, 10, 100, told, "lost"),
                hold(1, 11, 200, 400, "released"),
            ],
            &[
                restart_at(150),
                Fault {
                    end: 2500 * 1_000_000,
                    ..freeze.clone()
                },
            ],
        )
    };
    assert!(frozen(3100).is_empty());
    assert_eq!(frozen(3200), ["stale holder not told after data loss"]);
    let reused = verdict(
        vec![
            hold(1, 10, 100, 1600, "lost"),
            hold(1, 9, 200, 400, "released"),
        ],
        &[restart_at(150)],
    );
    assert_eq!(
        reused,
        ["fence did not grow", "fence not larger after data loss"]
    );
}

#[test]
fn checker_sees_siblings_inside_at_once_but_not_a_nested_call() {
    let nested = |call: u64, from: u64, to: u64| {
        vec![
            ev(
                from,
                0,
                call,
                1,
                "begin",
                "api=with wait=5000 bound=0 lease=3000 renew=1 fair=0 lost=abort",
            ),
            ev(from, 0, call, 1, "acquired", "fence=10 outer=0"),
            ev(from, 0, call, 1, "body_enter", ""),
            ev(to, 0, call, 1, "body_exit", "how=done"),
            ev(to, 0, call, 1, "released", ""),
        ]
    };
    let mut turns = hold(1, 10, 100, 500, "released");
    turns.extend(nested(2, 200, 300));
    turns.extend(nested(3, 300, 350));
    assert!(verdict(vec![turns], &[]).is_empty());
    let mut together = hold(1, 10, 100, 500, "released");
    together.extend(nested(2, 200, 300));
    together.extend(nested(3, 250, 350));
    assert_eq!(verdict(vec![together], &[]), ["siblings inside at once"]);
}

#[test]
fn checker_sees_late_waiters_and_timeouts_on_a_free_key_away_from_faults() {
    let waiter = |wait: u64, timed_out: u64| {
        vec![
            ev(
                0,
                0,
                1,
                0,
                "begin",
                &format!("api=with wait={wait} bound=0 lease=3000 renew=1 fair=0 lost=abort"),
            ),
            ev(
                timed_out,
                0,
                1,
                0,
                "timeout",
                &format!("waited={timed_out}"),
            ),
        ]
    };
    // Deadline 200 ms + 750 ms of slack; free for under a second.
    assert!(verdict(vec![waiter(200, 950)], &[]).is_empty());
    assert_eq!(verdict(vec![waiter(200, 1000)], &[]), ["waiter overslept"]);
    assert_eq!(
        verdict(vec![waiter(3000, 3000)], &[]),
        ["timed out on a free key"]
    );
    assert!(verdict(vec![waiter(3000, 3000)], &[restart_at(1000)]).is_empty());
    // Held all along by another process: a fair timeout.
    assert!(verdict(
        vec![waiter(3000, 3000), hold(1, 10, 0, 3100, "released")],
        &[]
    )
    .is_empty());
}
