//! The consumption layer of one logical member: the polling adapter and its workers.
//!
//! A [`Consumer`] is driven by the member's heartbeat loop through [`ShardCommand`]s and answers with
//! [`ShardReport`]s (see [`crate::member::lifecycle`]). It owns everything the spec puts on the member side:
//! worker lifecycle, Redis reads, handler execution, the ack / dead-letter policy and progress reports.
//!
//! # Scheduling
//!
//! Owned shards wait in one round-robin ready queue. Up to four jobs per worker run at once; a job takes
//! one shard, fetches a batch, waits for a worker (at most `runtime_max_concurrency` handlers run at once),
//! runs the handler on each entry in order, gives the worker back, acknowledges, and puts the shard back at
//! the end of the queue (it keeps a busy shard for up to 64 batches until the scheduler asks for it back
//! because another shard waits for a job, or the listener paused). So:
//!
//! * a shard is in at most one job at a time: one read loop per shard, one batch in flight, per-key order;
//! * a member with far more shards than workers still visits every shard once per rotation: no starvation;
//! * reads do not block while any shard may have data. Only after a whole rotation came back empty does
//!   the member wait, with one blocking read over all its idle shards (the `wait` module), and the
//!   rotation starts over afterwards, so an entry written to an idle shard is picked up within the wait
//!   and an idle member costs a couple of commands a second, however many shards it owns.
//!
//! These rules are decided by one pure state machine, the `scheduler` module's `ShardScheduler`, which
//! owns every per-shard fact (rule-named unit tests and a property test); the `driver` module is its shell:
//! it turns commands, job ends, hook answers, pause changes, the ownership deadline and time into the
//! machine's inputs and executes its commands (start a job or the idle wait, signal a job to stop or
//! yield, interrupt the wait, report to the heartbeat, call the hooks, abort everything on a fence).
//!
//! # Connections
//!
//! One multiplexed connection (on a single node a redis-rs `ConnectionManager`, reconnecting by itself; on
//! a cluster the cluster client) carries every non-blocking command: reads without `BLOCK`, claims, acks,
//! dead letters, scripts. The idle wait has a connection of its own, used only for its blocking read
//! (redis-rs would queue every other command behind a blocking read on a shared connection), plus one to
//! interrupt it. On a single node a member so opens a handful of connections, however many shards it owns
//! and workers it has; on a cluster, one blocking connection per slot group of its idle shards (see
//! ARCHITECTURE.md, "Redis Cluster").
//!
//! # Delivery
//!
//! At least once: an entry is acknowledged only after its handler returned `Ok` (or it was
//! dead-lettered). On [`ShardCommand::Assign`] the consumer first claims everything earlier owners left
//! pending (`XAUTOCLAIM` with min-idle 0, carrying the cursor to `0-0`), then deletes consumer names that
//! no longer hold anything, then reads new entries. On [`ShardCommand::Revoke`] it stops new reads, lets the
//! running handler finish, acknowledges what is done (the rest of the batch stays pending for the next
//! owner to claim), then reports [`ShardReport::Revoked`]. On [`ShardCommand::Fence`] it aborts everything
//! at once and acknowledges nothing more.
//!
//! # Order across a resize
//!
//! After [`Topology::resize`](crate::topology::Topology::resize), an entry of a key that moved to another
//! shard waits until the group has consumed the key's old shard up to the resize's cut (up to the entry
//! itself when the old shard is a shrink's draining shard); the shard's job stops at it and the scheduler
//! retries the shard shortly after (see the `order` module). Entries a producer wrote with a stale layout
//! after the cut are counted and logged ([`Topology::is_stale_write`](crate::topology::Topology::is_stale_write)).

pub(crate) mod attempt;
mod cluster_wait;
mod config;
mod driver;
mod entry;
mod fence;
mod fields;
mod hooks;
mod job;
mod job_spec;
pub(crate) mod message;
mod order;
mod retention;
mod scheduler;
mod shard_io;
mod unblock;
mod wait;
mod wait_spec;

pub use crate::preflight::ServerVersion;
pub use config::{AckPolicy, ConsumerConfig, DeleteRef, FailurePolicy, OnExhausted, Retention};
pub use fields::{FieldError, Fields};
pub use hooks::LifecycleHooks;
pub use message::{
    AckError, BatchHandler, BoxFuture, BoxedHandler, ErrorClass, Handler, HandlerError, Message,
    RawMessage,
};
pub use retention::trimmed_unread;
pub use shard_io::{dead_letter_fields, other_groups, KEY_FIELD, PAYLOAD_FIELD};

use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use crate::member::lifecycle::{OwnershipDeadline, ShardCommand, ShardReport};

use shard_io::ShardIo;

/// Why a consumer could not start.
#[derive(thiserror::Error, stream_listener_macros::ReportDebug)]
#[non_exhaustive]
pub enum ConsumerError {
    /// Connecting to Redis or reading its version failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The configuration cannot work.
    #[error("invalid consumer configuration: {0}")]
    Config(String),
    /// Redis evicts any key when it is full (`maxmemory-policy allkeys-*`): it could evict a shard
    /// stream with entries not handled yet, or the group's metadata.
    #[error(
        "Redis has maxmemory-policy {policy}: when full it may evict any key, a shard stream (entries no \
         group handled yet) or the group's metadata with it; set `maxmemory-policy noeviction` (a full \
         Redis then refuses new writes and loses nothing, and the consumers trim what every group \
         acknowledged)"
    )]
    EvictionPolicy {
        /// The policy found (`CONFIG GET maxmemory-policy`).
        policy: String,
    },
}

/// The polling adapter of one logical member: reads its owned shards, runs the handler, acknowledges.
///
/// Create it with [`Consumer::connect`], then drive it with [`Consumer::run`].
#[derive(Clone)]
pub struct Consumer {
    io: Arc<ShardIo>,
    handler: BoxedHandler,
    deadline: Arc<OwnershipDeadline>,
    hooks: LifecycleHooks,
    pause: PauseHandle,
}

/// Pauses and resumes a running [`Consumer`] (Kafka's `pause` / `resume`): while paused no new read or
/// claim starts (a running job finishes its batch; the idle wait is interrupted), the member keeps
/// heartbeating and keeps its shards, and revocations are still served.
#[derive(Debug, Clone)]
pub struct PauseHandle {
    pub(crate) paused: Arc<watch::Sender<bool>>,
}

impl PauseHandle {
    pub(crate) fn new() -> Self {
        Self {
            paused: Arc::new(watch::channel(false).0),
        }
    }

    /// Stop starting reads.
    pub fn pause(&self) {
        self.paused.send_replace(true);
    }

    /// Start reading again.
    pub fn resume(&self) {
        self.paused.send_replace(false);
    }

    /// Whether the consumer is paused.
    pub fn is_paused(&self) -> bool {
        *self.paused.borrow()
    }
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("config", &self.io.config)
            .field("server", &self.io.version)
            .finish()
    }
}

impl Consumer {
    /// Open the shared connection, detect the server version (to pick `XACKDEL` or the script) and check
    /// the configuration and the server (Redis >= 6.2, [`crate::preflight::MINIMUM_VERSION`]; a `maxmemory-policy` that does
    /// not evict any key: [`ConsumerError::EvictionPolicy`] for `allkeys-*`, a WARN for `volatile-*`). No shard is read until the
    /// first [`ShardCommand::Assign`].
    pub async fn connect(
        client: impl Into<crate::connection::RedisTarget>,
        config: ConsumerConfig,
        handler: BoxedHandler,
    ) -> Result<Self, ConsumerError> {
        if config.batch_size == 0 {
            return Err(ConsumerError::Config(
                "batch_size must be at least 1".into(),
            ));
        }
        if config.runtime_max_concurrency == 0 {
            return Err(ConsumerError::Config(
                "runtime_max_concurrency must be at least 1".into(),
            ));
        }
        if config.consumer_name.is_empty() || config.group.is_empty() {
            return Err(ConsumerError::Config(
                "group and consumer_name must not be empty".into(),
            ));
        }
        let client = client.into();
        if matches!(client, crate::connection::RedisTarget::Cluster { .. })
            && !crate::names::has_slot_tag(&config.shard_key(0))
        {
            return Err(ConsumerError::Config(format!(
                "on a cluster, the shard streams' names must have a hash tag or no `}}` (an ownership's fence shares its shard's slot): {:?}",
                config.stream_prefix
            )));
        }
        let io = ShardIo::connect(client, config).await?;
        retention::check_eviction_policy(&mut io.conn.clone()).await?;
        if let Some(refusal) = crate::preflight::version_refusal(io.version) {
            return Err(ConsumerError::Config(refusal.to_string()));
        }
        Ok(Self {
            io: Arc::new(io),
            handler,
            deadline: OwnershipDeadline::unbounded(),
            hooks: LifecycleHooks::default(),
            pause: PauseHandle::new(),
        })
    }

    /// Ties the consumer to its member's self-fencing deadline: no read, claim, ack, dead letter or
    /// handler start happens once it has passed, whatever the commands say (without one, only commands
    /// end ownership).
    pub fn with_deadline(mut self, deadline: Arc<OwnershipDeadline>) -> Self {
        self.deadline = deadline;
        self
    }

    /// The user's lifecycle hooks (see [`LifecycleHooks`]).
    pub fn with_hooks(mut self, hooks: LifecycleHooks) -> Self {
        self.hooks = hooks;
        self
    }

    /// The handle that pauses and resumes this consumer.
    pub fn pause_handle(&self) -> PauseHandle {
        self.pause.clone()
    }

    /// The configuration in effect.
    pub fn config(&self) -> &ConsumerConfig {
        &self.io.config
    }

    /// What the consumer is doing now: running handlers, failing reads (see [`crate::health`]).
    pub fn probe(&self) -> crate::health::Probe {
        self.io.probe.clone()
    }

    /// The Redis server version detected at connect time.
    pub fn server_version(&self) -> ServerVersion {
        self.io.version
    }

    /// Whether acknowledge-and-delete uses `XACKDEL` (true) or the `XACK` + `XDEL` script (false).
    pub fn uses_xackdel(&self) -> bool {
        self.io.version.has_xackdel()
    }

    /// Serve commands until `commands` is closed, then stop reading, let running handlers finish and
    /// acknowledge, and return. Dropping or aborting the returned future aborts every handler at once
    /// (entries in flight stay pending; the next owner claims them).
    pub async fn run(
        self,
        commands: mpsc::UnboundedReceiver<ShardCommand>,
        reports: mpsc::UnboundedSender<ShardReport>,
    ) {
        driver::Driver::new(
            self.io,
            self.handler,
            self.deadline,
            self.hooks,
            self.pause,
            reports,
        )
        .run(commands)
        .await;
    }
}
