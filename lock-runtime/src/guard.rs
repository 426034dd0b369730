//! [`LockGuard`]: a held lock as a value.
//!
//! The guard is the only way to give a hold back. `release().await` sends the
//! release and reports how it went; dropping the guard instead (early return,
//! cancellation, panic) hands the release to the runtime's background worker,
//! which needs no tokio context at drop time. Either way the lock leaves the
//! watchdog before its release is sent.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Holding, Release};
use crate::cohort::Terms;
use crate::error::LockError;
use crate::gate::{self, Evidence, Verdict, Way};
use crate::held::{HeldLock, Released};
use crate::mode::LockMode;
use crate::owner::{self, HeldPermit, Node, Scope};
use crate::runtime::LockRuntime;
use crate::waiters::Passed;

/// A held lock. Release it with [`release`](Self::release), or drop it to
/// release in the background.
///
/// ```
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// let runtime = lock_runtime::LockRuntime::builder().memory().build().await?;
/// let guard = runtime.lock("job:nightly").acquire().await?;
/// assert!(!guard.is_lost());
/// let token = guard.fence(); // pass to storage that rejects stale writers
/// guard.release().await?;
/// let next = runtime.lock("job:nightly").acquire().await?;
/// assert!(next.fence() > token);
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
#[must_use = "the lock is released as soon as the guard is dropped"]
#[derive(Debug)]
pub struct LockGuard {
    runtime: LockRuntime,
    held: Arc<HeldLock>,
    /// This hold's frame in the runtime's table.
    frame: u64,
    /// The owner scope the hold belongs to.
    scope: Arc<Node>,
    /// What this guard's frame asked for.
    mode: LockMode,
    /// The permit index, for a hold taken as one of several permits.
    permit: Option<u32>,
    released: bool,
}

impl LockGuard {
    /// A guard for a fresh backend hold, taken into the runtime's table and
    /// watchdog. `in_force` is the backend lease the hold has now: its own
    /// lease, or a fair handoff's claim until the watchdog's first renewal.
    /// `attempt`: the in-flight attempt that took it (claimed now). `None`:
    /// the runtime is shut down and the hold was not admitted (what the
    /// attempt took is given back by shutdown; a handoff's caller gives it
    /// back itself). The hold is not entered yet: see [`Unentered`].
    pub(crate) fn adopt(
        runtime: &LockRuntime,
        held: Arc<HeldLock>,
        (scope, way): (Arc<Node>, Way),
        sent_at: Instant,
        in_force: Duration,
        attempt: Option<u64>,
    ) -> Option<Unentered> {
        let waiters = runtime.waiters();
        let others_waiting = waiters.waiting_keys() > 0;
        // Under the gate, so that shutdown either finds the hold in the
        // table or the hold is refused. Watchdog first: a shutdown that
        // closes the table's frames between the two then also takes this
        // hold out of the watchdog; the other way round it would miss it and
        // keep renewing a closed hold.
        let frame = runtime.in_flight().admit(attempt, || {
            runtime.watchdog().add(held.clone(), sent_at, in_force);
            // Only news of the current connection says that other holds of
            // the key this process counts as live are gone on the server.
            let current = held.confirmed_in(waiters.connection_epoch());
            runtime.table().insert(held.clone(), &scope, current)
        })?;
        if others_waiting {
            // The key's other waiters sleep no longer than this hold's lease
            // (it may end by expiry, with no release message).
            if let Some(until) = sent_at.checked_add(in_force) {
                waiters.note_held(&held.lock_key, until);
            }
            // Waiters of the same scope may re-enter now instead of waiting
            // for a release that their own scope would have to make.
            waiters.wake_owner(&held.lock_key, held.owner());
        }
        let mode = held.mode();
        Some(LockGuard::unentered(
            runtime.clone(),
            held,
            frame,
            (scope, mode),
            way,
        ))
    }

    /// A guard for frame `frame` of a hold in the table (a re-entry, a
    /// join, a passed hold, a fresh hold), not entered yet.
    pub(crate) fn unentered(
        runtime: LockRuntime,
        held: Arc<HeldLock>,
        frame: u64,
        (scope, mode): (Arc<Node>, LockMode),
        way: Way,
    ) -> Unentered {
        let guard = LockGuard {
            runtime,
            held,
            frame,
            scope,
            mode,
            permit: None,
            released: false,
        };
        Unentered { guard, way }
    }

    /// This guard as permit `permit` of its key.
    pub(crate) fn with_permit(mut self, permit: u32) -> LockGuard {
        self.permit = Some(permit);
        self
    }

    /// Which permit this hold is, `0..n`, for a lock taken with
    /// [`LockRequest::permits`](crate::LockRequest::permits); `None` for
    /// any other.
    pub fn permit(&self) -> Option<u32> {
        self.permit
    }

    /// This hold as a body's permit: the key asked (the permit's lock's key
    /// without its `#i`) and the index.
    pub(crate) fn held_permit(&self) -> Option<HeldPermit> {
        let index = self.permit?;
        let key = crate::permits::asked_key(self.key(), index);
        Some(HeldPermit {
            key: key.into(),
            index,
        })
    }

    pub(crate) fn runtime(&self) -> &LockRuntime {
        &self.runtime
    }

    pub(crate) fn held(&self) -> &Arc<HeldLock> {
        &self.held
    }

    /// The key as given to the request.
    pub fn key(&self) -> &str {
        &self.held().key
    }

    /// What this guard holds: its request's mode ([`LockMode::Read`] also
    /// for a read nested in a write hold, which shares that hold).
    pub fn mode(&self) -> LockMode {
        self.mode
    }

    /// The fencing token: strictly greater than every token handed out for
    /// this key before; the same for nested holds of one owner scope. A
    /// read hold's token is greater than every earlier writer's and smaller
    /// than every later writer's; it orders nothing among readers.
    pub fn fence(&self) -> u64 {
        self.held().fence()
    }

    /// Whether the lock was found lost (expired, deleted, or not renewable
    /// before its lease ran out).
    pub fn is_lost(&self) -> bool {
        self.held().is_lost()
    }

    /// Resolves when the lock is lost; pending forever while it stays held.
    /// Useful in a `select!` beside long-running work.
    pub async fn lost(&self) {
        self.runtime.run(self.held().lost()).await;
    }

    /// Runs `fut` as if it were nested inside this hold: locked calls and
    /// acquires of the same key inside `fut` re-enter it (no wait, no round
    /// trip), and [`fence`](crate::fence) returns this guard's token there.
    ///
    /// A guard from [`acquire`](crate::LockRequest::acquire) does not change
    /// the owner scope its caller runs in (no future can), so without this a
    /// `#[distributed_lock]` fn on the same key called while the guard is
    /// held waits for the guard: in the same task, until its wait runs out
    /// with [`LockError::Timeout`]. Await `fut` before releasing the
    /// guard: once the hold is given back, calls in `fut` no longer find it.
    ///
    /// ```
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// use lock_runtime::{distributed_lock, fence, LockError};
    /// # lock_runtime::LockRuntime::builder().memory().build().await?.install().ok();
    /// #[distributed_lock(key = "account:<id>")]
    /// async fn audit(id: u64) -> Result<Option<u64>, LockError> {
    ///     Ok(fence())
    /// }
    ///
    /// let guard = lock_runtime::lock("account:7").acquire().await?;
    /// let seen = guard.scope(audit(7)).await?; // re-enters the guard's hold
    /// assert_eq!(seen, Some(guard.fence()));
    /// guard.release().await?;
    /// # Ok(()) }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
    /// ```
    pub fn scope<F: Future>(&self, fut: F) -> impl Future<Output = F::Output> {
        let scope = Scope {
            node: Node::child_of(Some(&self.scope)),
            fence: Some(self.fence()),
            fences: None,
            permit: self.held_permit(),
        };
        owner::enter(scope, fut)
    }

    /// Turns a write hold into a read hold without letting go of the key:
    /// takes a read hold nested in this one, then gives this one back, so
    /// that no writer of any process enters in between (readers may). The
    /// read hold keeps this hold's token. A read guard comes back as it is.
    ///
    /// Errors: [`LockError::Lost`] when the hold was lost before or during
    /// the downgrade (the read hold is given back too).
    ///
    /// ```
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// use lock_runtime::LockMode;
    /// let runtime = lock_runtime::LockRuntime::builder().memory().build().await?;
    /// let write = runtime.lock("catalog").write().acquire().await?;
    /// let token = write.fence();
    /// let read = write.downgrade().await?;
    /// assert_eq!((read.mode(), read.fence()), (LockMode::Read, token));
    /// // Other readers share the key now; writers still wait.
    /// assert!(runtime.lock("catalog").read().try_acquire().await?.is_some());
    /// assert!(runtime.lock("catalog").write().try_acquire().await?.is_none());
    /// read.release().await?;
    /// # Ok(()) }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn downgrade(self) -> Result<LockGuard, LockError> {
        if self.mode.is_read() {
            return Ok(self);
        }
        let request = self.runtime.lock(self.key().to_owned()).read();
        let read = self.scope(request.acquire()).await?;
        let key = self.key().to_owned();
        self.release().await?;
        if read.is_lost() {
            drop(read);
            return Err(LockError::Lost { key });
        }
        Ok(read)
    }

    /// Gives the hold back and waits for the backend to confirm.
    ///
    /// Errors: [`LockError::Lost`] when the lock was lost while held,
    /// [`LockError::NotHeld`] when the backend no longer records it as ours
    /// (a fixed lease ran out), [`LockError::Backend`] when the backend
    /// cannot be reached (the lease then frees the lock).
    pub async fn release(self) -> Result<(), LockError> {
        self.release_to(true).await
    }

    /// [`release`](Self::release), without offering the hold to a local
    /// waiter: the backend always answers, so a hold it lost is found
    /// (`on_lost = "confirm"`).
    pub(crate) async fn release_confirmed(self) -> Result<(), LockError> {
        self.release_to(false).await
    }

    /// `pass`: the hold may go to a local waiter instead of the backend.
    async fn release_to(mut self, pass: bool) -> Result<(), LockError> {
        self.released = true;
        let held = self.held.clone();
        let released = self.runtime.table().release(&held, self.frame);
        if released == Released::Downgraded {
            // Awaited: the caller learns whether the hold still stands. (If
            // this future is dropped first, the backend keeps a write hold
            // until the read frames' release: more exclusive, never less.)
            let downgraded = self.runtime.backend().downgrade(&held);
            match self.runtime.run(downgraded).await {
                Ok(true) => {}
                // (No frame left: the read's release overtook the downgrade
                // and freed the key; see `HeldTable::has_frames`.)
                Ok(false) if !self.runtime.table().has_frames(&held) => {}
                Ok(false) => held.mark_lost(),
                Err(e) => return Err(e.into()),
            }
        }
        if released != Released::Last {
            // An enclosing hold of the same scope keeps the lock, or
            // shutdown gave it back already.
            return if self.runtime.is_shut_down() && held.is_lost() {
                Err(LockError::ShutDown)
            } else if held.is_lost() {
                Err(LockError::Lost {
                    key: held.key.clone(),
                })
            } else {
                Ok(())
            };
        }
        if pass && pass_locally(&self.runtime, &held) {
            return Ok(());
        }
        self.runtime.watchdog().remove(held.id);
        // If this future is dropped mid-flight, `pending` re-queues the
        // release in the background (a second release of a unique holder id
        // is harmless).
        let pending = PendingRelease {
            runtime: &self.runtime,
            held: Some(&held),
        };
        let hold = Holding::from(&*held);
        let outcome = self.runtime.run(self.runtime.backend().release(hold)).await;
        tracing::debug!(key = %held.key, fence = held.fence(), ?outcome, "lock released");
        // Unanswered (a connection lost on the way, a response timeout):
        // `pending`, dropped, sends the release again in the background, so
        // the key does not stay taken until its lease ends.
        if outcome.is_ok() {
            pending.done();
        }
        match outcome {
            Ok(Release::Freed | Release::StillHeld) if !held.is_lost() => Ok(()),
            Ok(Release::NotHeld) if !held.is_lost() => Err(LockError::NotHeld {
                key: held.key.clone(),
            }),
            Ok(_) => Err(LockError::Lost {
                key: held.key.clone(),
            }),
            Err(e) => Err(e.noting(RETRIED).into()),
        }
    }
}

impl LockGuard {
    /// Gives the hold back without waiting for the backend's answer (a
    /// locked call whose hold is known valid: see
    /// [`LockRuntime::release_behind`]). A local waiter of the key may get
    /// the hold instead, as on every release.
    pub(crate) fn release_behind(mut self) {
        self.released = true;
        if self.leaves_the_process() {
            self.runtime.release_behind(&self.held);
        }
    }

    /// Closes this guard's frame without waiting: `true` when the hold
    /// leaves the process and the backend must be told (the caller sends
    /// the release, out of the watchdog already). Otherwise an enclosing
    /// frame keeps it, its last write frame went (downgraded in the
    /// background), shutdown gave it back, or a local waiter took it.
    fn leaves_the_process(&self) -> bool {
        match self.runtime.table().release(&self.held, self.frame) {
            Released::Last => {}
            Released::Downgraded => {
                self.runtime.backend().downgrade_in_background(&self.held);
                return false;
            }
            // An enclosing hold of the same scope keeps the lock, or
            // shutdown gave it back already.
            Released::Kept => return false,
        }
        if pass_locally(&self.runtime, &self.held) {
            return false;
        }
        self.runtime.watchdog().remove(self.held.id);
        true
    }
}

/// Lock cohorting (`cohort.rs`): passes a hold whose last frame just went to
/// the first local waiter of its key, if the runtime's limits and the hold
/// allow it and that waiter asks for the same terms. The waiter finds a
/// guard in its slot (its frame already in the table, so shutdown closes it
/// like any other); if it has gone meanwhile, that guard's drop passes the
/// hold on again or releases it. `true`: passed, nothing to release.
fn pass_locally(runtime: &LockRuntime, held: &Arc<HeldLock>) -> bool {
    let limits = runtime.cohort();
    if !limits.is_on() || !runtime.backend().passes_locally() || runtime.is_shut_down() {
        return false;
    }
    if held.mode().is_read() {
        // Readers are never passed a hold: they share the key (see `Terms`).
        return false;
    }
    let terms = Terms {
        lease: held.lease,
        fair: held.fair,
        read: false,
    };
    let epoch = runtime.waiters().connection_epoch();
    let passed = runtime
        .waiters()
        .pass_to_head(&held.lock_key, terms, |scope: &Arc<Node>| {
            // Under the gate, like every hold that enters the table: a
            // shutdown that began meanwhile releases it instead.
            let passed = runtime.in_flight().admit(None, || {
                let fence = held.pass_to(scope.id, limits, epoch)?;
                Some((fence, runtime.table().insert_passed(held.clone(), scope)))
            });
            let (fence, frame) = passed.flatten()?;
            tracing::debug!(key = %held.key, fence, "lock passed to a local waiter");
            let (scope, mode) = (scope.clone(), held.mode());
            let guard = LockGuard::unentered(
                runtime.clone(),
                held.clone(),
                frame,
                (scope, mode),
                Way::Passed,
            );
            Some(Box::new(guard) as Passed)
        });
    if passed {
        runtime.count_passed();
        runtime.waiters().wake_owner(&held.lock_key, held.owner());
    }
    passed
}

/// A hold some way in produced (an acquire's answer, a handoff, a passed
/// hold, a join, a re-entry) that no task has entered yet. The only ways to
/// the [`LockGuard`] inside are [`enter_now`](Self::enter_now) and
/// [`enter`](Self::enter), which enter on the evidence present at that
/// moment (`gate.rs`); dropped, it gives the hold back like an unused guard.
#[derive(Debug)]
pub(crate) struct Unentered {
    guard: LockGuard,
    way: Way,
}

impl Unentered {
    pub(crate) fn held(&self) -> &Arc<HeldLock> {
        &self.guard.held
    }

    /// The hold's frame in the runtime's table.
    pub(crate) fn frame(&self) -> u64 {
        self.guard.frame
    }

    /// The gate, without waiting: `Ok(Some(guard))` if the hold may be
    /// entered now, `Ok(None)` if it was given back (ask the server anew),
    /// `Err(self)` if it needs a confirmation first ([`enter`](Self::enter)).
    pub(crate) fn enter_now(self) -> Result<Option<LockGuard>, Unentered> {
        let epoch = self.guard.runtime.waiters().connection_epoch();
        let evidence = Evidence::of(&self.guard.held, epoch, self.way);
        match gate::verdict(evidence) {
            Verdict::Enter => {
                tracing::debug!(
                    key = %self.guard.key(), fence = self.guard.fence(), way = ?self.way,
                    valid_ms = evidence.left.as_millis(), "lock entered"
                );
                Ok(Some(self.guard))
            }
            Verdict::Back => {
                tracing::debug!(
                    key = %self.guard.key(), way = ?self.way,
                    "a hold not known valid at entry is given back; asking the server"
                );
                Ok(None)
            }
            Verdict::Confirm => Err(self),
        }
    }

    /// The gate: the guard, if the hold may be entered now. A hold the
    /// backend confirmed only before a lost connection, or with too little
    /// of its validity left for a new holder, is renewed at once, and
    /// entered once that renewal found it in place (waiting at most until
    /// `bound`). `None`: the hold was given back (lost, unconfirmed
    /// by `bound`, or a fixed lease that nothing can confirm); ask the
    /// server anew.
    pub(crate) async fn enter(self, bound: Option<Instant>) -> Option<LockGuard> {
        let mut unentered = self;
        loop {
            match unentered.enter_now() {
                Ok(entered) => return entered,
                Err(unconfirmed) => {
                    if !unconfirmed.guard.confirmed(bound).await {
                        return None;
                    }
                    unentered = unconfirmed;
                }
            }
        }
    }
}

impl LockGuard {
    /// Whether a task could enter this hold as a new holder now (the entry
    /// gate's verdict on it, as on an acquire's answer), waiting (until
    /// `bound`) for a renewal to confirm it where the gate asks for one: a
    /// multi-key set enters its earlier keys again when its last is taken.
    pub(crate) async fn still_enterable(&self, bound: Option<Instant>) -> bool {
        loop {
            let epoch = self.runtime.waiters().connection_epoch();
            match gate::verdict(Evidence::of(&self.held, epoch, Way::Answer)) {
                Verdict::Enter => return true,
                Verdict::Back => return false,
                Verdict::Confirm => {
                    if !self.confirmed(bound).await {
                        return false;
                    }
                }
            }
        }
    }

    /// Renews the hold at once and waits (until `bound`) for a renewal
    /// sent from now on to find it in place, or for its loss: `false` if
    /// `bound` passed or the runtime shut down first.
    async fn confirmed(&self, bound: Option<Instant>) -> bool {
        if self.runtime.is_shut_down() {
            return false;
        }
        let seen = self.held.renewals();
        self.runtime.watchdog().renew_now(self.held.id);
        let confirmed = self.held.renewed_after(seen);
        match bound {
            Some(bound) => tokio::time::timeout_at(bound, confirmed).await.is_ok(),
            None => {
                confirmed.await;
                true
            }
        }
    }
}

/// What a release that got no answer adds to its error.
const RETRIED: &str = "the release is sent again in the background until the backend answers";

struct PendingRelease<'a> {
    runtime: &'a LockRuntime,
    held: Option<&'a Arc<HeldLock>>,
}

impl PendingRelease<'_> {
    fn done(mut self) {
        self.held = None;
    }
}

impl Drop for PendingRelease<'_> {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            self.runtime.backend().release_in_background(
                held.lock_key.clone(),
                held.holder.clone(),
                held.fair,
            );
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released || !self.leaves_the_process() {
            return;
        }
        self.runtime.backend().release_in_background(
            self.held.lock_key.clone(),
            self.held.holder.clone(),
            self.held.fair,
        );
    }
}
