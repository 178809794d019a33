//! stream-listener on a Redis Cluster over TLS (`rediss+cluster://`): the cluster bus and replication run
//! over TLS too, and the library trusts the test authority through `SSL_CERT_FILE`, as a deployment
//! would through the system's roots. Its own test binary: it sets that variable for the whole process.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stream_listener::coordinator::metadata::GroupConfig;
use stream_listener::{ConsumerBuilder, Message, Producer, Runtime};
use stream_listener_test_support::RedisCluster;
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_and_a_producer_work_on_a_cluster_over_tls() {
    let Some(cluster) = RedisCluster::start_tls() else {
        return;
    };
    std::env::set_var("SSL_CERT_FILE", cluster.ca_cert().unwrap());
    let url = cluster.url();
    assert!(url.starts_with("rediss+cluster://"), "{url}");

    let producer = Producer::connect_creating(&url, "secure", 6).await.unwrap();
    let seen: Arc<Mutex<Vec<(String, u32)>>> = Arc::default();
    let handled = seen.clone();
    let consumer = ConsumerBuilder::new("secure", "g")
        .member_id("tls")
        .handler(move |msg: Message<(String, u32)>| {
            let handled = handled.clone();
            async move {
                handled.lock().unwrap().push(msg.payload);
                Ok::<(), String>(())
            }
        });
    let runtime = Runtime::new(url.clone())
        .without_default_logging()
        .without_annotated_listeners()
        .group_config(GroupConfig {
            heartbeat_interval_ms: 100,
            session_timeout_ms: 3_000,
            rebalance_timeout_ms: 6_000,
        })
        .consumer(consumer)
        .start()
        .await
        .unwrap();

    const KEYS: u32 = 12;
    const PER_KEY: u32 = 20;
    for seq in 0..PER_KEY {
        for k in 0..KEYS {
            let key = format!("k{k}");
            producer.send(&key, &(key.clone(), seq)).await.unwrap();
        }
    }
    let start = Instant::now();
    while seen.lock().unwrap().len() < (KEYS * PER_KEY) as usize {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "handled {} of {}",
            seen.lock().unwrap().len(),
            KEYS * PER_KEY
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    runtime.stop().await.unwrap();

    // Every entry once, in order per key; and the shards really were spread over the masters.
    let seen = seen.lock().unwrap();
    let mut by_key: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for (key, seq) in seen.iter() {
        by_key.entry(key).or_default().push(*seq);
    }
    assert_eq!(by_key.len(), KEYS as usize);
    for (key, seqs) in by_key {
        assert_eq!(seqs, (0..PER_KEY).collect::<Vec<_>>(), "{key}");
    }
    let masters: BTreeSet<usize> = producer
        .topology()
        .stream_keys()
        .iter()
        .map(|key| cluster.master_of(stream_listener::connection::slot_of(key.as_bytes())))
        .collect();
    assert_eq!(masters.len(), 3, "{masters:?}");
}
