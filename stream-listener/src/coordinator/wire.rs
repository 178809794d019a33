//! The heartbeat's wire shape (`shared/spec/heartbeat-wire.md`): serde, camelCase, the spec's enum values.
//!
//! These types are the interface the spec's clients in other languages speak, so field names and enum
//! values must not drift. Extra fields of our own are allowed (`weight`), missing ones are not.

use serde::{Deserialize, Serialize};

/// The heartbeat protocol version this crate speaks.
pub const PROTOCOL_VERSION: u32 = 1;

/// The `memberEpoch` a member sends to leave the group.
pub const LEAVE_EPOCH: i64 = -1;

/// The `memberEpoch` a member sends to join, or to rejoin after `UNKNOWN_MEMBER_ID` / `FENCED_MEMBER_EPOCH`.
pub const JOIN_EPOCH: i64 = 0;

/// One shard of a logical stream, on the wire as `{"shardIndex": n}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardId {
    /// Index of the shard, `0..shard_count`.
    pub shard_index: u32,
}

impl ShardId {
    /// The shard with this index.
    pub const fn new(shard_index: u32) -> Self {
        Self { shard_index }
    }
}

impl From<u32> for ShardId {
    fn from(shard_index: u32) -> Self {
        Self { shard_index }
    }
}

/// What a member tells the coordinator, at every heartbeat interval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatRequest {
    /// Always [`PROTOCOL_VERSION`] for this crate.
    pub protocol_version: u32,
    /// Unique per request; a retry of a request whose response was lost reuses it.
    pub request_id: String,
    /// Stable identity of the logical member (for example `10.1.2.3-m0`).
    pub member_id: String,
    /// Human label, such as the handler's name.
    #[serde(default)]
    pub member_name: Option<String>,
    /// 0 = join or rejoin, -1 = leave, otherwise the epoch the coordinator last issued to this member.
    pub member_epoch: i64,
    /// The group metadata version the member last applied.
    pub metadata_version: i64,
    /// Local worker capacity. Reported for monitoring only: never used to balance (the spec).
    pub runtime_consumer_capacity: RuntimeConsumerCapacity,
    /// The shards the member reads now. A full heartbeat carries it; absent means unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owned_shards: Option<Vec<ShardId>>,
    /// Shards the member is giving up, with how far the hand-off has come.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub revoking_shards: Vec<RevokingShard>,
    /// Local progress per owned shard, for monitoring.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shard_progress: Vec<ShardProgress>,
    /// Static balancing weight of this member (ours, not the spec's): configuration, never runtime load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// Ours, on a leave (epoch -1) only: the member restarts under the same memberId, so the group keeps
    /// its target for it until its lease passes (Kafka's static membership, KIP-345) instead of moving its
    /// shards away and back. It still gives every shard back (REVOKED) before it goes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restarting: bool,
    /// Ours, set on a join by the HTTP server (`stream-listener serve`) for the spec's Python and Spring
    /// clients, which do not self-fence and read without our Redis-side fences: such a member may still
    /// read after its lease passed, so when it expires or is fenced its shards stay in a fenced hold for
    /// this long past its lease. 0 (a member of this library): free when the lease passes. At most
    /// [`MAX_HOLD_AFTER_LEASE_MS`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hold_after_lease_ms: i64,
}

/// The longest [`HeartbeatRequest::hold_after_lease_ms`] accepted: one day.
pub const MAX_HOLD_AFTER_LEASE_MS: i64 = 86_400_000;

pub(crate) fn is_zero(value: &i64) -> bool {
    *value == 0
}

/// Local worker capacity of a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeConsumerCapacity {
    /// Configured local workers (>= 1).
    pub runtime_max_concurrency: u32,
    /// Workers idle right now.
    pub available_concurrency: u32,
}

impl Default for RuntimeConsumerCapacity {
    fn default() -> Self {
        Self {
            runtime_max_concurrency: 1,
            available_concurrency: 1,
        }
    }
}

/// How far a member has come in giving up one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RevokeState {
    /// The member has seen the revocation and stopped new reads.
    Revoking,
    /// In-flight handlers are finishing and acknowledging.
    Draining,
    /// Nothing of the shard is in flight any more: the coordinator may hand it on.
    Revoked,
}

/// One entry of `revokingShards`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RevokingShard {
    /// The shard being given up.
    pub shard: ShardId,
    /// How far the hand-off has come.
    pub state: RevokeState,
    /// Handler executions of this shard still running.
    #[serde(default)]
    pub in_flight: u32,
    /// When the member finished (RFC 3339), if it has.
    #[serde(default)]
    pub acked_at: Option<String>,
}

/// One entry of `shardProgress`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardProgress {
    /// The shard.
    pub shard: ShardId,
    /// Its Redis stream key.
    pub stream_key: String,
    /// Last entry id read.
    #[serde(default)]
    pub last_delivered_id: Option<String>,
    /// Last entry id acknowledged.
    #[serde(default)]
    pub last_acked_id: Option<String>,
    /// Entries read but not yet acknowledged.
    #[serde(default)]
    pub pending_count: u64,
    /// When the member last updated this (RFC 3339).
    #[serde(default)]
    pub updated_at: Option<String>,
}

/// The outcome class of a heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum HeartbeatStatus {
    /// Accepted; apply `assignment`.
    Ok,
    /// Transient trouble (for example a store conflict that ran out of retries): send again.
    Retry,
    /// Accepted, but the member's `metadataVersion` was stale: apply `assignment` (reconciliation).
    SyncMetadata,
    /// Accepted; the member still holds shards it must revoke (those missing from `assignedShards`).
    RevokePending,
    /// The coordinator does not know this member: drop all ownership and rejoin with epoch 0.
    UnknownMemberId,
    /// The member's epoch is stale or it was fenced: drop all ownership and rejoin with epoch 0.
    FencedMemberEpoch,
    /// `protocolVersion` is not spoken here.
    UnsupportedProtocol,
    /// The request is malformed; nothing was changed.
    InvalidRequest,
}

impl HeartbeatStatus {
    /// Whether the member must drop everything it owns and rejoin with epoch 0.
    pub fn requires_rejoin(self) -> bool {
        matches!(self, Self::UnknownMemberId | Self::FencedMemberEpoch)
    }

    /// Whether the heartbeat was accepted and `assignment` is authoritative.
    pub fn is_accepted(self) -> bool {
        matches!(self, Self::Ok | Self::SyncMetadata | Self::RevokePending)
    }
}

/// What the coordinator answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatResponse {
    /// The request's `requestId`.
    pub response_to: String,
    /// Outcome class.
    pub status: HeartbeatStatus,
    /// The member this answers.
    pub member_id: String,
    /// The epoch the member must send next (0 after a rejection that requires a rejoin).
    pub member_epoch: i64,
    /// How often to heartbeat.
    pub heartbeat_interval_ms: i64,
    /// How long a revocation may take before the member is fenced.
    pub rebalance_timeout_ms: i64,
    /// Lease length: a member that cannot heartbeat for this long is expired.
    #[serde(default)]
    pub session_timeout_ms: i64,
    /// The group epoch.
    pub group_epoch: i64,
    /// The target assignment epoch.
    pub assignment_epoch: i64,
    /// The group metadata version.
    pub metadata_version: i64,
    /// The shard count the assignment refers to.
    #[serde(default)]
    pub shard_count: u32,
    /// What the member may read now, and what is on its way to it.
    pub assignment: Assignment,
}

/// A member's assignment in a response.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Assignment {
    /// Shards the member may read now.
    pub assigned_shards: Vec<ShardId>,
    /// Shards targeted to the member but not yet released by their previous owner (revoke-before-assign).
    pub pending_shards: Vec<ShardId>,
    /// The metadata version this assignment belongs to.
    pub metadata_version: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_serializes_to_the_spec_shape() {
        let req = HeartbeatRequest {
            protocol_version: 1,
            request_id: "r1".into(),
            member_id: "10.0.0.1-m0".into(),
            member_name: Some("on_order".into()),
            member_epoch: 7,
            metadata_version: 3,
            runtime_consumer_capacity: RuntimeConsumerCapacity {
                runtime_max_concurrency: 4,
                available_concurrency: 2,
            },
            owned_shards: Some(vec![ShardId::new(2)]),
            revoking_shards: vec![RevokingShard {
                shard: ShardId::new(5),
                state: RevokeState::Revoked,
                in_flight: 0,
                acked_at: None,
            }],
            shard_progress: vec![],
            weight: None,
            restarting: false,
            hold_after_lease_ms: 0,
        };
        let json = serde_json::to_value(&req).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "protocolVersion": 1, "requestId": "r1", "memberId": "10.0.0.1-m0",
                "memberName": "on_order", "memberEpoch": 7, "metadataVersion": 3,
                "runtimeConsumerCapacity": {"runtimeMaxConcurrency": 4, "availableConcurrency": 2},
                "ownedShards": [{"shardIndex": 2}],
                "revokingShards": [{"shard": {"shardIndex": 5}, "state": "REVOKED", "inFlight": 0, "ackedAt": null}]
            })
        );
        let back: HeartbeatRequest = serde_json::from_value(json).unwrap();
        assert_eq!(back, req);
    }

    #[test]
    fn response_statuses_use_the_spec_names() {
        let names: Vec<String> = [
            HeartbeatStatus::Ok,
            HeartbeatStatus::Retry,
            HeartbeatStatus::SyncMetadata,
            HeartbeatStatus::RevokePending,
            HeartbeatStatus::UnknownMemberId,
            HeartbeatStatus::FencedMemberEpoch,
            HeartbeatStatus::UnsupportedProtocol,
            HeartbeatStatus::InvalidRequest,
        ]
        .iter()
        .map(|s| serde_json::to_string(s).unwrap())
        .collect();
        assert_eq!(
            names,
            [
                "\"OK\"",
                "\"RETRY\"",
                "\"SYNC_METADATA\"",
                "\"REVOKE_PENDING\"",
                "\"UNKNOWN_MEMBER_ID\"",
                "\"FENCED_MEMBER_EPOCH\"",
                "\"UNSUPPORTED_PROTOCOL\"",
                "\"INVALID_REQUEST\""
            ]
        );
    }

    #[test]
    fn response_parses_from_the_spec_shape() {
        let json = serde_json::json!({
            "responseTo": "r1", "status": "REVOKE_PENDING", "memberId": "m", "memberEpoch": 4,
            "heartbeatIntervalMs": 1000, "rebalanceTimeoutMs": 30000, "groupEpoch": 9,
            "assignmentEpoch": 3, "metadataVersion": 12,
            "assignment": {"assignedShards": [{"shardIndex": 0}], "pendingShards": [], "metadataVersion": 12}
        });
        let resp: HeartbeatResponse = serde_json::from_value(json).unwrap();
        assert_eq!(resp.status, HeartbeatStatus::RevokePending);
        assert_eq!(resp.assignment.assigned_shards, vec![ShardId::new(0)]);
    }
}
