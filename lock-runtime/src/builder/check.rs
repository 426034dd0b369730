//! The builder's checks of the settings every backend shares: the
//! default lease, the timeouts, the fence window, cohorting, the key
//! prefix; then each backend's own (`redis.rs`, `endpoints.rs`).
//!
//! Changes no setting and starts nothing.

use super::{endpoints, redis, Choice, LockRuntimeBuilder, FENCE_WINDOW_RANGE, TIMEOUT_RANGE};
use crate::error::LockError;

impl LockRuntimeBuilder {
    /// Every setting in its range (a `LockError::InvalidConfig` naming
    /// the setter), and each backend's own checks.
    pub(crate) fn check(&self) -> Result<(), LockError> {
        if !(crate::request::MIN_LEASE..=crate::request::MAX_LEASE).contains(&self.default_lease) {
            return Err(LockError::InvalidConfig(format!(
                "default_lease {:?} is out of range: use 10ms to 24h",
                self.default_lease
            )));
        }
        for (name, timeout) in [
            ("connect_timeout", self.connect_timeout),
            ("response_timeout", self.response_timeout),
            ("try_timeout", self.try_timeout),
        ] {
            if !TIMEOUT_RANGE.contains(&timeout) {
                return Err(LockError::InvalidConfig(format!(
                    "{name} {timeout:?} is out of range: use 1ms to 1h"
                )));
            }
        }
        if !FENCE_WINDOW_RANGE.contains(&self.fence_window) {
            return Err(LockError::InvalidConfig(format!(
                "fence_window {:?} is out of range: use 10ms to 1h",
                self.fence_window
            )));
        }
        if self.cohort.handoffs > crate::cohort::MAX_COHORT_HANDOFFS {
            return Err(LockError::InvalidConfig(format!(
                "cohort handoffs {} is out of range: use 0 (off) to {}",
                self.cohort.handoffs,
                crate::cohort::MAX_COHORT_HANDOFFS
            )));
        }
        if self.prefix.contains(['{', '}']) {
            return Err(LockError::InvalidConfig(
                "the key prefix may not contain `{` or `}` (the runtime adds the hash tag)"
                    .to_owned(),
            ));
        }
        match &self.choice {
            Choice::Redlock(urls) => redis::check_redlock(urls.len(), self.fair == Some(true))?,
            Choice::Etcd(endpoints) => endpoints::check_etcd(endpoints)?,
            Choice::Zookeeper(connect) => endpoints::check_zookeeper(connect)?,
            _ => {}
        }
        self.check_sync_replicas()?;
        Ok(())
    }
}
