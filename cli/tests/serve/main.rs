//! Conformance of `stream-listener serve` (the spec origin's HTTP API v1), against the running binary on
//! a `redis-server` of each test's own: HTTP members that behave as the origin's Python and Spring
//! clients (`client.rs`) in the same group as members of this library, with the group's guarantees
//! checked from what every member handled (`log.rs`): nothing lost, nothing left pending, per-key order,
//! and a shard read by a new owner only after the old one gave it up or its hold passed.
//!
//! Timings are the runtime tests' (`TIMING`: heartbeats every 100 ms, session 1.5 s); every wait is on a
//! condition with a deadline.

mod chaos;
mod client;
mod deployments;
mod grafana;
mod limits;
mod log;
mod origin;
mod server;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stream_listener::coordinator::wire::{HeartbeatRequest, RuntimeConsumerCapacity};
use stream_listener::routing::shard_for_key;
use stream_listener::store::GroupStore;
use stream_listener::topology::{StartFrom, Topology};
use stream_listener::{ConsumerBuilder, Message, Producer, RunningRuntime};
use stream_listener_test_support::aio::{wait_until, wait_until_async, xpending_count};
use stream_listener_test_support::RedisServer;
use stream_listener_tests::{test_runtime, Order, TIMING};

use client::{HttpMember, Interval, Stop};
use log::Log;
use server::{basic, request, request_with, Server};

const SHARDS: u32 = 4;
const GROUP: &str = "g";
/// `--hold-after-lease-ms` of the servers here.
const HOLD_MS: u64 = 1_000;
const WAIT: Duration = Duration::from_secs(30);

fn serve(url: &str) -> Server {
    Server::start(url, &["--hold-after-lease-ms", &HOLD_MS.to_string()])
}

/// The stream's topology and every shard's consumer group, and the group's metadata with [`TIMING`]
/// (created by a member of ours that joins and leaves at once: the server never creates groups).
async fn create_group(url: &str, stream: &str) {
    let mut conn = stream_listener_tests::connection(url).await;
    Topology::ensure(&mut conn, stream, SHARDS).await.unwrap();
    Topology::ensure_group(&mut conn, stream, GROUP, StartFrom::Earliest)
        .await
        .unwrap();
    let mut store = GroupStore::create(conn, stream, GROUP, SHARDS, TIMING).unwrap();
    let mut join = HeartbeatRequest {
        protocol_version: 1,
        request_id: "creator-1".into(),
        member_id: "creator".into(),
        member_name: None,
        member_epoch: 0,
        metadata_version: 0,
        runtime_consumer_capacity: RuntimeConsumerCapacity::default(),
        owned_shards: Some(vec![]),
        revoking_shards: vec![],
        shard_progress: vec![],
        weight: None,
        restarting: false,
        hold_after_lease_ms: 0,
    };
    let joined = store.heartbeat(&join).await.unwrap();
    assert!(
        joined.assignment.assigned_shards.is_empty(),
        "a new group grants nothing yet"
    );
    join.member_epoch = -1;
    join.request_id = "creator-2".into();
    store.heartbeat(&join).await.unwrap();
}

/// A member of ours in `group`, recording what it handles in `log` and when it gave each shard up.
async fn rust_member(
    url: &str,
    stream: &str,
    id: &'static str,
    log: &Log,
    revoked: &Arc<Mutex<BTreeMap<u32, Instant>>>,
) -> RunningRuntime {
    let (log, revoked) = (log.clone(), revoked.clone());
    let builder = ConsumerBuilder::new(stream, GROUP)
        .member_id(id)
        .batch_size(10)
        .handler(move |msg: Message<Order>| {
            let log = log.clone();
            async move {
                log.push(&msg.payload, id);
                Ok::<(), String>(())
            }
        })
        .on_shards_revoked(move |shards| {
            let revoked = revoked.clone();
            async move {
                let now = Instant::now();
                let mut revoked = revoked.lock().unwrap();
                for s in shards {
                    revoked.insert(s, now);
                }
            }
        });
    test_runtime(url)
        .default_shard_count(SHARDS)
        .consumer(builder)
        .start()
        .await
        .unwrap()
}

/// The keys produced: `k0..k15`, which cover every shard (checked).
const KEYS: u32 = 16;

/// Produces an order of each of [`KEYS`] every 2 ms, until stopped; returns what it sent.
struct Production {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<(String, Order)>>,
}

impl Production {
    async fn start(url: &str, stream: &str) -> Self {
        let producer = Producer::connect_creating(url, stream, SHARDS)
            .await
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut sent = Vec::new();
            let mut seq = 0;
            while !flag.load(Ordering::SeqCst) {
                for k in 0..KEYS {
                    let order = Order {
                        key: format!("k{k}"),
                        seq,
                    };
                    // A Redis restart (the chaos run's) fails sends for a moment: try again.
                    let mut tries = 0;
                    while let Err(e) = producer.send(&order.key, &order).await {
                        tries += 1;
                        assert!(tries < 1_500, "k{k}/{seq} not sent: {e}");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    sent.push((order.key.clone(), order));
                }
                seq += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            sent
        });
        Self { stop, task }
    }

    async fn stop(self) -> Vec<(String, Order)> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap()
    }
}

/// A group under traffic on a Redis of its own: member `rust-a` of ours, and an HTTP member (the
/// Python client's behaviour) through a server, both handling entries.
struct MixedGroup {
    _redis: RedisServer,
    url: String,
    _server: Server,
    log: Log,
    production: Production,
    rust: RunningRuntime,
    py: HttpMember,
}

impl MixedGroup {
    /// Starts it on `stream`, the HTTP member as `py_id`, and waits until the HTTP member handles entries.
    async fn start(stream: &str, py_id: &str) -> Self {
        let redis = RedisServer::start();
        let url = redis.url();
        create_group(&url, stream).await;
        let server = serve(&url);
        let log = Log::default();
        let revoked = Arc::new(Mutex::new(BTreeMap::new()));
        let production = Production::start(&url, stream).await;
        let rust = rust_member(&url, stream, "rust-a", &log, &revoked).await;
        let py = HttpMember::start(
            &server.base(),
            &url,
            stream,
            GROUP,
            py_id,
            Interval::Server,
            log.clone(),
        );
        wait_until("the HTTP member handles entries", WAIT, || {
            log.members().contains(py_id)
        })
        .await;
        Self {
            _redis: redis,
            url,
            _server: server,
            log,
            production,
            rust,
            py,
        }
    }
}

/// Waits until everything `sent` was handled, nothing is pending on any shard, and checks per-key order.
async fn assert_complete(url: &str, stream: &str, log: &Log, sent: &[(String, Order)]) {
    let mut conn = stream_listener_tests::connection(url).await;
    let handled =
        stream_listener_test_support::aio::poll_until(WAIT, Duration::from_millis(20), || {
            let done = log.missing(sent).is_empty();
            async move { done }
        })
        .await;
    if !handled {
        let mut pending = Vec::new();
        for shard in 0..SHARDS {
            let key = format!("{stream}:{shard}");
            let detail: redis::Value = redis::cmd("XPENDING")
                .arg(&key)
                .arg(GROUP)
                .arg("-")
                .arg("+")
                .arg(10)
                .query_async(&mut conn)
                .await
                .unwrap();
            pending.push((key, detail));
        }
        panic!(
            "{} sent orders never handled, e.g. {:?}; pending: {pending:?}",
            log.missing(sent).len(),
            log.missing(sent).first()
        );
    }
    for shard in 0..SHARDS {
        let key = format!("{stream}:{shard}");
        let pending = xpending_count(&mut conn, &key, GROUP).await;
        assert_eq!(pending, 0, "entries left pending on {key}");
    }
    assert_eq!(log.order_violations(), vec![], "per-key order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_answer_in_the_spec_shapes() {
    let redis = RedisServer::start();
    let url = redis.url();
    let server = Server::start(&url, &["--body-limit", "4096"]);
    let base = server.base();

    // Health.
    let (status, _, body) = request("GET", &format!("{base}/coord/v1/monitoring/health"), None);
    assert_eq!(status, 200, "{body}");
    let health: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (health["status"].as_str(), health["redis"].as_str()),
        (Some("UP"), Some("UP"))
    );

    // Producer routing: the topology's version as metadataVersion, a slot for every shard key.
    create_group(&url, "orders").await;
    let routing_url = format!("{base}/coord/v1/streams/orders/groups/{GROUP}/producer-routing");
    let (status, _, body) = request("GET", &routing_url, None);
    assert_eq!(status, 200, "{body}");
    let routing: Value = serde_json::from_str(&body).unwrap();
    let mut conn = stream_listener_tests::connection(&url).await;
    let topology = Topology::load(&mut conn, "orders").await.unwrap();
    assert_eq!(routing["metadataVersion"], json!(topology.version()));
    assert_eq!(routing["shardCount"], json!(SHARDS));
    assert_eq!(routing["streamKeyPattern"], "orders:{shardIndex}");
    let shards = routing["shards"].as_array().unwrap();
    assert_eq!(shards.len(), SHARDS as usize);
    for (i, shard) in shards.iter().enumerate() {
        let key = format!("orders:{i}");
        assert_eq!(shard["streamKey"], json!(key));
        assert_eq!(
            shard["redisSlot"],
            json!(stream_listener::connection::slot_of(key.as_bytes()))
        );
    }
    // A resize moves metadataVersion, so Spring's routing cache refreshes.
    Topology::resize(&mut conn, "orders", 8).await.unwrap();
    let (_, _, body) = request("GET", &routing_url, None);
    let after: Value = serde_json::from_str(&body).unwrap();
    assert!(after["metadataVersion"].as_u64() > routing["metadataVersion"].as_u64());
    assert_eq!(after["shardCount"], json!(8));

    // Monitoring, from the library's projection, the origin's names; and the OpenAPI document.
    let monitoring = format!("{base}/coord/v1/monitoring/streams/orders/groups/{GROUP}");
    let (status, _, body) = request("GET", &monitoring, None);
    assert_eq!(status, 200, "{body}");
    let group: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(group["consumerGroup"], GROUP);
    assert_eq!(group["state"], "EMPTY", "{group}");
    let (status, _, body) = request("GET", &format!("{monitoring}/members"), None);
    assert_eq!(status, 200, "{body}");
    assert!(serde_json::from_str::<Value>(&body).unwrap()["members"].is_array());
    let (status, _, body) = request("GET", &format!("{monitoring}/assignments"), None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["invariantViolations"],
        json!([])
    );
    let (status, _, body) = request(
        "GET",
        &format!("{base}/coord/v1/monitoring/streams/orders/groups/nobody"),
        None,
    );
    assert_eq!(status, 404, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["errorCode"],
        "GROUP_NOT_FOUND"
    );
    let (status, _, body) = request("GET", &format!("{base}/coord/v1/openapi.json"), None);
    assert_eq!(status, 200);
    let document: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(document["openapi"], "3.1.0");
    assert!(document["paths"]
        .get("/coord/v1/streams/{streamPrefix}/groups/{consumerGroup}/members/{memberId}/heartbeat")
        .is_some());

    // Errors: the spec's body.
    let error = |status: u16, body: &str, code: &str, name: &str| {
        let value: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
        assert_eq!(value["status"], name, "{body}");
        assert_eq!(value["errorCode"], code, "{body}");
        assert!(
            value["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{body}"
        );
        let _ = status;
    };
    let (status, _, body) = request(
        "GET",
        &format!("{base}/coord/v1/streams/nope/groups/{GROUP}/producer-routing"),
        None,
    );
    assert_eq!(status, 404);
    error(status, &body, "STREAM_NOT_FOUND", "NOT_FOUND");
    let (status, _, body) = request("GET", &format!("{base}/coord/v1/elsewhere"), None);
    assert_eq!(status, 404);
    error(status, &body, "NOT_FOUND", "NOT_FOUND");

    let hb_url = format!("{base}/coord/v1/streams/orders/groups/{GROUP}/members/py-m0/heartbeat");
    // Malformed bodies.
    let (status, _, body) = request("POST", &hb_url, Some(b"{not json"));
    assert_eq!(status, 400);
    error(status, &body, "MALFORMED_BODY", "BAD_REQUEST");
    let big = vec![b' '; 8192];
    let (status, _, body) = request("POST", &hb_url, Some(&big));
    assert_eq!(status, 413, "{body}");
    error(status, &body, "MALFORMED_BODY", "PAYLOAD_TOO_LARGE");

    // Refusals are 200 with the request's epoch echoed (the Python client adopts it).
    let heartbeat = |epoch: i64, protocol: i64, member: &str| {
        json!({
            "protocolVersion": protocol, "requestId": "r-1", "memberId": member, "memberEpoch": epoch,
            "metadataVersion": 0,
            "runtimeConsumerCapacity": {"runtimeMaxConcurrency": 1, "availableConcurrency": 1},
            "ownedShards": [{"shardIndex": 1}], "revokingShards": [], "shardProgress": []
        })
        .to_string()
    };
    for (body, expected) in [
        (heartbeat(77, 2, "py-m0"), "UNSUPPORTED_PROTOCOL"),
        (heartbeat(77, 1, "someone-else"), "INVALID_REQUEST"),
        (
            json!({"protocolVersion": 1, "memberEpoch": 77, "memberId": "py-m0"}).to_string(),
            "INVALID_REQUEST",
        ),
    ] {
        let (status, _, answer) = request("POST", &hb_url, Some(body.as_bytes()));
        assert_eq!(status, 200, "{answer}");
        let answer: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(answer["status"], expected, "{answer}");
        assert_eq!(answer["memberEpoch"], 77, "{answer}");
        assert!(answer["heartbeatIntervalMs"].as_i64().unwrap() > 0);
    }
    // A group without metadata: RETRY with a complete body, not an error status.
    let missing = format!("{base}/coord/v1/streams/orders/groups/none/members/py-m0/heartbeat");
    let (status, _, answer) = request("POST", &missing, Some(heartbeat(0, 1, "py-m0").as_bytes()));
    assert_eq!(status, 200, "{answer}");
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["status"], "RETRY", "{answer}");
    for key in [
        "memberId",
        "memberEpoch",
        "heartbeatIntervalMs",
        "groupEpoch",
        "assignmentEpoch",
        "metadataVersion",
    ] {
        assert!(answer.get(key).is_some(), "{key} missing: {answer}");
    }

    // SIGTERM: a graceful exit.
    let exit = server.terminate();
    assert!(exit.success(), "{exit:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_move_rust_to_http_and_back_with_revoke_before_assign() {
    let redis = RedisServer::start();
    let url = redis.url();
    let stream = "handoff";
    create_group(&url, stream).await;
    let server = serve(&url);
    let log = Log::default();
    let revoked = Arc::new(Mutex::new(BTreeMap::new()));
    let production = Production::start(&url, stream).await;
    let rust = rust_member(&url, stream, "rust-a", &log, &revoked).await;
    wait_until("the Rust member handles entries", WAIT, || {
        log.members().contains("rust-a")
    })
    .await;

    // An HTTP member joins, heartbeating at a fixed interval whatever the server says (Spring's 3 s,
    // scaled as the group's timings are): the shards it gets are given up by the Rust member first.
    let py = HttpMember::start(
        &server.base(),
        &url,
        stream,
        GROUP,
        "jvm-m0",
        Interval::Fixed(Duration::from_millis(300)),
        log.clone(),
    );
    wait_until("the HTTP member reads half the shards", WAIT, || {
        py.shared.first_read.lock().unwrap().len() == (SHARDS / 2) as usize
    })
    .await;
    assert_eq!(py.died(), None);
    let first_read = py.shared.first_read.lock().unwrap().clone();
    let given_up = revoked.lock().unwrap().clone();
    for (shard, read_at) in &first_read {
        let revoked_at = given_up.get(shard).unwrap_or_else(|| {
            panic!("shard {shard} read by the HTTP member but never revoked from the Rust member")
        });
        assert!(
            read_at > revoked_at,
            "shard {shard} read before the Rust member gave it up"
        );
        eprintln!(
            "hand-off Rust -> HTTP of shard {shard}: {:?} from the Rust member's revoke to the HTTP member's first read",
            read_at.duration_since(*revoked_at)
        );
    }
    wait_until("the HTTP member handles entries", WAIT, || {
        log.members().contains("jvm-m0")
    })
    .await;

    // Spring's graceful leave gives every shard back to the Rust member.
    let leaving_at = Instant::now();
    assert_eq!(
        py.stop(Stop::SpringLeave),
        None,
        "Spring's leave is answered OK"
    );
    wait_until("the Rust member handles every shard again", WAIT, || {
        log.shards_handled_by("rust-a", leaving_at, SHARDS).len() == SHARDS as usize
    })
    .await;
    let sent = production.stop().await;
    assert_complete(&url, stream, &log, &sent).await;
    assert_eq!(
        log.duplicates(),
        vec![],
        "a clean hand-off handles nothing twice"
    );
    rust.stop().await.unwrap();
}

/// How an HTTP member is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lost {
    /// SIGSTOP, then SIGCONT once its shards moved on.
    Frozen,
    /// SIGKILL.
    Killed,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_http_member_past_its_session_is_held_then_replaced_with_nothing_lost() {
    lost_http_member(Lost::Frozen, "frozen").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_http_member_is_held_then_replaced_and_its_pending_entries_claimed() {
    lost_http_member(Lost::Killed, "killed").await;
}

/// An HTTP member that read entries and is lost before it acknowledged them: nobody else reads its
/// shards before its lease plus the hold; the Rust member then claims what it left pending; nothing is
/// lost, handled twice or out of order.
async fn lost_http_member(how: Lost, stream: &str) {
    let MixedGroup {
        _redis,
        url,
        _server,
        log,
        production,
        rust,
        py,
    } = MixedGroup::start(stream, "py-m0").await;
    let py_shards = py.assigned();
    assert!(!py_shards.is_empty());
    let last_sent = py.shared.clone();
    let last_sent = &last_sent.last_sent;

    // SIGSTOP-like, mid-batch: what it read last stays pending under its name.
    py.shared.hold_acks.store(true, Ordering::SeqCst);
    let heartbeats = py.shared.heartbeats.load(Ordering::SeqCst);
    wait_until("it reads once more without acknowledging", WAIT, || {
        py.shared.heartbeats.load(Ordering::SeqCst) > heartbeats
    })
    .await;
    let frozen_at = Instant::now();
    let py = match how {
        Lost::Frozen => {
            py.shared.frozen.store(true, Ordering::SeqCst);
            Some(py)
        }
        Lost::Killed => {
            let shared = py.shared.clone();
            py.stop(Stop::Kill);
            assert!(shared.first_read.lock().unwrap().len() == py_shards.len());
            None
        }
    };
    let pending = {
        let mut conn = stream_listener_tests::connection(&url).await;
        let mut n = 0;
        for shard in &py_shards {
            n += xpending_count(&mut conn, &format!("{stream}:{shard}"), GROUP).await;
        }
        n
    };
    // A heartbeat it sent later only moves its lease later: this bound stays below the real one.
    let last_sent = last_sent.lock().unwrap().expect("it heartbeated");
    let earliest_free =
        last_sent + Duration::from_millis(TIMING.session_timeout_ms as u64 + HOLD_MS);

    wait_until(
        "the Rust member handles the frozen member's shards",
        WAIT,
        || py_shards.is_subset(&log.shards_handled_by("rust-a", frozen_at, SHARDS)),
    )
    .await;
    for h in log
        .entries()
        .iter()
        .filter(|h| h.member == "rust-a" && h.at > frozen_at)
    {
        let shard = shard_for_key(h.order.key.as_bytes(), SHARDS);
        if py_shards.contains(&shard) {
            assert!(
                h.at >= earliest_free,
                "shard {shard} handled by the Rust member {:?} after the freeze, within the frozen member's lease and hold",
                h.at.duration_since(frozen_at)
            );
        }
    }
    eprintln!(
        "{how:?}: {pending} entries left pending by the HTTP member, claimed by the Rust member"
    );
    if let Some(py) = &py {
        // SIGCONT: it heartbeats before it reads, is told to rejoin, and goes on in the group.
        py.shared.hold_acks.store(false, Ordering::SeqCst);
        py.shared.frozen.store(false, Ordering::SeqCst);
        let resumed = py.shared.heartbeats.load(Ordering::SeqCst);
        wait_until("it heartbeats again", WAIT, || {
            py.shared.heartbeats.load(Ordering::SeqCst) > resumed + 2
        })
        .await;
        assert_eq!(py.died(), None);
    }
    let sent = production.stop().await;
    assert_complete(&url, stream, &log, &sent).await;
    assert_eq!(log.duplicates(), vec![]);
    drop(py);
    rust.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_under_the_same_id_reads_what_its_earlier_incarnation_left_pending_first() {
    restart_under_the_same_id(true, "restart").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_too_far_behind_to_rewind_is_withheld_until_its_pending_entries_are_handled() {
    restart_under_the_same_id(false, "withheld").await;
}

/// An HTTP member reads shard 0's entries and is killed before it acknowledged them, then restarts under
/// the same memberId in a group of HTTP members only. With `rewind`, the server hands the shard back
/// with its group rewound, so the new incarnation handles them first; without (`--max-rewind 0`), the
/// shard is withheld until an operator has handled them.
async fn restart_under_the_same_id(rewind: bool, stream: &str) {
    let redis = RedisServer::start();
    let url = redis.url();
    create_group(&url, stream).await;
    let hold = HOLD_MS.to_string();
    let max_rewind = if rewind { "1000" } else { "0" };
    let server = Server::start(
        &url,
        &["--hold-after-lease-ms", &hold, "--max-rewind", max_rewind],
    );
    let log = Log::default();
    // A key of shard 0 only.
    let key = (0..)
        .map(|i| format!("key{i}"))
        .find(|k| shard_for_key(k.as_bytes(), SHARDS) == 0)
        .unwrap();
    let producer = Producer::connect_creating(&url, stream, SHARDS)
        .await
        .unwrap();
    let send = |seqs: std::ops::Range<u32>| {
        let (producer, key) = (&producer, key.clone());
        async move {
            let mut sent = Vec::new();
            for seq in seqs {
                let order = Order {
                    key: key.clone(),
                    seq,
                };
                producer.send(&key, &order).await.unwrap();
                sent.push((key.clone(), order));
            }
            sent
        }
    };

    // The first incarnation reads shard 0's entries and dies before acknowledging them.
    let first = HttpMember::start(
        &server.base(),
        &url,
        stream,
        GROUP,
        "py-m0",
        Interval::Server,
        log.clone(),
    );
    first.shared.hold_acks.store(true, Ordering::SeqCst);
    wait_until("it owns every shard", WAIT, || {
        first.assigned().len() == SHARDS as usize
    })
    .await;
    let mut sent = send(0..5).await;
    let mut conn = stream_listener_tests::connection(&url).await;
    let shard0 = format!("{stream}:0");
    wait_until_async("its read leaves them pending", WAIT, || {
        let mut conn = conn.clone();
        let shard0 = shard0.clone();
        async move { xpending_count(&mut conn, &shard0, GROUP).await == 5 }
    })
    .await;
    first.stop(Stop::Kill);

    // The restart: a new incarnation under the same memberId.
    let second = HttpMember::start(
        &server.base(),
        &url,
        stream,
        GROUP,
        "py-m0",
        Interval::Server,
        log.clone(),
    );
    if rewind {
        wait_until("it is granted every shard", WAIT, || {
            second.assigned().len() == SHARDS as usize
        })
        .await;
        sent.extend(send(5..10).await);
        assert_complete(&url, stream, &log, &sent).await;
        assert_eq!(log.duplicates(), vec![]);
        let handled: Vec<u32> = log.entries().iter().map(|h| h.order.seq).collect();
        assert_eq!(
            handled,
            (0..10).collect::<Vec<_>>(),
            "the pending ones first"
        );
        assert_eq!(second.died(), None);
        return;
    }
    // Withheld: it gets every shard but shard 0.
    wait_until(
        "it is granted the shards without pending entries",
        WAIT,
        || second.assigned() == (1..SHARDS).collect(),
    )
    .await;
    let beats = second.shared.heartbeats.load(Ordering::SeqCst);
    wait_until("several heartbeats later", WAIT, || {
        second.shared.heartbeats.load(Ordering::SeqCst) > beats + 5
    })
    .await;
    assert!(
        !second.assigned().contains(&0),
        "shard 0 withheld while it has pending entries"
    );
    assert!(
        second.pending().contains(&0),
        "and listed as pending for it"
    );
    assert!(second.shared.first_read.lock().unwrap().get(&0).is_none());

    // An operator handles the stuck entries (XCLAIM, handle, XACK): the shard is granted, in order.
    let claimed: redis::Value = redis::cmd("XAUTOCLAIM")
        .arg(&shard0)
        .arg(GROUP)
        .arg("operator")
        .arg(0)
        .arg("0")
        .query_async(&mut conn)
        .await
        .unwrap();
    // XAUTOCLAIM's reply: [next cursor, [[id, fields], ..], deleted ids].
    let ids: Vec<Vec<u8>> = match claimed {
        redis::Value::Array(parts) => match &parts[1] {
            redis::Value::Array(entries) => entries
                .iter()
                .filter_map(|entry| match entry {
                    redis::Value::Array(pair) => match &pair[0] {
                        redis::Value::BulkString(id) => Some(id.clone()),
                        _ => None,
                    },
                    _ => None,
                })
                .collect(),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    };
    assert_eq!(ids.len(), 5);
    for (_, order) in &sent {
        log.push(order, "operator");
    }
    for id in ids {
        let _: i64 = redis::cmd("XACK")
            .arg(&shard0)
            .arg(GROUP)
            .arg(id)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    wait_until("shard 0 is granted once nothing is pending", WAIT, || {
        second.assigned().contains(&0)
    })
    .await;
    sent.extend(send(5..10).await);
    assert_complete(&url, stream, &log, &sent).await;
    assert_eq!(log.duplicates(), vec![]);
    assert_eq!(second.died(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_serve_one_group_and_leaves_in_both_shapes_hand_everything_back() {
    let redis = RedisServer::start();
    let url = redis.url();
    let stream = "replicas";
    create_group(&url, stream).await;
    let (one, two) = (serve(&url), serve(&url));
    let log = Log::default();
    let revoked = Arc::new(Mutex::new(BTreeMap::new()));
    let production = Production::start(&url, stream).await;
    let rust = rust_member(&url, stream, "rust-a", &log, &revoked).await;
    let python = HttpMember::start(
        &one.base(),
        &url,
        stream,
        GROUP,
        "py-a",
        Interval::Server,
        log.clone(),
    );
    let spring = HttpMember::start(
        &two.base(),
        &url,
        stream,
        GROUP,
        "jvm-b",
        Interval::Fixed(Duration::from_millis(300)),
        log.clone(),
    );
    wait_until("all three members handle entries", WAIT, || {
        let members = log.members();
        ["rust-a", "py-a", "jvm-b"]
            .iter()
            .all(|m| members.contains(*m))
    })
    .await;
    assert_eq!((python.died(), spring.died()), (None, None));

    // Our leave shape through one replica, Spring's through the other.
    let leaving_at = Instant::now();
    assert_eq!(python.stop(Stop::Leave), None, "our leave is answered OK");
    assert_eq!(
        spring.stop(Stop::SpringLeave),
        None,
        "Spring's leave is answered OK"
    );
    wait_until("the Rust member handles every shard again", WAIT, || {
        log.shards_handled_by("rust-a", leaving_at, SHARDS).len() == SHARDS as usize
    })
    .await;
    let sent = production.stop().await;
    assert_complete(&url, stream, &log, &sent).await;
    assert_eq!(log.duplicates(), vec![]);
    rust.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_mid_traffic_loses_nothing() {
    let redis = RedisServer::start();
    let url = redis.url();
    let stream = "restarted";
    create_group(&url, stream).await;
    let server = serve(&url);
    let addr = server.addr.to_string();
    let log = Log::default();
    let revoked = Arc::new(Mutex::new(BTreeMap::new()));
    let production = Production::start(&url, stream).await;
    let rust = rust_member(&url, stream, "rust-a", &log, &revoked).await;
    let spring = HttpMember::start(
        &server.base(),
        &url,
        stream,
        GROUP,
        "jvm-m0",
        Interval::Fixed(Duration::from_millis(300)),
        log.clone(),
    );
    wait_until("the HTTP member handles entries", WAIT, || {
        log.members().contains("jvm-m0")
    })
    .await;

    // SIGKILL of the server mid-traffic; the Spring member's heartbeats fail meanwhile.
    drop(server);
    wait_until("a heartbeat fails", WAIT, || {
        spring.shared.failed.load(Ordering::SeqCst) > 0
    })
    .await;
    let restarted = Server::start_at(
        &url,
        &addr,
        &["--hold-after-lease-ms", &HOLD_MS.to_string()],
    );
    let back = spring.shared.heartbeats.load(Ordering::SeqCst);
    let back_at = Instant::now();
    wait_until("it heartbeats through the restarted server", WAIT, || {
        spring.shared.heartbeats.load(Ordering::SeqCst) > back + 2
    })
    .await;
    wait_until("it handles entries after the restart", WAIT, || {
        log.entries()
            .iter()
            .any(|h| h.member == "jvm-m0" && h.at > back_at)
    })
    .await;
    let sent = production.stop().await;
    assert_complete(&url, stream, &log, &sent).await;
    assert_eq!(log.duplicates(), vec![]);
    assert_eq!(spring.stop(Stop::SpringLeave), None);
    drop(restarted);
    rust.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_refuses_the_unknown_and_the_unentitled_as_the_origin_does() {
    let redis = RedisServer::start();
    let url = redis.url();
    create_group(&url, "secured").await;
    let server = Server::start(
        &url,
        &[
            "--users",
            "alice:alice-pw:READ bob:bob-pw:MEMBER root:root-pw:ADMIN",
            "--token-secret",
            "a-secret-of-at-least-16-bytes",
            "--authenticate-heartbeats",
        ],
    );
    let base = server.base();
    let routing = format!("{base}/coord/v1/streams/secured/groups/{GROUP}/producer-routing");
    let get = |authorization: Option<&str>| request_with("GET", &routing, None, authorization);

    // 401: an empty body and the challenge.
    for authorization in [
        None,
        Some(basic("alice", "wrong")),
        Some("Bearer v1.forged.token".to_string()),
    ] {
        let (status, headers, body) = get(authorization.as_deref());
        assert_eq!(status, 401, "{authorization:?}");
        assert_eq!(body, "", "{authorization:?}");
        assert!(
            headers
                .iter()
                .any(|(k, v)| k == "www-authenticate" && v.starts_with("Basic")),
            "{headers:?}"
        );
    }
    // 403: authenticated without the role, the error body.
    let (status, _, body) = get(Some(&basic("bob", "bob-pw")));
    assert_eq!(status, 403);
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (error["status"].as_str(), error["errorCode"].as_str()),
        (Some("FORBIDDEN"), Some("FORBIDDEN"))
    );
    // Basic with the role, and a login's token.
    assert_eq!(get(Some(&basic("alice", "alice-pw"))).0, 200);
    let login = format!("{base}/coord/v1/auth/login");
    let (status, _, body) = request(
        "POST",
        &login,
        Some(
            json!({"username": "alice", "password": "alice-pw"})
                .to_string()
                .as_bytes(),
        ),
    );
    assert_eq!(status, 200, "{body}");
    let issued: Value = serde_json::from_str(&body).unwrap();
    let token = issued["accessToken"].as_str().unwrap().to_string();
    assert_eq!(issued["tokenType"], "Bearer");
    assert_eq!(issued["roles"], json!(["READ"]));
    assert!(issued["expiresInSeconds"].as_u64().unwrap() > 0);
    assert_eq!(get(Some(&format!("Bearer {token}"))).0, 200);
    let mut tampered = token.clone();
    tampered.pop();
    assert_eq!(get(Some(&format!("Bearer {tampered}"))).0, 401);
    let (status, _, body) = request(
        "POST",
        &login,
        Some(
            json!({"username": "alice", "password": "nope"})
                .to_string()
                .as_bytes(),
        ),
    );
    assert_eq!((status, body.as_str()), (401, ""));

    // Heartbeats need MEMBER here; health needs nothing.
    let heartbeat =
        format!("{base}/coord/v1/streams/secured/groups/{GROUP}/members/py-m0/heartbeat");
    let body = json!({
        "protocolVersion": 1, "requestId": "r-1", "memberId": "py-m0", "memberEpoch": 0,
        "metadataVersion": 0,
        "runtimeConsumerCapacity": {"runtimeMaxConcurrency": 1, "availableConcurrency": 1},
        "ownedShards": [], "revokingShards": [], "shardProgress": []
    })
    .to_string();
    let (status, _, _) = request("POST", &heartbeat, Some(body.as_bytes()));
    assert_eq!(status, 401);
    let (status, _, _) = request_with(
        "POST",
        &heartbeat,
        Some(body.as_bytes()),
        Some(&format!("Bearer {token}")),
    );
    assert_eq!(status, 403, "READ is not MEMBER");
    let (status, _, answer) = request_with(
        "POST",
        &heartbeat,
        Some(body.as_bytes()),
        Some(&basic("bob", "bob-pw")),
    );
    assert_eq!(status, 200, "{answer}");
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["status"], "OK", "{answer}");
    let (status, _, _) = request("GET", &format!("{base}/coord/v1/monitoring/health"), None);
    assert_eq!(status, 200);
    // The admin holds every role.
    assert_eq!(get(Some(&basic("root", "root-pw"))).0, 200);
}

/// The error body's `errorCode` (and that it is the origin's error body).
fn error_code(status_and_body: (u16, Vec<(String, String)>, String)) -> (u16, String) {
    let (status, _, body) = status_and_body;
    let error: Value =
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{status} {body}: {e}"));
    assert!(
        error["status"].is_string() && error["message"].is_string(),
        "{body}"
    );
    (
        status,
        error["errorCode"].as_str().unwrap_or_default().to_string(),
    )
}

/// The consumer groups on one shard stream.
async fn groups_on(url: &str, key: &str) -> Vec<String> {
    let mut conn = stream_listener_tests::connection(url).await;
    let groups: redis::Value = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap();
    stream_listener::reply::xinfo_groups(&groups)
        .unwrap()
        .into_iter()
        .map(|g| g.name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints_create_scale_and_roll_back_in_the_origin_shapes() {
    let redis = RedisServer::start();
    let url = redis.url();
    let server = Server::start(
        &url,
        &[
            "--users",
            "reader:reader-pw:READ writer:writer-pw:WRITE root:root-pw:ADMIN",
            "--token-secret",
            "a-secret-of-at-least-16-bytes",
            // A resize migrates for this long: the checks of a migration under way run well inside it.
            "--resize-grace-ms",
            "10000",
        ],
    );
    // Checks that need the resize still migrating run only while it surely is (half the grace since
    // the scale was asked for), so a stalled machine skips them instead of failing.
    let migrating = |since: Instant| since.elapsed() < Duration::from_secs(5);
    let base = server.base();
    let basic = |user: &str| basic(user, &format!("{user}-pw"));
    let (reader, writer, root) = (basic("reader"), basic("writer"), basic("root"));
    let call = |method: &str, path: &str, body: Option<Value>, who: Option<&str>| {
        let body = body.map(|b| b.to_string());
        request_with(
            method,
            &format!("{base}/coord/v1{path}"),
            body.as_deref().map(str::as_bytes),
            who,
        )
    };
    let json_of = |(status, _, body): (u16, Vec<(String, String)>, String)| -> (u16, Value) {
        (status, serde_json::from_str(&body).unwrap_or(Value::Null))
    };
    let create = json!({"initialShardCount": 2, "requestedBy": "op@example.com", "reason": "test"});

    // Stream create: 401 without credentials, 403 with READ only, 201 with WRITE, then 409.
    let (status, _, body) = call("POST", "/streams/adm", Some(create.clone()), None);
    assert_eq!((status, body.as_str()), (401, ""));
    assert_eq!(
        error_code(call(
            "POST",
            "/streams/adm",
            Some(create.clone()),
            Some(&reader)
        )),
        (403, "FORBIDDEN".into())
    );
    for (bad, why) in [
        (json!("not an object"), "not an object"),
        (json!({"initialShardCount": 2}), "no requestedBy"),
        (
            json!({"initialShardCount": 2, "requestedBy": " "}),
            "blank requestedBy",
        ),
        (
            json!({"initialShardCount": 0, "requestedBy": "op"}),
            "zero shards",
        ),
        (json!({"requestedBy": "op"}), "no shard count"),
    ] {
        assert_eq!(
            error_code(call("POST", "/streams/adm", Some(bad), Some(&writer))),
            (400, "MALFORMED_BODY".into()),
            "{why}"
        );
    }
    let (status, _, body) = request_with(
        "POST",
        &format!("{base}/coord/v1/streams/adm"),
        Some(b"{not json"),
        Some(&writer),
    );
    assert_eq!(status, 400, "{body}");
    let (status, created) = json_of(call(
        "POST",
        "/streams/adm",
        Some(create.clone()),
        Some(&writer),
    ));
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["streamPrefix"], "adm");
    assert_eq!(created["shardCount"], 2);
    let mut conn = stream_listener_tests::connection(&url).await;
    let topology = Topology::load(&mut conn, "adm").await.unwrap();
    assert_eq!(created["metadataVersion"], json!(topology.version()));
    assert_eq!(topology.shard_count(), 2);
    assert_eq!(
        error_code(call(
            "POST",
            "/streams/adm",
            Some(create.clone()),
            Some(&writer)
        )),
        (409, "STREAM_EXISTS".into())
    );

    // Group create: the consumer group on every shard and the group's metadata (an HTTP member can
    // join at once), 409 the second time, 409 for another shard count than the stream's.
    let group_body = json!({"requestedBy": "op@example.com"});
    assert_eq!(
        error_code(call(
            "POST",
            "/streams/adm/groups/g1",
            Some(group_body.clone()),
            Some(&reader)
        )),
        (403, "FORBIDDEN".into())
    );
    assert_eq!(
        error_code(call(
            "POST",
            "/streams/adm/groups/g1",
            Some(json!({"reason": "x"})),
            Some(&root)
        )),
        (400, "MALFORMED_BODY".into())
    );
    let (status, group) = json_of(call(
        "POST",
        "/streams/adm/groups/g1",
        Some(group_body.clone()),
        Some(&root),
    ));
    assert_eq!(status, 201, "{group}");
    assert_eq!(
        (
            &group["streamPrefix"],
            &group["consumerGroup"],
            &group["shardCount"],
            &group["state"]
        ),
        (&json!("adm"), &json!("g1"), &json!(2), &json!("EMPTY")),
        "{group}"
    );
    assert!(
        group["groupEpoch"].is_i64() && group["metadataVersion"].is_i64(),
        "{group}"
    );
    for shard in 0..2 {
        assert_eq!(
            groups_on(&url, &format!("adm:{shard}")).await,
            vec!["g1".to_string()]
        );
    }
    assert_eq!(
        error_code(call(
            "POST",
            "/streams/adm/groups/g1",
            Some(group_body.clone()),
            Some(&root)
        )),
        (409, "GROUP_EXISTS".into())
    );
    assert_eq!(
        error_code(call(
            "POST",
            "/streams/adm/groups/g2",
            Some(json!({"initialShardCount": 3, "requestedBy": "op"})),
            Some(&root)
        )),
        (409, "SHARD_COUNT_MISMATCH".into())
    );
    assert_eq!(
        error_code(call(
            "POST",
            "/streams/nowhere/groups/g",
            Some(group_body.clone()),
            Some(&root)
        )),
        (400, "MALFORMED_BODY".into()),
        "a group of a stream without topology needs initialShardCount"
    );
    let (status, answer) = json_of(call(
        "POST",
        "/streams/adm/groups/g1/members/py-0/heartbeat",
        Some(json!({
            "protocolVersion": 1, "requestId": "r-1", "memberId": "py-0", "memberEpoch": 0,
            "metadataVersion": 0,
            "runtimeConsumerCapacity": {"runtimeMaxConcurrency": 1, "availableConcurrency": 1},
            "ownedShards": [], "revokingShards": [], "shardProgress": []
        })),
        None,
    ));
    assert_eq!((status, &answer["status"]), (200, &json!("OK")), "{answer}");
    assert!(answer["memberEpoch"].as_i64().unwrap() > 0, "{answer}");

    // Group get: READ suffices; 401, 404.
    assert_eq!(call("GET", "/streams/adm/groups/g1", None, None).0, 401);
    let (status, got) = json_of(call("GET", "/streams/adm/groups/g1", None, Some(&reader)));
    assert_eq!(status, 200, "{got}");
    assert_eq!(
        (&got["consumerGroup"], &got["shardCount"]),
        (&json!("g1"), &json!(2))
    );
    assert_eq!(got["activeMigration"], Value::Null);
    assert_eq!(
        error_code(call("GET", "/streams/adm/groups/none", None, Some(&reader))),
        (404, "GROUP_NOT_FOUND".into())
    );

    // Group scale (the group is the stream's only one): the stream's resize, 202 Migration.
    let scale = |to: u32| json!({"targetShardCount": to, "requestedBy": "op", "reason": "load"});
    assert_eq!(
        error_code(call(
            "POST",
            "/streams/adm/groups/g1/scale",
            Some(scale(3)),
            Some(&reader)
        )),
        (403, "FORBIDDEN".into())
    );
    assert_eq!(
        error_code(call(
            "POST",
            "/streams/adm/groups/g1/scale",
            Some(json!({"targetShardCount": 3, "requestedBy": "op"})),
            Some(&writer)
        )),
        (400, "MALFORMED_BODY".into()),
        "no reason"
    );
    assert_eq!(
        error_code(call(
            "POST",
            "/streams/adm/groups/g1/scale",
            Some(scale(0)),
            Some(&writer)
        )),
        (501, "SCALE_TO_ZERO_UNSUPPORTED".into())
    );
    assert_eq!(
        error_code(call(
            "POST",
            "/streams/adm/groups/g1/scale",
            Some(scale(2)),
            Some(&writer)
        )),
        (409, "SHARD_COUNT_UNCHANGED".into())
    );
    let scaled = Instant::now();
    let (status, migration) = json_of(call(
        "POST",
        "/streams/adm/groups/g1/scale",
        Some(scale(3)),
        Some(&writer),
    ));
    assert_eq!(status, 202, "{migration}");
    let topology = Topology::load(&mut conn, "adm").await.unwrap();
    assert_eq!(topology.shard_count(), 3);
    let id = migration["reshardingId"].as_str().unwrap().to_string();
    assert_eq!(id, topology.version().to_string());
    assert_eq!(
        (&migration["fromShardCount"], &migration["toShardCount"]),
        (&json!(2), &json!(3)),
        "{migration}"
    );
    // Answered within the grace (10 s) of the resize it made: still migrating.
    if migrating(scaled) {
        assert_eq!(migration["state"], "ACTIVE", "{migration}");
    }
    assert_eq!(
        groups_on(&url, "adm:2").await,
        vec!["g1".to_string()],
        "the new shard is read"
    );
    if migrating(scaled) {
        assert_eq!(
            error_code(call(
                "POST",
                "/streams/adm/groups/g1/scale",
                Some(scale(4)),
                Some(&writer)
            )),
            (409, "MIGRATION_IN_PROGRESS".into()),
            "the library refuses a resize while the last one migrates"
        );
    } else {
        eprintln!("skipped the in-migration checks: the machine took over 5 s");
    }
    let (_, got) = json_of(call("GET", "/streams/adm/groups/g1", None, Some(&reader)));
    if migrating(scaled) {
        assert_eq!(got["activeMigration"]["reshardingId"], json!(id), "{got}");
    }

    // Migrations: one, by id; the monitoring list.
    let (status, one) = json_of(call(
        "GET",
        &format!("/streams/adm/groups/g1/migrations/{id}"),
        None,
        Some(&reader),
    ));
    assert_eq!((status, &one["toShardCount"]), (200, &json!(3)), "{one}");
    assert_eq!(
        call(
            "GET",
            &format!("/streams/adm/groups/g1/migrations/{id}"),
            None,
            None
        )
        .0,
        401
    );
    for unknown in ["999", "1", "abc"] {
        assert_eq!(
            error_code(call(
                "GET",
                &format!("/streams/adm/groups/g1/migrations/{unknown}"),
                None,
                Some(&reader)
            )),
            (404, "MIGRATION_NOT_FOUND".into()),
            "{unknown}"
        );
    }
    let (status, list) = json_of(call(
        "GET",
        "/monitoring/streams/adm/groups/g1/migrations",
        None,
        Some(&reader),
    ));
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["migrations"].as_array().unwrap().len(), 1, "{list}");
    if migrating(scaled) {
        assert_eq!(list["activeReshardingId"], json!(id), "{list}");
    }

    // Rollback: auth and body first; refused while the resize migrates; then 202, back to 2 shards.
    let audited = json!({"requestedBy": "op", "reason": "undo"});
    let rollback = format!("/streams/adm/groups/g1/migrations/{id}/rollback");
    assert_eq!(call("POST", &rollback, Some(audited.clone()), None).0, 401);
    assert_eq!(
        error_code(call(
            "POST",
            &rollback,
            Some(audited.clone()),
            Some(&reader)
        )),
        (403, "FORBIDDEN".into())
    );
    assert_eq!(
        error_code(call(
            "POST",
            &rollback,
            Some(json!({"requestedBy": "op"})),
            Some(&writer)
        )),
        (400, "MALFORMED_BODY".into())
    );
    let deadline = Instant::now() + WAIT;
    let (status, rolled) = loop {
        let (status, body) = json_of(call(
            "POST",
            &rollback,
            Some(audited.clone()),
            Some(&writer),
        ));
        if status == 409
            && body["errorCode"] == "MIGRATION_IN_PROGRESS"
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        break (status, body);
    };
    assert_eq!(status, 202, "{rolled}");
    assert_eq!(rolled["state"], "ROLLING_BACK", "{rolled}");
    let topology = Topology::load(&mut conn, "adm").await.unwrap();
    assert_eq!(topology.shard_count(), 2);
    assert_eq!(
        rolled["rollbackReshardingId"],
        json!(topology.version().to_string())
    );
    let (_, one) = json_of(call(
        "GET",
        &format!("/streams/adm/groups/g1/migrations/{id}"),
        None,
        Some(&reader),
    ));
    assert_eq!(one["state"], "ROLLED_BACK", "{one}");
    assert_eq!(
        error_code(call(
            "POST",
            &rollback,
            Some(audited.clone()),
            Some(&writer)
        )),
        (409, "NOT_LATEST_MIGRATION".into())
    );

    // A second group: the group scale is refused (the shard count is the stream's), the stream scale
    // resizes for both.
    let (status, _, body) = call(
        "POST",
        "/streams/solo/groups/a",
        Some(json!({"initialShardCount": 1, "requestedBy": "op"})),
        Some(&root),
    );
    assert_eq!(status, 201, "{body}");
    let (status, _, body) = call(
        "POST",
        "/streams/solo/groups/b",
        Some(group_body.clone()),
        Some(&root),
    );
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        error_code(call(
            "POST",
            "/streams/solo/groups/a/scale",
            Some(scale(2)),
            Some(&writer)
        )),
        (409, "SCALE_IS_PER_STREAM".into())
    );
    assert_eq!(
        error_code(call(
            "POST",
            "/streams/nowhere/scale",
            Some(scale(2)),
            Some(&writer)
        )),
        (404, "STREAM_NOT_FOUND".into())
    );
    assert_eq!(
        error_code(call(
            "POST",
            "/streams/solo/scale",
            Some(json!({"targetShardCount": "two"})),
            Some(&writer)
        )),
        (400, "MALFORMED_BODY".into())
    );
    assert_eq!(
        error_code(call(
            "POST",
            "/streams/solo/scale",
            Some(scale(2)),
            Some(&reader)
        )),
        (403, "FORBIDDEN".into())
    );
    let (status, scaled) = json_of(call(
        "POST",
        "/streams/solo/scale",
        Some(scale(2)),
        Some(&writer),
    ));
    assert_eq!(status, 202, "{scaled}");
    assert_eq!(scaled["targetShardCount"], 2);
    assert_eq!(
        scaled["affectedConsumerGroups"],
        json!(["a", "b"]),
        "{scaled}"
    );
    let migrations = scaled["migrations"].as_array().unwrap();
    assert_eq!(migrations.len(), 2);
    assert!(migrations
        .iter()
        .all(|m| m["fromShardCount"] == 1 && m["toShardCount"] == 2));
    assert_eq!(
        Topology::load(&mut conn, "solo")
            .await
            .unwrap()
            .shard_count(),
        2
    );
    let mut on_new = groups_on(&url, "solo:1").await;
    on_new.sort();
    assert_eq!(on_new, vec!["a".to_string(), "b".to_string()]);

    // Delete: no safe equivalent, 501 with the error body (after auth, body and existence).
    let delete = json!({"requestedBy": "op", "reason": "gone", "force": false});
    assert_eq!(
        call(
            "DELETE",
            "/streams/adm/groups/g1",
            Some(delete.clone()),
            None
        )
        .0,
        401
    );
    assert_eq!(
        error_code(call(
            "DELETE",
            "/streams/adm/groups/g1",
            Some(delete.clone()),
            Some(&reader)
        )),
        (403, "FORBIDDEN".into())
    );
    assert_eq!(
        error_code(call(
            "DELETE",
            "/streams/adm/groups/g1",
            Some(json!({"requestedBy": "op"})),
            Some(&writer)
        )),
        (400, "MALFORMED_BODY".into())
    );
    assert_eq!(
        error_code(call(
            "DELETE",
            "/streams/adm/groups/none",
            Some(delete.clone()),
            Some(&writer)
        )),
        (404, "GROUP_NOT_FOUND".into())
    );
    assert_eq!(
        error_code(call(
            "DELETE",
            "/streams/adm/groups/g1",
            Some(delete.clone()),
            Some(&root)
        )),
        (501, "GROUP_DELETE_UNSUPPORTED".into())
    );
    let (status, _) = json_of(call("GET", "/streams/adm/groups/g1", None, Some(&reader)));
    assert_eq!(status, 200, "the group is still there");

    // The served document lists every admin operation.
    let (_, document) = json_of(call("GET", "/openapi.json", None, Some(&reader)));
    for (path, method) in [
        ("/coord/v1/streams/{streamPrefix}", "post"),
        ("/coord/v1/streams/{streamPrefix}/groups/{consumerGroup}", "post"),
        ("/coord/v1/streams/{streamPrefix}/groups/{consumerGroup}", "get"),
        ("/coord/v1/streams/{streamPrefix}/groups/{consumerGroup}", "delete"),
        ("/coord/v1/streams/{streamPrefix}/scale", "post"),
        ("/coord/v1/streams/{streamPrefix}/groups/{consumerGroup}/scale", "post"),
        (
            "/coord/v1/streams/{streamPrefix}/groups/{consumerGroup}/migrations/{reshardingId}",
            "get",
        ),
        (
            "/coord/v1/streams/{streamPrefix}/groups/{consumerGroup}/migrations/{reshardingId}/rollback",
            "post",
        ),
        (
            "/coord/v1/monitoring/streams/{streamPrefix}/groups/{consumerGroup}/migrations",
            "get",
        ),
        (
            "/coord/v1/monitoring/streams/{streamPrefix}/groups/{consumerGroup}/offsets",
            "get",
        ),
        (
            "/coord/v1/monitoring/streams/{streamPrefix}/groups/{consumerGroup}/consumption",
            "get",
        ),
        ("/metrics", "get"),
    ] {
        assert!(
            document["paths"][path][method].is_object(),
            "{method} {path} is not documented"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_and_metrics_report_what_redis_and_the_server_hold() {
    let redis = RedisServer::start();
    let url = redis.url();
    create_group(&url, "obs").await;
    let mut conn = stream_listener_tests::connection(&url).await;
    let mut ids = Vec::new();
    for (shard, n) in [(0, 3), (1, 2)] {
        for i in 0..n {
            let id: String = redis::cmd("XADD")
                .arg(format!("obs:{shard}"))
                .arg("*")
                .arg("k")
                .arg(i)
                .query_async(&mut conn)
                .await
                .unwrap();
            ids.push((shard, id));
        }
    }
    // Two of shard 0's three entries delivered, not acknowledged.
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(GROUP)
        .arg("c")
        .arg("COUNT")
        .arg(2)
        .arg("STREAMS")
        .arg("obs:0")
        .arg(">")
        .query_async(&mut conn)
        .await
        .unwrap();
    let server = Server::start(
        &url,
        &[
            "--users",
            "reader:reader-pw:READ member:member-pw:MEMBER",
            "--token-secret",
            "a-secret-of-at-least-16-bytes",
        ],
    );
    let base = server.base();
    let basic = |user: &str| basic(user, &format!("{user}-pw"));
    let offsets = format!("{base}/coord/v1/monitoring/streams/obs/groups/{GROUP}/offsets");
    assert_eq!(request("GET", &offsets, None).0, 401);
    let (status, _, body) = request_with("GET", &offsets, None, Some(&basic("member")));
    assert_eq!(status, 403, "{body}");
    let (status, _, body) = request_with("GET", &offsets, None, Some(&basic("reader")));
    assert_eq!(status, 200, "{body}");
    let view: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (&view["streamPrefix"], &view["consumerGroup"]),
        (&json!("obs"), &json!(GROUP))
    );
    assert_eq!(view["totalStreamLength"], 5, "{view}");
    assert_eq!(view["totalPendingCount"], 2, "{view}");
    assert_eq!(view["totalLag"], 3, "{view}");
    let shards = view["shards"].as_array().unwrap();
    assert_eq!(shards.len(), SHARDS as usize);
    let zero = &shards[0];
    let shard0: Vec<&String> = ids
        .iter()
        .filter(|(s, _)| *s == 0)
        .map(|(_, id)| id)
        .collect();
    assert_eq!(zero["shard"]["shardIndex"], 0);
    assert_eq!(zero["streamKey"], "obs:0");
    assert_eq!(
        zero["redisSlot"],
        json!(stream_listener::connection::slot_of(b"obs:0"))
    );
    assert_eq!(zero["streamLength"], 3);
    assert_eq!(zero["firstRecordId"], json!(shard0[0]));
    assert_eq!(zero["lastRecordId"], json!(shard0[2]));
    assert_eq!(zero["groupLastDeliveredId"], json!(shard0[1]));
    assert_eq!(
        (&zero["pendingCount"], &zero["lag"]),
        (&json!(2), &json!(1))
    );
    assert!(zero["memoryUsageBytes"].as_u64().unwrap() > 0, "{zero}");
    assert_eq!(zero["ownerMemberIds"], json!([]), "the creator left");
    assert_eq!(
        (&shards[1]["lag"], &shards[1]["pendingCount"]),
        (&json!(2), &json!(0))
    );
    assert_eq!(
        (&shards[3]["streamLength"], &shards[3]["firstRecordId"]),
        (&json!(0), &Value::Null)
    );
    assert_eq!(view["memoryUsageKnown"], true);
    for (path, code) in [
        ("obs/groups/none".to_string(), "GROUP_NOT_FOUND"),
        (format!("nowhere/groups/{GROUP}"), "STREAM_NOT_FOUND"),
    ] {
        let (status, _, body) = request_with(
            "GET",
            &format!("{base}/coord/v1/monitoring/streams/{path}/offsets"),
            None,
            Some(&basic("reader")),
        );
        assert_eq!(status, 404, "{body}");
        let error: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(error["errorCode"], code, "{body}");
    }

    // /metrics: READ; the per-route counters (route templates, not paths) and the library's store
    // totals.
    let metrics = format!("{base}/metrics");
    assert_eq!(request("GET", &metrics, None).0, 401);
    assert_eq!(
        request_with("GET", &metrics, None, Some(&basic("member"))).0,
        403
    );
    let heartbeat = format!("{base}/coord/v1/streams/obs/groups/{GROUP}/members/py-0/heartbeat");
    let join = json!({
        "protocolVersion": 1, "requestId": "r-1", "memberId": "py-0", "memberEpoch": 0,
        "metadataVersion": 0,
        "runtimeConsumerCapacity": {"runtimeMaxConcurrency": 1, "availableConcurrency": 1},
        "ownedShards": [], "revokingShards": [], "shardProgress": []
    })
    .to_string();
    let (status, _, body) = request("POST", &heartbeat, Some(join.as_bytes()));
    assert_eq!(status, 200, "{body}");
    let (status, headers, page) = request_with("GET", &metrics, None, Some(&basic("reader")));
    assert_eq!(status, 200, "{page}");
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == "content-type" && v.starts_with("text/plain")),
        "{headers:?}"
    );
    let sample = |name: &str, labels: &str| -> Option<f64> {
        page.lines()
            .find(|l| l.starts_with(name) && labels.split(',').all(|label| l.contains(label)))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    };
    let offsets_route = r#"route="/coord/v1/monitoring/streams/{stream}/groups/{group}/offsets""#;
    assert_eq!(
        sample(
            "stream_listener_serve_requests_total",
            &format!(r#"{offsets_route},status="200""#)
        ),
        Some(1.0),
        "{page}"
    );
    assert_eq!(
        sample(
            "stream_listener_serve_requests_total",
            &format!(r#"{offsets_route},status="404""#)
        ),
        Some(2.0),
        "{page}"
    );
    assert!(
        sample(
            "stream_listener_serve_request_duration_seconds_count",
            offsets_route
        )
        .is_some_and(|n| n >= 3.0),
        "{page}"
    );
    assert!(
        !page.contains("obs/groups"),
        "paths are never labels: {page}"
    );
    assert!(
        sample("stream_listener_store_commits_total", "").is_some_and(|n| n >= 1.0),
        "the join committed: {page}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumption_names_each_shards_owner_and_the_groups_position() {
    let redis = RedisServer::start();
    let url = redis.url();
    create_group(&url, "prog").await;
    let mut conn = stream_listener_tests::connection(&url).await;
    let mut last = BTreeMap::new();
    for shard in 0..SHARDS {
        let id: String = redis::cmd("XADD")
            .arg(format!("prog:{shard}"))
            .arg("*")
            .arg("p")
            .arg(json!({"key": format!("k{shard}"), "seq": 0}).to_string())
            .query_async(&mut conn)
            .await
            .unwrap();
        last.insert(shard, id);
    }
    let server = Server::start(
        &url,
        &[
            "--users",
            "reader:reader-pw:READ member:member-pw:MEMBER",
            "--token-secret",
            "a-secret-of-at-least-16-bytes",
        ],
    );
    let basic = |user: &str| basic(user, &format!("{user}-pw"));
    let consumption = format!(
        "{}/coord/v1/monitoring/streams/prog/groups/{GROUP}/consumption",
        server.base()
    );
    assert_eq!(request("GET", &consumption, None).0, 401);
    assert_eq!(
        request_with("GET", &consumption, None, Some(&basic("member"))).0,
        403
    );
    let (status, _, body) = request_with("GET", &consumption, None, Some(&basic("reader")));
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["progress"],
        json!([]),
        "nobody owns a shard yet"
    );
    let log = Log::default();
    let py = HttpMember::start(
        &server.base(),
        &url,
        "prog",
        GROUP,
        "py-0",
        Interval::Server,
        log.clone(),
    );
    let rows = Arc::new(Mutex::new(Value::Null));
    wait_until(
        "every shard owned by py-0 and read to its end",
        WAIT,
        || {
            let (status, _, body) = request_with("GET", &consumption, None, Some(&basic("reader")));
            let view: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            let done = status == 200
                && view["progress"].as_array().is_some_and(|rows| {
                    rows.len() == SHARDS as usize
                        && rows.iter().all(|row| {
                            let shard = row["shard"]["shardIndex"].as_u64().unwrap_or(99) as u32;
                            row["memberId"] == "py-0"
                                && row["lastDeliveredId"] == json!(last.get(&shard))
                                && row["pendingCount"] == 0
                        })
                });
            *rows.lock().unwrap() = view;
            done
        },
    )
    .await;
    let view = rows.lock().unwrap().clone();
    let row = &view["progress"][0];
    assert_eq!(row["memberState"], "ACTIVE", "{view}");
    assert_eq!(row["streamKey"], "prog:0", "{view}");
    assert_eq!(
        (&row["lastAckedId"], &row["updatedAt"]),
        (&Value::Null, &Value::Null)
    );
    assert_eq!(py.died(), None);
    let (status, _, body) = request_with(
        "GET",
        &format!(
            "{}/coord/v1/monitoring/streams/prog/groups/none/consumption",
            server.base()
        ),
        None,
        Some(&basic("reader")),
    );
    assert_eq!(status, 404, "{body}");
    py.stop(Stop::Leave);
}
