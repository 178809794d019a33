//! Audit events: what a committed change did, in the spec's words. The store appends them to a capped
//! stream in the same atomic step as the metadata, so there is no audit for an uncommitted change and none
//! is lost for a committed one.

use serde::{Deserialize, Serialize};

/// One thing a coordinator input changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "type",
    rename_all = "SCREAMING_SNAKE_CASE",
    rename_all_fields = "camelCase"
)]
pub enum AuditEvent {
    /// A new memberId joined.
    MemberJoined {
        member_id: String,
        member_epoch: i64,
    },
    /// A known memberId joined again (restart, or recovery after UNKNOWN_MEMBER_ID); the previous
    /// incarnation was fenced.
    MemberRejoined {
        member_id: String,
        member_epoch: i64,
        previous_epoch: i64,
    },
    /// The same memberId keeps rejoining: two processes are probably configured alike.
    DuplicateMemberIdSuspected {
        member_id: String,
        rejoins: u32,
        window_ms: i64,
    },
    /// A member reconciled for the first time.
    MemberStable {
        member_id: String,
        member_epoch: i64,
    },
    /// A member asked to leave; its shards are being revoked.
    MemberLeaving { member_id: String },
    /// A leaving member gave everything back and was removed.
    MemberLeft { member_id: String },
    /// A member's lease passed.
    MemberExpired {
        member_id: String,
        member_epoch: i64,
        lease_deadline_ms: i64,
    },
    /// A member was fenced; its shards stay held until `lease_deadline_ms`.
    MemberFenced {
        member_id: String,
        member_epoch: i64,
        lease_deadline_ms: i64,
        reason: String,
    },
    /// The target assignment changed.
    TargetAssignmentChanged {
        assignment_epoch: i64,
        moved_shards: u32,
    },
    /// Shards were removed from a member's assignment: it must revoke them.
    ShardsRevokeRequested { member_id: String, shards: Vec<u32> },
    /// A member reported REVOKED: the shards may be handed on.
    ShardsRevoked { member_id: String, shards: Vec<u32> },
    /// Shards were granted to a member (revoke-before-assign step 6).
    ShardsAssigned {
        member_id: String,
        member_epoch: i64,
        shards: Vec<u32>,
    },
    /// A fenced member's lease passed: its held shards are free.
    HoldsReleased { member_id: String, shards: Vec<u32> },
    /// The shard count changed.
    ShardCountChanged { from: u32, to: u32 },
    /// The last shard count change was rolled back.
    ReshardingRolledBack { from: u32, to: u32 },
}
