//! What one job of a shard is given: the scheduler's plan with the ownership's handles, the handler, and
//! the signals the driver uses to ask for the shard back.

use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::Arc;

use crate::member::lifecycle::FencingToken;

use super::entry::Entry;
use super::fence::Fence;
use super::message::{BoxedHandler, ShardOwnership};
use super::order::OrderGate;
use super::retention::RetentionJob;
use super::scheduler::ReadMode;

/// How a running job is told to hand its shard back early, and what it has in flight.
#[derive(Debug, Default)]
pub(crate) struct JobSignals {
    /// Revoked or shutting down: finish the running handler, ack, leave the rest pending.
    pub(crate) stop: AtomicBool,
    /// Notified with `stop`: a job waiting for a handler's permit stops waiting.
    pub(crate) stopped: tokio::sync::Notify,
    /// Hand the shard back after this batch (another shard waits for a worker, or paused).
    pub(crate) yield_now: AtomicBool,
    /// Entries of the batch not finished yet, for `Draining` and progress reports.
    pub(crate) in_flight: AtomicU32,
}

/// What a job needs to know about its shard: the scheduler's plan, with the ownership's handles.
pub(crate) struct JobSpec {
    pub(crate) shard: u32,
    pub(crate) key: Arc<str>,
    pub(crate) token: FencingToken,
    /// This ownership's fence in Redis (see the `fence` module).
    pub(crate) fence: Arc<Fence>,
    /// Install the fence before anything else (the ownership's first job, or its fence was found gone).
    pub(crate) install_fence: bool,
    pub(crate) ownership: Arc<ShardOwnership>,
    pub(crate) read_mode: ReadMode,
    /// Stop, yield, and the entries in flight (see [`JobSignals`]).
    pub(crate) signals: Arc<JobSignals>,
    /// Entries an earlier job deferred (a failed attempt's backoff, or a moved key waiting for its old
    /// shard), or that the idle wait's group read delivered: handled first.
    pub(crate) deferred: Vec<Entry>,
    /// `deferred` is what the idle wait's group read delivered, reading at most this many from the shard
    /// (see [`ShardIo::wait_count`](super::shard_io::ShardIo::wait_count)): new to the group, and when
    /// fewer, nothing was left behind them (the shard is drained once they are handled).
    pub(crate) delivered: Option<usize>,
    /// Look for entries other consumers of the group have left pending too long, and claim them first.
    pub(crate) reclaim: bool,
    /// The shard's consumer group was found missing and the member's ownership was confirmed since:
    /// create it again before reading.
    pub(crate) recreate_group: bool,
    /// At most this many batches before handing the shard back.
    pub(crate) max_turns: u32,
    /// Whether the listener is paused: a job told to yield then hands its shard back after this batch,
    /// without its [`YIELD_AFTER`](super::scheduler::YIELD_AFTER).
    pub(crate) paused: tokio::sync::watch::Receiver<bool>,
    /// The user's handler.
    pub(crate) handler: BoxedHandler,
    /// Each shard's retention runs (see the `retention` module).
    pub(crate) retention: Arc<RetentionJob>,
    /// The resize's order gate, shared by the consumer's jobs (see the `order` module).
    pub(crate) order: Arc<OrderGate>,
}
