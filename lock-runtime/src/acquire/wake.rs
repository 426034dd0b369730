//! Step 5 of an acquisition: sleeping until a wake-up, the holder's lease
//! end as this process knows it, a fair-mode refresh, or the deadline.

use std::pin::Pin;
use std::time::Duration;

use tokio::sync::futures::Notified;
use tokio::time::Instant;

use super::{Acquisition, QUEUED_SLACK, QUEUE_REFRESH, QUEUE_REFRESH_MIN};
use crate::waiters::WaitTicket;

/// When a sleeping waiter wakes by itself, if no wake-up comes first.
pub(super) struct Alarm {
    /// The holder's lease end if no news says otherwise.
    fallback: Instant,
    /// Whether news of the holder's lease moves the alarm.
    follow_lease: bool,
    /// Fair mode: when the head refreshes the process's place.
    refresh_at: Option<Instant>,
}

impl Acquisition {
    /// The alarm of a waiter that learned (`ttl`, or nothing) about the
    /// holder's lease `now`: its end, and in fair mode the head's refresh.
    pub(super) fn lease_alarm(&self, now: Instant, ttl: Option<Duration>) -> Alarm {
        let lease = self.want.lease;
        let is_head = self.ticket.as_ref().is_some_and(WaitTicket::is_head);
        Alarm {
            fallback: now.checked_add(ttl.unwrap_or(lease)).unwrap_or(now + lease),
            follow_lease: true,
            // Often enough that the place stays alive, and that most of a
            // handoff's claim is still ahead when it is taken (its lease is
            // counted from the last refresh before it).
            refresh_at: (self.want.fair && is_head).then(|| {
                now + QUEUE_REFRESH
                    .min(self.handoff_lease() / 3)
                    .max(QUEUE_REFRESH_MIN)
            }),
        }
    }

    /// The alarm while another local waiter's attempt uses the place: its
    /// outcome (or a handoff) wakes the head; at the latest a refresh.
    pub(super) fn place_alarm(&self, now: Instant) -> Alarm {
        Alarm {
            fallback: now + QUEUE_REFRESH,
            follow_lease: false,
            refresh_at: None,
        }
    }

    /// Step 5: sleeps until `woken` fires, the alarm, or the deadline.
    /// With `follow_lease`, news that the holder's lease ends sooner (from
    /// any waiter or hold of this process) wakes the sleeper early, and news
    /// that it ends later keeps it asleep: either way no waiter sleeps past
    /// the holder's lease as this process knows it. Waiters behind the head
    /// wake [`QUEUED_SLACK`] later, so the head's attempt usually brings the
    /// news.
    pub(super) async fn wait_for_wake_up(
        &self,
        mut woken: Pin<&mut Option<Notified<'_>>>,
        alarm: Alarm,
    ) {
        let Some(ticket) = &self.ticket else {
            return;
        };
        let deadline = self.deadline;
        loop {
            let changed = ticket.busy_changed();
            let slack = if ticket.is_head() {
                Duration::ZERO
            } else {
                QUEUED_SLACK
            };
            let news = |t: &WaitTicket| t.busy_until().filter(|_| alarm.follow_lease);
            let lease_end = news(ticket).map_or(alarm.fallback, |u| u + slack);
            let mut wake_at = deadline.map_or(lease_end, |d| d.min(lease_end));
            if let Some(refresh) = alarm.refresh_at {
                wake_at = wake_at.min(refresh);
            }
            tokio::select! {
                _ = async { if let Some(w) = woken.as_mut().as_pin_mut() { w.await } } => return,
                () = changed, if alarm.follow_lease => {}
                () = tokio::time::sleep_until(wake_at) => {
                    let now = Instant::now();
                    let news_later = news(ticket).is_some_and(|u| u + slack > now);
                    let must_wake = deadline.is_some_and(|d| now >= d)
                        || alarm.refresh_at.is_some_and(|r| now >= r);
                    if must_wake || !news_later {
                        return;
                    }
                }
            }
        }
    }
}
