//! What the scheduler asks of its driver: one [`Command`] enum, executed in order.

use std::sync::Arc;

use super::shard::ReadMode;
use super::{JobId, JobKind};
use crate::consumer::entry::Entry;
use crate::consumer::hooks::HookCall;
use crate::member::lifecycle::FencingToken;

/// One thing for the driver to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Command {
    /// An ownership of `shard` begins, at fencing token `epoch`: make its handle (which the handler's
    /// manual acks and every job of the ownership check before each command).
    Own { shard: u32, epoch: i64 },
    /// The ownership of `shard` is over (drained, or fenced): its handle refuses everything from now on.
    Disown { shard: u32 },
    /// Start a shard's job.
    StartJob(JobPlan),
    /// Start the idle wait: one blocking read over `shards`, each watched from its id when known.
    StartWait {
        job: JobId,
        shards: Vec<(u32, Option<Arc<str>>)>,
        /// A second, non-blocking read pipelined right behind the blocking one: Redis serves a blocked
        /// read as soon as the first entry is written, so entries written to other shards in the same
        /// burst (a producer's pipelined batch) come with the second read's reply instead of waiting for
        /// the next wait. Set after a wait delivered to two shards or more; at low rates it would be an
        /// empty read per pickup.
        follow_up: bool,
    },
    /// End the idle wait early (`CLIENT UNBLOCK`); it ends through [`super::ShardScheduler::wait_ended`].
    InterruptWait { job: JobId },
    /// The job's shard is revoked or the member shuts down: finish the running handler, acknowledge, and
    /// leave the rest of the batch pending.
    Stop { job: JobId },
    /// Another shard waits for a worker, or the listener paused: hand the shard back after this batch.
    Yield { job: JobId },
    /// Fenced: abort every running job now (they still end through `job_ended` / `wait_ended`).
    AbortAll,
    /// Tell the heartbeat.
    Report(Report),
    /// Call the user's lifecycle hooks.
    CallHook(HookCall),
    /// Tell the health probe.
    Probe(ProbeEvent),
    /// Shutting down, no job runs and no revoked hook is unanswered: the driver may return.
    Stopped,
}

/// A job to start, with everything the shard's earlier jobs left for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JobPlan {
    pub(crate) job: JobId,
    pub(crate) shard: u32,
    pub(crate) token: FencingToken,
    pub(crate) kind: JobKind,
    /// Install the ownership's fence before anything else (its first job, or the fence was found gone).
    pub(crate) install_fence: bool,
    pub(crate) read_mode: ReadMode,
    /// Entries an earlier job deferred: handled first, whatever the job's kind.
    pub(crate) deferred: Vec<Entry>,
    /// Look for entries other consumers of the group left pending too long, and claim them first.
    pub(crate) reclaim: bool,
    /// The consumer group was missing and the ownership was confirmed since: create it again first.
    pub(crate) recreate_group: bool,
    /// At most this many batches in one job, even when no other shard waits (so that progress and
    /// commands are looked at).
    pub(crate) max_turns: u32,
}

/// A report for the heartbeat loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Report {
    /// `shard` is being revoked; `job` is its running job, whose entries in flight the driver counts.
    Draining { shard: u32, job: Option<JobId> },
    /// `shard` is drained (and its revoked hook returned): the coordinator may hand it on.
    Revoked { shard: u32 },
    /// Where `shard`'s reads and acks are; the driver adds the running `job`'s entries in flight to
    /// `pending`.
    Progress {
        shard: u32,
        last_delivered: Option<String>,
        last_acked: Option<String>,
        pending: u64,
        job: Option<JobId>,
    },
}

/// What the health probe hears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProbeEvent {
    /// A shard's job ended, its read failed or not.
    ReadResult { shard: u32, failed: bool },
    /// The member no longer owns `shard`.
    Forget { shard: u32 },
    /// Fenced: every handler is being aborted.
    Aborting,
}
