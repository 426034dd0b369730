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

use std::future::Future;
use std::pin::pin;
use std::task::Poll;

use tokio::runtime::Handle;

/// Polls `fut` inside `handle`'s context whenever the caller has no tokio
/// context of its own.
pub(crate) async fn in_context<F: Future>(handle: &Handle, fut: F) -> F::Output {
    let mut fut = pin!(fut);
    std::future::poll_fn(|cx| -> Poll<F::Output> {
        if Handle::try_current().is_ok() {
            fut.as_mut().poll(cx)
        } else {
            let _entered = handle.enter();
            fut.as_mut().poll(cx)
        }
    })
    .await
}
