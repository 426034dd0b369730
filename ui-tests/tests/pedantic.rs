//! The expansion leaves nothing to silence for a crate with `#![deny(warnings)]` and
//! `#![deny(clippy::pedantic)]`: every argument, in both forms where there are two (a literal
//! and an expression, a path as a string and as tokens), and every parameter form, compiled here
//! and checked by the workspace's `cargo clippy --all-targets -- -D warnings` (trybuild does
//! not run clippy), then run on the embedded backend.
#![deny(warnings)]
#![deny(clippy::pedantic)]

use std::time::Duration;

use lock_runtime::{distributed_lock, LockError, LockRuntime};

mod reexport {
    pub use lock_runtime as locks;
}

const LEASE: Duration = Duration::from_secs(10);

#[distributed_lock(
    key = "all:<id>",
    lease = "1m30s",
    wait = "250ms",
    watchdog = false,
    on_lost = "continue",
    fair = true,
    mode = "exclusive",
    crate = "crate::reexport::locks"
)]
async fn literals(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "expr:<id>", lease = LEASE, wait = Duration::from_secs(1), on_lost = "abort", crate = crate::reexport::locks)]
async fn expressions(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "literal", wait = "0s", watchdog = true, fair = false, crate = ::lock_runtime)]
async fn literal_key() -> Result<(), LockError> {
    Ok(())
}

/// `_x` parameters (read by the key, or not at all), `_`, patterns.
#[distributed_lock(key = "params:<_id>:<name>:<pair.1>")]
async fn parameters(
    _id: u64,
    name: &str,
    pair: (u8, u8),
    _: u8,
    (a, _b): (u8, u8),
    _unused: String,
) -> Result<usize, LockError> {
    Ok(name.len() + usize::from(a) + usize::from(pair.0))
}

/// `mut`, and parameter attributes.
#[distributed_lock(key = "mutable:<total>")]
async fn mutable(
    mut _counter: u8,
    mut total: u8,
    #[allow(unused_variables)] allowed: u8,
    #[cfg(any())] configured_away: u8,
) -> Result<u8, LockError> {
    total += 1;
    _counter = 1;
    Ok(total)
}

/// `ref`, `ref mut`, `x @ pat`, and names inside patterns, read by the key (some only by it).
#[distributed_lock(key = "patterns:<name>:<buf>:<a>:<_b>:<all.0>:<x>:<left>")]
async fn patterns(
    ref name: String,
    ref mut buf: String,
    (a, _b): (u8, u8),
    all @ (x, _): (u8, u8),
    (left, mut right): (String, String),
) -> Result<usize, LockError> {
    right.push('!');
    Ok(name.len() + usize::from(all.1) + right.len())
}

/// Many keys: fields, `self`'s fields and names inside patterns, in one list.
#[distributed_lock(key = ["many:<pair.0>", "many:<a>", "many:<name>"], mode = "read", lease = "1s")]
async fn many(pair: (u8, u8), (a, _b): (u8, u8), name: &str) -> Result<usize, LockError> {
    Ok(name.len() + usize::from(a))
}

struct Account {
    tenant: String,
}

impl Account {
    #[distributed_lock(key = "acct:<self.tenant>:<_n>")]
    async fn method(&self, _n: u8) -> Result<usize, LockError> {
        Ok(self.tenant.len())
    }

    #[distributed_lock(key = ["acct:<self.tenant>", "acct:<self.tenant>:<n>"])]
    async fn many(&self, n: u8) -> Result<usize, LockError> {
        Ok(self.tenant.len())
    }

    #[distributed_lock(key = "acct:<self.tenant>")]
    async fn by_value(self, _: u8) -> Result<String, LockError> {
        Ok(self.tenant)
    }
}

#[test]
fn every_form_runs_without_a_lint() -> Result<(), LockError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| LockError::InvalidConfig(error.to_string()))?;
    runtime.block_on(async {
        LockRuntime::builder().memory().build().await?.install()?;
        assert_eq!(literals(1).await?, 1);
        assert_eq!(expressions(2).await?, 2);
        literal_key().await?;
        assert_eq!(
            parameters(3, "abc", (1, 2), 0, (4, 5), String::new()).await?,
            3 + 4 + 1
        );
        assert_eq!(mutable(0, 1, 0).await?, 2);
        assert_eq!(
            patterns(
                "n".to_owned(),
                String::new(),
                (1, 2),
                (3, 4),
                (String::new(), "r".to_owned())
            )
            .await?,
            1 + 4 + 2
        );
        let account = Account {
            tenant: "t".to_owned(),
        };
        assert_eq!(account.method(1).await?, 1);
        assert_eq!(many((1, 2), (3, 4), "ab").await?, 2 + 3);
        assert_eq!(account.many(5).await?, 1);
        assert_eq!(account.by_value(0).await?, "t");
        Ok(())
    })
}
