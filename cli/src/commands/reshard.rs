//! `reshard` and `rollback`: change a stream's shard count through `Topology::resize` /
//! `Topology::rollback`; and the stream's resharding line of `status`.

use std::fmt::Write as _;

use std::time::Duration;

use stream_listener::topology::{ResizeKind, Topology, TopologyError, DEFAULT_RESIZE_GRACE};

use crate::error::CliError;
use crate::redis_ctx::Ctx;
use crate::table::{json_text, seconds, utc};

/// Resizes the stream's topology. Groups follow on their own: each running process compares the topology
/// with its group's metadata every few heartbeats and applies the count its groups must read. A resize
/// while the previous one is still migrating (or its removed shards still drain) is refused by the
/// library; its error is returned unchanged. `grace_ms` is how long producers may keep writing the old
/// layout (the library's default when `None`).
pub async fn run(
    ctx: &mut Ctx,
    stream: &str,
    shards: u32,
    grace_ms: Option<u64>,
    json: bool,
) -> Result<String, CliError> {
    let grace = grace_ms.map_or(DEFAULT_RESIZE_GRACE, Duration::from_millis);
    let before = Topology::load(&mut ctx.conn, stream).await?;
    let after = Topology::resize_with_grace(&mut ctx.conn, stream, shards, grace).await?;
    if json {
        return report_json(ctx, stream, &before, &after).await;
    }
    report(ctx, stream, &before, &after).await
}

/// Rolls the stream back to its shard count before the last resize: one stream-level resize, with the
/// same drain, retire and order rules, recorded as a rollback; every group follows.
pub async fn rollback(
    ctx: &mut Ctx,
    stream: &str,
    grace_ms: Option<u64>,
    json: bool,
) -> Result<String, CliError> {
    let grace = grace_ms.map_or(DEFAULT_RESIZE_GRACE, Duration::from_millis);
    let before = Topology::load(&mut ctx.conn, stream).await?;
    let after = Topology::rollback_with_grace(&mut ctx.conn, stream, grace).await?;
    if json {
        return report_json(ctx, stream, &before, &after).await;
    }
    let mut out = report(ctx, stream, &before, &after).await?;
    if after.version() != before.version() {
        out.insert_str(0, "rolled back: ");
    }
    Ok(out)
}

/// The consumer groups reading the stream (the library's internal ones left out).
async fn groups(ctx: &mut Ctx, after: &Topology) -> Result<Vec<String>, CliError> {
    Ok(ctx
        .consumer_groups(&after.stream_key(0))
        .await?
        .into_iter()
        .map(|g| g.name)
        .filter(|name| !stream_listener::names::is_internal_group(name))
        .collect())
}

/// What `report` says, as JSON: `changed` is false when there was nothing to do.
async fn report_json(
    ctx: &mut Ctx,
    stream: &str,
    before: &Topology,
    after: &Topology,
) -> Result<String, CliError> {
    let changed = after.version() != before.version();
    let migration = after.migration().filter(|_| changed);
    Ok(json_text(&serde_json::json!({
        "stream": stream,
        "changed": changed,
        "kind": migration.map(|m| match m.kind {
            ResizeKind::Resize => "resize",
            ResizeKind::Rollback => "rollback",
        }),
        "fromShards": before.shard_count(),
        "toShards": after.shard_count(),
        "fromVersion": before.version(),
        "toVersion": after.version(),
        "drainingShards": after.draining_shards().collect::<Vec<u32>>(),
        "cutMs": migration.map(|m| m.cut_ms()),
        "graceMs": migration.map(|m| m.grace_ms),
        "groups": if changed { groups(ctx, after).await? } else { Vec::new() },
    })))
}

async fn report(
    ctx: &mut Ctx,
    stream: &str,
    before: &Topology,
    after: &Topology,
) -> Result<String, CliError> {
    if after.version() == before.version() {
        return Ok(format!(
            "stream `{stream}` already has {} shards (topology version {}): nothing to do\n",
            after.shard_count(),
            after.version()
        ));
    }
    let groups = groups(ctx, after).await?;
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
            "shard streams {}..{} are draining: every group keeps reading them until the cut has passed \
             and it has consumed them to the end; then they are retired (later writes to them fail) and \
             groups follow to {} shards",
            before.stream_key(after.shard_count()),
            before.stream_key(before.shard_count() - 1),
            after.shard_count()
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

/// The stream's side of `status`: its shard count and version, the last resize (or rollback), shards
/// still draining, and the stale-layout writes `group` detected. `None` when the stream has no topology.
pub async fn status_line(
    ctx: &mut Ctx,
    stream: &str,
    group: &str,
) -> Result<Option<String>, CliError> {
    let topology = match Topology::load(&mut ctx.conn, stream).await {
        Ok(topology) => topology,
        Err(TopologyError::Missing { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let mut line = format!(
        "{} shards (topology version {})",
        topology.shard_count(),
        topology.version()
    );
    if let Some(m) = topology.migration() {
        let kind = match m.kind {
            ResizeKind::Resize => "resized",
            ResizeKind::Rollback => "rolled back",
        };
        let _ = write!(
            line,
            ", {kind} from {} at {}, cut {}",
            m.previous_shard_count,
            utc(m.resized_at_ms as i64),
            utc(m.cut_ms() as i64)
        );
    }
    let draining = topology.draining_shards();
    if !draining.is_empty() {
        let _ = write!(
            line,
            ", shards {}..{} DRAINING",
            draining.start,
            draining.end - 1
        );
    }
    let stale = Topology::stale_writes(&mut ctx.conn, stream).await?;
    if let Some(n) = stale.get(group).filter(|&&n| n > 0) {
        let _ = write!(line, ", {n} stale-layout writes detected");
    }
    Ok(Some(line))
}
