//! One attempt of the user's handler, on one entry or on a batch: the span, the panic catcher, the
//! timeout, the metrics, and what the result means for each entry ([`fate`], pure).
//!
//! A failure with deliveries left is [`Fate::Retry`]: the job defers the entry for the backoff instead of
//! sleeping on its worker.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use super::config::{AckPolicy, FailurePolicy, OnExhausted};
use super::entry::Entry;
use super::job_spec::JobSpec;
use super::message::{Acker, BoxFuture, Delivery, HandlerError};
use super::shard_io::ShardIo;

/// The fate of one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Fate {
    Ack,
    DeadLetter {
        deliveries: u32,
        error: String,
    },
    LeavePending,
    /// Already acknowledged by the handler (manual policy), or nothing to do.
    Done,
    /// Stopped before or during its retries: leave it and the rest of the batch pending.
    Stopped,
    /// Failed with deliveries left: defer it (and the rest of the batch) for the backoff, then retry. The
    /// worker serves other shards meanwhile.
    Retry {
        after: Duration,
    },
}

/// What one attempt's `result` means for its entries, delivered `deliveries` times counting this attempt,
/// on their `retry`-th local retry: acknowledged on success (unless the handler acknowledges by hand);
/// on failure, done if the handler acknowledged them anyway, exhausted after `max_deliveries`, left
/// pending if the job was stopped, else retried after the policy's backoff.
pub(super) fn fate(
    result: &Result<(), String>,
    deliveries: u32,
    retry: u32,
    policy: &FailurePolicy,
    manual: bool,
    acked: bool,
    stopped: bool,
) -> Fate {
    match result {
        Ok(()) if manual => Fate::Done,
        Ok(()) => Fate::Ack,
        Err(_) if acked => Fate::Done,
        Err(error) if deliveries >= policy.max_deliveries.max(1) => {
            exhausted(policy.on_exhausted, deliveries, error.clone())
        }
        Err(_) if stopped => Fate::Stopped,
        Err(_) => Fate::Retry {
            after: policy.backoff(retry),
        },
    }
}

/// The fate of an entry that never reaches the handler: a dead letter replayed to another group only
/// (see `crate::replay`) is acknowledged, one delivered more often than `max_deliveries` (earlier attempts
/// crashed or were abandoned) is exhausted.
pub(super) fn without_attempt(entry: &Entry, group: &str, policy: &FailurePolicy) -> Option<Fate> {
    let fields = entry
        .fields
        .iter()
        .map(|(n, v)| (n.as_slice(), v.as_slice()));
    if crate::replay::addressed_to_other_group(fields, group) {
        return Some(Fate::Ack);
    }
    let max = policy.max_deliveries.max(1);
    (entry.delivery_count > max).then(|| {
        let error = format!(
            "delivered {} times, more than max_deliveries = {max}: earlier attempts crashed or were abandoned",
            entry.delivery_count
        );
        exhausted(policy.on_exhausted, entry.delivery_count, error)
    })
}

fn exhausted(on_exhausted: OnExhausted, deliveries: u32, error: String) -> Fate {
    match on_exhausted {
        OnExhausted::DeadLetter => Fate::DeadLetter { deliveries, error },
        OnExhausted::LeavePending => Fate::LeavePending,
    }
}

/// The handler's call, caught: a panic in the synchronous part of the call is the attempt's error.
fn called<T>(span: &tracing::Span, call: impl FnOnce() -> T) -> Result<T, String> {
    span.in_scope(|| crate::panic::catch(call))
        .map_err(|panic| panicked(span, &panic))
}

/// A handler attempt that panicked: said once, at WARN, in the message's span (the panic hook stays
/// quiet, see `crate::panic`); the attempt's error.
fn panicked(span: &tracing::Span, panic: &str) -> String {
    span.in_scope(|| tracing::warn!(panic, "handler panicked; the attempt counts as failed"));
    format!("handler panicked: {panic}")
}

/// Awaits the handler's future in its span, within the timeout, catching a panic; records the attempt
/// (`entries` handled or failed) in the metrics.
async fn attempt(
    io: &ShardIo,
    span: tracing::Span,
    future: BoxFuture<'static, Result<(), HandlerError>>,
    entries: u64,
) -> Result<(), String> {
    let started = std::time::Instant::now();
    let run = crate::panic::catch_panic(future).instrument(span.clone());
    let (result, outcome) = match io.config.handler_timeout {
        None => (run.await, "ok"),
        Some(limit) => match tokio::time::timeout(limit, run).await {
            Ok(result) => (result, "ok"),
            Err(_) => {
                span.in_scope(|| {
                    tracing::warn!(?limit, "handler timed out; the attempt counts as failed")
                });
                let error = format!("handler timed out after {} ms", limit.as_millis());
                (Ok(Err(HandlerError::msg(error))), "timeout")
            }
        },
    };
    let result = match result {
        Ok(result) => result.map_err(|e| e.to_string()),
        Err(panic) => Err(panicked(&span, &panic)),
    };
    let outcome = match (&result, outcome) {
        (Ok(()), _) => "ok",
        (Err(_), "timeout") => "timeout",
        (Err(_), _) => "error",
    };
    io.metrics.handler_attempt(outcome, started.elapsed());
    let counted = if result.is_ok() { "handled" } else { "failed" };
    io.metrics.messages(counted, entries);
    result
}

fn acker(io: &Arc<ShardIo>, spec: &JobSpec, acked: &Arc<AtomicBool>) -> Option<Acker> {
    (io.config.ack_policy == AckPolicy::Manual).then(|| Acker {
        io: io.clone(),
        stream_key: spec.key.clone(),
        ownership: spec.ownership.clone(),
        acked: acked.clone(),
    })
}

/// One attempt of a single-entry handler on `entry` (its `retries`-th retry).
pub(super) async fn single(io: &Arc<ShardIo>, spec: &JobSpec, entry: &Entry) -> Fate {
    let policy = io.config.failure_policy;
    if let Some(fate) = without_attempt(entry, &io.config.group, &policy) {
        return fate;
    }
    let retry = entry.retries;
    let deliveries = entry.delivery_count + retry;
    let acked = Arc::new(AtomicBool::new(false));
    let delivery = Delivery {
        fields: &entry.fields,
        id: &entry.id,
        key: entry.key(),
        shard: spec.shard,
        delivery_count: deliveries,
        token: &spec.token,
        acker: acker(io, spec, &acked),
    };
    let _running = io
        .probe
        .handler_started(spec.shard, &entry.id, io.config.handler_timeout);
    // The handler runs inside the message's span, so its own logs carry where the entry came from.
    let span = tracing::info_span!(
        "message",
        stream = %io.config.stream_prefix,
        group = %io.config.group,
        shard = spec.shard,
        entry_id = %entry.id,
        key = entry.key(),
        member = %spec.token.member_id,
        epoch = spec.token.member_epoch,
        delivery_count = deliveries,
    );
    let result = match called(&span, || spec.handler.call(delivery)) {
        Ok(Ok(future)) => attempt(io, span, future, 1).await,
        Ok(Err(decode_error)) => {
            return Fate::DeadLetter {
                deliveries,
                error: format!("undecodable payload: {decode_error}"),
            }
        }
        Err(panicked) => {
            io.metrics.handler_attempt("error", Duration::ZERO);
            io.metrics.messages("failed", 1);
            Err(panicked)
        }
    };
    if let Err(error) = &result {
        tracing::debug!(shard = spec.shard, id = %entry.id, deliveries, %error, "handler failed");
    }
    let fate = fate(
        &result,
        deliveries,
        retry,
        &policy,
        io.config.ack_policy == AckPolicy::Manual,
        acked.load(Ordering::Acquire),
        spec.signals.stop.load(Ordering::Acquire),
    );
    if matches!(fate, Fate::Retry { .. }) {
        io.metrics.messages("retried", 1);
    }
    fate
}

/// A batch handler's turn (see [`BoxedHandler::json_batch`](super::BoxedHandler::json_batch)): the
/// entries up to the first one that must wait for its old shard (or a stop) go to the handler in one call,
/// and every one of them gets the batch's fate, in order: the job loop then acks, dead-letters or defers
/// them exactly as single entries. The batch's retry count is its first entry's (a deferred batch carries it
/// there); an entry that does not decode, or is addressed to another group, or was delivered too often,
/// gets its own fate and does not go to the handler.
pub(super) async fn batch(
    io: &Arc<ShardIo>,
    spec: &JobSpec,
    entries: &[Entry],
    refreshed: &mut bool,
) -> Vec<Fate> {
    let policy = io.config.failure_policy;
    let retry = entries.first().map_or(0, |e| e.retries);
    let mut fates: Vec<Option<Fate>> = Vec::new();
    let mut handed = Vec::new();
    for entry in entries {
        if spec.signals.stop.load(Ordering::Acquire) || !spec.ownership.is_active() {
            break;
        }
        if spec
            .order
            .gate(io, spec.shard, refreshed, entry)
            .await
            .is_some()
        {
            break;
        }
        spec.order.note_stale_write(io, spec.shard, entry).await;
        let fate = without_attempt(entry, &io.config.group, &policy);
        if fate.is_none() {
            handed.push(fates.len());
        }
        fates.push(fate);
    }
    let done =
        |fates: Vec<Option<Fate>>| fates.into_iter().map(|f| f.unwrap_or(Fate::Done)).collect();
    let Some(&first) = handed.first() else {
        return done(fates);
    };
    let deliveries = handed
        .iter()
        .map(|&i| entries[i].delivery_count)
        .max()
        .unwrap_or(1)
        + retry;
    let acked: Vec<Arc<AtomicBool>> = handed
        .iter()
        .map(|_| Arc::new(AtomicBool::new(false)))
        .collect();
    let batch: Vec<Delivery<'_>> = handed
        .iter()
        .zip(&acked)
        .map(|(&i, acked)| Delivery {
            fields: &entries[i].fields,
            id: &entries[i].id,
            key: entries[i].key(),
            shard: spec.shard,
            delivery_count: entries[i].delivery_count + retry,
            token: &spec.token,
            acker: acker(io, spec, acked),
        })
        .collect();
    let first_id = entries[first].id.as_str();
    let _running = io
        .probe
        .handler_started(spec.shard, first_id, io.config.handler_timeout);
    let span = tracing::info_span!(
        "batch",
        stream = %io.config.stream_prefix,
        group = %io.config.group,
        shard = spec.shard,
        first_entry_id = %first_id,
        entries = handed.len(),
        member = %spec.token.member_id,
        epoch = spec.token.member_epoch,
        delivery_count = deliveries,
    );
    let result = match called(&span, || spec.handler.call_batch(batch)) {
        Ok((errors, future)) => {
            for (&i, error) in handed.iter().zip(errors) {
                if let Some(error) = error {
                    fates[i] = Some(Fate::DeadLetter {
                        deliveries,
                        error: format!("undecodable payload: {error}"),
                    });
                }
            }
            let Some(future) = future else {
                return done(fates);
            };
            let count = handed.iter().filter(|&&i| fates[i].is_none()).count();
            attempt(io, span, future, count as u64).await
        }
        Err(panicked) => {
            io.metrics.handler_attempt("error", Duration::ZERO);
            io.metrics.messages("failed", handed.len() as u64);
            Err(panicked)
        }
    };
    if let Err(error) = &result {
        tracing::debug!(shard = spec.shard, id = %first_id, deliveries, %error, "batch handler failed");
    }
    let manual = io.config.ack_policy == AckPolicy::Manual;
    let all_acked = manual && acked.iter().all(|a| a.load(Ordering::Acquire));
    let fate = fate(
        &result,
        deliveries,
        retry,
        &policy,
        manual,
        all_acked,
        spec.signals.stop.load(Ordering::Acquire),
    );
    let handled: Vec<usize> = handed
        .iter()
        .copied()
        .filter(|&i| fates[i].is_none())
        .collect();
    if matches!(fate, Fate::Retry { .. }) {
        io.metrics.messages("retried", handled.len() as u64);
    }
    for i in handled {
        fates[i] = Some(fate.clone());
    }
    done(fates)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(max_deliveries: u32, on_exhausted: OnExhausted) -> FailurePolicy {
        FailurePolicy {
            max_deliveries,
            on_exhausted,
            ..FailurePolicy::default()
        }
    }

    fn failed() -> Result<(), String> {
        Err("boom".into())
    }

    #[test]
    fn rule_success_acks_unless_the_handler_acks_by_hand() {
        let p = policy(3, OnExhausted::DeadLetter);
        assert_eq!(fate(&Ok(()), 1, 0, &p, false, false, false), Fate::Ack);
        assert_eq!(fate(&Ok(()), 1, 0, &p, true, false, false), Fate::Done);
    }

    #[test]
    fn rule_a_failure_the_handler_acknowledged_anyway_is_done() {
        let p = policy(1, OnExhausted::DeadLetter);
        assert_eq!(fate(&failed(), 5, 0, &p, true, true, true), Fate::Done);
    }

    #[test]
    fn rule_a_failure_with_deliveries_left_retries_after_the_policys_backoff() {
        let p = policy(3, OnExhausted::DeadLetter);
        for retry in 0..2 {
            assert_eq!(
                fate(&failed(), 1 + retry, retry, &p, false, false, false),
                Fate::Retry {
                    after: p.backoff(retry)
                }
            );
        }
    }

    #[test]
    fn rule_the_last_delivery_is_exhausted_by_the_policy_even_when_stopped() {
        let dead = policy(3, OnExhausted::DeadLetter);
        assert_eq!(
            fate(&failed(), 3, 2, &dead, false, false, true),
            Fate::DeadLetter {
                deliveries: 3,
                error: "boom".into()
            }
        );
        let pending = policy(3, OnExhausted::LeavePending);
        assert_eq!(
            fate(&failed(), 4, 0, &pending, false, false, false),
            Fate::LeavePending
        );
        // max_deliveries 0 counts as 1.
        let zero = policy(0, OnExhausted::DeadLetter);
        assert!(matches!(
            fate(&failed(), 1, 0, &zero, false, false, false),
            Fate::DeadLetter { .. }
        ));
    }

    #[test]
    fn rule_a_stopped_failure_with_deliveries_left_stays_pending() {
        let p = policy(3, OnExhausted::DeadLetter);
        assert_eq!(fate(&failed(), 1, 0, &p, false, false, true), Fate::Stopped);
    }

    fn entry(delivery_count: u32, fields: &[(&str, &str)]) -> Entry {
        Entry {
            id: "1-0".into(),
            fields: fields
                .iter()
                .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
                .collect(),
            delivery_count,
            deleted: false,
            retries: 0,
        }
    }

    #[test]
    fn rule_an_entry_delivered_too_often_is_exhausted_without_an_attempt() {
        let p = policy(3, OnExhausted::DeadLetter);
        assert_eq!(without_attempt(&entry(3, &[]), "g", &p), None);
        assert!(matches!(
            without_attempt(&entry(4, &[]), "g", &p),
            Some(Fate::DeadLetter { deliveries: 4, .. })
        ));
        let p = policy(3, OnExhausted::LeavePending);
        assert_eq!(
            without_attempt(&entry(4, &[]), "g", &p),
            Some(Fate::LeavePending)
        );
    }

    #[test]
    fn rule_a_dead_letter_replayed_to_another_group_is_acked_without_an_attempt() {
        let p = policy(3, OnExhausted::DeadLetter);
        let replayed = entry(1, &[(crate::names::field::ONLY_GROUP, "other")]);
        assert_eq!(without_attempt(&replayed, "g", &p), Some(Fate::Ack));
        let ours = entry(1, &[(crate::names::field::ONLY_GROUP, "g")]);
        assert_eq!(without_attempt(&ours, "g", &p), None);
    }
}
