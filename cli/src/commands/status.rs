//! `status`: the group at a glance, from a fresh snapshot at Redis time.

use std::fmt::Write as _;

use stream_listener::coordinator::metadata::Resharding;
use stream_listener::coordinator::projection::{GroupProjection, MemberView};

use crate::error::CliError;
use crate::redis_ctx::Ctx;
use crate::table::{label, seconds, shard_list, utc, Table};

/// Prints the group's state, epochs, resharding, members and invariant violations (or `--json`: the
/// monitoring projection).
///
/// The view is computed from the freshly loaded snapshot and leases at the current Redis time, so lease
/// times are current even when steady-state heartbeats have not rewritten the stored projection.
pub async fn run(ctx: &mut Ctx, stream: &str, group: &str, json: bool) -> Result<String, CliError> {
    let mut store = ctx.existing_group(stream, group).await?;
    let (revision, coordinator) = store.load().await?;
    let stored = store.projection().await?;
    let now = ctx.now_ms().await?;
    let view = coordinator.projection(now);
    if json {
        let mut text = serde_json::to_string_pretty(&view).expect("projection serializes");
        text.push('\n');
        return Ok(text);
    }
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
    if let Some(stored) = stored {
        let _ = writeln!(
            out,
            "last change       {} ({} ago)",
            utc(stored.at_ms),
            seconds(now - stored.at_ms)
        );
    }
    out.push('\n');
    out.push_str(&members(&view, now).render());
    out.push('\n');
    out.push_str(&violations(&view));
    Ok(out)
}

fn resharding(resharding: Option<&Resharding>) -> String {
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

fn members(view: &GroupProjection, now: i64) -> Table {
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
    for m in &view.members {
        table.row(vec![
            member_label(m),
            label(&m.state),
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

fn member_label(m: &MemberView) -> String {
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

fn lease_left(m: &MemberView, now: i64) -> String {
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
