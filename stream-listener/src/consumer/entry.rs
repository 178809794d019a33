//! One stream entry as a shard read returned it, with every field kept (a dead letter copies them all).

use crate::names::field::{KEY as KEY_FIELD, VERSION as VERSION_FIELD};

/// One stream entry as read, with all its fields kept for dead-lettering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) id: String,
    pub(crate) fields: Vec<(Vec<u8>, Vec<u8>)>,
    pub(crate) delivery_count: u32,
    /// XAUTOCLAIM on Redis 6.2 reports entries deleted from the stream with nil fields.
    pub(crate) deleted: bool,
    /// Local retries so far (a failed entry deferred for its backoff carries them to its next attempt).
    pub(crate) retries: u32,
}

impl Entry {
    fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(n, _)| n.as_slice() == name.as_bytes())
            .map(|(_, v)| v.as_slice())
    }

    /// The partition key's bytes, if the entry has one.
    pub(crate) fn raw_key(&self) -> Option<&[u8]> {
        self.field(KEY_FIELD)
    }

    /// The topology version the producer routed the entry with, if it wrote one.
    pub(crate) fn topology_version(&self) -> Option<u64> {
        std::str::from_utf8(self.field(VERSION_FIELD)?)
            .ok()?
            .parse()
            .ok()
    }

    /// The entry's headers (none without an `sl_headers` field), or why its field does not decode.
    pub(crate) fn headers(&self) -> Result<crate::Headers, String> {
        crate::Headers::of_entry(&self.fields).map_err(|e| e.to_string())
    }

    /// The millisecond part of the entry id (`<ms>-<seq>`). Read digit by digit: the resize's order gate
    /// reads it for every entry, and splitting and parsing the string was half of the gate's own work.
    pub(crate) fn id_ms(&self) -> Option<u64> {
        let mut ms: u64 = 0;
        for (at, byte) in self.id.bytes().enumerate() {
            match byte {
                b'0'..=b'9' => ms = ms.checked_mul(10)?.checked_add(u64::from(byte - b'0'))?,
                b'-' if at > 0 => return Some(ms),
                _ => return None,
            }
        }
        None
    }

    /// The partition key; empty when the producer wrote none.
    pub(crate) fn key(&self) -> &str {
        self.field(KEY_FIELD)
            .and_then(|k| std::str::from_utf8(k).ok())
            .unwrap_or("")
    }

    /// The payload bytes, if the entry has them.
    #[cfg(test)]
    pub(crate) fn payload(&self) -> Option<&[u8]> {
        self.field(crate::names::field::PAYLOAD)
    }
}

#[cfg(test)]
mod tests {
    use super::Entry;

    fn id_ms(id: &str) -> Option<u64> {
        Entry {
            id: id.to_owned(),
            fields: Vec::new(),
            delivery_count: 1,
            deleted: false,
            retries: 0,
        }
        .id_ms()
    }

    #[test]
    fn the_id_time_is_the_number_before_the_dash_and_nothing_else_is_one() {
        assert_eq!(id_ms("1700000000000-3"), Some(1_700_000_000_000));
        assert_eq!(id_ms("0-1"), Some(0));
        assert_eq!(id_ms("18446744073709551615-0"), Some(u64::MAX));
        for not_an_id in [
            "",
            "-",
            "-1",
            "17",
            "x-1",
            "1x-1",
            "+5-0",
            "18446744073709551616-0",
        ] {
            assert_eq!(id_ms(not_an_id), None, "{not_an_id:?}");
        }
    }
}
