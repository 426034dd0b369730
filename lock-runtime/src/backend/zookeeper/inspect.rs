//! What operators see and do: a lock's holders (the lowest node, or the
//! leading run of read nodes), the time a node outlives a holder that
//! dies now (its session timeout), and the queue; a force-unlock deletes
//! the holders' nodes, whoever made them.
//!
//! Owns nothing this runtime holds: it reads and deletes by what
//! ZooKeeper records.

use std::time::Duration;

use zookeeper_client::MultiReadResult;

use super::{path, ZookeeperBackend};
use crate::backend::{Recorded, RecordedReader};
use crate::error::BackendError;
use crate::mode::LockMode;

impl ZookeeperBackend {
    /// The holders (the lowest node, or the leading run of read nodes),
    /// the time a node outlives a holder that dies now (its session
    /// timeout), and the queue.
    pub(crate) async fn inspect(&self, lock: &str) -> Result<Option<Recorded>, BackendError> {
        let client = self.inner.reader.client();
        let sorted = path::sorted(self.inner.list(&client, lock).await?);
        if sorted.is_empty() {
            return Ok(None);
        }
        let paths = sorted.iter().map(|name| path::child(lock, name));
        let read = self
            .inner
            .read_each(&client, paths, false)
            .await
            .map_err(|e| self.inner.failed("inspect failed", e))?;
        let (names, nodes): (Vec<String>, Vec<RecordedReader>) = sorted
            .into_iter()
            .zip(read)
            .filter_map(|(name, result)| {
                let MultiReadResult::Data { data, stat } = result else {
                    return None; // deleted meanwhile
                };
                // A node of another client (Curator's) shows by its name.
                let (holder, session_ms, token) = path::parse_data(&data)
                    .map_or((name.clone(), None, None), |(holder, ms, token)| {
                        (holder, Some(ms), token)
                    });
                let node = RecordedReader {
                    holder,
                    remaining: session_ms.map(Duration::from_millis),
                    // A downgraded hold's read node has the hold's token
                    // in its data.
                    fence: token.or(u64::try_from(stat.czxid).ok()),
                };
                Some((name, node))
            })
            .unzip();
        let holding = path::holders(&names).len();
        let mut nodes = nodes.into_iter();
        let held: Vec<RecordedReader> = nodes.by_ref().take(holding).collect();
        let queue = nodes.map(|node| node.holder).collect();
        let read = names.first().is_some_and(|first| path::reads(first));
        // For a read hold, the reader that a writer waits for longest.
        let Some(shown) = held.iter().max_by_key(|node| node.remaining).cloned() else {
            return Ok(None);
        };
        Ok(Some(Recorded {
            holder: shown.holder,
            holds: 1,
            remaining: shown.remaining,
            fence: shown.fence,
            queue,
            mode: if read {
                LockMode::Read
            } else {
                LockMode::Write
            },
            readers: if read { held } else { Vec::new() },
        }))
    }

    /// Deletes the holders' nodes (the lowest node, or the leading run of
    /// read nodes), whoever they are; `true` when there was one.
    pub(crate) async fn force_unlock(&self, lock: &str) -> Result<bool, BackendError> {
        let client = self.inner.reader.client();
        let sorted = path::sorted(self.inner.list(&client, lock).await?);
        let mut deleted = false;
        for holder in path::holders(&sorted) {
            match self
                .inner
                .within(client.delete(&path::child(lock, holder), None))
                .await
            {
                Ok(()) => deleted = true,
                Err(zookeeper_client::Error::NoNode) => {}
                Err(error) => return Err(self.inner.failed("force unlock failed", error)),
            }
        }
        Ok(deleted)
    }
}
