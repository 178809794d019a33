//! What the spec's HTTP clients send and expect, translated to and from our coordinator's wire types.
//!
//! The heartbeat JSON matches ours field by field, but the origin's Python client and Spring starter read
//! a few things differently (issue #26, items 1-5). Every difference is handled here, as pure functions,
//! so the routes stay thin and each adaptation is unit-tested on its own:
//! 1. store trouble is answered `200 RETRY` with a complete body ([`retry`]): the Python client dies on
//!    any status >= 400 or a missing key;
//! 2. `INVALID_REQUEST` / `UNSUPPORTED_PROTOCOL` echo the request's `memberEpoch` ([`response`]): the
//!    Python client adopts the returned epoch, and 0 would make it send a join that still lists shards;
//! 3. Spring's graceful leave lists the same shards in `ownedShards` and `revokingShards`; an absent
//!    `ownedShards` means "none" for these clients (they always send a full report); duplicates are a set
//!    ([`request`]);
//! 4. `SYNC_METADATA` and `REVOKE_PENDING` become `OK` ([`response`]): for us both mean "accepted, apply
//!    `assignedShards`", which is what `OK` means to those clients, while the Python client stops reading
//!    every shard for an interval after either.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use stream_listener::coordinator::metadata::GroupConfig;
use stream_listener::coordinator::wire::{
    Assignment, HeartbeatRequest, HeartbeatResponse, HeartbeatStatus, RevokeState, PROTOCOL_VERSION,
};

/// A heartbeat body the coordinator must not see: answered at once with this status (HTTP 200).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `INVALID_REQUEST` or `UNSUPPORTED_PROTOCOL`.
    pub status: HeartbeatStatus,
    /// Why, for the log (the wire shape has no message field).
    pub reason: String,
    /// The request's `requestId`, if it had one.
    pub request_id: String,
    /// The request's `memberEpoch` (echoed), 0 if it had none.
    pub member_epoch: i64,
}

/// Timings to put in a response the coordinator did not write (a refusal or a `RETRY`): the group's as
/// last seen by this server, else the library's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// `heartbeatIntervalMs`: the Python client waits this long before its next heartbeat.
    pub heartbeat_interval_ms: i64,
    /// `rebalanceTimeoutMs`.
    pub rebalance_timeout_ms: i64,
    /// `sessionTimeoutMs` (ours).
    pub session_timeout_ms: i64,
}

impl Default for Timings {
    fn default() -> Self {
        let config = GroupConfig::default();
        Self {
            heartbeat_interval_ms: config.heartbeat_interval_ms,
            rebalance_timeout_ms: config.rebalance_timeout_ms,
            session_timeout_ms: config.session_timeout_ms,
        }
    }
}

impl Timings {
    /// The timings a coordinator response carries.
    pub fn of(response: &HeartbeatResponse) -> Self {
        Self {
            heartbeat_interval_ms: response.heartbeat_interval_ms,
            rebalance_timeout_ms: response.rebalance_timeout_ms,
            session_timeout_ms: response.session_timeout_ms,
        }
    }
}

/// The heartbeat a client's JSON body asks for, normalised as described in the module doc (item 3), or
/// the refusal to answer. `path_member` is the `{member}` of the URL: a body naming another member is
/// refused.
pub fn request(body: &Value, path_member: &str) -> Result<HeartbeatRequest, Refusal> {
    let refusal = |status, reason: String| Refusal {
        status,
        reason,
        request_id: body
            .get("requestId")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        member_epoch: body
            .get("memberEpoch")
            .and_then(Value::as_i64)
            .unwrap_or_default(),
    };
    let Some(object) = body.as_object() else {
        return Err(refusal(
            HeartbeatStatus::InvalidRequest,
            "the body is not a JSON object".into(),
        ));
    };
    if let Some(version) = object.get("protocolVersion").and_then(Value::as_i64) {
        if version != i64::from(PROTOCOL_VERSION) {
            return Err(refusal(
                HeartbeatStatus::UnsupportedProtocol,
                format!("protocolVersion {version} is not spoken here (only {PROTOCOL_VERSION})"),
            ));
        }
    }
    let mut object = object.clone();
    normalise_ownership(&mut object)
        .map_err(|reason| refusal(HeartbeatStatus::InvalidRequest, reason))?;
    let req: HeartbeatRequest = serde_json::from_value(Value::Object(object))
        .map_err(|e| refusal(HeartbeatStatus::InvalidRequest, e.to_string()))?;
    if req.member_id != path_member {
        return Err(refusal(
            HeartbeatStatus::InvalidRequest,
            format!(
                "memberId {:?} of the body is not the URL's {path_member:?}",
                req.member_id
            ),
        ));
    }
    Ok(req)
}

/// Item 3: `ownedShards` absent or `null` becomes `[]`; duplicates in it are dropped; several reports of
/// one shard in `revokingShards` become the most advanced one (REVOKED > DRAINING > REVOKING); a shard
/// both owned and revoking counts as revoking (the member is giving it up: Spring's leave lists every
/// shard in both).
fn normalise_ownership(object: &mut serde_json::Map<String, Value>) -> Result<(), String> {
    let index = |shard: &Value| shard.get("shardIndex").and_then(Value::as_u64);
    let mut revoking: BTreeMap<u64, Value> = BTreeMap::new();
    match object.get("revokingShards") {
        None | Some(Value::Null) => {}
        Some(Value::Array(reports)) => {
            for report in reports {
                let shard = report
                    .get("shard")
                    .and_then(index)
                    .ok_or("a revokingShards entry has no shard.shardIndex")?;
                let state = |r: &Value| -> Option<RevokeState> {
                    serde_json::from_value(r.get("state")?.clone()).ok()
                };
                let replace = match revoking.get(&shard) {
                    None => true,
                    Some(kept) => state(report) > state(kept),
                };
                if replace {
                    revoking.insert(shard, report.clone());
                }
            }
        }
        Some(_) => return Err("revokingShards is not an array".into()),
    }
    let owned: BTreeSet<u64> = match object.get("ownedShards") {
        None | Some(Value::Null) => BTreeSet::new(),
        Some(Value::Array(shards)) => shards
            .iter()
            .map(|s| index(s).ok_or("an ownedShards entry has no shardIndex"))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("ownedShards is not an array".into()),
    };
    let owned: Vec<Value> = owned
        .into_iter()
        .filter(|s| !revoking.contains_key(s))
        .map(|s| serde_json::json!({ "shardIndex": s }))
        .collect();
    object.insert("ownedShards".into(), Value::Array(owned));
    object.insert(
        "revokingShards".into(),
        Value::Array(revoking.into_values().collect()),
    );
    Ok(())
}

/// The answer to a refused body (item 2: the request's epoch, echoed).
pub fn refused(refusal: &Refusal, member_id: &str, timings: Timings) -> HeartbeatResponse {
    HeartbeatResponse {
        member_epoch: refusal.member_epoch,
        ..blank(
            &refusal.request_id,
            refusal.status,
            member_id,
            refusal.member_epoch,
            timings,
        )
    }
}

/// Item 1: `RETRY`, with every field the clients read, for a heartbeat the store could not apply. The
/// Python client keeps its state and stops reading until the next `OK`; Spring ignores it.
pub fn retry(req: &HeartbeatRequest, timings: Timings) -> HeartbeatResponse {
    blank(
        &req.request_id,
        HeartbeatStatus::Retry,
        &req.member_id,
        req.member_epoch,
        timings,
    )
}

fn blank(
    request_id: &str,
    status: HeartbeatStatus,
    member_id: &str,
    member_epoch: i64,
    timings: Timings,
) -> HeartbeatResponse {
    HeartbeatResponse {
        response_to: request_id.to_string(),
        status,
        member_id: member_id.to_string(),
        member_epoch,
        heartbeat_interval_ms: timings.heartbeat_interval_ms,
        rebalance_timeout_ms: timings.rebalance_timeout_ms,
        session_timeout_ms: timings.session_timeout_ms,
        group_epoch: 0,
        assignment_epoch: 0,
        metadata_version: 0,
        shard_count: 0,
        assignment: Assignment::default(),
    }
}

/// The coordinator's answer as these clients must read it (items 2 and 4).
pub fn response(req: &HeartbeatRequest, mut response: HeartbeatResponse) -> HeartbeatResponse {
    match response.status {
        HeartbeatStatus::SyncMetadata | HeartbeatStatus::RevokePending => {
            response.status = HeartbeatStatus::Ok;
        }
        HeartbeatStatus::InvalidRequest | HeartbeatStatus::UnsupportedProtocol => {
            response.member_epoch = req.member_epoch;
        }
        _ => {}
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use stream_listener::coordinator::wire::ShardId;

    fn python_heartbeat(epoch: i64, owned: &[u32]) -> Value {
        json!({
            "protocolVersion": 1, "requestId": "r-1", "memberId": "py-m0", "memberName": "py-m0",
            "memberEpoch": epoch, "metadataVersion": 3,
            "runtimeConsumerCapacity": {"runtimeMaxConcurrency": 1, "availableConcurrency": 1},
            "ownedShards": owned.iter().map(|s| json!({"shardIndex": s})).collect::<Vec<_>>(),
            "revokingShards": [], "shardProgress": []
        })
    }

    #[test]
    fn python_heartbeat_passes_unchanged() {
        let req = request(&python_heartbeat(7, &[2, 0]), "py-m0").unwrap();
        assert_eq!(req.member_epoch, 7);
        assert_eq!(
            req.owned_shards,
            Some(vec![ShardId::new(0), ShardId::new(2)])
        );
        assert!(req.revoking_shards.is_empty());
    }

    #[test]
    fn spring_leave_counts_shards_in_both_lists_as_revoking() {
        let body = json!({
            "protocolVersion": 1, "requestId": "r-2", "memberId": "jvm-m0", "memberEpoch": -1,
            "metadataVersion": 4,
            "runtimeConsumerCapacity": {"runtimeMaxConcurrency": 4, "availableConcurrency": 4},
            "ownedShards": [{"shardIndex": 1}, {"shardIndex": 3}],
            "revokingShards": [
                {"shard": {"shardIndex": 1}, "state": "REVOKED", "inFlight": 0, "ackedAt": "2026-01-01T00:00:00Z"},
                {"shard": {"shardIndex": 3}, "state": "DRAINING", "inFlight": 1},
                {"shard": {"shardIndex": 3}, "state": "REVOKED", "inFlight": 0}
            ]
        });
        let req = request(&body, "jvm-m0").unwrap();
        assert_eq!(req.owned_shards, Some(vec![]));
        let states: Vec<(u32, RevokeState)> = req
            .revoking_shards
            .iter()
            .map(|r| (r.shard.shard_index, r.state))
            .collect();
        assert_eq!(
            states,
            [(1, RevokeState::Revoked), (3, RevokeState::Revoked)]
        );
    }

    #[test]
    fn absent_owned_shards_means_none_and_duplicates_are_a_set() {
        let mut body = python_heartbeat(5, &[]);
        body.as_object_mut().unwrap().remove("ownedShards");
        assert_eq!(request(&body, "py-m0").unwrap().owned_shards, Some(vec![]));
        let req = request(&python_heartbeat(5, &[4, 4, 1]), "py-m0").unwrap();
        assert_eq!(
            req.owned_shards,
            Some(vec![ShardId::new(1), ShardId::new(4)])
        );
    }

    #[test]
    fn refusals_echo_the_request_epoch() {
        let mut body = python_heartbeat(42, &[1]);
        body["protocolVersion"] = json!(2);
        let refusal = request(&body, "py-m0").unwrap_err();
        assert_eq!(refusal.status, HeartbeatStatus::UnsupportedProtocol);
        let answer = refused(&refusal, "py-m0", Timings::default());
        assert_eq!(answer.member_epoch, 42);
        assert_eq!(answer.response_to, "r-1");

        let mut body = python_heartbeat(42, &[1]);
        body.as_object_mut()
            .unwrap()
            .remove("runtimeConsumerCapacity");
        let refusal = request(&body, "py-m0").unwrap_err();
        assert_eq!(refusal.status, HeartbeatStatus::InvalidRequest);
        assert_eq!(refusal.member_epoch, 42);

        let refusal = request(&python_heartbeat(42, &[]), "other").unwrap_err();
        assert_eq!(refusal.status, HeartbeatStatus::InvalidRequest);
        assert!(refusal.reason.contains("other"), "{}", refusal.reason);

        let coordinator_refusal = HeartbeatResponse {
            member_epoch: 0,
            ..retry(
                &request(&python_heartbeat(9, &[]), "py-m0").unwrap(),
                Timings::default(),
            )
        };
        let req = request(&python_heartbeat(9, &[]), "py-m0").unwrap();
        for status in [
            HeartbeatStatus::InvalidRequest,
            HeartbeatStatus::UnsupportedProtocol,
        ] {
            let answer = response(
                &req,
                HeartbeatResponse {
                    status,
                    ..coordinator_refusal.clone()
                },
            );
            assert_eq!((answer.status, answer.member_epoch), (status, 9));
        }
    }

    #[test]
    fn accepted_statuses_become_ok_and_rejoins_stay() {
        let req = request(&python_heartbeat(9, &[]), "py-m0").unwrap();
        let base = HeartbeatResponse {
            member_epoch: 11,
            ..retry(&req, Timings::default())
        };
        for (ours, theirs) in [
            (HeartbeatStatus::SyncMetadata, HeartbeatStatus::Ok),
            (HeartbeatStatus::RevokePending, HeartbeatStatus::Ok),
            (HeartbeatStatus::Ok, HeartbeatStatus::Ok),
            (
                HeartbeatStatus::FencedMemberEpoch,
                HeartbeatStatus::FencedMemberEpoch,
            ),
            (
                HeartbeatStatus::UnknownMemberId,
                HeartbeatStatus::UnknownMemberId,
            ),
            (HeartbeatStatus::Retry, HeartbeatStatus::Retry),
        ] {
            let answer = response(
                &req,
                HeartbeatResponse {
                    status: ours,
                    ..base.clone()
                },
            );
            assert_eq!(
                (answer.status, answer.member_epoch),
                (theirs, 11),
                "{ours:?}"
            );
        }
    }

    #[test]
    fn retry_has_every_field_the_python_client_reads() {
        let req = request(&python_heartbeat(9, &[1]), "py-m0").unwrap();
        let json = serde_json::to_value(retry(&req, Timings::default())).unwrap();
        for key in [
            "status",
            "memberId",
            "memberEpoch",
            "heartbeatIntervalMs",
            "groupEpoch",
            "assignmentEpoch",
            "metadataVersion",
        ] {
            assert!(json.get(key).is_some(), "{key} missing in {json}");
        }
        assert_eq!(json["status"], "RETRY");
        assert_eq!(json["memberEpoch"], 9);
        assert!(json["heartbeatIntervalMs"].as_i64().unwrap() > 0);
        assert_eq!(json["assignment"]["assignedShards"], json!([]));
    }
}
