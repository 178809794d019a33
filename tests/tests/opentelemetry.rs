//! The feature `opentelemetry`: one trace from the producer's span to the handler. The producer puts the
//! current span's W3C context in the headers; a single handler's `message` span is its child, with the
//! messaging attributes; a batch handler's `batch` span links every entry's context. The spans are
//! exported to an in-memory exporter (`stream_listener_tests::otel`). The trace through a dead letter
//! and its replay is in the CLI's tests (`cli/tests/opentelemetry.rs`): the replay is a CLI command.

use std::time::Duration;
use stream_listener::{ConsumerBuilder, Message};
use stream_listener_test_support::RedisServer;
use stream_listener_tests::otel::{self, attribute, in_trace, send_traced, wait_for_spans};
use stream_listener_tests::{producer, start_one};
use tokio::sync::mpsc;

async fn recv<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("handled within 20 s")
        .expect("the handler is alive")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_from_send_to_a_single_handler() {
    let exporter = otel::install();
    let redis = RedisServer::start();
    let url = redis.url();
    let producer = producer(&url, "traced", 4).await;
    let sent = send_traced(&producer, "customer-7", 7).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let consumer = ConsumerBuilder::new("traced", "billing")
        .member_id("m")
        .handler(move |msg: Message<u32>| {
            let tx = tx.clone();
            async move {
                let inside = otel::span_context(&tracing::Span::current());
                tx.send((msg, inside)).unwrap();
                Ok::<(), String>(())
            }
        });
    let running = start_one(&url, consumer).await;
    let (msg, inside) = recv(&mut rx).await;
    assert_eq!(
        msg.headers().get("traceparent"),
        Some(format!("00-{:032x}-{:016x}-01", sent.trace_id(), sent.span_id()).as_str())
    );
    assert_eq!(
        inside.trace_id(),
        sent.trace_id(),
        "the handler runs in the producer's trace"
    );

    let spans = wait_for_spans(&exporter, "message", 1, in_trace(sent.trace_id())).await;
    running.stop().await.unwrap();
    let span = &spans[0];
    assert_eq!(
        span.parent_span_id,
        sent.span_id(),
        "the send span is its parent"
    );
    assert!(span.parent_span_is_remote);
    assert_eq!(span.span_context.span_id(), inside.span_id());
    let attr = |key| attribute(span, key);
    assert_eq!(attr("messaging.system").as_deref(), Some("redis"));
    assert_eq!(
        attr("messaging.destination.name").as_deref(),
        Some("traced")
    );
    assert_eq!(
        attr("messaging.consumer.group.name").as_deref(),
        Some("billing")
    );
    assert_eq!(
        attr("messaging.destination.partition.id"),
        Some(msg.shard.to_string())
    );
    assert_eq!(attr("messaging.message.id"), Some(msg.id.clone()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_handler_span_links_every_entry() {
    let exporter = otel::install();
    let redis = RedisServer::start();
    let url = redis.url();
    // One shard, so that one read takes all three entries.
    let producer = producer(&url, "batched", 1).await;
    let mut sent = Vec::new();
    for (key, n) in [("a", 1), ("b", 2), ("c", 3)] {
        sent.push(send_traced(&producer, key, n).await);
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    let consumer = ConsumerBuilder::new("batched", "audit")
        .member_id("m")
        .batch_handler(move |batch: Vec<Message<u32>>| {
            let tx = tx.clone();
            async move {
                tx.send(batch.len()).unwrap();
                Ok::<(), String>(())
            }
        });
    let running = start_one(&url, consumer).await;
    assert_eq!(recv(&mut rx).await, 3, "one batch of the three entries");
    let links = |span: &otel::opentelemetry_sdk::trace::SpanData| -> Vec<(String, String)> {
        span.links
            .links
            .iter()
            .map(|link| {
                (
                    link.span_context.trace_id().to_string(),
                    link.span_context.span_id().to_string(),
                )
            })
            .collect()
    };
    let expected: Vec<(String, String)> = sent
        .iter()
        .map(|c| (c.trace_id().to_string(), c.span_id().to_string()))
        .collect();
    let first = expected[0].clone();
    let spans = wait_for_spans(&exporter, "batch", 1, |span| links(span).contains(&first)).await;
    running.stop().await.unwrap();
    let span = &spans[0];
    assert_eq!(links(span), expected);
    assert_eq!(
        attribute(span, "messaging.system").as_deref(),
        Some("redis")
    );
    assert_eq!(
        attribute(span, "messaging.consumer.group.name").as_deref(),
        Some("audit")
    );
    assert_eq!(
        attribute(span, "messaging.batch.message_count").as_deref(),
        Some("3")
    );
}
