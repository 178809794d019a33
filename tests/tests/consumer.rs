//! The consumption layer against real redis-server processes: delivery, ack policies, failures, takeover,
//! revoke and fence, scheduling fairness and connection use. Tests run on a single node and on a Redis
//! Cluster, except those that say why they need one node.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::Value;
use serde::Deserialize;
use stream_listener::connection::{Connection, RedisTarget};
use stream_listener::consumer::{
    dead_letter_fields, AckPolicy, BoxedHandler, Consumer, ConsumerConfig, DeleteRef, HandlerError,
    Message, OnExhausted, RawMessage,
};
use stream_listener::member::lifecycle::{
    FencingToken, OwnershipDeadline, ShardCommand, ShardReport,
};
use stream_listener_test_support::aio::{
    command_calls, connect_multiplexed, info, info_field, wait_until_async, xlen, xpending_count,
    xrange,
};
use stream_listener_test_support::monitor::{Monitor, MonitorLine};
use stream_listener_test_support::RedisServer;
use stream_listener_tests::{on_every_target, Target, TestRedis};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

const GROUP: &str = "billing";

#[derive(Debug, Deserialize)]
struct Order {
    n: u64,
}

async fn create_groups(
    conn: &mut impl ConnectionLike,
    prefix: &str,
    shards: impl IntoIterator<Item = u32>,
) {
    for shard in shards {
        let _: () = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(format!("{prefix}:{shard}"))
            .arg(GROUP)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(conn)
            .await
            .unwrap();
    }
}

/// Redis on `target`, a connection to it, and group [`GROUP`] on `shards` of `prefix`.
async fn redis_with_groups(
    target: Target,
    prefix: &str,
    shards: impl IntoIterator<Item = u32>,
) -> (TestRedis, Connection) {
    let redis = target.start();
    let mut conn = redis.connect().await;
    create_groups(&mut conn, prefix, shards).await;
    (redis, conn)
}

/// Append `count` entries `{"n": i}` (i from `start`) with key `key-{i % 7}` to one shard, in one pipeline.
async fn produce(
    conn: &mut impl ConnectionLike,
    prefix: &str,
    shard: u32,
    start: u64,
    count: u64,
) -> Vec<String> {
    let mut pipe = redis::pipe();
    for n in start..start + count {
        pipe.cmd("XADD")
            .arg(format!("{prefix}:{shard}"))
            .arg("*")
            .arg("k")
            .arg(format!("key-{}", n % 7))
            .arg("p")
            .arg(format!("{{\"n\":{n}}}"));
    }
    pipe.query_async(conn).await.unwrap()
}

async fn consumer_names(conn: &mut impl ConnectionLike, key: &str) -> Vec<(String, i64)> {
    let reply: Vec<HashMap<String, Value>> = redis::cmd("XINFO")
        .arg("CONSUMERS")
        .arg(key)
        .arg(GROUP)
        .query_async(conn)
        .await
        .unwrap();
    reply
        .into_iter()
        .map(|c| {
            let name = match c.get("name") {
                Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                other => panic!("unexpected name {other:?}"),
            };
            let pending = match c.get("pending") {
                Some(Value::Int(n)) => *n,
                _ => -1,
            };
            (name, pending)
        })
        .collect()
}

async fn read_stream(conn: &mut impl ConnectionLike, key: &str) -> Vec<HashMap<String, String>> {
    let entries = xrange(conn, key).await;
    entries.into_iter().map(|(_, fields)| fields).collect()
}

/// Reads of shard streams: group reads (`XREADGROUP`) and the idle wait's `XREAD`.
async fn read_calls(conn: &mut impl ConnectionLike) -> u64 {
    let calls = command_calls(conn).await;
    ["xreadgroup", "xread"]
        .iter()
        .map(|name| calls.get(*name).copied().unwrap_or(0))
        .sum()
}

/// Calls of one command, from `INFO commandstats`.
async fn calls_of(conn: &mut impl ConnectionLike, command: &str) -> u64 {
    command_calls(conn).await.get(command).copied().unwrap_or(0)
}

/// The `CLIENT LIST` line of the one blocked client, if exactly one is blocked.
async fn blocked_client_line(conn: &mut impl ConnectionLike) -> Option<String> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(conn)
        .await
        .unwrap();
    let blocked: Vec<&str> = list
        .lines()
        .filter(|l| {
            l.split(' ')
                .any(|f| f.starts_with("flags=") && f.contains('b'))
        })
        .collect();
    (blocked.len() == 1).then(|| blocked[0].to_owned())
}

async fn blocked_clients(conn: &mut impl ConnectionLike) -> u64 {
    info_field(&info(conn, "clients").await, "blocked_clients").unwrap_or(0)
}

async fn client_count(conn: &mut impl ConnectionLike) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(conn)
        .await
        .unwrap();
    list.lines().filter(|l| !l.trim().is_empty()).count()
}

/// A grant's fencing token: epochs grow with every grant, as the coordinator issues them.
fn token(member: &str) -> FencingToken {
    static EPOCHS: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(1);
    FencingToken {
        member_id: Arc::from(member),
        member_epoch: EPOCHS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
    }
}

/// A consumer running in its own task, with its reports collected.
struct Running {
    member: String,
    pause: stream_listener::consumer::PauseHandle,
    commands: mpsc::UnboundedSender<ShardCommand>,
    reports: Arc<Mutex<Vec<ShardReport>>>,
    task: JoinHandle<()>,
}

impl Running {
    async fn start(url: &str, config: ConsumerConfig, handler: BoxedHandler) -> Self {
        Self::start_with_deadline(url, config, handler, OwnershipDeadline::unbounded()).await
    }

    async fn start_with_deadline(
        url: &str,
        config: ConsumerConfig,
        handler: BoxedHandler,
        deadline: Arc<OwnershipDeadline>,
    ) -> Self {
        let member = config.consumer_name.clone();
        let consumer = Consumer::connect(RedisTarget::open(url).unwrap(), config, handler)
            .await
            .unwrap()
            .with_deadline(deadline);
        let pause = consumer.pause_handle();
        let (commands, command_rx) = mpsc::unbounded_channel();
        let (report_tx, mut report_rx) = mpsc::unbounded_channel();
        let reports = Arc::new(Mutex::new(Vec::new()));
        let sink = reports.clone();
        tokio::spawn(async move {
            while let Some(report) = report_rx.recv().await {
                sink.lock().unwrap().push(report);
            }
        });
        let task = tokio::spawn(consumer.run(command_rx, report_tx));
        Self {
            member,
            pause,
            commands,
            reports,
            task,
        }
    }

    async fn assign(&self, shards: impl IntoIterator<Item = u32>) {
        for shard in shards {
            self.commands
                .send(ShardCommand::Assign {
                    shard,
                    token: token(&self.member),
                })
                .unwrap();
        }
    }

    async fn revoke(&self, shard: u32) {
        self.commands.send(ShardCommand::Revoke { shard }).unwrap();
    }

    fn reports(&self) -> Vec<ShardReport> {
        self.reports.lock().unwrap().clone()
    }

    fn revoked(&self, shard: u32) -> bool {
        self.reports()
            .iter()
            .any(|r| matches!(r, ShardReport::Revoked { shard: s } if *s == shard))
    }

    /// Close the command channel and wait for a graceful stop.
    async fn stop(self) {
        drop(self.commands);
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("consumer did not stop")
            .unwrap();
    }
}

fn config(prefix: &str, member: &str) -> ConsumerConfig {
    let mut config = ConsumerConfig::new(prefix, GROUP, member);
    config.progress_interval = Duration::from_millis(50);
    config.failure_policy.initial_backoff = Duration::from_millis(1);
    config.failure_policy.max_backoff = Duration::from_millis(5);
    // These tests look at what acknowledging alone leaves in the streams; trimming what every group
    // acknowledged is tests/retention.rs's.
    config.retention = None;
    config
}

/// A shard index and an entry id.
type ShardEntry = (u32, String);

/// Records every handled entry: (shard, id) -> delivery counts seen.
#[derive(Default, Clone)]
struct Log {
    handled: Arc<Mutex<HashMap<ShardEntry, Vec<u32>>>>,
}

impl Log {
    fn record<T>(&self, msg: &Message<T>) {
        self.handled
            .lock()
            .unwrap()
            .entry((msg.shard, msg.id.clone()))
            .or_default()
            .push(msg.delivery_count);
    }

    fn count(&self) -> usize {
        self.handled.lock().unwrap().len()
    }

    fn ids(&self) -> HashSet<(u32, String)> {
        self.handled.lock().unwrap().keys().cloned().collect()
    }
}

fn recording_handler(log: &Log) -> BoxedHandler {
    let log = log.clone();
    BoxedHandler::json(move |msg: Message<Order>| {
        let log = log.clone();
        async move {
            assert!(msg.key.starts_with("key-"));
            assert_eq!(msg.key, format!("key-{}", msg.payload.n % 7));
            log.record(&msg);
            Ok::<(), HandlerError>(())
        }
    })
}

/// What a handler saw, in order: each entry's `n` and its delivery count.
type Seen = Arc<Mutex<Vec<(u64, u32)>>>;

/// A handler that records into `seen` what it handles, in order (see [`Seen`]).
fn order_recording_handler(seen: &Seen) -> BoxedHandler {
    let seen = seen.clone();
    BoxedHandler::json(move |msg: Message<Order>| {
        let seen = seen.clone();
        async move {
            seen.lock()
                .unwrap()
                .push((msg.payload.n, msg.delivery_count));
            Ok::<(), HandlerError>(())
        }
    })
}

async fn every_entry_is_handled_and_acked(target: Target) {
    let (redis, mut conn) = redis_with_groups(target, "orders", 0..4).await;
    redis.assert_spread("orders", 4);
    let mut expected = HashSet::new();
    for shard in 0..4 {
        for id in produce(&mut conn, "orders", shard, 0, 250).await {
            expected.insert((shard, id));
        }
    }
    let log = Log::default();
    let mut cfg = config("orders", "m0");
    cfg.runtime_max_concurrency = 2;
    cfg.batch_size = 32;
    let running = Running::start(redis.url(), cfg, recording_handler(&log)).await;
    running.assign(0..4).await;
    wait_until_async(
        "all 1000 entries handled",
        Duration::from_secs(20),
        || async { log.count() == 1000 },
    )
    .await;
    assert_eq!(log.ids(), expected);
    for shard in 0..4 {
        let key = format!("orders:{shard}");
        wait_until_async("pending list empty", Duration::from_secs(5), || {
            let mut conn = conn.clone();
            let key = key.clone();
            async move { xpending_count(&mut conn, &key, GROUP).await == 0 }
        })
        .await;
        assert_eq!(
            xlen(&mut conn, &key).await,
            250,
            "plain ack keeps entries in the stream"
        );
    }
    // Exactly once in the happy path, in order per shard.
    assert!(log.handled.lock().unwrap().values().all(|d| d == &vec![1]));
    // Progress is reported with the last acked id of each shard.
    wait_until_async(
        "progress of every shard",
        Duration::from_secs(5),
        || async {
            let reports = running.reports();
            (0..4).all(|shard| {
                reports.iter().any(|r| {
                    matches!(r, ShardReport::Progress(p) if p.shard.shard_index == shard
                    && p.stream_key == format!("orders:{shard}")
                    && p.last_acked_id.is_some() && p.updated_at.is_some())
                })
            })
        },
    )
    .await;
    running.stop().await;
}

async fn entries_are_handled_in_order_within_a_shard(target: Target) {
    let (redis, mut conn) = redis_with_groups(target, "seq", 0..2).await;
    redis.assert_spread("seq", 2);
    produce(&mut conn, "seq", 0, 0, 300).await;
    produce(&mut conn, "seq", 1, 0, 300).await;
    let seen: Arc<Mutex<HashMap<u32, Vec<u64>>>> = Arc::default();
    let sink = seen.clone();
    let handler = BoxedHandler::json(move |msg: Message<Order>| {
        let sink = sink.clone();
        async move {
            sink.lock()
                .unwrap()
                .entry(msg.shard)
                .or_default()
                .push(msg.payload.n);
            Ok::<(), String>(())
        }
    });
    let mut cfg = config("seq", "m0");
    cfg.runtime_max_concurrency = 4;
    cfg.batch_size = 7;
    let running = Running::start(redis.url(), cfg, handler).await;
    running.assign(0..2).await;
    wait_until_async("600 entries", Duration::from_secs(20), || async {
        seen.lock().unwrap().values().map(Vec::len).sum::<usize>() == 600
    })
    .await;
    for (shard, ns) in seen.lock().unwrap().iter() {
        assert_eq!(
            ns,
            &(0..300).collect::<Vec<_>>(),
            "shard {shard} out of order"
        );
    }
    running.stop().await;
}

/// Single node only: it counts reads and blocked clients in one node's `INFO`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_worker_with_64_idle_shards_finds_traffic_on_the_last_one() {
    let (redis, mut conn) = redis_with_groups(Target::Single, "wide", 0..64).await;
    let log = Log::default();
    let mut cfg = config("wide", "m0");
    cfg.runtime_max_concurrency = 1;
    let running = Running::start(redis.url(), cfg, recording_handler(&log)).await;
    running.assign(0..64).await;
    // Let the claim phase of every shard pass so the consumer is in its idle wait.
    wait_until_async("idle wait", Duration::from_secs(10), || {
        let mut conn = conn.clone();
        async move { blocked_clients(&mut conn).await == 1 }
    })
    .await;
    for round in 0..5u64 {
        let before = read_calls(&mut conn).await;
        let started = Instant::now();
        produce(&mut conn, "wide", 63, round, 1).await;
        wait_until_async("entry on shard 63", Duration::from_secs(5), || async {
            log.count() as u64 == round + 1
        })
        .await;
        let reads = read_calls(&mut conn).await - before;
        let latency = started.elapsed();
        // At most about two rotations over 64 shards (one of which may include a short blocking read).
        assert!(
            reads <= 2 * 64 + 4,
            "needed {reads} reads to find the entry on the last shard"
        );
        assert!(latency < Duration::from_secs(1), "latency {latency:?}");
    }
    running.stop().await;
}

/// A burst onto many idle shards at once (one `MULTI`: the blocked wait sees all of them) is read a batch
/// per worker at a time, not a batch per shard: what the idle wait delivers is held in memory, pending,
/// until a worker takes it. Checked from Redis: the group's pending entries never exceed what the wait
/// may read (a batch per worker in all) plus a batch per worker in the jobs. Everything is handled, in
/// order per shard, and nothing stays pending.
///
/// Single node only: one `MULTI` over 64 shard streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_onto_many_idle_shards_is_read_a_batch_per_worker_at_a_time() {
    const SHARDS: u32 = 64;
    const EACH: u64 = 20;
    let (redis, mut conn) = redis_with_groups(Target::Single, "burst", 0..SHARDS).await;
    let seen: Arc<Mutex<HashMap<u32, Vec<u64>>>> = Arc::default();
    let sink = seen.clone();
    let handler = BoxedHandler::json(move |msg: Message<Order>| {
        let sink = sink.clone();
        async move {
            // Slow enough that the burst takes a while to work off.
            tokio::time::sleep(Duration::from_millis(1)).await;
            sink.lock()
                .unwrap()
                .entry(msg.shard)
                .or_default()
                .push(msg.payload.n);
            Ok::<(), HandlerError>(())
        }
    });
    let mut cfg = config("burst", "m0");
    cfg.runtime_max_concurrency = 2;
    let bound = 2 * cfg.batch_size;
    let running = Running::start(redis.url(), cfg, handler).await;
    running.assign(0..SHARDS).await;
    wait_until_async("idle wait", Duration::from_secs(10), || {
        let mut conn = conn.clone();
        async move { blocked_clients(&mut conn).await == 1 }
    })
    .await;
    let mut burst = redis::pipe();
    burst.atomic();
    for shard in 0..SHARDS {
        for n in 0..EACH {
            burst
                .cmd("XADD")
                .arg(format!("burst:{shard}"))
                .arg("*")
                .arg("k")
                .arg(format!("key-{}", n % 7))
                .arg("p")
                .arg(format!("{{\"n\":{n}}}"))
                .ignore();
        }
    }
    let () = burst.query_async(&mut conn).await.unwrap();
    let total = u64::from(SHARDS) * EACH;
    let handled = || seen.lock().unwrap().values().map(Vec::len).sum::<usize>() as u64;
    let mut most_pending = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    // Bounded by count and time: one sample per millisecond or so until everything is handled.
    for _ in 0..200_000 {
        let mut pending = 0;
        for shard in 0..SHARDS {
            pending += xpending_count(&mut conn, &format!("burst:{shard}"), GROUP).await;
        }
        most_pending = most_pending.max(pending);
        if handled() == total || Instant::now() > deadline {
            break;
        }
    }
    assert_eq!(handled(), total, "everything handled");
    assert!(
        most_pending <= 2 * bound as i64,
        "{most_pending} entries pending at once: more than the wait's bound of {bound} plus a batch per worker"
    );
    for (shard, ns) in seen.lock().unwrap().iter() {
        assert_eq!(
            *ns,
            (0..EACH).collect::<Vec<_>>(),
            "shard {shard} in order, once each"
        );
    }
    wait_until_async("nothing pending", Duration::from_secs(10), || {
        let conn = conn.clone();
        async move {
            for shard in 0..SHARDS {
                if xpending_count(&mut conn.clone(), &format!("burst:{shard}"), GROUP).await != 0 {
                    return false;
                }
            }
            true
        }
    })
    .await;
    running.stop().await;
}

/// Single node only: it counts reads in one node's `INFO commandstats`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_shards_are_not_polled_by_free_workers_while_the_idle_wait_runs() {
    let (redis, mut conn) = redis_with_groups(Target::Single, "calm", 0..8).await;
    let log = Log::default();
    let mut cfg = config("calm", "m0");
    // Several workers: the shards whose jobs were still running when the wait started come back empty
    // while it runs. They must join the next wait, not be polled again and again by the free workers.
    cfg.runtime_max_concurrency = 4;
    let running = Running::start(redis.url(), cfg, recording_handler(&log)).await;
    running.assign(0..8).await;
    wait_until_async("idle wait", Duration::from_secs(10), || {
        let mut conn = conn.clone();
        async move { blocked_clients(&mut conn).await == 1 }
    })
    .await;
    let before = read_calls(&mut conn).await;
    // An observation window, not a synchronisation: an idle member sends about one blocking read per
    // 450 ms; polling while the wait runs would send thousands.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let reads = read_calls(&mut conn).await - before;
    assert!(reads <= 30, "an idle member sent {reads} reads in 2 s");
    // And it still wakes for traffic on any shard.
    produce(&mut conn, "calm", 5, 0, 1).await;
    wait_until_async("entry on shard 5", Duration::from_secs(5), || async {
        log.count() == 1
    })
    .await;
    running.stop().await;
}

/// Busy shards take turns: a job asked to hand its shard back to a waiting one goes on for
/// `YIELD_AFTER` (5 ms) at most, so with a handler whose batch outlasts that (1 ms an entry, batches of
/// 10) each turn is one batch. (A fast handler's turn is several batches within those 5 ms: a hand-over
/// costs the driver's turn and a new task, and spreading it kept 4 workers over 16 busy shards up with
/// traffic, see the latency bench.)
async fn busy_shards_are_rotated_not_drained_one_by_one(target: Target) {
    let (redis, mut conn) = redis_with_groups(target, "busy", 0..16).await;
    redis.assert_spread("busy", 16);
    for shard in 0..16 {
        produce(&mut conn, "busy", shard, 0, 200).await;
    }
    let order: Arc<Mutex<Vec<u32>>> = Arc::default();
    let sink = order.clone();
    let handler = BoxedHandler::raw(move |msg: RawMessage| {
        let sink = sink.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            sink.lock().unwrap().push(msg.shard);
            Ok::<(), String>(())
        }
    });
    let mut cfg = config("busy", "m0");
    cfg.batch_size = 10;
    let running = Running::start(redis.url(), cfg, handler).await;
    running.assign(0..16).await;
    wait_until_async("all entries", Duration::from_secs(30), || async {
        order.lock().unwrap().len() == 3200
    })
    .await;
    let order = order.lock().unwrap().clone();
    let first_of_last = order.iter().position(|s| *s == 15).unwrap();
    let shard0_before = order[..first_of_last].iter().filter(|s| **s == 0).count();
    // One turn at most: what the idle wait delivered for the shard (the shards' first jobs, claims of
    // their own pending entries, find none and leave them idle; the wait reads at most 10 x 4 workers /
    // 16 shards = 2 of each), then one batch.
    assert!(
        shard0_before <= 2 + 10,
        "shard 0 had {shard0_before} entries handled before shard 15's first"
    );
    running.stop().await;
}

/// Single node only: it counts pending entries per shard on one node.
///
/// Four workers over 16 shards whose handlers block: at most four handlers run at once, and meanwhile the
/// other shards' new entries are read (pending for the member), each shard by a job of its own that waits
/// for a worker, so that a shard is read as it fills rather than when its turn comes. Without the
/// handlers' permits all 16 handlers run at once; with a job per worker, four blocked handlers hold every
/// job and nothing else is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_shards_are_read_than_handled_at_once() {
    let (redis, mut conn) = redis_with_groups(Target::Single, "ahead", 0..16).await;
    /// What the handlers do: block until released, counting how many run at once.
    #[derive(Default)]
    struct Gate {
        running: AtomicUsize,
        most: AtomicUsize,
        handled: AtomicUsize,
        released: AtomicBool,
        release: tokio::sync::Notify,
    }
    let gate = Arc::new(Gate::default());
    let handler = {
        let gate = gate.clone();
        BoxedHandler::raw(move |_msg: RawMessage| {
            let gate = gate.clone();
            async move {
                let now = gate.running.fetch_add(1, Ordering::SeqCst) + 1;
                gate.most.fetch_max(now, Ordering::SeqCst);
                let release = gate.release.notified();
                if !gate.released.load(Ordering::SeqCst) {
                    release.await;
                }
                gate.running.fetch_sub(1, Ordering::SeqCst);
                gate.handled.fetch_add(1, Ordering::SeqCst);
                Ok::<(), String>(())
            }
        })
    };
    let mut cfg = config("ahead", "m0");
    cfg.runtime_max_concurrency = 4;
    let running = Running::start(redis.url(), cfg, handler).await;
    running.assign(0..16).await;
    for shard in 0..4 {
        produce(&mut conn, "ahead", shard, 0, 3).await;
    }
    wait_until_async("four handlers block", Duration::from_secs(10), || async {
        gate.running.load(Ordering::SeqCst) == 4
    })
    .await;
    for shard in 4..16 {
        produce(&mut conn, "ahead", shard, 0, 3).await;
    }
    wait_until_async("the other shards read", Duration::from_secs(10), || {
        let mut conn = conn.clone();
        async move {
            let mut read = 0;
            for shard in 4..16 {
                let key = format!("ahead:{shard}");
                read += u32::from(xpending_count(&mut conn, &key, GROUP).await > 0);
            }
            read == 12
        }
    })
    .await;
    assert_eq!(gate.running.load(Ordering::SeqCst), 4, "handlers running");
    gate.released.store(true, Ordering::SeqCst);
    gate.release.notify_waiters();
    wait_until_async("all handled", Duration::from_secs(10), || async {
        gate.handled.load(Ordering::SeqCst) == 48
    })
    .await;
    assert_eq!(
        gate.most.load(Ordering::SeqCst),
        4,
        "handlers at once, at most"
    );
    running.stop().await;
}

/// Single node only: it looks at one shard's pending entries.
///
/// A shard revoked while its job waits for a worker (its batch read, every worker's handler blocked)
/// is handed back at once, its entries unhandled and pending for the next owner: the revocation does
/// not wait for another shard's handler. (Without the job's wake-up on stop it waits for the blocked
/// handler, here for good.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_revoked_while_its_batch_waits_for_a_worker_is_handed_back_at_once() {
    let (redis, mut conn) = redis_with_groups(Target::Single, "queue", 0..2).await;
    let release = Arc::new(tokio::sync::Notify::new());
    let seen: Arc<Mutex<Vec<u32>>> = Arc::default();
    let handler = {
        let (release, seen) = (release.clone(), seen.clone());
        BoxedHandler::raw(move |msg: RawMessage| {
            let (release, seen) = (release.clone(), seen.clone());
            async move {
                seen.lock().unwrap().push(msg.shard);
                if msg.shard == 0 {
                    release.notified().await;
                }
                Ok::<(), String>(())
            }
        })
    };
    let mut cfg = config("queue", "m0");
    cfg.runtime_max_concurrency = 1;
    let running = Running::start(redis.url(), cfg, handler).await;
    running.assign(0..2).await;
    produce(&mut conn, "queue", 0, 0, 1).await;
    wait_until_async(
        "shard 0's handler blocks",
        Duration::from_secs(10),
        || async { seen.lock().unwrap().as_slice() == [0] },
    )
    .await;
    produce(&mut conn, "queue", 1, 0, 2).await;
    wait_until_async("shard 1's batch read", Duration::from_secs(10), || {
        let mut conn = conn.clone();
        async move { xpending_count(&mut conn, "queue:1", GROUP).await == 2 }
    })
    .await;
    running.revoke(1).await;
    wait_until_async("shard 1 revoked", Duration::from_secs(5), || async {
        running.revoked(1)
    })
    .await;
    assert_eq!(
        seen.lock().unwrap().as_slice(),
        [0],
        "shard 1 was not handled"
    );
    assert_eq!(xpending_count(&mut conn, "queue:1", GROUP).await, 2);
    release.notify_waiters();
    running.stop().await;
}

/// Runs the ack-and-delete checks against `server`, for both the script path and `XACKDEL`.
async fn check_ack_delete(server: &RedisServer, expect_xackdel: bool) {
    let mut conn = connect_multiplexed(&server.url()).await;
    for (mode, prefix) in [
        (DeleteRef::KeepRef, "keep"),
        (DeleteRef::DelRef, "del"),
        (DeleteRef::Acked, "acked"),
    ] {
        create_groups(&mut conn, prefix, 0..1).await;
        let key = format!("{prefix}:0");
        // A second group that has read (and holds pending) the first 5 entries.
        let _: () = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&key)
            .arg("audit")
            .arg("0")
            .query_async(&mut conn)
            .await
            .unwrap();
        produce(&mut conn, prefix, 0, 0, 20).await;
        let _: Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg("audit")
            .arg("a1")
            .arg("COUNT")
            .arg(5)
            .arg("STREAMS")
            .arg(&key)
            .arg(">")
            .query_async(&mut conn)
            .await
            .unwrap();
        let log = Log::default();
        let mut cfg = config(prefix, "m0");
        cfg.ack_policy = AckPolicy::AckDelete(mode);
        let client = redis::Client::open(server.url()).unwrap();
        let probe = Consumer::connect(client, cfg.clone(), recording_handler(&log))
            .await
            .unwrap();
        assert_eq!(
            probe.uses_xackdel(),
            expect_xackdel,
            "server {:?}",
            probe.server_version()
        );
        let running = Running::start(&server.url(), cfg, recording_handler(&log)).await;
        running.assign([0]).await;
        wait_until_async("20 handled", Duration::from_secs(10), || async {
            log.count() == 20
        })
        .await;
        wait_until_async("our pending list empty", Duration::from_secs(5), || {
            let mut conn = conn.clone();
            let key = key.clone();
            async move { xpending_count(&mut conn, &key, GROUP).await == 0 }
        })
        .await;
        running.stop().await;
        let len = xlen(&mut conn, &key).await;
        let audit_pending = xpending_count(&mut conn, &key, "audit").await;
        match mode {
            DeleteRef::KeepRef => {
                assert_eq!(len, 0, "KEEPREF deletes every acked entry");
                assert_eq!(audit_pending, 5, "KEEPREF keeps other groups' references");
            }
            DeleteRef::DelRef => {
                assert_eq!(len, 0, "DELREF deletes every acked entry");
                assert_eq!(audit_pending, 0, "DELREF drops other groups' references");
            }
            DeleteRef::Acked => {
                assert_eq!(
                    len, 20,
                    "ACKED keeps entries another group has pending or not yet read"
                );
                assert_eq!(audit_pending, 5);
            }
        }
    }
    // ACKED deletes once every group is done.
    let key = "acked:0";
    let _: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("audit")
        .arg("a1")
        .arg("COUNT")
        .arg(100)
        .arg("STREAMS")
        .arg(key)
        .arg(">")
        .query_async(&mut conn)
        .await
        .unwrap();
    let ids: Vec<String> = read_stream_ids(&mut conn, key).await;
    let _: i64 = redis::cmd("XACK")
        .arg(key)
        .arg("audit")
        .arg(&ids)
        .query_async(&mut conn)
        .await
        .unwrap();
    produce(&mut conn, "acked", 0, 100, 1).await;
    let log = Log::default();
    let mut cfg = config("acked", "m1");
    cfg.ack_policy = AckPolicy::AckDelete(DeleteRef::Acked);
    let running = Running::start(&server.url(), cfg, recording_handler(&log)).await;
    running.assign([0]).await;
    wait_until_async("1 handled", Duration::from_secs(10), || async {
        log.count() == 1
    })
    .await;
    running.stop().await;
    // The new entry is not read by `audit` yet: it stays; the 20 old ones are done by both groups, but
    // ACKED only deletes the ids it is given, so they stay too.
    assert_eq!(xlen(&mut conn, key).await, 21);
}

async fn read_stream_ids(conn: &mut impl ConnectionLike, key: &str) -> Vec<String> {
    let entries: Vec<(String, HashMap<String, String>)> = xrange(conn, key).await;
    entries.into_iter().map(|(id, _)| id).collect()
}

/// Single node only: it needs a redis-server binary of a given version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_and_delete_on_redis_7_uses_the_script() {
    // The binary is chosen by its version, not assumed: a developer's redis-server may be newer.
    let Some(binary) = stream_listener_test_support::redis_below_8_2_binary() else {
        skip("no redis-server older than 8.2 (set REDIS_7_SERVER_BIN)");
        return;
    };
    let server = RedisServer::start_with_binary(binary);
    check_ack_delete(&server, false).await;
}

/// Says loudly that a test did not run; under `CI` that is a failure (CI must run every test).
fn skip(why: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must run this test: {why}"
    );
    println!("SKIPPED: {why}");
}

/// Single node only: it needs a redis-server binary of a given version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_and_delete_on_redis_8_2_uses_xackdel() {
    let Some(binary) = stream_listener_test_support::redis_8_binary() else {
        skip("no Redis >= 8.2 binary (set REDIS_8_SERVER_BIN or run scripts/fetch-redis8.sh)");
        return;
    };
    let server = RedisServer::start_with_binary(binary);
    check_ack_delete(&server, true).await;
}

async fn manual_ack_acks_only_what_the_handler_acked(target: Target) {
    let (redis, mut conn) = redis_with_groups(target, "manual", 0..1).await;
    produce(&mut conn, "manual", 0, 0, 40).await;
    let handled = Arc::new(AtomicUsize::new(0));
    let counter = handled.clone();
    let handler = BoxedHandler::json(move |msg: Message<Order>| {
        let counter = counter.clone();
        async move {
            if msg.payload.n.is_multiple_of(2) {
                msg.ack().await?;
                msg.ack().await?; // twice is harmless
            }
            counter.fetch_add(1, Ordering::SeqCst);
            Ok::<(), HandlerError>(())
        }
    });
    let mut cfg = config("manual", "m0");
    cfg.ack_policy = AckPolicy::Manual;
    let running = Running::start(redis.url(), cfg, handler).await;
    running.assign([0]).await;
    wait_until_async("40 handled", Duration::from_secs(10), || async {
        handled.load(Ordering::SeqCst) == 40
    })
    .await;
    wait_until_async("20 left pending", Duration::from_secs(5), || {
        let mut conn = conn.clone();
        async move { xpending_count(&mut conn, "manual:0", GROUP).await == 20 }
    })
    .await;
    running.stop().await;
}

async fn failing_entry_is_retried_then_dead_lettered_with_its_fields(target: Target) {
    let (redis, mut conn) = redis_with_groups(target, "fail", 0..2).await;
    let bad = produce(&mut conn, "fail", 1, 13, 1).await.remove(0);
    produce(&mut conn, "fail", 1, 14, 5).await;
    let attempts: Arc<Mutex<Vec<u32>>> = Arc::default();
    let ok = Log::default();
    let (sink, log) = (attempts.clone(), ok.clone());
    let handler = BoxedHandler::json(move |msg: Message<Order>| {
        let (sink, log) = (sink.clone(), log.clone());
        async move {
            if msg.payload.n == 13 {
                sink.lock().unwrap().push(msg.delivery_count);
                return Err(format!("boom on {}", msg.payload.n));
            }
            log.record(&msg);
            Ok(())
        }
    });
    let mut cfg = config("fail", "m0");
    cfg.failure_policy.max_deliveries = 3;
    let running = Running::start(redis.url(), cfg, handler).await;
    running.assign(0..2).await;
    wait_until_async("dead letter", Duration::from_secs(10), || {
        let mut conn = conn.clone();
        async move { xlen(&mut conn, "fail:dlq").await == 1 }
    })
    .await;
    wait_until_async("later entries handled", Duration::from_secs(10), || async {
        ok.count() == 5
    })
    .await;
    assert_eq!(*attempts.lock().unwrap(), vec![1, 2, 3]);
    let letters = read_stream(&mut conn, "fail:dlq").await;
    let letter = &letters[0];
    assert_eq!(letter["k"], "key-6");
    assert_eq!(letter["p"], "{\"n\":13}");
    assert_eq!(letter[dead_letter_fields::ERROR], "boom on 13");
    assert_eq!(letter[dead_letter_fields::DELIVERY_COUNT], "3");
    assert_eq!(letter[dead_letter_fields::GROUP], GROUP);
    assert_eq!(letter[dead_letter_fields::SHARD], "1");
    assert_eq!(letter[dead_letter_fields::SOURCE_STREAM], "fail:1");
    assert_eq!(letter[dead_letter_fields::SOURCE_ID], bad);
    assert_eq!(letter[dead_letter_fields::CONSUMER], "m0");
    wait_until_async("nothing pending", Duration::from_secs(5), || {
        let mut conn = conn.clone();
        async move { xpending_count(&mut conn, "fail:1", GROUP).await == 0 }
    })
    .await;
    running.stop().await;
}

async fn exhausted_entry_can_be_left_pending(target: Target) {
    let (redis, mut conn) = redis_with_groups(target, "leave", 0..1).await;
    produce(&mut conn, "leave", 0, 0, 10).await;
    let ok = Log::default();
    let log = ok.clone();
    let handler = BoxedHandler::json(move |msg: Message<Order>| {
        let log = log.clone();
        async move {
            if msg.payload.n == 3 {
                return Err("not today");
            }
            log.record(&msg);
            Ok(())
        }
    });
    let mut cfg = config("leave", "m0");
    cfg.failure_policy.max_deliveries = 2;
    cfg.failure_policy.on_exhausted = OnExhausted::LeavePending;
    let running = Running::start(redis.url(), cfg, handler).await;
    running.assign([0]).await;
    wait_until_async("9 handled", Duration::from_secs(10), || async {
        ok.count() == 9
    })
    .await;
    wait_until_async("1 pending", Duration::from_secs(5), || {
        let mut conn = conn.clone();
        async move { xpending_count(&mut conn, "leave:0", GROUP).await == 1 }
    })
    .await;
    running.stop().await;
    assert_eq!(xlen(&mut conn, "leave:dlq").await, 0);
}

async fn undecodable_payload_is_dead_lettered_at_once(target: Target) {
    let (redis, mut conn) = redis_with_groups(target, "junk", 0..1).await;
    let _: String = redis::cmd("XADD")
        .arg("junk:0")
        .arg("*")
        .arg("k")
        .arg("x")
        .arg("p")
        .arg("not json")
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: String = redis::cmd("XADD")
        .arg("junk:0")
        .arg("*")
        .arg("k")
        .arg("y")
        .query_async(&mut conn)
        .await
        .unwrap();
    produce(&mut conn, "junk", 0, 0, 1).await;
    let log = Log::default();
    let running = Running::start(redis.url(), config("junk", "m0"), recording_handler(&log)).await;
    running.assign([0]).await;
    wait_until_async("good entry handled", Duration::from_secs(10), || async {
        log.count() == 1
    })
    .await;
    wait_until_async("two dead letters", Duration::from_secs(10), || {
        let mut conn = conn.clone();
        async move { xlen(&mut conn, "junk:dlq").await == 2 }
    })
    .await;
    let letters = read_stream(&mut conn, "junk:dlq").await;
    assert_eq!(letters[0]["p"], "not json");
    assert!(
        letters[0][dead_letter_fields::ERROR].starts_with("undecodable payload"),
        "{:?}",
        letters[0]
    );
    assert_eq!(
        letters[0][dead_letter_fields::DELIVERY_COUNT],
        "1",
        "no retries for bad payloads"
    );
    assert!(letters[1][dead_letter_fields::ERROR].contains("no `p` field"));
    running.stop().await;
}

async fn handler_panic_is_a_failure_not_a_crash(target: Target) {
    let (redis, mut conn) = redis_with_groups(target, "panic", 0..1).await;
    produce(&mut conn, "panic", 0, 0, 3).await;
    let ok = Log::default();
    let log = ok.clone();
    let handler = BoxedHandler::json(move |msg: Message<Order>| {
        let log = log.clone();
        async move {
            match msg.payload.n {
                // Panics on the first delivery only.
                0 if msg.delivery_count == 1 => panic!("first try panics"),
                // Always panics: dead-lettered.
                1 => panic!("always panics"),
                _ => {}
            }
            log.record(&msg);
            Ok::<(), String>(())
        }
    });
    let mut cfg = config("panic", "m0");
    cfg.failure_policy.max_deliveries = 2;
    let running = Running::start(redis.url(), cfg, handler).await;
    running.assign([0]).await;
    wait_until_async("2 handled", Duration::from_secs(10), || async {
        ok.count() == 2
    })
    .await;
    assert!(
        ok.handled.lock().unwrap().values().any(|d| d == &vec![2]),
        "entry 0 succeeded on its 2nd delivery"
    );
    wait_until_async("dead letter", Duration::from_secs(10), || {
        let mut conn = conn.clone();
        async move { xlen(&mut conn, "panic:dlq").await == 1 }
    })
    .await;
    let letters = read_stream(&mut conn, "panic:dlq").await;
    assert!(
        letters[0][dead_letter_fields::ERROR].contains("always panics"),
        "{:?}",
        letters[0]
    );
    assert!(!running.task.is_finished());
    running.stop().await;
}

/// Tracks which entries are being handled right now, per shard, across consumers.
#[derive(Default, Clone)]
struct InFlight {
    active: Arc<Mutex<HashSet<u32>>>,
    overlap: Arc<AtomicBool>,
}

impl InFlight {
    fn enter(&self, shard: u32) {
        if !self.active.lock().unwrap().insert(shard) {
            self.overlap.store(true, Ordering::SeqCst);
        }
    }

    fn exit(&self, shard: u32) {
        self.active.lock().unwrap().remove(&shard);
    }
}

fn slow_handler(
    log: &Log,
    in_flight: &InFlight,
    who: &'static str,
    by: &Arc<Mutex<Vec<&'static str>>>,
) -> BoxedHandler {
    let (log, in_flight, by) = (log.clone(), in_flight.clone(), by.clone());
    BoxedHandler::json(move |msg: Message<Order>| {
        let (log, in_flight, by) = (log.clone(), in_flight.clone(), by.clone());
        async move {
            in_flight.enter(msg.shard);
            tokio::time::sleep(Duration::from_millis(2)).await;
            log.record(&msg);
            by.lock().unwrap().push(who);
            in_flight.exit(msg.shard);
            Ok::<(), String>(())
        }
    })
}

async fn revoked_shard_moves_to_another_consumer_without_overlap_or_loss(target: Target) {
    let (redis, mut conn) = redis_with_groups(target, "move", 0..1).await;
    let expected: HashSet<_> = produce(&mut conn, "move", 0, 0, 400)
        .await
        .into_iter()
        .map(|id| (0, id))
        .collect();
    let log = Log::default();
    let in_flight = InFlight::default();
    let by: Arc<Mutex<Vec<&'static str>>> = Arc::default();
    let mut cfg_a = config("move", "member-a");
    cfg_a.batch_size = 50;
    let a = Running::start(redis.url(), cfg_a, slow_handler(&log, &in_flight, "a", &by)).await;
    let b = Running::start(
        redis.url(),
        config("move", "member-b"),
        slow_handler(&log, &in_flight, "b", &by),
    )
    .await;
    a.assign([0]).await;
    wait_until_async("A is mid-stream", Duration::from_secs(10), || async {
        log.count() >= 60
    })
    .await;
    a.revoke(0).await;
    wait_until_async("A reports revoked", Duration::from_secs(10), || async {
        a.revoked(0)
    })
    .await;
    let reports = a.reports();
    let draining = reports
        .iter()
        .position(|r| matches!(r, ShardReport::Draining { shard: 0, .. }))
        .unwrap();
    let revoked = reports
        .iter()
        .position(|r| matches!(r, ShardReport::Revoked { shard: 0 }))
        .unwrap();
    assert!(draining < revoked);
    // A stopped mid-batch, so some of its entries are still pending under its name.
    let a_pending = consumer_names(&mut conn, "move:0")
        .await
        .into_iter()
        .find(|(n, _)| n == "member-a")
        .map(|(_, p)| p);
    assert!(
        a_pending.unwrap_or(0) > 0,
        "expected A to leave part of its batch pending"
    );
    let handled_by_a = log.count();
    b.assign([0]).await;
    wait_until_async("all 400 handled", Duration::from_secs(20), || async {
        log.count() == 400
    })
    .await;
    assert_eq!(log.ids(), expected);
    assert!(
        !in_flight.overlap.load(Ordering::SeqCst),
        "an entry of shard 0 was handled by two consumers at once"
    );
    let by = by.lock().unwrap().clone();
    assert_eq!(
        by.iter().filter(|w| **w == "a").count(),
        handled_by_a,
        "A handled nothing after Revoked"
    );
    // B claimed what A left pending: those carry a delivery count of 2.
    assert!(log.handled.lock().unwrap().values().any(|d| d == &vec![2]));
    wait_until_async("A's consumer name removed", Duration::from_secs(10), || {
        let mut conn = conn.clone();
        async move {
            xpending_count(&mut conn, "move:0", GROUP).await == 0
                && consumer_names(&mut conn, "move:0")
                    .await
                    .iter()
                    .all(|(n, _)| n != "member-a")
        }
    })
    .await;
    a.stop().await;
    b.stop().await;
}

async fn killed_consumer_in_flight_entries_are_claimed_by_the_successor(target: Target) {
    let (redis, mut conn) = redis_with_groups(target, "kill", 0..1).await;
    let expected: HashSet<_> = produce(&mut conn, "kill", 0, 0, 30)
        .await
        .into_iter()
        .map(|id| (0, id))
        .collect();
    let stuck = Arc::new(AtomicBool::new(false));
    let flag = stuck.clone();
    let hanging = BoxedHandler::json(move |msg: Message<Order>| {
        let flag = flag.clone();
        async move {
            if msg.payload.n == 5 {
                flag.store(true, Ordering::SeqCst);
                std::future::pending::<()>().await;
            }
            Ok::<(), String>(())
        }
    });
    let a = Running::start(redis.url(), config("kill", "member-a"), hanging).await;
    a.assign([0]).await;
    wait_until_async("A stuck in a handler", Duration::from_secs(10), || async {
        stuck.load(Ordering::SeqCst)
    })
    .await;
    a.task.abort();
    assert!(a.task.await.unwrap_err().is_cancelled());
    assert_eq!(
        xpending_count(&mut conn, "kill:0", GROUP).await,
        30,
        "nothing acked: the batch was in flight"
    );
    let log = Log::default();
    let b = Running::start(
        redis.url(),
        config("kill", "member-b"),
        recording_handler(&log),
    )
    .await;
    b.assign([0]).await;
    wait_until_async("B handled all 30", Duration::from_secs(10), || async {
        log.count() == 30
    })
    .await;
    assert_eq!(log.ids(), expected);
    assert!(log.handled.lock().unwrap().values().all(|d| d == &vec![2]));
    wait_until_async("nothing pending", Duration::from_secs(5), || {
        let mut conn = conn.clone();
        async move { xpending_count(&mut conn, "kill:0", GROUP).await == 0 }
    })
    .await;
    b.stop().await;
}

async fn long_pending_list_is_claimed_to_its_end_before_new_entries(target: Target) {
    let (redis, mut conn) = redis_with_groups(target, "claim", 0..1).await;
    produce(&mut conn, "claim", 0, 0, 450).await;
    // A gone member read everything and acked nothing.
    let _: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(GROUP)
        .arg("gone")
        .arg("COUNT")
        .arg(1000)
        .arg("STREAMS")
        .arg("claim:0")
        .arg(">")
        .query_async(&mut conn)
        .await
        .unwrap();
    produce(&mut conn, "claim", 0, 450, 50).await;
    let seen = Seen::default();
    let handler = order_recording_handler(&seen);
    let mut cfg = config("claim", "m0");
    cfg.batch_size = 40;
    let running = Running::start(redis.url(), cfg, handler).await;
    running.assign([0]).await;
    wait_until_async("500 handled", Duration::from_secs(20), || async {
        seen.lock().unwrap().len() == 500
    })
    .await;
    let seen = seen.lock().unwrap().clone();
    let expected: Vec<(u64, u32)> = (0..500).map(|n| (n, if n < 450 { 2 } else { 1 })).collect();
    assert_eq!(
        seen, expected,
        "claimed entries first, in order, then new ones"
    );
    running.stop().await;
}

async fn idle_consumer_names_are_deleted_on_takeover(target: Target) {
    let (redis, mut conn) = redis_with_groups(target, "names", 0..1).await;
    for ghost in ["ghost-1", "ghost-2"] {
        let _: i64 = redis::cmd("XGROUP")
            .arg("CREATECONSUMER")
            .arg("names:0")
            .arg(GROUP)
            .arg(ghost)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    produce(&mut conn, "names", 0, 0, 3).await;
    let _: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(GROUP)
        .arg("ghost-3")
        .arg("COUNT")
        .arg(10)
        .arg("STREAMS")
        .arg("names:0")
        .arg(">")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(consumer_names(&mut conn, "names:0").await.len(), 3);
    let log = Log::default();
    let running = Running::start(redis.url(), config("names", "m0"), recording_handler(&log)).await;
    running.assign([0]).await;
    wait_until_async("3 handled", Duration::from_secs(10), || async {
        log.count() == 3
    })
    .await;
    wait_until_async("only our name left", Duration::from_secs(10), || {
        let mut conn = conn.clone();
        async move {
            let names = consumer_names(&mut conn, "names:0").await;
            names.len() == 1 && names[0].0 == "m0"
        }
    })
    .await;
    running.stop().await;
}

/// Single node only: it counts one node's `CLIENT LIST`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_do_not_grow_with_owned_shards() {
    let (redis, mut conn) = redis_with_groups(Target::Single, "conns", 0..300).await;
    let baseline = client_count(&mut conn).await;
    let log = Log::default();
    let mut counts = Vec::new();
    for (member, shards, workers) in [("small", 0..2u32, 2usize), ("large", 0..300u32, 2usize)] {
        let mut cfg = config("conns", member);
        cfg.runtime_max_concurrency = workers;
        let running = Running::start(redis.url(), cfg, recording_handler(&log)).await;
        running.assign(shards.clone()).await;
        // Wait until the member is in its idle wait (every shard it polled came back empty).
        wait_until_async("the idle wait", Duration::from_secs(20), || {
            let mut conn = conn.clone();
            async move { blocked_clients(&mut conn).await == 1 }
        })
        .await;
        let target = log.count() + 1;
        produce(&mut conn, "conns", shards.end - 1, 0, 1).await;
        wait_until_async("traffic handled", Duration::from_secs(10), || async {
            log.count() == target
        })
        .await;
        let used = client_count(&mut conn).await - baseline;
        assert!(
            used <= 1 + workers,
            "{member}: {used} connections for {} shards and {workers} workers",
            shards.len()
        );
        counts.push(used);
        running.stop().await;
        wait_until_async("connections closed", Duration::from_secs(5), || {
            let mut conn = conn.clone();
            async move { client_count(&mut conn).await == baseline }
        })
        .await;
    }
    assert_eq!(
        counts[0], counts[1],
        "owning 150x the shards must not open more connections"
    );
}

async fn fence_aborts_handlers_and_reports_nothing(target: Target) {
    let (redis, mut conn) = redis_with_groups(target, "fence", 0..2).await;
    produce(&mut conn, "fence", 0, 0, 5).await;
    let started = Arc::new(AtomicBool::new(false));
    let dropped = Arc::new(AtomicBool::new(false));
    struct Guard(Arc<AtomicBool>);
    impl Drop for Guard {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let log = Log::default();
    let (s, d, l) = (started.clone(), dropped.clone(), log.clone());
    let handler = BoxedHandler::json(move |msg: Message<Order>| {
        let (s, d, l) = (s.clone(), d.clone(), l.clone());
        async move {
            if msg.shard == 0 {
                let _guard = Guard(d);
                s.store(true, Ordering::SeqCst);
                std::future::pending::<()>().await;
            }
            l.record(&msg);
            Ok::<(), String>(())
        }
    });
    let mut cfg = config("fence", "m0");
    cfg.runtime_max_concurrency = 2;
    let running = Running::start(redis.url(), cfg, handler).await;
    running.assign([0]).await;
    wait_until_async("handler running", Duration::from_secs(10), || async {
        started.load(Ordering::SeqCst)
    })
    .await;
    running.commands.send(ShardCommand::Fence).unwrap();
    wait_until_async("handler aborted", Duration::from_secs(5), || async {
        dropped.load(Ordering::SeqCst)
    })
    .await;
    // The consumer is still alive and serves a fresh assignment (a rejoin) after the fence.
    let rejoin = FencingToken {
        member_id: Arc::from("m0"),
        member_epoch: 2,
    };
    running
        .commands
        .send(ShardCommand::Assign {
            shard: 1,
            token: rejoin.clone(),
        })
        .unwrap();
    produce(&mut conn, "fence", 1, 0, 1).await;
    wait_until_async(
        "shard 1 handled after the rejoin",
        Duration::from_secs(10),
        || async { log.count() == 1 },
    )
    .await;
    assert!(log
        .handled
        .lock()
        .unwrap()
        .keys()
        .all(|(shard, _)| *shard == 1));
    // Nothing was reported for the fenced shard: no drain, no revoke, no acked progress.
    for report in running.reports() {
        match report {
            ShardReport::Draining { shard, .. } | ShardReport::Revoked { shard } => {
                panic!("reported {shard} after a fence")
            }
            ShardReport::Progress(p) if p.shard.shard_index == 0 => {
                assert!(p.last_acked_id.is_none(), "{p:?}")
            }
            ShardReport::Progress(_) => {}
        }
    }
    assert_eq!(
        xpending_count(&mut conn, "fence:0", GROUP).await,
        5,
        "nothing acked after the fence"
    );
    assert!(!running.task.is_finished());
    running.stop().await;
}

/// Single node only: it waits for a blocked client in one node's `INFO`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_an_idle_shard_is_quick_and_it_can_come_back() {
    let (redis, mut conn) = redis_with_groups(Target::Single, "idle", 0..1).await;
    let log = Log::default();
    let mut cfg = config("idle", "m0");
    cfg.block_ms = 200;
    let running = Running::start(redis.url(), cfg, recording_handler(&log)).await;
    running.assign([0]).await;
    // Wait until the worker sits in a blocking read of the only shard.
    wait_until_async("a blocking read", Duration::from_secs(10), || {
        let mut conn = conn.clone();
        async move { blocked_clients(&mut conn).await == 1 }
    })
    .await;
    let started = Instant::now();
    running.revoke(0).await;
    wait_until_async("revoked", Duration::from_secs(5), || async {
        running.revoked(0)
    })
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "revoke took {:?}",
        started.elapsed()
    );
    // Entries produced while the shard is away are handled once it is assigned again.
    produce(&mut conn, "idle", 0, 0, 10).await;
    running.assign([0]).await;
    wait_until_async("10 handled", Duration::from_secs(10), || async {
        log.count() == 10
    })
    .await;
    running.stop().await;
}

/// An entry on an idle shard is delivered by the idle wait's group read to the shard's next job. Fault:
/// the shard is revoked while that job's handler runs. The revocation drains it like
/// any running job: REVOKED comes after the handler returned and its entry was acknowledged, never while
/// it runs (a wait's shards are idle, and an idle shard is reported REVOKED at once).
/// Single node only: it waits for a blocked client in one node's `INFO`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_revoked_while_its_idle_pickup_runs_is_revoked_after_the_handler() {
    let (redis, mut conn) = redis_with_groups(Target::Single, "handon", 0..1).await;
    let reports: Arc<std::sync::OnceLock<Arc<Mutex<Vec<ShardReport>>>>> = Arc::default();
    let (started, release) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    // Whether REVOKED was reported when the handler returned.
    let revoked_before_return = Arc::new(Mutex::new(None::<bool>));
    let handler = {
        let (reports, started, release, seen) = (
            reports.clone(),
            started.clone(),
            release.clone(),
            revoked_before_return.clone(),
        );
        BoxedHandler::json(move |_msg: Message<Order>| {
            let (reports, started, release, seen) = (
                reports.clone(),
                started.clone(),
                release.clone(),
                seen.clone(),
            );
            async move {
                started.notify_one();
                release.notified().await;
                let revoked = reports.get().is_some_and(|r| {
                    r.lock()
                        .unwrap()
                        .iter()
                        .any(|r| matches!(r, ShardReport::Revoked { shard: 0 }))
                });
                *seen.lock().unwrap() = Some(revoked);
                Ok::<(), String>(())
            }
        })
    };
    let running = Running::start(redis.url(), config("handon", "m0"), handler).await;
    reports.set(running.reports.clone()).unwrap();
    running.assign([0]).await;
    wait_for_blocked_client(&mut conn).await;
    let ids = produce(&mut conn, "handon", 0, 0, 1).await;
    tokio::time::timeout(Duration::from_secs(10), started.notified())
        .await
        .expect("the handler started");
    running.revoke(0).await;
    wait_until_async("draining reported", Duration::from_secs(10), || async {
        running
            .reports()
            .iter()
            .any(|r| matches!(r, ShardReport::Draining { shard: 0, .. }))
    })
    .await;
    assert_eq!(
        xpending_count(&mut conn, "handon:0", GROUP).await,
        1,
        "handling"
    );
    release.notify_one();
    wait_until_async("revoked", Duration::from_secs(10), || async {
        running.revoked(0)
    })
    .await;
    assert_eq!(
        *revoked_before_return.lock().unwrap(),
        Some(false),
        "REVOKED was reported while the handler of {ids:?} ran"
    );
    assert_eq!(
        xpending_count(&mut conn, "handon:0", GROUP).await,
        0,
        "acknowledged before REVOKED"
    );
    running.stop().await;
}

/// Single node only: it restarts Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_recovers_after_a_redis_restart() {
    let mut server = RedisServer::start();
    let mut conn = connect_multiplexed(&server.url()).await;
    create_groups(&mut conn, "restart", 0..2).await;
    produce(&mut conn, "restart", 0, 0, 20).await;
    let log = Log::default();
    let mut cfg = config("restart", "m0");
    cfg.runtime_max_concurrency = 2;
    let running = Running::start(&server.url(), cfg, recording_handler(&log)).await;
    running.assign(0..2).await;
    wait_until_async("20 handled", Duration::from_secs(10), || async {
        log.count() == 20
    })
    .await;
    server.restart();
    // The restarted server is empty (no persistence): recreate what the topology module would.
    let mut conn = connect_multiplexed(&server.url()).await;
    create_groups(&mut conn, "restart", 0..2).await;
    produce(&mut conn, "restart", 1, 100, 20).await;
    wait_until_async(
        "20 more handled after the restart",
        Duration::from_secs(20),
        || async { log.count() == 40 },
    )
    .await;
    wait_until_async("nothing pending", Duration::from_secs(10), || {
        let mut conn = conn.clone();
        async move { xpending_count(&mut conn, "restart:1", GROUP).await == 0 }
    })
    .await;
    assert!(!running.task.is_finished());
    running.stop().await;
}

// ---- the member's self-fencing deadline, checked at every command ----

/// The client id of the one blocked client (the idle wait), from its `CLIENT LIST` line.
fn client_id(line: &str) -> String {
    line.split(' ')
        .find_map(|field| field.strip_prefix("id="))
        .expect("a CLIENT LIST line has an id")
        .to_owned()
}

/// Whether the client `id` is still blocked.
async fn is_blocked(conn: &mut impl ConnectionLike, id: &str) -> bool {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(conn)
        .await
        .unwrap();
    list.lines().any(|l| {
        l.split(' ').any(|f| f == format!("id={id}"))
            && l.split(' ')
                .any(|f| f.starts_with("flags=") && f.contains('b'))
    })
}

/// A member blocked in its idle wait on shard 0 of `prefix` (blocking 30 s), with its lease then run out
/// as a frozen process's would (no revocation arrives): its Redis and a connection, the member, its log,
/// and the `CLIENT LIST` line of its blocked read.
async fn frozen_in_its_wait(prefix: &str) -> (TestRedis, Connection, Running, Log, String) {
    let (redis, mut conn) = redis_with_groups(Target::Single, prefix, 0..1).await;
    let deadline = OwnershipDeadline::new();
    deadline.set(deadline.local_now().plus_ms(60_000));
    let log = Log::default();
    let mut cfg = config(prefix, "m0");
    // A long block: nothing but the fence or an entry ends it within a test.
    cfg.block_ms = 30_000;
    let frozen =
        Running::start_with_deadline(redis.url(), cfg, recording_handler(&log), deadline.clone())
            .await;
    frozen.assign(0..1).await;
    let line = wait_for_blocked_client(&mut conn).await;
    assert!(line.contains("cmd=xreadgroup "), "the idle wait: {line}");
    deadline.set(deadline.local_now());
    (redis, conn, frozen, log, line)
}

/// Single node only: it reads one node's `CLIENT LIST` and `XPENDING`.
///
/// The idle wait is a group read blocked in Redis. If the process freezes while it blocks and stays frozen
/// past its lease, the shard's next owner installs its fence, which deletes the frozen member's: Redis
/// ends the blocked read with an `UNBLOCKED` error then and there (long before its timeout), so an entry
/// written afterwards goes to the next owner and the frozen member handles nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_members_blocked_wait_is_ended_by_the_next_owners_fence() {
    let (redis, mut conn, frozen, frozen_log, line) = frozen_in_its_wait("frozen-wait").await;
    let waiting = client_id(&line);
    let new_log = Log::default();
    let new = Running::start(
        redis.url(),
        config("frozen-wait", "m1"),
        recording_handler(&new_log),
    )
    .await;
    new.assign(0..1).await;
    wait_until_async(
        "the next owner's fence ended the frozen member's wait",
        Duration::from_secs(10),
        || {
            let (mut conn, waiting) = (conn.clone(), waiting.clone());
            async move { !is_blocked(&mut conn, &waiting).await }
        },
    )
    .await;
    produce(&mut conn, "frozen-wait", 0, 0, 3).await;
    wait_until_async(
        "the next owner handled them",
        Duration::from_secs(10),
        || {
            let log = new_log.clone();
            async move { log.count() == 3 }
        },
    )
    .await;
    assert_eq!(
        frozen_log.count(),
        0,
        "handled by the member past its lease"
    );
    let pending: Value = redis::cmd("XPENDING")
        .arg("frozen-wait:0")
        .arg(GROUP)
        .arg("-")
        .arg("+")
        .arg(10)
        .arg("m0")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        pending,
        Value::Array(vec![]),
        "delivered to the frozen member"
    );
    frozen.task.abort();
    new.stop().await;
}

/// Single node only: a proxy in front of it makes it look like Redis 6.2.
///
/// Redis 6.2 leaves a blocked `XREADGROUP` blocked when its stream is deleted, so a newer owner's fence
/// would not end a zombie's wait: there the idle wait is an `XREAD` that only says which shards have data,
/// and delivers nothing. The proxy rewrites `redis_version` in the server's replies, so the consumer takes
/// that path against this machine's server. Each entry written to an idle shard wakes the wait (blocking
/// 30 s, so no timeout does) and is handled once, by a job's own read; nothing stays pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_6_2_the_idle_wait_is_an_xread_that_delivers_nothing() {
    const SHARDS: u32 = 4;
    let redis = RedisServer::start();
    let mut conn = connect_multiplexed(&redis.url()).await;
    create_groups(&mut conn, "six", 0..SHARDS).await;
    let server = info(&mut conn, "server").await;
    let real = server
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .expect("redis_version")
        .trim()
        .to_owned();
    assert!(
        !server.contains("valkey_version"),
        "this test fakes a Redis"
    );
    let fake = format!("6.2.{}", "9".repeat(real.len().saturating_sub(4).max(1)));
    let proxy = stream_listener_test_support::proxy::FaultProxy::start(redis.addr()).await;
    proxy.rewrite_replies(
        &format!("redis_version:{real}"),
        &format!("redis_version:{fake}"),
    );
    let log = Log::default();
    let mut cfg = config("six", "m0");
    cfg.block_ms = 30_000;
    let running = Running::start(&proxy.url(), cfg, recording_handler(&log)).await;
    running.assign(0..SHARDS).await;
    for n in 0..12u64 {
        let line = wait_for_blocked_client(&mut conn).await;
        assert!(line.contains("cmd=xread "), "the idle wait on 6.2: {line}");
        produce(&mut conn, "six", (n % u64::from(SHARDS)) as u32, n, 1).await;
        wait_until_async(
            "the entry handled, long before the wait's timeout",
            Duration::from_secs(10),
            || async { log.count() == n as usize + 1 },
        )
        .await;
    }
    let deliveries: Vec<Vec<u32>> = log.handled.lock().unwrap().values().cloned().collect();
    assert!(
        deliveries.iter().all(|d| d == &[1]),
        "each handled once: {deliveries:?}"
    );
    for shard in 0..SHARDS {
        let key = format!("six:{shard}");
        wait_until_async("nothing pending", Duration::from_secs(10), || {
            let (mut conn, key) = (conn.clone(), key.clone());
            async move { xpending_count(&mut conn, &key, GROUP).await == 0 }
        })
        .await;
    }
    running.stop().await;
}

/// Single node only: it reads one node's `CLIENT LIST`.
///
/// An entry that reaches the idle wait while the process is frozen past its lease (before any next owner)
/// is delivered to the frozen member's pending list, but never handled by it: its jobs check the deadline
/// first. The next owner claims it (behind its fence) before it reads anything new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_a_frozen_members_wait_took_is_handled_by_the_next_owner_first() {
    let (redis, mut conn, frozen, frozen_log, _) = frozen_in_its_wait("frozen-take").await;
    let first = produce(&mut conn, "frozen-take", 0, 0, 1).await;
    wait_until_async("the wait answered", Duration::from_secs(5), || {
        let mut conn = conn.clone();
        async move { blocked_clients(&mut conn).await == 0 }
    })
    .await;
    assert_eq!(xpending_count(&mut conn, "frozen-take:0", GROUP).await, 1);
    let ordered = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = ordered.clone();
    let handler = BoxedHandler::json(move |msg: Message<Order>| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push(msg.id.clone());
            Ok::<(), HandlerError>(())
        }
    });
    let later = produce(&mut conn, "frozen-take", 0, 1, 2).await;
    let new = Running::start(redis.url(), config("frozen-take", "m1"), handler).await;
    new.assign(0..1).await;
    wait_until_async(
        "the next owner handled all",
        Duration::from_secs(10),
        || {
            let ordered = ordered.clone();
            async move { ordered.lock().unwrap().len() == 3 }
        },
    )
    .await;
    let expected: Vec<String> = first.into_iter().chain(later).collect();
    assert_eq!(*ordered.lock().unwrap(), expected, "the taken entry first");
    assert_eq!(
        frozen_log.count(),
        0,
        "handled by the member past its lease"
    );
    wait_until_async("nothing pending", Duration::from_secs(10), || {
        let mut conn = conn.clone();
        async move { xpending_count(&mut conn, "frozen-take:0", GROUP).await == 0 }
    })
    .await;
    frozen.task.abort();
    new.stop().await;
}

/// Single node only: it counts one node's `INFO commandstats`.
///
/// An entry another consumer took as it was written (a zombie's late read) is not the member's: its idle
/// wait, a group read, is not served by it and does not spin (an `XREAD` wait watching from below the
/// entry would wake again at once, forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_up_for_an_entry_another_consumer_took_does_not_spin() {
    let (redis, mut conn) = redis_with_groups(Target::Single, "taken", 0..1).await;
    let log = Log::default();
    let running = Running::start(redis.url(), config("taken", "m0"), recording_handler(&log)).await;
    running.assign(0..1).await;
    wait_for_blocked_client(&mut conn).await;
    // Written and delivered to a zombie in one step, so the member can never read it itself.
    let _: Value = redis::pipe()
        .atomic()
        .cmd("XADD")
        .arg("taken:0")
        .arg("*")
        .arg("k")
        .arg("key-0")
        .arg("p")
        .arg(r#"{"n":0}"#)
        .cmd("XREADGROUP")
        .arg("GROUP")
        .arg(GROUP)
        .arg("zombie")
        .arg("STREAMS")
        .arg("taken:0")
        .arg(">")
        .query_async(&mut conn)
        .await
        .unwrap();
    wait_for_blocked_client(&mut conn).await;
    let before = read_calls(&mut conn).await;
    // An observation window, not a synchronisation: a spinning wait would send thousands of reads.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let reads = read_calls(&mut conn).await - before;
    assert!(reads <= 5, "{reads} reads in 1 s after the wake-up");
    assert_eq!(
        log.count(),
        0,
        "the zombie's entry is not ours to handle yet"
    );
    running.stop().await;
}

async fn wait_for_blocked_client(conn: &mut (impl ConnectionLike + Clone + Send)) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(line) = blocked_client_line(conn).await {
            return line;
        }
        assert!(Instant::now() < deadline, "no blocked idle wait");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Calls of the commands that touch a shard, from `INFO commandstats`.
async fn shard_commands(conn: &mut impl ConnectionLike) -> u64 {
    let touching = [
        "xreadgroup",
        "xread",
        "xack",
        "xautoclaim",
        "xclaim",
        "xackdel",
        "evalsha",
        "xadd",
    ];
    command_calls(conn)
        .await
        .iter()
        .filter(|(name, _)| touching.contains(&name.as_str()))
        .map(|(_, calls)| calls)
        .sum()
}

/// Single node only: it counts commands in one node's `INFO commandstats`.
///
/// A frozen process resumes past its lease before its heartbeat task could deliver a fence: the consumer
/// itself must see the deadline has passed and send nothing for the shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_past_its_deadline_touches_nothing_without_being_told() {
    let (redis, mut conn) = redis_with_groups(Target::Single, "frozen", 0..2).await;
    // The last accepted heartbeat gave two seconds; no later one gets through.
    let deadline = OwnershipDeadline::new();
    deadline.set(deadline.local_now().plus_ms(2_000));
    let log = Log::default();
    let running = Running::start_with_deadline(
        redis.url(),
        config("frozen", "m0"),
        recording_handler(&log),
        deadline.clone(),
    )
    .await;
    running.assign(0..2).await;
    produce(&mut conn, "frozen", 0, 0, 5).await;
    wait_until_async("first entries handled", Duration::from_secs(2), || async {
        log.count() == 5
    })
    .await;
    // The lease runs out and no Fence command arrives (the heartbeat task is frozen, or has not run yet).
    // A read sent before then never blocks past the deadline, so once it has passed nothing is in flight.
    wait_until_async("the deadline passed", Duration::from_secs(5), || async {
        !deadline.is_valid()
    })
    .await;
    let before = shard_commands(&mut conn).await;
    produce(&mut conn, "frozen", 0, 5, 5).await;
    produce(&mut conn, "frozen", 1, 10, 5).await;
    let produced = shard_commands(&mut conn).await;
    assert_eq!(produced, before + 10, "only our ten XADDs ran");
    // Several scheduling rounds (block_ms is 50 ms): nothing may reach Redis for the shards.
    let window = Instant::now() + Duration::from_millis(500);
    while Instant::now() < window {
        assert_eq!(
            shard_commands(&mut conn).await,
            produced,
            "a command touched a shard past the deadline"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(log.count(), 5, "no handler started past the deadline");
    assert_eq!(
        xpending_count(&mut conn, "frozen:0", GROUP).await,
        0,
        "nothing was read"
    );
    // A renewed lease (the heartbeat got through) resumes consumption.
    deadline.set(deadline.local_now().plus_ms(60_000));
    wait_until_async("the rest handled", Duration::from_secs(10), || async {
        log.count() == 15
    })
    .await;
    running.stop().await;
}

/// Redis ends a `BLOCK` only when its event loop next looks (up to `1000 / hz` ms late), and an entry
/// written meanwhile is delivered to the still-blocked read. So an idle wait must be over before the
/// deadline: its block ends early enough in Redis, and the member ends it itself (`CLIENT UNBLOCK`) when
/// it would not. An entry written the instant the deadline passes then reaches no one, and nothing
/// touches the shard.
///
/// `CLIENT UNBLOCK` never reaches Redis here (the proxy holds it): the block alone must end in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_wait_blocks_in_redis_no_later_than_the_deadline() {
    let redis = RedisServer::start();
    let proxy = stream_listener_test_support::proxy::FaultProxy::start(redis.addr()).await;
    proxy.hold_connection_from("UNBLOCK");
    an_idle_wait_reads_nothing_written_right_after_the_deadline(&redis, &proxy).await;
}

/// The same with a Redis that looks at timeouts once a second (`hz 1`), over a link of 20 ms each way: the
/// member ends its wait itself, early enough for `CLIENT UNBLOCK` to arrive before the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_wait_is_ended_before_the_deadline_when_redis_would_end_it_late() {
    let redis = RedisServer::try_start_with_args(vec!["--hz".into(), "1".into()], None).unwrap();
    let proxy = stream_listener_test_support::proxy::FaultProxy::start(redis.addr()).await;
    proxy.set_latency(Duration::from_millis(20));
    an_idle_wait_reads_nothing_written_right_after_the_deadline(&redis, &proxy).await;
}

/// Single node only (one node's `INFO commandstats`). The member reaches Redis through `proxy`; the test
/// directly.
async fn an_idle_wait_reads_nothing_written_right_after_the_deadline(
    redis: &RedisServer,
    proxy: &stream_listener_test_support::proxy::FaultProxy,
) {
    let url = proxy.url();
    let mut conn = connect_multiplexed(&redis.url()).await;
    create_groups(&mut conn, "edge", 0..1).await;
    let deadline = OwnershipDeadline::new();
    deadline.set(deadline.local_now().plus_ms(1_500));
    let log = Log::default();
    // A wait blocks until the deadline (not for a shorter `block_ms`).
    let mut cfg = config("edge", "m0");
    cfg.block_ms = 5_000;
    let running =
        Running::start_with_deadline(&url, cfg, recording_handler(&log), deadline.clone()).await;
    running.assign([0]).await;
    produce(&mut conn, "edge", 0, 0, 1).await;
    wait_until_async(
        "the first entry handled",
        Duration::from_secs(1),
        || async { log.count() == 1 },
    )
    .await;
    // Idle from here: the member waits until the deadline comes. The entry is written the moment the
    // deadline has passed, before the member's own timer could react to it.
    let spin = Instant::now() + Duration::from_secs(5);
    while deadline.is_valid() {
        assert!(Instant::now() < spin, "the deadline never passed");
        tokio::task::yield_now().await;
    }
    // Any other command would wake Redis, which would then notice a timed-out block by itself.
    produce(&mut conn, "edge", 0, 1, 1).await;
    let after = shard_commands(&mut conn).await;
    // Longer than Redis may take to notice a timeout (up to a second at `hz 1`).
    let window = Instant::now() + Duration::from_millis(1_200);
    while Instant::now() < window {
        assert_eq!(
            xpending_count(&mut conn, "edge:0", GROUP).await,
            0,
            "the entry written after the deadline was read"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        shard_commands(&mut conn).await,
        after,
        "nothing touched the shard"
    );
    assert_eq!(log.count(), 1, "no handler started past the deadline");
    // A renewed lease: the entry is handled (what the proxy held reaches Redis first).
    proxy.release();
    deadline.set(deadline.local_now().plus_ms(60_000));
    wait_until_async("the entry handled", Duration::from_secs(10), || async {
        log.count() == 2
    })
    .await;
    running.stop().await;
}

/// Entries another consumer read after it lost the shard (a zombie) stay in its pending list; the owner
/// must claim them periodically, not only when it takes the shard over.
async fn entries_a_zombie_left_pending_are_reclaimed_by_the_owner(target: Target) {
    let (redis, mut conn) = redis_with_groups(target, "zombie", 0..1).await;
    let log = Log::default();
    // The owner's handler holds entry 2 until told, so the owner reads nothing meanwhile.
    let gate = Arc::new(AtomicBool::new(true));
    let entered = Arc::new(AtomicBool::new(false));
    let handler = {
        let (log, gate, entered) = (log.clone(), gate.clone(), entered.clone());
        BoxedHandler::json(move |msg: Message<Order>| {
            let (log, gate, entered) = (log.clone(), gate.clone(), entered.clone());
            async move {
                if msg.payload.n == 2 {
                    entered.store(true, Ordering::Release);
                    let until = Instant::now() + Duration::from_secs(10);
                    while gate.load(Ordering::Acquire) && Instant::now() < until {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
                log.record(&msg);
                Ok::<(), HandlerError>(())
            }
        })
    };
    let mut cfg = config("zombie", "owner");
    cfg.reclaim_idle = Duration::from_millis(300);
    // Batches of 3: what the idle wait delivers (entries 0-2) is a full batch, so the owner's job goes on
    // reading after it and its shard rides no wait while the handler holds entry 2. (A short delivery's
    // shard would: the owner's next wait could read the zombie's entries before the zombie does.)
    cfg.batch_size = 3;
    let running = Running::start(redis.url(), cfg, handler).await;
    running.assign([0]).await;
    produce(&mut conn, "zombie", 0, 0, 3).await;
    wait_until_async(
        "owner busy with entry 2",
        Duration::from_secs(10),
        || async { entered.load(Ordering::Acquire) },
    )
    .await;
    // A zombie (an earlier owner that resumed) reads three new entries and never acks them.
    let ids = produce(&mut conn, "zombie", 0, 3, 3).await;
    let read: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(GROUP)
        .arg("zombie-member")
        .arg("COUNT")
        .arg(10)
        .arg("STREAMS")
        .arg("zombie:0")
        .arg(">")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_ne!(read, Value::Nil, "the zombie read them");
    gate.store(false, Ordering::Release);
    wait_until_async(
        "the zombie's entries handled by the owner",
        Duration::from_secs(10),
        || async { log.count() == 6 },
    )
    .await;
    for id in &ids {
        assert!(log.ids().contains(&(0, id.clone())));
    }
    wait_until_async("nothing pending", Duration::from_secs(5), || {
        let mut conn = conn.clone();
        async move { xpending_count(&mut conn, "zombie:0", GROUP).await == 0 }
    })
    .await;
    running.stop().await;
}

/// Single node only: it flushes Redis (`FLUSHALL`).
///
/// Redis restarted empty (or was flushed) while the member kept its ownership: the consumer waits until
/// a heartbeat confirms the ownership, then creates the consumer group again and consumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_consumer_group_is_recreated_once_ownership_is_confirmed() {
    let (redis, mut conn) = redis_with_groups(Target::Single, "flushed", 0..1).await;
    let deadline = OwnershipDeadline::new();
    deadline.set(deadline.local_now().plus_ms(60_000));
    // What was handled, by payload: the new stream's ids may repeat the flushed one's (same millisecond).
    let seen = Seen::default();
    let handled = |range: std::ops::Range<u64>| {
        let seen = seen.lock().unwrap();
        range.into_iter().all(|n| seen.iter().any(|(m, _)| *m == n))
    };
    let running = Running::start_with_deadline(
        redis.url(),
        config("flushed", "m0"),
        order_recording_handler(&seen),
        deadline.clone(),
    )
    .await;
    running.assign([0]).await;
    produce(&mut conn, "flushed", 0, 0, 3).await;
    stream_listener_test_support::aio::wait_until(
        "first entries handled",
        Duration::from_secs(10),
        || handled(0..3),
    )
    .await;
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    produce(&mut conn, "flushed", 0, 3, 4).await; // the stream comes back, its group does not
    let groups = |conn: &mut Connection| {
        let mut conn = conn.clone();
        async move {
            let groups: Vec<HashMap<String, Value>> = redis::cmd("XINFO")
                .arg("GROUPS")
                .arg("flushed:0")
                .query_async(&mut conn)
                .await
                .unwrap();
            groups.len()
        }
    };
    // Not recreated before a heartbeat confirmed ownership: a zombie must not resurrect the group.
    let window = Instant::now() + Duration::from_millis(400);
    while Instant::now() < window {
        assert_eq!(
            groups(&mut conn).await,
            0,
            "recreated without a confirmation"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Heartbeats keep being accepted from now on, as they would be.
    wait_until_async(
        "entries after the flush handled",
        Duration::from_secs(10),
        || {
            deadline.confirm();
            std::future::ready(handled(3..7))
        },
    )
    .await;
    assert_eq!(groups(&mut conn).await, 1);
    running.stop().await;
}

on_every_target!(
    every_entry_is_handled_and_acked,
    entries_are_handled_in_order_within_a_shard,
    busy_shards_are_rotated_not_drained_one_by_one,
    manual_ack_acks_only_what_the_handler_acked,
    failing_entry_is_retried_then_dead_lettered_with_its_fields,
    exhausted_entry_can_be_left_pending,
    undecodable_payload_is_dead_lettered_at_once,
    handler_panic_is_a_failure_not_a_crash,
    revoked_shard_moves_to_another_consumer_without_overlap_or_loss,
    killed_consumer_in_flight_entries_are_claimed_by_the_successor,
    long_pending_list_is_claimed_to_its_end_before_new_entries,
    idle_consumer_names_are_deleted_on_takeover,
    fence_aborts_handlers_and_reports_nothing,
    entries_a_zombie_left_pending_are_reclaimed_by_the_owner,
);

/// Every fence key on the server (`KEYS`: test servers only).
async fn fence_keys(conn: &mut impl ConnectionLike) -> Vec<String> {
    redis::cmd("KEYS")
        .arg("sl:fence:*")
        .query_async(conn)
        .await
        .unwrap()
}

/// `INFO errorstats`: how many errors of `code` (`NOGROUP`, `READONLY`, ...) the server has replied so far.
async fn errors(conn: &mut impl ConnectionLike, code: &str) -> u64 {
    let stats = info(conn, "errorstats").await;
    let prefix = format!("errorstat_{code}:count=");
    stats
        .lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// Single node only: the fault is injected by a proxy in front of one server.
///
/// A read that passed the member's deadline check but reached Redis late (the process froze with it on
/// its way; here a proxy holds it) must not take entries once a newer owner took the shard: the read names
/// the old ownership's fence, which the new owner deleted, so Redis refuses it and delivers nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_reaches_redis_after_a_takeover_is_refused() {
    let redis = RedisServer::start();
    let mut conn = connect_multiplexed(&redis.url()).await;
    create_groups(&mut conn, "late", 0..1).await;
    let proxy = stream_listener_test_support::proxy::FaultProxy::start(redis.addr()).await;
    let (old_log, new_log) = (Log::default(), Log::default());
    let old = Running::start(
        &proxy.url(),
        config("late", "old"),
        recording_handler(&old_log),
    )
    .await;
    old.assign([0]).await;
    produce(&mut conn, "late", 0, 0, 1).await;
    wait_until_async(
        "the old owner handled the first entry",
        Duration::from_secs(10),
        || async { old_log.count() == 1 },
    )
    .await;
    // The old owner's token, in the owner record since its fence install (before its first read).
    let owner_record = stream_listener::names::shard_owner("late:0", GROUP);
    let reader = conn.clone();
    let owner = || {
        let (mut conn, key) = (reader.clone(), owner_record.clone());
        async move {
            let token: Option<String> = redis::cmd("GET")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap();
            token
        }
    };
    let old_token = owner().await.expect("the old owner installed its fence");
    // The old owner acknowledged it and idles in its wait (blocked in Redis); from now on what it sends
    // stays in the proxy.
    wait_until_async(
        "the first entry acknowledged",
        Duration::from_secs(10),
        || {
            let mut conn = conn.clone();
            async move { xpending_count(&mut conn, "late:0", GROUP).await == 0 }
        },
    )
    .await;
    wait_for_blocked_client(&mut conn).await;
    proxy.hold();
    // A newer grant: the new owner installs its fence (deleting the old one), then is paused, so the next
    // entry stays undelivered for the old owner's late read to find.
    let new = Running::start(
        redis.url().as_str(),
        config("late", "new"),
        recording_handler(&new_log),
    )
    .await;
    new.assign([0]).await;
    // The install is one script: the owner record holding another token means the old fence is gone.
    // (Only a newer token: the old one was there from the start, and an entry produced before the new
    // owner's install is the old owner's to take, legitimately.)
    wait_until_async(
        "the new owner installed its fence",
        Duration::from_secs(10),
        || async { owner().await.is_some_and(|token| token != old_token) },
    )
    .await;
    let old_fence =
        stream_listener::names::shard_fence("late:0", GROUP, old_token.parse().unwrap());
    let fences = fence_keys(&mut conn).await;
    assert_eq!(fences.len(), 1, "one fence, the new owner's: {fences:?}");
    assert_ne!(fences[0], old_fence, "the old fence was deleted");
    new.pause.pause();
    let errors_before = errors(&mut conn, "NOGROUP").await;
    produce(&mut conn, "late", 0, 1, 1).await;
    // The old owner's wait has ended (replies still flow: on Redis 7 the install's `DEL` of its fence ended
    // it, on older servers the new entry does), its job reads: that read is held.
    wait_until_async(
        "the old owner's read is on its way",
        Duration::from_secs(10),
        || async { proxy.held().contains("XREADGROUP") },
    )
    .await;
    proxy.release();
    wait_until_async(
        "Redis refused the late read",
        Duration::from_secs(10),
        || {
            let mut conn = conn.clone();
            async move { errors(&mut conn, "NOGROUP").await > errors_before }
        },
    )
    .await;
    // The old owner's consumer holds nothing. (The new owner may hold the entry: its idle wait can take
    // it before the pause's interrupt reaches Redis, and it was granted the shard.)
    type Summary = (u64, Option<String>, Option<String>, Vec<(String, String)>);
    let (_, _, _, holders): Summary = redis::cmd("XPENDING")
        .arg("late:0")
        .arg(GROUP)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        holders.iter().all(|(consumer, _)| consumer != "old"),
        "the late read took the entry from the new owner: {holders:?}"
    );
    new.pause.resume();
    wait_until_async(
        "the new owner handled the second entry",
        Duration::from_secs(10),
        || async { new_log.count() == 1 },
    )
    .await;
    assert_eq!(
        old_log.count(),
        1,
        "the old owner handled an entry after the takeover"
    );
    assert_eq!(xpending_count(&mut conn, "late:0", GROUP).await, 0);
    new.stop().await;
    old.task.abort();
}

/// Single node only: the fault is injected by a proxy in front of one server.
///
/// An owner whose first commands (the fence install, then the takeover claim) reach Redis only after a
/// newer owner took the shard changes nothing: its install finds the newer token and is refused, so it
/// neither deletes the newer owner's fence nor claims or reads anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_install_that_reaches_redis_after_a_newer_one_changes_nothing() {
    let redis = RedisServer::start();
    let mut conn = connect_multiplexed(&redis.url()).await;
    create_groups(&mut conn, "late-install", 0..1).await;
    produce(&mut conn, "late-install", 0, 0, 1).await;
    let proxy = stream_listener_test_support::proxy::FaultProxy::start(redis.addr()).await;
    let (old_log, new_log) = (Log::default(), Log::default());
    let old = Running::start(
        &proxy.url(),
        config("late-install", "old"),
        recording_handler(&old_log),
    )
    .await;
    // The install reads the owner record, then runs its script: the script is what arrives late, with
    // what the read saw (no owner yet).
    proxy.hold_from("EVALSHA");
    old.assign([0]).await;
    wait_until_async(
        "the old grant's install is on its way",
        Duration::from_secs(10),
        || async { proxy.held().contains("EVALSHA") },
    )
    .await;
    let new = Running::start(
        redis.url().as_str(),
        config("late-install", "new"),
        recording_handler(&new_log),
    )
    .await;
    new.assign([0]).await;
    wait_until_async(
        "the new owner handled the entry",
        Duration::from_secs(10),
        || async { new_log.count() == 1 },
    )
    .await;
    let probe = conn.clone();
    let owner = || {
        let mut conn = probe.clone();
        async move {
            let token: Option<String> = redis::cmd("GET")
                .arg(stream_listener::names::shard_owner("late-install:0", GROUP))
                .query_async(&mut conn)
                .await
                .unwrap();
            token
        }
    };
    let newer = owner().await.expect("the new owner's token");
    // The new owner idles in its wait and sends no script; from here on, scripts are the old owner's.
    wait_for_blocked_client(&mut conn).await;
    let evalsha = || {
        let mut conn = probe.clone();
        async move {
            command_calls(&mut conn)
                .await
                .get("evalsha")
                .copied()
                .unwrap_or(0)
        }
    };
    let before = evalsha().await;
    proxy.release();
    // The late install, then (refused, so the old owner backs off and tries again) a second one.
    wait_until_async(
        "the late install reached Redis, and its retry",
        Duration::from_secs(10),
        || async { evalsha().await >= before + 2 },
    )
    .await;
    produce(&mut conn, "late-install", 0, 1, 3).await;
    wait_until_async(
        "the new owner handled the later entries",
        Duration::from_secs(10),
        || async { new_log.count() == 4 },
    )
    .await;
    assert_eq!(
        owner().await,
        Some(newer),
        "the late install replaced the newer token"
    );
    assert_eq!(old_log.count(), 0, "the superseded owner handled entries");
    assert_eq!(xpending_count(&mut conn, "late-install:0", GROUP).await, 0);
    new.stop().await;
    old.task.abort();
}

/// Single node only (`INFO commandstats` of one server).
///
/// Entries that come one at a time, each to another shard, cost a few commands each whatever the shard
/// count: a shard whose read came back short is idle and watched by the one wait, not polled. (Before,
/// every wake-up was followed by a read of every other shard: 16 shards cost 15 to 25 commands per entry.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sparse_entries_cost_a_few_commands_each_whatever_the_shard_count() {
    let mut per_entry = Vec::new();
    for shards in [4u32, 16] {
        let prefix = format!("sparse-{shards}");
        let (redis, mut conn) = redis_with_groups(Target::Single, &prefix, 0..shards).await;
        let log = Log::default();
        let mut config = config(&prefix, "m");
        config.runtime_max_concurrency = 4;
        let running = Running::start(redis.url(), config, recording_handler(&log)).await;
        running.assign(0..shards).await;
        wait_for_blocked_client(&mut conn).await;
        let counted = |calls: &std::collections::BTreeMap<String, u64>| -> u64 {
            calls
                .iter()
                .filter(|(name, _)| !["xadd", "info", "client|list"].contains(&name.as_str()))
                .map(|(_, n)| n)
                .sum()
        };
        let before = counted(&command_calls(&mut conn).await);
        const ENTRIES: u64 = 24;
        for n in 0..ENTRIES {
            produce(&mut conn, &prefix, (n as u32 * 5) % shards, n, 1).await;
            wait_until_async("the entry was handled", Duration::from_secs(10), || async {
                log.count() as u64 == n + 1
            })
            .await;
            // The next entry comes once the member is back in its wait.
            wait_for_blocked_client(&mut conn).await;
        }
        let after = counted(&command_calls(&mut conn).await);
        per_entry.push((shards, (after - before) as f64 / ENTRIES as f64));
        running.stop().await;
    }
    for (shards, cost) in &per_entry {
        assert!(
            *cost <= 6.0,
            "{cost:.1} commands per entry with {shards} shards: {per_entry:?}"
        );
    }
}

/// Single node only: it turns one node into a replica for a while.
///
/// An entry whose handler failed waits in memory for its retry. The faults: the retry's job must install the
/// shard's fence first (the shard was granted again, and the fence's key is lost) and Redis refuses the
/// write with an error reply (`READONLY`: the node was made a replica, as in a failover; its data stays).
/// The job hands the entry back, and once Redis takes writes again the entry is handled before the newer
/// entry of its shard, and nothing stays pending (dropping it left it pending for us, unhandled, while the
/// next job read past it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_waiting_for_its_retry_outlives_a_refused_fence_install_in_order() {
    let prefix = "refused";
    let (redis, mut conn) = redis_with_groups(Target::Single, prefix, 0..1).await;
    let seen: Seen = Seen::default();
    let attempts = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (seen, attempts) = (seen.clone(), attempts.clone());
        BoxedHandler::json(move |msg: Message<Order>| {
            let (seen, attempts) = (seen.clone(), attempts.clone());
            async move {
                if msg.payload.n == 0 && attempts.fetch_add(1, Ordering::SeqCst) == 0 {
                    return Err("the first attempt fails".to_owned());
                }
                seen.lock()
                    .unwrap()
                    .push((msg.payload.n, msg.delivery_count));
                Ok(())
            }
        })
    };
    let mut config = config(prefix, "m");
    // Time to write the next entry, fill the memory and grant the shard again before the retry.
    config.failure_policy.initial_backoff = Duration::from_secs(1);
    config.failure_policy.max_backoff = Duration::from_secs(1);
    let running = Running::start(redis.url(), config, handler).await;
    running.assign(0..1).await;
    produce(&mut conn, prefix, 0, 0, 1).await;
    wait_until_async(
        "the first attempt failed",
        Duration::from_secs(10),
        || async { attempts.load(Ordering::SeqCst) == 1 },
    )
    .await;
    produce(&mut conn, prefix, 0, 1, 1).await;
    let refused = errors(&mut conn, "READONLY").await;
    let fences = fence_keys(&mut conn).await;
    assert_eq!(fences.len(), 1, "{fences:?}");
    let _: () = redis::cmd("DEL")
        .arg(&fences)
        .query_async(&mut conn)
        .await
        .unwrap();
    // A replica of a master that is not there: it keeps its data and refuses writes.
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    // A newer grant: the next job installs its fence first.
    running.assign(0..1).await;
    wait_until_async(
        "the retry's fence install refused",
        Duration::from_secs(10),
        || async { errors(&mut conn.clone(), "READONLY").await > refused },
    )
    .await;
    let handled = seen.lock().unwrap().clone();
    assert!(handled.is_empty(), "handled while refused: {handled:?}");
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut conn)
        .await
        .unwrap();
    wait_until_async("both entries handled", Duration::from_secs(10), || async {
        seen.lock().unwrap().len() == 2
    })
    .await;
    assert_eq!(
        *seen.lock().unwrap(),
        vec![(0, 2), (1, 1)],
        "the retried entry first, then the newer one"
    );
    let key = format!("{prefix}:0");
    wait_until_async("nothing pending", Duration::from_secs(10), || async {
        pending_count(redis.url(), &key).await == 0
    })
    .await;
    running.stop().await;
}

/// How many entries of `key` the group holds pending.
async fn pending_count(url: &str, key: &str) -> u64 {
    let mut conn = stream_listener_tests::connection(url).await;
    let summary: (u64, Value, Value, Value) = redis::cmd("XPENDING")
        .arg(key)
        .arg(GROUP)
        .query_async(&mut conn)
        .await
        .unwrap();
    summary.0
}

/// Single node only: it counts one node's commands.
///
/// An idle pickup short of a batch is handled by a job that reads nothing more, so the next wait covers
/// its shard at once, beside that job (the shard rides it). Entries written to the shard while the
/// pickup's handler runs are delivered by that wait and handled after it: in order, once each, one
/// handler at a time, and no wait is interrupted for the shard (the wait holding back for the job, then
/// started without its shard and interrupted once the job came back idle, was the way before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_written_while_a_pickups_handler_runs_are_handled_after_it_in_order() {
    let prefix = "ride";
    let (redis, mut conn) = redis_with_groups(Target::Single, prefix, 0..2).await;
    let seen: Seen = Seen::default();
    let (in_flight, overlaps) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    // The first entry's handler runs until the test lets it end.
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let handler = {
        let (seen, in_flight, overlaps, release) = (
            seen.clone(),
            in_flight.clone(),
            overlaps.clone(),
            release.clone(),
        );
        BoxedHandler::json(move |msg: Message<Order>| {
            let (seen, in_flight, overlaps, release) = (
                seen.clone(),
                in_flight.clone(),
                overlaps.clone(),
                release.clone(),
            );
            async move {
                if in_flight.fetch_add(1, Ordering::SeqCst) > 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                if msg.payload.n == 0 {
                    let permit = tokio::time::timeout(Duration::from_secs(20), release.acquire())
                        .await
                        .expect("released");
                    drop(permit);
                }
                seen.lock()
                    .unwrap()
                    .push((msg.payload.n, msg.delivery_count));
                in_flight.fetch_sub(1, Ordering::SeqCst);
                Ok::<(), HandlerError>(())
            }
        })
    };
    let mut config = config(prefix, "m");
    config.runtime_max_concurrency = 4;
    config.batch_size = 100;
    let running = Running::start(redis.url(), config, handler).await;
    running.assign(0..2).await;
    wait_for_blocked_client(&mut conn).await;
    let unblocks = calls_of(&mut conn, "client|unblock").await;
    let key = format!("{prefix}:0");
    let pending = || pending_count(redis.url(), &key);
    produce(&mut conn, prefix, 0, 0, 1).await;
    wait_until_async(
        "the pickup's handler runs",
        Duration::from_secs(10),
        || async { in_flight.load(Ordering::SeqCst) == 1 },
    )
    .await;
    for n in 1..6 {
        produce(&mut conn, prefix, 0, n, 1).await;
    }
    // Delivered by the wait the shard rides while the first handler still runs.
    wait_until_async("all six delivered", Duration::from_secs(10), || async {
        pending().await == 6
    })
    .await;
    assert!(
        seen.lock().unwrap().is_empty(),
        "the first handler still runs"
    );
    release.add_permits(1);
    wait_until_async("six entries handled", Duration::from_secs(10), || async {
        seen.lock().unwrap().len() == 6
    })
    .await;
    assert_eq!(
        *seen.lock().unwrap(),
        (0..6).map(|n| (n, 1)).collect::<Vec<_>>(),
        "in order, each delivered once"
    );
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "two handlers of one shard"
    );
    assert_eq!(
        calls_of(&mut conn, "client|unblock").await,
        unblocks,
        "a wait was interrupted for the riding shard"
    );
    wait_until_async("nothing pending", Duration::from_secs(10), || async {
        pending().await == 0
    })
    .await;
    running.stop().await;
}

/// The non-blocking group reads over several shards (the idle wait's follow-up: a job reads one shard)
/// in a `MONITOR` feed.
fn follow_up_reads(monitor: &Monitor) -> usize {
    monitor
        .lines()
        .iter()
        .filter_map(|line| MonitorLine::parse(line))
        .filter(|line| {
            line.client != "lua"
                && line
                    .args
                    .first()
                    .is_some_and(|c| c.eq_ignore_ascii_case("XREADGROUP"))
                && !line.args.iter().any(|a| a.eq_ignore_ascii_case("BLOCK"))
                && line.args.iter().filter(|a| *a == ">").count() > 2
        })
        .count()
}

/// Single node only: the wait's commands are read from one server's `MONITOR` feed.
///
/// Redis serves a blocked read as soon as the first entry of a producer's pipelined burst is written, so
/// the wait alone would deliver that one, and the entries written to the other shards would wait for the
/// next wait. After a wait that delivered to two shards or more, the next one pipelines a second read
/// without `BLOCK` behind its blocking one, which Redis runs right after it: the burst's other entries
/// come with its reply. Pickups of one shard at a time send no such read (it would be an empty read a
/// pickup). Every entry is handled once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_burst_over_several_shards_the_wait_reads_again_behind_its_block() {
    let prefix = "burst";
    let redis = RedisServer::start();
    let mut conn = connect_multiplexed(&redis.url()).await;
    create_groups(&mut conn, prefix, 0..8).await;
    let seen: Seen = Seen::default();
    let mut config = config(prefix, "m");
    config.runtime_max_concurrency = 4;
    config.batch_size = 100;
    let running = Running::start(&redis.url(), config, order_recording_handler(&seen)).await;
    running.assign(0..8).await;
    wait_for_blocked_client(&mut conn).await;
    let monitor = Monitor::start(redis.addr()).await;
    let handled = |n: usize| {
        let seen = seen.clone();
        move || {
            let seen = seen.clone();
            async move { seen.lock().unwrap().len() == n }
        }
    };
    // One shard at a time.
    for shard in 0..3 {
        produce(&mut conn, prefix, shard, u64::from(shard) * 100, 1).await;
        wait_until_async(
            "a pickup handled",
            Duration::from_secs(10),
            handled(shard as usize + 1),
        )
        .await;
        wait_for_blocked_client(&mut conn).await;
    }
    assert_eq!(
        follow_up_reads(&monitor),
        0,
        "no follow-up read for single pickups"
    );
    // Two bursts, one entry to each shard in one pipeline each.
    for (round, n) in [(1u64, 11), (2, 19)] {
        let mut pipe = redis::pipe();
        for shard in 0..8u64 {
            pipe.cmd("XADD")
                .arg(format!("{prefix}:{shard}"))
                .arg("*")
                .arg("k")
                .arg(format!("key-{shard}"))
                .arg("p")
                .arg(format!("{{\"n\":{}}}", shard * 100 + round));
        }
        let _: Vec<String> = pipe.query_async(&mut conn).await.unwrap();
        wait_until_async("the burst handled", Duration::from_secs(10), handled(n)).await;
        wait_for_blocked_client(&mut conn).await;
    }
    assert!(
        follow_up_reads(&monitor) >= 1,
        "the wait after a burst over several shards reads again behind its block"
    );
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter().all(|&(_, deliveries)| deliveries == 1),
        "{seen:?}"
    );
    for shard in 0..8u64 {
        let mine: Vec<u64> = seen
            .iter()
            .map(|&(n, _)| n)
            .filter(|n| n / 100 == shard)
            .collect();
        let mut sorted = mine.clone();
        sorted.sort_unstable();
        assert_eq!(mine, sorted, "shard {shard} in order");
        sorted.dedup();
        assert_eq!(mine.len(), sorted.len(), "shard {shard} handled once each");
    }
    assert_eq!(seen.len(), 19);
    wait_until_async("nothing pending", Duration::from_secs(10), || async {
        let mut pending = 0;
        for shard in 0..8 {
            pending += pending_count(&redis.url(), &format!("{prefix}:{shard}")).await;
        }
        pending == 0
    })
    .await;
    running.stop().await;
}

/// Single node only: the fault is injected by a proxy in front of one server.
///
/// The scheduler interrupts the idle wait with `CLIENT UNBLOCK`. One that reaches Redis before the wait's
/// blocking read (still on the wire: here held by the proxy on that one connection) unblocks nothing and answers
/// 0; the wait sends it again until its read has ended, so a revocation is not held up for the wait's
/// whole timeout (60 s here, three times the test's deadline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_that_reaches_redis_before_the_waits_read_still_ends_it() {
    let redis = RedisServer::start();
    let mut conn = connect_multiplexed(&redis.url()).await;
    create_groups(&mut conn, "unblock-race", 0..2).await;
    let proxy = stream_listener_test_support::proxy::FaultProxy::start(redis.addr()).await;
    let log = Log::default();
    let mut config = config("unblock-race", "m");
    config.block_ms = 60_000;
    let running = Running::start(&proxy.url(), config, recording_handler(&log)).await;
    // The wait's blocking read is held on its way; the member's other connection goes on.
    proxy.hold_connection_from("$5\r\nBLOCK\r\n");
    running.assign([0, 1]).await;
    wait_until_async(
        "the wait's read is on its way",
        Duration::from_secs(10),
        || async { proxy.held().contains("BLOCK\r\n") },
    )
    .await;
    running.revoke(1).await;
    wait_until_async(
        "the interrupt reached Redis before the read",
        Duration::from_secs(10),
        || {
            let mut conn = conn.clone();
            async move { calls_of(&mut conn, "client|unblock").await >= 1 }
        },
    )
    .await;
    assert_eq!(blocked_clients(&mut conn).await, 0, "nothing blocks yet");
    proxy.release();
    wait_until_async(
        "the revocation completed once the read was ended",
        Duration::from_secs(20),
        || async { running.revoked(1) },
    )
    .await;
    produce(&mut conn, "unblock-race", 0, 0, 1).await;
    wait_until_async(
        "the next wait picked up an entry on the shard kept",
        Duration::from_secs(10),
        || async { log.count() == 1 },
    )
    .await;
    running.stop().await;
}

/// An assignment of a membership that was lost (queued before the fence, handled after the rejoin moved
/// the deadline ahead again) starts nothing: its token is below the floor the loss raised, while a grant
/// of the new membership is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assignment_of_a_lost_membership_handled_after_the_rejoin_reads_nothing() {
    let (redis, mut conn) = redis_with_groups(Target::Single, "lost-grant", 0..2).await;
    let deadline = OwnershipDeadline::new();
    // The old membership held epochs up to 9; it was lost, and the member rejoined.
    deadline.withdraw(10);
    deadline.set(deadline.local_now().plus_ms(30_000));
    let log = Log::default();
    // One worker: the shards take turns, so each turn of shard 1 follows one of shard 0.
    let mut cfg = config("lost-grant", "m0");
    cfg.runtime_max_concurrency = 1;
    let running =
        Running::start_with_deadline(redis.url(), cfg, recording_handler(&log), deadline).await;
    let grant = |shard, member_epoch| ShardCommand::Assign {
        shard,
        token: FencingToken {
            member_id: Arc::from("m0"),
            member_epoch,
        },
    };
    running.commands.send(grant(0, 9)).unwrap();
    running.commands.send(grant(1, 12)).unwrap();
    produce(&mut conn, "lost-grant", 0, 0, 1).await;
    produce(&mut conn, "lost-grant", 1, 0, 1).await;
    wait_until_async(
        "the new grant is served",
        Duration::from_secs(10),
        || async { log.count() >= 1 },
    )
    .await;
    // Shard 0 had turns in between (no fence follows here, so it stays in the rotation).
    produce(&mut conn, "lost-grant", 1, 1, 1).await;
    wait_until_async(
        "the new grant is served again",
        Duration::from_secs(10),
        || async { log.ids().iter().filter(|(shard, _)| *shard == 1).count() == 2 },
    )
    .await;
    assert!(
        log.ids().iter().all(|(shard, _)| *shard == 1),
        "the lost membership's shard was handled"
    );
    let owner: Option<String> = redis::cmd("GET")
        .arg(stream_listener::names::shard_owner("lost-grant:0", GROUP))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(owner, None, "the lost membership installed a fence");
    assert_eq!(xpending_count(&mut conn, "lost-grant:0", GROUP).await, 0);
    running.task.abort();
}

/// Shard 0 of `prefix` on a single node behind the fault proxy, consumed through the proxy by `m0` (its
/// idle wait blocking 2 s), whose handler records the (n, delivery count) of every entry, in order.
struct BehindProxy {
    _redis: RedisServer,
    conn: redis::aio::MultiplexedConnection,
    proxy: stream_listener_test_support::proxy::FaultProxy,
    order: Seen,
    running: Running,
}

impl BehindProxy {
    async fn start(prefix: &str, response_timeout: Option<Duration>) -> Self {
        let redis = RedisServer::start();
        let mut conn = connect_multiplexed(&redis.url()).await;
        create_groups(&mut conn, prefix, 0..1).await;
        let proxy = stream_listener_test_support::proxy::FaultProxy::start(redis.addr()).await;
        let order = Seen::default();
        let handler = order_recording_handler(&order);
        let mut cfg = config(prefix, "m0");
        if let Some(timeout) = response_timeout {
            cfg.response_timeout = timeout;
        }
        // The wait blocks long enough for the entries to reach it.
        cfg.block_ms = 2_000;
        let running = Running::start(&proxy.url(), cfg, handler).await;
        running.assign([0]).await;
        Self {
            _redis: redis,
            conn,
            proxy,
            order,
            running,
        }
    }

    /// Waits until `n` entries were handled.
    async fn handled(&self, what: &str, n: usize) {
        wait_until_async(what, Duration::from_secs(20), || async {
            self.order.lock().unwrap().len() >= n
        })
        .await;
    }
}

/// How a group read's reply goes missing in [`a_read_whose_reply_is_lost`].
#[derive(Debug, Clone, Copy)]
enum LostReply {
    /// The connection resets right after Redis ran the read.
    Reset,
    /// The reply arrives after the response timeout.
    Timeout,
}

/// Single node only: the fault is injected by a proxy in front of one server.
///
/// A group read that reached Redis but whose reply never arrived (a reset, or the response timeout) may
/// have moved entries into the member's own pending list. The member must treat it as "may have
/// delivered": the entries are handled, before any later entry of the shard (per-key order), and nothing
/// stays pending while the member runs. The read here is the idle wait's: a group read blocked in Redis
/// when the entries arrive, whose reply (the entries) is then lost.
async fn a_read_whose_reply_is_lost(fault: LostReply) {
    let test = BehindProxy::start("lost", Some(Duration::from_millis(500))).await;
    let (proxy, mut conn) = (&test.proxy, test.conn.clone());
    produce(&mut conn, "lost", 0, 0, 1).await;
    test.handled("the first entry handled", 1).await;
    // Idle in its wait, already sent: the fault is for the next group read, the next wait's.
    wait_for_blocked_client(&mut conn).await;
    match fault {
        LostReply::Reset => proxy.lose_reply_after("XREADGROUP"),
        LostReply::Timeout => proxy.delay_reply_after("XREADGROUP", Duration::from_secs(4)),
    }
    produce(&mut conn, "lost", 0, 1, 5).await;
    test.handled("five more handled", 6).await;
    wait_until_async(
        "the next wait's read reached Redis",
        Duration::from_secs(10),
        || async { proxy.fired() == 1 },
    )
    .await;
    wait_for_blocked_client(&mut conn).await;
    // Delivered to the blocked read at once; its reply is lost (or comes after the timeout).
    produce(&mut conn, "lost", 0, 6, 5).await;
    produce(&mut conn, "lost", 0, 11, 5).await;
    test.handled("every entry handled, the stranded ones too", 16)
        .await;
    wait_until_async("nothing pending", Duration::from_secs(10), || {
        let mut conn = conn.clone();
        async move { xpending_count(&mut conn, "lost:0", GROUP).await == 0 }
    })
    .await;
    let order = test.order.lock().unwrap().clone();
    let ns: Vec<u64> = order.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        ns,
        (0..16).collect::<Vec<u64>>(),
        "entries handled out of order (or twice) after the lost reply"
    );
    // The lost reply did deliver entries (which ones depends on how the writes met the waits): they were
    // claimed back, a second delivery.
    assert!(
        order.iter().any(|(_, deliveries)| *deliveries >= 2),
        "the lost read delivered nothing: {order:?}"
    );
    test.running.stop().await;
}

/// Single node only: the fault is injected by a proxy in front of one server.
///
/// The idle wait is a future the driver polls; a fence drops it, reply unread. Fault: the wait's group
/// read delivered entries in Redis (pending for this member) and the fence comes while its reply is still
/// on the wire. The next ownership of the shard (the member's rejoin) claims them back before reading
/// anything new: each is handled once, in order, and nothing stays pending; the late reply is never read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_while_the_waits_reply_is_on_the_wire_leaves_its_entries_to_the_next_ownership() {
    let test = BehindProxy::start("fenced-wait", None).await;
    let (proxy, mut conn) = (&test.proxy, test.conn.clone());
    produce(&mut conn, "fenced-wait", 0, 0, 1).await;
    test.handled("the first entry handled", 1).await;
    // Idle in its wait, already sent: the fault is for the next wait's read.
    wait_for_blocked_client(&mut conn).await;
    proxy.delay_reply_after("XREADGROUP", Duration::from_secs(4));
    produce(&mut conn, "fenced-wait", 0, 1, 1).await;
    test.handled("the second entry handled", 2).await;
    wait_until_async(
        "the next wait's read reached Redis",
        Duration::from_secs(10),
        || async { proxy.fired() == 1 },
    )
    .await;
    let fired_at = Instant::now();
    wait_for_blocked_client(&mut conn).await;
    // Delivered to the blocked read at once, pending for m0; the reply is held on the wire.
    produce(&mut conn, "fenced-wait", 0, 2, 5).await;
    wait_until_async(
        "delivered to the held read",
        Duration::from_secs(10),
        || {
            let mut conn = conn.clone();
            async move { xpending_count(&mut conn, "fenced-wait:0", GROUP).await >= 1 }
        },
    )
    .await;
    // The read was answered by the first write, with what the stream had then.
    let held = xpending_count(&mut conn, "fenced-wait:0", GROUP).await as usize;
    test.running.commands.send(ShardCommand::Fence).unwrap();
    // The rejoin: a new ownership of the shard, at a newer token.
    test.running.assign([0]).await;
    produce(&mut conn, "fenced-wait", 0, 7, 3).await;
    test.handled("every entry handled, the held ones too", 10)
        .await;
    wait_until_async("nothing pending", Duration::from_secs(10), || {
        let mut conn = conn.clone();
        async move { xpending_count(&mut conn, "fenced-wait:0", GROUP).await == 0 }
    })
    .await;
    // Watched until the held reply is due: had anything read it, its entries would be handled again.
    while Instant::now() < fired_at + Duration::from_millis(4_500) {
        let order = test.order.lock().unwrap().clone();
        assert_eq!(order.len(), 10, "handled again: {order:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let order = test.order.lock().unwrap().clone();
    let ns: Vec<u64> = order.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        ns,
        (0..10).collect::<Vec<u64>>(),
        "entries handled out of order (or twice) after the fence dropped the wait"
    );
    assert!(
        order[2..2 + held]
            .iter()
            .all(|(_, deliveries)| *deliveries == 2),
        "the {held} held entries were claimed back by the new ownership: {order:?}"
    );
    test.running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_whose_connection_resets_after_redis_ran_it_strands_nothing() {
    a_read_whose_reply_is_lost(LostReply::Reset).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_whose_reply_comes_after_the_timeout_strands_nothing() {
    a_read_whose_reply_is_lost(LostReply::Timeout).await;
}
