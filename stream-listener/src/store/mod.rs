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
//! * On any refusal the store reloads and applies the input again: bounded retries with jitter.
//! * **Lost metadata.** A missing snapshot is never trusted to mean a new group: the store creates it with
//!   [`Coordinator::create`], which pauses grants until members of a lost state have self-fenced
//!   ([`Creation::AfterLoss`] when the revision or leases survived, [`Creation::Fresh`] otherwise), and
//!   starts member epochs above any earlier ones. Revisions are `max(previous + 1, now * 1000)`, so they
//!   never repeat after a loss or a rollback and a stale cache can never match them.
//!
//! Key layout (one Redis Cluster slot per group thanks to the hash tag): see [`GroupKeys`].

mod inbox;
pub mod wakeup;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use redis::{Script, Value};

use crate::clock::StoreMillis;
use crate::connection::Connection;

use crate::coordinator::events::AuditEvent;
use crate::coordinator::metadata::{
    GroupConfig, GroupMetadata, MemberRecord, MetadataError, SCHEMA_VERSION, WHOLE_SCHEMA_VERSION,
};
use crate::coordinator::projection::{group_state, GroupProjection, GroupState};
use crate::coordinator::wire::{HeartbeatRequest, HeartbeatResponse};
use crate::coordinator::{
    AdminCommand, Change, CommandError, Coordinator, Creation, Outcome, Writes,
};

/// Attempts of one input before giving up with [`StoreError::Contention`].
const MAX_ATTEMPTS: u32 = 16;
/// Audit entries kept (approximately).
const AUDIT_MAX_LEN: u64 = 10_000;
/// How long the writer lock lives if its writer never releases it (crashed or paused). The writer extends
/// it before every batch.
const WRITER_LOCK_MS: u64 = 1000;
/// Batches one writer commits before letting others have a turn.
const MAX_BATCHES: usize = 64;
/// A queued heartbeat whose sender stops waiting this soon is not applied: its answer would come too late.
const DEADLINE_MARGIN_MS: i64 = 20;
/// How long a sender waits for its queued heartbeat to be applied before giving up.
const MAX_QUEUED_WAIT: Duration = Duration::from_secs(30);
/// How long one wait for the writer lock blocks in Redis before trying again.
const WRITER_WAIT_S: f64 = 0.05;

/// The Redis keys of one group.
///
/// | key | type | what it is |
/// | --- | --- | --- |
/// | `sl:{<stream>/<group>}:meta` | string | the metadata header (JSON, schema version 2: everything but the members, their count) |
/// | `sl:{<stream>/<group>}:members` | hash | memberId -> that member's record (JSON, without its lease) |
/// | `sl:{<stream>/<group>}:rev` | string | the store revision, incremented by every commit |
/// | `sl:{<stream>/<group>}:leases` | sorted set | memberId scored by lease deadline (Redis ms) |
/// | `sl:{<stream>/<group>}:audit` | stream | audit events, capped at about 10,000 |
/// | `sl:{<stream>/<group>}:projection` | string | schema version 1's stored projection; deleted by the next commit |
/// | `sl:{<stream>/<group>}:writer` | string | the writer lock (writer's token, expires after 1 s unless extended) |
/// | `sl:{<stream>/<group>}:turn` | list | wakes one waiting writer when the lock is released |
/// | `sl:{<stream>/<group>}:inbox` | list | heartbeats queued for the writer (see `store/inbox.rs`) |
/// | `sl:{<stream>/<group>}:reply:<id>` | list | the answer to one queued heartbeat (short-lived) |
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupKeys {
    /// Metadata header.
    pub meta: String,
    /// Member records.
    pub members: String,
    /// Store revision.
    pub rev: String,
    /// Leases.
    pub leases: String,
    /// Audit stream.
    pub audit: String,
    /// The monitoring projection schema version 1 stored (deleted by the next commit).
    pub projection: String,
    /// Writer lock.
    pub writer: String,
    /// Writer wake-ups.
    pub turn: String,
    /// Heartbeats queued for the writer.
    pub inbox: String,
    /// The wake-up channel (pub/sub, not a key; see [`wakeup`]).
    pub wake: String,
}

impl GroupKeys {
    /// The keys of `group` reading `stream` (see [`crate::names::group_key`]).
    pub fn new(stream: &str, group: &str) -> Self {
        use crate::names::{group as suffix, group_key};
        let key = |suffix: &str| group_key(stream, group, suffix);
        Self {
            meta: key(suffix::META),
            members: key(suffix::MEMBERS),
            rev: key(suffix::REVISION),
            leases: key(suffix::LEASES),
            audit: key(suffix::AUDIT),
            projection: key(suffix::PROJECTION),
            writer: key(suffix::WRITER),
            turn: key(suffix::TURN),
            inbox: key(suffix::INBOX),
            wake: key(suffix::WAKE),
        }
    }

    /// Where the answer to the queued heartbeat `id` is pushed ([`crate::names::group_reply`]).
    pub fn reply(&self, id: &str) -> String {
        // Every key of the group is `<base>:<suffix>`; `meta`'s base is the group's.
        let meta_suffix = format!(":{}", crate::names::group::META);
        let base = self.meta.strip_suffix(&meta_suffix).unwrap_or(&self.meta);
        format!("{base}:{}:{id}", crate::names::group::REPLY)
    }
}

/// Why the store could not apply an input.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Redis failed or is unreachable.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The stored snapshot cannot be used; it is left untouched.
    #[error("group metadata at {key} cannot be used: {source}")]
    Metadata {
        /// The key holding it.
        key: String,
        /// What is wrong.
        source: MetadataError,
    },
    /// Other processes kept changing the group; the input was not applied.
    #[error("gave up after {MAX_ATTEMPTS} conflicting attempts")]
    Contention,
    /// The group has no metadata, and this handle was opened on an existing group
    /// ([`GroupStore::open`]), so it does not create one.
    #[error("group metadata at {key} does not exist")]
    Missing {
        /// The key that would hold it.
        key: String,
    },
    /// A stream or group name that cannot be used in a key.
    #[error("invalid name {0:?}: must be non-empty and contain no '{{', '}}' or '/'")]
    InvalidName(String),
    /// A script answered something this build does not understand (another version wrote the scripts?).
    #[error("unexpected reply from {script}: {reply:?}")]
    Reply {
        /// The script.
        script: &'static str,
        /// What it answered.
        reply: Vec<i64>,
    },
}

/// What this process's stores did, summed over all of them (for benchmarks and monitoring).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Snapshots loaded.
    pub loads: u64,
    /// Bytes of snapshots loaded.
    pub load_bytes: u64,
    /// Commits accepted.
    pub commits: u64,
    /// Commits refused by the revision compare-and-set (or another check): the writer had to reload.
    pub conflicts: u64,
    /// Bytes of metadata sent in accepted commits (the header and the member records written or
    /// deleted).
    pub commit_bytes: u64,
    /// Lease renewals accepted.
    pub renewals: u64,
    /// Times a writer waited for the writer lock.
    pub lock_waits: u64,
    /// Heartbeats this process queued for the writer.
    pub queued: u64,
    /// Queued heartbeats of others this process applied and answered.
    pub batched: u64,
}

mod stats {
    use std::sync::atomic::{AtomicU64, Ordering};

    pub(super) static LOADS: AtomicU64 = AtomicU64::new(0);
    pub(super) static LOAD_BYTES: AtomicU64 = AtomicU64::new(0);
    pub(super) static COMMITS: AtomicU64 = AtomicU64::new(0);
    pub(super) static CONFLICTS: AtomicU64 = AtomicU64::new(0);
    pub(super) static COMMIT_BYTES: AtomicU64 = AtomicU64::new(0);
    pub(super) static RENEWALS: AtomicU64 = AtomicU64::new(0);
    pub(super) static LOCK_WAITS: AtomicU64 = AtomicU64::new(0);
    pub(super) static QUEUED: AtomicU64 = AtomicU64::new(0);
    pub(super) static BATCHED: AtomicU64 = AtomicU64::new(0);

    pub(super) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// The process-wide [`StoreStats`] so far.
pub fn stats() -> StoreStats {
    use stats::*;
    StoreStats {
        loads: get(&LOADS),
        load_bytes: get(&LOAD_BYTES),
        commits: get(&COMMITS),
        conflicts: get(&CONFLICTS),
        commit_bytes: get(&COMMIT_BYTES),
        renewals: get(&RENEWALS),
        lock_waits: get(&LOCK_WAITS),
        queued: get(&QUEUED),
        batched: get(&BATCHED),
    }
}

/// A script's `{ok, now, value?}` reply, decoded without indexing blindly.
fn decode_reply(
    script: &'static str,
    reply: Vec<i64>,
) -> Result<(bool, i64, Option<i64>), StoreError> {
    match reply.as_slice() {
        [1, now, value] => Ok((true, *now, Some(*value))),
        [0, now] => Ok((false, *now, None)),
        _ => Err(StoreError::Reply { script, reply }),
    }
}

/// `load.lua`'s reply: header (if any), store revision, leases, Redis time, member records.
type LoadReply = (
    Option<Vec<u8>>,
    i64,
    Vec<(String, i64)>,
    i64,
    Vec<(String, Vec<u8>)>,
);

/// The cached snapshot of a group.
#[derive(Debug)]
struct Snapshot {
    revision: i64,
    coordinator: Coordinator,
    stored: Stored,
}

/// What Redis holds at a snapshot's revision, so that a commit sends only what changed.
#[derive(Debug, Default)]
struct Stored {
    /// Each member's record as stored ([`MemberRecord::to_stored_json`]).
    members: HashMap<String, Vec<u8>>,
    /// A lower bound of each member's lease in the lease set: a lease not above it needs no write.
    leases: HashMap<String, i64>,
    /// The hash does not match `members` (a new or recreated group, an upgrade from the whole-document
    /// layout): the next commit replaces it whole.
    rewrite: bool,
    /// Store time of the commit that wrote the header, when it says.
    committed_at: Option<StoreMillis>,
    /// Redis held no usable metadata: this snapshot was created in memory and is not stored yet.
    created: bool,
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
    cache: Option<Snapshot>,
    /// The group state of the cached revision (see [`GroupStore::group_state`]).
    state: Option<(i64, GroupState)>,
    /// Last Redis time seen and the local instant it was seen at: `now` for the core between reads.
    clock: Option<(i64, std::time::Instant)>,
    /// Queue the next heartbeat without reloading first (see [`GroupStore::heartbeat`]).
    defer_reload: bool,
    /// The group's heartbeat interval as last read.
    interval_ms: i64,
    /// The group's session timeout as last read.
    session_ms: i64,
    /// The round trip of the last lease renewal or enqueue (see [`GroupStore::slow_link`]).
    last_round_trip: Duration,
    scripts: Scripts,
}

#[derive(Debug)]
struct Scripts {
    load: Script,
    renew: Script,
    commit: Script,
    release: Script,
    enqueue: Script,
    peek: Script,
    cancel: Script,
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
            interval_ms: config.heartbeat_interval_ms,
            session_ms: config.session_timeout_ms,
            last_round_trip: Duration::ZERO,
            scripts: Scripts {
                load: Script::new(include_str!("load.lua")),
                renew: Script::new(include_str!("renew.lua")),
                commit: Script::new(include_str!("commit.lua")),
                release: Script::new(include_str!("writer.lua")),
                enqueue: Script::new(include_str!("enqueue.lua")),
                peek: Script::new(include_str!("peek.lua")),
                cancel: Script::new(include_str!("cancel.lua")),
            },
        })
    }

    /// The group's keys.
    pub fn keys(&self) -> &GroupKeys {
        &self.keys
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
        for _ in 0..MAX_ATTEMPTS {
            if self.cache.is_none() {
                if self.defer_reload {
                    // Our last heartbeat changed the group and was applied by another process: the
                    // assignment is still moving, so queue this one too instead of reading the whole
                    // snapshot now (in a storm, a reload per member per change is O(n^2) bytes).
                    return self.queued(req, None).await;
                }
                self.reload().await?;
            }
            let mut snapshot = self.cache.take().expect("loaded above");
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
                    self.cache = Some(snapshot);
                    return Ok(outcome.response);
                }
                Change::Lease => {
                    if self.renew(&mut snapshot, &req.member_id).await? {
                        self.cache = Some(snapshot);
                        return Ok(outcome.response);
                    }
                    // Refused: the group moved on; reload and look again.
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

    /// Queues `req` for the writer and waits for its answer, becoming the writer when the lock is free.
    async fn queued(
        &mut self,
        req: &HeartbeatRequest,
        prepared: Option<Prepared>,
    ) -> Result<HeartbeatResponse, StoreError> {
        self.defer_reload = false;
        let id = format!("{:x}", crate::util::random_u64());
        let token = format!("{:x}", crate::util::random_u64());
        let ttl = self.queue_ttl_ms();
        let reply_key = self.keys.reply(&id);
        // Over a slow link, leave the lock to faster writers for an interval: they apply this heartbeat
        // with theirs, and none of theirs waits for our round trips.
        let defer_lock_until = self
            .slow_link()
            .then(|| Instant::now() + Duration::from_millis(self.interval_ms.max(0) as u64));
        let sent = Instant::now();
        let (taken, now): (i64, i64) = self
            .scripts
            .enqueue
            .key(&self.keys.inbox)
            .key(&self.keys.writer)
            .arg(&id)
            .arg(serde_json::to_string(req).expect("heartbeats serialize"))
            .arg(ttl)
            .arg(&token)
            .arg(WRITER_LOCK_MS)
            .arg(if defer_lock_until.is_some() { 0 } else { 1 })
            .invoke_async(&mut self.conn)
            .await?;
        self.last_round_trip = sent.elapsed();
        self.observe_time(now);
        stats::add(&stats::QUEUED, 1);
        let mut locked = taken == 1;
        let mut prepared = prepared;
        let give_up = Instant::now() + MAX_QUEUED_WAIT;
        loop {
            if locked {
                // If this future is dropped (the caller's timeout) while it has the lock, release it
                // anyway: otherwise every other writer would wait for it to expire.
                let guard = self.lock_guard(&token);
                let result = self.drain(Some((&id, req)), &token, prepared.take()).await;
                guard.disarm();
                self.unlock(&token).await;
                match result {
                    Err(error) => {
                        self.cache = None;
                        self.cancel(&id).await;
                        return Err(error);
                    }
                    Ok(Some(response)) => return Ok(response),
                    // The lock lapsed before this heartbeat was applied: wait again.
                    Ok(None) => locked = false,
                }
            }
            if Instant::now() > give_up {
                self.cancel(&id).await;
                return Err(StoreError::Contention);
            }
            let popped: Option<(String, Vec<u8>)> = redis::cmd("BLPOP")
                .arg(&reply_key)
                .arg(&self.keys.turn)
                .arg(WRITER_WAIT_S)
                .query_async(&mut self.conn)
                .await?;
            if let Some((_, answer)) = popped.filter(|(key, _)| *key == reply_key) {
                return self.answer(&reply_key, &answer);
            }
            stats::add(&stats::LOCK_WAITS, 1);
            let deferring = defer_lock_until.is_some_and(|until| Instant::now() < until);
            if !deferring && self.try_lock(&token).await? {
                // The previous writer may have answered between the wait and the lock.
                let answer: Option<Vec<u8>> = redis::cmd("LPOP")
                    .arg(&reply_key)
                    .query_async(&mut self.conn)
                    .await?;
                if let Some(answer) = answer {
                    self.unlock(&token).await;
                    return self.answer(&reply_key, &answer);
                }
                locked = true;
            }
        }
    }

    /// Takes our queued heartbeat back (best effort: Redis may be what failed).
    async fn cancel(&mut self, id: &str) {
        let removed: Result<i64, _> = self
            .scripts
            .cancel
            .key(&self.keys.inbox)
            .arg(id)
            .invoke_async(&mut self.conn)
            .await;
        if let Err(error) = removed {
            tracing::debug!(%error, "taking a queued heartbeat back failed");
        }
    }

    /// An answer another process committed for us: `C` (our heartbeat changed the group) or `Q` (it
    /// only renewed our lease), then the response JSON. Our cache is behind that commit: it was taken.
    fn answer(&mut self, key: &str, answer: &[u8]) -> Result<HeartbeatResponse, StoreError> {
        self.cache = None;
        let (json, changed) = match answer.split_first() {
            Some((b'C', json)) => (json, true),
            Some((b'Q', json)) => (json, false),
            _ => (answer, false),
        };
        self.defer_reload = changed;
        serde_json::from_slice(json).map_err(|e| StoreError::Metadata {
            key: key.to_string(),
            source: MetadataError::Corrupt(e.to_string()),
        })
    }

    /// How long a queued heartbeat waits to be applied: the member's own response timeout.
    /// How long a queued heartbeat may be applied: as long as its sender waits for the answer (see
    /// [`attempt_budget`](crate::member::heartbeat::attempt_budget)).
    fn queue_ttl_ms(&self) -> i64 {
        self.interval_ms.max(self.session_ms * 2 / 3).max(100)
    }

    /// Whether this process's link to Redis is too slow for it to be the group's writer while others can
    /// be: a writer holds the lock for a few round trips (peek, reload, commit, release), and every
    /// heartbeat queued meanwhile waits for them. From a quarter of the heartbeat interval on, it takes the
    /// lock only when no other heartbeat is queued, and else leaves it to the others for an interval (see
    /// [`queued`](Self::queued)).
    fn slow_link(&self) -> bool {
        self.last_round_trip.as_millis() as i64 * 4 > self.interval_ms
    }

    /// As the writer: applies `own` and the queued heartbeats, a batch per commit, until the inbox is
    /// empty. Returns the answer to `own`, or `None` if the lock lapsed before it was applied.
    async fn drain(
        &mut self,
        mut own: Option<(&str, &HeartbeatRequest)>,
        token: &str,
        mut prepared: Option<Prepared>,
    ) -> Result<Option<HeartbeatResponse>, StoreError> {
        let mut own_response = None;
        let mut refusals = 0;
        for _ in 0..MAX_BATCHES {
            let (revision, now, entries) = match self.peek(token).await? {
                Some(peeked) => peeked,
                None => return Ok(own_response),
            };
            let only_own = entries.iter().all(|entry| {
                own.is_some_and(|(id, _)| {
                    inbox::decode(entry).is_ok_and(|queued| queued.reply_id == id)
                })
            });
            // Uncontended: nobody committed since this heartbeat was computed on the cache and nobody
            // else is queued, so what was computed is what a reload would compute.
            if let Some(mut ready) = prepared
                .take()
                .filter(|p| own.is_some() && only_own && p.snapshot.revision == revision)
            {
                let outcome = &ready.outcome;
                if self
                    .commit(
                        &mut ready.snapshot,
                        ready.now,
                        &outcome.writes,
                        &outcome.events,
                        &Answering {
                            taken: entries.len(),
                            answers: Vec::new(),
                            answered: own
                                .map(|(_, req)| (req.member_id.clone(), outcome.events.len()))
                                .into_iter()
                                .collect(),
                        },
                    )
                    .await?
                {
                    self.cache = Some(ready.snapshot);
                    return Ok(Some(ready.outcome.response));
                }
                continue;
            }
            let mut snapshot = match self.cache.take() {
                Some(snapshot) if snapshot.revision == revision => snapshot,
                _ => {
                    self.reload().await?;
                    self.cache.take().expect("loaded above")
                }
            };
            let now = StoreMillis(now).max(self.now());
            let mut batch = Batch::default();
            let mut own_answer = None;
            if let Some((_, req)) = own {
                let outcome = snapshot.coordinator.heartbeat(req, now);
                own_answer = Some(batch.add(outcome));
            }
            // Members this batch answers learn from their answer what changed for them up to it; a later
            // heartbeat of the batch that moves their shards must still wake them.
            let mut answering = Answering {
                taken: entries.len(),
                answers: Vec::new(),
                answered: own
                    .iter()
                    .map(|(_, req)| (req.member_id.clone(), batch.events.len()))
                    .collect(),
            };
            let mut bad = 0;
            for entry in &entries {
                let queued = match inbox::decode(entry) {
                    Ok(queued) => queued,
                    Err(_) => {
                        bad += 1;
                        continue;
                    }
                };
                if own.is_some_and(|(id, _)| id == queued.reply_id)
                    || queued.deadline <= now.0 + DEADLINE_MARGIN_MS
                {
                    continue;
                }
                let outcome = snapshot.coordinator.heartbeat(&queued.request, now);
                let mut answer = vec![if outcome.change == Change::Metadata {
                    b'C'
                } else {
                    b'Q'
                }];
                serde_json::to_writer(&mut answer, &batch.add(outcome))
                    .expect("responses serialize");
                answering
                    .answered
                    .push((queued.request.member_id.clone(), batch.events.len()));
                answering.answers.push((queued.reply_id, answer));
            }
            if bad > 0 {
                tracing::warn!(inbox = %self.keys.inbox, bad, "skipped queued heartbeats that do not decode");
            }
            if batch.changed || !entries.is_empty() {
                let committed = self
                    .commit(&mut snapshot, now, &batch.writes, &batch.events, &answering)
                    .await?;
                if !committed {
                    refusals += 1;
                    if refusals >= MAX_ATTEMPTS {
                        return Err(StoreError::Contention);
                    }
                    continue;
                }
            }
            stats::add(&stats::BATCHED, answering.answers.len() as u64);
            self.cache = Some(snapshot);
            if let Some(answer) = own_answer {
                own_response = Some(answer);
                own = None;
            }
            if entries.len() < inbox::BATCH {
                break;
            }
        }
        Ok(own_response)
    }

    /// The writer's look at its next batch: `None` if the lock is no longer ours.
    async fn peek(&mut self, token: &str) -> Result<Option<(i64, i64, Vec<Vec<u8>>)>, StoreError> {
        let reply: Vec<Value> = self
            .scripts
            .peek
            .key(&self.keys.writer)
            .key(&self.keys.rev)
            .key(&self.keys.inbox)
            .arg(token)
            .arg(WRITER_LOCK_MS)
            .arg(inbox::BATCH)
            .invoke_async(&mut self.conn)
            .await?;
        let mut values = reply.into_iter();
        let shape = |what: &str| StoreError::Reply {
            script: "peek.lua",
            reply: vec![what.len() as i64],
        };
        let (Some(Value::Int(has_lock)), Some(Value::Int(revision)), Some(Value::Int(now))) =
            (values.next(), values.next(), values.next())
        else {
            return Err(shape("header"));
        };
        self.observe_time(now);
        if has_lock != 1 {
            return Ok(None);
        }
        let entries = values
            .map(|value| match value {
                Value::BulkString(bytes) => Ok(bytes),
                _ => Err(shape("entry")),
            })
            .collect::<Result<_, _>>()?;
        Ok(Some((revision, now, entries)))
    }

    fn lock_guard(&self, token: &str) -> LockGuard {
        LockGuard {
            conn: self.conn.clone(),
            release: self.scripts.release.clone(),
            keys: self.keys.clone(),
            token: Some(token.to_string()),
        }
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
        self.reload().await?;
        let snapshot = self.cache.as_ref().expect("just loaded");
        Ok((snapshot.revision, snapshot.coordinator.clone()))
    }

    /// The Redis time of the last commit this handle loaded, if the stored header has one (documents
    /// written before it was recorded do not).
    pub fn committed_at(&self) -> Option<StoreMillis> {
        self.cache.as_ref()?.stored.committed_at
    }

    /// The monitoring projection as of the last commit (`at_ms` is its store time), computed from a fresh
    /// load: nothing stores it, so commits do not rewrite it. `None` while the group has no metadata.
    pub async fn projection(&mut self) -> Result<Option<GroupProjection>, StoreError> {
        match self.reload().await {
            Ok(()) => {}
            Err(StoreError::Missing { .. }) => return Ok(None),
            Err(error) => return Err(error),
        }
        let snapshot = self.cache.as_ref().expect("just loaded");
        if snapshot.stored.created {
            return Ok(None); // this handle would create the group
        }
        let at = snapshot.stored.committed_at.unwrap_or_else(|| self.now());
        Ok(Some(snapshot.coordinator.projection(at)))
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

    /// Reloads the snapshot, runs the input on it and writes the outcome. `None`: refused, the cache is
    /// dropped.
    async fn attempt<R>(
        &mut self,
        input: &mut impl FnMut(&mut Coordinator, StoreMillis) -> Outcome<R>,
    ) -> Result<Option<R>, StoreError> {
        self.reload().await?;
        let now = self.now();
        // The snapshot leaves the cache while the write is in flight and comes back only once Redis
        // accepted it: a failed, refused or abandoned (dropped future) write can never leave an
        // uncommitted state in the cache for the next input to build on.
        let mut snapshot = self.cache.take().expect("loaded above");
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

    /// Takes the writer lock with `token` if it is free.
    async fn try_lock(&mut self, token: &str) -> Result<bool, StoreError> {
        let taken: Option<String> = redis::cmd("SET")
            .arg(&self.keys.writer)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(WRITER_LOCK_MS)
            .query_async(&mut self.conn)
            .await?;
        Ok(taken.is_some())
    }

    /// Takes the writer lock, waiting in Redis for the writer to release it. Returns the token.
    async fn lock(&mut self) -> Result<String, StoreError> {
        let token = format!("{:x}", crate::util::random_u64());
        loop {
            if self.try_lock(&token).await? {
                return Ok(token);
            }
            stats::add(&stats::LOCK_WAITS, 1);
            // Woken by the writer's release, or after a short while to try again (a writer that died).
            let _: Option<(String, String)> = redis::cmd("BLPOP")
                .arg(&self.keys.turn)
                .arg(WRITER_WAIT_S)
                .query_async(&mut self.conn)
                .await?;
        }
    }

    async fn unlock(&mut self, token: &str) {
        let released: Result<i64, _> = self
            .scripts
            .release
            .key(&self.keys.writer)
            .key(&self.keys.turn)
            .arg(token)
            .arg(WRITER_LOCK_MS)
            .invoke_async(&mut self.conn)
            .await;
        if let Err(error) = released {
            // It expires by itself.
            tracing::debug!(%error, "releasing the writer lock failed");
        }
    }

    /// The store clock: the last Redis `TIME` plus the local time elapsed since it was read.
    fn now(&self) -> StoreMillis {
        let (redis_ms, at) = self.clock.expect("set by every script reply");
        StoreMillis(redis_ms + at.elapsed().as_millis() as i64)
    }

    fn observe_time(&mut self, redis_ms: i64) {
        self.clock = Some((redis_ms, std::time::Instant::now()));
    }

    async fn reload(&mut self) -> Result<(), StoreError> {
        let (meta, revision, leases, now, records): LoadReply = self
            .scripts
            .load
            .key(&self.keys.meta)
            .key(&self.keys.rev)
            .key(&self.keys.leases)
            .key(&self.keys.members)
            .invoke_async(&mut self.conn)
            .await?;
        self.observe_time(now);
        stats::add(&stats::LOADS, 1);
        let record_bytes: usize = records.iter().map(|(id, r)| id.len() + r.len()).sum();
        stats::add(
            &stats::LOAD_BYTES,
            (meta.as_ref().map_or(0, |m| m.len()) + record_bytes) as u64,
        );
        let had_records = !records.is_empty();
        let keys = &self.keys;
        let corrupt = |key: &String| {
            let key = key.clone();
            move |source| StoreError::Metadata { key, source }
        };
        let mut stored = Stored::default();
        let loaded = match meta {
            None => None,
            Some(bytes) => match GroupMetadata::stored_schema_version(&bytes)
                .map_err(corrupt(&keys.meta))?
            {
                WHOLE_SCHEMA_VERSION => {
                    // The earlier layout: used as it is, stored in the current one by the next commit.
                    stored.rewrite = true;
                    Some(GroupMetadata::from_json(&bytes).map_err(corrupt(&keys.meta))?)
                }
                SCHEMA_VERSION => {
                    stored.members = records.iter().cloned().collect();
                    match GroupMetadata::from_parts(&bytes, records) {
                        Ok((meta, committed_at)) => {
                            stored.committed_at = Some(StoreMillis(committed_at));
                            Some(meta)
                        }
                        // Member records were deleted (or added) behind the store's back: whoever may
                        // be reading the shards they held is unknown, as after losing the whole snapshot.
                        Err(source @ MetadataError::Incomplete { .. }) if self.create.is_some() => {
                            tracing::warn!(key = %keys.members, %source, "group metadata lost member records; recreating it, with grants paused until every member of the lost state has self-fenced");
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
            },
        };
        let mut coordinator = match loaded {
            None => {
                let Some((shard_count, config)) = self.create else {
                    return Err(StoreError::Missing {
                        key: keys.meta.clone(),
                    });
                };
                // Never trust a missing snapshot to mean a new group (see the module docs).
                let creation = if revision > 0 || !leases.is_empty() || had_records {
                    tracing::warn!(key = %keys.meta, revision, leases = leases.len(), "group metadata is missing but its revision or leases exist: it was lost; recreating it, with grants paused until every member of the lost state has self-fenced");
                    Creation::AfterLoss
                } else {
                    Creation::Fresh
                };
                stored = Stored {
                    rewrite: true,
                    created: true,
                    ..Stored::default()
                };
                Coordinator::create(
                    self.group.clone(),
                    shard_count,
                    config,
                    StoreMillis(now),
                    creation,
                )
            }
            Some(meta) => {
                Coordinator::from_metadata(meta, StoreMillis(now)).map_err(corrupt(&keys.meta))?
            }
        };
        let session = coordinator.metadata().config.session_timeout_ms;
        let unleased: Vec<String> = if stored.rewrite {
            Vec::new() // the whole-document layout carries its own leases
        } else {
            let members = &coordinator.metadata().members;
            let leased: std::collections::HashSet<&str> =
                leases.iter().map(|(id, _)| id.as_str()).collect();
            members
                .keys()
                .filter(|id| !leased.contains(id.as_str()))
                .cloned()
                .collect()
        };
        for id in unleased {
            // A record without a lease (the lease set was damaged): the member may be alive, so it gets
            // a full session, and the next commit writes that lease.
            coordinator.set_lease(&id, now + session);
        }
        for (member, deadline) in leases {
            coordinator.set_lease(&member, deadline);
            stored.leases.insert(member, deadline);
        }
        self.interval_ms = coordinator.metadata().config.heartbeat_interval_ms;
        self.session_ms = session;
        self.cache = Some(Snapshot {
            revision,
            coordinator,
            stored,
        });
        Ok(())
    }

    async fn renew(&mut self, snapshot: &mut Snapshot, member: &str) -> Result<bool, StoreError> {
        let timer = snapshot.coordinator.next_timer().map_or(-1, |t| t.0);
        let session = snapshot.coordinator.metadata().config.session_timeout_ms;
        let sent = Instant::now();
        let reply: Vec<i64> = self
            .scripts
            .renew
            .key(&self.keys.rev)
            .key(&self.keys.leases)
            .key(&self.keys.meta)
            .key(&self.keys.members)
            .arg(snapshot.revision)
            .arg(member)
            .arg(session)
            .arg(timer)
            .invoke_async(&mut self.conn)
            .await?;
        self.last_round_trip = sent.elapsed();
        let (renewed, now, min_lease) = decode_reply("renew.lua", reply)?;
        self.observe_time(now);
        let Some(min_lease) = min_lease.filter(|_| renewed) else {
            return Ok(false);
        };
        stats::add(&stats::RENEWALS, 1);
        // Every lease is at least the smallest one in Redis: good enough to know nobody expired yet.
        snapshot.coordinator.raise_leases(min_lease);
        snapshot.coordinator.set_lease(member, now + session);
        for lease in snapshot.stored.leases.values_mut() {
            *lease = (*lease).max(min_lease);
        }
        snapshot
            .stored
            .leases
            .insert(member.to_string(), now + session);
        Ok(true)
    }

    /// Writes the snapshot with the writes and events of the inputs applied to it, trims the `taken`
    /// queued heartbeats and pushes their `answers`, all under the revision compare-and-set.
    async fn commit(
        &mut self,
        snapshot: &mut Snapshot,
        now: StoreMillis,
        writes: &Writes,
        events: &[AuditEvent],
        answering: &Answering,
    ) -> Result<bool, StoreError> {
        let Answering {
            taken,
            answers,
            answered,
        } = answering;
        let meta = snapshot.coordinator.metadata();
        let stored = &snapshot.stored;
        let committed_at = now;
        let header = meta.to_header_json(committed_at.0);
        // Only what Redis does not hold yet (everything when the hash is to be replaced).
        let records: Vec<(&String, Vec<u8>)> = meta
            .members
            .iter()
            .map(|(id, m)| (id, MemberRecord::to_stored_json(m)))
            .filter(|(id, json)| stored.rewrite || stored.members.get(*id) != Some(json))
            .collect();
        let gone: Vec<&String> = if stored.rewrite {
            Vec::new()
        } else {
            stored
                .members
                .keys()
                .filter(|id| !meta.members.contains_key(*id))
                .collect()
        };
        let leases: Vec<(&String, i64)> = meta
            .members
            .iter()
            .map(|(id, m)| (id, m.lease_deadline_ms))
            .filter(|(id, lease)| stored.leases.get(*id).is_none_or(|known| lease > known))
            .collect();
        let bytes = header.len()
            + records
                .iter()
                .map(|(id, json)| id.len() + json.len())
                .sum::<usize>()
            + gone.iter().map(|id| id.len()).sum::<usize>();
        let mut invocation = self.scripts.commit.prepare_invoke();
        invocation
            .key(&self.keys.meta)
            .key(&self.keys.rev)
            .key(&self.keys.leases)
            .key(&self.keys.audit)
            .key(&self.keys.projection)
            .key(&self.keys.inbox)
            .key(&self.keys.members);
        for (id, _) in answers {
            invocation.key(self.keys.reply(id));
        }
        invocation
            .arg(snapshot.revision)
            .arg(now.0)
            .arg(header.as_slice())
            .arg(AUDIT_MAX_LEN)
            .arg(if stored.rewrite {
                -1
            } else {
                stored.members.len() as i64
            });
        // The core says which leases it relied on and which members are gone.
        invocation.arg(writes.lease_checks.len());
        for (id, lease) in &writes.lease_checks {
            invocation.arg(id).arg(*lease);
        }
        invocation.arg(leases.len());
        for (id, lease) in &leases {
            invocation.arg(*id).arg(*lease);
        }
        // A member removed by one input of a batch and back by a later one keeps its lease.
        let removed: Vec<&String> = writes
            .removed
            .iter()
            .filter(|id| !meta.members.contains_key(*id))
            .collect();
        invocation.arg(removed.len());
        for id in &removed {
            invocation.arg(*id);
        }
        invocation.arg(records.len());
        for (id, json) in &records {
            invocation.arg(*id).arg(json.as_slice());
        }
        invocation.arg(gone.len());
        for id in &gone {
            invocation.arg(*id);
        }
        invocation.arg(events.len());
        for event in events {
            invocation.arg(serde_json::to_string(event).expect("events serialize"));
        }
        invocation
            .arg(*taken)
            .arg(self.queue_ttl_ms().max(1000))
            .arg(answers.len());
        for (_, answer) in answers {
            invocation.arg(answer.as_slice());
        }
        invocation
            .arg(&self.keys.wake)
            .arg(wakeup::to_wake(events, answered).join(" "));
        let reply: Vec<i64> = invocation.invoke_async(&mut self.conn).await?;
        let (committed, now, revision) = decode_reply("commit.lua", reply)?;
        self.observe_time(now);
        let Some(revision) = revision.filter(|_| committed) else {
            stats::add(&stats::CONFLICTS, 1);
            return Ok(false);
        };
        stats::add(&stats::COMMITS, 1);
        stats::add(&stats::COMMIT_BYTES, bytes as u64);
        // Redis now holds what was sent.
        let leases: Vec<(String, i64)> = leases
            .into_iter()
            .map(|(id, lease)| (id.clone(), lease))
            .collect();
        let removed: Vec<String> = removed.into_iter().cloned().collect();
        let records: Vec<(String, Vec<u8>)> = records
            .into_iter()
            .map(|(id, json)| (id.clone(), json))
            .collect();
        let gone: Vec<String> = gone.into_iter().cloned().collect();
        let stored = &mut snapshot.stored;
        if stored.rewrite {
            stored.members.clear();
            stored.rewrite = false;
        }
        stored.created = false;
        stored.members.extend(records);
        for id in gone {
            stored.members.remove(&id);
        }
        stored.leases.extend(leases);
        for id in removed {
            stored.leases.remove(&id);
        }
        stored.committed_at = Some(committed_at);
        snapshot.revision = revision;
        Ok(true)
    }
}

/// What a commit does for queued heartbeats: how many inbox entries it takes, the answers it pushes
/// (reply id, answer), and every member answered by it or by the caller's own response, with the number
/// of the commit's events its answer reflects (what it learns from the answer needs no wake-up; see
/// [`wakeup::to_wake`]).
#[derive(Debug, Default)]
struct Answering {
    taken: usize,
    answers: Vec<(String, Vec<u8>)>,
    answered: Vec<(String, usize)>,
}

/// A heartbeat computed on the cache that needs a commit, kept in case nobody else writes first.
struct Prepared {
    snapshot: Snapshot,
    now: StoreMillis,
    outcome: Outcome<HeartbeatResponse>,
}

/// The inputs of one batch, merged into one commit.
#[derive(Default)]
struct Batch {
    changed: bool,
    writes: Writes,
    events: Vec<AuditEvent>,
}

impl Batch {
    /// Folds one outcome in and returns its response. A lease check keeps the first value seen: the one
    /// in the store before the batch.
    fn add<R>(&mut self, outcome: Outcome<R>) -> R {
        self.changed |= outcome.change != Change::None;
        for (id, lease) in outcome.writes.lease_checks {
            if !self.writes.lease_checks.iter().any(|(seen, _)| *seen == id) {
                self.writes.lease_checks.push((id, lease));
            }
        }
        for id in outcome.writes.removed {
            if !self.writes.removed.contains(&id) {
                self.writes.removed.push(id);
            }
        }
        self.events.extend(outcome.events);
        outcome.response
    }
}

/// Releases the writer lock from a task of its own if the write that took it was abandoned.
struct LockGuard {
    conn: Connection,
    release: Script,
    keys: GroupKeys,
    token: Option<String>,
}

impl LockGuard {
    fn disarm(mut self) {
        self.token = None;
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let Some(token) = self.token.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // It expires by itself.
        };
        let (mut conn, release, keys) =
            (self.conn.clone(), self.release.clone(), self.keys.clone());
        runtime.spawn(async move {
            let _: Result<i64, _> = release
                .key(&keys.writer)
                .key(&keys.turn)
                .arg(token)
                .arg(WRITER_LOCK_MS)
                .invoke_async(&mut conn)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Script replies and stored JSON come from Redis: a wrong shape is an error, never a panic.
        #[test]
        fn script_replies_decode_or_fail_cleanly(reply in proptest::collection::vec(any::<i64>(), 0..6)) {
            match decode_reply("renew.lua", reply.clone()) {
                Ok((true, now, Some(v))) => prop_assert_eq!(reply, vec![1, now, v]),
                Ok((false, now, None)) => prop_assert_eq!(reply, vec![0, now]),
                Ok(other) => prop_assert!(false, "impossible decode {:?}", other),
                Err(StoreError::Reply { reply: r, .. }) => prop_assert_eq!(r, reply),
                Err(other) => prop_assert!(false, "wrong error {}", other),
            }
        }

        #[test]
        fn metadata_json_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = GroupMetadata::from_json(&bytes);
        }

        #[test]
        fn heartbeat_json_never_panics(text in ".{0,200}") {
            let _ = serde_json::from_str::<HeartbeatRequest>(&text);
            let _ = serde_json::from_str::<HeartbeatResponse>(&text);
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
