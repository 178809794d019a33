//! One turn of one shard on a worker: fetch a batch (claim or read), run the handler on each entry in
//! order, then acknowledge / dead-letter the batch.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use redis::RedisError;

use super::attempt::{self, Fate};
use super::entry::Entry;
use super::fence::{self, is_missing_group};
use super::job_spec::{JobSignals, JobSpec};
use super::order::GateMemo;
use super::scheduler::{hands_back, JobReport, ReadMode};
use super::shard_io::{CarriedAcks, Letter, ShardIo};

pub(crate) async fn run(io: Arc<ShardIo>, spec: JobSpec) -> JobReport {
    let (shard, key, ownership) = (spec.shard, spec.key.clone(), spec.ownership.clone());
    let retention = spec.retention.clone();
    let outcome = turns(&io, spec).await;
    // Trim what every group acknowledged, now and then (see the `retention` module).
    if outcome.error.is_none() && ownership.is_active() {
        let acked = outcome.last_acked.is_some();
        retention.step(&io, shard, &key, acked).await;
    }
    outcome
}

async fn turns(io: &Arc<ShardIo>, mut spec: JobSpec) -> JobReport {
    let io = io.clone();
    let mut outcome = JobReport::default();
    // Acks of the previous batch, to go out in one pipeline with the next read.
    let mut carried: Option<CarriedAcks> = None;
    let mut turns = 0;
    let started = tokio::time::Instant::now();
    let mut memo = GateMemo::default();
    if spec.recreate_group {
        match io
            .recreate_group(&spec.key, spec.shard, &spec.ownership)
            .await
        {
            Ok(()) => {}
            Err(error) => {
                outcome.next_read_mode = Some(spec.read_mode.after_failure(false, &error));
                outcome.error = Some(error);
                outcome.deferred = std::mem::take(&mut spec.deferred);
                return outcome;
            }
        }
    }
    if spec.install_fence {
        if !spec.ownership.is_active() {
            outcome.expired = true;
            outcome.next_read_mode = Some(spec.read_mode.clone());
            outcome.deferred = std::mem::take(&mut spec.deferred);
            return outcome;
        }
        match io.install_fence(&spec.fence).await {
            Ok(()) => {
                outcome.fence_installed = true;
                // Before the ownership's first read: entries removed while the group was not reading
                // are still visible (see the `retention` module).
                spec.retention.ownership_started(&spec.key);
                if spec.ownership.is_active() {
                    spec.retention.step(&io, spec.shard, &spec.key, false).await;
                }
            }
            Err(error) => {
                // `FENCED`: a newer owner's fence is in place; the next job tries again until the
                // revoke or fence arrives.
                outcome.fence_lost = fence::is_fence_error(&error, &spec.fence);
                outcome.next_read_mode = Some(spec.read_mode.after_failure(false, &error));
                outcome.error = Some(error);
                // Not handled: the shard's next job handles them first (reading `>` on past them would
                // strand them, pending for us, behind later entries of their keys).
                outcome.deferred = std::mem::take(&mut spec.deferred);
                return outcome;
            }
        }
    }
    loop {
        turns += 1;
        // The deadline is read right before every command this job sends: a process frozen past its
        // lease sends nothing when it resumes.
        if !spec.ownership.is_active() {
            outcome.expired = true;
            // If the lease comes back (the heartbeat got through late), start over from our own pending
            // entries: some may have been read and then stopped at the deadline.
            outcome.next_read_mode = Some(ReadMode::claim_own());
            // Acks carried over are not sent: the next owner re-handles those entries (at least once).
            return outcome;
        }
        // Whether these entries come from a `>` read (new to the group), rather than deferred or claimed,
        // and how many that read took at most: fewer left nothing behind.
        let delivered = spec.delivered.take();
        let full = delivered.unwrap_or(io.config.batch_size);
        let read_new = delivered.is_some()
            || spec.deferred.is_empty()
                && (carried.is_some() || matches!(spec.read_mode, ReadMode::Live));
        let fetched = if !spec.deferred.is_empty() {
            Ok((std::mem::take(&mut spec.deferred), spec.read_mode.clone()))
        } else if let Some(acks) = &mut carried {
            io.ack_and_read_new(&spec.key, &spec.fence, acks)
                .await
                .map(|entries| (entries, ReadMode::Live))
        } else {
            fetch(&io, &mut spec).await
        };
        let (mut entries, next_read_mode) = match fetched {
            Ok(fetched) => fetched,
            Err(error)
                if is_missing_group(&error) && !fence::is_fence_error(&error, &spec.fence) =>
            {
                io.warn_missing_group(&spec.key);
                outcome.missing_group = true;
                outcome.next_read_mode = Some(ReadMode::claim_own());
                return outcome;
            }
            Err(error) => {
                // Refused by the fence: nothing was read, and the next job installs it again.
                outcome.fence_lost = fence::is_fence_error(&error, &spec.fence);
                outcome.next_read_mode =
                    Some(spec.read_mode.after_failure(carried.is_some(), &error));
                outcome.error = Some(error);
                return outcome;
            }
        };
        if let Some(acks) = carried.take() {
            outcome.last_acked = Some(acks.last);
        }
        outcome.fetched += entries.len();
        if let Some(last) = entries.last() {
            outcome.last_delivered = Some(last.id.clone());
            if read_new {
                outcome.read_up_to = Some(last.id.clone());
            }
        }
        spec.signals
            .in_flight
            .store(entries.len() as u32, Ordering::Release);
        memo.next_batch();
        // The batch is read; its handler waits for a worker (stopped, it handles nothing: see below).
        let permit = if entries.is_empty() {
            None
        } else {
            handler_permit(&io, &spec.signals).await
        };

        let mut acks: Vec<&str> = Vec::with_capacity(entries.len());
        let mut letters: Vec<(&Entry, Letter)> = Vec::new();
        let mut last_done: Option<&str> = None;
        let mut stopped = false;
        let mut defer: Option<(usize, Duration)> = None;
        let mut retry_at: Option<usize> = None;
        // A batch handler's entries are gated and handled together first (`handle_batch`).
        let mut batch_fates = if spec.handler.is_batch() {
            attempt::batch(&io, &spec, &entries, &mut memo).await
        } else {
            Vec::new()
        }
        .into_iter();
        for (index, entry) in entries.iter().enumerate() {
            let fate = if let Some(fate) = batch_fates.next() {
                fate
            } else {
                if spec.signals.stop.load(Ordering::Acquire) || !spec.ownership.is_active() {
                    stopped = true;
                    break;
                }
                if let Some(delay) = spec.order.admit(&io, spec.shard, &mut memo, entry).await {
                    tracing::debug!(shard = spec.shard, id = %entry.id, ?delay, "moved key waits for its old shard");
                    defer = Some((index, delay));
                    break;
                }
                attempt::single(&io, &spec, entry).await
            };
            spec.signals.in_flight.fetch_sub(1, Ordering::AcqRel);
            match fate {
                Fate::Ack => acks.push(&entry.id),
                Fate::DeadLetter(letter) => {
                    tracing::warn!(shard = spec.shard, id = %entry.id, key = entry.key(), deliveries = letter.deliveries, error = %letter.reason, permanent = letter.permanent, dead_letter = %io.config.dead_letter_key(), "dead-lettering entry");
                    letters.push((entry, letter));
                }
                Fate::LeavePending => {
                    io.metrics.messages("left_pending", 1);
                    outcome.left_pending += 1
                }
                Fate::Done => {}
                Fate::Stopped => {
                    stopped = true;
                    break;
                }
                Fate::Retry { after } => {
                    defer = Some((index, after));
                    retry_at = Some(index);
                    break;
                }
            }
            last_done = Some(&entry.id);
        }
        spec.signals.in_flight.store(0, Ordering::Release);
        drop(permit);

        // Keep the shard while it is busy and the scheduler did not ask for it back (another shard waits
        // for a worker, or the listener paused): saves the hand-back and lets the acks ride along with the
        // next read. Asked back for another shard, a busy job still runs for `YIELD_AFTER`.
        let asked_back = hands_back(
            spec.signals.yield_now.load(Ordering::Acquire),
            *spec.paused.borrow(),
            started.elapsed(),
        );
        let keep = !stopped
            && defer.is_none()
            && letters.is_empty()
            && next_read_mode == ReadMode::Live
            && busy(entries.len(), full)
            && turns < spec.max_turns
            && !asked_back
            && spec.ownership.is_active();
        spec.read_mode = next_read_mode;
        if keep {
            carried = (!acks.is_empty()).then(|| io.carry_acks(&spec.key, &acks));
            if carried.is_none() {
                outcome.last_acked = last_done.map(str::to_owned).or(outcome.last_acked.take());
            }
            continue;
        }

        // A `>` read that found little left nothing behind it: the shard goes idle, watched by the wait.
        // A job of one batch (a short delivery's, whose shard rides the wait) is judged by its own rule.
        let still_busy = if spec.max_turns == 1 {
            delivery_busy(entries.len(), full)
        } else {
            busy(entries.len(), full)
        };
        outcome.drained = read_new
            && !still_busy
            && !stopped
            && defer.is_none()
            && spec.read_mode == ReadMode::Live;
        let finished = finish(&io, &spec, &acks, &letters).await;
        let last_done = last_done.map(str::to_owned);
        if let Err(error) = finished {
            tracing::warn!(shard = spec.shard, %error, "acknowledging failed; the batch stays pending");
            outcome.error = Some(error);
            // Re-deliver our own pending entries before reading new ones.
            outcome.next_read_mode = Some(ReadMode::claim_own());
            return outcome;
        }
        if let Some(last) = last_done {
            outcome.last_acked = Some(last);
        }
        if let Some((index, delay)) = defer {
            outcome.deferred = entries.split_off(index);
            outcome.defer_for = Some(delay);
            if retry_at == Some(index) {
                outcome.deferred[0].retries += 1;
            }
        }
        outcome.next_read_mode = Some(spec.read_mode.clone());
        return outcome;
    }
}

/// Whether a read of `read` entries, of `full` at most, says its shard is busy, so that the job reads
/// again rather than leave it to the idle wait: two entries or more (a full read, when a batch is one).
/// Two arrived since the last look, so more come while they are handled: polling costs a command per
/// two entries at most, while the idle wait's cycle over every idle shard (a blocking read, then their
/// jobs) would hold such a shard back by a cycle. A read of one entry left nothing behind it.
pub(crate) fn busy(read: usize, full: usize) -> bool {
    read > 0 && read >= full.min(2)
}

/// Whether a short delivery of the idle wait, `read` of the `full` it read at most, says its shard is busy,
/// so that the shard is polled after its job rather than left riding the wait: a quarter of that or more.
/// Stricter than [`busy`]: the delivery may have gathered over a slow handler's whole run, so a few
/// entries say little of the shard's rate.
pub(crate) fn delivery_busy(read: usize, full: usize) -> bool {
    read > 0 && read >= (full / 4).max(1)
}

/// A worker's permit for the handler (see [`ShardIo::handlers`]), or none if the job is told to stop
/// meanwhile (then it handles nothing: its entries stay pending, for its next job or the next owner).
async fn handler_permit<'a>(
    io: &'a ShardIo,
    signals: &JobSignals,
) -> Option<tokio::sync::SemaphorePermit<'a>> {
    let stopped = signals.stopped.notified();
    tokio::pin!(stopped);
    // Registered before the flag is read: a stop between the two still wakes it.
    stopped.as_mut().enable();
    if signals.stop.load(Ordering::Acquire) {
        return None;
    }
    tokio::select! {
        biased;
        () = stopped => None,
        permit = io.handlers.acquire() => permit.ok(),
    }
}

async fn fetch(io: &ShardIo, spec: &mut JobSpec) -> Result<(Vec<Entry>, ReadMode), RedisError> {
    if spec.reclaim {
        spec.reclaim = false;
        let entries = io.reclaim_stale(&spec.key, &spec.fence).await?;
        if !entries.is_empty() {
            tracing::warn!(shard = spec.shard, entries = entries.len(), "claimed entries another consumer left pending too long (a zombie owner or a lost ack); handling them now");
            return Ok((entries, spec.read_mode.clone()));
        }
    }
    match &spec.read_mode {
        ReadMode::Claim { cursor } => {
            let (next, entries) = io.claim(&spec.key, &spec.fence, cursor).await?;
            if next == crate::names::START_ID {
                match io.cleanup_consumers(&spec.key, &spec.fence).await {
                    Ok(deleted) if !deleted.is_empty() => {
                        tracing::debug!(
                            shard = spec.shard,
                            ?deleted,
                            "deleted idle consumer names"
                        );
                    }
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(shard = spec.shard, %error, "consumer cleanup failed")
                    }
                }
                Ok((entries, ReadMode::Live))
            } else {
                Ok((entries, ReadMode::Claim { cursor: next }))
            }
        }
        ReadMode::Live => Ok((io.read_new(&spec.key, &spec.fence).await?, ReadMode::Live)),
    }
}

/// Dead-letter, then acknowledge, retrying transient errors a few times.
async fn finish(
    io: &ShardIo,
    spec: &JobSpec,
    acks: &[&str],
    letters: &[(&Entry, Letter)],
) -> Result<(), RedisError> {
    if acks.is_empty() && letters.is_empty() {
        return Ok(());
    }
    let mut all: Vec<&str> = acks.to_vec();
    all.extend(letters.iter().map(|(e, _)| e.id.as_str()));
    let mut attempt = 0u32;
    let mut lettered = false;
    loop {
        if !spec.ownership.is_active() {
            // Fenced: acknowledging now could ack entries the next owner is handling.
            return Ok(());
        }
        let result = async {
            if !lettered {
                io.dead_letter(&spec.key, spec.shard, letters).await?;
                lettered = true;
                io.metrics.messages("dead_lettered", letters.len() as u64);
            }
            io.ack(&spec.key, &all).await
        }
        .await;
        match result {
            Ok(()) => return Ok(()),
            Err(error) if attempt >= 3 => return Err(error),
            Err(error) => {
                tracing::debug!(shard = spec.shard, %error, attempt, "ack failed, retrying");
                tokio::time::sleep(std::time::Duration::from_millis(50 << attempt)).await;
                attempt += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{busy, delivery_busy};

    #[test]
    fn rule_a_read_of_two_entries_or_more_keeps_its_shard_read() {
        assert!(!busy(0, 100), "an empty read: idle");
        assert!(!busy(1, 100), "one entry: nothing was left behind, idle");
        assert!(
            busy(2, 100),
            "two arrived since the last look: busy, read again"
        );
        assert!(busy(25, 100) && busy(100, 100));
        // A batch of one: a full read is busy.
        assert!(busy(1, 1) && !busy(0, 1));
        assert!(!busy(1, 3) && busy(2, 3));
    }

    #[test]
    fn rule_a_short_delivery_of_a_quarter_of_the_waits_count_or_more_has_its_shard_polled() {
        assert!(!delivery_busy(0, 25));
        assert!(
            !delivery_busy(5, 25),
            "a few entries: they may have come over a slow handler's run, idle"
        );
        assert!(delivery_busy(6, 25), "a quarter: polled after the job");
        // A wait that read one entry a shard: one is enough.
        assert!(delivery_busy(1, 1) && delivery_busy(1, 3));
    }
}
