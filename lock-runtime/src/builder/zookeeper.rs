//! ZooKeeper's configuration: its connect string, the `digest` user, and
//! the backend configuration `build` hands to `Backend::start` (refused,
//! naming the feature, in a build without `zookeeper`).
//!
//! Sets the builder's fields only; connects nothing (`backend/zookeeper/`).

#[cfg(feature = "zookeeper")]
use super::Choice;
use super::LockRuntimeBuilder;
use crate::backend::{BackendConfig, ConnectSettings};
use crate::error::LockError;

impl LockRuntimeBuilder {
    /// Use ZooKeeper (3.5 or later), given its connect string
    /// (`host:port,host:port[/chroot]`): Apache Curator's lock recipe
    /// (`InterProcessMutex`), fair by construction, with the node's czxid as
    /// the fencing token. A lock's path is the key prefix followed by the
    /// key (`/locks/` + `order:1`; the default prefix `lock:` becomes
    /// `/locks/`), and a Java service locking that path with Curator and
    /// this runtime exclude each other. Needs the feature `zookeeper`. See
    /// `docs/deploying.md`, "ZooKeeper", in the repository.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let runtime = lock_runtime::LockRuntime::builder()
    ///     .zookeeper("10.0.0.1:2181,10.0.0.2:2181,10.0.0.3:2181")
    ///     .key_prefix("/locks/")
    ///     .build()
    ///     .await?;
    /// # drop(runtime); Ok(()) }
    /// ```
    #[cfg(feature = "zookeeper")]
    #[cfg_attr(docsrs, doc(cfg(feature = "zookeeper")))]
    pub fn zookeeper(mut self, connect: impl Into<String>) -> Self {
        self.choice = Choice::Zookeeper(connect.into());
        self
    }

    /// ZooKeeper: authenticate as `user` with `password` (the `digest`
    /// scheme, what `addauth digest user:password` does), for lock paths
    /// whose ACLs ask for it.
    #[cfg(feature = "zookeeper")]
    #[cfg_attr(docsrs, doc(cfg(feature = "zookeeper")))]
    pub fn zookeeper_auth(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.zookeeper_auth = Some((user.into(), password.into()));
        self
    }

    /// The ZooKeeper backend's configuration.
    #[cfg(feature = "zookeeper")]
    pub(super) fn zookeeper_config(
        &self,
        connect: &str,
        settings: ConnectSettings,
    ) -> Result<BackendConfig, LockError> {
        Ok(BackendConfig::Zookeeper(
            crate::backend::zookeeper::ZookeeperConfig {
                connect: connect.to_owned(),
                auth: self.zookeeper_auth.clone(),
                prefix: self.prefix.clone(),
                default_lease: self.default_lease,
            },
            settings,
        ))
    }

    /// Without the feature `zookeeper`: refused, naming the feature.
    #[cfg(not(feature = "zookeeper"))]
    pub(super) fn zookeeper_config(
        &self,
        _: &str,
        _: ConnectSettings,
    ) -> Result<BackendConfig, LockError> {
        Err(LockError::InvalidConfig(
            "ZooKeeper is configured (LOCK_ZOOKEEPER or LOCK_BACKEND=zookeeper), but \
             this build has no ZooKeeper backend: enable the feature `zookeeper` of \
             lock-runtime"
                .to_owned(),
        ))
    }
}
