//! Step 5 of an acquisition: sleeping until a wake-up, the holder's lease
//! end as this process knows it, or the deadline.

use std::pin::Pin;
use std::time::Duration;

use tokio::sync::futures::Notified;
use tokio::time::Instant;

use super::{Acquisition, QUEUED_SLACK, QUEUE_REFRESH};

/// How long a waiter behind the head, woken by its alarm with no news,
/// leaves the head to try first before it tries out of turn.
const HEAD_GRACE: Duration = Duration::from_secs(1);
use crate::waiters::WaitTicket;

/// When a sleeping waiter wakes by itself, if no wake-up comes first.
pub(super) struct Alarm {
    /// The holder's lease end if no news says otherwise.
    fallback: Instant,
    /// Whether news of the holder's lease moves the alarm.
    follow_lease: bool,
}

impl Acquisition {
    /// The alarm of a waiter that learned (`ttl`, or nothing) about the
    /// holder's lease `now`: its end. (In fair mode the watchdog's tick keeps
    /// the process's place alive, see `waiters/fair.rs`.)
    pub(super) fn lease_alarm(&self, now: Instant, ttl: Option<Duration>) -> Alarm {
        let lease = self.want.lease;
        Alarm {
            fallback: now.checked_add(ttl.unwrap_or(lease)).unwrap_or(now + lease),
            follow_lease: true,
        }
    }

    /// The alarm while another local waiter's attempt uses the place: its
    /// outcome (or a handoff) wakes the head; at the latest a refresh.
    pub(super) fn place_alarm(&self, now: Instant) -> Alarm {
        Alarm {
            fallback: now + QUEUE_REFRESH,
            follow_lease: false,
        }
    }

    /// Step 5: sleeps until `woken` fires, the alarm, or the deadline.
    /// With `follow_lease`, news that the holder's lease ends sooner (from
    /// any waiter or hold of this process) wakes the sleeper early, and news
    /// that it ends later keeps it asleep: either way no waiter sleeps past
    /// the holder's lease as this process knows it. Waiters behind the head
    /// wake [`QUEUED_SLACK`] later, so the head's attempt usually brings the
    /// news; one that finds none waits up to [`HEAD_GRACE`] more for it
    /// (local waiters are served in order).
    pub(super) async fn wait_for_wake_up(
        &self,
        mut woken: Pin<&mut Option<Notified<'_>>>,
        alarm: Alarm,
    ) {
        let Some(ticket) = &self.ticket else {
            return;
        };
        let deadline = self.deadline;
        // A waiter behind the head whose alarm found no news yet: when it
        // may try out of turn (see below).
        let mut held_back: Option<Instant> = None;
        loop {
            let changed = ticket.busy_changed();
            let slack = if ticket.is_head() {
                Duration::ZERO
            } else {
                QUEUED_SLACK
            };
            let news = |t: &WaitTicket| t.busy_until().filter(|_| alarm.follow_lease);
            let lease_end = news(ticket).map_or(alarm.fallback, |u| u + slack);
            let lease_end = held_back.map_or(lease_end, |h| h.max(lease_end));
            let wake_at = deadline.map_or(lease_end, |d| d.min(lease_end));
            tokio::select! {
                _ = async { if let Some(w) = woken.as_mut().as_pin_mut() { w.await } } => return,
                () = changed, if alarm.follow_lease => {}
                () = tokio::time::sleep_until(wake_at) => {
                    let now = Instant::now();
                    let news_later = news(ticket).is_some_and(|u| u + slack > now);
                    let must_wake = deadline.is_some_and(|d| now >= d);
                    if must_wake {
                        return;
                    }
                    if news_later {
                        continue;
                    }
                    // Behind the head, and the head's attempt has brought
                    // no news yet (its task not run yet on a busy
                    // executor, its round trip slow): trying now would
                    // overtake it (on etcd and ZooKeeper with the place
                    // they share). Its attempt's news, or its leaving the
                    // queue, wakes this one; the grace only bounds the
                    // wait for a head that brings none.
                    if !ticket.is_head() && held_back.is_none() {
                        held_back = Some(now + HEAD_GRACE);
                        continue;
                    }
                    return;
                }
            }
        }
    }
}
