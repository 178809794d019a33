//! Kafka-style consumer groups for sharded Redis Streams: balanced, fenced, at-least-once, per-key
//! ordered, with no server to run beyond Redis.
//!
//! # Quickstart
//!
//! ```no_run
//! use serde::Deserialize;
//! use stream_listener::{stream_listener, Message};
//!
//! #[derive(Deserialize)]
//! struct Order {
//!     id: u64,
//! }
//!
//! // Four logical members in this process, each with its own heartbeat, member epoch and shards.
//! #[stream_listener(stream = "orders", group = "billing", concurrency = 4)]
//! async fn on_order(msg: Message<Order>) -> Result<(), std::io::Error> {
//!     println!("order {} (key {}, shard {}, token {:?})", msg.payload.id, msg.key, msg.shard, msg.token);
//!     Ok(())
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), stream_listener::RuntimeError> {
//!     // Every #[stream_listener] of the binary, Redis from REDIS_URL, until SIGTERM or ctrl-c.
//!     stream_listener::Runtime::from_env().run().await
//! }
//! ```
//!
//! Producers route by key with [`Producer`] ([`Producer::connect`]); one explicitly registered member with
//! local workers is a [`ConsumerBuilder`]. Both ways of declaring a listener build one [`ListenerSpec`],
//! whose settings the environment can override (`STREAM_LISTENER_<LISTENER>_<SETTING>`). Handlers take
//! `Message<T>` (JSON), [`RawMessage`], `Message<`[`Fields`]`>` (entries other clients wrote) or
//! `Vec<Message<T>>` (a batch), and optionally a [`State<T>`] registered with [`Runtime::state`].
//!
//! # Stability
//!
//! Semantic versioning covers the user's surface: the items re-exported at the crate root, the
//! [`stream_listener`] attribute and its arguments, the types those items take and return (such as
//! [`health::Health`] from [`RunningRuntime::health`]), and the feature entry points
//! `metrics::install_prometheus*` and `http::ProbeServer`. [`redis`] is the version this crate is built
//! with: moving to a new major version of it is a breaking change of ours. While the crate is 0.x, a
//! breaking change bumps the minor version (0.1 to 0.2).
//!
//! The layer modules below (`coordinator`, `store`, `member`, `clock`, `names`, `util`, `redact`,
//! `reply`, and the other modules' items beyond that surface) are public for the admin CLI, the
//! benchmarks, the integration tests and other tooling, and hidden from these docs. They are not part of
//! that promise and may change in any minor version. `__private` (what the attribute's expansion names) is never public API.
//!
//! # Layers
//!
//! * [`coordinator`]: the pure, deterministic group coordinator (epochs, sticky assignment,
//!   revoke-before-assign, fencing); `now` is an argument.
//! * [`store`]: the coordinator persisted in Redis under a store-revision compare-and-set.
//! * [`member`]: the member's side of the protocol and its heartbeat loop.
//! * [`consumer`], [`producer`], [`topology`], [`routing`]: reading, handling, acknowledging, writing.
//! * [`runtime`], [`stream_listener`]: the bootstrap, the builder and the attribute.
//!
//! `ARCHITECTURE.md` in the repository has the data flows and the Redis key layout.
#![warn(missing_docs)]
#![warn(unreachable_pub)]

#[doc(hidden)]
pub mod clock;
pub mod connection;
pub mod consumer;
#[doc(hidden)]
pub mod coordinator;
pub mod health;
#[cfg(feature = "http")]
pub mod http;
#[doc(hidden)]
pub mod member;
pub mod metrics;
#[doc(hidden)]
pub mod names;
mod panic;
pub mod producer;
#[doc(hidden)]
pub mod redact;
pub mod replay;
#[doc(hidden)]
pub mod reply;
pub mod routing;
pub mod runtime;
#[doc(hidden)]
pub mod store;
pub mod tls;
pub mod topology;
#[doc(hidden)]
pub mod util;

pub use connection::{Connection, RedisTarget};
pub use consumer::{
    AckPolicy, DeleteRef, FailurePolicy, FieldError, Fields, HandlerError, LifecycleHooks, Message,
    OnExhausted, RawMessage, Retention,
};
pub use coordinator::metadata::GroupConfig;
pub use member::lifecycle::FencingToken;
pub use producer::{Producer, ProducerConfig, ProducerError};
/// The `redis` crate this library is built with, so users need not match its version and features.
pub use redis;
pub use runtime::{ConsumerBuilder, ListenerSpec, RunningRuntime, Runtime, RuntimeError, State};
/// Registers an `async fn` as a consumer-group listener; [`Runtime`] starts every one the binary registers.
pub use stream_listener_macros::stream_listener;
pub use tls::TlsFiles;
pub use topology::{StartFrom, Topology};

/// Items the `#[stream_listener]` expansion names. Not public API: no stability promise.
#[doc(hidden)]
pub mod __private {
    pub use crate::consumer::{
        AckPolicy, BoxedHandler, DeleteRef, Message, OnExhausted, RawMessage,
    };
    pub use crate::runtime::registry::{registrations, ListenerRegistration, PayloadKind};
    pub use crate::runtime::{MissingState, State, States};
    pub use crate::topology::StartFrom;
    pub use core::result::Result;
    pub use inventory;

    /// Spellings of the attribute kept for compatibility; the expansion names one to make rustc warn.
    pub mod deprecated {
        /// `ack = "ack_delete"`.
        #[deprecated(
            note = "`ack = \"ack_delete\"` deletes entries that other consumer groups of the stream may not have read yet: write `ack = \"ack_delete_acked\"` to delete an entry only once every group acknowledged it, or `ack = \"ack_delete_keepref\"` to keep this behaviour"
        )]
        pub const ACK_DELETE: () = ();
    }
}
