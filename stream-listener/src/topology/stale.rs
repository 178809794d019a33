//! Stale-layout writes: entries a producer routed with an outdated topology after the cut, counted per group
//! in Redis and per process.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use redis::aio::ConnectionLike;

use super::{Topology, TopologyError};

static STALE_WRITES_SEEN: AtomicU64 = AtomicU64::new(0);

/// Late stale-layout writes this process's consumers detected, all streams and groups together (see
/// [`Topology::is_stale_write`]; per group and across processes: [`Topology::stale_writes`]).
pub fn stale_writes_seen() -> u64 {
    STALE_WRITES_SEEN.load(Ordering::Relaxed)
}

pub(crate) fn count_stale_write_seen() {
    STALE_WRITES_SEEN.fetch_add(1, Ordering::Relaxed);
}

impl Topology {
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
}
