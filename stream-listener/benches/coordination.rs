//! Coordination cost: steady-state heartbeats per second through the Redis metadata store, Redis commands
//! per heartbeat, and how long a group of members joining at once takes to become STABLE, on a
//! redis-server this benchmark starts itself.
//!
//! `cargo bench -p stream-listener --bench coordination`
//! (`SL_BENCH_MEMBERS`: simulated members, default 64; `SL_BENCH_SECONDS`: length of each timed phase,
//! default 5; `SL_BENCH_ONLY_JOIN`: run only variant C of the joining phase).
//!
//! Every simulated member is a [`MemberSession`] with its own [`GroupStore`] and its own
//! `ConnectionManager`, driven by its own tokio task on a 2-worker multi-thread runtime. There is no
//! consumption layer: shard commands are applied on the spot (a `Revoke` is reported REVOKED at once, as a
//! consumer with nothing in flight would).
//!
//! 1. **Steady state**: the group (256 shards) is converged first, then every member heartbeats back to back
//!    for the timed phase; only responses with status OK are counted.
//! 2. **Redis commands per heartbeat**: `INFO commandstats` and `INFO stats` deltas over the steady phase.
//! 3. **Baselines** from the same number of tasks, each on its own connection: `PING`, `EVALSHA` of a
//!    trivial script, and the store's own `renew.lua` invoked directly (the server side of a steady
//!    heartbeat without any client-side coordinator work).
//! 4. **Joining at once**: the members join a fresh group (heartbeat interval 100 ms, session 3 s) and the
//!    time until the projection is STABLE with every member and a spread of at most one shard is measured,
//!    with the milestones on the way and the number of compare-and-set refusals. Three pacings: A as the
//!    issue specifies (at once only after a join response), B also at once after reporting REVOKED (as
//!    `MemberLoop`), C = B plus a bench-side report of REVOKED for grants taken back before the member saw
//!    them (the coordinator used to wait the whole rebalance timeout for those, then fence the member).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;
use stream_listener::coordinator::metadata::GroupConfig;
use stream_listener::coordinator::projection::{GroupProjection, GroupState};
use stream_listener::coordinator::wire::{
    HeartbeatResponse, HeartbeatStatus, RevokeState, RevokingShard, ShardId,
};
use stream_listener::member::lifecycle::ShardCommand;
use stream_listener::member::session::{MemberIdentity, MemberSession, Phase};
use stream_listener::store::GroupStore;
use stream_listener_test_support::RedisServer;

const STREAM: &str = "bench";
const SHARDS: u32 = 256;

/// The steady-state group: the interval does not matter (members heartbeat back to back), the session is
/// long enough that nobody expires while 64 tasks share two cores with Redis.
const STEADY_CONFIG: GroupConfig = GroupConfig {
    heartbeat_interval_ms: 1_000,
    session_timeout_ms: 10_000,
    rebalance_timeout_ms: 30_000,
};

/// The joining group, as the issue asks: 100 ms heartbeats, 3 s sessions.
const JOIN_CONFIG: GroupConfig = GroupConfig {
    heartbeat_interval_ms: 100,
    session_timeout_ms: 3_000,
    rebalance_timeout_ms: 10_000,
};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn connect(url: &str) -> ConnectionManager {
    let client = redis::Client::open(url).expect("url");
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_secs(5)))
        .set_connection_timeout(Some(Duration::from_secs(5)))
        .set_number_of_retries(1);
    ConnectionManager::new_with_config(client, config)
        .await
        .expect("connect")
}

async fn store(url: &str, group: &str, config: GroupConfig) -> GroupStore {
    GroupStore::new(connect(url).await, STREAM, group, SHARDS, config).expect("store")
}

fn session(id: &str, session_ms: i64, salt: u64) -> MemberSession {
    let identity = MemberIdentity {
        member_id: Arc::from(id),
        member_name: None,
        weight: 1,
        runtime_max_concurrency: 1,
    };
    MemberSession::new(identity, session_ms, std::process::id() as u64 ^ salt)
}

/// Applies a response; a revoke is reported REVOKED at once. Returns how many shards were revoked.
fn apply(session: &mut MemberSession, response: &HeartbeatResponse) -> usize {
    let mut revoked = 0;
    for command in session.on_response(response) {
        if let ShardCommand::Revoke { shard } = command {
            session.on_revoked(shard);
            revoked += 1;
        }
    }
    revoked
}

/// The same test as the integration tests: STABLE, every member live, all shards granted, spread <= 1.
fn converged(view: &GroupProjection, members: usize) -> bool {
    let live: Vec<_> = view
        .members
        .iter()
        .filter(|m| m.lease_deadline_ms > 0)
        .collect();
    let counts: Vec<usize> = live.iter().map(|m| m.assigned.len()).collect();
    view.state == GroupState::Stable
        && live.len() == members
        && counts.iter().sum::<usize>() == SHARDS as usize
        && counts.iter().max().unwrap_or(&0) - counts.iter().min().unwrap_or(&0) <= 1
}

async fn info(conn: &mut ConnectionManager, section: &str) -> String {
    redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .expect("INFO")
}

/// `calls` per command from `INFO commandstats`, plus `total_commands_processed` from `INFO stats`.
#[derive(Debug, Clone, Default)]
struct Counters {
    calls: BTreeMap<String, i64>,
    total_processed: i64,
}

impl Counters {
    async fn read(conn: &mut ConnectionManager) -> Self {
        let calls = info(conn, "commandstats")
            .await
            .lines()
            .filter_map(|line| {
                let rest = line.strip_prefix("cmdstat_")?;
                let (name, stats) = rest.split_once(':')?;
                let calls = stats.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
                Some((name.to_string(), calls.parse().ok()?))
            })
            .collect();
        let total_processed = info(conn, "stats")
            .await
            .lines()
            .find_map(|l| l.strip_prefix("total_commands_processed:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("total_commands_processed");
        Self {
            calls,
            total_processed,
        }
    }

    /// `after - self`, without the INFO calls the measurement itself made.
    fn delta(&self, after: &Counters) -> Delta {
        let mut calls = BTreeMap::new();
        for (name, &n) in &after.calls {
            let d = n - self.calls.get(name).copied().unwrap_or(0);
            if d != 0 {
                calls.insert(name.clone(), d);
            }
        }
        let infos = calls.remove("info").unwrap_or(0);
        Delta {
            calls,
            total_processed: after.total_processed - self.total_processed - infos,
        }
    }
}

#[derive(Debug)]
struct Delta {
    calls: BTreeMap<String, i64>,
    total_processed: i64,
}

impl Delta {
    fn get(&self, name: &str) -> i64 {
        self.calls.get(name).copied().unwrap_or(0)
    }

    fn sum(&self) -> i64 {
        self.calls.values().sum()
    }
}

/// CPU time (user + system) of a process so far, from `/proc/<pid>/stat`.
fn cpu_time(pid: &str, ticks_per_s: f64) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<f64>().ok())
        .sum();
    Duration::from_secs_f64(ticks / ticks_per_s)
}

fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

struct Cpu {
    redis_pid: String,
    ticks: f64,
}

impl Cpu {
    fn now(&self) -> (Duration, Duration) {
        (
            cpu_time("self", self.ticks),
            cpu_time(&self.redis_pid, self.ticks),
        )
    }
}

/// What one load task saw.
#[derive(Debug, Default)]
struct TaskStats {
    ok: u64,
    other: BTreeMap<String, u64>,
    errors: u64,
    commands: u64,
    latencies_us: Vec<u32>,
}

impl TaskStats {
    fn merge(&mut self, other: TaskStats) {
        self.ok += other.ok;
        for (k, v) in other.other {
            *self.other.entry(k).or_default() += v;
        }
        self.errors += other.errors;
        self.commands += other.commands;
        self.latencies_us.extend(other.latencies_us);
    }

    fn percentile_us(&mut self, p: f64) -> u32 {
        if self.latencies_us.is_empty() {
            return 0;
        }
        self.latencies_us.sort_unstable();
        let i = ((self.latencies_us.len() - 1) as f64 * p).round() as usize;
        self.latencies_us[i]
    }
}

/// The result of one timed phase.
struct Measured {
    stats: TaskStats,
    elapsed: Duration,
    delta: Delta,
    client_cpu: Duration,
    redis_cpu: Duration,
}

impl Measured {
    fn per_second(&self) -> f64 {
        self.stats.ok as f64 / self.elapsed.as_secs_f64()
    }

    fn report(&mut self, label: &str) {
        let rate = self.per_second();
        let ok = self.stats.ok.max(1) as f64;
        let p50 = self.stats.percentile_us(0.5);
        let p99 = self.stats.percentile_us(0.99);
        println!(
            "  {label:<34} {rate:>9.0} /s  ({} ok in {:.2} s; latency p50 {p50} us, p99 {p99} us; \
             CPU per op: client {:.1} us, redis {:.1} us)",
            self.stats.ok,
            self.elapsed.as_secs_f64(),
            self.client_cpu.as_secs_f64() * 1e6 / ok,
            self.redis_cpu.as_secs_f64() * 1e6 / ok,
        );
        if self.stats.errors > 0 || !self.stats.other.is_empty() || self.stats.commands > 0 {
            println!(
                "  {:<34} not counted: {} errors, other statuses {:?}, shard commands {}",
                "", self.stats.errors, self.stats.other, self.stats.commands
            );
        }
    }
}

/// Runs `tasks` (already spawned and waiting for `start`) until `deadline`, measuring Redis and CPU.
async fn measure(
    control: &mut ConnectionManager,
    cpu: &Cpu,
    start: tokio::time::Instant,
    tasks: Vec<tokio::task::JoinHandle<TaskStats>>,
) -> Measured {
    let before = Counters::read(control).await;
    let (client0, redis0) = cpu.now();
    tokio::time::sleep_until(start).await;
    let mut stats = TaskStats::default();
    for task in tasks {
        stats.merge(task.await.expect("task"));
    }
    let elapsed = start.elapsed();
    let (client1, redis1) = cpu.now();
    let after = Counters::read(control).await;
    Measured {
        stats,
        elapsed,
        delta: before.delta(&after),
        client_cpu: client1 - client0,
        redis_cpu: redis1 - redis0,
    }
}

/// Drives members one after the other (no contention) until the group is converged and a whole round of
/// heartbeats is OK without a commit. Returns the rounds it took.
async fn converge_sequentially(
    members: &mut [(MemberSession, GroupStore)],
    observer: &mut GroupStore,
) -> usize {
    let start = Instant::now();
    let local = || start.elapsed().as_millis() as i64;
    for round in 1..=200 {
        let (rev_before, _) = observer.load().await.expect("load");
        let mut all_ok = true;
        for (session, store) in members.iter_mut() {
            let response = store
                .heartbeat(&session.heartbeat(local(), 1))
                .await
                .expect("heartbeat");
            all_ok &= response.status == HeartbeatStatus::Ok;
            apply(session, &response);
        }
        let (rev_after, coordinator) = observer.load().await.expect("load");
        if all_ok && rev_after == rev_before && converged(&coordinator.projection(0), members.len())
        {
            return round;
        }
    }
    panic!("the steady-state group did not converge in 200 rounds");
}

#[derive(Debug, Clone, Copy)]
enum RawOp {
    Ping,
    TrivialScript,
    Renew,
}

async fn run_raw(
    url: &str,
    control: &mut ConnectionManager,
    cpu: &Cpu,
    members: usize,
    seconds: u64,
    op: RawOp,
) -> Measured {
    // The store's renew script, on keys of its own group where every member holds a far lease.
    let rev_key = "sl:{bench/raw}:rev";
    let leases_key = "sl:{bench/raw}:leases";
    let _: () = redis::cmd("SET")
        .arg(rev_key)
        .arg(7)
        .query_async(control)
        .await
        .expect("SET");
    for i in 0..members {
        let _: () = redis::cmd("ZADD")
            .arg(leases_key)
            .arg(i64::MAX / 4)
            .arg(format!("m{i}"))
            .query_async(control)
            .await
            .expect("ZADD");
    }
    let mut conns = Vec::new();
    for _ in 0..members {
        conns.push(connect(url).await);
    }
    let start = tokio::time::Instant::now() + Duration::from_millis(100);
    let deadline = start + Duration::from_secs(seconds);
    let tasks = conns
        .into_iter()
        .enumerate()
        .map(|(i, mut conn)| {
            tokio::spawn(async move {
                let trivial = Script::new("return 1");
                let renew = Script::new(include_str!("../src/store/renew.lua"));
                let member = format!("m{i}");
                let mut stats = TaskStats::default();
                tokio::time::sleep_until(start).await;
                while tokio::time::Instant::now() < deadline {
                    let t = Instant::now();
                    let ok = match op {
                        RawOp::Ping => redis::cmd("PING")
                            .query_async::<String>(&mut conn)
                            .await
                            .is_ok(),
                        RawOp::TrivialScript => {
                            trivial.invoke_async::<_, i64>(&mut conn).await.is_ok()
                        }
                        RawOp::Renew => renew
                            .key(rev_key)
                            .key(leases_key)
                            .arg(7)
                            .arg(&member)
                            .arg(10_000)
                            .arg(-1)
                            .invoke_async::<Vec<i64>>(&mut conn)
                            .await
                            .is_ok_and(|r| r.first() == Some(&1)),
                    };
                    stats.latencies_us.push(t.elapsed().as_micros() as u32);
                    if ok {
                        stats.ok += 1;
                    } else {
                        stats.errors += 1;
                    }
                }
                stats
            })
        })
        .collect();
    measure(control, cpu, start, tasks).await
}

async fn run_steady(
    url: &str,
    control: &mut ConnectionManager,
    cpu: &Cpu,
    members: usize,
    seconds: u64,
) -> (Measured, usize) {
    let mut group = Vec::new();
    for i in 0..members {
        group.push((
            session(&format!("m{i}"), STEADY_CONFIG.session_timeout_ms, i as u64),
            store(url, "steady", STEADY_CONFIG).await,
        ));
    }
    let mut observer = store(url, "steady", STEADY_CONFIG).await;
    let rounds = converge_sequentially(&mut group, &mut observer).await;
    let (rev_before, _) = observer.load().await.expect("load");

    let start = tokio::time::Instant::now() + Duration::from_millis(100);
    let deadline = start + Duration::from_secs(seconds);
    let local_zero = Instant::now();
    let tasks = group
        .into_iter()
        .map(|(mut session, mut store)| {
            tokio::spawn(async move {
                let mut stats = TaskStats::default();
                tokio::time::sleep_until(start).await;
                while tokio::time::Instant::now() < deadline {
                    let t = Instant::now();
                    let request = session.heartbeat(local_zero.elapsed().as_millis() as i64, 1);
                    match store.heartbeat(&request).await {
                        Ok(response) => {
                            stats.latencies_us.push(t.elapsed().as_micros() as u32);
                            if response.status == HeartbeatStatus::Ok {
                                stats.ok += 1;
                            } else {
                                *stats
                                    .other
                                    .entry(format!("{:?}", response.status))
                                    .or_default() += 1;
                            }
                            stats.commands += session.on_response(&response).len() as u64;
                        }
                        Err(_) => stats.errors += 1,
                    }
                }
                stats
            })
        })
        .collect();
    let measured = measure(control, cpu, start, tasks).await;
    let (rev_after, coordinator) = observer.load().await.expect("load");
    assert_eq!(
        rev_after, rev_before,
        "a steady-state heartbeat committed metadata"
    );
    assert!(
        converged(&coordinator.projection(0), members),
        "the group is no longer converged after the steady phase"
    );
    (measured, rounds)
}

/// Milestones of the joining phase, in ms since the members started.
#[derive(Debug, Default)]
struct Milestones {
    all_joined: Option<u128>,
    all_placed: Option<u128>,
    stable: Option<u128>,
    /// The committing projection's store time minus the start in store time.
    stable_store_ms: Option<i64>,
    polls: u64,
}

/// What one joining member did until it was stopped.
#[derive(Debug, Default, Clone)]
struct JoinerStats {
    heartbeats: u64,
    errors: u64,
    statuses: BTreeMap<String, u64>,
    joined_at_ms: Option<u128>,
    revokes: u64,
    /// Shards reported REVOKED by the workaround (revocations of grants the member never saw).
    unseen_revokes: u64,
    /// Snapshot loads the workaround made.
    extra_loads: u64,
    /// Local times of the heartbeats that were accepted, to see how many a member needed.
    last_change_ms: u128,
    accepted_before_last_change: u64,
}

/// How the joining members pace their heartbeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pacing {
    /// As the issue specifies: at once only after a join response, else one interval.
    Specified,
    /// Also at once after reporting REVOKED, as `MemberLoop` does.
    LikeMemberLoop,
    /// `LikeMemberLoop`, plus a bench-side workaround for revocations of grants the member never saw: when
    /// a response says REVOKE_PENDING but the member has nothing of its own to revoke, it reads the
    /// coordinator's view and reports those shards REVOKED (true: it never read them).
    WithUnseenRevokeWorkaround,
}

async fn run_join(
    url: &str,
    control: &mut ConnectionManager,
    members: usize,
    group: &str,
    pacing: Pacing,
) {
    let immediate_after_revoke = pacing != Pacing::Specified;
    let workaround = pacing == Pacing::WithUnseenRevokeWorkaround;
    let interval = JOIN_CONFIG.heartbeat_interval_ms as u64;
    let mut stores = Vec::new();
    for _ in 0..members {
        stores.push(store(url, group, JOIN_CONFIG).await);
    }
    let mut observer = store(url, group, JOIN_CONFIG).await;
    let stop = Arc::new(AtomicBool::new(false));
    // The start in Redis time, for the store-clock elapsed time of the converging commit.
    let t: Vec<i64> = redis::cmd("TIME")
        .query_async::<Vec<String>>(control)
        .await
        .expect("TIME")
        .iter()
        .map(|s| s.parse().expect("number"))
        .collect();
    let lead = Duration::from_millis(100);
    let start = tokio::time::Instant::now() + lead;
    let start_store_ms = t[0] * 1_000 + t[1] / 1_000 + lead.as_millis() as i64;
    let before = Counters::read(control).await;

    let tasks: Vec<_> = stores
        .into_iter()
        .enumerate()
        .map(|(i, mut store)| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut session =
                    session(&format!("m{i}"), JOIN_CONFIG.session_timeout_ms, i as u64);
                let mut stats = JoinerStats::default();
                let mut failures = 0u32;
                let mut unseen_revokes: Vec<u32> = Vec::new();
                tokio::time::sleep_until(start).await;
                let local = || start.elapsed().as_millis();
                while !stop.load(Ordering::Relaxed) {
                    let was_joining = session.phase() == Phase::Joining;
                    let mut request = session.heartbeat(local() as i64, 1);
                    if session.phase() == Phase::Member {
                        for &shard in &unseen_revokes {
                            request.revoking_shards.push(RevokingShard {
                                shard: ShardId::new(shard),
                                state: RevokeState::Revoked,
                                in_flight: 0,
                                acked_at: None,
                            });
                        }
                    }
                    unseen_revokes.clear();
                    stats.heartbeats += 1;
                    let wait = match store.heartbeat(&request).await {
                        Ok(response) => {
                            failures = 0;
                            *stats
                                .statuses
                                .entry(format!("{:?}", response.status))
                                .or_default() += 1;
                            let owned_before = session.owned().clone();
                            let revoked = apply(&mut session, &response);
                            stats.revokes += revoked as u64;
                            if workaround
                                && response.status == HeartbeatStatus::RevokePending
                                && revoked == 0
                                && session.draining().next().is_none()
                            {
                                stats.extra_loads += 1;
                                if let Ok((_, coordinator)) = store.load().await {
                                    let me = format!("m{i}");
                                    let view = coordinator.projection(0);
                                    if let Some(m) = view.members.iter().find(|m| m.member_id == me)
                                    {
                                        unseen_revokes = m
                                            .revoking
                                            .iter()
                                            .copied()
                                            .filter(|s| !session.owned().contains(s))
                                            .collect();
                                        stats.unseen_revokes += unseen_revokes.len() as u64;
                                    }
                                }
                            }
                            if *session.owned() != owned_before || revoked > 0 {
                                stats.last_change_ms = local();
                                stats.accepted_before_last_change = stats.heartbeats;
                            }
                            let joined = was_joining && session.phase() == Phase::Member;
                            if joined && stats.joined_at_ms.is_none() {
                                stats.joined_at_ms = Some(local());
                            }
                            if session.phase() == Phase::Joining
                                || joined
                                || (immediate_after_revoke
                                    && (revoked > 0 || !unseen_revokes.is_empty()))
                            {
                                Duration::ZERO
                            } else {
                                Duration::from_millis(session.heartbeat_interval_ms() as u64)
                            }
                        }
                        Err(_) => {
                            // As the member loop: back off from 50 ms, capped at the interval.
                            stats.errors += 1;
                            failures += 1;
                            Duration::from_millis(50u64 << failures.min(10))
                                .min(Duration::from_millis(interval))
                        }
                    };
                    if !wait.is_zero() {
                        tokio::time::sleep(wait).await;
                    }
                }
                stats
            })
        })
        .collect();

    let mut milestones = Milestones::default();
    let give_up = start + Duration::from_secs(30);
    tokio::time::sleep_until(start).await;
    let mut last_view = None;
    while tokio::time::Instant::now() < give_up {
        milestones.polls += 1;
        if let Ok(Some(view)) = observer.projection().await {
            let at = start.elapsed().as_millis();
            let live = view
                .members
                .iter()
                .filter(|m| m.lease_deadline_ms > 0)
                .count();
            if live == members && milestones.all_joined.is_none() {
                milestones.all_joined = Some(at);
            }
            if live == members
                && view.state != GroupState::Assigning
                && milestones.all_placed.is_none()
            {
                milestones.all_placed = Some(at);
            }
            if converged(&view, members) {
                milestones.stable = Some(at);
                milestones.stable_store_ms = Some(view.at_ms - start_store_ms);
                last_view = Some(view);
                break;
            }
            last_view = Some(view);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut joiners = Vec::new();
    for task in tasks {
        joiners.push(task.await.expect("task"));
    }
    let after = Counters::read(control).await;
    let delta = before.delta(&after);
    let (revision, _) = observer.load().await.expect("load");

    let label = match pacing {
        Pacing::Specified => "A: as specified (heartbeat at once only after a join response)",
        Pacing::LikeMemberLoop => {
            "B: also heartbeat at once after reporting REVOKED (as MemberLoop does)"
        }
        Pacing::WithUnseenRevokeWorkaround => {
            "C: B + bench-side workaround reporting REVOKED for revoked grants the member never saw"
        }
    };
    println!("  {label}");
    let Some(stable) = milestones.stable else {
        println!(
            "    NOT converged within 30 s; last view: state {:?}, {} members",
            last_view.as_ref().map(|v| v.state),
            last_view.as_ref().map_or(0, |v| v.members.len())
        );
        if let Some(view) = &last_view {
            for m in view
                .members
                .iter()
                .filter(|m| !m.revoking.is_empty() || !m.pending.is_empty())
                .take(8)
            {
                println!(
                    "      {} {:?} epoch {}: assigned {} owned {} pending {:?} revoking {:?}",
                    m.member_id,
                    m.state,
                    m.member_epoch,
                    m.assigned.len(),
                    m.owned.len(),
                    m.pending,
                    m.revoking
                );
            }
        }
        audit_summary(control, observer.keys().audit.clone(), start_store_ms).await;
        return;
    };
    let intervals = stable as f64 / interval as f64;
    println!(
        "    STABLE with {members} members, spread <= 1: {stable} ms = {intervals:.1} heartbeat intervals \
         (goal <= 3: {}); by the committing projection's store clock {} ms",
        if intervals <= 3.0 { "met" } else { "NOT met" },
        milestones.stable_store_ms.unwrap_or(-1),
    );
    println!(
        "    milestones: all {members} in the projection at {} ms; no shard waiting for a revoke at {} ms; \
         STABLE at {stable} ms",
        milestones.all_joined.map_or("-".into(), |t| t.to_string()),
        milestones.all_placed.map_or("-".into(), |t| t.to_string()),
    );
    let mut joined: Vec<u128> = joiners.iter().filter_map(|j| j.joined_at_ms).collect();
    joined.sort_unstable();
    let mut last_change: Vec<u128> = joiners.iter().map(|j| j.last_change_ms).collect();
    last_change.sort_unstable();
    let mut needed: Vec<u64> = joiners
        .iter()
        .map(|j| j.accepted_before_last_change)
        .collect();
    needed.sort_unstable();
    let pct = |v: &[u128], p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    println!(
        "    join response received: first {} ms, median {} ms, last {} ms",
        pct(&joined, 0.0),
        pct(&joined, 0.5),
        pct(&joined, 1.0)
    );
    println!(
        "    last ownership change per member: median {} ms, last {} ms; heartbeats a member sent up to it: \
         min {}, median {}, max {}",
        pct(&last_change, 0.5),
        pct(&last_change, 1.0),
        needed[0],
        needed[needed.len() / 2],
        needed[needed.len() - 1],
    );
    let mut statuses: BTreeMap<String, u64> = BTreeMap::new();
    for j in &joiners {
        for (k, v) in &j.statuses {
            *statuses.entry(k.clone()).or_default() += v;
        }
    }
    let heartbeats: u64 = joiners.iter().map(|j| j.heartbeats).sum();
    let errors: u64 = joiners.iter().map(|j| j.errors).sum();
    let revokes: u64 = joiners.iter().map(|j| j.revokes).sum();
    let unseen: u64 = joiners.iter().map(|j| j.unseen_revokes).sum();
    let extra_loads: u64 = joiners.iter().map(|j| j.extra_loads).sum();
    println!(
        "    heartbeats sent {heartbeats} (until the members were stopped, a few ms after STABLE was seen), \
         store errors {errors}, statuses {statuses:?}, shards revoked {revokes}, unseen grants reported \
         REVOKED by the workaround {unseen}"
    );
    audit_summary(control, observer.keys().audit.clone(), start_store_ms).await;
    // Every script reads TIME once; load.lua reads GET twice, renew.lua and commit.lua once each. So
    // loads = GET - TIME - observer's GETs of the projection; each refused renew/commit forces a reload, and
    // each member's very first heartbeat loads too.
    let scripts = delta.get("time");
    let loads = delta.get("get") - scripts - milestones.polls as i64 - extra_loads as i64;
    let attempts = scripts - loads;
    let commits = delta.get("incr");
    println!(
        "    store: {commits} commits (revision now {revision}), {attempts} renew/commit attempts, {loads} \
         snapshot loads (not counting {extra_loads} by the workaround) => about {} compare-and-set refusals \
         (loads - {members} first loads - 1 final check)",
        loads - members as i64 - 1
    );
}

/// Audit events by type, and every fence or expiry with its reason, relative to the start (store clock).
async fn audit_summary(control: &mut ConnectionManager, key: String, start_store_ms: i64) {
    let audit: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(&key)
        .arg("-")
        .arg("+")
        .query_async(control)
        .await
        .expect("XRANGE");
    let mut kinds: BTreeMap<String, u64> = BTreeMap::new();
    let mut notable = Vec::new();
    for (_, fields) in &audit {
        let field = |name: &str| {
            fields
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let Some(event) =
            field("event").and_then(|e| serde_json::from_str::<serde_json::Value>(e).ok())
        else {
            continue;
        };
        let kind = event["type"].as_str().unwrap_or("?").to_string();
        let at = field("at").and_then(|a| a.parse::<i64>().ok()).unwrap_or(0) - start_store_ms;
        if matches!(
            kind.as_str(),
            "MEMBER_FENCED" | "MEMBER_EXPIRED" | "HOLDS_RELEASED"
        ) {
            notable.push(format!(
                "{at} ms {kind} {} {}",
                event["memberId"].as_str().unwrap_or("?"),
                event["reason"].as_str().unwrap_or("")
            ));
        }
        *kinds.entry(kind).or_default() += 1;
    }
    println!("    audit events: {kinds:?}");
    // The story of the first fenced member, as the audit tells it.
    let fenced = audit.iter().find_map(|(_, fields)| {
        let event: serde_json::Value =
            serde_json::from_str(&fields.iter().find(|(k, _)| k == "event")?.1).ok()?;
        (event["type"] == "MEMBER_FENCED")
            .then(|| event["memberId"].as_str().unwrap_or("?").to_string())
    });
    if let Some(member) = fenced {
        println!("    audit trail of {member} (the first member fenced):");
        for (_, fields) in &audit {
            let field = |name: &str| {
                fields
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.as_str())
            };
            let Some(event) = field("event") else {
                continue;
            };
            if event.contains(&format!("\"{member}\"")) {
                let at =
                    field("at").and_then(|a| a.parse::<i64>().ok()).unwrap_or(0) - start_store_ms;
                let rev = field("revision").unwrap_or("?");
                println!("      {at} ms rev {rev}: {event}");
            }
        }
    }
    for line in notable.iter().take(12) {
        println!("      {line}");
    }
    if notable.len() > 12 {
        println!("      ... {} more", notable.len() - 12);
    }
}

fn main() {
    let members = env_or("SL_BENCH_MEMBERS", 64) as usize;
    let seconds = env_or("SL_BENCH_SECONDS", 5);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let redis = RedisServer::start();
    let (major, minor, patch) = redis.version();
    let cpu = Cpu {
        redis_pid: redis.pid().expect("running").to_string(),
        ticks: clock_ticks(),
    };
    println!(
        "coordination bench: {members} members, {SHARDS} shards, {seconds} s per timed phase, redis-server \
         {major}.{minor}.{patch} on port {}, tokio multi-thread runtime with 2 workers, {} CPUs",
        redis.port(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    runtime.block_on(async {
        let url = redis.url();
        let mut control = connect(&url).await;
        if std::env::var("SL_BENCH_ONLY_JOIN").is_ok() {
            run_join(&url, &mut control, members, "join-c", Pacing::WithUnseenRevokeWorkaround).await;
            return;
        }

        println!("\n1. steady-state heartbeats ({members} converged members, back to back, one task + store + connection each)");
        let (mut steady, rounds) = run_steady(&url, &mut control, &cpu, members, seconds).await;
        println!("  (converged by {rounds} sequential rounds of heartbeats before the timed phase)");
        steady.report("GroupStore::heartbeat, status OK");
        println!(
            "  goal >= 20,000 hb/s: {}",
            if steady.per_second() >= 20_000.0 { "met" } else { "NOT met" }
        );

        println!("\n2. Redis commands per steady-state heartbeat (INFO deltas over the timed phase / OK heartbeats)");
        let hb = steady.stats.ok.max(1) as f64;
        let d = &steady.delta;
        println!(
            "  evalsha {:.3}, eval {:.3}, set {:.3}, incr {:.3}",
            d.get("evalsha") as f64 / hb,
            d.get("eval") as f64 / hb,
            d.get("set") as f64 / hb,
            d.get("incr") as f64 / hb
        );
        let inner: i64 = d.sum() - d.get("evalsha") - d.get("eval");
        println!(
            "  commandstats calls summed over all commands: {:.3} per heartbeat ({:.3} client commands + {:.3} \
             commands run inside scripts)",
            d.sum() as f64 / hb,
            (d.get("evalsha") + d.get("eval")) as f64 / hb,
            inner as f64 / hb
        );
        println!("  commandstats breakdown per heartbeat: {}", d.calls.iter().map(|(k, v)| format!("{k} {:.3}", *v as f64 / hb)).collect::<Vec<_>>().join(", "));
        println!(
            "  INFO stats total_commands_processed: {:.3} per heartbeat",
            d.total_processed as f64 / hb
        );

        println!("\n3. baselines: the same {members} tasks, one connection each, back to back");
        let mut ping = run_raw(&url, &mut control, &cpu, members, seconds, RawOp::Ping).await;
        ping.report("PING");
        let mut trivial =
            run_raw(&url, &mut control, &cpu, members, seconds, RawOp::TrivialScript).await;
        trivial.report("EVALSHA 'return 1'");
        let mut renew = run_raw(&url, &mut control, &cpu, members, seconds, RawOp::Renew).await;
        renew.report("EVALSHA renew.lua (raw)");
        println!(
            "  GroupStore heartbeat rate = {:.0}% of PING, {:.0}% of trivial EVALSHA, {:.0}% of raw renew.lua",
            100.0 * steady.per_second() / ping.per_second(),
            100.0 * steady.per_second() / trivial.per_second(),
            100.0 * steady.per_second() / renew.per_second()
        );

        println!(
            "\n4. {members} members joining a fresh group at once ({SHARDS} shards, heartbeat {} ms, session {} ms, \
             rebalance timeout {} ms)",
            JOIN_CONFIG.heartbeat_interval_ms,
            JOIN_CONFIG.session_timeout_ms,
            JOIN_CONFIG.rebalance_timeout_ms
        );
        run_join(&url, &mut control, members, "join-a", Pacing::Specified).await;
        run_join(&url, &mut control, members, "join-b", Pacing::LikeMemberLoop).await;
        run_join(&url, &mut control, members, "join-c", Pacing::WithUnseenRevokeWorkaround).await;
    });
}
