//! What a job (or the idle wait) reports when it ends, and the one rule that says what that end means for
//! the shard: [`end_of`].

use std::time::Duration;

use redis::RedisError;

use super::shard::ReadMode;
use super::Millis;
use crate::consumer::entry::Entry;

/// A shard whose consumer group was missing is looked at again this soon (once its lease is renewed).
pub(crate) const MISSING_GROUP_RETRY: Duration = Duration::from_millis(50);

/// The first and the longest backoff of a shard whose commands fail; each failure in a row doubles it.
pub(crate) const ERROR_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(50), Duration::from_secs(5));

/// What a shard's job found and did: facts, no decisions (the scheduler draws them with [`end_of`]).
#[derive(Debug, Default)]
pub(crate) struct JobReport {
    /// Where the shard's next read is, as the job left it; `None` if the job did not get to say
    /// (aborted or panicked).
    pub(crate) next_read_mode: Option<ReadMode>,
    /// Entries fetched (claimed, read or deferred ones handled again).
    pub(crate) fetched: usize,
    pub(crate) last_delivered: Option<String>,
    /// The newest entry this job's `XREADGROUP ... >` reads got (where the idle wait watches from next).
    pub(crate) read_up_to: Option<String>,
    /// Its last `>` read came back short of a batch: the shard had nothing more then, so it need not be
    /// polled again (the idle wait watches from `read_up_to`).
    pub(crate) drained: bool,
    pub(crate) last_acked: Option<String>,
    /// Entries left pending on purpose (failure policy, or stopped part-way).
    pub(crate) left_pending: usize,
    /// The command that failed, if one did.
    pub(crate) error: Option<RedisError>,
    /// Entries deferred, in order, from the first one that must wait (its backoff, or its moved key's old
    /// shard).
    pub(crate) deferred: Vec<Entry>,
    /// Set with `deferred`: when to try the shard again.
    pub(crate) defer_for: Option<Duration>,
    /// The job stopped because the member's self-fencing deadline had passed.
    pub(crate) expired: bool,
    /// The shard's consumer group (or the stream) is missing: the store lost it.
    pub(crate) missing_group: bool,
    /// The job installed the ownership's fence.
    pub(crate) fence_installed: bool,
    /// Redis refused a command because the fence is gone (a newer owner, or a loss), or a newer owner's
    /// fence is in place: the next job installs it again, which tells the two apart.
    pub(crate) fence_lost: bool,
}

/// What the idle wait saw.
#[derive(Debug, Default)]
pub(crate) struct WaitReport {
    /// Shards it saw new entries on (their next job reads them).
    pub(crate) new_entries: Vec<u32>,
    /// Where it found it must watch shards from (the group's last-delivered id), by shard.
    pub(crate) watch_from: Vec<(u32, String)>,
    pub(crate) error: Option<RedisError>,
    /// It did not wait: the self-fencing deadline had passed.
    pub(crate) expired: bool,
    /// A waited shard's consumer group (or stream) is missing.
    pub(crate) missing_group: bool,
    /// What a group wait delivered, by shard (pending for this member now: the shards' next jobs handle
    /// these first).
    pub(crate) delivered: Vec<(u32, Vec<Entry>)>,
    /// Entries a group wait read from each shard at most: a delivery short of it left nothing behind, so
    /// the shard's job handles it and reads no more (and the shard rides the next wait meanwhile); `0`
    /// says nothing, and every delivery counts as full.
    pub(crate) count: usize,
    /// A group wait's reply was lost (a reset, a timeout, a master switch): it may have delivered entries
    /// this member never saw, so every waited shard claims its own pending entries first.
    pub(crate) in_doubt: bool,
}

impl WaitReport {
    /// The wait's read failed with `error`: a group read's entries are in doubt unless Redis itself
    /// answered (an error reply delivers nothing; see [`ReadMode::after_failure`]).
    pub(crate) fn fail(&mut self, error: RedisError, group_wait: bool) {
        if group_wait && !super::shard::is_error_reply(&error) {
            self.in_doubt = true;
        }
        if crate::consumer::fence::is_missing_group(&error) {
            self.missing_group = true;
        } else {
            self.error = Some(error);
        }
    }

    /// Which shard is at fault is found by the shards' own reads: after a failed wait they poll one by one.
    pub(crate) fn failed(&self) -> bool {
        self.error.is_some() || self.expired || self.missing_group
    }
}

/// How a job ended, for the shard's next turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobEnd {
    /// Entries were read and handled.
    Data,
    /// A claim page was done and more may be pending: claim on next turn.
    Claiming,
    /// Nothing (more) to read: the read came back empty, or short of a batch.
    Empty,
    /// Entries deferred until `retry_at` (a failed attempt's backoff, a moved key): per-key order.
    Deferred { retry_at: Millis },
    /// A Redis error: back off until `retry_at`, then claim our own pending entries (acks may be lost).
    Failed { retry_at: Millis },
    /// A read failed before it delivered anything (no ack is in doubt): back off until `retry_at`, then
    /// read on.
    ReadFailed { retry_at: Millis },
    /// The shard's consumer group (or stream) is missing: back off until `retry_at` and wait for a renewed
    /// lease, then create it again and claim our own pending entries.
    MissingGroup { retry_at: Millis },
    /// The job found the ownership deadline passed.
    Expired,
    /// Aborted or panicked.
    Aborted,
}

/// What `report` means for the shard, whose reads are now at `read_mode` (the report's, or a claim of our
/// own entries when it had none), and its error backoff after it (`backoff` before).
///
/// Precedence: an error first (whatever else happened, the shard backs off, doubling from 50 ms to 5 s,
/// and a failed claim claims again while a failed read reads on), then an expired deadline, a missing
/// group, deferred entries, an abort, and last what the read found.
pub(crate) fn end_of(
    now: Millis,
    report: &JobReport,
    read_mode: &ReadMode,
    backoff: Duration,
) -> (JobEnd, Duration) {
    let later = |delay: Duration| now.plus_duration(delay);
    if report.error.is_some() {
        let backoff = (backoff * 2).clamp(ERROR_BACKOFF.0, ERROR_BACKOFF.1);
        let retry_at = later(backoff);
        let end = match read_mode {
            ReadMode::Claim { .. } => JobEnd::Failed { retry_at },
            ReadMode::Live => JobEnd::ReadFailed { retry_at },
        };
        return (end, backoff);
    }
    let end = if report.expired {
        // Past the self-fencing deadline: a fence is on its way, or the lease comes back.
        JobEnd::Expired
    } else if report.missing_group {
        // Not before a heartbeat sent after the loss confirmed that the shard is still ours.
        JobEnd::MissingGroup {
            retry_at: later(MISSING_GROUP_RETRY),
        }
    } else if let Some(delay) = report.defer_for {
        // A moved key waits for its old shard (or a failed entry for its backoff).
        JobEnd::Deferred {
            retry_at: later(delay),
        }
    } else if report.next_read_mode.is_none() {
        JobEnd::Aborted
    } else {
        match (read_mode, report.fetched) {
            (ReadMode::Claim { .. }, _) => JobEnd::Claiming,
            (ReadMode::Live, 0) => JobEnd::Empty,
            (ReadMode::Live, _) if report.drained => JobEnd::Empty,
            (ReadMode::Live, _) => JobEnd::Data,
        }
    };
    (end, Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Millis = Millis(1_000);

    fn claim() -> ReadMode {
        ReadMode::Claim {
            cursor: "7-0".into(),
        }
    }

    fn ended(report: JobReport) -> JobReport {
        JobReport {
            next_read_mode: Some(ReadMode::Live),
            ..report
        }
    }

    fn failed() -> JobReport {
        ended(JobReport {
            error: Some(RedisError::from((redis::ErrorKind::Io, "reset"))),
            ..JobReport::default()
        })
    }

    #[test]
    fn rule_an_error_backs_off_doubling_from_50_ms_to_5_s() {
        let mut backoff = Duration::ZERO;
        let mut seen = Vec::new();
        for _ in 0..10 {
            let (end, next) = end_of(NOW, &failed(), &ReadMode::Live, backoff);
            assert_eq!(
                end,
                JobEnd::ReadFailed {
                    retry_at: NOW.plus_duration(next)
                }
            );
            seen.push(next.as_millis());
            backoff = next;
        }
        assert_eq!(seen, [50, 100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
    }

    #[test]
    fn rule_success_resets_the_backoff() {
        let (end, backoff) = end_of(
            NOW,
            &ended(JobReport {
                fetched: 3,
                ..JobReport::default()
            }),
            &ReadMode::Live,
            Duration::from_secs(5),
        );
        assert_eq!((end, backoff), (JobEnd::Data, Duration::ZERO));
    }

    #[test]
    fn rule_a_failed_claim_claims_again_and_a_failed_read_reads_on() {
        let (end, _) = end_of(NOW, &failed(), &claim(), Duration::ZERO);
        assert!(matches!(end, JobEnd::Failed { .. }), "{end:?}");
        let (end, _) = end_of(NOW, &failed(), &ReadMode::Live, Duration::ZERO);
        assert!(matches!(end, JobEnd::ReadFailed { .. }), "{end:?}");
    }

    #[test]
    fn rule_an_error_outranks_every_other_fact() {
        let report = JobReport {
            expired: true,
            missing_group: true,
            defer_for: Some(Duration::from_millis(10)),
            next_read_mode: None,
            ..failed()
        };
        let (end, _) = end_of(NOW, &report, &ReadMode::Live, Duration::ZERO);
        assert!(matches!(end, JobEnd::ReadFailed { .. }), "{end:?}");
    }

    #[test]
    fn rule_then_expired_then_missing_group_then_deferred_then_aborted() {
        let all = JobReport {
            expired: true,
            missing_group: true,
            defer_for: Some(Duration::from_millis(10)),
            next_read_mode: None,
            fetched: 4,
            ..JobReport::default()
        };
        let (end, _) = end_of(NOW, &all, &ReadMode::Live, Duration::ZERO);
        assert_eq!(end, JobEnd::Expired);
        let report = JobReport {
            expired: false,
            ..all
        };
        let (end, _) = end_of(NOW, &report, &ReadMode::Live, Duration::ZERO);
        assert_eq!(
            end,
            JobEnd::MissingGroup {
                retry_at: NOW.plus_duration(MISSING_GROUP_RETRY)
            }
        );
        let report = JobReport {
            missing_group: false,
            ..report
        };
        let (end, _) = end_of(NOW, &report, &ReadMode::Live, Duration::ZERO);
        assert_eq!(
            end,
            JobEnd::Deferred {
                retry_at: Millis(1_010)
            }
        );
        let report = JobReport {
            defer_for: None,
            ..report
        };
        let (end, _) = end_of(NOW, &report, &ReadMode::Live, Duration::ZERO);
        assert_eq!(end, JobEnd::Aborted);
    }

    #[test]
    fn rule_last_what_the_read_found() {
        let report = |fetched| {
            ended(JobReport {
                fetched,
                ..JobReport::default()
            })
        };
        let end = |fetched, mode: &ReadMode| end_of(NOW, &report(fetched), mode, Duration::ZERO).0;
        assert_eq!(end(0, &claim()), JobEnd::Claiming);
        assert_eq!(end(5, &claim()), JobEnd::Claiming);
        assert_eq!(end(0, &ReadMode::Live), JobEnd::Empty);
        assert_eq!(end(5, &ReadMode::Live), JobEnd::Data);
        // A read short of a batch left nothing behind it: nothing more to read.
        let short = ended(JobReport {
            fetched: 5,
            drained: true,
            ..JobReport::default()
        });
        let end = |mode: &ReadMode| end_of(NOW, &short, mode, Duration::ZERO).0;
        assert_eq!(end(&ReadMode::Live), JobEnd::Empty);
        assert_eq!(end(&claim()), JobEnd::Claiming);
    }

    #[test]
    fn a_wait_failed_when_it_erred_expired_or_missed_a_group() {
        assert!(!WaitReport::default().failed());
        for report in [
            WaitReport {
                expired: true,
                ..WaitReport::default()
            },
            WaitReport {
                missing_group: true,
                ..WaitReport::default()
            },
            WaitReport {
                error: Some(RedisError::from((redis::ErrorKind::Io, "reset"))),
                ..WaitReport::default()
            },
        ] {
            assert!(report.failed(), "{report:?}");
        }
    }
}
