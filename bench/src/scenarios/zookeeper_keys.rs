//! S5 on ZooKeeper (part of S13): 64 tasks over 10,000 keys, our runtime
//! (S5's own load: `many_keys`) against the recipe's own requests sent with
//! no library around them.
//!
//! The baseline sends what our backend sends for a lock nobody else holds
//! (create our node and list its siblings in one round trip, make the lock
//! path as a container node on `NoNode`, delete our node) from one plain
//! `zookeeper-client` at the same concurrency: what the recipe costs with
//! no runtime around it. Curator's figure, the third, comes from
//! `crate::curator`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use tokio::task::JoinSet;
use tokio::time::Instant;
use zookeeper_client::{Acls, Client, CreateMode};

use super::many_keys::{per_second, KEYS, MAX_PER_TASK, TASKS};
use crate::keys::Rng;

/// One acquire + release of the lock path `lock` by the recipe's requests
/// alone: our node `node` (a protected-mode name ending in `lock-`) created
/// and the siblings listed in one round trip (the lock path made first when
/// missing), then the node deleted. `false` when another node was first
/// (the lock was busy: the baseline does not wait).
async fn raw_pair(client: &Client, lock: &str, node: &str) -> Result<bool> {
    let ephemeral = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    let full = format!("{lock}/{node}");
    for _attempt in 0..3 {
        let creating = client.create(&full, &[], &ephemeral);
        let listing = client.list_children(lock);
        let (created, listed) = tokio::join!(creating, listing);
        match created {
            Ok((_, sequence)) => {
                let ours = format!("{node}{sequence}");
                let sequence_of = |c: &String| c.rsplit("lock-").next().map(str::to_owned);
                let first = listed?.iter().min_by_key(|c| sequence_of(c)).cloned();
                client.delete(&format!("{lock}/{ours}"), Some(0)).await?;
                return Ok(first.as_deref() == Some(ours.as_str()));
            }
            Err(zookeeper_client::Error::NoNode) => {
                let parents = CreateMode::Container.with_acls(Acls::anyone_all());
                client.mkdir(lock, &parents).await?;
            }
            Err(error) => return Err(error.into()),
        }
    }
    anyhow::bail!("the lock path {lock} kept vanishing")
}

/// The S5 baseline: the recipe's requests on one plain client, at S5's
/// concurrency, on the lock paths `<name>:<k>`. Operations per second, and
/// attempts that found a key busy.
pub(super) async fn raw(client: &Client, name: &str, duration: Duration) -> Result<(f64, u64)> {
    let locks: Arc<Vec<String>> = Arc::new((0..KEYS).map(|k| format!("{name}:{k}")).collect());
    let start = Instant::now();
    let end = start + duration;
    let mut tasks = JoinSet::new();
    for t in 0..TASKS {
        let (client, locks) = (client.clone(), locks.clone());
        // Curator's protected-mode name: `_c_<uuid>-lock-`.
        let node = format!(
            "_c_{:08x}-0000-4000-8000-{t:012x}-lock-",
            std::process::id()
        );
        tasks.spawn(async move {
            let mut rng = Rng::new(TASKS + t + 1);
            let (mut ops, mut busy) = (0u64, 0u64);
            while ops < MAX_PER_TASK && Instant::now() < end {
                let lock = &locks[(rng.next_u64() % KEYS) as usize];
                if raw_pair(&client, lock, &node).await? {
                    ops += 1;
                } else {
                    busy += 1;
                }
            }
            anyhow::Ok((ops, busy))
        });
    }
    per_second(tasks, start).await
}
