//! `#[stream_listener]` handlers show up in `registrations()` with the fields their attributes set.

use std::fmt;

use serde::Deserialize;
use stream_listener::__private::{registrations, ListenerRegistration, PayloadKind};
use stream_listener::consumer::{AckPolicy, DeleteRef, Message, OnExhausted, RawMessage};
use stream_listener::stream_listener;
use stream_listener::{ListenerSpec, StartFrom};

#[derive(Debug, Deserialize)]
struct Order {
    id: u64,
}

#[derive(Debug)]
struct BillingError;

impl fmt::Display for BillingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("billing failed")
    }
}

#[stream_listener(stream = "orders", group = "billing", concurrency = 4)]
async fn on_order(msg: Message<Order>) -> Result<(), BillingError> {
    if msg.payload.id == 0 {
        return Err(BillingError);
    }
    Ok(())
}

#[stream_listener(
    stream = "audit",
    group = "archiver",
    id = "archiver-1",
    batch_size = 10,
    block_ms = 25,
    ack = "ack_delete_delref",
    failure = "leave_pending",
    max_deliveries = 3,
    initial_backoff_ms = 20,
    max_backoff_ms = 900,
    jitter = false,
    weight = 2,
    handler_timeout_ms = 5000,
    start_from = "latest",
    shard_count = 12
)]
async fn archive(msg: RawMessage) -> Result<(), String> {
    drop(msg.payload);
    Ok(())
}

fn find(name: &str) -> &'static ListenerRegistration {
    let mut found = registrations().filter(|r| r.handler_name == name);
    let registration = found
        .next()
        .unwrap_or_else(|| panic!("{name} is not registered"));
    assert!(found.next().is_none(), "{name} is registered twice");
    registration
}

fn spec(name: &str) -> ListenerSpec {
    let mut found = ListenerSpec::registered()
        .into_iter()
        .filter(|s| s.name == name);
    let spec = found.next().unwrap();
    assert!(found.next().is_none());
    spec
}

#[test]
fn json_listener_is_registered_with_its_arguments() {
    let r = find("on_order");
    assert_eq!(r.stream, "orders");
    assert_eq!(r.group, "billing");
    assert_eq!(r.concurrency, 4);
    assert_eq!(r.module_path, "registry");
    assert!(r.file.ends_with("registry.rs"), "{}", r.file);
    assert_eq!(r.line, 26, "the line of `async fn on_order`");
    assert_eq!(r.payload, PayloadKind::Json);
    assert_eq!(r.payload_type, "Order");
    assert_eq!(r.id, None);
    assert_eq!(r.batch_size, None);
    assert_eq!(r.block_ms, None);
    assert_eq!(r.ack, None);
    assert_eq!(r.on_exhausted, None);
    assert_eq!(r.max_deliveries, None);
    assert_eq!(
        (r.initial_backoff_ms, r.max_backoff_ms, r.jitter),
        (None, None, None)
    );
    assert_eq!(r.dead_letter, None);
    assert_eq!(r.weight, None);
    assert_eq!(r.handler_timeout_ms, None);

    assert_eq!(r.start_from, None);
    assert_eq!(r.shard_count, None);

    let spec = spec("on_order");
    spec.validate().unwrap();
    let config = spec.consumer_config("10.0.0.1-m3");
    assert_eq!(config.stream_prefix, "orders");
    assert_eq!(config.group, "billing");
    assert_eq!(config.consumer_name, "10.0.0.1-m3");
    assert_eq!(config.ack_policy, AckPolicy::Ack);
    assert_eq!(config.dead_letter_key(), "orders:dlq");
    assert_eq!(spec.member_ids(Some("10.0.0.1")).len(), 4);
    assert_eq!(spec.start_from, StartFrom::Earliest);
    assert_eq!(spec.name, "on_order");
}

#[test]
fn every_option_is_carried_over() {
    let r = find("archive");
    assert_eq!(r.payload, PayloadKind::Raw);
    assert_eq!(r.payload_type, "RawMessage");
    assert_eq!(r.concurrency, 1);
    assert_eq!(r.id, Some("archiver-1"));
    assert_eq!(r.batch_size, Some(10));
    assert_eq!(r.block_ms, Some(25));
    assert_eq!(r.ack, Some(AckPolicy::AckDelete(DeleteRef::DelRef)));
    assert_eq!(r.on_exhausted, Some(OnExhausted::LeavePending));
    assert_eq!(r.max_deliveries, Some(3));
    assert_eq!(
        (r.initial_backoff_ms, r.max_backoff_ms, r.jitter),
        (Some(20), Some(900), Some(false))
    );
    assert_eq!(r.weight, Some(2));
    assert_eq!(r.handler_timeout_ms, Some(5000));
    assert_eq!(r.start_from, Some(StartFrom::Latest));
    assert_eq!(r.shard_count, Some(12));

    let spec = spec("archive");
    spec.validate().unwrap();
    assert_eq!(spec.weight, 2);
    assert_eq!(spec.member_ids(Some("ignored")), ["archiver-1-m0"]);
    assert_eq!(spec.start_from, StartFrom::Latest);
    assert_eq!(spec.shard_count, Some(12));
    let config = spec.consumer_config("archiver-1-m0");
    assert_eq!(config.batch_size, 10);
    assert_eq!(config.block_ms, 25);
    assert_eq!(config.ack_policy, AckPolicy::AckDelete(DeleteRef::DelRef));
    assert_eq!(config.failure_policy.max_deliveries, 3);
    assert_eq!(
        config.failure_policy,
        stream_listener::FailurePolicy::default()
            .max_deliveries(3)
            .initial_backoff(std::time::Duration::from_millis(20))
            .max_backoff(std::time::Duration::from_millis(900))
            .jitter(false)
            .on_exhausted(OnExhausted::LeavePending)
    );
    assert_eq!(
        config.failure_policy.on_exhausted,
        OnExhausted::LeavePending
    );
    assert_eq!(
        config.handler_timeout,
        Some(std::time::Duration::from_secs(5))
    );
}

#[test]
fn handlers_stay_callable_as_written() {
    // The functions are untouched: other code may call them directly.
    let _future = archive;
    let _future = on_order;
}
