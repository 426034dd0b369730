//! Who is waiting for which lock, and how they are woken.
//!
//! A contended acquire registers here (one entry per key, shared by all local
//! waiters of that key) before it retries, then sleeps on the entry's `Notify`.
//! Wake-ups come from one place per backend: the Redis push handler when a
//! release message arrives on the key's channel, or the embedded backend when
//! it frees a lock. `notify_one` wakes the longest waiter only, so one release
//! sends one local contender to the backend instead of all of them.
//!
//! With Redis, the first local waiter of a key subscribes to the key's release
//! channel and the last one to leave unsubscribes. Both go through one ordered
//! queue (the subscription task in `backend/redis.rs`), so a subscribe and an
//! unsubscribe of the same channel can never overtake each other.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{mpsc, Notify};

/// What the subscription task is asked to do, in order.
#[derive(Debug)]
pub(crate) enum SubscriptionCommand {
    /// Subscribe to a channel, then mark the entry ready.
    Subscribe(String, Arc<KeyWaiters>),
    /// Unsubscribe from a channel nobody waits on any more.
    Unsubscribe(String),
}

/// The waiters of one key.
#[derive(Debug, Default)]
pub(crate) struct KeyWaiters {
    /// Woken once per release (and for everyone when the connection drops).
    pub(crate) wake: Notify,
    ready: AtomicBool,
    ready_changed: Notify,
}

impl KeyWaiters {
    /// Marks the subscription as active (or as failed: waiters then fall back
    /// to the holder's TTL, which is slower but still correct).
    pub(crate) fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
        self.ready_changed.notify_waiters();
    }

    async fn ready(&self) {
        loop {
            let changed = self.ready_changed.notified();
            if self.ready.load(Ordering::Acquire) {
                return;
            }
            changed.await;
        }
    }
}

/// The waiters of one key: the shared entry and the owner scope of each.
#[derive(Debug)]
struct Registered {
    entry: Arc<KeyWaiters>,
    owners: Vec<u64>,
}

/// Registry of waiting keys for one runtime.
#[derive(Debug)]
pub(crate) struct Waiters {
    keys: Mutex<HashMap<String, Registered>>,
    subscriptions: Option<mpsc::UnboundedSender<SubscriptionCommand>>,
}

impl Waiters {
    /// A registry; `subscriptions` is the queue of the Redis subscription task,
    /// or `None` for the embedded backend, which wakes waiters directly.
    pub(crate) fn new(
        subscriptions: Option<mpsc::UnboundedSender<SubscriptionCommand>>,
    ) -> Arc<Self> {
        Arc::new(Waiters {
            keys: Mutex::new(HashMap::new()),
            subscriptions,
        })
    }

    /// Registers one waiter of owner scope `owner` on `channel`; the first
    /// one subscribes.
    pub(crate) fn register(self: &Arc<Self>, channel: String, owner: u64) -> WaitTicket {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = match keys.get_mut(&channel) {
            Some(registered) => {
                registered.owners.push(owner);
                registered.entry.clone()
            }
            None => {
                let entry = Arc::new(KeyWaiters::default());
                keys.insert(
                    channel.clone(),
                    Registered {
                        entry: entry.clone(),
                        owners: vec![owner],
                    },
                );
                let queued = self.subscriptions.as_ref().is_some_and(|tx| {
                    tx.send(SubscriptionCommand::Subscribe(
                        channel.clone(),
                        entry.clone(),
                    ))
                    .is_ok()
                });
                if !queued {
                    entry.set_ready();
                }
                entry
            }
        };
        WaitTicket {
            waiters: self.clone(),
            channel,
            entry,
            owner,
        }
    }

    /// Wakes the longest-waiting local waiter of `channel`, if any.
    pub(crate) fn wake_one(&self, channel: &str) {
        let keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(registered) = keys.get(channel) {
            registered.entry.wake.notify_one();
        }
    }

    /// Wakes the waiters of `channel` when one of them belongs to `owner`,
    /// which has just taken the key and can be re-entered now. Waiters of
    /// other owners are woken too (one `Notify`), but only in that rare case.
    pub(crate) fn wake_owner(&self, channel: &str, owner: u64) {
        let keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(registered) = keys.get(channel) {
            if registered.owners.contains(&owner) {
                registered.entry.wake.notify_waiters();
            }
        }
    }

    /// Wakes every waiter of every key: messages may have been missed (the
    /// connection dropped), so everybody retries once.
    pub(crate) fn wake_all(&self) {
        let keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        for registered in keys.values() {
            registered.entry.wake.notify_waiters();
            registered.entry.wake.notify_one();
        }
    }

    /// Whether anybody waits on `channel` now.
    pub(crate) fn is_waiting(&self, channel: &str) -> bool {
        self.keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(channel)
    }

    /// Number of keys with at least one local waiter.
    pub(crate) fn waiting_keys(&self) -> usize {
        self.keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    fn unregister(&self, channel: &str, owner: u64) {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(registered) = keys.get_mut(channel) else {
            return;
        };
        if let Some(at) = registered.owners.iter().position(|o| *o == owner) {
            registered.owners.swap_remove(at);
        }
        if !registered.owners.is_empty() {
            return;
        }
        if let Some((channel, _)) = keys.remove_entry(channel) {
            if let Some(tx) = &self.subscriptions {
                let _ = tx.send(SubscriptionCommand::Unsubscribe(channel));
            }
        }
    }
}

/// One waiter's registration; unregisters on drop (also when the waiting
/// future is cancelled).
#[derive(Debug)]
pub(crate) struct WaitTicket {
    waiters: Arc<Waiters>,
    channel: String,
    entry: Arc<KeyWaiters>,
    owner: u64,
}

impl WaitTicket {
    /// The shared entry of this key.
    pub(crate) fn entry(&self) -> &Arc<KeyWaiters> {
        &self.entry
    }

    /// Resolves once the key's release channel is subscribed.
    pub(crate) async fn ready(&self) {
        self.entry.ready().await;
    }
}

impl Drop for WaitTicket {
    fn drop(&mut self) {
        self.waiters.unregister(&self.channel, self.owner);
    }
}
