//! Redis-backed coordination against real redis-server processes: convergence, expiry without overlap,
//! pauses, racing coordinator paths, corrupt metadata, a Redis restart, and the cost of a steady heartbeat.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::ConnectionManager;
use stream_listener::clock::{LocalMillis, StoreMillis};
use stream_listener::coordinator::metadata::GroupConfig;
use stream_listener::coordinator::projection::GroupState;
use stream_listener::coordinator::wire::HeartbeatStatus;
use stream_listener::member::heartbeat::{MemberLoop, MemberStatus};
use stream_listener::member::lifecycle::{ShardCommand, ShardReport};
use stream_listener::member::session::{MemberSession, Phase};
use stream_listener::store::wakeup::Wakeups;
use stream_listener::store::{GroupKeys, GroupStore, StoreError};
use stream_listener::{Connection, RedisTarget};
use stream_listener_test_support::aio::{command_calls, connect_with_timeouts, xrange};
use stream_listener_test_support::monitor::{Monitor, MonitorLine};
use stream_listener_test_support::RedisServer;
use stream_listener_tests::{member_session, on_every_target, Target};
use tokio::sync::{mpsc, watch, Notify};
use tokio::time::Instant;

const HB: i64 = 100;
const SESSION: i64 = 1_000;
const CONFIG: GroupConfig = GroupConfig {
    heartbeat_interval_ms: HB,
    session_timeout_ms: SESSION,
    rebalance_timeout_ms: 2_000,
};

/// Short timeouts: a test that stops Redis must see errors, not hang.
async fn connect(url: &str) -> ConnectionManager {
    connect_with_timeouts(url, Duration::from_millis(500), Some(1)).await
}

fn session(id: &str) -> MemberSession {
    let incarnation = std::process::id() as u64 ^ id.len() as u64 ^ 0x5eed;
    member_session(id, SESSION, 1, incarnation)
}

async fn store(url: &str, group: &str, shards: u32) -> GroupStore {
    GroupStore::create(connect(url).await, "orders", group, shards, CONFIG).expect("store")
}

/// Who reads which shard, across all members of a test, with every overlap recorded.
#[derive(Default)]
struct Ledger {
    readers: BTreeMap<u32, String>,
    overlaps: Vec<String>,
    /// Highest fencing token (member epoch) granted per shard, and every grant that went below it.
    tokens: BTreeMap<u32, i64>,
    backwards: Vec<String>,
    /// Every grant, in order.
    grants: Vec<u32>,
}

type SharedLedger = Arc<Mutex<Ledger>>;

/// A member with a runtime heartbeat loop and a recording consumption layer that drains at once.
struct RunningMember {
    shutdown: watch::Sender<bool>,
    status: watch::Receiver<MemberStatus>,
    task: tokio::task::JoinHandle<()>,
    /// The recording consumption layer (abort it to kill the member's consumer).
    consumer: tokio::task::JoinHandle<()>,
}

async fn spawn_member(
    url: &str,
    group: &str,
    shards: u32,
    id: &str,
    ledger: SharedLedger,
) -> RunningMember {
    spawn_member_with(connect(url).await, group, shards, id, ledger, CONFIG, None).await
}

async fn spawn_member_with(
    conn: impl Into<Connection>,
    group: &str,
    shards: u32,
    id: &str,
    ledger: SharedLedger,
    config: GroupConfig,
    wakeup: Option<Arc<Notify>>,
) -> RunningMember {
    let (commands_tx, mut commands_rx) = mpsc::unbounded_channel();
    let (reports_tx, reports_rx) = mpsc::unbounded_channel();
    let (shutdown, shutdown_rx) = watch::channel(false);
    let (status_tx, status) = watch::channel(MemberStatus::default());
    let member = id.to_string();
    let consumer = tokio::spawn(async move {
        while let Some(command) = commands_rx.recv().await {
            let mut ledger = ledger.lock().unwrap();
            match command {
                ShardCommand::Assign { shard, token } => {
                    let epoch = token.member_epoch;
                    ledger.grants.push(shard);
                    if let Some(last) = ledger.tokens.insert(shard, epoch) {
                        if last >= epoch {
                            ledger.backwards.push(format!(
                                "shard {shard}: token {epoch} to {member} after {last}"
                            ));
                        }
                    }
                    if let Some(other) = ledger.readers.insert(shard, member.clone()) {
                        ledger.overlaps.push(format!(
                            "shard {shard} given to {member} while {other} reads it"
                        ));
                    }
                }
                ShardCommand::Revoke { shard } => {
                    ledger.readers.remove(&shard);
                    let _ = reports_tx.send(ShardReport::Revoked { shard });
                }
                ShardCommand::Fence => ledger.readers.retain(|_, m| *m != member),
            }
        }
    });
    let mut member = MemberLoop::new(
        session(id),
        GroupStore::create(conn, "orders", group, shards, config).expect("store"),
        stream_listener::member::lifecycle::OwnershipDeadline::new(),
        commands_tx,
        reports_rx,
        shutdown_rx,
    )
    .with_status(status_tx);
    if let Some(wakeup) = wakeup {
        member = member.with_wakeup(wakeup);
    }
    let task = tokio::spawn(member.run());
    RunningMember {
        shutdown,
        status,
        task,
        consumer,
    }
}

/// Waits until `done` holds, polling the projection; panics with the last view at the deadline.
async fn wait_for<F>(store: &mut GroupStore, deadline: Duration, mut done: F) -> Duration
where
    F: FnMut(&stream_listener::coordinator::projection::GroupProjection) -> bool,
{
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < deadline {
        if let Ok((_, coordinator)) = store.load().await {
            let view = coordinator.projection(StoreMillis(0));
            if done(&view) {
                return start.elapsed();
            }
            last = Some(view);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("condition not reached within {deadline:?}; last view: {last:#?}");
}

fn converged(
    members: usize,
    shards: u32,
) -> impl FnMut(&stream_listener::coordinator::projection::GroupProjection) -> bool {
    move |view| {
        let live: Vec<_> = view
            .members
            .iter()
            .filter(|m| m.lease_deadline_ms > 0)
            .collect();
        let counts: Vec<usize> = live.iter().map(|m| m.assigned.len()).collect();
        view.state == GroupState::Stable
            && live.len() == members
            && counts.iter().sum::<usize>() == shards as usize
            && counts.iter().max().unwrap_or(&0) - counts.iter().min().unwrap_or(&0) <= 1
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_members_joining_at_once_converge() {
    let redis = RedisServer::start();
    let ledger = SharedLedger::default();
    let mut members = Vec::new();
    for i in 0..8 {
        members.push(spawn_member(&redis.url(), "g8", 16, &format!("m{i}"), ledger.clone()).await);
    }
    let mut observer = store(&redis.url(), "g8", 16).await;
    let took = wait_for(&mut observer, Duration::from_secs(20), converged(8, 16)).await;
    let intervals = took.as_millis() as i64 / HB;
    println!("8 members converged in {took:?} ({intervals} heartbeat intervals)");
    assert!(intervals <= 30, "took {intervals} intervals");
    // Every shard read by exactly one member, as the coordinator says.
    let ledger = ledger.lock().unwrap();
    assert!(ledger.overlaps.is_empty(), "{:?}", ledger.overlaps);
    assert_eq!(ledger.readers.len(), 16);
    drop(ledger);
    for m in &members {
        assert_eq!(m.status.borrow().phase, Phase::Member);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_member_expires_and_its_shards_move_without_overlap() {
    let redis = RedisServer::start();
    let ledger = SharedLedger::default();
    // A is driven by hand so it can fall silent while still believing it owns shards.
    let mut a_store = store(&redis.url(), "gx", 4).await;
    let mut a = session("a");
    let start = Instant::now();
    let local = || LocalMillis(start.elapsed().as_millis() as i64);
    // A new group grants nothing for two heartbeat intervals (members of a lost state would show up).
    let grant_deadline = Instant::now() + Duration::from_secs(10);
    let mut granted = 0;
    while granted < 4 {
        assert!(Instant::now() < grant_deadline, "a got nothing");
        let response = a_store.heartbeat(&a.heartbeat(local(), 1)).await.unwrap();
        granted += a.on_response(&response).len();
        tokio::time::sleep(Duration::from_millis(HB as u64 / 5)).await;
    }
    assert_eq!(a.owned().len(), 4, "the first member gets everything");
    let response = a_store.heartbeat(&a.heartbeat(local(), 1)).await.unwrap();
    let _ = a.on_response(&response);
    let a_valid_until = start + Duration::from_millis(a.valid_until().0 as u64);
    // B joins; A falls silent now (a crash, or a process that cannot reach Redis).
    let b = spawn_member(&redis.url(), "gx", 4, "b", ledger.clone()).await;
    let mut observer = store(&redis.url(), "gx", 4).await;
    let b_owns_all = |view: &stream_listener::coordinator::projection::GroupProjection| {
        view.members
            .iter()
            .any(|m| m.member_id == "b" && m.owned.len() == 4)
            && converged(1, 4)(view)
    };
    wait_for(&mut observer, Duration::from_secs(10), b_owns_all).await;
    let b_got_all = Instant::now();
    assert!(
        b_got_all >= a_valid_until,
        "B read A's shards before A's own lease view ran out"
    );
    for shard in 0..4 {
        assert!(!a.may_touch(shard, local()), "A still trusts shard {shard}");
    }
    // A comes back with its old state: fenced, then it rejoins and the group rebalances.
    let stale = a_store.heartbeat(&a.heartbeat(local(), 1)).await.unwrap();
    assert_eq!(stale.status, HeartbeatStatus::FencedMemberEpoch);
    assert_eq!(
        a.on_response(&stale),
        vec![ShardCommand::Fence],
        "drops everything it believed it owned"
    );
    assert_eq!(a.phase(), Phase::Joining);
    // It rejoins as a new incarnation and, once b has handed over, owns its share again.
    let rejoin_deadline = Instant::now() + Duration::from_secs(10);
    while a.owned().len() != 2 {
        assert!(
            Instant::now() < rejoin_deadline,
            "a did not get its share back"
        );
        let response = a_store.heartbeat(&a.heartbeat(local(), 1)).await.unwrap();
        for command in a.on_response(&response) {
            if let ShardCommand::Assign { shard, .. } = command {
                let mut ledger = ledger.lock().unwrap();
                if let Some(other) = ledger.readers.insert(shard, "a".into()) {
                    ledger
                        .overlaps
                        .push(format!("shard {shard} given to a while {other} reads it"));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(HB as u64 / 5)).await;
    }
    assert!(a.epoch() > 0);
    assert!(
        ledger.lock().unwrap().overlaps.is_empty(),
        "{:?}",
        ledger.lock().unwrap().overlaps
    );
    assert_eq!(b.status.borrow().phase, Phase::Member);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_member_resumes_fenced_and_rejoins() {
    let redis = RedisServer::start();
    let ledger = SharedLedger::default();
    let paused = spawn_member(&redis.url(), "gp", 6, "p", ledger.clone()).await;
    let other = spawn_member(&redis.url(), "gp", 6, "q", ledger.clone()).await;
    let mut observer = store(&redis.url(), "gp", 6).await;
    wait_for(&mut observer, Duration::from_secs(10), converged(2, 6)).await;
    // Pause p: its heartbeat loop stops dead (as a stopped process would), its consumer keeps its view.
    paused.task.abort();
    let q_owns_all = |view: &stream_listener::coordinator::projection::GroupProjection| {
        view.members
            .iter()
            .any(|m| m.member_id == "q" && m.owned.len() == 6)
            && converged(1, 6)(view)
    };
    wait_for(&mut observer, Duration::from_secs(10), q_owns_all).await;
    // p resumes: a fresh loop with a fresh session under the same memberId rejoins and rebalances.
    let resumed = spawn_member(&redis.url(), "gp", 6, "p", ledger.clone()).await;
    wait_for(&mut observer, Duration::from_secs(10), converged(2, 6)).await;
    let mut conn = connect(&redis.url()).await;
    let audit: Vec<(String, Vec<(String, String)>)> =
        xrange(&mut conn, &observer.keys().audit).await;
    let said = |kind: &str| {
        audit.iter().any(|(_, f)| {
            f.iter()
                .any(|(_, v)| v.contains(kind) && v.contains("\"p\""))
        })
    };
    assert!(said("MEMBER_EXPIRED"), "p expired while paused");
    assert!(said("MEMBER_REJOINED"), "p came back as a new incarnation");
    assert_eq!(resumed.status.borrow().phase, Phase::Member);
    assert_eq!(other.status.borrow().phase, Phase::Member);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_snapshot_commit_is_rejected_and_nothing_is_lost() {
    let redis = RedisServer::start();
    let mut one = store(&redis.url(), "race", 4).await;
    let mut two = store(&redis.url(), "race", 4).await;
    // One reads the group, then two commits a join behind its back.
    let (rev_before, before) = one.load().await.unwrap();
    let mut b = session("b");
    two.heartbeat(&b.heartbeat(LocalMillis(0), 1))
        .await
        .unwrap();
    // One applies a join on its stale snapshot: the compare-and-set refuses, it reloads and re-applies.
    let mut a = session("a");
    let response = one
        .heartbeat(&a.heartbeat(LocalMillis(0), 1))
        .await
        .unwrap();
    assert!(response.status.is_accepted());
    let (rev_after, coordinator) = two.load().await.unwrap();
    assert!(rev_after > rev_before);
    assert_eq!(
        coordinator.metadata().metadata_version,
        before.metadata().metadata_version + 2,
        "exactly two commits"
    );
    let members: Vec<&String> = coordinator.metadata().members.keys().collect();
    assert_eq!(members, ["a", "b"], "neither join was overwritten");
    let mut conn = connect(&redis.url()).await;
    let audit: Vec<(String, Vec<(String, String)>)> = xrange(&mut conn, &one.keys().audit).await;
    let joins = audit
        .iter()
        .filter(|(_, fields)| fields.iter().any(|(_, v)| v.contains("MEMBER_JOINED")))
        .count();
    assert_eq!(
        joins, 2,
        "one audit event per committed join, none for the refused attempt"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_metadata_and_unknown_schema_are_reported_and_left_untouched() {
    let redis = RedisServer::start();
    let mut conn = connect(&redis.url()).await;
    let mut s = store(&redis.url(), "bad", 4).await;
    let key = s.keys().meta.clone();
    for stored in ["{not json", r#"{"schemaVersion": 99, "group": "bad"}"#] {
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(stored)
            .query_async(&mut conn)
            .await
            .unwrap();
        let err = s
            .heartbeat(&session("a").heartbeat(LocalMillis(0), 1))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Metadata { .. }), "{err}");
        assert!(err.to_string().contains(&key), "error names the key: {err}");
        let after: String = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(after, stored, "never overwritten");
    }
    assert!(s
        .heartbeat(&session("a").heartbeat(LocalMillis(0), 1))
        .await
        .unwrap_err()
        .to_string()
        .contains("schema version 99"));
}

/// A key of the group holding another type fails the load (one pipeline of reads) as a whole, with
/// Redis's `WRONGTYPE` naming the problem, and nothing is written over it (no half-read snapshot is used).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metadata_key_of_the_wrong_type_fails_the_load_and_is_left_untouched() {
    let redis = RedisServer::start();
    let mut conn = connect(&redis.url()).await;
    let mut s = store(&redis.url(), "typed", 4).await;
    s.heartbeat(&session("a").heartbeat(LocalMillis(0), 1))
        .await
        .expect("a joins");
    let keys = s.keys().clone();
    for key in [&keys.meta, &keys.rev, &keys.leases, &keys.members] {
        let dump: Vec<u8> = redis::cmd("DUMP")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        let _: () = redis::pipe()
            .cmd("DEL")
            .arg(key)
            .ignore()
            .cmd("RPUSH")
            .arg(key)
            .arg("not metadata")
            .ignore()
            .query_async(&mut conn)
            .await
            .unwrap();
        let err = s.load().await.expect_err("a load over a list");
        assert!(
            matches!(&err, StoreError::Redis(e) if e.to_string().contains("WRONGTYPE")),
            "{key}: {err}"
        );
        let err = s
            .heartbeat(&session("b").heartbeat(LocalMillis(0), 1))
            .await
            .expect_err("a heartbeat over a list");
        assert!(err.to_string().contains("WRONGTYPE"), "{key}: {err}");
        let kept: Vec<String> = redis::cmd("LRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(kept, ["not metadata"], "{key} was written over");
        let _: () = redis::pipe()
            .cmd("DEL")
            .arg(key)
            .ignore()
            .cmd("RESTORE")
            .arg(key)
            .arg(0)
            .arg(dump)
            .ignore()
            .query_async(&mut conn)
            .await
            .unwrap();
        let (_, coordinator) = s.load().await.expect("loads again once repaired");
        assert!(coordinator.metadata().members.contains_key("a"), "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_members_self_fence_then_reconverge() {
    let mut redis = RedisServer::start();
    let ledger = SharedLedger::default();
    let mut members = Vec::new();
    for i in 0..3 {
        members.push(spawn_member(&redis.url(), "gr", 6, &format!("r{i}"), ledger.clone()).await);
    }
    let mut observer = store(&redis.url(), "gr", 6).await;
    wait_for(&mut observer, Duration::from_secs(10), converged(3, 6)).await;
    redis.kill();
    // Every member gives up its shards before its lease could have run out.
    let deadline = Instant::now() + Duration::from_secs(10);
    while members.iter().any(|m| !m.status.borrow().owned.is_empty()) {
        assert!(
            Instant::now() < deadline,
            "members kept their shards with Redis down"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        ledger.lock().unwrap().readers.is_empty(),
        "nothing is read without a lease"
    );
    redis.restart();
    wait_for(&mut observer, Duration::from_secs(20), converged(3, 6)).await;
    assert!(ledger.lock().unwrap().overlaps.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_state_heartbeat_is_one_script_call_and_rewrites_nothing() {
    let redis = RedisServer::start();
    let mut conn = connect(&redis.url()).await;
    let mut s = store(&redis.url(), "cheap", 8).await;
    let mut a = session("a");
    for _ in 0..3 {
        let r = s.heartbeat(&a.heartbeat(LocalMillis(0), 1)).await.unwrap();
        let _ = a.on_response(&r);
    }
    let before = command_calls(&mut conn).await;
    for _ in 0..50 {
        let r = s.heartbeat(&a.heartbeat(LocalMillis(0), 1)).await.unwrap();
        assert_eq!(r.status, HeartbeatStatus::Ok);
        let _ = a.on_response(&r);
    }
    let after = command_calls(&mut conn).await;
    let delta =
        |name: &str| after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0);
    assert_eq!(
        delta("set") + delta("hset"),
        0,
        "the snapshot was rewritten"
    );
    assert_eq!(
        delta("evalsha") + delta("eval"),
        50,
        "one script call per heartbeat"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_leaves_the_group() {
    let redis = RedisServer::start();
    let ledger = SharedLedger::default();
    let a = spawn_member(&redis.url(), "gl", 4, "a", ledger.clone()).await;
    let b = spawn_member(&redis.url(), "gl", 4, "b", ledger.clone()).await;
    let mut observer = store(&redis.url(), "gl", 4).await;
    wait_for(&mut observer, Duration::from_secs(10), converged(2, 4)).await;
    a.shutdown.send(true).unwrap();
    assert_left_and_taken_over(a, &mut observer).await;
    assert!(ledger.lock().unwrap().overlaps.is_empty());
    drop(b);
}

/// Wake-ups are a shortcut: a Redis user whose ACL forbids `PUBLISH` still commits (the script ignores
/// the refusal), and hand-offs fall back to the interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_publish_still_commits_and_hands_off() {
    let redis = RedisServer::start();
    let mut admin = connect(&redis.url()).await;
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER", "nopub", "on", ">secret", "~*", "&*", "+@all", "-publish",
        ])
        .query_async(&mut admin)
        .await
        .unwrap();
    let url = format!("redis://nopub:secret@127.0.0.1:{}", redis.port());
    let channel = GroupKeys::new("orders", "nopub").wake;
    let wakeups = Wakeups::start(RedisTarget::open(&url).unwrap(), channel);
    assert!(wakeups.subscribed(Duration::from_secs(10)).await);
    let ledger = SharedLedger::default();
    let member = async |id: &'static str| {
        let wakeup = Some(wakeups.register(id));
        spawn_member_with(
            connect(&url).await,
            "nopub",
            4,
            id,
            ledger.clone(),
            CONFIG,
            wakeup,
        )
        .await
    };
    let a = member("a").await;
    let b = member("b").await;
    let mut observer = store(&url, "nopub", 4).await;
    wait_for(&mut observer, Duration::from_secs(10), converged(2, 4)).await;
    a.shutdown.send(true).unwrap();
    let a_status = a.status.clone();
    assert_left_and_taken_over(a, &mut observer).await;
    assert!(ledger.lock().unwrap().overlaps.is_empty());
    // Not one heartbeat failed: a refused PUBLISH would fail the commit's script (after its writes).
    for status in [a_status.borrow().clone(), b.status.borrow().clone()] {
        assert!(
            !status.heartbeats.contains_key("error"),
            "{:?}",
            status.heartbeats
        );
    }
    drop(b);
}

/// A hand-off does not wait for the heartbeat interval: the commit that frees a leaving member's shards
/// grants them to the other member and wakes it (`store::wakeup`), so it reads them long before its next
/// heartbeat would have told it. On a cluster the commit publishes on the group's node and the
/// subscription listens through a seed node.
async fn a_leave_wakes_the_member_that_gets_its_shards(target: Target) {
    let redis = target.start();
    let url = redis.url().to_owned();
    let interval = Duration::from_secs(3);
    let config = GroupConfig {
        heartbeat_interval_ms: interval.as_millis() as i64,
        session_timeout_ms: 10_000,
        rebalance_timeout_ms: 10_000,
    };
    let channel = GroupKeys::new("orders", "wake").wake;
    let wakeups = Wakeups::start(RedisTarget::open(&url).unwrap(), channel);
    assert!(wakeups.subscribed(Duration::from_secs(10)).await);
    let ledger = SharedLedger::default();
    let member = async |id: &'static str| {
        spawn_member_with(
            redis.connect().await,
            "wake",
            4,
            id,
            ledger.clone(),
            config,
            Some(wakeups.register(id)),
        )
        .await
    };
    let a = member("a").await;
    let mut b = member("b").await;
    let mut observer =
        GroupStore::create(redis.connect().await, "orders", "wake", 4, config).expect("store");
    // A new group grants after two intervals.
    wait_for(&mut observer, Duration::from_secs(30), converged(2, 4)).await;
    // Just after one of b's settled heartbeats, its next one is a whole interval away.
    let heartbeats = |status: &MemberStatus| status.heartbeats.values().sum::<u64>();
    let seen = heartbeats(&b.status.borrow());
    let beat_seen = matches!(
        tokio::time::timeout(
            interval * 2,
            b.status.wait_for(|status| heartbeats(status) > seen),
        )
        .await,
        Ok(Ok(_))
    );
    assert!(beat_seen, "b heartbeats");
    let beat = Instant::now();
    a.shutdown.send(true).unwrap();
    let took_over = matches!(
        tokio::time::timeout(
            interval / 2,
            b.status.wait_for(|status| status.owned.len() == 4),
        )
        .await,
        Ok(Ok(_))
    );
    assert!(
        took_over,
        "b did not read a's shards within half an interval of its last heartbeat: {:?}",
        *b.status.borrow()
    );
    assert!(beat.elapsed() < interval);
    assert_left_and_taken_over(a, &mut observer).await;
    let ledger = ledger.lock().unwrap();
    assert!(ledger.overlaps.is_empty(), "{:?}", ledger.overlaps);
    assert!(ledger.backwards.is_empty(), "{:?}", ledger.backwards);
}

on_every_target!(a_leave_wakes_the_member_that_gets_its_shards);

/// `a`'s loop ends having left (not expired), and the one other member owns all 4 shards.
async fn assert_left_and_taken_over(a: RunningMember, observer: &mut GroupStore) {
    tokio::time::timeout(Duration::from_secs(5), a.task)
        .await
        .expect("left in time")
        .unwrap();
    assert_eq!(a.status.borrow().phase, Phase::Left);
    wait_for(observer, Duration::from_secs(10), converged(1, 4)).await;
    let (_, coordinator) = observer.load().await.unwrap();
    assert!(!coordinator.metadata().members.contains_key("a"));
    assert!(
        coordinator.metadata().tombstones.is_empty(),
        "a left, it did not expire"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_consumer_died_leaves_the_group_at_once() {
    let redis = RedisServer::start();
    let ledger = SharedLedger::default();
    let mut a = spawn_member(&redis.url(), "dead", 4, "a", ledger.clone()).await;
    let b = spawn_member(&redis.url(), "dead", 4, "b", ledger.clone()).await;
    let mut observer = store(&redis.url(), "dead", 4).await;
    wait_for(&mut observer, Duration::from_secs(10), converged(2, 4)).await;
    // The consumer task dies (as a panic would end it): it reads nothing any more.
    a.consumer.abort();
    let _ = (&mut a.consumer).await;
    ledger.lock().unwrap().readers.retain(|_, m| m != "a");
    // Its heartbeat loop leaves instead of holding the shards until the process restarts.
    assert_left_and_taken_over(a, &mut observer).await;
    let ledger = ledger.lock().unwrap();
    assert!(ledger.overlaps.is_empty(), "{:?}", ledger.overlaps);
    assert!(ledger.backwards.is_empty(), "{:?}", ledger.backwards);
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_commit_writes_nothing_and_leaves_nothing_behind_in_the_cache() {
    let redis = RedisServer::start();
    let mut conn = connect(&redis.url()).await;
    let mut s = store(&redis.url(), "broken", 4).await;
    let audit = s.keys().audit.clone();
    // Someone put a string where the audit stream belongs: the commit must refuse before writing.
    let _: () = redis::cmd("SET")
        .arg(&audit)
        .arg("not a stream")
        .query_async(&mut conn)
        .await
        .unwrap();
    let err = s
        .heartbeat(&session("a").heartbeat(LocalMillis(0), 1))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains(&audit),
        "the error names the key: {err}"
    );
    let meta: Option<String> = redis::cmd("GET")
        .arg(&s.keys().meta)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(meta, None, "nothing was written");
    // Once repaired, the next input starts from Redis, not from the refused join.
    let _: () = redis::cmd("DEL")
        .arg(&audit)
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut b = session("b");
    let r = s.heartbeat(&b.heartbeat(LocalMillis(0), 1)).await.unwrap();
    assert!(r.status.is_accepted());
    let (revision, coordinator) = s.load().await.unwrap();
    assert!(revision > 0);
    assert_eq!(coordinator.metadata().metadata_version, 1, "one commit");
    let members: Vec<&String> = coordinator.metadata().members.keys().collect();
    assert_eq!(members, ["b"]);
}

/// Loses the group's metadata while four members own its shards, by `lose`, and checks that the group
/// rebuilds itself without ever giving a shard to two members and without fencing tokens going back.
async fn lose_metadata_while_owned(group: &str, lose: impl FnOnce(&GroupStore) -> redis::Cmd) {
    let redis = RedisServer::start();
    let ledger = SharedLedger::default();
    let mut members = Vec::new();
    for i in 0..4 {
        members.push(spawn_member(&redis.url(), group, 8, &format!("m{i}"), ledger.clone()).await);
    }
    let mut observer = store(&redis.url(), group, 8).await;
    wait_for(&mut observer, Duration::from_secs(20), converged(4, 8)).await;
    let mark = ledger.lock().unwrap().grants.len();
    let mut conn = connect(&redis.url()).await;
    let _: () = lose(&observer).query_async(&mut conn).await.unwrap();
    // The members notice (unknown member ids), drop everything, rejoin, and get shards back only after
    // every member of the lost state has surely stopped reading.
    let regranted = |ledger: &Ledger| (0..8).all(|s| ledger.grants[mark..].contains(&s));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !regranted(&ledger.lock().unwrap()) {
        assert!(Instant::now() < deadline, "shards were not granted again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_for(&mut observer, Duration::from_secs(20), converged(4, 8)).await;
    let ledger = ledger.lock().unwrap();
    assert!(
        ledger.overlaps.is_empty(),
        "two owners: {:?}",
        ledger.overlaps
    );
    assert!(
        ledger.backwards.is_empty(),
        "tokens went back: {:?}",
        ledger.backwards
    );
    drop(ledger);
    for m in &members {
        assert_eq!(m.status.borrow().phase, Phase::Member);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_metadata_never_gives_a_shard_two_owners_nor_moves_tokens_back() {
    lose_metadata_while_owned("lost", |s| {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(&s.keys().meta);
        cmd
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushed_store_never_gives_a_shard_two_owners_nor_moves_tokens_back() {
    lose_metadata_while_owned("flushed", |_| redis::cmd("FLUSHALL")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_member_records_never_give_a_shard_two_owners_nor_move_tokens_back() {
    // The header and the revision survive; the records of who holds what are gone.
    lose_metadata_while_owned("records", |s| {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(&s.keys().members);
        cmd
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_deleted_member_record_never_gives_a_shard_two_owners_nor_moves_tokens_back() {
    lose_metadata_while_owned("record", |s| {
        let mut cmd = redis::cmd("HDEL");
        cmd.arg(&s.keys().members).arg("m2");
        cmd
    })
    .await;
}

/// A group stored by an earlier version (schema version 1: the whole snapshot as one document, and a stored
/// projection) keeps working: the next heartbeat, even a steady one, stores it as a header and member records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_document_snapshot_is_read_and_stored_again_as_header_and_member_records() {
    let redis = RedisServer::start();
    let mut conn = connect(&redis.url()).await;
    let mut s = store(&redis.url(), "upgraded", 4).await;
    let (mut a, mut b) = (session("a"), session("b"));
    let deadline = Instant::now() + Duration::from_secs(10);
    // Until both own shards and a whole round of heartbeats commits nothing.
    loop {
        assert!(Instant::now() < deadline, "a and b did not settle");
        let (revision, _) = s.load().await.unwrap();
        let mut ok = true;
        for m in [&mut a, &mut b] {
            let r = s.heartbeat(&m.heartbeat(LocalMillis(0), 1)).await.unwrap();
            ok &= r.status == HeartbeatStatus::Ok;
            for command in m.on_response(&r) {
                if let ShardCommand::Revoke { shard } = command {
                    m.on_revoked(shard);
                }
            }
        }
        let settled = ok && s.load().await.unwrap().0 == revision;
        if settled && !a.owned().is_empty() && !b.owned().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(HB as u64 / 5)).await;
    }
    let (_, before) = s.load().await.unwrap();
    // Rewrite it as an earlier version stored it.
    let keys = s.keys().clone();
    let _: () = redis::pipe()
        .cmd("SET")
        .arg(&keys.meta)
        .arg(before.metadata().to_json())
        .cmd("DEL")
        .arg(&keys.members)
        .cmd("SET")
        .arg(&keys.projection)
        .arg("{}")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut fresh = store(&redis.url(), "upgraded", 4).await;
    let r = fresh
        .heartbeat(&a.heartbeat(LocalMillis(0), 1))
        .await
        .unwrap();
    assert_eq!(r.status, HeartbeatStatus::Ok, "{r:?}");
    assert_eq!(a.on_response(&r), vec![], "nothing moved");
    let header: String = redis::cmd("GET")
        .arg(&keys.meta)
        .query_async(&mut conn)
        .await
        .unwrap();
    let header: serde_json::Value = serde_json::from_str(&header).unwrap();
    assert_eq!(header["schemaVersion"], 2);
    assert_eq!(header["memberCount"], 2);
    assert!(header.get("members").is_none(), "{header}");
    let mut records: Vec<String> = redis::cmd("HKEYS")
        .arg(&keys.members)
        .query_async(&mut conn)
        .await
        .unwrap();
    records.sort();
    assert_eq!(records, ["a", "b"]);
    let projection: bool = redis::cmd("EXISTS")
        .arg(&keys.projection)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!projection, "the stored projection of version 1 is gone");
    let (_, after) = s.load().await.unwrap();
    for (id, m) in &before.metadata().members {
        let now = &after.metadata().members[id];
        assert_eq!(
            (&now.assigned, now.member_epoch),
            (&m.assigned, m.member_epoch)
        );
    }
    // From now on a steady heartbeat is a renewal again.
    let before = command_calls(&mut conn).await;
    let r = fresh
        .heartbeat(&b.heartbeat(LocalMillis(0), 1))
        .await
        .unwrap();
    assert_eq!(r.status, HeartbeatStatus::Ok);
    let after = command_calls(&mut conn).await;
    let delta =
        |name: &str| after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0);
    assert_eq!(delta("hset") + delta("set"), 0, "nothing rewritten");
}

/// The write cost of the coordination issue: a join writes what changed (the joiner, the members giving it
/// shards, the header), not the group. Bytes are deterministic, so this is a test, not a benchmark. The group
/// is built with the pure core and stored as an earlier version stored it; the first commit stores it in
/// the current layout, the second is measured. `SL_WRITE_COST_GROUP=1000x10000` runs the issue's size
/// (default 256 x 4096). Before the layout change, this join wrote the whole snapshot, the projection and
/// every lease: Redis received 622 KB at 256 x 4096 and 1.77 MB at 1,000 x 10,000; now 14 KB and 8 KB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_writes_what_changed_not_the_group() {
    use stream_listener::coordinator::{Coordinator, Creation};
    let (members, shards) = std::env::var("SL_WRITE_COST_GROUP")
        .ok()
        .and_then(|size| {
            let (m, s) = size.split_once('x')?;
            Some((m.parse::<usize>().ok()?, s.parse::<u32>().ok()?))
        })
        .unwrap_or((256, 4096));
    let config = GroupConfig {
        heartbeat_interval_ms: 1_000,
        session_timeout_ms: 600_000,
        rebalance_timeout_ms: 600_000,
    };
    let redis = RedisServer::start();
    let mut conn = connect(&redis.url()).await;
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let t0 = secs * 1000 + micros / 1000 - 10_000;
    // A converged group, with the pure core: everyone joins during the new group's grant pause, so the
    // first assignment moves nothing that is held.
    let mut core = Coordinator::create("cost", shards, config, StoreMillis(t0), Creation::Fresh);
    let mut sessions: Vec<MemberSession> = (0..members)
        .map(|i| {
            member_session(
                &format!("member-{i:04}"),
                config.session_timeout_ms,
                1,
                i as u64,
            )
        })
        .collect();
    let mut now = t0;
    for round in 0..8 {
        for m in sessions.iter_mut() {
            let outcome = core.heartbeat(&m.heartbeat(LocalMillis(now), 1), StoreMillis(now));
            for command in m.on_response(&outcome.response) {
                if let ShardCommand::Revoke { shard } = command {
                    m.on_revoked(shard);
                }
            }
        }
        let view = core.projection(StoreMillis(now));
        if round > 0 && view.state == GroupState::Stable {
            break;
        }
        now += 2 * config.heartbeat_interval_ms + 1;
    }
    let view = core.projection(StoreMillis(now));
    assert_eq!(view.state, GroupState::Stable, "the seeded group converged");
    let keys = GroupKeys::new("orders", "cost");
    let mut seed = redis::pipe();
    seed.cmd("SET")
        .arg(&keys.meta)
        .arg(core.metadata().to_json());
    seed.cmd("SET").arg(&keys.rev).arg(1);
    for (id, m) in &core.metadata().members {
        seed.cmd("ZADD")
            .arg(&keys.leases)
            .arg(m.lease_deadline_ms)
            .arg(id);
    }
    let () = seed.query_async(&mut conn).await.unwrap();
    let whole = core.metadata().to_json().len();

    let mut s = GroupStore::create(
        connect(&redis.url()).await,
        "orders",
        "cost",
        shards,
        config,
    )
    .expect("store");
    let mut first = member_session("joiner-1", config.session_timeout_ms, 1, 1);
    let r = s
        .heartbeat(&first.heartbeat(LocalMillis(0), 1))
        .await
        .unwrap();
    assert!(r.status.is_accepted(), "{r:?}");

    let net_input = |info: String| -> u64 {
        stream_listener_test_support::aio::info_field(&info, "total_net_input_bytes").unwrap()
    };
    let input_before = net_input(stream_listener_test_support::aio::info(&mut conn, "stats").await);
    let mut second = member_session("joiner-2", config.session_timeout_ms, 1, 2);
    let r = s
        .heartbeat(&second.heartbeat(LocalMillis(0), 1))
        .await
        .unwrap();
    assert!(r.status.is_accepted(), "{r:?}");
    let input_after = net_input(stream_listener_test_support::aio::info(&mut conn, "stats").await);
    // Everything this test's Redis received meanwhile: the queued heartbeat, the commit, one INFO. (Not
    // `store::stats()`: it sums every store of the process, and other tests run beside this one.)
    let received = input_after - input_before;
    println!(
        "a join into {members} members x {shards} shards: {received} bytes received by Redis (the whole \
         document is {whole} bytes)"
    );
    assert!(received < 32 * 1024, "Redis received {received} bytes");
}

/// Settles one member, loses part of the snapshot by `lose`, and checks that the member's next steady
/// heartbeat is not renewed on what is left.
async fn renewal_is_refused_once(lose: impl FnOnce(&GroupKeys) -> redis::Cmd) {
    let redis = RedisServer::start();
    let mut s = store(&redis.url(), "gone", 2).await;
    let mut a = session("a");
    let start = Instant::now();
    let local = || LocalMillis(start.elapsed().as_millis() as i64);
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.owned().len() < 2 {
        assert!(Instant::now() < deadline);
        let response = s.heartbeat(&a.heartbeat(local(), 1)).await.unwrap();
        let _ = a.on_response(&response);
        tokio::time::sleep(Duration::from_millis(HB as u64 / 5)).await;
    }
    // Settled: the next heartbeat is a plain lease renewal.
    for _ in 0..2 {
        let response = s.heartbeat(&a.heartbeat(local(), 1)).await.unwrap();
        let _ = a.on_response(&response);
    }
    let mut conn = connect(&redis.url()).await;
    let _: () = lose(s.keys()).query_async(&mut conn).await.unwrap();
    // The revision and a's lease survived, but a steady heartbeat must not renew on lost metadata.
    let response = s.heartbeat(&a.heartbeat(local(), 1)).await.unwrap();
    assert_eq!(
        response.status,
        HeartbeatStatus::UnknownMemberId,
        "{response:?}"
    );
    assert_eq!(a.on_response(&response), vec![ShardCommand::Fence]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_is_refused_once_the_snapshot_is_gone() {
    renewal_is_refused_once(|keys| {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(&keys.meta);
        cmd
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_is_refused_once_the_member_record_is_gone() {
    renewal_is_refused_once(|keys| {
        let mut cmd = redis::cmd("HDEL");
        cmd.arg(&keys.members).arg("a");
        cmd
    })
    .await;
}

/// A member whose entry in the lease set was deleted (the records survived) is not left unable to renew:
/// its next heartbeat commits its lease again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_lease_entry_is_written_again_by_the_next_heartbeat() {
    let redis = RedisServer::start();
    let mut conn = connect(&redis.url()).await;
    let mut s = store(&redis.url(), "unleased", 2).await;
    let mut a = session("a");
    for _ in 0..3 {
        let r = s.heartbeat(&a.heartbeat(LocalMillis(0), 1)).await.unwrap();
        let _ = a.on_response(&r);
    }
    let _: () = redis::cmd("ZREM")
        .arg(&s.keys().leases)
        .arg("a")
        .query_async(&mut conn)
        .await
        .unwrap();
    let r = s.heartbeat(&a.heartbeat(LocalMillis(0), 1)).await.unwrap();
    assert!(r.status.is_accepted(), "{r:?}");
    let lease: Option<i64> = redis::cmd("ZSCORE")
        .arg(&s.keys().leases)
        .arg("a")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(lease.is_some(), "the lease is back");
}

/// A writer whose cache predates damage to the member records must not commit a difference on top of it:
/// the commit is refused, the reload sees the loss, and what is stored afterwards is whole again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_on_damaged_member_records_is_refused_and_the_loss_handled() {
    let redis = RedisServer::start();
    let mut conn = connect(&redis.url()).await;
    let mut s = store(&redis.url(), "damaged", 4).await;
    for id in ["a", "b"] {
        let r = s
            .heartbeat(&session(id).heartbeat(LocalMillis(0), 1))
            .await
            .unwrap();
        assert!(r.status.is_accepted());
    }
    let (_, before) = s.load().await.unwrap();
    let _: () = redis::cmd("DEL")
        .arg(&s.keys().members)
        .query_async(&mut conn)
        .await
        .unwrap();
    // The cache is current by the revision, so this join is committed from it, as a difference.
    let r = s
        .heartbeat(&session("c").heartbeat(LocalMillis(0), 1))
        .await
        .unwrap();
    assert!(r.status.is_accepted(), "{r:?}");
    let mut reader = GroupStore::open(connect(&redis.url()).await, "orders", "damaged").unwrap();
    let (_, after) = reader.load().await.expect("stored whole again");
    let members: Vec<&String> = after.metadata().members.keys().collect();
    assert_eq!(members, ["c"], "a and b were lost with their records");
    assert!(
        after.metadata().created_at_ms > before.metadata().created_at_ms,
        "recreated"
    );
    assert!(
        after.metadata().grants_paused_until_ms
            >= after.metadata().created_at_ms + CONFIG.session_timeout_ms,
        "grants paused for a session: the records' loss is a loss"
    );
}

/// The scale test of the coordination issue: 256 members (64 pods x `concurrency = 4`) with real heartbeat
/// loops joining one group at once converge: every shard granted, spread <= 1, all STABLE, no overlap.
/// It asserts convergence, not time (the benchmark measures time: `cargo bench --bench coordination`);
/// before the store serialized its writers, 256 members did not converge within 60 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_fifty_six_members_joining_at_once_converge() {
    const MEMBERS: usize = 256;
    let redis = RedisServer::start();
    let ledger = SharedLedger::default();
    let config = GroupConfig {
        heartbeat_interval_ms: 1_000,
        session_timeout_ms: 20_000,
        rebalance_timeout_ms: 30_000,
    };
    let mut members = Vec::new();
    for i in 0..MEMBERS {
        members.push(
            spawn_member_with(
                connect(&redis.url()).await,
                "scale",
                256,
                &format!("m{i}"),
                ledger.clone(),
                config,
                None,
            )
            .await,
        );
    }
    let mut observer =
        GroupStore::create(connect(&redis.url()).await, "orders", "scale", 256, config)
            .expect("store");
    let took = wait_for(
        &mut observer,
        Duration::from_secs(240),
        converged(MEMBERS, 256),
    )
    .await;
    println!("{MEMBERS} members converged in {took:?}");
    let ledger = ledger.lock().unwrap();
    assert!(ledger.overlaps.is_empty(), "{:?}", ledger.overlaps);
    assert!(ledger.backwards.is_empty(), "{:?}", ledger.backwards);
    drop(ledger);
    for m in &members {
        let _ = m.shutdown.send(true);
    }
}

/// The audit stream's events as (kind-bearing JSON, revision of the commit that wrote them).
async fn audit_events(conn: &mut ConnectionManager, store: &GroupStore) -> Vec<(String, String)> {
    let audit: Vec<(String, BTreeMap<String, String>)> = xrange(conn, &store.keys().audit).await;
    audit
        .into_iter()
        .map(|(_, fields)| (fields["event"].clone(), fields["revision"].clone()))
        .collect()
}

/// Someone else holds the group's writer lock (and never releases it by itself).
async fn hold_writer_lock(conn: &mut ConnectionManager, store: &GroupStore) {
    let _: () = redis::cmd("SET")
        .arg(&store.keys().writer)
        .arg("someone")
        .query_async(conn)
        .await
        .unwrap();
}

/// Once `queued` heartbeats wait in the inbox (bounded: 10 s), the holder goes away without a release.
async fn release_writer_lock_once_queued(
    conn: &mut ConnectionManager,
    store: &GroupStore,
    queued: i64,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while inbox_len(conn, store).await < queued {
        assert!(Instant::now() < deadline, "the heartbeats did not queue");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _: () = redis::cmd("DEL")
        .arg(&store.keys().writer)
        .query_async(conn)
        .await
        .unwrap();
}

async fn inbox_len(conn: &mut ConnectionManager, store: &GroupStore) -> i64 {
    redis::cmd("LLEN")
        .arg(&store.keys().inbox)
        .query_async(conn)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_queued_while_the_writer_is_busy_are_committed_together_in_one_batch() {
    let redis = RedisServer::start();
    let mut conn = connect(&redis.url()).await;
    let probe = store(&redis.url(), "batch", 8).await;
    // Someone holds the writer lock: every join queues in the inbox.
    hold_writer_lock(&mut conn, &probe).await;
    let monitor = Monitor::start(redis.addr()).await;
    let mut joins = Vec::new();
    for id in ["a", "b", "c", "d"] {
        let url = redis.url();
        joins.push(tokio::spawn(async move {
            // Senders wait one heartbeat interval for an answer: a long one, so none gives up here.
            let config = GroupConfig {
                heartbeat_interval_ms: 5_000,
                session_timeout_ms: 30_000,
                rebalance_timeout_ms: 30_000,
            };
            let mut s =
                GroupStore::create(connect(&url).await, "orders", "batch", 8, config).unwrap();
            let mut member = session(id);
            s.heartbeat(&member.heartbeat(LocalMillis(0), 1)).await
        }));
    }
    // The holder goes away: the first waiter to take the lock applies all four and commits once.
    release_writer_lock_once_queued(&mut conn, &probe, 4).await;
    for join in joins {
        let response = join.await.unwrap().expect("join answered");
        assert!(response.status.is_accepted(), "{response:?}");
    }
    let events = audit_events(&mut conn, &probe).await;
    let joined: Vec<&(String, String)> = events
        .iter()
        .filter(|(event, _)| event.contains("MEMBER_JOINED"))
        .collect();
    assert_eq!(joined.len(), 4, "every join committed once: {events:?}");
    assert!(
        joined.iter().all(|(_, revision)| *revision == joined[0].1),
        "one commit for the whole batch: {joined:?}"
    );
    assert_eq!(
        inbox_len(&mut conn, &probe).await,
        0,
        "the batch was taken out"
    );
    // Waiting for the turn polls the lock every half interval (at most 500 ms, less up to a quarter at
    // random), not every 50 ms: 2,000 waiting members polling at 50 ms overloaded Redis.
    let waits: Vec<f64> = monitor
        .lines()
        .iter()
        .filter_map(|line| MonitorLine::parse(line))
        .filter(|line| {
            line.args
                .first()
                .is_some_and(|c| c.eq_ignore_ascii_case("BLPOP"))
        })
        .map(|line| line.args.last().unwrap().parse().expect("a BLPOP timeout"))
        .collect();
    assert!(!waits.is_empty(), "the senders waited in Redis");
    assert!(
        waits.iter().all(|w| (0.375..=0.5).contains(w)),
        "turn waits of a 5 s interval: {waits:?}"
    );
}

/// Members whose heartbeats another process's writer answered have no cache, and only one heartbeat in
/// four reloads it while they are in flux (so that a large group's members do not all read the whole
/// snapshot after every change): they still go back to renewing their leases on their own, each with
/// one script call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_answered_by_another_writer_go_back_to_renewing_on_their_own() {
    let redis = RedisServer::start();
    let mut conn = connect(&redis.url()).await;
    let config = GroupConfig {
        heartbeat_interval_ms: 5_000,
        session_timeout_ms: 30_000,
        rebalance_timeout_ms: 30_000,
    };
    let probe = GroupStore::open(connect(&redis.url()).await, "orders", "flux").unwrap();
    // Someone holds the writer lock: every join queues, and one writer answers them all.
    hold_writer_lock(&mut conn, &probe).await;
    let ids = ["a", "b", "c", "d"];
    let mut joins = Vec::new();
    for id in ids {
        let url = redis.url();
        joins.push(tokio::spawn(async move {
            let mut store =
                GroupStore::create(connect(&url).await, "orders", "flux", 8, config).unwrap();
            let mut session = session(id);
            let response = store
                .heartbeat(&session.heartbeat(LocalMillis(0), 1))
                .await
                .expect("join answered");
            let _ = session.on_response(&response);
            (session, store)
        }));
    }
    release_writer_lock_once_queued(&mut conn, &probe, ids.len() as i64).await;
    let mut members = Vec::new();
    for join in joins {
        members.push(join.await.unwrap());
    }
    // Bounded: 64 heartbeats each, a (3/4)^64 chance per member of never drawing a reload.
    for (round, (session, store)) in members.iter_mut().enumerate() {
        let mut renewed = false;
        for tick in 0..64 {
            let before = store.stats().renewals;
            let response = store
                .heartbeat(&session.heartbeat(LocalMillis(100 + tick), 1))
                .await
                .expect("heartbeat");
            assert!(response.status.is_accepted(), "{response:?}");
            let _ = session.on_response(&response);
            if store.stats().renewals > before {
                renewed = true;
                break;
            }
        }
        assert!(renewed, "member {round} went back to renewing on its own");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_and_expired_queue_entries_are_dropped_never_applied() {
    let redis = RedisServer::start();
    let mut conn = connect(&redis.url()).await;
    let mut s = store(&redis.url(), "forged", 4).await;
    let ghost = serde_json::to_string(&session("ghost").heartbeat(LocalMillis(0), 1)).unwrap();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    for entry in [
        "garbage".to_string(),
        "1 ../meta {}".to_string(),
        format!("{} abc {{\"memberId\": 7}}", now_ms + 60_000),
        // A join whose sender stopped waiting a minute ago.
        format!("{} abc1 {ghost}", now_ms - 60_000),
    ] {
        let _: () = redis::cmd("RPUSH")
            .arg(&s.keys().inbox)
            .arg(entry)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let mut a = session("a");
    let response = s.heartbeat(&a.heartbeat(LocalMillis(0), 1)).await.unwrap();
    assert!(response.status.is_accepted());
    let (_, coordinator) = s.load().await.unwrap();
    let members: Vec<&String> = coordinator.metadata().members.keys().collect();
    assert_eq!(members, ["a"], "only the real join was applied");
    assert_eq!(
        inbox_len(&mut conn, &s).await,
        0,
        "the bad entries were trimmed"
    );
    let reply: i64 = redis::cmd("EXISTS")
        .arg(s.keys().reply("abc1"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        reply, 0,
        "nobody waits for the expired entry: no answer is written"
    );
}
