//! `watch`: a live view of one group, redrawn every interval, in the spirit of `top`.
//!
//! Each refresh reads a [`GroupSnapshot`] and draws it with [`render`], a pure function of the snapshot
//! and the previous one (for rates), so frames are tested as text. On a terminal each frame replaces the
//! previous one (cursor home, clear screen); otherwise frames are printed one after the other, separated
//! by a blank line, which suits logs and tests.

use std::fmt::Write as _;
use std::io::{IsTerminal as _, Write as _};
use std::time::Duration;

use crate::commands::status::{lease_left, member_label, resharding};
use crate::error::CliError;
use crate::redis_ctx::Ctx;
use crate::snapshot::{visible_members, GroupSnapshot, ShardStats};
use crate::table::{label, or_dash, seconds, shard_list, utc, Table};

/// ANSI: cursor home, clear screen.
const CLEAR: &str = "\x1b[H\x1b[2J";

/// Redraws the view of `group` every `interval` until ctrl-c, or `iterations` frames when given.
pub async fn run(
    ctx: &mut Ctx,
    stream: &str,
    group: &str,
    interval: Duration,
    iterations: Option<u64>,
    all: bool,
    json: bool,
) -> Result<String, CliError> {
    // JSON Lines: one `status --json` object per refresh, never a screen clear.
    let terminal = !json && std::io::stdout().is_terminal();
    let mut previous: Option<GroupSnapshot> = None;
    let mut frame = 0u64;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let snapshot = GroupSnapshot::read(ctx, stream, group).await?;
        let text = if json {
            let mut line = super::status::json_value(&snapshot, all).to_string();
            line.push('\n');
            line
        } else {
            render(&snapshot, previous.as_ref(), interval, all)
        };
        {
            let mut stdout = std::io::stdout().lock();
            let written = if terminal {
                write!(stdout, "{CLEAR}{text}")
            } else if frame == 0 || json {
                write!(stdout, "{text}")
            } else {
                write!(stdout, "\n{text}")
            };
            // A closed stdout (`watch | head`) ends the view.
            if written.and_then(|()| stdout.flush()).is_err() {
                return Ok(String::new());
            }
        }
        frame += 1;
        if iterations.is_some_and(|n| frame >= n) {
            return Ok(String::new());
        }
        previous = Some(snapshot);
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = &mut ctrl_c => return Ok(String::new()),
        }
    }
}

/// One frame: header (group, time, state, epochs, backlog and rates), members, then shards.
///
/// Rates are per second between `previous` and `current` (Redis time): consumed from the group's
/// `entries-read` (or entries added minus lag), produced from the shard streams' `entries-added`; `-` on
/// the first frame or when Redis (< 7) cannot tell.
pub fn render(
    current: &GroupSnapshot,
    previous: Option<&GroupSnapshot>,
    interval: Duration,
    all: bool,
) -> String {
    let view = &current.view;
    let elapsed_ms = previous
        .map(|p| current.now_ms - p.now_ms)
        .filter(|&ms| ms > 0);
    let rate = |now: Option<u64>, before: Option<u64>| match (now, before, elapsed_ms) {
        (Some(now), Some(before), Some(ms)) => {
            format!(
                "{:.1}/s",
                now.saturating_sub(before) as f64 * 1000.0 / ms as f64
            )
        }
        _ => "-".to_string(),
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}/{}  {}  every {}, ctrl-c quits",
        current.stream,
        view.group,
        utc(current.now_ms),
        seconds(interval.as_millis() as i64)
    );
    let _ = writeln!(
        out,
        "state {}  group epoch {}  assignment epoch {}  shards {}  revision {}",
        label(&view.state),
        view.group_epoch,
        view.assignment_epoch,
        view.shard_count,
        current.revision
    );
    let _ = writeln!(out, "resharding {}", resharding(view.resharding.as_ref()));
    let _ = writeln!(
        out,
        "lag {}  pending {}  consumed {}  produced {}",
        current.total_lag(),
        current.total_pending(),
        rate(
            current.total_consumed(),
            previous.and_then(GroupSnapshot::total_consumed)
        ),
        rate(
            current.total_added(),
            previous.and_then(GroupSnapshot::total_added)
        ),
    );
    if !view.invariant_violations.is_empty() {
        let _ = writeln!(
            out,
            "INVARIANT VIOLATIONS: {}",
            view.invariant_violations.join("; ")
        );
    }
    out.push('\n');

    let (shown, hidden) = visible_members(view, all);
    let mut members = Table::new(&[
        "MEMBER", "STATE", "EPOCH", "LEASE", "SHARDS", "PENDING", "REVOKING",
    ]);
    for m in &shown {
        members.row(vec![
            member_label(m),
            label(&m.state),
            m.member_epoch.to_string(),
            lease_left(m, current.now_ms),
            shard_list(&m.assigned),
            shard_list(&m.pending),
            shard_list(&m.revoking),
        ]);
    }
    if members.is_empty() {
        members.row(vec!["(no members)".to_string()]);
    }
    out.push_str(&members.render());
    if hidden > 0 {
        let _ = writeln!(out, "({hidden} tombstones hidden; --all shows them)");
    }
    out.push('\n');

    let mut shards = Table::new(&[
        "SHARD",
        "OWNER",
        "LENGTH",
        "LAG",
        "PENDING",
        "LAST DELIVERED",
        "RATE",
    ]);
    for stats in &current.shards {
        let owners = view.shards.get(stats.shard as usize);
        let owner = owners.and_then(|s| {
            s.current.clone().or_else(|| {
                s.fenced_hold
                    .as_ref()
                    .map(|holder| format!("{holder} (fenced)"))
            })
        });
        let before = previous.and_then(|p| p.shards.get(stats.shard as usize));
        shards.row(vec![
            stats.shard.to_string(),
            or_dash(owner),
            or_dash(stats.length),
            stats.lag_text(),
            or_dash(stats.pending),
            or_dash(stats.last_delivered_id.as_deref()),
            rate(stats.consumed(), before.and_then(ShardStats::consumed)),
        ]);
    }
    out.push_str(&shards.render());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use stream_listener::coordinator::metadata::MemberState;
    use stream_listener::coordinator::projection::{
        GroupProjection, GroupState, MemberView, ShardView,
    };

    fn member(id: &str, state: MemberState, epoch: i64, lease: i64, shards: &[u32]) -> MemberView {
        MemberView {
            member_id: id.to_string(),
            member_name: None,
            state,
            member_epoch: epoch,
            lease_deadline_ms: lease,
            weight: 1,
            runtime_max_concurrency: 2,
            available_concurrency: 1,
            assigned: shards.to_vec(),
            pending: vec![],
            owned: shards.to_vec(),
            revoking: vec![],
            reconciled: true,
            duplicate_suspected: false,
            restarting: false,
        }
    }

    fn snapshot(now_ms: i64, read: [u64; 2], lag: [u64; 2]) -> GroupSnapshot {
        let view = GroupProjection {
            group: "billing".into(),
            state: GroupState::Stable,
            shard_count: 2,
            group_epoch: 4,
            assignment_epoch: 3,
            metadata_version: 9,
            at_ms: now_ms,
            session_timeout_ms: 10_000,
            members: vec![
                member("a", MemberState::Stable, 5, now_ms + 9_500, &[0]),
                member("b", MemberState::Stable, 6, now_ms + 8_000, &[1]),
                member("old", MemberState::Expired, 2, 0, &[]),
            ],
            shards: (0..2)
                .map(|i| ShardView {
                    shard_index: i,
                    target: Some(["a", "b"][i as usize].into()),
                    current: Some(["a", "b"][i as usize].into()),
                    fenced_hold: None,
                })
                .collect(),
            resharding: None,
            invariant_violations: vec![],
        };
        GroupSnapshot {
            stream: "orders".into(),
            revision: 17,
            now_ms,
            view,
            committed_at_ms: None,
            topology_count: Some(2),
            shards: (0..2)
                .map(|i| ShardStats {
                    shard: i as u32,
                    stream: format!("orders:{i}"),
                    exists: true,
                    length: Some(read[i] + lag[i]),
                    has_group: true,
                    lag: Some(lag[i]),
                    lag_exact: true,
                    pending: Some(1),
                    last_delivered_id: Some(format!("1700000000000-{}", read[i])),
                    entries_read: Some(read[i]),
                    entries_added: Some(read[i] + lag[i]),
                })
                .collect(),
        }
    }

    #[test]
    fn first_frame_has_no_rates_and_hides_tombstones() {
        let frame = render(
            &snapshot(1_764_531_000_000, [10, 20], [5, 0]),
            None,
            Duration::from_secs(1),
            false,
        );
        let expected = "\
orders/billing  2025-11-30T19:30:00.000Z  every 1.0s, ctrl-c quits
state STABLE  group epoch 4  assignment epoch 3  shards 2  revision 17
resharding none
lag 5  pending 2  consumed -  produced -

MEMBER  STATE   EPOCH  LEASE  SHARDS  PENDING  REVOKING
a       STABLE  5      9.5s   0       -        -
b       STABLE  6      8.0s   1       -        -
(1 tombstones hidden; --all shows them)

SHARD  OWNER  LENGTH  LAG  PENDING  LAST DELIVERED    RATE
0      a      15      5    1        1700000000000-10  -
1      b      20      0    1        1700000000000-20  -
";
        assert_eq!(frame, expected);
    }

    #[test]
    fn next_frames_show_rates_and_all_shows_tombstones() {
        let before = snapshot(1_764_531_000_000, [10, 20], [5, 0]);
        // Two seconds later: shard 0 read 10 more, shard 1 read 4 more and got 6 new entries.
        let after = snapshot(1_764_531_002_000, [20, 24], [0, 2]);
        let frame = render(&after, Some(&before), Duration::from_secs(2), true);
        assert!(
            frame.contains("lag 2  pending 2  consumed 7.0/s  produced 5.5/s"),
            "{frame}"
        );
        assert!(frame.contains("old     EXPIRED  2      -"), "{frame}");
        assert!(!frame.contains("hidden"), "{frame}");
        let shard_rows: Vec<&str> = frame.lines().rev().take(2).collect();
        assert!(shard_rows[1].ends_with("5.0/s"), "{frame}");
        assert!(shard_rows[0].ends_with("2.0/s"), "{frame}");
    }
}
