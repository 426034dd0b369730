//! ZooKeeper, for the two things the runtime's API does not do: list the
//! locks under the prefix (`list`) and hear a lock change (`watch`).
//! Reading and freeing one lock goes through the runtime (`inspect`,
//! `force_unlock`), which knows Curator's lock recipe; here lockctl only
//! needs that a lock is a path (`backend_key`) whose contenders are its
//! children, and which key a path belongs to (`keys.rs`, checked by the
//! runtime).

use std::collections::BTreeSet;

use lock_runtime::LockRuntime;
use tokio::sync::mpsc;
use zookeeper_client::{AddWatchMode, Client, EventType, MultiReadResult, SessionState};

use crate::connect::{Target, TIMEOUT};
use crate::heard::{pass_on, Heard, Stop};
use crate::keys;
use crate::topology::Zookeeper;
use crate::Failure;

/// Most reads in one multi-read.
const MULTI_OPS: usize = 128;

/// Most nodes one `list` reads: past that the answer is partial, and says
/// so.
const MAX_NODES: usize = 100_000;

/// Most levels below the prefix (a key with `/` nests its lock path).
const MAX_DEPTH: usize = 64;

/// A session on the servers, open (or the failure, naming them) within
/// [`TIMEOUT`].
async fn connect(target: &Target, zookeeper: &Zookeeper) -> Result<Client, Failure> {
    let mut connector = Client::connector().with_connection_timeout(TIMEOUT);
    if let Some(auth) = &zookeeper.auth {
        let digest = format!("{}:{}", auth.user, auth.password);
        connector = connector.with_auth("digest", digest.as_bytes());
    }
    match tokio::time::timeout(TIMEOUT, connector.connect(&zookeeper.connect)).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(error)) => Err(target.failure(&format!("cannot connect: {error}"))),
        Err(_) => Err(target.failure(&format!("cannot connect within {TIMEOUT:?}"))),
    }
}

/// `<parent>/<child>`.
fn child(parent: &str, name: &str) -> String {
    match parent {
        "/" => format!("/{name}"),
        _ => format!("{parent}/{name}"),
    }
}

/// The keys of the lock paths under the prefix that have children,
/// sorted (`inspect` then tells which are held; `list` stops at its
/// limit of held ones). The tree below the
/// prefix is read one level per round trip. A server that stops
/// answering, or a tree too large to read, is noted as a gap (the answer
/// is partial); what was read so far is kept.
pub(crate) async fn keys(
    target: &Target,
    zookeeper: &Zookeeper,
    runtime: &LockRuntime,
) -> Result<Vec<String>, Failure> {
    let client = connect(target, zookeeper).await?;
    let root = keys::root(runtime);
    let where_ = format!("ZooKeeper at {}", target.topology.describe());
    // The lock paths are `<root><key>`: start at the directory the root
    // names its locks in, and keep the children that start with the root.
    let dir = match root.rfind('/') {
        Some(0) => "/".to_owned(),
        Some(at) => root[..at].to_owned(),
        None => {
            return Err(Failure(format!(
                "the prefix {root:?} is no ZooKeeper path: pass --prefix /locks/ (or the \
                 service's LOCK_PREFIX)"
            )))
        }
    };
    let mut found = BTreeSet::new();
    let mut level = vec![dir];
    let mut read = 0;
    // Bounded: at most MAX_DEPTH levels and MAX_NODES nodes.
    for _depth in 0..MAX_DEPTH {
        if level.is_empty() {
            break;
        }
        if read + level.len() > MAX_NODES {
            target.unreachable(
                &where_,
                &format!("stopped after reading {read} nodes under the prefix"),
            );
            break;
        }
        read += level.len();
        let mut next = Vec::new();
        for paths in level.chunks(MULTI_OPS) {
            let children = match children_of(&client, paths).await {
                Ok(children) => children,
                Err(error) => {
                    target.unreachable(&where_, &error);
                    return Ok(found.into_iter().collect());
                }
            };
            for (path, children) in paths.iter().zip(children) {
                if children.is_empty() {
                    continue;
                }
                if let Some(key) = keys::key_of(runtime, &root, path) {
                    found.insert(key);
                }
                next.extend(
                    children
                        .iter()
                        .map(|name| child(path, name))
                        .filter(|p| p.starts_with(&root)),
                );
            }
        }
        level = next;
    }
    Ok(found.into_iter().collect())
}

/// The children of each of `paths`, in one round trip (none for a path
/// deleted meanwhile).
async fn children_of(client: &Client, paths: &[String]) -> Result<Vec<Vec<String>>, String> {
    let mut reader = client.new_multi_reader();
    for path in paths {
        reader.add_get_children(path).map_err(|e| e.to_string())?;
    }
    match tokio::time::timeout(TIMEOUT, reader.commit()).await {
        Ok(Ok(results)) => Ok(results
            .into_iter()
            .map(|result| match result {
                MultiReadResult::Children { children } => children,
                _ => Vec::new(),
            })
            .collect()),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(format!("no answer within {TIMEOUT:?}")),
    }
}

/// Hears every change of the lock `key`'s contenders (a child of its path
/// created or deleted, the path itself made or reaped) as
/// [`Heard::Changed`], and a lost connection as [`Heard::Lost`] (a
/// persistent watch may miss events while disconnected); in place when
/// this returns.
pub(crate) async fn watch(
    target: &Target,
    zookeeper: &Zookeeper,
    runtime: &LockRuntime,
    key: &str,
    heard: mpsc::UnboundedSender<Heard>,
) -> Result<Stop, Failure> {
    let client = connect(target, zookeeper).await?;
    let path = runtime.backend_key(key);
    let mut watcher =
        match tokio::time::timeout(TIMEOUT, client.watch(&path, AddWatchMode::Persistent)).await {
            Ok(Ok(watcher)) => watcher,
            Ok(Err(error)) => return Err(target.failure(&format!("watch of {path}: {error}"))),
            Err(_) => return Err(target.failure(&format!("no watch within {TIMEOUT:?}"))),
        };
    let task = tokio::spawn(async move {
        // Bounded by the session: a lost or ended one stops it.
        loop {
            let event = watcher.changed().await;
            let next = match (event.event_type, event.session_state) {
                (EventType::Session, SessionState::SyncConnected) => continue,
                (EventType::Session, _) => Heard::Lost,
                _ => Heard::Changed,
            };
            if !pass_on(&heard, next) {
                break;
            }
        }
        // The session lives as long as its watch.
        drop(client);
    });
    Ok(Stop::new(task))
}
