//! The one decoder of the Redis stream replies the library and the CLI read: `XREADGROUP` / `XREAD`,
//! `XCLAIM` / `XAUTOCLAIM`, extended `XPENDING` and `XINFO GROUPS`, each in its RESP2 shape (arrays,
//! flat `[field, value, ...]` pairs) and its RESP3 shape (maps), into neutral rows.
//!
//! Replies come from a server we do not control (another version, a proxy, a bug): nothing here panics,
//! whatever the shape. A malformed part of a reply is skipped; a reply that is not a list at all is an
//! error where the callers treat it as one (`XINFO GROUPS`).
//!
//! A leaf: it knows `redis` and std only. Public for the admin CLI (see the crate's stability section);
//! the consumer's decoders are crate-private.

use std::collections::HashMap;

use redis::{ParsingError, RedisError, Value};

/// The text of a scalar; `None` for nil, aggregates and bytes that are not UTF-8.
fn text(value: &Value) -> Option<&str> {
    match value {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok(),
        Value::SimpleString(s) => Some(s),
        Value::VerbatimString { text, .. } => Some(text),
        _ => None,
    }
}

/// The owned text of a scalar (the rule of `text`).
fn owned_text(value: Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes).ok(),
        Value::SimpleString(s) => Some(s),
        Value::VerbatimString { text, .. } => Some(text),
        _ => None,
    }
}

/// A count: an integer, or a scalar whose text is one; `None` for nil, negatives and anything else.
fn count(value: &Value) -> Option<u64> {
    match value {
        Value::Int(n) => u64::try_from(*n).ok(),
        Value::Double(d) => d.to_string().parse().ok(),
        other => text(other)?.parse().ok(),
    }
}

/// A field's bytes: bulk and simple strings, integers as their digits; empty for anything else.
fn bytes_of(value: Value) -> Vec<u8> {
    match value {
        Value::BulkString(bytes) => bytes,
        Value::SimpleString(s) => s.into_bytes(),
        Value::Int(i) => i.to_string().into_bytes(),
        _ => Vec::new(),
    }
}

/// The `(field, value)` pairs of a record: a RESP3 map, or a RESP2 flat array (a trailing odd element is
/// dropped). `None` for anything else.
fn pairs(record: &Value) -> Option<Vec<(&Value, &Value)>> {
    match record {
        Value::Map(map) => Some(map.iter().map(|(k, v)| (k, v)).collect()),
        Value::Array(flat) => Some(
            flat.chunks_exact(2)
                .map(|pair| (&pair[0], &pair[1]))
                .collect(),
        ),
        _ => None,
    }
}

/// The elements of a list reply (an array or a set; nil is an empty list, as redis-rs reads it).
fn elements(reply: &Value) -> Option<&[Value]> {
    match reply {
        Value::Array(items) | Value::Set(items) => Some(items),
        Value::Nil => Some(&[]),
        _ => None,
    }
}

/// One consumer group of a stream, from `XINFO GROUPS`. A field Redis did not report, reported as nil,
/// or reported as something that is not a count / an id, is `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupInfo {
    /// The group's name.
    pub name: String,
    /// `consumers`: consumers the group knows.
    pub consumers: Option<u64>,
    /// `pending`: entries delivered and not acknowledged.
    pub pending: Option<u64>,
    /// `last-delivered-id`: the last id delivered to the group.
    pub last_delivered_id: Option<String>,
    /// `entries-read` (Redis >= 7; nil until Redis can tell).
    pub entries_read: Option<u64>,
    /// `lag`: entries not delivered yet (Redis >= 7; nil when Redis cannot tell, for example after
    /// entries were deleted or trimmed past the group's position).
    pub lag: Option<u64>,
}

impl GroupInfo {
    /// One group's record; `None` when it is not a record or has no UTF-8 `name`. The first occurrence of
    /// a field counts.
    fn from_record(record: &Value) -> Option<Self> {
        let pairs = pairs(record)?;
        let field = |name: &str| {
            pairs
                .iter()
                .find_map(|(k, v)| (text(k) == Some(name)).then_some(*v))
        };
        Some(Self {
            name: text(field("name")?)?.to_owned(),
            consumers: field("consumers").and_then(count),
            pending: field("pending").and_then(count),
            last_delivered_id: field("last-delivered-id").and_then(text).map(str::to_owned),
            entries_read: field("entries-read").and_then(count),
            lag: field("lag").and_then(count),
        })
    }
}

/// An `XINFO GROUPS` reply: one [`GroupInfo`] per group, in the server's order (a list of flat
/// `[field, value, ...]` arrays in RESP2, of maps in RESP3). A group that is not a record or has no name
/// is skipped; nil is no group. An error when the reply is not a list.
pub fn xinfo_groups(reply: &Value) -> Result<Vec<GroupInfo>, RedisError> {
    let groups = elements(reply).ok_or_else(|| {
        RedisError::from(ParsingError::from(format!(
            "XINFO GROUPS: not a list of groups: {reply:?}"
        )))
    })?;
    Ok(groups.iter().filter_map(GroupInfo::from_record).collect())
}

/// One entry of a stream reply. `fields` is `None` for an entry deleted from the stream (`XCLAIM` and
/// Redis 6.2's `XAUTOCLAIM` report it with nil fields).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StreamEntry {
    pub(crate) id: String,
    pub(crate) fields: Option<Vec<(Vec<u8>, Vec<u8>)>>,
}

/// A list of `[id, [f, v, ...]]` (fields as a flat array, or a map under RESP3); items of another shape,
/// or without a text id, are skipped.
pub(crate) fn entries(value: Value) -> Vec<StreamEntry> {
    let Value::Array(items) = value else {
        return Vec::new();
    };
    let mut entries = Vec::with_capacity(items.len());
    for item in items {
        let Value::Array(pair) = item else {
            continue;
        };
        let Ok([id, raw_fields]) = <[Value; 2]>::try_from(pair) else {
            continue;
        };
        let Some(id) = owned_text(id) else {
            continue;
        };
        let fields = match raw_fields {
            Value::Array(flat) => {
                let mut fields = Vec::with_capacity(flat.len() / 2);
                let mut iter = flat.into_iter();
                while let (Some(name), Some(value)) = (iter.next(), iter.next()) {
                    fields.push((bytes_of(name), bytes_of(value)));
                }
                Some(fields)
            }
            Value::Map(pairs) => Some(
                pairs
                    .into_iter()
                    .map(|(n, v)| (bytes_of(n), bytes_of(v)))
                    .collect(),
            ),
            _ => None,
        };
        entries.push(StreamEntry { id, fields });
    }
    entries
}

/// An `XREADGROUP` / `XREAD` reply over several streams, by stream key: `[[key, entries], ...]` in RESP2,
/// a map from key to entries in RESP3. Nil (nothing read) is empty; malformed parts are skipped.
pub(crate) fn read_by_stream(reply: Value) -> Vec<(String, Vec<StreamEntry>)> {
    let streams: Vec<(Value, Value)> = match reply {
        Value::Array(streams) => streams
            .into_iter()
            .filter_map(|stream| match stream {
                Value::Array(pair) => <[Value; 2]>::try_from(pair).ok().map(|[k, v]| (k, v)),
                _ => None,
            })
            .collect(),
        Value::Map(streams) => streams,
        _ => Vec::new(),
    };
    streams
        .into_iter()
        .filter_map(|(key, value)| Some((owned_text(key)?, entries(value))))
        .collect()
}

/// An `XREADGROUP` reply's entries, over all its streams (one, for a shard read).
pub(crate) fn read(reply: Value) -> Vec<StreamEntry> {
    read_by_stream(reply)
        .into_iter()
        .flat_map(|(_, entries)| entries)
        .collect()
}

/// An `XAUTOCLAIM` reply `[cursor, entries, (deleted ids)]`: the next cursor (`None` when missing or not
/// text) and the claimed entries. Anything but an array is no cursor and no entries.
pub(crate) fn autoclaim(reply: Value) -> (Option<String>, Vec<StreamEntry>) {
    let Value::Array(mut parts) = reply else {
        return (None, Vec::new());
    };
    parts.truncate(2);
    let entries = parts.pop().map(entries).unwrap_or_default();
    let cursor = parts.pop().and_then(owned_text);
    (cursor, entries)
}

/// One row of an extended `XPENDING` reply `[id, consumer, idle, deliveries]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PendingRow {
    pub(crate) id: String,
    pub(crate) consumer: String,
    /// Times the entry was delivered.
    pub(crate) deliveries: u32,
}

/// An extended `XPENDING` reply; rows of another shape, or whose delivery count is not an integer that
/// fits a `u32`, are skipped.
pub(crate) fn pending(value: Value) -> Vec<PendingRow> {
    let Value::Array(rows) = value else {
        return Vec::new();
    };
    rows.into_iter()
        .filter_map(|row| {
            let Value::Array(row) = row else {
                return None;
            };
            let [id, consumer, _idle, deliveries] = <[Value; 4]>::try_from(row).ok()?;
            let deliveries = match deliveries {
                Value::Int(n) => u32::try_from(n).ok()?,
                _ => return None,
            };
            Some(PendingRow {
                id: owned_text(id)?,
                consumer: owned_text(consumer)?,
                deliveries,
            })
        })
        .collect()
}

/// An extended `XPENDING` reply's delivery counts by id (the rows of `pending`).
pub(crate) fn pending_counts(value: Value) -> HashMap<String, u32> {
    pending(value)
        .into_iter()
        .map(|row| (row.id, row.deliveries))
        .collect()
}

#[cfg(test)]
mod tests;
