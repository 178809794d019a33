//! The metadata store: the coordinator core persisted in Redis, with no coordinator server to deploy.
//!
//! Any member process applies inputs to a group: it runs the pure [`Coordinator`] on its cached snapshot
//! and writes the outcome back under the **store revision** compare-and-set. Redis is the one source of
//! truth and the one clock (`TIME`, read inside the scripts).
//!
//! * **Steady state** ([`Change::Lease`]): one `renew` script renews the sender's lease in a sorted set,
//!   after checking that the revision is the cached one, that no lease has run out and that no timer of the
//!   snapshot is due. Its work is `O(log members)`; the snapshot is not rewritten.
//! * **Real changes** ([`Change::Metadata`]): one `commit` script writes the snapshot, increments the
//!   revision, moves leases, appends the audit events to a capped stream and writes the monitoring
//!   projection, all or nothing. It refuses if the revision moved, if the core's `now` is ahead of Redis
//!   time, or if a member the core removed renewed its lease meanwhile (its fenced hold would be too short).
//! * **One writer at a time.** A process that must commit first takes the group's writer lock (a short
//!   `SET NX PX`); processes that find it taken wait in Redis (`BLPOP` on a turn list that the holder pushes
//!   to when it releases), in arrival order, instead of reloading and colliding. A join storm of `n`
//!   members therefore costs `O(n)` loads and commits, not `O(n^2)`. The lock is for speed only: the
//!   revision compare-and-set stays the safety guard, so a holder that paused past the lock's expiry is
//!   refused at commit like any stale writer.
//! * On any refusal the store reloads and applies the input again: bounded retries with jitter.
//! * **Lost metadata.** A missing snapshot is never trusted to mean a new group: the store creates it with
//!   [`Coordinator::create`], which pauses grants until members of a lost state have self-fenced
//!   ([`Creation::AfterLoss`] when the revision or leases survived, [`Creation::Fresh`] otherwise), and
//!   starts member epochs above any earlier ones. Revisions are `max(previous + 1, now * 1000)`, so they
//!   never repeat after a loss or a rollback and a stale cache can never match them.
//!
//! Key layout (one Redis Cluster slot per group thanks to the hash tag): see [`GroupKeys`].

use std::time::Duration;

use crate::connection::Connection;
use redis::Script;

use crate::coordinator::metadata::{GroupConfig, GroupMetadata, MetadataError};
use crate::coordinator::projection::GroupProjection;
use crate::coordinator::wire::{HeartbeatRequest, HeartbeatResponse};
use crate::coordinator::{AdminCommand, Change, CommandError, Coordinator, Creation, Outcome};

/// Attempts of one input before giving up with [`StoreError::Contention`].
const MAX_ATTEMPTS: u32 = 16;
/// Audit entries kept (approximately).
const AUDIT_MAX_LEN: u64 = 10_000;
/// How long the writer lock lives if its holder never releases it (crashed or paused).
const WRITER_LOCK_MS: u64 = 500;
/// How long one wait for the writer lock blocks in Redis before trying again.
const WRITER_WAIT_S: f64 = 0.05;

/// The Redis keys of one group.
///
/// | key | type | holds |
/// | --- | --- | --- |
/// | `sl:{<stream>/<group>}:meta` | string | the group metadata snapshot (JSON, with its schema version) |
/// | `sl:{<stream>/<group>}:rev` | string | the store revision, incremented by every commit |
/// | `sl:{<stream>/<group>}:leases` | sorted set | memberId scored by lease deadline (Redis ms) |
/// | `sl:{<stream>/<group>}:audit` | stream | audit events, capped at about 10,000 |
/// | `sl:{<stream>/<group>}:projection` | string | the monitoring projection (JSON) |
/// | `sl:{<stream>/<group>}:writer` | string | the writer lock (holder's token, expires after 500 ms) |
/// | `sl:{<stream>/<group>}:turn` | list | wakes one waiting writer when the lock is released |
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupKeys {
    /// Snapshot.
    pub meta: String,
    /// Store revision.
    pub rev: String,
    /// Leases.
    pub leases: String,
    /// Audit stream.
    pub audit: String,
    /// Monitoring projection.
    pub projection: String,
    /// Writer lock.
    pub writer: String,
    /// Writer wake-ups.
    pub turn: String,
}

impl GroupKeys {
    /// The keys of `group` reading `stream`.
    pub fn new(stream: &str, group: &str) -> Self {
        let base = format!("sl:{{{stream}/{group}}}");
        Self {
            meta: format!("{base}:meta"),
            rev: format!("{base}:rev"),
            leases: format!("{base}:leases"),
            audit: format!("{base}:audit"),
            projection: format!("{base}:projection"),
            writer: format!("{base}:writer"),
            turn: format!("{base}:turn"),
        }
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
    /// Bytes sent in accepted commits (snapshot and projection).
    pub commit_bytes: u64,
    /// Lease renewals accepted.
    pub renewals: u64,
    /// Times a writer waited for the writer lock.
    pub lock_waits: u64,
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

/// `load.lua`'s reply: snapshot (if any), store revision, leases, Redis time.
type LoadReply = (Option<Vec<u8>>, i64, Vec<(String, i64)>, i64);

/// The cached snapshot of a group.
#[derive(Debug)]
struct Snapshot {
    revision: i64,
    coordinator: Coordinator,
}

/// One process's handle on one group's metadata in Redis. Cheap to create; keeps a cached snapshot.
#[derive(Debug)]
pub struct GroupStore {
    conn: Connection,
    keys: GroupKeys,
    group: String,
    shard_count: u32,
    config: GroupConfig,
    cache: Option<Snapshot>,
    /// Last Redis time seen and the local instant it was seen at: `now` for the core between reads.
    clock: Option<(i64, std::time::Instant)>,
    scripts: Scripts,
}

#[derive(Debug)]
struct Scripts {
    load: Script,
    renew: Script,
    commit: Script,
    release: Script,
}

impl GroupStore {
    /// A handle on `group` of `stream`. `shard_count` and `config` are used only if the group does not
    /// exist yet; an existing group keeps its own.
    /// `conn` is a [`Connection`] (a `ConnectionManager` converts into one).
    pub fn new(
        conn: impl Into<Connection>,
        stream: &str,
        group: &str,
        shard_count: u32,
        config: GroupConfig,
    ) -> Result<Self, StoreError> {
        for name in [stream, group] {
            if name.is_empty() || name.contains(['{', '}', '/']) {
                return Err(StoreError::InvalidName(name.to_string()));
            }
        }
        Ok(Self {
            conn: conn.into(),
            keys: GroupKeys::new(stream, group),
            group: group.to_string(),
            shard_count,
            config,
            cache: None,
            clock: None,
            scripts: Scripts {
                load: Script::new(include_str!("load.lua")),
                renew: Script::new(include_str!("renew.lua")),
                commit: Script::new(include_str!("commit.lua")),
                release: Script::new(include_str!("writer.lua")),
            },
        })
    }

    /// The group's keys.
    pub fn keys(&self) -> &GroupKeys {
        &self.keys
    }

    /// Applies one heartbeat.
    pub async fn heartbeat(
        &mut self,
        req: &HeartbeatRequest,
    ) -> Result<HeartbeatResponse, StoreError> {
        self.apply(|c, now| c.heartbeat(req, now), Some(&req.member_id))
            .await
    }

    /// Applies timers that are due (expiry, rebalance timeouts, fenced holds), committing if anything
    /// changed.
    pub async fn tick(&mut self) -> Result<(), StoreError> {
        self.cache = None;
        self.apply(|c, now| c.tick(now), None).await
    }

    /// Applies an operator command.
    pub async fn command(
        &mut self,
        command: AdminCommand,
    ) -> Result<Result<(), CommandError>, StoreError> {
        self.cache = None;
        self.apply(|c, now| c.command(command.clone(), now), None)
            .await
    }

    /// The current snapshot, freshly read (for operators and tests).
    pub async fn load(&mut self) -> Result<(i64, Coordinator), StoreError> {
        self.reload().await?;
        let snapshot = self.cache.as_ref().expect("just loaded");
        Ok((snapshot.revision, snapshot.coordinator.clone()))
    }

    /// The monitoring projection as last committed, readable by any process.
    pub async fn projection(&mut self) -> Result<Option<GroupProjection>, StoreError> {
        let json: Option<Vec<u8>> = redis::cmd("GET")
            .arg(&self.keys.projection)
            .query_async(&mut self.conn)
            .await?;
        json.map(|j| {
            serde_json::from_slice(&j).map_err(|e| StoreError::Metadata {
                key: self.keys.projection.clone(),
                source: MetadataError::Corrupt(e.to_string()),
            })
        })
        .transpose()
    }

    async fn apply<R>(
        &mut self,
        mut input: impl FnMut(&mut Coordinator, i64) -> Outcome<R>,
        sender: Option<&str>,
    ) -> Result<R, StoreError> {
        // The common case needs no lock: nothing to write, or only the sender's lease to renew. A real
        // change computed on the cache is kept for the locked path below.
        let mut prepared = None;
        if let Some(mut snapshot) = self.cache.take() {
            let now = self.now();
            let outcome = input(&mut snapshot.coordinator, now);
            match outcome.change {
                Change::None => {
                    self.cache = Some(snapshot);
                    return Ok(outcome.response);
                }
                Change::Lease => {
                    let member = sender.expect("only heartbeats renew leases");
                    if self.renew(&mut snapshot, member).await? {
                        self.cache = Some(snapshot);
                        return Ok(outcome.response);
                    }
                }
                Change::Metadata => prepared = Some((snapshot, now, outcome)),
            }
        }
        let token = self.lock().await?;
        // If this future is dropped (the caller's timeout) while holding the lock, release it anyway:
        // otherwise every other writer would wait for it to expire.
        let guard = LockGuard {
            conn: self.conn.clone(),
            release: self.scripts.release.clone(),
            keys: self.keys.clone(),
            token: Some(token.clone()),
        };
        let result = async {
            if let Some((mut snapshot, now, outcome)) = prepared {
                // Nobody committed since the cache was read: what was computed on it is what a reload
                // would compute, so commit it as it is (the commit's compare-and-set still checks).
                if self.revision().await? == snapshot.revision
                    && self.commit(&mut snapshot, now, &outcome).await?
                {
                    self.cache = Some(snapshot);
                    return Ok(outcome.response);
                }
            }
            for attempt in 0..MAX_ATTEMPTS {
                if attempt > 0 {
                    // Someone wrote without the lock (it expired while we worked): spread out and retry.
                    let jitter = (random_u64() % (2 + u64::from(attempt) * 3)) + 1;
                    tokio::time::sleep(Duration::from_millis(jitter)).await;
                }
                if let Some(response) = self.attempt(&mut input, sender).await? {
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

    /// The store revision in Redis now.
    async fn revision(&mut self) -> Result<i64, StoreError> {
        let revision: Option<i64> = redis::cmd("GET")
            .arg(&self.keys.rev)
            .query_async(&mut self.conn)
            .await?;
        Ok(revision.unwrap_or(0))
    }

    /// Reloads the snapshot, runs the input on it and writes the outcome. `None`: refused, the cache is
    /// dropped.
    async fn attempt<R>(
        &mut self,
        input: &mut impl FnMut(&mut Coordinator, i64) -> Outcome<R>,
        sender: Option<&str>,
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
            Change::Lease => {
                let member = sender.expect("only heartbeats renew leases");
                self.renew(&mut snapshot, member).await?
            }
            Change::Metadata => self.commit(&mut snapshot, now, &outcome).await?,
        };
        if !written {
            return Ok(None);
        }
        self.cache = Some(snapshot);
        Ok(Some(outcome.response))
    }

    /// Takes the writer lock, waiting in Redis for the holder to release it. Returns the token.
    async fn lock(&mut self) -> Result<String, StoreError> {
        let token = format!("{:x}", random_u64());
        loop {
            let taken: Option<String> = redis::cmd("SET")
                .arg(&self.keys.writer)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(WRITER_LOCK_MS)
                .query_async(&mut self.conn)
                .await?;
            if taken.is_some() {
                return Ok(token);
            }
            stats::add(&stats::LOCK_WAITS, 1);
            // Woken by the holder's release, or after a short while to try again (a holder that died).
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

    fn now(&self) -> i64 {
        let (redis_ms, at) = self.clock.expect("set by every script reply");
        redis_ms + at.elapsed().as_millis() as i64
    }

    fn observe_time(&mut self, redis_ms: i64) {
        self.clock = Some((redis_ms, std::time::Instant::now()));
    }

    async fn reload(&mut self) -> Result<(), StoreError> {
        let (meta, revision, leases, now): LoadReply = self
            .scripts
            .load
            .key(&self.keys.meta)
            .key(&self.keys.rev)
            .key(&self.keys.leases)
            .invoke_async(&mut self.conn)
            .await?;
        self.observe_time(now);
        stats::add(&stats::LOADS, 1);
        stats::add(
            &stats::LOAD_BYTES,
            meta.as_ref().map_or(0, |m| m.len() as u64),
        );
        let keys = &self.keys;
        let mut coordinator = match meta {
            None => {
                // Never trust a missing snapshot to mean a new group (see the module docs).
                let creation = if revision > 0 || !leases.is_empty() {
                    tracing::warn!(key = %keys.meta, revision, leases = leases.len(), "group metadata is missing but its revision or leases exist: it was lost; recreating it, with grants paused until every member of the lost state has self-fenced");
                    Creation::AfterLoss
                } else {
                    Creation::Fresh
                };
                Coordinator::create(
                    self.group.clone(),
                    self.shard_count,
                    self.config,
                    now,
                    creation,
                )
            }
            Some(bytes) => GroupMetadata::from_json(&bytes)
                .and_then(Coordinator::from_metadata)
                .map_err(|source| StoreError::Metadata {
                    key: keys.meta.clone(),
                    source,
                })?,
        };
        for (member, deadline) in leases {
            coordinator.set_lease(&member, deadline);
        }
        self.cache = Some(Snapshot {
            revision,
            coordinator,
        });
        Ok(())
    }

    async fn renew(&mut self, snapshot: &mut Snapshot, member: &str) -> Result<bool, StoreError> {
        let timer = snapshot.coordinator.next_timer().unwrap_or(-1);
        let session = snapshot.coordinator.metadata().config.session_timeout_ms;
        let reply: Vec<i64> = self
            .scripts
            .renew
            .key(&self.keys.rev)
            .key(&self.keys.leases)
            .key(&self.keys.meta)
            .arg(snapshot.revision)
            .arg(member)
            .arg(session)
            .arg(timer)
            .invoke_async(&mut self.conn)
            .await?;
        let (renewed, now, min_lease) = decode_reply("renew.lua", reply)?;
        self.observe_time(now);
        let Some(min_lease) = min_lease.filter(|_| renewed) else {
            return Ok(false);
        };
        stats::add(&stats::RENEWALS, 1);
        // Every lease is at least the smallest one in Redis: good enough to know nobody expired yet.
        snapshot.coordinator.raise_leases(min_lease);
        snapshot.coordinator.set_lease(member, now + session);
        Ok(true)
    }

    async fn commit<R>(
        &mut self,
        snapshot: &mut Snapshot,
        now: i64,
        outcome: &Outcome<R>,
    ) -> Result<bool, StoreError> {
        let meta = snapshot.coordinator.metadata();
        let meta_json = meta.to_json();
        let projection = serde_json::to_vec(&snapshot.coordinator.projection(now))
            .expect("projection serializes");
        let bytes = (meta_json.len() + projection.len()) as u64;
        let mut invocation = self.scripts.commit.prepare_invoke();
        invocation
            .key(&self.keys.meta)
            .key(&self.keys.rev)
            .key(&self.keys.leases)
            .key(&self.keys.audit)
            .key(&self.keys.projection)
            .arg(snapshot.revision)
            .arg(now)
            .arg(meta_json)
            .arg(projection)
            .arg(AUDIT_MAX_LEN);
        // The core says which leases it relied on and which members are gone.
        let writes = &outcome.writes;
        invocation.arg(writes.lease_checks.len());
        for (id, lease) in &writes.lease_checks {
            invocation.arg(id).arg(*lease);
        }
        invocation.arg(meta.members.len());
        for (id, m) in &meta.members {
            invocation.arg(id).arg(m.lease_deadline_ms);
        }
        invocation.arg(writes.removed.len());
        for id in &writes.removed {
            invocation.arg(id);
        }
        invocation.arg(outcome.events.len());
        for event in &outcome.events {
            invocation.arg(serde_json::to_string(event).expect("events serialize"));
        }
        let reply: Vec<i64> = invocation.invoke_async(&mut self.conn).await?;
        let (committed, now, revision) = decode_reply("commit.lua", reply)?;
        self.observe_time(now);
        let Some(revision) = revision.filter(|_| committed) else {
            stats::add(&stats::CONFLICTS, 1);
            return Ok(false);
        };
        stats::add(&stats::COMMITS, 1);
        stats::add(&stats::COMMIT_BYTES, bytes);
        snapshot.revision = revision;
        Ok(true)
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

/// A little randomness without a dependency (jitter, nonces): the std hasher is randomly keyed.
pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    hasher.finish()
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
                .and_then(Coordinator::from_metadata);
        }
    }
}
