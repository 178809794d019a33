//! Every Lua script the library runs declares every key it touches (issue 21, item 6). Redis documents a
//! script that builds key names itself as unsupported: Redis Cluster cannot route it during a slot
//! migration, and managed servers (ElastiCache Serverless) and Dragonfly refuse it.
//!
//! One scenario runs every script against a server under `MONITOR`: members join and leave (the store's
//! scripts), a stream is created, shrunk and grown again (the topology's), shards change owner with entries
//! pending (fences, fenced claims, consumer clean-up, retention at each takeover and after acks), and
//! entries are acknowledged and deleted on a server without `XACKDEL`. The server itself names the keys of each command a script ran (`COMMAND GETKEYS`);
//! each must be one of the keys the script's invocation declared. The test also fails when a script of the
//! library did not run, so a new script cannot escape the check.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stream_listener::consumer::{AckPolicy, DeleteRef};
use stream_listener::{names, ConsumerBuilder, Message, RunningRuntime, Topology};
use stream_listener_test_support::aio::{wait_until, wait_until_async, xpending_count};
use stream_listener_test_support::monitor::{script_key_audit, Monitor};
use stream_listener_test_support::RedisServer;
use stream_listener_tests::{connection, orders, producer, start_one, Order};

/// Every script of the library, by file.
const SCRIPTS: &[(&str, &str)] = &[
    (
        "consumer/ack_delete.lua",
        include_str!("../../stream-listener/src/consumer/ack_delete.lua"),
    ),
    (
        "consumer/cleanup.lua",
        include_str!("../../stream-listener/src/consumer/cleanup.lua"),
    ),
    (
        "consumer/fence.lua",
        include_str!("../../stream-listener/src/consumer/fence.lua"),
    ),
    (
        "consumer/fenced.lua",
        include_str!("../../stream-listener/src/consumer/fenced.lua"),
    ),
    (
        "consumer/retention.lua",
        include_str!("../../stream-listener/src/consumer/retention.lua"),
    ),
    (
        "lag/read.lua",
        include_str!("../../stream-listener/src/lag/read.lua"),
    ),
    (
        "lag/seek.lua",
        include_str!("../../stream-listener/src/lag/seek.lua"),
    ),
    (
        "store/cancel.lua",
        include_str!("../../stream-listener/src/store/cancel.lua"),
    ),
    (
        "store/commit.lua",
        include_str!("../../stream-listener/src/store/commit.lua"),
    ),
    (
        "store/enqueue.lua",
        include_str!("../../stream-listener/src/store/enqueue.lua"),
    ),
    (
        "store/peek.lua",
        include_str!("../../stream-listener/src/store/peek.lua"),
    ),
    (
        "store/renew.lua",
        include_str!("../../stream-listener/src/store/renew.lua"),
    ),
    (
        "store/writer.lua",
        include_str!("../../stream-listener/src/store/writer.lua"),
    ),
    (
        "topology/consumed.lua",
        include_str!("../../stream-listener/src/topology/consumed.lua"),
    ),
    (
        "topology/ensure.lua",
        include_str!("../../stream-listener/src/topology/ensure.lua"),
    ),
    (
        "topology/reopen.lua",
        include_str!("../../stream-listener/src/topology/reopen.lua"),
    ),
    (
        "topology/resize.lua",
        include_str!("../../stream-listener/src/topology/resize.lua"),
    ),
    (
        "topology/retire.lua",
        include_str!("../../stream-listener/src/topology/retire.lua"),
    ),
    (
        "topology/retire_shard.lua",
        include_str!("../../stream-listener/src/topology/retire_shard.lua"),
    ),
];

#[test]
fn every_script_file_of_the_library_is_listed() {
    // Every `.lua` under src/, at any depth, relative to src/.
    let root = std::path::PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../stream-listener/src"
    ));
    let mut on_disk = BTreeSet::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "lua") {
                let relative = path
                    .strip_prefix(&root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                on_disk.insert(relative);
            }
        }
    }
    assert!(on_disk.len() > 10, "found the scripts: {on_disk:?}");
    let listed: BTreeSet<String> = SCRIPTS.iter().map(|(f, _)| (*f).to_owned()).collect();
    assert_eq!(listed, on_disk);
}

fn member(id: &str, handled: &Arc<AtomicUsize>) -> ConsumerBuilder {
    let handled = handled.clone();
    ConsumerBuilder::new("audited", "g")
        .member_id(id)
        .runtime_max_concurrency(2)
        .batch_size(16)
        .ack(AckPolicy::AckDelete(DeleteRef::Acked))
        .handler(move |_msg: Message<Order>| {
            let handled = handled.clone();
            async move {
                handled.fetch_add(1, Ordering::Relaxed);
                Ok::<(), std::io::Error>(())
            }
        })
}

async fn pending(url: &str, shards: u32) -> i64 {
    let mut conn = connection(url).await;
    let mut total = 0;
    for shard in 0..shards {
        total += xpending_count(&mut conn, &format!("audited:{shard}"), "g").await;
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_script_touches_only_the_keys_it_declares() {
    let redis = RedisServer::start();
    let url = redis.url();
    let monitor = Monitor::start(redis.addr()).await;
    let mut conn = connection(&url).await;
    let handled = Arc::new(AtomicUsize::new(0));
    let first = producer(&url, "audited", 4).await;
    let a: RunningRuntime = start_one(&url, member("a", &handled)).await;
    let b: RunningRuntime = start_one(&url, member("b", &handled)).await;
    first.send_batch(&orders(8, 0..20)).await.unwrap();
    wait_until("the first orders handled", Duration::from_secs(30), || {
        handled.load(Ordering::Relaxed) == 160
    })
    .await;
    // Shrink, then grow back over the retired shards.
    Topology::resize_with_grace(&mut conn, "audited", 2, Duration::from_millis(300))
        .await
        .unwrap();
    let second = producer(&url, "audited", 2).await;
    second.send_batch(&orders(8, 20..30)).await.unwrap();
    wait_until_async(
        "the shrink retired shards 2 and 3",
        Duration::from_secs(30),
        || {
            let mut conn = conn.clone();
            async move {
                Topology::load(&mut conn, "audited")
                    .await
                    .is_ok_and(|t| t.shard_count() == 2 && t.draining_shards().is_empty())
            }
        },
    )
    .await;
    Topology::resize_with_grace(&mut conn, "audited", 4, Duration::from_millis(300))
        .await
        .unwrap();
    let third = producer(&url, "audited", 4).await;
    third.send_batch(&orders(8, 30..40)).await.unwrap();
    wait_until("every order handled", Duration::from_secs(30), || {
        handled.load(Ordering::Relaxed) >= 320
    })
    .await;
    // A member leaves with entries pending: its shards move to the other one, which fences and claims.
    let _ = b.stop().await;
    third.send_batch(&orders(8, 40..50)).await.unwrap();
    wait_until(
        "the orders after the hand-off handled",
        Duration::from_secs(30),
        || handled.load(Ordering::Relaxed) >= 400,
    )
    .await;
    wait_until_async("nothing pending", Duration::from_secs(30), || async {
        pending(&url, 4).await == 0
    })
    .await;
    // The lag exporter's read, and a seek that keeps the lag known (to the end: nothing is pending).
    let lag = stream_listener::lag::read_group(&mut conn, "audited", "g", &Default::default())
        .await
        .unwrap();
    assert_eq!(lag.pending, 0);
    stream_listener::lag::set_position(
        &mut conn,
        &stream_listener::routing::shard_stream_key("audited", 0),
        "g",
        "$",
        10_000,
    )
    .await
    .unwrap();
    // A commit that fails (the group's audit key holds a string, so commit.lua refuses before writing):
    // the joining member takes its queued heartbeat back, then joins once the key is repaired.
    let audit_key = names::group_key("audited", "g", names::group::AUDIT);
    let _: () = redis::cmd("SET")
        .arg(&audit_key)
        .arg("not a stream")
        .query_async(&mut conn)
        .await
        .unwrap();
    let joining = {
        let (url, handled) = (url.clone(), handled.clone());
        tokio::spawn(async move { start_one(&url, member("c", &handled)).await })
    };
    let cancel = redis::Script::new(include_str!("../../stream-listener/src/store/cancel.lua"))
        .get_hash()
        .to_owned();
    wait_until(
        "the failed commit's heartbeat was taken back",
        Duration::from_secs(30),
        || monitor.lines().iter().any(|l| l.contains(&cancel)),
    )
    .await;
    let _: () = redis::cmd("DEL")
        .arg(&audit_key)
        .query_async(&mut conn)
        .await
        .unwrap();
    let c = joining.await.unwrap();
    let _ = c.stop().await;
    let _ = a.stop().await;

    let audit = script_key_audit(&mut conn, &monitor.lines()).await;
    let undeclared: BTreeMap<&str, Vec<String>> = audit
        .undeclared
        .iter()
        .map(|u| {
            (
                u.script.as_str(),
                format!("{:?} touched {}", u.command, u.key),
            )
        })
        .fold(BTreeMap::new(), |mut by, (s, what)| {
            by.entry(s).or_insert_with(Vec::new).push(what);
            by
        });
    let name_of = |sha: &str| {
        SCRIPTS
            .iter()
            .find(|(_, src)| redis::Script::new(src).get_hash() == sha)
            .map_or(sha.to_owned(), |(f, _)| (*f).to_owned())
    };
    let named: BTreeMap<String, &Vec<String>> =
        undeclared.iter().map(|(s, w)| (name_of(s), w)).collect();
    assert!(
        named.is_empty(),
        "scripts touched undeclared keys: {named:#?}"
    );
    let ran: BTreeSet<String> = audit.scripts.iter().map(|s| name_of(s)).collect();
    let missing: Vec<&str> = SCRIPTS
        .iter()
        .map(|(f, _)| *f)
        .filter(|f| !ran.contains(*f))
        .collect();
    assert!(
        missing.is_empty(),
        "scripts the scenario did not run: {missing:?}"
    );
}
