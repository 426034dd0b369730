//! `lockctl watch KEY`: acquisitions and releases of one lock as they
//! happen. Releases arrive at once, on the lock's release channel (the one
//! the runtime's waiters listen on; `subscribe.rs`); an acquisition sends no
//! message, so the holder is read again at each release and every
//! `--interval`. A forced release (`lockctl release`, `force_unlock`)
//! announces itself as such (`f`), and is printed as forced, not as the
//! holder's. etcd and ZooKeeper announce no release: a watch on the lock's
//! contenders says when they change, and the holder is read again then (a
//! forced release shows there as a release). A read hold is its readers:
//! each reader that comes or goes is one event (a reader leaving others
//! behind sends no message; it is seen at the next look). Bounded: it stops
//! at ctrl-c, after `--for`, or after `--count` events.

use std::time::Duration;

use lock_runtime::LockInfo;
use serde_json::json;
use tokio::time::Instant;

use crate::connect::Target;
use crate::heard::Heard;
use crate::output::out;
use crate::report;
use crate::subscribe;
use crate::topology::Topology;
use crate::{Failure, Outcome};

/// When to stop, and how often to look.
pub(crate) struct Limits {
    pub(crate) duration: Option<Duration>,
    pub(crate) count: Option<u64>,
    pub(crate) interval: Duration,
}

/// One hold seen: who, with which token; a read hold is one per reader.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    holder: String,
    fence: Option<u64>,
    read: bool,
}

/// Prints the lock's state, then one line per acquisition and release.
pub(crate) async fn run(
    target: &Target,
    key: &str,
    limits: Limits,
    json: bool,
) -> Result<Outcome, Failure> {
    let runtime = target.runtime().await?;
    // Subscribe before the first look, so no release after it is missed.
    let mut releases = subscribe::subscribe(target, &runtime, key).await?;
    // On Redlock every master announces the release.
    let announced_by_each = matches!(target.topology, Topology::Redlock(_));
    let start = Instant::now();
    let end = limits.duration.map(|d| start + d);
    let mut printer = Printer {
        key,
        json,
        start,
        events: 0,
    };
    let first = target.inspect(&runtime, key).await?;
    printer.state(first.as_ref());
    let mut last = seen(first.as_ref());
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    while limits.count.is_none_or(|n| printer.events < n) {
        let mut released = None;
        tokio::select! {
            heard = releases.next() => match heard {
                Some(Heard::Message(payload)) => released = Some(payload),
                // Looked at below, as at each interval.
                Some(Heard::Changed) => {}
                Some(Heard::Lost) | None => {
                    return Err(Failure(format!(
                        "the connection to {} was closed",
                        target.topology.server_kind()
                    )))
                }
            },
            () = tokio::time::sleep(limits.interval) => {}
            () = sleep_until(end) => break,
            _ = &mut ctrl_c => break,
        }
        let now = target.inspect(&runtime, key).await?;
        let now_seen = seen(now.as_ref());
        let gone: Vec<&Seen> = last.iter().filter(|s| !now_seen.contains(s)).collect();
        if let Some(payload) = released.as_deref() {
            // A release; whom it freed are the holds seen last that are
            // gone (unknown when one came and went between two looks).
            // On Redlock a message is news only if it ends a hold seen
            // last: the other masters' messages for the same release come
            // later, maybe after the next holder took it. (A hold that
            // came and went between two looks is not seen there.)
            let (to, forced) = (handed_to(payload), payload == FORCED);
            match gone.is_empty() {
                true if !announced_by_each => printer.released(last.first(), to, forced),
                true => {}
                false => gone
                    .iter()
                    .for_each(|s| printer.released(Some(s), to, forced)),
            }
        } else {
            // Gone or replaced without our seeing the message (a lease
            // that ran out sends none, nor a reader leaving others behind).
            gone.iter()
                .for_each(|s| printer.released(Some(s), None, false));
        }
        if let Some(info) = &now {
            for s in now_seen.iter().filter(|s| !last.contains(s)) {
                if limits.count.is_none_or(|n| printer.events < n) {
                    printer.acquired(s, info);
                }
            }
        }
        last = now_seen;
    }
    Ok(target.outcome(true))
}

/// The payload of a forced release (`scripts/force_unlock.lua`).
const FORCED: &str = "f";

/// Sleeps until `end`, or for ever without one.
async fn sleep_until(end: Option<Instant>) {
    match end {
        Some(end) => tokio::time::sleep_until(end).await,
        None => std::future::pending().await,
    }
}

/// The holds of a lock: its writer, or each of its readers.
fn seen(info: Option<&LockInfo>) -> Vec<Seen> {
    let Some(info) = info else {
        return Vec::new();
    };
    if !info.mode.is_read() {
        return vec![Seen {
            holder: info.holder.clone(),
            fence: info.fence,
            read: false,
        }];
    }
    let readers = info.readers.iter().map(|r| Seen {
        holder: r.holder.clone(),
        fence: r.fence,
        read: true,
    });
    readers.collect()
}

/// The holder a fair release handed the lock to (`g <holder> <fence>`).
fn handed_to(payload: &str) -> Option<&str> {
    let mut words = payload.split(' ');
    (words.next() == Some("g")).then(|| words.next()).flatten()
}

/// Prints events as text or JSON lines, each with the time since the start.
struct Printer<'a> {
    key: &'a str,
    json: bool,
    start: Instant,
    /// Acquisitions and releases printed so far.
    events: u64,
}

impl Printer<'_> {
    fn at_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn state(&self, info: Option<&LockInfo>) {
        match (info, self.json) {
            (Some(info), true) => {
                let mut state = report::info_json(info);
                state["event"] = json!("state");
                state["at_ms"] = json!(0);
                out!("{state}");
            }
            (None, true) => out!(
                "{}",
                json!({ "event": "state", "at_ms": 0, "key": self.key, "held": false })
            ),
            (Some(info), false) if info.mode.is_read() => out!(
                "{:>8.3}s {}: held by {} ({}, lease left {})",
                0.0,
                self.key,
                info.holder,
                report::mode(info),
                report::lease(info.remaining_lease)
            ),
            (Some(info), false) => out!(
                "{:>8.3}s {}: held by {} (fence {}, lease left {})",
                0.0,
                self.key,
                info.holder,
                report::fence(info.fence),
                report::lease(info.remaining_lease)
            ),
            (None, false) => out!("{:>8.3}s {}: free", 0.0, self.key),
        }
    }

    /// `hold` came; `info` is the lock as seen with it.
    fn acquired(&mut self, hold: &Seen, info: &LockInfo) {
        self.events += 1;
        let at = self.at_ms();
        if self.json {
            let mut event = report::info_json(info);
            event["event"] = json!("acquired");
            event["at_ms"] = json!(at);
            event["holder"] = json!(hold.holder);
            event["fence"] = json!(hold.fence);
            out!("{event}");
        } else {
            let read = if hold.read {
                format!(" ({})", report::mode(info))
            } else {
                String::new()
            };
            out!(
                "{:>8.3}s {}: acquired by {} (fence {}){read}",
                at as f64 / 1000.0,
                self.key,
                hold.holder,
                report::fence(hold.fence)
            );
        }
    }

    fn released(&mut self, by: Option<&Seen>, handed_to: Option<&str>, forced: bool) {
        self.events += 1;
        let at = self.at_ms();
        if self.json {
            out!(
                "{}",
                json!({
                    "event": "released",
                    "at_ms": at,
                    "key": self.key,
                    "holder": by.map(|s| &s.holder),
                    "fence": by.and_then(|s| s.fence),
                    "mode": by.map(|s| if s.read { "read" } else { "write" }),
                    "handed_to": handed_to,
                    "forced": forced,
                })
            );
        } else {
            let by = by.map_or("a holder not seen".to_owned(), |s| {
                format!("{} (fence {})", s.holder, report::fence(s.fence))
            });
            let to = handed_to.map_or(String::new(), |h| format!(", handed to {h}"));
            let at = at as f64 / 1000.0;
            // A forced release is not the holder's doing: say so, and whose
            // hold it took.
            match forced {
                true => out!("{at:>8.3}s {}: forced release: was held by {by}", self.key),
                false => out!("{at:>8.3}s {}: released by {by}{to}", self.key),
            }
        }
    }
}
