//! The one upgrade a fn body shows: a write (or exclusive) request of the fn's own key (or of
//! any of its keys, for `key = [ … ]`), taken in the body of a `mode = "read"` fn.
//!
//! A write asked inside a read hold of the same key is refused by the runtime at once
//! (`LockError::UpgradeRefused`): two readers upgrading together would wait for each other
//! for ever. The macro sees one fn, not the mode of another annotated fn the body calls, and
//! no type makes "a write future awaited inside a read future" an error; so calls into other
//! fns are left to the runtime. What the macro can see is a request the body writes itself,
//! and that much becomes a compile error here, by a narrow and exact rule on the body's
//! tokens (the body is not parsed as Rust, see `item.rs`):
//!
//! - a method chain that starts at `lock(ARG)`, `lock_runtime::lock(ARG)` (or the
//!   `crate = "…"` path's `lock`) or `<expr>.lock(ARG)`;
//! - that reaches `.acquire()` or `.try_acquire()`, or is passed whole as the first argument
//!   of `with_lock(…)`;
//! - in write or exclusive mode as the chain leaves it: `.read()`, `.write()` and
//!   `.mode(LockMode::…)` set it, the last one wins, and a `.mode(…)` of anything but a
//!   `LockMode` variant's path is not judged;
//! - where `ARG` is one of the fn's keys written the same way: a string literal equal to a key with no
//!   placeholders, or `format!` whose text and arguments are the key's text and placeholders
//!   (`format!("cfg:{}", tenant)`, `format!("cfg:{tenant}")`, `format!("t:{}", self.tenant)`;
//!   a `&` before either is allowed).
//!
//! Not looked into: the arguments of a call to a fn or method named `spawn…` (a spawned task
//! is another owner: its write waits for the read hold, it is not an upgrade). The rule
//! compares names, not bindings, so a local that shadows a parameter (`let tenant = 2;`) and
//! is then formatted into a request of the same text is taken for the parameter: a false
//! positive accepted, and documented.

use proc_macro2::{Delimiter, Group, Spacing, TokenStream, TokenTree};

/// The fn's key, as the body would write it.
pub(crate) struct Key<'a> {
    /// The key as a `format!` string: its text with braces doubled, `{}` for each placeholder
    /// (`"cfg:{}"`).
    pub format: &'a str,
    /// The placeholders in order, each written without spaces: `tenant`, `self.tenant`,
    /// `pair.0`.
    pub values: &'a [String],
    /// The key as the user wrote it (`cfg:<tenant>`), for the message.
    pub written: &'a str,
}

/// Where the body was written, for the names in it.
pub(crate) struct Context<'a> {
    /// Paths of the runtime crate besides `lock_runtime` (the `crate = "…"` argument's),
    /// as segments.
    pub krate: &'a [String],
    /// The name `self` has in the body: `__self` in the future `#[async_trait]` wrote.
    pub self_name: &'a str,
}

/// Every write or exclusive request of one of `keys` that `body` takes, in the order written;
/// the fn holds `keys` for reading.
pub(crate) fn upgrades(
    body: TokenStream,
    keys: &[Key<'_>],
    context: &Context<'_>,
) -> Vec<syn::Error> {
    let mut found = Vec::new();
    Scan {
        keys,
        context,
        found: &mut found,
    }
    .stream(body);
    found
}

/// The mode a chain asks, as far as it goes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Asked {
    /// No mode set: the request's default.
    Exclusive,
    /// `.write()`.
    Write,
    /// `.read()`.
    Read,
    /// `.mode(m)` of something this check does not judge.
    Unknown,
}

/// A method chain after `lock(ARG)`.
struct Chain {
    /// The index just past the chain's last call.
    end: usize,
    /// The mode the chain leaves the request in.
    mode: Asked,
    /// Whether the chain ends in `.acquire()` or `.try_acquire()`.
    acquires: bool,
}

/// One scan of a body, collecting errors.
struct Scan<'s, 'a> {
    keys: &'s [Key<'a>],
    context: &'s Context<'a>,
    found: &'s mut Vec<syn::Error>,
}

impl<'s, 'a> Scan<'s, 'a> {
    /// Looks through `stream`, groups included.
    fn stream(&mut self, stream: TokenStream) {
        let trees = trees(stream);
        for at in 0..trees.len() {
            if let Some((start, key)) = self.request_at(&trees, at) {
                let chain = follow(&trees, at + 2);
                if chain.acquires {
                    self.judge(&trees[start..chain.end], chain.mode, key);
                }
            }
            if let Some(args) = self.call_of(&trees, at, "with_lock") {
                self.with_lock(args);
            }
            if let TokenTree::Group(group) = &trees[at] {
                let spawned = at > 0
                    && matches!(&trees[at - 1], TokenTree::Ident(name)
                        if name.to_string().starts_with("spawn"))
                    && group.delimiter() == Delimiter::Parenthesis;
                if !spawned {
                    self.stream(group.stream());
                }
            }
        }
    }

    /// `with_lock(CHAIN, body)`: the chain as the first argument, not acquired in it.
    fn with_lock(&mut self, args: &Group) {
        let trees = trees(args.stream());
        let first = trees
            .iter()
            .position(|tree| is_punct(tree, ','))
            .unwrap_or(trees.len());
        let first = &trees[..first];
        for at in 0..first.len() {
            if let Some((start, key)) = self.request_at(first, at) {
                let chain = follow(first, at + 2);
                if !chain.acquires && chain.end == first.len() {
                    self.judge(&first[start..], chain.mode, key);
                }
            }
        }
    }

    /// Adds the error for `chain` when it asks a write or an exclusive lock of `key`.
    fn judge(&mut self, chain: &[TokenTree], mode: Asked, key: &Key<'_>) {
        let asked = match mode {
            Asked::Exclusive => "an exclusive lock (the default mode, the same lock as a write)",
            Asked::Write => "a write lock",
            Asked::Read | Asked::Unknown => return,
        };
        let tokens: TokenStream = chain.iter().cloned().collect();
        self.found.push(syn::Error::new_spanned(
            tokens,
            format!(
                "this asks {asked} of `{key}` inside the read hold of it that this fn takes \
                 (`mode = \"read\"`): upgrading is refused, at run time with \
                 `LockError::UpgradeRefused` (two readers doing it at once would deadlock); \
                 take the write lock in the outer call (a writer may read), or ask `.read()` here",
                key = key.written
            ),
        ));
    }

    /// Whether `trees[at..]` is a request of one of the keys, `lock(ARG)` called as a fn of
    /// the runtime or as a method: where its tokens start (at its path, if any), and the key.
    fn request_at(&self, trees: &[TokenTree], at: usize) -> Option<(usize, &'s Key<'a>)> {
        let (Some(TokenTree::Ident(name)), Some(TokenTree::Group(args))) =
            (trees.get(at), trees.get(at + 1))
        else {
            return None;
        };
        if name != "lock" || args.delimiter() != Delimiter::Parenthesis {
            return None;
        }
        let method = at > 0 && is_punct(&trees[at - 1], '.');
        let start = if method {
            at
        } else {
            self.runtime_fn(trees, at)?
        };
        self.which_key(args.stream()).map(|key| (start, key))
    }

    /// The arguments of `name(…)` at `trees[at]`, called as a fn of the runtime.
    fn call_of<'t>(&self, trees: &'t [TokenTree], at: usize, name: &str) -> Option<&'t Group> {
        match (trees.get(at), trees.get(at + 1)) {
            (Some(TokenTree::Ident(ident)), Some(TokenTree::Group(args)))
                if ident == name
                    && args.delimiter() == Delimiter::Parenthesis
                    && self.runtime_fn(trees, at).is_some() =>
            {
                Some(args)
            }
            _ => None,
        }
    }

    /// Whether the name at `trees[at]` is called as a fn of the runtime: on its own (not a
    /// method, not the name of a fn being defined), or after `lock_runtime::` or the
    /// `crate = "…"` path. Where the call's tokens start.
    fn runtime_fn(&self, trees: &[TokenTree], at: usize) -> Option<usize> {
        let before = &trees[..at];
        let Some((path, start)) = path_before(before) else {
            let alone = match before.last() {
                None => true,
                Some(TokenTree::Ident(word)) => word != "fn",
                Some(tree) => !is_punct(tree, '.'),
            };
            return alone.then_some(at);
        };
        let runtime = !path.is_empty() && (path == ["lock_runtime"] || path == self.context.krate);
        runtime.then_some(start)
    }

    /// The key `arg` is, written the same way, if any.
    fn which_key(&self, arg: TokenStream) -> Option<&'s Key<'a>> {
        let trees = trees(arg);
        let mut arg = trees.as_slice();
        while let [first, rest @ ..] = arg {
            if !is_punct(first, '&') {
                break;
            }
            arg = rest;
        }
        let written = match arg {
            [TokenTree::Literal(_)] => string(&arg[0]).map(|text| (escape(&text), Vec::new())),
            _ => format_call(arg).and_then(|args| self.format_args(args)),
        };
        let (format, values) = written?;
        self.keys
            .iter()
            .find(|key| format == key.format && values == key.values)
    }

    /// The arguments of `format!(…)` as the key's `format!` string and placeholders: every
    /// value named in place (`{tenant}`, `{t}` with `t = tenant`, `{0}`, `{}`), braces kept
    /// doubled. `None` for a format spec (`{:?}` formats otherwise) or anything else.
    fn format_args(&self, args: &Group) -> Option<(String, Vec<String>)> {
        let trees = trees(args.stream());
        let mut args = trees.split(|tree| is_punct(tree, ','));
        let [literal] = args.next()? else {
            return None;
        };
        let text = string(literal)?;
        let mut positional = Vec::new();
        let mut named = Vec::new();
        for arg in args {
            match arg {
                // A trailing comma.
                [] => {}
                [TokenTree::Ident(name), TokenTree::Punct(eq), value @ ..]
                    if eq.as_char() == '=' && eq.spacing() == Spacing::Alone =>
                {
                    named.push((name.to_string(), self.path(value)?));
                }
                value => positional.push(self.path(value)?),
            }
        }
        let mut format = String::new();
        let mut values = Vec::new();
        let mut next = 0;
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' | '}' if chars.peek() == Some(&c) => {
                    chars.next();
                    format.push(c);
                    format.push(c);
                }
                '{' => {
                    let inner: String = chars.by_ref().take_while(|c| *c != '}').collect();
                    let value = if inner.is_empty() {
                        next += 1;
                        positional.get(next - 1)?.clone()
                    } else if let Ok(index) = inner.parse::<usize>() {
                        positional.get(index)?.clone()
                    } else if let Some((_, value)) = named.iter().find(|(name, _)| *name == inner) {
                        value.clone()
                    } else {
                        // Captured from the scope: a plain name, nothing else.
                        syn::parse_str::<syn::Ident>(&inner).ok()?;
                        self.path_name(&inner)
                    };
                    format.push_str("{}");
                    values.push(value);
                }
                '}' => return None,
                c => format.push(c),
            }
        }
        Some((format, values))
    }

    /// A value formatted into a key: `tenant`, `self.tenant`, `pair.0` (with `&`s before it
    /// allowed), written without spaces; `None` for any other expression.
    fn path(&self, value: &[TokenTree]) -> Option<String> {
        let mut value = value;
        while let [first, rest @ ..] = value {
            if !is_punct(first, '&') {
                break;
            }
            value = rest;
        }
        let [TokenTree::Ident(root), fields @ ..] = value else {
            return None;
        };
        let mut path = self.path_name(&root.to_string());
        let mut fields = fields.iter();
        while let Some(dot) = fields.next() {
            if !is_punct(dot, '.') {
                return None;
            }
            match fields.next()? {
                TokenTree::Ident(field) => path.push_str(&format!(".{field}")),
                // `pair.0`, and `pair.0.1`, which is one float literal.
                TokenTree::Literal(index)
                    if index
                        .to_string()
                        .chars()
                        .all(|c| c.is_ascii_digit() || c == '.') =>
                {
                    path.push_str(&format!(".{index}"));
                }
                _ => return None,
            }
        }
        Some(path)
    }

    /// A name as the key writes it: `self` for the body's name of it.
    fn path_name(&self, name: &str) -> String {
        if name == self.context.self_name {
            "self".to_owned()
        } else {
            name.to_owned()
        }
    }
}

/// The tokens of `stream`, with the invisible groups that `macro_rules!` fragments arrive in
/// opened: `$key:expr` passed in is the same key.
fn trees(stream: TokenStream) -> Vec<TokenTree> {
    let mut trees = Vec::new();
    for tree in stream {
        match tree {
            TokenTree::Group(group) if group.delimiter() == Delimiter::None => {
                trees.extend(self::trees(group.stream()));
            }
            tree => trees.push(tree),
        }
    }
    trees
}

/// Follows the method calls after `lock(ARG)`, from `trees[at]`.
fn follow(trees: &[TokenTree], mut at: usize) -> Chain {
    let mut mode = Asked::Exclusive;
    while let (Some(dot), Some(TokenTree::Ident(method)), Some(TokenTree::Group(args))) =
        (trees.get(at), trees.get(at + 1), trees.get(at + 2))
    {
        if !is_punct(dot, '.') || args.delimiter() != Delimiter::Parenthesis {
            break;
        }
        let no_args = args.stream().is_empty();
        match method.to_string().as_str() {
            "read" if no_args => mode = Asked::Read,
            "write" if no_args => mode = Asked::Write,
            "read" | "write" => mode = Asked::Unknown,
            "mode" => mode = asked(args.stream()),
            "acquire" | "try_acquire" if no_args => {
                return Chain {
                    end: at + 3,
                    mode,
                    acquires: true,
                }
            }
            _ => {}
        }
        at += 3;
    }
    Chain {
        end: at,
        mode,
        acquires: false,
    }
}

/// The mode `.mode(arg)` asks: a path to a `LockMode` variant (`LockMode::Read`,
/// `lock_runtime::LockMode::Write`), or one not judged.
fn asked(arg: TokenStream) -> Asked {
    let trees = trees(arg);
    let is_path = trees
        .iter()
        .all(|tree| matches!(tree, TokenTree::Ident(_)) || is_punct(tree, ':'));
    let variant = match trees.last() {
        Some(TokenTree::Ident(last)) if is_path && trees.len() > 1 => last.to_string(),
        _ => return Asked::Unknown,
    };
    match variant.as_str() {
        "Read" => Asked::Read,
        "Write" => Asked::Write,
        "Exclusive" => Asked::Exclusive,
        _ => Asked::Unknown,
    }
}

/// The segments of the path `a::b::` that `before` ends with (a leading `::` dropped), and
/// where in `before` it starts; `None` when `before` does not end with `::`.
fn path_before(before: &[TokenTree]) -> Option<(Vec<String>, usize)> {
    let mut segments = Vec::new();
    let mut rest = before;
    while let [head @ .., TokenTree::Punct(first), TokenTree::Punct(second)] = rest {
        if first.as_char() != ':' || first.spacing() != Spacing::Joint || second.as_char() != ':' {
            break;
        }
        match head {
            [head @ .., TokenTree::Ident(segment)] => {
                segments.push(segment.to_string());
                rest = head;
            }
            _ => {
                rest = head;
                break;
            }
        }
    }
    if rest.len() == before.len() {
        return None;
    }
    segments.reverse();
    Some((segments, rest.len()))
}

/// `format!(…)`, `std::format!(…)`, `::std::format!(…)` or `alloc::format!(…)`: its
/// arguments.
fn format_call(arg: &[TokenTree]) -> Option<&Group> {
    let [path @ .., TokenTree::Ident(name), bang, TokenTree::Group(args)] = arg else {
        return None;
    };
    if name != "format" || !is_punct(bang, '!') {
        return None;
    }
    let prefix_ok = match path_before(path) {
        None => path.is_empty(),
        // Nothing stands before the path.
        Some((segments, start)) => start == 0 && (segments == ["std"] || segments == ["alloc"]),
    };
    prefix_ok.then_some(args)
}

/// The value of a string literal token (raw strings included).
fn string(tree: &TokenTree) -> Option<String> {
    syn::parse2::<syn::LitStr>(tree.clone().into())
        .ok()
        .map(|lit| lit.value())
}

/// Text as a `format!` string writes it: braces doubled.
fn escape(text: &str) -> String {
    text.replace('{', "{{").replace('}', "}}")
}

/// Whether `tree` is the punctuation `c`.
fn is_punct(tree: &TokenTree, c: char) -> bool {
    matches!(tree, TokenTree::Punct(punct) if punct.as_char() == c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    /// The errors for `body` in a read fn of the key `format` with `values`.
    fn errors(format: &str, values: &[&str], body: TokenStream) -> Vec<String> {
        let values: Vec<String> = values.iter().map(|v| (*v).to_owned()).collect();
        let key = Key {
            format,
            values: &values,
            written: "the key",
        };
        let krate = ["deps".to_owned(), "locks".to_owned()];
        let context = Context {
            krate: &krate,
            self_name: "self",
        };
        upgrades(body, &[key], &context)
            .into_iter()
            .map(|error| error.to_string())
            .collect()
    }

    fn upgrade(format: &str, values: &[&str], body: TokenStream) -> bool {
        let found = errors(format, values, body.clone());
        assert!(found.len() <= 1, "{body}: {found:?}");
        found.len() == 1
    }

    #[test]
    fn a_request_of_the_key_in_write_or_exclusive_mode_is_an_upgrade() {
        for body in [
            quote!(lock("cfg").acquire().await?;),
            quote!(let g = lock("cfg").write().acquire().await?;),
            quote!(lock_runtime::lock("cfg").lease(LEASE).try_acquire().await?;),
            quote!(::lock_runtime::lock("cfg").acquire().await?;),
            quote!(deps::locks::lock("cfg").acquire().await?;),
            quote!(runtime.lock("cfg").wait(W).acquire().await?;),
            quote!(self.runtime().lock(r"cfg").acquire().await?;),
            quote!(lock("cfg").mode(LockMode::Write).acquire().await?;),
            quote!(lock("cfg").mode(lock_runtime::LockMode::Exclusive).acquire().await?;),
            // The last mode set wins.
            quote!(lock("cfg").read().write().acquire().await?;),
            quote!(with_lock(lock("cfg"), async { Ok(()) }).await?;),
            quote!(lock_runtime::with_lock(lock("cfg").write(), body).await?;),
            // Inside blocks, closures and async blocks of the body.
            quote!(if x {
                let f = || async { lock("cfg").acquire().await };
                f().await?;
            }),
            quote!(return (lock("cfg").acquire().await);),
            // `format!` with no placeholder is the same key.
            quote!(lock(format!("cfg")).acquire().await?;),
        ] {
            assert!(upgrade("cfg", &[], body.clone()), "{body}");
        }
    }

    #[test]
    fn a_key_with_placeholders_is_matched_by_format() {
        for body in [
            quote!(lock(format!("cfg:{}", tenant)).acquire()),
            quote!(lock(format!("cfg:{tenant}")).acquire()),
            quote!(lock(format!("cfg:{t}", t = tenant,)).acquire()),
            quote!(lock(format!("cfg:{0}", &tenant)).acquire()),
            quote!(lock(&std::format!("cfg:{}", tenant)).acquire()),
            quote!(lock(::std::format!("cfg:{}", tenant)).acquire()),
            quote!(lock(alloc::format!("cfg:{}", tenant)).acquire()),
        ] {
            assert!(upgrade("cfg:{}", &["tenant"], body.clone()), "{body}");
        }
        assert!(upgrade(
            "{{x}}:{}:{}:{}",
            &["self.tenant", "req.order_id", "pair.0"],
            quote!(lock(format!("{{x}}:{}:{}:{}", self.tenant, req.order_id, pair.0)).acquire()),
        ));
        assert!(upgrade(
            "{}",
            &["pair.0.1"],
            quote!(lock(format!("{}", pair.0 .1)).acquire()),
        ));
    }

    #[test]
    fn async_trait_bodies_name_self_otherwise() {
        let values = ["self.tenant".to_owned()];
        let key = Key {
            format: "t:{}",
            values: &values,
            written: "t:<self.tenant>",
        };
        let context = Context {
            krate: &[],
            self_name: "__self",
        };
        let body = quote!(lock(format!("t:{}", __self.tenant)).acquire());
        assert_eq!(upgrades(body, &[key], &context).len(), 1);
    }

    #[test]
    fn a_read_of_the_key_is_no_upgrade() {
        for body in [
            quote!(lock("cfg").read().acquire().await?;),
            quote!(lock("cfg").write().read().try_acquire().await?;),
            quote!(lock("cfg").mode(LockMode::Read).acquire().await?;),
            quote!(with_lock(lock("cfg").read(), body).await?;),
            // Not judged: a mode this check cannot read.
            quote!(lock("cfg").mode(mode).acquire().await?;),
            quote!(lock("cfg")
                .mode(if w { LockMode::Write } else { LockMode::Read })
                .acquire()),
        ] {
            assert!(!upgrade("cfg", &[], body.clone()), "{body}");
        }
    }

    #[test]
    fn another_key_is_no_upgrade() {
        for body in [
            quote!(lock("cfg:all").acquire().await?;),
            quote!(lock("cf").acquire().await?;),
            quote!(lock(KEY).acquire().await?;),
            quote!(lock(key).acquire().await?;),
            quote!(lock("cfg".to_owned()).acquire().await?;),
        ] {
            assert!(!upgrade("cfg", &[], body.clone()), "{body}");
        }
        for body in [
            quote!(lock(format!("cfg:{}", other)).acquire()),
            quote!(lock(format!("cfg:{}", tenant + 1)).acquire()),
            quote!(lock(format!("cfg:{:?}", tenant)).acquire()),
            quote!(lock(format!("cfg-{}", tenant)).acquire()),
            quote!(lock(format!("cfg:{}:{}", tenant, tenant)).acquire()),
            quote!(lock(format!("cfg:{}", tenant.id)).acquire()),
            quote!(lock(format!("cfg:{}")).acquire()),
            quote!(lock(my::format!("cfg:{}", tenant)).acquire()),
            quote!(lock(format_args!("cfg:{}", tenant)).acquire()),
            quote!(lock("cfg:{}").acquire()),
        ] {
            assert!(!upgrade("cfg:{}", &["tenant"], body.clone()), "{body}");
        }
    }

    #[test]
    fn other_shapes_are_not_judged() {
        for body in [
            // Not acquired here.
            quote!(let request = lock("cfg"); with_lock(request, body).await?;),
            quote!(let request = lock("cfg").write();),
            // Not the runtime's `lock`.
            quote!(other::lock("cfg").acquire().await?;),
            quote!(
                fn lock(key: &str) -> R {
                    todo!()
                }
            ),
            quote!(mutex.lock().await;),
            // Another task is another owner.
            quote!(tokio::spawn(async { lock("cfg").acquire().await });),
            quote!(set.spawn_local(async move { lock("cfg").acquire().await });),
            // Something else between the request and the acquire.
            quote!(Some(lock("cfg")).unwrap().acquire().await?;),
            quote!(with_lock(Some(lock("cfg")).unwrap(), body).await?;),
        ] {
            assert!(!upgrade("cfg", &[], body.clone()), "{body}");
        }
    }

    #[test]
    fn every_upgrade_is_reported_at_its_chain() {
        let found = errors(
            "cfg",
            &[],
            quote! {
                let a = lock("cfg").acquire().await?;
                let b = lock("cfg").write().try_acquire().await?;
            },
        );
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].starts_with("this asks an exclusive lock (the default mode, the same lock as a write) of `the key` inside the read hold"),
            "{found:?}"
        );
        assert!(
            found[1].starts_with("this asks a write lock of `the key`"),
            "{found:?}"
        );
    }

    #[test]
    fn a_key_passed_through_macro_rules_is_the_same_key() {
        let key = Group::new(Delimiter::None, quote!("cfg"));
        let chain = Group::new(Delimiter::None, quote!(lock(#key)));
        assert!(upgrade("cfg", &[], quote!(#chain.acquire().await?;)));
    }
}
