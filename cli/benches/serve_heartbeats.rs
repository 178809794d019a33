//! Steady-state heartbeats per second through one `stream-listener serve` replica, side by side with the
//! library's own heartbeat path (`GroupStore::heartbeat`, what a Rust member calls), on a redis-server this
//! benchmark starts itself.
//!
//! `cargo bench -p stream-listener-cli --bench serve_heartbeats`
//! (`SL_BENCH_MEMBERS`: members, default 64; `SL_BENCH_SECONDS`: length of each timed phase, default 5).
//!
//! Each phase: `members` members join one group of 64 shards and converge (epoch acknowledged, owning
//! what they were granted), then each heartbeats back to back, closed loop, for the timed phase; only
//! answers with status OK are counted. Library path: one tokio task, one `GroupStore` and one connection
//! per member, as member processes have. Server path: one thread and one keep-alive HTTP connection per member
//! (a blocking client, as the origin's Python client is), sending the origin's JSON body.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stream_listener::coordinator::metadata::GroupConfig;
use stream_listener::coordinator::wire::{
    HeartbeatRequest, HeartbeatStatus, RuntimeConsumerCapacity, ShardId,
};
use stream_listener::store::GroupStore;
use stream_listener::topology::{StartFrom, Topology};
use stream_listener::RedisTarget;
use stream_listener_test_support::{env_u64, RedisServer};

const SHARDS: u32 = 64;
/// Long leases: nobody expires while the machine is busy with the other phase.
const TIMING: GroupConfig = GroupConfig {
    heartbeat_interval_ms: 1_000,
    session_timeout_ms: 60_000,
    rebalance_timeout_ms: 60_000,
};

fn request(member: &str, seq: u64, epoch: i64, version: i64, owned: &[u32]) -> HeartbeatRequest {
    HeartbeatRequest {
        protocol_version: 1,
        request_id: format!("{member}-{seq}"),
        member_id: member.to_string(),
        member_name: None,
        member_epoch: epoch,
        metadata_version: version,
        runtime_consumer_capacity: RuntimeConsumerCapacity::default(),
        owned_shards: Some(owned.iter().copied().map(ShardId::new).collect()),
        revoking_shards: vec![],
        shard_progress: vec![],
        weight: None,
        restarting: false,
        hold_after_lease_ms: 0,
    }
}

async fn create_group(url: &str, stream: &str) -> stream_listener::Connection {
    let mut conn = RedisTarget::open(url)
        .unwrap()
        .connect(Default::default())
        .await
        .unwrap();
    Topology::ensure(&mut conn, stream, SHARDS).await.unwrap();
    Topology::ensure_group(&mut conn, stream, "g", StartFrom::Earliest)
        .await
        .unwrap();
    let mut store = GroupStore::create(conn.clone(), stream, "g", SHARDS, TIMING).unwrap();
    let mut join = request("creator", 0, 0, 0, &[]);
    store.heartbeat(&join).await.unwrap();
    join.member_epoch = -1;
    join.request_id = "creator-leave".into();
    store.heartbeat(&join).await.unwrap();
    conn
}

/// The library path: `members` tasks calling `GroupStore::heartbeat`.
async fn library(url: &str, members: u64, seconds: u64) -> f64 {
    let _conn = create_group(url, "lib").await;
    let stop = Arc::new(AtomicBool::new(false));
    let counted = Arc::new(AtomicU64::new(0));
    let converged = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for m in 0..members {
        let (stop, counted, converged) = (stop.clone(), counted.clone(), converged.clone());
        let url = url.to_string();
        tasks.push(tokio::spawn(async move {
            let id = format!("lib-{m}");
            // A connection of its own, as a member process has: the store blocks on it in Redis
            // (BLPOP) while it waits for the writer lock.
            let conn = RedisTarget::open(&url)
                .unwrap()
                .connect(Default::default())
                .await
                .unwrap();
            let mut store = GroupStore::open(conn, "lib", "g").unwrap();
            let (mut epoch, mut version, mut owned, mut seq) = (0, 0, Vec::new(), 0u64);
            let mut settled = false;
            let mut counting = false;
            while !stop.load(Ordering::Relaxed) {
                // Contention while the members join at once: a member's loop sends the same request
                // again (a new request id would be a new incarnation), so does this.
                let Ok(r) = store
                    .heartbeat(&request(&id, seq, epoch, version, &owned))
                    .await
                else {
                    continue;
                };
                seq += 1;
                if !r.status.is_accepted() {
                    epoch = 0;
                    owned.clear();
                    continue;
                }
                let assigned: Vec<u32> = r
                    .assignment
                    .assigned_shards
                    .iter()
                    .map(|s| s.shard_index)
                    .collect();
                let steady = r.status == HeartbeatStatus::Ok
                    && r.member_epoch == epoch
                    && assigned == owned
                    && r.assignment.pending_shards.is_empty();
                (epoch, version, owned) = (r.member_epoch, r.metadata_version, assigned);
                if steady && !settled {
                    settled = true;
                    converged.fetch_add(1, Ordering::SeqCst);
                }
                if counting && r.status == HeartbeatStatus::Ok {
                    counted.fetch_add(1, Ordering::Relaxed);
                }
                if !counting && converged.load(Ordering::SeqCst) == members {
                    counting = true;
                }
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while converged.load(Ordering::SeqCst) < members {
        assert!(
            Instant::now() < deadline,
            "the library's members never converged"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = counted.load(Ordering::SeqCst);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let done = counted.load(Ordering::SeqCst) - before;
    let rate = done as f64 / started.elapsed().as_secs_f64();
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.unwrap();
    }
    rate
}

/// The server path: `members` threads posting the origin's heartbeat JSON to `serve`.
async fn server(url: &str, members: u64, seconds: u64) -> f64 {
    let _conn = create_group(url, "http").await;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_stream-listener"))
        .args(["--redis-url", url, "serve", "--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let addr = line
        .strip_prefix("listening on ")
        .and_then(|rest| rest.split(' ').next())
        .map(|a| a.trim_end_matches(':').to_string())
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    let stop = Arc::new(AtomicBool::new(false));
    let counted = Arc::new(AtomicU64::new(0));
    let converged = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for m in 0..members {
        let (stop, counted, converged, addr) = (
            stop.clone(),
            counted.clone(),
            converged.clone(),
            addr.clone(),
        );
        threads.push(std::thread::spawn(move || {
            let id = format!("http-{m}");
            let agent: ureq::Agent = ureq::Agent::config_builder()
                .timeout_global(Some(Duration::from_secs(30)))
                .build()
                .into();
            let url = format!("http://{addr}/coord/v1/streams/http/groups/g/members/{id}/heartbeat");
            let (mut epoch, mut version, mut owned, mut seq) = (0i64, 0i64, Vec::<u64>::new(), 0u64);
            let (mut settled, mut counting) = (false, false);
            while !stop.load(Ordering::Relaxed) {
                let body = json!({
                    "protocolVersion": 1, "requestId": format!("{id}-{seq}"), "memberId": id,
                    "memberName": id, "memberEpoch": epoch, "metadataVersion": version,
                    "runtimeConsumerCapacity": {"runtimeMaxConcurrency": 1, "availableConcurrency": 1},
                    "ownedShards": owned.iter().map(|s| json!({"shardIndex": s})).collect::<Vec<_>>(),
                    "revokingShards": [], "shardProgress": []
                });
                let r: Value = agent
                    .post(&url)
                    .send_json(&body)
                    .unwrap()
                    .body_mut()
                    .read_json()
                    .unwrap();
                let status = r["status"].as_str().unwrap_or_default();
                if status == "RETRY" {
                    // The same request again, as for the library path.
                    continue;
                }
                seq += 1;
                if status == "UNKNOWN_MEMBER_ID" || status == "FENCED_MEMBER_EPOCH" {
                    (epoch, owned) = (0, Vec::new());
                    continue;
                }
                if status != "OK" {
                    continue;
                }
                let assigned: Vec<u64> = r["assignment"]["assignedShards"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(|s| s["shardIndex"].as_u64())
                    .collect();
                let pending = r["assignment"]["pendingShards"].as_array().map_or(0, Vec::len);
                let steady =
                    r["memberEpoch"].as_i64() == Some(epoch) && assigned == owned && pending == 0;
                epoch = r["memberEpoch"].as_i64().unwrap();
                version = r["metadataVersion"].as_i64().unwrap();
                owned = assigned;
                if steady && !settled {
                    settled = true;
                    converged.fetch_add(1, Ordering::SeqCst);
                }
                if counting {
                    counted.fetch_add(1, Ordering::Relaxed);
                }
                if !counting && converged.load(Ordering::SeqCst) == members {
                    counting = true;
                }
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while converged.load(Ordering::SeqCst) < members {
        assert!(
            Instant::now() < deadline,
            "the HTTP members never converged"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = counted.load(Ordering::SeqCst);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let done = counted.load(Ordering::SeqCst) - before;
    let rate = done as f64 / started.elapsed().as_secs_f64();
    stop.store(true, Ordering::SeqCst);
    for thread in threads {
        thread.join().unwrap();
    }
    let _ = child.kill();
    let _ = child.wait();
    rate
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let members = env_u64("SL_BENCH_MEMBERS", 64);
    let seconds = env_u64("SL_BENCH_SECONDS", 5);
    let redis = RedisServer::start();
    let url = redis.url();
    let lib = library(&url, members, seconds).await;
    let http = server(&url, members, seconds).await;
    println!("steady-state heartbeats/s, {members} members, {SHARDS} shards, {seconds} s each:");
    println!("  library (GroupStore::heartbeat)       {lib:>10.0}");
    println!("  one `serve` replica (HTTP, JSON body) {http:>10.0}");
    println!(
        "  ratio server / library                {:>10.2}",
        http / lib
    );
}
