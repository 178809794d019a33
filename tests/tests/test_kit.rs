//! The test kit as a user's tests use it: a `#[stream_listener]` handler unit-tested without Redis under
//! its attribute's policies ([`HandlerTest::registered`]), the same handler run by the runtime on a real
//! `redis-server` doing what the kit said, and the runtime's waits on a single node and a cluster.

use std::time::Duration;

use stream_listener::consumer::dead_letter_fields as dlq;
use stream_listener::runtime::WaitError;
use stream_listener::testing::{HandlerTest, Outcome, TestMessage};
use stream_listener::{stream_listener, ConsumerBuilder, HandlerError, Message, Runtime};
use stream_listener_test_support::aio::{connect, xrange};
use stream_listener_test_support::RedisServer;
use stream_listener_tests::{on_every_target, producer, test_runtime, Order, Target, TIMING};

/// The handler under test: an order of seq 0 is bad data, key `busy` is told to come back later.
#[stream_listener(
    stream = "kit-orders",
    group = "billing",
    max_deliveries = 3,
    initial_backoff_ms = 40,
    max_backoff_ms = 1000,
    jitter = false
)]
async fn on_order(msg: Message<Order>) -> Result<(), HandlerError> {
    if msg.payload.seq == 0 {
        return Err(HandlerError::permanent(format!(
            "order {} has no amount",
            msg.payload.key
        )));
    }
    if msg.payload.key == "busy" {
        return Err(HandlerError::retry_after(
            "rate limited",
            Duration::from_millis(300),
        ));
    }
    if msg.payload.key == "flaky" {
        // A std error through `?`: transient.
        "x".parse::<u32>()?;
    }
    Ok(())
}

fn order(key: &str, seq: u32) -> Order {
    Order {
        key: key.into(),
        seq,
    }
}

#[tokio::test]
async fn the_attributes_policies_decide_what_each_result_does() {
    let test = HandlerTest::registered("on_order");
    let run = |order, deliveries| {
        let msg = TestMessage::new(order).delivery_count(deliveries).build();
        test.run(&on_order, msg)
    };
    assert_eq!(run(order("a", 1), 1).await, Outcome::Acked);
    assert_eq!(
        run(order("a", 0), 1).await,
        Outcome::DeadLettered {
            reason: "order a has no amount".into(),
            permanent: true
        }
    );
    // 40 ms doubling, exactly (no jitter), then exhausted at the third delivery.
    let ms = Duration::from_millis;
    assert_eq!(
        run(order("flaky", 1), 1).await,
        Outcome::Retry { after: ms(40) }
    );
    assert_eq!(
        run(order("flaky", 1), 2).await,
        Outcome::Retry { after: ms(80) }
    );
    assert_eq!(
        run(order("flaky", 1), 3).await,
        Outcome::DeadLettered {
            reason: "invalid digit found in string".into(),
            permanent: false
        }
    );
    assert_eq!(
        run(order("busy", 1), 1).await,
        Outcome::Retry { after: ms(300) }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_does_what_the_kit_said() {
    let redis = RedisServer::start();
    let url = redis.url();
    let producer = producer(&url, "kit-orders", 2).await;
    let running = Runtime::new(&url)
        .group_config(TIMING)
        .without_env_overrides()
        .start()
        .await
        .unwrap();
    for id in running.listener_ids() {
        running
            .wait_until_assigned(&id, Duration::from_secs(30))
            .await
            .unwrap();
    }
    for order in [order("a", 1), order("b", 0), order("flaky", 1)] {
        producer.send(&order.key, &order).await.unwrap();
    }
    running
        .wait_until_idle("kit-orders", "billing", Duration::from_secs(30))
        .await
        .unwrap();
    running.stop().await.unwrap();
    let mut conn = connect(&url).await;
    let mut letters: Vec<(String, String, String, String)> =
        xrange::<std::collections::HashMap<String, String>>(&mut conn, "kit-orders:dlq")
            .await
            .into_iter()
            .map(|(_, l)| {
                (
                    l["k"].clone(),
                    l[dlq::ERROR].clone(),
                    l[dlq::DELIVERY_COUNT].clone(),
                    l[dlq::PERMANENT].clone(),
                )
            })
            .collect();
    letters.sort();
    let row = |k: &str, e: &str, n: &str, p: &str| (k.into(), e.into(), n.into(), p.into());
    assert_eq!(
        letters,
        [
            row("b", "order b has no amount", "1", "true"),
            row("flaky", "invalid digit found in string", "3", "false"),
        ]
    );
}

/// `wait_until_idle` does not return while a handler holds an entry, and returns once it is acked.
async fn idle_waits_for_the_last_handler(target: Target) {
    let redis = target.start();
    let stream = "kit-gate";
    redis.assert_spread(stream, 4);
    let producer = producer(redis.url(), stream, 4).await;
    let (open, gate) = tokio::sync::watch::channel(false);
    let builder = ConsumerBuilder::new(stream, "g").handler(move |_msg: Message<Order>| {
        let mut gate = gate.clone();
        async move { gate.wait_for(|open| *open).await.map(|_| ()) }
    });
    let running = test_runtime(redis.url())
        .consumer(builder)
        .start()
        .await
        .unwrap();
    let id = running.listener_ids().remove(0);
    let mut shards = running
        .wait_until_assigned(&id, Duration::from_secs(30))
        .await
        .unwrap();
    shards.sort();
    assert_eq!(shards, [0, 1, 2, 3]);
    running
        .wait_until_idle(stream, "g", Duration::from_secs(30))
        .await
        .unwrap();

    for key in ["a", "b", "c", "d", "e"] {
        producer.send(key, &order(key, 1)).await.unwrap();
    }
    let error = running
        .wait_until_idle(stream, "g", Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, WaitError::TimedOut { last, .. }
            if last.contains("pending") || last.contains("not read yet")),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .starts_with("group g of stream kit-gate idle: not within 300 ms"),
        "{error}"
    );
    open.send_replace(true);
    running
        .wait_until_idle(stream, "g", Duration::from_secs(30))
        .await
        .unwrap();
    running.stop().await.unwrap();
}

on_every_target!(idle_waits_for_the_last_handler);

/// A handler that needs a header, unit-tested with the kit's headers: without the header it is bad data.
#[tokio::test]
async fn test_messages_carry_headers_for_single_and_batch_handlers() {
    async fn tenant_only(msg: Message<u32>) -> Result<(), HandlerError> {
        match msg.headers().get("tenant") {
            Some(_) => Ok(()),
            None => Err(HandlerError::permanent("no tenant header")),
        }
    }
    let test = HandlerTest::new();
    let with = TestMessage::new(1u32).header("tenant", "acme").build();
    assert_eq!(test.run(&tenant_only, with).await, Outcome::Acked);
    assert_eq!(
        test.run(&tenant_only, TestMessage::new(1u32).build()).await,
        Outcome::DeadLettered {
            reason: "no tenant header".into(),
            permanent: true
        }
    );
    let batch: Vec<Message<u32>> = ["a", "b"]
        .into_iter()
        .map(|tenant| TestMessage::new(1u32).header("tenant", tenant).build())
        .collect();
    async fn all_tenants(batch: Vec<Message<u32>>) -> Result<(), HandlerError> {
        match batch.iter().all(|m| m.headers().get("tenant").is_some()) {
            true => Ok(()),
            false => Err(HandlerError::permanent("no tenant header")),
        }
    }
    assert_eq!(test.run_batch(&all_tenants, batch).await, Outcome::Acked);
    let mut without = TestMessage::batch([1u32, 2]);
    without[0] = TestMessage::new(1u32).header("tenant", "a").build();
    assert_eq!(
        test.run_batch(&all_tenants, without).await,
        Outcome::DeadLettered {
            reason: "no tenant header".into(),
            permanent: true
        }
    );
}
