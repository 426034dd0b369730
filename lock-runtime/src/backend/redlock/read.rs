//! A read hold's vote on one master: `read.lua`, the single server's plain
//! read acquire, run behind the boot-marker check in the same call.
//!
//! Why its own script: a master that lost its data must not vote for a new
//! reader either (a reader beside a writer whose majority included that
//! master breaks exclusion as surely as a second writer; see `boot.rs`).
//! The check is `redlock_boot_check.lua`, prepended to `read.lua` at
//! compile time; `read.lua` itself runs unchanged inside a function, so its
//! early `return`s come back here, where the marker's longest lease is
//! added to the reply as `acquire.lua` adds it to an acquire's (which runs
//! behind the same check: `redis/scripts.rs`).

use std::time::Duration;

use super::{whole_ms, Answer, Redlock};
use crate::backend::redis::{Ballot, BootCheck, RedisBackend, Vote};
use crate::backend::Acquire;
use crate::error::BackendError;
use crate::names::LockNames;

/// The Redlock read: the boot-marker check, then `read.lua`, whose reply
/// (`{1, fence, fence}` or `{0, pttl}`) gets the marker's `lease` as its
/// fourth element (a busy reply's third is 0), as `acquire.lua`'s does.
pub(super) const READ_SCRIPT: &str = concat!(
    include_str!("../../scripts/redlock_boot_check.lua"),
    "local reply = (function()\n",
    include_str!("../../scripts/read.lua"),
    "\nend)()\n",
    "reply[3] = reply[3] or 0\n",
    "reply[4] = recorded\n",
    "return reply\n",
);

/// A read's `{code, n, _, lease}` reply as a [`Ballot`]: held with token
/// `n` (code 1), busy for `n` ms (0; negative: no expiry), or quarantined
/// for `n` ms (-1, or -2 when this call found the marker missing).
fn ballot(reply: &[i64]) -> Option<Ballot> {
    let [code, n, _, recorded] = reply[..] else {
        return None;
    };
    let millis = |n: i64| Duration::from_millis(u64::try_from(n).unwrap_or(0));
    let vote = match code {
        1 => {
            let fence = u64::try_from(n).unwrap_or(0);
            Vote::Acquire(Acquire::Held {
                fence,
                upto: fence,
                handed: false,
            })
        }
        0 => Vote::Acquire(Acquire::Busy {
            ttl: u64::try_from(n).ok().map(Duration::from_millis),
        }),
        -1 | -2 => Vote::Quarantined {
            left: millis(n),
            found: code == -2,
        },
        _ => return None,
    };
    Some(Ballot {
        vote,
        longest: millis(recorded),
    })
}

impl Redlock {
    /// A read hold of `ttl` on `master`, its boot marker checked in the same
    /// call (the read's counterpart of `RedisBackend::acquire_checked`).
    pub(super) async fn read_checked(
        &self,
        master: &RedisBackend,
        lock_key: &str,
        holder: &str,
        ttl: Duration,
        check: BootCheck<'_>,
    ) -> Answer<Ballot> {
        let reply: Vec<i64> = self
            .inner
            .read_script
            .key(lock_key)
            .key(LockNames::fence(lock_key))
            .key(check.marker)
            .arg(holder)
            .arg(whole_ms(ttl).max(1))
            .arg(&self.inner.window)
            // (ARGV[4], a reserve in acquire.lua, is unused by a read: the
            // boot check reads ARGV[5..7] in both scripts.)
            .arg(0)
            .arg(whole_ms(check.quarantine).max(1))
            .arg(whole_ms(check.longest).max(1))
            .arg(if check.retake { "1" } else { "0" })
            .invoke_async(&mut master.con.clone())
            .await
            .map_err(|e| master.failed("read acquire failed", e))?;
        ballot(&reply).ok_or_else(|| {
            BackendError::msg(format!(
                "read acquire failed on Redis at {}: unexpected reply {reply:?}",
                master.endpoint()
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::backend::redis::scripts::ACQUIRE;

    const CHECK: &str = include_str!("../../scripts/redlock_boot_check.lua");

    #[test]
    fn the_read_checks_the_boot_marker_exactly_as_the_acquire_does() {
        let code = CHECK.lines().filter(|line| !line.starts_with("--"));
        assert!(code.count() > 10, "the check lost its code");
        assert!(ACQUIRE.starts_with(CHECK), "the acquire skips the check");
        assert!(READ_SCRIPT.starts_with(CHECK), "the read skips the check");
    }

    #[test]
    fn a_read_reply_becomes_a_ballot() {
        let held = ballot(&[1, 42, 42, 3032]).map(|b| (b.vote, b.longest));
        assert_eq!(
            held,
            Some((
                Vote::Acquire(Acquire::Held {
                    fence: 42,
                    upto: 42,
                    handed: false
                }),
                Duration::from_millis(3032)
            ))
        );
        let busy = ballot(&[0, 900, 0, 0]).map(|b| b.vote);
        assert_eq!(
            busy,
            Some(Vote::Acquire(Acquire::Busy {
                ttl: Some(Duration::from_millis(900))
            }))
        );
        let found = ballot(&[-2, 500, 0, 1000]).map(|b| b.vote);
        assert_eq!(
            found,
            Some(Vote::Quarantined {
                left: Duration::from_millis(500),
                found: true
            })
        );
        assert_eq!(ballot(&[1, 2]), None);
    }
}
