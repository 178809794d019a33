//! stream-listener on a real Redis Cluster (3 masters + 3 replicas from `test-support`): two runtimes
//! consume one group while a producer writes, through a slot migration of a shard stream, a master
//! failover, the group metadata's master failing, and `SCRIPT FLUSH` everywhere. Every handled message
//! records the member and epoch that handled it: nothing is lost, per-key order holds, and a shard's
//! owner tokens never go back to an earlier owner. The producer waits for a replica of each write
//! (`min_replicas`): without it a master killed right after acknowledging a write loses it (seen here
//! once in about seventy runs on a busy machine: one entry the new master never had).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stream_listener::connection::{slot_of, ConnectOptions, Connection, RedisTarget};
use stream_listener::coordinator::metadata::GroupConfig;
use stream_listener::producer::ProducerConfig;
use stream_listener::routing::shard_for_key;
use stream_listener::topology::{Topology, TopologyError};
use stream_listener::{ConsumerBuilder, Message, Producer, RunningRuntime, Runtime};
use stream_listener_test_support::aio::{poll_until, wait_until};
use stream_listener_test_support::RedisCluster;
use stream_listener_tests::Order;
use tokio::time::Instant;

const TIMING: GroupConfig = GroupConfig {
    heartbeat_interval_ms: 100,
    session_timeout_ms: 3_000,
    rebalance_timeout_ms: 6_000,
};
const SHARDS: u32 = 8;
const KEYS: u32 = 16;

/// One handled message: key, seq, shard, member, member epoch.
type Seen = Arc<Mutex<Vec<(String, u32, u32, String, i64)>>>;

/// The library's INFO lines (or `RUST_LOG`'s choice) go to the test's output, shown when it fails.
fn log_to_the_test() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "stream_listener=info".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_test_writer()
        .try_init();
}

async fn connect(url: &str) -> Connection {
    RedisTarget::open(url)
        .unwrap()
        .connect(ConnectOptions::default())
        .await
        .unwrap()
}

fn start(
    url: &str,
    stream: &str,
    member: &str,
    seen: Seen,
) -> impl std::future::Future<Output = RunningRuntime> {
    let builder = ConsumerBuilder::new(stream, "g")
        .member_id(member)
        .runtime_max_concurrency(2)
        .batch_size(10)
        .handler(move |msg: Message<Order>| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push((
                    msg.payload.key.clone(),
                    msg.payload.seq,
                    msg.shard,
                    msg.token.member_id.to_string(),
                    msg.token.member_epoch,
                ));
                Ok::<(), String>(())
            }
        });
    let runtime = Runtime::new(url)
        .without_default_logging()
        .without_annotated_listeners()
        .group_config(TIMING)
        .consumer(builder);
    async move { runtime.start().await.unwrap() }
}

/// Every write on a replica before the send succeeds.
fn replicated() -> ProducerConfig {
    ProducerConfig {
        min_replicas: 1,
        replica_timeout: Duration::from_secs(1),
        ..ProducerConfig::default()
    }
}

/// Sends `per_key` orders per key, round by round, retrying a failed send (a failover in progress)
/// for up to 20 s. Returns how many were sent.
async fn produce(url: String, stream: &'static str, per_key: u32, pause: Duration) -> u32 {
    // A master that acknowledged a write and died before its replica had it loses it (replication is
    // asynchronous): a send succeeds once the replica has its write (`WAIT`), else it is sent again.
    let producer = Producer::connect_with_config(&url, stream, replicated())
        .await
        .unwrap();
    for seq in 0..per_key {
        for k in 0..KEYS {
            let key = format!("k{k}");
            let order = Order {
                key: key.clone(),
                seq,
            };
            let start = Instant::now();
            loop {
                match producer.send(&key, &order).await {
                    Ok(_) => break,
                    Err(error) => {
                        assert!(
                            start.elapsed() < Duration::from_secs(20),
                            "send failed for 20 s: {error}"
                        );
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }
        tokio::time::sleep(pause).await;
    }
    per_key * KEYS
}

fn distinct(seen: &Seen) -> usize {
    let seen = seen.lock().unwrap();
    seen.iter()
        .map(|(k, s, ..)| (k.clone(), *s))
        .collect::<BTreeSet<_>>()
        .len()
}

/// Nothing lost, per-key order (first deliveries strictly increasing), and per shard the owner token
/// never returns to an earlier (member, epoch) once another took over.
fn check(seen: &Seen, sent: u32, per_key: u32) {
    let seen = seen.lock().unwrap();
    let mut by_key: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    let mut tokens: BTreeMap<u32, Vec<(&str, i64)>> = BTreeMap::new();
    for (key, seq, shard, member, epoch) in seen.iter() {
        by_key.entry(key).or_default().push(*seq);
        let owners = tokens.entry(*shard).or_default();
        if owners.last() != Some(&(member.as_str(), *epoch)) {
            assert!(
                !owners.contains(&(member.as_str(), *epoch)),
                "shard {shard}: ({member}, {epoch}) handled again after another owner: {owners:?}"
            );
            owners.push((member, *epoch));
        }
    }
    let mut total = 0;
    for (key, seqs) in by_key {
        let mut first = Vec::new();
        let mut had = BTreeSet::new();
        for seq in seqs {
            if had.insert(seq) {
                first.push(seq);
            }
        }
        assert!(
            first.windows(2).all(|w| w[0] < w[1]),
            "{key}: out of order {first:?}"
        );
        assert_eq!(first.len() as u32, per_key, "{key}: lost some: {first:?}");
        total += first.len() as u32;
    }
    assert_eq!(total, sent);
}

/// What a timed-out run needs to be understood: the (key, seq) pairs not handled and their shards, and per
/// shard stream its length, its group's state (last delivered, entries read, lag, pending) and its
/// pending entries.
async fn where_are_the_missing(
    conn: &mut Connection,
    stream: &str,
    seen: &Seen,
    per_key: u32,
) -> String {
    let handled: BTreeSet<(String, u32)> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(k, s, ..)| (k.clone(), *s))
        .collect();
    let mut report = String::from("missing:");
    for k in 0..KEYS {
        let key = format!("k{k}");
        let shard = shard_for_key(key.as_bytes(), SHARDS);
        let missing: Vec<u32> = (0..per_key)
            .filter(|seq| !handled.contains(&(key.clone(), *seq)))
            .collect();
        if !missing.is_empty() {
            report += &format!("\n  {key} (shard {shard}): {missing:?}");
        }
    }
    for shard in 0..SHARDS {
        let key = format!("{stream}:{shard}");
        let len: redis::RedisResult<u64> = redis::cmd("XLEN").arg(&key).query_async(conn).await;
        let groups: redis::RedisResult<redis::Value> = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(&key)
            .query_async(conn)
            .await;
        let pending: redis::RedisResult<redis::Value> = redis::cmd("XPENDING")
            .arg(&key)
            .arg("g")
            .arg("-")
            .arg("+")
            .arg(20)
            .query_async(conn)
            .await;
        report += &format!("\n{key}: XLEN {len:?}\n  groups {groups:?}\n  pending {pending:?}");
    }
    report
}

/// Two runtimes consume `stream` while `per_key` rounds are produced; `disrupt` runs once the first
/// messages were handled. Then everything must be handled and checked.
async fn consume_through(
    cluster: &mut RedisCluster,
    stream: &'static str,
    disrupt: impl FnOnce(&mut RedisCluster),
) {
    log_to_the_test();
    let url = cluster.url();
    let mut conn = connect(&url).await;
    Topology::ensure(&mut conn, stream, SHARDS).await.unwrap();
    let seen: Seen = Arc::default();
    let a = start(&url, stream, "a", seen.clone()).await;
    let b = start(&url, stream, "b", seen.clone()).await;
    let per_key = 30;
    let producer = tokio::spawn(produce(
        url.clone(),
        stream,
        per_key,
        Duration::from_millis(30),
    ));
    wait_until("first messages", Duration::from_secs(30), || {
        distinct(&seen) >= 64
    })
    .await;
    tokio::task::block_in_place(|| disrupt(cluster));
    let sent = producer.await.unwrap();
    let all_handled = poll_until(Duration::from_secs(60), Duration::from_millis(20), || {
        std::future::ready(distinct(&seen) as u32 == sent)
    })
    .await;
    if !all_handled {
        let report = where_are_the_missing(&mut conn, stream, &seen, per_key).await;
        panic!("timed out after 60 s waiting for every message handled\n{report}");
    }
    let _ = a.stop().await;
    let _ = b.stop().await;
    check(&seen, sent, per_key);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runtimes_consume_a_cluster_in_per_key_order() {
    let mut cluster = RedisCluster::start();
    consume_through(&mut cluster, "plain", |_| {}).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_with_a_password_works() {
    let mut cluster = RedisCluster::start_with_password("s3cret");
    consume_through(&mut cluster, "authed", |_| {}).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_streams_slot_migrated_during_consumption_loses_nothing() {
    let mut cluster = RedisCluster::start();
    consume_through(&mut cluster, "migrated", |cluster| {
        let slot = slot_of(b"migrated:3");
        let from = cluster.master_of(slot);
        let to = (0..6)
            .find(|&i| i != from && i < 3)
            .expect("another master");
        cluster.migrate_slot(slot, to).unwrap();
        assert_eq!(cluster.master_of(slot), to);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_masters_failover_during_consumption_loses_nothing() {
    let mut cluster = RedisCluster::start();
    consume_through(&mut cluster, "failed", |cluster| {
        let master = cluster.master_of(slot_of(b"failed:5"));
        cluster.fail_master(master).unwrap();
        // Back as the promoted master's replica: the producer's writes there need one (`replicated`).
        cluster.restart_node(master).unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_group_metadata_masters_failover_loses_nothing() {
    let mut cluster = RedisCluster::start();
    consume_through(&mut cluster, "meta", |cluster| {
        let master = cluster.master_of(slot_of(b"sl:{meta/g}"));
        cluster.fail_master(master).unwrap();
        cluster.restart_node(master).unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_on_every_node_mid_run_loses_nothing() {
    let mut cluster = RedisCluster::start();
    consume_through(&mut cluster, "flushed", |cluster| {
        for node in cluster.nodes() {
            assert_eq!(
                cluster.cli(node.port(), &["SCRIPT", "FLUSH"]).unwrap(),
                "OK"
            );
        }
    })
    .await;
}

/// Sum over running nodes of a `name:value` (or `name:calls=value`, `name:count=value`) field of
/// `INFO section`.
fn info_sum(cluster: &RedisCluster, section: &str, field: &str) -> u64 {
    cluster
        .nodes()
        .iter()
        .filter(|n| n.ping())
        .map(|n| {
            let info = cluster.cli(n.port(), &["INFO", section]).unwrap();
            info.lines()
                .find_map(|l| l.strip_prefix(field))
                .map(|rest| {
                    let rest = rest
                        .trim_start_matches("calls=")
                        .trim_start_matches("count=");
                    rest.split([',', '\r'])
                        .next()
                        .unwrap()
                        .parse::<u64>()
                        .unwrap()
                })
                .unwrap_or(0)
        })
        .sum()
}

/// `blocked_clients` of the node at `index`.
fn blocked_on(cluster: &RedisCluster, index: usize) -> u64 {
    let info = cluster
        .cli(cluster.nodes()[index].port(), &["INFO", "clients"])
        .unwrap_or_default();
    info.lines()
        .find_map(|l| l.strip_prefix("blocked_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_waited_masters_failover_the_idle_wait_blocks_on_the_promoted_replica() {
    log_to_the_test();
    let mut cluster = RedisCluster::start();
    let url = cluster.url();
    let stream = "moved";
    let mut conn = connect(&url).await;
    Topology::ensure(&mut conn, stream, SHARDS).await.unwrap();
    let seen: Seen = Arc::default();
    let runtime = start(&url, stream, "solo", seen.clone()).await;
    wait_until("an idle wait", Duration::from_secs(20), || {
        info_sum(&cluster, "clients", "blocked_clients:") >= 2
    })
    .await;
    // The master of shard 0's slot dies while the member waits on it (SIGKILL: its connections reset).
    let master = cluster.master_of(slot_of(format!("{stream}:0").as_bytes()));
    let promoted = cluster.fail_master(master).unwrap();
    let producer = Producer::new(connect(&url).await, stream).await.unwrap();
    for k in 0..KEYS {
        let key = format!("k{k}");
        let order = Order {
            key: key.clone(),
            seq: 0,
        };
        let start = Instant::now();
        while producer.send(&key, &order).await.is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "send failed for 20 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    wait_until("every message handled", Duration::from_secs(30), || {
        distinct(&seen) as u32 == KEYS
    })
    .await;
    // Idle again: the wait reads the slots' new master instead of failing against the dead one (and
    // polling every shard one by one) until a redirection happens to refresh its map.
    wait_until(
        "a wait blocked on the promoted replica",
        Duration::from_secs(20),
        || blocked_on(&cluster, promoted) >= 1,
    )
    .await;
    let _ = runtime.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idle_wait_blocks_per_slot_and_ends_when_any_read_returns() {
    log_to_the_test();
    let cluster = RedisCluster::start();
    let url = cluster.url();
    let stream = "idle";
    let mut conn = connect(&url).await;
    Topology::ensure(&mut conn, stream, SHARDS).await.unwrap();
    let slots: BTreeSet<u16> = (0..SHARDS)
        .map(|s| slot_of(format!("{stream}:{s}").as_bytes()))
        .collect();
    let seen: Seen = Arc::default();
    let runtime = start(&url, stream, "solo", seen.clone()).await;
    // Idle: blocked XREADGROUPs side by side, one per slot group of the waiting shards (a shard being
    // polled by the other worker is not in the wait), spread over the masters.
    let started = Instant::now();
    while info_sum(&cluster, "clients", "blocked_clients:") < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "expected blocked reads on {} slots, have {}",
            slots.len(),
            info_sum(&cluster, "clients", "blocked_clients:")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let unblocks = info_sum(&cluster, "commandstats", "cmdstat_client|unblock:");
    let producer = Producer::new(connect(&url).await, stream).await.unwrap();
    producer
        .send(
            "k1",
            &Order {
                key: "k1".into(),
                seq: 0,
            },
        )
        .await
        .unwrap();
    wait_until("the message handled", Duration::from_secs(10), || {
        distinct(&seen) == 1
    })
    .await;
    // The read that got it ended the wait: the other slots' reads were unblocked, not waited for (a
    // wait that waited for every read would send no CLIENT UNBLOCK at all).
    let started = Instant::now();
    while info_sum(&cluster, "commandstats", "cmdstat_client|unblock:") < unblocks + 1 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the other reads were not unblocked (before {unblocks}, blocked {}): {:?}",
            info_sum(&cluster, "clients", "blocked_clients:"),
            cluster
                .nodes()
                .iter()
                .map(|n| cluster
                    .cli(n.port(), &["INFO", "commandstats"])
                    .unwrap()
                    .lines()
                    .filter(|l| l.contains("client") || l.contains("xread"))
                    .collect::<Vec<_>>()
                    .join(";"))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = runtime.stop().await;
}

/// A grow and then a shrink while a producer writes and two runtimes consume: the scripts touch one
/// slot each (the record and audit share the stream's tag; each shard stream is its own), the new
/// shards land on other masters, moved keys keep their order, and the shrink's removed shards are
/// retired once drained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grow_then_a_shrink_under_traffic_loses_nothing() {
    const GRACE: Duration = Duration::from_millis(1_500); // > the producers' 1 s topology refresh
    let cluster = RedisCluster::start();
    let url = cluster.url();
    let stream = "resized";
    let mut conn = connect(&url).await;
    Topology::ensure(&mut conn, stream, 4).await.unwrap();
    let seen: Seen = Arc::default();
    let a = start(&url, stream, "a", seen.clone()).await;
    let b = start(&url, stream, "b", seen.clone()).await;
    let per_key = 80;
    let producer = tokio::spawn(produce(
        url.clone(),
        stream,
        per_key,
        Duration::from_millis(40),
    ));
    wait_until("first messages", Duration::from_secs(30), || {
        distinct(&seen) >= 64
    })
    .await;
    let grown = Topology::resize_with_grace(&mut conn, stream, 12, GRACE)
        .await
        .unwrap();
    let masters: BTreeSet<usize> = grown
        .stream_keys()
        .iter()
        .map(|key| cluster.master_of(slot_of(key.as_bytes())))
        .collect();
    assert_eq!(masters.len(), 3, "shards on masters {masters:?}");
    // The shrink is refused until every group consumed the grow's old shards below its cut.
    let started = Instant::now();
    loop {
        match Topology::resize_with_grace(&mut conn, stream, 4, GRACE).await {
            Ok(shrunk) => {
                assert_eq!(shrunk.shard_count(), 4);
                break;
            }
            Err(TopologyError::MigrationInProgress { .. }) => {
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "the grow's migration never finished"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("shrink failed: {error}"),
        }
    }
    let sent = producer.await.unwrap();
    wait_until("every message handled", Duration::from_secs(60), || {
        distinct(&seen) as u32 == sent
    })
    .await;
    // The followers retire the removed shards once drained.
    let started = Instant::now();
    while !Topology::load(&mut conn, stream)
        .await
        .unwrap()
        .draining_shards()
        .is_empty()
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the shrink's removed shards were never retired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = a.stop().await;
    let _ = b.stop().await;
    check(&seen, sent, per_key);
}

/// The batches `batches_through` sends: `len` messages, each key `key_repeats` times in a row.
#[derive(Clone, Copy, Debug)]
struct Batches {
    len: u32,
    key_repeats: u32,
}

/// How a test's producer is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Made {
    /// As `Producer::connect` makes it: a connection per master, one plain pipeline per master.
    Connect,
    /// `Producer::new` over a shared connection: a transaction per shard, through redis-rs's routing.
    OverConnection,
}

impl Made {
    async fn producer(self, url: &str, stream: &str, config: ProducerConfig) -> Producer {
        match self {
            Made::Connect => Producer::connect_with_config(url, stream, config).await,
            Made::OverConnection => Producer::with_config(connect(url).await, stream, config).await,
        }
        .unwrap()
    }
}

/// Batches of `batches_of.len` messages (at most `BATCH_KEYS`), each key `key_repeats` times in a row
/// (1: each message of another key), the keys taken in turn over every shard, sent with `send_batch_bytes` (a failed batch is sent again, whole, for up to 20 s)
/// while `disrupt` runs. Then every shard stream is
/// read back (XRANGE): every receipt names an entry holding its message, every message was written,
/// and a batch's receipts of one shard have increasing ids in input order. With `strict`, an entry no
/// receipt names must also belong to a batch that failed at least once (a failed batch may have been
/// written in part: resending is at-least-once); otherwise such entries are only counted. Returns how
/// many batches failed at least once.
async fn batches_through(
    cluster: &mut RedisCluster,
    stream: &'static str,
    made: Made,
    strict: bool,
    batches_of: Batches,
    config: ProducerConfig,
    disrupt: impl FnOnce(&mut RedisCluster),
) -> usize {
    const BATCH_KEYS: u32 = 64;
    let Batches {
        len: per_batch,
        key_repeats: repeats,
    } = batches_of;
    assert!((1..=BATCH_KEYS).contains(&per_batch) && repeats >= 1);
    let key_of =
        move |batch: u32, i: u32| format!("key-{}", (batch * per_batch + i / repeats) % BATCH_KEYS);
    let url = cluster.url();
    let mut conn = connect(&url).await;
    Topology::ensure(&mut conn, stream, SHARDS).await.unwrap();
    let producer = made.producer(&url, stream, config).await;
    let topology = producer.topology();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sending = tokio::spawn({
        let (producer, topology, done) = (producer.clone(), topology.clone(), done.clone());
        async move {
            // (stream, id) -> (batch, index) of every receipt; batches that failed at least once.
            let mut receipts: BTreeMap<(String, String), (u32, u32)> = BTreeMap::new();
            let mut failed: BTreeSet<u32> = BTreeSet::new();
            let mut batches = 0;
            // Until the disruption is over, and 20 batches more.
            let mut after = 0;
            while after < 20 {
                if done.load(std::sync::atomic::Ordering::SeqCst) {
                    after += 1;
                }
                let batch = batches;
                batches += 1;
                let messages: Vec<(String, String)> = (0..per_batch)
                    .map(|i| (key_of(batch, i), format!("{batch}/{i}")))
                    .collect();
                let started = Instant::now();
                let sent = loop {
                    match producer.send_batch_bytes(&messages).await {
                        Ok(sent) => break sent,
                        Err(error) => {
                            failed.insert(batch);
                            assert!(
                                started.elapsed() < Duration::from_secs(20),
                                "batch {batch} failed for 20 s: {error}"
                            );
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                };
                assert_eq!(sent.len(), messages.len());
                let mut last_of_shard: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
                for (i, (receipt, (key, _))) in (0..).zip(sent.iter().zip(&messages)) {
                    let shard = topology.shard_for_key(key.as_bytes());
                    assert_eq!(
                        (receipt.shard, receipt.stream.as_str()),
                        (shard, topology.stream_key(shard).as_str())
                    );
                    let (ms, seq) = receipt.id.split_once('-').unwrap();
                    let id = (ms.parse::<u64>().unwrap(), seq.parse::<u64>().unwrap());
                    if let Some(last) = last_of_shard.insert(shard, id) {
                        assert!(last < id, "batch {batch}: {key}'s id {id:?} after {last:?}");
                    }
                    let at = (receipt.stream.clone(), receipt.id.clone());
                    let previous = receipts.insert(at, (batch, i));
                    assert_eq!(previous, None, "one id given twice: {receipt:?}");
                }
            }
            (receipts, failed, batches)
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    tokio::task::block_in_place(|| disrupt(cluster));
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let (receipts, failed, batches) = sending.await.unwrap();
    let mut written: BTreeMap<(String, String), (u32, u32)> = BTreeMap::new();
    for shard in 0..SHARDS {
        let key = topology.stream_key(shard);
        let entries: Vec<(String, HashMap<String, String>)> =
            stream_listener_test_support::aio::xrange(&mut conn, &key).await;
        for (id, fields) in entries {
            let (batch, i) = fields["p"].split_once('/').unwrap();
            let (batch, i): (u32, u32) = (batch.parse().unwrap(), i.parse().unwrap());
            assert_eq!(fields["k"], key_of(batch, i));
            written.insert((key.clone(), id), (batch, i));
        }
    }
    for (at, message) in &receipts {
        assert_eq!(
            written.get(at),
            Some(message),
            "receipt {at:?} of {message:?}"
        );
    }
    let all: BTreeSet<(u32, u32)> = written.values().copied().collect();
    assert_eq!(all.len() as u32, batches * per_batch, "some messages lost");
    let unreported: Vec<_> = written
        .iter()
        .filter(|(at, (batch, _))| !receipts.contains_key(*at) && !failed.contains(batch))
        .collect();
    eprintln!(
        "{batches} batches, {} failed once or more, {} entries for {} messages, {} written twice \
         by a batch reported once: {:?}",
        failed.len(),
        written.len(),
        all.len(),
        unreported.len(),
        &unreported[..unreported.len().min(5)]
    );
    if strict {
        assert!(
            unreported.is_empty(),
            "entries holding messages of batches the producer reported once, elsewhere: {unreported:?}"
        );
    }
    failed.len()
}

/// Moves the slot of `stream`'s shard 3 to another master.
fn migrate_shard_3(stream: &str) -> impl FnOnce(&mut RedisCluster) + '_ {
    move |cluster| {
        let slot = slot_of(format!("{stream}:3").as_bytes());
        let from = cluster.master_of(slot);
        let to = (0..3).find(|&i| i != from).expect("another master");
        cluster.migrate_slot(slot, to).unwrap();
        assert_eq!(cluster.master_of(slot), to);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_every_shard_through_a_slot_migration_keeps_order_and_loses_nothing() {
    let mut cluster = RedisCluster::start();
    batches_through(
        &mut cluster,
        "batched",
        Made::OverConnection,
        false,
        Batches {
            len: 64,
            key_repeats: 1,
        },
        ProducerConfig::default(),
        migrate_shard_3("batched"),
    )
    .await;
}

/// Failed in about half the runs while each shard's part was a plain pipeline: redis-rs answers an
/// `ASK` by sending `ASKING` once and then the whole pipeline to the importing node, which serves only
/// its first command and answers `MOVED` (back to the migrating node) to the others, so the pipeline
/// went back and forth and its first XADD was written once per turn while the receipt named the last.
/// Each part is now a `MULTI`/`EXEC` transaction, for which Redis keeps the `ASKING` flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_through_a_slot_migration_writes_nothing_twice_unreported() {
    let mut cluster = RedisCluster::start();
    batches_through(
        &mut cluster,
        "batched",
        Made::OverConnection,
        true,
        Batches {
            len: 64,
            key_repeats: 1,
        },
        ProducerConfig::default(),
        migrate_shard_3("batched"),
    )
    .await;
}

/// With `min_replicas`, each shard's part spells its transaction out (`MULTI`, the XADDs, `EXEC`) to end
/// with `WAIT` on the same connection: through a slot migration, redirections still resend a part
/// whole, and nothing is written twice unreported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_batch_through_a_slot_migration_writes_nothing_twice_unreported() {
    let mut cluster = RedisCluster::start();
    batches_through(
        &mut cluster,
        "waited",
        Made::OverConnection,
        true,
        Batches {
            len: 64,
            key_repeats: 1,
        },
        replicated(),
        migrate_shard_3("waited"),
    )
    .await;
}

/// A shard's part of one message (every `send`) is a plain `XADD`, no transaction: `ASKING` covers one
/// command, and a redirected command was not run. Through a slot migration, one message per batch over
/// every shard: each is written once, where its receipt says, and no transaction ran on any node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_sends_through_a_slot_migration_are_written_once_without_a_transaction() {
    let mut cluster = RedisCluster::start();
    // `EXEC`, not `MULTI`: the start's check opens a transaction and discards it.
    let execs = info_sum(&cluster, "commandstats", "cmdstat_exec:");
    batches_through(
        &mut cluster,
        "single",
        Made::OverConnection,
        true,
        Batches {
            len: 1,
            key_repeats: 1,
        },
        ProducerConfig::default(),
        migrate_shard_3("single"),
    )
    .await;
    eprintln!(
        "ASKING: {}",
        info_sum(&cluster, "commandstats", "cmdstat_asking:")
    );
    assert_eq!(
        info_sum(&cluster, "commandstats", "cmdstat_exec:"),
        execs,
        "a transaction for one message"
    );
}

/// A producer made with `Producer::connect` sends a batch's XADDs of one master in one plain pipeline
/// on its own connection, where every reply is final: through a slot migration, the XADDs a master
/// refused (`MOVED`, `ASK`: the map it routed with was stale) are sent again through the cluster
/// connection, after those of their shard that were written, and nothing is written twice or out of
/// order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_straight_to_the_masters_through_a_slot_migration_writes_nothing_twice_unreported()
{
    let mut cluster = RedisCluster::start();
    let redirected = |cluster: &RedisCluster| {
        info_sum(cluster, "errorstats", "errorstat_MOVED:")
            + info_sum(cluster, "errorstats", "errorstat_ASK:")
    };
    let before = redirected(&cluster);
    let failed = batches_through(
        &mut cluster,
        "direct",
        Made::Connect,
        true,
        Batches {
            len: 64,
            key_repeats: 1,
        },
        ProducerConfig::default(),
        migrate_shard_3("direct"),
    )
    .await;
    assert_eq!(failed, 0, "a refused XADD failed its batch");
    assert!(
        redirected(&cluster) > before,
        "no XADD was refused: the migration did not test the resend"
    );
}

/// The same with `min_replicas` (each master's pipeline ends with `WAIT`) and each key four times in a
/// batch: each shard's part is a transaction, refused whole by a master its slot left and sent again
/// whole through the cluster connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_batch_of_repeated_keys_straight_to_the_masters_through_a_slot_migration_writes_nothing_twice_unreported(
) {
    let mut cluster = RedisCluster::start();
    let execs = info_sum(&cluster, "commandstats", "cmdstat_exec:");
    let failed = batches_through(
        &mut cluster,
        "direct-waited",
        Made::Connect,
        true,
        Batches {
            len: 64,
            key_repeats: 4,
        },
        replicated(),
        migrate_shard_3("direct-waited"),
    )
    .await;
    assert_eq!(failed, 0, "a refused XADD failed its batch");
    assert!(
        info_sum(&cluster, "commandstats", "cmdstat_exec:") > execs,
        "no transaction ran"
    );
}

/// A master killed under batches sent straight to it: its connection fails, what it may or may not have
/// run goes again through the cluster connection (at-least-once), which waits for the failover; no
/// batch fails, and every message is written, in order per shard within each batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_straight_to_the_masters_through_a_masters_failover_loses_nothing() {
    let mut cluster = RedisCluster::start();
    let failed = batches_through(
        &mut cluster,
        "direct-failed",
        Made::Connect,
        false,
        Batches {
            len: 64,
            key_repeats: 1,
        },
        replicated(),
        |cluster| {
            let master = cluster.master_of(slot_of(b"direct-failed:3"));
            cluster.fail_master(master).unwrap();
            cluster.restart_node(master).unwrap();
        },
    )
    .await;
    assert_eq!(failed, 0, "a batch failed with its master's connection");
}

/// `Producer::connect` on a cluster sends a batch's parts straight to each master, on a connection of
/// its own named `MASTERS_CLIENT_NAME`; a producer over a shared connection opens none (the control,
/// first, so that the other's connections cannot be still open). Both send each message once, and one
/// transaction per shard of a batch in which keys repeat. A batch of distinct keys is plain XADDs on
/// the masters' connections (no order to keep), and one transaction per shard through the shared
/// connection (which follows `ASK` with one `ASKING`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_go_to_each_master_on_the_producers_own_connection() {
    use stream_listener::producer::MASTERS_CLIENT_NAME;
    let cluster = RedisCluster::start();
    let url = cluster.url();
    let mut conn = connect(&url).await;
    Topology::ensure(&mut conn, "direct", SHARDS).await.unwrap();
    let topology = Topology::load(&mut conn, "direct").await.unwrap();
    let mut masters: Vec<usize> = (0..SHARDS)
        .map(|s| cluster.master_of(slot_of(topology.stream_key(s).as_bytes())))
        .collect();
    masters.sort_unstable();
    masters.dedup();
    for made in [Made::OverConnection, Made::Connect] {
        let producer = made
            .producer(&url, "direct", ProducerConfig::default())
            .await;
        let (xadds, execs) = (
            info_sum(&cluster, "commandstats", "cmdstat_xadd:"),
            info_sum(&cluster, "commandstats", "cmdstat_exec:"),
        );
        // Each key twice in a batch: every part holding a key holds it twice.
        for batch in 0..20 {
            let messages: Vec<(String, String)> = (0..64)
                .map(|j| (format!("key-{}", j % 32), format!("{batch}/{j}")))
                .collect();
            producer.send_batch_bytes(&messages).await.unwrap();
        }
        let shards: BTreeSet<u32> = (0..32)
            .map(|j| topology.shard_for_key(format!("key-{j}").as_bytes()))
            .collect();
        let shards = shards.len() as u64;
        // Counted on each master and again on its replica.
        assert_eq!(
            info_sum(&cluster, "commandstats", "cmdstat_xadd:") - xadds,
            2 * 20 * 64,
            "{made:?}"
        );
        assert_eq!(
            info_sum(&cluster, "commandstats", "cmdstat_exec:") - execs,
            2 * 20 * shards,
            "{made:?}"
        );
        let execs = info_sum(&cluster, "commandstats", "cmdstat_exec:");
        for batch in 0..20 {
            let messages: Vec<(String, String)> = (0..64)
                .map(|j| (format!("key-{j}"), format!("{batch}/{j}")))
                .collect();
            producer.send_batch_bytes(&messages).await.unwrap();
        }
        assert_eq!(
            info_sum(&cluster, "commandstats", "cmdstat_xadd:") - xadds,
            2 * 2 * 20 * 64,
            "{made:?}"
        );
        let distinct_execs = match made {
            Made::Connect => 0,
            Made::OverConnection => 2 * 20 * u64::from(SHARDS),
        };
        assert_eq!(
            info_sum(&cluster, "commandstats", "cmdstat_exec:") - execs,
            distinct_execs,
            "{made:?}"
        );
        for &master in &masters {
            let port = cluster.nodes()[master].port();
            let clients = cluster.cli(port, &["CLIENT", "LIST"]).unwrap();
            let named = format!(" name={MASTERS_CLIENT_NAME} ");
            let ours: Vec<&str> = clients.lines().filter(|l| l.contains(&named)).collect();
            match made {
                Made::OverConnection => assert!(ours.is_empty(), "{clients}"),
                Made::Connect => {
                    assert_eq!(ours.len(), 1, "one connection per master: {clients}");
                    assert!(ours[0].contains(" cmd=xadd "), "{}", ours[0]);
                }
            }
        }
    }
}

/// A shard's part of a batch in which a key repeats is one transaction, which the documented ACL must
/// allow: a refused `MULTI` broke redis-rs's count of replies (it panicked). As a user with only
/// `preflight::ACL_COMMANDS` on every node, batches of 64 messages (each key twice) over every shard go
/// as transactions and are written whole, each where its receipt says, in input order per shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_with_only_the_documented_commands_sends_batches() {
    let cluster = RedisCluster::start();
    let stream = "guarded";
    let mut admin = connect(&cluster.url()).await;
    Topology::ensure(&mut admin, stream, SHARDS).await.unwrap();
    let keys = format!("~{stream}:*");
    let mut setuser = vec![
        "ACL",
        "SETUSER",
        "app",
        "on",
        ">app-pw",
        "resetkeys",
        "~sl:*",
    ];
    setuser.extend([keys.as_str(), "resetchannels", "&sl:*"]);
    setuser.extend(stream_listener::preflight::ACL_COMMANDS);
    for node in cluster.nodes() {
        assert_eq!(cluster.cli(node.port(), &setuser).unwrap(), "OK");
    }
    let execs = info_sum(&cluster, "commandstats", "cmdstat_exec:");
    let as_user = cluster.url().replace("cluster://", "cluster://app:app-pw@");
    let producer = Producer::connect(&as_user, stream).await.unwrap();
    let topology = producer.topology();
    let mut sent = BTreeMap::new();
    for batch in 0..20 {
        let messages: Vec<(String, String)> = (0..64)
            .map(|j| (format!("key-{}", j % 32), format!("{batch}/{j}")))
            .collect();
        let receipts = producer.send_batch_bytes(&messages).await.unwrap();
        for (receipt, (key, payload)) in receipts.into_iter().zip(messages) {
            assert_eq!(receipt.shard, topology.shard_for_key(key.as_bytes()));
            sent.insert((receipt.stream, receipt.id), payload);
        }
    }
    let mut written = BTreeMap::new();
    for shard in 0..SHARDS {
        let key = topology.stream_key(shard);
        let entries: Vec<(String, HashMap<String, String>)> =
            stream_listener_test_support::aio::xrange(&mut admin, &key).await;
        let payloads: Vec<&str> = entries.iter().map(|(_, f)| f["p"].as_str()).collect();
        let mut in_order = payloads.clone();
        in_order.sort_by_key(|p| {
            let (batch, j) = p.split_once('/').unwrap();
            (batch.parse::<u32>().unwrap(), j.parse::<u32>().unwrap())
        });
        assert_eq!(payloads, in_order, "shard {shard} out of input order");
        for (id, fields) in entries {
            written.insert((key.clone(), id), fields["p"].clone());
        }
    }
    assert_eq!(written, sent, "every message once, where its receipt says");
    let execs = info_sum(&cluster, "commandstats", "cmdstat_exec:") - execs;
    assert!(
        execs >= 20,
        "{execs} transactions for 20 batches over every shard"
    );
}

/// A master out of memory refuses a shard's part of a batch in which keys repeat whole: the producer
/// reports `OutOfMemory`, and of the refused batch each shard stream holds its whole part or none of it
/// (each shard's part is one transaction, refused when queued); the other masters' shards took theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_master_refuses_its_shards_parts_of_a_batch_whole() {
    use stream_listener::ProducerError;
    let cluster = RedisCluster::start();
    let url = cluster.url();
    let stream = "filled";
    let mut conn = connect(&url).await;
    Topology::ensure(&mut conn, stream, SHARDS).await.unwrap();
    let producer = Producer::connect(&url, stream).await.unwrap();
    let key_of = |s: u32| format!("{stream}:{s}");
    let master_of = |s: u32| cluster.master_of(slot_of(key_of(s).as_bytes()));
    let full = master_of(0);
    let port = cluster.nodes()[full].port();
    let used: String = cluster.cli(port, &["INFO", "memory"]).unwrap();
    let used: u64 = used
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let limit = (used + 1024 * 1024).to_string();
    cluster
        .cli(port, &["CONFIG", "SET", "maxmemory", &limit])
        .unwrap();
    let len = |conn: &mut Connection, s: u32| {
        let key = key_of(s);
        let mut conn = conn.clone();
        async move {
            redis::cmd("XLEN")
                .arg(key)
                .query_async::<u64>(&mut conn)
                .await
                .unwrap()
        }
    };
    let payload = "x".repeat(1_000);
    let mut refused = None;
    for batch in 0..10_000u32 {
        let messages: Vec<(String, String)> = (0..64)
            .map(|j| (format!("key-{}", j % 16), format!("{batch}/{j}/{payload}")))
            .collect();
        let before: Vec<u64> = {
            let mut lens = Vec::new();
            for s in 0..SHARDS {
                lens.push(len(&mut conn, s).await);
            }
            lens
        };
        match producer.send_batch_bytes(&messages).await {
            Ok(_) => {}
            Err(error) => {
                refused = Some((error, before));
                break;
            }
        }
    }
    let (error, before) = refused.expect("the master filled up");
    assert!(
        matches!(error, ProducerError::OutOfMemory { .. }),
        "{error:?}"
    );
    // The refused batch's part per shard.
    let topology = producer.topology();
    let mut part: BTreeMap<u32, u64> = BTreeMap::new();
    for j in 0..64 {
        *part
            .entry(topology.shard_for_key(format!("key-{}", j % 16).as_bytes()))
            .or_default() += 1;
    }
    let mut refused_shards = 0;
    for s in 0..SHARDS {
        let added = len(&mut conn, s).await - before[s as usize];
        let whole = part.get(&s).copied().unwrap_or(0);
        assert!(
            added == 0 || added == whole,
            "shard {s} took {added} of its part of {whole}"
        );
        if master_of(s) != full {
            assert_eq!(added, whole, "shard {s} is on a master with room");
        } else if whole > 0 && added == 0 {
            refused_shards += 1;
        }
    }
    assert!(
        refused_shards > 0,
        "some shard of the full master refused its part"
    );
    cluster
        .cli(port, &["CONFIG", "SET", "maxmemory", "0"])
        .unwrap();
}
