//! `seek`: move a group's position (its last delivered id) on some or all shards, with `XGROUP SETID …
//! ENTRIESREAD`.

use std::collections::BTreeSet;

use stream_listener::coordinator::projection::GroupProjection;

use crate::error::CliError;
use crate::redis_ctx::Ctx;
use crate::snapshot::{is_tombstone, shard_stats, GroupSnapshot};
use crate::table::{json_text, or_dash, Table};

/// The most entries after the new position `seek` counts to set `ENTRIESREAD` (in one script call on
/// the shard's node, 1,000 per `XRANGE`); beyond it the group is moved without, and Redis reports no lag.
const SEEK_COUNT_LIMIT: u64 = 100_000;

/// Where to move to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Position {
    /// Before the first entry: everything is read again (`0`).
    Earliest,
    /// After the last entry: the backlog is skipped (`$`).
    Latest,
    /// After this entry id: the next read starts with the first entry above it.
    Id(String),
}

impl Position {
    /// `earliest`, `latest`, or an entry id `<ms>` / `<ms>-<seq>`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "earliest" | "beginning" => Ok(Self::Earliest),
            "latest" | "end" => Ok(Self::Latest),
            id => {
                let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
                let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
                if digits(ms) && digits(seq) {
                    Ok(Self::Id(id.to_string()))
                } else {
                    Err(format!(
                        "`{text}` is not `earliest`, `latest` or an entry id like 1700000000000-0"
                    ))
                }
            }
        }
    }

    fn arg(&self) -> &str {
        match self {
            Self::Earliest => "0",
            Self::Latest => "$",
            Self::Id(id) => id,
        }
    }
}

/// Moves the group to `to` on `shards` (all of the group's shards when empty). Refused, changing nothing,
/// while a live member owns, is granted, is being revoked, or holds (fenced) any of them: stop the
/// consumers first, wait for their leases to pass (the command expires passed leases itself, as any
/// member's heartbeat would), then seek. Entries already pending stay pending: the next owner claims them.
/// On Redis >= 7 each shard moves with `ENTRIESREAD` (entries added minus the entries after the new
/// position, counted in the same script: `stream_listener::lag::set_position`), so Redis keeps
/// reporting the group's lag.
pub async fn run(
    ctx: &mut Ctx,
    stream: &str,
    group: &str,
    to: &Position,
    shards: &[u32],
    json: bool,
) -> Result<String, CliError> {
    // Expire members whose lease passed, so a stopped group's shards are free.
    ctx.existing_group(stream, group).await?.tick().await?;
    let snapshot = GroupSnapshot::read(ctx, stream, group).await?;
    let selected: BTreeSet<u32> = if shards.is_empty() {
        (0..snapshot.view.shard_count).collect()
    } else {
        shards.iter().copied().collect()
    };
    let count = snapshot.shards.len() as u32;
    if let Some(bad) = selected.iter().find(|&&s| s >= count) {
        return Err(CliError::Refused(format!(
            "shard {bad} does not exist: group `{group}` of `{stream}` has shards 0..{}",
            count.saturating_sub(1)
        )));
    }
    let owned = owners(&snapshot.view, &selected);
    if !owned.is_empty() {
        return Err(CliError::Refused(format!(
            "group `{group}` still has owners on shards it would move: {}. Stop its consumers and wait \
             for their leases to pass (`status` shows them), then seek again",
            owned.join(", ")
        )));
    }
    for &shard in &selected {
        let stats = &snapshot.shards[shard as usize];
        if !stats.has_group {
            return Err(CliError::Refused(format!(
                "shard stream {} has no consumer group `{group}`",
                stats.stream
            )));
        }
    }
    let mut table = Table::new(&["SHARD", "STREAM", "BEFORE", "AFTER", "LAG", "PENDING"]);
    let mut moved = Vec::new();
    let mut unknown_lag = Vec::new();
    for &shard in &selected {
        let before = &snapshot.shards[shard as usize];
        let entries_read = stream_listener::lag::set_position(
            &mut ctx.conn,
            &before.stream,
            group,
            to.arg(),
            SEEK_COUNT_LIMIT,
        )
        .await?;
        if entries_read.is_none() {
            unknown_lag.push(shard);
        }
        let after = shard_stats(ctx, stream, group, shard).await?;
        table.row(vec![
            shard.to_string(),
            after.stream.clone(),
            or_dash(before.last_delivered_id.as_deref()),
            or_dash(after.last_delivered_id.as_deref()),
            or_dash(after.lag),
            or_dash(after.pending),
        ]);
        moved.push(serde_json::json!({
            "shard": shard,
            "stream": after.stream,
            "before": before.last_delivered_id,
            "after": after.last_delivered_id,
            "lag": after.lag,
            "pending": after.pending,
            "entriesRead": entries_read,
        }));
    }
    if json {
        return Ok(json_text(
            &serde_json::json!({ "group": group, "shards": moved }),
        ));
    }
    let mut out = format!(
        "group `{group}` of `{stream}` moved to {} on {} shard{}\n\n",
        to.arg(),
        selected.len(),
        if selected.len() == 1 { "" } else { "s" }
    );
    out.push_str(&table.render());
    if !unknown_lag.is_empty() {
        out.push_str(&format!(
            "\nnote: Redis reports no lag on shard{} {} (a server before 7, or more than {SEEK_COUNT_LIMIT} \
             entries after the position); the lag exporter counts it instead\n",
            if unknown_lag.len() == 1 { "" } else { "s" },
            unknown_lag
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if moved.iter().any(|m| m["pending"].as_u64().unwrap_or(0) > 0) {
        out.push_str(
            "\nnote: entries already pending stay pending; the next owner claims and handles them\n",
        );
    }
    Ok(out)
}

/// `shard N: member M (what)` for every selected shard a non-tombstone member has anything to do with.
fn owners(view: &GroupProjection, selected: &BTreeSet<u32>) -> Vec<String> {
    let mut found = Vec::new();
    for m in view.members.iter().filter(|m| !is_tombstone(m)) {
        for (what, list) in [
            ("owns", &m.owned),
            ("assigned", &m.assigned),
            ("pending", &m.pending),
            ("revoking", &m.revoking),
        ] {
            for shard in list.iter().filter(|s| selected.contains(s)) {
                found.push(format!("shard {shard}: member {} ({what})", m.member_id));
            }
        }
    }
    for shard in &view.shards {
        if let Some(holder) = shard
            .fenced_hold
            .as_ref()
            .filter(|_| selected.contains(&shard.shard_index))
        {
            found.push(format!(
                "shard {}: held for fenced member {holder} until its lease passes",
                shard.shard_index
            ));
        }
    }
    found.sort();
    found.dedup();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_parse() {
        assert_eq!(Position::parse("earliest"), Ok(Position::Earliest));
        assert_eq!(Position::parse("latest"), Ok(Position::Latest));
        assert_eq!(
            Position::parse("1700000000000-3"),
            Ok(Position::Id("1700000000000-3".into()))
        );
        assert_eq!(Position::parse("17"), Ok(Position::Id("17".into())));
        for bad in ["", "-", "x-1", "1-", "1-2-3", "$"] {
            assert!(Position::parse(bad).is_err(), "{bad}");
        }
    }
}
