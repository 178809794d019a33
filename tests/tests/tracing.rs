//! The handler runs inside a span per message that says where the entry came from, and a healthy idle
//! member logs nothing at INFO or above. The shared log capture (`stream_listener_tests::logs`) records
//! every event with its span's fields.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use stream_listener::{ConsumerBuilder, Message};
use stream_listener_test_support::aio::connect;
use stream_listener_test_support::RedisServer;
use stream_listener_tests::logs::{self, events, Captured};
use stream_listener_tests::{producer, test_runtime, TIMING};
use tokio::time::Instant;
use tracing::Level;

#[derive(Debug, Serialize, Deserialize)]
struct Job {
    key: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_runs_inside_a_span_per_message_and_an_idle_member_stays_quiet() {
    logs::capture();
    let mut redis = RedisServer::start();
    let url = redis.url();
    let producer = producer(&url, "traced", 2).await;
    let receipt = producer
        .send(
            "customer-42",
            &Job {
                key: "customer-42".into(),
            },
        )
        .await
        .unwrap();
    let consumer = ConsumerBuilder::new("traced", "g")
        .member_id("solo")
        .handler(|msg: Message<Job>| async move {
            tokio::task::yield_now().await;
            tracing::info!(key = %msg.payload.key, "handling");
            Ok::<(), String>(())
        });
    let runtime = test_runtime(&url)
        .shutdown_timeout(Duration::from_secs(2))
        .consumer(consumer)
        .start()
        .await
        .unwrap();
    let start = Instant::now();
    let handled = loop {
        if let Some(e) = events()
            .into_iter()
            .find(|e| e.fields.0.get("message").is_some_and(|m| m == "handling"))
        {
            break e;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "never handled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (name, span) = handled.span.expect("inside a span");
    assert_eq!(name, "message");
    // Its own target: `RUST_LOG=info,stream_listener::message=off` turns it off (see the README).
    assert_eq!(
        handled.span_target.as_deref(),
        Some("stream_listener::message")
    );
    let span = span.0;
    assert_eq!(span["stream"], "traced");
    assert_eq!(span["group"], "g");
    assert_eq!(span["shard"], receipt.shard.to_string());
    assert_eq!(span["entry_id"], receipt.id);
    assert_eq!(span["key"], "customer-42");
    assert_eq!(span["member"], "solo");
    assert_eq!(span["delivery_count"], "1");
    assert!(span["epoch"].parse::<i64>().unwrap() > 0, "{span:?}");

    // Idle from here on: over a second of heartbeats and idle waits, nothing at INFO or above.
    let before = events().len();
    let idle_until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < idle_until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let loud: Vec<Captured> = events()[before..]
        .iter()
        .filter(|e| e.target.starts_with("stream_listener") && e.level <= Level::INFO)
        .cloned()
        .collect();
    assert!(loud.is_empty(), "an idle member logged: {loud:#?}");

    // The join and the first assignment were logged at INFO, once each, with the shards.
    let info = |message: &str| -> Vec<Captured> {
        events()
            .into_iter()
            .filter(|e| {
                e.level == Level::INFO && e.fields.0.get("message").is_some_and(|m| m == message)
            })
            .collect()
    };
    assert_eq!(info("joined the group").len(), 1, "{:#?}", events());
    let assigned = info("assignment changed");
    assert_eq!(assigned.len(), 1, "{assigned:#?}");
    assert_eq!(assigned[0].fields.0["assigned"], "[0, 1]");
    assert_eq!(assigned[0].fields.0["revoked"], "[]");

    // A fence by the operator: the member logs it with the shards it drops, rejoins and is assigned
    // its shards again, each at INFO.
    let mut store =
        stream_listener::store::GroupStore::create(connect(&url).await, "traced", "g", 2, TIMING)
            .unwrap();
    store
        .command(stream_listener::coordinator::AdminCommand::FenceMember(
            "solo".into(),
        ))
        .await
        .unwrap()
        .unwrap();
    let start = Instant::now();
    while info("joined the group").len() < 2 || info("assignment changed").len() < 3 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no rejoin: {:#?}",
            events()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let fenced = info("ownership invalid: dropping every shard and rejoining");
    assert_eq!(fenced.len(), 1, "{fenced:#?}");
    assert_eq!(fenced[0].fields.0["shards"], "[0, 1]");
    assert_eq!(fenced[0].fields.0["status"], "FencedMemberEpoch");
    let changes = info("assignment changed");
    assert_eq!(changes[1].fields.0["revoked"], "[0, 1]", "{changes:#?}");
    assert_eq!(changes[2].fields.0["assigned"], "[0, 1]", "{changes:#?}");

    // Redis goes away and comes back: failed heartbeats are WARNs, the first one through again an INFO.
    redis.kill();
    let start = Instant::now();
    while !events().iter().any(|e| {
        e.level == Level::WARN
            && e.fields
                .0
                .get("message")
                .is_some_and(|m| m.starts_with("heartbeat"))
    }) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no failed heartbeat"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    redis.restart();
    let start = Instant::now();
    let recovered = loop {
        if let Some(e) = info("heartbeat recovered").pop() {
            break e;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no recovery: {:#?}",
            events()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        recovered.fields.0["failures"].parse::<u32>().unwrap() >= 1,
        "{recovered:#?}"
    );

    let _ = runtime.stop().await;

    // Every line the member's heartbeat loop, store and consumer logged says which member, stream and
    // group it is about; and every heartbeat had its span, at DEBUG.
    let all = events();
    let member_lines: Vec<&Captured> = all
        .iter()
        .filter(|e| {
            [
                "stream_listener::member",
                "stream_listener::consumer",
                "stream_listener::store",
            ]
            .iter()
            .any(|t| e.target.starts_with(t))
        })
        .collect();
    assert!(member_lines.len() >= 5, "{all:#?}");
    for line in member_lines {
        assert_eq!(
            line.scope.get("member").map(String::as_str),
            Some("solo"),
            "{line:#?}"
        );
        assert_eq!(
            line.scope.get("stream").map(String::as_str),
            Some("traced"),
            "{line:#?}"
        );
        assert_eq!(
            line.scope.get("group").map(String::as_str),
            Some("g"),
            "{line:#?}"
        );
    }
    let spans = logs::spans();
    assert!(
        spans.contains(&("heartbeat".to_owned(), Level::DEBUG)),
        "{spans:?}"
    );
    assert!(
        spans.contains(&("member".to_owned(), Level::ERROR)),
        "{spans:?}"
    );
}
