//! The idle wait on a Redis Cluster. One blocking read cannot span slots (CROSSSLOT), so the
//! idle shards are grouped by slot and each group gets its own blocking read, on a connection of its own
//! straight to the slot's master (a blocked read holds its connection: reads sharing one would run one
//! after the other, and a read on the cluster connection would stall acks and heartbeats to that node).
//!
//! The wait ends as soon as ANY read returns entries or fails, or the scheduler interrupts it: the other
//! reads are ended with `CLIENT UNBLOCK` on their node and awaited, so what they saw is returned too and
//! no read outlives the wait in Redis. They are the single-node wait's reads (see `wait`): group reads
//! behind the fences that deliver, or on Redis 6.2 `XREAD`s that deliver nothing.
//!
//! A read that fails drops the cached slot map and ends the wait as failed: the scheduler then polls the
//! shards one by one through the cluster connection, which follows redirections, and the next wait reads
//! the new map. Any failure, not only `MOVED` / `ASK` (a slot migrating or failed over): a master that died
//! answers nothing, and a map that still names it would fail every wait after it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisResult};
use tokio::time::Instant;

use super::scheduler::WaitReport;
use super::shard_io::ShardIo;
use super::unblock::Unblocking;
use super::wait_spec::{Block, Read, WaitSet, WaitSpec, Watched};
use crate::connection::{as_cluster, slot_of, NodeConnections, SlotMaps};

/// A node's address.
type Node = crate::connection::NodeAddr;

/// One slot group's blocking connection and its client id on its node.
struct Blocking {
    node: Node,
    conn: MultiplexedConnection,
    id: i64,
}

/// The cluster wait's state, kept by the consumer between waits.
#[derive(Default)]
pub(crate) struct ClusterWait {
    /// Where each slot is, until a redirection or a failed read.
    slots: SlotMaps,
    /// Idle blocking connections by slot.
    conns: Mutex<HashMap<u16, Blocking>>,
    /// One non-blocking connection per node for `CLIENT UNBLOCK` (the cluster connection can only be
    /// routed to nodes it already holds a connection to).
    control: NodeConnections,
}

impl std::fmt::Debug for ClusterWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterWait")
    }
}

async fn blocking_for(
    io: &ShardIo,
    pool: &ClusterWait,
    slot: u16,
    node: &Node,
) -> RedisResult<Blocking> {
    let cached = pool
        .conns
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&slot);
    if let Some(blocking) = cached.filter(|b| b.node == *node) {
        return Ok(blocking);
    }
    let timeout = Duration::from_millis(io.config.block_ms) + io.config.response_timeout;
    let config = AsyncConnectionConfig::new()
        .set_response_timeout(Some(timeout))
        .set_connection_timeout(Some(io.config.response_timeout));
    let mut conn = io
        .client
        .node_connection(Some((&node.0, node.1)), &config)
        .await?;
    let id: i64 = redis::cmd("CLIENT")
        .arg("ID")
        .query_async(&mut conn)
        .await?;
    Ok(Blocking {
        node: node.clone(),
        conn,
        id,
    })
}

type ReadResult = (u16, Blocking, RedisResult<Read>);

/// The blocking part of the idle wait on a cluster (once [`super::wait::run`] knows where to watch from).
pub(crate) async fn read(
    io: Arc<ShardIo>,
    pool: &ClusterWait,
    spec: WaitSpec,
    mut outcome: WaitReport,
) -> WaitReport {
    if spec.interrupt.is_set() {
        return outcome;
    }
    let group_wait = io.group_wait();
    // Each shard, with the id it is watched from (its fence, for a group wait), by slot.
    let mut groups: BTreeMap<u16, Vec<(Watched, String)>> = BTreeMap::new();
    for (watched, (key, from)) in spec.set.shards.iter().zip(spec.streams(group_wait)) {
        groups
            .entry(slot_of(key.as_bytes()))
            .or_default()
            .push((watched.clone(), from.to_owned()));
    }
    let Some(cluster) = as_cluster(&io.conn) else {
        outcome.error = Some(redis::RedisError::from((
            redis::ErrorKind::Client,
            "the cluster wait needs a cluster connection",
        )));
        return outcome;
    };
    let nodes = match pool.slots.masters_of(cluster, groups.keys().copied()).await {
        Ok(nodes) => nodes,
        Err(error) => {
            outcome.error = Some(error);
            return outcome;
        }
    };
    let mut connected = Vec::new();
    for ((slot, keys), node) in groups.into_iter().zip(nodes) {
        let Some(node) = node else {
            pool.slots.forget();
            outcome.error = Some(redis::RedisError::from((
                redis::ErrorKind::Io,
                "no master serves the slot",
                slot.to_string(),
            )));
            return outcome;
        };
        match blocking_for(&io, pool, slot, &node).await {
            Ok(blocking) => connected.push((slot, keys, blocking)),
            Err(error) => {
                // Perhaps a master that died: the next wait asks where the slot went.
                pool.slots.forget();
                outcome.error = Some(error);
                return outcome;
            }
        }
    }
    let block = match spec.block(io.config.block_ms) {
        Block::For(block) => block,
        Block::TooLate => return outcome,
        Block::Expired => {
            outcome.expired = true;
            return outcome;
        }
    };
    let mut running: HashMap<u16, (Node, i64)> = HashMap::new();
    let mut reads = tokio::task::JoinSet::new();
    let wait_reads = spec.reads;
    for (slot, keys, mut blocking) in connected {
        running.insert(slot, (blocking.node.clone(), blocking.id));
        let io = io.clone();
        reads.spawn(tracing::Instrument::in_current_span(async move {
            let result = if group_wait {
                // A set of its own for each slot's read, built anew each time.
                let set = WaitSet::new(keys.into_iter().map(|(watched, _)| watched).collect());
                let built = set.group_read(&io, wait_reads, block);
                io.read_new_blocking(&built.pipe, &mut blocking.conn)
                    .await
                    .map(Read::Delivered)
            } else {
                let streams: Vec<(&str, &str)> = keys
                    .iter()
                    .map(|(watched, id)| (&*watched.key, id.as_str()))
                    .collect();
                io.wait_for_new(&streams, &mut blocking.conn, block)
                    .await
                    .map(Read::Seen)
            };
            (slot, blocking, result) as ReadResult
        }));
    }
    // See the `unblock` module: `CLIENT UNBLOCK` is sent again until every read has ended.
    let mut unblocking = Unblocking::default();
    loop {
        let joined = tokio::select! {
            biased;
            joined = reads.join_next() => joined,
            () = spec.interrupt.fired(), if !unblocking.started() => {
                unblocking.start(Instant::now());
                continue;
            }
            () = unblocking.due() => {
                let unblocked = unblock(&io, pool, &running).await;
                unblocking.sent(Instant::now(), unblocked);
                continue;
            }
        };
        let Some(joined) = joined else { break };
        let Ok((slot, blocking, result)) = joined else {
            // A read task panicked: its connection is gone with it, and a group read's reply.
            outcome.in_doubt |= group_wait;
            continue;
        };
        running.remove(&slot);
        let ended = match result {
            Ok(read) => {
                let got = match read {
                    Read::Seen(keys) => {
                        spec.note_new_entries(&keys, &mut outcome);
                        !keys.is_empty()
                    }
                    Read::Delivered(delivered) => {
                        let got = !delivered.is_empty();
                        spec.note_delivered(delivered, &mut outcome);
                        got
                    }
                };
                pool.conns
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(slot, blocking);
                got
            }
            Err(error) => {
                // A redirection, or a connection reset or refused: the slot may have moved or failed
                // over, and a master that died never answers with a redirection.
                pool.slots.forget();
                outcome.fail(error, group_wait);
                true
            }
        };
        if ended {
            unblocking.start(Instant::now());
        }
    }
    outcome
}

async fn control(
    io: &ShardIo,
    pool: &ClusterWait,
    node: &Node,
) -> RedisResult<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_response_timeout(Some(io.config.response_timeout))
        .set_connection_timeout(Some(io.config.response_timeout));
    pool.control
        .get(node, || {
            io.client.node_connection(Some((&node.0, node.1)), &config)
        })
        .await
}

/// `CLIENT UNBLOCK` every read still blocked, on its own node: whether each of them was unblocked.
async fn unblock(io: &ShardIo, pool: &ClusterWait, running: &HashMap<u16, (Node, i64)>) -> bool {
    let mut all = true;
    for (node, id) in running.values() {
        let unblocked = match control(io, pool, node).await {
            Ok(mut conn) => super::unblock::unblock(&mut conn, *id).await,
            Err(error) => {
                tracing::debug!(%error, host = %node.0, port = node.1, "no connection to interrupt a blocking read; trying again");
                false
            }
        };
        if !unblocked {
            // Perhaps a broken control connection: it is made again next time.
            pool.control.remove(node);
        }
        all &= unblocked;
    }
    all
}
