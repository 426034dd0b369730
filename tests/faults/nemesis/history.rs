//! The history: every call of every process, from the event logs.

use std::collections::HashMap;
use std::time::Duration;

use lock_runtime::LockMode;

use super::check::Violation;
use super::permits::slot_of;

/// One locked call, as its process logged it.
#[derive(Debug, Default)]
pub(super) struct Call {
    /// The worker process that made it (its index).
    pub(super) proc: usize,
    /// The task of that process it ran in.
    pub(super) task: u32,
    /// Its number in its process's log.
    pub(super) id: u64,
    /// The call whose body it was made in (its `id`), 0 outside any body.
    pub(super) parent: u64,
    /// The key it locked (its index), or for a permit call the permit it
    /// got, as a key of its own (a slot: `permits.rs`).
    pub(super) key: usize,
    /// When it began, on the events' clock (ns).
    pub(super) begin: u64,
    /// `None`: wait forever.
    pub(super) wait: Option<Duration>,
    pub(super) lease: Duration,
    pub(super) renew: bool,
    /// What it asked for: exclusive, read or write.
    pub(super) mode: LockMode,
    /// When its process logged the entry (at the latest the entry).
    pub(super) acquired: Option<u64>,
    /// When the poll began that handed the hold over (`polled=`): at the
    /// earliest the entry. The two differ by more than a moment only when
    /// the process was stopped in between.
    pub(super) polled: Option<u64>,
    pub(super) fence: u64,
    pub(super) outer: bool,
    pub(super) body_enter: Option<u64>,
    pub(super) body_exit: Option<u64>,
    pub(super) lost: Option<u64>,
    /// A fixed lease's hold told lost: when a plain timer of its executor,
    /// set for `polled` + the lease (the latest its client-side lease can
    /// end), fired, if before the tell (`lease_timer=`).
    pub(super) lease_timer: Option<u64>,
    pub(super) released: Option<u64>,
    /// The first of timeout, error, cancelled, panicked.
    pub(super) ended: Option<(u64, String)>,
    /// An error's `what=`.
    pub(super) error: Option<String>,
    /// An outermost hold's counter, as its body found it.
    pub(super) data: Option<Data>,
    /// Whether its record in the backend was asked inside the body
    /// (`recorded`), and when it was seen as a reader's (`own=reader`).
    pub(super) recorded: bool,
    pub(super) recorded_as_reader: Option<u64>,
    /// `try_acquire()` (one try).
    pub(super) tried: bool,
    /// Cut by a timeout around its acquire or its body (`cut=`).
    pub(super) cut: bool,
    /// Its guard was dropped, not released.
    pub(super) dropped: bool,
    /// The multi-key call it is one key of (`many=`: the id of that call's
    /// first key's record), 0 for a single-key call.
    pub(super) group: u64,
    /// A key of a multi-key call handed over before the poll that entered
    /// the body: that poll's start (`lease_from=`), the latest its lease
    /// can have started counting (`polled` is then the call's start).
    pub(super) lease_from: Option<u64>,
    /// A permit call's count of permits (`permits=`), 0 for any other.
    pub(super) permits: u32,
    /// The permit index the library told a permit call (`permit=`).
    pub(super) permit: Option<u32>,
    /// The key of the lock a permit call's guard held (`lock=`).
    pub(super) lock: Option<String>,
}

/// A `shutdown()` of a process's lock runtime, called at `from`, which
/// returned at `to` (`confirmed`: with `Ok`, every release answered). Every
/// hold of the process ends by `to`: the runtime told each it was lost and
/// gave it back.
#[derive(Clone, Copy, Debug)]
pub(super) struct Shutdown {
    pub(super) proc: usize,
    pub(super) from: u64,
    pub(super) to: u64,
    pub(super) confirmed: bool,
}

/// The counter of a key as an outermost hold's body found it when it
/// began (`seen`) and when it ended (`then`, logged at `t`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Data {
    pub(super) t: u64,
    pub(super) seen: u64,
    pub(super) then: u64,
}

/// One event line, kept for the report.
pub(super) struct Event {
    pub(super) t: u64,
    pub(super) key: usize,
    pub(super) text: String,
}

pub(super) struct History {
    /// Holds the workers passed between their tasks (lock cohorting).
    pub(super) passed_locally: u64,
    pub(super) calls: Vec<Call>,
    pub(super) by_id: HashMap<(usize, u64), usize>,
    pub(super) events: Vec<Event>,
    /// When each process ended (its `done`, or when it was killed).
    pub(super) ends: Vec<u64>,
    /// When the run began (times in messages count from there).
    pub(super) start: u64,
    /// The shutdowns of the processes' lock runtimes, in order.
    pub(super) shutdowns: Vec<Shutdown>,
    /// The records of each multi-key call (one per key), by process and
    /// the call's `many=` id.
    pub(super) groups: HashMap<(usize, u64), Vec<usize>>,
}

impl Call {
    /// Whether it asked for a hold that excludes every other: a write or
    /// exclusive hold (one lock).
    pub(super) fn writes(&self) -> bool {
        self.mode != LockMode::Read
    }

    /// "read", "write" or "exclusive".
    pub(super) fn mode_word(&self) -> &'static str {
        match self.mode {
            LockMode::Read => "read",
            LockMode::Write => "write",
            _ => "exclusive",
        }
    }

    /// For a hold of a fixed lease told lost after its latest possible
    /// lease end (`polled` + the lease), how late a plain timer of its own
    /// executor for that moment fired (ns): how long its process took then
    /// to run what was due, the library's tell included.
    pub(super) fn timer_late(&self) -> Option<u64> {
        let due = self.lease_from.or(self.polled)? + self.lease.as_nanos() as u64;
        Some(self.lease_timer?.saturating_sub(due)).filter(|_| !self.renew)
    }

    /// The earliest moment its entry can have happened.
    pub(super) fn entered_from(&self) -> u64 {
        let acquired = self.acquired.unwrap_or(self.begin);
        self.polled
            .filter(|&p| p > 0 && p <= acquired)
            .unwrap_or(acquired)
    }
}

impl Shutdown {
    /// `shutdown <n> <from> <to> ok|err` of process `proc`.
    fn parse(proc: usize, line: &str) -> Option<Shutdown> {
        let words: Vec<&str> = line.split(' ').collect();
        let ["shutdown", _, from, to, how] = words.as_slice() else {
            return None;
        };
        Some(Shutdown {
            proc,
            from: from.parse().ok()?,
            to: to.parse().ok()?,
            confirmed: *how == "ok",
        })
    }
}

impl History {
    pub(super) fn parse(
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
            shutdowns: Vec::new(),
            groups: HashMap::new(),
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
                if let Some(shutdown) = Shutdown::parse(proc, line) {
                    history.shutdowns.push(shutdown);
                    continue;
                }
                // (Executor stalls: faults, read by the run.)
                if line.starts_with("done ")
                    || line.starts_with("stall ")
                    || line.starts_with("stalled_after_send ")
                    || line.starts_with("blocking ")
                    || line.starts_with("starved ")
                    || line.starts_with("runtime ")
                    || line.starts_with("burst ")
                {
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
        for (i, call) in history.calls.iter().enumerate() {
            if call.group != 0 {
                history
                    .groups
                    .entry((call.proc, call.group))
                    .or_default()
                    .push(i);
            }
        }
        history.events.sort_by_key(|e| e.t);
        history.shutdowns.sort_by_key(|s| s.to);
        history
    }

    pub(super) fn event(&mut self, proc: usize, rest: &str) {
        let words: Vec<&str> = rest.split(' ').filter(|w| !w.is_empty()).collect();
        let [t, task, id, parent, key, kind, fields @ ..] = words.as_slice() else {
            panic!("bad event line {rest:?}");
        };
        let t: u64 = t.parse().expect("event time");
        let id: u64 = id.parse().expect("call id");
        let key = slot_of(key).expect("key index");
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
                call.mode = match field("mode") {
                    Some("read") => LockMode::Read,
                    Some("write") => LockMode::Write,
                    _ => LockMode::Exclusive,
                };
                call.tried = field("api") == Some("try");
                call.cut = field("cut").is_some_and(|c| c != "-");
                call.group = field("many").and_then(|v| v.parse().ok()).unwrap_or(0);
                call.permits = field("permits").and_then(|v| v.parse().ok()).unwrap_or(0);
            }
            "data" => {
                let number = |name: &str| field(name).and_then(|v| v.parse().ok()).unwrap_or(0);
                call.data = Some(Data {
                    t,
                    seen: number("seen"),
                    then: number("then"),
                });
            }
            "acquired" => {
                call.acquired = Some(t);
                call.fence = field("fence").and_then(|v| v.parse().ok()).unwrap_or(0);
                call.polled = field("polled").and_then(|v| v.parse().ok());
                call.outer = field("outer") == Some("1");
                call.lease_from = field("lease_from").and_then(|v| v.parse().ok());
                call.permit = field("permit").and_then(|v| v.parse().ok());
                call.lock = field("lock").map(str::to_owned);
            }
            "body_enter" => call.body_enter = Some(t),
            "recorded" => {
                call.recorded = true;
                if field("own") == Some("reader") {
                    call.recorded_as_reader.get_or_insert(t);
                }
            }
            "body_exit" => call.body_exit = Some(t),
            "lost" if call.lost.is_none() => {
                call.lost = Some(t);
                call.lease_timer = field("lease_timer").and_then(|v| v.parse().ok());
            }
            "released" => {
                call.released.get_or_insert(t);
                call.dropped |= field("dropped") == Some("1");
            }
            "timeout" | "error" | "cancelled" | "panicked" if call.ended.is_none() => {
                call.ended = Some((t, (*kind).to_owned()));
                call.error = field("what").map(str::to_owned);
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
    pub(super) fn secs(&self, t: u64) -> f64 {
        (t as i64 - self.start as i64) as f64 / 1e9
    }

    pub(super) fn parent_of(&self, call: &Call) -> Option<&Call> {
        if call.parent == 0 {
            return None;
        }
        self.by_id
            .get(&(call.proc, call.parent))
            .map(|&i| &self.calls[i])
    }

    /// The other records of the multi-key call `call` is one key of.
    pub(super) fn group_mates<'h>(&'h self, call: &'h Call) -> impl Iterator<Item = &'h Call> {
        self.groups
            .get(&(call.proc, call.group))
            .filter(|_| call.group != 0)
            .into_iter()
            .flatten()
            .map(|&i| &self.calls[i])
            .filter(move |c| c.id != call.id)
    }

    /// The calls `call` is nested in, innermost first: up its parents, a
    /// multi-key call's records (one per key) all counted as enclosing it.
    pub(super) fn ancestors<'h>(&'h self, call: &Call) -> Vec<&'h Call> {
        let mut all = Vec::new();
        let mut node = self.parent_of(call);
        // Bounded by the nesting depth; the count guards against a cycle.
        for _ in 0..64 {
            let Some(n) = node else { break };
            all.push(n);
            all.extend(self.group_mates(n));
            node = self.parent_of(n);
        }
        all
    }

    /// Whether `a` is an ancestor of `b` (same process, up b's parents).
    pub(super) fn is_ancestor(&self, a: &Call, b: &Call) -> bool {
        a.proc == b.proc && self.ancestors(b).iter().any(|n| n.id == a.id)
    }

    /// The end of a call's hold: its first of released, lost, body exit,
    /// timeout/error/cancelled/panicked after the acquisition, else the end
    /// of its process; at the latest the end of the first shutdown of its
    /// process's lock runtime after it entered ([`Self::ended_by_shutdown`]).
    pub(super) fn hold_end(&self, call: &Call) -> u64 {
        let acquired = call.acquired.unwrap_or(call.begin);
        let own = [
            call.released,
            call.lost,
            call.body_exit,
            call.ended.as_ref().map(|e| e.0),
        ]
        .into_iter()
        .flatten()
        .filter(|&t| t >= acquired)
        .min()
        .unwrap_or(self.ends[call.proc]);
        match self.shutdown_after(call) {
            Some(shutdown) => own.min(shutdown.to),
            None => own,
        }
    }

    /// Whether a call's hold was open when a shutdown of its runtime was
    /// called (which told it that it was lost).
    pub(super) fn open_at_shutdown(&self, call: &Call) -> bool {
        self.shutdown_after(call).is_some_and(|s| {
            call.acquired.is_some_and(|a| a < s.from) && self.hold_end(call) > s.from
        })
    }

    /// The shutdown that ended a call's hold: the first of its process's
    /// that returned after the hold entered and before the hold ended of
    /// itself.
    pub(super) fn ended_by_shutdown(&self, call: &Call) -> Option<Shutdown> {
        let shutdown = self.shutdown_after(call)?;
        (self.hold_end(call) == shutdown.to).then_some(shutdown)
    }

    /// The first shutdown of `call`'s process that returned after the call
    /// entered.
    fn shutdown_after(&self, call: &Call) -> Option<Shutdown> {
        let acquired = call.acquired?;
        self.shutdowns
            .iter()
            .find(|s| s.proc == call.proc && s.to >= acquired)
            .copied()
    }

    /// When the holder learnt that this call's hold was lost: its own `lost`
    /// or that of an enclosing call whose hold it re-entered.
    pub(super) fn told_lost(&self, call: &Call) -> Option<u64> {
        let mut told = call.lost;
        for n in self.ancestors(call) {
            if n.key == call.key && n.fence == call.fence {
                told = match (told, n.lost) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
        }
        told
    }
}
