//! Per-key order across a stream grow, against real Redis: keys that move to another shard are handled
//! only after their older entries still waiting in the old shard; and a second resize waits for the first
//! one's migration.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};
use stream_listener::coordinator::metadata::GroupConfig;
use stream_listener::routing::shard_for_key;
use stream_listener::topology::{StartFrom, Topology, TopologyError};
use stream_listener::{ConsumerBuilder, Message, Producer, Runtime};
use stream_listener_test_support::RedisServer;
use tokio::time::Instant;

const TIMING: GroupConfig = GroupConfig {
    heartbeat_interval_ms: 100,
    session_timeout_ms: 1_500,
    rebalance_timeout_ms: 3_000,
};

#[derive(Debug, Serialize, Deserialize)]
struct Order {
    key: String,
    seq: u32,
}

async fn connect(url: &str) -> ConnectionManager {
    ConnectionManager::new(redis::Client::open(url).unwrap())
        .await
        .unwrap()
}

async fn wait_until(what: &str, deadline: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn orders(keys: u32, seqs: std::ops::Range<u32>) -> Vec<(String, Order)> {
    (0..keys)
        .flat_map(|k| {
            seqs.clone().map(move |seq| {
                (
                    format!("k{k}"),
                    Order {
                        key: format!("k{k}"),
                        seq,
                    },
                )
            })
        })
        .collect()
}

/// Every handling in order, redeliveries included: `(key, seq)`.
static HANDLED: Mutex<Vec<(String, u32)>> = Mutex::new(Vec::new());

fn distinct_handled() -> usize {
    HANDLED
        .lock()
        .unwrap()
        .iter()
        .collect::<BTreeSet<_>>()
        .len()
}

const KEYS: u32 = 40;
const OLD: u32 = 30;
const NEW: u32 = 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_grow_keeps_per_key_order_for_keys_that_move() {
    let redis = RedisServer::start();
    let url = redis.url();
    let mut conn = connect(&url).await;
    Topology::ensure(&mut conn, "orders", 4).await.unwrap();
    Topology::ensure_group(&mut conn, "orders", "g", StartFrom::Earliest)
        .await
        .unwrap();
    // The backlog: every key's first OLD sequence numbers, in the 4 old shards.
    let old_producer = Producer::new(conn.clone(), "orders").await.unwrap();
    old_producer
        .send_batch(&orders(KEYS, 0..OLD))
        .await
        .unwrap();

    let member = ConsumerBuilder::new("orders", "g")
        .member_id("solo")
        .runtime_max_concurrency(8)
        .batch_size(10)
        .handler(|msg: Message<Order>| async move {
            // Slow enough that the old shards are still draining when the moved keys' entries arrive.
            tokio::time::sleep(Duration::from_millis(5)).await;
            HANDLED
                .lock()
                .unwrap()
                .push((msg.payload.key.clone(), msg.payload.seq));
            Ok::<(), String>(())
        });
    let runtime = Runtime::new(&url)
        .without_annotated_listeners()
        .group_config(TIMING)
        .consumer(member)
        .start()
        .await
        .unwrap();
    wait_until(
        "the backlog starts draining",
        Duration::from_secs(30),
        || distinct_handled() >= 40,
    )
    .await;

    // Grow to 8 shards; a fresh producer routes the next sequence numbers of the same keys with 8 shards,
    // so about half of the keys move to shards 4..7 while their older entries still wait in 0..3.
    let grown = Topology::resize_with_grace(&mut conn, "orders", 8, Duration::from_millis(300))
        .await
        .unwrap();
    let migration = grown.migration().expect("the resize records a migration");
    assert_eq!(migration.previous_shard_count, 4);
    assert_eq!(migration.grace_ms, 300);
    let new_producer = Producer::new(conn.clone(), "orders").await.unwrap();
    let receipts = new_producer
        .send_batch(&orders(KEYS, OLD..OLD + NEW))
        .await
        .unwrap();
    let moved: BTreeSet<String> = (0..KEYS)
        .map(|k| format!("k{k}"))
        .filter(|k| shard_for_key(k.as_bytes(), 4) != shard_for_key(k.as_bytes(), 8))
        .collect();
    assert!(
        moved.len() >= 10 && receipts.iter().any(|r| r.shard >= 4),
        "some keys moved: {moved:?}"
    );
    assert!(
        distinct_handled() < (KEYS * OLD) as usize / 2,
        "the old backlog must still be draining for this test to mean anything"
    );

    let total = (KEYS * (OLD + NEW)) as usize;
    wait_until("every order handled", Duration::from_secs(60), || {
        distinct_handled() == total
    })
    .await;
    runtime.shutdown().await;

    // Per key, the first handling of each sequence number comes in increasing order.
    let handled = HANDLED.lock().unwrap().clone();
    let mut first: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for (key, seq) in &handled {
        if seen.insert((key.as_str(), *seq)) {
            first.entry(key.as_str()).or_default().push(*seq);
        }
    }
    for (key, seqs) in &first {
        assert_eq!(
            seqs.len(),
            (OLD + NEW) as usize,
            "{key}: every entry handled"
        );
        let out_of_order: Vec<(u32, u32)> = seqs
            .windows(2)
            .filter(|w| w[0] > w[1])
            .map(|w| (w[0], w[1]))
            .collect();
        assert!(
            out_of_order.is_empty(),
            "{key} (moved: {}): handled out of order at {out_of_order:?}: {seqs:?}",
            moved.contains(*key)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_resize_waits_for_the_first_migration() {
    let redis = RedisServer::start();
    let url = redis.url();
    let mut conn = connect(&url).await;
    Topology::ensure(&mut conn, "s", 2).await.unwrap();
    Topology::ensure_group(&mut conn, "s", "g", StartFrom::Earliest)
        .await
        .unwrap();
    let producer = Producer::new(conn.clone(), "s").await.unwrap();
    producer.send_batch(&orders(10, 0..2)).await.unwrap();

    // Within the grace period old-layout entries may still be written: no second resize.
    let grown = Topology::resize_with_grace(&mut conn, "s", 4, Duration::from_millis(500))
        .await
        .unwrap();
    assert_eq!(Topology::load(&mut conn, "s").await.unwrap(), grown);
    let err = Topology::resize(&mut conn, "s", 8).await.unwrap_err();
    assert!(
        matches!(&err, TopologyError::MigrationInProgress { reason, .. } if reason.contains("grace")),
        "{err}"
    );
    // After it, the group has still not consumed the old shards below the cut.
    let cut = grown.migration().unwrap().cut_ms();
    let err = loop {
        let err = Topology::resize(&mut conn, "s", 8).await.unwrap_err();
        match &err {
            TopologyError::MigrationInProgress { reason, .. } if reason.contains("grace") => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            _ => break err,
        }
    };
    assert!(
        matches!(&err, TopologyError::MigrationInProgress { reason, cut_ms, .. }
            if reason.contains("group `g`") && *cut_ms == cut),
        "{err}"
    );
    // Consume the old shards (read and acknowledge everything): now it may grow again.
    for shard in 0..2 {
        let stream = format!("s:{shard}");
        let reply: redis::Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg("g")
            .arg("c")
            .arg("COUNT")
            .arg(1000)
            .arg("STREAMS")
            .arg(&stream)
            .arg(">")
            .query_async(&mut conn)
            .await
            .unwrap();
        let ids: Vec<String> = match reply {
            redis::Value::Array(streams) => streams
                .into_iter()
                .flat_map(|s| match s {
                    redis::Value::Array(mut pair) => match pair.pop() {
                        Some(redis::Value::Array(entries)) => entries,
                        _ => Vec::new(),
                    },
                    _ => Vec::new(),
                })
                .filter_map(|e| match e {
                    redis::Value::Array(mut e) => {
                        e.truncate(1);
                        redis::from_redis_value(e.pop()?).ok()
                    }
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        assert!(!ids.is_empty());
        let _: i64 = redis::cmd("XACK")
            .arg(&stream)
            .arg("g")
            .arg(&ids)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let again = Topology::resize(&mut conn, "s", 8).await.unwrap();
    let migration = again.migration().unwrap();
    assert_eq!(
        (again.shard_count(), migration.previous_shard_count),
        (8, 4)
    );
    assert!(migration.resized_at_ms >= cut);
}
