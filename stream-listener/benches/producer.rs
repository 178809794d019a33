//! Producer throughput: `Producer::send_batch` (batches of 100) against pipelined raw XADD of the same
//! keys and payloads, on a redis-server this benchmark starts itself. Both write the same entries: `k` and
//! `p` on a stream that was never resized (version 1), and also the topology version field `v` on a
//! resized one (version 2), so each ratio measures the producer's own code on that layout. Each round
//! writes the entries in alternating slices of both sides (this 2-core VM's speed drifts by tens of per
//! cent within seconds; whole-run alternation let that drift decide single rounds).
//!
//! Beside the rates it prints the client CPU each side spent per entry (this process's CPU time over its
//! slices, `/proc/self/task/*/schedstat`; the runtime is single-threaded and Redis is another process).
//!
//! Last, with a replica attached: the producer with `min_replicas: 1` against raw pipelines that end in
//! `WAIT 1`, and against itself without waiting.
//!
//! `cargo bench -p stream-listener --bench producer` (set `SL_BENCH_ENTRIES` to change the entry count,
//! `SL_BENCH_ROUNDS` the rounds).

use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use serde::Serialize;
use stream_listener::producer::{Producer, ProducerConfig};
use stream_listener::routing::{shard_for_key, shard_stream_key};
use stream_listener::topology::Topology;
use stream_listener_test_support::cpu::process_cpu;
use stream_listener_test_support::RedisServer;

const BATCH: usize = 100;
const SHARDS: u32 = 8;
/// Alternating slices per round and layout.
const SLICES: u64 = 20;

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

/// A fresh stream "bench" with SHARDS shards: at version 1, or at version 2 after a resize from SHARDS / 2
/// (its entries then carry `v`). Returns the version.
async fn fresh_stream(conn: &mut MultiplexedConnection, resized: bool) -> u64 {
    flush(conn).await;
    if !resized {
        return Topology::ensure(conn, "bench", SHARDS)
            .await
            .expect("topology")
            .version();
    }
    Topology::ensure(conn, "bench", SHARDS / 2)
        .await
        .expect("topology");
    Topology::resize_with_grace(conn, "bench", SHARDS, Duration::ZERO)
        .await
        .expect("resize")
        .version()
}

/// Producer::send_batch of entries `range`, with JSON serialization and routing, in batches of BATCH.
async fn run_producer(
    producer: &Producer<MultiplexedConnection>,
    range: std::ops::Range<u64>,
) -> Duration {
    let start = Instant::now();
    let mut next = range.start;
    while next < range.end {
        let end = (next + BATCH as u64).min(range.end);
        let batch: Vec<(String, Order)> = (next..end).map(order).collect();
        producer.send_batch(&batch).await.expect("send_batch");
        next = end;
    }
    start.elapsed()
}

/// The floor: the same XADDs (same routing, same JSON, the same fields: `v` past version 1), pipelined
/// BATCH at a time, with no producer logic; with `wait`, each pipeline ends with `WAIT 1`, as the
/// producer's `min_replicas: 1` does.
async fn run_raw(
    conn: &mut MultiplexedConnection,
    range: std::ops::Range<u64>,
    version: u64,
    wait: bool,
) -> Duration {
    let start = Instant::now();
    let mut next = range.start;
    while next < range.end {
        let end = (next + BATCH as u64).min(range.end);
        let mut pipe = redis::pipe();
        for i in next..end {
            let (key, payload) = order(i);
            let stream = shard_stream_key("bench", shard_for_key(key.as_bytes(), SHARDS));
            let cmd = pipe
                .cmd("XADD")
                .arg(stream)
                .arg("NOMKSTREAM")
                .arg("*")
                .arg("k")
                .arg(key.as_bytes())
                .arg("p")
                .arg(serde_json::to_vec(&payload).expect("json"));
            if version > 1 {
                cmd.arg("v").arg(version);
            }
        }
        if wait {
            pipe.cmd("WAIT").arg(1).arg(1000);
        }
        let _: Vec<redis::Value> = pipe.query_async(conn).await.expect("pipeline");
        next = end;
    }
    start.elapsed()
}

/// One round on one layout: `entries` for each side, written in SLICES alternating slices (which side
/// goes first alternates too), so a machine that speeds up or slows down mid-round weighs on both alike.
/// Returns (producer, raw) total times and client CPU times. With `min_replicas` (a replica attached),
/// both sides wait for it.
async fn round(
    conn: &mut MultiplexedConnection,
    entries: u64,
    resized: bool,
    min_replicas: u32,
) -> [Duration; 4] {
    let version = fresh_stream(conn, resized).await;
    // The default producer: no cap (the consumers trim what every group acknowledged).
    let config = ProducerConfig {
        min_replicas,
        ..ProducerConfig::default()
    };
    let producer = Producer::with_config(conn.clone(), "bench", config)
        .await
        .expect("producer");
    let slice = entries.div_ceil(SLICES).max(1);
    let [mut ours, mut raw, mut ours_cpu, mut raw_cpu] = [Duration::ZERO; 4];
    for (i, start) in (0..entries).step_by(slice as usize).enumerate() {
        let range = start..(start + slice).min(entries);
        for side in [i % 2, 1 - i % 2] {
            let cpu = process_cpu();
            if side == 0 {
                ours += run_producer(&producer, range.clone()).await;
                ours_cpu += process_cpu().saturating_sub(cpu);
            } else {
                raw += run_raw(conn, range.clone(), version, min_replicas > 0).await;
                raw_cpu += process_cpu().saturating_sub(cpu);
            }
        }
    }
    [ours, raw, ours_cpu, raw_cpu]
}

/// Client CPU per entry, µs.
fn cpu_us(entries: u64, cpu: Duration) -> f64 {
    cpu.as_secs_f64() * 1e6 / entries as f64
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
        // Warm up every path once.
        for resized in [false, true] {
            round(&mut conn, entries.min(10_000), resized, 0).await;
        }
        let rounds: usize = std::env::var("SL_BENCH_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5)
            .max(1);
        // [version 1, version 2]: producer / raw per round, and CPU per entry (producer, raw).
        let mut ratios = [Vec::new(), Vec::new()];
        let mut cpus = [Vec::new(), Vec::new()];
        for round_no in 0..rounds {
            let [p1, r1, pc1, rc1] = round(&mut conn, entries, false, 0).await;
            let [p2, r2, pc2, rc2] = round(&mut conn, entries, true, 0).await;
            let (v1, v2) = (
                r1.as_secs_f64() / p1.as_secs_f64(),
                r2.as_secs_f64() / p2.as_secs_f64(),
            );
            println!(
                "round {round_no}: version 1 (k,p): producer {:>9.0}/s ({:.2} µs CPU/entry) raw {:>9.0}/s \
                 ({:.2} µs) ratio {v1:.3}   version 2 (k,p,v): producer {:>9.0}/s ({:.2} µs) raw {:>9.0}/s \
                 ({:.2} µs) ratio {v2:.3}",
                rate(entries, p1),
                cpu_us(entries, pc1),
                rate(entries, r1),
                cpu_us(entries, rc1),
                rate(entries, p2),
                cpu_us(entries, pc2),
                rate(entries, r2),
                cpu_us(entries, rc2),
            );
            ratios[0].push(v1);
            ratios[1].push(v2);
            cpus[0].push((cpu_us(entries, pc1), cpu_us(entries, rc1)));
            cpus[1].push((cpu_us(entries, pc2), cpu_us(entries, rc2)));
        }
        for list in &mut ratios {
            list.sort_by(f64::total_cmp);
        }
        let median_cpu = |list: &[(f64, f64)], side: usize| {
            let mut v: Vec<f64> = list.iter().map(|c| if side == 0 { c.0 } else { c.1 }).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!(
            "median over {rounds} rounds, producer / raw XADD of the same entries: never resized \
             (k,p) {:.3}; resized (k,p,v) {:.3}",
            ratios[0][rounds / 2],
            ratios[1][rounds / 2]
        );
        println!(
            "client CPU per entry (median): never resized: producer {:.2} µs, raw {:.2} µs (ratio {:.2}); \
             resized: producer {:.2} µs, raw {:.2} µs (ratio {:.2})",
            median_cpu(&cpus[0], 0),
            median_cpu(&cpus[0], 1),
            median_cpu(&cpus[0], 0) / median_cpu(&cpus[0], 1).max(1e-9),
            median_cpu(&cpus[1], 0),
            median_cpu(&cpus[1], 1),
            median_cpu(&cpus[1], 0) / median_cpu(&cpus[1], 1).max(1e-9),
        );
        replicated(&server, &mut conn, entries, rounds).await;
    });
}

/// With a replica attached: the producer with `min_replicas: 1` against the raw pipelines ending in
/// `WAIT 1`, and against itself without waiting (what the wait costs).
async fn replicated(
    server: &RedisServer,
    conn: &mut MultiplexedConnection,
    entries: u64,
    rounds: usize,
) {
    let port = server.port().to_string();
    let _replica = RedisServer::try_start_with_args(
        ["--replicaof", "127.0.0.1", port.as_str()]
            .map(String::from)
            .to_vec(),
        None,
    )
    .expect("a replica");
    let started = Instant::now();
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(conn)
            .await
            .expect("INFO");
        if info.contains("state=online") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no replica online: {info}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    round(conn, entries.min(10_000), false, 1).await;
    let (mut ratios, mut waiting, mut not_waiting) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let [ours, raw, ..] = round(conn, entries, false, 1).await;
        ratios.push(raw.as_secs_f64() / ours.as_secs_f64());
        waiting.push(rate(entries, ours));
        let [ours, ..] = round(conn, entries, false, 0).await;
        not_waiting.push(rate(entries, ours));
    }
    for list in [&mut ratios, &mut waiting, &mut not_waiting] {
        list.sort_by(f64::total_cmp);
    }
    println!(
        "with a replica (median over {rounds} rounds): producer with min_replicas 1 {:.0}/s, ratio to \
         raw pipelines ending in WAIT 1: {:.3}; the producer without waiting {:.0}/s",
        waiting[rounds / 2],
        ratios[rounds / 2],
        not_waiting[rounds / 2]
    );
}
