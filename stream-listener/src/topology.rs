//! The topology of a sharded stream: how many shards it has, stored once in Redis for everyone.
//!
//! The shard count belongs to the **stream**, not to a consumer group: every group and every producer of
//! `orders` must route keys with the same count, or messages of one key would land in different shards. So
//! the count lives in one small Redis hash per stream, the *topology record*:
//!
//! | key | type | fields |
//! | --- | --- | --- |
//! | `sl:topology:{<prefix>}` | hash | `shardCount` (decimal u32 > 0), `version` (decimal u64, starts at 1, +1 on every resize) |
//!
//! The braces are a Redis Cluster hash tag on the prefix, so the record shares a slot with the rest of the
//! stream's metadata keys (the shard streams themselves, `<prefix>:<i>`, deliberately spread across slots).
//!
//! [`Topology::ensure`] creates the record and the (empty) shard streams, [`Topology::ensure_group`] creates
//! a consumer group on every shard, [`Topology::load`] reads the record, and [`Topology::resize`] changes
//! the count.

use redis::aio::ConnectionLike;
use redis::{RedisError, Script, Value};

use crate::routing::{self, PrefixError};

/// Field of the topology hash holding the shard count.
pub const SHARD_COUNT_FIELD: &str = "shardCount";
/// Field of the topology hash holding the record version.
pub const VERSION_FIELD: &str = "version";

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

/// A stream's topology as read from (or written to) its record in Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    prefix: String,
    shard_count: u32,
    version: u64,
}

/// Creates the record if absent; returns `{shardCount, version}` as strings (the existing ones if present).
const ENSURE_SCRIPT: &str = r#"
local n = redis.call('HGET', KEYS[1], 'shardCount')
if not n then
  redis.call('HSET', KEYS[1], 'shardCount', ARGV[1], 'version', '1')
  return {ARGV[1], '1'}
end
local v = redis.call('HGET', KEYS[1], 'version')
return {n, v or ''}
"#;

/// Sets the shard count and bumps the version if it changed; nil if the record does not exist.
const RESIZE_SCRIPT: &str = r#"
local n = redis.call('HGET', KEYS[1], 'shardCount')
if not n then
  return false
end
local v = redis.call('HGET', KEYS[1], 'version') or '0'
if n == ARGV[1] then
  return {n, v}
end
if not tonumber(v) then
  return redis.error_reply('ERR corrupt topology version ' .. v)
end
redis.call('HSET', KEYS[1], 'shardCount', ARGV[1])
v = redis.call('HINCRBY', KEYS[1], 'version', 1)
return {ARGV[1], tostring(v)}
"#;

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

    /// The shard `key` routes to (see [`routing::shard_for_key`]).
    pub fn shard_for_key(&self, key: &[u8]) -> u32 {
        routing::shard_for_key(key, self.shard_count)
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
        let (count, version): (Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(&key)
            .arg(SHARD_COUNT_FIELD)
            .arg(VERSION_FIELD)
            .query_async(conn)
            .await?;
        match (count, version) {
            (None, None) => Err(TopologyError::Missing {
                prefix: prefix.to_string(),
                key,
            }),
            (count, version) => Self::parse(prefix, &key, count.as_deref(), version.as_deref()),
        }
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

    /// Changes the shard count of `prefix` to `shard_count` and bumps the version (no-op if unchanged).
    ///
    /// Before the record changes, the new shard streams are created and every consumer group found on shard
    /// 0 is created on each of them at `0`, so producers that pick up the new count find streams that all
    /// groups read. This only changes the record: it moves no entries. Per-key order across the change and
    /// the backlog of removed shards are the resharding protocol's job, not this function's.
    pub async fn resize<C>(
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
        let target = Topology {
            shard_count,
            ..current.clone()
        };
        target.create_streams(conn).await?;
        let groups = group_names(conn, &current.stream_key(0)).await?;
        for stream in target.stream_keys() {
            for group in &groups {
                create_group(conn, &stream, group, StartFrom::Earliest.id()).await?;
            }
        }
        let key = Self::record_key(prefix);
        let reply: Value = Script::new(RESIZE_SCRIPT)
            .key(&key)
            .arg(shard_count)
            .invoke_async(conn)
            .await?;
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
                let (count, version): (String, String) =
                    redis::from_redis_value(other).map_err(|e| TopologyError::Corrupt {
                        key: key.to_string(),
                        reason: format!("unexpected script reply: {e}"),
                    })?;
                Self::parse(prefix, key, Some(&count), Some(&version)).map(Some)
            }
        }
    }

    fn parse(
        prefix: &str,
        key: &str,
        count: Option<&str>,
        version: Option<&str>,
    ) -> Result<Topology, TopologyError> {
        let corrupt = |reason: String| TopologyError::Corrupt {
            key: key.to_string(),
            reason,
        };
        let count = count.ok_or_else(|| corrupt(format!("missing field `{SHARD_COUNT_FIELD}`")))?;
        let shard_count = count
            .parse::<u32>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                corrupt(format!(
                    "`{SHARD_COUNT_FIELD}` is {count:?}, not a positive integer"
                ))
            })?;
        let version = version.ok_or_else(|| corrupt(format!("missing field `{VERSION_FIELD}`")))?;
        let version = version
            .parse::<u64>()
            .map_err(|_| corrupt(format!("`{VERSION_FIELD}` is {version:?}, not an integer")))?;
        Ok(Topology {
            prefix: prefix.to_string(),
            shard_count,
            version,
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

/// The names of the consumer groups of `stream` (`XINFO GROUPS`), empty if the stream does not exist.
async fn group_names<C>(conn: &mut C, stream: &str) -> Result<Vec<String>, TopologyError>
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
    Ok(groups
        .into_iter()
        .filter_map(|g| {
            g.get("name")
                .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok())
        })
        .filter(|name| name != BOOTSTRAP_GROUP)
        .collect())
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

    #[test]
    fn parse_rejects_corrupt_records() {
        let key = "sl:topology:{o}";
        assert!(Topology::parse("o", key, Some("4"), Some("2")).is_ok());
        for (count, version) in [
            (Some("0"), Some("1")),
            (Some("x"), Some("1")),
            (Some("4"), Some("v")),
            (None, Some("1")),
            (Some("4"), None),
        ] {
            let err = Topology::parse("o", key, count, version).unwrap_err();
            assert!(matches!(err, TopologyError::Corrupt { .. }), "{err}");
        }
    }

    #[test]
    fn topology_routes_with_its_count() {
        let t = Topology {
            prefix: "orders".into(),
            shard_count: 10,
            version: 1,
        };
        assert_eq!(t.shard_for_key(b"order-123"), 1);
        assert_eq!(t.stream_key(1), "orders:1");
        assert_eq!(t.stream_keys().len(), 10);
    }
}
