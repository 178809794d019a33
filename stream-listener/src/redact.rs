//! Credentials never leave the process: Redis URLs are redacted before they reach an error message, a log
//! line or `Debug` output.
//!
//! A Redis URL may carry a password in its user-info (`redis://alice:secret@host:6379/0`,
//! `rediss://:secret@host`) or in its query (`redis+unix:///run/redis.sock?pass=secret`). [`redact_url`]
//! keeps what an operator needs to tell servers apart (scheme, user name, host, port, path, database) and
//! replaces every secret with `***`. [`RedisUrl`] holds a URL whose `Debug` and `Display` are redacted.

use std::fmt;

/// What a secret is replaced with.
pub const REDACTED: &str = "***";

/// Query parameters whose values are secrets (`pass` is what redis-rs reads for unix sockets).
const SECRET_PARAMS: &[&str] = &[
    "pass",
    "password",
    "passwd",
    "pwd",
    "token",
    "auth",
    "sentinel_password",
];

/// `url` with its credentials replaced by `***`: the password of the user-info (a user-info without `:`
/// is replaced whole, since some clients read it as a password) and the values of `pass`, `password` and
/// similar query parameters. Text that is not a URL is returned with anything before an `@` redacted.
///
/// ```
/// use stream_listener::redact::redact_url;
/// assert_eq!(redact_url("redis://alice:topsecret@10.0.0.5:6379/0"), "redis://alice:***@10.0.0.5:6379/0");
/// assert_eq!(redact_url("rediss://:topsecret@cache:6380"), "rediss://:***@cache:6380");
/// assert_eq!(redact_url("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
/// ```
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    // The last `@` ends the user-info: a password with a raw `@` or `/` still ends up redacted.
    let (userinfo, after) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at..]),
        None => (None, rest),
    };
    let mut out = String::with_capacity(url.len());
    out.push_str(scheme);
    if let Some(userinfo) = userinfo {
        match userinfo.split_once(':') {
            Some((user, _password)) => {
                out.push_str(user);
                out.push(':');
                out.push_str(REDACTED);
            }
            None if userinfo.is_empty() => {}
            None => out.push_str(REDACTED),
        }
    }
    match after.split_once('?') {
        Some((path, query)) => {
            out.push_str(path);
            out.push('?');
            out.push_str(&redact_query(query));
        }
        None => out.push_str(after),
    }
    out
}

fn redact_query(query: &str) -> String {
    let (query, fragment) = match query.split_once('#') {
        Some((q, f)) => (q, Some(f)),
        None => (query, None),
    };
    let mut parts = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some((name, _)) if SECRET_PARAMS.contains(&name.to_ascii_lowercase().as_str()) => {
                parts.push(format!("{name}={REDACTED}"))
            }
            _ => parts.push(pair.to_string()),
        }
    }
    let mut out = parts.join("&");
    if let Some(fragment) = fragment {
        out.push('#');
        out.push_str(fragment);
    }
    out
}

/// A Redis URL whose `Debug` and `Display` show it redacted ([`redact_url`]); [`expose`](Self::expose)
/// gives the real one to the Redis client.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl(String);

impl RedisUrl {
    /// Wraps a URL.
    pub fn new(url: impl Into<String>) -> Self {
        Self(url.into())
    }

    /// The URL with its credentials, for the Redis client only; never print it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", redact_url(&self.0))
    }
}

impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_url(&self.0))
    }
}

impl From<String> for RedisUrl {
    fn from(url: String) -> Self {
        Self(url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted_everywhere_they_can_be() {
        for (url, expected) in [
            (
                "redis://alice:topsecret@127.0.0.1:6379/2",
                "redis://alice:***@127.0.0.1:6379/2",
            ),
            ("redis://:topsecret@host", "redis://:***@host"),
            ("redis://topsecret@host:1", "redis://***@host:1"),
            ("rediss://u:p@ss:w@rd@h:6380", "rediss://u:***@h:6380"),
            (
                "redis+unix:///tmp/r.sock?db=1&pass=topsecret",
                "redis+unix:///tmp/r.sock?db=1&pass=***",
            ),
            (
                "unix:///tmp/r.sock?user=u&PASSWORD=topsecret#x",
                "unix:///tmp/r.sock?user=u&PASSWORD=***#x",
            ),
            ("redis://127.0.0.1:6379/", "redis://127.0.0.1:6379/"),
            ("u:topsecret@host", "u:***@host"),
            ("", ""),
        ] {
            assert_eq!(redact_url(url), expected, "{url}");
            assert!(!redact_url(url).contains("topsecret"));
        }
    }

    #[test]
    fn the_wrapper_never_shows_the_password() {
        let url = RedisUrl::new("redis://alice:topsecret@h/0");
        assert_eq!(format!("{url}"), "redis://alice:***@h/0");
        assert_eq!(format!("{url:?}"), "\"redis://alice:***@h/0\"");
        assert_eq!(url.expose(), "redis://alice:topsecret@h/0");
    }
}
