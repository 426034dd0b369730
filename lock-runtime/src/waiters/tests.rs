#![allow(clippy::unwrap_used)]

use super::*;
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(3);

fn key() -> (Arc<Waiters>, WaitTicket, WaitTicket) {
    let waiters = Waiters::new();
    let a = waiters.register("lock:{k}:released".to_owned(), Node::root(), None, false);
    let b = waiters.register("lock:{k}:released".to_owned(), Node::root(), None, false);
    (waiters, a, b)
}

#[test]
fn one_attempt_per_place_and_no_handoff_taken_while_it_is_out() {
    let (waiters, a, b) = key();
    let (id, attempt) = a.begin_attempt(LEASE, None).unwrap();
    assert!(
        b.begin_attempt(LEASE, None).is_none(),
        "two attempts at once"
    );
    waiters.hand_over("lock:{k}:released", &id, 7, 7);
    assert!(
        b.take_handoff(Duration::ZERO, 0, None).is_none(),
        "taken mid-attempt"
    );
    drop(attempt);
    let handoff = b.take_handoff(Duration::ZERO, 0, None).unwrap();
    assert_eq!((handoff.holder.as_str(), handoff.fence), (id.as_str(), 7));
    // Used up: the next attempt makes a new place.
    let (next, _attempt) = a.begin_attempt(LEASE, None).unwrap();
    assert_ne!(next, id);
}

#[test]
fn a_place_serves_one_mode_and_a_waiter_of_the_other_replaces_it() {
    let (waiters, a, b) = key();
    let (read_place, attempt) = a.begin_attempt(LEASE, Some(true)).unwrap();
    drop(attempt);
    waiters.hand_over("lock:{k}:released", &read_place, 7, 7);
    // A writer does not take the read hold handed to a reader's place.
    assert!(b.take_handoff(Duration::ZERO, 0, Some(false)).is_none());
    // Its attempt queues a new place, in its own mode.
    let (write_place, attempt) = b.begin_attempt(LEASE, Some(false)).unwrap();
    assert_ne!(write_place, read_place);
    drop(attempt);
    waiters.hand_over("lock:{k}:released", &write_place, 8, 8);
    assert!(a.take_handoff(Duration::ZERO, 0, Some(true)).is_none());
    let handoff = b.take_handoff(Duration::ZERO, 0, Some(false)).unwrap();
    assert_eq!(handoff.holder, write_place);
    // Where places have no mode, any waiter uses one.
    let (place, attempt) = a.begin_attempt(LEASE, None).unwrap();
    drop(attempt);
    waiters.hand_over("lock:{k}:released", &place, 9, 9);
    assert!(b.take_handoff(Duration::ZERO, 0, None).is_some());
}

#[test]
fn an_attempt_of_a_used_up_place_does_not_end_the_next_one() {
    let (_waiters, a, b) = key();
    let (id, old) = a.begin_attempt(LEASE, None).unwrap();
    assert!(a.claim_place(&id));
    let (_, new) = b.begin_attempt(LEASE, None).unwrap();
    drop(old);
    assert!(
        a.begin_attempt(LEASE, None).is_none(),
        "the old guard ended it"
    );
    drop(new);
    assert!(a.begin_attempt(LEASE, None).is_some());
}

#[test]
fn a_busy_reply_sent_after_a_handoff_drops_it() {
    let (waiters, a, _b) = key();
    let (id, attempt) = a.begin_attempt(LEASE, None).unwrap();
    let before = Instant::now();
    drop(attempt);
    waiters.hand_over("lock:{k}:released", &id, 7, 7);
    a.confirm_place(&id, before); // older news: kept
    assert!(a.take_handoff(Duration::ZERO, 0, None).is_some());

    let (id, attempt) = a.begin_attempt(LEASE, None).unwrap();
    drop(attempt);
    waiters.hand_over("lock:{k}:released", &id, 8, 8);
    a.confirm_place(&id, Instant::now()); // after it: the claim is gone
    assert!(a.take_handoff(Duration::ZERO, 0, None).is_none());
}

#[test]
fn a_handoff_with_too_little_claim_left_is_dropped() {
    let (waiters, a, _b) = key();
    let claim = Duration::from_millis(30);
    let (id, attempt) = a.begin_attempt(claim, None).unwrap();
    drop(attempt);
    waiters.hand_over("lock:{k}:released", &id, 7, 7);
    // The claim counts from the place's creation: 30 ms, of which at
    // least 20 ms must be left.
    std::thread::sleep(Duration::from_millis(15));
    assert!(a.take_handoff(Duration::ZERO, 0, None).is_none());
    // Dropped, not kept: the place is still ours to attempt with.
    let (again, _attempt) = a.begin_attempt(claim, None).unwrap();
    assert_eq!(again, id);
}

#[test]
fn a_handoff_from_before_a_lost_connection_is_not_taken() {
    let (waiters, a, _b) = key();
    let (id, attempt) = a.begin_attempt(LEASE, None).unwrap();
    drop(attempt);
    waiters.hand_over("lock:{k}:released", &id, 7, 7);
    // The server restarted (empty, perhaps) before a waiter ran.
    waiters.connection_lost();
    let now = waiters.connection_epoch();
    assert!(a.take_handoff(Duration::ZERO, now, None).is_none());
    // Dropped, not kept for later: the place stays, and an attempt with
    // it confirms (or not) the handoff with a round trip.
    assert!(a.take_handoff(Duration::ZERO, now, None).is_none());
    let (again, _attempt) = a.begin_attempt(LEASE, None).unwrap();
    assert_eq!(again, id);
    // A handoff that arrives after the loss is good in the new epoch.
    drop(_attempt);
    waiters.hand_over("lock:{k}:released", &id, 8, 8);
    let handoff = a.take_handoff(Duration::ZERO, now, None).unwrap();
    assert_eq!((handoff.fence, handoff.epoch), (8, now));
}

#[tokio::test]
async fn an_attempt_whose_waiter_went_away_before_its_reply_wakes_the_head() {
    let (_waiters, a, b) = key();
    let woken = || tokio::time::timeout(Duration::from_millis(50), a.slot().wake.notified());
    // Answered: its waiter handled the reply (busy), nobody else tries.
    let (id, attempt) = b.begin_attempt(LEASE, None).unwrap();
    b.confirm_place(&id, Instant::now());
    drop(attempt);
    assert!(woken().await.is_err(), "woken for an answered attempt");
    // Its waiter went away with the script out: what the script did
    // (perhaps take the free lock for the place) is for the head to
    // find out.
    let (_, attempt) = b.begin_attempt(LEASE, None).unwrap();
    drop(attempt);
    assert!(woken().await.is_ok(), "the head was not woken");
}

/// Watches that record the places given back.
#[derive(Debug, Default)]
struct GivenBack(Mutex<Vec<String>>);

impl Watches for GivenBack {
    fn watch(&self, _lock: &str, watched: Arc<dyn crate::backend::Watched>) {
        watched.set_ready();
    }
    fn unwatch(&self, _lock: &str) {}
    fn give_back_place(&self, _lock: String, holder: String) {
        self.0.lock().unwrap().push(holder);
    }
}

#[test]
fn a_place_given_up_after_a_failed_attempt_is_given_back_again_when_a_handoff_names_it() {
    let (waiters, a, _b) = key();
    let given_back = Arc::new(GivenBack::default());
    waiters.attach(Some(given_back.clone()));
    let (id, attempt) = a.begin_attempt(LEASE, None).unwrap();
    // The attempt failed: the caller gives the place up (and sends its
    // first give-back itself).
    assert_eq!(a.abandon_place(&id).as_deref(), Some(id.as_str()));
    drop(attempt);
    assert!(given_back.0.lock().unwrap().is_empty());
    // That give-back was lost, and a release handed the place the lock.
    waiters.hand_over("lock:{k}:released", &id, 7, 7);
    assert_eq!(*given_back.0.lock().unwrap(), std::slice::from_ref(&id));
    assert!(
        a.take_handoff(Duration::ZERO, 0, None).is_none(),
        "not ours"
    );
    // The key's last waiters leave: once more, with the unused place.
    let (place, attempt) = a.begin_attempt(LEASE, None).unwrap();
    drop(attempt);
    drop((a, _b));
    assert_eq!(*given_back.0.lock().unwrap(), [id.clone(), id, place]);
}

#[test]
fn a_fixed_lease_longer_than_the_claim_is_not_taken_from_the_message() {
    let (waiters, a, _b) = key();
    let (id, attempt) = a.begin_attempt(LEASE, None).unwrap();
    drop(attempt);
    waiters.hand_over("lock:{k}:released", &id, 7, 7);
    assert!(a.take_handoff(LEASE * 2, 0, None).is_none());
    assert!(a.take_handoff(LEASE, 0, None).is_some());
}
