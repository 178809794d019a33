//! Headers through Redis: what `Producer::*_with_headers` writes, `Message::headers` gives back, for
//! single and batch handlers; entries without them (older producers, other clients) read as before; a
//! malformed `sl_headers` field is dead-lettered with its reason and nothing lost; a dead letter keeps
//! the headers.

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use stream_listener::{ConsumerBuilder, FailurePolicy, Fields, HandlerError, Headers, Message};
use stream_listener_test_support::aio::connect;
use stream_listener_test_support::RedisServer;
use stream_listener_tests::{producer, start_one};
use tokio::sync::mpsc;

/// Waits for `condition`, failing after 20 s with `what`.
async fn wait_for<F: Future<Output = bool>>(what: &str, mut condition: impl FnMut() -> F) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn recv<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("handled within 20 s")
        .expect("the handler is alive")
}

async fn entries(conn: &mut ConnectionManager, key: &str) -> Vec<HashMap<String, String>> {
    let entries: Vec<(String, HashMap<String, String>)> = redis::cmd("XRANGE")
        .arg(key)
        .arg("-")
        .arg("+")
        .query_async(conn)
        .await
        .unwrap();
    entries.into_iter().map(|(_, fields)| fields).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_reach_single_and_batch_handlers_and_old_entries_have_none() {
    let redis = RedisServer::start();
    let url = redis.url();
    let producer = producer(&url, "hdr", 1).await;
    let tenant = Headers::new()
        .with("tenant", "acme")
        .with("source", "checkout");
    producer
        .send_with_headers("a", &1u32, &tenant)
        .await
        .unwrap();
    producer
        .send_bytes_with_headers("b", b"2", &Headers::new().with("n", "2"))
        .await
        .unwrap();
    // An older producer's entry (and one with no headers at all): no field, no headers.
    producer.send("c", &3u32).await.unwrap();
    producer
        .send_batch_with_headers(&[
            ("d", 4u32, Headers::new().with("n", "4")),
            ("e", 5u32, Headers::new()),
        ])
        .await
        .unwrap();
    producer
        .send_batch_bytes_with_headers(&[("f", b"6", Headers::new().with("n", "6"))])
        .await
        .unwrap();
    // A field map cannot smuggle a header field in.
    assert!(matches!(
        producer.send_fields("g", &[("sl_headers", "{}")]).await,
        Err(stream_listener::ProducerError::ReservedField(name)) if name == "sl_headers"
    ));
    let mut conn = connect(&url).await;
    let written = entries(&mut conn, "hdr:0").await;
    assert_eq!(
        written[0]["sl_headers"],
        r#"{"tenant":"acme","source":"checkout"}"#
    );
    assert!(!written[2].contains_key("sl_headers"), "{:?}", written[2]);
    assert!(!written[4].contains_key("sl_headers"), "{:?}", written[4]);

    let (tx, mut rx) = mpsc::unbounded_channel();
    let single = ConsumerBuilder::new("hdr", "single")
        .member_id("s")
        .handler(move |msg: Message<u32>| {
            let tx = tx.clone();
            async move {
                tx.send((msg.payload, msg.headers().clone())).unwrap();
                Ok::<(), String>(())
            }
        });
    let (batch_tx, mut batch_rx) = mpsc::unbounded_channel();
    let batch = ConsumerBuilder::new("hdr", "batch")
        .member_id("b")
        .batch_handler(move |batch: Vec<Message<u32>>| {
            let tx = batch_tx.clone();
            async move {
                for msg in batch {
                    tx.send((msg.payload, msg.headers().clone())).unwrap();
                }
                Ok::<(), String>(())
            }
        });
    let running = stream_listener_tests::test_runtime(&url)
        .consumer(single)
        .consumer(batch)
        .start()
        .await
        .unwrap();
    for rx in [&mut rx, &mut batch_rx] {
        let mut got = Vec::new();
        for _ in 0..6 {
            got.push(recv(rx).await);
        }
        assert_eq!(
            got,
            [
                (1, tenant.clone()),
                (2, Headers::new().with("n", "2")),
                (3, Headers::new()),
                (4, Headers::new().with("n", "4")),
                (5, Headers::new()),
                (6, Headers::new().with("n", "6")),
            ]
        );
    }
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_header_field_is_dead_lettered_and_headers_survive_dead_letters() {
    let redis = RedisServer::start();
    let url = redis.url();
    let producer = producer(&url, "bad", 1).await;
    let mut conn = connect(&url).await;
    // Another client's entry with an `sl_headers` field that is not ours.
    let _: String = redis::cmd("XADD")
        .arg("bad:0")
        .arg("*")
        .arg("k")
        .arg("x")
        .arg("p")
        .arg("1")
        .arg("sl_headers")
        .arg("tenant=acme")
        .query_async(&mut conn)
        .await
        .unwrap();
    // A good entry whose handler gives up: its dead letter keeps the headers.
    producer
        .send_with_headers("y", &2u32, &Headers::new().with("tenant", "acme"))
        .await
        .unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let consumer = ConsumerBuilder::new("bad", "g")
        .member_id("m")
        .failure(FailurePolicy::default().max_deliveries(1))
        .handler(move |msg: Message<u32>| {
            let tx = tx.clone();
            async move {
                tx.send(msg.payload).unwrap();
                Err::<(), _>(HandlerError::permanent("no"))
            }
        });
    let running = start_one(&url, consumer).await;
    assert_eq!(
        recv(&mut rx).await,
        2,
        "only the good entry reaches the handler"
    );
    wait_for("two dead letters", || {
        let mut conn = conn.clone();
        async move { entries(&mut conn, "bad:dlq").await.len() == 2 }
    })
    .await;
    running.stop().await.unwrap();
    let letters = entries(&mut conn, "bad:dlq").await;
    assert_eq!(letters[0]["sl_headers"], "tenant=acme", "nothing lost");
    assert!(
        letters[0]["dlq_error"].contains("the `sl_headers` field is malformed"),
        "{:?}",
        letters[0]
    );
    assert_eq!(letters[0]["dlq_permanent"], "true");
    assert_eq!(letters[1]["sl_headers"], r#"{"tenant":"acme"}"#);
    assert_eq!(letters[1]["dlq_error"], "no");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fields_handler_keeps_foreign_fields_and_gets_our_headers() {
    let redis = RedisServer::start();
    let url = redis.url();
    let _producer = producer(&url, "foreign", 1).await;
    let mut conn = connect(&url).await;
    for (name, value) in [
        ("h", "not ours"),
        ("sl_headers", "tenant=acme"),
        ("sl_headers", r#"{"tenant":"acme"}"#),
    ] {
        let _: String = redis::cmd("XADD")
            .arg("foreign:0")
            .arg("*")
            .arg("order_id")
            .arg("7")
            .arg(name)
            .arg(value)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    let consumer = ConsumerBuilder::new("foreign", "g")
        .member_id("m")
        .fields_handler(move |msg: Message<Fields>| {
            let tx = tx.clone();
            async move {
                let headers = msg.headers().clone();
                tx.send((msg.payload, headers)).unwrap();
                Ok::<(), String>(())
            }
        });
    let running = start_one(&url, consumer).await;
    let got = [
        recv(&mut rx).await,
        recv(&mut rx).await,
        recv(&mut rx).await,
    ];
    running.stop().await.unwrap();
    assert_eq!(
        got,
        [
            (
                Fields::new([("order_id", "7"), ("h", "not ours")]),
                Headers::new()
            ),
            (
                Fields::new([("order_id", "7"), ("sl_headers", "tenant=acme")]),
                Headers::new()
            ),
            (
                Fields::new([("order_id", "7")]),
                Headers::new().with("tenant", "acme")
            ),
        ]
    );
}
