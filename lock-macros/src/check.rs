//! The arguments checked against the fn, into one [`LockedFn`]: all that `expand.rs` needs.
//!
//! Parsing (`args.rs`, `item.rs`) reads each piece on its own; this module checks what only
//! the pieces together can tell: that the fn is `async` (or an `#[async_trait]` method),
//! that it returns a `Result`, and that each key's placeholders name its parameters (and,
//! for a list of keys, that no two name the same key: `keys.rs`). Every
//! mistake is reported, in the order the user reads them: the arguments', then the fn's,
//! then the key's. Only a fn with none becomes a [`LockedFn`], so the expansion never meets
//! a case it has to refuse.
//!
//! The types of a [`LockedFn`]'s parts are re-exported here, so that `expand.rs` depends on
//! this module alone.

use proc_macro2::{Delimiter, Group, Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::{Ident, LitStr, Path, ReturnType, Signature, Type};

pub(crate) use crate::args::{DurationArg, Mode, OnLost, Options, PermitsArg};
pub(crate) use crate::async_trait::AsyncTraitBody;
pub(crate) use crate::item::LockFn;
pub(crate) use crate::template::Template;

use crate::args::Args;
use crate::async_trait;
use crate::errors::Errors;
use crate::keys::{self, Keys};
use crate::nesting;
use crate::template::Params;
use crate::written::written;

/// A fn the attribute can lock, checked, with everything its expansion needs.
pub(crate) struct LockedFn {
    /// The fn as written, its body split into what runs under the lock.
    pub item: LockFn<Body>,
    /// The type the fn's future outputs, as declared; `None` after `#[async_trait]` when
    /// its return type has an unexpected form.
    pub output: Option<Type>,
    /// The keys, each checked against the parameters, in the order written; never empty.
    /// One is `key = "…"` (or a list of one), more a list.
    pub keys: Vec<Template>,
    /// How the lock is taken and held.
    pub options: Options,
    /// The runtime crate: `::lock_runtime` unless `crate = "…"` says otherwise.
    pub krate: Path,
}

/// What runs under the lock.
pub(crate) enum Body {
    /// The `async fn`'s own body, braces included.
    Block(Group),
    /// The body `#[async_trait]` wrote for the method: its boxed future runs under the lock.
    AsyncTrait(AsyncTraitBody),
}

/// Checks `args` against the fn the item parsed into (or failed to). `errors` holds what
/// parsing the arguments found; every error is returned, in the order found.
pub(crate) fn check(
    args: Args,
    item: syn::Result<LockFn>,
    mut errors: Errors,
) -> syn::Result<LockedFn> {
    let item = match item {
        Ok(item) => item.map_body(|sig, body| check_async(sig, body, &mut errors)),
        Err(error) => return Err(errors.fail(error)),
    };
    let sig = &item.sig;
    let output = output_type(sig, &item.body).cloned();
    // After #[async_trait], a return type of another form is left to the type checker.
    if matches!(item.body, Body::Block(_)) || output.is_some() {
        errors.take(check_returns_result(
            &sig.ident,
            output.as_ref(),
            sig.paren_token.span.close(),
        ));
    }
    let keys = match args.key {
        Ok(keys) => keys,
        Err(reported) => return Err(errors.stop(reported)),
    };
    let keys = templates(keys, &item, &mut errors);
    if let Some(permits) = &args.options.permits {
        errors.take(permits_apply(permits, args.options.mode, keys.len()));
    }
    let krate = args
        .krate
        .unwrap_or_else(|| syn::parse_quote!(::lock_runtime));
    if args.options.mode == Some(Mode::Read) {
        for error in upgrades(&item.body, &keys, &krate) {
            errors.push(error);
        }
    }
    errors.finish(LockedFn {
        item,
        output,
        keys: keys.into_iter().map(|(_, key)| key).collect(),
        options: args.options,
        krate,
    })
}

/// `permits = N` with the other arguments: one key, exclusive mode.
fn permits_apply(permits: &PermitsArg, mode: Option<Mode>, keys: usize) -> syn::Result<()> {
    let refused = match mode {
        Some(Mode::Read) => Some(
            "`permits` does not apply to `mode = \"read\"`: readers already share the key; \
             drop one of the two",
        ),
        Some(Mode::Write) => Some(
            "`permits` does not apply to `mode = \"write\"`: each permit is an exclusive hold \
             of its own; drop `mode`",
        ),
        _ if keys > 1 => Some(
            "`permits` applies to one key: a list of keys is taken all together, each by one \
             holder; give one key, or take each key's permits in a call of its own",
        ),
        _ => None,
    };
    match refused {
        Some(message) => Err(syn::Error::new(permits.span(), message)),
        None => Ok(()),
    }
}

/// Each key's template checked against the parameters of `item`, with its literal; the
/// errors of the bad ones (and of a key listed twice) are added to `errors`.
fn templates(keys: Keys, item: &LockFn<Body>, errors: &mut Errors) -> Vec<(LitStr, Template)> {
    let destructured = match &item.body {
        Body::AsyncTrait(body) => body.destructured(),
        Body::Block(_) => Vec::new(),
    };
    let params = Params::of(&item.sig, &destructured);
    let checked = keys
        .0
        .into_iter()
        .filter_map(|lit| {
            let template = Template::new(&lit.value(), lit.span(), &params, &item.sig.ident);
            errors.take(template).map(|template| (lit, template))
        })
        .collect();
    keys::distinct(checked, errors)
}

/// The write (or exclusive) requests of the fn's own keys (each with its literal) that the
/// body of a read fn takes, in the order written (see `nesting.rs`).
fn upgrades(body: &Body, keys: &[(LitStr, Template)], krate: &Path) -> Vec<syn::Error> {
    let (tokens, self_name) = match body {
        Body::Block(block) => (block.stream(), "self"),
        // async-trait renames the body's `self`.
        Body::AsyncTrait(body) => (body.future.block.to_token_stream(), "__self"),
    };
    let spelled: Vec<(String, Vec<String>, String)> = keys
        .iter()
        .map(|(lit, key)| (key.format_string(), key.value_paths(), lit.value()))
        .collect();
    let keys: Vec<nesting::Key<'_>> = spelled
        .iter()
        .map(|(format, values, written)| nesting::Key {
            format,
            values,
            written,
        })
        .collect();
    let krate: Vec<String> = krate
        .segments
        .iter()
        .map(|segment| segment.ident.to_string())
        .collect();
    nesting::upgrades(
        tokens,
        &keys,
        &nesting::Context {
            krate: &krate,
            self_name,
        },
    )
}

/// The body to run under the lock: an `async fn`'s own, or the future of an
/// `#[async_trait]` method. Any other fn is an error.
fn check_async(sig: &Signature, body: Group, errors: &mut Errors) -> Body {
    if sig.asyncness.is_some() {
        return Body::Block(body);
    }
    if let Some(boxed) = AsyncTraitBody::recognise(&body) {
        return Body::AsyncTrait(boxed);
    }
    let message = if blocks_on_async_block(&body) {
        // The user wrote `async fn`, and an attribute above this one (`#[tokio::test]`,
        // `#[tokio::main]`) expanded first and turned it into a blocking fn.
        format!(
            "#[distributed_lock] got `{name}` as a blocking `fn` that runs an async block \
             with `block_on`: an attribute above it (such as #[tokio::test] or \
             #[tokio::main]) expanded first and made the `async fn` non-async; put \
             #[distributed_lock] above that attribute, so that it runs first and locks the \
             `async fn` itself",
            name = sig.ident
        )
    } else {
        format!(
            "#[distributed_lock] needs an `async fn`: the lock is held across the body's \
             `.await`s and released when it completes; write `async fn {}`",
            sig.ident
        )
    };
    errors.push(syn::Error::new(sig.fn_token.span, message));
    Body::Block(body)
}

/// The type the fn's future outputs: the declared return type of an `async fn`, `T` in the
/// `Pin<Box<dyn Future<Output = T> …>>` that `#[async_trait]` declares.
fn output_type<'a>(sig: &'a Signature, body: &Body) -> Option<&'a Type> {
    match (body, &sig.output) {
        (Body::AsyncTrait(_), declared) => async_trait::future_output(declared),
        (Body::Block(_), ReturnType::Type(_, ty)) => Some(ty),
        (Body::Block(_), ReturnType::Default) => None,
    }
}

/// True when `body` looks like the output of a runtime's entry-point attribute: an `async`
/// block and a `block_on` call (`#[tokio::test]` and `#[tokio::main]` write
/// `let body = async { … }; … .block_on(body)`, async-std and actix similar bodies). Only
/// asked for fns that are not `async`, to explain why they are not.
fn blocks_on_async_block(body: &Group) -> bool {
    fn find(tokens: TokenStream, found: &mut (bool, bool)) {
        let mut tokens = tokens.into_iter().peekable();
        while let Some(tree) = tokens.next() {
            match tree {
                TokenTree::Ident(ident) if ident == "async" => {
                    let block_follows = match tokens.peek() {
                        Some(TokenTree::Group(group)) => group.delimiter() == Delimiter::Brace,
                        Some(TokenTree::Ident(next)) => next == "move",
                        _ => false,
                    };
                    found.0 |= block_follows;
                }
                TokenTree::Ident(ident) if ident == "block_on" => {
                    found.1 |= matches!(tokens.peek(), Some(TokenTree::Group(group))
                        if group.delimiter() == Delimiter::Parenthesis);
                }
                TokenTree::Group(group) => find(group.stream(), found),
                _ => {}
            }
        }
    }
    let mut found = (false, false);
    find(body.stream(), &mut found);
    found == (true, true)
}

/// Last path segments that are well known not to be a `Result`.
const NOT_RESULT: &[&str] = &[
    "Option",
    "String",
    "str",
    "Vec",
    "VecDeque",
    "Box",
    "Rc",
    "Arc",
    "Cow",
    "HashMap",
    "HashSet",
    "BTreeMap",
    "BTreeSet",
    "Duration",
    "Instant",
    "SystemTime",
    "bool",
    "char",
    "u8",
    "u16",
    "u32",
    "u64",
    "u128",
    "usize",
    "i8",
    "i16",
    "i32",
    "i64",
    "i128",
    "isize",
    "f32",
    "f64",
];

/// Checks, by syntax only, that `output` can be a `Result`. Any path not known to be something
/// else is accepted (`io::Result<T>`, `anyhow::Result<T>`, a user alias); the type system then
/// checks the rest through the runtime's `E: From<LockError>` bound. `close_paren` is where to
/// point when there is no return type at all.
fn check_returns_result(
    fn_name: &Ident,
    output: Option<&Type>,
    close_paren: Span,
) -> syn::Result<()> {
    let why =
        "the lock can fail (timeout, lost lease, backend error) and that failure is returned \
               as `Err(E::from(LockError))`";
    let ty = match output {
        None => {
            return Err(syn::Error::new(
                close_paren,
                format!(
                    "`{fn_name}` must return a `Result<T, E>` whose error type can hold a `LockError` \
                     (`E: From<LockError>`): {why}; add a return type such as `-> Result<(), AppError>`"
                ),
            ))
        }
        Some(ty) => ty,
    };
    if let Some(found) = not_result(ty) {
        return Err(syn::Error::new_spanned(
            ty,
            format!(
                "`{fn_name}` returns {found}, but it must return a `Result<T, E>` whose error type can \
                 hold a `LockError` (`E: From<LockError>`): {why}"
            ),
        ));
    }
    Ok(())
}

/// A description of `ty` when it certainly is not a `Result`.
fn not_result(ty: &Type) -> Option<String> {
    let written = || format!("`{}`", written(ty));
    match ty {
        Type::Paren(inner) => not_result(&inner.elem),
        Type::Group(inner) => not_result(&inner.elem),
        Type::Tuple(tuple) if tuple.elems.is_empty() => Some("`()`".to_owned()),
        Type::Path(path) if path.qself.is_none() => {
            let last = path.path.segments.last()?;
            NOT_RESULT
                .contains(&last.ident.to_string().as_str())
                .then(written)
        }
        Type::Path(_) | Type::Macro(_) | Type::Verbatim(_) => None,
        Type::Reference(_) => Some(format!("a reference {}", written())),
        Type::Tuple(_) => Some(format!("a tuple {}", written())),
        Type::Never(_) => Some("`!`".to_owned()),
        Type::ImplTrait(_) => Some(format!("an opaque type {}", written())),
        _ => Some(written()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use quote::quote;

    fn returns(tokens: TokenStream) -> Result<(), String> {
        let sig: Signature = syn::parse2(tokens).unwrap();
        let output = match &sig.output {
            ReturnType::Default => None,
            ReturnType::Type(_, ty) => Some(&**ty),
        };
        check_returns_result(&sig.ident, output, Span::call_site()).map_err(|e| e.to_string())
    }

    #[test]
    fn result_like_paths_are_accepted() {
        assert!(returns(quote!(fn f() -> Result<u8, E>)).is_ok());
        assert!(returns(quote!(fn f() -> anyhow::Result<u8>)).is_ok());
        assert!(returns(quote!(fn f() -> io::Result<()>)).is_ok());
        assert!(returns(quote!(fn f() -> MyResult<Self>)).is_ok());
        assert!(returns(quote!(fn f() -> <T as Tr>::Out)).is_ok());
    }

    #[test]
    fn known_non_results_are_refused() {
        assert!(returns(quote!(fn f()))
            .unwrap_err()
            .contains("add a return type"));
        assert!(returns(quote!(fn f() -> ()))
            .unwrap_err()
            .contains("returns `()`"));
        assert!(returns(quote!(fn f() -> Option<u8>))
            .unwrap_err()
            .contains("returns `Option<u8>`"));
        assert!(returns(quote!(fn f() -> std::string::String)).is_err());
        assert!(returns(quote!(fn f() -> u64)).is_err());
        assert!(returns(quote!(fn f() -> (u8, E)))
            .unwrap_err()
            .contains("a tuple"));
        assert!(returns(quote!(fn f() -> &'static str))
            .unwrap_err()
            .contains("a reference"));
        assert!(returns(quote!(fn f() -> impl Sized))
            .unwrap_err()
            .contains("opaque"));
    }

    #[test]
    fn runtime_entry_point_bodies_are_recognised() {
        let body = |tokens| Group::new(Delimiter::Brace, tokens);
        // What #[tokio::test] writes.
        assert!(blocks_on_async_block(&body(quote! {
            let body = async { Ok(()) };
            ::tokio::pin!(body);
            let body: ::core::pin::Pin<&mut dyn ::core::future::Future<Output = R>> = body;
            #[allow(clippy::expect_used)]
            {
                return tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("Failed building the Runtime")
                    .block_on(body);
            }
        })));
        assert!(blocks_on_async_block(&body(quote!(
            async_std::task::block_on(async move { f().await })
        ))));
        assert!(!blocks_on_async_block(&body(quote!(Ok(id)))));
        assert!(!blocks_on_async_block(&body(quote!(rt.block_on(fut)))));
        assert!(!blocks_on_async_block(&body(
            quote!(let r#async = 1; block_on(r#async))
        )));
    }

    fn errors(args: TokenStream, item: TokenStream) -> Vec<String> {
        crate::lock(args, item)
            .err()
            .unwrap()
            .into_iter()
            .map(|e| e.to_string())
            .collect()
    }

    #[test]
    fn errors_from_arguments_and_fn_are_combined() {
        // In the order found: the arguments' (a missing key among them), the fn's, the key's.
        let cases = [
            (
                quote!(key = "<nope>", lease = "1x"),
                [
                    "invalid duration",
                    "needs an `async fn`",
                    "returns `u64`",
                    "placeholder `<nope>` names no parameter",
                ],
            ),
            (
                quote!(lease = "1x"),
                [
                    "invalid duration",
                    "missing `key`",
                    "needs an `async fn`",
                    "returns `u64`",
                ],
            ),
        ];
        for (args, expected) in cases {
            let found = errors(
                args,
                quote!(
                    fn f() -> u64 {
                        1
                    }
                ),
            );
            assert_eq!(found.len(), expected.len(), "{found:?}");
            for (found, expected) in found.iter().zip(expected) {
                assert!(found.contains(expected), "{found}");
            }
        }
    }

    #[test]
    fn only_a_read_fn_is_checked_for_an_upgrade_of_its_key() {
        let body = quote!(
            async fn f(&self, tenant: u64) -> Result<(), E> {
                lock(format!("cfg:{}", tenant)).acquire().await?;
                Ok(())
            }
        );
        let found = errors(quote!(key = "cfg:<tenant>", mode = "read"), body.clone());
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains(
                "an exclusive lock (the default mode, the same lock as a write) of `cfg:<tenant>`"
            ),
            "{found:?}"
        );
        for mode in ["write", "exclusive"] {
            assert!(crate::lock(quote!(key = "cfg:<tenant>", mode = #mode), body.clone()).is_ok());
        }
        assert!(crate::lock(quote!(key = "cfg:<tenant>"), body).is_ok());
        // The `crate = "…"` path's `lock` is the runtime's too.
        let found = errors(
            quote!(key = "k", mode = "read", crate = "deps::locks"),
            quote!(
                async fn f() -> Result<(), E> {
                    deps::locks::lock("k").write().acquire().await?;
                    Ok(())
                }
            ),
        );
        assert_eq!(found.len(), 1, "{found:?}");
    }

    #[test]
    fn an_async_trait_body_is_checked_with_its_self() {
        let found = errors(
            quote!(key = "t:<self.tenant>", mode = "read"),
            quote! {
                fn f<'life0, 'async_trait>(&'life0 self)
                    -> ::core::pin::Pin<Box<dyn ::core::future::Future<Output = Result<u8, E>> + Send + 'async_trait>>
                    where 'life0: 'async_trait, Self: 'async_trait
                {
                    Box::pin(async move {
                        let __self = self;
                        let __ret: Result<u8, E> = {
                            let _g = lock(format!("t:{}", __self.tenant)).acquire().await?;
                            Ok(1)
                        };
                        __ret
                    })
                }
            },
        );
        assert_eq!(found.len(), 1, "{found:?}");
    }

    #[test]
    fn not_a_fn_is_combined_with_argument_errors() {
        let found = errors(
            quote!(lease = "1s"),
            quote!(
                struct S;
            ),
        );
        assert_eq!(found.len(), 2, "{found:?}");
    }

    #[test]
    fn each_key_of_a_list_is_checked_and_every_mistake_reported() {
        let f = quote!(
            async fn transfer(from: u64, to: u64) -> Result<(), E> {
                Ok(())
            }
        );
        let found = errors(
            quote!(key = ["a:<form>", "a:<to>", "b:<too>", ""]),
            f.clone(),
        );
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found[0].starts_with("placeholder `<form>` names no parameter of `transfer`"));
        assert!(found[0].ends_with("(did you mean `<from>`?)"), "{found:?}");
        assert!(found[1].starts_with("placeholder `<too>` names no parameter"));
        assert!(found[2].starts_with("the key is empty"));
        assert!(crate::lock(quote!(key = ["a:<from>", "a:<to>"]), f).is_ok());
    }

    #[test]
    fn a_key_listed_twice_is_refused_at_the_second() {
        let f = quote!(
            async fn f(id: u64, x: u64) -> Result<(), E> {
                Ok(())
            }
        );
        let found = errors(quote!(key = ["a:<id>", "b:<x>", "a:<id>"]), f.clone());
        assert_eq!(
            found,
            [
                "duplicate key \"a:<id>\": it is already the 1st key of the list; each key is \
              locked once, remove this one"
            ]
        );
        // The same text from the same values, written otherwise.
        let found = errors(quote!(key = ["x{:<id>", "b", "x{{:<id>"]), f.clone());
        assert_eq!(
            found,
            [
                "key \"x{{:<id>\" is the same key as \"x{:<id>\", the 1st key of the list; each \
              key is locked once, remove one of them"
            ]
        );
        // Different values are different keys, even when they may format alike.
        assert!(crate::lock(quote!(key = ["a:<id>", "a:<x>"]), f).is_ok());
    }

    #[test]
    fn a_read_fn_is_checked_for_an_upgrade_of_each_of_its_keys() {
        let found = errors(
            quote!(key = ["cfg:<tenant>", "audit:<tenant>"], mode = "read"),
            quote!(
                async fn f(tenant: u64) -> Result<(), E> {
                    lock(format!("audit:{}", tenant)).write().acquire().await?;
                    lock(format!("cfg:{tenant}")).acquire().await?;
                    lock(format!("other:{tenant}")).acquire().await?;
                    lock(format!("cfg:{tenant}")).read().acquire().await?;
                    Ok(())
                }
            ),
        );
        assert_eq!(found.len(), 2, "{found:?}");
        // In the order written, not in the keys' order.
        assert!(
            found[0].contains("a write lock of `audit:<tenant>`"),
            "{found:?}"
        );
        assert!(
            found[1].contains(
                "an exclusive lock (the default mode, the same lock as a write) of `cfg:<tenant>`"
            ),
            "{found:?}"
        );
    }
}
