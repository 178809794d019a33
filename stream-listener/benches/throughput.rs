//! Consumption throughput: the [`Consumer`] against a hand-written redis-rs loop, draining the same shard
//! streams on a redis-server this benchmark starts itself, in three scenarios:
//!
//! - `raw`: 8 shards x 50,000 entries, one member, a no-op handler over the payload bytes;
//! - `json`: the same, with both sides decoding every payload into a struct with serde_json;
//! - `spread`: 64 shards over 16 members (4 shards each), 6,250 entries per shard.
//!
//! `cargo bench -p stream-listener --bench throughput` (`SL_BENCH_ROUNDS`, default 5; `SL_BENCH_ENTRIES`
//! scales the entries; `SL_BENCH_SCENARIOS=raw,json,spread` picks scenarios; `SL_BENCH_BUSY=n` runs it on
//! a busy machine: n other processes spin on the machine's cores throughout; `SL_BENCH_LOG=1` installs
//! an INFO `tracing_subscriber::fmt` subscriber without colours, writing nowhere, as `Runtime::start` does
//! by default for a process whose stderr is no terminal, so that each message's span is made and recorded;
//! any other value is the subscriber's filter instead, e.g. `info,stream_listener::message=off`).
//!
//! Both sides drain the same streams through two different consumer groups, one run after the other (which
//! goes first alternates per round), each member with one multiplexed connection for its non-blocking reads
//! and acks. The baseline is the leanest loop one would write: one task per shard, `XREADGROUP COUNT 100
//! STREAMS key >` without `BLOCK`, entries picked out of the raw reply, one `XACK` per batch.
//!
//! Beside the rates it prints the client CPU each side spent per entry: the process's CPU time over the
//! side's run (`/proc/self/task/*/schedstat`, both sides run alone on the same runtime), which decides
//! the ratio on a machine whose cores are busy with other work.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::Value;
use serde::Deserialize;
use stream_listener::consumer::{BoxedHandler, Consumer, ConsumerConfig, Message, RawMessage};
use stream_listener::member::lifecycle::{FencingToken, ShardCommand};
use stream_listener_test_support::aio::{xack, xpending_count, xreadgroup};
use stream_listener_test_support::cpu::{process_cpu, BusyLoad};
use stream_listener_test_support::RedisServer;
use tokio::sync::{mpsc, Notify};

/// What the JSON scenario decodes, on both sides.
#[derive(Deserialize)]
#[allow(dead_code)]
struct Order {
    id: u64,
    customer: String,
    amount_cents: u64,
}

#[derive(Clone, Copy)]
struct Scenario {
    name: &'static str,
    shards: u32,
    members: u32,
    per_shard: u64,
    json: bool,
}

const BATCH: usize = 100;
const PREFIX: &str = "bench";

fn key(shard: u32) -> String {
    format!("{PREFIX}:{shard}")
}

async fn fill(conn: &mut MultiplexedConnection, scenario: Scenario) {
    for shard in 0..scenario.shards {
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
        while n < scenario.per_shard {
            let mut pipe = redis::pipe();
            for i in n..(n + 1000).min(scenario.per_shard) {
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

/// Entries (id, payload `p`) out of read entries (id, flat field array).
fn payloads(entries: Vec<(Vec<u8>, Vec<Value>)>) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    entries
        .into_iter()
        .map(|(id, fields)| {
            let mut payload = None;
            let mut fields = fields.into_iter();
            while let (Some(Value::BulkString(name)), Some(Value::BulkString(value))) =
                (fields.next(), fields.next())
            {
                if name == b"p" {
                    payload = Some(value);
                }
            }
            (id, payload)
        })
        .collect()
}

async fn run_baseline(conn: &MultiplexedConnection, scenario: Scenario) -> (Duration, u64) {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for shard in 0..scenario.shards {
        let mut conn = conn.clone();
        tasks.push(tokio::spawn(async move {
            let key = key(shard);
            let mut handled = 0u64;
            loop {
                let entries = payloads(xreadgroup(&mut conn, "raw", "c", BATCH, &key).await);
                if entries.is_empty() {
                    return handled;
                }
                let mut ids = Vec::with_capacity(entries.len());
                for (id, payload) in entries {
                    if scenario.json {
                        let order: Order = serde_json::from_slice(&payload.expect("payload"))
                            .expect("decodable payload");
                        std::hint::black_box(order);
                    }
                    ids.push(id);
                }
                handled += ids.len() as u64;
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

async fn total_pending(conn: &mut MultiplexedConnection, group: &str, shards: u32) -> i64 {
    let mut total = 0;
    for shard in 0..shards {
        total += xpending_count(conn, &key(shard), group).await;
    }
    total
}

async fn lag(conn: &mut MultiplexedConnection, group: &str, shards: u32) -> i64 {
    let mut total = 0;
    for shard in 0..shards {
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

/// Counts handled entries and wakes the bench at the last one, so waiting costs no CPU while it runs.
#[derive(Clone)]
struct Counter {
    handled: Arc<AtomicU64>,
    all_handled: Arc<Notify>,
    expected: u64,
}

impl Counter {
    fn count(&self) {
        if self.handled.fetch_add(1, Ordering::Relaxed) + 1 == self.expected {
            self.all_handled.notify_one();
        }
    }
}

fn handler(scenario: Scenario, counter: Counter) -> BoxedHandler {
    if scenario.json {
        BoxedHandler::json(move |msg: Message<Order>| {
            std::hint::black_box(msg.payload);
            counter.count();
            std::future::ready(Ok::<(), std::convert::Infallible>(()))
        })
    } else {
        BoxedHandler::raw(move |_msg: RawMessage| {
            counter.count();
            std::future::ready(Ok::<(), std::convert::Infallible>(()))
        })
    }
}

async fn run_consumer(
    url: &str,
    conn: &mut MultiplexedConnection,
    scenario: Scenario,
    expected: u64,
) -> Duration {
    let counter = Counter {
        handled: Arc::new(AtomicU64::new(0)),
        all_handled: Arc::new(Notify::new()),
        expected,
    };
    let shards_per_member = scenario.shards / scenario.members;
    let mut members = Vec::new();
    for member in 0..scenario.members {
        let member_id = format!("bench-m{member}");
        let mut config = ConsumerConfig::new(PREFIX, "consumer", &member_id);
        config.batch_size = BATCH;
        config.runtime_max_concurrency = shards_per_member as usize;
        let client = redis::Client::open(url).expect("client");
        let consumer = Consumer::connect(client, config, handler(scenario, counter.clone()))
            .await
            .expect("consumer");
        members.push((member_id, consumer));
    }
    let started = Instant::now();
    let mut running = Vec::new();
    for (member, (member_id, consumer)) in (0..).zip(members) {
        let (commands, command_rx) = mpsc::unbounded_channel();
        let (report_tx, mut report_rx) = mpsc::unbounded_channel();
        tokio::spawn(async move { while report_rx.recv().await.is_some() {} });
        let task = tokio::spawn(consumer.run(command_rx, report_tx));
        let token = FencingToken {
            member_id: Arc::from(member_id.as_str()),
            member_epoch: 1,
        };
        for shard in member * shards_per_member..(member + 1) * shards_per_member {
            commands
                .send(ShardCommand::Assign {
                    shard,
                    token: token.clone(),
                })
                .expect("assign");
        }
        running.push((commands, task));
    }
    tokio::time::timeout(Duration::from_secs(600), counter.all_handled.notified())
        .await
        .expect("consumer did not finish");
    assert_eq!(counter.handled.load(Ordering::Relaxed), expected);
    // Done means acknowledged, not just handled: the last acks are at most one round trip away.
    let deadline = Instant::now() + Duration::from_secs(60);
    while total_pending(conn, "consumer", scenario.shards).await > 0 {
        assert!(Instant::now() < deadline, "consumer did not ack");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = started.elapsed();
    for (commands, task) in running {
        drop(commands);
        task.await.expect("consumer task");
    }
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
    // What the runtime's default logging costs: an INFO subscriber, as `Runtime::start` installs when the
    // application has none (the lines go nowhere; the spans and fields are made all the same).
    if let Some(filter) = std::env::var("SL_BENCH_LOG")
        .ok()
        .filter(|v| !v.is_empty() && v != "0")
    {
        let filter = if filter == "1" { "info".into() } else { filter };
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::sink)
            .with_ansi(false)
            .init();
    }
    let per_shard = env("SL_BENCH_ENTRIES", 50_000);
    let rounds = env("SL_BENCH_ROUNDS", 5).max(1);
    let wanted = std::env::var("SL_BENCH_SCENARIOS").unwrap_or_else(|_| "raw,json,spread".into());
    let scenarios: Vec<Scenario> = [
        Scenario {
            name: "raw",
            shards: 8,
            members: 1,
            per_shard,
            json: false,
        },
        Scenario {
            name: "json",
            shards: 8,
            members: 1,
            per_shard,
            json: true,
        },
        Scenario {
            name: "spread",
            shards: 64,
            members: 16,
            per_shard: per_shard / 8,
            json: false,
        },
    ]
    .into_iter()
    .filter(|s| wanted.split(',').any(|w| w.trim() == s.name))
    .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let server = RedisServer::start();
    let busy = env("SL_BENCH_BUSY", 0);
    let _load = BusyLoad::start(busy);
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
        println!(
            "redis {:?}; batch {BATCH}; {rounds} rounds per scenario; {busy} other processes spinning",
            server.version()
        );
        let mut summary = Vec::new();
        for scenario in scenarios {
            let expected = scenario.per_shard * u64::from(scenario.shards);
            println!(
                "scenario {}: {} shards x {} entries over {} member(s){}",
                scenario.name,
                scenario.shards,
                scenario.per_shard,
                scenario.members,
                if scenario.json { ", JSON-decoding handlers" } else { "" }
            );
            let (mut baseline_rates, mut consumer_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
            let (mut cpus, mut cpu_ratios) = (Vec::new(), Vec::new());
            for round in 0..rounds {
                let _: () = redis::cmd("FLUSHALL")
                    .query_async(&mut conn)
                    .await
                    .expect("FLUSHALL");
                fill(&mut conn, scenario).await;
                // Alternate which side goes first, so neither always meets a warmer server.
                let (mut baseline, mut ours) = (Duration::ZERO, Duration::ZERO);
                let (mut baseline_cpu, mut ours_cpu) = (Duration::ZERO, Duration::ZERO);
                for side in [round % 2, 1 - round % 2] {
                    // Client CPU: the whole process's (its runtime's workers), over the side's run alone.
                    let cpu_before = process_cpu();
                    if side == 0 {
                        let (elapsed, total) = run_baseline(&raw_conn, scenario).await;
                        baseline_cpu = process_cpu().saturating_sub(cpu_before);
                        assert_eq!(total, expected, "baseline drained everything");
                        assert_eq!(total_pending(&mut conn, "raw", scenario.shards).await, 0);
                        baseline = elapsed;
                    } else {
                        ours = run_consumer(&server.url(), &mut conn, scenario, expected).await;
                        ours_cpu = process_cpu().saturating_sub(cpu_before);
                        assert_eq!(
                            lag(&mut conn, "consumer", scenario.shards).await,
                            0,
                            "consumer drained everything"
                        );
                    }
                }
                let baseline_rate = expected as f64 / baseline.as_secs_f64();
                let rate = expected as f64 / ours.as_secs_f64();
                let per_entry = |cpu: Duration| cpu.as_secs_f64() * 1e6 / expected as f64;
                println!(
                    "  round {round}: hand-written {baseline_rate:>8.0} entries/s ({baseline:.2?}, {:.2} µs CPU/entry), \
                     Consumer {rate:>8.0} entries/s ({ours:.2?}, {:.2} µs CPU/entry), ratio {:.2}",
                    per_entry(baseline_cpu),
                    per_entry(ours_cpu),
                    rate / baseline_rate
                );
                baseline_rates.push(baseline_rate);
                consumer_rates.push(rate);
                ratios.push(rate / baseline_rate);
                cpu_ratios.push(per_entry(ours_cpu) / per_entry(baseline_cpu).max(1e-9));
                cpus.push((per_entry(baseline_cpu), per_entry(ours_cpu)));
            }
            summary.push((
                scenario.name,
                median(baseline_rates),
                median(consumer_rates),
                median(ratios),
                median(cpus.iter().map(|c| c.0).collect()),
                median(cpus.iter().map(|c| c.1).collect()),
                median(cpu_ratios),
            ));
        }
        println!(
            "\n| scenario | hand-written (median) | Consumer (median) | median of ratios | client CPU/entry \
             hand-written | Consumer | CPU ratio |"
        );
        println!("|---|---|---|---|---|---|---|");
        for (name, baseline, ours, ratio, cpu_baseline, cpu_ours, cpu_ratio) in summary {
            println!(
                "| {name} | {baseline:.0}/s | {ours:.0}/s | {ratio:.2} | {cpu_baseline:.2} µs | {cpu_ours:.2} µs | \
                 {cpu_ratio:.2} |"
            );
        }
    });
}
