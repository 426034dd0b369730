//! The etcd cluster's faults: a member frozen (SIGSTOP), a member killed
//! and started again from its data directory (the leader, most often: the
//! cluster elects another meanwhile), and every member killed and started
//! again from disk (a power cut). etcd syncs its log before it answers, and
//! keeps leases on disk, so none of these loses a key or a lease: each is
//! an outage, not data loss, and the checker excuses no overlap for it.
//!
//! `EtcdCluster`'s calls block (a restart waits until the member is
//! healthy; finding the leader runs `etcdctl`): they run in
//! `block_in_place`, beside the proxies' tasks.

use lock_testkit::EtcdCluster;

use super::faults::millis;
use crate::XorShift;

/// Member `n`, named for a report, and whether it leads.
fn named(n: usize, leader: Option<usize>) -> String {
    if leader == Some(n) {
        format!("etcd member m{n} (the leader)")
    } else {
        format!("etcd member m{n}")
    }
}

/// The member to hit: the leader with `leader_percent` % probability (when
/// one answers), else one at random.
fn pick(cluster: &EtcdCluster, rng: &mut XorShift, leader_percent: u64) -> (usize, Option<usize>) {
    let leader = tokio::task::block_in_place(|| cluster.leader());
    let at_random = rng.below(cluster.size() as u64) as usize;
    match leader {
        Some(l) if rng.below(100) < leader_percent => (l, leader),
        _ => (at_random, leader),
    }
}

/// SIGSTOPs a member (the leader half the time) for 200 ms to 2 s: its
/// clients' requests and watches on it hang meanwhile; what was done.
pub(super) async fn freeze(cluster: &EtcdCluster, rng: &mut XorShift) -> String {
    let (n, leader) = pick(cluster, rng, 50);
    let d = millis(rng, 200, 2000);
    cluster.freeze(n);
    tokio::time::sleep(d).await;
    cluster.thaw(n);
    format!("SIGSTOP {} for {} ms", named(n, leader), d.as_millis())
}

/// Kills a member (the leader two times in three) with SIGKILL, waits 200
/// ms to 2 s, and starts it again from its data directory (waiting until
/// it is healthy); what was done.
pub(super) async fn kill_and_restart(cluster: &mut EtcdCluster, rng: &mut XorShift) -> String {
    let (n, leader) = pick(cluster, rng, 67);
    let d = millis(rng, 200, 2000);
    cluster.kill(n);
    tokio::time::sleep(d).await;
    let started = std::time::Instant::now();
    tokio::task::block_in_place(|| cluster.restart(n));
    format!(
        "kill {} for {} ms, restart it from its data directory (healthy after {} ms)",
        named(n, leader),
        d.as_millis(),
        started.elapsed().as_millis()
    )
}

/// Kills every member and starts them all again from their data
/// directories, waiting until all are healthy; what was done.
pub(super) async fn restart_all(cluster: &mut EtcdCluster) -> String {
    let started = std::time::Instant::now();
    tokio::task::block_in_place(|| cluster.restart_all());
    format!(
        "kill every etcd member and restart the cluster from its data directories (healthy \
         after {} ms)",
        started.elapsed().as_millis()
    )
}

/// Kills the leader (or, `whole`, every member), runs `meanwhile` after
/// `away`, while etcd is gone or electing, and then starts what it killed
/// again from the data directories (waiting until healthy); what was done.
pub(super) async fn kill_for<F: std::future::Future<Output = ()>>(
    cluster: &mut EtcdCluster,
    whole: bool,
    away: std::time::Duration,
    meanwhile: impl FnOnce() -> F,
) -> String {
    let leader = if whole {
        None
    } else {
        tokio::task::block_in_place(|| cluster.leader())
    };
    let killed: Vec<usize> = match leader {
        Some(n) => vec![n],
        None if !whole => vec![0],
        None => (0..cluster.size()).collect(),
    };
    for &n in &killed {
        cluster.kill(n);
    }
    tokio::time::sleep(away).await;
    meanwhile().await;
    let started = std::time::Instant::now();
    tokio::task::block_in_place(|| {
        if whole {
            cluster.restart_all();
        } else {
            cluster.restart(killed[0]);
        }
    });
    let named = if whole {
        "every etcd member".to_owned()
    } else {
        named(killed[0], leader)
    };
    format!(
        "kill {named}, restart from the data directories (healthy {} ms after the restart)",
        started.elapsed().as_millis()
    )
}
