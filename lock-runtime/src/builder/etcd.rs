//! etcd's configuration: its endpoints, its user, and the backend
//! configuration `build` hands to `Backend::start` (refused, naming the
//! feature, in a build without `etcd`).
//!
//! Sets the builder's fields only; connects nothing (`backend/etcd/`).

#[cfg(feature = "etcd")]
use super::Choice;
use super::LockRuntimeBuilder;
use crate::backend::{BackendConfig, ConnectSettings};
use crate::error::LockError;

impl LockRuntimeBuilder {
    /// Use etcd (v3 API, 3.4 or later), given some of its members'
    /// endpoints (`host:port`, or `http://host:port`): etcd's own lock recipe,
    /// fair by construction, with the key's create revision as the fencing
    /// token; `etcdctl lock <name>` and this runtime exclude each other on
    /// the same name (with an empty [`key_prefix`](Self::key_prefix), the
    /// key is the name). Needs the feature `etcd`. See `docs/deploying.md`, "etcd", in the repository.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// let runtime = lock_runtime::LockRuntime::builder()
    ///     .etcd(["10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"])
    ///     .build()
    ///     .await?;
    /// # drop(runtime); Ok(()) }
    /// ```
    #[cfg(feature = "etcd")]
    #[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
    pub fn etcd<I>(mut self, endpoints: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.choice = Choice::Etcd(endpoints.into_iter().map(Into::into).collect());
        self
    }

    /// etcd: authenticate as `user` with `password` (etcd's own auth).
    #[cfg(feature = "etcd")]
    #[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
    pub fn etcd_auth(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.etcd_user = Some((user.into(), password.into()));
        self
    }

    /// The etcd backend's configuration.
    #[cfg(feature = "etcd")]
    pub(super) fn etcd_config(
        &self,
        endpoints: &[String],
        settings: ConnectSettings,
    ) -> Result<BackendConfig, LockError> {
        Ok(BackendConfig::Etcd(
            crate::backend::etcd::EtcdConfig {
                endpoints: endpoints.to_vec(),
                user: self.etcd_user.clone(),
                prefix: self.prefix.clone(),
                default_lease: self.default_lease,
            },
            settings,
        ))
    }

    /// Without the feature `etcd`: refused, naming the feature.
    #[cfg(not(feature = "etcd"))]
    pub(super) fn etcd_config(
        &self,
        _: &[String],
        _: ConnectSettings,
    ) -> Result<BackendConfig, LockError> {
        Err(LockError::InvalidConfig(
            "etcd is configured (LOCK_ETCD_ENDPOINTS or LOCK_BACKEND=etcd), but this \
             build has no etcd backend: enable the feature `etcd` of lock-runtime"
                .to_owned(),
        ))
    }
}
