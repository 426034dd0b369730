//! `key = [ … ]`: several keys in one attribute, each a template with the placeholders a
//! single key takes (parameters, fields, `self`'s fields, names inside patterns), on free
//! fns, `&self` and `&mut self` methods and `#[async_trait]` methods, in every mode; a list
//! of one key, and a trailing comma. Nothing left to warn about.
#![deny(warnings)]

use async_trait::async_trait;
use lock_runtime::{distributed_lock, LockError};

enum AppError {
    Lock(LockError),
    Insufficient,
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError::Lock(error)
    }
}

struct Transfer {
    from: u64,
    to: u64,
}

#[distributed_lock(key = ["account:<from>", "account:<to>"], lease = "10s")]
async fn transfer(from: u64, to: u64, amount: u64) -> Result<(), AppError> {
    if amount > 100 {
        return Err(AppError::Insufficient);
    }
    Ok(())
}

#[distributed_lock(key = ["account:<t.from>", "account:<t.to>",], wait = "1s", mode = "write")]
async fn by_fields(t: &Transfer) -> Result<u64, LockError> {
    Ok(t.from + t.to)
}

#[distributed_lock(key = ["pair:<a>", "pair:<b>", "all"], mode = "read")]
async fn by_pattern((a, b): (u64, u64), mut extra: u64) -> Result<u64, LockError> {
    extra += a + b;
    Ok(extra)
}

#[distributed_lock(key = ["just:<id>"])]
async fn list_of_one(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

struct Bank {
    tenant: String,
    moved: u64,
}

impl Bank {
    #[distributed_lock(key = ["<self.tenant>:account:<t.from>", "<self.tenant>:account:<t.to>"])]
    async fn transfer(&self, t: &Transfer) -> Result<usize, LockError> {
        Ok(self.tenant.len() + usize::from(t.from != t.to))
    }

    #[distributed_lock(key = ["<self.tenant>:ledger", "<self.tenant>:account:<id>"], on_lost = "continue")]
    async fn record(&mut self, id: u64) -> Result<u64, LockError> {
        self.moved += id;
        Ok(self.moved)
    }
}

#[async_trait]
trait Ledger {
    async fn post(&self, from: u64, to: u64) -> Result<u64, LockError>;
}

#[async_trait]
impl Ledger for Bank {
    #[distributed_lock(key = ["<self.tenant>:account:<from>", "<self.tenant>:account:<to>"])]
    async fn post(&self, from: u64, to: u64) -> Result<u64, LockError> {
        Ok(from + to)
    }
}

fn main() {
    let t = Transfer { from: 1, to: 2 };
    let mut bank = Bank {
        tenant: "t".into(),
        moved: 0,
    };
    let _ = transfer(1, 2, 3);
    let _ = by_fields(&t);
    let _ = by_pattern((1, 2), 3);
    let _ = list_of_one(1);
    let _ = bank.transfer(&t);
    let _ = bank.record(1);
    let _ = bank.post(1, 2);
    match AppError::from(LockError::NotInstalled) {
        AppError::Lock(error) => drop(error),
        AppError::Insufficient => {}
    }
}
