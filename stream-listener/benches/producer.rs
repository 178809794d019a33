//! Producer throughput: `Producer::send_batch` (batches of 100) against pipelined raw XADD of the same
//! keys and payloads, on a redis-server this benchmark starts itself. Two hand-written loops: one writes
//! only `k` and `p`; the other also the topology version field `v` the producer writes (stale-write
//! detection), so the entries are the same and the ratio measures the producer's own code.
//!
//! `cargo bench -p stream-listener --bench producer` (set `SL_BENCH_ENTRIES` to change the entry count).

use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use serde::Serialize;
use stream_listener::producer::{Producer, ProducerConfig};
use stream_listener::routing::{shard_for_key, shard_stream_key};
use stream_listener::topology::Topology;
use stream_listener_test_support::RedisServer;

const BATCH: usize = 100;
const SHARDS: u32 = 8;

#[derive(Serialize)]
struct Order {
    id: u64,
    customer: String,
    amount_cents: i64,
}

fn order(i: u64) -> (String, Order) {
    let customer = format!("customer-{}", i % 1000);
    (
        customer.clone(),
        Order {
            id: i,
            customer,
            amount_cents: (i % 10_000) as i64,
        },
    )
}

async fn flush(conn: &mut MultiplexedConnection) {
    let _: () = redis::cmd("FLUSHALL")
        .query_async(conn)
        .await
        .expect("FLUSHALL");
}

/// Producer::send_batch, with JSON serialization and routing, in batches of BATCH.
async fn run_producer(conn: &mut MultiplexedConnection, entries: u64, max_len: u64) -> Duration {
    flush(conn).await;
    Topology::ensure(conn, "bench", SHARDS)
        .await
        .expect("topology");
    let config = ProducerConfig {
        max_len: Some(max_len),
        ..ProducerConfig::default()
    };
    let producer = Producer::with_config(conn.clone(), "bench", config)
        .await
        .expect("producer");
    let start = Instant::now();
    let mut next = 0u64;
    while next < entries {
        let end = (next + BATCH as u64).min(entries);
        let batch: Vec<(String, Order)> = (next..end).map(order).collect();
        producer.send_batch(&batch).await.expect("send_batch");
        next = end;
    }
    start.elapsed()
}

/// The floor: the same XADDs (same routing, same JSON), pipelined BATCH at a time, with no producer logic;
/// with `version_field`, each entry also carries `v` as the producer's do.
async fn run_raw(
    conn: &mut MultiplexedConnection,
    entries: u64,
    max_len: u64,
    version_field: bool,
) -> Duration {
    flush(conn).await;
    let version = Topology::ensure(conn, "bench", SHARDS)
        .await
        .expect("topology")
        .version();
    let start = Instant::now();
    let mut next = 0u64;
    while next < entries {
        let end = (next + BATCH as u64).min(entries);
        let mut pipe = redis::pipe();
        for i in next..end {
            let (key, payload) = order(i);
            let stream = shard_stream_key("bench", shard_for_key(key.as_bytes(), SHARDS));
            let cmd = pipe
                .cmd("XADD")
                .arg(stream)
                .arg("NOMKSTREAM")
                .arg("MAXLEN")
                .arg("~")
                .arg(max_len)
                .arg("*")
                .arg("k")
                .arg(key.as_bytes())
                .arg("p")
                .arg(serde_json::to_vec(&payload).expect("json"));
            if version_field {
                cmd.arg("v").arg(version);
            }
        }
        let _: Vec<redis::Value> = pipe.query_async(conn).await.expect("pipeline");
        next = end;
    }
    start.elapsed()
}

fn rate(entries: u64, elapsed: Duration) -> f64 {
    entries as f64 / elapsed.as_secs_f64()
}

fn main() {
    let entries: u64 = std::env::var("SL_BENCH_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    // Under `cargo test --benches` run a token amount to prove it works.
    let entries = if std::env::args().any(|a| a == "--bench") {
        entries
    } else {
        2_000
    };
    let max_len = 1_000_000;

    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let client = redis::Client::open(server.url()).expect("client");
        let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
        let version = server.version();
        println!(
            "producer bench: {entries} entries, {SHARDS} shards, batches of {BATCH}, redis {}.{}.{} on port {}",
            version.0,
            version.1,
            version.2,
            server.port()
        );
        // Warm up both paths once, then alternate to even out drift.
        run_producer(&mut conn, entries.min(10_000), max_len).await;
        run_raw(&mut conn, entries.min(10_000), max_len, false).await;
        run_raw(&mut conn, entries.min(10_000), max_len, true).await;
        let rounds: usize = std::env::var("SL_BENCH_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5)
            .max(1);
        let (mut ratios, mut same_entry_ratios) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            // Rotate which side goes first, so none always meets a warmer server.
            let mut times = [Duration::ZERO; 3];
            for step in 0..3 {
                let side = (round + step) % 3;
                times[side] = match side {
                    0 => run_producer(&mut conn, entries, max_len).await,
                    1 => run_raw(&mut conn, entries, max_len, false).await,
                    _ => run_raw(&mut conn, entries, max_len, true).await,
                };
            }
            let [p, r, v] = times;
            let (ratio, same) = (
                r.as_secs_f64() / p.as_secs_f64(),
                v.as_secs_f64() / p.as_secs_f64(),
            );
            println!(
                "round {round}: producer.send_batch {:>9.0}/s   raw XADD k,p {:>9.0}/s (ratio {ratio:.3})   raw XADD k,p,v {:>9.0}/s (ratio {same:.3})",
                rate(entries, p),
                rate(entries, r),
                rate(entries, v),
            );
            ratios.push(ratio);
            same_entry_ratios.push(same);
        }
        ratios.sort_by(f64::total_cmp);
        same_entry_ratios.sort_by(f64::total_cmp);
        println!(
            "median over {rounds} rotated rounds: producer / raw k,p {:.3}; producer / raw k,p,v (the same entries) {:.3}",
            ratios[ratios.len() / 2],
            same_entry_ratios[same_entry_ratios.len() / 2]
        );
    });
}
