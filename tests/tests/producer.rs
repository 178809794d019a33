//! Producer and topology against a real redis-server started by the test.

use std::collections::HashMap;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::Value;
use serde::{Deserialize, Serialize};
use stream_listener::producer::{
    Producer, ProducerConfig, ProducerError, KEY_FIELD, PAYLOAD_FIELD, VERSION_FIELD,
};
use stream_listener::routing::{shard_for_key, PrefixError};
use stream_listener::topology::{StartFrom, Topology, TopologyError};
use stream_listener_test_support::aio::{
    command_calls, connect_multiplexed, info, info_field, xlen, xrange,
};
use stream_listener_test_support::RedisServer;

/// One stream entry as Redis returns it: (id, [(field, value)]).
type RawEntry = (String, Vec<(String, Vec<u8>)>);

/// All entries of a stream as (id, field map).
async fn entries(
    conn: &mut MultiplexedConnection,
    stream: &str,
) -> Vec<(String, HashMap<String, Vec<u8>>)> {
    xrange(conn, stream).await
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    id: String,
    seq: u32,
    amount_cents: i64,
}

#[tokio::test]
async fn entries_land_in_the_shard_routing_md_names() {
    let server = RedisServer::start();
    let mut conn = connect_multiplexed(&server.url()).await;
    for (prefix, shards, key, expected) in [
        ("orders10", 10, "order-123", 1),
        ("orders16", 16, "order-123", 13),
        ("users12", 12, "user-42", 8),
    ] {
        Topology::ensure(&mut conn, prefix, shards).await.unwrap();
        let producer = Producer::new(conn.clone(), prefix).await.unwrap();
        let receipt = producer.send_bytes(key, b"payload").await.unwrap();
        assert_eq!(receipt.shard, expected, "{prefix} {key}");
        assert_eq!(receipt.stream, format!("{prefix}:{expected}"));

        let written = entries(&mut conn, &receipt.stream).await;
        assert_eq!(written.len(), 1);
        let (id, fields) = &written[0];
        assert_eq!(id, &receipt.id);
        assert_eq!(
            fields.len(),
            2,
            "a never-resized stream's entry layout is exactly k and p: {fields:?}"
        );
        assert_eq!(fields[KEY_FIELD], key.as_bytes());
        assert_eq!(fields[PAYLOAD_FIELD], b"payload");
        for other in (0..shards).filter(|&s| s != expected) {
            assert_eq!(xlen(&mut conn, &format!("{prefix}:{other}")).await, 0);
        }
    }
}

#[tokio::test]
async fn typed_payloads_are_json_and_raw_keys_route_as_bytes() {
    let server = RedisServer::start();
    let mut conn = connect_multiplexed(&server.url()).await;
    Topology::ensure(&mut conn, "orders", 12).await.unwrap();
    let producer = Producer::new(conn.clone(), "orders").await.unwrap();
    let order = Order {
        id: "o-1".into(),
        seq: 7,
        amount_cents: -250,
    };
    let receipt = producer.send("customer-9", &order).await.unwrap();
    assert_eq!(receipt.shard, shard_for_key(b"customer-9", 12));
    let written = entries(&mut conn, &receipt.stream).await;
    let decoded: Order = serde_json::from_slice(&written[0].1[PAYLOAD_FIELD]).unwrap();
    assert_eq!(decoded, order);

    let raw_key = [0xffu8, 0x00, 0x80];
    let receipt = producer.send_bytes(raw_key, [1u8, 2, 3]).await.unwrap();
    assert_eq!(receipt.shard, shard_for_key(&raw_key, 12));
    let written = entries(&mut conn, &receipt.stream).await;
    let last = &written.last().unwrap().1;
    assert_eq!(last[KEY_FIELD], raw_key);
    assert_eq!(last[PAYLOAD_FIELD], [1, 2, 3]);
}

#[tokio::test]
async fn ensure_is_idempotent_and_refuses_a_different_count() {
    let server = RedisServer::start();
    let mut conn = connect_multiplexed(&server.url()).await;
    let first = Topology::ensure(&mut conn, "orders", 4).await.unwrap();
    assert_eq!((first.shard_count(), first.version()), (4, 1));
    let again = Topology::ensure(&mut conn, "orders", 4).await.unwrap();
    assert_eq!(again, first);
    assert_eq!(Topology::load(&mut conn, "orders").await.unwrap(), first);

    // The record is a hash at the hash-tagged key.
    let record: HashMap<String, String> = redis::cmd("HGETALL")
        .arg("sl:topology:{orders}")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(record["shardCount"], "4");
    assert_eq!(record["version"], "1");

    // The shard streams exist (empty) so producers can publish before any group exists.
    for stream in first.stream_keys() {
        let kind: String = redis::cmd("TYPE")
            .arg(&stream)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(kind, "stream", "{stream}");
        let groups: Vec<Value> = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(&stream)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(groups.is_empty(), "bootstrap group left behind on {stream}");
    }

    let err = Topology::ensure(&mut conn, "orders", 8).await.unwrap_err();
    assert!(
        matches!(
            err,
            TopologyError::ShardCountMismatch {
                existing: 4,
                requested: 8,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("resize"), "{err}");

    assert!(matches!(
        Topology::ensure(&mut conn, "orders", 0).await,
        Err(TopologyError::ZeroShards)
    ));
    assert!(matches!(
        Topology::ensure(&mut conn, "{orders}", 4).await,
        Err(TopologyError::InvalidPrefix(
            PrefixError::ContainsBrace { .. }
        ))
    ));
    assert!(matches!(
        Topology::ensure(&mut conn, "", 4).await,
        Err(TopologyError::InvalidPrefix(PrefixError::Empty))
    ));
}

#[tokio::test]
async fn ensure_group_is_idempotent_and_honours_start_from() {
    let server = RedisServer::start();
    let mut conn = connect_multiplexed(&server.url()).await;
    Topology::ensure(&mut conn, "orders", 3).await.unwrap();
    let producer = Producer::new(conn.clone(), "orders").await.unwrap();
    let keys: Vec<String> = (0..30).map(|i| format!("k{i}")).collect();
    let batch: Vec<(&str, &[u8])> = keys.iter().map(|k| (k.as_str(), &b"x"[..])).collect();
    producer.send_batch_bytes(&batch).await.unwrap();

    for _ in 0..2 {
        Topology::ensure_group(&mut conn, "orders", "billing", StartFrom::Earliest)
            .await
            .unwrap();
        Topology::ensure_group(&mut conn, "orders", "audit", StartFrom::Latest)
            .await
            .unwrap();
    }

    let mut seen_by_billing = 0;
    for shard in 0..3 {
        let stream = format!("orders:{shard}");
        // Earliest sees the backlog; Latest sees nothing already written.
        for (group, expect_backlog) in [("billing", true), ("audit", false)] {
            let reply: Option<Vec<(String, Vec<RawEntry>)>> = redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg(group)
                .arg("c1")
                .arg("STREAMS")
                .arg(&stream)
                .arg(">")
                .query_async(&mut conn)
                .await
                .unwrap();
            let n = reply
                .map(|r| r.into_iter().map(|(_, e)| e.len()).sum::<usize>())
                .unwrap_or(0);
            if expect_backlog {
                seen_by_billing += n;
            } else {
                assert_eq!(n, 0, "{group} on {stream}");
            }
        }
    }
    assert_eq!(seen_by_billing, 30);
}

#[tokio::test]
async fn publishing_without_a_topology_is_a_clear_error() {
    let server = RedisServer::start();
    let mut conn = connect_multiplexed(&server.url()).await;
    let err = Producer::new(conn.clone(), "nowhere").await.unwrap_err();
    match &err {
        ProducerError::Topology(TopologyError::Missing { prefix, key }) => {
            assert_eq!(prefix, "nowhere");
            assert_eq!(key, "sl:topology:{nowhere}");
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert!(err.to_string().contains("Topology::ensure"), "{err}");
    assert!(matches!(
        Topology::ensure_group(&mut conn, "nowhere", "g", StartFrom::Earliest).await,
        Err(TopologyError::Missing { .. })
    ));
    // Nothing was created on the way.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(keys.is_empty(), "{keys:?}");

    // A topology deleted after the producer was created is noticed on the next refresh.
    Topology::ensure(&mut conn, "orders", 2).await.unwrap();
    let producer = Producer::with_config(
        conn.clone(),
        "orders",
        ProducerConfig {
            refresh_interval: Duration::ZERO,
            ..ProducerConfig::default()
        },
    )
    .await
    .unwrap();
    let _: () = redis::cmd("DEL")
        .arg("sl:topology:{orders}")
        .query_async(&mut conn)
        .await
        .unwrap();
    let err = producer.send_bytes("k", "v").await.unwrap_err();
    assert!(
        matches!(err, ProducerError::Topology(TopologyError::Missing { .. })),
        "{err}"
    );
}

#[tokio::test]
async fn producer_follows_a_resize_by_version() {
    let server = RedisServer::start();
    let mut conn = connect_multiplexed(&server.url()).await;
    Topology::ensure(&mut conn, "orders", 4).await.unwrap();
    Topology::ensure_group(&mut conn, "orders", "billing", StartFrom::Earliest)
        .await
        .unwrap();
    let producer = Producer::with_config(
        conn.clone(),
        "orders",
        ProducerConfig {
            refresh_interval: Duration::ZERO,
            ..ProducerConfig::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(producer.topology().version(), 1);

    let resized = Topology::resize(&mut conn, "orders", 8).await.unwrap();
    assert_eq!((resized.shard_count(), resized.version()), (8, 2));
    // Resizing to the same count changes nothing.
    assert_eq!(
        Topology::resize(&mut conn, "orders", 8).await.unwrap(),
        resized
    );

    // The new shards got the existing group, starting from the beginning.
    for shard in 4..8 {
        let groups: Vec<HashMap<String, Value>> = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(format!("orders:{shard}"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(groups.len(), 1, "shard {shard}");
    }

    // A key that moves to a new shard under 8 shards.
    let key = (0..)
        .map(|i| format!("key-{i}"))
        .find(|k| shard_for_key(k.as_bytes(), 8) >= 4)
        .unwrap();
    let receipt = producer.send_bytes(&key, "v").await.unwrap();
    assert_eq!(receipt.topology_version, 2);
    assert_eq!(receipt.shard, shard_for_key(key.as_bytes(), 8));
    // Past version 1 every entry names the version it was routed with.
    let written = entries(&mut conn, &receipt.stream).await;
    let (_, fields) = written.last().expect("the entry");
    assert_eq!(fields[VERSION_FIELD], b"2", "{fields:?}");
    assert_eq!(producer.topology().shard_count(), 8);
}

#[tokio::test]
async fn a_missing_shard_stream_triggers_a_refresh_and_resend() {
    let server = RedisServer::start();
    let mut conn = connect_multiplexed(&server.url()).await;
    Topology::ensure(&mut conn, "orders", 4).await.unwrap();
    // A long refresh interval: only the nil reply from XADD NOMKSTREAM can make it notice the change.
    let producer = Producer::with_config(
        conn.clone(),
        "orders",
        ProducerConfig {
            refresh_interval: Duration::from_secs(3600),
            ..ProducerConfig::default()
        },
    )
    .await
    .unwrap();

    // Shrink to 2 shards and drop the removed streams behind the producer's back.
    Topology::resize(&mut conn, "orders", 2).await.unwrap();
    let _: () = redis::cmd("DEL")
        .arg("orders:2")
        .arg("orders:3")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(producer.topology().shard_count(), 4, "still cached");

    let keys: Vec<String> = (0..40).map(|i| format!("key-{i}")).collect();
    assert!(keys.iter().any(|k| shard_for_key(k.as_bytes(), 4) >= 2));
    let batch: Vec<(&str, u32)> = keys.iter().map(|k| k.as_str()).zip(0..).collect();
    let receipts = producer.send_batch(&batch).await.unwrap();
    assert_eq!(producer.topology().version(), 2);
    for ((key, _), receipt) in batch.iter().zip(&receipts) {
        assert!(receipt.shard < 2);
        if receipt.topology_version == 2 {
            assert_eq!(receipt.shard, shard_for_key(key.as_bytes(), 2));
        } else {
            // Written before the refresh, to a shard that still exists under the old routing.
            assert_eq!(receipt.shard, shard_for_key(key.as_bytes(), 4));
        }
    }
    assert!(receipts.iter().any(|r| r.topology_version == 2));
    assert_eq!(
        xlen(&mut conn, "orders:0").await + xlen(&mut conn, "orders:1").await,
        40
    );
    let exists: bool = redis::cmd("EXISTS")
        .arg("orders:3")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!exists, "NOMKSTREAM must not recreate a dropped shard");

    // A shard stream that stays missing after the refresh is an error naming it.
    let _: () = redis::cmd("DEL")
        .arg("orders:1")
        .query_async(&mut conn)
        .await
        .unwrap();
    let key = keys
        .iter()
        .find(|k| shard_for_key(k.as_bytes(), 2) == 1)
        .unwrap();
    let err = producer.send_bytes(key, "v").await.unwrap_err();
    match &err {
        ProducerError::MissingShardStream { stream, version } => {
            assert_eq!(stream, "orders:1");
            assert_eq!(*version, 2);
        }
        other => panic!("unexpected error {other:?}"),
    }
}

#[tokio::test]
async fn send_batch_pipelines_and_keeps_per_key_order() {
    let server = RedisServer::start();
    let mut conn = connect_multiplexed(&server.url()).await;
    Topology::ensure(&mut conn, "orders", 6).await.unwrap();
    let producer = Producer::new(conn.clone(), "orders").await.unwrap();

    let customers: Vec<String> = (0..25).map(|c| format!("customer-{c}")).collect();
    let batch: Vec<(&str, Order)> = (0..1000u32)
        .map(|seq| {
            let key = customers[seq as usize % customers.len()].as_str();
            (
                key,
                Order {
                    id: format!("o-{seq}"),
                    seq,
                    amount_cents: i64::from(seq),
                },
            )
        })
        .collect();
    let receipts = producer.send_batch(&batch).await.unwrap();
    assert_eq!(receipts.len(), batch.len());
    for ((key, _), receipt) in batch.iter().zip(&receipts) {
        assert_eq!(receipt.shard, shard_for_key(key.as_bytes(), 6));
    }
    assert!(producer
        .send_batch::<&str, Order>(&[])
        .await
        .unwrap()
        .is_empty());

    let mut total = 0;
    let mut last_seq: HashMap<Vec<u8>, u32> = HashMap::new();
    for shard in 0..6 {
        for (_, fields) in entries(&mut conn, &format!("orders:{shard}")).await {
            total += 1;
            let key = fields[KEY_FIELD].clone();
            assert_eq!(shard_for_key(&key, 6), shard, "misrouted entry");
            let order: Order = serde_json::from_slice(&fields[PAYLOAD_FIELD]).unwrap();
            if let Some(prev) = last_seq.insert(key, order.seq) {
                assert!(
                    prev < order.seq,
                    "per-key order broken: {prev} then {}",
                    order.seq
                );
            }
        }
    }
    assert_eq!(total, 1000);
}

#[tokio::test]
async fn an_opt_in_cap_trims_approximately() {
    let server = RedisServer::start();
    let mut conn = connect_multiplexed(&server.url()).await;
    Topology::ensure(&mut conn, "orders", 1).await.unwrap();
    let producer = Producer::with_config(
        conn.clone(),
        "orders",
        ProducerConfig {
            cap_unread: Some(100),
            ..ProducerConfig::default()
        },
    )
    .await
    .unwrap();
    let batch: Vec<(String, u32)> = (0..2000).map(|i| (format!("k{i}"), i)).collect();
    producer.send_batch(&batch).await.unwrap();
    let len = xlen(&mut conn, "orders:0").await;
    assert!((100..2000).contains(&len), "len {len}");
}

#[tokio::test]
async fn works_with_a_connection_manager() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut manager = client.get_connection_manager().await.unwrap();
    Topology::ensure(&mut manager, "orders", 3).await.unwrap();
    let producer: Producer<redis::aio::ConnectionManager> =
        Producer::new(manager, "orders").await.unwrap();
    let clone = producer.clone();
    let handle = tokio::spawn(async move { clone.send("a", &1).await });
    handle.await.unwrap().unwrap();
    producer.send("b", &2).await.unwrap();
    assert!(format!("{producer:?}").contains("orders"));
}

/// A master with one replica, online.
async fn with_a_replica() -> (RedisServer, RedisServer) {
    let master = RedisServer::start();
    let port = master.port().to_string();
    let replica = RedisServer::try_start_with_args(
        ["--replicaof", "127.0.0.1", port.as_str()]
            .map(String::from)
            .to_vec(),
        None,
    )
    .unwrap();
    let mut conn = connect_multiplexed(&master.url()).await;
    stream_listener_test_support::aio::wait_until_async(
        "the replica online",
        Duration::from_secs(20),
        || {
            let mut conn = conn.clone();
            async move {
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                info.contains("state=online")
            }
        },
    )
    .await;
    Topology::ensure(&mut conn, "orders", 4).await.unwrap();
    (master, replica)
}

/// A send with `min_replicas` succeeds once the replicas have the write; the fault: the replica freezes
/// (SIGSTOP), and a send fails with `NotReplicated` after the timeout, its write on the master (resending
/// is at-least-once), as does a send asking for more replicas than there are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_waits_for_the_replicas_asked_for_and_fails_without_them() {
    let (master, replica) = with_a_replica().await;
    let mut conn = connect_multiplexed(&master.url()).await;
    // A send that must succeed waits long enough for a replica on a busy machine (on a connection that
    // waits as long for the reply: redis-rs's default gives up after 500 ms); one the frozen replica
    // cannot acknowledge gives up soon.
    let patient = redis::Client::open(master.url())
        .unwrap()
        .get_multiplexed_async_connection_with_config(
            &redis::AsyncConnectionConfig::new()
                .set_response_timeout(Some(Duration::from_secs(15))),
        )
        .await
        .unwrap();
    let config = |min_replicas, replica_timeout| ProducerConfig {
        min_replicas,
        replica_timeout,
        ..ProducerConfig::default()
    };
    let producer = Producer::with_config(
        patient.clone(),
        "orders",
        config(1, Duration::from_secs(10)),
    )
    .await
    .unwrap();
    let impatient = Producer::with_config(
        conn.clone(),
        "orders",
        config(1, Duration::from_millis(300)),
    )
    .await
    .unwrap();
    let receipt = producer.send_bytes("k", "one").await.unwrap();
    assert!(receipt.stream.starts_with("orders:"));
    let batch: Vec<(String, String)> = (0..10).map(|i| (format!("k{i}"), format!("{i}"))).collect();
    assert_eq!(producer.send_batch_bytes(&batch).await.unwrap().len(), 10);
    // Keys repeating: a transaction, and `WAIT` after its `EXEC`.
    let repeated: Vec<(String, String)> = (0..10)
        .map(|i| (format!("k{}", i % 3), format!("{i}")))
        .collect();
    let receipts = producer.send_batch_bytes(&repeated).await.unwrap();
    assert_eq!(receipts.len(), 10);
    for (a, b) in receipts.iter().zip(receipts.iter().skip(3)) {
        assert_eq!(a.stream, b.stream, "one key, one shard");
        let id = |r: &stream_listener::producer::SendReceipt| {
            let (ms, seq) = r.id.split_once('-').unwrap();
            (ms.parse::<u64>().unwrap(), seq.parse::<u64>().unwrap())
        };
        assert!(id(a) < id(b), "{a:?} then {b:?}");
    }
    let written = |conn: &mut MultiplexedConnection| {
        let mut conn = conn.clone();
        async move {
            let mut total = 0;
            for shard in 0..4 {
                total += xlen(&mut conn, &format!("orders:{shard}")).await;
            }
            total
        }
    };
    assert_eq!(written(&mut conn).await, 21);

    replica.freeze();
    let error = impatient.send_bytes("k", "two").await.unwrap_err();
    let batch_error = impatient.send_batch_bytes(&batch).await.unwrap_err();
    let repeated_error = impatient.send_batch_bytes(&repeated).await.unwrap_err();
    replica.thaw();
    for error in [error, batch_error, repeated_error] {
        match error {
            ProducerError::NotReplicated {
                stream,
                acknowledged: 0,
                wanted: 1,
            } => assert!(stream.starts_with("orders:"), "{stream}"),
            other => panic!("expected NotReplicated, got {other}"),
        }
    }
    assert_eq!(written(&mut conn).await, 42, "on the master all the same");

    // Waits its whole timeout for a second replica there is not; the one there acknowledges within it.
    let greedy = Producer::with_config(patient, "orders", config(2, Duration::from_secs(3)))
        .await
        .unwrap();
    let greedy_sent = greedy.send_bytes("k", "three").await;
    assert!(
        matches!(
            greedy_sent,
            Err(ProducerError::NotReplicated {
                acknowledged: 1,
                wanted: 2,
                ..
            })
        ),
        "{greedy_sent:?}"
    );
    // The replica has every write the master has.
    let mut on_replica = connect_multiplexed(&replica.url()).await;
    stream_listener_test_support::aio::wait_until_async(
        "the replica caught up",
        Duration::from_secs(10),
        || {
            let (mut a, mut b) = (conn.clone(), on_replica.clone());
            async move { written(&mut a).await == written(&mut b).await }
        },
    )
    .await;
    assert_eq!(written(&mut on_replica).await, 43);
}

/// A full Redis refuses a batch in which keys repeat whole (one transaction, refused while queued),
/// so that sending it again keeps each key's messages in order; a batch of distinct keys is plain
/// XADDs, no transaction. Batches of 64 messages of 1 kB over 4 shards, each key 4 times, until
/// `maxmemory` (1 MB above what Redis uses) refuses one: no shard took any of it. With room again,
/// the refused batch sent again lands whole, and every shard holds each key's messages in input order.
#[tokio::test]
async fn a_full_redis_refuses_a_batch_of_repeated_keys_whole() {
    const SHARDS: u32 = 4;
    let server = RedisServer::start();
    let mut conn = connect_multiplexed(&server.url()).await;
    Topology::ensure(&mut conn, "full", SHARDS).await.unwrap();
    let producer = Producer::new(conn.clone(), "full").await.unwrap();
    let execs = |conn: &MultiplexedConnection| {
        let mut conn = conn.clone();
        async move {
            command_calls(&mut conn)
                .await
                .get("exec")
                .copied()
                .unwrap_or(0)
        }
    };
    let distinct: Vec<(String, String)> = (0..64).map(|j| (format!("d-{j}"), "x".into())).collect();
    let before = execs(&conn).await;
    producer.send_batch_bytes(&distinct).await.unwrap();
    assert_eq!(
        execs(&conn).await,
        before,
        "a transaction for distinct keys"
    );

    let used: u64 = info_field(&info(&mut conn, "memory").await, "used_memory").unwrap();
    let set_maxmemory = |limit: u64| {
        let mut conn = conn.clone();
        async move {
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("maxmemory")
                .arg(limit)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    };
    set_maxmemory(used + 1024 * 1024).await;
    let payload = "x".repeat(1_000);
    let batch_of = |batch: u32| -> Vec<(String, String)> {
        (0..64)
            .map(|j| (format!("key-{}", j % 16), format!("{batch}/{j}/{payload}")))
            .collect()
    };
    let lens = |conn: &MultiplexedConnection| {
        let mut conn = conn.clone();
        async move {
            let mut lens = Vec::new();
            for shard in 0..SHARDS {
                lens.push(xlen(&mut conn, &format!("full:{shard}")).await);
            }
            lens
        }
    };
    let mut refused = None;
    for batch in 0..10_000u32 {
        let before = lens(&conn).await;
        if let Err(error) = producer.send_batch_bytes(&batch_of(batch)).await {
            refused = Some((batch, error, before));
            break;
        }
    }
    let (batch, error, before) = refused.expect("Redis filled up");
    assert!(
        matches!(error, ProducerError::OutOfMemory { .. }),
        "{error:?}"
    );
    assert_eq!(
        lens(&conn).await,
        before,
        "the refused batch was written in part"
    );

    set_maxmemory(0).await;
    producer.send_batch_bytes(&batch_of(batch)).await.unwrap();
    let mut last: HashMap<Vec<u8>, (u32, u32)> = HashMap::new();
    let mut total = 0;
    for shard in 0..SHARDS {
        for (_, fields) in entries(&mut conn, &format!("full:{shard}")).await {
            if fields[KEY_FIELD].starts_with(b"d-") {
                continue;
            }
            total += 1;
            let payload = String::from_utf8(fields[PAYLOAD_FIELD].clone()).unwrap();
            let mut parts = payload.split('/');
            let at: (u32, u32) = (
                parts.next().unwrap().parse().unwrap(),
                parts.next().unwrap().parse().unwrap(),
            );
            if let Some(previous) = last.insert(fields[KEY_FIELD].clone(), at) {
                assert!(previous < at, "{previous:?} then {at:?}");
            }
        }
    }
    assert_eq!(total, 64 * (batch + 1), "every message of every batch once");
}
