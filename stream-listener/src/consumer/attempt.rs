//! One attempt of the user's handler, on one entry or on a batch: the span, the panic catcher, the
//! timeout, the metrics, and what the result means for each entry ([`fate`], pure).
//!
//! A failure with deliveries left is [`Fate::Retry`]: the job defers the entry for the backoff instead of
//! sleeping on its worker. The test kit (`crate::testing`) runs a handler through [`called`], [`run`] and
//! [`fate`] too, so what it reports is what the consumer does.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use super::config::{AckPolicy, FailurePolicy, OnExhausted};
use super::entry::Entry;
use super::job_spec::JobSpec;
use super::message::{Acker, BoxFuture, Delivery, ErrorClass, HandlerError};
use super::order::GateMemo;
use super::shard_io::{Letter, ShardIo};
use crate::health::HandlerGuard;

/// The target of the `message` and `batch` spans a handler runs in: one of their own, so that
/// `RUST_LOG=info,stream_listener::message=off` drops those spans, and what they cost per entry (about
/// 1.5-2 µs of client CPU with a `fmt` subscriber, see the README's "Tracing"), and nothing else.
pub(crate) const SPAN_TARGET: &str = "stream_listener::message";

/// The fate of one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fate {
    Ack,
    DeadLetter(Letter),
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

/// A failed attempt: why (for the logs and the dead letter), and what the handler asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    pub(crate) reason: String,
    pub(crate) class: ErrorClass,
}

impl Failure {
    /// A failure of the attempt itself (a panic, a timeout): transient.
    pub(crate) fn transient(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            class: ErrorClass::Transient,
        }
    }
}

impl From<HandlerError> for Failure {
    fn from(error: HandlerError) -> Self {
        Self {
            reason: error.to_string(),
            class: error.class(),
        }
    }
}

/// What [`fate`] knows about an attempt besides its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Facts {
    /// Deliveries of the entry, this attempt included.
    pub(crate) deliveries: u32,
    /// Its local retry number (0: the first attempt of this owner), which the backoff doubles with.
    pub(crate) retry: u32,
    /// The ack policy is [`AckPolicy::Manual`].
    pub(crate) manual: bool,
    /// The handler acknowledged the entry by hand (every entry, for a batch).
    pub(crate) acked: bool,
    /// The job was told to stop.
    pub(crate) stopped: bool,
    /// The random draw of the backoff's jitter.
    pub(crate) random: u64,
}

/// What one attempt's `result` means for its entries: acknowledged on success (unless the handler
/// acknowledges by hand); on failure, done if the handler acknowledged them anyway, exhausted at once if
/// the error is permanent or after `max_deliveries`, left pending if the job was stopped, else retried
/// after the wait the handler asked for (at most `max_backoff`) or the policy's backoff.
pub(crate) fn fate(result: &Result<(), Failure>, facts: Facts, policy: &FailurePolicy) -> Fate {
    let failure = match result {
        Ok(()) if facts.manual => return Fate::Done,
        Ok(()) => return Fate::Ack,
        Err(_) if facts.acked => return Fate::Done,
        Err(failure) => failure,
    };
    let letter = |permanent| Letter {
        deliveries: facts.deliveries,
        reason: failure.reason.clone(),
        permanent,
    };
    match failure.class {
        ErrorClass::Permanent => exhausted(policy.on_exhausted, letter(true)),
        _ if facts.deliveries >= policy.max_deliveries.max(1) => {
            exhausted(policy.on_exhausted, letter(false))
        }
        _ if facts.stopped => Fate::Stopped,
        ErrorClass::RetryAfter(wait) => Fate::Retry {
            after: wait.min(policy.max_backoff),
        },
        ErrorClass::Transient => Fate::Retry {
            after: policy.backoff(facts.retry, facts.random),
        },
    }
}

/// The fate of an entry that never reaches the handler: a dead letter replayed to another group only
/// (see `crate::replay`) is acknowledged, one delivered more often than `max_deliveries` (earlier attempts
/// crashed or were abandoned) is exhausted.
pub(crate) fn without_attempt(entry: &Entry, group: &str, policy: &FailurePolicy) -> Option<Fate> {
    let fields = entry
        .fields
        .iter()
        .map(|(n, v)| (n.as_slice(), v.as_slice()));
    if crate::replay::addressed_to_other_group(fields, group) {
        return Some(Fate::Ack);
    }
    let max = policy.max_deliveries.max(1);
    (entry.delivery_count > max).then(|| {
        let reason = format!(
            "delivered {} times, more than max_deliveries = {max}: earlier attempts crashed or were abandoned",
            entry.delivery_count
        );
        exhausted(
            policy.on_exhausted,
            Letter {
                deliveries: entry.delivery_count,
                reason,
                permanent: false,
            },
        )
    })
}

/// An entry the decoder refused: dead-lettered at once, since retrying cannot fix a payload.
fn undecodable(deliveries: u32, error: &str) -> Fate {
    Fate::DeadLetter(Letter {
        deliveries,
        reason: format!("undecodable payload: {error}"),
        permanent: true,
    })
}

fn exhausted(on_exhausted: OnExhausted, letter: Letter) -> Fate {
    match on_exhausted {
        OnExhausted::DeadLetter => Fate::DeadLetter(letter),
        OnExhausted::LeavePending => Fate::LeavePending,
    }
}

/// The handler's call, caught: a panic in the synchronous part of the call is the attempt's error.
pub(crate) fn called<T>(span: &tracing::Span, call: impl FnOnce() -> T) -> Result<T, Failure> {
    span.in_scope(|| crate::panic::catch(call))
        .map_err(|panic| Failure::transient(panicked(span, &panic)))
}

/// A handler attempt that panicked: said once, at WARN, in the message's span (the panic hook stays
/// quiet, see `crate::panic`); the attempt's error.
fn panicked(span: &tracing::Span, panic: &str) -> String {
    span.in_scope(|| tracing::warn!(panic, "handler panicked; the attempt counts as failed"));
    format!("handler panicked: {panic}")
}

/// Awaits the handler's future in its span, within `timeout`, catching a panic: the attempt's result
/// and its outcome for the metrics (`ok`, `error` or `timeout`).
pub(crate) async fn run(
    span: tracing::Span,
    future: BoxFuture<'static, Result<(), HandlerError>>,
    timeout: Option<Duration>,
) -> (Result<(), Failure>, &'static str) {
    let run = crate::panic::catch_panic(future).instrument(span.clone());
    let caught = match timeout {
        None => run.await,
        Some(limit) => match tokio::time::timeout(limit, run).await {
            Ok(caught) => caught,
            Err(_) => {
                span.in_scope(|| {
                    tracing::warn!(?limit, "handler timed out; the attempt counts as failed")
                });
                let reason = format!("handler timed out after {} ms", limit.as_millis());
                return (Err(Failure::transient(reason)), "timeout");
            }
        },
    };
    match caught {
        Ok(Ok(())) => (Ok(()), "ok"),
        Ok(Err(error)) => (Err(error.into()), "error"),
        Err(panic) => (Err(Failure::transient(panicked(&span, &panic))), "error"),
    }
}

/// [`run`], recording the attempt (`entries` handled or failed, since `running` registered it) in the
/// metrics.
async fn attempt(
    io: &ShardIo,
    span: tracing::Span,
    future: BoxFuture<'static, Result<(), HandlerError>>,
    entries: u64,
    running: &HandlerGuard<'_>,
) -> Result<(), Failure> {
    // The probe's start: one clock read per attempt fewer (each was about 8 % of an attempt's own work in
    // a profile of the throughput bench).
    let started = running.started();
    let (result, outcome) = run(span, future, io.config.handler_timeout).await;
    io.metrics.handler_attempt(outcome, started.elapsed());
    let counted = if result.is_ok() { "handled" } else { "failed" };
    io.metrics.messages(counted, entries);
    result
}

#[cfg(feature = "opentelemetry")]
fn source<'a>(io: &'a ShardIo, spec: &JobSpec) -> crate::otel::Source<'a> {
    crate::otel::Source {
        stream: &io.config.stream_prefix,
        group: &io.config.group,
        shard: spec.shard,
    }
}

/// The flag a message's manual acker sets: only under [`AckPolicy::Manual`] (under the others the
/// handler has no acker, and a flag per handled entry was an allocation for nothing).
fn ack_flag(io: &ShardIo) -> Option<Arc<AtomicBool>> {
    (io.config.ack_policy == AckPolicy::Manual).then(|| Arc::new(AtomicBool::new(false)))
}

fn acker(io: &Arc<ShardIo>, spec: &JobSpec, acked: Option<&Arc<AtomicBool>>) -> Option<Acker> {
    acked.map(|acked| Acker {
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
    let acked = ack_flag(io);
    let key = entry.key();
    let delivery = Delivery {
        fields: &entry.fields,
        id: &entry.id,
        key,
        shard: spec.shard,
        delivery_count: deliveries,
        token: &spec.token,
        headers: entry.headers(),
        acker: acker(io, spec, acked.as_ref()),
    };
    let running = io
        .probe
        .handler_started(spec.shard, &entry.id, io.config.handler_timeout);
    // The handler runs inside the message's span, so its own logs carry where the entry came from.
    let span = tracing::info_span!(
        target: SPAN_TARGET,
        "message",
        stream = %io.config.stream_prefix,
        group = %io.config.group,
        shard = spec.shard,
        entry_id = %entry.id,
        key,
        member = %spec.token.member_id,
        epoch = spec.token.member_epoch,
        delivery_count = deliveries,
    );
    #[cfg(feature = "opentelemetry")]
    if let Ok(headers) = &delivery.headers {
        crate::otel::message_span(&span, &source(io, spec), &entry.id, headers);
    }
    let result = match called(&span, || spec.handler.call(delivery)) {
        Ok(Ok(future)) => attempt(io, span, future, 1, &running).await,
        Ok(Err(decode_error)) => return undecodable(deliveries, &decode_error),
        Err(panicked) => {
            io.metrics.handler_attempt("error", Duration::ZERO);
            io.metrics.messages("failed", 1);
            Err(panicked)
        }
    };
    if let Err(failure) = &result {
        tracing::debug!(shard = spec.shard, id = %entry.id, deliveries, error = %failure.reason, class = ?failure.class, "handler failed");
    }
    let facts = Facts {
        deliveries,
        retry,
        manual: io.config.ack_policy == AckPolicy::Manual,
        acked: acked.is_some_and(|acked| acked.load(Ordering::Acquire)),
        stopped: spec.signals.stop.load(Ordering::Acquire),
        // Drawn only for a retry's jitter: a handled entry costs no draw.
        random: if result.is_err() {
            crate::util::random_u64()
        } else {
            0
        },
    };
    let fate = fate(&result, facts, &policy);
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
    memo: &mut GateMemo,
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
            .admit(io, spec.shard, memo, entry)
            .await
            .is_some()
        {
            break;
        }
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
    let acked: Vec<Option<Arc<AtomicBool>>> = handed.iter().map(|_| ack_flag(io)).collect();
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
            headers: entries[i].headers(),
            acker: acker(io, spec, acked.as_ref()),
        })
        .collect();
    let first_id = entries[first].id.as_str();
    let running = io
        .probe
        .handler_started(spec.shard, first_id, io.config.handler_timeout);
    let span = tracing::info_span!(
        target: SPAN_TARGET,
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
    #[cfg(feature = "opentelemetry")]
    crate::otel::batch_span(
        &span,
        &source(io, spec),
        batch.iter().filter_map(|d| d.headers.as_ref().ok()),
    );
    let result = match called(&span, || spec.handler.call_batch(batch)) {
        Ok((errors, future)) => {
            for (&i, error) in handed.iter().zip(errors) {
                if let Some(error) = error {
                    fates[i] = Some(undecodable(deliveries, &error));
                }
            }
            let Some(future) = future else {
                return done(fates);
            };
            let count = handed.iter().filter(|&&i| fates[i].is_none()).count();
            attempt(io, span, future, count as u64, &running).await
        }
        Err(panicked) => {
            io.metrics.handler_attempt("error", Duration::ZERO);
            io.metrics.messages("failed", handed.len() as u64);
            Err(panicked)
        }
    };
    if let Err(failure) = &result {
        tracing::debug!(shard = spec.shard, id = %first_id, deliveries, error = %failure.reason, class = ?failure.class, "batch handler failed");
    }
    let manual = io.config.ack_policy == AckPolicy::Manual;
    let facts = Facts {
        deliveries,
        retry,
        manual,
        acked: manual
            && acked
                .iter()
                .all(|a| a.as_ref().is_some_and(|a| a.load(Ordering::Acquire))),
        stopped: spec.signals.stop.load(Ordering::Acquire),
        // Drawn only for a retry's jitter: a handled entry costs no draw.
        random: if result.is_err() {
            crate::util::random_u64()
        } else {
            0
        },
    };
    let fate = fate(&result, facts, &policy);
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
        FailurePolicy::default()
            .max_deliveries(max_deliveries)
            .on_exhausted(on_exhausted)
    }

    /// The first attempt of an automatic-ack listener that was not stopped.
    fn first(deliveries: u32) -> Facts {
        Facts {
            deliveries,
            retry: deliveries.saturating_sub(1),
            manual: false,
            acked: false,
            stopped: false,
            random: 7,
        }
    }

    fn failed() -> Result<(), Failure> {
        Err(Failure::transient("boom"))
    }

    fn failed_as(class: ErrorClass) -> Result<(), Failure> {
        Err(Failure {
            reason: "boom".into(),
            class,
        })
    }

    fn letter(deliveries: u32, permanent: bool) -> Fate {
        Fate::DeadLetter(Letter {
            deliveries,
            reason: "boom".into(),
            permanent,
        })
    }

    #[test]
    fn rule_success_acks_unless_the_handler_acks_by_hand() {
        let p = policy(3, OnExhausted::DeadLetter);
        assert_eq!(fate(&Ok(()), first(1), &p), Fate::Ack);
        let manual = Facts {
            manual: true,
            ..first(1)
        };
        assert_eq!(fate(&Ok(()), manual, &p), Fate::Done);
    }

    #[test]
    fn rule_a_failure_the_handler_acknowledged_anyway_is_done() {
        let p = policy(1, OnExhausted::DeadLetter);
        let acked = Facts {
            manual: true,
            acked: true,
            stopped: true,
            ..first(5)
        };
        assert_eq!(fate(&failed(), acked, &p), Fate::Done);
        assert_eq!(
            fate(&failed_as(ErrorClass::Permanent), acked, &p),
            Fate::Done
        );
    }

    #[test]
    fn rule_a_failure_with_deliveries_left_retries_after_the_policys_backoff() {
        let p = policy(3, OnExhausted::DeadLetter);
        for retry in 0..2 {
            let facts = first(1 + retry);
            assert_eq!(
                fate(&failed(), facts, &p),
                Fate::Retry {
                    after: p.backoff(retry, facts.random)
                }
            );
        }
    }

    #[test]
    fn rule_the_backoff_is_jittered_by_the_attempts_random_draw() {
        let ms = Duration::from_millis;
        let p = policy(9, OnExhausted::DeadLetter)
            .initial_backoff(ms(100))
            .max_backoff(ms(10_000));
        let wait = |random| match fate(&failed(), Facts { random, ..first(3) }, &p) {
            Fate::Retry { after } => after,
            other => panic!("{other:?}"),
        };
        // Retry 2: 400 ms, jittered into 200..=400 ms.
        assert_eq!(wait(0), ms(200));
        assert!((0..100u64).all(|r| (ms(200)..=ms(400)).contains(&wait(r * 7_919_000))));
        assert_ne!(wait(1_000_000), wait(77_000_000));
        let exact = p.jitter(false);
        assert_eq!(
            fate(&failed(), first(3), &exact),
            Fate::Retry { after: ms(400) }
        );
    }

    #[test]
    fn rule_the_last_delivery_is_exhausted_by_the_policy_even_when_stopped() {
        let dead = policy(3, OnExhausted::DeadLetter);
        let stopped = Facts {
            stopped: true,
            ..first(3)
        };
        assert_eq!(fate(&failed(), stopped, &dead), letter(3, false));
        let pending = policy(3, OnExhausted::LeavePending);
        assert_eq!(fate(&failed(), first(4), &pending), Fate::LeavePending);
        // max_deliveries 0 counts as 1.
        let zero = policy(0, OnExhausted::DeadLetter);
        assert_eq!(fate(&failed(), first(1), &zero), letter(1, false));
    }

    #[test]
    fn rule_a_stopped_failure_with_deliveries_left_stays_pending() {
        let p = policy(3, OnExhausted::DeadLetter);
        let stopped = Facts {
            stopped: true,
            ..first(1)
        };
        assert_eq!(fate(&failed(), stopped, &p), Fate::Stopped);
        let later = failed_as(ErrorClass::RetryAfter(Duration::from_millis(5)));
        assert_eq!(fate(&later, stopped, &p), Fate::Stopped);
    }

    #[test]
    fn rule_a_permanent_failure_is_exhausted_on_its_first_delivery() {
        let permanent = failed_as(ErrorClass::Permanent);
        let dead = policy(5, OnExhausted::DeadLetter);
        assert_eq!(fate(&permanent, first(1), &dead), letter(1, true));
        // Even when stopped: like the last delivery, it is decided.
        let stopped = Facts {
            stopped: true,
            ..first(2)
        };
        assert_eq!(fate(&permanent, stopped, &dead), letter(2, true));
        // `on_exhausted` still decides where it goes.
        let pending = policy(5, OnExhausted::LeavePending);
        assert_eq!(fate(&permanent, first(1), &pending), Fate::LeavePending);
    }

    #[test]
    fn rule_retry_after_replaces_the_backoff_bounded_by_max_backoff() {
        let ms = Duration::from_millis;
        let p = policy(5, OnExhausted::DeadLetter)
            .initial_backoff(ms(1))
            .max_backoff(ms(2_000));
        let asked = |wait| failed_as(ErrorClass::RetryAfter(wait));
        // Not jittered, not doubled.
        assert_eq!(
            fate(&asked(ms(750)), first(1), &p),
            Fate::Retry { after: ms(750) }
        );
        assert_eq!(
            fate(&asked(ms(750)), first(3), &p),
            Fate::Retry { after: ms(750) }
        );
        assert_eq!(
            fate(&asked(ms(60_000)), first(1), &p),
            Fate::Retry { after: ms(2_000) }
        );
        // It still spends a delivery: the last one is exhausted.
        assert_eq!(fate(&asked(ms(750)), first(5), &p), letter(5, false));
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
            Some(Fate::DeadLetter(Letter {
                deliveries: 4,
                permanent: false,
                ..
            }))
        ));
        let p = policy(3, OnExhausted::LeavePending);
        assert_eq!(
            without_attempt(&entry(4, &[]), "g", &p),
            Some(Fate::LeavePending)
        );
    }

    #[test]
    fn rule_an_undecodable_entry_is_a_permanent_dead_letter() {
        assert_eq!(
            undecodable(2, "expected value"),
            Fate::DeadLetter(Letter {
                deliveries: 2,
                reason: "undecodable payload: expected value".into(),
                permanent: true,
            })
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

    #[tokio::test]
    async fn a_run_keeps_the_handlers_class_and_makes_panics_and_timeouts_transient() {
        let span = tracing::Span::none;
        let permanent: BoxFuture<'static, Result<(), HandlerError>> =
            Box::pin(async { Err(HandlerError::permanent("bad data")) });
        assert_eq!(
            run(span(), permanent, None).await,
            (
                Err(Failure {
                    reason: "bad data".into(),
                    class: ErrorClass::Permanent
                }),
                "error"
            )
        );
        let panics: BoxFuture<'static, Result<(), HandlerError>> =
            Box::pin(async { panic!("boom") });
        let at = line!() - 1;
        assert_eq!(
            run(span(), panics, None).await,
            (
                Err(Failure::transient(format!(
                    "handler panicked: boom (at {}:{at}:30)",
                    file!()
                ))),
                "error"
            )
        );
        let hangs: BoxFuture<'static, Result<(), HandlerError>> = Box::pin(std::future::pending());
        assert_eq!(
            run(span(), hangs, Some(Duration::from_millis(5))).await,
            (
                Err(Failure::transient("handler timed out after 5 ms")),
                "timeout"
            )
        );
        let fine: BoxFuture<'static, Result<(), HandlerError>> = Box::pin(async { Ok(()) });
        assert_eq!(run(span(), fine, None).await, (Ok(()), "ok"));
    }
}
