//! Who a runtime is, for operators (`who.rs`), on ZooKeeper: its identity
//! in an ephemeral node `<root>client:<process-uuid>` of the default
//! lease's session (a leaf: `lockctl` lists only paths with children, so
//! it is no lock). It is there while that session lives, so gone one
//! session timeout after the process dies; each refresh writes it again,
//! and creates it anew after a new session.
//!
//! Owns only that node.

use zookeeper_client::{Acls, CreateMode, Error};

use super::{path, ZookeeperBackend};
use crate::error::BackendError;
use crate::names::layout::DEFAULT_PREFIX;

impl ZookeeperBackend {
    /// Writes `value` in the node of `key`, created when missing.
    pub(crate) async fn publish_identity(
        &self,
        key: &str,
        value: &str,
    ) -> Result<(), BackendError> {
        let node = identity_path(key);
        let inner = &self.inner;
        let client = inner.reader.client();
        let failed = |error| inner.failed("publishing this runtime's identity failed", error);
        // Bounded: a node deleted or created by a racing refresh between
        // the steps is tried once more, at most twice.
        for _attempt in 0..3 {
            match inner
                .within(client.set_data(&node, value.as_bytes(), None))
                .await
            {
                Ok(_) => return Ok(()),
                Err(Error::NoNode) => {}
                Err(error) => return Err(failed(error)),
            }
            let ephemeral = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
            match inner
                .within(client.create(&node, value.as_bytes(), &ephemeral))
                .await
            {
                Ok(_) => return Ok(()),
                Err(Error::NodeExists) => {}
                Err(Error::NoNode) => {
                    let parent = node.rsplit_once('/').map_or("/", |(p, _)| p);
                    let parents = CreateMode::Container.with_acls(Acls::anyone_all());
                    match inner.within(client.mkdir(parent, &parents)).await {
                        Ok(()) | Err(Error::NodeExists) => {}
                        Err(error) => return Err(failed(error)),
                    }
                }
                Err(error) => return Err(failed(error)),
            }
        }
        Err(BackendError::msg(
            "publishing this runtime's identity on ZooKeeper: its node kept changing",
        ))
    }

    /// What a runtime published under `key` (`None`: nothing, or gone).
    pub(crate) async fn read_identity(&self, key: &str) -> Result<Option<String>, BackendError> {
        let client = self.inner.reader.client();
        match self
            .inner
            .within(client.get_data(&identity_path(key)))
            .await
        {
            Ok((data, _stat)) => Ok(Some(String::from_utf8_lossy(&data).into_owned())),
            Err(Error::NoNode) => Ok(None),
            Err(error) => Err(self
                .inner
                .failed("reading a runtime's identity failed", error)),
        }
    }
}

/// The node of the identity `key` (`<prefix>client:<uuid>`): under the
/// lock root, as a lock's path is (the default prefix is the default root).
fn identity_path(key: &str) -> String {
    match key.strip_prefix(DEFAULT_PREFIX) {
        Some(rest) => path::lock_path(DEFAULT_PREFIX, rest),
        None => key.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    /// The default prefix's identity lands under the default root; a
    /// path prefix's stays where it says.
    #[test]
    fn an_identity_lives_under_the_lock_root() {
        assert_eq!(super::identity_path("lock:client:ab"), "/locks/client:ab");
        assert_eq!(super::identity_path("/svc/client:ab"), "/svc/client:ab");
    }
}
