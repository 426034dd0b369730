//! `permits = N`: how many calls may hold the key at once.
//!
//! Read here: a whole-number literal, checked now (1 to [`MAX_PERMITS`]), or any other
//! expression, which the expansion evaluates in a `const` of type `u32` (so a constant works,
//! a runtime value is refused by the compiler at the expression, and an out-of-range
//! constant fails the build there too). Checked against the other arguments in `check.rs`:
//! permits apply to one key, in exclusive mode.

use proc_macro2::{Span, TokenStream};
use quote::{quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, ExprUnary, Lit, UnOp};

/// The most permits a key may have: the runtime's `MAX_PERMITS`.
pub(crate) const MAX_PERMITS: u32 = 1024;

/// `permits = …`, as given.
pub(crate) enum PermitsArg {
    /// A literal, checked, and where it was written.
    Count(u32, Span),
    /// Any other expression: a constant of type `u32`, checked when it is evaluated.
    Expr(Box<Expr>),
}

impl PermitsArg {
    /// Where the argument's value was written.
    pub(crate) fn span(&self) -> Span {
        match self {
            PermitsArg::Count(_, span) => *span,
            PermitsArg::Expr(expr) => expr.span(),
        }
    }

    /// The value of `Options::permits`: `Some(n)`, with the range check of a constant
    /// done at compile time.
    pub(crate) fn option_expr(&self) -> TokenStream {
        match self {
            PermitsArg::Count(count, span) => {
                let count = syn::LitInt::new(&format!("{count}u32"), *span);
                quote_spanned!(*span=> ::core::option::Option::Some(#count))
            }
            PermitsArg::Expr(expr) => {
                let at = expr.span();
                let message = format!("`permits` must be from 1 to {MAX_PERMITS}");
                quote_spanned! {at=>
                    ::core::option::Option::Some({
                        const __LOCK_PERMITS: u32 = {
                            let permits: u32 = #expr;
                            ::core::assert!(permits >= 1 && permits <= #MAX_PERMITS, #message);
                            permits
                        };
                        __LOCK_PERMITS
                    })
                }
            }
        }
    }
}

/// Reads `permits = value`.
pub(crate) fn parse(value: Expr) -> syn::Result<PermitsArg> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Int(int), ..
        }) => {
            let count: u64 = int.base10_parse().map_err(|_| not_a_count(&int))?;
            if count == 0 {
                return Err(syn::Error::new(
                    int.span(),
                    "`permits` must be at least 1: it is how many calls may hold the key at \
                     once (1 is an ordinary exclusive lock)",
                ));
            }
            match u32::try_from(count) {
                Ok(count) if count <= MAX_PERMITS => Ok(PermitsArg::Count(count, int.span())),
                _ => Err(syn::Error::new(
                    int.span(),
                    format!("`permits` of {count} is more than the {MAX_PERMITS} a key may have"),
                )),
            }
        }
        Expr::Lit(ExprLit { lit, .. }) => Err(not_a_count(&lit)),
        Expr::Unary(ExprUnary {
            op: UnOp::Neg(_), ..
        }) => Err(syn::Error::new_spanned(
            value,
            "`permits` must be at least 1: a negative count of holders means nothing",
        )),
        expr => Ok(PermitsArg::Expr(Box::new(expr))),
    }
}

/// The error for a literal that is not a whole number of permits.
fn not_a_count(lit: &impl ToTokens) -> syn::Error {
    syn::Error::new_spanned(
        lit,
        format!(
            "`permits` takes a whole number from 1 to {MAX_PERMITS} (`permits = 4`) or a \
             constant of type `u32`"
        ),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use syn::parse_quote;

    fn error(value: Expr) -> String {
        match parse(value) {
            Err(error) => error.to_string(),
            Ok(_) => panic!("accepted"),
        }
    }

    /// A literal in range is read as its count; a path is left to the compiler.
    #[test]
    fn counts_in_range_and_constants_are_read() {
        for (value, expected) in [
            (parse_quote!(1), 1),
            (parse_quote!(8), 8),
            (parse_quote!(1024), 1024),
        ] {
            match parse(value).unwrap() {
                PermitsArg::Count(count, _) => assert_eq!(count, expected),
                PermitsArg::Expr(_) => panic!("a literal read as an expression"),
            }
        }
        assert!(matches!(
            parse(parse_quote!(SEGMENTS)).unwrap(),
            PermitsArg::Expr(_)
        ));
    }

    /// Zero, negative, too many, fractional and quoted counts are refused, each saying why.
    #[test]
    fn bad_counts_are_refused_with_the_reason() {
        assert!(error(parse_quote!(0)).contains("at least 1"));
        assert!(error(parse_quote!(-2)).contains("negative"));
        assert!(error(parse_quote!(1025)).contains("more than the 1024"));
        assert!(error(parse_quote!(99999999999999999999)).contains("whole number"));
        assert!(error(parse_quote!(2.5)).contains("whole number"));
        assert!(error(parse_quote!("4")).contains("whole number"));
    }

    /// A constant is checked when the const is evaluated, with the range in the message.
    #[test]
    fn a_constant_is_checked_at_compile_time() {
        let arg = parse(parse_quote!(SEGMENTS)).unwrap();
        let out = arg.option_expr().to_string();
        assert!(out.contains("const __LOCK_PERMITS : u32"), "{out}");
        assert!(out.contains("must be from 1 to 1024"), "{out}");
    }
}
