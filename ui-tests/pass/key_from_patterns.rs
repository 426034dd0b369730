//! The key reads any name a parameter binds, as the body can: `mut x`, `ref x`, `ref mut x`,
//! `_x`, names inside tuple, struct, tuple-struct and slice patterns, `x @ pat` (both
//! names), `&` patterns, patterns matched through a reference (`(a, b): &(A, B)`, where the
//! names are references), every receiver, and `#[async_trait]` methods; with nothing left
//! to warn about (a name only the key reads is used).
#![deny(warnings)]

use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use lock_runtime::{distributed_lock, LockError};

struct Pair {
    left: String,
    right: String,
}

struct Id(u64);

#[distributed_lock(key = "mut:<total>")]
async fn mutable(mut total: u64) -> Result<u64, LockError> {
    total += 1;
    Ok(total)
}

#[distributed_lock(key = "ref:<name>")]
async fn by_ref(ref name: String) -> Result<usize, LockError> {
    Ok(name.len())
}

#[distributed_lock(key = "ref-mut:<name>")]
async fn by_ref_mut(ref mut name: String) -> Result<String, LockError> {
    name.push('!');
    Ok(name.clone())
}

/// Names only the key reads: no "unused variable", no "used underscore binding".
#[distributed_lock(key = "only-key:<name>:<a>:<_b>:<buf>")]
async fn read_by_the_key_only(
    ref name: String,
    (a, _b): (u8, u8),
    ref mut buf: String,
) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "tuple:<a>:<b>:<c.0>")]
async fn tuple((a, mut b, c): (String, u8, (u8,))) -> Result<String, LockError> {
    b += c.0;
    Ok(format!("{a}{b}"))
}

#[distributed_lock(key = "struct:<left>:<r>")]
async fn structs(Pair { left, right: r }: Pair) -> Result<usize, LockError> {
    Ok(left.len() + r.len())
}

#[distributed_lock(key = "tuple-struct:<id>")]
async fn tuple_struct(Id(id): Id) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "slice:<first>:<last>")]
async fn slice([first, .., last]: [u8; 4]) -> Result<u8, LockError> {
    Ok(first + last)
}

#[distributed_lock(key = "at:<all.0>:<x>:<pair.left>")]
async fn bindings_at(all @ (x, _): (u8, u8), pair @ Pair { .. }: Pair) -> Result<u8, LockError> {
    Ok(all.0 + x + u8::from(pair.right.is_empty()))
}

#[distributed_lock(key = "ref-at:<whole.left>:<left>")]
async fn ref_at(ref whole @ Pair { ref left, .. }: Pair) -> Result<usize, LockError> {
    Ok(whole.right.len() + left.len())
}

#[distributed_lock(key = "deref:<n>:<s>")]
async fn reference_patterns(&n: &u8, (&mut ref s, _): (&mut String, u8)) -> Result<u8, LockError> {
    Ok(n + u8::from(s.is_empty()))
}

/// Bound through a reference: `a` and `left` are references, in the body and in the key.
#[distributed_lock(key = "through:<a>:<left>")]
async fn through_a_reference(
    (a, b): &(String, String),
    Pair { left, .. }: &Pair,
) -> Result<usize, LockError> {
    Ok(a.len() + b.len() + left.len())
}

#[distributed_lock(key = "mixed:<id>:<_tag>:<name>:<x>")]
async fn mixed(
    id: u64,
    _tag: &str,
    _: u8,
    ref name: String,
    Pair { left: x, .. }: Pair,
) -> Result<u64, LockError> {
    Ok(id + u64::from(name.is_empty()) + u64::from(x.is_empty()))
}

struct Account {
    tenant: String,
}

impl Account {
    #[distributed_lock(key = "self:<self.tenant>")]
    async fn by_value(self) -> Result<String, LockError> {
        Ok(self.tenant)
    }

    #[distributed_lock(key = "mut-self:<self.tenant>")]
    async fn by_mut_value(mut self) -> Result<String, LockError> {
        self.tenant.push('!');
        Ok(self.tenant)
    }

    #[distributed_lock(key = "ref-self:<self.tenant>:<name>")]
    async fn by_ref(&self, ref name: String) -> Result<usize, LockError> {
        Ok(self.tenant.len() + name.len())
    }

    #[distributed_lock(key = "mut-ref-self:<self.tenant>:<a>")]
    async fn by_mut_ref(&mut self, (a, b): (u8, u8)) -> Result<u8, LockError> {
        self.tenant.push('!');
        Ok(a + b)
    }

    #[distributed_lock(key = "box:<self.tenant>")]
    async fn boxed(self: Box<Self>) -> Result<String, LockError> {
        Ok(self.tenant)
    }

    #[distributed_lock(key = "mut-box:<self.tenant>")]
    async fn mut_boxed(mut self: Box<Self>) -> Result<String, LockError> {
        self.tenant.push('!');
        Ok(self.tenant)
    }

    #[distributed_lock(key = "arc:<self.tenant>")]
    async fn shared(self: Arc<Self>) -> Result<usize, LockError> {
        Ok(self.tenant.len())
    }

    #[distributed_lock(key = "pin:<self.tenant>")]
    async fn pinned(self: Pin<&mut Self>) -> Result<usize, LockError> {
        Ok(self.tenant.len())
    }
}

#[async_trait]
trait Store {
    async fn save(&self, pair: (String, u8), ref name: String) -> Result<usize, LockError>;
}

#[async_trait]
impl Store for Account {
    #[distributed_lock(key = "trait:<self.tenant>:<key>:<name>:<n>")]
    async fn save(&self, (key, n): (String, u8), ref name: String) -> Result<usize, LockError> {
        Ok(key.len() + usize::from(n) + name.len())
    }
}

#[async_trait]
trait ByReference {
    async fn find(&self, pair: &(String, u8)) -> Result<usize, LockError>;
}

#[async_trait]
impl ByReference for Account {
    #[distributed_lock(key = "trait-ref:<key>")]
    async fn find(&self, (key, n): &(String, u8)) -> Result<usize, LockError> {
        Ok(key.len() + usize::from(*n))
    }
}

fn pair() -> Pair {
    Pair {
        left: "l".into(),
        right: "r".into(),
    }
}

fn account() -> Account {
    Account { tenant: "t".into() }
}

fn main() {
    let _ = (mutable(1), by_ref("n".into()), by_ref_mut("n".into()));
    let _ = read_by_the_key_only("n".into(), (1, 2), String::new());
    let _ = (
        tuple(("a".into(), 1, (2,))),
        structs(pair()),
        tuple_struct(Id(1)),
    );
    let _ = (
        slice([1, 2, 3, 4]),
        bindings_at((1, 2), pair()),
        ref_at(pair()),
    );
    let (n, mut s) = (1, String::new());
    let _ = reference_patterns(&n, (&mut s, 0));
    let (tuple, pair_) = (("a".into(), "b".into()), pair());
    let _ = through_a_reference(&tuple, &pair_);
    let _ = mixed(1, "t", 0, "n".into(), pair());
    let _ = (account().by_value(), account().by_mut_value());
    let mut a = account();
    let _ = a.by_ref("n".into());
    let _ = a.by_mut_ref((1, 2));
    let _ = (Box::new(account()).boxed(), Box::new(account()).mut_boxed());
    let _ = Arc::new(account()).shared();
    let mut pinned = account();
    let _ = Pin::new(&mut pinned).pinned();
    let _ = a.save(("k".into(), 1), "n".into());
    let found = ("k".into(), 1);
    let _ = a.find(&found);
}
