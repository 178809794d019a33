//! One consistent read of a group for `status`, `shards`, `watch` and `seek`: the coordinator's view at
//! Redis time plus, per shard stream, the group's lag, pending count and last delivered id.

use serde::Serialize;
use stream_listener::clock::StoreMillis;
use stream_listener::coordinator::metadata::MemberState;
use stream_listener::coordinator::projection::{GroupProjection, MemberView};
use stream_listener::routing::shard_stream_key;
use stream_listener::topology::{Topology, TopologyError};

use crate::error::CliError;
use crate::redis_ctx::Ctx;

/// A group at one moment.
#[derive(Debug, Clone)]
pub struct GroupSnapshot {
    /// Logical stream.
    pub stream: String,
    /// Store revision of the metadata read.
    pub revision: i64,
    /// Redis time of the read (ms).
    pub now_ms: i64,
    /// The coordinator's projection at `now_ms`.
    pub view: GroupProjection,
    /// Redis time of the last commit (ms), when the stored header records it.
    pub committed_at_ms: Option<i64>,
    /// The stream topology's shard count (`None` without a topology record).
    pub topology_count: Option<u32>,
    /// One row per shard of the group, then any the topology has beyond them.
    pub shards: Vec<ShardStats>,
}

/// The group's consumption of one shard stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardStats {
    /// Shard index.
    pub shard: u32,
    /// The shard stream's key.
    pub stream: String,
    /// Whether the shard stream exists.
    pub exists: bool,
    /// `XLEN`.
    pub length: Option<u64>,
    /// Whether the group has a consumer group on the stream.
    pub has_group: bool,
    /// Entries not delivered to the group yet: Redis's `lag`, or, where Redis reports none (after
    /// `XDEL` or `XGROUP SETID`), the entries after the last delivered id, counted as the lag exporter
    /// counts them (`None`: no group, or counting failed).
    pub lag: Option<u64>,
    /// `false` when [`lag`](Self::lag) is a lower bound (more entries follow than the count limit).
    pub lag_exact: bool,
    /// Entries delivered and not acknowledged.
    pub pending: Option<u64>,
    /// Last id delivered to the group.
    pub last_delivered_id: Option<String>,
    /// Entries the group has read (Redis >= 7; nil until Redis can tell).
    pub entries_read: Option<u64>,
    /// Entries ever added to the shard stream (Redis >= 7).
    pub entries_added: Option<u64>,
}

impl ShardStats {
    /// The lag for a table: `-` when unknown, `>=N` when a lower bound.
    pub fn lag_text(&self) -> String {
        match self.lag {
            Some(lag) if !self.lag_exact => format!(">={lag}"),
            Some(lag) => lag.to_string(),
            None => "-".to_string(),
        }
    }

    /// Entries the group has consumed: `entries-read`, else entries added minus lag.
    pub fn consumed(&self) -> Option<u64> {
        self.entries_read.or_else(|| {
            self.entries_added
                .zip(self.lag)
                .map(|(added, lag)| added.saturating_sub(lag))
        })
    }
}

impl GroupSnapshot {
    /// Reads the group's metadata, the topology and every shard stream's consumer group.
    pub async fn read(ctx: &mut Ctx, stream: &str, group: &str) -> Result<Self, CliError> {
        let mut store = ctx.existing_group(stream, group).await?;
        let (revision, coordinator) = store.load().await?;
        let now_ms = ctx.now_ms().await?;
        let view = coordinator.projection(StoreMillis(now_ms));
        let committed_at_ms = store.committed_at().map(|at| at.0);
        let topology_count = match Topology::load(&mut ctx.conn, stream).await {
            Ok(topology) => Some(topology.shard_count()),
            Err(TopologyError::Missing { .. }) => None,
            Err(e) => return Err(e.into()),
        };
        let count = view.shard_count.max(topology_count.unwrap_or(0));
        let mut shards = Vec::with_capacity(count as usize);
        for shard in 0..count {
            shards.push(shard_stats(ctx, stream, group, shard).await?);
        }
        // Where Redis reports no lag, count it as the lag exporter does (one read of every shard).
        if shards.iter().any(|s| s.has_group && s.lag.is_none()) {
            let options = stream_listener::lag::LagOptions::default();
            if let Ok(read) =
                stream_listener::lag::read_group(&mut ctx.conn, stream, group, &options).await
            {
                for stats in shards.iter_mut().filter(|s| s.has_group && s.lag.is_none()) {
                    let Some(counted) = read.shards.iter().find(|c| c.shard == stats.shard) else {
                        continue;
                    };
                    if counted.has_group {
                        stats.lag = Some(counted.lag);
                        stats.lag_exact =
                            counted.source != stream_listener::lag::LagSource::AtLeast;
                    }
                }
            }
        }
        Ok(Self {
            stream: stream.to_string(),
            revision,
            now_ms,
            view,
            committed_at_ms,
            topology_count,
            shards,
        })
    }

    /// Total lag over the shards that report one.
    pub fn total_lag(&self) -> u64 {
        self.shards.iter().filter_map(|s| s.lag).sum()
    }

    /// Total pending entries.
    pub fn total_pending(&self) -> u64 {
        self.shards.iter().filter_map(|s| s.pending).sum()
    }

    /// Total entries consumed, if every shard group can tell (Redis >= 7).
    pub fn total_consumed(&self) -> Option<u64> {
        self.shards
            .iter()
            .filter(|s| s.has_group)
            .map(ShardStats::consumed)
            .sum()
    }

    /// Total entries ever added to the shard streams, if every one can tell (Redis >= 7).
    pub fn total_added(&self) -> Option<u64> {
        self.shards
            .iter()
            .filter(|s| s.exists)
            .map(|s| s.entries_added)
            .sum()
    }
}

/// The group's consumer group on shard `shard` of `stream`.
pub async fn shard_stats(
    ctx: &mut Ctx,
    stream: &str,
    group: &str,
    shard: u32,
) -> Result<ShardStats, CliError> {
    let key = shard_stream_key(stream, shard);
    let exists = ctx.exists(&key).await?;
    let (length, entries_added) = if exists {
        (
            Some(ctx.stream_len(&key).await?),
            ctx.entries_added(&key).await?,
        )
    } else {
        (None, None)
    };
    let info = ctx
        .consumer_groups(&key)
        .await?
        .into_iter()
        .find(|g| g.name == group);
    Ok(ShardStats {
        shard,
        stream: key,
        exists,
        length,
        has_group: info.is_some(),
        lag: info.as_ref().and_then(|i| i.lag),
        lag_exact: true,
        pending: info.as_ref().and_then(|i| i.pending),
        last_delivered_id: info.as_ref().and_then(|i| i.last_delivered_id.clone()),
        entries_read: info.and_then(|i| i.entries_read),
        entries_added,
    })
}

/// An expired or fenced member kept for monitoring only (no lease, nothing assigned).
pub fn is_tombstone(member: &MemberView) -> bool {
    member.lease_deadline_ms == 0
        && matches!(member.state, MemberState::Expired | MemberState::Fenced)
}

/// The members to show: all with `all`, else without tombstones; and how many were hidden.
pub fn visible_members(view: &GroupProjection, all: bool) -> (Vec<&MemberView>, usize) {
    let shown: Vec<&MemberView> = view
        .members
        .iter()
        .filter(|m| all || !is_tombstone(m))
        .collect();
    let hidden = view.members.len() - shown.len();
    (shown, hidden)
}
