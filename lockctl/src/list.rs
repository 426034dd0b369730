//! `lockctl list`: the locks held now under the prefix, on every server
//! that stores locks (each master of a Cluster, every Redlock master). One
//! `SCAN` per server over the names that may be lock hashes
//! (`<prefix>{*}`); on etcd one read of the keys under the prefix, on
//! ZooKeeper of the paths below it (`etcd.rs`, `zookeeper.rs`); then the
//! runtime's `inspect` of each key: what it prints is what the runtime
//! records (on Redlock the quorum view, with how many masters hold it). A
//! server that does not answer makes the answer partial: it is named on
//! stderr and the exit code says so.

use std::collections::HashMap;

use lock_runtime::{layout, ClientInfo, LockInfo, LockRuntime};

use crate::connect::Target;
use crate::masters::{holding, Masters, View};
use crate::nodes::{self, Node};
use crate::output::out;
use crate::report;
use crate::{Failure, Outcome};

/// Keys asked of a server per `SCAN` step.
const SCAN_COUNT: usize = 500;

/// One listed lock: the quorum view, and on Redlock how many masters hold
/// it (a key held by a minority only is listed with no holder).
struct Row {
    key: String,
    info: Option<LockInfo>,
    /// The holder's process, as its runtime published it.
    who: Option<ClientInfo>,
    masters: Option<(usize, usize)>,
}

/// Prints up to `limit` held locks, sorted by key; [`Outcome::NotFound`]
/// when there are none, [`Outcome::Partial`] when a server did not answer.
pub(crate) async fn run(target: &Target, limit: usize, json: bool) -> Result<Outcome, Failure> {
    let runtime = target.runtime().await?;
    let masters = Masters::open(target).await;
    let keys = candidates(target, &runtime, limit).await?;
    let mut rows = Vec::new();
    // One question per process, however many locks it holds.
    let mut processes: HashMap<String, Option<ClientInfo>> = HashMap::new();
    for key in keys {
        if rows.len() == limit {
            break;
        }
        let info = match target.inspect(&runtime, &key).await {
            Ok(info) => info,
            Err(failure) => {
                target.unreachable(&format!("lock {key}"), &failure.0);
                continue;
            }
        };
        let mut held_somewhere = info.is_some();
        let mut counted = None;
        if masters.len() > 0 {
            let views = masters.views(target, &key).await;
            held_somewhere |= views.iter().any(|(_, v)| matches!(v, View::Held(_)));
            let holding = match &info {
                Some(info) => holding(&views, &info.holder),
                None => views
                    .iter()
                    .filter(|(_, v)| matches!(v, View::Held(_)))
                    .count(),
            };
            counted = Some((holding, views.len()));
        }
        let mut who = None;
        if let Some(info) = &info {
            let process = info.holder.split(':').next().unwrap_or_default();
            if !processes.contains_key(process) {
                let found = target.client_of(&runtime, &info.holder).await;
                processes.insert(process.to_owned(), found);
            }
            who = processes.get(process).cloned().flatten();
        }
        // Released between the scan and now: not listed.
        if held_somewhere {
            rows.push(Row {
                key,
                info,
                who,
                masters: counted,
            });
        }
    }
    print(target, &rows, json);
    Ok(target.outcome(!rows.is_empty()))
}

/// The keys that may be held now, sorted: at most `limit` on the Redis
/// family and etcd (where each is a lock with a contender), every lock path
/// with children on ZooKeeper.
async fn candidates(
    target: &Target,
    runtime: &LockRuntime,
    limit: usize,
) -> Result<Vec<String>, Failure> {
    #[cfg(feature = "etcd")]
    if let crate::topology::Topology::Etcd(etcd) = &target.topology {
        return crate::etcd::keys(target, etcd, runtime, limit).await;
    }
    #[cfg(feature = "zookeeper")]
    if let crate::topology::Topology::Zookeeper(zookeeper) = &target.topology {
        return crate::zookeeper::keys(target, zookeeper, runtime).await;
    }
    // The Redis family: a SCAN of each server that stores locks. (The
    // runtime names the keys of etcd and ZooKeeper only.)
    let _ = runtime;
    let mut keys = Vec::new();
    for node in nodes::storing(target).await? {
        match scan_keys(target, &node, limit).await {
            Ok(found) => keys.extend(found),
            Err(error) => target.unreachable(&node.name, &error),
        }
    }
    keys.sort();
    keys.dedup();
    keys.truncate(limit);
    Ok(keys)
}

fn print(target: &Target, rows: &[Row], json: bool) {
    if json {
        let locks = rows.iter().map(|row| {
            let mut value = match &row.info {
                Some(info) => report::info_json(info),
                None => serde_json::json!({ "key": row.key, "held": false }),
            };
            if row.info.is_some() {
                value["client"] = report::client_json(row.who.as_ref());
            }
            if let Some((holding, of)) = row.masters {
                value["masters_holding"] = holding.into();
                value["masters"] = of.into();
            }
            value
        });
        out!("{}", serde_json::Value::Array(locks.collect()));
        return;
    }
    if rows.is_empty() {
        out!("no locks held under prefix `{}`", target.prefix);
        return;
    }
    let redlock = rows.iter().any(|r| r.masters.is_some());
    let masters_column = |row: &Row| match row.masters {
        Some((holding, of)) => format!(" {:>7}", format!("{holding}/{of}")),
        None => String::new(),
    };
    out!(
        "{:<32} {:<12} {:>20} {:>6}{}  holder",
        "key",
        "lease left",
        "fence",
        "queue",
        if redlock { " masters" } else { "" }
    );
    for row in rows {
        match &row.info {
            Some(info) => out!(
                "{:<32} {:<12} {:>20} {:>6}{}  {}{}",
                info.key,
                report::lease_cell(info),
                report::fence(info.fence),
                info.queue.len(),
                masters_column(row),
                holder(info),
                row.who
                    .as_ref()
                    .map_or(String::new(), |c| format!(" ({})", report::client(c)))
            ),
            None => out!(
                "{:<32} {:<12} {:>20} {:>6}{}  (no holder on a majority)",
                row.key,
                "-",
                "-",
                "-",
                masters_column(row)
            ),
        }
    }
}

/// The holder column: the holder id, and for a read hold how many readers
/// share it (the id shown is the one whose lease ends last).
fn holder(info: &LockInfo) -> String {
    if info.mode.is_read() {
        format!("{} [{}]", info.holder, report::mode(info))
    } else {
        info.holder.clone()
    }
}

/// The keys of the lock hashes under the prefix on one server, sorted, at
/// most `limit`.
async fn scan_keys(
    target: &Target,
    node: &Node,
    limit: usize,
) -> Result<Vec<String>, redis::RedisError> {
    let mut con = target.connect(&node.client).await?;
    let pattern = layout::scan_pattern(&target.prefix);
    let mut keys = Vec::new();
    let mut cursor: u64 = 0;
    // Bounded: SCAN ends when the cursor comes back to 0, and we stop at
    // `limit` keys.
    loop {
        let (next, names): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT)
            .query_async(&mut con)
            .await?;
        keys.extend(
            names
                .iter()
                .filter_map(|n| layout::key_of(&target.prefix, n)),
        );
        cursor = next;
        if cursor == 0 || keys.len() >= limit {
            break;
        }
    }
    keys.sort();
    keys.dedup();
    keys.truncate(limit);
    Ok(keys)
}
