//! Methods written by `#[async_trait]`, recognised.
//!
//! Inside an `#[async_trait]` impl, async-trait expands before the attribute on one of its
//! methods and hands it a fn that is not `async`: its body ends in
//! `Box::pin(async move { … })` and its return type is
//! `Pin<Box<dyn Future<Output = T> + Send + 'async_trait>>`. That boxed future is what runs
//! the user's body, so it is the one to run under the lock, and `T` is the type to check.

use proc_macro2::Group;
use syn::{
    Block, Expr, ExprAsync, ExprCall, GenericArgument, Ident, Pat, PathArguments, ReturnType, Stmt,
    Type, TypeParamBound,
};

use crate::patterns::Destructured;

/// A body produced by `#[async_trait]`: the statements before `Box::pin(...)`, the call's
/// function path (`Box::pin`), and the `async move { … }` future inside it.
pub(crate) struct AsyncTraitBody {
    /// Statements before the `Box::pin(...)` tail, kept in place.
    pub before: Vec<Stmt>,
    /// `Box::pin`, as written by async-trait.
    pub pin: Box<Expr>,
    /// The boxed future: runs the user's body.
    pub future: ExprAsync,
}

impl AsyncTraitBody {
    /// Recognises the body `#[async_trait]` writes for a method: it ends in
    /// `Box::pin(async move { … })`. Only asked for fns that are not `async` themselves.
    pub(crate) fn recognise(body: &Group) -> Option<AsyncTraitBody> {
        let mut stmts = syn::parse::Parser::parse2(Block::parse_within, body.stream()).ok()?;
        let Some(Stmt::Expr(Expr::Call(ExprCall { func, args, .. }), None)) = stmts.pop() else {
            return None;
        };
        let is_box_pin = matches!(&*func, Expr::Path(path)
            if path.path.segments.len() >= 2
                && path.path.segments.iter().rev().take(2).map(|s| s.ident.to_string()).eq(["pin", "Box"]));
        if !is_box_pin || args.len() != 1 {
            return None;
        }
        match args.into_iter().next() {
            Some(Expr::Async(future)) if future.capture.is_some() => Some(AsyncTraitBody {
                before: stmts,
                pin: func,
                future,
            }),
            _ => None,
        }
    }

    /// The parameters async-trait hands to the future whole and destructures there: for
    /// `(a, b): (A, B)` the signature binds `__arg1` and the future starts with
    /// `let (a, b) = { let __arg1 = __arg1; __arg1 };` (older versions: `= __arg1;`). The key
    /// reaches `a` through that pattern, as for a native `async fn`.
    pub(crate) fn destructured(&self) -> Vec<Destructured> {
        self.future
            .block
            .stmts
            .iter()
            .filter_map(|stmt| {
                let Stmt::Local(local) = stmt else {
                    return None;
                };
                let place = moved_argument(&local.init.as_ref()?.expr)?;
                let cfg = local
                    .attrs
                    .iter()
                    .filter(|attr| attr.path().is_ident("cfg"))
                    .cloned()
                    .collect();
                Some(Destructured {
                    cfg,
                    pattern: local.pat.clone(),
                    place: place.clone(),
                })
            })
            .collect()
    }
}

/// `__argN` when `expr` is `__argN` or `{ let __argN = __argN; __argN }`.
fn moved_argument(expr: &Expr) -> Option<&Ident> {
    match expr {
        Expr::Block(block) => match block.block.stmts.as_slice() {
            [Stmt::Local(moved), Stmt::Expr(tail, None)] => {
                let argument = argument(tail)?;
                matches!(&moved.pat, Pat::Ident(pat) if pat.ident == *argument).then_some(argument)
            }
            _ => None,
        },
        expr => argument(expr),
    }
}

/// `__argN` when `expr` is that name: how async-trait names a parameter it does not pass by
/// name.
fn argument(expr: &Expr) -> Option<&Ident> {
    let Expr::Path(path) = expr else {
        return None;
    };
    path.path
        .get_ident()
        .filter(|ident| ident.to_string().starts_with("__arg"))
}
/// `T` in the `Pin<Box<dyn Future<Output = T> + Send + 'async_trait>>` that `#[async_trait]`
/// gives as the return type.
pub(crate) fn future_output(output: &ReturnType) -> Option<&Type> {
    let ReturnType::Type(_, ty) = output else {
        return None;
    };
    let boxed = only_type_argument(ty, "Pin")?;
    let Type::TraitObject(object) = only_type_argument(boxed, "Box")? else {
        return None;
    };
    object.bounds.iter().find_map(|bound| {
        let TypeParamBound::Trait(bound) = bound else {
            return None;
        };
        let segment = bound.path.segments.last()?;
        let PathArguments::AngleBracketed(args) = &segment.arguments else {
            return None;
        };
        args.args.iter().find_map(|arg| match arg {
            GenericArgument::AssocType(assoc) if assoc.ident == "Output" => Some(&assoc.ty),
            _ => None,
        })
    })
}

/// The single type argument of `ty` when `ty` is a path ending in `name<…>`.
fn only_type_argument<'a>(ty: &'a Type, name: &str) -> Option<&'a Type> {
    let Type::Path(path) = ty else { return None };
    let segment = path.path.segments.last()?;
    if segment.ident != name {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &segment.arguments else {
        return None;
    };
    args.args.iter().find_map(|arg| match arg {
        GenericArgument::Type(ty) => Some(ty),
        _ => None,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proc_macro2::Delimiter;
    use quote::{quote, ToTokens};
    use syn::Signature;

    #[test]
    fn async_trait_bodies_are_recognised() {
        let body = Group::new(
            Delimiter::Brace,
            quote!(Box::pin(async move {
                let __self = self;
                let __ret: R = { 1 };
                __ret
            })),
        );
        let found = AsyncTraitBody::recognise(&body).unwrap();
        assert!(found.before.is_empty());
        let body = Group::new(Delimiter::Brace, quote!(Box::pin(async { 1 })));
        assert!(AsyncTraitBody::recognise(&body).is_none());
        let body = Group::new(Delimiter::Brace, quote!(foo(async move { 1 })));
        assert!(AsyncTraitBody::recognise(&body).is_none());
    }

    #[test]
    fn parameters_async_trait_destructures_in_the_future_are_found() {
        let body = Group::new(
            Delimiter::Brace,
            quote!(Box::pin(async move {
                let __self = self;
                let x = x;
                #[cfg(feature = "f")]
                let (a, b) = {
                    let __arg2 = __arg2;
                    __arg2
                };
                let P { c, .. } = __arg3;
                let other = {
                    let y = z;
                    y
                };
                let __ret: R = { 1 };
                __ret
            })),
        );
        let found = AsyncTraitBody::recognise(&body).unwrap().destructured();
        let found: Vec<(String, String, usize)> = found
            .iter()
            .map(|d| {
                let pattern = d.pattern.to_token_stream().to_string();
                (d.place.to_string(), pattern, d.cfg.len())
            })
            .collect();
        assert_eq!(
            found,
            [
                ("__arg2".to_owned(), "(a , b)".to_owned(), 1),
                ("__arg3".to_owned(), "P { c , .. }".to_owned(), 0),
            ]
        );
    }

    #[test]
    fn async_trait_output_is_found() {
        let sig: Signature = syn::parse2(quote!(
            fn f<'life0, 'async_trait>(&'life0 self) -> ::core::pin::Pin<Box<
                dyn ::core::future::Future<Output = Result<u8, E>> + ::core::marker::Send + 'async_trait
            >>
        ))
        .unwrap();
        let output = future_output(&sig.output).unwrap();
        assert_eq!(
            output.to_token_stream().to_string(),
            quote!(Result<u8, E>).to_string()
        );
    }
}
