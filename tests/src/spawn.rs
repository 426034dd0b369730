//! Acquires that run in tasks of their own, so that a test can act (release,
//! freeze a server, move a slot) while they wait, and then see when and how
//! each ended.

use std::future::Future;
use std::time::Duration;

use lock_runtime::{LockError, LockGuard, LockRequest, LockRuntime};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The outcome of a spawned acquire: when it ended, and how.
pub type Timed = (Instant, Result<LockGuard, LockError>);

/// Spawns `request.acquire()`; the task returns the moment the acquire
/// ended (taken right after it returned), and its outcome.
pub fn spawn_acquire(request: LockRequest) -> JoinHandle<Timed> {
    tokio::spawn(async move {
        let got = request.acquire().await;
        (Instant::now(), got)
    })
}

/// Spawns `request.acquire()` and waits for it to end: the outcome of an
/// acquire made by another task, which is not the caller's hold (so it is
/// neither a re-entry nor a local pass of the caller's).
pub async fn acquire_elsewhere(request: LockRequest) -> Result<LockGuard, LockError> {
    tokio::spawn(request.acquire())
        .await
        .expect("the acquiring task ran")
}

/// Spawns `request.acquire()` (a request of `runtime`) and waits until
/// `runtime` counts one more key waited for: the acquire is then waiting,
/// subscribed to the key's release. Panics naming `what` if it never waits.
pub async fn spawn_waiting(
    runtime: &LockRuntime,
    request: LockRequest,
    what: &str,
) -> JoinHandle<Timed> {
    let before = runtime.stats().waiting_keys;
    let task = spawn_acquire(request);
    crate::wait_until(what, || runtime.stats().waiting_keys == before + 1).await;
    task
}

/// Waits for every task of `tasks` to end, each without a panic, all
/// within `limit`; `what` names a hang in the failure.
pub async fn join_within(tasks: Vec<JoinHandle<()>>, limit: Duration, what: &str) {
    let all = async {
        for task in tasks {
            task.await.unwrap();
        }
    };
    tokio::time::timeout(limit, all)
        .await
        .unwrap_or_else(|_| panic!("{what} hung"));
}

/// Spawns `count` tasks running `body(task, runtime)`, the even ones on
/// `clients.0` and the odd ones on `clients.1` (two clients of one backend,
/// so that contenders meet both in a process and across processes), and
/// waits for them all as [`join_within`] does.
pub async fn on_two_clients<Fut>(
    clients: (&LockRuntime, &LockRuntime),
    count: usize,
    body: impl Fn(usize, LockRuntime) -> Fut,
    (limit, what): (Duration, &str),
) where
    Fut: Future<Output = ()> + Send + 'static,
{
    let tasks = (0..count)
        .map(|task| {
            let runtime = if task % 2 == 0 { clients.0 } else { clients.1 };
            tokio::spawn(body(task, runtime.clone()))
        })
        .collect();
    join_within(tasks, limit, what).await;
}
