//! [`with_lock`]: a body run under a lock, in an owner scope of its own. This
//! is what `#[distributed_lock]` expands to (through `__private::locked`).

use std::future::Future;
use std::sync::Arc;

use tracing::Instrument;

use crate::error::LockError;
use crate::guard::LockGuard;
use crate::held::HeldLock;
use crate::owner::{self, Scope};
use crate::request::{LockRequest, OnLost};

/// Runs `body` while holding the lock of `request`, and releases it after.
///
/// The body runs in an owner scope of its own, a child of the caller's, so
/// locked calls nested inside it re-enter, and [`fence`](crate::fence)
/// returns this lock's token there. Re-entry is strict nesting: two locked
/// calls on the same key running side by side inside the body (both arms of
/// a `join!`) do not both enter; the second waits, in the process and without
/// a round trip, until the first is done, then re-enters in turn.
/// If the lock is lost while the body runs, [`OnLost::Abort`] (the default)
/// drops the body at its next await and returns `Err(LockError::Lost)`;
/// [`OnLost::Continue`] lets it finish and logs the loss. A panic or a
/// cancelled call frees the lock through the runtime's background releaser.
///
/// When the body is done on a hold known valid to its end (not lost, its
/// lease still ahead on the client's clock, confirmed by the backend since
/// any lost connection), the call returns at once and its release follows
/// in the background: one round trip per uncontended call. This process's
/// next acquire of the key is ordered after that release; another
/// process's try may still find the key held for that moment. A hold the
/// release finds gone (forced free during the body, unnoticed by
/// renewals) is then only logged and counted as lost;
/// [`OnLost::Confirm`] waits for the release's answer and returns
/// `Err(LockError::Lost)` for it.
///
/// This is what `#[distributed_lock]` expands to.
///
/// ```
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// use lock_runtime::{lock, with_lock, LockError};
/// # lock_runtime::LockRuntime::builder().memory().build().await?.install().ok();
/// let total = with_lock(lock("cart:9"), async {
///     // Nested use of the same key re-enters instead of waiting on itself.
///     with_lock(lock("cart:9"), async { Ok::<_, LockError>(2) }).await
/// })
/// .await?;
/// assert_eq!(total, 2);
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
pub async fn with_lock<T, E, F>(request: LockRequest, body: F) -> Result<T, E>
where
    F: Future<Output = Result<T, E>>,
    E: From<LockError>,
{
    let on_lost = request.on_lost;
    // The body runs in a scope of its own, a child of the caller's.
    let node = owner::new_child();
    let guard = request.acquire_as(Some(node.clone())).await?;
    // Nothing enters on a hold that is lost by now (the acquire ended a
    // while ago, perhaps: the executor stalled, the process was stopped).
    if guard.is_lost() {
        return Err(lost_or_shut_down(guard).into());
    }
    let outer = owner::current();
    let scope = Scope {
        node,
        fence: Some(guard.fence()),
        fences: outer.as_ref().and_then(|s| s.fences.clone()),
        permit: guard.held_permit().or(outer.and_then(|s| s.permit)),
    };
    // The body runs in a span of the hold: the user's own spans nest in it.
    let hold = tracing::debug_span!("lock_hold", key = %guard.key(), fence = guard.fence());
    let body = owner::enter(scope, body).instrument(hold);
    let result = match on_lost {
        OnLost::Abort | OnLost::Confirm => {
            let held: &Arc<HeldLock> = guard.held();
            let lost = guard.runtime().run(held.lost());
            match unless_lost!(held.is_lost(), lost, body) {
                Some(result) => result,
                None => return Err(lost_or_shut_down(guard).into()),
            }
        }
        OnLost::Continue => body.await,
    };
    release_after(guard, on_lost, result).await
}

/// Gives `guard`'s hold back after a locked body that returned `result`,
/// and says what the call returns: `result`, or the loss the release found
/// (as `on_lost` says).
pub(crate) async fn release_after<T, E: From<LockError>>(
    guard: LockGuard,
    on_lost: OnLost,
    result: Result<T, E>,
) -> Result<T, E> {
    // The body ran on a hold known valid to its end: not lost, its
    // client-side lease end still ahead, and confirmed by the backend since
    // the connection was last lost. Nothing the release could answer would
    // change the call's outcome, so it does not wait for the answer (one
    // round trip per call, see `LockRuntime::release_behind`).
    let epoch = guard.runtime().waiters().connection_epoch();
    if on_lost != OnLost::Confirm
        && guard.runtime().backend().releases_behind()
        && guard.held().fit_to_enter(epoch)
    {
        guard.release_behind();
        return result;
    }
    let aborts = on_lost != OnLost::Continue;
    let released = if on_lost == OnLost::Confirm {
        // Straight to the backend, whose answer is the point (a hold passed
        // to a local waiter would never be answered for).
        guard.release_confirmed().await
    } else {
        guard.release().await
    };
    match released {
        Ok(()) => result,
        Err(LockError::Lost { key } | LockError::NotHeld { key }) if aborts && result.is_ok() => {
            Err(LockError::Lost { key }.into())
        }
        Err(LockError::ShutDown) if aborts && result.is_ok() => Err(LockError::ShutDown.into()),
        // Nothing confirmed the hold: `confirm` does not say `Ok` then.
        Err(error) if on_lost == OnLost::Confirm && result.is_ok() => Err(error.into()),
        Err(error) => {
            tracing::warn!(%error, "lock trouble after the body finished; returning its result");
            result
        }
    }
}

/// Runs the future `$body` while the hold stands (`$is_lost` says it does
/// not; the future `$lost` resolves when it is lost): `None` once it is
/// known lost. The loss first: a body is never polled again (nor for the
/// first time) once its hold is known lost. Checked without a timer before
/// each poll of the body; the watch for a loss (a timer at the lease end)
/// is only set up once the body waits.
///
/// A macro, not an `async fn`: a fn would keep its parameter and its pinned
/// copy of the body both in its state, and a locked body holding a nested
/// locked call would then grow several times with each level (a read in a
/// write in a read fn took 238 KB and overflowed a test thread's stack).
macro_rules! unless_lost {
    ($is_lost:expr, $lost:expr, $body:expr) => {{
        let (mut lost, mut body) = (std::pin::pin!($lost), std::pin::pin!($body));
        std::future::poll_fn(|cx| {
            if $is_lost {
                return std::task::Poll::Ready(None);
            }
            if let std::task::Poll::Ready(result) = body.as_mut().poll(cx) {
                return std::task::Poll::Ready(Some(result));
            }
            lost.as_mut().poll(cx).map(|()| None)
        })
        .await
    }};
}
pub(crate) use unless_lost;

/// The error of a locked call whose hold was lost (or closed by shutdown).
pub(crate) fn lost_or_shut_down(guard: LockGuard) -> LockError {
    let key = guard.key().to_owned();
    let shut_down = guard.runtime().is_shut_down();
    drop(guard);
    if shut_down {
        LockError::ShutDown
    } else {
        LockError::Lost { key }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Metadata, Subscriber};

    use crate::{with_lock, LockError, LockRuntime};

    /// Remembers span names and the `outcome` field of events.
    #[derive(Default)]
    struct Seen {
        spans: Mutex<Vec<String>>,
        outcomes: Mutex<Vec<String>>,
    }

    struct Recorder(Arc<Seen>);

    struct Outcome<'a>(&'a Mutex<Vec<String>>);

    impl Visit for Outcome<'_> {
        fn record_str(&mut self, field: &Field, value: &str) {
            if field.name() == "outcome" || field.name() == "key" {
                self.0
                    .lock()
                    .unwrap()
                    .push(format!("{}={value}", field.name()));
            }
        }
        fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
    }

    impl Subscriber for Recorder {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, span: &Attributes<'_>) -> Id {
            let mut spans = self.0.spans.lock().unwrap();
            spans.push(span.metadata().name().to_owned());
            Id::from_u64(spans.len() as u64)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            event.record(&mut Outcome(&self.0.outcomes));
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    /// An acquire runs in a `lock_acquire` span and reports how it ended
    /// (a try-once that finds the lock held is `busy`), and a locked body
    /// runs in a `lock_hold` span (so the user's own spans nest in it).
    #[tokio::test(flavor = "current_thread")]
    async fn acquires_and_holds_are_visible_to_tracing() {
        let seen = Arc::new(Seen::default());
        let _default = crate::captured::on_this_thread(Recorder(seen.clone()));
        let runtime = LockRuntime::builder().memory().build().await.unwrap();
        with_lock(runtime.lock("k"), async { Ok::<_, LockError>(()) })
            .await
            .unwrap();
        let _guard = runtime.lock("busy").acquire().await.unwrap();
        let busy = runtime.lock("busy").try_acquire().await.unwrap();
        assert!(busy.is_none());
        let spans = seen.spans.lock().unwrap().clone();
        assert!(spans.contains(&"lock_hold".to_owned()), "{spans:?}");
        assert!(spans.contains(&"lock_acquire".to_owned()), "{spans:?}");
        let outcomes = seen.outcomes.lock().unwrap().clone();
        assert!(
            outcomes.contains(&"outcome=acquired".to_owned()),
            "{outcomes:?}"
        );
        assert!(
            outcomes.contains(&"outcome=busy".to_owned()),
            "{outcomes:?}"
        );
        // Every `lock_acquire` event names its key, also on success (a new
        // hold takes the request's key).
        let keys: Vec<&String> = outcomes.iter().filter(|f| f.starts_with("key=")).collect();
        assert_eq!(keys.len(), 3, "{outcomes:?}");
        assert!(
            keys.iter().all(|k| *k == "key=k" || *k == "key=busy"),
            "{keys:?}"
        );
    }
}
