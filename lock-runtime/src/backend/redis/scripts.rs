//! The Lua scripts as values, and calling them by SHA with a fallback to
//! the source when the server answers `NOSCRIPT`.
//!
//! On a Redis Cluster the scripts publish release news with `SPUBLISH` (a
//! sharded channel in the lock's own slot) instead of `PUBLISH`: the one
//! difference between the two script sets, made when they are loaded.

use redis::{Cmd, ErrorKind, RedisError, RedisResult, Script, ServerErrorKind};

use super::conn::Con;

use crate::names::LockNames;

/// One Lua script: its source and SHA1.
#[derive(Debug)]
pub(super) struct LuaScript {
    source: String,
    sha: String,
}

impl LuaScript {
    /// The script `source`; with `sharded`, its release messages go out
    /// with `SPUBLISH` (every `redis.call('publish', …)` becomes
    /// `redis.call('spublish', …)`).
    pub(super) fn new(source: &'static str, sharded: bool) -> Self {
        let source = if sharded {
            source.replace("redis.call('publish',", "redis.call('spublish',")
        } else {
            source.to_owned()
        };
        LuaScript {
            sha: Script::new(&source).get_hash().to_owned(),
            source,
        }
    }

    /// `EVALSHA sha numkeys KEYS... ARGV...` (by SHA) or `EVAL source ...`.
    pub(super) fn call(&self, by_sha: bool, keys: &[&str], args: &[&str]) -> Cmd {
        let mut cmd = if by_sha {
            let mut c = redis::cmd("EVALSHA");
            c.arg(&self.sha);
            c
        } else {
            let mut c = redis::cmd("EVAL");
            c.arg(&self.source);
            c
        };
        cmd.arg(keys.len()).arg(keys).arg(args);
        cmd
    }
}

/// The acquire script as it is loaded: Redlock's boot-marker check (which
/// does nothing without a marker key), then `acquire.lua`.
pub(crate) const ACQUIRE: &str = concat!(
    include_str!("../../scripts/redlock_boot_check.lua"),
    include_str!("../../scripts/acquire.lua"),
);

/// The lock scripts, compiled into the crate from `scripts/*.lua`.
#[derive(Debug)]
pub(super) struct Scripts {
    pub(super) acquire: LuaScript,
    /// Plain mode: a read hold, shared with other readers.
    pub(super) read: LuaScript,
    pub(super) release: LuaScript,
    /// Plain mode: a write hold turned into a read hold in place.
    pub(super) downgrade: LuaScript,
    pub(super) renew: LuaScript,
    pub(super) force_unlock: LuaScript,
    /// Read-only: what is recorded of a lock.
    pub(super) inspect: LuaScript,
    /// Fair mode: acquire and release through the key's queue.
    pub(super) fair: LuaScript,
    /// Fair mode: waiting processes' places kept alive, many per call.
    pub(super) refresh: LuaScript,
}

impl Scripts {
    /// The scripts; `sharded` for a cluster (see the module docs).
    pub(super) fn new(sharded: bool) -> Self {
        let script = |source| LuaScript::new(source, sharded);
        Scripts {
            acquire: script(ACQUIRE),
            read: script(include_str!("../../scripts/read.lua")),
            release: script(include_str!("../../scripts/release.lua")),
            downgrade: script(include_str!("../../scripts/downgrade.lua")),
            renew: script(include_str!("../../scripts/renew.lua")),
            force_unlock: script(include_str!("../../scripts/force_unlock.lua")),
            inspect: script(include_str!("../../scripts/inspect.lua")),
            fair: script(include_str!("../../scripts/fair.lua")),
            refresh: script(include_str!("../../scripts/refresh.lua")),
        }
    }

    /// A call of the fair script (`args[0]` is the operation) on the lock
    /// `lock_key`: its four keys are the lock, fence, queue and queue entries.
    pub(super) fn fair(&self, by_sha: bool, lock_key: &str, args: &[&str]) -> Cmd {
        let keys = [
            lock_key,
            &LockNames::fence(lock_key),
            &LockNames::queue(lock_key),
            &LockNames::queued(lock_key),
        ];
        self.fair.call(by_sha, &keys, args)
    }

    /// One refresh of the fair places `places` (all in one slot on a
    /// cluster), with queue entries living `life` ms and `reserve` tokens.
    pub(super) fn refresh(
        &self,
        by_sha: bool,
        places: &[&crate::backend::PlaceRefresh],
        life: &str,
        reserve: &str,
    ) -> Cmd {
        let mut keys = Vec::with_capacity(places.len() * 3);
        let mut args = Vec::with_capacity(places.len() * 4 + 1);
        args.push(life.to_owned());
        for place in places {
            keys.push(place.lock_key.clone());
            keys.push(LockNames::queue(&place.lock_key));
            keys.push(LockNames::queued(&place.lock_key));
            args.push(place.holder.clone());
            args.push(place.lease.as_millis().max(1).to_string());
            args.push(reserve.to_owned());
            args.push(if place.read { "r" } else { "w" }.to_owned());
        }
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.refresh.call(by_sha, &keys, &args)
    }

    /// The release of one hold, plain or fair, as a command (`window`: the
    /// fence counter's TTL in ms, for a fair handoff's new token).
    pub(super) fn release(
        &self,
        by_sha: bool,
        lock_key: &str,
        holder: &str,
        fair: bool,
        window: &str,
    ) -> Cmd {
        let channel = LockNames::channel(lock_key);
        if fair {
            self.fair(by_sha, lock_key, &["release", holder, &channel, window])
        } else {
            self.release.call(by_sha, &[lock_key], &[holder, &channel])
        }
    }
}

pub(super) async fn load_scripts(con: &mut Con, scripts: &Scripts) -> RedisResult<()> {
    for script in [
        &scripts.acquire,
        &scripts.read,
        &scripts.release,
        &scripts.downgrade,
        &scripts.renew,
        &scripts.force_unlock,
        &scripts.inspect,
        &scripts.fair,
        &scripts.refresh,
    ] {
        let _: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(&script.source)
            .query_async(con)
            .await?;
    }
    Ok(())
}

pub(super) fn is_noscript(error: &RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// Runs one script call made by `call(by_sha)`: by SHA, falling back to the
/// source on `NOSCRIPT`.
pub(super) async fn by_sha<T: redis::FromRedisValue>(
    con: &mut Con,
    call: impl Fn(bool) -> Cmd,
) -> RedisResult<T> {
    match call(true).query_async(con).await {
        Err(e) if is_noscript(&e) => call(false).query_async(con).await,
        other => other,
    }
}

/// [`by_sha`] for a script with these keys and arguments.
pub(super) async fn eval<T: redis::FromRedisValue>(
    con: &mut Con,
    script: &LuaScript,
    keys: &[&str],
    args: &[&str],
) -> RedisResult<T> {
    by_sha(con, |sha| script.call(sha, keys, args)).await
}

#[cfg(test)]
mod tests {
    use super::Scripts;

    #[test]
    fn cluster_scripts_publish_every_release_on_the_sharded_channel() {
        let single = Scripts::new(false);
        let sharded = Scripts::new(true);
        for (plain, cluster) in [
            (&single.release, &sharded.release),
            (&single.fair, &sharded.fair),
            (&single.force_unlock, &sharded.force_unlock),
        ] {
            let publishes = plain.source.matches("redis.call('publish',").count();
            assert!(publishes > 0);
            assert_eq!(
                cluster.source.matches("redis.call('spublish',").count(),
                publishes
            );
            assert!(!cluster.source.contains("'publish'"));
            assert_ne!(plain.sha, cluster.sha);
        }
        assert_eq!(
            single.acquire.sha, sharded.acquire.sha,
            "acquire publishes nothing"
        );
        assert_eq!(single.read.sha, sharded.read.sha, "read publishes nothing");
    }
}
