//! The worker's permit calls: a key of kind `permits<N>-plain|fair` is
//! taken with `permits(N)` by every call on it (single-key calls only: a
//! multi-key call never picks it, as permits and key lists do not
//! combine), with the same random options, nesting, cuts and bursts as
//! any other key.
//!
//! **Logged under the permit it got.** The checker sees each permit of
//! the key as a key of its own (a slot): the lock of permit `i` is
//! `<name>#i` (permit 0: `<name>` itself), so exclusion, tokens, data and
//! waiting are checked permit by permit as they are key by key. A call's
//! key column is `<key>#<permit>`. The permit is known only once the call
//! holds it, so its `begin` line is held back until the first line after
//! it and printed then with its own time: before `acquired`, under the
//! permit got; before a final event of a call that got none (a timeout,
//! an error, a cut), under a permit drawn at random when the call began.
//! That is sound for the waiting checks whichever permit it is: such a
//! call tried every permit and then waited for all of them at once, so a
//! long-free permit would have been its to take.
//!
//! **Which permit.** A guard's permit is read from the lock it holds
//! (`LockGuard::key`, `<name>#i`), a `with_lock` body's from `permit()`;
//! the `acquired` line adds what the library said (`permit=<i>|none
//! permits=<N>`, and a guard's `lock=<key>`), which the checker compares
//! with the slot.
//!
//! **Data.** Each permit has a counter of its own (`<data-dir>/<name>#i`,
//! permit 0's is `<name>`): a hold reads and writes its permit's counter.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use lock_runtime::{LockRequest, LockRuntime};

use super::{Key, Rng};

/// No permit got yet.
const NONE: u32 = u32::MAX;

/// The permit count of a key kind word (`permits3-fair`: 3 permits, fair),
/// and its fair flag; `None` for another kind.
pub(super) fn kind(word: &str) -> Option<(u32, bool)> {
    let rest = word.strip_prefix("permits")?;
    let (count, mode) = rest.split_once('-')?;
    let fair = match mode {
        "plain" => false,
        "fair" => true,
        _ => return None,
    };
    let count: u32 = count.parse().ok()?;
    (count > 0).then_some((count, fair))
}

/// The key of permit `permit` of `name`, as the library names it (and as
/// the counter file is named): `name` for permit 0, `name#i` otherwise.
pub(super) fn permit_key(name: &str, permit: u32) -> String {
    if permit == 0 {
        name.to_owned()
    } else {
        format!("{name}#{permit}")
    }
}

/// `request` asking one of the key's permits, if it is a permit key.
pub(super) fn asking(request: LockRequest, key: &Key) -> LockRequest {
    if key.permits > 0 {
        request.permits(key.permits)
    } else {
        request
    }
}

/// Whether `inspect` finds every lock of `key` free (every permit's, for a
/// permit key); `false` when it cannot tell.
pub(super) async fn looks_free(runtime: &LockRuntime, key: &Key) -> bool {
    if key.permits == 0 {
        return matches!(runtime.inspect(&key.name).await, Ok(None));
    }
    let seen = runtime.inspect_permits(&key.name, key.permits).await;
    seen.is_ok_and(|all| all.iter().all(Option::is_none))
}

/// The permit side of a permit call's log ([`super::Rec`]): the `begin`
/// line held back, the permit got, what the library said of it.
pub(super) struct Slot {
    /// The key's count of permits.
    permits: u32,
    /// The permit a call that got none is logged under.
    fallback: u32,
    /// The permit it got ([`NONE`] until then).
    got: AtomicU32,
    /// The `begin` line's time and fields, until it is printed.
    begin: Mutex<Option<(u64, String)>>,
    /// What the `acquired` line adds (`permit=… permits=… [lock=…]`).
    said: Mutex<String>,
}

impl Slot {
    /// The log of a call on a key of `permits` permits.
    pub(super) fn new(permits: u32, rng: &mut Rng) -> Slot {
        Slot {
            permits,
            fallback: rng.below(u64::from(permits)) as u32,
            got: AtomicU32::new(NONE),
            begin: Mutex::new(None),
            said: Mutex::new(String::new()),
        }
    }

    /// The permit the call's lines are logged under: the one it got, else
    /// its fallback.
    pub(super) fn permit(&self) -> u32 {
        match self.got.load(Ordering::Relaxed) {
            NONE => self.fallback,
            got => got,
        }
    }

    /// Holds the `begin` line (its time `t` and fields) back.
    pub(super) fn hold_back(&self, t: u64, fields: &str) {
        *locked(&self.begin) = Some((t, fields.to_owned()));
    }

    /// The held-back `begin` line, once: printed before the next line.
    pub(super) fn take_begin(&self) -> Option<(u64, String)> {
        locked(&self.begin).take()
    }

    /// The call holds a permit of key `name`: `said` is the index the
    /// library reports, `lock` the key of the lock it holds (a guard's;
    /// `None` in a `with_lock` body). The lock's key decides the slot when
    /// it is known; else the index said, else the fallback.
    pub(super) fn got(&self, name: &str, said: Option<u32>, lock: Option<&str>) {
        let of_lock = lock.and_then(|l| {
            if l == name {
                Some(0)
            } else {
                l.strip_prefix(name)?.strip_prefix('#')?.parse().ok()
            }
        });
        let permit = of_lock.or(said).unwrap_or(self.fallback);
        self.got.store(permit, Ordering::Relaxed);
        let said = said.map_or("none".to_owned(), |p| p.to_string());
        let lock = lock.map_or(String::new(), |l| format!(" lock={l}"));
        *locked(&self.said) = format!(" permit={said} permits={}{lock}", self.permits);
    }

    /// What the `acquired` line adds.
    pub(super) fn said(&self) -> String {
        locked(&self.said).clone()
    }
}

/// `mutex`'s guard, whether or not a panic poisoned it.
fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
