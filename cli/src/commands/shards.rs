//! `shards`: one row per shard, combining the coordinator's view with each shard stream's consumer group.

use stream_listener::coordinator::projection::ShardView;
use stream_listener::routing::shard_stream_key;
use stream_listener::topology::{Topology, TopologyError};

use crate::error::CliError;
use crate::redis_ctx::{ConsumerGroupInfo, Ctx};
use crate::table::{or_dash, Table};

/// Per shard: target owner, current owner, fenced hold, stream length, and the group's lag, pending count
/// and last delivered id (`XINFO GROUPS` on `<stream>:<i>`).
///
/// Lists the group's shards and, while the stream's topology has more (a grow the group has not followed
/// yet), those too.
pub async fn run(ctx: &mut Ctx, stream: &str, group: &str) -> Result<String, CliError> {
    let mut store = ctx.existing_group(stream, group).await?;
    let (_, coordinator) = store.load().await?;
    let view = coordinator.projection(ctx.now_ms().await?);
    let topology_count = match Topology::load(&mut ctx.conn, stream).await {
        Ok(topology) => Some(topology.shard_count()),
        Err(TopologyError::Missing { .. }) => None,
        Err(e) => return Err(e.into()),
    };
    let count = view.shard_count.max(topology_count.unwrap_or(0));
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
    for index in 0..count {
        let key = shard_stream_key(stream, index);
        let info = group_info(ctx, &key, group).await?;
        let owners = view.shards.get(index as usize);
        let length = if ctx.exists(&key).await? {
            ctx.stream_len(&key).await?.to_string()
        } else {
            "(missing)".to_string()
        };
        table.row(vec![
            shard_label(index, view.shard_count, topology_count),
            key,
            or_dash(owners.and_then(|s: &ShardView| s.target.clone())),
            or_dash(owners.and_then(|s| s.current.clone())),
            or_dash(owners.and_then(|s| s.fenced_hold.clone())),
            length,
            lag_text(info.as_ref()),
            or_dash(info.as_ref().and_then(|i| i.pending)),
            or_dash(info.and_then(|i| i.last_delivered_id)),
        ]);
    }
    let mut out = table.render();
    if topology_count.is_some_and(|t| t != view.shard_count) {
        out.push_str(&format!(
            "\nnote: the stream has {} shards, the group still {}: it follows within a few heartbeats of a \
             running member\n",
            topology_count.unwrap_or(0),
            view.shard_count
        ));
    }
    Ok(out)
}

/// The consumer group `group` of shard stream `key`, if it exists there.
async fn group_info(
    ctx: &mut Ctx,
    key: &str,
    group: &str,
) -> Result<Option<ConsumerGroupInfo>, CliError> {
    Ok(ctx
        .consumer_groups(key)
        .await?
        .into_iter()
        .find(|g| g.name == group))
}

fn shard_label(index: u32, group_count: u32, topology_count: Option<u32>) -> String {
    if index >= group_count {
        format!("{index} (new)")
    } else if topology_count.is_some_and(|t| index >= t) {
        format!("{index} (removed)")
    } else {
        index.to_string()
    }
}

fn lag_text(info: Option<&ConsumerGroupInfo>) -> String {
    match info {
        None => "(no group)".to_string(),
        Some(i) => or_dash(i.lag),
    }
}
