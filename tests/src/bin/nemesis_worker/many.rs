//! The worker's multi-key calls: a top-level call on a random pair of the
//! run's keys but its permit keys (`lock_many`; permits and key lists do
//! not combine), taken all or none in sorted order, by
//! `with_locks`, `acquire()` or `try_acquire()`, with the same random
//! options and cancellation cuts as a single-key call ([`Plan`]).
//!
//! A multi-key call is logged as one call per key (a record of its own,
//! with its own call id), each record's `begin` marked `many=<id>` (the
//! first key's record id, the same on every record of the call): the
//! checker's per-key promises (exclusion, data, tokens, waiting) then cover
//! each key's hold as they cover a single-key hold, and the checker sees
//! which holds were taken together. Each key's hold reads (and a writer
//! writes) that key's counter in the body.
//!
//! Entry times: the last key (in sorted order) is handed over in the poll
//! that enters the body, as a single-key hold is; the keys before it were
//! handed over in some earlier poll, so their `polled` is when the call
//! began (the earliest their entry can have happened) and their
//! `lease_from` the poll that entered the body (the latest their lease can
//! have started counting, for the lease timer).
//!
//! The body's nested calls: a re-entry of one of its keys (now and then two
//! `join!` siblings), a key sorting past both (waited for as usual), and a
//! key sorting before one of them and not held, which must be refused at
//! once (`OrderRefused`, logged `error what=order_refused`).

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use lock_runtime::{fences, with_locks, LockError, LockGuard, LockMode, ManyGuard, OnLost};

use super::{
    call, call_as, finish_error, hold, now_ns, one_word, recorded, within, Api, BodyError,
    BodyExit, Boxed, Ctx, Cx, Data, End, Frame, Phase, Plan, Rec, Rng, Stamped, PANIC_PAYLOAD,
};

/// One key of a multi-key call: its index and its record.
struct Part {
    key: usize,
    rec: Arc<Rec>,
}

/// A key's hold inside the body: what its body logs and reads.
struct Held {
    part: usize,
    token: u64,
    data: Option<Data>,
    exit: BodyExit,
    told: bool,
}

/// One multi-key call on a random pair of the run's keys, logged from
/// `begin` to its final event on each key's record; nested calls inside
/// its body.
pub(super) fn many_call(cx: Cx, mut rng: Rng) -> Boxed {
    Box::pin(async move {
        let ctx = cx.ctx.clone();
        // Never a permit key: permits and key lists do not combine.
        let plain = ordinary_keys(&ctx);
        let count = plain.len();
        let a = rng.below(count as u64) as usize;
        let b = (a + 1 + rng.below(count as u64 - 1) as usize) % count;
        // In the order they are taken: sorted by name.
        let mut keys = [plain[a], plain[b]];
        keys.sort_by(|&x, &y| ctx.keys[x].name.cmp(&ctx.keys[y].name));
        // A read pair only when both keys are read-write keys.
        let readers = keys.iter().map(|&k| ctx.keys[k].readers).min().unwrap_or(0);
        let plan = Plan::random(&mut rng, false, false, readers);
        // One fair flag for both keys: either key's, at random.
        let fair = ctx.keys[keys[rng.below(2) as usize]].fair;
        let first = ctx.next_call.fetch_add(1, Ordering::Relaxed);
        let parts: Vec<Part> = keys
            .iter()
            .enumerate()
            .map(|(i, &key)| Part {
                key,
                rec: Arc::new(Rec::new(
                    &cx,
                    if i == 0 {
                        first
                    } else {
                        ctx.next_call.fetch_add(1, Ordering::Relaxed)
                    },
                    key,
                    None,
                )),
            })
            .collect();
        let names: Vec<&str> = keys.iter().map(|&k| ctx.keys[k].name.as_str()).collect();
        let mut request = cx
            .runtime
            .lock_many(names.iter().copied())
            .lease(plan.lease)
            .watchdog(plan.renew)
            .fair(fair)
            .mode(plan.mode)
            .on_lost(plan.on_lost);
        request = match plan.wait {
            Some(wait) => request.wait(wait),
            None => request.wait_forever(),
        };
        let marks = format!(
            "{} many={first} keys={}",
            plan.describe(fair),
            keys.map(|k| k.to_string()).join(",")
        );
        for part in &parts {
            part.rec.emit("begin", &marks);
        }
        // The earliest any key can have been handed over.
        let began = now_ns();
        let polled = Arc::new(AtomicU64::new(0));
        let parts = Arc::new(parts);
        match plan.api {
            Api::With => {
                let body = many_body(
                    cx.clone(),
                    rng.fork(),
                    parts.clone(),
                    (began, polled.clone()),
                    &plan,
                );
                let locked = Stamped::new(with_locks(request, body), polled.clone());
                let outcome = match plan.acquire_limit() {
                    Some(limit) => match tokio::time::timeout(limit, locked).await {
                        Ok(outcome) => outcome,
                        Err(_) => return, // the records log `cancelled`
                    },
                    None => locked.await,
                };
                match outcome {
                    Ok(()) | Err(BodyError::User) => {}
                    Err(BodyError::Lock(LockError::Lost { key })) => {
                        for part in parts.iter() {
                            let rec = &part.rec;
                            let phase = *rec.phase.lock().unwrap();
                            if phase == Phase::Done {
                                rec.emit("late_lost", "");
                            } else if phase == Phase::Asking {
                                // Lost before the body: nothing entered.
                                rec.finish("error", "what=lost_before_entry");
                            } else if ctx.keys[part.key].name == key {
                                rec.finish("lost", "");
                            } else {
                                // Given back with the lost one.
                                rec.finish("released", "dropped=1");
                            }
                        }
                    }
                    Err(BodyError::Lock(e)) => finish_all(&cx, &parts, &e),
                }
            }
            Api::Guard | Api::Try => {
                many_guarded(cx, rng, (parts, began, polled), &plan, request).await;
            }
        }
    })
}

/// The keys a multi-key call may take: every key but the permit keys.
pub(super) fn ordinary_keys(ctx: &Ctx) -> Vec<usize> {
    (0..ctx.keys.len())
        .filter(|&k| ctx.keys[k].permits == 0)
        .collect()
}

/// Logs the final event of each key of a request that did not get them: a
/// timeout on the key that was still busy (the others `error
/// what=other_key`: given back, or never tried), any other error on all.
fn finish_all(cx: &Cx, parts: &[Part], error: &LockError) {
    for part in parts {
        match error {
            LockError::Timeout { key, .. } if *key != cx.ctx.keys[part.key].name => {
                if *part.rec.phase.lock().unwrap() != Phase::Done {
                    part.rec.finish("error", "what=other_key");
                }
            }
            _ => finish_error(&part.rec, error),
        }
    }
}

/// Logs the entry of every key (with its token from `tokens`), reads the
/// counters, and reads the records of half the write holds. A key missing
/// from `tokens` logs no entry (the checker sees a body with a key not
/// held).
async fn enter(
    cx: &Cx,
    rng: &mut Rng,
    parts: &[Part],
    tokens: &[(String, u64)],
    (began, last_poll): (u64, u64),
    plan: &Plan,
) -> Vec<Held> {
    let mut held = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        let name = cx.ctx.keys[part.key].name.as_str();
        let Some(&(_, token)) = tokens.iter().find(|(k, _)| k == name) else {
            part.rec.finish("error", "what=no_token");
            continue;
        };
        let rec = &part.rec;
        rec.set(Phase::Holding);
        // Only the last key is surely handed over in the poll that enters.
        let last = i + 1 == parts.len();
        let polled = if last { last_poll } else { began };
        let lease_from = if last {
            String::new()
        } else {
            format!(" lease_from={last_poll}")
        };
        rec.emit(
            "acquired",
            &format!("fence={token} outer=1 polled={polled}{lease_from}"),
        );
        rec.emit("body_enter", "");
        if !plan.renew {
            rec.time_lease_end(last_poll, plan.lease);
        }
        held.push(Held {
            part: i,
            token,
            data: Data::begin(&cx.ctx, part.key, 0, true),
            exit: BodyExit {
                rec: rec.clone(),
                done: false,
            },
            told: false,
        });
    }
    // (After the exits: a body cut during it still logs its exits.)
    for h in &held {
        if plan.mode != LockMode::Read && rng.chance(50) {
            let part = &parts[h.part];
            recorded(cx, &part.rec, part.key, h.token).await;
        }
    }
    held
}

/// The context of the body's nested calls: its keys' holds enclosing them.
fn inner_cx(cx: &Cx, parts: &[Part], held: &[Held]) -> Cx {
    let mut inner = cx.clone();
    inner.parent = parts[0].rec.id;
    inner.arm = None;
    for h in held {
        inner.frames.push(Frame {
            key: parts[h.part].key,
            permit: 0,
            fence: h.token,
        });
    }
    inner
}

/// Runs `steps` while watching each key's `guards` entry (if any) for a
/// loss: a key told lost logs `lost`; with `keep_going` the steps go on
/// (each key told once), else they stop.
async fn watch(
    parts: &[Part],
    held: &mut [Held],
    guards: &[Option<&LockGuard>],
    steps: impl Future<Output = ()>,
    keep_going: bool,
) {
    type Lost<'a> = Option<Pin<Box<dyn Future<Output = ()> + Send + 'a>>>;
    let mut losts: Vec<Lost<'_>> = guards
        .iter()
        .map(|g| g.map(|g| Box::pin(g.lost()) as Pin<Box<dyn Future<Output = ()> + Send + '_>>))
        .collect();
    let mut steps = std::pin::pin!(steps);
    // Bounded by the steps, and by one round per key.
    for _ in 0..=held.len() {
        let next = poll_fn(|task| {
            if steps.as_mut().poll(task).is_ready() {
                return Poll::Ready(None);
            }
            for (i, lost) in losts.iter_mut().enumerate() {
                if lost
                    .as_mut()
                    .is_some_and(|l| l.as_mut().poll(task).is_ready())
                {
                    *lost = None;
                    return Poll::Ready(Some(i));
                }
            }
            Poll::Pending
        })
        .await;
        let Some(i) = next else { return };
        held[i].told = true;
        parts[held[i].part].rec.emit("lost", "");
        if !keep_going {
            return;
        }
    }
    steps.await;
}

/// Each key's counter read again (a writer writes it) unless told lost,
/// the bodies' exits logged, then the records' `released`.
fn leave(cx: &Cx, parts: &[Part], held: Vec<Held>, mode: LockMode, dropped: bool) {
    let mut exits = Vec::new();
    for h in held {
        if let (Some(data), false) = (h.data, h.told) {
            data.end(cx, &parts[h.part].rec, mode);
        }
        exits.push(h.exit);
    }
    for mut exit in exits {
        exit.done = true;
        drop(exit);
    }
    let extra = if dropped { "dropped=1" } else { "" };
    for part in parts {
        if *part.rec.phase.lock().unwrap() == Phase::Holding {
            part.rec.finish("released", extra);
        }
    }
}

/// The body of a `with_locks` call: logs each key's hold, runs random
/// steps, logs the releases. With `OnLost::Continue` it watches a re-entry
/// probe of each key beside the steps (the library does not stop the body
/// then).
fn many_body(
    cx: Cx,
    mut rng: Rng,
    parts: Arc<Vec<Part>>,
    (began, polled): (u64, Arc<AtomicU64>),
    plan: &Plan,
) -> impl Future<Output = Result<(), BodyError>> + Send + 'static {
    let plan = *plan;
    let user_error = rng.chance(5);
    async move {
        let entered = polled.load(Ordering::Relaxed);
        let tokens = fences();
        let mut held = enter(&cx, &mut rng, &parts, &tokens, (began, entered), &plan).await;
        let inner = inner_cx(&cx, &parts, &held);
        let continues = plan.on_lost == OnLost::Continue;
        let mut probes = Vec::new();
        for h in &held {
            if !continues {
                probes.push(None);
                continue;
            }
            let spec = &cx.ctx.keys[parts[h.part].key];
            let probe = cx
                .runtime
                .lock(spec.name.as_str())
                .fair(spec.fair)
                .mode(plan.mode)
                .wait(Duration::ZERO)
                .acquire()
                .await;
            probes.push(match probe {
                Ok(guard) if guard.fence() == h.token => Some(guard),
                // Not re-entered: the hold is lost already.
                _ => None,
            });
        }
        for (h, probe) in held.iter_mut().zip(&probes) {
            if continues && probe.is_none() {
                h.told = true;
                parts[h.part].rec.emit("lost", "probe=1");
            }
        }
        let steps = within(plan.body_limit(), many_steps(inner, rng.fork(), &parts));
        let guards: Vec<Option<&LockGuard>> = probes.iter().map(Option::as_ref).collect();
        watch(&parts, &mut held, &guards, steps, true).await;
        drop(probes);
        leave(&cx, &parts, held, plan.mode, false);
        if user_error {
            Err(BodyError::User)
        } else {
            Ok(())
        }
    }
}

/// A guard call (`acquire()` or `try_acquire()`) on both keys: acquire,
/// work in the guard's scope while watching each key's `lost()`, release or
/// drop the guard; the acquire, the work and the release as the plan cuts
/// them.
async fn many_guarded(
    cx: Cx,
    mut rng: Rng,
    (parts, began, polled): (Arc<Vec<Part>>, u64, Arc<AtomicU64>),
    plan: &Plan,
    request: lock_runtime::ManyRequest,
) {
    let api = plan.api;
    let acquire = async move {
        match api {
            Api::Try => request.try_acquire().await,
            Api::Guard | Api::With => request.acquire().await.map(Some),
        }
    };
    let acquire = Stamped::new(acquire, polled.clone());
    let outcome = match plan.acquire_limit() {
        Some(limit) => match tokio::time::timeout(limit, acquire).await {
            Ok(outcome) => outcome,
            Err(_) => return, // the records log `cancelled`
        },
        None => acquire.await,
    };
    let guard: ManyGuard = match outcome {
        Ok(Some(guard)) => guard,
        Ok(None) => {
            for part in parts.iter() {
                part.rec.finish("timeout", "waited=0 busy=1");
            }
            return;
        }
        Err(e) => return finish_all(&cx, &parts, &e),
    };
    let tokens: Vec<(String, u64)> = guard.fences().map(|(k, t)| (k.to_owned(), t)).collect();
    let entered = polled.load(Ordering::Relaxed);
    let mut held = enter(&cx, &mut rng, &parts, &tokens, (began, entered), plan).await;
    let inner = inner_cx(&cx, &parts, &held);
    let guards: Vec<Option<&LockGuard>> = held
        .iter()
        .map(|h| {
            let name = cx.ctx.keys[parts[h.part].key].name.as_str();
            guard.guards().iter().find(|g| g.key() == name)
        })
        .collect();
    let steps = within(
        plan.body_limit(),
        guard.scope(many_steps(inner, rng.fork(), &parts)),
    );
    let keep_going = plan.on_lost == OnLost::Continue;
    watch(&parts, &mut held, &guards, steps, keep_going).await;
    let cut = match plan.end {
        End::Drop => {
            leave(&cx, &parts, held, plan.mode, true);
            drop(guard);
            return;
        }
        End::Release => None,
        End::CutRelease(limit) => Some(limit),
    };
    leave(&cx, &parts, held, plan.mode, false);
    let released = match cut {
        Some(limit) => match tokio::time::timeout(limit, guard.release()).await {
            Ok(released) => released,
            Err(_) => return,
        },
        None => guard.release().await,
    };
    let (key, event) = match &released {
        Ok(()) => return,
        Err(LockError::Lost { key } | LockError::NotHeld { key }) => (Some(key), "late_lost"),
        Err(_) => (None, "late_error"),
    };
    let part = parts
        .iter()
        .find(|p| key.is_some_and(|k| *k == cx.ctx.keys[p.key].name))
        .unwrap_or(&parts[0]);
    let extra = match released {
        Err(LockError::Lost { .. } | LockError::NotHeld { .. }) | Ok(()) => String::new(),
        Err(e) => format!("what={}", one_word(&e)),
    };
    part.rec.emit(event, &extra);
}

/// Random steps inside a multi-key body: work, a re-entry of one of its
/// keys (cut part-way now and then, or two `join!` siblings), a call on a
/// key sorting past both, and one on a key sorting before one of them and
/// not held (refused at once).
async fn many_steps(cx: Cx, mut rng: Rng, parts: &[Part]) {
    let ctx = cx.ctx.clone();
    let name = |k: usize| ctx.keys[k].name.as_str();
    let held: Vec<usize> = parts.iter().map(|p| p.key).collect();
    let last = held.iter().map(|&k| name(k)).max().unwrap_or_default();
    let others: Vec<usize> = (0..ctx.keys.len()).filter(|k| !held.contains(k)).collect();
    let past: Vec<usize> = others.iter().copied().filter(|&k| name(k) > last).collect();
    let before: Vec<usize> = others.iter().copied().filter(|&k| name(k) < last).collect();
    let n = rng.below(4);
    for _ in 0..n {
        match rng.below(100) {
            0..=39 => hold(&mut rng).await,
            40..=64 => {
                // A re-entry of one of its keys (nested under its record).
                let part = &parts[rng.below(parts.len() as u64) as usize];
                let mut nested = cx.clone();
                nested.parent = part.rec.id;
                if rng.chance(25) {
                    let a = call_as(nested.clone(), rng.fork(), part.key, 1, true);
                    let b = call_as(nested, rng.fork(), part.key, 1, true);
                    tokio::join!(a, b);
                } else if rng.chance(20) {
                    let budget = rng.millis(5, 500);
                    let nested = call(nested, rng.fork(), part.key, 1);
                    let _ = tokio::time::timeout(budget, nested).await;
                } else {
                    call(nested, rng.fork(), part.key, 1).await;
                }
            }
            65..=79 if !past.is_empty() => {
                let key = past[rng.below(past.len() as u64) as usize];
                call(cx.clone(), rng.fork(), key, 1).await;
            }
            80..=91 if !before.is_empty() => {
                let key = before[rng.below(before.len() as u64) as usize];
                call(cx.clone(), rng.fork(), key, 1).await;
            }
            92..=93 => std::panic::panic_any(PANIC_PAYLOAD),
            _ => tokio::task::yield_now().await,
        }
    }
}
