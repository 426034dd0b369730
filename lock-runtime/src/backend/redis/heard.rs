//! What the server said about each release channel, read from its pushes by
//! the channel's name: the subscription task counts a subscribe as made only
//! once the server confirmed that very channel.
//!
//! Why not trust the subscribe command's reply: redis-rs pairs the replies
//! of (un)subscribe commands with the commands in flight by order, and on a
//! Redis Cluster two things put confirmations on a node's connection that no
//! command of ours asked for. A node that gives a slot away sends its
//! subscribers an `SUNSUBSCRIBE` of the slot's channels by itself, and the
//! cluster client's own re-subscriptions send one command for several
//! channels, which the node answers once per channel. Either way a stray
//! confirmation is taken as the reply of the next subscribe in flight on that
//! connection, which then reports success although the node may have refused
//! it (`MOVED`, in a reply nobody reads any more): the runtime stayed deaf to
//! the channel, and its waiters slept until the holder's lease ended
//! (`tests/tests/cluster.rs`). Every confirmation also reaches the
//! push handler, with the channel it is about; that is what is believed here.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use tokio::sync::Notify;

/// The last word heard from the server about each followed channel.
#[derive(Debug, Default)]
pub(super) struct Heard {
    said: Mutex<Said>,
    changed: Notify,
}

#[derive(Debug, Default)]
struct Said {
    /// Counts what was heard about any followed channel: marks are
    /// compared with it.
    count: u64,
    /// Per followed channel: when it was last heard of (a `count`), and
    /// whether that was a confirmation (`true`) or an unsubscribe.
    channels: HashMap<String, (u64, bool)>,
}

impl Heard {
    fn said(&self) -> std::sync::MutexGuard<'_, Said> {
        self.said.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Follows `channel` (it is about to be subscribed) and returns the mark
    /// that [`Heard::confirmed`] needs a confirmation after.
    pub(super) fn follow(&self, channel: &str) -> u64 {
        let mut said = self.said();
        let count = said.count;
        said.channels
            .entry(channel.to_owned())
            .or_insert((count, false));
        count
    }

    /// Stops following `channel` (nobody waits on it any more), so that the
    /// table holds only wanted channels.
    pub(super) fn forget(&self, channel: &str) {
        self.said().channels.remove(channel);
    }

    /// The push handler heard the server confirm (`subscribed`) or end a
    /// subscription to `channel`. Channels nobody follows are ignored.
    pub(super) fn heard(&self, channel: &str, subscribed: bool) {
        let mut said = self.said();
        let count = said.count + 1;
        if let Some(last) = said.channels.get_mut(channel) {
            *last = (count, subscribed);
            said.count = count;
            drop(said);
            self.changed.notify_waiters();
        }
    }

    /// Whether the last word on `channel` is a confirmation heard after
    /// `mark`.
    fn is_confirmed(&self, channel: &str, mark: u64) -> bool {
        self.said()
            .channels
            .get(channel)
            .is_some_and(|&(at, subscribed)| subscribed && at > mark)
    }

    /// Waits until the server confirmed `channel` after `mark` (the caller
    /// bounds the wait).
    pub(super) async fn confirmed(&self, channel: &str, mark: u64) {
        loop {
            // Created before the check: a confirmation heard in between
            // still wakes it.
            let changed = self.changed.notified();
            if self.is_confirmed(channel, mark) {
                return;
            }
            changed.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Heard;

    #[test]
    fn only_a_confirmation_after_the_mark_with_no_unsubscribe_since_counts() {
        let heard = Heard::default();
        heard.heard("c", true);
        let mark = heard.follow("c");
        assert!(!heard.is_confirmed("c", mark), "nothing heard yet");
        heard.heard("other", true);
        assert!(!heard.is_confirmed("c", mark), "another channel's word");
        heard.heard("c", true);
        assert!(heard.is_confirmed("c", mark));
        heard.heard("c", false);
        assert!(!heard.is_confirmed("c", mark), "unsubscribed since");
        let again = heard.follow("c");
        heard.heard("c", true);
        assert!(heard.is_confirmed("c", again));
        heard.forget("c");
        assert!(!heard.is_confirmed("c", again), "forgotten");
    }
}
