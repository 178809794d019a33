//! Resharding against real Redis: per-key order across a grow (keys that move to another shard are
//! handled only after their older entries still waiting in the old shard); a second resize waits for the
//! first one's migration; and, with producers running during the resize, shrinks and rollbacks lose
//! nothing and keep per-key order, and producers with a stale topology are caught. Each test runs on a
//! single node and on a Redis Cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use stream_listener::connection::Connection;
use stream_listener::producer::ProducerConfig;
use stream_listener::routing::shard_for_key;
use stream_listener::topology::{ResizeKind, Topology, TopologyError};
use stream_listener::{ConsumerBuilder, Message, Producer};
use stream_listener_test_support::aio::{wait_until, wait_until_async};
use stream_listener_tests::{
    on_every_target, orders, start_one, stream_with_group, test_runtime, Order, Target,
};
use tokio::time::Instant;

fn distinct_handled(log: &Log) -> usize {
    log.lock().unwrap().iter().collect::<BTreeSet<_>>().len()
}

const KEYS: u32 = 40;
const OLD: u32 = 30;
const NEW: u32 = 30;

async fn a_grow_keeps_per_key_order_for_keys_that_move(target: Target) {
    let redis = target.start();
    let url = redis.url();
    redis.assert_spread("orders", 4);
    let mut conn = stream_with_group(&redis, "orders", 4, "g").await;
    // Every handling in order, redeliveries included.
    let log: Log = Arc::default();
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
        .handler({
            let log = log.clone();
            move |msg: Message<Order>| {
                let log = log.clone();
                async move {
                    // Slow enough that the old shards are still draining when the moved keys'
                    // entries arrive.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    log.lock()
                        .unwrap()
                        .push((msg.payload.key.clone(), msg.payload.seq));
                    Ok::<(), String>(())
                }
            }
        });
    let runtime = start_one(url, member).await;
    wait_until(
        "the backlog starts draining",
        Duration::from_secs(30),
        || distinct_handled(&log) >= 40,
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
        distinct_handled(&log) < (KEYS * OLD) as usize / 2,
        "the old backlog must still be draining for this test to mean anything"
    );

    let total = (KEYS * (OLD + NEW)) as usize;
    wait_until("every order handled", Duration::from_secs(60), || {
        distinct_handled(&log) == total
    })
    .await;
    let _ = runtime.stop().await;

    // Per key, the first handling of each sequence number comes in increasing order.
    let handled = log.lock().unwrap().clone();
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

async fn a_second_resize_waits_for_the_first_migration(target: Target) {
    let redis = target.start();
    redis.assert_spread("s", 2);
    let mut conn = stream_with_group(&redis, "s", 2, "g").await;
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

// ---------------------------------------------------------------------------------------------------------
// Resizes under traffic: producers keep writing while the stream shrinks, grows or rolls back.
// ---------------------------------------------------------------------------------------------------------

/// Follower period of a runtime with `TIMING`: five heartbeats, at least 200 ms each.
const FOLLOWER_PERIOD: Duration = Duration::from_millis(1_000);

type Log = Arc<Mutex<Vec<(String, u32)>>>;
/// (key, seq) -> (topology version it was routed with, entry id ms).
type Receipts = BTreeMap<(String, u32), (u64, u64)>;

/// Producers that each own a set of keys and write their sequence numbers in order, one pipeline of one
/// entry per key at a time, until stopped; pausable so a test can pick the instant of a resize.
struct Traffic {
    stop: Arc<AtomicBool>,
    paused: Arc<AtomicBool>,
    parked: Arc<AtomicUsize>,
    /// key -> number of sequence numbers written (0..n all acknowledged by Redis).
    sent: Arc<Mutex<BTreeMap<String, u32>>>,
    receipts: Arc<Mutex<Receipts>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    producers: Vec<Producer<Connection>>,
}

impl Traffic {
    fn new() -> Self {
        Traffic {
            stop: Arc::new(AtomicBool::new(false)),
            paused: Arc::new(AtomicBool::new(false)),
            parked: Arc::new(AtomicUsize::new(0)),
            sent: Arc::new(Mutex::new(BTreeMap::new())),
            receipts: Arc::new(Mutex::new(BTreeMap::new())),
            tasks: Vec::new(),
            producers: Vec::new(),
        }
    }

    /// Starts a producer task writing keys `{name}-0 .. {name}-{keys-1}` every `pace`.
    fn spawn(&mut self, producer: Producer<Connection>, name: &str, keys: u32, pace: Duration) {
        let (stop, paused, parked, sent, receipts) = (
            self.stop.clone(),
            self.paused.clone(),
            self.parked.clone(),
            self.sent.clone(),
            self.receipts.clone(),
        );
        let keys: Vec<String> = (0..keys).map(|k| format!("{name}-{k}")).collect();
        self.producers.push(producer.clone());
        self.tasks.push(tokio::spawn(async move {
            let mut seq = 0u32;
            while !stop.load(Ordering::Acquire) {
                if paused.load(Ordering::Acquire) {
                    parked.fetch_add(1, Ordering::AcqRel);
                    while paused.load(Ordering::Acquire) && !stop.load(Ordering::Acquire) {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    parked.fetch_sub(1, Ordering::AcqRel);
                    continue;
                }
                let batch: Vec<(String, Order)> = keys
                    .iter()
                    .map(|k| {
                        (
                            k.clone(),
                            Order {
                                key: k.clone(),
                                seq,
                            },
                        )
                    })
                    .collect();
                let written = producer
                    .send_batch(&batch)
                    .await
                    .unwrap_or_else(|e| panic!("producer {}: {e}", keys[0]));
                {
                    let mut receipts = receipts.lock().unwrap();
                    for (k, r) in keys.iter().zip(written) {
                        let ms = r.id.split('-').next().unwrap().parse().unwrap();
                        receipts.insert((k.clone(), seq), (r.topology_version, ms));
                    }
                }
                {
                    let mut sent = sent.lock().unwrap();
                    for k in &keys {
                        sent.insert(k.clone(), seq + 1);
                    }
                }
                seq += 1;
                tokio::time::sleep(pace).await;
            }
        }));
    }

    /// Parks every producer between two sends.
    async fn pause(&self) {
        self.paused.store(true, Ordering::Release);
        let n = self.tasks.len();
        wait_until("producers parked", Duration::from_secs(10), || {
            self.parked.load(Ordering::Acquire) == n
        })
        .await;
    }

    /// Every producer re-reads the topology now: the worst case for a resize that follows at once, as
    /// they keep writing the old layout for a whole refresh interval.
    async fn refresh(&self) {
        for producer in &self.producers {
            producer.refresh_topology().await.unwrap();
        }
    }

    fn resume(&self) {
        self.paused.store(false, Ordering::Release);
    }

    async fn stop(&mut self) -> BTreeMap<String, u32> {
        self.stop.store(true, Ordering::Release);
        for task in self.tasks.drain(..) {
            task.await.expect("producer task");
        }
        self.sent.lock().unwrap().clone()
    }
}

/// Two members of group `g` with `workers` workers each; handlers log `(key, seq)` and sleep `slow` on
/// shards `slow_shards`.
async fn consumers(
    url: &str,
    stream: &str,
    log: &Log,
    slow_shards: std::ops::Range<u32>,
    slow: Duration,
) -> stream_listener::RunningRuntime {
    let mut runtime = test_runtime(url);
    for member in ["a", "b"] {
        let (log, slow_shards) = (log.clone(), slow_shards.clone());
        runtime = runtime.consumer(
            ConsumerBuilder::new(stream, "g")
                .member_id(member)
                .runtime_max_concurrency(8)
                .batch_size(10)
                .handler(move |msg: Message<Order>| {
                    let (log, slow_shards) = (log.clone(), slow_shards.clone());
                    async move {
                        if slow_shards.contains(&msg.shard) {
                            tokio::time::sleep(slow).await;
                        }
                        log.lock()
                            .unwrap()
                            .push((msg.payload.key.clone(), msg.payload.seq));
                        Ok::<(), String>(())
                    }
                }),
        );
    }
    runtime.start().await.unwrap()
}

/// What the group did with what the producers wrote.
#[derive(Debug)]
struct Verdict {
    sent: u64,
    lost_count: usize,
    /// The first 20 lost.
    lost: Vec<(String, u32)>,
    /// Entries handled (first time) after a later entry of the same key.
    late: Vec<(String, u32)>,
}

/// Waits (bounded) until every sent entry was handled, then compares.
async fn verdict(log: &Log, sent: &BTreeMap<String, u32>, deadline: Duration) -> Verdict {
    let expected: BTreeSet<(String, u32)> = sent
        .iter()
        .flat_map(|(k, &n)| (0..n).map(move |s| (k.clone(), s)))
        .collect();
    let start = Instant::now();
    loop {
        let handled: BTreeSet<(String, u32)> = log.lock().unwrap().iter().cloned().collect();
        if expected.is_subset(&handled) || start.elapsed() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let handled = log.lock().unwrap().clone();
    let mut seen = BTreeSet::new();
    let mut highest: BTreeMap<&str, u32> = BTreeMap::new();
    let mut late = Vec::new();
    for (key, seq) in &handled {
        if !seen.insert((key.clone(), *seq)) {
            continue;
        }
        match highest.get(key.as_str()) {
            Some(&h) if h > *seq => late.push((key.clone(), *seq)),
            _ => {
                highest.insert(key, *seq);
            }
        }
    }
    Verdict {
        sent: expected.len() as u64,
        lost_count: expected.iter().filter(|e| !seen.contains(*e)).count(),
        lost: expected
            .into_iter()
            .filter(|e| !seen.contains(e))
            .take(20)
            .collect(),
        late,
    }
}

/// Waits until group `g` has read and acknowledged everything in `shards` of `stream`.
async fn drained(conn: &mut Connection, stream: &str, shards: std::ops::Range<u32>) {
    let what = format!("{stream} {shards:?} to drain");
    wait_until_async(&what, Duration::from_secs(30), || {
        let (mut conn, shards) = (conn.clone(), shards.clone());
        async move {
            for shard in shards {
                let groups: Vec<std::collections::HashMap<String, redis::Value>> =
                    redis::cmd("XINFO")
                        .arg("GROUPS")
                        .arg(format!("{stream}:{shard}"))
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                let busy = groups.iter().any(|g| {
                    ["lag", "pending"].iter().any(|f| {
                        !redis::from_redis_value::<i64>(g[*f].clone()).is_ok_and(|n| n == 0)
                    })
                });
                if busy {
                    return false;
                }
            }
            true
        }
    })
    .await;
}

/// Group `g`'s shard count, as its metadata header says.
async fn group_shard_count(conn: &mut Connection, stream: &str) -> u32 {
    let json: Option<String> = redis::cmd("GET")
        .arg(format!("sl:{{{stream}/g}}:meta"))
        .query_async(conn)
        .await
        .unwrap();
    json.and_then(|j| serde_json::from_str::<serde_json::Value>(&j).ok())
        .and_then(|v| v["shardCount"].as_u64())
        .unwrap_or(0) as u32
}

async fn wait_for_group_shard_count(conn: &mut Connection, stream: &str, n: u32) {
    let what = format!("the group to follow to {n} shards");
    wait_until_async(&what, Duration::from_secs(20), || {
        let mut conn = conn.clone();
        async move { group_shard_count(&mut conn, stream).await == n }
    })
    .await;
}

/// Stale-layout writes group `g` detected (Redis-visible counter).
async fn stale_writes(conn: &mut Connection, stream: &str) -> u64 {
    let counts = Topology::stale_writes(conn, stream).await.unwrap();
    counts.get("g").copied().unwrap_or(0)
}

async fn redis_ms(conn: &mut Connection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    secs * 1000 + micros / 1000
}

/// A retired shard: empty, and any write to it fails.
async fn retired(conn: &mut Connection, key: &str) -> bool {
    let len: u64 = redis::cmd("XLEN").arg(key).query_async(conn).await.unwrap();
    let write: redis::RedisResult<Option<String>> = redis::cmd("XADD")
        .arg(key)
        .arg("NOMKSTREAM")
        .arg("*")
        .arg("k")
        .arg("x")
        .query_async(conn)
        .await;
    len == 0 && write.is_err()
}

fn assert_clean(what: &str, v: &Verdict) {
    eprintln!(
        "{what}: {} sent, {} lost, {} order violations",
        v.sent,
        v.lost_count,
        v.late.len()
    );
    assert!(
        v.sent > 500,
        "{what}: too little traffic to mean anything: {v:?}"
    );
    assert!(
        v.lost.is_empty() && v.late.is_empty(),
        "{what}: {} lost (first: {:?}), {} per-key order violations (first: {:?})",
        v.lost_count,
        v.lost,
        v.late.len(),
        &v.late[..v.late.len().min(10)]
    );
}

/// A shrink 16 -> 8 lands just before a follower tick while producers (default 1 s refresh, inside the
/// 2 s grace) keep writing the old layout: the group must keep reading the removed shards until they are
/// drained past the cut, then retire them.
async fn a_shrink_just_before_a_follower_tick_loses_nothing(target: Target) {
    let redis = target.start();
    let url = redis.url();
    redis.assert_spread("tick", 16);
    let mut conn = stream_with_group(&redis, "tick", 16, "g").await;
    let log: Log = Arc::default();
    let mut traffic = Traffic::new();
    for p in ["p", "q"] {
        let producer = Producer::new(conn.clone(), "tick").await.unwrap();
        traffic.spawn(producer, p, 20, Duration::from_millis(20));
    }
    let runtime = consumers(url, "tick", &log, 0..0, Duration::ZERO).await;
    // The followers sleep one period first, so they tick at about started + k * period.
    let started = Instant::now();
    wait_until("traffic flows", Duration::from_secs(10), || {
        log.lock().unwrap().len() > 100
    })
    .await;
    // (Today's shrink refuses a backlog in the removed shards: park the producers until the group drained
    // them, so the shrink goes through; they resume at once with their old topology.)
    traffic.pause().await;
    drained(&mut conn, "tick", 8..16).await;
    let mut tick = started + FOLLOWER_PERIOD;
    while tick < Instant::now() + Duration::from_millis(200) {
        tick += FOLLOWER_PERIOD;
    }
    tokio::time::sleep_until(tick - Duration::from_millis(120)).await;
    traffic.refresh().await;
    let shrunk = Topology::resize(&mut conn, "tick", 8).await.unwrap();
    traffic.resume();
    assert_eq!(shrunk.shard_count(), 8);
    // Producers write through the grace (2 s) and beyond.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let sent = traffic.stop().await;
    let v = verdict(&log, &sent, Duration::from_secs(30)).await;
    assert_clean("shrink before a follower tick", &v);
    // Drained and past the cut: retired, and the group followed.
    wait_for_group_shard_count(&mut conn, "tick", 8).await;
    for shard in 8..16 {
        assert!(retired(&mut conn, &format!("tick:{shard}")).await);
    }
    let _ = runtime.stop().await;
}

/// A shrink 16 -> 8 while the removed shards' handlers are slow: keys whose shard was removed must wait
/// for their older entries there.
async fn a_shrink_with_slow_removed_shards_keeps_per_key_order(target: Target) {
    let redis = target.start();
    let url = redis.url();
    redis.assert_spread("slow", 16);
    let mut conn = stream_with_group(&redis, "slow", 16, "g").await;
    let log: Log = Arc::default();
    let mut traffic = Traffic::new();
    for p in ["p", "q"] {
        let producer = Producer::new(conn.clone(), "slow").await.unwrap();
        traffic.spawn(producer, p, 16, Duration::from_millis(40));
    }
    let runtime = consumers(url, "slow", &log, 8..16, Duration::from_millis(30)).await;
    wait_until("traffic flows", Duration::from_secs(10), || {
        log.lock().unwrap().len() > 100
    })
    .await;
    traffic.pause().await;
    drained(&mut conn, "slow", 8..16).await;
    traffic.refresh().await;
    Topology::resize_with_grace(&mut conn, "slow", 8, Duration::from_millis(1_500))
        .await
        .unwrap();
    traffic.resume();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let sent = traffic.stop().await;
    let v = verdict(&log, &sent, Duration::from_secs(60)).await;
    assert_clean("shrink with slow removed shards", &v);
    wait_for_group_shard_count(&mut conn, "slow", 8).await;
    let _ = runtime.stop().await;
}

/// A grow 8 -> 16 whose new shards hold a backlog (slow handlers there) is rolled back while producers
/// keep writing: the new shards drain before they are retired, moved keys wait for them, nothing is lost.
async fn a_rollback_of_a_grow_with_entries_in_the_new_shards_sticks_and_loses_nothing(
    target: Target,
) {
    let redis = target.start();
    let url = redis.url();
    redis.assert_spread("back", 8);
    let mut conn = stream_with_group(&redis, "back", 8, "g").await;
    let log: Log = Arc::default();
    let mut traffic = Traffic::new();
    for p in ["p", "q"] {
        let producer = Producer::new(conn.clone(), "back").await.unwrap();
        traffic.spawn(producer, p, 16, Duration::from_millis(40));
    }
    let runtime = consumers(url, "back", &log, 8..16, Duration::from_millis(30)).await;
    wait_until("traffic flows", Duration::from_secs(10), || {
        log.lock().unwrap().len() > 100
    })
    .await;
    let grace = Duration::from_millis(500);
    Topology::resize_with_grace(&mut conn, "back", 16, grace)
        .await
        .unwrap();
    wait_for_group_shard_count(&mut conn, "back", 16).await;
    // Roll back as soon as the grow's migration allows it, with producers running and the new shards
    // holding entries.
    let start = Instant::now();
    let rolled = loop {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the rollback was never accepted"
        );
        match rollback(&mut conn, "back", grace).await {
            Ok(t) => break t,
            Err(TopologyError::MigrationInProgress { .. }) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("rollback refused: {e}"),
        }
    };
    assert_eq!(rolled.shard_count(), 8);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let sent = traffic.stop().await;
    let v = verdict(&log, &sent, Duration::from_secs(60)).await;
    assert_clean("rollback of a grow", &v);
    // It sticks: the group ends at 8 shards and stays there.
    wait_for_group_shard_count(&mut conn, "back", 8).await;
    for shard in 8..16 {
        assert!(retired(&mut conn, &format!("back:{shard}")).await);
    }
    tokio::time::sleep(FOLLOWER_PERIOD * 2).await;
    assert_eq!(group_shard_count(&mut conn, "back").await, 8);
    assert_rolled_back(&mut conn, "back").await;
    // A later grow starts the retired shards afresh: writable, read by the group.
    let start = Instant::now();
    loop {
        match Topology::resize_with_grace(&mut conn, "back", 16, grace).await {
            Ok(_) => break,
            Err(TopologyError::MigrationInProgress { .. }) => {
                assert!(start.elapsed() < Duration::from_secs(20), "never regrown");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    let producer = Producer::new(conn.clone(), "back").await.unwrap();
    let receipts = producer
        .send_batch(&orders(KEYS, 1_000..1_001))
        .await
        .unwrap();
    assert!(receipts.iter().any(|r| r.shard >= 8));
    let log2 = log.clone();
    wait_until(
        "the regrown shards are read",
        Duration::from_secs(20),
        || {
            log2.lock()
                .unwrap()
                .iter()
                .filter(|(_, seq)| *seq == 1_000)
                .count()
                == KEYS as usize
        },
    )
    .await;
    let _ = runtime.stop().await;
}

/// A producer whose topology refresh (60 s) is much slower than the grace keeps writing the old layout
/// after a shrink: its writes to removed shards must be read or fail loudly (it re-routes), never vanish.
async fn a_stale_producer_during_a_shrink_loses_nothing(target: Target) {
    let redis = target.start();
    let url = redis.url();
    redis.assert_spread("stale", 16);
    let mut conn = stream_with_group(&redis, "stale", 16, "g").await;
    let log: Log = Arc::default();
    let mut traffic = Traffic::new();
    let fresh = Producer::new(conn.clone(), "stale").await.unwrap();
    traffic.spawn(fresh, "fresh", 16, Duration::from_millis(20));
    let config = ProducerConfig {
        refresh_interval: Duration::from_secs(60),
        ..ProducerConfig::default()
    };
    let stale = Producer::with_config(conn.clone(), "stale", config)
        .await
        .unwrap();
    traffic.spawn(stale, "stale", 16, Duration::from_millis(20));
    let runtime = consumers(url, "stale", &log, 0..0, Duration::ZERO).await;
    wait_until("traffic flows", Duration::from_secs(10), || {
        log.lock().unwrap().len() > 100
    })
    .await;
    traffic.pause().await;
    drained(&mut conn, "stale", 8..16).await;
    Topology::resize_with_grace(&mut conn, "stale", 8, Duration::from_millis(500))
        .await
        .unwrap();
    traffic.resume();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let sent = traffic.stop().await;
    let v = verdict(&log, &sent, Duration::from_secs(30)).await;
    assert_clean("stale producer on a shrink", &v);
    assert!(
        stale_writes(&mut conn, "stale").await > 0,
        "the stale producer's late writes were detected"
    );
    wait_for_group_shard_count(&mut conn, "stale", 8).await;
    let _ = runtime.stop().await;
}

/// The same on a grow 8 -> 16, with the old shards slow: the stale producer's late old-layout writes can
/// be handled after its newer entries in the new shards. Each such order violation must be detected and
/// counted (nothing lost either).
async fn a_stale_producer_during_a_grow_is_detected(target: Target) {
    // The metric, too (see `stale_writes_counted`): counted per stream, so each target's run has a stream
    // name of its own.
    stale_writes_counted("");
    let stream = match target {
        Target::Single => "late",
        Target::Cluster => "late-on-a-cluster",
    };
    let redis = target.start();
    let url = redis.url();
    redis.assert_spread(stream, 8);
    let mut conn = stream_with_group(&redis, stream, 8, "g").await;
    let log: Log = Arc::default();
    let config = ProducerConfig {
        refresh_interval: Duration::from_secs(60),
        ..ProducerConfig::default()
    };
    let stale = Producer::with_config(conn.clone(), stream, config)
        .await
        .unwrap();
    let mut traffic = Traffic::new();
    traffic.spawn(stale.clone(), "stale", 16, Duration::from_millis(20));
    let runtime = consumers(url, stream, &log, 0..8, Duration::from_millis(30)).await;
    wait_until("traffic flows", Duration::from_secs(10), || {
        log.lock().unwrap().len() > 50
    })
    .await;
    let grown = Topology::resize_with_grace(&mut conn, stream, 16, Duration::from_millis(300))
        .await
        .unwrap();
    // It keeps writing the old layout until a second past the cut, then finally refreshes.
    let cut = grown.migration().unwrap().cut_ms();
    wait_until_async("Redis time past the cut", Duration::from_secs(10), || {
        let mut conn = conn.clone();
        async move { redis_ms(&mut conn).await >= cut + 1_000 }
    })
    .await;
    stale.refresh_topology().await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let sent = traffic.stop().await;
    let v = verdict(&log, &sent, Duration::from_secs(60)).await;
    assert!(v.sent > 500 && v.lost.is_empty(), "{v:?}");
    let detected = stale_writes(&mut conn, stream).await;
    // Ground truth from the receipts: written with the old version at or past the cut, for a key the grow
    // moved (a key that stays in its shard is in order whatever layout routed it).
    let receipts = traffic.receipts.lock().unwrap().clone();
    let stale: BTreeSet<(String, u32)> = receipts
        .iter()
        .filter(|((key, _), &(version, ms))| {
            version < grown.version()
                && ms >= cut
                && shard_for_key(key.as_bytes(), 8) != shard_for_key(key.as_bytes(), 16)
        })
        .map(|(entry, _)| entry.clone())
        .collect();
    let undetectable: Vec<_> = v.late.iter().filter(|e| !stale.contains(*e)).collect();
    assert!(
        undetectable.is_empty(),
        "order violations that are not stale-layout writes: {undetectable:?}"
    );
    eprintln!(
        "stale producer on a grow: {} sent, {} lost, {} order violations, {} stale writes, {detected} \
         detected",
        v.sent,
        v.lost_count,
        v.late.len(),
        stale.len()
    );
    assert!(
        detected >= stale.len() as u64 && stale.len() >= v.late.len(),
        "{} order violations, {} stale writes, only {detected} detected (cut {cut})",
        v.late.len(),
        stale.len()
    );
    assert!(
        detected > 0,
        "the stale producer's late writes were detected"
    );
    let metric = stale_writes_counted(stream);
    assert!(
        metric >= detected,
        "{} counted {metric}, Redis counted {detected}",
        stream_listener::metrics::STALE_WRITES
    );
    let _ = runtime.stop().await;
}

/// What [`STALE_WRITES`](stream_listener::metrics::STALE_WRITES) counted for `stream` so far, from the
/// only recorder of this test binary (installed by the first call; other tests' metrics land in it
/// harmlessly). A snapshot resets the recorder's counters, so the totals are kept here, for every stream.
fn stale_writes_counted(stream: &str) -> u64 {
    type Counted = (Snapshotter, BTreeMap<String, u64>);
    static COUNTED: OnceLock<Mutex<Counted>> = OnceLock::new();
    let counted = COUNTED.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this test binary");
        Mutex::new((snapshotter, BTreeMap::new()))
    });
    let mut counted = counted.lock().unwrap();
    let (snapshotter, totals) = &mut *counted;
    for (key, .., value) in snapshotter.snapshot().into_vec() {
        let DebugValue::Counter(n) = value else {
            continue;
        };
        if key.key().name() != stream_listener::metrics::STALE_WRITES {
            continue;
        }
        for label in key.key().labels().filter(|l| l.key() == "stream") {
            *totals.entry(label.value().to_owned()).or_default() += n;
        }
    }
    totals.get(stream).copied().unwrap_or(0)
}

on_every_target!(a_second_resize_waits_for_the_first_migration);
on_every_target!(
    worker_threads = 4;
    a_grow_keeps_per_key_order_for_keys_that_move,
    a_shrink_just_before_a_follower_tick_loses_nothing,
    a_shrink_with_slow_removed_shards_keeps_per_key_order,
    a_rollback_of_a_grow_with_entries_in_the_new_shards_sticks_and_loses_nothing,
    a_stale_producer_during_a_shrink_loses_nothing,
    a_stale_producer_during_a_grow_is_detected,
);

async fn rollback(
    conn: &mut Connection,
    stream: &str,
    grace: Duration,
) -> Result<Topology, TopologyError> {
    Topology::rollback_with_grace(conn, stream, grace).await
}

/// The record and the stream's audit say the last resize was a rollback, and its shards are retired.
async fn assert_rolled_back(conn: &mut Connection, stream: &str) {
    let topology = Topology::load(conn, stream).await.unwrap();
    assert_eq!(
        topology.migration().unwrap().kind,
        ResizeKind::Rollback,
        "{topology:?}"
    );
    assert!(topology.draining_shards().is_empty(), "{topology:?}");
    let events: Vec<(String, u32, u32)> = Topology::history(conn, stream, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.event, e.from, e.to))
        .collect();
    assert_eq!(
        events,
        [
            ("RESIZED".to_owned(), 8, 16),
            ("ROLLED_BACK".to_owned(), 16, 8),
            ("SHARDS_RETIRED".to_owned(), 16, 8)
        ]
    );
}
