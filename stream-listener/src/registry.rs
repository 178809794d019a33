//! Listeners registered at compile time by `#[stream_listener]`.
//!
//! The attribute macro emits one `inventory::submit!` of a [`ListenerRegistration`] per handler; the
//! runtime bootstrap walks them with [`registrations`] and starts `concurrency` logical members for each.
//! A registration is a plain constant: strings, numbers, options, and a `fn` pointer that builds the boxed
//! handler when the runtime needs it.

use crate::consumer::{AckPolicy, BoxedHandler, ConsumerConfig, FailurePolicy, OnExhausted};
use crate::member::identity::{self, BaseMemberId};

/// How a listener's payloads are decoded, chosen by the handler's argument type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadKind {
    /// `Message<T>`: the payload is JSON decoded into `T` with serde.
    Json,
    /// `RawMessage` / `Message<Vec<u8>>`: the payload bytes as they are.
    Raw,
    /// `Message<Fields>`: the entry's field map, for entries written by other clients (no `p` field).
    Fields,
}

/// One `#[stream_listener]` handler, as the macro registered it.
///
/// Const-constructible on purpose (it lives in a `static`). Built by the macro; fields that the attribute
/// leaves unset are `None` and take the [`ConsumerConfig`] defaults. Because the macro builds it with a
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
    /// Base member id override; `None` resolves it from the environment ([`identity::base_member_id`]).
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
    /// Dead-letter stream key.
    pub dead_letter: Option<&'static str>,
    /// Static balancing weight of each member.
    pub weight: Option<u32>,
    /// How long one handler attempt may run, in milliseconds (see [`ConsumerConfig::handler_timeout`]).
    pub handler_timeout_ms: Option<u64>,
    /// How payloads are decoded.
    pub payload: PayloadKind,
    /// The payload type as written in the handler signature (for logs and the CLI).
    pub payload_type: &'static str,
    /// Builds the boxed handler (decoder included).
    pub make_handler: fn() -> BoxedHandler,
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

    /// A fresh boxed handler.
    pub fn handler(&self) -> BoxedHandler {
        (self.make_handler)()
    }

    /// The acknowledgement policy in effect.
    pub fn ack_policy(&self) -> AckPolicy {
        self.ack.unwrap_or_default()
    }

    /// The failure policy in effect: defaults with `max_deliveries` and `on_exhausted` applied.
    pub fn failure_policy(&self) -> FailurePolicy {
        let mut policy = FailurePolicy::default();
        if let Some(max) = self.max_deliveries {
            policy.max_deliveries = max.max(1);
        }
        if let Some(on_exhausted) = self.on_exhausted {
            policy.on_exhausted = on_exhausted;
        }
        policy
    }

    /// The static balancing weight of each member (1 unless set).
    pub fn member_weight(&self) -> u32 {
        self.weight.unwrap_or(1)
    }

    /// The base member id: the registration's `id` override, else resolved from the environment.
    pub fn base_member_id(&self) -> BaseMemberId {
        identity::base_member_id(self.id)
    }

    /// The logical member ids of this listener under `base`.
    pub fn member_ids(&self, base: &str) -> Vec<String> {
        identity::member_ids(base, self.concurrency.max(1))
    }

    /// The consumer configuration of the logical member `member_id` (its Redis consumer name).
    pub fn consumer_config(&self, member_id: &str) -> ConsumerConfig {
        let mut config = ConsumerConfig::new(self.stream, self.group, member_id);
        if let Some(batch_size) = self.batch_size {
            config.batch_size = batch_size;
        }
        if let Some(block_ms) = self.block_ms {
            config.block_ms = block_ms;
        }
        config.ack_policy = self.ack_policy();
        config.failure_policy = self.failure_policy();
        config.dead_letter_stream = self.dead_letter.map(str::to_owned);
        config.handler_timeout = self
            .handler_timeout_ms
            .map(std::time::Duration::from_millis);
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumer::DeleteRef;

    fn handler() -> BoxedHandler {
        BoxedHandler::raw(|_m: crate::consumer::RawMessage| async { Ok::<(), String>(()) })
    }

    const BARE: ListenerRegistration = ListenerRegistration {
        handler_name: "on_order",
        module_path: "app::billing",
        file: "src/billing.rs",
        line: 3,
        stream: "orders",
        group: "billing",
        concurrency: 2,
        id: None,
        batch_size: None,
        block_ms: None,
        ack: None,
        on_exhausted: None,
        max_deliveries: None,
        dead_letter: None,
        weight: None,
        handler_timeout_ms: None,
        payload: PayloadKind::Raw,
        payload_type: "RawMessage",
        make_handler: handler,
    };

    #[test]
    fn defaults_come_from_the_consumer_config() {
        let config = BARE.consumer_config("10.0.0.1-m0");
        assert_eq!(
            config,
            ConsumerConfig::new("orders", "billing", "10.0.0.1-m0")
        );
        assert_eq!(BARE.member_weight(), 1);
        assert_eq!(BARE.qualified_name(), "app::billing::on_order");
        assert_eq!(BARE.member_ids("b"), ["b-m0", "b-m1"]);
    }

    #[test]
    fn every_option_is_applied() {
        let reg = ListenerRegistration {
            id: Some("fixed"),
            batch_size: Some(7),
            block_ms: Some(20),
            ack: Some(AckPolicy::AckDelete(DeleteRef::Acked)),
            on_exhausted: Some(OnExhausted::LeavePending),
            max_deliveries: Some(3),
            dead_letter: Some("orders:dead"),
            weight: Some(2),
            handler_timeout_ms: Some(1500),
            ..BARE
        };
        let config = reg.consumer_config("fixed-m1");
        assert_eq!(config.consumer_name, "fixed-m1");
        assert_eq!(config.batch_size, 7);
        assert_eq!(config.block_ms, 20);
        assert_eq!(config.ack_policy, AckPolicy::AckDelete(DeleteRef::Acked));
        assert_eq!(config.failure_policy.max_deliveries, 3);
        assert_eq!(
            config.failure_policy.on_exhausted,
            OnExhausted::LeavePending
        );
        assert_eq!(config.dead_letter_key(), "orders:dead");
        assert_eq!(reg.member_weight(), 2);
        assert_eq!(
            config.handler_timeout,
            Some(std::time::Duration::from_millis(1500))
        );
        assert_eq!(reg.base_member_id().id, "fixed");
    }
}
