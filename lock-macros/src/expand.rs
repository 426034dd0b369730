//! Turns a checked fn and its arguments into the fn that runs its body under the lock.
//!
//! Only the body changes: attributes, visibility, signature and generics are emitted as they
//! came (except `mut` on by-value parameters, which moves to the body's rebinding). The new
//! body is one call, `__private::locked_with(key, options, lift, async move { body })`,
//! awaited: the key is formatted from borrowed parameters first, then the `async move` block
//! takes the parameters, so no argument is cloned and the only allocation is the key string.

use proc_macro2::{Group, Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{FnArg, Ident, Pat, ReturnType, Signature};

use crate::args::{push, Args, DurationArg, OnLost};
use crate::generated;
use crate::item::{self, AsyncTraitBody, LockFn};
use crate::rebind::{self, Rebinding};
use crate::template::{Params, Template};

/// Expands `#[distributed_lock(args)] item`, or returns every error found in both.
pub(crate) fn expand(args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let mut errors = None;
    // For an attribute macro the call site is the attribute itself.
    let args = Args::parse(args, Span::call_site(), &mut errors);
    let lock_fn = match item::parse(item) {
        Ok(lock_fn) => lock_fn,
        Err(error) => {
            push(&mut errors, error);
            return Err(
                errors.unwrap_or_else(|| syn::Error::new(Span::call_site(), "invalid item"))
            );
        }
    };

    let sig = &lock_fn.sig;
    let async_trait = match sig.asyncness {
        Some(_) => None,
        None => item::async_trait_body(&lock_fn.body),
    };
    if sig.asyncness.is_none() && async_trait.is_none() {
        let message = if item::blocks_on_async_block(&lock_fn.body) {
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
        push(&mut errors, syn::Error::new(sig.fn_token.span, message));
    }
    let output = match (&async_trait, &sig.output) {
        // After #[async_trait] the declared type is `Pin<Box<dyn Future<Output = T> …>>`.
        (Some(_), declared) => item::async_trait_output(declared),
        (None, ReturnType::Type(_, ty)) => Some(&**ty),
        (None, ReturnType::Default) => None,
    };
    if async_trait.is_none() || output.is_some() {
        if let Err(error) =
            item::check_returns_result(&sig.ident, output, sig.paren_token.span.close())
        {
            push(&mut errors, error);
        }
    }
    let template = args.key.as_ref().and_then(|key| {
        Template::new(&key.value(), key.span(), &Params::of(sig), &sig.ident)
            .map_err(|error| push(&mut errors, error))
            .ok()
    });

    match (errors, template) {
        (Some(errors), _) => Err(errors),
        (None, Some(template)) => Ok(generate(&args, lock_fn, async_trait, &template)),
        // Unreachable: a missing key is reported as an error.
        (None, None) => Err(syn::Error::new(Span::call_site(), "missing `key`")),
    }
}

/// Writes the locked fn.
fn generate(
    args: &Args,
    lock_fn: LockFn,
    async_trait: Option<AsyncTraitBody>,
    template: &Template,
) -> TokenStream {
    let LockFn {
        attrs,
        vis,
        mut sig,
        inner_attrs,
        body,
    } = lock_fn;
    // Where a type error about the call itself should point: the declared return type (for
    // example when its error type has no `From<LockError>`).
    let output_span = match (&async_trait, &sig.output) {
        (Some(_), output) => item::async_trait_output(output).map(Spanned::span),
        (None, ReturnType::Type(_, ty)) => Some(ty.span()),
        (None, ReturnType::Default) => None,
    }
    .unwrap_or_else(Span::call_site);
    let at_output = generated(output_span);
    let krate = match &args.krate {
        Some(path) => path.to_token_stream(),
        None => quote!(::lock_runtime),
    };
    // `lift` is where the type checker requires `From<LockError>` of the error type: at the
    // return type, once (see `__private::locked_with`).
    let locked = relocate(quote!(#krate::__private::locked_with), output_span);
    let lift = relocate(quote!(#krate::__private::lift), output_span);
    let options = options(args, &krate);

    let new_body = match async_trait {
        // The boxed future already moves the parameters and carries a type hint: wrap it.
        Some(AsyncTraitBody {
            before,
            pin,
            future,
        }) => {
            let key = template.to_key_expr(&bound_names(&sig));
            let call = quote_spanned!(at_output=> #locked(#key, #options, #lift, #future).await);
            quote! {
                #(#before)*
                #pin(async move { #call })
            }
        }
        None => {
            // The body's block becomes the tail of the `async move` block. Braces written by
            // the user there would read to rustc as a redundant block (`unused_braces` on a
            // one-line body); they are the macro's braces, located where the user's were.
            let mut body = body;
            body.set_span(generated(body.span()));
            let Rebinding { stmts, names } = rebind::rebind(&mut sig, template);
            let key = template.to_key_expr(&names);
            let hint = return_type_hint(&sig);
            quote_spanned! {at_output=>
                #locked(#key, #options, #lift, async move {
                    #hint
                    #(#stmts)*
                    #body
                })
                .await
            }
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

/// The parameters `sig` binds to a name, `self` included.
fn bound_names(sig: &Signature) -> Vec<Ident> {
    sig.inputs
        .iter()
        .filter_map(|input| match input {
            FnArg::Receiver(receiver) => Some(Ident::from(receiver.self_token)),
            FnArg::Typed(typed) => match &*typed.pat {
                Pat::Ident(pat) => Some(pat.ident.clone()),
                _ => None,
            },
        })
        .collect()
}

/// `tokens` (nested ones included) located at `span`, each keeping its own hygiene: the
/// macro's own tokens stay the macro's, and a path the user gave (`crate = "crate::locks"`,
/// or `$crate::locks` from a `macro_rules!`) still resolves where the user wrote it.
fn relocate(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tree| {
            if let TokenTree::Group(group) = &tree {
                let mut inner = Group::new(group.delimiter(), relocate(group.stream(), span));
                inner.set_span(group.span().located_at(span));
                tree = TokenTree::Group(inner);
            }
            tree.set_span(tree.span().located_at(span));
            tree
        })
        .collect()
}

/// How many fields `__private::Options` has today.
const OPTION_FIELDS: usize = 5;

/// `Options { lease: …, ..Options::DEFAULT }` with only the fields the user gave.
fn options(args: &Args, krate: &TokenStream) -> TokenStream {
    let private = quote!(#krate::__private);
    let duration = |arg: &DurationArg| match arg {
        DurationArg::Millis(millis, span) => {
            let at = generated(*span);
            let millis = syn::LitInt::new(&format!("{millis}u64"), at);
            quote_spanned! {at=>
                ::core::option::Option::Some(#private::Duration::from_millis(#millis))
            }
        }
        // Bound to a typed `let` so a wrong type reads "expected `Duration`" at the expression.
        DurationArg::Expr(expr) => {
            let at = generated(expr.span());
            let value = syn::Ident::new("__lock_duration", Span::mixed_site());
            let ty = relocate(quote!(#private::Duration), expr.span());
            quote_spanned! {at=>
                ::core::option::Option::Some({
                    let #value: #ty = #expr;
                    #value
                })
            }
        }
    };
    let mut fields = Vec::new();
    if let Some(lease) = &args.lease {
        let value = duration(lease);
        fields.push(quote!(lease: #value));
    }
    if let Some(wait) = &args.wait {
        let value = duration(wait);
        fields.push(quote!(wait: #value));
    }
    if let Some(watchdog) = args.watchdog {
        fields.push(quote!(watchdog: #watchdog));
    }
    if let Some(on_lost) = args.on_lost {
        let variant = match on_lost {
            OnLost::Abort => quote!(Abort),
            OnLost::Continue => quote!(Continue),
        };
        fields.push(quote!(on_lost: #private::OnLost::#variant));
    }
    if let Some(fair) = args.fair {
        fields.push(quote!(fair: ::core::option::Option::Some(#fair)));
    }
    let mut options = quote!(#private::Options::DEFAULT);
    // `..DEFAULT` always stays, so that a field the runtime adds later gets its default. With
    // every field given, one struct expression listing them all would make clippy call the
    // update needless (`needless_update`, which looks at generated code too); the last field
    // then goes in an outer one: `Options { fair, ..Options { lease, …, ..DEFAULT } }`.
    let outer = if fields.len() >= OPTION_FIELDS {
        fields.pop()
    } else {
        None
    };
    if !fields.is_empty() {
        options = quote!(#private::Options { #(#fields,)* ..#options });
    }
    if let Some(field) = outer {
        options = quote!(#private::Options { #field, ..#options });
    }
    options
}

/// A never-taken `return` of the declared type at the top of the body's block, so that the
/// block's output type is known before the body is checked: `?` then converts errors into
/// the declared error type (`io::Error` into `anyhow::Error`) with no annotation from the user.
/// Located at the return type, so a mismatch points at the signature; the tokens are the
/// macro's, so lints (`unreachable_code` after a body that diverges) leave them alone and no
/// allowance is needed.
fn return_type_hint(sig: &Signature) -> TokenStream {
    let ReturnType::Type(_, ty) = &sig.output else {
        return TokenStream::new();
    };
    // `impl Trait` cannot be named in the body; inference does without the hint there.
    if item::mentions_impl(ty.to_token_stream()) {
        return TokenStream::new();
    }
    let ret = syn::Ident::new("__lock_ret", Span::mixed_site());
    quote_spanned! {generated(ty.span())=>
        if let ::core::option::Option::Some(#ret) = ::core::option::Option::None::<#ty> {
            return #ret;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn expanded(args: TokenStream, item: TokenStream) -> String {
        expand(args, item).unwrap().to_string()
    }

    fn errors(args: TokenStream, item: TokenStream) -> Vec<String> {
        expand(args, item)
            .err()
            .unwrap()
            .into_iter()
            .map(|e| e.to_string())
            .collect()
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
                fair = true
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
                fair: ::core::option::Option::Some(true),
                ..::lock_runtime::__private::Options {
                    lease: ::core::option::Option::Some(::lock_runtime::__private::Duration::from_millis(1000u64)),
                    wait: ::core::option::Option::Some(::lock_runtime::__private::Duration::from_millis(1000u64)),
                    watchdog: true,
                    on_lost: ::lock_runtime::__private::OnLost::Abort,
                    ..::lock_runtime::__private::Options::DEFAULT
                }
            }
        };
        assert!(out.contains(&nested.to_string()), "{out}");
        assert!(!out.contains("allow"), "{out}");
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
    fn errors_from_arguments_and_fn_are_combined() {
        let found = errors(
            quote!(key = "<nope>", lease = "1x"),
            quote!(
                fn f() -> u64 {
                    1
                }
            ),
        );
        assert_eq!(found.len(), 4, "{found:?}");
        assert!(found[0].contains("invalid duration"));
        assert!(found[1].contains("needs an `async fn`"));
        assert!(found[2].contains("returns `u64`"));
        assert!(found[3].contains("placeholder `<nope>` names no parameter"));
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
}
