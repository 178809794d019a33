//! The test kit (feature `testing`): unit-test a handler without Redis, and see what its result does under
//! a listener's policies.
//!
//! * [`TestMessage`] builds the `Message<T>` a handler takes (and a batch, and `Message<`[`Fields`]`>`),
//!   with a recording acknowledgement for [`AckPolicy::Manual`] handlers ([`ManualAck`]).
//! * [`HandlerTest`] runs a handler on such messages under a listener's [`FailurePolicy`], [`AckPolicy`]
//!   and handler timeout, and says what the consumer would do with the entries ([`Outcome`]): it goes
//!   through the consumer's own code for the attempt (the panic catcher, the timeout) and for what its
//!   result means, not a copy of it.
//! * Integration tests against a real Redis: start a `redis-server` on a free port with the companion
//!   crate [`stream-listener-test-support`](https://docs.rs/stream-listener-test-support)
//!   (`RedisServer::start()`, what this project's own tests use), then wait on the
//!   [`RunningRuntime`](crate::RunningRuntime) with
//!   [`wait_until_assigned`](crate::RunningRuntime::wait_until_assigned) and
//!   [`wait_until_idle`](crate::RunningRuntime::wait_until_idle).
//!
//! With testcontainers instead, use an image of Redis 7.0 or newer, e.g. `redis:7.4`: the library needs
//! `XAUTOCLAIM` and `ZADD GT` (Redis 6.2) and reads the groups' lag (Redis 7.0). The Redis module of
//! `testcontainers-modules` defaults to Redis 5.0; give it the tag (`Redis::default().with_tag("7.4")`, with
//! `testcontainers::ImageExt` in scope).
//!
//! ```
//! use stream_listener::testing::{HandlerTest, Outcome, TestMessage};
//! use stream_listener::{FailurePolicy, HandlerError, Message};
//!
//! async fn on_order(msg: Message<u64>) -> Result<(), HandlerError> {
//!     if msg.payload == 0 {
//!         return Err(HandlerError::permanent("an order of nothing"));
//!     }
//!     Ok(())
//! }
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let test = HandlerTest::new().failure(FailurePolicy::default().max_deliveries(3));
//! assert_eq!(test.run(&on_order, TestMessage::new(7).build()).await, Outcome::Acked);
//! assert_eq!(
//!     test.run(&on_order, TestMessage::new(0).build()).await,
//!     Outcome::DeadLettered { reason: "an order of nothing".into(), permanent: true }
//! );
//! # });
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::consumer::attempt::{self, Facts, Fate};
use crate::consumer::message::{Acker, Acknowledge, ShardOwnership};
use crate::consumer::{AckPolicy, BatchHandler, FailurePolicy, Fields, Handler, Message};
use crate::headers::Headers;
use crate::member::lifecycle::{FencingToken, OwnershipDeadline};
use crate::runtime::{ConsumerBuilder, ListenerSpec};
use crate::util::BoxFuture;

pub use crate::runtime::WaitError;

/// A [`Message`] for a test: the payload and the metadata the consumer would set.
///
/// Defaults: id `1-0`, key `key`, shard 0, first delivery, token of member `test-member` at epoch 1.
///
/// ```
/// use stream_listener::testing::TestMessage;
/// use stream_listener::Fields;
///
/// let msg = TestMessage::new("hello".to_owned()).key("customer-7").delivery_count(2).build();
/// assert_eq!((msg.key.as_str(), msg.delivery_count), ("customer-7", 2));
///
/// let batch = TestMessage::batch([1u64, 2, 3]);
/// assert_eq!(batch.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(), ["1-0", "2-0", "3-0"]);
///
/// // An entry another client wrote, for a `Message<Fields>` handler.
/// let msg = TestMessage::fields([("order_id", "7"), ("status", "paid")]).build();
/// assert_eq!(msg.payload.get::<u64>("order_id").unwrap(), 7);
/// # let _: Fields = msg.payload;
/// ```
#[derive(Debug, Clone)]
pub struct TestMessage<T> {
    payload: T,
    id: String,
    key: String,
    shard: u32,
    delivery_count: u32,
    token: FencingToken,
    headers: Headers,
}

impl<T> TestMessage<T> {
    /// A first delivery of `payload`.
    pub fn new(payload: T) -> Self {
        Self {
            payload,
            id: "1-0".into(),
            key: "key".into(),
            shard: 0,
            delivery_count: 1,
            token: FencingToken {
                member_id: "test-member".into(),
                member_epoch: 1,
            },
            headers: Headers::new(),
        }
    }

    /// Messages of `payloads` as one read of shard 0 hands them to a batch handler: ids `1-0`, `2-0`, ...
    pub fn batch(payloads: impl IntoIterator<Item = T>) -> Vec<Message<T>> {
        payloads
            .into_iter()
            .enumerate()
            .map(|(i, payload)| Self::new(payload).id(format!("{}-0", i + 1)).build())
            .collect()
    }

    /// The stream entry id.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }

    /// The partition key.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = key.into();
        self
    }

    /// The shard it was read from.
    pub fn shard(mut self, shard: u32) -> Self {
        self.shard = shard;
        self
    }

    /// Deliveries so far, this one included (at least 1). [`HandlerTest`] counts the ones before as
    /// local retries, so they set the backoff.
    pub fn delivery_count(mut self, n: u32) -> Self {
        self.delivery_count = n.max(1);
        self
    }

    /// The fencing token: the owning member and its epoch.
    pub fn token(mut self, member_id: &str, member_epoch: i64) -> Self {
        self.token = FencingToken {
            member_id: member_id.into(),
            member_epoch,
        };
        self
    }

    /// The headers ([`Message::headers`]), replacing any set before.
    ///
    /// ```
    /// use stream_listener::{testing::TestMessage, Headers};
    ///
    /// let msg = TestMessage::new(7u64).header("tenant", "acme").build();
    /// assert_eq!(msg.headers().get("tenant"), Some("acme"));
    /// let msg = TestMessage::new(7u64).headers(Headers::new().with("a", "1")).build();
    /// assert_eq!(msg.headers().len(), 1);
    /// ```
    pub fn headers(mut self, headers: Headers) -> Self {
        self.headers = headers;
        self
    }

    /// One header ([`Message::headers`]), added to (or replacing a value of) those set before.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name, value);
        self
    }

    /// The message, as the automatic ack policies hand it over: [`Message::ack`] does nothing.
    pub fn build(self) -> Message<T> {
        self.message(None)
    }

    /// The message, as [`AckPolicy::Manual`] hands it over: [`Message::ack`] is recorded in the
    /// returned [`ManualAck`] (no Redis involved).
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// use stream_listener::{consumer::AckError, testing::TestMessage};
    ///
    /// let (msg, ack) = TestMessage::new(7u64).manual();
    /// msg.ack().await.unwrap();
    /// assert!(ack.is_acked());
    ///
    /// // After the shard was lost, acknowledging is refused.
    /// let (msg, ack) = TestMessage::new(8u64).manual();
    /// ack.lose_ownership();
    /// assert!(matches!(msg.ack().await, Err(AckError::NotOwner)));
    /// assert!(!ack.is_acked());
    /// # });
    /// ```
    pub fn manual(self) -> (Message<T>, ManualAck) {
        let ack = ManualAck::new(self.token.member_epoch);
        let message = self.message(Some(ack.acker()));
        (message, ack)
    }

    fn message(self, acker: Option<Acker>) -> Message<T> {
        Message {
            payload: self.payload,
            id: self.id,
            key: self.key,
            shard: self.shard,
            delivery_count: self.delivery_count,
            token: self.token,
            headers: self.headers,
            acker,
        }
    }
}

impl TestMessage<Fields> {
    /// A message of an entry with these fields (what a `Message<Fields>` handler gets).
    pub fn fields<N: Into<String>, V: Into<Vec<u8>>>(
        fields: impl IntoIterator<Item = (N, V)>,
    ) -> Self {
        Self::new(Fields::new(fields))
    }
}

/// What a [`Message::ack`] of a [`TestMessage::manual`] message did.
#[derive(Debug, Clone)]
pub struct ManualAck {
    acked: Arc<AtomicBool>,
    ownership: Arc<ShardOwnership>,
}

impl ManualAck {
    fn new(epoch: i64) -> Self {
        Self {
            acked: Arc::new(AtomicBool::new(false)),
            ownership: ShardOwnership::new(OwnershipDeadline::unbounded(), epoch),
        }
    }

    fn acker(&self) -> Acker {
        Acker {
            io: Arc::new(NoRedis),
            stream_key: "test:0".into(),
            ownership: self.ownership.clone(),
            acked: self.acked.clone(),
        }
    }

    /// Whether the handler acknowledged the message.
    pub fn is_acked(&self) -> bool {
        self.acked.load(Ordering::Acquire)
    }

    /// The member loses the shard (revoked or fenced): later acks fail with
    /// [`AckError::NotOwner`](crate::consumer::AckError::NotOwner).
    pub fn lose_ownership(&self) {
        self.ownership.end();
    }
}

/// Acknowledges without Redis: the acker's flag is the record.
struct NoRedis;

impl Acknowledge for NoRedis {
    fn ack<'a>(&'a self, _: &'a str, _: &'a [&'a str]) -> BoxFuture<'a, redis::RedisResult<()>> {
        Box::pin(async { Ok(()) })
    }
}

/// What the consumer does with an entry after a handler attempt, as [`HandlerTest`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// Acknowledged: by the consumer after `Ok`, or by the handler itself ([`AckPolicy::Manual`]).
    Acked,
    /// Delivered again after `after` (the backoff, jittered unless the policy's `jitter` is off, or the
    /// handler's [`retry_after`](crate::HandlerError::retry_after)).
    Retry {
        /// The wait before the next delivery.
        after: Duration,
    },
    /// Copied to the dead-letter stream with `reason` (its `dlq_error`), then acknowledged.
    DeadLettered {
        /// The handler's error, or why it never ran.
        reason: String,
        /// Given up before its deliveries ran out (a permanent error), its `dlq_permanent`.
        permanent: bool,
    },
    /// Left pending: exhausted under [`OnExhausted::LeavePending`](crate::OnExhausted::LeavePending), or
    /// a [`AckPolicy::Manual`] handler that returned without acknowledging.
    LeftPending,
}

/// Runs a handler on test messages under a listener's policies and reports the [`Outcome`].
///
/// The policies are the listener's defaults unless set here or taken from a listener
/// ([`of`](Self::of), [`of_builder`](Self::of_builder), [`registered`](Self::registered)).
///
/// ```
/// use std::time::Duration;
/// use stream_listener::testing::{HandlerTest, Outcome, TestMessage};
/// use stream_listener::{ConsumerBuilder, FailurePolicy, HandlerError, Message};
///
/// async fn charge(_msg: Message<u64>) -> Result<(), HandlerError> {
///     Err(HandlerError::retry_after("rate limited", Duration::from_millis(300)))
/// }
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let builder = ConsumerBuilder::new("orders", "billing")
///     .failure(FailurePolicy::default().max_deliveries(2))
///     .handler(charge);
/// let test = HandlerTest::of_builder(&builder);
/// let first = TestMessage::new(1).build();
/// assert_eq!(test.run(&charge, first).await, Outcome::Retry { after: Duration::from_millis(300) });
/// // The second delivery is the last one.
/// let last = TestMessage::new(1).delivery_count(2).build();
/// assert_eq!(
///     test.run(&charge, last).await,
///     Outcome::DeadLettered { reason: "rate limited".into(), permanent: false }
/// );
/// # });
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HandlerTest {
    failure: FailurePolicy,
    ack: AckPolicy,
    handler_timeout: Option<Duration>,
}

impl HandlerTest {
    /// The policies of a listener with default settings.
    pub fn new() -> Self {
        Self::default()
    }

    /// The policies of `spec` (its failure and ack policies, its handler timeout).
    pub fn of(spec: &ListenerSpec) -> Self {
        Self {
            failure: spec.failure,
            ack: spec.ack,
            handler_timeout: spec.handler_timeout,
        }
    }

    /// The policies `builder` sets.
    pub fn of_builder(builder: &ConsumerBuilder) -> Self {
        Self::of(builder.spec())
    }

    /// The policies of the binary's `#[stream_listener]` function named `handler` (as its attribute
    /// sets them; the environment's overrides are not applied).
    ///
    /// # Panics
    /// If no annotated listener of the binary has that name.
    pub fn registered(handler: &str) -> Self {
        let spec = ListenerSpec::registered()
            .into_iter()
            .find(|spec| spec.name == handler)
            .unwrap_or_else(|| panic!("no #[stream_listener] fn {handler} in this binary"));
        Self::of(&spec)
    }

    /// The failure policy.
    pub fn failure(mut self, failure: FailurePolicy) -> Self {
        self.failure = failure;
        self
    }

    /// The ack policy.
    pub fn ack(mut self, ack: AckPolicy) -> Self {
        self.ack = ack;
        self
    }

    /// How long one attempt may run.
    pub fn handler_timeout(mut self, timeout: Duration) -> Self {
        self.handler_timeout = Some(timeout);
        self
    }

    /// One attempt of `handler` on `message`, and what the consumer does with the entry. Under
    /// [`AckPolicy::Manual`] the message can be acknowledged (by hand, recorded; a message from
    /// [`TestMessage::manual`] keeps its [`ManualAck`]); under the other policies [`Message::ack`] does
    /// nothing, as in the consumer.
    pub async fn run<T, H: Handler<T>>(&self, handler: &H, message: Message<T>) -> Outcome {
        let (message, acked) = self.hand_over(message);
        let deliveries = message.delivery_count;
        let span = tracing::info_span!(target: attempt::SPAN_TARGET, "message", entry_id = %message.id, key = %message.key, shard = message.shard, delivery_count = deliveries);
        let call = attempt::called(&span, || handler.handle(message));
        self.outcome(span, call, deliveries, &[acked]).await
    }

    /// One attempt of a batch handler on `messages` (one read of a shard), and what the consumer does
    /// with all of them: a batch is all or nothing.
    pub async fn run_batch<T, H: BatchHandler<T>>(
        &self,
        handler: &H,
        messages: Vec<Message<T>>,
    ) -> Outcome {
        let (messages, acked): (Vec<_>, Vec<_>) =
            messages.into_iter().map(|m| self.hand_over(m)).unzip();
        let deliveries = messages.iter().map(|m| m.delivery_count).max().unwrap_or(1);
        let span = tracing::info_span!(
            target: attempt::SPAN_TARGET,
            "batch",
            entries = messages.len(),
            delivery_count = deliveries
        );
        let call = attempt::called(&span, || handler.handle(messages));
        self.outcome(span, call, deliveries, &acked).await
    }

    /// The message as the consumer hands it over under this ack policy, with its ack flag.
    fn hand_over<T>(&self, mut message: Message<T>) -> (Message<T>, Arc<AtomicBool>) {
        if self.ack != AckPolicy::Manual {
            message.acker = None;
            return (message, Arc::new(AtomicBool::new(false)));
        }
        let acker = message
            .acker
            .take()
            .unwrap_or_else(|| ManualAck::new(message.token.member_epoch).acker());
        let acked = acker.acked.clone();
        message.acker = Some(acker);
        (message, acked)
    }

    async fn outcome(
        &self,
        span: tracing::Span,
        call: Result<BoxFuture<'static, Result<(), crate::HandlerError>>, attempt::Failure>,
        deliveries: u32,
        acked: &[Arc<AtomicBool>],
    ) -> Outcome {
        let result = match call {
            Ok(future) => attempt::run(span, future, self.handler_timeout).await.0,
            Err(panicked) => Err(panicked),
        };
        let manual = self.ack == AckPolicy::Manual;
        let all_acked = manual && acked.iter().all(|a| a.load(Ordering::Acquire));
        let facts = Facts {
            deliveries,
            retry: deliveries.saturating_sub(1),
            manual,
            acked: all_acked,
            stopped: false,
            random: crate::util::random_u64(),
        };
        match attempt::fate(&result, facts, &self.failure) {
            Fate::Ack => Outcome::Acked,
            Fate::Done if all_acked => Outcome::Acked,
            Fate::Done | Fate::LeavePending | Fate::Stopped => Outcome::LeftPending,
            Fate::Retry { after } => Outcome::Retry { after },
            Fate::DeadLetter(letter) => Outcome::DeadLettered {
                reason: letter.reason,
                permanent: letter.permanent,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumer::{AckError, OnExhausted};
    use crate::HandlerError;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    async fn ok(_: Message<u64>) -> Result<(), HandlerError> {
        Ok(())
    }

    async fn fails(_: Message<u64>) -> Result<(), std::io::Error> {
        Err(std::io::Error::other("down"))
    }

    async fn permanent(_: Message<u64>) -> Result<(), HandlerError> {
        Err(HandlerError::permanent("bad data"))
    }

    async fn panics(_: Message<u64>) -> Result<(), String> {
        panic!("boom")
    }

    async fn acks_then_fails(msg: Message<u64>) -> Result<(), HandlerError> {
        msg.ack().await?;
        Err(HandlerError::msg("after the ack"))
    }

    async fn acks(msg: Message<u64>) -> Result<(), AckError> {
        msg.ack().await
    }

    fn exact(max_deliveries: u32) -> FailurePolicy {
        FailurePolicy::default()
            .max_deliveries(max_deliveries)
            .initial_backoff(ms(100))
            .jitter(false)
    }

    #[test]
    fn a_test_message_carries_what_it_was_built_with() {
        let msg = TestMessage::new(5u64)
            .id("7-1")
            .key("k")
            .shard(3)
            .delivery_count(0)
            .token("m-1", 9)
            .build();
        assert_eq!(
            (
                msg.id.as_str(),
                msg.key.as_str(),
                msg.shard,
                msg.delivery_count
            ),
            ("7-1", "k", 3, 1)
        );
        assert_eq!(
            (msg.token.member_id.as_ref(), msg.token.member_epoch),
            ("m-1", 9)
        );
        assert!(msg.acker.is_none());
        let fields = TestMessage::fields([("a", "1")]).build();
        assert_eq!(fields.payload.str("a").unwrap(), "1");
    }

    #[tokio::test]
    async fn success_is_acked_and_failures_retry_with_the_policys_backoff() {
        let test = HandlerTest::new().failure(exact(3));
        assert_eq!(
            test.run(&ok, TestMessage::new(1).build()).await,
            Outcome::Acked
        );
        assert_eq!(
            test.run(&fails, TestMessage::new(1).build()).await,
            Outcome::Retry { after: ms(100) }
        );
        let second = TestMessage::new(1).delivery_count(2).build();
        assert_eq!(
            test.run(&fails, second).await,
            Outcome::Retry { after: ms(200) }
        );
        let last = TestMessage::new(1).delivery_count(3).build();
        assert_eq!(
            test.run(&fails, last).await,
            Outcome::DeadLettered {
                reason: "down".into(),
                permanent: false
            }
        );
    }

    #[tokio::test]
    async fn a_permanent_error_dead_letters_or_stays_pending_at_once() {
        let test = HandlerTest::new().failure(exact(5));
        let dead = Outcome::DeadLettered {
            reason: "bad data".into(),
            permanent: true,
        };
        assert_eq!(
            test.run(&permanent, TestMessage::new(1).build()).await,
            dead
        );
        let pending = test.failure(exact(5).on_exhausted(OnExhausted::LeavePending));
        assert_eq!(
            pending.run(&permanent, TestMessage::new(1).build()).await,
            Outcome::LeftPending
        );
    }

    #[tokio::test]
    async fn the_jittered_backoff_stays_between_half_and_all_of_it() {
        let test = HandlerTest::new().failure(exact(9).jitter(true));
        for _ in 0..50 {
            match test
                .run(&fails, TestMessage::new(1).delivery_count(3).build())
                .await
            {
                Outcome::Retry { after } => {
                    assert!(after >= ms(200) && after <= ms(400), "{after:?}")
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn panics_and_timeouts_fail_the_attempt() {
        let test = HandlerTest::new().failure(exact(1)).handler_timeout(ms(10));
        // The reason names the panic's location: `panics` above.
        match test.run(&panics, TestMessage::new(1).build()).await {
            Outcome::DeadLettered {
                reason,
                permanent: false,
            } => assert!(
                reason.starts_with("handler panicked: boom (at ")
                    && reason.contains(&format!("{}:", file!())),
                "{reason}"
            ),
            other => panic!("{other:?}"),
        }
        let hangs = |_: Message<u64>| std::future::pending::<Result<(), String>>();
        assert_eq!(
            test.run(&hangs, TestMessage::new(1).build()).await,
            Outcome::DeadLettered {
                reason: "handler timed out after 10 ms".into(),
                permanent: false
            }
        );
    }

    #[tokio::test]
    async fn manual_acks_are_recorded_and_a_forgotten_ack_stays_pending() {
        let manual = HandlerTest::new().ack(AckPolicy::Manual).failure(exact(3));
        assert_eq!(
            manual.run(&acks, TestMessage::new(1).build()).await,
            Outcome::Acked
        );
        assert_eq!(
            manual.run(&ok, TestMessage::new(1).build()).await,
            Outcome::LeftPending
        );
        assert_eq!(
            manual
                .run(&acks_then_fails, TestMessage::new(1).build())
                .await,
            Outcome::Acked
        );
        let (msg, ack) = TestMessage::new(1).manual();
        assert_eq!(manual.run(&acks, msg).await, Outcome::Acked);
        assert!(ack.is_acked(), "the message's own ManualAck saw the ack");
        // A lost shard refuses the ack: the handler's error is retried like any other.
        let (msg, ack) = TestMessage::new(1).manual();
        ack.lose_ownership();
        assert!(matches!(
            manual.run(&acks, msg).await,
            Outcome::Retry { .. }
        ));
        // Under automatic acks, `ack` does nothing and the consumer acks after `Ok`.
        let (msg, ack) = TestMessage::new(1).manual();
        assert_eq!(HandlerTest::new().run(&acks, msg).await, Outcome::Acked);
        assert!(!ack.is_acked());
    }

    #[tokio::test]
    async fn a_batch_is_all_or_nothing_and_counts_its_most_delivered_message() {
        let test = HandlerTest::new().failure(exact(2));
        let all_ok = |_: Vec<Message<u64>>| async { Ok::<(), String>(()) };
        assert_eq!(
            test.run_batch(&all_ok, TestMessage::batch([1, 2])).await,
            Outcome::Acked
        );
        let one_bad = |batch: Vec<Message<u64>>| async move {
            if batch.iter().any(|m| m.payload == 0) {
                return Err(HandlerError::permanent("a zero in the batch"));
            }
            Ok(())
        };
        assert_eq!(
            test.run_batch(&one_bad, TestMessage::batch([1, 0])).await,
            Outcome::DeadLettered {
                reason: "a zero in the batch".into(),
                permanent: true
            }
        );
        let failing = |_: Vec<Message<u64>>| async { Err::<(), _>("down") };
        assert_eq!(
            test.run_batch(&failing, TestMessage::batch([1, 2])).await,
            Outcome::Retry { after: ms(100) }
        );
        let mut batch = TestMessage::batch([1, 2]);
        batch[1].delivery_count = 2;
        assert_eq!(
            test.run_batch(&failing, batch).await,
            Outcome::DeadLettered {
                reason: "down".into(),
                permanent: false
            }
        );
    }

    #[test]
    fn the_policies_come_from_the_builder() {
        let policy = exact(4).on_exhausted(OnExhausted::LeavePending);
        let builder = ConsumerBuilder::new("orders", "billing")
            .failure(policy)
            .ack(AckPolicy::Manual)
            .handler_timeout(ms(250))
            .handler(ok);
        assert_eq!(
            HandlerTest::of_builder(&builder),
            HandlerTest::new()
                .failure(policy)
                .ack(AckPolicy::Manual)
                .handler_timeout(ms(250))
        );
    }

    /// What a handler logs, formatted by `tracing-subscriber` (no colours) under `filter`.
    async fn handler_logs(filter: &str) -> (Outcome, String) {
        async fn logs(msg: Message<u64>) -> Result<(), HandlerError> {
            tracing::info!(payload = msg.payload, "handling");
            Ok(())
        }
        let buffer = crate::util::LogBuffer::default();
        let writer = buffer.clone();
        let _guard = tracing::subscriber::set_default(
            tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_ansi(false)
                .with_writer(move || writer.clone())
                .finish(),
        );
        let message = TestMessage::new(5u64).id("7-1").key("k").shard(3).build();
        let outcome = HandlerTest::new().run(&logs, message).await;
        (outcome, buffer.text())
    }

    /// The documented way to drop the per-message span (and its cost): the handler still runs and logs,
    /// only without the span; every other line stays.
    #[tokio::test]
    async fn the_message_span_has_a_target_of_its_own_to_turn_it_off() {
        let (outcome, on) = handler_logs("info").await;
        assert_eq!(outcome, Outcome::Acked);
        assert!(
            on.contains("message{entry_id=7-1 key=k shard=3 delivery_count=1}:")
                && on.contains("handling payload=5"),
            "{on}"
        );
        let (outcome, off) = handler_logs("info,stream_listener::message=off").await;
        assert_eq!(outcome, Outcome::Acked);
        assert!(
            off.contains("handling payload=5") && !off.contains("message{"),
            "{off}"
        );
    }
}
