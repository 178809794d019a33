//! The origin's Grafana endpoints against a running server: every query its dashboards make
//! (`grafana_queries.json`, extracted from them) answers rows with every column the panel reads, and
//! the rows say what Redis and the group hold; message pages (one shard, all merged, tail cursors, a
//! record id) visit every entry once in order; bad parameters are 400s in the origin's error body.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use stream_listener_test_support::{wait_for_blocking, RedisServer};

use super::server::{basic, get_json as get, request_with, Server};
use super::{create_group, GROUP, SHARDS, WAIT};

const STREAM: &str = "graf";
/// Entries per shard: shard `s` gets ids `(2k + s + 1)-0`, so merged by id they alternate 0, 1, 0, 1.
const PER_SHARD: u64 = 30;

fn rows(url: &str, auth: &str) -> Vec<Value> {
    let (status, body) = get(url, Some(auth));
    assert_eq!(status, 200, "{url}: {body}");
    body.as_array()
        .unwrap_or_else(|| panic!("{url}: not an array: {body}"))
        .clone()
}

/// A member that heartbeats over HTTP every 100 ms and owns what it is granted, reading nothing (so the
/// lag stays what the test wrote).
struct Heartbeats {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Heartbeats {
    fn start(base: &str, id: &'static str) -> Self {
        let url = format!("{base}/coord/v1/streams/{STREAM}/groups/{GROUP}/members/{id}/heartbeat");
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut epoch, mut version, mut owned) = (0i64, 0i64, Vec::<Value>::new());
            for seq in 0..100_000u64 {
                if flag.load(Ordering::Relaxed) {
                    break;
                }
                let body = json!({
                    "protocolVersion": 1, "requestId": format!("{id}-{seq}"), "memberId": id,
                    "memberEpoch": epoch, "metadataVersion": version,
                    "runtimeConsumerCapacity": {"runtimeMaxConcurrency": 4, "availableConcurrency": 1},
                    "ownedShards": owned, "revokingShards": [], "shardProgress": [],
                });
                let (status, _, text) =
                    request_with("POST", &url, Some(body.to_string().as_bytes()), None);
                if status == 200 {
                    let r: Value = serde_json::from_str(&text).unwrap();
                    if r["status"] == "OK" {
                        epoch = r["memberEpoch"].as_i64().unwrap();
                        version = r["metadataVersion"].as_i64().unwrap();
                        owned = r["assignment"]["assignedShards"]
                            .as_array()
                            .unwrap()
                            .clone();
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Heartbeats {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grafana_rows_serve_the_origins_dashboards_and_say_what_redis_holds() {
    let redis = RedisServer::start();
    let url = redis.url();
    create_group(&url, STREAM).await;
    create_group(&url, "graf-b").await;
    let mut conn = stream_listener_tests::connection(&url).await;
    let mut ids: Vec<Vec<String>> = vec![Vec::new(); 2];
    for k in 0..PER_SHARD {
        for shard in 0..2u64 {
            let id = format!("{}-0", 2 * k + shard + 1);
            let _: String = redis::cmd("XADD")
                .arg(format!("{STREAM}:{shard}"))
                .arg(&id)
                .arg("payload")
                .arg(format!("p{shard}-{k}"))
                .arg("k")
                .arg(k)
                .query_async(&mut conn)
                .await
                .unwrap();
            ids[shard as usize].push(id);
        }
    }
    let server = Server::start(
        &url,
        &[
            "--users",
            "grafana:grafana-pw:READ member:member-pw:MEMBER",
            "--token-secret",
            "a-secret-of-at-least-16-bytes",
        ],
    );
    let base = server.base();
    let g = format!("{base}/coord/v1/monitoring/grafana");
    let reader = basic("grafana", "grafana-pw");
    let member = Heartbeats::start(&base, "py-0");
    let q = format!("streamPrefix={STREAM}&consumerGroup={GROUP}");
    wait_for_blocking("py-0 owns every shard", WAIT, || {
        rows(&format!("{g}/shards?{q}"), &reader)
            .iter()
            .all(|r| r["ownerState"] == "CURRENT" && r["currentOwnerMemberIds"] == "py-0")
            .then_some(())
    });

    // Every query of the origin's dashboards: 200, rows, every column the panel reads.
    let fixture: Value =
        serde_json::from_str(include_str!("grafana_queries.json")).expect("the fixture is JSON");
    for query in fixture["queries"].as_array().unwrap() {
        let path = query["url"]
            .as_str()
            .unwrap()
            .replace("$streamPrefix", STREAM)
            .replace("$consumerGroup", GROUP);
        let found = rows(&format!("{base}{path}"), &reader);
        assert!(!found.is_empty(), "{path}: no rows");
        for row in &found {
            for column in query["columns"].as_array().unwrap() {
                let column = column.as_str().unwrap();
                assert!(
                    row.get(column).is_some(),
                    "{path} ({}): no {column:?} in {row}",
                    query["panel"]
                        .as_str()
                        .or(query["variable"].as_str())
                        .unwrap()
                );
            }
        }
    }
    assert_eq!(get(&format!("{g}/groups"), None).0, 401);
    assert_eq!(get(&format!("{g}/shards?{q}"), None).0, 401);

    // Options.
    assert_eq!(
        rows(&format!("{g}/options/streams"), &reader),
        vec![
            json!({"__text": STREAM, "__value": STREAM}),
            json!({"__text": "graf-b", "__value": "graf-b"})
        ]
    );
    assert_eq!(
        rows(
            &format!("{g}/options/consumer-groups?streamPrefix=graf-b"),
            &reader
        ),
        vec![json!({"__text": format!("graf-b / {GROUP}"), "__value": GROUP})]
    );
    assert_eq!(
        rows(&format!("{g}/options/consumer-groups"), &reader).len(),
        2
    );
    let shard_options: Vec<Value> = (0..SHARDS)
        .map(|i| json!({"__text": format!(":{i}"), "__value": i.to_string()}))
        .collect();
    assert_eq!(
        rows(&format!("{g}/options/shards?{q}"), &reader),
        shard_options
    );

    // Groups: the two, with what Redis holds.
    let groups = rows(&format!("{g}/groups"), &reader);
    assert_eq!(groups.len(), 2);
    let graf = &groups[0];
    assert_eq!(
        (&graf["streamPrefix"], &graf["consumerGroup"]),
        (&json!(STREAM), &json!(GROUP))
    );
    assert_eq!(graf["shardCount"], SHARDS);
    assert_eq!(graf["activeMembers"], 1, "{graf}");
    assert_eq!(graf["currentShards"], SHARDS, "{graf}");
    assert_eq!(graf["assignedShardRatio"], format!("{SHARDS} / {SHARDS}"));
    assert_eq!(graf["totalStreamLength"], 2 * PER_SHARD);
    assert_eq!(graf["totalLag"], 2 * PER_SHARD, "nothing was read");
    assert_eq!(graf["totalPendingCount"], 0);
    assert!(
        graf["totalMemoryUsageBytes"].as_u64().unwrap() > 0,
        "{graf}"
    );
    assert_eq!(graf["memoryUsageKnown"], true);
    assert_eq!(groups[1]["totalStreamLength"], 0);

    // Members: py-0 with its capacity and a lease one session timeout (1.5 s) after its heartbeat.
    let members = rows(&format!("{g}/members?{q}"), &reader);
    let py = members.iter().find(|m| m["memberId"] == "py-0").unwrap();
    assert_eq!(py["state"], "ACTIVE");
    assert_eq!(py["currentShardCount"], SHARDS);
    assert_eq!(
        (&py["runtimeMaxConcurrency"], &py["activeConsumerWorkers"]),
        (&json!(4), &json!(3))
    );
    let (beat, lease) = (
        py["lastHeartbeatAt"].as_str().unwrap(),
        py["memberLeaseExpiresAt"].as_str().unwrap(),
    );
    assert!(
        beat.ends_with('Z') && lease.ends_with('Z') && beat < lease,
        "{py}"
    );

    // Assignments: py-0 is target and current owner of each, revoking nothing.
    let assignments = rows(&format!("{g}/assignments?{q}"), &reader);
    assert_eq!(assignments.len(), SHARDS as usize);
    for (i, a) in assignments.iter().enumerate() {
        assert_eq!(
            a,
            &json!({"streamPrefix": STREAM, "consumerGroup": GROUP, "shardIndex": i,
                "targetOwners": "py-0", "currentOwners": "py-0", "revokingOwners": ""})
        );
    }

    // Shards: one group's, and with blank parameters every group's.
    let shards = rows(&format!("{g}/shards?{q}"), &reader);
    assert_eq!(shards.len(), SHARDS as usize);
    let one = &shards[1];
    assert_eq!(one["streamKey"], format!("{STREAM}:1"));
    assert_eq!(one["shardLabel"], ":1");
    assert_eq!(
        one["redisSlot"],
        json!(stream_listener::connection::slot_of(b"graf:1"))
    );
    assert_eq!(one["redisNodeEndpoint"], Value::Null, "not a cluster");
    assert_eq!(one["streamLength"], PER_SHARD);
    assert_eq!(one["firstRecordId"], json!(ids[1][0]));
    assert_eq!(one["lastRecordId"], json!(ids[1].last().unwrap()));
    assert_eq!(one["lastGeneratedId"], json!(ids[1].last().unwrap()));
    assert_eq!(
        (&one["lag"], &one["lagKnown"]),
        (&json!(PER_SHARD), &json!(true))
    );
    assert_eq!(shards[2]["streamLength"], 0);
    assert_eq!(
        rows(&format!("{g}/shards?streamPrefix=&consumerGroup="), &reader).len(),
        2 * SHARDS as usize
    );
    assert_eq!(
        rows(
            &format!("{g}/shards?streamPrefix=graf-b&consumerGroup="),
            &reader
        )
        .len(),
        SHARDS as usize
    );

    // Rates: null at first, then what was added in between, over at least a second.
    let rate_of = |shard: usize| rows(&format!("{g}/shards?{q}"), &reader)[shard].clone();
    let before = rate_of(3);
    for i in 0..50 {
        let _: String = redis::cmd("XADD")
            .arg(format!("{STREAM}:3"))
            .arg("*")
            .arg("k")
            .arg(i)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let after = wait_for_blocking("a produced rate on shard 3", WAIT, || {
        let row = rate_of(3);
        row["producedPerSecond"]
            .as_f64()
            .filter(|r| *r > 0.0)
            .map(|_| row)
    });
    let produced = after["producedPerSecond"].as_f64().unwrap();
    assert!(
        produced <= 50.0,
        "50 entries over at least a second: {after} after {before}"
    );
    assert_eq!(after["consumedPerSecond"], 0.0, "nothing was read: {after}");

    // Messages of one shard, newest first, paged by cursor: every entry once, in order.
    let m = format!("{g}/messages?{q}");
    let page = |query: &str| rows(&format!("{m}&{query}"), &reader);
    let mut seen = Vec::new();
    let mut cursor = String::new();
    for _ in 0..10 {
        let rows = page(&format!("shardIndex=1&limit=7&cursor={cursor}"));
        seen.extend(
            rows.iter()
                .map(|r| r["recordId"].as_str().unwrap().to_string()),
        );
        let first = &rows[0];
        assert_eq!(
            (
                &first["pageDirection"],
                &first["pageLimit"],
                &first["pageTotalMessages"]
            ),
            (&json!("BACKWARD"), &json!(7), &json!(PER_SHARD))
        );
        match first["pageNextCursor"].as_str() {
            Some(next) => cursor = next.to_string(),
            None => break,
        }
    }
    let newest_first: Vec<String> = ids[1].iter().rev().cloned().collect();
    assert_eq!(seen, newest_first);
    let row = &page("shardIndex=1&limit=1")[0];
    assert_eq!(
        row,
        &json!({
            "streamPrefix": STREAM, "consumerGroup": GROUP, "shardIndex": 1, "shardSelector": "1",
            "shardLabel": ":1", "streamKey": "graf:1", "recordId": ids[1].last().unwrap(),
            "payload": format!("p1-{}", PER_SHARD - 1),
            "fieldsJson": format!("{{\"k\":\"{}\",\"payload\":\"p1-{}\"}}", PER_SHARD - 1, PER_SHARD - 1),
            "pageDirection": "BACKWARD", "pageLimit": 1, "pageNextCursor": ids[1].last().unwrap(),
            "pageTotalMessages": PER_SHARD, "recordTimestampMs": 2 * PER_SHARD,
            "recordTime": "1970-01-01T00:00:00.060Z",
        })
    );

    // All shards merged by id, forward: 0, 1, 0, 1, .. (shards 2 and 3's entries are newer).
    let mut merged = Vec::new();
    let mut cursor = String::new();
    for _ in 0..20 {
        let rows = page(&format!(
            "shardIndex=all&direction=FORWARD&limit=7&cursor={cursor}"
        ));
        merged.extend(rows.iter().map(|r| {
            (
                r["shardIndex"].as_u64().unwrap(),
                r["recordId"].as_str().unwrap().to_string(),
            )
        }));
        match rows.first().and_then(|r| r["pageNextCursor"].as_str()) {
            Some(next) => cursor = next.to_string(),
            None => break,
        }
    }
    let expected: Vec<(u64, String)> = (0..2 * PER_SHARD as usize)
        .map(|n| ((n % 2) as u64, ids[n % 2][n / 2].clone()))
        .collect();
    assert_eq!(merged[..expected.len()], expected[..]);
    assert_eq!(
        merged.len(),
        expected.len() + 50,
        "and shard 3's 50, once each"
    );

    // Tail cursors: the last page of 30 in pages of 7 is the 2 oldest, newest first; one before it
    // the 7 before those.
    let last = page("shardIndex=1&limit=7&cursor=__rsc_last__");
    let last_ids: Vec<&str> = last
        .iter()
        .map(|r| r["recordId"].as_str().unwrap())
        .collect();
    assert_eq!(last_ids, [ids[1][1].as_str(), ids[1][0].as_str()]);
    assert_eq!(last[0]["pageNextCursor"], Value::Null);
    let before_last = page("shardIndex=1&limit=7&cursor=__rsc_tail__:1");
    let ids_before: Vec<&str> = before_last
        .iter()
        .map(|r| r["recordId"].as_str().unwrap())
        .collect();
    let expected: Vec<&str> = ids[1][2..9].iter().rev().map(String::as_str).collect();
    assert_eq!(ids_before, expected);
    assert_eq!(before_last[0]["pageNextCursor"], "__rsc_tail__:0");

    // A record id is found on whichever shard holds it.
    let found = page(&format!("recordId={}", ids[1][4]));
    assert_eq!(found.len(), 1);
    assert_eq!(
        (
            &found[0]["shardIndex"],
            &found[0]["shardSelector"],
            &found[0]["pageNextCursor"]
        ),
        (&json!(1), &json!("all"), &Value::Null)
    );
    assert!(page("recordId=999999-0").is_empty());

    // Blank selections answer nothing; bad parameters are 400s, an unknown group 404, in the origin's body.
    for path in [
        "members?streamPrefix=&consumerGroup=",
        "assignments?streamPrefix=graf&consumerGroup=",
        "options/shards?streamPrefix=&consumerGroup=g",
        "messages?streamPrefix=&consumerGroup=",
    ] {
        assert_eq!(
            rows(&format!("{g}/{path}"), &reader),
            Vec::<Value>::new(),
            "{path}"
        );
    }
    let error = |path: &str| {
        let (status, body) = get(&format!("{g}/{path}"), Some(&reader));
        (status, body["status"].clone(), body["errorCode"].clone())
    };
    let bad = (400, json!("BAD_REQUEST"), json!("INVALID_REQUEST"));
    for path in [
        "members".to_string(),
        "shards?streamPrefix=graf".to_string(),
        "options/shards?consumerGroup=g".to_string(),
        format!("messages?{q}&shardIndex=9"),
        format!("messages?{q}&shardIndex=one"),
        format!("messages?{q}&direction=UP"),
        format!("messages?{q}&limit=many"),
        format!("messages?{q}&shardIndex=1&cursor=not-an-id"),
        format!("messages?{q}&shardIndex=all&cursor=all:0=not-an-id"),
    ] {
        assert_eq!(error(&path), bad, "{path}");
    }
    // A tail page deeper than 100,000 entries from the end is refused rather than read.
    let mut pipe = redis::pipe();
    for i in 0..100_001u64 {
        pipe.cmd("XADD")
            .arg(format!("{STREAM}:2"))
            .arg(format!("{}-0", i + 1))
            .arg("k")
            .arg(i)
            .ignore();
    }
    let () = pipe.query_async(&mut conn).await.unwrap();
    assert_eq!(
        error(&format!(
            "messages?{q}&shardIndex=2&limit=1&cursor=__rsc_tail__:100000"
        )),
        bad
    );
    assert_eq!(
        page("shardIndex=2&limit=1&cursor=__rsc_tail__:99998").len(),
        1
    );
    let not_found = (404, json!("NOT_FOUND"), json!("GROUP_NOT_FOUND"));
    for path in [
        "members?streamPrefix=graf&consumerGroup=nobody",
        "shards?streamPrefix=graf&consumerGroup=nobody",
        "messages?streamPrefix=graf&consumerGroup=nobody",
    ] {
        assert_eq!(error(path), not_found, "{path}");
    }
    drop(member);
}
