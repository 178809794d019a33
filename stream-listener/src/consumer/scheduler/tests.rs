//! Rule-named tests of the pure scheduler, and a property test over random input sequences.
//!
//! The rotation's rules (which shard runs when) are written against [`ShardScheduler`] below: the machine
//! with the rotation's inputs and outputs only, a job's end given as its meaning ([`JobEnd`], which
//! `job_end.rs` tests on its own). The rules of the facts the machine keeps for the driver (plans, reports,
//! hooks, yields) are at the end, against the machine itself.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use proptest::prelude::*;

use super::ShardScheduler as Machine;
use super::*;

/// The rotation's outputs, as these tests name them.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Output {
    Start {
        job: JobId,
        shard: u32,
        epoch: i64,
        kind: JobKind,
        /// One batch, no read: its shard may ride the wait.
        one_batch: bool,
    },
    StartWait {
        job: JobId,
        shards: Vec<u32>,
    },
    InterruptWait {
        job: JobId,
    },
    Revoked {
        shard: u32,
    },
    AbortAll,
    Stopped,
}

fn rotation(commands: Vec<Command>) -> Vec<Output> {
    commands
        .into_iter()
        .filter_map(|c| match c {
            Command::StartJob(plan) => Some(Output::Start {
                job: plan.job,
                shard: plan.shard,
                epoch: plan.token.member_epoch,
                kind: plan.kind,
                one_batch: plan.max_turns == 1,
            }),
            Command::StartWait { job, shards, .. } => Some(Output::StartWait {
                job,
                shards: shards.into_iter().map(|(s, _)| s).collect(),
            }),
            Command::InterruptWait { job } => Some(Output::InterruptWait { job }),
            Command::Report(Report::Revoked { shard }) => Some(Output::Revoked { shard }),
            Command::AbortAll => Some(Output::AbortAll),
            Command::Stopped => Some(Output::Stopped),
            _ => None,
        })
        .collect()
}

fn token(epoch: i64) -> FencingToken {
    FencingToken {
        member_id: "m".into(),
        member_epoch: epoch,
    }
}

/// The machine seen through the rotation's inputs and outputs (and the revoked hook calls it makes, for
/// the property test to answer).
struct ShardScheduler(Machine, VecDeque<(u64, Vec<u32>)>, Vec<JobPlan>);

impl ShardScheduler {
    fn new(workers: usize, reclaim_every_ms: u64) -> Self {
        Self::with_hooks(workers, reclaim_every_ms, HooksSet::default())
    }

    fn with_hooks(workers: usize, reclaim_every_ms: u64, hooks: HooksSet) -> Self {
        Self(
            Machine::new(workers, reclaim_every_ms, hooks),
            VecDeque::new(),
            Vec::new(),
        )
    }

    fn seen(&mut self, out: Vec<Command>) -> Vec<Output> {
        for command in &out {
            if let Command::CallHook(HookCall::Revoked(generation, shards)) = command {
                self.1.push_back((*generation, shards.clone()));
            }
            if let Command::StartJob(plan) = command {
                self.2.push(plan.clone());
            }
        }
        rotation(out)
    }

    fn settle(&mut self) -> Vec<Output> {
        let out = self.0.settle();
        self.seen(out)
    }

    /// The oldest revoked hook call returns.
    fn hook_done(&mut self) -> Vec<Output> {
        let Some((generation, shards)) = self.1.pop_front() else {
            return Vec::new();
        };
        let out = self.0.hook_done(generation, shards);
        self.seen(out)
    }

    /// A job ends with `report`, as the driver hands it over.
    fn job_reported(&mut self, now: Millis, job: JobId, report: Option<JobReport>) -> Vec<Output> {
        let out = self.0.job_ended(now, job, report);
        self.seen(out)
    }

    fn assign(&mut self, now: Millis, shard: u32, epoch: i64, deadline: Millis) -> Vec<Output> {
        // As the driver does: the lease is observed (here: raised to `deadline`) before the command.
        if deadline > self.0.lease.until {
            self.0.lease.until = deadline;
            self.0.lease.lost = false;
        }
        let out = self.0.assign(now, shard, token(epoch));
        self.seen(out)
    }

    fn revoke(&mut self, now: Millis, shard: u32) -> Vec<Output> {
        let out = self.0.revoke(now, shard);
        self.seen(out)
    }

    fn fence(&mut self, now: Millis) -> Vec<Output> {
        // As the heartbeat loop does: the deadline is withdrawn before the fence is sent.
        let confirmations = self.0.lease.confirmations;
        let mut out = self.0.observe_lease(now, Millis(0), confirmations);
        out.extend(self.0.fence(now));
        self.seen(out)
    }

    fn lease_renewed(&mut self, now: Millis, deadline: Millis) -> Vec<Output> {
        let confirmations = self.0.lease.confirmations + 1;
        let until = self.0.lease.until.max(deadline);
        let out = self.0.observe_lease(now, until, confirmations);
        self.seen(out)
    }

    fn lease_lost(&mut self, now: Millis) -> Vec<Output> {
        // Withdrawn: the heartbeat loop sets the deadline to the start of time.
        let confirmations = self.0.lease.confirmations;
        let out = self.0.observe_lease(now, Millis(0), confirmations);
        self.seen(out)
    }

    fn job_ended(&mut self, now: Millis, job: JobId, end: JobEnd) -> Vec<Output> {
        if self.0.jobs.get(&job).is_some_and(|j| j.wait) {
            let out = self.0.wait_ended(now, job, None);
            return self.seen(out);
        }
        let mut out = Vec::new();
        self.0.job_ended_as(now, job, end, &mut out);
        self.0.finish(&mut out);
        self.seen(out)
    }

    fn wait_ended(&mut self, now: Millis, job: JobId, woke: &[u32], failed: bool) -> Vec<Output> {
        let report = WaitReport {
            new_entries: woke.to_vec(),
            expired: failed,
            ..WaitReport::default()
        };
        let out = self.0.wait_ended(now, job, Some(report));
        self.seen(out)
    }

    /// The wait ends with `report`, as the driver hands it over.
    fn wait_reported(&mut self, now: Millis, job: JobId, report: WaitReport) -> Vec<Output> {
        let out = self.0.wait_ended(now, job, Some(report));
        self.seen(out)
    }

    fn tick(&mut self, now: Millis) -> Vec<Output> {
        let out = self.0.tick(now);
        self.seen(out)
    }

    fn pause(&mut self, now: Millis) -> Vec<Output> {
        let out = self.0.pause(now);
        self.seen(out)
    }

    fn resume(&mut self, now: Millis) -> Vec<Output> {
        let out = self.0.resume(now);
        self.seen(out)
    }

    fn shutdown(&mut self, now: Millis) -> Vec<Output> {
        let out = self.0.shutdown(now);
        self.seen(out)
    }

    fn next_wake(&self) -> Option<Millis> {
        self.0.next_timer()
    }

    fn awaits_renewal(&self) -> bool {
        self.0.awaits_renewal()
    }

    fn running(&self) -> usize {
        self.0.running()
    }

    fn owned(&self) -> BTreeSet<u32> {
        self.0.owned()
    }
}

const FAR: Millis = Millis(1_000_000);
const RECLAIM: u64 = 10_000;

fn t(ms: u64) -> Millis {
    Millis(ms)
}

fn starts(out: &[Output]) -> Vec<(JobId, u32, JobKind)> {
    out.iter()
        .filter_map(|o| match o {
            Output::Start {
                job, shard, kind, ..
            } => Some((*job, *shard, *kind)),
            _ => None,
        })
        .collect()
}

fn start_of(out: &[Output], shard: u32) -> (JobId, JobKind) {
    starts(out)
        .into_iter()
        .find(|s| s.1 == shard)
        .map(|s| (s.0, s.2))
        .unwrap_or_else(|| panic!("no job of shard {shard} in {out:?}"))
}

fn revoked(out: &[Output]) -> Vec<u32> {
    out.iter()
        .filter_map(|o| match o {
            Output::Revoked { shard } => Some(*shard),
            _ => None,
        })
        .collect()
}

fn wait_of(out: &[Output]) -> Option<(JobId, Vec<u32>)> {
    out.iter().find_map(|o| match o {
        Output::StartWait { job, shards } => Some((*job, shards.clone())),
        _ => None,
    })
}

type Running = Vec<(JobId, u32, JobKind)>;

/// A scheduler owning `shards` until `deadline`, their first claims done (ended with data): returns it
/// and the jobs running now (reads).
fn claimed(workers: usize, shards: &[u32], deadline: Millis) -> (ShardScheduler, Running) {
    let mut s = ShardScheduler::new(workers, RECLAIM);
    let mut running = Vec::new();
    for &shard in shards {
        running.extend(starts(&s.assign(t(0), shard, 1, deadline)));
    }
    for _ in 0..shards.len() * 4 {
        let Some(pos) = running.iter().position(|j| j.2 == JobKind::ClaimOwn) else {
            break;
        };
        let (job, _, _) = running.remove(pos);
        running.extend(starts(&s.job_ended(t(0), job, JobEnd::Data)));
    }
    assert!(running.iter().all(|j| j.2 == JobKind::Read), "{running:?}");
    (s, running)
}

#[test]
fn rule_an_assigned_shard_first_claims_its_own_pending_entries() {
    let mut s = ShardScheduler::new(2, RECLAIM);
    let out = s.assign(t(0), 3, 7, FAR);
    assert_eq!(
        out,
        vec![Output::Start {
            job: JobId(0),
            shard: 3,
            epoch: 7,
            kind: JobKind::ClaimOwn,
            one_batch: false,
        }]
    );
    let out = s.job_ended(t(1), JobId(0), JobEnd::Data);
    assert_eq!(start_of(&out, 3).1, JobKind::Read);
}

#[test]
fn rule_a_claim_with_more_pending_claims_again() {
    let mut s = ShardScheduler::new(1, RECLAIM);
    let (job, _) = start_of(&s.assign(t(0), 0, 1, FAR), 0);
    let out = s.job_ended(t(1), job, JobEnd::Claiming);
    assert_eq!(start_of(&out, 0).1, JobKind::ClaimOwn);
}

#[test]
fn rule_no_more_jobs_than_workers() {
    let mut s = ShardScheduler::new(2, RECLAIM);
    let mut started = 0;
    for shard in 0..5 {
        started += starts(&s.assign(t(0), shard, 1, FAR)).len();
    }
    assert_eq!(started, 2);
    assert_eq!(s.running(), 2);
}

#[test]
fn rule_one_job_per_shard() {
    let mut s = ShardScheduler::new(4, RECLAIM);
    let out = s.assign(t(0), 0, 1, FAR);
    let (job, _) = start_of(&out, 0);
    // A new epoch for the same shard is no second job.
    assert!(starts(&s.assign(t(1), 0, 2, FAR)).is_empty());
    assert!(starts(&s.tick(t(2))).is_empty());
    let out = s.job_ended(t(3), job, JobEnd::Data);
    assert_eq!(
        out,
        vec![Output::Start {
            job: JobId(1),
            shard: 0,
            epoch: 2,
            kind: JobKind::Read,
            one_batch: false,
        }]
    );
}

#[test]
fn rule_round_robin_visits_every_shard_before_repeating() {
    let mut s = ShardScheduler::new(1, RECLAIM);
    let mut order = Vec::new();
    let mut current = start_of(&s.assign(t(0), 0, 1, FAR), 0).0;
    order.push(0);
    s.assign(t(0), 1, 1, FAR);
    s.assign(t(0), 2, 1, FAR);
    for _ in 0..8 {
        let out = s.job_ended(t(1), current, JobEnd::Data);
        let (job, shard, _) = starts(&out)[0];
        order.push(shard);
        current = job;
    }
    assert_eq!(order, vec![0, 1, 2, 0, 1, 2, 0, 1, 2]);
}

#[test]
fn rule_no_job_starts_once_the_deadline_has_passed() {
    let mut s = ShardScheduler::new(2, RECLAIM);
    let out = s.assign(t(100), 0, 1, t(100));
    assert!(starts(&out).is_empty(), "{out:?}");
    let mut s = ShardScheduler::new(1, RECLAIM);
    let (job, _) = start_of(&s.assign(t(0), 0, 1, t(100)), 0);
    s.assign(t(0), 1, 1, t(100));
    // The job ends after the deadline: shard 1 does not start.
    let out = s.job_ended(t(150), job, JobEnd::Data);
    assert!(starts(&out).is_empty(), "{out:?}");
}

#[test]
fn rule_a_renewed_lease_lets_jobs_start_again() {
    let mut s = ShardScheduler::new(1, RECLAIM);
    let (job, _) = start_of(&s.assign(t(0), 0, 1, t(100)), 0);
    s.tick(t(100));
    assert!(starts(&s.job_ended(t(101), job, JobEnd::Expired)).is_empty());
    let out = s.lease_renewed(t(120), t(2_000));
    assert_eq!(start_of(&out, 0).1, JobKind::ClaimOwn);
}

#[test]
fn rule_after_a_deadline_lapse_a_shard_starts_from_its_own_pending_entries() {
    let (mut s, running) = claimed(1, &[0], t(100));
    // A read runs; the deadline lapses while it runs; the read ends well after the lease came back.
    let (job, _, kind) = running[0];
    assert_eq!(kind, JobKind::Read);
    s.tick(t(100));
    s.lease_renewed(t(110), FAR);
    let out = s.job_ended(t(111), job, JobEnd::Data);
    assert_eq!(start_of(&out, 0).1, JobKind::ClaimOwn);
}

#[test]
fn rule_a_revoked_idle_shard_is_reported_at_once() {
    let mut s = ShardScheduler::new(1, RECLAIM);
    s.assign(t(0), 0, 1, FAR);
    s.assign(t(0), 1, 1, FAR);
    // Shard 1 waits in the queue (one worker): revoked at once.
    let out = s.revoke(t(1), 1);
    assert_eq!(revoked(&out), vec![1]);
    assert_eq!(s.owned(), BTreeSet::from([0]));
}

#[test]
fn rule_a_revoked_running_shard_drains_then_reports() {
    let mut s = ShardScheduler::new(1, RECLAIM);
    let (job, _) = start_of(&s.assign(t(0), 0, 1, FAR), 0);
    let out = s.revoke(t(1), 0);
    assert!(revoked(&out).is_empty(), "{out:?}");
    assert!(s.owned().is_empty());
    let out = s.job_ended(t(2), job, JobEnd::Data);
    assert_eq!(out, vec![Output::Revoked { shard: 0 }]);
}

#[test]
fn rule_revoking_a_shard_not_owned_reports_it_at_once() {
    let mut s = ShardScheduler::new(1, RECLAIM);
    assert_eq!(revoked(&s.revoke(t(0), 9)), vec![9]);
}

#[test]
fn rule_an_assign_while_revoking_starts_over_after_the_report() {
    let mut s = ShardScheduler::new(1, RECLAIM);
    let (job, _) = start_of(&s.assign(t(0), 0, 1, FAR), 0);
    s.revoke(t(1), 0);
    assert!(starts(&s.assign(t(2), 0, 5, FAR)).is_empty());
    let out = s.job_ended(t(3), job, JobEnd::Data);
    assert_eq!(revoked(&out), vec![0]);
    let (_, shard, kind) = starts(&out)[0];
    assert_eq!((shard, kind), (0, JobKind::ClaimOwn));
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::Start { epoch: 5, .. })));
}

#[test]
fn rule_a_fence_aborts_everything_and_reports_nothing() {
    let mut s = ShardScheduler::new(2, RECLAIM);
    let (a, _) = start_of(&s.assign(t(0), 0, 1, FAR), 0);
    s.assign(t(0), 1, 1, FAR);
    s.assign(t(0), 2, 1, FAR);
    let out = s.fence(t(1));
    assert_eq!(out, vec![Output::AbortAll]);
    assert!(s.owned().is_empty());
    let out = s.job_ended(t(2), a, JobEnd::Aborted);
    assert!(out.is_empty(), "{out:?}");
}

#[test]
fn rule_after_a_fence_a_regranted_shard_waits_for_its_old_job() {
    let mut s = ShardScheduler::new(2, RECLAIM);
    let (old, _) = start_of(&s.assign(t(0), 0, 1, FAR), 0);
    s.fence(t(1));
    let out = s.assign(t(2), 0, 2, FAR);
    assert!(starts(&out).is_empty(), "{out:?}");
    let out = s.job_ended(t(3), old, JobEnd::Aborted);
    let (_, kind) = start_of(&out, 0);
    assert_eq!(kind, JobKind::ClaimOwn);
}

#[test]
fn rule_a_shard_in_retry_backoff_holds_no_worker() {
    let (mut s, running) = claimed(1, &[0, 1], FAR);
    let (job, shard, _) = running[0];
    let out = s.job_ended(t(2), job, JobEnd::Deferred { retry_at: t(500) });
    let (_, other, _) = starts(&out)[0];
    assert_ne!(other, shard, "the worker serves the other shard");
    assert_eq!(s.next_wake(), Some(t(500)));
}

#[test]
fn rule_a_shard_in_backoff_retries_its_held_entries_when_the_backoff_ends() {
    let (mut s, running) = claimed(2, &[0], FAR);
    let (job, _, _) = running[0];
    s.job_ended(t(2), job, JobEnd::Deferred { retry_at: t(500) });
    assert!(starts(&s.tick(t(499))).is_empty());
    let out = s.tick(t(500));
    assert_eq!(start_of(&out, 0).1, JobKind::Retry);
}

#[test]
fn rule_a_failed_read_backs_off_then_claims_its_own_pending() {
    let (mut s, running) = claimed(1, &[0], FAR);
    let (job, _, _) = running[0];
    let out = s.job_ended(t(2), job, JobEnd::Failed { retry_at: t(50) });
    assert!(starts(&out).is_empty());
    assert!(starts(&s.tick(t(49))).is_empty());
    assert_eq!(start_of(&s.tick(t(50)), 0).1, JobKind::ClaimOwn);
}

#[test]
fn rule_an_aborted_job_claims_its_own_pending_next() {
    let (mut s, running) = claimed(1, &[0], FAR);
    let (job, _, _) = running[0];
    let out = s.job_ended(t(2), job, JobEnd::Aborted);
    assert_eq!(start_of(&out, 0).1, JobKind::ClaimOwn);
}

#[test]
fn rule_zombies_are_reclaimed_once_per_session_timeout() {
    let (mut s, running) = claimed(1, &[0], FAR);
    let mut reclaims = Vec::new();
    let mut job = running[0].0;
    for now in (2..35_000).step_by(1_000) {
        let out = s.job_ended(t(now), job, JobEnd::Data);
        let (next, kind) = start_of(&out, 0);
        if kind == JobKind::ReclaimZombies {
            reclaims.push(now);
        }
        job = next;
    }
    assert_eq!(reclaims, vec![10_002, 20_002, 30_002]);
}

#[test]
fn rule_paused_starts_nothing_and_keeps_the_shards() {
    let (mut s, running) = claimed(2, &[0, 1], FAR);
    s.pause(t(1));
    // Running jobs finish; nothing new starts.
    for (job, _, _) in running {
        assert!(starts(&s.job_ended(t(2), job, JobEnd::Data)).is_empty());
    }
    assert!(starts(&s.tick(t(2))).is_empty());
    assert!(starts(&s.assign(t(3), 2, 1, FAR)).is_empty());
    assert_eq!(s.owned(), BTreeSet::from([0, 1, 2]));
    // Revocations are still served.
    assert_eq!(revoked(&s.revoke(t(4), 1)), vec![1]);
}

#[test]
fn rule_resume_restarts_reads() {
    let (mut s, running) = claimed(2, &[0, 1], FAR);
    s.pause(t(1));
    for (job, _, _) in running {
        s.job_ended(t(2), job, JobEnd::Data);
    }
    assert_eq!(s.running(), 0);
    let out = s.resume(t(2));
    assert_eq!(starts(&out).len(), 2, "{out:?}");
}

/// Shards 0 and 1, one rotation of empty reads: the idle wait.
fn idle(workers: usize) -> (ShardScheduler, JobId) {
    idle_until(workers, FAR)
}

/// Ends every read empty until one idle wait covers every shard.
fn idle_until(workers: usize, deadline: Millis) -> (ShardScheduler, JobId) {
    let (mut s, mut running) = claimed(workers, &[0, 1], deadline);
    let mut wait: Option<(JobId, Vec<u32>)> = None;
    for _ in 0..12 {
        if let Some((job, shards)) = &wait {
            if shards.len() == 2 {
                return (s, *job);
            }
        }
        let out = if let Some((job, _, _)) = running.pop() {
            s.job_ended(t(1), job, JobEnd::Empty)
        } else if let Some((job, _)) = wait.take() {
            s.wait_ended(t(1), job, &[], false)
        } else {
            panic!("nothing runs");
        };
        running.extend(starts(&out));
        if let Some(started) = wait_of(&out) {
            wait = Some(started);
        }
        if out
            .iter()
            .any(|o| matches!(o, Output::InterruptWait { .. }))
        {
            let (job, _) = wait.take().unwrap();
            let out = s.wait_ended(t(1), job, &[], false);
            running.extend(starts(&out));
            wait = wait_of(&out);
        }
    }
    panic!("no idle wait over both shards");
}

#[test]
fn rule_a_rotation_of_empty_reads_starts_one_idle_wait() {
    let (s, _) = idle(1);
    assert_eq!(s.running(), 1);
    let (s, _) = idle(2);
    assert_eq!(s.running(), 1, "one wait covers both idle shards");
    let (s, _) = idle(3);
    assert_eq!(s.running(), 1);
}

#[test]
fn rule_the_idle_wait_wakes_shards_with_their_entries_and_the_others_stay_idle() {
    let (mut s, wait) = idle(2);
    let out = s.wait_ended(t(5), wait, &[1], false);
    let (read, kind) = start_of(&out, 1);
    assert_eq!(kind, JobKind::Retry);
    assert_eq!(starts(&out).len(), 1, "shard 0 is not polled: {out:?}");
    assert_eq!(
        wait_of(&out),
        None,
        "the wait holds back for shard 1's read"
    );
    // The woken read comes back short: one wait covers both again.
    let out = s.job_ended(t(5), read, JobEnd::Empty);
    assert_eq!(wait_of(&out).map(|w| w.1), Some(vec![0, 1]), "{out:?}");
}

#[test]
fn rule_the_idle_wait_holds_back_for_a_running_read_only_so_long() {
    let (mut s, wait) = idle(2);
    let out = s.wait_ended(t(5), wait, &[1], false);
    start_of(&out, 1);
    let hold_end = t(5).plus_duration(WAIT_HOLD);
    assert_eq!(s.0.next_wake(t(5)), Some(hold_end));
    assert_eq!(wait_of(&s.tick(t(6))), None, "still held");
    // Shard 1's handler is slow: shard 0 is watched without it.
    let out = s.tick(hold_end);
    assert_eq!(wait_of(&out).map(|w| w.1), Some(vec![0]), "{out:?}");
}

#[test]
fn rule_the_idle_wait_never_takes_the_last_worker_a_held_shard_needs() {
    let (mut s, running) = claimed(1, &[0, 1], FAR);
    // Shard 0 ends with deferred entries due at once (a moved key), shard 1 finds nothing.
    let (job, shard, _) = running[0];
    let out = s.job_ended(t(1), job, JobEnd::Deferred { retry_at: t(1) });
    let mut running = starts(&out);
    let mut held_ran = false;
    for _ in 0..4 {
        let Some((job, sh, kind)) = running.pop() else {
            break;
        };
        if sh == shard && kind == JobKind::Retry {
            held_ran = true;
            break;
        }
        let out = s.job_ended(t(1), job, JobEnd::Empty);
        assert!(
            wait_of(&out).is_none(),
            "the wait took the last worker: {out:?}"
        );
        running = starts(&out);
    }
    assert!(held_ran);
}

#[test]
fn rule_an_assignment_interrupts_the_idle_wait() {
    let (mut s, wait) = idle(2);
    let out = s.assign(t(2), 5, 1, FAR);
    assert!(
        out.contains(&Output::InterruptWait { job: wait }),
        "{out:?}"
    );
}

#[test]
fn rule_pause_interrupts_the_idle_wait() {
    let (mut s, wait) = idle(2);
    assert_eq!(s.pause(t(2)), vec![Output::InterruptWait { job: wait }]);
    assert!(starts(&s.wait_ended(t(3), wait, &[], false)).is_empty());
}

#[test]
fn rule_revoking_a_waited_shard_interrupts_the_wait_and_reports_after_it() {
    let (mut s, wait) = idle(2);
    let out = s.revoke(t(2), 0);
    assert_eq!(out, vec![Output::InterruptWait { job: wait }]);
    let out = s.wait_ended(t(3), wait, &[0], false);
    assert_eq!(revoked(&out), vec![0]);
}

#[test]
fn rule_the_idle_wait_is_over_its_margin_before_the_deadline() {
    let (mut s, wait) = idle_until(2, t(1_000));
    let end = t(1_000).minus_duration(WAIT_MARGIN);
    assert_eq!(s.next_wake(), Some(end));
    assert!(s.tick(t(end.0 - 1)).is_empty());
    assert_eq!(s.tick(end), vec![Output::InterruptWait { job: wait }]);
    assert!(s.tick(t(end.0 + 1)).is_empty(), "interrupted once");
    assert_eq!(s.next_wake(), Some(t(1_000)));
    // Back from the wait within the margin: no new wait, and the idle shards are not polled either.
    assert!(s.wait_ended(t(end.0 + 2), wait, &[], false).is_empty());
    assert!(s.tick(t(999)).is_empty());
    // Back from the lapse, both shards claim their own pending entries first, once the lease is back.
    assert!(s.tick(t(1_000)).is_empty());
    let out = s.lease_renewed(t(1_002), FAR);
    assert!(
        starts(&out).iter().all(|j| j.2 == JobKind::ClaimOwn) && starts(&out).len() == 2,
        "{out:?}"
    );
    // A lease renewed within the margin, before the deadline: the wait starts again.
    let (mut s, wait) = idle_until(2, t(1_000));
    s.tick(end);
    assert!(s.wait_ended(t(end.0 + 2), wait, &[], false).is_empty());
    let out = s.lease_renewed(t(end.0 + 3), FAR);
    let mut watched = wait_of(&out).expect("a wait").1;
    watched.sort_unstable();
    assert_eq!(watched, [0, 1], "{out:?}");
}

#[test]
fn rule_a_deadline_lapse_interrupts_the_idle_wait() {
    // Not interrupted at its margin (the tick came late): the lapse interrupts it.
    let (mut s, wait) = idle_until(2, t(1_000));
    assert!(s
        .tick(t(1_000))
        .contains(&Output::InterruptWait { job: wait }));
    assert!(starts(&s.wait_ended(t(1_001), wait, &[], false)).is_empty());
}

#[test]
fn rule_shutdown_starts_nothing_and_stops_when_jobs_ended() {
    let mut s = ShardScheduler::new(1, RECLAIM);
    let (job, _) = start_of(&s.assign(t(0), 0, 1, FAR), 0);
    s.assign(t(0), 1, 1, FAR);
    assert!(s.shutdown(t(1)).is_empty());
    assert_eq!(s.job_ended(t(2), job, JobEnd::Data), vec![Output::Stopped]);
    let mut idle = ShardScheduler::new(1, RECLAIM);
    assert_eq!(idle.shutdown(t(0)), vec![Output::Stopped]);
}

#[test]
fn rule_next_wake_is_the_earliest_backoff_or_the_deadline() {
    let mut s = ShardScheduler::new(1, RECLAIM);
    assert_eq!(s.next_wake(), None);
    let (job, _) = start_of(&s.assign(t(0), 0, 1, t(900)), 0);
    assert_eq!(s.next_wake(), Some(t(900)));
    s.job_ended(t(1), job, JobEnd::Failed { retry_at: t(40) });
    assert_eq!(s.next_wake(), Some(t(40)));
}

#[test]
fn rule_a_failed_read_that_delivered_nothing_backs_off_then_reads_on() {
    let (mut s, running) = claimed(1, &[0], FAR);
    let (job, _, _) = running[0];
    let out = s.job_ended(t(2), job, JobEnd::ReadFailed { retry_at: t(50) });
    assert!(starts(&out).is_empty(), "{out:?}");
    assert_eq!(s.next_wake(), Some(t(50)));
    let out = s.tick(t(50));
    assert_eq!(start_of(&out, 0).1, JobKind::Read);
}

#[test]
fn rule_a_missing_group_waits_for_its_backoff_and_a_renewed_lease() {
    // Backoff over first, then the renewal.
    let (mut s, running) = claimed(1, &[0], FAR);
    let (job, _, _) = running[0];
    assert!(!s.awaits_renewal());
    s.job_ended(t(2), job, JobEnd::MissingGroup { retry_at: t(50) });
    assert!(s.awaits_renewal());
    assert!(starts(&s.tick(t(60))).is_empty(), "started unconfirmed");
    let out = s.lease_renewed(t(70), FAR);
    assert_eq!(start_of(&out, 0).1, JobKind::ClaimOwn);
    assert!(!s.awaits_renewal());
    // The renewal first, then the backoff.
    let (mut s, running) = claimed(1, &[0], FAR);
    let (job, _, _) = running[0];
    s.job_ended(t(2), job, JobEnd::MissingGroup { retry_at: t(50) });
    assert!(
        starts(&s.lease_renewed(t(10), FAR)).is_empty(),
        "started in backoff"
    );
    let out = s.tick(t(50));
    assert_eq!(start_of(&out, 0).1, JobKind::ClaimOwn);
}

#[test]
fn rule_a_lost_lease_stops_starts_until_renewed() {
    let (mut s, running) = claimed(1, &[0, 1], FAR);
    let (job, _, _) = running[0];
    assert!(s.lease_lost(t(5)).is_empty());
    assert!(s.awaits_renewal());
    assert!(starts(&s.job_ended(t(6), job, JobEnd::Expired)).is_empty());
    assert!(starts(&s.tick(t(7))).is_empty());
    assert!(
        starts(&s.lease_renewed(t(8), t(5))).is_empty(),
        "not a renewal"
    );
    let out = s.lease_renewed(t(9), FAR);
    assert!(
        !starts(&out).is_empty() && starts(&out).iter().all(|j| j.2 == JobKind::ClaimOwn),
        "{out:?}"
    );
}

#[test]
fn rule_a_lost_lease_interrupts_the_idle_wait() {
    let (mut s, wait) = idle(2);
    assert_eq!(
        s.lease_lost(t(2)),
        vec![Output::InterruptWait { job: wait }]
    );
}

#[test]
fn rule_shards_back_empty_while_the_wait_runs_park_and_interrupt_it_once() {
    let (mut s, mut running) = claimed(3, &[0, 1, 2, 3, 4], FAR);
    let mut wait = None;
    let mut interrupts = 0;
    let mut parked = Vec::new();
    for i in 0..40 {
        if parked.len() == 2 {
            break;
        }
        let (job, shard, _) = running.remove(0);
        // Reads come back far apart: the wait does not hold back for the others (`WAIT_HOLD`).
        let out = s.job_ended(t(1 + 10 * i), job, JobEnd::Empty);
        if wait.is_some() {
            interrupts += out
                .iter()
                .filter(|o| matches!(o, Output::InterruptWait { .. }))
                .count();
            assert!(
                starts(&out).iter().all(|j| j.1 != shard),
                "polled again while the wait runs: {out:?}"
            );
            parked.push(shard);
        }
        if let Some(started) = wait_of(&out) {
            wait = Some(started);
        }
        running.extend(starts(&out));
    }
    let (wait, waited) = wait.expect("an idle wait");
    assert_eq!(parked.len(), 2, "{parked:?}");
    assert_eq!(interrupts, 1);
    assert!(waited.iter().all(|s| !parked.contains(s)));
    // The next wait covers the parked shards too.
    let out = s.wait_ended(t(2), wait, &[], false);
    let (_, next) = wait_of(&out).expect("the next wait");
    assert!(
        parked.iter().all(|s| next.contains(s)),
        "{next:?} {parked:?}"
    );
}

// ---- property test --------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    Assign(u32, i64),
    Revoke(u32),
    Fence,
    Renew(u64),
    LeaseLost,
    End(usize, u8, u64),
    Tick(u64),
    Pause,
    Resume,
    Shutdown,
    Settle,
    HookDone,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        80 => (0u32..6, 1i64..4).prop_map(|(s, e)| Op::Assign(s, e)),
        40 => (0u32..6).prop_map(Op::Revoke),
        15 => Just(Op::Fence),
        40 => (0u64..3_000).prop_map(Op::Renew),
        5 => Just(Op::LeaseLost),
        160 => (0usize..8, 0u8..9, 0u64..500).prop_map(|(i, k, d)| Op::End(i, k, d)),
        60 => (0u64..700).prop_map(Op::Tick),
        15 => Just(Op::Pause),
        20 => Just(Op::Resume),
        1 => Just(Op::Shutdown),
        30 => Just(Op::Settle),
        20 => Just(Op::HookDone),
    ]
}

/// What the outputs say, checked against every rule that can be checked from outside.
#[derive(Default)]
struct Model {
    now: u64,
    deadline: u64,
    workers: usize,
    paused: bool,
    closing: bool,
    /// Running jobs: id -> (shards, is_wait).
    running: BTreeMap<JobId, (Vec<u32>, bool)>,
    /// Running jobs that handle one batch and read nothing: a wait may cover their shard meanwhile.
    one_batch: BTreeSet<JobId>,
    /// Shards revoked and not reported yet.
    revoking: BTreeSet<u32>,
    /// Owned shards and their epoch (the latest assignment).
    owned: BTreeMap<u32, i64>,
    /// Backoff ends per shard.
    retry_at: BTreeMap<u32, u64>,
    /// Shards whose group was missing: no job before a renewal.
    unconfirmed: BTreeSet<u32>,
    /// Jobs of an ownership that ended (revoked or fenced): their end says nothing about the shard now.
    stale: BTreeSet<JobId>,
    /// Revoked shards and the jobs of theirs that ran at the revocation.
    draining: BTreeMap<u32, BTreeSet<JobId>>,
    /// Revoked shards granted again before their REVOKED report.
    reassigned: BTreeSet<u32>,
    /// Grants (and revocations) per shard so far: an ownership's identity, epochs may repeat.
    grants: BTreeMap<u32, u64>,
    /// Running waits: the grant count of each of their shards when they started.
    waited: BTreeMap<JobId, Vec<(u32, u64)>>,
    /// What the next job of a shard's ownership must do: handle the entry ids group waits delivered
    /// (in order, or claim them again with the rest of its own pending entries), and claim its own pending
    /// entries (a group wait's lost reply).
    owed: BTreeMap<u32, (Vec<String>, bool)>,
}

impl Model {
    /// A new grant or a revocation of `shard` (or of every shard): what its old ownership owed is void.
    fn regranted(&mut self, shard: Option<u32>) {
        let shards: Vec<u32> = match shard {
            Some(shard) => vec![shard],
            None => self.grants.keys().copied().collect(),
        };
        for shard in shards {
            *self.grants.entry(shard).or_default() += 1;
            self.owed.remove(&shard);
        }
    }

    /// The plans started: each first job after a group wait does what the wait left it.
    fn check_plans(&mut self, plans: Vec<JobPlan>) -> Result<(), TestCaseError> {
        for plan in plans {
            let Some((ids, claim)) = self.owed.remove(&plan.shard) else {
                continue;
            };
            let claims = plan.read_mode == ReadMode::claim_own() || plan.kind == JobKind::ClaimOwn;
            let handed: Vec<&str> = plan.deferred.iter().map(|e| e.id.as_str()).collect();
            let delivered: Vec<&str> = ids.iter().map(String::as_str).collect();
            // In delivery order, at the end of what it handles first.
            let in_order = handed.ends_with(&delivered);
            prop_assert!(
                ids.is_empty() || in_order || claims,
                "shard {}'s next job lost what the waits delivered ({:?}): {:?}",
                plan.shard,
                ids,
                plan
            );
            if claim {
                prop_assert!(
                    claims,
                    "shard {} reads on past a lost wait reply: {:?}",
                    plan.shard,
                    plan
                );
            }
        }
        Ok(())
    }

    fn staled(&mut self, shard: Option<u32>) {
        for (job, (shards, _)) in &self.running {
            if shard.is_none_or(|s| shards.contains(&s)) {
                self.stale.insert(*job);
            }
        }
    }
}

impl Model {
    fn check(&mut self, out: &[Output]) -> Result<(), TestCaseError> {
        for o in out {
            match o {
                Output::Start {
                    job,
                    shard,
                    epoch,
                    kind,
                    one_batch,
                } => {
                    prop_assert!(
                        !self.paused && !self.closing,
                        "started while paused/closing"
                    );
                    prop_assert!(self.now < self.deadline, "started past the deadline");
                    prop_assert_eq!(
                        self.owned.get(shard),
                        Some(epoch),
                        "not owned / stale epoch"
                    );
                    prop_assert!(
                        self.retry_at.get(shard).is_none_or(|at| *at <= self.now),
                        "started in backoff"
                    );
                    prop_assert!(!self.unconfirmed.contains(shard), "started unconfirmed");
                    // A job that reads nothing may start under a wait over its shard (and ride it).
                    prop_assert!(
                        !self
                            .running
                            .values()
                            .any(|(s, wait)| s.contains(shard) && !(*wait && *one_batch)),
                        "two jobs of shard {}",
                        shard
                    );
                    self.running.insert(*job, (vec![*shard], false));
                    if *one_batch {
                        prop_assert_eq!(*kind, JobKind::Delivered, "one batch of what?");
                        self.one_batch.insert(*job);
                    }
                }
                Output::StartWait { job, shards } => {
                    prop_assert!(!self.paused && !self.closing);
                    prop_assert!(
                        Millis(self.now).plus_duration(WAIT_MARGIN) < Millis(self.deadline),
                        "a wait started within its margin of the deadline"
                    );
                    for shard in shards {
                        prop_assert!(self.owned.contains_key(shard));
                        // Only a job that reads nothing may run beside a wait over its shard.
                        let riding = self.running.iter().any(|(j, (s, w))| {
                            !*w && s.contains(shard) && self.one_batch.contains(j)
                        });
                        prop_assert!(
                            !self.running.iter().any(|(j, (s, w))| s.contains(shard)
                                && (*w || !self.one_batch.contains(j))),
                            "shard {} waited on beside a reading job or another wait",
                            shard
                        );
                        prop_assert!(
                            riding || !self.owed.contains_key(shard),
                            "shard {} waits again before its job did what the last wait left it",
                            shard
                        );
                    }
                    self.running.insert(*job, (shards.clone(), true));
                    let grants = shards
                        .iter()
                        .map(|s| (*s, self.grants.get(s).copied().unwrap_or_default()))
                        .collect();
                    self.waited.insert(*job, grants);
                }
                Output::Revoked { shard } => {
                    prop_assert!(self.revoking.remove(shard), "REVOKED {} not asked", shard);
                    let drained = self.draining.remove(shard).unwrap_or_default();
                    if self.reassigned.remove(shard) {
                        // Granted again while revoking: the new ownership may run before the revoked
                        // hook returns, the revoked one's jobs may not.
                        prop_assert!(
                            drained.iter().all(|job| !self.running.contains_key(job)),
                            "REVOKED {} while a job of the revoked ownership runs",
                            shard
                        );
                    } else {
                        prop_assert!(
                            !self.running.values().any(|(s, _)| s.contains(shard)),
                            "REVOKED {} while its job runs",
                            shard
                        );
                    }
                }
                Output::InterruptWait { job } => {
                    prop_assert!(self.running.get(job).is_some_and(|(_, w)| *w));
                }
                Output::Stopped => {
                    prop_assert!(self.closing, "stopped without a shutdown");
                    prop_assert!(self.running.is_empty(), "stopped with jobs running");
                }
                Output::AbortAll => {}
            }
        }
        prop_assert!(self.running.len() <= self.workers, "more jobs than workers");
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]
    #[test]
    fn random_inputs_keep_every_invariant(workers in 1usize..4, hooked in any::<bool>(), ops in proptest::collection::vec(op(), 1..120)) {
        let hooks = HooksSet { any: hooked, revoked: hooked };
        let mut s = ShardScheduler::with_hooks(workers, 1_000, hooks);
        let mut m = Model { workers, ..Model::default() };
        for op in ops {
            let out = match op {
                Op::Assign(shard, epoch) => {
                    m.regranted(Some(shard));
                    let deadline = m.now + 2_000;
                    m.deadline = m.deadline.max(deadline);
                    if m.revoking.contains(&shard) {
                        // Served once the revoked ownership drained (its REVOKED report may still wait
                        // for the revoked hook).
                        m.reassigned.insert(shard);
                        m.owned.insert(shard, epoch);
                        let out = s.assign(t(m.now), shard, epoch, t(deadline));
                        m.check(&out)?;
                        continue;
                    }
                    m.owned.insert(shard, epoch);
                    m.retry_at.remove(&shard);
                    m.unconfirmed.remove(&shard);
                    s.assign(t(m.now), shard, epoch, t(deadline))
                }
                Op::Revoke(shard) => {
                    m.regranted(Some(shard));
                    m.staled(Some(shard));
                    if !m.revoking.contains(&shard) {
                        let jobs = m.running.iter().filter(|(_, (s, _))| s.contains(&shard)).map(|(j, _)| *j).collect();
                        m.draining.insert(shard, jobs);
                    }
                    m.reassigned.remove(&shard);
                    m.owned.remove(&shard);
                    m.retry_at.remove(&shard);
                    m.unconfirmed.remove(&shard);
                    m.revoking.insert(shard);
                    s.revoke(t(m.now), shard)
                }
                Op::Fence => {
                    m.regranted(None);
                    m.staled(None);
                    m.owned.clear();
                    m.revoking.clear();
                    m.draining.clear();
                    m.reassigned.clear();
                    m.retry_at.clear();
                    m.unconfirmed.clear();
                    m.deadline = m.now;
                    s.fence(t(m.now))
                }
                Op::Renew(d) => {
                    m.deadline = m.deadline.max(m.now + d);
                    m.unconfirmed.clear();
                    s.lease_renewed(t(m.now), t(m.now + d))
                }
                Op::LeaseLost => {
                    m.deadline = m.deadline.min(m.now);
                    s.lease_lost(t(m.now))
                }
                Op::End(index, kind, d) => {
                    let Some((&job, (shards, wait))) = m.running.iter().nth(index % m.running.len().max(1)) else {
                        continue;
                    };
                    let (shards, wait) = (shards.clone(), *wait);
                    m.running.remove(&job);
                    m.one_batch.remove(&job);
                    let stale = m.stale.remove(&job);
                    if wait {
                        let woke: Vec<u32> = shards.iter().copied().filter(|s| (s + kind as u32).is_multiple_of(2)).collect();
                        // Odd kinds are a group wait that delivered to the woken shards; 5 and 7 lost the
                        // reply of another read (a cluster's other slot) or of the only one.
                        let delivering = kind % 2 == 1;
                        let in_doubt = kind == 5 || kind == 7;
                        let grants = m.waited.remove(&job).unwrap_or_default();
                        let id = format!("9-{}", job.0);
                        let mut report = WaitReport {
                            new_entries: woke.clone(),
                            expired: kind == 6,
                            in_doubt,
                            // Kind 3 delivers a full batch (its job reads on), the others a short one.
                            count: if kind == 3 { 1 } else { 2 },
                            ..WaitReport::default()
                        };
                        if kind == 7 {
                            report.error = Some(redis::RedisError::from((redis::ErrorKind::Io, "reset")));
                        }
                        if delivering {
                            report.delivered = woke.iter().map(|s| (*s, vec![entry(&id)])).collect();
                        }
                        for (shard, grant) in grants {
                            // Still the ownership the wait waited on.
                            if m.grants.get(&shard).copied().unwrap_or_default() != grant || !m.owned.contains_key(&shard) {
                                continue;
                            }
                            let delivered = (delivering && woke.contains(&shard)).then(|| id.clone());
                            if delivered.is_some() || in_doubt {
                                // A shard that rode the wait may owe an earlier wait's delivery still.
                                let owed = m.owed.entry(shard).or_default();
                                owed.0.extend(delivered);
                                owed.1 |= in_doubt;
                            }
                        }
                        s.wait_reported(t(m.now), job, report)
                    } else {
                        // Every kind of end, as a job reports it (`end_of` says what it means).
                        let live = |fetched| JobReport { next_read_mode: Some(ReadMode::Live), fetched, ..JobReport::default() };
                        let claim = ReadMode::Claim { cursor: "1-0".into() };
                        let error = || Some(redis::RedisError::from((redis::ErrorKind::Io, "reset")));
                        let report = match kind {
                            0 => Some(live(1)),
                            1 => Some(live(0)),
                            2 => Some(JobReport { next_read_mode: Some(claim), fetched: 1, ..JobReport::default() }),
                            3 => Some(JobReport { deferred: vec![entry("1-0")], defer_for: Some(Duration::from_millis(d)), ..live(1) }),
                            4 => Some(JobReport { error: error(), next_read_mode: Some(claim), ..JobReport::default() }),
                            5 => Some(JobReport { expired: true, ..live(0) }),
                            6 => None,
                            7 => Some(JobReport { error: error(), ..live(0) }),
                            _ => Some(JobReport { missing_group: true, ..live(0) }),
                        };
                        // The earliest the shard may run again (an error's backoff is at least 50 ms).
                        let retry_at = match kind {
                            3 => Some(m.now + d),
                            4 | 7 | 8 => Some(m.now + 50),
                            _ => None,
                        };
                        if let (Some(at), Some(_), false) = (retry_at, m.owned.get(&shards[0]), stale) {
                            m.retry_at.insert(shards[0], at);
                        }
                        if let (8, Some(_), false) = (kind, m.owned.get(&shards[0]), stale) {
                            m.unconfirmed.insert(shards[0]);
                        }
                        s.job_reported(t(m.now), job, report)
                    }
                }
                Op::Tick(d) => {
                    m.now += d;
                    s.tick(t(m.now))
                }
                Op::Pause => {
                    m.paused = true;
                    s.pause(t(m.now))
                }
                Op::Resume => {
                    m.paused = false;
                    s.resume(t(m.now))
                }
                Op::Shutdown => {
                    m.closing = true;
                    s.shutdown(t(m.now))
                }
                Op::Settle => s.settle(),
                Op::HookDone => s.hook_done(),
            };
            m.check(&out)?;
            m.check_plans(std::mem::take(&mut s.2))?;
            prop_assert_eq!(s.running(), m.running.len());
        }
        // Liveness: with the lease renewed, not paused, every job ending with data, every owned shard runs
        // again within a bounded number of steps (no starvation, nothing stuck in backoff).
        if m.closing {
            return Ok(());
        }
        m.paused = false;
        // Past the longest error backoff (5 s).
        m.now += 10_000;
        m.deadline = m.now + 1_000_000;
        m.retry_at.clear();
        m.unconfirmed.clear();
        let mut out = s.resume(t(m.now));
        out.extend(s.lease_renewed(t(m.now), t(m.deadline)));
        out.extend(s.tick(t(m.now)));
        m.check(&out)?;
        let mut seen = BTreeSet::new();
        for _ in 0..(m.owned.len() + m.revoking.len() + 8) * 4 {
            let mut out = s.settle();
            while !s.1.is_empty() {
                out.extend(s.hook_done());
            }
            m.check(&out)?;
            let Some((&job, (shards, wait))) = m.running.iter().next() else { continue };
            let (shards, wait) = (shards.clone(), *wait);
            m.running.remove(&job);
            seen.extend(shards.iter().copied());
            let out = if wait {
                s.wait_ended(t(m.now), job, &shards, false)
            } else {
                s.job_ended(t(m.now), job, JobEnd::Data)
            };
            m.check(&out)?;
        }
        let owned: BTreeSet<u32> = m.owned.keys().copied().collect();
        prop_assert!(owned.is_subset(&seen), "starved: owned {:?}, ran {:?}", owned, seen);
        prop_assert!(m.revoking.is_empty(), "never reported REVOKED: {:?}", m.revoking);
    }
}

// ---- the facts the machine keeps for the driver ---------------------------------------------------

fn machine(workers: usize, hooks: HooksSet) -> Machine {
    let mut m = Machine::new(workers, RECLAIM, hooks);
    m.observe_lease(t(0), FAR, 1);
    m
}

fn plans(out: &[Command]) -> Vec<JobPlan> {
    out.iter()
        .filter_map(|c| match c {
            Command::StartJob(plan) => Some(plan.clone()),
            _ => None,
        })
        .collect()
}

fn plan_of(out: &[Command], shard: u32) -> JobPlan {
    plans(out)
        .into_iter()
        .find(|p| p.shard == shard)
        .unwrap_or_else(|| panic!("no job of shard {shard} in {out:?}"))
}

fn read(fetched: usize) -> JobReport {
    JobReport {
        next_read_mode: Some(ReadMode::Live),
        fetched,
        ..JobReport::default()
    }
}

fn entry(id: &str) -> crate::consumer::entry::Entry {
    crate::consumer::entry::Entry {
        id: id.into(),
        fields: Vec::new(),
        delivery_count: 1,
        deleted: false,
        retries: 0,
    }
}

fn reports(out: &[Command]) -> Vec<Report> {
    out.iter()
        .filter_map(|c| match c {
            Command::Report(r) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

/// A machine owning shard 0 with its first claim done: returns it and the job reading now.
fn reading(workers: usize, hooks: HooksSet) -> (Machine, JobPlan) {
    let mut m = machine(workers, hooks);
    let claim = plan_of(&m.assign(t(0), 0, token(1)), 0);
    assert_eq!(claim.kind, JobKind::ClaimOwn);
    let out = m.job_ended(t(0), claim.job, Some(read(1)));
    (m, plan_of(&out, 0))
}

#[test]
fn rule_a_new_ownership_is_owned_then_disowned_when_drained() {
    let mut m = machine(1, HooksSet::default());
    let out = m.assign(t(0), 4, token(3));
    assert_eq!(out[0], Command::Own { shard: 4, epoch: 3 });
    let job = plan_of(&out, 4).job;
    let out = m.revoke(t(1), 4);
    assert!(!out.contains(&Command::Disown { shard: 4 }), "{out:?}");
    let out = m.job_ended(t(2), job, Some(read(1)));
    assert!(out.contains(&Command::Disown { shard: 4 }), "{out:?}");
    assert!(reports(&out).contains(&Report::Revoked { shard: 4 }));
}

#[test]
fn rule_the_next_job_starts_with_the_deferred_entries_and_the_carried_read_mode() {
    let (mut m, job) = reading(1, HooksSet::default());
    let report = JobReport {
        deferred: vec![entry("5-0"), entry("6-0")],
        defer_for: Some(Duration::from_millis(30)),
        ..read(2)
    };
    let out = m.job_ended(t(10), job.job, Some(report));
    assert!(plans(&out).is_empty(), "in backoff: {out:?}");
    assert_eq!(m.next_wake(t(10)), Some(t(40)));
    let plan = plan_of(&m.tick(t(40)), 0);
    assert_eq!(plan.kind, JobKind::Retry);
    assert_eq!(plan.deferred, vec![entry("5-0"), entry("6-0")]);
    // A claim part-way carries its cursor to the next job.
    let cursor = ReadMode::Claim {
        cursor: "9-0".into(),
    };
    let report = JobReport {
        next_read_mode: Some(cursor.clone()),
        fetched: 5,
        ..JobReport::default()
    };
    let plan = plan_of(&m.job_ended(t(41), plan.job, Some(report)), 0);
    assert_eq!((plan.kind, plan.read_mode), (JobKind::ClaimOwn, cursor));
    assert!(plan.deferred.is_empty());
}

#[test]
fn rule_the_fence_is_installed_by_the_first_job_and_again_once_lost_or_regranted() {
    let mut m = machine(1, HooksSet::default());
    let first = plan_of(&m.assign(t(0), 0, token(1)), 0);
    assert!(first.install_fence);
    let installed = JobReport {
        fence_installed: true,
        ..read(1)
    };
    let second = plan_of(&m.job_ended(t(1), first.job, Some(installed)), 0);
    assert!(!second.install_fence);
    let lost = JobReport {
        fence_lost: true,
        ..read(1)
    };
    let third = plan_of(&m.job_ended(t(2), second.job, Some(lost)), 0);
    assert!(third.install_fence);
    let installed = JobReport {
        fence_installed: true,
        ..read(1)
    };
    let fourth = plan_of(&m.job_ended(t(3), third.job, Some(installed)), 0);
    assert!(!fourth.install_fence);
    // A newer grant of the shard has a fence of its own.
    m.assign(t(4), 0, token(2));
    let fifth = plan_of(&m.job_ended(t(5), fourth.job, Some(read(1))), 0);
    assert!(fifth.install_fence);
    assert_eq!(fifth.token, token(2));
    // A job of the older grant that installed its fence says nothing of the newer grant's.
    let installed = JobReport {
        fence_installed: true,
        ..read(1)
    };
    let sixth = plan_of(&m.job_ended(t(6), fifth.job, Some(installed)), 0);
    m.assign(t(7), 0, token(3));
    let installed_old = JobReport {
        fence_installed: true,
        ..read(1)
    };
    let seventh = plan_of(&m.job_ended(t(8), sixth.job, Some(installed_old)), 0);
    assert!(
        seventh.install_fence,
        "the grant of epoch 3 has no fence yet"
    );
    assert_eq!(seventh.token, token(3));
}

#[test]
fn rule_a_missing_group_is_created_again_once_after_a_renewed_lease() {
    let (mut m, job) = reading(1, HooksSet::default());
    let missing = JobReport {
        missing_group: true,
        next_read_mode: Some(ReadMode::claim_own()),
        ..JobReport::default()
    };
    let out = m.job_ended(t(10), job.job, Some(missing));
    assert!(plans(&out).is_empty(), "{out:?}");
    // Backoff over, no renewal: still waits (and the driver polls the lease meanwhile).
    assert!(plans(&m.tick(t(100))).is_empty());
    assert_eq!(m.next_wake(t(100)), Some(t(150)));
    // The same deadline confirmed by an accepted heartbeat renews it.
    let plan = plan_of(&m.observe_lease(t(101), FAR, 2), 0);
    assert!(plan.recreate_group);
    assert_eq!(plan.kind, JobKind::ClaimOwn);
    let next = plan_of(&m.job_ended(t(102), plan.job, Some(read(1))), 0);
    assert!(!next.recreate_group, "created once");
}

#[test]
fn rule_an_error_backs_off_and_the_probe_hears_of_it() {
    let (mut m, job) = reading(1, HooksSet::default());
    let failed = JobReport {
        error: Some(redis::RedisError::from((redis::ErrorKind::Io, "reset"))),
        next_read_mode: Some(ReadMode::claim_own()),
        ..JobReport::default()
    };
    let out = m.job_ended(t(10), job.job, Some(failed));
    assert!(out.contains(&Command::Probe(ProbeEvent::ReadResult {
        shard: 0,
        failed: true
    })));
    assert!(plans(&out).is_empty());
    assert!(plans(&m.tick(t(59))).is_empty());
    let plan = plan_of(&m.tick(t(60)), 0);
    assert_eq!(plan.read_mode, ReadMode::claim_own());
    let out = m.job_ended(t(61), plan.job, Some(read(1)));
    assert!(out.contains(&Command::Probe(ProbeEvent::ReadResult {
        shard: 0,
        failed: false
    })));
}

#[test]
fn rule_a_job_keeps_its_shard_only_while_no_other_shard_waits_and_not_paused() {
    let mut m = machine(2, HooksSet::default());
    let out = m.assign(t(0), 0, token(1));
    let a = plan_of(&out, 0).job;
    let out = m.assign(t(0), 1, token(1));
    assert!(
        !out.iter().any(|c| matches!(c, Command::Yield { .. })),
        "{out:?}"
    );
    assert_eq!(plan_of(&out, 1).max_turns, MAX_TURNS);
    // A third shard finds no worker: both running jobs are asked for their shards, once.
    let out = m.assign(t(0), 2, token(1));
    let yields: Vec<&Command> = out
        .iter()
        .filter(|c| matches!(c, Command::Yield { .. }))
        .collect();
    assert_eq!(yields.len(), 2, "{out:?}");
    assert!(out.contains(&Command::Yield { job: a }));
    let out = m.assign(t(0), 3, token(1));
    assert!(
        !out.iter().any(|c| matches!(c, Command::Yield { .. })),
        "{out:?}"
    );
    // A job started while others wait is asked at once; pause asks every running job.
    let out = m.job_ended(t(1), a, Some(read(1)));
    let c = plans(&out)[0].job;
    assert!(out.contains(&Command::Yield { job: c }), "{out:?}");
    let mut m = machine(2, HooksSet::default());
    let job = plan_of(&m.assign(t(0), 0, token(1)), 0).job;
    assert_eq!(m.pause(t(1)), vec![Command::Yield { job }]);
}

#[test]
fn rule_a_revoked_running_job_is_told_to_stop_and_draining_names_it() {
    let (mut m, job) = reading(1, HooksSet::default());
    let out = m.revoke(t(1), 0);
    assert_eq!(
        reports(&out),
        vec![Report::Draining {
            shard: 0,
            job: Some(job.job)
        }]
    );
    assert!(out.contains(&Command::Stop { job: job.job }));
    // An idle or unknown shard drains nothing.
    let out = m.revoke(t(1), 7);
    assert_eq!(
        reports(&out),
        vec![
            Report::Draining {
                shard: 7,
                job: None
            },
            Report::Revoked { shard: 7 }
        ]
    );
}

const REVOKED_HOOK: HooksSet = HooksSet {
    any: true,
    revoked: true,
};

#[test]
fn rule_with_a_revoked_hook_revoked_waits_for_the_hook() {
    let mut m = machine(1, REVOKED_HOOK);
    m.assign(t(0), 0, token(1));
    m.assign(t(0), 1, token(1));
    assert_eq!(
        m.settle(),
        vec![Command::CallHook(HookCall::Assigned(vec![0, 1]))]
    );
    // Shard 1 is idle (queued): drained at once, but its report waits for the hook.
    let out = m.revoke(t(1), 1);
    assert!(
        !reports(&out).contains(&Report::Revoked { shard: 1 }),
        "{out:?}"
    );
    assert_eq!(
        m.settle(),
        vec![Command::CallHook(HookCall::Revoked(0, vec![1]))]
    );
    assert_eq!(
        m.hook_done(0, vec![1]),
        vec![Command::Report(Report::Revoked { shard: 1 })]
    );
}

#[test]
fn rule_hooks_hear_drained_before_assigned_in_one_batch_per_settle() {
    let mut m = machine(4, REVOKED_HOOK);
    let mut claims = Vec::new();
    for shard in 0..4 {
        claims.push(plan_of(&m.assign(t(0), shard, token(1)), shard).job);
    }
    m.settle();
    // Shard 3's claim runs: it drains at the job's end.
    m.revoke(t(1), 3);
    m.job_ended(t(1), claims[3], Some(read(1)));
    m.assign(t(1), 5, token(1));
    m.assign(t(1), 6, token(1));
    assert_eq!(
        m.settle(),
        vec![
            Command::CallHook(HookCall::Revoked(0, vec![3])),
            Command::CallHook(HookCall::Assigned(vec![5, 6]))
        ]
    );
    assert!(m.settle().is_empty());
}

#[test]
fn rule_a_repeated_revocation_of_a_drained_shard_still_waits_for_its_hook() {
    let mut m = machine(1, REVOKED_HOOK);
    m.assign(t(0), 0, token(1));
    m.assign(t(0), 1, token(1));
    m.revoke(t(1), 1);
    let out = m.revoke(t(1), 1);
    assert_eq!(
        reports(&out),
        vec![Report::Draining {
            shard: 1,
            job: None
        }]
    );
    m.settle();
    let out = m.revoke(t(2), 1);
    assert_eq!(
        reports(&out),
        vec![Report::Draining {
            shard: 1,
            job: None
        }]
    );
    assert_eq!(
        m.hook_done(0, vec![1]),
        vec![Command::Report(Report::Revoked { shard: 1 })]
    );
    let out = m.revoke(t(3), 1);
    assert!(
        reports(&out).contains(&Report::Revoked { shard: 1 }),
        "answered: at once"
    );
}

#[test]
fn rule_a_fence_drops_the_revoked_reports_of_hooks_in_flight() {
    let mut m = machine(1, REVOKED_HOOK);
    m.assign(t(0), 0, token(1));
    m.assign(t(0), 1, token(1));
    m.settle();
    m.revoke(t(1), 1);
    m.settle();
    let out = m.fence(t(2));
    assert!(
        out.contains(&Command::CallHook(HookCall::Fenced(vec![0]))),
        "{out:?}"
    );
    assert!(out.contains(&Command::Disown { shard: 0 }));
    assert!(out.contains(&Command::AbortAll));
    assert!(reports(&m.hook_done(0, vec![1])).is_empty());
}

#[test]
fn rule_stopped_waits_for_every_job_and_every_revoked_hook() {
    let mut m = machine(1, REVOKED_HOOK);
    let job = plan_of(&m.assign(t(0), 0, token(1)), 0).job;
    m.settle();
    let out = m.shutdown(t(1));
    assert!(out.contains(&Command::Stop { job }), "{out:?}");
    assert!(!out.contains(&Command::Stopped));
    let out = m.revoke(t(1), 0);
    assert!(!out.contains(&Command::Stopped));
    let out = m.job_ended(t(2), job, Some(read(1)));
    assert!(
        !out.contains(&Command::Stopped),
        "the hook is not called yet: {out:?}"
    );
    let out = m.settle();
    assert_eq!(out, vec![Command::CallHook(HookCall::Revoked(0, vec![0]))]);
    let out = m.hook_done(0, vec![0]);
    assert_eq!(
        out,
        vec![
            Command::Report(Report::Revoked { shard: 0 }),
            Command::Stopped
        ]
    );
    assert!(!m.settle().contains(&Command::Stopped), "once");
}

#[test]
fn rule_progress_reports_each_moved_shard_once() {
    let (mut m, job) = reading(1, HooksSet::default());
    let first = m.progress();
    assert_eq!(first.len(), 1, "a new ownership reports once: {first:?}");
    assert!(m.progress().is_empty());
    let report = JobReport {
        last_delivered: Some("8-0".into()),
        last_acked: Some("7-0".into()),
        left_pending: 1,
        ..read(2)
    };
    let next = plan_of(&m.job_ended(t(1), job.job, Some(report)), 0);
    assert_eq!(
        m.progress(),
        vec![Command::Report(Report::Progress {
            shard: 0,
            last_delivered: Some("8-0".into()),
            last_acked: Some("7-0".into()),
            pending: 1,
            job: Some(next.job),
        })]
    );
    assert!(m.progress().is_empty());
}

#[test]
fn rule_a_withdrawn_lease_stops_starts_until_a_confirmation_renews_it() {
    let (mut m, job) = reading(1, HooksSet::default());
    m.observe_lease(t(5), t(5), 1);
    let out = m.job_ended(t(6), job.job, Some(read(1)));
    assert!(plans(&out).is_empty(), "{out:?}");
    assert_eq!(m.next_wake(t(6)), Some(t(56)), "polls the lease");
    let plan = plan_of(&m.observe_lease(t(7), FAR, 2), 0);
    assert_eq!(
        plan.kind,
        JobKind::ClaimOwn,
        "after a lapse: our own entries first"
    );
}

#[test]
fn rule_the_idle_wait_watches_from_where_the_reads_got_and_forgets_it_on_a_wake_up() {
    let (mut m, job) = reading(2, HooksSet::default());
    let report = JobReport {
        read_up_to: Some("3-0".into()),
        ..read(0)
    };
    let out = m.job_ended(t(1), job.job, Some(report));
    let (wait, shards) = out
        .iter()
        .find_map(|c| match c {
            Command::StartWait { job, shards, .. } => Some((*job, shards.clone())),
            _ => None,
        })
        .expect("a wait");
    assert_eq!(shards, vec![(0, Some("3-0".into()))]);
    let woke = WaitReport {
        new_entries: vec![0],
        ..WaitReport::default()
    };
    let plan = plan_of(&m.wait_ended(t(2), wait, Some(woke)), 0);
    assert_eq!(plan.kind, JobKind::Retry);
    let out = m.job_ended(t(3), plan.job, Some(read(0)));
    let shards = out
        .iter()
        .find_map(|c| match c {
            Command::StartWait { shards, .. } => Some(shards.clone()),
            _ => None,
        })
        .expect("the next wait");
    assert_eq!(shards, vec![(0, None)], "the group's position, read again");
}

/// The `StartWait` in `out`: the wait's job and its shards.
fn started_wait(out: &[Command]) -> (JobId, Vec<u32>) {
    out.iter()
        .find_map(|c| match c {
            Command::StartWait { job, shards, .. } => {
                Some((*job, shards.iter().map(|(s, _)| *s).collect()))
            }
            _ => None,
        })
        .expect("a wait")
}

/// Owning shards 0 and 1, both idle, in the wait: the machine and the wait's job.
fn waiting_on_two() -> (Machine, JobId) {
    let mut m = machine(3, HooksSet::default());
    let mut out = m.assign(t(0), 0, token(1));
    out.extend(m.assign(t(0), 1, token(2)));
    // Every job reads one entry once, then nothing; a wait over fewer shards ends empty.
    let mut read_once = std::collections::BTreeSet::new();
    let mut running: Vec<JobPlan> = plans(&out);
    let mut wait = None;
    for _ in 0..20 {
        wait = out
            .iter()
            .find_map(|c| match c {
                Command::StartWait { job, shards, .. } => {
                    Some((*job, shards.iter().map(|(s, _)| *s).collect::<Vec<_>>()))
                }
                _ => None,
            })
            .or(wait);
        out = match (running.pop(), wait.take()) {
            (None, Some((wait, shards))) if shards == [0, 1] => return (m, wait),
            (Some(plan), still) => {
                wait = still;
                let fetched = usize::from(read_once.insert(plan.shard));
                m.job_ended(t(0), plan.job, Some(read(fetched)))
            }
            (None, Some((wait, _))) => m.wait_ended(t(0), wait, Some(WaitReport::default())),
            (None, None) => panic!("nothing runs"),
        };
        running.extend(plans(&out));
    }
    panic!("no wait over both shards");
}

#[test]
fn rule_what_a_group_wait_delivered_is_handled_first_by_its_shards_next_job() {
    let (mut m, wait) = waiting_on_two();
    let delivered = vec![entry("5-0"), entry("6-0")];
    let report = WaitReport {
        new_entries: vec![1],
        delivered: vec![(1, delivered.clone())],
        ..WaitReport::default()
    };
    let out = m.wait_ended(t(1), wait, Some(report));
    let plan = plan_of(&out, 1);
    assert_eq!(plan.kind, JobKind::Delivered);
    assert_eq!(plan.deferred, delivered, "the delivered entries, in order");
    assert_eq!(plan.read_mode, ReadMode::Live);
    assert!(
        plans(&out).iter().all(|p| p.shard != 0),
        "shard 0 stays idle"
    );
    // Handled, and short of a batch: idle again, watched by the next wait.
    let out = m.job_ended(t(2), plan.job, Some(read(0)));
    assert_eq!(started_wait(&out).1, vec![0, 1]);
}

#[test]
fn rule_a_group_wait_whose_reply_was_lost_claims_its_shards_own_pending_entries_first() {
    let (mut m, wait) = waiting_on_two();
    let report = WaitReport {
        error: Some(redis::RedisError::from(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        ))),
        in_doubt: true,
        ..WaitReport::default()
    };
    let out = m.wait_ended(t(1), wait, Some(report));
    for shard in [0, 1] {
        assert_eq!(
            plan_of(&out, shard).read_mode,
            ReadMode::claim_own(),
            "shard {shard} reads on past what the lost reply may have delivered"
        );
    }
}

#[test]
fn a_group_waits_failure_is_in_doubt_unless_redis_answered() {
    let lost =
        || redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
    let refused = || redis::make_extension_error("NOGROUP".into(), Some("No such key".into()));
    let mut report = WaitReport::default();
    report.fail(lost(), true);
    assert!(report.in_doubt && report.error.is_some());
    let mut report = WaitReport::default();
    report.fail(refused(), true);
    assert!(!report.in_doubt && report.missing_group && report.error.is_none());
    let mut report = WaitReport::default();
    report.fail(lost(), false);
    assert!(!report.in_doubt, "an XREAD wait delivers nothing");
}

#[test]
fn rule_a_wait_that_ended_without_a_report_claims_its_shards_own_pending_entries_first() {
    let (mut m, wait) = waiting_on_two();
    let out = m.job_ended(t(1), wait, None);
    for shard in [0, 1] {
        assert_eq!(plan_of(&out, shard).read_mode, ReadMode::claim_own());
    }
}

#[test]
fn rule_a_busy_job_asked_back_goes_on_for_yield_after_unless_paused() {
    let short = YIELD_AFTER - Duration::from_millis(1);
    assert!(
        !hands_back(false, false, YIELD_AFTER * 10),
        "not asked: keeps its shard"
    );
    assert!(
        !hands_back(true, false, short),
        "asked for another shard: goes on a while"
    );
    assert!(hands_back(true, false, YIELD_AFTER), "then hands it back");
    assert!(hands_back(true, true, Duration::ZERO), "paused: at once");
}

// ---- riding the wait: a short delivery's job reads nothing, so the next wait covers its shard meanwhile --

/// A group wait's report delivering `entries` to `shard`, reading at most `count` a shard.
fn delivery(shard: u32, entries: &[&str], count: usize) -> WaitReport {
    WaitReport {
        new_entries: vec![shard],
        delivered: vec![(shard, entries.iter().map(|id| entry(id)).collect())],
        count,
        ..WaitReport::default()
    }
}

fn handled_short(fetched: usize) -> JobReport {
    JobReport {
        drained: true,
        ..read(fetched)
    }
}

fn interrupted(out: &[Command]) -> bool {
    out.iter()
        .any(|c| matches!(c, Command::InterruptWait { .. }))
}

/// Waiting on shards 0 and 1, the wait delivers a short batch `[5-0]` to shard 1, whose job outlasts the
/// next wait's hold: returns the machine, the job handling it and the next wait (over both).
fn riding() -> (Machine, JobPlan, JobId) {
    let (mut m, wait) = waiting_on_two();
    let out = m.wait_ended(t(1), wait, Some(delivery(1, &["5-0"], 25)));
    let job = plan_of(&out, 1);
    assert!(
        !out.iter().any(|c| matches!(c, Command::StartWait { .. })),
        "the next wait holds back for the pickup's job: {out:?}"
    );
    let out = m.tick(t(1).plus_duration(WAIT_HOLD));
    let (next, shards) = started_wait(&out);
    assert_eq!(shards, vec![0, 1]);
    (m, job, next)
}

/// Whether the `StartWait` in `out` reads again right behind its blocking read.
fn follows_up(out: &[Command]) -> bool {
    out.iter()
        .find_map(|c| match c {
            Command::StartWait { follow_up, .. } => Some(*follow_up),
            _ => None,
        })
        .expect("a wait")
}

#[test]
fn rule_after_a_wait_that_delivered_to_two_shards_the_next_reads_again_behind_its_block() {
    let (mut m, wait) = waiting_on_two();
    let both = WaitReport {
        new_entries: vec![0, 1],
        delivered: vec![(0, vec![entry("5-0")]), (1, vec![entry("6-0")])],
        count: 25,
        ..WaitReport::default()
    };
    let out = m.wait_ended(t(1), wait, Some(both));
    assert!(follows_up(&out), "a burst over two shards: follow up");
    let (next, _) = started_wait(&out);
    for shard in [0, 1] {
        m.job_ended(t(1), plan_of(&out, shard).job, Some(handled_short(1)));
    }
    // That wait delivers to one shard: the one after it does not follow up.
    let out = m.wait_ended(t(2), next, Some(delivery(1, &["7-0"], 25)));
    let job = plan_of(&out, 1);
    let mut out_all = out.clone();
    out_all.extend(m.job_ended(t(2), job.job, Some(handled_short(1))));
    assert!(
        !follows_up(&out_all),
        "one shard at a time: no empty read per pickup"
    );
    // Nor after one that failed.
    let (next, _) = started_wait(&out_all);
    let failed = WaitReport {
        error: Some(redis::RedisError::from((redis::ErrorKind::Io, "reset"))),
        delivered: vec![(0, vec![entry("8-0")]), (1, vec![entry("9-0")])],
        in_doubt: true,
        ..WaitReport::default()
    };
    let mut out = m.wait_ended(t(3), next, Some(failed));
    // Its shards claim their own pending entries first, then go idle.
    for plan in plans(&out.clone()) {
        out.extend(m.job_ended(t(3), plan.job, Some(read(0))));
    }
    for plan in plans(&out.clone()) {
        out.extend(m.job_ended(t(3), plan.job, Some(handled_short(0))));
    }
    assert!(!follows_up(&out), "a failed wait says nothing of bursts");
}

#[test]
fn rule_a_pickups_job_that_ends_within_the_hold_is_followed_by_one_wait_over_all() {
    let (mut m, wait) = waiting_on_two();
    let out = m.wait_ended(t(1), wait, Some(delivery(1, &["5-0"], 25)));
    let job = plan_of(&out, 1);
    let out = m.job_ended(t(1), job.job, Some(handled_short(1)));
    assert_eq!(started_wait(&out).1, vec![0, 1]);
    assert!(!interrupted(&out));
}

#[test]
fn rule_a_short_delivery_is_one_batch_and_its_shard_rides_the_next_wait() {
    let (_, job, _) = riding();
    assert_eq!(job.kind, JobKind::Delivered);
    assert_eq!(job.max_turns, 1, "handles the delivery and reads no more");
    assert_eq!(job.deferred, vec![entry("5-0")]);
}

#[test]
fn rule_a_full_delivery_reads_on_and_its_shard_rides_no_wait() {
    let (mut m, wait) = waiting_on_two();
    let out = m.wait_ended(t(1), wait, Some(delivery(1, &["5-0", "6-0"], 2)));
    let job = plan_of(&out, 1);
    assert_eq!(job.max_turns, MAX_TURNS, "more may be there: it reads on");
    // Shard 0 alone is waited on (once the hold for the woken shard's read is over).
    let out = m.tick(t(1).plus_duration(WAIT_HOLD));
    assert_eq!(started_wait(&out).1, vec![0]);
}

#[test]
fn rule_a_riding_shard_whose_job_ends_idle_stays_in_the_wait_without_an_interrupt() {
    let (mut m, job, next) = riding();
    let out = m.job_ended(t(2), job.job, Some(handled_short(1)));
    assert!(
        !interrupted(&out),
        "nothing to interrupt the wait for: {out:?}"
    );
    assert!(plans(&out).is_empty() && !out.iter().any(|c| matches!(c, Command::StartWait { .. })));
    // The wait ends empty: both shards are waited on again.
    let out = m.wait_ended(t(3), next, Some(WaitReport::default()));
    assert_eq!(started_wait(&out).1, vec![0, 1]);
}

#[test]
fn rule_what_a_wait_delivers_to_a_riding_shard_is_handled_after_its_job_in_order() {
    let (mut m, job, next) = riding();
    // The wait delivers more to shard 1 while its job still runs: nothing starts for it yet, and it rides
    // the wait after too (what is queued is short of a batch).
    let out = m.wait_ended(t(2), next, Some(delivery(1, &["7-0"], 25)));
    assert!(plans(&out).is_empty(), "a second job of shard 1: {out:?}");
    let (third, shards) = started_wait(&out);
    assert_eq!(shards, vec![0, 1]);
    let out = m.wait_ended(t(3), third, Some(delivery(1, &["8-0"], 25)));
    assert!(plans(&out).is_empty());
    // Its job ends: the next handles both deliveries, in order, as one batch again.
    let out = m.job_ended(t(4), job.job, Some(handled_short(1)));
    let after = plan_of(&out, 1);
    assert_eq!(after.kind, JobKind::Delivered);
    assert_eq!(after.deferred, vec![entry("7-0"), entry("8-0")]);
    assert_eq!(after.max_turns, 1);
}

#[test]
fn rule_a_riding_shard_with_a_batch_queued_rides_no_further_wait() {
    let (mut m, job, next) = riding();
    let out = m.wait_ended(t(2), next, Some(delivery(1, &["7-0", "8-0"], 2)));
    assert_eq!(started_wait(&out).1, vec![0], "memory stays bounded");
    let out = m.job_ended(t(3), job.job, Some(handled_short(1)));
    let after = plan_of(&out, 1);
    assert_eq!(after.deferred, vec![entry("7-0"), entry("8-0")]);
    assert_eq!(
        after.max_turns, MAX_TURNS,
        "a full batch was queued: it reads on"
    );
}

#[test]
fn rule_a_riding_shard_whose_job_failed_claims_what_the_wait_delivered_in_id_order() {
    // The job's entry may be pending still (its ack failed): handling the later delivery first would
    // break per-key order, so a claim of our own pending entries gets both, in id order.
    let (mut m, job, next) = riding();
    let out = m.wait_ended(t(2), next, Some(delivery(1, &["7-0"], 25)));
    let failed = JobReport {
        error: Some(redis::RedisError::from((redis::ErrorKind::Io, "reset"))),
        next_read_mode: Some(ReadMode::claim_own()),
        ..JobReport::default()
    };
    let wait = started_wait(&out).0;
    let out = m.job_ended(t(3), job.job, Some(failed));
    assert!(plans(&out).is_empty(), "backs off first");
    // Its backoff over (and the wait ended), it claims: nothing delivered is handled before.
    let mut out = m.wait_ended(t(4), wait, Some(WaitReport::default()));
    out.extend(m.tick(t(1_000)));
    let next = plan_of(&out, 1);
    assert_eq!(next.kind, JobKind::ClaimOwn);
    assert!(
        next.deferred.is_empty(),
        "handled before the claim: {next:?}"
    );
}

#[test]
fn rule_a_riding_shard_whose_job_fails_while_the_wait_runs_parks_until_it_ends() {
    let (mut m, job, next) = riding();
    let deferred = JobReport {
        deferred: vec![entry("5-0")],
        defer_for: Some(Duration::from_millis(10)),
        ..read(1)
    };
    let out = m.job_ended(t(2), job.job, Some(deferred));
    assert!(plans(&out).is_empty());
    // Its backoff ends while the wait still covers it: no second reader, the wait is interrupted.
    let out = m.tick(t(20));
    assert!(
        plans(&out).is_empty(),
        "a job beside the wait over its shard: {out:?}"
    );
    assert!(interrupted(&out));
    // The wait ends with a delivery to it: its retry handles both, in order.
    let out = m.wait_ended(t(21), next, Some(delivery(1, &["7-0"], 25)));
    let retry = plan_of(&out, 1);
    assert_eq!(retry.kind, JobKind::Retry);
    assert_eq!(retry.deferred, vec![entry("5-0"), entry("7-0")]);
}

#[test]
fn rule_a_revoked_riding_shard_is_reported_after_its_job_and_the_wait() {
    for job_first in [true, false] {
        let (mut m, job, next) = riding();
        let out = m.revoke(t(2), 1);
        assert!(out.contains(&Command::Stop { job: job.job }));
        assert!(interrupted(&out), "the wait is told to end");
        let revoked = |out: &[Command]| {
            reports(out)
                .iter()
                .any(|r| matches!(r, Report::Revoked { shard: 1 }))
        };
        let (first, second) = if job_first {
            (
                m.job_ended(t(3), job.job, Some(handled_short(1))),
                m.wait_ended(t(4), next, Some(delivery(1, &["7-0"], 25))),
            )
        } else {
            (
                m.wait_ended(t(3), next, Some(delivery(1, &["7-0"], 25))),
                m.job_ended(t(4), job.job, Some(handled_short(1))),
            )
        };
        assert!(
            !revoked(&first),
            "REVOKED while something still reads shard 1"
        );
        assert!(revoked(&second));
        assert!(plans(&second).iter().all(|p| p.shard != 1));
    }
}
