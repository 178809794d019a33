//! The shard fence in Redis, rule by rule, against a real `redis-server`. A "zombie" is a member that lost
//! the shard while its process was paused: its command reaches Redis after the next owner fenced the
//! shard. Each test sends that late command itself, with the old token, from the old member's connection.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use stream_listener_test_support::RedisServer;

use super::{is_fence_missing, is_fenced, Shared};
use crate::consumer::config::{AckPolicy, ConsumerConfig, DeleteRef};
use crate::consumer::message::{BoxedHandler, RawMessage};
use crate::member::lifecycle::{FencingToken, OwnershipDeadline};

const STREAM: &str = "orders";
const GROUP: &str = "billing";

fn token(member: &str, epoch: i64) -> FencingToken {
    FencingToken {
        member_id: member.into(),
        member_epoch: epoch,
    }
}

/// A member's consumer side, named `member`.
async fn member(server: &RedisServer, member: &str, policy: AckPolicy) -> Shared {
    let mut config = ConsumerConfig::new(STREAM, GROUP, member);
    config.ack_policy = policy;
    let client = redis::Client::open(server.url()).expect("url");
    let handler = BoxedHandler::raw(|_m: RawMessage| async { Ok::<(), String>(()) });
    Shared::connect(client.into(), config, handler)
        .await
        .expect("connect")
}

/// Shard 0 with its group, and `entries` entries in it.
async fn shard(server: &RedisServer, entries: usize) -> (Arc<str>, ConnectionManager) {
    let mut conn = stream_listener_test_support::aio::connect(&server.url()).await;
    let key: Arc<str> = crate::names::shard_stream(STREAM, 0).into();
    let () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&*key)
        .arg(GROUP)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut conn)
        .await
        .expect("group");
    for i in 0..entries {
        add(&mut conn, &key, i).await;
    }
    (key, conn)
}

async fn add(conn: &mut ConnectionManager, key: &str, i: usize) -> String {
    redis::cmd("XADD")
        .arg(key)
        .arg("*")
        .arg("k")
        .arg(format!("key-{i}"))
        .query_async(conn)
        .await
        .expect("xadd")
}

/// `(consumer, pending)` of the shard's group.
async fn pending_by_consumer(conn: &mut ConnectionManager, key: &str) -> Vec<(String, i64)> {
    let rows: Vec<Vec<redis::Value>> = redis::cmd("XINFO")
        .arg("CONSUMERS")
        .arg(key)
        .arg(GROUP)
        .query_async(conn)
        .await
        .expect("xinfo");
    let mut out: Vec<(String, i64)> = rows
        .into_iter()
        .map(|row| {
            let text =
                |v: &redis::Value| <String as redis::FromRedisValue>::from_redis_value_ref(v).ok();
            let name = row
                .chunks(2)
                .find(|kv| text(&kv[0]).as_deref() == Some("name"))
                .and_then(|kv| text(&kv[1]))
                .expect("name");
            let pending = row
                .chunks(2)
                .find(|kv| text(&kv[0]).as_deref() == Some("pending"))
                .and_then(|kv| <i64 as redis::FromRedisValue>::from_redis_value_ref(&kv[1]).ok())
                .expect("pending");
            (name, pending)
        })
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn a_zombie_read_after_the_new_owner_fenced_is_refused() {
    let server = RedisServer::start();
    let (key, mut conn) = shard(&server, 3).await;
    let (zombie, owner) = (
        member(&server, "a", AckPolicy::Ack).await,
        member(&server, "b", AckPolicy::Ack).await,
    );
    let (old, new) = (token("a", 5), token("b", 6));
    assert!(zombie.fence(&key, &old).await.expect("fence"));
    assert!(owner.fence(&key, &new).await.expect("fence"));

    let late = zombie.read_new(&key, &old).await;
    assert!(late.as_ref().is_err_and(is_fenced), "{late:?}");
    assert!(pending_by_consumer(&mut conn, &key).await.is_empty());
    assert_eq!(owner.read_new(&key, &new).await.expect("read").len(), 3);
    let claimed = zombie.claim(&key, &old, crate::names::START_ID).await;
    assert!(claimed.as_ref().is_err_and(is_fenced), "{claimed:?}");
    assert_eq!(
        pending_by_consumer(&mut conn, &key).await,
        vec![("b".into(), 3)]
    );
}

#[tokio::test]
async fn a_zombie_ack_after_the_fence_is_refused_and_the_new_owner_claims_what_it_read() {
    // Plain XACK, and the ack-and-delete script (servers without XACKDEL; the binary's XACKDEL otherwise).
    for policy in [AckPolicy::Ack, AckPolicy::AckDelete(DeleteRef::KeepRef)] {
        let server = RedisServer::start();
        let (key, mut conn) = shard(&server, 2).await;
        let zombie = member(&server, "a", policy).await;
        let owner = member(&server, "b", policy).await;
        // Two owners in a row may share an epoch value: the later one takes the fence.
        let (old, new) = (token("a", 5), token("b", 5));
        assert!(zombie.fence(&key, &old).await.expect("fence"));
        let read = zombie.read_new(&key, &old).await.expect("read");
        assert_eq!(read.len(), 2);
        assert!(owner.fence(&key, &new).await.expect("fence"));

        let ids: Vec<&str> = read.iter().map(|e| e.id.as_str()).collect();
        let late = zombie.ack(&key, &old, &ids).await;
        assert!(late.as_ref().is_err_and(is_fenced), "{policy:?}: {late:?}");
        assert_eq!(
            pending_by_consumer(&mut conn, &key).await,
            vec![("a".into(), 2)],
            "{policy:?}"
        );
        assert_eq!(
            stream_listener_test_support::aio::xlen(&mut conn, &key).await,
            2
        );
        // The takeover claim hands the new owner what the zombie read before the fence.
        let (cursor, claimed) = owner
            .claim(&key, &new, crate::names::START_ID)
            .await
            .expect("claim");
        assert_eq!(cursor, crate::names::START_ID);
        let claimed: Vec<&str> = claimed.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(claimed, ids, "{policy:?}");
        owner.ack(&key, &new, &claimed).await.expect("ack");
        let left = pending_by_consumer(&mut conn, &key).await;
        assert!(left.iter().all(|(_, n)| *n == 0), "{policy:?}: {left:?}");
    }
}

#[tokio::test]
async fn a_late_idle_wait_takes_nothing() {
    let server = RedisServer::start();
    let (key, mut conn) = shard(&server, 0).await;
    let zombie = member(&server, "a", AckPolicy::Ack).await;
    let owner = member(&server, "b", AckPolicy::Ack).await;
    let (old, new) = (token("a", 5), token("b", 6));
    assert!(zombie.fence(&key, &old).await.expect("fence"));
    assert!(zombie.read_new(&key, &old).await.expect("read").is_empty());
    assert!(owner.fence(&key, &new).await.expect("fence"));
    let id = add(&mut conn, &key, 1).await;

    // The zombie's wait reaches Redis late: its client-side deadline was still ahead when it was sent.
    let (mut blocking, _) = zombie.blocking_connection().await.expect("connect");
    let deadline = OwnershipDeadline::unbounded();
    let late = zombie
        .wait_new(&[&key], &mut blocking, Duration::from_secs(10), &deadline)
        .await;
    assert!(late.as_ref().is_err_and(is_fenced), "{late:?}");
    assert!(pending_by_consumer(&mut conn, &key).await.is_empty());
    let read = owner.read_new(&key, &new).await.expect("read");
    assert_eq!(read.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), [id]);
}

#[tokio::test]
async fn the_idle_wait_wakes_for_an_entry_added_after_the_empty_read() {
    let server = RedisServer::start();
    let (key, mut conn) = shard(&server, 1).await;
    let owner = member(&server, "b", AckPolicy::Ack).await;
    let new = token("b", 6);
    assert!(owner.fence(&key, &new).await.expect("fence"));
    assert_eq!(owner.read_new(&key, &new).await.expect("read").len(), 1);
    assert!(owner.read_new(&key, &new).await.expect("read").is_empty());
    // Added before the wait blocks: the id the empty read answered still wakes it at once.
    let id = add(&mut conn, &key, 2).await;
    let (mut blocking, _) = owner.blocking_connection().await.expect("connect");
    let deadline = OwnershipDeadline::unbounded();
    let started = Instant::now();
    let woke = owner
        .wait_new(&[&key], &mut blocking, Duration::from_secs(10), &deadline)
        .await
        .expect("wait");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(woke.len(), 1);
    assert_eq!(woke[0].0, *key);
    assert_eq!(
        woke[0].1.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(),
        [id]
    );
    assert_eq!(
        pending_by_consumer(&mut conn, &key).await,
        vec![("b".into(), 2)]
    );
}

#[tokio::test]
async fn a_stale_grant_cannot_take_the_fence() {
    let server = RedisServer::start();
    let (key, _conn) = shard(&server, 1).await;
    let stale = member(&server, "a", AckPolicy::Ack).await;
    let owner = member(&server, "b", AckPolicy::Ack).await;
    assert!(owner.fence(&key, &token("b", 7)).await.expect("fence"));
    assert!(!stale.fence(&key, &token("a", 6)).await.expect("fence"));
    let read = stale.read_new(&key, &token("a", 6)).await;
    assert!(read.as_ref().is_err_and(is_fenced), "{read:?}");
    assert!(!read.as_ref().is_err_and(is_fence_missing), "{read:?}");
}

#[tokio::test]
async fn a_lost_fence_is_refused_until_the_owner_fences_again() {
    let server = RedisServer::start();
    let (key, mut conn) = shard(&server, 1).await;
    let owner = member(&server, "b", AckPolicy::Ack).await;
    let own = token("b", 6);
    assert!(owner.fence(&key, &own).await.expect("fence"));
    let () = redis::cmd("DEL")
        .arg(crate::names::shard_fence(&key, GROUP))
        .query_async(&mut conn)
        .await
        .expect("del");
    let read = owner.read_new(&key, &own).await;
    assert!(read.as_ref().is_err_and(is_fence_missing), "{read:?}");
    owner.forget_fence(&key);
    assert!(owner.fence(&key, &own).await.expect("fence"));
    assert_eq!(owner.read_new(&key, &own).await.expect("read").len(), 1);
}

/// Lua's stack bounds a script's command to about 8,000 arguments: big batches are acknowledged in chunks.
#[tokio::test]
async fn a_batch_too_big_for_one_script_is_acknowledged_in_chunks() {
    for policy in [AckPolicy::Ack, AckPolicy::AckDelete(DeleteRef::KeepRef)] {
        let server = RedisServer::start();
        let (key, mut conn) = shard(&server, 0).await;
        let mut pipe = redis::pipe();
        for i in 0..9_000 {
            pipe.cmd("XADD")
                .arg(&*key)
                .arg("*")
                .arg("k")
                .arg(i)
                .ignore();
        }
        let () = pipe.query_async(&mut conn).await.expect("xadd");
        let mut config = ConsumerConfig::new(STREAM, GROUP, "b");
        config.ack_policy = policy;
        config.batch_size = 9_000;
        let client = redis::Client::open(server.url()).expect("url");
        let handler = BoxedHandler::raw(|_m: RawMessage| async { Ok::<(), String>(()) });
        let owner = Shared::connect(client.into(), config, handler)
            .await
            .expect("connect");
        let own = token("b", 6);
        assert!(owner.fence(&key, &own).await.expect("fence"));
        let read = owner.read_new(&key, &own).await.expect("read");
        assert_eq!(read.len(), 9_000);
        let ids: Vec<&str> = read.iter().map(|e| e.id.as_str()).collect();
        let next = owner
            .ack_and_read_new(&key, &own, &ids)
            .await
            .expect("ack and read");
        assert!(next.is_empty());
        assert_eq!(
            pending_by_consumer(&mut conn, &key).await,
            vec![("b".into(), 0)],
            "{policy:?}"
        );
    }
}
