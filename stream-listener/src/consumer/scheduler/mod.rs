//! The consumer's shard scheduler as a pure state machine. It owns every per-shard fact (the grant, the
//! ownership generation, the phase of its turn, where its reads are, deferred entries, the error backoff,
//! the fence, a missing group, progress), decides which shard's job starts next on which worker and what
//! a job's end means, and says when a revoked shard is reported. No tokio, no Redis, no clock: every input
//! carries `now` (monotonic milliseconds of the member, [`Millis`]), so every rule is a unit test and a
//! property test drives random input sequences through it. The async [`driver`](super::driver) executes
//! its [`Command`]s and keeps nothing but task handles.
//!
//! Inputs: [`assign`](ShardScheduler::assign), [`revoke`](ShardScheduler::revoke),
//! [`fence`](ShardScheduler::fence), [`observe_lease`](ShardScheduler::observe_lease),
//! [`job_ended`](ShardScheduler::job_ended), [`wait_ended`](ShardScheduler::wait_ended),
//! [`hook_done`](ShardScheduler::hook_done), [`settle`](ShardScheduler::settle),
//! [`tick`](ShardScheduler::tick), [`pause`](ShardScheduler::pause) / [`resume`](ShardScheduler::resume),
//! [`progress`](ShardScheduler::progress), [`shutdown`](ShardScheduler::shutdown).
//!
//! Rules (each has a `rule_` test in `tests.rs`, `job_end.rs` or `shard.rs`):
//! * at most `workers` jobs run at once, the idle wait included; one job per shard index at a time, also
//!   across ownerships (a shard granted again after a fence waits for its old job to end);
//! * owned shards take turns in one round-robin queue: a shard goes to the back after its job; a job keeps
//!   its shard for more batches (up to [`MAX_TURNS`]) only while no other shard waits for a worker and the
//!   listener is not paused, else it is told to [`Yield`](Command::Yield) (for a waiting shard, a busy
//!   job yields once it has run for [`YIELD_AFTER`], [`hands_back`]);
//! * no job starts once the ownership deadline has passed, nor while paused or shutting down (the job
//!   checks the deadline again at every command: this is the scheduler's half of that rule);
//! * what a job's end means is [`end_of`]: an error backs off (50 ms doubling to 5 s), then claims our own
//!   pending entries (a failed read that delivered nothing reads on);
//! * a revoked shard's running job is told to stop and drains, then the shard is reported REVOKED; an idle
//!   one at once; a shard the member does not own is reported at once too. With a revoked hook, REVOKED
//!   waits for the hook of the shard's drain to return, and is dropped if a fence came in between;
//! * a shard in retry backoff (a failed attempt, a moved key) waits off the queue and takes no worker; its
//!   next job starts with the deferred entries (per-key order);
//! * every shard looks for entries other consumers left pending too long once per `reclaim_every` (the
//!   session timeout);
//! * a shard's first job after an assignment, after its deadline lapsed, after a failed or aborted job, is a
//!   claim of its own pending entries;
//! * a shard whose consumer group was found missing starts again only after its backoff and after a
//!   renewed lease (a heartbeat the coordinator accepted after the loss confirms that it is still ours);
//! * a shard whose read came back empty or short of a batch is idle: not polled again, one idle wait
//!   covers every idle shard, never the last worker a deferred shard needs; an assignment, a revocation,
//!   pause, shutdown or the deadline interrupts it, and it is over [`WAIT_MARGIN`] before the deadline
//!   (none starts within that margin; idle shards are not polled there either). A shard whose job comes back idle while the wait
//!   runs is parked for the next wait (not polled again by a free worker) and the wait is interrupted,
//!   once, so that the next one covers it too. After a wake-up the next wait holds back for the woken
//!   shards' reads ([`WAIT_HOLD`] at most), so that it covers them without an interrupt. After a wait
//!   that delivered to two shards or more, the next one reads again right behind its blocking read
//!   ([`Command::StartWait`]'s `follow_up`);
//! * a short delivery's job handles that batch and reads nothing: past the hold its shard rides the wait
//!   beside it ([`rides`](ShardScheduler::rides)); what the wait delivers to it is queued for after the job
//!   (up to a batch, then it rides no further wait), or left to a claim of our own pending entries if the
//!   job ends needing one (id order); its job's end leaves it in the wait when idle, parked otherwise;
//!   revoked, it is reported once both ended;
//! * hooks see one batch of assigned and of drained shards per [`settle`](ShardScheduler::settle) (the
//!   driver settles after it took every queued command), drained first;
//! * [`Command::Stopped`] comes once shutting down, with no job running and no revoked hook unanswered.

mod command;
mod job_end;
mod shard;
mod table;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use crate::clock::LocalMillis;
use crate::consumer::hooks::HookCall;
use crate::member::lifecycle::FencingToken;
use crate::throttle::Throttle;

pub(crate) use command::{Command, JobPlan, ProbeEvent, Report};
pub(crate) use job_end::{end_of, JobEnd, JobReport, WaitReport};
pub(crate) use shard::ReadMode;
use shard::{Next, Phase, Shard};
use table::Table;

/// Upper bound of consecutive batches one job takes from its shard before handing it back, even when no
/// other shard is waiting (so progress and commands are looked at).
pub(crate) const MAX_TURNS: u32 = 64;

/// How long a job keeps taking full batches from its busy shard after it was asked to yield for another
/// shard (not for a pause, a revocation or shutdown): each hand-over costs the driver's turn and a new
/// task, and on a busy machine every such hop may wait for a CPU. Spread over a few batches of a fast
/// handler, 4 workers over 16 busy shards kept up at half the hand-written loop's maximum (p50 5-7 ms
/// against 78-166 ms handing over after every batch); a slow handler's batch outlasts it and hands over
/// after each batch, as before.
pub(crate) const YIELD_AFTER: Duration = Duration::from_millis(5);

/// Whether a job hands its busy shard back after the batch it just handled: it was asked to
/// ([`Command::Yield`]), and either the listener is paused (at once) or it has run for [`YIELD_AFTER`].
pub(crate) fn hands_back(asked: bool, paused: bool, ran: Duration) -> bool {
    asked && (paused || ran >= YIELD_AFTER)
}

/// How soon the driver looks at the deadline again while the scheduler waits for a renewed lease (the
/// heartbeat loop moves the deadline without a word).
pub(crate) const RENEWAL_POLL: Duration = Duration::from_millis(50);

/// How long idle shards wait at most for the reads still running before the idle wait starts without
/// them. Holding back lets one wait cover a shard whose read is about to come back short (a wake-up's
/// read) instead of starting, being interrupted for it, and starting again; the bound keeps a slow
/// handler from leaving the idle shards unwatched.
pub(crate) const WAIT_HOLD: Duration = Duration::from_millis(2);

/// How long before the ownership deadline the idle wait is over. Redis ends a `BLOCK` only when its event
/// loop next looks, up to `1000 / hz` ms late (100 ms at the default `hz 10`), and an entry written to a
/// watched stream meanwhile is still delivered to the read: so a wait blocks until this long before the
/// deadline at most, none starts later, and one still running then is ended with `CLIENT UNBLOCK` (a
/// server with a lower `hz` is covered by that, and the margin leaves it time to arrive). Idle shards are
/// not polled meanwhile either: they wait for the renewed lease.
pub(crate) const WAIT_MARGIN: Duration = Duration::from_millis(150);

/// A point on the member's monotonic clock, in milliseconds: a [`LocalMillis`] clamped to the machine's
/// unsigned range (never a store time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub(crate) struct Millis(pub(crate) u64);

impl From<LocalMillis> for Millis {
    fn from(local: LocalMillis) -> Self {
        if local == LocalMillis::MAX {
            Millis(u64::MAX)
        } else {
            Millis(u64::try_from(local.0).unwrap_or(0))
        }
    }
}

impl From<Millis> for LocalMillis {
    fn from(millis: Millis) -> Self {
        LocalMillis(i64::try_from(millis.0).unwrap_or(i64::MAX))
    }
}

impl Millis {
    fn plus(self, ms: u64) -> Self {
        Millis(self.0.saturating_add(ms))
    }

    pub(crate) fn plus_duration(self, delay: Duration) -> Self {
        self.plus(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX))
    }

    fn minus_duration(self, delay: Duration) -> Self {
        Millis(
            self.0
                .saturating_sub(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX)),
        )
    }
}

/// Names one started job (or idle wait).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct JobId(pub(crate) u64);

/// What a job does first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobKind {
    /// Claim the shard's pending entries (left by earlier owners or an earlier life of this member).
    ClaimOwn,
    /// Claim entries other consumers left pending past the session timeout (zombies, lost acks), then read.
    ReclaimZombies,
    /// Read new entries.
    Read,
    /// Handle the entries an earlier job deferred (backoff over, or a moved key's old shard caught up), or
    /// read what the idle wait saw.
    Retry,
    /// Handle what the idle wait's group read delivered.
    Delivered,
}

/// Which of the user's hooks are set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct HooksSet {
    /// Any hook: the hooks are called.
    pub(crate) any: bool,
    /// A revoked hook: REVOKED waits for it.
    pub(crate) revoked: bool,
}

#[derive(Debug, Clone)]
struct Job {
    /// `(shard, generation)`: one for a job, every waited shard for the idle wait.
    shards: Vec<(u32, u64)>,
    wait: bool,
    /// Handles one short delivery and reads nothing: its shard may ride the idle wait meanwhile.
    one_batch: bool,
    /// The fencing token's epoch the job was given (0 for the wait): the fence it installs is that grant's.
    epoch: i64,
    /// Told to hand its shard back after the batch (or to stop).
    yielded: bool,
}

/// The hooks' side of the scheduler: what they were not told yet, and what is unanswered.
#[derive(Debug, Clone, Default)]
struct Hooks {
    set: HooksSet,
    assigned: Vec<u32>,
    revoked: Vec<u32>,
    /// Revoked hook calls not answered yet.
    pending: usize,
    /// Shards drained whose revoked hook has not returned, with the number of such calls: a repeated
    /// revocation waits for them too, and REVOKED goes out once, after the last.
    unanswered: BTreeMap<u32, usize>,
    /// Incremented by every fence: answers of an earlier generation report nothing.
    fence_generation: u64,
}

/// What the scheduler last saw of the heartbeat loop's deadline.
#[derive(Debug, Clone, Copy)]
struct Lease {
    until: Millis,
    confirmations: u64,
    /// Told lost (withdrawn before its time), and not renewed since.
    lost: bool,
}

/// The pure scheduler of one member's shard jobs (see the [module docs](self)).
#[derive(Debug, Clone)]
pub(crate) struct ShardScheduler {
    workers: usize,
    reclaim_every: u64,
    shards: Table<u32, Shard>,
    ready: VecDeque<u32>,
    jobs: Table<JobId, Job>,
    next_job: u64,
    next_generation: u64,
    deadline: Millis,
    lapsed: bool,
    lease: Lease,
    paused: bool,
    closing: bool,
    stopped: bool,
    /// Since when idle shards have been queued with no wait running: the wait holds back for the reads
    /// of the shards the last wait woke (so that it covers them too), for [`WAIT_HOLD`] at most.
    idle_since: Option<Millis>,
    /// Shards the last wait saw new entries on, until their read ends.
    woken: Table<u32, ()>,
    wait: Option<JobId>,
    /// The running wait was interrupted for a parked shard or for the deadline's [`WAIT_MARGIN`] (once
    /// per wait is enough).
    wait_interrupted: bool,
    /// The last wait delivered to two shards or more: the next one reads again right behind its
    /// blocking read (see [`Command::StartWait`]).
    follow_up: bool,
    hooks: Hooks,
    /// The WARNs of failed shard reads and idle waits: a Redis outage fails every one of them.
    read_warnings: Throttle,
    wait_warnings: Throttle,
}

impl ShardScheduler {
    /// A scheduler of `workers` concurrent jobs whose shards look for zombies' entries every
    /// `reclaim_every_ms`. Nothing may start before a lease is observed.
    pub(crate) fn new(workers: usize, reclaim_every_ms: u64, hooks: HooksSet) -> Self {
        Self {
            workers: workers.max(1),
            reclaim_every: reclaim_every_ms,
            shards: Table::default(),
            ready: VecDeque::new(),
            jobs: Table::default(),
            next_job: 0,
            next_generation: 0,
            deadline: Millis(0),
            lapsed: true,
            lease: Lease {
                until: Millis(0),
                confirmations: 0,
                lost: false,
            },
            paused: false,
            closing: false,
            stopped: false,
            idle_since: None,
            woken: Table::default(),
            wait: None,
            wait_interrupted: false,
            follow_up: false,
            hooks: Hooks {
                set: hooks,
                ..Hooks::default()
            },
            read_warnings: Throttle::default(),
            wait_warnings: Throttle::default(),
        }
    }

    /// The member may read `shard` with `token` (until the lease's deadline).
    pub(crate) fn assign(&mut self, now: Millis, shard: u32, token: FencingToken) -> Vec<Command> {
        let mut out = Vec::new();
        self.renew(now, self.lease.until);
        self.interrupt_wait(&mut out);
        self.assign_inner(now, shard, token, &mut out);
        self.dispatch(now, &mut out);
        self.finish(&mut out);
        out
    }

    fn assign_inner(
        &mut self,
        now: Millis,
        shard: u32,
        token: FencingToken,
        out: &mut Vec<Command>,
    ) {
        if let Some(state) = self.shards.get_mut(&shard) {
            if state.revoking {
                state.reassign = Some(token);
            } else {
                if state.token.as_ref().map(|t| t.member_epoch) != Some(token.member_epoch) {
                    // A newer grant of a shard we hold: its fence replaces ours.
                    state.fence_installed = false;
                }
                state.token = Some(token);
            }
            return;
        }
        self.next_generation += 1;
        let epoch = token.member_epoch;
        let mut state = Shard::new(now, Some(token), self.next_generation);
        let waiting_for_old = self.busy(shard);
        if waiting_for_old {
            state.phase = Phase::WaitingForOld;
        }
        self.shards.insert(shard, state);
        if !waiting_for_old {
            self.ready.push_back(shard);
        }
        out.push(Command::Own { shard, epoch });
        self.hooks.assigned.push(shard);
    }

    /// Stop reading `shard`: drain its running job, then report it.
    pub(crate) fn revoke(&mut self, now: Millis, shard: u32) -> Vec<Command> {
        let mut out = Vec::new();
        let busy = self.busy(shard);
        let covered = self
            .shards
            .get(&shard)
            .and_then(|s| self.wait_covering(shard, s.generation));
        match self.shards.get_mut(&shard) {
            Some(state) if state.revoking => state.reassign = None,
            // Not ours: nothing to drain, unless a job of an earlier (fenced) ownership still runs.
            None => {
                out.push(Command::Report(Report::Draining { shard, job: None }));
                if self.hooks.unanswered.contains_key(&shard) {
                    // Drained already; REVOKED goes out when its hook returns.
                } else if busy {
                    self.next_generation += 1;
                    let mut state = Shard::new(now, None, self.next_generation);
                    state.revoking = true;
                    state.phase = Phase::WaitingForOld;
                    self.shards.insert(shard, state);
                } else {
                    out.push(Command::Report(Report::Revoked { shard }));
                }
            }
            Some(state) => {
                state.revoking = true;
                let running = state.running();
                let job = running.filter(|job| self.jobs.get(job).is_some_and(|j| !j.wait));
                out.push(Command::Report(Report::Draining { shard, job }));
                match state.phase {
                    Phase::Running(_) => {
                        if let Some(job) = job {
                            out.push(Command::Stop { job });
                            if let Some(j) = self.jobs.get_mut(&job) {
                                j.yielded = true;
                            }
                        }
                        // Waited on (riding, or idle): reported once the wait ended too.
                        if covered.is_some() {
                            self.interrupt_wait(&mut out);
                        }
                    }
                    // The old ownership's job ends first (`back_from_job` reports then).
                    Phase::WaitingForOld => {}
                    _ => {
                        self.ready.retain(|s| *s != shard);
                        if let Some(wait) = covered {
                            // Its job ended while it rode the wait, which still covers it: reported
                            // once that ended too.
                            state.phase = Phase::Running(wait);
                            self.interrupt_wait(&mut out);
                        } else {
                            self.finish_revoke(now, shard, &mut out);
                        }
                    }
                }
            }
        }
        self.dispatch(now, &mut out);
        self.finish(&mut out);
        out
    }

    /// Ownership of everything is lost: abort, forget every shard, report nothing.
    pub(crate) fn fence(&mut self, now: Millis) -> Vec<Command> {
        let mut out = Vec::new();
        // Hooks see events in order: what was assigned or drained before the fence first.
        self.flush_hooks(&mut out);
        self.hooks.fence_generation += 1;
        self.hooks.unanswered.clear();
        let lost: Vec<u32> = self
            .shards
            .iter()
            .filter(|(_, s)| s.token.is_some())
            .map(|(i, _)| *i)
            .collect();
        if self.hooks.set.any {
            out.push(Command::CallHook(HookCall::Fenced(lost.clone())));
        }
        out.push(Command::Probe(ProbeEvent::Aborting));
        for shard in lost {
            out.push(Command::Disown { shard });
        }
        self.shards.clear();
        self.ready.clear();
        self.idle_since = None;
        self.woken.clear();
        self.lapsed = true;
        self.deadline = now;
        if !self.jobs.is_empty() {
            out.push(Command::AbortAll);
        }
        self.finish(&mut out);
        out
    }

    /// The heartbeat loop's deadline is `until` after `confirmations` accepted heartbeats: a later deadline
    /// or a new confirmation renews the lease (shards whose group was missing may start again once their
    /// backoff is over); a deadline withdrawn before its time is a lapse until renewed.
    pub(crate) fn observe_lease(
        &mut self,
        now: Millis,
        until: Millis,
        confirmations: u64,
    ) -> Vec<Command> {
        let mut out = Vec::new();
        if until > self.lease.until || confirmations > self.lease.confirmations {
            self.lease.confirmations = confirmations;
            self.lease.lost = false;
            self.lease.until = until;
            self.lease_renewed(now, until, &mut out);
        }
        self.lease.until = until;
        if !self.lease.lost && until <= now {
            self.lease.lost = true;
            self.deadline = self.deadline.min(now);
            self.lapse(&mut out);
        }
        self.finish(&mut out);
        out
    }

    fn lease_renewed(&mut self, now: Millis, deadline: Millis, out: &mut Vec<Command>) {
        self.renew(now, deadline);
        let confirmed: Vec<u32> = self
            .shards
            .iter()
            .filter(|(_, s)| matches!(s.phase, Phase::Unconfirmed(_)))
            .map(|(i, _)| *i)
            .collect();
        for shard in confirmed {
            let phase = match self.shards[&shard].phase {
                Phase::Unconfirmed(Some(at)) => Phase::Backoff(at),
                _ => Phase::Queued,
            };
            self.place(shard, phase);
        }
        self.dispatch(now, out);
    }

    fn lapse(&mut self, out: &mut Vec<Command>) {
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

    /// A shard's job ended with `report` (`None`: aborted or panicked before it could say).
    pub(crate) fn job_ended(
        &mut self,
        now: Millis,
        job: JobId,
        report: Option<JobReport>,
    ) -> Vec<Command> {
        let Some(ended) = self.jobs.get(&job) else {
            return Vec::new();
        };
        if ended.wait {
            return self.wait_ended(now, job, None);
        }
        let mut out = Vec::new();
        let epoch = ended.epoch;
        let end = match ended.shards.first() {
            Some(&(shard, generation)) => self.absorb(
                now,
                shard,
                generation,
                epoch,
                report.unwrap_or_default(),
                &mut out,
            ),
            None => JobEnd::Aborted,
        };
        self.job_ended_as(now, job, end, &mut out);
        self.finish(&mut out);
        out
    }

    /// Takes what a shard's job found into the shard, and says how it ended.
    fn absorb(
        &mut self,
        now: Millis,
        shard: u32,
        generation: u64,
        epoch: i64,
        mut report: JobReport,
        out: &mut Vec<Command>,
    ) -> JobEnd {
        let Some(state) = self
            .shards
            .get_mut(&shard)
            .filter(|s| s.generation == generation && s.token.is_some())
        else {
            // A job of a fenced ownership: what it did is not this ownership's.
            return JobEnd::Aborted;
        };
        // The fence of the grant the job was given: a newer grant of the shard since needs its own.
        if report.fence_installed && state.token.as_ref().map(|t| t.member_epoch) == Some(epoch) {
            state.fence_installed = true;
        }
        if report.fence_lost {
            // Installing it again tells a newer owner (refused again) from a loss (installed again).
            state.fence_installed = false;
        }
        let progress = &mut state.progress;
        if report.fetched > 0 {
            progress.last_delivered = report
                .last_delivered
                .take()
                .or(progress.last_delivered.take());
            progress.dirty = true;
        }
        if let Some(acked) = report.last_acked.take() {
            progress.last_acked = Some(acked);
            progress.dirty = true;
        }
        if let Some(id) = report.read_up_to.take() {
            state.watch_from = Some(id.into());
        }
        if report.missing_group {
            // The group comes back at a position of its own: watch from there.
            state.watch_from = None;
        }
        state.deferred = std::mem::take(&mut report.deferred);
        progress.pending = (report.left_pending + state.deferred.len()) as u64;
        if state.revoking {
            return JobEnd::Aborted;
        }
        state.read_mode = report
            .next_read_mode
            .clone()
            .unwrap_or_else(ReadMode::claim_own);
        out.push(Command::Probe(ProbeEvent::ReadResult {
            shard,
            failed: report.error.is_some(),
        }));
        let (end, backoff) = end_of(now, &report, &state.read_mode, state.error_backoff);
        state.error_backoff = backoff;
        if let Some(error) = &report.error {
            if let Some(not_logged) = self.read_warnings.admit(now.into()) {
                tracing::warn!(shard, %error, ?backoff, not_logged, "shard read failed; backing off");
            }
        }
        if matches!(end, JobEnd::MissingGroup { .. }) {
            state.recreate_group = true;
        }
        end
    }

    /// The rotation's half of a job's end, once its meaning is known.
    fn job_ended_as(&mut self, now: Millis, job: JobId, end: JobEnd, out: &mut Vec<Command>) {
        let Some(ended) = self.jobs.remove(&job) else {
            return;
        };
        let Some(&(shard, generation)) = ended.shards.first() else {
            return;
        };
        let (next, retry_at) = match end {
            JobEnd::Data | JobEnd::Empty => (Next::Read, None),
            JobEnd::Deferred { retry_at } => (Next::Retry, Some(retry_at)),
            JobEnd::Claiming | JobEnd::Expired | JobEnd::Aborted => (Next::Read, None),
            JobEnd::Failed { retry_at } | JobEnd::MissingGroup { retry_at } => {
                (Next::Read, Some(retry_at))
            }
            JobEnd::ReadFailed { retry_at } => (Next::Read, Some(retry_at)),
        };
        let claim = matches!(
            end,
            JobEnd::Claiming
                | JobEnd::Expired
                | JobEnd::Aborted
                | JobEnd::Failed { .. }
                | JobEnd::MissingGroup { .. }
        );
        let current = self
            .shards
            .get(&shard)
            .is_some_and(|s| s.generation == generation && !s.revoking);
        let riding = self.wait_covering(shard, generation);
        self.woken.remove(&shard);
        let mut next = next;
        if let Some(state) = self
            .shards
            .get_mut(&shard)
            .filter(|s| s.generation == generation)
        {
            state.idle = end == JobEnd::Empty;
            let queued = std::mem::take(&mut state.queued);
            let queued_more = std::mem::take(&mut state.queued_more);
            let clean = matches!(end, JobEnd::Data | JobEnd::Empty | JobEnd::Deferred { .. })
                && !state.claim_owed
                && state.read_mode == ReadMode::Live;
            if !queued.is_empty() && clean {
                // What the rode wait delivered comes after this job's entries (and what it deferred).
                state.deferred.extend(queued);
                state.more = queued_more;
                if next == Next::Read {
                    next = Next::Delivered;
                }
            } else if !queued.is_empty() {
                // This job's entries may be pending still, older than the queued ones: a claim of our own
                // pending entries gets them all, in id order.
                state.claim_owed = true;
                state.read_mode = ReadMode::claim_own();
            }
            if let Some(wait) = riding {
                // Still covered: what is left of its turn is the wait's.
                state.phase = Phase::Running(wait);
            }
        }
        let unconfirmed = current && matches!(end, JobEnd::MissingGroup { .. });
        self.back_from_job(
            now,
            shard,
            generation,
            next,
            claim,
            retry_at,
            unconfirmed,
            out,
        );
        let queued = self
            .shards
            .get(&shard)
            .is_some_and(|s| s.phase == Phase::Queued);
        let (idle, one_batch) = self
            .shards
            .get(&shard)
            .map_or((false, false), |s| (self.waits(s, now), s.one_batch_next()));
        match riding {
            // It rode the wait and has nothing else to do: the wait goes on covering it.
            Some(wait) if current && queued && idle => self.place(shard, Phase::Running(wait)),
            // Covered by the wait and needs a job that reads: waits for the wait's end. (A job of one
            // short delivery starts now, riding the wait on.)
            Some(_) if current && queued && !one_batch => self.park(shard, out),
            // Back idle while the wait runs: covered by the next.
            None if current && queued && idle && self.wait.is_some() => self.park(shard, out),
            _ => {}
        }
        self.dispatch(now, out);
    }

    /// The idle wait ended with `report` (`None`: aborted before it could say); shards it saw new entries
    /// on run next, to read them. A shard that rode it (its job still runs) gets what it delivered after
    /// that job.
    pub(crate) fn wait_ended(
        &mut self,
        now: Millis,
        job: JobId,
        report: Option<WaitReport>,
    ) -> Vec<Command> {
        let mut out = Vec::new();
        let Some(ended) = self.jobs.remove(&job) else {
            return out;
        };
        self.wait = None;
        self.wait_interrupted = false;
        self.unpark();
        let (mut woke, mut delivered) = (Vec::new(), Vec::new());
        self.follow_up = report
            .as_ref()
            .is_some_and(|report| !report.failed() && report.delivered.len() >= 2);
        if let Some(mut report) = report {
            if let Some(error) = &report.error {
                if let Some(not_logged) = self.wait_warnings.admit(now.into()) {
                    tracing::warn!(%error, not_logged, "idle wait failed; polling the shards one by one");
                }
            }
            if report.failed() {
                // Polled one by one, to find the shard at fault.
                for &(shard, _) in &ended.shards {
                    if let Some(state) = self.waited(&ended, shard) {
                        state.idle = false;
                    }
                }
            }
            for (shard, id) in report.watch_from.drain(..) {
                if let Some(state) = self.waited(&ended, shard) {
                    state.watch_from = Some(id.into());
                }
            }
            // Before a lost reply's claim: what came with the reply is handled first, then the claim.
            for (shard, entries) in report.delivered.drain(..) {
                let full = entries.len() >= report.count;
                let riding = self.riding(&ended, shard);
                let Some(state) = self.waited(&ended, shard) else {
                    continue;
                };
                if state.claim_owed {
                    // Older entries of ours may be pending (a job that failed while the shard rode the
                    // wait): the claim gets these too, after them.
                    continue;
                }
                if riding {
                    state.queued.extend(entries);
                    state.queued_more |= full || state.queued.len() >= report.count;
                    continue;
                }
                state.deferred.extend(entries);
                state.more = full;
                if state.next != Next::Retry {
                    state.next = Next::Delivered;
                }
                delivered.push(shard);
            }
            if report.in_doubt {
                self.claim_after_lost_wait(&ended);
            }
            for shard in report.new_entries.drain(..) {
                let riding = self.riding(&ended, shard);
                if let Some(state) = self.waited(&ended, shard).filter(|_| !riding) {
                    // Watched from the group's position again unless the next read gets the new entries
                    // (another consumer may have taken them).
                    state.watch_from = None;
                    state.idle = false;
                    // The next wait holds back for its job (a short delivery's job most often ends
                    // within the hold, and one wait after it costs least); one that outlasts the hold
                    // rides that wait.
                    woke.push(shard);
                    self.woken.insert(shard, ());
                }
            }
        } else {
            // Aborted or panicked: a group read may have delivered what nobody saw.
            self.claim_after_lost_wait(&ended);
        }
        for (shard, generation) in ended.shards {
            let waited = self
                .shards
                .get(&shard)
                .filter(|s| s.generation == generation)
                .map(|s| s.phase);
            match waited {
                // Riding: its job runs on. Its job ended while it rode, and it needs another (or backs
                // off): it was parked, or waits, with what that job left.
                Some(phase) if phase != Phase::Running(job) && !self.shards[&shard].revoking => {
                    continue
                }
                _ => {}
            }
            let next = match self.shards.get(&shard) {
                Some(state) if delivered.contains(&shard) => state.next,
                _ if woke.contains(&shard) => Next::Retry,
                _ => Next::Read,
            };
            self.back_from_job(now, shard, generation, next, false, None, false, &mut out);
        }
        self.dispatch(now, &mut out);
        self.finish(&mut out);
        out
    }

    /// Whether `shard`, waited on by the ended wait `job`, rode it: its job still runs.
    fn riding(&self, job: &Job, shard: u32) -> bool {
        let Some(&(_, generation)) = job.shards.iter().find(|(s, _)| *s == shard) else {
            return false;
        };
        self.shards
            .get(&shard)
            .filter(|s| s.generation == generation)
            .and_then(Shard::running)
            .and_then(|running| self.jobs.get(&running))
            .is_some_and(|running| !running.wait)
    }

    /// Entries the ended wait may have delivered are pending for us, unseen: each of its shards claims its
    /// own pending entries (in order) before it reads or waits again.
    fn claim_after_lost_wait(&mut self, ended: &Job) {
        for &(shard, _) in &ended.shards {
            if let Some(state) = self.waited(ended, shard) {
                state.read_mode = ReadMode::claim_own();
                state.claim_owed = true;
                state.idle = false;
            }
        }
    }

    /// The state of `shard` if it is still the ownership the ended wait `job` waited on.
    fn waited(&mut self, job: &Job, shard: u32) -> Option<&mut Shard> {
        let generation = job.shards.iter().find(|(s, _)| *s == shard)?.1;
        self.shards
            .get_mut(&shard)
            .filter(|s| s.generation == generation)
    }

    /// The revoked hook of `generation` returned for `shards`: REVOKED goes out, unless a fence came since
    /// (or the shard was granted and revoked again: that revocation reports on its own).
    pub(crate) fn hook_done(&mut self, generation: u64, shards: Vec<u32>) -> Vec<Command> {
        let mut out = Vec::new();
        self.hooks.pending = self.hooks.pending.saturating_sub(1);
        // A fence came since: nothing of that generation is reported.
        let shards = if generation == self.hooks.fence_generation {
            shards
        } else {
            Vec::new()
        };
        for shard in shards {
            let left = self.hooks.unanswered.get_mut(&shard).map(|n| {
                *n = n.saturating_sub(1);
                *n
            });
            if left == Some(0) {
                self.hooks.unanswered.remove(&shard);
            }
            // Granted and revoked again since: REVOKED once, after that drain's hook.
            let again =
                left.is_some_and(|n| n > 0) || self.shards.get(&shard).is_some_and(|s| s.revoking);
            if !again {
                out.push(Command::Report(Report::Revoked { shard }));
            }
        }
        self.finish(&mut out);
        out
    }

    /// The driver took every input that was queued: the hooks hear of what was assigned and drained since
    /// the last settle, drained first (as Kafka's rebalance listener does).
    pub(crate) fn settle(&mut self) -> Vec<Command> {
        let mut out = Vec::new();
        self.flush_hooks(&mut out);
        self.finish(&mut out);
        out
    }

    fn flush_hooks(&mut self, out: &mut Vec<Command>) {
        if !self.hooks.set.any {
            self.hooks.assigned.clear();
            return;
        }
        if !self.hooks.revoked.is_empty() {
            let shards = std::mem::take(&mut self.hooks.revoked);
            self.hooks.pending += 1;
            let generation = self.hooks.fence_generation;
            out.push(Command::CallHook(HookCall::Revoked(generation, shards)));
        }
        if !self.hooks.assigned.is_empty() {
            let shards = std::mem::take(&mut self.hooks.assigned);
            out.push(Command::CallHook(HookCall::Assigned(shards)));
        }
    }

    /// Time passed: backoffs end, the deadline may have lapsed.
    pub(crate) fn tick(&mut self, now: Millis) -> Vec<Command> {
        let mut out = Vec::new();
        if now >= self.deadline {
            self.lapse(&mut out);
        } else if self.wait.is_some() && !self.may_wait(now) && !self.wait_interrupted {
            // A wait must be over before the deadline (see `WAIT_MARGIN`).
            self.wait_interrupted = true;
            self.interrupt_wait(&mut out);
        }
        let due: Vec<u32> = self
            .shards
            .iter()
            .filter(|(_, s)| s.retry_at().is_some_and(|at| at <= now))
            .map(|(i, _)| *i)
            .collect();
        for shard in due {
            let phase = match self.shards[&shard].phase {
                Phase::Unconfirmed(_) => Phase::Unconfirmed(None),
                _ => Phase::Queued,
            };
            self.place(shard, phase);
        }
        self.dispatch(now, &mut out);
        self.finish(&mut out);
        out
    }

    /// Start no job until [`resume`](Self::resume); shards stay owned, running jobs hand theirs back
    /// after their batch.
    pub(crate) fn pause(&mut self, _now: Millis) -> Vec<Command> {
        let mut out = Vec::new();
        self.paused = true;
        self.interrupt_wait(&mut out);
        self.finish(&mut out);
        out
    }

    /// Start jobs again, polling the whole rotation first.
    pub(crate) fn resume(&mut self, now: Millis) -> Vec<Command> {
        let mut out = Vec::new();
        self.paused = false;
        for state in self.shards.values_mut() {
            state.idle = false;
        }
        self.dispatch(now, &mut out);
        self.finish(&mut out);
        out
    }

    /// Start nothing more and stop running jobs after their handler; [`Command::Stopped`] once every job
    /// ended and every revoked hook returned.
    pub(crate) fn shutdown(&mut self, _now: Millis) -> Vec<Command> {
        let mut out = Vec::new();
        self.closing = true;
        for (job, state) in self.jobs.iter_mut().filter(|(_, j)| !j.wait) {
            state.yielded = true;
            out.push(Command::Stop { job: *job });
        }
        self.interrupt_wait(&mut out);
        self.finish(&mut out);
        out
    }

    /// Progress reports of the shards whose reads or acks moved since the last call.
    pub(crate) fn progress(&mut self) -> Vec<Command> {
        let mut out = Vec::new();
        let jobs = &self.jobs;
        for (&shard, state) in self.shards.iter_mut() {
            if !state.progress.dirty || state.revoking || state.token.is_none() {
                continue;
            }
            state.progress.dirty = false;
            let job = state
                .running()
                .filter(|job| jobs.get(job).is_some_and(|j| !j.wait));
            out.push(Command::Report(Report::Progress {
                shard,
                last_delivered: state.progress.last_delivered.clone(),
                last_acked: state.progress.last_acked.clone(),
                pending: state.progress.pending,
                job,
            }));
        }
        out
    }

    /// When the driver must call [`tick`](Self::tick) next: the earliest backoff end or the deadline, or
    /// soon while a renewed lease is awaited.
    pub(crate) fn next_wake(&self, now: Millis) -> Option<Millis> {
        let poll = self
            .awaits_renewal()
            .then(|| now.plus_duration(RENEWAL_POLL));
        let hold = self
            .idle_since
            .filter(|_| self.holds_wait(now))
            .map(|since| since.plus_duration(WAIT_HOLD));
        [self.next_timer(), poll, hold].into_iter().flatten().min()
    }

    /// The earliest backoff end, the end of a running wait's time (see [`WAIT_MARGIN`]) or the deadline.
    fn next_timer(&self) -> Option<Millis> {
        let backoff = self.shards.values().filter_map(Shard::retry_at).min();
        let deadline = (!self.lapsed).then_some(self.deadline);
        let wait_end = deadline
            .filter(|_| self.wait.is_some() && !self.wait_interrupted)
            .map(|deadline| deadline.minus_duration(WAIT_MARGIN));
        [backoff, wait_end, deadline].into_iter().flatten().min()
    }

    /// The deadline lapsed with shards owned, or a shard waits for a confirmation of its ownership.
    fn awaits_renewal(&self) -> bool {
        (self.lapsed && !self.shards.is_empty())
            || self
                .shards
                .values()
                .any(|s| matches!(s.phase, Phase::Unconfirmed(_)))
    }

    /// Whether [`pause`](Self::pause) is in force.
    pub(crate) fn is_paused(&self) -> bool {
        self.paused
    }

    /// Jobs running now, the idle wait included.
    #[cfg(test)]
    pub(crate) fn running(&self) -> usize {
        self.jobs.len()
    }

    /// Shards owned (not revoking).
    #[cfg(test)]
    pub(crate) fn owned(&self) -> std::collections::BTreeSet<u32> {
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

    fn unpark(&mut self) {
        let parked: Vec<u32> = self
            .shards
            .iter()
            .filter(|(_, s)| s.phase == Phase::Parked)
            .map(|(i, _)| *i)
            .collect();
        for shard in parked {
            self.place(shard, Phase::Queued);
        }
    }

    /// Puts `shard` in `phase` (a queued shard at the back of the ready queue).
    fn place(&mut self, shard: u32, phase: Phase) {
        let Some(state) = self.shards.get_mut(&shard) else {
            return;
        };
        if state.revoking {
            return;
        }
        let was_queued = state.phase == Phase::Queued;
        state.phase = phase;
        if phase == Phase::Queued && !was_queued {
            self.ready.push_back(shard);
        } else if phase != Phase::Queued && was_queued {
            self.ready.retain(|s| *s != shard);
        }
    }

    /// `shard` waits for the running wait to end, which is interrupted for it (once per wait is enough).
    fn park(&mut self, shard: u32, out: &mut Vec<Command>) {
        self.place(shard, Phase::Parked);
        if !self.wait_interrupted {
            self.wait_interrupted = true;
            self.interrupt_wait(out);
        }
    }

    fn interrupt_wait(&mut self, out: &mut Vec<Command>) {
        if let Some(job) = self.wait {
            if !out.contains(&Command::InterruptWait { job }) {
                out.push(Command::InterruptWait { job });
            }
        }
    }

    /// A job (or the wait) of `(shard, generation)` ended: the shard goes on with `next` (claiming first if
    /// `claim`), after `retry_at`, or waits for a renewed lease if `unconfirmed`.
    #[allow(clippy::too_many_arguments)]
    fn back_from_job(
        &mut self,
        now: Millis,
        shard: u32,
        generation: u64,
        next: Next,
        claim: bool,
        retry_at: Option<Millis>,
        unconfirmed: bool,
        out: &mut Vec<Command>,
    ) {
        let busy = self.busy(shard);
        let Some(state) = self.shards.get_mut(&shard) else {
            return;
        };
        if state.generation != generation {
            // A job of a fenced ownership ended: the new ownership may start (or be reported) now.
            if state.phase == Phase::WaitingForOld && !busy {
                if state.revoking {
                    self.finish_revoke(now, shard, out);
                } else {
                    self.place(shard, Phase::Queued);
                }
            }
            return;
        }
        if state.revoking {
            // Reported once nothing covers it any more (the wait it rode, or its job).
            if !busy {
                self.finish_revoke(now, shard, out);
            }
            return;
        }
        // A claim still owed (a lapse while the job ran) is not forgotten by a read that ended well.
        state.next = next;
        if claim {
            state.claim_owed = true;
        }
        let retry_at = retry_at.filter(|at| *at > now);
        state.phase = match (unconfirmed, retry_at) {
            (true, at) => Phase::Unconfirmed(at),
            (false, Some(at)) => Phase::Backoff(at),
            (false, None) => Phase::Queued,
        };
        if state.phase == Phase::Queued {
            self.ready.push_back(shard);
        }
    }

    fn finish_revoke(&mut self, now: Millis, shard: u32, out: &mut Vec<Command>) {
        let Some(state) = self.shards.remove(&shard) else {
            return;
        };
        self.woken.remove(&shard);
        self.ready.retain(|s| *s != shard);
        if state.token.is_some() {
            out.push(Command::Disown { shard });
            out.push(Command::Probe(ProbeEvent::Forget { shard }));
            tracing::debug!(shard, "shard revoked");
        }
        if state.token.is_some() && self.hooks.set.revoked {
            self.hooks.revoked.push(shard);
            *self.hooks.unanswered.entry(shard).or_default() += 1;
        } else {
            out.push(Command::Report(Report::Revoked { shard }));
        }
        if let Some(token) = state.reassign {
            self.assign_inner(now, shard, token, out);
        }
    }

    /// After every input: yields asked of running jobs, and whether the scheduler has stopped.
    fn finish(&mut self, out: &mut Vec<Command>) {
        if !self.ready.is_empty() || self.paused {
            for (job, state) in self.jobs.iter_mut() {
                if !state.wait && !state.yielded {
                    state.yielded = true;
                    out.push(Command::Yield { job: *job });
                }
            }
        }
        if self.closing
            && !self.stopped
            && self.jobs.is_empty()
            && self.hooks.pending == 0
            && self.hooks.revoked.is_empty()
        {
            self.stopped = true;
            out.push(Command::Stopped);
        }
    }

    fn may_start(&self, now: Millis) -> bool {
        !self.paused && !self.closing && !self.lapsed && now < self.deadline
    }

    /// Whether an idle wait may run now: not within [`WAIT_MARGIN`] of the deadline.
    fn may_wait(&self, now: Millis) -> bool {
        now.plus_duration(WAIT_MARGIN) < self.deadline
    }

    fn reclaim_due(&self, state: &Shard, now: Millis) -> bool {
        now >= state.reclaimed_at.plus(self.reclaim_every)
    }

    fn new_job(
        &mut self,
        shards: Vec<(u32, u64)>,
        wait: bool,
        one_batch: bool,
        epoch: i64,
    ) -> JobId {
        let job = JobId(self.next_job);
        self.next_job += 1;
        self.jobs.insert(
            job,
            Job {
                shards,
                wait,
                one_batch,
                epoch,
                yielded: false,
            },
        );
        job
    }

    /// The running wait, if it covers `(shard, generation)`.
    fn wait_covering(&self, shard: u32, generation: u64) -> Option<JobId> {
        self.wait.filter(|wait| {
            self.jobs
                .get(wait)
                .is_some_and(|j| j.shards.contains(&(shard, generation)))
        })
    }

    /// Whether `state`'s running job handles one short delivery and reads nothing, and the shard may be
    /// watched by the next wait meanwhile: nothing queued from an earlier wait up to a batch, no claim
    /// owed, no reclaim due.
    fn rides(&self, state: &Shard, now: Millis) -> bool {
        let one_batch = state
            .running()
            .and_then(|job| self.jobs.get(&job))
            .is_some_and(|job| !job.wait && job.one_batch);
        one_batch
            && !state.revoking
            && state.token.is_some()
            && !state.claim_owed
            && !state.queued_more
            && !self.reclaim_due(state, now)
    }

    /// A queued shard whose next job handles a short delivery: the wait starts after it, to cover it.
    fn rider_ready(&self) -> bool {
        self.ready.iter().any(|shard| {
            self.shards
                .get(shard)
                .is_some_and(|s| s.phase == Phase::Queued && s.one_batch_next())
        })
    }

    fn dispatch(&mut self, now: Millis, out: &mut Vec<Command>) {
        if !self.may_start(now) {
            return;
        }
        self.note_idle(now);
        let mut skipped = 0;
        // A short delivery's job starts first, so that the wait covers its shard too. Such a shard is
        // never put back below, so `rider` changes only when one leaves the queue.
        let mut rider = self.rider_ready();
        let mut rider_left = false;
        // Only a wait started here ends the hold within this loop.
        let mut holds = self.holds_wait(now);
        while self.jobs.len() < self.workers && skipped <= self.ready.len() {
            if rider_left {
                rider = self.rider_ready();
                rider_left = false;
            }
            if !holds && !rider {
                self.start_wait(now, out);
                holds = self.holds_wait(now);
            }
            if self.jobs.len() >= self.workers {
                return;
            }
            let Some(shard) = self.ready.pop_front() else {
                break;
            };
            // Within the wait's margin of the deadline, idle shards wait for the renewed lease.
            let held = holds || rider || !self.may_wait(now);
            let Some(state) = self.shards.get(&shard) else {
                continue;
            };
            rider_left = rider && state.phase == Phase::Queued && state.one_batch_next();
            if state.phase != Phase::Queued || state.revoking {
                continue;
            }
            if held && self.waits(state, now) {
                // Not polled: it waits for the wait, which holds back for the running reads (or starts
                // once a short delivery's job did).
                self.ready.push_back(shard);
                skipped += 1;
                continue;
            }
            let reclaim_due = self.reclaim_due(state, now);
            let covered = self.wait_covering(shard, state.generation);
            let busy = self.busy(shard);
            let Some(state) = self.shards.get_mut(&shard) else {
                continue;
            };
            if busy && !(covered.is_some() && state.one_batch_next()) {
                // The wait it rode covers it still: it starts when that wait ends (unless its next job
                // reads nothing, and rides that wait too). Else an earlier ownership's job runs.
                state.phase = if covered.is_some() {
                    Phase::Parked
                } else {
                    Phase::WaitingForOld
                };
                if covered.is_some() && !self.wait_interrupted {
                    self.wait_interrupted = true;
                    self.interrupt_wait(out);
                }
                skipped += 1;
                continue;
            }
            let Some(token) = state.token.clone() else {
                continue;
            };
            let kind = match state.next {
                _ if state.claim_owed => {
                    state.claim_owed = false;
                    state.next = Next::Read;
                    JobKind::ClaimOwn
                }
                Next::Retry => JobKind::Retry,
                Next::Delivered => JobKind::Delivered,
                Next::Read if reclaim_due => {
                    state.reclaimed_at = now;
                    JobKind::ReclaimZombies
                }
                Next::Read => JobKind::Read,
            };
            let read_mode = match (kind, &state.read_mode) {
                (JobKind::ClaimOwn, ReadMode::Live) => ReadMode::claim_own(),
                (_, read_mode) => read_mode.clone(),
            };
            // A short delivery is all there was: handled as one batch, reading nothing, while the shard
            // rides the next wait (see `rides`).
            let one_batch = kind == JobKind::Delivered && !state.more;
            let generation = state.generation;
            let epoch = token.member_epoch;
            let plan = JobPlan {
                job: JobId(self.next_job),
                shard,
                token,
                kind,
                install_fence: !state.fence_installed,
                read_mode,
                deferred: std::mem::take(&mut state.deferred),
                reclaim: kind == JobKind::ReclaimZombies,
                recreate_group: std::mem::take(&mut state.recreate_group),
                max_turns: if one_batch { 1 } else { MAX_TURNS },
            };
            let job = self.new_job(vec![(shard, generation)], false, one_batch, epoch);
            if let Some(state) = self.shards.get_mut(&shard) {
                state.phase = Phase::Running(job);
            }
            out.push(Command::StartJob(plan));
        }
        if !self.holds_wait(now) {
            self.start_wait(now, out);
        }
    }

    /// Whether `state` is for the idle wait to watch rather than to be polled: its last read found
    /// nothing new, and it needs nothing else (a retry, a claim, a reclaim).
    fn waits(&self, state: &Shard, now: Millis) -> bool {
        state.idle
            && state.next == Next::Read
            && !state.claim_owed
            && now < state.reclaimed_at.plus(self.reclaim_every)
    }

    /// Starts (or ends) the hold of idle shards for the reads still to come back (see `idle_since`).
    fn note_idle(&mut self, now: Millis) {
        let idle = self.wait.is_none()
            && self
                .ready
                .iter()
                .any(|i| self.shards.get(i).is_some_and(|s| self.waits(s, now)));
        if !idle {
            self.idle_since = None;
        } else if self.idle_since.is_none() {
            self.idle_since = Some(now);
        }
    }

    /// Whether the wait holds back, not polling its idle shards either, for the reads of the shards the
    /// last wait woke, for [`WAIT_HOLD`] at most (see `idle_since`).
    fn holds_wait(&self, now: Millis) -> bool {
        let Some(since) = self.idle_since.filter(|_| self.wait.is_none()) else {
            return false;
        };
        now < since.plus_duration(WAIT_HOLD)
            && self.woken.keys().any(|shard| {
                self.shards
                    .get(shard)
                    .is_some_and(|s| !s.revoking && s.token.is_some())
            })
    }

    /// One wait over every queued idle shard (its last read found nothing new) that only needs new
    /// entries, once the reads running have ended (or [`WAIT_HOLD`] passed), unless the shards that need
    /// a worker for something else would be left without one.
    fn start_wait(&mut self, now: Millis, out: &mut Vec<Command>) {
        if self.wait.is_some() || !self.may_wait(now) {
            return;
        }
        let eligible = |s: &Shard| self.waits(s, now);
        let free = self.workers - self.jobs.len();
        let others = self
            .ready
            .iter()
            .filter(|i| self.shards.get(i).is_some_and(|s| !eligible(s)))
            .count();
        if free == 0 || others >= free {
            return;
        }
        let mut shards = Vec::with_capacity(self.shards.len());
        let mut taken = Vec::with_capacity(self.shards.len());
        // The queue without the shards the wait takes.
        let mut rest = VecDeque::with_capacity(self.ready.len());
        for shard in &self.ready {
            match self.shards.get(shard) {
                Some(state) if eligible(state) && !self.busy(*shard) => {
                    shards.push((*shard, state.watch_from.clone()));
                    taken.push((*shard, state.generation));
                }
                _ => rest.push_back(*shard),
            }
        }
        let idle = shards.len();
        // Shards whose job handles one short delivery ride along (their phase stays their job's): covered,
        // no later wait holds back for them.
        for (shard, state) in &self.shards {
            if self.rides(state, now) {
                shards.push((*shard, state.watch_from.clone()));
                taken.push((*shard, state.generation));
            }
        }
        for (shard, _) in &shards[idle..] {
            self.woken.remove(shard);
        }
        if shards.is_empty() {
            return;
        }
        self.ready = rest;
        let job = self.new_job(taken, true, false, 0);
        for (shard, _) in &shards[..idle] {
            if let Some(state) = self.shards.get_mut(shard) {
                state.phase = Phase::Running(job);
            }
        }
        self.wait = Some(job);
        self.idle_since = None;
        out.push(Command::StartWait {
            job,
            shards,
            follow_up: self.follow_up,
        });
    }
}
