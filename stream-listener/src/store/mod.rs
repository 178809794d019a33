//! The metadata store: the coordinator core persisted in Redis, with no coordinator server to deploy.
//!
//! Any member process applies inputs to a group: it runs the pure [`Coordinator`] on its cached snapshot
//! and writes the outcome back under the **store revision** compare-and-set. Redis is the one source of
//! truth and the one clock (`TIME`, read inside the scripts).
//!
//! * **Steady state** ([`Change::Lease`]): one `renew` script renews the sender's lease in a sorted set,
//!   after checking that the revision is the cached one, that no lease has run out and that no timer of the
//!   snapshot is due. Its work is `O(log members)`; the snapshot is not rewritten.
//! * **Real changes** ([`Change::Metadata`]): one `commit` script writes what changed, increments the
//!   revision, moves leases and appends the audit events to a capped stream, all or nothing. It refuses if
//!   the revision moved, if the core's `now` is ahead of Redis time, or if a member the core removed renewed
//!   its lease meanwhile (its fenced hold would be too short).
//! * **Writes grow with the change, not the group.** The snapshot is stored as a header (everything but the
//!   members, which it counts) and one record per member in a hash. The cache remembers what Redis holds at
//!   its revision (each member's record, a lower bound of each lease), so a commit sends the header, the
//!   records that changed, the ones to delete and the leases that moved: a join into 1,000 members x
//!   10,000 shards writes kilobytes. The revision compare-and-set makes the difference exact: at the
//!   expected revision Redis holds what the cache saw. The monitoring projection is computed by readers.
//! * **One writer at a time.** A process that must commit first takes the group's writer lock (a short
//!   `SET NX PX`); processes that find it taken wait in Redis (`BLPOP` on a turn list that the writer pushes
//!   to when it releases), in arrival order, instead of reloading and colliding. A join storm of `n`
//!   members therefore costs `O(n)` loads and commits, not `O(n^2)`. The lock is for speed only: the
//!   revision compare-and-set stays the safety guard, so a writer that paused past the lock's expiry is
//!   refused at commit like any stale writer.
//! * **Batched commits.** A heartbeat that needs a real change queues itself in the group's inbox (one
//!   script: `RPUSH` and `SET NX` of the writer lock). Whoever has the lock applies its own input and
//!   up to 512 queued heartbeats to one snapshot and commits them in **one** write; the
//!   commit script answers each queued sender on its own reply key, after the write. Waiting senders block
//!   in Redis on their reply key and the turn list, so a join storm of `n` members costs about `n / BATCH`
//!   commits per round instead of `n`. Applying another member's heartbeat is exactly what that member
//!   would have done itself, under the same compare-and-set; an answer its sender stopped waiting for is a
//!   lost response, which the core already handles.
//! * On any refusal the store reloads and applies the input again, up to 16 attempts (ticks and operator
//!   commands spread theirs with jitter). A member whose heartbeats go through the writer reloads only
//!   now and then without a cache, so a large group is not read whole by every member after every answer.
//! * **Lost metadata.** A missing snapshot is never trusted to mean a new group: the store creates it with
//!   [`Coordinator::create`], which pauses grants until members of a lost state have self-fenced
//!   ([`Creation::AfterLoss`] when the revision or leases survived, [`Creation::Fresh`] otherwise), and
//!   starts member epochs above any earlier ones. Revisions are `max(previous + 1, now * 1000)`, so they
//!   never repeat after a loss or a rollback and a stale cache can never match them.
//!
//! Key layout (one Redis Cluster slot per group thanks to the hash tag): see [`GroupKeys`].
//!
//! The files, one concern each: this facade ([`GroupStore`]: create or open, heartbeat, tick, command,
//! load, projection, and the three script calls that read or write the snapshot); `snapshot.rs`, the
//! cached snapshot and the pure rules of loading and committing it; `scripts.rs`, every script's keys,
//! arguments and reply; `writer.rs`, the writer lock and batching; `keys.rs`, `error.rs`, `stats.rs`;
//! `inbox.rs`, the queued heartbeats' format; `wakeup.rs`, who a commit wakes.

mod error;
mod inbox;
mod keys;
mod scripts;
mod snapshot;
mod stats;
pub mod wakeup;
mod writer;

use std::time::{Duration, Instant};

use crate::clock::StoreMillis;
use crate::connection::Connection;
use crate::coordinator::events::AuditEvent;
use crate::coordinator::metadata::GroupConfig;
use crate::coordinator::projection::{group_state, GroupProjection, GroupState};
use crate::coordinator::wire::{HeartbeatRequest, HeartbeatResponse};
use crate::coordinator::{
    AdminCommand, Change, CommandError, Coordinator, Creation, Outcome, Writes,
};

pub use error::StoreError;
pub use keys::GroupKeys;
pub use stats::{stats, StoreStats};

use scripts::{decode_load, decode_reply, CommitArgs, LoadTuple, Scripts};
use snapshot::{loaded, Loaded, Snapshot};
use stats::{Counters, Stat};
use writer::{Answering, Prepared};

/// Attempts of one input before giving up with [`StoreError::Contention`].
const MAX_ATTEMPTS: u32 = 16;
/// While a member's heartbeats go through the writer, one in this many reads the snapshot (to go back to
/// renewing on its own); the others are queued again.
const RELOAD_ONE_IN: u64 = 4;

/// The rule for a heartbeat that finds no cache: queue it for the writer (`true`) or read the snapshot.
/// Queue when our last heartbeat changed the group and another writer applied it (`defer_reload`), and,
/// while our heartbeats go through the writer (`in_flux`), on a heartbeat's first attempt unless `draw`
/// (uniform in `0..RELOAD_ONE_IN`) is 0. A renewal refused just now (a later attempt) reloads: queueing
/// it would commit, and refuse the other members' renewals in turn.
fn queues_without_cache(defer_reload: bool, in_flux: bool, attempt: u32, draw: u64) -> bool {
    defer_reload || (attempt == 0 && in_flux && draw != 0)
}

/// One process's handle on one group's metadata in Redis. Cheap to create; keeps a cached snapshot.
#[derive(Debug)]
pub struct GroupStore {
    conn: Connection,
    keys: GroupKeys,
    group: String,
    /// The shard count and settings of a group this handle creates when it has no metadata (or lost
    /// it); `None` for a handle on an existing group ([`GroupStore::open`]).
    create: Option<(u32, GroupConfig)>,
    /// The last snapshot Redis accepted, and only that: an input takes it out, and it comes back only once
    /// Redis accepted the write (or nothing needed writing), so a failed, refused or abandoned (dropped
    /// future) write never leaves an uncommitted state here for the next input to build on. `None`: the
    /// next input reads one ([`GroupStore::read_snapshot`]).
    cache: Option<Snapshot>,
    /// The group state of the cached revision (see [`GroupStore::group_state`]).
    state: Option<(i64, GroupState)>,
    /// Last Redis time seen and the local instant it was seen at: `now` for the core between reads.
    clock: Option<(i64, Instant)>,
    /// Our last heartbeat changed the group and was answered by another process's commit: queue the
    /// next one without reading the snapshot first (see [`GroupStore::heartbeat`]).
    defer_reload: bool,
    /// Our heartbeats were queued for the writer since one was last served by our own cache (they
    /// changed the group, or one failed or was abandoned): without a cache, only one heartbeat in
    /// [`RELOAD_ONE_IN`] reads the snapshot; the others are queued again (see [`GroupStore::heartbeat`]).
    in_flux: bool,
    /// The group's heartbeat interval as last read.
    interval_ms: i64,
    /// The group's session timeout as last read.
    session_ms: i64,
    /// The round trip of the last lease renewal or enqueue (see `writer.rs`, `slow_link`).
    last_round_trip: Duration,
    scripts: Scripts,
    stats: Counters,
}

impl GroupStore {
    /// A member's handle on `group` of `stream`: a group without metadata is created with `shard_count`
    /// and `config` on the first write (and recreated with them if its metadata was lost); an existing
    /// group keeps its own. `conn` is a [`Connection`] (a `ConnectionManager` converts into one).
    pub fn create(
        conn: impl Into<Connection>,
        stream: &str,
        group: &str,
        shard_count: u32,
        config: GroupConfig,
    ) -> Result<Self, StoreError> {
        Self::with(conn.into(), stream, group, Some((shard_count, config)))
    }

    /// A handle on the existing `group` of `stream`, for operators and followers: it never creates the
    /// group; reads and writes fail with [`StoreError::Missing`] while the group has no metadata.
    pub fn open(
        conn: impl Into<Connection>,
        stream: &str,
        group: &str,
    ) -> Result<Self, StoreError> {
        Self::with(conn.into(), stream, group, None)
    }

    fn with(
        conn: Connection,
        stream: &str,
        group: &str,
        create: Option<(u32, GroupConfig)>,
    ) -> Result<Self, StoreError> {
        for name in [stream, group] {
            if name.is_empty() || name.contains(['{', '}', '/']) {
                return Err(StoreError::InvalidName(name.to_string()));
            }
        }
        let config = create.map_or_else(GroupConfig::default, |(_, config)| config);
        Ok(Self {
            conn,
            keys: GroupKeys::new(stream, group),
            group: group.to_string(),
            create,
            cache: None,
            state: None,
            clock: None,
            defer_reload: false,
            in_flux: false,
            interval_ms: config.heartbeat_interval_ms,
            session_ms: config.session_timeout_ms,
            last_round_trip: Duration::ZERO,
            scripts: Scripts::new(),
            stats: Counters::registered(),
        })
    }

    /// The group's keys.
    pub fn keys(&self) -> &GroupKeys {
        &self.keys
    }

    /// What this handle did so far (the process's total over every handle: [`stats()`]).
    pub fn stats(&self) -> StoreStats {
        self.stats.get()
    }

    /// The group's state in the cached snapshot (what the last heartbeat saw), `None` before the first
    /// load. Computed once per store revision, so a steady heartbeat pays nothing for it.
    pub fn group_state(&mut self) -> Option<GroupState> {
        let snapshot = self.cache.as_ref()?;
        match self.state {
            Some((revision, state)) if revision == snapshot.revision => Some(state),
            _ => {
                let state = group_state(snapshot.coordinator.metadata());
                self.state = Some((snapshot.revision, state));
                Some(state)
            }
        }
    }

    /// Applies one heartbeat: on the cache when it changes nothing or only renews the sender's lease, else
    /// queued for the writer (which may be this call) and committed in a batch.
    pub async fn heartbeat(
        &mut self,
        req: &HeartbeatRequest,
    ) -> Result<HeartbeatResponse, StoreError> {
        for attempt in 0..MAX_ATTEMPTS {
            let mut snapshot = match self.cache.take() {
                Some(snapshot) => snapshot,
                // Our last heartbeat changed the group and was applied by another process: the
                // assignment is still moving, so queue this one too instead of reading the whole
                // snapshot now (in a storm, a reload per member per change is O(n^2) bytes). While
                // our heartbeats go through the writer, only some reload, so that a large group's
                // members do not all read it at once after every answer or every slow attempt. A
                // renewal refused just now reloads: queueing it would commit, move the revision and
                // refuse the others' renewals in turn.
                None if queues_without_cache(
                    self.defer_reload,
                    self.in_flux,
                    attempt,
                    crate::util::random_below(RELOAD_ONE_IN),
                ) =>
                {
                    return self.queued(req, None).await
                }
                None => self.read_snapshot().await?,
            };
            let now = self.now();
            let outcome = snapshot.coordinator.heartbeat(req, now);
            // Until the member records are stored in this layout, or while the sender's lease is missing
            // from the lease set (damaged), renewals are refused: commit instead.
            let unstored =
                snapshot.stored.rewrite || !snapshot.stored.leases.contains_key(&req.member_id);
            let change = match outcome.change {
                Change::Lease if unstored => Change::Metadata,
                change => change,
            };
            match change {
                Change::None => {
                    self.in_flux = false;
                    self.cache = Some(snapshot);
                    return Ok(outcome.response);
                }
                Change::Lease => {
                    if self.renew(&mut snapshot, &req.member_id).await? {
                        self.in_flux = false;
                        self.cache = Some(snapshot);
                        return Ok(outcome.response);
                    }
                    // Refused: the group moved on; read it again and look again.
                }
                Change::Metadata => {
                    let prepared = Prepared {
                        snapshot,
                        now,
                        outcome,
                    };
                    return self.queued(req, Some(prepared)).await;
                }
            }
        }
        Err(StoreError::Contention)
    }

    /// Applies timers that are due (expiry, rebalance timeouts, fenced holds), committing if anything
    /// changed.
    pub async fn tick(&mut self) -> Result<(), StoreError> {
        self.cache = None;
        self.apply(|c, now| c.tick(now)).await
    }

    /// Applies an operator command.
    pub async fn command(
        &mut self,
        command: AdminCommand,
    ) -> Result<Result<(), CommandError>, StoreError> {
        self.cache = None;
        self.apply(|c, now| c.command(command.clone(), now)).await
    }

    /// The current snapshot, freshly read (for operators and tests).
    pub async fn load(&mut self) -> Result<(i64, Coordinator), StoreError> {
        let snapshot = self.read_snapshot().await?;
        let loaded = (snapshot.revision, snapshot.coordinator.clone());
        self.cache = Some(snapshot);
        Ok(loaded)
    }

    /// The Redis time of the last commit this handle loaded, if the stored header has one (documents
    /// written before it was recorded do not).
    pub fn committed_at(&self) -> Option<StoreMillis> {
        self.cache.as_ref()?.stored.committed_at
    }

    /// The monitoring projection as of the last commit (`at_ms` is its store time), computed from a fresh
    /// load: nothing stores it, so commits do not rewrite it. `None` while the group has no metadata.
    pub async fn projection(&mut self) -> Result<Option<GroupProjection>, StoreError> {
        let snapshot = match self.read_snapshot().await {
            Ok(snapshot) => snapshot,
            Err(StoreError::Missing { .. }) => return Ok(None),
            Err(error) => return Err(error),
        };
        let projection = if snapshot.stored.created {
            None // this handle would create the group
        } else {
            let at = snapshot.stored.committed_at.unwrap_or_else(|| self.now());
            Some(snapshot.coordinator.projection(at))
        };
        self.cache = Some(snapshot);
        Ok(projection)
    }

    /// Applies an input that is not a heartbeat under the writer lock (the heartbeats others queued wait
    /// for the next writer).
    async fn apply<R>(
        &mut self,
        mut input: impl FnMut(&mut Coordinator, StoreMillis) -> Outcome<R>,
    ) -> Result<R, StoreError> {
        let token = self.lock().await?;
        // If this future is dropped (the caller's timeout) while it has the lock, release it anyway.
        let guard = self.lock_guard(&token);
        let result = async {
            for attempt in 0..MAX_ATTEMPTS {
                if attempt > 0 {
                    // Someone wrote without the lock (it expired while we worked): spread out and retry.
                    let jitter = crate::util::random_below(2 + u64::from(attempt) * 3) + 1;
                    tokio::time::sleep(Duration::from_millis(jitter)).await;
                }
                if let Some(response) = self.attempt(&mut input).await? {
                    return Ok(response);
                }
            }
            Err(StoreError::Contention)
        }
        .await;
        guard.disarm();
        self.unlock(&token).await;
        if result.is_err() {
            self.cache = None;
        }
        result
    }

    /// Reads the snapshot, runs the input on it and writes the outcome. `None`: refused, nothing is
    /// cached.
    async fn attempt<R>(
        &mut self,
        input: &mut impl FnMut(&mut Coordinator, StoreMillis) -> Outcome<R>,
    ) -> Result<Option<R>, StoreError> {
        let mut snapshot = self.read_snapshot().await?;
        let now = self.now();
        let outcome = input(&mut snapshot.coordinator, now);
        let written = match outcome.change {
            Change::None => true,
            // Only heartbeats renew a lease; anything else that moved one is committed in full.
            Change::Lease | Change::Metadata => {
                self.commit(
                    &mut snapshot,
                    now,
                    &outcome.writes,
                    &outcome.events,
                    &Answering::default(),
                )
                .await?
            }
        };
        if !written {
            return Ok(None);
        }
        self.cache = Some(snapshot);
        Ok(Some(outcome.response))
    }

    /// The store clock: the last Redis `TIME` plus the local time elapsed since it was read.
    fn now(&self) -> StoreMillis {
        let (redis_ms, at) = self.clock.expect("set by every script reply");
        StoreMillis(redis_ms + at.elapsed().as_millis() as i64)
    }

    fn observe_time(&mut self, redis_ms: i64) {
        self.clock = Some((redis_ms, Instant::now()));
    }

    /// Reads the group's snapshot from Redis (one pipeline of reads, [`scripts::load`], then [`loaded`]), for the caller to cache once
    /// what it does with it is in Redis. The cache is left as it is.
    async fn read_snapshot(&mut self) -> Result<Snapshot, StoreError> {
        let mut torn = 0;
        let reply = loop {
            let reply: LoadTuple = scripts::load(&self.keys)
                .query_async(&mut self.conn)
                .await?;
            match decode_load(reply) {
                Some(reply) => break reply,
                // A commit came between the reads: read again.
                None if torn + 1 < MAX_ATTEMPTS => torn += 1,
                None => return Err(StoreError::Contention),
            }
        };
        self.observe_time(reply.now);
        self.stats.add(Stat::Loads, 1);
        self.stats.add(Stat::LoadBytes, reply.bytes() as u64);
        let Loaded {
            snapshot,
            creation,
            lost_records,
        } = loaded(reply, &self.group, self.create, &self.keys)?;
        if let Some(source) = lost_records {
            tracing::warn!(key = %self.keys.members, %source, "group metadata lost member records; recreating it, with grants paused until every member of the lost state has self-fenced");
        }
        if creation == Some(Creation::AfterLoss) {
            tracing::warn!(key = %self.keys.meta, revision = snapshot.revision, leases = snapshot.stored.leases.len(), "group metadata is missing but its revision or leases exist: it was lost; recreating it, with grants paused until every member of the lost state has self-fenced");
        }
        let config = &snapshot.coordinator.metadata().config;
        self.interval_ms = config.heartbeat_interval_ms;
        self.session_ms = config.session_timeout_ms;
        Ok(snapshot)
    }

    /// Renews `member`'s lease (`renew.lua`) if nothing else needs a commit. `false`: refused, the group
    /// moved on.
    async fn renew(&mut self, snapshot: &mut Snapshot, member: &str) -> Result<bool, StoreError> {
        let timer = snapshot.coordinator.next_timer().map_or(-1, |t| t.0);
        let session = snapshot.coordinator.metadata().config.session_timeout_ms;
        let sent = Instant::now();
        let reply: Vec<i64> = self
            .scripts
            .renew(&self.keys, snapshot.revision, member, session, timer)
            .invoke_async(&mut self.conn)
            .await?;
        self.last_round_trip = sent.elapsed();
        let (renewed, now, min_lease) = decode_reply("renew.lua", reply)?;
        self.observe_time(now);
        let Some(min_lease) = min_lease.filter(|_| renewed) else {
            return Ok(false);
        };
        self.stats.add(Stat::Renewals, 1);
        snapshot.renewed(member, now, session, min_lease);
        Ok(true)
    }

    /// Writes the snapshot with the writes and events of the inputs applied to it, trims the `taken`
    /// queued heartbeats and pushes their `answers`, all under the revision compare-and-set (`commit.lua`).
    /// `false`: refused.
    async fn commit(
        &mut self,
        snapshot: &mut Snapshot,
        now: StoreMillis,
        writes: &Writes,
        events: &[AuditEvent],
        answering: &Answering,
    ) -> Result<bool, StoreError> {
        let delta = snapshot.stored.delta(
            snapshot.coordinator.metadata(),
            writes,
            now,
            events.is_empty() && writes.lease_checks.is_empty(),
        );
        let wake = wakeup::to_wake(events, &answering.answered);
        let args = CommitArgs {
            revision: snapshot.revision,
            delta: &delta,
            lease_checks: &writes.lease_checks,
            events,
            taken: answering.taken,
            answer_ttl_ms: self.queue_ttl_ms().max(1000),
            answers: &answering.answers,
            wake_channel: &self.keys.wake,
            wake: &wake,
        };
        let reply: Vec<i64> = self
            .scripts
            .commit(&self.keys, &args)
            .invoke_async(&mut self.conn)
            .await?;
        let (committed, now, revision) = decode_reply("commit.lua", reply)?;
        self.observe_time(now);
        let Some(revision) = revision.filter(|_| committed) else {
            self.stats.add(Stat::Conflicts, 1);
            return Ok(false);
        };
        self.stats.add(Stat::Commits, 1);
        self.stats.add(Stat::CommitBytes, delta.bytes() as u64);
        // Redis now holds what was sent.
        snapshot.stored.committed(delta);
        snapshot.revision = revision;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::metadata::GroupMetadata;
    use proptest::prelude::*;

    #[test]
    fn rule_without_a_cache_a_member_in_flux_reloads_one_first_attempt_in_four() {
        let queued = |defer, flux, attempt| {
            (0..RELOAD_ONE_IN)
                .filter(|&draw| queues_without_cache(defer, flux, attempt, draw))
                .count()
        };
        assert_eq!(queued(false, false, 0), 0, "settled: always reload");
        assert_eq!(
            queued(false, true, 0),
            3,
            "in flux: one draw in four reloads"
        );
        assert_eq!(
            queued(false, true, 1),
            0,
            "a renewal refused just now reloads"
        );
        assert_eq!(
            queued(true, false, 3),
            4,
            "answered as a change: always queue"
        );
    }

    proptest! {
        /// Stored JSON comes from Redis: whatever it holds, a load fails cleanly, never panics.
        #[test]
        fn metadata_json_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = GroupMetadata::from_json(&bytes);
        }

        /// Valid JSON of a plausible shape with wrong values must still only fail.
        #[test]
        fn mangled_metadata_never_panics(
            field in prop_oneof![Just("shardCount"), Just("members"), Just("lastMemberEpoch"), Just("holds")],
            value in prop_oneof![Just("-1"), Just("null"), Just("\"x\""), Just("[1,2]"), Just("{\"a\":{}}"), Just("1e400")],
        ) {
            let mut json: serde_json::Value =
                serde_json::from_slice(&GroupMetadata::new("g", 4, GroupConfig::default()).to_json()).unwrap();
            json[field] = serde_json::from_str(value).unwrap_or(serde_json::Value::Null);
            let _ = GroupMetadata::from_json(json.to_string().as_bytes())
                .and_then(|meta| Coordinator::from_metadata(meta, StoreMillis(1_700_000_000_000)));
        }
    }
}
