//! Retention against real redis-server processes (issue 21, item 1): the default producer never trims,
//! each shard's owner trims what every group acknowledged (and nothing else, keeping what `keep` and
//! `keep_for` say), an opt-in cap that drops unread entries is counted and logged, and a full Redis
//! refuses writes, loses nothing and takes writes again once the consumers acknowledged and trimmed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use redis::Value;
use stream_listener::consumer::{trimmed_unread, ConsumerError, Retention};
use stream_listener::coordinator::metadata::GroupConfig;
use stream_listener::producer::{Producer, ProducerConfig, ProducerError};
use stream_listener::topology::{StartFrom, Topology};
use stream_listener::{ConsumerBuilder, Message, RunningRuntime, RuntimeError};
use stream_listener_test_support::aio::{
    command_calls, info, info_field, read_reply_entries, wait_until, wait_until_async, xlen,
    xpending_count, xreadgroup,
};
use stream_listener_test_support::RedisServer;
use stream_listener_tests::{connection, logs, orders, test_runtime, Order};

type Seen = Arc<Mutex<BTreeSet<(String, u32)>>>;

/// Retention runs at most this often in these tests (the default is 5 s).
const FAST: Duration = Duration::from_millis(100);

fn member(
    stream: &str,
    group: &str,
    id: &str,
    seen: &Seen,
    retention: Retention,
) -> ConsumerBuilder {
    let seen = seen.clone();
    ConsumerBuilder::new(stream, group)
        .member_id(id)
        .batch_size(200)
        .retention(retention)
        .handler(move |msg: Message<Order>| {
            let seen = seen.clone();
            async move {
                seen.lock()
                    .unwrap()
                    .insert((msg.payload.key.clone(), msg.payload.seq));
                Ok::<(), std::io::Error>(())
            }
        })
}

fn handled(seen: &Seen) -> usize {
    seen.lock().unwrap().len()
}

async fn start(url: &str, builder: ConsumerBuilder) -> RunningRuntime {
    test_runtime(url).consumer(builder).start().await.unwrap()
}

/// The ids of a stream, oldest first.
async fn ids(conn: &mut stream_listener::Connection, key: &str) -> Vec<String> {
    let entries: Vec<(String, Value)> = redis::cmd("XRANGE")
        .arg(key)
        .arg("-")
        .arg("+")
        .query_async(conn)
        .await
        .unwrap();
    entries.into_iter().map(|(id, _)| id).collect()
}

async fn send(producer: &Producer, keys: u32, seqs: std::ops::Range<u32>) -> Vec<String> {
    let mut sent = Vec::new();
    let batch = orders(keys, seqs);
    for chunk in batch.chunks(500) {
        sent.extend(
            producer
                .send_batch(chunk)
                .await
                .unwrap()
                .into_iter()
                .map(|r| r.id),
        );
    }
    sent
}

async fn wait_len(conn: &stream_listener::Connection, key: &str, len: u64, what: &str) {
    wait_until_async(what, Duration::from_secs(30), || {
        let mut conn = conn.clone();
        async move { xlen(&mut conn, key).await == len }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_producer_keeps_everything_a_group_has_not_read() {
    assert_eq!(ProducerConfig::default().cap_unread, None);
    let redis = RedisServer::start();
    let url = redis.url();
    let mut conn = connection(&url).await;
    Topology::ensure(&mut conn, "unread", 1).await.unwrap();
    // The group that has not read yet, and another one that reads at once and keeps only 500 of what
    // both acknowledged: its retention runs on the shard while `late` has read nothing.
    Topology::ensure_group(&mut conn, "unread", "late", StartFrom::Earliest)
        .await
        .unwrap();
    let eager_seen = Seen::default();
    let eager = start(
        &url,
        member(
            "unread",
            "eager",
            "eager-0",
            &eager_seen,
            Retention::default().keep(500).interval(FAST),
        ),
    )
    .await;
    let producer = Producer::new(conn.clone(), "unread").await.unwrap();
    let mut sent = send(&producer, 4, 0..1000).await;
    wait_until("eager handled everything", Duration::from_secs(30), || {
        handled(&eager_seen) == 4000
    })
    .await;
    wait_until_async(
        "eager acknowledged everything",
        Duration::from_secs(30),
        || {
            let mut conn = conn.clone();
            async move { xpending_count(&mut conn, "unread:0", "eager").await == 0 }
        },
    )
    .await;
    // A retention run of `eager`'s owner after it acknowledged everything (runs follow acks): one more
    // entry to acknowledge, and a run after it.
    let before = retention_runs(&mut conn).await;
    sent.extend(send(&producer, 1, 1000..1001).await);
    wait_until(
        "eager handled the last one",
        Duration::from_secs(30),
        || handled(&eager_seen) == 4001,
    )
    .await;
    wait_runs(&conn, before, 1, "a retention run after eager's acks").await;
    assert_eq!(
        xlen(&mut conn, "unread:0").await,
        4001,
        "nothing unread is trimmed"
    );
    assert_eq!(ids(&mut conn, "unread:0").await, sent);

    let late_seen = Seen::default();
    let late = start(
        &url,
        member(
            "unread",
            "late",
            "late-0",
            &late_seen,
            Retention::default().keep(500).interval(FAST),
        ),
    )
    .await;
    wait_until("late read every entry", Duration::from_secs(30), || {
        handled(&late_seen) == 4001
    })
    .await;
    // Once both groups acknowledged everything, the stream keeps the 500 newest.
    wait_len(&conn, "unread:0", 500, "the stream trimmed to keep = 500").await;
    assert_eq!(ids(&mut conn, "unread:0").await, sent[3501..]);
    assert!(trimmed_unread(&mut conn, "unread")
        .await
        .unwrap()
        .is_empty());
    let _ = late.stop().await;
    let _ = eager.stop().await;
}

/// Retention runs on the server so far: each reads `XINFO STREAM` (nothing else of the library does).
async fn retention_runs(conn: &mut stream_listener::Connection) -> u64 {
    command_calls(conn)
        .await
        .get("xinfo|stream")
        .copied()
        .unwrap_or(0)
}

/// Waits until retention ran `runs` more times than `before`.
async fn wait_runs(conn: &stream_listener::Connection, before: u64, runs: u64, what: &str) {
    wait_until_async(what, Duration::from_secs(30), || {
        let mut conn = conn.clone();
        async move { retention_runs(&mut conn).await >= before + runs }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_trims_what_every_group_acknowledged_and_nothing_else() {
    let redis = RedisServer::start();
    let url = redis.url();
    let mut conn = connection(&url).await;
    Topology::ensure(&mut conn, "two", 1).await.unwrap();
    Topology::ensure_group(&mut conn, "two", "slow", StartFrom::Earliest)
        .await
        .unwrap();
    let producer = Producer::new(conn.clone(), "two").await.unwrap();
    let sent = send(&producer, 2, 0..1000).await;
    // `slow` reads and acknowledges the first 1000 entries, then reads 500 more and leaves them pending.
    let reader = conn.clone();
    let read = |count: usize| {
        let mut conn = reader.clone();
        async move {
            let reply: Value = redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg("slow")
                .arg("c")
                .arg("COUNT")
                .arg(count)
                .arg("STREAMS")
                .arg("two:0")
                .arg(">")
                .query_async(&mut conn)
                .await
                .unwrap();
            read_reply_entries(reply).len()
        }
    };
    assert_eq!(read(1000).await, 1000);
    let _: i64 = redis::cmd("XACK")
        .arg("two:0")
        .arg("slow")
        .arg(&sent[..1000])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(read(500).await, 500);

    let fast_seen = Seen::default();
    let fast = start(
        &url,
        member(
            "two",
            "fast",
            "fast-0",
            &fast_seen,
            Retention::default().interval(FAST),
        ),
    )
    .await;
    wait_until("fast handled everything", Duration::from_secs(30), || {
        handled(&fast_seen) == 2000
    })
    .await;
    // `slow`'s floor is its smallest pending entry, sent[1000]: everything below goes, nothing else.
    wait_len(
        &conn,
        "two:0",
        1000,
        "trimmed to slow's smallest pending entry",
    )
    .await;
    assert_eq!(ids(&mut conn, "two:0").await, sent[1000..]);

    // `slow` acknowledges what it has pending: its floor is now its last-delivered entry, sent[1499].
    let _: i64 = redis::cmd("XACK")
        .arg("two:0")
        .arg("slow")
        .arg(&sent[1000..1500])
        .query_async(&mut conn)
        .await
        .unwrap();
    // Runs follow acknowledgements: give `fast` something to acknowledge.
    let more = send(&producer, 1, 1000..1001).await;
    wait_len(
        &conn,
        "two:0",
        502,
        "trimmed to slow's last-delivered entry",
    )
    .await;
    let mut expected = sent[1499..].to_vec();
    expected.extend(more);
    assert_eq!(ids(&mut conn, "two:0").await, expected);
    assert!(trimmed_unread(&mut conn, "two").await.unwrap().is_empty());
    let _ = fast.stop().await;
}

/// A shard that goes quiet runs no job, so its last acknowledgements are trimmed by the step the driver
/// runs for it after an idle wait (not by a job's end): the entries are handled and acknowledged well
/// within the interval of the run at the ownership's start, so no job end is due.
///
/// With the driver's steps left out, this fails: the shard keeps its 20 entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_that_went_quiet_is_trimmed_after_an_idle_wait() {
    let redis = RedisServer::start();
    let url = redis.url();
    let conn = connection(&url).await;
    Topology::ensure(&mut conn.clone(), "quiet", 1)
        .await
        .unwrap();
    Topology::ensure_group(&mut conn.clone(), "quiet", "g", StartFrom::Earliest)
        .await
        .unwrap();
    let producer = Producer::new(conn.clone(), "quiet").await.unwrap();
    send(&producer, 2, 0..10).await;
    let seen = Seen::default();
    let interval = Duration::from_secs(2);
    // A session of a minute: the periodic look for entries left by others (once per session, a job that
    // runs a step at its end too) does not come within the test.
    let member = test_runtime(&url)
        .group_config(GroupConfig {
            heartbeat_interval_ms: 100,
            session_timeout_ms: 60_000,
            rebalance_timeout_ms: 60_000,
        })
        .consumer(member(
            "quiet",
            "g",
            "m",
            &seen,
            Retention::default().interval(interval),
        ))
        .start()
        .await
        .unwrap();
    wait_until("everything handled", Duration::from_secs(30), || {
        handled(&seen) == 20
    })
    .await;
    // Down to the group's last-delivered entry, the floor.
    wait_len(&conn, "quiet:0", 1, "the quiet shard trimmed").await;
    assert_eq!(xpending_count(&mut conn.clone(), "quiet:0", "g").await, 0);
    let _ = member.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_and_keep_for_hold_acknowledged_entries() {
    let redis = RedisServer::start();
    let url = redis.url();
    let mut conn = connection(&url).await;
    // keep: the newest 300 stay.
    Topology::ensure(&mut conn, "kept", 1).await.unwrap();
    let producer = Producer::new(conn.clone(), "kept").await.unwrap();
    let sent = send(&producer, 1, 0..1000).await;
    let seen = Seen::default();
    let kept = start(
        &url,
        member(
            "kept",
            "g",
            "kept-0",
            &seen,
            Retention::default().keep(300).interval(FAST),
        ),
    )
    .await;
    wait_until("all handled", Duration::from_secs(30), || {
        handled(&seen) == 1000
    })
    .await;
    wait_len(&conn, "kept:0", 300, "the newest 300 kept").await;
    assert_eq!(ids(&mut conn, "kept:0").await, sent[700..]);
    let _ = kept.stop().await;

    // keep_for: entries younger than an hour stay. 400 entries from two hours ago (explicit ids), then
    // 600 new ones.
    Topology::ensure(&mut conn, "aged", 1).await.unwrap();
    let (secs, _): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let old_ms = secs * 1000 - 2 * 3600 * 1000;
    for seq in 0..400u32 {
        let order = Order {
            key: "k0".into(),
            seq,
        };
        let _: String = redis::cmd("XADD")
            .arg("aged:0")
            .arg(format!("{old_ms}-{seq}"))
            .arg("k")
            .arg("k0")
            .arg("p")
            .arg(serde_json::to_vec(&order).unwrap())
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let producer = Producer::new(conn.clone(), "aged").await.unwrap();
    let young = send(&producer, 1, 400..1000).await;
    let seen = Seen::default();
    let aged = start(
        &url,
        member(
            "aged",
            "g",
            "aged-0",
            &seen,
            Retention::default()
                .keep_for(Duration::from_secs(3600))
                .interval(FAST),
        ),
    )
    .await;
    wait_until("all handled", Duration::from_secs(30), || {
        handled(&seen) == 1000
    })
    .await;
    wait_len(
        &conn,
        "aged:0",
        600,
        "the entries older than an hour trimmed",
    )
    .await;
    assert_eq!(ids(&mut conn, "aged:0").await, young);
    let _ = aged.stop().await;
}

/// Every counter as `name{label=value,...}` -> value, summed into `seen` (the recorder resets what it
/// hands out).
fn accumulate(snapshotter: &Snapshotter, seen: &mut BTreeMap<String, u64>) {
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        if let DebugValue::Counter(n) = value {
            let mut labels: Vec<String> = key
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            *seen
                .entry(format!("{}{{{}}}", key.key().name(), labels.join(",")))
                .or_insert(0) += n;
        }
    }
}

/// What Redis says a group lost to trimming so far: entries added, minus those still there, minus those
/// the group read (valid while the group is behind the stream's first entry).
async fn expected_loss(conn: &mut stream_listener::Connection, key: &str, group: &str) -> u64 {
    let info: BTreeMap<String, Value> = redis::cmd("XINFO")
        .arg("STREAM")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap();
    let int = |v: &Value| match v {
        Value::Int(n) => *n as u64,
        other => panic!("not a number: {other:?}"),
    };
    let groups: Vec<BTreeMap<String, Value>> = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap();
    let group = groups
        .iter()
        .find(|g| matches!(&g["name"], Value::BulkString(b) if b == group.as_bytes()))
        .unwrap();
    int(&info["entries-added"]) - int(&info["length"]) - int(&group["entries-read"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_opt_in_cap_that_drops_unread_entries_is_counted_and_logged() {
    logs::capture();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");
    let redis = RedisServer::start();
    let url = redis.url();
    let mut conn = connection(&url).await;
    Topology::ensure(&mut conn, "capped", 1).await.unwrap();
    let seen = Seen::default();
    let builder = || {
        member(
            "capped",
            "g",
            "capped-0",
            &seen,
            Retention::default().interval(FAST),
        )
    };
    let first = start(&url, builder()).await;
    let capped = Producer::with_config(
        conn.clone(),
        "capped",
        ProducerConfig {
            cap_unread: Some(100),
            ..ProducerConfig::default()
        },
    )
    .await
    .unwrap();
    send(&capped, 1, 0..10).await;
    wait_until("the first entries handled", Duration::from_secs(30), || {
        handled(&seen) == 10
    })
    .await;

    // The consumers are down while the capped producer writes: most of it is trimmed unread.
    let _ = first.stop().await;
    send(&capped, 1, 10..2010).await;
    let lost = expected_loss(&mut conn, "capped:0", "g").await;
    let left = xlen(&mut conn, "capped:0").await;
    assert!(lost >= 1000, "the cap trimmed {lost}");
    let second = start(&url, builder()).await;
    wait_until_async("the loss counted in Redis", Duration::from_secs(30), || {
        let mut conn = conn.clone();
        async move { trimmed_unread(&mut conn, "capped").await.unwrap().get("g") == Some(&lost) }
    })
    .await;
    wait_until("what is left handled", Duration::from_secs(30), || {
        handled(&seen) as u64 == 10 + left
    })
    .await;

    // Paused (the member keeps its shard) while the cap trims again: counted once the group caught up.
    second.pause("capped-0").unwrap();
    send(&capped, 1, 2010..3010).await;
    let lost_again = expected_loss(&mut conn, "capped:0", "g").await;
    assert!(lost_again >= 500, "the cap trimmed {lost_again}");
    second.resume("capped-0").unwrap();
    wait_until_async("the second loss counted", Duration::from_secs(30), || {
        let mut conn = conn.clone();
        async move {
            trimmed_unread(&mut conn, "capped").await.unwrap().get("g")
                == Some(&(lost + lost_again))
        }
    })
    .await;
    // Counted once: more runs add nothing.
    let before = retention_runs(&mut conn).await;
    send(&capped, 1, 3010..3011).await;
    wait_runs(&conn, before, 1, "a run after the last acks").await;
    assert_eq!(
        trimmed_unread(&mut conn, "capped").await.unwrap().get("g"),
        Some(&(lost + lost_again))
    );
    let _ = second.stop().await;

    let mut counters = BTreeMap::new();
    accumulate(&snapshotter, &mut counters);
    assert_eq!(
        counters.get("stream_listener_trimmed_unread_total{group=g,stream=capped}"),
        Some(&(lost + lost_again)),
        "{counters:#?}"
    );
    let warned: Vec<_> = logs::events()
        .into_iter()
        .filter(|e| e.level == tracing::Level::WARN && e.fields.0.contains_key("lost"))
        .collect();
    assert_eq!(warned.len(), 2, "{warned:#?}");
    assert_eq!(warned[0].fields.0["lost"], lost.to_string());
    assert_eq!(warned[0].fields.0["group"], "g");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_redis_refuses_writes_loses_nothing_and_takes_them_again_after_retention() {
    let args = ["--maxmemory-policy", "noeviction"];
    let redis = RedisServer::try_start_with_args(args.map(String::from).to_vec(), None).unwrap();
    let url = redis.url();
    let mut conn = connection(&url).await;
    Topology::ensure(&mut conn, "full", 1).await.unwrap();
    let seen = Seen::default();
    // A long session: heartbeats fail while Redis is full (they write), and the member must keep its
    // shard meanwhile.
    let runtime = test_runtime(&url)
        .group_config(GroupConfig {
            heartbeat_interval_ms: 200,
            session_timeout_ms: 20_000,
            rebalance_timeout_ms: 30_000,
        })
        .consumer(member(
            "full",
            "g",
            "full-0",
            &seen,
            Retention::default().interval(FAST),
        ))
        .start()
        .await
        .unwrap();
    let producer = Producer::new(conn.clone(), "full").await.unwrap();
    send(&producer, 1, 0..1).await;
    wait_until("the first entry handled", Duration::from_secs(30), || {
        handled(&seen) == 1
    })
    .await;

    // Paused, the group reads nothing: write until Redis is full, 2 MB above what it uses now.
    runtime.pause("full-0").unwrap();
    let used: u64 = info_field(&info(&mut conn, "memory").await, "used_memory").unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(used + 2 * 1024 * 1024)
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut written = 1u32;
    let error = loop {
        assert!(written < 200_000, "Redis never filled up");
        let batch = orders(1, written..written + 100);
        match producer.send_batch(&batch).await {
            Ok(receipts) => written += receipts.len() as u32,
            Err(error) => break error,
        }
    };
    assert!(
        matches!(error, ProducerError::OutOfMemory { ref stream, .. } if stream == "full:0"),
        "{error:?}"
    );
    assert!(error.to_string().contains("out of memory"), "{error}");
    // Part of the last batch may have been written before the refusal.
    let len = xlen(&mut conn, "full:0").await;
    assert!(len >= u64::from(written), "{len} < {written}");

    // The consumer reads, acknowledges and trims: every entry handled, and writes are taken again.
    runtime.resume("full-0").unwrap();
    wait_until("every entry handled", Duration::from_secs(60), || {
        handled(&seen) as u64 == len
    })
    .await;
    let expected: BTreeSet<(String, u32)> = (0..len as u32).map(|s| ("k0".to_owned(), s)).collect();
    assert_eq!(*seen.lock().unwrap(), expected);
    // Everything acknowledged is trimmed but the group's last-delivered entry...
    wait_len(&conn, "full:0", 1, "the acknowledged entries trimmed").await;
    // ... so there is room again: half as much as filled Redis is taken at once.
    let again = orders(1, 0..(len / 2) as u32);
    for chunk in again.chunks(100) {
        producer.send_batch(chunk).await.unwrap();
    }
    let _ = runtime.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicting_redis_is_refused_at_start_up() {
    let args = ["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"];
    let redis = RedisServer::try_start_with_args(args.map(String::from).to_vec(), None).unwrap();
    let seen = Seen::default();
    let error = test_runtime(&redis.url())
        .consumer(member("evicted", "g", "e-0", &seen, Retention::default()))
        .start()
        .await
        .unwrap_err();
    assert!(
        matches!(
            &error,
            RuntimeError::Consumer(ConsumerError::EvictionPolicy { policy }) if policy == "allkeys-lru"
        ),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("allkeys-lru") && message.contains("noeviction"),
        "{message}"
    );
}

/// The retention script against a model of it, on streams of many shapes: nodes of 1 to 100 entries,
/// holes left by `XDEL`, a count to keep, a group whose floor (its smallest pending entry, or its
/// last-delivered one) falls anywhere, and a bound of a few entries per run. Each run must remove exactly
/// the oldest entries below the floor, as many as the bound and the count kept allow, and say it stopped
/// at the bound exactly when entries below the floor were left for lack of it.
///
/// The script frees whole nodes first (`XTRIM MINID ~`), then trims the rest of the cut exactly; were
/// either step off by a node or an entry, a shape here would show it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_retention_run_trims_exactly_the_oldest_acknowledged_entries_within_its_bound() {
    const SCRIPT: &str = include_str!("../../stream-listener/src/consumer/retention.lua");
    let redis = RedisServer::start();
    let mut conn = connection(&redis.url()).await;
    let script = redis::Script::new(SCRIPT);
    // A seeded linear congruential generator: the same shapes on every run.
    let mut seed: u64 = 0x5eed;
    let mut next = |below: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % below
    };
    let mut runs = 0;
    for case in 0..60 {
        let key = format!("shape:{case}");
        let node = 1 + next(100);
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("stream-node-max-entries")
            .arg(node)
            .query_async(&mut conn)
            .await
            .unwrap();
        let len = 1 + next(600);
        let mut pipe = redis::pipe();
        for i in 1..=len {
            pipe.cmd("XADD")
                .arg(&key)
                .arg(format!("{i}-0"))
                .arg("f")
                .arg("v")
                .ignore();
        }
        let () = pipe.query_async(&mut conn).await.unwrap();
        // Holes: entries deleted one by one, which leave nodes partly empty.
        let mut ids: Vec<u64> = (1..=len).collect();
        for _ in 0..next(len / 3 + 1) {
            let i = 1 + next(len);
            let _: i64 = redis::cmd("XDEL")
                .arg(&key)
                .arg(format!("{i}-0"))
                .query_async(&mut conn)
                .await
                .unwrap();
            ids.retain(|id| *id != i);
        }
        // The group read up to `delivered` and has `pending` of those unacknowledged from `low` on.
        let delivered = next(len + 1);
        let _: () = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&key)
            .arg("g")
            .arg("0")
            .query_async(&mut conn)
            .await
            .unwrap();
        let read = ids.iter().filter(|id| **id <= delivered).count();
        if read > 0 {
            xreadgroup(&mut conn, "g", "c", read, &key).await;
        }
        let read_ids: Vec<u64> = ids.iter().copied().filter(|id| *id <= delivered).collect();
        let low = read_ids
            .get(next(read_ids.len() as u64 + 1) as usize)
            .copied();
        let acked: Vec<String> = read_ids
            .iter()
            .filter(|id| low.is_none_or(|low| **id < low))
            .map(|id| format!("{id}-0"))
            .collect();
        if !acked.is_empty() {
            let _: i64 = redis::cmd("XACK")
                .arg(&key)
                .arg("g")
                .arg(&acked)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
        // Everything below the floor was acknowledged: the smallest pending entry, or the group's
        // last-delivered one when nothing is pending.
        let floor = low.unwrap_or(read_ids.last().copied().unwrap_or(0));
        let keep = if next(3) == 0 { next(len) } else { 0 };
        let bound = 1 + next(40);
        let mut model = ids.clone();
        loop {
            let below = model.iter().filter(|id| **id < floor).count() as u64;
            let excess = (model.len() as u64).saturating_sub(keep);
            let limit = excess.min(bound);
            let expect_trimmed = below.min(limit);
            let expect_saturated = below > limit && excess > bound;
            let reply: Vec<Value> = script
                .key(&key)
                .arg(keep)
                .arg(0)
                .arg(bound)
                .invoke_async(&mut conn)
                .await
                .unwrap();
            runs += 1;
            let int = |v: &Value| match v {
                Value::Int(n) => *n as u64,
                other => panic!("not an integer: {other:?}"),
            };
            model.drain(..expect_trimmed as usize);
            let left: Vec<u64> = ids_of(&mut conn, &key).await;
            let shape = format!(
                "case {case}: node {node}, {len} entries, keep {keep}, floor {floor}, bound {bound}"
            );
            assert_eq!(left, model, "{shape}: what is left");
            assert_eq!(int(&reply[0]), expect_trimmed, "{shape}: trimmed");
            assert_eq!(int(&reply[1]) == 1, expect_saturated, "{shape}: saturated");
            if !expect_saturated {
                break;
            }
        }
    }
    assert!(runs > 100, "{runs} runs");
}

async fn ids_of(conn: &mut stream_listener::Connection, key: &str) -> Vec<u64> {
    ids(conn, key)
        .await
        .iter()
        .map(|id| id.split('-').next().unwrap().parse().unwrap())
        .collect()
}
