//! [`ConsumerBuilder`]: one explicitly registered member, built into a [`ListenerSpec`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::consumer::{
    AckPolicy, BatchHandler, BoxedHandler, FailurePolicy, Fields, Handler, Message, Retention,
};
use crate::topology::StartFrom;

use super::spec::{ListenerSpec, Origin};
use super::state::{HandlerSource, State};

/// One explicitly registered member (the spec's `CoordinatorConsumerProperties.consumer(...)`).
///
/// ```no_run
/// # use stream_listener::{ConsumerBuilder, Message};
/// # #[derive(serde::Deserialize)] struct Order;
/// let billing = ConsumerBuilder::new("orders", "billing")
///     .runtime_max_concurrency(4) // four local workers for this one member, any number of shards
///     .handler(|msg: Message<Order>| async move { Ok::<(), std::convert::Infallible>(()) });
/// ```
///
/// Its member id is `{base}-{group}` unless [`member_id`](Self::member_id) sets it, where `{base}` is the
/// runtime's base member id ([`Runtime::base_member_id`](super::Runtime::base_member_id), else resolved
/// from the pod IP, a local address or the host name). Settings are checked when the runtime starts
/// ([`ListenerSpec::validate`]), after the environment's overrides.
#[derive(Debug, Clone)]
pub struct ConsumerBuilder {
    spec: ListenerSpec,
}

impl ConsumerBuilder {
    /// A member of `group` reading `stream`.
    pub fn new(stream: impl Into<String>, group: impl Into<String>) -> Self {
        let (stream, group) = (stream.into(), group.into());
        let origin = Origin::Builder {
            index: 0,
            stream: stream.clone(),
            group: group.clone(),
        };
        let name = format!("{stream}_{group}");
        Self {
            spec: ListenerSpec::new(origin, name, stream, group),
        }
    }

    /// The name of its environment overrides (`STREAM_LISTENER_<NAME>_<SETTING>`, see
    /// [`ListenerSpec::apply_env`]) and of [`Runtime::hooks`](super::Runtime::hooks); default
    /// `{stream}_{group}`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.spec.name = name.into();
        self
    }

    /// The member id (default `{base}-{group}`, see the type's docs).
    pub fn member_id(mut self, id: impl Into<String>) -> Self {
        self.spec.member_id = Some(id.into());
        self
    }

    /// Local worker capacity of this one member: how many handlers run at once (default 1, at least 1;
    /// up to four shards per worker are read meanwhile). Never creates members, never limits owned shards.
    pub fn runtime_max_concurrency(mut self, workers: usize) -> Self {
        self.spec.runtime_max_concurrency = workers;
        self
    }

    /// Static balancing weight (default 1, at least 1).
    pub fn weight(mut self, weight: u32) -> Self {
        self.spec.weight = weight;
        self
    }

    /// Entries per read (default 100).
    pub fn batch_size(mut self, n: usize) -> Self {
        self.spec.batch_size = n;
        self
    }

    /// Blocking read timeout.
    pub fn block_ms(mut self, ms: u64) -> Self {
        self.spec.block_ms = ms;
        self
    }

    /// Acknowledgement policy.
    pub fn ack(mut self, ack: AckPolicy) -> Self {
        self.spec.ack = ack;
        self
    }

    /// Retry and dead-letter policy.
    pub fn failure(mut self, failure: FailurePolicy) -> Self {
        self.spec.failure = failure;
        self
    }

    /// Dead-letter stream (default `{stream}:dlq`).
    pub fn dead_letter(mut self, stream: impl Into<String>) -> Self {
        self.spec.dead_letter = Some(stream.into());
        self
    }

    /// How long one handler attempt may run (default: no limit). An attempt past it is cancelled and
    /// counts as a failed delivery: retried, then dead-lettered per the failure policy.
    pub fn handler_timeout(mut self, timeout: Duration) -> Self {
        self.spec.handler_timeout = Some(timeout);
        self
    }

    /// Where the group starts reading if this member creates it (default [`StartFrom::Earliest`]); an
    /// existing group keeps its position.
    pub fn start_from(mut self, start: StartFrom) -> Self {
        self.spec.start_from = start;
        self
    }

    /// How much of what every group acknowledged the shard streams keep (default
    /// [`Retention::default`]: nothing, trimmed every 5 s): the member trims the rest of the shards it
    /// owns.
    pub fn retention(mut self, retention: Retention) -> Self {
        self.spec.retention = Some(retention);
        self
    }

    /// Never trim the shard streams (something else trims them, or they are kept whole).
    pub fn without_retention(mut self) -> Self {
        self.spec.retention = None;
        self
    }

    /// Shards of the stream if this member creates it (default: the runtime's default shard count).
    pub fn shard_count(mut self, n: u32) -> Self {
        self.spec.shard_count = Some(n);
        self
    }

    /// Registers `value` for this member's [`State<T>`] handler arguments (over the runtime's value of
    /// the same type).
    pub fn state<T: Clone + Send + Sync + 'static>(mut self, value: T) -> Self {
        self.spec.states.insert(value);
        self
    }

    /// A handler of JSON payloads: a closure or any [`Handler`].
    pub fn handler<T, H>(mut self, handler: H) -> Self
    where
        T: DeserializeOwned + Send + 'static,
        H: Handler<T>,
    {
        self.spec.handler = Some(HandlerSource::Ready(BoxedHandler::json(handler)));
        self
    }

    /// A handler of JSON payloads that also takes a [`State<S>`] (registered with [`state`](Self::state)
    /// or [`Runtime::state`](super::Runtime::state); the runtime refuses to start without one).
    pub fn handler_with_state<T, S, F, Fut, E>(mut self, handler: F) -> Self
    where
        T: DeserializeOwned + Send + 'static,
        S: Clone + Send + Sync + 'static,
        F: Fn(Message<T>, State<S>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: std::fmt::Display + Send + 'static,
    {
        let handler = Arc::new(handler);
        self.spec.handler = Some(HandlerSource::Bind(Arc::new(move |states| {
            let state = states.get::<S>()?;
            let handler = handler.clone();
            Ok(BoxedHandler::json(move |message: Message<T>| {
                handler(message, state.clone())
            }))
        })));
        self
    }

    /// A batch handler of JSON payloads: each read of a shard, up to [`batch_size`](Self::batch_size)
    /// entries, in one call; all or nothing (see [`BoxedHandler::json_batch`]).
    pub fn batch_handler<T, H>(mut self, handler: H) -> Self
    where
        T: DeserializeOwned + Send + 'static,
        H: BatchHandler<T>,
    {
        self.spec.handler = Some(HandlerSource::Ready(BoxedHandler::json_batch(handler)));
        self
    }

    /// Called with the shards this member has just started owning. Hooks are async closures, run one at a
    /// time in the order of the events, on a task of their own; a panic is caught and logged (see
    /// [`LifecycleHooks`](crate::consumer::LifecycleHooks)).
    pub fn on_shards_assigned<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn(Vec<u32>) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        self.spec.hooks = self.spec.hooks.on_shards_assigned(hook);
        self
    }

    /// Called with revoked shards after their running handlers finished and their entries were
    /// acknowledged, before REVOKED is reported: the next owner starts only after it returned.
    pub fn on_shards_revoked<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn(Vec<u32>) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        self.spec.hooks = self.spec.hooks.on_shards_revoked(hook);
        self
    }

    /// Called with the shards lost when this member was fenced (or its lease ran out): their handlers
    /// were aborted and nothing more of them is acknowledged.
    pub fn on_fenced<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn(Vec<u32>) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        self.spec.hooks = self.spec.hooks.on_fenced(hook);
        self
    }

    /// A handler of raw payload bytes.
    pub fn raw_handler<H: Handler<Vec<u8>>>(mut self, handler: H) -> Self {
        self.spec.handler = Some(HandlerSource::Ready(BoxedHandler::raw(handler)));
        self
    }

    /// A handler of the entry's field map, for entries written by other clients (see [`Fields`]).
    pub fn fields_handler<H: Handler<Fields>>(mut self, handler: H) -> Self {
        self.spec.handler = Some(HandlerSource::Ready(BoxedHandler::fields(handler)));
        self
    }

    /// The listener it describes so far (the test kit reads its policies).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn spec(&self) -> &ListenerSpec {
        &self.spec
    }

    /// The spec of the `index`-th builder of a runtime (from 1).
    pub(crate) fn into_spec(mut self, index: usize) -> ListenerSpec {
        if let Origin::Builder { index: i, .. } = &mut self.spec.origin {
            *i = index;
        }
        self.spec
    }
}
