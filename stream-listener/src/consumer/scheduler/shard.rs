//! One owned shard as the scheduler sees it: where its turn is ([`Phase`]), where its reads are
//! ([`ReadMode`]), and the facts its jobs carry from one to the next.

use std::sync::Arc;
use std::time::Duration;

use redis::RedisError;

use super::{JobId, Millis};
use crate::consumer::entry::Entry;
use crate::member::lifecycle::FencingToken;

/// Where a shard's reads are: claiming what was left pending, or reading new entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReadMode {
    /// Claiming entries earlier owners (or an earlier life of this member) left pending, from `cursor`.
    Claim { cursor: String },
    /// Reading new entries (`>`).
    Live,
}

impl ReadMode {
    /// Claiming from the start of the pending list: our own entries first, whatever a read or an ack left
    /// in doubt.
    pub(crate) fn claim_own() -> Self {
        Self::Claim {
            cursor: crate::names::START_ID.to_owned(),
        }
    }

    /// Where the shard's next job reads after a command of this one failed with `error`, `acks_in_doubt`
    /// if acks went out with it.
    ///
    /// Only an error reply from Redis proves that a command changed nothing. A reset, an EOF, a response
    /// timeout or a reply that did not parse may come after Redis ran it: a `>` read (or a claim) has then
    /// moved entries into this member's own pending list that the member never saw, and the periodic
    /// reclaim skips our own entries. Reading `>` on would strand them until the shard changes owner and
    /// let later entries of their keys be handled first; so the next job claims our own pending entries
    /// from the start, in id order, before it reads new ones.
    pub(crate) fn after_failure(&self, acks_in_doubt: bool, error: &RedisError) -> Self {
        if !acks_in_doubt && is_error_reply(error) {
            self.clone()
        } else {
            Self::claim_own()
        }
    }
}

/// Whether Redis itself answered with an error (so the command did nothing), rather than the answer being
/// lost or garbled on the way (see [`ReadMode::after_failure`]).
pub(crate) fn is_error_reply(error: &RedisError) -> bool {
    matches!(
        error.kind(),
        redis::ErrorKind::Server(_) | redis::ErrorKind::Extension
    )
}

/// Where a shard is in its turn. A shard is in exactly one phase; the ready queue holds the `Queued` ones.
///
/// ```text
///            assign                    dispatch              job ended
///   (new) ---------> Queued ------------------------> Running ---------> Queued | Backoff | Unconfirmed
///              |        ^   old job of the index runs                     (and Parked while the idle
///              |        +------------ WaitingForOld <--+                   wait runs and reads are empty)
///              +--> WaitingForOld (a fenced ownership's job still runs)
///   Backoff --tick--> Queued;  Unconfirmed --renewed lease (+ backoff over)--> Queued;  Parked --wait ends--> Queued
/// ```
/// A shard whose job handles one short delivery and reads nothing rides the idle wait meanwhile: it stays
/// `Running` its job and is one of the wait's shards too; its job's end leaves it `Running` the wait (idle)
/// or `Parked` (it needs a job), and what the wait delivers to it before that is `queued` for after the
/// job.
/// A revocation is not a phase but a mark ([`Shard::revoking`]): a revoked shard drains its running job (or
/// waits for the old one), then leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// In the ready queue, waiting for a worker.
    Queued,
    /// Its job, or the idle wait covering it, runs (a riding shard: its job, and the wait covers it too).
    Running(JobId),
    /// Off the queue, holding no worker, until the backoff ends (a failed attempt, a moved key).
    Backoff(Millis),
    /// Its consumer group was missing: waits for a renewed lease, and for its backoff if one is set.
    Unconfirmed(Option<Millis>),
    /// Its read came back empty while the idle wait ran, or it needs a job while the wait it rode still
    /// runs: waits for that wait to end (the next covers it, or it starts then).
    Parked,
    /// A job of an earlier (fenced) ownership of the same index still runs.
    WaitingForOld,
}

/// What the next job does once the shard's own pending entries are claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Next {
    Read,
    /// Handle deferred entries, or read what the idle wait saw: no zombie reclaim first.
    Retry,
    /// Handle what the idle wait's group read delivered (kept as deferred entries): no reclaim first.
    Delivered,
}

/// The shard's progress, for the heartbeat's reports.
#[derive(Debug, Clone, Default)]
pub(super) struct Progress {
    pub(super) last_delivered: Option<String>,
    pub(super) last_acked: Option<String>,
    pub(super) pending: u64,
    /// Changed since the last report.
    pub(super) dirty: bool,
}

/// One ownership of a shard index.
#[derive(Debug, Clone)]
pub(super) struct Shard {
    /// The grant; `None` for a placeholder that only waits for a fenced ownership's job to end before the
    /// revocation of a shard we no longer own is reported.
    pub(super) token: Option<FencingToken>,
    /// Tells this ownership from an earlier one of the same index.
    pub(super) generation: u64,
    pub(super) phase: Phase,
    pub(super) revoking: bool,
    /// An assignment that came while revoking: served once the revocation is through.
    pub(super) reassign: Option<FencingToken>,
    pub(super) next: Next,
    /// The next job claims the shard's own pending entries first (set by an assignment, a lapse, a failed
    /// or aborted job; not forgotten by a read that ends well after a lapse).
    pub(super) claim_owed: bool,
    pub(super) reclaimed_at: Millis,
    /// Where its reads are (a claim's cursor is carried from job to job).
    pub(super) read_mode: ReadMode,
    /// Entries a job deferred, for the next job (kept in memory: re-claiming would count a delivery).
    pub(super) deferred: Vec<Entry>,
    /// The wait's delivery among `deferred` was a full batch: more may be there, so the job reads on. A
    /// short one left nothing behind: the job handles it and no more, and the shard rides the waits while
    /// it runs.
    pub(super) more: bool,
    /// What a wait the shard rode delivered while its job ran: handled after that job, in order (unless the
    /// job ends needing a claim of our own pending entries, which then gets them in id order).
    pub(super) queued: Vec<Entry>,
    /// `queued` holds a wait's batch or more: the shard rides no further wait (memory stays bounded).
    pub(super) queued_more: bool,
    pub(super) error_backoff: Duration,
    /// This ownership's fence is known to be in place in Redis (see the `fence` module).
    pub(super) fence_installed: bool,
    /// The consumer group was found missing: the next job creates it again.
    pub(super) recreate_group: bool,
    /// Where the idle wait watches the stream from: the newest entry our `>` reads got; `None` until known,
    /// and after a wake-up (then the group's last-delivered id, see the `wait` module).
    pub(super) watch_from: Option<Arc<str>>,
    /// Its last read found nothing new (or came back short), and no wait saw anything since: it is not
    /// polled, the idle wait watches it.
    pub(super) idle: bool,
    pub(super) progress: Progress,
}

impl Shard {
    pub(super) fn new(now: Millis, token: Option<FencingToken>, generation: u64) -> Self {
        Self {
            token,
            generation,
            phase: Phase::Queued,
            revoking: false,
            reassign: None,
            next: Next::Read,
            claim_owed: true,
            reclaimed_at: now,
            read_mode: ReadMode::claim_own(),
            deferred: Vec::new(),
            more: false,
            queued: Vec::new(),
            queued_more: false,
            error_backoff: Duration::ZERO,
            fence_installed: false,
            recreate_group: false,
            watch_from: None,
            idle: false,
            progress: Progress {
                dirty: true,
                ..Progress::default()
            },
        }
    }

    /// Its next job handles one short delivery and reads nothing (see `ShardScheduler::rides`).
    pub(super) fn one_batch_next(&self) -> bool {
        self.next == Next::Delivered && !self.more && !self.claim_owed
    }

    pub(super) fn running(&self) -> Option<JobId> {
        match self.phase {
            Phase::Running(job) => Some(job),
            _ => None,
        }
    }

    /// Its backoff's end, if it waits for one.
    pub(super) fn retry_at(&self) -> Option<Millis> {
        match self.phase {
            Phase::Backoff(at) | Phase::Unconfirmed(Some(at)) => Some(at),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io_error(kind: std::io::ErrorKind) -> RedisError {
        RedisError::from(std::io::Error::new(kind, "injected"))
    }

    fn error_replies() -> Vec<RedisError> {
        vec![
            redis::make_extension_error("NOGROUP".into(), Some("No such key".into())),
            redis::make_extension_error("FENCED".into(), Some("the fence is gone".into())),
            RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
                "ERR",
            )),
        ]
    }

    fn lost_replies() -> Vec<RedisError> {
        vec![
            io_error(std::io::ErrorKind::ConnectionReset),
            io_error(std::io::ErrorKind::UnexpectedEof),
            io_error(std::io::ErrorKind::TimedOut),
            io_error(std::io::ErrorKind::BrokenPipe),
            RedisError::from((redis::ErrorKind::Parse, "garbled reply")),
            RedisError::from((redis::ErrorKind::Client, "dropped before the answer")),
        ]
    }

    #[test]
    fn a_read_refused_by_redis_reads_on_where_it_was() {
        for error in error_replies() {
            assert!(is_error_reply(&error), "{error}");
            assert_eq!(ReadMode::Live.after_failure(false, &error), ReadMode::Live);
            let claim = ReadMode::Claim {
                cursor: "5-0".into(),
            };
            assert_eq!(claim.after_failure(false, &error), claim);
        }
    }

    #[test]
    fn a_read_whose_reply_was_lost_claims_our_own_pending_entries_first() {
        for error in lost_replies() {
            assert!(!is_error_reply(&error), "{error}");
            assert_eq!(
                ReadMode::Live.after_failure(false, &error),
                ReadMode::claim_own(),
                "{error}"
            );
            let claim = ReadMode::Claim {
                cursor: "5-0".into(),
            };
            assert_eq!(claim.after_failure(false, &error), ReadMode::claim_own());
        }
    }

    #[test]
    fn acks_in_doubt_claim_our_own_pending_entries_even_after_an_error_reply() {
        for error in error_replies().into_iter().chain(lost_replies()) {
            assert_eq!(
                ReadMode::Live.after_failure(true, &error),
                ReadMode::claim_own()
            );
        }
    }
}
