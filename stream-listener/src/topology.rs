//! The topology of a sharded stream: how many shards it has, stored once in Redis for everyone.
//!
//! The shard count belongs to the **stream**, not to a consumer group: every group and every producer of
//! `orders` must route keys with the same count, or messages of one key would land in different shards. So
//! the count lives in one small Redis hash per stream, the *topology record*:
//!
//! | key | type | fields |
//! | --- | --- | --- |
//! | `sl:topology:{<prefix>}` | hash | `shardCount` (decimal u32 > 0), `version` (decimal u64, starts at 1, +1 on every resize); after a resize also `previousShardCount`, `resizedAtMs`, `graceMs` (the [`Migration`]) |
//!
//! The braces are a Redis Cluster hash tag on the prefix, so the record shares a slot with the rest of the
//! stream's metadata keys (the shard streams themselves, `<prefix>:<i>`, deliberately spread across slots).
//!
//! [`Topology::ensure`] creates the record and the (empty) shard streams, [`Topology::ensure_group`] creates
//! a consumer group on every shard, [`Topology::load`] reads the record, and [`Topology::resize`] changes
//! the count.
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

use redis::aio::ConnectionLike;
use redis::{RedisError, Script, Value};

use crate::routing::{self, PrefixError};

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

/// Default grace period of [`Topology::resize`]: the default producer refresh interval
/// ([`ProducerConfig::refresh_interval`](crate::producer::ProducerConfig::refresh_interval), 1 s) plus a
/// 1 s margin for in-flight writes and clock skew between Redis nodes.
pub const DEFAULT_RESIZE_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Temporary consumer group used to create an empty stream (`XGROUP CREATE … MKSTREAM`, then destroyed).
const BOOTSTRAP_GROUP: &str = "__sl_bootstrap";

/// Errors reading or changing a stream's topology.
#[derive(Debug, thiserror::Error)]
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
    /// A shrink would strand entries that some group has not consumed yet.
    #[error(
        "cannot shrink stream `{prefix}`: group `{group}` has not consumed shard stream `{stream}` \
         ({lag} unread, {pending} pending); drain it first"
    )]
    ShrinkWouldStrand {
        /// The stream prefix.
        prefix: String,
        /// The shard stream that would be removed.
        stream: String,
        /// A group that still has work in it.
        group: String,
        /// Entries the group has not read (or an unknown lag, reported as `u64::MAX`).
        lag: u64,
        /// Entries the group read but did not acknowledge.
        pending: u64,
    },
    /// The previous resize's migration is not finished: old-layout entries may still be written (its
    /// grace period has not passed) or some group has not consumed them yet. A second resize now would
    /// forget the first one's order barrier.
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
    fn id(self) -> &'static str {
        match self {
            StartFrom::Earliest => "0",
            StartFrom::Latest => "$",
        }
    }
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
    /// (or there was none): handle it in stream order.
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
        /// `min(entry ms, cut)`: the old shard must be consumed below this.
        before_ms: u64,
    },
    /// Routed here by neither layout: the topology this was computed with may be stale (re-read it if the
    /// entry is newer than the read), or a producer misrouted it.
    Misrouted,
}

/// A stream's topology as read from (or written to) its record in Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    prefix: String,
    shard_count: u32,
    version: u64,
    migration: Option<Migration>,
}

/// Fields of the record, in the order every script and `load` returns them.
const FIELDS: [&str; 5] = [
    SHARD_COUNT_FIELD,
    VERSION_FIELD,
    PREVIOUS_SHARD_COUNT_FIELD,
    RESIZED_AT_FIELD,
    GRACE_FIELD,
];

/// Creates the record if absent; returns its fields (see `FIELDS`; the existing ones if present).
const ENSURE_SCRIPT: &str = r#"
local n = redis.call('HGET', KEYS[1], 'shardCount')
if not n then
  redis.call('HSET', KEYS[1], 'shardCount', ARGV[1], 'version', '1')
end
return redis.call('HMGET', KEYS[1], 'shardCount', 'version', 'previousShardCount', 'resizedAtMs', 'graceMs')
"#;

/// Sets the shard count, bumps the version and records the migration (Redis time of the resize and the
/// grace period in `ARGV[2]`) if the count changed; nil if the record does not exist. Refuses while the
/// previous migration's cut has not passed: `{'wait', cut}`.
const RESIZE_SCRIPT: &str = r#"
local n = redis.call('HGET', KEYS[1], 'shardCount')
if not n then
  return false
end
local v = redis.call('HGET', KEYS[1], 'version') or '0'
if n ~= ARGV[1] then
  if not tonumber(v) then
    return redis.error_reply('ERR corrupt topology version ' .. v)
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local at = tonumber(redis.call('HGET', KEYS[1], 'resizedAtMs') or '')
  local grace = tonumber(redis.call('HGET', KEYS[1], 'graceMs') or '')
  if at and grace and now < at + grace then
    return {'wait', string.format('%d', at + grace)}
  end
  redis.call('HSET', KEYS[1], 'shardCount', ARGV[1], 'previousShardCount', n,
    'resizedAtMs', string.format('%d', now), 'graceMs', ARGV[2])
  redis.call('HINCRBY', KEYS[1], 'version', 1)
end
return redis.call('HMGET', KEYS[1], 'shardCount', 'version', 'previousShardCount', 'resizedAtMs', 'graceMs')
"#;

/// Whether consumer groups of stream `KEYS[1]` consumed every entry with an id up to `ARGV[3]` (the largest
/// id below the bound `ARGV[2]` ms): Redis time has reached the bound (so no new entry can get an id below
/// it), the group's last-delivered-id is at or past the last such entry, and none of them is pending.
/// `ARGV[1]` names the group, or is empty for every group. Returns `{consumed 0|1, now ms, blocking group}`.
const CONSUMED_SCRIPT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nows = string.format('%d', now)
if now < tonumber(ARGV[2]) then
  return {0, nows, ''}
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {1, nows, ''}
end
local last = redis.call('XREVRANGE', KEYS[1], ARGV[3], '-', 'COUNT', 1)[1]
local function older(a, b)
  local ams, aseq = string.match(a, '^(%d+)-(%d+)$')
  local bms, bseq = string.match(b, '^(%d+)-(%d+)$')
  ams, aseq, bms, bseq = tonumber(ams), tonumber(aseq), tonumber(bms), tonumber(bseq)
  return ams < bms or (ams == bms and aseq < bseq)
end
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name, delivered
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then delivered = g[i + 1] end
  end
  if name ~= '__sl_bootstrap' and (ARGV[1] == '' or ARGV[1] == name) then
    if last and older(delivered, last[1]) then
      return {0, nows, name}
    end
    if #redis.call('XPENDING', KEYS[1], name, '-', ARGV[3], 1) > 0 then
      return {0, nows, name}
    end
  end
end
return {1, nows, ''}
"#;

/// Whether a group (or every group) consumed a stream below a bound; see [`consumed_before`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsumedBefore {
    /// Every entry below the bound was delivered and acknowledged (or the stream / group does not exist).
    Yes,
    /// Not yet.
    No {
        /// Redis time of the check, in ms.
        now_ms: u64,
        /// The group still holding entries below the bound; `None` when Redis time has not reached the
        /// bound yet (entries below it may still be written).
        group: Option<String>,
    },
}

/// Whether consumer group `group` (every group when `None`) of the stream key `stream` has consumed every
/// entry with an id below `{before_ms}-0`: Redis time has reached `before_ms` (no entry below it can be
/// added any more), the group's last-delivered-id is at or past the last entry below it, and none of them
/// is pending. A group that does not exist on the stream counts as done (it never reads it). One script,
/// so the answer is consistent.
pub async fn consumed_before<C>(
    conn: &mut C,
    stream: &str,
    group: Option<&str>,
    before_ms: u64,
) -> Result<ConsumedBefore, TopologyError>
where
    C: ConnectionLike + Send,
{
    if before_ms == 0 {
        return Ok(ConsumedBefore::Yes);
    }
    let (consumed, now, blocking): (i64, String, String) = Script::new(CONSUMED_SCRIPT)
        .key(stream)
        .arg(group.unwrap_or(""))
        .arg(before_ms)
        .arg(format!("{}-{}", before_ms - 1, u64::MAX))
        .invoke_async(conn)
        .await?;
    if consumed == 1 {
        return Ok(ConsumedBefore::Yes);
    }
    Ok(ConsumedBefore::No {
        now_ms: now.parse().unwrap_or(0),
        group: (!blocking.is_empty()).then_some(blocking),
    })
}

impl Topology {
    /// The Redis key of the topology record of `prefix`: `sl:topology:{<prefix>}`.
    pub fn record_key(prefix: &str) -> String {
        format!("sl:topology:{{{prefix}}}")
    }

    /// The stream prefix (e.g. `orders`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The number of shards.
    pub fn shard_count(&self) -> u32 {
        self.shard_count
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
    ///   both directions, the oldest held entry only waits for strictly older entries, which are never held.
    ///   If `a` no longer exists (a shrink removed it; the shrink required it drained), there is nothing to
    ///   wait for: [`Placement::Current`].
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
                _ => Placement::Current,
            }
        } else {
            match before {
                Some((from, cut)) if from == shard && entry_ms < cut => Placement::Previous,
                _ => Placement::Misrouted,
            }
        }
    }

    /// The Redis key of shard `index`: `<prefix>:<index>`.
    pub fn stream_key(&self, index: u32) -> String {
        routing::shard_stream_key(&self.prefix, index)
    }

    /// The Redis keys of all shard streams, in shard order.
    pub fn stream_keys(&self) -> Vec<String> {
        (0..self.shard_count).map(|i| self.stream_key(i)).collect()
    }

    /// Idempotently creates the topology of `prefix` with `shard_count` shards and its empty shard streams.
    ///
    /// If the record already exists with the same count this returns it unchanged (and makes sure the shard
    /// streams exist); with a different count it fails with [`TopologyError::ShardCountMismatch`]; use
    /// [`resize`](Self::resize) to change the count deliberately. Creating the streams up front means
    /// producers can publish before any group exists, and a group created later with
    /// [`StartFrom::Earliest`] sees that backlog.
    pub async fn ensure<C>(
        conn: &mut C,
        prefix: &str,
        shard_count: u32,
    ) -> Result<Topology, TopologyError>
    where
        C: ConnectionLike + Send,
    {
        routing::validate_prefix(prefix)?;
        if shard_count == 0 {
            return Err(TopologyError::ZeroShards);
        }
        let key = Self::record_key(prefix);
        let reply: Value = Script::new(ENSURE_SCRIPT)
            .key(&key)
            .arg(shard_count)
            .invoke_async(conn)
            .await?;
        let topology =
            Self::from_reply(prefix, &key, reply)?.ok_or_else(|| TopologyError::Corrupt {
                key: key.clone(),
                reason: "ensure script returned nil".into(),
            })?;
        if topology.shard_count != shard_count {
            return Err(TopologyError::ShardCountMismatch {
                prefix: prefix.to_string(),
                existing: topology.shard_count,
                requested: shard_count,
            });
        }
        topology.create_streams(conn).await?;
        Ok(topology)
    }

    /// Reads the topology of `prefix`; [`TopologyError::Missing`] if it has none.
    pub async fn load<C>(conn: &mut C, prefix: &str) -> Result<Topology, TopologyError>
    where
        C: ConnectionLike + Send,
    {
        routing::validate_prefix(prefix)?;
        let key = Self::record_key(prefix);
        let fields: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(&key)
            .arg(&FIELDS[..])
            .query_async(conn)
            .await?;
        if fields.iter().take(2).all(Option::is_none) {
            return Err(TopologyError::Missing {
                prefix: prefix.to_string(),
                key,
            });
        }
        Self::parse(prefix, &key, &fields)
    }

    /// Idempotently creates consumer group `group` on every shard stream of `prefix`
    /// (`XGROUP CREATE <prefix>:<i> <group> 0|$ MKSTREAM`; an existing group is left as it is).
    ///
    /// The stream must have a topology ([`TopologyError::Missing`] otherwise). Returns the topology used.
    pub async fn ensure_group<C>(
        conn: &mut C,
        prefix: &str,
        group: &str,
        start: StartFrom,
    ) -> Result<Topology, TopologyError>
    where
        C: ConnectionLike + Send,
    {
        let topology = Self::load(conn, prefix).await?;
        for stream in topology.stream_keys() {
            create_group(conn, &stream, group, start.id()).await?;
        }
        Ok(topology)
    }

    /// Changes the shard count of `prefix` to `shard_count` with the default grace period
    /// ([`DEFAULT_RESIZE_GRACE`]); see [`resize_with_grace`](Self::resize_with_grace).
    pub async fn resize<C>(
        conn: &mut C,
        prefix: &str,
        shard_count: u32,
    ) -> Result<Topology, TopologyError>
    where
        C: ConnectionLike + Send,
    {
        Self::resize_with_grace(conn, prefix, shard_count, DEFAULT_RESIZE_GRACE).await
    }

    /// Changes the shard count of `prefix` to `shard_count`, bumps the version and records the
    /// [`Migration`] (no-op if the count is unchanged).
    ///
    /// `grace` is how long producers may keep writing the old layout: at least the longest
    /// [`ProducerConfig::refresh_interval`](crate::producer::ProducerConfig::refresh_interval) of any
    /// producer of the stream, plus a margin for writes in flight (and clock skew between Redis Cluster
    /// nodes). Consumers hold an entry of a moved key until the group has consumed the key's old shard
    /// below `min(entry id, cut)`, the cut being `resize time + grace` (see [`Topology::placement`]); a
    /// longer grace delays the next resize (refused until the cut has passed and every group consumed the
    /// old shards below it), not the moved keys.
    ///
    /// Before the record changes, the new shard streams are created and every consumer group found on shard
    /// 0 is created on each of them at `0`, so producers that pick up the new count find streams that all
    /// groups read. This moves no entries. Refused with [`TopologyError::MigrationInProgress`] while the
    /// previous resize's migration is not finished (its cut has not passed, or some group has not consumed
    /// the old shards below it), and with [`TopologyError::ShrinkWouldStrand`] when a shrink would remove a
    /// shard some group has not consumed.
    pub async fn resize_with_grace<C>(
        conn: &mut C,
        prefix: &str,
        shard_count: u32,
        grace: std::time::Duration,
    ) -> Result<Topology, TopologyError>
    where
        C: ConnectionLike + Send,
    {
        routing::validate_prefix(prefix)?;
        if shard_count == 0 {
            return Err(TopologyError::ZeroShards);
        }
        let current = Self::load(conn, prefix).await?;
        if current.shard_count == shard_count {
            return Ok(current);
        }
        // Shrinking must not strand a backlog: every group must have read and acknowledged everything in
        // the shards that go away. (Producers that have not refreshed their topology yet may still write
        // there for up to their refresh interval: stop or refresh them first.)
        for index in shard_count..current.shard_count {
            let stream = current.stream_key(index);
            for (group, lag, pending) in group_backlogs(conn, &stream).await? {
                if lag != 0 || pending != 0 {
                    return Err(TopologyError::ShrinkWouldStrand {
                        prefix: prefix.to_string(),
                        stream,
                        group,
                        lag,
                        pending,
                    });
                }
            }
        }
        // Consumers only know the last migration: the previous one must be finished for every group.
        if let Some(migration) = current.migration {
            let cut_ms = migration.cut_ms();
            for index in 0..migration.previous_shard_count.min(current.shard_count) {
                let stream = current.stream_key(index);
                if let ConsumedBefore::No { group, .. } =
                    consumed_before(conn, &stream, None, cut_ms).await?
                {
                    return Err(TopologyError::MigrationInProgress {
                        prefix: prefix.to_string(),
                        cut_ms,
                        reason: match group {
                            Some(group) => format!("group `{group}` has not consumed `{stream}`"),
                            None => "its grace period has not passed".to_owned(),
                        },
                    });
                }
            }
        }
        let target = Topology {
            shard_count,
            ..current.clone()
        };
        target.create_streams(conn).await?;
        let groups: Vec<String> = group_backlogs(conn, &current.stream_key(0))
            .await?
            .into_iter()
            .map(|(group, _, _)| group)
            .collect();
        for stream in target.stream_keys() {
            for group in &groups {
                create_group(conn, &stream, group, StartFrom::Earliest.id()).await?;
            }
        }
        let key = Self::record_key(prefix);
        let grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
        let reply: Value = Script::new(RESIZE_SCRIPT)
            .key(&key)
            .arg(shard_count)
            .arg(grace_ms)
            .invoke_async(conn)
            .await?;
        if let Value::Array(items) = &reply {
            if let [Value::BulkString(tag), cut] = items.as_slice() {
                if tag.as_slice() == b"wait" {
                    let cut_ms = redis::from_redis_value::<String>(cut.clone())
                        .ok()
                        .and_then(|c| c.parse().ok())
                        .unwrap_or(0);
                    return Err(TopologyError::MigrationInProgress {
                        prefix: prefix.to_string(),
                        cut_ms,
                        reason: "its grace period has not passed".to_owned(),
                    });
                }
            }
        }
        Self::from_reply(prefix, &key, reply)?.ok_or_else(|| TopologyError::Missing {
            prefix: prefix.to_string(),
            key,
        })
    }

    /// Creates every shard stream that does not exist yet, empty and without groups.
    async fn create_streams<C>(&self, conn: &mut C) -> Result<(), TopologyError>
    where
        C: ConnectionLike + Send,
    {
        for stream in self.stream_keys() {
            let exists: bool = redis::cmd("EXISTS").arg(&stream).query_async(conn).await?;
            if exists {
                continue;
            }
            // XGROUP CREATE MKSTREAM is the only way to create an empty stream; the group is removed at once
            // and the (empty) stream stays.
            create_group(conn, &stream, BOOTSTRAP_GROUP, "$").await?;
            let _: i64 = redis::cmd("XGROUP")
                .arg("DESTROY")
                .arg(&stream)
                .arg(BOOTSTRAP_GROUP)
                .query_async(conn)
                .await?;
        }
        Ok(())
    }

    fn from_reply(
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
    fn parse(
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
                Some(Migration {
                    previous_shard_count,
                    resized_at_ms,
                    grace_ms,
                })
            }
            _ => {
                return Err(corrupt(format!(
                "`{PREVIOUS_SHARD_COUNT_FIELD}`, `{RESIZED_AT_FIELD}` and `{GRACE_FIELD}` must be \
                     present together"
            )))
            }
        };
        Ok(Topology {
            prefix: prefix.to_string(),
            shard_count,
            version,
            migration,
        })
    }
}

/// `XGROUP CREATE <stream> <group> <id> MKSTREAM`, treating an existing group (BUSYGROUP) as success.
async fn create_group<C>(
    conn: &mut C,
    stream: &str,
    group: &str,
    id: &str,
) -> Result<(), TopologyError>
where
    C: ConnectionLike + Send,
{
    let result: Result<(), RedisError> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg(group)
        .arg(id)
        .arg("MKSTREAM")
        .query_async(conn)
        .await;
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// `(group, lag, pending)` of every consumer group of `stream`; an unknown lag (nil) counts as `u64::MAX`.
async fn group_backlogs<C>(
    conn: &mut C,
    stream: &str,
) -> Result<Vec<(String, u64, u64)>, TopologyError>
where
    C: ConnectionLike + Send,
{
    let exists: bool = redis::cmd("EXISTS").arg(stream).query_async(conn).await?;
    if !exists {
        return Ok(Vec::new());
    }
    let groups: Vec<std::collections::HashMap<String, Value>> = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(stream)
        .query_async(conn)
        .await?;
    let number = |g: &std::collections::HashMap<String, Value>, field: &str| {
        g.get(field)
            .and_then(|v| redis::from_redis_value::<u64>(v.clone()).ok())
            .unwrap_or(u64::MAX)
    };
    Ok(groups
        .iter()
        .filter_map(|g| {
            let name = redis::from_redis_value::<String>(g.get("name")?.clone()).ok()?;
            (name != BOOTSTRAP_GROUP).then(|| (name, number(g, "lag"), number(g, "pending")))
        })
        .collect())
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
                grace_ms: 2_000
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
        // A shrink: a key whose previous shard was removed has nothing to wait for.
        let shrunk = topology(
            3,
            Some(Migration {
                previous_shard_count: 8,
                ..m
            }),
        );
        let from_removed = key_where(8, 3, |a, _| a >= 3);
        let now = routing::shard_for_key(&from_removed, 3);
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
    fn topology_routes_with_its_count() {
        let t = topology(10, None);
        assert_eq!(t.shard_for_key(b"order-123"), 1);
        assert_eq!(t.stream_key(1), "orders:1");
        assert_eq!(t.stream_keys().len(), 10);
    }
}
