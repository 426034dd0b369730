//! Turns a checked fn and its arguments into the fn that runs its body under the lock.
//!
//! Only the body changes: attributes, visibility, signature and generics are emitted as they
//! came (except `mut` on by-value parameters, which moves to the body's rebinding). The new
//! body is one call, `__private::locked(key, options, async move { body })`, awaited: the key
//! is formatted from borrowed parameters first, then the `async move` block takes the
//! parameters, so no argument is cloned and the only allocation is the key string.

use proc_macro2::{Group, Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{FnArg, Pat, ReturnType, Signature};

use crate::args::{push, Args, DurationArg, OnLost};
use crate::item::{self, AsyncTraitBody, LockFn};
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
        push(
            &mut errors,
            syn::Error::new(
                sig.fn_token.span,
                format!(
                    "#[distributed_lock] needs an `async fn`: the lock is held across the body's \
                     `.await`s and released when it completes; write `async fn {}`",
                    sig.ident
                ),
            ),
        );
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
    let krate = match &args.krate {
        Some(path) => path.to_token_stream(),
        None => quote!(::lock_runtime),
    };
    let locked = respan(quote!(#krate::__private::locked), output_span);
    let key = template.to_key_expr();
    let options = options(args, &krate);

    let new_body = match async_trait {
        // The boxed future already moves the parameters and carries a type hint: wrap it.
        Some(AsyncTraitBody {
            before,
            pin,
            future,
        }) => {
            let call = quote_spanned!(output_span=> #locked(#key, #options, #future).await);
            quote! {
                #(#before)*
                #pin(async move { #call })
            }
        }
        None => {
            let rebinds = rebind_parameters(&mut sig, template);
            let hint = return_type_hint(&sig);
            quote_spanned! {output_span=>
                #locked(#key, #options, async move {
                    #hint
                    #(#rebinds)*
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

/// `tokens` with every token (nested ones included) spanned at `span`.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tree| {
            if let TokenTree::Group(group) = &tree {
                let mut inner = Group::new(group.delimiter(), respan(group.stream(), span));
                inner.set_span(span);
                tree = TokenTree::Group(inner);
            }
            tree.set_span(span);
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
            let millis = syn::LitInt::new(&format!("{millis}u64"), *span);
            quote!(::core::option::Option::Some(#private::Duration::from_millis(#millis)))
        }
        // Bound to a typed `let` so a wrong type reads "expected `Duration`" at the expression.
        DurationArg::Expr(expr) => {
            let value = syn::Ident::new("__lock_duration", Span::mixed_site());
            let ty = respan(quote!(#private::Duration), expr.span());
            quote_spanned! {expr.span()=>
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
    if fields.is_empty() {
        return quote!(#private::Options::DEFAULT);
    }
    let options = quote!(#private::Options { #(#fields,)* ..#private::Options::DEFAULT });
    if fields.len() < OPTION_FIELDS {
        return options;
    }
    // Every field is given, so clippy calls `..DEFAULT` needless; it stays, so that a field the
    // runtime adds later still gets its default, and the lint is allowed on a `let`.
    let binding = syn::Ident::new("__lock_options", Span::mixed_site());
    quote!({
        #[allow(clippy::needless_update)]
        let #binding = #options;
        #binding
    })
}

/// `let x = x;` for every by-value parameter bound to a name, as a native `async fn` does:
/// the body's block takes every parameter, so they are dropped at its end, in reverse order,
/// after the body's locals, while the lock is still held. `mut` moves from the signature to
/// the rebinding (where the mutation happens; left in the signature it would be unused).
/// `self` cannot be rebound: `let _ = &self;` makes the block take all of it (not only the
/// fields the body touches). A parameter only the key reads is not unused, so its rebinding
/// does not warn.
fn rebind_parameters(sig: &mut Signature, template: &Template) -> Vec<TokenStream> {
    let mut rebinds = Vec::new();
    for input in &mut sig.inputs {
        let typed = match input {
            FnArg::Receiver(receiver) => {
                let self_token = &receiver.self_token;
                rebinds.push(quote!(let _ = &#self_token;));
                continue;
            }
            FnArg::Typed(typed) => typed,
        };
        let Pat::Ident(pat) = &mut *typed.pat else {
            continue;
        };
        if pat.by_ref.is_some() || pat.subpat.is_some() {
            continue;
        }
        let ident = &pat.ident;
        let allow = template
            .roots()
            .any(|root| ident == root)
            .then(|| quote!(#[allow(unused_variables)]));
        let mutability = pat.mutability.take();
        rebinds.push(quote!(#allow let #mutability #ident = #ident;));
    }
    rebinds
}

/// A never-taken `return` of the declared type at the top of the body's block, so that the
/// block's output type is known before the body is checked: `?` then converts errors into
/// the declared error type (`io::Error` into `anyhow::Error`) with no annotation from the user.
/// Spanned at the return type, so a mismatch points at the signature.
fn return_type_hint(sig: &Signature) -> TokenStream {
    let ReturnType::Type(_, ty) = &sig.output else {
        return TokenStream::new();
    };
    // `impl Trait` cannot be named in the body; inference does without the hint there.
    if item::mentions_impl(ty.to_token_stream()) {
        return TokenStream::new();
    }
    let ret = syn::Ident::new("__lock_ret", Span::mixed_site());
    quote_spanned! {ty.span()=>
        #[allow(unreachable_code, clippy::needless_return)]
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
                ::lock_runtime::__private::locked(
                    ::std::format!("order:{}", id),
                    ::lock_runtime::__private::Options {
                        lease: ::core::option::Option::Some(::lock_runtime::__private::Duration::from_millis(30000u64)),
                        ..::lock_runtime::__private::Options::DEFAULT
                    },
                    async move {
                        #[allow(unreachable_code, clippy::needless_return)]
                        if let ::core::option::Option::Some(__lock_ret) = ::core::option::Option::None::<Result<R, E> > {
                            return __lock_ret;
                        }
                        #[allow(unused_variables)]
                        let id = id;
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
                "my :: locks :: __private :: locked (:: std :: string :: String :: from (\"k\")"
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
            out.contains(":: lock_runtime :: __private :: Options :: DEFAULT , async move"),
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
        assert!(out.contains("let _ = & self ; { Ok (()) }"), "{out}");
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
        assert!(
            out.contains("# [allow (clippy :: needless_update)]"),
            "{out}"
        );
        assert!(
            out.contains(".. :: lock_runtime :: __private :: Options :: DEFAULT"),
            "{out}"
        );
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
                ::lock_runtime::__private::locked(
                    ::std::format!("t:{}", self.tenant),
                    ::lock_runtime::__private::Options::DEFAULT,
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
