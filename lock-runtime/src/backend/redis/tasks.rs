//! The Redis backend's two tasks on the runtime's worker thread: the
//! subscription task (subscribe and unsubscribe release channels, in order)
//! and the releaser (releases nobody awaits, pipelined).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redis::RedisResult;
use tokio::sync::mpsc;

use super::conn::Con;
use super::heard::Heard;
use super::scripts::{is_noscript, Scripts};
use crate::backend::releases::{PendingReleases, ReleaseJob, ReleaseOutage};
use crate::backend::Watched;

/// What the subscription task is asked to do, in order.
#[derive(Debug)]
pub(super) enum SubscriptionCommand {
    /// Subscribe to a channel, then mark its waiters ready (also when that
    /// fails: the task sends it again later, while they still wait).
    Subscribe(String, Arc<dyn Watched>),
    /// Unsubscribe from a channel nobody waits on any more.
    Unsubscribe(String),
    /// The server dropped this subscription (a cluster node gave the
    /// channel's slot away): subscribe again if it is still wanted.
    Resubscribe(String),
    /// A connection dropped: subscribe again to every wanted channel, now
    /// and (`again`) once more a moment later. The redis-rs clients
    /// re-subscribe by themselves too, but the cluster client was seen to
    /// lose the subscriptions when they went out while the node's new
    /// connection was being set up (`tests/tests/cluster.rs`); subscribing
    /// twice is harmless.
    ResubscribeAll {
        /// Send every subscription once more after [`RESUBSCRIBE_AGAIN`].
        again: bool,
    },
}

/// When the subscriptions are sent once more after a dropped connection.
const RESUBSCRIBE_AGAIN: Duration = Duration::from_millis(500);

/// How long the subscription task waits for one unsubscribe and one
/// subscribe before going on to the next key (a subscribe that timed out
/// is retried like a failed one).
const UNSUBSCRIBE_LIMIT: Duration = Duration::from_millis(200);
const SUBSCRIBE_LIMIT: Duration = Duration::from_secs(1);

/// How long after a subscribe's reply the server's confirmation of the
/// channel may still come (see `heard.rs`). It normally comes with the
/// reply; when a stray confirmation was taken for the reply, the true one
/// follows within a round trip, or never (the subscribe was refused): the
/// subscribe is then retried like a failed one.
const CONFIRM_LIMIT: Duration = Duration::from_millis(200);

/// Pause before a failed subscribe is sent again (doubling up to the max).
const RESUBSCRIBE_MIN: Duration = Duration::from_millis(50);
const RESUBSCRIBE_MAX: Duration = Duration::from_secs(1);

/// Subscribes and unsubscribes release channels, in the order asked. A
/// subscribe counts as made when the server confirmed its channel
/// (`heard`), not when redis-rs reports its reply. A subscribe that fails
/// is queued again after a pause, for as long as its key has waiters (the
/// queue keeps it in order with that key's unsubscribe: an entry that closed
/// meanwhile is skipped); when a retry goes through, the key's head waiter
/// is woken, as a release may have gone unheard. The same holds for a
/// subscription the server dropped: it is made again, and the head waiter
/// woken.
pub(super) async fn subscriptions(
    mut con: Con,
    heard: Arc<Heard>,
    mut commands: mpsc::UnboundedReceiver<SubscriptionCommand>,
    again: mpsc::WeakUnboundedSender<SubscriptionCommand>,
) {
    let mut backoff: HashMap<String, Duration> = HashMap::new();
    let mut wanted: HashMap<String, Arc<dyn Watched>> = HashMap::new();
    while let Some(command) = commands.recv().await {
        let (channel, entry) = match command {
            SubscriptionCommand::Subscribe(channel, entry) => (channel, entry),
            SubscriptionCommand::Resubscribe(channel) => match wanted.get(&channel) {
                // A gap in the subscription: treat it like a failed one, so
                // the head waiter is woken once it is back.
                Some(entry) => {
                    backoff.entry(channel.clone()).or_insert(Duration::ZERO);
                    (channel, entry.clone())
                }
                None => continue,
            },
            SubscriptionCommand::ResubscribeAll { again: later } => {
                for channel in wanted.keys() {
                    send(&again, SubscriptionCommand::Resubscribe(channel.clone()));
                }
                if later {
                    let again = again.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(RESUBSCRIBE_AGAIN).await;
                        send(&again, SubscriptionCommand::ResubscribeAll { again: false });
                    });
                }
                continue;
            }
            SubscriptionCommand::Unsubscribe(channel) => {
                wanted.remove(&channel);
                heard.forget(&channel);
                // Bounded: on a cluster, a frozen master must not hold up the
                // subscriptions of keys on the others. An unsubscribe that
                // did not go through only leaves messages nobody reads.
                match tokio::time::timeout(UNSUBSCRIBE_LIMIT, con.unsubscribe(&channel)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => tracing::debug!(%error, "unsubscribe failed"),
                    Err(_) => tracing::debug!("unsubscribe unanswered; going on"),
                }
                continue;
            }
        };
        if entry.is_closed() {
            backoff.remove(&channel);
            wanted.remove(&channel);
            heard.forget(&channel);
            continue;
        }
        wanted.insert(channel.clone(), entry.clone());
        match subscribe(&mut con, &heard, &channel).await {
            Ok(()) => {
                if backoff.remove(&channel).is_some() {
                    entry.wake_first();
                }
                entry.set_ready();
            }
            Err(error) => {
                tracing::debug!(%error, "subscribe failed; trying again");
                let pause = backoff.get(&channel).map_or(RESUBSCRIBE_MIN, |p| {
                    (*p * 2).clamp(RESUBSCRIBE_MIN, RESUBSCRIBE_MAX)
                });
                backoff.insert(channel.clone(), pause);
                // Waiters fall back to the holder's lease meanwhile.
                entry.set_ready();
                let again = again.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(pause).await;
                    send(&again, SubscriptionCommand::Subscribe(channel, entry));
                });
            }
        }
    }
}

/// Subscribes to `channel`, and waits for the server's confirmation of it
/// (see `heard.rs`), each bounded.
async fn subscribe(con: &mut Con, heard: &Heard, channel: &str) -> RedisResult<()> {
    let failed = |what| Err(redis::RedisError::from((redis::ErrorKind::Io, what)));
    let mark = heard.follow(channel);
    match tokio::time::timeout(SUBSCRIBE_LIMIT, con.subscribe(channel)).await {
        Err(_) => failed("subscribe unanswered"),
        Ok(Err(error)) => Err(error),
        Ok(Ok(())) => {
            match tokio::time::timeout(CONFIRM_LIMIT, heard.confirmed(channel, mark)).await {
                Ok(()) => Ok(()),
                Err(_) => failed("subscribe answered, but the server never confirmed the channel"),
            }
        }
    }
}

/// Queues `command` for the subscription task, unless the backend is gone
/// (nobody holds the strong sender any more: the task is ending).
pub(super) fn send(
    again: &mpsc::WeakUnboundedSender<SubscriptionCommand>,
    command: SubscriptionCommand,
) {
    if let Some(again) = again.upgrade() {
        let _ = again.send(command);
    }
}

/// Most releases sent in one pipeline.
const RELEASE_BATCH: usize = 512;
/// Attempts per release batch before leaving the locks to their leases.
const RELEASE_ATTEMPTS: u32 = 3;

/// Sends queued releases, pipelined, retrying a failing batch a few times.
pub(super) async fn releaser(
    con: Con,
    scripts: Arc<Scripts>,
    window: Arc<str>,
    mut jobs: mpsc::UnboundedReceiver<ReleaseJob>,
    pending: Arc<PendingReleases>,
) {
    let mut batch = Vec::with_capacity(RELEASE_BATCH);
    let outage = Arc::new(ReleaseOutage::default());
    while jobs.recv_many(&mut batch, RELEASE_BATCH).await > 0 {
        // Each batch on its own: a batch stuck on a frozen cluster master
        // must not hold back the releases that follow it
        // (`tests/tests/cluster.rs`). Holder ids are unique per hold,
        // so the order between batches does not matter.
        let batch = std::mem::replace(&mut batch, Vec::with_capacity(RELEASE_BATCH));
        let sending = release_batch(con.clone(), scripts.clone(), window.clone(), batch);
        let (pending, outage) = (pending.clone(), outage.clone());
        tokio::spawn(async move {
            match sending.await {
                Ok(batch) => {
                    outage.went_through();
                    pending.done(batch.iter().map(|(lock_key, _, _)| lock_key.as_str()));
                }
                Err((batch, error)) => {
                    outage.given_up(&error, batch.len(), &pending);
                    pending.given_up(batch.iter().map(|(lock_key, _, _)| lock_key.as_str()));
                }
            }
        });
    }
}

/// Sends one batch of releases, pipelined, retrying it a few times; returns
/// the batch once answered, or with the last error once given up (the
/// locks are then freed by their leases).
async fn release_batch(
    con: Con,
    scripts: Arc<Scripts>,
    window: Arc<str>,
    batch: Vec<ReleaseJob>,
) -> Result<Vec<ReleaseJob>, (Vec<ReleaseJob>, redis::RedisError)> {
    let mut by_sha = true;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let outcome: RedisResult<Vec<RedisResult<i64>>> = con
            .pipelined(&batch, |(lock_key, holder, fair)| {
                scripts.release(by_sha, lock_key, holder, *fair, &window)
            })
            .await;
        match outcome {
            Ok(replies) if by_sha && replies.iter().any(|r| r.as_ref().is_err_and(is_noscript)) => {
                by_sha = false;
            }
            Ok(_) => return Ok(batch),
            Err(error) if attempt < RELEASE_ATTEMPTS => {
                tracing::debug!(%error, "background release failed; retrying");
                tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
            }
            Err(error) => return Err((batch, error)),
        }
    }
}
