//! stream-listener behind Redis Sentinel (a master, a replica, three sentinels from `test-support`):
//! discovery skips dead and frozen sentinels and refuses a master name no sentinel monitors; a
//! connection follows the master through `SENTINEL FAILOVER`; an idle group's blocking waits and wake-up
//! subscriptions move to the new master; and three runtimes consume through a failover under traffic.
//! Every handled message records the member and epoch that handled it, so the test checks from records
//! that a shard never had two owners at once (owner tokens only grow), per-key order held, and that
//! nothing was lost but what Redis's asynchronous replication lost (entries acknowledged by the old
//! master during the failover and never replicated), which it counts and prints.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stream_listener::connection::{ConnectOptions, Connection, RedisTarget};
use stream_listener::coordinator::metadata::GroupConfig;
use stream_listener::preflight::{self, Failure, Refusal};
use stream_listener::producer::ProducerConfig;
use stream_listener::redact::RedisUrl;
use stream_listener::store::GroupStore;
use stream_listener::tls::TlsFiles;
use stream_listener::topology::Topology;
use stream_listener::{ConsumerBuilder, Message, Producer, RunningRuntime, Runtime};
use stream_listener_test_support::aio::{
    command_calls, info, info_field, wait_until, wait_until_async,
};
use stream_listener_test_support::RedisSentinels;
use stream_listener_tests::Order;
use tokio::time::Instant;

const TIMING: GroupConfig = GroupConfig {
    heartbeat_interval_ms: 100,
    session_timeout_ms: 3_000,
    rebalance_timeout_ms: 6_000,
};
const SHARDS: u32 = 8;
const KEYS: u32 = 16;

/// One handled message: key, seq, shard, member, member epoch, when.
type Seen = Arc<Mutex<Vec<(String, u32, u32, String, i64, Instant)>>>;

async fn connect(url: &str) -> Connection {
    RedisTarget::open(url)
        .unwrap()
        .connect(ConnectOptions::default())
        .await
        .unwrap()
}

/// The port of the node `conn` talks to (`INFO server`).
async fn port_of(conn: &mut Connection) -> u16 {
    info_field(&info(conn, "server").await, "tcp_port").expect("tcp_port")
}

fn start(
    url: &str,
    stream: &str,
    member: &str,
    seen: Seen,
) -> impl std::future::Future<Output = RunningRuntime> {
    start_with_tls(url, TlsFiles::default(), stream, member, seen)
}

/// A runtime with one consumer of `stream` that records every message it handles in `seen`.
fn start_with_tls(
    url: &str,
    tls: TlsFiles,
    stream: &str,
    member: &str,
    seen: Seen,
) -> impl std::future::Future<Output = RunningRuntime> {
    // Nothing trimmed: what the new master lacks was lost, not handled and trimmed.
    let builder = ConsumerBuilder::new(stream, "g")
        .member_id(member)
        .without_retention()
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
                    Instant::now(),
                ));
                Ok::<(), String>(())
            }
        });
    let runtime = Runtime::new(url)
        .without_default_logging()
        .without_annotated_listeners()
        .group_config(TIMING)
        .tls(tls)
        .consumer(builder);
    async move { runtime.start().await.unwrap() }
}

fn handled(seen: &Seen) -> BTreeSet<(String, u32)> {
    seen.lock()
        .unwrap()
        .iter()
        .map(|(k, s, ..)| (k.clone(), *s))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_skips_dead_and_frozen_sentinels_and_refuses_an_unknown_master_name() {
    let mut sentinels = RedisSentinels::start(1);
    let url = sentinels.url();
    let master = sentinels.master_port();
    let mut conn = connect(&url).await;
    assert_eq!(port_of(&mut conn).await, master);

    // A name no sentinel monitors is a start error, at once, naming the cause.
    let unknown = url.replace("/sl-master", "/no-such-master");
    let target = RedisTarget::open(&unknown).unwrap();
    let started = Instant::now();
    match preflight::check(&target, &RedisUrl::new(unknown.clone())).await {
        Err(Failure::Permanent(refused)) => {
            assert_eq!(refused.refusal, Refusal::UnknownSentinelMaster);
            assert!(refused.to_string().contains("no-such-master"), "{refused}");
        }
        other => panic!("an unknown master name was not refused: {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    let error = Producer::connect(&unknown, "orders").await.unwrap_err();
    assert!(
        error.to_string().contains("no sentinel monitors"),
        "{error}"
    );

    // The first sentinel frozen, the second dead: the third still names the master, within a step of the
    // frozen one's timeout, for a fresh connection and for a start's check.
    let frozen = sentinels.sentinel_pid(0).unwrap();
    signal(frozen, "STOP");
    sentinels.kill_sentinel(1);
    let target = RedisTarget::open(&url).unwrap();
    let mut conn = target.connect(ConnectOptions::default()).await.unwrap();
    assert_eq!(port_of(&mut conn).await, master);
    preflight::check(&target, &RedisUrl::new(url.clone()))
        .await
        .expect("the start's check passes through the third sentinel");
    signal(frozen, "CONT");

    // No sentinel at all: a transient failure (a start keeps trying), not a refusal.
    sentinels.kill_sentinel(0);
    sentinels.kill_sentinel(2);
    match preflight::check(&target, &RedisUrl::new(url)).await {
        Err(Failure::Transient(error)) => {
            assert!(error.to_string().contains("no master found"), "{error}")
        }
        other => panic!("no sentinel should be transient: {other:?}"),
    }
}

fn signal(pid: u32, name: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_follows_the_master_through_a_failover_and_never_resends() {
    let sentinels = RedisSentinels::start(1);
    let url = sentinels.url();
    let old = sentinels.master_port();
    let mut conn = connect(&url).await;
    let _: () = redis::cmd("SET")
        .arg("before")
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let new = tokio::task::block_in_place(|| sentinels.failover()).unwrap();
    assert_ne!(old, new);
    // The old master killed our connection when it was demoted: the next command fails or already goes
    // to the new master; the ones after it go there.
    let mut failures = 0;
    wait_until_async(
        "the connection reaches the new master",
        Duration::from_secs(30),
        || {
            let mut conn = conn.clone();
            async move {
                let reply: redis::RedisResult<String> = redis::cmd("INFO")
                    .arg("server")
                    .query_async(&mut conn)
                    .await;
                reply.is_ok_and(|text| info_field::<u16>(&text, "tcp_port") == Some(new))
            }
        },
    )
    .await;
    for _ in 0..10 {
        let written: redis::RedisResult<i64> =
            redis::cmd("INCR").arg("after").query_async(&mut conn).await;
        if written.is_err() {
            failures += 1;
        }
    }
    assert_eq!(failures, 0, "commands failed after the connection moved");
    // Written once each, on the new master (a lost reply would have been reported, not sent again).
    let mut direct =
        stream_listener_test_support::aio::connect(&format!("redis://127.0.0.1:{new}")).await;
    let after: i64 = redis::cmd("GET")
        .arg("after")
        .query_async(&mut direct)
        .await
        .unwrap();
    assert_eq!(after, 10);
    let before: i64 = redis::cmd("GET")
        .arg("before")
        .query_async(&mut direct)
        .await
        .unwrap();
    assert_eq!(before, 1, "replicated before the failover");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_groups_waits_and_wake_ups_move_to_the_new_master() {
    let sentinels = RedisSentinels::start(1);
    let url = sentinels.url();
    let stream = "idle";
    let mut conn = connect(&url).await;
    Topology::ensure(&mut conn, stream, 4).await.unwrap();
    let seen: Seen = Arc::default();
    let a = start(&url, stream, "a", seen.clone()).await;
    let producer = Producer::connect(&url, stream).await.unwrap();
    send_and_handle(&producer, &seen, 0..4, "the first entries").await;
    let old = sentinels.master_port();
    let old_conn =
        stream_listener_test_support::aio::connect(&format!("redis://127.0.0.1:{old}")).await;
    let blocked = |text: String| info_field::<u64>(&text, "blocked_clients").unwrap_or(0);
    wait_until_async(
        "the idle wait blocks on the old master",
        Duration::from_secs(30),
        || {
            let mut c = old_conn.clone();
            async move { blocked(info(&mut c, "clients").await) >= 1 }
        },
    )
    .await;
    let new = tokio::task::block_in_place(|| sentinels.failover()).unwrap();
    let new_conn =
        stream_listener_test_support::aio::connect(&format!("redis://127.0.0.1:{new}")).await;
    wait_until_async(
        "the idle wait blocks on the new master",
        Duration::from_secs(30),
        || {
            let mut c = new_conn.clone();
            async move { blocked(info(&mut c, "clients").await) >= 1 }
        },
    )
    .await;
    wait_until_async(
        "the wake-up subscription moved to the new master",
        Duration::from_secs(30),
        || {
            let mut c = new_conn.clone();
            async move {
                let channels: Vec<String> = redis::cmd("PUBSUB")
                    .arg("CHANNELS")
                    .query_async(&mut c)
                    .await
                    .unwrap_or_default();
                !channels.is_empty()
            }
        },
    )
    .await;
    // Nothing of ours is left on the old master, now a replica.
    let mut old_conn =
        stream_listener_test_support::aio::connect(&format!("redis://127.0.0.1:{old}")).await;
    let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut old_conn).await.unwrap();
    assert_eq!(
        redis::from_redis_value_ref::<String>(&role[0]).unwrap(),
        "slave"
    );
    // The failover killed the producer's connection too: a send on it fails (it is never sent twice),
    // the next one goes to the new master.
    send_and_handle(
        &producer,
        &seen,
        4..8,
        "the entries sent after the failover",
    )
    .await;
    a.stop().await.unwrap();
}

/// What the producer had acknowledged: (key, seq) -> when the send returned.
type Sent = Arc<Mutex<BTreeMap<(String, u32), Instant>>>;

/// Sends `order` under its key, retrying a failed send (the failover) for up to 30 s.
async fn send_retrying(producer: &Producer, order: &Order) {
    let start = Instant::now();
    loop {
        match producer.send(&order.key, order).await {
            Ok(_) => return,
            Err(error) => {
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "send failed for 30 s: {error}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Whether every one of `members` members owns shards and nothing is in motion (the group's projection).
async fn settled(conn: Connection, stream: &str, members: usize) -> bool {
    let Ok(mut store) = GroupStore::open(conn, stream, "g") else {
        return false;
    };
    let Ok(Some(view)) = store.projection().await else {
        return false;
    };
    view.members.len() == members
        && view
            .members
            .iter()
            .all(|m| !m.owned.is_empty() && m.pending.is_empty() && m.revoking.is_empty())
}

/// Sends `k0`'s orders `seqs` (retrying through a failover), then waits until every order up to
/// `seqs.end` was handled.
async fn send_and_handle(producer: &Producer, seen: &Seen, seqs: std::ops::Range<u32>, what: &str) {
    let all = seqs.end as usize;
    for seq in seqs {
        send_retrying(
            producer,
            &Order {
                key: "k0".into(),
                seq,
            },
        )
        .await;
    }
    wait_until(what, Duration::from_secs(30), || handled(seen).len() == all).await;
}

/// The producer's bound: rounds of one order per key.
const MAX_ROUNDS: u32 = 2_000;

/// Sends orders for every key, round by round, until `stop` is set (at most [`MAX_ROUNDS`] rounds).
async fn produce(
    url: String,
    stream: &'static str,
    config: ProducerConfig,
    sent: Sent,
    stop: Arc<AtomicBool>,
) {
    let producer = Producer::connect_with_config(&url, stream, config)
        .await
        .unwrap();
    for seq in 0..MAX_ROUNDS {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        for k in 0..KEYS {
            let key = format!("k{k}");
            send_retrying(
                &producer,
                &Order {
                    key: key.clone(),
                    seq,
                },
            )
            .await;
            sent.lock().unwrap().insert((key, seq), Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The (key, seq) of every entry in the stream's shards, on the master `conn` reaches.
async fn stored(conn: &mut Connection, stream: &str) -> BTreeSet<(String, u32)> {
    let mut out = BTreeSet::new();
    for shard in 0..SHARDS {
        let entries: Vec<(String, BTreeMap<String, Vec<u8>>)> =
            stream_listener_test_support::aio::xrange(conn, &format!("{stream}:{shard}")).await;
        for (_, fields) in entries {
            let order: Order = serde_json::from_slice(&fields["p"]).unwrap();
            out.insert((order.key, order.seq));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_under_traffic_loses_only_unreplicated_writes_and_never_gives_a_shard_two_owners(
) {
    failover_under_traffic(&[], ProducerConfig::default(), RedisSentinels::failover).await;
}

/// With the producer's `min_replicas` at 1, a send succeeds only once the replica has its write
/// (`WAIT`): writes the old master takes after its replica was promoted are never acknowledged, and
/// sent again to the new master. Nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_producers_min_replicas_a_failover_under_traffic_loses_nothing_acknowledged() {
    let config = ProducerConfig {
        min_replicas: 1,
        replica_timeout: Duration::from_millis(500),
        ..ProducerConfig::default()
    };
    failover_under_traffic(&[], config, RedisSentinels::failover).await;
}

/// With `min-replicas-to-write 1` the old master refuses writes as soon as its replica is promoted
/// (the replication link closes), instead of accepting them until the sentinels announce the switch;
/// the new master refuses them too until the old one replicates from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_min_replicas_to_write_a_failover_under_traffic_pauses_writes_instead_of_losing_them()
{
    failover_under_traffic(
        &["--min-replicas-to-write", "1"],
        ProducerConfig::default(),
        RedisSentinels::failover,
    )
    .await;
}

/// A master frozen (SIGSTOP) past the sentinels' down-after time: they fail over to the replica, and
/// the commands stuck on the frozen one time out and go to the new master; thawed, the old master is a
/// second master for a while, which nobody writes to any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_master_is_failed_over_and_consumption_moves_to_the_new_one() {
    failover_under_traffic(
        &[],
        ProducerConfig::default(),
        RedisSentinels::freeze_master_until_failed_over,
    )
    .await;
}

/// Three runtimes consume while a producer writes; a settled group is failed over by `fail_over`;
/// checks and prints what happened (the table of the module docs).
/// With the producer's `min_replicas`, nothing it acknowledged may be lost.
async fn failover_under_traffic(
    node_args: &[&str],
    producer: ProducerConfig,
    fail_over: fn(&RedisSentinels) -> std::io::Result<u16>,
) {
    let replicated = producer.min_replicas > 0;
    let sentinels = RedisSentinels::start_with(1, node_args);
    let url = sentinels.url();
    let stream = "orders";
    let mut conn = connect(&url).await;
    Topology::ensure(&mut conn, stream, SHARDS).await.unwrap();
    let seen: Seen = Arc::default();
    let a = start(&url, stream, "a", seen.clone()).await;
    let b = start(&url, stream, "b", seen.clone()).await;
    let c = start(&url, stream, "c", seen.clone()).await;
    let sent: Sent = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let producer = tokio::spawn(produce(
        url.clone(),
        stream,
        producer,
        sent.clone(),
        stop.clone(),
    ));
    wait_until("first messages", Duration::from_secs(30), || {
        handled(&seen).len() >= 100
    })
    .await;
    // Fail over a settled group, so that owner changes after it are the failover's.
    wait_until_async("the three members settled", Duration::from_secs(30), || {
        settled(conn.clone(), stream, 3)
    })
    .await;
    let failover_start = Instant::now();
    let new = tokio::task::block_in_place(|| fail_over(&sentinels)).unwrap();
    let failover_end = Instant::now();
    wait_until(
        "traffic after the failover",
        Duration::from_secs(60),
        || {
            sent.lock()
                .unwrap()
                .values()
                .filter(|at| **at > failover_end)
                .count()
                >= 10 * KEYS as usize
        },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    producer.await.unwrap();
    let acknowledged = sent.lock().unwrap().clone();

    // Everything the new master holds is handled; what it lacks was acknowledged by the old master
    // during the failover and never replicated.
    let mut on_new = connect(&format!("redis://127.0.0.1:{new}")).await;
    let present = stored(&mut on_new, stream).await;
    wait_until(
        "every stored entry handled",
        Duration::from_secs(60),
        || present.is_subset(&handled(&seen)),
    )
    .await;
    // Behind Sentinel too, the idle wait is a group read (on the member's own node), never an `XREAD`.
    let calls = command_calls(&mut on_new).await;
    assert_eq!(calls.get("xread"), None, "{calls:?}");
    assert!(calls.get("xreadgroup").is_some_and(|n| *n > 0), "{calls:?}");
    let _ = a.stop().await;
    let _ = b.stop().await;
    let _ = c.stop().await;
    // Lost: acknowledged to the producer and not on the new master (nothing is trimmed). Only the old
    // master's last writes, never replicated, may be; some of them were handled before they were lost.
    let lost: Vec<_> = acknowledged
        .iter()
        .filter(|(entry, _)| !present.contains(*entry))
        .collect();
    assert!(
        !replicated || lost.is_empty(),
        "acknowledged after the replica had them, and lost: {lost:?}"
    );
    for (entry, at) in &lost {
        assert!(
            **at + Duration::from_secs(1) >= failover_start && **at <= failover_end,
            "{entry:?} was acknowledged outside the failover and is not on the new master"
        );
    }
    let ever_handled = handled(&seen);
    let never_handled = lost
        .iter()
        .filter(|(e, _)| !ever_handled.contains(*e))
        .count();
    let last_lost = lost
        .iter()
        .map(|(_, at)| at.saturating_duration_since(failover_start))
        .max();

    let seen = seen.lock().unwrap();
    // Per shard, owners follow one another with growing tokens and never come back: no two owners.
    let mut owners: BTreeMap<u32, Vec<(&str, i64)>> = BTreeMap::new();
    for (_, _, shard, member, epoch, _) in seen.iter() {
        let list = owners.entry(*shard).or_default();
        if list.last() != Some(&(member.as_str(), *epoch)) {
            if let Some((_, last)) = list.last() {
                assert!(
                    *epoch > *last,
                    "shard {shard}: token went back to ({member}, {epoch}) after {list:?}"
                );
            }
            list.push((member, *epoch));
        }
    }
    // Per key, first deliveries in order.
    let mut by_key: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    let mut firsts = BTreeSet::new();
    for (key, seq, ..) in seen.iter() {
        if firsts.insert((key.clone(), *seq)) {
            by_key.entry(key).or_default().push(*seq);
        }
    }
    for (key, seqs) in &by_key {
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "{key}: out of order {seqs:?}"
        );
    }
    // Consumption resumed without restarts: entries sent after the failover were handled. How long
    // handling stopped: the longest gap between two handlings from the failover's start on.
    assert!(
        seen.iter().any(|(key, seq, ..)| acknowledged
            .get(&(key.clone(), *seq))
            .is_some_and(|at| *at > failover_end)),
        "no entry sent after the failover was handled"
    );
    let times: Vec<Instant> = seen
        .iter()
        .map(|(.., at)| *at)
        .filter(|at| *at >= failover_start)
        .collect();
    let longest_gap = times
        .windows(2)
        .map(|w| w[1].saturating_duration_since(w[0]))
        .max()
        .unwrap_or_default();
    let changes_during: usize = {
        let mut last: BTreeMap<u32, (&str, i64)> = BTreeMap::new();
        let mut changes = 0;
        for (_, _, shard, member, epoch, at) in seen.iter() {
            let token = (member.as_str(), *epoch);
            if let Some(previous) = last.insert(*shard, token) {
                if previous != token && *at >= failover_start {
                    changes += 1;
                }
            }
        }
        changes
    };
    println!(
        "data nodes with {node_args:?}, producer's min_replicas {}:\n\
         | produced (acknowledged) | lost (unreplicated; never handled; last at) | handled | duplicates | overlaps | owner changes (during the failover) | failover (fault to settled) | longest pause in handling |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- |\n\
         | {} | {} ({never_handled}; {}) | {} | {} | 0 | {} ({changes_during}) | {:.2} s | {:.2} s |",
        u32::from(replicated),
        acknowledged.len(),
        lost.len(),
        last_lost.map_or("-".into(), |at| format!("+{:.2} s", at.as_secs_f64())),
        firsts.len(),
        seen.len() - firsts.len(),
        owners.values().map(|o| o.len() - 1).sum::<usize>(),
        (failover_end - failover_start).as_secs_f64(),
        longest_gap.as_secs_f64(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_sentinel_reaches_a_tls_deployment_and_follows_its_failover() {
    // Skipped without openssl outside CI (see `tls::openssl_available`).
    let Some(sentinels) = RedisSentinels::start_tls(1) else {
        return;
    };
    let url = sentinels.url();
    assert!(url.starts_with("rediss+sentinel://"), "{url}");
    // Without our authority the sentinels' certificates are refused: a start error, not "no master".
    match preflight::check(
        &RedisTarget::open(&url).unwrap(),
        &RedisUrl::new(url.clone()),
    )
    .await
    {
        Err(Failure::Permanent(refused)) => assert_eq!(refused.refusal, Refusal::Certificate),
        other => panic!("an untrusted certificate was not refused: {other:?}"),
    }
    let files = TlsFiles {
        ca_cert: sentinels.tls_file("ca.pem"),
        ..TlsFiles::default()
    };
    let stream = "secure";
    let mut conn = RedisTarget::open(&url)
        .unwrap()
        .with_tls(files.load().unwrap())
        .unwrap()
        .connect(ConnectOptions::default())
        .await
        .unwrap();
    assert_eq!(port_of(&mut conn).await, sentinels.master_port());
    Topology::ensure(&mut conn, stream, 2).await.unwrap();
    let producer = Producer::connect_with_tls(&url, stream, &files)
        .await
        .unwrap();
    let seen: Seen = Arc::default();
    let running = start_with_tls(&url, files.clone(), stream, "a", seen.clone()).await;
    send_and_handle(
        &producer,
        &seen,
        0..4,
        "the entries sent before the failover",
    )
    .await;
    let new = tokio::task::block_in_place(|| sentinels.failover()).unwrap();
    send_and_handle(
        &producer,
        &seen,
        4..8,
        "the entries sent after the failover",
    )
    .await;
    wait_until_async(
        "the shared connection on the new master",
        Duration::from_secs(30),
        || {
            let mut conn = conn.clone();
            async move {
                let reply: redis::RedisResult<String> = redis::cmd("INFO")
                    .arg("server")
                    .query_async(&mut conn)
                    .await;
                reply.is_ok_and(|text| info_field::<u16>(&text, "tcp_port") == Some(new))
            }
        },
    )
    .await;
    running.stop().await.unwrap();
}
