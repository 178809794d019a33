//! Kafka-style consumer groups for sharded Redis Streams: balanced, fenced, at-least-once, per-key
//! ordered, with no server to run beyond Redis.
//!
//! A logical stream `orders` is `n` Redis streams, its shards `orders:0` .. `orders:{n-1}`; a producer
//! routes each message by its key, so one key's messages stay in one shard, in order. A consumer group's
//! members (processes, or several logical members in one process) each own some shards: they read them,
//! run your handler and acknowledge. The group's coordinator is a state machine every member runs
//! against the group's metadata in Redis, so members join, leave and crash while every shard has at most
//! one owner at a time. Redis 6.2 or newer (or Valkey), a single node or a cluster.
//!
//! # Consuming
//!
//! An annotated `async fn` is a listener; [`Runtime::from_env`]`().run()` starts every one the binary
//! has and runs until SIGTERM or ctrl-c, then leaves the group gracefully:
//!
//! ```no_run
//! use serde::Deserialize;
//! use stream_listener::{stream_listener, Message};
//!
//! #[derive(Debug, Deserialize)]
//! struct Order {
//!     id: u64,
//!     amount_cents: u64,
//! }
//!
//! // Four logical members in this process, each with its own heartbeat, member epoch and shards.
//! #[stream_listener(stream = "orders", group = "billing", concurrency = 4)]
//! async fn on_order(msg: Message<Order>) -> Result<(), String> {
//!     println!("order {} ({} cents), key {}, shard {}", msg.payload.id, msg.payload.amount_cents, msg.key, msg.shard);
//!     Ok(()) // acknowledges it; an Err is retried, then dead-lettered
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), stream_listener::RuntimeError> {
//!     stream_listener::Runtime::from_env().run().await
//! }
//! ```
//!
//! The attribute's arguments and every handler form (`Message<T>`, [`RawMessage`],
//! `Message<`[`Fields`]`>`, batches `Vec<Message<T>>`, and a [`State<T>`] second argument) are documented
//! on [`stream_listener`](macro@stream_listener). Without the attribute, a [`ConsumerBuilder`] declares
//! one member with closures, local workers ([`ConsumerBuilder::runtime_max_concurrency`]) and lifecycle
//! hooks ([`ConsumerBuilder::on_shards_revoked`], ...):
//!
//! ```no_run
//! # #[derive(serde::Deserialize)] struct Order { id: u64 }
//! use stream_listener::{ConsumerBuilder, Message, Runtime};
//!
//! # async fn run() -> Result<(), stream_listener::RuntimeError> {
//! let billing = ConsumerBuilder::new("orders", "billing")
//!     .runtime_max_concurrency(4)
//!     .handler(|msg: Message<Order>| async move { Ok::<(), String>(println!("{}", msg.payload.id)) });
//! Runtime::from_env().without_annotated_listeners().consumer(billing).run().await
//! # }
//! ```
//!
//! [`Runtime::start`] returns a [`RunningRuntime`] instead, to embed the runtime: health for probes
//! ([`RunningRuntime::health`], the `http` feature's `http::ProbeServer`), pause and resume,
//! [`RunningRuntime::stop`].
//!
//! # Producing
//!
//! [`Producer::connect_creating`] creates the stream with a shard count unless it exists
//! ([`Producer::connect`] only opens one), then [`Producer::send`] routes by key and returns where the
//! entry went. Entries are `k` (the key) and `p` (the payload's JSON) and, after a resize, `v`; producers
//! in other languages write the same (`docs/producers.md` in the repository: the shard count in Redis and
//! the routing hash, [`routing::shard_for_key`]). [`Topology`] creates, reads and resizes a stream.
//!
//! # Configuration
//!
//! [`Runtime::from_env`] reads `REDIS_URL` (default `redis://127.0.0.1:6379`; `rediss://` for TLS,
//! `redis+cluster://` for a cluster), `REDIS_TLS_CA_CERT` / `REDIS_TLS_CERT` / `REDIS_TLS_KEY`,
//! `STREAM_LISTENER_MEMBER_ID` (the base member id; default the pod IP, a local address, the hostname),
//! the timing of the groups it creates (`STREAM_LISTENER_HEARTBEAT_INTERVAL_MS`, default 1000;
//! `..._SESSION_TIMEOUT_MS`, 10000; `..._REBALANCE_TIMEOUT_MS`, 30000) and
//! `STREAM_LISTENER_DEFAULT_SHARD_COUNT` (16). Each listener's settings are overridden by
//! `STREAM_LISTENER_<LISTENER>_<SETTING>` ([`ListenerSpec::apply_env`]; [`Runtime::without_env_overrides`]
//! turns them off). The same settings have builder methods on [`Runtime`] and [`ConsumerBuilder`].
//!
//! # Failures
//!
//! Delivery is at least once: a handler may see an entry again after a crash, a lost acknowledgement or
//! a shard moving, so make it idempotent.
//!
//! * **Retries.** A handler's `Err`, a panic or a timeout (`handler_timeout_ms`,
//!   [`ConsumerBuilder::handler_timeout`]) fails the attempt. The entry is retried with backoff
//!   ([`FailurePolicy`]: 5 deliveries, 100 ms doubling up to 5 s, by default); the entry and the later
//!   ones of its shard wait (per-key order), and the worker serves other shards meanwhile.
//! * **Dead letters.** An exhausted entry, or one that does not decode, is copied to the dead-letter
//!   stream `<stream>:dlq` with its fields, the group, the deliveries and the error, then acknowledged
//!   ([`OnExhausted::LeavePending`] keeps it pending instead). The CLI lists, replays and purges them
//!   (`stream-listener dead-letters`).
//! * **Fencing tokens.** [`Message::token`] is the owner's [`FencingToken`]: member epochs of successive
//!   owners of a shard only grow, so a sink that remembers the highest epoch it accepted per shard can
//!   refuse a zombie's late write.
//! * **Self-fencing.** A member that cannot renew its lease in time stops reading before its lease can
//!   run out (and says so at WARN), then rejoins; its shards go to others only after that.
//! * **Start and stop.** [`Runtime::start`] waits for Redis with backoff, for as long as
//!   [`Runtime::startup_timeout`] allows (no limit by default). A stop that misses its deadline is
//!   [`RuntimeError::ShutdownTimedOut`], naming what was stuck.
//!
//! # Logging
//!
//! Through [`tracing`](https://docs.rs/tracing). When the application installed no subscriber,
//! [`Runtime::start`] installs one that prints INFO and above on stderr (`RUST_LOG` sets the filter,
//! e.g. `RUST_LOG=stream_listener=debug`); an application's own subscriber is kept, and
//! [`Runtime::without_default_logging`] turns it off. At INFO: a member starting, joining (with its
//! epoch), every assignment change (shards assigned, revoked, owned); at WARN: a dead letter, a handler
//! timeout or panic, a self-fence, Redis unreachable. Every line of a member is in a `member` span
//! (member, stream, group) and a handler's own lines in a `message` span (shard, entry id, key, epoch,
//! delivery count). Metrics go through the [`metrics`](https://docs.rs/metrics) facade ([`crate::metrics`]
//! module; the `prometheus` feature serves them).
//!
//! # Testing
//!
//! A handler is a plain `async fn`, callable from a unit test. For the whole path, run a real
//! `redis-server` (6.2 or newer: older ones lack `XAUTOCLAIM` and `ZADD GT`) on a free port and point
//! `REDIS_URL` or [`Runtime::new`] at it; the project's own tests do that with every listener running.
//! The `testing` feature's test kit, in versions that have it, builds messages without Redis and starts
//! a server for integration tests.
//!
//! # Features
//!
//! | feature | what it adds |
//! | --- | --- |
//! | `tls` (default) | `rediss://` and `rediss+cluster://` URLs, through rustls and ring |
//! | `prometheus` | a Prometheus exporter for the metrics (`metrics::install_prometheus`) |
//! | `http` | `http::ProbeServer`: `/livez`, `/readyz` and `/metrics` |
//! | `testing` | `testing`: build messages (headers too) and run handlers under a listener's policies, without Redis |
//! | `opentelemetry` | the producer puts the current span's W3C `traceparent` / `tracestate` into the [`Headers`]; a handler's `message` span continues that trace (a `batch` span links every entry's), with the messaging semantic-convention attributes; needs a `tracing-opentelemetry` layer in the application's subscriber |
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
pub mod headers;
pub mod health;
#[cfg(feature = "http")]
pub mod http;
pub mod lag;
#[doc(hidden)]
pub mod member;
pub mod metrics;
#[doc(hidden)]
pub mod names;
#[cfg(feature = "opentelemetry")]
mod otel;
mod panic;
pub mod preflight;
pub mod producer;
#[doc(hidden)]
pub mod redact;
pub mod replay;
#[doc(hidden)]
pub mod reply;
mod report;
pub mod routing;
pub mod runtime;
#[doc(hidden)]
pub mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod throttle;
pub mod tls;
pub mod topology;
#[doc(hidden)]
pub mod util;

pub use connection::{Connection, RedisTarget};
pub use consumer::{
    AckPolicy, DeleteRef, ErrorClass, FailurePolicy, FieldError, Fields, HandlerError,
    LifecycleHooks, Message, OnExhausted, RawMessage, Retention,
};
pub use coordinator::metadata::GroupConfig;
pub use headers::Headers;
pub use member::lifecycle::FencingToken;
pub use producer::{Producer, ProducerConfig, ProducerError};
/// The `redis` crate this library is built with, so users need not match its version and features.
pub use redis;
pub use runtime::{ConsumerBuilder, ListenerSpec, RunningRuntime, Runtime, RuntimeError, State};
/// Registers an `async fn` as a consumer-group listener; [`Runtime`] starts every one the binary registers.
///
/// ```no_run
/// use stream_listener::{stream_listener, Fields, Message, RawMessage, State};
///
/// #[derive(serde::Deserialize)]
/// struct Order {
///     id: u64,
/// }
///
/// #[derive(Clone)]
/// struct Ledger; // a pool or a client, registered with `Runtime::state(Ledger)`
///
/// // Every argument, with its default where it has one.
/// #[stream_listener(
///     stream = "orders",
///     group = "billing",
///     concurrency = 1,
///     id = "billing-host",
///     batch_size = 100,
///     block_ms = 450,
///     ack = "ack",
///     failure = "retry_then_dead_letter",
///     max_deliveries = 5,
///     dead_letter = "orders:dlq",
///     weight = 1,
///     handler_timeout_ms = 5000,
///     start_from = "earliest",
///     shard_count = 16
/// )]
/// async fn on_order(msg: Message<Order>, State(_ledger): State<Ledger>) -> Result<(), String> {
///     println!("order {} from shard {}, epoch {}", msg.payload.id, msg.shard, msg.token.member_epoch);
///     Ok(())
/// }
///
/// #[stream_listener(stream = "orders", group = "audit", start_from = "latest")]
/// async fn on_batch(batch: Vec<Message<Order>>) -> Result<(), std::io::Error> {
///     println!("{} orders", batch.len()); // one call, one fate for all of them
///     Ok(())
/// }
///
/// #[stream_listener(stream = "orders", group = "archive")]
/// async fn on_bytes(msg: RawMessage) -> Result<(), String> {
///     println!("{} bytes", msg.payload.len());
///     Ok(())
/// }
///
/// #[stream_listener(stream = "payments", group = "ledger", ack = "manual")]
/// async fn on_foreign(msg: Message<Fields>) -> Result<(), String> {
///     // Entries other clients wrote, every field; acknowledged only by hand with `ack = "manual"`.
///     msg.ack().await.map_err(|e| e.to_string())
/// }
///
/// # fn main() {}
/// ```
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
