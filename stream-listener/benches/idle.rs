//! What an idle process costs Redis, and how fast it picks up an entry: one process running four members
//! (`concurrency = 4`) of a group of a 16-shard stream, through the real runtime (heartbeat loops,
//! consumers, idle waits), on a redis-server this benchmark starts itself.
//!
//! `cargo bench -p stream-listener --bench idle` (`SL_BENCH_SECONDS`: length of the idle phase, default 10)
//!
//! 1. **Idle**: Redis commands per second of the whole process, from `INFO commandstats` deltas (the
//!    benchmark's own two `INFO` calls subtracted), with the breakdown by command.
//! 2. **Pickup, idle shards**: single entries written to idle shards, one every 200 ms, round robin;
//!    latency from the entry id (Redis time) to the handler's start (wall clock of the same machine).
//! 3. **Pickup, busy shard**: one shard receiving 10 entries every 10 ms for 5 s; the same latency.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use stream_listener::coordinator::metadata::GroupConfig;
use stream_listener::topology::{StartFrom, Topology};
use stream_listener::{ConsumerBuilder, Message, Runtime};
use stream_listener_test_support::aio::command_calls;
use stream_listener_test_support::RedisServer;

const STREAM: &str = "idle";
const GROUP: &str = "g";
const SHARDS: u32 = 16;

type Latencies = Arc<Mutex<Vec<u64>>>;

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn report(label: &str, latencies: &Latencies) {
    let mut all = latencies.lock().unwrap().clone();
    all.sort_unstable();
    println!(
        "  {label}: {} entries, pickup p50 {} ms, p99 {} ms, max {} ms",
        all.len(),
        percentile(&all, 0.5),
        percentile(&all, 0.99),
        all.last().copied().unwrap_or(0)
    );
}

async fn xadd(conn: &mut MultiplexedConnection, shard: u32, n: u64) {
    let _: String = redis::cmd("XADD")
        .arg(format!("{STREAM}:{shard}"))
        .arg("*")
        .arg("k")
        .arg(format!("key-{n}"))
        .arg("p")
        .arg(format!("{{\"n\":{n}}}"))
        .query_async(conn)
        .await
        .expect("XADD");
}

async fn wait_for(latencies: &Latencies, count: usize, limit: Duration) {
    let deadline = Instant::now() + limit;
    while latencies.lock().unwrap().len() < count && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn main() {
    let seconds: u64 = std::env::var("SL_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let redis = RedisServer::start();
    runtime.block_on(async move {
        let url = redis.url();
        let mut conn = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let mut manager = redis::aio::ConnectionManager::new(redis::Client::open(url.as_str()).unwrap())
            .await
            .unwrap();
        Topology::ensure(&mut manager, STREAM, SHARDS).await.unwrap();
        Topology::ensure_group(&mut manager, STREAM, GROUP, StartFrom::Earliest)
            .await
            .unwrap();
        let latencies: Latencies = Arc::default();
        let mut rt = Runtime::new(url.clone())
            .without_default_logging()
            .without_annotated_listeners()
            .group_config(GroupConfig::default())
            .shutdown_timeout(Duration::from_secs(5));
        for m in 0..4 {
            let latencies = latencies.clone();
            rt = rt.consumer(
                ConsumerBuilder::new(STREAM, GROUP)
                    .member_id(format!("idle-m{m}"))
                    .handler(move |msg: Message<serde_json::Value>| {
                        let latencies = latencies.clone();
                        async move {
                            let id_ms: u64 = msg.id.split('-').next().unwrap().parse().unwrap();
                            let took = wall_ms().saturating_sub(id_ms);
                            if took > 100 && std::env::var_os("SL_BENCH_SLOW").is_some() {
                                eprintln!("slow pickup: shard {} key {} {took} ms", msg.shard, msg.key);
                            }
                            latencies.lock().unwrap().push(took);
                            Ok::<(), std::convert::Infallible>(())
                        }
                    }),
            );
        }
        let running = rt.start().await.expect("start");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let owned: usize = running.statuses().iter().map(|(_, s)| s.owned.len()).sum();
            if owned == SHARDS as usize {
                break;
            }
            assert!(Instant::now() < deadline, "the group did not converge");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Let the first heartbeats after convergence and the first waits settle.
        tokio::time::sleep(Duration::from_secs(3)).await;

        println!("stream-listener idle cost: 1 process, 4 members x {SHARDS} shards, 1 s heartbeats, block_ms 450");
        let before = command_calls(&mut conn).await;
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        let after = command_calls(&mut conn).await;
        let mut total = 0;
        let mut breakdown = Vec::new();
        for (name, calls) in &after {
            let mut delta = calls - before.get(name).copied().unwrap_or(0);
            if name == "info" {
                delta = delta.saturating_sub(2);
            }
            if delta > 0 {
                total += delta;
                breakdown.push(format!("{name} {:.1}/s", delta as f64 / seconds as f64));
            }
        }
        // renew.lua runs TIME, GET, EXISTS, HEXISTS, ZSCORE, ZRANGE, ZADD inside Redis for every EVALSHA:
        // counted by commandstats, but not sent by the process.
        let scripts = after.get("evalsha").copied().unwrap_or(0) - before.get("evalsha").copied().unwrap_or(0);
        let sent = total - 7 * scripts;
        println!(
            "1. idle: {:.1} Redis commands/s sent by the process (target <= 40); {:.1}/s counted by commandstats \
             including those run inside scripts: {}",
            sent as f64 / seconds as f64,
            total as f64 / seconds as f64,
            breakdown.join(", ")
        );

        println!("2./3. pickup latency (entry id -> handler start)");
        for n in 0..50u64 {
            xadd(&mut conn, (n % SHARDS as u64) as u32, n).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        wait_for(&latencies, 50, Duration::from_secs(10)).await;
        report("idle shards (target p99 <= 500 ms)", &latencies);

        latencies.lock().unwrap().clear();
        let start = Instant::now();
        let mut n = 1_000_000u64;
        while start.elapsed() < Duration::from_secs(5) {
            let mut pipe = redis::pipe();
            for _ in 0..10 {
                pipe.cmd("XADD")
                    .arg(format!("{STREAM}:0"))
                    .arg("*")
                    .arg("k")
                    .arg(format!("key-{n}"))
                    .arg("p")
                    .arg(format!("{{\"n\":{n}}}"))
                    .ignore();
                n += 1;
            }
            let _: () = pipe.query_async(&mut conn).await.unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let sent = (n - 1_000_000) as usize;
        wait_for(&latencies, sent, Duration::from_secs(10)).await;
        report("busy shard, 10 entries every 10 ms (target p50 <= 10 ms)", &latencies);
        let _ = running.stop().await;
    });
}
