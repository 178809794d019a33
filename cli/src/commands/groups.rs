//! `groups`: every stream and consumer group in this Redis, found with a bounded `SCAN`.

use serde::Serialize;
use stream_listener::clock::StoreMillis;
use stream_listener::topology::{Topology, TopologyError};

use crate::error::CliError;
use crate::redis_ctx::Ctx;
use crate::snapshot::{is_tombstone, shard_stats};
use crate::table::{json_text, label, or_dash, Table};

/// One group (or a stream without any) in the listing.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Row {
    stream: String,
    /// The stream topology's shard count and version (`None` without a topology record).
    shards: Option<u32>,
    topology_version: Option<u64>,
    group: Option<String>,
    /// `STABLE`, ...; `NOT_JOINED` for a consumer group on the shard streams without metadata yet;
    /// `UNREADABLE` for metadata the library cannot load.
    state: Option<String>,
    live_members: Option<usize>,
    group_epoch: Option<i64>,
    lag: Option<u64>,
    /// Whether `lag` is exact, not a lower bound (see `stream_listener::lag`).
    lag_exact: bool,
    pending: Option<u64>,
    error: Option<String>,
}

/// Scans at most about `scan_limit` keys (of every master, on a cluster) for `sl:topology:{S}` and `sl:{S/G}:meta`, then describes each
/// stream (shard count, topology version) and group (state, live members, group epoch, lag, pending).
pub async fn run(ctx: &mut Ctx, scan_limit: usize, json: bool) -> Result<String, CliError> {
    let found = stream_listener::lag::scan_namespace(&mut ctx.conn, scan_limit).await?;
    let mut rows = Vec::new();
    for (stream, groups) in &found.streams {
        let (shards, version) = match Topology::load(&mut ctx.conn, stream).await {
            Ok(t) => (Some(t.shard_count()), Some(t.version())),
            Err(TopologyError::Missing { .. }) => (None, None),
            Err(e) => return Err(e.into()),
        };
        let mut names = groups.clone();
        // Consumer groups created on the shard streams that no member has joined yet.
        if shards.is_some() {
            let key = stream_listener::routing::shard_stream_key(stream, 0);
            for info in ctx.consumer_groups(&key).await? {
                if !stream_listener::names::is_internal_group(&info.name) {
                    names.insert(info.name);
                }
            }
        }
        if names.is_empty() {
            rows.push(Row {
                stream: stream.clone(),
                shards,
                topology_version: version,
                group: None,
                state: None,
                live_members: None,
                group_epoch: None,
                lag: None,
                lag_exact: true,
                pending: None,
                error: None,
            });
        }
        for group in names {
            rows.push(
                describe(
                    ctx,
                    stream,
                    &group,
                    shards,
                    version,
                    groups.contains(&group),
                )
                .await?,
            );
        }
    }
    if json {
        return Ok(json_text(&serde_json::json!({
            "groups": rows,
            "scannedKeysApprox": found.scanned,
            "truncated": found.truncated,
        })));
    }
    let mut out = if rows.is_empty() {
        "no stream-listener streams or groups found\n".to_string()
    } else {
        let mut table = Table::new(&[
            "STREAM", "SHARDS", "VERSION", "GROUP", "STATE", "MEMBERS", "EPOCH", "LAG", "PENDING",
        ]);
        for r in &rows {
            table.row(vec![
                r.stream.clone(),
                or_dash(r.shards),
                or_dash(r.topology_version),
                or_dash(r.group.as_deref()),
                or_dash(r.state.as_deref()),
                or_dash(r.live_members),
                or_dash(r.group_epoch),
                match r.lag {
                    Some(lag) if !r.lag_exact => format!(">={lag}"),
                    lag => or_dash(lag),
                },
                or_dash(r.pending),
            ]);
        }
        table.render()
    };
    for r in rows.iter().filter(|r| r.error.is_some()) {
        out.push_str(&format!(
            "warning: group `{}` of `{}`: {}\n",
            r.group.as_deref().unwrap_or("?"),
            r.stream,
            r.error.as_deref().unwrap_or("")
        ));
    }
    if found.truncated {
        out.push_str(&format!(
            "note: the scan stopped after about {} keys; more streams or groups may exist (raise --scan-limit)\n",
            found.scanned
        ));
    }
    Ok(out)
}

async fn describe(
    ctx: &mut Ctx,
    stream: &str,
    group: &str,
    shards: Option<u32>,
    version: Option<u64>,
    has_metadata: bool,
) -> Result<Row, CliError> {
    let mut row = Row {
        stream: stream.to_string(),
        shards,
        topology_version: version,
        group: Some(group.to_string()),
        state: None,
        live_members: None,
        group_epoch: None,
        lag: None,
        lag_exact: true,
        pending: None,
        error: None,
    };
    let mut count = shards.unwrap_or(0);
    if !has_metadata {
        row.state = Some("NOT_JOINED".to_string());
    } else {
        let loaded = match ctx.existing_group(stream, group).await {
            Ok(mut store) => store.load().await.map_err(CliError::from),
            Err(e) => Err(e),
        };
        match loaded {
            Ok((_, coordinator)) => {
                let view = coordinator.projection(StoreMillis(ctx.now_ms().await?));
                row.state = Some(label(&view.state));
                row.live_members = Some(view.members.iter().filter(|m| !is_tombstone(m)).count());
                row.group_epoch = Some(view.group_epoch);
                count = count.max(view.shard_count);
            }
            Err(e) => {
                row.state = Some("UNREADABLE".to_string());
                row.error = Some(e.to_string());
            }
        }
    }
    if shards.is_some() {
        // The lag exporter's read: it counts the lag of shards where Redis reports none (after an
        // `XDEL` or a `SETID`), where adding up `XINFO GROUPS` would count them as 0.
        let options = stream_listener::lag::LagOptions::default();
        if let Ok(read) =
            stream_listener::lag::read_group(&mut ctx.conn, stream, group, &options).await
        {
            row.lag = Some(read.lag);
            row.lag_exact = read.lag_exact;
            row.pending = Some(read.pending);
            return Ok(row);
        }
    }
    let (mut lag, mut pending) = (0, 0);
    for shard in 0..count {
        let stats = shard_stats(ctx, stream, group, shard).await?;
        lag += stats.lag.unwrap_or(0);
        pending += stats.pending.unwrap_or(0);
    }
    if count > 0 {
        row.lag = Some(lag);
        row.pending = Some(pending);
    }
    Ok(row)
}
