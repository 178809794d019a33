//! The async driver of one consumer: turns commands from the heartbeat loop, job ends, hook answers, pause
//! changes, the deadline and time into the [`ShardScheduler`]'s inputs, and executes its [`Command`]s.
//!
//! It decides nothing: every rule is the scheduler's. What it keeps is what cannot be pure: the tasks of
//! running jobs with their abort handles and signals, each ownership's handle (which the jobs and manual
//! acks check before every command), the running idle wait (a future it polls itself, not a task) and
//! its connection, and the channels.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::Instant;

use crate::coordinator::wire::{ShardId, ShardProgress};
use crate::member::lifecycle::{OwnershipDeadline, ShardCommand, ShardReport};

use super::cluster_wait::ClusterWait;
use super::fence::Fence;
use super::hooks::{self, HookCall, LifecycleHooks};
use super::job_spec::{JobSignals, JobSpec};
use super::message::{BoxedHandler, ShardOwnership};
use super::order::OrderGate;
use super::retention::RetentionJob;
use super::scheduler::{
    Command, HooksSet, JobId, JobKind, JobPlan, JobReport, Millis, ProbeEvent, Report,
    ShardScheduler,
};
use super::shard_io::{ShardIo, WaitReads};
use super::unblock::Interrupt;
use super::wait_spec::{WaitSet, WaitSpec, Watched};
use super::{job, wait, PauseHandle};

/// What a task of the driver's join set returns.
pub(crate) enum Ended {
    Job(JobReport),
    /// Idle shards' retention steps, run after a wait (nothing to report).
    Retention,
}

struct Running {
    job: JobId,
    abort: AbortHandle,
    signals: Arc<JobSignals>,
}

/// One ownership's handle (its stream key, fence, and whether it may still act), and what the idle wait
/// reads from it.
struct Owned {
    key: Arc<str>,
    fence: Arc<Fence>,
    ownership: Arc<ShardOwnership>,
    /// How many entries the last idle wait that watched the shard read from it at most.
    wait_count: usize,
}

/// The idle wait, polled by the driver's own task (see [`Driver::start_wait`]).
struct RunningWait {
    job: JobId,
    /// The wait's end, or the message of a panic in it.
    future: crate::panic::CatchPanic<
        std::pin::Pin<Box<dyn std::future::Future<Output = wait::WaitEnd> + Send>>,
    >,
}

/// A wait the scheduler started at the end of the last one, built once that end's jobs ran (see
/// [`Driver::start_deferred_wait`]).
struct WaitStart {
    job: JobId,
    shards: Vec<(u32, Option<Arc<str>>)>,
    follow_up: bool,
    /// The scheduler interrupted it meanwhile.
    interrupted: bool,
}

/// The running wait's end; never, when none runs.
async fn wait_end(wait: &mut Option<RunningWait>) -> Result<wait::WaitEnd, String> {
    match wait {
        Some(wait) => (&mut wait.future).await,
        None => std::future::pending().await,
    }
}

/// Jobs per worker: a job holds a worker's permit only while its handler runs (see the `job` module), so
/// up to this many shards per worker are read meanwhile, each holding at most one batch. Four workers over
/// 16 busy shards then read every shard as it fills, instead of taking turns: the latency bench's p50 at
/// half the hand-written loop's maximum went from 3.4-4.2 ms to 1.7-2 ms with a job per shard.
pub(crate) const JOBS_PER_WORKER: usize = 4;

/// Where the driver's timer rests when no wake is due.
const FAR: Duration = Duration::from_secs(24 * 3600);

pub(crate) struct Driver {
    io: Arc<ShardIo>,
    handler: BoxedHandler,
    retention: Arc<RetentionJob>,
    order: Arc<OrderGate>,
    /// The idle wait's blocking connections and slot map on a cluster.
    cluster_wait: Arc<ClusterWait>,
    deadline: Arc<OwnershipDeadline>,
    machine: ShardScheduler,
    tasks: HashMap<tokio::task::Id, Running>,
    by_job: HashMap<JobId, tokio::task::Id>,
    owned: HashMap<u32, Owned>,
    /// The idle wait, if one runs.
    wait: Option<RunningWait>,
    /// While a wait's end is executed, the next wait is kept here rather than built (`defer_wait`).
    wait_to_start: Option<WaitStart>,
    defer_wait: bool,
    /// A wait dropped by `AbortAll`, or that panicked, to be reported as aborted.
    aborted_wait: Option<JobId>,
    /// The shards the last wait watched, kept for the next one over the same ownerships.
    wait_set: Option<Arc<WaitSet>>,
    /// The idle wait's blocking connection and its Redis client id, once made (one wait at a time).
    wait_conn: Option<super::wait_spec::WaitConnection>,
    /// Ends the running wait early (see the `unblock` module).
    interrupt: Arc<Interrupt>,
    reports: mpsc::UnboundedSender<ShardReport>,
    hook_calls: Option<mpsc::UnboundedSender<HookCall>>,
    /// Revoked shards whose hook returned, with the fence generation they were revoked in.
    hooks_done: mpsc::UnboundedReceiver<(u64, Vec<u32>)>,
    /// Keeps the pause channel open for `pause_rx`, whoever else drops their handle.
    _pause: PauseHandle,
    pause_rx: watch::Receiver<bool>,
    stopped: bool,
}

impl Driver {
    pub(crate) fn new(
        io: Arc<ShardIo>,
        handler: BoxedHandler,
        deadline: Arc<OwnershipDeadline>,
        hooks: LifecycleHooks,
        pause: PauseHandle,
        reports: mpsc::UnboundedSender<ShardReport>,
    ) -> Self {
        let jobs = io
            .config
            .runtime_max_concurrency
            .saturating_mul(JOBS_PER_WORKER);
        let reclaim_every = u64::try_from(io.config.reclaim_idle.as_millis()).unwrap_or(u64::MAX);
        let set = HooksSet {
            any: !hooks.is_empty(),
            revoked: hooks.has_revoked(),
        };
        let (done_tx, hooks_done) = mpsc::unbounded_channel();
        let hook_calls = set.any.then(|| hooks::spawn_runner(hooks, done_tx));
        let pause_rx = pause.paused.subscribe();
        Self {
            io,
            handler,
            retention: Arc::default(),
            order: Arc::default(),
            cluster_wait: Arc::default(),
            deadline,
            machine: ShardScheduler::new(jobs, reclaim_every, set),
            tasks: HashMap::new(),
            by_job: HashMap::new(),
            owned: HashMap::new(),
            wait: None,
            wait_to_start: None,
            defer_wait: false,
            aborted_wait: None,
            wait_set: None,
            wait_conn: None,
            interrupt: Arc::default(),
            reports,
            hook_calls,
            hooks_done,
            _pause: pause,
            pause_rx,
            stopped: false,
        }
    }

    /// The member's monotonic clock, as the scheduler counts it.
    fn now(&self) -> Millis {
        Millis::from(self.deadline.local_now())
    }

    /// When a point of the scheduler's clock is, for the timer.
    fn instant(&self, at: Millis) -> Option<Instant> {
        Instant::from_std(self.deadline.origin()).checked_add(Duration::from_millis(at.0))
    }

    /// Serves commands until `commands` is closed and the scheduler has stopped. Dropping the future aborts
    /// every job (the join set goes with it).
    pub(crate) async fn run(mut self, mut commands: mpsc::UnboundedReceiver<ShardCommand>) {
        let mut jobs: JoinSet<Ended> = JoinSet::new();
        let mut progress = tokio::time::interval(self.io.config.progress_interval);
        progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut closed = false;
        // One timer for the scheduler's next wake, moved only when that changes. A timer made anew every
        // turn is registered anew, and one due before a parked worker's own wake-up unparks it (a write
        // to the I/O driver's eventfd): at 1,000 entries/s that was one such write per entry, 0.03 now.
        let timer = tokio::time::sleep_until(Instant::now() + FAR);
        tokio::pin!(timer);
        let mut armed: Option<Instant> = None;
        self.observe_lease(&mut jobs);
        self.on_pause_change(&mut jobs);
        loop {
            if let Some(job) = self.aborted_wait.take() {
                let out = self.machine.job_ended(self.now(), job, None);
                self.execute(out, &mut jobs);
            }
            let out = self.machine.settle();
            self.execute(out, &mut jobs);
            if self.stopped {
                break;
            }
            let wake = self
                .machine
                .next_wake(self.now())
                .and_then(|at| self.instant(at));
            if wake != armed {
                // Pushed far out rather than left to fire for nothing when no wake is due.
                timer
                    .as_mut()
                    .reset(wake.unwrap_or_else(|| Instant::now() + FAR));
                armed = wake;
            }
            tokio::select! {
                biased;
                command = commands.recv(), if !closed => {
                    self.observe_lease(&mut jobs);
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
                            closed = true;
                            let out = self.machine.shutdown(self.now());
                            self.execute(out, &mut jobs);
                        }
                    }
                },
                end = wait_end(&mut self.wait), if self.wait.is_some() => {
                    self.observe_lease(&mut jobs);
                    if let Some(wait) = self.wait.take() {
                        match end {
                            Ok(end) => {
                                let before = jobs.len();
                                let idle = self.on_wait_end(wait.job, end, &mut jobs);
                                if jobs.len() > before && self.wait_to_start.is_some() {
                                    // The jobs just started run their handlers before the next wait is
                                    // built and its read goes out (polling it first held them back,
                                    // 20-40 us at 1,000/s in the latency bench; building it, 5-8 us).
                                    tokio::task::yield_now().await;
                                }
                                self.start_deferred_wait();
                                self.run_retention(&idle, &mut jobs);
                            }
                            Err(panic) => {
                                tracing::error!(%panic, "the idle wait panicked");
                                self.aborted_wait = Some(wait.job);
                            }
                        }
                    }
                }
                Some(joined) = jobs.join_next_with_id(), if !jobs.is_empty() => {
                    self.observe_lease(&mut jobs);
                    let (id, ended) = match joined {
                        Ok((id, ended)) => (id, Some(ended)),
                        Err(error) => {
                            if error.is_panic() {
                                tracing::error!(%error, "consumer job panicked");
                            }
                            (error.id(), None)
                        }
                    };
                    self.on_task_end(id, ended, &mut jobs);
                }
                Some((generation, shards)) = self.hooks_done.recv() => {
                    let out = self.machine.hook_done(generation, shards);
                    self.execute(out, &mut jobs);
                }
                Ok(()) = self.pause_rx.changed() => self.on_pause_change(&mut jobs),
                () = &mut timer, if wake.is_some() => {
                    armed = None;
                    self.observe_lease(&mut jobs);
                    let out = self.machine.tick(self.now());
                    self.execute(out, &mut jobs);
                }
                _ = progress.tick() => {
                    let out = self.machine.progress();
                    self.execute(out, &mut jobs);
                }
            }
        }
    }

    /// Tells the scheduler where the heartbeat loop's deadline is now.
    fn observe_lease(&mut self, jobs: &mut JoinSet<Ended>) {
        let until = Millis::from(self.deadline.until());
        let confirmations = self.deadline.confirmations();
        let out = self.machine.observe_lease(self.now(), until, confirmations);
        self.execute(out, jobs);
    }

    fn on_pause_change(&mut self, jobs: &mut JoinSet<Ended>) {
        let paused = *self.pause_rx.borrow_and_update();
        if paused == self.machine.is_paused() {
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

    fn on_command(&mut self, command: ShardCommand, jobs: &mut JoinSet<Ended>) {
        let now = self.now();
        let out = match command {
            ShardCommand::Assign { shard, token } => {
                tracing::debug!(shard, "shard assigned");
                self.machine.assign(now, shard, token)
            }
            ShardCommand::Revoke { shard } => self.machine.revoke(now, shard),
            ShardCommand::Fence => {
                tracing::warn!(shards = self.owned.len(), "fenced: aborting every handler");
                self.machine.fence(now)
            }
        };
        self.execute(out, jobs);
    }

    fn on_task_end(
        &mut self,
        id: tokio::task::Id,
        ended: Option<Ended>,
        jobs: &mut JoinSet<Ended>,
    ) {
        let Some(running) = self.tasks.remove(&id) else {
            // A retention task: nothing to tell the scheduler.
            return;
        };
        self.by_job.remove(&running.job);
        let now = self.now();
        let out = match ended {
            Some(Ended::Job(report)) => self.machine.job_ended(now, running.job, Some(report)),
            Some(Ended::Retention) => return,
            // Aborted or panicked.
            None => self.machine.job_ended(now, running.job, None),
        };
        self.execute(out, jobs);
    }

    /// The idle wait ended: the scheduler starts the jobs of the shards it saw entries on, and the next wait
    /// (kept in `wait_to_start`, to be built after those jobs ran). Gives back the shards it saw nothing on.
    fn on_wait_end(
        &mut self,
        job: JobId,
        end: wait::WaitEnd,
        jobs: &mut JoinSet<Ended>,
    ) -> wait::Idle {
        if end.conn.is_some() {
            self.wait_conn = end.conn;
        }
        let out = self.machine.wait_ended(self.now(), job, Some(end.report));
        self.defer_wait = true;
        self.execute(out, jobs);
        self.defer_wait = false;
        end.idle
    }

    /// Builds the wait `on_wait_end` kept back.
    fn start_deferred_wait(&mut self) {
        if let Some(start) = self.wait_to_start.take() {
            self.start_wait(start.job, start.shards, start.follow_up);
            if start.interrupted {
                self.interrupt.fire();
            }
        }
    }

    fn signals(&self, job: JobId) -> Option<&Arc<JobSignals>> {
        let id = self.by_job.get(&job)?;
        Some(&self.tasks.get(id)?.signals)
    }

    fn in_flight(&self, job: Option<JobId>) -> u32 {
        job.and_then(|job| self.signals(job))
            .map_or(0, |s| s.in_flight.load(Ordering::Acquire))
    }

    /// Executes the scheduler's commands, in order (and those its answers bring).
    fn execute(&mut self, out: Vec<Command>, jobs: &mut JoinSet<Ended>) {
        let mut queue: VecDeque<Command> = out.into();
        while let Some(command) = queue.pop_front() {
            match command {
                Command::Own { shard, epoch } => {
                    let key: Arc<str> = self.io.config.shard_key(shard).into();
                    let fence = Arc::new(Fence::new(&key, &self.io.config.group, epoch));
                    let ownership = ShardOwnership::new(self.deadline.clone(), epoch);
                    self.owned.insert(
                        shard,
                        Owned {
                            key,
                            fence,
                            ownership,
                            wait_count: self.io.config.batch_size,
                        },
                    );
                }
                Command::Disown { shard } => {
                    if let Some(owned) = self.owned.remove(&shard) {
                        owned.ownership.end();
                    }
                }
                Command::StartJob(plan) => {
                    if let Some(not_started) = self.start_job(plan, jobs) {
                        // Not reachable: the scheduler starts owned shards only. Keep it consistent.
                        tracing::error!(
                            shard = not_started.shard,
                            "a job of a shard with no ownership"
                        );
                        let now = self.now();
                        queue.extend(self.machine.job_ended(now, not_started.job, None));
                    }
                }
                Command::StartWait {
                    job,
                    shards,
                    follow_up,
                } => {
                    if self.defer_wait {
                        self.wait_to_start = Some(WaitStart {
                            job,
                            shards,
                            follow_up,
                            interrupted: false,
                        });
                    } else {
                        self.start_wait(job, shards, follow_up);
                    }
                }
                Command::InterruptWait { job } => self.interrupt_wait(job),
                Command::Stop { job } => {
                    if let Some(signals) = self.signals(job) {
                        signals.stop.store(true, Ordering::Release);
                        signals.stopped.notify_waiters();
                    }
                }
                Command::Yield { job } => {
                    if let Some(signals) = self.signals(job) {
                        signals.yield_now.store(true, Ordering::Release);
                    }
                }
                Command::AbortAll => {
                    // Dropped: its reply, if one comes, is never read (the scheduler claims what it
                    // may have delivered).
                    if let Some(wait) = self.wait.take() {
                        self.aborted_wait = Some(wait.job);
                    }
                    if let Some(start) = self.wait_to_start.take() {
                        self.aborted_wait = Some(start.job);
                    }
                    for running in self.tasks.values() {
                        running.signals.stop.store(true, Ordering::Release);
                        running.abort.abort();
                    }
                }
                Command::Report(report) => self.report(report),
                Command::CallHook(call) => {
                    let refused = match &self.hook_calls {
                        Some(calls) => calls.send(call).err().map(|e| e.0),
                        None => Some(call),
                    };
                    if let Some(HookCall::Revoked(generation, shards)) = refused {
                        // The hooks' task is gone: nothing holds the shards back.
                        queue.extend(self.machine.hook_done(generation, shards));
                    }
                }
                Command::Probe(event) => match event {
                    ProbeEvent::ReadResult { shard, failed } => {
                        self.io.probe.read_result(shard, failed)
                    }
                    ProbeEvent::Forget { shard } => self.io.probe.forget_shard(shard),
                    ProbeEvent::Aborting => self.io.probe.aborting(),
                },
                Command::Stopped => self.stopped = true,
            }
        }
    }

    /// Hands `report` up at once. A heartbeat loop that is gone has no use for it.
    fn report(&self, report: Report) {
        let report = match report {
            Report::Draining { shard, job } => {
                let in_flight = self.in_flight(job);
                tracing::debug!(shard, in_flight, "shard revoking");
                ShardReport::Draining { shard, in_flight }
            }
            Report::Revoked { shard } => ShardReport::Revoked { shard },
            Report::Progress {
                shard,
                last_delivered,
                last_acked,
                pending,
                job,
            } => ShardReport::Progress(ShardProgress {
                shard: ShardId::new(shard),
                stream_key: self.io.config.shard_key(shard),
                last_delivered_id: last_delivered,
                last_acked_id: last_acked,
                pending_count: pending + u64::from(self.in_flight(job)),
                updated_at: Some(crate::util::rfc3339_now()),
            }),
        };
        let _ = self.reports.send(report);
    }

    /// Starts the planned job; gives the plan back if its shard has no ownership here.
    fn start_job(&mut self, plan: JobPlan, jobs: &mut JoinSet<Ended>) -> Option<JobPlan> {
        let Some(owned) = self.owned.get(&plan.shard) else {
            return Some(plan);
        };
        let signals = Arc::new(JobSignals::default());
        let job = plan.job;
        let spec = JobSpec {
            shard: plan.shard,
            fence: owned.fence.clone(),
            key: owned.key.clone(),
            token: plan.token,
            install_fence: plan.install_fence,
            ownership: owned.ownership.clone(),
            read_mode: plan.read_mode,
            signals: signals.clone(),
            deferred: plan.deferred,
            delivered: (plan.kind == JobKind::Delivered).then_some(owned.wait_count),
            reclaim: plan.reclaim,
            recreate_group: plan.recreate_group,
            max_turns: plan.max_turns,
            paused: self.pause_rx.clone(),
            handler: self.handler.clone(),
            retention: self.retention.clone(),
            order: self.order.clone(),
        };
        let io = self.io.clone();
        let abort = jobs.spawn(tracing::Instrument::in_current_span(async move {
            Ended::Job(job::run(io, spec).await)
        }));
        self.track(job, abort, signals);
        None
    }

    /// Remembers a spawned job by its task.
    fn track(&mut self, job: JobId, abort: AbortHandle, signals: Arc<JobSignals>) {
        self.by_job.insert(job, abort.id());
        self.tasks.insert(
            abort.id(),
            Running {
                job,
                abort,
                signals,
            },
        );
    }

    /// Starts the idle wait over `shards` (see the `wait` module). The wait is not a task of its own: the
    /// driver polls it beside its other inputs, so its reply reaches the scheduler, and its request the
    /// connection, without a hand-off between tasks. On a multi-threaded runtime each such hand-off
    /// after the third in a row wakes another worker thread, and those wake-ups, not the commands, are
    /// most of a consumer's client CPU at low rates (see the latency bench's slices per entry).
    fn start_wait(
        &mut self,
        job: JobId,
        mut shards: Vec<(u32, Option<Arc<str>>)>,
        follow_up: bool,
    ) {
        // In index order, whatever the scheduler's queue order: the order of a read's streams changes
        // nothing, and the same shards then make the same set.
        shards.sort_unstable_by_key(|(shard, _)| *shard);
        let mut watch_from = HashMap::new();
        let reads = WaitReads::new(self.io.wait_count(shards.len()), follow_up);
        // A group wait reads from the group's position: it watches from nowhere.
        let group_wait = self.io.group_wait();
        for (shard, from) in &shards {
            if let Some(owned) = self.owned.get_mut(shard) {
                owned.wait_count = reads.delivers_at_most();
                if let Some(id) = from.as_ref().filter(|_| !group_wait) {
                    watch_from.insert(*shard, id.clone());
                }
            }
        }
        let watched = || {
            shards.iter().filter_map(|(shard, _)| {
                let owned = self.owned.get(shard)?;
                Some((*shard, &owned.key, &owned.fence.key))
            })
        };
        let set = match &self.wait_set {
            Some(set) if set.is(watched()) => set.clone(),
            _ => {
                let set = Arc::new(WaitSet::new(
                    watched()
                        .map(|(shard, key, fence)| Watched {
                            shard,
                            key: key.clone(),
                            fence: fence.clone(),
                        })
                        .collect(),
                ));
                self.wait_set = Some(set.clone());
                set
            }
        };
        let conn = self.wait_conn.take();
        self.interrupt.reset();
        let spec = WaitSpec {
            set,
            reads,
            watch_from,
            conn,
            interrupt: self.interrupt.clone(),
            deadline: self.deadline.clone(),
            order: self.order.clone(),
        };
        let (io, pool) = (self.io.clone(), self.cluster_wait.clone());
        let future: std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>> = Box::pin(
            tracing::Instrument::in_current_span(wait::run(io, pool, spec)),
        );
        self.wait = Some(RunningWait {
            job,
            future: crate::panic::catch_panic(future),
        });
    }

    /// Runs the due retention steps of idle shards (see [`wait::WaitEnd::idle`]) in a task of the join set:
    /// untracked (it holds no worker and ends no job), aborted with the rest at shutdown.
    fn run_retention(&mut self, idle: &wait::Idle, jobs: &mut JoinSet<Ended>) {
        let due = self
            .retention
            .due(&self.io, idle.shards().map(|w| (w.shard, &w.key)));
        if due.is_empty() {
            return;
        }
        let (io, retention, deadline) = (
            self.io.clone(),
            self.retention.clone(),
            self.deadline.clone(),
        );
        jobs.spawn(tracing::Instrument::in_current_span(async move {
            for (shard, key) in due {
                if deadline.remaining().is_none() {
                    break;
                }
                retention.step(&io, shard, &key, false).await;
            }
            Ended::Retention
        }));
    }

    /// Ends the idle wait early (see the `unblock` module); the wait returns normally with the shards it
    /// saw new entries on.
    fn interrupt_wait(&mut self, job: JobId) {
        if self.wait.as_ref().is_some_and(|wait| wait.job == job) {
            self.interrupt.fire();
        }
        if let Some(start) = self.wait_to_start.as_mut().filter(|start| start.job == job) {
            start.interrupted = true;
        }
    }
}
