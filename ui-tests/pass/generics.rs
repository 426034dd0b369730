//! Generic fns, `where` clauses, `impl Trait` arguments and lifetimes.
use std::fmt::Display;

use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "item:<id>")]
async fn generic<T, E>(id: T, value: T) -> Result<T, E>
where
    T: Display + Send,
    E: From<LockError>,
{
    drop(id);
    Ok(value)
}

#[distributed_lock(key = "user:<name>")]
async fn impl_trait(
    name: impl Display,
    items: impl IntoIterator<Item = u8>,
) -> Result<u32, LockError> {
    Ok(items.into_iter().map(u32::from).sum())
}

#[distributed_lock(key = "slice:<name>")]
async fn lifetimes<'a, 'b: 'a>(name: &'a str, rest: &'b [u8]) -> Result<&'a str, LockError> {
    let _ = rest;
    Ok(name)
}

#[distributed_lock(key = "elided:<name>")]
async fn elided(name: &str) -> Result<&str, LockError> {
    Ok(name)
}

struct Repo<T>(T);

impl<T: Display + Sync> Repo<T> {
    #[distributed_lock(key = "repo:<self.0>:<id>")]
    async fn get<'a>(&'a self, id: &'a str) -> Result<&'a T, LockError> {
        let _ = id;
        Ok(&self.0)
    }

    #[distributed_lock(key = "repo:<self.0>")]
    async fn this(&self) -> Result<&Self, LockError> {
        Ok(self)
    }
}

fn main() {
    let _ = generic::<u8, LockError>(1, 2);
    let _ = impl_trait("n", [1u8]);
    let _ = lifetimes("a", &[]);
    let _ = elided("a");
    let repo = Repo(1);
    let _ = repo.get("x");
    let _ = repo.this();
}
