//! The feature `opentelemetry` through a dead letter and its replay: the dead letter keeps the
//! producer's trace context (`sl_headers`), `dead-letters replay` writes it back, and the replayed
//! entry's `message` span is again a child of the producer's span: one trace from the send, through
//! the failed attempt, to the handler of the replay.

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stream_listener::{ConsumerBuilder, HandlerError, Message};
use stream_listener_test_support::aio::connect;
use stream_listener_test_support::RedisServer;
use stream_listener_tests::otel::{self, in_trace, send_traced, wait_for_spans};
use stream_listener_tests::{producer, start_one};
use tokio::sync::mpsc;

async fn recv<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("handled within 20 s")
        .expect("the handler is alive")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_through_a_dead_letter_and_its_replay() {
    let exporter = otel::install();
    let redis = RedisServer::start();
    let url = redis.url();
    let producer = producer(&url, "replayed", 2).await;
    let sent = send_traced(&producer, "customer-7", 7).await;
    let failed_once = Arc::new(AtomicBool::new(false));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let consumer = ConsumerBuilder::new("replayed", "billing")
        .member_id("m")
        .handler(move |msg: Message<u32>| {
            let (tx, failed_once) = (tx.clone(), failed_once.clone());
            async move {
                tx.send(otel::span_context(&tracing::Span::current()).trace_id())
                    .unwrap();
                if failed_once.swap(true, Ordering::AcqRel) {
                    Ok(())
                } else {
                    Err(HandlerError::permanent(format!(
                        "cannot bill {}",
                        msg.payload
                    )))
                }
            }
        });
    let running = start_one(&url, consumer).await;
    assert_eq!(recv(&mut rx).await, sent.trace_id(), "the first attempt");

    let mut conn = connect(&url).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let (id, fields) = loop {
        let letters: Vec<(String, std::collections::HashMap<String, String>)> =
            redis::cmd("XRANGE")
                .arg("replayed:dlq")
                .arg("-")
                .arg("+")
                .query_async(&mut conn)
                .await
                .unwrap();
        if let Some(letter) = letters.into_iter().next() {
            break letter;
        }
        assert!(Instant::now() < deadline, "never dead-lettered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let traceparent = format!("00-{:032x}-{:016x}-01", sent.trace_id(), sent.span_id());
    assert!(
        fields["sl_headers"].contains(&traceparent),
        "the dead letter keeps the trace context: {fields:?}"
    );

    let replay = Command::new(env!("CARGO_BIN_EXE_stream-listener"))
        .args([
            "--redis-url",
            &url,
            "dead-letters",
            "replay",
            "--stream",
            "replayed",
        ])
        .args(["--id", &id])
        .env_remove("REDIS_URL")
        .output()
        .expect("run the binary");
    assert!(replay.status.success(), "{replay:?}");
    assert_eq!(recv(&mut rx).await, sent.trace_id(), "the replay's handler");

    let spans = wait_for_spans(&exporter, "message", 2, in_trace(sent.trace_id())).await;
    running.stop().await.unwrap();
    assert_eq!(spans.len(), 2, "{spans:?}");
    for span in &spans {
        assert_eq!(
            span.parent_span_id,
            sent.span_id(),
            "a child of the send: {span:?}"
        );
    }
}
