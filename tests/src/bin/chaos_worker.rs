//! The worker process of the fault-injection suite (`tests/tests/faults.rs`).
//!
//! Runs `CHAOS_MEMBERS` logical members `{CHAOS_PROC}-m0 ..` of one group through
//! [`stream_listener::Runtime`], each built with a [`ConsumerBuilder`]. Every handle is recorded in the
//! record server (`CHAOS_RECORD_URL`: a second Redis that the driver never faults, so the records survive
//! a Redis restarted empty) by one script call, atomically:
//!
//! - `XADD chaos:log * k <key> s <seq> sh <shard> id <entry id> m <member> e <member epoch> t0 <start>
//!   t1 <end> dc <delivery count> pid <pid>`; `t0` is this process's wall clock at handler start and `t1`
//!   the Redis `TIME` at which the record lands (both microseconds since the epoch, one machine's clock), so
//!   a handler frozen before it wrote its record still shows the whole time it was in flight;
//! - `SADD chaos:done <key>/<seq>`: progress for the driver.
//!
//! The handler sleeps `CHAOS_HANDLE_MS` first, so that a SIGSTOP catches handlers mid-flight. SIGTERM (or
//! ctrl-c) shuts the runtime down gracefully ([`stream_listener::RunningRuntime::shutdown`]).
//!
//! | variable | meaning | default |
//! | --- | --- | --- |
//! | `REDIS_URL` | the Redis the members use (a node, or a cluster: `redis+cluster://`) | required |
//! | `CHAOS_RECORD_URL` | the Redis the records go to | `REDIS_URL` |
//! | `CHAOS_PROC` | process name, base of the member ids | `w` |
//! | `CHAOS_MEMBERS` | logical members in this process | 2 |
//! | `CHAOS_WORKERS` | `runtime_max_concurrency` of each member | 2 |
//! | `CHAOS_STREAM`, `CHAOS_GROUP` | stream and group | `orders`, `chaos` |
//! | `CHAOS_SHARDS` | the stream's shard count, should a member have to create it (Redis restarted empty) | 16 |
//! | `CHAOS_HEARTBEAT_MS`, `CHAOS_SESSION_MS`, `CHAOS_REBALANCE_MS` | group timing | 1000, 10000, 30000 |
//! | `CHAOS_HANDLE_MS` | handler sleep | 2 |
//! | `CHAOS_BATCH` | entries per read | 20 |

use std::process::ExitCode;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::ConnectionManager;
use serde::Deserialize;
use stream_listener::coordinator::metadata::GroupConfig;
use stream_listener::{ConsumerBuilder, Message, Runtime};

/// The handle log (a stream) and the set of handled `key/seq`.
const LOG_KEY: &str = "chaos:log";
const DONE_KEY: &str = "chaos:done";
/// How long a handler keeps retrying its record while the record server does not answer (a loaded machine).
const RECORD_RETRY_FOR: Duration = Duration::from_secs(20);
const RECORD_RETRY_PAUSE: Duration = Duration::from_millis(200);

static RECORD: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
local t = redis.call('TIME')
local t1 = tostring(t[1]) .. string.format('%06d', tonumber(t[2]))
redis.call('XADD', KEYS[1], '*', 'k', ARGV[1], 's', ARGV[2], 'sh', ARGV[3], 'id', ARGV[4],
  'm', ARGV[5], 'e', ARGV[6], 't0', ARGV[7], 't1', t1, 'dc', ARGV[8], 'pid', ARGV[9])
redis.call('SADD', KEYS[2], ARGV[1] .. '/' .. ARGV[2])
return 1
"#,
    )
});

/// The payload the driver produces.
#[derive(Debug, Deserialize)]
struct Item {
    key: String,
    seq: u64,
}

#[derive(Debug)]
struct Settings {
    url: String,
    record_url: String,
    proc_name: String,
    members: u32,
    workers: usize,
    stream: String,
    group: String,
    shards: u32,
    config: GroupConfig,
    handle: Duration,
    batch: usize,
    /// Static membership (`CHAOS_STATIC=1`): a graceful exit announces the restart.
    static_membership: bool,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

impl Settings {
    fn from_env() -> Result<Settings, String> {
        let url = std::env::var("REDIS_URL").map_err(|_| "REDIS_URL is not set".to_string())?;
        Ok(Settings {
            record_url: env_or("CHAOS_RECORD_URL", url.clone()),
            url,
            proc_name: env_or("CHAOS_PROC", "w".to_string()),
            members: env_or("CHAOS_MEMBERS", 2u32).max(1),
            workers: env_or("CHAOS_WORKERS", 2usize).max(1),
            stream: env_or("CHAOS_STREAM", "orders".to_string()),
            group: env_or("CHAOS_GROUP", "chaos".to_string()),
            shards: env_or("CHAOS_SHARDS", 16u32).max(1),
            config: GroupConfig {
                heartbeat_interval_ms: env_or("CHAOS_HEARTBEAT_MS", 1_000),
                session_timeout_ms: env_or("CHAOS_SESSION_MS", 10_000),
                rebalance_timeout_ms: env_or("CHAOS_REBALANCE_MS", 30_000),
            },
            handle: Duration::from_millis(env_or("CHAOS_HANDLE_MS", 2)),
            batch: env_or("CHAOS_BATCH", 20usize).max(1),
            static_membership: env_or("CHAOS_STATIC", 0u8) == 1,
        })
    }
}

/// Wall clock, microseconds since the epoch (comparable with Redis `TIME` on the same machine).
fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

struct Recorder {
    conn: ConnectionManager,
    handle: Duration,
    pid: u32,
}

impl Recorder {
    async fn handle(&self, msg: Message<Item>) -> Result<(), redis::RedisError> {
        let t0 = now_us();
        tokio::time::sleep(self.handle).await;
        let deadline = tokio::time::Instant::now() + RECORD_RETRY_FOR;
        loop {
            let mut conn = self.conn.clone();
            let result = RECORD
                .key(LOG_KEY)
                .key(DONE_KEY)
                .arg(&msg.payload.key)
                .arg(msg.payload.seq)
                .arg(msg.shard)
                .arg(&msg.id)
                .arg(&*msg.token.member_id)
                .arg(msg.token.member_epoch)
                .arg(t0.to_string())
                .arg(msg.delivery_count)
                .arg(self.pid)
                .invoke_async::<i64>(&mut conn)
                .await;
            match result {
                Ok(_) => return Ok(()),
                Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                Err(_) => tokio::time::sleep(RECORD_RETRY_PAUSE).await,
            }
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("chaos_worker: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let settings = Settings::from_env()?;
    let client = redis::Client::open(settings.record_url.as_str())?;
    // A generous response timeout: a record that timed out but landed would be written twice on retry.
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_secs(10)))
        .set_connection_timeout(Some(Duration::from_secs(2)));
    let conn = client.get_connection_manager_with_config(config).await?;
    let recorder = Arc::new(Recorder {
        conn,
        handle: settings.handle,
        pid: std::process::id(),
    });
    let mut runtime = Runtime::new(settings.url.clone())
        .without_annotated_listeners()
        .group_config(settings.config)
        .shutdown_timeout(Duration::from_secs(20));
    if settings.static_membership {
        runtime = runtime.static_membership();
    }
    for m in 0..settings.members {
        let recorder = recorder.clone();
        runtime = runtime.consumer(
            ConsumerBuilder::new(&settings.stream, &settings.group)
                .member_id(format!("{}-m{m}", settings.proc_name))
                .shard_count(settings.shards)
                .runtime_max_concurrency(settings.workers)
                .batch_size(settings.batch)
                .handler(move |msg: Message<Item>| {
                    let recorder = recorder.clone();
                    async move { recorder.handle(msg).await }
                }),
        );
    }
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    // No retry here: a start that failed half-way may have left members running, and a second start
    // would run the same member ids twice in one process. The driver restarts a worker that exited.
    let running = runtime.start().await?;
    eprintln!(
        "chaos_worker {} (pid {}) started members {:?}",
        settings.proc_name,
        std::process::id(),
        running.listener_ids()
    );
    tokio::select! {
        _ = sigterm.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    if let Err(error) = running.stop().await {
        tracing::error!(%error, "shutdown incomplete");
    }
    eprintln!("chaos_worker {} stopped", settings.proc_name);
    Ok(())
}
