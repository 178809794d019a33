//! Error classification end to end, single and batch handlers on a real Redis: a permanent error is
//! dead-lettered on its first delivery (and says so in the dead letter), `retry_after` waits what the
//! handler asked instead of the backoff. Set up and synchronised with the test kit's waits.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use stream_listener::consumer::dead_letter_fields as dlq;
use stream_listener::{
    ConsumerBuilder, FailurePolicy, HandlerError, Message, Producer, RunningRuntime,
};
use stream_listener_test_support::aio::{connect, info, info_field, xrange};
use stream_listener_test_support::RedisServer;
use stream_listener_tests::{test_runtime, Order};

/// Every call of a handler: when, the delivery count, the entry ids.
type Calls = Arc<Mutex<Vec<(Instant, u32, Vec<String>)>>>;

const WAIT: Duration = Duration::from_secs(30);

/// Retries come at once unless the handler asks otherwise: the backoff is 1 ms, its bound 10 s.
fn quick(max_deliveries: u32) -> FailurePolicy {
    FailurePolicy::default()
        .max_deliveries(max_deliveries)
        .initial_backoff(Duration::from_millis(1))
        .max_backoff(Duration::from_secs(10))
}

fn order(key: &str, seq: u32) -> (String, Order) {
    (
        key.to_owned(),
        Order {
            key: key.to_owned(),
            seq,
        },
    )
}

/// Writes `orders` to the one-shard `stream`, then starts `builder` (so a batch handler's first read
/// has them all) and waits until it owns the shard.
async fn start(
    redis: &RedisServer,
    stream: &str,
    orders: &[(String, Order)],
    builder: ConsumerBuilder,
) -> RunningRuntime {
    start_at(&redis.url(), stream, orders, builder).await
}

/// [`start`] at `url`.
async fn start_at(
    url: &str,
    stream: &str,
    orders: &[(String, Order)],
    builder: ConsumerBuilder,
) -> RunningRuntime {
    let producer = Producer::connect_creating(url, stream, 1).await.unwrap();
    producer.send_batch(orders).await.unwrap();
    let running = test_runtime(url).consumer(builder).start().await.unwrap();
    let id = running.listener_ids().remove(0);
    assert_eq!(running.wait_until_assigned(&id, WAIT).await.unwrap(), [0]);
    running
}

/// The dead letters of `stream`, oldest first.
async fn dead_letters(redis: &RedisServer, stream: &str) -> Vec<HashMap<String, String>> {
    let mut conn = connect(&redis.url()).await;
    xrange::<HashMap<String, String>>(&mut conn, &format!("{stream}:dlq"))
        .await
        .into_iter()
        .map(|(_, fields)| fields)
        .collect()
}

fn record(calls: &Calls, delivery_count: u32, ids: Vec<String>) {
    calls
        .lock()
        .unwrap()
        .push((Instant::now(), delivery_count, ids));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_error_dead_letters_a_single_entry_on_its_first_delivery() {
    let redis = RedisServer::start();
    let calls: Calls = Arc::default();
    let seen = calls.clone();
    let builder =
        ConsumerBuilder::new("perm", "g")
            .failure(quick(3))
            .handler(move |msg: Message<Order>| {
                record(&seen, msg.delivery_count, vec![msg.payload.key.clone()]);
                async move {
                    match msg.payload.key.as_str() {
                        "bad" => Err(HandlerError::permanent("an order of nothing")),
                        "flaky" => Err(HandlerError::msg("dependency down")),
                        _ => Ok(()),
                    }
                }
            });
    let orders = [order("bad", 0), order("flaky", 1), order("good", 2)];
    let running = start(&redis, "perm", &orders, builder).await;
    running.wait_until_idle("perm", "g", WAIT).await.unwrap();
    running.stop().await.unwrap();

    let mut deliveries: HashMap<String, Vec<u32>> = HashMap::new();
    for (_, count, keys) in calls.lock().unwrap().iter() {
        deliveries.entry(keys[0].clone()).or_default().push(*count);
    }
    assert_eq!(deliveries["bad"], [1], "no retry of a permanent error");
    assert_eq!(
        deliveries["flaky"],
        [1, 2, 3],
        "a transient error uses every delivery"
    );
    assert_eq!(deliveries["good"], [1]);
    let letters = dead_letters(&redis, "perm").await;
    let summary: Vec<(&str, &str, &str, &str)> = letters
        .iter()
        .map(|l| {
            (
                l["k"].as_str(),
                l[dlq::ERROR].as_str(),
                l[dlq::DELIVERY_COUNT].as_str(),
                l[dlq::PERMANENT].as_str(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("bad", "an order of nothing", "1", "true"),
            ("flaky", "dependency down", "3", "false"),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_error_dead_letters_a_whole_batch_on_its_first_delivery() {
    let redis = RedisServer::start();
    let calls: Calls = Arc::default();
    let seen = calls.clone();
    let builder = ConsumerBuilder::new("perm-batch", "g")
        .failure(quick(5))
        .batch_handler(move |batch: Vec<Message<Order>>| {
            let ids = batch.iter().map(|m| m.id.clone()).collect();
            record(&seen, batch[0].delivery_count, ids);
            async move {
                if batch.iter().any(|m| m.payload.seq == 1) {
                    return Err(HandlerError::permanent("seq 1 is poison"));
                }
                Ok(())
            }
        });
    let orders = [order("a", 0), order("a", 1), order("a", 2)];
    let running = start(&redis, "perm-batch", &orders, builder).await;
    running
        .wait_until_idle("perm-batch", "g", WAIT)
        .await
        .unwrap();
    running.stop().await.unwrap();

    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 1, "one call, no retry: {calls:?}");
    assert_eq!(calls[0].2.len(), 3, "the three entries in one batch");
    let letters = dead_letters(&redis, "perm-batch").await;
    assert_eq!(letters.len(), 3);
    for letter in &letters {
        assert_eq!(letter[dlq::ERROR], "seq 1 is poison");
        assert_eq!(letter[dlq::DELIVERY_COUNT], "1");
        assert_eq!(letter[dlq::PERMANENT], "true");
    }
}

/// The letters of a batch go as one transaction, which the documented ACL must allow: a refused
/// `MULTI` broke redis-rs's count of replies (it panicked). Run as a user with only
/// `preflight::ACL_COMMANDS`, a batch handler's permanent error dead-letters every entry of its batch,
/// in one transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_with_only_the_documented_commands_dead_letters_a_whole_batch() {
    let redis = RedisServer::start();
    let stream = "acl-batch";
    let mut admin = connect(&redis.url()).await;
    let mut setuser = redis::cmd("ACL");
    setuser
        .arg(&["SETUSER", "app", "on", ">app-pw", "resetkeys", "~sl:*"])
        .arg(format!("~{stream}:*"))
        .arg(&["resetchannels", "&sl:*"])
        .arg(stream_listener::preflight::ACL_COMMANDS);
    let () = setuser.query_async(&mut admin).await.unwrap();
    let as_user = format!("redis://app:app-pw@127.0.0.1:{}/", redis.port());
    let calls: Calls = Arc::default();
    let seen = calls.clone();
    let builder = ConsumerBuilder::new(stream, "g")
        .failure(quick(5))
        .batch_handler(move |batch: Vec<Message<Order>>| {
            let ids = batch.iter().map(|m| m.id.clone()).collect();
            record(&seen, batch[0].delivery_count, ids);
            async { Err::<(), _>(HandlerError::permanent("poison")) }
        });
    let orders: Vec<(String, Order)> = (0..5).map(|i| order("a", i)).collect();
    let running = start_at(&as_user, stream, &orders, builder).await;
    running.wait_until_idle(stream, "g", WAIT).await.unwrap();
    running.stop().await.unwrap();

    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 1, "one call, no retry: {calls:?}");
    assert_eq!(calls[0].2.len(), 5, "the five entries in one batch");
    let letters = dead_letters(&redis, stream).await;
    let ids: Vec<&str> = letters.iter().map(|l| l[dlq::SOURCE_ID].as_str()).collect();
    assert_eq!(ids, calls[0].2, "each entry dead-lettered once, in order");
    let stats = info(&mut admin, "commandstats").await;
    let execs: u64 = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_exec:calls="))
        .and_then(|l| l.split(',').next()?.parse().ok())
        .unwrap_or(0);
    // One for the producer's batch (one key, five times), one for the letters.
    assert_eq!(execs, 2, "the letters in one transaction: {stats}");
}

/// An entry of many fields is dead-lettered whole (a letter copies every field; a Lua script could not
/// take more than about 8,000 arguments). Two undecodable entries (no payload), one of 4,000 fields,
/// written before the consumer starts: both letters hold every field of their entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_of_thousands_of_fields_is_dead_lettered_whole() {
    let redis = RedisServer::start();
    let stream = "long-letter";
    let producer = Producer::connect_creating(&redis.url(), stream, 1)
        .await
        .unwrap();
    let shard_stream = producer.topology().stream_key(0);
    let mut conn = connect(&redis.url()).await;
    for fields in [2, 4_000] {
        let mut xadd = redis::cmd("XADD");
        xadd.arg(&shard_stream).arg("*").arg("k").arg("a");
        for i in 0..fields {
            xadd.arg(format!("f{i}")).arg(i);
        }
        let _: String = xadd.query_async(&mut conn).await.unwrap();
    }
    let builder = ConsumerBuilder::new(stream, "g")
        .failure(quick(5))
        .batch_handler(|_: Vec<Message<Order>>| async { Ok::<(), HandlerError>(()) });
    let running = start(&redis, stream, &[], builder).await;
    running.wait_until_idle(stream, "g", WAIT).await.unwrap();
    running.stop().await.unwrap();

    let letters = dead_letters(&redis, stream).await;
    assert_eq!(letters.len(), 2, "each entry dead-lettered once");
    for (letter, fields) in letters.iter().zip([2, 4_000]) {
        assert_eq!(letter[dlq::PERMANENT], "true");
        assert!((0..fields).all(|i| letter[&format!("f{i}")] == i.to_string()));
    }
}

/// Runs a handler that fails its first attempt with `retry_after(wait)` and then succeeds; returns its
/// calls.
async fn retried_after(
    stream: &str,
    wait: Duration,
    batch: bool,
) -> (Vec<(Instant, u32, Vec<String>)>, usize) {
    let redis = RedisServer::start();
    let calls: Calls = Arc::default();
    let seen = calls.clone();
    let answer = move |calls: &Calls| {
        if calls.lock().unwrap().len() == 1 {
            Err(HandlerError::retry_after("rate limited", wait))
        } else {
            Ok(())
        }
    };
    let builder = ConsumerBuilder::new(stream, "g").failure(quick(5));
    let builder = if batch {
        builder.batch_handler(move |batch: Vec<Message<Order>>| {
            record(
                &seen,
                batch[0].delivery_count,
                batch.iter().map(|m| m.id.clone()).collect(),
            );
            let result = answer(&seen);
            async move { result }
        })
    } else {
        builder.handler(move |msg: Message<Order>| {
            record(&seen, msg.delivery_count, vec![msg.id.clone()]);
            let result = answer(&seen);
            async move { result }
        })
    };
    let orders = [order("a", 0), order("a", 1), order("a", 2)];
    let running = start(&redis, stream, &orders, builder).await;
    running.wait_until_idle(stream, "g", WAIT).await.unwrap();
    running.stop().await.unwrap();
    let letters = dead_letters(&redis, stream).await.len();
    let calls = calls.lock().unwrap().clone();
    (calls, letters)
}

/// A lower bound only. The consumer's clock counts whole milliseconds (the scheduler's `now`, taken
/// after the handler returned, is truncated), so the retry may come up to 1 ms before `wait` has passed
/// since the handler was called; without `retry_after` it would come after the 1 ms backoff.
fn assert_waited(gap: Duration, wait: Duration) {
    assert!(
        gap + Duration::from_millis(1) >= wait,
        "retried after {gap:?}, asked for {wait:?} (the backoff is 1 ms)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_waits_what_the_single_handler_asked_instead_of_the_backoff() {
    let wait = Duration::from_millis(400);
    let (calls, letters) = retried_after("later", wait, false).await;
    assert_eq!(letters, 0);
    // The first entry twice (its second delivery after the wait), then the two others.
    let deliveries: Vec<(u32, &str)> = calls
        .iter()
        .map(|(_, n, ids)| (*n, ids[0].as_str()))
        .collect();
    assert_eq!(deliveries.len(), 4, "{deliveries:?}");
    assert_eq!(deliveries[0].1, deliveries[1].1);
    assert_eq!((deliveries[0].0, deliveries[1].0), (1, 2));
    assert_waited(calls[1].0 - calls[0].0, wait);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_waits_what_the_batch_handler_asked_instead_of_the_backoff() {
    let wait = Duration::from_millis(400);
    let (calls, letters) = retried_after("later-batch", wait, true).await;
    assert_eq!(letters, 0);
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(calls[0].2.len(), 3, "the three entries in one batch");
    assert_eq!(calls[0].2, calls[1].2, "the same batch again");
    assert_eq!((calls[0].1, calls[1].1), (1, 2));
    assert_waited(calls[1].0 - calls[0].0, wait);
}

/// How many `XADD`s Redis refused for memory (`INFO commandstats`; one queued in a transaction too).
async fn xadds_refused_for_memory(redis: &RedisServer) -> u64 {
    let text = info(&mut connect(&redis.url()).await, "commandstats").await;
    text.lines()
        .find_map(|l| l.strip_prefix("cmdstat_xadd:"))
        .and_then(|l| l.split(',').find_map(|f| f.strip_prefix("rejected_calls=")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Fault: Redis runs out of memory while the consumer dead-letters batches (each letter copies a 1 KB
/// entry). A job's letters go as one transaction, refused whole while memory is full and written whole
/// once it is not, so every entry is dead-lettered exactly once. As a plain pipeline, the letters ahead
/// of the one that crossed `maxmemory` were written, and the retry wrote them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_refused_for_memory_are_written_once_each() {
    const N: u32 = 2_000;
    let redis = RedisServer::start();
    let stream = "oom-letters";
    let pad = "x".repeat(1_000);
    let orders: Vec<(String, Order)> = (0..N).map(|i| order(&format!("{i:05}-{pad}"), i)).collect();
    // The handler holds its first call until memory is nearly full.
    let (open, gate) = tokio::sync::watch::channel(false);
    let builder =
        ConsumerBuilder::new(stream, "g")
            .failure(quick(3))
            .handler(move |_: Message<Order>| {
                let mut gate = gate.clone();
                async move {
                    let _ = gate.wait_for(|open| *open).await;
                    Err::<(), _>(HandlerError::permanent("poison"))
                }
            });
    let running = start(&redis, stream, &orders, builder).await;
    let mut conn = connect(&redis.url()).await;
    let used: u64 = info_field(&info(&mut conn, "memory").await, "used_memory").unwrap();
    // Room for about two jobs' letters.
    let limit = (used + 256 * 1024).to_string();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(&limit)
        .query_async(&mut conn)
        .await
        .unwrap();
    open.send(true).unwrap();
    let deadline = Instant::now() + WAIT;
    while xadds_refused_for_memory(&redis).await == 0 {
        assert!(
            Instant::now() < deadline,
            "no dead letter refused for memory within {WAIT:?} (limit {limit}, {} letters)",
            dead_letters(&redis, stream).await.len()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("0")
        .query_async(&mut conn)
        .await
        .unwrap();
    running.wait_until_idle(stream, "g", WAIT).await.unwrap();
    running.stop().await.unwrap();

    let letters = dead_letters(&redis, stream).await;
    let mut copies: HashMap<&str, u32> = HashMap::new();
    for letter in &letters {
        *copies.entry(letter[dlq::SOURCE_ID].as_str()).or_default() += 1;
    }
    let twice: Vec<_> = copies.iter().filter(|(_, &n)| n > 1).collect();
    assert_eq!(copies.len() as u32, N, "some entry never dead-lettered");
    assert!(
        twice.is_empty(),
        "{} entries dead-lettered more than once, e.g. {:?}",
        twice.len(),
        &twice[..twice.len().min(3)]
    );
}
