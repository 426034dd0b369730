//! What operators see and do: a lock's holders (the first key if it is a
//! writer, else every reader before the first writer), their leases'
//! remaining TTLs and the queue; a force-unlock deletes the holders' keys,
//! whoever they are.
//!
//! Owns nothing this runtime holds: it reads and deletes by what etcd
//! records.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, SortOrder, SortTarget, Txn, TxnOp};

use super::readers;
use super::txn::gets;
use super::{dir, EtcdBackend, TXN_OPS};
use crate::backend::{Recorded, RecordedReader};
use crate::error::BackendError;
use crate::mode::LockMode;

/// The holders among a lock's keys `kvs` (its directory, oldest first):
/// the first key if it is a writer, else every reader before the first
/// writer; and whether they are readers.
fn holders<'a>(
    lock: &str,
    kvs: &'a [etcd_client::KeyValue],
) -> (&'a [etcd_client::KeyValue], bool) {
    let reader = |kv: &etcd_client::KeyValue| readers::is_reader(lock, kv.key(), kv.value());
    match kvs.first() {
        None => (kvs, false),
        Some(first) if !reader(first) => (&kvs[..1], false),
        Some(_) => {
            let count = kvs.iter().take_while(|kv| reader(kv)).count();
            (&kvs[..count], true)
        }
    }
}

impl EtcdBackend {
    /// The holders, their leases' remaining TTLs, and the queue: the first
    /// key if it is a writer, else every reader before the first writer
    /// (`holders`); the other keys are queued.
    pub(crate) async fn inspect(&self, lock: &str) -> Result<Option<Recorded>, BackendError> {
        let all = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let txn = Txn::new().and_then([TxnOp::get(dir(lock), Some(all))]);
        let answer = self.inner.txn(txn).await?;
        let reads = gets(&answer);
        let Some(kvs) = reads.first().map(|r| r.kvs()) else {
            return Ok(None);
        };
        let (holding, reading) = holders(lock, kvs);
        let Some(first) = holding.first() else {
            return Ok(None);
        };
        let skip = dir(lock).len();
        let name = |key: &[u8]| {
            let name = key.get(skip..).unwrap_or(key);
            let name = name.strip_prefix(b"read/".as_slice()).unwrap_or(name);
            String::from_utf8_lossy(name).into_owned()
        };
        let queue = kvs[holding.len()..]
            .iter()
            .map(|kv| name(kv.key()))
            .collect();
        if !reading {
            return Ok(Some(Recorded {
                holder: name(first.key()),
                holds: 1,
                remaining: self.remaining(first.lease()).await,
                fence: u64::try_from(first.create_revision()).ok(),
                queue,
                mode: LockMode::Write,
                readers: Vec::new(),
            }));
        }
        let mut readers = Vec::with_capacity(holding.len());
        let mut ttls: Vec<(i64, Option<Duration>)> = Vec::new();
        for kv in holding {
            let remaining = match ttls.iter().find(|(lease, _)| *lease == kv.lease()) {
                Some((_, remaining)) => *remaining,
                None => {
                    let remaining = self.remaining(kv.lease()).await;
                    ttls.push((kv.lease(), remaining));
                    remaining
                }
            };
            readers.push(RecordedReader {
                holder: name(kv.key()),
                remaining,
                fence: u64::try_from(kv.create_revision()).ok(),
            });
        }
        // The reader a writer waits for: the one whose lease ends last.
        let last = readers
            .iter()
            .max_by_key(|r| r.remaining)
            .cloned()
            .unwrap_or_else(|| readers[0].clone());
        Ok(Some(Recorded {
            holder: last.holder,
            holds: 1,
            remaining: last.remaining,
            fence: last.fence,
            queue,
            mode: LockMode::Read,
            readers,
        }))
    }

    /// The remaining TTL of `lease` (`None`: unknown, or no answer).
    async fn remaining(&self, lease: i64) -> Option<Duration> {
        let mut leases = self.inner.client.lease_client();
        match tokio::time::timeout(self.inner.timeout, leases.time_to_live(lease, None)).await {
            Ok(Ok(ttl)) if ttl.ttl() >= 0 => {
                Some(Duration::from_secs(u64::try_from(ttl.ttl()).unwrap_or(0)))
            }
            _ => None,
        }
    }

    /// Deletes the holders' keys (see `holders`), whoever they are; `true`
    /// when there was one.
    pub(crate) async fn force_unlock(&self, lock: &str) -> Result<bool, BackendError> {
        let all = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let answer = self
            .inner
            .txn(Txn::new().and_then([TxnOp::get(dir(lock), Some(all))]))
            .await?;
        let reads = gets(&answer);
        let Some(kvs) = reads.first().map(|r| r.kvs()) else {
            return Ok(false);
        };
        let (holding, _) = holders(lock, kvs);
        if holding.is_empty() {
            return Ok(false);
        }
        let (when, delete): (Vec<Compare>, Vec<TxnOp>) = holding
            .iter()
            .take(TXN_OPS)
            .map(|kv| {
                let key = kv.key().to_vec();
                (
                    Compare::create_revision(key.clone(), CompareOp::Equal, kv.create_revision()),
                    TxnOp::delete(key, None),
                )
            })
            .unzip();
        Ok(self
            .inner
            .txn(Txn::new().when(when).and_then(delete))
            .await?
            .succeeded())
    }
}
