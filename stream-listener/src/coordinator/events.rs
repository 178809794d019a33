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
        /// The member concerned.
        member_id: String,
        /// Its member epoch.
        member_epoch: i64,
    },
    /// A known memberId joined again (restart, or recovery after UNKNOWN_MEMBER_ID); the previous
    /// incarnation was fenced.
    MemberRejoined {
        /// The member concerned.
        member_id: String,
        /// Its member epoch.
        member_epoch: i64,
        /// The epoch of the incarnation it replaced.
        previous_epoch: i64,
    },
    /// The same memberId keeps rejoining: two processes are probably configured alike.
    DuplicateMemberIdSuspected {
        /// The member concerned.
        member_id: String,
        /// Rejoins seen within the window.
        rejoins: u32,
        /// The window, in ms.
        window_ms: i64,
    },
    /// A member reconciled for the first time.
    MemberStable {
        /// The member concerned.
        member_id: String,
        /// Its member epoch.
        member_epoch: i64,
    },
    /// A member asked to leave; its shards are being revoked.
    MemberLeaving {
        /// The member concerned.
        member_id: String,
    },
    /// A member leaves for a restart under the same memberId: its shards are revoked from it, its target
    /// is kept for its next incarnation until its lease passes.
    MemberLeavingForRestart {
        /// The member concerned.
        member_id: String,
        /// Until when its target is kept (its lease deadline, Redis time ms) unless it heartbeats again.
        kept_until_ms: i64,
    },
    /// A leaving member gave everything back and was removed.
    MemberLeft {
        /// The member concerned.
        member_id: String,
    },
    /// A member's lease passed.
    MemberExpired {
        /// The member concerned.
        member_id: String,
        /// Its member epoch.
        member_epoch: i64,
        /// Its lease deadline (store clock, ms).
        lease_deadline_ms: i64,
    },
    /// A member was fenced; its shards stay in a fenced hold until `lease_deadline_ms`.
    MemberFenced {
        /// The member concerned.
        member_id: String,
        /// Its member epoch.
        member_epoch: i64,
        /// Its lease deadline (store clock, ms).
        lease_deadline_ms: i64,
        /// Why, in words.
        reason: String,
    },
    /// The target assignment changed.
    TargetAssignmentChanged {
        /// The new assignment epoch.
        assignment_epoch: i64,
        /// Shards whose target owner changed.
        moved_shards: u32,
    },
    /// Shards were removed from a member's assignment: it must revoke them.
    ShardsRevokeRequested {
        /// The member concerned.
        member_id: String,
        /// The shards.
        shards: Vec<u32>,
    },
    /// A member reported REVOKED: the shards may be handed on.
    ShardsRevoked {
        /// The member concerned.
        member_id: String,
        /// The shards.
        shards: Vec<u32>,
    },
    /// Shards were granted to a member (revoke-before-assign step 6).
    ShardsAssigned {
        /// The member concerned.
        member_id: String,
        /// Its member epoch.
        member_epoch: i64,
        /// The shards.
        shards: Vec<u32>,
    },
    /// A fenced member's lease passed: its fenced holds end: the shards are free.
    HoldsReleased {
        /// The member concerned.
        member_id: String,
        /// The shards.
        shards: Vec<u32>,
    },
    /// The shard count changed.
    ShardCountChanged {
        /// Shard count before.
        from: u32,
        /// Shard count after.
        to: u32,
    },
    /// The store lost writes (or the whole group): no grant until every member of the lost state has
    /// self-fenced.
    MetadataLossDetected {
        /// What showed it.
        reason: String,
        /// Grants resume at this store time.
        grants_paused_until_ms: i64,
    },
}
