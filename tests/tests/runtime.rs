//! The developer surface end to end, against real Redis: annotated listeners (four members from
//! `concurrency = 4`, two listeners side by side), the builder (one member, several workers), and a
//! graceful shutdown that loses nothing. Each test runs on a single node and on a Redis Cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stream_listener::clock::StoreMillis;
use stream_listener::coordinator::projection::GroupState;
use stream_listener::store::GroupStore;
use stream_listener::topology::Topology;
use stream_listener::{stream_listener, ConsumerBuilder, Message, Producer, Runtime};
use stream_listener_test_support::aio::{wait_until, wait_until_async, xpending_count};
use stream_listener_test_support::RedisServer;
use stream_listener_tests::{
    connection, on_every_target, orders, producer, start_one, test_runtime, Order, Target, TIMING,
};
use tokio::time::Instant;

/// What the annotated handlers of this test binary saw, per stream: `key:seq`. One test at a time
/// uses them (see [`ANNOTATED`]).
static HANDLED: Mutex<BTreeMap<&'static str, BTreeSet<String>>> = Mutex::new(BTreeMap::new());

fn record(stream: &'static str, order: &Order) {
    HANDLED
        .lock()
        .unwrap()
        .entry(stream)
        .or_default()
        .insert(format!("{}:{}", order.key, order.seq));
}

fn handled(stream: &str) -> usize {
    HANDLED.lock().unwrap().get(stream).map_or(0, BTreeSet::len)
}

#[stream_listener(
    stream = "annotated",
    group = "billing",
    concurrency = 4,
    batch_size = 10
)]
async fn on_annotated(msg: Message<Order>) -> Result<(), String> {
    record("annotated", &msg.payload);
    Ok(())
}

#[stream_listener(stream = "second", group = "audit")]
async fn on_second(msg: Message<Order>) -> Result<(), String> {
    record("second", &msg.payload);
    Ok(())
}

async fn produce(url: &str, stream: &str, shards: u32, keys: u32, per_key: u32) {
    let producer = producer(url, stream, shards).await;
    producer
        .send_batch(&orders(keys, 0..per_key))
        .await
        .unwrap();
}

async fn projection(
    url: &str,
    stream: &str,
    group: &str,
) -> stream_listener::coordinator::projection::GroupProjection {
    let mut store = GroupStore::create(connection(url).await, stream, group, 1, TIMING).unwrap();
    store.load().await.unwrap().1.projection(StoreMillis(0))
}

async fn pending(url: &str, stream: &str, group: &str, shards: u32) -> i64 {
    let mut conn = connection(url).await;
    let mut total = 0;
    for shard in 0..shards {
        total += xpending_count(&mut conn, &format!("{stream}:{shard}"), group).await;
    }
    total
}

/// The annotated listeners' streams are fixed and [`HANDLED`] is global: their runs on each target take
/// turns.
static ANNOTATED: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn annotated_listeners_run_four_members_side_by_side_with_a_second_listener(target: Target) {
    let _turn = ANNOTATED.lock().await;
    HANDLED.lock().unwrap().clear();
    let redis = target.start();
    let url = redis.url().to_owned();
    redis.assert_spread("annotated", 8);
    produce(&url, "annotated", 8, 20, 10).await;
    produce(&url, "second", 2, 5, 10).await;
    let runtime = Runtime::new(&url)
        .without_default_logging()
        .base_member_id("host-a")
        .group_config(TIMING)
        .start()
        .await
        .unwrap();
    let mut ids = runtime.listener_ids();
    ids.sort();
    assert_eq!(
        ids,
        [
            "host-a-m0",
            "host-a-m0",
            "host-a-m1",
            "host-a-m2",
            "host-a-m3"
        ]
    );
    wait_until("every order handled", Duration::from_secs(30), || {
        handled("annotated") == 200 && handled("second") == 50
    })
    .await;
    let start = Instant::now();
    loop {
        let view = projection(&url, "annotated", "billing").await;
        let members: Vec<&str> = view.members.iter().map(|m| m.member_id.as_str()).collect();
        if view.state == GroupState::Stable
            && members == ["host-a-m0", "host-a-m1", "host-a-m2", "host-a-m3"]
        {
            assert!(
                view.members.iter().all(|m| m.assigned.len() == 2),
                "8 shards over 4 members"
            );
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "not stable: {view:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = runtime.stop().await;
    let view = projection(&url, "annotated", "billing").await;
    assert!(
        view.members.is_empty(),
        "every member left: {:?}",
        view.members
    );
    assert_eq!(
        pending(&url, "annotated", "billing", 8).await,
        0,
        "everything acknowledged"
    );
    assert_eq!(pending(&url, "second", "audit", 2).await, 0);
}

/// `key:seq` of what a handler saw.
type Seen = Arc<Mutex<BTreeSet<String>>>;

fn seen_len(seen: &Seen) -> usize {
    seen.lock().unwrap().len()
}

/// A handler recording into `seen`.
fn recording(seen: &Seen) -> impl Fn(Message<Order>) -> std::future::Ready<Result<(), String>> {
    let seen = seen.clone();
    move |msg: Message<Order>| {
        seen.lock()
            .unwrap()
            .insert(format!("{}:{}", msg.payload.key, msg.payload.seq));
        std::future::ready(Ok(()))
    }
}

async fn builder_registers_one_member_with_local_workers_and_shutdown_loses_nothing(
    target: Target,
) {
    let seen = Seen::default();
    let redis = target.start();
    let url = redis.url().to_owned();
    redis.assert_spread("built", 8);
    produce(&url, "built", 8, 30, 20).await;
    let builder = || {
        let seen = seen.clone();
        ConsumerBuilder::new("built", "g")
            .member_id("solo")
            .runtime_max_concurrency(3)
            .batch_size(5)
            .handler(move |msg: Message<Order>| {
                let seen = seen.clone();
                async move {
                    tokio::time::sleep(Duration::from_micros(200)).await;
                    seen.lock()
                        .unwrap()
                        .insert(format!("{}:{}", msg.payload.key, msg.payload.seq));
                    Ok::<(), String>(())
                }
            })
    };
    let start = || test_runtime(&url).consumer(builder()).start();
    let runtime = start().await.unwrap();
    assert_eq!(runtime.listener_ids(), ["solo"]);
    wait_until("some orders handled", Duration::from_secs(30), || {
        seen_len(&seen) >= 100
    })
    .await;
    let view = projection(&url, "built", "g").await;
    assert_eq!(view.members.len(), 1, "one member, however many workers");
    assert_eq!(view.members[0].runtime_max_concurrency, 3);
    // Stop mid-stream: in-flight work is finished and acknowledged, the rest stays for the next run.
    let _ = runtime.stop().await;
    assert!(
        projection(&url, "built", "g").await.members.is_empty(),
        "left the group"
    );
    let runtime = start().await.unwrap();
    wait_until("every order handled", Duration::from_secs(30), || {
        seen_len(&seen) == 600
    })
    .await;
    let _ = runtime.stop().await;
    assert_eq!(
        pending(&url, "built", "g", 8).await,
        0,
        "nothing left pending"
    );
}

async fn a_resized_stream_is_followed_by_its_groups_and_a_shrink_never_strands_entries(
    target: Target,
) {
    let seen = Seen::default();
    let redis = target.start();
    let url = redis.url().to_owned();
    redis.assert_spread("grown", 4);
    produce(&url, "grown", 4, 10, 10).await;
    let member = ConsumerBuilder::new("grown", "g")
        .member_id("solo")
        .handler(recording(&seen));
    let runtime = start_one(&url, member).await;
    wait_until("the first 100", Duration::from_secs(30), || {
        seen_len(&seen) == 100
    })
    .await;
    let mut conn = redis.connect().await;
    Topology::resize(&mut conn, "grown", 8).await.unwrap();
    // A fresh producer routes over 8 shards; the group must follow or half of these are never read.
    let producer = Producer::new(conn.clone(), "grown").await.unwrap();
    let batch: Vec<(String, Order)> = (0..100)
        .map(|i| {
            (
                format!("n{i}"),
                Order {
                    key: format!("n{i}"),
                    seq: 0,
                },
            )
        })
        .collect();
    let receipts = producer.send_batch(&batch).await.unwrap();
    assert!(
        receipts.iter().any(|r| r.shard >= 4),
        "some keys moved to the new shards"
    );
    wait_until("every order handled", Duration::from_secs(30), || {
        seen_len(&seen) == 200
    })
    .await;
    assert_eq!(projection(&url, "grown", "g").await.shard_count, 8);
    let _ = runtime.stop().await;

    // With nobody reading, a shrink strands nothing either: the removed shards keep their entries and stay
    // readable (draining) until every group consumed them, and nothing retires them before. (After the
    // grow's cut, so that its migration is finished.)
    let cut = Topology::load(&mut conn, "grown")
        .await
        .unwrap()
        .migration()
        .unwrap()
        .cut_ms();
    wait_until_async("Redis time past the cut", Duration::from_secs(10), || {
        let mut conn = conn.clone();
        async move {
            let (secs, micros): (u64, u64) =
                redis::cmd("TIME").query_async(&mut conn).await.unwrap();
            secs * 1000 + micros / 1000 > cut
        }
    })
    .await;
    let stranded: Vec<(String, Order)> = (0..50)
        .map(|i| {
            (
                format!("s{i}"),
                Order {
                    key: format!("s{i}"),
                    seq: 0,
                },
            )
        })
        .collect();
    producer.send_batch(&stranded).await.unwrap();
    let shrunk = Topology::resize_with_grace(&mut conn, "grown", 4, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!((shrunk.shard_count(), shrunk.read_shard_count()), (4, 8));
    let (after, state) = Topology::retire_drained(&mut conn, "grown").await.unwrap();
    assert!(
        matches!(&state, stream_listener::topology::DrainState::Draining(reason) if reason.contains("group `g` has not consumed")),
        "{state:?}"
    );
    assert_eq!(after.read_shard_count(), 8);
    let err = Topology::resize(&mut conn, "grown", 2).await.unwrap_err();
    assert!(err.to_string().contains("has not consumed"), "{err}");
}

on_every_target!(
    annotated_listeners_run_four_members_side_by_side_with_a_second_listener,
    builder_registers_one_member_with_local_workers_and_shutdown_loses_nothing,
    a_resized_stream_is_followed_by_its_groups_and_a_shrink_never_strands_entries,
);

/// Single node only: it restarts Redis.
///
/// Redis restarted empty while a member owns every shard (the issue: members rebuilt coordination and
/// then read nothing, NOGROUP every 5 s, forever). The group is rebuilt, the topology recreated from its
/// shard count, the shard consumer groups recreated once ownership is confirmed, and what producers write
/// afterwards is consumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_empty_is_rebuilt_and_consumption_resumes() {
    let seen = Seen::default();
    let mut redis = RedisServer::start();
    let url = redis.url();
    produce(&url, "phoenix", 4, 10, 5).await;
    let runtime = test_runtime(&url)
        .consumer(
            ConsumerBuilder::new("phoenix", "g")
                .member_id("p1")
                .handler(recording(&seen)),
        )
        .start()
        .await
        .unwrap();
    wait_until("the first orders handled", Duration::from_secs(30), || {
        seen_len(&seen) == 50
    })
    .await;
    redis.restart(); // no persistence: everything is gone
    let mut conn = connection(&url).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let topology = loop {
        if let Ok(topology) = Topology::load(&mut conn, "phoenix").await {
            break topology;
        }
        assert!(Instant::now() < deadline, "the topology was not recreated");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        topology.shard_count(),
        4,
        "recreated from the group's shard count"
    );
    let producer = Producer::new(conn, "phoenix").await.unwrap();
    let batch = orders(10, 5..10);
    // Shard streams may not exist yet (recreated by the owner once confirmed): retry what was refused.
    let deadline = Instant::now() + Duration::from_secs(60);
    while producer.send_batch(&batch).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the producer could not write again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_until(
        "the orders written after the restart handled",
        Duration::from_secs(60),
        || seen_len(&seen) == 100,
    )
    .await;
    // Every owned shard's consumer group comes back, idle ones (no key of this test lands on some) too.
    let mut conn = connection(&url).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    for shard in 0..4 {
        loop {
            let groups: redis::RedisResult<Vec<redis::Value>> = redis::cmd("XINFO")
                .arg("GROUPS")
                .arg(format!("phoenix:{shard}"))
                .query_async(&mut conn)
                .await;
            if groups.is_ok_and(|g| g.len() == 1) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "shard {shard}'s group was not recreated"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let _ = runtime.stop().await;
    assert_eq!(
        pending(&url, "phoenix", "g", 4).await,
        0,
        "nothing left pending"
    );
}
