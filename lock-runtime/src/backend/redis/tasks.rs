//! The Redis backend's two tasks on the runtime's worker thread: the
//! subscription task (subscribe and unsubscribe release channels, in order)
//! and the releaser (releases nobody awaits, pipelined).

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::RedisResult;
use tokio::sync::mpsc;

use super::scripts::{is_noscript, Scripts};
use crate::backend::releases::{PendingReleases, ReleaseJob};
use crate::backend::Watched;

/// What the subscription task is asked to do, in order.
#[derive(Debug)]
pub(super) enum SubscriptionCommand {
    /// Subscribe to a channel, then mark its waiters ready (also when that
    /// fails: the task sends it again later, while they still wait).
    Subscribe(String, Arc<dyn Watched>),
    /// Unsubscribe from a channel nobody waits on any more.
    Unsubscribe(String),
}

/// Pause before a failed subscribe is sent again (doubling up to the max).
const RESUBSCRIBE_MIN: Duration = Duration::from_millis(50);
const RESUBSCRIBE_MAX: Duration = Duration::from_secs(1);

/// Subscribes and unsubscribes release channels, in the order asked. A
/// subscribe that fails is queued again after a pause, for as long as its
/// key has waiters (the queue keeps it in order with that key's unsubscribe:
/// an entry that closed meanwhile is skipped); when a retry goes through, the
/// key's head waiter is woken, as a release may have gone unheard. `again`
/// is weak, so the task ends once the backend's watches are dropped (a
/// Sentinel failover drops the old primary's backend).
pub(super) async fn subscriptions(
    mut con: ConnectionManager,
    mut commands: mpsc::UnboundedReceiver<SubscriptionCommand>,
    again: mpsc::WeakUnboundedSender<SubscriptionCommand>,
) {
    let mut backoff: std::collections::HashMap<String, Duration> = Default::default();
    while let Some(command) = commands.recv().await {
        match command {
            SubscriptionCommand::Subscribe(channel, entry) => {
                if entry.is_closed() {
                    backoff.remove(&channel);
                    continue;
                }
                match con.subscribe(&channel).await {
                    Ok(()) => {
                        if backoff.remove(&channel).is_some() {
                            entry.wake_first();
                        }
                        entry.set_ready();
                    }
                    Err(error) => {
                        tracing::debug!(%error, "subscribe failed; trying again");
                        let pause = backoff
                            .get(&channel)
                            .map_or(RESUBSCRIBE_MIN, |p| (*p * 2).min(RESUBSCRIBE_MAX));
                        backoff.insert(channel.clone(), pause);
                        // Waiters fall back to the holder's lease meanwhile.
                        entry.set_ready();
                        let again = again.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(pause).await;
                            if let Some(again) = again.upgrade() {
                                let _ = again.send(SubscriptionCommand::Subscribe(channel, entry));
                            }
                        });
                    }
                }
            }
            SubscriptionCommand::Unsubscribe(channel) => {
                if let Err(error) = con.unsubscribe(&channel).await {
                    tracing::debug!(%error, "unsubscribe failed");
                }
            }
        }
    }
}

/// Most releases sent in one pipeline.
const RELEASE_BATCH: usize = 512;
/// Attempts per release batch before leaving the locks to their leases.
const RELEASE_ATTEMPTS: u32 = 3;

/// Sends queued releases, pipelined, retrying a failing batch a few times.
pub(super) async fn releaser(
    mut con: ConnectionManager,
    scripts: Arc<Scripts>,
    window: Arc<str>,
    mut jobs: mpsc::UnboundedReceiver<ReleaseJob>,
    pending: Arc<PendingReleases>,
) {
    let mut batch = Vec::with_capacity(RELEASE_BATCH);
    while jobs.recv_many(&mut batch, RELEASE_BATCH).await > 0 {
        let mut by_sha = true;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut pipe = redis::pipe();
            for (lock_key, holder, fair) in &batch {
                pipe.add_command(scripts.release(by_sha, lock_key, holder, *fair, &window));
            }
            let outcome: RedisResult<Vec<RedisResult<i64>>> =
                pipe.ignore_errors().query_async(&mut con).await;
            match outcome {
                Ok(replies)
                    if by_sha && replies.iter().any(|r| r.as_ref().is_err_and(is_noscript)) =>
                {
                    by_sha = false;
                }
                Ok(_) => break,
                Err(error) if attempt < RELEASE_ATTEMPTS => {
                    tracing::debug!(%error, "background release failed; retrying");
                    tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
                }
                Err(error) => {
                    tracing::warn!(
                        %error,
                        locks = batch.len(),
                        "background release failed; the locks will be freed by their leases"
                    );
                    break;
                }
            }
        }
        pending.done(batch.iter().map(|(lock_key, _, _)| lock_key.as_str()));
        batch.clear();
    }
}
