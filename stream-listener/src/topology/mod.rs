//! The topology of a sharded stream: how many shards it has, stored once in Redis for everyone.
//!
//! The shard count belongs to the **stream**, not to a consumer group: every group and every producer of
//! `orders` must route keys with the same count, or messages of one key would land in different shards. So
//! the count lives in one small Redis hash per stream, the *topology record*:
//!
//! | key | type | fields |
//! | --- | --- | --- |
//! | `sl:topology:{<prefix>}` | hash | `shardCount` (decimal u32 > 0), `version` (decimal u64, starts at 1, +1 on every resize); after a resize also `previousShardCount`, `resizedAtMs`, `graceMs`, `lastResize` (`resize` or `rollback`: the [`Migration`]); while a shrink's removed shards drain, `drainingShardCount` |
//! | `sl:topology:{<prefix>}:audit` | stream | `RESIZED`, `ROLLED_BACK`, `SHARDS_RETIRED` events (capped ~1,000) |
//! | `sl:topology:{<prefix>}:stale` | hash | group -> late stale-layout writes its consumers saw |
//!
//! The braces are a Redis Cluster hash tag on the prefix, so the record shares a slot with the rest of the
//! stream's metadata keys (the shard streams themselves, `<prefix>:<i>`, deliberately spread across slots).
//!
//! [`Topology::ensure`] creates the record and the (empty) shard streams, [`Topology::ensure_group`] creates
//! a consumer group on every shard, [`Topology::load`] reads the record, [`Topology::resize`] changes the
//! count and [`Topology::rollback`] changes it back. The pure model is this module; the Redis side is one
//! file per concept: the record (`record.rs`), resizes (`resize.rs`), the consumed-before check
//! (`consumed.rs`), draining and retiring (`drain.rs`), the resize audit (`audit.rs`) and stale-layout
//! writes (`stale.rs`), each with its scripts; `stray.rs` finds entries written to the logical name itself.
//!
//! # Migrations (per-key order across a resize)
//!
//! A resize moves keys: `k` lived in shard `a = shard_for_key(k, N)` and now goes to
//! `b = shard_for_key(k, M)`. [`Topology::resize_with_grace`] records the change as a [`Migration`]: the
//! previous count, the Redis time of the resize and a grace period (how long producers that have not
//! refreshed their topology may keep writing the old layout). Stream entry ids are millisecond timestamps,
//! so every entry written under the old layout has an id below the *cut*, `{resizedAtMs + graceMs}-0`.
//! Consumers use [`Topology::placement`] to recognise an entry of a moved key, and hold it until the group
//! has consumed its old shard below [`Placement::Moved::before_ms`] ([`consumed_before`]).
//!
//! # Shrinks: draining, then retiring
//!
//! A shrink `N -> M` does not drop shards `M..N` at once: they are *draining*. The record keeps
//! `drainingShardCount = N`, every group keeps reading all `N` shards ([`Topology::read_shard_count`]),
//! and keys that moved out of a draining shard wait for its entries older than their own
//! ([`Placement::Moved`] with `before_ms` the entry's own time). Once Redis time passes the cut, a removed
//! shard is *frozen* (its last id set to the largest possible one, so any later `XADD` fails loudly; the
//! producer then re-reads the topology and re-routes), and once every group consumed it to the end it is
//! trimmed empty. When all removed shards are retired so the record drops `drainingShardCount`, and groups
//! follow to `M` ([`Topology::retire_drained`], run by every process's topology follower and by the next
//! resize). The frozen, empty streams stay until a later grow reuses their indexes.
//!
//! # Stale-layout writes
//!
//! An entry with an id at or past the last migration's cut, found in a shard that is not its key's shard,
//! was written by a producer that did not refresh within the grace period ([`Topology::is_stale_write`]):
//! its key's order across the resize is not guaranteed. Consumers count such writes per group in
//! `sl:topology:{<prefix>}:stale` ([`Topology::stale_writes`]) and log a (rate-limited) warning. A late
//! old-layout write that happens to land in its key's shard under the new layout too is in order, and is
//! not counted. Producers also stamp each entry of a resized stream with the topology version they routed
//! it with (field `v`; at version 1 they leave it out, as nothing older exists), so a consumer whose cached
//! topology is older than an entry's re-reads it first.

use redis::{RedisError, Value};

use crate::routing::{self, PrefixError};

mod audit;
mod consumed;
mod drain;
mod record;
mod resize;
mod stale;
mod stray;

pub use audit::ResizeEvent;
pub use consumed::{consumed_before, ConsumedBefore};
pub use drain::DrainState;
pub(crate) use stale::count_stale_write_seen;
pub use stale::stale_writes_seen;
pub use stray::stray_warning;
pub(crate) use stray::worth_warning;

/// Field of the topology hash holding the shard count.
pub const SHARD_COUNT_FIELD: &str = "shardCount";
/// Field of the topology hash holding the record version.
pub const VERSION_FIELD: &str = "version";
/// Field of the topology hash holding the shard count before the last resize.
pub const PREVIOUS_SHARD_COUNT_FIELD: &str = "previousShardCount";
/// Field of the topology hash holding the Redis time (ms) of the last resize.
pub const RESIZED_AT_FIELD: &str = "resizedAtMs";
/// Field of the topology hash holding the grace period (ms) of the last resize.
pub const GRACE_FIELD: &str = "graceMs";
/// Field of the topology hash holding the shard count groups still read while a shrink's removed shards
/// drain (absent otherwise).
pub const DRAINING_FIELD: &str = "drainingShardCount";
/// Field of the topology hash saying whether the last resize was a `resize` or a `rollback`.
pub const LAST_RESIZE_FIELD: &str = "lastResize";
/// Entry field holding the topology version the producer routed the entry with.
pub const VERSION_ENTRY_FIELD: &str = crate::names::field::VERSION;

/// Default grace period of [`Topology::resize`]: the default producer refresh interval
/// ([`ProducerConfig::refresh_interval`](crate::producer::ProducerConfig::refresh_interval), 1 s) plus a
/// 1 s margin for in-flight writes and clock skew between Redis nodes.
pub const DEFAULT_RESIZE_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Errors reading or changing a stream's topology.
#[derive(thiserror::Error, stream_listener_macros::ReportDebug)]
#[non_exhaustive]
pub enum TopologyError {
    /// The stream prefix cannot name a sharded stream.
    #[error(transparent)]
    InvalidPrefix(#[from] PrefixError),
    /// A shard count of zero was requested.
    #[error("shard count must be greater than zero")]
    ZeroShards,
    /// The stream has no topology record.
    #[error(
        "stream `{prefix}` has no topology (no Redis key `{key}`): create it with Topology::ensure before \
         producing or consuming"
    )]
    Missing {
        /// The stream prefix.
        prefix: String,
        /// The missing Redis key.
        key: String,
    },
    /// [`Topology::ensure`] was asked for a different shard count than the stream already has.
    #[error(
        "stream `{prefix}` already has {existing} shards, not {requested}: the shard count belongs to the \
         stream; change it only with Topology::resize"
    )]
    ShardCountMismatch {
        /// The stream prefix.
        prefix: String,
        /// The shard count stored in Redis.
        existing: u32,
        /// The shard count asked for.
        requested: u32,
    },
    /// The topology record exists but cannot be parsed.
    #[error("corrupt topology record `{key}`: {reason}")]
    Corrupt {
        /// The Redis key of the record.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// [`Topology::rollback`] found no resize to roll back.
    #[error("stream `{prefix}` was never resized: nothing to roll back")]
    NothingToRollBack {
        /// The stream prefix.
        prefix: String,
    },
    /// Another resize changed the record while this one was checking it; nothing was changed.
    #[error(
        "stream `{prefix}` was resized concurrently (topology version {expected} -> {found}); nothing \
         changed, check the topology and retry"
    )]
    Concurrent {
        /// The stream prefix.
        prefix: String,
        /// The version this resize started from.
        expected: u64,
        /// The version found.
        found: u64,
    },
    /// The previous resize's migration is not finished: old-layout entries may still be written (its
    /// grace period has not passed), some group has not consumed them yet, or the shards a shrink removed
    /// are still draining. A second resize now would forget the first one's order barrier.
    #[error(
        "cannot resize stream `{prefix}` yet: the previous resize is still migrating ({reason}); retry \
         once every group has consumed the old shards up to the cut ({cut_ms} ms)"
    )]
    MigrationInProgress {
        /// The stream prefix.
        prefix: String,
        /// The cut of the previous migration (Redis ms).
        cut_ms: u64,
        /// What is still missing.
        reason: String,
    },
    /// A Redis command failed.
    #[error("redis error: {0}")]
    Redis(#[from] RedisError),
}

/// Where a newly created consumer group starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StartFrom {
    /// From the beginning of each shard stream (`XGROUP CREATE … 0`): the group sees the existing backlog.
    #[default]
    Earliest,
    /// From the end of each shard stream (`XGROUP CREATE … $`): only entries added after creation.
    Latest,
}

impl StartFrom {
    pub(crate) fn id(self) -> &'static str {
        match self {
            StartFrom::Earliest => crate::names::FIRST_ENTRY,
            StartFrom::Latest => crate::names::NEW_ENTRIES,
        }
    }
}

/// Whether the last resize was an ordinary one or a rollback of the one before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ResizeKind {
    /// [`Topology::resize`].
    #[default]
    Resize,
    /// [`Topology::rollback`]: back to the count before the previous resize.
    Rollback,
}

/// The last resize of a stream, as recorded in its topology record.
///
/// Entries written under the previous layout have ids below `{cut_ms}-0`: producers re-read the topology
/// within the grace period, and stream ids are Redis millisecond timestamps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    /// The shard count before the resize.
    pub previous_shard_count: u32,
    /// Redis time of the resize, in ms since the epoch.
    pub resized_at_ms: u64,
    /// How long producers may keep writing the previous layout after the resize, in ms.
    pub grace_ms: u64,
    /// A resize or a rollback.
    pub kind: ResizeKind,
}

impl Migration {
    /// The cut: every entry written under the previous layout has an id below `{cut_ms}-0`.
    pub fn cut_ms(&self) -> u64 {
        self.resized_at_ms.saturating_add(self.grace_ms)
    }
}

/// Where an entry found in a shard stands with respect to the topology and its last [`Migration`]
/// (see [`Topology::placement`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The key routes to this shard under the current count, and did not move here with the last resize
    /// (or there was none, or it moved from a shrink's shard that is retired, so drained to its end):
    /// handle it in stream order.
    Current,
    /// The key routed to this shard under the previous count and the entry is older than the cut: a
    /// backlog entry of the old layout, handle it in stream order.
    Previous,
    /// The key moved to this shard with the last resize, from shard `from`. Handle it only once the group
    /// has consumed (delivered and acknowledged) every entry of `from` with an id below `{before_ms}-0`:
    /// the key's older entries may still wait there.
    Moved {
        /// The key's shard under the previous count.
        from: u32,
        /// `min(entry ms, cut)` when `from` is kept; the entry's own ms when `from` is a shrink's draining
        /// shard (late writes may still be read there until it is retired).
        before_ms: u64,
    },
    /// Routed here by neither layout: the topology this was computed with may be stale (re-read it if the
    /// entry is newer than the read), or a producer misrouted it (or wrote it with a stale layout).
    Misrouted,
}

/// A stream's topology as read from (or written to) its record in Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    prefix: String,
    shard_count: u32,
    version: u64,
    migration: Option<Migration>,
    draining_shard_count: Option<u32>,
}

/// Fields of the record, in the order every script and `load` returns them.
const FIELDS: [&str; 7] = [
    SHARD_COUNT_FIELD,
    VERSION_FIELD,
    PREVIOUS_SHARD_COUNT_FIELD,
    RESIZED_AT_FIELD,
    GRACE_FIELD,
    DRAINING_FIELD,
    LAST_RESIZE_FIELD,
];

impl Topology {
    /// The Redis key of the topology record of `prefix`: `sl:topology:{<prefix>}`.
    pub fn record_key(prefix: &str) -> String {
        crate::names::topology(prefix)
    }

    /// The Redis key of the stream's resize audit: `sl:topology:{<prefix>}:audit`.
    pub fn audit_key(prefix: &str) -> String {
        crate::names::topology_audit(prefix)
    }

    /// The Redis key of the stale-layout write counters: `sl:topology:{<prefix>}:stale`.
    pub fn stale_key(prefix: &str) -> String {
        crate::names::topology_stale(prefix)
    }

    /// The stream prefix (e.g. `orders`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The number of shards producers write to.
    pub fn shard_count(&self) -> u32 {
        self.shard_count
    }

    /// The number of shards groups read: the previous count while a shrink's removed shards drain, else
    /// [`shard_count`](Self::shard_count).
    pub fn read_shard_count(&self) -> u32 {
        self.draining_shard_count.unwrap_or(self.shard_count)
    }

    /// The shards a shrink removed that are not retired yet (empty when none).
    pub fn draining_shards(&self) -> std::ops::Range<u32> {
        self.shard_count..self.read_shard_count()
    }

    /// The record version: 1 when created, incremented by every [`resize`](Self::resize).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The last resize, if the stream was ever resized.
    pub fn migration(&self) -> Option<Migration> {
        self.migration
    }

    /// The shard `key` routes to (see [`routing::shard_for_key`]).
    pub fn shard_for_key(&self, key: &[u8]) -> u32 {
        routing::shard_for_key(key, self.shard_count)
    }

    /// Where an entry with partition key `key`, found in shard `shard` with an id of `entry_ms`
    /// milliseconds, stands: the moved-key rule consumers apply to keep per-key order across a resize.
    ///
    /// * routes to `shard` now, and routed to another shard `a` before the last resize: [`Placement::Moved`]
    ///   from `a`, to wait until the group consumed `a` below `min(entry_ms, cut)`. Waiting below the entry's
    ///   own id (rather than always the cut) keeps the wait acyclic: when keys move between old shards in
    ///   both directions, the oldest deferred entry only waits for strictly older entries, which are never
    ///   deferred. If a shrink removed `a` and it is still draining, the bound is `entry_ms` itself: late
    ///   writes may land in `a` until it is frozen, and entries of a draining shard are never deferred, so
    ///   the wait stays acyclic. If `a` is retired (consumed to its end, no longer writable): [`Placement::Current`].
    /// * routes to `shard` now and did before (or no resize happened): [`Placement::Current`].
    /// * routed to `shard` under the previous count and is older than the cut: [`Placement::Previous`].
    /// * otherwise [`Placement::Misrouted`].
    pub fn placement(&self, key: &[u8], shard: u32, entry_ms: u64) -> Placement {
        let before = self.migration.map(|m| {
            (
                routing::shard_for_key(key, m.previous_shard_count),
                m.cut_ms(),
            )
        });
        if self.shard_for_key(key) == shard {
            match before {
                Some((from, cut)) if from != shard && from < self.shard_count => Placement::Moved {
                    from,
                    before_ms: entry_ms.min(cut),
                },
                Some((from, _)) if from != shard && from < self.read_shard_count() => {
                    Placement::Moved {
                        from,
                        before_ms: entry_ms,
                    }
                }
                _ => Placement::Current,
            }
        } else {
            match before {
                Some((from, cut)) if from == shard && entry_ms < cut => Placement::Previous,
                _ => Placement::Misrouted,
            }
        }
    }

    /// Whether an entry of `key` found in `shard` with an id of `entry_ms` ms, routed by its producer with
    /// topology `entry_version` (the entry's `v` field; `None` when it has none: written at version 1 or by
    /// another client), was written with a stale layout after the last migration's cut: its producer did
    /// not refresh within the grace period, so per-key order across the resize is not guaranteed for it.
    ///
    /// That is: at or past the cut, in a shard that is not its key's shard (its previous-layout shard, or
    /// an older layout's), and with a version older than this topology's when it has one. An entry in its
    /// key's own shard is in order whatever layout routed it.
    pub fn is_stale_write(
        &self,
        key: &[u8],
        shard: u32,
        entry_ms: u64,
        entry_version: Option<u64>,
    ) -> bool {
        let Some(m) = self.migration else {
            return false;
        };
        if entry_ms < m.cut_ms() {
            return false;
        }
        self.shard_for_key(key) != shard && entry_version.is_none_or(|v| v < self.version)
    }

    /// The Redis key of shard `index`: `<prefix>:<index>`.
    pub fn stream_key(&self, index: u32) -> String {
        routing::shard_stream_key(&self.prefix, index)
    }

    /// The Redis keys of the shard streams producers write, in shard order.
    pub fn stream_keys(&self) -> Vec<String> {
        (0..self.shard_count).map(|i| self.stream_key(i)).collect()
    }

    /// Refuses a prefix that cannot name a sharded stream and a count of zero shards.
    pub(crate) fn validate_request(prefix: &str, shard_count: u32) -> Result<(), TopologyError> {
        routing::validate_prefix(prefix)?;
        if shard_count == 0 {
            return Err(TopologyError::ZeroShards);
        }
        Ok(())
    }

    /// The record a script wrote and returned; [`TopologyError::Missing`] if it found none.
    pub(crate) fn from_written(
        prefix: &str,
        key: String,
        reply: Value,
    ) -> Result<Topology, TopologyError> {
        Self::from_reply(prefix, &key, reply)?.ok_or_else(|| TopologyError::Missing {
            prefix: prefix.to_string(),
            key,
        })
    }

    pub(crate) fn from_reply(
        prefix: &str,
        key: &str,
        reply: Value,
    ) -> Result<Option<Topology>, TopologyError> {
        match reply {
            Value::Nil => Ok(None),
            other => {
                let fields: Vec<Option<String>> =
                    redis::from_redis_value(other).map_err(|e| TopologyError::Corrupt {
                        key: key.to_string(),
                        reason: format!("unexpected script reply: {e}"),
                    })?;
                Self::parse(prefix, key, &fields).map(Some)
            }
        }
    }

    /// Parses the record's fields in `FIELDS` order (missing trailing fields count as absent).
    pub(crate) fn parse(
        prefix: &str,
        key: &str,
        fields: &[Option<String>],
    ) -> Result<Topology, TopologyError> {
        let corrupt = |reason: String| TopologyError::Corrupt {
            key: key.to_string(),
            reason,
        };
        let field = |i: usize| fields.get(i).and_then(Option::as_deref);
        let number = |i: usize| -> Result<Option<u64>, TopologyError> {
            field(i)
                .map(|text| {
                    text.parse::<u64>().map_err(|_| {
                        corrupt(format!("`{}` is {text:?}, not an integer", FIELDS[i]))
                    })
                })
                .transpose()
        };
        let count =
            field(0).ok_or_else(|| corrupt(format!("missing field `{SHARD_COUNT_FIELD}`")))?;
        let shard_count = count
            .parse::<u32>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                corrupt(format!(
                    "`{SHARD_COUNT_FIELD}` is {count:?}, not a positive integer"
                ))
            })?;
        let version =
            number(1)?.ok_or_else(|| corrupt(format!("missing field `{VERSION_FIELD}`")))?;
        let migration = match (number(2)?, number(3)?, number(4)?) {
            (None, None, None) => None,
            (Some(previous), Some(resized_at_ms), Some(grace_ms)) => {
                let previous_shard_count = u32::try_from(previous)
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| {
                        corrupt(format!(
                            "`{PREVIOUS_SHARD_COUNT_FIELD}` is {previous}, not a positive u32"
                        ))
                    })?;
                let kind = match field(6) {
                    None | Some("resize") => ResizeKind::Resize,
                    Some("rollback") => ResizeKind::Rollback,
                    Some(other) => {
                        return Err(corrupt(format!(
                            "`{LAST_RESIZE_FIELD}` is {other:?}, not `resize` or `rollback`"
                        )))
                    }
                };
                Some(Migration {
                    previous_shard_count,
                    resized_at_ms,
                    grace_ms,
                    kind,
                })
            }
            _ => {
                return Err(corrupt(format!(
                "`{PREVIOUS_SHARD_COUNT_FIELD}`, `{RESIZED_AT_FIELD}` and `{GRACE_FIELD}` must be \
                     present together"
            )))
            }
        };
        let draining_shard_count = match number(5)? {
            None => None,
            Some(n) => match (u32::try_from(n), migration) {
                (Ok(n), Some(m)) if n > shard_count && n == m.previous_shard_count => Some(n),
                _ => {
                    return Err(corrupt(format!(
                        "`{DRAINING_FIELD}` is {n}: it must be the previous shard count of a shrink"
                    )))
                }
            },
        };
        Ok(Topology {
            prefix: prefix.to_string(),
            shard_count,
            version,
            migration,
            draining_shard_count,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_key_hash_tags_the_prefix() {
        assert_eq!(Topology::record_key("orders"), "sl:topology:{orders}");
    }

    fn fields(values: &[Option<&str>]) -> Vec<Option<String>> {
        values.iter().map(|v| v.map(str::to_owned)).collect()
    }

    #[test]
    fn parse_rejects_corrupt_records() {
        let key = "sl:topology:{o}";
        let ok = Topology::parse("o", key, &fields(&[Some("4"), Some("2")])).unwrap();
        assert_eq!(ok.migration(), None);
        for record in [
            [Some("0"), Some("1"), None, None, None],
            [Some("x"), Some("1"), None, None, None],
            [Some("4"), Some("v"), None, None, None],
            [None, Some("1"), None, None, None],
            [Some("4"), None, None, None, None],
            // A migration is all three fields or none.
            [Some("8"), Some("2"), Some("4"), None, None],
            [Some("8"), Some("2"), None, Some("1000"), Some("2000")],
            [Some("8"), Some("2"), Some("0"), Some("1000"), Some("2000")],
            [Some("8"), Some("2"), Some("4"), Some("soon"), Some("2000")],
            [Some("8"), Some("2"), Some("4"), Some("1000"), Some("-1")],
        ] {
            let err = Topology::parse("o", key, &fields(&record)).unwrap_err();
            assert!(
                matches!(err, TopologyError::Corrupt { .. }),
                "{record:?}: {err}"
            );
        }
    }

    #[test]
    fn parse_reads_the_migration_and_its_cut() {
        let t = Topology::parse(
            "o",
            "sl:topology:{o}",
            &fields(&[
                Some("8"),
                Some("2"),
                Some("4"),
                Some("1700000000000"),
                Some("2000"),
            ]),
        )
        .unwrap();
        let m = t.migration().unwrap();
        assert_eq!(
            m,
            Migration {
                previous_shard_count: 4,
                resized_at_ms: 1_700_000_000_000,
                grace_ms: 2_000,
                kind: ResizeKind::Resize,
            }
        );
        assert_eq!(m.cut_ms(), 1_700_000_002_000);
        assert_eq!((t.shard_count(), t.version()), (8, 2));
    }

    fn topology(shard_count: u32, migration: Option<Migration>) -> Topology {
        Topology {
            prefix: "orders".into(),
            shard_count,
            version: 2,
            migration,
            draining_shard_count: None,
        }
    }

    /// A key whose shard under `from` and `to` counts satisfy `pick`.
    fn key_where(from: u32, to: u32, pick: impl Fn(u32, u32) -> bool) -> Vec<u8> {
        (0..10_000)
            .map(|i| format!("key-{i}").into_bytes())
            .find(|k| {
                pick(
                    routing::shard_for_key(k, from),
                    routing::shard_for_key(k, to),
                )
            })
            .expect("some key fits")
    }

    #[test]
    fn moved_key_rule() {
        let cut = 10_000;
        let m = Migration {
            previous_shard_count: 4,
            resized_at_ms: 8_000,
            grace_ms: 2_000,
            kind: ResizeKind::Resize,
        };
        let t = topology(8, Some(m));
        // A key that stays: current in its shard whatever the id.
        let stays = key_where(4, 8, |a, b| a == b);
        let b = routing::shard_for_key(&stays, 8);
        assert_eq!(t.placement(&stays, b, 9_000), Placement::Current);
        assert_eq!(t.placement(&stays, b, 20_000), Placement::Current);
        // A key that moved a -> b: in b it waits for a, below its own id inside the grace, below the cut after.
        let moved = key_where(4, 8, |a, b| a != b);
        let (a, b) = (
            routing::shard_for_key(&moved, 4),
            routing::shard_for_key(&moved, 8),
        );
        assert_eq!(
            t.placement(&moved, b, 9_000),
            Placement::Moved {
                from: a,
                before_ms: 9_000
            }
        );
        assert_eq!(
            t.placement(&moved, b, 20_000),
            Placement::Moved {
                from: a,
                before_ms: cut
            }
        );
        // Its old entries in a are the previous layout's backlog, but only below the cut.
        assert_eq!(t.placement(&moved, a, 9_999), Placement::Previous);
        assert_eq!(t.placement(&moved, a, cut), Placement::Misrouted);
        // Anywhere else it is misrouted.
        let other = (0..8).find(|&s| s != a && s != b).unwrap();
        assert_eq!(t.placement(&moved, other, 9_000), Placement::Misrouted);
        // Without a migration nothing is moved; a topology that is one resize behind sees the moved
        // key's new entries as misrouted (the consumer's cue to re-read it).
        let before = topology(4, None);
        assert_eq!(before.placement(&moved, a, 9_000), Placement::Current);
        assert_eq!(before.placement(&moved, b, 9_000), Placement::Misrouted);
        // A shrink: a key whose previous shard was removed waits for that shard's older entries while it
        // drains (below its own id, even past the cut: late writes are still read there), and has
        // nothing to wait for once it is retired (drained to its end, no longer writable).
        let mut shrunk = topology(
            3,
            Some(Migration {
                previous_shard_count: 8,
                ..m
            }),
        );
        shrunk.draining_shard_count = Some(8);
        assert_eq!(shrunk.read_shard_count(), 8);
        assert_eq!(shrunk.draining_shards(), 3..8);
        let from_removed = key_where(8, 3, |a, _| a >= 3);
        let (a, now) = (
            routing::shard_for_key(&from_removed, 8),
            routing::shard_for_key(&from_removed, 3),
        );
        for ms in [9_000, 20_000] {
            assert_eq!(
                shrunk.placement(&from_removed, now, ms),
                Placement::Moved {
                    from: a,
                    before_ms: ms
                }
            );
        }
        // In the draining shard itself its entries are the old layout's backlog (never deferred).
        assert_eq!(
            shrunk.placement(&from_removed, a, 9_000),
            Placement::Previous
        );
        shrunk.draining_shard_count = None;
        assert_eq!(shrunk.read_shard_count(), 3);
        assert_eq!(
            shrunk.placement(&from_removed, now, 9_000),
            Placement::Current
        );
        // Non-power-of-two grows move keys between old shards too.
        let grown = topology(
            5,
            Some(Migration {
                previous_shard_count: 3,
                ..m
            }),
        );
        let between = key_where(3, 5, |a, b| a != b && b < 3);
        let (a, b) = (
            routing::shard_for_key(&between, 3),
            routing::shard_for_key(&between, 5),
        );
        assert_eq!(
            grown.placement(&between, b, 12_000),
            Placement::Moved {
                from: a,
                before_ms: cut
            }
        );
    }

    #[test]
    fn stale_writes_are_old_layout_writes_outside_their_keys_shard_past_the_cut() {
        let m = Migration {
            previous_shard_count: 4,
            resized_at_ms: 8_000,
            grace_ms: 2_000,
            kind: ResizeKind::Resize,
        };
        let t = topology(8, Some(m));
        let moved = key_where(4, 8, |a, b| a != b);
        let (a, b) = (
            routing::shard_for_key(&moved, 4),
            routing::shard_for_key(&moved, 8),
        );
        // With a version: older than the topology, at or past the cut, outside the key's shard.
        assert!(!t.is_stale_write(&moved, a, 9_999, Some(1)));
        assert!(t.is_stale_write(&moved, a, 10_000, Some(1)));
        assert!(
            !t.is_stale_write(&moved, b, 10_000, Some(1)),
            "in the key's shard: in order"
        );
        assert!(
            !t.is_stale_write(&moved, a, 10_000, Some(2)),
            "routed with this layout"
        );
        // Without one (version 1, other clients): in a shard that is not the key's shard.
        assert!(t.is_stale_write(&moved, a, 10_000, None));
        assert!(!t.is_stale_write(&moved, b, 10_000, None));
        assert!(!t.is_stale_write(&moved, a, 9_000, None));
        // Routed with a layout older than the previous one (a producer that missed two resizes): its key
        // maps to neither the previous nor the current shard here.
        let stayed = key_where(4, 8, |a, b| a == b);
        let (old, now) = (
            routing::shard_for_key(&stayed, 4),
            routing::shard_for_key(&stayed, 8),
        );
        let elsewhere = (0..8)
            .find(|s| *s != old && *s != now)
            .expect("a third shard");
        assert!(t.is_stale_write(&stayed, elsewhere, 10_000, None));
        assert!(!t.is_stale_write(&stayed, now, 10_000, None));
        // Never resized: nothing is stale.
        assert!(!topology(4, None).is_stale_write(&moved, a, 10_000, Some(0)));
    }

    #[test]
    fn parse_reads_draining_and_rollbacks() {
        let key = "sl:topology:{o}";
        let t = Topology::parse(
            "o",
            key,
            &fields(&[
                Some("4"),
                Some("3"),
                Some("8"),
                Some("1000"),
                Some("2000"),
                Some("8"),
                Some("rollback"),
            ]),
        )
        .unwrap();
        assert_eq!((t.read_shard_count(), t.draining_shards()), (8, 4..8));
        assert_eq!(t.migration().unwrap().kind, ResizeKind::Rollback);
        for record in [
            // Draining must be the previous count of a shrink.
            [
                Some("4"),
                Some("3"),
                Some("8"),
                Some("1000"),
                Some("2000"),
                Some("6"),
                None,
            ],
            [
                Some("8"),
                Some("3"),
                Some("4"),
                Some("1000"),
                Some("2000"),
                Some("4"),
                None,
            ],
            [Some("4"), Some("1"), None, None, None, Some("8"), None],
            [
                Some("4"),
                Some("3"),
                Some("8"),
                Some("1000"),
                Some("2000"),
                None,
                Some("undo"),
            ],
        ] {
            let err = Topology::parse("o", key, &fields(&record)).unwrap_err();
            assert!(
                matches!(err, TopologyError::Corrupt { .. }),
                "{record:?}: {err}"
            );
        }
    }

    #[test]
    fn topology_routes_with_its_count() {
        let t = topology(10, None);
        assert_eq!(t.shard_for_key(b"order-123"), 1);
        assert_eq!(t.stream_key(1), "orders:1");
        assert_eq!(t.stream_keys().len(), 10);
    }
}
