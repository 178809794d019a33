//! The heartbeat loop of one logical member: a tokio task around a [`MemberSession`] and a [`GroupStore`].
//!
//! It heartbeats at the interval the coordinator returns (at once after a join, a rejoin, or a REVOKED
//! report, so hand-offs do not wait a whole interval), forwards [`ShardCommand`]s to the consumption layer
//! and folds its [`ShardReport`]s into the next heartbeat. It self-fences when it cannot renew its lease in
//! time (see [`MemberSession`]), keeps retrying Redis with backoff, and rejoins on its own when Redis comes
//! back. On shutdown it revokes everything, waits for the drains (bounded by a deadline), and leaves.
//!
//! The store has its own Redis connection: heartbeats never queue behind a blocking read.

use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use std::sync::Arc;

use crate::member::lifecycle::{OwnershipDeadline, ShardCommand, ShardReport};
use crate::member::session::{MemberSession, Phase};
use crate::store::GroupStore;

/// What a member looks like from outside, for status reporting and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberStatus {
    /// Where it is in its life.
    pub phase: Phase,
    /// Its member epoch (0 while joining).
    pub epoch: i64,
    /// Shards it reads now.
    pub owned: Vec<u32>,
    /// Heartbeats that failed in a row.
    pub failures: u32,
}

/// The channels and limits of one member's heartbeat loop.
#[derive(Debug)]
pub struct MemberLoop {
    /// The protocol state.
    pub session: MemberSession,
    /// The group's metadata.
    pub store: GroupStore,
    /// Down to the consumption layer.
    pub commands: mpsc::UnboundedSender<ShardCommand>,
    /// Up from the consumption layer.
    pub reports: mpsc::UnboundedReceiver<ShardReport>,
    /// Becomes `true` to leave gracefully.
    pub shutdown: watch::Receiver<bool>,
    /// Published after every change.
    pub status: watch::Sender<MemberStatus>,
    /// How long a graceful leave may wait for drains.
    pub shutdown_timeout: Duration,
    /// The self-fencing deadline the consumption layer checks before every command; this loop moves it.
    /// Its origin is the loop's local clock.
    pub deadline: Arc<OwnershipDeadline>,
}

impl MemberLoop {
    /// Runs until the member has left (after shutdown) or the shutdown deadline passed.
    pub async fn run(mut self) {
        let start = Instant::from_std(self.deadline.origin());
        let deadline = self.deadline.clone();
        let local = move || deadline.local_ms();
        let mut next_heartbeat = Instant::now();
        let mut failures = 0u32;
        let mut leave_deadline: Option<Instant> = None;
        let mut reports_open = true;
        loop {
            let lease_deadline = self.lease_instant(start);
            let far = Instant::now() + Duration::from_secs(3600);
            tokio::select! {
                _ = tokio::time::sleep_until(next_heartbeat) => {}
                _ = tokio::time::sleep_until(lease_deadline) => {}
                _ = tokio::time::sleep_until(leave_deadline.unwrap_or(far)) => {}
                report = self.reports.recv(), if reports_open => match report {
                    Some(report) => {
                        if self.apply_report(report) {
                            next_heartbeat = Instant::now();
                        }
                    }
                    None => reports_open = false,
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
            let commands = self.session.check_lease(local());
            if !commands.is_empty() {
                tracing::warn!(member = %self.session.member_id(), "lease could not be renewed in time: self-fenced");
                self.send(commands);
            }
            if let Some(deadline) = leave_deadline {
                if Instant::now() >= deadline {
                    tracing::warn!(member = %self.session.member_id(), "shutdown deadline passed before the leave completed");
                    self.deadline.set(i64::MIN);
                    let _ = self.commands.send(ShardCommand::Fence);
                    break;
                }
            }
            if Instant::now() < next_heartbeat {
                continue;
            }
            let interval = Duration::from_millis(self.session.heartbeat_interval_ms() as u64);
            // Never wait on Redis past the point where ownership must be given up.
            let budget = lease_deadline
                .saturating_duration_since(Instant::now())
                .clamp(Duration::from_millis(10), interval);
            let request = self.session.heartbeat(local(), 0);
            let span = tracing::debug_span!("heartbeat", member = %self.session.member_id(), epoch = request.member_epoch);
            match tokio::time::timeout(
                budget,
                tracing::Instrument::instrument(self.store.heartbeat(&request), span),
            )
            .await
            {
                Ok(Ok(response)) => {
                    failures = 0;
                    if response.status.requires_rejoin() {
                        tracing::info!(member = %self.session.member_id(), status = ?response.status, "ownership invalid: rejoining");
                    }
                    let commands = self.session.on_response(&response);
                    if response.status.is_accepted() {
                        self.deadline.confirm();
                    }
                    self.send(commands);
                    next_heartbeat = Instant::now()
                        + Duration::from_millis(self.session.next_heartbeat_delay_ms() as u64);
                }
                Ok(Err(error)) => {
                    failures += 1;
                    tracing::warn!(member = %self.session.member_id(), %error, failures, "heartbeat failed");
                    next_heartbeat = Instant::now() + backoff(failures, interval);
                }
                Err(_) => {
                    failures += 1;
                    tracing::warn!(member = %self.session.member_id(), failures, "heartbeat timed out");
                    next_heartbeat = Instant::now() + backoff(failures, interval);
                }
            }
            self.publish(failures);
            if self.session.phase() == Phase::Left {
                break;
            }
        }
        self.publish(failures);
    }

    fn lease_instant(&self, start: Instant) -> Instant {
        let until = self.session.valid_until();
        if until == i64::MIN
            || self.session.owned().is_empty() && self.session.draining().next().is_none()
        {
            // Nothing to give up: wake for heartbeats only.
            return Instant::now() + Duration::from_secs(3600);
        }
        start + Duration::from_millis(until.max(0) as u64)
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

    /// Publishes the session's deadline first (a grant must find it valid, a fence must find it gone),
    /// then hands the commands down.
    fn send(&self, commands: Vec<ShardCommand>) {
        self.deadline.set(self.session.valid_until());
        for command in commands {
            // A consumption layer that is gone cannot read either.
            let _ = self.commands.send(command);
        }
    }

    fn publish(&self, failures: u32) {
        let status = MemberStatus {
            phase: self.session.phase(),
            epoch: self.session.epoch(),
            owned: self.session.owned().iter().copied().collect(),
            failures,
        };
        self.status.send_if_modified(|current| {
            let changed = *current != status;
            *current = status;
            changed
        });
    }
}

/// Exponential backoff from 50 ms, capped at the heartbeat interval.
fn backoff(failures: u32, interval: Duration) -> Duration {
    let ms = 50u64.saturating_mul(1 << failures.min(10));
    Duration::from_millis(ms).min(interval)
}
