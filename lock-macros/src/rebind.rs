//! How the locked body takes the fn's parameters: the statements at the top of its block.
//!
//! A native `async fn` moves every parameter into its body future, and the body drops them at
//! its end, after its own locals, in reverse order of declaration. rustc lowers
//! `async fn f(a: A, _: B, (c, d): (C, D))` to a fn with parameters `a, __arg1, __arg2` whose
//! future starts with `let a = a; let __arg1 = __arg1; let __arg2 = __arg2; let (c, d) = __arg2;`.
//! The attribute does the same inside the block it runs under the lock, so every parameter
//! (named, `_`, destructured) is dropped there, in that order, while the lock is held:
//!
//! - `x` and `mut x`: `let mut x = x;` (`mut` moves from the signature to where the mutation
//!   happens; left in the signature it would be unused).
//! - `_` and patterns (`(a, b)`, `Point { x, .. }`, `ref r`, `v @ Some(_)`): the signature binds
//!   a hygienic `__argN` instead, moved first, then destructured: `let __argN = __argN;
//!   let (a, b) = __argN;`. As in rustc's lowering, the moved value is `mut` where the pattern
//!   borrows it mutably (`ref mut r`: `let mut __argN = __argN; let ref mut r = __argN;`);
//!   only there, so that no `unused_mut` is left to silence. The key reaches names inside
//!   the pattern through `__argN` too (see `patterns.rs`). rustdoc shows `__argN` for such a
//!   parameter. The name is written
//!   in parentheses, `(__argN): T`, which is the same pattern: an attribute below this one that
//!   records parameters by name (`#[tracing::instrument]`, which formats each with `Debug`)
//!   skips it as it skips `_` and does not require `T: Debug` of a parameter the user never
//!   named.
//! - `_x`: the signature's `_x` becomes hygienic (invisible to the body, shown as `_x` by
//!   rustdoc), and the body binds the user's `_x` from it through a block,
//!   `let _x = { _x };`: clippy's `used_underscore_binding` and `no_effect_underscore_binding`
//!   exempt rustc's own lowering of `let _x = _x;` but not a macro's, and they do not look
//!   through the block.
//! - `self` cannot be rebound: `let _ = &self;` makes the block take all of it (not only the
//!   fields the body touches).
//!
//! A parameter's `cfg` and lint attributes go with it onto the statements that bind it
//! (`#[cfg(feature = "x")] extra: u64` has no rebinding when configured away;
//! `#[allow(unused_variables)] p: u64` reaches the binding the body uses). An `#[expect]`
//! moves: the binding in the body is where the lint fires, and the parameter (which the
//! rebinding uses) keeps it as an `#[allow]`.
//!
//! No lint is allowed by the expansion: a parameter (or a name in a pattern) only the key
//! reads is used once more (`let _ = &id;`) instead of being covered by
//! `#[allow(unused_variables)]`, which a crate's `#![forbid(unused_variables)]` would turn into
//! an error.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote_spanned, ToTokens};
use syn::punctuated::Punctuated;
use syn::{
    token, Attribute, FnArg, Ident, Meta, Pat, PatIdent, PatParen, PatType, Receiver, Signature,
    Token,
};

use crate::patterns::{self, Destructured, Scope};
use crate::spans::generated;

/// The statements that move the parameters into the body, and how the key reaches the
/// names they bind.
pub(crate) struct Rebinding {
    /// Statements for the top of the body's block, in parameter order.
    pub stmts: Vec<TokenStream>,
    /// The names the signature now binds (`self` included) and the parameters it holds
    /// whole as `__argN`, with their patterns: the key reads the parameters through them.
    pub scope: Scope,
}

/// Rewrites the parameters of `sig` where the body has to take them (see the module docs)
/// and returns the statements that do it. `read_by_key` are the parameters the key reads.
pub(crate) fn rebind(sig: &mut Signature, read_by_key: &[&Ident]) -> Rebinding {
    let mut rebinding = Rebinding {
        stmts: Vec::new(),
        scope: Scope::default(),
    };
    for (index, input) in sig.inputs.iter_mut().enumerate() {
        match input {
            FnArg::Receiver(receiver) => rebinding.receiver(receiver),
            FnArg::Typed(typed) => rebinding.typed(typed, index, read_by_key),
        }
    }
    rebinding
}

impl Rebinding {
    /// `self` cannot be rebound: `let _ = &self;` makes the block take all of it.
    fn receiver(&mut self, receiver: &Receiver) {
        let self_token = receiver.self_token;
        let span = generated(self_token.span);
        self.stmts
            .push(quote_spanned!(span=> let _ = &#self_token;));
        self.scope.names.push(Ident::from(self_token));
    }

    /// A parameter with a type: `x`, `mut x`, `_x`, `_` or a pattern.
    fn typed(&mut self, typed: &mut PatType, index: usize, read_by_key: &[&Ident]) {
        let carried = Carried::of(&mut typed.attrs);
        match &mut *typed.pat {
            Pat::Ident(pat) if pat.by_ref.is_none() && pat.subpat.is_none() => {
                self.named(pat, &carried, read_by_key);
            }
            pattern => self.pattern(pattern, index, &carried, read_by_key),
        }
    }

    /// `x` and `mut x`: `let mut x = x;`; `_x`: a hygienic `_x` in the signature, and
    /// `let _x = { _x };` in the body.
    fn named(&mut self, pat: &mut PatIdent, carried: &Carried, read_by_key: &[&Ident]) {
        let Carried { cfg, all } = carried;
        let user = pat.ident.clone();
        let mutability = pat.mutability.take();
        let span = generated(user.span());
        if user.to_string().trim_start_matches("r#").starts_with('_') {
            let mut hidden = user.clone();
            hidden.set_span(Span::mixed_site().located_at(user.span()));
            pat.ident = hidden.clone();
            self.stmts.push(quote_spanned! {span=>
                #(#all)* let #mutability #user = { #hidden };
            });
            self.scope.names.push(hidden);
        } else {
            self.stmts.push(quote_spanned! {span=>
                #(#all)* let #mutability #user = #user;
            });
            // The key reads it: a use, as the parameter was used.
            if read_by_key.iter().any(|root| user == **root) {
                self.stmts
                    .push(quote_spanned!(span=> #(#cfg)* let _ = &#user;));
            }
            self.scope.names.push(user);
        }
    }

    /// `_` and patterns: the signature binds a hygienic `(__argN)`, moved first (into a
    /// `mut` binding when the pattern borrows it mutably, `ref mut x`), then destructured.
    fn pattern(
        &mut self,
        pattern: &mut Pat,
        index: usize,
        carried: &Carried,
        read_by_key: &[&Ident],
    ) {
        let Carried { cfg, all } = carried;
        let span = generated(
            pattern
                .to_token_stream()
                .into_iter()
                .next()
                .map_or_else(Span::call_site, |token| token.span()),
        );
        let hidden = format_ident!("__arg{}", index, span = Span::mixed_site());
        let binding = Pat::Ident(PatIdent {
            attrs: Vec::new(),
            by_ref: None,
            mutability: None,
            ident: hidden.clone(),
            subpat: None,
        });
        let pattern = std::mem::replace(
            pattern,
            Pat::Paren(PatParen {
                attrs: Vec::new(),
                paren_token: token::Paren(span),
                pat: Box::new(binding),
            }),
        );
        let mutability = patterns::borrows_mutably(&pattern).then(|| Token![mut](span));
        self.stmts
            .push(quote_spanned!(span=> #(#cfg)* let #mutability #hidden = #hidden;));
        if matches!(pattern, Pat::Wild(_)) {
            return;
        }
        self.stmts
            .push(quote_spanned!(span=> #(#all)* let #pattern = #hidden;));
        // A name the key reads is used, as it was before the body took the parameter (a
        // `_name` needs no use).
        let mut used: Vec<&Ident> = Vec::new();
        for name in patterns::bindings(&pattern) {
            let underscored = name.to_string().trim_start_matches("r#").starts_with('_');
            if !underscored && read_by_key.contains(&name) && !used.contains(&name) {
                used.push(name);
            }
        }
        for name in used {
            self.stmts
                .push(quote_spanned!(span=> #(#cfg)* let _ = &#name;));
        }
        self.scope.destructured.push(Destructured {
            cfg: cfg.clone(),
            pattern,
            place: hidden,
        });
    }
}

/// The attributes of one parameter that its generated statements carry.
struct Carried {
    /// `#[cfg(…)]`: on every statement generated for the parameter.
    cfg: Vec<Attribute>,
    /// `cfg`, `cfg_attr` and lint levels: on the statement that binds the user's names.
    all: Vec<Attribute>,
}

impl Carried {
    /// Collects the attributes to carry and turns the parameter's own `#[expect]`s into
    /// `#[allow]`s (the expectation moves to the binding in the body).
    fn of(attrs: &mut [Attribute]) -> Carried {
        let mut carried = Carried {
            cfg: Vec::new(),
            all: Vec::new(),
        };
        for attr in attrs {
            let path = attr.path();
            if path.is_ident("cfg") {
                carried.cfg.push(attr.clone());
                carried.all.push(attr.clone());
            } else if ["cfg_attr", "allow", "warn", "deny", "forbid", "expect"]
                .iter()
                .any(|name| path.is_ident(name))
            {
                carried.all.push(attr.clone());
                expect_as_allow(&mut attr.meta);
            }
        }
        carried
    }
}

/// `expect(…)` → `allow(…)`, also inside `cfg_attr(predicate, …)`.
fn expect_as_allow(meta: &mut Meta) {
    let Meta::List(list) = meta else { return };
    if list.path.is_ident("expect") {
        let span = list.path.segments[0].ident.span();
        list.path = Ident::new("allow", span).into();
    } else if list.path.is_ident("cfg_attr") {
        let parser = Punctuated::<Meta, Token![,]>::parse_terminated;
        let Ok(mut metas) = list.parse_args_with(parser) else {
            return;
        };
        // The first is the predicate; the rest are attributes.
        metas.iter_mut().skip(1).for_each(expect_as_allow);
        list.tokens = metas.into_token_stream();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use quote::quote;

    /// The fn with its rewritten signature and the rebinding statements as its body, and
    /// the names the key reads.
    fn rebound(sig: &str, key: &str) -> (String, Vec<String>) {
        let mut sig: Signature = syn::parse_str(sig).unwrap();
        let params = crate::template::Params::of(&sig, &[]);
        let template =
            crate::template::Template::new(key, Span::call_site(), &params, &sig.ident).unwrap();
        let read_by_key: Vec<&Ident> = template.roots().collect();
        let Rebinding { stmts, scope } = rebind(&mut sig, &read_by_key);
        let names = scope.names.iter().map(ToString::to_string).collect();
        (written(quote!(#sig { #(#stmts)* })), names)
    }

    /// `item` as a string, without a trailing comma after the parameters (rustfmt adds one
    /// to the expected fns).
    fn written(item: TokenStream) -> String {
        let mut item: syn::ItemFn = syn::parse2(item).unwrap();
        item.sig.inputs.pop_punct();
        item.to_token_stream().to_string()
    }

    #[test]
    fn named_parameters_are_moved_into_the_body() {
        let (out, names) = rebound("fn f(id: u64, mut amount: u64)", "k");
        let expected = quote!(
            fn f(id: u64, amount: u64) {
                let id = id;
                let mut amount = amount;
            }
        );
        assert_eq!(out, written(expected));
        assert_eq!(names, ["id", "amount"]);
    }

    #[test]
    fn a_parameter_only_the_key_reads_is_used_once_more() {
        let (out, _) = rebound("fn f(id: u64)", "order:<id>");
        assert!(out.ends_with("{ let id = id ; let _ = & id ; }"), "{out}");
    }

    #[test]
    fn wildcards_and_patterns_get_a_hidden_name_moved_first() {
        let (out, names) = rebound("fn f(_: u8, (a, mut b): (u8, u8), ref r: u8)", "k");
        let expected = quote!(
            fn f((__arg0): u8, (__arg1): (u8, u8), (__arg2): u8) {
                let __arg0 = __arg0;
                let __arg1 = __arg1;
                let (a, mut b) = __arg1;
                let __arg2 = __arg2;
                let ref r = __arg2;
            }
        );
        assert_eq!(out, written(expected));
        assert!(names.is_empty());
    }

    #[test]
    fn a_pattern_that_borrows_mutably_is_moved_into_a_mut_binding() {
        let (out, _) = rebound(
            "fn f(ref mut r: u8, (a, ref mut b): (u8, u8), &mut (ref mut c): &mut u8)",
            "k",
        );
        let expected = quote!(
            fn f((__arg0): u8, (__arg1): (u8, u8), (__arg2): &mut u8) {
                let mut __arg0 = __arg0;
                let ref mut r = __arg0;
                let mut __arg1 = __arg1;
                let (a, ref mut b) = __arg1;
                let __arg2 = __arg2;
                let &mut (ref mut c) = __arg2;
            }
        );
        assert_eq!(out, written(expected));
    }

    #[test]
    fn names_in_patterns_the_key_reads_are_used_once_more_and_reach_the_key() {
        let mut sig: Signature =
            syn::parse_str("fn f((a, _b, c): (u8, u8, u8), ref r: u8, (A(v) | B(v)): E)").unwrap();
        let read = ["a", "_b", "r", "v"].map(|name| Ident::new(name, Span::call_site()));
        let read: Vec<&Ident> = read.iter().collect();
        let Rebinding { stmts, scope } = rebind(&mut sig, &read);
        let expected = quote! {
            let __arg0 = __arg0;
            let (a, _b, c) = __arg0;
            let _ = &a;
            let __arg1 = __arg1;
            let ref r = __arg1;
            let _ = &r;
            let __arg2 = __arg2;
            let (A(v) | B(v)) = __arg2;
            let _ = &v;
        };
        assert_eq!(quote!(#(#stmts)*).to_string(), expected.to_string());
        assert!(scope.names.is_empty());
        let destructured: Vec<(String, String)> = scope
            .destructured
            .iter()
            .map(|d| (d.place.to_string(), crate::written::written(&d.pattern)))
            .collect();
        assert_eq!(
            destructured,
            [
                ("__arg0".to_owned(), "(a, _b, c)".to_owned()),
                ("__arg1".to_owned(), "ref r".to_owned()),
                ("__arg2".to_owned(), "(A (v) | B (v))".to_owned()),
            ]
        );
    }

    #[test]
    fn underscore_names_are_bound_through_a_block() {
        let (out, names) = rebound("fn f(_x: u8, mut _y: u8)", "<_x>");
        let expected = quote!(
            fn f(_x: u8, _y: u8) {
                let _x = { _x };
                let mut _y = { _y };
            }
        );
        assert_eq!(out, written(expected));
        assert_eq!(names, ["_x", "_y"]);
    }

    #[test]
    fn receivers_are_taken_whole() {
        let (out, names) = rebound("fn f(self: Arc<Self>, _: u8)", "k");
        assert!(
            out.contains("{ let _ = & self ; let __arg1 = __arg1 ; }"),
            "{out}"
        );
        assert_eq!(names, ["self"]);
    }

    #[test]
    fn cfg_and_lint_attributes_go_with_the_parameter() {
        let (out, _) = rebound(
            "fn f(#[cfg(any())] extra: u64, #[allow(unused_variables)] #[inline] p: u64, \
             #[cfg(feature = \"x\")] #[deny(unused_mut)] (a, b): (u8, u8))",
            "<extra>",
        );
        let expected = quote!(
            fn f(
                #[cfg(any())] extra: u64,
                #[allow(unused_variables)]
                #[inline]
                p: u64,
                #[cfg(feature = "x")]
                #[deny(unused_mut)]
                (__arg2): (u8, u8),
            ) {
                #[cfg(any())]
                let extra = extra;
                #[cfg(any())]
                let _ = &extra;
                #[allow(unused_variables)]
                let p = p;
                #[cfg(feature = "x")]
                let __arg2 = __arg2;
                #[cfg(feature = "x")]
                #[deny(unused_mut)]
                let (a, b) = __arg2;
            }
        );
        assert_eq!(out, written(expected));
    }

    #[test]
    fn expectations_move_to_the_binding() {
        let (out, _) = rebound(
            "fn f(#[expect(unused_variables)] p: u64, \
             #[cfg_attr(test, expect(non_snake_case, reason = \"r\"))] Q: u64)",
            "k",
        );
        let expected = quote!(
            fn f(
                #[allow(unused_variables)] p: u64,
                #[cfg_attr(test, allow(non_snake_case, reason = "r"))] Q: u64,
            ) {
                #[expect(unused_variables)]
                let p = p;
                #[cfg_attr(test, expect(non_snake_case, reason = "r"))]
                let Q = Q;
            }
        );
        assert_eq!(out, written(expected));
    }
}
