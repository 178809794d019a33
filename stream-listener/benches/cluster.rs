//! Single node vs Redis Cluster, in one run: production (the [`Producer`]'s `send_batch` against a
//! hand-written loop of per-shard XADD pipelines) and consumption (the [`Consumer`], no-op handler,
//! against a hand-written per-shard `XREADGROUP` + `XACK` loop), on a redis-server and on a 3-master +
//! 3-replica cluster this benchmark starts itself, all through [`Connection`].
//!
//! `cargo bench -p stream-listener --bench cluster` (`SL_BENCH_ENTRIES`: entries per shard, default
//! 50,000: with 10,000 a phase took 0.2 s and one round's ratio said 0.76, the next 1.01;
//! `SL_BENCH_ROUNDS`: default 3; one round's ratio swung from 0.77 to 1.01 and back, so the last lines
//! are medians over the rounds). On a 2-core machine running 7 redis-servers a cluster cannot be
//! faster: the ratio measures overhead. The producer runs twice: batches of distinct keys (plain
//! XADDs), and `producer x4`, each key four times in a row (each shard's part a transaction).
//! Production also prints the client CPU per entry of each side (this process's threads only, not the
//! redis-servers'), which decides the ratio on a busy machine.
//! The producer is made as `Producer::connect` makes it (on a cluster, a connection per master);
//! `SL_BENCH_PRODUCER=connection` makes it over the shared connection, as `Producer::new` does.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;
use stream_listener::connection::{ConnectOptions, Connection, RedisTarget};
use stream_listener::consumer::{BoxedHandler, Consumer, ConsumerConfig, RawMessage};
use stream_listener::member::lifecycle::{FencingToken, ShardCommand};
use stream_listener::topology::Topology;
use stream_listener::{Producer, ProducerConfig};
use stream_listener_test_support::aio::{xack, xpending_count, xreadgroup};
use stream_listener_test_support::cpu::process_cpu;
use stream_listener_test_support::{RedisCluster, RedisServer};
use tokio::sync::{mpsc, Notify};

const SHARDS: u32 = 8;
const BATCH: usize = 100;
const SEND_BATCH: u64 = 1000;

fn payload(i: u64) -> String {
    format!(
        "{{\"id\":{i},\"customer\":\"customer-{}\",\"amount_cents\":{}}}",
        i % 1000,
        i % 10_000
    )
}

/// Hand-written production: per shard, pipelines of `XADD key * k .. p ..`, shards concurrently.
async fn produce_raw(conn: &Connection, prefix: &str, per_shard: u64) -> Duration {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for shard in 0..SHARDS {
        let mut conn = conn.clone();
        let key = format!("{prefix}:{shard}");
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            while n < per_shard {
                let mut pipe = redis::pipe();
                for i in n..(n + SEND_BATCH / u64::from(SHARDS)).min(per_shard) {
                    pipe.cmd("XADD")
                        .arg(&key)
                        .arg("*")
                        .arg("k")
                        .arg(format!("customer-{}", i % 1000))
                        .arg("p")
                        .arg(payload(i))
                        .ignore();
                }
                n += SEND_BATCH / u64::from(SHARDS);
                let _: () = pipe.query_async(&mut conn).await.expect("XADD");
            }
        }));
    }
    for task in tasks {
        task.await.expect("producer task");
    }
    started.elapsed()
}

/// The library's producer: as many concurrent `send_batch` callers as the hand-written loop has shard
/// tasks, each sending batches of the same size (keyed messages, routed, split per slot), so both sides
/// keep the same number of pipelines in flight. Each key `repeats` times in a row: with 1 a batch's keys
/// are distinct (plain XADDs); with more, each shard's part is a transaction. Made as `Producer::connect` makes it (on a cluster, with
/// a connection per master); with `SL_BENCH_PRODUCER=connection`, as `Producer::new` over the shared
/// connection (each shard's part through redis-rs's routing).
async fn produce_lib(
    target: &RedisTarget,
    conn: &Connection,
    prefix: &str,
    total: u64,
    repeats: u64,
) -> Duration {
    let config = ProducerConfig::default();
    let producer = if std::env::var("SL_BENCH_PRODUCER").as_deref() == Ok("connection") {
        let mut c = conn.clone();
        Topology::ensure(&mut c, prefix, SHARDS)
            .await
            .expect("topology");
        Producer::with_config(conn.clone(), prefix, config).await
    } else {
        Producer::connect_to(target, prefix, Some(SHARDS), config).await
    };
    let producer = Arc::new(producer.expect("producer"));
    let (tasks, batch) = (u64::from(SHARDS), SEND_BATCH / u64::from(SHARDS));
    let started = Instant::now();
    let mut running = Vec::new();
    for task in 0..tasks {
        let producer = producer.clone();
        let (from, to) = (total * task / tasks, total * (task + 1) / tasks);
        running.push(tokio::spawn(async move {
            let mut n = from;
            while n < to {
                let messages: Vec<(String, String)> = (n..(n + batch).min(to))
                    .map(|i| (format!("customer-{}", (i / repeats) % 1000), payload(i)))
                    .collect();
                producer
                    .send_batch_bytes(&messages)
                    .await
                    .expect("send_batch");
                n += batch;
            }
        }));
    }
    for task in running {
        task.await.expect("producer task");
    }
    started.elapsed()
}

async fn create_groups(conn: &Connection, prefix: &str) {
    let mut conn = conn.clone();
    for shard in 0..SHARDS {
        for group in ["raw", "consumer"] {
            let _: Value = redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(format!("{prefix}:{shard}"))
                .arg(group)
                .arg("0")
                .arg("MKSTREAM")
                .query_async(&mut conn)
                .await
                .unwrap_or(Value::Nil);
        }
    }
}

/// Hand-written consumption: one task per shard, `XREADGROUP COUNT 100` without BLOCK, one `XACK`.
async fn consume_raw(conn: &Connection, prefix: &str) -> (Duration, u64) {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for shard in 0..SHARDS {
        let mut conn = conn.clone();
        let key = format!("{prefix}:{shard}");
        tasks.push(tokio::spawn(async move {
            let mut handled = 0u64;
            loop {
                let entries = xreadgroup(&mut conn, "raw", "c", BATCH, &key).await;
                if entries.is_empty() {
                    return handled;
                }
                handled += entries.len() as u64;
                let ids: Vec<Vec<u8>> = entries.into_iter().map(|(id, _)| id).collect();
                xack(&mut conn, &key, "raw", ids).await;
            }
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.expect("baseline task");
    }
    (started.elapsed(), total)
}

async fn pending(conn: &Connection, prefix: &str) -> i64 {
    let mut conn = conn.clone();
    let mut total = 0;
    for shard in 0..SHARDS {
        total += xpending_count(&mut conn, &format!("{prefix}:{shard}"), "consumer").await;
    }
    total
}

async fn consume_lib(
    target: &RedisTarget,
    conn: &Connection,
    prefix: &str,
    expected: u64,
) -> Duration {
    let handled = Arc::new(AtomicU64::new(0));
    let all_handled = Arc::new(Notify::new());
    let (counter, done) = (handled.clone(), all_handled.clone());
    let handler = BoxedHandler::raw(move |_msg: RawMessage| {
        if counter.fetch_add(1, Ordering::Relaxed) + 1 == expected {
            done.notify_one();
        }
        std::future::ready(Ok::<(), std::convert::Infallible>(()))
    });
    let mut config = ConsumerConfig::new(prefix, "consumer", "bench-m0");
    config.batch_size = BATCH;
    config.runtime_max_concurrency = SHARDS as usize;
    let consumer = Consumer::connect(target.clone(), config, handler)
        .await
        .expect("consumer");
    let (commands, command_rx) = mpsc::unbounded_channel();
    let (report_tx, mut report_rx) = mpsc::unbounded_channel();
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
            .expect("assign");
    }
    tokio::time::timeout(Duration::from_secs(600), all_handled.notified())
        .await
        .expect("consumer did not finish");
    let deadline = Instant::now() + Duration::from_secs(60);
    while pending(conn, prefix).await > 0 {
        assert!(Instant::now() < deadline, "consumer did not ack");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = started.elapsed();
    drop(commands);
    task.await.expect("consumer task");
    elapsed
}

/// Rates (entries/s): raw production, producer, raw consumption, consumer, producer with each key 4
/// times in a row; and client CPU per entry (µs) of raw production, the producer, and the producer of
/// repeated keys.
async fn measure(target: &RedisTarget, per_shard: u64, round: u64) -> ([f64; 5], [f64; 3]) {
    let conn = target
        .connect(ConnectOptions::default())
        .await
        .expect("connect");
    let total = per_shard * u64::from(SHARDS);
    let rate = |d: Duration| total as f64 / d.as_secs_f64();
    let raw_prefix = format!("raw{round}");
    let lib_prefix = format!("lib{round}");
    let cpu_us =
        |before: Duration| process_cpu().saturating_sub(before).as_secs_f64() * 1e6 / total as f64;
    let cpu = process_cpu();
    let produced_raw = produce_raw(&conn, &raw_prefix, per_shard).await;
    let raw_cpu = cpu_us(cpu);
    let cpu = process_cpu();
    let produced_lib = produce_lib(target, &conn, &lib_prefix, total, 1).await;
    let lib_cpu = cpu_us(cpu);
    let cpu = process_cpu();
    let produced_repeats = produce_lib(target, &conn, &format!("rep{round}"), total, 4).await;
    let repeats_cpu = cpu_us(cpu);
    create_groups(&conn, &lib_prefix).await;
    let (consumed_raw, n) = consume_raw(&conn, &lib_prefix).await;
    assert_eq!(n, total, "baseline read everything");
    let consumed_lib = consume_lib(target, &conn, &lib_prefix, total).await;
    (
        [
            rate(produced_raw),
            rate(produced_lib),
            rate(consumed_raw),
            rate(consumed_lib),
            rate(produced_repeats),
        ],
        [raw_cpu, lib_cpu, repeats_cpu],
    )
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
    let cluster = RedisCluster::start();
    let single = RedisTarget::open(&server.url()).expect("url");
    let clustered = RedisTarget::open(&cluster.url()).expect("url");
    println!(
        "redis {:?}; {SHARDS} shards x {per_shard} entries; single node vs 3 masters + 3 replicas; {rounds} rounds",
        server.version()
    );
    runtime.block_on(async {
        // Per round: the ratios ours/raw (producer, producer x4, consumer; single, cluster) and the
        // client CPU per entry (raw, producer, producer x4; single, cluster).
        let mut ratios: Vec<[f64; 6]> = Vec::new();
        let mut cpus: Vec<[f64; 6]> = Vec::new();
        for round in 0..rounds {
            let (s, s_cpu) = measure(&single, per_shard, round).await;
            let (c, c_cpu) = measure(&clustered, per_shard, round).await;
            ratios.push([
                s[1] / s[0],
                c[1] / c[0],
                s[4] / s[0],
                c[4] / c[0],
                s[3] / s[2],
                c[3] / c[2],
            ]);
            cpus.push([s_cpu[0], c_cpu[0], s_cpu[1], c_cpu[1], s_cpu[2], c_cpu[2]]);
            let names = [
                "produce raw",
                "producer",
                "consume raw",
                "consumer",
                "producer x4",
            ];
            for i in 0..5 {
                println!(
                    "round {round} {:<12} single {:>9.0}/s  cluster {:>9.0}/s  cluster/single {:.2}",
                    names[i],
                    s[i],
                    c[i],
                    c[i] / s[i]
                );
            }
            println!(
                "round {round} ours/raw: producer single {:.2} cluster {:.2}; producer x4 single {:.2} \
                 cluster {:.2}; consumer single {:.2} cluster {:.2}",
                s[1] / s[0],
                c[1] / c[0],
                s[4] / s[0],
                c[4] / c[0],
                s[3] / s[2],
                c[3] / c[2]
            );
            println!(
                "round {round} client CPU per entry: produce raw single {:.2} µs cluster {:.2} µs; \
                 producer single {:.2} µs cluster {:.2} µs; producer x4 single {:.2} µs cluster {:.2} µs",
                s_cpu[0], c_cpu[0], s_cpu[1], c_cpu[1], s_cpu[2], c_cpu[2]
            );
        }
        let r = |i: usize| median(ratios.iter().map(|round| round[i]).collect());
        let u = |i: usize| median(cpus.iter().map(|round| round[i]).collect());
        println!(
            "median of {rounds} rounds, ours/raw: producer single {:.2} cluster {:.2}; producer x4 single \
             {:.2} cluster {:.2}; consumer single {:.2} cluster {:.2}",
            r(0),
            r(1),
            r(2),
            r(3),
            r(4),
            r(5)
        );
        println!(
            "median of {rounds} rounds, client CPU per entry: produce raw single {:.2} µs cluster {:.2} µs; \
             producer single {:.2} µs cluster {:.2} µs; producer x4 single {:.2} µs cluster {:.2} µs",
            u(0),
            u(1),
            u(2),
            u(3),
            u(4),
            u(5)
        );
    });
}
