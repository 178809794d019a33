//! `serve` on the deployments the library supports besides one plain node: a Redis Cluster (the group's
//! records, the shards' streams and the server's reads on different masters), Redis Sentinel (the
//! server follows the master through a failover), and TLS with every part
//! of the group running as an ACL user that has only `preflight::ACL_COMMANDS`. Each runs a mixed group (a member
//! of ours and an HTTP member through the server) under traffic and checks from the records that nothing
//! was lost, nothing is left pending, per-key order held and nothing was handled twice.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::Value;
use stream_listener::connection::slot_of;
use stream_listener::preflight::ACL_COMMANDS;
use stream_listener_test_support::tls::{ClientCerts, TlsRedisServer};
use stream_listener_test_support::{RedisCluster, RedisSentinels};

use super::client::{HttpMember, Interval, Stop};
use super::log::Log;
use super::server::{request, Server};
use super::{
    assert_complete, create_group, rust_member, serve, wait_until, Production, GROUP, HOLD_MS,
    SHARDS, WAIT,
};

/// A member of ours with `data_url`, an HTTP member through `server` reading at `data_url`: both handle
/// entries, the HTTP member leaves, the member of ours takes every shard, and the records are complete.
async fn mixed_group_through(server: &Server, data_url: &str, stream: &str) {
    let log = Log::default();
    let revoked = Arc::new(Mutex::new(BTreeMap::new()));
    let production = Production::start(data_url, stream).await;
    let rust = rust_member(data_url, stream, "rust-a", &log, &revoked).await;
    let http = HttpMember::start(
        &server.base(),
        data_url,
        stream,
        GROUP,
        "py-a",
        Interval::Server,
        log.clone(),
    );
    wait_until("both members handle entries", WAIT, || {
        let members = log.members();
        members.contains("rust-a") && members.contains("py-a")
    })
    .await;
    assert_eq!(http.died(), None);
    let leaving_at = Instant::now();
    assert_eq!(http.stop(Stop::Leave), None, "the leave is answered OK");
    wait_until("the member of ours handles every shard again", WAIT, || {
        log.shards_handled_by("rust-a", leaving_at, SHARDS).len() == SHARDS as usize
    })
    .await;
    let sent = production.stop().await;
    assert_complete(data_url, stream, &log, &sent).await;
    assert_eq!(log.duplicates(), vec![]);
    rust.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_group_runs_through_serve_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let url = cluster.url();
    let stream = "clustered";
    create_group(&url, stream).await;
    let masters: BTreeSet<usize> = (0..SHARDS)
        .map(|s| cluster.master_of(slot_of(format!("{stream}:{s}").as_bytes())))
        .collect();
    assert!(
        masters.len() > 1,
        "the shards all hash to master {masters:?}"
    );
    let server = serve(&url);

    // Routing names each shard's slot as the cluster places it.
    let (status, _, body) = request(
        "GET",
        &format!(
            "{}/coord/v1/streams/{stream}/groups/{GROUP}/producer-routing",
            server.base()
        ),
        None,
    );
    assert_eq!(status, 200, "{body}");
    let routing: Value = serde_json::from_str(&body).unwrap();
    for (i, shard) in routing["shards"].as_array().unwrap().iter().enumerate() {
        let key = format!("{stream}:{i}");
        assert_eq!(shard["redisSlot"], slot_of(key.as_bytes()), "{routing}");
    }
    mixed_group_through(&server, &url, stream).await;

    // The Grafana and offsets rows name each shard's master and its memory (`MEMORY USAGE` goes to the
    // key's slot, not to the slot of the word USAGE).
    for row in grafana_rows(
        &server,
        &format!("shards?streamPrefix={stream}&consumerGroup={GROUP}"),
    ) {
        let key = row["streamKey"].as_str().unwrap();
        let master = cluster.nodes()[cluster.master_of(slot_of(key.as_bytes()))].port();
        assert_eq!(
            row["redisNodeEndpoint"],
            format!("127.0.0.1:{master}"),
            "{row}"
        );
        let (start, end) = (
            row["redisSlotRangeStart"].as_u64().unwrap(),
            row["redisSlotRangeEnd"].as_u64().unwrap(),
        );
        assert!(
            (start..=end).contains(&u64::from(slot_of(key.as_bytes()))),
            "{row}"
        );
        assert!(row["redisNodeId"].is_string(), "{row}");
        assert!(row["memoryUsageBytes"].as_u64().unwrap() > 0, "{row}");
    }
    let groups = grafana_rows(&server, "groups");
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0]["memoryUsageKnown"], true, "{groups:?}");
    assert_eq!(groups[0]["totalLag"], 0, "{groups:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_group_runs_through_serve_behind_sentinel_before_and_after_a_failover() {
    let sentinels = RedisSentinels::start(1);
    let url = sentinels.url();
    assert!(url.starts_with("redis+sentinel://"), "{url}");
    let stream = "watched";
    create_group(&url, stream).await;
    let server = serve(&url);
    mixed_group_through(&server, &url, stream).await;

    let old = sentinels.master_port();
    let new = tokio::task::block_in_place(|| sentinels.failover()).unwrap();
    assert_ne!(old, new);
    // The same server, its cached store handles and its members' group, on the new master.
    mixed_group_through(&server, &url, stream).await;
    let mut direct =
        stream_listener_test_support::aio::connect(&format!("redis://127.0.0.1:{new}")).await;
    let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut direct).await.unwrap();
    assert_eq!(role[0], redis::Value::BulkString(b"master".to_vec()));
    let (status, _, body) = request(
        "GET",
        &format!("{}/coord/v1/monitoring/health", server.base()),
        None,
    );
    assert_eq!(status, 200, "{body}");
}

/// The rows of `GET /coord/v1/monitoring/grafana/<path>`.
fn grafana_rows(server: &Server, path: &str) -> Vec<Value> {
    let (status, _, body) = request(
        "GET",
        &format!("{}/coord/v1/monitoring/grafana/{path}", server.base()),
        None,
    );
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_reaches_redis_over_tls_as_an_acl_user_with_only_the_documented_commands() {
    // Skipped without `openssl` outside CI (see `tls::openssl_available`).
    let Some(redis) = TlsRedisServer::start(ClientCerts::Optional) else {
        return;
    };
    let plain = redis.server().url();
    let stream = "guarded";
    let mut admin = stream_listener_tests::connection(&plain).await;
    let mut setuser = redis::cmd("ACL");
    setuser
        .arg(&["SETUSER", "coord", "on", ">s3cret", "resetkeys", "~sl:*"])
        .arg(format!("~{stream}:*"))
        .arg(&["resetchannels", "&sl:*"])
        .arg(ACL_COMMANDS);
    let () = setuser.query_async(&mut admin).await.unwrap();
    // Everything runs as that user: the server over TLS, the rest on the plain port.
    let as_user = format!("redis://coord:s3cret@127.0.0.1:{}/", redis.server().port());
    create_group(&as_user, stream).await;
    let tls_url = format!("rediss://coord:s3cret@127.0.0.1:{}/", redis.tls_port());

    // Without the authority's certificate the server refuses to start rather than serve nothing.
    let untrusted = std::process::Command::new("timeout")
        .arg("20")
        .arg(env!("CARGO_BIN_EXE_stream-listener"))
        .args(["--redis-url", &tls_url, "serve", "--listen", "127.0.0.1:0"])
        .env_remove("REDIS_URL")
        .env_remove("SSL_CERT_FILE")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&untrusted.stderr);
    assert_eq!(untrusted.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("certificate"), "{stderr}");

    let ca = redis.file("ca.pem").display().to_string();
    let server = Server::start(
        &tls_url,
        &[
            "--tls-ca-cert",
            &ca,
            "--hold-after-lease-ms",
            &HOLD_MS.to_string(),
        ],
    );
    // The monitoring reads go through the same user.
    let (status, _, body) = request(
        "GET",
        &format!(
            "{}/coord/v1/monitoring/streams/{stream}/groups/{GROUP}/offsets",
            server.base()
        ),
        None,
    );
    assert_eq!(status, 200, "{body}");
    mixed_group_through(&server, &as_user, stream).await;
    let users: Vec<String> = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async::<String>(&mut admin)
        .await
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("user=")))
        .map(String::from)
        .collect();
    assert!(
        users.iter().any(|u| u == "coord"),
        "the server is connected as the ACL user: {users:?}"
    );
    // The Grafana rows need nothing beyond those commands either.
    let groups = grafana_rows(&server, "groups");
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert_eq!(groups[0]["memoryUsageKnown"], true, "{groups:?}");
    let q = format!("streamPrefix={stream}&consumerGroup={GROUP}");
    assert_eq!(
        grafana_rows(&server, &format!("shards?{q}")).len(),
        SHARDS as usize
    );
    assert!(!grafana_rows(&server, &format!("messages?{q}&shardIndex=all")).is_empty());
}
