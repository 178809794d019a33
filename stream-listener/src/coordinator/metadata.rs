//! Group metadata: everything the coordinator owns, as plain serde data with a schema version.
//!
//! The Redis store persists exactly this value (plus lease deadlines, which it keeps beside it so that a
//! steady-state heartbeat renews a lease without rewriting the snapshot).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::wire::RuntimeConsumerCapacity;

/// The schema version this crate reads and writes. Metadata of another version is refused, never rewritten.
pub const SCHEMA_VERSION: u32 = 1;

/// How many recently expired or fenced members the metadata remembers (for monitoring and for answering
/// their late heartbeats with `FENCED_MEMBER_EPOCH`).
pub const TOMBSTONE_LIMIT: usize = 64;

/// Timing of a group, chosen by the first member that creates it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupConfig {
    /// How often members heartbeat.
    pub heartbeat_interval_ms: i64,
    /// Lease length: a member whose last accepted heartbeat is older than this is expired.
    pub session_timeout_ms: i64,
    /// How long a member may take to report REVOKED for a shard taken from it before it is fenced.
    pub rebalance_timeout_ms: i64,
}

impl Default for GroupConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval_ms: 1_000,
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 30_000,
        }
    }
}

/// The life of a member in the coordinator's eyes.
///
/// ```text
///            join (epoch 0)
///                 |
///                 v
///             JOINING --first time reconciled--> STABLE
///                 |                                |
///                 +----------- leave (-1) ---------+--> LEAVING --all REVOKED--> (removed)
///                 |                                |        |
///   lease passed  +--> EXPIRED (tombstone)  <------+--------+
///   invalid report, rebalance timeout, rejoin of the same memberId
///                 +--> FENCED  (tombstone)
/// ```
/// EXPIRED and FENCED members are removed from the live registry; a tombstone remembers them for monitoring
/// and so that their late heartbeats get `FENCED_MEMBER_EPOCH`. Both must rejoin with epoch 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum MemberState {
    /// Joined, not yet reconciled with its first assignment.
    Joining,
    /// Has reconciled at least once.
    Stable,
    /// Sent a leave heartbeat; giving its shards back.
    Leaving,
    /// Its lease passed.
    Expired,
    /// Fenced for an invalid report, a rebalance timeout or a rejoin of its memberId.
    Fenced,
}

impl MemberState {
    /// Whether the assignor may give this member shards.
    pub fn is_assignable(self) -> bool {
        matches!(self, Self::Joining | Self::Stable)
    }
}

/// A shard being taken from a member, awaiting its REVOKED report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Revocation {
    /// When the coordinator removed the shard from the member's assignment.
    pub since_ms: i64,
    /// When the member is fenced if it has not reported REVOKED.
    pub deadline_ms: i64,
    /// In-flight handler count last reported.
    #[serde(default)]
    pub in_flight: u32,
}

/// One live member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberRecord {
    /// Human label.
    #[serde(default)]
    pub member_name: Option<String>,
    /// Lifecycle state.
    pub state: MemberState,
    /// The epoch the member must send.
    pub member_epoch: i64,
    /// The last epoch the member sent and the coordinator accepted as current (0 = none yet). A request
    /// carrying it is the lost-response case and is accepted if its ownership is still valid.
    pub confirmed_epoch: i64,
    /// The epoch this incarnation joined with: anything older comes from an earlier incarnation.
    pub join_epoch: i64,
    /// The `requestId` of the join that created this incarnation, to recognise a replayed join.
    pub join_request_id: String,
    /// Lease deadline (Redis time, ms).
    pub lease_deadline_ms: i64,
    /// Static balancing weight.
    pub weight: u32,
    /// Reported local capacity (monitoring only).
    #[serde(default)]
    pub capacity: RuntimeConsumerCapacity,
    /// Target assignment: the shards this member should own once the group converges.
    pub target: BTreeSet<u32>,
    /// Shards granted: the member may read them now.
    pub assigned: BTreeSet<u32>,
    /// Shards removed from `assigned`, still the member's until it reports REVOKED.
    pub revoking: BTreeMap<u32, Revocation>,
    /// Current assignment as last reported by the member (`ownedShards`).
    pub owned: BTreeSet<u32>,
    /// Times of recent rejoins of this memberId, to detect two processes sharing it.
    #[serde(default)]
    pub rejoins: Vec<i64>,
    /// Set when rejoins flap: two processes are probably configured with the same memberId.
    #[serde(default)]
    pub duplicate_suspected: bool,
}

impl MemberRecord {
    /// Shards assigned to this member or revoking from it: it may be reading them, so nobody else may get
    /// them.
    pub fn assigned_or_revoking(&self) -> impl Iterator<Item = u32> + '_ {
        self.assigned
            .iter()
            .copied()
            .chain(self.revoking.keys().copied())
    }

    /// Shards targeted to the member but not yet granted.
    pub fn pending(&self) -> impl Iterator<Item = u32> + '_ {
        self.target
            .iter()
            .copied()
            .filter(|s| !self.assigned.contains(s))
    }

    /// Converged: epoch acknowledged, owns exactly its target, nothing pending or revoking.
    pub fn is_reconciled(&self) -> bool {
        self.confirmed_epoch == self.member_epoch
            && self.revoking.is_empty()
            && self.assigned == self.target
            && self.owned == self.assigned
    }
}

/// A fenced hold: a shard kept from everyone after its owner was fenced while its lease was still running.
/// The fenced process may still be reading until its lease passes (it self-fences strictly inside the
/// lease), so nobody gets the shard before then.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FencedHold {
    /// The fenced member.
    pub member_id: String,
    /// Its epoch when fenced.
    pub member_epoch: i64,
    /// The shard is free from this time on.
    pub until_ms: i64,
}

/// A recently expired or fenced member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tombstone {
    /// The member.
    pub member_id: String,
    /// Its epoch when removed.
    pub member_epoch: i64,
    /// `EXPIRED` or `FENCED`.
    pub state: MemberState,
    /// When.
    pub at_ms: i64,
    /// Why, in words.
    pub reason: String,
    /// Rejoin history, carried into the next incarnation.
    #[serde(default)]
    pub rejoins: Vec<i64>,
    /// Carried into the next incarnation.
    #[serde(default)]
    pub duplicate_suspected: bool,
}

/// The spec's migration (resharding) states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum MigrationState {
    /// Announced, not applied (unused by this coordinator: a change applies at once).
    Preparing,
    /// The new shard count is in force and no member holds a shard outside it.
    Active,
    /// The new shard count is in force; members still drain shards outside it.
    Draining,
    /// Superseded by a later change.
    Deprecated,
    /// Rolled back; members still drain shards outside the restored count.
    RollingBack,
    /// Rolled back and drained.
    RolledBack,
}

/// The last shard count change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resharding {
    /// Shard count before the change.
    pub previous_shard_count: u32,
    /// Shard count the change set.
    pub shard_count: u32,
    /// Where it stands.
    pub state: MigrationState,
    /// Group epoch the change (or its rollback) produced.
    pub group_epoch: i64,
    /// When it started.
    pub started_at_ms: i64,
}

/// Everything the coordinator owns about one group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupMetadata {
    /// [`SCHEMA_VERSION`] when written by this crate.
    pub schema_version: u32,
    /// The group's name.
    pub group: String,
    /// Timing.
    pub config: GroupConfig,
    /// Number of shards of the stream.
    pub shard_count: u32,
    /// Bumped by membership and shard-count changes.
    pub group_epoch: i64,
    /// Bumped when the target assignment changes.
    pub assignment_epoch: i64,
    /// Bumped by every committed change; members report the one they applied.
    pub metadata_version: i64,
    /// Highest member epoch ever issued: new epochs are unique across members and incarnations.
    pub last_member_epoch: i64,
    /// Live members (JOINING, STABLE, LEAVING) by memberId.
    pub members: BTreeMap<String, MemberRecord>,
    /// Fenced holds, by shard.
    #[serde(default)]
    pub holds: BTreeMap<u32, FencedHold>,
    /// Recently expired or fenced members, oldest first.
    #[serde(default)]
    pub tombstones: Vec<Tombstone>,
    /// The last shard count change.
    #[serde(default)]
    pub resharding: Option<Resharding>,
    /// No shard is granted before this store time (0: no such wait). Set when the metadata is created and
    /// when a heartbeat shows that the store lost writes: a member of the lost state may still be reading
    /// until its lease runs out, and nothing in the store remembers which shards it holds.
    #[serde(default)]
    pub grants_paused_until_ms: i64,
    /// Store time at which this metadata was created. Member epochs issued since are at least
    /// `created_at_ms * 1000`, so an epoch below that comes from a lost predecessor.
    #[serde(default)]
    pub created_at_ms: i64,
}

impl GroupMetadata {
    /// An empty group.
    pub fn new(group: impl Into<String>, shard_count: u32, config: GroupConfig) -> Self {
        Self {
            schema_version: SCHEMA_VERSION,
            group: group.into(),
            config,
            shard_count,
            group_epoch: 0,
            assignment_epoch: 0,
            metadata_version: 0,
            last_member_epoch: 0,
            members: BTreeMap::new(),
            holds: BTreeMap::new(),
            tombstones: Vec::new(),
            resharding: None,
            grants_paused_until_ms: 0,
            created_at_ms: 0,
        }
    }

    /// Parses stored metadata, refusing other schema versions with a clear error.
    pub fn from_json(bytes: &[u8]) -> Result<Self, MetadataError> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Version {
            schema_version: u32,
        }
        let version: Version =
            serde_json::from_slice(bytes).map_err(|e| MetadataError::Corrupt(e.to_string()))?;
        if version.schema_version != SCHEMA_VERSION {
            return Err(MetadataError::UnknownSchemaVersion(version.schema_version));
        }
        serde_json::from_slice(bytes).map_err(|e| MetadataError::Corrupt(e.to_string()))
    }

    /// Serializes for storage.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("group metadata always serializes")
    }

    /// The live member `shard` is assigned to or revoking from (its owner), if any.
    pub fn owner(&self, shard: u32) -> Option<&str> {
        self.members
            .iter()
            .find(|(_, m)| m.assigned_or_revoking().any(|s| s == shard))
            .map(|(id, _)| id.as_str())
    }
}

/// Why stored metadata cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    /// Not JSON of the expected shape.
    #[error("group metadata is corrupt: {0}")]
    Corrupt(String),
    /// Written by another version of this crate.
    #[error(
        "group metadata has schema version {0}, this build reads only version {SCHEMA_VERSION}"
    )]
    UnknownSchemaVersion(u32),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_round_trips_with_its_schema_version() {
        let meta = GroupMetadata::new("billing", 12, GroupConfig::default());
        let json = meta.to_json();
        assert!(String::from_utf8_lossy(&json).contains("\"schemaVersion\":1"));
        assert_eq!(GroupMetadata::from_json(&json).unwrap(), meta);
    }

    #[test]
    fn unknown_schema_version_is_refused() {
        let err = GroupMetadata::from_json(br#"{"schemaVersion": 99, "group": "g"}"#).unwrap_err();
        assert_eq!(err, MetadataError::UnknownSchemaVersion(99));
        assert!(err.to_string().contains("schema version 99"));
    }

    #[test]
    fn corrupt_metadata_is_refused() {
        assert!(matches!(
            GroupMetadata::from_json(b"{not json"),
            Err(MetadataError::Corrupt(_))
        ));
        assert!(matches!(
            GroupMetadata::from_json(br#"{"schemaVersion": 1, "group": 5}"#),
            Err(MetadataError::Corrupt(_))
        ));
    }
}
