//! Every parameter (named, `_`, `_x`, destructured, `ref`, `ref mut`, `x @ pat`, by-value
//! `self`) is dropped as a native `async fn` drops it: at the end of the body, after the
//! body's locals, in reverse order of declaration; and here while the lock is still held.
//! The key reading names bound inside patterns changes none of it.
#![deny(warnings)]

use std::sync::{Mutex, PoisonError};

use lock_runtime::{distributed_lock, fence, LockError, LockRuntime};

/// Drops recorded in order: (name, whether a lock was held at the time).
static DROPS: Mutex<Vec<(&'static str, bool)>> = Mutex::new(Vec::new());

struct Noisy(&'static str);

impl Drop for Noisy {
    fn drop(&mut self) {
        let held = fence().is_some();
        DROPS.lock().unwrap_or_else(PoisonError::into_inner).push((self.0, held));
    }
}

struct Pair {
    left: Noisy,
    right: Noisy,
}

fn take_drops() -> Vec<(&'static str, bool)> {
    std::mem::take(&mut *DROPS.lock().unwrap_or_else(PoisonError::into_inner))
}

/// Writes one fn twice from the same parameters and body: as `native`, and under
/// `#[distributed_lock(key = $key)]` as `locked`, so the two differ by the attribute alone.
macro_rules! native_and_locked {
    ($key:tt, ($($params:tt)*) $body:tt) => {
        async fn native($($params)*) -> Result<(), LockError> $body

        #[distributed_lock(key = $key)]
        async fn locked($($params)*) -> Result<(), LockError> $body
    };
}

native_and_locked!(
    "drops:<a.0>:<b.0>:<left.0>:<e.0>:<f.0>:<g.left.0>",
    (
        a: Noisy,
        _: Noisy,
        (b, _): (Noisy, Noisy),
        _c: Noisy,
        Pair { left, .. }: Pair,
        mut d: Noisy,
        ref e: Noisy,
        ref mut f: Noisy,
        g @ Pair { .. }: Pair,
    ) {
        let _local = Noisy("local");
        d.0 = "d";
        f.0 = "f";
        let _ = (&a, &b, &left, e, &g);
        Ok(())
    }
);

impl Noisy {
    async fn native_method(self, a: Noisy) -> Result<(), LockError> {
        let _ = &a;
        Ok(())
    }

    #[distributed_lock(key = "drops:<a.0>")]
    async fn locked_method(self, a: Noisy) -> Result<(), LockError> {
        let _ = &a;
        Ok(())
    }
}

/// The arguments of every call above, in a fresh set (names as the fns see them).
macro_rules! arguments {
    ($f:expr) => {
        $f(
            Noisy("a"),
            Noisy("_"),
            (Noisy("b"), Noisy("b.1")),
            Noisy("_c"),
            Pair {
                left: Noisy("left"),
                right: Noisy("right"),
            },
            Noisy("d before"),
            Noisy("e"),
            Noisy("f before"),
            Pair {
                left: Noisy("g.left"),
                right: Noisy("g.right"),
            },
        )
    };
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    runtime.block_on(async {
        LockRuntime::builder()
            .memory()
            .build()
            .await
            .and_then(LockRuntime::install)
            .unwrap_or_else(|e| panic!("lock runtime: {e}"));

        arguments!(native).await.unwrap_or_else(|e| panic!("{e}"));
        let native_drops = take_drops();
        arguments!(locked).await.unwrap_or_else(|e| panic!("{e}"));
        let locked_drops = take_drops();
        let names = |drops: &[(&'static str, bool)]| drops.iter().map(|d| d.0).collect::<Vec<_>>();
        assert_eq!(names(&locked_drops), names(&native_drops));
        assert_eq!(
            names(&native_drops),
            [
                "local", "g.left", "g.right", "f", "e", "d", "left", "right", "_c", "b", "b.1",
                "_", "a"
            ],
        );
        assert!(native_drops.iter().all(|(_, held)| !held), "{native_drops:?}");
        assert!(locked_drops.iter().all(|(_, held)| *held), "{locked_drops:?}");

        Noisy("self").native_method(Noisy("a")).await.unwrap_or_else(|e| panic!("{e}"));
        let native_drops = take_drops();
        Noisy("self").locked_method(Noisy("a")).await.unwrap_or_else(|e| panic!("{e}"));
        let locked_drops = take_drops();
        assert_eq!(names(&locked_drops), names(&native_drops));
        assert!(locked_drops.iter().all(|(_, held)| *held), "{locked_drops:?}");
    });
}
