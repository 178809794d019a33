//! The consumer's shard scheduler as a pure state machine: which shard's job starts next, on which worker,
//! of which kind, and when a revoked shard is reported. No tokio, no Redis, no clock: every input carries
//! `now` (monotonic milliseconds of the member, [`Millis`]), so every rule is a unit test and a property
//! test drives random input sequences through it.
//!
//! Inputs: [`assign`](ShardScheduler::assign), [`revoke`](ShardScheduler::revoke),
//! [`fence`](ShardScheduler::fence), [`lease_renewed`](ShardScheduler::lease_renewed),
//! [`lease_lost`](ShardScheduler::lease_lost),
//! [`job_ended`](ShardScheduler::job_ended), [`wait_ended`](ShardScheduler::wait_ended),
//! [`tick`](ShardScheduler::tick), [`pause`](ShardScheduler::pause) / [`resume`](ShardScheduler::resume),
//! [`shutdown`](ShardScheduler::shutdown). Each returns the [`Output`]s the async shell executes: jobs to
//! start, the idle wait to start or interrupt, REVOKED reports, aborting everything on a fence.
//!
//! Rules (each has a `rule_` test below):
//! * at most `workers` jobs run at once, the idle wait included; one job per shard index at a time, also
//!   across ownerships (a shard granted again after a fence waits for its old job to end);
//! * owned shards take turns in one round-robin queue: a shard goes to the back after its job;
//! * no job starts once the ownership deadline has passed, nor while paused or shutting down (the job
//!   checks the deadline again at every command: this is the scheduler's half of that rule);
//! * a revoked shard's running job drains, then the shard is reported REVOKED; an idle one at once; a shard
//!   the member does not own is reported at once too;
//! * a shard in retry backoff (a failed attempt, a moved key) waits off the queue and takes no worker; its
//!   next job starts with the deferred entries (per-key order);
//! * every shard looks for entries other consumers left pending too long once per `reclaim_every` (the
//!   session timeout);
//! * a shard's first job after an assignment, after its deadline lapsed, after a failed or aborted job, is a
//!   claim of its own pending entries; a read that failed before anything was delivered backs off, then
//!   reads on;
//! * a shard whose consumer group was found missing starts again only after its backoff and after a
//!   renewed lease (a heartbeat the coordinator accepted after the loss confirms that it is still ours);
//! * after a rotation of empty reads, one idle wait covers every idle shard, never the last worker a deferred
//!   shard needs; an assignment, a revocation, pause, shutdown or a deadline lapse interrupts it. A shard
//!   whose job comes back empty while the wait runs is parked for the next wait (not polled again by a
//!   free worker) and the wait is interrupted, once, so that the next one covers it too.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::clock::LocalMillis;

/// A point on the member's monotonic clock, in milliseconds: a [`LocalMillis`] clamped to the machine's
/// unsigned range (never a store time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Millis(pub u64);

impl From<LocalMillis> for Millis {
    fn from(local: LocalMillis) -> Self {
        if local == LocalMillis::MAX {
            Millis(u64::MAX)
        } else {
            Millis(u64::try_from(local.0).unwrap_or(0))
        }
    }
}

impl Millis {
    fn plus(self, ms: u64) -> Self {
        Millis(self.0.saturating_add(ms))
    }
}

/// Names one started job (or idle wait) for [`ShardScheduler::job_ended`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobId(pub u64);

/// What a job does first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobKind {
    /// Claim the shard's pending entries (left by earlier owners or an earlier life of this member).
    ClaimOwn,
    /// Claim entries other consumers left pending past the session timeout (zombies, lost acks), then read.
    ReclaimZombies,
    /// Read new entries.
    Read,
    /// Handle the entries an earlier job deferred (backoff over, or a moved key's old shard caught up).
    Retry,
}

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobEnd {
    /// Entries were read and handled.
    Data,
    /// A claim page was done and more may be pending: claim on next turn.
    Claiming,
    /// Nothing to read.
    Empty,
    /// Entries deferred until `retry_at` (a failed attempt's backoff, a moved key): per-key order.
    Deferred {
        /// When the shard may run again.
        retry_at: Millis,
    },
    /// A Redis error: back off until `retry_at`, then claim our own pending entries (acks may be lost).
    Failed {
        /// When the shard may run again.
        retry_at: Millis,
    },
    /// A read failed before it delivered anything (no ack is in doubt): back off until `retry_at`, then
    /// read on.
    ReadFailed {
        /// When the shard may run again.
        retry_at: Millis,
    },
    /// The shard's consumer group (or stream) is missing: back off until `retry_at` and wait for a renewed
    /// lease (see [`ShardScheduler::lease_renewed`]), then claim our own pending entries.
    MissingGroup {
        /// When the shard may run again, at the earliest.
        retry_at: Millis,
    },
    /// The job found the ownership deadline passed.
    Expired,
    /// Aborted or panicked.
    Aborted,
}

/// What the shell must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Start a job of `shard` with the fencing token's `epoch`.
    Start {
        /// The job's id.
        job: JobId,
        /// The shard index.
        shard: u32,
        /// The member epoch of the grant.
        epoch: i64,
        /// What it does first.
        kind: JobKind,
    },
    /// Start the idle wait: one blocking read over `shards`.
    StartWait {
        /// The wait's id.
        job: JobId,
        /// The shards it reads.
        shards: Vec<u32>,
    },
    /// End the idle wait early (`CLIENT UNBLOCK`); it ends through [`ShardScheduler::wait_ended`].
    InterruptWait {
        /// The wait's id.
        job: JobId,
    },
    /// Report the shard REVOKED to the heartbeat.
    Revoked {
        /// The shard index.
        shard: u32,
    },
    /// Fenced: abort every running job now (they still end through `job_ended`).
    AbortAll,
    /// Shutting down and no job runs any more.
    Stopped,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    Read,
    Retry,
}

/// What a job's end asks of the shard's next job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NextJob {
    ClaimOwn,
    Read,
    Retry,
}

#[derive(Debug, Clone)]
struct Shard {
    epoch: i64,
    generation: u64,
    revoking: bool,
    /// An assignment that came while revoking: served once the revocation is through.
    reassign: Option<i64>,
    running: bool,
    next: Next,
    /// The next job claims the shard's own pending entries first (takes precedence over deferred entries,
    /// which the claim delivers again from Redis).
    claim_owed: bool,
    retry_at: Option<Millis>,
    reclaimed_at: Millis,
    /// In the ready queue.
    queued: bool,
    /// Found nothing while the idle wait runs: waits for it to end (the wait is interrupted so that the
    /// next one covers this shard too) instead of polling on its own.
    parked: bool,
    /// Waiting for a job of an earlier ownership of the same index to end.
    waiting_for_old: bool,
    /// Its consumer group was missing: waits for a renewed lease.
    unconfirmed: bool,
}

#[derive(Debug, Clone)]
struct Job {
    /// `(shard, generation)`: one for a job, every waited shard for the idle wait.
    shards: Vec<(u32, u64)>,
    wait: bool,
}

/// The pure scheduler of one member's shard jobs (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct ShardScheduler {
    workers: usize,
    reclaim_every: u64,
    shards: BTreeMap<u32, Shard>,
    ready: VecDeque<u32>,
    jobs: BTreeMap<JobId, Job>,
    next_job: u64,
    next_generation: u64,
    deadline: Millis,
    lapsed: bool,
    paused: bool,
    closing: bool,
    stopped: bool,
    idle_streak: usize,
    wait: Option<JobId>,
    /// The running wait was interrupted for a parked shard (once per wait is enough).
    wait_interrupted: bool,
}

impl ShardScheduler {
    /// A scheduler of `workers` concurrent jobs whose shards look for zombies' entries every
    /// `reclaim_every_ms`. Nothing may start before the first [`lease_renewed`](Self::lease_renewed) or
    /// [`assign`](Self::assign) gives a deadline.
    pub fn new(workers: usize, reclaim_every_ms: u64) -> Self {
        Self {
            workers: workers.max(1),
            reclaim_every: reclaim_every_ms,
            shards: BTreeMap::new(),
            ready: VecDeque::new(),
            jobs: BTreeMap::new(),
            next_job: 0,
            next_generation: 0,
            deadline: Millis(0),
            lapsed: true,
            paused: false,
            closing: false,
            stopped: false,
            idle_streak: 0,
            wait: None,
            wait_interrupted: false,
        }
    }

    /// The member may read `shard` with `epoch` until `deadline`.
    pub fn assign(&mut self, now: Millis, shard: u32, epoch: i64, deadline: Millis) -> Vec<Output> {
        let mut out = Vec::new();
        self.renew(now, deadline);
        self.interrupt_wait(&mut out);
        self.assign_inner(now, shard, epoch);
        self.dispatch(now, &mut out);
        out
    }

    fn assign_inner(&mut self, now: Millis, shard: u32, epoch: i64) {
        if let Some(state) = self.shards.get_mut(&shard) {
            if state.revoking {
                state.reassign = Some(epoch);
            } else {
                state.epoch = epoch;
            }
            return;
        }
        self.next_generation += 1;
        let mut state = self.new_shard(now, epoch);
        state.waiting_for_old = self.busy(shard);
        let waiting_for_old = state.waiting_for_old;
        self.shards.insert(shard, state);
        if !waiting_for_old {
            self.enqueue(shard);
        }
    }

    fn new_shard(&self, now: Millis, epoch: i64) -> Shard {
        Shard {
            epoch,
            generation: self.next_generation,
            revoking: false,
            reassign: None,
            running: false,
            next: Next::Read,
            claim_owed: true,
            retry_at: None,
            reclaimed_at: now,
            queued: false,
            parked: false,
            waiting_for_old: false,
            unconfirmed: false,
        }
    }

    /// Stop reading `shard`: drain its running job, then report it.
    pub fn revoke(&mut self, now: Millis, shard: u32) -> Vec<Output> {
        let mut out = Vec::new();
        let busy = self.busy(shard);
        match self.shards.get_mut(&shard) {
            // Not ours: nothing to drain, unless a job of an earlier (fenced) ownership still runs.
            None if busy => {
                self.next_generation += 1;
                let mut state = self.new_shard(now, 0);
                state.revoking = true;
                state.waiting_for_old = true;
                self.shards.insert(shard, state);
            }
            None => out.push(Output::Revoked { shard }),
            Some(state) if state.revoking => state.reassign = None,
            Some(state) => {
                state.revoking = true;
                state.retry_at = None;
                let (running, waiting_for_old) = (state.running, state.waiting_for_old);
                self.ready.retain(|s| *s != shard);
                if let Some(state) = self.shards.get_mut(&shard) {
                    state.queued = false;
                }
                if running {
                    if self.wait_covers(shard) {
                        self.interrupt_wait(&mut out);
                    }
                } else if !waiting_for_old {
                    self.finish_revoke(now, shard, &mut out);
                }
                // Else the old ownership's job ends first (`back_from_job` reports then).
            }
        }
        self.dispatch(now, &mut out);
        out
    }

    /// Ownership of everything is lost: abort, forget every shard, report nothing.
    pub fn fence(&mut self, now: Millis) -> Vec<Output> {
        let mut out = Vec::new();
        self.shards.clear();
        self.ready.clear();
        self.idle_streak = 0;
        self.lapsed = true;
        self.deadline = now;
        if !self.jobs.is_empty() {
            out.push(Output::AbortAll);
        }
        self.check_stopped(&mut out);
        out
    }

    /// An accepted heartbeat moved the ownership deadline (or confirmed it): shards whose group was
    /// missing may start again once their backoff is over.
    pub fn lease_renewed(&mut self, now: Millis, deadline: Millis) -> Vec<Output> {
        let mut out = Vec::new();
        self.renew(now, deadline);
        let confirmed: Vec<u32> = self
            .shards
            .iter()
            .filter(|(_, s)| s.unconfirmed)
            .map(|(i, _)| *i)
            .collect();
        for shard in confirmed {
            if let Some(state) = self.shards.get_mut(&shard) {
                state.unconfirmed = false;
            }
            self.enqueue(shard);
        }
        self.dispatch(now, &mut out);
        out
    }

    /// The ownership deadline was withdrawn before its time (the heartbeat loop gave the lease up): as a
    /// lapse, until a later [`lease_renewed`](Self::lease_renewed).
    pub fn lease_lost(&mut self, now: Millis) -> Vec<Output> {
        let mut out = Vec::new();
        self.deadline = self.deadline.min(now);
        self.lapse(&mut out);
        out
    }

    fn lapse(&mut self, out: &mut Vec<Output>) {
        if self.lapsed {
            return;
        }
        self.lapsed = true;
        self.interrupt_wait(out);
        for state in self.shards.values_mut() {
            // Some entries may have been read and not handled at the lapse: ours to claim first.
            state.claim_owed = true;
        }
    }

    fn renew(&mut self, now: Millis, deadline: Millis) {
        if deadline > self.deadline {
            self.deadline = deadline;
        }
        if self.deadline > now {
            self.lapsed = false;
        }
    }

    /// A shard's job ended.
    pub fn job_ended(&mut self, now: Millis, job: JobId, end: JobEnd) -> Vec<Output> {
        let mut out = Vec::new();
        let Some(ended) = self.jobs.remove(&job) else {
            return out;
        };
        if ended.wait {
            // A wait ended through `job_ended` (aborted): nothing was read.
            self.wait = None;
            self.wait_interrupted = false;
            self.unpark();
            for (shard, generation) in ended.shards {
                self.back_from_job(now, shard, generation, Some(NextJob::Read), None, &mut out);
            }
        } else if let Some(&(shard, generation)) = ended.shards.first() {
            let (next, retry_at) = match end {
                JobEnd::Data | JobEnd::Empty => (NextJob::Read, None),
                JobEnd::Deferred { retry_at } => (NextJob::Retry, Some(retry_at)),
                JobEnd::Claiming | JobEnd::Expired | JobEnd::Aborted => (NextJob::ClaimOwn, None),
                JobEnd::Failed { retry_at } | JobEnd::MissingGroup { retry_at } => {
                    (NextJob::ClaimOwn, Some(retry_at))
                }
                JobEnd::ReadFailed { retry_at } => (NextJob::Read, Some(retry_at)),
            };
            let current = self
                .shards
                .get(&shard)
                .is_some_and(|s| s.generation == generation && !s.revoking);
            if current && matches!(end, JobEnd::MissingGroup { .. }) {
                if let Some(state) = self.shards.get_mut(&shard) {
                    state.unconfirmed = true;
                }
            }
            if current {
                match end {
                    JobEnd::Data | JobEnd::Claiming => self.idle_streak = 0,
                    JobEnd::Empty => self.idle_streak += 1,
                    _ => {}
                }
            }
            self.back_from_job(now, shard, generation, Some(next), retry_at, &mut out);
            let owned = self.shards.values().filter(|s| !s.revoking).count();
            if current && end == JobEnd::Empty && self.wait.is_some() && self.idle_streak >= owned {
                if let Some(state) = self.shards.get_mut(&shard) {
                    if state.queued {
                        state.queued = false;
                        state.parked = true;
                        self.ready.retain(|s| *s != shard);
                        if !self.wait_interrupted {
                            self.wait_interrupted = true;
                            self.interrupt_wait(&mut out);
                        }
                    }
                }
            }
        }
        self.dispatch(now, &mut out);
        self.check_stopped(&mut out);
        out
    }

    /// The idle wait ended; `woke` are the shards it saw new entries on (they run next, to read them).
    pub fn wait_ended(
        &mut self,
        now: Millis,
        job: JobId,
        woke: &[u32],
        failed: bool,
    ) -> Vec<Output> {
        let mut out = Vec::new();
        let Some(ended) = self.jobs.remove(&job) else {
            return out;
        };
        self.wait = None;
        self.wait_interrupted = false;
        self.unpark();
        if !woke.is_empty() || failed {
            self.idle_streak = 0;
        }
        for (shard, generation) in ended.shards {
            let next = if woke.contains(&shard) {
                NextJob::Retry
            } else {
                NextJob::Read
            };
            self.back_from_job(now, shard, generation, Some(next), None, &mut out);
        }
        self.dispatch(now, &mut out);
        self.check_stopped(&mut out);
        out
    }

    /// Time passed: backoffs end, the deadline may have lapsed.
    pub fn tick(&mut self, now: Millis) -> Vec<Output> {
        let mut out = Vec::new();
        if now >= self.deadline {
            self.lapse(&mut out);
        }
        let due: Vec<u32> = self
            .shards
            .iter()
            .filter(|(_, s)| s.retry_at.is_some_and(|at| at <= now))
            .map(|(i, _)| *i)
            .collect();
        for shard in due {
            if let Some(state) = self.shards.get_mut(&shard) {
                state.retry_at = None;
            }
            self.enqueue(shard);
        }
        self.dispatch(now, &mut out);
        out
    }

    /// Start no job until [`resume`](Self::resume); shards stay owned.
    pub fn pause(&mut self, _now: Millis) -> Vec<Output> {
        let mut out = Vec::new();
        self.paused = true;
        self.interrupt_wait(&mut out);
        out
    }

    /// Start jobs again, polling the whole rotation first.
    pub fn resume(&mut self, now: Millis) -> Vec<Output> {
        let mut out = Vec::new();
        self.paused = false;
        self.idle_streak = 0;
        self.dispatch(now, &mut out);
        out
    }

    /// Start nothing more; [`Output::Stopped`] once every job ended.
    pub fn shutdown(&mut self, _now: Millis) -> Vec<Output> {
        let mut out = Vec::new();
        self.closing = true;
        self.interrupt_wait(&mut out);
        self.check_stopped(&mut out);
        out
    }

    /// When the shell must call [`tick`](Self::tick) next: the earliest backoff end or the deadline.
    pub fn next_wake(&self) -> Option<Millis> {
        let backoff = self.shards.values().filter_map(|s| s.retry_at).min();
        let deadline = (!self.lapsed).then_some(self.deadline);
        match (backoff, deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Shards ready to run and waiting for a worker (a job hands its shard back early when some are).
    pub fn waiting(&self) -> usize {
        self.ready.len()
    }

    /// Whether the shell must look for a renewed lease even with nothing else to do: the deadline lapsed,
    /// or a shard waits for a confirmation of its ownership.
    pub fn awaits_renewal(&self) -> bool {
        (self.lapsed && !self.shards.is_empty()) || self.shards.values().any(|s| s.unconfirmed)
    }

    /// Jobs running now, the idle wait included.
    pub fn running(&self) -> usize {
        self.jobs.len()
    }

    /// Shards owned (not revoking).
    pub fn owned(&self) -> BTreeSet<u32> {
        self.shards
            .iter()
            .filter(|(_, s)| !s.revoking)
            .map(|(i, _)| *i)
            .collect()
    }

    fn busy(&self, shard: u32) -> bool {
        self.jobs
            .values()
            .any(|job| job.shards.iter().any(|(s, _)| *s == shard))
    }

    fn wait_covers(&self, shard: u32) -> bool {
        self.wait
            .and_then(|id| self.jobs.get(&id))
            .is_some_and(|job| job.shards.iter().any(|(s, _)| *s == shard))
    }

    fn unpark(&mut self) {
        let parked: Vec<u32> = self
            .shards
            .iter()
            .filter(|(_, s)| s.parked)
            .map(|(i, _)| *i)
            .collect();
        for shard in parked {
            if let Some(state) = self.shards.get_mut(&shard) {
                state.parked = false;
            }
            self.enqueue(shard);
        }
    }

    fn enqueue(&mut self, shard: u32) {
        if let Some(state) = self.shards.get_mut(&shard) {
            if !state.queued
                && !state.parked
                && !state.running
                && !state.revoking
                && !state.unconfirmed
                && state.retry_at.is_none()
            {
                state.queued = true;
                self.ready.push_back(shard);
            }
        }
    }

    fn interrupt_wait(&mut self, out: &mut Vec<Output>) {
        if let Some(job) = self.wait {
            if !out.contains(&Output::InterruptWait { job }) {
                out.push(Output::InterruptWait { job });
            }
        }
    }

    /// A job (or the wait) of `(shard, generation)` ended.
    fn back_from_job(
        &mut self,
        now: Millis,
        shard: u32,
        generation: u64,
        next: Option<NextJob>,
        retry_at: Option<Millis>,
        out: &mut Vec<Output>,
    ) {
        let busy = self.busy(shard);
        let Some(state) = self.shards.get_mut(&shard) else {
            return;
        };
        if state.generation != generation {
            // A job of a fenced ownership ended: the new ownership may start (or be reported) now.
            if state.waiting_for_old && !busy {
                state.waiting_for_old = false;
                if state.revoking {
                    self.finish_revoke(now, shard, out);
                } else {
                    self.enqueue(shard);
                }
            }
            return;
        }
        state.running = false;
        if state.revoking {
            self.finish_revoke(now, shard, out);
            return;
        }
        match next {
            // A claim still owed (a lapse while the job ran) is not forgotten by a read that ended well.
            Some(NextJob::Read) => state.next = Next::Read,
            Some(NextJob::Retry) => state.next = Next::Retry,
            Some(NextJob::ClaimOwn) => {
                state.next = Next::Read;
                state.claim_owed = true;
            }
            None => {}
        }
        state.retry_at = retry_at.filter(|at| *at > now);
        self.enqueue(shard);
    }

    fn finish_revoke(&mut self, now: Millis, shard: u32, out: &mut Vec<Output>) {
        let Some(state) = self.shards.remove(&shard) else {
            return;
        };
        self.ready.retain(|s| *s != shard);
        out.push(Output::Revoked { shard });
        if let Some(epoch) = state.reassign {
            self.assign_inner(now, shard, epoch);
        }
    }

    fn check_stopped(&mut self, out: &mut Vec<Output>) {
        if self.closing && !self.stopped && self.jobs.is_empty() {
            self.stopped = true;
            out.push(Output::Stopped);
        }
    }

    fn may_start(&self, now: Millis) -> bool {
        !self.paused && !self.closing && !self.lapsed && now < self.deadline
    }

    fn reclaim_due(&self, state: &Shard, now: Millis) -> bool {
        now >= state.reclaimed_at.plus(self.reclaim_every)
    }

    fn dispatch(&mut self, now: Millis, out: &mut Vec<Output>) {
        if !self.may_start(now) {
            return;
        }
        let mut skipped = 0;
        while self.jobs.len() < self.workers && skipped <= self.ready.len() {
            self.start_wait(now, out);
            if self.jobs.len() >= self.workers {
                return;
            }
            let Some(shard) = self.ready.pop_front() else {
                return;
            };
            let busy = self.busy(shard);
            let reclaim_due = self
                .shards
                .get(&shard)
                .is_some_and(|s| self.reclaim_due(s, now));
            let Some(state) = self.shards.get_mut(&shard) else {
                continue;
            };
            state.queued = false;
            if state.running || state.revoking {
                continue;
            }
            if busy {
                state.waiting_for_old = true;
                skipped += 1;
                continue;
            }
            let kind = match state.next {
                _ if state.claim_owed => {
                    state.claim_owed = false;
                    state.next = Next::Read;
                    JobKind::ClaimOwn
                }
                Next::Retry => JobKind::Retry,
                Next::Read if reclaim_due => {
                    state.reclaimed_at = now;
                    JobKind::ReclaimZombies
                }
                Next::Read => JobKind::Read,
            };
            state.running = true;
            let job = JobId(self.next_job);
            self.next_job += 1;
            self.jobs.insert(
                job,
                Job {
                    shards: vec![(shard, state.generation)],
                    wait: false,
                },
            );
            out.push(Output::Start {
                job,
                shard,
                epoch: state.epoch,
                kind,
            });
        }
    }

    /// After a rotation of empty reads: one wait over every queued shard that only needs new entries,
    /// unless the shards that need a worker for something else would be left without one.
    fn start_wait(&mut self, now: Millis, out: &mut Vec<Output>) {
        let owned = self.shards.values().filter(|s| !s.revoking).count();
        if self.wait.is_some() || owned == 0 || self.idle_streak < owned {
            return;
        }
        let free = self.workers - self.jobs.len();
        let eligible = |s: &Shard| {
            s.next == Next::Read && !s.claim_owed && now < s.reclaimed_at.plus(self.reclaim_every)
        };
        let others = self
            .ready
            .iter()
            .filter(|i| self.shards.get(i).is_some_and(|s| !eligible(s)))
            .count();
        if free == 0 || others >= free {
            return;
        }
        let mut shards = Vec::new();
        let mut taken = Vec::new();
        for shard in &self.ready {
            if let Some(state) = self.shards.get(shard) {
                if eligible(state) && !self.busy(*shard) {
                    shards.push(*shard);
                    taken.push((*shard, state.generation));
                }
            }
        }
        if shards.is_empty() {
            return;
        }
        self.ready.retain(|s| !shards.contains(s));
        for shard in &shards {
            if let Some(state) = self.shards.get_mut(shard) {
                state.queued = false;
                state.running = true;
            }
        }
        let job = JobId(self.next_job);
        self.next_job += 1;
        self.jobs.insert(
            job,
            Job {
                shards: taken,
                wait: true,
            },
        );
        self.wait = Some(job);
        out.push(Output::StartWait { job, shards });
    }
}

#[cfg(test)]
mod tests;
