//! The contract between a member's heartbeat loop and the consumption layer (polling adapter and workers).
//!
//! The heartbeat loop decides, from coordinator responses and its own lease clock, which shards the member
//! may read; the consumption layer does the reading. They talk over two channels: [`ShardCommand`]s go down,
//! [`ShardReport`]s come back up, and the heartbeat loop forwards the reports to the coordinator.
//!
//! Both channels are unbounded: a send never waits and never drops. The heartbeat loop must never block
//! on the consumer (its lease would run out), and a lost REVOKED report would stall the shard's hand-off.
//! Neither queue grows in practice: commands follow heartbeat responses, progress is reported once per
//! changed shard and progress interval, and each side drains its receiver at every turn of its loop (a
//! heartbeat waits at most one interval). A closed channel means the other side is gone.

use std::sync::Arc;

use crate::clock::LocalMillis;
use crate::coordinator::wire::ShardProgress;

/// Proof of ownership given to every message: the member and the member epoch that owned the shard when
/// the message was read. Member epochs of successive owners of one shard only grow, so a sink that
/// remembers the highest token it has seen per shard can refuse writes from a zombie owner.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FencingToken {
    /// The owning member.
    pub member_id: Arc<str>,
    /// Its member epoch at the time of the grant.
    pub member_epoch: i64,
}

/// What the heartbeat loop tells the consumption layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardCommand {
    /// The member may now read `shard`: claim what earlier owners left pending, then read new entries.
    Assign {
        /// The shard index.
        shard: u32,
        /// Ownership proof to hand to every message of this shard.
        token: FencingToken,
    },
    /// Stop new reads of `shard`, finish in-flight handlers, acknowledge, then report
    /// [`ShardReport::Revoked`].
    Revoke {
        /// The shard index.
        shard: u32,
    },
    /// Ownership of everything is lost (fenced, unknown member, or the lease could not be renewed): stop
    /// reading and acknowledging at once; do not report anything for these shards.
    Fence,
}

/// What the consumption layer tells the heartbeat loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardReport {
    /// A revoked shard has stopped new reads; `in_flight` handlers are still running.
    Draining {
        /// The shard index.
        shard: u32,
        /// Handler executions still running.
        in_flight: u32,
    },
    /// A revoked shard has nothing in flight any more: the coordinator may hand it on.
    Revoked {
        /// The shard index.
        shard: u32,
    },
    /// Progress of an owned shard, reported in heartbeats for monitoring.
    Progress(ShardProgress),
}

/// The member's self-fencing deadline on the local monotonic clock, shared by the heartbeat loop (which
/// moves it after every accepted heartbeat) and the consumption layer (which reads it right before every
/// read, claim, ack, dead letter and handler start).
///
/// Checking the clock at the command, rather than waiting for a [`ShardCommand::Fence`] from the heartbeat
/// task, is what keeps a process that was frozen past its lease (SIGSTOP, a long GC-like stall, a throttled
/// container) from touching a shard after it resumes: the monotonic clock kept running while it was frozen,
/// so the first check after the resume fails, before any command leaves the process.
#[derive(Debug)]
pub struct OwnershipDeadline {
    origin: std::time::Instant,
    /// Milliseconds after `origin`; `i64::MIN`: nothing may be touched, `i64::MAX`: no deadline.
    until_ms: std::sync::atomic::AtomicI64,
    /// Heartbeats accepted so far: a consumer that saw the store lose state waits for the next one.
    confirmations: std::sync::atomic::AtomicU64,
    /// The lowest fencing token (member epoch) ownership may still be trusted under: raised above every
    /// epoch of a session whose membership was lost ([`withdraw`](Self::withdraw)). Ownership granted
    /// before is over for good, even once the rejoin moves the deadline ahead again before the
    /// consumption layer has handled the [`ShardCommand::Fence`], or an `Assign` queued before it.
    epoch_floor: std::sync::atomic::AtomicI64,
}

impl OwnershipDeadline {
    /// A deadline that has already passed: nothing may be touched until the heartbeat loop moves it.
    pub fn new() -> Arc<Self> {
        Self::with_until(i64::MIN)
    }

    /// No deadline at all, for a consumer driven without a heartbeat loop (tests, embedding).
    pub fn unbounded() -> Arc<Self> {
        Self::with_until(i64::MAX)
    }

    fn with_until(until_ms: i64) -> Arc<Self> {
        Arc::new(Self {
            origin: std::time::Instant::now(),
            until_ms: std::sync::atomic::AtomicI64::new(until_ms),
            confirmations: std::sync::atomic::AtomicU64::new(0),
            epoch_floor: std::sync::atomic::AtomicI64::new(i64::MIN),
        })
    }

    /// The instant local times (as [`MemberSession`](crate::member::session::MemberSession) uses them)
    /// count from.
    pub fn origin(&self) -> std::time::Instant {
        self.origin
    }

    /// Local time now, on this deadline's monotonic clock.
    pub fn local_now(&self) -> LocalMillis {
        LocalMillis(self.origin.elapsed().as_millis() as i64)
    }

    /// Moves the deadline to local time `until` (the session's `valid_until`).
    pub fn set(&self, until: LocalMillis) {
        self.until_ms
            .store(until.0, std::sync::atomic::Ordering::Release);
    }

    /// The membership was lost: nothing may be touched now, and ownership granted at an epoch below
    /// `epoch_floor` (every epoch of the lost session) never again, whatever later moves the deadline.
    pub fn withdraw(&self, epoch_floor: i64) {
        // Raised before the deadline moves: whoever sees a later deadline sees this floor too.
        self.epoch_floor
            .fetch_max(epoch_floor, std::sync::atomic::Ordering::AcqRel);
        self.set(LocalMillis::MIN);
    }

    /// The lowest member epoch ownership may still be trusted under (see [`withdraw`](Self::withdraw)).
    pub fn epoch_floor(&self) -> i64 {
        self.epoch_floor.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The deadline ([`LocalMillis::MIN`]: none, [`LocalMillis::MAX`]: unbounded).
    pub(crate) fn until(&self) -> LocalMillis {
        LocalMillis(self.until_ms.load(std::sync::atomic::Ordering::Acquire))
    }

    /// Counts a heartbeat the coordinator accepted.
    pub fn confirm(&self) {
        self.confirmations
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// Heartbeats accepted so far.
    pub fn confirmations(&self) -> u64 {
        self.confirmations
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// How long ownership may still be trusted, read now; `None` once it may not.
    pub fn remaining(&self) -> Option<std::time::Duration> {
        let until = self.until_ms.load(std::sync::atomic::Ordering::Acquire);
        if until == i64::MAX {
            return Some(std::time::Duration::MAX);
        }
        let left = until.saturating_sub(self.local_now().0);
        (left > 0).then(|| std::time::Duration::from_millis(left as u64))
    }

    /// Whether ownership may be trusted at this moment.
    pub fn is_valid(&self) -> bool {
        self.remaining().is_some()
    }
}
