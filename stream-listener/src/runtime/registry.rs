//! Listeners registered at compile time by `#[stream_listener]`.
//!
//! The attribute macro emits one `inventory::submit!` of a [`ListenerRegistration`] per handler; the
//! runtime bootstrap walks them with [`registrations`] and starts `concurrency` logical members for each.
//! A registration is a plain constant: strings, numbers, options, and a `fn` pointer that builds the boxed
//! handler when the runtime needs it.

use crate::consumer::{AckPolicy, BoxedHandler, OnExhausted};
use crate::topology::StartFrom;

use super::state::{MissingState, States};

/// How a listener's payloads are decoded, chosen by the handler's argument type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadKind {
    /// `Message<T>`: the payload is JSON decoded into `T` with serde.
    Json,
    /// `RawMessage` / `Message<Vec<u8>>`: the payload bytes as they are.
    Raw,
    /// `Message<Fields>`: the entry's field map, for entries written by other clients (no `p` field).
    Fields,
    /// `Vec<Message<T>>`: a batch handler of JSON payloads (see
    /// [`BoxedHandler::json_batch`](crate::consumer::BoxedHandler::json_batch)).
    JsonBatch,
}

/// One `#[stream_listener]` handler, as the macro registered it.
///
/// Const-constructible on purpose (it lives in a `static`). Built by the macro; fields that the attribute
/// leaves unset are `None` and take the defaults of [`ListenerSpec`](crate::runtime::ListenerSpec), which
/// the runtime builds from it ([`ListenerSpec::registered`](crate::runtime::ListenerSpec::registered)). Because the macro builds it with a
/// struct literal, adding a field is a change to the macro as well.
#[derive(Debug, Clone, Copy)]
pub struct ListenerRegistration {
    /// The handler function's name.
    pub handler_name: &'static str,
    /// `module_path!()` where the handler is defined.
    pub module_path: &'static str,
    /// Source file of the handler.
    pub file: &'static str,
    /// Source line of the handler.
    pub line: u32,
    /// Logical stream name (shard keys are `{stream}:{i}`).
    pub stream: &'static str,
    /// Consumer group.
    pub group: &'static str,
    /// Logical members this process runs for the listener (`{base}-m0 .. -m{n-1}`). At least 1.
    pub concurrency: usize,
    /// Base member id override; `None`: the runtime's base member id.
    pub id: Option<&'static str>,
    /// Entries per read.
    pub batch_size: Option<usize>,
    /// Blocking read timeout in milliseconds.
    pub block_ms: Option<u64>,
    /// Acknowledgement policy.
    pub ack: Option<AckPolicy>,
    /// What to do with an entry that exhausted its deliveries.
    pub on_exhausted: Option<OnExhausted>,
    /// Deliveries before an entry counts as exhausted.
    pub max_deliveries: Option<u32>,
    /// Wait before the first retry, in milliseconds.
    pub initial_backoff_ms: Option<u64>,
    /// Upper bound of the wait between retries, in milliseconds.
    pub max_backoff_ms: Option<u64>,
    /// Equal jitter on the backoff.
    pub jitter: Option<bool>,
    /// Dead-letter stream key.
    pub dead_letter: Option<&'static str>,
    /// Static balancing weight of each member.
    pub weight: Option<u32>,
    /// How long one handler attempt may run, in milliseconds.
    pub handler_timeout_ms: Option<u64>,
    /// Where the group starts when this listener creates it.
    pub start_from: Option<StartFrom>,
    /// Shards of the stream if this listener creates it.
    pub shard_count: Option<u32>,
    /// How payloads are decoded.
    pub payload: PayloadKind,
    /// The payload type as written in the handler signature (for logs and the CLI).
    pub payload_type: &'static str,
    /// Builds the boxed handler (decoder included) with the states it asks for (`State<T>` arguments).
    pub make_handler: fn(&States) -> Result<BoxedHandler, MissingState>,
}

inventory::collect!(ListenerRegistration);

/// Every listener registered in this binary, in unspecified order.
pub fn registrations() -> impl Iterator<Item = &'static ListenerRegistration> {
    inventory::iter::<ListenerRegistration>.into_iter()
}

impl ListenerRegistration {
    /// `module::path::handler_name`, for logs.
    pub fn qualified_name(&self) -> String {
        format!("{}::{}", self.module_path, self.handler_name)
    }
}
