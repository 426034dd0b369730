//! The permit checks on made-up histories: two holders on one permit at
//! once are seen, N holders on N permits at once are not, a permit told
//! wrong or not re-entered is seen, and a try-once may take N tries' time.

use super::checker_tests::verdict;

/// An event line of `column` (`3#1`: key 3, permit 1) at `ms` milliseconds.
fn ev(ms: u64, (call, parent, column): (u64, u64, &str), kind: &str, fields: &str) -> String {
    format!(
        "ev {} 0 {call} {parent} {column} {kind} {fields}",
        ms * 1_000_000
    )
}

const ASK: &str = "api=with wait=5000 bound=0 lease=3000 renew=1 fair=0 lost=abort permits=3";

/// A hold by `call` (under `parent`) of permit `permit` of key 3 with
/// token `fence`, from `from` to `to` ms, told `said` (`permit=<said>`).
fn hold(
    (call, parent): (u64, u64),
    (permit, said, fence): (u32, u32, u64),
    (from, to): (u64, u64),
    outer: bool,
) -> Vec<String> {
    let column = format!("3#{permit}");
    let at = (call, parent, column.as_str());
    let acquired = format!(
        "fence={fence} outer={} polled={} permit={said} permits=3",
        u8::from(outer),
        from * 1_000_000
    );
    vec![
        ev(from.saturating_sub(1), at, "begin", ASK),
        ev(from, at, "acquired", &acquired),
        ev(from, at, "body_enter", ""),
        ev(to, at, "body_exit", "how=done"),
        ev(to, at, "released", ""),
    ]
}

/// An outermost hold of permit `permit` (told so) by call 1 of a process.
fn outer_hold(permit: u32, fence: u64, (from, to): (u64, u64)) -> Vec<String> {
    hold((1, 0), (permit, permit, fence), (from, to), true)
}

#[test]
fn checker_sees_two_holders_on_one_permit() {
    let one_permit = vec![outer_hold(1, 10, (100, 300)), outer_hold(1, 11, (200, 400))];
    assert_eq!(verdict(one_permit, &[]), ["two holders at once"]);
}

#[test]
fn checker_accepts_n_holders_on_n_permits_at_once() {
    let found = verdict(
        vec![
            outer_hold(0, 10, (100, 400)),
            outer_hold(1, 10, (150, 400)),
            outer_hold(2, 10, (200, 400)),
        ],
        &[],
    );
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn checker_sees_a_permit_told_wrong() {
    // Logged under permit 1 (the lock it holds), told permit 2.
    let told_wrong = hold((1, 0), (1, 2, 10), (100, 300), true);
    assert_eq!(verdict(vec![told_wrong], &[]), ["permit index wrong"]);
    // Told a permit past the count.
    let past = hold((1, 0), (3, 3, 10), (100, 300), true);
    assert_eq!(verdict(vec![past], &[]), ["permit index wrong"]);
}

#[test]
fn checker_sees_a_nested_permit_call_that_does_not_reenter() {
    let mut reentered = outer_hold(1, 10, (100, 500));
    reentered.extend(hold((2, 1), (1, 1, 10), (200, 300), false));
    assert!(verdict(vec![reentered], &[]).is_empty());
    // Nested, it took another permit of the key.
    let mut another = outer_hold(1, 10, (100, 500));
    another.extend(hold((2, 1), (2, 2, 10), (200, 300), true));
    assert_eq!(verdict(vec![another], &[]), ["permit not re-entered"]);
}

#[test]
fn checker_lets_a_permit_try_take_a_try_per_permit() {
    // A try-once that found every permit busy, 1.5 s after it began: one
    // key's try may end 750 ms late, one of three permits' 2250 ms.
    let tried = |fields: &str| {
        let at = (1, 0, "3#2");
        vec![
            ev(100, at, "begin", &fields.replace("wait=5000", "wait=0")),
            ev(1600, at, "timeout", "waited=0 busy=1"),
        ]
    };
    assert!(verdict(vec![tried(ASK)], &[]).is_empty());
    let one_key = ASK.replace(" permits=3", "");
    assert_eq!(verdict(vec![tried(&one_key)], &[]), ["waiter overslept"]);
}

#[test]
fn checker_holds_calls_giving_fewer_permits_to_the_low_ones() {
    // A call of two permits on permit 2 (past its count) is seen, as any
    // permit told past its count; three holders of three permits, one of
    // them a call of two on permit 1, are not.
    let of_two = |permit: u32, from: u64| {
        hold((1, 0), (permit, permit, 10), (from, 400), true)
            .into_iter()
            .map(|l| l.replace("permits=3", "permits=2"))
            .collect::<Vec<_>>()
    };
    assert_eq!(verdict(vec![of_two(2, 100)], &[]), ["permit index wrong"]);
    let shared = vec![
        outer_hold(0, 10, (100, 400)),
        of_two(1, 150),
        outer_hold(2, 10, (200, 400)),
    ];
    assert!(verdict(shared, &[]).is_empty());
}
