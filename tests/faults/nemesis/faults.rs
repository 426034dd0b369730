//! The faults: one at a time at random moments (network, server, worker
//! processes and their lock runtimes), each healed before the next; beside
//! them, at random, worker executors that stall.

use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{layout, LockRuntime};
use lock_testkit::{EtcdCluster, RedisServer, ZooKeeperEnsemble};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::members::{self, Cluster};
use super::permits::lock_keys;
use super::releases::ReleaseWatch;
use super::store::{Link, Store};
use super::workers::{Control, Executor};
use super::{now_ns, ns, Backend, MEMBERS, PROCESSES, RECOVERY};
use crate::XorShift;

/// Longest executor stall, in ms.
const MAX_STALL_MS: u64 = 1000;
/// A worker process is stopped (SIGSTOP) for this long at least and at most,
/// in ms: past the short lease (800 ms) and sometimes past the long one
/// (3000 ms).
const STOP_MS: (u64, u64) = (1000, 3500);
/// A worker stopped while a hold it passed waits for its new holder is
/// stopped past the long lease too, in ms: the hold is surely gone by the
/// time that holder runs.
const AIMED_STOP_MS: (u64, u64) = (3100, 3500);
/// On etcd a stopped holder's lock outlives its lease: its key goes when
/// its etcd lease runs out (`Backend::linger`: 2.5 s for the short lease,
/// 5.5 s for the long one, from the last keep-alive). A worker there is
/// stopped past the short one's mostly, and sometimes past the long one's,
/// in ms, so that others take its locks while it cannot run.
const ETCD_STOP_MS: (u64, u64) = (2000, 6000);
/// On ZooKeeper a stopped holder's nodes go when its session expires: a
/// little after its timeout, the lock's lease and a quarter
/// (`Backend::linger`: 1.5 s for the short lease, 4.25 s for the long one,
/// from the last ping). A worker there is stopped past the short one's
/// mostly, and sometimes past the long one's, in ms.
const ZOOKEEPER_STOP_MS: (u64, u64) = (1000, 5000);
/// A worker's network is stalled this long at least and at most, in ms: on
/// ZooKeeper up to past the long lease's session timeout, so that its
/// client finds its sessions expired when it reaches the servers again
/// (the short lease's expire within the shorter stalls everywhere).
const STALL_MS: (u64, u64) = (200, 3000);
const ZOOKEEPER_STALL_MS: (u64, u64) = (200, 5000);
/// How long a restart timed at a release waits for the release.
const RELEASE_WAIT: Duration = Duration::from_millis(700);
/// Longest stall of an executor right after its acquire went out: the
/// restart and another worker's entry on the new server fit in it.
const SEND_STALL_MAX: Duration = Duration::from_millis(2500);
/// How long an armed stall may take to fire (the worker's next top-level
/// call on its key).
const ARM_WAIT: Duration = Duration::from_millis(1500);
/// How long the servers are watched for the stalled worker's hold, from
/// the stall's start (its acquire's answer; a fair waiter's queued place
/// may be handed the lock meanwhile): an acquire on etcd or ZooKeeper takes
/// a few round trips more than Redis's one script.
const ANSWER_WAIT: Duration = Duration::from_millis(150);
const CLUSTER_ANSWER_WAIT: Duration = Duration::from_millis(600);
/// How long another worker is given to take the key after that restart.
const TAKE_WAIT: Duration = Duration::from_millis(1200);
/// How long a worker's `shutdown()` is waited for (it returns within twice
/// the response timeout, its drain limit).
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

/// One fault the test injected.
#[derive(Clone, Debug)]
pub(super) struct Fault {
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) what: String,
    /// Can lose lock data (restart empty, restart from a snapshot).
    pub(super) loses_data: bool,
    /// The system may be unavailable until then.
    pub(super) settled: u64,
    /// The proxy (so the process) a fault hits; `None`: the server.
    pub(super) proxy: Option<usize>,
    /// A drop-at-command fault: armed at `start`; once it fired, its window
    /// is the firing (see `place_firings`).
    pub(super) armed: bool,
    /// A fault (not a snapshot taken for a later restore).
    pub(super) counted: bool,
    /// The process (`proxy`) could not run its code from `start` to `end`:
    /// it was stopped, or its executor (one thread of it, for a `Multi`
    /// executor) was blocked. It acts on what it missed only afterwards.
    pub(super) frozen: bool,
}

impl Fault {
    /// A fault starting now, with no window yet.
    fn starting() -> Fault {
        let start = now_ns();
        Fault {
            start,
            end: start,
            what: String::new(),
            loses_data: false,
            settled: start,
            proxy: None,
            armed: false,
            counted: true,
            frozen: false,
        }
    }

    /// A stall worker `p` reported (`stall <n> <from> <to> <how>`).
    pub(super) fn stall(p: usize, executor: Executor, line: &str) -> Option<Fault> {
        let words: Vec<&str> = line.split(' ').collect();
        let ["stall", n, from, to, how] = words.as_slice() else {
            return None;
        };
        let (from, to): (u64, u64) = (from.parse().ok()?, to.parse().ok()?);
        let how = if *how == "spin" {
            "a busy loop"
        } else {
            "std::thread::sleep"
        };
        let blocked = match executor {
            Executor::Current => "executor (current_thread)",
            Executor::Multi => "executor (one of two threads)",
        };
        let by = if *n == "0" {
            "its own work after a locked call".to_owned()
        } else {
            format!("the test (stall {n})")
        };
        Some(Fault {
            start: from,
            end: to,
            what: format!(
                "p{p}'s {blocked} blocked by {by}, in {how}, for {} ms",
                (to.saturating_sub(from)) / 1_000_000
            ),
            loses_data: false,
            settled: to + ns(RECOVERY),
            proxy: Some(p),
            armed: false,
            // The worker's own stalls are its workload, not faults.
            counted: *n != "0",
            frozen: true,
        })
    }
}

impl Fault {
    /// A stretch in which worker `p` got no CPU (`starved <from> <to>`):
    /// the machine was overloaded (or the worker stopped).
    pub(super) fn starved(p: usize, line: &str) -> Option<Fault> {
        let words: Vec<&str> = line.split(' ').collect();
        let ["starved", from, to] = words.as_slice() else {
            return None;
        };
        let (from, to): (u64, u64) = (from.parse().ok()?, to.parse().ok()?);
        Some(Fault {
            start: from,
            end: to,
            what: format!(
                "p{p} got no CPU for {} ms (the machine is overloaded, or p{p} was stopped)",
                (to.saturating_sub(from)) / 1_000_000
            ),
            loses_data: false,
            settled: to + ns(RECOVERY),
            proxy: Some(p),
            armed: false,
            counted: false,
            frozen: true,
        })
    }
}

impl Fault {
    /// A shutdown of worker `p`'s lock runtime (`shutdown <n> <from> <to>
    /// ok|err`): it ends every hold of the process by `to` (the history
    /// knows); the system settles after it as after a cut (a release the
    /// shutdown could not confirm leaves its lock to its lease).
    pub(super) fn shutdown(p: usize, backend: Backend, line: &str) -> Option<Fault> {
        let words: Vec<&str> = line.split(' ').collect();
        let ["shutdown", n, from, to, how] = words.as_slice() else {
            return None;
        };
        let (from, to): (u64, u64) = (from.parse().ok()?, to.parse().ok()?);
        let confirmed = *how == "ok";
        let recovery = if confirmed {
            RECOVERY
        } else {
            backend.linger_recovery()
        };
        Some(Fault {
            start: from,
            end: to,
            what: format!(
                "shutdown() of p{p}'s lock runtime (order {n}), returned {} after {} ms; a new \
                 runtime built after it",
                if confirmed { "Ok" } else { "Err" },
                to.saturating_sub(from) / 1_000_000
            ),
            loses_data: false,
            settled: to + ns(recovery),
            proxy: Some(p),
            armed: false,
            counted: true,
            frozen: false,
        })
    }
}

pub(super) fn millis(rng: &mut XorShift, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(lo + rng.below(hi - lo + 1))
}

/// What the faults act on.
pub(super) struct Stage<'a> {
    pub(super) backend: Backend,
    pub(super) store: &'a mut Store,
    /// Each worker's network (its proxies).
    pub(super) links: &'a [Link],
    pub(super) workers: &'a [Arc<Control>],
    /// Notified at every line of every worker.
    pub(super) changed: &'a Notify,
    /// The runtimes' key prefix.
    pub(super) prefix: &'a str,
    /// How the restarts timed at a release went.
    pub(super) timed: TimedRestarts,
    /// Asks the servers who holds a key (`Store::inspector`).
    pub(super) inspector: Option<LockRuntime>,
}

/// Restarts timed at a release, counted (printed after the run: a run in
/// which none came to pass tested little of them).
#[derive(Debug, Default)]
pub(super) struct TimedRestarts {
    /// A worker waiting for a key another one held was blocked.
    pub(super) tries: u64,
    /// The key was released to it meanwhile, and the server restarted
    /// (etcd: the leader or the cluster killed, see [`kill_at_handoff`]).
    pub(super) restarts: u64,
    /// ... and another worker took the key on the new server before the
    /// blocked one ran again.
    pub(super) taken_meanwhile: u64,
    /// A `current_thread` worker was armed to stall right after an acquire
    /// went out ([`restart_after_send`]).
    pub(super) send_tries: u64,
    /// ... the stall came, and the servers recorded the stalled worker's
    /// hold of the key: the store restarted then.
    pub(super) send_restarts: u64,
    /// ... and another worker took the key on the new server before the
    /// stalled one ran again.
    pub(super) send_taken: u64,
}

/// The last snapshot taken, for the restarts from a snapshot.
struct Snapshots {
    taken: Option<u64>,
    next: Instant,
}

/// Injects one fault at a time at random moments until 5 s (etcd: 7.5 s)
/// before the end of the run, each healed before the next, a fault at one
/// process mostly at a process that holds a lock at that moment; on Redis,
/// takes a snapshot every 2-4 s for the restarts from a snapshot.
///
/// On etcd and ZooKeeper a network fault may also hit one process's way to
/// one member only. The server faults are the cluster's (see `members`): a
/// member frozen, a member (often the leader) killed and restarted from its
/// data directory, the whole cluster restarted from disk. None loses data
/// (both sync their log before they answer), so none excuses an overlap.
/// Redis's restart empty or from an older snapshot has no counterpart there
/// (a wiped cluster starts its revisions or zxids, the tokens, again), nor
/// has the cut at a Redis command; the restart timed at a release becomes
/// the leader (or the cluster) killed at a handoff ([`kill_at_handoff`]).
///
/// On every store, two faults aim at the moments between an answer and its
/// use: a worker's lock runtime shut down while its tasks run (`shutdown()`
/// ends every hold of the process; a new runtime follows), and a restart
/// inside a stall that began right after an acquire went out
/// ([`restart_after_send`]).
pub(super) async fn drive_faults(
    stage: &mut Stage<'_>,
    rng: &mut XorShift,
    secs: u64,
) -> Vec<Fault> {
    // The longest fault (a stop) lasts 3.5 s (6 s on etcd, 5 s on
    // ZooKeeper): all are over 1 s before the run ends.
    let longest = stop_ms(stage.backend, true).1;
    let stop_at = Instant::now()
        + Duration::from_secs(secs).saturating_sub(Duration::from_millis(longest + 1500));
    let mut faults = Vec::new();
    let mut snapshots = Snapshots {
        taken: None,
        next: Instant::now() + millis(rng, 300, 1500),
    };
    let linger_recovery = stage.backend.linger_recovery();
    // Bounded by time (`stop_at`) and by count.
    for _ in 0..10_000 {
        let gap = millis(rng, 200, 1500);
        tokio::time::sleep_until((Instant::now() + gap).min(stop_at)).await;
        if Instant::now() >= stop_at {
            break;
        }
        if let Store::Redis(server) = &mut *stage.store {
            if Instant::now() >= snapshots.next {
                // `SAVE` blocks the server while it writes (briefly: the
                // data directory is in memory); it gets a window like a
                // fault's, but is not counted as one.
                let start = now_ns();
                server.snapshot().await;
                let end = now_ns();
                snapshots.taken = Some(start);
                snapshots.next = Instant::now() + millis(rng, 2000, 4000);
                faults.push(Fault {
                    start,
                    end,
                    what: "snapshot (SAVE)".to_owned(),
                    settled: end + ns(RECOVERY),
                    counted: false,
                    ..Fault::starting()
                });
            }
        }
        // Mostly at a process that holds a lock now.
        let holders: Vec<usize> = (0..PROCESSES)
            .filter(|&i| stage.workers[i].live.holds())
            .collect();
        let p = if !holders.is_empty() && rng.below(100) < 70 {
            holders[rng.below(holders.len() as u64) as usize]
        } else {
            rng.below(PROCESSES as u64) as usize
        };
        let link = &stage.links[p];
        let mut fault = Fault::starting();
        let mut recovery = RECOVERY;
        let pick = rng.below(100);
        let cluster = matches!(stage.store, Store::Cluster(_));
        if pick < 39 && !(cluster && (24..=31).contains(&pick)) {
            fault.proxy = Some(p);
        }
        let (stall_lo, stall_hi) = match stage.backend {
            Backend::ZooKeeper => ZOOKEEPER_STALL_MS,
            Backend::Redis | Backend::Etcd => STALL_MS,
        };
        match (pick, &mut *stage.store) {
            (0..=9, Store::Cluster(cluster)) if rng.below(2) == 0 => {
                // One process's way to one member only: its client's
                // requests, keep-alives and watches on that member hang
                // while the others answer.
                let member = rng.below(MEMBERS as u64) as usize;
                let d = millis(rng, stall_lo, stall_hi);
                link.stall_member(member, true);
                tokio::time::sleep(d).await;
                link.stall_member(member, false);
                fault.what = format!(
                    "stall proxy {p} to {} only for {} ms",
                    cluster.named(member, None),
                    d.as_millis()
                );
            }
            (0..=9, _) => {
                let d = millis(rng, stall_lo, stall_hi);
                link.stall();
                tokio::time::sleep(d).await;
                link.resume();
                fault.what = format!("stall proxy {p} for {} ms", d.as_millis());
            }
            (10..=16, _) => {
                let delay = millis(rng, 20, 250);
                let d = millis(rng, 500, 3000);
                link.slow(Some(delay));
                tokio::time::sleep(d).await;
                link.slow(None);
                fault.what = format!(
                    "slow proxy {p} by {} ms for {} ms",
                    delay.as_millis(),
                    d.as_millis()
                );
            }
            (17..=23, _) => {
                link.drop_connections();
                fault.what = format!("drop connections of proxy {p}");
                recovery = linger_recovery;
            }
            (24..=31, Store::Cluster(cluster)) => {
                fault.what = members::kill_and_restart(cluster, rng).await;
                recovery = linger_recovery;
            }
            (24..=31, Store::Redis(_)) => {
                let command = if rng.below(2) == 0 {
                    "SUBSCRIBE"
                } else {
                    "EVALSHA"
                };
                link.drop_at_command(command);
                fault.what = format!("drop proxy {p} at its next {command}");
                fault.armed = true;
                // No window until it fires (see `place_firings`).
                faults.push(fault);
                continue;
            }
            (32..=38, _) => {
                let d = millis(rng, 300, 3000);
                link.refuse(true);
                let cut = rng.below(2) == 0;
                if cut {
                    link.drop_connections();
                    recovery = linger_recovery;
                }
                tokio::time::sleep(d).await;
                link.refuse(false);
                fault.what = format!(
                    "refuse proxy {p} for {} ms{}",
                    d.as_millis(),
                    if cut { ", connections dropped" } else { "" }
                );
            }
            (39..=45, Store::Cluster(cluster)) => {
                fault.what = members::freeze(cluster, rng).await;
            }
            (39..=45, Store::Redis(server)) => {
                let d = millis(rng, 200, 2000);
                server.freeze();
                tokio::time::sleep(d).await;
                server.thaw();
                fault.what = format!("SIGSTOP the server for {} ms", d.as_millis());
            }
            (46..=51, Store::Cluster(cluster)) => {
                fault.what = members::restart_all(cluster).await;
                recovery = linger_recovery;
            }
            (46..=51, Store::Redis(server)) => {
                let from_snapshot = rng.below(100) < 40;
                let (what, linger) = restart(server, &mut snapshots, from_snapshot).await;
                fault.what = what;
                fault.loses_data = true;
                if linger {
                    recovery = linger_recovery;
                }
                snapshots.next = snapshots.next.min(Instant::now() + millis(rng, 500, 1500));
            }
            (52..=59, _) => {
                // A whole worker process stopped past its lease: its locks
                // run out while it cannot renew them. Best while it is busy
                // right after its release passed a hold to another of its
                // tasks, which has not taken it yet (waiting for a worker to
                // be so, within a second and a half).
                let limit = Instant::now() + Duration::from_millis(1500);
                let workers = stage.workers;
                let busy = || workers.iter().position(|w| w.live.busy_after_a_pass());
                let p = if !stage.backend.passes_locally() {
                    // No holds are passed on a cluster: a worker that holds
                    // a lock right now, if one does, so that the others
                    // take it while it cannot run.
                    let holding: Vec<usize> = (0..PROCESSES)
                        .filter(|&i| workers[i].live.holds())
                        .collect();
                    match holding.len() {
                        0 => p,
                        n => holding[rng.below(n as u64) as usize],
                    }
                } else if until(stage.changed, limit, || busy().is_some()).await {
                    busy().unwrap_or(p)
                } else {
                    p
                };
                fault.start = now_ns();
                let worker = &stage.workers[p];
                let aimed = worker.live.busy_after_a_pass();
                let (lo, hi) = stop_ms(stage.backend, aimed);
                let d = millis(rng, lo, hi);
                worker.stop(true).await;
                tokio::time::sleep(d).await;
                worker.stop(false).await;
                fault.what = format!(
                    "SIGSTOP worker p{p} ({:?} executor{}) for {} ms",
                    worker.executor,
                    if aimed {
                        ", busy right after a local handoff"
                    } else {
                        ""
                    },
                    d.as_millis()
                );
                fault.proxy = Some(p);
                fault.frozen = true;
                recovery = linger_recovery;
            }
            (60..=64, _) => {
                // The worker's lock runtime shut down while its tasks go on;
                // the fault is the worker's report (`shutdown <n> <from>
                // <to>`), read after the run. Waited for (bounded), so that
                // the next fault comes after it.
                let worker = stage.workers[p].clone();
                let order = worker.shutdown().await;
                let live = worker.live.clone();
                let limit = Instant::now() + SHUTDOWN_WAIT;
                until(stage.changed, limit, || live.shut_down(order).is_some()).await;
                continue;
            }
            (65..=84, _) => {
                if let Some(restarted) = restart_after_send(stage, rng, &mut snapshots).await {
                    faults.push(restarted);
                }
                // Otherwise at most the stall happened (its worker reports it).
                continue;
            }
            (_, Store::Cluster(_)) => {
                if let Some(killed) = kill_at_handoff(stage, rng).await {
                    faults.push(killed);
                }
                // Otherwise only the stall happened (its worker reports it).
                continue;
            }
            (_, Store::Redis(_)) => {
                if let Some(restarted) = restart_at_release(stage, rng, &mut snapshots).await {
                    faults.push(restarted);
                    snapshots.next = snapshots.next.min(Instant::now() + millis(rng, 500, 1500));
                }
                // Otherwise only the stall happened (its worker reports it).
                continue;
            }
        }
        fault.end = now_ns();
        fault.settled = fault.end + ns(recovery);
        faults.push(fault);
    }
    faults
}

/// How long a worker is stopped on `backend`, in ms (`aimed`: it is busy
/// right after a local handoff).
fn stop_ms(backend: Backend, aimed: bool) -> (u64, u64) {
    match backend {
        Backend::Redis if aimed => AIMED_STOP_MS,
        Backend::Redis => STOP_MS,
        Backend::Etcd => ETCD_STOP_MS,
        Backend::ZooKeeper => ZOOKEEPER_STOP_MS,
    }
}

/// Blocks the executor of a worker picked by `choice` for 50 ms to a
/// second, at random.
async fn stall_at_random(workers: &[Arc<Control>], rng: &mut XorShift, choice: u64) {
    let spin = rng.below(3) == 0;
    let p = (choice % PROCESSES as u64) as usize;
    workers[p].stall(millis(rng, 50, MAX_STALL_MS), spin).await;
}
/// Kills the server and starts it again, from the last snapshot when
/// `from_snapshot` and one at least a second old exists, else empty: what
/// was done, and whether locks of the snapshot may live again.
async fn restart(
    server: &mut RedisServer,
    snapshots: &mut Snapshots,
    from_snapshot: bool,
) -> (String, bool) {
    let start = now_ns();
    let old_enough = snapshots
        .taken
        .filter(|&t| start.saturating_sub(t) >= 1_000_000_000);
    match old_enough {
        Some(taken) if from_snapshot => {
            server.restart_from_snapshot().await;
            let what = format!(
                "restart the server from a snapshot taken {} ms before",
                (start - taken) / 1_000_000
            );
            (what, true)
        }
        _ => {
            server.restart().await;
            snapshots.taken = None;
            ("restart the server empty".to_owned(), false)
        }
    }
}

/// A restart timed to land between a release and the next holder's entry:
/// a worker waiting for a key that another one holds has its executor
/// blocked; when the key is released to it (a fair handoff to its place, or
/// in plain mode the "free" message its waiters race on), the server
/// restarts (empty or from a snapshot); once another worker has taken the
/// key on the new server, or the stall's longest time is up, the blocked
/// executor runs again and finds the release it was told of before the
/// restart. The restart, if it came to that (the stall is reported by its
/// worker).
async fn restart_at_release(
    stage: &mut Stage<'_>,
    rng: &mut XorShift,
    snapshots: &mut Snapshots,
) -> Option<Fault> {
    let spin = rng.below(3) == 0;
    let from_snapshot = rng.below(100) < 30;
    let pause = millis(rng, 0, 10);
    let choice = rng.next_u64();
    let candidates = waiting_for_held(stage).await;
    if candidates.is_empty() {
        // Nobody waits for a held key: an executor stall at random then.
        let p = (choice % PROCESSES as u64) as usize;
        stage.workers[p]
            .stall(millis(rng, 50, MAX_STALL_MS), spin)
            .await;
        return None;
    }
    // The key's next holder, if the one to block is the head of the key's
    // queue in Redis (fair mode): the next release goes to it. Else a
    // `current_thread` executor (one blocked poll stops all its tasks).
    let mut heads = Vec::new();
    for &(p, key) in &candidates {
        if queue_head(stage, key)
            .await
            .is_some_and(|h| h.starts_with(&format!("{}:", stage.workers[p].id())))
        {
            heads.push((p, key));
        }
    }
    let current = on_current_thread(stage.workers, &candidates);
    let pool = [heads, current, candidates]
        .into_iter()
        .find(|pool| !pool.is_empty())
        .unwrap_or_default();
    let (p, key) = pool[(choice % pool.len() as u64) as usize];
    stage.timed.tries += 1;
    let worker = stage.workers[p].clone();
    let fair = worker.fair[key];
    let channel = layout::release_channel(&layout::lock_name(stage.prefix, &format!("nk{key}")));
    let watch = ReleaseWatch::start(stage.store.redis().port(), channel).await;
    let stall = worker
        .stall(Duration::from_millis(MAX_STALL_MS), spin)
        .await;
    let stalled_at = Instant::now();
    let handed = format!("g {}:", worker.id());
    let released = match watch {
        Some(mut watch) => {
            watch
                .next(stalled_at + RELEASE_WAIT, |m| {
                    if fair {
                        m.starts_with(&handed)
                    } else {
                        m == "1"
                    }
                })
                .await
        }
        None => None,
    };
    let mut fault = None;
    if released.is_some() {
        // Time for the message to reach the blocked worker's lock runtime
        // (its own thread, not blocked), which records it.
        tokio::time::sleep(pause).await;
        let mut restarted = Fault::starting();
        let (what, linger) = restart(stage.store.redis(), snapshots, from_snapshot).await;
        restarted.end = now_ns();
        let recovery = if linger {
            stage.backend.linger_recovery()
        } else {
            RECOVERY
        };
        restarted.settled = restarted.end + ns(recovery);
        restarted.loses_data = true;
        // Another worker takes the key on the new server before the blocked
        // one runs again.
        let limit = stalled_at + Duration::from_millis(MAX_STALL_MS);
        let taken = taken_by_another(stage, p, key, restarted.end, limit).await;
        stage.timed.restarts += 1;
        stage.timed.taken_meanwhile += u64::from(taken);
        restarted.what = format!(
            "{what}, {} ms after nk{key} was {} while p{p}'s executor was blocked (stall {stall}){}",
            pause.as_millis(),
            if fair {
                format!("handed to p{p}'s place")
            } else {
                "released (free)".to_owned()
            },
            if taken {
                "; another worker took the key on the new server before the stall ended"
            } else {
                ""
            }
        );
        fault = Some(restarted);
    }
    unstall_and_hear(stage, &worker, stall).await;
    fault
}

/// A stale answer: a `current_thread` worker's executor is blocked right
/// after the first poll of a call whose acquire went out (its script is
/// answered on the worker's lock runtime thread, which runs on), the store
/// restarts inside that stall (Redis empty; an etcd cluster or a ZooKeeper
/// ensemble, which lose nothing, has its leader or every member killed and
/// started again from disk), another worker takes the key on the new
/// server, and only then does the blocked executor run again and find the
/// answer from before the restart. The restart, if the stall came (the
/// stall is reported by its worker).
async fn restart_after_send(
    stage: &mut Stage<'_>,
    rng: &mut XorShift,
    snapshots: &mut Snapshots,
) -> Option<Fault> {
    let pause = millis(rng, 0, 20);
    let whole = rng.below(100) < 30;
    let away = millis(rng, 50, 400);
    let choice = rng.next_u64();
    // Every run has a `current_thread` worker (`executors`).
    let current: Vec<usize> = (0..stage.workers.len())
        .filter(|&p| stage.workers[p].executor == Executor::Current)
        .collect();
    let p = *current.get((choice % current.len().max(1) as u64) as usize)?;
    let worker = stage.workers[p].clone();
    // A key nobody holds or waits for now, if there is one: its acquire is
    // then likely answered with the lock.
    let keys = worker.fair.len();
    let free: Vec<usize> = (0..keys)
        .filter(|&k| {
            !stage
                .workers
                .iter()
                .any(|w| w.live.holds_key(k) || w.live.waits_for().contains(&k))
        })
        .collect();
    let pool: Vec<usize> = if free.is_empty() {
        (0..keys).collect()
    } else {
        free
    };
    let key = pool[((choice >> 16) % pool.len() as u64) as usize];
    stage.timed.send_tries += 1;
    let inspector = stage.inspector.clone()?;
    let stall = worker.arm(SEND_STALL_MAX, key).await;
    let live = worker.live.clone();
    let began = until(stage.changed, Instant::now() + ARM_WAIT, || {
        live.stalled_after_send(stall)
    })
    .await;
    if !began {
        // (Drops the arm; a stall that fired meanwhile ends at once.)
        worker.unstall(stall).await;
        return None;
    }
    let stalled_at = Instant::now();
    // The restart comes once the servers record the stalled worker's hold
    // (its acquire was answered with the lock), and a moment more for the
    // answer to reach its lock runtime.
    let holder = format!("{}:", worker.id());
    let answer_wait = match stage.backend {
        Backend::Redis => ANSWER_WAIT,
        Backend::Etcd | Backend::ZooKeeper => CLUSTER_ANSWER_WAIT,
    };
    let locks = lock_keys(key, worker.permits[key]);
    if !holds(&inspector, &locks, &holder, stalled_at + answer_wait).await {
        unstall_and_hear(stage, &worker, stall).await;
        return None;
    }
    tokio::time::sleep(pause).await;
    let mut restarted = Fault::starting();
    let what = match &mut *stage.store {
        Store::Redis(server) => {
            restarted.loses_data = true;
            restart(server, snapshots, false).await.0
        }
        Store::Cluster(cluster) => members::kill_for(cluster, whole, away, || async {}).await,
    };
    restarted.end = now_ns();
    let recovery = match stage.backend {
        Backend::Redis => RECOVERY,
        Backend::Etcd | Backend::ZooKeeper => stage.backend.linger_recovery(),
    };
    restarted.settled = restarted.end + ns(recovery);
    // Another worker takes the key on the new server before the stalled one
    // runs again.
    let limit = (Instant::now() + TAKE_WAIT).min(stalled_at + SEND_STALL_MAX);
    let taken = taken_by_another(stage, p, key, restarted.end, limit).await;
    stage.timed.send_restarts += 1;
    stage.timed.send_taken += u64::from(taken);
    restarted.what = format!(
        "{what}, {} ms after p{p}'s executor (current_thread) was blocked right after its \
         acquire of nk{key} went out (stall {stall}){}",
        pause.as_millis(),
        if taken {
            "; another worker took the key on the new server before the stall ended"
        } else {
            ""
        }
    );
    unstall_and_hear(stage, &worker, stall).await;
    Some(restarted)
}

/// Ends `worker`'s stall `stall`, and waits (bounded: 3 s) for its report
/// of the stall, which comes once its executor runs again.
async fn unstall_and_hear(stage: &Stage<'_>, worker: &Control, stall: u64) {
    worker.unstall(stall).await;
    let live = &worker.live;
    until(
        stage.changed,
        Instant::now() + Duration::from_secs(3),
        || live.stalled(stall).is_some(),
    )
    .await;
}

/// Whether a worker other than `p` takes `nk<key>` after `end` (ns), by
/// `limit`.
async fn taken_by_another(
    stage: &Stage<'_>,
    p: usize,
    key: usize,
    end: u64,
    limit: Instant,
) -> bool {
    let others: Vec<&Arc<Control>> = stage.workers.iter().filter(|w| w.index != p).collect();
    until(stage.changed, limit, || {
        others.iter().any(|w| w.live.acquired_after(key, end))
    })
    .await
}

/// Whether the servers record a holder of one of `locks` (a key's lock,
/// or each permit's of a permit key: [`lock_keys`]; a writer or one of
/// the readers) whose id starts with `holder`, by `limit` (asked every few
/// ms).
async fn holds(inspector: &LockRuntime, locks: &[String], holder: &str, limit: Instant) -> bool {
    // Bounded by `limit`, and by count.
    for _ in 0..1000 {
        for name in locks {
            let left = limit.saturating_duration_since(Instant::now());
            if let Ok(Ok(Some(info))) = tokio::time::timeout(left, inspector.inspect(name)).await {
                if info.holder.starts_with(holder)
                    || info.readers.iter().any(|r| r.holder.starts_with(holder))
                {
                    return true;
                }
            }
        }
        if Instant::now() >= limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    false
}

/// The cluster's twin of [`restart_at_release`]: a worker waiting for a
/// key that another one holds has its executor blocked; once its place
/// heads the key's queue (the holder released: the lock is handed to the
/// place, which its lock runtime, on a thread of its own, hears of), the
/// leader is killed (or the whole cluster), the blocked executor runs again
/// while the store is away or electing, with news from before, and then the
/// member(s) start again from their data directories. The fault, if the
/// handoff came to pass (the stall is reported by its worker).
async fn kill_at_handoff(stage: &mut Stage<'_>, rng: &mut XorShift) -> Option<Fault> {
    let spin = rng.below(3) == 0;
    let whole = rng.below(100) < 30;
    let pause = millis(rng, 0, 10);
    let away = millis(rng, 50, 600);
    let choice = rng.next_u64();
    let candidates = waiting_for_held(stage).await;
    if candidates.is_empty() {
        stall_at_random(stage.workers, rng, choice).await;
        return None;
    }
    // A `current_thread` executor if one waits (a blocked poll stops all
    // its tasks, the waiter's too).
    let current = on_current_thread(stage.workers, &candidates);
    let pool = if current.is_empty() {
        candidates
    } else {
        current
    };
    let (p, key) = pool[(choice % pool.len() as u64) as usize];
    stage.timed.tries += 1;
    let worker = stage.workers[p].clone();
    let Store::Cluster(cluster) = &mut *stage.store else {
        panic!("a cluster fault on Redis");
    };
    let lock = format!("{}nk{key}", stage.prefix);
    // On etcd the watch is set up before the stall (it must see the
    // release's delete).
    let mut etcd_watch = match cluster {
        Cluster::Etcd(etcd) => Some(EtcdHandoff::start(etcd, &lock, &worker.id()).await?),
        Cluster::ZooKeeper(_) => None,
    };
    let stall = worker
        .stall(Duration::from_millis(MAX_STALL_MS), spin)
        .await;
    let handed_by = Instant::now() + RELEASE_WAIT;
    let handed = match (&mut etcd_watch, &*cluster) {
        (Some(watch), _) => watch.handed(handed_by).await,
        (None, Cluster::ZooKeeper(ensemble)) => {
            let released = || {
                !stage
                    .workers
                    .iter()
                    .any(|w| w.index != p && w.live.holds_key(key))
            };
            handed_on_zookeeper(ensemble, &lock, &worker.id(), handed_by, || {
                until(stage.changed, handed_by, released)
            })
            .await
        }
        (None, Cluster::Etcd(_)) => false,
    };
    drop(etcd_watch);
    let mut fault = None;
    if handed {
        tokio::time::sleep(pause).await;
        let mut killed = Fault::starting();
        let what = members::kill_for(cluster, whole, away, || worker.unstall(stall)).await;
        killed.end = now_ns();
        killed.settled = killed.end + ns(stage.backend.linger_recovery());
        stage.timed.restarts += 1;
        killed.what = format!(
            "{what}, {} ms after nk{key} was handed to p{p}'s place while p{p}'s executor was \
             blocked (stall {stall}), which ran again {} ms into the outage",
            pause.as_millis(),
            away.as_millis()
        );
        fault = Some(killed);
    }
    unstall_and_hear(stage, &worker, stall).await;
    fault
}

/// A watch on a lock's directory in etcd, straight to the cluster (not
/// through a worker's proxies), for [`kill_at_handoff`].
struct EtcdHandoff {
    client: etcd_client::Client,
    watch: etcd_client::WatchStream,
    dir: String,
    /// The start of the waiting worker's keys in the directory.
    ours: String,
}

impl EtcdHandoff {
    /// Watches `lock`'s directory, once the watch is set up (its first
    /// answer came); `None` when etcd does not answer.
    async fn start(cluster: &EtcdCluster, lock: &str, id: &str) -> Option<EtcdHandoff> {
        let dir = format!("{lock}/");
        let mut client = etcd_client::Client::connect(cluster.endpoints(), None)
            .await
            .ok()?;
        let mut watch = client
            .watch(
                dir.as_str(),
                Some(etcd_client::WatchOptions::new().with_prefix()),
            )
            .await
            .ok()?;
        tokio::time::timeout(Duration::from_secs(1), watch.message())
            .await
            .ok()?
            .ok()??;
        let ours = format!("{dir}{id}:");
        Some(EtcdHandoff {
            client,
            watch,
            dir,
            ours,
        })
    }

    /// Whether the waiting worker's place headed the directory after a
    /// delete in it, by `limit`.
    async fn handed(&mut self, limit: Instant) -> bool {
        // Bounded by `limit`: each delete in the directory, then whether
        // the blocked worker's place heads it now.
        tokio::time::timeout_at(limit, async {
            let first = etcd_client::GetOptions::new()
                .with_prefix()
                .with_sort(
                    etcd_client::SortTarget::Create,
                    etcd_client::SortOrder::Ascend,
                )
                .with_limit(1);
            loop {
                let answer = self.watch.message().await.ok()??;
                let deleted = answer
                    .events()
                    .iter()
                    .any(|e| e.event_type() == etcd_client::EventType::Delete);
                if !deleted {
                    continue;
                }
                let head = self
                    .client
                    .get(self.dir.as_str(), Some(first.clone()))
                    .await
                    .ok()?;
                if head
                    .kvs()
                    .first()
                    .is_some_and(|kv| kv.key().starts_with(self.ours.as_bytes()))
                {
                    return Some(());
                }
            }
        })
        .await
        .ok()
        .flatten()
        .is_some()
    }
}

/// Whether `lock` was handed to the node of the worker whose holder ids
/// start with `id` by `limit`: after each release (`released` resolves
/// true when no other worker holds the key, false at the limit), whether
/// its node heads the lock's contenders in the leader's view. The test
/// process has no ZooKeeper client to watch with: the leader's `dump` is
/// read again, 5 ms apart, while the release's delete is on its way.
async fn handed_on_zookeeper<F: std::future::Future<Output = bool>>(
    ensemble: &ZooKeeperEnsemble,
    lock: &str,
    id: &str,
    limit: Instant,
    released: impl Fn() -> F,
) -> bool {
    // A contender node is `_c_<uuid>-lock-<sequence>`, its uuid (hyphenated)
    // the process uuid of the holder id (`id`, simple) with the holder's
    // number in its low bits (`backend/zookeeper/path.rs`): its first four
    // groups are the process's.
    let hex: Vec<char> = id.chars().filter(char::is_ascii_hexdigit).collect();
    let group = |from: usize, to: usize| hex.get(from..to).unwrap_or_default().iter().collect();
    let groups: [String; 4] = [group(0, 8), group(8, 12), group(12, 16), group(16, 20)];
    let ours = format!("{lock}/_c_{}-", groups.join("-"));
    let sequence = |node: &String| node.rsplit("lock-").next().map(str::to_owned);
    // Bounded by `limit` and by count.
    for _ in 0..200 {
        if !released().await {
            return false;
        }
        let nodes = tokio::task::block_in_place(|| ensemble.ephemerals(&format!("{lock}/")));
        let head = nodes.ok().and_then(|n| n.into_iter().min_by_key(sequence));
        if head.is_some_and(|h| h.starts_with(&ours)) {
            return true;
        }
        if Instant::now() >= limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

/// [`candidates`] once there is one, waiting for one a second at the most
/// (the faults timed at a handoff need a worker waiting for a held key).
async fn waiting_for_held(stage: &Stage<'_>) -> Vec<(usize, usize)> {
    let limit = Instant::now() + Duration::from_secs(1);
    until(stage.changed, limit, || {
        !candidates(stage.workers).is_empty()
    })
    .await;
    candidates(stage.workers)
}

/// Those of `candidates` whose worker runs a `current_thread` executor, on
/// which one blocked poll stops all its tasks (the waiter's too).
fn on_current_thread(
    workers: &[Arc<Control>],
    candidates: &[(usize, usize)],
) -> Vec<(usize, usize)> {
    candidates
        .iter()
        .copied()
        .filter(|&(p, _)| workers[p].executor == Executor::Current)
        .collect()
}

/// `(worker, key)`: the worker waits for the key, and another one holds it.
fn candidates(workers: &[Arc<Control>]) -> Vec<(usize, usize)> {
    let mut found = Vec::new();
    for (p, worker) in workers.iter().enumerate() {
        for key in worker.live.waits_for() {
            let held = workers
                .iter()
                .any(|other| other.index != p && other.live.holds_key(key));
            if held {
                found.push((p, key));
            }
        }
    }
    found
}

/// The first holder id in key `nk<key>`'s fair queue in Redis, if any.
async fn queue_head(stage: &Stage<'_>, key: usize) -> Option<String> {
    let queue = format!(
        "{}:queue",
        layout::lock_name(stage.prefix, &format!("nk{key}"))
    );
    let Store::Redis(server) = &*stage.store else {
        return None;
    };
    let mut con = server.connection().await;
    redis::cmd("LINDEX")
        .arg(queue)
        .arg(0)
        .query_async(&mut con)
        .await
        .ok()
        .flatten()
}

/// Blocks worker executors at random beside the other faults, as a
/// service's CPU-bound or blocking code does: every 0.3-2.5 s one worker,
/// for 50-1000 ms, until 2 s before the end of the run. (Each worker runs
/// its stalls one after the other and reports them; the checker reads the
/// reports.)
pub(super) async fn stall_executors(workers: Vec<Arc<Control>>, mut rng: XorShift, secs: u64) {
    let stop_at = Instant::now() + Duration::from_secs(secs).saturating_sub(Duration::from_secs(2));
    // Bounded by time (`stop_at`) and by count.
    for _ in 0..10_000 {
        let gap = millis(&mut rng, 300, 2500);
        tokio::time::sleep_until((Instant::now() + gap).min(stop_at)).await;
        if Instant::now() >= stop_at {
            break;
        }
        let busy: Vec<usize> = (0..workers.len())
            .filter(|&i| workers[i].live.holds() || !workers[i].live.waits_for().is_empty())
            .collect();
        let p = if !busy.is_empty() && rng.below(100) < 70 {
            busy[rng.below(busy.len() as u64) as usize]
        } else {
            rng.below(workers.len() as u64) as usize
        };
        let spin = rng.below(3) == 0;
        let d = millis(&mut rng, 50, MAX_STALL_MS);
        workers[p].stall(d, spin).await;
    }
}

/// Bursts of calls beside the faults, as a busy service's: every 1-4 s two
/// or three workers run 3-8 more tasks each on one key for 0.5-3 s, every
/// call cut by a 0-60 ms timeout around its acquire or its body, until 4 s
/// before the end of the run (each worker runs its bursts one after the
/// other). Many waiters of one process on one key, readers and writers,
/// given up at random points of their attempts (where a process's place in
/// the key's queue passes between its waiters), while the other processes'
/// readers (only readers, every other burst) and writers come and go on the
/// same key.
pub(super) async fn burst_calls(workers: Vec<Arc<Control>>, mut rng: XorShift, secs: u64) {
    let stop_at = Instant::now() + Duration::from_secs(secs).saturating_sub(Duration::from_secs(4));
    let keys = workers.first().map_or(1, |w| w.fair.len());
    // Bounded by time (`stop_at`) and by count.
    for _ in 0..10_000 {
        let gap = millis(&mut rng, 1000, 4000);
        tokio::time::sleep_until((Instant::now() + gap).min(stop_at)).await;
        if Instant::now() >= stop_at {
            break;
        }
        let key = rng.below(keys as u64) as usize;
        let length =
            millis(&mut rng, 500, 3000).min(stop_at.saturating_duration_since(Instant::now()));
        let left_out = rng.below(workers.len() as u64 + 1) as usize;
        // On a read-write key: one worker's tasks read half the time, and
        // the others' half the time too, or (every other burst) only read:
        // a writer among readers.
        let mixer = rng.below(workers.len() as u64) as usize;
        let readers_around = rng.below(2) == 0;
        for (p, worker) in workers.iter().enumerate() {
            let tasks = 3 + rng.below(6) as u32;
            let readers = if p != mixer && readers_around {
                100
            } else {
                50
            };
            if p != left_out {
                worker.burst(tasks, length, key, readers).await;
            }
        }
    }
}

/// Waits until `done` says yes (checked whenever a worker's log moves) or
/// `limit` passes; whether it said yes.
pub(super) async fn until(changed: &Notify, limit: Instant, done: impl Fn() -> bool) -> bool {
    // Bounded by `limit`.
    loop {
        let notified = changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if done() {
            return true;
        }
        if tokio::time::timeout_at(limit, notified).await.is_err() {
            return done();
        }
    }
}

/// Gives each armed drop-at-command fault of proxy `p` the moment it fired
/// (the latest arming before each firing).
pub(super) fn place_firings(faults: &mut [Fault], p: usize, fired: &[u64]) {
    for &t in fired {
        if let Some(fault) = faults
            .iter_mut()
            .rev()
            .find(|f| f.armed && f.proxy == Some(p) && f.start <= t)
        {
            fault.what.push_str(" (fired)");
            fault.start = t;
            fault.end = t;
            fault.settled = t + ns(Backend::Redis.linger_recovery());
        }
    }
}
