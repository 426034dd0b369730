//! Who a runtime is, for operators (`who.rs`), on etcd: its identity in
//! the key `<prefix>client:<process-uuid>` (no `/`, so no lock's
//! contender), put on the lease this backend keeps alive for locks of the
//! identity's TTL: there while the process keeps its leases, gone within
//! that lease's TTL after it dies. Each refresh puts it again (on the lease
//! then in force, granted anew after a lost one).
//!
//! Owns only that key.

use etcd_client::{PutOptions, Txn, TxnOp};

use super::{txn, EtcdBackend};
use crate::backend::Published;
use crate::error::BackendError;

impl EtcdBackend {
    /// Puts `value` under `key` on the kept lease for `ttl`.
    pub(crate) async fn publish_identity(&self, it: Published<'_>) -> Result<(), BackendError> {
        let lease = self.inner.leases.ahead(it.ttl).await?;
        let put = TxnOp::put(
            it.key,
            it.value,
            Some(PutOptions::new().with_lease(lease.id)),
        );
        self.inner.txn(Txn::new().and_then([put])).await.map(drop)
    }

    /// What a runtime published under `key` (`None`: nothing, or gone).
    pub(crate) async fn read_identity(&self, key: &str) -> Result<Option<String>, BackendError> {
        let answer = self
            .inner
            .txn(Txn::new().and_then([TxnOp::get(key, None)]))
            .await?;
        let found = txn::gets(&answer)
            .first()
            .and_then(|get| get.kvs().first().map(|kv| kv.value().to_vec()));
        Ok(found.map(|value| String::from_utf8_lossy(&value).into_owned()))
    }
}
