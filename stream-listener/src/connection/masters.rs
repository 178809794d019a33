//! Straight lines to a cluster's masters, for writes that would pay for redis-rs's routing task.
//!
//! The cluster connection routes every pipeline through one task of its own, one pipeline per slot, and
//! resends a whole pipeline when any of its replies is a redirection: right for one slot, wrong for a
//! pipeline holding the transactions of several slots, some of which were written. [`Masters`] keeps
//! the slot map (`CLUSTER SLOTS`) and one multiplexed connection per master, so a caller can send all the
//! slot transactions one master serves in one pipeline and decide itself what a redirection means: the
//! producer resends only the transactions that were refused, through the cluster connection.
//!
//! The map is only a guess: a node that no longer serves a slot answers `MOVED` (or `ASK`) and runs
//! nothing, so a stale map costs a resend, never a write in the wrong place. Callers
//! [`forget`](Masters::forget) the map after a redirection and a master's connection after it failed; both
//! are read again on next use.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{AsyncConnectionConfig, RedisResult, ServerError, ServerErrorKind};

use super::{parse_cluster_slots, ConnectOptions, NodeAddr, RedisTarget};

/// `(first slot, last slot, master)` ranges, sorted by first slot.
type SlotMap = Arc<Vec<(u16, u16, NodeAddr)>>;

/// A cluster's slot map and one connection per master (see the module docs). Shared by clones of its
/// owner; every lock is held for a lookup only.
pub(crate) struct Masters {
    target: RedisTarget,
    /// `CLIENT SETNAME` of every connection, so that `CLIENT LIST` tells whose they are.
    name: &'static str,
    config: AsyncConnectionConfig,
    slots: SlotMaps,
    conns: NodeConnections,
}

/// A cluster's slot map, read (`CLUSTER SLOTS`) on first use and again after [`forget`](Self::forget).
#[derive(Default)]
pub(crate) struct SlotMaps(Mutex<Option<SlotMap>>);

impl SlotMaps {
    /// The master serving each slot in `slots`, in order (`None` where the map has no master), read
    /// through `cluster` when not cached.
    pub(crate) async fn masters_of(
        &self,
        cluster: &ClusterConnection,
        slots: impl IntoIterator<Item = u16>,
    ) -> RedisResult<Vec<Option<NodeAddr>>> {
        let cached = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let map = match cached {
            Some(map) => map,
            None => {
                let mut cmd = redis::cmd("CLUSTER");
                cmd.arg("SLOTS");
                let value = cluster
                    .clone()
                    .route_command(cmd, RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random))
                    .await?;
                let mut ranges = parse_cluster_slots(value)?;
                ranges.sort_unstable_by_key(|(first, ..)| *first);
                let map = Arc::new(ranges);
                *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(map.clone());
                map
            }
        };
        Ok(slots
            .into_iter()
            .map(|slot| master_of(&map, slot))
            .collect())
    }

    /// Drops the map (after a redirection, or a node that failed): the next lookup reads it again.
    pub(crate) fn forget(&self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// One multiplexed connection per cluster node, opened on first use and dropped when it failed.
#[derive(Default)]
pub(crate) struct NodeConnections(Mutex<HashMap<NodeAddr, MultiplexedConnection>>);

impl NodeConnections {
    /// The connection to `node`, opened with `open` when there is none.
    pub(crate) async fn get<F>(
        &self,
        node: &NodeAddr,
        open: impl FnOnce() -> F,
    ) -> RedisResult<MultiplexedConnection>
    where
        F: std::future::Future<Output = RedisResult<MultiplexedConnection>>,
    {
        let cached = self.lock().get(node).cloned();
        if let Some(conn) = cached {
            return Ok(conn);
        }
        let conn = open().await?;
        self.lock().insert(node.clone(), conn.clone());
        Ok(conn)
    }

    /// Drops `node`'s connection (it failed): the next [`get`](Self::get) opens another.
    pub(crate) fn remove(&self, node: &NodeAddr) {
        self.lock().remove(node);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<NodeAddr, MultiplexedConnection>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl std::fmt::Debug for Masters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Masters")
    }
}

impl Masters {
    /// For a cluster target, its connections named `name`; `None` for any other target.
    pub(crate) fn of(
        target: &RedisTarget,
        options: ConnectOptions,
        name: &'static str,
    ) -> Option<Self> {
        target.is_cluster().then(|| Self {
            target: target.clone(),
            name,
            config: AsyncConnectionConfig::new()
                .set_response_timeout(options.response_timeout)
                .set_connection_timeout(options.connection_timeout),
            slots: SlotMaps::default(),
            conns: NodeConnections::default(),
        })
    }

    /// The master serving each slot in `slots` (see [`SlotMaps::masters_of`]).
    pub(crate) async fn of_slots(
        &self,
        cluster: &ClusterConnection,
        slots: impl IntoIterator<Item = u16>,
    ) -> RedisResult<Vec<Option<NodeAddr>>> {
        self.slots.masters_of(cluster, slots).await
    }

    /// The connection to `node`, opened (with the target's credentials and TLS) when there is none.
    pub(crate) async fn connection(&self, node: &NodeAddr) -> RedisResult<MultiplexedConnection> {
        self.conns
            .get(node, || async {
                let mut conn = self
                    .target
                    .node_connection(Some((&node.0, node.1)), &self.config)
                    .await?;
                // Only a label: a user whose ACL refuses it keeps an unnamed connection.
                let named: RedisResult<()> = redis::cmd("CLIENT")
                    .arg("SETNAME")
                    .arg(self.name)
                    .query_async(&mut conn)
                    .await;
                if let Err(error) = named {
                    tracing::debug!(%error, "CLIENT SETNAME refused");
                }
                Ok(conn)
            })
            .await
    }

    /// Drops the slot map (after a redirection) and, with a node, that node's connection (after it
    /// failed): both are made again on next use.
    pub(crate) fn forget(&self, node: Option<&NodeAddr>) {
        self.slots.forget();
        if let Some(node) = node {
            self.conns.remove(node);
        }
    }
}

/// The master of `slot` in `map` (sorted by first slot).
fn master_of(map: &[(u16, u16, NodeAddr)], slot: u16) -> Option<NodeAddr> {
    let at = map.partition_point(|(first, ..)| *first <= slot);
    let (first, last, node) = map.get(at.checked_sub(1)?)?;
    (*first..=*last).contains(&slot).then(|| node.clone())
}

/// Whether a node refused a command without running it because the cluster's layout is not what the
/// sender thought (a slot moved or migrating, a failover under way, a replica written to): sent again
/// through the cluster connection, which follows the layout, it is written once.
pub(crate) fn not_run_here(error: &ServerError) -> bool {
    matches!(
        error.kind(),
        Some(
            ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::BusyLoading
                | ServerErrorKind::ReadOnly
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_served_by_the_range_holding_it_or_by_none() {
        let node = |port: u16| ("127.0.0.1".to_owned(), port);
        let map = vec![(0, 99, node(1)), (100, 100, node(2)), (200, 16383, node(3))];
        assert_eq!(master_of(&map, 0), Some(node(1)));
        assert_eq!(master_of(&map, 99), Some(node(1)));
        assert_eq!(master_of(&map, 100), Some(node(2)));
        assert_eq!(master_of(&map, 101), None, "a slot no range holds");
        assert_eq!(master_of(&map, 199), None);
        assert_eq!(master_of(&map, 200), Some(node(3)));
        assert_eq!(master_of(&map, 16383), Some(node(3)));
        assert_eq!(master_of(&[], 5), None);
    }

    #[test]
    fn only_refusals_of_the_layout_are_sent_again() {
        let error = |text: &str| match redis::parse_redis_value(format!("-{text}\r\n").as_bytes()) {
            Ok(redis::Value::ServerError(error)) => error,
            other => panic!("{other:?}"),
        };
        for refused in [
            "MOVED 3999 127.0.0.1:6381",
            "ASK 3999 127.0.0.1:6381",
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "CLUSTERDOWN The cluster is down",
            "MASTERDOWN Link with MASTER is down",
            "LOADING Redis is loading the dataset in memory",
            "READONLY You can't write against a read only replica.",
        ] {
            assert!(not_run_here(&error(refused)), "{refused}");
        }
        for failed in [
            "OOM command not allowed when used memory > 'maxmemory'.",
            "EXECABORT Transaction discarded because of previous errors.",
            "ERR The ID specified in XADD is equal or smaller than the target stream top item",
            "NOPERM this user has no permissions to run the 'xadd' command",
        ] {
            assert!(!not_run_here(&error(failed)), "{failed}");
        }
    }
}
