//! Lock futures work on any executor.
//!
//! The runtime's timers (a waiter's sleep, a lease end, a try timeout) and
//! the Redis client's response timeouts need a tokio context when they are
//! first polled. A caller on another executor (`futures::executor::block_on`,
//! async-std, smol, a plain thread) has none, and without this module the
//! first contended acquire panicked inside the `redis` crate with "there is no
//! reactor running" — on Redis only, so tests on the embedded backend passed
//! and production broke. Every future of this crate that may wait is polled
//! through [`in_context`]: when the caller has no tokio context, each poll
//! enters the runtime's own (its worker thread drives the timers and
//! sockets); inside a tokio runtime the caller's context is used as is, so
//! nothing moves between threads.
//!
//! Only the crate's own futures are wrapped, never a locked body: a user's
//! `tokio::spawn` inside a body must not land on the lock runtime's thread.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::thread::ThreadId;

use tokio::runtime::Handle;

thread_local! {
    /// Set while [`InContext`] lends the runtime's context to a caller that
    /// has none.
    static LENT: Cell<bool> = const { Cell::new(false) };
}

pin_project_lite::pin_project! {
    /// A future polled inside the runtime's tokio context whenever its
    /// caller has none. (A struct, not an `async fn`: an async wrapper would
    /// keep a second copy of the wrapped future's state in its own.)
    pub(crate) struct InContext<'a, F> {
        handle: &'a Handle,
        #[pin]
        fut: F,
    }
}

/// Polls `fut` inside `handle`'s context whenever the caller has no tokio
/// context of its own.
pub(crate) fn in_context<F: Future>(handle: &Handle, fut: F) -> InContext<'_, F> {
    InContext { handle, fut }
}

impl<F: Future> Future for InContext<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        if LENT.get() || Handle::try_current().is_ok() {
            return this.fut.poll(cx);
        }
        let _entered = this.handle.enter();
        LENT.set(true);
        let _lent = Unlend;
        this.fut.poll(cx)
    }
}

/// Clears [`LENT`] when the poll ends, panicking or not.
struct Unlend;

impl Drop for Unlend {
    fn drop(&mut self) {
        LENT.set(false);
    }
}

/// Which tokio task is running: the unit in which a wait for one's own lock
/// can never end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Runner {
    /// A spawned task.
    Task(tokio::task::Id),
    /// The future of a `block_on` (`#[tokio::main]`, `#[tokio::test]`): not
    /// a task, but alone on its thread.
    BlockOn(ThreadId),
}

/// The tokio task or `block_on` running now; `None` on other executors
/// (one of their threads may run many futures, so the thread says nothing).
pub(crate) fn runner() -> Option<Runner> {
    if let Some(id) = tokio::task::try_id() {
        return Some(Runner::Task(id));
    }
    if LENT.get() || Handle::try_current().is_err() {
        return None;
    }
    Some(Runner::BlockOn(std::thread::current().id()))
}
