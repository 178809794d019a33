//! What a member's consumer is doing right now, for health checks and for naming what is stuck when a
//! shutdown misses its deadline: the handlers running (shard, entry, since when, their timeout) and the
//! shards whose reads keep failing.
//!
//! The consumer's jobs write it (a handler registers itself for the length of the attempt, a shard's
//! read error streak is set when its job ends); the runtime reads it. Plain mutexes: a handful of
//! updates per handled entry, never kept across an `.await`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// A handler attempt in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlight {
    /// Shard index.
    pub shard: u32,
    /// Entry id.
    pub id: String,
    /// How long it has been running.
    pub running_for: Duration,
    /// Its timeout, if the listener has one.
    pub timeout: Option<Duration>,
}

impl InFlight {
    /// Whether it has been running past its timeout (it should have been cancelled; a handler that
    /// blocks its thread without awaiting cannot be).
    pub fn overdue(&self) -> bool {
        self.timeout.is_some_and(|t| self.running_for > t)
    }
}

impl std::fmt::Display for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "shard {} entry {} running for {} ms",
            self.shard,
            self.id,
            self.running_for.as_millis()
        )
    }
}

#[derive(Debug, Default)]
struct State {
    /// The handler attempts, one slot each while it runs: registered per handled entry, so a slot and its
    /// id's buffer are reused (no allocation once there are as many as handlers ever ran at once).
    handlers: Vec<Slot>,
    /// Free slots.
    free: Vec<usize>,
    /// Shard -> consecutive failed reads (absent: the last read went through).
    read_errors: HashMap<u32, u32>,
    /// Handlers that were running when the consumer was fenced (and so aborted), since the last take.
    aborted: Vec<InFlight>,
}

/// One handler attempt's slot: its shard, entry id, start and timeout while `running`.
#[derive(Debug, Default)]
struct Slot {
    running: bool,
    shard: u32,
    id: String,
    started: Option<Instant>,
    timeout: Option<Duration>,
}

/// One member consumer's live state. Cheap to clone (shared).
#[derive(Debug, Clone, Default)]
pub struct Probe {
    state: Arc<Mutex<State>>,
}

impl Probe {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Plain data: a panic elsewhere cannot leave it half-updated.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a handler attempt until the returned guard is dropped.
    pub(crate) fn handler_started(
        &self,
        shard: u32,
        id: &str,
        timeout: Option<Duration>,
    ) -> HandlerGuard<'_> {
        let started = Instant::now();
        let mut state = self.state();
        let ticket = match state.free.pop() {
            Some(ticket) => ticket,
            None => {
                state.handlers.push(Slot::default());
                state.handlers.len() - 1
            }
        };
        let slot = &mut state.handlers[ticket];
        slot.running = true;
        slot.shard = shard;
        slot.id.clear();
        slot.id.push_str(id);
        slot.started = Some(started);
        slot.timeout = timeout;
        drop(state);
        HandlerGuard {
            probe: self,
            ticket,
            started,
        }
    }

    /// Records how a shard's last read went.
    pub(crate) fn read_result(&self, shard: u32, failed: bool) {
        let mut state = self.state();
        if failed {
            *state.read_errors.entry(shard).or_insert(0) += 1;
        } else {
            state.read_errors.remove(&shard);
        }
    }

    /// Notes the handlers running now as aborted (the consumer is fenced: at a shutdown deadline, or its
    /// lease was lost).
    pub(crate) fn aborting(&self) {
        let running = self.in_flight();
        self.state().aborted.extend(running);
    }

    /// The handlers aborted by fences since the last call.
    pub fn take_aborted(&self) -> Vec<InFlight> {
        std::mem::take(&mut self.state().aborted)
    }

    /// Forgets a shard (revoked, fenced).
    pub(crate) fn forget_shard(&self, shard: u32) {
        self.state().read_errors.remove(&shard);
    }

    /// The handler attempts running now, oldest first.
    pub fn in_flight(&self) -> Vec<InFlight> {
        let now = Instant::now();
        let mut all: Vec<InFlight> = self
            .state()
            .handlers
            .iter()
            .filter(|slot| slot.running)
            .map(|slot| InFlight {
                shard: slot.shard,
                id: slot.id.clone(),
                running_for: slot.started.map_or(Duration::ZERO, |started| {
                    now.saturating_duration_since(started)
                }),
                timeout: slot.timeout,
            })
            .collect();
        all.sort_by_key(|h| std::cmp::Reverse(h.running_for));
        all
    }

    /// Shards whose last `n >= 1` reads failed, with `n`, by shard.
    pub fn failing_reads(&self) -> Vec<(u32, u32)> {
        let mut all: Vec<(u32, u32)> = self
            .state()
            .read_errors
            .iter()
            .map(|(s, n)| (*s, *n))
            .collect();
        all.sort_unstable();
        all
    }
}

/// Unregisters a handler attempt when dropped (also when the attempt is cancelled or aborted). It borrows
/// the probe: a clone per handled entry was an atomic count moved between the workers' cores.
#[derive(Debug)]
pub(crate) struct HandlerGuard<'a> {
    probe: &'a Probe,
    ticket: usize,
    started: Instant,
}

impl HandlerGuard<'_> {
    /// When the attempt was registered.
    pub(crate) fn started(&self) -> Instant {
        self.started
    }
}

impl Drop for HandlerGuard<'_> {
    fn drop(&mut self) {
        let mut state = self.probe.state();
        if let Some(slot) = state.handlers.get_mut(self.ticket) {
            slot.running = false;
            state.free.push(self.ticket);
        }
    }
}

/// Consecutive failed reads of one shard from which it counts as stuck in a read error loop.
pub const READ_ERROR_LOOP: u32 = 3;

/// One member's health, as [`RunningRuntime::health`](crate::RunningRuntime::health) reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemberHealth {
    /// The member id.
    pub member_id: String,
    /// Its heartbeat loop is running.
    pub heartbeating: bool,
    /// It has joined (has an epoch) and its lease is ahead: not self-fenced.
    pub joined: bool,
    /// Heartbeats failed in a row.
    pub heartbeat_failures: u32,
    /// Shards whose last reads all failed ([`READ_ERROR_LOOP`] or more in a row), with the count.
    pub failing_reads: Vec<(u32, u32)>,
    /// Handlers running past their timeout (blocking their thread: a timeout cannot cancel them).
    pub overdue_handlers: Vec<InFlight>,
}

impl MemberHealth {
    /// Alive: heartbeating, and no handler stuck past its timeout.
    pub fn live(&self) -> bool {
        self.heartbeating && self.overdue_handlers.is_empty()
    }

    /// Ready: live, joined and not self-fenced, and no shard stuck in a read error loop.
    pub fn ready(&self) -> bool {
        self.live() && self.joined && self.failing_reads.is_empty()
    }
}

/// The process's health: readiness and liveness for Kubernetes probes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// Every member.
    pub members: Vec<MemberHealth>,
}

impl Health {
    /// Liveness: every member is live (restart the process otherwise).
    pub fn live(&self) -> bool {
        self.members.iter().all(MemberHealth::live)
    }

    /// Readiness: every member is ready.
    pub fn ready(&self) -> bool {
        self.members.iter().all(MemberHealth::ready)
    }
}

impl Probe {
    /// This member's health from its probe and what the runtime knows.
    pub(crate) fn member_health(
        &self,
        member_id: &str,
        heartbeating: bool,
        joined: bool,
        heartbeat_failures: u32,
    ) -> MemberHealth {
        MemberHealth {
            member_id: member_id.to_owned(),
            heartbeating,
            joined,
            heartbeat_failures,
            failing_reads: self
                .failing_reads()
                .into_iter()
                .filter(|(_, n)| *n >= READ_ERROR_LOOP)
                .collect(),
            overdue_handlers: self
                .in_flight()
                .into_iter()
                .filter(InFlight::overdue)
                .collect(),
        }
    }
}

/// What [`HealthHandle`] reads of one member.
#[derive(Debug, Clone)]
pub(crate) struct MemberWatch {
    pub(crate) member_id: String,
    pub(crate) probe: Probe,
    pub(crate) deadline: Arc<crate::member::lifecycle::OwnershipDeadline>,
    pub(crate) status: tokio::sync::watch::Receiver<crate::member::heartbeat::MemberStatus>,
}

/// A cloneable, `Send` view of a running runtime's health, for probes served from another task or
/// thread (see `RunningRuntime::health_handle`). It reads what [`RunningRuntime::health`] reads;
/// the heartbeat loop counts as running while its status channel is open (the loop owns the sender).
///
/// [`RunningRuntime::health`]: crate::RunningRuntime::health
#[derive(Debug, Clone)]
pub struct HealthHandle {
    pub(crate) members: Vec<MemberWatch>,
}

impl HealthHandle {
    /// A handle with no member, always live and ready: for a process that runs none (the lag exporter).
    pub fn without_members() -> Self {
        Self {
            members: Vec::new(),
        }
    }

    /// Readiness and liveness of every member now.
    pub fn health(&self) -> Health {
        Health {
            members: self
                .members
                .iter()
                .map(|m| {
                    let heartbeating = m.status.has_changed().is_ok();
                    let status = m.status.borrow();
                    m.probe.member_health(
                        &m.member_id,
                        heartbeating,
                        status.phase == crate::member::session::Phase::Member
                            && m.deadline.is_valid(),
                        status.failures,
                    )
                })
                .collect(),
        }
    }
}
