//! Coordination cost: steady-state heartbeats per second through the Redis metadata store, Redis commands
//! per heartbeat, and how long a group of members joining at once takes to become STABLE, on a
//! redis-server this benchmark starts itself.
//!
//! `cargo bench -p stream-listener --bench coordination`
//! (`SL_BENCH_MEMBERS`: simulated members, default 64; `SL_BENCH_SECONDS`: length of each timed phase,
//! default 5; `SL_BENCH_ONLY_JOIN`: run only the joining phase; `SL_BENCH_SETTLED_WINDOWS`: windows of 5
//! intervals measured after the join converged, default 2; `SL_BENCH_DEFAULT_TIMING_ONLY`: join with
//! 1 s heartbeats only).
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
//! 4. **Joining at once**: the members, each a real `MemberLoop` with a consumption layer that drains at
//!    once and a wake-up subscription shared by four (as a process's members share one), join a fresh group; measured: the time until the projection is STABLE with every member, every
//!    shard granted and a spread of at most one shard, with the default timing (1 s heartbeats) and with
//!    100 ms heartbeats.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use redis::Script;
use stream_listener::clock::{LocalMillis, StoreMillis};
use stream_listener::coordinator::metadata::GroupConfig;
use stream_listener::coordinator::projection::{GroupProjection, GroupState};
use stream_listener::coordinator::wire::{HeartbeatResponse, HeartbeatStatus};
use stream_listener::member::heartbeat::{MemberLoop, MemberStatus};
use stream_listener::member::lifecycle::{ShardCommand, ShardReport};
use stream_listener::member::session::{MemberIdentity, MemberSession};
use stream_listener::store::wakeup::Wakeups;
use stream_listener::store::{GroupKeys, GroupStore};
use stream_listener::RedisTarget;
use stream_listener_test_support::aio::{command_calls, connect_with_timeouts, info, info_field};
use stream_listener_test_support::{env_u64, RedisServer};
use tokio::sync::{mpsc, watch};

const STREAM: &str = "bench";
const SHARDS: u32 = 256;

/// The steady-state group: the interval does not matter (members heartbeat back to back), the session is
/// long enough that nobody expires while 64 tasks share two cores with Redis.
const STEADY_CONFIG: GroupConfig = GroupConfig {
    heartbeat_interval_ms: 1_000,
    session_timeout_ms: 10_000,
    rebalance_timeout_ms: 30_000,
};

/// A joining group with a ten times shorter heartbeat than the default, to show the protocol's cost.
const JOIN_CONFIG: GroupConfig = GroupConfig {
    heartbeat_interval_ms: 100,
    session_timeout_ms: 3_000,
    rebalance_timeout_ms: 10_000,
};

async fn connect(url: &str) -> ConnectionManager {
    connect_with_timeouts(url, Duration::from_secs(5), Some(1)).await
}

async fn store(url: &str, group: &str, config: GroupConfig) -> GroupStore {
    GroupStore::create(connect(url).await, STREAM, group, SHARDS, config).expect("store")
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

/// `calls` per command from `INFO commandstats`, plus `total_commands_processed` from `INFO stats`.
#[derive(Debug, Clone, Default)]
struct Counters {
    calls: BTreeMap<String, i64>,
    total_processed: i64,
}

impl Counters {
    async fn read(conn: &mut ConnectionManager) -> Self {
        let calls = command_calls(conn)
            .await
            .into_iter()
            .map(|(name, calls)| (name, calls as i64))
            .collect();
        let total_processed = info_field(&info(conn, "stats").await, "total_commands_processed")
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
    let local = || LocalMillis(start.elapsed().as_millis() as i64);
    // Bounded by time too: a new group pauses its grants for two heartbeat intervals, which a few quick
    // rounds do not cover.
    for round in 1..=2_000 {
        if round > 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the steady-state group did not converge in 60 s"
        );
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
        if all_ok
            && rev_after == rev_before
            && converged(&coordinator.projection(StoreMillis(0)), members.len())
        {
            return round;
        }
    }
    panic!("the steady-state group did not converge in 2,000 rounds");
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
    let meta_key = "sl:{bench/raw}:meta";
    let members_key = "sl:{bench/raw}:members";
    for (key, value) in [(rev_key, "7"), (meta_key, "{}")] {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg(value)
            .query_async(control)
            .await
            .expect("SET");
    }
    for i in 0..members {
        let _: () = redis::cmd("ZADD")
            .arg(leases_key)
            .arg(i64::MAX / 4)
            .arg(format!("m{i}"))
            .query_async(control)
            .await
            .expect("ZADD");
        let _: () = redis::cmd("HSET")
            .arg(members_key)
            .arg(format!("m{i}"))
            .arg("{}")
            .query_async(control)
            .await
            .expect("HSET");
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
                            .key(meta_key)
                            .key(members_key)
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
                    let request =
                        session.heartbeat(LocalMillis(local_zero.elapsed().as_millis() as i64), 1);
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
        converged(&coordinator.projection(StoreMillis(0)), members),
        "the group is no longer converged after the steady phase"
    );
    (measured, rounds)
}

/// Members joining a fresh group at once, each a real [`MemberLoop`] (production pacing) with a
/// consumption layer that drains at once. Returns the time until the group is converged.
async fn run_join(url: &str, members: usize, group: &str, config: GroupConfig) -> Option<Duration> {
    let mut observer = store(url, group, config).await;
    let mut stops = Vec::new();
    let mut tasks = Vec::new();
    // Connections first, so every member starts at once and none waits for a connection behind the others.
    let mut stores = Vec::with_capacity(members);
    for _ in 0..members {
        stores.push(store(url, group, config).await);
    }
    // One wake-up subscription per four members, as a process with `concurrency = 4` has.
    let channel = GroupKeys::new(STREAM, group).wake;
    let target = RedisTarget::open(url).expect("url");
    let subscriptions: Vec<Wakeups> = (0..members.div_ceil(4))
        .map(|_| Wakeups::start(target.clone(), channel.clone()))
        .collect();
    for wakeups in &subscriptions {
        wakeups.subscribed(Duration::from_secs(1)).await;
    }
    let mut control = connect(url).await;
    let redis_before = info(&mut control, "commandstats").await;
    let stats_before = stream_listener::store::stats();
    let start = Instant::now();
    for (i, member_store) in stores.into_iter().enumerate() {
        let (commands_tx, mut commands_rx) = mpsc::unbounded_channel();
        let (reports_tx, reports_rx) = mpsc::unbounded_channel();
        let (stop, stop_rx) = watch::channel(false);
        let (status_tx, _status) = watch::channel(MemberStatus::default());
        tokio::spawn(async move {
            while let Some(command) = commands_rx.recv().await {
                if let ShardCommand::Revoke { shard } = command {
                    let _ = reports_tx.send(ShardReport::Revoked { shard });
                }
            }
        });
        let id = format!("j{i}");
        let wakeup = subscriptions[i / 4].register(&id);
        let member = MemberLoop::new(
            session(&id, config.session_timeout_ms, i as u64),
            member_store,
            stream_listener::member::lifecycle::OwnershipDeadline::new(),
            commands_tx,
            reports_rx,
            stop_rx,
        )
        .with_status(status_tx)
        .with_wakeup(wakeup);
        stops.push(stop);
        tasks.push(tokio::spawn(member.run()));
    }
    let deadline = start + Duration::from_secs(90);
    let mut result = None;
    while Instant::now() < deadline {
        if let Ok((_, coordinator)) = observer.load().await {
            if converged(&coordinator.projection(StoreMillis(0)), members) {
                result = Some(start.elapsed());
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = stream_listener::store::stats();
    let redis_after = info(&mut control, "commandstats").await;
    let n = members as f64;
    let commits = (after.commits - stats_before.commits) as f64;
    println!(
        "  store work until then: {commits:.0} commits ({:.2} per member), {} refused commits ({:.3} per commit), \
         {:.2} snapshot loads per member, {:.1} KB loaded and {:.1} KB committed per member, {:.2} lock waits per commit, \
         {} heartbeats queued for the writer, {} applied in batches by another member's store ({:.1} per commit)",
        commits / n,
        after.conflicts - stats_before.conflicts,
        (after.conflicts - stats_before.conflicts) as f64 / commits.max(1.0),
        (after.loads - stats_before.loads) as f64 / n,
        (after.load_bytes - stats_before.load_bytes) as f64 / n / 1024.0,
        (after.commit_bytes - stats_before.commit_bytes) as f64 / n / 1024.0,
        (after.lock_waits - stats_before.lock_waits) as f64 / commits.max(1.0),
        after.queued - stats_before.queued,
        after.batched - stats_before.batched,
        (after.batched - stats_before.batched) as f64 / commits.max(1.0),
    );
    println!(
        "  Redis until then, per member (calls, server ms): {}",
        busiest_commands(&redis_before, &redis_after, n)
    );
    if result.is_some() {
        // What the converged group costs once it settled: the members' store work per window of 5
        // intervals after convergence (`SL_BENCH_SETTLED_WINDOWS`, default 2), with what tells a
        // protocol that does not settle from a bench short of CPU: metadata committed (a commit of
        // leases alone sends none), leases past their deadline at the window's end, and this process's
        // CPU per second.
        let interval = Duration::from_millis(config.heartbeat_interval_ms as u64);
        let keys = GroupKeys::new(STREAM, group);
        tokio::time::sleep(interval * 5).await;
        let windows = env_u64("SL_BENCH_SETTLED_WINDOWS", 2);
        for window in 1..windows {
            let late_leases = async |control: &mut ConnectionManager| {
                let (secs, micros): (u64, u64) =
                    redis::cmd("TIME").query_async(control).await.expect("TIME");
                let now = secs * 1000 + micros / 1000;
                let late: u64 = redis::cmd("ZCOUNT")
                    .arg(&keys.leases)
                    .arg("-inf")
                    .arg(now)
                    .query_async(control)
                    .await
                    .expect("ZCOUNT");
                late
            };
            let (from, redis_from, cpu_from) = (
                stream_listener::store::stats(),
                info(&mut control, "commandstats").await,
                stream_listener_test_support::cpu::process_cpu(),
            );
            let started = Instant::now();
            tokio::time::sleep(interval * 5).await;
            let (to, redis_to, cpu_to, late) = (
                stream_listener::store::stats(),
                info(&mut control, "commandstats").await,
                stream_listener_test_support::cpu::process_cpu(),
                late_leases(&mut control).await,
            );
            let per = |a: u64, b: u64| (b - a) as f64 / n / 5.0;
            println!(
                "  settled (intervals {}-{} after convergence), per member per interval: {:.2} renewals, \
                 {:.2} heartbeats queued, {:.3} loads; {:.1} commits of {:.1} KB of metadata per interval, {late} \
                 leases past due at the end, bench CPU {:.2} cores; Redis per member per interval: {}",
                window * 5,
                window * 5 + 5,
                per(from.renewals, to.renewals),
                per(from.queued, to.queued),
                per(from.loads, to.loads),
                (to.commits - from.commits) as f64 / 5.0,
                (to.commit_bytes - from.commit_bytes) as f64 / 1024.0 / 5.0,
                (cpu_to - cpu_from).as_secs_f64() / started.elapsed().as_secs_f64(),
                busiest_commands(&redis_from, &redis_to, n * 5.0)
            );
        }
    }
    for stop in &stops {
        let _ = stop.send(true);
    }
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    }
    result
}

/// The commands Redis spent the most time on between two `INFO commandstats`, divided by `members`.
fn busiest_commands(before: &str, after: &str, members: f64) -> String {
    let parse = |text: &str| -> BTreeMap<String, (f64, f64)> {
        text.lines()
            .filter_map(|line| {
                let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                let field = |key: &str| -> Option<f64> {
                    stats
                        .split(',')
                        .find_map(|kv| kv.strip_prefix(key)?.trim().parse().ok())
                };
                Some((name.to_string(), (field("calls=")?, field("usec=")?)))
            })
            .collect()
    };
    let before = parse(before);
    let mut delta: Vec<(String, f64, f64)> = parse(after)
        .into_iter()
        .map(|(name, (calls, usec))| {
            let (c0, u0) = before.get(&name).copied().unwrap_or_default();
            (name, calls - c0, usec - u0)
        })
        .filter(|(name, calls, _)| *calls > 0.0 && name != "info")
        .collect();
    delta.sort_by(|a, b| b.2.total_cmp(&a.2));
    delta
        .iter()
        .take(6)
        .map(|(name, calls, usec)| {
            format!(
                "{name} {:.1} / {:.2}",
                calls / members,
                usec / 1000.0 / members
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}
fn main() {
    let members = env_u64("SL_BENCH_MEMBERS", 64) as usize;
    let seconds = env_u64("SL_BENCH_SECONDS", 5);
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
            join_phase(&url, members).await;
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

        join_phase(&url, members).await;
    });
}

/// Part 4: joining at once, with the default timing and with a ten times shorter interval.
async fn join_phase(url: &str, members: usize) {
    println!("\n4. {members} members (real heartbeat loops) joining a fresh group at once ({SHARDS} shards)");
    // `SL_BENCH_DEFAULT_TIMING_ONLY`: skip the 100 ms heartbeat run.
    let configs = if std::env::var("SL_BENCH_DEFAULT_TIMING_ONLY").is_ok() {
        vec![GroupConfig::default()]
    } else {
        vec![GroupConfig::default(), JOIN_CONFIG]
    };
    for (i, config) in configs.into_iter().enumerate() {
        let interval = config.heartbeat_interval_ms;
        match run_join(url, members, &format!("join-{i}"), config).await {
            Some(took) => {
                let intervals = took.as_millis() as f64 / interval as f64;
                println!(
                    "  heartbeat {interval} ms, session {} ms: converged (STABLE, every shard granted, spread <= 1) \
                     in {} ms = {intervals:.1} heartbeat intervals, 2 of them the new group's initial grant pause \
                     (goal <= 5: {})",
                    config.session_timeout_ms,
                    took.as_millis(),
                    if intervals <= 5.0 { "met" } else { "NOT met" }
                );
            }
            None => println!("  heartbeat {interval} ms: did not converge within 90 s"),
        }
    }
}
