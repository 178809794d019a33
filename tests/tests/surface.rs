//! The user's surface against real Redis: the start position of a new group, entries written by other
//! clients (field maps, no `p`), handler state without statics, environment overrides, and the start
//! errors that name a listener.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use stream_listener::{
    stream_listener, ConsumerBuilder, Fields, Message, Producer, Runtime, RuntimeError, StartFrom,
    State, Topology,
};
use stream_listener_test_support::aio::{connect, wait_until, wait_until_async, xlen};
use stream_listener_test_support::RedisServer;
use stream_listener_tests::{test_runtime, TIMING};
use tokio::time::Instant;

async fn stream_len(url: &str, key: &str) -> u64 {
    xlen(&mut connect(url).await, key).await
}

/// The handler state of the annotated listener below: counts what it handled.
#[derive(Clone, Default)]
struct Tally {
    seen: Arc<Mutex<Vec<u64>>>,
}

// Its stream comes from the environment in the test (`STREAM_LISTENER_ON_TALLIED_STREAM`).
#[stream_listener(stream = "tallied-default", group = "tally", shard_count = 2)]
async fn on_tallied(msg: Message<u64>, State(tally): State<Tally>) -> Result<(), String> {
    tally.seen.lock().unwrap().push(msg.payload);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_from_latest_skips_entries_written_before_the_group_existed() {
    static LATEST: Mutex<BTreeSet<u64>> = Mutex::new(BTreeSet::new());
    static EARLIEST: Mutex<BTreeSet<u64>> = Mutex::new(BTreeSet::new());
    let redis = RedisServer::start();
    let url = redis.url();
    let producer = Producer::connect_creating(&url, "positions", 2)
        .await
        .unwrap();
    for n in 0..10u64 {
        producer.send(format!("k{n}"), &n).await.unwrap();
    }
    let runtime = test_runtime(&url)
        .consumer(
            ConsumerBuilder::new("positions", "from-latest")
                .start_from(StartFrom::Latest)
                .handler(|msg: Message<u64>| async move {
                    LATEST.lock().unwrap().insert(msg.payload);
                    Ok::<(), String>(())
                }),
        )
        .consumer(ConsumerBuilder::new("positions", "from-earliest").handler(
            |msg: Message<u64>| async move {
                EARLIEST.lock().unwrap().insert(msg.payload);
                Ok::<(), String>(())
            },
        ))
        .start()
        .await
        .unwrap();
    // The groups exist once start returns; these are written after.
    for n in 100..110u64 {
        producer.send(format!("k{n}"), &n).await.unwrap();
    }
    wait_until(
        "both groups handled the new entries",
        Duration::from_secs(30),
        || LATEST.lock().unwrap().len() >= 10 && EARLIEST.lock().unwrap().len() >= 20,
    )
    .await;
    runtime.stop().await.unwrap();
    assert_eq!(
        *LATEST.lock().unwrap(),
        (100..110).collect::<BTreeSet<u64>>(),
        "latest: only entries written after the group was created"
    );
    assert_eq!(
        *EARLIEST.lock().unwrap(),
        (0..10).chain(100..110).collect::<BTreeSet<u64>>(),
        "earliest: the backlog too"
    );
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
struct ForeignOrder {
    order_id: String,
    amount_cents: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_written_by_other_clients_are_handled_as_field_maps() {
    static SEEN: Mutex<Vec<(String, ForeignOrder, Option<String>)>> = Mutex::new(Vec::new());
    let redis = RedisServer::start();
    let url = redis.url();
    let producer = Producer::connect_creating(&url, "foreign", 1)
        .await
        .unwrap();
    // As the spec's JVM / Python producers or a person with redis-cli write them: no `p`, no `k`.
    let mut conn = connect(&url).await;
    let _: String = redis::cmd("XADD")
        .arg("foreign:0")
        .arg("*")
        .arg("order_id")
        .arg("o-1")
        .arg("amount_cents")
        .arg("995")
        .arg("source")
        .arg("jvm")
        .query_async(&mut conn)
        .await
        .unwrap();
    producer
        .send_fields("customer-7", &[("order_id", "o-2"), ("amount_cents", "12")])
        .await
        .unwrap();
    // The library's own fields cannot be written as user fields.
    assert!(matches!(
        producer.send_fields("c", &[("k", "x")]).await,
        Err(stream_listener::ProducerError::ReservedField(name)) if name == "k"
    ));
    let runtime = Runtime::new(&url)
        .without_default_logging()
        .without_annotated_listeners()
        .base_member_id("surface-host")
        .group_config(TIMING)
        .consumer(ConsumerBuilder::new("foreign", "billing").fields_handler(
            |msg: Message<Fields>| async move {
                let order: ForeignOrder = msg.payload.deserialize()?;
                let source = msg.payload.str("source").ok().map(str::to_owned);
                SEEN.lock().unwrap().push((msg.key.clone(), order, source));
                Ok::<(), stream_listener::FieldError>(())
            },
        ))
        .start()
        .await
        .unwrap();
    assert_eq!(
        runtime.listener_ids(),
        ["surface-host-billing"],
        "a builder's default member id is {{base}}-{{group}}"
    );
    wait_until("both entries handled", Duration::from_secs(30), || {
        SEEN.lock().unwrap().len() >= 2
    })
    .await;
    runtime.stop().await.unwrap();
    let seen = SEEN.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            (
                String::new(),
                ForeignOrder {
                    order_id: "o-1".into(),
                    amount_cents: 995
                },
                Some("jvm".into())
            ),
            (
                "customer-7".into(),
                ForeignOrder {
                    order_id: "o-2".into(),
                    amount_cents: 12
                },
                None
            ),
        ]
    );
    assert_eq!(
        stream_len(&url, "foreign:dlq").await,
        0,
        "nothing dead-lettered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_handler_still_dead_letters_an_entry_without_a_payload() {
    let redis = RedisServer::start();
    let url = redis.url();
    let mut conn = connect(&url).await;
    Topology::ensure(&mut conn, "nopayload", 1).await.unwrap();
    let _: String = redis::cmd("XADD")
        .arg("nopayload:0")
        .arg("*")
        .arg("order_id")
        .arg("o-1")
        .query_async(&mut conn)
        .await
        .unwrap();
    let runtime = test_runtime(&url)
        .consumer(
            ConsumerBuilder::new("nopayload", "g")
                .handler(|_msg: Message<u64>| async move { Ok::<(), String>(()) }),
        )
        .start()
        .await
        .unwrap();
    wait_until_async("the dead letter", Duration::from_secs(30), || async {
        stream_len(&url, "nopayload:dlq").await != 0
    })
    .await;
    runtime.stop().await.unwrap();
    let letters: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg("nopayload:dlq")
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    let error: String = letters.ids[0].get("dlq_error").unwrap();
    assert!(error.contains("no `p` field"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_reaches_annotated_and_builder_handlers_and_the_environment_renames_the_stream() {
    let redis = RedisServer::start();
    let url = redis.url();
    // The annotated listener's stream is overridden from the environment (only this test starts it
    // with a state; the missing-state test fails before reading anything).
    std::env::set_var("STREAM_LISTENER_ON_TALLIED_STREAM", "tallied-env");
    let tally = Tally::default();
    let builder_calls = Arc::new(AtomicUsize::new(0));
    let runtime = Runtime::new(&url)
        .without_default_logging()
        .group_config(TIMING)
        .state(tally.clone())
        .state(Arc::new(AtomicUsize::new(0)))
        .consumer(
            ConsumerBuilder::new("counted", "g")
                .shard_count(1)
                // The builder's own value wins over the runtime's value of the same type.
                .state(builder_calls.clone())
                .handler_with_state(
                    |_msg: Message<u64>, State(calls): State<Arc<AtomicUsize>>| async move {
                        calls.fetch_add(1, Ordering::SeqCst);
                        Ok::<(), String>(())
                    },
                ),
        )
        .start()
        .await
        .unwrap();
    let tallied = Producer::connect(&url, "tallied-env").await.unwrap();
    assert_eq!(
        tallied.topology().shard_count(),
        2,
        "created by the listener with its shard_count, under the overridden name"
    );
    let counted = Producer::connect(&url, "counted").await.unwrap();
    assert_eq!(counted.topology().shard_count(), 1);
    for n in 0..5u64 {
        tallied.send(format!("k{n}"), &n).await.unwrap();
        counted.send(format!("k{n}"), &n).await.unwrap();
    }
    wait_until(
        "both handlers saw their state",
        Duration::from_secs(30),
        || tally.seen.lock().unwrap().len() >= 5 && builder_calls.load(Ordering::SeqCst) >= 5,
    )
    .await;
    runtime.stop().await.unwrap();
    let mut seen = tally.seen.lock().unwrap().clone();
    seen.sort();
    assert_eq!(seen, [0, 1, 2, 3, 4]);
    assert_eq!(builder_calls.load(Ordering::SeqCst), 5);
    let mut conn = connect(&url).await;
    assert!(
        matches!(
            Topology::load(&mut conn, "tallied-default").await,
            Err(stream_listener::topology::TopologyError::Missing { .. })
        ),
        "the attribute's stream name was overridden"
    );
}

#[tokio::test]
async fn a_handler_whose_state_nobody_registered_is_a_start_error_naming_it() {
    // No Redis needed: the specs are checked before connecting.
    let error = Runtime::new("redis://127.0.0.1:1")
        .without_default_logging()
        .start()
        .await
        .unwrap_err();
    match &error {
        RuntimeError::MissingState { listener, missing } => {
            assert!(listener.contains("surface::on_tallied"), "{error}");
            assert!(missing.type_name.ends_with("Tally"), "{error}");
        }
        other => panic!("expected MissingState, got {other}"),
    }
    assert!(error.to_string().contains("Runtime::state"), "{error}");
}

#[tokio::test]
async fn invalid_builder_settings_are_a_start_error_naming_the_builder() {
    let error = Runtime::new("redis://127.0.0.1:1")
        .without_default_logging()
        .without_annotated_listeners()
        .consumer(
            ConsumerBuilder::new("s", "g")
                .handler(|_msg: Message<u64>| async move { Ok::<(), String>(()) }),
        )
        .consumer(
            ConsumerBuilder::new("s", "h")
                .batch_size(0)
                .handler(|_msg: Message<u64>| async move { Ok::<(), String>(()) }),
        )
        .start()
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "listener ConsumerBuilder::new(\"s\", \"h\") (consumer #2 of the Runtime): batch_size must be at least 1"
    );
    let error = Runtime::new("redis://127.0.0.1:1")
        .without_default_logging()
        .without_annotated_listeners()
        .consumer(ConsumerBuilder::new("s", "g"))
        .start()
        .await
        .unwrap_err();
    assert!(error.to_string().contains("no handler"), "{error}");
}

#[tokio::test]
async fn a_bad_environment_override_is_a_start_error_naming_the_variable() {
    std::env::set_var("STREAM_LISTENER_ENVBAD_CONCURRENCY", "lots");
    let error = Runtime::new("redis://127.0.0.1:1")
        .without_default_logging()
        .without_annotated_listeners()
        .consumer(
            ConsumerBuilder::new("s", "g")
                .name("envbad")
                .handler(|_msg: Message<u64>| async move { Ok::<(), String>(()) }),
        )
        .start()
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("STREAM_LISTENER_ENVBAD_CONCURRENCY=\"lots\" is not a non-negative integer"),
        "{error}"
    );
    // Ignored on request.
    let error = Runtime::new("redis://127.0.0.1:1")
        .without_default_logging()
        .without_annotated_listeners()
        .without_env_overrides()
        .startup_timeout(Duration::from_millis(1))
        .consumer(
            ConsumerBuilder::new("s", "g")
                .name("envbad")
                .handler(|_msg: Message<u64>| async move { Ok::<(), String>(()) }),
        )
        .start()
        .await
        .unwrap_err();
    assert!(
        matches!(error, RuntimeError::Unreachable { .. }),
        "got past the specs: {error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_handler_gets_whole_reads_retries_a_failed_batch_then_dead_letters_it() {
    static HANDLED: Mutex<BTreeSet<u64>> = Mutex::new(BTreeSet::new());
    static SIZES: Mutex<Vec<usize>> = Mutex::new(Vec::new());
    static FAILED_ONCE: AtomicUsize = AtomicUsize::new(0);
    let redis = RedisServer::start();
    let url = redis.url();
    let producer = Producer::connect_creating(&url, "batched", 1)
        .await
        .unwrap();
    for n in 0..30u64 {
        producer.send(format!("k{n}"), &n).await.unwrap();
    }
    let runtime = test_runtime(&url)
        .consumer(
            ConsumerBuilder::new("batched", "g")
                .batch_size(10)
                .failure({
                    let mut policy = stream_listener::FailurePolicy::default();
                    policy.max_deliveries = 2;
                    policy.initial_backoff = Duration::from_millis(50);
                    policy
                })
                .batch_handler(|batch: Vec<Message<u64>>| async move {
                    let values: Vec<u64> = batch.iter().map(|m| m.payload).collect();
                    SIZES.lock().unwrap().push(values.len());
                    // 25 poisons its batch every time; 13's batch fails once, then succeeds.
                    if values.contains(&25) {
                        return Err("poison 25".to_owned());
                    }
                    if values.contains(&13) && FAILED_ONCE.fetch_add(1, Ordering::SeqCst) == 0 {
                        return Err("transient".to_owned());
                    }
                    HANDLED.lock().unwrap().extend(values);
                    Ok(())
                }),
        )
        .start()
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while HANDLED.lock().unwrap().len() < 20 || stream_len(&url, "batched:dlq").await < 10 {
        assert!(
            Instant::now() < deadline,
            "timed out: handled {:?}",
            HANDLED.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    runtime.stop().await.unwrap();
    assert_eq!(*HANDLED.lock().unwrap(), (0..20).collect::<BTreeSet<u64>>());
    let sizes = SIZES.lock().unwrap().clone();
    assert!(sizes.iter().all(|&n| n <= 10), "{sizes:?}");
    assert!(sizes.contains(&10), "whole reads in one call: {sizes:?}");
    assert_eq!(
        FAILED_ONCE.load(Ordering::SeqCst),
        2,
        "the failed batch was retried once"
    );
    // The poisoned batch failed max_deliveries = 2 times, then every entry of it was dead-lettered.
    let mut conn = connect(&url).await;
    let letters: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg("batched:dlq")
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(letters.ids.len(), 10);
    let errors: BTreeSet<String> = letters
        .ids
        .iter()
        .map(|l| l.get::<String>("dlq_error").unwrap())
        .collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors.iter().next().unwrap().contains("poison 25"),
        "{errors:?}"
    );
    assert_eq!(stream_len(&url, "batched:0").await, 30);
}
