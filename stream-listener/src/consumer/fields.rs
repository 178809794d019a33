//! [`Fields`]: an entry's field map, for entries written by other clients.
//!
//! The spec's JVM and Python producers (and anyone running `XADD` by hand) write arbitrary fields and no
//! `p` payload field. A `Message<Fields>` handler gets them in order, with typed getters, or decoded into a
//! struct with serde ([`Fields::deserialize`]), each value parsed from its text as the target type asks.

use std::fmt;
use std::str::FromStr;

use serde::de::{self, DeserializeOwned, IntoDeserializer, Visitor};

use crate::names::field::KEY as KEY_FIELD;

/// The fields of one stream entry, in the order they were written, without the library's own `k`
/// (the partition key, in [`Message::key`](super::Message::key)), `v` (the topology version) and
/// `sl_headers` (in [`Message::headers`](super::Message::headers)). An `sl_headers` field that does not
/// decode as headers stays here as an ordinary field.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fields {
    entries: Vec<(String, Vec<u8>)>,
}

/// Why a field could not be read as the asked type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FieldError {
    /// The entry has no such field.
    #[error("the entry has no field `{0}`")]
    Missing(String),
    /// The field's value is not UTF-8 text.
    #[error("field `{0}` is not UTF-8")]
    NotUtf8(String),
    /// The field's text does not parse as the asked type.
    #[error("field `{name}` = {value:?}: {reason}")]
    Invalid {
        /// The field.
        name: String,
        /// Its text.
        value: String,
        /// The parse error.
        reason: String,
    },
    /// [`Fields::deserialize`] failed.
    #[error("cannot decode the fields: {0}")]
    Decode(String),
}

impl Fields {
    /// The fields of an entry as read from Redis, minus the library's `k`, `v` and (when it decodes)
    /// `sl_headers`.
    pub(crate) fn from_entry(fields: &[(Vec<u8>, Vec<u8>)]) -> Self {
        let version = crate::topology::VERSION_ENTRY_FIELD.as_bytes();
        let headers = crate::names::field::HEADERS.as_bytes();
        Self {
            entries: fields
                .iter()
                .filter(|(name, value)| {
                    name.as_slice() != KEY_FIELD.as_bytes()
                        && name != version
                        && !(name == headers && crate::Headers::decode(value).is_ok())
                })
                .map(|(name, value)| (String::from_utf8_lossy(name).into_owned(), value.clone()))
                .collect(),
        }
    }

    /// Fields from `(name, value)` pairs (for tests of handlers).
    pub fn new<N: Into<String>, V: Into<Vec<u8>>>(
        fields: impl IntoIterator<Item = (N, V)>,
    ) -> Self {
        Self {
            entries: fields
                .into_iter()
                .map(|(n, v)| (n.into(), v.into()))
                .collect(),
        }
    }

    /// The raw bytes of the first field called `name`.
    pub fn bytes(&self, name: &str) -> Option<&[u8]> {
        self.entries
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    /// The text of field `name`.
    pub fn str(&self, name: &str) -> Result<&str, FieldError> {
        let bytes = self
            .bytes(name)
            .ok_or_else(|| FieldError::Missing(name.to_owned()))?;
        std::str::from_utf8(bytes).map_err(|_| FieldError::NotUtf8(name.to_owned()))
    }

    /// Field `name` parsed from its text (`u64`, `f64`, `bool`, `String`, ...).
    pub fn get<T>(&self, name: &str) -> Result<T, FieldError>
    where
        T: FromStr,
        T::Err: fmt::Display,
    {
        let text = self.str(name)?;
        text.parse().map_err(|e: T::Err| FieldError::Invalid {
            name: name.to_owned(),
            value: text.to_owned(),
            reason: e.to_string(),
        })
    }

    /// The fields decoded into `T` with serde: a struct's fields by name, each value parsed from its
    /// text as the struct's field type asks (numbers, booleans, strings; `Option` for fields that may be
    /// missing). Fields `T` does not name are ignored unless it denies unknown fields.
    pub fn deserialize<T: DeserializeOwned>(&self) -> Result<T, FieldError> {
        let pairs = self
            .entries
            .iter()
            .map(|(name, value)| (name.as_str(), Text(String::from_utf8_lossy(value))));
        T::deserialize(de::value::MapDeserializer::<_, de::value::Error>::new(
            pairs,
        ))
        .map_err(|e| FieldError::Decode(e.to_string()))
    }

    /// `(name, value)` pairs in entry order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.entries.iter().map(|(n, v)| (n.as_str(), v.as_slice()))
    }

    /// Number of fields.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No fields.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// One field value during [`Fields::deserialize`]: text that is parsed when the target asks for a type.
struct Text<'a>(std::borrow::Cow<'a, str>);

impl<'de, 'a> IntoDeserializer<'de, de::value::Error> for Text<'a> {
    type Deserializer = Self;

    fn into_deserializer(self) -> Self {
        self
    }
}

impl Text<'_> {
    fn parse<T: FromStr>(&self, what: &str) -> Result<T, de::value::Error>
    where
        T::Err: fmt::Display,
    {
        self.0
            .trim()
            .parse()
            .map_err(|e: T::Err| de::Error::custom(format_args!("{:?} is not {what}: {e}", self.0)))
    }
}

macro_rules! parsed {
    ($($method:ident => $ty:ty, $visit:ident, $what:literal;)*) => {
        $(
            fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
                visitor.$visit(self.parse::<$ty>($what)?)
            }
        )*
    };
}

impl<'de> de::Deserializer<'de> for Text<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_string(self.0.into_owned())
    }

    parsed! {
        deserialize_bool => bool, visit_bool, "a boolean";
        deserialize_i8 => i8, visit_i8, "an integer";
        deserialize_i16 => i16, visit_i16, "an integer";
        deserialize_i32 => i32, visit_i32, "an integer";
        deserialize_i64 => i64, visit_i64, "an integer";
        deserialize_i128 => i128, visit_i128, "an integer";
        deserialize_u8 => u8, visit_u8, "an unsigned integer";
        deserialize_u16 => u16, visit_u16, "an unsigned integer";
        deserialize_u32 => u32, visit_u32, "an unsigned integer";
        deserialize_u64 => u64, visit_u64, "an unsigned integer";
        deserialize_u128 => u128, visit_u128, "an unsigned integer";
        deserialize_f32 => f32, visit_f32, "a number";
        deserialize_f64 => f64, visit_f64, "a number";
        deserialize_char => char, visit_char, "a character";
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_enum(self.0.into_owned().into_deserializer())
    }

    serde::forward_to_deserialize_any! {
        str string bytes byte_buf unit unit_struct seq tuple tuple_struct map struct identifier
        ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(pairs: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
        pairs
            .iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    #[derive(Debug, PartialEq, serde::Deserialize)]
    struct Order {
        order_id: String,
        amount_cents: u64,
        express: bool,
        note: Option<String>,
    }

    #[test]
    fn keeps_order_and_drops_the_library_fields() {
        let fields =
            Fields::from_entry(&entry(&[("k", "c-1"), ("b", "2"), ("a", "1"), ("v", "3")]));
        let names: Vec<&str> = fields.iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["b", "a"]);
        assert_eq!(fields.get::<u32>("a"), Ok(1));
        assert_eq!(fields.str("b"), Ok("2"));
        assert_eq!(fields.get::<u32>("k"), Err(FieldError::Missing("k".into())));
    }

    #[test]
    fn headers_leave_the_fields_only_when_they_decode() {
        let fields = Fields::from_entry(&entry(&[("a", "1"), ("sl_headers", r#"{"t":"x"}"#)]));
        assert_eq!(fields, Fields::new([("a", "1")]));
        // Not headers: another client's field of that name, kept (nothing is lost).
        let foreign = Fields::from_entry(&entry(&[("a", "1"), ("sl_headers", "tenant=acme")]));
        assert_eq!(foreign.str("sl_headers"), Ok("tenant=acme"));
    }

    #[test]
    fn typed_getters_name_the_field_on_failure() {
        let fields = Fields::new([("n", "x1"), ("raw", "\u{0}")]);
        let error = fields.get::<u64>("n").unwrap_err();
        assert!(
            matches!(&error, FieldError::Invalid { name, value, .. } if name == "n" && value == "x1"),
            "{error:?}"
        );
        let bad_utf8 = Fields::from_entry(&[(b"b".to_vec(), vec![0xff, 0xfe])]);
        assert_eq!(bad_utf8.str("b"), Err(FieldError::NotUtf8("b".into())));
        assert_eq!(bad_utf8.bytes("b"), Some(&[0xff, 0xfe][..]));
    }

    #[test]
    fn deserializes_a_struct_from_text_values() {
        let fields = Fields::new([
            ("order_id", "o-7"),
            ("amount_cents", "995"),
            ("express", "true"),
            ("extra", "ignored"),
        ]);
        assert_eq!(
            fields.deserialize::<Order>(),
            Ok(Order {
                order_id: "o-7".into(),
                amount_cents: 995,
                express: true,
                note: None,
            })
        );
        let wrong = Fields::new([
            ("order_id", "o-7"),
            ("amount_cents", "lots"),
            ("express", "true"),
        ]);
        let error = wrong.deserialize::<Order>().unwrap_err().to_string();
        assert!(
            error.contains("\"lots\" is not an unsigned integer"),
            "{error}"
        );
        let missing = Fields::new([("order_id", "o-7")]);
        let error = missing.deserialize::<Order>().unwrap_err().to_string();
        assert!(error.contains("missing field `amount_cents`"), "{error}");
    }
}
