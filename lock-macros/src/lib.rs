//! The `#[distributed_lock]` attribute. Use it through `lock_runtime`, which re-exports it
//! and provides everything the expanded code calls.
//!
//! The attribute turns an `async fn` into one that runs its body holding a distributed lock.
//! Its arguments are checked at compile time: the key template against the fn's parameters,
//! durations against their syntax, the fn against the shapes that can hold a lock (`async`,
//! returning a `Result` whose error can carry a `LockError`). Each mistake is a compile error
//! at the offending token, and all of them are reported at once.
//!
//! # What it expands to
//!
//! Only the body changes. This:
//!
//! ```
//! # use lock_runtime::distributed_lock;
//! # struct Receipt; #[derive(Debug)] struct AppError;
//! # impl From<lock_runtime::LockError> for AppError { fn from(_: lock_runtime::LockError) -> Self { AppError } }
//! #[distributed_lock(key = "order:<id>", lease = "30s")]
//! pub async fn pay(id: u64, amount: u64) -> Result<Receipt, AppError> {
//!     // body
//! #   let _ = amount;
//!     Ok(Receipt)
//! }
//! ```
//!
//! expands to (generated bindings are hygienic; the names here are for reading):
//!
//! ```
//! # struct Receipt; #[derive(Debug)] struct AppError;
//! # impl From<lock_runtime::LockError> for AppError { fn from(_: lock_runtime::LockError) -> Self { AppError } }
//! pub async fn pay(id: u64, amount: u64) -> Result<Receipt, AppError> {
//!     ::lock_runtime::__private::locked_with(
//!         // The key borrows the arguments: nothing is cloned or moved yet.
//!         ::std::format!("order:{}", id),
//!         ::lock_runtime::__private::Options {
//!             lease: ::core::option::Option::Some(
//!                 ::lock_runtime::__private::Duration::from_millis(30000u64),
//!             ),
//!             ..::lock_runtime::__private::Options::DEFAULT
//!         },
//!         // `AppError: From<LockError>` is required here (at the return type), once.
//!         ::lock_runtime::__private::lift,
//!         async move {
//!             // Never taken: fixes the block's output type before the body is checked,
//!             // so `?` converts errors into `AppError` with no annotation.
//!             if let ::core::option::Option::Some(__lock_ret) =
//!                 ::core::option::Option::None::<Result<Receipt, AppError>>
//!             {
//!                 return __lock_ret;
//!             }
//!             // Take every argument, as a native `async fn` does: they drop at the end of
//!             // the body, in reverse order, while the lock is still held.
//!             let id = id;
//!             let _ = &id; // the key reads `id`: a use, even if the body makes none
//!             let amount = amount;
//!             {
//!                 // body
//! #               let _ = (id, amount);
//!                 Ok(Receipt)
//!             }
//!         },
//!     )
//!     .await
//! }
//! ```
//!
//! Attributes, doc comments, visibility, generics, `where` clauses and the signature are kept,
//! except where the body has to take a parameter the signature cannot hand over by name (see
//! `rebind.rs`): `mut` on a by-value parameter moves to its rebinding in the body; a `_`,
//! `ref`, `x @ pat` or destructuring parameter is bound to a hygienic `(__argN)` (moved, then
//! destructured in the body, as rustc itself lowers an `async fn`); a `_x` parameter's name
//! becomes hygienic; an `#[expect]` on a parameter moves to its binding in the body (the
//! parameter keeps it as an `#[allow]`). A key that reads a name bound inside such a pattern
//! destructures `__argN` first, by reference and in a block of its own
//! (`{ let (ref a, _) = __arg1; ::std::format!("pair:{}", a) }`, see `patterns.rs`), so
//! nothing is moved before the body takes it. The body's `return` and `?` return from the `async move` block, which is the
//! body future, so they work as in the original fn. Nothing is allocated besides the key
//! string: the body future is not boxed, and it is `Send` exactly when the original fn's
//! future was.
//!
//! The tokens the macro writes are located at the user's tokens they concern (the return
//! type, the key, a duration) but carry the macro's hygiene (`Span::call_site().located_at(…)`):
//! errors point at the user's code, while lints (`unused_qualifications`, `unreachable_code`,
//! clippy's pedantic ones) see generated code and leave it alone. The body's own braces get
//! such a span too: as the tail of the `async move` block, a one-expression body would
//! otherwise be a redundant block to `unused_braces`. The expansion allows no lint
//! (a crate's `#![forbid(…)]` would turn an allowance into an error) and names everything by
//! its full path (it compiles under `#[no_implicit_prelude]`). Arguments passed into a
//! `macro_rules!` as fragments (`key = $key`) are unwrapped from the invisible groups they
//! arrive in, and a key's placeholders resolve as the parameters they name, wherever the key
//! and the parameters were written.
//!
//! Inside an `#[async_trait]` impl, async-trait expands first and hands the attribute a
//! method whose body is `Box::pin(async move { … })`; the attribute then runs that inner
//! future under the lock
//! (`Box::pin(async move { locked_with(key, options, lift, inner).await })`).
//!
//! On any error, the original item is emitted unchanged next to the `compile_error!`s, so
//! code that calls the fn does not add "cannot find function" errors to the real ones.
//!
//! # Layout
//!
//! Parse, then check, then expand; each module depends only on the ones below it:
//!
//! - `lib.rs` runs the three steps.
//! - `check.rs` checks the arguments against the fn and builds the one `LockedFn` the
//!   expansion reads; it uses:
//!   - `args.rs`, the arguments parsed into `Args` (`duration.rs` parses `"1m30s"`);
//!   - `item.rs`, the fn parsed (signature only; the body stays raw tokens, so a typo in it
//!     is reported by rustc at the typo);
//!   - `async_trait.rs`, which recognises a method `#[async_trait]` has already rewritten;
//!   - `template.rs`, the key parsed and checked against the parameters;
//!   - `keys.rs`, a list of keys (`key = ["a:<x>", "b:<y>"]`) read into its templates (for
//!     `args.rs`), and kept to different keys;
//!   - `nesting.rs`, the write requests of its own key that a read fn's body takes.
//! - `expand.rs` writes the new fn from a `LockedFn` alone, with `rebind.rs` moving the
//!   parameters into its body.
//! - At the bottom, used by several: `patterns.rs` (the names a parameter's pattern binds,
//!   and the pattern the key reads them through), `errors.rs` (errors collected, not stopped at),
//!   `suggest.rs` ("did you mean"), `spans.rs` (where generated tokens point) and
//!   `written.rs` (tokens quoted in messages).

use proc_macro::TokenStream;
use proc_macro2::Span;

use crate::args::Args;
use crate::errors::Errors;

mod args;
mod async_trait;
mod check;
mod duration;
mod errors;
mod expand;
mod fragments;
mod item;
mod keys;
mod nesting;
mod patterns;
mod permits;
mod rebind;
mod spans;
mod suggest;
mod template;
mod written;

/// Runs an `async fn`'s body holding a distributed lock named by its arguments.
///
/// Each call waits for the lock `key`, runs the body while a watchdog keeps the lease alive,
/// then releases it (also when the call is cancelled or panics). A nested call awaited inside
/// the body that asks for a key this call already holds re-enters it instead of waiting.
/// When the lock cannot be taken or is lost, the fn returns `Err(E::from(LockError))`, so
/// the fn must return a `Result<T, E>` with `E: From<LockError>`: `LockError` itself,
/// `anyhow::Error`, or your error type with a `#[from] LockError` variant. The runtime must
/// be installed first (`LockRuntime::builder()…build().await?.install()?`).
///
/// # Arguments
///
/// | argument | value | default |
/// |---|---|---|
/// | `key` | template: text with `<param>` / `<param.field>` placeholders (required); or a list of them, `["a:<x>", "b:<y>"]` (below) | — |
/// | `lease` | `"30s"`, `"1m30s"`, `"500ms"`; or an expression of type `Duration` | runtime's (30 s) |
/// | `wait` | same; `"0s"` tries once | runtime's (30 s unless configured) |
/// | `watchdog` | `true`, `false`: `false` keeps a fixed lease that is not renewed | `true` |
/// | `on_lost` | `"abort"`: drop the body, return `Err(LockError::Lost)`; `"continue"`: finish it; `"confirm"`: abort, and wait for the release's answer (a hold it finds gone is `Err(LockError::Lost)` too; one more round trip) | `"abort"` |
/// | `fair` | `true`: first come, first served across processes (below); `false`: plain | runtime's (`true` on Redis) |
/// | `mode` | `"read"`: shared with other readers, excludes writers; `"write"`: excludes readers and writers; `"exclusive"`: the same lock as `"write"` (below) | `"exclusive"` |
/// | `permits` | how many calls may hold the key at once: `4`, or a `u32` constant (below) | one holder |
/// | `crate` | path of `lock_runtime` when it is renamed or re-exported | `::lock_runtime` |
///
/// **Key.** `<id>` formats the parameter `id` with `Display`; `<req.order_id>`,
/// `<pair.0>` and `<self.tenant>` follow fields. The key is built from references before the
/// body runs, so no argument is cloned or moved. `<<` is a literal `<`, `{{` a literal `{`
/// and `}}` a literal `}` (as in `format!`); `>` and single braces are literal text. A
/// placeholder starts at any name a parameter binds, as the body sees it: `<id>` for
/// `mut id`, `ref id` or `ref mut id`, `<a>` for `(a, b): (A, B)`, `<left.0>` for
/// `Pair { left, .. }: Pair`, `<all>` and `<x>` for `all @ (x, _)`, `<self.tenant>` for any
/// receiver. (Not inside a pattern written by a macro, `m!(x): T`: what it binds is only
/// known once it expands, after this attribute.)
/// `format!`'s spelling of a placeholder is refused when it names a parameter:
/// `key = "order:{id}"` would lock the text `order:{id}` for every order, so it is a compile
/// error that says to write `<id>`; the literal text `{id}` is written `{{id}}`.
///
/// **Parameters** are dropped as a native `async fn` drops them, and while the lock is held:
/// every parameter (named, `_`, `_x`, destructured, by-value `self`) moves into the body and
/// is dropped at its end, after the body's own locals, in reverse order of declaration
/// (a destructured parameter's bindings first, then what the pattern left in it). So a
/// guard or a connection passed in is released before the lock is. A parameter's `cfg` and
/// lint attributes (`#[cfg(feature = "x")]`, `#[allow(unused_variables)]`, `#[expect(…)]`)
/// apply to the binding the body uses. rustdoc shows a `_` or destructuring parameter as
/// `__argN`: the signature binds it to that name so that the body can take it.
///
/// **Other attributes** expand in order, top first. Put `#[distributed_lock]` above an
/// attribute that turns the `async fn` into something else (`#[tokio::test]`,
/// `#[tokio::main]`), so that it locks the `async fn` before the other one makes it
/// blocking. `#[tracing::instrument]` works above it (its span is then inside the lock) and
/// below it (its span then covers the wait for the lock too; below, it records no field for a
/// destructuring parameter, as for `_`).
///
/// **Durations** are checked at compile time: units `ms`, `s`, `m`, `h`, combined from the
/// largest (`"1h30m"`, `"1s500ms"`). A lease is between 10ms and 24h.
///
/// **Fair** (`fair = true`) is first come, first served across processes. With Redis, a
/// waiter that finds the lock busy joins a queue in Redis, and a release hands the lock
/// straight to the first live waiter (no acquire round trip after a release). The price: a
/// waiting process refreshes its place once a second, and a waiter that dies while queued may
/// be handed the lock in the 3 s before its place runs out; the key then stays taken for the
/// handoff's claim (at most 3 s; the whole lease with `watchdog = false`). Use the same mode
/// for every caller of a key. Without the argument the
/// runtime's default applies (`LockRuntimeBuilder::fair`, `DEFAULT_FAIR`); by hand, the same
/// is `LockRequest::fair`. The embedded backend always serves waiters in order: there `fair`
/// is accepted and changes nothing.
///
/// **Mode** (`mode = "read"`) makes a read lock: any number of readers hold the key at once,
/// across processes, while a writer (`mode = "write"`, or the default `"exclusive"`, which
/// is the same lock) excludes them all. A read nested in a read or write hold of the same key
/// re-enters it; a write nested in a read hold is an upgrade, refused at once with
/// `Err(LockError::UpgradeRefused)` (two readers upgrading together would wait for each other
/// for ever): take the write lock in the outer call. Where the body of a read fn itself asks
/// its own key for writing (`lock(format!("cfg:{}", tenant)).acquire()`, or the literal key,
/// then `.acquire()`, `.try_acquire()` or `with_lock`, without `.read()`), that is a compile
/// error. The check compares names, not bindings: a local that shadows a parameter and is
/// formatted into the same key text is taken for the parameter. By hand, the same is
/// `LockRequest::read` / `write` / `mode`.
///
/// **Permits** (`permits = 4`, or `permits = SEGMENTS` for a `const SEGMENTS: u32`): up to
/// that many calls hold the key at once, across processes, each with a permit index of its
/// own that `lock_runtime::permit()` returns in the body (`0..N`, the same for the whole
/// body): split a hot item's stock over N counters and let each call work on counter
/// `permit()`. A nested call on the same key re-enters its caller's permit. A literal count
/// is checked here (1 to 1024), a constant when it is evaluated; a value known only at run
/// time is refused by the compiler (use `LockRequest::permits` by hand). Permits take one
/// key, in exclusive mode: with `mode = "read"` or `"write"`, or a list of keys, it is a
/// compile error.
///
/// **Many keys** (`key = ["account:<from>", "account:<to>"]`, a trailing comma allowed): one
/// call holds every key of the list, each a template as above, checked and reported at its
/// own literal. The keys are formatted first, then taken in one order, sorted by their text
/// (two templates that format alike are one key), all or none within one `wait`: two calls
/// that share keys never wait for each other for ever, whatever order their lists give.
/// Every other argument applies to each key (a multi-key read lock is fine, and the upgrade
/// check above covers each key); one key lost is the call lost. Inside the body a nested call
/// re-enters any of the keys and may take a key sorting after all of them; a key sorting
/// before one of them, not held, is `Err(LockError::OrderRefused)` at once (waiting for it
/// could deadlock): list it in the outer call. `lock_runtime::fences()` gives each key's
/// fencing token. The expansion calls `__private::locked_many_with(::std::vec![key1, key2],
/// …)`, each key built as a single key is; a list of one key is that key. By hand, the same
/// is `with_locks(lock_many([…]), body)`.
///
/// # Examples
///
/// A key from a parameter, a lease and a bounded wait; a nested call on the same key
/// re-enters:
///
/// ```
/// use lock_runtime::{distributed_lock, LockError, LockRuntime};
///
/// #[distributed_lock(key = "order:<id>", lease = "30s", wait = "5s")]
/// async fn pay(id: u64, amount: u64) -> Result<u64, LockError> {
///     let refunded = refund(id).await?; // same key, inside the body: re-enters
///     Ok(amount - refunded)
/// }
///
/// #[distributed_lock(key = "order:<id>")]
/// async fn refund(id: u64) -> Result<u64, LockError> {
///     Ok(id % 10)
/// }
///
/// #[tokio::main]
/// async fn main() -> Result<(), LockError> {
///     LockRuntime::builder().memory().build().await?.install()?;
///     assert_eq!(pay(42, 100).await?, 98);
///     Ok(())
/// }
/// ```
///
/// Fields of arguments and of `self`, your own error type, and `?` inside the body:
///
/// ```
/// use lock_runtime::{distributed_lock, LockError, LockRuntime};
///
/// #[derive(Debug)]
/// enum AppError {
///     Lock(LockError),
///     Parse(std::num::ParseIntError),
/// }
/// impl From<LockError> for AppError {
///     fn from(e: LockError) -> Self { AppError::Lock(e) }
/// }
/// impl From<std::num::ParseIntError> for AppError {
///     fn from(e: std::num::ParseIntError) -> Self { AppError::Parse(e) }
/// }
///
/// struct Request { order_id: u64, quantity: String }
/// struct Shop { tenant: String }
///
/// impl Shop {
///     #[distributed_lock(key = "<self.tenant>:order:<req.order_id>")]
///     async fn reserve(&self, req: &Request) -> Result<u64, AppError> {
///         let quantity: u64 = req.quantity.parse()?; // ParseIntError -> AppError
///         Ok(quantity)
///     }
/// }
///
/// #[tokio::main]
/// async fn main() -> Result<(), AppError> {
///     LockRuntime::builder().memory().build().await?.install()?;
///     let shop = Shop { tenant: "acme".into() };
///     let req = Request { order_id: 7, quantity: "3".into() };
///     assert_eq!(shop.reserve(&req).await?, 3);
///     assert!(matches!(
///         shop.reserve(&Request { order_id: 7, quantity: "x".into() }).await,
///         Err(AppError::Parse(_))
///     ));
///     Ok(())
/// }
/// ```
///
/// `wait = "0s"` tries once; a busy lock is `Err(LockError::Timeout)`. `watchdog = false`
/// keeps a fixed lease, and `on_lost = "continue"` lets the body finish if the lock is lost:
///
/// ```
/// use lock_runtime::{distributed_lock, LockError, LockRuntime};
///
/// #[distributed_lock(key = "report", wait = "0s")]
/// async fn try_report() -> Result<&'static str, LockError> {
///     Ok("done")
/// }
///
/// #[distributed_lock(key = "report", lease = "2s", watchdog = false, on_lost = "continue")]
/// async fn report() -> Result<bool, LockError> {
///     // Another task is another owner: it finds the lock busy.
///     let other = tokio::spawn(try_report()).await.expect("task");
///     Ok(matches!(other, Err(LockError::Timeout { .. })))
/// }
///
/// #[tokio::main]
/// async fn main() -> Result<(), LockError> {
///     LockRuntime::builder().memory().build().await?.install()?;
///     assert!(report().await?);
///     assert_eq!(try_report().await?, "done"); // free again
///     Ok(())
/// }
/// ```
///
/// `fair = true` serves the waiters for a key in arrival order; give it on every fn that
/// locks the same keys:
///
/// ```
/// use lock_runtime::{distributed_lock, LockError, LockRuntime};
///
/// #[distributed_lock(key = "seat:<seat>", wait = "10s", fair = true)]
/// async fn book(seat: u32, who: &'static str) -> Result<&'static str, LockError> {
///     Ok(who)
/// }
///
/// #[tokio::main]
/// async fn main() -> Result<(), LockError> {
///     LockRuntime::builder().memory().build().await?.install()?;
///     let (ann, bob) = tokio::join!(book(1, "ann"), book(1, "bob"));
///     assert_eq!((ann?, bob?), ("ann", "bob"));
///     Ok(())
/// }
/// ```
///
/// A reader and a writer of one key. The writer may read what it writes (the read re-enters
/// its write hold); a reader that calls a writer of its key gets
/// `Err(LockError::UpgradeRefused)` at once:
///
/// ```
/// use lock_runtime::{distributed_lock, LockError, LockRuntime};
///
/// #[distributed_lock(key = "cfg:<tenant>", mode = "read")]
/// async fn config(tenant: u64) -> Result<u64, LockError> {
///     Ok(tenant * 10)
/// }
///
/// #[distributed_lock(key = "cfg:<tenant>", mode = "write")]
/// async fn bump(tenant: u64) -> Result<u64, LockError> {
///     Ok(config(tenant).await? + 1)
/// }
///
/// #[distributed_lock(key = "cfg:<tenant>", mode = "read")]
/// async fn check_then_bump(tenant: u64) -> Result<u64, LockError> {
///     bump(tenant).await // a write inside this read hold: an upgrade, refused
/// }
///
/// #[tokio::main]
/// async fn main() -> Result<(), LockError> {
///     LockRuntime::builder().memory().build().await?.install()?;
///     let (a, b) = tokio::join!(config(1), config(1)); // readers share the key
///     assert_eq!((a?, b?), (10, 10));
///     assert_eq!(bump(1).await?, 11);
///     assert!(matches!(
///         check_then_bump(1).await,
///         Err(LockError::UpgradeRefused { .. })
///     ));
///     Ok(())
/// }
/// ```
///
/// Many keys: both accounts of a transfer, taken in one order whatever the arguments' order;
/// a nested call re-enters one of them, and one on a key that sorts before them is refused:
///
/// ```
/// use lock_runtime::{distributed_lock, fences, LockError, LockRuntime};
///
/// #[distributed_lock(key = ["account:<from>", "account:<to>"], lease = "10s")]
/// async fn transfer(from: u64, to: u64, amount: u64) -> Result<u64, LockError> {
///     assert_eq!(fences().len(), 2); // a fencing token per key
///     Ok(balance(from).await? - amount) // one of the keys: re-enters
/// }
///
/// #[distributed_lock(key = "account:<id>")]
/// async fn balance(id: u64) -> Result<u64, LockError> {
///     Ok(100 + id)
/// }
///
/// #[distributed_lock(key = ["account:<from>", "account:<to>"])]
/// async fn with_fee(from: u64, to: u64) -> Result<u64, LockError> {
///     balance(0).await // `account:0` sorts before both held keys: refused
/// }
///
/// #[tokio::main]
/// async fn main() -> Result<(), LockError> {
///     LockRuntime::builder().memory().build().await?.install()?;
///     // Opposite orders at once: both take `account:1` first, so they cannot deadlock.
///     let (a, b) = tokio::join!(transfer(1, 2, 30), transfer(2, 1, 50));
///     assert_eq!((a?, b?), (71, 52));
///     assert!(matches!(with_fee(5, 7).await, Err(LockError::OrderRefused { .. })));
///     Ok(())
/// }
/// ```
///
/// Durations as expressions, and `crate` for a re-exported runtime:
///
/// ```
/// use std::time::Duration;
///
/// mod deps {
///     pub use lock_runtime as locks;
/// }
/// use deps::locks::{distributed_lock, LockError, LockRuntime};
///
/// const LEASE: Duration = Duration::from_secs(10);
///
/// #[distributed_lock(key = "job:<name>", lease = LEASE, wait = Duration::from_millis(500), crate = "deps::locks")]
/// async fn job(name: &str) -> anyhow::Result<usize> {
///     Ok(name.len())
/// }
///
/// #[tokio::main]
/// async fn main() -> anyhow::Result<()> {
///     LockRuntime::builder().memory().build().await?.install()?;
///     assert_eq!(job("nightly").await?, 7);
///     Ok(())
/// }
/// ```
///
/// Methods of an `#[async_trait]` impl: keep `#[async_trait]` on the impl and put the
/// attribute on the method (async-trait expands first; the attribute locks its future).
/// (Not compiled here: `async-trait` is not a dependency of this crate; the same code runs in
/// the workspace's `ui-tests`.)
///
/// ```ignore
/// use async_trait::async_trait;
/// use lock_runtime::{distributed_lock, LockError, LockRuntime};
///
/// #[async_trait]
/// trait Store: Send + Sync {
///     async fn load(&self, id: u64) -> Result<u64, LockError>;
/// }
///
/// struct Memory;
///
/// #[async_trait]
/// impl Store for Memory {
///     #[distributed_lock(key = "load:<id>")]
///     async fn load(&self, id: u64) -> Result<u64, LockError> {
///         Ok(id)
///     }
/// }
///
/// #[tokio::main]
/// async fn main() -> Result<(), LockError> {
///     LockRuntime::builder().memory().build().await?.install()?;
///     let store: Box<dyn Store> = Box::new(Memory);
///     assert_eq!(store.load(3).await?, 3);
///     Ok(())
/// }
/// ```
///
/// # Compile errors
///
/// A missing `key`, or a key given as a bare string; an unknown or repeated argument; a
/// placeholder that names no parameter (or a name bound inside a macro pattern), is empty or
/// unclosed; a `{name}` that names a parameter (each of these for each key of a list); an
/// empty list of keys (`key = []`), one with an element that is not a string literal, or that
/// names the same key twice; a malformed duration, a lease out of range;
/// a bad `watchdog`, `on_lost`, `fair` or `mode` value, or a mode written as an argument of
/// its own (`read`); in a `mode = "read"` fn, a write of its own key that the body asks
/// itself (above); a fn that is not `async` (also one that an attribute above this one
/// already made blocking), has no body, or returns something that is not a `Result`; the
/// attribute on anything but a fn.
/// A `Result` whose error type has no `From<LockError>` is reported by the type checker at the
/// return type.
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = proc_macro2::TokenStream::from(item);
    match lock(args.into(), item.clone()) {
        Ok(expanded) => expanded.into(),
        Err(errors) => {
            // Keep the item, so that its users compile and only the attribute's errors show.
            // Allowed its `unused` lints: the parameters that only the key reads would
            // otherwise be reported unused (and `mut` ones needlessly mutable) beside the
            // real mistake, and the item's own warnings can wait until it compiles.
            let errors = errors.to_compile_error();
            quote::quote!(#[allow(unused)] #item #errors).into()
        }
    }
}

/// `#[distributed_lock(args)] item`: parsed, checked, expanded; or every error found.
fn lock(
    args: proc_macro2::TokenStream,
    item: proc_macro2::TokenStream,
) -> syn::Result<proc_macro2::TokenStream> {
    let mut errors = Errors::default();
    // For an attribute macro the call site is the attribute itself.
    let args = Args::parse(args, Span::call_site(), &mut errors);
    let item = item::parse(item);
    let locked = check::check(args, item, errors)?;
    Ok(expand::expand(locked))
}
