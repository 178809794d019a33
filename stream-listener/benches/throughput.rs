//! Consumption throughput: the [`Consumer`] (no-op handler) against a hand-written redis-rs loop, draining
//! the same 8 shards x 50,000 entries on a redis-server this benchmark starts itself.
//!
//! `cargo bench -p stream-listener --bench throughput` (set `SL_BENCH_ENTRIES` for entries per shard).
//!
//! Both sides drain the same streams through two different consumer groups, one run after the other, each
//! with one multiplexed connection for its non-blocking reads and acks. The baseline is the leanest loop
//! one would write: one task per shard, `XREADGROUP COUNT 100 STREAMS key >` without `BLOCK`, ids picked
//! out of the raw reply, one `XACK` per batch.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::Value;
use stream_listener::consumer::{BoxedHandler, Consumer, ConsumerConfig, RawMessage};
use stream_listener::member::lifecycle::{FencingToken, ShardCommand};
use stream_listener_test_support::RedisServer;
use tokio::sync::{mpsc, Notify};

const SHARDS: u32 = 8;
const BATCH: usize = 100;
const PREFIX: &str = "bench";

fn key(shard: u32) -> String {
    format!("{PREFIX}:{shard}")
}

async fn fill(conn: &mut MultiplexedConnection, per_shard: u64) {
    for shard in 0..SHARDS {
        for group in ["raw", "consumer"] {
            let _: () = redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(key(shard))
                .arg(group)
                .arg("0")
                .arg("MKSTREAM")
                .query_async(conn)
                .await
                .expect("XGROUP CREATE");
        }
        let mut n = 0;
        while n < per_shard {
            let mut pipe = redis::pipe();
            for i in n..(n + 1000).min(per_shard) {
                pipe.cmd("XADD")
                    .arg(key(shard))
                    .arg("*")
                    .arg("k")
                    .arg(format!("customer-{}", i % 1000))
                    .arg("p")
                    .arg(format!(
                        "{{\"id\":{i},\"customer\":\"customer-{}\",\"amount_cents\":{}}}",
                        i % 1000,
                        i % 10_000
                    ))
                    .ignore();
            }
            let _: () = pipe.query_async(conn).await.expect("XADD");
            n += 1000;
        }
    }
}

/// Entry ids out of a raw single-stream `XREADGROUP` reply.
fn ids(reply: Value) -> Vec<Vec<u8>> {
    let Value::Array(mut streams) = reply else {
        return Vec::new();
    };
    let Some(Value::Array(mut stream)) = streams.pop() else {
        return Vec::new();
    };
    let Some(Value::Array(entries)) = stream.pop() else {
        return Vec::new();
    };
    entries
        .into_iter()
        .filter_map(|entry| match entry {
            Value::Array(mut pair) if !pair.is_empty() => match pair.swap_remove(0) {
                Value::BulkString(id) => Some(id),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

async fn run_baseline(conn: &MultiplexedConnection) -> (Duration, u64) {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for shard in 0..SHARDS {
        let mut conn = conn.clone();
        tasks.push(tokio::spawn(async move {
            let key = key(shard);
            let mut handled = 0u64;
            loop {
                let reply: Value = redis::cmd("XREADGROUP")
                    .arg("GROUP")
                    .arg("raw")
                    .arg("c")
                    .arg("COUNT")
                    .arg(BATCH)
                    .arg("STREAMS")
                    .arg(&key)
                    .arg(">")
                    .query_async(&mut conn)
                    .await
                    .expect("XREADGROUP");
                let ids = ids(reply);
                if ids.is_empty() {
                    return handled;
                }
                handled += ids.len() as u64;
                let _: i64 = redis::cmd("XACK")
                    .arg(&key)
                    .arg("raw")
                    .arg(ids)
                    .query_async(&mut conn)
                    .await
                    .expect("XACK");
            }
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.expect("baseline task");
    }
    (started.elapsed(), total)
}

async fn total_pending(conn: &mut MultiplexedConnection, group: &str) -> i64 {
    let mut total = 0;
    for shard in 0..SHARDS {
        let reply: Value = redis::cmd("XPENDING")
            .arg(key(shard))
            .arg(group)
            .query_async(conn)
            .await
            .expect("XPENDING");
        if let Value::Array(items) = reply {
            if let Some(Value::Int(n)) = items.first() {
                total += n;
            }
        }
    }
    total
}

async fn lag(conn: &mut MultiplexedConnection, group: &str) -> i64 {
    let mut total = 0;
    for shard in 0..SHARDS {
        let groups: Vec<std::collections::HashMap<String, Value>> = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(key(shard))
            .query_async(conn)
            .await
            .expect("XINFO GROUPS");
        for g in groups {
            if matches!(g.get("name"), Some(Value::BulkString(n)) if n == group.as_bytes()) {
                if let Some(Value::Int(l)) = g.get("lag") {
                    total += l;
                }
            }
        }
    }
    total
}

async fn run_consumer(url: &str, conn: &mut MultiplexedConnection, expected: u64) -> Duration {
    // The handler signals the last entry itself, so waiting costs no CPU while the consumer runs.
    let handled = Arc::new(AtomicU64::new(0));
    let all_handled = Arc::new(Notify::new());
    let (counter, done) = (handled.clone(), all_handled.clone());
    let handler = BoxedHandler::raw(move |_msg: RawMessage| {
        if counter.fetch_add(1, Ordering::Relaxed) + 1 == expected {
            done.notify_one();
        }
        std::future::ready(Ok::<(), std::convert::Infallible>(()))
    });
    let mut config = ConsumerConfig::new(PREFIX, "consumer", "bench-m0");
    config.batch_size = BATCH;
    config.runtime_max_concurrency = SHARDS as usize;
    let client = redis::Client::open(url).expect("client");
    let consumer = Consumer::connect(client, config, handler)
        .await
        .expect("consumer");
    let (commands, command_rx) = mpsc::channel(16);
    let (report_tx, mut report_rx) = mpsc::channel(1024);
    tokio::spawn(async move { while report_rx.recv().await.is_some() {} });
    let started = Instant::now();
    let task = tokio::spawn(consumer.run(command_rx, report_tx));
    let token = FencingToken {
        member_id: Arc::from("bench-m0"),
        member_epoch: 1,
    };
    for shard in 0..SHARDS {
        commands
            .send(ShardCommand::Assign {
                shard,
                token: token.clone(),
            })
            .await
            .expect("assign");
    }
    tokio::time::timeout(Duration::from_secs(600), all_handled.notified())
        .await
        .expect("consumer did not finish");
    assert_eq!(handled.load(Ordering::Relaxed), expected);
    // Done means acknowledged, not just handled: the last acks are at most one round trip away.
    let deadline = Instant::now() + Duration::from_secs(60);
    while total_pending(conn, "consumer").await > 0 {
        assert!(Instant::now() < deadline, "consumer did not ack");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = started.elapsed();
    drop(commands);
    task.await.expect("consumer task");
    elapsed
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let per_shard = env("SL_BENCH_ENTRIES", 50_000);
    let rounds = env("SL_BENCH_ROUNDS", 3).max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let server = RedisServer::start();
    runtime.block_on(async {
        let client = redis::Client::open(server.url()).expect("client");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let raw_conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let expected = per_shard * u64::from(SHARDS);
        println!(
            "redis {:?}; {SHARDS} shards x {per_shard} entries, batch {BATCH}; {rounds} rounds",
            server.version()
        );
        let (mut baseline_rates, mut consumer_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let _: () = redis::cmd("FLUSHALL")
                .query_async(&mut conn)
                .await
                .expect("FLUSHALL");
            fill(&mut conn, per_shard).await;
            // Alternate which side goes first, so neither always meets a warmer server.
            let (mut baseline, mut ours) = (Duration::ZERO, Duration::ZERO);
            for side in [round % 2, 1 - round % 2] {
                if side == 0 {
                    let (elapsed, total) = run_baseline(&raw_conn).await;
                    assert_eq!(total, expected, "baseline drained everything");
                    assert_eq!(total_pending(&mut conn, "raw").await, 0);
                    baseline = elapsed;
                } else {
                    ours = run_consumer(&server.url(), &mut conn, expected).await;
                    assert_eq!(lag(&mut conn, "consumer").await, 0, "consumer drained everything");
                }
            }
            let baseline_rate = expected as f64 / baseline.as_secs_f64();
            let rate = expected as f64 / ours.as_secs_f64();
            println!(
                "round {round}: hand-written {baseline_rate:>8.0} entries/s ({baseline:.2?}), \
                 Consumer {rate:>8.0} entries/s ({ours:.2?}), ratio {:.2}",
                rate / baseline_rate
            );
            baseline_rates.push(baseline_rate);
            consumer_rates.push(rate);
            ratios.push(rate / baseline_rate);
        }
        println!(
            "median: hand-written {:.0} entries/s, Consumer {:.0} entries/s, ratio Consumer / hand-written = {:.2}",
            median(baseline_rates),
            median(consumer_rates),
            median(ratios)
        );
    });
}
