//! The `stream-listener` binary against a redis-server of its own: a group of two members driven through
//! the library (GroupStore + MemberSession, heartbeats applied in lockstep, so no timing is involved), then
//! every command's output and exit status, failures included.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use stream_listener::coordinator::metadata::GroupConfig;
use stream_listener::coordinator::projection::{GroupProjection, GroupState};
use stream_listener::coordinator::AdminCommand;
use stream_listener::member::lifecycle::ShardCommand;
use stream_listener::member::session::{MemberIdentity, MemberSession};
use stream_listener::store::GroupStore;
use stream_listener::topology::{StartFrom, Topology};
use stream_listener::Producer;
use stream_listener_test_support::RedisServer;

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
    let client = redis::Client::open(url).expect("url");
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_secs(5)))
        .set_connection_timeout(Some(Duration::from_secs(5)));
    ConnectionManager::new_with_config(client, config)
        .await
        .expect("connect")
}

fn session(id: &str) -> MemberSession {
    let identity = MemberIdentity {
        member_id: Arc::from(id),
        member_name: None,
        weight: 1,
        runtime_max_concurrency: 2,
    };
    MemberSession::new(identity, CONFIG.session_timeout_ms, 0xc11 ^ id.len() as u64)
}

/// A Redis with stream `orders` (4 shards, [`MESSAGES`] entries, consumer group `billing` on every shard)
/// and group `billing` with members `a` and `b`, stable.
struct Fixture {
    redis: RedisServer,
    conn: ConnectionManager,
    store: GroupStore,
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
        let store = GroupStore::new(conn.clone(), STREAM, GROUP, SHARDS, CONFIG).unwrap();
        let mut fixture = Fixture { redis, conn, store };
        fixture.converge(&mut [session("a"), session("b")]).await;
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
                let response = self.store.heartbeat(&s.heartbeat(0, 2)).await.unwrap();
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

    async fn view(&mut self) -> GroupProjection {
        self.store.load().await.unwrap().1.projection(0)
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
    let out = cli(&f.url(), &["status", "--stream", STREAM, "--group", GROUP]).ok();
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
    let status = cli(&f.url(), &["status", "--stream", STREAM, "--group", GROUP]).ok();
    let b = rows(&status[status.find("MEMBER").unwrap()..])
        .into_iter()
        .find(|row| row[0] == "b")
        .unwrap();
    assert_eq!(b[1], "FENCED", "{status}");

    cli(
        &f.url(),
        &[
            "fence", "--stream", STREAM, "--group", GROUP, "--member", "zz",
        ],
    )
    .fails(1, "no live member \"zz\"");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reshard_grows_refuses_stranding_shrinks_and_rollback_undoes_the_group() {
    let mut f = Fixture::start().await;
    let url = f.url();
    cli(&url, &["rollback", "--stream", STREAM, "--group", GROUP])
        .fails(1, "no shard count change to roll back");

    // Shards 1..3 hold unread entries: a shrink to 1 would strand them.
    assert!(f.xlen(&format!("{STREAM}:1")).await > 0);
    cli(&url, &["reshard", "--stream", STREAM, "--shards", "1"]).fails(
        1,
        "cannot shrink stream `orders`: group `billing` has not consumed",
    );
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
            "5000",
        ],
    )
    .ok();
    assert!(
        out.contains("4 -> 6 shards (topology version 1 -> 2)"),
        "{out}"
    );
    assert!(out.contains("(grace 5.0s)"), "{out}");
    assert!(out.contains("groups billing follow"), "{out}");
    let topology = Topology::load(&mut f.conn, STREAM).await.unwrap();
    assert_eq!(topology.shard_count(), 6);
    assert_eq!(topology.migration().unwrap().grace_ms, 5000);
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
    let out = cli(&url, &["rollback", "--stream", STREAM, "--group", GROUP]).ok();
    assert!(
        out.contains("group `billing` rolled back to 4 shards"),
        "{out}"
    );
    assert!(
        out.contains("warning: stream `orders` still has 6 shards"),
        "{out}"
    );
    assert_eq!(f.view().await.shard_count, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_list_and_replay() {
    let mut f = Fixture::start().await;
    let url = f.url();
    let dlq = format!("{STREAM}:dlq");
    let empty = cli(&url, &["dead-letters", "--stream", STREAM]).ok();
    assert_eq!(empty, format!("no dead letters in {dlq}\n"));

    // Entries as the consumer writes them: the original fields, then the dlq_* fields.
    let mut ids = Vec::new();
    for (key, error) in [
        ("customer-7", "billing failed: card declined"),
        ("customer-9", "payload: expected struct Order"),
    ] {
        let id: String = redis::cmd("XADD")
            .arg(&dlq)
            .arg("*")
            .arg("k")
            .arg(key)
            .arg("p")
            .arg(format!(r#"{{"key":"{key}"}}"#))
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
    assert!(out.contains("2 of 2 dead letters in orders:dlq"), "{out}");
    let one = cli(&url, &["dead-letters", "--stream", STREAM, "--count", "1"]).ok();
    assert!(one.contains("1 of 2 dead letters"), "{one}");

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
            ("p".to_string(), r#"{"key":"customer-7"}"#.to_string())
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
        vec!["rollback"],
        vec!["fence", "--member", "a"],
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
    for command in ["status", "shards", "rollback"] {
        cli(&url, &[command, "--stream", STREAM, "--group", "broken"])
            .fails(1, &format!("group metadata at {corrupt} cannot be used"));
    }
    let stored: String = redis::cmd("GET")
        .arg(corrupt)
        .query_async(&mut f.conn)
        .await
        .unwrap();
    assert_eq!(stored, "{not json", "left untouched");

    let projection = "sl:{orders/billing}:projection";
    let _: () = redis::cmd("SET")
        .arg(projection)
        .arg("[]")
        .query_async(&mut f.conn)
        .await
        .unwrap();
    cli(&url, &["status", "--stream", STREAM, "--group", GROUP]).fails(1, projection);

    cli(&url, &["status", "--stream", "a{b", "--group", GROUP]).fails(1, "invalid name");

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
