//! The contract between a member's heartbeat loop and the consumption layer (polling adapter and workers).
//!
//! The heartbeat loop decides, from coordinator responses and its own lease clock, which shards the member
//! may read; the consumption layer does the reading. They talk over two channels: [`ShardCommand`]s go down,
//! [`ShardReport`]s come back up, and the heartbeat loop forwards the reports to the coordinator.

use std::sync::Arc;

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
