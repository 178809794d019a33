//! The idle wait going on as a shard's job: when its group read delivers, the task that got the reply
//! handles the first delivered shard's entries itself, on the wait's worker, instead of ending and having
//! the driver start a job for them on another task. An idle pickup then costs no hand-off between tasks
//! (on a busy machine, a thread wake-up each) between the reply and the handler.
//!
//! The driver hears of it at once ([`HandedOn`]), before the handler's end, and the scheduler turns the
//! wait into that job ([`ShardScheduler::wait_handed_on`](super::scheduler::ShardScheduler::wait_handed_on)):
//! the rest of the wait's report (the other shards' deliveries among it) is handled as any wait's end.
//! The wait does not go on when it was interrupted (the scheduler asked for it back: an assignment, a
//! revocation, a pause or shutdown), nor when its read failed, expired or its reply is in doubt.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::member::lifecycle::FencingToken;

use super::fence::Fence;
use super::job_spec::{JobSignals, JobSpec};
use super::message::{BoxedHandler, ShardOwnership};
use super::order::OrderGate;
use super::retention::RetentionJob;
use super::scheduler::{JobId, ReadMode, MAX_TURNS};
use super::unblock::Interrupt;
use super::wait::WaitEnd;

/// What the driver hears when its wait went on as the job of `shard`.
pub(crate) struct HandedOn {
    pub(crate) wait: JobId,
    pub(crate) shard: u32,
    /// The wait's end, without `shard`'s delivery (the job's).
    pub(crate) end: WaitEnd,
    pub(crate) signals: Arc<JobSignals>,
}

/// One shard's ownership, as its jobs get it (the driver keeps one per owned shard).
#[derive(Clone)]
pub(crate) struct Ownership {
    pub(crate) key: Arc<str>,
    pub(crate) token: FencingToken,
    pub(crate) fence: Arc<Fence>,
    pub(crate) ownership: Arc<ShardOwnership>,
}

/// What a wait needs to go on as the job of any shard it watches.
pub(crate) struct HandOn {
    pub(crate) wait: JobId,
    pub(crate) shards: HashMap<u32, Ownership>,
    /// How many entries the wait read from a shard at most.
    pub(crate) count: usize,
    pub(crate) interrupt: Arc<Interrupt>,
    pub(crate) handler: BoxedHandler,
    pub(crate) retention: Arc<RetentionJob>,
    pub(crate) order: Arc<OrderGate>,
    pub(crate) tell: mpsc::UnboundedSender<HandedOn>,
}

impl HandOn {
    /// The job the wait goes on as, if it may (see the module docs): takes the first delivered shard's
    /// entries out of `end`, tells the driver, and returns the job to run.
    pub(crate) fn take(mut self, end: &mut WaitEnd) -> Option<JobSpec> {
        let report = &mut end.report;
        if self.interrupt.is_set() || !report.may_go_on() {
            return None;
        }
        let at = report
            .delivered
            .iter()
            .position(|(shard, entries)| !entries.is_empty() && self.shards.contains_key(shard))?;
        let (shard, entries) = report.delivered.remove(at);
        let owned = self.shards.remove(&shard).expect("found above");
        let signals = Arc::new(JobSignals::default());
        let end = std::mem::replace(
            end,
            WaitEnd {
                report: Default::default(),
                conn: None,
                retention_due: Vec::new(),
            },
        );
        let told = self.tell.send(HandedOn {
            wait: self.wait,
            shard,
            end,
            signals: signals.clone(),
        });
        if told.is_err() {
            // The driver is gone (the consumer stopped): nothing may run.
            return None;
        }
        Some(JobSpec {
            shard,
            key: owned.key,
            token: owned.token,
            fence: owned.fence,
            // It read behind the fence just now.
            install_fence: false,
            ownership: owned.ownership,
            read_mode: ReadMode::Live,
            signals,
            deferred: entries,
            delivered: Some(self.count),
            reclaim: false,
            recreate_group: false,
            max_turns: MAX_TURNS,
            handler: self.handler,
            retention: self.retention,
            order: self.order,
        })
    }
}
