//! The consumption layer of one logical member: the polling adapter and its workers.
//!
//! A [`Consumer`] is driven by the member's heartbeat loop through [`ShardCommand`]s and answers with
//! [`ShardReport`]s (see [`crate::member::lifecycle`]). It owns everything the spec puts on the member side:
//! worker lifecycle, Redis reads, handler execution, the ack / dead-letter policy and progress reports.
//!
//! # Scheduling
//!
//! Owned shards wait in one round-robin ready queue. Up to `runtime_max_concurrency` jobs run at once; a
//! job takes one shard, fetches a batch, runs the handler on each entry in order, acknowledges, and puts
//! the shard back at the end of the queue (it keeps the shard for up to 64 full batches while no other
//! shard waits for a worker, see the `job` module). So:
//!
//! * a shard is in at most one job at a time: one read loop per shard, one batch in flight, per-key order;
//! * a member with far more shards than workers still visits every shard once per rotation: no starvation;
//! * reads do not block while any shard may have data. Only after a whole rotation came back empty does
//!   the member wait, with one blocking read over all its idle shards (the `wait` module), and the
//!   rotation starts over afterwards, so an entry written to an idle shard is picked up within the wait
//!   and an idle member costs a couple of commands a second, however many shards it owns.
//!
//! These rules are decided by one pure state machine, [`scheduler::ShardScheduler`] (rule-named unit tests
//! and a property test); the loop below is its shell: it turns commands, job ends, pause changes, the
//! ownership deadline and time into the machine's inputs and executes its outputs (start a job or the idle
//! wait, interrupt the wait, report REVOKED, abort everything on a fence).
//!
//! # Connections
//!
//! One multiplexed connection (on a single node a redis-rs `ConnectionManager`, reconnecting by itself; on
//! a cluster the cluster client) carries every non-blocking command: reads without `BLOCK`, claims, acks,
//! dead letters, scripts. The idle wait has a connection of its own, used only for its `XREAD BLOCK`
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
//! retries the shard shortly after (see the `job` module). Entries a producer wrote with a stale layout
//! after the cut are counted and logged ([`Topology::is_stale_write`](crate::topology::Topology::is_stale_write)).

mod cluster_wait;
mod config;
mod fence;
mod fields;
mod hooks;
mod job;
mod message;
mod retention;
pub mod scheduler;
mod shard_io;
mod wait;

pub use config::{AckPolicy, ConsumerConfig, DeleteRef, FailurePolicy, OnExhausted, Retention};
pub use fields::{FieldError, Fields};
pub use hooks::LifecycleHooks;
pub use message::{
    AckError, BatchHandler, BoxFuture, BoxedHandler, Handler, HandlerError, Message, RawMessage,
};
pub use retention::trimmed_unread;
pub use shard_io::{dead_letter_fields, other_groups, ServerVersion, KEY_FIELD, PAYLOAD_FIELD};

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tokio::sync::{mpsc, watch};
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::Instant;

use crate::clock::LocalMillis;
use crate::coordinator::wire::{ShardId, ShardProgress};
use crate::member::lifecycle::{FencingToken, OwnershipDeadline, ShardCommand, ShardReport};

use job::{JobOutcome, JobSpec, ReadMode};
use message::ShardOwnership;
use scheduler::{JobEnd, JobId, JobKind, Millis, Output, ShardScheduler};
use shard_io::{Entry, ShardIo, MOVED_KEY_RETRY};

/// Why a consumer could not start.
#[derive(Debug, thiserror::Error)]
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
    deadline: Arc<OwnershipDeadline>,
    hooks: LifecycleHooks,
    pause: PauseHandle,
}

/// Pauses and resumes a running [`Consumer`] (Kafka's `pause` / `resume`): while paused no new read or
/// claim starts (a running job finishes its batch; the idle wait is interrupted), the member keeps
/// heartbeating and keeps its shards, and revocations are still served.
#[derive(Debug, Clone)]
pub struct PauseHandle {
    paused: Arc<watch::Sender<bool>>,
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
    /// the configuration and the server (Redis >= 6.2, for `XAUTOCLAIM`; a `maxmemory-policy` that does
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
        let io = ShardIo::connect(client, config, handler).await?;
        retention::check_eviction_policy(&mut io.conn.clone()).await?;
        let version = io.version;
        if version.major != 0 && !version.valkey && (version.major, version.minor) < (6, 2) {
            return Err(ConsumerError::Config(format!(
                "Redis {}.{}.{} is too old: taking over shards needs XAUTOCLAIM (Redis >= 6.2)",
                version.major, version.minor, version.patch
            )));
        }
        Ok(Self {
            io: Arc::new(io),
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
        Scheduler::new(self.io, self.deadline, self.hooks, self.pause, reports)
            .run(commands)
            .await;
    }
}

/// What one owned shard's jobs need and what its progress reports say. Which job runs when is the
/// [`ShardScheduler`]'s decision, not this.
struct OwnedShard {
    /// Tells this ownership from an earlier one of the same index (a job of a fenced ownership may still
    /// end and must not touch this one).
    generation: u64,
    key: Arc<str>,
    token: FencingToken,
    /// This ownership's fence in Redis, and whether it is known to be in place (see the `fence` module).
    fence: Arc<fence::Fence>,
    fence_installed: bool,
    ownership: Arc<ShardOwnership>,
    revoking: bool,
    /// Where the shard's reads are (a claim's cursor is carried from job to job).
    read_mode: ReadMode,
    running: bool,
    stop: Arc<AtomicBool>,
    in_flight: Arc<AtomicU32>,
    /// An `Assign` that arrived while revoking: a new ownership once the revoke is through.
    reassign: Option<FencingToken>,
    error_backoff: Duration,
    last_delivered: Option<String>,
    /// Where the idle wait watches the stream from: the newest entry our `>` reads got, or the group's
    /// last-delivered id; `None` until known, and after a wake-up (see the `wait` module).
    watch_from: Option<String>,
    last_acked: Option<String>,
    pending: u64,
    dirty: bool,
    /// Entries a job (or the idle wait) deferred, for the next job.
    deferred: Vec<Entry>,
    /// The shard's consumer group was missing: the next job creates it again.
    missing_group: bool,
}

struct JobMeta {
    job: JobId,
    /// `(shard, generation)`: the job's shard, or every shard of the idle wait.
    shards: Vec<(u32, u64)>,
    wait: bool,
    abort: AbortHandle,
}

/// The async shell around the pure [`ShardScheduler`]: turns commands, job ends, pause changes, the
/// deadline and time into its inputs, and executes its outputs.
struct Scheduler {
    io: Arc<ShardIo>,
    deadline: Arc<OwnershipDeadline>,
    machine: ShardScheduler,
    shards: HashMap<u32, OwnedShard>,
    meta: HashMap<tokio::task::Id, JobMeta>,
    /// The idle wait's blocking connection and its Redis client id, once made (one wait at a time).
    wait_conn: Option<(MultiplexedConnection, i64)>,
    /// The idle wait, while it runs.
    wait: Option<(JobId, tokio::task::Id)>,
    /// The Redis client id of the idle wait's connection (0: not known yet).
    wait_client: Arc<std::sync::atomic::AtomicI64>,
    /// Up to the heartbeat loop.
    reports: mpsc::UnboundedSender<ShardReport>,
    next_generation: u64,
    /// Shards waiting for a worker (the machine's count). Jobs hand their shard back early when it is not
    /// zero.
    waiting: Arc<AtomicUsize>,
    /// The deadline and the heartbeat confirmations last given to the machine.
    fed_until: LocalMillis,
    fed_confirmations: u64,
    /// The machine was told the lease is lost, and not renewed since.
    lease_lost: bool,
    /// The lifecycle hooks' task, if any hook is set.
    hook_calls: Option<mpsc::UnboundedSender<hooks::HookCall>>,
    /// Revoked shards whose hook returned, with the fence generation they were revoked in.
    hooks_done: mpsc::UnboundedReceiver<(u64, Vec<u32>)>,
    /// REVOKED reports wait for the revoked hook.
    revoke_waits_for_hook: bool,
    /// Revoked hook calls not answered yet.
    hooks_pending: usize,
    /// Shards newly owned / drained since the hooks were last called.
    newly_assigned: Vec<u32>,
    newly_revoked: Vec<u32>,
    /// Incremented by every fence: REVOKED reports of an earlier generation are dropped.
    fence_generation: u64,
    /// Keeps the pause channel open for `pause_rx`, whoever else drops their handle.
    _pause: PauseHandle,
    pause_rx: watch::Receiver<bool>,
    /// Read by jobs between batches.
    paused: Arc<AtomicBool>,
}

impl Scheduler {
    fn new(
        io: Arc<ShardIo>,
        deadline: Arc<OwnershipDeadline>,
        hooks: LifecycleHooks,
        pause: PauseHandle,
        reports: mpsc::UnboundedSender<ShardReport>,
    ) -> Self {
        let workers = io.config.runtime_max_concurrency;
        let reclaim_every = u64::try_from(io.config.reclaim_idle.as_millis()).unwrap_or(u64::MAX);
        let (done_tx, hooks_done) = mpsc::unbounded_channel();
        let revoke_waits_for_hook = hooks.has_revoked();
        let hook_calls = (!hooks.is_empty()).then(|| hooks::spawn_runner(hooks, done_tx));
        let pause_rx = pause.paused.subscribe();
        let paused = Arc::new(AtomicBool::new(false));
        Self {
            io,
            deadline,
            machine: ShardScheduler::new(workers, reclaim_every),
            shards: HashMap::new(),
            meta: HashMap::new(),
            wait_conn: None,
            wait: None,
            wait_client: Arc::new(std::sync::atomic::AtomicI64::new(0)),
            reports,
            next_generation: 0,
            waiting: Arc::new(AtomicUsize::new(0)),
            fed_until: LocalMillis::MIN,
            fed_confirmations: 0,
            lease_lost: false,
            hook_calls,
            hooks_done,
            revoke_waits_for_hook,
            hooks_pending: 0,
            newly_assigned: Vec::new(),
            newly_revoked: Vec::new(),
            fence_generation: 0,
            _pause: pause,
            pause_rx,
            paused,
        }
    }

    /// The member's monotonic clock, as the machine counts it.
    fn now(&self) -> Millis {
        Millis::from(self.deadline.local_now())
    }

    /// When a point of the machine's clock is, for the timer.
    fn instant(&self, at: Millis) -> Option<Instant> {
        Instant::from_std(self.deadline.origin()).checked_add(Duration::from_millis(at.0))
    }

    /// Tells the machine what the heartbeat loop did to the deadline since it was last looked at.
    fn sync_lease(&mut self, jobs: &mut JoinSet<JobOutcome>) {
        let until = self.deadline.until();
        let confirmations = self.deadline.confirmations();
        if until > self.fed_until || confirmations > self.fed_confirmations {
            self.fed_until = until;
            self.fed_confirmations = confirmations;
            self.lease_lost = false;
            let out = self.machine.lease_renewed(self.now(), Millis::from(until));
            self.execute(out, jobs);
        }
        // Withdrawn (or lowered) before the machine's own deadline.
        self.fed_until = until;
        let now = self.now();
        if !self.lease_lost && Millis::from(until) <= now {
            self.lease_lost = true;
            let out = self.machine.lease_lost(now);
            self.execute(out, jobs);
        }
    }

    /// Executes the machine's outputs, in order.
    fn execute(&mut self, out: Vec<Output>, jobs: &mut JoinSet<JobOutcome>) {
        let mut queue: VecDeque<Output> = out.into();
        while let Some(output) = queue.pop_front() {
            match output {
                Output::Start {
                    job, shard, kind, ..
                } => {
                    if !self.start_job(job, shard, kind, jobs) {
                        // Not reachable: the machine starts owned shards only. Keep it consistent.
                        let now = self.now();
                        queue.extend(self.machine.job_ended(now, job, JobEnd::Aborted));
                    }
                }
                Output::StartWait { job, shards } => self.start_wait(job, shards, jobs),
                Output::InterruptWait { job } => self.interrupt_wait(job),
                Output::Revoked { shard } => self.finish_revoke(shard),
                Output::AbortAll => {
                    for meta in self.meta.values() {
                        meta.abort.abort();
                    }
                }
                Output::Stopped => {}
            }
        }
        self.waiting
            .store(self.machine.waiting(), Ordering::Release);
    }

    /// Hands the shards assigned and drained since the last call to the hooks' task (revoked first, as
    /// Kafka's rebalance listener does).
    fn flush_hooks(&mut self) {
        let Some(calls) = &self.hook_calls else {
            self.newly_assigned.clear();
            return;
        };
        if !self.newly_revoked.is_empty() {
            let shards = std::mem::take(&mut self.newly_revoked);
            if calls
                .send(hooks::HookCall::Revoked(
                    self.fence_generation,
                    shards.clone(),
                ))
                .is_ok()
            {
                self.hooks_pending += 1;
            } else {
                for shard in shards {
                    self.report(ShardReport::Revoked { shard });
                }
            }
        }
        if !self.newly_assigned.is_empty() {
            let shards = std::mem::take(&mut self.newly_assigned);
            let _ = calls.send(hooks::HookCall::Assigned(shards));
        }
    }

    fn on_pause_change(&mut self, jobs: &mut JoinSet<JobOutcome>) {
        let paused = *self.pause_rx.borrow_and_update();
        if paused == self.paused.swap(paused, Ordering::AcqRel) {
            return;
        }
        let now = self.now();
        let out = if paused {
            tracing::info!("listener paused");
            self.machine.pause(now)
        } else {
            tracing::info!("listener resumed");
            self.machine.resume(now)
        };
        self.execute(out, jobs);
    }

    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<ShardCommand>) {
        // Aborts every job when `run` is dropped.
        let mut jobs: JoinSet<JobOutcome> = JoinSet::new();
        let mut progress = tokio::time::interval(self.io.config.progress_interval);
        progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut closing = false;
        self.sync_lease(&mut jobs);
        self.on_pause_change(&mut jobs);
        loop {
            self.flush_hooks();
            if closing && jobs.is_empty() && self.hooks_pending == 0 {
                break;
            }
            // Backoffs end, the deadline lapses; a lapsed lease or an unconfirmed shard is looked at
            // again shortly (the heartbeat loop moves the deadline without a word).
            let mut wake = self.machine.next_wake().and_then(|at| self.instant(at));
            if self.machine.awaits_renewal() {
                let soon = Instant::now() + MOVED_KEY_RETRY;
                wake = Some(wake.map_or(soon, |at| at.min(soon)));
            }
            tokio::select! {
                biased;
                command = commands.recv(), if !closing => {
                    self.sync_lease(&mut jobs);
                    match command {
                        Some(command) => {
                            self.on_command(command, &mut jobs);
                            // Take what else is queued, so that hooks see one batch per rebalance.
                            for _ in 0..1024 {
                                match commands.try_recv() {
                                    Ok(command) => self.on_command(command, &mut jobs),
                                    Err(_) => break,
                                }
                            }
                        }
                        None => {
                            closing = true;
                            for shard in self.shards.values() {
                                shard.stop.store(true, Ordering::Release);
                            }
                            let out = self.machine.shutdown(self.now());
                            self.execute(out, &mut jobs);
                        }
                    }
                },
                Some(joined) = jobs.join_next_with_id(), if !jobs.is_empty() => {
                    self.sync_lease(&mut jobs);
                    match joined {
                        Ok((id, outcome)) => self.on_job_end(id, Some(outcome), &mut jobs),
                        Err(error) => {
                            if error.is_panic() {
                                tracing::error!(%error, "consumer job panicked");
                            }
                            self.on_job_end(error.id(), None, &mut jobs);
                        }
                    }
                }
                Some((generation, shards)) = self.hooks_done.recv(), if self.hooks_pending > 0 => {
                    self.hooks_pending -= 1;
                    if generation == self.fence_generation {
                        for shard in shards {
                            self.report(ShardReport::Revoked { shard });
                        }
                    }
                }
                Ok(()) = self.pause_rx.changed() => self.on_pause_change(&mut jobs),
                _ = tokio::time::sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {
                    self.sync_lease(&mut jobs);
                    let out = self.machine.tick(self.now());
                    self.execute(out, &mut jobs);
                }
                _ = progress.tick() => self.report_progress(),
            }
        }
    }

    /// Hands `report` up at once. A heartbeat loop that is gone has no use for it.
    fn report(&self, report: ShardReport) {
        let _ = self.reports.send(report);
    }

    fn on_command(&mut self, command: ShardCommand, jobs: &mut JoinSet<JobOutcome>) {
        match command {
            ShardCommand::Assign { shard, token } => self.assign(shard, token, jobs),
            ShardCommand::Revoke { shard } => self.revoke(shard, jobs),
            ShardCommand::Fence => self.fence(jobs),
        }
    }

    fn new_shard(&mut self, shard: u32, token: FencingToken) {
        self.next_generation += 1;
        let key: Arc<str> = self.io.config.shard_key(shard).into();
        let epoch = token.member_epoch;
        let fence = Arc::new(fence::Fence::new(&key, &self.io.config.group, epoch));
        self.shards.insert(
            shard,
            OwnedShard {
                generation: self.next_generation,
                key,
                token,
                fence,
                fence_installed: false,
                ownership: ShardOwnership::new(self.deadline.clone(), epoch),
                revoking: false,
                read_mode: ReadMode::claim_own(),
                running: false,
                stop: Arc::new(AtomicBool::new(false)),
                in_flight: Arc::new(AtomicU32::new(0)),
                reassign: None,
                error_backoff: Duration::ZERO,
                last_delivered: None,
                watch_from: None,
                last_acked: None,
                pending: 0,
                dirty: true,
                deferred: Vec::new(),
                missing_group: false,
            },
        );
        self.newly_assigned.push(shard);
        tracing::debug!(shard, "shard assigned");
    }

    fn assign(&mut self, shard: u32, token: FencingToken, jobs: &mut JoinSet<JobOutcome>) {
        let epoch = token.member_epoch;
        match self.shards.get_mut(&shard) {
            Some(state) if state.revoking => state.reassign = Some(token),
            Some(state) => {
                if state.token.member_epoch != epoch {
                    // A newer grant of a shard we hold: its fence replaces ours.
                    let group = &self.io.config.group;
                    state.fence = Arc::new(fence::Fence::new(&state.key, group, epoch));
                    state.fence_installed = false;
                }
                state.token = token;
            }
            None => self.new_shard(shard, token),
        }
        let now = self.now();
        let until = Millis::from(self.fed_until);
        let out = self.machine.assign(now, shard, epoch, until);
        self.execute(out, jobs);
    }

    fn revoke(&mut self, shard: u32, jobs: &mut JoinSet<JobOutcome>) {
        let in_flight = match self.shards.get_mut(&shard) {
            Some(state) if state.revoking => {
                state.reassign = None;
                None
            }
            Some(state) => {
                state.revoking = true;
                state.stop.store(true, Ordering::Release);
                Some(if state.running {
                    state.in_flight.load(Ordering::Acquire)
                } else {
                    0
                })
            }
            // Nothing here to drain: say so, so the hand-off is not held up.
            None => Some(0),
        };
        if let Some(in_flight) = in_flight {
            self.report(ShardReport::Draining { shard, in_flight });
            tracing::debug!(shard, in_flight, "shard revoking");
        }
        let out = self.machine.revoke(self.now(), shard);
        self.execute(out, jobs);
    }

    /// The machine reports `shard` REVOKED: its job (if any) has ended.
    fn finish_revoke(&mut self, shard: u32) {
        if !self.shards.get(&shard).is_some_and(|s| s.revoking) {
            // Not ours (or owned again already): nothing to hand over but the report.
            self.report(ShardReport::Revoked { shard });
            return;
        }
        let Some(state) = self.shards.remove(&shard) else {
            return;
        };
        state.ownership.end();
        self.io.probe.forget_shard(shard);
        if self.revoke_waits_for_hook {
            self.newly_revoked.push(shard);
        } else {
            self.report(ShardReport::Revoked { shard });
        }
        tracing::debug!(shard, "shard revoked");
        if let Some(token) = state.reassign {
            // The machine serves the assignment next (its `Start` follows this report).
            self.new_shard(shard, token);
        }
    }

    fn fence(&mut self, jobs: &mut JoinSet<JobOutcome>) {
        tracing::warn!(shards = self.shards.len(), "fenced: aborting every handler");
        // Hooks see events in order: what was assigned or drained before the fence first.
        self.flush_hooks();
        self.fence_generation += 1;
        if let Some(calls) = &self.hook_calls {
            let mut lost: Vec<u32> = self.shards.keys().copied().collect();
            lost.sort_unstable();
            let _ = calls.send(hooks::HookCall::Fenced(lost));
        }
        self.io.probe.aborting();
        for state in self.shards.values() {
            state.ownership.end();
            state.stop.store(true, Ordering::Release);
        }
        self.shards.clear();
        let out = self.machine.fence(self.now());
        self.execute(out, jobs);
    }

    /// Starts the machine's job `job` of `shard`; false if the shard is not known here.
    fn start_job(
        &mut self,
        job: JobId,
        shard: u32,
        kind: JobKind,
        jobs: &mut JoinSet<JobOutcome>,
    ) -> bool {
        let Some(state) = self.shards.get_mut(&shard) else {
            return false;
        };
        let read_mode = match (kind, &state.read_mode) {
            (JobKind::ClaimOwn, ReadMode::Live) => ReadMode::claim_own(),
            (_, read_mode) => read_mode.clone(),
        };
        state.running = true;
        let spec = JobSpec {
            shard,
            key: state.key.clone(),
            token: state.token.clone(),
            fence: state.fence.clone(),
            install_fence: !state.fence_installed,
            ownership: state.ownership.clone(),
            read_mode,
            stop: state.stop.clone(),
            in_flight: state.in_flight.clone(),
            waiting: self.waiting.clone(),
            paused: self.paused.clone(),
            // Handled first whatever the job's kind (a claim would deliver them again anyway).
            deferred: std::mem::take(&mut state.deferred),
            reclaim: kind == JobKind::ReclaimZombies,
            recreate_group: std::mem::take(&mut state.missing_group),
        };
        let generation = state.generation;
        let abort = jobs.spawn(tracing::Instrument::in_current_span(job::run(
            self.io.clone(),
            spec,
        )));
        self.meta.insert(
            abort.id(),
            JobMeta {
                job,
                shards: vec![(shard, generation)],
                wait: false,
                abort,
            },
        );
        true
    }

    /// Starts the idle wait over `shards` (see the `wait` module).
    fn start_wait(&mut self, job: JobId, shards: Vec<u32>, jobs: &mut JoinSet<JobOutcome>) {
        let mut keys = Vec::with_capacity(shards.len());
        let mut members = Vec::with_capacity(shards.len());
        let mut watch_from = HashMap::new();
        for shard in shards {
            if let Some(state) = self.shards.get_mut(&shard) {
                state.running = true;
                keys.push((shard, state.key.clone()));
                members.push((shard, state.generation));
                if let Some(id) = &state.watch_from {
                    watch_from.insert(shard, id.clone());
                }
            }
        }
        let conn = self.wait_conn.take();
        self.wait_client
            .store(conn.as_ref().map_or(0, |(_, id)| *id), Ordering::Release);
        let spec = wait::WaitSpec {
            shards: keys,
            watch_from,
            conn,
            client: self.wait_client.clone(),
            deadline: self.deadline.clone(),
        };
        let abort = jobs.spawn(tracing::Instrument::in_current_span(wait::run(
            self.io.clone(),
            spec,
        )));
        self.wait = Some((job, abort.id()));
        self.meta.insert(
            abort.id(),
            JobMeta {
                job,
                shards: members,
                wait: true,
                abort,
            },
        );
    }

    /// Ends the idle wait early. Aborting the task would not end the read in Redis, which would hold
    /// the wait's connection until its timeout; `CLIENT UNBLOCK` ends it there, and the wait returns
    /// normally with the shards it saw new entries on.
    fn interrupt_wait(&mut self, job: JobId) {
        let Some(meta) = self
            .wait
            .filter(|(wait, _)| *wait == job)
            .and_then(|(_, id)| self.meta.get(&id))
        else {
            return;
        };
        if self.io.client.is_cluster() {
            self.io.cluster_wait.interrupt(&self.wait_client);
            return;
        }
        let client = self.wait_client.load(Ordering::Acquire);
        if client <= 0 {
            // Not connected yet, so not blocking yet.
            meta.abort.abort();
            return;
        }
        let mut conn = self.io.conn.clone();
        tokio::spawn(tracing::Instrument::in_current_span(async move {
            let unblocked: redis::RedisResult<i64> = redis::cmd("CLIENT")
                .arg("UNBLOCK")
                .arg(client)
                .query_async(&mut conn)
                .await;
            if let Err(error) = unblocked {
                tracing::debug!(%error, "could not interrupt the idle wait; it ends at its timeout");
            }
        }));
    }

    fn on_wait_end(
        &mut self,
        meta: JobMeta,
        outcome: Option<JobOutcome>,
        jobs: &mut JoinSet<JobOutcome>,
    ) {
        if self.wait.is_some_and(|(job, _)| job == meta.job) {
            self.wait = None;
        }
        for (shard, generation) in &meta.shards {
            if let Some(state) = self
                .shards
                .get_mut(shard)
                .filter(|s| s.generation == *generation)
            {
                state.running = false;
            }
        }
        let now = self.now();
        let Some(mut outcome) = outcome else {
            let out = self.machine.job_ended(now, meta.job, JobEnd::Aborted);
            self.execute(out, jobs);
            return;
        };
        if let Some(conn) = outcome.conn.take() {
            self.wait_conn = Some(conn);
        }
        if let Some(error) = &outcome.error {
            tracing::warn!(%error, "idle wait failed; polling the shards one by one");
        }
        // Which shard is at fault is found by the shards' own reads: poll them one by one.
        let failed = outcome.error.is_some() || outcome.expired || outcome.missing_group;
        for (shard, id) in outcome.watch_from.drain(..) {
            if let Some(state) = self.waited_shard(&meta, shard) {
                state.watch_from = Some(id);
            }
        }
        let mut woke = Vec::new();
        for shard in outcome.new_entries.drain(..) {
            if let Some(state) = self.waited_shard(&meta, shard) {
                // Watched from the group's position again unless the next read gets the new entries
                // (another consumer may have taken them).
                state.watch_from = None;
                woke.push(shard);
            }
        }
        let out = self.machine.wait_ended(now, meta.job, &woke, failed);
        self.execute(out, jobs);
    }

    /// The state of `shard` if it is still the ownership the idle wait `meta` waited on.
    fn waited_shard(&mut self, meta: &JobMeta, shard: u32) -> Option<&mut OwnedShard> {
        let generation = meta
            .shards
            .iter()
            .find(|(s, _)| *s == shard)
            .map(|(_, g)| *g)?;
        self.shards
            .get_mut(&shard)
            .filter(|s| s.generation == generation)
    }

    fn on_job_end(
        &mut self,
        id: tokio::task::Id,
        outcome: Option<JobOutcome>,
        jobs: &mut JoinSet<JobOutcome>,
    ) {
        let Some(meta) = self.meta.remove(&id) else {
            return;
        };
        if meta.wait {
            self.on_wait_end(meta, outcome, jobs);
            return;
        }
        let now = self.now();
        let end = match meta.shards.first() {
            Some(&(shard, generation)) => self.shard_job_ended(now, shard, generation, outcome),
            None => JobEnd::Aborted,
        };
        let out = self.machine.job_ended(now, meta.job, end);
        self.execute(out, jobs);
    }

    /// Takes what a shard's job found into the shard's state, and says how it ended.
    fn shard_job_ended(
        &mut self,
        now: Millis,
        shard: u32,
        generation: u64,
        outcome: Option<JobOutcome>,
    ) -> JobEnd {
        let Some(state) = self
            .shards
            .get_mut(&shard)
            .filter(|s| s.generation == generation)
        else {
            // A job of a fenced ownership: what it did is not this ownership's.
            return JobEnd::Aborted;
        };
        state.running = false;
        // A job that was aborted or crashed: re-deliver what it left pending before reading on.
        let mut outcome = outcome.unwrap_or_default();
        if outcome.fence_installed {
            state.fence_installed = true;
        }
        if outcome.fence_lost {
            // Installing it again tells a newer owner (refused again) from a loss (installed again).
            state.fence_installed = false;
        }
        if outcome.fetched > 0 {
            state.last_delivered = outcome
                .last_delivered
                .take()
                .or(state.last_delivered.take());
            state.dirty = true;
        }
        if let Some(acked) = outcome.last_acked.take() {
            state.last_acked = Some(acked);
            state.dirty = true;
        }
        if let Some(id) = outcome.read_up_to.take() {
            state.watch_from = Some(id);
        }
        if outcome.missing_group {
            // The group comes back at a position of its own: watch from there.
            state.watch_from = None;
        }
        state.deferred = std::mem::take(&mut outcome.deferred);
        state.pending = (outcome.left_pending + state.deferred.len()) as u64;
        if state.revoking {
            return JobEnd::Aborted;
        }
        let aborted = outcome.next_read_mode.is_none();
        state.read_mode = outcome
            .next_read_mode
            .take()
            .unwrap_or_else(ReadMode::claim_own);
        self.io.probe.read_result(shard, outcome.error.is_some());
        let later = |delay: Duration| {
            Millis(
                now.0
                    .saturating_add(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX)),
            )
        };
        if let Some(error) = &outcome.error {
            state.error_backoff =
                (state.error_backoff * 2).clamp(Duration::from_millis(50), Duration::from_secs(5));
            tracing::warn!(shard, %error, backoff = ?state.error_backoff, "shard read failed; backing off");
            let retry_at = later(state.error_backoff);
            return match state.read_mode {
                ReadMode::Claim { .. } => JobEnd::Failed { retry_at },
                ReadMode::Live => JobEnd::ReadFailed { retry_at },
            };
        }
        state.error_backoff = Duration::ZERO;
        if outcome.expired {
            // Past the self-fencing deadline: a fence is on its way, or the lease comes back.
            return JobEnd::Expired;
        }
        if outcome.missing_group {
            // Not before a heartbeat sent after the loss confirmed that the shard is still ours.
            state.missing_group = true;
            return JobEnd::MissingGroup {
                retry_at: later(MOVED_KEY_RETRY),
            };
        }
        if let Some(delay) = outcome.defer_for {
            // A moved key waits for its old shard (or a failed entry for its backoff): try again later,
            // starting with the deferred entries.
            return JobEnd::Deferred {
                retry_at: later(delay),
            };
        }
        if aborted {
            return JobEnd::Aborted;
        }
        match (&state.read_mode, outcome.fetched) {
            (ReadMode::Claim { .. }, _) => JobEnd::Claiming,
            (ReadMode::Live, 0) => JobEnd::Empty,
            (ReadMode::Live, _) => JobEnd::Data,
        }
    }

    fn report_progress(&mut self) {
        let now = crate::util::rfc3339_now();
        let mut dirty: Vec<u32> = self
            .shards
            .iter()
            .filter(|(_, s)| s.dirty && !s.revoking)
            .map(|(i, _)| *i)
            .collect();
        dirty.sort_unstable();
        for index in dirty {
            let Some(state) = self.shards.get_mut(&index) else {
                continue;
            };
            state.dirty = false;
            let in_flight = if state.running {
                u64::from(state.in_flight.load(Ordering::Acquire))
            } else {
                0
            };
            // Not `self.report`: `state` still borrows `self.shards`.
            let _ = self.reports.send(ShardReport::Progress(ShardProgress {
                shard: ShardId::new(index),
                stream_key: state.key.to_string(),
                last_delivered_id: state.last_delivered.clone(),
                last_acked_id: state.last_acked.clone(),
                pending_count: state.pending + in_flight,
                updated_at: Some(now.clone()),
            }));
        }
    }
}
