//! End-to-end demo: two worker processes share group `demo` of the 16-shard stream `orders`, one is killed
//! with SIGKILL mid-way and replaced, and at the end every order is checked: none lost, per-key order kept.
//!
//! ```text
//! cargo run --release -p stream-listener-examples --bin demo
//! ```
//!
//! Without `REDIS_URL` the demo starts its own `redis-server` on a free port. The same binary is the worker
//! (`demo worker`): an annotated listener with `concurrency = 4` that records every handled order in Redis.
//!
//! What a worker records, per partition key `k`:
//! - `demo:handles:{k}` hash: seq -> how many times it was handled (more than 1 = a redelivery);
//! - `demo:seen:{k}` list: seqs in the order they were first handled (for the per-key order check);
//! - `demo:unique` / `demo:total`: counters of first handles and of all handles (for progress).

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};
use stream_listener::coordinator::metadata::GroupConfig;
use stream_listener::store::GroupStore;
use stream_listener::topology::{StartFrom, Topology};
use stream_listener::{stream_listener, Message, Producer};
use stream_listener_test_support::RedisServer;
use tokio::process::{Child, Command};

const STREAM: &str = "orders";
const GROUP: &str = "demo";
const SHARDS: u32 = 16;
const KEYS: u64 = 200;
const SEQS: u64 = 50;
const TOTAL: u64 = KEYS * SEQS;
/// One round = one new seq for every key; 50 rounds at this pace take about 25 s.
const ROUND_PAUSE: Duration = Duration::from_millis(500);
const POLL: Duration = Duration::from_millis(500);
const DEADLINE: Duration = Duration::from_secs(180);
const STOP_TIMEOUT: Duration = Duration::from_secs(45);

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The examples' one `Order`; the demo numbers each key's orders 0, 1, 2, ... in `id` (its per-key
/// sequence) and takes the key from the message.
#[derive(Debug, Serialize, Deserialize)]
struct Order {
    id: u64,
    amount_cents: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let worker = std::env::args().nth(1).as_deref() == Some("worker");
    init_tracing();
    let result = if worker {
        run_worker().await
    } else {
        run_demo().await
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("demo failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .init();
}

// ------------------------------------------------------------------------------------------------
// Worker process
// ------------------------------------------------------------------------------------------------

static WORKER_REDIS: OnceLock<ConnectionManager> = OnceLock::new();

/// Atomically counts one handle of (key, seq); appends seq to the key's first-handled order list the
/// first time only.
static RECORD: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
local n = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
redis.call('INCR', 'demo:total')
if n == 1 then
  redis.call('RPUSH', KEYS[2], ARGV[1])
  redis.call('INCR', 'demo:unique')
end
return n
"#,
    )
});

/// Four logical members per worker process (`{STREAM_LISTENER_MEMBER_ID}-m0..m3`).
#[stream_listener(stream = "orders", group = "demo", concurrency = 4)]
async fn handle_order(msg: Message<Order>) -> Result<(), redis::RedisError> {
    let mut conn = WORKER_REDIS.get().expect("worker connection").clone();
    let (key, seq) = (msg.key, msg.payload.id);
    RECORD
        .key(format!("demo:handles:{key}"))
        .key(format!("demo:seen:{key}"))
        .arg(seq)
        .invoke_async::<i64>(&mut conn)
        .await?;
    Ok(())
}

async fn run_worker() -> Res<ExitCode> {
    let url = std::env::var("REDIS_URL")?;
    let conn = redis::Client::open(url)?.get_connection_manager().await?;
    let _ = WORKER_REDIS.set(conn);
    // Until SIGTERM: then every member revokes, finishes in-flight handlers, acks and leaves.
    stream_listener::Runtime::from_env().run().await?;
    Ok(ExitCode::SUCCESS)
}

// ------------------------------------------------------------------------------------------------
// Demo driver
// ------------------------------------------------------------------------------------------------

async fn run_demo() -> Res<ExitCode> {
    let started = Instant::now();
    let (_server, url) = redis_url();
    println!("redis: {}", stream_listener::redact::redact_url(&url));
    let mut conn = redis::Client::open(url.as_str())?
        .get_connection_manager()
        .await?;
    prepare(&mut conn).await?;

    let produced = Arc::new(AtomicU64::new(0));
    let producer = Producer::connect(&url, STREAM).await?;
    let producing = tokio::spawn(produce(producer, produced.clone()));

    let mut workers = vec![
        Worker::spawn(&url, "worker-a")?,
        Worker::spawn(&url, "worker-b")?,
    ];
    let mut watcher = AssignmentWatcher::new(conn.clone())?;
    let mut replaced = false;
    let mut last_progress = Instant::now();
    loop {
        tokio::time::sleep(POLL).await;
        watcher.poll(started).await;
        let handled = counter(&mut conn, "demo:unique").await?;
        let sent = produced.load(Ordering::Relaxed);
        if last_progress.elapsed() >= Duration::from_secs(2) {
            println!(
                "{} progress: produced {sent:>5}, handled {handled:>5}",
                stamp(started)
            );
            last_progress = Instant::now();
        }
        if !replaced && handled >= TOTAL / 3 {
            println!(
                "{} SIGKILL {} after {handled} handled orders",
                stamp(started),
                workers[0].name
            );
            workers[0].kill().await;
            workers.push(Worker::spawn(&url, "worker-c")?);
            println!("{} started replacement worker-c", stamp(started));
            replaced = true;
        }
        if handled >= TOTAL && producing.is_finished() {
            println!("{} all {TOTAL} orders handled", stamp(started));
            break;
        }
        if started.elapsed() > DEADLINE {
            println!(
                "{} deadline passed: {handled} of {TOTAL} handled",
                stamp(started)
            );
            break;
        }
    }
    producing.await??;

    for worker in workers.iter_mut() {
        worker.terminate().await;
    }
    println!("{} workers stopped", stamp(started));
    watcher.poll(started).await;

    let report = verify(&mut conn, produced.load(Ordering::Relaxed)).await?;
    report.print();
    Ok(if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `REDIS_URL` if set, else a private redis-server (kept alive by the returned handle).
fn redis_url() -> (Option<RedisServer>, String) {
    match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => (None, url),
        _ => {
            let server = RedisServer::start();
            let url = server.url();
            (Some(server), url)
        }
    }
}

/// Creates the topology and a fresh group `demo` that reads only what this run produces; forgets what a
/// previous run on the same Redis recorded.
async fn prepare(conn: &mut ConnectionManager) -> Res<()> {
    let topology = Topology::ensure(conn, STREAM, SHARDS).await?;
    for stream in topology.stream_keys() {
        let _: redis::RedisResult<i64> = redis::cmd("XGROUP")
            .arg("DESTROY")
            .arg(&stream)
            .arg(GROUP)
            .query_async(conn)
            .await;
    }
    let mut stale: Vec<String> = Vec::new();
    for pattern in ["demo:*", "sl:{orders/demo}:*"] {
        let mut keys: redis::AsyncIter<'_, String> = redis::cmd("SCAN")
            .cursor_arg(0)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .clone()
            .iter_async(conn)
            .await?;
        while let Some(key) = keys.next_item().await {
            stale.push(key?);
        }
    }
    if !stale.is_empty() {
        redis::cmd("DEL")
            .arg(&stale)
            .query_async::<i64>(conn)
            .await?;
    }
    Topology::ensure_group(conn, STREAM, GROUP, StartFrom::Latest).await?;
    println!("topology: stream `{STREAM}` with {SHARDS} shards, group `{GROUP}`");
    Ok(())
}

/// Sends seq 0, then seq 1, ... for every key: one round of `KEYS` orders every `ROUND_PAUSE`.
async fn produce(producer: Producer, produced: Arc<AtomicU64>) -> Res<()> {
    for seq in 0..SEQS {
        let batch: Vec<(String, Order)> = (0..KEYS)
            .map(|k| {
                let order = Order {
                    id: seq,
                    amount_cents: 100,
                };
                (format!("key-{k:03}"), order)
            })
            .collect();
        producer.send_batch(&batch).await?;
        produced.fetch_add(KEYS, Ordering::Relaxed);
        tokio::time::sleep(ROUND_PAUSE).await;
    }
    Ok(())
}

async fn counter(conn: &mut ConnectionManager, key: &str) -> Res<u64> {
    let n: Option<u64> = redis::cmd("GET").arg(key).query_async(conn).await?;
    Ok(n.unwrap_or(0))
}

fn stamp(started: Instant) -> String {
    format!("[{:>5.1}s]", started.elapsed().as_secs_f64())
}

/// A worker process: this binary with the `worker` argument.
struct Worker {
    name: String,
    child: Child,
}

impl Worker {
    fn spawn(url: &str, name: &str) -> Res<Worker> {
        let child = Command::new(std::env::current_exe()?)
            .arg("worker")
            .env("REDIS_URL", url)
            .env("STREAM_LISTENER_MEMBER_ID", name)
            .kill_on_drop(true)
            .spawn()?;
        println!("spawned {name} (pid {})", child.id().unwrap_or(0));
        Ok(Worker {
            name: name.to_string(),
            child,
        })
    }

    /// SIGKILL: no graceful leave; the group notices when the members' leases expire.
    async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// SIGTERM, then wait for the graceful shutdown (SIGKILL if it takes too long).
    async fn terminate(&mut self) {
        let Some(pid) = self.child.id() else { return }; // already exited
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status();
        match tokio::time::timeout(STOP_TIMEOUT, self.child.wait()).await {
            Ok(Ok(status)) => println!("{} exited: {status}", self.name),
            _ => {
                println!("{} did not stop in time: SIGKILL", self.name);
                self.kill().await;
            }
        }
    }
}

/// Prints the group's assignment whenever it changes.
struct AssignmentWatcher {
    store: GroupStore,
    last: String,
}

impl AssignmentWatcher {
    fn new(conn: ConnectionManager) -> Res<Self> {
        let store = GroupStore::create(conn, STREAM, GROUP, SHARDS, GroupConfig::default())?;
        Ok(Self {
            store,
            last: String::new(),
        })
    }

    async fn poll(&mut self, started: Instant) {
        let projection = match self.store.projection().await {
            Ok(Some(p)) => p,
            Ok(None) => return, // no member has joined yet
            Err(e) => {
                println!("{} could not read the assignment: {e}", stamp(started));
                return;
            }
        };
        let mut members = projection.members.clone();
        members.sort_by(|a, b| a.member_id.cmp(&b.member_id));
        let lines: Vec<String> = members
            .iter()
            .map(|m| {
                let mut line = format!(
                    "    {:<14} epoch {:>3}  {:<8} owns {:>2} {}",
                    m.member_id,
                    m.member_epoch,
                    format!("{:?}", m.state),
                    m.owned.len(),
                    shard_list(&m.owned)
                );
                // Shards in motion: assigned but not yet taken, or being given back.
                for (label, shards) in [("pending", &m.pending), ("revoking", &m.revoking)] {
                    if !shards.is_empty() {
                        line += &format!("  {label} {}", shard_list(shards));
                    }
                }
                line
            })
            .collect();
        let text = lines.join("\n");
        if text != self.last {
            println!(
                "{} assignment: group epoch {}, {:?}, {} members",
                stamp(started),
                projection.group_epoch,
                projection.state,
                members.len()
            );
            println!("{text}");
            self.last = text;
        }
    }
}

fn shard_list(shards: &[u32]) -> String {
    let mut sorted = shards.to_vec();
    sorted.sort_unstable();
    let items: Vec<String> = sorted.iter().map(u32::to_string).collect();
    format!("[{}]", items.join(","))
}

// ------------------------------------------------------------------------------------------------
// Verification
// ------------------------------------------------------------------------------------------------

#[derive(Debug, Default)]
struct Report {
    produced: u64,
    handled_unique: u64,
    handles_total: u64,
    duplicates: u64,
    lost: u64,
    order_violations: u64,
}

async fn verify(conn: &mut ConnectionManager, produced: u64) -> Res<Report> {
    let mut report = Report {
        produced,
        ..Report::default()
    };
    for k in 0..KEYS {
        let key = format!("key-{k:03}");
        let counts: HashMap<u64, u64> = redis::cmd("HGETALL")
            .arg(format!("demo:handles:{key}"))
            .query_async(conn)
            .await?;
        let seen: Vec<u64> = redis::cmd("LRANGE")
            .arg(format!("demo:seen:{key}"))
            .arg(0)
            .arg(-1)
            .query_async(conn)
            .await?;
        for seq in 0..SEQS {
            match counts.get(&seq).copied().unwrap_or(0) {
                0 => report.lost += 1,
                n => {
                    report.handled_unique += 1;
                    report.duplicates += n - 1;
                    report.handles_total += n;
                }
            }
        }
        report.order_violations += order_violations(&seen);
    }
    Ok(report)
}

/// First handles of one key that came after a larger seq had already been handled.
fn order_violations(first_handled: &[u64]) -> u64 {
    let mut max: Option<u64> = None;
    let mut violations = 0;
    for &seq in first_handled {
        match max {
            Some(m) if seq < m => violations += 1,
            _ => max = Some(seq),
        }
    }
    violations
}

impl Report {
    fn ok(&self) -> bool {
        self.lost == 0 && self.order_violations == 0
    }

    fn print(&self) {
        let verdict = |good: bool| if good { "ok" } else { "FAIL" };
        println!();
        println!("+--------------------------+---------+--------+");
        println!("| check                    |   value | status |");
        println!("+--------------------------+---------+--------+");
        println!(
            "| produced                 | {:>7} |        |",
            self.produced
        );
        println!(
            "| handled (unique)         | {:>7} | {:<6} |",
            self.handled_unique,
            verdict(self.handled_unique == self.produced)
        );
        println!(
            "| handles (total)          | {:>7} |        |",
            self.handles_total
        );
        println!(
            "| duplicates (redelivered) | {:>7} | {:<6} |",
            self.duplicates, "info"
        );
        println!(
            "| lost                     | {:>7} | {:<6} |",
            self.lost,
            verdict(self.lost == 0)
        );
        println!(
            "| per-key order violations | {:>7} | {:<6} |",
            self.order_violations,
            verdict(self.order_violations == 0)
        );
        println!("+--------------------------+---------+--------+");
        println!(
            "{}",
            if self.ok() {
                "PASS: nothing lost, per-key order kept (duplicates are at-least-once redeliveries)"
            } else {
                "FAIL"
            }
        );
    }
}
