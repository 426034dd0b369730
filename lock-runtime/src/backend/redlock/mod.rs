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
//! bounded by the response timeout, and the wait ends as soon as the
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
//! the master they share: the counter lives for the fence window (60 s)
//! after it was written, after which that master's clock must be past the
//! token, so a master whose clock is behind the fastest master's by more
//! than the window may hand out a smaller token; and a master restarted
//! empty forgot both the hold and the counter, so until it has been down
//! for a lease (the Redlock "delayed restart") a later majority may meet
//! the old one only there: exclusion and growth then rest on the other
//! shared masters.
//!
//! **Renew, release.** Both go to every master. A lock is renewed when a
//! majority renewed it, lost as soon as more than a minority said it is not
//! ours, and unknown otherwise (the watchdog retries until the lease end).
//! A master that said "not ours" while a majority renewed (it restarted
//! empty, or stayed frozen past the lease) gets the hold back at once.
//!
//! **Fair mode** is refused: its queue and handoff live in one server's
//! lists and scripts, and independent masters would each hand the lock to a
//! different waiter.

mod gather;
pub(crate) mod quorum;
mod watches;

use std::future::Future;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::redis::{connect, RedisBackend};
use super::{Acquire, ConnectSettings, Queue, Recorded, Release, Wakeups, Watches};
use crate::error::{BackendError, LockError};
use crate::held::{HeldLock, Hold};
use crate::names::LockNames;
use gather::{gather, Call};
use watches::RedlockWatches;

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
    /// The runtime's worker thread, where a failed attempt's undo runs.
    worker: tokio::runtime::Handle,
}

/// What one master answered (or why it did not).
type Answer<T> = Result<T, BackendError>;

impl Redlock {
    /// Connects to every master at once. Fails when a URL is malformed, or
    /// when fewer than a majority can be reached; a master that is down is
    /// connected in the background later, and counts as not answering until
    /// then.
    pub(crate) async fn start(
        urls: &[String],
        settings: &ConnectSettings,
        wakeups: Weak<dyn Wakeups>,
    ) -> Result<(Redlock, Arc<dyn Watches>), LockError> {
        if urls.len() < MIN_MASTERS {
            return Err(LockError::InvalidConfig(format!(
                "Redlock needs at least {MIN_MASTERS} masters, got {}",
                urls.len()
            )));
        }
        let quorum = quorum::quorum(urls.len());
        type Connecting = Result<(RedisBackend, Arc<dyn Watches>), LockError>;
        let attempts: Vec<Call<'_, Connecting>> = urls
            .iter()
            .map(|url| Box::pin(connect(url, settings, wakeups.clone())) as Call<'_, _>)
            .collect();
        let mut masters = Vec::with_capacity(urls.len());
        let mut down = Vec::new();
        for (i, (url, outcome)) in urls
            .iter()
            .zip(gather(attempts, |_| false).await)
            .enumerate()
        {
            let slot = Arc::new(OnceLock::new());
            match outcome {
                Some(Ok((backend, watches))) => {
                    load_fence_script(&backend).await;
                    let endpoint = backend.endpoint().to_owned();
                    let _ = slot.set(Connected { backend, watches });
                    masters.push(Master { endpoint, slot });
                }
                Some(Err(LockError::InvalidConfig(problem))) => {
                    return Err(LockError::InvalidConfig(format!(
                        "Redlock master {} of {}: {problem}",
                        i + 1,
                        urls.len()
                    )))
                }
                other => {
                    down.push(match other {
                        Some(Err(error)) => error.to_string(),
                        _ => "no answer".to_owned(),
                    });
                    tokio::spawn(reconnect(
                        url.clone(),
                        settings.clone(),
                        wakeups.clone(),
                        slot.clone(),
                    ));
                    masters.push(Master {
                        endpoint: endpoint_of(url).unwrap_or_else(|| format!("master {}", i + 1)),
                        slot,
                    });
                }
            }
        }
        let up = masters.len() - down.len();
        if up < quorum {
            return Err(BackendError::msg(format!(
                "Redlock: only {up} of {} masters could be reached, a quorum is {quorum} ({})",
                urls.len(),
                down.join("; ")
            ))
            .into());
        }
        if !down.is_empty() {
            tracing::warn!(
                up,
                masters = urls.len(),
                "Redlock started without some masters; connecting them in the background: {}",
                down.join("; ")
            );
        }
        let watches = Arc::new(RedlockWatches {
            masters: masters.iter().map(|m| m.slot.clone()).collect(),
            quorum,
        });
        let inner = Inner {
            masters,
            quorum,
            timeout: settings.response_timeout,
            window: settings.fence_window.as_millis().max(1).to_string(),
            fence_script: redis::Script::new(FENCE_SCRIPT),
            worker: tokio::runtime::Handle::current(),
        };
        Ok((
            Redlock {
                inner: Arc::new(inner),
            },
            watches,
        ))
    }

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
                Some(Err(error)) => Some(
                    error
                        .to_string()
                        .trim_start_matches("lock backend error: ")
                        .to_owned(),
                ),
                None => Some(format!("Redis at {}: no answer yet", master.endpoint)),
                Some(Ok(_)) => None,
            })
            .collect();
        BackendError::msg(format!(
            "Redlock {what}: only {answered} of {} masters answered, a quorum is {} ({})",
            self.masters(),
            self.inner.quorum,
            reasons.join("; ")
        ))
    }

    pub(crate) async fn acquire(
        &self,
        lock_key: &str,
        holder: &str,
        lease: Duration,
        queue: Queue,
    ) -> Result<Acquire, BackendError> {
        if queue != Queue::No {
            return Err(BackendError::msg(FAIR_UNSUPPORTED));
        }
        let started = Instant::now();
        let quorum = self.inner.quorum;
        let ttl = quorum::padded(lease);
        let calls = self.calls(|m| m.acquire(lock_key, holder, ttl, Queue::No));
        // Done when a majority said held; or when it can no longer, and it is
        // known whether that is because the lock is busy (a majority
        // answered) or because too few masters answer.
        let answers = gather(calls, |answers| {
            let count =
                |f: fn(&Option<Answer<Acquire>>) -> bool| answers.iter().filter(|a| f(a)).count();
            let held = count(|a| matches!(a, Some(Ok(Acquire::Held { .. }))));
            let busy = count(|a| matches!(a, Some(Ok(Acquire::Busy { .. }))));
            let open = count(Option::is_none);
            held >= quorum
                || (held + open < quorum && (held + busy >= quorum || held + busy + open < quorum))
        })
        .await;
        let mut held = Vec::new();
        let mut busy = Vec::new();
        for (i, answer) in answers.iter().enumerate() {
            match answer {
                Some(Ok(Acquire::Held { fence, .. })) => held.push((i, *fence)),
                Some(Ok(Acquire::Busy { ttl })) => busy.push(*ttl),
                _ => {}
            }
        }
        let in_time = || quorum::validity(lease, started.elapsed()).is_some();
        if held.len() >= quorum && in_time() {
            let fence = held.iter().map(|(_, token)| *token).max().unwrap_or(0);
            let unanswered = answers.iter().enumerate().filter(|(_, a)| a.is_none());
            let unanswered: Vec<usize> = unanswered.map(|(i, _)| i).collect();
            match self
                .record_fence(lock_key, holder, fence, &held, &unanswered)
                .await
            {
                Ok(()) if in_time() => {
                    return Ok(Acquire::Held {
                        fence,
                        handed: false,
                    })
                }
                Ok(()) => {}
                Err(error) => {
                    self.undo(lock_key, holder, &answers);
                    return Err(error);
                }
            }
        }
        self.undo(lock_key, holder, &answers);
        if held.len() >= quorum {
            return Err(BackendError::msg(format!(
                "Redlock acquire: a majority said yes, but after {:?}, which leaves less \
                 than the clock-drift allowance ({:?}) of the {lease:?} lease; given back",
                started.elapsed(),
                quorum::drift(lease)
            )));
        }
        if held.len() + busy.len() < quorum {
            return Err(self.no_quorum("acquire", &answers));
        }
        Ok(Acquire::Busy {
            ttl: quorum::busy_ttl(quorum, held.len(), &busy),
        })
    }

    /// Writes the hold's token back to the masters of its majority whose
    /// own token was smaller, until a majority records it (see the module
    /// docs: this is what makes tokens grow across majorities), and to the
    /// masters that had not answered, whose acquire may yet land (behind
    /// it on the same connection), so that every master holding it records
    /// the same token.
    async fn record_fence(
        &self,
        lock_key: &str,
        holder: &str,
        fence: u64,
        held: &[(usize, u64)],
        unanswered: &[usize],
    ) -> Result<(), BackendError> {
        let already = held.iter().filter(|(_, token)| *token == fence).count();
        let needed = self.inner.quorum.saturating_sub(already);
        let behind = held
            .iter()
            .filter(|(_, token)| *token < fence)
            .map(|(i, _)| *i);
        let targets: Vec<usize> = behind.chain(unanswered.iter().copied()).collect();
        if targets.is_empty() {
            return Ok(());
        }
        let calls = self.calls_on(targets, |m| self.raise_fence(m, lock_key, holder, fence));
        let answers = gather(calls, |answers| {
            answers.iter().filter(|a| matches!(a, Some(Ok(_)))).count() >= needed
        })
        .await;
        let recorded = answers.iter().filter(|a| matches!(a, Some(Ok(_)))).count();
        if recorded >= needed {
            return Ok(());
        }
        Err(BackendError::msg(format!(
            "Redlock acquire: the fencing token reached only {} of {} masters, a quorum is \
             {}; given back",
            already + recorded,
            self.masters(),
            self.inner.quorum
        )))
    }

    /// Runs `redlock_fence.lua` on one master: its counter is raised to
    /// `fence`, and the hold's recorded token too while it is there.
    async fn raise_fence(
        &self,
        master: &RedisBackend,
        lock_key: &str,
        holder: &str,
        fence: u64,
    ) -> Answer<bool> {
        let mut con = master.con.clone();
        let recorded: i64 = self
            .inner
            .fence_script
            .key(lock_key)
            .key(LockNames::fence(lock_key))
            .arg(holder)
            .arg(fence.to_string())
            .arg(&self.inner.window)
            .invoke_async(&mut con)
            .await
            .map_err(|e| {
                BackendError::new(
                    format!("fence write-back failed on Redis at {}", master.endpoint()),
                    e,
                )
            })?;
        Ok(recorded == 1)
    }

    /// Gives back, in the background, what a failed attempt may have taken:
    /// on every master that said held or did not answer (its acquire may
    /// still land: the release follows it on the same connection). Each is
    /// a task on the worker thread rather than a queued background release,
    /// which the next acquire of the key would wait for: with masters down
    /// it would wait for them to time out, to undo a hold nobody else sees.
    fn undo(&self, lock_key: &str, holder: &str, answers: &[Option<Answer<Acquire>>]) {
        for (answer, master) in answers.iter().zip(&self.inner.masters) {
            let taken = !matches!(answer, Some(Ok(Acquire::Busy { .. })));
            if let (true, Some(connected)) = (taken, master.slot.get()) {
                let backend = connected.backend.clone();
                let (lock_key, holder) = (lock_key.to_owned(), holder.to_owned());
                let bound = self.inner.timeout;
                self.inner.worker.spawn(async move {
                    let release = backend.release(&lock_key, &holder, false);
                    if let Ok(Err(error)) = tokio::time::timeout(bound, release).await {
                        tracing::debug!(%error, "Redlock: undoing a partial hold failed; its lease frees it");
                    }
                });
            }
        }
    }

    pub(crate) async fn release(
        &self,
        lock_key: &str,
        holder: &str,
        fair: bool,
    ) -> Result<Release, BackendError> {
        let quorum = self.inner.quorum;
        let calls = self.calls(|m| m.release(lock_key, holder, fair));
        let answers = gather(calls, |answers| {
            answers
                .iter()
                .filter(|a| matches!(a, Some(Ok(Release::Freed))))
                .count()
                >= quorum
        })
        .await;
        let count = |wanted: Release| {
            answers
                .iter()
                .filter(|a| matches!(a, Some(Ok(r)) if *r == wanted))
                .count()
        };
        let (freed, still, not_held) = (
            count(Release::Freed),
            count(Release::StillHeld),
            count(Release::NotHeld),
        );
        if still > 0 {
            Ok(Release::StillHeld)
        } else if freed >= quorum {
            Ok(Release::Freed)
        } else if freed + not_held >= quorum {
            Ok(Release::NotHeld)
        } else {
            Err(self.no_quorum("release", &answers))
        }
    }

    pub(crate) fn release_in_background(&self, lock_key: String, holder: String, fair: bool) {
        for connected in self.inner.masters.iter().filter_map(|m| m.slot.get()) {
            connected
                .backend
                .release_in_background(lock_key.clone(), holder.clone(), fair);
        }
    }

    /// Whether background releases of `lock_key` are still out on so many
    /// masters that a majority cannot be free yet. (Out on a minority only —
    /// a frozen master, say — they do not stand in the way of the next
    /// acquire, which must not wait for that master.)
    pub(crate) fn release_pending(&self, lock_key: &str) -> bool {
        let pending = self
            .inner
            .masters
            .iter()
            .filter_map(|m| m.slot.get())
            .filter(|c| c.backend.pending().is_pending(lock_key))
            .count();
        pending > self.masters() - self.inner.quorum
    }

    /// Resolves once a majority of masters has no background release of
    /// `lock_key` out.
    pub(crate) async fn releases_settled(&self, lock_key: &str) {
        let quorum = self.inner.quorum;
        let calls = self.calls(|m| async move {
            m.pending().settled(lock_key).await;
            Ok::<(), BackendError>(())
        });
        let _ = gather(calls, |answers| answers.iter().flatten().count() >= quorum).await;
    }

    /// Resolves once every background release queued so far on every
    /// master has been answered (or given up).
    pub(crate) async fn all_releases_settled(&self) {
        let settled = self
            .inner
            .masters
            .iter()
            .filter_map(|m| m.slot.get())
            .map(|c| Box::pin(c.backend.pending().all_settled()) as Call<'_, ()>)
            .collect();
        let _ = gather(settled, |_| false).await;
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
    /// and the largest token recorded; `None` when no holder has a majority.
    pub(crate) async fn inspect(&self, lock_key: &str) -> Result<Option<Recorded>, BackendError> {
        let answers = gather(self.calls(|m| m.inspect(lock_key)), |_| false).await;
        let records: Vec<Option<Recorded>> = answers
            .iter()
            .filter_map(|a| match a {
                Some(Ok(recorded)) => Some(recorded.clone()),
                _ => None,
            })
            .collect();
        if records.len() < self.inner.quorum {
            return Err(self.no_quorum("inspect", &answers));
        }
        Ok(majority_record(&records, self.inner.quorum))
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

    /// Renews `batch` on every master at once and combines the answers per
    /// lock (`quorum::renewal`); ends as soon as every lock is decided.
    pub(crate) async fn renew_many(
        &self,
        batch: &[Arc<HeldLock>],
    ) -> Result<Vec<Option<bool>>, BackendError> {
        let masters = self.masters();
        // The masters are given the lease plus the drift allowance.
        let padded: Vec<Arc<HeldLock>> = batch.iter().map(|l| padded_copy(l)).collect();
        let calls = self.calls(|m| m.renew_many(&padded));
        let tally = |answers: &[Option<Answer<Vec<Option<bool>>>>]| -> Vec<Option<bool>> {
            (0..batch.len())
                .map(|j| {
                    let said = |wanted: bool| {
                        answers
                            .iter()
                            .filter_map(|a| match a {
                                Some(Ok(replies)) => replies.get(j).copied().flatten(),
                                _ => None,
                            })
                            .filter(|renewed| *renewed == wanted)
                            .count()
                    };
                    quorum::renewal(masters, said(true), said(false))
                })
                .collect()
        };
        let answers = gather(calls, |answers| tally(answers).iter().all(Option::is_some)).await;
        let outcome = tally(&answers);
        self.retake(&padded, &outcome, &answers).await;
        Ok(outcome)
    }

    /// Takes a renewed lock again on the masters that said it is not ours
    /// there (restarted empty, or frozen past the lease). Safe: the renewal
    /// just confirmed that a majority holds it for us, so no other holder
    /// can have a majority until our lease ends; a master taken now only
    /// joins our hold (and is freed by our release, or by its TTL), and one
    /// that another holder took meanwhile answers busy and is left alone. It
    /// restores the hold's tolerance of further failures, and raises the
    /// master's fence counter to our token, which it had forgotten.
    async fn retake(
        &self,
        padded: &[Arc<HeldLock>],
        outcome: &[Option<bool>],
        answers: &[Option<Answer<Vec<Option<bool>>>>],
    ) {
        let mut calls: Vec<Call<'_, Answer<bool>>> = Vec::new();
        for (j, lock) in padded.iter().enumerate() {
            if outcome.get(j) != Some(&Some(true)) {
                continue;
            }
            let gone = answers.iter().enumerate().filter_map(|(i, a)| match a {
                Some(Ok(replies)) if replies.get(j) == Some(&Some(false)) => Some(i),
                _ => None,
            });
            calls.extend(self.calls_on(gone, |m| async move {
                let taken = m
                    .acquire(&lock.lock_key, &lock.holder, lock.lease, Queue::No)
                    .await?;
                if !matches!(taken, Acquire::Held { .. }) {
                    return Ok(false);
                }
                tracing::info!(
                    master = m.endpoint(),
                    "Redlock: took a held lock again on a master that had lost it"
                );
                self.raise_fence(m, &lock.lock_key, &lock.holder, lock.fence)
                    .await
            }));
        }
        if !calls.is_empty() {
            let _ = gather(calls, |_| false).await;
        }
    }
}

/// A copy of `lock` whose lease is padded with the drift allowance, for the
/// masters' renewals.
fn padded_copy(lock: &HeldLock) -> Arc<HeldLock> {
    HeldLock::new(Hold {
        key: String::new(),
        lock_key: lock.lock_key.clone(),
        holder: lock.holder.clone(),
        owner: lock.owner,
        fence: lock.fence,
        lease: quorum::padded(lock.lease),
        renew: lock.renew,
        fair: lock.fair,
    })
}

/// The record of the holder that a majority of `records` (one per master
/// that answered; `None`: free there) names, if any: its remaining lease is
/// how long a majority still has it, its token the one a majority records
/// (an acquire returns once a majority records it; a master it reached
/// late may show its own token until the write-back lands there), else the
/// largest recorded.
fn majority_record(records: &[Option<Recorded>], quorum: usize) -> Option<Recorded> {
    let holders = records.iter().flatten();
    holders.clone().find_map(|candidate| {
        let same: Vec<&Recorded> = holders
            .clone()
            .filter(|r| r.holder == candidate.holder)
            .collect();
        if same.len() < quorum {
            return None;
        }
        // A lease without expiry (None) outlasts every other.
        let mut remaining: Vec<Duration> = same
            .iter()
            .map(|r| r.remaining.unwrap_or(Duration::MAX))
            .collect();
        remaining.sort_unstable_by(|a, b| b.cmp(a));
        let remaining = remaining
            .get(quorum - 1)
            .copied()
            .filter(|r| *r != Duration::MAX);
        Some(Recorded {
            holder: candidate.holder.clone(),
            holds: same.iter().map(|r| r.holds).max().unwrap_or(0),
            remaining,
            fence: majority_fence(&same, quorum),
            queue: Vec::new(),
        })
    })
}

/// The token that `quorum` of `records` agree on, else the largest.
fn majority_fence(records: &[&Recorded], quorum: usize) -> Option<u64> {
    let fences = records.iter().filter_map(|r| r.fence);
    fences
        .clone()
        .find(|f| fences.clone().filter(|g| g == f).count() >= quorum)
        .or_else(|| fences.max())
}

/// `host:port` of a URL, without credentials (`None`: unparsable; the
/// connection attempt reports that).
fn endpoint_of(url: &str) -> Option<String> {
    use redis::IntoConnectionInfo;
    url.into_connection_info()
        .ok()
        .map(|info| info.addr().to_string())
}

/// Loads `redlock_fence.lua` into a master's script cache, so that its
/// first write-back goes by SHA even if the acquire returns before it is
/// answered (`redis::Script` falls back to the source on `NOSCRIPT`, but
/// only while its call is awaited). A failure is left to that fallback.
async fn load_fence_script(master: &RedisBackend) {
    let loaded: redis::RedisResult<String> = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(FENCE_SCRIPT)
        .query_async(&mut master.con.clone())
        .await;
    if let Err(error) = loaded {
        tracing::debug!(%error, master = master.endpoint(), "Redlock: loading the fence script failed");
    }
}

/// Connects, in the background, to a master that was down at start-up,
/// pausing between attempts; ends once connected or when the runtime is
/// gone.
async fn reconnect(
    url: String,
    settings: ConnectSettings,
    wakeups: Weak<dyn Wakeups>,
    slot: Arc<OnceLock<Connected>>,
) {
    let mut pause = RECONNECT_MIN;
    loop {
        tokio::time::sleep(pause).await;
        if wakeups.strong_count() == 0 {
            return;
        }
        if let Ok((backend, watches)) = connect(&url, &settings, wakeups.clone()).await {
            load_fence_script(&backend).await;
            tracing::info!(master = backend.endpoint(), "Redlock: master connected");
            let _ = slot.set(Connected { backend, watches });
            return;
        }
        pause = pause.saturating_mul(2).min(RECONNECT_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(holder: &str, remaining_ms: u64, fence: u64) -> Option<Recorded> {
        Some(Recorded {
            holder: holder.to_owned(),
            holds: 1,
            remaining: Some(Duration::from_millis(remaining_ms)),
            fence: Some(fence),
            queue: Vec::new(),
        })
    }

    #[test]
    fn inspect_reports_the_holder_of_a_majority() {
        let records = [
            record("a", 900, 10),
            record("a", 500, 30),
            None,
            record("b", 800, 5),
            record("a", 700, 20),
        ];
        let found = majority_record(&records, 3).expect("a holds a majority");
        assert_eq!(found.holder, "a");
        // Three masters hold it: a majority has it until the third longest runs out.
        assert_eq!(found.remaining, Some(Duration::from_millis(500)));
        assert_eq!(found.fence, Some(30), "no majority agrees: the largest");
        let mut agreed = records.clone();
        for r in agreed.iter_mut().flatten() {
            r.fence = Some(
                if r.holder == "a" && r.remaining != Some(Duration::from_millis(900)) {
                    25
                } else {
                    40
                },
            );
        }
        let found = majority_record(&agreed, 2).expect("a holds");
        assert_eq!(found.fence, Some(25), "what a majority records");
        assert_eq!(majority_record(&records[..4], 3), None, "only two say a");
    }
}
