//! The topology record in Redis: creating it with its (empty) shard streams, reading it, and creating a
//! consumer group on every shard.

use redis::aio::ConnectionLike;
use redis::{RedisError, Script, Value};

use super::{StartFrom, Topology, TopologyError, FIELDS};
use crate::names::BOOTSTRAP_GROUP;
use crate::routing;

const ENSURE_SCRIPT: &str = include_str!("ensure.lua");

impl Topology {
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
        Self::validate_request(prefix, shard_count)?;
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

    /// Idempotently creates consumer group `group` on every shard stream of `prefix` groups read
    /// (`XGROUP CREATE <prefix>:<i> <group> 0|$ MKSTREAM`; an existing group is left as it is). On a
    /// shrink's draining shards the group is created only if the stream still exists (a retired shard is
    /// never re-created).
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
            create_group(conn, &stream, group, start.id(), true).await?;
        }
        for index in topology.draining_shards() {
            create_group(conn, &topology.stream_key(index), group, start.id(), false).await?;
        }
        Ok(topology)
    }

    /// Creates every shard stream producers write that does not exist yet, empty and without groups.
    pub(super) async fn create_streams<C>(&self, conn: &mut C) -> Result<(), TopologyError>
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
            create_group(
                conn,
                &stream,
                BOOTSTRAP_GROUP,
                crate::names::NEW_ENTRIES,
                true,
            )
            .await?;
            let _: i64 = redis::cmd("XGROUP")
                .arg("DESTROY")
                .arg(&stream)
                .arg(BOOTSTRAP_GROUP)
                .query_async(conn)
                .await?;
        }
        Ok(())
    }
}

/// `XGROUP CREATE <stream> <group> <id> [MKSTREAM]`, treating an existing group (BUSYGROUP) as success,
/// and, without `mkstream`, a missing stream too.
pub(super) async fn create_group<C>(
    conn: &mut C,
    stream: &str,
    group: &str,
    id: &str,
    mkstream: bool,
) -> Result<(), TopologyError>
where
    C: ConnectionLike + Send,
{
    let mut cmd = redis::cmd("XGROUP");
    cmd.arg("CREATE").arg(stream).arg(group).arg(id);
    if mkstream {
        cmd.arg("MKSTREAM");
    }
    let result: Result<(), RedisError> = cmd.query_async(conn).await;
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
        Err(_) if !mkstream => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The consumer groups of `stream` (none when it does not exist), the bootstrap group left out.
pub(super) async fn group_names<C>(conn: &mut C, stream: &str) -> Result<Vec<String>, TopologyError>
where
    C: ConnectionLike + Send,
{
    let exists: bool = redis::cmd("EXISTS").arg(stream).query_async(conn).await?;
    if !exists {
        return Ok(Vec::new());
    }
    let groups: Value = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(stream)
        .query_async(conn)
        .await?;
    Ok(crate::reply::xinfo_groups(&groups)?
        .into_iter()
        .map(|g| g.name)
        .filter(|name| name != BOOTSTRAP_GROUP)
        .collect())
}
