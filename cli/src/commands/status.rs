//! `status`: the group at a glance, from a fresh snapshot at Redis time.

use std::fmt::Write as _;

use stream_listener::coordinator::metadata::Resharding;
use stream_listener::coordinator::projection::{GroupProjection, MemberView};
use stream_listener::topology::{stray_warning, Topology};

use crate::error::CliError;
use crate::redis_ctx::Ctx;
use crate::snapshot::{is_tombstone, visible_members, GroupSnapshot};
use crate::table::{json_text, label, seconds, shard_list, utc, Table};

/// Prints the group's state, epochs, resharding, backlog, entries it lost to trimming (if any), entries
/// written to the logical name that nobody reads (if any), members and invariant violations (or `--json`:
/// the monitoring projection, each shard with its lag, pending count and last delivered id).
///
/// The view is computed from the freshly loaded snapshot and leases at the current Redis time, so lease
/// times are current (nothing stores a projection; "last change" is the last commit's time). Expired
/// and fenced tombstones are left out unless `all`.
pub async fn run(
    ctx: &mut Ctx,
    stream: &str,
    group: &str,
    json: bool,
    all: bool,
) -> Result<String, CliError> {
    let snapshot = GroupSnapshot::read(ctx, stream, group).await?;
    let stray = Topology::stray_entries(&mut ctx.conn, stream).await?;
    if json {
        let mut value = json_value(&snapshot, all);
        if let Some(object) = value.as_object_mut() {
            object.insert("strayEntries".into(), stray.into());
        }
        return Ok(json_text(&value));
    }
    let GroupSnapshot {
        revision,
        now_ms: now,
        ref view,
        ..
    } = snapshot;
    let mut out = String::new();
    let _ = writeln!(out, "stream            {stream}");
    let _ = writeln!(out, "group             {}", view.group);
    let _ = writeln!(out, "state             {}", label(&view.state));
    let _ = writeln!(out, "store revision    {revision}");
    let _ = writeln!(
        out,
        "epochs            group {}, assignment {}, metadata version {}",
        view.group_epoch, view.assignment_epoch, view.metadata_version
    );
    let _ = writeln!(out, "shard count       {}", view.shard_count);
    let _ = writeln!(
        out,
        "resharding        {}",
        resharding(view.resharding.as_ref())
    );
    let _ = writeln!(
        out,
        "backlog           lag {}, pending {} (all shards; `shards` has them per shard)",
        snapshot.total_lag(),
        snapshot.total_pending()
    );
    let lost = stream_listener::consumer::trimmed_unread(&mut ctx.conn, stream)
        .await?
        .get(group)
        .copied()
        .unwrap_or(0);
    if lost > 0 {
        let _ = writeln!(
            out,
            "trimmed unread    {lost} entries were removed before this group read them (a producer's \
             cap_unread, or XTRIM / XDEL by hand): lost to the group"
        );
    }
    if let Some(line) = super::reshard::status_line(ctx, stream, group).await? {
        let _ = writeln!(out, "stream topology   {line}");
    }
    if let Some(entries) = stray {
        let count = snapshot.topology_count.unwrap_or(view.shard_count);
        let _ = writeln!(
            out,
            "warning           {}",
            stray_warning(stream, count, entries)
        );
    }
    if let Some(at) = snapshot.committed_at_ms {
        let _ = writeln!(
            out,
            "last change       {} ({} ago)",
            utc(at),
            seconds(now - at)
        );
    }
    out.push('\n');
    let (shown, hidden) = visible_members(view, all);
    out.push_str(&members(&shown, now).render());
    if hidden > 0 {
        let _ = writeln!(
            out,
            "({hidden} expired or fenced tombstone{} hidden; --all shows them)",
            if hidden == 1 { "" } else { "s" }
        );
    }
    out.push('\n');
    out.push_str(&violations(view));
    Ok(out)
}

/// `status --json`'s value (also one line of `watch --json`): the monitoring projection as JSON
/// (camelCase), plus `stream`, `storeRevision`, `totalLag`, `totalPending`, `hiddenTombstones`, and per
/// shard `streamKey`, `length`, `lag`, `pending`, `lastDeliveredId`, `entriesRead`. `status` adds
/// `strayEntries`: entries in a Redis stream at the logical name itself, that nobody reads (or null).
pub(crate) fn json_value(snapshot: &GroupSnapshot, all: bool) -> serde_json::Value {
    let mut view = snapshot.view.clone();
    let before = view.members.len();
    view.members.retain(|m| all || !is_tombstone(m));
    let hidden = before - view.members.len();
    let mut value = serde_json::to_value(&view).expect("projection serializes");
    if let Some(shards) = value.get_mut("shards").and_then(|s| s.as_array_mut()) {
        for (row, stats) in shards.iter_mut().zip(&snapshot.shards) {
            if let Some(row) = row.as_object_mut() {
                row.insert("streamKey".into(), stats.stream.clone().into());
                row.insert("length".into(), serde_json::json!(stats.length));
                row.insert("lag".into(), serde_json::json!(stats.lag));
                row.insert("lagExact".into(), serde_json::json!(stats.lag_exact));
                row.insert("pending".into(), serde_json::json!(stats.pending));
                row.insert(
                    "lastDeliveredId".into(),
                    serde_json::json!(stats.last_delivered_id),
                );
                row.insert("entriesRead".into(), serde_json::json!(stats.entries_read));
            }
        }
    }
    if let Some(object) = value.as_object_mut() {
        object.insert("stream".into(), snapshot.stream.clone().into());
        object.insert("storeRevision".into(), snapshot.revision.into());
        object.insert("totalLag".into(), snapshot.total_lag().into());
        object.insert("totalPending".into(), snapshot.total_pending().into());
        object.insert("hiddenTombstones".into(), hidden.into());
    }
    value
}

pub(crate) fn resharding(resharding: Option<&Resharding>) -> String {
    match resharding {
        None => "none".to_string(),
        Some(r) => format!(
            "{} -> {} shards, {} (group epoch {}, since {})",
            r.previous_shard_count,
            r.shard_count,
            label(&r.state),
            r.group_epoch,
            utc(r.started_at_ms)
        ),
    }
}

fn members(shown: &[&MemberView], now: i64) -> Table {
    let mut table = Table::new(&[
        "MEMBER",
        "STATE",
        "EPOCH",
        "LEASE",
        "WEIGHT",
        "WORKERS",
        "ASSIGNED",
        "PENDING",
        "REVOKING",
        "SHARDS",
        "DUPLICATE?",
    ]);
    for m in shown {
        table.row(vec![
            member_label(m),
            if m.restarting {
                format!("{} (restarting)", label(&m.state))
            } else {
                label(&m.state)
            },
            m.member_epoch.to_string(),
            lease_left(m, now),
            live_only(m, m.weight),
            live_only(m, m.runtime_max_concurrency),
            m.assigned.len().to_string(),
            m.pending.len().to_string(),
            m.revoking.len().to_string(),
            shard_list(&m.assigned),
            if m.duplicate_suspected {
                "SUSPECTED"
            } else {
                "no"
            }
            .to_string(),
        ]);
    }
    if table.is_empty() {
        table.row(vec!["(no members)".to_string()]);
    }
    table
}

pub(crate) fn member_label(m: &MemberView) -> String {
    match &m.member_name {
        Some(name) if name != &m.member_id => format!("{} ({name})", m.member_id),
        _ => m.member_id.clone(),
    }
}

/// A live member's number; `-` for a tombstone (an expired or fenced member kept for monitoring).
fn live_only(m: &MemberView, value: u32) -> String {
    if m.lease_deadline_ms == 0 {
        "-".to_string()
    } else {
        value.to_string()
    }
}

pub(crate) fn lease_left(m: &MemberView, now: i64) -> String {
    if m.lease_deadline_ms == 0 {
        return "-".to_string();
    }
    let left = m.lease_deadline_ms - now;
    if left < 0 {
        format!("expired {} ago", seconds(-left))
    } else {
        seconds(left)
    }
}

fn violations(view: &GroupProjection) -> String {
    if view.invariant_violations.is_empty() {
        return "invariant violations: none\n".to_string();
    }
    let mut out = format!(
        "invariant violations: {}\n",
        view.invariant_violations.len()
    );
    for v in &view.invariant_violations {
        let _ = writeln!(out, "  - {v}");
    }
    out
}
