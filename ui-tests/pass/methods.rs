//! Methods taking `&self`, `&mut self`, `self: Arc<Self>` and `self`, in an inherent impl.
use std::sync::Arc;

use lock_runtime::{distributed_lock, LockError};

struct Account {
    tenant: String,
    balance: u64,
}

impl Account {
    #[distributed_lock(key = "acct:<self.tenant>")]
    async fn balance(&self) -> Result<u64, LockError> {
        Ok(self.balance)
    }

    #[distributed_lock(key = "acct:<self.tenant>", wait = "1s")]
    async fn deposit(&mut self, amount: u64) -> Result<u64, LockError> {
        self.balance += amount;
        Ok(self.balance)
    }

    #[distributed_lock(key = "acct:<self.tenant>")]
    async fn shared(self: Arc<Self>) -> Result<usize, LockError> {
        Ok(Arc::strong_count(&self))
    }

    #[distributed_lock(key = "acct:<self.tenant>")]
    async fn close(mut self) -> Result<u64, LockError> {
        self.balance = 0;
        Ok(self.balance)
    }
}

fn main() {
    let mut account = Account {
        tenant: "t".into(),
        balance: 0,
    };
    let _ = account.balance();
    let _ = account.deposit(1);
    let _ = Arc::new(Account {
        tenant: "t".into(),
        balance: 0,
    })
    .shared();
    let _ = account.close();
}
