//! The `#[stream_listener]` attribute of [stream-listener](https://docs.rs/stream-listener).
//!
//! Use it through `stream_listener::stream_listener`; the expansion names items of the runtime crate's
//! hidden `__private` module, so this crate is not meant to be depended on directly.

mod listener;
mod report_debug;

/// Registers an `async fn` as a listener of a consumer group on a sharded stream: `Runtime::start` (or
/// `Runtime::run`) starts every listener the binary registers, as `concurrency` logical members of
/// `group`. The function stays callable as written (in a unit test, say).
///
/// ```ignore
/// #[stream_listener(stream = "orders", group = "billing", concurrency = 4)]
/// async fn on_order(msg: Message<Order>) -> Result<(), BillingError> { Ok(()) }
/// ```
///
/// # Arguments
///
/// Each is `key = literal`, given at most once; a wrong key, value or combination is a compile error
/// pointing at it. At start the environment overrides them, as `STREAM_LISTENER_<LISTENER>_<SETTING>`
/// with `<LISTENER>` the function's name upper-cased and `<SETTING>` the key upper-cased (`id` as
/// `MEMBER_ID`); all but `ack` and `failure`.
///
/// | argument | what | default |
/// | --- | --- | --- |
/// | `stream = "orders"` | the logical stream (required): its shards are the Redis streams `orders:0` .. `orders:{n-1}`; no `{` or `}` | |
/// | `group = "billing"` | the consumer group (required) | |
/// | `concurrency = 4` | logical members in this process, `{base}-m0` .. `{base}-m3`: each heartbeats, holds a lease, has a member epoch and owns shards of its own (at least 1) | 1 |
/// | `id = "worker-a"` | the base of the member ids (ASCII letters, digits, `.`, `_`, `-`) | the runtime's `base_member_id` or `STREAM_LISTENER_MEMBER_ID`, else the pod IP, a local address, the hostname |
/// | `batch_size = 100` | entries per read of a shard (at least 1): fewer round trips, longer revokes | 100 |
/// | `block_ms = 450` | how long the idle wait (`XREAD BLOCK` over idle shards) blocks | 450 |
/// | `ack = "ack"` | what "done" means: `"ack"` (`XACK`); `"ack_delete_acked"` (also delete it once every group acknowledged it); `"ack_delete_keepref"`, `"ack_delete_delref"` (delete at once, even what other groups have not read: a WARN at start names them); `"manual"` (the handler calls `msg.ack().await`; returning does not acknowledge); `"ack_delete"` is a deprecated `"ack_delete_keepref"` | `"ack"` |
/// | `failure = "retry_then_dead_letter"` | an entry whose handler failed `max_deliveries` times: `"retry_then_dead_letter"` copies it to the dead-letter stream with the error and acknowledges it; `"leave_pending"` leaves it pending (with `dead_letter`: a compile error) | `"retry_then_dead_letter"` |
/// | `max_deliveries = 5` | deliveries, first attempt included, before an entry is exhausted (at least 1); retries back off (100 ms doubling up to 5 s by default) without holding a worker | 5 |
/// | `initial_backoff_ms = 100` | the wait before the first retry, doubling per retry (at least 1) | 100 |
/// | `max_backoff_ms = 5000` | the longest wait between retries (at least `initial_backoff_ms`) | 5000 |
/// | `jitter = true` | each wait a random 50-100 % of the doubled one, so retries of many entries spread out | `true` |
/// | `dead_letter = "orders:failed"` | the dead-letter stream key | `"{stream}:dlq"` |
/// | `weight = 2` | the member's share of the shards relative to other members (at least 1) | 1 |
/// | `handler_timeout_ms = 5000` | how long one attempt may run (at least 1): past it the future is dropped and the attempt counts as failed (`handler timed out after 5000 ms`) | no limit |
/// | `start_from = "latest"` | where a group this listener creates starts: `"earliest"` (the stream's backlog too) or `"latest"` (only what comes after); an existing group keeps its position | `"earliest"` |
/// | `shard_count = 16` | the shards of a stream this listener creates, when no producer created it first (at least 1); an existing stream keeps its count | the runtime's `default_shard_count` (16) |
///
/// # Handler forms
///
/// The first argument says how an entry's fields are decoded; an entry that does not decode is
/// dead-lettered at once (`undecodable payload: ...`), without a retry:
///
/// * `msg: Message<T>`, `T: DeserializeOwned`: the JSON in the entry's `p` field, as the library's
///   `Producer` writes it; `msg.key`, `msg.id`, `msg.shard`, `msg.delivery_count` and `msg.token` (the
///   owner's fencing token) say where it came from;
/// * `msg: RawMessage` (or `Message<Vec<u8>>`): the bytes of `p`, undecoded;
/// * `msg: Message<Fields>`: every field of the entry, for entries other clients wrote;
/// * `batch: Vec<Message<T>>`: a batch handler, called with up to `batch_size` entries of one shard in
///   order; they share the call's fate (all acknowledged, or all retried, then dead-lettered).
///
/// An optional second argument `State(value): State<T>` receives a clone of the `T` registered with
/// `Runtime::state(value)` (a pool, a client; put it in an `Arc` to make the clone cheap); a type nobody
/// registered fails the start with `RuntimeError::MissingState`.
///
/// The function is `async`, not generic, and returns `Result<(), E>` with `E: Display`: `Ok` acknowledges
/// the entry (per `ack`), `Err` (or a panic, or a timeout) is a failed attempt, retried until
/// `max_deliveries` and then dead-lettered with the error's text. An error can say more:
/// `HandlerError::permanent(e)` dead-letters at once (bad data, a 4xx from a dependency) and
/// `HandlerError::retry_after(e, d)` retries after `d` instead of the backoff. Its future must be `Send` (the error
/// points at the `.await` that holds something that is not).
#[proc_macro_attribute]
pub fn stream_listener(
    args: proc_macro::TokenStream,
    item: proc_macro::TokenStream,
) -> proc_macro::TokenStream {
    listener::expand(args.into(), item.into()).into()
}

/// `Debug` for the runtime crate's public error types: `{:?}` is the error's report (its `Display` text
/// and the causes that text does not already say, the form `main` prints when it returns the error),
/// `{:#?}` the structure a derived `Debug` would print. Not public API: for the runtime crate's own
/// error types, the expansion names its private `crate::report`.
#[doc(hidden)]
#[proc_macro_derive(ReportDebug)]
pub fn report_debug(item: proc_macro::TokenStream) -> proc_macro::TokenStream {
    report_debug::expand(syn::parse_macro_input!(item as syn::DeriveInput)).into()
}
