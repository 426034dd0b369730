//! Every fn shape `#[distributed_lock]` accepts, run on the embedded backend: the body runs
//! holding the key built from the arguments, and the lock is free again once the call returns.
//!
//! The global runtime can be installed once per process, so all tests share one tokio runtime
//! (its background tasks must outlive every test) with the lock runtime installed on it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::rc::Rc;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use lock_runtime::{distributed_lock, LockError, LockRuntime};
use lock_ui_tests::AppError;

/// Runs `future` on the shared runtime, installing the lock runtime the first time.
fn block_on<F: Future>(future: F) -> F::Output {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    let runtime = RUNTIME.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        runtime.block_on(async {
            if LockRuntime::global().is_err() {
                let locks = LockRuntime::builder()
                    .memory()
                    .build()
                    .await
                    .expect("memory backend");
                locks.install().expect("first install");
            }
        });
        runtime
    });
    runtime.block_on(future)
}

/// Tries `key` once, from a new task (so a new owner): `Err(Timeout)` while someone holds it.
#[distributed_lock(key = "<key>", wait = "0s")]
async fn try_once(key: String) -> Result<(), LockError> {
    Ok(())
}

/// True when another owner holds `key` right now.
async fn held(key: &str) -> bool {
    match tokio::spawn(try_once(key.to_owned())).await.unwrap() {
        Ok(()) => false,
        Err(LockError::Timeout { .. }) => true,
        Err(other) => panic!("probing {key}: {other}"),
    }
}

// ---- free fns, attributes, arguments -------------------------------------------------------

/// Pays an order (the doc comment and `#[inline]` are kept).
#[distributed_lock(key = "order:<id>", lease = "30s", wait = "5s")]
#[inline]
pub(crate) async fn pay(id: u64, mut amount: u64) -> Result<u64, LockError> {
    assert!(held(&format!("order:{id}")).await);
    amount += 1;
    Ok(amount)
}

#[test]
fn free_fn_runs_holding_its_key_and_releases_it() {
    block_on(async {
        assert_eq!(pay(1, 10).await.unwrap(), 11);
        assert!(!held("order:1").await);
    });
}

struct Request {
    order_id: u64,
}

#[distributed_lock(key = "{shop}<<<req.order_id>>:<pair.1>")]
async fn escapes(req: &Request, pair: (u8, &str)) -> Result<u64, LockError> {
    assert!(held(&format!("{{shop}}<{}>:{}", req.order_id, pair.1)).await);
    Ok(req.order_id + u64::from(pair.0))
}

#[test]
fn key_formats_fields_and_keeps_literal_braces_and_angles() {
    block_on(async {
        let request = Request { order_id: 7 };
        assert_eq!(escapes(&request, (1, "x")).await.unwrap(), 8);
        // The argument was only borrowed by the key.
        assert_eq!(request.order_id, 7);
    });
}

mod reexport {
    pub use lock_runtime as locks;
}

const LEASE: Duration = Duration::from_secs(5);

#[distributed_lock(
    key = "options:<id>",
    lease = LEASE,
    wait = Duration::from_secs(1),
    watchdog = false,
    on_lost = "continue",
    fair = true,
    crate = "crate::reexport::locks",
)]
async fn every_option(id: u64) -> Result<u64, LockError> {
    assert!(held(&format!("options:{id}")).await);
    Ok(id)
}

#[distributed_lock(key = "nightly-report", wait = "0s")]
async fn literal_key() -> Result<(), LockError> {
    assert!(held("nightly-report").await);
    Ok(())
}

#[test]
fn every_argument_form_runs() {
    block_on(async {
        assert_eq!(every_option(3).await.unwrap(), 3);
        literal_key().await.unwrap();
    });
}

// ---- parameter patterns --------------------------------------------------------------------

#[distributed_lock(key = "by-ref:<name>:<count>")]
async fn by_reference(ref name: String, ref mut count: u64) -> Result<u64, LockError> {
    assert!(held(&format!("by-ref:{name}:{count}")).await);
    *count += 1;
    Ok(*count)
}

struct Pair {
    left: String,
    right: String,
}

#[distributed_lock(key = "patterns:<a>:<left>:<all.1>:<x>:<last>")]
async fn patterns(
    (a, mut b): (u8, u8),
    Pair { left, .. }: Pair,
    all @ (x, _): (u8, u8),
    [_, .., last]: [u8; 3],
) -> Result<String, LockError> {
    assert!(held(&format!("patterns:{a}:{left}:{}:{x}:{last}", all.1)).await);
    b += 1;
    Ok(format!("{a}{b}{left}"))
}

#[distributed_lock(key = "through:<a>:<right>")]
async fn through_a_reference(
    (a, _): &(u8, u8),
    Pair { right, .. }: &Pair,
) -> Result<usize, LockError> {
    assert!(held(&format!("through:{a}:{right}")).await);
    Ok(right.len())
}

#[test]
fn a_key_reads_names_bound_by_ref_and_inside_patterns_as_the_body_sees_them() {
    block_on(async {
        assert_eq!(by_reference("n".to_owned(), 1).await.unwrap(), 2);
        assert!(!held("by-ref:n:1").await);
        let pair = || Pair {
            left: "l".to_owned(),
            right: "r".to_owned(),
        };
        assert_eq!(
            patterns((1, 2), pair(), (3, 4), [5, 6, 7]).await.unwrap(),
            "13l"
        );
        assert!(!held("patterns:1:l:4:3:7").await);
        assert_eq!(through_a_reference(&(8, 9), &pair()).await.unwrap(), 1);
    });
}

// ---- methods (every receiver of an inherent impl: compiled and run here) -------------------

struct Account {
    tenant: String,
    balance: u64,
}

impl Account {
    #[distributed_lock(key = "acct:<self.tenant>")]
    async fn balance(&self) -> Result<u64, LockError> {
        assert!(held(&format!("acct:{}", self.tenant)).await);
        Ok(self.balance)
    }

    #[distributed_lock(key = "acct:<self.tenant>", wait = "1s")]
    async fn deposit(&mut self, amount: u64) -> Result<u64, LockError> {
        assert!(held(&format!("acct:{}", self.tenant)).await);
        self.balance += amount;
        Ok(self.balance)
    }

    #[distributed_lock(key = "acct:<self.tenant>")]
    async fn shared(self: Arc<Self>) -> Result<u64, LockError> {
        assert!(held(&format!("acct:{}", self.tenant)).await);
        Ok(self.balance)
    }

    #[distributed_lock(key = "acct:<self.tenant>")]
    async fn close(mut self) -> Result<u64, LockError> {
        assert!(held(&format!("acct:{}", self.tenant)).await);
        let closing = self.balance;
        self.balance = 0;
        Ok(closing + self.balance)
    }
}

#[test]
fn methods_lock_on_fields_of_self_in_every_receiver_form() {
    block_on(async {
        let mut account = Account {
            tenant: "t1".into(),
            balance: 1,
        };
        assert_eq!(account.balance().await.unwrap(), 1);
        assert_eq!(account.deposit(2).await.unwrap(), 3);
        let account = Arc::new(account);
        assert_eq!(account.clone().shared().await.unwrap(), 3);
        let account = Arc::into_inner(account).unwrap();
        assert_eq!(account.close().await.unwrap(), 3);
        assert!(!held("acct:t1").await);
    });
}

// ---- generics and lifetimes ----------------------------------------------------------------

#[distributed_lock(key = "item:<id>")]
async fn generic<T, E>(id: T, value: T) -> Result<T, E>
where
    T: std::fmt::Display + Send,
    E: From<LockError>,
{
    assert!(held(&format!("item:{id}")).await);
    Ok(value)
}

#[distributed_lock(key = "user:<name>")]
async fn impl_trait(
    name: impl std::fmt::Display,
    items: impl IntoIterator<Item = u8>,
) -> Result<u32, LockError> {
    assert!(held(&format!("user:{name}")).await);
    Ok(items.into_iter().map(u32::from).sum())
}

#[distributed_lock(key = "slice:<name>")]
async fn borrowed<'a>(name: &'a str, rest: &[u8]) -> Result<&'a str, LockError> {
    assert!(held(&format!("slice:{name}")).await);
    Ok(&name[..rest.len()])
}

#[test]
fn generic_impl_trait_and_borrowing_fns_run() {
    block_on(async {
        assert_eq!(generic::<u8, LockError>(1, 2).await.unwrap(), 2);
        assert_eq!(impl_trait("ann", [1u8, 2]).await.unwrap(), 3);
        assert_eq!(borrowed("abc", &[0, 0]).await.unwrap(), "ab");
    });
}

// ---- traits --------------------------------------------------------------------------------

trait SendStore: Sync {
    fn save(&self, id: u64) -> impl Future<Output = Result<u64, LockError>> + Send;
}

struct Memory {
    tenant: &'static str,
}

impl SendStore for Memory {
    #[distributed_lock(key = "save:<self.tenant>:<id>")]
    async fn save(&self, id: u64) -> Result<u64, LockError> {
        assert!(held(&format!("save:{}:{id}", self.tenant)).await);
        Ok(id)
    }
}

#[test]
fn async_fn_in_trait_impl_keeps_its_future_send() {
    block_on(async {
        static STORE: Memory = Memory { tenant: "m" };
        // `tokio::spawn` requires the locked future to be `Send`.
        assert_eq!(tokio::spawn(STORE.save(5)).await.unwrap().unwrap(), 5);
    });
}

#[async_trait]
trait Store: Send + Sync {
    async fn load(&self, id: u64) -> Result<u64, LockError>;

    #[distributed_lock(key = "default:<id>")]
    async fn load_default(&self, id: u64) -> Result<u64, LockError> {
        assert!(held(&format!("default:{id}")).await);
        Ok(id)
    }
}

#[async_trait]
impl Store for Memory {
    #[distributed_lock(key = "load:<self.tenant>:<id>", lease = "10s")]
    async fn load(&self, id: u64) -> Result<u64, LockError> {
        assert!(held(&format!("load:{}:{id}", self.tenant)).await);
        if id == 0 {
            return Ok(0);
        }
        Ok(id * 2)
    }
}

#[test]
fn async_trait_methods_run_under_the_lock() {
    block_on(async {
        let store: Arc<dyn Store> = Arc::new(Memory { tenant: "a" });
        assert_eq!(store.load(0).await.unwrap(), 0);
        assert_eq!(store.load(4).await.unwrap(), 8);
        assert_eq!(store.load_default(6).await.unwrap(), 6);
        assert!(!held("load:a:4").await);
    });
}

#[async_trait]
trait Ledger: Send + Sync {
    async fn post(&self, entry: (String, u64), ref note: String) -> Result<u64, LockError>;
}

#[async_trait]
impl Ledger for Memory {
    #[distributed_lock(key = "post:<self.tenant>:<account>:<note>")]
    async fn post(
        &self,
        (account, amount): (String, u64),
        ref note: String,
    ) -> Result<u64, LockError> {
        assert!(held(&format!("post:{}:{account}:{note}", self.tenant)).await);
        Ok(amount)
    }
}

#[test]
fn an_async_trait_key_reads_names_bound_inside_patterns() {
    block_on(async {
        let ledger: Arc<dyn Ledger> = Arc::new(Memory { tenant: "l" });
        assert_eq!(
            ledger
                .post(("acct".to_owned(), 5), "n".to_owned())
                .await
                .unwrap(),
            5
        );
        assert!(!held("post:l:acct:n").await);
    });
}

// ---- return types, `return` and `?` --------------------------------------------------------

type AppResult<T> = Result<T, AppError>;

#[distributed_lock(key = "parse:<text>")]
async fn parse(text: &str) -> AppResult<u64> {
    if text.is_empty() {
        return Ok(0);
    }
    Ok(text.parse::<u64>()?)
}

#[distributed_lock(key = "file:<path>")]
async fn read_number(path: &str) -> anyhow::Result<u64> {
    // `?` converts `io::Error` and `ParseIntError` into `anyhow::Error`.
    let text = std::fs::read_to_string(path)?;
    Ok(text.trim().parse()?)
}

#[distributed_lock(key = "busy:<key>", wait = "0s")]
async fn busy(key: String) -> Result<(), AppError> {
    Ok(())
}

#[test]
fn early_return_and_question_mark_return_the_declared_error() {
    block_on(async {
        assert_eq!(parse("").await.unwrap(), 0);
        assert_eq!(parse("12").await.unwrap(), 12);
        assert!(matches!(parse("x").await, Err(AppError::Parse(e)) if !e.to_string().is_empty()));
        let error = read_number("/nonexistent/number").await.unwrap_err();
        assert!(error.downcast_ref::<std::io::Error>().is_some(), "{error}");
        assert!(!held("parse:x").await);
    });
}

#[distributed_lock(key = "busy:<key>")]
async fn hold_and_probe(key: &str) -> Result<bool, AppError> {
    // Another task (another owner) cannot take the key and gets the fn's own error type.
    let other = tokio::spawn(busy(key.to_owned())).await.unwrap();
    Ok(matches!(
        other,
        Err(AppError::Lock(LockError::Timeout { .. }))
    ))
}

#[test]
fn a_lock_failure_comes_back_through_from_lock_error() {
    block_on(async {
        assert!(hold_and_probe("b1").await.unwrap());
    });
}

// ---- reentrancy ----------------------------------------------------------------------------

#[distributed_lock(key = "reenter:<id>", wait = "1s")]
async fn outer(id: u64) -> Result<u64, LockError> {
    // Same key, awaited inside the body: the same owner re-enters instead of waiting.
    let inner = inner(id).await?;
    Ok(inner + 1)
}

#[distributed_lock(key = "reenter:<id>", wait = "1s")]
async fn inner(id: u64) -> Result<u64, LockError> {
    assert!(held(&format!("reenter:{id}")).await);
    Ok(id)
}

#[test]
fn nested_call_on_the_same_key_reenters() {
    block_on(async {
        assert_eq!(outer(9).await.unwrap(), 10);
        assert!(!held("reenter:9").await);
    });
}

// ---- many keys -----------------------------------------------------------------------------

struct Bank {
    tenant: String,
}

#[derive(Clone, Copy)]
struct Transfer {
    from: u64,
    to: u64,
}

impl Bank {
    #[distributed_lock(key = ["<self.tenant>:acct:<t.from>", "<self.tenant>:acct:<t.to>"], wait = "5s")]
    async fn transfer(&self, t: Transfer, amount: u64) -> Result<u64, LockError> {
        for id in [t.from, t.to] {
            assert!(held(&format!("{}:acct:{id}", self.tenant)).await);
        }
        assert_eq!(lock_runtime::fences().len(), 2);
        Ok(self.balance(t.to).await? + amount)
    }

    #[distributed_lock(key = "<self.tenant>:acct:<id>")]
    async fn balance(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

#[distributed_lock(key = ["many:<a>", "many:<b>", "many:<a>:<b>"], mode = "read")]
async fn read_many((a, b): (u8, u8)) -> Result<u8, LockError> {
    assert!(held(&format!("many:{a}:{b}")).await);
    Ok(a + b)
}

#[test]
fn a_list_of_keys_runs_holding_every_key_and_releases_them_all() {
    block_on(async {
        let bank = Bank {
            tenant: "t".to_owned(),
        };
        let there = Transfer { from: 2, to: 1 };
        let back = Transfer { from: 1, to: 2 };
        // Opposite orders at once: the keys are taken sorted, so both finish.
        let (a, b) = tokio::join!(bank.transfer(there, 10), bank.transfer(back, 20));
        assert_eq!((a.unwrap(), b.unwrap()), (11, 22));
        assert!(!held("t:acct:1").await && !held("t:acct:2").await);
        let (a, b) = tokio::join!(read_many((1, 2)), read_many((1, 2)));
        assert_eq!((a.unwrap(), b.unwrap()), (3, 3));
        assert!(!held("many:1").await && !held("many:1:2").await);
    });
}

// ---- non-Send bodies -----------------------------------------------------------------------

#[distributed_lock(key = "local:<id>")]
async fn local(id: u64) -> Result<usize, LockError> {
    let shared = Rc::new(id);
    tokio::task::yield_now().await;
    assert!(held(&format!("local:{id}")).await);
    Ok(Rc::strong_count(&shared))
}

#[test]
fn non_send_body_runs_on_a_local_set() {
    let set = tokio::task::LocalSet::new();
    let count =
        block_on(set.run_until(async { tokio::task::spawn_local(local(2)).await.unwrap() }));
    assert_eq!(count.unwrap(), 1);
}
