//! Every Redis name the library, its Lua scripts and the CLI agree on: key builders, entry field names,
//! the internal consumer group, and the stream cursor. Nothing else spells them out.
//!
//! Key layout (`ARCHITECTURE.md` has the full table):
//!
//! * `{stream}:{i}`: shard `i` ([`shard_stream`]); `{stream}:dlq`: the default dead letters
//!   ([`dead_letter_stream`]).
//! * `sl:topology:{<stream>}` and its `:audit`, `:stale`, `:trimmed`: the stream's topology ([`topology`],
//!   [`topology_audit`], [`topology_stale`], [`topology_trimmed`]).
//! * `sl:{<stream>/<group>}:<suffix>`: a group's metadata ([`group_key`], [`group`] for the suffixes;
//!   [`crate::store::GroupKeys`] builds them all).
//!
//! Lua scripts get keys through `KEYS`; the one name a script spells itself, [`BOOTSTRAP_GROUP`], is checked
//! against the scripts' text by a unit test.

/// The namespace of every key the library owns (the shard and dead-letter streams excepted): `sl:`.
pub const NAMESPACE: &str = "sl:";

/// `SCAN` pattern matching every key in [`NAMESPACE`].
pub const NAMESPACE_PATTERN: &str = "sl:*";

/// The Redis key of shard `index` of the stream `stream`: `{stream}:{index}`, e.g. `orders:3`. No hash tag,
/// so the shards of a stream spread over cluster slots.
pub fn shard_stream(stream: &str, index: u32) -> String {
    format!("{stream}:{index}")
}

/// The default dead-letter stream of `stream`: `{stream}:dlq`.
pub fn dead_letter_stream(stream: &str) -> String {
    format!("{stream}:dlq")
}

const TOPOLOGY_PREFIX: &str = "sl:topology:{";

/// The key of the topology record of `stream`: `sl:topology:{<stream>}`.
pub fn topology(stream: &str) -> String {
    format!("{TOPOLOGY_PREFIX}{stream}}}")
}

/// The key of the stream's resize audit: `sl:topology:{<stream>}:audit`.
pub fn topology_audit(stream: &str) -> String {
    format!("{}:audit", topology(stream))
}

/// The key of the stream's stale-layout write counters: `sl:topology:{<stream>}:stale`.
pub fn topology_stale(stream: &str) -> String {
    format!("{}:stale", topology(stream))
}

/// The key of the counts of entries each group lost to trimming before it read them:
/// `sl:topology:{<stream>}:trimmed` (group -> entries; see [`crate::consumer::trimmed_unread`]).
pub fn topology_trimmed(stream: &str) -> String {
    format!("{}:trimmed", topology(stream))
}

/// The hash tag that puts a key in the cluster slot of `key`: `key`'s own tag when it has one, else the whole
/// key. (A key that contains `}` but has no tag of its own shares its slot with no other key: see
/// [`has_slot_tag`].)
fn slot_tag(key: &str) -> &str {
    crate::connection::hash_tag(key.as_bytes())
        // Cut at ASCII braces, so still UTF-8.
        .and_then(|tag| std::str::from_utf8(tag).ok())
        .unwrap_or(key)
}

/// Whether keys can be put in the cluster slot of `key` (it has a hash tag, or contains no `}`). The shard
/// streams of a cluster must: their fences share their slot.
pub fn has_slot_tag(key: &str) -> bool {
    crate::connection::hash_tag(key.as_bytes()).is_some() || !key.contains('}')
}

/// The owner record of `group` on shard stream `shard_key`: `sl:owner:{<shard>}:<group>`, a string holding
/// the newest owner's fencing token (in the shard's cluster slot). See [`shard_fence`].
pub fn shard_owner(shard_key: &str, group: &str) -> String {
    format!("sl:owner:{{{}}}:{group}", slot_tag(shard_key))
}

/// The fence of one ownership of shard stream `shard_key` by `group` at fencing token `token`:
/// `sl:fence:{<shard>}:<token>:<group>`, an empty stream with a consumer group named `group`. Every group read
/// of the ownership names it, so Redis refuses the read (`NOGROUP`) once the next owner deleted it; claims
/// check it in a script. The token comes before the group, so no two (token, group) pairs share a key.
pub fn shard_fence(shard_key: &str, group: &str, token: i64) -> String {
    format!("sl:fence:{{{}}}:{token}:{group}", slot_tag(shard_key))
}

/// Suffixes of a group's keys (see [`group_key`]).
pub mod group {
    /// Group metadata header (JSON: everything but the members, which it counts).
    pub const META: &str = "meta";
    /// Member records (hash: memberId -> JSON).
    pub const MEMBERS: &str = "members";
    /// Store revision.
    pub const REVISION: &str = "rev";
    /// Member leases (sorted set).
    pub const LEASES: &str = "leases";
    /// Audit stream.
    pub const AUDIT: &str = "audit";
    /// Monitoring projection (JSON), written by schema version 1 only; the first later commit deletes it.
    pub const PROJECTION: &str = "projection";
    /// The writer lock.
    pub const WRITER: &str = "writer";
    /// Wake-ups for the next waiting writer.
    pub const TURN: &str = "turn";
    /// Heartbeats queued for the writer.
    pub const INBOX: &str = "inbox";
    /// Prefix of the answer to one queued heartbeat: `reply:<replyId>`.
    pub const REPLY: &str = "reply";
    /// The pub/sub channel (not a key) that wakes members whose shards a commit moved.
    pub const WAKE: &str = "wake";
}

/// The key `sl:{<stream>/<group>}:<suffix>` of a group (`suffix` from [`group`]). The hash tag keeps every key
/// of one group in one cluster slot.
pub fn group_key(stream: &str, group: &str, suffix: &str) -> String {
    format!("sl:{{{stream}/{group}}}:{suffix}")
}

/// The key of the answer to the queued heartbeat `reply_id`: `sl:{<stream>/<group>}:reply:<replyId>`.
pub fn group_reply(stream: &str, group: &str, reply_id: &str) -> String {
    group_key(stream, group, &format!("{}:{reply_id}", group::REPLY))
}

/// What a key of [`NAMESPACE`] names, as [`parse`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// `sl:topology:{<stream>}`.
    Topology {
        /// The stream.
        stream: String,
    },
    /// `sl:{<stream>/<group>}:meta`.
    GroupMeta {
        /// The stream.
        stream: String,
        /// The group.
        group: String,
    },
}

/// Reads a topology record key or a group metadata key; any other key (audit, leases, malformed) is `None`.
pub fn parse(key: &str) -> Option<Parsed> {
    if let Some(rest) = key.strip_prefix(TOPOLOGY_PREFIX) {
        let stream = rest.strip_suffix('}')?;
        return (!stream.is_empty()).then(|| Parsed::Topology {
            stream: stream.to_owned(),
        });
    }
    let inner = key
        .strip_prefix("sl:{")?
        .strip_suffix(group::META)?
        .strip_suffix("}:")?;
    let (stream, group) = inner.split_once('/')?;
    (!stream.is_empty() && !group.is_empty() && !group.contains('/')).then(|| Parsed::GroupMeta {
        stream: stream.to_owned(),
        group: group.to_owned(),
    })
}

/// Entry field names.
pub mod field {
    /// The partition key (written by the producer).
    pub const KEY: &str = "k";
    /// The payload bytes (written by the producer).
    pub const PAYLOAD: &str = "p";
    /// The topology version the producer routed the entry with (absent in entries of older producers).
    pub const VERSION: &str = "v";
    /// The message's headers, a JSON object of strings (absent when it has none; see
    /// [`crate::headers`]).
    pub const HEADERS: &str = "sl_headers";
    /// On a replayed dead letter: the one group that handles it; consumers of other groups acknowledge it
    /// unhandled.
    pub const ONLY_GROUP: &str = "sl_only_group";
    /// On a replayed dead letter: the dead letter's entry id.
    pub const REPLAY_OF: &str = "sl_replay_of";
}

/// Field names the consumer adds to a dead-letter entry, after the original fields, so operators and the
/// CLI can tell why and where from.
pub mod dead_letter_field {
    /// The handler's error text (or why the payload could not be decoded).
    pub const ERROR: &str = "dlq_error";
    /// `true` when it was given up before its deliveries ran out (the handler's error was permanent, or
    /// the payload does not decode), else `false`.
    pub const PERMANENT: &str = "dlq_permanent";
    /// Deliveries before the entry was given up.
    pub const DELIVERY_COUNT: &str = "dlq_delivery_count";
    /// The consumer group that gave up.
    pub const GROUP: &str = "dlq_group";
    /// The shard index the entry came from.
    pub const SHARD: &str = "dlq_shard";
    /// The stream key the entry came from.
    pub const SOURCE_STREAM: &str = "dlq_source_stream";
    /// The entry id in the source stream.
    pub const SOURCE_ID: &str = "dlq_source_id";
    /// The consumer (member) that gave up.
    pub const CONSUMER: &str = "dlq_consumer";
}

/// Prefix of the library's own consumer groups on shard streams; tools hide them.
pub const INTERNAL_GROUP_PREFIX: &str = "__sl_";

/// Temporary consumer group used to create an empty shard stream (`XGROUP CREATE … MKSTREAM`, then
/// destroyed). `consumed.lua` and `retire_shard.lua` skip it by this name.
pub const BOOTSTRAP_GROUP: &str = "__sl_bootstrap";

/// Whether `group` is one of the library's own consumer groups (see [`INTERNAL_GROUP_PREFIX`]).
pub fn is_internal_group(group: &str) -> bool {
    group.starts_with(INTERNAL_GROUP_PREFIX)
}

/// The smallest entry id: where a pending-entries scan (`XREADGROUP … 0-0`, `XAUTOCLAIM … 0-0`) starts, and
/// the cursor `XAUTOCLAIM` returns once it has gone through the whole list.
pub const START_ID: &str = "0-0";

/// `XGROUP CREATE` position of a group that reads the stream from its first entry.
pub const FIRST_ENTRY: &str = "0";

/// `XGROUP CREATE` position of a group that reads only entries added after it.
pub const NEW_ENTRIES: &str = "$";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_layout() {
        assert_eq!(shard_stream("orders", 3), "orders:3");
        assert_eq!(dead_letter_stream("orders"), "orders:dlq");
        assert_eq!(topology("orders"), "sl:topology:{orders}");
        assert_eq!(topology_audit("orders"), "sl:topology:{orders}:audit");
        assert_eq!(topology_stale("orders"), "sl:topology:{orders}:stale");
        assert_eq!(topology_trimmed("orders"), "sl:topology:{orders}:trimmed");
        assert_eq!(
            group_key("orders", "billing", group::META),
            "sl:{orders/billing}:meta"
        );
        assert_eq!(
            group_reply("orders", "billing", "r1"),
            "sl:{orders/billing}:reply:r1"
        );
        for key in [topology("o"), group_key("o", "g", group::LEASES)] {
            assert!(key.starts_with(NAMESPACE), "{key}");
        }
        assert_eq!(NAMESPACE_PATTERN, format!("{NAMESPACE}*"));
    }

    #[test]
    fn fences_live_in_their_shards_slot() {
        assert_eq!(
            shard_owner("orders:3", "billing"),
            "sl:owner:{orders:3}:billing"
        );
        assert_eq!(
            shard_fence("orders:3", "billing", 17),
            "sl:fence:{orders:3}:17:billing"
        );
        // A group name that looks like a token cannot make one fence look like another's.
        assert_ne!(shard_fence("o:1", "5:g", 4), shard_fence("o:1", "g", 45));
        let slot = crate::connection::slot_of;
        for shard in ["orders:3", "{orders}:3", "a{b}c:1", "a{b:1", "plain"] {
            assert!(has_slot_tag(shard));
            for key in [shard_owner(shard, "g:1"), shard_fence(shard, "{g}", 9)] {
                assert_eq!(
                    slot(key.as_bytes()),
                    slot(shard.as_bytes()),
                    "{key} vs {shard}"
                );
            }
        }
        for shard in ["x{}y:2", "{}:1", "a}b:1"] {
            assert!(!has_slot_tag(shard), "{shard}");
        }
    }

    #[test]
    fn parse_reads_topology_and_meta_keys_only() {
        let topology_of = |s: &str| Some(Parsed::Topology { stream: s.into() });
        assert_eq!(parse(&topology("orders")), topology_of("orders"));
        assert_eq!(
            parse(&group_key("orders", "billing", group::META)),
            Some(Parsed::GroupMeta {
                stream: "orders".into(),
                group: "billing".into()
            })
        );
        for other in [
            group_key("orders", "billing", group::REVISION),
            group_key("orders", "billing", group::AUDIT),
            topology_audit("orders"),
            "sl:topology:{}".into(),
            "sl:{orders}:meta".into(),
            "sl:{orders/a/b}:meta".into(),
            "orders:0".into(),
        ] {
            assert_eq!(parse(&other), None, "{other}");
        }
    }

    #[test]
    fn the_store_names_group_keys_here() {
        let keys = crate::store::GroupKeys::new("orders", "billing");
        assert_eq!(keys.meta, group_key("orders", "billing", group::META));
        assert_eq!(keys.inbox, group_key("orders", "billing", group::INBOX));
        assert_eq!(keys.reply("r1"), group_reply("orders", "billing", "r1"));
    }

    #[test]
    fn internal_groups() {
        assert!(is_internal_group(BOOTSTRAP_GROUP));
        assert!(!is_internal_group("billing"));
    }

    /// The topology scripts skip the bootstrap group by name: they must spell it as [`BOOTSTRAP_GROUP`].
    #[test]
    fn lua_spells_the_bootstrap_group_as_the_constant() {
        let literal = format!("'{BOOTSTRAP_GROUP}'");
        for (name, text) in [
            ("consumed.lua", include_str!("topology/consumed.lua")),
            (
                "retire_shard.lua",
                include_str!("topology/retire_shard.lua"),
            ),
        ] {
            assert!(text.contains(&literal), "{name} does not skip {literal}");
            assert_eq!(
                text.matches("__sl_").count(),
                text.matches(&literal).count(),
                "{name} names another internal group"
            );
        }
    }
}
