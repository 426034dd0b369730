//! The attribute's arguments: `key = "order:<id>", lease = "30s", …` → [`Args`].
//!
//! Parsing happens in two passes so that one mistake does not hide the next: the list is
//! first split into `name = value` pairs (a string or a name on its own is kept as well, to
//! be refused among the others; only a broken list stops here), then every pair is checked
//! on its own and all the errors are combined. The key templates are kept as string
//! literals here (one, or a list read by `keys.rs`); `check.rs` checks them against the fn's
//! parameters once the fn has been parsed.
//!
//! Written inside `macro_rules!`, an argument passed in as a fragment (`key = $key` with
//! `$key:literal` or `$key:expr`) reaches the attribute wrapped in an invisible group, which
//! syn parses as `Expr::Group`; every value is unwrapped before it is checked, so
//! `lease = $lease` with `"30s"` is a duration string and not an expression of type `&str`.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, Ident, Lit, LitStr, Path, Token};

use crate::duration;
use crate::errors::Errors;
use crate::fragments::ungroup;
use crate::keys::{self, Keys};
pub(crate) use crate::permits::PermitsArg;
use crate::{permits, suggest};

/// Every argument name, in the order the docs present them.
const NAMES: [&str; 9] = [
    "key", "lease", "wait", "watchdog", "on_lost", "fair", "mode", "permits", "crate",
];

/// Names users reach for that mean one of ours.
const SYNONYMS: [(&str, &str); 16] = [
    ("name", "key"),
    ("lock", "key"),
    ("ttl", "lease"),
    ("expire", "lease"),
    ("timeout", "wait"),
    ("wait_timeout", "wait"),
    ("renew", "watchdog"),
    ("fifo", "fair"),
    ("fairness", "fair"),
    ("access", "mode"),
    ("kind", "mode"),
    ("lock_mode", "mode"),
    ("semaphore", "permits"),
    ("max_holders", "permits"),
    ("concurrency", "permits"),
    ("krate", "crate"),
];

/// The values of `mode`, in the order the docs present them.
const MODES: [&str; 3] = ["read", "write", "exclusive"];

/// Words that name a mode, written as an argument of their own (`read`, or `shared = true`),
/// and the `mode` value each one means.
const MODE_WORDS: [(&str, &str); 4] = [
    ("read", "read"),
    ("write", "write"),
    ("exclusive", "exclusive"),
    ("shared", "read"),
];

/// The longest lease accepted: a lock held for more than a day is almost surely a unit mistake.
/// Same bound as the runtime's `MAX_LEASE`.
const MAX_LEASE_MILLIS: u64 = 24 * 3_600_000;

/// The shortest lease accepted, as the runtime's `MIN_LEASE`: the watchdog renews every
/// third of the lease, and a shorter period would only spin.
const MIN_LEASE_MILLIS: u64 = 10;

/// The arguments of one `#[distributed_lock(...)]`, each value checked on its own.
pub(crate) struct Args {
    /// `key = "…"` or `key = ["…", …]`: the templates, each spanned at its literal; or, when
    /// there is no usable key (missing, not a string, an empty list, or an argument list
    /// that does not parse), the error that says so, already among the errors `Args::parse`
    /// reported.
    pub key: syn::Result<Keys>,
    /// How the lock is taken and held.
    pub options: Options,
    /// `crate = "path"`; `None` means `::lock_runtime`.
    pub krate: Option<Path>,
}

/// The lock's options, as given; each `None` leaves the runtime's default.
#[derive(Default)]
pub(crate) struct Options {
    /// `lease = …`; the runtime's default is 30s.
    pub lease: Option<DurationArg>,
    /// `wait = …`; the runtime's default is 30s unless configured.
    pub wait: Option<DurationArg>,
    /// `watchdog = false`; the runtime's default is on.
    pub watchdog: Option<bool>,
    /// `on_lost = "…"`; the runtime's default is abort.
    pub on_lost: Option<OnLost>,
    /// `fair = true | false`; the runtime's default (fair on Redis) otherwise.
    pub fair: Option<bool>,
    /// `mode = "read" | "write" | "exclusive"`; the runtime's default is exclusive.
    pub mode: Option<Mode>,
    /// `permits = N`; an ordinary lock (one holder) otherwise.
    pub permits: Option<PermitsArg>,
}

/// A duration argument.
pub(crate) enum DurationArg {
    /// A string literal checked at compile time, in milliseconds.
    Millis(u64, Span),
    /// Any other expression, which must have type `Duration` (`lease = LEASE`).
    Expr(Box<Expr>),
}

/// `on_lost = "abort" | "continue" | "confirm"`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum OnLost {
    /// Drop the body at its next await and return `Err(LockError::Lost)`.
    Abort,
    /// Let the body finish; the loss is logged.
    Continue,
    /// Abort, and await the release's answer (a loss it finds is an error).
    Confirm,
}

/// `mode = "read" | "write" | "exclusive"`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Mode {
    /// One holder at a time (the runtime's default).
    Exclusive,
    /// Shared with other readers, excluding writers.
    Read,
    /// Excluding readers and writers: the same lock as exclusive.
    Write,
}

/// One `name = value` pair, before its value is checked.
struct Pair {
    name: Ident,
    value: Expr,
}

/// One argument as written: a pair, a string on its own, or a name on its own.
enum Argument {
    /// `name = value`.
    Pair(Pair),
    /// `"order:<id>"` with no name: the key, written the way some attributes take one.
    Bare(LitStr),
    /// `read` with no value: a flag, the way some attributes take one. Refused, but read as
    /// an argument of its own, so that the arguments after it are still checked.
    Flag(Ident),
}

impl Parse for Argument {
    fn parse(input: ParseStream<'_>) -> syn::Result<Argument> {
        if input.peek(LitStr) {
            return input.parse().map(Argument::Bare);
        }
        // `parse_any` so that `crate` is accepted as a name.
        let name = Ident::parse_any(input)?;
        if input.is_empty() || input.peek(Token![,]) {
            return Ok(Argument::Flag(name));
        }
        if !input.peek(Token![=]) {
            return Err(without_value(&name));
        }
        input.parse::<Token![=]>()?;
        let value = ungroup(input.parse()?);
        Ok(Argument::Pair(Pair { name, value }))
    }
}

/// The error for `name` written without `= value`.
fn without_value(name: &Ident) -> syn::Error {
    syn::Error::new(
        name.span(),
        format!("expected `{name} = …`: every argument of #[distributed_lock] takes a value"),
    )
}

/// The arguments of an attribute, as written.
struct Arguments(Punctuated<Argument, Token![,]>);

impl Parse for Arguments {
    fn parse(input: ParseStream<'_>) -> syn::Result<Arguments> {
        Punctuated::parse_terminated(input).map(Arguments)
    }
}

impl Args {
    /// Parses the tokens inside `#[distributed_lock(...)]`, checking each value. Every bad
    /// argument is added to `errors` and the good ones are still returned, so the key can be
    /// checked against the fn even when, say, `lease` is wrong. `attr_span` is where to point
    /// when `key` is missing.
    pub(crate) fn parse(
        tokens: proc_macro2::TokenStream,
        attr_span: Span,
        errors: &mut Errors,
    ) -> Args {
        let arguments = match syn::parse2::<Arguments>(tokens) {
            Ok(Arguments(arguments)) => arguments,
            // Nothing to read, and so no key to check against the fn.
            Err(error) => {
                return Args {
                    key: errors.keep(Err(error)),
                    options: Options::default(),
                    krate: None,
                }
            }
        };
        let mut reading = Reading::default();
        for argument in arguments {
            match argument {
                Argument::Pair(pair) => reading.pair(pair, errors),
                Argument::Bare(lit) => reading.bare_key(lit, errors),
                Argument::Flag(name) => reading.flag(&name, errors),
            }
        }
        let key = match reading.key {
            Some(key) => key,
            None => errors.keep(Err(syn::Error::new(
                attr_span,
                "missing `key`: #[distributed_lock] needs the lock's name, \
                 as in #[distributed_lock(key = \"order:<id>\")]",
            ))),
        };
        Args {
            key,
            options: reading.options,
            krate: reading.krate,
        }
    }
}

/// The arguments read so far.
#[derive(Default)]
struct Reading {
    /// The key: its literals once read, else the first error about it.
    key: Option<syn::Result<Keys>>,
    options: Options,
    krate: Option<Path>,
    /// The names given so far, to refuse a second `lease`.
    seen: Vec<String>,
}

impl Reading {
    /// Reads `name = value`; a bad one is added to `errors`.
    fn pair(&mut self, Pair { name, value }: Pair, errors: &mut Errors) {
        let text = name.to_string();
        if self.seen.contains(&text) {
            let mut message = format!("duplicate argument `{text}`: give it once");
            if text == "key" {
                message.push_str(
                    "; to lock several keys, list them in one: \
                     `key = [\"account:<from>\", \"account:<to>\"]`",
                );
            }
            errors.push(syn::Error::new(name.span(), message));
            return;
        }
        self.seen.push(text.clone());
        let options = &mut self.options;
        let read = match text.as_str() {
            "key" => {
                let key = keys::parse(&value, errors);
                let key = errors.keep(key);
                self.named_key(key);
                Ok(())
            }
            "lease" => lease_arg(value).map(|arg| options.lease = Some(arg)),
            "wait" => duration_arg(value, "wait").map(|arg| options.wait = Some(arg)),
            "watchdog" => bool_arg(&value, "watchdog").map(|b| options.watchdog = Some(b)),
            "on_lost" => on_lost_arg(&value).map(|o| options.on_lost = Some(o)),
            "fair" => bool_arg(&value, "fair").map(|b| options.fair = Some(b)),
            "mode" => mode_arg(&value).map(|m| options.mode = Some(m)),
            "permits" => permits::parse(value).map(|p| options.permits = Some(p)),
            "crate" => crate_arg(value).map(|p| self.krate = Some(p)),
            _ => Err(unknown(&name)),
        };
        errors.take(read);
    }

    /// `key = …`: literals replace any key read before; an error only stands for a key
    /// not yet read.
    fn named_key(&mut self, key: syn::Result<Keys>) {
        if key.is_ok() || !matches!(self.key, Some(Ok(_))) {
            self.key = Some(key);
        }
    }

    /// A name on its own: refused. A `key` without value stands for the key, so that it is
    /// not also reported missing.
    fn flag(&mut self, name: &Ident, errors: &mut Errors) {
        let error = flag(name);
        if name == "key" && self.key.is_none() {
            self.key = Some(errors.keep(Err(error)));
        } else {
            errors.push(error);
        }
    }

    /// A string on its own: refused, and still taken for the key (unless one was read), so
    /// that the key's mistakes show now too.
    fn bare_key(&mut self, lit: LitStr, errors: &mut Errors) {
        errors.push(syn::Error::new(
            lit.span(),
            format!(
                "a string on its own is not an argument of #[distributed_lock]: \
                 write the key as `key = {}`",
                lit.token()
            ),
        ));
        if !matches!(self.key, Some(Ok(_))) {
            self.key = Some(Ok(Keys::one(lit)));
        }
    }
}

/// The error for a name written on its own: a mode's (`read`) says how to ask for the mode,
/// any other that the argument takes a value.
fn flag(name: &Ident) -> syn::Error {
    mode_word(name).unwrap_or_else(|| without_value(name))
}

/// `read`, `write`, `exclusive` or `shared` used as an argument's name (`read`, `read = true`):
/// the error that says how to ask for that mode, or `None` for another name.
fn mode_word(name: &Ident) -> Option<syn::Error> {
    let text = name.to_string();
    let (_, mode) = MODE_WORDS.iter().find(|(word, _)| *word == text)?;
    let message = if text == *mode {
        format!("`{text}` is a mode: write `mode = \"{mode}\"`")
    } else {
        format!("`{text}` is the {mode} mode here: write `mode = \"{mode}\"`")
    };
    Some(syn::Error::new(name.span(), message))
}

/// The error for an argument name we do not know, with the closest one when there is one.
fn unknown(name: &Ident) -> syn::Error {
    if let Some(error) = mode_word(name) {
        return error;
    }
    let text = name.to_string();
    let near = SYNONYMS
        .iter()
        .find(|(synonym, _)| *synonym == text)
        .map(|(_, ours)| *ours)
        .or_else(|| suggest::closest(&text, NAMES));
    let mut message = format!("unknown argument `{text}`");
    match near {
        Some(near) => message.push_str(&format!("; did you mean `{near}`?")),
        None => {
            let all: Vec<String> = NAMES.iter().map(|n| format!("`{n}`")).collect();
            message.push_str(&format!("; the arguments are {}", all.join(", ")));
        }
    }
    syn::Error::new(name.span(), message)
}

/// The string literal `value`, or an error showing `example`.
fn string(value: &Expr, name: &str, example: &str) -> syn::Result<LitStr> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => Ok(lit.clone()),
        other => Err(syn::Error::new_spanned(
            other,
            format!("`{name}` takes a string literal, as in `{name} = {example}`"),
        )),
    }
}

/// `lease = …`: a duration that is neither zero nor longer than a day.
fn lease_arg(value: Expr) -> syn::Result<DurationArg> {
    let arg = duration_arg(value, "lease")?;
    if let DurationArg::Millis(millis, span) = arg {
        if millis == 0 {
            return Err(syn::Error::new(
                span,
                "`lease` must be longer than zero: it is how long the lock outlives a crashed holder",
            ));
        }
        if millis < MIN_LEASE_MILLIS {
            return Err(syn::Error::new(
                span,
                format!(
                    "`lease` of {} is shorter than the 10ms minimum: the watchdog renews the lease \
                     every third of it",
                    duration::display_millis(millis)
                ),
            ));
        }
        if millis > MAX_LEASE_MILLIS {
            return Err(syn::Error::new(
                span,
                format!(
                    "`lease` of {} is longer than the 24h limit; the watchdog keeps a short lease \
                     alive for as long as the body runs, so a few seconds is usual",
                    duration::display_millis(millis)
                ),
            ));
        }
    }
    Ok(arg)
}

/// A duration argument: a string literal parsed now, or an expression of type `Duration`.
fn duration_arg(value: Expr, name: &str) -> syn::Result<DurationArg> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => duration::parse_millis(&lit.value())
            .map(|millis| DurationArg::Millis(millis, lit.span()))
            .map_err(|message| syn::Error::new(lit.span(), format!("`{name}`: {message}"))),
        Expr::Lit(ExprLit { lit, .. }) => {
            let hint = match &lit {
                Lit::Int(int) => format!(
                    "; a bare number has no unit: write `{name} = \"{}s\"` or `\"{}ms\"`",
                    int.base10_digits(),
                    int.base10_digits()
                ),
                _ => String::new(),
            };
            Err(syn::Error::new(
                lit.span(),
                format!(
                    "`{name}` takes a duration: a string such as `{name} = \"5s\"` ({}), \
                     or an expression of type `Duration`{hint}",
                    duration::ACCEPTED
                ),
            ))
        }
        expr => Ok(DurationArg::Expr(Box::new(expr))),
    }
}

/// `watchdog = true | false`, `fair = true | false`.
fn bool_arg(value: &Expr, name: &str) -> syn::Result<bool> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Bool(lit),
            ..
        }) => Ok(lit.value),
        other => Err(syn::Error::new_spanned(
            other,
            format!("`{name}` takes `true` or `false`"),
        )),
    }
}

/// `on_lost = "abort" | "continue" | "confirm"`.
fn on_lost_arg(value: &Expr) -> syn::Result<OnLost> {
    let expected =
        "`on_lost` takes \"abort\" (drop the body and return `Err(LockError::Lost)`, the default), \
                    \"continue\" (let the body finish and log the loss) or \"confirm\" (as \
                    \"abort\", and wait for the release's answer: a loss only it finds is an error too)";
    let lit = string(value, "on_lost", "\"abort\"")
        .map_err(|error| syn::Error::new(error.span(), expected))?;
    match lit.value().as_str() {
        "abort" => Ok(OnLost::Abort),
        "continue" => Ok(OnLost::Continue),
        "confirm" => Ok(OnLost::Confirm),
        other => Err(syn::Error::new(
            lit.span(),
            format!("unknown `on_lost` value \"{other}\": {expected}"),
        )),
    }
}

/// `mode = "read" | "write" | "exclusive"`.
fn mode_arg(value: &Expr) -> syn::Result<Mode> {
    let expected = "`mode` takes \"read\" (shared with other readers, excluding writers), \
                    \"write\" (excluding readers and writers) or \"exclusive\" (the default: \
                    the same lock as \"write\")";
    let lit = string(value, "mode", "\"read\"").map_err(|_| {
        // `mode = read`, `mode = LockMode::Read`: the mode meant is plain, say how to write it.
        let meant = match value {
            Expr::Path(path) => path.path.segments.last().and_then(|last| {
                let text = last.ident.to_string().to_lowercase();
                MODES.into_iter().find(|mode| *mode == text)
            }),
            _ => None,
        };
        let example = meant.unwrap_or("read");
        syn::Error::new_spanned(
            value,
            format!("{expected}, as a string: write `mode = \"{example}\"`"),
        )
    })?;
    let text = lit.value();
    match text.as_str() {
        "read" => Ok(Mode::Read),
        "write" => Ok(Mode::Write),
        "exclusive" => Ok(Mode::Exclusive),
        other => {
            let near = MODE_WORDS
                .iter()
                .find(|(word, _)| *word == other)
                .map(|(_, mode)| *mode)
                .or_else(|| suggest::closest(&other.to_lowercase(), MODES));
            let message = match near {
                Some(near) => format!("unknown mode \"{other}\"; did you mean \"{near}\"?"),
                None => format!("unknown mode \"{other}\": {expected}"),
            };
            Err(syn::Error::new(lit.span(), message))
        }
    }
}

/// `crate = "path"` (also accepted unquoted: `crate = my_locks`).
fn crate_arg(value: Expr) -> syn::Result<Path> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => lit.parse::<Path>().map_err(|_| {
            syn::Error::new(
                lit.span(),
                "`crate` takes the path of the lock_runtime crate, as in `crate = \"my_locks\"`",
            )
        }),
        Expr::Path(path) if path.qself.is_none() && path.attrs.is_empty() => Ok(path.path),
        other => Err(syn::Error::new(
            other.span(),
            "`crate` takes the path of the lock_runtime crate, as in `crate = \"my_locks\"`",
        )),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use quote::{quote, ToTokens};

    fn parse(tokens: proc_macro2::TokenStream) -> syn::Result<Args> {
        let mut errors = Errors::default();
        let args = Args::parse(tokens, Span::call_site(), &mut errors);
        errors.finish(args)
    }

    fn errors(tokens: proc_macro2::TokenStream) -> Vec<String> {
        match parse(tokens) {
            Ok(_) => Vec::new(),
            Err(errors) => errors.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    fn templates(args: &Args) -> Vec<String> {
        let keys = args.key.as_ref().unwrap();
        keys.0.iter().map(LitStr::value).collect()
    }

    #[test]
    fn on_lost_confirm_is_read() {
        let args = parse(quote!(key = "order:<id>", on_lost = "confirm")).unwrap();
        assert_eq!(args.options.on_lost, Some(OnLost::Confirm));
    }

    #[test]
    fn every_argument_is_read() {
        let args = parse(quote!(
            key = "order:<id>",
            lease = "1m30s",
            wait = "0s",
            watchdog = false,
            on_lost = "continue",
            fair = true,
            mode = "read",
            crate = "::my_locks",
        ))
        .unwrap();
        assert_eq!(templates(&args), ["order:<id>"]);
        assert!(matches!(
            args.options.lease,
            Some(DurationArg::Millis(90_000, _))
        ));
        assert!(matches!(args.options.wait, Some(DurationArg::Millis(0, _))));
        assert_eq!(args.options.watchdog, Some(false));
        assert_eq!(args.options.on_lost, Some(OnLost::Continue));
        assert_eq!(args.options.fair, Some(true));
        assert_eq!(args.options.mode, Some(Mode::Read));
        let krate = args.krate.unwrap();
        assert_eq!(quote!(#krate).to_string(), quote!(::my_locks).to_string());
    }

    #[test]
    fn only_key_is_required() {
        let args = parse(quote!(key = "k")).unwrap();
        assert!(
            args.options.lease.is_none() && args.options.wait.is_none() && args.krate.is_none()
        );
        assert!(
            args.options.watchdog.is_none()
                && args.options.on_lost.is_none()
                && args.options.fair.is_none()
                && args.options.mode.is_none()
        );
    }

    #[test]
    fn durations_may_be_expressions() {
        let args = parse(quote!(
            key = "k",
            lease = LEASE,
            wait = Duration::from_secs(1)
        ))
        .unwrap();
        assert!(matches!(args.options.lease, Some(DurationArg::Expr(_))));
        assert!(matches!(args.options.wait, Some(DurationArg::Expr(_))));
    }

    #[test]
    fn crate_may_be_unquoted() {
        let args = parse(quote!(key = "k", crate = my::locks)).unwrap();
        let krate = args.krate.unwrap();
        assert_eq!(quote!(#krate).to_string(), quote!(my::locks).to_string());
    }

    #[test]
    fn missing_key_is_an_error() {
        assert!(errors(quote!(lease = "1s"))[0].contains("missing `key`"));
        assert!(errors(quote!())[0].contains("missing `key`"));
    }

    #[test]
    fn all_mistakes_are_reported_together() {
        let found = errors(quote!(
            key = "k",
            lease = "0s",
            wait = 5,
            watchdog = "no",
            on_lost = "retry",
            fair = "yes",
            leese = "1s",
            read,
            mode = "reed",
            key = "j"
        ));
        assert_eq!(found.len(), 9, "{found:?}");
        assert!(found[0].contains("longer than zero"));
        assert!(found[1].contains("a bare number has no unit: write `wait = \"5s\"`"));
        assert!(found[2].contains("`true` or `false`"));
        assert!(found[3].contains("unknown `on_lost` value \"retry\""));
        assert!(found[4].contains("`fair` takes `true` or `false`"));
        assert!(found[5].contains("unknown argument `leese`; did you mean `lease`?"));
        assert!(found[6].contains("`read` is a mode"));
        assert!(found[7].contains("unknown mode \"reed\""));
        assert!(found[8].contains("duplicate argument `key`"));
    }

    #[test]
    fn absurd_leases_are_refused() {
        assert!(errors(quote!(key = "k", lease = "25h"))[0]
            .contains("25h is longer than the 24h limit"));
        assert!(errors(quote!(key = "k", lease = "24h")).is_empty());
        assert!(
            errors(quote!(key = "k", lease = "9ms"))[0].contains("shorter than the 10ms minimum")
        );
        assert!(errors(quote!(key = "k", lease = "10ms")).is_empty());
    }

    #[test]
    fn bad_duration_strings_name_the_units() {
        let found = errors(quote!(key = "k", wait = "5 sec"));
        assert!(
            found[0].starts_with("`wait`: invalid duration \"5 sec\""),
            "{found:?}"
        );
        assert!(found[0].contains("accepted units are"), "{found:?}");
    }

    #[test]
    fn unknown_names_suggest_or_list() {
        assert!(errors(quote!(key = "k", timeout = "1s"))[0].contains("did you mean `wait`?"));
        let found = errors(quote!(key = "k", colour = "red"));
        assert!(
            found[0].contains("the arguments are `key`, `lease`"),
            "{found:?}"
        );
    }

    #[test]
    fn fair_takes_a_bool() {
        assert_eq!(
            parse(quote!(key = "k", fair = false)).unwrap().options.fair,
            Some(false)
        );
        for bad in [quote!("yes"), quote!(1), quote!(FAIR), quote!(!true)] {
            let found = errors(quote!(key = "k", fair = #bad));
            assert_eq!(found, ["`fair` takes `true` or `false`"], "{bad}");
        }
        assert!(errors(quote!(key = "k", fifo = true))[0].contains("did you mean `fair`?"));
        assert!(errors(quote!(key = "k", fiar = true))[0].contains("did you mean `fair`?"));
    }

    #[test]
    fn a_name_without_value_is_refused_and_the_rest_still_read() {
        assert_eq!(
            errors(quote!(key)),
            ["expected `key = …`: every argument of #[distributed_lock] takes a value"],
            "not reported missing as well"
        );
        let found = errors(quote!(key = "k", watchdog, lease = "1x"));
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("expected `watchdog = …`"), "{found:?}");
        assert!(found[1].contains("invalid duration"), "{found:?}");
        // Anything else after a name than `=`, `,` or the end stops the parse.
        assert!(errors(quote!(key "k"))[0].contains("expected `key = …`"));
    }

    #[test]
    fn mode_is_read() {
        for (value, mode) in [
            ("read", Mode::Read),
            ("write", Mode::Write),
            ("exclusive", Mode::Exclusive),
        ] {
            let args = parse(quote!(key = "k", mode = #value)).unwrap();
            assert_eq!(args.options.mode, Some(mode), "{value}");
        }
    }

    #[test]
    fn unknown_modes_suggest_the_one_meant_or_list_them() {
        for (typed, meant) in [
            ("reed", "read"),
            ("Read", "read"),
            ("reader", "read"),
            ("wirte", "write"),
            ("exlusive", "exclusive"),
            ("shared", "read"),
        ] {
            assert_eq!(
                errors(quote!(key = "k", mode = #typed)),
                [format!(
                    "unknown mode \"{typed}\"; did you mean \"{meant}\"?"
                )],
            );
        }
        let found = errors(quote!(key = "k", mode = "upgradable"));
        assert!(
            found[0].starts_with("unknown mode \"upgradable\": `mode` takes \"read\""),
            "{found:?}"
        );
    }

    #[test]
    fn mode_takes_a_string() {
        for (bad, meant) in [
            (quote!(read), "read"),
            (quote!(LockMode::Write), "write"),
            (quote!(true), "read"),
            (quote!(MODE), "read"),
        ] {
            let found = errors(quote!(key = "k", mode = #bad));
            assert_eq!(found.len(), 1, "{found:?}");
            assert!(
                found[0].starts_with("`mode` takes \"read\" (shared with other readers"),
                "{found:?}"
            );
            assert!(
                found[0].ends_with(&format!("as a string: write `mode = \"{meant}\"`")),
                "{found:?}"
            );
        }
    }

    #[test]
    fn a_mode_written_as_an_argument_says_how_to_ask_for_it() {
        for (flag, mode) in [
            (quote!(read), "read"),
            (quote!(write), "write"),
            (quote!(exclusive), "exclusive"),
        ] {
            assert_eq!(
                errors(quote!(key = "k", #flag)),
                [format!("`{flag}` is a mode: write `mode = \"{mode}\"`")]
            );
        }
        assert_eq!(
            errors(quote!(shared, key = "k")),
            ["`shared` is the read mode here: write `mode = \"read\"`"]
        );
        assert_eq!(
            errors(quote!(key = "k", read = true)),
            ["`read` is a mode: write `mode = \"read\"`"]
        );
        for synonym in [quote!(access), quote!(kind), quote!(lock_mode)] {
            assert_eq!(
                errors(quote!(key = "k", #synonym = "read")),
                [format!(
                    "unknown argument `{synonym}`; did you mean `mode`?"
                )]
            );
        }
        assert!(errors(quote!(key = "k", mdoe = "read"))[0].contains("did you mean `mode`?"));
    }

    #[test]
    fn macro_rules_fragments_are_unwrapped() {
        // `$x:literal` and `$x:expr` fragments arrive in invisible groups, one per macro.
        let group = |tokens: proc_macro2::TokenStream| {
            proc_macro2::Group::new(proc_macro2::Delimiter::None, tokens)
        };
        let key = group(quote!("order:<id>"));
        let lease = group(group(quote!("30s")).into_token_stream());
        let (renew, fair, lost, mode) = (
            group(quote!(false)),
            group(quote!(true)),
            group(quote!("continue")),
            group(quote!("write")),
        );
        let krate = group(quote!(::my_locks));
        let args = parse(quote!(
            key = #key, lease = #lease, wait = #lease, watchdog = #renew, fair = #fair,
            on_lost = #lost, mode = #mode, crate = #krate
        ))
        .unwrap();
        assert_eq!(templates(&args), ["order:<id>"]);
        assert!(matches!(
            args.options.lease,
            Some(DurationArg::Millis(30_000, _))
        ));
        assert!(matches!(
            args.options.wait,
            Some(DurationArg::Millis(30_000, _))
        ));
        assert_eq!(
            (args.options.watchdog, args.options.fair),
            (Some(false), Some(true))
        );
        assert_eq!(args.options.on_lost, Some(OnLost::Continue));
        assert_eq!(args.options.mode, Some(Mode::Write));
        let expr = group(quote!(Duration::from_secs(1)));
        let args = parse(quote!(key = "k", lease = #expr)).unwrap();
        assert!(
            matches!(args.options.lease, Some(DurationArg::Expr(expr)) if matches!(*expr, Expr::Call(_)))
        );
    }

    #[test]
    fn a_bare_string_is_taken_for_the_key_and_refused() {
        let found = errors(quote!("order:<id>", lease = "1x"));
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].contains("write the key as `key = \"order:<id>\"`"),
            "{found:?}"
        );
        assert!(found[1].contains("invalid duration"), "{found:?}");
        let mut errors = Errors::default();
        let args = Args::parse(quote!("order:<id>"), Span::call_site(), &mut errors);
        assert_eq!(
            args.key.ok().map(|keys| keys.0[0].value()).as_deref(),
            Some("order:<id>")
        );
        let errors = errors.finish(()).unwrap_err();
        assert_eq!(errors.into_iter().count(), 1, "no `missing key` as well");
    }

    #[test]
    fn key_must_be_a_string() {
        assert!(errors(quote!(key = 42))[0].contains("`key` takes a string literal"));
    }

    #[test]
    fn a_list_of_keys_is_read_in_order() {
        let args = parse(quote!(
            key = ["account:<to>", "account:<from>"],
            lease = "10s"
        ))
        .unwrap();
        assert_eq!(templates(&args), ["account:<to>", "account:<from>"]);
        let args = parse(quote!(key = ["a",], mode = "read")).unwrap();
        assert_eq!(args.options.mode, Some(Mode::Read));
        assert_eq!(templates(&args), ["a"]);
    }

    #[test]
    fn a_bad_list_is_reported_among_the_other_mistakes() {
        let found = errors(quote!(key = [], lease = "1x"));
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].starts_with("`key = []` names no lock"),
            "{found:?}"
        );
        assert!(found[1].contains("invalid duration"), "{found:?}");
        let found = errors(quote!(key = ["a", 1], wait = 5));
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].starts_with("each key in the list is a string literal"),
            "{found:?}"
        );
        assert!(found[1].contains("a bare number has no unit"), "{found:?}");
    }

    #[test]
    fn a_second_key_argument_says_how_to_list_keys() {
        assert_eq!(
            errors(quote!(key = "a:<x>", key = "b:<y>")),
            [
                "duplicate argument `key`: give it once; to lock several keys, list them in one: \
              `key = [\"account:<from>\", \"account:<to>\"]`"
            ]
        );
    }
}
