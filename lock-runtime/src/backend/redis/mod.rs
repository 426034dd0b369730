//! The Redis backend: scripts, one connection, pub/sub wake-ups, background releases.
//!
//! One multiplexed connection (a redis-rs `ConnectionManager`, RESP3) carries
//! everything: script calls, pipelined renewals, and the release channels'
//! messages, which arrive as RESP3 pushes and are handed to the waiters
//! registry. The manager reconnects by itself and re-subscribes the channels;
//! when it reports a disconnection every waiter is woken to retry at once,
//! since a release message may have been lost with the connection.
//!
//! Scripts are loaded at start-up and called by SHA (`EVALSHA`); when the server
//! answers `NOSCRIPT` (it restarted, or its script cache was flushed) the call
//! falls back to `EVAL` with the source, which caches it again. Keys and
//! values always travel as KEYS/ARGV, never spliced into script text.
//!
//! Two small tasks run on the runtime's worker thread: the subscription task
//! (subscribe/unsubscribe in order; a subscribe counts once the server's
//! confirmation of its channel was heard among the pushes, `heard.rs`) and
//! the releaser, which sends the releases queued by dropped guards and
//! cancelled acquires, pipelined.

mod conn;
mod connect;
mod heard;
mod recorded;
pub(super) mod scripts;
mod tasks;

use std::sync::Arc;
use std::time::Duration;

use redis::{RedisError, RedisResult};

use conn::Con;
pub(crate) use connect::{connect, connect_cluster};
use scripts::{by_sha, eval, is_noscript, Scripts};

use super::releases::{PendingReleases, ReleaseQueue};
use super::{Acquire, PlaceRefresh, Queue, Recorded, Refreshed, Release, QUEUE_ENTRY_LIFE};
use crate::backend::{Ask, Holding, Published};
use crate::error::BackendError;
use crate::held::HeldLock;
use crate::mode::LockMode;
use crate::names::LockNames;

/// Handle to the Redis backend of one runtime (cheap to clone).
#[derive(Clone)]
pub(crate) struct RedisBackend {
    pub(crate) con: Con,
    scripts: Arc<Scripts>,
    releases: ReleaseQueue,
    endpoint: Arc<str>,
    /// The fence counter's TTL in ms: how long a token is kept after it was
    /// issued (the scripts' ARGV).
    window: Arc<str>,
    /// Tokens reserved with each acquisition for local holders (the
    /// scripts' ARGV; see `cohort.rs`).
    reserve: Arc<str>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

fn ms(d: Duration) -> String {
    d.as_millis().max(1).to_string()
}

/// Redlock's boot-marker check, run by `redlock_boot_check.lua` ahead of
/// `acquire.lua` on one master, in the same call as the acquire (KEYS[3],
/// ARGV[5..7]; the script says why).
#[derive(Clone, Copy, Debug)]
pub(crate) struct BootCheck<'a> {
    /// The marker's name (`<prefix>redlock:boot`).
    pub(crate) marker: &'a str,
    /// How long a master found to have lost its data takes no new hold.
    pub(crate) quarantine: Duration,
    /// The longest TTL the caller knows any master gave (the `lease` of a
    /// marker created now).
    pub(crate) longest: Duration,
    /// A retake by a holder a majority just renewed: taken even while the
    /// master is quarantined.
    pub(crate) retake: bool,
}

/// What one master answered a Redlock acquire ([`RedisBackend::acquire_checked`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Vote {
    /// Held or busy, as a plain acquire answers.
    Acquire(Acquire),
    /// The master lost its data less than a quarantine ago: it takes no new
    /// hold for `left` more. `found`: this call found the marker missing.
    Quarantined {
        /// Until the quarantine ends.
        left: Duration,
        /// The marker was missing (created by this call).
        found: bool,
    },
}

/// A master's [`Vote`], and the longest TTL its marker records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ballot {
    /// What it said.
    pub(crate) vote: Vote,
    /// The `lease` of its boot marker: the longest TTL it gave a hold.
    pub(crate) longest: Duration,
}

/// The acquire script's `{held, n, upto}` as an [`Acquire`]: held (1, or 2
/// for a fair handoff) with token `n` and the tokens up to `upto` reserved
/// for local holders, or busy for `n` ms (negative: no expiry).
fn decode_acquire(held: i64, n: i64, upto: Option<i64>) -> Acquire {
    if held == 1 || held == 2 {
        let fence = u64::try_from(n).unwrap_or(0);
        Acquire::Held {
            fence,
            upto: upto
                .and_then(|u| u64::try_from(u).ok())
                .map_or(fence, |u| u.max(fence)),
            handed: held == 2,
        }
    } else {
        Acquire::Busy {
            ttl: u64::try_from(n).ok().map(Duration::from_millis),
        }
    }
}

/// A non-negative number of ms from a script's reply (negative: zero).
fn millis(n: i64) -> Duration {
    Duration::from_millis(u64::try_from(n).unwrap_or(0))
}

impl RedisBackend {
    /// `source` as a [`BackendError`]: `NOPERM` (an ACL user without the
    /// key pattern, channel or command) is a refusal for good.
    pub(crate) fn failed(&self, what: &str, source: RedisError) -> BackendError {
        let denied = source.code() == Some("NOPERM");
        BackendError::new(format!("{what} on Redis at {}", self.endpoint), source).denied_if(denied)
    }

    /// `host:port` of the server (no credentials).
    pub(crate) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// One acquire attempt: `acquire.lua` (plain), `read.lua` (a plain read
    /// hold) or `fair.lua` (fair, either mode).
    pub(crate) async fn acquire(&self, ask: Ask<'_>) -> Result<Acquire, BackendError> {
        let (lock_key, holder, queue, mode) = (ask.lock_key, ask.holder, ask.queue, ask.mode);
        let lease = ask.lease;
        let fence_key = LockNames::fence(lock_key);
        let lease = ms(lease);
        let mut con = self.con.clone();
        // (The caller boxes this whole future, so it stays out of the state of
        // every waiting acquire.)
        let reply: RedisResult<Vec<i64>> = if queue != Queue::No {
            self.acquire_fair(&mut con, lock_key, holder, &lease, queue, mode)
                .await
        } else if mode.is_read() {
            eval(
                &mut con,
                &self.scripts.read,
                &[lock_key, &fence_key],
                &[holder, &lease, &self.window],
            )
            .await
        } else {
            eval(
                &mut con,
                &self.scripts.acquire,
                &[lock_key, &fence_key],
                &[holder, &lease, &self.window, &self.reserve],
            )
            .await
        };
        let reply = reply.map_err(|e| self.failed("acquire failed", e))?;
        match reply[..] {
            [held, n, ..] => Ok(decode_acquire(held, n, reply.get(2).copied())),
            _ => Err(BackendError::msg(format!(
                "acquire failed on Redis at {}: unexpected reply {reply:?}",
                self.endpoint
            ))),
        }
    }

    /// Redlock's acquire on this master: `acquire.lua` (plain mode) with the
    /// master's boot marker checked in the same call (`check`), so that a
    /// master that lost its data refuses new holds without a round trip more.
    pub(crate) async fn acquire_checked(
        &self,
        lock_key: &str,
        holder: &str,
        lease: Duration,
        check: BootCheck<'_>,
    ) -> Result<Ballot, BackendError> {
        let fence_key = LockNames::fence(lock_key);
        let (lease, quarantine, longest) = (ms(lease), ms(check.quarantine), ms(check.longest));
        let retake = if check.retake { "1" } else { "0" };
        let mut con = self.con.clone();
        // (No tokens reserved: Redlock passes nothing locally.)
        let reply: Vec<i64> = eval(
            &mut con,
            &self.scripts.acquire,
            &[lock_key, &fence_key, check.marker],
            &[
                holder,
                &lease,
                &self.window,
                "0",
                &quarantine,
                &longest,
                retake,
            ],
        )
        .await
        .map_err(|e| self.failed("acquire failed", e))?;
        let [code, n, upto, recorded] = reply[..] else {
            return Err(BackendError::msg(format!(
                "acquire failed on Redis at {}: unexpected reply {reply:?}",
                self.endpoint
            )));
        };
        let vote = match code {
            -1 | -2 => Vote::Quarantined {
                left: millis(n),
                found: code == -2,
            },
            held => Vote::Acquire(decode_acquire(held, n, Some(upto))),
        };
        Ok(Ballot {
            vote,
            longest: millis(recorded),
        })
    }

    /// The fair mode's acquire script (see `scripts/fair.lua`).
    async fn acquire_fair(
        &self,
        con: &mut Con,
        lock_key: &str,
        holder: &str,
        lease: &str,
        queue: Queue,
        mode: LockMode,
    ) -> RedisResult<Vec<i64>> {
        let (join, handoff_lease) = match queue {
            Queue::Join(lease) => ("1", ms(lease)),
            _ => ("0", "0".to_owned()),
        };
        // (A reader reserves no tokens: read holds never pass between tasks.)
        let (reserve, mode) = if mode.is_read() {
            ("0", "r")
        } else {
            (&*self.reserve, "w")
        };
        let args = [
            "acquire",
            holder,
            lease,
            join,
            &ms(QUEUE_ENTRY_LIFE),
            &LockNames::channel(lock_key),
            &handoff_lease,
            &self.window,
            reserve,
            mode,
        ];
        by_sha(con, |sha| self.scripts.fair(sha, lock_key, &args)).await
    }

    pub(crate) async fn release(&self, hold: Holding<'_>) -> Result<Release, BackendError> {
        let (lock_key, holder, fair) = (hold.lock_key, hold.holder, hold.fair);
        let mut con = self.con.clone();
        let left: i64 = by_sha(&mut con, |sha| {
            self.scripts
                .release(sha, lock_key, holder, fair, &self.window)
        })
        .await
        .map_err(|e| self.failed("release failed", e))?;
        Ok(match left {
            0 => Release::Freed,
            n if n > 0 => Release::StillHeld,
            _ => Release::NotHeld,
        })
    }

    /// `holder`'s write hold becomes a read hold: `downgrade.lua` (plain),
    /// or `fair.lua`'s downgrade, which also lets in the readers first in
    /// the key's queue; `false` when the hash does not record it.
    pub(crate) async fn downgrade(&self, hold: Holding<'_>) -> Result<bool, BackendError> {
        let (lock_key, holder, fair) = (hold.lock_key, hold.holder, hold.fair);
        let channel = LockNames::channel(lock_key);
        let mut con = self.con.clone();
        let done: i64 = by_sha(&mut con, |sha| {
            if fair {
                let args = ["downgrade", holder, &channel, &self.window];
                self.scripts.fair(sha, lock_key, &args)
            } else {
                self.scripts
                    .downgrade
                    .call(sha, &[lock_key], &[holder, &channel])
            }
        })
        .await
        .map_err(|e| self.failed("downgrade failed", e))?;
        Ok(done == 1)
    }

    pub(crate) async fn ping(&self) -> Result<(), BackendError> {
        let mut con = self.con.clone();
        let _: String = redis::cmd("PING")
            .query_async(&mut con)
            .await
            .map_err(|e| self.failed("PING failed", e))?;
        Ok(())
    }

    /// Writes the identity `key` (`who.rs`) with its TTL: one `SET … PX`.
    pub(crate) async fn publish_identity(&self, it: Published<'_>) -> Result<(), BackendError> {
        let mut con = self.con.clone();
        redis::cmd("SET")
            .arg(it.key)
            .arg(it.value)
            .arg("PX")
            .arg(ms(it.ttl))
            .query_async::<()>(&mut con)
            .await
            .map_err(|e| self.failed("publishing this runtime's identity failed", e))
    }

    /// Reads an identity (`GET`).
    pub(crate) async fn read_identity(&self, key: &str) -> Result<Option<String>, BackendError> {
        let mut con = self.con.clone();
        redis::cmd("GET")
            .arg(key)
            .query_async(&mut con)
            .await
            .map_err(|e| self.failed("reading a runtime's identity failed", e))
    }

    /// `WAIT replicas timeout`: how many replicas acknowledged every write
    /// sent on this connection so far (Sentinel's `sync_replicas`). It
    /// blocks the connection until then: send it on one of its own.
    pub(crate) async fn wait_for_replicas(
        &self,
        replicas: u32,
        timeout: Duration,
    ) -> Result<u32, BackendError> {
        let mut con = self.con.clone();
        redis::cmd("WAIT")
            .arg(replicas)
            .arg(ms(timeout))
            .query_async(&mut con)
            .await
            .map_err(|e| self.failed("WAIT for replicas failed", e))
    }

    pub(crate) async fn inspect(&self, lock_key: &str) -> Result<Option<Recorded>, BackendError> {
        let queue = LockNames::queue(lock_key);
        let mut con = self.con.clone();
        let (fields, pttl, queued, now): (Vec<String>, i64, Vec<String>, i64) =
            eval(&mut con, &self.scripts.inspect, &[lock_key, &queue], &[])
                .await
                .map_err(|e| self.failed("inspect failed", e))?;
        Ok(recorded::decode(&fields, pttl, queued, now))
    }

    pub(crate) async fn force_unlock(&self, lock_key: &str) -> Result<bool, BackendError> {
        let channel = LockNames::channel(lock_key);
        let mut con = self.con.clone();
        let deleted: i64 = eval(
            &mut con,
            &self.scripts.force_unlock,
            &[lock_key],
            &[&channel],
        )
        .await
        .map_err(|e| self.failed("force unlock failed", e))?;
        Ok(deleted == 1)
    }

    /// Whether this backend talks to a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        self.con.is_cluster()
    }

    pub(crate) fn pending(&self) -> &PendingReleases {
        self.releases.pending()
    }

    pub(crate) fn release_in_background(&self, lock_key: String, holder: String, fair: bool) {
        if !self.releases.send(lock_key, holder, fair) {
            // The runtime is shutting down; the lease frees the lock.
            tracing::debug!("lock runtime stopped; a lock will be freed by its lease");
        }
    }

    /// See `Backend::renewal_batches`: per slot on a cluster.
    pub(crate) fn renewal_batches(
        &self,
        due: &[Arc<HeldLock>],
        most: usize,
    ) -> Vec<Vec<Arc<HeldLock>>> {
        let groups = self
            .con
            .slot_groups(due.iter().map(|l| l.lock_key.as_str()));
        groups
            .iter()
            .flat_map(|group| group.chunks(most))
            .map(|chunk| chunk.iter().map(|&i| due[i].clone()).collect())
            .collect()
    }

    /// Refreshes fair places: one `refresh.lua` per slot group (one group on
    /// a single server), the groups pipelined per node.
    pub(crate) async fn refresh_places(
        &self,
        batch: &[PlaceRefresh],
    ) -> Result<Vec<Option<Refreshed>>, BackendError> {
        let slots = self
            .con
            .slot_groups(batch.iter().map(|p| p.lock_key.as_str()));
        let groups: Vec<Vec<&PlaceRefresh>> = slots
            .iter()
            .map(|group| group.iter().map(|&i| &batch[i]).collect())
            .collect();
        let life = ms(QUEUE_ENTRY_LIFE);
        let mut by_sha = true;
        loop {
            let replies: Vec<RedisResult<Vec<i64>>> = self
                .con
                .pipelined(&groups, |group| {
                    self.scripts.refresh(by_sha, group, &life, &self.reserve)
                })
                .await
                .map_err(|e| self.failed("fair place refresh failed", e))?;
            if by_sha && replies.iter().any(|r| r.as_ref().is_err_and(is_noscript)) {
                by_sha = false;
                continue;
            }
            let mut outcome = vec![None; batch.len()];
            for (indices, reply) in slots.iter().zip(replies) {
                let reply = reply.ok().unwrap_or_default();
                for (k, &i) in indices.iter().enumerate() {
                    if let (Some(queued), Some(ttl)) = (reply.get(2 * k), reply.get(2 * k + 1)) {
                        outcome[i] = Some(Refreshed {
                            queued: *queued == 1,
                            lock_ttl: *ttl,
                        });
                    }
                }
            }
            return Ok(outcome);
        }
    }

    pub(crate) async fn renew_many(
        &self,
        batch: &[Arc<HeldLock>],
    ) -> Result<Vec<Option<bool>>, BackendError> {
        let mut by_sha = true;
        loop {
            let replies: Vec<RedisResult<i64>> = self
                .con
                .pipelined(batch, |lock| {
                    let lease = ms(lock.lease);
                    self.scripts
                        .renew
                        .call(by_sha, &[&lock.lock_key], &[&lock.holder, &lease])
                })
                .await
                .map_err(|e| self.failed("renewal failed", e))?;
            if by_sha && replies.iter().any(|r| r.as_ref().is_err_and(is_noscript)) {
                by_sha = false;
                continue;
            }
            return Ok(replies
                .into_iter()
                .map(|r| r.ok().map(|n| n == 1))
                .collect());
        }
    }
}
