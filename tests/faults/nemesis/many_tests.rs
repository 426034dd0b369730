//! The multi-key checks on made-up histories: a body without all its keys,
//! order refusals, and a key a waiting multi-key call may hold.

use super::checker_tests::verdict;

/// An event line of key `key` at `ms` milliseconds.
fn ev(ms: u64, (call, parent, key): (u64, u64, usize), kind: &str, fields: &str) -> String {
    format!(
        "ev {} 0 {call} {parent} {key} {kind} {fields}",
        ms * 1_000_000
    )
}

const ASK: &str = "api=with wait=5000 bound=0 lease=3000 renew=1 fair=0 lost=abort mode=write";

/// Multi-key call 1 on keys 1 and 2 (records 1 and 2): both entered at
/// 100 ms unless `alone`, then only key 1, released at 1000 ms.
fn pair(alone: bool) -> Vec<String> {
    let mut lines = Vec::new();
    for (call, key) in [(1, 1), (2, 2)] {
        lines.push(ev(
            10,
            (call, 0, key),
            "begin",
            &format!("{ASK} many=1 keys=1,2"),
        ));
    }
    for (call, key) in [(1, 1), (2, 2)] {
        if alone && key == 2 {
            lines.push(ev(100, (call, 0, key), "error", "what=no_token"));
            continue;
        }
        let fields = format!("fence={} outer=1 polled={}", 10 + key, 100_000_000);
        lines.push(ev(100, (call, 0, key), "acquired", &fields));
        lines.push(ev(100, (call, 0, key), "body_enter", ""));
        lines.push(ev(1000, (call, 0, key), "body_exit", "how=done"));
        lines.push(ev(1000, (call, 0, key), "released", ""));
    }
    lines
}

#[test]
fn checker_sees_a_multi_key_body_without_all_its_keys() {
    assert!(verdict(vec![pair(false)], &[]).is_empty());
    assert_eq!(
        verdict(vec![pair(true)], &[]),
        ["multi-key body without all its keys"]
    );
}

/// [`pair`] with call 3 nested (under record `parent`) on `key`, ended by
/// `end` at `ms`.
fn nested(parent: u64, key: usize, (ms, end): (u64, &str)) -> Vec<&'static str> {
    let mut lines = pair(false);
    lines.push(ev(200, (3, parent, key), "begin", ASK));
    let (kind, fields) = end.split_once(' ').unwrap_or((end, ""));
    if kind == "acquired" {
        lines.push(ev(ms, (3, parent, key), "acquired", fields));
        lines.push(ev(ms, (3, parent, key), "body_enter", ""));
        lines.push(ev(ms + 10, (3, parent, key), "body_exit", "how=done"));
        lines.push(ev(ms + 10, (3, parent, key), "released", ""));
    } else {
        lines.push(ev(ms, (3, parent, key), kind, fields));
    }
    verdict(vec![lines], &[])
}

#[test]
fn checker_sees_a_key_asked_out_of_order_that_is_not_refused_at_once() {
    // Key 0 sorts before key 2, which the multi-key call holds.
    assert!(nested(1, 0, (201, "error what=order_refused")).is_empty());
    assert_eq!(
        nested(1, 0, (900, "error what=order_refused")),
        ["order not refused at once"]
    );
    assert_eq!(
        nested(2, 0, (300, "acquired fence=5 outer=1")),
        ["order not refused at once"]
    );
    // Key 1 is held (a re-entry, whichever record it is nested under):
    // never refused, and no sibling of the body it re-enters.
    assert!(nested(2, 1, (201, "acquired fence=11 outer=0")).is_empty());
    assert_eq!(
        nested(1, 1, (201, "error what=order_refused")),
        ["order refused without cause"]
    );
}

#[test]
fn checker_counts_a_waiting_multi_key_call_s_keys_as_held() {
    // Multi-key call 1 waits from 10 ms to 4000 ms (holding key 1 while it
    // waits for key 2, maybe); another process times out on key 1 then.
    let mut waiting = Vec::new();
    for (call, key) in [(1, 1), (2, 2)] {
        waiting.push(ev(
            10,
            (call, 0, key),
            "begin",
            &format!("{ASK} many=1 keys=1,2"),
        ));
    }
    waiting.push(ev(4000, (1, 0, 1), "error", "what=other_key"));
    waiting.push(ev(4000, (2, 0, 2), "timeout", "waited=3990"));
    // Key 2 is held meanwhile by a third process.
    let holder = vec![
        ev(5, (1, 0, 2), "begin", ASK),
        ev(5, (1, 0, 2), "acquired", "fence=7 outer=1 polled=5000000"),
        ev(5, (1, 0, 2), "body_enter", ""),
        ev(5000, (1, 0, 2), "body_exit", "how=done"),
        ev(5000, (1, 0, 2), "released", ""),
    ];
    let other = |ms: u64| {
        vec![
            ev(ms, (1, 0, 1), "begin", ASK),
            ev(ms + 5000, (1, 0, 1), "timeout", "waited=5000"),
        ]
    };
    assert!(verdict(vec![waiting.clone(), other(100), holder.clone()], &[]).is_empty());
    // Once the multi-key call gave key 1 back (and its lock may no longer
    // linger: its release was not logged), the key is free.
    assert_eq!(
        verdict(vec![waiting.clone(), other(7000), holder], &[]),
        ["timed out on a free key"]
    );
    // Its own timeout is checked like any other: key 2 was free.
    assert_eq!(verdict(vec![waiting], &[]), ["timed out on a free key"]);
}
