//! An executor of its own that a test can stall, as CPU work (or a blocking
//! call) stalls a busy service's `current_thread` executor: a `current_thread`
//! tokio runtime on a thread, whose only thread the test blocks until it
//! says resume. What runs on the lock runtime's own thread (scripts answered,
//! messages recorded, renewals) goes on meanwhile; the stalled tasks run
//! again only when resumed, and find what happened in between.

use std::future::Future;
use std::sync::mpsc as std_mpsc;
use std::task::Poll;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The longest a stall lasts when the test never resumes it.
const STALL_LIMIT: Duration = Duration::from_secs(60);

/// A `current_thread` executor on a thread of its own, that can be stalled.
pub struct StallableExecutor {
    handle: tokio::runtime::Handle,
    stall: Option<tokio::sync::mpsc::UnboundedSender<Stall>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A stall request: the executor says it stalled, then waits for `resume`.
struct Stall {
    stalled: std_mpsc::Sender<()>,
    resume: std_mpsc::Receiver<()>,
}

impl StallableExecutor {
    /// Starts the executor's thread.
    pub fn start() -> StallableExecutor {
        let (handle_tx, handle_rx) = std_mpsc::channel();
        let (stall_tx, mut stall_rx) = tokio::sync::mpsc::unbounded_channel::<Stall>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a current_thread runtime");
            handle_tx.send(rt.handle().clone()).expect("the test waits");
            rt.block_on(async move {
                while let Some(stall) = stall_rx.recv().await {
                    let _ = stall.stalled.send(());
                    // Blocks the executor's only thread: no task of it runs.
                    let _ = stall.resume.recv_timeout(STALL_LIMIT);
                }
            });
        });
        StallableExecutor {
            handle: handle_rx.recv().expect("the executor started"),
            stall: Some(stall_tx),
            thread: Some(thread),
        }
    }

    /// The executor, to spawn tasks on.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }

    /// Blocks the executor's thread; returns the sender that resumes it.
    pub fn stall(&self) -> std_mpsc::Sender<()> {
        let (stalled, stalled_rx) = std_mpsc::channel();
        let (resume_tx, resume) = std_mpsc::channel();
        if let Some(stall) = &self.stall {
            stall
                .send(Stall { stalled, resume })
                .expect("the executor runs");
        }
        tokio::task::block_in_place(|| stalled_rx.recv_timeout(Duration::from_secs(10)))
            .expect("the executor stalled");
        resume_tx
    }

    /// Spawns `fut` on the executor, polls it once, and stalls the
    /// executor right after that first poll: whatever the future's first
    /// step sent out (an acquire's script) is answered meanwhile on other
    /// threads, and the future goes on only once the returned sender says
    /// resume (or is dropped). Panics if `fut` finished at its first poll.
    pub async fn poll_once_then_stall<F>(
        &self,
        fut: F,
    ) -> (std_mpsc::Sender<()>, JoinHandle<F::Output>)
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let (polled_tx, polled_rx) = oneshot::channel();
        let (resume_tx, resume_rx) = std_mpsc::channel::<()>();
        let task = self.handle.spawn(async move {
            let mut fut = std::pin::pin!(fut);
            let first = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await;
            if let Poll::Ready(out) = first {
                let _ = polled_tx.send(false);
                return out;
            }
            let _ = polled_tx.send(true);
            // Blocks the executor's only thread, right after the first poll.
            let _ = resume_rx.recv_timeout(STALL_LIMIT);
            fut.await
        });
        let pending = polled_rx.await.expect("the executor ran the future");
        assert!(pending, "the future finished at its first poll");
        (resume_tx, task)
    }
}

impl Drop for StallableExecutor {
    fn drop(&mut self) {
        self.stall = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
