//! Resizes and rollbacks: changing a stream's shard count and recording the [`Migration`](super::Migration)
//! that the moved-key rule follows. A resize is refused while the previous one is still migrating.

use redis::aio::ConnectionLike;
use redis::{Script, Value};

use super::consumed::{consumed_before, ConsumedBefore};
use super::drain::DrainState;
use super::record::{create_group, group_names};
use super::{ResizeKind, StartFrom, Topology, TopologyError, DEFAULT_RESIZE_GRACE};
use crate::routing;

const RESIZE_SCRIPT: &str = include_str!("resize.lua");
const REOPEN_SCRIPT: &str = include_str!("reopen.lua");

impl Topology {
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
        Self::validate_request(prefix, shard_count)?;
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
        Self::from_written(prefix, key, reply)
    }
}
