//! The lag exporter (`stream_listener::lag`), not a member: its numbers against `XINFO GROUPS` /
//! `XPENDING` ground truth on known backlogs, with and without consumers, when Redis reports no lag
//! (after `XDEL`, after `XGROUP SETID` without `ENTRIESREAD`), the seek that keeps the lag known, bad
//! input, the cache and the commands a scrape costs. On a single node and on the shared cluster.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use stream_listener::lag::{
    read_group, set_position, GroupLag, GroupName, LagExporter, LagOptions, LagSource,
};
use stream_listener::reply::xinfo_groups;
use stream_listener::routing::shard_stream_key;
use stream_listener::{Connection, ConsumerBuilder, Message};
use stream_listener_test_support::aio::{wait_until_async, xreadgroup};
use stream_listener_test_support::RedisServer;
use stream_listener_tests::{
    on_every_target, orders, producer, stream_with_group, test_runtime, Order, Target, TestRedis,
};

/// What Redis itself says of `group` on one shard stream: `(XINFO lag, XINFO pending, XPENDING count)`.
async fn truth(conn: &mut Connection, key: &str, group: &str) -> (Option<u64>, u64, u64) {
    let reply: Value = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap();
    let info = xinfo_groups(&reply)
        .unwrap()
        .into_iter()
        .find(|g| g.name == group)
        .unwrap();
    let (count, ..): (u64, Option<String>, Option<String>, Value) = redis::cmd("XPENDING")
        .arg(key)
        .arg(group)
        .query_async(conn)
        .await
        .unwrap();
    (info.lag, info.pending.unwrap(), count)
}

/// The entries after the group's last delivered id, counted by the test (`XRANGE`, whole).
async fn entries_after_position(conn: &mut Connection, key: &str, group: &str) -> u64 {
    let reply: Value = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap();
    let last = xinfo_groups(&reply)
        .unwrap()
        .into_iter()
        .find(|g| g.name == group)
        .unwrap()
        .last_delivered_id
        .unwrap();
    let after: Vec<Value> = redis::cmd("XRANGE")
        .arg(key)
        .arg(format!("({last}"))
        .arg("+")
        .query_async(conn)
        .await
        .unwrap();
    after.len() as u64
}

/// Reads `count` entries of `key` for `group` as consumer `c` (they become pending); returns their ids.
async fn deliver(conn: &mut Connection, key: &str, group: &str, count: usize) -> Vec<String> {
    let entries = xreadgroup(conn, group, "c", count, key).await;
    assert_eq!(entries.len(), count, "{key}");
    entries
        .into_iter()
        .map(|(id, _)| String::from_utf8(id).expect("an entry id is text"))
        .collect()
}

fn regex_ids(text: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for part in text.split('"') {
        let mut halves = part.splitn(2, '-');
        if let (Some(a), Some(b)) = (halves.next(), halves.next()) {
            if !a.is_empty()
                && !b.is_empty()
                && a.bytes().all(|c| c.is_ascii_digit())
                && b.bytes().all(|c| c.is_ascii_digit())
            {
                ids.push(part.to_owned());
            }
        }
    }
    ids
}

/// Sends `n` orders to `stream` (key by key over 8 keys).
async fn produce(redis: &TestRedis, stream: &str, shards: u32, n: u32) {
    let producer = producer(redis.url(), stream, shards).await;
    producer
        .send_batch(&orders(8, 0..n.div_ceil(8))[..n as usize])
        .await
        .unwrap();
}

/// Checks every shard and the totals of `lag` against Redis, all of it from Redis's own `lag`.
async fn assert_matches_redis(conn: &mut Connection, lag: &GroupLag, group: &str) {
    let (mut total_lag, mut total_pending) = (0, 0);
    for shard in &lag.shards {
        let (redis_lag, pending, xpending) = truth(conn, &shard.stream_key, group).await;
        assert_eq!(pending, xpending);
        assert_eq!(
            (Some(shard.lag), shard.pending, shard.source),
            (redis_lag, pending, LagSource::Redis),
            "shard {}",
            shard.shard
        );
        total_lag += shard.lag;
        total_pending += pending;
    }
    assert_eq!((lag.lag, lag.pending), (total_lag, total_pending));
    assert_eq!(lag.backlog, total_lag + total_pending);
}

on_every_target!(
    known_backlog_matches_redis_without_consumers,
    nil_lag_is_counted_after_xdel_and_setid,
    seek_keeps_the_lag_known,
    live_members_and_a_drained_backlog_with_a_consumer,
);

/// 120 entries over 8 shards; on every shard the group was delivered some (so some are pending) and
/// acknowledged part of those: per shard and in total the exporter says what `XINFO GROUPS` and
/// `XPENDING` say; nobody is a member; the oldest unacknowledged entry's age is measured from its id.
async fn known_backlog_matches_redis_without_consumers(target: Target) {
    let redis = target.start();
    let (stream, group) = ("lag-known", "g");
    redis.assert_spread(stream, 8);
    let mut conn = stream_with_group(&redis, stream, 8, group).await;
    produce(&redis, stream, 8, 120).await;
    let before: u64 = 120;
    let mut delivered = 0;
    for shard in 0..8 {
        let key = shard_stream_key(stream, shard);
        let len: u64 = redis::cmd("XLEN")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        let take = (len / 2) as usize;
        if take == 0 {
            continue;
        }
        let ids = deliver(&mut conn, &key, group, take).await;
        delivered += take as u64;
        let _: u64 = redis::cmd("XACK")
            .arg(&key)
            .arg(group)
            .arg(&ids[..take / 2])
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    assert!(delivered > 0);
    let lag = read_group(&mut conn, stream, group, &LagOptions::default())
        .await
        .unwrap();
    assert_matches_redis(&mut conn, &lag, group).await;
    assert_eq!(lag.lag, before - delivered, "what was not delivered");
    assert_eq!((lag.shard_count, lag.live_members), (8, 0));
    assert!(lag.lag_exact);
    let age = lag
        .oldest_unacked_age_ms
        .expect("entries are unacknowledged");
    assert!(age < 60_000, "the entries were written just now: {age} ms");
    assert_eq!(
        lag.oldest_unacked_age_ms,
        lag.shards
            .iter()
            .filter_map(|s| s.oldest_unacked_age_ms)
            .max()
    );
}

/// `XDEL` of an entry after the group's position and `XGROUP SETID` without `ENTRIESREAD` make Redis
/// report no lag; the exporter counts the entries after the last delivered id instead (what the test
/// counts itself with a whole `XRANGE`), and with a count limit below them reports the limit as a lower
/// bound.
async fn nil_lag_is_counted_after_xdel_and_setid(target: Target) {
    let redis = target.start();
    let (stream, group) = ("lag-nil", "g");
    let mut conn = stream_with_group(&redis, stream, 2, group).await;
    produce(&redis, stream, 2, 60).await;
    let (deleted, set) = (shard_stream_key(stream, 0), shard_stream_key(stream, 1));
    // Shard 0: deliver two, then delete an undelivered entry.
    deliver(&mut conn, &deleted, group, 2).await;
    let ids: Vec<Value> = redis::cmd("XRANGE")
        .arg(&deleted)
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    let victim = regex_ids(&format!("{:?}", ids[5])).remove(0);
    let _: u64 = redis::cmd("XDEL")
        .arg(&deleted)
        .arg(&victim)
        .query_async(&mut conn)
        .await
        .unwrap();
    // Shard 1: move the group to its third entry without ENTRIESREAD.
    let ids: Vec<Value> = redis::cmd("XRANGE")
        .arg(&set)
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    let third = regex_ids(&format!("{:?}", ids[2])).remove(0);
    let _: () = redis::cmd("XGROUP")
        .arg("SETID")
        .arg(&set)
        .arg(group)
        .arg(&third)
        .query_async(&mut conn)
        .await
        .unwrap();
    for key in [&deleted, &set] {
        assert_eq!(
            truth(&mut conn, key, group).await.0,
            None,
            "{key}: Redis cannot tell"
        );
    }
    let lag = read_group(&mut conn, stream, group, &LagOptions::default())
        .await
        .unwrap();
    let mut total = 0;
    for shard in &lag.shards {
        let counted = entries_after_position(&mut conn, &shard.stream_key, group).await;
        assert!(counted > 3, "a backlog to count on {}", shard.stream_key);
        assert_eq!((shard.lag, shard.source), (counted, LagSource::Counted));
        total += counted;
    }
    assert_eq!(lag.lag, total);
    assert!(lag.lag_exact);
    assert_eq!(lag.pending, 2);
    // A count limit below the backlog: a lower bound, said so.
    let bounded = read_group(
        &mut conn,
        stream,
        group,
        &LagOptions::default().with_count_limit(3),
    )
    .await
    .unwrap();
    assert!(bounded
        .shards
        .iter()
        .all(|s| (s.lag, s.source) == (3, LagSource::AtLeast)));
    assert_eq!((bounded.lag, bounded.lag_exact), (6, false));
}

/// `set_position` (what the CLI's `seek` runs) moves the group with `ENTRIESREAD`: Redis keeps
/// reporting the lag, and it is the number of entries after the new position, including after an
/// `XDEL` before it.
async fn seek_keeps_the_lag_known(target: Target) {
    let redis = target.start();
    let (stream, group) = ("lag-seek", "g");
    let mut conn = stream_with_group(&redis, stream, 1, group).await;
    produce(&redis, stream, 1, 40).await;
    let key = shard_stream_key(stream, 0);
    let ids: Vec<Value> = redis::cmd("XRANGE")
        .arg(&key)
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    let ids: Vec<String> = ids
        .iter()
        .map(|v| regex_ids(&format!("{v:?}")).remove(0))
        .collect();
    let _: u64 = redis::cmd("XDEL")
        .arg(&key)
        .arg(&ids[3])
        .query_async(&mut conn)
        .await
        .unwrap();
    for (position, after) in [(ids[9].as_str(), 30), ("$", 0)] {
        let read = set_position(&mut conn, &key, group, position, 1_000)
            .await
            .unwrap();
        assert!(read.is_some(), "ENTRIESREAD set at {position}");
        let (lag, ..) = truth(&mut conn, &key, group).await;
        assert_eq!(lag, Some(after), "lag known after seeking to {position}");
        let exported = read_group(&mut conn, stream, group, &LagOptions::default())
            .await
            .unwrap();
        assert_eq!(
            (exported.lag, exported.shards[0].source),
            (after, LagSource::Redis)
        );
    }
    // Back to the start: the deleted entry now follows the position, and Redis reports no lag after a
    // deletion past the group's position whatever ENTRIESREAD says; the exporter counts.
    assert!(set_position(&mut conn, &key, group, "0", 1_000)
        .await
        .unwrap()
        .is_some());
    assert_eq!(truth(&mut conn, &key, group).await.0, None);
    let exported = read_group(&mut conn, stream, group, &LagOptions::default())
        .await
        .unwrap();
    assert_eq!(
        (exported.lag, exported.shards[0].source),
        (39, LagSource::Counted)
    );
    // Beyond the count limit the group still moves; Redis then cannot tell, the exporter counts.
    assert_eq!(
        set_position(&mut conn, &key, group, &ids[0], 5)
            .await
            .unwrap(),
        None
    );
    let exported = read_group(&mut conn, stream, group, &LagOptions::default())
        .await
        .unwrap();
    assert_eq!(
        (
            exported.lag,
            exported.shards[0].last_delivered_id.as_deref()
        ),
        (38, Some(ids[0].as_str()))
    );
}

/// With a consumer running: it is a live member, and once it handled everything the exporter's lag and
/// pending are 0 on every shard, as Redis says; after it stopped, it is no longer live.
async fn live_members_and_a_drained_backlog_with_a_consumer(target: Target) {
    let redis = target.start();
    let (stream, group) = ("lag-live", "g");
    redis.assert_spread(stream, 8);
    let mut conn = stream_with_group(&redis, stream, 8, group).await;
    produce(&redis, stream, 8, 80).await;
    let before = read_group(&mut conn, stream, group, &LagOptions::default())
        .await
        .unwrap();
    assert_eq!((before.lag, before.live_members), (80, 0));
    let runtime = test_runtime(redis.url())
        .consumer(
            ConsumerBuilder::new(stream, group)
                .member_id("solo")
                .handler(|_: Message<Order>| async { Ok::<(), String>(()) }),
        )
        .start()
        .await
        .unwrap();
    runtime
        .wait_until_assigned("solo", Duration::from_secs(30))
        .await
        .unwrap();
    runtime
        .wait_until_idle(stream, group, Duration::from_secs(30))
        .await
        .unwrap();
    let lag = read_group(&mut conn, stream, group, &LagOptions::default())
        .await
        .unwrap();
    assert_matches_redis(&mut conn, &lag, group).await;
    assert_eq!((lag.lag, lag.pending, lag.live_members), (0, 0, 1));
    assert_eq!(lag.oldest_unacked_age_ms, None);
    let _ = runtime.stop().await;
    let after = read_group(&mut conn, stream, group, &LagOptions::default())
        .await
        .unwrap();
    assert_eq!(after.live_members, 0, "a member that left has no lease");
}

use stream_listener_test_support::http::get;

async fn get_async(addr: SocketAddr, path: &'static str) -> (u16, String) {
    tokio::task::spawn_blocking(move || get(addr, path))
        .await
        .unwrap()
}

/// The commands a client sent to a single node, by `INFO commandstats` (commands a script runs count
/// there too, under their own names: only the names a scrape sends itself are summed, plus `INFO`).
async fn commands_processed(conn: &mut Connection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.split_once(":calls=")?;
            let sent = [
                "cmdstat_evalsha",
                "cmdstat_eval",
                "cmdstat_hmget",
                "cmdstat_info",
            ];
            sent.contains(&name)
                .then(|| rest.split(',').next()?.parse::<u64>().ok())
                .flatten()
        })
        .sum()
}

/// Served over HTTP: a good group answers 200 with its numbers (the KEDA body), an unknown stream 404
/// and a corrupt topology 503, each with its error, while the good one keeps being served and
/// `/metrics` carries all three (`up` 0 with the error for the bad ones). A scrape costs
/// `1 + shards + 2` commands per group once the scripts are cached, a scrape within the cache period
/// none, and eight concurrent scrapes after it expired as much as one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_with_errors_per_group_a_cache_and_o_shards_commands() {
    let server = RedisServer::start();
    let redis_url = server.url();
    let mut conn = stream_listener_tests::connection(&redis_url).await;
    let producer = producer(&redis_url, "served", 4).await;
    stream_listener::topology::Topology::ensure_group(
        &mut conn,
        "served",
        "g",
        stream_listener::topology::StartFrom::Earliest,
    )
    .await
    .unwrap();
    producer.send_batch(&orders(4, 0..5)).await.unwrap();
    let _: () = redis::cmd("HSET")
        .arg("sl:topology:{corrupt}")
        .arg("shardCount")
        .arg("many")
        .arg("version")
        .arg("1")
        .query_async(&mut conn)
        .await
        .unwrap();
    let names = ["served/g", "missing/g", "corrupt/g"]
        .map(|n| GroupName::parse(n).unwrap())
        .to_vec();
    let exporter = Arc::new(LagExporter::new(
        conn.clone(),
        names.clone(),
        false,
        LagOptions::default().with_cache_ttl(Duration::from_millis(300)),
    ));
    // Commands: the first scrape loads the scripts (NOSCRIPT, then EVAL); measure the next ones.
    let first = exporter.scrape().await;
    let mut probe = stream_listener_tests::connection(&redis_url).await;
    let at = commands_processed(&mut probe).await;
    let again = exporter.scrape().await;
    assert!(Arc::ptr_eq(&first, &again), "served from the cache");
    assert_eq!(
        commands_processed(&mut probe).await - at,
        1,
        "a cached scrape sends nothing (1: INFO)"
    );
    wait_until_async("the cache to expire", Duration::from_secs(10), || {
        let exporter = exporter.clone();
        let first = first.clone();
        async move { !Arc::ptr_eq(&first, &exporter.scrape().await) }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(350)).await;
    let at = commands_processed(&mut probe).await;
    let fresh = exporter.scrape().await;
    let spent = commands_processed(&mut probe).await - at - 1;
    // served: HMGET + 4 shards + leases + meta; missing and corrupt: their HMGET only.
    assert_eq!(spent, 1 + 4 + 2 + 1 + 1, "commands of one scrape");
    assert!(fresh.group(&names[0]).unwrap().result.is_ok());
    // Eight scrapes at once after the cache expired: one read, shared.
    tokio::time::sleep(Duration::from_millis(350)).await;
    let at = commands_processed(&mut probe).await;
    let mut scrapes = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let exporter = exporter.clone();
        scrapes.spawn(async move { exporter.scrape().await });
    }
    let shared = scrapes.join_all().await;
    assert_eq!(
        commands_processed(&mut probe).await - at - 1,
        spent,
        "concurrent scrapes cost one read"
    );
    assert!(shared.iter().all(|s| Arc::ptr_eq(s, &shared[0])));
    assert!(!Arc::ptr_eq(&shared[0], &fresh));

    let http = exporter
        .clone()
        .serve("127.0.0.1:0", tokio::runtime::Handle::current())
        .unwrap();
    let addr = http.local_addr();
    let (code, body) = get_async(addr, "/lag/served/g").await;
    assert_eq!(code, 200, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (body["lag"].as_u64(), body["pending"].as_u64()),
        (Some(20), Some(0))
    );
    assert_eq!(
        (body["shardCount"].as_u64(), body["liveMembers"].as_u64()),
        (Some(4), Some(0))
    );
    assert_eq!(body["shards"].as_array().unwrap().len(), 4);
    let (code, body) = get_async(addr, "/lag/missing/g").await;
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("unknown stream `missing`"), "{body}");
    let (code, body) = get_async(addr, "/lag/corrupt/g").await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("corrupt"), "{body}");
    let (code, body) = get_async(addr, "/lag/other/g").await;
    assert_eq!(code, 404, "{body}");
    let (code, body) = get_async(addr, "/lag").await;
    assert_eq!(code, 200);
    let all: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(all["groups"].as_array().unwrap().len(), 3);
    let (code, text) = get_async(addr, "/metrics").await;
    assert_eq!(code, 200);
    assert!(
        text.contains("stream_listener_group_lag{stream=\"served\",group=\"g\"} 20\n"),
        "{text}"
    );
    assert!(
        text.contains("stream_listener_group_up{stream=\"missing\",group=\"g\"} 0\n"),
        "{text}"
    );
    assert!(
        text.contains("stream_listener_group_up{stream=\"corrupt\",group=\"g\"} 0\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "stream_listener_group_shard_lag{stream=\"served\",group=\"g\",shard=\"3\"} "
        ),
        "{text}"
    );
    assert_eq!(get_async(addr, "/readyz").await.0, 200);
    drop(server);
}

/// With no `--group`, the groups are discovered from the keyspace: topology records, group metadata and
/// consumer groups on shard 0 that nobody joined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_are_discovered_from_the_keyspace() {
    let target = Target::Single.start();
    let mut conn = stream_with_group(&target, "found", 2, "joined-never").await;
    let (found, truncated) = stream_listener::lag::discover(&mut conn, 10_000)
        .await
        .unwrap();
    assert!(!truncated);
    assert_eq!(found, [("found".to_owned(), "joined-never".to_owned())]);
    let exporter = LagExporter::new(conn, vec![], false, LagOptions::default());
    let scrape = exporter.scrape().await;
    assert_eq!(scrape.groups.len(), 1);
    assert!(scrape.groups[0].result.is_ok());
}
