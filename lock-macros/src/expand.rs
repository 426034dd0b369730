//! Writes the fn that runs its body under the lock, from a checked [`LockedFn`].
//!
//! Only the body changes: attributes, visibility, signature and generics are emitted as they
//! came (except where `rebind.rs` moves a parameter into the body). The new body is one
//! call, `__private::locked_with(key, options, lift, async move { body })`, awaited: the key
//! is formatted from borrowed parameters first, then the `async move` block takes the
//! parameters, so no argument is cloned and the only allocation is the key string. A list
//! of keys is the same call to `locked_many_with`, its first argument
//! `::std::vec![key1, key2, …]`, each key formatted as a single one is. Nothing here can
//! fail: every mistake was reported by `check.rs`.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{FnArg, Ident, Path, Signature, Type};

use crate::check::{AsyncTraitBody, Body, DurationArg, LockFn, LockedFn, Mode, OnLost, Options};
use crate::patterns::{self, Scope};
use crate::rebind::{self, Rebinding};
use crate::spans::{generated, relocate};

/// The locked fn.
pub(crate) fn expand(locked: LockedFn) -> TokenStream {
    let LockedFn {
        item:
            LockFn {
                attrs,
                vis,
                mut sig,
                inner_attrs,
                body,
            },
        output,
        keys,
        options,
        krate,
    } = locked;
    let call = LockCall::new(output.as_ref(), &krate, options, keys.len() > 1);
    let key_exprs = |scope: &Scope| keys.iter().map(|key| key.to_key_expr(scope)).collect();
    let new_body = match body {
        // The boxed future already moves the parameters and carries a type hint: wrap it.
        Body::AsyncTrait(body) => {
            let future_destructured = body.destructured();
            let AsyncTraitBody {
                before,
                pin,
                future,
            } = body;
            let scope = Scope {
                destructured: future_destructured,
                names: bound_names(&sig),
            };
            let call = call.around(key_exprs(&scope), future);
            quote! {
                #(#before)*
                #pin(async move { #call })
            }
        }
        Body::Block(mut body) => {
            // The body's block becomes the tail of the `async move` block. Braces written by
            // the user there would read to rustc as a redundant block (`unused_braces` on a
            // one-line body); they are the macro's braces, located where the user's were.
            body.set_span(generated(body.span()));
            let read_by_key: Vec<&Ident> = keys.iter().flat_map(|key| key.roots()).collect();
            let Rebinding { stmts, scope } = rebind::rebind(&mut sig, &read_by_key);
            let hint = return_type_hint(output.as_ref());
            let future = quote_spanned! {call.at=>
                async move {
                    #hint
                    #(#stmts)*
                    #body
                }
            };
            call.around(key_exprs(&scope), future)
        }
    };
    quote! {
        #(#attrs)*
        #vis #sig {
            #(#inner_attrs)*
            #new_body
        }
    }
}

/// `__private::locked_with(key, options, lift, future).await` (or `locked_many_with(keys, …)`),
/// but for the keys and the future.
struct LockCall {
    /// `locked_with` (`locked_many_with` for a list of keys), at the return type.
    locked_with: TokenStream,
    /// The options' struct expression.
    options: TokenStream,
    /// `lift`, at the return type.
    lift: TokenStream,
    /// The span of the call's own tokens: the macro's, at the return type.
    at: Span,
}

impl LockCall {
    /// The call for a fn declaring `output`, calling into `krate`; `many` for a list of keys.
    fn new(output: Option<&Type>, krate: &Path, options: Options, many: bool) -> LockCall {
        // Where a type error about the call itself should point: the declared return type
        // (for example when its error type has no `From<LockError>`).
        let output_span = output.map_or_else(Span::call_site, Spanned::span);
        // `lift` is where the type checker requires `From<LockError>` of the error type: at
        // the return type, once (see `__private::locked_with`).
        let locked_with = if many {
            quote!(#krate::__private::locked_many_with)
        } else {
            quote!(#krate::__private::locked_with)
        };
        LockCall {
            locked_with: relocate(locked_with, output_span),
            options: options_expr(options, &krate.to_token_stream()),
            lift: relocate(quote!(#krate::__private::lift), output_span),
            at: generated(output_span),
        }
    }

    /// The call, awaited, that runs `future` holding the locks `keys` name: one key as it
    /// is, several in a `Vec` (the fn `new` chose for them takes one).
    fn around(&self, keys: Vec<TokenStream>, future: impl ToTokens) -> TokenStream {
        let LockCall {
            locked_with,
            options,
            lift,
            at,
        } = self;
        let keys = match <[TokenStream; 1]>::try_from(keys) {
            Ok([key]) => key,
            Err(keys) => quote_spanned!(*at=> ::std::vec![#(#keys),*]),
        };
        quote_spanned!(*at=> #locked_with(#keys, #options, #lift, #future).await)
    }
}

/// The names `sig` binds, `self` included: an `#[async_trait]` method's signature keeps
/// the patterns of parameters taken by reference (`(a, b): &(A, B)`), and its hidden
/// `__argN` for the others (the future destructures those, see
/// `AsyncTraitBody::destructured`).
fn bound_names(sig: &Signature) -> Vec<Ident> {
    let mut names = Vec::new();
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(receiver) => names.push(Ident::from(receiver.self_token)),
            FnArg::Typed(typed) => {
                names.extend(patterns::bindings(&typed.pat).into_iter().cloned())
            }
        }
    }
    names
}

/// `Options { lease: …, ..Options::DEFAULT }` with only the fields the user gave.
fn options_expr(options: Options, krate: &TokenStream) -> TokenStream {
    let private = quote!(#krate::__private);
    // Every field named, so that an option added to `Options` cannot be forgotten here.
    let Options {
        lease,
        wait,
        watchdog,
        on_lost,
        fair,
        mode,
        permits,
    } = options;
    let given = [
        lease.map(|lease| {
            let value = duration_expr(lease, &private);
            quote!(lease: #value)
        }),
        wait.map(|wait| {
            let value = duration_expr(wait, &private);
            quote!(wait: #value)
        }),
        watchdog.map(|watchdog| quote!(watchdog: #watchdog)),
        on_lost.map(|on_lost| {
            let variant = match on_lost {
                OnLost::Abort => quote!(Abort),
                OnLost::Continue => quote!(Continue),
                OnLost::Confirm => quote!(Confirm),
            };
            quote!(on_lost: #private::OnLost::#variant)
        }),
        fair.map(|fair| quote!(fair: ::core::option::Option::Some(#fair))),
        mode.map(|mode| {
            let variant = match mode {
                Mode::Exclusive => quote!(Exclusive),
                Mode::Read => quote!(Read),
                Mode::Write => quote!(Write),
            };
            quote!(mode: #private::LockMode::#variant)
        }),
        permits.map(|permits| {
            let value = permits.option_expr();
            quote!(permits: #value)
        }),
    ];
    let every_field = given.iter().all(Option::is_some);
    let mut fields: Vec<TokenStream> = given.into_iter().flatten().collect();
    let mut options = quote!(#private::Options::DEFAULT);
    // `..DEFAULT` always stays, so that a field the runtime adds later gets its default. With
    // every field given, one struct expression listing them all would make clippy call the
    // update needless (`needless_update`, which looks at generated code too); the last field
    // then goes in an outer one: `Options { mode, ..Options { lease, …, ..DEFAULT } }`.
    let outer = if every_field { fields.pop() } else { None };
    if !fields.is_empty() {
        options = quote!(#private::Options { #(#fields,)* ..#options });
    }
    if let Some(field) = outer {
        options = quote!(#private::Options { #field, ..#options });
    }
    options
}

/// `Some(duration)` for a `lease` or `wait`.
fn duration_expr(arg: DurationArg, private: &TokenStream) -> TokenStream {
    match arg {
        DurationArg::Millis(millis, span) => {
            let at = generated(span);
            let millis = syn::LitInt::new(&format!("{millis}u64"), at);
            quote_spanned! {at=>
                ::core::option::Option::Some(#private::Duration::from_millis(#millis))
            }
        }
        // Bound to a typed `let` so a wrong type reads "expected `Duration`" at the expression.
        DurationArg::Expr(expr) => {
            let at = generated(expr.span());
            let value = Ident::new("__lock_duration", Span::mixed_site());
            let ty = relocate(quote!(#private::Duration), expr.span());
            quote_spanned! {at=>
                ::core::option::Option::Some({
                    let #value: #ty = #expr;
                    #value
                })
            }
        }
    }
}

/// A never-taken `return` of the declared type `output` at the top of the body's block, so
/// that the block's output type is known before the body is checked: `?` then converts
/// errors into the declared error type (`io::Error` into `anyhow::Error`) with no annotation
/// from the user. Located at the return type, so a mismatch points at the signature; the
/// tokens are the macro's, so lints (`unreachable_code` after a body that diverges) leave
/// them alone and no allowance is needed.
fn return_type_hint(output: Option<&Type>) -> TokenStream {
    let Some(ty) = output else {
        return TokenStream::new();
    };
    // `impl Trait` cannot be named in the body; inference does without the hint there.
    if mentions_impl(ty.to_token_stream()) {
        return TokenStream::new();
    }
    let ret = Ident::new("__lock_ret", Span::mixed_site());
    quote_spanned! {generated(ty.span())=>
        if let ::core::option::Option::Some(#ret) = ::core::option::Option::None::<#ty> {
            return #ret;
        }
    }
}

/// True when `tokens` contain `impl` anywhere (such a type cannot be named in a `let`).
fn mentions_impl(tokens: TokenStream) -> bool {
    tokens.into_iter().any(|tree| match tree {
        TokenTree::Ident(ident) => ident == "impl",
        TokenTree::Group(group) => mentions_impl(group.stream()),
        _ => false,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use quote::quote;

    fn expanded(args: TokenStream, item: TokenStream) -> String {
        crate::lock(args, item).unwrap().to_string()
    }

    #[test]
    fn body_runs_inside_locked_with_the_formatted_key() {
        let out = expanded(
            quote!(key = "order:<id>", lease = "30s"),
            quote!(
                pub async fn pay(id: u64, mut amount: u64) -> Result<R, E> {
                    amount += 1;
                    Ok(R)
                }
            ),
        );
        let expected = quote! {
            pub async fn pay(id: u64, amount: u64) -> Result<R, E> {
                ::lock_runtime::__private::locked_with(
                    ::std::format!("order:{}", id),
                    ::lock_runtime::__private::Options {
                        lease: ::core::option::Option::Some(::lock_runtime::__private::Duration::from_millis(30000u64)),
                        ..::lock_runtime::__private::Options::DEFAULT
                    },
                    ::lock_runtime::__private::lift,
                    async move {
                        if let ::core::option::Option::Some(__lock_ret) = ::core::option::Option::None::<Result<R, E> > {
                            return __lock_ret;
                        }
                        let id = id;
                        let _ = &id;
                        let mut amount = amount;
                        { amount += 1; Ok(R) }
                    }
                )
                .await
            }
        };
        assert_eq!(out, expected.to_string());
    }

    #[test]
    fn defaults_and_crate_path() {
        let out = expanded(
            quote!(
                key = "k",
                crate = "my::locks",
                watchdog = false,
                on_lost = "continue",
                fair = false,
                wait = W
            ),
            quote!(
                async fn f() -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(
            out.contains(
                "my :: locks :: __private :: locked_with (< :: std :: string :: String as :: core :: \
                 convert :: From < & str >> :: from (\"k\")"
            ),
            "{out}"
        );
        assert!(
            out.contains("let __lock_duration : my :: locks :: __private :: Duration = W ;"),
            "{out}"
        );
        assert!(out.contains("watchdog : false"), "{out}");
        assert!(
            out.contains("on_lost : my :: locks :: __private :: OnLost :: Continue"),
            "{out}"
        );
        assert!(
            out.contains("fair : :: core :: option :: Option :: Some (false)"),
            "{out}"
        );
        let out = expanded(
            quote!(key = "k"),
            quote!(
                async fn f() -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(
            out.contains(
                ":: lock_runtime :: __private :: Options :: DEFAULT , :: lock_runtime :: \
                 __private :: lift , async move"
            ),
            "{out}"
        );
        assert!(!out.contains("fair"), "{out}");
    }

    #[test]
    fn fair_alone_is_one_field_over_the_default() {
        let out = expanded(
            quote!(key = "k", fair = true),
            quote!(
                async fn f() -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        let options = quote! {
            ::lock_runtime::__private::Options {
                fair: ::core::option::Option::Some(true),
                ..::lock_runtime::__private::Options::DEFAULT
            }
        };
        assert!(out.contains(&options.to_string()), "{out}");
        assert!(!out.contains("needless_update"), "{out}");
    }

    #[test]
    fn a_mode_is_emitted_only_when_given() {
        let f = quote!(
            async fn f() -> Result<(), E> {
                Ok(())
            }
        );
        for (value, variant) in [
            ("read", quote!(Read)),
            ("write", quote!(Write)),
            ("exclusive", quote!(Exclusive)),
        ] {
            let out = expanded(quote!(key = "k", mode = #value), f.clone());
            let options = quote! {
                ::lock_runtime::__private::Options {
                    mode: ::lock_runtime::__private::LockMode::#variant,
                    ..::lock_runtime::__private::Options::DEFAULT
                }
            };
            assert!(out.contains(&options.to_string()), "{out}");
        }
        let out = expanded(
            quote!(key = "k", crate = "my::locks", mode = "read"),
            f.clone(),
        );
        assert!(
            out.contains("mode : my :: locks :: __private :: LockMode :: Read"),
            "{out}"
        );
        assert!(!expanded(quote!(key = "k"), f).contains("mode"));
    }

    #[test]
    fn receivers_are_taken_whole_by_the_body() {
        let out = expanded(
            quote!(key = "<self.tenant>"),
            quote!(
                async fn f(self: Arc<Self>, _: u8) -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(
            out.contains("(self : Arc < Self > , (__arg1) : u8)"),
            "{out}"
        );
        assert!(
            out.contains("let _ = & self ; let __arg1 = __arg1 ; { Ok (()) }"),
            "{out}"
        );
    }

    #[test]
    fn all_options_keep_the_default_base() {
        let out = expanded(
            quote!(
                key = "k",
                lease = "1s",
                wait = "1s",
                watchdog = true,
                on_lost = "abort",
                fair = true,
                mode = "exclusive",
                permits = 2
            ),
            quote!(
                async fn f() -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        // No struct expression lists every field (clippy's `needless_update`), and no lint
        // is allowed.
        let nested = quote! {
            ::lock_runtime::__private::Options {
                permits: ::core::option::Option::Some(2u32),
                ..::lock_runtime::__private::Options {
                    lease: ::core::option::Option::Some(::lock_runtime::__private::Duration::from_millis(1000u64)),
                    wait: ::core::option::Option::Some(::lock_runtime::__private::Duration::from_millis(1000u64)),
                    watchdog: true,
                    on_lost: ::lock_runtime::__private::OnLost::Abort,
                    fair: ::core::option::Option::Some(true),
                    mode: ::lock_runtime::__private::LockMode::Exclusive,
                    ..::lock_runtime::__private::Options::DEFAULT
                }
            }
        };
        assert!(out.contains(&nested.to_string()), "{out}");
        assert!(!out.contains("allow"), "{out}");
    }

    #[test]
    fn a_key_reads_names_bound_in_patterns_through_the_hidden_parameter() {
        let out = expanded(
            quote!(key = "k:<name>:<a>"),
            quote!(
                async fn f(ref name: String, (a, b): (u8, u8)) -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        let key = quote! {
            {
                let ref name = __arg0;
                let (ref a, _) = __arg1;
                ::std::format!("k:{}:{}", name, a)
            }
        };
        assert!(out.contains(&key.to_string()), "{out}");
        let body = quote! {
            let __arg0 = __arg0;
            let ref name = __arg0;
            let _ = &name;
            let __arg1 = __arg1;
            let (a, b) = __arg1;
            let _ = &a;
        };
        assert!(out.contains(&body.to_string()), "{out}");
    }

    #[test]
    fn an_async_trait_key_reads_the_patterns_its_future_destructures() {
        let out = expanded(
            quote!(key = "t:<a>:<c>"),
            quote! {
                fn f<'life0, 'async_trait>(&'life0 self, __arg1: (u8, u8), (c, d): &'life0 (u8, u8))
                    -> ::core::pin::Pin<Box<dyn ::core::future::Future<Output = Result<u8, E>> + Send + 'async_trait>>
                    where 'life0: 'async_trait, Self: 'async_trait
                {
                    Box::pin(async move {
                        let __self = self;
                        let (a, b) = { let __arg1 = __arg1; __arg1 };
                        let __ret: Result<u8, E> = { Ok(a + b + c + d) };
                        __ret
                    })
                }
            },
        );
        let key = quote! {
            {
                let (ref a, _) = __arg1;
                ::std::format!("t:{}:{}", a, c)
            }
        };
        assert!(out.contains(&key.to_string()), "{out}");
    }

    #[test]
    fn async_trait_futures_are_wrapped() {
        let out = expanded(
            quote!(key = "t:<self.tenant>"),
            quote! {
                fn f<'life0, 'async_trait>(&'life0 self)
                    -> ::core::pin::Pin<Box<dyn ::core::future::Future<Output = Result<u8, E>> + Send + 'async_trait>>
                    where 'life0: 'async_trait, Self: 'async_trait
                {
                    Box::pin(async move { let __self = self; let __ret: Result<u8, E> = { Ok(1) }; __ret })
                }
            },
        );
        let wrapped = quote! {
            Box::pin(async move {
                ::lock_runtime::__private::locked_with(
                    ::std::format!("t:{}", self.tenant),
                    ::lock_runtime::__private::Options::DEFAULT,
                    ::lock_runtime::__private::lift,
                    async move { let __self = self; let __ret: Result<u8, E> = { Ok(1) }; __ret }
                ).await
            })
        };
        assert!(out.contains(&wrapped.to_string()), "{out}");
    }

    #[test]
    fn a_list_of_keys_is_one_locked_many_with_call_over_a_vec() {
        let out = expanded(
            quote!(key = ["account:<from>", "account:<to>"], lease = "10s"),
            quote!(
                async fn transfer(from: u64, to: u64, amount: u64) -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        let expected = quote! {
            async fn transfer(from: u64, to: u64, amount: u64) -> Result<(), E> {
                ::lock_runtime::__private::locked_many_with(
                    ::std::vec![
                        ::std::format!("account:{}", from),
                        ::std::format!("account:{}", to)
                    ],
                    ::lock_runtime::__private::Options {
                        lease: ::core::option::Option::Some(::lock_runtime::__private::Duration::from_millis(10000u64)),
                        ..::lock_runtime::__private::Options::DEFAULT
                    },
                    ::lock_runtime::__private::lift,
                    async move {
                        if let ::core::option::Option::Some(__lock_ret) = ::core::option::Option::None::<Result<(), E> > {
                            return __lock_ret;
                        }
                        let from = from;
                        let _ = &from;
                        let to = to;
                        let _ = &to;
                        let amount = amount;
                        { Ok(()) }
                    }
                )
                .await
            }
        };
        assert_eq!(out, expected.to_string());
    }

    #[test]
    fn a_list_of_one_key_expands_as_that_key() {
        let f = quote!(
            async fn f(&self, id: u64) -> Result<(), E> {
                Ok(())
            }
        );
        assert_eq!(
            expanded(
                quote!(key = ["t:<self.tenant>:<id>"], mode = "read"),
                f.clone()
            ),
            expanded(quote!(key = "t:<self.tenant>:<id>", mode = "read"), f)
        );
    }

    #[test]
    fn each_key_of_a_list_reads_patterns_as_a_single_key_does() {
        let out = expanded(
            quote!(key = ["k:<a>", "j:<self.tenant>:<a>", "literal"]),
            quote!(
                async fn f(&self, (a, b): (u8, u8)) -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        let keys = quote! {
            ::std::vec![
                { let (ref a, _) = __arg1; ::std::format!("k:{}", a) },
                { let (ref a, _) = __arg1; ::std::format!("j:{}:{}", self.tenant, a) },
                <::std::string::String as ::core::convert::From<&str>>::from("literal")
            ]
        };
        assert!(out.contains(&keys.to_string()), "{out}");
        // `a` is read by two keys and used once.
        let body = quote!(let __arg1 = __arg1; let (a, b) = __arg1; let _ = &a; { Ok(()) });
        assert!(out.contains(&body.to_string()), "{out}");
    }

    #[test]
    fn an_async_trait_future_runs_under_every_key_of_a_list() {
        let out = expanded(
            quote!(key = ["t:<self.tenant>", "u:<id>"], crate = "my::locks"),
            quote! {
                fn f<'life0, 'async_trait>(&'life0 self, id: u64)
                    -> ::core::pin::Pin<Box<dyn ::core::future::Future<Output = Result<u8, E>> + Send + 'async_trait>>
                    where 'life0: 'async_trait, Self: 'async_trait
                {
                    Box::pin(async move { let __self = self; let id = id; let __ret: Result<u8, E> = { Ok(1) }; __ret })
                }
            },
        );
        let wrapped = quote! {
            Box::pin(async move {
                my::locks::__private::locked_many_with(
                    ::std::vec![
                        ::std::format!("t:{}", self.tenant),
                        ::std::format!("u:{}", id)
                    ],
                    my::locks::__private::Options::DEFAULT,
                    my::locks::__private::lift,
                    async move { let __self = self; let id = id; let __ret: Result<u8, E> = { Ok(1) }; __ret }
                ).await
            })
        };
        assert!(out.contains(&wrapped.to_string()), "{out}");
    }
}
