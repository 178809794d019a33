//! Redis stalls and slow links (issue 21, items 3 and 4): the group keeps its guarantees, and consumption
//! resumes within a few heartbeat intervals once Redis answers again, instead of idling a session.
//!
//! Each test injects its fault into a real `redis-server` (`CLIENT PAUSE`, `DEBUG SLEEP`) or into one
//! member's link (the project's fault proxy), then checks from records what happened: what was handled,
//! and the group's audit stream (a fenced hold idles its shards for a session).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stream_listener::coordinator::metadata::GroupConfig;
use stream_listener::{names, ConsumerBuilder, Message, RunningRuntime};
use stream_listener_test_support::aio::{poll_until, wait_until, wait_until_async, xrange};
use stream_listener_test_support::RedisServer;
use stream_listener_tests::{connection, orders, producer, test_runtime, Order};
use tokio::time::Instant;

/// Heartbeats every 200 ms, a member expires after 2 s.
const STALL_TIMING: GroupConfig = GroupConfig {
    heartbeat_interval_ms: 200,
    session_timeout_ms: 2_000,
    rebalance_timeout_ms: 4_000,
};

/// When each `key:seq` was first handled.
type Handled = Arc<Mutex<BTreeMap<String, Instant>>>;

fn member(stream: &str, id: &str, handled: &Handled) -> ConsumerBuilder {
    let handled = handled.clone();
    ConsumerBuilder::new(stream, "g")
        .member_id(id)
        .runtime_max_concurrency(2)
        .handler(move |msg: Message<Order>| {
            let handled = handled.clone();
            async move {
                handled
                    .lock()
                    .unwrap()
                    .entry(format!("{}:{}", msg.payload.key, msg.payload.seq))
                    .or_insert_with(Instant::now);
                Ok::<(), std::io::Error>(())
            }
        })
}

async fn start(url: &str, stream: &str, id: &str, handled: &Handled) -> RunningRuntime {
    start_timed(url, stream, id, handled, STALL_TIMING).await
}

/// The `type` of every audit event of `stream`'s group `g`, in order.
async fn audit_types(url: &str, stream: &str) -> Vec<String> {
    let mut conn = connection(url).await;
    let key = names::group_key(stream, "g", names::group::AUDIT);
    let events: Vec<(String, BTreeMap<String, String>)> = xrange(&mut conn, &key).await;
    events
        .into_iter()
        .filter_map(|(_, fields)| {
            let event: serde_json::Value = serde_json::from_str(fields.get("event")?).ok()?;
            Some(event["type"].as_str()?.to_owned())
        })
        .collect()
}

fn self_fences(runtimes: &[&RunningRuntime]) -> u64 {
    runtimes
        .iter()
        .flat_map(|r| r.statuses())
        .map(|(_, s)| s.self_fences)
        .sum()
}

/// How Redis stalls.
#[derive(Debug, Clone, Copy)]
enum Stall {
    /// `CLIENT PAUSE <ms> ALL`: Redis runs, but holds every client's commands.
    ClientPause,
    /// `DEBUG SLEEP <s>`: the server itself is blocked.
    DebugSleep,
}

/// `CLIENT PAUSE` (or `DEBUG SLEEP`) for `stall`, then the time from Redis answering again to the first
/// and the last of 16 orders written right then being handled; asserts no member lost its ownership
/// after the stall and no shard was held for a session.
async fn stall_and_recover(stream: &str, stall: Duration, how: Stall) -> (Duration, Duration) {
    // `DEBUG` is off by default from Redis 7 on.
    let redis = RedisServer::try_start_with_args(
        vec!["--enable-debug-command".into(), "local".into()],
        None,
    )
    .unwrap();
    let url = redis.url();
    let handled: Handled = Arc::default();
    let shards = 8;
    let send = producer(&url, stream, shards).await;
    let a = start(&url, stream, "a", &handled).await;
    let b = start(&url, stream, "b", &handled).await;
    send.send_batch(&orders(16, 0..5)).await.unwrap();
    wait_until("the first orders handled", Duration::from_secs(30), || {
        handled.lock().unwrap().len() == 80
    })
    .await;
    wait_until("both members own shards", Duration::from_secs(30), || {
        [&a, &b]
            .iter()
            .all(|r| r.statuses().iter().all(|(_, s)| s.owned.len() == 4))
    })
    .await;
    let events_before = audit_types(&url, stream).await.len();
    // The stall: every command of every client waits in Redis.
    let args: Vec<String> = match how {
        Stall::ClientPause => ["CLIENT", "PAUSE", &stall.as_millis().to_string(), "ALL"]
            .map(String::from)
            .to_vec(),
        Stall::DebugSleep => ["DEBUG", "SLEEP", &format!("{:.3}", stall.as_secs_f64())]
            .map(String::from)
            .to_vec(),
    };
    let cli = redis.binary().with_file_name("redis-cli");
    let port = redis.port().to_string();
    let stalled = std::thread::spawn(move || {
        std::process::Command::new(cli)
            .args(["-p", &port])
            .args(&args)
            .output()
            .expect("redis-cli")
    });
    let started = Instant::now();
    // Wait until every member self-fenced (the stall is longer than the session).
    wait_until("every member self-fenced", stall * 2, || {
        self_fences(&[&a, &b]) >= 2
    })
    .await;
    let fences_in_stall = self_fences(&[&a, &b]);
    // Redis answers again: write orders at once and see when they are handled.
    let mut conn = connection(&url).await;
    wait_until_async("Redis answers again", stall * 3, || {
        let mut conn = conn.clone();
        async move {
            redis::cmd("PING")
                .query_async::<String>(&mut conn)
                .await
                .is_ok()
        }
    })
    .await;
    let resumed = Instant::now();
    assert!(resumed >= started + stall - Duration::from_millis(200));
    let reply = stalled.join().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&reply.stdout).trim(),
        "OK",
        "the stall was refused: {reply:?}"
    );
    send.send_batch(&orders(16, 100..101)).await.unwrap();
    let marker = |k: u32| format!("k{k}:100");
    wait_until(
        "the orders after the stall handled",
        Duration::from_secs(30),
        || {
            let handled = handled.lock().unwrap();
            (0..16).all(|k| handled.contains_key(&marker(k)))
        },
    )
    .await;
    let (first, last) = {
        let handled = handled.lock().unwrap();
        let times: Vec<Instant> = (0..16).map(|k| handled[&marker(k)]).collect();
        (
            *times.iter().min().unwrap() - resumed,
            *times.iter().max().unwrap() - resumed,
        )
    };
    let _ = redis::cmd("PING").query_async::<String>(&mut conn).await;
    let events = audit_types(&url, stream).await;
    let after: Vec<&String> = events[events_before..].iter().collect();
    assert!(
        !after.iter().any(|t| *t == "HOLDS_RELEASED"),
        "a fenced hold idled shards after the stall: {after:?}"
    );
    assert_eq!(
        self_fences(&[&a, &b]),
        fences_in_stall,
        "a member self-fenced again after Redis answered (its grant arrived already expired)"
    );
    println!(
        "{how:?} {stall:?}: first order handled {first:?} and the last {last:?} after Redis answered \
         (heartbeat interval {} ms)",
        STALL_TIMING.heartbeat_interval_ms
    );
    let _ = a.stop().await;
    let _ = b.stop().await;
    (first, last)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_pause_longer_than_the_session_idles_no_shard_after_it() {
    stall_and_recover("paused", Duration::from_millis(5_000), Stall::ClientPause).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debug_sleep_longer_than_the_session_idles_no_shard_after_it() {
    stall_and_recover("slept", Duration::from_millis(5_000), Stall::DebugSleep).await;
}

/// Heartbeats every 500 ms, a member expires after 5 s: a 300 ms round trip is a large fraction of the
/// interval.
const SLOW_LINK_TIMING: GroupConfig = GroupConfig {
    heartbeat_interval_ms: 500,
    session_timeout_ms: 5_000,
    rebalance_timeout_ms: 10_000,
};

async fn start_timed(
    url: &str,
    stream: &str,
    id: &str,
    handled: &Handled,
    timing: GroupConfig,
) -> RunningRuntime {
    test_runtime(url)
        .group_config(timing)
        .consumer(member(stream, id, handled))
        .start()
        .await
        .unwrap()
}

/// One member's link gets 150 ms each way (a 300 ms round trip against 500 ms heartbeats), then members
/// elsewhere join and leave, so its heartbeats need a reload and a renewal or a commit. It stays a member
/// (no self-fence, not expired, not fenced), and it holds back no healthy member: none of them self-fences
/// or is fenced, and every order is handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_on_a_slow_link_stays_a_member_through_membership_changes() {
    let redis = RedisServer::start();
    let url = redis.url();
    let proxy = stream_listener_test_support::proxy::FaultProxy::start(redis.addr()).await;
    let stream = "slowlink";
    let handled: Handled = Arc::default();
    let send = producer(&url, stream, 8).await;
    let slow = start_timed(&proxy.url(), stream, "slow", &handled, SLOW_LINK_TIMING).await;
    let fast_a = start_timed(&url, stream, "fast-a", &handled, SLOW_LINK_TIMING).await;
    let fast_b = start_timed(&url, stream, "fast-b", &handled, SLOW_LINK_TIMING).await;
    send.send_batch(&orders(16, 0..3)).await.unwrap();
    wait_until("the first orders handled", Duration::from_secs(30), || {
        handled.lock().unwrap().len() == 48
    })
    .await;
    let events_before = audit_types(&url, stream).await.len();
    proxy.set_latency(Duration::from_millis(150));
    // Membership changes elsewhere: a member joins, another leaves, one more joins.
    let fast_c = start_timed(&url, stream, "fast-c", &handled, SLOW_LINK_TIMING).await;
    send.send_batch(&orders(16, 3..6)).await.unwrap();
    let _ = fast_a.stop().await;
    let fast_d = start_timed(&url, stream, "fast-d", &handled, SLOW_LINK_TIMING).await;
    send.send_batch(&orders(16, 6..9)).await.unwrap();
    let runtimes = [&slow, &fast_b, &fast_c, &fast_d];
    let settled = || {
        handled.lock().unwrap().len() == 144
            && runtimes
                .iter()
                .all(|r| r.statuses().iter().all(|(_, s)| s.owned.len() == 2))
    };
    let done = poll_until(Duration::from_secs(60), Duration::from_millis(20), || {
        let settled = settled();
        async move { settled }
    })
    .await;
    let count = handled.lock().unwrap().len();
    assert!(
        done,
        "not settled: {count} of 144 handled, members {:#?}, audit {:?}",
        runtimes
            .iter()
            .flat_map(|r| r.statuses())
            .collect::<Vec<_>>(),
        &audit_types(&url, stream).await[events_before..]
    );
    let events = audit_types(&url, stream).await;
    let after: Vec<&String> = events[events_before..].iter().collect();
    assert!(
        !after
            .iter()
            .any(|t| *t == "MEMBER_EXPIRED" || *t == "MEMBER_FENCED"),
        "a member was expired or fenced: {after:?}"
    );
    assert_eq!(
        self_fences(&runtimes),
        0,
        "a member self-fenced: {:?}",
        runtimes
            .iter()
            .flat_map(|r| r.statuses())
            .collect::<Vec<_>>()
    );
    for runtime in [slow, fast_b, fast_c, fast_d] {
        let _ = runtime.stop().await;
    }
}
