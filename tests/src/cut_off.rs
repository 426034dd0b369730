//! A holder cut off from its store, the way the store-backed backends
//! (etcd, ZooKeeper) are tested for it: a holder process stopped (SIGSTOP)
//! past its lease, or a holder whose network stalls. Either way nobody else
//! may enter before the holder stopped counting on its hold, and the holder
//! is told the hold was lost.

use std::process::Command;
use std::time::Duration;

use lock_runtime::{LockGuard, LockRuntime};
use lock_testkit::signal::{self, Signal};
use lock_testkit::LineChild;
use tokio::time::Instant;

/// How long a step of these tests may take that should come at once.
const PATIENCE: Duration = Duration::from_secs(10);

/// A contender process holding `k` (a lease of 1 s) on the store at `url`
/// under the prefix `prefix`, stopped (SIGSTOP) right after it took it.
pub struct StoppedHolder {
    child: LineChild,
    /// The token of its hold.
    pub token: u64,
    /// When it was stopped.
    pub stopped: Instant,
}

impl StoppedHolder {
    /// Starts the contender binary `bin` (`contender_bin!()`, which only
    /// a test target knows), waits until it holds `k`, and stops it.
    pub async fn start(bin: &str, url: &str, prefix: &str) -> StoppedHolder {
        let mut command = Command::new(bin);
        command.args([url, prefix, "hold", "k", "1000"]);
        let mut child = LineChild::spawn(&mut command, "contender").unwrap();
        let held = child.next_line(PATIENCE).await.unwrap();
        let token: u64 = held.strip_prefix("held ").unwrap().parse().unwrap();
        signal::send(child.pid(), Signal::Stop).unwrap();
        StoppedHolder {
            child,
            token,
            stopped: Instant::now(),
        }
    }

    /// `other` takes `k` (waiting up to 10 s); returns its hold and how
    /// long after the stop it got it, and checks its token is larger.
    pub async fn taken_over_by(&self, other: &LockRuntime) -> (LockGuard, Duration) {
        let guard = other.lock("k").wait(PATIENCE).acquire().await.unwrap();
        let waited = self.stopped.elapsed();
        println!("entered {waited:?} after the holder stopped");
        let theirs = self.token;
        assert!(guard.fence() > theirs, "{} after {theirs}", guard.fence());
        (guard, waited)
    }

    /// Resumes the process and checks it is told its hold was lost.
    pub async fn resumed_is_told_lost(mut self) {
        signal::send(self.child.pid(), Signal::Cont).unwrap();
        let told = self.child.next_line(PATIENCE).await.unwrap();
        assert_eq!(told, "lost");
    }
}

/// The stopped-holder behaviour: a contender process on the store at `url`
/// holding `k` under `prefix` (see [`StoppedHolder`]) is stopped; `other`,
/// a runtime on the same store built after the stop, must enter no sooner
/// than `at_least` after it (the store's own expiry of the holder), with a
/// larger token; the stopped one, resumed, is told its hold was lost.
pub async fn a_stopped_holder_is_outlived(
    (bin, url, prefix): (&str, &str, &str),
    other: impl std::future::Future<Output = LockRuntime>,
    at_least: Duration,
) {
    let holder = StoppedHolder::start(bin, url, prefix).await;
    let (guard, waited) = holder.taken_over_by(&other.await).await;
    assert!(
        waited >= at_least,
        "entered {waited:?} after the stop: within the stopped holder's lease"
    );
    holder.resumed_is_told_lost().await;
    guard.release().await.unwrap();
}

/// Stalls `proxy` (the way of `guard`'s holder to its store) while `other`
/// waits for the lock `k`: the holder must be told its hold is lost before
/// `other` enters, with a larger token. Resumes the proxy; `other`'s guard.
pub async fn told_lost_before_the_other_enters(
    proxy: &crate::FaultProxy,
    guard: &LockGuard,
    other: LockRuntime,
) -> LockGuard {
    proxy.stall();
    let waiter = crate::spawn_acquire(other.lock("k").wait(PATIENCE));
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the stalled holder was told it lost the lock");
    let lost_at = Instant::now();
    let (entered, next) = waiter.await.unwrap();
    let next = next.unwrap();
    assert!(
        lost_at <= entered,
        "the other entered {:?} before the holder was told",
        lost_at - entered
    );
    assert!(next.fence() > guard.fence());
    proxy.resume();
    next
}
