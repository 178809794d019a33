//! The topology follower: keeps a group's shard count equal to what its stream's groups must read.

use std::time::Duration;

use crate::connection::Connection;
use tokio::sync::watch;

use crate::coordinator::AdminCommand;
use crate::store::{GroupStore, StoreError};
use crate::topology::{
    stray_warning, worth_warning, DrainState, StartFrom, Topology, TopologyError,
};

/// Keeps a group's shard count equal to the number of shards its stream's groups read: the shard count
/// belongs to the stream (its topology record), so when the stream is resized every group reading it must
/// follow, or entries routed to new shards would never be read. Every process runs one of these per group
/// it reads; the command is idempotent, so racing processes agree.
///
/// A grow is followed at once. A shrink is not: while its removed shards drain the topology's
/// [`read_shard_count`](Topology::read_shard_count) stays the old count, so the group keeps reading them.
/// Each tick also moves the drain on ([`Topology::retire_drained`]: freeze the removed shards once the cut
/// has passed, delete them once every group consumed them to the end, then drop them from the record);
/// only then does the group follow to the smaller count.
///
/// Each tick also looks for entries written to the logical name itself ([`Topology::stray_entries`]) and
/// warns when they appear or grow: nobody reads them.
pub(super) async fn follow_topology(
    mut conn: Connection,
    mut store: GroupStore,
    stream: String,
    group: String,
    period: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut warned_missing = false;
    // The WARNs of reads that fail: a Redis outage fails every tick until it is over.
    let mut warnings = crate::throttle::Throttle::default();
    let started = tokio::time::Instant::now();
    let now = || crate::clock::LocalMillis(started.elapsed().as_millis() as i64);
    let mut stray: Option<u64> = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = shutdown.changed() => return,
        }
        let mut topology = match Topology::load(&mut conn, &stream).await {
            Ok(topology) => topology,
            Err(TopologyError::Missing { .. }) => {
                // Redis lost it (restarted empty, flushed) while the group lives on: recreate it from
                // the group's shard count, once the group's metadata is real again (committed by its
                // members), so producers can route again.
                match store.load().await {
                    Ok((_, c)) if c.metadata().metadata_version > 0 => {
                        let count = c.metadata().shard_count;
                        if !warned_missing {
                            tracing::warn!(%stream, %group, shard_count = count, "the stream's topology is missing (Redis restarted empty or was flushed?): recreating it from the group's shard count");
                            warned_missing = true;
                        }
                        if let Err(error) = Topology::ensure(&mut conn, &stream, count).await {
                            tracing::warn!(%stream, %error, "cannot recreate the stream's topology");
                        }
                    }
                    // No member committed the group yet: nothing to recreate the topology from.
                    Ok(_) | Err(StoreError::Missing { .. }) => {}
                    Err(error) => {
                        tracing::warn!(%stream, %group, %error, "cannot read the group's metadata")
                    }
                }
                continue;
            }
            Err(error) => {
                if let Some(not_logged) = warnings.admit(now()) {
                    tracing::warn!(%stream, %error, not_logged, "cannot read the stream's topology");
                }
                continue;
            }
        };
        warnings.clear();
        warned_missing = false;
        match Topology::stray_entries(&mut conn, &stream).await {
            Ok(now) => {
                if worth_warning(stray, now) {
                    let entries = now.unwrap_or(0);
                    let text = stray_warning(&stream, topology.shard_count(), entries);
                    tracing::warn!(%stream, entries, "{text}");
                }
                stray = now;
            }
            Err(error) => {
                tracing::debug!(%stream, %error, "cannot look for entries at the logical name")
            }
        }
        if !topology.draining_shards().is_empty() {
            match Topology::retire_drained(&mut conn, &stream).await {
                Ok((retired, DrainState::Retired)) => {
                    tracing::info!(%stream, shards = ?topology.draining_shards(), "a shrink's removed shards are drained and retired");
                    topology = retired;
                }
                Ok((_, DrainState::Draining(reason))) => {
                    tracing::debug!(%stream, %reason, "a shrink's removed shards are draining");
                }
                Err(error) => {
                    tracing::warn!(%stream, %error, "cannot retire a shrink's removed shards");
                }
            }
        }
        let target = topology.read_shard_count();
        let current = match store.load().await {
            Ok((_, coordinator)) => coordinator.metadata().shard_count,
            // Its members have not committed it yet (or lost it): they create it with the right count.
            Err(StoreError::Missing { .. }) => continue,
            Err(error) => {
                if let Some(not_logged) = warnings.admit(now()) {
                    tracing::warn!(%stream, %group, %error, not_logged, "cannot read the group's metadata");
                }
                continue;
            }
        };
        if current == target {
            continue;
        }
        tracing::info!(%stream, %group, from = current, to = target, "stream resized: following");
        if let Err(error) =
            Topology::ensure_group(&mut conn, &stream, &group, StartFrom::Earliest).await
        {
            tracing::warn!(%stream, %group, %error, "cannot create the group on the new shards");
            continue;
        }
        match store.command(AdminCommand::SetShardCount(target)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%stream, %group, %error, "shard count change refused"),
            Err(error) => tracing::warn!(%stream, %group, %error, "shard count change failed"),
        }
    }
}
