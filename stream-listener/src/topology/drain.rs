//! A shrink's removed shards: draining until every group consumed them, then frozen, trimmed and retired.

use redis::aio::ConnectionLike;
use redis::{Script, Value};

use super::{Topology, TopologyError};

const RETIRE_SHARD_SCRIPT: &str = include_str!("retire_shard.lua");
const RETIRE_SCRIPT: &str = include_str!("retire.lua");

/// Where a shrink's removed shards stand after [`Topology::retire_drained`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainState {
    /// Nothing drains: no shrink, or its removed shards are retired (possibly just now).
    Retired,
    /// Some removed shard is still readable; why.
    Draining(String),
}

impl Topology {
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
        let topology = Self::from_written(prefix, key, reply)?;
        let state = match topology.draining_shard_count {
            None => DrainState::Retired,
            Some(_) => DrainState::Draining("the record changed meanwhile".to_owned()),
        };
        Ok((topology, state))
    }
}
