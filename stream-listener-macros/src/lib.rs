//! The `#[stream_listener]` attribute of [stream-listener](https://docs.rs/stream-listener).
//!
//! Use it through `stream_listener::stream_listener`; the expansion names items of the runtime crate's
//! hidden `__private` module, so this crate is not meant to be depended on directly.

mod listener;
mod report_debug;

/// Registers an `async fn` as a consumer-group listener of a sharded stream.
///
/// ```ignore
/// #[stream_listener(stream = "orders", group = "billing", concurrency = 4)]
/// async fn on_order(msg: Message<Order>) -> Result<(), BillingError> { Ok(()) }
/// ```
///
/// Arguments: `stream` and `group` (required strings), `concurrency` (logical members in this process,
/// default 1), `id` (base member id override), `batch_size`, `block_ms`, `ack` (`"ack"`; `"ack_delete_acked"`:
/// delete once every group acknowledged; `"ack_delete_keepref"`, `"ack_delete_delref"`: delete at once,
/// even what other groups have not read; `"manual"`; the old `"ack_delete"` is a deprecated
/// `"ack_delete_keepref"`), `failure`
/// (`"retry_then_dead_letter"`, `"leave_pending"`), `max_deliveries`, `initial_backoff_ms` and
/// `max_backoff_ms` (the waits between retries, default 100 and 5000), `jitter` (`true` by default: each
/// wait a random 50-100 % of the doubled one), `dead_letter` (stream key) and `weight`. The handler takes exactly one `Message<T>` (JSON payload) or `RawMessage` (bytes) and
/// returns `Result<(), E>` with `E: Display`; its future must be `Send`. The function stays callable as
/// written.
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
