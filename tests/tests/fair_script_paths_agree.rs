//! `fair.lua` runs the uncontended acquire (read or write) and the last
//! release of a write hold with nobody queued before it makes its helper
//! closures (ARCHITECTURE.md, "Script fast paths equal the general path").
//! The promise: in every state, the script with its fast paths answers and
//! writes exactly what its general path alone does.
//!
//! Checked on a real redis-server by running each operation twice from the
//! same state: once through the script as shipped, once through the script
//! with its fast paths cut out (the lines between `local op = ARGV[1]` and
//! the general path's first line, `local window = …`), and comparing the
//! replies, the four keys afterwards (contents and TTLs) and what was
//! published. Both runs see one server clock: a preamble answers `TIME`
//! from a key the test sets (the state's expiries are written against it),
//! and records every publish. The states: every combination of a lock hash
//! (absent, write holds of ours and another's, with and without the
//! `fence` field of an older runtime, re-entered, without TTL, read holds
//! with live and expired readers, a key of the wrong type), a fence
//! counter (absent, behind or ahead of the clock, with and without TTL,
//! not a number) and a queue (absent, entries without a list, live, dead,
//! older-form and reader entries, ours queued), under each operation.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use lock_testkit::RedisServer;
use redis::{Connection, Value};

/// The script as the runtime ships it.
const FAIR: &str = include_str!("../../lock-runtime/src/scripts/fair.lua");

const LOCK: &str = "fp:{k}";
const FENCE: &str = "fp:{k}:fence";
const QUEUE: &str = "fp:{k}:queue";
const QUEUED: &str = "fp:{k}:queued";
const CHANNEL: &str = "fp:{k}:released";
/// The server time both runs of a case see: a hash `s` -> seconds, `us`
/// -> microseconds, as `TIME` answers.
const CLOCK: &str = "fp:clock";
/// Every message the script published, as "<channel> <message>".
const PUBLISHED: &str = "fp:published";
/// The commands the script ran, by name (to tell which path it took).
const COMMANDS: &str = "fp:commands";

/// Our holder id (the one acquiring, releasing, downgrading).
const H: &str = "p:1";
/// Another process's writer.
const O: &str = "p:2";
/// Another process's reader.
const R: &str = "p:3";
/// A queued holder whose entry ran out.
const D: &str = "p:4";

/// `fair.lua` without its fast paths: what runs when no fast path applies.
fn general_path_only() -> String {
    let lines: Vec<&str> = FAIR.lines().collect();
    let op = lines
        .iter()
        .position(|l| l.starts_with("local op = ARGV[1]"))
        .expect("fair.lua: no `local op = ARGV[1]` line (update this test)");
    let general = lines
        .iter()
        .position(|l| l.starts_with("local window ="))
        .expect("fair.lua: no `local window =` line (update this test)");
    assert!(op < general, "fair.lua: `local window` before `local op`");
    let mut kept: Vec<&str> = lines[..=op].to_vec();
    kept.extend_from_slice(&lines[general..]);
    kept.join("\n")
}

/// `script` behind a preamble: `TIME` answers [`CLOCK`], each publish is
/// also recorded in [`PUBLISHED`], each command's name in [`COMMANDS`]. (A
/// local `redis` shadows the global for the whole chunk; inside the
/// preamble's own function the global is still the one called.)
fn with_fixed_clock(script: &str) -> String {
    let preamble = format!(
        "local redis = setmetatable({{ call = function(command, ...)
  local name = string.lower(command)
  redis.call('rpush', '{COMMANDS}', name)
  if name == 'time' then
    return redis.call('hmget', '{CLOCK}', 's', 'us')
  end
  if name == 'publish' or name == 'spublish' then
    local channel, message = ...
    redis.call('rpush', '{PUBLISHED}', channel .. ' ' .. message)
  end
  return redis.call(command, ...)
end }}, {{ __index = redis }})
"
    );
    format!("{preamble}{script}")
}

/// The server clock of one case.
#[derive(Clone, Copy)]
struct Now {
    us: u64,
}

impl Now {
    fn ms(self) -> u64 {
        self.us / 1000
    }
}

type Setup = fn(Now) -> Vec<redis::Cmd>;

fn cmd(args: &[&str]) -> redis::Cmd {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c
}

/// A live queue entry (`<expiry>:<lease>:<reserve>`, `:r` for a reader).
fn entry(now: Now, tail: &str) -> String {
    format!("{}:3000{tail}", now.ms() + 3000)
}

/// A read hold's fields for `reader`, its lease ending `ends`.
fn reader(reader: &str, ends: u64, token: u64) -> Vec<String> {
    vec![
        reader.to_owned(),
        "1".to_owned(),
        format!("x:{reader}"),
        ends.to_string(),
        format!("f:{reader}"),
        token.to_string(),
    ]
}

fn hset(fields: &[String]) -> redis::Cmd {
    let mut c = redis::cmd("HSET");
    c.arg(LOCK).arg(fields);
    c
}

/// The lock hash states: name, whether it is absent, whether it is the
/// last frame of our write hold (the release fast path's case), setup.
fn lock_states() -> Vec<(&'static str, bool, bool, Setup)> {
    vec![
        ("absent", true, false, |_| vec![]),
        ("write hold of ours", false, true, |n| {
            vec![
                cmd(&["HSET", LOCK, H, "1", "fence", &(n.us - 1000).to_string()]),
                cmd(&["PEXPIRE", LOCK, "30000"]),
            ]
        }),
        (
            "write hold of ours, no 'fence' (older runtime)",
            false,
            true,
            |_| {
                vec![
                    cmd(&["HSET", LOCK, H, "1"]),
                    cmd(&["PEXPIRE", LOCK, "30000"]),
                ]
            },
        ),
        (
            "write hold of ours, handed over (short claim)",
            false,
            true,
            |n| {
                vec![
                    cmd(&["HSET", LOCK, H, "1", "fence", &(n.us - 1000).to_string()]),
                    cmd(&["PEXPIRE", LOCK, "3000"]),
                ]
            },
        ),
        ("write hold of ours, no TTL", false, true, |n| {
            vec![cmd(&[
                "HSET",
                LOCK,
                H,
                "1",
                "fence",
                &(n.us - 1000).to_string(),
            ])]
        }),
        ("write hold of ours, entered twice", false, false, |n| {
            vec![
                cmd(&["HSET", LOCK, H, "2", "fence", &(n.us - 1000).to_string()]),
                cmd(&["PEXPIRE", LOCK, "30000"]),
            ]
        }),
        ("write hold of another", false, false, |n| {
            vec![
                cmd(&["HSET", LOCK, O, "1", "fence", &(n.us - 1000).to_string()]),
                cmd(&["PEXPIRE", LOCK, "30000"]),
            ]
        }),
        ("read hold of ours", false, false, |n| {
            let mut f = vec!["mode".to_owned(), "r".to_owned()];
            f.extend(reader(H, n.ms() + 30000, n.us - 1000));
            vec![hset(&f), cmd(&["PEXPIRE", LOCK, "30000"])]
        }),
        ("read hold of ours, entered twice", false, false, |n| {
            let mut f = vec!["mode".to_owned(), "r".to_owned()];
            f.extend(reader(H, n.ms() + 30000, n.us - 1000));
            f[3] = "2".to_owned();
            vec![hset(&f), cmd(&["PEXPIRE", LOCK, "30000"])]
        }),
        ("read hold of ours and another reader", false, false, |n| {
            let mut f = vec!["mode".to_owned(), "r".to_owned()];
            f.extend(reader(H, n.ms() + 30000, n.us - 1000));
            f.extend(reader(R, n.ms() + 20000, n.us - 500));
            vec![hset(&f), cmd(&["PEXPIRE", LOCK, "30000"])]
        }),
        (
            "read hold of ours, expired; another reader live",
            false,
            false,
            |n| {
                let mut f = vec!["mode".to_owned(), "r".to_owned()];
                f.extend(reader(H, n.ms() - 10, n.us - 1000));
                f.extend(reader(R, n.ms() + 20000, n.us - 500));
                vec![hset(&f), cmd(&["PEXPIRE", LOCK, "20000"])]
            },
        ),
        ("read hold of ours, expired, alone", false, false, |n| {
            let mut f = vec!["mode".to_owned(), "r".to_owned()];
            f.extend(reader(H, n.ms() - 10, n.us - 1000));
            vec![hset(&f), cmd(&["PEXPIRE", LOCK, "20000"])]
        }),
        ("read hold of another, expired", false, false, |n| {
            let mut f = vec!["mode".to_owned(), "r".to_owned()];
            f.extend(reader(R, n.ms() - 10, n.us - 1000));
            vec![hset(&f), cmd(&["PEXPIRE", LOCK, "20000"])]
        }),
        (
            "mode 'r' and our count 1, no lease field",
            false,
            false,
            |_| vec![cmd(&["HSET", LOCK, "mode", "r", H, "1"])],
        ),
        ("a string, not a hash", false, false, |_| {
            vec![cmd(&["SET", LOCK, "x", "PX", "30000"])]
        }),
    ]
}

/// The fence counter states.
fn fence_states() -> Vec<(&'static str, Setup)> {
    vec![
        ("absent", |_| vec![]),
        ("behind the clock", |n| {
            vec![cmd(&[
                "SET",
                FENCE,
                &(n.us - 5_000_000).to_string(),
                "PX",
                "1000",
            ])]
        }),
        ("ahead of the clock", |n| {
            let ahead = n.us + 1_000_000_000;
            vec![cmd(&["SET", FENCE, &ahead.to_string(), "PX", "1000"])]
        }),
        ("behind the clock, no TTL (older runtime)", |n| {
            vec![cmd(&["SET", FENCE, &(n.us - 5_000_000).to_string()])]
        }),
        ("ahead of the clock, no TTL (older runtime)", |n| {
            vec![cmd(&["SET", FENCE, &(n.us + 1_000_000_000).to_string()])]
        }),
        ("not a number", |_| {
            vec![cmd(&["SET", FENCE, "x", "PX", "1000"])]
        }),
    ]
}

/// The queue states: name, whether the queue list is absent, setup.
fn queue_states() -> Vec<(&'static str, bool, Setup)> {
    fn queued(ids: &[&str], entries: &[(&str, String)]) -> Vec<redis::Cmd> {
        let mut out = Vec::new();
        if !ids.is_empty() {
            let mut push = redis::cmd("RPUSH");
            push.arg(QUEUE).arg(ids);
            out.push(push);
            out.push(cmd(&["PEXPIRE", QUEUE, "3000"]));
        }
        if !entries.is_empty() {
            let mut set = redis::cmd("HSET");
            set.arg(QUEUED);
            for (id, e) in entries {
                set.arg(*id).arg(e);
            }
            out.push(set);
            out.push(cmd(&["PEXPIRE", QUEUED, "3000"]));
        }
        out
    }
    vec![
        ("absent", true, |_| vec![]),
        ("entries left, no list", true, |n| {
            queued(&[], &[(H, entry(n, ":0")), (O, entry(n, ":0"))])
        }),
        ("a writer", false, |n| queued(&[O], &[(O, entry(n, ":4"))])),
        ("a writer, older entry form", false, |n| {
            queued(&[O], &[(O, entry(n, ""))])
        }),
        ("a writer whose entry ran out", false, |n| {
            queued(&[O], &[(O, format!("{}:3000:0", n.ms() - 10))])
        }),
        ("a writer without entry", false, |_| queued(&[O], &[])),
        ("ours, as a writer", false, |n| {
            queued(&[H], &[(H, entry(n, ":0"))])
        }),
        ("ours, as a reader", false, |n| {
            queued(&[H], &[(H, entry(n, ":0:r"))])
        }),
        ("a reader", false, |n| {
            queued(&[R], &[(R, entry(n, ":0:r"))])
        }),
        ("dead, reader, writer, ours", false, |n| {
            queued(
                &[D, R, O, H],
                &[
                    (D, format!("{}:3000:0", n.ms() - 10)),
                    (R, entry(n, ":0:r")),
                    (O, entry(n, ":2")),
                    (H, entry(n, ":0")),
                ],
            )
        }),
    ]
}

/// The operations: name, which fast path may take it ('a' acquire, 'r'
/// release of `H`, ' ' none), ARGV.
fn operations() -> Vec<(&'static str, char, Vec<&'static str>)> {
    let acquire = |join, reserve: Option<&'static str>, mode: Option<&'static str>| {
        let mut args = vec!["acquire", H, "30000", join, "3000", CHANNEL, "3000", "1000"];
        args.extend(reserve);
        args.extend(mode);
        args
    };
    vec![
        ("acquire write, once", 'a', acquire("0", Some("0"), None)),
        (
            "acquire write, queueing, 5 reserved",
            'a',
            acquire("1", Some("5"), None),
        ),
        (
            "acquire write, no reserve argument",
            'a',
            acquire("1", None, None),
        ),
        ("acquire read", 'a', acquire("1", Some("0"), Some("r"))),
        (
            "acquire read, once",
            'a',
            acquire("0", Some("0"), Some("r")),
        ),
        ("release ours", 'r', vec!["release", H, CHANNEL, "1000"]),
        (
            "release another's",
            ' ',
            vec!["release", O, CHANNEL, "1000"],
        ),
        (
            "release a reader's",
            ' ',
            vec!["release", R, CHANNEL, "1000"],
        ),
        ("downgrade ours", ' ', vec!["downgrade", H, CHANNEL, "1000"]),
    ]
}

/// One key afterwards: its type, contents (a hash sorted by field) and
/// PTTL.
#[derive(Debug)]
struct KeyAfter {
    name: &'static str,
    kind: String,
    contents: Vec<String>,
    pttl: i64,
}

/// What one run left: the reply, the keys, the messages, and the commands
/// it ran.
#[derive(Debug)]
struct Outcome {
    reply: Reply,
    keys: Vec<KeyAfter>,
    published: Vec<String>,
    commands: Vec<String>,
    /// How long the run took, from its setup to its last read (ms, rounded
    /// up).
    took_ms: i64,
}

impl Outcome {
    /// Equal but for what hangs on the real clock of the server, which
    /// moves on while a run sets up, runs and reads: TTLs, the TTL a busy
    /// reply carries, and (`lease_ends_from_ttl`, a downgrade, which counts
    /// the new read lease from the hash's TTL) the readers' lease ends; each
    /// within the longer of the two runs. Not compared: the commands run.
    fn agrees_with(&self, other: &Outcome, lease_ends_from_ttl: bool) -> bool {
        let slack = self.took_ms.max(other.took_ms) + 1;
        let near = |a: i64, b: i64| (a - b).abs() <= slack;
        let replies = match (&self.reply, &other.reply) {
            (Reply::Ints(a), Reply::Ints(b)) if a.len() == 2 && a[0] == 0 && b.len() == 2 => {
                b[0] == 0 && (a[1] == b[1] || (a[1] >= 0 && b[1] >= 0 && near(a[1], b[1])))
            }
            (a, b) => a == b,
        };
        let field = |a: &String, b: &String| {
            a == b
                || (lease_ends_from_ttl
                    && a.starts_with("x:")
                    && match (a.split_once('='), b.split_once('=')) {
                        (Some((fa, va)), Some((fb, vb))) => {
                            fa == fb
                                && matches!((va.parse(), vb.parse()), (Ok(x), Ok(y)) if near(x, y))
                        }
                        _ => false,
                    })
        };
        replies
            && self.published == other.published
            && self.keys.len() == other.keys.len()
            && self.keys.iter().zip(&other.keys).all(|(a, b)| {
                a.name == b.name
                    && a.kind == b.kind
                    && a.contents.len() == b.contents.len()
                    && a.contents.iter().zip(&b.contents).all(|(x, y)| field(x, y))
                    && (a.pttl == b.pttl || (a.pttl >= 0 && b.pttl >= 0 && near(a.pttl, b.pttl)))
            })
    }
}

/// A script's reply: integers (every reply of `fair.lua` but errors), or
/// its text.
#[derive(Debug, PartialEq)]
enum Reply {
    Ints(Vec<i64>),
    Other(String),
}

fn reply_of(reply: redis::RedisResult<Value>) -> Reply {
    let text = match reply {
        Ok(Value::Int(n)) => return Reply::Ints(vec![n]),
        Ok(Value::Array(items)) if items.iter().all(|i| matches!(i, Value::Int(_))) => {
            let ints = items.iter().map(|i| match i {
                Value::Int(n) => *n,
                _ => unreachable!(),
            });
            return Reply::Ints(ints.collect());
        }
        Ok(value) => format!("{value:?}"),
        // The text of a Lua error names the script's line and SHA, which
        // differ between the two scripts: its kind and code then.
        Err(e) => match e.detail() {
            Some(detail) if !detail.contains("script") => {
                format!("error {:?} {:?}: {detail}", e.kind(), e.code())
            }
            _ => format!("error {:?} {:?}", e.kind(), e.code()),
        },
    };
    Reply::Other(text)
}

/// Reads every key a run may have written, in one call: per key its type,
/// contents (a hash as field, value, ...) and PTTL.
const DUMP: &str = "local out = {}
for _, k in ipairs(KEYS) do
  local kind = redis.call('type', k)['ok']
  local contents = {}
  if kind == 'hash' then
    contents = redis.call('hgetall', k)
  elseif kind == 'list' then
    contents = redis.call('lrange', k, 0, -1)
  elseif kind == 'string' then
    contents = {redis.call('get', k)}
  end
  table.insert(out, {kind, contents, redis.call('pttl', k)})
end
return out";

/// The scripts of one comparison, loaded: the shipped one, its general
/// path alone, and [`DUMP`].
struct Shas {
    shipped: String,
    general: String,
    dump: String,
}

/// Sets up the state, runs `sha` with `args`, and reads what it left.
fn run(
    con: &mut Connection,
    sha: &str,
    dump: &str,
    now: Now,
    setup: &[Setup],
    args: &[&str],
) -> Outcome {
    let started = std::time::Instant::now();
    let mut pipe = redis::pipe();
    pipe.cmd("DEL")
        .arg(&[LOCK, FENCE, QUEUE, QUEUED, PUBLISHED, COMMANDS])
        .ignore();
    pipe.cmd("HSET")
        .arg(CLOCK)
        .arg("s")
        .arg(now.us / 1_000_000)
        .arg("us")
        .arg(now.us % 1_000_000)
        .ignore();
    for part in setup {
        for c in part(now) {
            pipe.add_command(c).ignore();
        }
    }
    let () = pipe.query(con).unwrap();
    let reply = redis::cmd("EVALSHA")
        .arg(sha)
        .arg(4)
        .arg(&[LOCK, FENCE, QUEUE, QUEUED])
        .arg(args)
        .query::<Value>(con);
    let names = [LOCK, FENCE, QUEUE, QUEUED, PUBLISHED, COMMANDS];
    let dumped: Vec<(String, Vec<String>, i64)> = redis::cmd("EVALSHA")
        .arg(dump)
        .arg(names.len())
        .arg(&names)
        .query(con)
        .unwrap();
    let mut keys: Vec<KeyAfter> = names
        .into_iter()
        .zip(dumped)
        .map(|(name, (kind, contents, pttl))| {
            let contents = if kind == "hash" {
                let mut fields: Vec<String> =
                    contents.chunks(2).map(|pair| pair.join("=")).collect();
                fields.sort();
                fields
            } else {
                contents
            };
            KeyAfter {
                name,
                kind,
                contents,
                pttl,
            }
        })
        .collect();
    let commands = keys.pop().unwrap().contents;
    let published = keys.pop().unwrap().contents;
    Outcome {
        reply: reply_of(reply),
        keys,
        published,
        commands,
        took_ms: i64::try_from(started.elapsed().as_millis()).unwrap() + 1,
    }
}

/// Every combination of lock hash, fence counter and queue, under every
/// operation: the script as shipped and its general path alone agree, and
/// the fast paths were taken where they apply (the commands they run
/// differ from the general path's).
#[test]
fn fair_script_fast_paths_do_what_its_general_path_does_in_every_state() {
    let server = RedisServer::start();
    let mut con = server.client().get_connection().unwrap();
    // (Bounded: a server that stops answering fails the test.)
    con.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let general = general_path_only();
    assert!(
        general.len() < FAIR.len(),
        "fair.lua has no fast paths between `local op` and `local window` any more"
    );
    let load = |con: &mut Connection, source: &str| -> String {
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(with_fixed_clock(source))
            .query(con)
            .unwrap()
    };
    let shas = Shas {
        shipped: load(&mut con, FAIR),
        general: load(&mut con, &general),
        dump: redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(DUMP)
            .query(&mut con)
            .unwrap(),
    };

    let (mut cases, mut fast_taken, mut disagreements) = (0usize, 0usize, Vec::new());
    for (lock, lock_absent, our_last_frame, lock_setup) in lock_states() {
        for (fence, fence_setup) in fence_states() {
            for (queue, no_list, queue_setup) in queue_states() {
                for (op, fast, args) in operations() {
                    let (s, us): (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
                    let now = Now {
                        us: s * 1_000_000 + us,
                    };
                    let setup = [lock_setup, fence_setup, queue_setup];
                    let with_fast = run(&mut con, &shas.shipped, &shas.dump, now, &setup, &args);
                    let without = run(&mut con, &shas.general, &shas.dump, now, &setup, &args);
                    cases += 1;
                    let applies = no_list
                        && match fast {
                            'a' => lock_absent,
                            'r' => our_last_frame,
                            _ => false,
                        };
                    if applies && with_fast.commands != without.commands {
                        fast_taken += 1;
                    }
                    if !with_fast.agrees_with(&without, args[0] == "downgrade") {
                        disagreements.push(format!(
                            "lock: {lock}; fence: {fence}; queue: {queue}; {op}:\n  \
                             with the fast paths: {with_fast:?}\n  general path only: {without:?}"
                        ));
                    }
                }
            }
        }
    }
    assert!(
        disagreements.is_empty(),
        "{} of {cases} states disagree; the first ones:\n{}",
        disagreements.len(),
        disagreements
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    // Where a fast path applies it was taken (one case per fence counter
    // and operation: an absent lock and queue for acquires, each last frame
    // of our write hold with no queue list for our release).
    let expected = {
        let locks = lock_states();
        let queues_without_list = queue_states().iter().filter(|q| q.1).count();
        let fences = fence_states().len();
        let ops = operations();
        let acquires = ops.iter().filter(|o| o.1 == 'a').count();
        let releases = ops.iter().filter(|o| o.1 == 'r').count();
        let absent = locks.iter().filter(|l| l.1).count();
        let last_frames = locks.iter().filter(|l| l.2).count();
        queues_without_list * fences * (absent * acquires + last_frames * releases)
    };
    assert_eq!(
        fast_taken, expected,
        "the fast paths were not taken where they apply ({cases} states)"
    );
}
