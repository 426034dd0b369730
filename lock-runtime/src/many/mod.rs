//! Many keys at once: [`lock_many`] / [`LockRuntime::lock_many`] make a
//! [`ManyRequest`], whose acquire takes every key or none
//! ([`ManyGuard`]); [`with_locks`](crate::with_locks) runs a body under it,
//! and `#[distributed_lock(key = ["a:<x>", "b:<y>"])]` expands to that.
//!
//! **One order.** The keys are taken one after another in one canonical
//! order: sorted by their bytes (Rust's `str` order), equal keys taken
//! once. Two multi-key calls that share keys therefore wait for each other
//! only in that order, and cannot deadlock. Each key is an ordinary lock:
//! taken through the same acquisition, entry gate, renewal, fairness and
//! cohorting as a single-key call, on every backend, and seen by `inspect`
//! and `lockctl` as the single-key lock it is.
//!
//! **All or none.** The wait is one budget for all the keys. A timeout, an
//! error or a cancellation while taking them gives back every key taken so
//! far (their guards are dropped: released in the background at once),
//! and a waiter's place in a key's queue goes as a single-key waiter's
//! does. A key is held while the later ones are waited for, as every
//! ordered multi-lock does; it is given back the moment the wait fails.
//!
//! **Nesting.** The body of a multi-key call runs in a scope that records
//! its keys (`owner::Node`). A call nested in it (single or multi) may take
//! a key the chain's multi-key calls hold (it re-enters) or one sorting
//! after every key they hold; a key sorting before one of them, not held,
//! is refused with [`LockError::OrderRefused`] at once (waiting for it
//! could deadlock). Single-key calls nested in single-key calls keep the
//! order their code gives, as before.
//!
//! Owns only the composition; what one key's acquire does is `acquire/`'s.

mod guard;
mod locked;

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

pub use guard::ManyGuard;
pub use locked::with_locks;

use crate::error::LockError;
use crate::guard::LockGuard;
use crate::mode::LockMode;
use crate::owner::{self, Node};
use crate::request::{validate_key, LockRequest, OnLost};
use crate::runtime::LockRuntime;

/// Several locks to take together: the keys plus the options every key is
/// taken with. Made by [`LockRuntime::lock_many`] or [`lock_many`]; nothing
/// happens until [`acquire`](Self::acquire).
///
/// ```
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// let runtime = lock_runtime::LockRuntime::builder().memory().build().await?;
/// let both = runtime
///     .lock_many(["account:9", "account:3"])
///     .acquire()
///     .await?;
/// assert_eq!(both.keys().collect::<Vec<_>>(), ["account:3", "account:9"]);
/// assert!(runtime.lock("account:9").try_acquire().await?.is_none());
/// both.release().await?;
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
#[must_use = "a lock request does nothing until `.acquire().await`"]
#[derive(Debug, Clone)]
pub struct ManyRequest {
    /// The options (its key unused).
    options: LockRequest,
    keys: Vec<String>,
}

impl ManyRequest {
    fn new(runtime: Option<LockRuntime>, keys: Vec<String>) -> Self {
        ManyRequest {
            options: LockRequest::new(runtime, String::new()),
            keys,
        }
    }

    /// Each key's lease (see [`LockRequest::lease`]).
    pub fn lease(self, lease: Duration) -> Self {
        self.with(|r| r.lease(lease))
    }

    /// The longest time to wait for all the keys together (see
    /// [`LockRequest::wait`]); `Duration::ZERO` tries each key once.
    pub fn wait(self, wait: Duration) -> Self {
        self.with(|r| r.wait(wait))
    }

    /// Waits as long as it takes.
    pub fn wait_forever(self) -> Self {
        self.with(LockRequest::wait_forever)
    }

    /// Whether the watchdog renews every key's lease (see
    /// [`LockRequest::watchdog`]).
    pub fn watchdog(self, renew: bool) -> Self {
        self.with(|r| r.watchdog(renew))
    }

    /// What [`with_locks`] does when any key is lost while the body runs:
    /// one key lost is the call lost (see [`OnLost`]).
    pub fn on_lost(self, on_lost: OnLost) -> Self {
        self.with(|r| r.on_lost(on_lost))
    }

    /// Fair mode for every key (see [`LockRequest::fair`]).
    pub fn fair(self, fair: bool) -> Self {
        self.with(|r| r.fair(fair))
    }

    /// Read holds on every key (all the keys share one mode).
    pub fn read(self) -> Self {
        self.mode(LockMode::Read)
    }

    /// Write holds on every key.
    pub fn write(self) -> Self {
        self.mode(LockMode::Write)
    }

    /// Every key's mode (default [`LockMode::Exclusive`]).
    pub fn mode(self, mode: LockMode) -> Self {
        self.with(|r| r.mode(mode))
    }

    /// The keys in the order they are taken: sorted, each once.
    pub fn keys(&self) -> Vec<&str> {
        let mut keys: Vec<&str> = self.keys.iter().map(String::as_str).collect();
        keys.sort_unstable();
        keys.dedup();
        keys
    }

    /// Takes every key, in [`keys`](Self::keys) order, or none.
    ///
    /// Errors: as [`LockRequest::acquire`] for the first key that fails
    /// (a [`LockError::Timeout`] names the key that was still busy when
    /// the wait ran out); [`LockError::InvalidKey`] for an empty list;
    /// [`LockError::OrderRefused`] inside a multi-key call whose keys sort
    /// after one of these.
    pub fn acquire(self) -> impl Future<Output = Result<ManyGuard, LockError>> + Send {
        self.acquire_for(true)
    }

    /// Tries each key once: `Ok(None)` when any is held elsewhere (none is
    /// kept then).
    pub async fn try_acquire(self) -> Result<Option<ManyGuard>, LockError> {
        match self.wait(Duration::ZERO).acquire().await {
            Ok(guard) => Ok(Some(guard)),
            Err(LockError::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn with(mut self, option: impl FnOnce(LockRequest) -> LockRequest) -> Self {
        self.options = option(self.options);
        self
    }

    /// The attribute's options over this request's.
    pub(crate) fn apply(self, options: crate::request::Options) -> Self {
        self.with(|r| r.apply(options))
    }

    pub(crate) fn on_lost_mode(&self) -> OnLost {
        self.options.on_lost
    }

    /// Takes every key for a new scope, a child of the caller's that
    /// records the keys; `for_guard`: a guard's scope (nothing runs in it
    /// but what [`ManyGuard::scope`] runs), else a locked body's.
    pub(crate) async fn acquire_for(self, for_guard: bool) -> Result<ManyGuard, LockError> {
        let ManyRequest { options, keys } = self;
        let runtime = options.runtime()?.clone();
        let keys = in_order(keys)?;
        // Every key the backend would refuse is refused before any wait.
        for key in &keys {
            options.check_key(&runtime, key)?;
        }
        let caller = owner::current().map(|scope| scope.node);
        if let Some(caller) = &caller {
            for key in &keys {
                if let Some(held) = owner::out_of_order(caller, key) {
                    let key = key.clone();
                    return Err(LockError::OrderRefused { key, held });
                }
            }
        }
        let ordered: Arc<[String]> = keys.clone().into();
        let node = Node::child_holding(caller.as_ref(), Some(ordered), for_guard);
        let deadline = options
            .wait_on(&runtime)
            .and_then(|wait| Instant::now().checked_add(wait));
        let taking = Taking {
            runtime: &runtime,
            options: &options,
            node: &node,
            deadline,
        };
        let guards = taking.every(&keys).await?;
        Ok(ManyGuard::new(guards, node))
    }
}

/// How many times a set may find one of its keys unfit to enter and take it
/// anew before its acquire gives up.
const RETAKES: u32 = 3;

/// One multi-key acquire under way: what each key's acquire is made of.
struct Taking<'a> {
    runtime: &'a LockRuntime,
    options: &'a LockRequest,
    node: &'a Arc<Node>,
    /// The one budget's end (`None`: as long as it takes).
    deadline: Option<Instant>,
}

impl Taking<'_> {
    /// Takes `keys` in order. When the last is taken, the set is entered:
    /// every earlier key passes the entry gate again (a fixed lease may
    /// have run out, a connection been lost, while a later key was waited
    /// for); the first that does not is taken anew, with every key after
    /// it given back first, so the order holds.
    ///
    /// Bounded: a key found unfit once the deadline passed, or for the
    /// [`RETAKES`]th time (a fixed lease too short to outlast the taking of
    /// the keys after it), ends the acquire in `Timeout` naming it.
    async fn every(&self, keys: &[String]) -> Result<Vec<LockGuard>, LockError> {
        let started = Instant::now();
        let mut guards: Vec<LockGuard> = Vec::with_capacity(keys.len());
        let mut retakes = 0;
        while let Some(key) = keys.get(guards.len()) {
            match self.one(key).await {
                Ok(guard) => guards.push(guard),
                Err(error) => {
                    give_back(self.runtime, guards).await;
                    return Err(error);
                }
            }
            if guards.len() < keys.len() {
                continue;
            }
            let Some(stale) = self.first_unfit(&guards).await else {
                break;
            };
            retakes += 1;
            let late = self.deadline.is_some_and(|d| Instant::now() >= d);
            if late || retakes >= RETAKES {
                let key = guards[stale].key().to_owned();
                give_back(self.runtime, guards).await;
                let waited = started.elapsed();
                let cause = crate::error::TimeoutCause::default();
                return Err(LockError::Timeout { key, waited, cause });
            }
            give_back(self.runtime, guards.split_off(stale)).await;
        }
        Ok(guards)
    }

    /// One key, waiting what is left of the budget: all of it while at
    /// least a try's bound is left, else one try (bounded by the try
    /// timeout), so that no key's round trip is cut short by a sliver of
    /// budget and reported as busy.
    async fn one(&self, key: &str) -> Result<LockGuard, LockError> {
        let wait = self.deadline.map(|at| {
            let left = at.saturating_duration_since(Instant::now());
            if left < self.runtime.try_timeout() {
                Duration::ZERO
            } else {
                left
            }
        });
        let request = self.options.for_key(key.to_owned(), wait);
        request.acquire_as(Some(self.node.clone())).await
    }

    /// The first key of the set (but the last, entered just now) that the
    /// entry gate does not let the set enter now.
    async fn first_unfit(&self, guards: &[LockGuard]) -> Option<usize> {
        let bound = self
            .deadline
            .map(|d| d.max(Instant::now() + self.runtime.try_timeout()));
        for (i, guard) in guards.iter().enumerate().take(guards.len() - 1) {
            if !guard.still_enterable(bound).await {
                return Some(i);
            }
        }
        None
    }
}

/// Gives back the keys a failed multi-key acquire took, and waits for the
/// backend's answers (at most the try timeout: past it, or if this future
/// is dropped, each release goes on in the background), so that when the
/// error comes back the keys are free for every client, not only for this
/// process. (A cancelled acquire drops its guards: released in the
/// background at once.)
async fn give_back(runtime: &LockRuntime, guards: Vec<LockGuard>) {
    // All at once: one round trip for the lot, not one per key.
    let mut releases: Vec<Pin<Box<dyn Future<Output = ()> + Send>>> = guards
        .into_iter()
        .map(|guard| {
            // (An unanswered release is sent again in the background.)
            Box::pin(async move { drop(guard.release().await) })
                as Pin<Box<dyn Future<Output = ()> + Send>>
        })
        .collect();
    let all = poll_fn(move |cx| {
        releases.retain_mut(|release| release.as_mut().poll(cx).is_pending());
        if releases.is_empty() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    });
    let bound = runtime.try_timeout();
    // (The timer made inside the runtime's context: the caller may run
    // on another executor.)
    let _ = runtime
        .run(async move { tokio::time::timeout(bound, all).await })
        .await;
}

/// The keys sorted, each once, each checked; at least one.
fn in_order(mut keys: Vec<String>) -> Result<Vec<String>, LockError> {
    if keys.is_empty() {
        return Err(LockError::InvalidKey {
            key: String::new(),
            reason: "a multi-key lock needs at least one key",
        });
    }
    keys.sort_unstable();
    keys.dedup();
    for key in &keys {
        validate_key(key)?;
    }
    Ok(keys)
}

impl LockRuntime {
    /// A request for every lock of `keys` at once on this runtime.
    pub fn lock_many<K: Into<String>>(&self, keys: impl IntoIterator<Item = K>) -> ManyRequest {
        ManyRequest::new(
            Some(self.clone()),
            keys.into_iter().map(Into::into).collect(),
        )
    }
}

/// A request for every lock of `keys` at once on the global runtime;
/// acquiring it fails with [`LockError::NotInstalled`] when none is
/// installed.
///
/// ```
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// # lock_runtime::LockRuntime::builder().memory().build().await?.install().ok();
/// let both = lock_runtime::lock_many(["stock:1", "stock:2"]).acquire().await?;
/// both.release().await?;
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
pub fn lock_many<K: Into<String>>(keys: impl IntoIterator<Item = K>) -> ManyRequest {
    let keys = keys.into_iter().map(Into::into).collect();
    ManyRequest::new(LockRuntime::global().ok(), keys)
}
