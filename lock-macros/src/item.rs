//! The annotated item: parsed into a [`LockFn`] and checked to be an `async fn` returning a
//! `Result`.
//!
//! Only the signature is parsed as Rust syntax. The body is kept as raw tokens, so a typo in
//! it is reported by rustc at the typo, not by this macro at the attribute. The one exception
//! is a fn already rewritten by `#[async_trait]` (which expands before the attribute on one of
//! its methods): its body ends in `Box::pin(async move { … })`, and that future is the one to
//! run under the lock.

use proc_macro2::{Delimiter, Group, Span, TokenStream, TokenTree};
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{
    Attribute, Block, Expr, ExprAsync, ExprCall, GenericArgument, Item, PathArguments, ReturnType,
    Signature, Stmt, Token, Type, TypeParamBound, Visibility,
};

/// An annotated fn: signature parsed, body kept as tokens.
pub(crate) struct LockFn {
    /// Outer attributes (`///` docs, `#[inline]`, …), kept as they are.
    pub attrs: Vec<Attribute>,
    /// Visibility, kept.
    pub vis: Visibility,
    /// Signature, kept.
    pub sig: Signature,
    /// Inner attributes (`#![allow(…)]`) at the top of the body, kept at the top of the body.
    pub inner_attrs: Vec<Attribute>,
    /// The body's statements, braces included.
    pub body: Group,
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

/// Recognises the body `#[async_trait]` writes for a method: it ends in
/// `Box::pin(async move { … })`. Only asked for fns that are not `async` themselves.
pub(crate) fn async_trait_body(body: &Group) -> Option<AsyncTraitBody> {
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

/// True when `body` looks like the output of a runtime's entry-point attribute: an `async`
/// block and a `block_on` call (`#[tokio::test]` and `#[tokio::main]` write
/// `let body = async { … }; … .block_on(body)`, async-std and actix similar bodies). Only
/// asked for fns that are not `async`, to explain why they are not.
pub(crate) fn blocks_on_async_block(body: &Group) -> bool {
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

/// `T` in the `Pin<Box<dyn Future<Output = T> + Send + 'async_trait>>` that `#[async_trait]`
/// gives as the return type.
pub(crate) fn async_trait_output(output: &ReturnType) -> Option<&Type> {
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
pub(crate) fn check_returns_result(
    fn_name: &syn::Ident,
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
    let written = || format!("`{}`", crate::written(ty));
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

/// True when `tokens` contain `impl` anywhere (such a type cannot be named in a `let`).
pub(crate) fn mentions_impl(tokens: TokenStream) -> bool {
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
    use quote::{quote, ToTokens};

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
        let found = async_trait_body(&body).unwrap();
        assert!(found.before.is_empty());
        let body = Group::new(Delimiter::Brace, quote!(Box::pin(async { 1 })));
        assert!(async_trait_body(&body).is_none());
        let body = Group::new(Delimiter::Brace, quote!(foo(async move { 1 })));
        assert!(async_trait_body(&body).is_none());
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

    #[test]
    fn async_trait_output_is_found() {
        let sig: Signature = syn::parse2(quote!(
            fn f<'life0, 'async_trait>(&'life0 self) -> ::core::pin::Pin<Box<
                dyn ::core::future::Future<Output = Result<u8, E>> + ::core::marker::Send + 'async_trait
            >>
        ))
        .unwrap();
        let output = async_trait_output(&sig.output).unwrap();
        assert_eq!(
            output.to_token_stream().to_string(),
            quote!(Result<u8, E>).to_string()
        );
    }
}
