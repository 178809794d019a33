//! `reshard`: change a stream's shard count through `Topology::resize`.

use std::fmt::Write as _;

use std::time::Duration;

use stream_listener::topology::{Topology, DEFAULT_RESIZE_GRACE};

use crate::error::CliError;
use crate::redis_ctx::Ctx;
use crate::table::{seconds, utc};

/// Resizes the stream's topology. Groups follow on their own: each running process compares the topology
/// with its group's metadata every few heartbeats and applies the new count. A shrink that would strand
/// unread or unacknowledged entries, or a resize while the previous one is still migrating, is refused by
/// the library; its error is returned unchanged. `grace_ms` is how long producers may keep writing the
/// old layout (the library's default when `None`).
pub async fn run(
    ctx: &mut Ctx,
    stream: &str,
    shards: u32,
    grace_ms: Option<u64>,
) -> Result<String, CliError> {
    let grace = grace_ms.map_or(DEFAULT_RESIZE_GRACE, Duration::from_millis);
    let before = Topology::load(&mut ctx.conn, stream).await?;
    let after = Topology::resize_with_grace(&mut ctx.conn, stream, shards, grace).await?;
    if after.version() == before.version() {
        return Ok(format!(
            "stream `{stream}` already has {} shards (topology version {}): nothing to do\n",
            after.shard_count(),
            after.version()
        ));
    }
    let groups: Vec<String> = ctx
        .consumer_groups(&after.stream_key(0))
        .await?
        .into_iter()
        .map(|g| g.name)
        .filter(|name| !name.starts_with("__sl_"))
        .collect();
    let mut out = format!(
        "stream `{stream}`: {} -> {} shards (topology version {} -> {})\n",
        before.shard_count(),
        after.shard_count(),
        before.version(),
        after.version()
    );
    if after.shard_count() > before.shard_count() {
        let _ = writeln!(
            out,
            "created shard streams {}..{} with the consumer groups of shard 0",
            after.stream_key(before.shard_count()),
            after.stream_key(after.shard_count() - 1)
        );
    } else {
        let _ = writeln!(
            out,
            "shard streams {}..{} are no longer written or read (every group had consumed them)",
            before.stream_key(after.shard_count()),
            before.stream_key(before.shard_count() - 1)
        );
    }
    if let Some(migration) = after.migration() {
        let _ = writeln!(
            out,
            "producers may write the old layout until {} (grace {}); moved keys wait for their old \
             shard to be consumed up to then",
            utc(migration.cut_ms() as i64),
            seconds(migration.grace_ms as i64)
        );
    }
    if groups.is_empty() {
        out.push_str("no consumer group reads the stream yet\n");
    } else {
        let _ = writeln!(
            out,
            "groups {} follow within a few heartbeat intervals of a running member; producers within \
             their topology refresh interval",
            groups.join(", ")
        );
    }
    Ok(out)
}
