//! The names a parameter's pattern binds, and how the key reaches them.
//!
//! A key placeholder may start at any name a parameter binds, as the body could use it:
//! `id`, `mut total`, `ref name`, `ref mut buf`, `a` in `(a, b)`, `left` in
//! `Pair { left, .. }`, `all` and `x` in `all @ (x, _)`, `self`. The key is formatted
//! before the body takes the parameters, so it reads a name the signature binds (`id`,
//! `self`) directly; a name bound inside a pattern exists only once the body has
//! destructured the parameter, so the key destructures it too, from the value the signature
//! holds (`__argN`), without moving anything out of it: [`borrowing`] rewrites the pattern
//! so that each name the key reads binds by reference and every other binding becomes `_`,
//! which binds and moves nothing. `{ let (ref a, _) = __arg1; format!("{}", a) }` borrows
//! `a` in place; the body then moves `__arg1` and destructures it as before, so the drop
//! order and what the body sees are untouched.
//!
//! The rewritten pattern is matched against a value of the same type as the user's pattern,
//! so every default binding mode is the user's, and only bindings change. `ref` gives a
//! reference whatever the default binding mode at that point, which the macro cannot know
//! (it depends on types): in edition 2021 a `ref` under a by-reference default mode (the
//! user's `(a, b): &(A, B)`) is allowed, while edition 2024 refuses it. The edition that
//! applies is that of the tokens' span: the `ref` and the name are the macro's tokens, so
//! the macro crate's edition, 2021, applies in every user's crate. (Moving this crate to
//! edition 2024 would break keys that read such bindings: ui-tests/pass/key_from_patterns.rs
//! has one, and ui-tests/tests/edition_2024.rs checks it in an edition-2024 crate.)
//!
//! The names the key binds are hygienic (`Span::mixed_site()`, located at the user's
//! name): no lint about the user's binding (unused, `_x` used) fires on the key's copy, and
//! the key's bindings cannot shadow or be seen by anything else.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{token, Attribute, Ident, Member, Pat, PatMacro, PatWild};

/// The names the key can start from: the ones the signature binds, and the parameters it
/// hands over whole to be destructured later.
#[derive(Default)]
pub(crate) struct Scope {
    /// Names the signature binds (`self`, `id`, a hygienic `_x`), as it binds them.
    pub names: Vec<Ident>,
    /// Parameters the signature binds to one hidden name and a body destructures.
    pub destructured: Vec<Destructured>,
}

/// A parameter held whole by the signature (`place`, a hidden `__argN`) and the user's
/// pattern that destructures it in the body.
pub(crate) struct Destructured {
    /// The parameter's `#[cfg]`s: where it is configured away, so is its destructuring.
    pub cfg: Vec<Attribute>,
    /// The pattern as the user wrote it.
    pub pattern: Pat,
    /// The name the signature binds the whole value to.
    pub place: Ident,
}

/// Every name `pattern` binds, in order of appearance (a name bound in each alternative of
/// an or-pattern appears once per alternative). The bindings a macro pattern (`m!(…)`)
/// makes are not known before it expands and are not listed.
pub(crate) fn bindings(pattern: &Pat) -> Vec<&Ident> {
    let mut names = Vec::new();
    walk(pattern, &mut |pattern| {
        if let Pat::Ident(ident) = pattern {
            names.push(&ident.ident);
        }
    });
    names
}

/// The first macro pattern (`m!(…)`) in `pattern`: the names it binds are not known here.
pub(crate) fn first_macro(pattern: &Pat) -> Option<&PatMacro> {
    let mut found = None;
    walk(pattern, &mut |pattern| {
        if let (Pat::Macro(mac), None) = (pattern, &found) {
            found = Some(mac);
        }
    });
    found
}

/// Calls `visit` on `pattern` and every pattern in it, outermost first.
fn walk<'a>(pattern: &'a Pat, visit: &mut impl FnMut(&'a Pat)) {
    visit(pattern);
    match pattern {
        Pat::Ident(ident) => {
            if let Some((_, sub)) = &ident.subpat {
                walk(sub, visit);
            }
        }
        Pat::Tuple(tuple) => tuple.elems.iter().for_each(|p| walk(p, visit)),
        Pat::TupleStruct(tuple) => tuple.elems.iter().for_each(|p| walk(p, visit)),
        Pat::Struct(fields) => fields.fields.iter().for_each(|f| walk(&f.pat, visit)),
        Pat::Slice(slice) => slice.elems.iter().for_each(|p| walk(p, visit)),
        Pat::Reference(reference) => walk(&reference.pat, visit),
        Pat::Type(typed) => walk(&typed.pat, visit),
        Pat::Paren(paren) => walk(&paren.pat, visit),
        Pat::Or(or) => or.cases.iter().for_each(|p| walk(p, visit)),
        _ => {}
    }
}

/// True when `pattern` takes a `ref mut` borrow of the value it is matched against (not of
/// a value behind a reference in it): `ref mut x`, `(ref mut a, _)`, but not
/// `&mut (ref mut a)`. The value must then be held in a `mut` binding, as rustc's own
/// lowering of an `async fn` does with `let mut __argN = __argN;`.
pub(crate) fn borrows_mutably(pattern: &Pat) -> bool {
    match pattern {
        Pat::Ident(ident) => {
            (ident.by_ref.is_some() && ident.mutability.is_some())
                || ident
                    .subpat
                    .as_ref()
                    .is_some_and(|(_, sub)| borrows_mutably(sub))
        }
        Pat::Tuple(tuple) => tuple.elems.iter().any(borrows_mutably),
        Pat::TupleStruct(tuple) => tuple.elems.iter().any(borrows_mutably),
        Pat::Struct(fields) => fields.fields.iter().any(|f| borrows_mutably(&f.pat)),
        Pat::Slice(slice) => slice.elems.iter().any(borrows_mutably),
        Pat::Type(typed) => borrows_mutably(&typed.pat),
        Pat::Paren(paren) => borrows_mutably(&paren.pat),
        Pat::Or(or) => or.cases.iter().any(borrows_mutably),
        // Behind a reference pattern, a borrow is of what the reference points to.
        _ => false,
    }
}

/// `pattern` rewritten for the key (see the module docs): each binding `reads` accepts
/// becomes `ref` and a hygienic copy of its name, every other binding `_` (or, for
/// `name @ sub`, `sub` rewritten). Returns the pattern and the hygienic names it binds, in
/// order, each once; `None` when the key reads none of its names.
pub(crate) fn borrowing(
    pattern: &Pat,
    reads: &dyn Fn(&Ident) -> bool,
) -> Option<(Pat, Vec<Ident>)> {
    let mut bound = Vec::new();
    let pattern = rewrite(pattern, reads, &mut bound);
    (!bound.is_empty()).then_some((pattern, bound))
}

/// `pattern` rewritten; the hygienic names it binds are added to `bound`. Patterns that
/// bind nothing (`..`, `_`, a literal) stay as they are: `(a, ..)` keeps its shape.
fn rewrite(pattern: &Pat, reads: &dyn Fn(&Ident) -> bool, bound: &mut Vec<Ident>) -> Pat {
    let mut pattern = pattern.clone();
    match &mut pattern {
        Pat::Ident(ident) => {
            let read = reads(&ident.ident);
            if read {
                let span = Span::mixed_site().located_at(ident.ident.span());
                let hidden = Ident::new(&ident.ident.to_string(), span);
                if !bound.contains(&hidden) {
                    bound.push(hidden.clone());
                }
                ident.by_ref = Some(token::Ref(span));
                ident.mutability = None;
                ident.ident = hidden;
            }
            let sub = ident
                .subpat
                .take()
                .map(|(at, sub)| (at, Box::new(rewrite(&sub, reads, bound))));
            if read {
                ident.subpat = sub;
            } else {
                // `name @ sub` matches what `sub` does; `name` alone matches anything.
                return match sub {
                    Some((_, sub)) => *sub,
                    None => wild(ident.ident.span()),
                };
            }
        }
        Pat::Tuple(tuple) => rewrite_all(tuple.elems.iter_mut(), reads, bound),
        Pat::TupleStruct(tuple) => rewrite_all(tuple.elems.iter_mut(), reads, bound),
        Pat::Slice(slice) => rewrite_all(slice.elems.iter_mut(), reads, bound),
        Pat::Or(or) => rewrite_all(or.cases.iter_mut(), reads, bound),
        Pat::Struct(fields) => {
            for field in &mut fields.fields {
                // The shorthand `Pair { left }` is written out: the name bound is no longer
                // the field's (`Pair { left: ref left }`, `Pair { left: _ }`).
                if field.colon_token.is_none() {
                    let span = match &field.member {
                        Member::Named(name) => name.span(),
                        Member::Unnamed(index) => index.span,
                    };
                    field.colon_token = Some(token::Colon(span));
                }
                *field.pat = rewrite(&field.pat, reads, bound);
            }
        }
        Pat::Reference(reference) => *reference.pat = rewrite(&reference.pat, reads, bound),
        Pat::Type(typed) => *typed.pat = rewrite(&typed.pat, reads, bound),
        Pat::Paren(paren) => *paren.pat = rewrite(&paren.pat, reads, bound),
        // What a macro pattern binds is not known here (and the key cannot read it): it
        // must bind nothing in the key's copy.
        Pat::Macro(mac) => return wild(mac.mac.path.span()),
        _ => {}
    }
    pattern
}

/// Rewrites each of `patterns` in place.
fn rewrite_all<'a>(
    patterns: impl Iterator<Item = &'a mut Pat>,
    reads: &dyn Fn(&Ident) -> bool,
    bound: &mut Vec<Ident>,
) {
    for pattern in patterns {
        *pattern = rewrite(pattern, reads, bound);
    }
}

/// `_`, at `at`.
fn wild(at: Span) -> Pat {
    Pat::Wild(PatWild {
        attrs: Vec::new(),
        underscore_token: token::Underscore(Span::mixed_site().located_at(at)),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use quote::ToTokens;

    fn pat(text: &str) -> Pat {
        syn::parse::Parser::parse_str(Pat::parse_multi, text).unwrap()
    }

    /// The pattern as the key reads it when it reads `read`, and the names it binds.
    fn borrowed(text: &str, read: &[&str]) -> Option<(String, Vec<String>)> {
        let reads = |name: &Ident| read.iter().any(|read| name == read);
        borrowing(&pat(text), &reads).map(|(pattern, bound)| {
            (
                pattern.to_token_stream().to_string(),
                bound.iter().map(ToString::to_string).collect(),
            )
        })
    }

    #[test]
    fn every_binding_is_listed_once_per_place() {
        let names = |text: &str| -> Vec<String> {
            bindings(&pat(text))
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        assert_eq!(names("ref mut r"), ["r"]);
        assert_eq!(
            names("all @ (a, P { x, y: mut z, .. }, [first, rest @ ..], &w)"),
            ["all", "a", "x", "z", "first", "rest", "w"]
        );
        assert_eq!(names("(A(v) | B(v))"), ["v", "v"]);
        assert_eq!(names("(_, m!(hidden), ..)"), Vec::<String>::new());
    }

    #[test]
    fn a_macro_pattern_is_found() {
        let pattern = pat("(a, (m!(x), n!(y)))");
        let found = first_macro(&pattern).unwrap();
        assert_eq!(found.to_token_stream().to_string(), "m ! (x)");
        assert!(first_macro(&pat("(a, b)")).is_none());
    }

    #[test]
    fn only_ref_mut_outside_a_reference_borrows_the_value_mutably() {
        assert!(borrows_mutably(&pat("ref mut r")));
        assert!(borrows_mutably(&pat("(a, ref mut b)")));
        assert!(borrows_mutably(&pat("all @ P { x: ref mut x, .. }")));
        assert!(!borrows_mutably(&pat("ref r")));
        assert!(!borrows_mutably(&pat("(mut a, b)")));
        assert!(!borrows_mutably(&pat("&mut (ref mut a)")));
    }

    #[test]
    fn names_the_key_reads_bind_by_reference_and_others_bind_nothing() {
        assert_eq!(
            borrowed("(a, mut b, ref mut c)", &["b"]).unwrap(),
            ("(_ , ref b , _)".to_owned(), vec!["b".to_owned()])
        );
        assert_eq!(borrowed("ref mut name", &["name"]).unwrap().0, "ref name");
        assert_eq!(borrowed("(a, b)", &["c"]), None);
        assert_eq!(borrowed("_", &["a"]), None);
    }

    #[test]
    fn the_pattern_keeps_its_shape() {
        // Rest patterns, literals and references stay; a shorthand field is written out.
        assert_eq!(
            borrowed("[first, .., last]", &["last"]).unwrap().0,
            "[_ , .. , ref last]"
        );
        assert_eq!(
            borrowed("P { left, right: r, .. }", &["left"]).unwrap().0,
            "P { left : ref left , right : _ , .. }"
        );
        assert_eq!(borrowed("(&n, 0)", &["n"]).unwrap().0, "(& ref n , 0)");
        assert_eq!(
            borrowed("(A(v) | B(v))", &["v"]).unwrap(),
            ("(A (ref v) | B (ref v))".to_owned(), vec!["v".to_owned()])
        );
    }

    #[test]
    fn a_binding_at_a_subpattern_keeps_what_the_subpattern_reads() {
        assert_eq!(
            borrowed("all @ (x, _)", &["all", "x"]).unwrap(),
            (
                "ref all @ (ref x , _)".to_owned(),
                vec!["all".to_owned(), "x".to_owned()]
            )
        );
        assert_eq!(borrowed("all @ (x, _)", &["x"]).unwrap().0, "(ref x , _)");
        // `rest @ ..` keeps its `..`: without it the slice pattern would change its length.
        assert_eq!(
            borrowed("[first, rest @ ..]", &["first"]).unwrap().0,
            "[ref first , ..]"
        );
        assert_eq!(
            borrowed("[first, rest @ ..]", &["rest"]).unwrap().0,
            "[_ , ref rest @ ..]"
        );
    }

    #[test]
    fn a_macro_pattern_binds_nothing_in_the_key() {
        assert_eq!(borrowed("(a, m!(b))", &["a"]).unwrap().0, "(ref a , _)");
    }
}
