//! The runtime bootstrap: one call starts every listener of the process and stops them gracefully.
//!
//! ```no_run
//! # async fn run() -> Result<(), stream_listener::RuntimeError> {
//! // Every #[stream_listener] of the binary, Redis from REDIS_URL, until SIGTERM or ctrl-c.
//! stream_listener::Runtime::from_env().run().await
//! # }
//! ```
//!
//! For each annotated listener with `concurrency = n` the runtime starts `n` logical members
//! `{base}-m0 .. {base}-m{n-1}`, each with its own heartbeat loop, Redis consumer name, assignment state and
//! member epoch. A [`ConsumerBuilder`] adds exactly one explicitly named member whose
//! `runtime_max_concurrency` is local worker capacity (the spec's bean-based consumer).

use std::time::Duration;

use crate::connection::{ConnectOptions, Connection, RedisTarget};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::consumer::{
    AckPolicy, BoxedHandler, Consumer, ConsumerConfig, ConsumerError, FailurePolicy, Handler,
};
use crate::coordinator::metadata::GroupConfig;
use crate::coordinator::AdminCommand;
use crate::member::heartbeat::{MemberLoop, MemberStatus};
use crate::member::identity;
use crate::member::lifecycle::OwnershipDeadline;
use crate::member::session::{MemberIdentity, MemberSession, Phase};
use crate::registry::{registrations, ListenerRegistration};
use crate::store::{GroupStore, StoreError};
use crate::topology::{DrainState, StartFrom, Topology, TopologyError};

/// Shards of a stream created by a listener when no producer has created its topology yet.
pub const DEFAULT_SHARD_COUNT: u32 = 16;

/// Why the runtime could not start.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// Redis is unreachable or failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The stream's topology could not be read or created.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// The group metadata store refused the names.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A consumer could not start.
    #[error(transparent)]
    Consumer(#[from] ConsumerError),
    /// Redis did not answer within the startup limit ([`Runtime::startup_timeout`]).
    #[error("Redis at {url} unreachable for {waited_ms} ms ({attempts} attempts): {last_error}")]
    Unreachable {
        /// The URL, credentials redacted.
        url: String,
        /// Connection attempts made.
        attempts: u32,
        /// How long the runtime kept trying.
        waited_ms: u64,
        /// The last attempt's error.
        last_error: redis::RedisError,
    },
    /// A graceful shutdown missed its deadline; what was still running was aborted (entries in flight stay
    /// pending for the next owner).
    #[error("shutdown missed its deadline of {timeout_ms} ms; stuck: {}", .stuck.join("; "))]
    ShutdownTimedOut {
        /// The shutdown timeout.
        timeout_ms: u64,
        /// One line per member that did not stop: its id, the shards it still owned, its running handlers.
        stuck: Vec<String>,
    },
    /// Nothing to run.
    #[error("no listener registered: add #[stream_listener] handlers or a ConsumerBuilder")]
    NoListeners,
    /// Two listeners of this process would run the same member of the same group: they would fence each
    /// other forever. Give one an `id` (attribute) or a [`ConsumerBuilder::member_id`].
    #[error(
        "listeners {first} and {second} would both run member `{member_id}` of group `{group}` on stream `{stream}`: \
         give one of them another id (`id = \"...\"` on the attribute, `ConsumerBuilder::member_id`)"
    )]
    DuplicateMemberId {
        /// The member id both would use.
        member_id: String,
        /// The stream.
        stream: String,
        /// The group.
        group: String,
        /// The first listener (handler path and source location, or the builder).
        first: String,
        /// The second listener.
        second: String,
    },
}

/// One explicitly registered member (the spec's `CoordinatorConsumerProperties.consumer(...)`).
///
/// ```no_run
/// # use stream_listener::{ConsumerBuilder, Message};
/// # #[derive(serde::Deserialize)] struct Order;
/// let billing = ConsumerBuilder::new("orders", "billing")
///     .runtime_max_concurrency(4) // four local workers for this one member, any number of shards
///     .handler(|msg: Message<Order>| async move { Ok::<(), std::convert::Infallible>(()) });
/// ```
#[derive(Debug, Clone)]
pub struct ConsumerBuilder {
    stream: String,
    group: String,
    member_id: Option<String>,
    runtime_max_concurrency: usize,
    weight: u32,
    batch_size: Option<usize>,
    block_ms: Option<u64>,
    ack: Option<AckPolicy>,
    failure: Option<FailurePolicy>,
    dead_letter: Option<String>,
    handler_timeout: Option<Duration>,
    handler: Option<BoxedHandler>,
}

impl ConsumerBuilder {
    /// A member of `group` reading `stream`.
    pub fn new(stream: impl Into<String>, group: impl Into<String>) -> Self {
        Self {
            stream: stream.into(),
            group: group.into(),
            member_id: None,
            runtime_max_concurrency: 1,
            weight: 1,
            batch_size: None,
            block_ms: None,
            ack: None,
            failure: None,
            dead_letter: None,
            handler_timeout: None,
            handler: None,
        }
    }

    /// The memberId (default: the process's base member id, see [`identity`]).
    pub fn member_id(mut self, id: impl Into<String>) -> Self {
        self.member_id = Some(id.into());
        self
    }

    /// Local worker capacity of this one member. Never creates members, never limits owned shards.
    pub fn runtime_max_concurrency(mut self, workers: usize) -> Self {
        self.runtime_max_concurrency = workers.max(1);
        self
    }

    /// Static balancing weight (default 1).
    pub fn weight(mut self, weight: u32) -> Self {
        self.weight = weight.max(1);
        self
    }

    /// Entries per read (default 100).
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = Some(n);
        self
    }

    /// Blocking read timeout.
    pub fn block_ms(mut self, ms: u64) -> Self {
        self.block_ms = Some(ms);
        self
    }

    /// Acknowledgement policy.
    pub fn ack(mut self, ack: AckPolicy) -> Self {
        self.ack = Some(ack);
        self
    }

    /// Retry and dead-letter policy.
    pub fn failure(mut self, failure: FailurePolicy) -> Self {
        self.failure = Some(failure);
        self
    }

    /// Dead-letter stream (default `{stream}:dlq`).
    pub fn dead_letter(mut self, stream: impl Into<String>) -> Self {
        self.dead_letter = Some(stream.into());
        self
    }

    /// How long one handler attempt may run (default: no limit). An attempt past it is cancelled and
    /// counts as a failed delivery: retried, then dead-lettered per the failure policy.
    pub fn handler_timeout(mut self, timeout: Duration) -> Self {
        self.handler_timeout = Some(timeout);
        self
    }

    /// A handler of JSON payloads: a closure or any [`Handler`].
    pub fn handler<T, H>(mut self, handler: H) -> Self
    where
        T: DeserializeOwned + Send + 'static,
        H: Handler<T>,
    {
        self.handler = Some(BoxedHandler::json(handler));
        self
    }

    /// A handler of raw payload bytes.
    pub fn raw_handler<H: Handler<Vec<u8>>>(mut self, handler: H) -> Self {
        self.handler = Some(BoxedHandler::raw(handler));
        self
    }

    fn consumer_config(&self, member_id: &str) -> ConsumerConfig {
        let mut config = ConsumerConfig::new(&self.stream, &self.group, member_id);
        config.runtime_max_concurrency = self.runtime_max_concurrency;
        if let Some(n) = self.batch_size {
            config.batch_size = n;
        }
        if let Some(ms) = self.block_ms {
            config.block_ms = ms;
        }
        if let Some(ack) = self.ack {
            config.ack_policy = ack;
        }
        if let Some(failure) = self.failure {
            config.failure_policy = failure;
        }
        config.dead_letter_stream = self.dead_letter.clone();
        config.handler_timeout = self.handler_timeout;
        config
    }
}

/// Everything needed to start one logical member.
#[derive(Debug, Clone)]
struct MemberPlan {
    label: String,
    /// Where the listener was declared, for errors.
    origin: String,
    member_id: String,
    weight: u32,
    consumer: ConsumerConfig,
    handler: BoxedHandler,
}

/// The process-wide runtime. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct Runtime {
    /// Redacted in `Debug`: the URL may carry a password.
    redis_url: crate::redact::RedisUrl,
    base_member_id: Option<String>,
    group_config: GroupConfig,
    shard_count: u32,
    shutdown_timeout: Duration,
    startup_timeout: Option<Duration>,
    annotated: bool,
    builders: Vec<ConsumerBuilder>,
}

impl Runtime {
    /// A runtime for the Redis at `redis_url`, running every `#[stream_listener]` of the binary.
    pub fn new(redis_url: impl Into<String>) -> Self {
        Self {
            redis_url: crate::redact::RedisUrl::new(redis_url),
            base_member_id: None,
            group_config: GroupConfig::default(),
            shard_count: DEFAULT_SHARD_COUNT,
            shutdown_timeout: Duration::from_secs(30),
            startup_timeout: None,
            annotated: true,
            builders: Vec::new(),
        }
    }

    /// [`Runtime::new`] with `REDIS_URL` (default `redis://127.0.0.1:6379`) and `STREAM_LISTENER_MEMBER_ID`.
    pub fn from_env() -> Self {
        let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
        let mut runtime = Self::new(url);
        runtime.base_member_id = std::env::var("STREAM_LISTENER_MEMBER_ID")
            .ok()
            .filter(|s| !s.is_empty());
        runtime
    }

    /// Overrides the base member id of annotated listeners (default: pod IP, local address, hostname).
    pub fn base_member_id(mut self, id: impl Into<String>) -> Self {
        self.base_member_id = Some(id.into());
        self
    }

    /// Timing of groups this process creates (existing groups keep theirs).
    pub fn group_config(mut self, config: GroupConfig) -> Self {
        self.group_config = config;
        self
    }

    /// Shards of streams this process creates when no producer created them first (default 16).
    pub fn default_shard_count(mut self, n: u32) -> Self {
        self.shard_count = n.max(1);
        self
    }

    /// How long a graceful shutdown may take.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// How long [`start`](Self::start) keeps trying to reach Redis before it gives up with
    /// [`RuntimeError::Unreachable`]. Default: no limit (it keeps trying, with exponential backoff from
    /// 100 ms to 5 s plus jitter, and logs each failed attempt), so a pod started before its Redis does not
    /// crash-loop.
    pub fn startup_timeout(mut self, limit: Duration) -> Self {
        self.startup_timeout = Some(limit);
        self
    }

    /// Runs only builder-registered consumers, not the annotated listeners of the binary.
    pub fn without_annotated_listeners(mut self) -> Self {
        self.annotated = false;
        self
    }

    /// Adds one explicitly registered member.
    pub fn consumer(mut self, builder: ConsumerBuilder) -> Self {
        self.builders.push(builder);
        self
    }

    /// Starts everything and runs until SIGTERM or ctrl-c, then shuts down gracefully. A shutdown that
    /// misses its deadline is an error ([`RuntimeError::ShutdownTimedOut`]), so the binary exits non-zero.
    pub async fn run(self) -> Result<(), RuntimeError> {
        let running = self.start().await?;
        wait_for_signal().await;
        tracing::info!("shutting down");
        running.stop().await
    }

    /// Starts everything and returns a handle (for embedding and tests).
    pub async fn start(self) -> Result<RunningRuntime, RuntimeError> {
        let plans = self.plans();
        if plans.is_empty() {
            return Err(RuntimeError::NoListeners);
        }
        check_unique_members(&plans)?;
        let client = RedisTarget::open(self.redis_url.expose())?;
        crate::startup::wait_for_redis(&client, &self.redis_url, self.startup_timeout).await?;
        let (shutdown, shutdown_rx) = watch::channel(false);
        let mut groups: Vec<(String, String)> = plans
            .iter()
            .map(|p| (p.consumer.stream_prefix.clone(), p.consumer.group.clone()))
            .collect();
        groups.sort();
        groups.dedup();
        let mut members = Vec::new();
        for plan in plans {
            members.push(
                self.start_member(&client, plan, shutdown_rx.clone())
                    .await?,
            );
        }
        let mut followers = Vec::new();
        for (stream, group) in groups {
            let conn = client.connect(ConnectOptions::default()).await?;
            let store = GroupStore::new(conn.clone(), &stream, &group, 1, self.group_config)?;
            let period =
                Duration::from_millis(self.group_config.heartbeat_interval_ms.max(200) as u64 * 5);
            followers.push(tokio::spawn(follow_topology(
                conn,
                store,
                stream,
                group,
                period,
                shutdown_rx.clone(),
            )));
        }
        Ok(RunningRuntime {
            shutdown,
            members,
            followers,
            timeout: self.shutdown_timeout,
        })
    }

    fn plans(&self) -> Vec<MemberPlan> {
        let mut plans = Vec::new();
        let registered: Vec<&'static ListenerRegistration> = if self.annotated {
            registrations().collect()
        } else {
            Vec::new()
        };
        for reg in registered {
            let base = match reg.id.or(self.base_member_id.as_deref()) {
                Some(id) => identity::base_member_id(Some(id)),
                None => reg.base_member_id(),
            };
            for member_id in reg.member_ids(&base.id) {
                plans.push(MemberPlan {
                    label: reg.qualified_name(),
                    origin: format!(
                        "#[stream_listener] {} ({}:{})",
                        reg.qualified_name(),
                        reg.file,
                        reg.line
                    ),
                    consumer: reg.consumer_config(&member_id),
                    member_id,
                    weight: reg.member_weight(),
                    handler: reg.handler(),
                });
            }
        }
        for (index, builder) in self.builders.iter().enumerate() {
            let Some(handler) = builder.handler.clone() else {
                tracing::warn!(stream = %builder.stream, group = %builder.group, "consumer without a handler: skipped");
                continue;
            };
            let member_id = builder.member_id.clone().unwrap_or_else(|| {
                let base = identity::base_member_id(self.base_member_id.as_deref());
                format!("{}-{}", base.id, builder.group)
            });
            plans.push(MemberPlan {
                label: format!("{}/{}", builder.stream, builder.group),
                origin: format!(
                    "ConsumerBuilder::new({:?}, {:?}) (consumer #{} of the Runtime)",
                    builder.stream,
                    builder.group,
                    index + 1
                ),
                consumer: builder.consumer_config(&member_id),
                member_id,
                weight: builder.weight,
                handler,
            });
        }
        plans
    }

    async fn start_member(
        &self,
        client: &RedisTarget,
        plan: MemberPlan,
        shutdown: watch::Receiver<bool>,
    ) -> Result<RunningMember, RuntimeError> {
        let interval = Duration::from_millis(self.group_config.heartbeat_interval_ms as u64);
        // The heartbeat connection is the member's own: never behind a blocking read. Its response timeout
        // is one heartbeat interval, so a stuck Redis shows up before the lease is at risk.
        let options = ConnectOptions {
            response_timeout: Some(interval),
            connection_timeout: Some(interval),
            retries: Some(2),
        };
        let mut conn = client.connect(options).await?;
        let stream = plan.consumer.stream_prefix.clone();
        let group = plan.consumer.group.clone();
        let topology = match Topology::load(&mut conn, &stream).await {
            Ok(topology) => topology,
            Err(TopologyError::Missing { .. }) => {
                Topology::ensure(&mut conn, &stream, self.shard_count).await?
            }
            Err(e) => return Err(e.into()),
        };
        Topology::ensure_group(&mut conn, &stream, &group, StartFrom::Earliest).await?;
        let store = GroupStore::new(
            conn,
            &stream,
            &group,
            topology.read_shard_count(),
            self.group_config,
        )?;
        let runtime_max_concurrency = plan.consumer.runtime_max_concurrency as u32;
        let mut consumer_config = plan.consumer;
        consumer_config.reclaim_idle =
            Duration::from_millis(self.group_config.session_timeout_ms.max(1) as u64);
        let deadline = OwnershipDeadline::new();
        let consumer = Consumer::connect(client.clone(), consumer_config, plan.handler)
            .await?
            .with_deadline(deadline.clone());
        let probe = consumer.probe();
        let health_deadline = deadline.clone();
        let identity = MemberIdentity {
            member_id: plan.member_id.as_str().into(),
            member_name: Some(plan.label.clone()),
            weight: plan.weight,
            runtime_max_concurrency,
        };
        let (commands_tx, mut commands_rx) = mpsc::unbounded_channel();
        let (reports_tx, reports_rx) = mpsc::unbounded_channel();
        let (consumer_commands_tx, consumer_commands_rx) = mpsc::channel(1024);
        let (consumer_reports_tx, mut consumer_reports_rx) = mpsc::channel(1024);
        // Bridges between the heartbeat loop's unbounded channels and the consumer's bounded ones.
        tokio::spawn(async move {
            while let Some(command) = commands_rx.recv().await {
                if consumer_commands_tx.send(command).await.is_err() {
                    break;
                }
            }
        });
        tokio::spawn(async move {
            while let Some(report) = consumer_reports_rx.recv().await {
                if reports_tx.send(report).is_err() {
                    break;
                }
            }
        });
        let consumer_task = tokio::spawn(consumer.run(consumer_commands_rx, consumer_reports_tx));
        let (status_tx, status) = watch::channel(MemberStatus {
            phase: Phase::Joining,
            epoch: 0,
            owned: Vec::new(),
            failures: 0,
        });
        tokio::spawn(crate::metrics::follow_member(
            status.clone(),
            deadline.clone(),
            stream.clone(),
            group.clone(),
            plan.member_id.clone(),
        ));
        let session = MemberSession::new(
            identity,
            self.group_config.session_timeout_ms,
            incarnation(),
        );
        tracing::info!(member = %plan.member_id, listener = %plan.label, "member starting");
        let heartbeat_task = tokio::spawn(
            MemberLoop {
                session,
                store,
                commands: commands_tx,
                reports: reports_rx,
                shutdown,
                status: status_tx,
                shutdown_timeout: self.shutdown_timeout,
                deadline,
            }
            .run(),
        );
        Ok(RunningMember {
            member_id: plan.member_id,
            probe,
            lease: health_deadline,
            status,
            heartbeat_task,
            consumer_task,
        })
    }
}

/// One started member.
#[derive(Debug)]
struct RunningMember {
    member_id: String,
    probe: crate::health::Probe,
    lease: std::sync::Arc<OwnershipDeadline>,
    status: watch::Receiver<MemberStatus>,
    heartbeat_task: JoinHandle<()>,
    consumer_task: JoinHandle<()>,
}

/// A started runtime.
#[derive(Debug)]
pub struct RunningRuntime {
    shutdown: watch::Sender<bool>,
    members: Vec<RunningMember>,
    followers: Vec<JoinHandle<()>>,
    timeout: Duration,
}

impl RunningRuntime {
    /// The memberIds this process runs, in start order.
    pub fn member_ids(&self) -> Vec<String> {
        self.members.iter().map(|m| m.member_id.clone()).collect()
    }

    /// Readiness and liveness of every member: heartbeating, joined and not self-fenced, no shard in a
    /// read error loop, no handler past its timeout (see [`crate::health`]).
    pub fn health(&self) -> crate::health::Health {
        crate::health::Health {
            members: self
                .members
                .iter()
                .map(|m| {
                    let status = m.status.borrow();
                    m.probe.member_health(
                        &m.member_id,
                        !m.heartbeat_task.is_finished(),
                        status.phase == Phase::Member && m.lease.is_valid(),
                        status.failures,
                    )
                })
                .collect(),
        }
    }

    /// The current status of every member.
    pub fn statuses(&self) -> Vec<(String, MemberStatus)> {
        self.members
            .iter()
            .map(|m| (m.member_id.clone(), m.status.borrow().clone()))
            .collect()
    }

    /// Graceful shutdown: every member revokes its shards, waits for in-flight handlers, acknowledges,
    /// reports REVOKED and leaves the group; bounded by the shutdown timeout. What missed the deadline is
    /// logged; [`stop`](Self::stop) returns it as an error.
    pub async fn shutdown(self) {
        if let Err(error) = self.stop().await {
            tracing::error!(%error, "shutdown incomplete");
        }
    }

    /// [`shutdown`](Self::shutdown), returning [`RuntimeError::ShutdownTimedOut`] naming every member that
    /// did not stop in time (its shards and running handlers). Those are aborted: their entries stay pending
    /// and the next owner claims them.
    pub async fn stop(self) -> Result<(), RuntimeError> {
        for member in &self.members {
            member.probe.take_aborted();
        }
        let begun = tokio::time::Instant::now();
        let _ = self.shutdown.send(true);
        for follower in self.followers {
            follower.abort();
        }
        let deadline = begun + self.timeout + Duration::from_secs(1);
        let mut stuck = Vec::new();
        for member in self.members {
            let heartbeat = member.heartbeat_task.abort_handle();
            // The heartbeat loop gives up the leave at the shutdown timeout (and fences the consumer).
            let heartbeat_late = tokio::time::timeout_at(deadline, member.heartbeat_task)
                .await
                .is_err()
                || begun.elapsed() >= self.timeout;
            if heartbeat_late {
                tracing::warn!(member = %member.member_id, "the leave did not complete within the shutdown timeout");
                heartbeat.abort();
            }
            // The heartbeat loop is gone, so the command channel is closed and the consumer winds down.
            let consumer = member.consumer_task.abort_handle();
            let consumer_late = tokio::time::timeout_at(deadline, member.consumer_task)
                .await
                .is_err();
            if heartbeat_late || consumer_late {
                let owned = member.status.borrow().owned.clone();
                let mut handlers = member.probe.take_aborted();
                handlers.extend(member.probe.in_flight());
                let what = format!(
                    "member {} ({}{}; shards {:?}; handlers running: {})",
                    member.member_id,
                    if heartbeat_late {
                        "leave not completed"
                    } else {
                        ""
                    },
                    match (heartbeat_late, consumer_late) {
                        (true, true) => ", consumer",
                        (false, true) => "consumer",
                        _ => "",
                    },
                    owned,
                    if handlers.is_empty() {
                        "none".to_owned()
                    } else {
                        handlers
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                );
                tracing::warn!(member = %member.member_id, stuck = %what, "did not stop in time; aborting");
                consumer.abort();
                stuck.push(what);
            }
        }
        if stuck.is_empty() {
            Ok(())
        } else {
            Err(RuntimeError::ShutdownTimedOut {
                timeout_ms: self.timeout.as_millis() as u64,
                stuck,
            })
        }
    }
}

/// Keeps a group's shard count equal to the number of shards its stream's groups read: the shard count
/// belongs to the stream (its topology record), so when the stream is resized every group reading it must
/// follow, or entries routed to new shards would never be read. Every process runs one of these per group
/// it reads; the command is idempotent, so racing processes agree.
///
/// A grow is followed at once. A shrink is not: while its removed shards drain the topology's
/// [`read_shard_count`](Topology::read_shard_count) stays the old count, so the group keeps reading them.
/// Each tick also moves the drain on ([`Topology::retire_drained`]: freeze the removed shards once the cut
/// has passed, delete them once every group consumed them to the end, then drop them from the record);
/// only then does the group follow to the smaller count.
async fn follow_topology(
    mut conn: Connection,
    mut store: GroupStore,
    stream: String,
    group: String,
    period: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut warned_missing = false;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = shutdown.changed() => return,
        }
        let mut topology = match Topology::load(&mut conn, &stream).await {
            Ok(topology) => topology,
            Err(TopologyError::Missing { .. }) => {
                // Redis lost it (restarted empty, flushed) while the group lives on: recreate it from
                // the group's shard count, once the group's metadata is real again (committed by its
                // members), so producers can route again.
                match store.load().await {
                    Ok((_, c)) if c.metadata().metadata_version > 0 => {
                        let count = c.metadata().shard_count;
                        if !warned_missing {
                            tracing::warn!(%stream, %group, shard_count = count, "the stream's topology is missing (Redis restarted empty or was flushed?): recreating it from the group's shard count");
                            warned_missing = true;
                        }
                        if let Err(error) = Topology::ensure(&mut conn, &stream, count).await {
                            tracing::warn!(%stream, %error, "cannot recreate the stream's topology");
                        }
                    }
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(%stream, %group, %error, "cannot read the group's metadata")
                    }
                }
                continue;
            }
            Err(error) => {
                tracing::warn!(%stream, %error, "cannot read the stream's topology");
                continue;
            }
        };
        warned_missing = false;
        if !topology.draining_shards().is_empty() {
            match Topology::retire_drained(&mut conn, &stream).await {
                Ok((retired, DrainState::Retired)) => {
                    tracing::info!(%stream, shards = ?topology.draining_shards(), "a shrink's removed shards are drained and retired");
                    topology = retired;
                }
                Ok((_, DrainState::Draining(reason))) => {
                    tracing::debug!(%stream, %reason, "a shrink's removed shards are draining");
                }
                Err(error) => {
                    tracing::warn!(%stream, %error, "cannot retire a shrink's removed shards");
                }
            }
        }
        let target = topology.read_shard_count();
        let current = match store.load().await {
            Ok((_, coordinator)) => coordinator.metadata().shard_count,
            Err(error) => {
                tracing::warn!(%stream, %group, %error, "cannot read the group's metadata");
                continue;
            }
        };
        if current == target {
            continue;
        }
        tracing::info!(%stream, %group, from = current, to = target, "stream resized: following");
        if let Err(error) =
            Topology::ensure_group(&mut conn, &stream, &group, StartFrom::Earliest).await
        {
            tracing::warn!(%stream, %group, %error, "cannot create the group on the new shards");
            continue;
        }
        match store.command(AdminCommand::SetShardCount(target)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%stream, %group, %error, "shard count change refused"),
            Err(error) => tracing::warn!(%stream, %group, %error, "shard count change failed"),
        }
    }
}

/// Refuses two plans with the same member of the same group (they would fence each other forever).
fn check_unique_members(plans: &[MemberPlan]) -> Result<(), RuntimeError> {
    let mut seen: std::collections::HashMap<(&str, &str, &str), &MemberPlan> =
        std::collections::HashMap::new();
    for plan in plans {
        let key = (
            plan.consumer.stream_prefix.as_str(),
            plan.consumer.group.as_str(),
            plan.member_id.as_str(),
        );
        if let Some(first) = seen.insert(key, plan) {
            return Err(RuntimeError::DuplicateMemberId {
                member_id: plan.member_id.clone(),
                stream: plan.consumer.stream_prefix.clone(),
                group: plan.consumer.group.clone(),
                first: first.origin.clone(),
                second: plan.origin.clone(),
            });
        }
    }
    Ok(())
}

/// A nonce that differs between processes and restarts using the same memberId.
fn incarnation() -> u64 {
    crate::store::random_u64() ^ u64::from(std::process::id())
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
