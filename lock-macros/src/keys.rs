//! Many keys in one attribute: `key = ["account:<from>", "account:<to>"]` read into its
//! templates, and the checked templates kept to different keys.
//!
//! Why a module of its own: a list is a second shape of the one `key` argument, with mistakes
//! a single key cannot make (an empty list, an element that is not a string, the same key
//! twice). Everything a single template can get wrong is still `template.rs`'s, checked per
//! element and reported at that element's literal, exactly as for `key = "…"`.
//!
//! A list is one lock call for all its keys (`__private::locked_many_with`), which takes them
//! in sorted order at run time; a list of one key is that key, and expands as `key = "…"`
//! does. The runtime takes equal keys once; a list naming the same key twice is still refused
//! here, since it is always a slip (a template copied and not edited): two literals with the
//! same text, or two templates that build the same text from the same values (`"x{"` and
//! `"x{{"`). Two templates that only happen to format alike for some arguments
//! (`"a:<from>"`, `"a:<to>"` with `from == to`) are two keys here and one at run time.

use syn::spanned::Spanned;
use syn::{Expr, ExprLit, Lit, LitStr};

use crate::errors::Errors;
use crate::template::Template;

/// The example every message about a list shows.
const EXAMPLE: &str = "`key = [\"account:<from>\", \"account:<to>\"]`";

/// The templates of `key = …`, in the order written: one for `key = "…"`, each string of
/// `key = [ … ]` otherwise.
pub(crate) struct Keys(pub Vec<LitStr>);

impl Keys {
    /// The key of `key = "…"`.
    pub(crate) fn one(lit: LitStr) -> Keys {
        Keys(vec![lit])
    }
}

/// `value` as the key's templates: a string literal, or an array of them. A bad element is
/// added to `errors` and left out, so that the others are still checked against the fn; an
/// empty list, or a value of another kind, is the error returned (not added).
pub(crate) fn parse(value: &Expr, errors: &mut Errors) -> syn::Result<Keys> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => Ok(Keys::one(lit.clone())),
        Expr::Array(array) => {
            if array.elems.is_empty() {
                return Err(syn::Error::new(
                    array.bracket_token.span.join(),
                    format!("`key = []` names no lock: list at least one key, as in {EXAMPLE}"),
                ));
            }
            let mut templates = Vec::new();
            for element in &array.elems {
                match crate::fragments::ungroup(element.clone()) {
                    Expr::Lit(ExprLit {
                        lit: Lit::Str(lit), ..
                    }) => templates.push(lit),
                    other => errors.push(not_a_string(&other)),
                }
            }
            Ok(Keys(templates))
        }
        // `key = ("a", "b")`: a list meant, in the wrong brackets.
        Expr::Tuple(tuple) if !tuple.elems.is_empty() => Err(syn::Error::new_spanned(
            tuple,
            format!("a list of keys is written in square brackets, as in {EXAMPLE}"),
        )),
        other => Err(syn::Error::new_spanned(
            other,
            format!(
                "`key` takes a string literal, as in `key = \"order:<id>\"`, or a list of them, \
                 as in {EXAMPLE}"
            ),
        )),
    }
}

/// The error for an element of the list that is not a string literal.
fn not_a_string(element: &Expr) -> syn::Error {
    let hint = match element {
        Expr::Lit(ExprLit {
            lit: Lit::Int(int), ..
        }) => format!(
            " (a number is written in a template: `\"{}\"`)",
            int.base10_digits()
        ),
        Expr::Path(path) if path.path.get_ident().is_some() => format!(
            " (a parameter is written as a placeholder: `\"<{}>\"`)",
            crate::written::written(path)
        ),
        _ => String::new(),
    };
    syn::Error::new(
        element.span(),
        format!("each key in the list is a string literal template, as in {EXAMPLE}{hint}"),
    )
}

/// `templates` (each with its literal) without the ones naming a key listed before them;
/// each of those is an error, at its literal.
pub(crate) fn distinct(
    templates: Vec<(LitStr, Template)>,
    errors: &mut Errors,
) -> Vec<(LitStr, Template)> {
    let mut kept: Vec<(LitStr, Template)> = Vec::new();
    for (lit, template) in templates {
        match kept.iter().position(|(_, seen)| seen.same_key(&template)) {
            Some(index) => errors.push(duplicate(&lit, &kept[index].0, index)),
            None => kept.push((lit, template)),
        }
    }
    kept
}

/// The error for `lit`, which names the same key as `first`, the list's key number `index`.
fn duplicate(lit: &LitStr, first: &LitStr, index: usize) -> syn::Error {
    let (text, first_text) = (lit.value(), first.value());
    let nth = ordinal(index + 1);
    let message = if text == first_text {
        format!(
            "duplicate key \"{text}\": it is already the {nth} key of the list; each key is \
             locked once, remove this one"
        )
    } else {
        format!(
            "key \"{text}\" is the same key as \"{first_text}\", the {nth} key of the list; \
             each key is locked once, remove one of them"
        )
    };
    syn::Error::new(lit.span(), message)
}

/// `1st`, `2nd`, `3rd`, `4th`, … `11th`, `21st`.
fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use quote::quote;

    fn read(tokens: proc_macro2::TokenStream) -> (syn::Result<Vec<String>>, Vec<String>) {
        let mut errors = Errors::default();
        let value: Expr = syn::parse2(tokens).unwrap();
        let keys =
            parse(&value, &mut errors).map(|keys| keys.0.iter().map(LitStr::value).collect());
        let errors = match errors.finish(()) {
            Ok(()) => Vec::new(),
            Err(errors) => errors.into_iter().map(|e| e.to_string()).collect(),
        };
        (keys, errors)
    }

    #[test]
    fn a_string_is_one_key_and_a_list_is_its_strings_in_order() {
        assert_eq!(read(quote!("order:<id>")).0.unwrap(), ["order:<id>"]);
        let (keys, errors) = read(quote!(["account:<to>", "account:<from>",]));
        assert_eq!(keys.unwrap(), ["account:<to>", "account:<from>"]);
        assert!(errors.is_empty());
    }

    #[test]
    fn an_empty_list_is_refused() {
        let error = read(quote!([])).0.unwrap_err().to_string();
        assert!(
            error.starts_with("`key = []` names no lock: list at least one key"),
            "{error}"
        );
    }

    #[test]
    fn an_element_that_is_not_a_string_is_refused_and_the_others_kept() {
        let (keys, errors) = read(quote!(["a:<x>", 42, id, b"b", "c"]));
        assert_eq!(keys.unwrap(), ["a:<x>", "c"]);
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(errors
            .iter()
            .all(|e| e.starts_with("each key in the list is a string literal template")));
        assert!(errors[0].ends_with("(a number is written in a template: `\"42\"`)"));
        assert!(errors[1].ends_with("(a parameter is written as a placeholder: `\"<id>\"`)"));
    }

    #[test]
    fn macro_fragments_in_a_list_are_unwrapped() {
        let group = |tokens| proc_macro2::Group::new(proc_macro2::Delimiter::None, tokens);
        let (first, second) = (group(quote!("a:<x>")), group(quote!("b:<y>")));
        let (keys, errors) = read(quote!([#first, #second]));
        assert_eq!(keys.unwrap(), ["a:<x>", "b:<y>"]);
        assert!(errors.is_empty());
    }

    #[test]
    fn a_tuple_or_another_value_says_how_to_write_a_list() {
        let error = read(quote!(("a", "b"))).0.unwrap_err().to_string();
        assert!(error.starts_with("a list of keys is written in square brackets"));
        let error = read(quote!(order)).0.unwrap_err().to_string();
        assert!(
            error.starts_with(
                "`key` takes a string literal, as in `key = \"order:<id>\"`, or a list"
            ),
            "{error}"
        );
    }

    #[test]
    fn ordinals_read_as_english() {
        let all: Vec<String> = [1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111]
            .into_iter()
            .map(ordinal)
            .collect();
        assert_eq!(
            all,
            [
                "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st",
                "111th"
            ]
        );
    }
}
