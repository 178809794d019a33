//! How many heartbeat intervals the protocol itself needs to settle a group whose members all join at
//! once: the pure coordinator and real member sessions on a simulated clock, with instant responses,
//! drains and wake-ups (a commit wakes the members whose shards it granted or revoked, as
//! `store::wakeup` does). This is the protocol's share of a join storm; the coordination bench measures
//! the wall time with a real Redis, where client CPU and round trips add to it.
//!
//! Converged means what the bench means: STABLE, every member live, every shard granted, spread <= 1.

use std::collections::BTreeMap;
use std::sync::Arc;

use stream_listener::clock::{LocalMillis, StoreMillis};
use stream_listener::coordinator::metadata::GroupConfig;
use stream_listener::coordinator::projection::GroupState;
use stream_listener::coordinator::{Coordinator, Creation};
use stream_listener::member::lifecycle::ShardCommand;
use stream_listener::member::session::{MemberIdentity, MemberSession};
use stream_listener::store::wakeup::to_wake;

/// The intervals from the last join until `members` joining a fresh group of `shards` are converged, or
/// `None` within `limit` intervals. Member `i` sends its join at `i * spread_ms / members` ms.
fn intervals_to_converge(
    members: usize,
    shards: u32,
    config: GroupConfig,
    spread_ms: i64,
    limit: i64,
) -> Option<f64> {
    let interval = config.heartbeat_interval_ms;
    let mut coordinator =
        Coordinator::create("storm", shards, config, StoreMillis(0), Creation::Fresh);
    let mut sessions: BTreeMap<String, (MemberSession, i64)> = (0..members)
        .map(|i| {
            let id = format!("m{i}");
            let identity = MemberIdentity {
                member_id: Arc::from(id.as_str()),
                member_name: None,
                weight: 1,
                runtime_max_concurrency: 1,
            };
            let session = MemberSession::new(identity, config.session_timeout_ms, i as u64);
            (id, (session, i as i64 * spread_ms / members as i64))
        })
        .collect();
    let last_join = (members as i64 - 1) * spread_ms / members as i64;
    let mut now = 0;
    while now <= last_join + limit * interval {
        let due: Vec<String> = sessions
            .iter()
            .filter(|(_, (_, at))| *at <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            let (session, next) = sessions.get_mut(&id).expect("listed");
            let request = session.heartbeat(LocalMillis(now), 1);
            let outcome = coordinator.heartbeat(&request, StoreMillis(now));
            let wake: Vec<String> = to_wake(&outcome.events, &[(id.clone(), outcome.events.len())])
                .into_iter()
                .map(str::to_string)
                .collect();
            for command in session.on_response(&outcome.response) {
                // The consumption layer drains at once, as the bench's does.
                if let ShardCommand::Revoke { shard } = command {
                    session.on_revoked(shard);
                }
            }
            *next = now + session.next_heartbeat_delay_ms().max(1);
            for woken in wake {
                if let Some((_, at)) = sessions.get_mut(&woken) {
                    *at = (*at).min(now + 1);
                }
            }
        }
        let _ = coordinator.tick(StoreMillis(now));
        let view = coordinator.projection(StoreMillis(now));
        let counts: Vec<usize> = view.members.iter().map(|m| m.assigned.len()).collect();
        if view.state == GroupState::Stable
            && view.members.len() == members
            && counts.iter().sum::<usize>() == shards as usize
            && counts.iter().max().unwrap_or(&0) - counts.iter().min().unwrap_or(&0) <= 1
        {
            return Some((now - last_join) as f64 / interval as f64);
        }
        now += 1;
    }
    None
}

#[test]
fn a_join_storm_of_256_members_at_100_ms_heartbeats_converges_within_10_intervals() {
    let config = GroupConfig {
        heartbeat_interval_ms: 100,
        session_timeout_ms: 3_000,
        rebalance_timeout_ms: 10_000,
    };
    // All within the new group's first two intervals (which grant nothing), and spread over ten.
    for spread_ms in [0, 100, 1_000] {
        let took = intervals_to_converge(256, 256, config, spread_ms, 40);
        eprintln!("256 members at 100 ms, joins spread over {spread_ms} ms: {took:?} intervals");
        let took = took.expect("converged");
        assert!(
            took <= 10.0,
            "{took} intervals with joins spread over {spread_ms} ms"
        );
    }
}

#[test]
fn a_join_storm_of_2000_members_at_1_s_heartbeats_converges_within_6_intervals() {
    let config = GroupConfig::default();
    let took = intervals_to_converge(2_000, 4_096, config, 500, 30);
    eprintln!("2000 members at 1 s: {took:?} intervals");
    let took = took.expect("converged");
    assert!(took <= 6.0, "{took} intervals");
}
