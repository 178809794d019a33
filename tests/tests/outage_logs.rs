//! A Redis outage is worth a WARN, not a WARN per attempt: every loop that fails the same way on every
//! retry (heartbeats, shard reads, the idle wait, the topology follower) logs a cause once, then at most
//! once per 10 s with the count of repeats it did not log. Its own test binary: the log capture is per
//! binary, and other tests' lines would count.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use stream_listener::{ConsumerBuilder, Message};
use stream_listener_test_support::RedisServer;
use stream_listener_tests::logs::{self, events};
use stream_listener_tests::producer;
use tokio::time::Instant;
use tracing::Level;

#[derive(Debug, Serialize, Deserialize)]
struct Job {
    key: String,
}

/// The WARN lines about `stream` logged after the first `since` events: per whose (the member, or the
/// group's topology follower) and cause (the message), how many times it was logged.
fn warns_about(stream: &str, since: usize) -> std::collections::BTreeMap<(String, String), usize> {
    let mut counts = std::collections::BTreeMap::new();
    for event in events().into_iter().skip(since) {
        let field = |name: &str| event.scope.get(name).or(event.fields.0.get(name)).cloned();
        if event.level != Level::WARN || field("stream").as_deref() != Some(stream) {
            continue;
        }
        let whose = field("member").unwrap_or_else(|| "follower".to_owned());
        let message = event.fields.0.get("message").cloned().unwrap_or_default();
        *counts.entry((whose, message)).or_insert(0) += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_logs_each_cause_once_in_a_while_not_every_attempt() {
    logs::capture();
    let mut redis = RedisServer::start();
    let url = redis.url();
    let _producer = producer(&url, "outage", 8).await;
    // Four members in one process, as `concurrency = 4` runs, with the default timing (1 s heartbeats,
    // a 10 s session): an outage of 5 s does not fence them.
    let mut runtime = stream_listener::Runtime::new(&url).without_annotated_listeners();
    for i in 0..4 {
        runtime = runtime.consumer(
            ConsumerBuilder::new("outage", "g")
                .member_id(format!("outage-{i}"))
                .handler(|_msg: Message<Job>| async { Ok::<(), String>(()) }),
        );
    }
    let runtime = runtime.start().await.unwrap();
    let start = Instant::now();
    while runtime
        .statuses()
        .iter()
        .map(|(_, s)| s.owned.len())
        .sum::<usize>()
        < 8
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "never owned the shards"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = events().len();
    redis.kill();
    // The outage itself: a fixed window of 5 s in which the lines are counted (no condition to wait for).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let counts = warns_about("outage", before);
    redis.restart();
    let total: usize = counts.values().sum();
    eprintln!("WARN lines in a 5 s outage of 4 members: {total}: {counts:#?}");
    let _ = runtime.stop().await;
    assert!(
        total >= 4,
        "each member's outage is worth a WARN: {counts:#?}"
    );
    for ((whose, message), n) in &counts {
        assert!(
            *n <= 1,
            "{whose}: `{message}` logged {n} times in 5 s: {counts:#?}"
        );
    }
}
