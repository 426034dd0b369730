//! Where the locks are: the Redis URL and key prefix from the flags or the
//! environment, a lock runtime on them (for `inspect` and `force_unlock`),
//! and a plain Redis client for what a runtime does not do (`SCAN`, a
//! subscription of one's own). Errors say which server, with any password
//! masked.

use std::time::Duration;

use lock_runtime::{layout, LockError, LockInfo, LockRuntime};

use crate::Failure;

/// How long to wait for the server before reporting it unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The server and prefix a command works on.
pub(crate) struct Target {
    url: String,
    /// The URL as it may be shown: the password replaced by `***`.
    pub(crate) shown: String,
    pub(crate) prefix: String,
}

impl Target {
    /// From the flags, else `LOCK_REDIS_URL` / `REDIS_URL` and `LOCK_PREFIX`
    /// (the variables the runtime's `init_from_env` reads).
    pub(crate) fn from_args(url: Option<&str>, prefix: Option<&str>) -> Result<Target, Failure> {
        let env = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        let url = url
            .map(str::to_owned)
            .or_else(|| env("LOCK_REDIS_URL"))
            .or_else(|| env("REDIS_URL"))
            .ok_or_else(|| Failure("no Redis URL: pass --redis-url or set REDIS_URL".to_owned()))?;
        let prefix = prefix
            .map(str::to_owned)
            .or_else(|| env("LOCK_PREFIX"))
            .unwrap_or_else(|| layout::DEFAULT_PREFIX.to_owned());
        Ok(Target {
            shown: mask_password(&url),
            url,
            prefix,
        })
    }

    /// A lock runtime on the server (it connects and loads its scripts).
    pub(crate) async fn runtime(&self) -> Result<LockRuntime, Failure> {
        LockRuntime::builder()
            .redis(self.url.clone())
            .key_prefix(self.prefix.clone())
            .connect_timeout(CONNECT_TIMEOUT)
            .response_timeout(CONNECT_TIMEOUT)
            .build()
            .await
            .map_err(|error| self.failure(&error))
    }

    /// A connection of its own to the server (after `runtime` checked the URL).
    pub(crate) fn client(&self) -> Result<redis::Client, Failure> {
        redis::Client::open(self.url.as_str())
            .map_err(|error| self.failure(&format!("invalid Redis URL: {error}")))
    }

    /// The error of a command on this server, told with the masked URL.
    pub(crate) fn failure(&self, error: &dyn std::fmt::Display) -> Failure {
        let text = error.to_string();
        let what = if text.contains("invalid Redis URL") || text.contains("expected redis://") {
            "bad Redis URL"
        } else if text.contains("connect") {
            "cannot reach Redis at"
        } else {
            "Redis at"
        };
        Failure(self.scrub(&format!("{what} {}: {text}", self.shown)))
    }

    /// The error of a lock operation (a lost connection is a failure too).
    pub(crate) fn lock_failure(&self, error: &LockError) -> Failure {
        self.failure(error)
    }

    /// What `runtime` records of the lock `key` now (`None`: free).
    pub(crate) async fn inspect(
        &self,
        runtime: &LockRuntime,
        key: &str,
    ) -> Result<Option<LockInfo>, Failure> {
        runtime
            .inspect(key)
            .await
            .map_err(|e| self.lock_failure(&e))
    }

    /// `text` with the URL's password (if any) masked wherever it appears.
    fn scrub(&self, text: &str) -> String {
        match password(&self.url) {
            Some(secret) if !secret.is_empty() => text.replace(secret, "***"),
            _ => text.to_owned(),
        }
    }
}

/// `scheme`, `userinfo` and the rest (`host[:port][/db…]`) of a URL with
/// a user part: `scheme://userinfo@rest`.
fn parts(url: &str) -> Option<(&str, &str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let at = rest[..authority_end].rfind('@')?;
    Some((scheme, &rest[..at], &rest[at + 1..]))
}

/// The password of `scheme://[user]:password@host…` (a lone user part is
/// taken as a password too, to be safe).
fn password(url: &str) -> Option<&str> {
    let (_, userinfo, _) = parts(url)?;
    Some(userinfo.split_once(':').map_or(userinfo, |(_, pass)| pass))
}

/// `url` with its password replaced by `***`.
pub(crate) fn mask_password(url: &str) -> String {
    match parts(url) {
        Some((scheme, userinfo, rest)) if password(url).is_some_and(|p| !p.is_empty()) => {
            let user = userinfo.split_once(':').map_or("", |(user, _)| user);
            format!("{scheme}://{user}:***@{rest}")
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::mask_password;

    #[test]
    fn passwords_are_masked_and_nothing_else() {
        assert_eq!(
            mask_password("redis://app:s3cret@db:6379/0"),
            "redis://app:***@db:6379/0"
        );
        assert_eq!(mask_password("redis://:s3cret@db"), "redis://:***@db");
        assert_eq!(mask_password("redis://s3cret@db"), "redis://:***@db");
        assert_eq!(mask_password("redis://db:6379"), "redis://db:6379");
        assert_eq!(mask_password("nonsense"), "nonsense");
        assert_eq!(mask_password("redis://db/0@x"), "redis://db/0@x");
    }
}
