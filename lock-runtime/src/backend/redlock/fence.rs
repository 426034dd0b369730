//! The write-back of a hold's fencing token to its masters (see the
//! module docs of `redlock`: it is what makes tokens grow from one
//! majority to the next, whatever the masters' clocks say).

use super::gather::gather;
use super::{Answer, Redlock};
use crate::backend::redis::RedisBackend;
use crate::error::BackendError;
use crate::names::LockNames;

impl Redlock {
    /// Writes the hold's token back to the masters of its majority whose
    /// own token was smaller, until a majority records it (see the module
    /// docs: this is what makes tokens grow across majorities), and to the
    /// masters that had not answered, whose acquire may yet land (behind
    /// it on the same connection), so that every master holding it records
    /// the same token.
    pub(super) async fn record_fence(
        &self,
        lock_key: &str,
        holder: &str,
        fence: u64,
        held: &[(usize, u64)],
        unanswered: &[usize],
    ) -> Result<(), BackendError> {
        let already = held.iter().filter(|(_, token)| *token == fence).count();
        let needed = self.inner.quorum.saturating_sub(already);
        let behind = held
            .iter()
            .filter(|(_, token)| *token < fence)
            .map(|(i, _)| *i);
        let targets: Vec<usize> = behind.chain(unanswered.iter().copied()).collect();
        if targets.is_empty() {
            return Ok(());
        }
        let calls = self.calls_on(targets, |m| self.raise_fence(m, lock_key, holder, fence));
        let answers = gather(calls, |answers| {
            answers.iter().filter(|a| matches!(a, Some(Ok(_)))).count() >= needed
        })
        .await;
        let recorded = answers.iter().filter(|a| matches!(a, Some(Ok(_)))).count();
        if recorded >= needed {
            return Ok(());
        }
        Err(BackendError::msg(format!(
            "Redlock acquire: the fencing token reached only {} of {} masters, a quorum is \
             {}; given back",
            already + recorded,
            self.masters(),
            self.inner.quorum
        )))
    }

    /// Runs `redlock_fence.lua` on one master: its counter is raised to
    /// `fence`, and the hold's recorded token too while it is there.
    pub(super) async fn raise_fence(
        &self,
        master: &RedisBackend,
        lock_key: &str,
        holder: &str,
        fence: u64,
    ) -> Answer<bool> {
        let mut con = master.con.clone();
        let recorded: i64 = self
            .inner
            .fence_script
            .key(lock_key)
            .key(LockNames::fence(lock_key))
            .arg(holder)
            .arg(fence.to_string())
            .arg(&self.inner.window)
            .invoke_async(&mut con)
            .await
            .map_err(|e| master.failed("fence write-back failed", e))?;
        Ok(recorded == 1)
    }
}
