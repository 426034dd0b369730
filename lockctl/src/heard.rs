//! What a subscription to one lock hears ([`Heard`]), and the handle of a
//! watch task that forwards it ([`Stop`]). Its own module so that the
//! watches of `etcd.rs` and `zookeeper.rs` and the subscriptions of
//! `subscribe.rs` that start them share it without importing each other.

use tokio::sync::mpsc;

/// What arrives on the channel.
pub(crate) enum Heard {
    /// A release message, with its payload (`1`, `f` forced, `g …` handed
    /// over).
    Message(String),
    /// etcd, ZooKeeper: the lock's contenders changed (who, and whether
    /// it was a release, is for a new look to tell).
    #[cfg_attr(not(any(feature = "etcd", feature = "zookeeper")), allow(dead_code))]
    Changed,
    /// A connection was lost: releases may be missed from now on.
    Lost,
}

/// A task that forwards a watch's news; dropped, it stops.
pub(crate) struct Stop(tokio::task::JoinHandle<()>);

impl Stop {
    /// Stops `task` when dropped.
    #[cfg_attr(not(any(feature = "etcd", feature = "zookeeper")), allow(dead_code))]
    pub(crate) fn new(task: tokio::task::JoinHandle<()>) -> Stop {
        Stop(task)
    }
}

impl Drop for Stop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Passes `next` on to `heard`; `false` once the watch should end (it
/// heard a loss, or nobody listens any more).
#[cfg_attr(not(any(feature = "etcd", feature = "zookeeper")), allow(dead_code))]
pub(crate) fn pass_on(heard: &mpsc::UnboundedSender<Heard>, next: Heard) -> bool {
    let lost = matches!(next, Heard::Lost);
    heard.send(next).is_ok() && !lost
}
