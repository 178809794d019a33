//! stream-listener: Kafka-style consumer groups for sharded Redis Streams.

pub mod consumer;
pub mod coordinator;
pub mod member;
pub mod producer;
pub mod registry;
pub mod routing;
pub mod runtime;
pub mod store;
pub mod topology;

pub use consumer::{
    AckPolicy, DeleteRef, FailurePolicy, HandlerError, Message, OnExhausted, RawMessage,
};
pub use producer::Producer;
pub use runtime::{ConsumerBuilder, RunningRuntime, Runtime, RuntimeError};
/// Registers an `async fn` as a consumer-group listener; the runtime finds it in [`registry::registrations`].
pub use stream_listener_macros::stream_listener;

/// Items the `#[stream_listener]` expansion names. Not public API: no stability promise.
#[doc(hidden)]
pub mod __private {
    pub use crate::consumer::{
        AckPolicy, BoxedHandler, DeleteRef, Message, OnExhausted, RawMessage,
    };
    pub use crate::registry::{ListenerRegistration, PayloadKind};
    pub use inventory;
}
