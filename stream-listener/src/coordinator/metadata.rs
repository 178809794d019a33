//! Group metadata: everything the coordinator owns, as plain serde data with a schema version.
//!
//! The Redis store persists exactly this value, in two parts so that a commit writes what changed, not the
//! group: a **header** (everything but the members, with the member count) and one **member record** per
//! live member. Lease deadlines are kept beside them (a steady-state heartbeat renews a lease without
//! rewriting anything), so stored member records carry none.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::wire::RuntimeConsumerCapacity;

/// The schema version this crate writes: a header ([`GroupMetadata::to_header_json`]) plus one record per
/// member ([`MemberRecord::to_stored_json`]). It also reads [`WHOLE_SCHEMA_VERSION`]; metadata of any other
/// version is refused, never rewritten.
pub const SCHEMA_VERSION: u32 = 2;

/// The earlier layout: the whole metadata as one JSON document ([`GroupMetadata::to_json`]). Read, and
/// rewritten in the [`SCHEMA_VERSION`] layout by the next commit. Builds that know only this version refuse
/// the newer one.
pub const WHOLE_SCHEMA_VERSION: u32 = 1;

/// How many recently expired or fenced members the metadata remembers (for monitoring and for answering
/// their late heartbeats with `FENCED_MEMBER_EPOCH`).
pub const TOMBSTONE_LIMIT: usize = 64;

/// The longest timing a group may have (heartbeat interval, session and rebalance timeouts): a day. Longer
/// is no sane configuration, and the bound keeps deadlines (`now + timeout`) far from overflowing.
pub const MAX_TIMING_MS: i64 = 24 * 60 * 60 * 1000;

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

impl GroupConfig {
    /// Each value moved into `1..=MAX_TIMING_MS`, as a group is created with (stored timings outside it
    /// are refused: changing the session timeout of a live group would cut leases members rely on).
    pub fn bounded(self) -> Self {
        let bound = |ms: i64| ms.clamp(1, MAX_TIMING_MS);
        Self {
            heartbeat_interval_ms: bound(self.heartbeat_interval_ms),
            session_timeout_ms: bound(self.session_timeout_ms),
            rebalance_timeout_ms: bound(self.rebalance_timeout_ms),
        }
    }
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
///                 |     leave (-1, restarting) ----+--> LEAVING, target kept --rejoin--> JOINING
///                 |                                |        |  (nothing moves; lease passed: EXPIRED)
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
    /// LEAVING for a restart: its target stays reserved for its next incarnation until its lease passes
    /// (see [`HeartbeatRequest::restarting`](super::wire::HeartbeatRequest::restarting)).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restarting: bool,
    /// How long past its lease its shards stay held when it expires or is fenced: a member that does
    /// not self-fence (see [`HeartbeatRequest::hold_after_lease_ms`](super::wire::HeartbeatRequest::hold_after_lease_ms)).
    #[serde(default, skip_serializing_if = "super::wire::is_zero")]
    pub hold_after_lease_ms: i64,
}

impl MemberRecord {
    /// Until when nobody else may read its shards once it is removed: its lease, plus its
    /// `hold_after_lease_ms` for a member that does not self-fence.
    pub fn reads_until_ms(&self) -> i64 {
        self.lease_deadline_ms
            .saturating_add(self.hold_after_lease_ms)
    }

    /// The record as stored beside the header: without its lease, which lives in the store's lease set (so
    /// a renewal never makes a record look changed).
    pub fn to_stored_json(&self) -> Vec<u8> {
        let record = Self {
            lease_deadline_ms: 0,
            ..self.clone()
        };
        serde_json::to_vec(&record).expect("member records always serialize")
    }

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

    /// Left for a restart and gave everything back: it reads nothing, and its target waits for it.
    pub fn is_away(&self) -> bool {
        self.restarting && self.assigned.is_empty() && self.revoking.is_empty()
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
    /// Live members (JOINING, STABLE, LEAVING) by memberId. Absent from a header, which only counts them.
    #[serde(default)]
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

    /// The schema version of stored metadata (a header or a whole document).
    pub fn stored_schema_version(bytes: &[u8]) -> Result<u32, MetadataError> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Version {
            schema_version: u32,
        }
        let version: Version =
            serde_json::from_slice(bytes).map_err(|e| MetadataError::Corrupt(e.to_string()))?;
        Ok(version.schema_version)
    }

    /// Parses a whole document of the [`WHOLE_SCHEMA_VERSION`] layout, refusing other schema versions with a
    /// clear error. The result is in memory, at [`SCHEMA_VERSION`].
    pub fn from_json(bytes: &[u8]) -> Result<Self, MetadataError> {
        let version = Self::stored_schema_version(bytes)?;
        if version != WHOLE_SCHEMA_VERSION {
            return Err(MetadataError::UnknownSchemaVersion(version));
        }
        let mut meta: Self =
            serde_json::from_slice(bytes).map_err(|e| MetadataError::Corrupt(e.to_string()))?;
        meta.schema_version = SCHEMA_VERSION;
        Ok(meta)
    }

    /// The whole metadata as one document of the [`WHOLE_SCHEMA_VERSION`] layout (what earlier versions
    /// stored; for tools and tests).
    pub fn to_json(&self) -> Vec<u8> {
        let mut value = serde_json::to_value(self).expect("group metadata always serializes");
        value["schemaVersion"] = WHOLE_SCHEMA_VERSION.into();
        serde_json::to_vec(&value).expect("group metadata always serializes")
    }

    /// The header: everything but the members, which it counts, with the store time of the commit that
    /// writes it.
    pub fn to_header_json(&self, committed_at_ms: i64) -> Vec<u8> {
        let header = HeaderRef {
            schema_version: SCHEMA_VERSION,
            group: &self.group,
            config: self.config,
            shard_count: self.shard_count,
            group_epoch: self.group_epoch,
            assignment_epoch: self.assignment_epoch,
            metadata_version: self.metadata_version,
            last_member_epoch: self.last_member_epoch,
            member_count: self.members.len(),
            holds: &self.holds,
            tombstones: &self.tombstones,
            resharding: &self.resharding,
            grants_paused_until_ms: self.grants_paused_until_ms,
            created_at_ms: self.created_at_ms,
            committed_at_ms,
        };
        serde_json::to_vec(&header).expect("group metadata always serializes")
    }

    /// Rebuilds the metadata from a [`SCHEMA_VERSION`] header and the stored member records (memberId,
    /// [`MemberRecord::to_stored_json`]); leases are 0 until the store lays its own over them. Returns the
    /// header's commit time too. Records that disagree with the header's count are
    /// [`MetadataError::Incomplete`]: someone deleted or added some.
    pub fn from_parts(
        header: &[u8],
        members: impl IntoIterator<Item = (String, Vec<u8>)>,
    ) -> Result<(Self, i64), MetadataError> {
        let version = Self::stored_schema_version(header)?;
        if version != SCHEMA_VERSION {
            return Err(MetadataError::UnknownSchemaVersion(version));
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Counts {
            member_count: usize,
            #[serde(default)]
            committed_at_ms: i64,
        }
        let counts: Counts =
            serde_json::from_slice(header).map_err(|e| MetadataError::Corrupt(e.to_string()))?;
        let mut meta: Self =
            serde_json::from_slice(header).map_err(|e| MetadataError::Corrupt(e.to_string()))?;
        for (id, json) in members {
            let record: MemberRecord = serde_json::from_slice(&json)
                .map_err(|e| MetadataError::Corrupt(format!("member {id}: {e}")))?;
            meta.members.insert(id, record);
        }
        if meta.members.len() != counts.member_count {
            return Err(MetadataError::Incomplete {
                expected: counts.member_count,
                found: meta.members.len(),
            });
        }
        Ok((meta, counts.committed_at_ms))
    }

    /// The live member `shard` is assigned to or revoking from (its owner), if any.
    pub fn owner(&self, shard: u32) -> Option<&str> {
        self.members
            .iter()
            .find(|(_, m)| m.assigned_or_revoking().any(|s| s == shard))
            .map(|(id, _)| id.as_str())
    }
}

/// The header as written: [`GroupMetadata`] without its members, which it counts.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct HeaderRef<'a> {
    schema_version: u32,
    group: &'a str,
    config: GroupConfig,
    shard_count: u32,
    group_epoch: i64,
    assignment_epoch: i64,
    metadata_version: i64,
    last_member_epoch: i64,
    member_count: usize,
    holds: &'a BTreeMap<u32, FencedHold>,
    tombstones: &'a [Tombstone],
    resharding: &'a Option<Resharding>,
    grants_paused_until_ms: i64,
    created_at_ms: i64,
    committed_at_ms: i64,
}

/// Why stored metadata cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MetadataError {
    /// Not JSON of the expected shape, or values no honest store writes (see
    /// [`Coordinator::from_metadata`](super::Coordinator::from_metadata)).
    #[error("group metadata is corrupt: {0}")]
    Corrupt(String),
    /// Written by another version of this crate.
    #[error(
        "group metadata has schema version {0}, this build reads only versions {WHOLE_SCHEMA_VERSION} and {SCHEMA_VERSION}"
    )]
    UnknownSchemaVersion(u32),
    /// The header counts other members than the stored records: part of the metadata was lost (a key or a
    /// field deleted). The store treats it as lost metadata.
    #[error(
        "group metadata is incomplete: its header counts {expected} members, {found} are stored"
    )]
    Incomplete {
        /// Members the header counts.
        expected: usize,
        /// Member records found.
        found: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_round_trips_with_its_schema_version() {
        let meta = GroupMetadata::new("billing", 12, GroupConfig::default());
        let json = meta.to_json();
        assert!(String::from_utf8_lossy(&json).contains("\"schemaVersion\":1"));
        let back = GroupMetadata::from_json(&json).unwrap();
        assert_eq!(
            back.schema_version, SCHEMA_VERSION,
            "in memory, the current version"
        );
        assert_eq!(back, meta);
    }

    fn populated() -> GroupMetadata {
        let mut meta = GroupMetadata::new("billing", 12, GroupConfig::default());
        for (id, shards) in [("a", [0, 1]), ("b", [2, 3])] {
            meta.members.insert(
                id.to_string(),
                MemberRecord {
                    member_name: Some(id.to_uppercase()),
                    state: MemberState::Stable,
                    member_epoch: 7,
                    confirmed_epoch: 7,
                    join_epoch: 5,
                    join_request_id: format!("{id}-1"),
                    lease_deadline_ms: 12_345,
                    weight: 1,
                    capacity: RuntimeConsumerCapacity::default(),
                    target: shards.into(),
                    assigned: shards.into(),
                    revoking: BTreeMap::new(),
                    owned: shards.into(),
                    rejoins: vec![3],
                    duplicate_suspected: false,
                    restarting: false,
                    hold_after_lease_ms: 0,
                },
            );
        }
        meta.holds.insert(
            9,
            FencedHold {
                member_id: "c".into(),
                member_epoch: 4,
                until_ms: 99,
            },
        );
        meta.tombstones.push(Tombstone {
            member_id: "c".into(),
            member_epoch: 4,
            state: MemberState::Fenced,
            at_ms: 50,
            reason: "test".into(),
            rejoins: Vec::new(),
            duplicate_suspected: false,
        });
        meta.group_epoch = 3;
        meta.grants_paused_until_ms = 77;
        meta.created_at_ms = 11;
        meta
    }

    fn stored_members(meta: &GroupMetadata) -> Vec<(String, Vec<u8>)> {
        meta.members
            .iter()
            .map(|(id, m)| (id.clone(), m.to_stored_json()))
            .collect()
    }

    #[test]
    fn header_and_member_records_round_trip_without_leases() {
        let meta = populated();
        let header = meta.to_header_json(4_242);
        assert!(String::from_utf8_lossy(&header).contains("\"schemaVersion\":2"));
        assert!(String::from_utf8_lossy(&header).contains("\"memberCount\":2"));
        let (back, committed_at) =
            GroupMetadata::from_parts(&header, stored_members(&meta)).unwrap();
        assert_eq!(committed_at, 4_242);
        let mut expected = meta;
        for m in expected.members.values_mut() {
            m.lease_deadline_ms = 0;
        }
        assert_eq!(back, expected);
    }

    /// A field added to the metadata must reach the header too, or it would be lost at the next commit.
    #[test]
    fn the_header_carries_every_field_but_the_members() {
        let keys = |json: &[u8]| -> BTreeSet<String> {
            let value: serde_json::Value = serde_json::from_slice(json).unwrap();
            value.as_object().unwrap().keys().cloned().collect()
        };
        let meta = populated();
        let mut whole = keys(&meta.to_json());
        whole.remove("members");
        let mut header = keys(&meta.to_header_json(0));
        header.remove("memberCount");
        header.remove("committedAtMs");
        assert_eq!(header, whole);
    }

    #[test]
    fn a_missing_or_extra_member_record_is_incomplete_metadata() {
        let meta = populated();
        let header = meta.to_header_json(0);
        let mut records = stored_members(&meta);
        records.pop();
        assert_eq!(
            GroupMetadata::from_parts(&header, records.clone()).unwrap_err(),
            MetadataError::Incomplete {
                expected: 2,
                found: 1
            }
        );
        assert_eq!(
            GroupMetadata::from_parts(&header, Vec::new()).unwrap_err(),
            MetadataError::Incomplete {
                expected: 2,
                found: 0
            }
        );
        records.push(("z".into(), b"{not json".to_vec()));
        assert!(matches!(
            GroupMetadata::from_parts(&header, records),
            Err(MetadataError::Corrupt(e)) if e.contains("member z")
        ));
    }

    #[test]
    fn each_layout_is_read_by_its_own_parser_only() {
        let meta = populated();
        assert_eq!(
            GroupMetadata::from_json(&meta.to_header_json(0)).unwrap_err(),
            MetadataError::UnknownSchemaVersion(SCHEMA_VERSION)
        );
        assert_eq!(
            GroupMetadata::from_parts(&meta.to_json(), Vec::new()).unwrap_err(),
            MetadataError::UnknownSchemaVersion(WHOLE_SCHEMA_VERSION)
        );
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
