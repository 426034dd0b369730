//! etcd, for the two things the runtime's API does not do: list the locks
//! under the prefix (`list`) and hear a lock change (`watch`). Reading and
//! freeing one lock goes through the runtime (`inspect`, `force_unlock`),
//! which knows etcd's lock recipe; here lockctl only needs that a lock's
//! contenders are keys that start with its name (`backend_key`), and which
//! key a name belongs to (`keys.rs`, checked by the runtime).

use std::collections::BTreeSet;

use etcd_client::{Client, ConnectOptions, GetOptions, SortOrder, SortTarget, WatchOptions};
use lock_runtime::LockRuntime;
use tokio::sync::mpsc;

use crate::connect::{Target, TIMEOUT};
use crate::heard::{pass_on, Heard, Stop};
use crate::keys;
use crate::topology::Etcd;
use crate::Failure;

/// Keys read per request while listing.
const PAGE: i64 = 500;

/// Most pages read by one `list` (500,000 keys): past that the answer is
/// partial, and says so.
const MAX_PAGES: usize = 1000;

/// A client of the cluster, connected (or the failure, naming it) within
/// [`TIMEOUT`].
async fn connect(target: &Target, etcd: &Etcd) -> Result<Client, Failure> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(TIMEOUT)
        .with_timeout(TIMEOUT);
    if let Some(auth) = &etcd.auth {
        options = options.with_user(auth.user.clone(), auth.password.clone());
    }
    match tokio::time::timeout(TIMEOUT, Client::connect(&etcd.endpoints, Some(options))).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(error)) => Err(target.failure(&format!("cannot connect: {error}"))),
        Err(_) => Err(target.failure(&format!("cannot connect within {TIMEOUT:?}"))),
    }
}

/// The end of the range of every key that starts with `prefix` (etcd's
/// `range_end`; `\0`, every key, for an empty prefix).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// The keys of the locks that have a contender under the prefix, sorted,
/// at most `limit`. A cluster that stops answering midway is noted as a
/// gap (the answer is partial); what was read so far is kept.
pub(crate) async fn keys(
    target: &Target,
    etcd: &Etcd,
    runtime: &LockRuntime,
    limit: usize,
) -> Result<Vec<String>, Failure> {
    let mut client = connect(target, etcd).await?;
    let root = keys::root(runtime);
    let end = prefix_end(root.as_bytes());
    let mut start = match root.is_empty() {
        true => vec![0],
        false => root.clone().into_bytes(),
    };
    let mut found = BTreeSet::new();
    let where_ = format!("etcd at {}", target.topology.describe());
    // Bounded: at most MAX_PAGES requests, each moving `start` past the
    // keys it read.
    for page in 0.. {
        if page == MAX_PAGES {
            target.unreachable(
                &where_,
                &format!("stopped after {} keys under the prefix", PAGE * page as i64),
            );
            break;
        }
        let options = GetOptions::new()
            .with_range(end.clone())
            .with_keys_only()
            .with_sort(SortTarget::Key, SortOrder::Ascend)
            .with_limit(PAGE);
        let answer =
            match tokio::time::timeout(TIMEOUT, client.get(start.clone(), Some(options))).await {
                Ok(Ok(answer)) => answer,
                Ok(Err(error)) => {
                    target.unreachable(&where_, &error);
                    break;
                }
                Err(_) => {
                    target.unreachable(&where_, &format!("no answer within {TIMEOUT:?}"));
                    break;
                }
            };
        for kv in answer.kvs() {
            // A contender is `<lock name>/<holder>`: its lock's name is
            // the text before the last `/` (no key's name holds one: the
            // runtime writes a key's `/` escaped), if the runtime agrees.
            // A reader's is `<lock name>/read/<holder>`.
            let Ok(text) = std::str::from_utf8(kv.key()) else {
                continue;
            };
            let Some((name, _holder)) = text.rsplit_once('/') else {
                continue;
            };
            let key = keys::key_of(runtime, &root, name).or_else(|| {
                let name = name.strip_suffix("/read")?;
                keys::key_of(runtime, &root, name)
            });
            if let Some(key) = key {
                found.insert(key);
            }
        }
        let Some(last) = answer.kvs().last() else {
            break;
        };
        if !answer.more() || found.len() >= limit {
            break;
        }
        start = last.key().to_vec();
        start.push(0);
    }
    Ok(found.into_iter().take(limit).collect())
}

/// Hears every change of the lock `key`'s contenders (a key put or
/// deleted under its name) as [`Heard::Changed`], and a watch that ended
/// as [`Heard::Lost`]; in place when this returns. Names that merely start
/// with this lock's name are heard too: a needless look, never a missed
/// one.
pub(crate) async fn watch(
    target: &Target,
    etcd: &Etcd,
    runtime: &LockRuntime,
    key: &str,
    heard: mpsc::UnboundedSender<Heard>,
) -> Result<Stop, Failure> {
    let mut client = connect(target, etcd).await?;
    let name = runtime.backend_key(key);
    let watching = async {
        let mut stream = client
            .watch(name, Some(WatchOptions::new().with_prefix()))
            .await?;
        // The first answer says the watch is created: from then on no
        // change is missed.
        stream.message().await?;
        Ok::<_, etcd_client::Error>(stream)
    };
    let mut stream = match tokio::time::timeout(TIMEOUT, watching).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => return Err(target.failure(&error)),
        Err(_) => return Err(target.failure(&format!("no watch within {TIMEOUT:?}"))),
    };
    let task = tokio::spawn(async move {
        // Bounded by the stream: it ends (or fails) with the connection.
        loop {
            let next = match stream.message().await {
                Ok(Some(answer)) if answer.canceled() => Heard::Lost,
                Ok(Some(answer)) if answer.events().is_empty() => continue,
                Ok(Some(_)) => Heard::Changed,
                Ok(None) | Err(_) => Heard::Lost,
            };
            if !pass_on(&heard, next) {
                break;
            }
        }
        // The client lives as long as its watch.
        drop(client);
    });
    Ok(Stop::new(task))
}
