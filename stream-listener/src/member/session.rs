//! The member's side of the heartbeat protocol, as a pure state machine.
//!
//! A [`MemberSession`] knows what one logical member believes it may read, builds each heartbeat, applies
//! each response, and turns the difference into [`ShardCommand`]s for the consumption layer. Like the
//! coordinator it takes time as an argument (here the member's own monotonic clock in ms), so the tokio
//! runtime and the seeded simulation run the very same logic.
//!
//! **Self-fencing.** A heartbeat accepted by the coordinator at store time `t` renews the lease to
//! `t + session_timeout`. The member cannot know `t`, but it knows `t` came after it sent the request, so it
//! trusts its ownership only until `sent + session_timeout - margin` on its own clock, with
//! `margin = session_timeout / 5` to absorb clock-rate differences and commands already on the wire. Past
//! that it stops reading and acknowledging ([`ShardCommand::Fence`]) before the coordinator can have
//! expired it and handed its shards on, and rejoins with epoch 0.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::clock::LocalMillis;
use crate::coordinator::wire::{
    HeartbeatRequest, HeartbeatResponse, HeartbeatStatus, RevokeState, RevokingShard,
    RuntimeConsumerCapacity, ShardId, ShardProgress, JOIN_EPOCH, LEAVE_EPOCH, PROTOCOL_VERSION,
};
use crate::member::lifecycle::{FencingToken, ShardCommand};

/// Static facts about a member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberIdentity {
    /// Stable memberId.
    pub member_id: Arc<str>,
    /// Human label.
    pub member_name: Option<String>,
    /// Static balancing weight.
    pub weight: u32,
    /// Local worker capacity (monitoring only).
    pub runtime_max_concurrency: u32,
}

/// Where the member is in its life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Phase {
    /// Must (re)join: the next heartbeat carries epoch 0.
    #[default]
    Joining,
    /// Has an epoch.
    Member,
    /// Giving everything back before the leave heartbeat.
    Leaving,
    /// The coordinator acknowledged the leave.
    Left,
}

/// The member's side of the protocol. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct MemberSession {
    identity: MemberIdentity,
    phase: Phase,
    epoch: i64,
    /// The highest member epoch ever applied: every token this session handed down is at most this.
    highest_epoch: i64,
    metadata_version: i64,
    /// Shards being read.
    owned: BTreeSet<u32>,
    /// Shards being given up, with their progress. REVOKED ones stay until a response confirms the report.
    revoking: BTreeMap<u32, (RevokeState, u32)>,
    /// The request awaiting its response, and the local time it was sent.
    in_flight: Option<(String, LocalMillis)>,
    request_seq: u64,
    incarnation: u64,
    /// Whether the next heartbeat must carry `ownedShards` (join, rejoin, ownership changed).
    full: bool,
    /// Whether the last response listed shards on their way to this member.
    awaiting: bool,
    /// Whether ownership changed since the last heartbeat was built (report it promptly).
    dirty: bool,
    /// Local time until which ownership may be trusted.
    valid_until: LocalMillis,
    session_timeout_ms: i64,
    heartbeat_interval_ms: i64,
    progress: BTreeMap<u32, ShardProgress>,
    /// Whether a leave announces a restart under the same memberId ([`MemberSession::restarts`]).
    restarting: bool,
}

impl MemberSession {
    /// A member that has not joined yet. `session_timeout_ms` is a first guess, replaced by the group's.
    /// `incarnation` must differ between processes (and restarts) using the same memberId: it makes their
    /// request ids distinct, so a restarted process's join is never mistaken for a replay of the old one's.
    pub fn new(identity: MemberIdentity, session_timeout_ms: i64, incarnation: u64) -> Self {
        Self {
            incarnation,
            identity,
            phase: Phase::Joining,
            epoch: JOIN_EPOCH,
            highest_epoch: JOIN_EPOCH,
            metadata_version: 0,
            owned: BTreeSet::new(),
            revoking: BTreeMap::new(),
            in_flight: None,
            request_seq: 0,
            full: true,
            awaiting: false,
            dirty: false,
            valid_until: LocalMillis::MIN,
            session_timeout_ms,
            heartbeat_interval_ms: 1_000,
            progress: BTreeMap::new(),
            restarting: false,
        }
    }

    /// Static membership: this memberId outlives the process (a StatefulSet pod name, a configured id),
    /// so a graceful leave announces a restart. The member still gives every shard back before it goes;
    /// the group keeps its target for its next incarnation until its lease passes, instead of moving its
    /// shards to others and back.
    pub fn restarts(mut self, restarting: bool) -> Self {
        self.restarting = restarting;
        self
    }

    /// The memberId.
    pub fn member_id(&self) -> &Arc<str> {
        &self.identity.member_id
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The member epoch in use (0 while joining).
    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    /// The highest member epoch this session has applied, across rejoins: no fencing token it handed
    /// down is above it.
    pub fn highest_epoch(&self) -> i64 {
        self.highest_epoch
    }

    /// The session timeout the coordinator last gave (a first guess until then).
    pub fn session_timeout_ms(&self) -> i64 {
        self.session_timeout_ms
    }

    /// The heartbeat interval the coordinator asked for.
    pub fn heartbeat_interval_ms(&self) -> i64 {
        self.heartbeat_interval_ms
    }

    /// How long to wait before the next heartbeat. While the assignment is in flux the member reports a
    /// change of ownership at once and polls for pending shards at a fifth of the interval, so a hand-off
    /// takes a few round trips instead of a few intervals; a settled member waits the full interval.
    pub fn next_heartbeat_delay_ms(&self) -> i64 {
        match self.phase {
            Phase::Joining => 0,
            _ if self.dirty => 0,
            _ if self.awaiting || self.draining().next().is_some() => {
                (self.heartbeat_interval_ms / 5).max(1)
            }
            _ => self.heartbeat_interval_ms,
        }
    }

    /// Shards being read now.
    pub fn owned(&self) -> &BTreeSet<u32> {
        &self.owned
    }

    /// Shards being given up that the member may still be touching (not yet REVOKED).
    pub fn draining(&self) -> impl Iterator<Item = u32> + '_ {
        self.revoking
            .iter()
            .filter(|(_, (state, _))| *state != RevokeState::Revoked)
            .map(|(s, _)| *s)
    }

    /// Local time until which ownership may be trusted.
    pub fn valid_until(&self) -> LocalMillis {
        self.valid_until
    }

    /// Whether the member may read or acknowledge `shard` at local time `now`.
    pub fn may_touch(&self, shard: u32, now: LocalMillis) -> bool {
        now < self.valid_until
            && (self.owned.contains(&shard)
                || self
                    .revoking
                    .get(&shard)
                    .is_some_and(|(state, _)| *state != RevokeState::Revoked))
    }

    /// Records progress to report in the next heartbeat.
    pub fn record_progress(&mut self, progress: ShardProgress) {
        if self.owned.contains(&progress.shard.shard_index) {
            self.progress.insert(progress.shard.shard_index, progress);
        }
    }

    /// Builds the next heartbeat, sent at local time `now`; it replaces any request still awaiting a
    /// response. The caller gives up the attempt it replaces: it never passes that attempt's response to
    /// [`on_response`](Self::on_response) (the runtime drops the call; a response it does pass answers
    /// the latest attempt).
    pub fn heartbeat(&mut self, now: LocalMillis, available_concurrency: u32) -> HeartbeatRequest {
        // A join is retried under its first requestId, so the coordinator recognises a replay; every other
        // attempt gets a new one, so a late response to an abandoned attempt is never mistaken for current.
        // A retried join is trusted from its own send time: the coordinator renews the lease of a replayed
        // join when it processes the replay, which is after this send. (Counting from the first attempt
        // instead made every join retried across a Redis stall longer than the session arrive already
        // expired: granted its shards, it self-fenced at once and joined again as a new incarnation, whose
        // shards the coordinator then held for a session.)
        let (request_id, sent_at) = match (&self.in_flight, self.phase) {
            (Some((id, _)), Phase::Joining) => (id.clone(), now),
            _ => {
                self.request_seq += 1;
                (
                    format!(
                        "{}-{:x}-{}",
                        self.identity.member_id, self.incarnation, self.request_seq
                    ),
                    now,
                )
            }
        };
        self.in_flight = Some((request_id.clone(), sent_at));
        self.dirty = false;
        let epoch = match self.phase {
            Phase::Joining => JOIN_EPOCH,
            Phase::Leaving | Phase::Left => LEAVE_EPOCH,
            Phase::Member => self.epoch,
        };
        let joining = self.phase == Phase::Joining;
        HeartbeatRequest {
            protocol_version: PROTOCOL_VERSION,
            request_id,
            member_id: self.identity.member_id.to_string(),
            member_name: self.identity.member_name.clone(),
            member_epoch: epoch,
            metadata_version: self.metadata_version,
            runtime_consumer_capacity: RuntimeConsumerCapacity {
                runtime_max_concurrency: self.identity.runtime_max_concurrency,
                available_concurrency,
            },
            owned_shards: (self.full || joining)
                .then(|| self.owned.iter().copied().map(ShardId::new).collect()),
            revoking_shards: if joining {
                Vec::new()
            } else {
                self.revoking
                    .iter()
                    .map(|(&s, &(state, in_flight))| RevokingShard {
                        shard: ShardId::new(s),
                        state,
                        in_flight,
                        acked_at: None,
                    })
                    .collect()
            },
            shard_progress: self.progress.values().cloned().collect(),
            weight: Some(self.identity.weight),
            restarting: self.restarting && matches!(self.phase, Phase::Leaving | Phase::Left),
            // A member of this library self-fences within its lease and reads through its fences.
            hold_after_lease_ms: 0,
        }
    }

    /// Applies a response; returns what the consumption layer must do.
    /// Responses to anything but the request in flight (duplicates, late arrivals) are ignored.
    #[must_use = "the consumption layer must carry out these shard commands"]
    pub fn on_response(&mut self, resp: &HeartbeatResponse) -> Vec<ShardCommand> {
        let Some((request_id, sent_at)) = self.in_flight.clone() else {
            return Vec::new();
        };
        if resp.response_to != request_id {
            return Vec::new();
        }
        self.in_flight = None;
        self.progress.clear();
        if resp.status.requires_rejoin() {
            return self.drop_everything();
        }
        if !resp.status.is_accepted() {
            // RETRY, INVALID_REQUEST, UNSUPPORTED_PROTOCOL: nothing was applied; ownership stays as it was.
            return Vec::new();
        }
        if resp.session_timeout_ms > 0 {
            self.session_timeout_ms = resp.session_timeout_ms;
        }
        self.heartbeat_interval_ms = resp.heartbeat_interval_ms.max(1);
        self.valid_until = sent_at.plus_ms(self.session_timeout_ms - self.session_timeout_ms / 5);
        self.metadata_version = resp.metadata_version;
        // While the coordinator waits for revocations, report everything in full: shards it took back
        // before this member ever saw them are released by not being mentioned.
        self.full = resp.status == HeartbeatStatus::RevokePending;
        // REVOKED reports carried by the request are now accepted.
        self.revoking
            .retain(|_, (state, _)| *state != RevokeState::Revoked);
        if resp.member_epoch == LEAVE_EPOCH {
            if self.phase == Phase::Leaving || self.phase == Phase::Left {
                self.phase = Phase::Left;
            }
            return self.drop_everything_quietly();
        }
        self.epoch = resp.member_epoch;
        self.highest_epoch = self.highest_epoch.max(self.epoch);
        self.awaiting = !resp.assignment.pending_shards.is_empty();
        if self.phase == Phase::Joining {
            self.phase = Phase::Member;
        }
        let mut commands = Vec::new();
        let assigned: BTreeSet<u32> = resp
            .assignment
            .assigned_shards
            .iter()
            .map(|s| s.shard_index)
            .collect();
        let to_revoke: Vec<u32> = self
            .owned
            .iter()
            .copied()
            .filter(|s| !assigned.contains(s))
            .collect();
        for shard in to_revoke {
            self.owned.remove(&shard);
            self.revoking.insert(shard, (RevokeState::Revoking, 0));
            self.full = true;
            commands.push(ShardCommand::Revoke { shard });
        }
        if self.phase == Phase::Member {
            let token = FencingToken {
                member_id: self.identity.member_id.clone(),
                member_epoch: self.epoch,
            };
            for &shard in &assigned {
                if !self.owned.contains(&shard) && !self.revoking.contains_key(&shard) {
                    self.owned.insert(shard);
                    self.full = true;
                    commands.push(ShardCommand::Assign {
                        shard,
                        token: token.clone(),
                    });
                }
            }
        }
        self.dirty |= !commands.is_empty();
        commands
    }

    /// The consumption layer stopped new reads of a revoked shard; `in_flight` handlers remain.
    pub fn on_draining(&mut self, shard: u32, in_flight: u32) {
        if let Some(entry) = self.revoking.get_mut(&shard) {
            if entry.0 != RevokeState::Revoked {
                *entry = (RevokeState::Draining, in_flight);
            }
        }
    }

    /// The consumption layer finished a revoked shard: report REVOKED.
    pub fn on_revoked(&mut self, shard: u32) {
        if let Some(entry) = self.revoking.get_mut(&shard) {
            *entry = (RevokeState::Revoked, 0);
            self.dirty = true;
        }
    }

    /// Checks the self-fencing deadline at local time `now`.
    #[must_use = "the consumption layer must carry out these shard commands"]
    pub fn check_lease(&mut self, now: LocalMillis) -> Vec<ShardCommand> {
        let holds_something = !self.owned.is_empty() || self.draining().next().is_some();
        let active = matches!(self.phase, Phase::Member | Phase::Leaving);
        if active && now >= self.valid_until && holds_something {
            return self.drop_everything();
        }
        Vec::new()
    }

    /// Starts a graceful leave: heartbeats carry epoch -1 from now on, every owned shard is revoked, and the
    /// coordinator removes the member once all are REVOKED (the response then carries epoch -1).
    #[must_use = "the consumption layer must carry out these shard commands"]
    pub fn begin_leave(&mut self) -> Vec<ShardCommand> {
        if self.phase != Phase::Member {
            self.phase = Phase::Left;
            return Vec::new();
        }
        self.phase = Phase::Leaving;
        let owned = std::mem::take(&mut self.owned);
        self.full = true;
        owned
            .into_iter()
            .map(|shard| {
                self.revoking.insert(shard, (RevokeState::Revoking, 0));
                ShardCommand::Revoke { shard }
            })
            .collect()
    }

    /// The spec's UNKNOWN_MEMBER_ID handling: stop reads and ACKs, clear owned and revoking state, and
    /// send the next full heartbeat with the same memberId and epoch 0.
    fn drop_everything(&mut self) -> Vec<ShardCommand> {
        let had_anything = !self.owned.is_empty() || !self.revoking.is_empty();
        self.drop_everything_quietly();
        if self.phase != Phase::Left {
            self.phase = Phase::Joining;
            self.epoch = JOIN_EPOCH;
        }
        if had_anything {
            vec![ShardCommand::Fence]
        } else {
            Vec::new()
        }
    }

    fn drop_everything_quietly(&mut self) -> Vec<ShardCommand> {
        // A response to anything sent before this point describes ownership that no longer exists.
        self.in_flight = None;
        self.owned.clear();
        self.revoking.clear();
        self.progress.clear();
        self.full = true;
        self.valid_until = LocalMillis::MIN;
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::wire::Assignment;

    fn session() -> MemberSession {
        let identity = MemberIdentity {
            member_id: Arc::from("m0"),
            member_name: None,
            weight: 1,
            runtime_max_concurrency: 1,
        };
        MemberSession::new(identity, 5_000, 1)
    }

    fn joined(request: &HeartbeatRequest, shards: &[u32]) -> HeartbeatResponse {
        HeartbeatResponse {
            response_to: request.request_id.clone(),
            status: HeartbeatStatus::Ok,
            member_id: request.member_id.clone(),
            member_epoch: 7,
            heartbeat_interval_ms: 500,
            rebalance_timeout_ms: 5_000,
            session_timeout_ms: 5_000,
            group_epoch: 1,
            assignment_epoch: 1,
            metadata_version: 1,
            shard_count: 2,
            assignment: Assignment {
                assigned_shards: shards.iter().copied().map(ShardId::new).collect(),
                ..Assignment::default()
            },
        }
    }

    #[test]
    fn a_join_retried_after_a_stall_is_trusted_from_the_retry_and_keeps_its_shards() {
        let mut member = session();
        // The first attempt goes out as Redis stalls; retries follow, the last one 12 s later (a stall
        // longer than the 5 s session), and its answer is a replay of the first.
        let first = member.heartbeat(LocalMillis(1_000), 0);
        let retry = member.heartbeat(LocalMillis(13_000), 0);
        assert_eq!(
            retry.request_id, first.request_id,
            "a join retries under its id"
        );
        let commands = member.on_response(&joined(&retry, &[0, 1]));
        assert_eq!(commands.len(), 2, "both shards granted: {commands:?}");
        assert_eq!(member.valid_until(), LocalMillis(13_000 + 4_000));
        assert!(
            member.check_lease(LocalMillis(13_001)).is_empty(),
            "the member self-fenced a grant it had just received"
        );
        assert!(member.may_touch(0, LocalMillis(16_999)));
        assert!(!member.may_touch(0, LocalMillis(17_000)));
    }

    #[test]
    fn a_response_to_a_replaced_attempt_other_than_a_join_is_ignored() {
        let mut member = session();
        let join = member.heartbeat(LocalMillis(0), 0);
        let _ = member.on_response(&joined(&join, &[0]));
        let first = member.heartbeat(LocalMillis(1_000), 0);
        let second = member.heartbeat(LocalMillis(9_000), 0);
        assert_ne!(first.request_id, second.request_id);
        assert!(member.on_response(&joined(&first, &[0])).is_empty());
        assert_eq!(
            member.valid_until(),
            LocalMillis(4_000),
            "the ignored response renewed trust"
        );
    }
}
