//! Redlock: one lock over N independent Redis masters, held while a
//! majority (N/2+1) of them hold it.
//!
//! Why: a single Redis primary is a single point of failure, and a replica
//! promoted after it died may not have seen the last locks. Redlock needs
//! no replication: each master is a separate single-server backend (the
//! `redis` module's, with its own connection, scripts, release-channel
//! subscriptions and background releaser), and a lock counts as held when a
//! majority said yes within the lease. Any two majorities share a master,
//! and a master holds a key for one holder at a time, so two holders cannot
//! both have a majority while their leases run.
//!
//! **Acquire.** The acquire script runs on every master at once, each call
//! bounded by the response timeout (and checking the master's boot marker
//! in the same call, `boot.rs`), and the wait ends as soon as the
//! answers decide (a majority said held, or one can no longer be reached:
//! a frozen master must not slow every lock down). Each master is given the
//! lease plus the clock-drift allowance (`quorum::drift`: lease/100 + 2 ms),
//! and a majority that took longer than the lease minus that allowance
//! counts as a failure. So the hold's client-side end (the acquire's send
//! time plus the lease, which the watchdog enforces as for one server)
//! comes before any master of the majority lets the key go, even if its
//! clock runs up to 1 % fast. A failed attempt gives back what it took (in
//! the background, on the masters that said yes or did not answer) and
//! answers busy with the time until enough busy masters free up for a
//! majority (`quorum::busy_ttl`), or fails naming how many masters of how
//! many answered when fewer than a majority did.
//!
//! **Fencing token.** Each master answers `max(its counter + 1, its clock
//! in µs)` (`acquire.lua`); the hold's token is the largest of its
//! majority's, written back to those masters (`redlock_fence.lua` raises
//! each counter to it) before the acquire returns. The next holder's
//! majority shares a master with this one, whose counter is then at least
//! this token, so its token is larger: tokens only grow, whatever the
//! masters' clocks say. The limits are those of one server's counter, on
//! the master the two majorities share. The counter lives for the fence
//! window (60 s) after it was written, and then that master's clock must be
//! past the token: a master whose clock is behind the fastest master's by
//! more than the window may hand out a smaller token.
//!
//! **Masters that lose their data.** A master restarted empty has forgotten
//! its holds and counters; if it voted at once, it could be the one master
//! two majorities share, and neither exclusion nor growth would hold. So it
//! takes no new hold for the longest lease any master recorded (the Redlock
//! "delayed restart", done by the clients: `boot.rs`), and counts as busy
//! until then. A holder whose renewal a majority confirmed takes it back at
//! once (`renew.rs`).
//!
//! **Renew, release.** Both go to every master. A lock is renewed when a
//! majority renewed it, lost as soon as more than a minority said it is not
//! ours, and unknown otherwise (the watchdog retries until the lease end).
//! A master that said "not ours" while a majority renewed (it restarted
//! empty, or stayed frozen past the lease) gets the hold back at once.
//!
//! **Read-write locks.** A read hold is a majority of masters granting a
//! read (`read.lua` on each, behind the boot-marker check: `read.rs`), a
//! write hold a majority granting a write; a master grants a read only
//! while no write hold is there and a write only while nothing is, and any
//! two majorities share a master, so a reader and a writer never both
//! hold. A reader's token is written back like a writer's, into its own
//! `f:<holder>` field (`redlock_fence.lua`), and raises the same counters:
//! a writer's token exceeds every earlier reader's and writer's, a
//! reader's every earlier writer's. Renewals and releases need no mode
//! (each master's scripts go by what its hash records). A downgrade is
//! best effort per master and done on a majority: a master that missed it
//! still records our write hold, which keeps writers out as well, so the
//! hold stands while a majority records it in either mode. Plain only:
//! readers of other processes that overlap without a gap can keep a
//! writer out (there is no queue to stop them).
//!
//! **Fair mode** is refused: its queue and handoff live in one server's
//! lists and scripts, and independent masters would each hand the lock to a
//! different waiter.

mod acquire;
mod boot;
mod connect;
mod fence;
mod gather;
pub(crate) mod quorum;
mod read;
mod release;
mod renew;
mod watches;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::redis::{Ballot, BootCheck, RedisBackend, Vote};
use super::{Published, Recorded, Watches};
use crate::error::BackendError;
use gather::{gather, Call};

/// Why fair mode is refused (the builder's and a fair request's error).
pub(crate) const FAIR_UNSUPPORTED: &str =
    "fair mode is not supported on the Redlock backend (independent masters share no \
     queue): build with .fair(false) and do not set LOCK_FAIR=1 or `fair = true`";

/// The write-back of a hold's token (see the module docs).
const FENCE_SCRIPT: &str = include_str!("../../scripts/redlock_fence.lua");

/// Fewest masters accepted: with 1 or 2 a single failure stops every lock.
pub(crate) const MIN_MASTERS: usize = 3;

/// Pause before connecting again to a master that was down at start-up
/// (doubling up to [`RECONNECT_MAX`]).
const RECONNECT_MIN: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// A connected master: its single-server backend and its waiters' watches.
#[derive(Debug)]
pub(crate) struct Connected {
    backend: RedisBackend,
    watches: Arc<dyn Watches>,
}

/// One master: where it is, and its backend once connected.
#[derive(Debug)]
struct Master {
    /// `host:port` (no credentials).
    endpoint: String,
    slot: Arc<OnceLock<Connected>>,
}

/// Handle to the Redlock backend of one runtime (cheap to clone).
#[derive(Clone, Debug)]
pub(crate) struct Redlock {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    masters: Vec<Master>,
    quorum: usize,
    /// Bound of each master's answer (the response timeout).
    timeout: Duration,
    /// The fence counter's TTL in ms (the scripts' window).
    window: String,
    fence_script: redis::Script,
    /// A read hold's vote on one master (`read.rs`).
    read_script: redis::Script,
    /// Creates a master's boot marker (`boot.rs`).
    boot_script: redis::Script,
    /// The runtime's worker thread, where a failed attempt's undo runs.
    worker: tokio::runtime::Handle,
    /// Every master's boot marker (`<prefix>redlock:boot`, see `boot.rs`).
    marker: String,
    /// The longest TTL in ms this runtime knows any master gave a hold:
    /// its own, and what the masters' markers record (they answer it with
    /// every acquire). A master that lost its data sits it out.
    longest: AtomicU64,
}

/// Why one master failed, for a message that lists every master's reason
/// (without repeating the "lock backend error" prefix of each).
fn reason(error: &impl std::fmt::Display) -> String {
    let text = error.to_string();
    text.strip_prefix("lock backend error: ")
        .map_or(text.clone(), str::to_owned)
}

/// What one master answered (or why it did not).
type Answer<T> = Result<T, BackendError>;

/// Whole milliseconds of `d`, saturating.
fn whole_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Redlock {
    /// `"redlock over N masters (host:port, ...)"`: no credentials.
    pub(crate) fn describe(&self) -> String {
        let endpoints: Vec<&str> = self
            .inner
            .masters
            .iter()
            .map(|m| m.endpoint.as_str())
            .collect();
        format!(
            "redlock over {} masters ({})",
            endpoints.len(),
            endpoints.join(", ")
        )
    }

    fn masters(&self) -> usize {
        self.inner.masters.len()
    }

    /// Learns that a master gave (or records having given) a hold this TTL.
    fn learn(&self, ttl: Duration) {
        self.inner
            .longest
            .fetch_max(whole_ms(ttl), Ordering::Relaxed);
    }

    /// The longest TTL this runtime knows any master gave a hold.
    fn longest(&self) -> Duration {
        Duration::from_millis(self.inner.longest.load(Ordering::Relaxed))
    }

    /// The boot-marker check of an acquire (or, `retake`, a retake) that
    /// gives the masters `ttl`: a master found to have lost its data sits
    /// out the longest TTL known, this one included (`quorum::quarantine`).
    fn boot_check(&self, ttl: Duration, retake: bool) -> BootCheck<'_> {
        self.learn(ttl);
        let longest = self.longest();
        BootCheck {
            marker: &self.inner.marker,
            quarantine: quorum::quarantine(longest),
            longest,
            retake,
        }
    }

    /// Takes in master `i`'s ballot: the longest TTL its marker records,
    /// and a warning when this call found that the master lost its data.
    fn heard(&self, i: usize, ballot: &Ballot) {
        self.learn(ballot.longest);
        if let Vote::Quarantined { left, found: true } = ballot.vote {
            let endpoint = self
                .inner
                .masters
                .get(i)
                .map_or("?", |m| m.endpoint.as_str());
            tracing::warn!(
                master = endpoint,
                "Redlock: the master lost its data (restarted without it?); it takes no new \
                 lock for {left:?}, the longest lease it may have held"
            );
        }
    }

    /// One call per master in `which`, each bounded by the response timeout;
    /// a master not connected answers with an error at once.
    fn calls_on<'a, T, F, Fut>(
        &'a self,
        which: impl IntoIterator<Item = usize>,
        op: F,
    ) -> Vec<Call<'a, Answer<T>>>
    where
        T: Send + 'a,
        F: Fn(&'a RedisBackend) -> Fut,
        Fut: Future<Output = Answer<T>> + Send + 'a,
    {
        let bound = self.inner.timeout;
        which
            .into_iter()
            .filter_map(|i| self.inner.masters.get(i))
            .map(|master| {
                let call = master.slot.get().map(|c| op(&c.backend));
                let endpoint = master.endpoint.as_str();
                Box::pin(async move {
                    let Some(call) = call else {
                        return Err(BackendError::msg(format!(
                            "Redis at {endpoint} is not connected"
                        )));
                    };
                    tokio::time::timeout(bound, call).await.unwrap_or_else(|_| {
                        Err(BackendError::msg(format!(
                            "no answer from Redis at {endpoint} within {bound:?}"
                        )))
                    })
                }) as Call<'a, Answer<T>>
            })
            .collect()
    }

    /// [`calls_on`](Self::calls_on) every master.
    fn calls<'a, T, F, Fut>(&'a self, op: F) -> Vec<Call<'a, Answer<T>>>
    where
        T: Send + 'a,
        F: Fn(&'a RedisBackend) -> Fut,
        Fut: Future<Output = Answer<T>> + Send + 'a,
    {
        self.calls_on(0..self.masters(), op)
    }

    /// The error of an operation that fewer than a majority answered.
    fn no_quorum<T>(&self, what: &str, answers: &[Option<Answer<T>>]) -> BackendError {
        let answered = answers.iter().filter(|a| matches!(a, Some(Ok(_)))).count();
        let reasons: Vec<String> = answers
            .iter()
            .zip(&self.inner.masters)
            .filter_map(|(answer, master)| match answer {
                Some(Err(error)) => Some(reason(error)),
                None => Some(format!("Redis at {}: no answer yet", master.endpoint)),
                Some(Ok(_)) => None,
            })
            .collect();
        // Masters that refused for lack of a permission will refuse again:
        // when too many did for a quorum, so does the fleet.
        let denied = answers
            .iter()
            .filter(|a| matches!(a, Some(Err(e)) if e.is_permission_denied()))
            .count();
        BackendError::msg(format!(
            "Redlock {what}: only {answered} of {} masters answered, a quorum is {} ({})",
            self.masters(),
            self.inner.quorum,
            reasons.join("; ")
        ))
        .denied_if(denied > self.masters() - self.inner.quorum)
    }

    pub(crate) async fn ping(&self) -> Result<(), BackendError> {
        let quorum = self.inner.quorum;
        let answers = gather(self.calls(|m| m.ping()), |answers| {
            answers.iter().filter(|a| matches!(a, Some(Ok(())))).count() >= quorum
        })
        .await;
        let answered = answers.iter().filter(|a| matches!(a, Some(Ok(())))).count();
        if answered >= quorum {
            Ok(())
        } else {
            Err(self.no_quorum("ping", &answers))
        }
    }

    /// What a majority of masters records: the holder recorded on a
    /// majority, with the time until fewer than a majority still have it,
    /// and its token (`quorum::majority_record`); `None` when no holder has
    /// a majority.
    pub(crate) async fn inspect(&self, lock_key: &str) -> Result<Option<Recorded>, BackendError> {
        let quorum = self.inner.quorum;
        let records = |answers: &[Option<Answer<Option<Recorded>>>]| -> Vec<Option<Recorded>> {
            answers
                .iter()
                .filter_map(|a| match a {
                    Some(Ok(recorded)) => Some(recorded.clone()),
                    _ => None,
                })
                .collect()
        };
        // Done once a majority answered and the masters still out cannot
        // change the verdict (`quorum::record_settled`).
        let answers = gather(self.calls(|m| m.inspect(lock_key)), |answers| {
            let open = answers.iter().filter(|a| a.is_none()).count();
            let seen = records(answers);
            seen.len() >= quorum && quorum::record_settled(&seen, quorum, open)
        })
        .await;
        let seen = records(&answers);
        if seen.len() < quorum {
            return Err(self.no_quorum("inspect", &answers));
        }
        Ok(quorum::majority_record(&seen, quorum))
    }

    /// Publishes the identity on every master (`who.rs`); fine when any
    /// took it (it is for people to read, not part of any lock).
    pub(crate) async fn publish_identity(&self, it: Published<'_>) -> Result<(), BackendError> {
        let answers = gather(self.calls(|m| m.publish_identity(it)), |_| false).await;
        if answers.iter().any(|a| matches!(a, Some(Ok(())))) {
            Ok(())
        } else {
            Err(self.no_quorum("publish identity", &answers))
        }
    }

    /// An identity as the first master that has it records it.
    pub(crate) async fn read_identity(&self, key: &str) -> Result<Option<String>, BackendError> {
        let answers = gather(self.calls(|m| m.read_identity(key)), |answers| {
            answers.iter().any(|a| matches!(a, Some(Ok(Some(_)))))
        })
        .await;
        let mut answered = false;
        for answer in answers.into_iter().flatten() {
            match answer {
                Ok(Some(value)) => return Ok(Some(value)),
                Ok(None) => answered = true,
                Err(_) => {}
            }
        }
        match answered {
            true => Ok(None),
            false => Err(BackendError::msg(
                "Redlock read identity: no master answered",
            )),
        }
    }

    /// Deletes the lock on every master; `true` when any had it. Fails when
    /// fewer than a majority answered (the lock may then still be held).
    pub(crate) async fn force_unlock(&self, lock_key: &str) -> Result<bool, BackendError> {
        let answers = gather(self.calls(|m| m.force_unlock(lock_key)), |_| false).await;
        let deleted: Vec<bool> = answers
            .iter()
            .filter_map(|a| a.as_ref().and_then(|r| r.as_ref().ok()).copied())
            .collect();
        if deleted.len() < self.inner.quorum {
            return Err(self.no_quorum("force unlock", &answers));
        }
        Ok(deleted.contains(&true))
    }
}
