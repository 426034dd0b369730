//! Where the tokens the macro writes point.
//!
//! A generated token is located at the user's token it concerns (the return type, the key, a
//! duration), so that an error about it points there, but keeps the macro's own hygiene, so
//! that lints (`unused_qualifications`, `unreachable_code`, clippy's) treat it as generated
//! code and leave the user's code alone.

use proc_macro2::{Group, Span, TokenStream, TokenTree};

/// A span for a token the macro writes at `at`: located there, resolved at the call site.
pub(crate) fn generated(at: Span) -> Span {
    Span::call_site().located_at(at)
}

/// `tokens` (nested ones included) located at `span`, each keeping its own hygiene: the
/// macro's own tokens stay the macro's, and a path the user gave (`crate = "crate::locks"`,
/// or `$crate::locks` from a `macro_rules!`) still resolves where the user wrote it.
pub(crate) fn relocate(tokens: TokenStream, span: Span) -> TokenStream {
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
