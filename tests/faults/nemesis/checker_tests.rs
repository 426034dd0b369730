//! The checker on made-up histories: it must see what it claims to see.

use super::check::check;
use super::faults::Fault;
use super::history::History;
use super::{ns, Backend, RECOVERY};

/// An event line at `ms` milliseconds.
fn ev(ms: u64, task: u32, call: u64, parent: u64, kind: &str, fields: &str) -> String {
    format!(
        "ev {} {task} {call} {parent} 0 {kind} {fields}",
        ms * 1_000_000
    )
}

/// A renewed 3 s hold of key 0 by `call` from `from` to `to` ms, ended by `end`.
fn hold(call: u64, fence: u64, from: u64, to: u64, end: &str) -> Vec<String> {
    polled_hold(call, fence, from, from, to, end)
}

/// [`hold`], handed over in a poll that began at `polled` ms.
fn polled_hold(call: u64, fence: u64, polled: u64, from: u64, to: u64, end: &str) -> Vec<String> {
    vec![
        ev(
            from.saturating_sub(1),
            0,
            call,
            0,
            "begin",
            "api=with wait=5000 bound=0 lease=3000 renew=1 fair=0 lost=abort",
        ),
        ev(
            from,
            0,
            call,
            0,
            "acquired",
            &format!("fence={fence} outer=1 polled={}", polled * 1_000_000),
        ),
        ev(from, 0, call, 0, "body_enter", ""),
        ev(to, 0, call, 0, end, ""),
    ]
}

/// The violation classes the checker finds in these per-process logs.
pub(super) fn verdict(processes: Vec<Vec<String>>, faults: &[Fault]) -> Vec<&'static str> {
    verdict_on(Backend::Redis, processes, faults)
}

/// [`verdict`] with the bounds of `backend`.
fn verdict_on(
    backend: Backend,
    processes: Vec<Vec<String>>,
    faults: &[Fault],
) -> Vec<&'static str> {
    let outputs: Vec<Vec<String>> = processes
        .into_iter()
        .map(|mut lines| {
            lines.push("stats held=0 waiting=0 tracked=0".to_owned());
            lines
        })
        .collect();
    let ends = vec![60_000_000_000; outputs.len()];
    let mut violations = Vec::new();
    let history = History::parse(&outputs, &ends, 0, &mut violations);
    let _ = check(&history, faults, backend, &mut violations);
    let mut classes: Vec<&str> = violations.iter().map(|v| v.class).collect();
    classes.sort_unstable();
    classes
}

/// Process `p` stopped (or its executor blocked) from `from` to `to` ms.
fn frozen(p: usize, from: u64, to: u64) -> Fault {
    Fault {
        start: from * 1_000_000,
        end: to * 1_000_000,
        what: format!("SIGSTOP worker p{p}"),
        loses_data: false,
        settled: to * 1_000_000 + ns(RECOVERY),
        proxy: Some(p),
        armed: false,
        counted: true,
        frozen: true,
    }
}

fn restart_at(ms: u64) -> Fault {
    Fault {
        start: ms * 1_000_000,
        end: ms * 1_000_000 + 1_000_000,
        what: "restart".to_owned(),
        loses_data: true,
        settled: ms * 1_000_000 + ns(RECOVERY),
        proxy: None,
        armed: false,
        counted: true,
        frozen: false,
    }
}

#[test]
fn checker_sees_two_holders_at_once() {
    let found = verdict(
        vec![
            hold(1, 10, 100, 300, "released"),
            hold(1, 11, 200, 400, "released"),
        ],
        &[],
    );
    assert_eq!(found, ["two holders at once"]);
}

#[test]
fn checker_accepts_a_holder_told_lost_before_the_next_one_acquires() {
    let told_in_time = verdict(
        vec![
            hold(1, 10, 100, 204, "lost"),
            hold(1, 11, 200, 400, "released"),
        ],
        &[],
    );
    assert!(told_in_time.is_empty(), "{told_in_time:?}");
    let told_late = verdict(
        vec![
            hold(1, 10, 100, 210, "lost"),
            hold(1, 11, 200, 400, "released"),
        ],
        &[],
    );
    assert_eq!(told_late, ["holder told lost too late"]);
}

#[test]
fn checker_excuses_data_loss_only_with_a_larger_fence_and_a_prompt_loss() {
    // Bound: lease / 3 + response timeout + slack = 1405 ms after 200 ms.
    let excused = verdict(
        vec![
            hold(1, 10, 100, 1600, "lost"),
            hold(1, 11, 200, 400, "released"),
        ],
        &[restart_at(150)],
    );
    assert!(excused.is_empty(), "{excused:?}");
    let stale = verdict(
        vec![
            hold(1, 10, 100, 1700, "lost"),
            hold(1, 11, 200, 400, "released"),
        ],
        &[restart_at(150)],
    );
    assert_eq!(stale, ["stale holder not told after data loss"]);
    // The server frozen before the holder's next renewal: only its lease
    // end (100 + 3000 ms) can tell it.
    let freeze = Fault {
        what: "freeze".to_owned(),
        loses_data: false,
        ..restart_at(1000)
    };
    let frozen = |told: u64| {
        verdict(
            vec![
                hold(1, 10, 100, told, "lost"),
                hold(1, 11, 200, 400, "released"),
            ],
            &[
                restart_at(150),
                Fault {
                    end: 2500 * 1_000_000,
                    ..freeze.clone()
                },
            ],
        )
    };
    assert!(frozen(3100).is_empty());
    assert_eq!(frozen(3200), ["stale holder not told after data loss"]);
    let reused = verdict(
        vec![
            hold(1, 10, 100, 1600, "lost"),
            hold(1, 9, 200, 400, "released"),
        ],
        &[restart_at(150)],
    );
    assert_eq!(
        reused,
        ["fence not larger after data loss", "fence went backwards"]
    );
}

#[test]
fn checker_sees_siblings_inside_at_once_but_not_a_nested_call() {
    let nested = |call: u64, from: u64, to: u64| {
        vec![
            ev(
                from,
                0,
                call,
                1,
                "begin",
                "api=with wait=5000 bound=0 lease=3000 renew=1 fair=0 lost=abort",
            ),
            ev(from, 0, call, 1, "acquired", "fence=10 outer=0"),
            ev(from, 0, call, 1, "body_enter", ""),
            ev(to, 0, call, 1, "body_exit", "how=done"),
            ev(to, 0, call, 1, "released", ""),
        ]
    };
    let mut turns = hold(1, 10, 100, 500, "released");
    turns.extend(nested(2, 200, 300));
    turns.extend(nested(3, 300, 350));
    assert!(verdict(vec![turns], &[]).is_empty());
    let mut together = hold(1, 10, 100, 500, "released");
    together.extend(nested(2, 200, 300));
    together.extend(nested(3, 250, 350));
    assert_eq!(verdict(vec![together], &[]), ["siblings inside at once"]);
}

#[test]
fn checker_sees_late_waiters_and_timeouts_on_a_free_key_away_from_faults() {
    let waiter = |wait: u64, timed_out: u64| {
        vec![
            ev(
                0,
                0,
                1,
                0,
                "begin",
                &format!("api=with wait={wait} bound=0 lease=3000 renew=1 fair=0 lost=abort"),
            ),
            ev(
                timed_out,
                0,
                1,
                0,
                "timeout",
                &format!("waited={timed_out}"),
            ),
        ]
    };
    // Deadline 200 ms + 750 ms of slack; free for under a second.
    assert!(verdict(vec![waiter(200, 950)], &[]).is_empty());
    assert_eq!(verdict(vec![waiter(200, 1000)], &[]), ["waiter overslept"]);
    assert_eq!(
        verdict(vec![waiter(3000, 3000)], &[]),
        ["timed out on a free key"]
    );
    assert!(verdict(vec![waiter(3000, 3000)], &[restart_at(1000)]).is_empty());
    // The restart's window is 1000-2001 ms: a key out of reach for 5 s
    // besides is stuck.
    assert!(verdict(vec![waiter(6000, 6000)], &[restart_at(1000)]).is_empty());
    assert_eq!(
        verdict(vec![waiter(6100, 6100)], &[restart_at(1000)]),
        ["free key stuck"]
    );
    // Counted from the key's last hold, across waits: a key released at
    // 100 ms that a wait from 4000 to 7000 ms times out on, with a fault's
    // window from 5000 to 6001 ms, was out of reach for 5.9 s.
    let late_waiter = vec![
        ev(
            4000,
            0,
            1,
            0,
            "begin",
            "api=with wait=3000 bound=0 lease=3000 renew=1 fair=0 lost=abort",
        ),
        ev(7000, 0, 1, 0, "timeout", "waited=3000"),
    ];
    assert_eq!(
        verdict(
            vec![late_waiter.clone(), hold(1, 10, 50, 100, "released")],
            &[restart_at(5000)]
        ),
        ["free key stuck"]
    );
    assert!(verdict(
        vec![late_waiter, hold(1, 10, 50, 2000, "released")],
        &[restart_at(5000)]
    )
    .is_empty());
    // Held all along by another process: a fair timeout.
    assert!(verdict(
        vec![waiter(3000, 3000), hold(1, 10, 0, 3100, "released")],
        &[]
    )
    .is_empty());
}

#[test]
fn checker_sees_a_token_go_backwards_after_a_restart() {
    // p1 acquires on the new server; p0 then enters on what it was handed
    // before the restart, with a smaller token.
    let stale = verdict(
        vec![
            polled_hold(1, 10, 590, 600, 700, "released"),
            hold(1, 20, 300, 650, "released"),
        ],
        &[restart_at(150)],
    );
    assert_eq!(stale, ["fence went backwards", "two holders at once"]);
    // Even with no overlap.
    let apart = verdict(
        vec![
            polled_hold(1, 10, 590, 600, 700, "released"),
            hold(1, 20, 300, 400, "released"),
        ],
        &[restart_at(150)],
    );
    assert_eq!(apart, ["fence went backwards"]);
}

#[test]
fn checker_counts_an_entry_from_the_poll_that_handed_it_over() {
    // p0 is stopped from 100 to 2000 ms; it logs an entry at 2001 ms from a
    // poll that began at 90 ms, before the stop (p1 took the key while p0
    // was stopped, after p0's hold ran out): not after p1's entry.
    let before_the_stop = verdict(
        vec![
            polled_hold(1, 10, 90, 2001, 2002, "lost"),
            hold(1, 20, 1000, 1200, "released"),
        ],
        &[frozen(0, 100, 2000)],
    );
    assert!(before_the_stop.is_empty(), "{before_the_stop:?}");
    // The same entry from a poll after the stop: a hold lost during the
    // stop, entered after it.
    let after_the_stop = verdict(
        vec![
            polled_hold(1, 10, 2000, 2001, 2002, "lost"),
            hold(1, 20, 1000, 1200, "released"),
        ],
        &[frozen(0, 100, 2000)],
    );
    assert_eq!(after_the_stop, ["fence went backwards"]);
}

#[test]
fn checker_excuses_a_stopped_holder_only_until_it_runs_again() {
    // p0 holds from 100 ms and is stopped from 500 to 2000 ms; p1 takes the
    // key at 1500 ms. p0 must stop acting within 500 ms of running again.
    let told = |at: u64| {
        verdict(
            vec![
                hold(1, 10, 100, at, "lost"),
                hold(1, 11, 1500, 1600, "released"),
            ],
            &[frozen(0, 500, 2000)],
        )
    };
    assert!(told(2400).is_empty());
    assert_eq!(told(2600), ["holder told lost too late"]);
    // Not stopped: told lost when the next holder entered, or it is late.
    let unfrozen = verdict(
        vec![
            hold(1, 10, 100, 2400, "lost"),
            hold(1, 11, 1500, 1600, "released"),
        ],
        &[frozen(1, 500, 2000)],
    );
    assert_eq!(unfrozen, ["holder told lost too late"]);
}

#[test]
fn checker_lets_a_frozen_waiter_return_late_by_its_freeze() {
    let waiter = vec![
        ev(
            0,
            0,
            1,
            0,
            "begin",
            "api=with wait=200 bound=0 lease=3000 renew=1 fair=0 lost=abort",
        ),
        ev(1500, 0, 1, 0, "timeout", "waited=1500"),
    ];
    assert_eq!(
        verdict(vec![waiter.clone()], &[]),
        ["timed out on a free key", "waiter overslept"]
    );
    assert!(verdict(vec![waiter], &[frozen(0, 100, 900)]).is_empty());
}

#[test]
fn checker_lets_a_lock_linger_as_long_as_its_backend_may_keep_it() {
    // p1's renewed 3 s hold is told lost at 400 ms (no release); p0's wait
    // times out at `at` ms. Redis: the lock is gone within the lease, so
    // the key was free from 3400 ms, a second of slack: 4400 ms. etcd: the
    // key lives until its etcd lease (TTL 5 s: 1.5 leases, whole seconds)
    // runs out and the 500 ms sweep revokes it: 5900 ms, a second of
    // slack: 6900 ms. ZooKeeper: the node lives until its session (3.75 s:
    // the lease and a quarter) expires, up to 500 ms late: 4650 ms, a
    // second of slack: 5650 ms.
    let run = |backend: Backend, at: u64| {
        let waiter = vec![
            ev(
                0,
                0,
                1,
                0,
                "begin",
                &format!("api=with wait={at} bound=0 lease=3000 renew=1 fair=0 lost=abort"),
            ),
            ev(at, 0, 1, 0, "timeout", &format!("waited={at}")),
        ];
        verdict_on(backend, vec![waiter, hold(1, 10, 100, 400, "lost")], &[])
    };
    assert!(run(Backend::Redis, 4400).is_empty());
    assert_eq!(run(Backend::Redis, 4500), ["timed out on a free key"]);
    assert!(run(Backend::Etcd, 6900).is_empty());
    assert_eq!(run(Backend::Etcd, 7000), ["timed out on a free key"]);
    assert!(run(Backend::ZooKeeper, 5650).is_empty());
    assert_eq!(run(Backend::ZooKeeper, 5750), ["timed out on a free key"]);
}

/// A renewed 3 s hold of key 0 in `mode` (read, write or exclusive) by
/// `call` from `from` to `to` ms, released; its body found the counter at
/// `seen` and at `then` (`None`: logged no data).
fn mode_hold(
    call: u64,
    mode: &str,
    fence: u64,
    (from, to): (u64, u64),
    data: Option<(u64, u64)>,
) -> Vec<String> {
    let mut lines = vec![
        ev(
            from.saturating_sub(1),
            0,
            call,
            0,
            "begin",
            &format!("api=with wait=5000 bound=0 lease=3000 renew=1 fair=0 lost=abort mode={mode}"),
        ),
        ev(
            from,
            0,
            call,
            0,
            "acquired",
            &format!("fence={fence} outer=1 polled={}", from * 1_000_000),
        ),
        ev(from, 0, call, 0, "body_enter", ""),
    ];
    if let Some((seen, then)) = data {
        let wrote = if mode == "read" {
            "-".to_owned()
        } else {
            (then + 1).to_string()
        };
        lines.push(ev(
            to,
            0,
            call,
            0,
            "data",
            &format!("seen={seen} then={then} wrote={wrote}"),
        ));
    }
    lines.push(ev(to, 0, call, 0, "body_exit", "how=done"));
    lines.push(ev(to, 0, call, 0, "released", ""));
    lines
}

#[test]
fn checker_lets_readers_overlap_but_no_writer_beside_anyone() {
    let readers = verdict(
        vec![
            mode_hold(1, "read", 10, (100, 300), None),
            mode_hold(1, "read", 11, (200, 400), None),
            mode_hold(2, "read", 12, (250, 350), None),
        ],
        &[],
    );
    assert!(readers.is_empty(), "{readers:?}");
    for (first, second) in [("read", "write"), ("write", "read"), ("exclusive", "read")] {
        let found = verdict(
            vec![
                mode_hold(1, first, 10, (100, 300), None),
                mode_hold(1, second, 11, (200, 400), None),
            ],
            &[],
        );
        assert_eq!(found, ["two holders at once"], "{first} then {second}");
    }
    // A writer after the readers, and readers after the writer: apart.
    let turns = verdict(
        vec![
            mode_hold(1, "read", 10, (100, 300), None),
            mode_hold(1, "read", 11, (200, 400), None),
            mode_hold(2, "write", 12, (400, 500), None),
            mode_hold(3, "read", 13, (500, 600), None),
        ],
        &[],
    );
    assert!(turns.is_empty(), "{turns:?}");
    // Told lost in time, a reader may be overlapped by a writer.
    let mut told = mode_hold(1, "read", 10, (100, 204), None);
    told.pop();
    told.push(ev(204, 0, 1, 0, "lost", ""));
    let lost_reader = verdict(vec![told, mode_hold(1, "write", 11, (200, 400), None)], &[]);
    assert!(lost_reader.is_empty(), "{lost_reader:?}");
}

#[test]
fn checker_holds_writer_tokens_above_all_earlier_and_reader_tokens_above_earlier_writers() {
    let run = |holds: &[(&str, u64)]| {
        let lines = holds
            .iter()
            .enumerate()
            .flat_map(|(i, &(mode, fence))| {
                let from = 100 + 100 * i as u64;
                mode_hold(i as u64 + 1, mode, fence, (from, from + 50), None)
            })
            .collect();
        verdict(vec![lines], &[])
    };
    // Readers' tokens order nothing among themselves.
    assert!(run(&[("write", 10), ("read", 30), ("read", 20), ("write", 31)]).is_empty());
    // A writer below an earlier reader's token.
    assert_eq!(
        run(&[("write", 10), ("read", 30), ("write", 20)]),
        ["fence went backwards"]
    );
    assert_eq!(
        run(&[("read", 30), ("exclusive", 30)]),
        ["fence went backwards"]
    );
    // A reader below an earlier writer's token.
    assert_eq!(
        run(&[("write", 10), ("write", 20), ("read", 15)]),
        ["fence went backwards"]
    );
}

#[test]
fn checker_sees_the_counter_change_under_a_holder() {
    // Readers beside readers see the counter stand still: no violation.
    let shared = verdict(
        vec![
            mode_hold(1, "read", 10, (100, 300), Some((4, 4))),
            mode_hold(1, "read", 11, (200, 400), Some((4, 4))),
        ],
        &[],
    );
    assert!(shared.is_empty(), "{shared:?}");
    // A writer beside a reader: the reader saw it write.
    let beside = verdict(
        vec![
            mode_hold(1, "read", 10, (100, 300), Some((4, 5))),
            mode_hold(1, "write", 11, (150, 250), Some((4, 4))),
        ],
        &[],
    );
    assert_eq!(
        beside,
        ["data changed under a holder", "two holders at once"]
    );
    // A change with no writer logged inside the body.
    let unlogged = verdict(
        vec![
            mode_hold(1, "read", 10, (100, 300), Some((4, 5))),
            mode_hold(1, "write", 11, (300, 400), Some((5, 5))),
        ],
        &[],
    );
    assert_eq!(unlogged, ["data changed under a holder"]);
    // A stale writer after a restart that lost the lock, told within its
    // bound: the change is excused, as the overlap is.
    let mut stale_writer = mode_hold(1, "write", 10, (100, 1600), Some((4, 4)));
    stale_writer.pop();
    stale_writer.push(ev(1600, 0, 1, 0, "lost", ""));
    let excused = verdict(
        vec![
            stale_writer,
            mode_hold(1, "read", 11, (200, 1700), Some((4, 5))),
        ],
        &[restart_at(150)],
    );
    assert!(excused.is_empty(), "{excused:?}");
}

#[test]
fn checker_lets_sibling_readers_share_but_not_a_sibling_writer() {
    let nested = |call: u64, mode: &str, from: u64, to: u64| {
        vec![
            ev(
                from,
                0,
                call,
                1,
                "begin",
                &format!(
                    "api=with wait=5000 bound=0 lease=3000 renew=1 fair=0 lost=abort mode={mode}"
                ),
            ),
            ev(from, 0, call, 1, "acquired", "fence=10 outer=0"),
            ev(from, 0, call, 1, "body_enter", ""),
            ev(to, 0, call, 1, "body_exit", "how=done"),
            ev(to, 0, call, 1, "released", ""),
        ]
    };
    let mut readers = mode_hold(1, "write", 10, (100, 500), None);
    readers.extend(nested(2, "read", 200, 300));
    readers.extend(nested(3, "read", 250, 350));
    assert!(verdict(vec![readers], &[]).is_empty());
    let mut with_a_writer = mode_hold(1, "write", 10, (100, 500), None);
    with_a_writer.extend(nested(2, "read", 200, 300));
    with_a_writer.extend(nested(3, "write", 250, 350));
    assert_eq!(
        verdict(vec![with_a_writer], &[]),
        ["a writer beside a sibling's reader"]
    );
    // A write nested in one read sibling (re-entering the outer write
    // hold) while the other read sibling is inside: the same.
    let mut nested_writer = mode_hold(1, "write", 10, (100, 500), None);
    nested_writer.extend(nested(2, "read", 200, 400));
    nested_writer.extend(nested(3, "read", 210, 350));
    let mut inner = nested(4, "write", 220, 300);
    for line in &mut inner {
        *line = line.replacen(" 4 1 ", " 4 3 ", 1);
    }
    nested_writer.extend(inner);
    assert_eq!(
        verdict(vec![nested_writer], &[]),
        ["a writer beside a sibling's reader"]
    );
}

#[test]
fn checker_sees_an_upgrade_that_is_not_refused_at_once() {
    // Call 2 asks a write hold inside call 1's read hold of the key.
    let upgrade = |end: Vec<String>| {
        let mut lines = mode_hold(1, "read", 10, (100, 1000), None);
        lines.push(ev(
            200,
            0,
            2,
            1,
            "begin",
            "api=with wait=5000 bound=0 lease=3000 renew=1 fair=0 lost=abort mode=write",
        ));
        lines.extend(end);
        verdict(vec![lines], &[])
    };
    assert!(upgrade(vec![ev(201, 0, 2, 1, "error", "what=upgrade_refused")]).is_empty());
    // Ended at once by its runtime's shutdown: no verdict.
    assert!(upgrade(vec![ev(201, 0, 2, 1, "error", "what=shut_down")]).is_empty());
    assert_eq!(
        upgrade(vec![ev(900, 0, 2, 1, "error", "what=upgrade_refused")]),
        ["upgrade not refused at once"]
    );
    assert_eq!(
        upgrade(vec![ev(900, 0, 2, 1, "timeout", "waited=700")]),
        ["upgrade not refused at once"]
    );
    assert_eq!(
        upgrade(vec![
            ev(201, 0, 2, 1, "acquired", "fence=10 outer=0"),
            ev(201, 0, 2, 1, "body_enter", ""),
            ev(300, 0, 2, 1, "body_exit", "how=done"),
            ev(300, 0, 2, 1, "released", ""),
        ]),
        ["upgrade not refused at once"]
    );
    // Inside a write hold (a writer may read, and re-enter): no upgrade.
    let mut in_a_writer = mode_hold(1, "write", 10, (100, 1000), None);
    in_a_writer.push(ev(
        200,
        0,
        2,
        1,
        "begin",
        "api=with wait=5000 bound=0 lease=3000 renew=1 fair=0 lost=abort mode=write",
    ));
    in_a_writer.push(ev(201, 0, 2, 1, "acquired", "fence=10 outer=0"));
    in_a_writer.push(ev(300, 0, 2, 1, "released", ""));
    assert!(verdict(vec![in_a_writer], &[]).is_empty());
}

#[test]
fn checker_sees_an_answer_from_before_an_empty_restart_entered_after_it() {
    // p0's executor is blocked from 101 to 900 ms right after its acquire
    // went out (answered at once, token 20 on the old server); the server
    // restarts empty at 200 ms, p1 takes the key on the new server at 400
    // ms (token 30); p0 runs again and enters at 900 ms on the old answer.
    // The stall excuses nothing: the stalled holder is the later one.
    let stale = |p1_until: u64| {
        verdict(
            vec![
                vec![
                    "stalled_after_send 7 101000000 0".to_owned(),
                    "stall 7 101000000 900000000 sleep".to_owned(),
                ]
                .into_iter()
                .chain(polled_hold(1, 20, 900, 900, 1000, "released"))
                .collect(),
                hold(1, 30, 400, p1_until, "released"),
            ],
            &[restart_at(200), frozen(0, 101, 900)],
        )
    };
    assert_eq!(stale(950), ["fence went backwards", "two holders at once"]);
    assert_eq!(stale(850), ["fence went backwards"]);
}

/// `shutdown <n> <from> <to> ok|err` of a process's runtime, at ms.
fn shutdown(from: u64, to: u64, confirmed: bool) -> String {
    format!(
        "shutdown 3 {} {} {}",
        from * 1_000_000,
        to * 1_000_000,
        if confirmed { "ok" } else { "err" }
    )
}

#[test]
fn checker_ends_a_process_s_holds_when_its_runtime_s_shutdown_returns() {
    // p0 holds from 100 ms and logs nothing more (its body goes on); its
    // runtime's shutdown runs from 300 to 350 ms, then a new runtime
    // follows. p1 enters at `at` ms.
    let run = |at: u64| {
        let mut p0 = hold(1, 10, 100, 100, "body_enter");
        p0.push(shutdown(300, 350, true));
        p0.push("runtime 0123456789abcdef".to_owned());
        verdict(vec![p0, hold(1, 11, at, at + 100, "released")], &[])
    };
    assert!(run(360).is_empty(), "{:?}", run(360));
    assert_eq!(run(340), ["two holders at once"]);
    // A hold entered after the shutdown is the new runtime's: the shutdown
    // does not end it.
    let mut p0 = hold(1, 10, 400, 400, "body_enter");
    p0.insert(0, shutdown(300, 350, true));
    assert_eq!(
        verdict(vec![p0, hold(1, 11, 500, 600, "released")], &[]),
        ["two holders at once"]
    );
}

#[test]
fn checker_lets_a_lock_linger_after_a_shutdown_that_did_not_confirm_its_release() {
    // p1's renewed 3 s hold ends with its runtime's shutdown at 400 ms; p0's
    // wait times out at 2000 ms, the key free since then. Confirmed: free
    // from 400 ms, over a second before the timeout. Not confirmed: the
    // lock may live for its lease.
    let run = |confirmed: bool| {
        let waiter = vec![
            ev(
                0,
                0,
                1,
                0,
                "begin",
                "api=with wait=2000 bound=0 lease=3000 renew=1 fair=0 lost=abort",
            ),
            ev(2000, 0, 1, 0, "timeout", "waited=2000"),
        ];
        let mut holder = hold(1, 10, 100, 100, "body_enter");
        holder.push(shutdown(380, 400, confirmed));
        verdict(vec![waiter, holder], &[])
    };
    assert_eq!(run(true), ["timed out on a free key"]);
    assert!(run(false).is_empty(), "{:?}", run(false));
}

#[test]
fn checker_excuses_a_late_tell_of_a_fixed_lease_only_as_late_as_its_executor_ran() {
    // p0 holds with a fixed 3 s lease from a poll at 100 ms (its lease ends
    // by 3100 ms) and is told lost at 3106 ms; p1 enters at 3100 ms. A plain
    // timer of p0's executor for 3100 ms fired at `timer` ms (None: not
    // before the tell).
    let run = |timer: Option<u64>| {
        let lost = match timer {
            Some(t) => format!("lease_timer={}", t * 1_000_000),
            None => String::new(),
        };
        let fixed = vec![
            ev(
                99,
                0,
                1,
                0,
                "begin",
                "api=with wait=5000 bound=0 lease=3000 renew=0 fair=0 lost=abort",
            ),
            ev(
                100,
                0,
                1,
                0,
                "acquired",
                "fence=10 outer=1 polled=100000000",
            ),
            ev(100, 0, 1, 0, "body_enter", ""),
            ev(3106, 0, 1, 0, "lost", &lost),
        ];
        verdict(vec![fixed, hold(1, 11, 3100, 3300, "released")], &[])
    };
    assert_eq!(run(None), ["holder told lost too late"]);
    // Its executor ran nothing that fell due for 4 ms: told as it ran.
    assert!(run(Some(3104)).is_empty(), "{:?}", run(Some(3104)));
    // Its executor ran on time: the tell was late.
    assert_eq!(run(Some(3100)), ["holder told lost too late"]);
}

#[test]
fn checker_sees_a_write_hold_that_the_backend_records_as_a_read() {
    // p0's write hold (token 10) from 100 to 400 ms; its record in the
    // backend, asked at 120 ms, says `own`.
    let run = |own: &str, at: u64| {
        let mut lines = mode_hold(1, "write", 10, (100, 400), None);
        lines.push(ev(at, 0, 1, 0, "recorded", &format!("mode=read own={own}")));
        verdict(vec![lines], &[])
    };
    assert_eq!(run("reader", 120), ["write hold recorded as a read"]);
    assert!(run("writer", 120).is_empty());
    // Seen after the hold ended (told lost, released): no verdict.
    assert!(run("reader", 500).is_empty());
}
