//! Produce-to-handler-start latency, Redis commands and client CPU per entry: the [`Consumer`] (one member,
//! default configuration, 4 workers over 16 shards) against an expert's hand-written redis-rs consumer (16
//! tasks, one per shard, each on its own connection: `XREADGROUP ... COUNT 100 BLOCK 100 STREAMS key >`,
//! one `XACK` per batch), on a redis-server this benchmark starts itself.
//!
//! `cargo bench -p stream-listener --bench latency` (`SL_BENCH_ROUNDS`, default 3; `SL_BENCH_SCALE`
//! multiplies each phase's length, default 1; `SL_BENCH_WORKERS`, the library's workers, default 4; for
//! a profile of one side and phase, `SL_BENCH_SIDE` 0 or 1 runs only the hand-written side or the
//! library, `SL_BENCH_PHASE` 0-3 only that phase; `SL_BENCH_HW_BLOCK` the hand-written loop's `BLOCK` in
//! ms, default 100, and `SL_BENCH_BLOCK_MS` the library's `block_ms`, default its default (450): with
//! both at 450 the idle phase compares the two at the same block, see ARCHITECTURE.md).
//!
//! Phases, at a steady rate each: idle (1 entry / 200 ms), 1,000/s, 10,000/s and 50 % of the hand-written
//! consumer's maximum (measured first, draining a backlog). Per round, each side runs every phase on
//! streams of its own (which side goes first alternates per round).
//!
//! - Latency: the producer stamps each entry with the wall clock just before it sends it; the handler (the
//!   baseline's loop body) reads the clock first thing. Both run on this machine.
//! - Commands per entry: `INFO commandstats` deltas over the phase, minus the producer's `XADD`s and the
//!   benchmark's own `INFO` calls.
//! - Slices per entry: how often the process's threads were scheduled onto a CPU over the phase (each a
//!   wake-up or a preemption), which says how many thread hand-offs a side makes per entry.
//! - CPU per entry: the run time of the process's threads over the phase (Linux `schedstat`), without the
//!   producer's, which is a thread of its own with a synchronous connection, outside both sides' tokio
//!   runtime.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use redis::Value;
use stream_listener::consumer::{BoxedHandler, Consumer, ConsumerConfig, RawMessage};
use stream_listener::member::lifecycle::{FencingToken, ShardCommand};
use stream_listener_test_support::aio::command_calls;
use stream_listener_test_support::cpu::{process_cpu, process_slices};
use stream_listener_test_support::RedisServer;
use tokio::sync::mpsc;

const SHARDS: u32 = 16;

/// A number from the environment variable `name`, if it is set and parses.
fn env_number<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The hand-written loop's `BLOCK` in ms, 100 unless `SL_BENCH_HW_BLOCK` says otherwise.
fn hw_block() -> u64 {
    env_number("SL_BENCH_HW_BLOCK").unwrap_or(100)
}

/// The library's `block_ms`: its default unless `SL_BENCH_BLOCK_MS` says otherwise.
fn block_ms() -> u64 {
    env_number("SL_BENCH_BLOCK_MS").unwrap_or(ConsumerConfig::new("s", GROUP, "m").block_ms)
}

/// The library's workers (`runtime_max_concurrency`), 4 unless `SL_BENCH_WORKERS` says otherwise.
fn workers() -> usize {
    env_number("SL_BENCH_WORKERS").unwrap_or(4)
}
const GROUP: &str = "g";

fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64
}

/// Latencies (ns) recorded by whichever side runs.
#[derive(Clone, Default)]
struct Recorder {
    latencies: Arc<Mutex<Vec<u64>>>,
    handled: Arc<AtomicU64>,
}

impl Recorder {
    /// Called first thing per entry with its payload (the producer's stamp).
    fn record(&self, payload: &[u8]) {
        let now = wall_ns();
        let sent: u64 = std::str::from_utf8(payload)
            .ok()
            .and_then(|s| s.parse().ok())
            .expect("a stamped payload");
        self.latencies
            .lock()
            .unwrap()
            .push(now.saturating_sub(sent));
        self.handled.fetch_add(1, Ordering::Relaxed);
    }

    fn take(&self) -> Vec<u64> {
        std::mem::take(&mut *self.latencies.lock().unwrap())
    }
}

#[derive(Clone, Copy, Debug)]
struct Phase {
    name: &'static str,
    /// Entries per second.
    rate: u64,
    length: Duration,
}

/// Writes `rate` entries per second for `length` to the 16 shard streams of `prefix` (round robin), in
/// ticks of 1 ms (or one entry per tick when slower), on a thread of its own; returns the entries written.
async fn produce(url: &str, prefix: &str, phase: Phase) -> u64 {
    let (url, prefix) = (url.to_owned(), prefix.to_owned());
    tokio::task::spawn_blocking(move || {
        // Named, so that a profile tells it from the runtime's workers.
        std::thread::Builder::new()
            .name("bench-producer".into())
            .spawn(move || produce_here(&url, &prefix, phase))
            .expect("spawn the producer thread")
            .join()
            .expect("producer thread")
    })
    .await
    .expect("producer")
}

fn produce_here(url: &str, prefix: &str, phase: Phase) -> u64 {
    let client = redis::Client::open(url).expect("client");
    let mut conn = client.get_connection().expect("producer connection");
    let total = (phase.rate as f64 * phase.length.as_secs_f64()).round() as u64;
    let tick = Duration::from_secs_f64((1.0 / phase.rate as f64).max(0.001));
    let per_tick = (phase.rate as f64 * tick.as_secs_f64()).round().max(1.0) as u64;
    let start = Instant::now();
    let mut sent = 0u64;
    let mut ticks = 0u32;
    while sent < total {
        let due = start + tick * ticks;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        ticks += 1;
        let mut pipe = redis::pipe();
        for _ in 0..per_tick.min(total - sent) {
            pipe.cmd("XADD")
                .arg(format!("{prefix}:{}", sent % u64::from(SHARDS)))
                .arg("*")
                .arg("k")
                .arg(sent)
                .arg("p")
                .arg(wall_ns().to_string())
                .ignore();
            sent += 1;
        }
        let () = pipe.query(&mut conn).expect("XADD");
    }
    sent
}

async fn create_groups(conn: &mut MultiplexedConnection, prefix: &str) {
    for shard in 0..SHARDS {
        let _: () = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(format!("{prefix}:{shard}"))
            .arg(GROUP)
            .arg("$")
            .arg("MKSTREAM")
            .query_async(conn)
            .await
            .expect("XGROUP CREATE");
    }
}

/// The hand-written consumer: one task and one connection per shard.
async fn start_baseline(
    url: &str,
    prefix: &str,
    recorder: Recorder,
) -> Vec<tokio::task::JoinHandle<()>> {
    let client = redis::Client::open(url).expect("client");
    // Read once: an environment lookup per command is client CPU the loop would not spend.
    let block = hw_block();
    let mut tasks = Vec::new();
    for shard in 0..SHARDS {
        let mut conn = client
            .get_multiplexed_async_connection_with_config(
                &redis::AsyncConnectionConfig::new().set_response_timeout(None),
            )
            .await
            .expect("connect");
        let key = format!("{prefix}:{shard}");
        let recorder = recorder.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let reply: Value = redis::cmd("XREADGROUP")
                    .arg("GROUP")
                    .arg(GROUP)
                    .arg("c")
                    .arg("COUNT")
                    .arg(100)
                    .arg("BLOCK")
                    .arg(block)
                    .arg("STREAMS")
                    .arg(&key)
                    .arg(">")
                    .query_async(&mut conn)
                    .await
                    .expect("XREADGROUP");
                let ids = handle_reply(reply, &recorder);
                if !ids.is_empty() {
                    let _: i64 = redis::cmd("XACK")
                        .arg(&key)
                        .arg(GROUP)
                        .arg(ids)
                        .query_async(&mut conn)
                        .await
                        .expect("XACK");
                }
            }
        }));
    }
    tasks
}

/// Picks the entries out of an `XREADGROUP` reply (RESP2: `[[key, [[id, [f, v, ...]], ...]]]`), records
/// each payload, returns the ids.
fn handle_reply(reply: Value, recorder: &Recorder) -> Vec<Vec<u8>> {
    let mut ids = Vec::new();
    let Value::Array(streams) = reply else {
        return ids;
    };
    for stream in streams {
        let Value::Array(mut pair) = stream else {
            continue;
        };
        let Some(Value::Array(entries)) = pair.pop() else {
            continue;
        };
        for entry in entries {
            let Value::Array(mut entry) = entry else {
                continue;
            };
            let (Some(Value::Array(fields)), Some(Value::BulkString(id))) =
                (entry.pop(), entry.pop())
            else {
                continue;
            };
            let mut fields = fields.into_iter();
            while let (Some(Value::BulkString(name)), Some(Value::BulkString(value))) =
                (fields.next(), fields.next())
            {
                if name == b"p" {
                    recorder.record(&value);
                }
            }
            ids.push(id);
        }
    }
    ids
}

/// The library's consumer: one member, default configuration, 4 workers, every shard assigned.
async fn start_consumer(
    url: &str,
    prefix: &str,
    recorder: Recorder,
) -> (
    mpsc::UnboundedSender<ShardCommand>,
    tokio::task::JoinHandle<()>,
) {
    let mut config = ConsumerConfig::new(prefix, GROUP, "m");
    config.runtime_max_concurrency = workers();
    config.block_ms = block_ms();
    let handler = BoxedHandler::raw(move |msg: RawMessage| {
        recorder.record(&msg.payload);
        std::future::ready(Ok::<(), std::convert::Infallible>(()))
    });
    let client = redis::Client::open(url).expect("client");
    let consumer = Consumer::connect(client, config, handler)
        .await
        .expect("consumer");
    let (commands, command_rx) = mpsc::unbounded_channel();
    let (report_tx, mut report_rx) = mpsc::unbounded_channel();
    tokio::spawn(async move { while report_rx.recv().await.is_some() {} });
    let task = tokio::spawn(consumer.run(command_rx, report_tx));
    let token = FencingToken {
        member_id: Arc::from("m"),
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
    (commands, task)
}

/// What one side did in one phase.
#[derive(Clone, Debug, Default)]
struct Measured {
    latencies: Vec<u64>,
    commands_per_entry: f64,
    cpu_us_per_entry: f64,
    /// Times the process's threads were scheduled onto a CPU, per entry: its thread hand-offs.
    slices_per_entry: f64,
}

fn commands_total(calls: &std::collections::BTreeMap<String, u64>) -> u64 {
    calls
        .iter()
        .filter(|(name, _)| name.as_str() != "xadd" && name.as_str() != "info")
        .map(|(_, n)| n)
        .sum()
}

async fn run_phase(
    url: &str,
    conn: &mut MultiplexedConnection,
    prefix: &str,
    recorder: &Recorder,
    phase: Phase,
) -> Measured {
    recorder.take();
    let handled_before = recorder.handled.load(Ordering::Relaxed);
    let calls_before = commands_total(&command_calls(conn).await);
    // The producer's thread starts after this reading and has exited by the last one, so it is in
    // neither: what `process_cpu` counts over the phase is the consuming side's client CPU.
    let cpu_before = process_cpu();
    let slices_before = process_slices();
    let sent = produce(url, prefix, phase).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while recorder.handled.load(Ordering::Relaxed) - handled_before < sent {
        assert!(
            Instant::now() < deadline,
            "{prefix}: not everything was handled"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let cpu = process_cpu().saturating_sub(cpu_before);
    let slices = process_slices().saturating_sub(slices_before);
    let calls = commands_total(&command_calls(conn).await) - calls_before;
    Measured {
        latencies: recorder.take(),
        commands_per_entry: calls as f64 / sent as f64,
        cpu_us_per_entry: cpu.as_secs_f64() * 1e6 / sent as f64,
        slices_per_entry: slices as f64 / sent as f64,
    }
}

/// The hand-written consumer's maximum: entries per second draining a backlog of 16 x 10,000.
async fn baseline_max(url: &str, conn: &mut MultiplexedConnection) -> u64 {
    let prefix = "max";
    create_groups(conn, prefix).await;
    let backlog = Phase {
        name: "fill",
        rate: 1_000_000,
        length: Duration::from_millis(160),
    };
    let sent = produce(url, prefix, backlog).await;
    let recorder = Recorder::default();
    let started = Instant::now();
    let tasks = start_baseline(url, prefix, recorder.clone()).await;
    while recorder.handled.load(Ordering::Relaxed) < sent {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let rate = sent as f64 / started.elapsed().as_secs_f64();
    tasks.iter().for_each(|t| t.abort());
    rate as u64
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize] as f64 / 1e6
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let rounds = env_number("SL_BENCH_ROUNDS").unwrap_or(3.0_f64).max(1.0) as usize;
    let scale = env_number("SL_BENCH_SCALE").unwrap_or(1.0_f64).max(0.1);
    let (only_side, only_phase) = (
        env_number::<usize>("SL_BENCH_SIDE"),
        env_number::<usize>("SL_BENCH_PHASE"),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let server = RedisServer::start();
    let url = server.url();
    runtime.block_on(async {
        let client = redis::Client::open(url.as_str()).expect("client");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        // A profile of one phase but the last needs no maximum.
        let no_max = only_phase.is_some_and(|phase| phase != 3);
        let max = if no_max {
            0
        } else {
            baseline_max(&url, &mut conn).await
        };
        println!(
            "redis {:?}; {SHARDS} shards; library: 1 member, {} workers, block_ms {}; \
             hand-written: {SHARDS} tasks, BLOCK {}; its maximum {max}/s; {rounds} rounds",
            server.version(),
            workers(),
            block_ms(),
            hw_block(),
        );
        let length = |s: f64| Duration::from_secs_f64(s * scale);
        let phases = [
            Phase { name: "idle (5/s)", rate: 5, length: length(6.0) },
            Phase { name: "1,000/s", rate: 1_000, length: length(3.0) },
            Phase { name: "10,000/s", rate: 10_000, length: length(2.0) },
            Phase { name: "50 % of max", rate: (max / 2).max(1), length: length(2.0) },
        ];
        // results[phase][side] over rounds; side 0 = hand-written, 1 = library.
        let mut results: Vec<[Vec<Measured>; 2]> = vec![Default::default(); phases.len()];
        for round in 0..rounds {
            for side in [round % 2, 1 - round % 2] {
                if only_side.is_some_and(|only| only != side) {
                    continue;
                }
                let prefix = format!("lat-{round}-{side}");
                create_groups(&mut conn, &prefix).await;
                let recorder = Recorder::default();
                let stop: Box<dyn FnOnce()> = if side == 0 {
                    let tasks = start_baseline(&url, &prefix, recorder.clone()).await;
                    Box::new(move || tasks.iter().for_each(|t| t.abort()))
                } else {
                    let (commands, task) = start_consumer(&url, &prefix, recorder.clone()).await;
                    Box::new(move || {
                        drop(commands);
                        task.abort();
                    })
                };
                // Let both sides settle into their idle state first.
                tokio::time::sleep(Duration::from_millis(500)).await;
                for (i, phase) in phases.iter().enumerate() {
                    if only_phase.is_some_and(|only| only != i) {
                        continue;
                    }
                    let measured = run_phase(&url, &mut conn, &prefix, &recorder, *phase).await;
                    let mut sorted = measured.latencies.clone();
                    sorted.sort_unstable();
                    println!(
                        "  round {round} {:<12} {:<11} p50 {:>7.3} ms  p99 {:>8.3} ms  {:>5.2} cmds/entry  {:>6.1} us CPU/entry  {:>6.2} slices/entry",
                        if side == 0 { "hand-written" } else { "library" },
                        phase.name,
                        percentile(&sorted, 0.5),
                        percentile(&sorted, 0.99),
                        measured.commands_per_entry,
                        measured.cpu_us_per_entry,
                        measured.slices_per_entry,
                    );
                    results[i][side].push(measured);
                }
                stop();
            }
        }
        println!(
            "\n| phase | hand-written p50 / p99 ms | library p50 / p99 ms | p50 ratio | p99 ratio | \
             cmds/entry hw / lib | CPU us/entry hw / lib | CPU ratio | slices/entry hw / lib |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
        for (phase, sides) in phases.iter().zip(&results) {
            if sides.iter().any(Vec::is_empty) {
                continue;
            }
            let stat = |side: usize, f: &dyn Fn(&Measured) -> f64| {
                median(sides[side].iter().map(f).collect())
            };
            let pct = |p: f64| {
                move |m: &Measured| {
                    let mut sorted = m.latencies.clone();
                    sorted.sort_unstable();
                    percentile(&sorted, p)
                }
            };
            let (hw50, lib50) = (stat(0, &pct(0.5)), stat(1, &pct(0.5)));
            let (hw99, lib99) = (stat(0, &pct(0.99)), stat(1, &pct(0.99)));
            let (hwc, libc_) = (
                stat(0, &|m| m.commands_per_entry),
                stat(1, &|m| m.commands_per_entry),
            );
            let (hwu, libu) = (
                stat(0, &|m| m.cpu_us_per_entry),
                stat(1, &|m| m.cpu_us_per_entry),
            );
            let (hws, libs) = (
                stat(0, &|m| m.slices_per_entry),
                stat(1, &|m| m.slices_per_entry),
            );
            println!(
                "| {} | {hw50:.3} / {hw99:.3} | {lib50:.3} / {lib99:.3} | {:.2} | {:.2} | {hwc:.2} / {libc_:.2} | {hwu:.1} / {libu:.1} | {:.2} | {hws:.2} / {libs:.2} |",
                phase.name,
                lib50 / hw50,
                lib99 / hw99,
                libu / hwu,
            );
        }
    });
}
