//! The origin's monitoring views of one group (`GroupResponse`, `MemberMetadata`,
//! `AssignmentsResponse`), computed from the library's monitoring projection. Enum names are mapped
//! where the origin's API names them differently (member `JOINING` is its `STARTING`, `STABLE` its
//! `ACTIVE`), not passed through.

use std::collections::BTreeMap;

use serde_json::{json, Value};
use stream_listener::coordinator::metadata::MemberState;
use stream_listener::coordinator::projection::GroupProjection;

/// The origin's name of a member state.
pub fn member_state(state: MemberState) -> &'static str {
    match state {
        MemberState::Joining => "STARTING",
        MemberState::Stable => "ACTIVE",
        MemberState::Leaving => "LEAVING",
        MemberState::Expired => "EXPIRED",
        MemberState::Fenced => "FENCED",
    }
}

fn shards(list: &[u32]) -> Vec<Value> {
    list.iter().map(|s| json!({ "shardIndex": s })).collect()
}

/// `GroupResponse`.
pub fn group(stream: &str, p: &GroupProjection) -> Value {
    let live = p
        .members
        .iter()
        .filter(|m| !matches!(m.state, MemberState::Expired | MemberState::Fenced))
        .count();
    json!({
        "streamPrefix": stream,
        "consumerGroup": p.group,
        "state": p.state,
        "groupEpoch": p.group_epoch,
        "assignmentEpoch": p.assignment_epoch,
        "metadataVersion": p.metadata_version,
        "shardCount": p.shard_count,
        "memberCount": live,
        "resharding": p.resharding,
    })
}

/// `{"members": [MemberMetadata]}`: live members, then tombstones.
pub fn members(p: &GroupProjection) -> Value {
    let members: Vec<Value> = p
        .members
        .iter()
        .map(|m| {
            json!({
                "memberId": m.member_id,
                "memberName": m.member_name,
                "state": member_state(m.state),
                "memberEpoch": m.member_epoch,
                "leaseDeadlineMs": m.lease_deadline_ms,
                "currentAssignment": shards(&m.owned),
                "assignedShards": shards(&m.assigned),
                "pendingShards": shards(&m.pending),
                "revoking": shards(&m.revoking),
                "runtimeMaxConcurrency": m.runtime_max_concurrency,
                "duplicateSuspected": m.duplicate_suspected,
            })
        })
        .collect();
    json!({ "members": members })
}

/// `AssignmentsResponse`: target and current assignment by member, what each is revoking, broken
/// invariants; and ours: the shards in a fenced hold, by the member they are held for.
pub fn assignments(p: &GroupProjection) -> Value {
    let mut target: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    let mut current: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    let mut held: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for shard in &p.shards {
        if let Some(owner) = &shard.target {
            target.entry(owner).or_default().push(shard.shard_index);
        }
        if let Some(owner) = &shard.current {
            current.entry(owner).or_default().push(shard.shard_index);
        }
        if let Some(member) = &shard.fenced_hold {
            held.entry(member).or_default().push(shard.shard_index);
        }
    }
    let by_member = |map: BTreeMap<&str, Vec<u32>>| -> serde_json::Map<String, Value> {
        map.into_iter()
            .map(|(m, s)| (m.to_string(), Value::Array(shards(&s))))
            .collect()
    };
    let revoking: serde_json::Map<String, Value> = p
        .members
        .iter()
        .filter(|m| !m.revoking.is_empty())
        .map(|m| (m.member_id.clone(), Value::Array(shards(&m.revoking))))
        .collect();
    json!({
        "targetAssignment": by_member(target),
        "currentAssignments": by_member(current),
        "revokeProgress": revoking,
        "fencedHolds": by_member(held),
        "invariantViolations": p.invariant_violations,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use stream_listener::clock::StoreMillis;
    use stream_listener::coordinator::wire::{HeartbeatRequest, RuntimeConsumerCapacity};
    use stream_listener::coordinator::Coordinator;
    use stream_listener::GroupConfig;

    fn join(c: &mut Coordinator, member: &str, now: i64) {
        let req = HeartbeatRequest {
            protocol_version: 1,
            request_id: format!("{member}-1"),
            member_id: member.into(),
            member_name: Some(member.to_uppercase()),
            member_epoch: 0,
            metadata_version: 0,
            runtime_consumer_capacity: RuntimeConsumerCapacity::default(),
            owned_shards: None,
            revoking_shards: vec![],
            shard_progress: vec![],
            weight: None,
            restarting: false,
            hold_after_lease_ms: 0,
        };
        let _ = c.heartbeat(&req, StoreMillis(now));
    }

    #[test]
    fn views_name_states_as_the_origin_does() {
        let mut c = Coordinator::new("g", 4, GroupConfig::default());
        join(&mut c, "a", 0);
        let p = c.projection(StoreMillis(1));
        let members = members(&p);
        assert_eq!(members["members"][0]["state"], "STARTING");
        assert_eq!(members["members"][0]["memberName"], "A");
        let g = group("orders", &p);
        assert_eq!(
            (g["streamPrefix"].as_str(), g["consumerGroup"].as_str()),
            (Some("orders"), Some("g"))
        );
        assert_eq!(g["shardCount"], 4);
        assert_eq!(g["memberCount"], 1);
        let a = assignments(&p);
        assert_eq!(a["invariantViolations"], json!([]));
        assert_eq!(member_state(MemberState::Stable), "ACTIVE");
    }
}
