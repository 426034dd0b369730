//! What the runtime reports to a `metrics` recorder (cargo feature
//! `metrics`): one function per thing that happens, called where it happens
//! (an acquire ends, a hold begins or ends, a waiter queues or leaves, a
//! renewal batch goes out or fails, a lock is lost). Without the feature
//! every function is empty and compiles to nothing.
//!
//! Why a module of its own: the names, labels and units of the metrics are
//! a public contract (dashboards and alerts are written against them), so
//! they are spelled in one place. Labels are static strings, so a call costs
//! no allocation; with no recorder installed the facade hands out no-op
//! handles. Keys become a label only with the feature `metrics-keys` (each
//! key is a time series of its own: fine for a few hundred keys such as
//! job names, ruinous for one key per order id).
//! A leaf: it imports nothing of this crate.

/// How an acquire ended, as the `outcome` label of `lock_acquisitions_total`
/// and `lock_wait_seconds`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The lock was taken (also a re-entry or a fair handoff).
    Acquired,
    /// A try-once found it held by someone else.
    Busy,
    /// A bounded wait ran out.
    Timeout,
    /// A bounded wait ran out waiting for a hold of its own task.
    SelfDeadlock,
    /// The runtime shut down.
    ShutDown,
    /// The backend failed, or the request was invalid.
    Error,
}

impl Outcome {
    /// The label value (and the `outcome` field of the tracing events).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Acquired => "acquired",
            Outcome::Busy => "busy",
            Outcome::Timeout => "timeout",
            Outcome::SelfDeadlock => "self_deadlock",
            Outcome::ShutDown => "shut_down",
            Outcome::Error => "error",
        }
    }
}

#[cfg(feature = "metrics")]
mod on {
    use std::time::Duration;

    use metrics::{counter, gauge, histogram};

    use super::Outcome;

    /// The metric names, for `describe` and the docs.
    pub(super) const ACQUISITIONS: &str = "lock_acquisitions_total";
    pub(super) const WAIT: &str = "lock_wait_seconds";
    pub(super) const HOLD: &str = "lock_hold_seconds";
    pub(super) const HELD: &str = "lock_held";
    pub(super) const WAITERS: &str = "lock_waiters";
    pub(super) const LOST: &str = "lock_lost_total";
    pub(super) const RENEWALS: &str = "lock_renewal_round_trips_total";
    pub(super) const RENEWAL_FAILURES: &str = "lock_renewal_failures_total";

    /// One macro call per outcome: each label set is a literal, which the
    /// facade keeps in a static (no allocation per call).
    #[cfg(not(feature = "metrics-keys"))]
    pub(crate) fn acquire_ended(_key: &str, outcome: Outcome, waited: Duration) {
        let secs = waited.as_secs_f64();
        macro_rules! report {
            ($label:literal) => {{
                counter!(ACQUISITIONS, "outcome" => $label).increment(1);
                histogram!(WAIT, "outcome" => $label).record(secs);
            }};
        }
        match outcome {
            Outcome::Acquired => report!("acquired"),
            Outcome::Busy => report!("busy"),
            Outcome::Timeout => report!("timeout"),
            Outcome::SelfDeadlock => report!("self_deadlock"),
            Outcome::ShutDown => report!("shut_down"),
            Outcome::Error => report!("error"),
        }
    }

    /// With `metrics-keys`: the key is a label too (it allocates: the
    /// label owns a copy of the key).
    #[cfg(feature = "metrics-keys")]
    pub(crate) fn acquire_ended(key: &str, outcome: Outcome, waited: Duration) {
        let labels = [
            ("key", key.to_owned()),
            ("outcome", outcome.as_str().to_owned()),
        ];
        counter!(ACQUISITIONS, &labels).increment(1);
        histogram!(WAIT, &labels).record(waited.as_secs_f64());
    }

    pub(crate) fn hold_started() {
        gauge!(HELD).increment(1.0);
    }

    #[cfg(not(feature = "metrics-keys"))]
    pub(crate) fn hold_ended(_key: &str, held_for: Duration) {
        gauge!(HELD).decrement(1.0);
        histogram!(HOLD).record(held_for.as_secs_f64());
    }

    #[cfg(feature = "metrics-keys")]
    pub(crate) fn hold_ended(key: &str, held_for: Duration) {
        gauge!(HELD).decrement(1.0);
        histogram!(HOLD, "key" => key.to_owned()).record(held_for.as_secs_f64());
    }

    #[cfg(not(feature = "metrics-keys"))]
    pub(crate) fn lost(_key: &str) {
        counter!(LOST).increment(1);
    }

    #[cfg(feature = "metrics-keys")]
    pub(crate) fn lost(key: &str) {
        counter!(LOST, "key" => key.to_owned()).increment(1);
    }

    pub(crate) fn waiter_joined() {
        gauge!(WAITERS).increment(1.0);
    }

    pub(crate) fn waiter_left() {
        gauge!(WAITERS).decrement(1.0);
    }

    pub(crate) fn renewal_sent() {
        counter!(RENEWALS).increment(1);
    }

    pub(crate) fn renewal_failed() {
        counter!(RENEWAL_FAILURES).increment(1);
    }
}

#[cfg(feature = "metrics")]
pub(crate) use on::{
    acquire_ended, hold_ended, hold_started, lost, renewal_failed, renewal_sent, waiter_joined,
    waiter_left,
};

#[cfg(not(feature = "metrics"))]
mod off {
    use std::time::Duration;

    use super::Outcome;

    #[inline(always)]
    pub(crate) fn acquire_ended(_key: &str, _outcome: Outcome, _waited: Duration) {}
    #[inline(always)]
    pub(crate) fn hold_started() {}
    #[inline(always)]
    pub(crate) fn hold_ended(_key: &str, _held_for: Duration) {}
    #[inline(always)]
    pub(crate) fn lost(_key: &str) {}
    #[inline(always)]
    pub(crate) fn waiter_joined() {}
    #[inline(always)]
    pub(crate) fn waiter_left() {}
    #[inline(always)]
    pub(crate) fn renewal_sent() {}
    #[inline(always)]
    pub(crate) fn renewal_failed() {}
}

#[cfg(not(feature = "metrics"))]
pub(crate) use off::{
    acquire_ended, hold_ended, hold_started, lost, renewal_failed, renewal_sent, waiter_joined,
    waiter_left,
};

/// Registers the descriptions and units of the runtime's metrics with the
/// installed `metrics` recorder (exporters print them as `# HELP` lines).
/// Call it once after installing the recorder; the metrics are reported
/// without it too. Only with the cargo feature `metrics`.
///
/// | metric | kind | labels | meaning |
/// |---|---|---|---|
/// | `lock_acquisitions_total` | counter | `outcome` | acquires that ended: `acquired` (also re-entries and fair handoffs), `busy` (a try-once found it held), `timeout`, `self_deadlock`, `shut_down`, `error` |
/// | `lock_wait_seconds` | histogram | `outcome` | how long those acquires took, waiting included |
/// | `lock_hold_seconds` | histogram | — | how long backend holds lasted (first acquire to last release; re-entries are inside one hold) |
/// | `lock_held` | gauge | — | backend holds of this process now |
/// | `lock_waiters` | gauge | — | acquires of this process waiting for a lock now |
/// | `lock_lost_total` | counter | — | holds lost while held (expired, deleted, not renewable in time) |
/// | `lock_renewal_round_trips_total` | counter | — | renewal batches sent by the watchdog (one round trip each, up to 1,000 locks) |
/// | `lock_renewal_failures_total` | counter | — | renewal batches that failed or got no answer in time (retried until the lease ends) |
///
/// With the feature `metrics-keys`, `lock_acquisitions_total`,
/// `lock_wait_seconds`, `lock_hold_seconds` and `lock_lost_total` also carry
/// the lock's `key`: one series per key, so use it only with a bounded set of
/// keys. Holder ids and passwords are never labels.
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        on::ACQUISITIONS,
        Unit::Count,
        "Lock acquires that ended, by outcome"
    );
    describe_histogram!(
        on::WAIT,
        Unit::Seconds,
        "Time from the start of an acquire to its outcome"
    );
    describe_histogram!(
        on::HOLD,
        Unit::Seconds,
        "Time a lock was held, first acquire to last release"
    );
    describe_gauge!(on::HELD, Unit::Count, "Locks this process holds now");
    describe_gauge!(
        on::WAITERS,
        Unit::Count,
        "Acquires of this process waiting for a lock now"
    );
    describe_counter!(on::LOST, Unit::Count, "Locks lost while held");
    describe_counter!(
        on::RENEWALS,
        Unit::Count,
        "Lease renewal round trips (pipelined batches)"
    );
    describe_counter!(
        on::RENEWAL_FAILURES,
        Unit::Count,
        "Lease renewal batches that failed or timed out"
    );
}

#[cfg(all(test, feature = "metrics-keys"))]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::on;
    use metrics::{
        Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
    };

    /// Remembers the series of every counter registered.
    #[derive(Default)]
    struct Series(Mutex<Vec<String>>);

    struct Record(Arc<Series>);

    impl Recorder for Record {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            let labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let series = format!("{}{{{}}}", key.name(), labels.join(","));
            self.0 .0.lock().unwrap().push(series);
            Counter::noop()
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }

    /// With `metrics-keys`, an acquisition's counter carries the key it was
    /// for, whatever its outcome (a new hold takes the request's key; the
    /// label must not come out empty).
    #[test]
    fn acquisitions_are_labelled_with_their_key() {
        let seen = Arc::new(Series::default());
        let recorder = Record(seen.clone());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        metrics::with_local_recorder(&recorder, || {
            rt.block_on(async {
                let runtime = crate::LockRuntime::builder()
                    .memory()
                    .build()
                    .await
                    .unwrap();
                let guard = runtime.lock("order:7").acquire().await.unwrap();
                let busy = runtime.lock("order:7").try_acquire().await.unwrap();
                assert!(busy.is_none());
                guard.release().await.unwrap();
            });
        });
        let series = seen.0.lock().unwrap().clone();
        let acquisitions: Vec<&String> = series
            .iter()
            .filter(|s| s.starts_with(on::ACQUISITIONS))
            .collect();
        assert_eq!(acquisitions.len(), 2, "{series:?}");
        assert!(
            acquisitions.iter().all(|s| s.contains("key=order:7")),
            "{acquisitions:?}"
        );
    }
}
