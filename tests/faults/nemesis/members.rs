//! The faults of a replicated store, an etcd cluster or a ZooKeeper
//! ensemble of three: a member frozen (SIGSTOP), a member killed and
//! started again from its data directory (the leader, most often: the
//! others elect another meanwhile), and every member killed and started
//! again from disk (a power cut). Both sync their log before they answer a
//! write and keep their leases (etcd) or sessions (ZooKeeper) on disk, so
//! none of these loses a key, a lease or a session: each is an outage, not
//! data loss, and the checker excuses no overlap for it.
//!
//! Finding the leader and an etcd member's restart block (a restart waits
//! until the member serves; finding the leader asks every member): they
//! run in `block_in_place`, beside the proxies' tasks.

use lock_testkit::{EtcdCluster, ZooKeeperEnsemble};

use super::faults::millis;
use crate::XorShift;

/// The members of a replicated store, and what the faults do to them.
pub(super) enum Cluster {
    Etcd(EtcdCluster),
    ZooKeeper(ZooKeeperEnsemble),
}

impl Cluster {
    /// How many members.
    pub(super) fn size(&self) -> usize {
        match self {
            Cluster::Etcd(cluster) => cluster.size(),
            Cluster::ZooKeeper(ensemble) => ensemble.size(),
        }
    }

    /// The loopback client port of each member, in order.
    pub(super) fn ports(&self) -> Vec<u16> {
        (0..self.size())
            .map(|n| match self {
                Cluster::Etcd(cluster) => super::store::port_of(&cluster.endpoint(n)),
                Cluster::ZooKeeper(ensemble) => ensemble.port(n),
            })
            .collect()
    }

    /// The member that leads now, if one answers.
    pub(super) fn leader(&self) -> Option<usize> {
        tokio::task::block_in_place(|| match self {
            Cluster::Etcd(cluster) => cluster.leader(),
            Cluster::ZooKeeper(ensemble) => ensemble.leader(),
        })
    }

    /// Member `n`, named for a report, and whether it leads.
    pub(super) fn named(&self, n: usize, leader: Option<usize>) -> String {
        let member = match self {
            Cluster::Etcd(_) => format!("etcd member m{n}"),
            Cluster::ZooKeeper(_) => format!("ZooKeeper server z{n}"),
        };
        if leader == Some(n) {
            format!("{member} (the leader)")
        } else {
            member
        }
    }

    /// Every member, named for a report.
    fn all_named(&self) -> &'static str {
        match self {
            Cluster::Etcd(_) => "every etcd member",
            Cluster::ZooKeeper(_) => "every ZooKeeper server",
        }
    }

    fn kill(&mut self, n: usize) {
        match self {
            Cluster::Etcd(cluster) => cluster.kill(n),
            Cluster::ZooKeeper(ensemble) => ensemble.kill(n),
        }
    }

    /// Starts member `n` again from its data directory, once it serves.
    async fn restart(&mut self, n: usize) {
        match self {
            Cluster::Etcd(cluster) => tokio::task::block_in_place(|| cluster.restart(n)),
            Cluster::ZooKeeper(ensemble) => ensemble.restart(n).await,
        }
    }

    /// Kills every member and starts them again from their data
    /// directories, once all serve.
    async fn restart_all(&mut self) {
        match self {
            Cluster::Etcd(cluster) => tokio::task::block_in_place(|| cluster.restart_all()),
            Cluster::ZooKeeper(ensemble) => ensemble.restart_all().await,
        }
    }

    fn freeze(&self, n: usize) {
        match self {
            Cluster::Etcd(cluster) => cluster.freeze(n),
            Cluster::ZooKeeper(ensemble) => ensemble.freeze(n),
        }
    }

    fn thaw(&self, n: usize) {
        match self {
            Cluster::Etcd(cluster) => cluster.thaw(n),
            Cluster::ZooKeeper(ensemble) => ensemble.thaw(n),
        }
    }
}

/// The member to hit: the leader with `leader_percent` % probability (when
/// one answers), else one at random.
fn pick(cluster: &Cluster, rng: &mut XorShift, leader_percent: u64) -> (usize, Option<usize>) {
    let leader = cluster.leader();
    let at_random = rng.below(cluster.size() as u64) as usize;
    match leader {
        Some(l) if rng.below(100) < leader_percent => (l, leader),
        _ => (at_random, leader),
    }
}

/// SIGSTOPs a member (the leader half the time) for 200 ms to 2 s: its
/// clients' requests and watches on it hang meanwhile; what was done.
pub(super) async fn freeze(cluster: &Cluster, rng: &mut XorShift) -> String {
    let (n, leader) = pick(cluster, rng, 50);
    let d = millis(rng, 200, 2000);
    cluster.freeze(n);
    tokio::time::sleep(d).await;
    cluster.thaw(n);
    format!(
        "SIGSTOP {} for {} ms",
        cluster.named(n, leader),
        d.as_millis()
    )
}

/// Kills a member (the leader two times in three) with SIGKILL, waits 200
/// ms to 2 s, and starts it again from its data directory (waiting until
/// it serves); what was done.
pub(super) async fn kill_and_restart(cluster: &mut Cluster, rng: &mut XorShift) -> String {
    let (n, leader) = pick(cluster, rng, 67);
    let d = millis(rng, 200, 2000);
    cluster.kill(n);
    tokio::time::sleep(d).await;
    let started = std::time::Instant::now();
    cluster.restart(n).await;
    format!(
        "kill {} for {} ms, restart it from its data directory (serving after {} ms)",
        cluster.named(n, leader),
        d.as_millis(),
        started.elapsed().as_millis()
    )
}

/// Kills every member and starts them all again from their data
/// directories, waiting until all serve; what was done.
pub(super) async fn restart_all(cluster: &mut Cluster) -> String {
    let started = std::time::Instant::now();
    cluster.restart_all().await;
    format!(
        "kill {} and restart them from their data directories (serving after {} ms)",
        cluster.all_named(),
        started.elapsed().as_millis()
    )
}

/// Kills the leader (or, `whole`, every member), runs `meanwhile` after
/// `away`, while the store is gone or electing, and then starts what it
/// killed again from the data directories (waiting until they serve); what
/// was done.
pub(super) async fn kill_for<F: std::future::Future<Output = ()>>(
    cluster: &mut Cluster,
    whole: bool,
    away: std::time::Duration,
    meanwhile: impl FnOnce() -> F,
) -> String {
    let leader = if whole { None } else { cluster.leader() };
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
    if whole {
        cluster.restart_all().await;
    } else {
        cluster.restart(killed[0]).await;
    }
    let named = if whole {
        cluster.all_named().to_owned()
    } else {
        cluster.named(killed[0], leader)
    };
    format!(
        "kill {named}, restart from the data directories (serving {} ms after the restart)",
        started.elapsed().as_millis()
    )
}
