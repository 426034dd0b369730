//! The entry gate's rule: whether a task may enter a hold now, on the
//! evidence it has at this moment.
//!
//! A task comes to hold a key in one of six ways: an acquire's own answer, a
//! fair handoff taken from its message, a hold another task of the process
//! passed to it (cohorting), a read joining another task's read hold, a
//! re-entry into its own ancestry's hold, and a downgrade (a read re-entry
//! nested in the write hold). Every one of them is news: the server said
//! something at one moment, and the task runs at a later one. In between, the
//! executor can stall, the process can be stopped, the server can restart
//! empty and give the key to someone else. So the decision to enter is taken
//! when the task enters, never when the news arrived.
//!
//! Each way in produces a [`Unentered`](crate::guard::Unentered) hold; only
//! `Unentered::enter` (`guard.rs`) turns it into the `LockGuard` a caller
//! gets, and only on [`Verdict::Enter`] from [`verdict`], the one function
//! here. This module decides; it acts on nothing (it may use no module of
//! the crate but `held`).

use std::time::Duration;

use crate::held::HeldLock;

/// How a task came to the hold it is about to enter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Way {
    /// The answer to this acquisition's own attempt.
    Answer,
    /// A fair handoff to this process's place, taken from its message.
    Handoff,
    /// A hold another task of this process passed on (cohorting).
    Passed,
    /// A read joining another task's read hold.
    Joined,
    /// A new frame of a hold of this task's own ancestry (re-entry, and the
    /// read a downgrade takes).
    Reentry,
}

/// What the gate knows of a hold at the moment of entry.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Evidence {
    /// Found gone, or its client-side validity (the send time of its last
    /// confirmation + the lease) has passed.
    pub(crate) lost: bool,
    /// How much of that validity is left now.
    pub(crate) left: Duration,
    /// The hold's lease.
    pub(crate) lease: Duration,
    /// The connection epoch of the backend's last word on it (the acquire's
    /// send, the handoff message's arrival, the last renewal's send).
    pub(crate) confirmed_in: u32,
    /// The backend's connection epoch now.
    pub(crate) epoch: u32,
    /// Whether the watchdog renews it (a renewal can confirm it).
    pub(crate) renewed: bool,
    pub(crate) way: Way,
}

impl Evidence {
    /// The evidence `held` gives now, the connection epoch being `epoch`.
    pub(crate) fn of(held: &HeldLock, epoch: u32, way: Way) -> Evidence {
        Evidence {
            lost: held.is_lost(),
            left: held.validity_left(tokio::time::Instant::now()),
            lease: held.lease,
            confirmed_in: held.confirmed_epoch(),
            epoch,
            renewed: held.renew,
            way,
        }
    }
}

/// The gate's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Enter: the hold is known valid now.
    Enter,
    /// A connection was lost since the backend last confirmed the hold (the
    /// server may have restarted without it), or too little of its
    /// validity is left to keep it: renew it at once, wait for that
    /// answer, and ask again.
    Confirm,
    /// Do not enter: give this hold back and ask the server anew.
    Back,
}

/// Less validity than this left (or a third of the lease, if less) at
/// entry, and a hold is renewed before a new holder enters it: its answer
/// came late (an acquire queued in the client while it reconnected, a
/// handoff claim near its end), and a renewal could not come back before
/// it ends.
pub(crate) const SHORT: Duration = Duration::from_secs(1);

/// Whether a task may enter a hold now.
///
/// - A lost hold is never entered.
/// - A hold the backend confirmed in the current connection epoch, with
///   enough of its validity left, is.
/// - Otherwise a renewed hold is confirmed with one round trip first.
/// - A fixed-lease hold has no renewal that could confirm it. Re-entered,
///   it is entered on its lease alone: its holder is inside already, and a
///   nested call adds no holder (docs/guarantees.md). Any other way, it is
///   given back and asked for again.
///
/// (A re-entry's validity left is not asked: its holder is inside already.)
pub(crate) fn verdict(evidence: Evidence) -> Verdict {
    let stale = evidence.confirmed_in != evidence.epoch;
    let short = evidence.way != Way::Reentry && evidence.left < (evidence.lease / 3).min(SHORT);
    if evidence.lost {
        Verdict::Back
    } else if !stale && !short {
        Verdict::Enter
    } else if evidence.renewed {
        Verdict::Confirm
    } else if evidence.way == Way::Reentry {
        Verdict::Enter
    } else {
        Verdict::Back
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{verdict, Evidence, Verdict, Way};

    const WAYS: [Way; 5] = [
        Way::Answer,
        Way::Handoff,
        Way::Passed,
        Way::Joined,
        Way::Reentry,
    ];

    const LEASE: Duration = Duration::from_secs(30);

    fn evidence(
        lost: bool,
        confirmed_in: u32,
        left: Duration,
        renewed: bool,
        way: Way,
    ) -> Evidence {
        Evidence {
            lost,
            left,
            lease: LEASE,
            confirmed_in,
            epoch: 7,
            renewed,
            way,
        }
    }

    /// Every way in, every combination of the evidence: a lost hold is
    /// never entered; an unconfirmed one, or one with too little validity
    /// left for a new holder, only after a renewal (or, a fixed lease, by
    /// re-entry alone); a confirmed live one at once.
    #[test]
    fn a_hold_is_entered_only_on_present_evidence() {
        for way in WAYS {
            for renewed in [true, false] {
                for confirmed_in in [6, 7] {
                    for left in [Duration::from_millis(999), Duration::from_secs(20)] {
                        let lost = verdict(evidence(true, confirmed_in, left, renewed, way));
                        assert_eq!(lost, Verdict::Back, "{way:?} lost");
                        let now = verdict(evidence(false, confirmed_in, left, renewed, way));
                        let short = left < Duration::from_secs(1) && way != Way::Reentry;
                        let known = confirmed_in == 7 && !short;
                        let want = match (known, renewed, way) {
                            (true, _, _) => Verdict::Enter,
                            (false, true, _) => Verdict::Confirm,
                            (false, false, Way::Reentry) => Verdict::Enter,
                            (false, false, _) => Verdict::Back,
                        };
                        let case = format!("{way:?} renewed={renewed} in {confirmed_in} {left:?}");
                        assert_eq!(now, want, "{case}");
                    }
                }
            }
        }
    }

    /// A short lease: "too little left" is a third of it.
    #[test]
    fn a_short_lease_is_short_at_a_third_of_itself() {
        let lease = Duration::from_millis(600);
        let at = |left_ms| {
            let mut e = evidence(false, 7, Duration::from_millis(left_ms), true, Way::Answer);
            e.lease = lease;
            verdict(e)
        };
        assert_eq!(at(199), Verdict::Confirm);
        assert_eq!(at(201), Verdict::Enter);
    }
}
