//! The monitoring projection: a read-only view of a group for operators, the CLI and dashboards.

use serde::{Deserialize, Serialize};

use super::metadata::{GroupMetadata, MemberState, Resharding};
use super::Coordinator;

/// The spec's group states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum GroupState {
    /// No live member.
    Empty,
    /// Some shard waits for its previous owner to revoke it (or has nobody to go to).
    Assigning,
    /// Every shard has a place; some member has not applied its assignment yet.
    Reconciling,
    /// Every member owns exactly its target.
    Stable,
}

/// The whole group at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupProjection {
    /// Group name.
    pub group: String,
    /// Group state.
    pub state: GroupState,
    /// Number of shards.
    pub shard_count: u32,
    /// Epochs and version.
    pub group_epoch: i64,
    /// Target assignment epoch.
    pub assignment_epoch: i64,
    /// Metadata version.
    pub metadata_version: i64,
    /// The time this projection was taken at (store clock, ms).
    pub at_ms: i64,
    /// The group's session timeout: a lease runs this long from the heartbeat that renewed it.
    #[serde(default)]
    pub session_timeout_ms: i64,
    /// Live members, then tombstones.
    pub members: Vec<MemberView>,
    /// One row per shard.
    pub shards: Vec<ShardView>,
    /// The last shard count change.
    pub resharding: Option<Resharding>,
    /// Broken invariants (empty when healthy).
    pub invariant_violations: Vec<String>,
}

/// One member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberView {
    /// memberId.
    pub member_id: String,
    /// Human label.
    pub member_name: Option<String>,
    /// Lifecycle state.
    pub state: MemberState,
    /// Member epoch.
    pub member_epoch: i64,
    /// Lease deadline (store clock, ms); 0 for tombstones.
    pub lease_deadline_ms: i64,
    /// Static weight.
    pub weight: u32,
    /// Reported local worker capacity.
    pub runtime_max_concurrency: u32,
    /// Of those, the workers idle at the last heartbeat.
    #[serde(default)]
    pub available_concurrency: u32,
    /// Granted shards.
    pub assigned: Vec<u32>,
    /// Targeted, awaiting the previous owner's revoke.
    pub pending: Vec<u32>,
    /// Reported as owned.
    pub owned: Vec<u32>,
    /// Being revoked.
    pub revoking: Vec<u32>,
    /// Owns exactly its target.
    pub reconciled: bool,
    /// Rejoins flap: probably two processes with this memberId.
    pub duplicate_suspected: bool,
    /// Left for a restart (static membership): its `pending` shards wait for its next incarnation.
    #[serde(default)]
    pub restarting: bool,
}

/// One shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardView {
    /// Shard index.
    pub shard_index: u32,
    /// Target owner.
    pub target: Option<String>,
    /// Owner as reported (current assignment).
    pub current: Option<String>,
    /// A fenced member whose lease still keeps the shard from others.
    pub fenced_hold: Option<String>,
}

impl Coordinator {
    /// The monitoring projection at store time `now`.
    pub fn projection(&self, now: crate::clock::StoreMillis) -> GroupProjection {
        let now = now.0;
        let meta = self.metadata();
        let n = meta.shard_count as usize;
        let mut shards: Vec<ShardView> = (0..meta.shard_count)
            .map(|i| ShardView {
                shard_index: i,
                target: None,
                current: None,
                fenced_hold: None,
            })
            .collect();
        let mut members = Vec::new();
        for (id, m) in &meta.members {
            for &s in &m.target {
                if let Some(row) = shards.get_mut(s as usize) {
                    row.target = Some(id.clone());
                }
            }
            for &s in &m.owned {
                if let Some(row) = shards.get_mut(s as usize) {
                    row.current = Some(id.clone());
                }
            }
            members.push(MemberView {
                member_id: id.clone(),
                member_name: m.member_name.clone(),
                state: m.state,
                member_epoch: m.member_epoch,
                lease_deadline_ms: m.lease_deadline_ms,
                weight: m.weight,
                runtime_max_concurrency: m.capacity.runtime_max_concurrency,
                available_concurrency: m.capacity.available_concurrency,
                assigned: m.assigned.iter().copied().collect(),
                pending: m.pending().collect(),
                owned: m.owned.iter().copied().collect(),
                revoking: m.revoking.keys().copied().collect(),
                reconciled: m.is_reconciled(),
                duplicate_suspected: m.duplicate_suspected,
                restarting: m.restarting,
            });
        }
        for t in &meta.tombstones {
            members.push(MemberView {
                member_id: t.member_id.clone(),
                member_name: None,
                state: t.state,
                member_epoch: t.member_epoch,
                lease_deadline_ms: 0,
                weight: 0,
                runtime_max_concurrency: 0,
                available_concurrency: 0,
                assigned: vec![],
                pending: vec![],
                owned: vec![],
                revoking: vec![],
                reconciled: false,
                duplicate_suspected: t.duplicate_suspected,
                restarting: false,
            });
        }
        for (&s, hold) in &meta.holds {
            if (s as usize) < n {
                shards[s as usize].fenced_hold = Some(hold.member_id.clone());
            }
        }
        let state = group_state(meta);
        GroupProjection {
            group: meta.group.clone(),
            state,
            shard_count: meta.shard_count,
            group_epoch: meta.group_epoch,
            assignment_epoch: meta.assignment_epoch,
            metadata_version: meta.metadata_version,
            at_ms: now,
            session_timeout_ms: meta.config.session_timeout_ms,
            members,
            shards,
            resharding: meta.resharding.clone(),
            invariant_violations: self.invariant_violations(),
        }
    }
}

/// The group's state in the spec's terms, from its metadata: `O(members)`.
pub fn group_state(meta: &GroupMetadata) -> GroupState {
    let mut live = meta
        .members
        .values()
        .filter(|m| m.state.is_assignable())
        .peekable();
    if meta.members.is_empty() {
        GroupState::Empty
    } else if live.peek().is_none() || live.any(|m| m.pending().next().is_some()) {
        GroupState::Assigning
    } else if meta.members.values().all(|m| m.is_reconciled()) {
        GroupState::Stable
    } else {
        GroupState::Reconciling
    }
}
