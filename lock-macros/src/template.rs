//! The key template: `"order:<id>"` → literal text and placeholders, checked against the fn.
//!
//! A template is parsed once into [`Segment`]s. Placeholders are then checked against the fn's
//! parameters ([`Params`]); a checked [`Template`] holds only text and placeholders, each
//! placeholder with its parameter and fields already parsed as Rust names, and is finally
//! turned into one `format!` call whose arguments are place expressions (`id`,
//! `req.order_id`, `self.tenant`): `format!` only borrows them, so the key is built without
//! cloning or moving any argument, before the body takes them. A name bound inside a
//! parameter's pattern (`a` in `(a, b)`, `name` in `ref name`) is borrowed the same way,
//! through the pattern rewritten by `patterns.rs`.
//!
//! Spans: the generated tokens sit at the key literal, so an error about a value (a field that
//! does not exist, a type that is not `Display`) points at the key; they are the macro's own
//! tokens there (`Span::call_site().located_at(key)`), so lints treat them as generated code.
//! A placeholder's parameter name resolves as the parameter in the signature does (its span's
//! hygiene, located at the key), which is what makes a key passed into `macro_rules!` as a
//! fragment find a parameter the macro wrote, and the other way round. Field names are the
//! macro's tokens too: with the user's span, rustc would answer a misspelt field (`<req.idd>`)
//! with a fix that replaces the whole key literal by the field's name (`key = id`). A span
//! inside the literal, which would make that fix right, needs `Literal::subspan` (nightly
//! only); so the error is "no field `idd` on type `Req`" at the key, with no fix and no list.
//!
//! Syntax: `<name>` or `<name.field.0>` formats a parameter (or a field of it) with `Display`;
//! `<<` is a literal `<`, `{{` a literal `{` and `}}` a literal `}`; everything else, `>` and
//! single braces included, is literal text.
//!
//! Why braces matter at all: `format!` taught every Rust programmer to write `{id}`, and a key
//! `"order:{id}"` would lock the literal text `order:{id}`, one lock for every order, without
//! a word. So a brace group that names a parameter (`{id}`, `{req.order_id}`, `{self.tenant}`,
//! `{id:?}`) is refused with the `<id>` spelling. The escapes are `format!`'s own, so the
//! literal text `{id}` is written as it would be there, `{{id}}`; a brace group that names no
//! parameter (`{tenant}` in a fn without `tenant`) stays literal text, as it always was.

use std::fmt;

use proc_macro2::{Span, TokenStream};
use quote::{quote_spanned, ToTokens};
use syn::{FnArg, Ident, Member, Pat, Signature};

use crate::errors::Errors;
use crate::patterns::{self, Destructured, Scope};
use crate::spans::generated;
use crate::suggest;
use crate::written::written;

/// One piece of a key template, as parsed.
#[derive(Debug, PartialEq)]
pub(crate) enum Segment {
    /// Text copied into the key as is.
    Text(String),
    /// A value formatted into the key.
    Value(Placeholder),
    /// `{inner}`: literal text, braces included, that looks like a `format!` placeholder. It is
    /// kept apart until it has been checked against the parameters, then joins the text.
    Braced(String),
}

/// `<root.field.field>`: a parameter and the fields to follow from it.
#[derive(PartialEq)]
pub(crate) struct Placeholder {
    /// The parameter name, `self` included.
    root: Ident,
    /// Field names or tuple indices, in order.
    fields: Vec<Member>,
    /// What stands between `<` and `>`, as written, for messages.
    text: String,
}

impl Placeholder {
    /// The placeholder as the user wrote it, `<` and `>` included.
    fn written(&self) -> String {
        format!("<{}>", self.text)
    }
}

impl fmt::Debug for Placeholder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.written())
    }
}

/// Splits a template into segments, or says what is wrong with its syntax.
pub(crate) fn parse(text: &str) -> Result<Vec<Segment>, String> {
    let mut segments = Vec::new();
    let mut literal = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(['<', '{', '}']) {
        literal.push_str(&rest[..at]);
        let mark = &rest[at..at + 1];
        let after = &rest[at + 1..];
        // `<<`, `{{` and `}}`: the character itself.
        if let Some(after_escape) = after.strip_prefix(mark) {
            literal.push_str(mark);
            rest = after_escape;
            continue;
        }
        match mark {
            "<" => {
                let Some(close) = after.find('>') else {
                    return Err(format!(
                        "unclosed placeholder `<{after}` in key \"{text}\": end it with `>`, or write `<<` for a literal `<`"
                    ));
                };
                let placeholder = parse_placeholder(&after[..close], text)?;
                segments.extend(take_text(&mut literal).map(Segment::Text));
                segments.push(Segment::Value(placeholder));
                rest = &after[close + 1..];
            }
            // `{inner}` with nothing in it that the template gives a meaning to.
            "{" => match after.find(['<', '{', '}']) {
                Some(close) if after[close..].starts_with('}') => {
                    segments.extend(take_text(&mut literal).map(Segment::Text));
                    segments.push(Segment::Braced(after[..close].to_owned()));
                    rest = &after[close + 1..];
                }
                _ => {
                    literal.push('{');
                    rest = after;
                }
            },
            _ => {
                literal.push_str(mark);
                rest = after;
            }
        }
    }
    literal.push_str(rest);
    segments.extend(take_text(&mut literal).map(Segment::Text));
    Ok(segments)
}

/// The text gathered in `literal`, if any, leaving it empty.
fn take_text(literal: &mut String) -> Option<String> {
    (!literal.is_empty()).then(|| std::mem::take(literal))
}

/// Parses what stands between `<` and `>`.
fn parse_placeholder(inner: &str, text: &str) -> Result<Placeholder, String> {
    if inner.is_empty() {
        return Err(format!(
            "empty placeholder `<>` in key \"{text}\": name a parameter, as in `<id>`, or write `<<` for a literal `<`"
        ));
    }
    path(inner).ok_or_else(|| {
        format!(
            "placeholder `<{inner}>` in key \"{text}\" is not a parameter name or a field path \
             like `<id>`, `<req.order_id>`, `<self.tenant>`; write `<<` for a literal `<`"
        )
    })
}

/// `name.field.0` as a placeholder, if it is one.
fn path(inner: &str) -> Option<Placeholder> {
    let mut parts = inner.split('.');
    let root = match parts.next().unwrap_or_default() {
        "self" => Ident::new("self", Span::call_site()),
        root => syn::parse_str::<Ident>(root).ok()?,
    };
    let fields = parts
        .map(|field| syn::parse_str::<Member>(field).ok())
        .collect::<Option<Vec<Member>>>()?;
    Some(Placeholder {
        root,
        fields,
        text: inner.to_owned(),
    })
}

/// The names a key placeholder may start from: every name the fn's parameters bind.
#[derive(Debug, Default)]
pub(crate) struct Params {
    /// `self`, named parameters (`id`, `mut req`, `ref name`) and the names bound inside
    /// patterns (`a` and `b` in `(a, b)`), in order.
    names: Vec<String>,
    /// Whether a parameter's pattern is a macro (`m!(…)`): what it binds is not known.
    macro_pattern: Option<String>,
}

impl Params {
    /// Collects the names the parameters of `sig` bind, and those of `destructured`: the
    /// patterns an `#[async_trait]` method destructures in its body (their hidden `place`
    /// in the signature is not a name the user gave).
    pub(crate) fn of(sig: &Signature, destructured: &[Destructured]) -> Params {
        let mut params = Params::default();
        let mut patterns = Vec::new();
        for input in &sig.inputs {
            match input {
                FnArg::Receiver(_) => params.names.push("self".to_owned()),
                FnArg::Typed(typed) => {
                    let hidden = |pattern: &Pat| {
                        destructured
                            .iter()
                            .any(|d| matches!(pattern, Pat::Ident(p) if p.ident == d.place))
                    };
                    if !hidden(&typed.pat) {
                        patterns.push(&*typed.pat);
                    }
                }
            }
        }
        patterns.extend(destructured.iter().map(|d| &d.pattern));
        for pattern in patterns {
            let names = patterns::bindings(pattern);
            params.names.extend(names.iter().map(ToString::to_string));
            if params.macro_pattern.is_none() {
                params.macro_pattern = patterns::first_macro(pattern).map(written);
            }
        }
        params
    }

    /// Checks that `placeholder` starts at a name a parameter binds.
    fn check(&self, placeholder: &Placeholder, fn_name: &Ident) -> Result<(), String> {
        let root = &placeholder.root.to_string();
        if self.names.contains(root) {
            return Ok(());
        }
        let written = placeholder.written();
        let mut message = format!("placeholder `{written}` names no parameter of `{fn_name}`");
        if self.names.is_empty() {
            message.push_str(&format!(
                "; `{fn_name}` has no named parameters, so its key can only be literal text"
            ));
        } else {
            let list: Vec<String> = self.names.iter().map(|name| format!("`{name}`")).collect();
            message.push_str(&format!("; its parameters are {}", list.join(", ")));
            if let Some(near) = suggest::closest(root, self.names.iter().map(String::as_str)) {
                message.push_str(&format!(" (did you mean `<{near}>`?)"));
            }
        }
        if let Some(mac) = &self.macro_pattern {
            message.push_str(&format!(
                "; the names the macro pattern `{mac}` binds are not known to #[distributed_lock], \
                 which expands first: write the pattern out, or bind the parameter to a name and \
                 use a field path such as `<name.0>`"
            ));
        }
        Err(message)
    }

    /// Refuses `{inner}` when it is `format!`'s way to name a parameter (`{id}`, `{req.id}`,
    /// `{id:?}`): in a key it would be literal text, the same for every call.
    fn check_braced(&self, inner: &str, text: &str) -> Result<(), String> {
        let (name, spec) = match inner.split_once(':') {
            Some((name, spec)) => (name, Some(spec)),
            None => (inner, None),
        };
        let Some(path) = path(name.trim()) else {
            return Ok(());
        };
        if !self.names.contains(&path.root.to_string()) {
            return Ok(());
        }
        let written = path.written();
        let dotted = &path.text;
        let what = if path.fields.is_empty() {
            format!("the parameter `{dotted}`")
        } else {
            format!("`{dotted}`")
        };
        let mut message = format!(
            "`{{{inner}}}` in key \"{text}\" is literal text, the same for every call; to \
             format {what} into the key write `{written}`"
        );
        if spec.is_some() {
            message.push_str(" (a placeholder formats with `Display` and takes no format spec)");
        }
        message.push_str(&format!(
            "; for the literal text `{{{inner}}}` write `{{{{{inner}}}}}`"
        ));
        Err(message)
    }
}

/// One piece of a checked key template.
#[derive(Debug)]
enum Part {
    /// Text copied into the key as is.
    Text(String),
    /// A value formatted into the key.
    Value(Placeholder),
}

/// `segments` with each checked `{inner}` turned back into the literal text it is, and
/// neighbouring text joined, so that a key without placeholders is one `Text`.
fn join_text(segments: Vec<Segment>) -> Vec<Part> {
    let mut parts = Vec::new();
    let mut literal = String::new();
    for segment in segments {
        match segment {
            Segment::Text(text) => literal.push_str(&text),
            Segment::Braced(inner) => {
                literal.push('{');
                literal.push_str(&inner);
                literal.push('}');
            }
            Segment::Value(placeholder) => {
                parts.extend(take_text(&mut literal).map(Part::Text));
                parts.push(Part::Value(placeholder));
            }
        }
    }
    parts.extend(take_text(&mut literal).map(Part::Text));
    parts
}

/// A parsed and checked key template, ready to expand.
#[derive(Debug)]
pub(crate) struct Template {
    parts: Vec<Part>,
    /// The key literal: every generated token is located there, so errors about a value
    /// (a field that does not exist, a type that is not `Display`) point at the key.
    span: Span,
}

impl Template {
    /// Parses `text` (the value of `key = "…"`, spanned at `span`) and checks its placeholders
    /// against `params`, reporting every bad placeholder, not only the first.
    pub(crate) fn new(
        text: &str,
        span: Span,
        params: &Params,
        fn_name: &Ident,
    ) -> syn::Result<Template> {
        if text.is_empty() {
            return Err(syn::Error::new(
                span,
                "the key is empty: name the lock, as in `key = \"order:<id>\"`",
            ));
        }
        let segments = parse(text).map_err(|message| syn::Error::new(span, message))?;
        let mut errors = Errors::default();
        for segment in &segments {
            let checked = match segment {
                Segment::Value(placeholder) => params.check(placeholder, fn_name),
                Segment::Braced(inner) => params.check_braced(inner, text),
                Segment::Text(_) => Ok(()),
            };
            errors.take(checked.map_err(|message| syn::Error::new(span, message)));
        }
        errors.finish(Template {
            parts: join_text(segments),
            span,
        })
    }

    /// The parameters the key reads (`id` for `<id>`, `req` for `<req.order_id>`).
    pub(crate) fn roots(&self) -> impl Iterator<Item = &Ident> {
        self.parts.iter().filter_map(|part| match part {
            Part::Value(placeholder) => Some(&placeholder.root),
            Part::Text(_) => None,
        })
    }

    /// The placeholders in order, each written without spaces (`id`, `self.tenant`,
    /// `pair.0`): what `nesting.rs` compares a `format!` in the body with.
    pub(crate) fn value_paths(&self) -> Vec<String> {
        self.parts
            .iter()
            .filter_map(|part| match part {
                Part::Value(placeholder) => {
                    let mut path = placeholder.root.to_string();
                    for field in &placeholder.fields {
                        match field {
                            Member::Named(name) => path.push_str(&format!(".{name}")),
                            Member::Unnamed(index) => path.push_str(&format!(".{}", index.index)),
                        }
                    }
                    Some(path)
                }
                Part::Text(_) => None,
            })
            .collect()
    }

    /// Whether `other` builds the same key: the same text from the same values (`"x{"` and
    /// `"x{{"` do, as both are the text `x{`).
    pub(crate) fn same_key(&self, other: &Template) -> bool {
        self.format_string() == other.format_string() && self.value_paths() == other.value_paths()
    }

    /// The `format!` string: text with `{`/`}` doubled, `{}` for each value.
    pub(crate) fn format_string(&self) -> String {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(text) => out.push_str(&text.replace('{', "{{").replace('}', "}}")),
                Part::Value(_) => out.push_str("{}"),
            }
        }
        out
    }

    /// The expression that builds the key: `::std::format!("order:{}", id)`, or
    /// `<String as From<&str>>::from("jobs")` for a key without placeholders (fully qualified,
    /// so that it compiles under `#[no_implicit_prelude]`). `scope` holds the names as the
    /// signature binds them (`self` included), so that a placeholder's name resolves as they
    /// do, and the parameters still to be destructured: a name bound inside one is reached
    /// by destructuring it first, by reference (see `patterns.rs`), in a block:
    /// `{ let (ref a, _) = __arg1; ::std::format!("pair:{}", a) }`.
    pub(crate) fn to_key_expr(&self, scope: &Scope) -> TokenStream {
        let span = generated(self.span);
        if let [Part::Text(text)] = self.parts.as_slice() {
            let text = syn::LitStr::new(text, span);
            return quote_spanned! {span=>
                <::std::string::String as ::core::convert::From<&str>>::from(#text)
            };
        }
        let mut names = scope.names.clone();
        let mut lets = Vec::new();
        for Destructured {
            cfg,
            pattern,
            place,
        } in &scope.destructured
        {
            let reads = |name: &Ident| self.roots().any(|root| root == name);
            if let Some((pattern, bound)) = patterns::borrowing(pattern, &reads) {
                lets.push(quote_spanned!(span=> #(#cfg)* let #pattern = #place;));
                names.extend(bound);
            }
        }
        let format = syn::LitStr::new(&self.format_string(), span);
        let values = self.parts.iter().filter_map(|part| match part {
            Part::Value(placeholder) => Some(self.value_expr(placeholder, &names)),
            Part::Text(_) => None,
        });
        let format = quote_spanned!(span=> ::std::format!(#format #(, #values)*));
        if lets.is_empty() {
            format
        } else {
            quote_spanned!(span=> { #(#lets)* #format })
        }
    }

    /// `root.field.0`, at the key literal. `root` is the parameter of that name in `params`,
    /// so that it resolves as the parameter does; when `params` has none, the placeholder's
    /// own name, which rustc then reports at the key.
    fn value_expr(&self, placeholder: &Placeholder, params: &[Ident]) -> TokenStream {
        let span = generated(self.span);
        let param = params
            .iter()
            .find(|param| **param == placeholder.root)
            .unwrap_or(&placeholder.root);
        let mut root = param.clone();
        root.set_span(param.span().located_at(self.span));
        let mut tokens = root.into_token_stream();
        for field in &placeholder.fields {
            // Field names are generated tokens: rustc then reports a missing field without
            // offering to replace the whole key literal with a field name (see the module doc).
            let member = match field {
                Member::Named(name) => {
                    let mut name = name.clone();
                    name.set_span(span);
                    Member::Named(name)
                }
                Member::Unnamed(index) => Member::Unnamed(syn::Index {
                    index: index.index,
                    span,
                }),
            };
            tokens.extend(quote_spanned!(span=> . #member));
        }
        tokens
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use quote::quote;

    fn text(s: &str) -> Segment {
        Segment::Text(s.to_owned())
    }

    fn value(root: &str, fields: &[&str]) -> Segment {
        let text = [root]
            .iter()
            .chain(fields)
            .copied()
            .collect::<Vec<_>>()
            .join(".");
        Segment::Value(path(&text).unwrap())
    }

    fn scope(names: &[&str]) -> Scope {
        Scope {
            names: names
                .iter()
                .map(|name| Ident::new(name, Span::call_site()))
                .collect(),
            destructured: Vec::new(),
        }
    }

    fn sig(tokens: &str) -> Signature {
        syn::parse_str(tokens).unwrap()
    }

    fn template(key: &str, signature: &str) -> syn::Result<Template> {
        let sig = sig(signature);
        Template::new(key, Span::call_site(), &Params::of(&sig, &[]), &sig.ident)
    }

    #[test]
    fn text_and_placeholders_split() {
        assert_eq!(
            parse("order:<id>").unwrap(),
            vec![text("order:"), value("id", &[])]
        );
        assert_eq!(
            parse("<a>-<req.order_id>:<pair.0>").unwrap(),
            vec![
                value("a", &[]),
                text("-"),
                value("req", &["order_id"]),
                text(":"),
                value("pair", &["0"])
            ]
        );
        assert_eq!(
            parse("t:<self.tenant>").unwrap(),
            vec![text("t:"), value("self", &["tenant"])]
        );
        assert_eq!(parse("plain").unwrap(), vec![text("plain")]);
        assert_eq!(parse("").unwrap(), vec![]);
    }

    #[test]
    fn double_open_angle_is_a_literal() {
        assert_eq!(parse("a<<b>c").unwrap(), vec![text("a<b>c")]);
        assert_eq!(parse("<<<id>").unwrap(), vec![text("<"), value("id", &[])]);
        assert_eq!(parse("x>y").unwrap(), vec![text("x>y")]);
    }

    #[test]
    fn doubled_braces_are_literals() {
        assert_eq!(parse("a{{b}}c").unwrap(), vec![text("a{b}c")]);
        assert_eq!(
            parse("{{<id>}}").unwrap(),
            vec![text("{"), value("id", &[]), text("}")]
        );
        assert_eq!(parse("}{").unwrap(), vec![text("}{")]);
        assert_eq!(parse("{{{{").unwrap(), vec![text("{{")]);
    }

    #[test]
    fn brace_groups_are_kept_apart_until_checked() {
        assert_eq!(
            parse("order:{id}").unwrap(),
            vec![text("order:"), Segment::Braced("id".to_owned())]
        );
        assert_eq!(
            parse("{{{id}}}").unwrap(),
            vec![text("{"), Segment::Braced("id".to_owned()), text("}")]
        );
        // A placeholder inside braces is a placeholder between two literal braces.
        assert_eq!(
            parse("{<id>}").unwrap(),
            vec![text("{"), value("id", &[]), text("}")]
        );
        assert_eq!(
            parse("{a{b}").unwrap(),
            vec![text("{a"), Segment::Braced("b".to_owned())]
        );
    }

    #[test]
    fn brace_groups_naming_a_parameter_are_refused() {
        let error = template("order:{id}", "fn pay(id: u64)")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("`{id}` in key \"order:{id}\" is literal text"),
            "{error}"
        );
        assert!(
            error.contains("to format the parameter `id` into the key write `<id>`"),
            "{error}"
        );
        assert!(
            error.contains("for the literal text `{id}` write `{{id}}`"),
            "{error}"
        );
        let error = template("{req.id}", "fn pay(req: R)")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("to format `req.id` into the key write `<req.id>`"),
            "{error}"
        );
        let error = template("{self.tenant}", "fn pay(&self)")
            .unwrap_err()
            .to_string();
        assert!(error.contains("write `<self.tenant>`"), "{error}");
        let error = template("{id:?}", "fn pay(id: u64)")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("write `<id>` (a placeholder formats with `Display`"),
            "{error}"
        );
        let errors = template("{a}:{b}:<c>", "fn f(a: u8, b: u8, c: u8)").unwrap_err();
        assert_eq!(errors.into_iter().count(), 2);
    }

    #[test]
    fn other_brace_groups_stay_literal_text() {
        for (key, format) in [
            ("{tenant}:<id>", "{{tenant}}:{}"),
            ("{}:<id>", "{{}}:{}"),
            ("{0}:<id>", "{{0}}:{}"),
            ("{a b}:<id>", "{{a b}}:{}"),
            ("{self}:<id>", "{{self}}:{}"),
        ] {
            let t = template(key, "fn f(id: u64)").unwrap();
            assert_eq!(t.format_string(), format, "{key}");
        }
        let t = template("{{id}}:<id>", "fn f(id: u64)").unwrap();
        assert_eq!(t.format_string(), "{{id}}:{}");
        let errors = template("{x}{{y}}", "fn f(x: u8, y: u8)").unwrap_err();
        assert_eq!(errors.into_iter().count(), 1);
    }

    #[test]
    fn syntax_mistakes_are_explained() {
        assert!(parse("order:<>").unwrap_err().contains("empty placeholder"));
        assert!(parse("order:<id")
            .unwrap_err()
            .contains("unclosed placeholder `<id`"));
        assert!(parse("<a b>").unwrap_err().contains("not a parameter name"));
        assert!(parse("<a.>").unwrap_err().contains("not a parameter name"));
        assert!(parse("<.a>").unwrap_err().contains("not a parameter name"));
        assert!(parse("<1>").unwrap_err().contains("not a parameter name"));
        assert!(parse("<a-b>").unwrap_err().contains("not a parameter name"));
    }

    #[test]
    fn braces_are_escaped_in_the_format_string() {
        let t = template("{x}:<id>}", "fn f(id: u64)").unwrap();
        assert_eq!(t.format_string(), "{{x}}:{}}}");
    }

    #[test]
    fn key_expression_borrows_places() {
        let t = template(
            "o:<id>:<self.tenant>:<p.0>",
            "fn f(&self, id: u64, p: (u8, u8))",
        )
        .unwrap();
        let expr = t.to_key_expr(&scope(&["self", "id", "p"])).to_string();
        assert_eq!(
            expr,
            ":: std :: format ! (\"o:{}:{}:{}\" , id , self . tenant , p . 0)"
        );
    }

    #[test]
    fn literal_keys_skip_format() {
        let t = template("jobs<<{x}", "fn f()").unwrap();
        assert!(matches!(t.parts.as_slice(), [Part::Text(_)]));
        assert_eq!(
            t.to_key_expr(&Scope::default()).to_string(),
            quote!(<::std::string::String as ::core::convert::From<&str>>::from("jobs<{x}"))
                .to_string()
        );
    }

    #[test]
    fn empty_key_is_refused() {
        let error = template("", "fn f()").unwrap_err().to_string();
        assert!(error.contains("the key is empty"), "{error}");
    }

    #[test]
    fn unknown_placeholders_list_the_parameters() {
        let error = template("<ide>", "fn pay(id: u64, mut amount: u64)")
            .unwrap_err()
            .to_string();
        assert!(error.contains("names no parameter of `pay`"), "{error}");
        assert!(
            error.contains("its parameters are `id`, `amount`"),
            "{error}"
        );
        assert!(error.contains("did you mean `<id>`?"), "{error}");
        let error = template("<self.x>", "fn f()").unwrap_err().to_string();
        assert!(error.contains("no named parameters"), "{error}");
    }

    #[test]
    fn every_bad_placeholder_is_reported() {
        let errors = template("<a>:<b>", "fn f(c: u8)").unwrap_err();
        assert_eq!(errors.into_iter().count(), 2);
    }

    #[test]
    fn names_bound_in_patterns_are_parameters() {
        let sig =
            "fn f(ref r: u8, (a, mut b): (u8, u8), P { x, .. }: P, all @ [first, ..]: [u8; 2])";
        for key in ["<r>", "<a>", "<b>", "<x>", "<all>", "<first>"] {
            assert!(template(key, sig).is_ok(), "{key}");
        }
        let error = template("<y>", sig).unwrap_err().to_string();
        assert!(
            error.contains("its parameters are `r`, `a`, `b`, `x`, `all`, `first`"),
            "{error}"
        );
    }

    #[test]
    fn a_macro_pattern_is_named_when_a_placeholder_is_not_found() {
        let error = template("<x>", "fn f(id: u8, (pair!(x), y): (P, u8))")
            .unwrap_err()
            .to_string();
        assert!(error.contains("its parameters are `id`, `y`"), "{error}");
        assert!(
            error.contains("the names the macro pattern `pair!(x)` binds are not known"),
            "{error}"
        );
    }

    #[test]
    fn a_name_inside_a_pattern_is_borrowed_from_the_parameter_first() {
        let t = template(
            "<id>:<a>:<left.0>",
            "fn f(id: u8, (a, _b): (u8, u8), P { left, right }: P)",
        )
        .unwrap();
        let mut sig: Signature =
            syn::parse_str("fn f(id: u8, (a, _b): (u8, u8), P { left, right }: P)").unwrap();
        let read: Vec<&Ident> = t.roots().collect();
        let scope = crate::rebind::rebind(&mut sig, &read).scope;
        // (Written as a string: rustfmt would add a comma after the last field.)
        let expected = "{ let (ref a , _) = __arg1 ; \
                        let P { left : ref left , right : _ } = __arg2 ; \
                        :: std :: format ! (\"{}:{}:{}\" , id , a , left . 0) }";
        assert_eq!(t.to_key_expr(&scope).to_string(), expected);
    }

    #[test]
    fn bound_by_the_signature_is_read_directly() {
        let t = template("<a>", "fn f(a: u8, (b, c): (u8, u8))").unwrap();
        let mut sig: Signature = syn::parse_str("fn f(a: u8, (b, c): (u8, u8))").unwrap();
        let scope = crate::rebind::rebind(&mut sig, &t.roots().collect::<Vec<_>>()).scope;
        assert_eq!(
            t.to_key_expr(&scope).to_string(),
            ":: std :: format ! (\"{}\" , a)"
        );
    }

    #[test]
    fn raw_names_and_indices_reach_the_key_expression() {
        let t = template("<r#type.0>:<p.r#in>", "fn f(r#type: (u8,), p: P)").unwrap();
        let scope = Scope {
            names: vec![
                Ident::new_raw("type", Span::call_site()),
                Ident::new("p", Span::call_site()),
            ],
            destructured: Vec::new(),
        };
        assert_eq!(
            t.to_key_expr(&scope).to_string(),
            ":: std :: format ! (\"{}:{}\" , r#type . 0 , p . r#in)"
        );
    }
}
