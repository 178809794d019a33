//! `shards`: one row per shard, combining the coordinator's view with each shard stream's consumer group.

use serde::Serialize;

use crate::error::CliError;
use crate::redis_ctx::Ctx;
use crate::snapshot::{GroupSnapshot, ShardStats};
use crate::table::{json_text, or_dash, Table};

/// One shard in `--json`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ShardRow<'a> {
    /// `new` (the topology has it, the group not yet), `removed` (the reverse), else `current`.
    status: &'static str,
    target: Option<&'a str>,
    current: Option<&'a str>,
    fenced_hold: Option<&'a str>,
    #[serde(flatten)]
    stats: &'a ShardStats,
}

/// Per shard: target owner, current owner, fenced hold, stream length, and the group's lag, pending count
/// and last delivered id (`XINFO GROUPS` on `<stream>:<i>`).
///
/// Lists the group's shards and, while the stream's topology has more (a grow the group has not followed
/// yet), those too.
pub async fn run(ctx: &mut Ctx, stream: &str, group: &str, json: bool) -> Result<String, CliError> {
    let snapshot = GroupSnapshot::read(ctx, stream, group).await?;
    let view = &snapshot.view;
    let rows: Vec<ShardRow<'_>> = snapshot
        .shards
        .iter()
        .map(|stats| {
            let owners = view.shards.get(stats.shard as usize);
            ShardRow {
                status: shard_status(stats.shard, view.shard_count, snapshot.topology_count),
                target: owners.and_then(|s| s.target.as_deref()),
                current: owners.and_then(|s| s.current.as_deref()),
                fenced_hold: owners.and_then(|s| s.fenced_hold.as_deref()),
                stats,
            }
        })
        .collect();
    if json {
        return Ok(json_text(&rows));
    }
    let mut table = Table::new(&[
        "SHARD",
        "STREAM",
        "TARGET",
        "CURRENT",
        "FENCED HOLD",
        "LENGTH",
        "LAG",
        "PENDING",
        "LAST DELIVERED",
    ]);
    for row in &rows {
        let stats = row.stats;
        table.row(vec![
            match row.status {
                "current" => stats.shard.to_string(),
                status => format!("{} ({status})", stats.shard),
            },
            stats.stream.clone(),
            or_dash(row.target),
            or_dash(row.current),
            or_dash(row.fenced_hold),
            stats
                .length
                .map_or_else(|| "(missing)".to_string(), |l| l.to_string()),
            if stats.has_group {
                stats.lag_text()
            } else {
                "(no group)".to_string()
            },
            or_dash(stats.pending),
            or_dash(stats.last_delivered_id.as_deref()),
        ]);
    }
    let mut out = table.render();
    if let Some(topology_count) = snapshot.topology_count {
        if topology_count != view.shard_count {
            out.push_str(&format!(
                "\nnote: the stream has {topology_count} shards, the group still {}: it follows within a \
                 few heartbeats of a running member\n",
                view.shard_count
            ));
        }
    }
    Ok(out)
}

fn shard_status(index: u32, group_count: u32, topology_count: Option<u32>) -> &'static str {
    if index >= group_count {
        "new"
    } else if topology_count.is_some_and(|t| index >= t) {
        "removed"
    } else {
        "current"
    }
}
