//! Lock futures work on any executor, and in any tokio runtime.
//!
//! The runtime's timers (a waiter's sleep, a lease end, a try timeout) and
//! the Redis client's response timeouts need a tokio context with a time
//! driver when they are created and first polled. A caller on another
//! executor (`futures::executor::block_on`, async-std, smol, a plain
//! thread) has no tokio context at all, and a tokio runtime built without
//! `enable_time()` has one without timers: either way the first timer
//! panicked (inside the `redis` crate, or in `tokio::time`). So every future
//! of this crate that may wait is polled through [`in_context`], which
//! enters the lock runtime's own context (its worker thread drives the
//! timers and sockets) around each poll, whatever the caller's context is.
//! The future itself still runs on the caller's thread; only what it
//! registers (a timer, a socket, a helper task) belongs to the lock runtime,
//! whose thread lives as long as the `LockRuntime` that the future borrows.
//!
//! Why always, and not only when the caller's context lacks a timer: tokio
//! (1.54) has no way to ask a `Handle` whether it has a time driver
//! (tokio-rs/tokio#8361, still open). The only probe is to create a timer
//! and catch the panic, which runs the process's panic hook (a report to
//! an error tracker, a line on stderr) and aborts under `panic = "abort"`.
//! This library must not panic, so it does not probe: it enters its own
//! context, which costs what the previous check (`Handle::try_current`, one
//! reference count) cost, and also keeps an acquire's timers working when
//! the caller's runtime shuts down while the acquire is moved elsewhere.
//!
//! Only the crate's own futures are wrapped, never a locked body: a user's
//! `tokio::spawn` inside a body must not land on the lock runtime's thread.
//!
//! The module also says which task is running (see [`runner`]), for the
//! warning a task gets when it waits for a lock that a guard it took holds.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use tokio::runtime::Handle;

thread_local! {
    /// Set while an [`InContext`] poll has the runtime's context entered on
    /// this thread (an inner one then leaves it as it is).
    static LENT: Cell<bool> = const { Cell::new(false) };
    /// The waker of that poll, as [`Runner::Waker`] records it.
    static POLLED_BY: Cell<Option<(usize, usize)>> = const { Cell::new(None) };
}

pin_project_lite::pin_project! {
    /// A future polled inside the runtime's tokio context. (A struct, not
    /// an `async fn`: an async wrapper would keep a second copy of the
    /// wrapped future's state in its own.)
    pub(crate) struct InContext<'a, F> {
        handle: &'a Handle,
        #[pin]
        fut: F,
    }
}

/// Polls `fut` inside `handle`'s context (see the module docs).
pub(crate) fn in_context<F: Future>(handle: &Handle, fut: F) -> InContext<'_, F> {
    InContext { handle, fut }
}

impl<F: Future> Future for InContext<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        if LENT.get() {
            return this.fut.poll(cx);
        }
        let _entered = this.handle.enter();
        LENT.set(true);
        POLLED_BY.set(Some(waker_id(cx.waker())));
        let _lent = Unlend;
        this.fut.poll(cx)
    }
}

/// Clears [`LENT`] and [`POLLED_BY`] when the poll ends, panicking or not.
struct Unlend;

impl Drop for Unlend {
    fn drop(&mut self) {
        LENT.set(false);
        POLLED_BY.set(None);
    }
}

/// A waker's identity: its data and vtable pointers, the pair that
/// `Waker::will_wake` compares. Compared, never dereferenced.
fn waker_id(waker: &Waker) -> (usize, usize) {
    (
        waker.data() as usize,
        std::ptr::from_ref(waker.vtable()) as usize,
    )
}

/// Which task is running a lock future, as far as the runtime can tell.
///
/// Only a hint: a guard is `Send`, and the runtime cannot see it move to
/// another task, so "the task that took the guard" is never proof of "the
/// task that holds it now" (see `HeldTable::taken_by_this_task`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Runner {
    /// A tokio task (`tokio::spawn`, `spawn_local`): its id, unique for
    /// the life of the process.
    Task(tokio::task::Id),
    /// Anything else (the future of a `block_on`, a task of another
    /// executor, polled in a tokio context or not): the waker it is polled
    /// with, which an executor gives each of its tasks. Two futures under one
    /// waker are woken together, like the arms of one `join!`; a waker's
    /// address may be reused once its task is gone.
    Waker(usize, usize),
}

/// The task running the current poll of a lock future, when one runs.
pub(crate) fn runner() -> Option<Runner> {
    if let Some(id) = tokio::task::try_id() {
        return Some(Runner::Task(id));
    }
    POLLED_BY
        .get()
        .map(|(data, vtable)| Runner::Waker(data, vtable))
}
