//! The annotated item, parsed into a [`LockFn`], or the reason it is not a fn.
//!
//! Only the signature is parsed as Rust syntax. The body is kept as raw tokens, so a typo in
//! it is reported by rustc at the typo, not by this macro at the attribute. Whether the fn
//! has the shape a lock needs (`async`, returning a `Result`) is checked in `check.rs`.

use proc_macro2::{Delimiter, Group, TokenStream};
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{Attribute, Item, Signature, Token, Visibility};

/// An annotated fn: signature parsed, body kept as tokens (a `Group`) until `check.rs`
/// tells what in it runs under the lock.
pub(crate) struct LockFn<Body = Group> {
    /// Outer attributes (`///` docs, `#[inline]`, …), kept as they are.
    pub attrs: Vec<Attribute>,
    /// Visibility, kept.
    pub vis: Visibility,
    /// Signature, kept.
    pub sig: Signature,
    /// Inner attributes (`#![allow(…)]`) at the top of the body, kept at the top of the body.
    pub inner_attrs: Vec<Attribute>,
    /// The body's statements, braces included.
    pub body: Body,
}

impl<Body> LockFn<Body> {
    /// The same fn with `to` applied to its body.
    pub(crate) fn map_body<To>(self, to: impl FnOnce(&Signature, Body) -> To) -> LockFn<To> {
        let LockFn {
            attrs,
            vis,
            sig,
            inner_attrs,
            body,
        } = self;
        let body = to(&sig, body);
        LockFn {
            attrs,
            vis,
            sig,
            inner_attrs,
            body,
        }
    }
}

impl Parse for LockFn {
    fn parse(input: ParseStream<'_>) -> syn::Result<LockFn> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis = input.parse()?;
        let sig: Signature = input.parse()?;
        if input.peek(Token![;]) {
            return Err(syn::Error::new(
                sig.ident.span(),
                format!(
                    "`{}` has no body to run under the lock: put #[distributed_lock] on the fn \
                     that implements it (in the impl), or give this trait method a default body",
                    sig.ident
                ),
            ));
        }
        let braced: Group = input.parse()?;
        if braced.delimiter() != Delimiter::Brace {
            return Err(syn::Error::new(
                braced.span(),
                "expected the fn body `{ … }`",
            ));
        }
        let (inner_attrs, statements) = syn::parse::Parser::parse2(
            |body: ParseStream<'_>| {
                let inner = body.call(Attribute::parse_inner)?;
                let rest: TokenStream = body.parse()?;
                Ok((inner, rest))
            },
            braced.stream(),
        )?;
        let mut body = Group::new(Delimiter::Brace, statements);
        body.set_span(braced.span());
        Ok(LockFn {
            attrs,
            vis,
            sig,
            inner_attrs,
            body,
        })
    }
}

/// Parses the annotated item, or explains why it is not something the attribute applies to.
pub(crate) fn parse(item: TokenStream) -> syn::Result<LockFn> {
    syn::parse2::<LockFn>(item.clone()).map_err(|fn_error| match syn::parse2::<Item>(item) {
        Ok(Item::Fn(_)) | Ok(Item::Verbatim(_)) | Err(_) => fn_error,
        Ok(other) => not_a_fn(&other),
    })
}

/// The error for an item that is not a fn, at its keyword.
fn not_a_fn(item: &Item) -> syn::Error {
    let (span, what) = match item {
        Item::Impl(item) => {
            return syn::Error::new(
                item.impl_token.span,
                "#[distributed_lock] goes on a method inside the impl, not on the impl block; \
                 with #[async_trait], keep #[async_trait] on the impl and put #[distributed_lock] \
                 on each method to lock",
            )
        }
        Item::Trait(item) => {
            return syn::Error::new(
                item.trait_token.span,
                "#[distributed_lock] goes on a method (in an impl, or a trait method with a \
                 default body), not on the trait; with #[async_trait], keep #[async_trait] on \
                 the trait or impl and put #[distributed_lock] on the method",
            )
        }
        Item::Struct(item) => (item.struct_token.span, "a struct"),
        Item::Enum(item) => (item.enum_token.span, "an enum"),
        Item::Union(item) => (item.union_token.span, "a union"),
        Item::Mod(item) => (item.mod_token.span, "a module"),
        Item::Const(item) => (item.const_token.span, "a const"),
        Item::Static(item) => (item.static_token.span, "a static"),
        Item::Type(item) => (item.type_token.span, "a type alias"),
        Item::Use(item) => (item.use_token.span, "a use declaration"),
        Item::Macro(item) => (item.mac.path.span(), "a macro invocation"),
        other => (other.span(), "this item"),
    };
    syn::Error::new(
        span,
        format!("#[distributed_lock] applies to an `async fn`, not to {what}"),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use quote::quote;

    #[test]
    fn body_and_inner_attributes_are_split() {
        let f: LockFn = syn::parse2(quote!(
            /// doc
            pub(crate) async fn f(x: u8) -> R {
                #![allow(unused)]
                let y = x;
                y
            }
        ))
        .unwrap();
        assert_eq!(f.attrs.len(), 1);
        assert_eq!(f.inner_attrs.len(), 1);
        assert_eq!(
            f.body.stream().to_string(),
            quote!(let y = x; y).to_string()
        );
    }

    #[test]
    fn items_that_are_not_fns_are_named() {
        let error = |tokens| parse(tokens).err().unwrap().to_string();
        assert!(error(quote!(
            struct S;
        ))
        .contains("not to a struct"));
        assert!(error(quote!(impl S {})).contains("not on the impl block"));
        assert!(error(quote!(
            trait T {}
        ))
        .contains("not on the trait"));
        assert!(error(quote!(
            async fn f(&self) -> R;
        ))
        .contains("has no body"));
    }
}
