//! Metrics reach whatever recorder is installed: a known workload against real Redis, then the values
//! a test recorder (`metrics-util`'s `DebuggingRecorder`) holds.

use std::collections::BTreeMap;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use serde::{Deserialize, Serialize};
use stream_listener::consumer::FailurePolicy;
use stream_listener::{ConsumerBuilder, Message};
use stream_listener_test_support::RedisServer;
use stream_listener_tests::{producer, start_one, test_runtime};
use tokio::time::Instant;

#[derive(Debug, Serialize, Deserialize)]
struct Job {
    key: String,
}

/// Every metric as `name{label=value,...}` (labels sorted) -> value, accumulated into `seen`: the
/// recorder resets what it hands out, so counters and histogram sample counts are summed over snapshots
/// and gauges keep their last non-zero reading.
fn accumulate(snapshotter: &Snapshotter, seen: &mut BTreeMap<String, f64>) {
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let mut labels: Vec<String> = key
            .key()
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let name = format!("{}{{{}}}", key.key().name(), labels.join(","));
        let slot = seen.entry(name).or_insert(0.0);
        match value {
            DebugValue::Counter(n) => *slot += n as f64,
            DebugValue::Histogram(samples) => *slot += samples.len() as f64,
            DebugValue::Gauge(g) if g.into_inner() != 0.0 => *slot = g.into_inner(),
            DebugValue::Gauge(_) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_workload_shows_up_in_the_recorder() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");

    let redis = RedisServer::start();
    let url = redis.url();
    let producer = producer(&url, "metered", 4).await;
    for i in 0..10 {
        let key = format!("k{i}");
        producer
            .send(&key, &Job { key: key.clone() })
            .await
            .unwrap();
    }
    producer
        .send("bad", &Job { key: "bad".into() })
        .await
        .unwrap();
    let mut policy = FailurePolicy::default();
    policy.max_deliveries = 2;
    policy.initial_backoff = Duration::from_millis(10);
    // Entries with a `hold-` key block their handler until the gate opens (phase 2).
    let (gate, gate_rx) = tokio::sync::watch::channel(false);
    let builder = |member: &str, policy: FailurePolicy| {
        let gate_rx = gate_rx.clone();
        ConsumerBuilder::new("metered", "g")
            .member_id(member)
            .failure(policy)
            .batch_size(1)
            .runtime_max_concurrency(4)
            .handler(move |msg: Message<Job>| {
                let mut gate_rx = gate_rx.clone();
                async move {
                    if msg.payload.key.starts_with("hold-") {
                        let _ = gate_rx.wait_for(|open| *open).await;
                    }
                    if msg.payload.key == "bad" {
                        Err("always fails".to_owned())
                    } else {
                        Ok(())
                    }
                }
            })
    };
    let consumer = builder("solo", policy);
    let runtime = start_one(&url, consumer).await;

    let messages = |outcome: &str| {
        format!("stream_listener_messages_total{{group=g,outcome={outcome},stream=metered}}")
    };
    let member = "group=g,member=solo,stream=metered";
    let start = Instant::now();
    let mut seen = BTreeMap::new();
    loop {
        accumulate(&snapshotter, &mut seen);
        if seen.get(&messages("dead_lettered")) == Some(&1.0)
            && seen.get(&messages("handled")) == Some(&10.0)
            && seen.get(&format!("stream_listener_owned_shards{{{member}}}")) == Some(&4.0)
            && seen
                .get(&format!(
                    "stream_listener_lease_remaining_seconds{{{member}}}"
                ))
                .is_some_and(|left| *left > 0.0)
            && seen
                .get("stream_listener_store_commits_total{}")
                .is_some_and(|n| *n > 0.0)
        {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{seen:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(seen[&messages("failed")], 2.0, "{seen:#?}");
    assert_eq!(seen[&messages("retried")], 1.0, "{seen:#?}");
    assert_eq!(
        seen["stream_listener_handler_duration_seconds{group=g,outcome=ok,stream=metered}"], 10.0,
        "{seen:#?}"
    );
    assert_eq!(
        seen["stream_listener_handler_duration_seconds{group=g,outcome=error,stream=metered}"], 2.0,
        "{seen:#?}"
    );
    assert!(seen[&format!("stream_listener_member_epoch{{{member}}}")] > 0.0);
    assert_eq!(
        seen[&format!("stream_listener_heartbeat_failures{{{member}}}")],
        0.0
    );
    assert!(
        seen[&format!("stream_listener_lease_remaining_seconds{{{member}}}")] <= 1.5,
        "at most 4/5 of the 1.5 s session: {seen:#?}"
    );
    assert_eq!(
        seen["stream_listener_member_state{group=g,member=solo,state=member,stream=metered}"], 1.0,
        "{seen:#?}"
    );
    assert_eq!(
        seen[&format!("stream_listener_self_fences_total{{{member}}}")],
        0.0
    );
    assert!(
        seen["stream_listener_heartbeats_total{group=g,member=solo,status=ok,stream=metered}"]
            > 0.0
    );
    assert!(seen[&format!("stream_listener_group_epoch{{{member}}}")] > 0.0);
    assert!(seen[&format!("stream_listener_assignment_epoch{{{member}}}")] > 0.0);
    // The store's conflicts are reported even while there are none (one member: none expected).
    assert_eq!(
        seen["stream_listener_store_conflicts_total{}"], 0.0,
        "{seen:#?}"
    );
    assert!(
        seen.contains_key("stream_listener_store_loads_total{}"),
        "{seen:#?}"
    );

    // Phase 2: two entries on every shard, the first of each blocking its handler. With batches of
    // one, each shard has 1 entry delivered and unacknowledged and 1 not read yet.
    let mut held = BTreeMap::new();
    for i in 0.. {
        let key = format!("hold-{i}");
        held.entry(stream_listener::routing::shard_for_key(key.as_bytes(), 4))
            .or_insert(key);
        if held.len() == 4 {
            break;
        }
    }
    for key in held.values() {
        for _ in 0..2 {
            producer.send(key, &Job { key: key.clone() }).await.unwrap();
        }
    }
    let lag =
        |shard: u32| format!("stream_listener_shard_lag{{group=g,shard={shard},stream=metered}}");
    let pending = |shard: u32| {
        format!("stream_listener_shard_pending{{group=g,shard={shard},stream=metered}}")
    };
    let start = Instant::now();
    loop {
        accumulate(&snapshotter, &mut seen);
        if (0..4).all(|s| seen.get(&lag(s)) == Some(&1.0) && seen.get(&pending(s)) == Some(&1.0)) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "lag and pending: {seen:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Phase 3: a second member joins while the first one's handlers block: the shards moving to it
    // are pending on its side and revoking (draining) on the first one's until the gate opens.
    let mut fast = FailurePolicy::default();
    fast.initial_backoff = Duration::from_millis(10);
    let second = test_runtime(&url)
        .consumer(builder("second", fast))
        .start()
        .await
        .unwrap();
    let joiner = "group=g,member=second,stream=metered";
    let start = Instant::now();
    loop {
        accumulate(&snapshotter, &mut seen);
        if seen.get(&format!("stream_listener_pending_shards{{{joiner}}}")) == Some(&2.0)
            && seen.get(&format!("stream_listener_revoking_shards{{{member}}}")) == Some(&2.0)
        {
            break;
        }
        // Well inside the 3 s rebalance timeout, after which the first member would be fenced.
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "pending and revoking: {seen:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gate.send(true).unwrap();
    let rebalances = |labels: &str| format!("stream_listener_rebalances_total{{{labels}}}");
    let start = Instant::now();
    loop {
        accumulate(&snapshotter, &mut seen);
        // The first member saw its own join and the second one's; the second saw its own.
        if seen.get(&rebalances(member)) == Some(&2.0)
            && seen.get(&rebalances(joiner)) == Some(&1.0)
            && seen.get(&format!("stream_listener_owned_shards{{{joiner}}}")) == Some(&2.0)
        {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "rebalances: {seen:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let durations =
        |labels: &str| format!("stream_listener_rebalance_duration_seconds{{{labels}}}");
    assert_eq!(seen[&durations(member)], 2.0, "{seen:#?}");
    assert_eq!(seen[&durations(joiner)], 1.0, "{seen:#?}");
    assert!(
        seen[&format!("stream_listener_group_epoch{{{joiner}}}")] >= 2.0,
        "{seen:#?}"
    );
    assert_eq!(
        seen[&format!("stream_listener_self_fences_total{{{member}}}")],
        0.0
    );

    for name in seen.keys() {
        let base = name.split('{').next().unwrap();
        assert!(
            stream_listener::metrics::NAMES.contains(&base),
            "{base} is listed"
        );
    }
    let _ = second.stop().await;
    let _ = runtime.stop().await;
}

/// Every metric name in `text` (`stream_listener_...`), histogram series suffixes removed.
fn metric_names(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("stream_listener_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let base = ["_bucket", "_count", "_sum"]
            .iter()
            .find_map(|suffix| {
                name.strip_suffix(suffix)
                    .filter(|b| b.ends_with("_seconds"))
            })
            .unwrap_or(name);
        names.push(base.to_owned());
        rest = &tail[end..];
    }
    names
}

#[test]
fn every_dashboard_query_names_a_metric_the_library_emits() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/grafana-dashboard.json"
    );
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            queries.push(target["expr"].as_str().unwrap().to_owned());
        }
    }
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if variable["type"] == "query" {
            queries.push(variable["query"].as_str().unwrap().to_owned());
        }
    }
    assert!(queries.len() >= 10, "{queries:?}");
    let mut used = std::collections::BTreeSet::new();
    for query in &queries {
        let names = metric_names(query);
        assert!(
            !names.is_empty(),
            "a query without a library metric: {query}"
        );
        for name in names {
            assert!(
                stream_listener::metrics::NAMES.contains(&name.as_str()),
                "`{name}` (in `{query}`) is not a metric the library emits"
            );
            used.insert(name);
        }
    }
    for name in stream_listener::metrics::NAMES {
        assert!(used.contains(*name), "the dashboard does not show {name}");
    }
}
