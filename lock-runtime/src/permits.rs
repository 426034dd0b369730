//! Permits: up to N holders of one key at once (`permits = N`,
//! [`LockRequest::permits`]), each with a permit index of its own, `0..N`.
//!
//! **A permit is a lock.** Permit 0 of key `k` is the ordinary lock of `k`
//! and permit `i > 0` the ordinary lock of `k#i` ([`permit_key`]). A call
//! holds a permit by holding that lock, taken through the same
//! acquisition, entry gate, renewal, loss, fencing, fairness and cohorting
//! as any single-key call, on every backend; `inspect` and `lockctl` show
//! each permit's holder as that lock's. So at most N calls hold permits of
//! `k` at any time, one per index, and a permit's token grows for each new
//! holder of that permit. `permits = 1` is the ordinary exclusive lock.
//!
//! **Taking one.** A call whose scope's ancestry holds a permit of the key
//! re-enters it (nesting); an ordinary call on the key nested in a permit
//! body does too ([`reenter`], from `request.rs`). Otherwise it tries each
//! permit once: the one at a rotating index first (callers spread over the
//! permits), then all the others at once (two round trips, whatever the
//! count), and keeps the first it gets. When every permit is busy and it may wait, it waits
//! for all N at once and keeps the first it is given: the other waits are
//! dropped as any cancelled acquire is (their queue places go; a permit
//! given to one of them at that moment is given back in the background).
//! In fair mode a waiter so stands in every permit's queue, in its order
//! of arrival.
//!
//! **Different N for one key.** A call with `permits = n` takes one of the
//! permits `0..n`. Calls giving different N share the low permits: for
//! every n in use, at most n calls hold permits below n, and at most the
//! largest N hold permits at all.
//!
//! Owns only the choice of a permit; what one lock's acquire does is
//! `acquire/`'s.

use std::future::{poll_fn, Future};
use std::hash::{BuildHasher, Hasher};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{LockError, TimeoutCause};
use crate::guard::LockGuard;
use crate::mode::LockMode;
use crate::owner::Node;
use crate::request::LockRequest;
use crate::runtime::LockRuntime;

/// The most permits one key may have.
pub const MAX_PERMITS: u32 = 1024;

/// The key of permit `permit` of `key`: the key itself for permit 0, else
/// the key, `#` and the index (`stock:7#3`).
pub(crate) fn permit_key(key: &str, permit: u32) -> String {
    if permit == 0 {
        key.to_owned()
    } else {
        format!("{key}#{permit}")
    }
}

/// The key a caller asked for, from the key of its permit `permit`'s lock
/// (`permit_key`'s inverse).
pub(crate) fn asked_key(lock_key: &str, permit: u32) -> &str {
    match permit {
        0 => lock_key,
        _ => lock_key
            .strip_suffix(permit.to_string().as_str())
            .and_then(|k| k.strip_suffix('#'))
            .unwrap_or(lock_key),
    }
}

/// An ordinary call on a key whose permit `permit` the body around it
/// holds: it re-enters that permit (same index, same token), as a nested
/// permit call does, instead of taking permit 0 beside it.
pub(crate) async fn reenter(
    request: LockRequest,
    permit: u32,
    scope: Option<Arc<Node>>,
) -> Result<LockGuard, LockError> {
    let runtime = request.runtime()?;
    let wait = request.wait_on(runtime);
    let key = request.key().to_owned();
    let started = Instant::now();
    let reentry = request.permit_lock(permit_key(&key, permit), wait);
    match reentry.acquire_lock(scope).await {
        Ok(guard) => Ok(guard.with_permit(permit)),
        Err(error) => Err(as_key(error, &key, started)),
    }
}

/// Why `permits` permits in `mode` cannot be asked for, if they cannot.
pub(crate) fn refused(permits: u32, mode: LockMode) -> Option<LockError> {
    if permits == 0 || permits > MAX_PERMITS {
        return Some(LockError::InvalidConfig(format!(
            "permits = {permits} is out of range: use 1 to {MAX_PERMITS}"
        )));
    }
    if mode != LockMode::Exclusive {
        return Some(LockError::InvalidConfig(format!(
            "permits apply to exclusive locks only, not to {mode:?} holds: \
             drop `permits` or the read/write mode"
        )));
    }
    None
}

/// Takes one of `permits` permits of `request`'s key for `scope` (see the
/// module docs); the guard says which ([`LockGuard::permit`]).
pub(crate) async fn acquire(
    request: LockRequest,
    permits: u32,
    scope: Arc<Node>,
) -> Result<LockGuard, LockError> {
    let runtime = request.runtime()?.clone();
    if let Some(refused) = refused(permits, request.mode_asked()) {
        return Err(refused);
    }
    let key = request.key().to_owned();
    // The longest permit key is refused here if any is (length, path).
    request.check_key(&runtime, &permit_key(&key, permits - 1))?;
    let started = Instant::now();
    let wait = request.wait_on(&runtime);
    let taking = Taking {
        runtime: &runtime,
        request: &request,
        key: &key,
        scope: &scope,
    };
    if let Some(held) = taking.held_by_scope(permits) {
        let reentered = taking.one(held, wait).await;
        return reentered.map_err(|e| as_key(e, &key, started));
    }
    let deadline = wait.and_then(|w| started.checked_add(w));
    let only = wait.is_some_and(|w| w.is_zero());
    let tried = taking.each_once(permits, only, deadline).await;
    match tried {
        Ok(Some(guard)) => return Ok(guard),
        Ok(None) if only => {
            // As one key's try-once says: whether this process holds any.
            let cause = TimeoutCause::new(None, taking.held_here(permits));
            let waited = started.elapsed();
            return Err(LockError::Timeout { key, waited, cause });
        }
        Err(error) if only => return Err(as_key(error, &key, started)),
        Ok(None) | Err(_) => {}
    }
    // A bounded wait whose deadline passed during the tries still waits
    // (for a moment): each permit then gets the one last try of a wait
    // past its deadline, and an outage ends as a timeout that names it,
    // as one key's wait does (a try-once would return the bare error).
    let left = wait.map(|w| w.saturating_sub(started.elapsed()).max(PAST_DEADLINE));
    let taken = taking.first_of((0..permits).collect(), left).await;
    taken.map_err(|e| as_key(e, &key, started))
}

/// The wait left to a bounded wait whose deadline passed: not zero (a
/// try-once), the least a wait can be.
const PAST_DEADLINE: Duration = Duration::from_nanos(1);

/// One permit acquire under way: what each permit's acquire is made of.
struct Taking<'a> {
    runtime: &'a LockRuntime,
    request: &'a LockRequest,
    key: &'a str,
    scope: &'a Arc<Node>,
}

impl Taking<'_> {
    /// The permit below `permits` that the scope's ancestry holds.
    fn held_by_scope(&self, permits: u32) -> Option<u32> {
        let table = self.runtime.table();
        let prefix = self.runtime.prefix();
        (0..permits).find(|&permit| {
            let name = self
                .runtime
                .backend()
                .lock_name(prefix, &permit_key(self.key, permit));
            table.holds_in(&name, self.scope) > 0
        })
    }

    /// Whether this runtime holds any permit below `permits` (in any scope).
    fn held_here(&self, permits: u32) -> bool {
        let table = self.runtime.table();
        let prefix = self.runtime.prefix();
        (0..permits).any(|permit| {
            let name = self
                .runtime
                .backend()
                .lock_name(prefix, &permit_key(self.key, permit));
            table.holds(&name)
        })
    }

    /// Permit `permit`, waiting `wait` (`None`: as long as it takes).
    async fn one(&self, permit: u32, wait: Option<Duration>) -> Result<LockGuard, LockError> {
        let request = self.request.permit_lock(permit_key(self.key, permit), wait);
        let guard = request.acquire_lock(Some(self.scope.clone())).await?;
        Ok(guard.with_permit(permit))
    }

    /// Tries each permit once, from a rotating start: the first taken, or
    /// `None` when every one is busy. The start permit first, alone (where
    /// callers spread out, usually free), then every other one at once: two
    /// round trips, whatever the count (more than one free then: the first
    /// answer is kept, the others given back as a cancelled acquire's are).
    /// An error ends the tries: returned when `only` (the call tries once),
    /// else left to the wait. A try-once's tries end within the try timeout
    /// (past it: no answer in time, as one key's try); a wait's stop at its
    /// `deadline`, a try under way too.
    async fn each_once(
        &self,
        permits: u32,
        only: bool,
        deadline: Option<Instant>,
    ) -> Result<Option<LockGuard>, LockError> {
        let start = rotating_start(permits);
        let bound = match only {
            true => Instant::now().checked_add(self.runtime.try_timeout()),
            false => deadline,
        };
        if let Some(guard) = self.try_wave(vec![start], bound, only).await? {
            return Ok(Some(guard));
        }
        let rest: Vec<u32> = (1..permits).map(|step| (start + step) % permits).collect();
        if rest.is_empty() {
            return Ok(None);
        }
        self.try_wave(rest, bound, only).await
    }

    /// Tries `permits` at once, until `bound`: the first taken, `None` when
    /// each was busy (or a wait's bound passed).
    async fn try_wave(
        &self,
        permits: Vec<u32>,
        bound: Option<Instant>,
        only: bool,
    ) -> Result<Option<LockGuard>, LockError> {
        if !only && bound.is_some_and(|b| Instant::now() >= b) {
            return Ok(None);
        }
        let wave = self.first_of(permits, Some(Duration::ZERO));
        let tried = match bound {
            Some(bound) => match tokio::time::timeout_at(bound, wave).await {
                Ok(tried) => tried,
                Err(_) if only => return Err(self.no_answer()),
                Err(_) => return Ok(None),
            },
            None => wave.await,
        };
        match tried {
            Ok(guard) => Ok(Some(guard)),
            Err(LockError::Timeout { .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// A try-once whose tries outlasted the try timeout.
    fn no_answer(&self) -> LockError {
        let timeout = self.runtime.try_timeout();
        let message = format!(
            "no answer from the lock backend for every permit within the try timeout ({timeout:?})"
        );
        crate::error::BackendError::msg(message).into()
    }

    /// Waits for each of `permits` at once, `wait` at most, and keeps the
    /// first given; the other waits are dropped (cancelled). When all of
    /// them fail, the first error that is not a plain timeout, else the
    /// first.
    async fn first_of(
        &self,
        permits: Vec<u32>,
        wait: Option<Duration>,
    ) -> Result<LockGuard, LockError> {
        type Waiting<'w> = Pin<Box<dyn Future<Output = Result<LockGuard, LockError>> + Send + 'w>>;
        let mut waits: Vec<Option<Waiting<'_>>> = permits
            .into_iter()
            .map(|permit| Some(Box::pin(self.one(permit, wait)) as Waiting<'_>))
            .collect();
        let mut first_error: Option<LockError> = None;
        poll_fn(|cx| {
            for slot in waits.iter_mut() {
                let Some(waiting) = slot else { continue };
                match waiting.as_mut().poll(cx) {
                    Poll::Ready(Ok(guard)) => return Poll::Ready(Ok(guard)),
                    Poll::Ready(Err(error)) => {
                        *slot = None;
                        // A timeout is the least telling error: another
                        // permit's (a self-deadlock, an outage) wins.
                        let timeout = |e: &LockError| matches!(e, LockError::Timeout { .. });
                        if first_error.as_ref().is_none_or(timeout) && !timeout(&error) {
                            first_error = Some(error);
                        } else {
                            first_error.get_or_insert(error);
                        }
                    }
                    Poll::Pending => {}
                }
            }
            if waits.iter().all(Option::is_none) {
                let error = first_error.take().unwrap_or(LockError::ShutDown);
                return Poll::Ready(Err(error));
            }
            Poll::Pending
        })
        .await
    }
}

impl LockRuntime {
    /// What the backend records of each of the `permits` permits of `key`:
    /// one entry per permit, in index order, `None` for a free one (see
    /// [`inspect`](Self::inspect); permit `i`'s `key` is `key#i`, or the
    /// key itself for permit 0). A snapshot, asked permit by permit.
    ///
    /// ```
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let runtime = lock_runtime::LockRuntime::builder().memory().build().await?;
    /// let guard = runtime.lock("export").permits(3).acquire().await?;
    /// let seen = runtime.inspect_permits("export", 3).await?;
    /// assert_eq!(seen.len(), 3);
    /// let held: Vec<u32> = (0..3).filter(|&i| seen[i as usize].is_some()).collect();
    /// assert_eq!(held, [guard.permit().unwrap()]);
    /// # Ok(()) }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn inspect_permits(
        &self,
        key: &str,
        permits: u32,
    ) -> Result<Vec<Option<crate::LockInfo>>, LockError> {
        if let Some(refused) = refused(permits, LockMode::Exclusive) {
            return Err(refused);
        }
        let mut seen = Vec::with_capacity(permits as usize);
        for permit in 0..permits {
            seen.push(self.inspect(&permit_key(key, permit)).await?);
        }
        Ok(seen)
    }
}

/// `error` naming the key the caller asked for, not one permit's, and (a
/// timeout) the whole wait of the call that `started` then, its tries
/// included.
fn as_key(error: LockError, key: &str, started: Instant) -> LockError {
    match error {
        LockError::Timeout { cause, .. } => LockError::Timeout {
            key: key.to_owned(),
            waited: started.elapsed(),
            cause,
        },
        LockError::OrderRefused { held, .. } => LockError::OrderRefused {
            key: key.to_owned(),
            held,
        },
        other => other,
    }
}

/// Where a call starts trying permits: a counter of the process, from a
/// random start, so that the callers of one process and of different
/// processes spread over the permits.
fn rotating_start(permits: u32) -> u32 {
    static NEXT: OnceLock<AtomicU64> = OnceLock::new();
    let next = NEXT.get_or_init(|| {
        let seed = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        AtomicU64::new(seed)
    });
    let n = next.fetch_add(1, Ordering::Relaxed);
    u32::try_from(n % u64::from(permits)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Permit 0 is the key itself (so `permits = 1` is the ordinary lock);
    /// the others carry their index, which `asked_key` takes off again.
    #[test]
    fn permit_zero_is_the_key_and_the_others_carry_their_index() {
        assert_eq!(permit_key("stock:7", 0), "stock:7");
        assert_eq!(permit_key("stock:7", 3), "stock:7#3");
        for (key, permit) in [("stock:7", 0), ("stock:7", 3), ("a#1", 12), ("#", 1)] {
            assert_eq!(asked_key(&permit_key(key, permit), permit), key);
        }
    }

    /// Zero permits, too many, and permits with a read or write mode are
    /// refused with the reason.
    #[test]
    fn out_of_range_counts_and_shared_modes_are_refused() {
        for bad in [0, MAX_PERMITS + 1, u32::MAX] {
            let refused = refused(bad, LockMode::Exclusive).map(|e| e.to_string());
            assert!(refused.is_some_and(|e| e.contains("out of range")), "{bad}");
        }
        for mode in [LockMode::Read, LockMode::Write] {
            let refused = refused(2, mode).map(|e| e.to_string());
            assert!(refused.is_some_and(|e| e.contains("exclusive locks only")));
        }
        assert!(refused(1, LockMode::Exclusive).is_none());
        assert!(refused(MAX_PERMITS, LockMode::Exclusive).is_none());
    }

    /// The start stays below the count, and moves on call by call.
    #[test]
    fn the_rotating_start_stays_in_range_and_moves() {
        let starts: Vec<u32> = (0..8).map(|_| rotating_start(4)).collect();
        assert!(starts.iter().all(|&s| s < 4), "{starts:?}");
        let mut distinct = starts.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() > 1, "{starts:?}");
        assert_eq!(rotating_start(1), 0);
    }
}
