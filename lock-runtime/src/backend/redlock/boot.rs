//! The masters' boot markers: how a runtime tells a master that lost its
//! data from one that kept it, and from a fleet nobody has locked on yet.
//!
//! Why: a master restarted without its data has forgotten its holds, and a
//! holder whose majority included it goes on counting on that hold until
//! its lease ends. If the master voted at once, a second holder could take
//! it and the masters the first holder does not have: two holders (the
//! Redlock restart hazard; with three masters, a holder of exactly two
//! needs only one of them to come back empty). The Redlock description's
//! remedy is a "delayed restart": such a master takes no new hold for one
//! lease. We cannot configure the servers, so the clients do it: every
//! master keeps a marker (`<prefix>redlock:boot`, no TTL), created when a
//! runtime first finds the master's data set, and checked by
//! `redlock_boot_check.lua` in the same call as every acquire. A marker that is missing once a
//! runtime has created it means the data is gone, and the script creates
//! it again, quarantined: no new hold on that master until the longest
//! lease known has passed (`quorum::quarantine`). A master restarted from
//! its persistence files has its marker and is not quarantined.
//!
//! How long: the markers record the longest TTL each master gave a hold,
//! and every acquire's answer tells the runtime, so clients with different
//! leases need not agree on a setting. A hold on the lost data had, with
//! the other masters of its majority, the same TTL, and those still record
//! it (one master lost; with more, Redlock promises nothing).
//!
//! A fresh fleet: at start-up a runtime reads every master's marker
//! ([`Redlock::open_markers`]). Where one is missing it creates it — open
//! when no master records any hold (nobody has locked on this fleet under
//! this prefix, so nothing was lost), quarantined otherwise. So a new
//! deployment locks at once; a master that was down at start-up and comes
//! back later ([`Redlock::open_marker`]) is quarantined once locks were
//! taken, since nothing tells a new master from one that lost its data.

use std::time::Duration;

use super::gather::gather;
use super::{quorum, whole_ms, Answer, Redlock};
use crate::backend::redis::RedisBackend;
use crate::error::BackendError;

/// Creates a master's boot marker unless it has one (see the script).
pub(super) const BOOT_SCRIPT: &str = include_str!("../../scripts/redlock_boot.lua");

/// A marker as a master keeps it (ms of that master's clock).
#[derive(Clone, Copy, Debug)]
struct Marker {
    since: u64,
    until: u64,
    /// The longest TTL the master gave a hold.
    lease: Duration,
}

impl Redlock {
    /// At start-up: reads every connected master's marker, learns the
    /// longest TTL they record, and creates the missing ones, open when no
    /// master records a hold (a fresh fleet) and quarantined otherwise. A
    /// master that does not answer is left to its first acquire, which
    /// creates the marker quarantined if it is still missing.
    pub(super) async fn open_markers(&self) {
        let reads = gather(self.calls(|m| self.read_marker(m)), |_| false).await;
        let mut missing = Vec::new();
        for (i, read) in reads.iter().enumerate() {
            match read {
                Some(Ok(Some(marker))) => self.learn(marker.lease),
                Some(Ok(None)) => missing.push(i),
                Some(Err(error)) => {
                    tracing::debug!(%error, "Redlock: reading a boot marker failed");
                }
                None => {}
            }
        }
        if missing.is_empty() {
            return;
        }
        let longest = self.longest();
        let created = self.calls_on(missing.iter().copied(), |m| {
            self.create_marker(m, quorum::quarantine(longest), longest)
        });
        let answers = gather(created, |_| false).await;
        for (i, answer) in missing.iter().zip(answers) {
            let endpoint = self.inner.masters.get(*i).map(|m| m.endpoint.as_str());
            self.created(endpoint.unwrap_or("?"), answer);
        }
    }

    /// A master connected after start-up (it was down then): reads its
    /// marker, and creates it if missing, quarantined once this runtime
    /// knows of any hold on the fleet (see the module docs). Bounded by the
    /// response timeout.
    pub(super) async fn open_marker(&self, master: &RedisBackend) {
        let bound = self.inner.timeout;
        let read = tokio::time::timeout(bound, self.read_marker(master)).await;
        match read {
            Ok(Ok(Some(marker))) => self.learn(marker.lease),
            Ok(Ok(None)) => {
                let longest = self.longest();
                let create = self.create_marker(master, quorum::quarantine(longest), longest);
                let created = tokio::time::timeout(bound, create).await;
                self.created(master.endpoint(), created.ok());
            }
            Ok(Err(error)) => tracing::debug!(%error, "Redlock: reading a boot marker failed"),
            Err(_) => tracing::debug!("Redlock: no answer reading a boot marker"),
        }
    }

    /// The marker of `master`, `None` when it has none.
    async fn read_marker(&self, master: &RedisBackend) -> Answer<Option<Marker>> {
        let fields: (Option<u64>, Option<u64>, Option<u64>) = redis::cmd("HMGET")
            .arg(&self.inner.marker)
            .arg("since")
            .arg("until")
            .arg("lease")
            .query_async(&mut master.con.clone())
            .await
            .map_err(|e| master.failed("reading the boot marker failed", e))?;
        Ok(match fields {
            (Some(since), Some(until), lease) => Some(Marker {
                since,
                until,
                lease: Duration::from_millis(lease.unwrap_or(0)),
            }),
            _ => None,
        })
    }

    /// Runs `redlock_boot.lua` on `master`: its marker, created now (with
    /// `quarantine`, and `longest` as its longest TTL) unless it has one.
    async fn create_marker(
        &self,
        master: &RedisBackend,
        quarantine: Duration,
        longest: Duration,
    ) -> Answer<(Marker, bool)> {
        let reply: Vec<u64> = self
            .inner
            .boot_script
            .key(&self.inner.marker)
            .arg(whole_ms(quarantine))
            .arg(whole_ms(longest))
            .invoke_async(&mut master.con.clone())
            .await
            .map_err(|e| master.failed("creating the boot marker failed", e))?;
        let [since, until, lease, created] = reply[..] else {
            return Err(BackendError::msg(format!(
                "creating the boot marker failed on Redis at {}: unexpected reply {reply:?}",
                master.endpoint()
            )));
        };
        let marker = Marker {
            since,
            until,
            lease: Duration::from_millis(lease),
        };
        Ok((marker, created == 1))
    }

    /// Takes in the outcome of [`create_marker`](Self::create_marker) on
    /// the master at `endpoint` (`None`: no answer in time).
    fn created(&self, endpoint: &str, outcome: Option<Answer<(Marker, bool)>>) {
        match outcome {
            Some(Ok((marker, created))) => {
                self.learn(marker.lease);
                if created && marker.until > marker.since {
                    tracing::warn!(
                        master = endpoint,
                        "Redlock: the master has no boot marker while others record holds: it \
                         lost its data or is new to the fleet; it takes no new lock for {:?}",
                        Duration::from_millis(marker.until - marker.since)
                    );
                }
            }
            Some(Err(error)) => tracing::debug!(%error, "Redlock: creating a boot marker failed"),
            None => tracing::debug!(
                master = endpoint,
                "Redlock: no answer creating a boot marker"
            ),
        }
    }
}
