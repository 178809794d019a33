//! The cached snapshot and the pure rules around it: what a load means (including the decision that the
//! group's metadata was lost, [`loaded`]), what a commit must send ([`Stored::delta`]), and what Redis
//! holds once it accepted it ([`Stored::committed`]). No IO here: `mod.rs` and `writer.rs` run the
//! scripts and hand the replies to these functions (ARCHITECTURE.md, "Persistence layout" and "Losing
//! the group's metadata").

use std::collections::{HashMap, HashSet};

use crate::clock::StoreMillis;
use crate::coordinator::metadata::{
    GroupConfig, GroupMetadata, MemberRecord, MetadataError, SCHEMA_VERSION, WHOLE_SCHEMA_VERSION,
};
use crate::coordinator::{Coordinator, Creation, Writes};

use super::{GroupKeys, StoreError};

/// A group's snapshot as this handle knows it: the core at a store revision, and what Redis holds at
/// that revision. It is only ever cached once Redis holds it (a load, an accepted renewal or commit).
#[derive(Debug)]
pub(super) struct Snapshot {
    pub(super) revision: i64,
    pub(super) coordinator: Coordinator,
    pub(super) stored: Stored,
}

/// What Redis holds at a snapshot's revision, so that a commit sends only what changed.
#[derive(Debug, Default)]
pub(super) struct Stored {
    /// Each member's record as stored ([`MemberRecord::to_stored_json`]).
    pub(super) members: HashMap<String, Vec<u8>>,
    /// A lower bound of each member's lease in the lease set: a lease not above it needs no write.
    pub(super) leases: HashMap<String, i64>,
    /// The hash does not match `members` (a new or recreated group, an upgrade from the whole-document
    /// layout): the next commit replaces it whole, and renewals are refused until it did.
    pub(super) rewrite: bool,
    /// Store time of the commit that wrote the header, when it says.
    pub(super) committed_at: Option<StoreMillis>,
    /// The header as stored (empty when unknown): a commit that would write it again unchanged, with no
    /// record either, only moves leases ([`CommitDelta::leases_only`]).
    pub(super) header: Vec<u8>,
    /// Redis held no usable metadata: this snapshot was created in memory and is not stored yet (readers
    /// report no group).
    pub(super) created: bool,
}

/// What a load read ([`scripts::load`](super::scripts::load)).
#[derive(Debug)]
pub(super) struct LoadReply {
    /// The metadata header, if any.
    pub(super) meta: Option<Vec<u8>>,
    pub(super) revision: i64,
    /// (memberId, lease deadline).
    pub(super) leases: Vec<(String, i64)>,
    /// Redis time.
    pub(super) now: i64,
    /// (memberId, stored record).
    pub(super) records: Vec<(String, Vec<u8>)>,
}

impl LoadReply {
    /// Bytes of metadata the load carried (for [`StoreStats::load_bytes`](super::StoreStats)).
    pub(super) fn bytes(&self) -> usize {
        self.meta.as_ref().map_or(0, Vec::len)
            + self
                .records
                .iter()
                .map(|(id, r)| id.len() + r.len())
                .sum::<usize>()
    }
}

/// What a load found.
#[derive(Debug)]
pub(super) struct Loaded {
    pub(super) snapshot: Snapshot,
    /// Redis held no usable metadata and the snapshot was created in memory, and how.
    pub(super) creation: Option<Creation>,
    /// The header was there but member records were deleted (or added) behind the store's back: the
    /// group was recreated as after a loss.
    pub(super) lost_records: Option<MetadataError>,
}

/// What a load means: the stored snapshot with its leases laid over it, or, when Redis holds no usable
/// metadata and `create` says how (a member's handle), a group created in memory. A missing snapshot is
/// never trusted to mean a new group: when its revision, leases or member records survived, it was lost
/// ([`Creation::AfterLoss`]), else [`Creation::Fresh`]. Damaged metadata is an error and is left as it is.
pub(super) fn loaded(
    reply: LoadReply,
    group: &str,
    create: Option<(u32, GroupConfig)>,
    keys: &GroupKeys,
) -> Result<Loaded, StoreError> {
    let LoadReply {
        meta,
        revision,
        leases,
        now,
        records,
    } = reply;
    let corrupt = |key: &String| {
        let key = key.clone();
        move |source| StoreError::Metadata { key, source }
    };
    let had_records = !records.is_empty();
    let mut stored = Stored::default();
    let mut lost_records = None;
    let found = match meta {
        None => None,
        Some(bytes) => {
            match GroupMetadata::stored_schema_version(&bytes).map_err(corrupt(&keys.meta))? {
                WHOLE_SCHEMA_VERSION => {
                    // The earlier layout: used as it is, stored in the current one by the next commit.
                    stored.rewrite = true;
                    Some(GroupMetadata::from_json(&bytes).map_err(corrupt(&keys.meta))?)
                }
                SCHEMA_VERSION => {
                    stored.members = records.iter().cloned().collect();
                    stored.header = bytes.clone();
                    match GroupMetadata::from_parts(&bytes, records) {
                        Ok((meta, committed_at)) => {
                            stored.committed_at = Some(StoreMillis(committed_at));
                            Some(meta)
                        }
                        // Whoever may be reading the shards the missing records held is unknown, as after
                        // losing the whole snapshot.
                        Err(source @ MetadataError::Incomplete { .. }) if create.is_some() => {
                            lost_records = Some(source);
                            None
                        }
                        Err(source) => {
                            let key = match source {
                                MetadataError::Corrupt(_) | MetadataError::Incomplete { .. } => {
                                    &keys.members
                                }
                                MetadataError::UnknownSchemaVersion(_) => &keys.meta,
                            };
                            return Err(corrupt(key)(source));
                        }
                    }
                }
                other => {
                    return Err(corrupt(&keys.meta)(MetadataError::UnknownSchemaVersion(
                        other,
                    )))
                }
            }
        }
    };
    let mut creation = None;
    let mut coordinator = match found {
        None => {
            let Some((shard_count, config)) = create else {
                return Err(StoreError::Missing {
                    key: keys.meta.clone(),
                });
            };
            let how = if revision > 0 || !leases.is_empty() || had_records {
                Creation::AfterLoss
            } else {
                Creation::Fresh
            };
            creation = Some(how);
            stored = Stored {
                rewrite: true,
                created: true,
                ..Stored::default()
            };
            Coordinator::create(group, shard_count, config, StoreMillis(now), how)
        }
        Some(meta) => {
            Coordinator::from_metadata(meta, StoreMillis(now)).map_err(corrupt(&keys.meta))?
        }
    };
    let session = coordinator.metadata().config.session_timeout_ms;
    if !stored.rewrite {
        // The whole-document layout carries its own leases; otherwise a record without a lease (the
        // lease set was damaged) may be a live member: it gets a full session, and the next commit
        // writes that lease.
        let leased: HashSet<&str> = leases.iter().map(|(id, _)| id.as_str()).collect();
        let unleased: Vec<String> = coordinator
            .metadata()
            .members
            .keys()
            .filter(|id| !leased.contains(id.as_str()))
            .cloned()
            .collect();
        for id in unleased {
            coordinator.set_lease(&id, now + session);
        }
    }
    for (member, deadline) in leases {
        coordinator.set_lease(&member, deadline);
        stored.leases.insert(member, deadline);
    }
    Ok(Loaded {
        snapshot: Snapshot {
            revision,
            coordinator,
            stored,
        },
        creation,
        lost_records,
    })
}

impl Snapshot {
    /// Redis renewed `member`'s lease to `now + session` and said the smallest lease it holds is
    /// `min_lease`: every lease is at least that, good enough to know nobody expired yet.
    pub(super) fn renewed(&mut self, member: &str, now: i64, session: i64, min_lease: i64) {
        self.coordinator.raise_leases(min_lease);
        self.coordinator.set_lease(member, now + session);
        for lease in self.stored.leases.values_mut() {
            *lease = (*lease).max(min_lease);
        }
        self.stored.leases.insert(member.to_string(), now + session);
    }
}

/// What a commit writes, against what Redis holds at the expected revision ([`Stored::delta`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CommitDelta {
    /// The store time the commit records as its own.
    pub(super) committed_at: StoreMillis,
    /// The metadata header.
    pub(super) header: Vec<u8>,
    /// The records the hash holds at the expected revision; `None`: the hash is replaced whole.
    pub(super) expected_records: Option<usize>,
    /// Member records to write: those that changed (all of them when the hash is replaced).
    pub(super) records: Vec<(String, Vec<u8>)>,
    /// Member records to delete.
    pub(super) gone: Vec<String>,
    /// Leases that moved forward.
    pub(super) leases: Vec<(String, i64)>,
    /// Members gone for good: their leases leave the lease set.
    pub(super) removed: Vec<String>,
}

impl CommitDelta {
    /// Nothing but leases moves: no record, no removal, and the header as stored (written with its
    /// earlier commit time). `commit.lua` then keeps the header and the revision, as `renew.lua` does:
    /// the revision guards the header and the records, which did not change, so every cache at that
    /// revision stays valid (its leases stay lower bounds) and a batch of queued renewals does not refuse
    /// every other member's next renewal.
    pub(super) fn leases_only(&self) -> bool {
        self.header.is_empty()
    }

    /// Bytes of metadata sent (for [`StoreStats::commit_bytes`](super::StoreStats)): the header and the
    /// member records written or deleted.
    pub(super) fn bytes(&self) -> usize {
        self.header.len()
            + self
                .records
                .iter()
                .map(|(id, json)| id.len() + json.len())
                .sum::<usize>()
            + self.gone.iter().map(String::len).sum::<usize>()
    }
}

impl Stored {
    /// What a commit of `meta` at store time `now` must write, given what Redis holds (`self`) and what
    /// the core said about leases (`writes`): only what Redis does not hold yet, everything when the
    /// hash is to be replaced.
    /// `quiet`: the commit has no audit event and no lease check (only then may it move leases alone).
    pub(super) fn delta(
        &self,
        meta: &GroupMetadata,
        writes: &Writes,
        now: StoreMillis,
        quiet: bool,
    ) -> CommitDelta {
        let records: Vec<(String, Vec<u8>)> = meta
            .members
            .iter()
            .map(|(id, m)| (id.clone(), MemberRecord::to_stored_json(m)))
            .filter(|(id, json)| self.rewrite || self.members.get(id) != Some(json))
            .collect();
        let gone = if self.rewrite {
            Vec::new()
        } else {
            self.members
                .keys()
                .filter(|id| !meta.members.contains_key(*id))
                .cloned()
                .collect()
        };
        let leases = meta
            .members
            .iter()
            .map(|(id, m)| (id.clone(), m.lease_deadline_ms))
            .filter(|(id, lease)| self.leases.get(id).is_none_or(|known| lease > known))
            .collect();
        // A member removed by one input of a batch and back by a later one keeps its lease.
        let removed: Vec<String> = writes
            .removed
            .iter()
            .filter(|id| !meta.members.contains_key(*id))
            .cloned()
            .collect();
        // Unchanged: no record to write or delete and the header as stored, at its stored commit time.
        let unchanged_since = self.committed_at.filter(|at| {
            quiet
                && !self.rewrite
                && records.is_empty()
                && gone.is_empty()
                && removed.is_empty()
                && !self.header.is_empty()
                && meta.to_header_json(at.0) == self.header
        });
        let (committed_at, header) = match unchanged_since {
            Some(at) => (at, Vec::new()),
            None => (now, meta.to_header_json(now.0)),
        };
        CommitDelta {
            committed_at,
            header,
            expected_records: (!self.rewrite).then_some(self.members.len()),
            records,
            gone,
            leases,
            removed,
        }
    }

    /// What Redis holds once it accepted `delta`.
    pub(super) fn committed(&mut self, delta: CommitDelta) {
        if !delta.leases_only() {
            self.header = delta.header;
        }
        if self.rewrite {
            self.members.clear();
            self.rewrite = false;
        }
        self.created = false;
        self.members.extend(delta.records);
        for id in delta.gone {
            self.members.remove(&id);
        }
        self.leases.extend(delta.leases);
        for id in delta.removed {
            self.leases.remove(&id);
        }
        self.committed_at = Some(delta.committed_at);
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::coordinator::wire::{HeartbeatRequest, RuntimeConsumerCapacity};
    use crate::coordinator::Change;

    pub(in crate::store) const NOW: i64 = 1_700_000_000_000;
    const SHARDS: u32 = 4;

    fn keys() -> GroupKeys {
        GroupKeys::new("orders", "billing")
    }

    pub(in crate::store) fn join(member: &str) -> HeartbeatRequest {
        HeartbeatRequest {
            protocol_version: 1,
            request_id: format!("{member}-1"),
            member_id: member.into(),
            member_name: None,
            member_epoch: 0,
            metadata_version: 0,
            runtime_consumer_capacity: RuntimeConsumerCapacity::default(),
            owned_shards: None,
            revoking_shards: vec![],
            shard_progress: vec![],
            weight: None,
            restarting: false,
            hold_after_lease_ms: 0,
        }
    }

    fn reply(
        meta: Option<Vec<u8>>,
        revision: i64,
        leases: &[(&str, i64)],
        records: Vec<(String, Vec<u8>)>,
    ) -> LoadReply {
        LoadReply {
            meta,
            revision,
            leases: leases.iter().map(|(id, l)| (id.to_string(), *l)).collect(),
            now: NOW,
            records,
        }
    }

    fn load(reply: LoadReply) -> Result<Loaded, StoreError> {
        loaded(
            reply,
            "billing",
            Some((SHARDS, GroupConfig::default())),
            &keys(),
        )
    }

    /// A group as Redis holds it after `members` joined and one commit stored them, as a load would
    /// return it.
    pub(in crate::store) fn stored_group(members: &[&str]) -> LoadReply {
        let Loaded { mut snapshot, .. } = load(reply(None, 0, &[], Vec::new())).unwrap();
        for member in members {
            let outcome = snapshot
                .coordinator
                .heartbeat(&join(member), StoreMillis(NOW));
            assert_eq!(outcome.change, Change::Metadata);
        }
        let meta = snapshot.coordinator.metadata();
        reply(
            Some(meta.to_header_json(NOW)),
            NOW * 1000,
            &meta
                .members
                .iter()
                .map(|(id, m)| (id.as_str(), m.lease_deadline_ms))
                .collect::<Vec<_>>(),
            meta.members
                .iter()
                .map(|(id, m)| (id.clone(), MemberRecord::to_stored_json(m)))
                .collect(),
        )
    }

    /// A commit that moves nothing but leases (queued renewals answered by the writer) keeps the header
    /// and so the revision; an event, a lease check, a record or a header change makes it a full commit.
    #[test]
    fn only_a_quiet_commit_of_leases_keeps_the_header_and_the_revision() {
        let loaded = load(stored_group(&["a", "b"])).unwrap();
        let mut snapshot = loaded.snapshot;
        let later = StoreMillis(NOW + 500);
        snapshot.coordinator.set_lease("a", NOW + 60_000);
        let meta = snapshot.coordinator.metadata().clone();
        let quiet = snapshot
            .stored
            .delta(&meta, &Writes::default(), later, true);
        assert!(quiet.leases_only(), "{quiet:?}");
        assert_eq!(quiet.leases, [("a".to_string(), NOW + 60_000)]);
        assert_eq!(
            quiet.committed_at,
            StoreMillis(NOW),
            "the header's commit time stays"
        );
        let loud = snapshot
            .stored
            .delta(&meta, &Writes::default(), later, false);
        assert!(
            !loud.leases_only(),
            "an event or a lease check: a full commit"
        );
        assert_eq!(loud.header, meta.to_header_json(later.0));
        // A record that changed is a full commit even when quiet.
        let mut changed = meta.clone();
        changed.members.get_mut("b").unwrap().weight = 7;
        assert!(!snapshot
            .stored
            .delta(&changed, &Writes::default(), later, true)
            .leases_only());
        // Committing the quiet delta keeps what Redis holds of the header.
        let header = snapshot.stored.header.clone();
        snapshot.stored.committed(quiet);
        assert_eq!(snapshot.stored.header, header);
        assert_eq!(snapshot.stored.committed_at, Some(StoreMillis(NOW)));
        assert_eq!(snapshot.stored.leases["a"], NOW + 60_000);
    }

    #[test]
    fn no_trace_of_the_group_creates_it_fresh() {
        let loaded = load(reply(None, 0, &[], Vec::new())).unwrap();
        assert_eq!(loaded.creation, Some(Creation::Fresh));
        assert!(loaded.snapshot.stored.created && loaded.snapshot.stored.rewrite);
        assert_eq!(loaded.snapshot.revision, 0);
        assert_eq!(loaded.snapshot.coordinator.metadata().shard_count, SHARDS);
    }

    #[test]
    fn a_missing_header_with_a_surviving_revision_leases_or_records_is_a_loss() {
        let record = stored_group(&["a"]).records;
        for survivor in [
            reply(None, 5, &[], Vec::new()),
            reply(None, 0, &[("a", NOW + 10_000)], Vec::new()),
            reply(None, 0, &[], record),
        ] {
            let loaded = load(survivor).unwrap();
            assert_eq!(loaded.creation, Some(Creation::AfterLoss));
            assert!(loaded.snapshot.stored.created);
            assert!(loaded.snapshot.coordinator.metadata().members.is_empty());
        }
    }

    #[test]
    fn lost_member_records_recreate_the_group_after_a_loss_but_an_open_handle_reports_them() {
        let recreated = load(without_last_record()).unwrap();
        assert_eq!(recreated.creation, Some(Creation::AfterLoss));
        assert!(matches!(
            recreated.lost_records,
            Some(MetadataError::Incomplete { .. })
        ));
        match loaded(without_last_record(), "billing", None, &keys()) {
            Err(StoreError::Metadata { key, source }) => {
                assert_eq!(key, keys().members);
                assert!(matches!(source, MetadataError::Incomplete { .. }));
            }
            other => panic!("{other:?}"),
        }
    }

    fn without_last_record() -> LoadReply {
        let mut damaged = stored_group(&["a", "b"]);
        damaged.records.pop();
        damaged
    }

    #[test]
    fn an_open_handle_never_creates_a_group() {
        match loaded(reply(None, 5, &[], Vec::new()), "billing", None, &keys()) {
            Err(StoreError::Missing { key }) => assert_eq!(key, keys().meta),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_stored_group_loads_with_its_leases_and_what_redis_holds() {
        let mut group = stored_group(&["a", "b"]);
        group.leases.retain(|(id, _)| id == "a");
        let loaded = load(group).unwrap();
        assert_eq!(loaded.creation, None);
        let snapshot = loaded.snapshot;
        assert!(!snapshot.stored.created && !snapshot.stored.rewrite);
        assert_eq!(snapshot.stored.committed_at, Some(StoreMillis(NOW)));
        assert_eq!(snapshot.stored.members.len(), 2);
        let members = &snapshot.coordinator.metadata().members;
        assert_eq!(snapshot.stored.leases.keys().collect::<Vec<_>>(), ["a"]);
        // A record without a lease gets a full session from the load's time.
        let session = snapshot.coordinator.metadata().config.session_timeout_ms;
        assert_eq!(members["b"].lease_deadline_ms, NOW + session);
    }

    #[test]
    fn an_unknown_schema_version_is_an_error_on_the_header() {
        let header = br#"{"schemaVersion": 99}"#.to_vec();
        match load(reply(Some(header), 1, &[], Vec::new())) {
            Err(StoreError::Metadata { key, source }) => {
                assert_eq!(key, keys().meta);
                assert!(matches!(source, MetadataError::UnknownSchemaVersion(99)));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_new_group_is_committed_whole_and_then_only_what_changed() {
        let Loaded { mut snapshot, .. } = load(reply(None, 0, &[], Vec::new())).unwrap();
        let now = StoreMillis(NOW);
        let outcome = snapshot.coordinator.heartbeat(&join("a"), now);
        assert_eq!(outcome.change, Change::Metadata);
        let writes = Writes::default();
        let first = snapshot
            .stored
            .delta(snapshot.coordinator.metadata(), &writes, now, false);
        assert_eq!(
            first.expected_records, None,
            "a new group replaces the hash"
        );
        assert_eq!(first.records.len(), 1);
        assert_eq!(first.leases.len(), 1);
        snapshot.stored.committed(first.clone());
        assert!(!snapshot.stored.rewrite && !snapshot.stored.created);
        assert_eq!(snapshot.stored.committed_at, Some(now));

        // Nothing changed: only the header goes.
        let again = snapshot
            .stored
            .delta(snapshot.coordinator.metadata(), &writes, now, false);
        assert_eq!(again.expected_records, Some(1));
        assert!(again.records.is_empty() && again.gone.is_empty() && again.leases.is_empty());
        assert_eq!(again.bytes(), again.header.len());

        // A second member: its record and lease, and the first's record only if it changed.
        let outcome = snapshot.coordinator.heartbeat(&join("b"), now);
        assert_eq!(outcome.change, Change::Metadata);
        let join = snapshot
            .stored
            .delta(snapshot.coordinator.metadata(), &writes, now, false);
        assert!(join.records.iter().any(|(id, _)| id == "b"));
        assert_eq!(
            join.leases
                .iter()
                .map(|(id, _)| id.as_str())
                .collect::<Vec<_>>(),
            ["b"]
        );
        let a = MemberRecord::to_stored_json(&snapshot.coordinator.metadata().members["a"]);
        assert_eq!(
            join.records.iter().any(|(id, _)| id == "a"),
            snapshot.stored.members["a"] != a
        );
    }

    #[test]
    fn members_that_went_are_deleted_and_their_leases_removed_unless_they_came_back() {
        let Loaded { mut snapshot, .. } = load(stored_group(&["a", "b"])).unwrap();
        let mut meta = snapshot.coordinator.metadata().clone();
        meta.members.remove("b");
        let writes = Writes {
            lease_checks: Vec::new(),
            removed: vec!["a".into(), "b".into()],
        };
        let delta = snapshot
            .stored
            .delta(&meta, &writes, StoreMillis(NOW + 1), false);
        assert_eq!(delta.gone, ["b"]);
        assert_eq!(
            delta.removed,
            ["b"],
            "a is still a member: it keeps its lease"
        );
        assert_eq!(delta.expected_records, Some(2));
        snapshot.stored.committed(delta);
        assert_eq!(snapshot.stored.members.keys().collect::<Vec<_>>(), ["a"]);
        assert!(!snapshot.stored.leases.contains_key("b"));
        assert_eq!(snapshot.stored.committed_at, Some(StoreMillis(NOW + 1)));
    }

    #[test]
    fn a_renewal_raises_every_known_lease_to_the_smallest_in_redis() {
        let Loaded { mut snapshot, .. } = load(stored_group(&["a", "b"])).unwrap();
        let floor = NOW + 50_000;
        snapshot.renewed("a", NOW + 1, 1000, floor);
        assert_eq!(snapshot.stored.leases["a"], NOW + 1001);
        assert_eq!(snapshot.stored.leases["b"], floor);
        let members = &snapshot.coordinator.metadata().members;
        assert_eq!(members["a"].lease_deadline_ms, NOW + 1001);
        assert_eq!(members["b"].lease_deadline_ms, floor);
        // A lease Redis holds is not sent again.
        let delta = snapshot.stored.delta(
            snapshot.coordinator.metadata(),
            &Writes::default(),
            StoreMillis(NOW),
            false,
        );
        assert!(delta.leases.is_empty(), "{:?}", delta.leases);
    }
}
