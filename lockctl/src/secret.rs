//! Secrets in what lockctl prints: every URL it shows has its password
//! replaced by `***`, and every message it prints has each known secret
//! replaced too, whatever shape the input had (a URL without a scheme, a
//! password holding `/` or `@`, a list of URLs, a password given on its
//! own in `REDIS_PASSWORD`, a password in a query such as the `?pass=` of a
//! `redis+unix://` URL, a password given where a URL was expected).

/// The user part of one URL and the rest: `[scheme://]userinfo@rest`. The
/// user part runs to the *last* `@`: a host or path has no `@`, while a
/// password may hold one (or a `/`, which would end a URL's authority), and
/// cutting it short would print the rest of the password.
fn parts(url: &str) -> Option<(Option<&str>, &str, &str)> {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let at = rest.rfind('@')?;
    Some((scheme, &rest[..at], &rest[at + 1..]))
}

/// The password of `[scheme://][user]:password@host…` (a lone user part is
/// taken as a password too, to be safe); `None` without an `@`.
fn password(url: &str) -> Option<&str> {
    let (_, userinfo, _) = parts(url)?;
    let secret = userinfo.split_once(':').map_or(userinfo, |(_, pass)| pass);
    (!secret.is_empty()).then_some(secret)
}

/// `url` with its password replaced by `***`; in a comma-separated list,
/// each URL's.
pub(crate) fn mask(urls: &str) -> String {
    urls.split(',').map(mask_one).collect::<Vec<_>>().join(",")
}

/// One URL as it may be shown: its password masked, and its query and
/// fragment too (`redis+unix:///s?pass=…` carries the password there). A
/// value with neither a scheme nor an `@` is shown only if it reads as
/// `host:port`: a bare word may be a password given where a URL was
/// expected (`REDIS_URL=$REDIS_PASSWORD`), and cannot be told from a host.
fn mask_one(url: &str) -> String {
    match parts(url) {
        Some((scheme, userinfo, rest)) if password(url).is_some() => {
            let user = userinfo.split_once(':').map_or("", |(user, _)| user);
            let scheme = scheme.map_or(String::new(), |s| format!("{s}://"));
            format!("{scheme}{user}:***@{}", without_query(rest))
        }
        _ if !url.contains("://") && !url.contains('@') && !host_and_port(url) => "***".to_owned(),
        _ => without_query(url),
    }
}

/// `url` without its query and fragment (`?***` in their place). Only the
/// part after the user info is given: a password may hold a `?`.
fn without_query(url: &str) -> String {
    match url.find(['?', '#']) {
        Some(at) => format!("{}?***", &url[..at]),
        None => url.to_owned(),
    }
}

/// Whether a value without a scheme reads as `host:port[/path]` (a port of
/// digits), as sentinels, etcd endpoints and ZooKeeper servers are given.
fn host_and_port(value: &str) -> bool {
    let authority = value.split('/').next().unwrap_or_default().trim();
    authority.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty() && !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())
    })
}

/// The values of a URL's query fields that carry a password (`pass`, as
/// redis's `redis+unix://` URLs take it, and `password`).
fn query_secrets(url: &str) -> impl Iterator<Item = &str> {
    let query = url.split_once('?').map_or("", |(_, query)| query);
    let query = query.split('#').next().unwrap_or_default();
    query.split('&').filter_map(|field| {
        let (name, value) = field.split_once('=')?;
        matches!(name, "pass" | "password").then_some(value)
    })
}

/// The secrets of these URLs (each URL of a comma-separated list), as
/// written and percent-decoded (a server's error may quote either).
pub(crate) fn secrets_of<'a>(urls: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut secrets = Vec::new();
    for url in urls.into_iter().flat_map(|u| u.split(',')) {
        for secret in password(url).into_iter().chain(query_secrets(url)) {
            secrets.push(secret.to_owned());
            secrets.push(crate::keys::percent_decoded(secret));
        }
    }
    secrets.retain(|s| !s.is_empty());
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets.dedup();
    secrets
}

/// `text` with every one of `secrets` replaced by `***` (longest first, so
/// a secret that contains another is masked whole).
pub(crate) fn scrub(text: &str, secrets: &[String]) -> String {
    secrets.iter().fold(text.to_owned(), |text, secret| {
        text.replace(secret.as_str(), "***")
    })
}

#[cfg(test)]
mod tests {
    use super::{mask, scrub, secrets_of};

    /// Asserts that each `(url, shown)` is masked as `shown`.
    fn masks(cases: &[(&str, &str)]) {
        for (url, shown) in cases {
            assert_eq!(mask(url), *shown, "{url}");
        }
    }

    #[test]
    fn passwords_are_masked_and_nothing_else() {
        masks(&[
            ("redis://app:s3cret@db:6379/0", "redis://app:***@db:6379/0"),
            ("redis://:s3cret@db", "redis://:***@db"),
            ("redis://s3cret@db", "redis://:***@db"),
            ("redis://db:6379", "redis://db:6379"),
            ("db:6379/0", "db:6379/0"),
            ("[::1]:6379", "[::1]:6379"),
        ]);
    }

    #[test]
    fn a_query_or_a_bare_word_is_not_shown() {
        masks(&[
            (
                "redis+unix:///run/redis.sock?db=1&pass=hunter2",
                "redis+unix:///run/redis.sock?***",
            ),
            ("redis://db:1/0#hunter2", "redis://db:1/0?***"),
            // A `?` inside the password is not a query.
            ("redis://:a?b@db:1", "redis://:***@db:1"),
            // A password where a URL was expected reads like a host name.
            ("hunter2", "***"),
            ("s1:26379,hunter2", "s1:26379,***"),
        ]);
        let secrets = secrets_of(["redis+unix:///s?user=app&pass=hun%2Fter2"]);
        assert_eq!(
            scrub("auth hun/ter2 or hun%2Fter2", &secrets),
            "auth *** or ***"
        );
    }

    #[test]
    fn a_password_is_masked_whatever_the_shape_of_the_url() {
        masks(&[
            (":hunter2@localhost:6379", ":***@localhost:6379"),
            ("app:hunter2@localhost", "app:***@localhost"),
            ("redis://:pa/ss@db:1", "redis://:***@db:1"),
            ("redis://:p@ss@db:1", "redis://:***@db:1"),
            (
                "redis://:a@n1:7000,redis://:b@n2:7000",
                "redis://:***@n1:7000,redis://:***@n2:7000",
            ),
        ]);
    }

    #[test]
    fn messages_lose_every_secret_as_written_and_decoded() {
        let secrets = secrets_of(["redis://:p%40ss@db", "x:hunter2@h"]);
        let text = scrub("auth p@ss failed; p%40ss; hunter2", &secrets);
        assert_eq!(text, "auth *** failed; ***; ***");
    }
}
