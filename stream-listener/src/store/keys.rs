//! The Redis keys of one group: every name the store's scripts touch, built once from `names.rs` so the
//! library, the Lua scripts (through `KEYS`) and the CLI agree (see ARCHITECTURE.md, "Keys").

/// The Redis keys of one group.
///
/// | key | type | what it is |
/// | --- | --- | --- |
/// | `sl:{<stream>/<group>}:meta` | string | the metadata header (JSON, schema version 2: everything but the members, their count) |
/// | `sl:{<stream>/<group>}:members` | hash | memberId -> that member's record (JSON, without its lease) |
/// | `sl:{<stream>/<group>}:rev` | string | the store revision, incremented by every commit |
/// | `sl:{<stream>/<group>}:leases` | sorted set | memberId scored by lease deadline (Redis ms) |
/// | `sl:{<stream>/<group>}:audit` | stream | audit events, capped at about 10,000 |
/// | `sl:{<stream>/<group>}:projection` | string | schema version 1's stored projection; deleted by the next commit |
/// | `sl:{<stream>/<group>}:writer` | string | the writer lock (writer's token, expires after 1 s unless extended) |
/// | `sl:{<stream>/<group>}:turn` | list | wakes one waiting writer when the lock is released |
/// | `sl:{<stream>/<group>}:inbox` | list | heartbeats queued for the writer (see `store/inbox.rs`) |
/// | `sl:{<stream>/<group>}:reply:<id>` | list | the answer to one queued heartbeat (short-lived) |
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupKeys {
    /// Metadata header.
    pub meta: String,
    /// Member records.
    pub members: String,
    /// Store revision.
    pub rev: String,
    /// Leases.
    pub leases: String,
    /// Audit stream.
    pub audit: String,
    /// The monitoring projection schema version 1 stored (deleted by the next commit).
    pub projection: String,
    /// Writer lock.
    pub writer: String,
    /// Writer wake-ups.
    pub turn: String,
    /// Heartbeats queued for the writer.
    pub inbox: String,
    /// The wake-up channel (pub/sub, not a key; see [`super::wakeup`]).
    pub wake: String,
}

impl GroupKeys {
    /// The keys of `group` reading `stream` (see [`crate::names::group_key`]).
    pub fn new(stream: &str, group: &str) -> Self {
        use crate::names::{group as suffix, group_key};
        let key = |suffix: &str| group_key(stream, group, suffix);
        Self {
            meta: key(suffix::META),
            members: key(suffix::MEMBERS),
            rev: key(suffix::REVISION),
            leases: key(suffix::LEASES),
            audit: key(suffix::AUDIT),
            projection: key(suffix::PROJECTION),
            writer: key(suffix::WRITER),
            turn: key(suffix::TURN),
            inbox: key(suffix::INBOX),
            wake: key(suffix::WAKE),
        }
    }

    /// Where the answer to the queued heartbeat `id` is pushed ([`crate::names::group_reply`]).
    pub fn reply(&self, id: &str) -> String {
        // Every key of the group is `<base>:<suffix>`; `meta`'s base is the group's.
        let meta_suffix = format!(":{}", crate::names::group::META);
        let base = self.meta.strip_suffix(&meta_suffix).unwrap_or(&self.meta);
        format!("{base}:{}:{id}", crate::names::group::REPLY)
    }
}

/// How long the writer lock lives if its writer never releases it (crashed or paused). The writer extends
/// it before every batch.
pub(super) const WRITER_LOCK_MS: u64 = 1000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_ttl_in_the_key_table_is_the_one_the_store_uses() {
        assert_eq!(super::WRITER_LOCK_MS, 1000, "update the table above");
    }

    #[test]
    fn a_reply_key_is_the_group_key_of_the_reply_id() {
        let keys = GroupKeys::new("orders", "billing");
        assert_eq!(
            keys.reply("ab12"),
            crate::names::group_reply("orders", "billing", "ab12")
        );
    }
}
