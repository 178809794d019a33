//! The coordinator core: a pure, deterministic state machine that decides who owns every shard.
//!
//! No IO, no clock, no tokio: every input carries `now` on the store clock ([`StoreMillis`]; never a
//! member's local clock) and returns an
//! [`Outcome`] (the response, how much of the metadata changed, and the audit events it implies). The Redis
//! store persists the result; a test or the seeded simulation drives it directly. Same inputs, same outputs.
//!
//! Inputs: [`Coordinator::heartbeat`], [`Coordinator::tick`] (expiry, rebalance timeouts, fenced holds) and
//! [`Coordinator::command`] (shard count changes, fencing by an operator). Outputs besides the outcome:
//! [`Coordinator::next_timer`] says when a tick is next needed for a rebalance timeout or a fenced hold
//! (the store tracks leases itself and refuses a renewal once one is due, see `renew.lua`);
//! [`Coordinator::next_deadline`] adds the leases, for drivers without such a store (tests, the
//! simulation).

pub mod assignor;
pub mod events;
pub mod metadata;
pub mod projection;
pub mod wire;

use std::collections::{BTreeMap, BTreeSet};

use crate::clock::StoreMillis;
use assignor::MemberSpec;
use events::AuditEvent;
use metadata::{
    FencedHold, GroupConfig, GroupMetadata, MemberRecord, MemberState, MetadataError,
    MigrationState, Resharding, Revocation, Tombstone, SCHEMA_VERSION, TOMBSTONE_LIMIT,
};
use wire::{
    Assignment, HeartbeatRequest, HeartbeatResponse, HeartbeatStatus, RevokeState, ShardId,
    JOIN_EPOCH, LEAVE_EPOCH, MAX_HOLD_AFTER_LEASE_MS, PROTOCOL_VERSION,
};

/// Rejoins of one memberId within this many session timeouts that mark it as probably duplicated.
const FLAP_REJOINS: usize = 3;
const FLAP_WINDOW_SESSIONS: i64 = 3;
/// Longest memberId accepted.
const MAX_MEMBER_ID_LEN: usize = 256;
/// How far ahead of this store's clock the clock of the store that issued a reported epoch or metadata
/// version may have been (a failed-over or restored Redis on another host): far beyond any real clock
/// skew, and tiny against the range of epochs (`now * 1000` is about 1.8e15 today).
const PLAUSIBLE_CLOCK_LEAD_MS: i64 = 24 * 60 * 60 * 1000;

/// How much of the metadata an input changed; the store writes accordingly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Change {
    /// Nothing to write.
    None,
    /// Only the sender's lease was renewed: the store renews it without rewriting the snapshot.
    Lease,
    /// The metadata changed: the store commits what changed (header, member records, leases) under the
    /// store revision.
    Metadata,
}

/// The result of one input: the answer, and what the store must do to make it true.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "an outcome says what to persist; dropping it loses the change"]
pub struct Outcome<R> {
    /// What to answer.
    pub response: R,
    /// What to persist.
    pub change: Change,
    /// With [`Change::Metadata`]: the lease checks and removals the commit must carry.
    pub writes: Writes,
    /// What happened, for the audit stream only. Empty unless `change` is [`Change::Metadata`].
    pub events: Vec<AuditEvent>,
}

/// What a commit must do besides writing the snapshot, said by the core (events are for auditing only).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Writes {
    /// Members the core removed because of their lease (expired, or fenced with a hold until it passes):
    /// the lease the core used must still be the one in the store, or the commit is refused (a member
    /// that renewed meanwhile was not expired, and a fenced hold must last as long as the real lease).
    pub lease_checks: Vec<(String, i64)>,
    /// Members gone for good (expired, fenced or left, and not rejoined): their leases leave the store.
    pub removed: Vec<String>,
}

/// How the store found the group when it created its metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Creation {
    /// No trace of the group in the store. It may still be a group whose keys were all lost (`FLUSHDB`, a
    /// restart without persistence), so grants wait two heartbeat intervals: long enough for every live
    /// member of a lost state to heartbeat and reveal it (see [`Coordinator::heartbeat`]).
    Fresh,
    /// The snapshot is missing but the store revision or leases exist: it was lost. Grants wait a whole
    /// session timeout, until every member that may still be reading has self-fenced.
    AfterLoss,
}

/// Operator commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminCommand {
    /// Change the number of shards. Shards outside the new count are revoked and never granted again.
    SetShardCount(u32),
    /// Fence a member (for example a process known to be stuck).
    FenceMember(String),
}

/// Why an admin command was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError {
    /// A group needs at least one shard.
    #[error("shard count must be at least 1")]
    ZeroShards,
    /// No such live member.
    #[error("no live member {0:?}")]
    UnknownMember(String),
}

/// The group coordinator. See the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coordinator {
    meta: GroupMetadata,
}

/// What one input has done so far (metadata changed, the sender's lease renewed, a rebalance due, the
/// commit's writes, audit events); `finish` turns it into the `Outcome`.
#[derive(Default)]
struct Effects {
    changed: bool,
    lease: bool,
    rebalance: bool,
    writes: Writes,
    events: Vec<AuditEvent>,
}

impl Effects {
    fn event(&mut self, event: AuditEvent) {
        self.changed = true;
        self.events.push(event);
    }
}

/// What the heartbeat handling decided, before the response is built.
enum Verdict {
    /// `stale`: the member had not seen the latest committed metadata (rule 5: reconcile).
    Accepted {
        stale: bool,
    },
    Left,
    Rejected(HeartbeatStatus),
}

/// Why a report fences its sender (the spec's ownership validation).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Violation {
    NotAssigned(u32),
    OwnedByOther(u32, String),
    RevokingNotRemoved(u32),
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotAssigned(s) => write!(
                f,
                "claimed shard {s}, which is not assigned or pending for it"
            ),
            Self::OwnedByOther(s, other) => {
                write!(f, "claimed shard {s}, which is owned by {other}")
            }
            Self::RevokingNotRemoved(s) => {
                write!(
                    f,
                    "reported shard {s} as revoking, which was never removed from its assignment"
                )
            }
        }
    }
}

impl Coordinator {
    /// A new, empty group. Timings are bounded ([`GroupConfig::bounded`]).
    pub fn new(group: impl Into<String>, shard_count: u32, config: GroupConfig) -> Self {
        Self {
            meta: GroupMetadata::new(group, shard_count.max(1), config.bounded()),
        }
    }

    /// A new group created by the store at store time `now`. Unlike [`Coordinator::new`] it does not trust
    /// the store to be the group's first: it pauses grants (see [`Creation`]) and starts member epochs at
    /// `now * 1000`, above every epoch a lost predecessor issued, so fencing tokens never go backwards.
    pub fn create(
        group: impl Into<String>,
        shard_count: u32,
        config: GroupConfig,
        now: StoreMillis,
        creation: Creation,
    ) -> Self {
        let now = now.0;
        let mut c = Self::new(group, shard_count, config);
        let config = c.meta.config;
        c.meta.created_at_ms = now;
        c.meta.last_member_epoch = epoch_floor(now);
        let pause = match creation {
            Creation::Fresh => config
                .heartbeat_interval_ms
                .saturating_mul(2)
                .min(config.session_timeout_ms),
            Creation::AfterLoss => config.session_timeout_ms,
        };
        c.meta.grants_paused_until_ms = now.saturating_add(pause);
        c
    }

    /// Resumes from metadata the store loaded at store time `now`. Metadata no honest store can have
    /// written is refused as [`MetadataError::Corrupt`] (see `implausible_metadata`).
    pub fn from_metadata(meta: GroupMetadata, now: StoreMillis) -> Result<Self, MetadataError> {
        if meta.schema_version != SCHEMA_VERSION {
            return Err(MetadataError::UnknownSchemaVersion(meta.schema_version));
        }
        if let Some(problem) = implausible_metadata(&meta, now.0) {
            return Err(MetadataError::Corrupt(problem));
        }
        Ok(Self { meta })
    }

    /// The metadata, to persist or inspect.
    pub fn metadata(&self) -> &GroupMetadata {
        &self.meta
    }

    /// The metadata, consuming the coordinator.
    pub fn into_metadata(self) -> GroupMetadata {
        self.meta
    }

    /// Overrides a member's lease deadline. The store keeps leases beside the snapshot and lays them over it
    /// when it loads.
    pub(crate) fn set_lease(&mut self, member_id: &str, deadline_ms: i64) {
        if let Some(m) = self.meta.members.get_mut(member_id) {
            m.lease_deadline_ms = deadline_ms;
        }
    }

    /// Raises every lease to at least `floor` (the smallest lease the store holds): after a renewal the
    /// store knows no lease is below it, without reading them all.
    pub(crate) fn raise_leases(&mut self, floor: i64) {
        for m in self.meta.members.values_mut() {
            m.lease_deadline_ms = m.lease_deadline_ms.max(floor);
        }
    }

    /// The earliest time at which a [`tick`](Self::tick) would change something (a lease, a rebalance
    /// timeout, or a fenced hold running out), if any.
    pub fn next_deadline(&self) -> Option<StoreMillis> {
        let leases = self
            .meta
            .members
            .values()
            .map(|m| StoreMillis(m.lease_deadline_ms));
        leases.chain(self.next_timer()).min()
    }

    /// Like [`next_deadline`](Self::next_deadline) but without leases, which the store tracks on its own.
    pub fn next_timer(&self) -> Option<StoreMillis> {
        let revocations = self
            .meta
            .members
            .values()
            .flat_map(|m| m.revoking.values().map(|r| r.deadline_ms));
        let holds = self.meta.holds.values().map(|h| h.until_ms);
        let pause =
            (self.meta.grants_paused_until_ms > 0).then_some(self.meta.grants_paused_until_ms);
        revocations.chain(holds).chain(pause).min().map(StoreMillis)
    }

    /// Applies expiry, rebalance timeouts and fenced holds that are due at `now`.
    pub fn tick(&mut self, now: StoreMillis) -> Outcome<()> {
        let now = now.0;
        let mut effects = Effects::default();
        self.run_timers(now, &mut effects);
        self.reconcile(now, &mut effects, None);
        self.finish((), effects)
    }

    /// Applies an operator command.
    pub fn command(
        &mut self,
        command: AdminCommand,
        now: StoreMillis,
    ) -> Outcome<Result<(), CommandError>> {
        let now = now.0;
        let mut effects = Effects::default();
        self.run_timers(now, &mut effects);
        let result = self.apply_command(command, now, &mut effects);
        self.reconcile(now, &mut effects, None);
        self.finish(result, effects)
    }

    /// Applies one heartbeat.
    pub fn heartbeat(
        &mut self,
        req: &HeartbeatRequest,
        now: StoreMillis,
    ) -> Outcome<HeartbeatResponse> {
        let now = now.0;
        let mut effects = Effects::default();
        self.run_timers(now, &mut effects);
        let verdict = self.handle(req, now, &mut effects);
        let sender = matches!(verdict, Verdict::Accepted { .. }).then_some(req.member_id.as_str());
        // A heartbeat that changed nothing cannot change the outcome of the last reconciliation, except
        // for a sender whose epoch is unacknowledged (it may get grants only in answer to itself). This
        // keeps the steady-state heartbeat independent of the group's size.
        let sender_settled = sender
            .and_then(|id| self.meta.members.get(id))
            .is_none_or(|m| m.confirmed_epoch == m.member_epoch);
        if effects.changed || effects.rebalance || !sender_settled {
            self.reconcile(now, &mut effects, sender);
        }
        let mut response = self.response(req, verdict);
        if effects.changed {
            // The response describes the metadata as committed.
            bump(&mut response.metadata_version);
            bump(&mut response.assignment.metadata_version);
        }
        self.finish(response, effects)
    }

    fn finish<R>(&mut self, response: R, mut effects: Effects) -> Outcome<R> {
        // A member removed and rejoined within the same input keeps its lease entry.
        let members = &self.meta.members;
        effects
            .writes
            .removed
            .retain(|id| !members.contains_key(id));
        effects.writes.removed.dedup();
        let change = if effects.changed {
            bump(&mut self.meta.metadata_version);
            Change::Metadata
        } else if effects.lease {
            Change::Lease
        } else {
            Change::None
        };
        Outcome {
            response,
            change,
            writes: effects.writes,
            events: effects.events,
        }
    }

    // ---- heartbeat handling ----

    fn handle(&mut self, req: &HeartbeatRequest, now: i64, effects: &mut Effects) -> Verdict {
        if req.protocol_version != PROTOCOL_VERSION {
            return Verdict::Rejected(HeartbeatStatus::UnsupportedProtocol);
        }
        if !is_well_formed(req) || !self.is_plausible(req, now) {
            return Verdict::Rejected(HeartbeatStatus::InvalidRequest);
        }
        self.detect_loss(req, now, effects);
        match req.member_epoch {
            LEAVE_EPOCH => self.leave(req, now, effects),
            JOIN_EPOCH => self.join(req, now, effects),
            epoch => {
                let Some(member) = self.meta.members.get(&req.member_id) else {
                    let tombstoned = self
                        .meta
                        .tombstones
                        .iter()
                        .any(|t| t.member_id == req.member_id);
                    return Verdict::Rejected(if tombstoned {
                        HeartbeatStatus::FencedMemberEpoch
                    } else {
                        HeartbeatStatus::UnknownMemberId
                    });
                };
                let current = epoch == member.member_epoch;
                // The lost-response case: the member acts on the last epoch it acknowledged.
                let lagging = epoch == member.confirmed_epoch && epoch >= member.join_epoch;
                if !current && !lagging {
                    // Older: an earlier incarnation or state we cannot vouch for. Newer: never issued to
                    // this incarnation (forged or from a future we do not know). Neither may touch the
                    // live member.
                    return Verdict::Rejected(HeartbeatStatus::FencedMemberEpoch);
                }
                if let Err(violation) = self.validate(req, false) {
                    self.fence(&req.member_id, now, &violation.to_string(), effects);
                    return Verdict::Rejected(HeartbeatStatus::FencedMemberEpoch);
                }
                let member = self
                    .meta
                    .members
                    .get_mut(&req.member_id)
                    .expect("checked above");
                if current && member.confirmed_epoch != epoch {
                    member.confirmed_epoch = epoch;
                    effects.changed = true;
                }
                self.apply_report(req, now, effects);
                Verdict::Accepted {
                    stale: req.metadata_version < self.meta.metadata_version,
                }
            }
        }
    }

    /// A member that has seen metadata this store never wrote proves that the store lost writes: a metadata
    /// version above the store's, an epoch above any issued, or (from a member the store does not know)
    /// an epoch from before this metadata was created. Whatever that member, or any other member of the
    /// lost state, was granted may still be read until its lease passes: grants pause for a session
    /// timeout, and epochs and versions move above what was reported so they never go backwards. Only
    /// plausible values get here ([`is_plausible`](Self::is_plausible)): a value no honest store can have
    /// issued is garbage, not evidence.
    fn detect_loss(&mut self, req: &HeartbeatRequest, now: i64, effects: &mut Effects) {
        let known = self.meta.members.contains_key(&req.member_id)
            || self
                .meta
                .tombstones
                .iter()
                .any(|t| t.member_id == req.member_id);
        let reason = if req.metadata_version > self.meta.metadata_version {
            format!(
                "{} reported metadata version {}, the store is at {}",
                req.member_id, req.metadata_version, self.meta.metadata_version
            )
        } else if req.member_epoch > self.meta.last_member_epoch {
            format!(
                "{} reported member epoch {}, above any the store issued ({})",
                req.member_id, req.member_epoch, self.meta.last_member_epoch
            )
        } else if !known
            && req.member_epoch > 0
            && req.member_epoch < epoch_floor(self.meta.created_at_ms)
        {
            format!(
                "unknown member {} reported member epoch {}, issued before this metadata was created",
                req.member_id, req.member_epoch
            )
        } else {
            return;
        };
        let meta = &mut self.meta;
        meta.metadata_version = meta.metadata_version.max(req.metadata_version);
        meta.last_member_epoch = meta.last_member_epoch.max(req.member_epoch);
        let until = now.saturating_add(meta.config.session_timeout_ms);
        if until > meta.grants_paused_until_ms {
            meta.grants_paused_until_ms = until;
            effects.event(AuditEvent::MetadataLossDetected {
                reason,
                grants_paused_until_ms: until,
            });
        } else {
            effects.changed = true;
        }
    }

    /// Whether the request's epoch and metadata version can have been issued by an honest store at `now`:
    /// by this one (at most its counters), or by any within [`plausible_limit`]. An implausible one is
    /// refused before it can count as evidence of a loss, which would raise the group's counters to it
    /// and pause every grant.
    fn is_plausible(&self, req: &HeartbeatRequest, now: i64) -> bool {
        let limit = plausible_limit(now);
        let epochs = self.meta.last_member_epoch.max(limit).max(JOIN_EPOCH);
        let versions = self.meta.metadata_version.max(limit).max(0);
        req.member_epoch <= epochs && (0..=versions).contains(&req.metadata_version)
    }

    fn join(&mut self, req: &HeartbeatRequest, now: i64, effects: &mut Effects) -> Verdict {
        let session = self.meta.config.session_timeout_ms;
        let mut rejoins = Vec::new();
        let mut duplicate_suspected = false;
        let mut previous_epoch = None;
        let mut restarted = false;
        let mut target = BTreeSet::new();
        if let Some(existing) = self.meta.members.get_mut(&req.member_id) {
            if existing.join_request_id == req.request_id {
                // A replayed join whose response was lost: same epoch, same assignment, no bumps.
                existing.lease_deadline_ms = now.saturating_add(session);
                effects.lease = true;
                return Verdict::Accepted { stale: false };
            }
            rejoins = std::mem::take(&mut existing.rejoins);
            duplicate_suspected = existing.duplicate_suspected;
            previous_epoch = Some(existing.member_epoch);
            if existing.restarting {
                // It announced this restart: its target was kept for it, and the assignor keeps it
                // (sticky), so its shards come back without moving anywhere else.
                target = std::mem::take(&mut existing.target);
                restarted = existing.assigned.is_empty() && existing.revoking.is_empty();
            }
            if restarted {
                // It gave every shard back before it went: nothing of it can still be read, so there
                // is nothing to fence; the new incarnation simply replaces the record.
                self.meta.members.remove(&req.member_id);
            } else {
                // The spec's rejoin: a new incarnation of a known memberId. The old one is fenced first
                // (what it may still read stays held until its lease passes).
                self.fence(
                    &req.member_id,
                    now,
                    "replaced by a rejoin of the same memberId",
                    effects,
                );
            }
        }
        if let Some(pos) = self
            .meta
            .tombstones
            .iter()
            .position(|t| t.member_id == req.member_id)
        {
            let tomb = self.meta.tombstones.remove(pos);
            if previous_epoch.is_none() {
                rejoins = tomb.rejoins;
                duplicate_suspected = tomb.duplicate_suspected;
                previous_epoch = Some(tomb.member_epoch);
            }
        }
        let epoch = self.next_member_epoch(now);
        if let Some(previous_epoch) = previous_epoch {
            let window = session.saturating_mul(FLAP_WINDOW_SESSIONS);
            rejoins.retain(|&t| now.saturating_sub(t) < window);
            if !restarted {
                // An announced restart is not a flap: two processes sharing an id do not announce.
                rejoins.push(now);
            }
            if rejoins.len() >= FLAP_REJOINS && !duplicate_suspected {
                duplicate_suspected = true;
                effects.event(AuditEvent::DuplicateMemberIdSuspected {
                    member_id: req.member_id.clone(),
                    rejoins: rejoins.len() as u32,
                    window_ms: window,
                });
            } else if rejoins.len() < FLAP_REJOINS {
                duplicate_suspected = false;
            }
            effects.event(AuditEvent::MemberRejoined {
                member_id: req.member_id.clone(),
                member_epoch: epoch,
                previous_epoch,
            });
        } else {
            effects.event(AuditEvent::MemberJoined {
                member_id: req.member_id.clone(),
                member_epoch: epoch,
            });
        }
        self.meta.members.insert(
            req.member_id.clone(),
            MemberRecord {
                member_name: req.member_name.clone(),
                state: MemberState::Joining,
                member_epoch: epoch,
                confirmed_epoch: 0,
                join_epoch: epoch,
                join_request_id: req.request_id.clone(),
                lease_deadline_ms: now.saturating_add(session),
                weight: req.weight.unwrap_or(1),
                capacity: req.runtime_consumer_capacity,
                target,
                assigned: BTreeSet::new(),
                revoking: BTreeMap::new(),
                owned: BTreeSet::new(),
                rejoins,
                duplicate_suspected,
                restarting: false,
                hold_after_lease_ms: req.hold_after_lease_ms,
            },
        );
        bump(&mut self.meta.group_epoch);
        effects.rebalance = true;
        Verdict::Accepted { stale: false }
    }

    fn leave(&mut self, req: &HeartbeatRequest, now: i64, effects: &mut Effects) -> Verdict {
        let Some(member) = self.meta.members.get_mut(&req.member_id) else {
            // Leaving twice, or after expiry: nothing to do.
            return Verdict::Left;
        };
        if req.restarting && member.state != MemberState::Leaving {
            // Leaving for a restart: it gives everything back, but its target stays reserved for its
            // next incarnation until its lease passes, so nothing moves to anyone else meanwhile.
            member.state = MemberState::Leaving;
            member.restarting = true;
            effects.changed = true;
            effects.event(AuditEvent::MemberLeavingForRestart {
                member_id: req.member_id.clone(),
                kept_until_ms: now.saturating_add(self.meta.config.session_timeout_ms),
            });
            let all: Vec<u32> = member.assigned.iter().copied().collect();
            self.revoke(&req.member_id, all, now, effects);
        } else if member.state != MemberState::Leaving || (member.restarting && !req.restarting) {
            // A plain leave (also one that follows a leave for a restart: it will not come back).
            member.state = MemberState::Leaving;
            member.restarting = false;
            member.target.clear();
            bump(&mut self.meta.group_epoch);
            effects.rebalance = true;
            effects.event(AuditEvent::MemberLeaving {
                member_id: req.member_id.clone(),
            });
            // Everything it holds is now being revoked, so REVOKED reports in this request are valid.
            self.revoke_untargeted(&req.member_id, now, effects);
        }
        if let Err(violation) = self.validate(req, true) {
            self.fence(&req.member_id, now, &violation.to_string(), effects);
            return Verdict::Left;
        }
        self.apply_report(req, now, effects);
        Verdict::Accepted { stale: false }
    }

    /// The spec's ownership validation, rules 1 to 3 (rule 4, stale epochs, is checked before; rule 5,
    /// stale metadata, leads to `SYNC_METADATA`; rule 6, duplicate REVOKED, is ignored in
    /// [`apply_report`](Self::apply_report)).
    fn validate(&self, req: &HeartbeatRequest, leaving: bool) -> Result<(), Violation> {
        let member = &self.meta.members[&req.member_id];
        for shard in req.owned_shards.iter().flatten().map(|s| s.shard_index) {
            if member.assigned.contains(&shard) || member.revoking.contains_key(&shard) {
                continue;
            }
            // Rule 3: a live member cannot claim a shard another live member (or a fenced hold) has.
            if let Some(other) = self.meta.owner(shard) {
                return Err(Violation::OwnedByOther(shard, other.to_string()));
            }
            if let Some(hold) = self.meta.holds.get(&shard) {
                return Err(Violation::OwnedByOther(shard, hold.member_id.clone()));
            }
            // Rule 1: owned shards must be assigned (or pending, which is granted as soon as it is free).
            return Err(Violation::NotAssigned(shard));
        }
        for report in &req.revoking_shards {
            let shard = report.shard.shard_index;
            if member.revoking.contains_key(&shard) {
                continue;
            }
            if member.assigned.contains(&shard) && !leaving {
                // Rule 6 again: a REVOKED report sent before the shard was granted back (its response was
                // lost and the member repeats it under its previous epoch) was accepted already.
                if report.state == RevokeState::Revoked && req.member_epoch < member.member_epoch {
                    continue;
                }
                // Rule 2: revoking shards must match shards removed from its assignment.
                return Err(Violation::RevokingNotRemoved(shard));
            }
            if report.state != RevokeState::Revoked {
                // Still draining a shard the coordinator no longer counts as revoking from it.
                return Err(Violation::RevokingNotRemoved(shard));
            }
            // Rule 6: a terminal REVOKED already accepted is a duplicate, ignored.
        }
        Ok(())
    }

    /// Takes a validated report: lease, capacity, ownership, revocation progress.
    fn apply_report(&mut self, req: &HeartbeatRequest, now: i64, effects: &mut Effects) {
        let session = self.meta.config.session_timeout_ms;
        let member = self
            .meta
            .members
            .get_mut(&req.member_id)
            .expect("validated member");
        member.lease_deadline_ms = now.saturating_add(session);
        effects.lease = true;
        member.capacity = req.runtime_consumer_capacity;
        if let Some(owned) = &req.owned_shards {
            let owned: BTreeSet<u32> = owned.iter().map(|s| s.shard_index).collect();
            if owned != member.owned {
                member.owned = owned;
                effects.changed = true;
            }
        }
        let mut revoked = Vec::new();
        if let Some(owned) = &req.owned_shards {
            // A full heartbeat names everything the member touches: a revoking shard it does not mention
            // (granted and taken back before it ever saw it) is not revoking from it any more.
            let mentioned = |s: &u32| {
                owned.iter().any(|o| o.shard_index == *s)
                    || req
                        .revoking_shards
                        .iter()
                        .any(|r| r.shard.shard_index == *s)
            };
            let unheld: Vec<u32> = member
                .revoking
                .keys()
                .copied()
                .filter(|s| !mentioned(s))
                .collect();
            for shard in unheld {
                member.revoking.remove(&shard);
                revoked.push(shard);
            }
        }
        for report in &req.revoking_shards {
            let shard = report.shard.shard_index;
            if let Some(revocation) = member.revoking.get_mut(&shard) {
                if report.state == RevokeState::Revoked {
                    member.revoking.remove(&shard);
                    member.owned.remove(&shard);
                    revoked.push(shard);
                } else {
                    revocation.in_flight = report.in_flight;
                }
            }
        }
        if !revoked.is_empty() {
            effects.event(AuditEvent::ShardsRevoked {
                member_id: req.member_id.clone(),
                shards: revoked,
            });
        }
    }

    fn response(&self, req: &HeartbeatRequest, verdict: Verdict) -> HeartbeatResponse {
        let config = &self.meta.config;
        let (status, member_epoch, assignment) =
            match (verdict, self.meta.members.get(&req.member_id)) {
                // A leave for a restart that gave everything back: done, as a completed leave is.
                (Verdict::Accepted { .. }, Some(m)) if m.is_away() => {
                    (HeartbeatStatus::Ok, LEAVE_EPOCH, Assignment::default())
                }
                (Verdict::Accepted { stale }, Some(m)) => {
                    let status = if !m.revoking.is_empty() {
                        HeartbeatStatus::RevokePending
                    } else if stale {
                        HeartbeatStatus::SyncMetadata
                    } else {
                        HeartbeatStatus::Ok
                    };
                    let assignment = Assignment {
                        assigned_shards: m.assigned.iter().copied().map(ShardId::new).collect(),
                        pending_shards: if m.state.is_assignable() {
                            m.pending().map(ShardId::new).collect()
                        } else {
                            Vec::new()
                        },
                        metadata_version: self.meta.metadata_version,
                    };
                    (status, m.member_epoch, assignment)
                }
                // A leave that completed, or a leaving member that is gone.
                (Verdict::Accepted { .. } | Verdict::Left, None) => {
                    (HeartbeatStatus::Ok, LEAVE_EPOCH, Assignment::default())
                }
                (Verdict::Left, Some(m)) => {
                    (HeartbeatStatus::Ok, m.member_epoch, Assignment::default())
                }
                (Verdict::Rejected(status), _) => (status, 0, Assignment::default()),
            };
        HeartbeatResponse {
            response_to: req.request_id.clone(),
            status,
            member_id: req.member_id.clone(),
            member_epoch,
            heartbeat_interval_ms: config.heartbeat_interval_ms,
            rebalance_timeout_ms: config.rebalance_timeout_ms,
            session_timeout_ms: config.session_timeout_ms,
            group_epoch: self.meta.group_epoch,
            assignment_epoch: self.meta.assignment_epoch,
            metadata_version: self.meta.metadata_version,
            shard_count: self.meta.shard_count,
            assignment: Assignment {
                metadata_version: self.meta.metadata_version,
                ..assignment
            },
        }
    }

    // ---- timers ----

    fn run_timers(&mut self, now: i64, effects: &mut Effects) {
        if self.meta.grants_paused_until_ms > 0 && self.meta.grants_paused_until_ms <= now {
            self.meta.grants_paused_until_ms = 0;
            effects.changed = true;
        }
        let expired: Vec<String> = self
            .meta
            .members
            .iter()
            .filter(|(_, m)| m.lease_deadline_ms <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for member_id in expired {
            let member = self.meta.members.remove(&member_id).expect("listed above");
            effects
                .writes
                .lease_checks
                .push((member_id.clone(), member.lease_deadline_ms));
            effects.writes.removed.push(member_id.clone());
            effects.event(AuditEvent::MemberExpired {
                member_id: member_id.clone(),
                member_epoch: member.member_epoch,
                lease_deadline_ms: member.lease_deadline_ms,
            });
            // Its lease has passed, so a member of ours has stopped reading and its shards are free at
            // once; one that does not self-fence keeps them held a while longer.
            self.hold(&member_id, &member, now);
            self.bury(
                member_id,
                member,
                MemberState::Expired,
                now,
                "lease expired".into(),
            );
            bump(&mut self.meta.group_epoch);
            effects.rebalance = true;
        }
        let timed_out: Vec<String> = self
            .meta
            .members
            .iter()
            .filter(|(_, m)| m.revoking.values().any(|r| r.deadline_ms <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for member_id in timed_out {
            self.fence(
                &member_id,
                now,
                "did not report REVOKED within the rebalance timeout",
                effects,
            );
        }
        let mut released: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        self.meta.holds.retain(|&shard, hold| {
            let keep = hold.until_ms > now;
            if !keep {
                released
                    .entry(hold.member_id.clone())
                    .or_default()
                    .push(shard);
            }
            keep
        });
        for (member_id, shards) in released {
            effects.event(AuditEvent::HoldsReleased { member_id, shards });
        }
    }

    /// Keeps the shards a removed member may still read from anyone else until
    /// [`MemberRecord::reads_until_ms`].
    fn hold(&mut self, member_id: &str, member: &MemberRecord, now: i64) {
        let until = member.reads_until_ms();
        if until > now {
            for shard in member.assigned_or_revoking() {
                self.meta.holds.insert(
                    shard,
                    FencedHold {
                        member_id: member_id.to_string(),
                        member_epoch: member.member_epoch,
                        until_ms: until,
                    },
                );
            }
        }
    }

    /// Removes a live member and keeps its shards from anyone else until its lease has passed.
    fn fence(&mut self, member_id: &str, now: i64, reason: &str, effects: &mut Effects) {
        let Some(member) = self.meta.members.remove(member_id) else {
            return;
        };
        effects
            .writes
            .lease_checks
            .push((member_id.to_string(), member.lease_deadline_ms));
        effects.writes.removed.push(member_id.to_string());
        self.hold(member_id, &member, now);
        effects.event(AuditEvent::MemberFenced {
            member_id: member_id.to_string(),
            member_epoch: member.member_epoch,
            lease_deadline_ms: member.lease_deadline_ms,
            reason: reason.to_string(),
        });
        self.bury(
            member_id.to_string(),
            member,
            MemberState::Fenced,
            now,
            reason.to_string(),
        );
        bump(&mut self.meta.group_epoch);
        effects.rebalance = true;
    }

    fn bury(
        &mut self,
        member_id: String,
        member: MemberRecord,
        state: MemberState,
        now: i64,
        reason: String,
    ) {
        self.meta.tombstones.retain(|t| t.member_id != member_id);
        self.meta.tombstones.push(Tombstone {
            member_id,
            member_epoch: member.member_epoch,
            state,
            at_ms: now,
            reason,
            rejoins: member.rejoins,
            duplicate_suspected: member.duplicate_suspected,
        });
        if self.meta.tombstones.len() > TOMBSTONE_LIMIT {
            let excess = self.meta.tombstones.len() - TOMBSTONE_LIMIT;
            self.meta.tombstones.drain(..excess);
        }
    }

    // ---- commands ----

    fn apply_command(
        &mut self,
        command: AdminCommand,
        now: i64,
        effects: &mut Effects,
    ) -> Result<(), CommandError> {
        match command {
            AdminCommand::SetShardCount(0) => Err(CommandError::ZeroShards),
            AdminCommand::SetShardCount(n) if n == self.meta.shard_count => Ok(()),
            AdminCommand::SetShardCount(n) => {
                let from = self.meta.shard_count;
                self.meta.shard_count = n;
                bump(&mut self.meta.group_epoch);
                self.meta.resharding = Some(Resharding {
                    previous_shard_count: from,
                    shard_count: n,
                    state: MigrationState::Draining,
                    group_epoch: self.meta.group_epoch,
                    started_at_ms: now,
                });
                effects.rebalance = true;
                effects.event(AuditEvent::ShardCountChanged { from, to: n });
                Ok(())
            }
            AdminCommand::FenceMember(member_id) => {
                if !self.meta.members.contains_key(&member_id) {
                    return Err(CommandError::UnknownMember(member_id));
                }
                self.fence(&member_id, now, "fenced by an operator", effects);
                Ok(())
            }
        }
    }

    // ---- assignment ----

    /// Recomputes the target if membership changed, revokes what left a member's target, grants what is
    /// free (revoke-before-assign), and moves members and resharding forward.
    fn reconcile(&mut self, now: i64, effects: &mut Effects, sender: Option<&str>) {
        if effects.rebalance {
            self.recompute_target(effects);
        }
        let ids: Vec<String> = self.meta.members.keys().cloned().collect();
        for id in &ids {
            self.revoke_untargeted(id, now, effects);
        }
        // Leaving members that gave everything back are done.
        for id in &ids {
            let m = &self.meta.members[id];
            if m.state == MemberState::Leaving
                && !m.restarting
                && m.assigned.is_empty()
                && m.revoking.is_empty()
            {
                self.meta.members.remove(id);
                effects.writes.removed.push(id.clone());
                effects.event(AuditEvent::MemberLeft {
                    member_id: id.clone(),
                });
            }
        }
        self.grant(now, effects, sender);
        for (id, m) in self.meta.members.iter_mut() {
            if m.state == MemberState::Joining && m.is_reconciled() {
                m.state = MemberState::Stable;
                effects.event(AuditEvent::MemberStable {
                    member_id: id.clone(),
                    member_epoch: m.member_epoch,
                });
            }
        }
        self.advance_resharding(effects);
    }

    fn recompute_target(&mut self, effects: &mut Effects) {
        let live: Vec<&String> = self
            .meta
            .members
            .iter()
            .filter(|(_, m)| m.state.is_assignable() || m.restarting)
            .map(|(id, _)| id)
            .collect();
        let specs: Vec<MemberSpec> = live
            .iter()
            .map(|id| {
                let m = &self.meta.members[*id];
                MemberSpec {
                    weight: m.weight,
                    current: m.target.iter().copied().collect(),
                }
            })
            .collect();
        let result = assignor::assign(self.meta.shard_count, &specs);
        let live: Vec<String> = live.into_iter().cloned().collect();
        let mut moved = 0u32;
        let mut differs = false;
        for (id, shards) in live.iter().zip(result) {
            let m = self.meta.members.get_mut(id).expect("live member");
            let new: BTreeSet<u32> = shards.into_iter().collect();
            if new != m.target {
                differs = true;
                moved += m
                    .target
                    .difference(&new)
                    .filter(|&&s| s < self.meta.shard_count)
                    .count() as u32;
                m.target = new;
            }
        }
        if differs {
            bump(&mut self.meta.assignment_epoch);
            effects.event(AuditEvent::TargetAssignmentChanged {
                assignment_epoch: self.meta.assignment_epoch,
                moved_shards: moved,
            });
        }
    }

    /// Revoke-before-assign steps 1 and 2: a granted shard that left the member's target is removed from
    /// its assignment and awaits its REVOKED report.
    fn revoke_untargeted(&mut self, member_id: &str, now: i64, effects: &mut Effects) {
        let m = &self.meta.members[member_id];
        let gone: Vec<u32> = m
            .assigned
            .iter()
            .copied()
            .filter(|s| !m.target.contains(s))
            .collect();
        self.revoke(member_id, gone, now, effects);
    }

    /// Steps 1 and 2 for `gone`, granted shards of `member_id`.
    fn revoke(&mut self, member_id: &str, gone: Vec<u32>, now: i64, effects: &mut Effects) {
        if gone.is_empty() {
            return;
        }
        let timeout = self.meta.config.rebalance_timeout_ms;
        let m = self.meta.members.get_mut(member_id).expect("live member");
        for &shard in &gone {
            m.assigned.remove(&shard);
            m.revoking.insert(
                shard,
                Revocation {
                    since_ms: now,
                    deadline_ms: now.saturating_add(timeout),
                    in_flight: 0,
                },
            );
        }
        effects.event(AuditEvent::ShardsRevokeRequested {
            member_id: member_id.to_string(),
            shards: gone,
        });
    }

    /// Revoke-before-assign step 6: a targeted shard that is free (assigned to nobody, revoking
    /// from nobody, in no fenced hold) is granted. A member still revoking
    /// shards gets nothing new until it has finished (as Kafka's reconciliation does), so it is never more
    /// than one member epoch behind what it acted on. Each grant gives the member a fresh epoch, so fencing
    /// tokens of successive owners of a shard only grow.
    fn grant(&mut self, now: i64, effects: &mut Effects, sender: Option<&str>) {
        if now < self.meta.grants_paused_until_ms {
            return;
        }
        let mut taken: BTreeSet<u32> = self.meta.holds.keys().copied().collect();
        for m in self.meta.members.values() {
            taken.extend(m.assigned_or_revoking());
        }
        let mut grants: Vec<(String, Vec<u32>)> = Vec::new();
        for (id, m) in &self.meta.members {
            if !m.state.is_assignable() || !m.revoking.is_empty() {
                continue;
            }
            // A member that has not acknowledged its epoch yet gets more only in answer to its own request.
            if m.confirmed_epoch != m.member_epoch && sender != Some(id.as_str()) {
                continue;
            }
            let free: Vec<u32> = m.pending().filter(|s| !taken.contains(s)).collect();
            if !free.is_empty() {
                grants.push((id.clone(), free));
            }
        }
        for (id, shards) in grants {
            let epoch = self.next_member_epoch(now);
            let m = self.meta.members.get_mut(&id).expect("live member");
            m.assigned.extend(shards.iter().copied());
            m.member_epoch = epoch;
            effects.event(AuditEvent::ShardsAssigned {
                member_id: id,
                member_epoch: epoch,
                shards,
            });
        }
    }

    fn advance_resharding(&mut self, effects: &mut Effects) {
        let Some(r) = &self.meta.resharding else {
            return;
        };
        if !matches!(
            r.state,
            MigrationState::Draining | MigrationState::RollingBack
        ) {
            return;
        }
        let n = self.meta.shard_count;
        let outside_held = self
            .meta
            .members
            .values()
            .any(|m| m.assigned_or_revoking().any(|s| s >= n))
            || self.meta.holds.keys().any(|&s| s >= n);
        if !outside_held {
            let r = self.meta.resharding.as_mut().expect("checked above");
            r.state = if r.state == MigrationState::Draining {
                MigrationState::Active
            } else {
                MigrationState::RolledBack
            };
            effects.changed = true;
        }
    }

    /// Epochs are unique and increasing, and never below `now * 1000`: a group recreated after losing its
    /// metadata issues epochs above its predecessor's (unless that one issued more than a thousand epochs
    /// per millisecond on average, or the store's clock went back). The counter stays within
    /// [`plausible_limit`], far below `i64::MAX`; the addition saturates anyway, so a counter that got there
    /// regardless repeats its last epoch rather than wrap to a negative one (fencing tokens never go back).
    /// Epochs are positive even on a store clock before 1970: 0 and -1 mean join and leave.
    fn next_member_epoch(&mut self, now: i64) -> i64 {
        self.meta.last_member_epoch = self
            .meta
            .last_member_epoch
            .saturating_add(1)
            .max(epoch_floor(now))
            .max(1);
        self.meta.last_member_epoch
    }

    // ---- monitoring ----

    /// The spec's invariants, checked on the metadata; empty when all hold.
    pub fn invariant_violations(&self) -> Vec<String> {
        let mut violations = Vec::new();
        let mut takers: BTreeMap<u32, Vec<&str>> = BTreeMap::new();
        for (id, m) in &self.meta.members {
            for s in m.assigned_or_revoking() {
                takers.entry(s).or_default().push(id);
            }
            if let Some(s) = m
                .owned
                .iter()
                .find(|s| !m.assigned.contains(s) && !m.revoking.contains_key(s))
            {
                violations.push(format!("{id} owns shard {s}, which it does not hold"));
            }
            if let Some(s) = m.target.iter().find(|&&s| s >= self.meta.shard_count) {
                violations.push(format!(
                    "{id} is targeted shard {s}, outside the shard count"
                ));
            }
            if !m.state.is_assignable() && !m.restarting && !m.target.is_empty() {
                violations.push(format!("{id} is {:?} but has a target", m.state));
            }
            if m.restarting && !m.assigned.is_empty() {
                violations.push(format!("{id} left for a restart but is granted shards"));
            }
        }
        for (s, hold) in &self.meta.holds {
            takers.entry(*s).or_default().push(&hold.member_id);
        }
        for (s, who) in takers {
            if who.len() > 1 {
                violations.push(format!("shard {s} is taken by {}", who.join(", ")));
            }
        }
        violations
    }
}

/// Counters (epochs, versions) count up by one; at `i64::MAX` they stay there instead of wrapping.
fn bump(counter: &mut i64) {
    *counter = counter.saturating_add(1);
}

/// The lowest member epoch issued at store time `now`.
fn epoch_floor(now: i64) -> i64 {
    now.saturating_mul(1000)
}

/// The highest member epoch or metadata version an honest store can have issued by store time `now`.
///
/// Epochs are `max(last + 1, epoch_floor(now))`: one above `epoch_floor(now + PLAUSIBLE_CLOCK_LEAD_MS)`
/// needs an issuing clock more than [`PLAUSIBLE_CLOCK_LEAD_MS`] ahead of ours, or more than a thousand
/// epochs per millisecond on average since the clock's zero (the assumption that already keeps epochs
/// growing across a loss). Metadata versions start at 0 at every creation and grow by one per change
/// (or are raised to a reported version, itself within the bound), so the same bound holds for them
/// under the same assumption. It leaves counters far below `i64::MAX`, so `+ 1` on them cannot overflow.
fn plausible_limit(now: i64) -> i64 {
    epoch_floor(now.saturating_add(PLAUSIBLE_CLOCK_LEAD_MS))
}

/// Why stored metadata cannot have been written by an honest store whose clock is near `now`, if so.
///
/// Timings must be within `1..=MAX_TIMING_MS` (what [`GroupConfig::bounded`] creates) and the shard
/// count at least 1. Counters must be in `0..=plausible_limit(now + PLAUSIBLE_CLOCK_LEAD_MS)`: a counter
/// raised to a reported value at the limit, then counted up by every change since, is still far
/// below it (a second day of lead is 86.4 billion). Above it the metadata is garbage, or the store clock
/// went back by more than a day, which already breaks the ordering of epochs across a loss: an
/// operator must look, and the coordinator must not issue epochs next to `i64::MAX`.
fn implausible_metadata(meta: &GroupMetadata, now: i64) -> Option<String> {
    let config = meta.config;
    let timings = [
        ("heartbeatIntervalMs", config.heartbeat_interval_ms),
        ("sessionTimeoutMs", config.session_timeout_ms),
        ("rebalanceTimeoutMs", config.rebalance_timeout_ms),
    ];
    if let Some((name, ms)) = timings
        .into_iter()
        .find(|(_, ms)| !(1..=metadata::MAX_TIMING_MS).contains(ms))
    {
        return Some(format!(
            "config.{name} is {ms}, outside 1..={}",
            metadata::MAX_TIMING_MS
        ));
    }
    if meta.shard_count == 0 {
        return Some("shardCount is 0".into());
    }
    let limit = plausible_limit(now.saturating_add(PLAUSIBLE_CLOCK_LEAD_MS));
    let counters = [
        ("lastMemberEpoch", meta.last_member_epoch),
        ("metadataVersion", meta.metadata_version),
        ("groupEpoch", meta.group_epoch),
        ("assignmentEpoch", meta.assignment_epoch),
    ];
    counters
        .into_iter()
        .find(|(_, n)| !(0..=limit).contains(n))
        .map(|(name, n)| {
            format!(
                "{name} is {n}, outside 0..={limit}, what a store at time {now} can have issued"
            )
        })
}

/// Structural checks that need no state: unique shards, no shard both owned and revoking, sane ids, a
/// join that owns nothing. Checked before anything else, so a malformed request changes nothing.
fn is_well_formed(req: &HeartbeatRequest) -> bool {
    if req.member_id.is_empty()
        || req.member_id.len() > MAX_MEMBER_ID_LEN
        || req.member_epoch < LEAVE_EPOCH
    {
        return false;
    }
    if req.request_id.is_empty() || req.weight == Some(0) {
        return false;
    }
    if !(0..=MAX_HOLD_AFTER_LEASE_MS).contains(&req.hold_after_lease_ms) {
        return false;
    }
    if req.restarting && req.member_epoch != LEAVE_EPOCH {
        // Only a leave can announce a restart.
        return false;
    }
    let owns_something = req.owned_shards.as_ref().is_some_and(|o| !o.is_empty());
    if req.member_epoch == JOIN_EPOCH && (owns_something || !req.revoking_shards.is_empty()) {
        // A (re)joining member has dropped all ownership (spec: UNKNOWN_MEMBER_ID handling).
        return false;
    }
    let mut seen = BTreeSet::new();
    let owned_unique = req
        .owned_shards
        .iter()
        .flatten()
        .all(|s| seen.insert(s.shard_index));
    let mut revoking = BTreeSet::new();
    let revoking_ok = req
        .revoking_shards
        .iter()
        .all(|r| revoking.insert(r.shard.shard_index) && !seen.contains(&r.shard.shard_index));
    owned_unique && revoking_ok
}

#[cfg(test)]
mod tests;
