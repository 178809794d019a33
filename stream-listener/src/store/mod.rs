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
//! * On any refusal the store reloads and applies the input again: bounded retries with jitter.
//!
//! Key layout (one Redis Cluster slot per group thanks to the hash tag): see [`GroupKeys`].

use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::Script;

use crate::coordinator::events::AuditEvent;
use crate::coordinator::metadata::{GroupConfig, GroupMetadata, MetadataError};
use crate::coordinator::projection::GroupProjection;
use crate::coordinator::wire::{HeartbeatRequest, HeartbeatResponse};
use crate::coordinator::{AdminCommand, Change, CommandError, Coordinator, Outcome};

/// Attempts of one input before giving up with [`StoreError::Contention`].
const MAX_ATTEMPTS: u32 = 16;
/// Audit entries kept (approximately).
const AUDIT_MAX_LEN: u64 = 10_000;

/// The Redis keys of one group.
///
/// | key | type | holds |
/// | --- | --- | --- |
/// | `sl:{<stream>/<group>}:meta` | string | the group metadata snapshot (JSON, with its schema version) |
/// | `sl:{<stream>/<group>}:rev` | string | the store revision, incremented by every commit |
/// | `sl:{<stream>/<group>}:leases` | sorted set | memberId scored by lease deadline (Redis ms) |
/// | `sl:{<stream>/<group>}:audit` | stream | audit events, capped at about 10,000 |
/// | `sl:{<stream>/<group>}:projection` | string | the monitoring projection (JSON) |
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
    conn: ConnectionManager,
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
}

impl GroupStore {
    /// A handle on `group` of `stream`. `shard_count` and `config` are used only if the group does not
    /// exist yet; an existing group keeps its own.
    pub fn new(
        conn: ConnectionManager,
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
            conn,
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
        for attempt in 0..MAX_ATTEMPTS {
            if attempt > 0 {
                self.cache = None;
                // Jitter spreads processes that collided.
                let jitter = (random_u64() % (2 + u64::from(attempt) * 3)) + 1;
                tokio::time::sleep(Duration::from_millis(jitter)).await;
            }
            if self.cache.is_none() {
                self.reload().await?;
            }
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
            if written {
                self.cache = Some(snapshot);
                return Ok(outcome.response);
            }
        }
        self.cache = None;
        Err(StoreError::Contention)
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
        let keys = &self.keys;
        let mut coordinator = match meta {
            None => Coordinator::new(self.group.clone(), self.shard_count, self.config),
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
            .arg(snapshot.revision)
            .arg(member)
            .arg(session)
            .arg(timer)
            .invoke_async(&mut self.conn)
            .await?;
        self.observe_time(reply[1]);
        if reply[0] != 1 {
            return Ok(false);
        }
        // Every lease is at least the smallest one in Redis: good enough to know nobody expired yet.
        snapshot.coordinator.raise_leases(reply[2]);
        snapshot.coordinator.set_lease(member, reply[1] + session);
        Ok(true)
    }

    async fn commit<R>(
        &mut self,
        snapshot: &mut Snapshot,
        now: i64,
        outcome: &Outcome<R>,
    ) -> Result<bool, StoreError> {
        let meta = snapshot.coordinator.metadata();
        let mut invocation = self.scripts.commit.prepare_invoke();
        invocation
            .key(&self.keys.meta)
            .key(&self.keys.rev)
            .key(&self.keys.leases)
            .key(&self.keys.audit)
            .key(&self.keys.projection)
            .arg(snapshot.revision)
            .arg(now)
            .arg(meta.to_json())
            .arg(
                serde_json::to_vec(&snapshot.coordinator.projection(now))
                    .expect("projection serializes"),
            )
            .arg(AUDIT_MAX_LEN);
        // Members the core expired or fenced: it used their lease (for expiry and for fenced holds), so
        // it must still be the one in Redis. Members gone for good leave the leases set.
        let mut gone: Vec<(&str, i64)> = Vec::new();
        let mut removed: Vec<&str> = Vec::new();
        for event in &outcome.events {
            let (id, lease) = match event {
                AuditEvent::MemberExpired {
                    member_id,
                    lease_deadline_ms,
                    ..
                }
                | AuditEvent::MemberFenced {
                    member_id,
                    lease_deadline_ms,
                    ..
                } => (member_id.as_str(), Some(*lease_deadline_ms)),
                AuditEvent::MemberLeft { member_id } => (member_id.as_str(), None),
                _ => continue,
            };
            if let Some(lease) = lease {
                gone.push((id, lease));
            }
            if !meta.members.contains_key(id) {
                removed.push(id);
            }
        }
        invocation.arg(gone.len());
        for (id, lease) in &gone {
            invocation.arg(*id).arg(*lease);
        }
        invocation.arg(meta.members.len());
        for (id, m) in &meta.members {
            invocation.arg(id).arg(m.lease_deadline_ms);
        }
        invocation.arg(removed.len());
        for id in &removed {
            invocation.arg(*id);
        }
        invocation.arg(outcome.events.len());
        for event in &outcome.events {
            invocation.arg(serde_json::to_string(event).expect("events serialize"));
        }
        let reply: Vec<i64> = invocation.invoke_async(&mut self.conn).await?;
        self.observe_time(reply[1]);
        if reply[0] != 1 {
            return Ok(false);
        }
        snapshot.revision = reply[2];
        Ok(true)
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
