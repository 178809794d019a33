//! The `stream-listener` binary against a redis-server of its own: a group of two members driven through
//! the library (GroupStore + MemberSession, heartbeats applied in lockstep, so no timing is involved), then
//! every command's output and exit status, failures included.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use stream_listener::clock::{LocalMillis, StoreMillis};
use stream_listener::coordinator::metadata::GroupConfig;
use stream_listener::coordinator::projection::{GroupProjection, GroupState};
use stream_listener::coordinator::AdminCommand;
use stream_listener::member::lifecycle::ShardCommand;
use stream_listener::member::session::MemberSession;
use stream_listener::store::GroupStore;
use stream_listener::topology::{StartFrom, Topology};
use stream_listener::Producer;
use stream_listener_test_support::aio::connect_with_timeouts;
use stream_listener_test_support::RedisServer;
use stream_listener_tests::member_session;

const STREAM: &str = "orders";
const GROUP: &str = "billing";
const SHARDS: u32 = 4;
const MESSAGES: usize = 40;
/// Long leases: nothing expires while a test runs, so every view is deterministic.
const CONFIG: GroupConfig = GroupConfig {
    heartbeat_interval_ms: 1_000,
    session_timeout_ms: 120_000,
    rebalance_timeout_ms: 240_000,
};

/// What one run of the binary did.
#[derive(Debug)]
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn ok(self) -> String {
        assert_eq!(self.code, Some(0), "command failed: {self:#?}");
        assert!(self.stderr.is_empty(), "no stderr on success: {self:#?}");
        self.stdout
    }

    /// Asserts a failure with exit status `code` whose stderr mentions `needle`; returns stderr.
    fn fails(self, code: i32, needle: &str) -> String {
        assert_eq!(self.code, Some(code), "expected exit {code}: {self:#?}");
        assert!(
            self.stderr.contains(needle),
            "stderr should mention {needle:?}: {self:#?}"
        );
        self.stderr
    }
}

/// Runs the binary with `--redis-url url`; `REDIS_URL` is removed so nothing can reach the shared Redis.
fn cli(url: &str, args: &[&str]) -> Run {
    let output = Command::new(env!("CARGO_BIN_EXE_stream-listener"))
        .arg("--redis-url")
        .arg(url)
        .args(args)
        .env_remove("REDIS_URL")
        .output()
        .expect("run the binary");
    Run {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

async fn connect(url: &str) -> ConnectionManager {
    connect_with_timeouts(url, Duration::from_secs(5), None).await
}

fn session(id: &str) -> MemberSession {
    member_session(id, CONFIG.session_timeout_ms, 2, 0xc11 ^ id.len() as u64)
}

/// A Redis with stream `orders` (4 shards, [`MESSAGES`] entries, consumer group `billing` on every shard)
/// and group `billing` with members `a` and `b`, stable.
struct Fixture {
    redis: RedisServer,
    conn: ConnectionManager,
    store: GroupStore,
    sessions: Vec<MemberSession>,
}

impl Fixture {
    async fn start() -> Fixture {
        let redis = RedisServer::start();
        let mut conn = connect(&redis.url()).await;
        Topology::ensure(&mut conn, STREAM, SHARDS).await.unwrap();
        Topology::ensure_group(&mut conn, STREAM, GROUP, StartFrom::Earliest)
            .await
            .unwrap();
        let producer = Producer::new(conn.clone(), STREAM).await.unwrap();
        for i in 0..MESSAGES {
            producer
                .send(format!("customer-{i}"), &serde_json::json!({ "seq": i }))
                .await
                .unwrap();
        }
        let store = GroupStore::create(conn.clone(), STREAM, GROUP, SHARDS, CONFIG).unwrap();
        let mut fixture = Fixture {
            redis,
            conn,
            store,
            sessions: Vec::new(),
        };
        let mut sessions = vec![session("a"), session("b")];
        fixture.converge(&mut sessions).await;
        fixture.sessions = sessions;
        fixture
    }

    fn url(&self) -> String {
        self.redis.url()
    }

    /// Heartbeats every session in turn, revoking at once, until the group is stable (a new group grants
    /// nothing for its first two heartbeat intervals, hence the deadline rather than a round count).
    async fn converge(&mut self, sessions: &mut [MemberSession]) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            for s in sessions.iter_mut() {
                let response = self
                    .store
                    .heartbeat(&s.heartbeat(LocalMillis(0), 2))
                    .await
                    .unwrap();
                for command in s.on_response(&response) {
                    if let ShardCommand::Revoke { shard } = command {
                        s.on_revoked(shard);
                    }
                }
            }
            let view = self.view().await;
            let assigned: usize = view.members.iter().map(|m| m.assigned.len()).sum();
            if view.state == GroupState::Stable && assigned == SHARDS as usize {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("group did not converge: {:#?}", self.view().await);
    }

    /// Both members leave gracefully (revoking at once) until the group has no member left.
    async fn leave_all(&mut self) {
        let mut sessions = std::mem::take(&mut self.sessions);
        for s in sessions.iter_mut() {
            for command in s.begin_leave() {
                if let ShardCommand::Revoke { shard } = command {
                    s.on_revoked(shard);
                }
            }
        }
        for _ in 0..50 {
            for s in sessions.iter_mut() {
                let response = self
                    .store
                    .heartbeat(&s.heartbeat(LocalMillis(0), 2))
                    .await
                    .unwrap();
                for command in s.on_response(&response) {
                    if let ShardCommand::Revoke { shard } = command {
                        s.on_revoked(shard);
                    }
                }
            }
            if self.view().await.members.is_empty() {
                return;
            }
        }
        panic!("members did not leave: {:#?}", self.view().await);
    }

    async fn view(&mut self) -> GroupProjection {
        self.store
            .load()
            .await
            .unwrap()
            .1
            .projection(StoreMillis(0))
    }

    /// Reads and acknowledges everything in `shards` as the group, as a consumer would.
    async fn consume_everything(&mut self, shards: std::ops::Range<u32>) {
        for shard in shards {
            let stream = format!("{STREAM}:{shard}");
            loop {
                let read: redis::Value = redis::cmd("XREADGROUP")
                    .arg("GROUP")
                    .arg(GROUP)
                    .arg("cli-test")
                    .arg("COUNT")
                    .arg(1000)
                    .arg("STREAMS")
                    .arg(&stream)
                    .arg(">")
                    .query_async(&mut self.conn)
                    .await
                    .unwrap();
                if matches!(read, redis::Value::Nil) {
                    break;
                }
            }
            // Everything is now pending: acknowledge it all.
            let ids: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
                .arg(&stream)
                .arg(GROUP)
                .arg("-")
                .arg("+")
                .arg(10_000)
                .query_async(&mut self.conn)
                .await
                .unwrap();
            if !ids.is_empty() {
                let _: i64 = redis::cmd("XACK")
                    .arg(&stream)
                    .arg(GROUP)
                    .arg(ids.iter().map(|(id, ..)| id.as_str()).collect::<Vec<_>>())
                    .query_async(&mut self.conn)
                    .await
                    .unwrap();
            }
        }
    }

    async fn xlen(&mut self, key: &str) -> u64 {
        redis::cmd("XLEN")
            .arg(key)
            .query_async(&mut self.conn)
            .await
            .unwrap()
    }
}

/// Rows of a table: lines after the header, split on runs of two or more spaces (cells have single
/// spaces at most).
fn rows(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        .map(|line| {
            line.split("  ")
                .map(str::trim)
                .filter(|cell| !cell.is_empty())
                .map(str::to_string)
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_group_members_and_invariants() {
    let mut f = Fixture::start().await;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut f.conn)
        .await
        .unwrap();
    let out = cli(&f.url(), &["status", "--stream", STREAM, "--group", GROUP]).ok();
    // One load of the group (its leases are read by the load only: nothing heartbeats here).
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut f.conn)
        .await
        .unwrap();
    assert!(
        stats.contains("cmdstat_zrange:calls=1,"),
        "status loads the group once: {stats}"
    );
    assert!(out.contains("state             STABLE"), "{out}");
    assert!(out.contains("shard count       4"), "{out}");
    assert!(out.contains("resharding        none"), "{out}");
    assert!(out.contains("invariant violations: none"), "{out}");
    let view = f.view().await;
    assert!(
        out.contains(&format!(
            "epochs            group {}, assignment {}",
            view.group_epoch, view.assignment_epoch
        )),
        "{out}"
    );
    let table = &out[out.find("MEMBER").expect("members table")..];
    let members = rows(table);
    assert_eq!(members.len(), 2, "{out}");
    for (row, id) in members.iter().zip(["a", "b"]) {
        // MEMBER STATE EPOCH LEASE WEIGHT WORKERS ASSIGNED PENDING REVOKING SHARDS DUPLICATE?
        assert_eq!(row[0], id, "{out}");
        assert_eq!(row[1], "STABLE", "{out}");
        assert!(row[3].ends_with('s'), "lease left in seconds: {out}");
        assert_eq!(row[4..6], ["1", "2"], "weight and workers: {out}");
        assert_eq!(row[6], "2", "two shards each: {out}");
        assert_eq!(row[7..9], ["0", "0"], "nothing pending or revoking: {out}");
        assert_eq!(row[10], "no", "{out}");
    }

    let json = cli(
        &f.url(),
        &["status", "--stream", STREAM, "--group", GROUP, "--json"],
    )
    .ok();
    let projection: GroupProjection = serde_json::from_str(&json).expect("projection JSON");
    assert_eq!(projection.group, GROUP);
    assert_eq!(projection.state, GroupState::Stable);
    assert_eq!(projection.members.len(), 2);
    assert_eq!(projection.shards.len(), SHARDS as usize);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_show_owners_and_lag() {
    let mut f = Fixture::start().await;
    let out = cli(&f.url(), &["shards", "--stream", STREAM, "--group", GROUP]).ok();
    let shards = rows(&out);
    assert_eq!(shards.len(), SHARDS as usize, "{out}");
    let view = f.view().await;
    let mut total = 0;
    for (i, row) in shards.iter().enumerate() {
        // SHARD STREAM TARGET CURRENT FENCED-HOLD LENGTH LAG PENDING LAST-DELIVERED
        assert_eq!(row.len(), 9, "{out}");
        assert_eq!(row[0], i.to_string());
        assert_eq!(row[1], format!("{STREAM}:{i}"));
        let owner = view.shards[i].target.clone().unwrap();
        assert_eq!(row[2], owner, "{out}");
        assert_eq!(row[3], owner, "reported owner: {out}");
        assert_eq!(row[4], "-", "{out}");
        let length = f.xlen(&format!("{STREAM}:{i}")).await;
        assert_eq!(row[5], length.to_string(), "{out}");
        assert_eq!(
            row[6],
            length.to_string(),
            "nothing read yet: lag = length: {out}"
        );
        assert_eq!(row[7], "0", "{out}");
        assert_eq!(row[8], "0-0", "{out}");
        total += length;
    }
    assert_eq!(total, MESSAGES as u64);

    // After a read and an ack of one entry, its shard shows the new lag and last-delivered id.
    let read: redis::streams::StreamReadReply = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(GROUP)
        .arg("a")
        .arg("COUNT")
        .arg(2)
        .arg("STREAMS")
        .arg(format!("{STREAM}:0"))
        .arg(">")
        .query_async(&mut f.conn)
        .await
        .unwrap();
    let ids = &read.keys[0].ids;
    let out = cli(&f.url(), &["shards", "--stream", STREAM, "--group", GROUP]).ok();
    let row = &rows(&out)[0];
    let length = f.xlen(&format!("{STREAM}:0")).await;
    assert_eq!(row[6], (length - ids.len() as u64).to_string(), "{out}");
    assert_eq!(row[7], ids.len().to_string(), "pending: {out}");
    assert_eq!(row[8], ids.last().unwrap().id, "{out}");

    // An entry deleted after the group's position: Redis reports no lag, the CLI counts it.
    let undelivered: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(format!("{STREAM}:0"))
        .arg(format!("({}", ids.last().unwrap().id))
        .arg("+")
        .query_async(&mut f.conn)
        .await
        .unwrap();
    assert!(undelivered.len() >= 2, "entries left to delete one of");
    let _: u64 = redis::cmd("XDEL")
        .arg(format!("{STREAM}:0"))
        .arg(&undelivered[0].0)
        .query_async(&mut f.conn)
        .await
        .unwrap();
    let groups: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(format!("{STREAM}:0"))
        .query_async(&mut f.conn)
        .await
        .unwrap();
    assert_eq!(
        groups[0]["lag"],
        redis::Value::Nil,
        "Redis can no longer tell"
    );
    let out = cli(&f.url(), &["shards", "--stream", STREAM, "--group", GROUP]).ok();
    let row = &rows(&out)[0];
    assert_eq!(
        row[6],
        (undelivered.len() - 1).to_string(),
        "counted lag: {out}"
    );
    let json: serde_json::Value = serde_json::from_str(
        &cli(
            &f.url(),
            &["status", "--stream", STREAM, "--group", GROUP, "--json"],
        )
        .ok(),
    )
    .unwrap();
    assert_eq!(json["shards"][0]["lag"], (undelivered.len() - 1) as u64);
    assert_eq!(json["shards"][0]["lagExact"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_lists_newest_events_oldest_first() {
    let f = Fixture::start().await;
    let out = cli(&f.url(), &["audit", "--stream", STREAM, "--group", GROUP]).ok();
    assert!(out.starts_with("TIME"), "{out}");
    let events = rows(&out);
    assert!(events.len() >= 4, "{out}");
    assert_eq!(events[0][2], "MEMBER_JOINED", "{out}");
    assert!(events[0][3].contains("memberId=a"), "{out}");
    assert!(out.contains("SHARDS_ASSIGNED"), "{out}");
    let revisions: Vec<i64> = events.iter().map(|r| r[1].parse().unwrap()).collect();
    assert!(revisions.windows(2).all(|w| w[0] <= w[1]), "{out}");
    assert!(events[0][0].ends_with('Z'), "UTC time: {out}");

    let newest = cli(
        &f.url(),
        &[
            "audit", "--stream", STREAM, "--group", GROUP, "--count", "1",
        ],
    )
    .ok();
    assert_eq!(rows(&newest), vec![events.last().unwrap().clone()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_fences_a_live_member_and_refuses_an_unknown_one() {
    let mut f = Fixture::start().await;
    let b_shards = f
        .view()
        .await
        .members
        .iter()
        .find(|m| m.member_id == "b")
        .unwrap()
        .assigned
        .clone();
    let out = cli(
        &f.url(),
        &[
            "fence", "--stream", STREAM, "--group", GROUP, "--member", "b",
        ],
    )
    .ok();
    assert!(
        out.contains("member `b` of group `billing` fenced"),
        "{out}"
    );
    assert!(out.contains("stay held until its lease passes"), "{out}");
    let view = f.view().await;
    for shard in &b_shards {
        assert_eq!(
            view.shards[*shard as usize].fenced_hold.as_deref(),
            Some("b")
        );
    }
    // A fenced member is a tombstone: hidden by default, shown with --all.
    let status = cli(&f.url(), &["status", "--stream", STREAM, "--group", GROUP]).ok();
    let members = rows(&status[status.find("MEMBER").unwrap()..]);
    assert!(members.iter().all(|row| row[0] != "b"), "{status}");
    assert!(
        status.contains("(1 expired or fenced tombstone hidden; --all shows them)"),
        "{status}"
    );
    let status = cli(
        &f.url(),
        &["status", "--stream", STREAM, "--group", GROUP, "--all"],
    )
    .ok();
    let b = rows(&status[status.find("MEMBER").unwrap()..])
        .into_iter()
        .find(|row| row[0] == "b")
        .unwrap();
    assert_eq!(b[1], "FENCED", "{status}");
    assert!(!status.contains("hidden"), "{status}");
    let json: serde_json::Value = serde_json::from_str(
        &cli(
            &f.url(),
            &["status", "--stream", STREAM, "--group", GROUP, "--json"],
        )
        .ok(),
    )
    .unwrap();
    assert_eq!(json["hiddenTombstones"], 1, "{json}");
    assert!(json["members"]
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m["memberId"] != "b"));

    cli(
        &f.url(),
        &[
            "fence", "--stream", STREAM, "--group", GROUP, "--member", "zz",
        ],
    )
    .fails(1, "no live member \"zz\"");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reshard_grows_and_rollback_is_a_stream_level_resize() {
    let mut f = Fixture::start().await;
    let url = f.url();
    cli(&url, &["rollback", "--stream", STREAM])
        .fails(1, "stream `orders` was never resized: nothing to roll back");
    // The group-level rollback is gone: a rollback is a stream-level resize.
    cli(&url, &["rollback", "--stream", STREAM, "--group", GROUP]).fails(2, "--group");
    cli(&url, &["reshard", "--stream", STREAM, "--shards", "0"])
        .fails(1, "shard count must be greater than zero");
    cli(&url, &["reshard", "--stream", STREAM, "--shards", "many"]).fails(2, "invalid value");
    cli(&url, &["reshard", "--stream", "nope", "--shards", "2"])
        .fails(1, "stream `nope` has no topology");
    assert_eq!(
        Topology::load(&mut f.conn, STREAM)
            .await
            .unwrap()
            .shard_count(),
        SHARDS,
        "refused changes change nothing"
    );

    let out = cli(
        &url,
        &[
            "reshard",
            "--stream",
            STREAM,
            "--shards",
            "6",
            "--grace-ms",
            "300",
        ],
    )
    .ok();
    assert!(
        out.contains("4 -> 6 shards (topology version 1 -> 2)"),
        "{out}"
    );
    assert!(out.contains("(grace 0.3s)"), "{out}");
    assert!(out.contains("groups billing follow"), "{out}");
    let topology = Topology::load(&mut f.conn, STREAM).await.unwrap();
    assert_eq!(topology.shard_count(), 6);
    assert_eq!(topology.migration().unwrap().grace_ms, 300);
    let shards = cli(&url, &["shards", "--stream", STREAM, "--group", GROUP]).ok();
    let rows = rows(&shards);
    assert_eq!(rows.len(), 6, "{shards}");
    assert_eq!(rows[4][0], "4 (new)", "{shards}");
    assert_eq!(rows[4][6], "0", "group created on the new shard: {shards}");
    assert!(shards.contains("the stream has 6 shards, the group still 4"));

    let again = cli(&url, &["reshard", "--stream", STREAM, "--shards", "6"]).ok();
    assert!(again.contains("already has 6 shards"), "{again}");
    // The group has consumed nothing of the old layout: the next resize must wait.
    cli(&url, &["reshard", "--stream", STREAM, "--shards", "8"]).fails(
        1,
        "cannot resize stream `orders` yet: the previous resize is still migrating",
    );
    cli(&url, &["rollback", "--stream", STREAM]).fails(
        1,
        "cannot resize stream `orders` yet: the previous resize is still migrating",
    );

    // What a running member's follower does; then the operator rolls the group back.
    f.store
        .command(AdminCommand::SetShardCount(6))
        .await
        .unwrap()
        .unwrap();
    let status = cli(&url, &["status", "--stream", STREAM, "--group", GROUP]).ok();
    assert!(
        status.contains("resharding        4 -> 6 shards"),
        "{status}"
    );
    assert!(
        status.contains("stream topology   6 shards (topology version 2), resized from 4"),
        "{status}"
    );
    // Once the group consumed the old shards past the cut, the stream rolls back: its new shards drain.
    f.consume_everything(0..SHARDS).await;
    let start = std::time::Instant::now();
    let out = loop {
        let out = cli(&url, &["rollback", "--stream", STREAM]);
        if out.code == Some(0) || start.elapsed() > std::time::Duration::from_secs(10) {
            break out.ok();
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(
        out.starts_with("rolled back: stream `orders`: 6 -> 4 shards (topology version 2 -> 3)"),
        "{out}"
    );
    assert!(
        out.contains("shard streams orders:4..orders:5 are draining"),
        "{out}"
    );
    let status = cli(&url, &["status", "--stream", STREAM, "--group", GROUP]).ok();
    assert!(status.contains("rolled back from 6"), "{status}");
    assert!(status.contains("shards 4..5 DRAINING"), "{status}");
    let topology = Topology::load(&mut f.conn, STREAM).await.unwrap();
    assert_eq!(
        (topology.shard_count(), topology.read_shard_count()),
        (4, 6)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_list_and_replay() {
    let mut f = Fixture::start().await;
    let url = f.url();
    let dlq = format!("{STREAM}:dlq");
    let empty = cli(&url, &["dead-letters", "--stream", STREAM]).ok();
    assert_eq!(empty, format!("no dead letters in {dlq}\n"));

    // Entries as the consumer writes them: the original fields (the first with headers), then the
    // dlq_* fields.
    let headers = r#"{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","tenant":"acme"}"#;
    let mut ids = Vec::new();
    for (key, error) in [
        ("customer-7", "billing failed: card declined"),
        ("customer-9", "payload: expected struct Order"),
    ] {
        let mut xadd = redis::cmd("XADD");
        xadd.arg(&dlq)
            .arg("*")
            .arg("k")
            .arg(key)
            .arg("p")
            .arg(format!(r#"{{"key":"{key}"}}"#));
        if key == "customer-7" {
            xadd.arg("sl_headers").arg(headers);
        }
        let id: String = xadd
            .arg("dlq_error")
            .arg(error)
            .arg("dlq_delivery_count")
            .arg(3)
            .arg("dlq_group")
            .arg(GROUP)
            .arg("dlq_shard")
            .arg(2)
            .arg("dlq_source_stream")
            .arg(format!("{STREAM}:2"))
            .arg("dlq_source_id")
            .arg("1-1")
            .arg("dlq_consumer")
            .arg("a")
            .query_async(&mut f.conn)
            .await
            .unwrap();
        ids.push(id);
    }
    let out = cli(&url, &["dead-letters", "--stream", STREAM]).ok();
    let listed = rows(&out);
    assert_eq!(listed.len(), 2, "{out}");
    // ID GROUP SHARD SOURCE-ID DELIVERIES KEY ERROR
    assert_eq!(
        listed[0],
        [
            ids[0].as_str(),
            GROUP,
            "2",
            "1-1",
            "3",
            "customer-7",
            "billing failed: card declined"
        ]
    );
    assert!(
        out.contains("2 dead letters shown; 2 in orders:dlq"),
        "{out}"
    );
    let one = cli(&url, &["dead-letters", "--stream", STREAM, "--count", "1"]).ok();
    assert!(
        one.contains("1 dead letter shown; 2 in orders:dlq"),
        "{one}"
    );

    let shard = Topology::load(&mut f.conn, STREAM)
        .await
        .unwrap()
        .shard_for_key(b"customer-7");
    let shard_key = format!("{STREAM}:{shard}");
    let before = f.xlen(&shard_key).await;
    let out = cli(
        &url,
        &[
            "dead-letters",
            "replay",
            "--stream",
            STREAM,
            "--id",
            &ids[0],
        ],
    )
    .ok();
    assert!(
        out.contains(&format!(
            "replayed {} (key customer-7) to {shard_key} as ",
            ids[0]
        )),
        "{out}"
    );
    assert_eq!(f.xlen(&shard_key).await, before + 1);
    assert_eq!(f.xlen(&dlq).await, 1, "deleted from the DLQ");
    let newest: Vec<(String, Vec<(String, String)>)> = redis::cmd("XREVRANGE")
        .arg(&shard_key)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1)
        .query_async(&mut f.conn)
        .await
        .unwrap();
    assert_eq!(
        newest[0].1,
        [
            ("k".to_string(), "customer-7".to_string()),
            ("p".to_string(), r#"{"key":"customer-7"}"#.to_string()),
            ("sl_headers".to_string(), headers.to_string()),
            ("sl_only_group".to_string(), GROUP.to_string()),
            ("sl_replay_of".to_string(), ids[0].clone()),
        ]
    );

    cli(
        &url,
        &[
            "dead-letters",
            "replay",
            "--stream",
            STREAM,
            "--id",
            &ids[0],
        ],
    )
    .fails(
        1,
        &format!("no dead letter with id {} in orders:dlq", ids[0]),
    );
    cli(&url, &["dead-letters"]).fails(2, "--stream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_group_corrupt_metadata_and_unreachable_redis_fail_clearly() {
    let mut f = Fixture::start().await;
    let url = f.url();
    let missing = "sl:{orders/nope}:meta";
    for args in [
        vec!["status"],
        vec!["shards"],
        vec!["audit"],
        vec!["fence", "--member", "a"],
        vec!["seek", "--to", "latest"],
        vec!["watch", "--iterations", "1"],
    ] {
        let mut args = args;
        args.extend(["--stream", STREAM, "--group", "nope"]);
        let stderr = cli(&url, &args).fails(1, missing);
        assert!(
            stderr.starts_with("error: unknown group `nope`"),
            "{stderr}"
        );
    }
    let exists: bool = redis::cmd("EXISTS")
        .arg(missing)
        .query_async(&mut f.conn)
        .await
        .unwrap();
    assert!(!exists, "asking about a group never creates it");

    let corrupt = "sl:{orders/broken}:meta";
    let _: () = redis::cmd("SET")
        .arg(corrupt)
        .arg("{not json")
        .query_async(&mut f.conn)
        .await
        .unwrap();
    for command in ["status", "shards"] {
        cli(&url, &[command, "--stream", STREAM, "--group", "broken"])
            .fails(1, &format!("group metadata at {corrupt} cannot be used"));
    }
    let stored: String = redis::cmd("GET")
        .arg(corrupt)
        .query_async(&mut f.conn)
        .await
        .unwrap();
    assert_eq!(stored, "{not json", "left untouched");

    // A member record that does not decode: the error names the hash that holds it.
    let members = "sl:{orders/billing}:members";
    let _: () = redis::cmd("HSET")
        .arg(members)
        .arg("intruder")
        .arg("[]")
        .query_async(&mut f.conn)
        .await
        .unwrap();
    cli(&url, &["status", "--stream", STREAM, "--group", GROUP])
        .fails(1, &format!("group metadata at {members} cannot be used"));

    cli(&url, &["status", "--stream", "a{b", "--group", GROUP]).fails(1, "invalid name");

    // A URL that does not parse names the flag it came from; one from the environment says so.
    cli("127.0.0.1:6379", &["groups"]).fails(
        1,
        "error: Redis URL `127.0.0.1:6379` (from --redis-url) has no scheme",
    );
    let output = Command::new(env!("CARGO_BIN_EXE_stream-listener"))
        .arg("groups")
        .env("REDIS_URL", "http://127.0.0.1:6379")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with(
            "error: Redis URL `http://127.0.0.1:6379` (from the environment variable REDIS_URL) has \
             the unknown scheme `http`"
        ),
        "{stderr}"
    );

    // A database the server does not have: refused at once, named.
    let mut db = url.trim_end_matches('/').to_owned();
    db.push_str("/99");
    cli(&db, &["groups"]).fails(1, "the database index in the URL (`/<db>`) is out of range");

    // Nothing listens on port 1.
    cli(
        "redis://127.0.0.1:1/",
        &["status", "--stream", STREAM, "--group", GROUP],
    )
    .fails(1, "cannot connect to Redis at redis://127.0.0.1:1/");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_url_comes_from_the_environment() {
    let f = Fixture::start().await;
    let output = Command::new(env!("CARGO_BIN_EXE_stream-listener"))
        .args(["status", "--stream", STREAM, "--group", GROUP])
        .env("REDIS_URL", f.url())
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("STABLE"));
}

// ------------------------------------------------------------------------------------------------
// Snapshots: outputs compared as text with the volatile parts normalized.
// ------------------------------------------------------------------------------------------------

/// `text` with times, entry ids, durations, rates and ports replaced by placeholders, and runs of two or
/// more spaces (column padding, which follows the width of volatile values) collapsed to two.
fn normalize(text: &str) -> String {
    let rules = [
        (r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z", "<TIME>"),
        (r"\b\d{13}-\d+\b", "<ID>"),
        // Store revisions and member epochs come from the store's clock; the metadata version counts
        // writes, which depend on when the new group's grant pause ends.
        (r"revision( +)\d+", "revision${1}REV"),
        (r"metadata version \d+", "metadata version N"),
        (r"\b\d{13,}\b", "<EPOCH>"),
        (r"\b\d+\.\d/s", "<RATE>"),
        (r"\b\d+\.\ds\b", "<DUR>"),
        (r"127\.0\.0\.1:\d+", "127.0.0.1:<PORT>"),
        (r" {2,}", "  "),
        (r" +\n", "\n"),
    ];
    let mut out = text.to_string();
    for (pattern, with) in rules {
        out = regex::Regex::new(pattern)
            .unwrap()
            .replace_all(&out, with)
            .into_owned();
    }
    out
}

/// Asserts `actual`, normalized, equals `expected` (written with two-space column gaps).
#[track_caller]
fn assert_snapshot(actual: &str, expected: &str) {
    let normalized = normalize(actual);
    assert_eq!(
        normalized, expected,
        "\n--- normalized output ---\n{normalized}\n--- raw ---\n{actual}"
    );
}

/// Adds a dead letter as the consumer writes it; returns its id.
async fn add_dead_letter(
    conn: &mut ConnectionManager,
    group: &str,
    key: &str,
    payload: &str,
    error: &str,
) -> String {
    redis::cmd("XADD")
        .arg(format!("{STREAM}:dlq"))
        .arg("*")
        .arg("k")
        .arg(key)
        .arg("p")
        .arg(payload)
        .arg("dlq_error")
        .arg(error)
        .arg("dlq_delivery_count")
        .arg(3)
        .arg("dlq_group")
        .arg(group)
        .arg("dlq_shard")
        .arg(1)
        .arg("dlq_source_stream")
        .arg(format!("{STREAM}:1"))
        .arg("dlq_source_id")
        .arg("1-1")
        .arg("dlq_consumer")
        .arg("a")
        .query_async(conn)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_text_snapshot() {
    let f = Fixture::start().await;
    let out = cli(&f.url(), &["status", "--stream", STREAM, "--group", GROUP]).ok();
    assert_snapshot(
        &out,
        "\
stream  orders
group  billing
state  STABLE
store revision  REV
epochs  group 2, assignment 2, metadata version N
shard count  4
resharding  none
backlog  lag 40, pending 0 (all shards; `shards` has them per shard)
stream topology  4 shards (topology version 1)
last change  <TIME> (<DUR> ago)

MEMBER  STATE  EPOCH  LEASE  WEIGHT  WORKERS  ASSIGNED  PENDING  REVOKING  SHARDS  DUPLICATE?
a  STABLE  <EPOCH>  <DUR>  1  2  2  0  0  0-1  no
b  STABLE  <EPOCH>  <DUR>  1  2  2  0  0  2-3  no

invariant violations: none
",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_everywhere_with_lag_and_pending_per_shard() {
    let mut f = Fixture::start().await;
    let url = f.url();
    let status: serde_json::Value = serde_json::from_str(
        &cli(
            &url,
            &["status", "--stream", STREAM, "--group", GROUP, "--json"],
        )
        .ok(),
    )
    .unwrap();
    assert_eq!(status["stream"], STREAM);
    assert_eq!(status["totalLag"], MESSAGES as u64);
    assert_eq!(status["totalPending"], 0);
    let mut lag = 0;
    for (i, shard) in status["shards"].as_array().unwrap().iter().enumerate() {
        let length = f.xlen(&format!("{STREAM}:{i}")).await;
        assert_eq!(shard["streamKey"], format!("{STREAM}:{i}"));
        assert_eq!(shard["length"], length, "{shard}");
        assert_eq!(shard["lag"], length, "{shard}");
        assert_eq!(shard["pending"], 0, "{shard}");
        assert_eq!(shard["lastDeliveredId"], "0-0", "{shard}");
        assert!(shard["target"].is_string(), "{shard}");
        lag += shard["lag"].as_u64().unwrap();
    }
    assert_eq!(lag, MESSAGES as u64);

    let shards: serde_json::Value = serde_json::from_str(
        &cli(
            &url,
            &["shards", "--stream", STREAM, "--group", GROUP, "--json"],
        )
        .ok(),
    )
    .unwrap();
    assert_eq!(shards.as_array().unwrap().len(), SHARDS as usize);
    assert_eq!(shards[0]["status"], "current");
    assert_eq!(shards[0]["stream"], "orders:0");
    assert_eq!(shards[0]["pending"], 0);

    let audit: serde_json::Value = serde_json::from_str(
        &cli(
            &url,
            &[
                "audit", "--stream", STREAM, "--group", GROUP, "--count", "3", "--json",
            ],
        )
        .ok(),
    )
    .unwrap();
    let events = audit.as_array().unwrap();
    assert_eq!(events.len(), 3);
    assert!(events[0]["event"]["type"].is_string(), "{audit}");
    assert!(events[0]["revision"].as_i64().unwrap() <= events[2]["revision"].as_i64().unwrap());

    let fenced: serde_json::Value = serde_json::from_str(
        &cli(
            &url,
            &[
                "fence", "--stream", STREAM, "--group", GROUP, "--member", "a", "--json",
            ],
        )
        .ok(),
    )
    .unwrap();
    assert_eq!(fenced["fenced"], "a");
    assert_eq!(fenced["heldShards"], serde_json::json!([0, 1]));

    let dlq: serde_json::Value =
        serde_json::from_str(&cli(&url, &["dead-letters", "--stream", STREAM, "--json"]).ok())
            .unwrap();
    assert_eq!(dlq["total"], 0);
    assert_eq!(dlq["entries"], serde_json::json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_lists_streams_and_groups() {
    let mut f = Fixture::start().await;
    let url = f.url();
    // A second stream with a group created on its shards but never joined, and one without any group.
    Topology::ensure(&mut f.conn, "payments", 2).await.unwrap();
    Topology::ensure_group(&mut f.conn, "payments", "ledger", StartFrom::Earliest)
        .await
        .unwrap();
    Topology::ensure(&mut f.conn, "idle", 1).await.unwrap();
    // Metadata that cannot be read is reported, not fatal.
    let _: () = redis::cmd("SET")
        .arg("sl:{orders/broken}:meta")
        .arg("{not json")
        .query_async(&mut f.conn)
        .await
        .unwrap();
    let out = cli(&url, &["groups"]).ok();
    assert_snapshot(
        &out,
        "\
STREAM  SHARDS  VERSION  GROUP  STATE  MEMBERS  EPOCH  LAG  PENDING
idle  1  1  -  -  -  -  -  -
orders  4  1  billing  STABLE  2  2  40  0
orders  4  1  broken  UNREADABLE  -  -  0  0
payments  2  1  ledger  NOT_JOINED  -  -  0  0
warning: group `broken` of `orders`: group metadata at sl:{orders/broken}:meta cannot be used: group metadata is corrupt: key must be a string at line 1 column 2
",
    );

    let json: serde_json::Value =
        serde_json::from_str(&cli(&url, &["groups", "--json"]).ok()).unwrap();
    assert_eq!(json["truncated"], false);
    let billing = json["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["group"] == GROUP)
        .unwrap()
        .clone();
    assert_eq!(billing["stream"], STREAM);
    assert_eq!(billing["shards"], SHARDS);
    assert_eq!(billing["liveMembers"], 2);
    assert_eq!(billing["lag"], MESSAGES as u64);

    // An entry deleted past the group's position: Redis reports no lag for that shard any more, and
    // `groups` counts it instead of adding it as 0.
    let key = stream_listener::routing::shard_stream_key(STREAM, 0);
    let ids: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(&key)
        .arg("-")
        .arg("+")
        .query_async(&mut f.conn)
        .await
        .unwrap();
    let on_shard = ids.len() as u64;
    assert!(on_shard >= 2, "the fixture has entries on shard 0");
    let _: u64 = redis::cmd("XDEL")
        .arg(&key)
        .arg(&ids[ids.len() / 2].0)
        .query_async(&mut f.conn)
        .await
        .unwrap();
    assert_eq!(
        redis_lag(&mut f.conn, &key).await,
        None,
        "Redis cannot tell"
    );
    let json: serde_json::Value =
        serde_json::from_str(&cli(&url, &["groups", "--json"]).ok()).unwrap();
    let billing = json["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["group"] == GROUP)
        .unwrap()
        .clone();
    assert_eq!(billing["lag"], MESSAGES as u64 - 1, "{billing}");
    assert_eq!(billing["lagExact"], true);

    // The scan is bounded: with a tiny limit it stops and says so.
    let mut pipe = redis::pipe();
    for i in 0..3000 {
        pipe.cmd("SET").arg(format!("filler:{i}")).arg(1).ignore();
    }
    let _: () = pipe.query_async(&mut f.conn).await.unwrap();
    let out = cli(&url, &["groups", "--scan-limit", "1000"]).ok();
    assert!(
        out.contains("note: the scan stopped after about 1000 keys"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seek_is_refused_while_members_own_the_shards_then_moves_the_group() {
    let mut f = Fixture::start().await;
    let url = f.url();
    let stderr = cli(
        &url,
        &[
            "seek", "--stream", STREAM, "--group", GROUP, "--to", "latest",
        ],
    )
    .fails(1, "still has owners on shards it would move");
    assert!(stderr.contains("shard 0: member a (owns)"), "{stderr}");
    assert!(stderr.contains("shard 3: member b (assigned)"), "{stderr}");
    cli(
        &url,
        &["seek", "--stream", STREAM, "--group", GROUP, "--to", "soon"],
    )
    .fails(2, "is not `earliest`, `latest` or an entry id");

    f.leave_all().await;
    cli(
        &url,
        &[
            "seek", "--stream", STREAM, "--group", GROUP, "--to", "latest", "--shard", "9",
        ],
    )
    .fails(1, "shard 9 does not exist");

    let out = cli(
        &url,
        &[
            "seek", "--stream", STREAM, "--group", GROUP, "--to", "latest", "--shard", "1",
        ],
    )
    .ok();
    assert_snapshot(
        &out,
        "\
group `billing` of `orders` moved to $ on 1 shard

SHARD  STREAM  BEFORE  AFTER  LAG  PENDING
1  orders:1  0-0  <ID>  0  0
",
    );
    let shards: serde_json::Value = serde_json::from_str(
        &cli(
            &url,
            &["shards", "--stream", STREAM, "--group", GROUP, "--json"],
        )
        .ok(),
    )
    .unwrap();
    assert_eq!(shards[1]["lag"], 0);
    assert_ne!(shards[0]["lag"], 0, "other shards untouched");

    let json: serde_json::Value = serde_json::from_str(
        &cli(
            &url,
            &[
                "seek", "--stream", STREAM, "--group", GROUP, "--to", "earliest", "--json",
            ],
        )
        .ok(),
    )
    .unwrap();
    let moved = json["shards"].as_array().unwrap();
    assert_eq!(moved.len(), SHARDS as usize);
    for shard in moved {
        assert_eq!(shard["after"], "0-0", "{json}");
    }
    assert_ne!(moved[1]["before"], "0-0");
}

/// `XINFO GROUPS`'s `lag` of `GROUP` on `key` (`None`: Redis cannot tell).
async fn redis_lag(conn: &mut ConnectionManager, key: &str) -> Option<u64> {
    let reply: redis::Value = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap();
    stream_listener::reply::xinfo_groups(&reply)
        .unwrap()
        .into_iter()
        .find(|g| g.name == GROUP)
        .unwrap()
        .lag
}

/// `seek` moves with `ENTRIESREAD`, so Redis keeps reporting the lag: to an entry in the middle of a
/// shard (which a plain `XGROUP SETID` leaves unknown), to the start and to the end; `--json` shows the
/// `entriesRead` set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seek_keeps_the_lag_known() {
    let mut f = Fixture::start().await;
    let url = f.url();
    f.leave_all().await;
    let key = stream_listener::routing::shard_stream_key(STREAM, 0);
    let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(&key)
        .arg("-")
        .arg("+")
        .query_async(&mut f.conn)
        .await
        .unwrap();
    assert!(entries.len() >= 3, "shard 0 has a few entries");
    let middle = &entries[1].0;
    let json: serde_json::Value = serde_json::from_str(
        &cli(
            &url,
            &[
                "seek", "--stream", STREAM, "--group", GROUP, "--to", middle, "--shard", "0",
                "--json",
            ],
        )
        .ok(),
    )
    .unwrap();
    let after = entries.len() as u64 - 2;
    assert_eq!(redis_lag(&mut f.conn, &key).await, Some(after), "{json}");
    assert_eq!(json["shards"][0]["lag"], after, "{json}");
    assert_eq!(
        json["shards"][0]["entriesRead"],
        entries.len() as u64 - after,
        "{json}"
    );
    cli(
        &url,
        &[
            "seek", "--stream", STREAM, "--group", GROUP, "--to", "earliest",
        ],
    )
    .ok();
    let mut total = 0;
    for shard in 0..SHARDS {
        let key = stream_listener::routing::shard_stream_key(STREAM, shard);
        let len: u64 = redis::cmd("XLEN")
            .arg(&key)
            .query_async(&mut f.conn)
            .await
            .unwrap();
        assert_eq!(redis_lag(&mut f.conn, &key).await, Some(len), "{key}");
        total += len;
    }
    assert_eq!(total, MESSAGES as u64);
    cli(
        &url,
        &[
            "seek", "--stream", STREAM, "--group", GROUP, "--to", "latest",
        ],
    )
    .ok();
    assert_eq!(redis_lag(&mut f.conn, &key).await, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_redraws_frames() {
    let f = Fixture::start().await;
    let out = cli(
        &f.url(),
        &[
            "watch",
            "--stream",
            STREAM,
            "--group",
            GROUP,
            "--interval-ms",
            "100",
            "--iterations",
            "2",
        ],
    )
    .ok();
    assert!(
        !out.contains('\x1b'),
        "no ANSI codes when stdout is not a terminal"
    );
    let frames: Vec<&str> = out.split("\norders/billing").collect();
    assert_eq!(frames.len(), 2, "{out}");
    let expected = watch_frame(&f).await;
    assert_snapshot(frames[0], &expected("-"));
    assert_snapshot(&format!("orders/billing{}", frames[1]), &expected("<RATE>"));
}

/// The same view on a terminal (a pseudo-terminal made by util-linux's `script`): every frame clears the
/// screen (cursor home, clear) and is drawn again from the top, the same text as without a terminal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_on_a_terminal_clears_the_screen_before_each_frame() {
    let f = Fixture::start().await;
    let command = format!(
        "{} --redis-url {} watch --stream {STREAM} --group {GROUP} --interval-ms 100 --iterations 2",
        env!("CARGO_BIN_EXE_stream-listener"),
        f.url()
    );
    let output = Command::new("script")
        .args(["--quiet", "--return", "--command", &command, "/dev/null"])
        .env_remove("REDIS_URL")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("util-linux `script` runs the CLI on a pseudo-terminal");
    assert!(output.status.success(), "{output:?}");
    // The terminal turns each newline into CR LF.
    let out = String::from_utf8_lossy(&output.stdout).replace("\r\n", "\n");
    const CLEAR: &str = "\x1b[H\x1b[2J";
    assert!(out.starts_with(CLEAR), "{out:?}");
    let frames: Vec<&str> = out.split(CLEAR).skip(1).collect();
    assert_eq!(frames.len(), 2, "{out:?}");
    let expected = watch_frame(&f).await;
    assert_snapshot(frames[0], &expected("-"));
    assert_snapshot(frames[1], &expected("<RATE>"));
}

/// The expected frame of `watch` on the fixture (normalized), with `rate` in the rate columns.
async fn watch_frame(f: &Fixture) -> impl Fn(&str) -> String {
    let frame = |text: &str| {
        format!(
            "\
orders/billing  <TIME>  every <DUR>, ctrl-c quits
state STABLE  group epoch 2  assignment epoch 2  shards 4  revision REV
resharding none
lag 40  pending 0  consumed {text}  produced {text}

MEMBER  STATE  EPOCH  LEASE  SHARDS  PENDING  REVOKING
a  STABLE  <EPOCH>  <DUR>  0-1  -  -
b  STABLE  <EPOCH>  <DUR>  2-3  -  -

SHARD  OWNER  LENGTH  LAG  PENDING  LAST DELIVERED  RATE
0  a  LEN0  LEN0  0  0-0  {text}
1  a  LEN1  LEN1  0  0-0  {text}
2  b  LEN2  LEN2  0  0-0  {text}
3  b  LEN3  LEN3  0  0-0  {text}
"
        )
    };
    let mut lengths = Vec::new();
    let mut conn = f.conn.clone();
    for i in 0..SHARDS {
        let len: u64 = redis::cmd("XLEN")
            .arg(format!("{STREAM}:{i}"))
            .query_async(&mut conn)
            .await
            .unwrap();
        lengths.push(len);
    }
    move |rate: &str| {
        let mut e = frame(rate);
        for (i, len) in lengths.iter().enumerate() {
            e = e.replace(&format!("LEN{i}"), &len.to_string());
        }
        e
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_filter_show_bulk_replay_and_purge() {
    let mut f = Fixture::start().await;
    let url = f.url();
    let dlq = format!("{STREAM}:dlq");
    let a = add_dead_letter(
        &mut f.conn,
        GROUP,
        "customer-1",
        r#"{"id":1,"note":"two\nlines"}"#,
        "billing failed: card declined",
    )
    .await;
    let b = add_dead_letter(
        &mut f.conn,
        "shipping",
        "customer-2",
        r#"{"id":2}"#,
        "no address",
    )
    .await;
    let c = add_dead_letter(&mut f.conn, GROUP, "customer-3", "not json", "undecodable").await;
    // A group that does not read the stream: its replay is refused, and the entry stays.
    let gone = add_dead_letter(&mut f.conn, "retired", "customer-4", "{}", "old").await;
    cli(
        &url,
        &["dead-letters", "replay", "--stream", STREAM, "--id", &gone],
    )
    .fails(1, "group `retired` has no consumer group on orders:");
    cli(
        &url,
        &[
            "dead-letters",
            "purge",
            "--stream",
            STREAM,
            "--id",
            &gone,
            "--yes",
        ],
    )
    .ok();

    let out = cli(
        &url,
        &[
            "dead-letters",
            "--stream",
            STREAM,
            "--group",
            GROUP,
            "--payloads",
        ],
    )
    .ok();
    assert_snapshot(
        &out,
        "\
ID  GROUP  SHARD  SOURCE ID  DELIVERIES  KEY  ERROR  PAYLOAD
<ID>  billing  1  1-1  3  customer-1  billing failed: card declined  {\"id\":1,\"note\":\"two\\nlines\"}
<ID>  billing  1  1-1  3  customer-3  undecodable  not json

2 dead letters of group `billing` shown; 3 in orders:dlq
",
    );
    let shown = cli(
        &url,
        &["dead-letters", "show", "--stream", STREAM, "--id", &a],
    )
    .ok();
    assert_snapshot(
        &shown,
        "\
id  <ID>
group  billing
shard  1
source stream  orders:1
source id  1-1
consumer  a
deliveries  3
key  customer-1
error  billing failed: card declined
payload
  {
  \"id\": 1,
  \"note\": \"two\\nlines\"
  }
",
    );
    let json: serde_json::Value = serde_json::from_str(
        &cli(
            &url,
            &[
                "dead-letters",
                "show",
                "--stream",
                STREAM,
                "--id",
                &b,
                "--json",
            ],
        )
        .ok(),
    )
    .unwrap();
    assert_eq!(json["payload"], serde_json::json!({"id": 2}));
    assert_eq!(json["group"], "shipping");
    assert_eq!(json["deliveries"], 3);

    // Bulk replay and purge need confirmation: without a terminal and without --yes, nothing changes.
    cli(
        &url,
        &["dead-letters", "replay", "--stream", STREAM, "--all"],
    )
    .fails(1, "pass --yes (stdin is not a terminal); nothing changed");
    cli(
        &url,
        &["dead-letters", "purge", "--stream", STREAM, "--id", &b],
    )
    .fails(1, "delete 1 dead letter from orders:dlq for good?");
    cli(
        &url,
        &[
            "dead-letters",
            "replay",
            "--stream",
            STREAM,
            "--group",
            GROUP,
        ],
    )
    .fails(2, "--id");
    assert_eq!(f.xlen(&dlq).await, 3);

    let out = cli(
        &url,
        &[
            "dead-letters",
            "replay",
            "--stream",
            STREAM,
            "--all",
            "--group",
            GROUP,
            "--yes",
        ],
    )
    .ok();
    assert_snapshot(
        &out,
        &format!(
            "\
replayed <ID> (key customer-1) to orders:{} as <ID> for group `billing` only; deleted it from orders:dlq
replayed <ID> (key customer-3) to orders:{} as <ID> for group `billing` only; deleted it from orders:dlq
replayed 2 of 2 dead letters from orders:dlq
",
            routing(&mut f.conn, "customer-1").await,
            routing(&mut f.conn, "customer-3").await
        ),
    );
    let left: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(&dlq)
        .arg("-")
        .arg("+")
        .query_async(&mut f.conn)
        .await
        .unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].0, b, "the other group's dead letter stays");
    let _ = c;

    let out = cli(
        &url,
        &[
            "dead-letters",
            "purge",
            "--stream",
            STREAM,
            "--all",
            "--yes",
        ],
    )
    .ok();
    assert_eq!(out, "deleted 1 dead letter from orders:dlq\n");
    assert_eq!(f.xlen(&dlq).await, 0);
    let out = cli(
        &url,
        &["dead-letters", "purge", "--stream", STREAM, "--all"],
    )
    .ok();
    assert_eq!(out, "no dead letters in orders:dlq: nothing to do\n");
}

async fn routing(conn: &mut ConnectionManager, key: &str) -> u32 {
    Topology::load(conn, STREAM)
        .await
        .unwrap()
        .shard_for_key(key.as_bytes())
}

/// The point of replaying to the failed group: a second group on the same stream does not handle the
/// entry again, the failed group does, once. Real members (the library's runtime) consume both groups.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_reaches_only_the_group_that_failed() {
    use std::sync::Mutex;
    use stream_listener::{ConsumerBuilder, Message, Runtime};

    let redis = RedisServer::start();
    let url = redis.url();
    let mut conn = connect(&url).await;
    Topology::ensure(&mut conn, STREAM, 2).await.unwrap();
    let key = "customer-7";
    let shard = routing(&mut conn, key).await;
    // A later entry on the same shard: once a group has handled it, it has read past the replay.
    let marker = (0..1000)
        .map(|i| format!("marker-{i}"))
        .find(|k| stream_listener::routing::shard_for_key(k.as_bytes(), 2) == shard)
        .unwrap();
    let id = add_dead_letter(&mut conn, GROUP, key, r#"{"seq":7}"#, "failed once").await;

    let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let listener = |group: &'static str| {
        let seen = seen.clone();
        ConsumerBuilder::new(STREAM, group).handler(move |msg: Message<serde_json::Value>| {
            let seen = seen.clone();
            async move {
                seen.lock()
                    .unwrap()
                    .push((group.to_string(), msg.key.clone()));
                Ok::<_, std::io::Error>(())
            }
        })
    };
    let running = Runtime::new(url.clone())
        .without_default_logging()
        .without_annotated_listeners()
        .group_config(GroupConfig {
            heartbeat_interval_ms: 200,
            session_timeout_ms: 5_000,
            rebalance_timeout_ms: 10_000,
        })
        .consumer(listener(GROUP))
        .consumer(listener("shipping"))
        .start()
        .await
        .unwrap();
    // Both groups exist on the shard streams once the runtime started: replay, then publish the marker.
    let out = cli(
        &url,
        &["dead-letters", "replay", "--stream", STREAM, "--id", &id],
    )
    .ok();
    assert!(out.contains("for group `billing` only"), "{out}");
    let producer = Producer::new(conn.clone(), STREAM).await.unwrap();
    producer
        .send(marker.as_str(), &serde_json::json!({ "marker": true }))
        .await
        .unwrap();

    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let done = {
            let seen = seen.lock().unwrap();
            [GROUP, "shipping"]
                .iter()
                .all(|g| seen.iter().any(|(sg, k)| sg == g && *k == marker))
        };
        if done {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "both groups should handle the marker: {:?}",
            seen.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = running.stop().await;
    let seen = seen.lock().unwrap().clone();
    let handled = |group: &str| seen.iter().filter(|(g, k)| g == group && k == key).count();
    assert_eq!(handled(GROUP), 1, "{seen:?}");
    assert_eq!(handled("shipping"), 0, "{seen:?}");
    // The other group acknowledged it: nothing pending, no lag.
    let shards: serde_json::Value = serde_json::from_str(
        &cli(
            &url,
            &[
                "shards", "--stream", STREAM, "--group", "shipping", "--json",
            ],
        )
        .ok(),
    )
    .unwrap();
    assert_eq!(shards[shard as usize]["pending"], 0, "{shards}");
    assert_eq!(shards[shard as usize]["lag"], 0, "{shards}");
}

/// A password in the URL never reaches any output: errors, help, or the commands' own text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_never_appear_in_any_output() {
    let mut f = Fixture::start().await;
    let secret = "topsecret";
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("alice")
        .arg("on")
        .arg(format!(">{secret}"))
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .query_async(&mut f.conn)
        .await
        .unwrap();
    let port = f.redis.port();
    let good = format!("redis://alice:{secret}@127.0.0.1:{port}/");
    let wrong = format!("redis://alice:not-{secret}@127.0.0.1:{port}/");
    let unreachable = format!("redis://alice:{secret}@127.0.0.1:1/");
    let id = add_dead_letter(&mut f.conn, GROUP, "customer-1", "{}", "boom").await;

    let mut outputs = Vec::new();
    for args in [
        vec!["status", "--stream", STREAM, "--group", GROUP],
        vec!["groups"],
        vec!["shards", "--stream", STREAM, "--group", GROUP],
        vec!["dead-letters", "--stream", STREAM, "--payloads"],
        vec!["dead-letters", "show", "--stream", STREAM, "--id", &id],
        vec![
            "watch",
            "--stream",
            STREAM,
            "--group",
            GROUP,
            "--iterations",
            "1",
        ],
    ] {
        let run = cli(&good, &args);
        assert_eq!(run.code, Some(0), "works with the password: {run:?}");
        outputs.push(run);
    }
    let stderr = cli(&wrong, &["status", "--stream", STREAM, "--group", GROUP]).fails(
        1,
        &format!("error: Redis at redis://alice:***@127.0.0.1:{port}/: authentication failed"),
    );
    assert!(!stderr.contains("not-topsecret"), "{stderr}");
    cli(&unreachable, &["groups"]).fails(1, "redis://alice:***@127.0.0.1:1/");
    outputs.push(cli(&unreachable, &["groups"]));
    outputs.push(cli("redis://alice:topsecret@", &["groups"]));
    // `--help` shows the environment variable, never its value.
    let help = Command::new(env!("CARGO_BIN_EXE_stream-listener"))
        .arg("--help")
        .env("REDIS_URL", &good)
        .output()
        .unwrap();
    outputs.push(Run {
        code: help.status.code(),
        stdout: String::from_utf8_lossy(&help.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&help.stderr).into_owned(),
    });
    assert!(outputs.last().unwrap().stdout.contains("REDIS_URL"));
    for run in &outputs {
        assert!(
            !run.stdout.contains(secret) && !run.stderr.contains(secret),
            "credentials printed: {run:#?}"
        );
    }
}

/// Runs the binary on a pseudo-terminal (util-linux `script`) with `answer` typed in; `None` without
/// `script`. Returns the exit status and everything the terminal showed.
fn on_terminal(url: &str, args: &[&str], answer: &str) -> Option<(Option<i32>, String)> {
    use std::io::Write as _;
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("skipped: no `script` to make a terminal");
        return None;
    }
    let mut line = format!(
        "{} --redis-url {url}",
        env!("CARGO_BIN_EXE_stream-listener")
    );
    for arg in args {
        line.push(' ');
        line.push_str(arg);
    }
    let mut child = Command::new("script")
        .args(["-q", "-e", "-c", &line, "/dev/null"])
        .env_remove("REDIS_URL")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run script");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(answer.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    Some((
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_changes_ask_on_a_terminal() {
    let mut f = Fixture::start().await;
    let url = f.url();
    let dlq = format!("{STREAM}:dlq");
    add_dead_letter(&mut f.conn, GROUP, "customer-1", "{}", "boom").await;
    let purge = ["dead-letters", "purge", "--stream", STREAM, "--all"];
    let Some((code, screen)) = on_terminal(&url, &purge, "n\n") else {
        return;
    };
    assert_eq!(code, Some(1), "{screen}");
    assert!(
        screen.contains("delete 1 dead letter from orders:dlq for good? [y/N]"),
        "{screen}"
    );
    assert!(
        screen.contains("not confirmed; nothing changed"),
        "{screen}"
    );
    assert_eq!(f.xlen(&dlq).await, 1);

    let (code, screen) = on_terminal(&url, &purge, "y\n").unwrap();
    assert_eq!(code, Some(0), "{screen}");
    assert!(
        screen.contains("deleted 1 dead letter from orders:dlq"),
        "{screen}"
    );
    assert_eq!(f.xlen(&dlq).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_on_reshard_rollback_replay_purge_and_watch() {
    let mut f = Fixture::start().await;
    let url = f.url();
    let json = |out: String| -> serde_json::Value { serde_json::from_str(&out).expect(&out) };

    let grown = json(
        cli(
            &url,
            &[
                "reshard",
                "--stream",
                STREAM,
                "--shards",
                "6",
                "--grace-ms",
                "300",
                "--json",
            ],
        )
        .ok(),
    );
    assert_eq!(grown["stream"], STREAM);
    assert_eq!(grown["changed"], true);
    assert_eq!(grown["kind"], "resize");
    assert_eq!(grown["fromShards"], SHARDS);
    assert_eq!(grown["toShards"], 6);
    assert_eq!(grown["fromVersion"], 1);
    assert_eq!(grown["toVersion"], 2);
    assert_eq!(grown["graceMs"], 300);
    assert!(grown["cutMs"].as_u64().unwrap() > 0, "{grown}");
    assert_eq!(grown["groups"], serde_json::json!([GROUP]));
    assert_eq!(grown["drainingShards"], serde_json::json!([]));

    let same = json(
        cli(
            &url,
            &["reshard", "--stream", STREAM, "--shards", "6", "--json"],
        )
        .ok(),
    );
    assert_eq!(same["changed"], false, "{same}");
    assert_eq!(same["kind"], serde_json::Value::Null, "{same}");
    assert_eq!(same["toVersion"], 2);

    // Once the group follows and consumed the old shards past the cut, the stream rolls back.
    f.store
        .command(AdminCommand::SetShardCount(6))
        .await
        .unwrap()
        .unwrap();
    f.consume_everything(0..SHARDS).await;
    let start = std::time::Instant::now();
    let rolled = loop {
        let out = cli(&url, &["rollback", "--stream", STREAM, "--json"]);
        if out.code == Some(0) || start.elapsed() > std::time::Duration::from_secs(10) {
            break json(out.ok());
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(rolled["changed"], true, "{rolled}");
    assert_eq!(rolled["kind"], "rollback", "{rolled}");
    assert_eq!(rolled["fromShards"], 6);
    assert_eq!(rolled["toShards"], SHARDS);
    assert_eq!(rolled["toVersion"], 3);
    assert_eq!(rolled["drainingShards"], serde_json::json!([4, 5]));

    // Dead letters: one replayed to its group, the rest purged.
    let dlq = format!("{STREAM}:dlq");
    let mut ids = Vec::new();
    for key in ["customer-7", "customer-9", "customer-11"] {
        let id: String = redis::cmd("XADD")
            .arg(&dlq)
            .arg("*")
            .arg("k")
            .arg(key)
            .arg("p")
            .arg(format!(r#"{{"key":"{key}"}}"#))
            .arg("dlq_error")
            .arg("failed")
            .arg("dlq_group")
            .arg(GROUP)
            .query_async(&mut f.conn)
            .await
            .unwrap();
        ids.push(id);
    }
    let shard = Topology::load(&mut f.conn, STREAM)
        .await
        .unwrap()
        .shard_for_key(b"customer-7");
    let replayed = json(
        cli(
            &url,
            &[
                "dead-letters",
                "replay",
                "--stream",
                STREAM,
                "--id",
                &ids[0],
                "--json",
            ],
        )
        .ok(),
    );
    assert_eq!(replayed["dlq"], dlq);
    assert_eq!(replayed["skipped"], serde_json::json!([]));
    let one = &replayed["replayed"][0];
    assert_eq!(one["id"], ids[0].as_str(), "{replayed}");
    assert_eq!(one["key"], "customer-7");
    assert_eq!(one["stream"], format!("{STREAM}:{shard}"));
    assert_eq!(one["group"], GROUP);
    assert!(one["newId"].as_str().unwrap().contains('-'), "{replayed}");

    let purged = json(
        cli(
            &url,
            &[
                "dead-letters",
                "purge",
                "--stream",
                STREAM,
                "--all",
                "--yes",
                "--json",
            ],
        )
        .ok(),
    );
    assert_eq!(purged["deleted"], 2, "{purged}");
    assert_eq!(purged["ids"], serde_json::json!([ids[1], ids[2]]));
    let nothing = json(
        cli(
            &url,
            &[
                "dead-letters",
                "purge",
                "--stream",
                STREAM,
                "--all",
                "--yes",
                "--json",
            ],
        )
        .ok(),
    );
    assert_eq!(nothing["deleted"], 0, "{nothing}");
    assert_eq!(f.xlen(&dlq).await, 0);

    // watch --json: JSON Lines, one status object per refresh.
    let frames = cli(
        &url,
        &[
            "watch",
            "--stream",
            STREAM,
            "--group",
            GROUP,
            "--iterations",
            "2",
            "--interval-ms",
            "100",
            "--json",
        ],
    )
    .ok();
    let lines: Vec<&str> = frames.lines().collect();
    assert_eq!(lines.len(), 2, "{frames}");
    for line in lines {
        let frame = json(line.to_owned());
        assert_eq!(frame["stream"], STREAM);
        assert_eq!(frame["group"], GROUP);
        assert!(frame["shards"].is_array(), "{frame}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_prints_each_keys_shard_as_the_spec_routes_it() {
    let redis = RedisServer::start();
    let url = redis.url();
    let mut conn = connect(&url).await;
    // The spec's test vectors (`shared/spec/routing.md`): order-123 is shard 13 of 16, 1 of 10.
    Topology::ensure(&mut conn, "sixteen", 16).await.unwrap();
    Topology::ensure(&mut conn, "ten", 10).await.unwrap();
    let out = cli(
        &url,
        &["route", "--stream", "sixteen", "order-123", "user-42"],
    )
    .ok();
    let user = stream_listener::routing::shard_for_key(b"user-42", 16);
    assert_eq!(
        rows(&out),
        [
            ["order-123", "13", "sixteen:13"].map(String::from).to_vec(),
            [
                "user-42".into(),
                user.to_string(),
                format!("sixteen:{user}")
            ]
            .to_vec(),
        ]
    );
    assert!(
        out.ends_with("stream `sixteen`: 16 shards (topology version 1)\n"),
        "{out}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&cli(&url, &["route", "--stream", "ten", "order-123", "--json"]).ok())
            .unwrap();
    assert_eq!(json["shardCount"], 10, "{json}");
    assert_eq!(json["routes"][0]["shard"], 1, "{json}");
    assert_eq!(json["routes"][0]["streamKey"], "ten:1", "{json}");

    // No topology: the library's error, which says how to create one.
    cli(&url, &["route", "--stream", "nowhere", "k"]).fails(1, "has no topology");
    // At least one key.
    cli(&url, &["route", "--stream", "sixteen"]).fails(2, "KEYS");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_warns_about_entries_written_to_the_logical_name() {
    let mut f = Fixture::start().await;
    let url = f.redis.url();
    let out = cli(&url, &["status", "--stream", STREAM, "--group", GROUP]).ok();
    assert!(!out.contains("warning"), "{out}");
    let json: serde_json::Value = serde_json::from_str(
        &cli(
            &url,
            &["status", "--stream", STREAM, "--group", GROUP, "--json"],
        )
        .ok(),
    )
    .unwrap();
    assert!(json["strayEntries"].is_null(), "{json}");

    // `XADD orders ...`: the logical name, not a shard.
    for _ in 0..2 {
        let _: String = redis::cmd("XADD")
            .arg(STREAM)
            .arg("*")
            .arg("k")
            .arg("customer-1")
            .arg("p")
            .arg("{}")
            .query_async(&mut f.conn)
            .await
            .unwrap();
    }
    let out = cli(&url, &["status", "--stream", STREAM, "--group", GROUP]).ok();
    let warning = out
        .lines()
        .find(|l| l.starts_with("warning "))
        .unwrap_or_else(|| panic!("no warning line: {out}"));
    assert!(
        warning.contains(
            "`orders` (the logical stream's own name) holds 2 entries that no group reads"
        ) && warning.contains("`orders:0`..`orders:3`"),
        "{warning}"
    );
    let json: serde_json::Value = serde_json::from_str(
        &cli(
            &url,
            &["status", "--stream", STREAM, "--group", GROUP, "--json"],
        )
        .ok(),
    )
    .unwrap();
    assert_eq!(json["strayEntries"], 2, "{json}");
}
