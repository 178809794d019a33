//! Message headers: name/value metadata carried beside the payload, such as W3C trace context.
//!
//! # Entry layout
//!
//! All headers of an entry live in **one field**, `sl_headers` ([`HEADERS_FIELD`]), holding a JSON object
//! of strings, in the order they were set:
//!
//! ```text
//! XADD orders:3 NOMKSTREAM * k customer-7 p {"id":7} sl_headers {"traceparent":"00-4bf9…-00f0…-01"}
//! ```
//!
//! One field rather than one per header (`h_traceparent`, ...): a consumer finds it with one comparison
//! per field and decodes it with one JSON parse; names and values need no escaping scheme of their own;
//! and the library reserves one field name instead of a prefix. The `sl_` prefix is the library's own
//! (as in `sl_only_group`), so it does not collide with the fields other clients write (a foreign entry
//! with a field `h` or `headers` keeps it as a plain field). An entry without the field has no headers:
//! entries of older producers and of other clients decode as they always did, and a producer that sets
//! no header (and has no trace context to inject) writes no field.
//!
//! A field that is not a JSON object of strings is **malformed**. A payload handler's entry with one is
//! dead-lettered at once, like an undecodable payload, the reason naming the field; the dead letter
//! keeps every field as read, so nothing is lost. A [`Fields`](crate::Fields) handler (entries of other
//! clients) gets it as an ordinary field instead, with no headers.

use std::fmt;

use serde::de::{self, MapAccess, Visitor};

/// The entry field holding the headers ([`crate::names::field::HEADERS`]).
pub const HEADERS_FIELD: &str = crate::names::field::HEADERS;

/// Headers of one message: string names and values, in the order they were set, names unique.
///
/// ```
/// use stream_listener::Headers;
///
/// let headers = Headers::new().with("tenant", "acme").with("source", "checkout");
/// assert_eq!(headers.get("tenant"), Some("acme"));
/// assert_eq!(headers.iter().map(|(name, _)| name).collect::<Vec<_>>(), ["tenant", "source"]);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers {
    entries: Vec<(String, String)>,
}

/// Why an entry's `sl_headers` field could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the `{HEADERS_FIELD}` field is malformed ({reason}); expected a JSON object of strings")]
pub struct HeadersError {
    reason: String,
}

impl Headers {
    /// No headers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `name` to `value`, replacing (in place) an earlier value of the same name; returns it.
    pub fn insert(&mut self, name: impl Into<String>, value: impl Into<String>) -> Option<String> {
        let (name, value) = (name.into(), value.into());
        match self.entries.iter_mut().find(|(n, _)| *n == name) {
            Some((_, old)) => Some(std::mem::replace(old, value)),
            None => {
                self.entries.push((name, value));
                None
            }
        }
    }

    /// These headers with `name` set to `value`.
    pub fn with(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.insert(name, value);
        self
    }

    /// The value of `name` (names are case-sensitive).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Removes `name`; returns its value.
    pub fn remove(&mut self, name: &str) -> Option<String> {
        let at = self.entries.iter().position(|(n, _)| n == name)?;
        Some(self.entries.remove(at).1)
    }

    /// `(name, value)` pairs in the order they were set.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// Number of headers.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No headers.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The value of the `sl_headers` field: a JSON object of strings.
    pub fn encode(&self) -> String {
        let mut out = String::from("{");
        for (i, (name, value)) in self.entries.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            // Serializing a string to JSON cannot fail.
            out.push_str(&serde_json::to_string(name).expect("a string serializes"));
            out.push(':');
            out.push_str(&serde_json::to_string(value).expect("a string serializes"));
        }
        out.push('}');
        out
    }

    /// Headers from the value of an `sl_headers` field.
    pub fn decode(bytes: &[u8]) -> Result<Self, HeadersError> {
        let pairs: Pairs = serde_json::from_slice(bytes).map_err(|e| HeadersError {
            reason: e.to_string(),
        })?;
        let mut headers = Headers::new();
        for (name, value) in pairs.0 {
            if headers.insert(name.clone(), value).is_some() {
                return Err(HeadersError {
                    reason: format!("header `{name}` appears twice"),
                });
            }
        }
        Ok(headers)
    }

    /// The headers of an entry with these fields: none without an `sl_headers` field.
    pub(crate) fn of_entry(fields: &[(Vec<u8>, Vec<u8>)]) -> Result<Self, HeadersError> {
        match fields
            .iter()
            .find(|(name, _)| name.as_slice() == HEADERS_FIELD.as_bytes())
        {
            Some((_, value)) => Self::decode(value),
            None => Ok(Self::new()),
        }
    }
}

impl<N: Into<String>, V: Into<String>> FromIterator<(N, V)> for Headers {
    fn from_iter<I: IntoIterator<Item = (N, V)>>(iter: I) -> Self {
        let mut headers = Headers::new();
        for (name, value) in iter {
            headers.insert(name, value);
        }
        headers
    }
}

/// A JSON object's members in document order, duplicates kept (so that decoding can refuse them).
struct Pairs(Vec<(String, String)>);

impl<'de> de::Deserialize<'de> for Pairs {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PairsVisitor;
        impl<'de> Visitor<'de> for PairsVisitor {
            type Value = Pairs;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object of strings")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Pairs, A::Error> {
                let mut pairs = Vec::new();
                while let Some(pair) = map.next_entry::<String, String>()? {
                    pairs.push(pair);
                }
                Ok(Pairs(pairs))
            }
        }
        deserializer.deserialize_map(PairsVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_names_and_values_in_order() {
        let headers = Headers::new()
            .with(
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            )
            .with("quote\"and\\slash", "line\nbreak, ünïcode, {\"json\": 1}")
            .with("", "");
        let encoded = headers.encode();
        assert_eq!(Headers::decode(encoded.as_bytes()), Ok(headers.clone()));
        assert_eq!(Headers::decode(b"{}"), Ok(Headers::new()));
        assert_eq!(Headers::new().encode(), "{}");
        // Compact: what a producer in another language would write by hand.
        assert_eq!(
            Headers::new().with("a", "1").with("b", "2").encode(),
            r#"{"a":"1","b":"2"}"#
        );
    }

    #[test]
    fn insert_replaces_in_place() {
        let mut headers = Headers::new().with("a", "1").with("b", "2");
        assert_eq!(headers.insert("a", "3"), Some("1".into()));
        assert_eq!(headers.iter().collect::<Vec<_>>(), [("a", "3"), ("b", "2")]);
        assert_eq!(headers.remove("a"), Some("3".into()));
        assert_eq!(headers.len(), 1);
    }

    #[test]
    fn a_malformed_field_is_a_clear_error() {
        for bad in [
            &b"not json"[..],
            br#"["a","b"]"#,
            br#"{"a":1}"#,
            br#"{"a":"1","a":"2"}"#,
            b"{\"a\":\"\xff\"}",
            b"",
        ] {
            let error = Headers::decode(bad).unwrap_err().to_string();
            assert!(
                error.starts_with("the `sl_headers` field is malformed ("),
                "{error}"
            );
        }
        let twice = Headers::decode(br#"{"a":"1","a":"2"}"#).unwrap_err();
        assert!(
            twice.to_string().contains("header `a` appears twice"),
            "{twice}"
        );
    }

    #[test]
    fn entries_without_the_field_have_no_headers() {
        let entry = |pairs: &[(&str, &str)]| -> Vec<(Vec<u8>, Vec<u8>)> {
            pairs
                .iter()
                .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
                .collect()
        };
        // An older producer's entry, and a foreign one with fields that look like headers.
        assert_eq!(
            Headers::of_entry(&entry(&[("k", "x"), ("p", "{}")])),
            Ok(Headers::new())
        );
        assert_eq!(
            Headers::of_entry(&entry(&[("h", "x"), ("headers", "{}")])),
            Ok(Headers::new())
        );
        assert_eq!(
            Headers::of_entry(&entry(&[("k", "x"), ("sl_headers", r#"{"t":"1"}"#)])),
            Ok(Headers::new().with("t", "1"))
        );
        assert!(Headers::of_entry(&entry(&[("sl_headers", "{")])).is_err());
    }
}
