//! Arguments passed in through `macro_rules!`: a fragment (`$key:literal`,
//! `$lease:expr`, `$krate:path`) reaches the attribute wrapped in an
//! invisible group, one per macro it went through. Both the argument
//! reader (`args.rs`) and the key list (`keys.rs`) look through them here.

use syn::Expr;

/// `value` without the invisible groups `macro_rules!` wraps fragments in,
/// however deeply nested (a fragment passed on through several macros has
/// one group per macro).
pub(crate) fn ungroup(mut value: Expr) -> Expr {
    while let Expr::Group(group) = value {
        value = *group.expr;
    }
    value
}
