//! The heartbeat loop of one logical member: a tokio task around a [`MemberSession`] and a [`GroupStore`].
//!
//! It heartbeats at the interval the coordinator returns (at once after a join, a rejoin, or a REVOKED
//! report, so hand-offs do not wait a whole interval), forwards [`ShardCommand`]s to the consumption layer
//! and folds its [`ShardReport`]s into the next heartbeat. It self-fences when it cannot renew its lease in
//! time (see [`MemberSession`]), keeps retrying Redis with backoff, and rejoins on its own when Redis comes
//! back. On shutdown it revokes everything, waits for the drains (bounded by a deadline), and leaves.
//!
//! The store has its own Redis connection: heartbeats never queue behind a blocking read.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::{mpsc, watch, Notify};
use tokio::time::Instant;

use std::sync::Arc;

use crate::clock::LocalMillis;
use crate::coordinator::projection::GroupState;
use crate::coordinator::wire::HeartbeatStatus;
use crate::member::lifecycle::{OwnershipDeadline, ShardCommand, ShardReport};
use crate::member::session::{MemberSession, Phase};
use crate::store::GroupStore;

/// What a member looks like from outside, for status reporting, metrics and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemberStatus {
    /// Where it is in its life.
    pub phase: Phase,
    /// Its member epoch (0 while joining).
    pub epoch: i64,
    /// Shards it reads now.
    pub owned: Vec<u32>,
    /// Heartbeats that failed in a row.
    pub failures: u32,
    /// Shards targeted to it but not yet released by their previous owner (last accepted response).
    pub pending: u32,
    /// Shards it is giving up and may still touch (draining).
    pub revoking: u32,
    /// The group epoch of the last accepted response.
    pub group_epoch: i64,
    /// The target assignment epoch of the last accepted response.
    pub assignment_epoch: i64,
    /// The group's state as of the last heartbeat's snapshot (`None` before the first).
    pub group_state: Option<GroupState>,
    /// Heartbeats sent so far, by outcome (see [`heartbeat_outcome`]); cumulative, so a reader that
    /// misses intermediate statuses still counts every one.
    pub heartbeats: BTreeMap<&'static str, u64>,
    /// Times it self-fenced because its lease could not be renewed in time; cumulative.
    pub self_fences: u64,
    /// Rebalances it saw complete (the group's state went from ASSIGNING or RECONCILING back to
    /// STABLE between two of its heartbeats); cumulative.
    pub rebalances: u64,
    /// How long the last completed rebalance took, from the first heartbeat that saw the group
    /// unsettled to the first that saw it STABLE (so within a heartbeat interval or so).
    pub last_rebalance: Duration,
}

/// A heartbeat's outcome as a metric label: the response status in snake case, or `error` (Redis
/// failed) or `timeout` (no answer within the budget).
pub fn heartbeat_outcome(status: HeartbeatStatus) -> &'static str {
    match status {
        HeartbeatStatus::Ok => "ok",
        HeartbeatStatus::Retry => "retry",
        HeartbeatStatus::SyncMetadata => "sync_metadata",
        HeartbeatStatus::RevokePending => "revoke_pending",
        HeartbeatStatus::UnknownMemberId => "unknown_member_id",
        HeartbeatStatus::FencedMemberEpoch => "fenced_member_epoch",
        HeartbeatStatus::UnsupportedProtocol => "unsupported_protocol",
        HeartbeatStatus::InvalidRequest => "invalid_request",
    }
}

/// One member's heartbeat loop: its session, its store, and the channels to the consumption layer. Build
/// it with [`MemberLoop::new`], then [`run`](MemberLoop::run) it on a task.
#[derive(Debug)]
pub struct MemberLoop {
    /// The protocol state.
    session: MemberSession,
    /// The group's metadata.
    store: GroupStore,
    /// Down to the consumption layer.
    commands: mpsc::UnboundedSender<ShardCommand>,
    /// Up from the consumption layer.
    reports: mpsc::UnboundedReceiver<ShardReport>,
    /// Becomes `true` to leave gracefully.
    shutdown: watch::Receiver<bool>,
    /// Published after every change.
    status: watch::Sender<MemberStatus>,
    /// How long a graceful leave may wait for drains.
    shutdown_timeout: Duration,
    /// The self-fencing deadline the consumption layer checks before every command; this loop moves it.
    /// Its origin is the loop's local clock.
    deadline: Arc<OwnershipDeadline>,
    /// Notified when a commit by someone else granted or revoked this member's shards
    /// ([`crate::store::wakeup`]): heartbeat now rather than at the next interval.
    wakeup: Arc<Notify>,
}

/// How long a graceful leave waits for drains unless [`MemberLoop::with_shutdown_timeout`] says otherwise.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

impl MemberLoop {
    /// A loop for `session` on `store` that sends [`ShardCommand`]s on `commands`, folds the
    /// [`ShardReport`]s of `reports` into its heartbeats, moves `deadline` (which the consumption layer
    /// checks before every command) and leaves once `shutdown` becomes `true` (or its sender is dropped).
    /// Its status is published only with [`MemberLoop::with_status`]; a leave waits
    /// [`DEFAULT_SHUTDOWN_TIMEOUT`] for drains unless [`MemberLoop::with_shutdown_timeout`] says otherwise.
    pub fn new(
        session: MemberSession,
        store: GroupStore,
        deadline: Arc<OwnershipDeadline>,
        commands: mpsc::UnboundedSender<ShardCommand>,
        reports: mpsc::UnboundedReceiver<ShardReport>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        Self {
            session,
            store,
            commands,
            reports,
            shutdown,
            status: watch::channel(MemberStatus::default()).0,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            deadline,
            wakeup: Arc::new(Notify::new()),
        }
    }

    /// Heartbeats at once whenever `wakeup` is notified (see [`crate::store::wakeup::Wakeups`]), so a
    /// hand-off does not wait for the interval. Without it the member keeps the interval pacing.
    pub fn with_wakeup(mut self, wakeup: Arc<Notify>) -> Self {
        self.wakeup = wakeup;
        self
    }

    /// Publishes the member's [`MemberStatus`] on `status` after every change.
    pub fn with_status(mut self, status: watch::Sender<MemberStatus>) -> Self {
        self.status = status;
        self
    }

    /// How long a graceful leave may wait for the drains of its shards.
    pub fn with_shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// Runs until the member has left (after shutdown) or the shutdown deadline passed.
    pub async fn run(mut self) {
        let start = Instant::from_std(self.deadline.origin());
        let deadline = self.deadline.clone();
        let local = move || deadline.local_now();
        let mut next_heartbeat = Instant::now();
        let mut failures = 0u32;
        // The WARNs of failed heartbeats: an outage fails every one until Redis is back.
        let mut warnings = crate::throttle::Throttle::default();
        let mut counts = Counts::default();
        let mut leave_deadline: Option<Instant> = None;
        let mut reports_open = true;
        let wakeup = self.wakeup.clone();
        loop {
            let lease_deadline = self.lease_instant(start);
            let far = Instant::now() + Duration::from_secs(3600);
            tokio::select! {
                _ = tokio::time::sleep_until(next_heartbeat) => {}
                _ = tokio::time::sleep_until(lease_deadline) => {}
                _ = tokio::time::sleep_until(leave_deadline.unwrap_or(far)) => {}
                () = wakeup.notified() => next_heartbeat = next_heartbeat.min(Instant::now()),
                report = self.reports.recv(), if reports_open => match report {
                    Some(report) => {
                        if self.apply_report(report) {
                            next_heartbeat = Instant::now();
                        }
                    }
                    None => {
                        reports_open = false;
                        if leave_deadline.is_none() {
                            // The consumption layer is gone (it panicked): nothing reads or
                            // acknowledges these shards any more. Give them up now rather than hold
                            // them, heartbeating, until the process restarts.
                            tracing::error!(member = %self.session.member_id(), shards = ?self.session.owned(), "the consumer stopped unexpectedly: leaving the group so its shards move");
                            self.leave_without_consumer();
                            leave_deadline = Some(Instant::now() + self.shutdown_timeout);
                            next_heartbeat = Instant::now();
                        }
                    }
                },
                changed = self.shutdown.changed(), if leave_deadline.is_none() => {
                    if changed.is_err() || *self.shutdown.borrow() {
                        leave_deadline = Some(Instant::now() + self.shutdown_timeout);
                        let commands = self.session.begin_leave();
                        self.send(commands);
                        next_heartbeat = Instant::now();
                    }
                }
            }
            while let Ok(report) = self.reports.try_recv() {
                self.apply_report(report);
            }
            let owned: Vec<u32> = self.session.owned().iter().copied().collect();
            let commands = self.session.check_lease(local());
            if !commands.is_empty() {
                counts.self_fences += 1;
                tracing::warn!(member = %self.session.member_id(), shards = ?owned, "lease could not be renewed in time: self-fenced");
                self.send(commands);
            }
            if let Some(deadline) = leave_deadline {
                if Instant::now() >= deadline {
                    tracing::warn!(member = %self.session.member_id(), "shutdown deadline passed before the leave completed");
                    self.deadline.set(LocalMillis::MIN);
                    let _ = self.commands.send(ShardCommand::Fence);
                    break;
                }
            }
            if Instant::now() < next_heartbeat {
                continue;
            }
            let interval = Duration::from_millis(self.session.heartbeat_interval_ms() as u64);
            let budget = attempt_budget(
                lease_deadline.saturating_duration_since(Instant::now()),
                interval,
                Duration::from_millis(self.session.session_timeout_ms().max(0) as u64),
            );
            let request = self.session.heartbeat(local(), 0);
            let span = tracing::debug_span!("heartbeat", member = %self.session.member_id(), epoch = request.member_epoch);
            match tokio::time::timeout(
                budget,
                tracing::Instrument::instrument(self.store.heartbeat(&request), span),
            )
            .await
            {
                Ok(Ok(response)) => {
                    if failures > 0 {
                        tracing::info!(member = %self.session.member_id(), failures, "heartbeat recovered");
                    }
                    warnings.clear();
                    failures = 0;
                    *counts
                        .heartbeats
                        .entry(heartbeat_outcome(response.status))
                        .or_insert(0) += 1;
                    let before: Vec<u32> = self.session.owned().iter().copied().collect();
                    let was_joining = self.session.phase() == Phase::Joining;
                    if response.status.requires_rejoin() {
                        tracing::info!(member = %self.session.member_id(), status = ?response.status, shards = ?before, "ownership invalid: dropping every shard and rejoining");
                    }
                    let commands = self.session.on_response(&response);
                    if response.status.is_accepted() {
                        self.deadline.confirm();
                        counts.pending = response.assignment.pending_shards.len() as u32;
                        counts.group_epoch = response.group_epoch;
                        counts.assignment_epoch = response.assignment_epoch;
                        if was_joining && self.session.phase() == Phase::Member {
                            tracing::info!(member = %self.session.member_id(), epoch = self.session.epoch(), "joined the group");
                        }
                    }
                    counts.group_state = self.store.group_state();
                    counts.follow_rebalance();
                    let after: Vec<u32> = self.session.owned().iter().copied().collect();
                    if after != before {
                        let assigned: Vec<u32> = after
                            .iter()
                            .filter(|s| !before.contains(s))
                            .copied()
                            .collect();
                        let revoked: Vec<u32> = before
                            .iter()
                            .filter(|s| !after.contains(s))
                            .copied()
                            .collect();
                        tracing::info!(member = %self.session.member_id(), epoch = self.session.epoch(), ?assigned, ?revoked, owned = ?after, "assignment changed");
                    }
                    self.send(commands);
                    next_heartbeat = Instant::now()
                        + Duration::from_millis(self.session.next_heartbeat_delay_ms() as u64);
                }
                Ok(Err(error)) => {
                    failures += 1;
                    *counts.heartbeats.entry("error").or_insert(0) += 1;
                    if let Some(not_logged) = warnings.admit(local()) {
                        tracing::warn!(member = %self.session.member_id(), %error, failures, not_logged, "heartbeat failed");
                    }
                    next_heartbeat = Instant::now() + backoff(failures, interval);
                }
                Err(_) => {
                    failures += 1;
                    *counts.heartbeats.entry("timeout").or_insert(0) += 1;
                    if let Some(not_logged) = warnings.admit(local()) {
                        tracing::warn!(member = %self.session.member_id(), failures, not_logged, "heartbeat timed out");
                    }
                    next_heartbeat = Instant::now() + backoff(failures, interval);
                }
            }
            self.publish(failures, &counts);
            if self.session.phase() == Phase::Left {
                break;
            }
        }
        self.publish(failures, &counts);
    }

    fn lease_instant(&self, start: Instant) -> Instant {
        let until = self.session.valid_until();
        if until == LocalMillis::MIN
            || self.session.owned().is_empty() && self.session.draining().next().is_none()
        {
            // Nothing to give up: wake for heartbeats only.
            return Instant::now() + Duration::from_secs(3600);
        }
        start + Duration::from_millis(until.0.max(0) as u64)
    }

    /// Folds a report into the session; `true` if a heartbeat should go out now.
    fn apply_report(&mut self, report: ShardReport) -> bool {
        match report {
            ShardReport::Draining { shard, in_flight } => {
                self.session.on_draining(shard, in_flight);
                false
            }
            ShardReport::Revoked { shard } => {
                self.session.on_revoked(shard);
                true
            }
            ShardReport::Progress(progress) => {
                self.session.record_progress(progress);
                false
            }
        }
    }

    /// Leaves with nothing to drain: the consumption layer is gone, so no job of it may touch Redis
    /// again (the deadline stays passed) and every shard counts as revoked at once.
    fn leave_without_consumer(&mut self) {
        self.deadline.set(LocalMillis::MIN);
        let _ = self.session.begin_leave();
        let draining: Vec<u32> = self.session.draining().collect();
        for shard in draining {
            self.session.on_revoked(shard);
        }
    }

    /// Publishes the session's deadline first (a grant must find it valid, a fence must find it gone),
    /// then hands the commands down. Without a consumption layer the deadline stays passed.
    fn send(&self, commands: Vec<ShardCommand>) {
        if self.reports.is_closed() {
            self.deadline.set(LocalMillis::MIN);
            return;
        }
        match self.session.valid_until() {
            // The membership is gone (lost, fenced, left): no token it handed down counts again, even
            // once a rejoin moves the deadline ahead before the consumption layer handled the fence.
            LocalMillis::MIN => self
                .deadline
                .withdraw(self.session.highest_epoch().saturating_add(1)),
            until => self.deadline.set(until),
        }
        for command in commands {
            // A consumption layer that is gone cannot read either.
            let _ = self.commands.send(command);
        }
    }

    fn publish(&self, failures: u32, counts: &Counts) {
        let status = MemberStatus {
            phase: self.session.phase(),
            epoch: self.session.epoch(),
            owned: self.session.owned().iter().copied().collect(),
            failures,
            pending: counts.pending,
            revoking: self.session.draining().count() as u32,
            group_epoch: counts.group_epoch,
            assignment_epoch: counts.assignment_epoch,
            group_state: counts.group_state,
            heartbeats: counts.heartbeats.clone(),
            self_fences: counts.self_fences,
            rebalances: counts.rebalances,
            last_rebalance: counts.last_rebalance,
        };
        self.status.send_if_modified(|current| {
            let changed = *current != status;
            *current = status;
            changed
        });
    }
}

/// What the loop tracks for [`MemberStatus`] beyond the session's own state.
#[derive(Debug, Default)]
struct Counts {
    pending: u32,
    group_epoch: i64,
    assignment_epoch: i64,
    group_state: Option<GroupState>,
    heartbeats: BTreeMap<&'static str, u64>,
    self_fences: u64,
    rebalances: u64,
    last_rebalance: Duration,
    /// When this member first saw the current rebalance.
    rebalance_since: Option<Instant>,
}

impl Counts {
    /// Starts or ends the rebalance this member is watching, from the group state just seen.
    fn follow_rebalance(&mut self) {
        match (self.group_state, self.rebalance_since) {
            (Some(GroupState::Assigning | GroupState::Reconciling), None) => {
                self.rebalance_since = Some(Instant::now());
            }
            (Some(GroupState::Stable), Some(since)) => {
                self.rebalances += 1;
                self.last_rebalance = since.elapsed();
                self.rebalance_since = None;
            }
            _ => {}
        }
    }
}

/// How long one heartbeat attempt may wait for Redis, with `lease_left` until the member must give up its
/// shards: never past that point, and at most two thirds of the session (at least an interval). An attempt
/// may need several round trips (a reload, then a renewal or a commit, or a join's load, enqueue, commit
/// and release); capping it at one interval
/// abandoned every attempt of a member whose round trip is a large fraction of the interval, although Redis
/// applied them, until it self-fenced while the group still counted it alive. Each command also has its
/// own response timeout of an interval, so a dead connection still fails fast.
pub fn attempt_budget(lease_left: Duration, interval: Duration, session: Duration) -> Duration {
    lease_left.clamp(Duration::from_millis(10), interval.max(session * 2 / 3))
}

/// Exponential backoff from 50 ms, capped at the heartbeat interval.
fn backoff(failures: u32, interval: Duration) -> Duration {
    crate::util::exponential_backoff(Duration::from_millis(50), failures, interval)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn an_attempt_may_take_two_thirds_of_the_session_over_a_slow_link() {
        // 500 ms heartbeats, a 5 s session: a join's five round trips at 300 ms each fit, and so do a
        // reload and a renewal with 1 s of lease left.
        assert_eq!(
            attempt_budget(MS(3_600_000), MS(500), MS(5_000)),
            MS(10_000) / 3
        );
        assert_eq!(attempt_budget(MS(1_000), MS(500), MS(5_000)), MS(1_000));
    }

    #[test]
    fn an_attempt_never_waits_past_the_lease() {
        assert_eq!(attempt_budget(MS(120), MS(500), MS(5_000)), MS(120));
        assert_eq!(attempt_budget(Duration::ZERO, MS(500), MS(5_000)), MS(10));
    }

    #[test]
    fn an_attempt_may_always_take_an_interval() {
        assert_eq!(attempt_budget(MS(60_000), MS(2_000), MS(3_000)), MS(2_000));
    }
}
