//! The Redis side of a stream's topology: the record's scripts, resizes, rollbacks, draining and retiring
//! a shrink's removed shards, the consumed-below check of the moved-key rule, and the stale-write counters.

use std::collections::BTreeMap;

use redis::aio::ConnectionLike;
use redis::{RedisError, Script, Value};

use super::{ResizeKind, StartFrom, Topology, TopologyError, DEFAULT_RESIZE_GRACE, FIELDS};
use crate::routing;

use crate::names::BOOTSTRAP_GROUP;

const ENSURE_SCRIPT: &str = include_str!("ensure.lua");
const RESIZE_SCRIPT: &str = include_str!("resize.lua");
const CONSUMED_SCRIPT: &str = include_str!("consumed.lua");
const RETIRE_SHARD_SCRIPT: &str = include_str!("retire_shard.lua");
const RETIRE_SCRIPT: &str = include_str!("retire.lua");
const REOPEN_SCRIPT: &str = include_str!("reopen.lua");

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
/// is pending. A group that does not exist on the stream counts as done (it never reads it), and so does a
/// stream that does not exist (a retired shard). One script, so the answer is consistent.
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

/// Where a shrink's removed shards stand after [`Topology::retire_drained`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainState {
    /// Nothing drains: no shrink, or its removed shards are retired (possibly just now).
    Retired,
    /// Some removed shard is still readable; why.
    Draining(String),
}

/// One event of a stream's resize audit (`sl:topology:{<prefix>}:audit`), see [`Topology::history`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResizeEvent {
    /// The audit entry id.
    pub id: String,
    /// `RESIZED`, `ROLLED_BACK` or `SHARDS_RETIRED`.
    pub event: String,
    /// Shard count before.
    pub from: u32,
    /// Shard count after.
    pub to: u32,
    /// Topology version after.
    pub version: u64,
    /// Redis time of the event (ms).
    pub at_ms: u64,
}

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
    /// [`Migration`](super::Migration) (no-op if the count is unchanged).
    ///
    /// `grace` is how long producers may keep writing the old layout: at least the longest
    /// [`ProducerConfig::refresh_interval`](crate::producer::ProducerConfig::refresh_interval) of any
    /// producer of the stream, plus a margin for writes in flight (and clock skew between Redis Cluster
    /// nodes). Consumers hold an entry of a moved key until the group has consumed the key's old shard
    /// below `min(entry id, cut)`, the cut being `resize time + grace` (see [`Topology::placement`]); a
    /// longer grace delays the next resize (refused until the cut has passed and every group consumed the
    /// old shards below it) and a shrink's retirement, not the moved keys.
    ///
    /// A grow first creates the new shard streams and every consumer group found on shard 0 on each of
    /// them at `0`, so producers that pick up the new count find streams that all groups read. A shrink
    /// removes nothing at once: the removed shards keep being read by every group (draining) until the cut
    /// has passed and every group consumed them to the end; then they are retired (see the module docs and
    /// [`retire_drained`](Self::retire_drained)). This moves no entries.
    ///
    /// Refused with [`TopologyError::MigrationInProgress`] while the previous resize's migration is not
    /// finished (its cut has not passed, some group has not consumed the old shards below it, or a
    /// shrink's removed shards are not retired yet).
    pub async fn resize_with_grace<C>(
        conn: &mut C,
        prefix: &str,
        shard_count: u32,
        grace: std::time::Duration,
    ) -> Result<Topology, TopologyError>
    where
        C: ConnectionLike + Send,
    {
        Self::change(conn, prefix, shard_count, grace, ResizeKind::Resize).await
    }

    /// Rolls the stream back to the shard count before its last resize, with the default grace period;
    /// see [`rollback_with_grace`](Self::rollback_with_grace).
    pub async fn rollback<C>(conn: &mut C, prefix: &str) -> Result<Topology, TopologyError>
    where
        C: ConnectionLike + Send,
    {
        Self::rollback_with_grace(conn, prefix, DEFAULT_RESIZE_GRACE).await
    }

    /// Rolls the stream back to the shard count before its last resize: a resize like any other (same
    /// drain, retire and moved-key rules, same refusals while the last resize is still migrating), recorded
    /// as a rollback in the record (`lastResize`) and the stream's audit (`ROLLED_BACK`). Every group
    /// follows, as for any resize. [`TopologyError::NothingToRollBack`] if the stream was never resized.
    pub async fn rollback_with_grace<C>(
        conn: &mut C,
        prefix: &str,
        grace: std::time::Duration,
    ) -> Result<Topology, TopologyError>
    where
        C: ConnectionLike + Send,
    {
        routing::validate_prefix(prefix)?;
        let current = Self::load(conn, prefix).await?;
        let Some(migration) = current.migration else {
            return Err(TopologyError::NothingToRollBack {
                prefix: prefix.to_string(),
            });
        };
        Self::change(
            conn,
            prefix,
            migration.previous_shard_count,
            grace,
            ResizeKind::Rollback,
        )
        .await
    }

    async fn change<C>(
        conn: &mut C,
        prefix: &str,
        shard_count: u32,
        grace: std::time::Duration,
        kind: ResizeKind,
    ) -> Result<Topology, TopologyError>
    where
        C: ConnectionLike + Send,
    {
        routing::validate_prefix(prefix)?;
        if shard_count == 0 {
            return Err(TopologyError::ZeroShards);
        }
        let mut current = Self::load(conn, prefix).await?;
        if current.shard_count == shard_count {
            return Ok(current);
        }
        // A shrink's removed shards must be retired first: consumers only know the last migration.
        if !current.draining_shards().is_empty() {
            let (retired, state) = Self::retire_drained(conn, prefix).await?;
            if let DrainState::Draining(reason) = state {
                return Err(TopologyError::MigrationInProgress {
                    prefix: prefix.to_string(),
                    cut_ms: current.migration.map_or(0, |m| m.cut_ms()),
                    reason,
                });
            }
            current = retired;
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
        if shard_count > current.shard_count {
            let target = Topology {
                shard_count,
                ..current.clone()
            };
            // Shards an earlier shrink retired are frozen: start them afresh.
            for index in current.shard_count..shard_count {
                let _: i64 = Script::new(REOPEN_SCRIPT)
                    .key(target.stream_key(index))
                    .invoke_async(conn)
                    .await?;
            }
            target.create_streams(conn).await?;
            let groups = group_names(conn, &current.stream_key(0)).await?;
            for stream in target.stream_keys() {
                for group in &groups {
                    create_group(conn, &stream, group, StartFrom::Earliest.id(), true).await?;
                }
            }
        }
        let key = Self::record_key(prefix);
        let grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
        let reply: Value = Script::new(RESIZE_SCRIPT)
            .key(&key)
            .key(Self::audit_key(prefix))
            .arg(shard_count)
            .arg(grace_ms)
            .arg(match kind {
                ResizeKind::Resize => "resize",
                ResizeKind::Rollback => "rollback",
            })
            .arg(current.version)
            .invoke_async(conn)
            .await?;
        if let Value::Array(items) = &reply {
            if let [Value::BulkString(tag), detail] = items.as_slice() {
                let detail = redis::from_redis_value::<String>(detail.clone()).unwrap_or_default();
                let number = detail.parse::<u64>().unwrap_or(0);
                match tag.as_slice() {
                    b"wait" => {
                        return Err(TopologyError::MigrationInProgress {
                            prefix: prefix.to_string(),
                            cut_ms: number,
                            reason: "its grace period has not passed".to_owned(),
                        })
                    }
                    b"changed" => {
                        return Err(TopologyError::Concurrent {
                            prefix: prefix.to_string(),
                            expected: current.version,
                            found: number,
                        })
                    }
                    b"draining" => {
                        return Err(TopologyError::MigrationInProgress {
                            prefix: prefix.to_string(),
                            cut_ms: current.migration.map_or(0, |m| m.cut_ms()),
                            reason: format!(
                                "shards {}..{number} of the last shrink are still draining",
                                current.shard_count
                            ),
                        })
                    }
                    _ => {}
                }
            }
        }
        Self::from_reply(prefix, &key, reply)?.ok_or_else(|| TopologyError::Missing {
            prefix: prefix.to_string(),
            key,
        })
    }

    /// Moves a shrink's removed shards towards retirement, and retires them when they are done; returns
    /// the topology after that and whether anything still drains. Idempotent; safe to run from any number
    /// of processes at once (every topology follower does, every few heartbeats).
    ///
    /// For each removed shard: nothing before the cut (producers may still write the old layout); after
    /// it, the shard is frozen (any later `XADD` fails: a producer that missed the resize fails loudly, or
    /// re-routes, instead of writing where nobody will read), and trimmed empty once every group consumed
    /// it to the end (delivered and acknowledged everything), atomically with that check. The frozen, empty
    /// stream stays (members still owning the shard read nothing rather than fail) until a later grow
    /// reuses its index. When every removed shard is retired the record's `drainingShardCount` is dropped
    /// (audited as `SHARDS_RETIRED`) and groups follow to the new count.
    pub async fn retire_drained<C>(
        conn: &mut C,
        prefix: &str,
    ) -> Result<(Topology, DrainState), TopologyError>
    where
        C: ConnectionLike + Send,
    {
        let topology = Self::load(conn, prefix).await?;
        let (Some(draining), Some(migration)) = (topology.draining_shard_count, topology.migration)
        else {
            return Ok((topology, DrainState::Retired));
        };
        for index in topology.draining_shards() {
            let stream = topology.stream_key(index);
            let (state, group): (String, String) = Script::new(RETIRE_SHARD_SCRIPT)
                .key(&stream)
                .arg(migration.cut_ms())
                .invoke_async(conn)
                .await?;
            match state.as_str() {
                "gone" | "retired" => {
                    if state == "retired" {
                        tracing::info!(stream = %stream, "retired a drained shard of a shrink");
                    }
                }
                "wait" => {
                    let reason = format!(
                        "shards {}..{draining} of the last shrink drain until the cut ({} ms)",
                        topology.shard_count,
                        migration.cut_ms()
                    );
                    return Ok((topology, DrainState::Draining(reason)));
                }
                _ => {
                    return Ok((
                        topology,
                        DrainState::Draining(format!(
                            "group `{group}` has not consumed `{stream}`, a shard the last shrink removed"
                        )),
                    ))
                }
            }
        }
        let key = Self::record_key(prefix);
        let reply: Value = Script::new(RETIRE_SCRIPT)
            .key(&key)
            .key(Self::audit_key(prefix))
            .arg(draining)
            .invoke_async(conn)
            .await?;
        let topology =
            Self::from_reply(prefix, &key, reply)?.ok_or_else(|| TopologyError::Missing {
                prefix: prefix.to_string(),
                key,
            })?;
        let state = match topology.draining_shard_count {
            None => DrainState::Retired,
            Some(_) => DrainState::Draining("the record changed meanwhile".to_owned()),
        };
        Ok((topology, state))
    }

    /// The newest `count` events of the stream's resize audit, oldest first.
    pub async fn history<C>(
        conn: &mut C,
        prefix: &str,
        count: usize,
    ) -> Result<Vec<ResizeEvent>, TopologyError>
    where
        C: ConnectionLike + Send,
    {
        let entries: Vec<(String, BTreeMap<String, String>)> = redis::cmd("XREVRANGE")
            .arg(Self::audit_key(prefix))
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(count)
            .query_async(conn)
            .await?;
        Ok(entries
            .into_iter()
            .rev()
            .map(|(id, f)| {
                let n = |name: &str| f.get(name).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
                ResizeEvent {
                    event: f.get("event").cloned().unwrap_or_default(),
                    from: n("from") as u32,
                    to: n("to") as u32,
                    version: n("version"),
                    at_ms: n("atMs"),
                    id,
                }
            })
            .collect())
    }

    /// Late stale-layout writes each group's consumers detected (see [`Topology::is_stale_write`]).
    pub async fn stale_writes<C>(
        conn: &mut C,
        prefix: &str,
    ) -> Result<BTreeMap<String, u64>, TopologyError>
    where
        C: ConnectionLike + Send,
    {
        Ok(redis::cmd("HGETALL")
            .arg(Self::stale_key(prefix))
            .query_async(conn)
            .await?)
    }

    /// Counts one late stale-layout write seen by `group`.
    pub(crate) async fn count_stale_write<C>(
        conn: &mut C,
        prefix: &str,
        group: &str,
    ) -> Result<(), TopologyError>
    where
        C: ConnectionLike + Send,
    {
        let _: i64 = redis::cmd("HINCRBY")
            .arg(Self::stale_key(prefix))
            .arg(group)
            .arg(1)
            .query_async(conn)
            .await?;
        Ok(())
    }

    /// Creates every shard stream producers write that does not exist yet, empty and without groups.
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
async fn create_group<C>(
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
        .iter()
        .filter_map(|g| redis::from_redis_value::<String>(g.get("name")?.clone()).ok())
        .filter(|name| name != BOOTSTRAP_GROUP)
        .collect())
}
