//! What a handler sees: [`Message`], [`HandlerError`], the [`Handler`] trait and its type-erased form.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::member::lifecycle::{FencingToken, OwnershipDeadline};

use super::fields::Fields;
use crate::headers::Headers;
use crate::names::field::PAYLOAD as PAYLOAD_FIELD;

pub use crate::util::BoxFuture;

/// One stream entry handed to a handler.
///
/// Fields are public for reading; only the consumer creates messages, because a message carries the right
/// to acknowledge its entry (see [`Message::ack`]).
pub struct Message<T> {
    /// The decoded payload (field `p` of the entry).
    pub payload: T,
    /// The stream entry id, unique within the shard; use it to make handlers idempotent.
    pub id: String,
    /// The partition key (field `k`), the unit of ordering.
    pub key: String,
    /// The shard index the entry was read from.
    pub shard: u32,
    /// How many times this entry has been delivered, this delivery included (Redis deliveries across
    /// owners plus local retries). Greater than 1 means an earlier attempt may have had side effects.
    pub delivery_count: u32,
    /// Ownership proof: sinks can refuse writes carrying a smaller member epoch than one already seen.
    pub token: FencingToken,
    pub(crate) headers: Headers,
    pub(crate) acker: Option<Acker>,
}

/// A message whose payload is left as the raw bytes of field `p`, for handlers that decode themselves.
pub type RawMessage = Message<Vec<u8>>;

impl<T> Message<T> {
    /// Acknowledge the entry now (`XACK`), under [`AckPolicy::Manual`](super::AckPolicy::Manual).
    ///
    /// Under the other policies the consumer acknowledges after the handler returns `Ok`, and this is a
    /// no-op. Refused with [`AckError::NotOwner`] once the member lost the shard (fenced or revoked), since
    /// the next owner may already be handling the entry. Acking twice is harmless.
    pub async fn ack(&self) -> Result<(), AckError> {
        let Some(acker) = &self.acker else {
            return Ok(());
        };
        if !acker.ownership.is_active() {
            return Err(AckError::NotOwner);
        }
        if acker.acked.load(Ordering::Acquire) {
            return Ok(());
        }
        acker.io.ack(&acker.stream_key, &[self.id.as_str()]).await?;
        acker.acked.store(true, Ordering::Release);
        Ok(())
    }

    /// The headers the producer set (field `sl_headers`, see [`crate::headers`]); empty for entries
    /// without them (older producers, other clients).
    pub fn headers(&self) -> &Headers {
        &self.headers
    }

    /// The payload, dropping the metadata.
    pub fn into_payload(self) -> T {
        self.payload
    }
}

impl<T: fmt::Debug> fmt::Debug for Message<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("payload", &self.payload)
            .field("id", &self.id)
            .field("key", &self.key)
            .field("shard", &self.shard)
            .field("delivery_count", &self.delivery_count)
            .field("token", &self.token)
            .field("headers", &self.headers)
            .field("manual_ack", &self.acker.is_some())
            .finish()
    }
}

/// Why [`Message::ack`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AckError {
    /// The member no longer owns the shard; the entry belongs to the next owner now.
    #[error("the shard is no longer owned by this member; not acknowledging")]
    NotOwner,
    /// Redis refused or did not answer; the entry stays pending and will be delivered again.
    #[error("XACK failed: {0}")]
    Redis(#[from] redis::RedisError),
}

/// Whether a member still owns a shard; shared with messages so their acks stop when ownership ends.
/// Ownership ends when the shard is revoked or fenced, and also, read at the moment of asking, when the
/// member's self-fencing deadline has passed.
#[derive(Debug)]
pub(crate) struct ShardOwnership {
    active: AtomicBool,
    deadline: Arc<OwnershipDeadline>,
    /// The grant's fencing token (member epoch): below the deadline's epoch floor, the ownership is over.
    epoch: i64,
}

impl ShardOwnership {
    pub(crate) fn new(deadline: Arc<OwnershipDeadline>, epoch: i64) -> Arc<Self> {
        Arc::new(Self {
            active: AtomicBool::new(true),
            deadline,
            epoch,
        })
    }

    pub(crate) fn is_active(&self) -> bool {
        // The deadline first: a deadline moved ahead by a rejoin comes with the floor raised before it.
        self.deadline.is_valid()
            && self.epoch >= self.deadline.epoch_floor()
            && self.active.load(Ordering::Acquire)
    }

    pub(crate) fn end(&self) {
        self.active.store(false, Ordering::Release);
    }
}

/// Acknowledges entries of a shard stream: the consumer's shard commands, seen from a message.
pub(crate) trait Acknowledge: Send + Sync {
    fn ack<'a>(&'a self, key: &'a str, ids: &'a [&'a str])
        -> BoxFuture<'a, redis::RedisResult<()>>;
}

/// The right to acknowledge one entry by hand.
pub(crate) struct Acker {
    pub(crate) io: Arc<dyn Acknowledge>,
    pub(crate) stream_key: Arc<str>,
    pub(crate) ownership: Arc<ShardOwnership>,
    pub(crate) acked: Arc<AtomicBool>,
}

/// A handler failure: any `Display` error, boxed, and what it asks of the retry policy ([`ErrorClass`]).
/// The text goes to logs and to the dead-letter entry.
///
/// Deliberately not `std::error::Error` itself, so that `?` converts every `std::error::Error` into it
/// (the same trick as `anyhow::Error`); such an error is [`ErrorClass::Transient`]. Say more with
/// [`permanent`](Self::permanent) and [`retry_after`](Self::retry_after):
///
/// ```
/// use std::time::Duration;
/// use stream_listener::{HandlerError, Message};
///
/// async fn on_order(msg: Message<String>) -> Result<(), HandlerError> {
///     // Bad data: retrying cannot fix it, dead-letter it now.
///     let cents: u64 = msg.payload.parse().map_err(HandlerError::permanent)?;
///     if cents > 1_000_000 {
///         // A dependency said "later": wait that long before the next delivery.
///         return Err(HandlerError::retry_after("rate limited", Duration::from_secs(2)));
///     }
///     // Any other std error: retried after the policy's backoff.
///     std::fs::metadata("/")?;
///     Ok(())
/// }
/// ```
pub struct HandlerError {
    inner: Box<dyn fmt::Display + Send + 'static>,
    class: ErrorClass,
}

/// What a failed attempt asks of the listener's [`FailurePolicy`](super::FailurePolicy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorClass {
    /// Retry after the policy's backoff until `max_deliveries`, then `on_exhausted`: every error `?`
    /// converts, a timeout, a panic.
    Transient,
    /// Retrying cannot help (bad data, a 4xx from a dependency): skip the remaining deliveries and go to
    /// `on_exhausted` now; the dead letter records that it was permanent.
    Permanent,
    /// Retry after this wait instead of the backoff (without jitter), at most the policy's
    /// `max_backoff`; still one delivery of `max_deliveries`.
    RetryAfter(Duration),
}

impl HandlerError {
    /// Wrap any displayable error, [`ErrorClass::Transient`]. A `HandlerError` is kept as it is, class
    /// included (so a handler's `Result<(), HandlerError>` keeps what it asked for).
    pub fn new<E: fmt::Display + Send + 'static>(error: E) -> Self {
        let mut slot = Some(error);
        if let Some(same) = (&mut slot as &mut dyn Any).downcast_mut::<Option<HandlerError>>() {
            if let Some(same) = same.take() {
                return same;
            }
        }
        Self {
            inner: Box::new(slot.expect("taken only if it was a HandlerError")),
            class: ErrorClass::Transient,
        }
    }

    /// A plain message, [`ErrorClass::Transient`].
    pub fn msg(message: impl Into<String>) -> Self {
        Self::new(message.into())
    }

    /// A permanent failure ([`ErrorClass::Permanent`]): dead-lettered (or left pending, per the policy's
    /// `on_exhausted`) at once, without the remaining deliveries.
    pub fn permanent<E: fmt::Display + Send + 'static>(error: E) -> Self {
        Self::new(error).with_class(ErrorClass::Permanent)
    }

    /// A failure to retry after `wait` ([`ErrorClass::RetryAfter`]) instead of the policy's backoff, at
    /// most its `max_backoff` (so one handler cannot hold its shard's later entries back longer than the
    /// listener allows; raise `max_backoff` to honour longer waits). The retry still counts against
    /// `max_deliveries`.
    pub fn retry_after<E: fmt::Display + Send + 'static>(error: E, wait: Duration) -> Self {
        Self::new(error).with_class(ErrorClass::RetryAfter(wait))
    }

    /// The same error with another class.
    pub fn with_class(mut self, class: ErrorClass) -> Self {
        self.class = class;
        self
    }

    /// What it asks of the retry policy.
    pub fn class(&self) -> ErrorClass {
        self.class
    }
}

impl<E: std::error::Error + Send + 'static> From<E> for HandlerError {
    fn from(error: E) -> Self {
        Self::new(DisplayChain(error))
    }
}

/// Displays an error with its `source()` chain, so dead letters carry the root cause.
struct DisplayChain<E>(E);

impl<E: std::error::Error> fmt::Display for DisplayChain<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.class {
            ErrorClass::Transient => write!(f, "HandlerError({})", self.inner),
            class => write!(f, "HandlerError({class:?}: {})", self.inner),
        }
    }
}

/// A message handler. Implemented for every `Fn(Message<T>) -> impl Future<Output = Result<(), E>>` with
/// `E: Display`, so closures and `async fn`s work as they are; object-safe so the builder and the macro
/// can store handlers of different types.
pub trait Handler<T>: Send + Sync + 'static {
    /// Handle one message. `Ok` means the entry may be acknowledged; `Err` or a panic is a failure.
    fn handle(&self, message: Message<T>) -> BoxFuture<'static, Result<(), HandlerError>>;
}

impl<T, F, Fut, E> Handler<T> for F
where
    T: Send + 'static,
    F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: fmt::Display + Send + 'static,
{
    fn handle(&self, message: Message<T>) -> BoxFuture<'static, Result<(), HandlerError>> {
        let future = self(message);
        Box::pin(async move { future.await.map_err(HandlerError::new) })
    }
}

/// A batch handler: gets the entries of one read of one shard together (see
/// [`BoxedHandler::json_batch`]). Implemented for every `Fn(Vec<Message<T>>) -> impl Future<Output =
/// Result<(), E>>` with `E: Display`.
pub trait BatchHandler<T>: Send + Sync + 'static {
    /// Handle the messages. `Ok` acknowledges all of them; `Err` or a panic fails all of them.
    fn handle(&self, messages: Vec<Message<T>>) -> BoxFuture<'static, Result<(), HandlerError>>;
}

impl<T, F, Fut, E> BatchHandler<T> for F
where
    T: Send + 'static,
    F: Fn(Vec<Message<T>>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: fmt::Display + Send + 'static,
{
    fn handle(&self, messages: Vec<Message<T>>) -> BoxFuture<'static, Result<(), HandlerError>> {
        let future = self(messages);
        Box::pin(async move { future.await.map_err(HandlerError::new) })
    }
}

/// A batch handler's call: the decode error of each delivery (`None`: decoded and handed over), and the
/// handler's future if any delivery decoded.
pub(crate) type BatchCall = (
    Vec<Option<String>>,
    Option<BoxFuture<'static, Result<(), HandlerError>>>,
);

/// Everything about one delivery except the decoded payload.
pub(crate) struct Delivery<'a> {
    /// The entry's fields as read, in order; the decoder picks what it needs.
    pub(crate) fields: &'a [(Vec<u8>, Vec<u8>)],
    pub(crate) id: &'a str,
    pub(crate) key: &'a str,
    pub(crate) shard: u32,
    pub(crate) delivery_count: u32,
    pub(crate) token: &'a FencingToken,
    /// The entry's headers, or why its `sl_headers` field does not decode.
    pub(crate) headers: Result<Headers, String>,
    pub(crate) acker: Option<Acker>,
}

/// A handler together with how to decode its payload: what a [`Consumer`](super::Consumer) runs.
///
/// Build one with [`BoxedHandler::json`] (the producer's default encoding), [`BoxedHandler::raw`] or
/// [`BoxedHandler::with_decoder`]. Cheap to clone.
#[derive(Clone)]
pub struct BoxedHandler {
    inner: Arc<dyn ErasedHandler>,
}

impl fmt::Debug for BoxedHandler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BoxedHandler")
    }
}

impl BoxedHandler {
    /// A handler of JSON payloads (what the producer writes by default).
    pub fn json<T, H>(handler: H) -> Self
    where
        T: DeserializeOwned + Send + 'static,
        H: Handler<T>,
    {
        Self::with_decoder(|bytes: &[u8]| serde_json::from_slice::<T>(bytes), handler)
    }

    /// A handler of raw payload bytes.
    pub fn raw<H: Handler<Vec<u8>>>(handler: H) -> Self {
        Self::with_decoder(
            |bytes: &[u8]| Ok::<_, std::convert::Infallible>(bytes.to_vec()),
            handler,
        )
    }

    /// A handler with its own payload decoder. A decode error dead-letters the entry at once: retrying
    /// cannot fix a payload.
    pub fn with_decoder<T, E, D, H>(decode: D, handler: H) -> Self
    where
        T: Send + 'static,
        E: fmt::Display,
        D: Fn(&[u8]) -> Result<T, E> + Send + Sync + 'static,
        H: Handler<T>,
    {
        Self::decoded(
            move |fields: &[(Vec<u8>, Vec<u8>)]| {
                let payload = fields
                    .iter()
                    .find(|(name, _)| name.as_slice() == PAYLOAD_FIELD.as_bytes())
                    .map(|(_, value)| value.as_slice())
                    .ok_or_else(|| "the entry has no `p` field".to_owned())?;
                decode(payload).map_err(|e| e.to_string())
            },
            handler,
            true,
        )
    }

    /// A handler of the entry's whole field map ([`Fields`]): entries written by other clients (the
    /// spec's JVM and Python producers, `XADD` by hand, [`Producer::send_fields`](crate::Producer::send_fields))
    /// with arbitrary fields and no `p`. Never an undecodable entry.
    pub fn fields<H: Handler<Fields>>(handler: H) -> Self {
        Self::decoded(
            |fields: &[(Vec<u8>, Vec<u8>)]| Ok(Fields::from_entry(fields)),
            handler,
            false,
        )
    }

    /// A handler whose decoder sees every field of the entry. `strict_headers`: a malformed `sl_headers`
    /// field makes the entry undecodable (else it is left to the decoder, with no headers).
    fn decoded<T, D, H>(decode: D, handler: H, strict_headers: bool) -> Self
    where
        T: Send + 'static,
        D: Fn(&[(Vec<u8>, Vec<u8>)]) -> Result<T, String> + Send + Sync + 'static,
        H: Handler<T>,
    {
        Self {
            inner: Arc::new(Typed {
                decode,
                handler,
                strict_headers,
                _payload: std::marker::PhantomData,
            }),
        }
    }

    pub(crate) fn call(
        &self,
        delivery: Delivery<'_>,
    ) -> Result<BoxFuture<'static, Result<(), HandlerError>>, String> {
        self.inner.call(delivery)
    }

    /// A batch handler of JSON payloads: each read of a shard (up to `batch_size` entries) in one call.
    ///
    /// All or nothing: `Ok` acknowledges every message of the batch; an error, a panic or a timeout fails
    /// all of them, and the batch is retried (the same entries, per the failure policy's backoff), then
    /// every entry of it is dead-lettered (or left pending). An entry that does not decode is
    /// dead-lettered alone; the others are handled.
    pub fn json_batch<T, H>(handler: H) -> Self
    where
        T: DeserializeOwned + Send + 'static,
        H: BatchHandler<T>,
    {
        Self {
            inner: Arc::new(Batched {
                decode: |fields: &[(Vec<u8>, Vec<u8>)]| {
                    let payload = fields
                        .iter()
                        .find(|(name, _)| name.as_slice() == PAYLOAD_FIELD.as_bytes())
                        .map(|(_, value)| value.as_slice())
                        .ok_or_else(|| "the entry has no `p` field".to_owned())?;
                    serde_json::from_slice::<T>(payload).map_err(|e| e.to_string())
                },
                handler,
                _payload: std::marker::PhantomData,
            }),
        }
    }

    /// Whether this is a batch handler ([`json_batch`](Self::json_batch)).
    pub(crate) fn is_batch(&self) -> bool {
        self.inner.is_batch()
    }

    /// Calls a batch handler with `deliveries`.
    pub(crate) fn call_batch(&self, deliveries: Vec<Delivery<'_>>) -> BatchCall {
        self.inner.call_batch(deliveries)
    }
}

trait ErasedHandler: Send + Sync + 'static {
    fn call(
        &self,
        delivery: Delivery<'_>,
    ) -> Result<BoxFuture<'static, Result<(), HandlerError>>, String>;

    fn is_batch(&self) -> bool {
        false
    }

    /// Only batch handlers are called with batches (the job asks [`is_batch`](Self::is_batch)); others
    /// take the deliveries one by one, in one future.
    fn call_batch(&self, deliveries: Vec<Delivery<'_>>) -> BatchCall {
        let mut errors = Vec::with_capacity(deliveries.len());
        let mut futures = Vec::new();
        for delivery in deliveries {
            match self.call(delivery) {
                Ok(future) => {
                    errors.push(None);
                    futures.push(future);
                }
                Err(error) => errors.push(Some(error)),
            }
        }
        let future: Option<BoxFuture<'static, Result<(), HandlerError>>> = (!futures.is_empty())
            .then(|| {
                Box::pin(async move {
                    for future in futures {
                        future.await?;
                    }
                    Ok(())
                }) as BoxFuture<'static, Result<(), HandlerError>>
            });
        (errors, future)
    }
}

/// The delivery's headers: a malformed field is the entry's decode error when `strict` (a payload
/// handler), else no headers (a [`Fields`] handler, which keeps the field).
fn headers_of(delivery: &mut Delivery<'_>, strict: bool) -> Result<Headers, String> {
    match std::mem::replace(&mut delivery.headers, Ok(Headers::new())) {
        Ok(headers) => Ok(headers),
        Err(error) if strict => Err(error),
        Err(_) => Ok(Headers::new()),
    }
}

fn message<T>(payload: T, headers: Headers, delivery: Delivery<'_>) -> Message<T> {
    Message {
        headers,
        payload,
        id: delivery.id.to_owned(),
        key: delivery.key.to_owned(),
        shard: delivery.shard,
        delivery_count: delivery.delivery_count,
        token: delivery.token.clone(),
        acker: delivery.acker,
    }
}

struct Batched<T, D, H> {
    decode: D,
    handler: H,
    _payload: std::marker::PhantomData<fn() -> T>,
}

impl<T, D, H> ErasedHandler for Batched<T, D, H>
where
    T: Send + 'static,
    D: Fn(&[(Vec<u8>, Vec<u8>)]) -> Result<T, String> + Send + Sync + 'static,
    H: BatchHandler<T>,
{
    fn call(
        &self,
        mut delivery: Delivery<'_>,
    ) -> Result<BoxFuture<'static, Result<(), HandlerError>>, String> {
        let headers = headers_of(&mut delivery, true)?;
        let payload = (self.decode)(delivery.fields)?;
        Ok(self
            .handler
            .handle(vec![message(payload, headers, delivery)]))
    }

    fn is_batch(&self) -> bool {
        true
    }

    fn call_batch(&self, deliveries: Vec<Delivery<'_>>) -> BatchCall {
        let mut errors = Vec::with_capacity(deliveries.len());
        let mut messages = Vec::with_capacity(deliveries.len());
        for mut delivery in deliveries {
            let decoded = headers_of(&mut delivery, true)
                .and_then(|headers| Ok(((self.decode)(delivery.fields)?, headers)));
            match decoded {
                Ok((payload, headers)) => {
                    errors.push(None);
                    messages.push(message(payload, headers, delivery));
                }
                Err(error) => errors.push(Some(error)),
            }
        }
        let future = (!messages.is_empty()).then(|| self.handler.handle(messages));
        (errors, future)
    }
}

struct Typed<T, D, H> {
    decode: D,
    handler: H,
    strict_headers: bool,
    _payload: std::marker::PhantomData<fn() -> T>,
}

impl<T, D, H> ErasedHandler for Typed<T, D, H>
where
    T: Send + 'static,
    D: Fn(&[(Vec<u8>, Vec<u8>)]) -> Result<T, String> + Send + Sync + 'static,
    H: Handler<T>,
{
    fn call(
        &self,
        mut delivery: Delivery<'_>,
    ) -> Result<BoxFuture<'static, Result<(), HandlerError>>, String> {
        let headers = headers_of(&mut delivery, self.strict_headers)?;
        let payload = (self.decode)(delivery.fields)?;
        Ok(self.handler.handle(message(payload, headers, delivery)))
    }
}

#[cfg(test)]
mod ownership_tests {
    use super::*;

    #[test]
    fn an_ownership_from_before_a_fence_stays_over_after_the_rejoin() {
        let deadline = OwnershipDeadline::new();
        deadline.set(deadline.local_now().plus_ms(10_000));
        let old = ShardOwnership::new(deadline.clone(), 7);
        assert!(old.is_active());
        // The membership was lost at epoch 9, then the member rejoined before the consumer handled the
        // fence, or an assignment of the lost session that was queued before it.
        deadline.withdraw(10);
        assert!(!old.is_active());
        deadline.set(deadline.local_now().plus_ms(10_000));
        assert!(!old.is_active(), "the rejoin revived the old ownership");
        assert!(!ShardOwnership::new(deadline.clone(), 9).is_active());
        assert!(ShardOwnership::new(deadline.clone(), 12).is_active());
    }

    #[test]
    fn a_lease_that_lapsed_and_came_back_keeps_its_ownership() {
        // A heartbeat answered late: the deadline passed and moved ahead again, without a fence.
        let deadline = OwnershipDeadline::new();
        deadline.set(deadline.local_now().plus_ms(10_000));
        let ownership = ShardOwnership::new(deadline.clone(), 7);
        deadline.set(deadline.local_now().plus_ms(-1));
        assert!(!ownership.is_active());
        deadline.set(deadline.local_now().plus_ms(10_000));
        assert!(ownership.is_active());
    }
}

#[cfg(test)]
mod error_tests {
    use super::*;

    #[test]
    fn question_mark_converts_std_errors_as_transient_with_their_cause_chain() {
        fn parse() -> Result<u32, HandlerError> {
            Ok("x".parse::<u32>()?)
        }
        let error = parse().unwrap_err();
        assert_eq!(error.class(), ErrorClass::Transient);
        assert_eq!(error.to_string(), "invalid digit found in string");
    }

    #[test]
    fn permanent_and_retry_after_carry_their_class() {
        let permanent = HandlerError::permanent("bad data");
        assert_eq!(permanent.class(), ErrorClass::Permanent);
        assert_eq!(permanent.to_string(), "bad data");
        assert_eq!(
            format!("{permanent:?}"),
            "HandlerError(Permanent: bad data)"
        );
        let later = HandlerError::retry_after("429", Duration::from_secs(2));
        assert_eq!(
            later.class(),
            ErrorClass::RetryAfter(Duration::from_secs(2))
        );
        assert_eq!(format!("{:?}", HandlerError::msg("x")), "HandlerError(x)");
    }

    #[test]
    fn wrapping_a_handler_error_keeps_it_and_its_class() {
        let wrapped = HandlerError::new(HandlerError::permanent("bad data"));
        assert_eq!(wrapped.class(), ErrorClass::Permanent);
        assert_eq!(wrapped.to_string(), "bad data");
        // A `?`-converted error made permanent keeps its text.
        let error = HandlerError::permanent(HandlerError::from(std::io::Error::other("gone")));
        assert_eq!(
            (error.class(), error.to_string()),
            (ErrorClass::Permanent, "gone".to_owned())
        );
    }

    #[tokio::test]
    async fn a_handler_returning_a_classified_error_keeps_its_class() {
        let handler = |_m: Message<()>| async {
            Err::<(), _>(HandlerError::retry_after("later", Duration::from_millis(7)))
        };
        let message = Message {
            payload: (),
            id: "1-0".into(),
            key: "k".into(),
            shard: 0,
            delivery_count: 1,
            token: FencingToken {
                member_id: "m".into(),
                member_epoch: 1,
            },
            headers: Headers::new(),
            acker: None,
        };
        let error = Handler::handle(&handler, message).await.unwrap_err();
        assert_eq!(
            error.class(),
            ErrorClass::RetryAfter(Duration::from_millis(7))
        );
    }
}
