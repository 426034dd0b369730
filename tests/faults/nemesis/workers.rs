//! The worker processes (`nemesis_worker`): started, given orders (stall
//! the executor, now or right after an acquire went out; shut the lock
//! runtime down; SIGSTOP/SIGCONT), and their logs read as they come in.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_testkit::pipes;
use lock_testkit::signal::{self, Signal};
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, ChildStdin};
use tokio::sync::Notify;

use super::{KeySpec, TASKS, TIMEOUT};

/// How a worker runs its tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Executor {
    /// A `current_thread` tokio runtime: a stall blocks every task.
    Current,
    /// Two worker threads: a stall blocks one of them.
    Multi,
}

impl Executor {
    fn arg(self) -> &'static str {
        match self {
            Executor::Current => "current",
            Executor::Multi => "multi",
        }
    }
}

/// One worker process: its exit, its whole log at the end, and the handle
/// the faults drive it with.
pub(super) struct Worker {
    pub(super) child: Child,
    pub(super) lines: tokio::task::JoinHandle<Vec<String>>,
    pub(super) control: Arc<Control>,
}

/// What the faults need of a worker while it runs.
pub(super) struct Control {
    /// Its index (the index of its proxy).
    pub(super) index: usize,
    pub(super) pid: u32,
    pub(super) executor: Executor,
    /// Whether it takes each key in fair mode.
    pub(super) fair: Vec<bool>,
    /// Each key's count of permits (0: not a permit key).
    pub(super) permits: Vec<u32>,
    pub(super) live: Arc<Live>,
    stdin: tokio::sync::Mutex<Option<ChildStdin>>,
}

/// Stall numbers, unique across the run (a worker ends a stall `n` at its
/// `unstall n`, and every earlier one with it).
static NEXT_STALL: AtomicU64 = AtomicU64::new(1);

impl Control {
    async fn send(&self, line: &str) {
        let mut stdin = self.stdin.lock().await;
        let Some(stdin) = stdin.as_mut() else { return };
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("write to a worker");
        stdin.flush().await.expect("write to a worker");
    }

    /// Tells the worker to go.
    pub(super) async fn go(&self) {
        self.send("go").await;
    }

    /// Blocks a thread of the worker's executor for at most `max` (in
    /// `std::thread::sleep`, or spinning): the stall's number, for
    /// [`unstall`](Self::unstall) and [`Live::stalled`].
    pub(super) async fn stall(&self, max: Duration, spin: bool) -> u64 {
        let id = NEXT_STALL.fetch_add(1, Ordering::Relaxed);
        let how = if spin { "spin" } else { "sleep" };
        self.send(&format!("stall {id} {} {how}", max.as_millis()))
            .await;
        id
    }

    /// Ends stall `id` now.
    pub(super) async fn unstall(&self, id: u64) {
        self.send(&format!("unstall {id}")).await;
    }

    /// Arms a stall of the worker's executor thread for at most `max`,
    /// right after the first poll of its next top-level call on `key` that
    /// does not end in that poll (its acquire went out); the stall's
    /// number, for [`unstall`](Self::unstall) (which also drops an arm that
    /// has not fired), [`Live::stalled_after_send`] and [`Live::stalled`].
    pub(super) async fn arm(&self, max: Duration, key: usize) -> u64 {
        let id = NEXT_STALL.fetch_add(1, Ordering::Relaxed);
        self.send(&format!("arm {id} {} {key}", max.as_millis()))
            .await;
        id
    }

    /// Orders a burst: `tasks` more tasks make calls on `key` for `length`,
    /// each cut short at a random point, `readers` % of them reads on a
    /// read-write key.
    pub(super) async fn burst(&self, tasks: u32, length: Duration, key: usize, readers: u64) {
        let id = NEXT_STALL.fetch_add(1, Ordering::Relaxed);
        let ms = length.as_millis();
        self.send(&format!("burst {id} {tasks} {ms} {key} {readers}"))
            .await;
    }

    /// Orders `shutdown()` of the worker's lock runtime (it then builds a
    /// new one): the order's number, for [`Live::shut_down`].
    pub(super) async fn shutdown(&self) -> u64 {
        let id = NEXT_STALL.fetch_add(1, Ordering::Relaxed);
        self.send(&format!("shutdown {id}")).await;
        id
    }

    /// The process part of its current runtime's holder ids: a fair
    /// handoff names it (a new runtime after a shutdown has new ones).
    pub(super) fn id(&self) -> String {
        self.live.state.lock().expect("live state").id.clone()
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`) to the whole process.
    pub(super) async fn stop(&self, stop: bool) {
        let pid = self.pid;
        let sig = if stop { Signal::Stop } else { Signal::Cont };
        tokio::task::spawn_blocking(move || signal::send(pid, sig))
            .await
            .expect("signal a worker")
            .expect("signal a worker");
    }

    /// Closes its stdin: a worker still running then exits.
    pub(super) async fn close(&self) {
        self.stdin.lock().await.take();
    }
}

/// A worker's log as it comes in: which outermost holds are open and which
/// calls wait right now, so the nemesis can aim a fault at a process that
/// holds or waits for a lock (a fault that hits a process doing nothing
/// tests little), and when a key was last taken and a stall ended.
pub(super) struct Live {
    state: Mutex<LiveState>,
    /// Notified at each line (shared by all workers).
    changed: Arc<Notify>,
}

#[derive(Default)]
struct LiveState {
    /// The process part of the current runtime's holder ids.
    id: String,
    /// Outermost holds open now: call → key.
    holding: HashMap<u64, usize>,
    /// Calls that asked and have neither the lock nor an answer: call → key.
    waiting: HashMap<u64, usize>,
    /// When each key was last taken (an outermost hold).
    acquired: HashMap<usize, u64>,
    /// Stalls done: number → (from, to).
    stalls: HashMap<u64, (u64, u64)>,
    /// Armed stalls that began.
    stalled_after_send: HashSet<u64>,
    /// Shutdowns done: number → (from, to).
    shutdowns: HashMap<u64, (u64, u64)>,
    /// A task blocks its thread right after a call whose release passed a
    /// hold to another task of the process (`blocking <t> passed=1`), until
    /// its `stall 0` line.
    busy_after_a_pass: bool,
}

impl Live {
    fn new(id: String, changed: Arc<Notify>) -> Live {
        Live {
            state: Mutex::new(LiveState {
                id,
                ..LiveState::default()
            }),
            changed,
        }
    }

    pub(super) fn see(&self, line: &str) {
        let words: Vec<&str> = line.split(' ').collect();
        let mut state = self.state.lock().expect("live state");
        let number = |word: &str| word.parse::<u64>().ok();
        let seen = match words.as_slice() {
            ["runtime", id] => {
                state.id = (*id).to_owned();
                true
            }
            ["stalled_after_send", n, ..] => {
                if let Some(n) = number(n) {
                    state.stalled_after_send.insert(n);
                }
                true
            }
            ["shutdown", n, from, to, _] => {
                if let (Some(n), Some(from), Some(to)) = (number(n), number(from), number(to)) {
                    state.shutdowns.insert(n, (from, to));
                }
                true
            }
            _ => false,
        };
        if seen {
            drop(state);
            self.changed.notify_waiters();
            return;
        }
        if let ["blocking", _, passed] = words.as_slice() {
            state.busy_after_a_pass = *passed == "passed=1";
            drop(state);
            self.changed.notify_waiters();
            return;
        }
        if let ["stall", id, from, to, ..] = words.as_slice() {
            if let (Ok(id), Ok(from), Ok(to)) = (id.parse(), from.parse(), to.parse()) {
                state.stalls.insert(id, (from, to));
                if id == 0 {
                    state.busy_after_a_pass = false;
                }
            }
            drop(state);
            self.changed.notify_waiters();
            return;
        }
        let ["ev", t, _task, call, _parent, key, kind, ..] = words.as_slice() else {
            return;
        };
        // (A permit call's key column is `<key>#<permit>`: its key counts.)
        let key = key.split('#').next().unwrap_or_default();
        let (Ok(t), Ok(call), Ok(key)) = (t.parse::<u64>(), call.parse::<u64>(), key.parse())
        else {
            return;
        };
        match *kind {
            "begin" => {
                state.waiting.insert(call, key);
            }
            "acquired" => {
                state.waiting.remove(&call);
                if words.contains(&"outer=1") {
                    state.holding.insert(call, key);
                    state.acquired.insert(key, t);
                }
            }
            "released" | "lost" | "cancelled" | "panicked" | "body_exit" | "timeout" | "error" => {
                state.waiting.remove(&call);
                state.holding.remove(&call);
            }
            _ => {}
        }
        drop(state);
        self.changed.notify_waiters();
    }

    /// Whether it holds any lock now.
    pub(super) fn holds(&self) -> bool {
        !self.state.lock().expect("live state").holding.is_empty()
    }

    /// Whether one of its tasks is busy right after passing a hold.
    pub(super) fn busy_after_a_pass(&self) -> bool {
        self.state.lock().expect("live state").busy_after_a_pass
    }

    /// Whether it holds `key` now.
    pub(super) fn holds_key(&self, key: usize) -> bool {
        let state = self.state.lock().expect("live state");
        state.holding.values().any(|&k| k == key)
    }

    /// The keys it waits for now.
    pub(super) fn waits_for(&self) -> Vec<usize> {
        let state = self.state.lock().expect("live state");
        let mut keys: Vec<usize> = state.waiting.values().copied().collect();
        keys.sort_unstable();
        keys.dedup();
        keys
    }

    /// The window of stall `id`, once it is over.
    pub(super) fn stalled(&self, id: u64) -> Option<(u64, u64)> {
        self.state
            .lock()
            .expect("live state")
            .stalls
            .get(&id)
            .copied()
    }

    /// Whether armed stall `id` began (its call's acquire went out).
    pub(super) fn stalled_after_send(&self, id: u64) -> bool {
        let state = self.state.lock().expect("live state");
        state.stalled_after_send.contains(&id)
    }

    /// The window of shutdown `id`, once it returned.
    pub(super) fn shut_down(&self, id: u64) -> Option<(u64, u64)> {
        let state = self.state.lock().expect("live state");
        state.shutdowns.get(&id).copied()
    }

    /// Whether it took `key` after `t`.
    pub(super) fn acquired_after(&self, key: usize, t: u64) -> bool {
        let state = self.state.lock().expect("live state");
        state.acquired.get(&key).is_some_and(|&a| a > t)
    }
}

/// Starts worker `index` with its own key kinds and modes, its counter
/// files in `data_dir`, and its executor, and waits until it is ready.
#[allow(clippy::too_many_arguments)]
pub(super) async fn spawn_worker(
    index: usize,
    url: &str,
    prefix: &str,
    seed: u64,
    secs: u64,
    keys: &[(String, KeySpec)],
    data_dir: &std::path::Path,
    executor: Executor,
    changed: Arc<Notify>,
) -> Worker {
    let key_list: Vec<String> = keys
        .iter()
        .map(|(name, spec)| format!("{name}:{}", spec.word()))
        .collect();
    let mut command = tokio::process::Command::new(worker_binary());
    command.args([
        url,
        prefix,
        &seed.to_string(),
        &secs.to_string(),
        &TASKS.to_string(),
        &TIMEOUT.as_millis().to_string(),
        &key_list.join(","),
        data_dir.to_str().expect("a UTF-8 temp path"),
        executor.arg(),
    ]);
    // (Names its trace file, if LOCK_NEMESIS_TRACE asks for one.)
    command.env("LOCK_NEMESIS_PROCESS", format!("p{index}"));
    let (mut child, mut lines) = pipes::spawn(&mut command).expect("spawn nemesis_worker");
    let stdin = child.stdin.take().expect("worker stdin");
    let pid = child.id().expect("a running worker has a pid");
    let ready = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("a worker did not get ready within 20 s")
        .expect("read worker stdout")
        .expect("the worker closed its stdout before it was ready");
    let id = ready
        .strip_prefix("ready ")
        .unwrap_or_else(|| panic!("worker start-up: {ready:?}, expected `ready <id>`"))
        .to_owned();
    let live = Arc::new(Live::new(id, changed));
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
        lines,
        control: Arc::new(Control {
            index,
            pid,
            executor,
            fair: keys.iter().map(|(_, spec)| spec.fair).collect(),
            permits: keys.iter().map(|(_, spec)| spec.permits()).collect(),
            live,
            stdin: tokio::sync::Mutex::new(Some(stdin)),
        }),
    }
}

/// The worker binary: `LOCK_NEMESIS_WORKER` when set (a copy kept for a
/// series of replays: the build directory's `nemesis_worker` is the last
/// one built, from whichever checkout shares it), else this build's.
fn worker_binary() -> String {
    std::env::var("LOCK_NEMESIS_WORKER")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_nemesis_worker").to_owned())
}
