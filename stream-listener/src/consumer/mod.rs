//! The consumption layer of one logical member: the polling adapter and its workers.
//!
//! A [`Consumer`] is driven by the member's heartbeat loop through [`ShardCommand`]s and answers with
//! [`ShardReport`]s (see [`crate::member::lifecycle`]). It owns everything the spec puts on the member side:
//! worker lifecycle, Redis reads, handler execution, the ack / dead-letter policy and progress reports.
//!
//! # Scheduling
//!
//! Owned shards wait in one round-robin ready queue. Up to `runtime_max_concurrency` jobs run at once; a
//! job takes one shard, fetches one batch, runs the handler on each entry in order, acknowledges, and puts
//! the shard back at the end of the queue. So:
//!
//! * a shard is in at most one job at a time: one read loop per shard, one batch in flight, per-key order;
//! * a member with far more shards than workers still visits every shard once per rotation: no starvation;
//! * reads do not block while any shard may have data. Only after a whole rotation came back empty does
//!   the member wait, with one blocking read over all its idle shards (the `wait` module), and the
//!   rotation starts over afterwards, so an entry written to an idle shard is picked up within the wait
//!   and an idle member costs a couple of commands a second, however many shards it owns.
//!
//! The same rules, as a pure state machine with rule-named and property tests, are in the [`scheduler`]
//! module; the loop below does not drive it yet.
//!
//! # Connections
//!
//! One multiplexed connection (a redis-rs `ConnectionManager`, reconnecting by itself) carries every
//! non-blocking command: reads without `BLOCK`, claims, acks, dead letters, scripts. The idle wait has a
//! second connection of its own, used only for `XREADGROUP BLOCK` (redis-rs would queue every other
//! command behind a blocking read on a shared connection). A member therefore opens two connections,
//! however many shards it owns and workers it has.
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
mod fields;
mod hooks;
mod job;
mod message;
mod ops;
pub mod scheduler;
mod wait;

pub use config::{AckPolicy, ConsumerConfig, DeleteRef, FailurePolicy, OnExhausted};
pub use fields::{FieldError, Fields};
pub use hooks::LifecycleHooks;
pub use message::{
    AckError, BatchHandler, BoxFuture, BoxedHandler, Handler, HandlerError, Message, RawMessage,
};
pub use ops::{dead_letter_fields, other_groups, ServerVersion, KEY_FIELD, PAYLOAD_FIELD};

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tokio::sync::{mpsc, watch};
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::Instant;

use crate::coordinator::wire::{ShardId, ShardProgress};
use crate::member::lifecycle::{FencingToken, OwnershipDeadline, ShardCommand, ShardReport};

use job::{JobOutcome, JobSpec, Phase};
use message::Lease;
use ops::{Entry, Shared, HOLD_RETRY};

/// Why a consumer could not start.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    /// Connecting to Redis or reading its version failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The configuration cannot work.
    #[error("invalid consumer configuration: {0}")]
    Config(String),
}

/// The polling adapter of one logical member: reads its owned shards, runs the handler, acknowledges.
///
/// Create it with [`Consumer::connect`], then drive it with [`Consumer::run`].
#[derive(Clone)]
pub struct Consumer {
    shared: Arc<Shared>,
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
    fn new() -> Self {
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
            .field("config", &self.shared.config)
            .field("server", &self.shared.version)
            .finish()
    }
}

impl Consumer {
    /// Open the shared connection, detect the server version (to pick `XACKDEL` or the script) and check
    /// the configuration and the server (Redis >= 6.2, for `XAUTOCLAIM`). No shard is read until the
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
        let shared = Shared::connect(client.into(), config, handler).await?;
        let version = shared.version;
        if version.major != 0 && !version.valkey && (version.major, version.minor) < (6, 2) {
            return Err(ConsumerError::Config(format!(
                "Redis {}.{}.{} is too old: taking over shards needs XAUTOCLAIM (Redis >= 6.2)",
                version.major, version.minor, version.patch
            )));
        }
        Ok(Self {
            shared: Arc::new(shared),
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
        &self.shared.config
    }

    /// What the consumer is doing now: running handlers, failing reads (see [`crate::health`]).
    pub fn probe(&self) -> crate::health::Probe {
        self.shared.probe.clone()
    }

    /// The Redis server version detected at connect time.
    pub fn server_version(&self) -> ServerVersion {
        self.shared.version
    }

    /// Whether acknowledge-and-delete uses `XACKDEL` (true) or the `XACK` + `XDEL` script (false).
    pub fn uses_xackdel(&self) -> bool {
        self.shared.version.has_xackdel()
    }

    /// Serve commands until `commands` is closed, then stop reading, let running handlers finish and
    /// acknowledge, and return. Dropping or aborting the returned future aborts every handler at once
    /// (entries in flight stay pending; the next owner claims them).
    pub async fn run(
        self,
        commands: mpsc::Receiver<ShardCommand>,
        reports: mpsc::Sender<ShardReport>,
    ) {
        Scheduler::new(self.shared, self.deadline, self.hooks, self.pause)
            .run(commands, reports)
            .await;
    }
}

/// Ownership state of one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Owned,
    Revoking,
}

struct ShardState {
    generation: u64,
    key: Arc<str>,
    token: FencingToken,
    lease: Arc<Lease>,
    mode: Mode,
    /// `None` while a job has it.
    phase: Option<Phase>,
    running: bool,
    stop: Arc<AtomicBool>,
    in_flight: Arc<AtomicU32>,
    /// Waiting for a job of an earlier (fenced) ownership of this shard index to end.
    waiting_for_old_job: bool,
    /// An `Assign` that arrived while revoking: start over once the revoke is through.
    reassign: Option<FencingToken>,
    error_backoff: Duration,
    last_delivered: Option<String>,
    last_acked: Option<String>,
    pending: u64,
    dirty: bool,
    /// Entries a job held back (a moved key waiting for its old shard after a resize), for the next job.
    held: Vec<Entry>,
    /// When entries left pending by other consumers were last looked for.
    reclaimed_at: Instant,
    /// The shard's consumer group was missing (the store lost it): the number of accepted heartbeats at
    /// that moment. The shard is not touched again until a later heartbeat confirmed the ownership.
    missing_group: Option<u64>,
}

struct JobMeta {
    shard: u32,
    generation: u64,
    slot: usize,
    /// The idle wait's shards and their generations (empty for a shard's job).
    wait: Vec<(u32, u64)>,
    abort: AbortHandle,
}

struct Scheduler {
    shared: Arc<Shared>,
    deadline: Arc<OwnershipDeadline>,
    shards: HashMap<u32, ShardState>,
    ready: VecDeque<u32>,
    delayed: Vec<(Instant, u32, u64)>,
    meta: HashMap<tokio::task::Id, JobMeta>,
    /// Jobs still running per shard index, any generation: a new ownership waits for them.
    busy: HashMap<u32, usize>,
    /// The idle wait's blocking connection and its Redis client id, once made (one wait at a time).
    wait_conn: Option<(MultiplexedConnection, i64)>,
    free_slots: Vec<usize>,
    /// Consecutive reads that found nothing: a full rotation of them starts the idle wait.
    idle_streak: usize,
    /// Shards that came back empty while the idle wait ran, for the next one (see `on_job_end`).
    parked: Vec<u32>,
    /// The running idle wait was asked to end.
    wait_interrupted: bool,
    /// The idle wait, while it runs.
    wait: Option<tokio::task::Id>,
    /// The Redis client id of the idle wait's connection (0: not known yet).
    wait_client: Arc<std::sync::atomic::AtomicI64>,
    outbox: VecDeque<ShardReport>,
    next_generation: u64,
    /// `ready.len()` after dispatching: shards waiting for a worker. Jobs hand their shard back early
    /// when it is not zero.
    waiting: Arc<AtomicUsize>,
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

const OUTBOX_PROGRESS_LIMIT: usize = 4096;

impl Scheduler {
    fn new(
        shared: Arc<Shared>,
        deadline: Arc<OwnershipDeadline>,
        hooks: LifecycleHooks,
        pause: PauseHandle,
    ) -> Self {
        let workers = shared.config.runtime_max_concurrency;
        let (done_tx, hooks_done) = mpsc::unbounded_channel();
        let revoke_waits_for_hook = hooks.has_revoked();
        let hook_calls = (!hooks.is_empty()).then(|| hooks::spawn_runner(hooks, done_tx));
        let pause_rx = pause.paused.subscribe();
        let paused = Arc::new(AtomicBool::new(*pause_rx.borrow()));
        Self {
            shared,
            deadline,
            shards: HashMap::new(),
            ready: VecDeque::new(),
            delayed: Vec::new(),
            meta: HashMap::new(),
            busy: HashMap::new(),
            wait_conn: None,
            free_slots: (0..workers).rev().collect(),
            idle_streak: 0,
            parked: Vec::new(),
            wait_interrupted: false,
            wait: None,
            wait_client: Arc::new(std::sync::atomic::AtomicI64::new(0)),
            outbox: VecDeque::new(),
            next_generation: 0,
            waiting: Arc::new(AtomicUsize::new(0)),
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
                    self.outbox.push_back(ShardReport::Revoked { shard });
                }
            }
        }
        if !self.newly_assigned.is_empty() {
            let shards = std::mem::take(&mut self.newly_assigned);
            let _ = calls.send(hooks::HookCall::Assigned(shards));
        }
    }

    fn on_pause_change(&mut self) {
        let paused = *self.pause_rx.borrow_and_update();
        if paused == self.paused.swap(paused, Ordering::AcqRel) {
            return;
        }
        if paused {
            tracing::info!("listener paused");
            self.interrupt_wait();
        } else {
            tracing::info!("listener resumed");
            // Entries arrived meanwhile: poll the rotation before waiting.
            self.idle_streak = 0;
        }
    }

    async fn run(
        mut self,
        mut commands: mpsc::Receiver<ShardCommand>,
        reports: mpsc::Sender<ShardReport>,
    ) {
        // Aborts every job when `run` is dropped.
        let mut jobs: JoinSet<JobOutcome> = JoinSet::new();
        let mut progress = tokio::time::interval(self.shared.config.progress_interval);
        progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut closing = false;
        loop {
            if !closing {
                self.dispatch(&mut jobs);
            }
            self.flush_hooks();
            if closing && jobs.is_empty() && self.hooks_pending == 0 {
                break;
            }
            let next_delay = self.delayed.iter().map(|(at, _, _)| *at).min();
            tokio::select! {
                biased;
                command = commands.recv(), if !closing => match command {
                    Some(command) => {
                        self.on_command(command);
                        // Take what else is queued, so that hooks see one batch per rebalance.
                        for _ in 0..1024 {
                            match commands.try_recv() {
                                Ok(command) => self.on_command(command),
                                Err(_) => break,
                            }
                        }
                    }
                    None => {
                        closing = true;
                        self.interrupt_wait();
                        for shard in self.shards.values() {
                            shard.stop.store(true, Ordering::Release);
                        }
                    }
                },
                Some(joined) = jobs.join_next_with_id(), if !jobs.is_empty() => {
                    match joined {
                        Ok((id, outcome)) => self.on_job_end(id, Some(outcome)),
                        Err(error) => {
                            if error.is_panic() {
                                tracing::error!(%error, "consumer job panicked");
                            }
                            self.on_job_end(error.id(), None);
                        }
                    }
                }
                Some((generation, shards)) = self.hooks_done.recv(), if self.hooks_pending > 0 => {
                    self.hooks_pending -= 1;
                    if generation == self.fence_generation {
                        for shard in shards {
                            self.outbox.push_back(ShardReport::Revoked { shard });
                        }
                    }
                }
                Ok(()) = self.pause_rx.changed() => self.on_pause_change(),
                permit = reports.reserve(), if !self.outbox.is_empty() => match permit {
                    Ok(permit) => {
                        if let Some(report) = self.outbox.pop_front() {
                            permit.send(report);
                        }
                    }
                    Err(_) => self.outbox.clear(),
                },
                _ = tokio::time::sleep_until(next_delay.unwrap_or_else(Instant::now)), if next_delay.is_some() => {
                    self.release_delayed();
                }
                _ = progress.tick() => self.queue_progress(),
            }
        }
        // Best effort: hand over what is queued if the receiver is still there.
        while let Some(report) = self.outbox.pop_front() {
            if reports.try_send(report).is_err() {
                break;
            }
        }
    }

    fn on_command(&mut self, command: ShardCommand) {
        match command {
            ShardCommand::Assign { shard, token } => self.assign(shard, token),
            ShardCommand::Revoke { shard } => self.revoke(shard),
            ShardCommand::Fence => self.fence(),
        }
    }

    fn assign(&mut self, shard: u32, token: FencingToken) {
        // The new shard joins the rotation now, and the next wait.
        self.interrupt_wait();
        if let Some(state) = self.shards.get_mut(&shard) {
            match state.mode {
                Mode::Owned => state.token = token,
                Mode::Revoking => state.reassign = Some(token),
            }
            return;
        }
        self.next_generation += 1;
        let waiting = self.busy.get(&shard).copied().unwrap_or(0) > 0;
        self.shards.insert(
            shard,
            ShardState {
                generation: self.next_generation,
                key: self.shared.config.shard_key(shard).into(),
                token,
                lease: Lease::new(self.deadline.clone()),
                mode: Mode::Owned,
                phase: Some(Phase::Claim {
                    cursor: crate::names::START_ID.to_owned(),
                }),
                running: false,
                stop: Arc::new(AtomicBool::new(false)),
                in_flight: Arc::new(AtomicU32::new(0)),
                waiting_for_old_job: waiting,
                reassign: None,
                error_backoff: Duration::ZERO,
                last_delivered: None,
                last_acked: None,
                pending: 0,
                dirty: true,
                held: Vec::new(),
                reclaimed_at: Instant::now(),
                missing_group: None,
            },
        );
        if !waiting {
            self.ready.push_back(shard);
        }
        self.newly_assigned.push(shard);
        tracing::debug!(shard, "shard assigned");
    }

    fn revoke(&mut self, shard: u32) {
        let Some(state) = self.shards.get_mut(&shard) else {
            // Nothing here to drain: say so, so the hand-off is not held up.
            self.outbox.push_back(ShardReport::Draining {
                shard,
                in_flight: 0,
            });
            self.outbox.push_back(ShardReport::Revoked { shard });
            return;
        };
        if state.mode == Mode::Revoking {
            state.reassign = None;
            return;
        }
        state.mode = Mode::Revoking;
        state.stop.store(true, Ordering::Release);
        if state.running {
            // If the idle wait holds it, the revocation need not wait for the wait's timeout.
            self.interrupt_wait();
        }
        let Some(state) = self.shards.get_mut(&shard) else {
            return;
        };
        self.ready.retain(|s| *s != shard);
        self.delayed.retain(|(_, s, _)| *s != shard);
        self.parked.retain(|s| *s != shard);
        let in_flight = if state.running {
            state.in_flight.load(Ordering::Acquire)
        } else {
            0
        };
        self.outbox
            .push_back(ShardReport::Draining { shard, in_flight });
        tracing::debug!(shard, in_flight, "shard revoking");
        if !state.running {
            self.finish_revoke(shard);
        }
    }

    fn finish_revoke(&mut self, shard: u32) {
        let Some(state) = self.shards.remove(&shard) else {
            return;
        };
        state.lease.end();
        self.shared.probe.forget_shard(shard);
        self.outbox
            .retain(|r| !matches!(r, ShardReport::Progress(p) if p.shard.shard_index == shard));
        if self.revoke_waits_for_hook {
            self.newly_revoked.push(shard);
        } else {
            self.outbox.push_back(ShardReport::Revoked { shard });
        }
        tracing::debug!(shard, "shard revoked");
        if let Some(token) = state.reassign {
            self.assign(shard, token);
        }
    }

    fn fence(&mut self) {
        tracing::warn!(shards = self.shards.len(), "fenced: aborting every handler");
        // Hooks see events in order: what was assigned or drained before the fence first.
        self.flush_hooks();
        self.fence_generation += 1;
        if let Some(calls) = &self.hook_calls {
            let mut lost: Vec<u32> = self.shards.keys().copied().collect();
            lost.sort_unstable();
            let _ = calls.send(hooks::HookCall::Fenced(lost));
        }
        self.shared.probe.aborting();
        for state in self.shards.values() {
            state.lease.end();
            state.stop.store(true, Ordering::Release);
        }
        self.shards.clear();
        self.ready.clear();
        self.delayed.clear();
        self.outbox.clear();
        for meta in self.meta.values() {
            meta.abort.abort();
        }
        self.idle_streak = 0;
    }

    fn owned_live(&self) -> usize {
        self.shards
            .values()
            .filter(|s| s.mode == Mode::Owned)
            .count()
    }

    /// Start jobs while there are free workers and ready shards.
    fn dispatch(&mut self, jobs: &mut JoinSet<JobOutcome>) {
        if !self.paused.load(Ordering::Acquire) {
            self.dispatch_ready(jobs);
        }
        self.waiting.store(self.ready.len(), Ordering::Release);
    }

    /// Ends the idle wait early. Aborting the task would not end the read in Redis, which could then
    /// still hand entries to it after a revocation was reported; `CLIENT UNBLOCK` ends it there, and the
    /// wait returns normally with whatever it read (pending under this member, reported before REVOKED).
    fn interrupt_wait(&mut self) {
        let Some(meta) = self.wait.and_then(|id| self.meta.get(&id)) else {
            return;
        };
        if self.shared.client.is_cluster() {
            self.shared.cluster_wait.interrupt(&self.wait_client);
            return;
        }
        let client = self.wait_client.load(Ordering::Acquire);
        if client <= 0 {
            // Not connected yet, so not blocking yet.
            meta.abort.abort();
            return;
        }
        let mut conn = self.shared.conn.clone();
        tokio::spawn(async move {
            let unblocked: redis::RedisResult<i64> = redis::cmd("CLIENT")
                .arg("UNBLOCK")
                .arg(client)
                .query_async(&mut conn)
                .await;
            if let Err(error) = unblocked {
                tracing::debug!(%error, "could not interrupt the idle wait; it ends at its timeout");
            }
        });
    }

    /// Starts the idle wait over every ready shard that only needs new entries, if a whole rotation came
    /// back empty.
    fn start_wait(&mut self, jobs: &mut JoinSet<JobOutcome>) {
        let owned = self.owned_live();
        if self.wait.is_some() || owned == 0 || self.idle_streak < owned {
            return;
        }
        let Some(&slot) = self.free_slots.last() else {
            return;
        };
        let reclaim_every = self.shared.config.reclaim_idle;
        let eligible = |state: &ShardState| {
            !state.running
                && state.mode == Mode::Owned
                && state.phase == Some(Phase::Live)
                && state.held.is_empty()
                && state.missing_group.is_none()
        };
        // Ready shards the wait cannot serve (held entries: a retry or a moved key) need a worker first.
        let busy_ready = self
            .ready
            .iter()
            .filter(|shard| self.shards.get(shard).is_some_and(|s| !eligible(s)))
            .count();
        if busy_ready >= self.free_slots.len() {
            return;
        }
        let mut shards = Vec::new();
        let mut reclaim = Vec::new();
        let mut members = Vec::new();
        self.ready.retain(|shard| {
            let Some(state) = self.shards.get_mut(shard) else {
                return false;
            };
            if !eligible(state) {
                return true;
            }
            state.running = true;
            if state.reclaimed_at.elapsed() >= reclaim_every {
                state.reclaimed_at = Instant::now();
                reclaim.push(*shard);
            }
            shards.push((*shard, state.key.clone()));
            members.push((*shard, state.generation));
            false
        });
        if shards.is_empty() {
            return;
        }
        self.free_slots.pop();
        for (shard, _) in &members {
            *self.busy.entry(*shard).or_insert(0) += 1;
        }
        let conn = self.wait_conn.take();
        self.wait_client
            .store(conn.as_ref().map_or(0, |(_, id)| *id), Ordering::Release);
        let spec = wait::WaitSpec {
            shards,
            reclaim,
            conn,
            client: self.wait_client.clone(),
            deadline: self.deadline.clone(),
        };
        let abort = jobs.spawn(tracing::Instrument::in_current_span(wait::run(
            self.shared.clone(),
            spec,
        )));
        self.wait = Some(abort.id());
        self.meta.insert(
            abort.id(),
            JobMeta {
                shard: u32::MAX,
                generation: 0,
                slot,
                wait: members,
                abort,
            },
        );
    }

    fn on_wait_end(&mut self, meta: JobMeta, mut outcome: JobOutcome) {
        self.wait = None;
        self.wait_interrupted = false;
        // Shards that came back empty while it ran are polled (or waited on) again now.
        self.ready.extend(self.parked.drain(..));
        if outcome.fetched > 0 {
            // Data: poll the whole rotation again before waiting. (An empty wait leaves the streak as it
            // was, so the member simply waits again.)
            self.idle_streak = 0;
        }
        if let Some(conn) = outcome.conn.take() {
            self.wait_conn = Some(conn);
        }
        if let Some(error) = &outcome.error {
            tracing::warn!(%error, "idle wait failed; polling the shards one by one");
        }
        if outcome.missing_group || outcome.error.is_some() {
            // Which shard is at fault is found by the shards' own reads: poll them one by one.
            self.idle_streak = 0;
        }
        let again = outcome.error.is_some() || outcome.expired || outcome.missing_group;
        let mut woke: HashMap<u32, Vec<Entry>> = outcome.woke.drain(..).collect();
        for (shard, generation) in meta.wait {
            if let Some(busy) = self.busy.get_mut(&shard) {
                *busy -= 1;
                if *busy == 0 {
                    self.busy.remove(&shard);
                }
            }
            let Some(state) = self.shards.get_mut(&shard) else {
                continue;
            };
            if state.generation != generation {
                if state.waiting_for_old_job && !self.busy.contains_key(&shard) && !state.running {
                    state.waiting_for_old_job = false;
                    self.ready.push_back(shard);
                }
                continue;
            }
            state.running = false;
            if let Some(entries) = woke.remove(&shard).filter(|e| !e.is_empty()) {
                state.last_delivered = entries.last().map(|e| e.id.clone());
                state.dirty = true;
                state.held.extend(entries);
            }
            if state.mode == Mode::Revoking {
                self.finish_revoke(shard);
            } else if again {
                self.delayed
                    .push((Instant::now() + HOLD_RETRY, shard, generation));
            } else {
                self.ready.push_back(shard);
            }
        }
    }

    fn dispatch_ready(&mut self, jobs: &mut JoinSet<JobOutcome>) {
        while !self.free_slots.is_empty() {
            self.start_wait(jobs);
            if self.free_slots.is_empty() {
                return;
            }
            let Some(shard) = self.ready.pop_front() else {
                return;
            };
            let Some(state) = self.shards.get_mut(&shard) else {
                continue;
            };
            if state.running || state.mode != Mode::Owned {
                continue;
            }
            if let Some(seen) = state.missing_group {
                if self.deadline.confirmations() <= seen {
                    // Not before a heartbeat sent after the loss confirmed that the shard is still ours.
                    self.delayed
                        .push((Instant::now() + HOLD_RETRY, shard, state.generation));
                    continue;
                }
            }
            let Some(phase) = state.phase.take() else {
                continue;
            };
            let reclaim = phase == Phase::Live
                && state.reclaimed_at.elapsed() >= self.shared.config.reclaim_idle;
            if reclaim {
                state.reclaimed_at = Instant::now();
            }
            let Some(slot) = self.free_slots.pop() else {
                return;
            };
            state.running = true;
            let spec = JobSpec {
                shard,
                key: state.key.clone(),
                token: state.token.clone(),
                lease: state.lease.clone(),
                phase,
                stop: state.stop.clone(),
                in_flight: state.in_flight.clone(),
                waiting: self.waiting.clone(),
                paused: self.paused.clone(),
                held: std::mem::take(&mut state.held),
                reclaim,
                recreate_group: state.missing_group.take().is_some(),
            };
            let generation = state.generation;
            let abort = jobs.spawn(tracing::Instrument::in_current_span(job::run(
                self.shared.clone(),
                spec,
            )));
            *self.busy.entry(shard).or_insert(0) += 1;
            self.meta.insert(
                abort.id(),
                JobMeta {
                    shard,
                    generation,
                    slot,
                    wait: Vec::new(),
                    abort,
                },
            );
        }
    }

    fn on_job_end(&mut self, id: tokio::task::Id, outcome: Option<JobOutcome>) {
        let Some(meta) = self.meta.remove(&id) else {
            return;
        };
        self.free_slots.push(meta.slot);
        if !meta.wait.is_empty() {
            self.on_wait_end(meta, outcome.unwrap_or_default());
            return;
        }
        let shard = meta.shard;
        if let Some(busy) = self.busy.get_mut(&shard) {
            *busy -= 1;
            if *busy == 0 {
                self.busy.remove(&shard);
            }
        }
        let mut outcome = outcome.unwrap_or_default();
        let Some(state) = self.shards.get_mut(&shard) else {
            return;
        };
        if state.generation != meta.generation {
            // A job of a fenced ownership ended; the new ownership may start now.
            if state.waiting_for_old_job && !self.busy.contains_key(&shard) && !state.running {
                state.waiting_for_old_job = false;
                self.ready.push_back(shard);
            }
            return;
        }
        state.running = false;
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
        state.held = std::mem::take(&mut outcome.held);
        state.pending = (outcome.left_pending + state.held.len()) as u64;
        if outcome.missing_group {
            state.missing_group = Some(self.deadline.confirmations());
        }
        if state.mode == Mode::Revoking {
            self.finish_revoke(shard);
            return;
        }
        // A job that was aborted or crashed: re-deliver what it left pending before reading on.
        state.phase = Some(outcome.next_phase.unwrap_or(Phase::Claim {
            cursor: crate::names::START_ID.to_owned(),
        }));
        self.shared
            .probe
            .read_result(shard, outcome.error.is_some());
        if let Some(error) = &outcome.error {
            state.error_backoff =
                (state.error_backoff * 2).clamp(Duration::from_millis(50), Duration::from_secs(5));
            tracing::warn!(shard, %error, backoff = ?state.error_backoff, "shard read failed; backing off");
            self.delayed.push((
                Instant::now() + state.error_backoff,
                shard,
                state.generation,
            ));
            return;
        }
        state.error_backoff = Duration::ZERO;
        if outcome.expired || outcome.missing_group {
            // Past the self-fencing deadline (a fence is on its way), or waiting for a confirmation.
            self.delayed
                .push((Instant::now() + HOLD_RETRY, shard, state.generation));
            return;
        }
        if let Some(delay) = outcome.hold_for {
            // A moved key waits for its old shard: try again later, starting with the held entries.
            self.delayed
                .push((Instant::now() + delay, shard, state.generation));
            return;
        }
        if outcome.fetched > 0 {
            // Data found: poll the whole rotation again before waiting.
            self.idle_streak = 0;
        } else {
            self.idle_streak += 1;
            if self.wait.is_some() && state.phase == Some(Phase::Live) && state.held.is_empty() {
                // Its job was running when the idle wait started, and it came back empty: polling it
                // again would only spin the free workers. It joins the next wait instead, which the
                // interrupt starts at once.
                self.parked.push(shard);
                if !self.wait_interrupted {
                    self.wait_interrupted = true;
                    self.interrupt_wait();
                }
                return;
            }
        }
        self.ready.push_back(shard);
    }

    fn release_delayed(&mut self) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.delayed.len() {
            if self.delayed[i].0 <= now {
                let (_, shard, generation) = self.delayed.swap_remove(i);
                if self
                    .shards
                    .get(&shard)
                    .is_some_and(|s| s.generation == generation && s.mode == Mode::Owned)
                {
                    self.ready.push_back(shard);
                }
            } else {
                i += 1;
            }
        }
    }

    fn queue_progress(&mut self) {
        if self.outbox.len() >= OUTBOX_PROGRESS_LIMIT {
            return;
        }
        let now = crate::util::rfc3339_now();
        let mut dirty: Vec<u32> = self
            .shards
            .iter()
            .filter(|(_, s)| s.dirty && s.mode == Mode::Owned)
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
            self.outbox.push_back(ShardReport::Progress(ShardProgress {
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
